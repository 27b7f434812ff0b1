/* Grammar IR -> one byte-level DFA per rule (Thompson NFA, then subset construction with rule
 * calls as symbols), plus the tables the matcher needs: return states per rule, shortest
 * completion per state. Left recursion is refused here. */
#include "grammar_int.h"

#include <string.h>

#define MAX_NFA_STATES (4u << 20)
#define MAX_DFA_STATES (1u << 18)
#define MAX_RULE_STATES (1u << 16)
/* NFA states held by all DFA states together. Sets that stay large (a `.*` inside a repeated
 * group) reach it long before the state limits, and bound the time and memory of a grammar that
 * blows up: the largest grammars of the test suite hold about 24,000. */
#define MAX_SET_ITEMS (1u << 21)

enum { NE_EPS, NE_BYTE, NE_REF };

typedef struct {
    uint8_t kind, lo, hi;
    int32_t arg; /* rule for NE_REF */
    int32_t to;
    int32_t next; /* next edge of the same state, -1 */
} nedge;

typedef struct {
    int32_t *head; /* first edge per state */
    size_t n_states, cap_states;
    nedge *e;
    size_t n_e, cap_e;
    int err;
    const uint8_t *inline_ok; /* per rule: written in place of its references */
    size_t rule_base;         /* NFA states when the current rule began */
} nfa;

#define INLINE_MAX_SIZE 100      /* rules up to this expanded size are inlined... */
#define INLINE_RULE_BUDGET 20000 /* ...while the rule being built has fewer NFA states */

static int32_t nfa_state(nfa *a) {
    if (a->n_states >= MAX_NFA_STATES) {
        a->err = grammar_err(GRAMMAR_ELIMIT, "grammar too large (more than %u NFA states)",
                             MAX_NFA_STATES);
        return -1;
    }
    if (grammar_grow((void **)&a->head, &a->cap_states, a->n_states + 1, sizeof *a->head)) {
        a->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        return -1;
    }
    a->head[a->n_states] = -1;
    return (int32_t)a->n_states++;
}

static int nfa_edge(nfa *a, int32_t from, int kind, uint8_t lo, uint8_t hi, int32_t arg,
                    int32_t to) {
    if (grammar_grow((void **)&a->e, &a->cap_e, a->n_e + 1, sizeof *a->e))
        return a->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
    nedge *x = &a->e[a->n_e];
    x->kind = (uint8_t)kind;
    x->lo = lo;
    x->hi = hi;
    x->arg = arg;
    x->to = to;
    x->next = a->head[from];
    a->head[from] = (int32_t)a->n_e++;
    return 0;
}

static void utf8_encode(uint32_t cp, uint8_t *b, int n) {
    if (n == 1) {
        b[0] = (uint8_t)cp;
    } else if (n == 2) {
        b[0] = (uint8_t)(0xC0 | (cp >> 6));
        b[1] = (uint8_t)(0x80 | (cp & 0x3F));
    } else if (n == 3) {
        b[0] = (uint8_t)(0xE0 | (cp >> 12));
        b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
    } else {
        b[0] = (uint8_t)(0xF0 | (cp >> 18));
        b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (uint8_t)(0x80 | (cp & 0x3F));
    }
}

/* Codepoints [lo, hi] of one UTF-8 length n as byte-range sequences from `from` to `to`
 * (the classic split: each piece is a product of byte ranges). */
static int utf8_seq(nfa *a, int32_t from, int32_t to, uint32_t lo, uint32_t hi, int n) {
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                if (utf8_seq(a, from, to, lo, lo | m, n)) return a->err;
                return utf8_seq(a, from, to, (lo | m) + 1, hi, n);
            }
            if ((hi & m) != m) {
                if (utf8_seq(a, from, to, lo, (hi & ~m) - 1, n)) return a->err;
                return utf8_seq(a, from, to, hi & ~m, hi, n);
            }
        }
    }
    uint8_t bl[4], bh[4];
    utf8_encode(lo, bl, n);
    utf8_encode(hi, bh, n);
    int32_t cur = from;
    for (int i = 0; i < n; i++) {
        int32_t nx = i == n - 1 ? to : nfa_state(a);
        if (nx < 0) return a->err;
        if (nfa_edge(a, cur, NE_BYTE, bl[i], bh[i], 0, nx)) return a->err;
        cur = nx;
    }
    return 0;
}

