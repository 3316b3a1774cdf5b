/* train.invariant's canonical chunks (ctrain/job.h: ct_job_chunks): how many chunks the global
 * batch is cut into, whether they split over the replicas as the canonical tree needs
 * (core/tree_sum.h: a power of two of whole chunks per replica), and what the mode cannot cover
 * (docs/determinism.md). */
#include "ctrain/job.h"

int ct_job_default_chunks(int n) {
    int c = 1;
    while (c < 4 && n % (2 * c) == 0) {
        c *= 2;
    }
    return c;
}

/* What train.invariant cannot cover: CT_EINVAL with its line, or CT_OK. */
static ct_status invariant_refusal(const ct_job *job, ct_err *err) {
    for (int k = 0; k < job->model.n_layers; k++) {
        if (job->model.layers[k].type == CT_LAYER_BATCH_NORM) {
            return ct_err_set(err, CT_EINVAL,
                              "%s:%d: train.invariant: batch_norm normalizes each chunk of the "
                              "global batch on its own and its running statistics would differ "
                              "between replicas (synchronized batch norm is not built): remove "
                              "batch_norm or set train.invariant: false",
                              job->path, job->model.layers[k].line);
        }
    }
    if (job->strategy == CT_STRATEGY_PARAMETER_SERVER &&
        (job->ps.async || job->ps.backup_workers > 0)) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: train.invariant needs every worker's gradient in every step: "
                          "set strategy.mode: sync and strategy.backup_workers: 0",
                          job->path);
    }
    if (job->strategy == CT_STRATEGY_MIRRORED && job->mirrored.compression != CT_COMPRESSION_NONE) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: train.invariant sums gradients in f32; strategy.compression "
                          "rounds each replica's partial sum to 16 bits, which depends on the "
                          "replicas (set compression: none)",
                          job->path);
    }
    return CT_OK;
}

/* train.gradient_accumulation without train.invariant: micro-batches of the replica's batch. */
static ct_status accumulation_chunks(const ct_job *job, int replicas, int *ret_chunks,
                                     ct_err *err) {
    int per = 0, n = job->train.accumulation;
    ct_status st = ct_job_replica_batch(job, replicas, &per, err);
    if (st == CT_OK && per % n != 0) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: train.gradient_accumulation %d does not divide each replica's batch "
                        "of %d examples (choose a divisor)",
                        job->path, n, per);
    }
    *ret_chunks = st == CT_OK ? n * replicas : 0;
    return st;
}

ct_status ct_job_chunks(const ct_job *job, int replicas, int *ret_chunks, ct_err *err) {
    *ret_chunks = 0;
    if (job->train.accumulation > 1 && job->train.invariant) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: train.gradient_accumulation with train.invariant: set "
                          "train.invariant_chunks instead (each chunk is a micro-batch)",
                          job->path);
    }
    if (job->train.accumulation > 1) {
        return accumulation_chunks(job, replicas, ret_chunks, err);
    }
    if (!job->train.invariant) {
        return CT_OK;
    }
    if (replicas < 1) {
        return ct_err_set(err, CT_EINVAL, "%s: train.invariant over %d replicas", job->path,
                          replicas);
    }
    ct_status refused = invariant_refusal(job, err);
    if (refused != CT_OK) {
        return refused;
    }
    int per = 0;
    ct_status st = ct_job_replica_batch(job, replicas, &per, err);
    if (st != CT_OK) {
        return st;
    }
    const int global = per * replicas;
    int n =
        job->train.invariant_chunks ? job->train.invariant_chunks : ct_job_default_chunks(global);
    if (global % n != 0) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: train.invariant_chunks %d does not divide the global batch %d "
                          "(make it a divisor that is %d replicas times a power of two)",
                          job->path, n, global, replicas);
    }
    int s = n / replicas;
    if (n % replicas != 0 || (s & (s - 1)) != 0) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: train.invariant: %d chunks of the global batch do not split over "
                          "%d replicas as a power of two each (set train.invariant_chunks to %d "
                          "times a power of two that divides %d)",
                          job->path, n, replicas, replicas, global / replicas);
    }
    *ret_chunks = n;
    return CT_OK;
}
