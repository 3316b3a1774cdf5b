/* `ctrain ckpt ls|show|diff|export`: look into checkpoints without training. Every command
 * verifies what it reads (CRCs, sizes) and reports a bad file in one line with exit code 2. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "cmd_ckpt.h"
#include "ctrain/checkpoint.h"
#include "ctrain/half.h"
#include "ctrain/npz.h"

#define EXIT_RUNTIME 1
#define EXIT_BAD_INPUT 2

void ckpt_usage(FILE *f) {
    fprintf(
        f, "usage: ctrain ckpt <command> ...\n"
           "\n"
           "commands:\n"
           "  ls DIR                     list DIR's checkpoints, newest first, with step, epoch,\n"
           "                             size, time and whether each one verifies\n"
           "  show FILE                  the run position, the job, and every tensor: dtype,\n"
           "                             shape, min, max, mean, std and CRC-32C\n"
           "  diff A B                   compare two checkpoints tensor by tensor (exit 0 when\n"
           "                             identical, 1 when they differ, 2 on bad input)\n"
           "  export FILE --format npz|safetensors|onnx OUT [--dtype f32|bf16|f16]\n"
           "                             write every tensor to OUT (NumPy .npz or safetensors),\n"
           "                             or the model (graph and weights) as ONNX: ctrain export;\n"
           "                             --dtype: f32 tensors (optimizer slots too) as 16-bit\n"
           "                             floats, rounded to nearest even (bf16: safetensors only,\n"
           "                             NumPy has no bf16)\n"
           "\n"
           "A checkpoint that fails verification (CRC, sizes) is named with the tensor at\n"
           "fault.\n");
}

static ct_ckpt *open_or_report(const char *path) {
    ct_ckpt *c = NULL;
    ct_err err = {0};
    if (ct_ckpt_create(path, &c, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return NULL;
    }
    return c;
}

static int cmd_ls(const char *dir) {
    enum { CAP = 1024 };
    char *paths = malloc((size_t)CAP * PATH_MAX);
    int64_t steps[CAP];
    if (!paths) {
        return EXIT_RUNTIME;
    }
    int n = ct_ckpt_list(dir, paths, steps, CAP);
    if (n < 0) {
        fprintf(stderr, "ctrain: %s: not a readable directory\n", dir);
        free(paths);
        return EXIT_BAD_INPUT;
    }
    printf("%-40s %10s %6s %8s %12s  %s\n", "file", "step", "epoch", "batch", "bytes", "status");
    for (int i = 0; i < n && i < CAP; i++) {
        const char *p = paths + (size_t)i * PATH_MAX;
        const char *base = strrchr(p, '/');
        ct_ckpt *c = NULL;
        ct_err err = {0};
        if (ct_ckpt_create(p, &c, &err) == CT_OK) {
            const ct_ckpt_meta *m = ct_ckpt_meta_of(c);
            char when[32];
            time_t t = (time_t)m->wall_time;
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
            printf("%-40s %10lld %6lld %8lld %12llu  ok, written %s\n", base ? base + 1 : p,
                   (long long)m->step, (long long)m->epoch, (long long)m->epoch_step,
                   (unsigned long long)ct_ckpt_file_bytes(c), when);
            ct_ckpt_destroy(c);
        } else {
            printf("%-40s %10lld %6s %8s %12s  BAD: %s\n", base ? base + 1 : p, (long long)steps[i],
                   "-", "-", "-", err.msg);
        }
    }
    free(paths);
    return 0;
}

/* min, max, mean, std of a tensor (as doubles; integers converted). */
static void stats(const ct_ckpt_tensor *e, double *mn, double *mx, double *mean, double *sd) {
    int64_t n = ct_shape_numel(&e->shape);
    double s = 0.0, s2 = 0.0;
    *mn = DBL_MAX;
    *mx = -DBL_MAX;
    for (int64_t i = 0; i < n; i++) {
        double v = e->dtype == CT_F32    ? ((const float *)e->data)[i]
                   : e->dtype == CT_I32  ? ((const int32_t *)e->data)[i]
                   : e->dtype == CT_I64  ? (double)((const int64_t *)e->data)[i]
                   : e->dtype == CT_BF16 ? ct_bf16_to_f32(((const uint16_t *)e->data)[i])
                   : e->dtype == CT_F16  ? ct_fp16_to_f32(((const uint16_t *)e->data)[i])
                                         : ((const uint8_t *)e->data)[i];
        *mn = v < *mn ? v : *mn;
        *mx = v > *mx ? v : *mx;
        s += v;
        s2 += v * v;
    }
    *mean = n ? s / (double)n : 0.0;
    *sd = n ? sqrt(fmax(s2 / (double)n - *mean * *mean, 0.0)) : 0.0;
}

