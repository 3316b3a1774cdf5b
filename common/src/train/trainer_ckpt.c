/* The trainer's checkpoints (ctrain/checkpoint.h holds the file format): the run's state as a
 * list of tensors (parameters, optimizer slots, the input position), saved under the job's
 * retention policy, and restored with every name, shape, seed and batch size checked so that a
 * resumed run continues bit for bit. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/clock.h"
#include "ctrain/checkpoint.h"
#include "prof/prof.h"
#include "train/trainer_internal.h"

int64_t ct__trainer_last_saved_step(const ct_trainer *t) {
    const char *base = strrchr(t->last_ckpt, '/');
    long long s = -1;
    return (base && sscanf(base, "/ckpt-%lld", &s) == 1) ? s : -1;
}

ct_status ct_trainer_set_checkpointing(ct_trainer *t, const char *dir, const char *job_text,
                                       ct_err *err) {
    free(t->job_text);
    t->job_text = strdup(job_text ? job_text : "");
    if (!t->job_text) {
        return ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
    }
    snprintf(t->ckpt_dir, sizeof t->ckpt_dir, "%s", dir ? dir : "");
    return CT_OK;
}

const char *ct_trainer_last_checkpoint(const ct_trainer *t) {
    return t->last_ckpt;
}

/* The input position a checkpoint keeps ("input/position", int64): where in the epoch's global
 * order the run is, and what that order was, so that a run resumed with another number of
 * replicas or another global batch continues at the same example. Version 1 files hold the
 * first four. */
enum {
    POS_EPOCH,     /* the epoch in progress */
    POS_STEP,      /* batches of it consumed, of this run's global batch */
    POS_BATCH,     /* the per-replica batch */
    POS_DATASET_N, /* examples per epoch (0 unknown) */
    POS_WORLD,     /* replicas (data-parallel ranks; 1 alone) */
    POS_GLOBAL,    /* examples per step across the replicas */
    POS_EXAMPLES,  /* examples of the epoch's global order consumed */
    POS_INPUT,     /* the training data's order (ct_job_id CT_JOB_ID_PIPELINE), as int64 */
    POS_N,
    POS_N_VERSION1 = 4
};

/* Replicas of this run (1 without data parallelism). */
static int64_t world_size(const ct_trainer *t) {
    return t->shard_count > 1 ? t->shard_count : 1;
}

/* Every tensor of the run's state: parameters, optimizer slots, input position. Returns the
 * count; `pos` (POS_N int64) must outlive the list. */
static int state_tensors(ct_trainer *t, ct_ckpt_tensor *out, int cap, int64_t *pos) {
    ct_params *p = ct_model_params(t->model);
    int n = 0;
    for (int i = 0; i < p->n && n < cap; i++) {
        ct_ckpt_tensor *e = &out[n++];
        snprintf(e->name, sizeof e->name, "%s", p->items[i].name);
        e->dtype = CT_F32;
        e->shape = p->items[i].shape;
        e->data = ct_params_data(p, i);
        e->bytes = (uint64_t)p->items[i].size * sizeof(float);
    }
    for (int k = 0; k < ct_optimizer_slot_count(t->opt); k++) {
        float *slot = ct_optimizer_slot(t->opt, k);
        for (int i = 0; slot && i < p->n && n < cap; i++) {
            if (!p->items[i].trainable) {
                continue;
            }
            ct_ckpt_tensor *e = &out[n++];
            snprintf(e->name, sizeof e->name, "%s/%s", p->items[i].name,
                     ct_optimizer_slot_name(t->opt, k));
            e->dtype = CT_F32;
            e->shape = p->items[i].shape;
            e->data = slot + p->items[i].offset;
            e->bytes = (uint64_t)p->items[i].size * sizeof(float);
        }
    }
    const int64_t global = t->cfg.train.batch_size * world_size(t);
    pos[POS_EPOCH] = t->epoch;
    pos[POS_STEP] = t->epoch_step;
    pos[POS_BATCH] = t->cfg.train.batch_size;
    pos[POS_DATASET_N] = t->dataset_n;
    pos[POS_WORLD] = world_size(t);
    pos[POS_GLOBAL] = global;
    pos[POS_EXAMPLES] = t->epoch_step * global + t->resume_skip; /* a bridge step still due */
    memcpy(&pos[POS_INPUT], &t->cfg.input_fingerprint, sizeof pos[POS_INPUT]);
    if (n < cap) {
        ct_ckpt_tensor *e = &out[n++];
        snprintf(e->name, sizeof e->name, "input/position");
        e->dtype = CT_I64;
        e->shape = (ct_shape){.rank = 1, .dims = {POS_N}};
        e->data = pos;
        e->bytes = POS_N * sizeof(int64_t);
    }
    return n;
}

