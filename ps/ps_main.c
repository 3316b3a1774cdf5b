/* ctrain-ps: a parameter server of a parameter-server job (strategy.type parameter_server): holds
 * its shards of the variables and their optimizer slots, and applies the workers' gradients. */
#include "ctrain/role.h"

int main(int argc, char **argv) {
    return ct_role_main(argc, argv, "ctrain-ps");
}
