/* The dispatcher's journal (docs/data-service.md, "The dispatcher's journal").
 *
 * work_dir/journal holds records framed as TFRecord frames its payloads: u32 length, u32 masked
 * CRC-32C of the payload, payload (all little-endian). Each is fsynced before the change takes
 * effect on the wire, but an ACK: a consumer's progress is written and synced with the next
 * record that is (group commit; an fdatasync per ACK was most of the dispatcher's time). A
 * machine's crash can lose only that tail of ACKs; the restarted dispatcher then takes its
 * consumers to be a few steps behind and re-queues leases whose batches they already have,
 * which they drop as duplicates (a process's crash loses nothing: the bytes are in the page
 * cache). Before the journal would hold CT_DSVC_COMPACT_RECORDS - 1 records, the
 * whole state is written to work_dir/state as the same kind of records (write state.tmp, fsync,
 * rename, fsync the directory) and the journal starts over. Every journal begins with a HEAD
 * record carrying its sequence number, which the state names too: a journal whose first record
 * names another sequence predates the state (a crash between the rename and the truncation)
 * and is ignored. So a restart reads O(consumers x window) state records and at most 255
 * journal records, whatever the epoch's progress. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctrain/crc32c.h"
#include "dispatcher_state.h"

#define REC_BYTES 512 /* an encoded record's upper bound */

struct ct__dsvc_journal {
    int fd;
    char dir[PATH_MAX - 32];
    int records; /* in the journal file */
};

/* ---- encoding: a fixed list of little-endian fields ---- */

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
    int bad;
} buf;

static void put(buf *b, uint64_t v, int bytes) {
    if (b->n + (size_t)bytes > b->cap) {
        b->bad = 1;
        return;
    }
    for (int i = 0; i < bytes; i++) {
        b->p[b->n++] = (unsigned char)(v >> (8 * i));
    }
}

static uint64_t get(buf *b, int bytes) {
    uint64_t v = 0;
    if (b->n + (size_t)bytes > b->cap) {
        b->bad = 1;
        return 0;
    }
    for (int i = 0; i < bytes; i++) {
        v |= (uint64_t)b->p[b->n++] << (8 * i);
    }
    return v;
}

static size_t encode(const ct__dsvc_rec *r, unsigned char *out) {
    buf b = {out, 0, REC_BYTES, 0};
    size_t name_len = strnlen(r->name, CT_DSVC_NAME_MAX - 1);
    put(&b, (uint64_t)r->type, 1);
    put(&b, name_len, 1);
    for (size_t i = 0; i < name_len; i++) {
        put(&b, (unsigned char)r->name[i], 1);
    }
    put(&b, (uint64_t)r->eval, 1);
    put(&b, r->shard, 4);
    put(&b, r->shards, 4);
    const int64_t s64[] = {r->epoch,           r->step,     r->n_steps,
                           r->steps_per_epoch, r->examples, r->global_batch};
    for (size_t i = 0; i < sizeof s64 / sizeof s64[0]; i++) {
        put(&b, (uint64_t)s64[i], 8);
    }
    const uint64_t u64[] = {
        r->id,         r->incarnation, r->generation, r->lease_counter, r->incarnation_counter,
        r->journal_seq};
    for (size_t i = 0; i < sizeof u64 / sizeof u64[0]; i++) {
        put(&b, u64[i], 8);
    }
    put(&b, r->salt, 4);
    put(&b, (uint64_t)r->finished, 1);
    put(&b, r->fingerprint, 8);
    return b.n;
}

