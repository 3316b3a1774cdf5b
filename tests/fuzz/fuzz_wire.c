/* libFuzzer target: the parameter-server wire decoder (common/src/net/wire.c) on arbitrary
 * frames. Input layout: byte 0 picks the frame count (1 + byte % 8); each frame but the last is
 * a 2-byte little-endian length and that many bytes; the last frame takes the rest. Every input
 * must be either decoded (and then every field a handler reads is read) or refused with a
 * message; AddressSanitizer and UndefinedBehaviorSanitizer watch both. Built and run by
 * tests/integration/test_fuzz.py with clang (-fsanitize=fuzzer). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "net/wire.h"

static void touch(const ct__env *env) {
    volatile uint64_t sink = env->version + env->generation + (uint64_t)env->index;
    for (size_t k = 0; k < env->n_tensors; k++) {
        sink += env->tensors[k]->bytes + env->tensors[k]->shard + env->tensors[k]->slot;
    }
    for (size_t k = 0; k < env->n_held; k++) {
        sink += env->held[k];
    }
    if (env->reg && env->reg->endpoint) {
        sink += strlen(env->reg->endpoint);
    }
    if (env->view) {
        for (size_t k = 0; k < env->view->n_ps_endpoints; k++) {
            sink += strlen(env->view->ps_endpoints[k]);
        }
    }
    if (env->error) {
        sink += strlen(env->error);
    }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) {
        return 0;
    }
    int n = 1 + data[0] % 8;
    const void *frames[8];
    size_t sizes[8];
    size_t pos = 1;
    for (int k = 0; k < n; k++) {
        size_t len = size - pos;
        if (k < n - 1) {
            if (pos + 2 > size) {
                n = k;
                break;
            }
            len = (size_t)data[pos] | (size_t)data[pos + 1] << 8;
            pos += 2;
            len = len < size - pos ? len : size - pos;
        }
        frames[k] = data + pos;
        sizes[k] = len;
        pos += len;
    }
    const uint64_t ids[2] = {0, 0x2a};
    for (int j = 0; j < 2 && n > 0; j++) {
        ct__env *env = NULL;
        ct_err err = {0};
        if (ct__msg_decode(frames, sizes, n, ids[j], &env, &err) == CT_OK) {
            touch(env);
            ct__env_destroy(env);
        } else if (!err.msg[0]) {
            __builtin_trap(); /* a refusal always says why */
        }
    }
    return 0;
}
