/* CUDA kernels of the embedding lookup and its gradient (the CPU twin: kernels/cpu/embedding.c).
 * Ids outside [0, V) give zero vectors and no gradient. The gradient adds without atomics, in the
 * CPU's order: a thread owns one column d of one slice of the vocabulary and walks the ids in
 * order, adding the rows whose id falls in its slice; every row of the table sums its dy rows
 * in id order, the same bits on every run and as the CPU. */
#include "compat.h"

namespace {

const unsigned kThreads = 128;

__global__ void lookup_kernel(const float *table, const int32_t *ids, float *out, int64_t count,
                              int64_t vocab, int64_t dim) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count * dim; i += stride) {
        int64_t row = i / dim, d = i % dim;
        int32_t id = ids[row];
        out[i] = id >= 0 && id < vocab ? table[(int64_t)id * dim + d] : 0.0f;
    }
}

/* Block (x: columns, y: vocabulary slice): thread column d adds dy rows whose id is in the
 * slice. accumulate: add to the table's gradient as it is, else overwrite. */
__global__ void scatter_kernel(const float *dy, const int32_t *ids, float *out, int64_t count,
                               int64_t vocab, int64_t dim, int64_t slice, int accumulate) {
    int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t v0 = (int64_t)blockIdx.y * slice, v1 = v0 + slice < vocab ? v0 + slice : vocab;
    if (d >= dim) {
        return;
    }
    for (int64_t v = v0; !accumulate && v < v1; v++) {
        out[v * dim + d] = 0.0f;
    }
    for (int64_t i = 0; i < count; i++) {
        int32_t id = ids[i];
        if (id >= v0 && id < v1) {
            out[(int64_t)id * dim + d] += dy[i * dim + d];
        }
    }
}

} // namespace

extern "C" int ct_cuda_embedding(void *stream, const float *table, const int32_t *ids, float *out,
                                 int64_t count, int64_t vocab, int64_t dim) {
    if (count * dim == 0) {
        return 0;
    }
    CT_LAUNCH(lookup_kernel, ct_cuda_blocks(count * dim, kThreads, 4), kThreads, 0,
              (cudaStream_t)stream)
    (table, ids, out, count, vocab, dim);
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_embedding_grad(void *stream, const float *dy, const int32_t *ids,
                                      float *dtable, int64_t count, int64_t vocab, int64_t dim,
                                      int accumulate) {
    if (vocab * dim == 0) {
        return 0;
    }
    /* about 64 vocabulary slices: each thread scans every id once */
    int64_t slices = vocab < 64 ? vocab : 64, slice = (vocab + slices - 1) / slices;
    dim3 grid(ct_cuda_blocks(dim, kThreads, 1), (unsigned)((vocab + slice - 1) / slice));
    CT_LAUNCH(scatter_kernel, grid, kThreads, 0, (cudaStream_t)stream)
    (dy, ids, dtable, count, vocab, dim, slice, accumulate);
    return (int)cudaGetLastError();
}
