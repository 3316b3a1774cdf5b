/* The optimizer section of a job file: optimizer.type and its options, the clipping, the
 * weight decay's exclusions and the learning-rate schedule (see job-file.md). Keys that the
 * chosen optimizer would ignore are refused, naming the optimizers that read them. */
#include <stdio.h>
#include <string.h>

#include "io/job_read.h"

#define OPT_ROW(e, name) {#name, CT_OPT_##e},
static const ct__job_name optimizer_names[] = {CT_OPTIMIZER_LIST(OPT_ROW){NULL, 0}};
static const ct__job_name schedule_names[] = {
    {"constant", CT_SCHED_CONSTANT},
    {"step", CT_SCHED_STEP},
    {"cosine", CT_SCHED_COSINE},
    {NULL, 0},
};
static const char *const optimizer_keys[] = {
    "type", "learning_rate", "momentum", "nesterov",  "beta1",    "beta2",         "epsilon",
    "rho",  "weight_decay",  "decay",    "clip_norm", "schedule", "decay_exclude", NULL};
static const char *const schedule_keys[] = {"type",        "warmup_steps", "step_size", "gamma",
                                            "decay_steps", "min_lr",       NULL};
/* Which optimizer types read an optimizer key (bit per ct_optimizer_type); other keys: all. */
#define OPT_BIT(type) (1u << (type))
static const struct {
    const char *key;
    unsigned types;
} optimizer_key_users[] = {
    {"momentum", OPT_BIT(CT_OPT_SGD) | OPT_BIT(CT_OPT_RMSPROP)},
    {"nesterov", OPT_BIT(CT_OPT_SGD)},
    {"beta1", OPT_BIT(CT_OPT_ADAM) | OPT_BIT(CT_OPT_ADAMW)},
    {"beta2", OPT_BIT(CT_OPT_ADAM) | OPT_BIT(CT_OPT_ADAMW)},
    {"epsilon", OPT_BIT(CT_OPT_ADAM) | OPT_BIT(CT_OPT_ADAMW) | OPT_BIT(CT_OPT_RMSPROP)},
    {"rho", OPT_BIT(CT_OPT_RMSPROP)},
    {"weight_decay", OPT_BIT(CT_OPT_ADAMW)},
    {"decay_exclude", OPT_BIT(CT_OPT_ADAMW)},
};

/* optimizer.decay_exclude: [name parts]: parameters whose name holds one get no weight decay. */
static void read_decay_exclude(const ct__job_section *s, ct_optimizer_spec *o) {
    char key[CT__JOB_KEY_CAP], item[CT__JOB_KEY_CAP], buf[160];
    const ct__yaml_node *v = ct__job_sec_get(s, "decay_exclude", key);
    if (!v) {
        return;
    }
    if (v->kind != CT__YAML_SEQ || v->n > CT_OPT_MAX_EXCLUDE) {
        ct__job_fail(s->r, v->line, key,
                     "must list up to %d parts of parameter names, e.g. [bias, layer_norm, "
                     "embeddings], got %s",
                     CT_OPT_MAX_EXCLUDE, ct__yaml_describe(v, buf, sizeof buf));
        return;
    }
    for (size_t i = 0; i < v->n && s->r->status == CT_OK; i++) {
        ct__job_key_printf(item, "%s[%zu]", key, i);
        ct__job_read_string(s->r, v->items[i], item, o->decay_exclude[i],
                            sizeof o->decay_exclude[i]);
    }
    o->n_decay_exclude = (int)v->n;
}

void ct__job_optimizer_defaults(ct_optimizer_spec *o, ct_optimizer_type type) {
    memset(o, 0, sizeof *o);
    o->type = type;
    o->learning_rate = 1e-3f;
    o->beta1 = 0.9f;
    o->beta2 = 0.999f;
    o->epsilon = 1e-7f;
    o->rho = 0.9f;
    o->weight_decay = type == CT_OPT_ADAMW ? 0.004f : 0.0f;
    o->schedule = CT_SCHED_CONSTANT;
    o->gamma = 0.1f;
}

