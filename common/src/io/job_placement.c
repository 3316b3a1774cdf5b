/* train.device, its placement switches, and train.precision with fp16's loss scale: on what
 * device and in what precision a step runs. */
#include "ctrain/graph.h"
#include "ctrain/job.h"
#include "io/job_read.h"

/* train.device, train.soft_placement, train.log_device_placement. */
static void read_device(ct__job_reader *r, const ct__job_section *s, ct_job *job) {
    char key[CT__JOB_KEY_CAP], text[64] = "";
    const ct__yaml_node *v = ct__job_sec_get(s, "device", key);
    ct__job_sec_string(s, "device", text, sizeof text);
    if (v && r->status == CT_OK && ct_device_parse(text, &job->train.device) != 0) {
        ct__job_fail(r, v->line, key, "unknown device '%s' (use /CPU:0 or /GPU:N)", text);
    }
    ct__job_sec_bool(s, "soft_placement", &job->train.soft_placement);
    ct__job_sec_bool(s, "log_device_placement", &job->train.log_device_placement);
}

/* train.precision (a Keras policy name too), train.loss_scale, its growth interval. */
static void read_precision(ct__job_reader *r, const ct__job_section *s, ct_job *job) {
    char key[CT__JOB_KEY_CAP], text[64] = "";
    const ct__yaml_node *v = ct__job_sec_get(s, "precision", key);
    ct__job_sec_string(s, "precision", text, sizeof text);
    if (v && r->status == CT_OK && ct_precision_parse(text, &job->train.precision) != 0) {
        ct__job_fail(r, v->line, key,
                     "unknown precision '%s' (use f32, bf16 or fp16, or the Keras policies "
                     "float32, mixed_bfloat16, mixed_float16)",
                     text);
    }
    ct__job_sec_float(s, "loss_scale", CT__JOB_POSITIVE, &job->train.loss_scale);
    ct__job_sec_int(s, "loss_scale_growth_interval", 1, &job->train.loss_scale_growth_interval);
}

void ct__job_read_placement(ct__job_reader *r, const ct__job_section *s, ct_job *job) {
    read_device(r, s, job);
    read_precision(r, s, job);
}
