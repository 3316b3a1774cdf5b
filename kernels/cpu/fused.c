/* CPU kernel of FUSED: a chain of elementwise ops (and an optional full sum) in one pass over
 * memory. The iteration space is cut into blocks of BLOCK elements that stay in L1; each
 * instruction of the program runs over a block at a time, so a chain of k ops reads its inputs
 * once and writes one output instead of k intermediate arrays. Formulas come from
 * CT__EWISE_LIST, the same ones the unfused kernels use. */
#include <math.h>
#include <string.h>

#include "graph/op_impl.h"

#define BLOCK 256
/* Streams longer than PREFETCH_MIN elements come from beyond L2: each block prefetches its
 * inputs PREFETCH elements ahead, so memory keeps loading while the instructions run over a
 * block (measured at 16M floats: 9.0-9.7 GB/s against 7.9-8.2 without; at 64K it costs 13%). */
#define PREFETCH (2 * BLOCK)
#define PREFETCH_MIN (1 << 18)

/* Block `len` of instruction `op`: dst = EXPR(a, b). */
static void run_instr(int op, float alpha, const float *restrict a, const float *restrict b,
                      float *restrict dst, int64_t len) {
    (void)alpha;
    switch (op) {
#define CT__FUSED_CASE(e, arity, EXPR)                                                             \
    case CT_OP_##e:                                                                                \
        for (int64_t j = 0; j < len; j++) {                                                        \
            float x = a[j], y = (arity) == 2 ? b[j] : 0.0f;                                        \
            (void)y;                                                                               \
            dst[j] = (EXPR);                                                                       \
        }                                                                                          \
        break;
        CT__EWISE_LIST(CT__FUSED_CASE)
#undef CT__FUSED_CASE
    default:
        CT_ASSERT(!"fused: op outside CT__EWISE_LIST");
    }
}

void ct__cpu_fused(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const ct__fused_prog *p = n->aux.data;
    const int64_t total = p->sum ? ct_shape_numel(&p->shape) : ct_tensor_numel(&n->out);
    float regs[CT__FUSED_MAX + CT_MAX_INPUTS][BLOCK];
    const float *src[CT__FUSED_MAX + CT_MAX_INPUTS];
    float *out = CT__F32(&n->out);
    const int last = p->n_in + p->n_instr - 1;
    /* Blocks are a whole number of bias rows when the rows are short, so a broadcast row is
     * tiled into its register once and never copied again. */
    int64_t blk = BLOCK, row = 0;
    for (int k = 0; k < p->n_in; k++) {
        if (p->period[k] > 1 && p->period[k] <= BLOCK && (row == 0 || row == p->period[k])) {
            row = p->period[k];
        }
    }
    if (row > 0) {
        blk = BLOCK / row * row;
    }
    for (int k = 0; k < p->n_in; k++) {
        const float *x = CT__F32(&in[k]->out);
        if (p->period[k] == 1) {
            for (int j = 0; j < BLOCK; j++) {
                regs[k][j] = x[0];
            }
        } else if (p->period[k] > 1 && p->period[k] == row) {
            for (int64_t j = 0; j < blk; j += row) {
                memcpy(&regs[k][j], x, (size_t)row * sizeof *x);
            }
        }
    }
    double dacc[16] = {0}; /* per lane: independent chains, not one serial add per block */
    for (int64_t i0 = 0; i0 < total; i0 += blk) {
        const int64_t len = total - i0 < blk ? total - i0 : blk;
        for (int k = 0; k < p->n_in; k++) {
            const float *x = CT__F32(&in[k]->out);
            const int64_t period = p->period[k];
            if (period == 0) {
                src[k] = x + i0;
                if (total >= PREFETCH_MIN && i0 + PREFETCH + blk <= total) {
                    for (int64_t j = 0; j < blk; j += 16) {
                        __builtin_prefetch(x + i0 + PREFETCH + j);
                    }
                }
            } else if (period == 1 || period == row) {
                src[k] = regs[k]; /* tiled above; blocks start on row boundaries */
            } else {
                int64_t c = i0 % period;
                if (c + len <= period) {
                    src[k] = x + c;
                    continue;
                }
                for (int64_t j = 0; j < len;) {
                    int64_t seg = period - c < len - j ? period - c : len - j;
                    memcpy(&regs[k][j], x + c, (size_t)seg * sizeof *x);
                    j += seg;
                    c = 0;
                }
                src[k] = regs[k];
            }
        }
        for (int t = 0; t < p->n_instr; t++) {
            const ct__fused_instr *ins = &p->instr[t];
            const int r = p->n_in + t;
            float *dst = (r == last && !p->sum) ? out + i0 : regs[r];
            run_instr(ins->op, ins->alpha, src[ins->a], ins->b >= 0 ? src[ins->b] : NULL, dst, len);
            src[r] = dst;
        }
        if (p->sum) {
            float acc[16] = {0};
            const float *v = src[last];
            int64_t j = 0;
            for (; j + 16 <= len; j += 16) {
                for (int l = 0; l < 16; l++) {
                    acc[l] += v[j + l];
                }
            }
            for (; j < len; j++) {
                acc[0] += v[j];
            }
            for (int l = 0; l < 16; l++) {
                dacc[l] += acc[l];
            }
        } else if (p->n_instr == 0) {
            memmove(out + i0, src[last], (size_t)len * sizeof *out);
        }
    }
    if (p->sum) {
        double sum = 0.0;
        for (int l = 0; l < 16; l++) {
            sum += dacc[l];
        }
        out[0] = (float)sum;
    }
}
