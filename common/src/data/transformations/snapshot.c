/* snapshot: the first complete pass over the input writes its elements to
 * `dir`/<16 hex digits of the input's fingerprint>/ as shard files "<writer>-<k>.shard" of about
 * CT__SNAPSHOT_SHARD_BYTES each (record files, data/formats/record_file.h: CRC-framed, indexed),
 * then the metadata file `done`, last, by rename: a record file with the input's fingerprint whose
 * one element holds (i64 [version, elements, shards, elements of shard 0, ...], bytes writer).
 * Every later pass, in this run or another, whose input has the same fingerprint reads the shards
 * instead of running the input; another pipeline has another directory. Skip seeks: the shard
 * from the counts in `done`, the element from the shard's index.
 *
 * A pass that skips, fails or is destroyed early removes its shards and writes no `done`; so
 * does one that finds a `done` written meanwhile by another writer. A corrupt shard or `done` is
 * CT_EFORMAT naming the file and the byte offset. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/clock.h"
#include "data/formats/record_file.h"

#define CT__SNAPSHOT_SHARD_BYTES ((int64_t)8 << 20)
#define SNAPSHOT_VERSION 1
#define MAX_SHARDS 100000

typedef struct snapshot_params {
    char *dir;
} snapshot_params;

typedef struct snapshot_iter {
    ct__iter base;
    int reading, tainted, finished;
    char root[PATH_MAX - 64]; /* dir/<fingerprint>, with room for the file names */
    char writer[17];          /* the shards' name prefix */
    int64_t *counts;          /* elements per shard */
    int n_shards, shard;      /* shards (complete ones when writing), the open one */
    int64_t first;            /* reading: index of the open shard's first element */
    int64_t total, next;      /* reading: elements, the next one's index */
    ct__iter *input;          /* writing */
    ct__recfile_writer w;     /* writing: the open shard */
    ct__recfile_reader r;     /* reading: the open shard */
} snapshot_iter;

/* Shard k's path: <dir>/<fingerprint>/<writer>-<k>.shard. */
static void shard_path(const snapshot_iter *s, int k, char *buf, size_t size) {
    snprintf(buf, size, "%s/%s-%d.shard", s->root, s->writer, k);
}

/* mkdir -p; CT_EIO names the directory. */
static ct_status make_dirs(const char *path, ct_err *err) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                return ct_err_set(err, CT_EIO, "%s: cannot create (%s)", buf, strerror(errno));
            }
            if ((*p = c) == '\0') {
                return CT_OK;
            }
        }
    }
}

/* Appends a shard's element count; 0 when out of memory. */
static int add_count(snapshot_iter *s, int64_t count) {
    int64_t *c = realloc(s->counts, (size_t)(s->n_shards + 1) * sizeof *c);
    if (c == NULL) {
        return 0;
    }
    s->counts = c;
    s->counts[s->n_shards++] = count;
    return 1;
}

/* ---- writing ---- */

/* Starts writing the next shard. */
static ct_status open_shard(snapshot_iter *s, ct_err *err) {
    char path[PATH_MAX];
    shard_path(s, s->n_shards, path, sizeof path);
    memset(&s->w, 0, sizeof s->w);
    return ct__recfile_create(&s->w, path, err);
}

/* Commits the open shard (renamed into place) and records its count. */
static ct_status close_shard(snapshot_iter *s, ct_err *err) {
    int64_t count = s->w.count;
    ct_status st = ct__recfile_commit(&s->w, ct_dataset_fingerprint(s->base.ds->inputs[0]), err);
    if (st == CT_OK && !add_count(s, count)) {
        st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", s->base.ds->name);
    }
    return st;
}

/* Removes this writer's shards: the pass will not complete, or another one did. */
static void discard(snapshot_iter *s) {
    ct__recfile_abort(&s->w);
    for (int k = 0; !s->reading && k < s->n_shards; k++) {
        char path[PATH_MAX];
        shard_path(s, k, path, sizeof path);
        unlink(path);
    }
    s->n_shards = 0;
    s->tainted = 1;
}

/* The metadata element: version, elements, shards, per-shard counts; the writer's name. */
static ct_status write_done(snapshot_iter *s, ct_err *err) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/done", s->root);
    ct_element meta = {0};
    ct_shape shape = {.rank = 1, .dims = {3 + s->n_shards}};
    ct__recfile_writer w = {0};
    ct_status st = ct_element_alloc(&meta, 0, CT_I64, &shape, 0) == CT_OK &&
                           ct_element_alloc(&meta, 1, CT_VALUE_BYTES, NULL, 16) == CT_OK
                       ? CT_OK
                       : ct_err_set(err, CT_ENOMEM, "%s: out of memory", s->base.ds->name);
    if (st == CT_OK) {
        int64_t *v = meta.v[0].data;
        v[0] = SNAPSHOT_VERSION;
        v[1] = 0;
        v[2] = s->n_shards;
        for (int k = 0; k < s->n_shards; k++) {
            v[3 + k] = s->counts[k];
            v[1] += s->counts[k];
        }
        memcpy(meta.v[1].data, s->writer, 16);
        st = ct__recfile_create(&w, path, err);
    }
    st = st == CT_OK ? ct__recfile_put(&w, &meta, err) : st;
    if (st == CT_OK) {
        st = ct__recfile_commit(&w, ct_dataset_fingerprint(s->base.ds->inputs[0]), err);
    }
    ct__recfile_abort(&w);
    ct_element_clear(&meta);
    return st;
}

