/* A rank of a mirrored job (see role_run.h): the cluster spec, MPI, ct_mirrored_train with the
 * console's lines, the done line on rank 0, and MPI_Abort when a rank fails or stalls (the
 * others may wait in a collective). The only file of the role runtime that calls MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrain/cluster.h"
#include "ctrain/mirrored.h"
#include "role_run.h"

#if CT_HAVE_MPI
#include <mpi.h>
#endif

#define CHIEF_ADDR_MAX 256 /* the coordinator's address, broadcast to the ranks */

void ct_role_no_x_display(void) {
    const char *have = getenv("HWLOC_COMPONENTS");
    if (!have || !*have) {
        setenv("HWLOC_COMPONENTS", "-gl", 1);
        return;
    }
    if (strstr(have, "gl")) { /* the user named it: theirs to decide */
        return;
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s,-gl", have);
    setenv("HWLOC_COMPONENTS", buf, 1);
}

#if CT_HAVE_MPI
static int env_int(const char *name) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : 0;
}

/* Open MPI's defaults for this rank, read at MPI_Init, where the user set none: across hosts,
 * idle ranks yield the CPU (a spinning rank starves the kernel's network work: 7x fewer samples
 * per second between two namespace hosts on 2 cores; docs/parameter-server.md, "Addresses
 * across hosts"), and --interface / CTRAIN_INTERFACE names the TCP interface, as it does for
 * the ZeroMQ roles, unless the user excluded interfaces (btl_tcp_if_exclude: Open MPI takes
 * one of the two). */
static void mpi_defaults(const ct_role_flags *f) {
    int world = env_int("OMPI_COMM_WORLD_SIZE"), local = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
    int spans = (world > 0 && local > 0 && local < world) || env_int("SLURM_STEP_NUM_NODES") > 1;
    if (spans) {
        setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    }
    const char *iface =
        f->ps.interface && *f->ps.interface ? f->ps.interface : getenv("CTRAIN_INTERFACE");
    const char *exclude = getenv("OMPI_MCA_btl_tcp_if_exclude"); /* the user's (mpirun --mca) */
    if (iface && *iface && !(exclude && *exclude)) { /* Open MPI refuses include with exclude */
        setenv("OMPI_MCA_btl_tcp_if_include", iface, 0);
    }
}

/* Rank 0 tells a launcher that named a file in CT_ROLE_STARTED_FILE_ENV that MPI started. */
static void tell_launcher_started(int rank) {
    const char *path = getenv(CT_ROLE_STARTED_FILE_ENV);
    FILE *f = rank == 0 && path && *path ? fopen(path, "w") : NULL;
    if (f) {
        fputs("started\n", f);
        fclose(f);
    }
}

/* Prints the run's end on this rank and returns the exit code; a failed rank ends the job with
 * MPI_Abort (the others may wait in a collective): exit code 3 for a stall, whose message keeps
 * the words users and scripts know ("ctrain: stall: step ..."). */
static int end_rank(const char *role, const ct_cluster_spec *spec, ct_status st,
                    ct_mirrored_result *r, const ct_err *err) {
    int rc = ct_exit_code(st, ct_role_stop_signal, r->stalled);
    if (st == CT_OK) {
        if (spec->rank == 0) {
            char extra[32];
            snprintf(extra, sizeof extra, "replicas=%d", spec->world_size);
            ct_role_print_done(&r->train, extra);
        }
        return rc;
    }
    if (r->stalled) {
        fprintf(stderr, "ctrain: %s\n", err->msg);
    } else {
        fprintf(stderr, "%s: rank %d: %s\n", role, spec->rank, err->msg);
    }
    if (st != CT_EINTR) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, rc);
    }
    return rc;
}

/* A rank's place under mpirun (spec) and, on rank 0, the chief's checks (a new run directory
 * unless resuming). Returns 0, or the exit code after printing why. */
