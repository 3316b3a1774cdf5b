/* The CSV source: RFC 4180 records ("" inside quotes is a quote; quoted fields may hold the
 * delimiter and newlines; CRLF or LF line ends), an optional header line, typed columns picked
 * by header name or by index, one scalar component per picked column. Blank lines are skipped.
 *
 * A record is scanned byte by byte by one state machine; skip runs the same machine without
 * keeping the bytes or converting anything, which it has to run anyway to tell a newline inside
 * quotes from a record end. Names are resolved against each file's own header, so files whose
 * columns come in different orders read alike. Line numbers in messages are the physical line
 * where the record starts.
 *
 * Options: opt NULL means a header and ','; otherwise `header` is taken as given (0: no header
 * line), and delimiter 0 means ','. n_columns 0 picks every column of the first file as f32. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/core/dataset_impl.h"
#include "data/formats/file_reader.h"
#include "data/sources/stream.h"

#define CSV_BUFFER_BYTES ((size_t)256 << 10)

typedef struct csv_params {
    char **paths;
    int n;
    int header;
    char delim;
    int n_columns;
    char **names; /* ct__paths_copy block of the picked names; NULL: by index */
    int *indices; /* picked column numbers (by index, or every column) */
    int *dtypes;
} csv_params;

/* The scanner of one file: the reader, the line count and the fields of the last record. */
typedef struct csv_scan {
    ct__reader r;
    char delim;
    int64_t line;        /* physical line of the next byte (1-based) */
    int64_t record_line; /* where the last record started */
    int64_t chars;       /* content bytes of the last record (0 and one field: a blank line) */
    char *text;          /* the record's fields, each NUL-terminated */
    size_t text_len, text_cap;
    size_t *starts; /* field f is text + starts[f] */
    int n_fields, fields_cap;
} csv_scan;

static ct_status no_memory(const csv_scan *s, ct_err *err) {
    return ct_err_set(err, CT_ENOMEM, "%s: out of memory", s->r.path);
}

static ct_status put_byte(csv_scan *s, int c, ct_err *err) {
    if (s->text_len == s->text_cap) {
        size_t cap = s->text_cap ? 2 * s->text_cap : 256;
        char *bigger = realloc(s->text, cap);
        if (bigger == NULL) {
            return no_memory(s, err);
        }
        s->text = bigger, s->text_cap = cap;
    }
    s->text[s->text_len++] = (char)c;
    return CT_OK;
}

/* Room for field number n_fields + 1's start. */
static ct_status grow_fields(csv_scan *s, ct_err *err) {
    if (s->n_fields + 1 < s->fields_cap) {
        return CT_OK;
    }
    int cap = s->fields_cap ? 2 * s->fields_cap : 16;
    size_t *bigger = realloc(s->starts, sizeof(size_t) * (size_t)cap);
    if (bigger == NULL) {
        return no_memory(s, err);
    }
    s->starts = bigger, s->fields_cap = cap;
    return CT_OK;
}

/* Ends the current field (kept: NUL-terminated) and starts the next. */
static ct_status end_field(csv_scan *s, int keep, ct_err *err) {
    ct_status st = keep ? put_byte(s, 0, err) : CT_OK;
    if (st == CT_OK && keep) {
        st = grow_fields(s, err);
    }
    s->n_fields++;
    if (st == CT_OK && keep) {
        s->starts[s->n_fields] = s->text_len;
    }
    return st;
}

/* The next byte, or -1 at the end of the file. */
static int next_byte(csv_scan *s, ct_status *st, ct_err *err) {
    if (s->r.pos == s->r.len && (*st = ct__reader_fill(&s->r, s->r.cap, err)) != CT_OK) {
        return -1;
    }
    if (s->r.pos == s->r.len) {
        return -1;
    }
    int c = s->r.buf[s->r.pos++];
    s->line += c == '\n';
    return c;
}

