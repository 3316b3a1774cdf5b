/* CPU kernels of the fused multi-head self-attention (ops.h: ATTENTION, ATTENTION_GRAD).
 *
 * Forward, per example, head and query: the keys are visited in tiles of TILE with a running max
 * and a running sum (the online softmax of FlashAttention), so the [T, T] scores are never held:
 * memory beyond q, k, v and the output is a tile of scores and one logsumexp per query (aux),
 * which the backward uses to recompute each probability instead of storing them. With the causal
 * mask a query sees the keys up to its own position.
 *
 * Speed: the work is blocks of TILE queries by tiles of TILE keys, and every product is one
 * register-blocked kernel (mm_block: ROWS output rows by up to 4 vectors of columns held in
 * registers, a broadcast weight times a vector row of the input, each input row's load shared by
 * the rows). The forward transposes a query block once and computes the tile's scores key-major,
 * S^T = K Q^T, so the online softmax runs down whole vectors of queries (no sums across a
 * vector), then out = corr out + P V on the tile's values copied contiguously. The backward
 * (FlashAttention-2's order) takes chunks of query blocks whose queries and dy it copies
 * contiguously once, then the key tiles the chunk sees (keys and values transposed once per
 * chunk and tile), then the chunk's blocks that see the tile: P from the saved logsumexp,
 * dS = P (dY V^T - D), dq += dS K, dk += dS^T Q, dv += P^T dY. The copies matter: a head's rows
 * are width floats apart and fall into few sets of the L1 cache. Under the causal mask, fully
 * masked tiles are never visited and the diagonal tile's products skip the rows and vectors the
 * mask hides. Probabilities use ct__exp (vectorized). The executor splits the node by examples
 * (attrs.i[ATT_FIRST..ATT_END): the examples a part computes; 0, 0: all), and examples are
 * independent, so parts run on any threads.
 *
 * Every sum runs in an order fixed by the shapes (a score over the head dimension in order, a
 * weighted sum over its rows in order, a row's running max and sum over the key tiles and keys in
 * order, D over VEC lanes then the lanes in order, blocks and tiles in order): the same bits on
 * any thread count and split. */
#include <math.h>
#include <string.h>

#include "conv_tile.h"
#include "ctrain/rng.h"
#include "graph/op_impl.h"

#define TILE 64
/* Rows computed together, sharing loads: with AVX2's 12 sums (MAX_ACC) 6 rows of 2 vectors ran
 * 10-15% faster than 4 of 3 (fewer leftover blocks of 2); AVX-512 keeps 4 rows of 4. */
#define ROWS (VEC == 16 ? 4 : 6)
#define MAX_ROWS 6 /* the most rows a kernel computes */
/* The most accumulators a kernel keeps, R x NV: with 16 vector registers (AVX2, SSE) 4 x 4 left
 * none for the broadcast weight, and GCC kept all 16 sums on the stack, storing every one at each
 * step of the sum (the forward's products ran at about half speed); AVX-512 has 32. */
#define MAX_ACC (VEC == 16 ? 24 : 12)
#define CHUNK (512 * TILE) /* floats of the backward's packed queries: >= TILE rows of MAX_HEAD */
#define MAX_HEAD CT__ATTENTION_MAX_HEAD /* the shape check refuses larger heads */
enum { ATT_FIRST = 2, ATT_END = 3, ATT_KEY = 4, ATT_TRAINING = 5 };

typedef struct att_dims {
    int64_t batch, t, heads, dh, width; /* width = heads * dh, a position's stride */
    int64_t first, end;                 /* the examples to compute */
    int causal;
    float scale;
    /* attention dropout (rate 0: none): keep when the draw's top 24 bits reach the threshold */
    float keep_scale;
    uint32_t threshold;
    uint64_t seed, stream;
    int64_t batch_offset; /* the first example's place in the global batch */
} att_dims;

