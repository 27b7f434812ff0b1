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
    free(ix->rep);
    free(ix->sub_key);
    free(ix->sub_val);
    free(ix->sub_ids);
    grammar_stepper_deinit(&ix->sp);
    grammar_store_deinit(&ix->st);
    free(ix->depth_sets);
    free(ix->depth_off);
    free(ix->depth_mark);
    free(ix->tmp_acc);
    free(ix->tmp_unc);
    free(ix->acc_stamp);
    free(ix->full_stamp);
    free(ix->full_kids);
    free(ix->visited);
    free(ix->vq);
    free(ix->vp);
    free(ix->virt);
    free(ix->trig_contain);
    free(ix->pw_sets);
    free(ix->pw_off);
    free(ix->pw_mark);
    free(ix->pw_list);
    for (size_t r = 0; r < ix->n_regions; r++) {
        free(ix->regions[r].table);
        free(ix->regions[r].ok);

    }
    free(ix->regions);
    for (size_t k = 0; k < ix->n_shapes; k++) {
        grammar_shape *sh = &ix->shapes[k];
        for (int r = 0; sh->roots && r < sh->n_roots; r++) {
            free(sh->roots[r].in_bits);
            free(sh->roots[r].in_rng);
            free(sh->roots[r].exits);
        }
        free(sh->roots);
        free(sh->table);
    }
    free(ix->shapes);
    free(ix->copies);
    free(ix->copy_states);
    free(ix->shape_of);
    free(ix->shape_slot);
    free(ix->shape_at);
    free(ix->region_of);
    free(ix->region_at);
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

static int cache_classes(grammar_index *ix);

int grammar_index_new(grammar_index **out, const grammar *g, const grammar_vocab *v) {
    if (!out || !g || !v) return grammar_err(GRAMMAR_EINVAL, "grammar_index_new: NULL argument");
    *out = NULL;
    grammar_index *ix = calloc(1, sizeof *ix);
    if (!ix) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    ix->g = g;
    ix->v = v;
    int rc = GRAMMAR_ENOMEM;
    ix->cache = calloc((size_t)g->n_states, sizeof *ix->cache);
    ix->rep = malloc((size_t)g->n_states * sizeof *ix->rep);
    ix->depth_off = malloc(((size_t)v->max_len + 3) * sizeof *ix->depth_off);
    ix->depth_mark = malloc(((size_t)v->max_len + 3) * sizeof *ix->depth_mark);
    ix->acc_stamp = calloc((size_t)v->n_order + 1, sizeof *ix->acc_stamp);
    ix->full_stamp = calloc((size_t)v->n_nodes + 1, sizeof *ix->full_stamp);
    ix->full_kids = malloc(((size_t)v->n_nodes + 1) * sizeof *ix->full_kids);
    ix->vq = malloc(((size_t)v->max_len + 3) * sizeof *ix->vq);
    ix->vp = malloc(((size_t)v->max_len + 3) * sizeof *ix->vp);
    ix->virt = malloc((size_t)v->max_len + 3);
    ix->pw_off = malloc(((size_t)v->max_len + 3) * sizeof *ix->pw_off);
    ix->pw_mark = malloc(((size_t)v->max_len + 3) * sizeof *ix->pw_mark);
    ix->region_of = malloc((size_t)g->n_states * sizeof *ix->region_of);
    if (!ix->vq || !ix->vp || !ix->virt || !ix->region_of || !ix->full_stamp || !ix->full_kids ||
        !ix->pw_off || !ix->pw_mark)
        goto fail;
    for (int32_t q = 0; q < g->n_states; q++) ix->region_of[q] = -2;
    ix->region_at = malloc((size_t)g->n_states);
    ix->shape_of = malloc((size_t)g->n_states * sizeof *ix->shape_of);
    ix->shape_slot = malloc((size_t)g->n_states * sizeof *ix->shape_slot);
    ix->shape_at = malloc((size_t)g->n_states * sizeof *ix->shape_at);
    if (!ix->region_at || !ix->shape_of || !ix->shape_slot || !ix->shape_at) goto fail;
    for (int32_t q = 0; q < g->n_states; q++) ix->shape_of[q] = -2, ix->shape_at[q] = -1;
    for (int32_t i = 0; i < v->n_nodes; i = v->tn_skip[i]) {
        int32_t end = v->tn_skip[i];
        ix->first_tok[v->tn_byte[i]] = (end < v->n_nodes ? v->tn_rank[end] : v->n_order) - v->tn_rank[i];
    }
    memset(ix->region_at, -1, (size_t)g->n_states);
    if (!ix->cache || !ix->rep || !ix->depth_off || !ix->depth_mark || !ix->acc_stamp) goto fail;
    if ((rc = cache_classes(ix))) goto fail;
    rc = GRAMMAR_ENOMEM;
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

/* ----- cache classes -----
 * A state's cache is a function of what its rule can do from it within one token: the walk
 * from [caller of q's rule, q] consumes at most max_len bytes; on its way it follows q's rule's
 * byte edges, calls (callees and their behaviour are the same for everyone), returns into the
 * call's return state in q's rule, and pops q's rule into its callers (the same for every
 * state of the rule). So two states of one rule that behave the same on every input of up to
 * max_len bytes have equal caches. Such states are common: subset construction leaves
 * equivalent states (a string's "inside" state after a plain character, an escape or a
 * multi-byte character), and bounded repetitions (maxLength 1000) make chains whose states are
 * indistinguishable except near the bound. Moore-style partition refinement, one round per
 * byte of depth, computes the classes: round 0 splits by (rule, final, has bytes, callee
 * rules); round k by the round k-1 classes of the byte successors, then to a fixpoint by the
 * round-k classes of call return states (a callee may consume nothing). Refinement stops after
 * max_len + 1 rounds or when a round splits nothing (the classes are then exact
 * bisimulation). Tuples are compared exactly, never by hash alone. */

/* Refinement works on the members of the classes that may split only (after the first rounds
 * a handful of classes per round); class ids are stable: when a class splits, its first group
 * (in state order) keeps the id and the others get new ones. */
typedef struct {
    int32_t *buf;           /* tuples of the listed states, flat */
    size_t n, cap;
    size_t *toff;           /* per listed state: offset of its tuple in buf */
    uint32_t *table;        /* list position + 1, linear probing */
    size_t tcap;
} class_map;

static uint64_t tuple_hash(const int32_t *t, size_t n) {
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint32_t)t[i];
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    return h;
}

static int tuple_reserve(class_map *cm, size_t more) {
    return grammar_grow((void **)&cm->buf, &cm->cap, cm->n + more, sizeof *cm->buf);
}

/* The tuple of list[k] (level 0: the round-0 key; 1: its class, the classes `prev` of its
 * byte successors and call return states; 2: its class, the classes `cls` of its call return
 * states). */
static int make_tuple(class_map *cm, const grammar *g, int level, int32_t q, const int32_t *prev,
                      const int32_t *cls) {
    int32_t r = g->state_rule[q];
    size_t nr = (size_t)(g->ref_off[q + 1] - g->ref_off[q]);
    size_t need = level == 0 ? 2 + nr : level == 1 ? 1 + g->rule_ncls[r] + nr : 1 + nr;
    if (tuple_reserve(cm, need)) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    int32_t *t = cm->buf + cm->n;
    size_t k = 0;
    if (level == 0) {
        t[k++] = r;
        t[k++] = g->final[q] | (g->has_bytes[q] << 1);
        for (int32_t e = g->ref_off[q]; e < g->ref_off[q + 1]; e++) t[k++] = g->refs[e].rule;
    } else {
        t[k++] = cls[q];
        if (level == 1)
            for (uint32_t c = 0; c < g->rule_ncls[r]; c++) {
                int32_t x = g->trans[g->row_off[q] + c];
                t[k++] = x < 0 ? -1 : prev[x];
            }
        for (int32_t e = g->ref_off[q]; e < g->ref_off[q + 1]; e++)
            t[k++] = (level == 1 ? prev : cls)[g->refs[e].ret];
    }
    cm->n += k;
    return 0;
}