/* The input ended: close the last shard and publish, unless another writer already did. */
static ct_status finish_write(snapshot_iter *s, ct_err *err) {
    char done[PATH_MAX];
    snprintf(done, sizeof done, "%s/done", s->root);
    ct_status st = close_shard(s, err);
    if (st == CT_OK && access(done, F_OK) == 0) {
        discard(s);
        return CT_OK;
    }
    return st == CT_OK ? write_done(s, err) : st;
}

/* A writing pass: the input's next, appended to the open shard (a new one past the shard size); at
 * the end the snapshot is published. A failure discards the pass. */
static ct_status write_next(snapshot_iter *s, ct_element *ret, int *ret_end, ct_err *err) {
    ct_status st = ct__iter_next(s->input, ret, ret_end, err);
    if (st == CT_OK && !*ret_end && !s->tainted) {
        st = ct__recfile_put(&s->w, ret, err);
        if (st == CT_OK && ct__recfile_size(&s->w) >= CT__SNAPSHOT_SHARD_BYTES) {
            st = close_shard(s, err);
            st = st == CT_OK ? open_shard(s, err) : st;
        }
    } else if (st == CT_OK && *ret_end && !s->tainted && !s->finished) {
        s->finished = 1;
        st = finish_write(s, err);
    }
    if (st != CT_OK && !s->tainted) {
        discard(s);
    }
    return st;
}

/* ---- reading ---- */

/* Reads `done` into the shard counts; CT_ENOENT when the snapshot is not complete. */
static ct_status read_done(snapshot_iter *s, ct_err *err) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/done", s->root);
    ct__recfile_reader r = {0};
    ct_element meta = {0};
    int end = 0;
    ct_err probe = {0};
    ct_status st = ct__recfile_open(&r, path, &probe);
    if (st == CT_ENOENT) {
        return st; /* not written yet */
    }
    st =
        st == CT_OK ? ct__recfile_read(&r, &meta, &end, err) : ct_err_set(err, st, "%s", probe.msg);
    const int64_t *v = st == CT_OK && !end && meta.n == 2 && meta.v[0].dtype == CT_I64 &&
                               meta.v[0].shape.dims[0] >= 3 && meta.v[1].nbytes == 16
                           ? meta.v[0].data
                           : NULL;
    if (st == CT_OK && (v == NULL || v[0] != SNAPSHOT_VERSION || v[2] < 0 || v[2] > MAX_SHARDS ||
                        meta.v[0].shape.dims[0] != 3 + v[2] ||
                        r.fingerprint != ct_dataset_fingerprint(s->base.ds->inputs[0]))) {
        st = ct_err_set(err, CT_EFORMAT, "%s: byte 0: not this snapshot's metadata", path);
    }
    for (int k = 0; st == CT_OK && k < v[2]; k++) {
        st = add_count(s, v[3 + k]) ? CT_OK : ct_err_set(err, CT_ENOMEM, "out of memory");
        s->total += v[3 + k];
    }
    if (st == CT_OK) {
        memcpy(s->writer, meta.v[1].data, 16);
        s->writer[16] = '\0';
        s->reading = 1;
        s->shard = -1;
    }
    ct_element_clear(&meta);
    ct__recfile_close(&r);
    return st;
}

/* Opens shard k for reading at element `index` of the snapshot. */
static ct_status open_read_shard(snapshot_iter *s, int k, ct_err *err) {
    char path[PATH_MAX];
    shard_path(s, k, path, sizeof path);
    ct__recfile_close(&s->r);
    memset(&s->r, 0, sizeof s->r);
    s->first = 0;
    for (int j = 0; j < k; j++) {
        s->first += s->counts[j];
    }
    s->shard = k;
    ct_status st = ct__recfile_open(&s->r, path, err);
    if (st == CT_OK && s->r.count != s->counts[k]) {
        st = ct_err_set(err, CT_EFORMAT, "%s: %lld elements, the metadata says %lld", path,
                        (long long)s->r.count, (long long)s->counts[k]);
    }
    return st;
}

/* The shard holding element `index` (< total). */
static int shard_of(const snapshot_iter *s, int64_t index) {
    if (s->shard >= 0 && index >= s->first && index < s->first + s->counts[s->shard]) {
        return s->shard;
    }
    int k = 0;
    for (int64_t first = 0; k < s->n_shards - 1 && index >= first + s->counts[k]; k++) {
        first += s->counts[k];
    }
    return k;
}

