/* The standalone launcher's shared pieces (ctrain.c, cmd_train.c, cmd_inspect.c): the flags of
 * train/summary/graph, the stop flag its signal handler raises, and exit codes. */
#ifndef CTRAIN_COORDINATOR_CLI_H
#define CTRAIN_COORDINATOR_CLI_H

#include <stdio.h>
#include <sys/types.h>

#define EXIT_RUNTIME 1
#define EXIT_BAD_INPUT 2
#define MAX_SETS 64

typedef struct cli {
    const char *job_path;
    const char *sets[MAX_SETS + 2];
    int n_sets;
    int quiet;
    int no_resume;
    int replicas;
    int elastic; /* --elastic MIN:MAX given (its two --set overrides below) */
    char elastic_sets[2][64];
    double start_timeout_s; /* --start-timeout: mpirun's start-up limit (0: the default) */
    int ps, workers;        /* --ps M --workers N: a local parameter-server cluster */
    int data_workers;       /* --data-workers N: a local data service */
    double straggler;
    const char *init_from;
    char threads_set[64];
    char profile_set[64]; /* --profile FIRST:LAST as its --set override */
} cli;

/* Raised by SIGINT/SIGTERM once cli_catch_signals ran; the signal in cli_stop_signal. */
extern volatile int cli_stop_requested;
extern volatile int cli_stop_signal;
void cli_catch_signals(void);

/* Parses train/summary/graph flags into c; returns 0, -1 after --help (printed by help), or the
 * exit code to leave with (the message printed). */
int cli_parse_flags(int argc, char **argv, cli *c, void (*help)(FILE *));

/* The path of role binary `name` ("ctrain-worker") next to this one (installed) or in the
 * build tree (../<dir>/<name>) into out (PATH_MAX bytes); 0, or -1 after saying it is missing. */
int cli_role_binary(const char *name, const char *dir, char *out);

/* Starts argv (argv[0] a path) as a child of a local cluster: its own process group (the
 * terminal's Ctrl-C is for this process, which ends its children), killed when this process
 * dies, default signal handlers, stdout to out_fd when >= 0. Returns its pid, or -1 after
 * saying why. */
pid_t cli_spawn(const char *const *argv, int out_fd);

/* ctrain train, summary and graph (argv without the command name). */
int cmd_train(int argc, char **argv);
int cmd_summary(int argc, char **argv);
int cmd_graph(int argc, char **argv);
/* ctrain data inspect|bench|convert (argv from the subcommand on; coordinator/cli/cmd_data.c). */
int cmd_data(int argc, char **argv);
/* ctrain profile RUN_DIR (coordinator/cli/cmd_profile.c). */
int cmd_profile(int argc, char **argv);
/* ctrain generate CKPT (coordinator/cli/cmd_generate.c). */
int cmd_generate(int argc, char **argv);
/* ctrain export CKPT --format onnx|npz|safetensors OUT (coordinator/cli/cmd_export.c); the npz
 * and safetensors forms are ctrain ckpt export's (cmd_ckpt.h), which hands onnx to cmd_export. */
int cmd_export(int argc, char **argv);
/* ctrain predict CKPT INPUT (coordinator/cli/cmd_predict.c). */
int cmd_predict(int argc, char **argv);
/* ctrain plan JOB: predicted step and strategy on 1 to 1,000 hosts (coordinator/cli/cmd_plan.c). */
int cmd_plan(int argc, char **argv);

#endif
