/* The paged KV pool and the radix prefix cache (engine/kv): budget planning, the cache-miss
 * explainer, copy-on-write, pinning under pressure, and 2 x 1,500 random operations (F32 and
 * F16) checked after every step against a simple model: block ids returned by lookups,
 * refcounts, stats, least-recently-used eviction order, pinned prefixes kept, and the KV
 * content of every sequence and every cached block; at the end every block is free again.
 * Snapshots of recurrent state in tree nodes: claim, hits that stop at the deepest snapshot,
 * slot reuse by least recent use, pins, and eviction freeing them. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/quant.h"
#include "engine.h"
#include "kv/kv.h"

static int failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define NL 2
#define NKV 2
#define HD 4
#define ROW (NKV * HD)

/* The KV a forward would store at position pos after tokens[0..pos]: a function of the whole
 * prefix, so a block reused for the wrong prefix reads wrong. Small integers: exact in F16. */
static void kv_expected(const int32_t *tokens, int32_t pos, int layer, int is_v, float *row) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(layer * 2 + is_v);
    for (int32_t i = 0; i <= pos; i++)
        h = (h ^ (uint32_t)tokens[i]) * 1099511628211ull;
    for (int d = 0; d < ROW; d++)
        row[d] = (float)((h >> (d * 5)) & 1023);
}

static void kv_write(engine_kv_cache *c, engine_kv_seq *s, const int32_t *tokens, int32_t from,
                     int32_t to) {
    float k[ROW], v[ROW];
    for (int l = 0; l < NL; l++) {
        engine_kv_view view = engine_kv_seq_view(c, s, l);
        for (int32_t p = from; p < to; p++) {
            kv_expected(tokens, p, l, 0, k);
            kv_expected(tokens, p, l, 1, v);
            engine_cpu_kv_store(&view, p, k, v);
        }
    }
}

static float read_val(const engine_kv_cache *c, const void *block, int32_t row, int d) {
    if (c->p.type == ENGINE_KV_F32) return ((const float *)block)[row * ROW + d];
    return engine_fp16_to_fp32(((const uint16_t *)block)[row * ROW + d]);
}

/* Rows [0, n) of block b hold the KV of tokens[base .. base + n) (absolute positions). */
static int block_ok(const engine_kv_cache *c, int32_t b, const int32_t *tokens, int32_t base,
                    int32_t n) {
    float e[ROW];
    for (int l = 0; l < NL; l++)
        for (int kv = 0; kv < 2; kv++) {
            const void *blk = kv ? engine_kv_block_v(c, l, b) : engine_kv_block_k(c, l, b);
            for (int32_t r = 0; r < n; r++) {
                kv_expected(tokens, base + r, l, kv, e);
                for (int d = 0; d < ROW; d++)
                    if (read_val(c, blk, r, d) != e[d]) return 0;
            }
        }
    return 1;
}

static int seq_ok(const engine_kv_cache *c, const engine_kv_seq *s, const int32_t *tokens) {
    int32_t bs = c->p.block_size;
    for (int32_t i = 0; i * bs < s->n_pos; i++) {
        int32_t n = s->n_pos - i * bs < bs ? s->n_pos - i * bs : bs;
        if (!block_ok(c, s->blocks[i], tokens, i * bs, n)) return 0;
        /* the view's pointers agree with the table */
        for (int l = 0; l < NL; l++) {
            engine_kv_view v = engine_kv_seq_view(c, s, l);
            if (v.k_blocks[i] != engine_kv_block_k(c, l, s->blocks[i]) ||
                v.v_blocks[i] != engine_kv_block_v(c, l, s->blocks[i]))
                return 0;
        }
    }
    return 1;
}

static engine_kv_cache *make(engine_kv_type type, int32_t bs, int32_t n_blocks) {
    size_t elt = type == ENGINE_KV_F32 ? 4 : 2;
    engine_kv_params p = {
        NL, NKV, HD, type, bs, (size_t)n_blocks * NL * 2 * (size_t)bs * ROW * elt + 7, 0, 0};
    engine_kv_cache *c = NULL;
    int rc = engine_kv_cache_new(&c, &p);
    CHECK(rc == 0 && c);
    return c;
}

/* ---- fixed cases -------------------------------------------------------------------------- */

