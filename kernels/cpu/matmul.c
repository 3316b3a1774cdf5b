/* CPU matmul through ct__sgemm (oneDNN or OpenBLAS, chosen by measurement: see README). Operands of
 * rank > 2 fold their leading dims into rows, so a dense layer on [batch, ..., features] is one
 * GEMM. An accumulating node (a weight gradient bound to the flat gradient buffer) uses beta = 1.
 */
#include "graph/op_impl.h"

static void as_matrix(const ct_shape *s, int64_t *rows, int64_t *cols) {
    *cols = s->rank ? s->dims[s->rank - 1] : 1;
    *rows = *cols ? ct_shape_numel(s) / *cols : 0;
}

void ct__cpu_matmul(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int64_t ar, ac, br, bc;
    as_matrix(&in[0]->out.shape, &ar, &ac);
    as_matrix(&in[1]->out.shape, &br, &bc);
    int ta = (int)n->attrs.i[0], tb = (int)n->attrs.i[1];
    int64_t m = ta ? ac : ar, k = ta ? ar : ac, cols = tb ? br : bc;
    if (m == 0 || cols == 0) {
        return;
    }
    ct__sgemm(ta, tb, m, cols, k, 1.0f, CT__F32(&in[0]->out), ac, CT__F32(&in[1]->out), bc,
              ct__beta(n), CT__F32(&n->out), cols);
}
