/* One role's profile on disk (prof_file.h): each role writes its dump to
 * <run_dir>/profile/<role>.<task>.ctprof at the end of training; the chief reads them all back to
 * merge the trace, and `ctrain profile` reads them for its report. A compact binary form rather
 * than JSON: it round-trips a ct__prof_dump exactly (the XSpace writer needs the dumps, not a
 * trace), and reads back without a JSON parser.
 *
 * Layout, little-endian:
 *   "CTPROF01"; u32 version (1); char role[32]; i32 task; char host[64]; i64 pid,
 *   clock_offset_ns, clock_error_ns, dropped; i32 n_threads; i64 n_events, string_bytes;
 *   n_threads x {i64 tid; char name[32]}; string_bytes of NUL-terminated strings;
 *   n_events x {i64 start_ns, dur_ns, step, bytes, value[2]; i32 name, detail (offsets into the
 *   strings, -1: none), thread; u16 kind, u16 0}; u32 CRC-32C of everything before it. */
#include "prof/prof_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "ctrain/crc32c.h"
#include "prof/prof.h"

#define MAGIC "CTPROF01"
#define VERSION 1
#define HEADER_BYTES (8 + 4 + 32 + 4 + 64 + 4 * 8 + 4 + 8 + 8)
#define THREAD_BYTES (8 + 32)
#define EVENT_BYTES (6 * 8 + 3 * 4 + 2 + 2)
#define MAX_FILE_BYTES ((int64_t)1 << 34)

/* ---- writing ---- */

typedef struct out_buf {
    unsigned char *p;
    size_t n;
} out_buf;

static void put(out_buf *o, const void *src, size_t len) {
    memcpy(o->p + o->n, src, len);
    o->n += len;
}

static void put_u32(out_buf *o, uint32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    put(o, b, 4);
}

static void put_u64(out_buf *o, uint64_t v) {
    put_u32(o, (uint32_t)v);
    put_u32(o, (uint32_t)(v >> 32));
}

static void put_text(out_buf *o, const char *s, size_t width) {
    memset(o->p + o->n, 0, width);
    size_t len = strnlen(s, width - 1);
    memcpy(o->p + o->n, s, len);
    o->n += width;
}

static int by_pointer(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (const char *const *)a, y = (uintptr_t) * (const char *const *)b;
    return (x > y) - (x < y);
}

/* The distinct strings the events point at (sorted by address), and their bytes. */
static const char **collect_strings(const ct__prof_dump *d, int64_t *ret_n, size_t *ret_bytes) {
    const char **all = malloc((size_t)(2 * d->n_events + 1) * sizeof *all);
    if (!all) {
        return NULL;
    }
    int64_t n = 0;
    for (int64_t i = 0; i < d->n_events; i++) {
        if (d->events[i].name) {
            all[n++] = d->events[i].name;
        }
        if (d->events[i].detail) {
            all[n++] = d->events[i].detail;
        }
    }
    qsort(all, (size_t)n, sizeof *all, by_pointer);
    int64_t u = 0;
    size_t bytes = 0;
    for (int64_t i = 0; i < n; i++) {
        if (u == 0 || all[u - 1] != all[i]) {
            all[u++] = all[i];
            bytes += strlen(all[i]) + 1;
        }
    }
    *ret_n = u;
    *ret_bytes = bytes;
    return all;
}

/* The offset of string s among the sorted strings (offsets: their positions), -1 for NULL. */
static int32_t string_at(const char **strings, const int32_t *offsets, int64_t n, const char *s) {
    if (!s) {
        return -1;
    }
    const char **hit = bsearch(&s, strings, (size_t)n, sizeof *strings, by_pointer);
    return offsets[hit - strings];
}

static void put_events(out_buf *o, const ct__prof_dump *d, const char **strings,
                       const int32_t *offsets, int64_t n_strings) {
    for (int64_t i = 0; i < d->n_events; i++) {
        const ct__prof_event *e = &d->events[i];
        put_u64(o, (uint64_t)e->start_ns);
        put_u64(o, (uint64_t)e->dur_ns);
        put_u64(o, (uint64_t)e->step);
        put_u64(o, (uint64_t)e->bytes);
        put_u64(o, (uint64_t)e->value[0]);
        put_u64(o, (uint64_t)e->value[1]);
        put_u32(o, (uint32_t)string_at(strings, offsets, n_strings, e->name));
        put_u32(o, (uint32_t)string_at(strings, offsets, n_strings, e->detail));
        put_u32(o, (uint32_t)e->thread);
        put_u32(o, e->kind);
    }
}