/* Group list[0 .. n) by tuple (tuples of one class only ever equal each other's: the class is
 * their first item, except at level 0) and give each group an id into out[]: at level 0 ids
 * from 0; else a class's first group keeps the class id and the others get *n_cls++. Returns
 * the number of states whose id changed (level > 0), or < 0 on error. */
static long number_list(class_map *cm, const int32_t *list, size_t n, int level, const int32_t *cls,
                        int32_t *out, int32_t *n_cls, uint32_t *claim, uint32_t stamp) {
    size_t tcap = 16;
    while (tcap < n * 2) tcap *= 2;
    if (tcap > cm->tcap) {
        uint32_t *t = realloc(cm->table, tcap * sizeof *t);
        if (!t) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
        cm->table = t;
        cm->tcap = tcap;
    }
    memset(cm->table, 0, tcap * sizeof *cm->table);
    long changed = 0;
    for (size_t k = 0; k < n; k++) {
        const int32_t *t = cm->buf + cm->toff[k];
        size_t tl = cm->toff[k + 1] - cm->toff[k];
        size_t slot = (size_t)tuple_hash(t, tl) & (tcap - 1);
        for (;; slot = (slot + 1) & (tcap - 1)) {
            uint32_t e = cm->table[slot];
            if (!e) {
                cm->table[slot] = (uint32_t)k + 1;
                int32_t q = list[k];
                if (level == 0) {
                    out[q] = (*n_cls)++;
                } else if (claim[cls[q]] != stamp) { /* the class's first group */
                    claim[cls[q]] = stamp;
                    out[q] = cls[q];
                } else {
                    out[q] = (*n_cls)++;
                }
                break;
            }
            size_t o = e - 1;
            size_t ol = cm->toff[o + 1] - cm->toff[o];
            if (ol == tl && !memcmp(cm->buf + cm->toff[o], t, tl * sizeof *t)) {
                out[list[k]] = out[list[o]];
                break;
            }
        }
        if (level > 0 && out[list[k]] != cls[list[k]]) changed++;
    }
    return changed;
}

/* Predecessors (byte edges and call returns) as CSR: *off has n_states + 1 entries; with
 * refs_only, call returns only. */
static int predecessors(const grammar *g, int refs_only, int32_t **off_out, int32_t **pred_out) {
    int32_t n = g->n_states;
    int32_t *off = calloc((size_t)n + 1, sizeof *off), *pred = NULL;
    if (!off) return GRAMMAR_ENOMEM;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t q = 0; q < n; q++) {
            uint32_t nc = refs_only ? 0 : g->rule_ncls[g->state_rule[q]];
            for (uint32_t c = 0; c < nc; c++) {
                int32_t t = g->trans[g->row_off[q] + c];
                if (t < 0) continue;
                if (pass == 0) off[t + 1]++;
                else pred[off[t]++] = q;
            }
            for (int32_t k = g->ref_off[q]; k < g->ref_off[q + 1]; k++) {
                int32_t t = g->refs[k].ret;
                if (pass == 0) off[t + 1]++;
                else pred[off[t]++] = q;
            }
        }
        if (pass == 0) {
            for (int32_t q = 0; q < n; q++) off[q + 1] += off[q];
            pred = malloc(((size_t)off[n] + 1) * sizeof *pred);
            if (!pred) {
                free(off);
                return GRAMMAR_ENOMEM;
            }
        } else { /* off[q] now holds the end of q's list: shift back */
            for (int32_t q = n; q > 0; q--) off[q] = off[q - 1];
            off[0] = 0;
        }
    }
    *off_out = off;
    *pred_out = pred;
    return 0;
}

