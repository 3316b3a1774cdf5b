/* CUDA kernels of the fused multi-head self-attention and its gradient (the CPU twin:
 * kernels/cpu/attention.c). One warp per query (forward, dq) or per key (dk, dv); a lane holds
 * up to 8 of the head's dimensions (heads up to 256). The forward visits the keys in order with
 * a running max and sum (the online softmax): no [T, T] scores exist, only a logsumexp per
 * query (aux) from which the backward recomputes each probability. Attention dropout draws the
 * CPU's Philox words (element ((b' H + h) T + i) T + j of the stream, b' the example's place in
 * the global batch), so the mask is the CPU's. The gradient needs no atomics: dq by queries,
 * dk and dv by keys. Every sum runs in an order fixed by the shapes. */
#include "compat.h"

#include "core/philox.h"

namespace {

const unsigned kThreads = 128; /* 4 warps: 4 queries or keys per block */
#define CT__ATT_PER_LANE 8

struct att_row { /* which (example, head, position) a warp works on, and its base offset */
    int64_t b, h, i, base;
};

__device__ __forceinline__ att_row row_of(const ct_cuda_attention &a, int64_t w) {
    att_row r;
    r.i = w % a.t;
    r.h = w / a.t % a.heads;
    r.b = w / (a.t * a.heads);
    r.base = (r.b * a.t + r.i) * a.heads * a.dh + r.h * a.dh;
    return r;
}

__device__ __forceinline__ void load(const float *src, int64_t base, int64_t dh, float *dst) {
    unsigned lane = threadIdx.x % 32;
    CT_UNROLL
    for (int r = 0; r < CT__ATT_PER_LANE; r++) {
        int64_t d = lane + 32 * r;
        dst[r] = d < dh ? src[base + d] : 0.0f;
    }
}

/* The dot product of a lane's slices, summed over the warp (the same bits in every lane). */
__device__ __forceinline__ float dot(const float *a, const float *src, int64_t base, int64_t dh) {
    unsigned lane = threadIdx.x % 32;
    float s = 0.0f;
    CT_UNROLL
    for (int r = 0; r < CT__ATT_PER_LANE; r++) {
        int64_t d = lane + 32 * r;
        s += d < dh ? a[r] * src[base + d] : 0.0f;
    }
    return ct_cuda_warp_reduce(s, 0);
}

/* Dropout's factor for probability (b, h, i, j): 0 or 1 / (1 - rate); 1 without dropout. */
__device__ __forceinline__ float keep(const ct_cuda_attention &a, const att_row &q, int64_t j) {
    if (a.threshold == 0) {
        return 1.0f;
    }
    uint64_t at =
        (((uint64_t)(a.batch_offset + q.b) * (uint64_t)a.heads + (uint64_t)q.h) * (uint64_t)a.t +
         (uint64_t)q.i) *
            (uint64_t)a.t +
        (uint64_t)j;
    return (ct__philox_word(a.seed, a.stream, at) >> 8) >= a.threshold ? a.keep_scale : 0.0f;
}

__device__ __forceinline__ int64_t key_base(const ct_cuda_attention &a, const att_row &q,
                                            int64_t j) {
    return (q.b * a.t + j) * a.heads * a.dh + q.h * a.dh;
}

__global__ void forward_kernel(ct_cuda_attention a, const float *q, const float *k, const float *v,
                               float *out, float *lse) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (w >= a.batch * a.heads * a.t) {
        return; /* a whole warp: no shuffle is left half done */
    }
    att_row r = row_of(a, w);
    float qr[CT__ATT_PER_LANE], acc[CT__ATT_PER_LANE] = {0};
    load(q, r.base, a.dh, qr);
    float m = -INFINITY, l = 0.0f;
    int64_t visible = a.causal ? r.i + 1 : a.t;
    for (int64_t j = 0; j < visible; j++) {
        int64_t kb = key_base(a, r, j);
        float s = a.scale * dot(qr, k, kb, a.dh);
        float m_new = s > m ? s : m, corr = ct__exp(m - m_new), p = ct__exp(s - m_new);
        l = l * corr + p;
        float pd = p * keep(a, r, j);
        unsigned lane = threadIdx.x % 32;
        CT_UNROLL
        for (int x = 0; x < CT__ATT_PER_LANE; x++) {
            int64_t d = lane + 32 * x;
            acc[x] = acc[x] * corr + (d < a.dh ? pd * v[kb + d] : 0.0f);
        }
        m = m_new;
    }
    unsigned lane = threadIdx.x % 32;
    CT_UNROLL
    for (int x = 0; x < CT__ATT_PER_LANE; x++) {
        int64_t d = lane + 32 * x;
        if (d < a.dh) {
            out[r.base + d] = acc[x] / l;
        }
    }
    if (lane == 0) {
        lse[(r.b * a.heads + r.h) * a.t + r.i] = m + logf(l);
    }
}

/* D = dy . out per query. */
__global__ void delta_kernel(ct_cuda_attention a, const float *dy, const float *out, float *delta) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (w >= a.batch * a.heads * a.t) {
        return;
    }
    att_row r = row_of(a, w);
    float dr[CT__ATT_PER_LANE];
    load(dy, r.base, a.dh, dr);
    float s = dot(dr, out, r.base, a.dh);
    if (threadIdx.x % 32 == 0) {
        delta[(r.b * a.heads + r.h) * a.t + r.i] = s;
    }
}

