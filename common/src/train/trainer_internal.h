/* The trainer's state (internal): the struct behind ctrain/train.h's ct_trainer and the calls the
 * trainer's files make to one another. trainer.c: life cycle, parameters, position, data
 * parallelism. step_graph.c: the step graphs and their cache. step.c: a step, evaluation,
 * prediction. fit.c: the training loop. trainer_log.c: the run log (TensorBoard, metrics.jsonl).
 * trainer_ckpt.c: checkpoints, restore, resume. */
#ifndef CTRAIN_TRAIN_TRAINER_INTERNAL_H
#define CTRAIN_TRAIN_TRAINER_INTERNAL_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include "core/tree_sum.h"
#include "ctrain/backend.h"
#include "ctrain/checkpoint.h"
#include "ctrain/train.h"
#include "io/run_log.h"

/* Step graphs kept at once; the least recently used one is evicted. */
#define CACHE_SLOTS 4
#define PREDICT CT_GRAPH_PREDICT

/* A built (in graph mode, compiled) step graph for one (batch size, kind), with the ids of the
 * nodes the trainer binds and reads. */
typedef struct step_graph {
    ct_graph *g;
    int64_t batch;
    int training; /* 1: training step; 0: evaluation (loss, accuracy); PREDICT: logits only */
    int x, y, loss, accuracy, logits, update; /* update: APPLY_OPTIMIZER (graph mode) or -1 */
    int top_k; /* evaluation with metrics: [top_K_accuracy]: its share of hits; else -1 */
    uint64_t last_used;
} step_graph;

/* The parts of the job the trainer reads, copied from it at create (not the whole job): the
 * file (for messages), the seed, the per-example input shape, and the train, checkpoint and
 * logs sections. */
typedef struct trainer_config {
    char path[CT_JOB_PATH_MAX];
    char run_dir[CT_JOB_PATH_MAX]; /* for logs.batch_labels */
    uint64_t seed;
    ct_xent_options xent; /* loss.label_smoothing and loss.ignore_index */
    int top_k;            /* metrics: [top_K_accuracy]: K; 0: none */
    int input_rank;
    int64_t input_shape[CT_JOB_MAX_RANK];
    ct_train_spec train;
    ct_checkpoint_spec checkpoint;
    ct_logs_spec logs;
    /* The training data's order (ct_job_id CT_JOB_ID_PIPELINE) and its canonical form, which a
     * checkpoint keeps and a resume compares (owned). */
    uint64_t input_fingerprint;
    char *input_canonical;
} trainer_config;

/* fp16's dynamic loss scale (loss_scale.c) and its counts, checkpointed. */
typedef struct ct__loss_scaler {
    float scale;       /* S: the loss seed of the backward pass (1 unless train.precision fp16) */
    int64_t good;      /* steps since the last overflow or growth */
    int64_t skipped;   /* steps skipped for an overflow, in total */
    int64_t overflows; /* overflows seen (each skips its step and halves S) */
} ct__loss_scaler;