static void test_budget(void) {
    engine_kv_params p = {NL, NKV, HD, ENGINE_KV_F16, 0, 1000, 0, 0};
    engine_kv_cache *c = NULL;
    /* one block: 2 layers * K,V * 16 rows * 8 values * 2 bytes = 1024 bytes */
    CHECK(engine_kv_cache_new(&c, &p) == ENGINE_ERANGE && !c);
    CHECK(strstr(engine_error_last(), "1024") != NULL);
    p.budget_bytes = 10 * 1024 + 1023;
    CHECK(engine_kv_cache_new(&c, &p) == 0);
    engine_kv_stats st;
    engine_kv_cache_stats(c, &st);
    CHECK(st.block_size == ENGINE_KV_BLOCK_SIZE && st.n_blocks == 10 && st.n_free == 10);
    CHECK(st.block_bytes == 1024 && st.total_bytes == 10240);
    engine_kv_cache_free(c);
    p.type = ENGINE_KV_F32;
    CHECK(engine_kv_cache_new(&c, &p) == 0);
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_blocks == 5);
    engine_kv_cache_free(c);
    p.n_layer = 0;
    CHECK(engine_kv_cache_new(&c, &p) == ENGINE_EINVAL && !c);
    p.n_layer = NL;
    p.type = (engine_kv_type)7;
    CHECK(engine_kv_cache_new(&c, &p) == ENGINE_EINVAL && !c);
    engine_kv_cache_free(NULL);
}

static void test_explainer_and_cow(void) {
    engine_kv_cache *c = make(ENGINE_KV_F16, 16, 16);
    int32_t a[64], b[64];
    for (int i = 0; i < 64; i++)
        a[i] = b[i] = 100 + i;
    engine_kv_seq s, t;
    CHECK(engine_kv_seq_init(c, &s, 64) == 0 && engine_kv_seq_init(c, &t, 64) == 0);
    engine_kv_match m;
    CHECK(engine_kv_prefix_attach(c, &s, a, 40, 39, &m) == 0);
    CHECK(m.cached_tokens == 0 && m.match_tokens == 0 && m.diverged_at == -1);
    CHECK(engine_kv_seq_extend(c, &s, 40) == 0);
    kv_write(c, &s, a, 0, 40);
    engine_kv_prefix_insert(c, &s, a, 40);
    engine_kv_stats st;
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_nodes == 2 && st.n_used == 3);
    engine_kv_seq_release(c, &s);
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_used == 0 && st.n_cached == 2 && st.n_free == 14);

    /* diverges at token 21: 16 by reference + 5 rows copied */
    b[21] = 7;
    CHECK(engine_kv_prefix_attach(c, &t, b, 30, 29, &m) == 0);
    CHECK(m.cached_tokens == 21 && m.match_tokens == 21 && m.diverged_at == 21);
    CHECK(t.n_pos == 21 && t.n_blocks == 2 && seq_ok(c, &t, b));
    int32_t shared = t.blocks[0], copy = t.blocks[1];
    CHECK(engine_kv_block_refcount(c, shared) == 1 && engine_kv_block_refcount(c, copy) == 1);
    /* writing the divergent rows into the copy leaves the cached block intact */
    CHECK(engine_kv_seq_extend(c, &t, 30) == 0 && t.blocks[1] == copy);
    kv_write(c, &t, b, 21, 30);
    CHECK(seq_ok(c, &t, b));
    engine_kv_seq_release(c, &t);
    CHECK(engine_kv_prefix_attach(c, &t, a, 32, 32, &m) == 0);
    CHECK(m.cached_tokens == 32 && seq_ok(c, &t, a));

    /* a shared full block written after a rollback is copied first */
    engine_kv_seq_truncate(c, &t, 20);
    CHECK(t.n_blocks == 2 && t.n_pos == 20);
    int32_t cached1 = t.blocks[1];
    CHECK(engine_kv_seq_extend(c, &t, 24) == 0 && t.blocks[1] != cached1);
    kv_write(c, &t, b, 20, 24); /* b agrees with a before 21 only: rows 21.. differ */
    CHECK(block_ok(c, cached1, a, 16, 16));
    CHECK(seq_ok(c, &t, b));
    engine_kv_seq_release(c, &t);

    /* the request is longer than anything cached: no divergence, only full blocks served */
    CHECK(engine_kv_prefix_attach(c, &t, a, 64, 63, &m) == 0);
    CHECK(m.cached_tokens == 32 && m.match_tokens == 32 && m.diverged_at == -1);
    engine_kv_seq_release(c, &t);
    /* the request ends inside a cached block */
    engine_kv_prefix_peek(c, a, 10, &m);
    CHECK(m.cached_tokens == 0 && m.match_tokens == 10 && m.diverged_at == -1);
    /* first token differs */
    b[0] = 1;
    engine_kv_prefix_peek(c, b, 20, &m);
    CHECK(m.match_tokens == 0 && m.diverged_at == 0);
    CHECK(engine_kv_prefix_attach(c, &s, a, 8, 8, &m) == 0 && s.n_pos == 8);
    CHECK(engine_kv_prefix_attach(c, &s, a, 8, 8, &m) == ENGINE_EINVAL);

    engine_kv_seq_deinit(c, &s);
    engine_kv_seq_deinit(c, &t);
    CHECK(engine_kv_evict(c, 100) == 2);
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_free == st.n_blocks && st.n_nodes == 0);
    engine_kv_cache_free(c);
}

