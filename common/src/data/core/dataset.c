/* Dataset nodes: creation with reference-counted inputs, the accessors, fingerprints and the
 * pipeline description; the path helpers every kind uses (hashing is core/hash.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/clock.h"
#include "data/core/dataset_impl.h"

char **ct__paths_copy(const char *const *paths, int n, ct_err *err) {
    size_t bytes = (size_t)(n + 1) * sizeof(char *);
    for (int i = 0; i < n; i++) {
        if (paths[i] == NULL) {
            ct_err_set(err, CT_EINVAL, "file %d of %d is NULL", i, n);
            return NULL;
        }
        bytes += strlen(paths[i]) + 1;
    }
    char **block = malloc(bytes);
    if (block == NULL) {
        ct_err_set(err, CT_ENOMEM, "out of memory copying %d file names", n);
        return NULL;
    }
    char *text = (char *)(block + n + 1);
    for (int i = 0; i < n; i++) {
        size_t len = strlen(paths[i]) + 1;
        memcpy(text, paths[i], len);
        block[i] = text;
        text += len;
    }
    block[n] = NULL;
    return block;
}

uint64_t ct__paths_fingerprint(uint64_t h, char *const *paths, int n) {
    for (int i = 0; i < n; i++) {
        struct stat st;
        h = ct__hash_str(h, paths[i]);
        if (stat(paths[i], &st) == 0) {
            h = ct__mix64(h, (uint64_t)st.st_size);
            h = ct__mix64(h, (uint64_t)st.st_mtime);
        }
    }
    return h;
}

ct_status ct__dataset_create(const ct__dataset_ops *ops, void *params, uint64_t param_fingerprint,
                             ct_dataset *const *inputs, int n_inputs, ct_dataset **ret,
                             ct_err *err) {
    ct_dataset *ds = n_inputs <= CT__DATASET_MAX_INPUTS ? calloc(1, sizeof *ds) : NULL;
    if (ds == NULL) {
        if (ops->free_params) {
            ops->free_params(params);
        } else {
            free(params);
        }
        return ct_err_set(err, n_inputs > CT__DATASET_MAX_INPUTS ? CT_EINVAL : CT_ENOMEM, "%s: %s",
                          ops->kind,
                          n_inputs > CT__DATASET_MAX_INPUTS ? "too many inputs" : "out of memory");
    }
    ds->ops = ops;
    atomic_init(&ds->refs, 1);
    ds->params = params;
    ds->cardinality = CT_UNKNOWN;
    snprintf(ds->name, sizeof ds->name, "%s", ops->kind);
    uint64_t h = ct__hash_str(0x6374726169ULL, ops->kind);
    h = ct__mix64(h, param_fingerprint);
    for (int i = 0; i < n_inputs; i++) {
        ds->inputs[i] = ct_dataset_ref(inputs[i]);
        h = ct__mix64(h, inputs[i]->fingerprint);
    }
    ds->n_inputs = n_inputs;
    ds->fingerprint = h;
    *ret = ds;
    return CT_OK;
}

ct_dataset *ct_dataset_ref(ct_dataset *ds) {
    atomic_fetch_add(&ds->refs, 1);
    return ds;
}

void ct_dataset_destroy(ct_dataset *ds) {
    if (ds == NULL || atomic_fetch_sub(&ds->refs, 1) != 1) {
        return;
    }
    for (int i = 0; i < ds->n_inputs; i++) {
        ct_dataset_destroy(ds->inputs[i]);
    }
    if (ds->ops->free_params) {
        ds->ops->free_params(ds->params);
    } else {
        free(ds->params);
    }
    free(ds);
}

const ct_element_spec *ct_dataset_spec(const ct_dataset *ds) {
    return &ds->spec;
}

int64_t ct_dataset_cardinality(const ct_dataset *ds) {
    return ds->cardinality;
}

uint64_t ct_dataset_fingerprint(const ct_dataset *ds) {
    return ds->fingerprint;
}

int ct_dataset_random_access(const ct_dataset *ds) {
    return ds->random_access && ds->ops->get != NULL;
}

static void describe_into(const ct_dataset *ds, char *buf, size_t size, size_t *len) {
    for (int i = 0; i < ds->n_inputs; i++) {
        describe_into(ds->inputs[i], buf, size, len);
    }
    char params[256] = "";
    if (ds->ops->describe) {
        ds->ops->describe(ds, params, sizeof params);
    }
    char spec[256];
    ct_element_spec_str(&ds->spec, spec, sizeof spec);
    char card[32];
    if (ds->cardinality >= 0) {
        snprintf(card, sizeof card, "%lld", (long long)ds->cardinality);
    } else {
        snprintf(card, sizeof card, "%s", ds->cardinality == CT_INFINITE ? "inf" : "?");
    }
    int n = snprintf(buf + *len, *len < size ? size - *len : 0, "%-20s %-40s -> %s x %s\n",
                     ds->name, params, spec, card);
    *len += n > 0 ? (size_t)n : 0;
}

char *ct_dataset_describe(const ct_dataset *ds, char *buf, size_t size) {
    size_t len = 0;
    if (size > 0) {
        buf[0] = '\0';
    }
    describe_into(ds, buf, size, &len);
    if (len >= size && size > 0) {
        buf[size - 1] = '\0';
    }
    return buf;
}

ct_status ct__dataset_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                          ct_err *err) {
    if (!ct_dataset_random_access(ds)) {
        return ct_err_set(err, CT_EINVAL, "%s: not random-access", ds->name);
    }
    return ds->ops->get(ds, epoch, index, ret, err);
}

ct_status ct__dataset_get_into(const ct_dataset *ds, int64_t epoch, int64_t index,
                               ct_element *batch, int64_t row, ct_err *err) {
    if (ds->ops->get_into != NULL) {
        return ds->ops->get_into(ds, epoch, index, batch, row, err);
    }
    ct_element e = {0};
    ct_status st = ct__dataset_get(ds, epoch, index, &e, err);
    for (int c = 0; st == CT_OK && c < e.n; c++) {
        size_t bytes = ct__value_bytes(&e.v[c]);
        if (c >= batch->n ||
            bytes * (size_t)batch->v[c].shape.dims[0] != ct__value_bytes(&batch->v[c])) {
            st =
                ct_err_set(err, CT_ESHAPE, "%s: element %lld's component %d does not fit the batch",
                           ds->name, (long long)index, c);
        } else {
            memcpy((char *)batch->v[c].data + (size_t)row * bytes, e.v[c].data, bytes);
        }
    }
    ct_element_clear(&e);
    return st;
}

uint64_t ct_map_stream(const ct_map_ctx *ctx) {
    return ct__mix64(ct__mix64(0x6d6170ULL, (uint64_t)ctx->epoch), ctx->key);
}
