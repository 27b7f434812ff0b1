/* Speculative decoding with the model's MTP block (qwen35moe), the decode loop of
 * engine_generate when engine_gen_params.mtp_draft = k > 0. Contract in spec.h.
 *
 * One step, with x the token sampled last (emitted, not yet in the session of n tokens):
 *   draft   the MTP block chains k drafts: (h_{n-1}, x) -> d_1, (its output, d_1) -> d_2, ...
 *           greedy: argmax of the draft logits; sampling: d_i ~ q_i, the draft logits through
 *           the request's temperature/top-k/top-p/min-p (no mask, bias or penalties)
 *   verify  one forward pass appends [x, d_1 .. d_k] and yields the target logits after each
 *   accept  left to right, with the target distribution p_i of the request's own sampler
 *           (mask hook, bias, penalties and cuts applied to the accepted tokens so far):
 *           greedy: keep d_i while it equals the sampler's choice, else emit that choice;
 *           sampling: keep d_i with probability min(1, p_i(d_i) / q_i(d_i)), else emit a draw
 *           from norm(max(0, p_i - q_i)) and stop. When all k are kept, a bonus token is drawn
 *           from p_{k+1}. This is the standard rejection rule: every emitted token has exactly
 *           the distribution plain sampling would give it (greedy: the same tokens).
 *   rollback the session is truncated after the last kept token: the recurrent state comes
 *           back from the checkpoint taken before the verify pass and the kept tokens are
 *           recomputed (engine_q35_checkpoint); the KV beyond is overwritten later.
 * The grammar hooks only ever see kept tokens (the mask is asked at each verified position
 * after the accept hook has taken the tokens before it), so a rejected draft never enters the
 * grammar and there is no grammar state to roll back.
 *
 * The session ends as plain decoding leaves it: every emitted token but a final stop token
 * (EOG, stop id, stop string) is in it. Buffers are allocated once per request. */
#include "sample/spec.h"

#include <math.h>
#include <string.h>

#define SPEC_MAX_DRAFT 4

typedef struct {
    engine_session *s;
    const engine_gen_params *p;
    engine_sampler *smp;  /* the request's: the target distribution */
    engine_sampler *dsmp; /* the drafter's (sampling only) */
    engine_gen_text *g;
    engine_gen_stats *st;
    const engine_spec_hooks *hooks;
    int32_t nv, max;
    bool greedy;
    float *qlog;  /* [k][nv] draft logits */
    float *qprob; /* [k][nv] draft distributions (sampling) */
    float *vlog;  /* [k + 1][nv] verify logits */
    float *pprob; /* [nv] */
} spec;

/* A token chosen: count it, pass it to the grammar and the text stream. */
static int spec_emit(spec *sp, int32_t tok) {
    double t = engine_time_ms();
    sp->st->generated_tokens++;
    int rc = engine_sampler_accept(sp->smp, tok, true);
    if (rc == ENGINE_ECANCELED) sp->st->stop = ENGINE_STOP_CANCELED;
    if (rc == 0) rc = engine_gen_text_token(sp->g, tok, &sp->st->stop);
    sp->st->sample_ms += engine_time_ms() - t;
    return rc;
}

static int spec_sample(spec *sp, const float *logits, int32_t *tok) {
    double t = engine_time_ms();
    int rc = engine_sampler_sample(sp->smp, logits, tok);
    if (rc == ENGINE_ECANCELED) sp->st->stop = ENGINE_STOP_CANCELED;
    sp->st->sample_ms += engine_time_ms() - t;
    return rc;
}

/* A draw from probs[nv] (or from its positive part minus sub[nv] when sub is non-NULL and that
 * has mass), by the sampler's stream. */
static int32_t spec_draw(engine_sampler *smp, const float *probs, const float *sub, int32_t nv) {
    double sum = 0.0;
    if (sub)
        for (int32_t j = 0; j < nv; j++)
            sum += probs[j] > sub[j] ? (double)probs[j] - sub[j] : 0.0;
    if (!(sum > 0.0)) { /* p == q: never reached by a rejection, guard against rounding */
        sub = NULL;
        sum = 0.0;
        for (int32_t j = 0; j < nv; j++)
            sum += probs[j];
    }
    double r = engine_sampler_uniform(smp) * sum, acc = 0.0;
    int32_t last = 0;
    for (int32_t j = 0; j < nv; j++) {
        double w = sub ? (probs[j] > sub[j] ? (double)probs[j] - sub[j] : 0.0) : probs[j];
        if (w <= 0.0) continue;
        last = j;
        acc += w;
        if (r < acc) return j;
    }
    return last;
}

