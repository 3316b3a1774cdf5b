/* The shared main of the MPI roles (ctrain-chief, ctrain-worker): flags, MPI, the cluster spec,
 * the mirrored strategy, the done line on the chief, exit codes. The role binaries are a call to
 * ct_role_main. */
#include "ctrain/role.h"

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/cluster.h"
#include "ctrain/mirrored.h"
#include "ps_role.h"

#define EXIT_RUNTIME 1
#define EXIT_BAD_INPUT 2

static volatile int stop_requested = 0;
static volatile int stop_signal = 0;

static void on_signal(int sig) {
    stop_signal = sig;
    stop_requested = 1;
}

/* ctrain-ps serves parameter-server jobs only. */
static void ps_usage(FILE *f) {
    fprintf(f,
            "usage: ctrain-ps --job JOB.yaml --chief HOST:PORT --task ps:I [options]\n"
            "       (or TF_CONFIG / --cluster FILE naming the cluster and this task; or any role\n"
            "       binary under srun/mpirun: rank 0 the chief, 1..M the servers, see --num-ps)\n"
            "\n"
            "A parameter server of a job with strategy.type parameter_server: it holds its shards\n"
            "of the variables and their optimizer slots, answers the workers' pulls and applies\n"
            "their gradients (sync, or async with strategy.staleness.policy), and reports to the\n"
            "chief, which restores it from checkpoints.\n"
            "\n"
            "options:\n"
            "  --job FILE          the job file (required; the same as the chief's)\n"
            "  --set KEY=VALUE     override a job field (repeatable; the same as the chief's)\n"
            "  --task ps:I         this server's index\n"
            "  --chief HOST:PORT   the chief's address\n"
            "  --cluster FILE      a cluster file in TF_CONFIG's layout (YAML or JSON)\n"
            "  --bind HOST:PORT    where to listen (default 127.0.0.1:0; port 0: any free port)\n"
            "  --num-ps M          servers in the job (under srun/mpirun: ranks 1..M are servers)\n"
            "  --keys DIR          CURVE keys from 'ctrain keygen DIR' (= strategy.keys)\n"
            "  -h, --help          show this help\n"
            "\n"
            "exit codes: 0 the job is done, 1 runtime failure (the chief silent for\n"
            "strategy.chief_timeout, or the job failed), 2 bad input, 130 SIGINT, 143 SIGTERM\n");
}

static void usage(FILE *f, const char *role) {
    if (!strcmp(role, "ctrain-ps")) {
        ps_usage(f);
        return;
    }
    fprintf(f,
            "usage: mpirun -np N %s --job JOB.yaml [options]\n"
            "       mpirun -np 1 ctrain-chief --job J : -np N-1 ctrain-worker --job J\n"
            "\n"
            "Trains JOB with the mirrored strategy: synchronous data parallelism, one replica per\n"
            "MPI rank, gradients all-reduced in buckets while backward runs. Rank 0 is the chief:\n"
            "it writes checkpoints and logs to run_dir and prints the done line. ctrain-chief\n"
            "must be rank 0.\n"
            "\n"
            "options:\n"
            "  --job FILE          the job file (required)\n"
            "  --set KEY=VALUE     override a job field (repeatable)\n"
            "  --rank R, --world-size N, --local-rank L\n"
            "                      the cluster spec by hand (default: from Open MPI, PMIx or\n"
            "                      Slurm variables; all sources must agree with MPI)\n"
            "  --no-resume         do not resume from the run's checkpoint\n"
            "  --quiet             only the done line\n"
            "  -h, --help          show this help\n"
            "\n"
            "strategy keys: strategy.bucket_bytes (1 MiB), strategy.stall_timeout (60 s),\n"
            "strategy.check_every (0: off), strategy.compression (none)\n"
            "\n"
            "With strategy.type parameter_server the roles are separate processes that talk\n"
            "over ZeroMQ (no MPI): ctrain-chief, ctrain-ps and ctrain-worker, e.g.\n"
            "  ctrain-chief --job J --bind HOST:PORT --num-ps 2 --num-workers 4\n"
            "  ctrain-ps --job J --chief HOST:PORT --task ps:0\n"
            "  ctrain-worker --job J --chief HOST:PORT --task worker:0\n"
            "or with TF_CONFIG (or --cluster FILE) naming the tasks and their addresses.\n"
            "  --task TYPE:INDEX   this process's task (chief, ps:I, worker:I)\n"
            "  --chief HOST:PORT   the chief's address (workers and servers)\n"
            "  --cluster FILE      a cluster file in TF_CONFIG's layout (YAML or JSON)\n"
            "  --bind HOST:PORT    where a chief or server listens (port 0: any free port)\n"
            "  --num-ps M, --num-workers N  the chief: how many (default: the cluster's lists)\n"
            "  --keys DIR          CURVE keys from 'ctrain keygen DIR' (= strategy.keys)\n"
            "  --slow-factor F     benchmarks only: a worker sleeps (F - 1) x its compute time\n"
            "\n"
            "exit codes: 0 success, 1 runtime failure, 2 bad input, 3 a stalled rank (named by\n"
            "the chief), 130 SIGINT, 143 SIGTERM (after the chief saved a checkpoint)\n",
            role);
}

