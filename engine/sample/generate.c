/* engine_generate: prompt -> prefix reuse -> prefill -> sample/decode loop with streaming
 * text, stop tokens, stop strings and cancellation. Contract in engine.h.
 *
 * Text flow: token -> streaming detokenizer (complete UTF-8 only) -> `pending` -> the part of
 * pending that can no longer begin a stop string is handed to the callback. A stop string is
 * matched across token boundaries because it is searched for in pending, which holds
 * everything not yet emitted. */
#include "model/model_int.h"
#include "sample/spec.h"

#include <string.h>

/* Length of the longest suffix of buf[0..n) that is a proper prefix of a stop string. */
static size_t stop_prefix_tail(const engine_gen_params *p, const char *buf, size_t n) {
    size_t best = 0;
    for (size_t i = 0; i < p->n_stop_strings; i++) {
        const char *st = p->stop_strings[i];
        size_t sl = strlen(st);
        for (size_t k = ENGINE_MIN(sl - 1, n); k > best; k--) {
            if (memcmp(buf + n - k, st, k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

int engine_gen_check_params(const engine_gen_params *p) {
    if (!p || p->version != ENGINE_GEN_PARAMS_VERSION)
        return engine_err(ENGINE_EINVAL, "generate: params missing or of another version");
    if (!p->prompt || p->n_prompt == 0)
        return engine_err(ENGINE_EINVAL, "generate: the prompt is empty (at least one token)");
    for (size_t i = 0; i < p->n_stop_strings; i++)
        if (!p->stop_strings[i] || !p->stop_strings[i][0])
            return engine_err(ENGINE_EINVAL, "generate: stop string %zu is empty", i);
    if (p->n_stop_tokens && !p->stop_tokens)
        return engine_err(ENGINE_EINVAL, "generate: %zu stop tokens but no array",
                          p->n_stop_tokens);
    if (p->n_stop_strings && !p->stop_strings)
        return engine_err(ENGINE_EINVAL, "generate: %zu stop strings but no array",
                          p->n_stop_strings);
    return 0;
}

int engine_gen_text_init(engine_gen_text *g, const engine_model *m, const engine_gen_params *p,
                         engine_token_fn cb, void *user) {
    memset(g, 0, sizeof *g);
    g->m = m;
    g->p = p;
    g->cb = cb;
    g->user = user;
    int rc = engine_detok_new(&g->dt, m->tok, true);
    if (rc) return rc;
    size_t max_stop = 0;
    for (size_t i = 0; i < p->n_stop_strings; i++)
        max_stop = ENGINE_MAX(max_stop, strlen(p->stop_strings[i]));
    if (max_stop) {
        g->cap_pending = 2 * max_stop + 64;
        if (!(g->pending = malloc(g->cap_pending))) {
            engine_gen_text_deinit(g);
            return engine_err(ENGINE_ENOMEM, "out of memory for stop strings");
        }
    }
    return 0;
}

void engine_gen_text_deinit(engine_gen_text *g) {
    engine_detok_free(g->dt);
    free(g->pending);
    g->dt = NULL;
    g->pending = NULL;
}

/* Add text to pending and hand what is safe to the callback. *stopped is set when a stop
 * string appeared (the text before it is emitted, the rest dropped); *cancel when the callback
 * asked to stop. Returns 0 or ENGINE_ENOMEM. */
static int push_text(engine_gen_text *g, const char *text, size_t len, int32_t token,
                     bool *stopped, bool *cancel) {
    const engine_gen_params *p = g->p;
    if (p->n_stop_strings == 0) {
        if (g->cb && g->cb(g->user, text, len, token) != 0) *cancel = true;
        return 0;
    }
    if (g->n_pending + len > g->cap_pending) {
        /* pending holds less than the longest stop string, so this grows only for long pieces */
        size_t need = g->n_pending + len;
        char *nb = realloc(g->pending, need);
        if (!nb) return engine_err(ENGINE_ENOMEM, "out of memory for generated text");
        g->pending = nb;
        g->cap_pending = need;
    }
    memcpy(g->pending + g->n_pending, text, len);
    g->n_pending += len;
    size_t cut = SIZE_MAX;
    for (size_t i = 0; i < p->n_stop_strings; i++) {
        const char *st = p->stop_strings[i];
        size_t sl = strlen(st);
        if (sl > g->n_pending) continue;
        const char *hit = memmem(g->pending, g->n_pending, st, sl);
        if (hit && (size_t)(hit - g->pending) < cut) cut = (size_t)(hit - g->pending);
    }
    if (cut != SIZE_MAX) {
        *stopped = true;
        if (g->cb && g->cb(g->user, g->pending, cut, token) != 0) *cancel = true;
        g->n_pending = 0;
        return 0;
    }
    size_t keep = stop_prefix_tail(p, g->pending, g->n_pending);
    size_t emit = g->n_pending - keep;
    if (g->cb && g->cb(g->user, g->pending, emit, token) != 0) *cancel = true;
    memmove(g->pending, g->pending + emit, keep);
    g->n_pending = keep;
    return 0;
}

static bool is_stop_token(const engine_gen_params *p, int32_t t) {
    for (size_t i = 0; i < p->n_stop_tokens; i++)
        if (p->stop_tokens[i] == t) return true;
    return false;
}

int engine_gen_text_token(engine_gen_text *g, int32_t tok, engine_stop_reason *stop) {
    const engine_gen_params *p = g->p;
    *stop = ENGINE_STOP_NONE;
    bool eog = !p->ignore_eog && engine_model_token_is_eog(g->m, tok);
    if (eog || is_stop_token(p, tok)) {
        *stop = eog ? ENGINE_STOP_EOG : ENGINE_STOP_TOKEN;
        return 0;
    }
    const char *text;
    size_t len;
    int rc = engine_detok_feed(g->dt, tok, &text, &len);
    if (rc) return rc;
    bool stopped = false, cancel = false;
    if ((rc = push_text(g, text, len, tok, &stopped, &cancel))) return rc;
    if (cancel) {
        *stop = ENGINE_STOP_CANCELED;
        return engine_err(ENGINE_ECANCELED, "generation cancelled by the caller");
    }
    if (stopped) *stop = ENGINE_STOP_STRING;
    return 0;
}

int engine_gen_text_finish(engine_gen_text *g, engine_stop_reason *stop) {
    if (*stop == ENGINE_STOP_STRING) return 0;
    const char *text;
    size_t len;
    engine_detok_flush(g->dt, &text, &len);
    bool stopped = false, cancel = false;
    int rc;
    if (len && (rc = push_text(g, text, len, -1, &stopped, &cancel))) return rc;
    if (cancel) {
        *stop = ENGINE_STOP_CANCELED;
        return engine_err(ENGINE_ECANCELED, "generation cancelled by the caller");
    }
    if (stopped) *stop = ENGINE_STOP_STRING;
    if (g->n_pending && g->cb && g->cb(g->user, g->pending, g->n_pending, -1) != 0) {
        *stop = ENGINE_STOP_CANCELED;
        return engine_err(ENGINE_ECANCELED, "generation cancelled by the caller");
    }
    g->n_pending = 0;
    return 0;
}

/* The GPU's draws (engine_session_gpu_generate): each token as the host loop below takes a
 * sampled one, after the step that drew it appended the token before it. With a grammar the
 * GPU draws with its free mask (allow); a token after which the grammar's mask is another
 * (free_mask: 0, or other bits in cmp) ends the stretch: *sw, and the host loop goes on from
 * that token (last), drawn and accepted but not yet appended. */
typedef struct {
    const engine_gen_params *p;
    engine_session *s;
    engine_sampler *smp;
    engine_gen_text *g;
    engine_gen_stats *st;
    int32_t max;
    const uint32_t *allow;
    uint32_t *cmp;
    int32_t n_vocab;
    bool sw;
    int32_t last;
} gpu_tail;

static int gpu_tail_token(void *user, int32_t tok) {
    gpu_tail *t = user;
    engine_gen_stats *st = t->st;
    st->decode_tokens++;                  /* the step appended the token before tok */
    if (st->generated_tokens >= t->max) { /* tok was drawn past the end: dropped */
        st->stop = ENGINE_STOP_LENGTH;
        return 1;
    }
    double ts = engine_time_ms();
    st->generated_tokens++;
    int rc = engine_sampler_accept(t->smp, tok, true);
    if (rc == 0) rc = engine_gen_text_token(t->g, tok, &st->stop);
    st->sample_ms += engine_time_ms() - ts;
    if (rc) return rc;
    if (st->stop != ENGINE_STOP_NONE) return 1;
    if (t->s->n_tokens >= t->s->n_ctx) {
        st->stop = ENGINE_STOP_CONTEXT;
        return 1;
    }
    if (t->allow) {
        int fr = engine_gen_free_still(&t->p->sampling, t->allow, t->cmp, t->n_vocab);
        if (fr < 0) return fr;
        if (fr == 0) {
            t->sw = true;
            t->last = tok;
            return 1;
        }
    }
    return 0;
}

int engine_gen_free_still(const engine_sampling_params *p, const uint32_t *allow, uint32_t *cmp,
                          int32_t n_vocab) {
    const size_t words = ((size_t)n_vocab + 31) / 32;
    int fr = p->free_mask(p->grammar_user, cmp, n_vocab);
    if (fr < 0)
        return engine_err(ENGINE_ECANCELED, "generate: the grammar's free_mask hook aborted");
    return fr == 1 && memcmp(cmp, allow, words * sizeof *cmp) == 0;
}

int engine_generate(engine_session *s, const engine_gen_params *p, engine_token_fn cb,
                    void *user, engine_gen_stats *stats) {
    engine_gen_stats st;
    memset(&st, 0, sizeof st);
    if (stats) *stats = st;
    int rc = engine_gen_check_params(p);
    if (rc) return rc;
    if (p->n_prompt > (size_t)s->n_ctx)
        return engine_err(ENGINE_ERANGE, "the prompt has %zu tokens but the context holds %d",
                          p->n_prompt, s->n_ctx);
    engine_model *m = s->m;
    st.prompt_tokens = (int32_t)p->n_prompt;
    bool mtp_fresh = false; /* MTP just enabled: the cached tokens never fed it */
    if (p->mtp_draft) {
        if (p->mtp_draft < 0 || p->mtp_draft > 4)
            return engine_err(ENGINE_EINVAL, "generate: mtp_draft %d is not in 0..4",
                              p->mtp_draft);
        if (!s->m->q35)
            return engine_err(ENGINE_EUNSUPPORTED,
                              "generate: MTP speculative decoding needs a qwen35moe model with "
                              "an MTP block");
        if ((rc = engine_q35_mtp_enable(s, &mtp_fresh))) return rc;
    }

    engine_sampler *smp = NULL;
    engine_gen_text g;
    bool have_text = false;
    uint32_t *free_bits = NULL; /* a grammar's free mask, and the one after each GPU token */
    rc = engine_sampler_new(&smp, &p->sampling, engine_model_n_vocab(m));
    if (rc) goto done;
    if ((rc = engine_gen_text_init(&g, m, p, cb, user))) goto done;
    have_text = true;

    /* prefix reuse: keep what the session already holds of this prompt, but recompute at least
     * the last prompt token so that its logits are fresh */
    int32_t common = 0, have = s->n_tokens;
    while (common < have && (size_t)common < p->n_prompt && s->tokens[common] == p->prompt[common])
        common++;
    if ((size_t)common == p->n_prompt) common--;
    if (mtp_fresh) common = 0;
    if ((rc = engine_session_truncate(s, common))) goto done;
    st.cached_tokens = common;
    for (size_t i = 0; i < p->n_prompt; i++)
        if ((rc = engine_sampler_accept(smp, p->prompt[i], false))) goto done;
    double t0 = engine_time_ms();
    rc = engine_session_append(s, p->prompt + common, p->n_prompt - (size_t)common, NULL);
    st.prefill_ms = engine_time_ms() - t0;
    if (rc) goto done;
    st.cached_tokens += s->kv_cached; /* served by the model's prefix cache (engine/kv) */

    int32_t max = p->max_tokens > 0 ? p->max_tokens : INT32_MAX;
    if (p->mtp_draft) {
        if ((rc = engine_spec_decode(s, p, smp, &g, &st))) goto done;
    }
    for (; !p->mtp_draft;) {
        if (st.generated_tokens >= max) {
            st.stop = ENGINE_STOP_LENGTH;
            break;
        }
        double ts = engine_time_ms();
        int32_t tok;
        rc = engine_sampler_sample(smp, engine_session_logits(s), &tok);
        if (rc == 0) {
            st.generated_tokens++;
            rc = engine_sampler_accept(smp, tok, true);
        }
        if (rc) {
            if (rc == ENGINE_ECANCELED) st.stop = ENGINE_STOP_CANCELED;
            st.sample_ms += engine_time_ms() - ts;
            goto done;
        }
        rc = engine_gen_text_token(&g, tok, &st.stop);
        st.sample_ms += engine_time_ms() - ts;
        if (rc || st.stop != ENGINE_STOP_NONE) break;
        if (s->n_tokens >= s->n_ctx) {
            st.stop = ENGINE_STOP_CONTEXT;
            break;
        }
        double td = engine_time_ms();
        int fr = engine_session_gpu_draws(s, &p->sampling) ? 1 : 0;
        const int32_t nv = engine_model_n_vocab(m);
        const size_t words = ((size_t)nv + 31) / 32;
        if (fr && p->sampling.mask) { /* a grammar: on the GPU through a free stretch only */
            if (!free_bits && !(free_bits = malloc(2 * words * sizeof *free_bits))) {
                rc = engine_err(ENGINE_ENOMEM, "out of memory for the grammar's mask");
                goto done;
            }
            fr = p->sampling.free_mask(p->sampling.grammar_user, free_bits, nv);
            if (fr < 0) {
                rc = engine_err(ENGINE_ECANCELED, "generate: the grammar's free_mask hook aborted");
                st.stop = ENGINE_STOP_CANCELED;
                goto done;
            }
        }
        if (fr == 1) {
            /* on the GPU: each step appends a token and draws the next, queued ahead of this
             * thread; the steps that append the tokens up to the max (the host loop appends its
             * last one too) */
            const bool gm = p->sampling.mask != NULL;
            gpu_tail t = {
                p,  s,     smp, &g, &st, max, gm ? free_bits : NULL, gm ? free_bits + words : NULL,
                nv, false, -1};
            int64_t steps = (int64_t)max - st.generated_tokens + 1;
            if (steps > s->n_ctx - s->n_tokens) steps = s->n_ctx - s->n_tokens;
            rc = engine_session_gpu_generate(s, tok, (int32_t)steps, &p->sampling, t.allow,
                                             gpu_tail_token, &t);
            /* decode_ms: the loop's wall time (sample_ms, the host's share, ran beside it) */
            st.decode_ms += engine_time_ms() - td;
            if (rc == ENGINE_ECANCELED) st.stop = ENGINE_STOP_CANCELED;
            if (rc) goto done;
            if (!t.sw) {
                if (st.stop == ENGINE_STOP_NONE) st.stop = ENGINE_STOP_LENGTH;
                break;
            }
            tok = t.last; /* the grammar left its free stretch: the host loop from this token */
            td = engine_time_ms();
        }
        rc = engine_session_append(s, &tok, 1, NULL);
        st.decode_ms += engine_time_ms() - td;
        if (rc) goto done;
        st.decode_tokens++;
    }
    /* end of stream: flush a held-back incomplete character and any stop-string prefix */
    if (rc == 0) rc = engine_gen_text_finish(&g, &st.stop);
done:
    if (stats) *stats = st;
    free(free_bits);
    engine_sampler_free(smp);
    if (have_text) engine_gen_text_deinit(&g);
    return rc;
}