/* Draft i (for session position pos) from its logits. */
static int spec_draft_pick(spec *sp, int32_t i, int32_t pos, int32_t *tok) {
    const float *l = sp->qlog + (size_t)i * sp->nv;
    if (sp->greedy) {
        int32_t best = 0;
        for (int32_t j = 1; j < sp->nv; j++)
            if (l[j] > l[best]) best = j;
        *tok = best;
        return 0;
    }
    float *q = sp->qprob + (size_t)i * sp->nv;
    int rc = engine_sampler_probs(sp->dsmp, l, q);
    if (rc) return rc;
    if (sp->hooks && sp->hooks->draft_q) sp->hooks->draft_q(sp->hooks->user, pos, q, sp->nv);
    *tok = spec_draw(sp->dsmp, q, NULL, sp->nv);
    return 0;
}

int32_t engine_spec_accept(engine_sampler *smp, const float *p, const float *q, int32_t d,
                           int32_t n_vocab, bool *keep) {
    /* q[d] > 0: d was drawn from q */
    double u = engine_sampler_uniform(smp);
    *keep = u * (double)q[d] < (double)p[d];
    return *keep ? d : spec_draw(smp, p, q, n_vocab);
}

/* Verify draft i (token d) against the target logits: *keep, else *tok is the correction. */
static int spec_verify(spec *sp, int32_t i, const float *logits, int32_t d, bool *keep,
                       int32_t *tok) {
    if (sp->greedy) {
        int rc = spec_sample(sp, logits, tok);
        *keep = rc == 0 && *tok == d;
        return rc;
    }
    double t = engine_time_ms();
    int rc = engine_sampler_probs(sp->smp, logits, sp->pprob);
    if (rc == ENGINE_ECANCELED) sp->st->stop = ENGINE_STOP_CANCELED;
    if (rc == 0)
        *tok = engine_spec_accept(sp->smp, sp->pprob, sp->qprob + (size_t)i * sp->nv, d, sp->nv,
                                  keep);
    sp->st->sample_ms += engine_time_ms() - t;
    return rc;
}

static int spec_append(spec *sp, const int32_t *toks, int32_t n, float *logits_all) {
    double t = engine_time_ms();
    int rc = engine_session_append(sp->s, toks, (size_t)n, logits_all);
    sp->st->decode_ms += engine_time_ms() - t;
    if (rc == 0) sp->st->decode_tokens += n;
    return rc;
}

/* Drop the session's tokens from position keep on (inside the last verify window). */
static int spec_truncate(spec *sp, int32_t keep) {
    if (keep >= sp->s->n_tokens) return 0;
    double t = engine_time_ms();
    int rc = engine_session_truncate(sp->s, keep);
    sp->st->decode_ms += engine_time_ms() - t;
    return rc;
}

/* One draft-verify step after x (emitted, not in the session) with k drafts. On return *x is
 * the next pending token, unless st->stop is set (the session then ends as plain decoding
 * leaves it). */
static int spec_step(spec *sp, int32_t k, int32_t *x) {
    engine_session *s = sp->s;
    engine_gen_stats *st = sp->st;
    int32_t toks[SPEC_MAX_DRAFT + 1];
    toks[0] = *x;
    double t = engine_time_ms();
    int rc = 0;
    for (int32_t i = 0; i < k && rc == 0; i++) {
        rc = engine_q35_mtp_step(s, i, toks[i], sp->qlog + (size_t)i * sp->nv);
        if (rc == 0) rc = spec_draft_pick(sp, i, s->n_tokens + 1 + i, &toks[i + 1]);
        if (rc == 0 && sp->hooks && sp->hooks->draft)
            sp->hooks->draft(sp->hooks->user, s->n_tokens + 1 + i, &toks[i + 1]);
    }
    double dt = engine_time_ms() - t;
    st->draft_ms += dt;
    st->decode_ms += dt;
    if (rc) return rc;
    int32_t n0 = s->n_tokens;
    engine_q35_checkpoint(s);
    if ((rc = spec_append(sp, toks, k + 1, sp->vlog))) return rc;
    st->spec_steps++;
    st->spec_drafted += k;
    for (int32_t i = 0; i < k; i++)
        st->spec_drafted_at[i]++;
    for (int32_t i = 0; i < k; i++) {
        bool keep = false;
        int32_t y = -1;
        if ((rc = spec_verify(sp, i, sp->vlog + (size_t)i * sp->nv, toks[i + 1], &keep, &y)))
            return rc;
        if (!keep) {
            /* the correction replaces d_{i+1}: the session keeps x, d_1 .. d_i */
            if ((rc = spec_truncate(sp, n0 + 1 + i))) return rc;
            if ((rc = spec_emit(sp, y))) return rc;
            *x = y;
            return 0;
        }
        st->spec_accepted++;
        st->spec_accepted_at[i]++;
        if ((rc = spec_emit(sp, toks[i + 1]))) return rc;
        if (st->stop != ENGINE_STOP_NONE) /* a stop token is not kept */
            return spec_truncate(sp, n0 + 1 + i);
        if (st->generated_tokens >= sp->max) { /* kept, as plain decoding appends it */
            st->stop = ENGINE_STOP_LENGTH;
            return spec_truncate(sp, n0 + 2 + i);
        }
    }
    /* every draft kept: the bonus token from the logits after the last */
    int32_t y;
    if ((rc = spec_sample(sp, sp->vlog + (size_t)k * sp->nv, &y))) return rc;
    if ((rc = spec_emit(sp, y))) return rc;
    *x = y;
    return 0;
}