static int cache_classes(grammar_index *ix) {
    const grammar *g = ix->g;
    int32_t n = g->n_states;
    if (n <= 0) return 0;
    class_map cm = {0};
    int32_t *cls = malloc((size_t)n * sizeof *cls), *nxt = malloc((size_t)n * sizeof *nxt);
    int32_t *prev = malloc((size_t)n * sizeof *prev), *size = calloc((size_t)n, sizeof *size);
    int32_t *list = malloc((size_t)n * sizeof *list), *moved = malloc((size_t)n * sizeof *moved);
    uint32_t *claim = calloc((size_t)n, sizeof *claim), *mark = calloc((size_t)n, sizeof *mark);
    uint8_t *dirty = calloc((size_t)n, 1);
    int32_t *poff = NULL, *pred = NULL, *roff = NULL, *rpred = NULL;
    uint32_t stamp = 0;
    int rc = GRAMMAR_ENOMEM;
    cm.toff = malloc(((size_t)n + 1) * sizeof *cm.toff);
    if (!cls || !nxt || !prev || !size || !list || !moved || !claim || !mark || !dirty || !cm.toff)
        goto done;
    if ((rc = predecessors(g, 0, &poff, &pred)) || (rc = predecessors(g, 1, &roff, &rpred)))
        goto done;
    /* round 0 */
    for (int32_t q = 0; q < n; q++) {
        cm.toff[q] = cm.n;
        list[q] = q;
        if ((rc = make_tuple(&cm, g, 0, q, NULL, NULL))) goto done;
    }
    cm.toff[n] = cm.n;
    int32_t n_cls = 0;
    long lr;
    if ((lr = number_list(&cm, list, (size_t)n, 0, NULL, cls, &n_cls, claim, 0)) < 0) {
        rc = (int)lr;
        goto done;
    }
    for (int32_t q = 0; q < n; q++) size[cls[q]]++;
    memset(dirty, 1, (size_t)n);
    for (uint32_t round = 1; round <= ix->v->max_len + 1; round++) {
        /* level 1: the members of dirty classes of two or more, by their byte successors'
         * and return states' classes at the end of the last round */
        size_t nl = 0;
        for (int32_t q = 0; q < n; q++)
            if (dirty[cls[q]] && size[cls[q]] > 1) list[nl++] = q;
        if (nl == 0) break;
        memcpy(prev, cls, (size_t)n * sizeof *cls);
        size_t n_moved = 0;
        int level = 1;
        for (;;) {
            cm.n = 0;
            for (size_t k = 0; k < nl; k++) {
                cm.toff[k] = cm.n;
                if ((rc = make_tuple(&cm, g, level, list[k], prev, cls))) goto done;
            }
            cm.toff[nl] = cm.n;
            if ((lr = number_list(&cm, list, nl, level, cls, nxt, &n_cls, claim, ++stamp)) < 0) {
                rc = (int)lr;
                goto done;
            }
            /* apply, then the same-round fixpoint over return states (a callee may consume
             * nothing): the classes holding a caller of a state that moved may split */
            size_t first = n_moved;
            for (size_t k = 0; k < nl; k++) {
                int32_t q = list[k];
                if (nxt[q] != cls[q]) {
                    size[cls[q]]--;
                    size[nxt[q]]++;
                    cls[q] = nxt[q];
                    moved[n_moved++] = q;
                }
            }
            if (n_moved == first) break;
            ++stamp;
            for (size_t k = first; k < n_moved; k++)
                for (int32_t e = roff[moved[k]]; e < roff[moved[k] + 1]; e++)
                    mark[cls[rpred[e]]] = stamp;
            nl = 0;
            for (int32_t q = 0; q < n; q++)
                if (mark[cls[q]] == stamp && size[cls[q]] > 1) list[nl++] = q;
            if (nl == 0) break;
            level = 2;
        }
        if (n_moved == 0) break; /* nothing split: the classes are exact bisimulation */
        /* the classes of the moved states' predecessors may split in the next round, no other */
        memset(dirty, 0, (size_t)n_cls);
        for (size_t k = 0; k < n_moved; k++)
            for (int32_t e = poff[moved[k]]; e < poff[moved[k] + 1]; e++) dirty[cls[pred[e]]] = 1;
    }
    /* the representative of a class: its first state */
    for (int32_t c = 0; c < n_cls; c++) size[c] = -1;
    for (int32_t q = 0; q < n; q++) {
        if (size[cls[q]] < 0) size[cls[q]] = q;
        ix->rep[q] = size[cls[q]];
    }
    ix->n_classes = n_cls;
    rc = 0;
done:
    if (rc == GRAMMAR_ENOMEM) grammar_err(GRAMMAR_ENOMEM, "out of memory");
    free(cls);
    free(nxt);
    free(prev);
    free(size);
    free(list);
    free(moved);
    free(claim);
    free(mark);
    free(dirty);
    free(poff);
    free(pred);
    free(roff);
    free(rpred);
    free(cm.buf);
    free(cm.toff);
    free(cm.table);
    return rc;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static int push_id(int32_t **a, size_t *cap, size_t *n, int32_t v) {
    if (grammar_grow((void **)a, cap, *n + 1, sizeof **a)) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    (*a)[(*n)++] = v;
    return 0;
}

/* ----- byte regions -----
 * The costly caches are those of states that loop on many bytes (the inside of a string, raw
 * text): their walk visits most of the trie. But a token that, from such a state, only moves
 * between states that consume bytes (never final, no call, no return) is accepted with the
 * frame kept whatever the rule; the walk can take whole subtrees of such tokens at once if it
 * knows, per trie node, that every token below stays in the region. That per-node bit depends
 * only on the region's shape (its byte transition table numbered from the looping state), so
 * the inlined copies of a string rule in different rules share one computation: one pass over
 * the trie, bottom up, per distinct shape. Only states looping on many bytes start a region
 * (building one costs about one plain walk). */
#define REGION_MIN_LOOPS 16 /* bytes looping on the first state; fewer: the walk is cheap */
#define REGION_MAX_COUNT 64 /* distinct shapes per index (n_nodes / 8 bytes each) */

static bool region_member(const grammar *g, int32_t s) {
    return g->has_bytes[s] && !g->final[s] && g->ref_off[s] == g->ref_off[s + 1];
}

static int region_build(grammar_index *ix, grammar_region *rg) {
    const grammar_vocab *v = ix->v;
    int32_t n = v->n_nodes;
    /* below[i]: bit k when every child subtree of i stays in the region entered from state k */
    uint64_t *below = malloc(((size_t)n + 1) * sizeof *below);
    /* per byte: the region states with an edge on it (any) and the edges (k -> t), as pairs */
    uint64_t *any = calloc(256, sizeof *any);
    uint8_t(*edge)[2] = malloc((size_t)rg->n * 256 * sizeof *edge);
    int32_t *eoff = malloc(257 * sizeof *eoff);
    rg->ok = calloc(((size_t)n + 63) / 64, sizeof *rg->ok);
    if (!below || !rg->ok || !any || !edge || !eoff) {
        free(rg->ok);
        rg->ok = NULL;
        free(below);
        free(any);
        free(edge);
        free(eoff);
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    }
    memset(below, 0xff, ((size_t)n + 1) * sizeof *below);
    int32_t ne = 0;
    for (int b = 0; b < 256; b++) {
        eoff[b] = ne;
        for (int k = 0; k < rg->n; k++)
            if (rg->table[k * 256 + b] >= 0) {
                edge[ne][0] = (uint8_t)k;
                edge[ne][1] = (uint8_t)rg->table[k * 256 + b];
                ne++;
                any[b] |= 1ull << k;
            }
    }
    eoff[256] = ne;
    const uint64_t full = rg->n == 64 ? ~0ull : (1ull << rg->n) - 1;
    for (int32_t i = n - 1; i >= 0; i--) {
        uint8_t b = v->tn_byte[i];
        uint64_t m = 0, below_i = below[i] & full;
        if (below_i == full) { /* most nodes (leaves) */
            m = any[b];
        } else {
            for (int32_t e = eoff[b]; e < eoff[b + 1]; e++)
                if ((below_i >> edge[e][1]) & 1) m |= 1ull << edge[e][0];
        }
        if (m & 1) rg->ok[i / 64] |= 1ull << (i % 64);
        if (v->tn_parent[i] >= 0) below[v->tn_parent[i]] &= m;
    }
    free(below);
    free(any);
    free(edge);
    free(eoff);
    ix->bytes_used += ((size_t)n + 63) / 64 * sizeof *rg->ok + (size_t)rg->n * 256;
    return 0;
}

/* The region's states from s, breadth first (st[0] = s), and its table: byte -> index, -1 when
 * the edge leaves the region (a state that is no member, or beyond the limit), -2 no edge. */
static int region_states(grammar_index *ix, int32_t s, int32_t *st, int8_t *table) {
    const grammar *g = ix->g;
    int8_t *at = ix->region_at; /* per state: index in st, -1 (reset before returning) */
    int n = 1;
    st[0] = s;
    at[s] = 0;
    for (int k = 0; k < n; k++) {
        int32_t prev = -3, x = -2;
        for (int b = 0; b < 256; b++) {
            int32_t t = grammar_next(g, st[k], (uint8_t)b);
            if (t != prev) { /* runs of bytes share a target */
                prev = t;
                if (t < 0) {
                    x = -2;
                } else if (!region_member(g, t)) {
                    x = -1;
                } else {
                    if (at[t] < 0 && n < GRAMMAR_REGION_MAX) {
                        at[t] = (int8_t)n;
                        st[n++] = t;
                    }
                    x = at[t];
                }
            }
            table[k * 256 + b] = (int8_t)x;
        }
    }
    for (int k = 0; k < n; k++) at[st[k]] = -1;
    return n;
}

static int region_find(grammar_index *ix, int32_t s, int32_t *id);

/* The region bits of state s (*out NULL when s starts no region worth one). */
static int region_get(grammar_index *ix, int32_t s, const uint64_t **out) {
    *out = NULL;
    int32_t id = ix->region_of[s];
    if (id >= 0) *out = ix->regions[id].ok;
    if (id != -2) return 0;
    ix->region_of[s] = -1;
    const grammar *g = ix->g;
    if (!region_member(g, s)) return 0;
    int loops = 0;
    for (int b = 0; b < 256; b++) loops += grammar_next(g, s, (uint8_t)b) == s;
    if (loops < REGION_MIN_LOOPS) return 0;
    int rc = region_find(ix, s, &id);
    if (rc || id < 0) return rc;
    if (!ix->regions[id].ok && (rc = region_build(ix, &ix->regions[id]))) return rc;
    ix->region_of[s] = id;
    *out = ix->regions[id].ok;
    return 0;
}

/* The region of shape `from s` (found or made; *id -1 when the index has too many). */
static int region_find(grammar_index *ix, int32_t s, int32_t *id) {
    *id = -1;
    int32_t st[GRAMMAR_REGION_MAX];
    int8_t table[GRAMMAR_REGION_MAX * 256];
    int n = region_states(ix, s, st, table);
    for (size_t r = 0; r < ix->n_regions; r++)
        if (ix->regions[r].n == n && !memcmp(ix->regions[r].table, table, (size_t)n * 256)) {
            *id = (int32_t)r;
            return 0;
        }
    if (ix->n_regions >= REGION_MAX_COUNT) return 0;
    if (grammar_grow((void **)&ix->regions, &ix->cap_regions, ix->n_regions + 1,
                     sizeof *ix->regions))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    grammar_region *rg = &ix->regions[ix->n_regions];
    memset(rg, 0, sizeof *rg);
    rg->n = n;
    rg->table = malloc((size_t)n * 256);
    if (!rg->table) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    memcpy(rg->table, table, (size_t)n * 256);
    *id = (int32_t)ix->n_regions++; /* bits (region_build) and result (region_result): lazily */
    return 0;
}

/* Accepted tokens are kept as rank ranges [lo, hi) (pairs in tmp_acc; *n counts the pairs) in
 * increasing order: the trie is in rank order, so a subtree accepted whole is one range and
 * neighbours merge. Ranges of one first-byte subtree never merge into an earlier one's
 * (acc_floor), so each subtree's result is a slice that can be stored for sharing. */
static int acc_range(grammar_index *ix, size_t *n, int32_t lo, int32_t hi) {
    ix->n_tok_acc += (size_t)(hi - lo);
    if (*n > ix->acc_floor && ix->tmp_acc[2 * *n - 1] == lo) {
        ix->tmp_acc[2 * *n - 1] = hi;
        return 0;
    }
    if (grammar_grow((void **)&ix->tmp_acc, &ix->cap_tmp_acc, 2 * *n + 2, sizeof *ix->tmp_acc))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    ix->tmp_acc[2 * *n] = lo;
    ix->tmp_acc[2 * *n + 1] = hi;
    (*n)++;
    return 0;
}

static int pop_union(grammar_index *ix, int32_t r, int32_t i, size_t n_acc, size_t *n_unc);
#define POP_MIN_TOKENS 64 /* pops at nodes with smaller subtrees are walked inline */

/* One walk of the trie nodes [from, to) (whole subtrees) from the stack [caller of q's rule, q].
 * Pass 1 (no_w): tokens consumed with q's frame kept are accepted. Pass 2 (callers
 * approximated), only through subtrees that hold tokens pass 1 did not accept: consumed ones
 * are uncertain, the others rejected. In pass 2, a pop of q's rule at a node with a large
 * subtree is not expanded inline: what the callers consume below that node is a function of
 * (rule, node), walked once and shared (pop_union). */
static int walk(grammar_index *ix, int32_t q, int pass, int32_t from, int32_t to, size_t *n_acc,
                size_t *n_unc) {
    /* the walk starts at node `from` (at any depth: the subtree of a region exit), from the
     * level above it */
    /* n_acc counts accepted rank ranges (pairs in tmp_acc), ix->n_tok_acc their tokens */
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
    uint32_t top_d = v->tn_depth[from] - 1;
    ix->depth_sets[0] = top;
    ix->depth_off[top_d] = 0;
    ix->depth_off[top_d + 1] = 1;
    ix->depth_mark[top_d] = st->n;
    ix->virt[top_d] = 0;
    int32_t i = from;
    while (i < to) {
        uint32_t d = v->tn_depth[i];
        if ((d == top_d + 1 && grammar_next(g, q, v->tn_byte[i]) < 0) ||
            (pass == 2 && ix->full_stamp[i] == ix->walk_stamp)) {
            i = v->tn_skip[i];
            continue;
        }
        grammar_store_truncate(st, ix->depth_mark[d - 1]);
        uint8_t b = v->tn_byte[i];
        int memo = 0;
        /* fast path: one stack whose next state only consumes bytes (no call, no return):
         * the level is the pair (state, caller), nothing interned */
        int32_t pq = -1, pp = -1;
        size_t so = ix->depth_off[d - 1], n = ix->depth_off[d] - so;
        if (ix->virt[d - 1]) {
            pq = ix->vq[d - 1], pp = ix->vp[d - 1];
        } else if (n == 1 && st->q[ix->depth_sets[so]] >= 0) {
            pq = st->q[ix->depth_sets[so]], pp = st->parent[ix->depth_sets[so]];
        }
        if (pq >= 0 && pass == 1 && !ix->no_share && ix->region_of[pq] != -1) {
            /* a whole subtree that stays in pq's byte region: accepted, frame kept */
            const uint64_t *ok;
            if ((rc = region_get(ix, pq, &ok))) break;
            if (ok && ((ok[i / 64] >> (i % 64)) & 1)) {
                int32_t end = v->tn_skip[i];
                int32_t r1 = end < v->n_nodes ? v->tn_rank[end] : v->n_order;
                /* pass 2 skips the subtree (full_stamp): no per-rank stamp needed */
                if ((rc = acc_range(ix, n_acc, v->tn_rank[i], r1))) break;
                ix->full_stamp[i] = ix->walk_stamp;
                if ((rc = push_id(&ix->visited, &ix->cap_visited, &ix->n_visited, i))) break;
                i = end;
                continue;
            }
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
            if (pass == 2) {
                int32_t end = v->tn_skip[i];
                int32_t n_tok = (end < v->n_nodes ? v->tn_rank[end] : v->n_order) - v->tn_rank[i];
                memo = !ix->no_share && n_tok >= POP_MIN_TOKENS;
                sp->no_w = memo;
                sp->p0_popped = 0;
            }
            if ((rc = grammar_stepper_step(sp, in, n, b))) break;
            memo = memo && sp->p0_popped;
        }
        if (sp->n_out == 0) {
            if (memo && (rc = pop_union(ix, g->state_rule[q], i, *n_acc, n_unc))) break;
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
        if (memo && (rc = pop_union(ix, g->state_rule[q], i, *n_acc, n_unc))) break;
    classify:;
        if (pass == 1) {
            ix->full_kids[i] = 0;
            if ((rc = push_id(&ix->visited, &ix->cap_visited, &ix->n_visited, i))) break;
        }
        int32_t r0 = v->tn_rank[i], nr = v->tn_nrank[i];
        if (pass == 1) {
            for (int32_t r = r0; r < r0 + nr; r++) ix->acc_stamp[r] = ix->build_stamp;
            if (nr && (rc = acc_range(ix, n_acc, r0, r0 + nr))) break;
        } else {
            for (int32_t r = r0; r < r0 + nr && !rc; r++)
                if (ix->acc_stamp[r] != ix->build_stamp)
                    rc = push_id(&ix->tmp_unc, &ix->cap_tmp_unc, n_unc, r);
            if (rc) break;
        }
        i++;
    }
    sp->no_w = 0;
    grammar_store_truncate(st, 2);
    return rc;
}

/* Shared subtree walks (see sub_key): the slot of key, or of the empty place for it. */
#define SUB_MIN_TOKENS 32            /* smaller subtrees are walked again: cheaper than storing */
#define SUB_MAX_IDS ((size_t)8 << 20) /* 32 MB of ids at most; beyond, nothing more is shared */

static size_t sub_slot(const grammar_index *ix, uint64_t key) {
    size_t h = (size_t)((key + 1) * 0x9E3779B97F4A7C15ull >> 20) & ix->sub_mask;
    while (ix->sub_key[h] && ix->sub_key[h] != key + 1) h = (h + 1) & ix->sub_mask;
    return h;
}

/* Keep the accepted ranges a0 .. a0 + n_acc (pairs in tmp_acc) and tmp_unc[u0 .. u0 + n_unc)
 * as the result of subtree key. */
static int sub_store_lists(grammar_index *ix, uint64_t key, const int32_t *acc, size_t n_acc,
                           const int32_t *unc, size_t n_unc) {
    if (ix->n_sub_ids + 2 * n_acc + n_unc > SUB_MAX_IDS) return 0;
    if ((ix->sub_n + 1) * 2 > ix->sub_mask + 1 || !ix->sub_key) { /* grow and rehash */
        size_t cap = ix->sub_key ? (ix->sub_mask + 1) * 2 : 1024;
        uint64_t *ok = ix->sub_key;
        uint32_t(*ov)[4] = ix->sub_val;
        size_t omask = ix->sub_mask;
        ix->sub_key = calloc(cap, sizeof *ix->sub_key);
        ix->sub_val = malloc(cap * sizeof *ix->sub_val);
        if (!ix->sub_key || !ix->sub_val) {
            free(ix->sub_key);
            free(ix->sub_val);
            ix->sub_key = ok;
            ix->sub_val = ov;
            return grammar_err(GRAMMAR_ENOMEM, "out of memory");
        }
        ix->sub_mask = cap - 1;
        for (size_t k = 0; ok && k <= omask; k++)
            if (ok[k]) {
                size_t h = sub_slot(ix, ok[k] - 1);
                ix->sub_key[h] = ok[k];
                memcpy(ix->sub_val[h], ov[k], sizeof ov[k]);
            }
        free(ok);
        free(ov);
    }
    if (grammar_grow((void **)&ix->sub_ids, &ix->cap_sub_ids, ix->n_sub_ids + 2 * n_acc + n_unc,
                     sizeof *ix->sub_ids))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    size_t h = sub_slot(ix, key);
    ix->sub_key[h] = key + 1;
    ix->sub_val[h][0] = (uint32_t)ix->n_sub_ids;
    ix->sub_val[h][1] = (uint32_t)n_acc;
    if (n_acc) memcpy(ix->sub_ids + ix->n_sub_ids, acc, 2 * n_acc * sizeof *acc);
    ix->n_sub_ids += 2 * n_acc;
    ix->sub_val[h][2] = (uint32_t)ix->n_sub_ids;
    ix->sub_val[h][3] = (uint32_t)n_unc;
    if (n_unc) memcpy(ix->sub_ids + ix->n_sub_ids, unc, n_unc * sizeof *unc);
    ix->n_sub_ids += n_unc;
    ix->sub_n++;
    ix->bytes_used += (2 * n_acc + n_unc) * sizeof *ix->sub_ids;
    return 0;
}

static int sub_store(grammar_index *ix, uint64_t key, size_t a0, size_t n_acc, size_t u0,
                     size_t n_unc) {
    return sub_store_lists(ix, key, n_acc ? ix->tmp_acc + 2 * a0 : NULL, n_acc,
                           n_unc ? ix->tmp_unc + u0 : NULL, n_unc);
}

/* Append the stored result of key (accepted ranges, uncertain ranks): 1 when there was one,
 * 0 when not, < 0 on error. */
static int sub_get(grammar_index *ix, uint64_t key, size_t *n_acc, size_t *n_unc) {
    if (!ix->sub_key) return 0;
    size_t h = sub_slot(ix, key);
    if (!ix->sub_key[h]) return 0;
    const uint32_t *sv = ix->sub_val[h];
    if (grammar_grow((void **)&ix->tmp_acc, &ix->cap_tmp_acc, 2 * (*n_acc + sv[1]),
                     sizeof *ix->tmp_acc) ||
        grammar_grow((void **)&ix->tmp_unc, &ix->cap_tmp_unc, *n_unc + sv[3], sizeof *ix->tmp_unc))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    for (uint32_t k = 0; k < sv[1]; k++) {
        int32_t lo = ix->sub_ids[sv[0] + 2 * k], hi = ix->sub_ids[sv[0] + 2 * k + 1];
        ix->tmp_acc[2 * (*n_acc + k)] = lo;
        ix->tmp_acc[2 * (*n_acc + k) + 1] = hi;
        ix->n_tok_acc += (size_t)(hi - lo);
    }
    if (sv[3]) memcpy(ix->tmp_unc + *n_unc, ix->sub_ids + sv[2], sv[3] * sizeof *ix->sub_ids);
    *n_acc += sv[1];
    *n_unc += sv[3];
    ix->sub_hits++;
    return 1;
}

/* ----- pop memo -----
 * A pop of q's rule to an unknown caller goes on from every return state of the rule (with
 * callers unknown again): from the node where it happens, what it consumes depends on the rule
 * and the node only. The `ws` rule of a tool grammar has hundreds of return states, so the
 * space subtree (~40K tokens) after its first space costs ~1.5 ms with all of them; each ws
 * state (one per count of indenting spaces) used to walk it again. */
#define POP_KEY(r, i) ((1ull << 63) | ((uint64_t)(uint32_t)(r) << 32) | (uint32_t)(i))
/* below a shape exit at trie node i into a state of class c (c, i < 2^31) */
#define EXIT_KEY(c, i) ((1ull << 62) | ((uint64_t)(uint32_t)(c) << 31) | (uint32_t)(i))

static int pw_level(grammar_index *ix, uint32_t d, const int32_t *set, size_t n) {
    if (grammar_grow((void **)&ix->pw_sets, &ix->cap_pw_sets, ix->pw_off[d] + n,
                     sizeof *ix->pw_sets))
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    if (n) memcpy(ix->pw_sets + ix->pw_off[d], set, n * sizeof *set);
    ix->pw_off[d + 1] = ix->pw_off[d] + n;
    ix->pw_mark[d] = ix->st.n;
    return 0;
}

static int pw_tokens(grammar_index *ix, int32_t node) {
    const grammar_vocab *v = ix->v;
    for (int32_t r = v->tn_rank[node]; r < v->tn_rank[node] + v->tn_nrank[node]; r++)
        if (push_id(&ix->pw_list, &ix->cap_pw_list, &ix->n_pw_list, r))
            return GRAMMAR_ENOMEM;
    return 0;
}

/* The ranks of node i's subtree (i included) consumed after rule r returned to any caller
 * right after node i's byte, into pw_list. Leaves the store and stepper as it found them. */
static int pop_walk(grammar_index *ix, int32_t r, int32_t i) {
    const grammar_vocab *v = ix->v;
    grammar_store *st = &ix->st;
    grammar_stepper *sp = &ix->sp;
    size_t mark0 = st->n;
    int no_w = sp->no_w, rc;
    uint32_t base = v->tn_depth[i];
    sp->no_w = 0;
    ix->n_pw_list = 0;
    ix->pw_off[0] = 0;
    if ((rc = grammar_stepper_callers(sp, r)) || (rc = pw_level(ix, 0, sp->out, sp->n_out)))
        goto done;
    if (sp->n_out == 0) goto done;
    if ((rc = pw_tokens(ix, i))) goto done;
    for (int32_t j = i + 1, end = v->tn_skip[i]; j < end;) {
        uint32_t d = v->tn_depth[j] - base;
        grammar_store_truncate(st, ix->pw_mark[d - 1]);
        size_t so = ix->pw_off[d - 1];
        if ((rc = grammar_stepper_step(sp, ix->pw_sets + so, ix->pw_off[d] - so, v->tn_byte[j])))
            break;
        if (sp->n_out == 0) {
            j = v->tn_skip[j];
            continue;
        }
        if ((rc = pw_level(ix, d, sp->out, sp->n_out)) || (rc = pw_tokens(ix, j))) break;
        j++;
    }
done:
    if (rc == GRAMMAR_ENOMEM) grammar_err(GRAMMAR_ENOMEM, "out of memory");
    grammar_store_truncate(st, mark0);
    sp->no_w = no_w;
    return rc;
}

/* Was rank r accepted by pass 1 of the current subtree (ranges acc_floor .. n_acc)? */
static bool acc_has(const grammar_index *ix, size_t n_acc, int32_t r) {
    if (ix->acc_stamp[r] == ix->build_stamp) return true;
    size_t lo = ix->acc_floor, hi = n_acc; /* the last range with start <= r */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ix->tmp_acc[2 * mid] <= r) lo = mid + 1;
        else hi = mid;
    }
    return lo > ix->acc_floor && r < ix->tmp_acc[2 * (lo - 1) + 1];
}

