/* A steady-state training step allocates nothing: after warm-up steps (graphs compiled,
 * arenas planned, executor threads started), 50 more steps of the MLP and the CNN in graph mode,
 * at 1 and 2 threads, make no heap allocation from libctrain. One exception, once: a pool's
 * executor builds the plan its solo runs use the first time a step runs solo (a core taken by
 * another process; exec_solo.c), which can come at any step. So 3 windows of 50 steps are
 * counted, and at most one of them may allocate: an allocation per step, or per few steps,
 * fails. Run with LD_PRELOAD of the malloc_count shim (tests/meson.build does). It also reports
 * the allocations oneDNN's dnnl_sgemm makes inside each GEMM (its packing buffers), which are
 * outside ctrain's reach. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/rng.h"
#include "ctrain/train.h"

enum { WINDOWS = 3 };

/* Returns 0 when graph mode allocated in no window, or in one (or, for eager mode, the negative
 * control, when it allocated in every window: eager builds a tape every step, so the counter
 * must see it). */
static int check(const char *job, int threads, int batch, int eager) {
    void (*count_allocs)(int);
    long (*allocations)(void), (*other_allocations)(void);
    /* POSIX's way to turn dlsym's object pointer into a function pointer */
    void *a = dlsym(RTLD_DEFAULT, "ct_test_count_allocs"),
         *b = dlsym(RTLD_DEFAULT, "ct_test_allocations");
    memcpy(&count_allocs, &a, sizeof a);
    memcpy(&allocations, &b, sizeof b);
    void *c = dlsym(RTLD_DEFAULT, "ct_test_other_allocations");
    memcpy(&other_allocations, &c, sizeof c);
    if (!count_allocs || !allocations || !other_allocations) {
        fprintf(stderr, "steady_state: run me with LD_PRELOAD=libmalloc_count.so\n");
        return 1;
    }
    char path[512], set_threads[64];
    snprintf(path, sizeof path, "%s/%s", CT_SOURCE_ROOT, job);
    snprintf(set_threads, sizeof set_threads, "train.threads=%d", threads);
    const char *sets[] = {set_threads, eager ? "train.eager=true" : "train.eager=false"};
    ct_trainer *t;
    ct_err err = {0};
    if (ct_trainer_load(path, sets, 2, &t, &err) != CT_OK) {
        fprintf(stderr, "steady_state: %s\n", err.msg);
        return 1;
    }
    float *x = malloc((size_t)batch * 784 * sizeof *x);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    ct_rng_uniform(1, 1, 0, x, (size_t)batch * 784);
    for (int i = 0; i < batch; i++) {
        y[i] = i % 10;
    }
    float loss, acc;
    int rc = 0, allocating = 0;
    for (int s = 0; s < 5 && rc == 0; s++) { /* warm-up */
        rc = ct_trainer_step(t, x, y, batch, &loss, &acc, &err) != CT_OK;
    }
    static long seen_ours, seen_others; /* the shim's counters only grow */
    for (int w = 0; w < WINDOWS && rc == 0; w++) {
        count_allocs(1);
        for (int s = 0; s < 50 && rc == 0; s++) {
            rc = ct_trainer_step(t, x, y, batch, &loss, &acc, &err) != CT_OK;
        }
        count_allocs(0);
        long n = allocations() - seen_ours, o = other_allocations() - seen_others;
        seen_ours += n;
        seen_others += o;
        allocating += n != 0;
        printf("%s, %d thread(s)%s, window %d: %ld allocations by libctrain in 50 steady-state "
               "steps (%ld by other libraries, e.g. oneDNN's GEMM)\n",
               job, threads, eager ? ", eager" : "", w + 1, n, o);
    }
    ct_trainer_destroy(t);
    free(x);
    free(y);
    return rc || (eager ? allocating < WINDOWS : allocating > 1);
}

int main(void) {
    int bad = 0;
    bad |= check("examples/fashion_mnist_mlp.yaml", 1, 60, 0);
    bad |= check("examples/fashion_mnist_mlp.yaml", 2, 60, 0);
    bad |= check("examples/fashion_mnist_cnn.yaml", 2, 8, 0);
    bad |= check("examples/fashion_mnist_mlp.yaml", 1, 60, 1); /* the counter sees ctrain */
    return bad;
}
