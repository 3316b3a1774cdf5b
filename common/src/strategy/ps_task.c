/* Which task of a parameter-server job this process is, and running it (see ps.h): the task from
 * the binary, --task, a cluster file, TF_CONFIG or a launcher's rank (which must agree), where the
 * chief is, the CURVE keys and their authenticator. Messages only through `err`; the role mains
 * print them and choose exit codes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/ps.h"

static const char *binary_of(int type) {
    return type == CT_TASK_PS      ? "ctrain-ps"
           : type == CT_TASK_CHIEF ? "ctrain-chief"
                                   : "ctrain-worker";
}

/* The task type and index once the sources are read; CT_EINVAL names the contradiction. */
static ct_status check_type(ct_ps_task *t, ct_err *err) {
    ct_cluster *cl = &t->cluster;
    if (cl->task_type >= 0 && cl->task_type != t->type) {
        return ct_err_set(err, CT_EINVAL,
                          "the cluster spec (%s) says this task is %s %d; start %s there, or fix "
                          "--task / TF_CONFIG",
                          cl->source, ct_task_type_name(cl->task_type), cl->task_index,
                          binary_of(cl->task_type));
    }
    if (t->type != CT_TASK_CHIEF && cl->task_index < 0) {
        return ct_err_set(err, CT_EINVAL,
                          "which %s is this? give --task %s:INDEX (or TF_CONFIG's "
                          "task)",
                          ct_task_type_name(t->type), ct_task_type_name(t->type));
    }
    return CT_OK;
}

ct_status ct_ps_task_init(const char *role, int type, int any_task, const ct_ps_task_flags *f,
                          ct_job *job, ct_ps_task *ret, ct_err *err) {
    memset(ret, 0, sizeof *ret);
    if (job->strategy != CT_STRATEGY_PARAMETER_SERVER) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: strategy.type is '%s'; %s serves parameter_server jobs (--set "
                          "strategy.type=parameter_server)",
                          job->path, ct_strategy_name(job->strategy), role);
    }
    if (f->keys) {
        snprintf(job->ps.keys, sizeof job->ps.keys, "%s", f->keys);
    }
    ct_cluster *cl = &ret->cluster;
    ct_status st = ct_cluster_init(&f->cluster, NULL, NULL, cl, err);
    if (st != CT_OK) {
        return st;
    }
    int launched = cl->task_type < 0; /* by srun or mpirun: the rank says which task */
    ret->type = type;
    if ((st = ct_cluster_from_launcher(cl, f->n_ps, NULL, NULL, err)) != CT_OK) {
        goto fail;
    }
    if (launched && cl->task_type >= 0 && any_task) {
        ret->type = cl->task_type; /* a binary that serves any task becomes the task of its rank */
    }
    if ((st = check_type(ret, err)) != CT_OK) {
        goto fail;
    }
    ret->index = cl->task_index >= 0 ? cl->task_index : 0;
    ret->chief = cl->n[CT_TASK_CHIEF] > 0 ? cl->addr[CT_TASK_CHIEF][0] : NULL;
    if (ret->type != CT_TASK_CHIEF && !ret->chief) {
        st = ct_err_set(err, CT_EINVAL,
                        "where is the chief? give --chief HOST:PORT (or a cluster "
                        "file or TF_CONFIG listing it)");
        goto fail;
    }
    ret->n_ps = f->n_ps > 0 ? f->n_ps : cl->n[CT_TASK_PS];
    ret->n_workers = f->n_workers > 0 ? f->n_workers : cl->n[CT_TASK_WORKER];
    ret->bind = f->bind;
    ret->interface = f->interface;
    ret->advertise = f->advertise;
    if (!ret->bind && ret->type == CT_TASK_PS && cl->n[CT_TASK_PS] > ret->index) {
        ret->bind = cl->addr[CT_TASK_PS][ret->index];
    } else if (!ret->bind && ret->type == CT_TASK_CHIEF) {
        ret->bind = ret->chief;
    }
    snprintf(ret->who, sizeof ret->who, ret->type == CT_TASK_CHIEF ? "%s" : "%s %d",
             ct_task_type_name(ret->type), ret->index);
    ret->keys = calloc(1, sizeof *ret->keys);
    if (!ret->keys) {
        st = ct_err_set(err, CT_ENOMEM, "strategy.keys: out of memory");
        goto fail;
    }
    if ((st = ct_net_keys_load(job->ps.keys, ret->keys, err)) != CT_OK) {
        ct_err_prefix(err, CT_EINVAL, "strategy.keys");
        st = CT_EINVAL;
        goto fail;
    }
    return CT_OK;
fail:
    ct_ps_task_finish(ret);
    return st;
}

void ct_ps_task_finish(ct_ps_task *t) {
    if (!t) {
        return;
    }
    ct_net_auth_destroy(t->auth);
    t->auth = NULL;
    free(t->keys);
    t->keys = NULL;
    ct_cluster_finish(&t->cluster);
}

ct_status ct_ps_task_listen(ct_ps_task *t, ct_err *err) {
    if (t->type == CT_TASK_WORKER) {
        return CT_OK; /* workers only connect: no authenticator */
    }
    ct_status st = ct_net_auth_create(t->keys, t->who, &t->auth, err);
    return st == CT_OK ? CT_OK : (st == CT_EINVAL ? CT_EIO : st);
}
