/* The profiler's analysis (internal; `ctrain profile` prints it): per recorded step of each role,
 * where its time went; the ops by total time (TensorFlow Stats); the input-bound verdict and the
 * stage that limits the input; for jobs of several roles, the slowest one per step.
 *
 * The breakdown counts each nanosecond of a step once, in the first of these that is active in
 * the role at that instant (on any of its threads): input wait, optimizer, compute (graph ops),
 * communication (all-reduce buckets, parameter-server pushes and pulls); what is left is idle
 * (bookkeeping, logs, checkpoints). So communication is the exposed part only: the share hidden
 * behind compute counts as compute. */
#ifndef CTRAIN_PROF_PROF_REPORT_H
#define CTRAIN_PROF_PROF_REPORT_H

#include "ctrain/status.h"
#include "prof/prof_dump.h"

/* The verdict's thresholds: the input wait's share of the recorded steps' time. */
#define CT__PROF_INPUT_BOUND 0.20  /* at or above: input-bound */
#define CT__PROF_INPUT_PARTLY 0.05 /* at or above (and below the first): partly input-bound */

enum {
    CT__PROF_PART_INPUT,
    CT__PROF_PART_OPTIMIZER,
    CT__PROF_PART_COMPUTE,
    CT__PROF_PART_COMM,
    CT__PROF_PART_IDLE,
    CT__PROF_PARTS
};

typedef struct ct__prof_step_row {
    int dump; /* index of the role's dump */
    int64_t step;
    int64_t total_ns;
    int64_t part_ns[CT__PROF_PARTS]; /* by CT__PROF_PART_*; they add up to total_ns */
} ct__prof_step_row;

typedef struct ct__prof_op_row {
    const char *name; /* the op type (borrowed from the dumps) */
    int64_t count, total_ns;
    double share; /* of every op's total */
} ct__prof_op_row;

typedef struct ct__prof_stage_row {
    const char *name;
    int64_t count, self_ns; /* elements through it, and its own time (children excluded) */
    int threads;            /* distinct threads that ran it */
} ct__prof_stage_row;

/* A parameter server's time in one step (the events of that step's version): handling the
 * workers' pushes (the apply inside them included) and serving their pulls. */
typedef struct ct__prof_server_row {
    int dump;
    int64_t step;
    int64_t serve_ns, apply_ns;
} ct__prof_server_row;

/* One role's events of one kind that are neither steps, ops, input stages nor communication:
 * evaluations, data-service batches, leases and acks, a chief's step reports, checkpoints,
 * registrations and heartbeats (what the roles without steps of their own did in the window). */
typedef struct ct__prof_activity_row {
    int dump;
    int kind;
    int64_t count, total_ns, max_ns;
    int64_t bytes; /* summed over the events that carry bytes (0: none) */
} ct__prof_activity_row;

typedef struct ct__prof_report {
    ct__prof_step_row *steps; /* by dump, then step */
    int n_steps;
    ct__prof_op_row *ops; /* by total time, largest first */
    int n_ops;
    ct__prof_stage_row *stages; /* by self time per thread, largest first */
    int n_stages;
    ct__prof_stage_row *remote_stages; /* the data workers' alone (the data service), likewise */
    int n_remote_stages;
    ct__prof_server_row *servers; /* by dump, then step: the parameter servers' ("ps") */
    int n_servers;
    ct__prof_activity_row *activities; /* by dump, then kind */
    int n_activities;
    int64_t step_ns, input_ns; /* over every step row */
    double input_share;        /* input_ns / step_ns (0 without steps) */
    int verdict;               /* 2: input-bound, 1: partly, 0: not (CT__PROF_INPUT_*) */
    int64_t dropped;           /* events lost to full buffers, over every dump */
} ct__prof_report;

/* Analyses the dumps (borrowed; the report borrows their strings). Returns CT_ENOMEM. */
ct_status ct__prof_analyse(const ct__prof_dump *const *dumps, int n_dumps, ct__prof_report *ret,
                           ct_err *err);
/* Frees what ct__prof_analyse allocated; accepts a zeroed report. */
void ct__prof_report_finish(ct__prof_report *r);

#endif
