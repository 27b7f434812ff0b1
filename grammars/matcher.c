/* The matcher: parse-stack sets per byte with history (rollback = truncation), lazy triggers,
 * and the token mask (per-state caches + exact checks of the uncertain tokens + a small memo of
 * recent masks keyed by the exact stack contents). */
#include "grammar_int.h"

#include <string.h>

static int push_set(grammar_matcher *m, const int32_t *set, size_t n) {
    if (grammar_grow((void **)&m->sets, &m->cap_sets, m->n_sets + n + 1, sizeof *m->sets))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    size_t cap = m->cap_pos;
    if (grammar_grow((void **)&m->pos_off, &cap, m->n_pos + 2, sizeof *m->pos_off))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    cap = m->cap_pos;
    if (grammar_grow((void **)&m->pos_mark, &cap, m->n_pos + 2, sizeof *m->pos_mark))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    m->cap_pos = cap;
    if (n) memcpy(m->sets + m->n_sets, set, n * sizeof *set);
    m->pos_off[m->n_pos] = m->n_sets;
    m->n_sets += n;
    m->pos_off[m->n_pos + 1] = m->n_sets;
    m->pos_mark[m->n_pos] = m->st.n;
    m->n_pos++;
    return 0;
}

/* Back to n_pos sets (frames made after them dropped). */
static void pop_to(grammar_matcher *m, size_t n_pos) {
    m->n_pos = n_pos;
    m->n_sets = n_pos ? m->pos_off[n_pos] : 0;
    grammar_store_truncate(&m->st, n_pos ? m->pos_mark[n_pos - 1] : m->base_mark);
}

static const int32_t *cur_set(const grammar_matcher *m, size_t *n) {
    *n = m->pos_off[m->n_pos] - m->pos_off[m->n_pos - 1];
    return m->sets + m->pos_off[m->n_pos - 1];
}

static int start_grammar(grammar_matcher *m) {
    int rc = grammar_stepper_start(&m->sp, m->g->root, -1);
    if (rc) return rc;
    return push_set(m, m->sp.out, m->sp.n_out);
}

/* Feed bytes to the active grammar; on failure, everything fed here is undone. */
static int feed(grammar_matcher *m, const uint8_t *b, size_t n) {
    size_t start = m->n_pos;
    for (size_t i = 0; i < n; i++) {
        size_t k;
        const int32_t *s = cur_set(m, &k);
        int rc = grammar_stepper_step(&m->sp, s, k, b[i]);
        if (rc == 0 && m->sp.n_out == 0)
            rc = grammar_err(GRAMMAR_EREJECT, "byte 0x%02x not allowed here", b[i]);
        if (rc == 0) rc = push_set(m, m->sp.out, m->sp.n_out);
        if (rc) {
            pop_to(m, start);
            return rc;
        }
    }
    return 0;
}

void grammar_matcher_free(grammar_matcher *m) {
    if (!m) return;
    grammar_checker_deinit(&m->ck);
    grammar_stepper_deinit(&m->sp);
    grammar_store_deinit(&m->st);
    free(m->eog);
    free(m->sets);
    free(m->pos_off);
    free(m->pos_mark);
    free(m->tok_pos);
    free(m->tok_text);
    free(m->tok_eog);
    free(m->text);
    free(m->unc);
    free(m->hs);
    for (int i = 0; i < GRAMMAR_MEMO_SLOTS; i++) free(m->memo[i].bits);
    free(m);
}

void grammar_matcher_reset(grammar_matcher *m) {
    if (!m) return;
    m->n_tok = 0;
    m->n_text = 0;
    m->finished = 0;
    pop_to(m, 0);
    if (m->g->n_triggers == 0) start_grammar(m); /* cannot fail: it succeeded in _new */
}

