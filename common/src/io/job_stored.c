/* A job as checkpoints store it (ct_job_load_text's text: the file, then one "# --set KEY=VALUE"
 * line per override), parsed with its overrides applied again: what a checkpoint was trained
 * with, for a resume's comparison and for the commands that run a checkpoint (generate). */
#include <stdio.h>
#include <string.h>

#include "ctrain/job.h"

#define STORED_MAX_SETS 64
#define STORED_SET_CAP 256

ct_status ct_job_parse_stored(const char *text, const char *name, ct_job *ret_job, ct_err *err) {
    static const char tag[] = "# --set ";
    char owned[STORED_MAX_SETS][STORED_SET_CAP];
    const char *sets[STORED_MAX_SETS];
    int n = 0;
    text = text ? text : "";
    for (const char *l = text; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : "") {
        if (strncmp(l, tag, sizeof tag - 1) != 0) {
            continue;
        }
        size_t len = strcspn(l + sizeof tag - 1, "\n");
        if (n == STORED_MAX_SETS || len >= STORED_SET_CAP) {
            return ct_err_set(err, CT_EINVAL, "%s: more than %d overrides, or one over %d bytes",
                              name, STORED_MAX_SETS, STORED_SET_CAP - 1);
        }
        snprintf(owned[n], sizeof owned[n], "%.*s", (int)len, l + sizeof tag - 1);
        sets[n] = owned[n];
        n++;
    }
    return ct_job_parse(text, strlen(text), name, sets, n, ret_job, err);
}
