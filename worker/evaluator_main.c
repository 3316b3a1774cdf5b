/* ctrain-evaluator: evaluates each new checkpoint of a job once and writes the eval run. A thin
 * main: flags, the job, ct_evaluator_run, exit code (0 after the final checkpoint, 1 on a
 * runtime failure or timeout, 2 on bad input, 130 SIGINT, 143 SIGTERM). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/role/role_run.h"
#include "ctrain/job.h"
#include "evaluator.h"

/* One JSON line per evaluated checkpoint on stdout (the format scripts read). */
/* A JSON number, or null for NaN and infinities (JSON has neither). */
static const char *json_number(double v, char *buf, size_t cap) {
    if (!isfinite(v)) {
        return "null";
    }
    snprintf(buf, cap, "%.17g", v);
    return buf;
}

static void print_evaluation(const ct_evaluation *e, void *user) {
    (void)user;
    char top_k[96] = "", a[40], b[40], c[40];
    if (e->top_k) {
        snprintf(top_k, sizeof top_k, ", \"eval_top%d_accuracy\": %s", e->top_k,
                 json_number(e->top_k_accuracy, c, sizeof c));
    }
    printf("{\"step\": %lld, \"epoch\": %lld, \"checkpoint\": \"%s\", \"eval_loss\": %s, "
           "\"eval_accuracy\": %s%s, \"final\": %s}\n",
           (long long)e->step, (long long)e->epoch, e->checkpoint,
           json_number(e->loss, a, sizeof a), json_number(e->accuracy, b, sizeof b), top_k,
           e->final ? "true" : "false");
    fflush(stdout);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain-evaluator --job JOB.yaml [options]\n"
            "\n"
            "Watches the job's checkpoint directory, evaluates every new checkpoint once on\n"
            "data.eval, and writes eval/loss and eval/accuracy at the checkpoint's step to the\n"
            "TensorBoard run <run_dir>/eval and as JSON lines on stdout. Exits after the job's\n"
            "final checkpoint, or after --timeout seconds without a new one.\n"
            "\n"
            "options:\n"
            "  --job FILE            the job file (required)\n"
            "  --checkpoint-dir DIR  where to look (default: checkpoint.dir, or\n"
            "                        <run_dir>/checkpoints)\n"
            "  --run-dir DIR         where the eval run goes (default: the job's run_dir)\n"
            "  --timeout S           seconds without a new checkpoint before giving up (600)\n"
            "  --poll S              seconds between looks (0.5)\n"
            "  --set KEY=VALUE       override a job field (repeatable)\n"
            "  -h, --help            show this help\n"
            "exit codes: 0 final checkpoint evaluated, 1 runtime failure or timeout, 2 bad input,\n"
            "130 SIGINT, 143 SIGTERM\n");
}

int main(int argc, char **argv) {
    const char *job_path = NULL, *sets[64];
    int n_sets = 0;
    ct_evaluator_options o = {.timeout_s = 600,
                              .poll_s = 0.5,
                              .on_evaluation = print_evaluation,
                              .stop = &ct_role_stop_requested};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--job") && has) {
            job_path = argv[++i];
        } else if (!strcmp(a, "--checkpoint-dir") && has) {
            o.checkpoint_dir = argv[++i];
        } else if (!strcmp(a, "--run-dir") && has) {
            o.run_dir = argv[++i];
        } else if ((!strcmp(a, "--timeout") || !strcmp(a, "--poll")) && has) {
            char *end;
            double v = strtod(argv[++i], &end);
            if (*end || !(v > 0)) {
                fprintf(stderr,
                        "ctrain-evaluator: %s needs a positive number of seconds, got "
                        "'%s'\n",
                        a, argv[i]);
                return 2;
            }
            *(!strcmp(a, "--timeout") ? &o.timeout_s : &o.poll_s) = v;
        } else if (!strcmp(a, "--set") && has && n_sets < 64) {
            sets[n_sets++] = argv[++i];
        } else {
            fprintf(stderr, "ctrain-evaluator: unknown or incomplete option '%s' (see --help)\n",
                    a);
            return 2;
        }
    }
    if (!job_path) {
        fprintf(stderr, "ctrain-evaluator: --job is required (see --help)\n");
        return 2;
    }
    ct_job *job = NULL;
    ct_err err = {0};
    if (ct_job_create(job_path, sets, n_sets, &job, NULL, &err) != CT_OK) {
        fprintf(stderr, "ctrain-evaluator: %s\n", err.msg);
        return 2;
    }
    ct_role_catch_signals();
    ct_log_set(CT_LOG_WARN, ct_role_log_line, "ctrain-evaluator");
    ct_evaluator_result r;
    ct_status st = ct_evaluator_run(job, &o, &r, &err);
    ct_job_destroy(job);
    if (st != CT_OK) {
        fprintf(stderr, "ctrain-evaluator: %s\n", err.msg);
        return ct_exit_code(st, ct_role_stop_signal, 0);
    }
    fprintf(stderr,
            "ctrain-evaluator: evaluated %d checkpoints; final step %lld: loss %.6f "
            "accuracy %.6f\n",
            r.evaluated, (long long)r.last_step, r.last_loss, r.last_accuracy);
    return 0;
}
