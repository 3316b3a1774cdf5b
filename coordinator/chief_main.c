/* ctrain-chief: rank 0 of a mirrored (MPI) job, for MPMD launches
 * (mpirun -np 1 ctrain-chief --job J : -np 3 ctrain-worker --job J). */
#include "ctrain/role.h"

int main(int argc, char **argv) {
    return ct_role_main(argc, argv, "ctrain-chief");
}
