/* A job's identity (ctrain/job.h): the canonical form of the fields a scope covers, one
 * "key=value" line each in a fixed order, and its hash. Every role that must agree with others
 * on a job computes its id here: the parameter-server roles (CT_JOB_ID_TRAINING, carried in every
 * envelope) and the data service's members (CT_JOB_ID_INPUT). Values are printed exactly
 * (integers in decimal, floats in C99 hex), never hashed as struct bytes, so padding, unused
 * array tails and the order fields sit in memory do not matter; where a field sits in its file
 * (the `line` members) is not the job. Knobs that change only speed (map and interleave
 * parallelism, prefetch depths, threads) are left out: a data worker tuned otherwise than its
 * trainer serves the same batches. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/hash.h"
#include "ctrain/job.h"

/* The canonical text as it is written: hashed piece by piece, and copied into buf when there is
 * one (truncated at cap, the length counted in full). */
typedef struct canon {
    char *buf;
    size_t cap, len;
    uint64_t hash;
} canon;

#define PIECE_MAX 4096 /* a piece holds at most two paths of CT_JOB_PATH_MAX and some numbers */

static void put(canon *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(canon *c, const char *fmt, ...) {
    char piece[PIECE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(piece, sizeof piece, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof piece ? (size_t)n : sizeof piece - 1;
    c->hash = ct__hash_bytes(c->hash, piece, len);
    if (c->buf && c->len < c->cap) {
        snprintf(c->buf + c->len, c->cap - c->len, "%s", piece);
    }
    c->len += len;
}

static void put_dims(canon *c, const char *key, const int64_t *dims, int rank) {
    put(c, "%s=[", key);
    for (int d = 0; d < rank; d++) {
        put(c, "%s%lld", d ? "," : "", (long long)dims[d]);
    }
    put(c, "]\n");
}

static void put_floats(canon *c, const char *key, const float *v, int n) {
    put(c, "%s=[", key);
    for (int k = 0; k < n; k++) {
        put(c, "%s%a", k ? "," : "", (double)v[k]);
    }
    put(c, "]\n");
}

static void put_layer(canon *c, int i, const ct_layer_spec *l) {
    put(c,
        "model.layers[%d]=%s units=%d filters=%d kernel=%dx%d strides=%dx%d pool=%dx%d "
        "same=%d act=%s bias=%d kinit=%d binit=%d rate=%a momentum=%a epsilon=%a in=%d "
        "out=%d\n",
        i, ct_layer_type_name(l->type), l->units, l->filters, l->kernel_size[0], l->kernel_size[1],
        l->strides[0], l->strides[1], l->pool_size[0], l->pool_size[1], l->padding_same,
        ct_activation_name(l->activation), l->use_bias, (int)l->kernel_init, (int)l->bias_init,
        (double)l->rate, (double)l->momentum, (double)l->epsilon, l->input_dim, l->output_dim);
    if (l->n_inputs || l->type == CT_LAYER_CONCAT) { /* the graph form: what it takes */
        put(c, "model.layers[%d].axis=%d inputs=", i, l->axis);
        for (int k = 0; k < l->n_inputs; k++) {
            put(c, "%s%d", k ? "," : "", l->inputs[k]);
        }
        put(c, "\n");
    }
    if (l->type == CT_LAYER_ATTENTION) {
        put(c, "model.layers[%d].heads=%d causal=%d%s\n", i, l->heads, l->causal,
            l->rotary ? " rotary=1" : ""); /* only then: older identities stay */
    }
    if (l->type == CT_LAYER_RESHAPE) {
        put_dims(c, "model.layers.reshape", l->shape, l->shape_rank);
    }
    if (l->type == CT_LAYER_TRANSPOSE) {
        for (int d = 0; d < l->shape_rank; d++) {
            put(c, "%s%d", d ? "," : "model.layers.perm=", l->perm[d]);
        }
        put(c, "\n");
    }
    if (l->type == CT_LAYER_SLICE) {
        put(c, "model.layers[%d].slice axis=%d begin=%lld size=%lld parts=%d part=%d\n", i, l->axis,
            (long long)l->begin, (long long)l->size, l->parts, l->part);
    }
    if (l->shares) { /* a line only then: older identities stay */
        put(c, "model.layers[%d].shares=%d\n", i, l->shares - 1);
    }
}

static void put_model(canon *c, const ct_model_spec *m) {
    put_dims(c, "model.input_shape", m->input_shape, m->input_rank);
    for (int k = 0; k < m->n_inputs; k++) { /* lines only then: older identities stay */
        put(c, "model.inputs[%d].name=%s\n", k, m->input_names[k]);
        put_dims(c, "model.inputs.shape", m->input_shapes[k], m->input_ranks[k]);
    }
    if (m->builder || m->builder_name[0]) { /* a line only then: older identities stay */
        put(c, "model.builder=%s\n",
            m->builder && m->builder->name ? m->builder->name : m->builder_name);
    }
    for (int i = 0; i < m->n_layers; i++) {
        put_layer(c, i, &m->layers[i]);
    }
    put(c, "loss=%d\nmetrics.accuracy=%d\n", (int)m->loss, m->metric_accuracy);
    if (m->metric_top_k) { /* absent otherwise: the ids of jobs without it stay as they were */
        put(c, "metrics.top_k=%d\n", m->metric_top_k);
    }
    if (m->label_smoothing > 0.0f) { /* a line only then: older identities stay */
        put(c, "loss.label_smoothing=%a\n", (double)m->label_smoothing);
    }
    if (m->has_ignore_index) {
        put(c, "loss.ignore_index=%d\n", (int)m->ignore_index);
    }
}

static void put_optimizer(canon *c, const ct_optimizer_spec *o) {
    put(c,
        "optimizer=%s lr=%a momentum=%a nesterov=%d beta1=%a beta2=%a epsilon=%a rho=%a "
        "weight_decay=%a decay=%a clip_norm=%a\n",
        ct_optimizer_type_name(o->type), (double)o->learning_rate, (double)o->momentum, o->nesterov,
        (double)o->beta1, (double)o->beta2, (double)o->epsilon, (double)o->rho,
        (double)o->weight_decay, (double)o->decay, (double)o->clip_norm);
    put(c,
        "optimizer.schedule=%d warmup=%lld step_size=%lld gamma=%a decay_steps=%lld "
        "min_lr=%a\n",
        (int)o->schedule, (long long)o->warmup_steps, (long long)o->step_size, (double)o->gamma,
        (long long)o->decay_steps, (double)o->min_lr);
    for (int k = 0; k < o->n_decay_exclude; k++) { /* lines only then: older identities stay */
        put(c, "optimizer.decay_exclude[%d]=%s\n", k, o->decay_exclude[k]);
    }
}

static void put_source(canon *c, const char *key, const ct_source_spec *s) {
    for (int f = 0; f < s->n_files; f++) {
        put(c, "%s.files[%d]=%s\n", key, f, s->files[f]);
    }
    for (int f = 0; f < s->n_features; f++) {
        const ct_job_feature *x = &s->features[f];
        char k[96];
        snprintf(k, sizeof k, "%s.features.%s", key, x->name);
        put(c, "%s.dtype=%d default=%d:%a\n", k, x->dtype, x->has_default, x->default_value);
        put_dims(c, k, x->dims, x->rank);
    }
    for (int f = 0; f < s->n_columns; f++) {
        const ct_job_column *x = &s->columns[f];
        put(c, "%s.columns[%d]=%s index=%d dtype=%d\n", key, f, x->name, x->index, x->dtype);
    }
    put(c,
        "%s variant=%d header=%d channels=%d range=%lld:%lld:%lld shuffle=%d interleave=%d "
        "cycle=%d block=%d\n",
        key, s->variant, s->header, s->channels, (long long)s->start, (long long)s->stop,
        (long long)s->step, s->shuffle, s->interleave, s->cycle_length, s->block_length);
    if (s->context > 0) { /* text_windows (a line only then: older identities stay) */
        put(c, "%s context=%lld stride=%lld split=%a:%a\n", key, (long long)s->context,
            (long long)s->stride, s->split[0], s->split[1]);
    }
}

static void put_map(canon *c, const char *key, const ct_map_stage_spec *m) {
    put(c,
        "%s.map=%s component=%d dtype=%d decode=%d factor=%a height=%lld width=%lld "
        "padding=%lld depth=%lld micros=%lld cpu=%d\n",
        key, ct_map_kind_name(m->kind), m->component, m->dtype, (int)m->decode, m->factor,
        (long long)m->height, (long long)m->width, (long long)m->padding, (long long)m->depth,
        (long long)m->micros, m->cpu);
    char k[160];
    snprintf(k, sizeof k, "%s.mean", key);
    put_floats(c, k, m->mean, m->n_channels);
    snprintf(k, sizeof k, "%s.std", key);
    put_floats(c, k, m->std, m->n_channels);
}

static void put_stage(canon *c, const char *key, int i, const ct_stage_spec *s) {
    char k[96];
    snprintf(k, sizeof k, "%s.pipeline[%d]", key, i);
    /* a prefetch's depth only changes speed */
    long long count = s->kind == CT_STAGE_PREFETCH ? 0 : (long long)s->count;
    put(c, "%s=%s count=%lld index=%lld drop=%d pad=%a seed=%d:%llu reshuffle=%d path=%s\n", k,
        ct_stage_kind_name(s->kind), count, (long long)s->index, s->drop_remainder, s->pad_value,
        s->has_seed, (unsigned long long)s->seed, s->reshuffle, s->path);
    if (s->kind == CT_STAGE_MAP) {
        put_map(c, k, &s->map);
    }
    if (s->kind == CT_STAGE_FILTER) {
        const ct_filter_stage_spec *f = &s->filter;
        put(c, "%s.filter component=%d value=%d:%a:%a length=%d:%lld:%lld keep=%a labels=%d\n", k,
            f->component, f->has_value, f->min_value, f->max_value, f->has_length,
            (long long)f->min_length, (long long)f->max_length, f->keep, f->n_labels);
        for (int l = 0; l < f->n_labels; l++) {
            put(c, "%s.filter.labels[%d]=%d\n", k, l, (int)f->labels[l]);
        }
    }
}

static void put_data(canon *c, const char *key, const ct_data_spec *d) {
    put(c, "%s.format=%d images=%s labels=%s limit=%lld stages=%d\n", key, (int)d->format,
        d->images, d->labels, (long long)d->limit, d->n_stages);
    if (d->n_stages > 0) {
        put_source(c, key, &d->source);
    }
    for (int i = 1; i < d->n_stages; i++) {
        put_stage(c, key, i, &d->stages[i]);
    }
    if (d->n_stages > 0) { /* the source's kind */
        put(c, "%s.pipeline[0]=%s\n", key, ct_stage_kind_name(d->stages[0].kind));
    }
}

/* What every batch depends on: the data service's members share a pool by it, so that an
 * evaluator and a trainer with other checkpoint, log or optimizer settings share one. */
static void put_input(canon *c, const ct_job *job) {
    put(c, "seed=%llu\n", (unsigned long long)job->seed);
    put_dims(c, "model.input_shape", job->model.input_shape, job->model.input_rank);
    put_data(c, "data.train", &job->train_data);
    if (job->has_eval_data) {
        put_data(c, "data.eval", &job->eval_data);
    }
    put(c,
        "train.batch_size=%d global_batch_size=%d eval_batch_size=%d shuffle=%d epochs=%d "
        "max_steps=%lld\n",
        job->train.batch_size, job->train.global_batch_size, job->train.eval_batch_size,
        job->train.shuffle, job->train.epochs, (long long)job->train.max_steps);
    put(c, "data.service.mode=%d split_steps=%lld\n", (int)job->data_service.mode,
        (long long)job->data_service.split_steps);
}

/* The training data's order: what a checkpoint's input position counts in. Not the batch: a run
 * may resume with another global batch at the same example. */
static void put_pipeline(canon *c, const ct_job *job) {
    put(c, "seed=%llu\n", (unsigned long long)job->seed);
    put_dims(c, "model.input_shape", job->model.input_shape, job->model.input_rank);
    put_data(c, "data.train", &job->train_data);
    put(c, "train.shuffle=%d\n", job->train.shuffle);
}

/* What every role of a parameter-server job must agree on: the model and its initial values,
 * the optimizer the servers run, the steps and batches the chief hands out, the strategy's
 * rules, and when the chief snapshots the servers. */
static void put_training(canon *c, const ct_job *job) {
    put(c, "seed=%llu\n", (unsigned long long)job->seed);
    put_model(c, &job->model);
    put_optimizer(c, &job->optimizer);
    put(c,
        "train.epochs=%d batch_size=%d global_batch_size=%d shuffle=%d max_steps=%lld "
        "data.train.limit=%lld invariant=%d:%d\n",
        job->train.epochs, job->train.batch_size, job->train.global_batch_size, job->train.shuffle,
        (long long)job->train.max_steps, (long long)job->train_data.limit, job->train.invariant,
        job->train.invariant_chunks);
    if (job->train.accumulation > 1) { /* a line only then: older identities stay */
        put(c, "train.gradient_accumulation=%d\n", job->train.accumulation);
    }
    put(c, "strategy.mode=%s backup_workers=%d staleness=%d:%d max_shard_bytes=%lld\n",
        job->ps.async ? "async" : "sync", job->ps.backup_workers, job->ps.staleness_policy,
        job->ps.staleness_max, (long long)job->ps.max_shard_bytes);
    put(c, "checkpoint.every_steps=%lld\n", (long long)job->checkpoint.every_steps);
}

static uint64_t write_canonical(const ct_job *job, ct_job_id_scope scope, canon *c) {
    c->hash = 0x63747261696e4a4fULL;
    if (c->buf && c->cap > 0) {
        c->buf[0] = '\0';
    }
    static const char *const names[] = {"?", "input", "training", "pipeline"};
    put(c, "ctrain job id 1, scope %s\n", names[scope >= 1 && scope <= 3 ? scope : 0]);
    if (scope == CT_JOB_ID_INPUT) {
        put_input(c, job);
    } else if (scope == CT_JOB_ID_PIPELINE) {
        put_pipeline(c, job);
    } else {
        put_training(c, job);
    }
    return c->hash ? c->hash : 1; /* 0 means "any job" to the wire decoder */
}

size_t ct_job_canonical(const ct_job *job, ct_job_id_scope scope, char *buf, size_t cap) {
    canon c = {.buf = buf, .cap = cap};
    write_canonical(job, scope, &c);
    return c.len;
}

uint64_t ct_job_id(const ct_job *job, ct_job_id_scope scope) {
    canon c = {0};
    return write_canonical(job, scope, &c);
}
