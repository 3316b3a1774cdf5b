/* ctrain-data-worker: a data worker of the data service (docs/data-service.md): runs the job's
 * input pipeline for the consumers the dispatcher leases to it (data_worker.c). A thin main:
 * flags, the job, the dispatcher's address, the keys, the exit code. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/role/role_run.h"
#include "ctrain/cluster.h"
#include "ctrain/data_service.h"
#include "ctrain/job.h"
#include "data_worker.h"

#define MAX_SETS 64

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: ctrain-data-worker --job JOB.yaml [--dispatcher HOST:PORT] [--index N]\n"
        "\n"
        "A data worker of the data service (data.service in the job): it registers with the\n"
        "dispatcher, runs the job's input pipeline (data.train, data.eval) for the batches the\n"
        "dispatcher leases to it and sends them to the trainers that consume them.\n"
        "\n"
        "options:\n"
        "  --job FILE             the job file (required; the same as the trainers')\n"
        "  --set KEY=VALUE        override a job field (repeatable; the same as the trainers')\n"
        "  --dispatcher HOST:PORT the dispatcher (default: data.service.dispatcher,\n"
        "                         $CTRAIN_DISPATCHER or the cluster spec's dispatcher task)\n"
        "  --index N              this data worker's index (default: --task, the cluster\n"
        "                         spec, else the rank under srun or mpirun, else 0)\n"
        "  --task data_worker:N   the same, in the cluster spec's form\n"
        "  --cluster FILE         a cluster file in TF_CONFIG's layout (YAML or JSON)\n"
        "  --bind HOST:PORT       where consumers connect (default: loopback for a dispatcher on\n"
        "                         loopback, else every interface; any free port)\n"
        "  --interface NAME       listen on and advertise NAME's address (= CTRAIN_INTERFACE)\n"
        "  --advertise HOST       the address consumers dial (= CTRAIN_ADVERTISE; default: the\n"
        "                         address of the route to the dispatcher)\n"
        "  --keys DIR             CURVE keys from 'ctrain keygen DIR' (= strategy.keys)\n"
        "  -h, --help             show this help\n"
        "\n"
        "exit codes: 0 the job is done, 1 runtime failure, 2 bad input (or the dispatcher\n"
        "refused us), 3 the dispatcher silent for data.service.timeout, 130 SIGINT, 143 SIGTERM\n");
}

typedef struct flags {
    const char *job, *dispatcher, *bind, *keys, *cluster, *task, *interface, *advertise;
    const char *sets[MAX_SETS];
    int n_sets, index, help;
} flags;

static int parse_index(const char *s, int *ret) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < 0 || v > 1000000) {
        return -1;
    }
    *ret = (int)v;
    return 0;
}

static int parse(int argc, char **argv, flags *f) {
    memset(f, 0, sizeof *f);
    f->index = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            f->help = 1;
            return 0;
        }
        const char **slot = !strcmp(a, "--job")          ? &f->job
                            : !strcmp(a, "--dispatcher") ? &f->dispatcher
                            : !strcmp(a, "--bind")       ? &f->bind
                            : !strcmp(a, "--keys")       ? &f->keys
                            : !strcmp(a, "--cluster")    ? &f->cluster
                            : !strcmp(a, "--task")       ? &f->task
                            : !strcmp(a, "--interface")  ? &f->interface
                            : !strcmp(a, "--advertise")  ? &f->advertise
                                                         : NULL;
        int is_set = !strcmp(a, "--set"), is_index = !strcmp(a, "--index");
        if ((!slot && !is_set && !is_index) || v == NULL) {
            fprintf(stderr, "ctrain-data-worker: unknown or incomplete option '%s' (see --help)\n",
                    a);
            return -1;
        }
        i++;
        if (slot) {
            *slot = v;
        } else if (is_set && f->n_sets < MAX_SETS) {
            f->sets[f->n_sets++] = v;
        } else if (is_index && parse_index(v, &f->index) != 0) {
            fprintf(stderr, "ctrain-data-worker: --index needs a non-negative integer, got '%s'\n",
                    v);
            return -1;
        }
    }
    if (!f->job) {
        fprintf(stderr, "ctrain-data-worker: --job is required (see --help)\n");
        return -1;
    }
    return 0;
}

/* The index from --index, else --task / the cluster spec (data_worker:N), else the launcher's
 * rank (srun, mpirun: every task of the step is a data worker), else 0. */
