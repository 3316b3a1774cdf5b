/* Dynamic batching (serve.h): requests queue on the model; one thread takes the queue's head
 * requests up to max_batch examples, once the batch is full or the first of them has waited
 * max_wait_us, runs them as one forward pass and hands each its rows. ctrain's predictions do not
 * depend on the batch they ran in (tests/integration/test_export.py), so a batched answer is the
 * answer alone. A request larger than max_batch runs alone. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "serve.h"

struct serve_pending {
    const float *x;
    float *y;
    int64_t n;
    double since; /* when it arrived (ct__now_s) */
    int done;
    ct_status st;
    ct_err err;
    serve_pending *next;
};

int serve_model_predict(serve_model *m, const float *x, int64_t n, float *y, ct_err *err) {
    serve_pending p = {.x = x, .y = y, .n = n, .since = ct__now_s()};
    pthread_mutex_lock(&m->mu);
    if (m->queued > 0 && m->queued + n > m->batching.max_queued) {
        pthread_mutex_unlock(&m->mu);
        return 1;
    }
    if (m->tail) {
        m->tail->next = &p;
    } else {
        m->head = &p;
    }
    m->tail = &p;
    m->queued += n;
    pthread_cond_signal(&m->wake);
    while (!p.done) {
        pthread_cond_wait(&m->done, &m->mu);
    }
    pthread_mutex_unlock(&m->mu);
    if (p.st != CT_OK) {
        *err = p.err;
        return -1;
    }
    return 0;
}

/* Waits (m->mu held) until the head requests fill a batch or the first has waited long enough. */
static void wait_for_batch(serve_model *m) {
    while (!m->stop && m->queued < m->batching.max_batch) {
        double left = m->head->since + 1e-6 * (double)m->batching.max_wait_us - ct__now_s();
        if (left <= 0) {
            return;
        }
        struct timespec ts = ct__deadline_s(left); /* pthread_cond_timedwait's clock */
        if (pthread_cond_timedwait(&m->wake, &m->mu, &ts) == ETIMEDOUT) {
            return;
        }
    }
}

/* The rows a batch of `total` examples runs as: the next power of two (zero rows after the
 * examples), so that the trainer's few cached graphs (one per batch size) serve every batch; a
 * batch past max_batch runs as it is. */
static int64_t bucket(const serve_model *m, int64_t total) {
    int64_t b = 1;
    while (b < total) {
        b *= 2;
    }
    return total > m->batching.max_batch ? total : b;
}

/* Runs requests first..(k of them) as one batch (m->mu not held); x and y hold bucket(total)
 * rows, or are NULL: then each request runs alone at its own size. */
static void run_batch(serve_model *m, serve_pending *first, int k, int64_t total, float *x,
                      float *y) {
    ct_err err = {0};
    ct_status st;
    if (!x) {
        st = ct_trainer_predict(m->t, first->x, first->n, first->y, &err);
    } else {
        int64_t row = 0, rows = bucket(m, total);
        serve_pending *p = first;
        for (int i = 0; i < k; i++, p = p->next) {
            memcpy(x + row * m->in_values, p->x, (size_t)(p->n * m->in_values) * sizeof *x);
            row += p->n;
        }
        memset(x + row * m->in_values, 0, (size_t)((rows - row) * m->in_values) * sizeof *x);
        st = ct_trainer_predict(m->t, x, rows, y, &err);
        row = 0;
        p = first;
        for (int i = 0; i < k && st == CT_OK; i++, p = p->next) {
            memcpy(p->y, y + row * m->out_values, (size_t)(p->n * m->out_values) * sizeof *y);
            row += p->n;
        }
    }
    serve_pending *p = first;
    for (int i = 0; i < k; i++, p = p->next) {
        p->st = st;
        p->err = err;
    }
}

static void *batcher(void *arg) {
    serve_model *m = arg;
    float *x = NULL, *y = NULL;
    int64_t cap = 0;
    pthread_mutex_lock(&m->mu);
    while (!m->stop || m->head) {
        if (!m->head) {
            pthread_cond_wait(&m->wake, &m->mu);
            continue;
        }
        wait_for_batch(m);
        serve_pending *first = m->head, *p = first;
        int64_t total = 0;
        int k = 0;
        while (p && (k == 0 || total + p->n <= m->batching.max_batch)) {
            total += p->n;
            k++;
            p = p->next;
        }
        m->head = p;
        m->tail = p ? m->tail : NULL;
        pthread_mutex_unlock(&m->mu);
        if (bucket(m, total) > cap) {
            free(x);
            free(y);
            int64_t rows = bucket(m, total);
            x = malloc((size_t)(rows * m->in_values) * sizeof *x);
            y = malloc((size_t)(rows * m->out_values) * sizeof *y);
            cap = x && y ? rows : 0;
        }
        if (!cap) { /* out of memory for the batch: each alone */
            serve_pending *q = first;
            for (int i = 0; i < k; i++, q = q->next) {
                run_batch(m, q, 1, q->n, NULL, NULL);
            }
        } else {
            run_batch(m, first, k, total, x, y);
        }
        pthread_mutex_lock(&m->mu);
        p = first;
        for (int i = 0; i < k; i++) {
            serve_pending *next = p->next; /* p lives on its waiter's stack: read it first */
            p->done = 1;
            m->queued -= p->n;
            p = next;
        }
        m->batches++;
        m->batched_examples += total;
        pthread_cond_broadcast(&m->done);
    }
    pthread_mutex_unlock(&m->mu);
    free(x);
    free(y);
    return NULL;
}

ct_status serve_batcher_start(serve_model *m, ct_err *err) {
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->wake, NULL);
    pthread_cond_init(&m->done, NULL);
    if (pthread_create(&m->thread, NULL, batcher, m) != 0) {
        pthread_cond_destroy(&m->done);
        pthread_cond_destroy(&m->wake);
        pthread_mutex_destroy(&m->mu);
        return ct_err_set(err, CT_ENOMEM, "cannot start the batching thread");
    }
    m->running = 1;
    return CT_OK;
}

void serve_batcher_stop(serve_model *m) {
    if (!m->running) {
        return;
    }
    pthread_mutex_lock(&m->mu);
    m->stop = 1;
    pthread_cond_signal(&m->wake);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
    pthread_cond_destroy(&m->done);
    pthread_cond_destroy(&m->wake);
    pthread_mutex_destroy(&m->mu);
    m->running = 0;
}
