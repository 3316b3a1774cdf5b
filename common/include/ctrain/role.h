/* The shared main of the role binaries (common/src/dist/role.c): ctrain-chief, ctrain-worker and
 * ctrain-ps. */
#ifndef CTRAIN_ROLE_H
#define CTRAIN_ROLE_H

/* Runs `role` ("ctrain-chief", "ctrain-worker" or "ctrain-ps") of the job named by the flags:
 * the mirrored strategy over MPI, or the parameter-server strategy over ZeroMQ, as the job's
 * strategy.type says. Returns the exit code. */
int ct_role_main(int argc, char **argv, const char *role);

#endif