/* A finished sequence's partly filled last block enters the tree as a partial leaf: the next
 * turn copies its rows, a longer block for the same rows replaces it, the explainer does not
 * call its end a divergence, and it is evicted like any cached block. */
static void test_partial_tail(engine_kv_type type) {
    engine_kv_cache *c = make(type, 16, 12);
    int32_t a[80], b[80];
    for (int i = 0; i < 80; i++)
        a[i] = b[i] = 300 + i * 3;
    engine_kv_seq s, t;
    engine_kv_match m;
    engine_kv_stats st;
    CHECK(engine_kv_seq_init(c, &s, 80) == 0 && engine_kv_seq_init(c, &t, 80) == 0);
    /* turn 1: 37 positions = 2 full blocks + 5 rows */
    CHECK(engine_kv_seq_extend(c, &s, 37) == 0);
    kv_write(c, &s, a, 0, 37);
    engine_kv_prefix_insert(c, &s, a, 37);
    engine_kv_prefix_insert_tail(c, &s, a, 37);
    engine_kv_prefix_insert_tail(c, &s, a, 37); /* again: nothing new */
    int32_t tail = s.blocks[2];
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_nodes == 3 && st.n_used == 3);
    /* the tree holds the tail block now: a write copies it first */
    CHECK(engine_kv_seq_extend(c, &s, 38) == 0 && s.blocks[2] != tail);
    CHECK(block_ok(c, tail, a, 32, 5));
    engine_kv_seq_release(c, &s);
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_used == 0 && st.n_cached == 3 && st.n_free == 9);

    /* turn 2 re-sends the 37 tokens and more: every computed position is served */
    engine_kv_prefix_peek(c, a, 60, &m);
    CHECK(m.match_tokens == 37 && m.diverged_at == -1);
    CHECK(engine_kv_prefix_attach(c, &t, a, 60, 59, &m) == 0);
    CHECK(m.cached_tokens == 37 && t.n_pos == 37 && seq_ok(c, &t, a));
    CHECK(t.blocks[2] != tail && engine_kv_block_refcount(c, tail) == 0);
    /* a request ending inside the tail: all but its last token */
    engine_kv_seq_release(c, &t);
    CHECK(engine_kv_prefix_attach(c, &t, a, 35, 34, &m) == 0 && m.cached_tokens == 34);
    engine_kv_seq_release(c, &t);
    /* a request differing inside the tail: a divergence, the common rows copied */
    b[34] = 1;
    CHECK(engine_kv_prefix_attach(c, &t, b, 50, 49, &m) == 0);
    CHECK(m.cached_tokens == 34 && m.diverged_at == 34 && seq_ok(c, &t, b));
    engine_kv_seq_release(c, &t);
    /* pins cover full blocks only */
    int32_t covered = -1;
    CHECK(engine_kv_prefix_pin(c, a, 37, &covered) == 0 && covered == 32);
    CHECK(engine_kv_prefix_unpin(c, a, 37) == 0);

    /* turn 2 finishes at 53 positions: block 2 is full now and replaces the partial leaf, the
     * new partial tail (5 rows of block 3) joins */
    CHECK(engine_kv_prefix_attach(c, &t, a, 60, 59, &m) == 0 && m.cached_tokens == 37);
    CHECK(engine_kv_seq_extend(c, &t, 53) == 0);
    kv_write(c, &t, a, 37, 53);
    engine_kv_prefix_insert(c, &t, a, 53);
    engine_kv_prefix_insert_tail(c, &t, a, 53);
    engine_kv_seq_release(c, &t);
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_nodes == 4 && st.n_used == 0 && st.n_free == 8);
    CHECK(engine_kv_prefix_attach(c, &t, a, 70, 69, &m) == 0);
    CHECK(m.cached_tokens == 53 && seq_ok(c, &t, a));
    engine_kv_seq_release(c, &t);

    /* a shorter tail than one cached adds nothing; a tail whose full blocks are not cached
     * adds nothing either */
    CHECK(engine_kv_prefix_attach(c, &s, a, 51, 51, &m) == 0 && s.n_pos == 51);
    engine_kv_prefix_insert_tail(c, &s, a, 51);
    engine_kv_seq_release(c, &s);
    for (int i = 0; i < 80; i++)
        b[i] = 900 + i;
    CHECK(engine_kv_seq_extend(c, &s, 20) == 0);
    kv_write(c, &s, b, 0, 20);
    engine_kv_prefix_insert_tail(c, &s, b, 20);
    engine_kv_seq_release(c, &s);
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_nodes == 4 && st.n_free == 8);

    engine_kv_seq_deinit(c, &s);
    engine_kv_seq_deinit(c, &t);
    CHECK(engine_kv_evict(c, 100) == 4);
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_free == st.n_blocks && st.n_nodes == 0 && st.n_used == 0);
    engine_kv_cache_free(c);
}

