/* NTP-style clock offsets from stamped registration replies (prof_clock.h). */
#include "prof/prof_clock.h"

#include "prof/prof.h"

void ct__prof_clock_sample(int64_t sent_ns, int64_t peer_ns, int64_t *best_rtt_ns) {
    int64_t back = ct__prof_now_ns(), rtt = back - sent_ns;
    if (!peer_ns || !sent_ns || rtt < 0 || (*best_rtt_ns && rtt >= *best_rtt_ns)) {
        return;
    }
    *best_rtt_ns = rtt;
    ct__prof_set_clock(peer_ns - (sent_ns + back) / 2, rtt / 2);
}
