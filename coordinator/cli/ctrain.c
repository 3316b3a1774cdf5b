/* ctrain: the standalone launcher. `ctrain train [JOB] [--set key=value ...]` trains a job on
 * this machine; `ctrain summary JOB` prints the model; `ctrain graph JOB` the compiled step. A thin
 * main: parse flags, load the job and data through the library, run, print, map the status to an
 * exit code (0 ok, 1 runtime failure, 2 bad input, 130 SIGINT, 143 SIGTERM). The
 * commands live in cmd_train.c, cmd_inspect.c, cmd_data.c, cmd_profile.c, cmd_generate.c and
 * cmd_ckpt.c. */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cmd_ckpt.h"
#include "ctrain/ctrain.h"
#include "ctrain/mirrored.h"
#include "ctrain/net.h"
#include "ctrain/npz.h"
#include "ctrain/report.h"
#include "ps_launch.h"

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
        "  data inspect|bench|convert  look at, time and convert a job's input pipeline\n"
        "  generate CKPT       sample text from a byte-level language model's checkpoint\n"
        "  export CKPT --format onnx OUT  the model as ONNX (opset 17), for onnxruntime and\n"
        "                      other runtimes; npz and safetensors: its tensors\n"
        "  predict CKPT INPUT  a checkpoint's outputs on an .npy/.npz of inputs or on the job's\n"
        "                      eval pipeline, as JSON lines or an .npy\n"
        "  profile RUN_DIR     report a run trained with --profile A:B (step time, top ops,\n"
        "                      input-bound verdict)\n"
        "  plan JOB.yaml       predict the step time and the best strategy on 1 to 1,000\n"
        "                      hosts (the cost model of docs/scaling.md)\n"
        "  keygen DIR          make a parameter-server job's CURVE keys (strategy.keys: DIR)\n"
        "  version             print the version\n"
        "\n"
        "Run 'ctrain <command> --help' for the options of a command.\n",
        CT_DEFAULT_JOB);
}

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
    if (!strcmp(cmd, "data")) {
        return cmd_data(argc - 2, argv + 2);
    }
    if (!strcmp(cmd, "profile")) {
        return cmd_profile(argc - 2, argv + 2);
    }
    if (!strcmp(cmd, "generate")) {
        return cmd_generate(argc - 2, argv + 2);
    }
    if (!strcmp(cmd, "export")) {
        return cmd_export(argc - 2, argv + 2);
    }
    if (!strcmp(cmd, "predict")) {
        return cmd_predict(argc - 2, argv + 2);
    }
    if (!strcmp(cmd, "plan")) {
        return cmd_plan(argc - 2, argv + 2);
    }
    fprintf(stderr,
            "ctrain: unknown command '%s' (commands: train, summary, graph, ckpt, data, profile, "
            "generate, export, predict, plan, keygen, version)\n",
            cmd);
    return EXIT_BAD_INPUT;
}