static int utf8_range(nfa *a, int32_t from, int32_t to, uint32_t lo, uint32_t hi) {
    static const uint32_t lim[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    if (lo <= 0xDFFF && hi >= 0xD800) { /* no surrogates */
        if (lo < 0xD800 && utf8_range(a, from, to, lo, 0xD7FF)) return a->err;
        if (hi > 0xDFFF) return utf8_range(a, from, to, 0xE000, hi);
        return 0;
    }
    uint32_t start = 0;
    for (int n = 1; n <= 4; n++) {
        uint32_t l = lo > start ? lo : start, h = hi < lim[n - 1] ? hi : lim[n - 1];
        if (l <= h && utf8_seq(a, from, to, l, h, n)) return a->err;
        start = lim[n - 1] + 1;
    }
    return 0;
}

/* Thompson construction of AST node `x` starting at state `s`; returns the end state. */
static int32_t build(nfa *a, const grammar_ir *ir, int x, int32_t s, int depth) {
    if (depth > 1000) {
        a->err = grammar_err(GRAMMAR_ELIMIT, "grammar nested too deeply");
        return -1;
    }
    const grammar_ast *n = &ir->nodes[x];
    switch (n->kind) {
    case GA_EMPTY:
        return s;
    case GA_LIT: {
        int32_t cur = s;
        for (int32_t i = 0; i < n->count; i++) {
            int32_t nx = nfa_state(a);
            if (nx < 0) return -1;
            uint8_t b = ir->bytes[n->first + i];
            if (nfa_edge(a, cur, NE_BYTE, b, b, 0, nx)) return -1;
            cur = nx;
        }
        return cur;
    }
    case GA_CLASS: {
        int32_t e = nfa_state(a);
        if (e < 0) return -1;
        for (int32_t i = 0; i < n->count; i++)
            if (utf8_range(a, s, e, ir->ranges[n->first + 2 * i], ir->ranges[n->first + 2 * i + 1]))
                return -1;
        return e;
    }
    case GA_REF: {
        if (a->inline_ok && a->inline_ok[n->ref] && a->n_states - a->rule_base < INLINE_RULE_BUDGET)
            return build(a, ir, ir->rule_body[n->ref], s, depth + 1);
        int32_t e = nfa_state(a);
        if (e < 0 || nfa_edge(a, s, NE_REF, 0, 0, n->ref, e)) return -1;
        return e;
    }
    case GA_SEQ: {
        int32_t cur = s;
        for (int32_t i = 0; i < n->count; i++) {
            cur = build(a, ir, ir->kids[n->first + i], cur, depth + 1);
            if (cur < 0) return -1;
        }
        return cur;
    }
    case GA_ALT: {
        int32_t e = nfa_state(a);
        if (e < 0) return -1;
        for (int32_t i = 0; i < n->count; i++) {
            int32_t b = nfa_state(a);
            if (b < 0 || nfa_edge(a, s, NE_EPS, 0, 0, 0, b)) return -1;
            int32_t end = build(a, ir, ir->kids[n->first + i], b, depth + 1);
            if (end < 0 || nfa_edge(a, end, NE_EPS, 0, 0, 0, e)) return -1;
        }
        return e;
    }
    case GA_REP: {
        int32_t cur = s;
        for (int32_t i = 0; i < n->min; i++) {
            cur = build(a, ir, n->first, cur, depth + 1);
            if (cur < 0) return -1;
        }
        if (n->max < 0) {
            int32_t loop = nfa_state(a), b = nfa_state(a);
            if (loop < 0 || b < 0 || nfa_edge(a, cur, NE_EPS, 0, 0, 0, loop) ||
                nfa_edge(a, loop, NE_EPS, 0, 0, 0, b))
                return -1;
            int32_t end = build(a, ir, n->first, b, depth + 1);
            if (end < 0 || nfa_edge(a, end, NE_EPS, 0, 0, 0, loop)) return -1;
            return loop;
        }
        if (n->max == n->min) return cur;
        int32_t e = nfa_state(a);
        if (e < 0) return -1;
        for (int32_t i = n->min; i < n->max; i++) {
            if (nfa_edge(a, cur, NE_EPS, 0, 0, 0, e)) return -1;
            cur = build(a, ir, n->first, cur, depth + 1);
            if (cur < 0) return -1;
        }
        if (nfa_edge(a, cur, NE_EPS, 0, 0, 0, e)) return -1;
        return e;
    }
    }
    a->err = grammar_err(GRAMMAR_EINTERNAL, "bad AST node");
    return -1;
}

/* ----- subset construction ----- */

typedef struct {
    const nfa *a;
    uint32_t *stamp;
    uint32_t cur;
    int32_t *stack;
    /* DFA sets: set i = items[set_off[i] .. set_off[i + 1]) */
    int32_t *items;
    size_t n_items, cap_items;
    size_t *set_off;
    size_t cap_off;
    uint32_t *htab; /* set id + 1 */
    size_t hmask;
    grammar *g;
    size_t cap_states;
    size_t n_trans, cap_trans;
    int cur_ncls;
    int32_t rule_first; /* first DFA state of the rule being built */
    grammar_ref *refs;
    size_t n_refs, cap_refs;
    int32_t *ref_off;
    size_t cap_ref_off;
    int err;
} sc;

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return a < b ? -1 : a > b;
}

