/* Sessions on the shared paged KV pool: a model with a prefix cache gives each session a block
 * table instead of a private contiguous cache, so a session whose prompt starts with a cached
 * prefix computes only the rest. Every function here runs under the model's pool_mu (the lock
 * that already serialises forward passes), which also guards the shared cache.
 *
 * Hybrid models (qwen35moe): the pool holds the KV of the full-attention layers only, plus
 * snapshots of the recurrent layers' state (conv + DeltaNet) kept in tree nodes at chosen
 * block boundaries: after a prompt (engine_kv_session_snapshot) and at the end of a session,
 * each at its last block boundary, copied from the session's own snapshot ring
 * (engine_q35_state_copy). A hit is the longest cached prefix whose node carries a snapshot:
 * its attention blocks come from the tree, the state is restored (engine_q35_state_restore),
 * and the rest is computed, with the same bits as a cold session. */
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
        budget_bytes, 0, 0};
    if (m->q35) {
        /* the attention layers' KV, and half the budget (at least one) for state snapshots */
        int32_t n_attn = 0;
        for (uint32_t l = 0; l < hp->n_layer; l++) n_attn += engine_q35_layer_is_attn(hp, l);
        p.n_layer = n_attn;
        p.snap_bytes = engine_q35_snapshot_bytes(hp);
        size_t ns = budget_bytes / 2 / p.snap_bytes;
        p.n_snaps = (int32_t)ENGINE_MIN(ENGINE_MAX(ns, (size_t)1), (size_t)4096);
        size_t sb = (size_t)p.n_snaps * p.snap_bytes;
        if (n_attn == 0 || budget_bytes <= sb)
            return engine_err(ENGINE_ERANGE, "kv cache: a budget of %zu bytes holds no KV beside "
                              "one recurrent-state snapshot of %zu bytes", budget_bytes,
                              p.snap_bytes);
        p.budget_bytes = budget_bytes - sb;
    }
    int rc = engine_kv_cache_new(&m->kvc, &p);
    if (rc) return rc;
    engine_kv_stats st;
    engine_kv_cache_stats(m->kvc, &st);
    engine_log(ENGINE_LOG_INFO, "prefix cache: KV %s, %d blocks of %d positions (%.1f KiB per "
               "position)%s, %.1f MiB in all", engine_kv_type_name(st.type), (int)st.n_blocks,
               (int)st.block_size, (double)st.block_bytes / st.block_size / 1024,
               st.n_snaps ? " + recurrent-state snapshots" : "",
               (double)st.total_bytes / (1 << 20));
    if (st.n_snaps)
        engine_log(ENGINE_LOG_INFO, "prefix cache: %d snapshot slots of %.2f MiB", (int)st.n_snaps,
                   (double)st.snap_bytes / (1 << 20));
    return 0;
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
    if (s->q35) /* a partial block is of no use without the state at its end */
        engine_kv_session_snapshot(s);
    else
        engine_kv_prefix_insert_tail(s->m->kvc, &s->kvs, s->tokens, s->n_tokens);
    engine_kv_seq_deinit(s->m->kvc, &s->kvs);
}

void engine_kv_session_snapshot(engine_session *s) {
    if (!s->kv_paged || !s->q35) return;
    engine_kv_cache *c = s->m->kvc;
    int32_t b = s->n_tokens / c->p.block_size * c->p.block_size, node;
    void *dst = b > 0 ? engine_kv_snapshot_claim(c, s->tokens, b, &node) : NULL;
    if (dst && engine_q35_state_copy(s, b, dst) != 0) engine_kv_snapshot_drop(c, node);
}

int32_t engine_kv_session_attach(engine_session *s, const int32_t *tokens, int32_t n) {
    engine_kv_match m;
    if (!s->kv_paged || s->n_tokens != 0 || s->kvs.n_pos != 0) return 0;
    engine_kv_cache *c = s->m->kvc;
    engine_kv_seq_release(c, &s->kvs);
    /* the last token is always computed: its logits are the answer */
    if (!s->q35) {
        if (engine_kv_prefix_attach(c, &s->kvs, tokens, n, n - 1, &m) < 0) return 0;
    } else {
        const void *state;
        if (engine_kv_prefix_attach_state(c, &s->kvs, tokens, n, n - 1, &m, &state) < 0)
            return 0;
        if (m.cached_tokens > 0 && engine_q35_state_restore(s, state, m.cached_tokens) != 0) {
            engine_kv_seq_release(c, &s->kvs);
            m.cached_tokens = 0;
        }
    }
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
