/* tf.train.Example, by hand on the protobuf wire format (no generated code: the messages are
 * three levels of length-delimited fields, and a parser that only looks for the features of a
 * spec never builds the map):
 *   Example  { Features features = 1; }
 *   Features { map<string, Feature> feature = 1; }   entries: { string key = 1; Feature value = 2;
 * } Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List
 * int64_list = 3; } } BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1
 * [packed]; } Int64List { repeated int64 value = 1 [packed]; } Parsing follows protobuf's merge
 * rules where they matter: a repeated message field
 * (`features`) may come in several pieces, a map key seen twice keeps its last value, a oneof
 * keeps the last kind set, and a packed field may also arrive unpacked. The builder writes
 * what TensorFlow writes: packed lists, features in the order added. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/tfrecord.h"
#include "data/core/dataset_impl.h"

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };
enum { KIND_NONE = 0, KIND_BYTES = 1, KIND_FLOAT = 2, KIND_INT64 = 3 };

static const char *const kind_names[] = {"no list", "bytes_list", "float_list", "int64_list"};

/* ---- wire reading ---- */

typedef struct wire {
    const unsigned char *p, *end;
} wire;

/* One field: its number, wire type and value (varint and fixed values in `value`, a
 * length-delimited one in bytes[0..len)). */
typedef struct field {
    uint32_t number;
    int type;
    uint64_t value;
    const unsigned char *bytes;
    size_t len;
} field;

static int read_varint(wire *w, uint64_t *ret) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && w->p < w->end; shift += 7) {
        unsigned char b = *w->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *ret = v;
            return 1;
        }
    }
    return 0;
}

static int read_fixed(wire *w, int bytes, uint64_t *ret) {
    if (w->end - w->p < bytes) {
        return 0;
    }
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) {
        v = v << 8 | w->p[i];
    }
    w->p += bytes;
    *ret = v;
    return 1;
}

/* Reads the next field; 0 when the data is malformed. */
static int read_field(wire *w, field *f) {
    uint64_t tag = 0;
    if (!read_varint(w, &tag) || (tag >> 3) == 0 || (tag >> 3) > UINT32_MAX) {
        return 0;
    }
    f->number = (uint32_t)(tag >> 3);
    f->type = (int)(tag & 7);
    switch (f->type) {
    case WIRE_VARINT:
        return read_varint(w, &f->value);
    case WIRE_FIXED64:
        return read_fixed(w, 8, &f->value);
    case WIRE_FIXED32:
        return read_fixed(w, 4, &f->value);
    case WIRE_LEN:
        if (!read_varint(w, &f->value) || f->value > (uint64_t)(w->end - w->p)) {
            return 0;
        }
        f->bytes = w->p;
        f->len = (size_t)f->value;
        w->p += f->len;
        return 1;
    default:
        return 0; /* groups: not in these messages */
    }
}

/* ---- parsing ---- */

/* A feature of the spec as found in the Example: its list kind and the list message. */
typedef struct found {
    int kind;
    const unsigned char *list;
    size_t list_len;
} found;

static ct_status malformed(const char *where, ct_err *err) {
    return ct_err_set(err, CT_EFORMAT, "Example: malformed protobuf data in %s", where);
}

/* Reads a Feature message: the last list kind set wins. */
static int read_feature(const unsigned char *p, size_t n, found *ret) {
    wire w = {p, p + n};
    field f;
    *ret = (found){0};
    while (w.p < w.end) {
        if (!read_field(&w, &f)) {
            return 0;
        }
        if (f.type == WIRE_LEN && f.number >= KIND_BYTES && f.number <= KIND_INT64) {
            *ret = (found){(int)f.number, f.bytes, f.len};
        }
    }
    return 1;
}

/* One map entry of Features: records the value when its key names a spec feature. */
static ct_status read_entry(const unsigned char *p, size_t n, const ct_feature_spec *spec,
                            int n_features, found *found_at, ct_err *err) {
    wire w = {p, p + n};
    field f;
    const unsigned char *key = NULL, *value = NULL;
    size_t key_len = 0, value_len = 0;
    while (w.p < w.end) {
        if (!read_field(&w, &f)) {
            return malformed("a feature map entry", err);
        }
        if (f.type == WIRE_LEN && f.number == 1) {
            key = f.bytes, key_len = f.len;
        } else if (f.type == WIRE_LEN && f.number == 2) {
            value = f.bytes, value_len = f.len;
        }
    }
    for (int i = 0; key != NULL && i < n_features; i++) {
        if (strlen(spec[i].name) == key_len && memcmp(spec[i].name, key, key_len) == 0) {
            if (!read_feature(value ? value : p, value ? value_len : 0, &found_at[i])) {
                return ct_err_set(err, CT_EFORMAT, "Example: feature '%s': malformed protobuf data",
                                  spec[i].name);
            }
        }
    }
    return CT_OK;
}

