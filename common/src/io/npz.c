/* placeholder */
#include "ctrain/npz.h"
typedef int ct__npz_placeholder;
