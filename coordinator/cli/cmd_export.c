/* `ctrain export CKPT --format onnx OUT`: a checkpoint's model as an ONNX model (the job the
 * checkpoint holds builds the model, its weights are restored, ct_trainer_export_onnx writes
 * the inference graph). npz and safetensors, the tensors alone, are ctrain ckpt export's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cmd_ckpt.h"
#include "ctrain/ctrain.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain export CKPT --format onnx|npz|safetensors OUT\n"
            "\n"
            "CKPT is a checkpoint file, or a checkpoint directory (its newest good checkpoint).\n"
            "  --format onnx         the model for inference as ONNX (opset 17): input \"input\"\n"
            "                        [batch, the job's model.input_shape...] (f32, or int32 token\n"
            "                        ids for a model that starts with an embedding), output\n"
            "                        \"output\" (the logits); batch norm in inference form,\n"
            "                        dropout gone, the batch dimension dynamic, the weights as\n"
            "                        initializers named as in `ctrain summary`. Runs in\n"
            "                        onnxruntime and other ONNX runtimes.\n"
            "  --format npz|safetensors  every tensor of the checkpoint (ctrain ckpt export)\n"
            "exit codes: 0 written, 1 runtime failure, 2 bad input (arguments, checkpoint, a\n"
            "model with an op that has no ONNX form: the message names it)\n");
}

int cmd_export(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    }
    const char *in, *out, *format;
    int rc = ckpt_export_args(argc, argv, "export", &in, &out, &format);
    if (rc) {
        return rc;
    }
    if (format && (!strcmp(format, "npz") || !strcmp(format, "safetensors"))) {
        char *args[5] = {"export", (char *)in, "--format", (char *)format, (char *)out};
        return in && out ? ckpt_main(5, args) : ckpt_main(1, args);
    }
    if (!in || !out || !format || strcmp(format, "onnx")) {
        fprintf(stderr, "ctrain: export needs CKPT --format onnx|npz|safetensors OUT (see ctrain "
                        "export --help)\n");
        return EXIT_BAD_INPUT;
    }
    ct_err err = {0};
    ct_job *job = malloc(sizeof *job);
    ct_trainer *t = NULL;
    ct_status st = job ? ct_trainer_load_checkpoint(in, job, &t, &err) : CT_ENOMEM;
    if (st == CT_OK) {
        st = ct_trainer_export_onnx(t, out, CT_VERSION, &err);
    }
    if (st == CT_OK) {
        printf("wrote %s (ONNX opset 17, input \"input\", output \"output\") from %s\n", out, in);
    } else {
        fprintf(stderr, "ctrain: export: %s\n", err.msg[0] ? err.msg : "out of memory");
    }
    ct_trainer_destroy(t);
    free(job);
    return st == CT_OK ? 0 : st == CT_EIO || st == CT_ENOMEM ? EXIT_RUNTIME : EXIT_BAD_INPUT;
}
