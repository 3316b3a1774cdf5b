/* A consumer of a job's input for the data-service tests: reads epochs of data.train through
 * ct_pipeline_loader (from the data service when the job has data.service, else in process) and
 * writes one line per batch, "EPOCH STEP SIZE x0 x1 ...": the first feature of every example
 * (the id of an id-carrying dataset) with %.9g, so that two runs compare bit for bit.
 *   ds_consume JOB --out FILE [--shard C --shards N] [--epochs E] [--start-epoch E]
 *              [--start-step S] [--sleep-ms MS] [--set KEY=VALUE ...]
 * Exit codes: 0, 1 runtime failure (printed), 2 bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrain/ctrain.h"
#include "ctrain/pipeline.h"

#define MAX_SETS 32

typedef struct opts {
    const char *job, *out;
    const char *sets[MAX_SETS];
    int n_sets;
    long shard, shards, epochs, start_epoch, start_step, sleep_ms;
} opts;

static int parse(int argc, char **argv, opts *o) {
    *o = (opts){.shards = 1, .epochs = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long *num = !strcmp(a, "--shard")         ? &o->shard
                    : !strcmp(a, "--shards")      ? &o->shards
                    : !strcmp(a, "--epochs")      ? &o->epochs
                    : !strcmp(a, "--start-epoch") ? &o->start_epoch
                    : !strcmp(a, "--start-step")  ? &o->start_step
                    : !strcmp(a, "--sleep-ms")    ? &o->sleep_ms
                                                  : NULL;
        if ((num || !strcmp(a, "--out") || !strcmp(a, "--set")) && i + 1 >= argc) {
            fprintf(stderr, "ds_consume: %s needs a value\n", a);
            return 2;
        }
        if (num) {
            *num = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--out")) {
            o->out = argv[++i];
        } else if (!strcmp(a, "--set") && o->n_sets < MAX_SETS) {
            o->sets[o->n_sets++] = argv[++i];
        } else if (!o->job && a[0] != '-') {
            o->job = a;
        } else {
            fprintf(stderr, "ds_consume: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    return o->job && o->out ? 0 : 2;
}

static void log_line(ct_log_level level, const char *msg, void *user) {
    (void)level;
    (void)user;
    fprintf(stderr, "ds_consume: %s\n", msg);
}

/* Writes the batches of epochs [start_epoch, epochs) into f, flushing after each. */
static ct_status consume(const opts *o, ct_loader *l, FILE *f, ct_err *err) {
    int64_t steps = ct_loader_batches_per_epoch(l);
    for (long e = o->start_epoch; e < o->epochs; e++) {
        for (int64_t s = e == o->start_epoch ? o->start_step : 0; s < steps; s++) {
            ct_batch b;
            ct_status st = ct_loader_batch_at(l, e, s, &b);
            if (st != CT_OK) {
                return ct_err_set(err, st, "batch %lld of epoch %ld: status %d", (long long)s, e,
                                  (int)st);
            }
            int64_t example = 1;
            for (int d = 0; d < b.rank; d++) {
                example *= b.example_shape[d];
            }
            fprintf(f, "%ld %lld %lld", e, (long long)s, (long long)b.size);
            for (int64_t i = 0; i < b.size; i++) {
                fprintf(f, " %.9g", (double)b.x[i * example]);
            }
            fputc('\n', f);
            fflush(f);
            if (o->sleep_ms > 0) {
                struct timespec ts = {o->sleep_ms / 1000, (o->sleep_ms % 1000) * 1000000L};
                nanosleep(&ts, NULL);
            }
        }
    }
    return CT_OK;
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: ds_consume JOB --out FILE [--shard C --shards N] [--epochs E] "
                        "[--start-epoch E] [--start-step S] [--sleep-ms MS] [--set K=V ...]\n");
        return 2;
    }
    ct_log_set(CT_LOG_WARN, log_line, NULL);
    ct_job job;
    ct_err err = {0};
    if (ct_job_load(o.job, o.sets, o.n_sets, &job, &err) != CT_OK) {
        fprintf(stderr, "ds_consume: %s\n", err.msg);
        return 2;
    }
    ct_loader *l = NULL;
    ct_status st = ct_pipeline_loader(&job, 0, (int)o.shard, (int)o.shards, &l, &err);
    FILE *f = st == CT_OK ? fopen(o.out, "w") : NULL;
    if (st == CT_OK && !f) {
        st = ct_err_set(&err, CT_EIO, "%s: cannot write", o.out);
    }
    if (st == CT_OK) {
        st = consume(&o, l, f, &err);
    }
    if (f) {
        fclose(f);
    }
    ct_loader_destroy(l);
    if (st != CT_OK) {
        fprintf(stderr, "ds_consume: %s\n", err.msg);
        return 1;
    }
    return 0;
}