/* Pass 2 met a pop of rule r at node i: add what the callers consume below i (walked once per
 * (rule, node), then shared) to the uncertain ranks, except what pass 1 accepted. */
static int pop_union(grammar_index *ix, int32_t r, int32_t i, size_t n_acc, size_t *n_unc) {
    uint64_t key = POP_KEY(r, i);
    const int32_t *list = NULL;
    size_t n = 0;
    bool found = false;
    if (ix->sub_key) {
        size_t h = sub_slot(ix, key);
        if (ix->sub_key[h]) {
            n = ix->sub_val[h][3];
            if (n) list = ix->sub_ids + ix->sub_val[h][2];
            found = true;
            ix->sub_hits++;
        }
    }
    int rc;
    if (!found) {
        if ((rc = pop_walk(ix, r, i)) ||
            (rc = sub_store_lists(ix, key, NULL, 0, ix->pw_list, ix->n_pw_list)))
            return rc;
        list = ix->pw_list;
        n = ix->n_pw_list;
    }
    ix->pop_unions++;
    for (size_t k = 0; k < n; k++)
        if (!acc_has(ix, n_acc, list[k]) &&
            (rc = push_id(&ix->tmp_unc, &ix->cap_tmp_unc, n_unc, list[k])))
            return rc;
    ix->unc_unsorted = 1;
    return 0;
}