static void put_header(out_buf *o, const ct__prof_dump *d, size_t string_bytes) {
    put(o, MAGIC, 8);
    put_u32(o, VERSION);
    put_text(o, d->role, 32);
    put_u32(o, (uint32_t)d->task);
    put_text(o, d->host, 64);
    put_u64(o, (uint64_t)d->pid);
    put_u64(o, (uint64_t)d->clock_offset_ns);
    put_u64(o, (uint64_t)d->clock_error_ns);
    put_u64(o, (uint64_t)d->dropped);
    put_u32(o, (uint32_t)d->n_threads);
    put_u64(o, (uint64_t)d->n_events);
    put_u64(o, (uint64_t)string_bytes);
}

ct_status ct__prof_file_write(const ct__prof_dump *d, const char *path, ct_err *err) {
    int64_t n_strings = 0;
    size_t string_bytes = 0;
    const char **strings = collect_strings(d, &n_strings, &string_bytes);
    int32_t *offsets = malloc((size_t)(n_strings + 1) * sizeof *offsets);
    size_t total = HEADER_BYTES + (size_t)d->n_threads * THREAD_BYTES + string_bytes +
                   (size_t)d->n_events * EVENT_BYTES + 4;
    out_buf o = {.p = malloc(total)};
    ct_status st = CT_OK;
    if (!strings || !offsets || !o.p || string_bytes > INT32_MAX) {
        st = ct_err_set(err, CT_ENOMEM, "%s: out of memory for the profile", path);
        goto done;
    }
    put_header(&o, d, string_bytes);
    for (int i = 0; i < d->n_threads; i++) {
        put_u64(&o, (uint64_t)d->threads[i].tid);
        put_text(&o, d->threads[i].name, 32);
    }
    size_t at = 0;
    for (int64_t i = 0; i < n_strings; i++) {
        offsets[i] = (int32_t)at;
        size_t len = strlen(strings[i]) + 1;
        put(&o, strings[i], len);
        at += len;
    }
    put_events(&o, d, strings, offsets, n_strings);
    put_u32(&o, ct_crc32c(0, o.p, o.n));
    const void *parts[1] = {o.p};
    size_t lens[1] = {o.n};
    st = ct__atomic_write(path, parts, lens, 1, err);
done:
    free(strings);
    free(offsets);
    free(o.p);
    return st;
}

/* ---- reading ---- */

typedef struct in_buf {
    const unsigned char *p;
    size_t n, at;
} in_buf;

static uint32_t get_u32(in_buf *in) {
    const unsigned char *b = in->p + in->at;
    in->at += 4;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static int64_t get_i64(in_buf *in) {
    uint64_t lo = get_u32(in), hi = get_u32(in);
    return (int64_t)(lo | hi << 32);
}

static void get_text(in_buf *in, char *dst, size_t width) {
    memcpy(dst, in->p + in->at, width);
    dst[width - 1] = '\0';
    in->at += width;
}

static ct_status read_all(const char *path, unsigned char **ret, size_t *ret_n, ct_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return ct_err_set(err, errno == ENOENT ? CT_ENOENT : CT_EIO, "%s: cannot open (%s)", path,
                          strerror(errno));
    }
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 65536;
            unsigned char *grown = (int64_t)cap <= MAX_FILE_BYTES ? realloc(buf, cap) : NULL;
            if (!grown) {
                free(buf);
                fclose(f);
                return ct_err_set(err, CT_ENOMEM, "%s: out of memory reading it", path);
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            break;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return ct_err_set(err, CT_EIO, "%s: read failed", path);
    }
    *ret = buf;
    *ret_n = n;
    return CT_OK;
}

/* Checks one event's references; 0 or -1. */
static int check_event(const ct__prof_event *e, int32_t name, int32_t detail, int n_threads,
                       size_t string_bytes) {
    if (e->thread < 0 || e->thread >= n_threads || e->kind >= CT__PROF_KIND_COUNT ||
        e->dur_ns < 0 || name < -1 || detail < -1 || (int64_t)name >= (int64_t)string_bytes ||
        (int64_t)detail >= (int64_t)string_bytes) {
        return -1;
    }
    return 0;
}

