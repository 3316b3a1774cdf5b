/* ctrain-worker: one replica of a mirrored (MPI) job; rank 0 also acts as the chief. */
#include "ctrain/role.h"

int main(int argc, char **argv) {
    return ct_role_main(argc, argv, "ctrain-worker");
}
