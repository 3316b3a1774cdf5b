/* ctrain profile RUN_DIR: the report of a profiled run (train.profile.steps or --profile), read
 * from every role's RUN_DIR/profile/<role>.<task>.ctprof: per recorded step where the time went
 * (compute, input wait, exposed communication, optimizer, idle), the ops by total time, the
 * input-bound verdict with the stage that limits the input, and for jobs of several roles the
 * slowest one per step. The analysis is the library's (prof/prof_report.h); this file prints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "prof/prof.h"
#include "prof/prof_file.h"
#include "prof/prof_report.h"

static void profile_usage(FILE *f) {
    fprintf(f,
            "usage: ctrain profile RUN_DIR [--top N] [--merge]\n"
            "\n"
            "Prints the report of a run trained with --profile FIRST:LAST (or\n"
            "train.profile.steps: [FIRST, LAST]), from RUN_DIR/profile/*.ctprof:\n"
            "  - per recorded step and role, where its time went: input wait, optimizer,\n"
            "    compute (graph ops), exposed communication, idle (each instant counted once,\n"
            "    in that order of precedence);\n"
            "  - the ops by total time (count, total, average, share);\n"
            "  - the input-bound verdict: input-bound when the input wait is >= 20%% of the\n"
            "    recorded steps' time, partly input-bound from 5%%, with the pipeline stage that\n"
            "    limits the input (the most busy time per thread running it);\n"
            "  - with several roles, the slowest one per step (the most time of its own: the\n"
            "    step's time less its exposed communication, where the others wait for it),\n"
            "    and with parameter servers the busiest server per step.\n"
            "The merged timeline is RUN_DIR/trace.json.gz (open it in ui.perfetto.dev or\n"
            "chrome://tracing).\n"
            "\n"
            "options:\n"
            "  --top N     ops to list (default 10)\n"
            "  --merge     first merge RUN_DIR/profile/*.ctprof again into trace.json.gz and\n"
            "              plugins/profile/ (after copying the files of roles that ran on\n"
            "              other machines into RUN_DIR/profile)\n"
            "  -h, --help  show this help\n"
            "exit codes: 0 success, 1 runtime failure (--merge could not write), 2 bad input (no\n"
            "profile in RUN_DIR, a corrupt file)\n");
}

static double ms(int64_t ns) {
    return (double)ns / 1e6;
}

/* The roles' recordings, and whether they are a mirrored run's ranks. */
typedef struct view {
    ct__prof_dump **dumps;
    int mirrored;
} view;

/* A mirrored run: every step-running role is a rank (a "worker" of task = rank), no chief. */
static int is_mirrored(ct__prof_dump **dumps, int n) {
    int workers = 0;
    for (int k = 0; k < n; k++) {
        if (!strcmp(dumps[k]->role, "chief")) {
            return 0;
        }
        workers += !strcmp(dumps[k]->role, "worker");
    }
    return workers > 0;
}

/* "chief (host)", "worker 1 (host)"; in a mirrored run "rank 1 (host)". */
static const char *role_label(const view *v, const ct__prof_dump *d, char *buf, size_t size) {
    if (!strcmp(d->role, "chief")) {
        snprintf(buf, size, "chief (%s)", d->host);
    } else if (v->mirrored && !strcmp(d->role, "worker")) {
        snprintf(buf, size, "rank %d (%s)", d->task, d->host);
    } else {
        snprintf(buf, size, "%s %d (%s)", d->role, d->task, d->host);
    }
    return buf;
}

