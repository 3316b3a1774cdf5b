/* data.service of a job file: where the data service's dispatcher is and how it shares an
 * epoch (docs/data-service.md). */
#include "io/job_pipeline.h"

static const char *const service_keys[] = {
    "dispatcher", "mode",       "deterministic", "split_steps", "window", "window_mb",
    "heartbeat",  "lost_after", "timeout",       "work_dir",    NULL};
static const ct__job_name mode_names[] = {{"distributed_epoch", CT_DS_DISTRIBUTED_EPOCH},
                                          {"parallel_epochs", CT_DS_PARALLEL_EPOCHS},
                                          {NULL, 0}};

void ct__job_read_service(ct__job_reader *r, const ct__job_section *data,
                          ct_data_service_spec *ds) {
    char path[CT__JOB_KEY_CAP];
    ct__job_section s;
    ds->enabled = 1;
    ds->line = ct__job_key_line(data, "service");
    ct__job_sec_open(r, ct__job_sec_get(data, "service", path), path, service_keys, ds->line, &s);
    ct__job_sec_string(&s, "dispatcher", ds->dispatcher, sizeof ds->dispatcher);
    int mode = (int)ds->mode;
    ct__job_sec_name(&s, "mode", mode_names, "data service mode", &mode);
    ds->mode = (ct_ds_mode)mode;
    ct__job_sec_bool(&s, "deterministic", &ds->deterministic);
    if (r->status == CT_OK && !ds->deterministic) {
        char key[CT__JOB_KEY_CAP];
        ct__job_sec_get(&s, "deterministic", key);
        ct__job_fail(r, ct__job_key_line(&s, "deterministic"), key,
                     "false is not offered: the data service always delivers a consumer's "
                     "batches in step order (the same batches for any number of data workers) "
                     "and has no out-of-order path; leave the key out");
    }
    ct__job_sec_i64(&s, "split_steps", 1, &ds->split_steps);
    ct__job_sec_int(&s, "window", 1, &ds->window);
    ct__job_sec_float(&s, "window_mb", CT__JOB_NON_NEGATIVE, &ds->window_mb);
    ct__job_sec_float(&s, "heartbeat", CT__JOB_POSITIVE, &ds->heartbeat_s);
    ct__job_sec_int(&s, "lost_after", 1, &ds->lost_after);
    ct__job_sec_float(&s, "timeout", CT__JOB_POSITIVE, &ds->timeout_s);
    ct__job_sec_string(&s, "work_dir", ds->work_dir, sizeof ds->work_dir);
}
