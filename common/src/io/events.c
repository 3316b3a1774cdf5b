/* placeholder */
#include "ctrain/events.h"
typedef int ct__events_placeholder;