int grammar_matcher_new(grammar_matcher **out, grammar_index *ix, const int32_t *eog_ids,
                        int n_eog) {
    if (!out || !ix || n_eog < 0 || (n_eog && !eog_ids))
        return grammar_err(GRAMMAR_EINVAL, "grammar_matcher_new: bad arguments");
    *out = NULL;
    grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    m->ix = ix;
    m->g = ix->g;
    m->v = ix->v;
    int rc = grammar_store_init(&m->st, 4096);
    if (!rc) rc = grammar_stepper_init(&m->sp, m->g, &m->st);
    if (!rc) rc = grammar_checker_init(&m->ck, m->v, &m->st, &m->sp);
    if (rc) goto fail;
    if (n_eog) {
        m->eog = malloc((size_t)n_eog * sizeof *m->eog);
        if (!m->eog) goto oom;
        for (int i = 0; i < n_eog; i++) {
            if (eog_ids[i] < 0 || eog_ids[i] >= m->v->n_vocab) {
                rc = grammar_err(GRAMMAR_EINVAL, "end-of-generation id %d outside the vocabulary",
                                 eog_ids[i]);
                goto fail;
            }
            m->eog[i] = eog_ids[i];
        }
        m->n_eog = n_eog;
    }
    size_t words = ((size_t)m->v->n_vocab + 31) / 32;
    for (int i = 0; i < GRAMMAR_MEMO_SLOTS; i++) {
        m->memo[i].bits = malloc(words * sizeof(uint32_t));
        if (!m->memo[i].bits) goto oom;
    }
    m->base_mark = m->st.n;
    if (m->g->n_triggers == 0 && (rc = start_grammar(m))) goto fail;
    *out = m;
    return 0;
oom:
    rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
fail:
    grammar_matcher_free(m);
    return rc;
}

static int is_eog(const grammar_matcher *m, int32_t t) {
    for (int i = 0; i < m->n_eog; i++)
        if (m->eog[i] == t) return 1;
    return 0;
}

static int set_complete(const grammar_matcher *m) {
    size_t n;
    const int32_t *s = cur_set(m, &n);
    for (size_t i = 0; i < n; i++)
        if (s[i] == 0) return 1;
    return 0;
}

bool grammar_matcher_is_complete(const grammar_matcher *m) {
    if (!m || m->finished) return false;
    if (m->n_pos == 0) return true; /* lazy, not triggered: free text may end anywhere */
    return set_complete(m);
}

bool grammar_matcher_is_finished(const grammar_matcher *m) {
    return m && m->finished;
}

int grammar_matcher_n_tokens(const grammar_matcher *m) {
    return m ? (int)m->n_tok : 0;
}

static int push_token(grammar_matcher *m, size_t pos, size_t text, int eog) {
    size_t cap = m->cap_tok;
    if (grammar_grow((void **)&m->tok_pos, &cap, m->n_tok + 1, sizeof *m->tok_pos))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    cap = m->cap_tok;
    if (grammar_grow((void **)&m->tok_text, &cap, m->n_tok + 1, sizeof *m->tok_text))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    cap = m->cap_tok;
    if (grammar_grow((void **)&m->tok_eog, &cap, m->n_tok + 1, 1))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    m->cap_tok = cap;
    m->tok_pos[m->n_tok] = pos;
    m->tok_text[m->n_tok] = text;
    m->tok_eog[m->n_tok] = (uint8_t)eog;
    m->n_tok++;
    return 0;
}

/* Earliest trigger occurrence in text[from..n) that ends after `after`; -1 if none. */
static long find_trigger(const grammar *g, const uint8_t *text, size_t n, size_t after) {
    long best = -1;
    for (int t = 0; t < g->n_triggers; t++) {
        size_t l = g->trigger_len[t];
        size_t from = after >= l - 1 ? after - (l - 1) : 0;
        if (n < from + l) continue;
        const uint8_t *p = memmem(text + from, n - from, g->triggers[t], l);
        if (p && (best < 0 || p - text < best)) best = p - text;
    }
    return best;
}

/* Free-text bytes while not triggered: append, and switch the grammar on at a trigger. */
static int accept_lazy(grammar_matcher *m, const uint8_t *b, size_t n) {
    size_t old = m->n_text;
    if (n == 0) return 0;
    if (grammar_grow((void **)&m->text, &m->cap_text, old + n, 1))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    memcpy(m->text + old, b, n);
    m->n_text = old + n;
    long at = find_trigger(m->g, m->text, m->n_text, old);
    if (at < 0) return 0;
    int rc = start_grammar(m);
    if (rc == 0) rc = feed(m, m->text + at, m->n_text - (size_t)at);
    if (rc) {
        pop_to(m, 0);
        m->n_text = old;
    }
    return rc;
}

static int accept_raw(grammar_matcher *m, const uint8_t *b, size_t n) {
    if (m->finished) return grammar_err(GRAMMAR_EREJECT, "the matcher has finished");
    size_t pos = m->n_pos, text = m->n_text;
    int rc = m->n_pos == 0 ? accept_lazy(m, b, n) : feed(m, b, n);
    if (rc) return rc;
    rc = push_token(m, pos, text, 0);
    if (rc) {
        pop_to(m, pos);
        m->n_text = text;
    }
    return rc;
}