static void test_pin_pressure(void) {
    engine_kv_cache *c = make(ENGINE_KV_F32, 4, 6);
    int32_t a[16], x[16];
    for (int i = 0; i < 16; i++) {
        a[i] = i;
        x[i] = 50 + i;
    }
    engine_kv_seq s;
    CHECK(engine_kv_seq_init(c, &s, 16) == 0);
    CHECK(engine_kv_seq_extend(c, &s, 8) == 0);
    kv_write(c, &s, a, 0, 8);
    engine_kv_prefix_insert(c, &s, a, 8);
    int32_t nt = -1;
    CHECK(engine_kv_prefix_pin(c, a, 8, &nt) == 0 && nt == 8);
    CHECK(engine_kv_prefix_unpin(c, x, 8) == ENGINE_EINVAL);
    engine_kv_seq_release(c, &s);
    /* fill the pool: the two pinned blocks are never taken */
    engine_kv_seq t;
    CHECK(engine_kv_seq_init(c, &t, 64) == 0);
    CHECK(engine_kv_seq_extend(c, &t, 16) == 0);
    CHECK(engine_kv_seq_extend(c, &t, 20) == ENGINE_ENOMEM && t.n_pos == 16);
    engine_kv_match m;
    engine_kv_prefix_peek(c, a, 8, &m);
    CHECK(m.match_tokens == 8);
    engine_kv_stats st;
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_pinned == 2 && st.n_used == 4 && st.n_free == 0);
    CHECK(engine_kv_prefix_unpin(c, a, 8) == 0);
    CHECK(engine_kv_prefix_unpin(c, a, 8) == ENGINE_EINVAL);
    CHECK(engine_kv_seq_extend(c, &t, 24) == 0); /* now evicts the unpinned prefix */
    engine_kv_prefix_peek(c, a, 8, &m);
    CHECK(m.match_tokens == 0);
    CHECK(engine_kv_seq_extend(c, &t, 65) == ENGINE_ERANGE);
    engine_kv_seq_deinit(c, &t);
    engine_kv_seq_deinit(c, &s);
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_free == 6 && st.n_used == 0 && st.n_nodes == 0 && st.n_evicted == 2);
    engine_kv_cache_free(c);
}

/* ---- random operations against a model ---------------------------------------------------- */

#define BS 4
#define CTX 48
#define NB 28
#define NSEQ 6
#define NPIN 4

typedef struct {
    int32_t len, tok[CTX], block, pin;
    uint64_t last_use;
} entry;

typedef struct {
    engine_kv_seq s;
    int32_t tok[CTX], len;
    int active;
} slot;

static entry ents[NB];
static int n_ents;
static uint64_t mclock;
static int op_kind;
/* per entry: evictable before the step (a parent uncovered by evicting its last child in
 * this step, or the source of a copy protected during it, is not held to LRU order) */
static int was_evictable[NB];
static int32_t mref[NB], mref_before[NB];

static uint64_t rng_state;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static int find_ent(const int32_t *tok, int32_t len) {
    for (int i = 0; i < n_ents; i++)
        if (ents[i].len == len && memcmp(ents[i].tok, tok, sizeof(int32_t) * len) == 0) return i;
    return -1;
}

static int ent_of_block(int32_t b) {
    for (int i = 0; i < n_ents; i++)
        if (ents[i].block == b) return i;
    return -1;
}

static void model_unref(int32_t b) {
    if (--mref[b] == 0) {
        int e = ent_of_block(b);
        if (e >= 0) ents[e].last_use = ++mclock;
    }
}

static int has_child(int e) {
    for (int i = 0; i < n_ents; i++)
        if (ents[i].len == ents[e].len + BS &&
            memcmp(ents[i].tok, ents[e].tok, sizeof(int32_t) * ents[e].len) == 0)
            return 1;
    return 0;
}

static int model_evictable(int e) {
    return ents[e].pin == 0 && mref[ents[e].block] == 0 && !has_child(e);
}

static void model_match(const int32_t *tok, int32_t n, engine_kv_match *m) {
    int32_t best = 0;
    for (int i = 0; i < n_ents; i++) {
        int32_t l = 0, lim = ents[i].len < n ? ents[i].len : n;
        while (l < lim && ents[i].tok[l] == tok[l])
            l++;
        if (l > best) best = l;
    }
    m->match_tokens = best;
    m->diverged_at = -1;
    if (best < n)
        for (int i = 0; i < n_ents; i++)
            if (ents[i].len > best && memcmp(ents[i].tok, tok, sizeof(int32_t) * best) == 0)
                m->diverged_at = best;
}

