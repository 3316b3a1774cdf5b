/* Every CUDA kernel against its CPU twin on random inputs of awkward sizes. Built twice: with the
 * host compiler and the CPU stand-in for the CUDA runtime (kernels/cuda/stand_in.h: a meson test
 * here, under AddressSanitizer and ThreadSanitizer too), and by nvcc for a GPU
 * (scripts/gpu/verify.sh). The CPU twin is the CPU backend's kernel run through an eager graph
 * (the optimizer: ct_optimizer_update_span). Prints one line per case; exits 1 when one differs
 * by more than the tolerance, 77 (skip) when a GPU build finds no GPU.
 * Usage: kernel_parity [--seed N] [--filter SUBSTRING] [--exclude SUBSTRING] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <string>
#include <vector>

#include "compat.h"
#include "cuda_backend.h"

#include "ctrain/backend.h"
#include "ctrain/graph.h"
#include "ctrain/optim.h"
#include "ctrain/params.h"
#include "ctrain/rng.h"
extern "C" {
#include "graph/op_impl.h" /* the fuse pass's program (ct__graph_add_fused) */
}

namespace {

/* ---- device memory: host memory under the stand-in ---- */
#ifdef CT_CUDA_STAND_IN
void *dev_alloc(size_t bytes) {
    return calloc(1, bytes ? bytes : 1);
}
void dev_free(void *p) {
    free(p);
}
void to_dev(void *d, const void *h, size_t bytes) {
    memcpy(d, h, bytes);
}
void from_dev(void *h, const void *d, size_t bytes) {
    memcpy(h, d, bytes);
}
#else
void cuda_check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "kernel_parity: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}
void *dev_alloc(size_t bytes) {
    void *p = nullptr;
    cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    cuda_check(cudaMemset(p, 0, bytes ? bytes : 1), "cudaMemset");
    return p;
}
void dev_free(void *p) {
    cudaFree(p);
}
void to_dev(void *d, const void *h, size_t bytes) {
    cuda_check(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "copy to the device");
}
void from_dev(void *h, const void *d, size_t bytes) {
    cuda_check(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "copy from the device");
}
#endif

/* A device copy of a host vector, freed with the object. */
template <class T> struct dev_vec {
    T *p;
    size_t n;
    explicit dev_vec(const std::vector<T> &h)
        : p((T *)dev_alloc(h.size() * sizeof(T))), n(h.size()) {
        to_dev(p, h.data(), n * sizeof(T));
    }
    explicit dev_vec(size_t count) : p((T *)dev_alloc(count * sizeof(T))), n(count) {}
    ~dev_vec() {
        dev_free(p);
    }
    dev_vec(const dev_vec &) = delete;
    dev_vec &operator=(const dev_vec &) = delete;
    std::vector<T> host() const {
        std::vector<T> h(n);
        from_dev(h.data(), p, n * sizeof(T));
        return h;
    }
};

/* ---- randomness and comparison ---- */
uint64_t rng_state = 1;
float uniform(float lo, float hi) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / 16777216.0));
}
std::vector<float> randoms(int64_t n, float lo, float hi) {
    std::vector<float> v((size_t)n);
    for (auto &x : v) {
        x = uniform(lo, hi);
    }
    return v;
}

int failures = 0, cases = 0;
const char *filter = nullptr, *exclude = nullptr;

bool wanted(const char *name) {
    return (!filter || strstr(name, filter)) && !(exclude && strstr(name, exclude));
}

/* got ~ want: |got - want| <= tol (|want| + floor max|want|), NaN where NaN. A kernel that sums
 * in another order than its twin gets a tolerance for the cancellation that follows. */
