/* The trainer's checkpoints (ctrain/checkpoint.h holds the file format): the run's state as a
 * list of tensors (parameters, optimizer slots, the input position), saved under the job's
 * retention policy, and restored with every name, shape, seed and batch size checked so that a
 * resumed run continues bit for bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* Every tensor of the run's state: parameters, optimizer slots, input position. Returns the
 * count; `pos` (4 int64) must outlive the list. */
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
    pos[0] = t->epoch;
    pos[1] = t->epoch_step;
    pos[2] = t->cfg.train.batch_size;
    pos[3] = t->dataset_n;
    if (n < cap) {
        ct_ckpt_tensor *e = &out[n++];
        snprintf(e->name, sizeof e->name, "input/position");
        e->dtype = CT_I64;
        e->shape = (ct_shape){.rank = 1, .dims = {4}};
        e->data = pos;
        e->bytes = 4 * sizeof(int64_t);
    }
    return n;
}

static int state_capacity(ct_trainer *t) {
    ct_params *p = ct_model_params(t->model);
    return p->n * (1 + ct_optimizer_slot_count(t->opt)) + 1;
}

ct_status ct_trainer_save(ct_trainer *t, char *ret_path, ct_err *err) {
    int cap = state_capacity(t);
    ct_ckpt_tensor *list = calloc((size_t)cap, sizeof *list);
    if (!list) {
        return ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
    }
    int64_t pos[4];
    int n = state_tensors(t, list, cap, pos);
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

ct_status ct_trainer_restore(ct_trainer *t, const ct_ckpt *c, const char *path, ct_err *err) {
    const ct_ckpt_meta *m = ct_ckpt_meta_of(c);
    if (m->seed != t->cfg.seed) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: written with seed %llu, the job has seed %llu (the data order and "
                          "dropout would differ; use --no-resume to start over)",
                          path, (unsigned long long)m->seed, (unsigned long long)t->cfg.seed);
    }
    const ct_ckpt_tensor *pos = ct_ckpt_find(c, "input/position");
    if (!pos || pos->dtype != CT_I64 || pos->bytes != 4 * sizeof(int64_t)) {
        return ct_err_set(err, CT_EINVAL, "%s: has no input position", path);
    }
    int64_t where[4];
    memcpy(where, pos->data, sizeof where);
    if (where[2] != t->cfg.train.batch_size) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: written with batch size %lld, the job has %d (use --no-resume to "
                          "start over)",
                          path, (long long)where[2], t->cfg.train.batch_size);
    }
    ct_params *p = ct_model_params(t->model);
    ct_status st = CT_OK;
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
    if (st == CT_OK) {
        t->step = m->step;
        t->epoch = where[0];
        t->epoch_step = where[1];
        t->dataset_n = where[3];
        snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", path);
    }
    return st;
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
    ct_ckpt_destroy(c);
    return st;
}