static int32_t base_tok[3][CTX];

static void make_tokens(slot *sl) {
    const int32_t *base = base_tok[rnd(3)];
    sl->len = 1 + (int32_t)rnd(CTX);
    int32_t keep = (int32_t)rnd((uint32_t)sl->len + 1);
    if (rnd(3) == 0) keep = sl->len;
    for (int32_t i = 0; i < sl->len; i++)
        sl->tok[i] = i < keep ? base[i] : (int32_t)rnd(3);
}

static void check_all(engine_kv_cache *c, slot *slots, int32_t pinned[NPIN][CTX + 1],
                      uint64_t evicted_max_before, int op) {
    /* which model entries were evicted by this step */
    uint64_t ev_max = evicted_max_before;
    int any_ev = 0;
    for (int i = 0; i < n_ents;) {
        engine_kv_match m;
        engine_kv_prefix_peek(c, ents[i].tok, ents[i].len, &m);
        if (m.match_tokens >= ents[i].len) {
            i++;
            continue;
        }
        /* (the block itself may already serve a new owner: judge by the state before) */
        if (ents[i].pin != 0 || mref_before[ents[i].block] != 0) {
            fprintf(stderr, "op %d: evicted a pinned or referenced block\n", op);
            failures++;
        }
        if (ents[i].last_use > ev_max) ev_max = ents[i].last_use;
        any_ev = 1;
        ents[i] = ents[--n_ents];
        was_evictable[i] = was_evictable[n_ents];
    }
    if (any_ev)
        for (int i = 0; i < n_ents; i++)
            if (was_evictable[i] && model_evictable(i) && ents[i].last_use < ev_max) {
                fprintf(stderr,
                        "op %d (kind %d): evicted a block used at %llu, kept one used at "
                        "%llu (len %d)\n",
                        op, op_kind, (unsigned long long)ev_max,
                        (unsigned long long)ents[i].last_use, (int)ents[i].len);
                failures++;
                break;
            }
    /* refcounts and stats */
    int32_t used = 0, cached = 0, npin = 0;
    for (int32_t b = 0; b < NB; b++) {
        CHECK(engine_kv_block_refcount(c, b) == mref[b]);
        used += mref[b] > 0;
    }
    for (int i = 0; i < n_ents; i++) {
        cached += mref[ents[i].block] == 0;
        npin += ents[i].pin > 0;
        CHECK(block_ok(c, ents[i].block, ents[i].tok, ents[i].len - BS, BS));
    }
    engine_kv_stats st;
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_used == used && st.n_cached == cached && st.n_nodes == n_ents);
    CHECK(st.n_free == NB - used - cached && st.n_pinned == npin);
    for (int i = 0; i < NSEQ; i++)
        if (slots[i].active && !seq_ok(c, &slots[i].s, slots[i].tok)) {
            fprintf(stderr, "op %d: sequence %d reads wrong KV\n", op, i);
            failures++;
        }
    for (int i = 0; i < NPIN; i++)
        if (pinned[i][0] > 0) {
            engine_kv_match m;
            engine_kv_prefix_peek(c, pinned[i] + 1, pinned[i][0], &m);
            CHECK(m.match_tokens >= pinned[i][0]);
        }
}

