/* Status strings, error records, assertion failure and the log sink. */
#include "ctrain/status.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ct_status_str(ct_status status) {
    switch (status) {
#define CT__STATUS_STR(name, value, text)                                                          \
    case CT_##name:                                                                                \
        return text;
        CT_STATUS_LIST(CT__STATUS_STR)
#undef CT__STATUS_STR
    }
    return "unknown status";
}

const char *ct_status_name(ct_status status) {
    switch (status) {
#define CT__STATUS_NAME(name, value, text)                                                         \
    case CT_##name:                                                                                \
        return #name;
        CT_STATUS_LIST(CT__STATUS_NAME)
#undef CT__STATUS_NAME
    }
    return "UNKNOWN";
}

ct_status ct_err_set(ct_err *err, ct_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

ct_status ct_err_prefix(ct_err *err, ct_status code, const char *fmt, ...) {
    if (!err) {
        return code;
    }
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix - 2, fmt, ap);
    va_end(ap);
    strcat(prefix, ": ");
    size_t plen = strlen(prefix), cap = sizeof err->msg;
    size_t old = strnlen(err->msg, cap - 1);
    if (plen + old >= cap) {
        old = cap - 1 - plen; /* keep the prefix; cut the tail of the old message */
    }
    memmove(err->msg + plen, err->msg, old);
    memcpy(err->msg, prefix, plen);
    err->msg[plen + old] = '\0';
    err->code = code;
    return code;
}

int ct_exit_code(ct_status status, int stop_signal, int stalled) {
    if (status == CT_OK) {
        return 0;
    }
    if (status == CT_EINTR) {
        return stop_signal == SIGTERM ? 143 : 130;
    }
    if (stalled) {
        return 3;
    }
    return status == CT_EINVAL ? 2 : 1;
}

void ct__assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "ctrain: internal error: assertion '%s' failed at %s:%d\n", expr, file, line);
    abort();
}

static ct_log_level log_level = CT_LOG_WARN;
static ct_log_sink log_sink = NULL;
static void *log_user = NULL;

void ct_log_set(ct_log_level level, ct_log_sink sink, void *user) {
    log_level = level;
    log_sink = sink;
    log_user = user;
}

void ct_log(ct_log_level level, const char *fmt, ...) {
    if (!log_sink || level > log_level) {
        return;
    }
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_sink(level, msg, log_user);
}