/* Epsilon closure of tmp[0..n) (appended to items as a new candidate set). Returns its size. */
static size_t closure(sc *c, const int32_t *seed, size_t n) {
    c->cur++;
    size_t sp = 0, base = c->n_items;
    for (size_t i = 0; i < n; i++)
        if (c->stamp[seed[i]] != c->cur) {
            c->stamp[seed[i]] = c->cur;
            c->stack[sp++] = seed[i];
        }
    while (sp) {
        int32_t s = c->stack[--sp];
        if (c->n_items >= MAX_SET_ITEMS) {
            c->err = grammar_err(GRAMMAR_ELIMIT,
                                 "grammar too large (its states hold more than %u "
                                 "NFA states in all)",
                                 MAX_SET_ITEMS);
            return 0;
        }
        if (grammar_grow((void **)&c->items, &c->cap_items, c->n_items + 1, sizeof *c->items)) {
            c->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            return 0;
        }
        c->items[c->n_items++] = s;
        for (int32_t e = c->a->head[s]; e >= 0; e = c->a->e[e].next)
            if (c->a->e[e].kind == NE_EPS && c->stamp[c->a->e[e].to] != c->cur) {
                c->stamp[c->a->e[e].to] = c->cur;
                c->stack[sp++] = c->a->e[e].to;
            }
    }
    qsort(c->items + base, c->n_items - base, sizeof *c->items, cmp_i32);
    return c->n_items - base;
}