static void print_steps(const ct__prof_report *r, const view *v) {
    printf("\nstep time (ms; each instant counted once: input wait, then optimizer, compute, "
           "exposed communication, the rest idle):\n");
    printf("  %-24s %6s %9s %9s %9s %9s %9s %9s\n", "role", "step", "total", "compute", "input",
           "comm", "optimizer", "idle");
    int64_t sum[CT__PROF_PARTS] = {0}, total = 0;
    for (int i = 0; i < r->n_steps; i++) {
        const ct__prof_step_row *s = &r->steps[i];
        char label[128];
        printf("  %-24s %6lld %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f\n",
               role_label(v, v->dumps[s->dump], label, sizeof label), (long long)s->step,
               ms(s->total_ns), ms(s->part_ns[CT__PROF_PART_COMPUTE]),
               ms(s->part_ns[CT__PROF_PART_INPUT]), ms(s->part_ns[CT__PROF_PART_COMM]),
               ms(s->part_ns[CT__PROF_PART_OPTIMIZER]), ms(s->part_ns[CT__PROF_PART_IDLE]));
        for (int p = 0; p < CT__PROF_PARTS; p++) {
            sum[p] += s->part_ns[p];
        }
        total += s->total_ns;
    }
    if (r->n_steps > 0) {
        double t = total > 0 ? (double)total : 1.0;
        printf("  %-24s %6s %8.1f%% %8.1f%% %8.1f%% %8.1f%% %8.1f%% %8.1f%%\n", "share", "", 100.0,
               100.0 * (double)sum[CT__PROF_PART_COMPUTE] / t,
               100.0 * (double)sum[CT__PROF_PART_INPUT] / t,
               100.0 * (double)sum[CT__PROF_PART_COMM] / t,
               100.0 * (double)sum[CT__PROF_PART_OPTIMIZER] / t,
               100.0 * (double)sum[CT__PROF_PART_IDLE] / t);
    }
    if (v->mirrored && sum[CT__PROF_PART_COMM] > 0) {
        printf("  comm is the all-reduce time in these steps that no op, input wait or optimizer "
               "on the rank covered,\n  gaps between backward ops included; the training "
               "summary's 'exposed all-reduce wait' counts\n  only the wait after the backward "
               "for the last buckets, averaged over every step\n");
    }
}

static void print_ops(const ct__prof_report *r, int top) {
    printf("\ntop ops by total time (every role, every thread):\n");
    printf("  %-28s %8s %11s %10s %7s\n", "op", "count", "total ms", "avg us", "share");
    for (int i = 0; i < r->n_ops && i < top; i++) {
        const ct__prof_op_row *o = &r->ops[i];
        printf("  %-28s %8lld %11.3f %10.2f %6.1f%%\n", o->name, (long long)o->count,
               ms(o->total_ns), (double)o->total_ns / 1e3 / (double)(o->count ? o->count : 1),
               100.0 * o->share);
    }
    if (r->n_ops == 0) {
        printf("  (no graph ops recorded)\n");
    }
}

static void print_verdict(const ct__prof_report *r) {
    static const char *const verdicts[3] = {"not input-bound", "partly input-bound", "input-bound"};
    printf("\nverdict: %s: the input wait is %.1f%% of the recorded steps' time "
           "(input-bound at >= %.0f%%, partly from %.0f%%)\n",
           verdicts[r->verdict], 100.0 * r->input_share, 100.0 * CT__PROF_INPUT_BOUND,
           100.0 * CT__PROF_INPUT_PARTLY);
    if (r->n_stages > 0) {
        const ct__prof_stage_row *s = &r->stages[0];
        printf("%s stage: %s (%.3f ms busy on %d thread%s, %lld elements)\n",
               r->verdict ? "limiting" : "slowest input", s->name, ms(s->self_ns), s->threads,
               s->threads == 1 ? "" : "s", (long long)s->count);
    }
    if (r->n_remote_stages > 0) { /* "service" waits for them: which of their stages is slowest */
        const ct__prof_stage_row *s = &r->remote_stages[0];
        printf("%s stage on the data workers: %s (%.3f ms busy on %d thread%s, %lld elements)\n",
               r->verdict ? "limiting" : "slowest", s->name, ms(s->self_ns), s->threads,
               s->threads == 1 ? "" : "s", (long long)s->count);
    }
}

/* With several roles: per step, the role with the most time of its own: the step's time less
 * its exposed communication (in a synchronous job the others wait for the straggler there;
 * what a straggler does instead, computing, sleeping or waiting for a core, is its own). */