/* dq_i = scale sum_j P_ij (Z_ij dy_i . v_j - D_i) k_j. */
__global__ void dq_kernel(ct_cuda_attention a, const float *dy, const float *q, const float *k,
                          const float *v, const float *lse, const float *delta, float *dq) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (w >= a.batch * a.heads * a.t) {
        return;
    }
    att_row r = row_of(a, w);
    int64_t stat = (r.b * a.heads + r.h) * a.t + r.i;
    float qr[CT__ATT_PER_LANE], dr[CT__ATT_PER_LANE], acc[CT__ATT_PER_LANE] = {0};
    load(q, r.base, a.dh, qr);
    load(dy, r.base, a.dh, dr);
    int64_t visible = a.causal ? r.i + 1 : a.t;
    unsigned lane = threadIdx.x % 32;
    for (int64_t j = 0; j < visible; j++) {
        int64_t kb = key_base(a, r, j);
        float p = ct__exp(a.scale * dot(qr, k, kb, a.dh) - lse[stat]);
        float ds = p * (keep(a, r, j) * dot(dr, v, kb, a.dh) - delta[stat]);
        CT_UNROLL
        for (int x = 0; x < CT__ATT_PER_LANE; x++) {
            int64_t d = lane + 32 * x;
            acc[x] += d < a.dh ? ds * k[kb + d] : 0.0f;
        }
    }
    CT_UNROLL
    for (int x = 0; x < CT__ATT_PER_LANE; x++) {
        int64_t d = lane + 32 * x;
        if (d < a.dh) {
            dq[r.base + d] = a.scale * acc[x];
        }
    }
}

/* Warp per key j: dv_j = sum_i P_ij Z_ij dy_i, dk_j = scale sum_i dS_ij q_i. */
__global__ void dkdv_kernel(ct_cuda_attention a, const float *dy, const float *q, const float *k,
                            const float *v, const float *lse, const float *delta, float *dk,
                            float *dv) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (w >= a.batch * a.heads * a.t) {
        return;
    }
    att_row key = row_of(a, w); /* key.i is the key's position j */
    float kr[CT__ATT_PER_LANE], vr[CT__ATT_PER_LANE];
    float gk[CT__ATT_PER_LANE] = {0}, gv[CT__ATT_PER_LANE] = {0};
    load(k, key.base, a.dh, kr);
    load(v, key.base, a.dh, vr);
    unsigned lane = threadIdx.x % 32;
    for (int64_t i = a.causal ? key.i : 0; i < a.t; i++) {
        att_row qi = key;
        qi.i = i;
        int64_t qb = key_base(a, key, i), stat = (key.b * a.heads + key.h) * a.t + i;
        float p = ct__exp(a.scale * dot(kr, q, qb, a.dh) - lse[stat]);
        float z = keep(a, qi, key.i);
        float ds = p * (z * dot(vr, dy, qb, a.dh) - delta[stat]);
        CT_UNROLL
        for (int x = 0; x < CT__ATT_PER_LANE; x++) {
            int64_t d = lane + 32 * x;
            gv[x] += d < a.dh ? p * z * dy[qb + d] : 0.0f;
            gk[x] += d < a.dh ? ds * q[qb + d] : 0.0f;
        }
    }
    CT_UNROLL
    for (int x = 0; x < CT__ATT_PER_LANE; x++) {
        int64_t d = lane + 32 * x;
        if (d < a.dh) {
            dk[key.base + d] = a.scale * gk[x];
            dv[key.base + d] = gv[x];
        }
    }
}

unsigned warps_blocks(const ct_cuda_attention *a) {
    int64_t warps = a->batch * a->heads * a->t;
    return (unsigned)((warps * 32 + kThreads - 1) / kThreads);
}

} // namespace

extern "C" int ct_cuda_attention_forward(void *stream, const ct_cuda_attention *a, const float *q,
                                         const float *k, const float *v, float *out, float *lse) {
    if (a->dh > 32 * CT__ATT_PER_LANE || a->dh <= 0) {
        return -1;
    }
    if (a->batch * a->heads * a->t == 0) {
        return 0;
    }
    CT_LAUNCH(forward_kernel, warps_blocks(a), kThreads, 0, (cudaStream_t)stream)
    (*a, q, k, v, out, lse);
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_attention_backward(void *stream, const ct_cuda_attention *a, const float *dy,
                                          const float *q, const float *k, const float *v,
                                          const float *out, const float *lse, float *delta,
                                          float *dq, float *dk, float *dv) {
    if (a->dh > 32 * CT__ATT_PER_LANE || a->dh <= 0) {
        return -1;
    }
    if (a->batch * a->heads * a->t == 0) {
        return 0;
    }
    cudaStream_t s = (cudaStream_t)stream;
    unsigned blocks = warps_blocks(a);
    CT_LAUNCH(delta_kernel, blocks, kThreads, 0, s)(*a, dy, out, delta);
    CT_LAUNCH(dq_kernel, blocks, kThreads, 0, s)(*a, dy, q, k, v, lse, delta, dq);
    CT_LAUNCH(dkdv_kernel, blocks, kThreads, 0, s)(*a, dy, q, k, v, lse, delta, dk, dv);
    return (int)cudaGetLastError();
}
