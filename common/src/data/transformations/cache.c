/* cache: the first epoch that runs its input from start to end stores every element, in memory
 * (path NULL: the dataset's parameters hold them, shared by every iterator under a mutex) or in
 * a record file at `path` (data/formats/record_file.h; its index holds the input's fingerprint).
 * Later epochs, and for the file later runs whose file is complete and has the input's fingerprint,
 * read the cache instead of the input, and skip in O(1).
 *
 * A pass that skips, fails or is destroyed before its end stores nothing: the memory copy is
 * published only at the end, the file is written under a temporary name and renamed into place
 * at the end. Two passes writing at once both complete; the first to finish is kept (memory) or
 * the last rename wins (file: the same elements). Elements keep their keys. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/formats/record_file.h"

typedef struct cache_params {
    char *path; /* NULL: in memory */
    pthread_mutex_t mutex;
    int complete;      /* memory: elems is a whole epoch (then never changes) */
    ct_element *elems; /* memory */
    int64_t n;
} cache_params;

enum { CACHE_WRITE, CACHE_READ_MEMORY, CACHE_READ_FILE };

typedef struct cache_iter {
    ct__iter base;
    int mode;
    int tainted, finished; /* write: a skip or an error; the end was reached */
    ct__iter *input;       /* write */
    ct_element *elems;     /* write, memory */
    int64_t n, cap;
    ct__recfile_writer w;  /* write, file */
    const ct_element *mem; /* read, memory */
    int64_t mem_n, next;
    ct__recfile_reader r; /* read, file */
} cache_iter;

/* ---- writing ---- */

/* Keeps a copy of e for the cache (memory) or appends it to the file being written. */
static ct_status store(cache_iter *c, const ct_element *e, ct_err *err) {
    const cache_params *p = c->base.ds->params;
    if (p->path != NULL) {
        return ct__recfile_put(&c->w, e, err);
    }
    if (c->n == c->cap) {
        int64_t cap = c->cap ? 2 * c->cap : 256;
        ct_element *grown = realloc(c->elems, (size_t)cap * sizeof *grown);
        if (grown == NULL) {
            return ct_err_set(err, CT_ENOMEM, "%s: out of memory for %lld elements",
                              c->base.ds->name, (long long)cap);
        }
        c->elems = grown;
        c->cap = cap;
    }
    memset(&c->elems[c->n], 0, sizeof *c->elems);
    if (ct_element_copy(e, &c->elems[c->n]) != CT_OK) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", c->base.ds->name);
    }
    c->n++;
    return CT_OK;
}

/* Forgets what this pass stored: frees the copies, removes the temporary file. */
static void drop_stored(cache_iter *c) {
    for (int64_t i = 0; i < c->n; i++) {
        ct_element_clear(&c->elems[i]);
    }
    free(c->elems);
    c->elems = NULL;
    c->n = c->cap = 0;
    ct__recfile_abort(&c->w);
}

/* The whole epoch went through: publish it. */
static ct_status publish(cache_iter *c, ct_err *err) {
    cache_params *p = c->base.ds->params;
    if (p->path != NULL) {
        return ct__recfile_commit(&c->w, ct_dataset_fingerprint(c->base.ds->inputs[0]), err);
    }
    pthread_mutex_lock(&p->mutex);
    if (!p->complete) {
        p->elems = c->elems;
        p->n = c->n;
        p->complete = 1;
        c->elems = NULL;
        c->n = c->cap = 0;
    }
    pthread_mutex_unlock(&p->mutex);
    drop_stored(c); /* another pass published first */
    return CT_OK;
}

/* A writing pass: the input's next, stored; at the end the cache is published. A failure taints the
 * pass. */
static ct_status write_next(cache_iter *c, ct_element *ret, int *ret_end, ct_err *err) {
    ct_status st = ct__iter_next(c->input, ret, ret_end, err);
    if (st == CT_OK && !*ret_end && !c->tainted) {
        st = store(c, ret, err);
    } else if (st == CT_OK && *ret_end && !c->tainted && !c->finished) {
        c->finished = 1;
        st = publish(c, err);
    }
    if (st != CT_OK) {
        c->tainted = 1;
        drop_stored(c);
    }
    return st;
}

/* ---- the iterator ---- */

/* The next element: from the input (writing), the file or the memory copy. */
static ct_status cache_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    cache_iter *c = (cache_iter *)it;
    if (c->mode == CACHE_WRITE) {
        return write_next(c, ret, ret_end, err);
    }
    if (c->mode == CACHE_READ_FILE) {
        return ct__recfile_read(&c->r, ret, ret_end, err);
    }
    if (c->next >= c->mem_n) {
        *ret_end = 1;
        return CT_OK;
    }
    if (ct_element_copy(&c->mem[c->next], ret) != CT_OK) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", it->ds->name);
    }
    c->next++;
    return CT_OK;
}

