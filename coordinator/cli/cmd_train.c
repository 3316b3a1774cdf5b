/* ctrain train: a job on this machine, in this process (graph or eager mode), as N mirrored
 * ranks under mpirun (--replicas), or as a local parameter-server cluster (--ps/--workers). It
 * prints the progress bar or the epoch lines and the done line, and maps the status to the exit
 * code (0, 1 runtime failure, 2 bad input, 130 SIGINT, 143 SIGTERM). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cmd_ckpt.h"
#include "core/clock.h"
#include "ctrain/checkpoint.h"
#include "ctrain/ctrain.h"
#include "ctrain/half.h"
#include "ctrain/mirrored.h"
#include "ctrain/net.h"
#include "ctrain/npz.h"
#include "ctrain/pipeline.h"
#include "ctrain/report.h"
#include "ds_launch.h"
#include "elastic_launch.h"
#include "mpi_launch.h"
#include "ps_launch.h"

static void train_usage(FILE *f) {
    fprintf(
        f,
        "usage: ctrain train [JOB.yaml] [options]\n"
        "\n"
        "Trains JOB (YAML or JSON; default %s) and evaluates on data.eval after each epoch.\n"
        "\n"
        "options:\n"
        "  --set KEY=VALUE   override a job field by its dotted name, e.g. --set train.epochs=1,\n"
        "                    --set model.layers[1].dense.units=64 (repeatable)\n"
        "  --eager           run op by op instead of the compiled graph\n"
        "                    (= --set train.eager=true)\n"
        "  --threads N       threads for kernels and BLAS (= --set train.threads=N; 0: all cores)\n"
        "  --quiet           print only the final summary line\n"
        "  --profile A:B     record training steps A to B (1-based) on every role\n"
        "                    (= --set train.profile.steps=[A,B]); writes RUN_DIR/trace.json.gz\n"
        "                    for Perfetto or chrome://tracing; 'ctrain profile RUN_DIR'\n"
        "                    prints the report\n"
        "  --init-from F.npz start from the weights in a NumPy .npz (one array per variable,\n"
        "                    named as in 'ctrain summary'; e.g. from 'ctrain ckpt export';\n"
        "                    f32, or f16 as 'ckpt export --dtype f16' writes it);\n"
        "                    ignored when the run resumes from its own checkpoint\n"
        "  --replicas N      train with the mirrored strategy on N local MPI ranks (runs\n"
        "                    mpirun -np N ctrain-worker; needs Open MPI's mpirun)\n"
        "  --elastic MIN:MAX with --replicas N: an elastic job (strategy.elastic; needs\n"
        "                    train.invariant): the chief here, N-1 ctrain-worker ranks\n"
        "                    restarted if they die, ranks may join and leave (docs/elastic.md)\n"
        "  --start-timeout S with --replicas: stop mpirun when rank 0 has not finished\n"
        "                    MPI_Init within S seconds (default 120)\n"
        "  --ps M --workers N  train with the parameter-server strategy: the chief here,\n"
        "                    M ctrain-ps and N ctrain-worker processes on loopback,\n"
        "                    restarted if they die (strategy.mode: sync or async)\n"
        "  --straggler F     benchmarks: worker 0 (--ps/--workers) or the last rank\n"
        "                    (--replicas) runs F times slower\n"
        "  --data-workers N  read the input from a data service on this machine: a\n"
        "                    ctrain-dispatcher and N ctrain-data-worker processes run the\n"
        "                    pipeline (data.service; combines with --replicas, --ps/--workers)\n"
        "  --no-resume       start over even if the checkpoint directory has a checkpoint\n"
        "                    (the old checkpoints, train/, validation/ and metrics.jsonl are\n"
        "                    kept, each renamed NAME.previous-<time>)\n"
        "  --allow-changed-input  resume even though data.train changed since the checkpoint\n"
        "                    (= --set checkpoint.allow_changed_input=true)\n"
        "  -h, --help        show this help\n"
        "\n"
        "Checkpoints go to checkpoint.dir (default RUN_DIR/checkpoints) every\n"
        "checkpoint.every_steps steps and at the end; a run whose directory holds one resumes\n"
        "from it (exactly: same weights, optimizer state, step and data position). SIGINT and\n"
        "SIGTERM save a checkpoint before exiting.\n"
        "\n"
        "The last line printed is a stable summary for scripts:\n"
        "  done: epochs=E steps=S test_loss=L test_accuracy=A seconds=T samples_per_s=R\n"
        "exit codes: 0 success, 1 runtime failure, 2 bad input (job, flags, data, checkpoint),\n"
        "130 interrupted by SIGINT, 143 stopped by SIGTERM (both after saving a checkpoint)\n",
        CT_DEFAULT_JOB);
}

typedef struct progress_state {
    int tty;
    int quiet;
    double last_draw;
} progress_state;

static void print_progress(const ct_train_progress *p, void *user) {
    progress_state *s = user;
    if (s->quiet) {
        return;
    }
    if (!p->end_of_epoch) {
        if (!s->tty || (p->step != p->steps && p->step % 20 != 0)) {
            return;
        }
        int width = 30, filled = (int)(width * p->step / (p->steps ? p->steps : 1));
        char bar[64];
        for (int i = 0; i < width; i++) {
            bar[i] = i < filled ? '=' : (i == filled ? '>' : '.');
        }
        bar[width] = '\0';
        printf("\repoch %d/%d %6lld/%lld [%s] loss %.4f accuracy %.4f %.0f samples/s ETA %.0fs ",
               p->epoch + 1, p->epochs, (long long)p->step, (long long)p->steps, bar, p->loss,
               p->accuracy, p->samples_per_s, p->eta_s);
        fflush(stdout);
        return;
    }
    char line[512];
    ct_format_epoch_line(line, sizeof line, p);
    printf("%s%s\n", s->tty ? "\r\033[K" : "", line);
    if (ct_format_input_line(line, sizeof line, p) > 0) {
        printf("%s\n", line);
    }
    fflush(stdout);
}

/* The parameter-server chief's notices, as "chief: ..." lines. */
static void print_chief_notice(const char *line, void *user) {
    (void)user;
    printf("chief: %s\n", line);
    fflush(stdout);
}