/* The two passes over one first-byte subtree [i, end) of the trie. */
static int walk_subtree(grammar_index *ix, int32_t q, int32_t i, int32_t end, size_t *n_acc,
                        size_t *n_unc) {
    const grammar_vocab *v = ix->v;
    size_t t0 = ix->n_tok_acc;
    ix->acc_floor = *n_acc;
    if (++ix->walk_stamp == 0) {
        memset(ix->full_stamp, 0, (size_t)v->n_nodes * sizeof *ix->full_stamp);
        ix->walk_stamp = 1;
    }
    ix->n_visited = 0;
    size_t u0 = *n_unc;
    int rc = walk(ix, q, 1, i, end, n_acc, n_unc);
    if (rc) return rc;
    if (ix->n_tok_acc - t0 == (size_t)((end < v->n_nodes ? v->tn_rank[end] : v->n_order) - v->tn_rank[i]))
        return 0; /* all accepted: nothing for pass 2 */
    /* the subtrees pass 1 accepted whole (pass 2 skips them): a node pass 1 entered accepted
     * the tokens ending there, so it is full when all its children are; children come before
     * their parents in reverse preorder */
    for (size_t k = ix->n_visited; k-- > 0;) {
        int32_t x = ix->visited[k];
        if (ix->full_stamp[x] != ix->walk_stamp) {
            if (ix->full_kids[x] != v->tn_nchild[x]) continue;
            ix->full_stamp[x] = ix->walk_stamp;
        }
        if (v->tn_parent[x] >= 0) ix->full_kids[v->tn_parent[x]]++;
    }
    ix->unc_unsorted = 0;
    if ((rc = walk(ix, q, 2, i, end, n_acc, n_unc))) return rc;
    if (ix->unc_unsorted && *n_unc - u0 > 1) { /* pop unions: out of order, maybe twice */
        int32_t *u = ix->tmp_unc + u0;
        size_t nu = *n_unc - u0, k = 0;
        qsort(u, nu, sizeof *u, cmp_i32);
        for (size_t j = 0; j < nu; j++)
            if (k == 0 || u[k - 1] != u[j]) u[k++] = u[j];
        *n_unc = u0 + k;
    }
    return 0;
}

