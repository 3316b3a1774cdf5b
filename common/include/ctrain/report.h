/* The lines every role prints about a run, formatted in one place so that the standalone trainer,
 * the mirrored ranks and the parameter-server chief print the same words: the end-of-epoch line
 * and the `done:` summary line that scripts parse. The library formats; roles print. */
#ifndef CTRAIN_REPORT_H
#define CTRAIN_REPORT_H

#include "ctrain/api.h"

#include <stddef.h>

#include "ctrain/train.h"

/* Writes "epoch E/N: steps=S loss=L accuracy=A test_loss=TL test_accuracy=TA seconds=T
 * samples_per_s=R input_wait=W%" into buf (cap bytes, NUL-terminated, no newline). The
 * input_wait field is left out when p->input_wait_fraction is negative (a driver that does not
 * measure it). Returns the length snprintf would have written. Thread-safe. */
CT_API int ct_format_epoch_line(char *buf, size_t cap, const ct_train_progress *p);

/* The data service's input-bound verdict of an epoch: "input: W% of step time waiting; data
 * workers N, each producing R elements/s; consumers need C elements/s: input-bound, K data
 * workers would remove the wait", ": input-bound by delivery, not by data workers ..." when the
 * pool could keep up, or ": not input-bound". Writes "" and returns 0 when
 * p->data_workers is 0 (no data service). Thread-safe. */
CT_API int ct_format_input_line(char *buf, size_t cap, const ct_train_progress *p);

/* Input-bound: more than this fraction of the step time goes to waiting for input. */
#define CT_INPUT_BOUND_FRACTION 0.05

/* Writes "done: epochs=E steps=S test_loss=L test_accuracy=A seconds=T samples_per_s=R" and,
 * when extra is not NULL or empty, " " and extra ("replicas=2", "ps=1 workers=2") into buf (no
 * newline). Returns the length snprintf would have written. Thread-safe. */
CT_API int ct_format_done_line(char *buf, size_t cap, const ct_train_result *r, const char *extra);

/* Formats a notice (printf-style, no newline) and hands it to r->notice; nothing when r or
 * r->notice is NULL. The drivers' one way to say something to a person. */
CT_API void ct_report_notice(const ct_train_reporter *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
