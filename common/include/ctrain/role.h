/* The shared main of the MPI role binaries (common/src/dist/role.c). */
#ifndef CTRAIN_ROLE_H
#define CTRAIN_ROLE_H

/* Runs the mirrored strategy as `role` ("ctrain-chief" or "ctrain-worker"); returns the exit
 * code. */
int ct_role_main(int argc, char **argv, const char *role);

#endif
