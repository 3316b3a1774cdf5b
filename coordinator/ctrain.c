/* ctrain: the standalone launcher. `ctrain train [JOB] [--set key=value ...]` trains a job on
 * this machine; `ctrain summary JOB` prints the model; `ctrain graph JOB` the compiled step. A thin
 * main: parse flags, load the job and data through the library, run, print, map the status to an
 * exit code (0 ok, 1 runtime failure, 2 bad input, 130 interrupted). */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_cmd.h"
#include "ctrain/ctrain.h"
#include "ctrain/mirrored.h"
#include "ctrain/net.h"
#include "ctrain/npz.h"
#include "ctrain/report.h"
#include "ps_launch.h"

#define EXIT_RUNTIME 1
#define EXIT_BAD_INPUT 2
#define MAX_SETS 64

static volatile int stop_requested = 0;
static volatile int stop_signal = 0;

static void on_signal(int sig) {
    stop_signal = sig;
    stop_requested = 1;
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: ctrain <command> [options]\n"
        "\n"
        "commands:\n"
        "  train [JOB.yaml]    train a job on this machine (default job: the Fashion-MNIST MLP,\n"
        "                      %s)\n"
        "  summary [JOB.yaml]  print the model's layers, output shapes and parameter counts\n"
        "  graph [JOB.yaml]    print the optimized step graph, fused groups and memory plan\n"
        "  ckpt ls|show|diff|export  inspect, compare and export checkpoints\n"
        "  keygen DIR          make a parameter-server job's CURVE keys (strategy.keys: DIR)\n"
        "  version             print the version\n"
        "\n"
        "Run 'ctrain <command> --help' for the options of a command.\n",
        CT_DEFAULT_JOB);
}

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
        "  --init-from F.npz start from the weights in a NumPy .npz (one array per variable,\n"
        "                    named as in 'ctrain summary'; e.g. from 'ctrain ckpt export');\n"
        "                    ignored when the run resumes from its own checkpoint\n"
        "  --replicas N      train with the mirrored strategy on N local MPI ranks (runs\n"
        "                    mpirun -np N ctrain-worker; needs Open MPI's mpirun)\n"
        "  --ps M --workers N  train with the parameter-server strategy: the chief here,\n"
        "                    M ctrain-ps and N ctrain-worker processes on loopback,\n"
        "                    restarted if they die (strategy.mode: sync or async)\n"
        "  --straggler F     benchmarks: worker 0 runs F times slower (with --ps/--workers)\n"
        "  --no-resume       start over even if the checkpoint directory has a checkpoint\n"
        "                    (the old directory is kept, renamed DIR.previous-<time>)\n"
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

typedef struct cli {
    const char *job_path;
    const char *sets[MAX_SETS + 2];
    int n_sets;
    int quiet;
    int no_resume;
    int replicas;
    int ps, workers; /* --ps M --workers N: a local parameter-server cluster */
    double straggler;
    const char *init_from;
    char threads_set[64];
} cli;