static int cmd_show(const char *path) {
    ct_ckpt *c = open_or_report(path);
    if (!c) {
        return EXIT_BAD_INPUT;
    }
    const ct_ckpt_meta *m = ct_ckpt_meta_of(c);
    printf("%s: step %lld, epoch %lld, batch %lld of the epoch, %lld planned steps, seed %llu\n",
           path, (long long)m->step, (long long)m->epoch, (long long)m->epoch_step,
           (long long)m->total_steps, (unsigned long long)m->seed);
    printf("job: %s\n", m->job_path);
    printf("%-36s %5s %-16s %12s %12s %12s %12s\n", "tensor", "dtype", "shape", "min", "max",
           "mean", "std");
    for (int i = 0; i < ct_ckpt_count(c); i++) {
        const ct_ckpt_tensor *e = ct_ckpt_get(c, i);
        char shape[96];
        double mn, mx, mean, sd;
        stats(e, &mn, &mx, &mean, &sd);
        printf("%-36s %5s %-16s %12.6g %12.6g %12.6g %12.6g\n", e->name, ct_dtype_name(e->dtype),
               ct_shape_str(&e->shape, shape, sizeof shape), mn, mx, mean, sd);
    }
    printf("--- job text ---\n%s", m->job_text ? m->job_text : "");
    ct_ckpt_destroy(c);
    return 0;
}

static int cmd_diff(const char *pa, const char *pb) {
    ct_ckpt *a = open_or_report(pa), *b = a ? open_or_report(pb) : NULL;
    if (!a || !b) {
        ct_ckpt_destroy(a);
        return EXIT_BAD_INPUT;
    }
    int differ = 0;
    const ct_ckpt_meta *ma = ct_ckpt_meta_of(a), *mb = ct_ckpt_meta_of(b);
    if (ma->step != mb->step || ma->epoch != mb->epoch || ma->epoch_step != mb->epoch_step) {
        printf("position: step %lld vs %lld, epoch %lld vs %lld, batch %lld vs %lld\n",
               (long long)ma->step, (long long)mb->step, (long long)ma->epoch, (long long)mb->epoch,
               (long long)ma->epoch_step, (long long)mb->epoch_step);
        differ = 1;
    }
    for (int i = 0; i < ct_ckpt_count(a); i++) {
        const ct_ckpt_tensor *x = ct_ckpt_get(a, i), *y = ct_ckpt_find(b, x->name);
        char sa[96], sb[96];
        if (!y) {
            printf("%s: only in %s\n", x->name, pa);
            differ = 1;
        } else if (x->dtype != y->dtype || !ct_shape_equal(&x->shape, &y->shape)) {
            printf("%s: %s%s vs %s%s\n", x->name, ct_dtype_name(x->dtype),
                   ct_shape_str(&x->shape, sa, sizeof sa), ct_dtype_name(y->dtype),
                   ct_shape_str(&y->shape, sb, sizeof sb));
            differ = 1;
        } else if (memcmp(x->data, y->data, (size_t)x->bytes) != 0) {
            double max_abs = 0.0, max_ref = 0.0;
            int64_t n = ct_shape_numel(&x->shape), count = 0;
            for (int64_t k = 0; x->dtype == CT_F32 && k < n; k++) {
                double u = ((const float *)x->data)[k], v = ((const float *)y->data)[k];
                max_abs = fmax(max_abs, fabs(u - v));
                max_ref = fmax(max_ref, fabs(u));
                count += u != v;
            }
            printf("%s: differs (%lld of %lld elements, max |a-b| %.6g, relative %.3g)\n", x->name,
                   (long long)count, (long long)n, max_abs, max_ref > 0 ? max_abs / max_ref : 0.0);
            differ = 1;
        }
    }
    for (int i = 0; i < ct_ckpt_count(b); i++) {
        if (!ct_ckpt_find(a, ct_ckpt_get(b, i)->name)) {
            printf("%s: only in %s\n", ct_ckpt_get(b, i)->name, pb);
            differ = 1;
        }
    }
    if (!differ) {
        printf("identical: %d tensors, same position\n", ct_ckpt_count(a));
    }
    ct_ckpt_destroy(a);
    ct_ckpt_destroy(b);
    return differ;
}

