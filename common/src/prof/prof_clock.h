/* The profiler's clock offset to the chief's, NTP-style (internal): a role stamps the profiler's
 * clock when it sends its registration, the peer it registers with stamps its own clock into the
 * reply (the Envelope's clock_ns), and offset = peer - (sent + received) / 2, within half the
 * round trip. Used by the parameter-server roles (to the chief) and the data workers (to the
 * dispatcher). */
#ifndef CTRAIN_PROF_CLOCK_H
#define CTRAIN_PROF_CLOCK_H

#include <stdint.h>

/* One sample: the registration was sent at sent_ns (the profiler's clock; 0: not stamped) and
 * answered with the peer's clock peer_ns (0: the peer does not stamp) just now. The shortest
 * round trip so far wins (*best_rtt_ns: 0 before the first sample; updated); its offset goes to
 * ct__prof_set_clock. (A reply to an earlier registration, resent after a silence, would
 * understate the bound: registration normally answers at once.) */
void ct__prof_clock_sample(int64_t sent_ns, int64_t peer_ns, int64_t *best_rtt_ns);

#endif
