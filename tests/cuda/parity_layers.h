/* The layer kernels' cases of kernel_parity.cpp (included by parity_cases.h): norms, embedding,
 * dropout, pooling, batch norm, attention and convolution's im2col. */
#ifndef CTRAIN_TESTS_PARITY_LAYERS_H
#define CTRAIN_TESTS_PARITY_LAYERS_H

static void norm_case(int centered, int64_t rows, int64_t c) {
    char name[96];
    snprintf(name, sizeof name, "%s [%lld,%lld]", centered ? "layer_norm" : "rms_norm",
             (long long)rows, (long long)c);
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = randoms(rows * c, -3, 3), dy = randoms(rows * c, -1, 1);
    std::vector<float> gamma = randoms(c, 0.5f, 1.5f), beta = randoms(c, -1, 1);
    const float eps = 1e-5f;
    cpu_twin cpu;
    int ix = cpu.constant({rows, c}, x.data()), ig = cpu.constant({c}, gamma.data());
    int fwd = centered ? ct_layer_norm(cpu.g, ix, ig, cpu.constant({c}, beta.data()), eps)
                       : ct_rms_norm(cpu.g, ix, ig, eps);
    ct_attrs ga = {};
    ga.f[0] = eps;
    int grad = cpu.add(centered ? CT_OP_LAYER_NORM_GRAD : CT_OP_RMS_NORM_GRAD,
                       {cpu.constant({rows, c}, dy.data()), fwd, ix, ig}, ga);
    ct_cuda_norm_shape s = {rows, c, eps, centered};
    dev_vec<float> dx(x), dg(gamma), db(beta), y((size_t)(rows * c)),
        stats(cpu.read_aux(fwd).size());
    dev_vec<float> ddy(dy), dxo((size_t)(rows * c)), dgamma((size_t)c), dbeta((size_t)c);
    dev_vec<char> scratch((size_t)ct_cuda_norm_scratch_bytes(rows));
    launched(name, ct_cuda_norm(nullptr, &s, dx.p, dg.p, db.p, y.p, stats.p));
    compare(name, y.host(), cpu.read(fwd));
    char sub[128];
    snprintf(sub, sizeof sub, "%s stats", name);
    compare(sub, stats.host(), cpu.read_aux(fwd));
    snprintf(sub, sizeof sub, "%s grad", name);
    launched(sub, ct_cuda_norm_grad(nullptr, &s, ddy.p, dx.p, dg.p, dxo.p, dgamma.p, dbeta.p,
                                    scratch.p));
    compare(sub, dxo.host(), cpu.read(grad), 1e-4); /* row sums in another order, cancelling */
    std::vector<float> want = cpu.read_aux(grad), got = dgamma.host();
    if (centered) {
        std::vector<float> b = dbeta.host();
        got.insert(got.end(), b.begin(), b.end());
    }
    snprintf(sub, sizeof sub, "%s dgamma dbeta", name);
    compare(sub, got, want);
}

static void embedding_case(int64_t vocab, int64_t dim, int64_t count, int accumulate) {
    char name[96];
    snprintf(name, sizeof name, "embedding V=%lld D=%lld ids=%lld accumulate=%d", (long long)vocab,
             (long long)dim, (long long)count, accumulate);
    if (!wanted(name)) {
        return;
    }
    std::vector<float> table = randoms(vocab * dim, -1, 1), dy = randoms(count * dim, -1, 1);
    std::vector<float> start = randoms(vocab * dim, -1, 1);
    std::vector<int32_t> ids((size_t)count);
    for (int64_t i = 0; i < count; i++) { /* repeats, and ids outside [0, V) */
        ids[(size_t)i] = i % 17 == 5   ? (int32_t)vocab
                         : i % 19 == 3 ? -1
                                       : (int32_t)((i * 7) % vocab);
    }
    cpu_twin cpu;
    int it = cpu.constant({vocab, dim}, table.data()),
        ii = cpu.constant({count}, ids.data(), CT_I32);
    int fwd = cpu.add(CT_OP_EMBEDDING, {it, ii}, ct_attrs{});
    std::vector<float> want_grad = cpu.read(
        cpu.add(CT_OP_EMBEDDING_GRAD, {cpu.constant({count, dim}, dy.data()), ii, it}, {}));
    for (size_t k = 0; accumulate && k < want_grad.size(); k++) {
        want_grad[k] += start[k];
    }
    dev_vec<float> dt(table), ddy(dy), out((size_t)(count * dim)), dtable(start);
    dev_vec<int32_t> di(ids);
    launched(name, ct_cuda_embedding(nullptr, dt.p, di.p, out.p, count, vocab, dim));
    compare(name, out.host(), cpu.read(fwd), 0.0);
    char sub[128];
    snprintf(sub, sizeof sub, "%s grad", name);
    launched(sub,
             ct_cuda_embedding_grad(nullptr, ddy.p, di.p, dtable.p, count, vocab, dim, accumulate));
    compare(sub, dtable.host(), want_grad, accumulate ? 1e-6 : 0.0);
}