/* The done line with the run's extra fields ("ps=1 workers=2"; NULL: none). */
static void print_done(const ct_train_result *r, const char *extra) {
    char line[512];
    ct_format_done_line(line, sizeof line, r, extra);
    printf("%s\n", line);
}

/* A count for a person: the number, or "?" when the pipeline cannot know it in advance. */
static const char *count_str(int64_t n, char *buf, size_t size) {
    if (n < 0) {
        snprintf(buf, size, "?");
    } else {
        snprintf(buf, size, "%lld", (long long)n);
    }
    return buf;
}

/* The loader of one data split (the pipeline form or the short form); NULL (and a message) on
 * failure. */
static ct_loader *open_split(const ct_job *job, int eval) {
    ct_loader *l = NULL;
    ct_err err = {0};
    if (ct_pipeline_loader(job, eval, 0, 1, &l, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return NULL;
    }
    return l;
}

static void warn_line(const char *msg, void *user) {
    (void)user;
    fprintf(stderr, "ctrain: warning: %s\n", msg);
}

/* Loads every variable of the model from the .npz at path (names and shapes checked). Returns 0
 * or an exit code. */
static int init_from(const char *path, ct_trainer *t) {
    ct_npz *z = NULL;
    ct_err err = {0};
    if (ct_npz_create(path, &z, &err) != CT_OK) {
        fprintf(stderr, "ctrain: --init-from: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    ct_params *p = ct_trainer_params(t);
    int rc = 0;
    for (int i = 0; i < p->n && !rc; i++) {
        const ct_named_array *a = ct_npz_find(z, p->items[i].name);
        ct_shape want = p->items[i].shape, got = {.rank = a ? a->rank : 0};
        for (int k = 0; a && k < a->rank && k < CT_MAX_DIMS; k++) {
            got.dims[k] = a->dims[k];
        }
        char sg[96], sw[96];
        if (!a) {
            fprintf(stderr,
                    "ctrain: --init-from %s: no array named '%s' (the model's variables "
                    "are listed by 'ctrain summary')\n",
                    path, p->items[i].name);
            rc = EXIT_BAD_INPUT;
        } else if ((a->dtype != CT_F32 && a->dtype != CT_F16) || !ct_shape_equal(&got, &want)) {
            fprintf(stderr, "ctrain: --init-from %s: '%s' is %s%s, the model needs f32%s\n", path,
                    p->items[i].name, ct_dtype_name(a->dtype), ct_shape_str(&got, sg, sizeof sg),
                    ct_shape_str(&want, sw, sizeof sw));
            rc = EXIT_BAD_INPUT;
        } else if (a->dtype == CT_F16) { /* half-precision weights (ckpt export --dtype f16) */
            const uint16_t *h = a->data;
            for (int64_t j = 0; j < p->items[i].size; j++) {
                ct_params_data(p, i)[j] = ct_fp16_to_f32(h[j]);
            }
        } else {
            memcpy(ct_params_data(p, i), a->data, (size_t)p->items[i].size * sizeof(float));
        }
    }
    ct_npz_destroy(z);
    return rc;
}

/* The job's checkpoint directory into dir (2048 bytes). */
static void checkpoint_dir(const ct_job *job, char *dir) {
    if (job->checkpoint.dir[0]) {
        snprintf(dir, 2048, "%s", job->checkpoint.dir);
    } else {
        snprintf(dir, 2048, "%.2000s/checkpoints", job->run_dir);
    }
}

/* --no-resume: moves the old run aside (checkpoints, TensorBoard runs, metrics.jsonl). Returns 0
 * or an exit code. */
static int move_aside(const cli *c, const ct_job *job) {
    char suffix[64];
    int moved = 0;
    ct_err err = {0};
    if (!c->no_resume) {
        return 0;
    }
    if (ct_run_move_aside(job->run_dir, job->checkpoint.dir, suffix, &moved, &err) != CT_OK) {
        fprintf(stderr, "ctrain: --no-resume: %s\n", err.msg);
        return EXIT_RUNTIME;
    }
    if (moved && !c->quiet) {
        printf("starting over: the old run's checkpoints and logs are kept as *%s\n", suffix);
    }
    return 0;
}

/* Points the trainer at its checkpoint directory and resumes from it unless told not to.
 * Returns 0 or an exit code. */
static int setup_checkpoints(const cli *c, const ct_job *job, const char *text, ct_trainer *t) {
    char dir[2048];
    ct_err err = {0};
    checkpoint_dir(job, dir);
    int moved = move_aside(c, job);
    if (moved != 0) {
        return moved;
    }
    ct_status st = ct_trainer_set_checkpointing(t, dir, text, &err);
    if (st != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return EXIT_RUNTIME;
    }
    int resumed = 0;
    if (!c->no_resume && job->checkpoint.resume &&
        ct_trainer_resume(t, dir, &resumed, warn_line, NULL, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    if (resumed && !c->quiet) {
        printf("resumed from %s at step %lld\n", ct_trainer_last_checkpoint(t),
               (long long)ct_trainer_step_count(t));
    }
    int64_t pos[3];
    ct_trainer_get_position(t, pos);
    if (resumed && (pos[1] >= job->train.epochs ||
                    (job->train.max_steps > 0 && pos[0] >= job->train.max_steps))) {
        fprintf(stderr,
                "ctrain: %s: the run already finished at step %lld; evaluating only "
                "(--no-resume trains again)\n",
                dir, (long long)pos[0]);
    }
    if (!resumed && c->init_from) {
        int rc = init_from(c->init_from, t);
        if (rc == 0 && !c->quiet) {
            printf("initialized the variables from %s\n", c->init_from);
        }
        return rc;
    }
    return 0;
}

static void log_line(ct_log_level level, const char *msg, void *user) {
    (void)level;
    (void)user;
    fprintf(stderr, "ctrain: %s\n", msg);
}

/* The local cluster's profile: the workers' files (they are all gone) into trace.json.gz. */
static void merge_profile(const ct_job *job, int quiet) {
    ct_err err = {0};
    if (ct_profile_merge(job->run_dir, &err) != CT_OK) {
        fprintf(stderr, "ctrain: warning: profile: %s\n", err.msg);
    } else if (!quiet) {
        printf("profile: steps %lld-%lld -> %s/trace.json.gz ('ctrain profile %s' for the "
               "report)\n",
               (long long)job->train.profile_steps[0], (long long)job->train.profile_steps[1],
               job->run_dir, job->run_dir);
    }
}

/* --ps M --workers N: the chief here, M servers and N workers as child processes. */
static int run_local_cluster(cli *c) {
    if (c->replicas > 1) {
        fprintf(stderr, "ctrain: --replicas (mirrored) and --ps/--workers (parameter servers) "
                        "are different strategies: pick one\n");
        return EXIT_BAD_INPUT;
    }
    if (c->n_sets >= MAX_SETS) {
        fprintf(stderr, "ctrain: too many --set options (at most %d)\n", MAX_SETS);
        return EXIT_BAD_INPUT;
    }
    c->sets[c->n_sets++] = "strategy.type=parameter_server";
    ct_job *job = NULL;
    ct_err err = {0};
    char *text = NULL;
    if (ct_job_create(c->job_path, c->sets, c->n_sets, &job, &text, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    ct_log_set(CT_LOG_WARN, log_line, NULL);
    progress_state ps = {.tty = 0, .quiet = c->quiet}; /* the chief reports epoch ends only */
    ct_train_reporter report = {
        .progress = print_progress, .notice = print_chief_notice, .user = &ps};
    ct_local_cluster lc = {.job_path = c->job_path,
                           .sets = c->sets,
                           .n_sets = c->n_sets,
                           .job_text = text,
                           .n_ps = c->ps > 0 ? c->ps : 1,
                           .n_workers = c->workers > 0 ? c->workers : 1,
                           .straggler = c->straggler > 1.0 ? c->straggler : 1.0,
                           .no_resume = c->no_resume,
                           .report = c->quiet ? (ct_train_reporter){0} : report,
                           .stop = &cli_stop_requested};
    if (move_aside(c, job) != 0) {
        free(text);
        ct_job_destroy(job);
        return EXIT_RUNTIME;
    }
    if (job->train.profile_steps[0] > 0 && ct_profile_clear(job->run_dir, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        free(text);
        ct_job_destroy(job);
        return EXIT_RUNTIME;
    }
    ct_train_result r;
    ct_status st = ct_run_local_cluster(&lc, job, &r, &err);
    free(text);
    if (st == CT_OK && job->train.profile_steps[0] > 0) { /* every worker has written its file */
        merge_profile(job, c->quiet);
    }
    ct_job_destroy(job);
    if (st != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return ct_exit_code(st, cli_stop_signal, 0);
    }
    char extra[64];
    snprintf(extra, sizeof extra, "ps=%d workers=%d", lc.n_ps, lc.n_workers);
    print_done(&r, extra);
    return 0;
}

/* The end of a profiled run in this process: its recording into RUN_DIR/profile, merged into
 * RUN_DIR/trace.json.gz. A failure is a warning: the training itself succeeded. */
static void write_profile(const ct_job *job, int quiet, int newline) {
    long long events = 0, dropped = 0;
    ct_err err = {0};
    if (ct_profile_write(job->run_dir, &events, &dropped, &err) != CT_OK ||
        ct_profile_merge(job->run_dir, &err) != CT_OK) {
        fprintf(stderr, "%sctrain: warning: profile: %s\n", newline ? "\n" : "", err.msg);
        return;
    }
    char lost[64] = "";
    if (dropped > 0) {
        snprintf(lost, sizeof lost, " (%lld dropped: buffers full)", dropped);
    } else if (events == 0) {
        snprintf(lost, sizeof lost, " (no step of the window ran)");
    }
    if (!quiet) {
        printf("profile: steps %lld-%lld, %lld events%s -> %s/trace.json.gz ('ctrain profile %s' "
               "for the report)\n",
               (long long)job->train.profile_steps[0], (long long)job->train.profile_steps[1],
               events, lost, job->run_dir, job->run_dir);
    }
}

/* Trains in this process. */
static int train_here(cli c) {
    ct_job *job = NULL;
    ct_err err = {0};
    char *text = NULL;
    if (ct_job_create(c.job_path, c.sets, c.n_sets, &job, &text, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    ct_trainer *t = NULL;
    ct_loader *train = NULL, *eval = NULL;
    int rc = EXIT_BAD_INPUT;
    if (ct_trainer_create(job, &t, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        goto done;
    }
    if (!(train = open_split(job, 0)) || (job->has_eval_data && !(eval = open_split(job, 1)))) {
        goto done;
    }
    if (!c.quiet) {
        const ct_params *p = ct_trainer_params(t);
        char n1[32], n2[32], n3[32];
        int64_t count = 0;
        for (int i = 0; i < p->n; i++) {
            count += p->items[i].trainable ? p->items[i].size : 0;
        }
        printf("job %s: %s training and %s test examples, %lld parameters, %d epochs of "
               "%s batches\n",
               job->path, count_str(ct_loader_examples(train), n1, sizeof n1),
               count_str(eval ? ct_loader_examples(eval) : 0, n2, sizeof n2), (long long)count,
               job->train.epochs, count_str(ct_loader_batches_per_epoch(train), n3, sizeof n3));
        fflush(stdout);
    }
    if ((rc = setup_checkpoints(&c, job, text, t)) != 0) {
        goto done;
    }
    if (ct_trainer_set_logging(t, job->run_dir, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s (set run_dir to a writable directory)\n", err.msg);
        rc = EXIT_BAD_INPUT;
        goto done;
    }
    cli_catch_signals();
    if (ct_profile_start(job->train.profile_steps, "chief", 0, &err) != CT_OK ||
        (ct_profile_started() && ct_profile_clear(job->run_dir, &err) != CT_OK)) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        rc = err.code == CT_EINVAL ? EXIT_BAD_INPUT : EXIT_RUNTIME;
        goto done;
    }
    progress_state ps = {.tty = isatty(STDOUT_FILENO), .quiet = c.quiet};
    ct_train_result r;
    ct_status st =
        ct_trainer_fit_loaders(t, train, eval, print_progress, &ps, &cli_stop_requested, &r, &err);
    if (ct_profile_started()) {
        write_profile(job, c.quiet, ps.tty && st != CT_OK);
    }
    if (st != CT_OK) {
        fprintf(stderr, "%sctrain: %s\n", ps.tty ? "\n" : "", err.msg);
        rc = ct_exit_code(st, cli_stop_signal, 0);
        goto done;
    }
    print_done(&r, NULL);
    rc = 0;
done:
    ct_loader_destroy(train);
    ct_loader_destroy(eval);
    ct_trainer_destroy(t);
    ct_profile_stop(); /* after the loaders' and graphs' threads are gone */
    free(text);
    ct_job_destroy(job);
    return rc;
}

/* After the data service stopped: the dispatcher and the data workers wrote their profile files
 * as they exited, after the trainer's merge; merge again with them. */
static void merge_data_service_profile(const cli *c) {
    ct_job *job = NULL;
    ct_err err = {0};
    if (ct_job_create(c->job_path, c->sets, c->n_sets, &job, NULL, &err) != CT_OK ||
        job->train.profile_steps[0] <= 0) {
        ct_job_destroy(job);
        return;
    }
    if (ct_profile_merge(job->run_dir, &err) != CT_OK) {
        fprintf(stderr, "ctrain: warning: profile: %s\n", err.msg);
    } else if (!c->quiet) {
        printf("profile: the data service's dispatcher and %d data workers merged into "
               "%s/trace.json.gz\n",
               c->data_workers, job->run_dir);
    }
    ct_job_destroy(job);
}

int cmd_train(int argc, char **argv) {
    /* from the start: a signal during loading stops the run cleanly instead of killing it */
    cli_catch_signals();
    cli c = {0};
    int rc = cli_parse_flags(argc, argv, &c, train_usage);
    if (rc) {
        return rc < 0 ? 0 : rc;
    }
    ct_log_set(CT_LOG_WARN, log_line, NULL); /* the library's warnings (a log file that failed) */
    ds_pool pool = {0};
    if (c.data_workers > 0 && (rc = ds_pool_start(&c, &pool)) != 0) {
        return rc;
    }
    if (c.elastic || (c.replicas > 1 && elastic_job(&c))) {
        c.replicas = c.replicas > 0 ? c.replicas : 1;
        rc = elastic_run_replicas(&c);
    } else if (c.replicas > 1) {
        rc = mpi_run_replicas(&c);
    } else if (c.ps > 0 || c.workers > 0) {
        rc = run_local_cluster(&c);
    } else {
        rc = train_here(c);
    }
    ds_pool_stop(&pool);
    if (c.data_workers > 0 && rc == 0) {
        merge_data_service_profile(&c);
    }
    return rc;
}