/* The dropout of node n (rate attrs.f[1] in training) drawn as ctx's step and replica say. */
static void dropout_of(const ct_kctx *ctx, const ct_node *n, att_dims *d) {
    float rate = n->attrs.i[ATT_TRAINING] ? n->attrs.f[1] : 0.0f;
    d->threshold = rate > 0.0f ? (uint32_t)ceil((double)rate * 16777216.0) : 0;
    d->keep_scale = 1.0f / (1.0f - rate);
    d->seed = ctx->seed;
    d->stream = ct_rng_stream(CT_RNG_PURPOSE_OP, ctx->step, ctx->replica,
                              (uint32_t)(n->attrs.i[ATT_KEY] - 1));
    d->batch_offset = ctx->batch_offset;
}

/* Drops the probabilities p[0, n) of query i of example b, head h, against keys from j0 (scaling
 * the kept ones); the draw of (b, h, i, j) is element ((b' H + h) T + i) T + j of the stream,
 * b' the example's place in the global batch. */
static void drop_row(const att_dims *d, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                     float *p) {
    uint32_t bits[TILE];
    uint64_t at =
        ((((uint64_t)(d->batch_offset + b) * (uint64_t)d->heads + (uint64_t)h) * (uint64_t)d->t +
          (uint64_t)i) *
         (uint64_t)d->t) +
        (uint64_t)j0;
    ct_rng_u32(d->seed, d->stream, at, bits, (size_t)n);
    for (int64_t j = 0; j < n; j++) {
        p[j] = (bits[j] >> 8) >= d->threshold ? p[j] * d->keep_scale : 0.0f;
    }
}

static att_dims dims_of(const ct_node *n, const ct_tensor *q) {
    att_dims d = {.batch = q->shape.dims[0],
                  .t = q->shape.dims[1],
                  .heads = n->attrs.i[0],
                  .width = q->shape.dims[2],
                  .causal = (int)n->attrs.i[1],
                  .first = n->attrs.i[ATT_FIRST],
                  .end = n->attrs.i[ATT_END],
                  .scale = n->attrs.f[0]};
    d.dh = d.width / d.heads;
    if (d.end <= d.first) {
        d.first = 0;
        d.end = d.batch;
    }
    return d;
}

/* xt[c][j] = x[j][c] for the n rows of a tile (stride width), c < dh; columns n..TILE are zeros. */
static void transpose_tile(const att_dims *d, const float *x, int64_t n, float *xt) {
    for (int64_t c = 0; c < d->dh; c++) {
        memset(xt + c * TILE + n, 0, (size_t)(TILE - n) * sizeof(float));
    }
    for (int64_t j = 0; j < n; j++) {
        for (int64_t c = 0; c < d->dh; c++) {
            xt[c * TILE + j] = x[j * d->width + c];
        }
    }
}

/* The n rows of a tile (stride width) copied contiguously (stride dh): rows a product reads
 * again and again stay in the L1 cache, where a head's rows one position apart (width floats)
 * would fall into few of its sets. */
static void pack_rows(const att_dims *d, const float *x, int64_t n, float *xp) {
    for (int64_t j = 0; j < n; j++) {
        memcpy(xp + j * d->dh, x + j * d->width, (size_t)d->dh * sizeof(float));
    }
}

/* One product y_a = init_a + sum over b in order of w[a sa + b sb] x_b (rows x_b = x + b ldx,
 * y_a = y + a ldy), init_a: 0 (MM_SET), y_a (MM_ADD) or rs[a] y_a (MM_SCALE). Every product of
 * the op is of this form: the weights are broadcast, the rows of x are loaded as vectors. */
enum { MM_SET, MM_ADD, MM_SCALE };
typedef struct mm {
    const float *w;
    int64_t sa, sb;
    const float *x;
    int64_t ldx;
    float *y;
    int64_t ldy;
    int mode;
    const float *rs;
} mm;

/* A vector in a register: the sums' type (with `vec`'s may_alias and 4-byte alignment GCC kept
 * them in memory too, storing each at every step). */
typedef float vreg __attribute__((vector_size(VEC * sizeof(float))));

/* y_a += sum over b in [b0, b1) in order of w[a sa + b sb] x_b for R rows from a0 by NV vectors
 * of columns from c0: R x NV accumulators in registers, each x row's vectors loaded once for the
 * R rows. */