static uint64_t hash_set(const int32_t *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int add_dfa_state(sc *c, int32_t rule, int32_t accept_nfa, const int32_t *set, size_t n);

/* The candidate set at items[base..) (size n): find it or make it a new DFA state. */
static int32_t intern_set(sc *c, size_t base, size_t n, int32_t rule, int32_t accept_nfa) {
    if (n == 0) return -1;
    const int32_t *set = c->items + base;
    uint64_t h = hash_set(set, n);
    for (size_t i = h & c->hmask;; i = (i + 1) & c->hmask) {
        uint32_t v = c->htab[i];
        if (!v) break;
        size_t id = v - 1;
        size_t len = c->set_off[id + 1] - c->set_off[id];
        if (len == n && memcmp(c->items + c->set_off[id], set, n * sizeof *set) == 0) {
            c->n_items = base; /* drop the candidate copy */
            return (int32_t)id;
        }
    }
    return add_dfa_state(c, rule, accept_nfa, set, n) ? -2 : c->g->n_states - 1;
}

static int rehash(sc *c) {
    size_t cap = (c->hmask + 1) * 2;
    uint32_t *t = calloc(cap, sizeof *t);
    if (!t) return c->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
    for (int32_t id = 0; id < c->g->n_states; id++) {
        const int32_t *s = c->items + c->set_off[id];
        size_t n = c->set_off[id + 1] - c->set_off[id];
        size_t i = hash_set(s, n) & (cap - 1);
        while (t[i]) i = (i + 1) & (cap - 1);
        t[i] = (uint32_t)id + 1;
    }
    free(c->htab);
    c->htab = t;
    c->hmask = cap - 1;
    return 0;
}

/* The set is already at the end of items (the candidate): keep it as state n_states. */
static int add_dfa_state(sc *c, int32_t rule, int32_t accept_nfa, const int32_t *set, size_t n) {
    grammar *g = c->g;
    if ((size_t)g->n_states >= MAX_DFA_STATES)
        return c->err = grammar_err(GRAMMAR_ELIMIT, "grammar too large (more than %u states)",
                                    MAX_DFA_STATES);
    if ((uint32_t)(g->n_states - c->rule_first) >= MAX_RULE_STATES)
        return c->err = grammar_err(GRAMMAR_ELIMIT, "rule '%s' too large (more than %u states)",
                                    g->rule_names[rule], MAX_RULE_STATES);
    size_t id = (size_t)g->n_states;
    if (grammar_grow((void **)&g->trans, &c->cap_trans, c->n_trans + (size_t)c->cur_ncls,
                     sizeof(int32_t)))
        goto oom;
    size_t cap = c->cap_states;
    if (grammar_grow((void **)&g->row_off, &cap, id + 1, sizeof(uint32_t))) goto oom;
    cap = c->cap_states;
    if (grammar_grow((void **)&g->final, &cap, id + 1, 1)) goto oom;
    cap = c->cap_states;
    if (grammar_grow((void **)&g->has_bytes, &cap, id + 1, 1)) goto oom;
    cap = c->cap_states;
    if (grammar_grow((void **)&g->state_rule, &cap, id + 1, sizeof(int32_t))) goto oom;
    c->cap_states = cap;
    if (grammar_grow((void **)&c->set_off, &c->cap_off, id + 2, sizeof *c->set_off)) goto oom;
    /* the set occupies items[n_items - n .. n_items) */
    c->set_off[id] = (size_t)(set - c->items);
    c->set_off[id + 1] = c->set_off[id] + n;
    g->row_off[id] = (uint32_t)c->n_trans;
    for (int k = 0; k < c->cur_ncls; k++) g->trans[c->n_trans + (size_t)k] = -1;
    c->n_trans += (size_t)c->cur_ncls;
    g->final[id] = 0;
    for (size_t i = 0; i < n; i++)
        if (set[i] == accept_nfa) g->final[id] = 1;
    g->state_rule[id] = rule;
    g->has_bytes[id] = 0;
    g->n_states++;
    if ((size_t)g->n_states * 2 > c->hmask + 1 && rehash(c)) return c->err;
    size_t i = hash_set(set, n) & c->hmask;
    while (c->htab[i]) i = (i + 1) & c->hmask;
    c->htab[i] = (uint32_t)id + 1;
    return 0;
oom:
    return c->err = grammar_err(GRAMMAR_ENOMEM, "out of memory");
}

/* The DFA state of the closure of seed[0..n) (found or made): *t, or an error. */
static int target_state(sc *c, const int32_t *seed, size_t n, int32_t rule, int32_t accept, int32_t *t) {
    size_t base = c->n_items;
    size_t m = closure(c, seed, n);
    if (c->err) return c->err;
    *t = intern_set(c, base, m, rule, accept);
    return *t < -1 ? c->err : 0;
}

/* Subset construction of one rule whose NFA starts at nfa state `start`, accepts at `accept`. */
static int determinize_rule(sc *c, int32_t rule, int32_t start, int32_t accept, int32_t nfa_end) {
    grammar *g = c->g;
    /* byte classes of the rule: bytes no edge of its NFA tells apart */
    {
        uint8_t cut[257];
        memset(cut, 0, sizeof cut);
        for (int32_t s = start; s < nfa_end; s++)
            for (int32_t e = c->a->head[s]; e >= 0; e = c->a->e[e].next)
                if (c->a->e[e].kind == NE_BYTE) {
                    cut[c->a->e[e].lo] = 1;
                    cut[c->a->e[e].hi + 1] = 1;
                }
        int k = 0;
        uint8_t *cls = g->rule_cls + (size_t)rule * 256;
        for (int b = 0; b < 256; b++) {
            if (b > 0 && cut[b]) k++;
            cls[b] = (uint8_t)k;
        }
        c->cur_ncls = k + 1;
        g->rule_ncls[rule] = (uint16_t)(k + 1);
    }
    c->rule_first = g->n_states;
    size_t base = c->n_items;
    size_t n = closure(c, &start, 1);
    if (c->err) return c->err;
    int32_t s0 = intern_set(c, base, n, rule, accept);
    if (s0 < 0) return c->err ? c->err : grammar_err(GRAMMAR_EINTERNAL, "empty start set");
    g->rule_start[rule] = s0;
    int32_t *seed = NULL;
    size_t cap_seed = 0;
    int rc = 0;
    const uint8_t *cls = g->rule_cls + (size_t)rule * 256;
    for (int32_t q = s0; q < g->n_states; q++) {
        int32_t *row = g->trans + g->row_off[q];
        /* byte edges: split 0..255 at every range boundary, one target set per piece */
        uint8_t cut[257];
        memset(cut, 0, sizeof cut);
        size_t so = c->set_off[q], se = c->set_off[q + 1];
        int any = 0;
        for (size_t k = so; k < se; k++)
            for (int32_t e = c->a->head[c->items[k]]; e >= 0; e = c->a->e[e].next)
                if (c->a->e[e].kind == NE_BYTE) {
                    cut[c->a->e[e].lo] = 1;
                    cut[c->a->e[e].hi + 1] = 1;
                    any = 1;
                }
        if (any) {
            int lo = 0;
            while (lo < 256) {
                int hi = lo;
                while (hi + 1 < 256 && !cut[hi + 1]) hi++;
                size_t ns = 0;
                so = c->set_off[q], se = c->set_off[q + 1];
                for (size_t k = so; k < se; k++)
                    for (int32_t e = c->a->head[c->items[k]]; e >= 0; e = c->a->e[e].next) {
                        const nedge *x = &c->a->e[e];
                        if (x->kind == NE_BYTE && x->lo <= lo && x->hi >= hi) {
                            if (grammar_grow((void **)&seed, &cap_seed, ns + 1, sizeof *seed)) {
                                rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
                                goto done;
                            }
                            seed[ns++] = x->to;
                        }
                    }
                if (ns) {
                    int32_t t;
                    if ((rc = target_state(c, seed, ns, rule, accept, &t))) goto done;
                    row = g->trans + g->row_off[q]; /* may have moved */
                    for (int b = lo; b <= hi; b++) row[cls[b]] = t;
                    g->has_bytes[q] = 1;
                }
                lo = hi + 1;
            }
        }
        /* rule calls: one target per called rule */
        if (grammar_grow((void **)&c->ref_off, &c->cap_ref_off, (size_t)q + 2, sizeof *c->ref_off)) {
            rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            goto done;
        }
        c->ref_off[q] = (int32_t)c->n_refs;
        so = c->set_off[q], se = c->set_off[q + 1];
        for (size_t k = so; k < se; k++)
            for (int32_t e = c->a->head[c->items[k]]; e >= 0; e = c->a->e[e].next) {
                const nedge *x = &c->a->e[e];
                if (x->kind != NE_REF) continue;
                int seen = 0;
                for (size_t r = (size_t)c->ref_off[q]; r < c->n_refs; r++)
                    if (c->refs[r].rule == x->arg) seen = 1;
                if (seen) continue;
                size_t ns = 0;
                for (size_t k2 = so; k2 < se; k2++)
                    for (int32_t e2 = c->a->head[c->items[k2]]; e2 >= 0; e2 = c->a->e[e2].next)
                        if (c->a->e[e2].kind == NE_REF && c->a->e[e2].arg == x->arg) {
                            if (grammar_grow((void **)&seed, &cap_seed, ns + 1, sizeof *seed)) {
                                rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
                                goto done;
                            }
                            seed[ns++] = c->a->e[e2].to;
                        }
                int32_t t;
                if ((rc = target_state(c, seed, ns, rule, accept, &t))) goto done;
                if (grammar_grow((void **)&c->refs, &c->cap_refs, c->n_refs + 1, sizeof *c->refs)) {
                    rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
                    goto done;
                }
                c->refs[c->n_refs].rule = x->arg;
                c->refs[c->n_refs].ret = t;
                c->n_refs++;
                so = c->set_off[q], se = c->set_off[q + 1];
            }
    }
done:
    free(seed);
    return rc;
}

/* Nullable rules, then refuse any rule that can call itself without consuming a byte. */
static int check_left_recursion(grammar *g) {
    int rc = 0;
    uint8_t *nullable = calloc((size_t)g->n_rules, 1);
    uint32_t *seen = calloc((size_t)g->n_states, sizeof *seen);
    uint32_t pass = 0;
    int32_t *stack = malloc(((size_t)g->n_states + 1) * sizeof *stack);
    uint8_t *calls = calloc((size_t)g->n_rules * (size_t)g->n_rules, 1);
    uint8_t *color = calloc((size_t)g->n_rules, 1);
    int32_t *path = malloc(((size_t)g->n_rules + 1) * sizeof *path);
    if (!nullable || !seen || !stack || !calls || !color || !path) {
        rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        goto done;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t r = 0; r < g->n_rules; r++) {
            if (nullable[r]) continue;
            pass++;
            size_t sp = 0;
            stack[sp++] = g->rule_start[r];
            seen[g->rule_start[r]] = pass;
            while (sp) {
                int32_t q = stack[--sp];
                if (g->final[q]) {
                    nullable[r] = 1;
                    changed = 1;
                    break;
                }
                for (int32_t k = g->ref_off[q]; k < g->ref_off[q + 1]; k++)
                    if (nullable[g->refs[k].rule] && seen[g->refs[k].ret] != pass) {
                        seen[g->refs[k].ret] = pass;
                        stack[sp++] = g->refs[k].ret;
                    }
            }
        }
    }
    for (int32_t r = 0; r < g->n_rules; r++) {
        pass++;
        size_t sp = 0;
        stack[sp++] = g->rule_start[r];
        seen[g->rule_start[r]] = pass;
        while (sp) {
            int32_t q = stack[--sp];
            for (int32_t k = g->ref_off[q]; k < g->ref_off[q + 1]; k++) {
                calls[(size_t)r * (size_t)g->n_rules + (size_t)g->refs[k].rule] = 1;
                if (nullable[g->refs[k].rule] && seen[g->refs[k].ret] != pass) {
                    seen[g->refs[k].ret] = pass;
                    stack[sp++] = g->refs[k].ret;
                }
            }
        }
    }
    /* cycle search: iterative DFS with colors */
    for (int32_t r0 = 0; r0 < g->n_rules && !rc; r0++) {
        if (color[r0]) continue;
        size_t depth = 0;
        path[depth++] = r0;
        color[r0] = 1;
        int32_t *next = stack; /* reuse: next callee index per depth */
        next[0] = 0;
        while (depth) {
            int32_t r = path[depth - 1];
            int32_t j = next[depth - 1]++;
            if (j >= g->n_rules) {
                color[r] = 2;
                depth--;
                continue;
            }
            if (!calls[(size_t)r * (size_t)g->n_rules + (size_t)j]) continue;
            if (color[j] == 1) {
                rc = grammar_err(GRAMMAR_EINVAL,
                                 "left recursion: rule '%s' can reach itself without consuming "
                                 "input (through '%s')",
                                 g->rule_names[j], g->rule_names[r]);
                break;
            }
            if (color[j] == 0) {
                color[j] = 1;
                path[depth] = j;
                next[depth] = 0;
                depth++;
            }
        }
    }
done:
    free(nullable);
    free(seen);
    free(stack);
    free(calls);
    free(color);
    free(path);
    return rc;
}

