/* strategy.elastic: a mirrored job whose ranks may leave and join while it trains
 * (docs/elastic.md). Its sums are train.invariant's (each step's gradient the canonical tree of
 * its chunks), so that the bits never depend on how many ranks computed them: required. */
#include "ctrain/job.h"
#include "io/job_read.h"

#define MAX_REPLICAS 64 /* a step's chunks are a 64-bit mask */

static const char *const elastic_keys[] = {"min_replicas", "max_replicas", "commit_every_steps",
                                           "shared_memory", NULL};

void ct__job_read_elastic(ct__job_reader *r, const ct__job_section *s, ct_job *job) {
    char key[CT__JOB_KEY_CAP];
    const ct__yaml_node *node = ct__job_sec_get(s, "elastic", key);
    if (!node || r->status != CT_OK) {
        return;
    }
    ct__job_section e;
    ct__job_sec_open(r, node, key, elastic_keys, node->line, &e);
    ct_elastic_spec *el = &job->mirrored.elastic;
    el->min_replicas = 1;
    el->max_replicas = 4;
    el->commit_every_steps = 1;
    el->shared_memory = 1;
    ct__job_sec_int(&e, "min_replicas", 1, &el->min_replicas);
    ct__job_sec_int(&e, "max_replicas", 1, &el->max_replicas);
    ct__job_sec_i64(&e, "commit_every_steps", 1, &el->commit_every_steps);
    ct__job_sec_bool(&e, "shared_memory", &el->shared_memory);
    if (r->status != CT_OK) {
        return;
    }
    if (el->max_replicas < el->min_replicas || el->max_replicas > MAX_REPLICAS) {
        ct__job_fail(r, node->line, key,
                     "max_replicas %d must be at least min_replicas %d and at most %d",
                     el->max_replicas, el->min_replicas, MAX_REPLICAS);
    } else if (!job->train.invariant) {
        ct__job_fail(r, node->line, key,
                     "an elastic job needs train.invariant: true and train.global_batch_size (its "
                     "sums must not depend on how many ranks computed them)");
    }
}
