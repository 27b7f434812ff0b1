/* grammar x vocabulary. For each DFA state q (filled on first use), one walk of the vocabulary
 * trie from the stack [unknown caller of q's rule, q] sorts every token into:
 *   accepted  - consumed while q's frame stays on the stack: accepted whatever lies below;
 *   uncertain - consumed only by popping q's frame, with any caller of the rule (an
 *               over-approximation of the real stack below): must be checked at run time;
 *   rejected  - not consumed even with any caller: rejected whatever lies below.
 * The run-time mask is then the union of the accepted sets of the stack tops plus an exact check
 * of the (few) uncertain tokens against the real stacks. */
#include "grammar_int.h"

#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ----- exact checks with shared prefixes ----- */

int grammar_checker_init(grammar_checker *c, const grammar_vocab *v, grammar_store *st,
                         grammar_stepper *sp) {
    memset(c, 0, sizeof *c);
    c->v = v;
    c->st = st;
    c->sp = sp;
    size_t levels = (size_t)v->max_len + 64; /* + trigger slack in lazy checks */
    c->off = malloc((levels + 2) * sizeof *c->off);
    c->mark = malloc((levels + 2) * sizeof *c->mark);
    c->cap_sets = 1024;
    c->sets = malloc(c->cap_sets * sizeof *c->sets);
    if (!c->off || !c->mark || !c->sets) {
        grammar_checker_deinit(c);
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    }
    return 0;
}

void grammar_checker_deinit(grammar_checker *c) {
    free(c->off);
    free(c->mark);
    free(c->sets);
    memset(c, 0, sizeof *c);
}

static int put_level(grammar_checker *c, size_t d, const int32_t *set, size_t n) {
    if (grammar_grow((void **)&c->sets, &c->cap_sets, c->off[d] + n, sizeof *c->sets))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    memcpy(c->sets + c->off[d], set, n * sizeof *set);
    c->off[d + 1] = c->off[d] + n;
    c->mark[d] = c->st->n;
    c->depth = d;
    return 0;
}

int grammar_checker_begin(grammar_checker *c, const int32_t *set, size_t n) {
    c->off[0] = 0;
    c->prev = NULL;
    c->prev_len = 0;
    return put_level(c, 0, set, n);
}

int grammar_checker_try(grammar_checker *c, const uint8_t *bytes, uint32_t len, int shared) {
    uint32_t lcp = 0;
    if (shared && c->prev)
        while (lcp < len && lcp < c->prev_len && lcp < c->depth && bytes[lcp] == c->prev[lcp]) lcp++;
    if (len > c->v->max_len + 63) return grammar_err(GRAMMAR_EINVAL, "input too long to check");
    c->depth = lcp;
    grammar_store_truncate(c->st, c->mark[lcp]);
    c->prev = bytes;
    c->prev_len = len;
    for (uint32_t d = lcp; d < len; d++) {
        size_t n = c->off[d + 1] - c->off[d];
        if (n == 0) break;
        int rc = grammar_stepper_step(c->sp, c->sets + c->off[d], n, bytes[d]);
        if (rc) return rc;
        if ((rc = put_level(c, d + 1, c->sp->out, c->sp->n_out))) return rc;
        if (c->sp->n_out == 0) break;
    }
    return c->depth == len && c->off[len + 1] > c->off[len];
}

void grammar_checker_end(grammar_checker *c) {
    grammar_store_truncate(c->st, c->mark[0]);
    c->prev = NULL;
}

/* ----- the index ----- */

void grammar_index_free(grammar_index *ix) {
    if (!ix) return;
    if (ix->cache)
        for (int32_t q = 0; q < ix->g->n_states; q++) {
            free(ix->cache[q].acc);
            free(ix->cache[q].unc);
        }
    free(ix->cache);
    grammar_stepper_deinit(&ix->sp);
    grammar_store_deinit(&ix->st);
    free(ix->depth_sets);
    free(ix->depth_off);
    free(ix->depth_mark);
    free(ix->tmp_acc);
    free(ix->tmp_unc);
    free(ix->acc_stamp);
    free(ix->pending);
    free(ix->vq);
    free(ix->vp);
    free(ix->virt);
    free(ix->trig_contain);
    free(ix);
}