int ckpt_export_args(int argc, char **argv, const char *who, const char **in, const char **out,
                     const char **format) {
    *in = *out = *format = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--format") && i + 1 < argc) {
            *format = argv[++i];
        } else if (!*in) {
            *in = argv[i];
        } else if (!*out) {
            *out = argv[i];
        } else {
            fprintf(stderr, "ctrain: %s: unexpected argument '%s'\n", who, argv[i]);
            return EXIT_BAD_INPUT;
        }
    }
    return 0;
}

/* --dtype DTYPE taken out of argv (argc updated): f32 (default), bf16 or f16; -1 when bad. */
static int take_dtype(int *argc, char **argv, ct_dtype *ret) {
    *ret = CT_F32;
    int kept = 0;
    for (int i = 0; i < *argc; i++) {
        if (strcmp(argv[i], "--dtype") != 0) {
            argv[kept++] = argv[i];
            continue;
        }
        const char *d = i + 1 < *argc ? argv[++i] : "";
        if (!strcmp(d, "bf16")) {
            *ret = CT_BF16;
        } else if (!strcmp(d, "f16")) {
            *ret = CT_F16;
        } else if (strcmp(d, "f32") != 0) {
            fprintf(stderr, "ctrain: ckpt export: --dtype '%s': use f32, bf16 or f16\n", d);
            return -1;
        }
    }
    *argc = kept;
    return 0;
}

/* The f32 tensors of `arrays` converted to `dtype` (16 bits) in buffers of their own (mine[i]
 * set), freed with free_converted; 0 out of memory. */
static int convert_arrays(ct_named_array *arrays, int n, ct_dtype dtype, char *mine) {
    for (int i = 0; i < n; i++) {
        if (arrays[i].dtype != CT_F32 || dtype == CT_F32 ||
            !strncmp(arrays[i].name, "loss_scale/", 11)) { /* fp16 would make 2^16 Inf */
            continue;
        }
        int64_t count = 1;
        for (int k = 0; k < arrays[i].rank; k++) {
            count *= arrays[i].dims[k];
        }
        uint16_t *h = malloc((size_t)(count ? count : 1) * sizeof *h);
        if (!h) {
            return 0;
        }
        const float *f = arrays[i].data;
        for (int64_t j = 0; j < count; j++) {
            h[j] = dtype == CT_BF16 ? ct_f32_to_bf16(f[j]) : ct_f32_to_fp16(f[j]);
        }
        arrays[i].data = h;
        arrays[i].dtype = dtype;
        mine[i] = 1;
    }
    return 1;
}