struct ct_trainer {
    trainer_config cfg;
    ct_backend *be;
    ct_model *model;
    ct_optimizer *opt;
    step_graph cache[CACHE_SLOTS];
    uint64_t uses;
    int *vars;
    int64_t step;
    int64_t total_steps;
    int64_t classes;   /* the last axis of the model's output */
    int64_t positions; /* labels per example: 1, or T for [T, classes] outputs (a sequence); with
                          the binary loss, every output */
    int binary;        /* loss: binary cross-entropy (classes is then 2: labels 0 and 1) */
    int regression;    /* loss: mean squared error (f32 targets, one per output; classes 1) */
    float *targets;    /* integer labels converted to targets for the regression loss */
    int64_t targets_cap;
    int32_t *ids; /* inputs converted to ids for models that start with an embedding */
    int64_t ids_cap;
    int32_t *zeros; /* labels bound (unread) when predicting */
    int64_t zeros_cap;
    /* position in the run (checkpointed): the epoch in progress and its batches consumed */
    int64_t epoch, epoch_step, dataset_n;
    FILE *batch_labels;    /* logs.batch_labels: this replica's file, opened at its first step */
    char resume_note[768]; /* what the last restore adapted (another world size or global batch,
                              a changed input allowed); "" when nothing */
    /* checkpointing during fit (ct_trainer_set_checkpointing) */
    char ckpt_dir[PATH_MAX];
    char *job_text;
    char last_ckpt[PATH_MAX];
    /* data parallelism (ct_trainer_set_data_parallel) */
    const ct_grad_reducer *reducer;
    int shard_index, shard_count;
    /* train.invariant (step_chunks.c): the chunk sums' tree, the first row of the chunk being
     * run (its examples' dropout keys) and the global batch its loss gradient divides by */
    ct__tree_acc chunk_acc;
    int chunk_acc_ready;
    int64_t chunk_offset, loss_examples;
    /* A resume inside a global batch (another global batch than the checkpoint's): the examples
     * of global batch (epoch, epoch_step) trained before the checkpoint, which its step leaves
     * out (fit.c); and, during a step, the rows of this replica's slice before x (their
     * examples' keys count them) */
    int64_t resume_skip, row_base;
    /* logs (ct_trainer_set_logging); NULL: none. The logging window, kept by every replica
     * whether it logs or not (with a reducer they sum theirs at each logged step): since
     * log_time, log_step and the loader's input wait log_wait, the examples' loss and accuracy
     * sums and their count. */
    ct__run_log *log;
    double graph_seconds;  /* spent building and compiling step graphs, in total */
    double top_k_accuracy; /* of the last evaluation (NaN: none, or no metric) */
    double batch_top_k;    /* of the last batch run (NaN: not an evaluation with the metric) */
    double input_wait;     /* the wait for the next step's batch, told to its graph's executor */
    double log_time, log_wait, win_loss, win_acc, win_n;
    int64_t log_step, hist_step; /* hist_step: the step of the last histograms (-1: none) */
    int graph_logged;
    ct__loss_scaler scaler;
};

/* Steps run as chunks summed in a tree (step_chunks.c): train.invariant or gradient
 * accumulation. */
static inline int ct__trainer_chunked(const ct_trainer *t) {
    return t->cfg.train.invariant || t->cfg.train.accumulation > 1;
}

/* fp16 trains with a dynamic loss scale (loss_scale.c). */
static inline int ct__trainer_scaling(const ct_trainer *t) {
    return t->cfg.train.precision == CT_PRECISION_FP16;
}

/* ---- loss_scale.c ---- */

/* The scaler's start: train.loss_scale with fp16, else 1. */
void ct__loss_scale_init(ct_trainer *t);
/* The optimizer update that ends a step (profiled); with fp16, after unscaling the gradients,
 * or skipped for an overflow. */
ct_status ct__trainer_update(ct_trainer *t, ct_err *err);
/* The scaler's state as checkpoint tensors (none without fp16): writes at most cap entries, and
 * `counts` must outlive them. Returns the count. */
int ct__loss_scale_tensors(ct_trainer *t, ct_ckpt_tensor *out, int cap, int64_t counts[3]);
/* Takes the scaler's state from a checkpoint that has it. */
void ct__loss_scale_restore(ct_trainer *t, const ct_ckpt *c);

/* ---- step_graph.c ---- */

/* Adds the step's nodes to sg->g (batch and kind set): inputs, forward, loss, accuracy and
 * (training) backward into the flat gradient buffer. With x_data set (eager graphs) the inputs
 * are bound before ops run, so everything has run on return; without, the graph is compiled and
 * replaces sg->g. */
ct_status ct__trainer_build_step(ct_trainer *t, step_graph *sg, const void *x_data,
                                 const void *y_data, ct_err *err);
/* The cached graph for (batch, kind), built on first use; evicts the least recently used. The
 * graph is the trainer's, valid until it is evicted or the cache dropped. */
ct_status ct__trainer_graph(ct_trainer *t, int64_t batch, int kind, step_graph **ret, ct_err *err);
/* Destroys every cached graph (the trainer's destroy; a change of strategy). */
void ct__trainer_drop_graphs(ct_trainer *t);

/* ---- step.c ---- */

/* One forward (and backward when training) pass over `batch` examples, through the cached
 * graph or eagerly; the batch's mean loss and accuracy out. */