static inline __attribute__((always_inline)) void mm_block(const mm *m, int R, int NV, int64_t a0,
                                                           int64_t c0, int64_t b0, int64_t b1) {
    const int64_t sa = m->sa, sb = m->sb, ldx = m->ldx, ldy = m->ldy;
    const float *w = m->w + a0 * sa + b0 * sb, *x = m->x + b0 * ldx + c0;
    float *y = m->y + a0 * ldy + c0;
    vreg acc[MAX_ROWS][4];
    for (int r = 0; r < R; r++) {
        for (int v = 0; v < NV; v++) {
            acc[r][v] = *(const vec *)(y + r * ldy + v * VEC);
        }
    }
    for (int64_t b = b0; b < b1; b++) {
        vec xv[4];
        for (int v = 0; v < NV; v++) {
            xv[v] = *(const vec *)(x + v * VEC);
        }
        for (int r = 0; r < R; r++) {
            const float wr = w[r * sa];
            for (int v = 0; v < NV; v++) {
                acc[r][v] = fmadd(acc[r][v], wr, xv[v]);
            }
        }
        w += sb;
        x += ldx;
    }
    for (int r = 0; r < R; r++) {
        for (int v = 0; v < NV; v++) {
            *(vec *)(y + r * ldy + v * VEC) = acc[r][v];
        }
    }
}

/* The kernels of mm_block, one function each (rows 1..MAX_ROWS by 1..4 vectors). */
typedef void (*mm_kernel)(const mm *m, int64_t a0, int64_t c0, int64_t b0, int64_t b1);
#define MM_KERNEL(R, NV)                                                                           \
    static __attribute__((noinline)) void mm_##R##x##NV(const mm *m, int64_t a0, int64_t c0,       \
                                                        int64_t b0, int64_t b1) {                  \
        mm_block(m, R, NV, a0, c0, b0, b1);                                                        \
    }