static int place_rank(const char *role, int chief_only, const ct_role_flags *f, const ct_job *job,
                      ct_cluster_spec *spec) {
    ct_err err = {0};
    if (ct_cluster_spec_read(f->rank, f->world_size, f->local_rank, NULL, NULL, spec, &err) !=
        CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
        return 2;
    }
    if (chief_only && spec->rank != 0) {
        fprintf(stderr,
                "%s: the chief must be rank 0, this is rank %d (%s); list it first: "
                "mpirun -np 1 ctrain-chief ... : -np N ctrain-worker ...\n",
                role, spec->rank, spec->source);
        return 2;
    }
    if (spec->rank == 0 && ct_role_start_over(f, job, &err) != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
        return 1;
    }
    return 0;
}

static int init_mpi(const char *role, const ct_role_flags *f, int *argc, char ***argv) {
    int provided = 0;
    ct_role_no_x_display();
    mpi_defaults(f);
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "%s: MPI_Init_thread failed (start me with mpirun)\n", role);
        return 1;
    }
    return 0;
}

/* A rank's start under mpirun: its place and checks, then MPI_Init. Everything that can be
 * checked without MPI comes first: a bad job or environment never reaches a collective, and
 * mpirun ends the other ranks. Returns 0, or the exit code. */
static int start_rank(const char *role, int chief_only, const ct_role_flags *f, const ct_job *job,
                      int *argc, char ***argv, ct_cluster_spec *spec) {
    int rc = place_rank(role, chief_only, f, job, spec);
    if (rc == 0) {
        rc = init_mpi(role, f, argc, argv);
    }
    if (rc == 0) {
        tell_launcher_started(spec->rank);
    }
    return rc;
}

int ct_role_run_mirrored(const char *role, int chief_only, const ct_role_flags *f,
                         const ct_job *job, const char *job_text, int *argc, char ***argv) {
    ct_err err = {0};
    ct_cluster_spec spec;
    int rc = start_rank(role, chief_only, f, job, argc, argv, &spec);
    if (rc != 0) {
        return rc;
    }
    ct_role_catch_signals();
    ct_log_set(CT_LOG_WARN, ct_role_log_line, "ctrain"); /* "ctrain: warning: ..." while resuming */
    ct_mirrored_options o = {.job_text = job_text,
                             .no_resume = f->no_resume,
                             .report = ct_role_console_reporter(f->quiet, ""),
                             .stop = &ct_role_stop_requested,
                             .slow_factor = f->ps.slow_factor};
    ct_mirrored_result r;
    ct_status st = ct_mirrored_train(job, &spec, &o, &r, &err);
    rc = end_rank(role, &spec, st, &r, &err);
    MPI_Finalize();
    return rc;
}

int ct_role_elastic_under_mpi(const ct_role_flags *f) {
    return !f->ps.cluster.chief && env_int("OMPI_COMM_WORLD_SIZE") > 1;
}

/* The chief's coordinator listens: its address to every rank (the ranks wait in the
 * broadcast; "" when the chief failed), and MPI is done: a rank that dies later must not hang
 * the others' MPI_Finalize. */