static void test_random(engine_kv_type type, uint64_t seed, int n_ops) {
    rng_state = seed;
    engine_kv_cache *c = make(type, BS, NB);
    slot slots[NSEQ];
    memset(slots, 0, sizeof slots);
    for (int i = 0; i < NSEQ; i++)
        CHECK(engine_kv_seq_init(c, &slots[i].s, CTX) == 0);
    int32_t pinned[NPIN][CTX + 1];
    memset(pinned, 0, sizeof pinned);
    n_ents = 0;
    mclock = 0;
    memset(mref, 0, sizeof mref);
    for (int b = 0; b < 3; b++)
        for (int i = 0; i < CTX; i++)
            base_tok[b][i] = (int32_t)rnd(3);
    int n_attach = 0, n_hit = 0, n_nomem = 0, n_evict_ops = 0;

    for (int op = 0; op < n_ops; op++) {
        slot *sl = &slots[rnd(NSEQ)];
        uint64_t ev_before = 0;
        memcpy(mref_before, mref, sizeof mref);
        for (int i = 0; i < n_ents; i++)
            was_evictable[i] = model_evictable(i);
        op_kind = (int)rnd(9);
        switch (op_kind) {
        case 0:
        case 1: { /* start a request: attach the longest cached prefix */
            if (sl->active) break;
            make_tokens(sl);
            engine_kv_match want, m;
            model_match(sl->tok, sl->len, &want);
            int32_t maxt = sl->len - 1;
            CHECK(engine_kv_prefix_attach(c, &sl->s, sl->tok, sl->len, maxt, &m) == 0);
            CHECK(m.match_tokens == want.match_tokens && m.diverged_at == want.diverged_at);
            int32_t target = want.match_tokens < maxt ? want.match_tokens : maxt;
            int32_t full = target / BS;
            CHECK(m.cached_tokens <= target && m.cached_tokens >= full * BS);
            CHECK(sl->s.n_pos == m.cached_tokens);
            for (int32_t i = 0; i < full && i < sl->s.n_blocks; i++) {
                int e = find_ent(sl->tok, (i + 1) * BS);
                CHECK(e >= 0 && ents[e].block == sl->s.blocks[i]);
                if (e < 0) continue;
                mref[ents[e].block]++;
                ents[e].last_use = ++mclock;
            }
            if (m.cached_tokens > full * BS) mref[sl->s.blocks[full]]++;
            for (int i = 0; i < n_ents; i++)
                if (ents[i].len == (full + 1) * BS &&
                    memcmp(ents[i].tok, sl->tok, sizeof(int32_t) * full * BS) == 0)
                    was_evictable[i] = 0;
            sl->active = 1;
            n_attach++;
            n_hit += m.cached_tokens > 0;
            break;
        }
        case 2:
        case 3: { /* compute more positions */
            if (!sl->active || sl->s.n_pos >= sl->len) break;
            int32_t from = sl->s.n_pos, to = from + 1 + (int32_t)rnd((uint32_t)(sl->len - from));
            int32_t old[CTX / BS], n_old = sl->s.n_blocks;
            memcpy(old, sl->s.blocks, sizeof(int32_t) * n_old);
            int rc = engine_kv_seq_extend(c, &sl->s, to);
            CHECK(rc == 0 || rc == ENGINE_ENOMEM);
            /* mirror the table change: a copied block replaced, new blocks appended */
            for (int32_t i = 0; i < n_old; i++)
                if (sl->s.blocks[i] != old[i]) {
                    mref[sl->s.blocks[i]]++;
                    model_unref(old[i]);
                }
            for (int32_t i = n_old; i < sl->s.n_blocks; i++)
                mref[sl->s.blocks[i]]++;
            if (rc == 0) {
                kv_write(c, &sl->s, sl->tok, from, to);
            } else {
                n_nomem++;
                engine_kv_stats st;
                engine_kv_cache_stats(c, &st);
                CHECK(st.n_free == 0 && sl->s.n_pos == from);
                for (int i = 0; i < n_ents; i++)
                    CHECK(!model_evictable(i));
            }
            break;
        }
        case 4: { /* the request is done: insert its full blocks (sometimes keep going) */
            if (!sl->active) break;
            engine_kv_prefix_insert(c, &sl->s, sl->tok, sl->len);
            for (int32_t i = 0; i < sl->s.n_pos / BS; i++) {
                int e = find_ent(sl->tok, (i + 1) * BS);
                if (e < 0) {
                    e = n_ents++;
                    ents[e].len = (i + 1) * BS;
                    memcpy(ents[e].tok, sl->tok, sizeof(int32_t) * ents[e].len);
                    ents[e].block = sl->s.blocks[i];
                    ents[e].pin = 0;
                    was_evictable[e] = 0;
                }
                ents[e].last_use = ++mclock;
            }
            if (rnd(2)) break;
        }       /* fallthrough */
        case 5: /* release */
            if (!sl->active) break;
            for (int32_t i = 0; i < sl->s.n_blocks; i++)
                model_unref(sl->s.blocks[i]);
            engine_kv_seq_release(c, &sl->s);
            sl->active = 0;
            break;
        case 6: { /* roll back */
            if (!sl->active || sl->s.n_pos == 0) break;
            int32_t n = (int32_t)rnd((uint32_t)sl->s.n_pos);
            int32_t keep = (n + BS - 1) / BS;
            for (int32_t i = sl->s.n_blocks - 1; i >= keep; i--)
                model_unref(sl->s.blocks[i]);
            engine_kv_seq_truncate(c, &sl->s, n);
            CHECK(sl->s.n_pos == n && sl->s.n_blocks == keep);
            /* and maybe continue with other tokens */
            if (rnd(2))
                for (int32_t i = n; i < sl->len; i++)
                    sl->tok[i] = (int32_t)rnd(3);
            break;
        }
        case 7: { /* pin or unpin a prefix */
            int k = (int)rnd(NPIN);
            if (pinned[k][0] > 0) {
                CHECK(engine_kv_prefix_unpin(c, pinned[k] + 1, pinned[k][0]) == 0);
                for (int32_t l = BS; l <= pinned[k][0]; l += BS)
                    ents[find_ent(pinned[k] + 1, l)].pin--;
                pinned[k][0] = 0;
            } else if (n_ents > 0) {
                int e = (int)rnd((uint32_t)n_ents);
                int32_t nt = -1;
                CHECK(engine_kv_prefix_pin(c, ents[e].tok, ents[e].len, &nt) == 0);
                CHECK(nt == ents[e].len);
                pinned[k][0] = ents[e].len;
                memcpy(pinned[k] + 1, ents[e].tok, sizeof(int32_t) * ents[e].len);
                for (int32_t l = BS; l <= ents[e].len; l += BS)
                    ents[find_ent(ents[e].tok, l)].pin++;
            }
            break;
        }
        case 8: { /* explicit eviction and a peek */
            slot tmp;
            make_tokens(&tmp);
            engine_kv_match wm, m;
            model_match(tmp.tok, tmp.len, &wm);
            engine_kv_prefix_peek(c, tmp.tok, tmp.len, &m);
            CHECK(m.cached_tokens == 0 && m.match_tokens == wm.match_tokens &&
                  m.diverged_at == wm.diverged_at);
            int32_t want = 0;
            for (int i = 0; i < n_ents; i++)
                want += model_evictable(i);
            int32_t k = (int32_t)rnd(3);
            int32_t got = engine_kv_evict(c, k);
            CHECK(got <= k && (got == k || got >= want));
            n_evict_ops++;
            break;
        }
        }
        check_all(c, slots, pinned, ev_before, op);
        if (failures > 20) break;
    }

    /* the end: everything released, unpinned and evicted: the pool is full again */
    for (int i = 0; i < NSEQ; i++) {
        for (int32_t b = 0; b < slots[i].s.n_blocks; b++)
            model_unref(slots[i].s.blocks[b]);
        engine_kv_seq_deinit(c, &slots[i].s);
    }
    for (int k = 0; k < NPIN; k++)
        if (pinned[k][0] > 0) CHECK(engine_kv_prefix_unpin(c, pinned[k] + 1, pinned[k][0]) == 0);
    engine_kv_stats st;
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_used == 0 && st.n_pinned == 0 && st.n_free + st.n_cached == NB);
    CHECK(engine_kv_evict(c, NB) == st.n_cached);
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_free == NB && st.n_nodes == 0 && st.n_cached == 0);
    for (int32_t b = 0; b < NB; b++)
        CHECK(engine_kv_block_refcount(c, b) == 0);
    /* the run exercised what it claims to */
    CHECK(n_attach > 100 && n_hit > 20 && n_nomem > 0 && st.n_evicted > 20 && n_evict_ops > 0);
    printf("random %s: %d attaches (%d hits), %d ENOMEM, %lld evicted\n",
           type == ENGINE_KV_F32 ? "f32" : "f16", n_attach, n_hit, n_nomem,
           (long long)st.n_evicted);
    engine_kv_cache_free(c);
}

