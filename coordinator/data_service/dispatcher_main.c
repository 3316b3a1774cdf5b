/* ctrain-dispatcher: the data service's dispatcher (docs/data-service.md; dispatcher.c). A thin
 * main: flags, the job, the address, the role, the exit code. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/data_service.h"
#include "ctrain/job.h"
#include "ctrain/net.h"
#include "ctrain/role.h"
#include "dispatcher.h"

static volatile int stop_requested = 0;
static volatile int stop_signal = 0;

static void on_signal(int sig) {
    if (stop_requested) {
        _Exit(128 + sig); /* a second signal: no more waiting for the data workers */
    }
    stop_signal = sig;
    stop_requested = 1;
}

static void log_line(ct_log_level level, const char *msg, void *user) {
    (void)level;
    (void)user;
    fprintf(stderr, "ctrain-dispatcher: %s\n", msg);
}

static void on_listening(const char *endpoint, void *user) {
    (void)user;
    printf("ctrain-dispatcher: listening on %s\n", endpoint);
    fflush(stdout);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain-dispatcher --job JOB.yaml [--bind HOST:PORT] [options]\n"
            "\n"
            "The dispatcher of a job's data service (data.service): data workers\n"
            "(ctrain-data-worker) register with it, and every trainer of the job reads its\n"
            "batches from them; the dispatcher leases each trainer's splits to the data workers,\n"
            "re-queues the leases of a lost one, and journals its state in the work directory so\n"
            "that a restarted dispatcher goes on where it stopped.\n"
            "\n"
            "options:\n"
            "  --job FILE          the job file (required; the same as the trainers')\n"
            "  --set KEY=VALUE     override a job field (repeatable; the same as the trainers')\n"
            "  --bind HOST:PORT    where to listen (default: data.service.dispatcher, else\n"
            "                      $CTRAIN_DISPATCHER, else the cluster spec's dispatcher task)\n"
            "  --interface NAME    listen on NAME's address (= CTRAIN_INTERFACE)\n"
            "  --advertise HOST    the address it reports (= CTRAIN_ADVERTISE)\n"
            "  --task dispatcher   this task, with --cluster FILE or TF_CONFIG naming its address\n"
            "  --cluster FILE      a cluster file in TF_CONFIG's layout (YAML or JSON)\n"
            "  --work-dir DIR      the journal (default data.service.work_dir, else\n"
            "                      <run_dir>/data_service)\n"
            "  --keys DIR          CURVE keys from 'ctrain keygen DIR' (= strategy.keys)\n"
            "  -h, --help          show this help\n"
            "\n"
            "It prints 'ctrain-dispatcher: listening on tcp://HOST:PORT' once it listens.\n"
            "exit codes: 0 the job is done, 1 runtime failure (the journal, the socket), 2 bad\n"
            "input, 130/143 stopped by SIGINT/SIGTERM, as every role (the first signal tells the\n"
            "data workers that the job is done and ends two heartbeats later; a second ends it\n"
            "at once)\n");
}

/* Takes --work-dir out of argv (the shared role flags do not know it). */
static int take_work_dir(int *argc, char **argv, const char **ret) {
    int n = 1;
    for (int i = 1; i < *argc; i++) {
        if (!strcmp(argv[i], "--work-dir")) {
            if (i + 1 >= *argc) {
                return -1;
            }
            *ret = argv[++i];
        } else {
            argv[n++] = argv[i];
        }
    }
    *argc = n;
    return 0;
}

int main(int argc, char **argv) {
    ct_role_flags f;
    ct_err err = {0};
    const char *work_dir = NULL;
    if (take_work_dir(&argc, argv, &work_dir) != 0) {
        fprintf(stderr, "ctrain-dispatcher: --work-dir needs a directory (see --help)\n");
        return 2;
    }
    if (ct_role_flags_parse(argc, argv, &f, &err) != CT_OK) {
        fprintf(stderr, "ctrain-dispatcher: %s\n", err.msg);
        return 2;
    }
    if (f.help) {
        usage(stdout);
        return 0;
    }
    ct_job *job = NULL;
    char address[1024];
    if (ct_job_create(f.job_path, f.sets, f.n_sets, &job, NULL, &err) != CT_OK ||
        (!f.ps.bind &&
         ct_data_service_address(job, &f.ps.cluster, address, sizeof address, &err) != CT_OK)) {
        fprintf(stderr, "ctrain-dispatcher: %s\n", err.msg);
        ct_job_destroy(job);
        return 2;
    }
    ct_dispatcher_options o = {.bind = f.ps.bind ? f.ps.bind : address,
                               .work_dir = work_dir,
                               .keys = f.ps.keys,
                               .interface = f.ps.interface,
                               .advertise = f.ps.advertise,
                               .on_listening = on_listening};
    ct_log_set(CT_LOG_INFO, log_line, NULL);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    ct_status st = ct_dispatcher_run(job, &o, &stop_requested, &err);
    if (st != CT_OK) {
        fprintf(stderr, "ctrain-dispatcher: %s\n", err.msg);
    }
    ct_net_shutdown();
    ct_job_destroy(job);
    /* stopped by a signal: 130/143 as every role, though the stop itself went cleanly */
    return ct_exit_code(st == CT_OK && stop_signal ? CT_EINTR : st, stop_signal, 0);
}