static int peek_byte(csv_scan *s, ct_status *st, ct_err *err) {
    if (s->r.pos == s->r.len && (*st = ct__reader_fill(&s->r, s->r.cap, err)) != CT_OK) {
        return -1;
    }
    return s->r.pos == s->r.len ? -1 : s->r.buf[s->r.pos];
}

/* Scans one record (keep: store its fields); *ret_end at the end of the file. A blank line
 * is a record of one empty field; the caller skips those. */
static ct_status scan_record(csv_scan *s, int keep, int *ret_end, ct_err *err) {
    ct_status st = CT_OK;
    int quoted = 0, any = 0, c;
    s->text_len = 0;
    s->n_fields = 0;
    s->chars = 0;
    if (keep && (st = grow_fields(s, err)) != CT_OK) {
        return st;
    }
    if (keep) {
        s->starts[0] = 0;
    }
    s->record_line = s->line;
    while ((c = next_byte(s, &st, err)) >= 0) {
        any = 1;
        if (quoted) {
            if (c == '"' && peek_byte(s, &st, err) == '"') {
                next_byte(s, &st, err);
            } else if (c == '"') {
                quoted = 0;
                continue;
            }
        } else if (c == '"') {
            quoted = 1;
            continue;
        } else if (c == s->delim || c == '\n') {
            if ((st = end_field(s, keep, err)) != CT_OK || c == '\n') {
                break;
            }
            continue;
        } else if (c == '\r' && peek_byte(s, &st, err) == '\n') {
            continue;
        }
        s->chars++;
        if (keep && (st = put_byte(s, c, err)) != CT_OK) {
            break;
        }
    }
    if (st != CT_OK) {
        return st;
    }
    if (quoted) {
        return ct_err_set(err, CT_EFORMAT, "%s:%lld: unterminated quoted field", s->r.path,
                          (long long)s->record_line);
    }
    *ret_end = !any;
    return c < 0 && any ? end_field(s, keep, err) : CT_OK;
}

/* The next record that is not a blank line. */
static ct_status next_row(csv_scan *s, int keep, int *ret_end, ct_err *err) {
    ct_status st;
    do {
        st = scan_record(s, keep, ret_end, err);
    } while (st == CT_OK && !*ret_end && s->n_fields == 1 && s->chars == 0);
    return st;
}

static const char *field_text(const csv_scan *s, int f) {
    return s->text + s->starts[f];
}

static ct_status scan_open(csv_scan *s, const char *path, char delim, ct_err *err) {
    memset(s, 0, sizeof *s);
    s->delim = delim;
    s->line = 1;
    return ct__reader_open(&s->r, path, CSV_BUFFER_BYTES, err);
}

static void scan_close(csv_scan *s) {
    ct__reader_close(&s->r);
    free(s->text);
    free(s->starts);
    memset(s, 0, sizeof *s);
}

/* ---- the iterator ---- */

typedef struct csv_iter {
    ct__stream_iter base;
    int file;
    csv_scan scan; /* scan.r.is_open: a file is open */
    int *cols;     /* this file's field number of each picked column */
    char *header;  /* this file's header fields (NULL without a header) */
    size_t *header_starts;
    int header_fields;
} csv_iter;

/* The name of picked column k for messages: its name, or its header name, or its number. */
static const char *column_label(const csv_params *p, const csv_iter *t, int k, char *buf,
                                size_t size) {
    if (p->names != NULL) {
        return p->names[k];
    }
    if (t->header != NULL && t->cols[k] < t->header_fields) {
        return t->header + t->header_starts[t->cols[k]];
    }
    snprintf(buf, size, "%d", t->cols[k]);
    return buf;
}