/* dist[q]: fewest bytes from q to a final state of its rule (calls count their rule's
 * shortest sentence). Bellman-Ford style relaxation to a fixpoint. */
static int compute_dist(grammar *g) {
    g->dist = malloc((size_t)g->n_states * sizeof *g->dist);
    int32_t *off = malloc(((size_t)g->n_states + 1) * sizeof *off);
    int32_t *tg = NULL;
    size_t n_tg = 0, cap_tg = 0;
    if (!g->dist || !off) goto oom;
    /* distinct byte targets per state, once */
    for (int32_t q = 0; q < g->n_states; q++) {
        off[q] = (int32_t)n_tg;
        const int32_t *row = g->trans + g->row_off[q];
        int32_t last = -1;
        for (int b = 0; b < g->rule_ncls[g->state_rule[q]]; b++) {
            if (row[b] < 0 || row[b] == last) continue;
            last = row[b];
            if (grammar_grow((void **)&tg, &cap_tg, n_tg + 1, sizeof *tg)) goto oom;
            tg[n_tg++] = row[b];
        }
    }
    off[g->n_states] = (int32_t)n_tg;
    for (int32_t q = 0; q < g->n_states; q++) g->dist[q] = g->final[q] ? 0 : GRAMMAR_DIST_INF;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t q = g->n_states - 1; q >= 0; q--) {
            uint32_t best = g->dist[q];
            for (int32_t k = off[q]; k < off[q + 1]; k++)
                if (g->dist[tg[k]] + 1 < best) best = g->dist[tg[k]] + 1;
            for (int32_t k = g->ref_off[q]; k < g->ref_off[q + 1]; k++) {
                uint32_t d = g->dist[g->rule_start[g->refs[k].rule]] + g->dist[g->refs[k].ret];
                if (d < best) best = d;
            }
            if (best < g->dist[q]) {
                g->dist[q] = best;
                changed = 1;
            }
        }
    }
    free(off);
    free(tg);
    return 0;