/* Walks Example.features (all pieces) and their map entries. */
static ct_status find_features(const unsigned char *p, size_t n, const ct_feature_spec *spec,
                               int n_features, found *found_at, ct_err *err) {
    wire w = {p, p + n};
    field f;
    while (w.p < w.end) {
        if (!read_field(&w, &f)) {
            return malformed("the Example", err);
        }
        if (f.type != WIRE_LEN || f.number != 1) {
            continue;
        }
        wire features = {f.bytes, f.bytes + f.len};
        field entry;
        while (features.p < features.end) {
            if (!read_field(&features, &entry)) {
                return malformed("the Features", err);
            }
            if (entry.type != WIRE_LEN || entry.number != 1) {
                continue;
            }
            ct_status st = read_entry(entry.bytes, entry.len, spec, n_features, found_at, err);
            if (st != CT_OK) {
                return st;
            }
        }
    }
    return CT_OK;
}

static void store(int kind, void *out, size_t max, size_t i, uint64_t v) {
    if (out == NULL || i >= max) {
        return;
    }
    if (kind == KIND_FLOAT) {
        uint32_t bits = (uint32_t)v;
        memcpy((float *)out + i, &bits, sizeof bits);
    } else {
        ((int64_t *)out)[i] = (int64_t)v;
    }
}

/* The values of a list: counts them and, when out is not NULL, stores the first `max` (a
 * float_list into float out[], an int64_list into int64_t out[]; a bytes_list's last value goes
 * to *ret_bytes). 0 when the list is malformed. */
static int list_values(const found *fd, void *out, size_t max, size_t *ret_count,
                       const unsigned char **ret_bytes, size_t *ret_bytes_len) {
    wire w = {fd->list, fd->list + fd->list_len};
    field f;
    size_t count = 0;
    while (w.p < w.end) {
        if (!read_field(&w, &f)) {
            return 0;
        }
        if (f.number != 1) {
            continue;
        }
        if (fd->kind == KIND_BYTES && f.type == WIRE_LEN) {
            if (ret_bytes != NULL) {
                *ret_bytes = f.bytes, *ret_bytes_len = f.len;
            }
            count++;
        } else if (f.type == WIRE_LEN) { /* packed floats or varints */
            wire packed = {f.bytes, f.bytes + f.len};
            uint64_t v = 0;
            while (packed.p < packed.end) {
                if (!(fd->kind == KIND_FLOAT ? read_fixed(&packed, 4, &v)
                                             : read_varint(&packed, &v))) {
                    return 0;
                }
                store(fd->kind, out, max, count++, v);
            }
        } else if ((fd->kind == KIND_FLOAT && f.type == WIRE_FIXED32) ||
                   (fd->kind == KIND_INT64 && f.type == WIRE_VARINT)) {
            store(fd->kind, out, max, count++, f.value);
        } else {
            return 0; /* a value of the wrong wire type */
        }
    }
    *ret_count = count;
    return 1;
}

static int expected_kind(int dtype) {
    return dtype == CT_F32                      ? KIND_FLOAT
           : dtype == CT_I32 || dtype == CT_I64 ? KIND_INT64
                                                : KIND_BYTES;
}

/* Component i of ret filled with the spec's default. */
static ct_status fill_default(const ct_feature_spec *s, const ct_shape *shape, int i,
                              ct_element *ret) {
    ct_status st = ct_element_alloc(ret, i, s->dtype, shape, 0);
    int64_t numel = ct_shape_numel(shape);
    for (int64_t k = 0; st == CT_OK && s->dtype != CT_VALUE_BYTES && k < numel; k++) {
        void *data = ret->v[i].data;
        switch (s->dtype) {
        case CT_F32:
            ((float *)data)[k] = (float)s->default_value;
            break;
        case CT_I32:
            ((int32_t *)data)[k] = (int32_t)s->default_value;
            break;
        case CT_I64:
            ((int64_t *)data)[k] = (int64_t)s->default_value;
            break;
        default:
            ((uint8_t *)data)[k] = (uint8_t)s->default_value;
        }
    }
    return st;
}

/* Decodes an int64_list of `numel` values into an i32 tensor, checking the range. */
static ct_status narrow_to_i32(const ct_feature_spec *s, const found *fd, int32_t *out,
                               int64_t numel, ct_err *err) {
    int64_t *wide = malloc(sizeof(int64_t) * (size_t)(numel > 0 ? numel : 1));
    size_t count = 0;
    if (wide == NULL) {
        return ct_err_set(err, CT_ENOMEM, "Example: feature '%s': out of memory", s->name);
    }
    list_values(fd, wide, (size_t)numel, &count, NULL, NULL);
    for (int64_t k = 0; k < numel; k++) {
        if (wide[k] < INT32_MIN || wide[k] > INT32_MAX) {
            long long v = (long long)wide[k];
            free(wide);
            return ct_err_set(err, CT_EFORMAT,
                              "Example: feature '%s': value %lld at %lld does not fit in i32",
                              s->name, v, (long long)k);
        }
        out[k] = (int32_t)wide[k];
    }
    free(wide);
    return CT_OK;
}