/* Keeps a copy of the header record and resolves the picked names against it. */
static ct_status read_header(const csv_params *p, csv_iter *t, int *ret_empty, ct_err *err) {
    csv_scan *s = &t->scan;
    ct_status st = next_row(s, 1, ret_empty, err);
    if (st != CT_OK || *ret_empty) {
        return st;
    }
    free(t->header);
    free(t->header_starts);
    t->header = malloc(s->text_len + 1);
    t->header_starts = malloc(sizeof(size_t) * (size_t)(s->n_fields + 1));
    if (t->header == NULL || t->header_starts == NULL) {
        return no_memory(s, err);
    }
    memcpy(t->header, s->text, s->text_len);
    memcpy(t->header_starts, s->starts, sizeof(size_t) * (size_t)(s->n_fields + 1));
    t->header_fields = s->n_fields;
    for (int k = 0; p->names != NULL && k < p->n_columns; k++) {
        t->cols[k] = -1;
        for (int f = 0; f < s->n_fields && t->cols[k] < 0; f++) {
            t->cols[k] = strcmp(field_text(s, f), p->names[k]) == 0 ? f : -1;
        }
        if (t->cols[k] < 0) {
            return ct_err_set(err, CT_EFORMAT, "%s:%lld: no column named '%s' in the header",
                              s->r.path, (long long)s->record_line, p->names[k]);
        }
    }
    return CT_OK;
}

/* Opens file t->file and reads its header; *ret_empty for a file with no lines at all. */
static ct_status open_file(const csv_params *p, csv_iter *t, int *ret_empty, ct_err *err) {
    ct_status st = scan_open(&t->scan, p->paths[t->file], p->delim, err);
    *ret_empty = 0;
    if (st == CT_OK && p->names == NULL) {
        memcpy(t->cols, p->indices, sizeof(int) * (size_t)p->n_columns);
    }
    if (st == CT_OK && p->header) {
        st = read_header(p, t, ret_empty, err);
    }
    return st;
}

static ct_status parse_field(const char *text, int dtype, void *out, const char **ret_why) {
    char *end = NULL;
    errno = 0;
    if (dtype == CT_F32) {
        *(float *)out = strtof(text, &end);
    } else {
        long long v = strtoll(text, &end, 10);
        int fits = errno != ERANGE && (dtype == CT_I64 || (v >= INT32_MIN && v <= INT32_MAX));
        if (end != text && !fits) {
            *ret_why = dtype == CT_I32 ? "is out of range for i32" : "is out of range for i64";
            return 0;
        }
        if (dtype == CT_I32) {
            *(int32_t *)out = (int32_t)v;
        } else {
            *(int64_t *)out = (int64_t)v;
        }
    }
    while (end != NULL && end != text && (*end == ' ' || *end == '\t')) {
        end++;
    }
    *ret_why = "is not a number";
    return end != text && *end == '\0';
}

/* The picked columns of the current record into ret. */
static ct_status convert_row(const csv_params *p, csv_iter *t, ct_element *ret, ct_err *err) {
    const csv_scan *s = &t->scan;
    ct_shape scalar = {.rank = 0};
    for (int k = 0; k < p->n_columns; k++) {
        char label_buf[16];
        const char *label = column_label(p, t, k, label_buf, sizeof label_buf);
        if (t->cols[k] >= s->n_fields) {
            return ct_err_set(err, CT_EFORMAT,
                              "%s:%lld: column %s: missing (the record has %d "
                              "fields)",
                              s->r.path, (long long)s->record_line, label, s->n_fields);
        }
        const char *text = field_text(s, t->cols[k]);
        size_t len = s->starts[t->cols[k] + 1] - s->starts[t->cols[k]] - 1;
        if (ct_element_alloc(ret, k, p->dtypes[k], &scalar, len) != CT_OK) {
            return no_memory(s, err);
        }
        const char *why = NULL;
        if (p->dtypes[k] == CT_VALUE_BYTES) {
            memcpy(ret->v[k].data, text, len);
        } else if (!parse_field(text, p->dtypes[k], ret->v[k].data, &why)) {
            return ct_err_set(err, CT_EFORMAT, "%s:%lld: column %s: '%.64s'%s %s", s->r.path,
                              (long long)s->record_line, label, text, len > 64 ? "..." : "", why);
        }
    }
    return CT_OK;
}

static void close_file(csv_iter *t) {
    scan_close(&t->scan);
    t->file++;
}

