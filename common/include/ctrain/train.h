/* The training loop: one loop for every strategy (local now; mirrored and parameter-server plug
 * in as gradient exchanges). A trainer owns the backend, the model, the optimizer and one
 * prepared graph per batch size (forward, loss, backward into the flat gradient buffer, metrics),
 * so a steady-state step allocates nothing. */
#ifndef CTRAIN_TRAIN_H
#define CTRAIN_TRAIN_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/data.h"
#include "ctrain/job.h"
#include "ctrain/nn.h"
#include "ctrain/optim.h"
#include "ctrain/status.h"

typedef struct ct_trainer ct_trainer;

/* Progress after each step (for progress bars) and at the end of each epoch. */
#define CT_PROGRESS_THREADS 16 /* executor threads a progress report describes */

typedef struct ct_train_progress {
    int epoch; /* 0-based */
    int epochs;
    int64_t step;        /* batch within the epoch, 1-based after the step */
    int64_t steps;       /* batches per epoch */
    int64_t global_step; /* steps done in the whole run */
    double loss;         /* running mean over the epoch so far */
    double accuracy;
    double samples_per_s;
    double eta_s;     /* seconds left in this epoch */
    int end_of_epoch; /* 1: the eval fields are set */
    double epoch_seconds;
    double test_loss, test_accuracy; /* NaN when there is no eval data */
    int top_k;                       /* metrics: [top_K_accuracy]: K, and the evaluation's */
    double test_top_k_accuracy;      /* share of labels among the K largest logits; 0: none */
    double input_wait_fraction;      /* fraction of the epoch spent waiting for input */
    /* the data service (data.service), at the end of an epoch; data_workers 0 without it */
    int data_workers;             /* live data workers */
    double worker_elements_per_s; /* what one data worker produces while busy (the mean) */
    double needed_elements_per_s; /* what the consumers (every rank) would take if they never
                                     waited: examples per second of compute */
    int workers_needed;           /* data workers that would remove the wait */
    double graph_seconds;         /* of epoch_seconds, spent tracing and compiling step graphs */
    /* graph mode's executor over the epoch, at the end of an epoch; threads 0 on one thread */
    int threads;          /* executor threads */
    double solo_fraction; /* steps run on the calling thread alone: faster, a core was taken */
    double core_wait[CT_PROGRESS_THREADS]; /* per thread, the share of the epoch it waited for a
                                              core the host gave to another process; -1: unknown */
} ct_train_progress;

typedef void (*ct_progress_fn)(const ct_train_progress *p, void *user);

/* How a training driver (the mirrored strategy, the parameter-server chief) reports to the role
 * that runs it: the library prints nothing, the role decides what to show. Either callback may be
 * NULL (quiet). Called on the driver's thread. */
typedef struct ct_train_reporter {
    ct_progress_fn progress; /* after steps and at the end of each epoch (p->end_of_epoch) */
    void (*notice)(const char *line, void *user); /* a one-line notice for a person ("worker 1
                                                     is back"), without a newline */
    void *user;
} ct_train_reporter;

typedef struct ct_train_result {
    int epochs;
    int64_t steps;
    double train_loss, train_accuracy; /* last epoch's running means */
    double test_loss, test_accuracy;   /* NaN without eval data */
    int top_k;                         /* metrics: [top_K_accuracy]: K (0: none), and its figure */
    double test_top_k_accuracy;
    double seconds; /* training time, evaluation excluded */
    double samples_per_s;
    int64_t positions; /* labels per example: > 1 for a language model ([T, classes] out), whose
                          done line adds perplexity and tokens per second; 0 or 1: neither */
} ct_train_result;

/* Creates a trainer for `job`: CPU backend with job->train.threads, the model (validated), the
 * optimizer. Loads no data. The trainer copies the sections it reads (model, optimizer, train,
 * checkpoint, logs; not the whole job): job may be freed afterwards. */
CT_API ct_status ct_trainer_create(const ct_job *job, ct_trainer **ret, ct_err *err);
/* As ct_trainer_create, with `train` in place of job->train (a strategy's own choices: one
 * thread per mirrored rank). */
CT_API ct_status ct_trainer_create_with(const ct_job *job, const ct_train_spec *train,
                                        ct_trainer **ret, ct_err *err);
CT_API void ct_trainer_destroy(ct_trainer *t);

/* ct_job_load + ct_trainer_create in one call (for embedding users and language bindings). */
CT_API ct_status ct_trainer_load(const char *job_path, const char *const *sets, int n_sets,
                                 ct_trainer **ret, ct_err *err);