static void dropout_case(int64_t rows, int64_t cols, float rate) {
    char name[96];
    snprintf(name, sizeof name, "dropout [%lld,%lld] rate=%g", (long long)rows, (long long)cols,
             rate);
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = randoms(rows * cols, -2, 2), dy = randoms(rows * cols, -1, 1);
    cpu_twin cpu;
    ct_kctx *ctx = ct_graph_ctx(cpu.g);
    ctx->seed = 1234;
    ctx->step = 77;
    ctx->replica = 1;
    ctx->batch_offset = 3;
    int fwd = ct_dropout(cpu.g, cpu.constant({rows, cols}, x.data()), rate, 1);
    int grad = cpu.add(CT_OP_DROPOUT_GRAD, {cpu.constant({rows, cols}, dy.data()), fwd}, {});
    const ct_node *node = ct_graph_node(cpu.g, fwd);
    std::vector<float> want_mask((size_t)(rows * cols));
    for (size_t i = 0; i < want_mask.size(); i++) {
        want_mask[i] = ((const uint8_t *)node->aux.data)[i];
    }
    ct_cuda_dropout_args a = {
        rate, ctx->seed,
        ct_rng_stream(CT_RNG_PURPOSE_OP, ctx->step, ctx->replica, (uint32_t)(node->attrs.i[1] - 1)),
        (uint64_t)(ctx->batch_offset * cols)};
    dev_vec<float> dx(x), ddy(dy), out(x.size()), dgrad(x.size());
    dev_vec<uint8_t> mask(x.size());
    launched(name, ct_cuda_dropout(nullptr, &a, dx.p, out.p, mask.p, rows * cols));
    compare(name, out.host(), cpu.read(fwd), 0.0);
    std::vector<uint8_t> m = mask.host();
    char sub[128];
    snprintf(sub, sizeof sub, "%s mask", name);
    compare(sub, std::vector<float>(m.begin(), m.end()), want_mask, 0.0);
    snprintf(sub, sizeof sub, "%s grad", name);
    launched(sub, ct_cuda_dropout_grad(nullptr, rate, ddy.p, mask.p, dgrad.p, rows * cols));
    compare(sub, dgrad.host(), cpu.read(grad), 0.0);
}

static void layer_cases() {
    const int64_t shapes[][2] = {{1, 1}, {5, 7}, {37, 33}, {4, 1000}, {3, 1025}};
    for (const auto &s : shapes) {
        norm_case(1, s[0], s[1]);
        norm_case(0, s[0], s[1]);
    }
    embedding_case(50, 33, 200, 0);
    embedding_case(50, 33, 200, 1);
    embedding_case(1000, 8, 37, 0);
    dropout_case(64, 100, 0.1f);
    dropout_case(7, 333, 0.5f);
}

