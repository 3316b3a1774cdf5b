/* A CPU stand-in for the CUDA runtime, so that the host C++ compiler builds and runs the same
 * kernel sources as nvcc (tests/cuda/). A launch runs the grid's blocks one after another; each
 * block's threads are real threads (one per CUDA thread, kept for the whole launch), so
 * __syncthreads is a real barrier that ThreadSanitizer sees, and a missing one is a data race it
 * reports. __shared__ storage is static: one block runs at a time, and a barrier separates
 * blocks. Warp shuffles exchange through a per-warp buffer between two warp barriers; atomics
 * are the compiler's. Device memory is host memory. What this checks and what it cannot:
 * docs/cuda.md. Not for production: only kernels/cuda/compat.h includes it. */
#ifndef CTRAIN_CUDA_STAND_IN_H
#define CTRAIN_CUDA_STAND_IN_H

#include <pthread.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef dim3 uint3;
typedef void *cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidConfiguration = 9, cudaErrorMemoryAllocation = 2 };
enum { warpSize = 32 };

namespace ct_stand_in {

/* One launch: the barriers of its block and of each warp, the warp exchange buffers, the
 * dynamic shared memory. */
struct launch_state {
    unsigned threads;
    pthread_barrier_t block;
    std::vector<pthread_barrier_t> warps;
    std::vector<uint64_t> exchange; /* one 8-byte slot per thread */
    std::vector<unsigned char> dynamic_shared;
};

struct thread_state {
    dim3 thread_idx, block_idx, block_dim, grid_dim;
    unsigned linear;
    launch_state *launch;
};

inline thread_local thread_state self;
inline std::atomic<long> malloc_calls{0}; /* cudaMalloc calls: the tests' steady-state check */
inline thread_local cudaError_t last_error = cudaSuccess;

inline void sync_block() {
    pthread_barrier_wait(&self.launch->block);
}

inline void sync_warp() {
    pthread_barrier_wait(&self.launch->warps[self.linear / warpSize]);
}

/* The value `v` of the lane `from(lane)` of the calling thread's warp (lanes past the block's
 * last thread read their own value). */
template <class T, class F> T exchange(T v, F from) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    launch_state *l = self.launch;
    unsigned warp0 = self.linear / warpSize * warpSize, lane = self.linear % warpSize;
    memcpy(&l->exchange[self.linear], &v, sizeof v);
    sync_warp();
    unsigned src = warp0 + from(lane);
    T out = v;
    if (src < l->threads && from(lane) < warpSize) {
        memcpy(&out, &l->exchange[src], sizeof out);
    }
    sync_warp();
    return out;
}

template <class K> struct thread_arg {
    launch_state *launch;
    dim3 grid, block;
    unsigned linear;
    const K *body;
};

template <class K> void *thread_main(void *p) {
    thread_arg<K> *a = static_cast<thread_arg<K> *>(p);
    self.launch = a->launch;
    self.linear = a->linear;
    self.block_dim = a->block;
    self.grid_dim = a->grid;
    self.thread_idx = dim3(a->linear % a->block.x, a->linear / a->block.x % a->block.y,
                           a->linear / (a->block.x * a->block.y));
    for (unsigned z = 0; z < a->grid.z; z++) {
        for (unsigned y = 0; y < a->grid.y; y++) {
            for (unsigned x = 0; x < a->grid.x; x++) {
                self.block_idx = dim3(x, y, z);
                (*a->body)();
                sync_block(); /* the next block reuses the static shared memory */
            }
        }
    }
    return nullptr;
}