static int state_capacity(ct_trainer *t) {
    ct_params *p = ct_model_params(t->model);
    return p->n * (1 + ct_optimizer_slot_count(t->opt)) + 3; /* + position, loss scale */
}

ct_status ct_trainer_save(ct_trainer *t, char *ret_path, ct_err *err) {
    int cap = state_capacity(t);
    ct_ckpt_tensor *list = calloc((size_t)cap, sizeof *list);
    if (!list) {
        return ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
    }
    int64_t pos[POS_N], scale_counts[3];
    int n = state_tensors(t, list, cap, pos);
    n += ct__loss_scale_tensors(t, list + n, cap - n, scale_counts);
    ct_ckpt_meta meta = {.step = t->step,
                         .epoch = t->epoch,
                         .epoch_step = t->epoch_step,
                         .total_steps = t->total_steps,
                         .seed = t->cfg.seed,
                         .wall_time = (double)ct__wall_s(),
                         .job_text = t->job_text};
    snprintf(meta.job_path, sizeof meta.job_path, "%s", t->cfg.path);
    ct_ckpt_policy policy = {.keep_last = t->cfg.checkpoint.keep_last,
                             .keep_every_hours = t->cfg.checkpoint.keep_every_hours};
    const int64_t t0 = ct__prof_begin();
    ct_status st = ct_ckpt_save(t->ckpt_dir, &policy, &meta, list, n, t->last_ckpt, err);
    int64_t bytes = 0;
    for (int k = 0; t0 && k < n; k++) {
        bytes += list[k].bytes;
    }
    ct__prof_end(t0, CT__PROF_CHECKPOINT, "checkpoint_save", NULL, -1, bytes, -1, -1);
    free(list);
    if (st == CT_OK && ret_path) {
        snprintf(ret_path, PATH_MAX, "%s", t->last_ckpt);
    }
    return st;
}

/* Copies tensor `name` of c into dst (n floats), checking it is there with that shape. */
static ct_status restore_one(const ct_ckpt *c, const char *path, const char *name,
                             const ct_shape *shape, float *dst, ct_err *err) {
    const ct_ckpt_tensor *e = ct_ckpt_find(c, name);
    char a[96], b[96];
    if (!e) {
        return ct_err_set(err, CT_EINVAL, "%s: has no tensor '%s' (another model or optimizer?)",
                          path, name);
    }
    if (e->dtype != CT_F32 || !ct_shape_equal(&e->shape, shape)) {
        return ct_err_set(err, CT_ESHAPE, "%s: tensor '%s' is %s%s, the model needs f32%s", path,
                          name, ct_dtype_name(e->dtype), ct_shape_str(&e->shape, a, sizeof a),
                          ct_shape_str(shape, b, sizeof b));
    }
    memcpy(dst, e->data, (size_t)e->bytes);
    return CT_OK;
}

/* "KEY ... TOKEN (now TOKEN')": the line's first token (its key) and the first space-separated
 * token where lines a and b (of la and lb bytes) differ. */
static void differing_token(const char *a, size_t la, const char *b, size_t lb, char *buf,
                            size_t cap) {
    size_t key = strcspn(a, " \n");
    size_t i = 0, j = 0;
    for (;;) {
        size_t ta = i < la ? strcspn(a + i, " \n") : 0, tb = j < lb ? strcspn(b + j, " \n") : 0;
        if (ta != tb || memcmp(a + i, b + j, ta) != 0 || (ta == 0 && tb == 0)) {
            snprintf(buf, cap, "%.*s%s%.*s (now %.*s)", (int)(key < 160 ? key : 160), a,
                     i > 0 ? " ... " : "", (int)(ta < 200 ? ta : 200), i > 0 ? a + i : "",
                     (int)(tb < 200 ? tb : 200), b + j);
            return;
        }
        i += ta + 1;
        j += tb + 1;
    }
}

/* The first line where the checkpoint's training data (its job text, with the overrides it
 * lists, in canonical form) and this run's differ: "data.train.pipeline[1]=shuffle count=16 ...
 * (now: ... count=32 ...)"; or why it cannot say. */