#define MM_KERNELS(R) MM_KERNEL(R, 1) MM_KERNEL(R, 2) MM_KERNEL(R, 3) MM_KERNEL(R, 4)
MM_KERNELS(1)
MM_KERNELS(2)
MM_KERNELS(3)
MM_KERNELS(4)
MM_KERNELS(5)
MM_KERNELS(6)
#define MM_ROW(R)                                                                                  \
    { mm_##R##x1, mm_##R##x2, mm_##R##x3, mm_##R##x4 }
static const mm_kernel mm_kernels[MAX_ROWS][4] = {MM_ROW(1), MM_ROW(2), MM_ROW(3),
                                                  MM_ROW(4), MM_ROW(5), MM_ROW(6)};

/* The R rows from a0 on columns [c_lo, c_hi), b in [b0, b1): blocks of up to 4 vectors, then
 * the columns past the last whole vector one at a time (the same sum, in the same order). */
static void mm_group(const mm *m, int R, int64_t a0, int64_t c_lo, int64_t c_hi, int64_t b0,
                     int64_t b1) {
    for (int r = 0; r < R && m->mode != MM_ADD; r++) { /* the start of the sums */
        float *ya = m->y + (a0 + r) * m->ldy, s = m->mode == MM_SCALE ? m->rs[a0 + r] : 0.0f;
        for (int64_t c = c_lo; c < c_hi; c++) {
            ya[c] = m->mode == MM_SCALE ? ya[c] * s : 0.0f;
        }
    }
    int64_t c0 = c_lo;
    const int max_nv = MAX_ACC / R < 4 ? MAX_ACC / R : 4;
    while (c0 + VEC <= c_hi) {
        int nv = (int)((c_hi - c0) / VEC);
        nv = nv < max_nv ? nv : max_nv;
        mm_kernels[R - 1][nv - 1](m, a0, c0, b0, b1);
        c0 += nv * VEC;
    }
    for (int r = 0; r < R; r++) {
        float *ya = m->y + (a0 + r) * m->ldy;
        for (int64_t c = c0; c < c_hi; c++) {
            float acc = ya[c];
            for (int64_t b = b0; b < b1; b++) {
                acc += m->w[(a0 + r) * m->sa + b * m->sb] * m->x[b * m->ldx + c];
            }
            ya[c] = acc;
        }
    }
}

/* The extent of a product under the causal mask, per group of rows [a0, a0 + R): b in
 * [max(0, a0 + b_lo), min(nb, a0 + R + b_hi)), columns from max(0, a0 + c_lo) rounded down to a
 * vector to min(ncols, a0 + R + c_hi rounded up to a vector). NONE: no limit. */
#define NONE ((int64_t)1 << 40)
typedef struct extent {
    int64_t na, nb, ncols;
    int64_t b_lo, b_hi, c_lo, c_hi;
} extent;

static void mm_rows(const mm *m, const extent *e) {
    for (int64_t a0 = 0; a0 < e->na; a0 += ROWS) {
        int R = e->na - a0 < ROWS ? (int)(e->na - a0) : ROWS;
        int64_t b0 = a0 + e->b_lo > 0 ? a0 + e->b_lo : 0;
        int64_t b1 = a0 + R + e->b_hi < e->nb ? a0 + R + e->b_hi : e->nb;
        int64_t c0 = a0 + e->c_lo > 0 ? (a0 + e->c_lo) / VEC * VEC : 0;
        int64_t c1 = (a0 + R + e->c_hi + VEC - 1) / VEC * VEC;
        c1 = c1 < e->ncols ? c1 : e->ncols;
        mm_group(m, R, a0, c0, c1, b0 < b1 ? b0 : b1, b1);
    }
}

/* The keys query row i sees in the tile from j0 of n keys. */
static int64_t visible_keys(const att_dims *d, int64_t i, int64_t j0, int64_t n) {
    int64_t v = d->causal ? i + 1 - j0 : n;
    return v < 0 ? 0 : v < n ? v : n;
}

/* The forward's buffers: a query block transposed, its scores against a key tile key-major
 * (st[j][i], then the probabilities), and its rows' running max m, sum l and rescale corr. */
typedef struct fwd_bufs {
    float qt[MAX_HEAD * TILE] __attribute__((aligned(64)));
    float st[TILE * TILE] __attribute__((aligned(64)));
    float vp[MAX_HEAD * TILE] __attribute__((aligned(64))); /* the tile's values, packed */
    float m[TILE], l[TILE], corr[TILE];
} fwd_bufs;

/* The online softmax's step for a block (queries from i0) and a key tile (n keys from j0), on
 * whole vectors of queries: st becomes the probabilities (0 where the mask hides the key), m and
 * l are updated and corr is the factor of the rows' earlier output. Query i sees key j when
 * i - i0 >= first(j) = j0 + j - i0 (causal; else always). */
static void softmax_tile(const att_dims *d, int64_t i0, int64_t j0, int64_t n, fwd_bufs *f) {
    float mt[TILE], sum[TILE];
    const int64_t off = d->causal ? j0 - i0 : -NONE;
    for (int k = 0; k < TILE; k++) {
        mt[k] = -INFINITY;
        sum[k] = 0.0f;
    }
    for (int64_t j = 0; j < n; j++) {
        float *row = f->st + j * TILE;
        const int64_t first = j + off;
        for (int k = 0; k < TILE; k++) {
            float x = k >= first ? row[k] * d->scale : -INFINITY;
            row[k] = x;
            mt[k] = mt[k] > x ? mt[k] : x;
        }
    }
    for (int k = 0; k < TILE; k++) {
        float m_new = mt[k] > f->m[k] ? mt[k] : f->m[k];
        f->corr[k] = ct__exp(f->m[k] - m_new);
        f->m[k] = m_new;
    }
    for (int64_t j = 0; j < n; j++) {
        float *row = f->st + j * TILE;
        const int64_t first = j + off;
        for (int k = 0; k < TILE; k++) {
            float p = k >= first ? ct__exp(row[k] - f->m[k]) : 0.0f;
            row[k] = p;
            sum[k] += p;
        }
    }
    for (int k = 0; k < TILE; k++) {
        f->l[k] = f->l[k] * f->corr[k] + sum[k];
    }
}

/* Dropout on the probabilities st of a block's rows against a tile (after l took them all). */
static void drop_tile(const att_dims *d, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                      int64_t n, float *st) {
    float p[TILE];
    for (int64_t r = 0; r < rows; r++) {
        int64_t vis = visible_keys(d, i0 + r, j0, n);
        for (int64_t j = 0; j < vis; j++) {
            p[j] = st[j * TILE + r];
        }
        drop_row(d, b, h, i0 + r, j0, vis, p);
        for (int64_t j = 0; j < vis; j++) {
            st[j * TILE + r] = p[j];
        }
    }
}

/* Example b, head h: query blocks of TILE rows (transposed once), each against the key tiles it
 * sees: S^T = K Q^T (key rows broadcast), the online softmax across whole vectors of queries,
 * out = corr out + P V. The causal mask's diagonal tile skips the vectors and rows it hides. */
static void attend_head(const att_dims *d, int64_t b, int64_t h, const float *q, const float *k,
                        const float *v, float *out, float *lse, fwd_bufs *f) {
    const int64_t w = d->width;
    for (int64_t i0 = 0; i0 < d->t; i0 += TILE) { /* a block of queries: its m and l */
        int64_t rows = d->t - i0 < TILE ? d->t - i0 : TILE;
        transpose_tile(d, q + i0 * w, rows, f->qt);
        for (int k = 0; k < TILE; k++) {
            f->m[k] = -INFINITY;
            f->l[k] = 0.0f;
        }
        int64_t key_end = d->causal ? i0 + rows : d->t;
        for (int64_t j0 = 0; j0 < key_end; j0 += TILE) {
            int64_t n = key_end - j0 < TILE ? key_end - j0 : TILE;
            int diag = d->causal && j0 + n - 1 > i0;
            const mm s = {k + j0 * w, w, 1, f->qt, TILE, f->st, TILE, MM_SET, NULL};
            const extent se = {n, d->dh, TILE, -NONE, NONE, diag ? j0 - i0 : -NONE, NONE};
            mm_rows(&s, &se);
            softmax_tile(d, i0, j0, n, f);
            if (d->threshold) {
                drop_tile(d, b, h, i0, rows, j0, n, f->st);
            }
            pack_rows(d, v + j0 * w, n, f->vp);
            const mm o = {f->st,  1, TILE, f->vp, d->dh, out + i0 * w, w, j0 ? MM_SCALE : MM_SET,
                          f->corr};
            const extent oe = {rows, n, d->dh, -NONE, diag ? i0 - j0 : NONE, -NONE, NONE};
            mm_rows(&o, &oe);
        }
        for (int64_t r = 0; r < rows; r++) {
            float *o = out + (i0 + r) * w, inv = 1.0f / f->l[r];
            for (int64_t c = 0; c < d->dh; c++) {
                o[c] *= inv;
            }
            lse[i0 + r] = f->m[r] + logf(f->l[r]);
        }
    }
}

void ct__cpu_attention(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    att_dims d = dims_of(n, &in[0]->out);
    dropout_of(ctx, n, &d);
    const float *q = CT__F32(&in[0]->out), *k = CT__F32(&in[1]->out), *v = CT__F32(&in[2]->out);
    float *out = CT__F32(&n->out), *lse = CT__F32(&n->aux);
    fwd_bufs bufs, *f = &bufs;      /* 145 KiB: thread stacks are 8 MiB */
    memset(f->st, 0, sizeof f->st); /* the vectors a causal tile skips hold finite values */
    for (int64_t b = d.first; b < d.end; b++) {
        for (int64_t h = 0; h < d.heads; h++) {
            int64_t base = b * d.t * d.width + h * d.dh;
            attend_head(&d, b, h, q + base, k + base, v + base, out + base,
                        lse + (b * d.heads + h) * d.t, f);
        }
    }
}

/* The backward's buffers: a key tile's keys and values transposed and its keys packed, a query
 * block's queries and dy packed, its scores or probabilities P, dS, and the rows' D. */
typedef struct grad_bufs {
    float kt[MAX_HEAD * TILE] __attribute__((aligned(64)));
    float vt[MAX_HEAD * TILE] __attribute__((aligned(64)));
    float kp[MAX_HEAD * TILE] __attribute__((aligned(64)));
    float qc[CHUNK] __attribute__((aligned(64)));  /* a chunk of query blocks' queries, packed */
    float dyc[CHUNK] __attribute__((aligned(64))); /* ... and their dy */
    const float *qp, *dyp;                         /* a block's rows in them */
    float P[TILE * TILE] __attribute__((aligned(64)));
    float dS[TILE * TILE] __attribute__((aligned(64)));
    float D[TILE];
} grad_bufs;

/* sum over c < n of a[c] b[c]: VEC partial sums over c in order, then added in lane order. */
static float dot(const float *a, const float *b, int64_t n) {
    vec acc = {0};
    int64_t c = 0;
    for (; c + VEC <= n; c += VEC) {
        acc += *(const vec *)(a + c) * *(const vec *)(b + c);
    }
    float s = 0.0f;
    for (int k = 0; k < VEC; k++) {
        s += acc[k];
    }
    for (; c < n; c++) {
        s += a[c] * b[c];
    }
    return s;
}

/* P = exp(scale Q K^T - lse) and dS = scale P (dY V^T - D) of a query block (rows from i0)
 * against a key tile (n keys from j0), both 0 for the keys a row does not see; D_i = dy_i . o_i.
 * With dropout's mask Z (scaled), dS = scale P (Z dY V^T - D), and P becomes P Z for dV. */
static void block_probs(const att_dims *d, int64_t b, int64_t h, const float *const in[5],
                        const float *lse, int64_t i0, int64_t rows, int64_t j0, int64_t n,
                        grad_bufs *g) {
    const int64_t w = d->width;
    const int diag = d->causal && j0 + n - 1 > i0;
    const extent e = {rows, d->dh, TILE, -NONE, NONE, -NONE, diag ? i0 - j0 : NONE};
    const mm s = {g->qp, d->dh, 1, g->kt, TILE, g->P, TILE, MM_SET, NULL};
    const mm dp = {g->dyp, d->dh, 1, g->vt, TILE, g->dS, TILE, MM_SET, NULL};
    mm_rows(&s, &e);
    mm_rows(&dp, &e);
    for (int64_t r = 0; r < rows; r++) {
        g->D[r] = dot(in[0] + (i0 + r) * w, in[1] + (i0 + r) * w, d->dh);
    }
    float z[TILE];
    for (int64_t r = 0; r < rows; r++) {
        const float l = lse[i0 + r], di = g->D[r], sc = d->scale;
        const int64_t vis = visible_keys(d, i0 + r, j0, n);
        float *p = g->P + r * TILE, *ds = g->dS + r * TILE;
        if (!d->threshold) {
            for (int k = 0; k < TILE; k++) {
                float pk = k < vis ? ct__exp(sc * p[k] - l) : 0.0f;
                p[k] = pk;
                ds[k] = k < vis ? pk * (ds[k] - di) * sc : 0.0f;
            }
            continue;
        }
        for (int k = 0; k < TILE; k++) {
            z[k] = 1.0f;
        }
        drop_row(d, b, h, i0 + r, j0, vis, z);
        for (int k = 0; k < TILE; k++) {
            float pk = k < vis ? ct__exp(sc * p[k] - l) : 0.0f;
            ds[k] = k < vis ? pk * (z[k] * ds[k] - di) * sc : 0.0f;
            p[k] = pk * z[k];
        }
    }
}

/* The key tile from j0 against the query blocks of [c0, c1) that see it (packed in g's chunk):
 * dq += dS K, dk += dS^T Q, dv += P^T dY (the causal diagonal tile's products skip what the mask
 * hides). */
static void tile_grads(const att_dims *d, int64_t b, int64_t h, const float *const in[5],
                       const float *lse, int64_t c0, int64_t c1, int64_t j0, float *dq, float *dk,
                       float *dv, grad_bufs *g) {
    const int64_t w = d->width, n = d->t - j0 < TILE ? d->t - j0 : TILE;
    transpose_tile(d, in[3] + j0 * w, n, g->kt);
    pack_rows(d, in[3] + j0 * w, n, g->kp);
    transpose_tile(d, in[4] + j0 * w, n, g->vt);
    for (int64_t i0 = d->causal && j0 > c0 ? j0 : c0; i0 < c1; i0 += TILE) {
        int64_t rows = d->t - i0 < TILE ? d->t - i0 : TILE;
        int diag = d->causal && j0 + n - 1 > i0;
        g->qp = g->qc + (i0 - c0) * d->dh;
        g->dyp = g->dyc + (i0 - c0) * d->dh;
        block_probs(d, b, h, in, lse, i0, rows, j0, n, g);
        const mm mq = {g->dS, TILE, 1, g->kp, d->dh, dq + i0 * w, w, MM_ADD, NULL};
        const extent eq = {rows, n, d->dh, -NONE, diag ? i0 - j0 : NONE, -NONE, NONE};
        mm_rows(&mq, &eq);
        const mm mk = {g->dS, 1, TILE, g->qp, d->dh, dk + j0 * w, w, MM_ADD, NULL};
        const mm mv = {g->P, 1, TILE, g->dyp, d->dh, dv + j0 * w, w, MM_ADD, NULL};
        const extent ek = {n, rows, d->dh, diag ? j0 - i0 : -NONE, NONE, -NONE, NONE};
        mm_rows(&mk, &ek);
        mm_rows(&mv, &ek);
    }
}

/* Example b, head h of the backward: chunks of query blocks (their queries and dy packed once),
 * then the key tiles that the chunk sees, then the chunk's blocks that see the tile. */
static void grad_head(const att_dims *d, int64_t b, int64_t h, const float *const in[5],
                      const float *lse, float *dq, float *dk, float *dv, grad_bufs *g) {
    for (int64_t i = 0; i < d->t; i++) {
        memset(dq + i * d->width, 0, (size_t)d->dh * sizeof(float));
    }
    const int64_t w = d->width, chunk = CHUNK / d->dh / TILE * TILE;
    for (int64_t c0 = 0; c0 < d->t; c0 += chunk) { /* query blocks [c0, c1), packed once */
        int64_t c1 = d->t - c0 < chunk ? d->t : c0 + chunk;
        pack_rows(d, in[2] + c0 * w, c1 - c0, g->qc);
        pack_rows(d, in[0] + c0 * w, c1 - c0, g->dyc);
        for (int64_t j0 = 0; j0 < (d->causal ? c1 : d->t); j0 += TILE) {
            tile_grads(d, b, h, in, lse, c0, c1, j0, dq, dk, dv, g);
        }
    }
}
/* (dy, forward node, q, k, v) -> dq; aux [2, B, T, H*Dh]: dk, dv. */
void ct__cpu_attention_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    att_dims d = dims_of(n, &in[2]->out);
    dropout_of(ctx, n, &d);
    const float *lse = CT__F32(&in[1]->aux);
    int64_t total = d.batch * d.t * d.width, example = d.t * d.width;
    float *dq = CT__F32(&n->out), *dk = CT__F32(&n->aux), *dv = dk + total;
    memset(dk + d.first * example, 0, (size_t)((d.end - d.first) * example) * sizeof(float));
    memset(dv + d.first * example, 0, (size_t)((d.end - d.first) * example) * sizeof(float));
    grad_bufs bufs, *g = &bufs;   /* 480 KiB: thread stacks are 8 MiB */
    memset(g->P, 0, sizeof g->P); /* the vectors a causal tile skips hold finite values */
    memset(g->dS, 0, sizeof g->dS);
    for (int64_t b = d.first; b < d.end; b++) {
        for (int64_t h = 0; h < d.heads; h++) {
            int64_t base = b * example + h * d.dh;
            const float *const at[5] = {CT__F32(&in[0]->out) + base, CT__F32(&in[1]->out) + base,
                                        CT__F32(&in[2]->out) + base, CT__F32(&in[3]->out) + base,
                                        CT__F32(&in[4]->out) + base};
            grad_head(&d, b, h, at, lse + (b * d.heads + h) * d.t, dq + base, dk + base, dv + base,
                      g);
        }
    }
}
