/* Status codes, the per-call error record and logging: one X-macro status map shared by
 * every module (the libuv/SQLite pattern). */
#ifndef CTRAIN_STATUS_H
#define CTRAIN_STATUS_H

#include "ctrain/api.h"

#include <stddef.h>

#define CT_STATUS_LIST(X)                                                                          \
    X(OK, 0, "ok")                                                                                 \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(EIO, -3, "input/output error")                                                               \
    X(EPROTO, -4, "protocol error")                                                                \
    X(ETIMEDOUT, -5, "timed out")                                                                  \
    X(EPEER, -6, "peer failed")                                                                    \
    X(ECUDA, -7, "CUDA error")                                                                     \
    X(ENCCL, -8, "NCCL error")                                                                     \
    X(EMPI, -9, "MPI error")                                                                       \
    X(ENOENT, -10, "not found")                                                                    \
    X(EFORMAT, -11, "malformed data")                                                              \
    X(ESHAPE, -12, "shape mismatch")                                                               \
    X(ENUMERIC, -13, "NaN or Inf")                                                                 \
    X(EUNSUPPORTED, -14, "not supported by this build")                                            \
    X(EINTR, -15, "interrupted")

typedef enum ct_status {
#define CT__STATUS_ENUM(name, value, text) CT_##name = value,
    CT_STATUS_LIST(CT__STATUS_ENUM)
#undef CT__STATUS_ENUM
} ct_status;

/* Returns a static English description of `status` ("unknown status" for other values).
 * Thread-safe. */
CT_API const char *ct_status_str(ct_status status);

/* Returns the symbolic name of `status` ("EINVAL"). Thread-safe. */
CT_API const char *ct_status_name(ct_status status);

/* A status plus a message for a person that names what and where ("job.yaml:12: model.layers[2]:
 * dense.units must be > 0"). Functions take it as an optional last parameter (NULL allowed). */
typedef struct ct_err {
    ct_status code;
    char msg[512];
} ct_err;

/* Records `code` and a printf-style message in `err` (if not NULL); returns `code` so that a
 * caller can write `return ct_err_set(err, CT_EINVAL, "...")`. Thread-safe per `err`. */
CT_API ct_status ct_err_set(ct_err *err, ct_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to the message in `err` (no message change for NULL) and returns `code`,
 * the status of the failure being reported, whether or not `err` is NULL, so that a caller can
 * write `return ct_err_prefix(err, st, "...")`. Thread-safe per `err`. */
CT_API ct_status ct_err_prefix(ct_err *err, ct_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The exit code a role binary maps `status` to: 0 for CT_OK; for CT_EINTR 143 when the stop came
 * from SIGTERM (stop_signal) and 130 otherwise; 2 for bad input (CT_EINVAL); 3 for a stalled
 * collective (CT_ETIMEDOUT from the mirrored strategy's stall detection: pass stalled = 1);
 * 1 for every other failure. Thread-safe. */
CT_API int ct_exit_code(ct_status status, int stop_signal, int stalled);

/* Broken invariants (programmer errors) abort with file and line; runtime conditions never use
 * this, they return a status. */
#define CT_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            ct__assert_fail(#cond, __FILE__, __LINE__);                                            \
        }                                                                                          \
    } while (0)

#ifdef __cplusplus /* the CUDA kernels' C++ includes the public headers too */
[[noreturn]]
#else
_Noreturn
#endif
void ct__assert_fail(const char *expr, const char *file, int line);

/* Log levels; the level and the sink are the library's only mutable globals. */
typedef enum ct_log_level { CT_LOG_ERROR, CT_LOG_WARN, CT_LOG_INFO, CT_LOG_DEBUG } ct_log_level;
typedef void (*ct_log_sink)(ct_log_level level, const char *msg, void *user);

/* Sets the log level and sink (NULL sink: messages are dropped). Not thread-safe: call at start. */
CT_API void ct_log_set(ct_log_level level, ct_log_sink sink, void *user);
CT_API void ct_log(ct_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
