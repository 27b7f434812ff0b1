/* Sessions on the shared paged KV pool: a model with a prefix cache gives each session a block
 * table instead of a private contiguous cache, so a session whose prompt starts with a cached
 * prefix computes only the rest. Every function here runs under the model's pool_mu (the lock
 * that already serialises forward passes), which also guards the shared cache. */
#include <string.h>

#include "common.h"
#include "kv/kv.h"
#include "model/model_int.h"

int engine_kv_model_enable(engine_model *m, size_t budget_bytes, engine_kv_type type) {
    if (m->info.vocab_only)
        return engine_err(ENGINE_EINVAL, "%s was loaded for its vocabulary only", m->path);
    pthread_mutex_lock(&m->pool_mu);
    int busy = m->n_sessions > 0 || m->kvc;
    pthread_mutex_unlock(&m->pool_mu);
    if (busy)
        return engine_err(ENGINE_EINVAL, "the prefix cache is enabled once, before any session");
    const engine_hparams *hp = &m->hp;
    engine_kv_params p = {
        (int32_t)hp->n_layer, (int32_t)hp->n_head_kv, (int32_t)hp->head_dim_k, type, 0,
        budget_bytes};
    return engine_kv_cache_new(&m->kvc, &p);
}

int engine_kv_session_init(engine_session *s) {
    engine_model *m = s->m;
    s->kv_paged = m->kvc && m->kvc->p.type == s->kv_type;
    if (!s->kv_paged) return 0;
    return engine_kv_seq_init(m->kvc, &s->kvs, s->n_ctx);
}

void engine_kv_session_deinit(engine_session *s) {
    if (!s->kv_paged) return;
    engine_kv_session_commit(s);
    engine_kv_prefix_insert_tail(s->m->kvc, &s->kvs, s->tokens, s->n_tokens);
    engine_kv_seq_deinit(s->m->kvc, &s->kvs);
}

int32_t engine_kv_session_attach(engine_session *s, const int32_t *tokens, int32_t n) {
    engine_kv_match m;
    if (!s->kv_paged || s->n_tokens != 0 || s->kvs.n_pos != 0) return 0;
    engine_kv_seq_release(s->m->kvc, &s->kvs);
    /* the last token is always computed: its logits are the answer */
    if (engine_kv_prefix_attach(s->m->kvc, &s->kvs, tokens, n, n - 1, &m) < 0) return 0;
    s->kv_diverged_at = m.diverged_at;
    return m.cached_tokens;
}

int engine_kv_session_reserve(engine_session *s, int32_t n_pos) {
    if (!s->kv_paged) return 0;
    if (s->kvs.n_pos > s->n_tokens) engine_kv_seq_truncate(s->m->kvc, &s->kvs, s->n_tokens);
    return engine_kv_seq_extend(s->m->kvc, &s->kvs, n_pos);
}

void engine_kv_session_commit(engine_session *s) {
    if (!s->kv_paged) return;
    /* positions beyond n_tokens were reserved for a forward that failed */
    if (s->kvs.n_pos > s->n_tokens) engine_kv_seq_truncate(s->m->kvc, &s->kvs, s->n_tokens);
    int32_t full = s->n_tokens / s->m->kvc->p.block_size;
    if (full == s->kv_committed) return;
    engine_kv_prefix_insert(s->m->kvc, &s->kvs, s->tokens, s->n_tokens);
    s->kv_committed = full;
}

void engine_kv_session_truncate(engine_session *s, int32_t n) {
    if (!s->kv_paged) return;
    engine_kv_seq_truncate(s->m->kvc, &s->kvs, n);
    int32_t full = n / s->m->kvc->p.block_size;
    if (s->kv_committed > full) s->kv_committed = full;
}