static void pool_case(int avg, int64_t h, int64_t w, int64_t win, int64_t stride, int same) {
    char name[96];
    snprintf(name, sizeof name, "%s 3x%lldx%lldx5 window=%lld stride=%lld same=%d",
             avg ? "avg_pool" : "max_pool", (long long)h, (long long)w, (long long)win,
             (long long)stride, same);
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = randoms(3 * h * w * 5, -2, 2);
    for (size_t i = 0; i < x.size(); i += 7) {
        x[i] = 1.0f; /* ties: the first cell wins */
    }
    cpu_twin cpu;
    int ix = cpu.constant({3, h, w, 5}, x.data());
    int fwd = avg ? ct_avg_pool(cpu.g, ix, (int)win, (int)win, (int)stride, (int)stride, same)
                  : ct_max_pool(cpu.g, ix, (int)win, (int)win, (int)stride, (int)stride, same);
    const ct_node *f = ct_graph_node(cpu.g, fwd);
    ct_cuda_pool g = {3,   h,   w,      5,      f->out.shape.dims[1], f->out.shape.dims[2],
                      win, win, stride, stride, f->attrs.i[5],        f->attrs.i[6]};
    int64_t outs = 3 * g.out_h * g.out_w * 5;
    std::vector<float> dy = randoms(outs, -1, 1);
    int grad = cpu.add(avg ? CT_OP_AVG_POOL_GRAD : CT_OP_MAX_POOL_GRAD,
                       {cpu.constant({3, g.out_h, g.out_w, 5}, dy.data()), fwd},
                       ct_graph_node(cpu.g, fwd)->attrs);
    dev_vec<float> dx(x), out((size_t)outs), ddy(dy), dgrad(x.size());
    dev_vec<int32_t> arg((size_t)outs);
    launched(name, ct_cuda_pool_forward(nullptr, &g, avg, dx.p, out.p, arg.p));
    compare(name, out.host(), cpu.read(fwd), avg ? 1e-6 : 0.0);
    char sub[128];
    snprintf(sub, sizeof sub, "%s grad", name);
    launched(sub, ct_cuda_pool_backward(nullptr, &g, avg, ddy.p, arg.p, dgrad.p));
    compare(sub, dgrad.host(), cpu.read(grad), avg ? 1e-6 : 0.0);
}

static void pool_cases() {
    for (int avg = 0; avg < 2; avg++) {
        pool_case(avg, 8, 8, 2, 2, 0);
        pool_case(avg, 7, 9, 3, 2, 1);
        pool_case(avg, 9, 7, 3, 1, 1);
        pool_case(avg, 5, 5, 5, 3, 1);
    }
}

static void batch_norm_case(int64_t rows, int64_t channels, int training) {
    char name[96];
    snprintf(name, sizeof name, "batch_norm [%lld,%lld] training=%d", (long long)rows,
             (long long)channels, training);
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = randoms(rows * channels, -2, 3), dy = randoms(rows * channels, -1, 1);
    std::vector<float> gamma = randoms(channels, 0.5f, 1.5f), beta = randoms(channels, -1, 1);
    std::vector<float> rmean = randoms(channels, -0.5f, 0.5f), rvar = randoms(channels, 0.5f, 2);
    std::vector<float> cpu_mean = rmean, cpu_var = rvar;
    cpu_twin cpu;
    ct_shape cs = ct_shape_make(1, &channels);
    int ix = cpu.constant({rows, channels}, x.data()), ig = cpu.constant({channels}, gamma.data());
    int fwd = ct_batch_norm(cpu.g, ix, ig, cpu.constant({channels}, beta.data()),
                            ct_variable(cpu.g, &cs, cpu_mean.data(), "mean"),
                            ct_variable(cpu.g, &cs, cpu_var.data(), "var"), 0.9f, 1e-3f, training);
    ct_attrs ga = ct_graph_node(cpu.g, fwd)->attrs;
    int grad = cpu.add(CT_OP_BATCH_NORM_GRAD,
                       {cpu.constant({rows, channels}, dy.data()), fwd, ix, ig}, ga);
    ct_cuda_bn s = {rows, channels, 0.9f, 1e-3f, training};
    dev_vec<float> dx(x), dg(gamma), db(beta), dm(rmean), dv(rvar), y(x.size()),
        aux((size_t)(2 * channels)), ddy(dy), dxo(x.size()), aux_grad((size_t)(2 * channels));
    launched(name, ct_cuda_batch_norm(nullptr, &s, dx.p, dg.p, db.p, dm.p, dv.p, y.p, aux.p));
    compare(name, y.host(), cpu.read(fwd));
    char sub[128];
    snprintf(sub, sizeof sub, "%s stats", name);
    std::vector<float> got = aux.host(), m = dm.host(), v = dv.host(), want = cpu.read_aux(fwd);
    got.insert(got.end(), m.begin(), m.end());
    got.insert(got.end(), v.begin(), v.end());
    want.insert(want.end(), cpu_mean.begin(), cpu_mean.end());
    want.insert(want.end(), cpu_var.begin(), cpu_var.end());
    compare(sub, got, want);
    snprintf(sub, sizeof sub, "%s grad", name);
    launched(sub,
             ct_cuda_batch_norm_grad(nullptr, &s, ddy.p, dx.p, aux.p, dg.p, dxo.p, aux_grad.p));
    compare(sub, dxo.host(), cpu.read(grad), 1e-4);
    snprintf(sub, sizeof sub, "%s dgamma dbeta", name);
    compare(sub, aux_grad.host(), cpu.read_aux(grad), 1e-5);
}