int grammar_matcher_accept(grammar_matcher *m, int32_t token) {
    if (!m) return grammar_err(GRAMMAR_EINVAL, "NULL matcher");
    if (token < 0 || token >= m->v->n_vocab)
        return grammar_err(GRAMMAR_EINVAL, "token %d outside the vocabulary", token);
    if (m->finished) return grammar_err(GRAMMAR_EREJECT, "the matcher has finished");
    if (is_eog(m, token)) {
        if (!grammar_matcher_is_complete(m))
            return grammar_err(GRAMMAR_EREJECT, "end of generation before the grammar is complete");
        int rc = push_token(m, m->n_pos, m->n_text, 1);
        if (rc) return rc;
        m->finished = 1;
        return 0;
    }
    uint32_t l = m->v->off[token + 1] - m->v->off[token];
    if (l == 0) return grammar_err(GRAMMAR_EREJECT, "token %d is never allowed", token);
    return accept_raw(m, m->v->bytes + m->v->off[token], l);
}

int grammar_matcher_accept_bytes(grammar_matcher *m, const void *bytes, size_t n) {
    if (!m || (n && !bytes)) return grammar_err(GRAMMAR_EINVAL, "bad arguments");
    return accept_raw(m, bytes, n);
}

int grammar_matcher_rollback(grammar_matcher *m, int n) {
    if (!m || n < 0 || (size_t)n > m->n_tok)
        return grammar_err(GRAMMAR_EINVAL, "cannot roll back %d of %zu tokens", n,
                           m ? m->n_tok : 0);
    if (n == 0) return 0;
    size_t k = m->n_tok - (size_t)n;
    pop_to(m, m->tok_pos[k]);
    m->n_text = m->tok_text[k];
    m->n_tok = k;
    m->finished = 0;
    return 0;
}

/* Sum of the shortest completions of every frame of the stack under node id. */
static uint64_t stack_dist(const grammar_matcher *m, int32_t id) {
    uint64_t d = 0;
    for (int32_t x = id; x >= 0; x = m->st.parent[x]) {
        int32_t q = m->st.q[x];
        if (q < 0) return d;
        d += m->g->dist[q];
    }
    return d;
}

uint32_t grammar_matcher_distance(const grammar_matcher *m) {
    if (!m || m->finished) return 0;
    if (m->n_pos == 0) return 0;
    size_t n;
    const int32_t *s = cur_set(m, &n);
    uint64_t best = UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        uint64_t d = stack_dist(m, s[i]);
        if (d < best) best = d;
    }
    return best >= GRAMMAR_DIST_INF ? UINT32_MAX : (uint32_t)best;
}

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t grammar_matcher_state_hash(const grammar_matcher *m) {
    if (!m) return 0;
    uint64_t h = mix(0x5eed, (uint64_t)m->finished);
    if (m->n_pos == 0) {
        h = mix(h, 0x1a2b);
        for (size_t i = 0; i < m->n_text; i++) h = mix(h, m->text[i]);
        return h;
    }
    size_t n;
    const int32_t *s = cur_set(m, &n);
    uint64_t acc = 0, x = 0;
    for (size_t i = 0; i < n; i++) { /* order-independent */
        uint64_t e = m->st.h[s[i]];
        acc += e;
        x ^= e * 0x9e3779b97f4a7c15ull;
    }
    return mix(mix(h, acc), x);
}

/* ----- masks ----- */

static void set_eog_bits(const grammar_matcher *m, uint32_t *allowed) {
    for (int i = 0; i < m->n_eog; i++) allowed[m->eog[i] / 32] |= 1u << (m->eog[i] % 32);
}

static void clear_eog_bits(const grammar_matcher *m, uint32_t *allowed) {
    for (int i = 0; i < m->n_eog; i++) allowed[m->eog[i] / 32] &= ~(1u << (m->eog[i] % 32));
}

/* Would the token be accepted while untriggered? Only called for tokens that complete a
 * trigger. 1 yes, 0 no, < 0 error. */
static int lazy_try(grammar_matcher *m, int32_t tok) {
    const grammar_vocab *v = m->v;
    uint8_t small[64 + 1024];
    size_t keep = m->n_text < 63 ? m->n_text : 63;
    uint32_t l = v->off[tok + 1] - v->off[tok];
    uint8_t *win = l <= 1024 ? small : malloc(keep + l); /* only for giant tokens */
    if (!win) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    if (keep) memcpy(win, m->text + m->n_text - keep, keep);
    memcpy(win + keep, v->bytes + v->off[tok], l);
    long at = find_trigger(m->g, win, keep + l, keep);
    int rc = 1;
    if (at >= 0) {
        size_t mark = m->st.n;
        rc = grammar_stepper_start(&m->sp, m->g->root, -1);
        if (rc == 0) rc = grammar_checker_begin(&m->ck, m->sp.out, m->sp.n_out);
        if (rc == 0) rc = grammar_checker_try(&m->ck, win + at, (uint32_t)(keep + l - (size_t)at), 0);
        grammar_store_truncate(&m->st, mark);
    }
    if (win != small) free(win);
    return rc;
}