/* Parses train/summary flags; returns 0, or the exit code to leave with. */
static int parse_flags(int argc, char **argv, cli *c, void (*help)(FILE *)) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return -1;
        } else if (!strcmp(a, "--set") || !strcmp(a, "--threads")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ctrain: %s needs a value (see --help)\n", a);
                return EXIT_BAD_INPUT;
            }
            if (c->n_sets >= MAX_SETS) {
                fprintf(stderr, "ctrain: too many --set options (at most %d)\n", MAX_SETS);
                return EXIT_BAD_INPUT;
            }
            if (!strcmp(a, "--threads")) {
                snprintf(c->threads_set, sizeof c->threads_set, "train.threads=%s", argv[++i]);
                c->sets[c->n_sets++] = c->threads_set;
            } else {
                c->sets[c->n_sets++] = argv[++i];
            }
        } else if (!strncmp(a, "--set=", 6)) {
            c->sets[c->n_sets++] = a + 6;
        } else if (!strcmp(a, "--eager")) {
            c->sets[c->n_sets++] = "train.eager=true";
        } else if (!strcmp(a, "--quiet")) {
            c->quiet = 1;
        } else if (!strcmp(a, "--no-resume")) {
            c->no_resume = 1;
        } else if (!strcmp(a, "--replicas")) {
            char *end = NULL;
            long n = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (!end || *end || n < 1 || n > 4096) {
                fprintf(stderr, "ctrain: --replicas needs a count from 1 to 4096\n");
                return EXIT_BAD_INPUT;
            }
            c->replicas = (int)n;
            i++;
        } else if (!strcmp(a, "--ps") || !strcmp(a, "--workers")) {
            char *end = NULL;
            int max = !strcmp(a, "--ps") ? 64 : 1024;
            long n = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (!end || *end || n < 1 || n > max) {
                fprintf(stderr, "ctrain: %s needs a count from 1 to %d\n", a, max);
                return EXIT_BAD_INPUT;
            }
            *(!strcmp(a, "--ps") ? &c->ps : &c->workers) = (int)n;
            i++;
        } else if (!strcmp(a, "--straggler")) {
            char *end = NULL;
            c->straggler = i + 1 < argc ? strtod(argv[i + 1], &end) : 0.0;
            if (!end || *end || !(c->straggler >= 1.0 && c->straggler <= 1000.0)) {
                fprintf(stderr, "ctrain: --straggler needs a slowdown factor from 1 to 1000\n");
                return EXIT_BAD_INPUT;
            }
            i++;
        } else if (!strcmp(a, "--init-from")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ctrain: --init-from needs a .npz file (see --help)\n");
                return EXIT_BAD_INPUT;
            }
            c->init_from = argv[++i];
        } else if (a[0] == '-') {
            fprintf(stderr, "ctrain: unknown option '%s' (see --help)\n", a);
            return EXIT_BAD_INPUT;
        } else if (!c->job_path) {
            c->job_path = a;
        } else {
            fprintf(stderr, "ctrain: unexpected argument '%s' (one job file at most)\n", a);
            return EXIT_BAD_INPUT;
        }
    }
    if (!c->job_path) {
        c->job_path = access("examples/fashion_mnist_mlp.yaml", R_OK) == 0
                          ? "examples/fashion_mnist_mlp.yaml"
                          : CT_DEFAULT_JOB;
    }
    return 0;
}