static void broadcast_address(const char *endpoint, void *user) {
    char buf[CHIEF_ADDR_MAX];
    snprintf(buf, sizeof buf, "%s", endpoint);
    MPI_Request req; /* the ranks wait in MPI_Ibcast: a blocking MPI_Bcast would not match */
    MPI_Ibcast(buf, (int)sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    MPI_Finalize();
    *(int *)user = 1;
}

/* Rank 0's address, waited for register_timeout seconds at most, sleeping between tests: a rank
 * spinning in MPI_Bcast would take a core from the chief while it starts. Returns 1 when it came
 * (and MPI is done), 0 when the wait ran out or a signal stopped it (MPI is left as it is: the
 * broadcast is still pending). */
static int receive_address(char *buf, double timeout) {
    MPI_Request req;
    MPI_Ibcast(buf, CHIEF_ADDR_MAX, MPI_CHAR, 0, MPI_COMM_WORLD, &req);
    double deadline = MPI_Wtime() + timeout;
    int done = 0;
    while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
        if (MPI_Wtime() > deadline || ct_role_stop_requested) {
            return 0;
        }
        struct timespec nap = {0, 10 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    MPI_Finalize();
    return done;
}

static int run_elastic_rank0(const char *role, const ct_role_flags *f, const ct_job *job,
                             const char *job_text, const ct_cluster_spec *spec) {
    int local = env_int("OMPI_COMM_WORLD_LOCAL_SIZE"), sent = 0;
    /* one host: loopback; several: an address the others reach */
    int rc = ct_role_elastic_rank(role, 1, NULL, local == spec->world_size ? NULL : "0.0.0.0:0", f,
                                  job, job_text, broadcast_address, &sent);
    if (!sent) { /* it failed before listening: the ranks wait in the broadcast */
        broadcast_address("", &sent);
    }
    return rc;
}

static int run_elastic_other(const char *role, const ct_role_flags *f, const ct_job *job,
                             const char *job_text, int rank) {
    char chief[CHIEF_ADDR_MAX] = "";
    double timeout = job->ps.register_timeout; /* the elastic coordinator's too */
    if (receive_address(chief, timeout)) {
        if (chief[0]) {
            return ct_role_elastic_rank(role, 0, chief, NULL, f, job, job_text, NULL, NULL);
        }
        fprintf(stderr,
                "%s: rank %d: the chief (rank 0) failed before its coordinator listened (its own "
                "line says why)\n",
                role, rank);
        return 1;
    }
    if (ct_role_stop_requested) {
        return ct_exit_code(CT_EINTR, ct_role_stop_signal, 0);
    }
    fprintf(stderr,
            "%s: rank %d: rank 0 (the chief) did not say its coordinator's address in %g s "
            "(strategy.register_timeout); its own lines say why\n",
            role, rank, timeout);
    return 1;
}

/* Every rank reaches MPI_Init before any check: under --enable-recovery a rank that ended
 * before it would leave the others waiting there for ever (and MPI_Abort ends no other rank).
 * The ranks then agree on their checks (one failed: all end, rank 0 saying so) before the
 * chief starts. mpirun --enable-recovery exits 0 whatever its ranks return: their lines say. */
int ct_role_run_elastic_mpi(const char *role, int chief_only, const ct_role_flags *f,
                            const ct_job *job, const char *job_text, int *argc, char ***argv) {
    int rank = 0, worst = 0;
    if (init_mpi(role, f, argc, argv) != 0) {
        return 1;
    }
    /* A rank that gave up waiting for the address (register_timeout) ends without finishing
     * the broadcast: the chief's MPI_Wait and MPI_Finalize then meet a dead peer, which must
     * not end the chief (MPI_ERRORS_ARE_FATAL would) */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    ct_cluster_spec spec;
    int rc = place_rank(role, chief_only, f, job, &spec);
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (worst != 0) {
        if (rank == 0 && rc == 0) {
            fprintf(stderr, "%s: rank 0: another rank failed to start (its own line says why)\n",
                    role);
        }
        MPI_Finalize();
        return rc ? rc : worst;
    }
    tell_launcher_started(spec.rank);
    ct_role_catch_signals();
    return rank == 0 ? run_elastic_rank0(role, f, job, job_text, &spec)
                     : run_elastic_other(role, f, job, job_text, rank);
}
#else
int ct_role_elastic_under_mpi(const ct_role_flags *f) {
    (void)f;
    return 0;
}

int ct_role_run_elastic_mpi(const char *role, int chief_only, const ct_role_flags *f,
                            const ct_job *job, const char *job_text, int *argc, char ***argv) {
    return ct_role_run_mirrored(role, chief_only, f, job, job_text, argc, argv);
}

int ct_role_run_mirrored(const char *role, int chief_only, const ct_role_flags *f,
                         const ct_job *job, const char *job_text, int *argc, char ***argv) {
    (void)chief_only;
    (void)f;
    (void)job;
    (void)job_text;
    (void)argc;
    (void)argv;
    ct_err err = {0};
    ct_mirrored_check_build(&err); /* this build has no MPI: the one line that says so */
    fprintf(stderr, "%s: %s\n", role, err.msg);
    return 2;
}
#endif