static ct_status parse_events(in_buf *in, ct__prof_dump *d, ct__prof_event *events,
                              const char *strings, size_t string_bytes, const char *path,
                              ct_err *err) {
    for (int64_t i = 0; i < d->n_events; i++) {
        ct__prof_event *e = &events[i];
        e->start_ns = get_i64(in);
        e->dur_ns = get_i64(in);
        e->step = get_i64(in);
        e->bytes = get_i64(in);
        e->value[0] = get_i64(in);
        e->value[1] = get_i64(in);
        int32_t name = (int32_t)get_u32(in), detail = (int32_t)get_u32(in);
        e->thread = (int32_t)get_u32(in);
        e->kind = (uint16_t)get_u32(in);
        if (check_event(e, name, detail, d->n_threads, string_bytes) != 0) {
            return ct_err_set(err, CT_EPROTO, "%s: event %lld is corrupt", path, (long long)i);
        }
        e->name = name >= 0 ? strings + name : NULL;
        e->detail = detail >= 0 ? strings + detail : NULL;
    }
    return CT_OK;
}

/* The dump in buf (n bytes, CRC checked), or a CT_EPROTO naming what is wrong. */
static ct_status parse(in_buf *in, const char *path, ct__prof_dump **ret, ct_err *err) {
    char role[32], host[64];
    in->at = 12;
    get_text(in, role, sizeof role);
    int task = (int)get_u32(in);
    get_text(in, host, sizeof host);
    int64_t pid = get_i64(in), offset = get_i64(in), clock_error = get_i64(in),
            dropped = get_i64(in);
    int n_threads = (int)get_u32(in);
    int64_t n_events = get_i64(in), string_bytes = get_i64(in);
    if (n_threads < 0 || n_events < 0 || string_bytes < 0 ||
        (int64_t)in->n - HEADER_BYTES - 4 !=
            (int64_t)n_threads * THREAD_BYTES + string_bytes + n_events * EVENT_BYTES ||
        (string_bytes > 0 &&
         in->p[HEADER_BYTES + (size_t)n_threads * THREAD_BYTES + (size_t)string_bytes - 1] !=
             '\0')) {
        return ct_err_set(err, CT_EPROTO, "%s: the header's counts do not match the file's size",
                          path);
    }
    ct__prof_thread *threads;
    ct__prof_event *events;
    char *strings;
    ct__prof_dump *d =
        ct__prof_dump_new(n_threads, n_events, (size_t)string_bytes, &threads, &events, &strings);
    if (!d) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    snprintf(d->role, sizeof d->role, "%s", role);
    snprintf(d->host, sizeof d->host, "%s", host);
    d->task = task;
    d->pid = pid;
    d->clock_offset_ns = offset;
    d->clock_error_ns = clock_error;
    d->dropped = dropped;
    for (int i = 0; i < n_threads; i++) {
        threads[i].tid = get_i64(in);
        get_text(in, threads[i].name, sizeof threads[i].name);
    }
    if (string_bytes > 0) { /* (no table at all: strings is NULL) */
        memcpy(strings, in->p + in->at, (size_t)string_bytes);
    }
    in->at += (size_t)string_bytes;
    ct_status st = parse_events(in, d, events, strings, (size_t)string_bytes, path, err);
    if (st != CT_OK) {
        ct__prof_dump_free(d);
        return st;
    }
    *ret = d;
    return CT_OK;
}

ct_status ct__prof_file_read(const char *path, ct__prof_dump **ret, ct_err *err) {
    unsigned char *buf = NULL;
    size_t n = 0;
    ct_status st = read_all(path, &buf, &n, err);
    if (st != CT_OK) {
        return st;
    }
    in_buf in = {.p = buf, .n = n};
    if (n < HEADER_BYTES + 4 || memcmp(buf, MAGIC, 8) != 0) {
        st = ct_err_set(err, CT_EPROTO, "%s: not a ctrain profile (no %s header)", path, MAGIC);
    } else if ((in.at = 8, get_u32(&in)) != VERSION) {
        st = ct_err_set(err, CT_EPROTO, "%s: profile version %u, this build reads %d", path,
                        (in.at = 8, get_u32(&in)), VERSION);
    } else if ((in.at = n - 4, get_u32(&in)) != ct_crc32c(0, buf, n - 4)) {
        st = ct_err_set(err, CT_EPROTO, "%s: checksum mismatch (the file is corrupt or truncated)",
                        path);
    } else {
        st = parse(&in, path, ret, err);
    }
    free(buf);
    return st;
}