/* The cache's accepted set from the sorted rank ranges (pairs in tmp_acc): a list of ids, or a
 * bitset over ids when it has more ids than the bitset has words. A bitset of most of the
 * vocabulary starts from every token and clears the gaps between the ranges, so its cost
 * follows the tokens not accepted (a string's inside accepts ~147K of 151,936 tokens). */
static int acc_finish(grammar_index *ix, grammar_state_cache *c, size_t n_rng) {
    const grammar_vocab *v = ix->v;
    const int32_t *rg = ix->tmp_acc;
    size_t n_tok = ix->n_tok_acc, words = ((size_t)v->n_vocab + 31) / 32;
    if (n_tok > words) {
        c->dense = 1;
        c->acc = malloc(words * sizeof *c->acc);
        if (!c->acc) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
        if (n_tok * 2 > (size_t)v->n_order) {
            memcpy(c->acc, v->nonempty, words * sizeof *c->acc);
            int32_t at = 0;
            for (size_t k = 0; k <= n_rng; k++) {
                int32_t lo = k < n_rng ? rg[2 * k] : v->n_order;
                for (int32_t r = at; r < lo; r++) {
                    int32_t id = v->order[r];
                    c->acc[id / 32] &= ~(1u << (id % 32));
                }
                if (k < n_rng) at = rg[2 * k + 1];
            }
        } else {
            memset(c->acc, 0, words * sizeof *c->acc);
            for (size_t k = 0; k < n_rng; k++)
                for (int32_t r = rg[2 * k]; r < rg[2 * k + 1]; r++) {
                    int32_t id = v->order[r];
                    c->acc[id / 32] |= 1u << (id % 32);
                }
        }
        ix->bytes_used += words * sizeof *c->acc;
    } else if (n_tok) {
        c->acc = malloc(n_tok * sizeof *c->acc);
        if (!c->acc) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
        size_t at = 0;
        for (size_t k = 0; k < n_rng; k++)
            for (int32_t r = rg[2 * k]; r < rg[2 * k + 1]; r++) c->acc[at++] = (uint32_t)v->order[r];
        ix->bytes_used += n_tok * sizeof *c->acc;
    }
    c->n_acc = (uint32_t)n_tok;
    return 0;
}

static int unc_finish(grammar_index *ix, grammar_state_cache *c, size_t n_unc) {
    if (n_unc) {
        c->unc = malloc(n_unc * sizeof *c->unc);
        if (!c->unc) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
        memcpy(c->unc, ix->tmp_unc, n_unc * sizeof *c->unc);
        ix->bytes_used += n_unc * sizeof *c->unc;
    }
    c->n_unc = (uint32_t)n_unc;
    return 0;
}

/* ----- shapes: byte regions' shared results, several states at once -----
 * A state that can stay in byte-only states (no final state, call or return on the way) on
 * many bytes, such as the opening state or the inside of a string, or the states of a string
 * with maxLength (a counted chain: each state differs from the next by what remains), gets most
 * of its cache from its region alone: the tokens that stay in the region are accepted in every
 * rule's copy, a byte with no edge rejects, and only below the exits (a byte into a state that
 * is no member: the closing quote) do the rule's own states matter. The region seen from a
 * state q (its states breadth first, at most GRAMMAR_SHAPE_MAX; its byte table) is a shape,
 * equal in every copy of the string. One walk down the trie serves all the shape's roots at
 * once (its states with many tokens into the region: the opening and inside states of a
 * string, every count of a counted chain), carrying per depth the region state of each root
 * still inside. A state's cache is then its root's tokens plus walks below its exits from the
 * copy's real states. */
#define SHAPE_MIN_TOKENS 65536 /* tokens whose first byte stays in the region: a root */
#define SHAPE_MAX_COUNT 256
#define SHAPE_MAX_BYTES ((size_t)64 << 20)

static uint64_t shape_hash(const int16_t *t, size_t n) {
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint16_t)t[i]) * 1099511628211ull;
    return h;
}

/* Can q start a shape? A member with >= 16 bytes into members holding many tokens. */
static bool shape_start(const grammar_index *ix, int32_t q) {
    const grammar *g = ix->g;
    if (!region_member(g, q)) return false;
    int into = 0;
    int32_t toks = 0;
    for (int b = 0; b < 256; b++) {
        int32_t t = grammar_next(g, q, (uint8_t)b);
        if (t >= 0 && region_member(g, t)) into++, toks += ix->first_tok[b];
    }
    return into >= REGION_MIN_LOOPS && toks >= SHAPE_MIN_TOKENS;
}

