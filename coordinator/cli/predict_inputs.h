/* `ctrain predict`'s inputs given as files (predict_inputs.c). */
#ifndef CTRAIN_CLI_PREDICT_INPUTS_H
#define CTRAIN_CLI_PREDICT_INPUTS_H

#include "ctrain/ctrain.h"
#include "ctrain/pipeline.h"

typedef struct predict_files {
    char **paths; /* absolute, in the order given (a folder's images sorted by name) */
    int n;
    int images; /* 1: image files; 0: files of the kind the job's pipeline source reads */
} predict_files;

/* The files named by `inputs` (image files, folders of them, or data files; not a mix). */
ct_status predict_files_collect(const char *const *inputs, int n, predict_files *ret, ct_err *err);
/* A loader of the files through the job's evaluation pipeline's maps, `batch` at a time. */
ct_status predict_files_loader(const ct_job *job, const predict_files *f, int64_t batch,
                               ct_loader **ret, ct_err *err);
void predict_files_free(predict_files *f);

#endif