int engine_spec_decode(engine_session *s, const engine_gen_params *p, engine_sampler *smp,
                       engine_gen_text *g, engine_gen_stats *st) {
    return engine_spec_decode_ex(s, p, smp, g, st, NULL);
}

int engine_spec_decode_ex(engine_session *s, const engine_gen_params *p, engine_sampler *smp,
                          engine_gen_text *g, engine_gen_stats *st, const engine_spec_hooks *h) {
    spec sp;
    memset(&sp, 0, sizeof sp);
    sp.hooks = h;
    sp.s = s;
    sp.p = p;
    sp.smp = smp;
    sp.g = g;
    sp.st = st;
    sp.nv = engine_model_n_vocab(s->m);
    sp.max = p->max_tokens > 0 ? p->max_tokens : INT32_MAX;
    sp.greedy = engine_sampler_is_greedy(smp);
    int32_t K = ENGINE_MIN(p->mtp_draft, SPEC_MAX_DRAFT);
    size_t nv = (size_t)sp.nv;
    int rc = 0;
    sp.qlog = malloc(sizeof(float) * nv * (size_t)(2 * K + 2));
    sp.vlog = sp.qlog ? sp.qlog + nv * (size_t)K : NULL;
    if (!sp.greedy) {
        sp.qprob = malloc(sizeof(float) * nv * (size_t)(K + 1));
        sp.pprob = sp.qprob ? sp.qprob + nv * (size_t)K : NULL;
        engine_sampling_params dp = p->sampling;
        dp.logit_bias = NULL;
        dp.n_logit_bias = 0;
        dp.mask = NULL;
        dp.accept = NULL;
        dp.grammar_user = NULL;
        dp.repeat_penalty = 1.0f;
        dp.presence_penalty = dp.frequency_penalty = 0.0f;
        dp.penalty_last_n = 0;
        dp.seed = p->sampling.seed ^ 0x6d74702d64726166ull; /* its own stream */
        if (sp.qprob && (rc = engine_sampler_new(&sp.dsmp, &dp, sp.nv))) goto done;
    }
    if (!sp.qlog || (!sp.greedy && !sp.qprob)) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory for %d MTP drafts", K);
        goto done;
    }
    int32_t x;
    if ((rc = spec_sample(&sp, engine_session_logits(s), &x)) || (rc = spec_emit(&sp, x)))
        goto done;
    for (;;) {
        if (st->stop != ENGINE_STOP_NONE) break;
        if (s->n_tokens >= s->n_ctx) {
            st->stop = ENGINE_STOP_CONTEXT;
            break;
        }
        if (st->generated_tokens >= sp.max) { /* plain decoding appends the last token too */
            rc = spec_append(&sp, &x, 1, NULL);
            st->stop = ENGINE_STOP_LENGTH;
            break;
        }
        int32_t k = ENGINE_MIN(K, ENGINE_MIN(s->n_ctx - s->n_tokens - 1,
                                             sp.max - st->generated_tokens));
        if (k <= 0) { /* no room for drafts: a plain step */
            if ((rc = spec_append(&sp, &x, 1, NULL)) ||
                (rc = spec_sample(&sp, engine_session_logits(s), &x)) ||
                (rc = spec_emit(&sp, x)))
                break;
            continue;
        }
        if ((rc = spec_step(&sp, k, &x))) break;
    }
done:
    engine_sampler_free(sp.dsmp);
    free(sp.qlog);
    free(sp.qprob);
    return rc;
}