/* The root's tokens as a bitset (when they are more ids than the bitset has words). */
static int root_bits(grammar_index *ix, grammar_shape_root *sr) {
    const grammar_vocab *v = ix->v;
    if ((size_t)sr->n_in <= ((size_t)v->n_vocab + 31) / 32) return 0;
    grammar_state_cache tmp = {0};
    size_t keep_n = ix->n_tok_acc;
    int32_t *keep = ix->tmp_acc; /* acc_finish reads the ranges from tmp_acc */
    ix->n_tok_acc = sr->n_in;
    ix->tmp_acc = sr->in_rng;
    int rc = acc_finish(ix, &tmp, sr->n_in_rng);
    ix->tmp_acc = keep;
    ix->n_tok_acc = keep_n;
    if (rc) return rc;
    sr->in_bits = tmp.acc; /* dense: more ids than words */
    return 0;
}

/* The walk down the trie for every root of shape sh. */
static int shape_pass(grammar_index *ix, grammar_shape *sh) {
    const grammar_vocab *v = ix->v;
    size_t levels = (size_t)v->max_len + 2;
    int R = sh->n_roots, rc = 0;
    int16_t *vec = malloc(levels * (size_t)R * sizeof *vec);
    uint32_t *alive = malloc(levels * sizeof *alive);
    size_t *cap_ex = calloc((size_t)R, sizeof *cap_ex), *cap_rng = calloc((size_t)R, sizeof *cap_rng);
    sh->roots = calloc((size_t)R, sizeof *sh->roots);
    if (!vec || !alive || !cap_ex || !cap_rng || !sh->roots) goto nomem;
    for (int r = 0; r < R; r++) vec[r] = sh->root_idx[r];
    alive[0] = R == 32 ? 0xffffffffu : (1u << R) - 1;
    for (int32_t i = 0; i < v->n_nodes;) {
        uint32_t d = v->tn_depth[i], a = alive[d - 1], na = 0;
        const int16_t *up = vec + (size_t)(d - 1) * R;
        int16_t *cur = vec + (size_t)d * R;
        const int16_t *col = sh->table + v->tn_byte[i];
        for (uint32_t m = a; m; m &= m - 1) {
            int r = __builtin_ctz(m);
            int x = col[up[r] * 256];
            if (x >= 0) {
                cur[r] = (int16_t)x;
                na |= 1u << r;
            } else if (x == -1) { /* the token leaves the region here: an exit */
                grammar_shape_root *sr = &sh->roots[r];
                if (grammar_grow((void **)&sr->exits, &cap_ex[r], sr->n_exits + 1, sizeof *sr->exits))
                    goto nomem;
                sr->exits[sr->n_exits][0] = i;
                sr->exits[sr->n_exits][1] = up[r];
                sr->n_exits++;
            }
        }
        if (!na) {
            i = v->tn_skip[i];
            continue;
        }
        alive[d] = na;
        int32_t r0 = v->tn_rank[i], r1 = r0 + v->tn_nrank[i];
        if (r1 > r0)
            for (uint32_t m = na; m; m &= m - 1) {
                grammar_shape_root *sr = &sh->roots[__builtin_ctz(m)];
                sr->n_in += (uint32_t)(r1 - r0);
                if (sr->n_in_rng && sr->in_rng[2 * sr->n_in_rng - 1] == r0) {
                    sr->in_rng[2 * sr->n_in_rng - 1] = r1;
                    continue;
                }
                if (grammar_grow((void **)&sr->in_rng, &cap_rng[__builtin_ctz(m)],
                                 2 * sr->n_in_rng + 2, sizeof *sr->in_rng))
                    goto nomem;
                sr->in_rng[2 * sr->n_in_rng] = r0;
                sr->in_rng[2 * sr->n_in_rng + 1] = r1;
                sr->n_in_rng++;
            }
        i++;
    }
    for (int r = 0; r < R && !rc; r++) {
        ix->bytes_used += sh->roots[r].n_exits * sizeof *sh->roots[r].exits +
                          2 * sh->roots[r].n_in_rng * sizeof(int32_t);
        rc = root_bits(ix, &sh->roots[r]);
    }
    goto done;
nomem:
    rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
done:
    free(vec);
    free(alive);
    free(cap_ex);
    free(cap_rng);
    return rc;
}

/* Look at q (its first build): when it starts a shape, find or make the shape and map this
 * copy's roots to it (shape_of: copy, shape_slot: root). */
static int shape_map(grammar_index *ix, int32_t q) {
    const grammar *g = ix->g;
    ix->shape_of[q] = -1;
    if (!shape_start(ix, q) || ix->n_shapes >= SHAPE_MAX_COUNT || ix->shape_bytes > SHAPE_MAX_BYTES)
        return 0;
    int rc = 0;
    int32_t *st = malloc(GRAMMAR_SHAPE_MAX * sizeof *st);
    int16_t *table = malloc((size_t)GRAMMAR_SHAPE_MAX * 256 * sizeof *table);
    if (!st || !table) {
        rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        goto done;
    }
    /* breadth first from q; states beyond the limit count as outside */
    int16_t *at = ix->shape_at;
    int n = 1;
    st[0] = q;
    at[q] = 0;
    for (int k = 0; k < n; k++) {
        int32_t prev = -3;
        int16_t x = -2;
        for (int b = 0; b < 256; b++) {
            int32_t t = grammar_next(g, st[k], (uint8_t)b);
            if (t != prev) {
                prev = t;
                if (t < 0) {
                    x = -2;
                } else if (!region_member(g, t)) {
                    x = -1;
                } else {
                    if (at[t] < 0 && n < GRAMMAR_SHAPE_MAX) {
                        at[t] = (int16_t)n;
                        st[n++] = t;
                    }
                    x = at[t];
                }
            }
            table[k * 256 + b] = x;
        }
    }
    for (int k = 0; k < n; k++) at[st[k]] = -1;
    size_t tn = (size_t)n * 256;
    uint64_t h = shape_hash(table, tn);
    size_t id = 0;
    while (id < ix->n_shapes && (ix->shapes[id].n != n || ix->shapes[id].hash != h ||
                                 memcmp(ix->shapes[id].table, table, tn * sizeof *table)))
        id++;
    if (id == ix->n_shapes) { /* a new shape: its roots (a function of the table) and pass */
        if (grammar_grow((void **)&ix->shapes, &ix->cap_shapes, ix->n_shapes + 1, sizeof *ix->shapes)) {
            rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            goto done;
        }
        grammar_shape *sh = &ix->shapes[id];
        memset(sh, 0, sizeof *sh);
        sh->n = n;
        sh->hash = h;
        for (int k = 0; k < n && sh->n_roots < GRAMMAR_SHAPE_ROOTS; k++) {
            int into = 0;
            int32_t toks = 0;
            for (int b = 0; b < 256; b++)
                if (table[k * 256 + b] >= 0) into++, toks += ix->first_tok[b];
            if (k == 0 || (into >= REGION_MIN_LOOPS && toks >= SHAPE_MIN_TOKENS))
                sh->root_idx[sh->n_roots++] = (int16_t)k;
        }
        sh->table = malloc(tn * sizeof *table);
        if (!sh->table) {
            rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            goto done;
        }
        memcpy(sh->table, table, tn * sizeof *table);
        ix->n_shapes++;
        size_t before = ix->bytes_used;
        if ((rc = shape_pass(ix, sh))) goto done;
        ix->bytes_used += tn * sizeof *table;
        ix->shape_bytes += ix->bytes_used - before;
    }
    /* this copy: its real states, and its roots mapped (unless already in another copy) */
    if (grammar_grow((void **)&ix->copies, &ix->cap_copies, ix->n_copies + 1, sizeof *ix->copies) ||
        grammar_grow((void **)&ix->copy_states, &ix->cap_copy_states, ix->n_copy_states + (size_t)n,
                     sizeof *ix->copy_states)) {
        rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        goto done;
    }
    ix->copies[ix->n_copies].shape = (int32_t)id;
    ix->copies[ix->n_copies].off = ix->n_copy_states;
    memcpy(ix->copy_states + ix->n_copy_states, st, (size_t)n * sizeof *st);
    ix->n_copy_states += (size_t)n;
    ix->bytes_used += (size_t)n * sizeof *st;
    const grammar_shape *sh = &ix->shapes[id];
    for (int r = 0; r < sh->n_roots; r++) {
        int32_t s2 = st[sh->root_idx[r]];
        if (s2 == q || ix->shape_of[s2] == -2) {
            ix->shape_of[s2] = (int32_t)ix->n_copies;
            ix->shape_slot[s2] = (int16_t)r;
        }
    }
    ix->n_copies++;
done:
    free(st);
    free(table);
    return rc;
}