void compare(const char *name, const std::vector<float> &got, const std::vector<float> &want,
             double tol = 1e-5, double floor = 1e-3) {
    double peak = 0.0, worst = 0.0;
    for (float w : want) {
        peak = fabs(w) > peak && isfinite(w) ? fabs(w) : peak;
    }
    size_t bad = got.size() == want.size() ? want.size() : 0;
    for (size_t i = 0; i < want.size() && got.size() == want.size(); i++) {
        double d = fabs((double)got[i] - want[i]), allowed = tol * (fabs(want[i]) + floor * peak);
        bool same_nan = isnan(got[i]) && isnan(want[i]);
        double rel = same_nan ? 0.0 : d / (allowed > 0 ? allowed / tol : 1.0);
        if (!same_nan && !(d <= allowed) && bad == want.size()) {
            bad = i;
        }
        worst = rel > worst ? rel : worst;
    }
    cases++;
    if (bad != want.size()) {
        failures++;
        printf("FAIL %s: element %zu of %zu: got %.9g, want %.9g (worst relative error %.3g)\n",
               name, bad, want.size(), bad < got.size() ? got[bad] : NAN,
               bad < want.size() ? want[bad] : NAN, worst);
    } else {
        printf("ok   %s (%zu elements, worst relative error %.3g)\n", name, want.size(), worst);
    }
}

/* ---- the CPU twin: one op on an eager CPU graph ---- */
struct cpu_twin {
    ct_backend *be = nullptr;
    ct_graph *g = nullptr;
    cpu_twin() {
        ct_err err;
        if (ct_backend_cpu_create(1, &be, &err) != CT_OK || ct_graph_create(be, 1, &g, &err)) {
            fprintf(stderr, "kernel_parity: the CPU backend: %s\n", err.msg);
            exit(1);
        }
    }
    ~cpu_twin() {
        ct_graph_destroy(g);
        ct_backend_destroy(be);
    }
    int constant(const std::vector<int64_t> &dims, const void *data, ct_dtype dtype = CT_F32) {
        ct_shape s = ct_shape_make((int)dims.size(), dims.data());
        return ct_constant(g, dtype, &s, data);
    }
    int add(ct_op op, std::vector<int> in, const ct_attrs &attrs) {
        int id = ct_graph_add(g, op, (int)in.size(), in.data(), &attrs);
        if (id < 0) {
            ct_err err;
            ct_graph_status(g, &err);
            fprintf(stderr, "kernel_parity: the CPU twin: %s\n", err.msg);
            exit(1);
        }
        return id;
    }
    std::vector<float> read(int id) {
        ct_node *n = ct_graph_node(g, id);
        std::vector<float> v((size_t)ct_tensor_numel(&n->out));
        memcpy(v.data(), n->out.data, v.size() * sizeof(float));
        return v;
    }
    std::vector<float> read_aux(int id) {
        ct_node *n = ct_graph_node(g, id);
        std::vector<float> v((size_t)ct_tensor_numel(&n->aux));
        memcpy(v.data(), n->aux.data, v.size() * sizeof(float));
        return v;
    }
};

int64_t numel(const std::vector<int64_t> &dims) {
    int64_t n = 1;
    for (int64_t d : dims) {
        n *= d;
    }
    return n;
}

void launched(const char *name, int rc) {
    if (rc != 0) {
        printf("FAIL %s: the launch returned %d\n", name, rc);
        failures++;
    }
}

} // namespace

#include "parity_cases.h"

int main(int argc, char **argv) {
    uint64_t seed = (uint64_t)time(nullptr);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], nullptr, 10);
        } else if (!strcmp(argv[i], "--filter") && i + 1 < argc) {
            filter = argv[++i];
        } else if (!strcmp(argv[i], "--exclude") && i + 1 < argc) {
            exclude = argv[++i];
        } else {
            fprintf(stderr,
                    "usage: kernel_parity [--seed N] [--filter SUBSTRING] [--exclude SUBSTRING]\n");
            return 2;
        }
    }
#ifndef CT_CUDA_STAND_IN
    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || devices == 0) {
        printf("kernel_parity: no GPU (cudaGetDeviceCount: %s); skipped\n", cudaGetErrorString(e));
        return 77;
    }
#endif
    rng_state = seed * 2654435761u + 1;
    printf("kernel_parity: seed %llu (%s)\n", (unsigned long long)seed,
#ifdef CT_CUDA_STAND_IN
           "the CPU stand-in for the CUDA runtime"
#else
           "the GPU"
#endif
    );
    run_all_cases();
    printf("kernel_parity: %d cases, %d failed\n", cases, failures);
    return failures ? 1 : 0;
}
