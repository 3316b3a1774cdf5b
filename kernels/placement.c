/* Device placement: device names, and which backend runs a training step on a device. The CUDA
 * runtime is loaded only when a GPU is asked for (dlopen), so that no binary links it and a
 * machine without it runs every CPU job; its answer (no driver, no device, how many) is what a
 * strict placement's error and a soft placement's note say. */
#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ctrain/backend.h"

int ct_device_parse(const char *text, ct_device *ret) {
    const char *p = text;
    if (!p) {
        return -1;
    }
    p += *p == '/';
    if (!strncasecmp(p, "device:", 7)) {
        p += 7;
    }
    ct_device d;
    if (!strncasecmp(p, "CPU:", 4)) {
        d.kind = CT_DEVICE_CPU;
    } else if (!strncasecmp(p, "GPU:", 4)) {
        d.kind = CT_DEVICE_GPU;
    } else {
        return -1;
    }
    p += 4;
    char *end;
    long index = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : -1;
    if (index < 0 || index > 1024 || *end != '\0') {
        return -1;
    }
    d.index = (int)index;
    *ret = d;
    return 0;
}

const char *ct_device_str(ct_device d, char *buf, size_t cap) {
    snprintf(buf, cap, "/%s:%d", d.kind == CT_DEVICE_GPU ? "GPU" : "CPU", d.index);
    return buf;
}

/* The GPUs the CUDA runtime sees (>= 0), or -1 with the reason in why. */
static int cuda_devices(char *why, size_t cap) {
    void *lib = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
    lib = lib ? lib : dlopen("libcudart.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, cap, "no CUDA runtime (libcudart.so.13 is not installed)");
        return -1;
    }
    int (*count)(int *) = NULL;
    const char *(*name)(int) = NULL;
    void *sym[2] = {dlsym(lib, "cudaGetDeviceCount"), dlsym(lib, "cudaGetErrorString")};
    memcpy(&count, &sym[0], sizeof count); /* POSIX: a data pointer that holds a function's */
    memcpy(&name, &sym[1], sizeof name);
    int n = 0, rc = count ? count(&n) : -1;
    if (rc != 0) { /* 35: no driver (insufficient driver), 100: no device */
        snprintf(why, cap, "no GPU: %s (cudaGetDeviceCount returned %d)",
                 name && rc > 0 ? name(rc) : "the CUDA runtime has no cudaGetDeviceCount", rc);
        return -1;
    }
    return n; /* the runtime stays loaded: unloading CUDA's runtime is not safe */
}

/* Why `d` cannot run a training step here. */
static void why_not(ct_device d, char *why, size_t cap) {
    int n = cuda_devices(why, cap);
    if (n >= 0 && d.index >= n) {
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        snprintf(why, cap, "there is no such GPU: %d visible%s%s%s", n,
                 visible ? " (CUDA_VISIBLE_DEVICES=" : "", visible ? visible : "",
                 visible ? ")" : "");
    } else if (n >= 0) {
        snprintf(why, cap,
                 "ctrain has no CUDA backend yet: its first CUDA kernels cannot run a training "
                 "step (docs/cuda.md)");
    }
}

ct_status ct_backend_create_on(ct_device d, int soft, int threads, ct_backend **ret, char *note,
                               size_t note_cap, ct_err *err) {
    char name[32], why[256];
    note[0] = '\0';
    ct_device_str(d, name, sizeof name);
    if (d.kind == CT_DEVICE_CPU && d.index != 0) {
        return ct_err_set(err, CT_EINVAL, "%s: there is one CPU device, /CPU:0", name);
    }
    if (d.kind == CT_DEVICE_GPU) {
        why_not(d, why, sizeof why);
        if (!soft) {
            return ct_err_set(err, CT_EINVAL,
                              "%s: %s (train.soft_placement: true runs the job on /CPU:0 instead)",
                              name, why);
        }
        snprintf(note, note_cap, "%s: %s; running on /CPU:0 (soft placement)", name, why);
    }
    return ct_backend_cpu_create(threads, ret, err);
}
