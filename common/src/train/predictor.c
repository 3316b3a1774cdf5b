/* A checkpoint's model for inference only, safe to call from many threads (ctrain/train.h,
 * ct_predictor): `contexts` trainers loaded for inference from the same checkpoint file (no
 * optimizer state, no gradient graph: each builds prediction graphs only), handed to callers
 * one each under a mutex, so up to `contexts` predictions run at once and the others wait their
 * turn. The contexts read one copy of the weights, the first's (the others free theirs, and
 * their gradients, once loaded: ct_params_share); each has its own graphs and buffers. The
 * outputs do not depend on which context ran them (a prediction's bits depend on the batch
 * alone). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/train.h"
#include "trainer_internal.h"

#define MAX_CONTEXTS 64

struct ct_predictor {
    pthread_mutex_t mu;
    pthread_cond_t freed;
    int n;
    ct_job *jobs;    /* one per context: a trainer's job outlives it */
    ct_trainer **ts; /* the contexts */
    unsigned char *busy;
    int64_t outputs; /* floats per example out */
};

ct_status ct_predictor_load(const char *path, int contexts, ct_predictor **ret, ct_err *err) {
    *ret = NULL;
    if (contexts < 1 || contexts > MAX_CONTEXTS) {
        return ct_err_set(err, CT_EINVAL, "predictor: %d contexts: give 1 to %d", contexts,
                          MAX_CONTEXTS);
    }
    ct_predictor *p = calloc(1, sizeof *p);
    if (p) {
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->freed, NULL);
        p->jobs = calloc((size_t)contexts, sizeof *p->jobs);
        p->ts = calloc((size_t)contexts, sizeof *p->ts);
        p->busy = calloc((size_t)contexts, 1);
    }
    if (!p || !p->jobs || !p->ts || !p->busy) {
        ct_predictor_destroy(p);
        return ct_err_set(err, CT_ENOMEM, "predictor: out of memory");
    }
    ct_status st = ct_trainer_load_checkpoint(path, &p->jobs[0], &p->ts[0], err);
    p->n = st == CT_OK;
    /* the others from the file the first one read: a directory's newest may change meanwhile */
    char file[4096] = "";
    if (st == CT_OK) {
        snprintf(file, sizeof file, "%s", ct_trainer_last_checkpoint(p->ts[0]));
    }
    while (st == CT_OK && p->n < contexts) {
        st = ct_trainer_load_checkpoint(file, &p->jobs[p->n], &p->ts[p->n], err);
        p->n += st == CT_OK;
        if (st == CT_OK) { /* one copy of the weights: the first context's */
            st = ct__trainer_share_weights(p->ts[p->n - 1], p->ts[0], err);
        }
    }
    if (st != CT_OK) {
        ct_predictor_destroy(p);
        return st;
    }
    p->outputs = ct_model_output_size(ct_trainer_model(p->ts[0]));
    *ret = p;
    return CT_OK;
}

/* A free context, waited for; its index. */
static int take(ct_predictor *p) {
    pthread_mutex_lock(&p->mu);
    int k = -1;
    for (;;) {
        for (int i = 0; i < p->n && k < 0; i++) {
            k = p->busy[i] ? -1 : i;
        }
        if (k >= 0) {
            break;
        }
        pthread_cond_wait(&p->freed, &p->mu); /* a context ends its prediction: bounded */
    }
    p->busy[k] = 1;
    pthread_mutex_unlock(&p->mu);
    return k;
}

static void give_back(ct_predictor *p, int k) {
    pthread_mutex_lock(&p->mu);
    p->busy[k] = 0;
    pthread_cond_signal(&p->freed);
    pthread_mutex_unlock(&p->mu);
}

ct_status ct_predictor_run(ct_predictor *p, const float *x, int64_t batch, float *out,
                           ct_err *err) {
    if (batch < 1) {
        return ct_err_set(err, CT_EINVAL, "predictor: batch %lld: give at least 1 example",
                          (long long)batch);
    }
    int k = take(p);
    ct_status st = ct_trainer_predict(p->ts[k], x, batch, out, err);
    give_back(p, k);
    return st;
}

const ct_job *ct_predictor_job(const ct_predictor *p) {
    return &p->jobs[0];
}

int64_t ct_predictor_outputs(const ct_predictor *p) {
    return p->outputs;
}

void ct_predictor_destroy(ct_predictor *p) {
    if (!p) {
        return;
    }
    for (int i = p->ts ? p->n - 1 : -1; i >= 0; i--) { /* the first, which owns the weights, last */
        ct_trainer_destroy(p->ts[i]);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->freed);
    free(p->jobs);
    free(p->ts);
    free(p->busy);
    free(p);
}