static void what_changed(const ct_trainer *t, const ct_ckpt_meta *m, char *buf, size_t cap) {
    ct_job *old = malloc(sizeof *old);
    ct_err perr = {0};
    if (!old || ct_job_parse_stored(m->job_text, "the checkpoint's job", old, &perr) != CT_OK) {
        snprintf(buf, cap, "its job text does not parse here (%s)", old ? perr.msg : "memory");
        free(old);
        return;
    }
    size_t len = ct_job_canonical(old, CT_JOB_ID_PIPELINE, NULL, 0);
    char *was = malloc(len + 1);
    if (was) {
        ct_job_canonical(old, CT_JOB_ID_PIPELINE, was, len + 1);
    }
    const char *a = was ? was : "", *b = t->cfg.input_canonical;
    while (*a && *b) {
        size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
        if (la != lb || memcmp(a, b, la) != 0) {
            differing_token(a, la, b, lb, buf, cap);
            break;
        }
        a += la + (a[la] == '\n');
        b += lb + (b[lb] == '\n');
    }
    if (!*a || !*b) {
        snprintf(buf, cap, "%s",
                 *a ? "the job now has fewer stages" : "the job now has more stages");
    }
    free(was);
    free(old);
}

/* Where the run continues in its epoch: the checkpoint's position in the epoch's global order,
 * counted in this run's global batches. A changed training pipeline is refused unless
 * checkpoint.allow_changed_input; another number of replicas or another global batch continues
 * at the same example, and t->resume_note says so. */
static ct_status resume_position(ct_trainer *t, const ct_ckpt *c, const char *path,
                                 int64_t *ret_step, ct_err *err) {
    const ct_ckpt_tensor *e = ct_ckpt_find(c, "input/position");
    int64_t pos[POS_N] = {0};
    if (!e || e->dtype != CT_I64 ||
        (e->bytes != POS_N * sizeof(int64_t) && e->bytes != POS_N_VERSION1 * sizeof(int64_t))) {
        return ct_err_set(err, CT_EINVAL, "%s: has no input position", path);
    }
    memcpy(pos, e->data, (size_t)e->bytes);
    if (e->bytes == POS_N_VERSION1 * sizeof(int64_t)) { /* one process, before world sizes */
        pos[POS_WORLD] = 1;
        pos[POS_GLOBAL] = pos[POS_BATCH];
        pos[POS_EXAMPLES] = pos[POS_STEP] * pos[POS_BATCH];
    }
    uint64_t input = 0;
    memcpy(&input, &pos[POS_INPUT], sizeof input);
    if (input != 0 && input != t->cfg.input_fingerprint) {
        char what[600];
        what_changed(t, ct_ckpt_meta_of(c), what, sizeof what);
        if (!t->cfg.checkpoint.allow_changed_input) {
            return ct_err_set(err, CT_EINVAL,
                              "%s: the training data changed since this checkpoint: %s; its "
                              "position would name other examples (--allow-changed-input "
                              "resumes anyway, --no-resume starts over)",
                              path, what);
        }
        snprintf(t->resume_note, sizeof t->resume_note,
                 "resuming although the training data changed (--allow-changed-input): %s", what);
    }
    const int64_t global = t->cfg.train.batch_size * world_size(t);
    const int64_t inside = pos[POS_EXAMPLES] % global;
    if (inside != 0 && !t->reducer && t->shard_count > 1) { /* the parameter-server chief */
        return ct_err_set(err, CT_EINVAL,
                          "%s: written at example %lld of epoch %lld with a global batch of %lld "
                          "(%lld x %lld); parameter-server workers resume at a whole global batch "
                          "and %lld would repeat or skip examples: resume with a global batch "
                          "that divides %lld (train.global_batch_size), or --no-resume",
                          path, (long long)pos[POS_EXAMPLES], (long long)pos[POS_EPOCH],
                          (long long)pos[POS_GLOBAL], (long long)pos[POS_WORLD],
                          (long long)pos[POS_BATCH], (long long)global,
                          (long long)pos[POS_EXAMPLES]);
    }
    *ret_step = pos[POS_EXAMPLES] / global;
    t->resume_skip = inside; /* fit's first step leaves them out */
    if (pos[POS_WORLD] != world_size(t) || pos[POS_GLOBAL] != global) {
        char *note = t->resume_note + strlen(t->resume_note);
        size_t left = sizeof t->resume_note - strlen(t->resume_note);
        snprintf(note, left,
                 "%scheckpoint of %lld replica%s (global batch %lld) resumed on %lld (global "
                 "batch %lld%s): epoch %lld continues at example %lld (batch %lld%s)",
                 note == t->resume_note ? "" : "; ", (long long)pos[POS_WORLD],
                 pos[POS_WORLD] == 1 ? "" : "s", (long long)pos[POS_GLOBAL],
                 (long long)world_size(t), (long long)global,
                 pos[POS_GLOBAL] != global ? ": the global batch changed" : ", the same",
                 (long long)pos[POS_EPOCH], (long long)pos[POS_EXAMPLES], (long long)*ret_step,
                 inside ? ", without its examples trained before" : "");
    }
    t->epoch = pos[POS_EPOCH];
    t->dataset_n = pos[POS_DATASET_N];
    return CT_OK;
}