/* O(1) in a complete cache; a writing pass skips its input and stores nothing. */
static ct_status cache_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    cache_iter *c = (cache_iter *)it;
    if (c->mode == CACHE_WRITE) {
        c->tainted = 1; /* a pass that does not see every element caches none */
        drop_stored(c);
        return ct__iter_skip(c->input, n, ret_skipped, err);
    }
    int64_t at = c->mode == CACHE_READ_FILE ? c->r.next : c->next;
    int64_t total = c->mode == CACHE_READ_FILE ? c->r.count : c->mem_n;
    *ret_skipped = n < total - at ? n : total - at;
    if (c->mode == CACHE_READ_FILE) {
        ct__recfile_seek(&c->r, at + *ret_skipped);
    } else {
        c->next = at + *ret_skipped;
    }
    return CT_OK;
}

/* Frees the iterator; an unfinished pass leaves no cache. */
static void cache_destroy(ct__iter *it) {
    cache_iter *c = (cache_iter *)it;
    drop_stored(c);
    ct__recfile_close(&c->r);
    ct__iter_destroy(c->input);
    free(c);
}

static const ct__iter_ops cache_iter_ops = {
    .next = cache_next, .skip = cache_skip, .destroy = cache_destroy};

/* Whether a complete cache exists: set the reading mode. */
static ct_status try_read(cache_iter *c, ct_err *err) {
    cache_params *p = c->base.ds->params;
    if (p->path == NULL) {
        pthread_mutex_lock(&p->mutex);
        c->mode = p->complete ? CACHE_READ_MEMORY : CACHE_WRITE;
        c->mem = p->elems;
        c->mem_n = p->n;
        pthread_mutex_unlock(&p->mutex);
        return CT_OK;
    }
    ct_err probe = {0};
    ct_status st = ct__recfile_open(&c->r, p->path, &probe);
    if (st == CT_OK && c->r.fingerprint == ct_dataset_fingerprint(c->base.ds->inputs[0])) {
        c->mode = CACHE_READ_FILE;
        return CT_OK;
    }
    ct__recfile_close(&c->r); /* none yet, or another pipeline's: this pass replaces it */
    memset(&c->r, 0, sizeof c->r);
    c->mode = CACHE_WRITE;
    return st == CT_OK || st == CT_ENOENT ? CT_OK : ct_err_set(err, st, "%s", probe.msg);
}

/* Reads a complete cache if there is one, else runs the input and writes. */
static ct_status cache_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                 ct_err *err) {
    const cache_params *p = ds->params;
    cache_iter *c = ct__iter_alloc(sizeof *c, &cache_iter_ops, ds, ctx);
    if (c == NULL) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    ct_status st = try_read(c, err);
    if (st == CT_OK && c->mode == CACHE_WRITE) {
        ct__iter_ctx child = ct__ctx_child(&c->base, ctx->epoch);
        st = ct__iter_make(ds->inputs[0], &child, &c->input, err);
    }
    if (st == CT_OK && c->mode == CACHE_WRITE && p->path != NULL) {
        st = ct__recfile_create(&c->w, p->path, err);
    }
    if (st != CT_OK) {
        cache_destroy(&c->base);
        return ct_err_prefix(err, st, "%s", ds->name);
    }
    *ret = &c->base;
    return CT_OK;
}

/* ---- the dataset ---- */

/* "memory" or "file=<path>". */
static void cache_describe(const ct_dataset *ds, char *buf, size_t size) {
    const cache_params *p = ds->params;
    snprintf(buf, size, "%s%s", p->path ? "file=" : "memory", p->path ? p->path : "");
}

/* Frees the memory cache, the path and the mutex. */
static void cache_free(void *params) {
    cache_params *p = params;
    if (p == NULL) {
        return;
    }
    for (int64_t i = 0; i < p->n; i++) {
        ct_element_clear(&p->elems[i]);
    }
    free(p->elems);
    free(p->path);
    pthread_mutex_destroy(&p->mutex);
    free(p);
}

static const ct__dataset_ops cache_ops = {
    .kind = "cache",
    .make_iter = cache_make_iter,
    .describe = cache_describe,
    .free_params = cache_free,
};

ct_status ct_dataset_cache(ct_dataset *in, const char *path, ct_dataset **ret, ct_err *err) {
    cache_params *p = calloc(1, sizeof *p);
    if (p == NULL || (path != NULL && (p->path = strdup(path)) == NULL)) {
        free(p);
        return ct_err_set(err, CT_ENOMEM, "cache: out of memory");
    }
    pthread_mutex_init(&p->mutex, NULL);
    ct_dataset *ds = NULL;
    ct_status st =
        ct__dataset_create(&cache_ops, p, ct__hash_str(0x6361636865ULL, path), &in, 1, &ds, err);
    if (st != CT_OK) {
        return st;
    }
    ds->cardinality = in->cardinality;
    ds->spec = in->spec;
    *ret = ds;
    return CT_OK;
}