/* Copies parameter `name` ("dense_1/kernel") out of / into the model; n must be its size. */
CT_API ct_status ct_trainer_get_param(ct_trainer *t, const char *name, float *dst, int64_t n,
                                      ct_err *err);
CT_API ct_status ct_trainer_set_param(ct_trainer *t, const char *name, const float *src, int64_t n,
                                      ct_err *err);

CT_API ct_model *ct_trainer_model(ct_trainer *t);
CT_API ct_params *ct_trainer_params(ct_trainer *t);

/* One optimizer step on a batch: x is [batch, input...] f32, y is [batch] i32 labels ([batch, T]
 * for a model that outputs [T, classes] per example: a label per position), or with loss
 * mean_squared_error f32 targets, one per output. Returns the
 * batch loss and accuracy before the update. Labels must be in [0, outputs): CT_EINVAL otherwise.
 * NaN/Inf gradients: CT_ENUMERIC naming the step and the variable. */
CT_API ct_status ct_trainer_step(ct_trainer *t, const float *x, const void *y, int64_t batch,
                                 float *ret_loss, float *ret_accuracy, ct_err *err);

/* The labels of batch b (from a loader) as the trainer's loss takes them: b->y (i32), or f32
 * targets for mean_squared_error (b->targets, or b->y converted into the trainer's buffer, valid
 * until the next call). NULL with CT_EINVAL in err when the batch does not fit the model (an
 * example's size, the labels per example, a label past the outputs) or its labels the loss (f32
 * labels for a cross-entropy: the message says how to cast them). */
CT_API const void *ct_trainer_batch_labels(ct_trainer *t, const ct_batch *b, ct_err *err);

/* Forward pass only (inference mode) over n examples in batches of job->train.eval_batch_size;
 * returns the mean loss and accuracy. */
CT_API ct_status ct_trainer_evaluate(ct_trainer *t, const float *x, const void *y, int64_t n,
                                     double *ret_loss, double *ret_accuracy, ct_err *err);

/* Logits of a forward pass in inference mode: out is [batch, outputs] ([batch, T, classes] for a
 * model with a label per position). */
CT_API ct_status ct_trainer_predict(ct_trainer *t, const float *x, int64_t batch, float *out,
                                    ct_err *err);

/* Trains job->train.epochs epochs over `train` (shuffled per epoch from the job seed, prefetched),
 * evaluating on `eval` (may be NULL) after each epoch. `progress` may be NULL. `stop` (may be
 * NULL) is polled between steps: when it becomes non-zero the loop ends early with CT_EINTR. */
CT_API ct_status ct_trainer_fit(ct_trainer *t, const ct_examples *train, const ct_examples *eval,
                                ct_progress_fn progress, void *user, volatile int *stop,
                                ct_train_result *ret, ct_err *err);

/* ct_trainer_fit over loaders (borrowed; eval may be NULL): any input pipeline. With a reducer
 * each replica's loaders hold its shard; evaluation sums the replicas' figures. The train
 * loader's step count is every replica's; -1 (unknown) trains each epoch until the input ends
 * (single process only: replicas need a common count). */
CT_API ct_status ct_trainer_fit_loaders(ct_trainer *t, ct_loader *train, ct_loader *eval,
                                        ct_progress_fn progress, void *user, volatile int *stop,
                                        ct_train_result *ret, ct_err *err);

/* Mean loss and accuracy over epoch 0 of `eval` (borrowed), batch by batch; with a reducer and
 * shards, summed across the replicas (every replica must call it). NaN for no examples. */
CT_API ct_status ct_trainer_evaluate_loader(ct_trainer *t, ct_loader *eval, double *loss,
                                            double *acc, ct_err *err);

/* metrics: [top_K_accuracy]: K (0: not asked for), and the share of labels among the K largest
 * logits in the last ct_trainer_evaluate or ct_trainer_evaluate_loader (NaN: none yet, or K 0):
 * an evaluation figure, as ImageNet's top-5; training reports top-1 accuracy only. */
CT_API int ct_trainer_top_k(const ct_trainer *t);
CT_API double ct_trainer_top_k_accuracy(const ct_trainer *t);

/* Writes the model's inference graph with its current weights (batch norm in inference form,
 * dropout gone) as an ONNX model (opset 17) at path: input "input" ([batch, input_shape...],
 * f32, or i32 token ids for a model that starts with an embedding), output "output" (the
 * logits, as ct_trainer_predict's), the batch dimension dynamic, each parameter an initializer
 * under its name in `ctrain summary`. producer: the producer_version written (ctrain's). An op
 * with no ONNX form: CT_EINVAL naming it and its layer. */
CT_API ct_status ct_trainer_export_onnx(ct_trainer *t, const char *path, const char *producer,
                                        ct_err *err);

