/* delay: an element passes through after a fixed time, slept or spent on the CPU: the
 * ArtificialDataset of tf.data's performance guide, for benchmarks of input-bound training
 * (scripts/bench/data_service.py). */
#include <stdlib.h>
#include <time.h>

#include "core/clock.h"
#include "data/core/dataset_impl.h"
#include "data/maps/maps_impl.h"

typedef struct delay_params {
    int component;
    int64_t micros;
    int cpu;
} delay_params;

static ct_status delay_spec(const ct_element_spec *in, ct_element_spec *ret, void *user,
                            ct_err *err) {
    (void)user;
    (void)err;
    *ret = *in;
    return CT_OK;
}

/* Spins on the clock: CPU time, as a decode or an augmentation spends it. */
static void spin(double seconds) {
    double until = ct__now_s() + seconds;
    volatile double x = 1.0;
    while (ct__now_s() < until) {
        for (int i = 0; i < 64; i++) {
            x = x * 1.0000001 + 1e-9;
        }
    }
}

static ct_status delay_map(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                           ct_err *err) {
    const delay_params *p = user;
    (void)ctx;
    (void)err;
    if (p->cpu) {
        spin((double)p->micros * 1e-6);
    } else {
        struct timespec ts = {p->micros / 1000000, (p->micros % 1000000) * 1000};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    *ret = *in;
    *in = (ct_element){0};
    return CT_OK;
}

ct_status ct_dataset_map_delay(ct_dataset *in, int64_t micros, int cpu, const ct_map_options *opt,
                               ct_dataset **ret, ct_err *err) {
    if (micros < 0 || micros > 60000000) {
        return ct_err_set(err, CT_EINVAL, "map(delay): micros must be in [0, 60000000], got %lld",
                          (long long)micros);
    }
    delay_params *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "map(delay): out of memory");
    }
    p->micros = micros;
    p->cpu = cpu ? 1 : 0;
    return ct__maps_create(in, "delay", delay_map, delay_spec, p, ct__hash_bytes(0, p, sizeof *p),
                           NULL, opt, ret, err);
}