static int decode(const unsigned char *p, size_t n, ct__dsvc_rec *r) {
    buf b = {(unsigned char *)p, 0, n, 0};
    memset(r, 0, sizeof *r);
    r->type = (int)get(&b, 1);
    size_t name_len = (size_t)get(&b, 1);
    if (name_len >= CT_DSVC_NAME_MAX) {
        return -1;
    }
    for (size_t i = 0; i < name_len; i++) {
        r->name[i] = (char)get(&b, 1);
    }
    r->eval = (int)get(&b, 1);
    r->shard = (uint32_t)get(&b, 4);
    r->shards = (uint32_t)get(&b, 4);
    int64_t *s64[] = {&r->epoch,           &r->step,     &r->n_steps,
                      &r->steps_per_epoch, &r->examples, &r->global_batch};
    for (size_t i = 0; i < sizeof s64 / sizeof s64[0]; i++) {
        *s64[i] = (int64_t)get(&b, 8);
    }
    uint64_t *u64[] = {
        &r->id,         &r->incarnation, &r->generation, &r->lease_counter, &r->incarnation_counter,
        &r->journal_seq};
    for (size_t i = 0; i < sizeof u64 / sizeof u64[0]; i++) {
        *u64[i] = get(&b, 8);
    }
    r->salt = (uint32_t)get(&b, 4);
    r->finished = (int)get(&b, 1);
    r->fingerprint = b.n + 8 <= n ? get(&b, 8) : 0; /* records before it: 0, another job */
    return b.bad || b.n != n ? -1 : 0;
}

/* Frames r (length, masked CRC, payload) into out; returns the frame's size. */
static size_t frame(const ct__dsvc_rec *r, unsigned char *out) {
    size_t n = encode(r, out + 8);
    uint32_t crc = ct_crc32c_mask(ct_crc32c(0, out + 8, n));
    buf b = {out, 0, 8, 0};
    put(&b, n, 4);
    put(&b, crc, 4);
    return n + 8;
}

/* ---- files ---- */

static ct_status write_all(int fd, const void *data, size_t n, const char *path, ct_err *err) {
    const unsigned char *p = data;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            return ct_err_set(err, CT_EIO, "%s: write: %s", path, strerror(errno));
        }
        p += k;
        n -= (size_t)k;
    }
    return CT_OK;
}

/* Reads a whole file: *ret owned (NULL and size 0 when the file does not exist). */
static ct_status read_file(const char *path, unsigned char **ret, size_t *ret_n, ct_err *err) {
    *ret = NULL;
    *ret_n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        return errno == ENOENT ? CT_OK : ct_err_set(err, CT_EIO, "%s: %s", path, strerror(errno));
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char *p = malloc(cap);
    while (p) {
        n += fread(p + n, 1, cap - n, f);
        if (n < cap) {
            break;
        }
        unsigned char *grown = realloc(p, cap *= 2);
        if (!grown) {
            free(p);
            p = NULL;
        }
        p = grown;
    }
    int failed = ferror(f);
    fclose(f);
    if (!p || failed) {
        free(p);
        return ct_err_set(err, failed ? CT_EIO : CT_ENOMEM, "%s: cannot read it", path);
    }
    *ret = p;
    *ret_n = n;
    return CT_OK;
}

/* The next framed record at *off: 1 (in *r), 0 at the end, -1 for a torn or corrupt record. */
static int next_record(const unsigned char *p, size_t n, size_t *off, ct__dsvc_rec *r) {
    if (*off == n) {
        return 0;
    }
    if (n - *off < 8) {
        return -1;
    }
    buf b = {(unsigned char *)p + *off, 0, 8, 0};
    size_t len = (size_t)get(&b, 4);
    uint32_t crc = (uint32_t)get(&b, 4);
    if (len > REC_BYTES || n - *off - 8 < len) {
        return -1;
    }
    const unsigned char *payload = p + *off + 8;
    if (ct_crc32c_mask(ct_crc32c(0, payload, len)) != crc || decode(payload, len, r) != 0) {
        return -1;
    }
    *off += 8 + len;
    return 1;
}