static void print_stragglers(const ct__prof_report *r, const view *v) {
    int stepping = 0; /* roles with steps of their own (not the data service, the evaluator) */
    for (int i = 0; i < r->n_steps; i++) {
        stepping += i == 0 || r->steps[i].dump != r->steps[i - 1].dump;
    }
    if (stepping < 2) {
        return;
    }
    printf("\nslowest role per step (most time of its own: step time less exposed "
           "communication):\n");
    for (int i = 0; i < r->n_steps; i++) {
        int64_t step = r->steps[i].step, best = -1, sum = 0, n = 0;
        int seen = 0, who = -1;
        for (int k = 0; k < r->n_steps; k++) {
            const ct__prof_step_row *s = &r->steps[k];
            seen |= k < i && s->step == step;
            if (s->step != step) {
                continue;
            }
            int64_t busy = s->total_ns - s->part_ns[CT__PROF_PART_COMM];
            sum += busy;
            n++;
            if (busy > best) {
                best = busy;
                who = s->dump;
            }
        }
        if (seen || n < 2) {
            continue;
        }
        char label[128];
        printf("  step %lld: %s, own time %.3f ms (mean of %lld roles %.3f ms)\n", (long long)step,
               role_label(v, v->dumps[who], label, sizeof label), ms(best), (long long)n,
               ms(sum / n));
    }
}

/* The parameter servers: per step, the one that spent the most time on the workers' pushes
 * (the update included) and pulls. */
static void print_servers(const ct__prof_report *r, const view *v) {
    if (r->n_servers == 0) {
        return;
    }
    printf("\nbusiest parameter server per step (pushes handled, the update included, and pulls "
           "served):\n");
    for (int i = 0; i < r->n_servers; i++) {
        int64_t step = r->servers[i].step;
        int seen = 0, who = i, n = 0;
        for (int k = 0; k < r->n_servers; k++) {
            const ct__prof_server_row *s = &r->servers[k];
            if (s->step != step) {
                continue;
            }
            seen |= k < i;
            who = s->serve_ns > r->servers[who].serve_ns ? k : who;
            n++;
        }
        if (seen) {
            continue;
        }
        char label[128];
        const ct__prof_server_row *s = &r->servers[who];
        printf("  step %lld: %s, %.3f ms (update %.3f ms) of %d server%s\n", (long long)step,
               role_label(v, v->dumps[s->dump], label, sizeof label), ms(s->serve_ns),
               ms(s->apply_ns), n, n == 1 ? "" : "s");
    }
}

/* What the roles did besides steps: evaluations, data-service batches, leases and acks, a
 * chief's reports, checkpoints, registrations and heartbeats. */
static void print_activities(const ct__prof_report *r, const view *v) {
    if (r->n_activities == 0) {
        return;
    }
    printf("\nother activity in the window (count, mean and longest ms, bytes):\n");
    for (int i = 0; i < r->n_activities; i++) {
        const ct__prof_activity_row *a = &r->activities[i];
        char label[128], bytes[48] = "";
        if (a->bytes >= 1000000) {
            snprintf(bytes, sizeof bytes, ", %.2f MB", (double)a->bytes / 1e6);
        } else if (a->bytes > 0) {
            snprintf(bytes, sizeof bytes, ", %.1f kB", (double)a->bytes / 1e3);
        }
        printf("  %-24s %-12s %6lld x, mean %8.3f, longest %8.3f%s\n",
               i == 0 || r->activities[i - 1].dump != a->dump
                   ? role_label(v, v->dumps[a->dump], label, sizeof label)
                   : "",
               ct__prof_kind_name(a->kind), (long long)a->count, ms(a->total_ns) / (double)a->count,
               ms(a->max_ns), bytes);
    }
}

/* The last line: where to look at the timeline. */
static void print_where(const char *run_dir) {
    printf("\ntimeline: %s/trace.json.gz (ui.perfetto.dev or chrome://tracing); TensorBoard's "
           "Profile tab: tensorboard --logdir %s\n",
           run_dir, run_dir);
}

