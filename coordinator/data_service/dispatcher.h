/* The data service's dispatcher as a role library (docs/data-service.md): the ctrain-dispatcher
 * binary and the tests run it. It binds a ROUTER, registers data workers, answers consumers,
 * leases their splits to the workers, journals its state in work_dir and ends the job. It
 * prints nothing: lines for a person go through ct_log ("dispatcher: data worker 2 (pid 4711 on
 * node03) lost: no heartbeat for 2.0 s; 3 leases re-queued"). */
#ifndef CTRAIN_DISPATCHER_H
#define CTRAIN_DISPATCHER_H

#include "ctrain/job.h"
#include "ctrain/status.h"

typedef struct ct_dispatcher_options {
    const char *bind; /* HOST:PORT to listen on (NULL: "127.0.0.1:0", any free port) */
    const char *interface, *advertise; /* --interface, --advertise (net.h, "Addresses") */
    const char *work_dir;              /* the journal (NULL: data.service.work_dir, else
                                          <run_dir>/data_service) */
    const char *keys; /* CURVE keys directory (NULL: strategy.keys; "" or none: plain TCP) */
    /* Called once the socket listens, with the endpoint others connect to
     * ("tcp://127.0.0.1:41235"); may be NULL. */
    void (*on_listening)(const char *endpoint, void *user);
    void *user;
} ct_dispatcher_options;

/* Runs the dispatcher of `job` until the job is DONE (see the spec's "end of a job") or *stop
 * is raised (then DONE is announced to the data workers and it returns two heartbeats later):
 * CT_OK either way. CT_EINVAL for a job without data.service or a bad option, CT_EIO for the
 * journal or the socket (err names the file or the address). Borrows job and o. Blocks the
 * calling thread; one dispatcher per thread (the ZeroMQ context is the process's). */
ct_status ct_dispatcher_run(const ct_job *job, const ct_dispatcher_options *o, volatile int *stop,
                            ct_err *err);

#endif
