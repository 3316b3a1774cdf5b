/* The cases of kernel_parity.cpp (included there, after its helpers): each builds random inputs,
 * runs the CUDA kernel and the CPU twin, and compares. */
#ifndef CTRAIN_TESTS_PARITY_CASES_H
#define CTRAIN_TESTS_PARITY_CASES_H

/* Inputs where an op is defined: positive for log, sqrt, rsqrt and pow's base. */
static bool positive_input(int op) {
    return op == CT_OP_LOG || op == CT_OP_SQRT || op == CT_OP_RSQRT || op == CT_OP_POW ||
           op == CT_OP_LOG_GRAD || op == CT_OP_SQRT_GRAD || op == CT_OP_RSQRT_GRAD;
}

static void unary_case(int op, const char *op_name, int64_t n) {
    char name[96];
    snprintf(name, sizeof name, "unary %s n=%lld", op_name, (long long)n);
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = positive_input(op) ? randoms(n, 0.05f, 4.0f) : randoms(n, -4.0f, 4.0f);
    for (size_t i = 0; i < x.size() && i < 3; i++) {
        x[i] = (float)i - 1.0f; /* -1, 0, 1: the branch points of step, relu, abs */
        x[i] = positive_input(op) ? x[i] + 2.0f : x[i];
    }
    ct_attrs attrs = {};
    attrs.f[0] = 0.37f;
    cpu_twin cpu;
    std::vector<float> want = cpu.read(cpu.add((ct_op)op, {cpu.constant({n}, x.data())}, attrs));
    dev_vec<float> dx(x), dout((size_t)n);
    launched(name, ct_cuda_unary(nullptr, op, attrs.f[0], dx.p, dout.p, n));
    compare(name, dout.host(), want);
}

/* The broadcast of a and b as the kernels take it (numpy's rules; shapes are compatible). */
static ct_cuda_broadcast broadcast_of(const std::vector<int64_t> &a,
                                      const std::vector<int64_t> &b) {
    ct_cuda_broadcast s = {};
    s.rank = (int)(a.size() > b.size() ? a.size() : b.size());
    int64_t sa = 1, sb = 1;
    for (int k = s.rank - 1; k >= 0; k--) {
        int ka = k - (s.rank - (int)a.size()), kb = k - (s.rank - (int)b.size());
        int64_t da = ka >= 0 ? a[(size_t)ka] : 1, db = kb >= 0 ? b[(size_t)kb] : 1;
        s.dims[k] = da > db ? da : db;
        s.stride_a[k] = da == 1 ? 0 : sa;
        s.stride_b[k] = db == 1 ? 0 : sb;
        sa *= da;
        sb *= db;
    }
    return s;
}

static void binary_case(int op, const char *op_name, const std::vector<int64_t> &a_dims,
                        const std::vector<int64_t> &b_dims) {
    char name[128], shapes[64] = "";
    for (int side = 0; side < 2; side++) {
        const std::vector<int64_t> &d = side ? b_dims : a_dims;
        size_t at = strlen(shapes);
        snprintf(shapes + at, sizeof shapes - at, "%s[", side ? " x " : "");
        for (size_t k = 0; k < d.size(); k++) {
            at = strlen(shapes);
            snprintf(shapes + at, sizeof shapes - at, "%s%lld", k ? "," : "", (long long)d[k]);
        }
        at = strlen(shapes);
        snprintf(shapes + at, sizeof shapes - at, "]");
    }
    snprintf(name, sizeof name, "binary %s %s", op_name, shapes);
    if (!wanted(name)) {
        return;
    }
    float lo = positive_input(op) ? 0.05f : -3.0f;
    std::vector<float> a = randoms(numel(a_dims), op == CT_OP_POW ? 0.05f : -3.0f, 3.0f);
    std::vector<float> b = randoms(numel(b_dims), lo, 3.0f);
    cpu_twin cpu;
    int ia = cpu.constant(a_dims, a.data()), ib = cpu.constant(b_dims, b.data());
    std::vector<float> want = cpu.read(cpu.add((ct_op)op, {ia, ib}, ct_attrs{}));
    ct_cuda_broadcast s = broadcast_of(a_dims, b_dims);
    dev_vec<float> da(a), db(b), dout(want.size());
    launched(name, ct_cuda_binary(nullptr, op, da.p, db.p, dout.p, &s));
    compare(name, dout.host(), want);
}

/* The cast op: f32 to `to` (bf16 or f16) and back, on the CPU twin and by ct_cuda_cast, over
 * fp16's range (compare() takes no Inf; the unit tests check overflow), its subnormals and a
 * tie. */
static void cast_case(ct_dtype to, int64_t n) {
    char name[96];
    snprintf(name, sizeof name, "cast f32 -> %s -> f32 n=%lld", ct_dtype_name(to), (long long)n);
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = randoms(n, -65000.0f, 65000.0f);
    for (size_t i = 0; i < x.size(); i += 3) {
        x[i] *= 1e-9f; /* fp16's subnormals and below */
    }
    x[0] = 2049.0f; /* fp16: a tie, to the even 2048 */
    cpu_twin cpu;
    ct_attrs there = {}, back = {};
    there.i[0] = to;
    back.i[0] = CT_F32;
    int half = cpu.add(CT_OP_CAST, {cpu.constant({n}, x.data())}, there);
    std::vector<float> want = cpu.read(cpu.add(CT_OP_CAST, {half}, back));
    dev_vec<float> dx(x), dout((size_t)n);
    dev_vec<uint16_t> dhalf((size_t)n);
    launched(name, ct_cuda_cast(nullptr, CT_F32, to, dx.p, dhalf.p, n));
    launched(name, ct_cuda_cast(nullptr, to, CT_F32, dhalf.p, dout.p, n));
    compare(name, dout.host(), want);
}