static ct_status resolve_index(flags *f, ct_err *err) {
    ct_cluster_flags cf = {.task = f->task, .chief = NULL, .cluster_file = f->cluster};
    ct_cluster c;
    ct_status st = ct_cluster_init(&cf, NULL, NULL, &c, err);
    if (st != CT_OK) {
        return st;
    }
    if (c.task_type >= 0 && c.task_type != CT_TASK_DATA_WORKER) {
        st = ct_err_set(err, CT_EINVAL, "%s names this process a %s task, not a data_worker",
                        c.source, ct_task_type_name(c.task_type));
    } else if (f->index < 0 && c.task_index >= 0) {
        f->index = c.task_index;
    } else if (f->index < 0) {
        ct_cluster_spec spec;
        st = ct_cluster_spec_read(-1, -1, -1, NULL, NULL, &spec, err);
        f->index = st == CT_OK ? spec.rank : 0;
    }
    ct_cluster_finish(&c);
    return st;
}

static void on_listening(const char *endpoint, void *user) {
    printf("ctrain-data-worker %d: listening on %s\n", *(const int *)user, endpoint);
    fflush(stdout);
}

static int serve(flags *f, ct_job *job) {
    ct_err err = {0};
    char dispatcher[512] = "";
    ct_cluster_flags cf = {.task = f->task, .chief = NULL, .cluster_file = f->cluster};
    ct_net_keys keys = {0};
    ct_status st = resolve_index(f, &err);
    if (st == CT_OK && f->dispatcher) {
        snprintf(dispatcher, sizeof dispatcher, "%s", f->dispatcher);
    } else if (st == CT_OK) {
        st = ct_data_service_address(job, &cf, dispatcher, sizeof dispatcher, &err);
    }
    if (st == CT_OK) {
        st = ct_net_keys_load(f->keys ? f->keys : job->ps.keys, &keys, &err);
    }
    if (st != CT_OK) {
        fprintf(stderr, "ctrain-data-worker: %s\n", err.msg);
        return 2;
    }
    ct_log_set(CT_LOG_WARN, ct_role_log_line, "ctrain-data-worker");
    ct_role_catch_signals();
    uint64_t batches = 0, examples = 0;
    ct_data_worker_options o = {.index = f->index,
                                .dispatcher = dispatcher,
                                .bind = f->bind,
                                .interface = f->interface,
                                .advertise = f->advertise,
                                .keys = &keys,
                                .stop = &ct_role_stop_requested,
                                .on_listening = on_listening,
                                .user = &f->index,
                                .ret_batches = &batches,
                                .ret_examples = &examples};
    st = ct_data_worker_run(job, &o, &err);
    if (st != CT_OK) {
        fprintf(stderr, "ctrain-data-worker: %s\n", err.msg);
    } else {
        printf("ctrain-data-worker %d: done: %llu batches, %llu examples produced\n", f->index,
               (unsigned long long)batches, (unsigned long long)examples);
    }
    ct_net_shutdown(); /* ZeroMQ's threads end before exit() runs the destructors */
    return ct_exit_code(st, ct_role_stop_signal, st == CT_ETIMEDOUT);
}

/* A data worker allocates a batch, hands it to ZeroMQ and frees it once sent, a few a
 * millisecond: glibc's defaults give large batches back to the kernel (munmap, a trimmed top),
 * and every next batch faults its pages in again, zeroed (a third of the worker's time by perf
 * at 1 MiB batches). Kept instead: up to the window's batches stay mapped (data.service.window
 * bounds them), as tcmalloc would keep them. */
static void keep_freed_batches(void) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

int main(int argc, char **argv) {
    keep_freed_batches();
    flags f;
    if (parse(argc, argv, &f) != 0) {
        return 2;
    }
    if (f.help) {
        usage(stdout);
        return 0;
    }
    ct_job *job = NULL;
    ct_err err = {0};
    if (ct_job_create(f.job, f.sets, f.n_sets, &job, NULL, &err) != CT_OK) {
        fprintf(stderr, "ctrain-data-worker: %s\n", err.msg);
        return 2;
    }
    int rc = serve(&f, job);
    ct_job_destroy(job);
    return rc;
}