/* Component i of ret from the list found for spec s (kind and count already checked). */
static ct_status decode_values(const ct_feature_spec *s, const found *fd, const ct_shape *shape,
                               const unsigned char *bytes, size_t bytes_len, int i, ct_element *ret,
                               ct_err *err) {
    size_t count = 0;
    int64_t numel = ct_shape_numel(shape);
    if (ct_element_alloc(ret, i, s->dtype, shape, bytes_len) != CT_OK) {
        return ct_err_set(err, CT_ENOMEM, "Example: feature '%s': out of memory", s->name);
    }
    void *data = ret->v[i].data;
    switch (s->dtype) {
    case CT_VALUE_BYTES:
    case CT_U8:
        memcpy(data, bytes, bytes_len);
        return CT_OK;
    case CT_I32:
        return narrow_to_i32(s, fd, data, numel, err);
    default:
        list_values(fd, data, (size_t)numel, &count, NULL, NULL);
        return CT_OK;
    }
}

/* Component i of ret: the feature's values checked against spec s, or its default. */
static ct_status fill_feature(const ct_feature_spec *s, const found *fd, int i, ct_element *ret,
                              ct_err *err) {
    ct_shape shape = ct_shape_make(s->rank, s->dims);
    size_t count = 0, bytes_len = 0;
    const unsigned char *bytes = NULL;
    if (fd->kind != KIND_NONE && !list_values(fd, NULL, 0, &count, &bytes, &bytes_len)) {
        return ct_err_set(err, CT_EFORMAT, "Example: feature '%s': malformed %s", s->name,
                          kind_names[fd->kind]);
    }
    if (count == 0 && s->has_default) {
        return fill_default(s, &shape, i, ret) == CT_OK
                   ? CT_OK
                   : ct_err_set(err, CT_ENOMEM, "Example: feature '%s': out of memory", s->name);
    }
    if (fd->kind == KIND_NONE) {
        return ct_err_set(err, CT_EFORMAT, "Example: feature '%s' is missing and has no default",
                          s->name);
    }
    if (fd->kind != expected_kind(s->dtype)) {
        return ct_err_set(err, CT_EFORMAT, "Example: feature '%s': expected %s, found %s", s->name,
                          kind_names[expected_kind(s->dtype)], kind_names[fd->kind]);
    }
    int64_t numel = ct_shape_numel(&shape);
    int one_string = s->dtype == CT_U8 || s->dtype == CT_VALUE_BYTES;
    int64_t want = one_string ? 1 : numel;
    if ((int64_t)count != want) {
        return ct_err_set(err, CT_EFORMAT,
                          "Example: feature '%s': expected %lld value%s, found %zu", s->name,
                          (long long)want, want == 1 ? "" : "s", count);
    }
    if (s->dtype == CT_U8 && (int64_t)bytes_len != numel) {
        return ct_err_set(err, CT_EFORMAT,
                          "Example: feature '%s': expected %lld bytes of u8 data, found %zu",
                          s->name, (long long)numel, bytes_len);
    }
    return decode_values(s, fd, &shape, bytes, bytes_len, i, ret, err);
}

static ct_status check_spec(const ct_feature_spec *spec, int n_features, ct_err *err) {
    if (spec == NULL || n_features < 1 || n_features > CT_ELEMENT_MAX) {
        return ct_err_set(err, CT_EINVAL, "Example: 1 to %d features are needed", CT_ELEMENT_MAX);
    }
    for (int i = 0; i < n_features; i++) {
        const ct_feature_spec *s = &spec[i];
        int dtype_ok = s->dtype == CT_F32 || s->dtype == CT_I32 || s->dtype == CT_I64 ||
                       s->dtype == CT_U8 || s->dtype == CT_VALUE_BYTES;
        int rank_ok =
            s->rank >= 0 && s->rank <= CT_MAX_DIMS && (s->dtype != CT_VALUE_BYTES || s->rank == 0);
        for (int d = 0; rank_ok && d < s->rank; d++) {
            rank_ok = s->dims[d] >= 0 && s->dims[d] <= INT32_MAX;
        }
        if (s->name == NULL || !dtype_ok || !rank_ok) {
            return ct_err_set(err, CT_EINVAL,
                              "Example: spec %d ('%s'): needs a name, a dtype (f32, i32, i64, u8 "
                              "or bytes) and a fixed shape (bytes: a scalar)",
                              i, s->name ? s->name : "");
        }
    }
    return CT_OK;
}

ct_status ct_example_parse(const void *data, size_t n, const ct_feature_spec *spec, int n_features,
                           ct_element *ret, ct_err *err) {
    ct_status st = check_spec(spec, n_features, err);
    if (st != CT_OK) {
        return st;
    }
    if ((data == NULL && n > 0) || ret == NULL) {
        return ct_err_set(err, CT_EINVAL, "Example: no data or no ret");
    }
    static const unsigned char no_bytes[1];
    found found_at[CT_ELEMENT_MAX];
    memset(found_at, 0, sizeof found_at);
    st = find_features(n > 0 ? data : no_bytes, n, spec, n_features, found_at, err);
    for (int i = 0; st == CT_OK && i < n_features; i++) {
        st = fill_feature(&spec[i], &found_at[i], i, ret, err);
    }
    if (st != CT_OK) {
        ct_element_clear(ret);
    }
    return st;
}