/* The next row into ret (NULL: skipped without keeping or converting its fields). */
static ct_status advance(ct__stream_iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    csv_iter *t = (csv_iter *)it;
    const csv_params *p = it->base.ds->params;
    for (;;) {
        int end = 0;
        ct_status st = CT_OK;
        if (!t->scan.r.is_open) {
            if (t->file >= p->n) {
                *ret_end = 1;
                return CT_OK;
            }
            st = open_file(p, t, &end, err);
        }
        if (st == CT_OK && !end) {
            st = next_row(&t->scan, ret != NULL, &end, err);
        }
        if (st != CT_OK) {
            return st;
        }
        if (!end) {
            return ret != NULL ? convert_row(p, t, ret, err) : CT_OK;
        }
        close_file(t);
    }
}

static void csv_close(ct__stream_iter *it) {
    csv_iter *t = (csv_iter *)it;
    scan_close(&t->scan);
    free(t->cols);
    free(t->header);
    free(t->header_starts);
}

static ct_status csv_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                               ct_err *err) {
    const csv_params *p = ds->params;
    ct_status st = ct__stream_make_iter(ds, ctx, sizeof(csv_iter), advance, csv_close, ret, err);
    csv_iter *t = st == CT_OK ? (csv_iter *)*ret : NULL;
    if (t != NULL && (t->cols = calloc((size_t)p->n_columns, sizeof(int))) == NULL) {
        ct__iter_destroy(*ret);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    return st;
}

/* ---- the dataset ---- */

static void csv_free(void *params) {
    csv_params *p = params;
    if (p != NULL) {
        free(p->paths);
        free(p->names);
        free(p->indices);
        free(p->dtypes);
    }
    free(p);
}

static void csv_describe(const ct_dataset *ds, char *buf, size_t size) {
    const csv_params *p = ds->params;
    snprintf(buf, size, "%s%s, %d columns%s", p->paths[0], p->n > 1 ? ", ..." : "", p->n_columns,
             p->header ? ", header" : "");
}

static const ct__dataset_ops csv_ops = {
    .kind = "csv",
    .make_iter = csv_make_iter,
    .describe = csv_describe,
    .free_params = csv_free,
};

/* n_columns 0: every column of the first file's first line (header or data), all f32. */
static ct_status pick_all_columns(csv_params *p, ct_err *err) {
    csv_scan s;
    int end = 0;
    ct_status st = scan_open(&s, p->paths[0], p->delim, err);
    if (st == CT_OK && (st = next_row(&s, 0, &end, err)) == CT_OK && end) {
        st = ct_err_set(err, CT_EFORMAT, "%s: empty: no line to count the columns of", p->paths[0]);
    }
    p->n_columns = s.n_fields;
    scan_close(&s);
    if (st == CT_OK && p->n_columns > CT_ELEMENT_MAX) {
        st = ct_err_set(err, CT_EINVAL, "%s: %d columns; pick at most %d", p->paths[0],
                        p->n_columns, CT_ELEMENT_MAX);
    }
    p->indices = st == CT_OK ? malloc(sizeof(int) * (size_t)p->n_columns) : NULL;
    p->dtypes = st == CT_OK ? malloc(sizeof(int) * (size_t)p->n_columns) : NULL;
    if (st == CT_OK && (p->indices == NULL || p->dtypes == NULL)) {
        st = ct_err_set(err, CT_ENOMEM, "csv: out of memory");
    }
    for (int k = 0; st == CT_OK && k < p->n_columns; k++) {
        p->indices[k] = k;
        p->dtypes[k] = CT_F32;
    }
    return st;
}

/* Copies the picked columns of the options. */
static ct_status pick_columns(csv_params *p, const ct_csv_options *opt, ct_err *err) {
    int n = opt->n_columns;
    for (int k = 0; k < n; k++) {
        int dtype = opt->dtypes ? opt->dtypes[k] : -99;
        if ((dtype != CT_F32 && dtype != CT_I32 && dtype != CT_I64 && dtype != CT_VALUE_BYTES) ||
            (opt->names ? opt->names[k] == NULL : opt->indices[k] < 0)) {
            return ct_err_set(err, CT_EINVAL,
                              "csv: column %d: needs a name or index >= 0 and a dtype (f32, i32, "
                              "i64 or bytes)",
                              k);
        }
    }
    p->n_columns = n;
    p->dtypes = malloc(sizeof(int) * (size_t)n);
    p->indices = opt->names ? NULL : malloc(sizeof(int) * (size_t)n);
    p->names = opt->names ? ct__paths_copy(opt->names, n, err) : NULL;
    if (p->dtypes == NULL || (opt->names ? p->names == NULL : p->indices == NULL)) {
        return ct_err_set(err, CT_ENOMEM, "csv: out of memory");
    }
    memcpy(p->dtypes, opt->dtypes, sizeof(int) * (size_t)n);
    if (p->indices != NULL) {
        memcpy(p->indices, opt->indices, sizeof(int) * (size_t)n);
    }
    return CT_OK;
}

static ct_status check_options(const ct_csv_options *opt, ct_err *err) {
    if (opt == NULL) {
        return CT_OK;
    }
    if (opt->n_columns < 0 || opt->n_columns > CT_ELEMENT_MAX ||
        (opt->n_columns > 0 && opt->names == NULL && opt->indices == NULL)) {
        return ct_err_set(err, CT_EINVAL, "csv: n_columns in 0..%d, with names or indices",
                          CT_ELEMENT_MAX);
    }
    if (opt->names != NULL && opt->n_columns > 0 && opt->no_header) {
        return ct_err_set(err, CT_EINVAL, "csv: columns picked by name need a header line");
    }
    if (opt->delimiter == '"' || opt->delimiter == '\n' || opt->delimiter == '\r') {
        return ct_err_set(err, CT_EINVAL, "csv: the delimiter cannot be a quote or a newline");
    }
    return CT_OK;
}

static uint64_t csv_fingerprint(const csv_params *p) {
    uint64_t h = ct__mix64((uint64_t)p->header, (uint64_t)(unsigned char)p->delim);
    for (int k = 0; k < p->n_columns; k++) {
        h = p->names ? ct__hash_str(h, p->names[k]) : ct__mix64(h, (uint64_t)p->indices[k]);
        h = ct__mix64(h, (uint64_t)p->dtypes[k]);
    }
    return ct__paths_fingerprint(h, p->paths, p->n);
}

ct_status ct_dataset_csv(const char *const *paths, int n_paths, const ct_csv_options *opt,
                         ct_dataset **ret, ct_err *err) {
    ct_status st = ret ? check_options(opt, err) : ct_err_set(err, CT_EINVAL, "csv: no ret");
    csv_params *p = st == CT_OK ? calloc(1, sizeof *p) : NULL;
    if (st != CT_OK || p == NULL) {
        return st != CT_OK ? st : ct_err_set(err, CT_ENOMEM, "csv: out of memory");
    }
    p->n = n_paths;
    p->header = opt ? !opt->no_header : 1;
    p->delim = opt && opt->delimiter ? opt->delimiter : ',';
    st = ct__source_paths("csv", paths, n_paths, &p->paths, err);
    if (st == CT_OK) {
        st = opt && opt->n_columns > 0 ? pick_columns(p, opt, err) : pick_all_columns(p, err);
    }
    if (st != CT_OK) {
        csv_free(p);
        return st;
    }
    ct_dataset *ds = NULL;
    if ((st = ct__dataset_create(&csv_ops, p, csv_fingerprint(p), NULL, 0, &ds, err)) != CT_OK) {
        return st;
    }
    ds->spec.n = p->n_columns;
    for (int k = 0; k < p->n_columns; k++) {
        ds->spec.v[k] = (ct_value_spec){.dtype = p->dtypes[k], .rank = 0};
    }
    snprintf(ds->name, sizeof ds->name, "csv(%d file%s)", n_paths, n_paths == 1 ? "" : "s");
    *ret = ds;
    return CT_OK;
}
