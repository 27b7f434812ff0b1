/* Parse stacks as hash-consed frames (DFA state, caller frame), and the byte step of the
 * pushdown automaton over sets of such stacks. Frames are only ever removed last-in first-out
 * (grammar_store_truncate), which lets the trie walks and rollback reuse one store without
 * garbage: deleting linear-probing entries in reverse insertion order restores the table. */
#include "grammar_int.h"

#include <string.h>

#define STEP_MAX_DEPTH 20000
#define STEP_MAX_SET (1u << 16)

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static uint64_t key_hash(int32_t q, int32_t parent) {
    return mix64(((uint64_t)(uint32_t)q << 32) | (uint32_t)parent);
}

int grammar_store_init(grammar_store *s, size_t cap) {
    memset(s, 0, sizeof *s);
    if (cap < 64) cap = 64;
    s->cap = cap;
    s->q = malloc(cap * sizeof *s->q);
    s->parent = malloc(cap * sizeof *s->parent);
    s->ctx = malloc(cap);
    s->h = malloc(cap * sizeof *s->h);
    s->slot = malloc(cap * sizeof *s->slot);
    size_t t = 128;
    while (t < cap * 2) t *= 2;
    s->table = calloc(t, sizeof *s->table);
    s->tmask = t - 1;
    if (!s->q || !s->parent || !s->ctx || !s->h || !s->slot || !s->table) {
        grammar_store_deinit(s);
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    }
    /* node 0: complete at the real bottom; node 1: complete in an unknown context */
    if (grammar_store_intern(s, GQ_COMPLETE, -1) != 0 || grammar_store_intern(s, GQ_COMPLETE, -2) != 1) {
        grammar_store_deinit(s);
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    }
    return 0;
}

void grammar_store_deinit(grammar_store *s) {
    free(s->q);
    free(s->parent);
    free(s->ctx);
    free(s->h);
    free(s->slot);
    free(s->table);
    memset(s, 0, sizeof *s);
}

static int store_grow(grammar_store *s) {
    size_t cap = s->cap * 2;
    int32_t *q = realloc(s->q, cap * sizeof *q);
    if (!q) return -1;
    s->q = q;
    int32_t *p = realloc(s->parent, cap * sizeof *p);
    if (!p) return -1;
    s->parent = p;
    uint8_t *c = realloc(s->ctx, cap);
    if (!c) return -1;
    s->ctx = c;
    uint64_t *h = realloc(s->h, cap * sizeof *h);
    if (!h) return -1;
    s->h = h;
    uint32_t *sl = realloc(s->slot, cap * sizeof *sl);
    if (!sl) return -1;
    s->slot = sl;
    s->cap = cap;
    size_t t = (s->tmask + 1) * 2;
    uint32_t *tab = calloc(t, sizeof *tab);
    if (!tab) return -1;
    free(s->table);
    s->table = tab;
    s->tmask = t - 1;
    for (size_t id = 0; id < s->n; id++) {
        size_t i = key_hash(s->q[id], s->parent[id]) & s->tmask;
        while (s->table[i]) i = (i + 1) & s->tmask;
        s->table[i] = (uint32_t)id + 1;
        s->slot[id] = (uint32_t)i;
    }
    return 0;
}

int32_t grammar_store_intern(grammar_store *s, int32_t q, int32_t parent) {
    uint64_t kh = key_hash(q, parent);
    size_t i = kh & s->tmask;
    for (;; i = (i + 1) & s->tmask) {
        uint32_t v = s->table[i];
        if (!v) break;
        if (s->q[v - 1] == q && s->parent[v - 1] == parent) return (int32_t)(v - 1);
    }
    if (s->n >= INT32_MAX - 1) return -1;
    if (s->n + 1 > s->cap || (s->n + 1) * 2 > s->tmask + 1) {
        if (store_grow(s)) return -1;
        i = kh & s->tmask;
        while (s->table[i]) i = (i + 1) & s->tmask;
    }
    size_t id = s->n++;
    s->q[id] = q;
    s->parent[id] = parent;
    uint8_t ctx;
    uint64_t ph;
    if (q == GQ_W) {
        ctx = 1, ph = 0x57;
    } else if (q == GQ_P0) {
        ctx = 0, ph = 0x50;
    } else if (q == GQ_COMPLETE) {
        ctx = parent == -2, ph = 0x43;
    } else {
        ctx = parent >= 0 ? s->ctx[parent] : 0;
        ph = parent >= 0 ? s->h[parent] : 0x42;
    }
    s->ctx[id] = ctx;
    s->h[id] = mix64(ph * 0x9e3779b97f4a7c15ull + (uint64_t)(uint32_t)q + 1) ^
               (q < 0 ? (uint64_t)(uint32_t)parent << 7 : 0);
    s->table[i] = (uint32_t)id + 1;
    s->slot[id] = (uint32_t)i;
    return (int32_t)id;
}

void grammar_store_truncate(grammar_store *s, size_t n) {
    while (s->n > n) {
        s->n--;
        s->table[s->slot[s->n]] = 0;
    }
}

int grammar_stepper_init(grammar_stepper *sp, const grammar *g, grammar_store *st) {
    memset(sp, 0, sizeof *sp);
    sp->g = g;
    sp->st = st;
    sp->cap_out = 64;
    sp->out = malloc(sp->cap_out * sizeof *sp->out);
    sp->wstamp = calloc((size_t)g->n_rules, sizeof *sp->wstamp);
    if (!sp->out || !sp->wstamp) {
        grammar_stepper_deinit(sp);
        return grammar_err(GRAMMAR_ENOMEM, "out of memory");
    }
    return 0;
}