static ct_status read_next(snapshot_iter *s, ct_element *ret, int *ret_end, ct_err *err) {
    if (s->next >= s->total) {
        *ret_end = 1;
        return CT_OK;
    }
    int k = shard_of(s, s->next);
    ct_status st = k == s->shard ? CT_OK : open_read_shard(s, k, err);
    if (st == CT_OK) {
        ct__recfile_seek(&s->r, s->next - s->first);
        st = ct__recfile_read(&s->r, ret, ret_end, err);
    }
    s->next += st == CT_OK;
    return st;
}

/* ---- the iterator ---- */

/* The next element from the shards or, while writing, the input. */
static ct_status snapshot_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    snapshot_iter *s = (snapshot_iter *)it;
    return s->reading ? read_next(s, ret, ret_end, err) : write_next(s, ret, ret_end, err);
}

/* Reading: moves the index (O(1)); writing: the input's skip, the pass discarded. */
static ct_status snapshot_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    snapshot_iter *s = (snapshot_iter *)it;
    if (!s->reading) {
        if (!s->tainted) {
            discard(s); /* a pass that does not see every element writes none */
        }
        return ct__iter_skip(s->input, n, ret_skipped, err);
    }
    *ret_skipped = n < s->total - s->next ? n : s->total - s->next;
    s->next += *ret_skipped;
    return CT_OK;
}

/* Frees the iterator; an unfinished pass removes its shards. */
static void snapshot_destroy(ct__iter *it) {
    snapshot_iter *s = (snapshot_iter *)it;
    if (!s->reading && !s->finished) {
        discard(s);
    }
    ct__recfile_abort(&s->w);
    ct__recfile_close(&s->r);
    ct__iter_destroy(s->input);
    free(s->counts);
    free(s);
}

static const ct__iter_ops snapshot_iter_ops = {
    .next = snapshot_next, .skip = snapshot_skip, .destroy = snapshot_destroy};

/* A writing pass: a new writer name, the directory, the input's iterator, shard 0. */
static ct_status start_write(snapshot_iter *s, const ct__iter_ctx *ctx, ct_err *err) {
    uint64_t id =
        ct__mix64((uint64_t)getpid(), ct__mix64((uint64_t)(uintptr_t)s, (uint64_t)ct__now_ns()));
    snprintf(s->writer, sizeof s->writer, "%016llx", (unsigned long long)id);
    ct__iter_ctx child = ct__ctx_child(&s->base, ctx->epoch);
    ct_status st = make_dirs(s->root, err);
    st = st == CT_OK ? ct__iter_make(s->base.ds->inputs[0], &child, &s->input, err) : st;
    return st == CT_OK ? open_shard(s, err) : st;
}

/* Reads the snapshot when its `done` is there, else runs the input and writes. */
static ct_status snapshot_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                    ct_err *err) {
    const snapshot_params *p = ds->params;
    snapshot_iter *s = ct__iter_alloc(sizeof *s, &snapshot_iter_ops, ds, ctx);
    if (s == NULL) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    int len = snprintf(s->root, sizeof s->root, "%s/%016llx", p->dir,
                       (unsigned long long)ct_dataset_fingerprint(ds->inputs[0]));
    ct_status st = len >= 0 && (size_t)len < sizeof s->root
                       ? read_done(s, err)
                       : ct_err_set(err, CT_EINVAL, "%s: directory name too long", p->dir);
    if (st == CT_ENOENT) {
        st = start_write(s, ctx, err);
    }
    if (st != CT_OK) {
        snapshot_destroy(&s->base);
        return ct_err_prefix(err, st, "%s", ds->name);
    }
    *ret = &s->base;
    return CT_OK;
}

/* ---- the dataset ---- */

/* "dir=<dir>". */
static void snapshot_describe(const ct_dataset *ds, char *buf, size_t size) {
    const snapshot_params *p = ds->params;
    snprintf(buf, size, "dir=%s", p->dir);
}

/* Frees the directory name. */
static void snapshot_free(void *params) {
    snapshot_params *p = params;
    if (p != NULL) {
        free(p->dir);
    }
    free(p);
}

static const ct__dataset_ops snapshot_ops = {
    .kind = "snapshot",
    .make_iter = snapshot_make_iter,
    .describe = snapshot_describe,
    .free_params = snapshot_free,
};

ct_status ct_dataset_snapshot(ct_dataset *in, const char *dir, ct_dataset **ret, ct_err *err) {
    if (dir == NULL || dir[0] == '\0') {
        return ct_err_set(err, CT_EINVAL, "snapshot: no directory");
    }
    snapshot_params *p = calloc(1, sizeof *p);
    if (p == NULL || (p->dir = strdup(dir)) == NULL) {
        free(p);
        return ct_err_set(err, CT_ENOMEM, "snapshot: out of memory");
    }
    ct_dataset *ds = NULL;
    ct_status st =
        ct__dataset_create(&snapshot_ops, p, ct__hash_str(0x736e6170ULL, dir), &in, 1, &ds, err);
    if (st != CT_OK) {
        return st;
    }
    ds->cardinality = in->cardinality;
    ds->spec = in->spec;
    *ret = ds;
    return CT_OK;
}
