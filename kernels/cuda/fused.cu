/* CUDA kernel of FUSED: a chain of elementwise ops of CT__EWISE_LIST (and an optional full sum)
 * in one pass over memory, interpreting the program the fuse pass wrote (the CPU twin:
 * kernels/cpu/fused.c). Each thread keeps its registers in shared memory (a register file
 * indexed at run time would go to local memory); inputs are whole, a scalar or a repeating row.
 * A full sum adds per block, then one block adds the blocks in order: the same bits every run. */
#include "compat.h"

#include "ctrain/ops.h"

namespace {

const unsigned kThreads = 128;
const int kRegisters = CT_CUDA_FUSED_MAX_INPUTS + CT_CUDA_FUSED_MAX_INSTR;

__device__ float apply(int op, float x, float y, float alpha) {
    switch (op) {
#define CT__CUDA_FUSED_CASE(e, arity, EXPR)                                                        \
    case CT_OP_##e:                                                                                \
        return (EXPR);
        CT__EWISE_LIST(CT__CUDA_FUSED_CASE)
#undef CT__CUDA_FUSED_CASE
    default:
        return NAN;
    }
}

__global__ void fused_kernel(ct_cuda_fused_prog p, float *out, float *partial) {
    __shared__ float regs[kRegisters * kThreads];
    __shared__ float scratch[32];
    float *mine = regs + threadIdx.x;
    const int last = p.n_in + p.n_instr - 1;
    float acc = 0.0f;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.total; i += stride) {
        for (int k = 0; k < p.n_in; k++) {
            int64_t period = p.period[k];
            mine[k * kThreads] = p.in[k][period == 0 ? i : i % period];
        }
        for (int t = 0; t < p.n_instr; t++) {
            float y = p.instr[t].b >= 0 ? mine[p.instr[t].b * kThreads] : 0.0f;
            mine[(p.n_in + t) * kThreads] =
                apply(p.instr[t].op, mine[p.instr[t].a * kThreads], y, p.instr[t].alpha);
        }
        float v = mine[last * kThreads];
        if (p.sum) {
            acc += v;
        } else {
            out[i] = v;
        }
    }
    if (p.sum) {
        acc = ct_cuda_block_reduce(acc, scratch, 0);
        if (threadIdx.x == 0) {
            partial[blockIdx.x] = acc;
        }
    }
}

} // namespace

extern "C" int64_t ct_cuda_fused_blocks(int64_t total) {
    int64_t b = ct_cuda_blocks(total, kThreads, 4);
    return b > 1024 ? 1024 : b;
}

extern "C" int ct_cuda_fused(void *stream, const ct_cuda_fused_prog *p, float *out,
                             float *partial) {
    if (p->n_in > CT_CUDA_FUSED_MAX_INPUTS || p->n_instr > CT_CUDA_FUSED_MAX_INSTR ||
        p->n_in + p->n_instr < 1) {
        return -1;
    }
    cudaStream_t s = (cudaStream_t)stream;
    int64_t blocks = ct_cuda_fused_blocks(p->total);
    if (p->total > 0 || p->sum) {
        CT_LAUNCH(fused_kernel, (unsigned)blocks, kThreads, 0, s)(*p, out, partial);
    }
    if (p->sum) {
        CT_LAUNCH(ct_cuda_sum_blocks<>, 1, 1024, 0, s)(partial, blocks, out);
    }
    return (int)cudaGetLastError();
}
