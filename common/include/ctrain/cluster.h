/* The cluster spec: which process this is among how many, from one place. Sources, in order:
 * flags (--rank, --world-size, --local-rank), Open MPI (OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK),
 * PMIx (PMIX_RANK, with the size from Open MPI or Slurm), Slurm (SLURM_PROCID, SLURM_NTASKS,
 * SLURM_LOCALID); none of them: a single process. Sources that are present must agree; a
 * variable that is not a number, a rank outside [0, size) or sources that disagree are errors
 * that name the variables. The mirrored and parameter-server strategies share this module. */
#ifndef CTRAIN_CLUSTER_H
#define CTRAIN_CLUSTER_H

#include "ctrain/api.h"

#include "ctrain/status.h"

typedef struct ct_cluster_spec {
    int rank, world_size, local_rank;
    char source[96]; /* where rank and size came from, e.g. "OMPI_COMM_WORLD_RANK/SIZE" */
} ct_cluster_spec;

/* Flags not given are -1. getenv_fn: NULL for the process environment (tests pass their own). */
typedef const char *(*ct_getenv_fn)(const char *name, void *user);
CT_API ct_status ct_cluster_spec_read(int flag_rank, int flag_world_size, int flag_local_rank,
                                      ct_getenv_fn getenv_fn, void *user, ct_cluster_spec *ret,
                                      ct_err *err);

/* ---- the task view of a cluster (parameter-server strategy) ----
 * Which task this process is (chief, worker 2, ps 0, ...) and the addresses of every task, in
 * TensorFlow's TF_CONFIG layout:
 *   {"cluster": {"chief": ["host:port"], "worker": ["host:port", ...], "ps": [...],
 *                "evaluator": [...], "dispatcher": ["host:port"], "data_worker": [...]},
 *    "task": {"type": "worker", "index": 0}}
 * Sources, in order: flags (--task TYPE:INDEX, --chief ADDRESS), a cluster file (--cluster
 * FILE: YAML or JSON, the same layout, "task" optional), and the TF_CONFIG environment variable
 * (JSON). Sources that are present must agree (the same task; the same chief address; the same
 * number of tasks of a type); disagreement is an error naming both sources. A task list given
 * by one source is used whole (lists are not merged). */

typedef enum ct_task_type {
    CT_TASK_CHIEF,
    CT_TASK_WORKER,
    CT_TASK_PS,
    CT_TASK_EVALUATOR,
    CT_TASK_DISPATCHER,  /* the data service's dispatcher (at most one) */
    CT_TASK_DATA_WORKER, /* a data worker */
    CT_TASK_TYPES
} ct_task_type;

#define CT_CLUSTER_MAX_TASKS 1024 /* per type */
#define CT_CLUSTER_ADDR_MAX 256

typedef struct ct_cluster {
    int n[CT_TASK_TYPES]; /* tasks of each type listed (0: the list is unknown) */
    char (*addr[CT_TASK_TYPES])[CT_CLUSTER_ADDR_MAX]; /* addr[type][i]: "host:port" (owned) */
    int task_type;    /* this process: a ct_task_type, or -1 when no source says */
    int task_index;   /* -1 when no source says */
    char source[160]; /* where the task and the lists came from, for messages */
} ct_cluster;

/* Command-line inputs; NULL / -1 where not given. */
typedef struct ct_cluster_flags {
    const char *task;         /* --task "worker:1" (also "ps:0", "chief", "chief:0", "evaluator") */
    const char *chief;        /* --chief "host:port": the chief's address */
    const char *cluster_file; /* --cluster FILE */
} ct_cluster_flags;

/* "chief", "worker", "ps", "evaluator", "dispatcher", "data_worker"; NULL for other values. */
CT_API const char *ct_task_type_name(int type);
/* Returns the ct_task_type of one of the names above; -1 for other names
 * (including TF1's "master") and NULL. */
CT_API int ct_task_type_parse(const char *name);

/* Reads the cluster from flags, the cluster file and TF_CONFIG (getenv_fn as above). Checks:
 * every address is "host:port" with a port in [0, 65535] (0: any free port, for servers that
 * report the one they got); the chief list has at most one entry; the task's index is inside
 * its list when the list is known; no address appears twice; JSON/YAML errors name the source,
 * the line and the key (TF_CONFIG: "TF_CONFIG: cluster.worker[1]: ..."). A process with no
 * source at all gets task_type = -1 and empty lists (CT_OK). Addresses are stored without a
 * "tcp://" prefix; "[v6addr]:port" is accepted. For the task and for each type's list the first
 * source in the order above that gives it is used. Top-level keys other than cluster, task,
 * environment and rpc_layer, task types other than the six ("master": rename it to "chief")
 * and task keys other than type, index and trial are errors. flags: borrowed, NULL for none.
 * Returns CT_OK and an owned cluster in *ret (free with ct_cluster_finish); CT_EINVAL (a bad
 * or disagreeing source), CT_EIO (the cluster file cannot be read) or CT_ENOMEM, with *ret not
 * written and nothing allocated. Thread-safe when getenv_fn is. */
CT_API ct_status ct_cluster_init(const ct_cluster_flags *flags, ct_getenv_fn getenv_fn, void *user,
                                 ct_cluster *ret, ct_err *err);

/* Tasks from a launcher's ranks (srun, mpirun) when no source above named this process's task:
 * with a rank and a size from Open MPI, PMIx or Slurm (ct_cluster_spec_read), rank 0 is the
 * chief, ranks 1..n_ps (at least 1) the parameter servers and the others the workers. The
 * chief's address is HOST:PORT, HOST being CTRAIN_CHIEF_HOST, else the first host of
 * SLURM_JOB_NODELIST ("node[01-04],gpu5" -> node01; with srun's block distribution rank 0 runs
 * there), else localhost, and PORT CTRAIN_CHIEF_PORT (7450); servers listen on any port ("*:0")
 * and report it. Leaves c alone (CT_OK) when a source named the task or there is no launcher;
 * CT_EINVAL when the ranks leave no worker or a variable is malformed. */
CT_API ct_status ct_cluster_from_launcher(ct_cluster *c, int n_ps, ct_getenv_fn getenv_fn,
                                          void *user, ct_err *err);

/* Frees the address lists and empties them (n = 0); accepts NULL, a zeroed cluster and one
 * already finished. */
CT_API void ct_cluster_finish(ct_cluster *c);

#endif
