/* Checkpoints: one file per save, "CTRAINCK" | u32 version | u32 index length | protobuf-c
 * index (common/proto/checkpoint.proto: names, dtypes, shapes, offsets, CRC-32C per tensor, and
 * the run's position: step, epoch, batch within the epoch, seed, job text) | masked CRC-32C of
 * the index | raw little-endian tensor data, 64-byte aligned. Written to a temporary name,
 * fsynced, renamed, and the directory fsynced, so a crash leaves the old file or the new one.
 *
 * A checkpoint directory holds ckpt-<step>.ctck files and an index file `checkpoint` naming the
 * latest (as TensorFlow's CheckpointManager does). Saving prunes to the last K, keeping one every
 * H hours, and never deletes a file an evaluator holds a lease on (<file>.lease). */
#ifndef CTRAIN_CHECKPOINT_H
#define CTRAIN_CHECKPOINT_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/status.h"
#include "ctrain/tensor.h"

#define CT_CKPT_VERSION 1
#define CT_CKPT_MAGIC "CTRAINCK"
#define CT_CKPT_LEASE_SECONDS 600 /* a lease older than this is stale (its holder died) */

typedef struct ct_ckpt_tensor {
    char name[128];
    ct_dtype dtype;
    ct_shape shape;
    const void *data; /* little-endian, row-major */
    uint64_t bytes;
} ct_ckpt_tensor;

typedef struct ct_ckpt_meta {
    int64_t step;        /* optimizer steps done */
    int64_t epoch;       /* epoch in progress */
    int64_t epoch_step;  /* batches of that epoch consumed */
    int64_t total_steps; /* the run's planned steps */
    uint64_t seed;
    double wall_time;
    char job_path[1024];
    const char *job_text; /* the job file and its overrides (owned by the checkpoint on read) */
} ct_ckpt_meta;

/* Writes a checkpoint file atomically (tmp, fsync, rename, fsync of the directory). */
CT_API ct_status ct_ckpt_write(const char *path, const ct_ckpt_meta *meta,
                               const ct_ckpt_tensor *tensors, int n, ct_err *err);

/* A checkpoint read into memory and verified: magic, version, index CRC, sizes, and the CRC of
 * every tensor. Errors name the file and, for data, the tensor. */
typedef struct ct_ckpt ct_ckpt;
CT_API ct_status ct_ckpt_create(const char *path, ct_ckpt **ret, ct_err *err);
CT_API void ct_ckpt_destroy(ct_ckpt *c);
CT_API const ct_ckpt_meta *ct_ckpt_meta_of(const ct_ckpt *c);
CT_API int ct_ckpt_count(const ct_ckpt *c);
CT_API const ct_ckpt_tensor *ct_ckpt_get(const ct_ckpt *c, int i);
CT_API const ct_ckpt_tensor *ct_ckpt_find(const ct_ckpt *c, const char *name);
CT_API uint64_t ct_ckpt_file_bytes(const ct_ckpt *c);

/* ---- checkpoint directories ---- */

typedef struct ct_ckpt_policy {
    int keep_last;          /* keep the newest K files (at least 1) */
    float keep_every_hours; /* and one per H hours of wall time (0: off) */
} ct_ckpt_policy;

/* Saves ckpt-<step>.ctck in dir (created if needed), points the index file at it, and prunes
 * older files by `policy`, skipping leased ones. *ret_path (if not NULL, PATH_MAX bytes) gets
 * the file written. */
CT_API ct_status ct_ckpt_save(const char *dir, const ct_ckpt_policy *policy,
                              const ct_ckpt_meta *meta, const ct_ckpt_tensor *tensors, int n,
                              char *ret_path, ct_err *err);

/* Lists the checkpoint files in dir, newest step first: up to cap paths (each PATH_MAX bytes,
 * in one buffer) and their steps; returns how many there are (-1: dir unreadable). */
CT_API int ct_ckpt_list(const char *dir, char *paths, int64_t *steps, int cap);

/* Reads the newest checkpoint of dir that verifies: the one the index names, else the newest
 * good file. CT_ENOENT when there is none. Corrupt files passed over are reported one line each
 * through `warn` (may be NULL). */
CT_API ct_status ct_ckpt_latest(const char *dir, ct_ckpt **ret, char *ret_path,
                                void (*warn)(const char *msg, void *user), void *user, ct_err *err);

/* Creates dir and its missing parents (mkdir -p). */
CT_API ct_status ct_make_dirs(const char *dir, ct_err *err);

/* Leases: a reader holds <file>.lease while it reads, and pruning leaves the file alone. */
CT_API ct_status ct_ckpt_lease(const char *path, ct_err *err);
CT_API void ct_ckpt_release(const char *path);

/* ---- starting a run over ---- */

/* --no-resume: moves a run's old outputs aside so that the new run starts with none of them and
 * TensorBoard shows the old one as runs of its own: the checkpoint directory and run_dir's
 * train/ and validation/ (the TensorBoard runs) and metrics.jsonl, each renamed
 * NAME.previous-<unix time>, or NAME.previous-<time>.<k> when one of those names is taken (two
 * runs in one second). ckpt_dir NULL or "" means run_dir/checkpoints. suffix (64 bytes, may be
 * NULL) gets the suffix used, *moved (may be NULL) how many were moved: 0 when there was nothing
 * to move. An error names the path that could not be moved; the ones moved before it stay
 * moved. */
CT_API ct_status ct_run_move_aside(const char *run_dir, const char *ckpt_dir, char *suffix,
                                   int *moved, ct_err *err);

#endif