/* Graph kinds of ct_trainer_step_graph: evaluation (loss, accuracy), a training step, and
 * prediction (logits only). */
enum { CT_GRAPH_EVAL = 0, CT_GRAPH_TRAIN = 1, CT_GRAPH_PREDICT = 2 };

/* The compiled graph the trainer runs for (batch, kind: CT_GRAPH_*), built on first use; owned
 * by the trainer, valid until the trainer is destroyed or evicts it. For `ctrain graph`. */
CT_API ct_status ct_trainer_step_graph(ct_trainer *t, int64_t batch, int training, ct_graph **ret,
                                       ct_err *err);

/* ---- checkpoints (see checkpoint.h) ---- */
struct ct_ckpt;

/* Makes fit save into dir (every checkpoint.every_steps steps, at the end, and when *stop is
 * raised) with job_text (the job file and its overrides) inside each checkpoint. NULL dir: off. */
CT_API ct_status ct_trainer_set_checkpointing(ct_trainer *t, const char *dir, const char *job_text,
                                              ct_err *err);
/* Saves the run's state now: parameters, optimizer slots, step, epoch, batch within the epoch,
 * seed and job text. ret_path (PATH_MAX bytes, may be NULL) gets the file. */
CT_API ct_status ct_trainer_save(ct_trainer *t, char *ret_path, ct_err *err);
/* Restores a checkpoint read from `path` (names and shapes checked; the seed and batch size must
 * match the job). The next fit continues at the saved epoch and batch. */
CT_API ct_status ct_trainer_restore(ct_trainer *t, const struct ct_ckpt *c, const char *path,
                                    ct_err *err);
/* Restores the newest good checkpoint of dir, if any (*resumed = 1); corrupt files are passed
 * over and reported through warn. */
CT_API ct_status ct_trainer_resume(ct_trainer *t, const char *dir, int *resumed,
                                   void (*warn)(const char *msg, void *user), void *user,
                                   ct_err *err);
/* Makes fit write logs into run_dir: TensorBoard runs train/ (loss, accuracy, learning rate,
 * steps/s, samples/s, input-wait fraction every logs.every_steps steps; weight and gradient
 * histograms every logs.histogram_every_steps; the job text; the step graph) and validation/
 * (end-of-epoch test loss and accuracy), and metrics.jsonl (one JSON object per logged step and
 * per epoch). Call after ct_trainer_set_checkpointing so the job text is known. */
CT_API ct_status ct_trainer_set_logging(ct_trainer *t, const char *run_dir, ct_err *err);
/* A trainer holding the model of checkpoint `path` (a file, or a directory's newest good one)
 * for inference (ct_trainer_predict, ct_trainer_export_onnx): made from the job the checkpoint
 * holds (parsed into *job, which must outlive *t) with the checkpoint's weights restored, but
 * not the optimizer's state (plain SGD in its place: no slots, a third of Adam's memory), and
 * whether the training data changed since is not asked. *t is NULL on error (the message names
 * the file). */
CT_API ct_status ct_trainer_load_checkpoint(const char *path, ct_job *job, ct_trainer **t,
                                            ct_err *err);
/* ---- inference only ---- */

/* A checkpoint's model for inference only, thread-safe: `contexts` copies of it loaded as
 * ct_trainer_load_checkpoint does (no optimizer state; only prediction graphs are built), so
 * that many predictions run at once from different threads and further callers wait their
 * turn. The contexts read one copy of the weights (ct_params_share) and each has its own graphs
 * and buffers, running the job's train.threads. The outputs do not depend on the context or on
 * the other callers. */
typedef struct ct_predictor ct_predictor;
CT_API ct_status ct_predictor_load(const char *path, int contexts, ct_predictor **ret, ct_err *err);
/* ct_trainer_predict on a free context: out [batch, ct_predictor_outputs] floats. */
CT_API ct_status ct_predictor_run(ct_predictor *p, const float *x, int64_t batch, float *out,
                                  ct_err *err);
/* The job the checkpoint holds; floats out per example. */
CT_API const ct_job *ct_predictor_job(const ct_predictor *p);
CT_API int64_t ct_predictor_outputs(const ct_predictor *p);
CT_API void ct_predictor_destroy(ct_predictor *p);

/* The last checkpoint written or restored ("" if none). */
CT_API const char *ct_trainer_last_checkpoint(const ct_trainer *t);
CT_API int64_t ct_trainer_step_count(const ct_trainer *t);
/* Labels per example: 1, or T for a model that outputs [T, classes] per example. */
CT_API int64_t ct_trainer_positions(const ct_trainer *t);

/* ---- data parallelism ---- */