static ct_status fsync_dir(const char *dir, ct_err *err) {
    int fd = open(dir, O_RDONLY);
    if (fd < 0 || fsync(fd) != 0) {
        ct_status st = ct_err_set(err, CT_EIO, "%s: fsync: %s", dir, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return st;
    }
    close(fd);
    return CT_OK;
}

static ct_status make_dirs(const char *dir, ct_err *err) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                return ct_err_set(err, CT_EIO, "%s: cannot create it: %s", path, strerror(errno));
            }
            *p = c;
            if (!c) {
                return CT_OK;
            }
        }
    }
}

/* ---- the state file ---- */

static ct_status put_rec(unsigned char **p, size_t *n, size_t *cap, const ct__dsvc_rec *r) {
    if (*n + REC_BYTES + 8 > *cap) {
        size_t grown_cap = 2 * *cap + REC_BYTES + 8;
        unsigned char *grown = realloc(*p, grown_cap);
        if (!grown) {
            return CT_ENOMEM;
        }
        *p = grown;
        *cap = grown_cap;
    }
    *n += frame(r, *p + *n);
    return CT_OK;
}

static ct__dsvc_rec head_of(const ct__dsvc_state *s, uint64_t generation, uint64_t seq) {
    return (ct__dsvc_rec){.type = CT_DSVC_REC_HEAD,
                          .generation = generation,
                          .lease_counter = s->lease_counter,
                          .incarnation_counter = s->incarnation_counter,
                          .journal_seq = seq,
                          .finished = s->finished,
                          .fingerprint = s->fingerprint};
}

/* The whole state as records: the head, the streams, each consumer followed by its leases. */
static ct_status serialize(const ct__dsvc_state *s, uint64_t seq, unsigned char **ret,
                           size_t *ret_n) {
    unsigned char *p = NULL;
    size_t n = 0, cap = 0;
    ct__dsvc_rec r = head_of(s, s->generation, seq);
    ct_status st = put_rec(&p, &n, &cap, &r);
    for (int i = 0; i < s->n_streams && st == CT_OK; i++) {
        const ct__dsvc_stream *x = &s->streams[i];
        r = (ct__dsvc_rec){.type = CT_DSVC_REC_STREAM,
                           .eval = x->eval,
                           .shards = x->shards,
                           .steps_per_epoch = x->steps_per_epoch,
                           .examples = x->examples,
                           .global_batch = x->global_batch};
        st = put_rec(&p, &n, &cap, &r);
    }
    for (int c = 0; c < s->n_consumers && st == CT_OK; c++) {
        const ct__dsvc_consumer *k = &s->consumers[c];
        if (!k->used) {
            continue;
        }
        r = (ct__dsvc_rec){.type = CT_DSVC_REC_CONSUMER,
                           .eval = k->eval,
                           .shard = k->shard,
                           .shards = k->shards,
                           .epoch = k->epoch,
                           .step = k->step,
                           .incarnation = k->incarnation};
        snprintf(r.name, sizeof r.name, "%s", k->name);
        st = put_rec(&p, &n, &cap, &r);
        for (int i = 0; i < s->n_leases && st == CT_OK; i++) {
            const ct__dsvc_lease *l = &s->leases[i];
            if (l->consumer == c) {
                r.type = CT_DSVC_REC_LEASE;
                r.id = l->id;
                r.incarnation = l->incarnation;
                r.epoch = l->epoch;
                r.step = l->first_step;
                r.n_steps = l->n_steps;
                r.salt = l->salt;
                st = put_rec(&p, &n, &cap, &r);
            }
        }
    }
    if (st != CT_OK) {
        free(p);
        return st;
    }
    *ret = p;
    *ret_n = n;
    return CT_OK;
}