static void elementwise_cases() {
    for (int64_t n : {1, 257, 5003}) {
        cast_case(CT_BF16, n);
        cast_case(CT_F16, n);
    }
#define CT__PARITY_EWISE(e, arity, EXPR)                                                           \
    if (arity == 1) {                                                                              \
        for (int64_t n : {1, 257, 5003}) {                                                         \
            unary_case(CT_OP_##e, #e, n);                                                          \
        }                                                                                          \
    } else if (CT_OP_##e <= CT_OP_MAXIMUM) { /* the broadcasting ones */                           \
        binary_case(CT_OP_##e, #e, {37, 65}, {37, 65});                                            \
        binary_case(CT_OP_##e, #e, {37, 65}, {1});                                                 \
        binary_case(CT_OP_##e, #e, {1}, {37, 65});                                                 \
        binary_case(CT_OP_##e, #e, {37, 65}, {65});                                                \
        binary_case(CT_OP_##e, #e, {7, 1, 65}, {1, 65});                                           \
        binary_case(CT_OP_##e, #e, {37, 1}, {37, 65});                                             \
        binary_case(CT_OP_##e, #e, {3, 1, 5}, {4, 1});                                             \
    } else {                                                                                       \
        binary_case(CT_OP_##e, #e, {33, 129}, {33, 129});                                          \
    }
    CT__EWISE_LIST(CT__PARITY_EWISE)
#undef CT__PARITY_EWISE
}

static void softmax_case(int log, int64_t rows, int64_t cols) {
    char name[96];
    snprintf(name, sizeof name, "%s [%lld,%lld]", log ? "log_softmax" : "softmax", (long long)rows,
             (long long)cols);
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = randoms(rows * cols, -6.0f, 6.0f), dy = randoms(rows * cols, -1, 1);
    cpu_twin cpu;
    int fwd = cpu.add(log ? CT_OP_LOG_SOFTMAX : CT_OP_SOFTMAX,
                      {cpu.constant({rows, cols}, x.data())}, ct_attrs{});
    std::vector<float> y = cpu.read(fwd);
    int grad = cpu.add(log ? CT_OP_LOG_SOFTMAX_GRAD : CT_OP_SOFTMAX_GRAD,
                       {cpu.constant({rows, cols}, dy.data()), fwd}, ct_attrs{});
    dev_vec<float> dx(x), dyv(dy), dyo(y), out(x.size()), dgrad(x.size());
    launched(name, ct_cuda_softmax(nullptr, log, dx.p, out.p, rows, cols));
    /* log-softmax is x - logsumexp: near 0 it cancels, so it is held to the row's scale */
    compare(name, out.host(), y, 1e-5, log ? 0.05 : 1e-3);
    char gname[112];
    snprintf(gname, sizeof gname, "%s grad", name);
    launched(gname, ct_cuda_softmax_grad(nullptr, log, dyv.p, dyo.p, dgrad.p, rows, cols));
    compare(gname, dgrad.host(), cpu.read(grad), 1e-4, 0.05); /* a row sum that cancels */
}

static void xent_case(int64_t rows, int64_t cols, float smoothing, int ignore,
                      int64_t fixed_batch) {
    char name[128];
    snprintf(name, sizeof name, "softmax_xent [%lld,%lld] smoothing=%g ignore=%d batch=%lld",
             (long long)rows, (long long)cols, smoothing, ignore, (long long)fixed_batch);
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = randoms(rows * cols, -5.0f, 5.0f);
    std::vector<int32_t> labels((size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        labels[(size_t)r] = (ignore && r % 3 == 1) ? -100 : (int32_t)((r * 7919) % cols);
    }
    float dloss = 1.7f;
    ct_cuda_xent o = {rows, cols, smoothing, ignore, -100};
    cpu_twin cpu;
    ct_xent_options opt = {smoothing, ignore, -100};
    int fwd = ct_softmax_xent_ex(cpu.g, cpu.constant({rows, cols}, x.data()),
                                 cpu.constant({rows}, labels.data(), CT_I32), &opt);
    ct_attrs ga = {};
    ga.i[0] = fixed_batch;
    int grad = cpu.add(CT_OP_SOFTMAX_XENT_GRAD,
                       {cpu.constant({}, &dloss), fwd, ct_graph_node(cpu.g, fwd)->in[1]}, ga);
    dev_vec<float> dx(x), probs(x.size()), loss(1), ddl(std::vector<float>{dloss}), dgrad(x.size());
    dev_vec<int32_t> dlab(labels);
    dev_vec<char> scratch((size_t)ct_cuda_xent_scratch_bytes(rows));
    launched(name, ct_cuda_softmax_xent(nullptr, &o, dx.p, dlab.p, probs.p, loss.p, scratch.p));
    compare(name, loss.host(), cpu.read(fwd));
    char sub[160];
    snprintf(sub, sizeof sub, "%s probs", name);
    compare(sub, probs.host(), cpu.read_aux(fwd));
    snprintf(sub, sizeof sub, "%s grad", name);
    launched(sub, ct_cuda_softmax_xent_grad(nullptr, &o, ddl.p, probs.p, dlab.p, fixed_batch,
                                            dgrad.p, scratch.p));
    compare(sub, dgrad.host(), cpu.read(grad));
}

static void softmax_cases() {
    const int64_t shapes[][2] = {{1, 1}, {5, 7}, {64, 33}, {3, 1000}, {2, 1025}};
    for (const auto &s : shapes) {
        softmax_case(0, s[0], s[1]);
        softmax_case(1, s[0], s[1]);
    }
    xent_case(64, 10, 0.0f, 0, 0);
    xent_case(5, 1000, 0.1f, 0, 0);
    xent_case(37, 33, 0.0f, 1, 0);
    xent_case(37, 33, 0.1f, 1, 128);
    xent_case(1, 1, 0.0f, 0, 0);
}

/* The optimizer settings the cases use (Keras's defaults, a learning rate of 0.01). */
static ct_optimizer_spec spec_of(ct_optimizer_type type, float momentum, float weight_decay) {
    ct_optimizer_spec spec = {};
    spec.type = type;
    spec.learning_rate = 0.01f;
    spec.momentum = momentum;
    spec.beta1 = 0.9f;
    spec.beta2 = 0.999f;
    spec.epsilon = 1e-7f;
    spec.rho = 0.9f;
    spec.weight_decay = type == CT_OPT_ADAMW ? weight_decay : 0.0f;
    return spec;
}

static void optimizer_case(ct_optimizer_type type, float momentum, int nesterov, int64_t n) {
    char name[128];
    snprintf(name, sizeof name, "optimizer %s momentum=%g nesterov=%d n=%lld",
             ct_optimizer_type_name(type), momentum, nesterov, (long long)n);
    if (!wanted(name)) {
        return;
    }
    ct_optimizer_spec spec = spec_of(type, momentum, 0.01f);
    spec.nesterov = nesterov;
    ct_params params;
    ct_params_init(&params);
    ct_shape shape = ct_shape_make(1, &n);
    ct_err err;
    ct_optimizer *o = nullptr;
    if (ct_params_declare(&params, "w", &shape, 1, CT_INIT_ZEROS, n, n) < 0 ||
        ct_params_allocate(&params, 1, &err) != CT_OK ||
        ct_optimizer_create(&spec, &params, &o, &err) != CT_OK) {
        fprintf(stderr, "kernel_parity: the optimizer: %s\n", err.msg);
        exit(1);
    }
    std::vector<float> w = randoms(n, -1, 1), g = randoms(n, -2, 2), slot[2];
    for (int k = 0; k < 2; k++) { /* slots as after some steps: v >= 0 */
        slot[k] = randoms(n, k ? 0.0f : -0.1f, 0.1f);
        if (k < ct_optimizer_slot_count(o)) {
            memcpy(ct_optimizer_slot(o, k), slot[k].data(), (size_t)n * sizeof(float));
        }
    }
    const int64_t step = 3, total = 100;
    const float clip = 0.5f;
    ct_cuda_update u = {};
    ct_optimizer_constants k;
    ct_optimizer_constants_at(o, step, total, &k);
    int64_t run = n;
    u = ct_cuda_update{(int)type,    k.lr,        clip,
                       momentum,     spec.beta1,  spec.beta2,
                       spec.epsilon, spec.rho,    ct_optimizer_decay_at(o, k.lr, 0, &run),
                       nesterov,     k.step_size, k.c2};
    dev_vec<float> dw(w), dg(g), d0(slot[0]), d1(slot[1]),
        partial((size_t)ct_cuda_optimizer_blocks(n)), g2(1);
    std::vector<float> want_w = w;
    float want_g2 = ct_optimizer_update_span(o, want_w.data(), g.data(), 0, n, step, total, clip);
    launched(name,
             ct_cuda_optimizer_update(nullptr, &u, dw.p, dg.p, d0.p, d1.p, n, partial.p, g2.p));
    compare(name, dw.host(), want_w);
    for (int s = 0; s < ct_optimizer_slot_count(o); s++) {
        char sub[160];
        snprintf(sub, sizeof sub, "%s slot %d", name, s);
        std::vector<float> want_s(ct_optimizer_slot(o, s), ct_optimizer_slot(o, s) + n);
        compare(sub, (s ? d1 : d0).host(), want_s);
    }
    char sub[160];
    snprintf(sub, sizeof sub, "%s sum g^2", name);
    compare(sub, g2.host(), std::vector<float>{want_g2}, 1e-4);
    ct_optimizer_destroy(o);
    ct_params_finish(&params);
}

static void optimizer_cases() {
    for (int64_t n : {1, 1000, 70001}) {
        optimizer_case(CT_OPT_SGD, 0.0f, 0, n);
        optimizer_case(CT_OPT_SGD, 0.9f, 0, n);
        optimizer_case(CT_OPT_SGD, 0.9f, 1, n);
        optimizer_case(CT_OPT_ADAM, 0.0f, 0, n);
        optimizer_case(CT_OPT_ADAMW, 0.0f, 0, n);
        optimizer_case(CT_OPT_RMSPROP, 0.0f, 0, n);
        optimizer_case(CT_OPT_RMSPROP, 0.9f, 0, n);
    }
}

#include "parity_layers.h"

static void reduce_case(int op, const std::vector<int64_t> &dims, unsigned mask) {
    static const ct_op ops[] = {CT_OP_SUM, CT_OP_MEAN, CT_OP_MAX};
    char name[96];
    snprintf(name, sizeof name, "%s mask=%u of %zu dims (%lld elements)", ct_op_name(ops[op]), mask,
             dims.size(), (long long)numel(dims));
    if (!wanted(name)) {
        return;
    }
    /* sums of positive terms: no cancellation, so another order stays within the tolerance */
    std::vector<float> x = randoms(numel(dims), op == 2 ? -2.0f : 0.0f, 2);
    cpu_twin cpu;
    ct_attrs ra = {};
    ra.i[0] = mask;
    std::vector<float> want = cpu.read(cpu.add(ops[op], {cpu.constant(dims, x.data())}, ra));
    ct_cuda_reduce_shape s;
    ct_cuda_reduce_plan((int)dims.size(), dims.data(), mask, &s);
    dev_vec<float> dx(x), out(want.size());
    launched(name, ct_cuda_reduce(nullptr, op, dx.p, &s, out.p, 0));
    compare(name, out.host(), want, op == 2 ? 0.0 : 1e-4);
}

/* SUM_TO, BROADCAST_TO and MAX_GRAD between a shape and a broadcast one. */
static void broadcast_case(const std::vector<int64_t> &big, const std::vector<int64_t> &small) {
    char name[96];
    snprintf(name, sizeof name, "sum_to broadcast_to max_grad %lld -> %lld", (long long)numel(big),
             (long long)numel(small));
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = randoms(numel(big), 0, 2), y = randoms(numel(small), 0, 2);
    for (size_t i = 0; i < x.size(); i += 3) { /* ties with the max for max_grad */
        x[i] = y[i % y.size()];
    }
    cpu_twin cpu;
    int ix = cpu.constant(big, x.data()), iy = cpu.constant(small, y.data());
    std::vector<float> want_sum = cpu.read(cpu.add(CT_OP_SUM_TO, {ix, iy}, {}));
    ct_attrs ba = {};
    ba.f[0] = 0.5f;
    std::vector<float> want_b = cpu.read(cpu.add(CT_OP_BROADCAST_TO, {iy, ix}, ba));
    ct_attrs ma = {};
    ma.i[0] = ct_cuda_sum_to_mask((int)big.size(), big.data(), (int)small.size(), small.data());
    ma.i[1] = 1;
    std::vector<float> want_g = cpu.read(cpu.add(CT_OP_MAX_GRAD, {iy, ix, iy}, ma));
    ct_cuda_reduce_shape s;
    ct_cuda_reduce_plan((int)big.size(), big.data(), (unsigned)ma.i[0], &s);
    ct_cuda_broadcast bs = broadcast_of(big, small);
    dev_vec<float> dx(x), dy(y), sum(want_sum.size()), bcast(x.size()), grad(x.size());
    launched(name, ct_cuda_reduce(nullptr, 0, dx.p, &s, sum.p, 0));
    compare(name, sum.host(), want_sum, 1e-4);
    launched(name, ct_cuda_broadcast_to(nullptr, dy.p, bcast.p, 0.5f, &bs));
    compare(name, bcast.host(), want_b, 0.0);
    launched(name, ct_cuda_max_grad(nullptr, dy.p, dx.p, dy.p, grad.p, &bs));
    compare(name, grad.host(), want_g, 0.0);
}

static void rows_case(int64_t rows, int64_t cols, int64_t k) {
    char name[96];
    snprintf(name, sizeof name, "argmax equal in_top_k [%lld,%lld] k=%lld", (long long)rows,
             (long long)cols, (long long)k);
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = randoms(rows * cols, -3, 3);
    std::vector<int32_t> labels((size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        labels[(size_t)r] = r % 11 == 4 ? -1 : (int32_t)((r * 13) % cols);
        x[(size_t)(r * cols + (r * 5) % cols)] = 3.0f; /* ties: the first index wins */
        x[(size_t)(r * cols + (r * 3) % cols)] = 3.0f;
        if (r % 9 == 2) {
            x[(size_t)(r * cols + (r % cols))] = NAN;
        }
    }
    cpu_twin cpu;
    int ix = cpu.constant({rows, cols}, x.data()), il = cpu.constant({rows}, labels.data(), CT_I32);
    int am = cpu.add(CT_OP_ARGMAX, {ix}, {});
    ct_attrs ka = {};
    ka.i[0] = k;
    std::vector<float> want_top = cpu.read(cpu.add(CT_OP_IN_TOP_K, {ix, il}, ka));
    std::vector<float> want_eq = cpu.read(cpu.add(CT_OP_EQUAL, {am, il}, {}));
    const ct_node *an = ct_graph_node(cpu.g, am);
    std::vector<float> want_am((size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        want_am[(size_t)r] = (float)((const int32_t *)an->out.data)[r];
    }
    dev_vec<float> dx(x), top((size_t)rows), eq((size_t)rows);
    dev_vec<int32_t> dl(labels), arg((size_t)rows);
    launched(name, ct_cuda_argmax(nullptr, dx.p, arg.p, rows, cols));
    std::vector<int32_t> got = arg.host();
    compare(name, std::vector<float>(got.begin(), got.end()), want_am, 0.0);
    launched(name, ct_cuda_equal(nullptr, arg.p, dl.p, eq.p, rows, 4));
    compare(name, eq.host(), want_eq, 0.0);
    launched(name, ct_cuda_in_top_k(nullptr, dx.p, dl.p, top.p, rows, cols, k));
    compare(name, top.host(), want_top, 0.0);
}

static void reduce_cases() {
    for (int op = 0; op < 3; op++) {
        reduce_case(op, {1000}, 1);
        reduce_case(op, {37, 65}, 1);
        reduce_case(op, {37, 65}, 2);
        reduce_case(op, {3, 5, 7, 9}, 0x5);
        reduce_case(op, {3, 5, 7, 9}, 0xf);
        reduce_case(op, {2, 70001}, 2);
    }
    broadcast_case({37, 65}, {65});
    broadcast_case({4, 5, 6}, {4, 1, 6});
    broadcast_case({4, 5, 6}, {1});
    rows_case(64, 10, 1);
    rows_case(33, 1000, 5);
}

static void transpose_case(const std::vector<int64_t> &dims, const std::vector<int> &perm) {
    char name[96];
    snprintf(name, sizeof name, "transpose %zu dims (%lld elements)", dims.size(),
             (long long)numel(dims));
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = randoms(numel(dims), -1, 1);
    cpu_twin cpu;
    std::vector<float> want =
        cpu.read(ct_transpose(cpu.g, cpu.constant(dims, x.data()), perm.data()));
    ct_cuda_copy_shape s;
    ct_cuda_transpose_plan((int)dims.size(), dims.data(), perm.data(), &s);
    dev_vec<float> dx(x), out(x.size());
    launched(name, ct_cuda_copy(nullptr, dx.p, out.p, 4, &s));
    compare(name, out.host(), want, 0.0);
}

/* [outer, d, inner] split into parts along axis 1: slice, concat and the slice gradient. */
static void window_case(int64_t outer, int64_t inner, const std::vector<int64_t> &parts) {
    char name[96];
    snprintf(name, sizeof name, "slice concat slice_grad outer=%lld inner=%lld parts=%zu",
             (long long)outer, (long long)inner, parts.size());
    if (!wanted(name)) {
        return;
    }
    int64_t d = 0;
    for (int64_t p : parts) {
        d += p;
    }
    std::vector<float> x = randoms(outer * d * inner, -1, 1);
    cpu_twin cpu;
    int ix = cpu.constant({outer, d, inner}, x.data());
    dev_vec<float> dx(x), joined(x.size()), grad(x.size());
    std::vector<int> pieces;
    int64_t begin = 0;
    for (int64_t p : parts) {
        int piece = ct_slice(cpu.g, ix, 1, begin, p);
        pieces.push_back(piece);
        dev_vec<float> out((size_t)(outer * p * inner));
        ct_cuda_copy_shape s;
        ct_cuda_window_plan(outer, p * inner, d * inner, begin * inner, p * inner, 0, &s);
        launched(name, ct_cuda_copy(nullptr, dx.p, out.p, 4, &s));
        compare(name, out.host(), cpu.read(piece), 0.0);
        /* concat: the piece back into its window of the whole */
        ct_cuda_window_plan(outer, p * inner, p * inner, 0, d * inner, begin * inner, &s);
        launched(name, ct_cuda_copy(nullptr, out.p, joined.p, 4, &s));
        begin += p;
    }
    int cat = ct_concat(cpu.g, (int)pieces.size(), pieces.data(), 1);
    compare(name, joined.host(), cpu.read(cat), 0.0);
    ct_attrs sa = ct_graph_node(cpu.g, pieces.back())->attrs; /* the last piece's gradient */
    int64_t p = parts.back();
    std::vector<float> dy = randoms(outer * p * inner, -1, 1);
    std::vector<float> want =
        cpu.read(cpu.add(CT_OP_SLICE_GRAD, {cpu.constant({outer, p, inner}, dy.data()), ix}, sa));
    dev_vec<float> ddy(dy);
    ct_cuda_copy_shape s;
    ct_cuda_window_plan(outer, p * inner, p * inner, 0, d * inner, (d - p) * inner, &s);
    launched(name, ct_cuda_fill(nullptr, grad.p, 0.0f, (int64_t)x.size()));
    launched(name, ct_cuda_copy(nullptr, ddy.p, grad.p, 4, &s));
    compare(name, grad.host(), want, 0.0);
}

static void copy_cases() {
    transpose_case({37, 65}, {1, 0});
    transpose_case({3, 5, 7}, {2, 0, 1});
    transpose_case({2, 3, 4, 5}, {0, 2, 1, 3});
    window_case(4, 3, {2, 5, 3});
    window_case(1, 1000, {1, 999});
    window_case(33, 1, {7, 7});
}

/* A FUSED node as the fuse pass makes them: relu(x + bias) * s, then GELU-tanh, then x * that
 * minus the bias: whole, row and scalar inputs; with sum, its total. */
static void fused_case(int64_t rows, int64_t cols, int sum) {
    char name[96];
    snprintf(name, sizeof name, "fused [%lld,%lld] sum=%d", (long long)rows, (long long)cols, sum);
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = randoms(rows * cols, -2, 2), bias = randoms(cols, -1, 1), sc = {0.7f};
    cpu_twin cpu;
    int in[3] = {cpu.constant({rows, cols}, x.data()), cpu.constant({cols}, bias.data()),
                 cpu.constant({}, sc.data())};
    ct__fused_prog prog = {};
    prog.n_in = 3;
    prog.sum = sum;
    prog.shape = ct_shape_make(2, std::vector<int64_t>{rows, cols}.data());
    prog.period[1] = cols;
    prog.period[2] = 1;
    const int16_t code[][3] = {{CT_OP_ADD, 0, 1},        {CT_OP_RELU, 3, -1}, {CT_OP_MUL, 4, 2},
                               {CT_OP_GELU_TANH, 5, -1}, {CT_OP_MUL, 0, 6},   {CT_OP_SUB, 7, 1}};
    ct_cuda_fused_prog g = {};
    g.n_in = 3;
    g.sum = sum;
    g.total = rows * cols;
    for (const auto &c : code) {
        prog.instr[prog.n_instr] = ct__fused_instr{c[0], c[1], c[2], 0.0f};
        g.instr[g.n_instr].op = c[0];
        g.instr[g.n_instr].a = c[1];
        g.instr[g.n_instr].b = c[2];
        g.instr[g.n_instr++].alpha = 0.0f;
        prog.n_instr++;
    }
    int fused = ct__graph_add_fused(cpu.g, in, &prog);
    dev_vec<float> dx(x), db(bias), ds(sc), out(sum ? 1 : x.size()),
        partial((size_t)ct_cuda_fused_blocks(rows * cols));
    g.in[0] = dx.p;
    g.in[1] = db.p;
    g.in[2] = ds.p;
    g.period[1] = cols;
    g.period[2] = 1;
    launched(name, ct_cuda_fused(nullptr, &g, out.p, partial.p));
    compare(name, out.host(), cpu.read(fused), sum ? 1e-4 : 1e-5);
}

static void fused_cases() {
    for (int sum = 0; sum < 2; sum++) {
        fused_case(1, 1, sum);
        fused_case(37, 65, sum);
        fused_case(300, 1001, sum);
    }
}

/* One training step of a model on a backend, eager or compiled (graph mode: every pass, the
 * fuse pass's FUSED nodes included): `build` adds the model and its loss on the parameters'
 * variables (in backend memory); returns the loss and the parameters' gradients, read back to
 * the host (empty when the graph failed: err says why). */
template <class F>
static std::vector<std::vector<float>>
model_step(ct_backend *be, const std::vector<std::vector<float>> &params,
           const std::vector<std::vector<int64_t>> &shapes, F build, int graph_mode, ct_err *err) {
    ct_graph *g = nullptr;
    std::vector<std::vector<float>> out;
    if (ct_graph_create(be, !graph_mode, &g, err) != CT_OK) {
        return out;
    }
    std::vector<void *> device;
    std::vector<int> vars;
    for (size_t k = 0; k < params.size(); k++) {
        size_t bytes = params[k].size() * sizeof(float);
        device.push_back(ct_backend_alloc(be, bytes));
        be->vt->copy(be, device.back(), params[k].data(), bytes);
        ct_shape s = ct_shape_make((int)shapes[k].size(), shapes[k].data());
        vars.push_back(ct_variable(g, &s, (float *)device.back(), "w"));
    }
    int loss = build(g, vars);
    std::vector<int> grads(vars.size());
    ct_status st =
        ct_graph_gradients(g, loss, -1, (int)vars.size(), vars.data(), grads.data(), err);
    for (int k = -1; st == CT_OK && k < (int)vars.size(); k++) {
        int id = k < 0 ? loss : grads[(size_t)k];
        std::vector<float> v((size_t)ct_tensor_numel(&ct_graph_node(g, id)->out));
        ct_graph_read(g, id, v.data(), v.size() * sizeof(float), err);
        out.push_back(v);
    }
    if (g) {
        ct_graph_destroy(g);
    }
    for (void *p : device) {
        ct_backend_free(be, p);
    }
    return out;
}

/* The step of `build` on the CPU and on the CUDA backend, eager and compiled: the loss and every
 * gradient. */
template <class F>
static void backend_case(const char *name, const std::vector<std::vector<int64_t>> &shapes,
                         F build) {
    if (!wanted(name)) {
        return;
    }
    std::vector<std::vector<float>> params;
    for (const auto &s : shapes) {
        params.push_back(randoms(numel(s), -0.5f, 0.5f));
    }
    ct_backend *cpu = nullptr, *cuda = nullptr;
    ct_err err = {}, cerr = {};
    if (ct_backend_cpu_create(1, &cpu, &err) != CT_OK ||
        ct_backend_cuda_create(0, &cuda, &err) != CT_OK) {
        printf("FAIL %s: %s\n", name, err.msg);
        failures++;
        ct_backend_destroy(cpu);
        return;
    }
    for (int graph_mode = 0; graph_mode < 2; graph_mode++) {
        auto want = model_step(cpu, params, shapes, build, graph_mode, &cerr);
        auto got = model_step(cuda, params, shapes, build, graph_mode, &err);
        cases++;
        if (got.size() != want.size() || want.empty()) {
            printf("FAIL %s (%s): %zu of %zu outputs (CUDA: %s; CPU: %s)\n", name,
                   graph_mode ? "graph mode" : "eager", got.size(), want.size(), err.msg, cerr.msg);
            failures++;
        }
        for (size_t k = 0; k < got.size() && k < want.size(); k++) {
            char sub[192];
            snprintf(sub, sizeof sub, "%s, %s: %s", name, graph_mode ? "graph mode" : "eager",
                     k ? "gradient" : "loss");
            /* a whole step's gradients: sums over the batch that cancel to near 0 (a bias's)
             * are held to their vector's scale */
            compare(sub, got[k], want[k], 1e-4, 0.05);
        }
    }
    ct_backend_cuda_destroy(cuda);
    ct_backend_destroy(cpu);
}

static void backend_cases() {
    std::vector<float> x = randoms(16 * 20, -1, 1), img = randoms(4 * 8 * 8 * 3, -1, 1);
    std::vector<int32_t> labels(16), ids(12), tokens(12);
    for (int i = 0; i < 16; i++) {
        labels[(size_t)i] = (i * 7) % 10;
    }
    for (int i = 0; i < 12; i++) {
        ids[(size_t)i] = (i * 5) % 20;
        tokens[(size_t)i] = (i * 3 + 1) % 20;
    }
    auto constant = [](ct_graph *g, std::vector<int64_t> dims, const void *data, ct_dtype t) {
        ct_shape s = ct_shape_make((int)dims.size(), dims.data());
        return ct_constant(g, t, &s, data);
    };
    backend_case("backend: MLP step (dense, relu, softmax cross-entropy)",
                 {{20, 32}, {32}, {32, 10}, {10}}, [&](ct_graph *g, const std::vector<int> &v) {
                     int ix = constant(g, {16, 20}, x.data(), CT_F32);
                     int h = ct_relu(g, ct_add(g, ct_matmul(g, ix, v[0], 0, 0), v[1]));
                     return ct_softmax_xent(g, ct_add(g, ct_matmul(g, h, v[2], 0, 0), v[3]),
                                            constant(g, {16}, labels.data(), CT_I32));
                 });
    backend_case("backend: CNN step (conv, relu, max pool, dense)", {{3, 3, 3, 4}, {64, 10}, {10}},
                 [&](ct_graph *g, const std::vector<int> &v) {
                     int c = ct_relu(g, ct_conv2d(g, constant(g, {4, 8, 8, 3}, img.data(), CT_F32),
                                                  v[0], 1, 1, 1));
                     int64_t flat[2] = {4, 64};
                     int p = ct_reshape(g, ct_max_pool(g, c, 2, 2, 2, 2, 1), 2, flat);
                     int logits = ct_add(g, ct_matmul(g, p, v[1], 0, 0), v[2]);
                     return ct_softmax_xent(g, logits, constant(g, {4}, labels.data(), CT_I32));
                 });
    backend_case("backend: attention step (embedding, layer norm, causal attention)",
                 {{20, 16}, {16}, {16}, {16, 20}}, [&](ct_graph *g, const std::vector<int> &v) {
                     int e = ct_embedding(g, v[0], constant(g, {2, 6}, ids.data(), CT_I32));
                     int n = ct_layer_norm(g, e, v[1], v[2], 1e-5f);
                     int a = ct_attention(g, n, n, n, 2, 1, 0.35f);
                     int64_t flat[2] = {12, 16};
                     int logits = ct_matmul(g, ct_reshape(g, ct_add(g, a, e), 2, flat), v[3], 0, 0);
                     return ct_softmax_xent(g, logits, constant(g, {12}, tokens.data(), CT_I32));
                 });
    std::vector<float> mask = randoms(16 * 32, 0, 1);
    for (auto &m : mask) {
        m = m > 0.5f ? 1.0f : 0.0f;
    }
    backend_case(
        "backend: step with slice, concat and where", {{20, 32}, {32, 10}},
        [&](ct_graph *g, const std::vector<int> &v) {
            int h = ct_tanh(g, ct_matmul(g, constant(g, {16, 20}, x.data(), CT_F32), v[0], 0, 0));
            int halves[2] = {ct_slice(g, h, 1, 16, 16), ct_slice(g, h, 1, 0, 16)};
            int swapped = ct_concat(g, 2, halves, 1);
            int w = ct_where(g, constant(g, {16, 32}, mask.data(), CT_F32), swapped,
                             ct_scale(g, h, 0.5f));
            return ct_softmax_xent(g, ct_matmul(g, w, v[1], 0, 0),
                                   constant(g, {16}, labels.data(), CT_I32));
        });
    std::string missing;
    for (int op = 0; op < CT_OP_COUNT; op++) {
        missing += ct_backend_cuda_has_kernel(op) ? "" : std::string(" ") + ct_op_name((ct_op)op);
    }
    cases++;
    if (!missing.empty()) {
        printf("FAIL backend: ops without a CUDA kernel:%s\n", missing.c_str());
        failures++;
    } else {
        printf("ok   backend: every op has a CUDA kernel\n");
    }
}

#ifdef CT_CUDA_STAND_IN /* the stand-in counts cudaMalloc calls */
/* A compiled training graph run again calls cudaMalloc no more: the backend's scratch comes from
 * its cache after the first run. */
static void steady_state_case() {
    const char *name = "backend: a compiled step run again allocates no device memory";
    if (!wanted(name)) {
        return;
    }
    ct_backend *cuda = nullptr;
    ct_graph *g = nullptr, *compiled = nullptr;
    ct_err err;
    std::vector<float> x = randoms(16 * 20, -1, 1), w1 = randoms(20 * 32, -1, 1),
                       w2 = randoms(32 * 10, -1, 1);
    std::vector<int32_t> labels(16, 3);
    ct_backend_cuda_create(0, &cuda, &err);
    ct_graph_create(cuda, 0, &g, &err);
    ct_shape xs = ct_shape_make(2, std::vector<int64_t>{16, 20}.data());
    ct_shape s1 = ct_shape_make(2, std::vector<int64_t>{20, 32}.data());
    ct_shape s2 = ct_shape_make(2, std::vector<int64_t>{32, 10}.data());
    ct_shape ls = ct_shape_make(1, std::vector<int64_t>{16}.data());
    int v[2] = {ct_variable(g, &s1, w1.data(), "w1"), ct_variable(g, &s2, w2.data(), "w2")};
    int h = ct_relu(g, ct_matmul(g, ct_constant(g, CT_F32, &xs, x.data()), v[0], 0, 0));
    int keep[3] = {
        ct_softmax_xent(g, ct_matmul(g, h, v[1], 0, 0), ct_constant(g, CT_I32, &ls, labels.data())),
        -1, -1};
    ct_graph_gradients(g, keep[0], -1, 2, v, keep + 1, &err);
    ct_graph_options o = ct_graph_default_options();
    o.threads = 1;
    ct_status st = ct_graph_compile(g, &o, 3, keep, &compiled, &err);
    long calls[3] = {0, 0, 0};
    for (int run = 0; st == CT_OK && run < 3; run++) {
        st = ct_graph_run(compiled, 0, ct_graph_size(compiled), &err);
        calls[run] = ct_stand_in::malloc_calls.load();
    }
    cases++;
    if (st != CT_OK || calls[2] != calls[0]) {
        printf("FAIL %s: %s; cudaMalloc calls after runs 1-3: %ld %ld %ld\n", name, err.msg,
               calls[0], calls[1], calls[2]);
        failures++;
    } else {
        printf("ok   %s (cudaMalloc calls after runs 1-3: %ld %ld %ld)\n", name, calls[0], calls[1],
               calls[2]);
    }
    if (compiled) {
        ct_graph_destroy(compiled);
    }
    ct_graph_destroy(g);
    ct_backend_cuda_destroy(cuda);
}
#endif

#ifdef CT_CUDA_STAND_IN /* the parameters live in host memory: the stand-in's device memory */
/* APPLY_OPTIMIZER on the CUDA backend against ct_optimizer_apply: two parameters (AdamW keeps
 * the one named "bias" from weight decay), global-norm clipping, after earlier steps' slots. */
static void apply_optimizer_case(ct_optimizer_type type, float momentum, float clip_norm) {
    char name[128];
    snprintf(name, sizeof name, "backend: apply_optimizer %s momentum=%g clip_norm=%g",
             ct_optimizer_type_name(type), momentum, clip_norm);
    if (!wanted(name)) {
        return;
    }
    ct_optimizer_spec spec = spec_of(type, momentum, 0.05f);
    spec.clip_norm = clip_norm;
    spec.n_decay_exclude = 1;
    snprintf(spec.decay_exclude[0], sizeof spec.decay_exclude[0], "bias");
    ct_params p[2];
    ct_optimizer *o[2] = {nullptr, nullptr};
    ct_err err;
    for (int k = 0; k < 2; k++) {
        ct_params_init(&p[k]);
        int64_t dims[2] = {1000, 37};
        ct_shape w = ct_shape_make(1, &dims[0]), b = ct_shape_make(1, &dims[1]);
        ct_params_declare(&p[k], "kernel", &w, 1, CT_INIT_GLOROT_UNIFORM, 10, 10);
        ct_params_declare(&p[k], "bias", &b, 1, CT_INIT_GLOROT_UNIFORM, 10, 10);
        ct_params_allocate(&p[k], 7, &err);
        ct_optimizer_create(&spec, &p[k], &o[k], &err);
    }
    std::vector<float> g = randoms(p[0].trainable_total, -2, 2);
    for (int k = 0; k < 2; k++) {
        memcpy(p[k].grad, g.data(), g.size() * sizeof(float));
        uint64_t saved = rng_state;
        rng_state = 12345; /* both optimizers' slots start alike, as after earlier steps */
        for (int slot = 0; slot < ct_optimizer_slot_count(o[k]); slot++) {
            std::vector<float> v = randoms(p[k].total, 0.0f, 0.1f);
            memcpy(ct_optimizer_slot(o[k], slot), v.data(), v.size() * sizeof(float));
        }
        rng_state = saved;
    }
    ct_optimizer_apply(o[0], &p[0], 3, 100, 0, &err);
    ct_backend *cuda = nullptr;
    ct_graph *gr = nullptr;
    ct_backend_cuda_create(0, &cuda, &err);
    ct_graph_create(cuda, 1, &gr, &err);
    ct_kctx *ctx = ct_graph_ctx(gr);
    ctx->optimizer = o[1];
    ctx->params = &p[1];
    ctx->step = 3;
    ctx->total_steps = 100;
    ct_apply_optimizer(gr);
    cases++;
    if (ct_graph_status(gr, &err) != CT_OK) {
        printf("FAIL %s: %s\n", name, err.msg);
        failures++;
    }
    compare(name, std::vector<float>(p[1].data, p[1].data + p[1].total),
            std::vector<float>(p[0].data, p[0].data + p[0].total));
    ct_graph_destroy(gr);
    ct_backend_cuda_destroy(cuda);
    for (int k = 0; k < 2; k++) {
        ct_optimizer_destroy(o[k]);
        ct_params_finish(&p[k]);
    }
}
#endif

#ifndef CT_CUDA_STAND_IN /* cuBLASLt runs only on a GPU */
const char *epilogue_name(int e) {
    static const char *names[] = {"none",          "bias",  "relu_bias", "gelu_bias",
                                  "gelu_aux_bias", "dgelu", "bgrad_b"};
    return names[e];
}

/* The CPU twin of a GEMM with epilogue e: MATMUL, then the ops the epilogue fuses. */
static void gemm_case(ct_cuda_blas *blas, int ta, int tb, int64_t m, int64_t n, int64_t k, int e) {
    char name[128];
    snprintf(name, sizeof name, "gemm %s%s [%lld,%lld,%lld] %s", ta ? "T" : "N", tb ? "T" : "N",
             (long long)m, (long long)n, (long long)k, epilogue_name(e));
    if (!wanted(name)) {
        return;
    }
    std::vector<float> a = randoms(m * k, -1, 1), b = randoms(k * n, -1, 1),
                       bias = randoms(n, -1, 1);
    std::vector<float> aux = randoms(m * n, -2, 2);
    cpu_twin cpu;
    ct_attrs mm = {};
    mm.i[0] = ta;
    mm.i[1] = tb;
    int ia = cpu.constant(ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, a.data());
    int ib = cpu.constant(tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, b.data());
    int y = cpu.add(CT_OP_MATMUL, {ia, ib}, mm), ibias = cpu.constant({n}, bias.data());
    int pre =
        e == CT_CUDA_EPI_NONE || e >= CT_CUDA_EPI_DGELU ? y : cpu.add(CT_OP_ADD, {y, ibias}, {});
    int out = e == CT_CUDA_EPI_RELU_BIAS ? cpu.add(CT_OP_RELU, {pre}, {})
              : e == CT_CUDA_EPI_GELU_BIAS || e == CT_CUDA_EPI_GELU_AUX_BIAS
                  ? cpu.add(CT_OP_GELU_TANH, {pre}, {})
              : e == CT_CUDA_EPI_DGELU
                  ? cpu.add(CT_OP_GELU_TANH_GRAD, {y, cpu.constant({m, n}, aux.data())}, {})
                  : pre;
    ct_cuda_gemm g = {ta, tb, m, n, k, ta ? m : k, tb ? k : n, n, 1.0f, 0.0f, e, nullptr, nullptr};
    dev_vec<float> da(a), db(b), dbias(bias), daux(aux), dc((size_t)(m * n));
    g.bias = dbias.p;
    g.aux = daux.p;
    launched(name, ct_cuda_gemm_run(blas, nullptr, &g, da.p, db.p, dc.p));
    compare(name, dc.host(), cpu.read(out), 1e-4); /* k products summed in another order */
    char sub[160];
    if (e == CT_CUDA_EPI_GELU_AUX_BIAS) {
        snprintf(sub, sizeof sub, "%s aux", name);
        compare(sub, daux.host(), cpu.read(pre), 1e-4);
    } else if (e == CT_CUDA_EPI_BGRAD_B) {
        snprintf(sub, sizeof sub, "%s bias gradient", name);
        ct_attrs sum = {};
        sum.i[0] = tb ? 2 : 1; /* op(b) summed over k */
        compare(sub, dbias.host(), cpu.read(cpu.add(CT_OP_SUM, {ib}, sum)), 1e-4);
    }
}

static void gemm_cases() {
    ct_cuda_blas *blas = nullptr;
    int rc = ct_cuda_blas_create(32u << 20, &blas);
    if (rc != 0) {
        printf("FAIL gemm: cuBLASLt: status %d\n", rc);
        failures++;
        return;
    }
    for (int e = CT_CUDA_EPI_NONE; e <= CT_CUDA_EPI_BGRAD_B; e++) {
        gemm_case(blas, 0, 0, 64, 128, 96, e);
        gemm_case(blas, 1, 0, 33, 40, 17, e == CT_CUDA_EPI_GELU_AUX_BIAS ? CT_CUDA_EPI_BIAS : e);
        gemm_case(blas, 0, 1, 256, 512, 768, e);
        gemm_case(blas, 1, 1, 7, 8, 1000, e);
    }
    ct_cuda_blas_destroy(blas);
}
#endif

static void run_all_cases() {
    elementwise_cases();
    softmax_cases();
    optimizer_cases();
    layer_cases();
    reduce_cases();
    copy_cases();
    pool_cases();
    batch_norm_cases();
    fused_cases();
    attention_cases();
    conv_cases();
    backend_cases();
#ifdef CT_CUDA_STAND_IN
    steady_state_case();
    apply_optimizer_case(CT_OPT_ADAMW, 0.0f, 0.5f);
    apply_optimizer_case(CT_OPT_SGD, 0.9f, 0.0f);
    apply_optimizer_case(CT_OPT_RMSPROP, 0.9f, 1.0f);
#endif
#ifndef CT_CUDA_STAND_IN
    gemm_cases();
#endif
}

#endif
