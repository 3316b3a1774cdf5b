/* The epoch and done lines (see report.h). */
#include "ctrain/report.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

/* " test_top5_accuracy=A" when the job asks for it (metrics: [top_5_accuracy]), else "". */
static void top_k_field(char *buf, size_t cap, int k, double value, int digits) {
    buf[0] = '\0';
    if (k > 0) {
        snprintf(buf, cap, " test_top%d_accuracy=%.*f", k, digits, value);
    }
}

int ct_format_epoch_line(char *buf, size_t cap, const ct_train_progress *p) {
    char top_k[64];
    top_k_field(top_k, sizeof top_k, p->top_k, p->test_top_k_accuracy, 4);
    int n = snprintf(buf, cap,
                     "epoch %d/%d: steps=%lld loss=%.4f accuracy=%.4f test_loss=%.4f "
                     "test_accuracy=%.4f%s seconds=%.1f samples_per_s=%.0f",
                     p->epoch + 1, p->epochs, (long long)p->steps, p->loss, p->accuracy,
                     p->test_loss, p->test_accuracy, top_k, p->epoch_seconds, p->samples_per_s);
    if (p->input_wait_fraction >= 0 && n >= 0 && (size_t)n < cap) {
        n += snprintf(buf + n, cap - (size_t)n, " input_wait=%.1f%%",
                      100.0 * p->input_wait_fraction);
    }
    if (p->graph_seconds > 0 && n >= 0 && (size_t)n < cap) {
        n += snprintf(buf + n, cap - (size_t)n, " graph_compile=%.1fms", 1e3 * p->graph_seconds);
    }
    if (p->threads > 1 && n >= 0 && (size_t)n < cap) {
        n += snprintf(buf + n, cap - (size_t)n,
                      " threads=%d solo_steps=%.0f%% core_wait=", p->threads,
                      100.0 * p->solo_fraction);
        for (int k = 0; k < p->threads && k < CT_PROGRESS_THREADS && n >= 0 && (size_t)n < cap;
             k++) {
            n += p->core_wait[k] < 0 ? snprintf(buf + n, cap - (size_t)n, "%s?", k ? "," : "")
                                     : snprintf(buf + n, cap - (size_t)n, "%s%.0f%%", k ? "," : "",
                                                100.0 * p->core_wait[k]);
        }
    }
    return n;
}

int ct_format_input_line(char *buf, size_t cap, const ct_train_progress *p) {
    if (p->data_workers <= 0) {
        if (cap > 0) {
            buf[0] = '\0';
        }
        return 0;
    }
    int bound = p->input_wait_fraction > CT_INPUT_BOUND_FRACTION;
    char verdict[160];
    if (bound && p->workers_needed > p->data_workers) {
        snprintf(verdict, sizeof verdict, "input-bound, %d data workers would remove the wait",
                 p->workers_needed);
    } else if (bound) { /* the pool could keep up: batches arrive late, not too few */
        snprintf(verdict, sizeof verdict,
                 "input-bound by delivery, not by data workers (a deeper data.service.window "
                 "or larger batches would help)");
    } else {
        snprintf(verdict, sizeof verdict, "not input-bound");
    }
    return snprintf(buf, cap,
                    "input: %.1f%% of step time waiting; data workers %d, each producing %.0f "
                    "elements/s; consumers need %.0f elements/s: %s",
                    100.0 * (p->input_wait_fraction > 0 ? p->input_wait_fraction : 0.0),
                    p->data_workers, p->worker_elements_per_s, p->needed_elements_per_s, verdict);
}

int ct_format_done_line(char *buf, size_t cap, const ct_train_result *r, const char *extra) {
    char lm[96] = ""; /* a language model: the test perplexity and tokens per second */
    if (r->positions > 1) {
        snprintf(lm, sizeof lm, " test_perplexity=%.4f tokens_per_s=%.0f", exp(r->test_loss),
                 r->samples_per_s * (double)r->positions);
    }
    char top_k[64];
    top_k_field(top_k, sizeof top_k, r->top_k, r->test_top_k_accuracy, 6);
    return snprintf(buf, cap,
                    "done: epochs=%d steps=%lld test_loss=%.6f test_accuracy=%.6f%s seconds=%.3f "
                    "samples_per_s=%.1f%s%s%s",
                    r->epochs, (long long)r->steps, r->test_loss, r->test_accuracy, top_k,
                    r->seconds, r->samples_per_s, lm, extra && *extra ? " " : "",
                    extra ? extra : "");
}

void ct_report_notice(const ct_train_reporter *r, const char *fmt, ...) {
    if (!r || !r->notice) {
        return;
    }
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    r->notice(line, r->user);
}
