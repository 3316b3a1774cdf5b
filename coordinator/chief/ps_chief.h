/* The chief of a parameter-server job (internal; see ps_chief.c): its state, shared by
 * ps_chief.c (the loop, messages, roles), ps_chief_state.c (the servers' state: restores,
 * snapshots, checkpoints; async task dispatch) and ps_chief_log.c (metrics, logs, evaluation). */
#ifndef CTRAIN_PS_CHIEF_H
#define CTRAIN_PS_CHIEF_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include "chief.h"
#include "ctrain/report.h"
#include "io/run_log.h"
#include "net/link.h"
#include "strategy/ps_shared.h"

#define SETTLE_S 1.0 /* async: from the last report to the final snapshot */
#define MAX_OUT 2    /* async: tasks a worker holds (one computing, one ready): kept topped up */

typedef struct task {
    int64_t epoch, index;
} task;

typedef struct slot {
    int registered, live;
    unsigned char peer[CT_WIRE_ROUTING_ID_MAX];
    size_t peer_len;
    double last_heard, lost_at;
    char endpoint[CT_NET_ENDPOINT_MAX];
    char host[64];
    int pid;
    char complaint[320]; /* the last unreachable peer its heartbeats named ("" none) */
    /* ps */
    int restored;
    uint64_t version, applied, dropped_late, dropped_stale, duplicates, waits;
    uint64_t staleness[CT_PS_STALENESS_BUCKETS], staleness_logged[CT_PS_STALENESS_BUCKETS];
    /* worker */
    task out[MAX_OUT];
    int n_out;
    int64_t run_next, run_end; /* async: task ids reserved for it, handed out in order */
    int told_done;
} slot;

typedef struct epoch_sums {
    double loss, accuracy, examples;
    double input_wait; /* the workers' waits for their batches, summed (seconds) */
    int64_t steps;
    double first_report;
} epoch_sums;

typedef struct chief {
    const ct_job *job;
    const ct_ps_chief_options *o;
    uint64_t job_id;
    ct_trainer *t;
    ct_params *p;
    ct_ps_plan plan;
    ct_loader *eval; /* evaluation (the training input is counted, never read: n_train) */
    int64_t n_train, steps_per_epoch, total_steps;
    slot *ps, *workers;
    int n_ps, n_workers;
    void *router;
    char endpoint[CT_NET_ENDPOINT_MAX];
    int state;
    uint64_t generation;
    uint64_t max_seen; /* the largest generation a role has told us of */
    char message[512];
    ct__msg msg;
    char ckpt_dir[PATH_MAX];
    int64_t step; /* steps done, as far as the chief knows */
    /* async dispatch */
    int64_t cursor; /* the next task never handed out (epoch * spe + index) */
    int64_t *requeued;
    int n_requeued;
    unsigned char *finished; /* [total_steps] */
    int64_t first_open;      /* every task before it is finished */
    int64_t completed;
    int64_t *epoch_done; /* tasks finished per epoch */
    /* snapshots */
    uint64_t snap_id;
    int snap_active, snap_got;
    uint64_t snap_answered; /* bit s: server s answered (a resent request may answer twice) */
    double snap_sent;       /* when the request last went out */
    double restore_sent, restore_started;
    int64_t ckpt_due;          /* the next checkpoint step (checkpoint.every_steps) */
    int64_t snap_at;           /* the step it stands for */
    uint64_t snap_lo, snap_hi; /* the servers' versions in their answers */
    int64_t last_snap_step;
    int64_t next_point; /* async: the completed count of the next snapshot */
    double final_due;   /* async: when the final snapshot may be asked for */
    int stopping;
    int restoring; /* waiting for RESTORED */
    double paused_since;
    /* metrics */
    epoch_sums *epochs;
    double log_loss, log_acc, log_examples, log_wait, log_time;
    int64_t log_steps, log_step;
    ct__run_log *log; /* run_dir's TensorBoard runs and metrics.jsonl */
    double started, train_seconds;
    int64_t samples;
    ct_train_result result;
    int evaluated_epochs;
    int graph_logged; /* the step graph went to the train run (or need not) */
    ct_status fail_status;
} chief;