/* Loads one data split; NULL (and a message) on failure. */
static ct_dataset *load_split(const ct_job *job, const ct_data_spec *d, const char *key) {
    ct_dataset *ds = NULL;
    ct_err err = {0};
    if (ct_dataset_load_idx(d->images, d->labels, d->limit, &ds, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s: %s: %s\n", job->path, key, err.msg);
        return NULL;
    }
    int64_t want = 1;
    for (int k = 0; k < job->input_rank; k++) {
        want *= job->input_shape[k];
    }
    if (ds->example_size != want) {
        char s[96];
        ct_shape es = ct_shape_make(ds->rank, ds->example_shape);
        fprintf(stderr,
                "ctrain: %s: model.input_shape has %lld values per example but %s (%s) has %s "
                "= %lld\n",
                job->path, (long long)want, key, d->images, ct_shape_str(&es, s, sizeof s),
                (long long)ds->example_size);
        ct_dataset_destroy(ds);
        return NULL;
    }
    return ds;
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
        } else if (a->dtype != CT_F32 || !ct_shape_equal(&got, &want)) {
            fprintf(stderr, "ctrain: --init-from %s: '%s' is %s%s, the model needs f32%s\n", path,
                    p->items[i].name, ct_dtype_name(a->dtype), ct_shape_str(&got, sg, sizeof sg),
                    ct_shape_str(&want, sw, sizeof sw));
            rc = EXIT_BAD_INPUT;
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

/* --no-resume: moves the old checkpoint directory aside. Returns 0 or an exit code. */
static int move_aside(const cli *c, const ct_job *job) {
    char dir[2048], old[2100];
    checkpoint_dir(job, dir);
    if (!c->no_resume || access(dir, F_OK) != 0) {
        return 0;
    }
    snprintf(old, sizeof old, "%s.previous-%ld", dir, (long)time(NULL));
    if (rename(dir, old) != 0) {
        fprintf(stderr, "ctrain: --no-resume: cannot move %s aside\n", dir);
        return EXIT_RUNTIME;
    }
    if (!c->quiet) {
        printf("starting over: moved the old checkpoints to %s\n", old);
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
    if (resumed && (pos[1] >= job->epochs || (job->max_steps > 0 && pos[0] >= job->max_steps))) {
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

/* --replicas N: replaces this process with mpirun -np N ctrain-worker (same job and flags). */
static int run_replicas(const cli *c) {
    ct_err err = {0};
    if (ct_mirrored_check_build(&err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    char self[PATH_MAX], worker[PATH_MAX + 32];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "ctrain: --replicas: cannot find my own binary\n");
        return EXIT_RUNTIME;
    }
    self[len] = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(worker, sizeof worker, "%s/ctrain-worker", self); /* installed side by side */
    if (access(worker, X_OK) != 0) {
        snprintf(worker, sizeof worker, "%s/../worker/ctrain-worker", self); /* build tree */
    }
    char np[16];
    snprintf(np, sizeof np, "%d", c->replicas);
    const char *argv[2 * MAX_SETS + 24];
    int n = 0;
    argv[n++] = "mpirun";
    if (getuid() == 0) {
        argv[n++] = "--allow-run-as-root";
    }
    argv[n++] = "--oversubscribe";
    argv[n++] = "-np";
    argv[n++] = np;
    argv[n++] = worker;
    argv[n++] = "--job";
    argv[n++] = c->job_path;
    argv[n++] = "--set";
    argv[n++] = "strategy.type=mirrored";
    for (int i = 0; i < c->n_sets; i++) {
        argv[n++] = "--set";
        argv[n++] = c->sets[i];
    }
    if (c->no_resume) {
        argv[n++] = "--no-resume";
    }
    if (c->quiet) {
        argv[n++] = "--quiet";
    }
    argv[n] = NULL;
    fflush(stdout);
    execvp("mpirun", (char *const *)argv);
    fprintf(stderr,
            "ctrain: --replicas %d needs Open MPI's mpirun on PATH (Debian: apt install "
            "openmpi-bin)\n",
            c->replicas);
    return EXIT_RUNTIME;
}

static void log_line(ct_log_level level, const char *msg, void *user) {
    (void)level;
    (void)user;
    fprintf(stderr, "ctrain: %s\n", msg);
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
    ct_job job;
    ct_err err = {0};
    char *text = NULL;
    if (ct_job_load_text(c->job_path, c->sets, c->n_sets, &job, &text, &err) != CT_OK) {
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
                           .stop = &stop_requested};
    if (move_aside(c, &job) != 0) {
        free(text);
        return EXIT_RUNTIME;
    }
    ct_train_result r;
    ct_status st = ct_run_local_cluster(&lc, &job, &r, &err);
    free(text);
    if (st != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return ct_exit_code(st, stop_signal, 0);
    }
    char extra[64];
    snprintf(extra, sizeof extra, "ps=%d workers=%d", lc.n_ps, lc.n_workers);
    print_done(&r, extra);
    return 0;
}

static int cmd_train(int argc, char **argv) {
    /* from the start: a signal during loading stops the run cleanly instead of killing it */
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    cli c = {0};
    int rc = parse_flags(argc, argv, &c, train_usage);
    if (rc) {
        return rc < 0 ? 0 : rc;
    }
    ct_log_set(CT_LOG_WARN, log_line, NULL); /* the library's warnings (a log file that failed) */
    if (c.replicas > 1) {
        return run_replicas(&c);
    }
    if (c.ps > 0 || c.workers > 0) {
        return run_local_cluster(&c);
    }
    ct_job job;
    ct_err err = {0};
    char *text = NULL;
    if (ct_job_load_text(c.job_path, c.sets, c.n_sets, &job, &text, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    ct_trainer *t = NULL;
    ct_dataset *train = NULL, *eval = NULL;
    rc = EXIT_BAD_INPUT;
    if (ct_trainer_create(&job, &t, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        goto done;
    }
    if (!(train = load_split(&job, &job.train_data, "data.train")) ||
        (job.has_eval_data && !(eval = load_split(&job, &job.eval_data, "data.eval")))) {
        goto done;
    }
    int64_t outputs = ct_model_output_size(ct_trainer_model(t));
    if (train->n_classes > outputs || (eval && eval->n_classes > outputs)) {
        fprintf(stderr,
                "ctrain: %s: the data has %d classes but the model outputs %lld scores "
                "(set the last dense layer's units to at least %d)\n",
                job.path,
                eval && eval->n_classes > train->n_classes ? eval->n_classes : train->n_classes,
                (long long)outputs, train->n_classes);
        goto done;
    }
    if (!c.quiet) {
        const ct_params *p = ct_trainer_params(t);
        int64_t count = 0;
        for (int i = 0; i < p->n; i++) {
            count += p->items[i].trainable ? p->items[i].size : 0;
        }
        printf("job %s: %lld training and %lld test examples, %lld parameters, %d epochs of "
               "batch %d\n",
               job.path, (long long)train->n, eval ? (long long)eval->n : 0LL, (long long)count,
               job.epochs, job.batch_size);
        fflush(stdout);
    }
    if ((rc = setup_checkpoints(&c, &job, text, t)) != 0) {
        goto done;
    }
    if (ct_trainer_set_logging(t, job.run_dir, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s (set run_dir to a writable directory)\n", err.msg);
        rc = EXIT_BAD_INPUT;
        goto done;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    progress_state ps = {.tty = isatty(STDOUT_FILENO), .quiet = c.quiet};
    ct_train_result r;
    ct_status st = ct_trainer_fit(t, train, eval, print_progress, &ps, &stop_requested, &r, &err);
    if (st != CT_OK) {
        fprintf(stderr, "%sctrain: %s\n", ps.tty ? "\n" : "", err.msg);
        rc = ct_exit_code(st, stop_signal, 0);
        goto done;
    }
    print_done(&r, NULL);
    rc = 0;
done:
    ct_dataset_destroy(train);
    ct_dataset_destroy(eval);
    ct_trainer_destroy(t);
    free(text);
    return rc;
}

static void summary_usage(FILE *f) {
    fprintf(f,
            "usage: ctrain summary [JOB.yaml] [--set KEY=VALUE ...]\n"
            "Prints each layer's output shape and parameter count (default job: %s).\n",
            CT_DEFAULT_JOB);
}

static int cmd_summary(int argc, char **argv) {
    cli c = {0};
    int rc = parse_flags(argc, argv, &c, summary_usage);
    if (rc) {
        return rc < 0 ? 0 : rc;
    }
    ct_job job;
    ct_err err = {0};
    ct_model *m = NULL;
    if (ct_job_load(c.job_path, c.sets, c.n_sets, &job, &err) != CT_OK ||
        ct_model_create(&job, &m, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    ct_model_summary(m, stdout);
    ct_model_destroy(m);
    return 0;
}

static void graph_usage(FILE *f) {
    fprintf(f,
            "usage: ctrain graph [JOB.yaml] [options]\n"
            "\n"
            "Traces JOB's training step (forward, backward, optimizer update), runs the graph\n"
            "passes and the memory planner, and prints the optimized graph: one line per op with\n"
            "its inputs and shape, fused groups as fused{op,op,...}, then what each pass did,\n"
            "the memory plan (peak bytes of intermediates before and after planning), the\n"
            "executor's split nodes, row-pipeline links (and memory-reuse waits that hold\n"
            "them back), matmuls split over k, and the fused optimizer updates.\n"
            "\n"
            "options:\n"
            "  --batch N         batch size to trace (default: train.batch_size)\n"
            "  --eval            the inference graph instead of the training step\n"
            "  --passes LIST     all, none, or a comma list of const_fold, cse, dce, simplify,\n"
            "                    fuse, fuse_update (= --set train.graph_passes=LIST)\n"
            "  --no-plan         no memory planning (= --set train.plan_memory=false)\n"
            "  --dot FILE        also write the graph in Graphviz dot to FILE\n"
            "  --set KEY=VALUE   override a job field (repeatable)\n"
            "  --threads N       executor threads (= --set train.threads=N)\n"
            "  -h, --help        show this help\n"
            "exit codes: 0 success, 1 runtime failure, 2 bad input\n");
}

static int cmd_graph(int argc, char **argv) {
    cli c = {0};
    const char *dot = NULL;
    long long batch = 0;
    int eval = 0;
    char passes_set[160];
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int n_rest = 0, rc = 0;
    if (!rest) {
        return EXIT_RUNTIME;
    }
    for (int i = 0; i < argc && !rc; i++) {
        const char *a = argv[i];
        int needs = !strcmp(a, "--batch") || !strcmp(a, "--dot") || !strcmp(a, "--passes");
        if (needs && i + 1 >= argc) {
            fprintf(stderr, "ctrain: %s needs a value (see --help)\n", a);
            rc = EXIT_BAD_INPUT;
        } else if (!strcmp(a, "--batch")) {
            char *end;
            batch = strtoll(argv[++i], &end, 10);
            if (*end || batch < 1) {
                fprintf(stderr, "ctrain: --batch needs a positive integer, got '%s'\n", argv[i]);
                rc = EXIT_BAD_INPUT;
            }
        } else if (!strcmp(a, "--dot")) {
            dot = argv[++i];
        } else if (!strcmp(a, "--passes")) {
            snprintf(passes_set, sizeof passes_set, "train.graph_passes=%s", argv[++i]);
            c.sets[c.n_sets++] = passes_set;
        } else if (!strcmp(a, "--no-plan")) {
            c.sets[c.n_sets++] = "train.plan_memory=false";
        } else if (!strcmp(a, "--eval")) {
            eval = 1;
        } else {
            rest[n_rest++] = argv[i];
        }
    }
    if (!rc) {
        rc = parse_flags(n_rest, rest, &c, graph_usage);
    }
    free(rest);
    if (rc) {
        return rc < 0 ? 0 : rc;
    }
    ct_job job;
    ct_err err = {0};
    ct_trainer *t = NULL;
    ct_graph *g = NULL;
    if (ct_job_load(c.job_path, c.sets, c.n_sets, &job, &err) != CT_OK ||
        ct_trainer_create(&job, &t, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        ct_trainer_destroy(t);
        return EXIT_BAD_INPUT;
    }
    if (ct_trainer_step_graph(t, batch ? batch : job.batch_size,
                              eval ? CT_GRAPH_EVAL : CT_GRAPH_TRAIN, &g, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        ct_trainer_destroy(t);
        return EXIT_RUNTIME;
    }
    const ct_graph_stats *st = ct_graph_get_stats(g);
    char names[128];
    printf("# %s graph of %s, batch %lld; passes: %s\n", eval ? "inference" : "training-step",
           job.path, batch ? batch : (long long)job.batch_size,
           ct_graph_passes_str(job.graph_passes, names, sizeof names));
    ct_graph_print(g, stdout);
    printf("# nodes: %d traced, %d after passes (folded %d, merged %d, simplified %d, removed "
           "%d)\n",
           st->nodes_in, st->nodes_out, st->folded, st->merged, st->simplified, st->removed);
    printf("# fusion: %d fused groups replacing %d ops\n", st->fused_groups, st->fused_ops);
    printf("# memory: intermediates %lld bytes unplanned, %lld bytes planned (%s; %.2fx less), "
           "%d in place\n",
           (long long)st->bytes_unplanned, (long long)st->bytes_planned,
           job.plan_memory ? "liveness plan" : "planning off",
           st->bytes_planned ? (double)st->bytes_unplanned / (double)st->bytes_planned : 1.0,
           st->in_place);
    printf("# executor: %d threads, %d nodes split across them, %d edges linked part to part "
           "(row pipelines), %d memory-reuse waits holding them back; matmuls split over k: "
           "%d x W (each thread reads the weight rows it updates), %d x^T dy (each thread "
           "multiplies its pipeline's rows)\n",
           st->threads, st->split_nodes, st->linked_edges, st->pipeline_waits, st->inner_splits,
           st->batch_splits);
    if (st->fused_updates > 0) {
        printf("# optimizer: the update follows %d gradient writers (%d queued after sibling "
               "readers of the weight); %lld floats left to apply_optimizer\n",
               st->fused_updates, st->deferred_updates, (long long)st->update_rest);
    }
    if (dot) {
        FILE *f = fopen(dot, "w");
        if (!f) {
            fprintf(stderr, "ctrain: cannot write %s (check the directory exists)\n", dot);
            ct_trainer_destroy(t);
            return EXIT_BAD_INPUT;
        }
        ct_graph_write_dot(g, f);
        fclose(f);
        printf("# wrote %s\n", dot);
    }
    ct_trainer_destroy(t);
    return 0;
}

/* ctrain keygen DIR: the CURVE keys of a parameter-server job (see ctrain/net.h). */
static int cmd_keygen(int argc, char **argv) {
    if (argc == 1 && (!strcmp(argv[0], "-h") || !strcmp(argv[0], "--help"))) {
        printf("usage: ctrain keygen DIR\n"
               "Writes a parameter-server job's CURVE keys into DIR (created, mode 0700):\n"
               "server.key/server.pub (the chief's and the servers'), client.key/client.pub (the\n"
               "members'), and authorized_keys (the client keys servers admit; add more there).\n"
               "Point the job at them with strategy.keys: DIR (or --keys DIR on the roles);\n"
               "copy DIR to every machine of the job. Existing keys are never overwritten.\n");
        return 0;
    }
    if (argc != 1 || argv[0][0] == '-') {
        fprintf(stderr, "ctrain: keygen needs one directory: ctrain keygen DIR\n");
        return EXIT_BAD_INPUT;
    }
    ct_err err = {0};
    ct_status st = ct_net_keygen(argv[0], &err);
    if (st != CT_OK) {
        fprintf(stderr, "ctrain: keygen: %s\n", err.msg);
        return st == CT_EIO ? EXIT_RUNTIME : EXIT_BAD_INPUT;
    }
    printf("wrote the job's CURVE keys to %s (use strategy.keys: %s)\n", argv[0], argv[0]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return EXIT_BAD_INPUT;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        /* the second line tells scripts and tests whether the mirrored strategy is built in */
        printf("ctrain %s\nmpi: %s\n", CT_VERSION,
               ct_mirrored_check_build(NULL) == CT_OK ? "yes" : "no");
        return 0;
    }
    if (!strcmp(cmd, "train")) {
        return cmd_train(argc - 2, argv + 2);
    }
    if (!strcmp(cmd, "summary")) {
        return cmd_summary(argc - 2, argv + 2);
    }
    if (!strcmp(cmd, "graph")) {
        return cmd_graph(argc - 2, argv + 2);
    }
    if (!strcmp(cmd, "ckpt")) {
        return ckpt_main(argc - 2, argv + 2);
    }
    if (!strcmp(cmd, "keygen")) {
        return cmd_keygen(argc - 2, argv + 2);
    }
    fprintf(stderr,
            "ctrain: unknown command '%s' (commands: train, summary, graph, ckpt, keygen, "
            "version)\n",
            cmd);
    return EXIT_BAD_INPUT;
}
