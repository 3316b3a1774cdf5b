/* text_lines: the lines of text files, in order, as bytes elements without the line end ("\n"
 * or "\r\n"), as tf.data's TextLineDataset. A last line with no newline is a line; a file that
 * ends with a newline has no empty line after it. The data is NUL-terminated (ct_element_alloc
 * keeps a spare byte) for callers that treat a line as a string; nbytes excludes it.
 *
 * next copies a line out of the read buffer (a line longer than the buffer is gathered in the
 * iterator's line buffer); skip only counts newlines with memchr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/core/dataset_impl.h"
#include "data/formats/file_reader.h"
#include "data/sources/stream.h"

#define TEXT_BUFFER_BYTES ((size_t)256 << 10)

typedef struct text_params {
    char **paths;
    int n;
} text_params;

typedef struct text_iter {
    ct__stream_iter base;
    int file;
    ct__reader r;
    char *line; /* a line that spans refills */
    size_t line_len, line_cap;
} text_iter;

static ct_status append(text_iter *t, const unsigned char *p, size_t n, ct_err *err) {
    if (t->line_len + n > t->line_cap) {
        size_t cap = 2 * t->line_cap > t->line_len + n ? 2 * t->line_cap : t->line_len + n;
        char *bigger = realloc(t->line, cap);
        if (bigger == NULL) {
            return ct_err_set(err, CT_ENOMEM, "%s: out of memory for a %zu-byte line", t->r.path,
                              cap);
        }
        t->line = bigger, t->line_cap = cap;
    }
    memcpy(t->line + t->line_len, p, n);
    t->line_len += n;
    return CT_OK;
}

/* Reads one line of the open file into t->line (keep) or past it; *ret_end when the file has
 * no more lines. */
static ct_status read_line(text_iter *t, int keep, int *ret_end, ct_err *err) {
    ct__reader *r = &t->r;
    int any = 0;
    t->line_len = 0;
    for (;;) {
        ct_status st = ct__reader_fill(r, 1, err);
        if (st != CT_OK) {
            return st;
        }
        if (r->pos == r->len) {
            *ret_end = !any;
            return CT_OK;
        }
        any = 1;
        const unsigned char *start = r->buf + r->pos;
        const unsigned char *nl = memchr(start, '\n', r->len - r->pos);
        size_t n = nl ? (size_t)(nl - start) : r->len - r->pos;
        if (keep && (st = append(t, start, n, err)) != CT_OK) {
            return st;
        }
        r->pos += n + (nl != NULL);
        if (nl != NULL) {
            return CT_OK;
        }
    }
}

/* The next line of any file into ret (NULL: skipped). */
static ct_status advance(ct__stream_iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    text_iter *t = (text_iter *)it;
    const text_params *p = it->base.ds->params;
    for (;;) {
        int end = 0;
        ct_status st = CT_OK;
        if (!t->r.is_open) {
            if (t->file >= p->n) {
                *ret_end = 1;
                return CT_OK;
            }
            st = ct__reader_open(&t->r, p->paths[t->file], TEXT_BUFFER_BYTES, err);
        }
        if (st != CT_OK || (st = read_line(t, ret != NULL, &end, err)) != CT_OK) {
            return st;
        }
        if (!end) {
            break;
        }
        ct__reader_close(&t->r);
        t->file++;
    }
    if (ret == NULL) {
        return CT_OK;
    }
    size_t len = t->line_len - (t->line_len > 0 && t->line[t->line_len - 1] == '\r');
    if (ct_element_alloc(ret, 0, CT_VALUE_BYTES, NULL, len) != CT_OK) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", t->r.path);
    }
    memcpy(ret->v[0].data, t->line, len);
    return CT_OK;
}

static void text_close(ct__stream_iter *it) {
    text_iter *t = (text_iter *)it;
    ct__reader_close(&t->r);
    free(t->line);
}

static ct_status text_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                ct_err *err) {
    return ct__stream_make_iter(ds, ctx, sizeof(text_iter), advance, text_close, ret, err);
}

static void text_free(void *params) {
    text_params *p = params;
    if (p != NULL) {
        free(p->paths);
    }
    free(p);
}

static void text_describe(const ct_dataset *ds, char *buf, size_t size) {
    const text_params *p = ds->params;
    snprintf(buf, size, "%s%s", p->paths[0], p->n > 1 ? ", ..." : "");
}

static const ct__dataset_ops text_ops = {
    .kind = "text_lines",
    .make_iter = text_make_iter,
    .describe = text_describe,
    .free_params = text_free,
};

ct_status ct_dataset_text_lines(const char *const *paths, int n_paths, ct_dataset **ret,
                                ct_err *err) {
    text_params *p = ret ? calloc(1, sizeof *p) : NULL;
    if (p == NULL) {
        return ct_err_set(err, ret ? CT_ENOMEM : CT_EINVAL, "text_lines: %s",
                          ret ? "out of memory" : "ret must not be NULL");
    }
    p->n = n_paths;
    ct_status st = ct__source_paths("text_lines", paths, n_paths, &p->paths, err);
    if (st != CT_OK) {
        text_free(p);
        return st;
    }
    uint64_t h = ct__paths_fingerprint(0, p->paths, n_paths);
    ct_dataset *ds = NULL;
    if ((st = ct__dataset_create(&text_ops, p, h, NULL, 0, &ds, err)) != CT_OK) {
        return st;
    }
    ds->spec = (ct_element_spec){.n = 1, .v = {{.dtype = CT_VALUE_BYTES, .rank = 0}}};
    snprintf(ds->name, sizeof ds->name, "text_lines(%d file%s)", n_paths, n_paths == 1 ? "" : "s");
    *ret = ds;
    return CT_OK;
}
