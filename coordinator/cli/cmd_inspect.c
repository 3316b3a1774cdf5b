/* ctrain summary (the model's layers, shapes and parameter counts) and ctrain graph (the
 * optimized step graph, its passes, memory plan and executor plan; Graphviz dot). */
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

static void summary_usage(FILE *f) {
    fprintf(f,
            "usage: ctrain summary [JOB.yaml] [--set KEY=VALUE ...]\n"
            "Prints each layer's output shape and parameter count (default job: %s).\n",
            CT_DEFAULT_JOB);
}

int cmd_summary(int argc, char **argv) {
    cli c = {0};
    int rc = cli_parse_flags(argc, argv, &c, summary_usage);
    if (rc) {
        return rc < 0 ? 0 : rc;
    }
    ct_job *job = NULL;
    ct_err err = {0};
    ct_model *m = NULL;
    if (ct_job_create(c.job_path, c.sets, c.n_sets, &job, NULL, &err) != CT_OK ||
        ct_model_create(&job->model, job->seed, job->path, &m, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        ct_job_destroy(job);
        return EXIT_BAD_INPUT;
    }
    ct_model_summary(m, stdout);
    ct_model_destroy(m);
    ct_job_destroy(job);
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
            "them back), matmuls split over k, conv and pool nodes split by examples, and the\n"
            "fused optimizer updates.\n"
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

int cmd_graph(int argc, char **argv) {
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
        rc = cli_parse_flags(n_rest, rest, &c, graph_usage);
    }
    free(rest);
    if (rc) {
        return rc < 0 ? 0 : rc;
    }
    ct_job *job = NULL;
    ct_err err = {0};
    ct_trainer *t = NULL;
    ct_graph *g = NULL;
    if (ct_job_create(c.job_path, c.sets, c.n_sets, &job, NULL, &err) != CT_OK ||
        ct_trainer_create(job, &t, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        ct_trainer_destroy(t);
        ct_job_destroy(job);
        return EXIT_BAD_INPUT;
    }
    if (ct_trainer_step_graph(t, batch ? batch : job->train.batch_size,
                              eval ? CT_GRAPH_EVAL : CT_GRAPH_TRAIN, &g, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        ct_trainer_destroy(t);
        ct_job_destroy(job);
        return EXIT_RUNTIME;
    }
    const ct_graph_stats *st = ct_graph_get_stats(g);
    char names[128];
    printf("# %s graph of %s, batch %lld; passes: %s\n", eval ? "inference" : "training-step",
           job->path, batch ? batch : (long long)job->train.batch_size,
           ct_graph_passes_str(job->train.graph_passes, names, sizeof names));
    ct_graph_print(g, stdout);
    printf("# nodes: %d traced, %d after passes (folded %d, merged %d, simplified %d, removed "
           "%d)\n",
           st->nodes_in, st->nodes_out, st->folded, st->merged, st->simplified, st->removed);
    printf("# fusion: %d fused groups replacing %d ops; %d conv epilogues (bias and relu after a "
           "convolution, relu's gradient after an input gradient)\n",
           st->fused_groups, st->fused_ops, st->conv_epilogues);
    printf("# memory: intermediates %lld bytes unplanned, %lld bytes planned (%s; %.2fx less), "
           "%d in place\n",
           (long long)st->bytes_unplanned, (long long)st->bytes_planned,
           job->train.plan_memory ? "liveness plan" : "planning off",
           st->bytes_planned ? (double)st->bytes_unplanned / (double)st->bytes_planned : 1.0,
           st->in_place);
    printf("# executor: %d threads, %d nodes split across them, %d edges linked part to part "
           "(row pipelines), %d memory-reuse waits holding them back; matmuls split over k: "
           "%d x W (each thread reads the weight rows it updates), %d x^T dy (each thread "
           "multiplies its pipeline's rows); %d conv and pool nodes split by examples (filter "
           "gradients over k)\n",
           st->threads, st->split_nodes, st->linked_edges, st->pipeline_waits, st->inner_splits,
           st->batch_splits, st->conv_splits);
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
            ct_job_destroy(job);
            return EXIT_BAD_INPUT;
        }
        ct_graph_write_dot(g, f);
        fclose(f);
        printf("# wrote %s\n", dot);
    }
    ct_trainer_destroy(t);
    ct_job_destroy(job);
    return 0;
}

/* ctrain keygen DIR: the CURVE keys of a parameter-server job (see ctrain/net.h). */