/* A gradient reducer combines the replicas' gradients (mirrored all-reduce; later the parameter
 * servers). The trainer calls begin_step before a step's graph runs (local and global example
 * counts of the step), the executor calls node_done after each node (start reducing what
 * backward has written), and finish before the optimizer update: on return params->grad holds
 * the global batch's mean gradient. after_update runs after the update (replica checks). */
typedef struct ct_grad_reducer {
    void *user;
    void (*begin_step)(void *user, ct_graph *g, int64_t step, int64_t local_n, int64_t global_n);
    void (*node_done)(void *user, const struct ct_node *node);
    ct_status (*finish)(void *user, ct_err *err);
    ct_status (*after_update)(void *user, int64_t step, ct_err *err);
    /* Before each step: 1 when any replica wants to stop (a signal reached some of them), so
     * all stop at the same step instead of leaving the others in a collective. */
    int (*agree_stop)(void *user, int local_stop);
    /* Evaluation is sharded too: each replica evaluates its slice of the eval set and this sums
     * sums[0..n) (loss x count, accuracy x count, count) across the replicas in place. */
    ct_status (*sum_eval)(void *user, double *sums, int n, ct_err *err);
    /* 1: finish hands the gradients to another process that applies the update (parameter
     * servers), so the trainer applies none. begin_step, node_done, finish and the others may
     * be NULL. */
    int remote_update;
    /* Elastic (strategy.elastic, train.invariant's chunks): the chunks of the global batch this
     * replica computes now (bit j: chunk j). Each one's gradient (NULL: the chunk has no
     * examples) and sums {loss x examples, accuracy x examples, examples} go to chunk_done
     * instead of a local sum; finish then leaves the step's sum of every chunk in
     * params->grad, unless again() says the chunks changed (a replica was lost): then the
     * replica computes chunks() and finishes again. step_sums gives the step's sums over every
     * chunk. NULL chunks: not elastic. */
    uint64_t (*chunks)(void *user);
    ct_status (*chunk_done)(void *user, int chunk, const float *grad, const double sums[3],
                            ct_err *err);
    int (*again)(void *user);
    void (*step_sums)(void *user, double sums[3]);
} ct_grad_reducer;

/* Makes steps reduce gradients through r (borrowed), and fit read shard `index` of `count` of
 * each global batch. With a reducer the executor runs nodes in order on one thread. */
CT_API void ct_trainer_set_data_parallel(ct_trainer *t, const ct_grad_reducer *r, int index,
                                         int count);
/* One step on a local batch (size 0 allowed: the replica contributes no gradient) that is part
 * of a global batch of global_n examples. */
CT_API ct_status ct_trainer_step_shard(ct_trainer *t, const float *x, const void *y, int64_t batch,
                                       int64_t global_n, float *ret_loss, float *ret_accuracy,
                                       ct_err *err);
/* Copies the run position (step, epoch, batch in the epoch) in and out, for broadcasting a
 * restored state to the other replicas. */
CT_API void ct_trainer_get_position(const ct_trainer *t, int64_t pos[3]);
CT_API void ct_trainer_set_position(ct_trainer *t, const int64_t pos[3]);
/* After a resume inside a global batch (the checkpoint's global batch does not divide the
 * examples it consumed): the examples of the next global batch trained before, which the next
 * step leaves out; 0 otherwise. Broadcast with the position. */
CT_API int64_t ct_trainer_resume_skip(const ct_trainer *t);
CT_API void ct_trainer_set_resume_skip(ct_trainer *t, int64_t examples);
/* fp16's loss scale and its counts {scale, good steps, skipped steps, overflows}, which a
 * resumed rank 0 broadcasts with the weights (every replica must scale alike). */
CT_API void ct_trainer_get_loss_scale(const ct_trainer *t, double state[4]);
CT_API void ct_trainer_set_loss_scale(ct_trainer *t, const double state[4]);
CT_API struct ct_optimizer *ct_trainer_optimizer(ct_trainer *t);
/* A driver's event at the current step, into the run's TensorBoard files (train/): the scalar
 * `tag` = value and, when text is not NULL, the text summary `text_tag` (the elastic strategy's
 * membership changes). A no-op without logging. */
CT_API void ct_trainer_log_event(ct_trainer *t, const char *tag, double value, const char *text_tag,
                                 const char *text);
/* Sets what fit would: the training set's size and the run's planned steps (stored in
 * checkpoints; the evaluator stops after the checkpoint of the last step). For drivers that
 * run steps themselves (the parameter-server chief). */
CT_API void ct_trainer_set_run(ct_trainer *t, int64_t dataset_n, int64_t total_steps);

#endif