/* The cache of q from its shape root: the root's tokens plus walks below its exits from the
 * copy's real states. */
static int build_shape_state(grammar_index *ix, int32_t q) {
    const grammar_vocab *v = ix->v;
    grammar_state_cache *c = &ix->cache[q];
    const grammar_copy *cp = &ix->copies[ix->shape_of[q]];
    grammar_shape_root *sr = &ix->shapes[cp->shape].roots[ix->shape_slot[q]];
    const int32_t *st = ix->copy_states + cp->off;
    size_t n_acc = 0, n_unc = 0;
    int rc;
    ix->acc_floor = 0;
    /* an exit node without children (most: a token that ends with the closing quote): its
     * tokens' verdict depends only on the state the exit byte leads to */
    int32_t leaf_t[8], n_leaf = 0;
    int8_t leaf_v[8];
    for (size_t e = 0; e < sr->n_exits; e++) {
        int32_t i = sr->exits[e][0], from = st[sr->exits[e][1]];
        int32_t t = grammar_next(ix->g, from, v->tn_byte[i]);
        if (v->tn_skip[i] == i + 1 && v->tn_nrank[i] > 0) {
            int k = 0;
            while (k < n_leaf && leaf_t[k] != t) k++;
            if (k < n_leaf) {
                int32_t r0 = v->tn_rank[i], r1 = r0 + v->tn_nrank[i];
                if (leaf_v[k] == 1 && (rc = acc_range(ix, &n_acc, r0, r1))) return rc;
                for (int32_t r = r0; leaf_v[k] == 2 && r < r1; r++)
                    if ((rc = push_id(&ix->tmp_unc, &ix->cap_tmp_unc, &n_unc, r))) return rc;
                continue;
            }
            if (n_leaf < 8) { /* walk this one and remember its verdict */
                size_t t0 = ix->n_tok_acc, u0 = n_unc;
                if ((rc = walk_subtree(ix, from, i, i + 1, &n_acc, &n_unc))) return rc;
                leaf_t[n_leaf] = t;
                leaf_v[n_leaf++] = (int8_t)(ix->n_tok_acc > t0 ? 1 : n_unc > u0 ? 2 : 0);
                continue;
            }
        }
        /* what lies below an exit depends on the state its byte leads to (by class) and the
         * node: the same for the roots of a counted chain (the closing quote leads to one
         * state from every count), so kept with the shared subtree results */
        uint64_t key = EXIT_KEY(ix->rep[t], i);
        if ((rc = sub_get(ix, key, &n_acc, &n_unc)) < 0) return rc;
        if (rc) continue;
        size_t a0 = n_acc, u0 = n_unc;
        if ((rc = walk_subtree(ix, from, i, v->tn_skip[i], &n_acc, &n_unc)) ||
            (rc = sub_store(ix, key, a0, n_acc - a0, u0, n_unc - u0)))
            return rc;
    }
    size_t words = ((size_t)v->n_vocab + 31) / 32, n_tok = sr->n_in + ix->n_tok_acc;
    if (n_tok > words && sr->in_bits) {
        c->dense = 1;
        c->acc = malloc(words * sizeof *c->acc);
        if (!c->acc) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
        memcpy(c->acc, sr->in_bits, words * sizeof *c->acc);
        for (size_t k = 0; k < n_acc; k++)
            for (int32_t r = ix->tmp_acc[2 * k]; r < ix->tmp_acc[2 * k + 1]; r++)
                c->acc[v->order[r] / 32] |= 1u << (v->order[r] % 32);
        ix->bytes_used += words * sizeof *c->acc;
        c->n_acc = (uint32_t)n_tok;
    } else { /* few tokens stay: acc_finish from all the ranges, in rank order */
        for (size_t k = 0; k < sr->n_in_rng; k++)
            if ((rc = acc_range(ix, &n_acc, sr->in_rng[2 * k], sr->in_rng[2 * k + 1]))) return rc;
        if (n_acc > 1) qsort(ix->tmp_acc, n_acc, 2 * sizeof *ix->tmp_acc, cmp_i32);
        if ((rc = acc_finish(ix, c, n_acc))) return rc;
    }
    return unc_finish(ix, c, n_unc);
}

static int build_state(grammar_index *ix, int32_t q) {
    const grammar *g = ix->g;
    const grammar_vocab *v = ix->v;
    grammar_state_cache *c = &ix->cache[q];
    double t0 = now_ms();
    size_t n_acc = 0, n_unc = 0; /* accepted: rank ranges */
    ix->n_tok_acc = 0;
    if (++ix->build_stamp == 0) {
        memset(ix->acc_stamp, 0, (size_t)v->n_order * sizeof *ix->acc_stamp);
        ix->build_stamp = 1;
    }
    int rc = 0;
    if (!ix->no_share && ix->shape_of[q] == -2 && (rc = shape_map(ix, q))) return rc;
    if (!ix->no_share && ix->shape_of[q] >= 0) {
        if ((rc = build_shape_state(ix, q))) return rc;
        c->built = 1;
        ix->region_builds++;
        ix->build_ms += now_ms() - t0;
        return 0;
    }
    /* one first byte at a time. The walk enters a first-byte subtree through q's own byte edge
     * to t and continues from the closure of [caller of the rule, t] (grammar_stepper_step
     * expands after the byte): what it finds below depends only on t (t's rule is q's) and
     * the byte, so it is shared between states (and with t's class: equal behaviour within
     * a token's length, see cache classes) */
    for (int32_t i = 0; i < v->n_nodes && !rc; i = v->tn_skip[i]) {
        uint8_t b = v->tn_byte[i];
        int32_t t = grammar_next(g, q, b), end = v->tn_skip[i];
        if (t < 0) continue;
        int32_t n_tok = (end < v->n_nodes ? v->tn_rank[end] : v->n_order) - v->tn_rank[i];
        bool shareable = n_tok >= SUB_MIN_TOKENS && !ix->no_share;
        uint64_t key = ((uint64_t)(uint32_t)ix->rep[t] << 8) | b;
        if (shareable) {
            if ((rc = sub_get(ix, key, &n_acc, &n_unc)) < 0) break;
            if (rc) {
                rc = 0;
                continue;
            }
        }
        size_t a0 = n_acc, u0 = n_unc;
        rc = walk_subtree(ix, q, i, end, &n_acc, &n_unc);
        if (!rc && shareable)
            rc = sub_store(ix, key, a0, n_acc - a0, u0, n_unc - u0);
    }
    if (rc) return rc;
    if ((rc = acc_finish(ix, c, n_acc)) || (rc = unc_finish(ix, c, n_unc))) return rc;
    c->built = 1;
    ix->build_ms += now_ms() - t0;
    return 0;
}

int grammar_index_state(grammar_index *ix, int32_t q, const grammar_state_cache **out) {
    if (!ix->no_share) q = ix->rep[q]; /* equal caches are built once (see cache classes) */
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
        if (ix->g->has_bytes[q] && ix->rep[q] == q && !ix->cache[q].built) {
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
