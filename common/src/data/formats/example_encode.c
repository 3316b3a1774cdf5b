/* The tf.train.Example encoder (ctrain/tfrecord.h). Every size on the wire is known before the
 * bytes are written (a feature's list is sized from its values), so each feature's map entry is
 * appended to one buffer in a single pass; encode then writes the Example's own tag and length
 * into headroom kept in front of the entries, and the record is one contiguous view, no copy. */
#include <stdlib.h>
#include <string.h>

#include "ctrain/tfrecord.h"

#define HEADROOM 16 /* a tag byte and a varint of at most 10 bytes */

enum { WIRE_LEN = 2 };
enum { KIND_BYTES = 1, KIND_FLOAT = 2, KIND_INT64 = 3 };

struct ct_example_builder {
    unsigned char *buf; /* HEADROOM bytes, then the map entries */
    size_t cap, len;    /* len counts from buf[0], headroom included */
};

static size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* The size of a length-delimited field with a one-byte tag holding `len` bytes. */
static size_t len_field_size(uint64_t len) {
    return 1 + varint_size(len) + (size_t)len;
}

static unsigned char *put_varint(unsigned char *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    *p++ = (unsigned char)v;
    return p;
}

/* A length-delimited field's tag and length. */
static unsigned char *put_len_head(unsigned char *p, uint32_t number, uint64_t len) {
    *p++ = (unsigned char)(number << 3 | WIRE_LEN);
    return put_varint(p, len);
}

static ct_status reserve(ct_example_builder *b, size_t more, ct_err *err) {
    if (b->len + more <= b->cap) {
        return CT_OK;
    }
    size_t cap = b->cap * 2 > b->len + more ? b->cap * 2 : b->len + more;
    unsigned char *bigger = realloc(b->buf, cap);
    if (bigger == NULL) {
        return ct_err_set(err, CT_ENOMEM, "Example builder: out of memory for %zu bytes", cap);
    }
    b->buf = bigger;
    b->cap = cap;
    return CT_OK;
}

/* Appends a map entry's framing up to the list's payload: entry, key, Feature and list heads.
 * `list_len` is the size of the list message; the caller then writes it at *ret_at. */
static ct_status begin_entry(ct_example_builder *b, const char *name, int kind, size_t list_len,
                             unsigned char **ret_at, ct_err *err) {
    size_t key_len = strlen(name);
    size_t feature_len = len_field_size(list_len);
    size_t entry_len = len_field_size(key_len) + len_field_size(feature_len);
    ct_status st = reserve(b, len_field_size(entry_len), err);
    if (st != CT_OK) {
        return st;
    }
    unsigned char *p = put_len_head(b->buf + b->len, 1, entry_len); /* Features.feature */
    p = put_len_head(p, 1, key_len);                                /* entry.key */
    memcpy(p, name, key_len);
    p = put_len_head(p + key_len, 2, feature_len); /* entry.value */
    p = put_len_head(p, (uint32_t)kind, list_len); /* Feature.kind */
    b->len += len_field_size(entry_len);
    *ret_at = p;
    return CT_OK;
}

static ct_status check_add(const ct_example_builder *b, const char *name, const void *values,
                           size_t n, ct_err *err) {
    if (b == NULL || name == NULL || (values == NULL && n > 0)) {
        return ct_err_set(err, CT_EINVAL, "Example builder: no builder, name or values");
    }
    return CT_OK;
}

ct_status ct_example_builder_add_floats(ct_example_builder *b, const char *name,
                                        const float *values, size_t n, ct_err *err) {
    ct_status st = check_add(b, name, values, n, err);
    size_t list_len = n > 0 ? len_field_size(4 * (uint64_t)n) : 0;
    unsigned char *p = NULL;
    if (st != CT_OK || (st = begin_entry(b, name, KIND_FLOAT, list_len, &p, err)) != CT_OK) {
        return st;
    }
    if (n > 0) {
        p = put_len_head(p, 1, 4 * (uint64_t)n);
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &values[i], sizeof bits);
        for (int k = 0; k < 4; k++) {
            *p++ = (unsigned char)(bits >> (8 * k));
        }
    }
    return CT_OK;
}

ct_status ct_example_builder_add_int64s(ct_example_builder *b, const char *name,
                                        const int64_t *values, size_t n, ct_err *err) {
    ct_status st = check_add(b, name, values, n, err);
    size_t payload = 0;
    for (size_t i = 0; st == CT_OK && i < n; i++) {
        payload += varint_size((uint64_t)values[i]);
    }
    size_t list_len = n > 0 ? len_field_size(payload) : 0;
    unsigned char *p = NULL;
    if (st != CT_OK || (st = begin_entry(b, name, KIND_INT64, list_len, &p, err)) != CT_OK) {
        return st;
    }
    if (n > 0) {
        p = put_len_head(p, 1, payload);
    }
    for (size_t i = 0; i < n; i++) {
        p = put_varint(p, (uint64_t)values[i]);
    }
    return CT_OK;
}

ct_status ct_example_builder_add_bytes(ct_example_builder *b, const char *name,
                                       const void *const *values, const size_t *lens, size_t n,
                                       ct_err *err) {
    ct_status st = check_add(b, name, values, n, err);
    size_t list_len = 0;
    for (size_t i = 0; st == CT_OK && i < n; i++) {
        if (lens == NULL || (values[i] == NULL && lens[i] > 0)) {
            return ct_err_set(err, CT_EINVAL, "Example builder: '%s': value %zu has no data", name,
                              i);
        }
        list_len += len_field_size(lens[i]);
    }
    unsigned char *p = NULL;
    if (st != CT_OK || (st = begin_entry(b, name, KIND_BYTES, list_len, &p, err)) != CT_OK) {
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        p = put_len_head(p, 1, lens[i]);
        if (lens[i] > 0) {
            memcpy(p, values[i], lens[i]);
        }
        p += lens[i];
    }
    return CT_OK;
}

ct_status ct_example_builder_create(ct_example_builder **ret, ct_err *err) {
    ct_example_builder *b = ret ? calloc(1, sizeof *b) : NULL;
    if (b == NULL || (b->buf = malloc(256)) == NULL) {
        free(b);
        return ct_err_set(err, ret ? CT_ENOMEM : CT_EINVAL, "Example builder: %s",
                          ret ? "out of memory" : "ret must not be NULL");
    }
    b->cap = 256;
    b->len = HEADROOM;
    *ret = b;
    return CT_OK;
}

ct_status ct_example_builder_encode(ct_example_builder *b, const void **ret_data, size_t *ret_len,
                                    ct_err *err) {
    if (b == NULL || ret_data == NULL || ret_len == NULL) {
        return ct_err_set(err, CT_EINVAL, "Example builder: no builder or no ret");
    }
    size_t body = b->len - HEADROOM;
    unsigned char head[HEADROOM];
    size_t head_len = (size_t)(put_len_head(head, 1, body) - head); /* Example.features */
    unsigned char *start = b->buf + HEADROOM - head_len;
    memcpy(start, head, head_len);
    *ret_data = start;
    *ret_len = head_len + body;
    return CT_OK;
}

void ct_example_builder_clear(ct_example_builder *b) {
    if (b != NULL) {
        b->len = HEADROOM;
    }
}

void ct_example_builder_destroy(ct_example_builder *b) {
    if (b != NULL) {
        free(b->buf);
        free(b);
    }
}
