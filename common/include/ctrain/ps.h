/* The parameter-server strategy (central storage on CPU servers) over ZeroMQ.
 *
 * This header holds what every role shares (the partition plan, the job id, which task a process
 * is); each role's own entry point is in its folder: ps/ps_role.h (the server),
 * worker/worker_role.h (the worker), common/role/role_run.h (the chief).
 *
 * Roles: one chief (registration, the global step, task dispatch in async mode, metrics,
 * checkpoints, TensorBoard, failure detection and restarts), M parameter servers (each holds
 * its shards of the variables and their optimizer slots, and applies updates), N workers (pull
 * the parameters, compute gradients on their batches, push them). docs/parameter-server.md
 * describes the protocol, the modes and the failure handling.
 *
 * Modes (job keys strategy.*): `sync` (a version advances when N - backup_workers gradients for
 * it have arrived; later ones are dropped) and `async` with a staleness policy (none, drop,
 * scale, ssp; bound strategy.staleness.max). */
#ifndef CTRAIN_PS_H
#define CTRAIN_PS_H

#include "ctrain/api.h"

#include <stdint.h>
#include <stdio.h>

#include "ctrain/cluster.h"
#include "ctrain/job.h"
#include "ctrain/net.h"
#include "ctrain/nn.h"
#include "ctrain/status.h"
#include "ctrain/train.h"

/* ---- the partition plan: which server holds which part of which variable ----
 * Variables (trainable ones and state, such as batch norm's moving statistics, which the workers
 * assign: ps_server.c) are cut into shards: a variable larger than the shard limit (by default
 * the fair share, total / M) is split into equal contiguous pieces of at most the limit; shards
 * go to servers largest first, each to the least loaded server (ties: the lowest index). The
 * plan is a function of the model and M only, so every role computes the same one. */
typedef struct ct_ps_shard {
    int param;             /* index into ct_params */
    int64_t offset;        /* in floats, into the flat parameter (and gradient, slot) buffers */
    int64_t size;          /* floats */
    int server;            /* owner */
    int local;             /* position among the owner's shards */
    int64_t server_offset; /* in floats, into the owner's flat buffer (64-byte aligned) */
    int state;             /* 1: a non-trainable variable, which workers assign (no optimizer) */
} ct_ps_shard;

typedef struct ct_ps_plan {
    int n_servers;
    int n_shards;
    ct_ps_shard *shards; /* ordered by server, then local position */
    int *first;          /* [n_servers + 1]: server s holds shards first[s] .. first[s+1]-1 */
    int64_t *floats;     /* [n_servers]: the floats each server holds (its buffer, padded) */
    int64_t *load;       /* [n_servers]: the floats of variables each server holds */
    int64_t total;       /* floats of the variables */
} ct_ps_plan;

/* Makes the plan for the parameters of p over n_servers servers; max_shard_bytes 0
 * means the fair share. CT_EINVAL when n_servers < 1. Free with ct_ps_plan_finish. */
CT_API ct_status ct_ps_plan_init(const ct_params *p, int n_servers, int64_t max_shard_bytes,
                                 ct_ps_plan *ret, ct_err *err);
CT_API void ct_ps_plan_finish(ct_ps_plan *plan);
/* One line describing the balance: "2 servers, 5 shards: ps 0 50.2 KB (50.1%), ps 1 ...;
 * imbalance 1.01 (largest / mean)". */
CT_API void ct_ps_plan_describe(const ct_ps_plan *plan, char *buf, size_t cap);

/* ---- which task this process is ---- */

/* The command-line inputs of a parameter-server role; NULL / -1 where not given. */
typedef struct ct_ps_task_flags {
    ct_cluster_flags cluster;          /* --task, --chief, --cluster */
    const char *bind;                  /* --bind HOST:PORT */
    const char *interface, *advertise; /* --interface, --advertise (net.h, "Addresses") */
    const char *keys;                  /* --keys DIR (= strategy.keys) */
    int n_ps, n_workers;               /* --num-ps, --num-workers */
    double slow_factor;                /* --slow-factor (benchmarks; 1: off) */
} ct_ps_task_flags;

/* This process's task in a parameter-server job, resolved from every source. */
typedef struct ct_ps_task {
    int type;          /* CT_TASK_CHIEF, CT_TASK_PS or CT_TASK_WORKER */
    int index;         /* within its type (0 for the chief) */
    const char *chief; /* the chief's address (a view into cluster); NULL on the chief */
    const char *bind;  /* where a chief or server listens (NULL: the rule of net.h) */
    const char *interface, *advertise; /* --interface, --advertise (net.h, "Addresses") */
    int n_ps, n_workers;               /* from the flags, else the cluster's lists (0: unknown) */
    char who[32];                      /* "ps 1", "worker 0", "chief": for messages */
    ct_net_keys *keys;  /* the CURVE keys (owned; disabled when strategy.keys is "") */
    ct_net_auth *auth;  /* the authenticator of a chief or server (ct_ps_task_listen) */
    ct_cluster cluster; /* owned */
} ct_ps_task;

/* Resolves which task this process is: `type` is the binary's own task type; with any_task a
 * launcher's rank (srun, mpirun) may make it another type (ctrain-worker serves every task).
 * Checks that the job's strategy is parameter_server, that every source agrees with `type`, that
 * a server or worker has an index and knows the chief, and loads the keys (f->keys overrides
 * job->ps.keys). `role` names the binary in messages. CT_EINVAL with a one-line message that
 * says how to fix it; *ret is owned on success (ct_ps_task_finish). */
CT_API ct_status ct_ps_task_init(const char *role, int type, int any_task,
                                 const ct_ps_task_flags *f, ct_job *job, ct_ps_task *ret,
                                 ct_err *err);
/* Starts the CURVE authenticator of a chief or server (nothing for a worker). */
CT_API ct_status ct_ps_task_listen(ct_ps_task *t, ct_err *err);
/* Stops the authenticator and frees the keys and the cluster; accepts a zeroed task. */
CT_API void ct_ps_task_finish(ct_ps_task *t);

#endif