/* Runs body() as every thread of every block of the grid; returns a cudaError_t. */
template <class K> cudaError_t run(dim3 grid, dim3 block, size_t shared_bytes, const K &body) {
    unsigned threads = block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        return cudaErrorInvalidConfiguration;
    }
    launch_state l;
    l.threads = threads;
    l.exchange.assign(threads, 0);
    l.dynamic_shared.assign(shared_bytes + 16, 0);
    l.warps.resize((threads + warpSize - 1) / warpSize);
    pthread_barrier_init(&l.block, nullptr, threads);
    for (size_t w = 0; w < l.warps.size(); w++) {
        unsigned in_warp = threads - (unsigned)w * warpSize;
        pthread_barrier_init(&l.warps[w], nullptr,
                             in_warp < (unsigned)warpSize ? in_warp : (unsigned)warpSize);
    }
    std::vector<pthread_t> tids(threads);
    std::vector<thread_arg<K>> args(threads);
    for (unsigned t = 0; t < threads; t++) {
        args[t] = thread_arg<K>{&l, grid, block, t, &body};
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 1 << 20);
        if (pthread_create(&tids[t], &attr, thread_main<K>, &args[t]) != 0) {
            abort(); /* a test machine out of threads: nothing sensible to go on with */
        }
        pthread_attr_destroy(&attr);
    }
    for (unsigned t = 0; t < threads; t++) {
        pthread_join(tids[t], nullptr);
    }
    for (auto &w : l.warps) {
        pthread_barrier_destroy(&w);
    }
    pthread_barrier_destroy(&l.block);
    return cudaSuccess;
}

/* The launch syntax: CT_LAUNCH(kernel, grid, block, shared, stream)(args...). */
template <class F> struct bound_launch {
    dim3 grid, block;
    size_t shared;
    F f;
    template <class... A> void operator()(A... args) const {
        auto body = [&]() { f(args...); };
        last_error = run(grid, block, shared, body);
    }
};
template <class F> bound_launch<F> launch(dim3 grid, dim3 block, size_t shared, F f) {
    return bound_launch<F>{grid, block, shared, f};
}

} // namespace ct_stand_in

#define threadIdx (ct_stand_in::self.thread_idx)
#define blockIdx (ct_stand_in::self.block_idx)
#define blockDim (ct_stand_in::self.block_dim)
#define gridDim (ct_stand_in::self.grid_dim)

inline void __syncthreads() {
    ct_stand_in::sync_block();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)mask;
    ct_stand_in::sync_warp();
}

template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
    (void)mask;
    (void)width;
    return ct_stand_in::exchange(v, [&](unsigned lane) { return lane ^ (unsigned)lane_mask; });
}
template <class T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    (void)mask;
    (void)width;
    return ct_stand_in::exchange(
        v, [&](unsigned lane) { return lane + delta < (unsigned)warpSize ? lane + delta : lane; });
}
template <class T> T __shfl_sync(unsigned mask, T v, int src, int width = warpSize) {
    (void)mask;
    (void)width;
    return ct_stand_in::exchange(v, [&](unsigned) { return (unsigned)src; });
}

inline float atomicAdd(float *p, float v) { /* a compare-and-swap loop on the bits */
    int32_t *bits = reinterpret_cast<int32_t *>(p);
    int32_t seen = __atomic_load_n(bits, __ATOMIC_RELAXED), want;
    float old, next;
    do {
        memcpy(&old, &seen, sizeof old);
        next = old + v;
        memcpy(&want, &next, sizeof want);
    } while (
        !__atomic_compare_exchange_n(bits, &seen, want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
inline int atomicAdd(int *p, int v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned atomicAdd(unsigned *p, unsigned v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

#define CT_LAUNCH(kernel, grid, block, shared, stream)                                             \
    ((void)(stream), ct_stand_in::launch(dim3(grid), dim3(block), (size_t)(shared), kernel))
#define CT_DYNAMIC_SHARED(type, name)                                                              \
    type *name = reinterpret_cast<type *>(ct_stand_in::self.launch->dynamic_shared.data())

/* Device memory is host memory: zeroed, 64-byte aligned. */
enum cudaMemcpyKind {
    cudaMemcpyHostToHost,
    cudaMemcpyHostToDevice,
    cudaMemcpyDeviceToHost,
    cudaMemcpyDeviceToDevice,
    cudaMemcpyDefault
};
inline cudaError_t cudaMalloc(void **p, size_t bytes) {
    ct_stand_in::malloc_calls++;
    *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (*p) {
        memset(*p, 0, (bytes + 63) / 64 * 64 + 64);
    }
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind) {
    memmove(dst, src, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
    memset(dst, value, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
    return cudaSuccess;
}

inline cudaError_t cudaGetLastError() {
    cudaError_t e = ct_stand_in::last_error;
    ct_stand_in::last_error = cudaSuccess;
    return e;
}
inline const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : "invalid launch configuration (stand-in)";
}

#endif