static inline int64_t task_id(const chief *c, task t) {
    return t.epoch * c->steps_per_epoch + t.index;
}

static inline task task_of(const chief *c, int64_t id) {
    return (task){id / c->steps_per_epoch, id % c->steps_per_epoch};
}

/* ---- ps_chief.c ---- */

/* A notice for a person ("worker 1 lost ..."), to o->report.notice (none when it is NULL); the
 * role prints it, as "chief: " and the line. */
#define ct__chief_say(c, ...) ct_report_notice(&(c)->o->report, __VA_ARGS__)
/* Fails the job: the state becomes FAILED (the roles learn it from their next view), the
 * message is kept for them; returns code with the message in err. */
ct_status ct__chief_fail(chief *c, ct_status code, ct_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Sends env (and n tensor frames) to the role in slot s, as the chief of this generation. */
void ct__chief_send(chief *c, const slot *s, ct__env *env, const void *const *data,
                    const size_t *bytes, int n);
/* A server's statistics (a heartbeat's or a snapshot's) into its slot. */
void ct__chief_take_stats(slot *s, const Ctrain__Wire__Stats *st);

/* ---- ps_chief_state.c ---- */

/* Loads the newest good checkpoint (or the initial state) into the chief's trainer and sends
 * every server its shards under a new generation; the job pauses until they answer. */
void ct__chief_restore(chief *c, ct_err *err);
/* The chief's trainer (the job's variables, evaluation, checkpoints): a synchronous job's global
 * batch is n_workers per-replica batches (train.global_batch_size split over them), so that a
 * checkpoint's position counts examples of the epoch's global order. */
ct_status ct__chief_trainer(chief *c, ct_trainer **ret, ct_err *err);
/* Asks every server for its state: sync at version at_step exactly, async as it is. */
void ct__chief_request_snapshot(chief *c, int64_t at_step);
/* Sends the current request again to the servers that have not answered it. */
void ct__chief_resend_snapshot(chief *c);
/* Sends server s the chief's state as this generation's RESTORE (again, for a late one). */
void ct__chief_send_restore(chief *c, int s);
/* The next step after `after` that sync training snapshots (checkpoint, epoch end, last). */
int64_t ct__chief_next_sync_point(const chief *c, int64_t after);
/* A SNAPSHOT message from server s; the last one completes the snapshot (save, evaluate). */
ct_status ct__chief_on_snapshot(chief *c, slot *s, ct_err *err);
/* async: asks for a snapshot when the finished tasks reach a checkpoint, an epoch's end or
 * the end (the last after a settling moment). */
void ct__chief_maybe_async_snapshot(chief *c);
/* async: the consecutive tasks a worker gets at a time (data.service.split_steps with the data
 * service; without it CT__CHIEF_RUN_STEPS, or fewer when the job has under 4 runs per worker). */
#define CT__CHIEF_RUN_STEPS 8
int64_t ct__chief_run_length(const chief *c);
/* async: tops every live worker up to MAX_OUT tasks handed out and not reported finished. */
void ct__chief_dispatch(chief *c);
/* async: puts the unfinished tasks of a lost (or re-registered) worker back for the others. */
void ct__chief_requeue(chief *c, slot *s);
/* async: task t reported finished by the worker in s. */
void ct__chief_finish_task(chief *c, slot *s, task t);

/* ---- ps_chief_log.c ---- */

/* Opens the run log: run_dir's TensorBoard runs (train/, validation/) and metrics.jsonl. */
ct_status ct__chief_open_logs(chief *c, ct_err *err);
/* When a run starts at step 0 (a resumed run's is in its first event file): the workers'
 * training-step graph into the train run. */
ct_status ct__chief_log_graph(chief *c, ct_err *err);
/* Every logs.every_steps steps: the reports' means, throughput, the servers' staleness. */
void ct__chief_log_interval(chief *c);
/* End of epoch e: evaluates the assembled variables, reports the epoch line (o->report), logs
 * it. */
ct_status ct__chief_end_epoch(chief *c, int64_t e, ct_err *err);

#endif