static int mask_lazy(grammar_matcher *m, uint32_t *allowed, size_t words) {
    const grammar_index *ix = m->ix;
    const grammar *g = m->g;
    memcpy(allowed, m->v->nonempty, words * sizeof *allowed);
    for (size_t i = 0; i < ix->n_trig_contain; i++) {
        int32_t t = ix->trig_contain[i];
        int ok = lazy_try(m, t);
        if (ok < 0) return ok;
        if (!ok) allowed[t / 32] &= ~(1u << (t % 32));
    }
    for (int t = 0; t < g->n_triggers; t++) {
        size_t l = g->trigger_len[t];
        for (size_t k = 1; k < l && k <= m->n_text; k++) {
            if (memcmp(m->text + m->n_text - k, g->triggers[t], k) != 0) continue;
            for (int32_t r = ix->trig_lo[t][k]; r < ix->trig_hi[t][k]; r++) {
                int32_t id = m->v->order[r];
                int ok = lazy_try(m, id);
                if (ok < 0) return ok;
                if (!ok) allowed[id / 32] &= ~(1u << (id % 32));
            }
        }
    }
    clear_eog_bits(m, allowed);
    set_eog_bits(m, allowed);
    return 0;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* The exact stacks as a key: per stack (ordered by structural hash) its states to the bottom. */
static int memo_key(grammar_matcher *m, const int32_t *s, size_t n, uint64_t *hout) {
    if (n == 0 || n > 0xffff) return -1; /* nothing to remember / not indexable below */
    if (grammar_grow((void **)&m->hs, &m->cap_hs, n, sizeof *m->hs)) return -1;
    for (size_t i = 0; i < n; i++) m->hs[i] = ((uint64_t)(uint32_t)i) | (m->st.h[s[i]] & ~0xffffull);
    qsort(m->hs, n, sizeof *m->hs, cmp_u64);
    int32_t len = 0;
    uint64_t h = 0x6d656d6f;
    for (size_t i = 0; i < n; i++) {
        int32_t id = s[m->hs[i] & 0xffff];
        for (int32_t x = id; x >= 0; x = m->st.parent[x]) {
            if (len >= GRAMMAR_MEMO_KEY - 1) return -1;
            m->memo_key[len++] = m->st.q[x];
            h = mix(h, (uint64_t)(uint32_t)m->st.q[x]);
            if (m->st.q[x] < 0) break;
        }
        if (len >= GRAMMAR_MEMO_KEY - 1) return -1;
        m->memo_key[len++] = INT32_MIN;
        h = mix(h, 0xabcdef);
    }
    *hout = h;
    return len;
}

int grammar_matcher_mask(grammar_matcher *m, uint32_t *allowed, int32_t n_vocab) {
    if (!m || !allowed || n_vocab != m->v->n_vocab)
        return grammar_err(GRAMMAR_EINVAL, "mask: n_vocab %d, vocabulary has %d", n_vocab,
                           m ? m->v->n_vocab : 0);
    size_t words = ((size_t)n_vocab + 31) / 32;
    if (m->finished) {
        memset(allowed, 0, words * sizeof *allowed);
        return 0;
    }
    if (m->n_pos == 0) return mask_lazy(m, allowed, words);
    size_t n;
    const int32_t *s = cur_set(m, &n);
    uint64_t h = 0;
    int klen = memo_key(m, s, n, &h);
    grammar_memo *slot = klen > 0 ? &m->memo[h % GRAMMAR_MEMO_SLOTS] : NULL;
    if (slot && slot->used && slot->h == h && slot->key_len == klen &&
        memcmp(slot->key, m->memo_key, (size_t)klen * sizeof *m->memo_key) == 0) {
        memcpy(allowed, slot->bits, words * sizeof *allowed);
        m->memo_hits++;
        return 0;
    }
    m->memo_misses++;
    memset(allowed, 0, words * sizeof *allowed);
    size_t n_unc = 0;
    int lists = 0, complete = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t q = m->st.q[s[i]];
        if (q < 0) {
            complete = 1;
            continue;
        }
        const grammar_state_cache *c;
        int rc = grammar_index_state(m->ix, q, &c);
        if (rc) return rc;
        if (c->dense) {
            for (size_t w = 0; w < words; w++) allowed[w] |= c->acc[w];
        } else {
            for (uint32_t k = 0; k < c->n_acc; k++) allowed[c->acc[k] / 32] |= 1u << (c->acc[k] % 32);
        }
        if (c->n_unc) {
            if (grammar_grow((void **)&m->unc, &m->cap_unc, n_unc + c->n_unc, sizeof *m->unc))
                return grammar_err(GRAMMAR_ENOMEM, "out of memory");
            memcpy(m->unc + n_unc, c->unc, c->n_unc * sizeof *c->unc);
            n_unc += c->n_unc;
            lists++;
        }
    }
    if (n_unc) {
        if (lists > 1) {
            qsort(m->unc, n_unc, sizeof *m->unc, cmp_i32);
            size_t k = 0;
            for (size_t i = 0; i < n_unc; i++)
                if (k == 0 || m->unc[k - 1] != m->unc[i]) m->unc[k++] = m->unc[i];
            n_unc = k;
        }
        const grammar_vocab *v = m->v;
        int rc = grammar_checker_begin(&m->ck, s, n);
        if (rc) return rc;
        for (size_t i = 0; i < n_unc; i++) {
            int32_t id = v->order[m->unc[i]];
            if (allowed[id / 32] & (1u << (id % 32))) continue;
            int ok = grammar_checker_try(&m->ck, v->bytes + v->off[id], v->off[id + 1] - v->off[id], 1);
            if (ok < 0) {
                grammar_checker_end(&m->ck);
                return ok;
            }
            if (ok) allowed[id / 32] |= 1u << (id % 32);
        }
        grammar_checker_end(&m->ck);
    }
    clear_eog_bits(m, allowed); /* an end-of-generation id with bytes is only allowed as such */
    if (complete) set_eog_bits(m, allowed);
    if (slot) {
        slot->used = 1;
        slot->h = h;
        slot->key_len = klen;
        memcpy(slot->key, m->memo_key, (size_t)klen * sizeof *m->memo_key);
        memcpy(slot->bits, allowed, words * sizeof *allowed);
    }
    return 0;
}

