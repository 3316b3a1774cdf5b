/* The servable (serve.h): TF Serving's base path layout, BASE/<version>/ with the version a
 * positive integer, each a directory of ctrain checkpoints (its newest good one is loaded). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

int64_t serve_newest_version(const char *base) {
    DIR *d = opendir(base);
    int64_t best = -1;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(e->d_name, &end, 10);
        int canonical = e->d_name[0] >= '0' && e->d_name[0] <= '9' && !*end && errno != ERANGE &&
                        (e->d_name[0] != '0' || !e->d_name[1]); /* "7", not "007" */
        if (canonical && v > best) {
            best = v;
        }
    }
    if (d) {
        closedir(d);
    }
    return best;
}

ct_status serve_model_load(serve_model *m, const char *base, const char *name, int64_t version,
                           const serve_batching *b, ct_err *err) {
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(m->base, sizeof m->base, "%s", base);
    m->version = version;
    m->batching = *b;
    char dir[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/%lld", base, (long long)version);
    ct_status st = ct_trainer_load_checkpoint(dir, &m->job, &m->t, err);
    if (st != CT_OK) {
        return st;
    }
    m->in = ct_shape_make(m->job.model.input_rank, m->job.model.input_shape);
    m->out = ct_model_output_shape(ct_trainer_model(m->t));
    m->in_values = ct_shape_numel(&m->in);
    m->out_values = ct_shape_numel(&m->out);
    m->ids = ct_model_input_dtype(ct_trainer_model(m->t)) == CT_I32;
    m->classes = m->job.model.loss == CT_LOSS_SPARSE_SOFTMAX_XENT && m->out.rank == 1;
    if ((st = serve_batcher_start(m, err)) != CT_OK) {
        ct_trainer_destroy(m->t);
        m->t = NULL;
    }
    return st;
}

void serve_model_free(serve_model *m) {
    if (m->t) {
        serve_batcher_stop(m);
        ct_trainer_destroy(m->t);
    }
    m->t = NULL;
}