static void batch_norm_cases() {
    for (int training = 0; training < 2; training++) {
        batch_norm_case(64, 10, training);
        batch_norm_case(7, 300, training);
        batch_norm_case(1, 3, training);
    }
}

static void attention_case(int64_t b, int64_t t, int64_t heads, int64_t dh, int causal,
                           float rate) {
    char name[128];
    snprintf(name, sizeof name, "attention B=%lld T=%lld H=%lld Dh=%lld causal=%d dropout=%g",
             (long long)b, (long long)t, (long long)heads, (long long)dh, causal, rate);
    if (!wanted(name)) {
        return;
    }
    int64_t n = b * t * heads * dh;
    std::vector<float> q = randoms(n, -1, 1), k = randoms(n, -1, 1), v = randoms(n, -1, 1);
    std::vector<float> dy = randoms(n, -1, 1);
    const float scale = 1.0f / sqrtf((float)dh);
    cpu_twin cpu;
    ct_kctx *ctx = ct_graph_ctx(cpu.g);
    ctx->seed = 99;
    ctx->step = 5;
    ctx->batch_offset = 2;
    std::vector<int64_t> dims = {b, t, heads * dh};
    int iq = cpu.constant(dims, q.data()), ik = cpu.constant(dims, k.data()),
        iv = cpu.constant(dims, v.data());
    int fwd = ct_attention_dropout(cpu.g, iq, ik, iv, (int)heads, causal, scale, rate, 1);
    const ct_node *f = ct_graph_node(cpu.g, fwd);
    int grad =
        cpu.add(CT_OP_ATTENTION_GRAD, {cpu.constant(dims, dy.data()), fwd, iq, ik, iv}, f->attrs);
    ct_cuda_attention a = {
        b,
        t,
        heads,
        dh,
        causal,
        scale,
        1.0f / (1.0f - rate),
        rate > 0 ? (uint32_t)ceil((double)rate * 16777216.0) : 0u,
        ctx->seed,
        ct_rng_stream(CT_RNG_PURPOSE_OP, ctx->step, ctx->replica, (uint32_t)(f->attrs.i[4] - 1)),
        ctx->batch_offset};
    dev_vec<float> dq_(q), dk_(k), dv_(v), ddy(dy), out((size_t)n), lse((size_t)(b * heads * t)),
        delta((size_t)(b * heads * t)), gq((size_t)n), gk((size_t)n), gv((size_t)n);
    launched(name, ct_cuda_attention_forward(nullptr, &a, dq_.p, dk_.p, dv_.p, out.p, lse.p));
    compare(name, out.host(), cpu.read(fwd), 1e-4);
    char sub[160];
    snprintf(sub, sizeof sub, "%s logsumexp", name);
    compare(sub, lse.host(), cpu.read_aux(fwd));
    snprintf(sub, sizeof sub, "%s grad", name);
    launched(sub, ct_cuda_attention_backward(nullptr, &a, ddy.p, dq_.p, dk_.p, dv_.p, out.p, lse.p,
                                             delta.p, gq.p, gk.p, gv.p));
    std::vector<float> got = gq.host(), want = cpu.read(grad), kv = cpu.read_aux(grad);
    compare(sub, got, want, 1e-3); /* sums of products that cancel, in another order */
    got = gk.host();
    std::vector<float> gvh = gv.host();
    got.insert(got.end(), gvh.begin(), gvh.end());
    snprintf(sub, sizeof sub, "%s dk dv", name);
    compare(sub, got, kv, 1e-3);
}