/* ---- recurrent-state snapshots in tree nodes (hybrid models) ------------------------------ */
static void fill_snap(void *dst, int tag) {
    memset(dst, tag, 64);
}

static void test_snapshots(void) {
    engine_kv_params p = {NL, NKV, HD, ENGINE_KV_F32, 16, 12 * NL * 2 * 16 * ROW * 4, 64, 2};
    engine_kv_cache *c = NULL;
    CHECK(engine_kv_cache_new(&c, &p) == 0 && c);
    if (!c) return;
    engine_kv_stats st;
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_blocks == 12 && st.n_snaps == 2 && st.n_snaps_used == 0 && st.snap_bytes == 64);
    CHECK(st.total_bytes == 12 * st.block_bytes + 2 * 64);
    int32_t ta[64], tb[64];
    for (int i = 0; i < 64; i++) {
        ta[i] = 1000 + i;
        tb[i] = 2000 + i;
    }
    engine_kv_seq s;
    CHECK(engine_kv_seq_init(c, &s, 64) == 0);
    CHECK(engine_kv_seq_extend(c, &s, 48) == 0);
    kv_write(c, &s, ta, 0, 48);
    engine_kv_prefix_insert(c, &s, ta, 48);
    int32_t node;
    void *d;
    CHECK(engine_kv_snapshot_claim(c, ta, 40, &node) == NULL); /* not a block boundary */
    CHECK(engine_kv_snapshot_claim(c, tb, 16, &node) == NULL); /* not cached */
    CHECK((d = engine_kv_snapshot_claim(c, ta, 32, &node)) != NULL && node > 0);
    if (d) fill_snap(d, 32);
    CHECK((d = engine_kv_snapshot_claim(c, ta, 48, &node)) != NULL);
    if (d) fill_snap(d, 48);
    CHECK(engine_kv_snapshot_claim(c, ta, 32, &node) == NULL); /* has one already */
    engine_kv_seq_release(c, &s);
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_snaps_used == 2 && st.n_used == 0);

    /* a hit stops at the deepest node with a snapshot within the match and max_tokens */
    int32_t q[60];
    memcpy(q, ta, 40 * sizeof *q);
    for (int i = 40; i < 60; i++) q[i] = 3000 + i;
    engine_kv_match m;
    const void *state = NULL;
    CHECK(engine_kv_prefix_attach_state(c, &s, q, 60, 59, &m, &state) == 0);
    CHECK(m.cached_tokens == 32 && s.n_pos == 32 && m.match_tokens == 40 && m.diverged_at == 40);
    const unsigned char *sb = state;
    CHECK(sb && sb[0] == 32 && sb[63] == 32);
    CHECK(seq_ok(c, &s, ta));
    engine_kv_seq_release(c, &s);
    /* the whole cached sequence: the last token is computed, so the hit is at 32, not 48 */
    CHECK(engine_kv_prefix_attach_state(c, &s, ta, 48, 47, &m, &state) == 0);
    CHECK(m.cached_tokens == 32 && state && ((const unsigned char *)state)[0] == 32);
    engine_kv_seq_release(c, &s);
    CHECK(engine_kv_prefix_attach_state(c, &s, ta, 60, 59, &m, &state) == 0);
    CHECK(m.cached_tokens == 48 && state && ((const unsigned char *)state)[0] == 48);
    engine_kv_seq_release(c, &s);
    /* nothing with a snapshot along the way: no hit */
    CHECK(engine_kv_prefix_attach_state(c, &s, ta, 20, 19, &m, &state) == 0);
    CHECK(m.cached_tokens == 0 && s.n_blocks == 0 && state == NULL && m.match_tokens == 20);

    /* a third snapshot takes the least recently used slot (48 was used last: 32 goes) */
    CHECK(engine_kv_seq_extend(c, &s, 16) == 0);
    kv_write(c, &s, tb, 0, 16);
    engine_kv_prefix_insert(c, &s, tb, 16);
    engine_kv_seq_release(c, &s);
    CHECK((d = engine_kv_snapshot_claim(c, tb, 16, &node)) != NULL);
    if (d) fill_snap(d, 16);
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_snaps_used == 2 && st.n_snaps_evicted == 1);
    CHECK(engine_kv_prefix_attach_state(c, &s, ta, 40, 39, &m, &state) == 0);
    CHECK(m.cached_tokens == 0); /* 32's snapshot is gone, its blocks stay */
    engine_kv_seq_release(c, &s);
    /* a pinned owner keeps its slot: pin both owners, a new claim finds no slot and a drop
     * gives a slot back */
    int32_t pinned;
    CHECK(engine_kv_prefix_pin(c, ta, 48, &pinned) == 0 && pinned == 48);
    CHECK(engine_kv_prefix_pin(c, tb, 16, &pinned) == 0 && pinned == 16);
    CHECK(engine_kv_snapshot_claim(c, ta, 32, &node) == NULL);
    CHECK(engine_kv_prefix_unpin(c, tb, 16) == 0);
    CHECK((d = engine_kv_snapshot_claim(c, ta, 32, &node)) != NULL);
    engine_kv_snapshot_drop(c, node); /* could not be filled */
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_snaps_used == 1);
    CHECK(engine_kv_prefix_unpin(c, ta, 48) == 0);
    /* eviction frees the snapshots with their blocks */
    CHECK(engine_kv_evict(c, 100) == 4);
    engine_kv_cache_stats(c, &st);
    CHECK(st.n_snaps_used == 0 && st.n_nodes == 0 && st.n_free == st.n_blocks && st.n_used == 0);
    engine_kv_seq_deinit(c, &s);
    engine_kv_cache_free(c);
    /* bad snapshot parameters */
    p.snap_bytes = 0;
    CHECK(engine_kv_cache_new(&c, &p) == ENGINE_EINVAL && !c);
    p.snap_bytes = 64;
    p.n_snaps = -1;
    CHECK(engine_kv_cache_new(&c, &p) == ENGINE_EINVAL && !c);
}

int main(void) {
    test_snapshots();
    test_budget();
    test_explainer_and_cow();
    test_partial_tail(ENGINE_KV_F16);
    test_partial_tail(ENGINE_KV_F32);
    test_pin_pressure();
    test_random(ENGINE_KV_F32, 0x9e3779b97f4a7c15ull, 1500);
    test_random(ENGINE_KV_F16, 0x2545f4914f6cdd1dull, 1500);
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