/* Refuses keys that the chosen optimizer would silently ignore. */
static void check_optimizer_keys(const ct__job_section *s, ct_optimizer_type type) {
    char path[CT__JOB_KEY_CAP], users[120];
    size_t n = sizeof optimizer_key_users / sizeof optimizer_key_users[0];
    for (size_t i = 0; i < n; i++) {
        unsigned mask = optimizer_key_users[i].types;
        if (!ct__job_sec_get(s, optimizer_key_users[i].key, path) || (mask & OPT_BIT(type))) {
            continue;
        }
        size_t used = 0;
        users[0] = '\0';
        for (int t = CT_OPT_SGD; t <= CT_OPT_RMSPROP; t++) {
            if (mask & OPT_BIT(t)) {
                used += (size_t)snprintf(users + used, sizeof users - used, "%s%s",
                                         used ? ", " : "", ct__job_name_of(optimizer_names, t));
            }
        }
        ct__job_fail(s->r, ct__job_key_line(s, optimizer_key_users[i].key), path,
                     "not used by %s (only by %s)", ct__job_name_of(optimizer_names, type), users);
        return;
    }
}

static void read_schedule(ct__job_reader *r, const ct__job_section *opt, ct_optimizer_spec *o) {
    char path[CT__JOB_KEY_CAP];
    ct__job_section s;
    int type = CT_SCHED_CONSTANT;
    ct__job_sec_open(r, ct__job_sec_get(opt, "schedule", path), path, schedule_keys,
                     ct__job_key_line(opt, "schedule"), &s);
    ct__job_sec_name(&s, "type", schedule_names, "schedule", &type);
    o->schedule = (ct_schedule_type)type;
    ct__job_sec_i64(&s, "warmup_steps", 0, &o->warmup_steps);
    const char *step_only[] = {"step_size", "gamma"}, *cosine_only[] = {"decay_steps", "min_lr"};
    for (int k = 0; k < 2; k++) {
        if (type != CT_SCHED_STEP && ct__job_sec_get(&s, step_only[k], path)) {
            ct__job_fail(r, ct__job_key_line(&s, step_only[k]), path,
                         "only used by the step schedule");
        }
        if (type != CT_SCHED_COSINE && ct__job_sec_get(&s, cosine_only[k], path)) {
            ct__job_fail(r, ct__job_key_line(&s, cosine_only[k]), path,
                         "only used by the cosine schedule");
        }
    }
    if (type == CT_SCHED_STEP) {
        ct__job_sec_require(&s, "step_size");
    }
    ct__job_sec_i64(&s, "step_size", 1, &o->step_size);
    ct__job_sec_float(&s, "gamma", CT__JOB_POSITIVE, &o->gamma);
    ct__job_sec_i64(&s, "decay_steps", 0, &o->decay_steps);
    ct__job_sec_float(&s, "min_lr", CT__JOB_NON_NEGATIVE, &o->min_lr);
}

void ct__job_read_optimizer(ct__job_reader *r, const ct__job_section *top, ct_optimizer_spec *o) {
    char path[CT__JOB_KEY_CAP];
    ct__job_section s;
    int type = CT_OPT_ADAM;
    ct__job_sec_open(r, ct__job_sec_get(top, "optimizer", path), "optimizer", optimizer_keys,
                     ct__job_key_line(top, "optimizer"), &s);
    ct__job_sec_name(&s, "type", optimizer_names, "optimizer", &type);
    ct__job_optimizer_defaults(o, (ct_optimizer_type)type);
    check_optimizer_keys(&s, o->type);
    ct__job_sec_float(&s, "learning_rate", CT__JOB_POSITIVE, &o->learning_rate);
    ct__job_sec_float(&s, "momentum", CT__JOB_UNIT_INTERVAL, &o->momentum);
    ct__job_sec_bool(&s, "nesterov", &o->nesterov);
    ct__job_sec_float(&s, "beta1", CT__JOB_UNIT_INTERVAL, &o->beta1);
    ct__job_sec_float(&s, "beta2", CT__JOB_UNIT_INTERVAL, &o->beta2);
    ct__job_sec_float(&s, "epsilon", CT__JOB_POSITIVE, &o->epsilon);
    ct__job_sec_float(&s, "rho", CT__JOB_UNIT_INTERVAL, &o->rho);
    ct__job_sec_float(&s, "weight_decay", CT__JOB_NON_NEGATIVE, &o->weight_decay);
    ct__job_sec_float(&s, "decay", CT__JOB_NON_NEGATIVE, &o->decay);
    ct__job_sec_float(&s, "clip_norm", CT__JOB_NON_NEGATIVE, &o->clip_norm);
    read_decay_exclude(&s, o);
    read_schedule(r, &s, o);
}
