/* LD_PRELOAD shim for tests/unit/steady_state.c: while counting is on
 * (ct_test_count_allocs(1)), counts malloc, calloc, realloc, aligned_alloc and posix_memalign
 * calls, split by caller: those made directly from libctrain, and the rest (oneDNN's GEMM
 * allocates its packing buffers on every call, which ctrain cannot provide). Each call is
 * forwarded to glibc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static atomic_int counting;
static atomic_long ours, others;
static __thread int inside;

void ct_test_count_allocs(int on) {
    atomic_store(&counting, on);
}

long ct_test_allocations(void) {
    return atomic_load(&ours);
}

long ct_test_other_allocations(void) {
    return atomic_load(&others);
}

static void count(void *caller) {
    if (!atomic_load_explicit(&counting, memory_order_relaxed) || inside) {
        return;
    }
    inside = 1;
    Dl_info info;
    int from_ctrain =
        dladdr(caller, &info) && info.dli_fname && strstr(info.dli_fname, "libctrain") != NULL;
    atomic_fetch_add(from_ctrain ? &ours : &others, 1);
    inside = 0;
}

void *malloc(size_t n) {
    count(__builtin_return_address(0));
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t m) {
    count(__builtin_return_address(0));
    return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n) {
    count(__builtin_return_address(0));
    return __libc_realloc(p, n);
}

void *aligned_alloc(size_t a, size_t n) {
    count(__builtin_return_address(0));
    return __libc_memalign(a, n);
}

int posix_memalign(void **p, size_t a, size_t n) {
    count(__builtin_return_address(0));
    *p = __libc_memalign(a, n);
    return *p ? 0 : 12; /* ENOMEM */
}
