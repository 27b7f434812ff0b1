/* The scheduler (engine/sched/sched.c): private to engine/ and its tests. Contract in engine.h.
 *
 * Two ways to run the requests' forward passes:
 *   batched   (CPU models of an architecture with engine_fwd_run_batch): every request's KV is
 *             a block table on a paged pool (the model's prefix cache, or the scheduler's own),
 *             and one step is one pass over all of them: decode tokens plus prefill chunks.
 *   sessions  (GPU models, whose CUDA path is batch-1, and architectures without a batched
 *             pass): each running request owns an engine_session; a step appends each one's
 *             tokens in turn through the session path. No preemption: a request that cannot
 *             grow ends with ENGINE_ENOMEM.
 */
#ifndef SPARK_ENGINE_SCHED_INT_H
#define SPARK_ENGINE_SCHED_INT_H

#include <stdbool.h>

#include "engine.h"

typedef enum {
    ENGINE_SCHED_MODE_AUTO = 0, /* batched where the model allows it, else sessions */
    ENGINE_SCHED_MODE_BATCHED,
    ENGINE_SCHED_MODE_SESSIONS,
} engine_sched_mode;

/* engine_sched_new with the mode chosen (tests run the session path on the CPU).
 * ENGINE_EUNSUPPORTED when BATCHED is asked for a model that cannot run it. */
int engine_sched_new_mode(engine_sched **out, engine_model *m, const engine_sched_params *p,
                          engine_sched_mode mode);

#endif
