/* A training step under train.invariant (docs/determinism.md): the same bits for any number of
 * replicas at a fixed global batch; and gradient accumulation (train.gradient_accumulation: the
 * replica's batch in that many micro-batches, summed the same way).
 *
 * The global batch is cut into N canonical chunks of c examples, aligned to its global order;
 * replica r of W holds chunks [r N/W, (r+1) N/W) (its shard is the r-th slice of the global
 * batch). Each chunk runs as its own forward and backward pass (the step graph for c examples:
 * a chunk's gradient depends on its examples only, never on how many rows the kernels saw), and
 * the chunk gradients are summed in the canonical tree (core/tree_sum.h) as they come; the
 * replicas' partial sums, nodes of that same tree, are then added by the reducer's canonical
 * all-reduce. Each chunk's loss gradient divides by the global batch's examples (not the
 * chunk's rows), so the sum is the global batch's mean with no scaling after it (which the
 * shared-memory engine would forbid: the others may still read our buffer). A chunk short of c
 * examples (the last batch of an epoch) is just smaller; a missing one adds nothing. */
#include <math.h>

#include "prof/prof.h"
#include "train/trainer_internal.h"

/* Examples per canonical chunk: the global batch over train.invariant_chunks (or its default;
 * the role checked with ct_job_chunks that they split over the replicas). */
static int64_t chunk_rows(const ct_trainer *t) {
    if (!t->cfg.train.invariant) { /* gradient accumulation: micro-batches of this replica's */
        return t->cfg.train.batch_size / t->cfg.train.accumulation;
    }
    int replicas = t->shard_count > 0 ? t->shard_count : 1;
    int global = t->cfg.train.batch_size * replicas;
    int chunks = t->cfg.train.invariant_chunks > 0 ? t->cfg.train.invariant_chunks
                                                   : ct_job_default_chunks(global);
    int64_t rows = global / chunks;
    return rows > 0 ? rows : 1;
}

/* Runs this replica's chunks of a batch of `batch` examples and leaves the tree sum of their
 * gradients in params->grad; loss and accuracy sums out. */
static ct_status run_chunks(ct_trainer *t, const float *x, const void *y, int64_t batch,
                            double *loss_sum, double *acc_sum, ct_err *err) {
    ct_params *p = ct_model_params(t->model);
    const int64_t c = chunk_rows(t), slots = (t->cfg.train.batch_size + c - 1) / c;
    int64_t example = 1;
    for (int k = 0; k < t->cfg.input_rank; k++) {
        example *= t->cfg.input_shape[k];
    }
    if (!t->chunk_acc_ready) {
        ct__tree_acc_init(&t->chunk_acc, p->trainable_total);
        t->chunk_acc_ready = 1;
    }
    /* slot j holds rows [j c, (j+1) c) of the slice; x starts at its row t->row_base (a resume
     * inside a global batch leaves the rows before out) */
    const int64_t base = t->row_base, end = base + batch;
    ct_status st = CT_OK;
    for (int64_t j = 0; j < slots && st == CT_OK; j++) {
        int64_t a = j * c > base ? j * c : base, e = (j + 1) * c < end ? (j + 1) * c : end;
        int64_t r0 = a - base, n = e - a;
        if (n > 0) {
            float loss, acc;
            t->chunk_offset = r0;
            st = ct__trainer_run_batch(t, x + r0 * example, ct__label_rows(t, y, r0), n, 1, &loss,
                                       &acc, err);
            t->chunk_offset = 0;
            *loss_sum += (double)loss * (double)n;
            *acc_sum += (double)acc * (double)n;
        }
        const float *leaf = n > 0 ? p->grad : NULL;
        if (st == CT_OK && j == slots - 1) { /* the last: its fold writes the sum in place */
            ct__tree_acc_finish_with(&t->chunk_acc, leaf, p->grad);
            return CT_OK;
        }
        if (st == CT_OK && ct__tree_acc_push(&t->chunk_acc, leaf) != CT_OK) {
            st = ct_err_set(err, CT_ENOMEM, "trainer: out of memory for the chunk sums");
        }
    }
    ct__tree_acc_finish(&t->chunk_acc, p->grad);
    return st;
}

/* Elastic: this replica's chunks of the global batch (the reducer says which, and may say
 * again after a replica was lost), each chunk's gradient handed to the reducer, which leaves
 * the sum of every replica's chunks in params->grad; the step's sums out. */
static ct_status run_elastic(ct_trainer *t, const float *x, const void *y, int64_t batch,
                             double sums[3], ct_err *err) {
    const ct_grad_reducer *r = t->reducer;
    ct_params *p = ct_model_params(t->model);
    const int64_t c = chunk_rows(t), slots = (t->cfg.train.batch_size + c - 1) / c;
    int64_t example = 1;
    for (int k = 0; k < t->cfg.input_rank; k++) {
        example *= t->cfg.input_shape[k];
    }
    const int64_t base = t->row_base, end = base + batch;
    ct_status st = CT_OK;
    do {
        const uint64_t mine = r->chunks(r->user);
        for (int64_t j = 0; j < slots && j < 64 && st == CT_OK; j++) {
            if (!(mine >> j & 1)) {
                continue;
            }
            int64_t a = j * c > base ? j * c : base, e = (j + 1) * c < end ? (j + 1) * c : end;
            int64_t r0 = a - base, n = e - a;
            double s[3] = {0.0, 0.0, 0.0};
            if (n > 0) {
                float loss, acc;
                t->chunk_offset = r0;
                st = ct__trainer_run_batch(t, x + r0 * example, ct__label_rows(t, y, r0), n, 1,
                                           &loss, &acc, err);
                t->chunk_offset = 0;
                s[0] = (double)loss * (double)n;
                s[1] = (double)acc * (double)n;
                s[2] = (double)n;
            }
            if (st == CT_OK) {
                st = r->chunk_done(r->user, (int)j, n > 0 ? p->grad : NULL, s, err);
            }
        }
        if (st == CT_OK) {
            st = r->finish(r->user, err);
        }
    } while (st == CT_OK && r->again(r->user));
    r->step_sums(r->user, sums);
    return st;
}

ct_status ct__trainer_step_chunks(ct_trainer *t, const float *x, const void *y, int64_t batch,
                                  int64_t global_n, float *ret_loss, float *ret_accuracy,
                                  ct_err *err) {
    const ct_grad_reducer *r = t->reducer;
    if (r && r->begin_step) { /* a partial sum, not a mean: weight 1; no node reports */
        r->begin_step(r->user, NULL, t->step, global_n, global_n);
    }
    double loss_sum = 0.0, acc_sum = 0.0, sums[3] = {0.0, 0.0, 0.0};
    t->loss_examples = global_n;
    ct_status st;
    if (r && r->chunks) { /* elastic: finish ran, for every chunk */
        st = run_elastic(t, x, y, batch, sums, err);
        loss_sum = sums[0];
        acc_sum = sums[1];
    } else {
        st = run_chunks(t, x, y, batch, &loss_sum, &acc_sum, err);
    }
    t->loss_examples = 0;
    if (st == CT_OK && r && r->finish && !r->chunks) {
        st = r->finish(r->user, err);
    }
    if (st == CT_OK && !(r && r->remote_update)) {
        st = ct__trainer_update(t, err);
    }
    if (st == CT_OK) {
        t->step++;
        st = r && r->after_update ? r->after_update(r->user, t->step, err) : CT_OK;
    }
    *ret_loss = batch > 0 ? (float)(loss_sum / (double)batch) : NAN;
    *ret_accuracy = batch > 0 ? (float)(acc_sum / (double)batch) : NAN;
    return st;
}