static void print_report(const char *run_dir, ct__prof_dump **dumps, int n,
                         const ct__prof_report *r, int top) {
    int64_t events = 0, first = INT64_MAX, last = -1;
    for (int k = 0; k < n; k++) {
        events += dumps[k]->n_events;
    }
    for (int i = 0; i < r->n_steps; i++) {
        first = r->steps[i].step < first ? r->steps[i].step : first;
        last = r->steps[i].step > last ? r->steps[i].step : last;
    }
    view v = {dumps, is_mirrored(dumps, n)};
    printf("profile of %s: %s%d role%s, ", run_dir, v.mirrored ? "mirrored, " : "", n,
           n == 1 ? "" : "s");
    if (last >= 0) {
        printf("steps %lld-%lld, ", (long long)first, (long long)last);
    } else {
        printf("no steps, ");
    }
    printf("%lld events, %lld dropped (full buffers)\n", (long long)events, (long long)r->dropped);
    for (int k = 0; k < n; k++) { /* the roles whose clocks were aligned to the chief's */
        char label[128];
        if (dumps[k]->clock_error_ns > 0) {
            printf("clock of %s: %+.1f us to %s (measured within %.1f us)\n",
                   role_label(&v, dumps[k], label, sizeof label),
                   (double)dumps[k]->clock_offset_ns / 1e3, v.mirrored ? "rank 0's" : "the chief's",
                   (double)dumps[k]->clock_error_ns / 1e3);
        }
    }
    if (r->n_steps == 0) {
        printf("no step of the window ran (the run ended before it, or stopped first)\n");
        print_activities(r, &v);
        print_where(run_dir);
        return;
    }
    print_steps(r, &v);
    print_ops(r, top);
    print_verdict(r);
    print_stragglers(r, &v);
    print_servers(r, &v);
    print_activities(r, &v);
    print_where(run_dir);
}

int cmd_profile(int argc, char **argv) {
    const char *run_dir = NULL;
    long top = 10;
    int merge = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            profile_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--merge")) {
            merge = 1;
        } else if (!strcmp(argv[i], "--top")) {
            char *end = NULL;
            top = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (!end || *end || top < 1 || top > 100000) {
                fprintf(stderr, "ctrain: profile: --top needs a count from 1 to 100000\n");
                return EXIT_BAD_INPUT;
            }
            i++;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "ctrain: profile: unknown option '%s' (see --help)\n", argv[i]);
            return EXIT_BAD_INPUT;
        } else if (!run_dir) {
            run_dir = argv[i];
        } else {
            fprintf(stderr, "ctrain: profile: unexpected argument '%s' (one RUN_DIR)\n", argv[i]);
            return EXIT_BAD_INPUT;
        }
    }
    if (!run_dir) {
        fprintf(stderr, "ctrain: profile needs a run directory: ctrain profile RUN_DIR\n");
        return EXIT_BAD_INPUT;
    }
    ct__prof_dump **dumps = NULL;
    int n = 0;
    ct_err err = {0};
    ct__prof_report r = {0};
    ct_status st = merge ? ct__prof_merge_run(run_dir, &err) : CT_OK;
    if (st == CT_OK && merge) {
        printf("merged %s/profile into %s/trace.json.gz\n", run_dir, run_dir);
    }
    if (st == CT_OK) {
        st = ct__prof_read_run(run_dir, &dumps, &n, &err);
    }
    if (st == CT_OK) {
        st = ct__prof_analyse((const ct__prof_dump *const *)dumps, n, &r, &err);
    }
    if (st != CT_OK) {
        fprintf(stderr, "ctrain: profile: %s\n", err.msg);
        ct__prof_dumps_free(dumps, n);
        return st == CT_ENOMEM || st == CT_EIO || st == CT_ETIMEDOUT ? EXIT_RUNTIME
                                                                     : EXIT_BAD_INPUT;
    }
    print_report(run_dir, dumps, n, &r, (int)top);
    ct__prof_report_finish(&r);
    ct__prof_dumps_free(dumps, n);
    return 0;
}