oom:
    free(off);
    free(tg);
    return grammar_err(GRAMMAR_ENOMEM, "out of memory");
}

/* ----- inlining: a reference to a small rule that is not recursive becomes a copy of its body,
 * so that rule boundaries (where a token's acceptance starts to depend on the stack) are few. */

static void collect_refs(const grammar_ir *ir, int x, uint8_t *mark) {
    const grammar_ast *n = &ir->nodes[x];
    if (n->kind == GA_REF) mark[n->ref] = 1;
    else if (n->kind == GA_SEQ || n->kind == GA_ALT)
        for (int32_t i = 0; i < n->count; i++) collect_refs(ir, ir->kids[n->first + i], mark);
    else if (n->kind == GA_REP) collect_refs(ir, n->first, mark);
}

static double ast_size(const grammar_ir *ir, int x, const double *rule_size, const uint8_t *ok) {
    const grammar_ast *n = &ir->nodes[x];
    double t = 0;
    switch (n->kind) {
    case GA_EMPTY: return 0;
    case GA_LIT: return n->count;
    case GA_CLASS: return 2 + n->count;
    case GA_REF: return ok[n->ref] ? rule_size[n->ref] : 1;
    case GA_SEQ: case GA_ALT:
        for (int32_t i = 0; i < n->count; i++) t += ast_size(ir, ir->kids[n->first + i], rule_size, ok);
        return t + 1;
    case GA_REP: {
        double k = ast_size(ir, n->first, rule_size, ok);
        double copies = n->max < 0 ? n->min + 1 : (n->max > 0 ? n->max : 1);
        /* counted repetitions multiply states wherever the rule is copied: keep them called */
        if (copies > 4) return 1e9;
        return k * copies + 1;
    }
    }
    return 1;
}

typedef struct {
    const grammar_ir *ir;
    int32_t *adj_off, *adj;  /* references of each rule */
    int32_t *index, *low, *stack;
    uint8_t *on_stack, *rec, *ok, *state;
    double *size;
    int32_t next_index, sp;
} inl;

/* Tarjan's strongly connected components: rec[r] when r lies on a cycle. */
static void tarjan(inl *t, int32_t v) {
    t->index[v] = t->low[v] = t->next_index++;
    t->stack[t->sp++] = v;
    t->on_stack[v] = 1;
    for (int32_t k = t->adj_off[v]; k < t->adj_off[v + 1]; k++) {
        int32_t w = t->adj[k];
        if (w == v) t->rec[v] = 1;
        if (t->index[w] < 0) {
            tarjan(t, w);
            if (t->low[w] < t->low[v]) t->low[v] = t->low[w];
        } else if (t->on_stack[w] && t->index[w] < t->low[v]) {
            t->low[v] = t->index[w];
        }
    }
    if (t->low[v] == t->index[v]) {
        int32_t n = 0, w;
        do {
            w = t->stack[--t->sp];
            t->on_stack[w] = 0;
            n++;
            if (n > 1) t->rec[w] = 1;
        } while (w != v);
        if (n > 1) t->rec[v] = 1;
    }
}