int grammar_matcher_mask_naive(grammar_matcher *m, uint32_t *allowed, int32_t n_vocab) {
    if (!m || !allowed || n_vocab != m->v->n_vocab)
        return grammar_err(GRAMMAR_EINVAL, "mask: n_vocab %d, vocabulary has %d", n_vocab,
                           m ? m->v->n_vocab : 0);
    size_t words = ((size_t)n_vocab + 31) / 32;
    if (m->finished || m->n_pos == 0) return grammar_matcher_mask(m, allowed, n_vocab);
    memset(allowed, 0, words * sizeof *allowed);
    size_t n;
    const int32_t *s = cur_set(m, &n);
    const grammar_vocab *v = m->v;
    int rc = grammar_checker_begin(&m->ck, s, n);
    if (rc) return rc;
    for (int32_t id = 0; id < n_vocab; id++) {
        uint32_t l = v->off[id + 1] - v->off[id];
        if (!l) continue;
        int ok = grammar_checker_try(&m->ck, v->bytes + v->off[id], l, 0);
        if (ok < 0) {
            grammar_checker_end(&m->ck);
            return ok;
        }
        if (ok) allowed[id / 32] |= 1u << (id % 32);
    }
    grammar_checker_end(&m->ck);
    clear_eog_bits(m, allowed);
    if (set_complete(m)) set_eog_bits(m, allowed);
    return 0;
}

int grammar_sampler_mask(void *user, uint32_t *allowed, int32_t n_vocab) {
    return grammar_matcher_mask(user, allowed, n_vocab);
}

int grammar_sampler_free(void *user, uint32_t *allowed, int32_t n_vocab) {
    grammar_matcher *m = user;
    if (!m || m->finished || m->n_pos != 0) return 0; /* triggered, or not lazy */
    const grammar *g = m->g;
    for (int t = 0; t < g->n_triggers; t++) /* the text ends in a trigger's beginning */
        for (size_t k = 1; k < g->trigger_len[t] && k <= m->n_text; k++)
            if (memcmp(m->text + m->n_text - k, g->triggers[t], k) == 0) return 0;
    if (!allowed) return 1;
    int rc = grammar_matcher_mask(m, allowed, n_vocab);
    return rc < 0 ? rc : 1;
}

int grammar_sampler_accept(void *user, int32_t token) {
    return grammar_matcher_accept(user, token);
}