ct_status ct_trainer_restore(ct_trainer *t, const ct_ckpt *c, const char *path, ct_err *err) {
    const ct_ckpt_meta *m = ct_ckpt_meta_of(c);
    if (m->seed != t->cfg.seed) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: written with seed %llu, the job has seed %llu (the data order and "
                          "dropout would differ; use --no-resume to start over)",
                          path, (unsigned long long)m->seed, (unsigned long long)t->cfg.seed);
    }
    t->resume_note[0] = '\0';
    const int64_t epoch = t->epoch, dataset_n = t->dataset_n;
    int64_t step = 0;
    ct_status st = resume_position(t, c, path, &step, err);
    ct_params *p = ct_model_params(t->model);
    char name[192];
    for (int i = 0; i < p->n && st == CT_OK; i++) {
        st = restore_one(c, path, p->items[i].name, &p->items[i].shape, ct_params_data(p, i), err);
    }
    for (int k = 0; k < ct_optimizer_slot_count(t->opt) && st == CT_OK; k++) {
        float *slot = ct_optimizer_slot(t->opt, k);
        for (int i = 0; slot && i < p->n && st == CT_OK; i++) {
            if (p->items[i].trainable) {
                snprintf(name, sizeof name, "%s/%s", p->items[i].name,
                         ct_optimizer_slot_name(t->opt, k));
                st = restore_one(c, path, name, &p->items[i].shape, slot + p->items[i].offset, err);
            }
        }
    }
    if (st != CT_OK) { /* nothing of the position taken */
        t->epoch = epoch;
        t->dataset_n = dataset_n;
        t->resume_skip = 0;
        return st;
    }
    t->step = m->step;
    t->epoch_step = step;
    ct__loss_scale_restore(t, c);
    snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", path);
    return CT_OK;
}

ct_status ct_trainer_resume(ct_trainer *t, const char *dir, int *resumed,
                            void (*warn)(const char *msg, void *user), void *user, ct_err *err) {
    ct_ckpt *c = NULL;
    char path[PATH_MAX];
    *resumed = 0;
    ct_status st = ct_ckpt_latest(dir, &c, path, warn, user, err);
    if (st == CT_ENOENT) {
        return CT_OK; /* nothing to resume */
    }
    if (st == CT_OK) {
        st = ct_trainer_restore(t, c, path, err);
        *resumed = st == CT_OK;
    }
    if (st == CT_OK && t->resume_note[0] && warn) {
        warn(t->resume_note, user);
    }
    ct_ckpt_destroy(c);
    return st;
}

ct_status ct_trainer_load_checkpoint(const char *path, ct_job *job, ct_trainer **t, ct_err *err) {
    char file[PATH_MAX];
    ct_ckpt *c = NULL;
    struct stat sb;
    ct_status st;
    *t = NULL;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        st = ct_ckpt_latest(path, &c, file, NULL, NULL, err);
    } else {
        snprintf(file, sizeof file, "%s", path);
        st = ct_ckpt_create(path, &c, err);
    }
    if (st == CT_OK) {
        /* named as the job file it was trained from: its relative data paths resolve there */
        const ct_ckpt_meta *m = ct_ckpt_meta_of(c);
        st = ct_job_parse_stored(m->job_text, m->job_path[0] ? m->job_path : file, job, err);
    }
    if (st == CT_OK) { /* for inference: no optimizer state, and the training data may move */
        job->optimizer.type = CT_OPT_SGD;
        job->optimizer.momentum = 0.0f;
        job->optimizer.nesterov = 0;
        job->checkpoint.allow_changed_input = 1;
    }
    if (st == CT_OK && (st = ct_trainer_create(job, t, err)) == CT_OK &&
        (st = ct_trainer_restore(*t, c, file, err)) != CT_OK) {
        ct_trainer_destroy(*t);
        *t = NULL;
    }
    ct_ckpt_destroy(c);
    return st;
}
