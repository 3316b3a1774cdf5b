/* The mains of the parameter-server roles (see ps_role.h): which task this process is (from the
 * binary, --task, a cluster file or TF_CONFIG, which must agree), where the chief is, the CURVE
 * keys and their authenticator, signals, log lines on stderr, the done line, exit codes. */
#include "ps_role.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/net.h"
#include "ctrain/ps.h"

#define EXIT_RUNTIME 1
#define EXIT_BAD_INPUT 2

static volatile int stop_requested = 0;
static volatile int stop_signal = 0;

static void on_signal(int sig) {
    stop_signal = sig;
    stop_requested = 1;
}

static void log_line(ct_log_level level, const char *msg, void *user) {
    (void)level;
    fprintf(stderr, "%s: %s\n", (const char *)user, msg);
}

static int exit_code(ct_status st) {
    if (st == CT_OK) {
        return 0;
    }
    if (st == CT_EINTR) {
        return stop_signal == SIGTERM ? 143 : 130;
    }
    return st == CT_EINVAL ? EXIT_BAD_INPUT : EXIT_RUNTIME;
}

int ct_ps_role_main(const char *role, ct_job *job, const char *job_text,
                    const ct_ps_role_flags *f) {
    int type = !strcmp(role, "ctrain-ps")      ? CT_TASK_PS
               : !strcmp(role, "ctrain-chief") ? CT_TASK_CHIEF
                                               : CT_TASK_WORKER;
    if (strcmp(job->strategy, "parameter_server") != 0) {
        fprintf(stderr,
                "%s: %s: strategy.type is '%s'; %s serves parameter_server jobs (--set "
                "strategy.type=parameter_server)\n",
                role, job->path, job->strategy, role);
        return EXIT_BAD_INPUT;
    }
    if (f->keys) {
        snprintf(job->ps.keys, sizeof job->ps.keys, "%s", f->keys);
    }
    ct_err err = {0};
    ct_cluster cl;
    if (ct_cluster_read(&f->cluster, NULL, NULL, &cl, &err) != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
        return EXIT_BAD_INPUT;
    }
    int launched = cl.task_type < 0; /* by srun or mpirun: the rank says which task */
    if (ct_cluster_from_launcher(&cl, f->n_ps, NULL, NULL, &err) != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
        ct_cluster_finish(&cl);
        return EXIT_BAD_INPUT;
    }
    if (launched && cl.task_type >= 0) {
        type = cl.task_type; /* any role binary becomes the task of its rank */
    }
    int rc = 0;
    int index = cl.task_index >= 0 ? cl.task_index : 0;
    if (cl.task_type >= 0 && cl.task_type != type) {
        fprintf(stderr,
                "%s: the cluster spec (%s) says this task is %s %d; start %s there, or "
                "fix --task / TF_CONFIG\n",
                role, cl.source, ct_task_type_name(cl.task_type), cl.task_index,
                cl.task_type == CT_TASK_PS      ? "ctrain-ps"
                : cl.task_type == CT_TASK_CHIEF ? "ctrain-chief"
                                                : "ctrain-worker");
        rc = EXIT_BAD_INPUT;
    } else if (type != CT_TASK_CHIEF && cl.task_index < 0) {
        fprintf(stderr, "%s: which %s is this? give --task %s:INDEX (or TF_CONFIG's task)\n", role,
                ct_task_type_name(type), ct_task_type_name(type));
        rc = EXIT_BAD_INPUT;
    }
    const char *chief = cl.n[CT_TASK_CHIEF] > 0 ? cl.addr[CT_TASK_CHIEF][0] : NULL;
    if (!rc && type != CT_TASK_CHIEF && !chief) {
        fprintf(stderr,
                "%s: where is the chief? give --chief HOST:PORT (or a cluster file or "
                "TF_CONFIG listing it)\n",
                role);
        rc = EXIT_BAD_INPUT;
    }
    ct_net_keys *keys = calloc(1, sizeof *keys);
    if (!rc && (!keys || ct_net_keys_load(job->ps.keys, keys, &err) != CT_OK)) {
        fprintf(stderr, "%s: strategy.keys: %s\n", role, keys ? err.msg : "out of memory");
        rc = EXIT_BAD_INPUT;
    }
    char who[32];
    snprintf(who, sizeof who, type == CT_TASK_CHIEF ? "%s" : "%s %d", ct_task_type_name(type),
             index);
    ct_log_set(CT_LOG_WARN, log_line, (void *)role); /* messages name the task themselves */
    ct_net_auth *auth = NULL;
    if (!rc && type != CT_TASK_WORKER && ct_net_auth_start(keys, who, &auth, &err) != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
        rc = EXIT_RUNTIME;
    }
    if (rc) {
        free(keys);
        ct_cluster_finish(&cl);
        return rc;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    ct_status st;
    if (type == CT_TASK_PS) {
        const char *bind = f->bind                    ? f->bind
                           : cl.n[CT_TASK_PS] > index ? cl.addr[CT_TASK_PS][index]
                                                      : NULL;
        ct_ps_server_options o = {.index = index,
                                  .n_servers = cl.n[CT_TASK_PS] > 0 ? cl.n[CT_TASK_PS] : 0,
                                  .bind = bind,
                                  .chief = chief,
                                  .keys = keys,
                                  .stop = &stop_requested};
        if (f->n_ps > 0) {
            o.n_servers = f->n_ps;
        }
        st = ct_ps_server_run(job, &o, &err);
    } else if (type == CT_TASK_WORKER) {
        ct_ps_worker_options o = {.index = index,
                                  .chief = chief,
                                  .keys = keys,
                                  .stop = &stop_requested,
                                  .slow_factor = f->slow_factor};
        st = ct_ps_worker_run(job, &o, &err);
    } else {
        int n_ps = f->n_ps > 0 ? f->n_ps : cl.n[CT_TASK_PS];
        int n_workers = f->n_workers > 0 ? f->n_workers : cl.n[CT_TASK_WORKER];
        ct_ps_chief_options o = {.n_servers = n_ps,
                                 .n_workers = n_workers,
                                 .bind = f->bind ? f->bind : chief,
                                 .keys = keys,
                                 .job_text = job_text,
                                 .no_resume = f->no_resume,
                                 .quiet = f->quiet,
                                 .out = stdout,
                                 .stop = &stop_requested};
        ct_train_result r;
        st = ct_ps_chief_run(job, &o, &r, &err);
        if (st == CT_OK) {
            printf("done: epochs=%d steps=%lld test_loss=%.6f test_accuracy=%.6f seconds=%.3f "
                   "samples_per_s=%.1f ps=%d workers=%d\n",
                   r.epochs, (long long)r.steps, r.test_loss, r.test_accuracy, r.seconds,
                   r.samples_per_s, n_ps, n_workers);
        }
    }
    if (st != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
    }
    ct_net_auth_stop(auth);
    ct_net_shutdown(); /* ZeroMQ's threads end before exit() runs the destructors */
    free(keys);
    ct_cluster_finish(&cl);
    return exit_code(st);
}