/* The labels of example `row` on: y holds i32 labels or f32 targets (regression), 4 bytes each,
 * t->positions per example. */
static inline const void *ct__label_rows(const ct_trainer *t, const void *y, int64_t row) {
    return (const char *)y + (size_t)(row * t->positions) * sizeof(int32_t);
}

/* Batch b fits the model: an example of model.input_shape's size, as many labels per example as
 * the loss takes, labels among the outputs. CT_EINVAL naming the mismatch (fit.c). */
ct_status ct__trainer_check_batch(const ct_trainer *t, const ct_batch *b, ct_err *err);

ct_status ct__trainer_run_batch(ct_trainer *t, const float *x, const void *y, int64_t batch,
                                int training, float *ret_loss, float *ret_accuracy, ct_err *err);

/* ---- step_chunks.c ---- */

/* A training step under train.invariant: this replica's canonical chunks one by one, their
 * gradients summed in the canonical tree, the reducer's canonical sum, the global mean, the
 * update. As ct_trainer_step_shard. */
ct_status ct__trainer_step_chunks(ct_trainer *t, const float *x, const void *y, int64_t batch,
                                  int64_t global_n, float *ret_loss, float *ret_accuracy,
                                  ct_err *err);

/* ---- thread_use.c ---- */

/* A snapshot of the training graph's executor: runs per mode and each thread's wait for a core
 * so far (taken 0: no such graph yet). */
typedef struct ct__thread_use {
    int taken, threads;
    int64_t parallel, solo;
    double wait[CT_PROGRESS_THREADS];
} ct__thread_use;

void ct__thread_use_take(const ct_trainer *t, ct__thread_use *u);
/* Sets p's threads, solo_fraction and core_wait for the `seconds` between two snapshots (nothing
 * when either was not taken or the step runs on one thread). */
void ct__thread_use_report(const ct__thread_use *start, const ct__thread_use *end, double seconds,
                           ct_train_progress *p);

/* ---- trainer_log.c ---- */

/* The training-step graph into the run log's train/ run, once per trainer (not in eager mode).
 * Returns the status of getting the graph; a failed write is the run log's to handle. */
ct_status ct__trainer_log_graph(ct_trainer *t, int64_t batch, ct_err *err);
/* With a reducer that sums across replicas (mirrored, two or more): sums[0..n) summed over the
 * replicas in place, a collective every replica must call; otherwise nothing to do. */
ct_status ct__trainer_sum_replicas(ct_trainer *t, double *sums, int n, ct_err *err);
/* Opens the logging window at fit's start: the time, the step and the loader's input wait. */
void ct__trainer_log_start(ct_trainer *t, double wait_s);
/* After every step, on every replica (a batch that was empty here too): adds the step's loss
 * and accuracy sums over its n examples to the window; every logs.every_steps steps sums the
 * window across the replicas (docs/metrics.md: the global batch's figures) and, where there is
 * a run log, writes scalars and a metrics line. epoch[3]: this replica's epoch sums so far
 * (loss, accuracy, examples); wait_s is the loader's total input wait so far. Histograms go on
 * their own schedule, every logs.histogram_every_steps steps. Fails only as the sum does. */
ct_status ct__trainer_log_step(ct_trainer *t, double loss_sum, double acc_sum, int64_t n,
                               const double epoch[3], double wait_s, ct_err *err);
/* The end of an epoch (p->end_of_epoch set, its figures already the global ones): the epoch's
 * scalars, validation scalars, histograms and a metrics line. */
void ct__trainer_log_epoch(ct_trainer *t, const ct_train_progress *p);

/* ---- trainer.c ---- */

/* Makes t's model read `from`'s weights (ct_params_share: t's own copy and its gradients are
 * freed): contexts of one checkpoint for inference only (predictor.c). Before t builds any step
 * graph (its variables would point at the freed copy): CT_EINVAL after. `from` outlives t. */
ct_status ct__trainer_share_weights(ct_trainer *t, ct_trainer *from, ct_err *err);

/* ---- trainer_ckpt.c ---- */

/* The step of the last checkpoint written or restored, from its file name; -1 if none. */
int64_t ct__trainer_last_saved_step(const ct_trainer *t);

#endif
