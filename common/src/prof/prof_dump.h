/* The profiler's recorded events as one role hands them to its writers: the Chrome trace-event
 * JSON (merged by the chief into <run_dir>/trace.json.gz), the XSpace protocol buffer that
 * TensorBoard's Profile tab reads (<run_dir>/plugins/profile/<run>/<host>.xplane.pb) and the
 * terminal report of `ctrain profile`. The recorder (prof.c) fills it from its per-thread
 * buffers; the writers only read it. Internal: not part of the public API. */
#ifndef CT_PROF_DUMP_H
#define CT_PROF_DUMP_H

#include <stdint.h>

/* What an event is; the writers group and colour by it, the report sums by it. */
typedef enum ct__prof_kind {
    CT__PROF_STEP,        /* one training step; step = its number */
    CT__PROF_OP,          /* one graph node run (or one split part of it): name = op type,
                             detail = node name and shape, value[0] = part (-1: whole node) */
    CT__PROF_OPTIMIZER,   /* the optimizer update */
    CT__PROF_INPUT_WAIT,  /* the trainer waiting for its next batch */
    CT__PROF_INPUT_STAGE, /* one element through an input-pipeline stage: name = stage */
    CT__PROF_ALLREDUCE,   /* one gradient bucket: bytes, value[0] = ns hidden behind backward */
    CT__PROF_PS_PUSH,     /* bytes, value[0] = server index, value[1] = version */
    CT__PROF_PS_PULL,     /* bytes, value[0] = server index, value[1] = staleness */
    CT__PROF_REGISTER,    /* registration with the chief (or dispatcher) */
    CT__PROF_HEARTBEAT,
    CT__PROF_CHECKPOINT, /* a checkpoint save; bytes when known */
    CT__PROF_OTHER,
    CT__PROF_EVALUATION, /* the evaluator's (or a chief's) evaluation of one checkpoint: step =
                            the checkpoint's step, detail = the checkpoint's file name */
    CT__PROF_DS_BATCH,   /* a data worker producing and sending one batch: step = the training
                            step that consumes it, bytes, value[0] = the consumer's shard,
                            value[1] = the lease; detail = the consumer */
    CT__PROF_DS_LEASE,   /* the dispatcher leasing a split: step = its first training step,
                            value[0] = the data worker, value[1] = its steps; detail = consumer */
    CT__PROF_DS_ACK,     /* the dispatcher taking a consumer's ack: step = the training step it
                            acknowledges (every batch before it used); detail = the consumer */
    CT__PROF_REPORT,     /* a parameter-server chief taking a worker's step report: step,
                            value[0] = the worker, value[1] = the version it trained on */
    CT__PROF_KIND_COUNT
} ct__prof_kind;

typedef struct ct__prof_event {
    int64_t start_ns; /* on the chief's clock: the role's CLOCK_REALTIME plus its measured offset */
    int64_t dur_ns;
    int64_t step;       /* the training step it belongs to, -1 when none */
    int64_t bytes;      /* -1 when none */
    int64_t value[2];   /* by kind, see above; -1 when unused */
    const char *name;   /* interned: valid as long as the dump */
    const char *detail; /* may be NULL */
    int32_t thread;     /* index into the dump's threads */
    uint16_t kind;      /* ct__prof_kind */
} ct__prof_event;

typedef struct ct__prof_thread {
    int64_t tid;   /* the OS thread id */
    char name[32]; /* "main", "exec-1", "prefetch", ... */
} ct__prof_thread;

typedef struct ct__prof_dump {
    char role[32]; /* "chief", "worker", "ps", "evaluator", "dispatcher", "data_worker" */
    int task;      /* the role's task index (rank for mirrored workers) */
    char host[64];
    int64_t pid;
    int64_t clock_offset_ns; /* added to this role's clock to get the chief's; 0 on the chief */
    int64_t clock_error_ns;  /* half the round trip of the best offset sample; 0 on the chief */
    const ct__prof_thread *threads;
    int n_threads;
    const ct__prof_event *events; /* sorted by (thread, start_ns) */
    int64_t n_events;
    int64_t dropped; /* events lost to full per-thread buffers */
} ct__prof_dump;

#endif