/* Compare the first n bytes of token `id` with p (a token shorter than n compares as its bytes
 * then "less"). */
static int prefix_cmp(const grammar_vocab *v, int32_t id, const char *p, size_t n) {
    uint32_t l = v->off[id + 1] - v->off[id];
    int c = memcmp(v->bytes + v->off[id], p, l < n ? l : n);
    if (c) return c;
    return l < n ? -1 : 0;
}

static int32_t lower_rank(const grammar_vocab *v, const char *p, size_t n, int upper) {
    int32_t lo = 0, hi = v->n_order;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int c = prefix_cmp(v, v->order[mid], p, n);
        if (c < 0 || (upper && c == 0)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int grammar_index_new(grammar_index **out, const grammar *g, const grammar_vocab *v) {
    if (!out || !g || !v) return grammar_err(GRAMMAR_EINVAL, "grammar_index_new: NULL argument");
    *out = NULL;
    grammar_index *ix = calloc(1, sizeof *ix);
    if (!ix) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    ix->g = g;
    ix->v = v;
    int rc = GRAMMAR_ENOMEM;
    ix->cache = calloc((size_t)g->n_states, sizeof *ix->cache);
    ix->depth_off = malloc(((size_t)v->max_len + 3) * sizeof *ix->depth_off);
    ix->depth_mark = malloc(((size_t)v->max_len + 3) * sizeof *ix->depth_mark);
    ix->acc_stamp = calloc((size_t)v->n_order + 1, sizeof *ix->acc_stamp);
    ix->pending = malloc(((size_t)v->n_nodes + 1) * sizeof *ix->pending);
    ix->vq = malloc(((size_t)v->max_len + 3) * sizeof *ix->vq);
    ix->vp = malloc(((size_t)v->max_len + 3) * sizeof *ix->vp);
    ix->virt = malloc((size_t)v->max_len + 3);
    if (!ix->vq || !ix->vp || !ix->virt) goto fail;
    if (!ix->cache || !ix->depth_off || !ix->depth_mark || !ix->acc_stamp || !ix->pending) goto fail;
    if ((rc = grammar_store_init(&ix->st, 4096))) goto fail;
    if ((rc = grammar_stepper_init(&ix->sp, g, &ix->st))) goto fail;
    for (int t = 0; t < g->n_triggers; t++) {
        const char *s = g->triggers[t];
        size_t l = g->trigger_len[t];
        for (size_t k = 1; k < l; k++) {
            ix->trig_lo[t][k] = lower_rank(v, s + k, l - k, 0);
            ix->trig_hi[t][k] = lower_rank(v, s + k, l - k, 1);
        }
    }
    if (g->n_triggers) {
        size_t cap = 0;
        for (int32_t id = 0; id < v->n_vocab; id++) {
            uint32_t l = v->off[id + 1] - v->off[id];
            for (int t = 0; t < g->n_triggers; t++)
                if (l && memmem(v->bytes + v->off[id], l, g->triggers[t], g->trigger_len[t])) {
                    if (grammar_grow((void **)&ix->trig_contain, &cap, ix->n_trig_contain + 1,
                                     sizeof *ix->trig_contain))
                        goto fail;
                    ix->trig_contain[ix->n_trig_contain++] = id;
                    break;
                }
        }
    }
    *out = ix;
    return 0;
fail:
    if (rc == GRAMMAR_ENOMEM) grammar_err(GRAMMAR_ENOMEM, "out of memory");
    grammar_index_free(ix);
    return rc;
}

static int push_id(int32_t **a, size_t *cap, size_t *n, int32_t v) {
    if (grammar_grow((void **)a, cap, *n + 1, sizeof **a)) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    (*a)[(*n)++] = v;
    return 0;
}

/* One walk of the trie from the stack [caller of q's rule, q]. Pass 1 (no_w): tokens consumed
 * with q's frame kept are accepted. Pass 2 (callers approximated), only through subtrees that
 * hold tokens pass 1 did not accept: consumed ones are uncertain, the others rejected. */
static int walk(grammar_index *ix, int32_t q, int pass, size_t *n_acc, size_t *n_unc) {
    const grammar *g = ix->g;
    const grammar_vocab *v = ix->v;
    grammar_store *st = &ix->st;
    grammar_stepper *sp = &ix->sp;
    int rc = 0;
    sp->no_w = pass == 1;
    grammar_store_truncate(st, 2);
    int32_t p0 = grammar_store_intern(st, GQ_P0, g->state_rule[q]);
    int32_t top = p0 >= 0 ? grammar_store_intern(st, q, p0) : -1;
    if (top < 0) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    if (grammar_grow((void **)&ix->depth_sets, &ix->cap_depth_sets, 1, sizeof *ix->depth_sets))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    ix->depth_sets[0] = top;
    ix->depth_off[0] = 0;
    ix->depth_off[1] = 1;
    ix->depth_mark[0] = st->n;
    ix->virt[0] = 0;
    int32_t i = 0;
    while (i < v->n_nodes) {
        uint32_t d = v->tn_depth[i];
        if ((d == 1 && grammar_next(g, q, v->tn_byte[i]) < 0) ||
            (pass == 2 && ix->pending[v->tn_skip[i]] == ix->pending[i])) {
            i = v->tn_skip[i];
            continue;
        }
        grammar_store_truncate(st, ix->depth_mark[d - 1]);
        uint8_t b = v->tn_byte[i];
        /* fast path: one stack whose next state only consumes bytes (no call, no return):
         * the level is the pair (state, caller), nothing interned */
        int32_t pq = -1, pp = -1;
        size_t so = ix->depth_off[d - 1], n = ix->depth_off[d] - so;
        if (ix->virt[d - 1]) {
            pq = ix->vq[d - 1], pp = ix->vp[d - 1];
        } else if (n == 1 && st->q[ix->depth_sets[so]] >= 0) {
            pq = st->q[ix->depth_sets[so]], pp = st->parent[ix->depth_sets[so]];
        }
        if (pq >= 0) {
            int32_t t = grammar_next(g, pq, b);
            if (t < 0) {
                i = v->tn_skip[i];
                continue;
            }
            if (g->has_bytes[t] && !g->final[t] && g->ref_off[t] == g->ref_off[t + 1]) {
                ix->virt[d] = 1;
                ix->vq[d] = t;
                ix->vp[d] = pp;
                ix->depth_off[d + 1] = ix->depth_off[d];
                ix->depth_mark[d] = st->n;
                goto classify;
            }
        }
        {
            int32_t one;
            const int32_t *in = ix->depth_sets + so;
            if (ix->virt[d - 1]) {
                one = grammar_store_intern(st, pq, pp);
                if (one < 0) {
                    rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
                    break;
                }
                in = &one;
                n = 1;
            }
            if ((rc = grammar_stepper_step(sp, in, n, b))) break;
        }
        if (sp->n_out == 0) {
            i = v->tn_skip[i];
            continue;
        }
        size_t base = ix->depth_off[d];
        if (grammar_grow((void **)&ix->depth_sets, &ix->cap_depth_sets, base + sp->n_out,
                         sizeof *ix->depth_sets)) {
            rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            break;
        }
        memcpy(ix->depth_sets + base, sp->out, sp->n_out * sizeof *sp->out);
        ix->depth_off[d + 1] = base + sp->n_out;
        ix->depth_mark[d] = st->n;
        ix->virt[d] = 0;
    classify:;
        int32_t r0 = v->tn_rank[i], nr = v->tn_nrank[i];
        for (int32_t r = r0; r < r0 + nr && !rc; r++) {
            if (pass == 1) {
                ix->acc_stamp[r] = ix->build_stamp;
                rc = push_id(&ix->tmp_acc, &ix->cap_tmp_acc, n_acc, v->order[r]);
            } else if (ix->acc_stamp[r] != ix->build_stamp) {
                rc = push_id(&ix->tmp_unc, &ix->cap_tmp_unc, n_unc, r);
            }
        }
        if (rc) break;
        i++;
    }
    sp->no_w = 0;
    grammar_store_truncate(st, 2);
    return rc;
}

static int build_state(grammar_index *ix, int32_t q) {
    const grammar_vocab *v = ix->v;
    grammar_state_cache *c = &ix->cache[q];
    double t0 = now_ms();
    size_t n_acc = 0, n_unc = 0;
    if (++ix->build_stamp == 0) {
        memset(ix->acc_stamp, 0, (size_t)v->n_order * sizeof *ix->acc_stamp);
        ix->build_stamp = 1;
    }
    int rc = walk(ix, q, 1, &n_acc, &n_unc);
    if (rc) return rc;
    /* pending[k] = token ends before trie node k that pass 1 did not accept, over the span of
     * the first bytes q accepts (the only subtrees pass 2 enters) */
    int32_t lo = -1, hi = 0;
    for (int32_t i = 0; i < v->n_nodes; i = v->tn_skip[i])
        if (grammar_next(ix->g, q, v->tn_byte[i]) >= 0) {
            if (lo < 0) lo = i;
            hi = v->tn_skip[i];
        }
    int32_t cnt = 0;
    for (int32_t i = lo < 0 ? 0 : lo; i < hi; i++) {
        ix->pending[i] = cnt;
        for (int32_t r = v->tn_rank[i]; r < v->tn_rank[i] + v->tn_nrank[i]; r++)
            if (ix->acc_stamp[r] != ix->build_stamp) {
                cnt++;
                break;
            }
    }
    ix->pending[hi] = cnt;
    if ((rc = walk(ix, q, 2, &n_acc, &n_unc))) return rc;
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    if (n_acc > words) {
        c->dense = 1;
        c->acc = calloc(words, sizeof *c->acc);
        if (!c->acc) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
        for (size_t k = 0; k < n_acc; k++) c->acc[ix->tmp_acc[k] / 32] |= 1u << (ix->tmp_acc[k] % 32);
        ix->bytes_used += words * sizeof *c->acc;
    } else if (n_acc) {
        c->acc = malloc(n_acc * sizeof *c->acc);
        if (!c->acc) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
        for (size_t k = 0; k < n_acc; k++) c->acc[k] = (uint32_t)ix->tmp_acc[k];
        ix->bytes_used += n_acc * sizeof *c->acc;
    }
    c->n_acc = (uint32_t)n_acc;
    if (n_unc) {
        c->unc = malloc(n_unc * sizeof *c->unc);
        if (!c->unc) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
        memcpy(c->unc, ix->tmp_unc, n_unc * sizeof *c->unc);
        ix->bytes_used += n_unc * sizeof *c->unc;
    }
    c->n_unc = (uint32_t)n_unc;
    c->built = 1;
    ix->build_ms += now_ms() - t0;
    return 0;
}

int grammar_index_state(grammar_index *ix, int32_t q, const grammar_state_cache **out) {
    if (!ix->cache[q].built) {
        int rc = build_state(ix, q);
        if (rc) return rc;
    }
    *out = &ix->cache[q];
    return 0;
}

int grammar_index_precompute(grammar_index *ix) {
    if (!ix) return grammar_err(GRAMMAR_EINVAL, "NULL index");
    for (int32_t q = 0; q < ix->g->n_states; q++)
        if (ix->g->has_bytes[q] && !ix->cache[q].built) {
            int rc = build_state(ix, q);
            if (rc) return rc;
        }
    return 0;
}

double grammar_index_build_ms(const grammar_index *ix) {
    return ix ? ix->build_ms : 0;
}

size_t grammar_index_bytes(const grammar_index *ix) {
    return ix ? ix->bytes_used : 0;
}
