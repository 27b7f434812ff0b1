/* spec.h - speculative decoding with the model's MTP block (private to engine/).
 *
 * engine_generate hands its decode loop to engine_spec_decode when the request asks for MTP
 * drafts (engine_gen_params.mtp_draft). The sampler exposes the distribution it draws from so
 * that the verifier can apply the standard rejection rule to exactly that distribution. */
#ifndef SPARK_ENGINE_SAMPLE_SPEC_H
#define SPARK_ENGINE_SAMPLE_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model_int.h"

/* sampler.c: the full-vocabulary distribution engine_sampler_sample draws from for these
 * logits (mask hook, bias, penalties, temperature, top-k/p, min-p applied; greedy: one-hot on
 * its argmax) into probs[n_vocab]. Errors as engine_sampler_sample. */
int engine_sampler_probs(engine_sampler *s, const float *logits, float *probs);
/* The next uniform [0, 1) draw of the sampler's seeded stream. */
double engine_sampler_uniform(engine_sampler *s);
bool engine_sampler_is_greedy(const engine_sampler *s);

/* spec.c: the decode loop of engine_generate with MTP drafts (p->mtp_draft in 1..4) on a
 * session whose prompt is appended with MTP enabled (engine_q35_mtp_enable). `smp` is the
 * request's sampler (prompt already accepted), `g` its text stream, `st` its stats (filled as
 * the plain loop does, plus the spec_* fields). Returns 0 or an error as engine_generate;
 * st->stop says why it stopped. */
int engine_spec_decode(engine_session *s, const engine_gen_params *p, engine_sampler *smp,
                       engine_gen_text *g, engine_gen_stats *st);

/* Test hooks. draft (greedy only): replaces the drafted token that would sit at session
 * position pos. draft_q (sampling only): replaces the draft distribution q[n_vocab] for that
 * position before the draft is drawn from it (the rejection rule then uses the new q). */
typedef struct {
    void (*draft)(void *user, int32_t pos, int32_t *tok);
    void (*draft_q)(void *user, int32_t pos, float *q, int32_t n_vocab);
    void *user;
} engine_spec_hooks;
int engine_spec_decode_ex(engine_session *s, const engine_gen_params *p, engine_sampler *smp,
                          engine_gen_text *g, engine_gen_stats *st, const engine_spec_hooks *h);

/* The rejection rule for one draft d ~ q against the target p (both n_vocab probabilities):
 * keep d with probability min(1, p[d] / q[d]) (*keep), else return a draw from
 * norm(max(0, p - q)); the draws come from smp's stream. The emitted token is distributed
 * exactly as p. */
int32_t engine_spec_accept(engine_sampler *smp, const float *p, const float *q, int32_t d,
                           int32_t n_vocab, bool *keep);

#endif