/* Expanded size of a non-recursive rule (references to inlinable rules counted expanded). */
static double inl_size(inl *t, int32_t r) {
    if (t->state[r] == 2) return t->size[r];
    for (int32_t k = t->adj_off[r]; k < t->adj_off[r + 1]; k++)
        if (!t->rec[t->adj[k]]) inl_size(t, t->adj[k]);
    t->size[r] = ast_size(t->ir, t->ir->rule_body[r], t->size, t->ok);
    t->ok[r] = !t->rec[r] && t->size[r] <= INLINE_MAX_SIZE;
    t->state[r] = 2;
    return t->size[r];
}

/* ok[r] = 1 for rules that are on no cycle of references and small once expanded. */
static int inline_analysis(const grammar_ir *ir, uint8_t *ok) {
    size_t R = ir->n_rules;
    inl t = {0};
    t.ir = ir;
    t.ok = ok;
    uint8_t *mark = calloc(R, 1);
    t.adj_off = calloc(R + 1, sizeof *t.adj_off);
    t.index = malloc(R * sizeof *t.index);
    t.low = malloc(R * sizeof *t.low);
    t.stack = malloc(R * sizeof *t.stack);
    t.on_stack = calloc(R, 1);
    t.rec = calloc(R, 1);
    t.state = calloc(R, 1);
    t.size = calloc(R, sizeof *t.size);
    size_t cap = 0, n = 0;
    int rc = 0;
    if (!mark || !t.adj_off || !t.index || !t.low || !t.stack || !t.on_stack || !t.rec || !t.state || !t.size) {
        rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        goto out;
    }
    if (R > 20000) goto out; /* huge grammars: no inlining (and no deep recursion here) */
    for (size_t r = 0; r < R; r++) {
        memset(mark, 0, R);
        collect_refs(ir, ir->rule_body[r], mark);
        t.adj_off[r] = (int32_t)n;
        for (size_t j = 0; j < R; j++)
            if (mark[j]) {
                if (grammar_grow((void **)&t.adj, &cap, n + 1, sizeof *t.adj)) {
                    rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
                    goto out;
                }
                t.adj[n++] = (int32_t)j;
            }
    }
    t.adj_off[R] = (int32_t)n;
    for (size_t r = 0; r < R; r++) t.index[r] = -1;
    for (size_t r = 0; r < R; r++)
        if (t.index[r] < 0) tarjan(&t, (int32_t)r);
    for (size_t r = 0; r < R; r++)
        if (!t.rec[r]) inl_size(&t, (int32_t)r);
out:
    free(mark);
    free(t.adj_off);
    free(t.adj);
    free(t.index);
    free(t.low);
    free(t.stack);
    free(t.on_stack);
    free(t.rec);
    free(t.state);
    free(t.size);
    return rc;
}