static int parse_int(const char *flag, const char *v, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end || x < 0 || x > 1 << 24) {
        fprintf(stderr, "ctrain: %s needs a non-negative integer, got '%s'\n", flag, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* Flags of the parameter-server roles; 1 when `a` was one of them (i advanced past its value). */
static int ps_flag(const char *a, int argc, char **argv, int *i, ct_ps_role_flags *f) {
    if (*i + 1 >= argc) {
        return 0;
    }
    const char **str = !strcmp(a, "--task")      ? &f->cluster.task
                       : !strcmp(a, "--chief")   ? &f->cluster.chief
                       : !strcmp(a, "--cluster") ? &f->cluster.cluster_file
                       : !strcmp(a, "--bind")    ? &f->bind
                       : !strcmp(a, "--keys")    ? &f->keys
                                                 : NULL;
    if (str) {
        *str = argv[++*i];
        return 1;
    }
    int *num = !strcmp(a, "--num-ps")        ? &f->n_ps
               : !strcmp(a, "--num-workers") ? &f->n_workers
                                             : NULL;
    if (num) {
        *num = parse_int(a, argv[++*i], num) == 0 ? *num : -2;
        return 1;
    }
    if (!strcmp(a, "--slow-factor")) {
        char *end;
        f->slow_factor = strtod(argv[++*i], &end);
        if (*end || !(f->slow_factor >= 1.0 && f->slow_factor <= 1000.0)) {
            fprintf(stderr, "ctrain: --slow-factor needs a number from 1 to 1000, got '%s'\n",
                    argv[*i]);
            f->n_ps = -2;
        }
        return 1;
    }
    return 0;
}

int ct_role_main(int argc, char **argv, const char *role) {
    const char *job_path = NULL, *sets[64];
    int n_sets = 0, rank = -1, size = -1, local = -1, no_resume = 0, quiet = 0;
    ct_ps_role_flags psf = {.n_ps = -1, .n_workers = -1, .slow_factor = 1.0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout, role);
            return 0;
        } else if (ps_flag(a, argc, argv, &i, &psf)) {
            if (psf.n_ps == -2 || psf.n_workers == -2) {
                return EXIT_BAD_INPUT;
            }
        } else if (!strcmp(a, "--job") && has) {
            job_path = argv[++i];
        } else if (!strcmp(a, "--set") && has && n_sets < 64) {
            sets[n_sets++] = argv[++i];
        } else if (!strcmp(a, "--rank") && has) {
            if (parse_int(a, argv[++i], &rank) != 0) {
                return EXIT_BAD_INPUT;
            }
        } else if (!strcmp(a, "--world-size") && has) {
            if (parse_int(a, argv[++i], &size) != 0) {
                return EXIT_BAD_INPUT;
            }
        } else if (!strcmp(a, "--local-rank") && has) {
            if (parse_int(a, argv[++i], &local) != 0) {
                return EXIT_BAD_INPUT;
            }
        } else if (!strcmp(a, "--no-resume")) {
            no_resume = 1;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else {
            fprintf(stderr, "%s: unknown or incomplete option '%s' (see --help)\n", role, a);
            return EXIT_BAD_INPUT;
        }
    }
    if (!job_path) {
        fprintf(stderr, "%s: --job is required (see --help)\n", role);
        return EXIT_BAD_INPUT;
    }
    ct_err err = {0};
    ct_job job;
    if (ct_job_load(job_path, sets, n_sets, &job, &err) != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
        return EXIT_BAD_INPUT;
    }
    if (!strcmp(job.strategy, "parameter_server") || !strcmp(role, "ctrain-ps")) {
        char *text = ct_job_text(job_path, sets, n_sets);
        psf.no_resume = no_resume;
        psf.quiet = quiet;
        int rc = ct_ps_role_main(role, &job, text, &psf);
        free(text);
        return rc;
    }
    /* everything that can be checked without MPI first: a bad job or environment never
     * reaches a collective */
    ct_cluster_spec spec;
    if (ct_cluster_spec_read(rank, size, local, NULL, NULL, &spec, &err) != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
        return EXIT_BAD_INPUT;
    }
    if (!strcmp(role, "ctrain-chief") && spec.rank != 0) {
        fprintf(stderr,
                "%s: the chief must be rank 0, this is rank %d (%s); list it first: "
                "mpirun -np 1 ctrain-chief ... : -np N ctrain-worker ...\n",
                role, spec.rank, spec.source);
        return EXIT_BAD_INPUT;
    }
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "%s: MPI_Init_thread failed (start me with mpirun)\n", role);
        return EXIT_RUNTIME;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    char *text = ct_job_text(job_path, sets, n_sets);
    ct_mirrored_options o = {.job_text = text,
                             .no_resume = no_resume,
                             .quiet = quiet,
                             .out = stdout,
                             .stop = &stop_requested};
    ct_train_result r;
    ct_status st = ct_mirrored_train(&job, &spec, &o, &r, &err);
    free(text);
    int rc = 0;
    if (st != CT_OK) {
        fprintf(stderr, "%s: rank %d: %s\n", role, spec.rank, err.msg);
        rc = st == CT_EINTR ? (stop_signal == SIGTERM ? 143 : 130)
                            : (st == CT_EINVAL ? EXIT_BAD_INPUT : EXIT_RUNTIME);
        if (st != CT_EINTR) {
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, rc); /* the others may wait in a collective */
        }
    } else if (spec.rank == 0) {
        printf("done: epochs=%d steps=%lld test_loss=%.6f test_accuracy=%.6f seconds=%.3f "
               "samples_per_s=%.1f replicas=%d\n",
               r.epochs, (long long)r.steps, r.test_loss, r.test_accuracy, r.seconds,
               r.samples_per_s * spec.world_size, spec.world_size);
    }
    MPI_Finalize();
    return rc;
}