/* Writes the state under the next journal sequence and starts the journal over with its head. */
static ct_status compact(ct__dsvc_state *s, ct_err *err) {
    ct__dsvc_journal *j = s->journal;
    char tmp[PATH_MAX], path[PATH_MAX], jpath[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/state.tmp", j->dir);
    snprintf(path, sizeof path, "%s/state", j->dir);
    snprintf(jpath, sizeof jpath, "%s/journal", j->dir);
    uint64_t seq = s->journal_seq + 1;
    unsigned char *p = NULL;
    size_t n = 0;
    if (serialize(s, seq, &p, &n) != CT_OK) {
        return ct_err_set(err, CT_ENOMEM, "dispatcher: out of memory (state)");
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ct_status st = fd < 0 ? ct_err_set(err, CT_EIO, "%s: %s", tmp, strerror(errno))
                          : write_all(fd, p, n, tmp, err);
    free(p);
    if (st == CT_OK && fsync(fd) != 0) {
        st = ct_err_set(err, CT_EIO, "%s: fsync: %s", tmp, strerror(errno));
    }
    if (fd >= 0) {
        close(fd);
    }
    if (st == CT_OK && rename(tmp, path) != 0) {
        st = ct_err_set(err, CT_EIO, "%s: rename to %s: %s", tmp, path, strerror(errno));
    }
    if (st == CT_OK) {
        st = fsync_dir(j->dir, err);
    }
    if (st == CT_OK && (ftruncate(j->fd, 0) != 0 || fsync(j->fd) != 0)) {
        st = ct_err_set(err, CT_EIO, "%s: truncate: %s", jpath, strerror(errno));
    }
    if (st != CT_OK) {
        return st;
    }
    s->journal_seq = seq;
    j->records = 0;
    ct__dsvc_rec head = head_of(s, s->generation, seq);
    return ct__dsvc_journal_append(s, &head, err);
}

ct_status ct__dsvc_journal_append(ct__dsvc_state *s, const ct__dsvc_rec *r, ct_err *err) {
    ct__dsvc_journal *j = s->journal;
    if (j->records >= CT_DSVC_COMPACT_RECORDS - 1) {
        ct_status st = compact(s, err);
        if (st != CT_OK) {
            return st;
        }
    }
    unsigned char out[REC_BYTES + 8];
    size_t n = frame(r, out);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/journal", j->dir);
    ct_status st = write_all(j->fd, out, n, path, err);
    if (st == CT_OK && r->type != CT_DSVC_REC_ACK && fdatasync(j->fd) != 0) {
        st = ct_err_set(err, CT_EIO, "%s: fsync: %s", path, strerror(errno));
    }
    j->records += st == CT_OK;
    return st;
}

/* ---- restart ---- */

static ct_status load_state(ct__dsvc_state *s, const char *path, ct_err *err) {
    unsigned char *p;
    size_t n, off = 0;
    ct_status st = read_file(path, &p, &n, err);
    ct__dsvc_rec r;
    int k = 0, got;
    while (st == CT_OK && (got = next_record(p, n, &off, &r)) != 0) {
        st = got < 0 ? ct_err_set(err, CT_EIO, "%s: record %d is corrupt (byte %zu)", path, k, off)
                     : ct__dsvc_apply(s, &r, err);
        k++;
    }
    free(p);
    return st;
}

/* Replays the journal at path; *ret_good: the bytes to keep (0: ignore it all). */
static ct_status replay(ct__dsvc_state *s, const char *path, int *ret_n, size_t *ret_good,
                        ct_err *err) {
    unsigned char *p;
    size_t n, off = 0;
    ct_status st = read_file(path, &p, &n, err);
    ct__dsvc_rec r;
    int k = 0, got = 0;
    while (st == CT_OK && (got = next_record(p, n, &off, &r)) > 0) {
        if (k == 0 && (r.type != CT_DSVC_REC_HEAD || r.journal_seq != s->journal_seq)) {
            ct_log(CT_LOG_WARN,
                   "dispatcher: %s predates %s/state (a crash while compacting): "
                   "ignored",
                   path, s->journal->dir);
            off = 0;
            got = 0;
            break;
        }
        st = ct__dsvc_apply(s, &r, err);
        k++;
    }
    if (st == CT_OK && got < 0) {
        ct_log(CT_LOG_WARN, "dispatcher: %s: dropped a torn last record at byte %zu (%zu bytes)",
               path, off, n - off);
    }
    free(p);
    *ret_n = k;
    *ret_good = off;
    return st;
}

/* A journal of a job that finished, or of another job (its input or schedule changed: the
 * stored counts and positions would be wrong), is set aside: the state starts empty (the
 * counters and the generation go on, so ids stay unique), and `state` and the journal start
 * over. s->fresh_reason says why. */
static ct_status set_aside_if_stale(ct__dsvc_state *s, const char *state_path, int *replayed,
                                    size_t *good, ct_err *err) {
    const char *why = s->finished                               ? "its job had finished"
                      : s->loaded_fingerprint != s->fingerprint ? "it is another job's (the input "
                                                                  "or the schedule changed)"
                                                                : NULL;
    if (!why) {
        return CT_OK;
    }
    ct__dsvc_state fresh;
    ct__dsvc_state_init(&fresh, &s->cfg);
    fresh.generation = s->generation;
    fresh.lease_counter = s->lease_counter;
    fresh.incarnation_counter = s->incarnation_counter;
    fresh.journal_seq = s->journal_seq;
    fresh.fingerprint = fresh.loaded_fingerprint = s->fingerprint;
    fresh.journal = s->journal;
    fresh.emit = s->emit;
    fresh.emit_user = s->emit_user;
    fresh.fresh_reason = why;
    ct__dsvc_state_finish(s);
    *s = fresh;
    *replayed = 0;
    *good = 0;
    if (unlink(state_path) != 0 && errno != ENOENT) {
        return ct_err_set(err, CT_EIO, "%s: cannot remove: %s", state_path, strerror(errno));
    }
    return CT_OK;
}

ct_status ct__dsvc_journal_open(ct__dsvc_state *s, const char *dir, int *ret_replayed,
                                ct_err *err) {
    ct__dsvc_journal *j = calloc(1, sizeof *j);
    if (!j) {
        return ct_err_set(err, CT_ENOMEM, "dispatcher: out of memory");
    }
    j->fd = -1;
    snprintf(j->dir, sizeof j->dir, "%s", dir);
    s->journal = j;
    char path[PATH_MAX], jpath[PATH_MAX];
    snprintf(path, sizeof path, "%s/state", dir);
    snprintf(jpath, sizeof jpath, "%s/journal", dir);
    int replayed = 0;
    size_t good = 0;
    ct_status st = make_dirs(dir, err);
    if (st == CT_OK) {
        st = load_state(s, path, err);
    }
    if (st == CT_OK) {
        st = replay(s, jpath, &replayed, &good, err);
    }
    if (st == CT_OK && (replayed > 0 || s->n_consumers > 0 || s->n_streams > 0)) {
        st = set_aside_if_stale(s, path, &replayed, &good, err);
    }
    if (st == CT_OK) {
        j->fd = open(jpath, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (j->fd < 0 || ftruncate(j->fd, (off_t)good) != 0 || fsync(j->fd) != 0) {
            st = ct_err_set(err, CT_EIO, "%s: %s", jpath, strerror(errno));
        }
    }
    j->records = replayed;
    if (st == CT_OK) {
        ct__dsvc_rec head = head_of(s, s->generation + 1, s->journal_seq);
        st = ct__dsvc_commit(s, &head, err);
    }
    if (st != CT_OK) {
        ct__dsvc_journal_close(s);
        return st;
    }
    for (int i = 0; i < s->n_leases; i++) {
        s->leases[i].holder = -1;
        s->leases[i].requeued = 1;
    }
    if (ret_replayed) {
        *ret_replayed = replayed;
    }
    return CT_OK;
}

void ct__dsvc_journal_close(ct__dsvc_state *s) {
    if (!s->journal) {
        return;
    }
    if (s->journal->fd >= 0) {
        close(s->journal->fd);
    }
    free(s->journal);
    s->journal = NULL;
}