int grammar_compile_ir(grammar **out, const grammar_ir *ir, const char *root) {
    *out = NULL;
    nfa a = {0};
    sc c = {0};
    int rc = 0;
    grammar *g = calloc(1, sizeof *g);
    int32_t *starts = malloc(ir->n_rules * sizeof *starts), *accepts = malloc(ir->n_rules * sizeof *accepts);
    if (!g || !starts || !accepts) {
        rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        goto done;
    }
    g->n_rules = (int32_t)ir->n_rules;
    g->root = -1;
    if (!root) root = "root";
    g->rule_names = calloc(ir->n_rules, sizeof *g->rule_names);
    g->rule_start = calloc(ir->n_rules, sizeof *g->rule_start);
    g->rule_cls = calloc(ir->n_rules, 256);
    g->rule_ncls = calloc(ir->n_rules, sizeof *g->rule_ncls);
    if (!g->rule_names || !g->rule_start || !g->rule_cls || !g->rule_ncls) {
        rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t r = 0; r < ir->n_rules; r++) {
        g->rule_names[r] = strdup(ir->names[r]);
        if (!g->rule_names[r]) {
            rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            goto done;
        }
        if (strcmp(ir->names[r], root) == 0) g->root = (int32_t)r;
    }
    if (g->root < 0) {
        rc = grammar_err(GRAMMAR_EINVAL, "the grammar has no rule named '%s'", root);
        goto done;
    }
    uint8_t *inline_ok = calloc(ir->n_rules, 1);
    if (!inline_ok || (rc = inline_analysis(ir, inline_ok))) {
        free(inline_ok);
        if (!rc) rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        goto done;
    }
    a.inline_ok = inline_ok;
    for (size_t r = 0; r < ir->n_rules; r++) {
        a.rule_base = a.n_states;
        starts[r] = nfa_state(&a);
        if (starts[r] < 0) {
            rc = a.err;
            goto done;
        }
        accepts[r] = build(&a, ir, ir->rule_body[r], starts[r], 0);
        if (accepts[r] < 0) {
            free(inline_ok);
            rc = a.err;
            goto done;
        }
    }
    free(inline_ok);
    a.inline_ok = NULL;
    c.a = &a;
    c.g = g;
    c.stamp = calloc(a.n_states, sizeof *c.stamp);
    c.stack = malloc(a.n_states * sizeof *c.stack);
    c.hmask = 1023;
    c.htab = calloc(c.hmask + 1, sizeof *c.htab);
    if (!c.stamp || !c.stack || !c.htab) {
        rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t r = 0; r < ir->n_rules; r++)
        if ((rc = determinize_rule(&c, (int32_t)r, starts[r], accepts[r],
                                   r + 1 < ir->n_rules ? starts[r + 1] : (int32_t)a.n_states)))
            goto done;
    if (grammar_grow((void **)&c.ref_off, &c.cap_ref_off, (size_t)g->n_states + 1, sizeof *c.ref_off)) {
        rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        goto done;
    }
    c.ref_off[g->n_states] = (int32_t)c.n_refs;
    g->ref_off = c.ref_off;
    g->refs = c.refs;
    c.ref_off = NULL;
    c.refs = NULL;
    /* return states per rule */
    g->ret_off = calloc((size_t)g->n_rules + 1, sizeof *g->ret_off);
    g->rets = malloc(((size_t)g->ref_off[g->n_states] + 1) * sizeof *g->rets);
    if (!g->ret_off || !g->rets) {
        rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
        goto done;
    }
    for (int32_t k = 0; k < g->ref_off[g->n_states]; k++) g->ret_off[g->refs[k].rule + 1]++;
    for (int32_t r = 0; r < g->n_rules; r++) g->ret_off[r + 1] += g->ret_off[r];
    {
        int32_t *fill = calloc((size_t)g->n_rules, sizeof *fill);
        if (!fill) {
            rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
            goto done;
        }
        for (int32_t k = 0; k < g->ref_off[g->n_states]; k++) {
            int32_t r = g->refs[k].rule;
            g->rets[g->ret_off[r] + fill[r]++] = g->refs[k].ret;
        }
        free(fill);
    }
    if ((rc = check_left_recursion(g))) goto done;
    if ((rc = compute_dist(g))) goto done;
    *out = g;
    g = NULL;
done:
    free(a.head);
    free(a.e);
    free(c.stamp);
    free(c.stack);
    free(c.items);
    free(c.set_off);
    free(c.htab);
    free(c.refs);
    free(c.ref_off);
    free(starts);
    free(accepts);
    grammar_free(g);
    return rc;
}

void grammar_free(grammar *g) {
    if (!g) return;
    for (int32_t r = 0; r < g->n_rules; r++) free(g->rule_names ? g->rule_names[r] : NULL);
    free(g->rule_names);
    free(g->rule_start);
    free(g->trans);
    free(g->row_off);
    free(g->rule_cls);
    free(g->rule_ncls);
    free(g->final);
    free(g->has_bytes);
    free(g->state_rule);
    free(g->ref_off);
    free(g->refs);
    free(g->ret_off);
    free(g->rets);
    free(g->dist);
    for (int i = 0; i < g->n_triggers; i++) free(g->triggers[i]);
    free(g);
}

int32_t grammar_n_states(const grammar *g) {
    return g ? g->n_states : 0;
}

int grammar_new_gbnf(grammar **out, const char *text, size_t len, const char *root) {
    if (!out) return grammar_err(GRAMMAR_EINVAL, "out is NULL");
    *out = NULL;
    grammar_ir ir = {0};
    int rc = grammar_gbnf_parse(&ir, text, len);
    if (rc == 0) rc = grammar_compile_ir(out, &ir, root);
    grammar_ir_free(&ir);
    return rc;
}

int grammar_set_triggers(grammar *g, const char *const *triggers, int n) {
    if (!g || n < 0 || n > GRAMMAR_MAX_TRIGGERS || (n && !triggers))
        return grammar_err(GRAMMAR_EINVAL, "bad triggers (at most %d)", GRAMMAR_MAX_TRIGGERS);
    for (int i = 0; i < n; i++) {
        size_t l = triggers[i] ? strlen(triggers[i]) : 0;
        if (l == 0 || l > 63) return grammar_err(GRAMMAR_EINVAL, "a trigger needs 1..63 bytes");
    }
    for (int i = 0; i < g->n_triggers; i++) free(g->triggers[i]);
    g->n_triggers = 0;
    for (int i = 0; i < n; i++) {
        g->triggers[i] = strdup(triggers[i]);
        if (!g->triggers[i]) return grammar_err(GRAMMAR_ENOMEM, "out of memory");
        g->trigger_len[i] = strlen(triggers[i]);
        g->n_triggers = i + 1;
    }
    return 0;
}
