/* ct_trainer_export_onnx: the model's inference graph, built as a prediction step builds it but
 * neither compiled nor run (no fused nodes), written by io/onnx_write.c. */
#include "io/onnx_build.h"
#include "train/trainer_internal.h"

#define TRACE_BATCH 2 /* any size: the export makes the batch dimension dynamic */

ct_status ct_trainer_export_onnx(ct_trainer *t, const char *path, const char *producer,
                                 ct_err *err) {
    ct_graph *g = NULL;
    ct_status st = ct_graph_create(t->be, 0, &g, err);
    if (st != CT_OK) {
        return st;
    }
    ct_shape xs = {.rank = t->cfg.input_rank + 1, .dims = {TRACE_BATCH}};
    for (int k = 0; k < t->cfg.input_rank; k++) {
        xs.dims[k + 1] = t->cfg.input_shape[k];
    }
    int x = ct_placeholder(g, ct_model_input_dtype(t->model), &xs, "input");
    int logits = ct_model_forward(t->model, g, x, 0, t->vars);
    if ((st = ct_graph_status(g, err)) == CT_OK) {
        st = ct__onnx_write(g, x, logits, producer, path, err);
    }
    ct_graph_destroy(g);
    return st == CT_OK ? CT_OK : ct_err_prefix(err, st, "%s", t->cfg.path);
}