static void attention_cases() {
    for (int causal = 0; causal < 2; causal++) {
        attention_case(2, 9, 3, 8, causal, 0.0f);
        attention_case(1, 12, 2, 64, causal, 0.0f);
        attention_case(1, 7, 2, 33, causal, 0.2f);
    }
}

/* c [m, n] = a [m, k] b [k, n] on the host, op(x) = x^T when t_x: the GEMMs around im2col,
 * standing in for cuBLAS (which only a GPU runs). */
static std::vector<float> host_gemm(const std::vector<float> &a, const std::vector<float> &b,
                                    int64_t m, int64_t n, int64_t k, int ta, int tb) {
    std::vector<float> c((size_t)(m * n));
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0;
            for (int64_t p = 0; p < k; p++) {
                s += (double)a[(size_t)(ta ? p * m + i : i * k + p)] *
                     b[(size_t)(tb ? j * k + p : p * n + j)];
            }
            c[(size_t)(i * n + j)] = (float)s;
        }
    }
    return c;
}

static void conv_case(int64_t h, int64_t w, int64_t c, int64_t oc, int64_t k, int64_t stride,
                      int same) {
    char name[128];
    snprintf(name, sizeof name,
             "conv2d im2col 2x%lldx%lldx%lld filter %lldx%lld->%lld stride=%lld same=%d",
             (long long)h, (long long)w, (long long)c, (long long)k, (long long)k, (long long)oc,
             (long long)stride, same);
    if (!wanted(name)) {
        return;
    }
    std::vector<float> x = randoms(2 * h * w * c, -1, 1), f = randoms(k * k * c * oc, -1, 1);
    cpu_twin cpu;
    int ix = cpu.constant({2, h, w, c}, x.data()), iw = cpu.constant({k, k, c, oc}, f.data());
    int fwd = ct_conv2d(cpu.g, ix, iw, (int)stride, (int)stride, same);
    const ct_node *node = ct_graph_node(cpu.g, fwd);
    ct_cuda_conv g = {2, h, w,      c,      node->out.shape.dims[1], node->out.shape.dims[2],
                      k, k, stride, stride, node->attrs.i[3],        node->attrs.i[4]};
    int64_t rows = 2 * g.out_h * g.out_w, width = k * k * c;
    std::vector<float> dy = randoms(rows * oc, -1, 1);
    ct_attrs at = node->attrs;
    int idy = cpu.constant({2, g.out_h, g.out_w, oc}, dy.data());
    int gin = cpu.add(CT_OP_CONV2D_GRAD_INPUT, {idy, iw, fwd}, at);
    int gf = cpu.add(CT_OP_CONV2D_GRAD_FILTER, {idy, fwd, ix}, at);
    dev_vec<float> dx(x), cols((size_t)(rows * width)), dxo(x.size());
    launched(name, ct_cuda_im2col(nullptr, &g, dx.p, cols.p));
    std::vector<float> hc = cols.host();
    compare(name, host_gemm(hc, f, rows, oc, width, 0, 0), cpu.read(fwd), 1e-4);
    char sub[160];
    snprintf(sub, sizeof sub, "%s filter grad", name);
    compare(sub, host_gemm(hc, dy, width, oc, rows, 1, 0), cpu.read(gf), 1e-4);
    dev_vec<float> dcols(host_gemm(dy, f, rows, width, oc, 0, 1));
    snprintf(sub, sizeof sub, "%s input grad", name);
    launched(sub, ct_cuda_col2im(nullptr, &g, dcols.p, dxo.p));
    compare(sub, dxo.host(), cpu.read(gin), 1e-4);
}

static void conv_cases() {
    conv_case(7, 6, 3, 4, 3, 1, 1);
    conv_case(7, 6, 3, 4, 3, 2, 1);
    conv_case(8, 8, 2, 5, 3, 1, 0);
    conv_case(9, 5, 4, 2, 5, 2, 0);
    conv_case(6, 6, 1, 3, 1, 1, 1);
}

#endif