static void free_converted(ct_named_array *arrays, int n, const char *mine) {
    for (int i = 0; i < n; i++) {
        if (mine[i]) {
            free((void *)arrays[i].data);
        }
    }
}

static int export_arrays(int argc, char **argv) {
    const char *in, *out, *format;
    ct_dtype dtype;
    if (take_dtype(&argc, argv, &dtype) != 0) {
        return EXIT_BAD_INPUT;
    }
    int rc = ckpt_export_args(argc, argv, "ckpt export", &in, &out, &format);
    if (rc) {
        return rc;
    }
    if (format && !strcmp(format, "onnx")) {
        if (dtype != CT_F32) {
            fprintf(stderr, "ctrain: ckpt export: --dtype is for npz and safetensors (ONNX "
                            "exports f32)\n");
            return EXIT_BAD_INPUT;
        }
        return cmd_export(argc, argv); /* the model's graph, not only its tensors */
    }
    if (!in || !out || !format || (strcmp(format, "npz") && strcmp(format, "safetensors"))) {
        fprintf(stderr, "ctrain: ckpt export needs FILE --format npz|safetensors|onnx OUT (see "
                        "ctrain ckpt --help)\n");
        return EXIT_BAD_INPUT;
    }
    ct_ckpt *c = open_or_report(in);
    if (!c) {
        return EXIT_BAD_INPUT;
    }
    int n = ct_ckpt_count(c);
    ct_named_array *arrays = calloc((size_t)(n ? n : 1), sizeof *arrays);
    char *mine = calloc((size_t)(n ? n : 1), 1);
    if (!arrays || !mine) {
        free(arrays);
        free(mine);
        ct_ckpt_destroy(c);
        return EXIT_RUNTIME;
    }
    for (int i = 0; i < n; i++) {
        const ct_ckpt_tensor *e = ct_ckpt_get(c, i);
        snprintf(arrays[i].name, sizeof arrays[i].name, "%s", e->name);
        arrays[i].dtype = e->dtype;
        arrays[i].rank = e->shape.rank;
        for (int k = 0; k < e->shape.rank; k++) {
            arrays[i].dims[k] = e->shape.dims[k];
        }
        arrays[i].data = e->data;
    }
    ct_err err = {0};
    char meta[256];
    snprintf(meta, sizeof meta, "{\"format\": \"ctrain checkpoint\", \"step\": \"%lld\"}",
             (long long)ct_ckpt_meta_of(c)->step);
    ct_status st = convert_arrays(arrays, n, dtype, mine)
                       ? CT_OK
                       : ct_err_set(&err, CT_ENOMEM, "%s: out of memory converting to %s", out,
                                    ct_dtype_name(dtype));
    if (st == CT_OK) {
        st = !strcmp(format, "npz") ? ct_npz_write(out, arrays, n, &err)
                                    : ct_safetensors_write(out, arrays, n, meta, &err);
    }
    free_converted(arrays, n, mine);
    free(mine);
    free(arrays);
    ct_ckpt_destroy(c);
    if (st != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return EXIT_RUNTIME;
    }
    printf("wrote %d tensors to %s\n", n, out);
    return 0;
}

int ckpt_main(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        ckpt_usage(argc < 1 ? stderr : stdout);
        return argc < 1 ? EXIT_BAD_INPUT : 0;
    }
    const char *sub = argv[0];
    if (!strcmp(sub, "ls") && argc == 2) {
        return cmd_ls(argv[1]);
    }
    if (!strcmp(sub, "show") && argc == 2) {
        return cmd_show(argv[1]);
    }
    if (!strcmp(sub, "diff") && argc == 3) {
        return cmd_diff(argv[1], argv[2]);
    }
    if (!strcmp(sub, "export")) {
        return export_arrays(argc - 1, argv + 1);
    }
    fprintf(stderr, "ctrain: ckpt: bad command or arguments '%s' (see ctrain ckpt --help)\n", sub);
    return EXIT_BAD_INPUT;
}
