/* Whether this build has the mirrored strategy. It needs Open MPI at build time (the meson
 * feature `mpi`); without it the strategy's MPI sources are left out and ct_mirrored_train is
 * this file's stand-in, which says what to install. Compiled in every build, and free of MPI,
 * so that callers can ask without linking libmpi. */
#include "ctrain/mirrored.h"

#define NO_MPI                                                                                     \
    "this build has no MPI (Open MPI not found at build time); install libopenmpi-dev and "        \
    "rebuild"

ct_status ct_mirrored_check_build(ct_err *err) {
#if CT_HAVE_MPI
    (void)err;
    return CT_OK;
#else
    return ct_err_set(err, CT_EUNSUPPORTED, "%s", NO_MPI);
#endif
}

#if !CT_HAVE_MPI
ct_status ct_mirrored_train(const ct_job *job, const ct_cluster_spec *spec,
                            const ct_mirrored_options *opts, ct_mirrored_result *ret, ct_err *err) {
    (void)job;
    (void)spec;
    (void)opts;
    ret->stalled = 0;
    return ct_mirrored_check_build(err);
}

ct_status ct_mirrored_run(const ct_job *job, const ct_mirrored_options *opts, int *ret_rank,
                          ct_mirrored_result *ret, ct_err *err) {
    (void)job;
    (void)opts;
    if (ret_rank) {
        *ret_rank = 0;
    }
    ret->stalled = 0;
    return ct_mirrored_check_build(err);
}
#endif
