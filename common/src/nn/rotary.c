/* Rotary position embeddings (RoFormer; GPT-NeoX's and LLaMA's "rotate half" layout) as a
 * composite of graph ops, so that its gradient is theirs: each head's vector of size D is split
 * in halves (x1, x2), and the pair (x1[i], x2[i]) at position t is rotated by the angle
 * t * base^(-2i / D). The cosines and sines are constants of the graph, computed in double. */
#include <math.h>
#include <stdlib.h>

#include "ctrain/nn.h"

int ct_rotary_embedding(ct_graph *g, int x, int heads, float base) {
    if (x < 0) {
        return -1; /* an earlier builder's error is recorded in g */
    }
    ct_shape s = ct_graph_node(g, x)->out.shape;
    if (s.rank != 3 || heads < 1 || s.dims[2] % heads != 0 || (s.dims[2] / heads) % 2 != 0 ||
        !(base > 1.0f)) {
        return ct_graph_fail(g, CT_ESHAPE,
                             "rotary: needs [batch, positions, heads x an even head size] and a "
                             "base above 1");
    }
    const int64_t t_len = s.dims[1], d = s.dims[2] / heads, half = d / 2;
    float *table = malloc((size_t)(2 * t_len * d) * sizeof *table);
    if (!table) {
        return ct_graph_fail(g, CT_ENOMEM, "rotary: out of memory");
    }
    for (int64_t t = 0; t < t_len; t++) {
        for (int64_t j = 0; j < d; j++) {
            double angle = (double)t * pow((double)base, -(double)(2 * (j % half)) / (double)d);
            table[t * d + j] = (float)cos(angle);
            table[t_len * d + t * d + j] = (float)sin(angle);
        }
    }
    ct_shape ts = {.rank = 3, .dims = {t_len, 1, d}};
    int cosines = ct_constant(g, CT_F32, &ts, table);
    int sines = ct_constant(g, CT_F32, &ts, table + t_len * d);
    free(table);
    int64_t per_head[4] = {s.dims[0], t_len, heads, d};
    int h = ct_reshape(g, x, 4, per_head);
    int halves[2] = {ct_scale(g, ct_slice(g, h, 3, half, half), -1.0f), ct_slice(g, h, 3, 0, half)};
    int rotated = ct_concat(g, 2, halves, 3); /* (-x2, x1) */
    int y = ct_add(g, ct_mul(g, h, cosines), ct_mul(g, rotated, sines));
    return ct_reshape(g, y, 3, s.dims);
}