void grammar_stepper_deinit(grammar_stepper *sp) {
    free(sp->out);
    free(sp->wstamp);
    free(sp->seen);
    memset(sp, 0, sizeof *sp);
}

static void add_out(grammar_stepper *sp, int32_t id) {
    if ((size_t)id >= sp->cap_seen) {
        size_t cap = sp->cap_seen ? sp->cap_seen : 1024;
        while (cap <= (size_t)id) cap *= 2;
        uint32_t *n = realloc(sp->seen, cap * sizeof *n);
        if (!n) {
            sp->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            return;
        }
        memset(n + sp->cap_seen, 0, (cap - sp->cap_seen) * sizeof *n);
        sp->seen = n;
        sp->cap_seen = cap;
    }
    if (sp->seen[id] == sp->stamp) return;
    sp->seen[id] = sp->stamp;
    if (sp->n_out >= STEP_MAX_SET) {
        sp->err = grammar_err(GRAMMAR_ELIMIT, "grammar too ambiguous: more than %u parse stacks",
                              STEP_MAX_SET);
        return;
    }
    if (sp->n_out == sp->cap_out &&
        grammar_grow((void **)&sp->out, &sp->cap_out, sp->n_out + 1, sizeof *sp->out)) {
        sp->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        return;
    }
    sp->out[sp->n_out++] = id;
}

static void expand(grammar_stepper *sp, int32_t q, int32_t parent);

static void next_stamp(grammar_stepper *sp) {
    if (++sp->stamp == 0) { /* wrapped: forget every old mark */
        if (sp->seen) memset(sp->seen, 0, sp->cap_seen * sizeof *sp->seen);
        memset(sp->wstamp, 0, (size_t)sp->g->n_rules * sizeof *sp->wstamp);
        sp->stamp = 1;
    }
}

/* Return from rule r to any of its callers: every return state of r, with an unknown caller of
 * its own rule below (GQ_W); and complete in an unknown context when r is the root. */
static void pop_any(grammar_stepper *sp, int32_t r) {
    const grammar *g = sp->g;
    if (sp->wstamp[r] == sp->stamp) return;
    sp->wstamp[r] = sp->stamp;
    for (int32_t k = g->ret_off[r]; k < g->ret_off[r + 1] && !sp->err; k++) {
        int32_t q2 = g->rets[k];
        int32_t w = grammar_store_intern(sp->st, GQ_W, g->state_rule[q2]);
        if (w < 0) {
            sp->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            return;
        }
        expand(sp, q2, w);
    }
    if (r == g->root) add_out(sp, 1);
}

static void pop(grammar_stepper *sp, int32_t parent) {
    if (parent < 0) {
        add_out(sp, 0);
        return;
    }
    grammar_store *st = sp->st;
    int32_t pq = st->q[parent];
    if (pq == GQ_P0 && sp->no_w) {
        sp->p0_popped = 1;
        return;
    }
    if (pq == GQ_P0 || pq == GQ_W) {
        pop_any(sp, st->parent[parent]);
        return;
    }
    expand(sp, pq, st->parent[parent]);
}

static void expand(grammar_stepper *sp, int32_t q, int32_t parent) {
    const grammar *g = sp->g;
    if (sp->err) return;
    if (++sp->depth > STEP_MAX_DEPTH) {
        sp->err = grammar_err(GRAMMAR_ELIMIT, "parse stack deeper than %d", STEP_MAX_DEPTH);
        sp->depth--;
        return;
    }
    if (g->has_bytes[q]) {
        int32_t id = grammar_store_intern(sp->st, q, parent);
        if (id < 0) {
            sp->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        } else {
            add_out(sp, id);
        }
    }
    if (g->final[q]) pop(sp, parent);
    for (int32_t k = g->ref_off[q]; k < g->ref_off[q + 1] && !sp->err; k++) {
        int32_t ret = grammar_store_intern(sp->st, g->refs[k].ret, parent);
        if (ret < 0) {
            sp->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            break;
        }
        expand(sp, g->rule_start[g->refs[k].rule], ret);
    }
    sp->depth--;
}

int grammar_stepper_start(grammar_stepper *sp, int32_t rule, int32_t parent) {
    sp->n_out = 0;
    sp->err = 0;
    sp->depth = 0;
    next_stamp(sp);
    expand(sp, sp->g->rule_start[rule], parent);
    return sp->err;
}

int grammar_stepper_callers(grammar_stepper *sp, int32_t rule) {
    sp->n_out = 0;
    sp->err = 0;
    sp->depth = 0;
    next_stamp(sp);
    pop_any(sp, rule);
    return sp->err;
}

int grammar_stepper_step(grammar_stepper *sp, const int32_t *in, size_t n, uint8_t b) {
    const grammar *g = sp->g;
    const grammar_store *st = sp->st;
    sp->n_out = 0;
    sp->err = 0;
    sp->depth = 0;
    next_stamp(sp);
    for (size_t i = 0; i < n && !sp->err; i++) {
        int32_t q = st->q[in[i]];
        if (q < 0) continue;
        int32_t t = grammar_next(g, q, b);
        if (t >= 0) expand(sp, t, st->parent[in[i]]);
    }
    return sp->err;
}
