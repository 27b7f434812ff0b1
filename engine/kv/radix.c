/* The prefix tree over token ids at block granularity (see kv.h): lookup with copy-on-write
 * of a partly matching block, insertion, pinning and least-recently-used eviction.
 *
 * Eviction takes leaves only (an inner node's KV is the prefix of its children's), whose block
 * has no sequence reference and whose node is not pinned. Those nodes sit in a list ordered by
 * last use (a clock bumped at every touch), so eviction is O(1); a node entering the list is
 * inserted at its place, which is the tail for a block going idle now and the head for a
 * parent uncovered by evicting its last child (a touch of a node is a touch of its path).
 *
 * Snapshots (hybrid models, kv.h): a fixed store of n_snaps slots; a slot belongs to at most
 * one node, is freed with it, and the least recently used unpinned owner gives its slot up
 * when a newer snapshot finds none free (a linear scan: the slots are few and large). */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kv/kv.h"

struct engine_kv_node {
    int32_t parent;       /* -1 for the root */
    int32_t first_child;  /* -1 when a leaf */
    int32_t next_sibling; /* also links the free node list */
    int32_t prev_sibling;
    int32_t block; /* pool block holding this prefix's last block_size positions */
    int32_t len;   /* key tokens: block_size, or fewer for a partial leaf (a finished
                    * sequence's partly filled last block, rows [0, len) valid) */
    int32_t pin;   /* nested pins; > 0: never evicted */
    int32_t lru_prev, lru_next;
    int32_t in_lru;
    /* Hybrid (Gated DeltaNet) models: the slot of a recurrent-state snapshot taken after this
     * block's last position, so a prefix hit can also restore the recurrent layers; -1 none */
    int32_t snapshot;
    uint64_t hash; /* of the key tokens */
    uint64_t last_use;
};

static uint64_t key_hash(const int32_t *t, int32_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint32_t)t[i];
        h *= 1099511628211ull;
    }
    return h;
}

static const int32_t *node_key(const engine_kv_cache *c, int32_t n) {
    return c->node_tokens + (size_t)n * c->p.block_size;
}

int engine_kv_radix_init(engine_kv_cache *c) {
    size_t nn = (size_t)c->n_blocks + 1;
    c->nodes = calloc(nn, sizeof *c->nodes);
    c->node_tokens = malloc(nn * (size_t)c->p.block_size * sizeof *c->node_tokens);
    c->path = malloc(nn * sizeof *c->path);
    if (!c->nodes || !c->node_tokens || !c->path) return ENGINE_ENOMEM;
    engine_kv_node *r = &c->nodes[0];
    r->parent = -1;
    r->first_child = -1;
    r->next_sibling = r->prev_sibling = -1;
    r->block = -1;
    r->lru_prev = r->lru_next = -1;
    r->snapshot = -1;
    c->node_free = -1;
    for (int32_t i = (int32_t)nn - 1; i >= 1; i--) {
        c->nodes[i].next_sibling = c->node_free;
        c->node_free = i;
    }
    c->lru_head = c->lru_tail = -1;
    int32_t ns = c->p.snap_bytes ? c->p.n_snaps : 0;
    if (ns > 0) {
        c->snaps = malloc((size_t)ns * c->p.snap_bytes);
        c->snap_owner = malloc((size_t)ns * sizeof *c->snap_owner);
        c->snap_free = malloc((size_t)ns * sizeof *c->snap_free);
        if (!c->snaps || !c->snap_owner || !c->snap_free) return ENGINE_ENOMEM;
        for (int32_t i = 0; i < ns; i++) {
            c->snap_owner[i] = -1;
            c->snap_free[i] = ns - 1 - i;
        }
        c->n_snap_free = ns;
    }
    return 0;
}

void engine_kv_radix_deinit(engine_kv_cache *c) {
    free(c->nodes);
    free(c->node_tokens);
    free(c->path);
    free(c->snaps);
    free(c->snap_owner);
    free(c->snap_free);
}

static void snap_release(engine_kv_cache *c, int32_t n) {
    int32_t slot = c->nodes[n].snapshot;
    if (slot < 0) return;
    c->nodes[n].snapshot = -1;
    c->snap_owner[slot] = -1;
    c->snap_free[c->n_snap_free++] = slot;
}

/* ---- LRU list of evictable nodes ----------------------------------------------------------- */

static int evictable(const engine_kv_cache *c, int32_t n) {
    const engine_kv_node *x = &c->nodes[n];
    return n != 0 && x->first_child < 0 && x->pin == 0 && c->refcount[x->block] == 0;
}

static void lru_remove(engine_kv_cache *c, int32_t n) {
    engine_kv_node *x = &c->nodes[n];
    if (x->lru_prev >= 0)
        c->nodes[x->lru_prev].lru_next = x->lru_next;
    else
        c->lru_head = x->lru_next;
    if (x->lru_next >= 0)
        c->nodes[x->lru_next].lru_prev = x->lru_prev;
    else
        c->lru_tail = x->lru_prev;
    x->lru_prev = x->lru_next = -1;
    x->in_lru = 0;
}

/* Insert in last-use order: at the head when older than everything listed, else walking
 * back from the tail (the common case stops at once). */
static void lru_insert(engine_kv_cache *c, int32_t n) {
    engine_kv_node *x = &c->nodes[n];
    int32_t after;
    if (c->lru_head >= 0 && x->last_use <= c->nodes[c->lru_head].last_use) {
        after = -1;
    } else {
        after = c->lru_tail;
        while (after >= 0 && c->nodes[after].last_use > x->last_use)
            after = c->nodes[after].lru_prev;
    }
    x->lru_prev = after;
    x->lru_next = after >= 0 ? c->nodes[after].lru_next : c->lru_head;
    if (x->lru_prev >= 0)
        c->nodes[x->lru_prev].lru_next = n;
    else
        c->lru_head = n;
    if (x->lru_next >= 0)
        c->nodes[x->lru_next].lru_prev = n;
    else
        c->lru_tail = n;
    x->in_lru = 1;
}

static void lru_update(engine_kv_cache *c, int32_t n) {
    int e = evictable(c, n);
    if (e && !c->nodes[n].in_lru)
        lru_insert(c, n);
    else if (!e && c->nodes[n].in_lru)
        lru_remove(c, n);
}

static void touch(engine_kv_cache *c, int32_t n) {
    c->nodes[n].last_use = ++c->clock;
    if (c->nodes[n].in_lru) {
        lru_remove(c, n);
        lru_insert(c, n);
    }
}

void engine_kv_radix_on_idle(engine_kv_cache *c, int32_t block) {
    int32_t n = c->node_of[block];
    touch(c, n);
    lru_update(c, n);
}

void engine_kv_radix_on_busy(engine_kv_cache *c, int32_t block) {
    lru_update(c, c->node_of[block]);
}

/* Unlink an evictable leaf n and free its block and node. */
static void drop_node(engine_kv_cache *c, int32_t n) {
    engine_kv_node *x = &c->nodes[n];
    ENGINE_ASSERT(evictable(c, n));
    if (x->in_lru) lru_remove(c, n);
    if (x->prev_sibling >= 0)
        c->nodes[x->prev_sibling].next_sibling = x->next_sibling;
    else
        c->nodes[x->parent].first_child = x->next_sibling;
    if (x->next_sibling >= 0) c->nodes[x->next_sibling].prev_sibling = x->prev_sibling;
    int32_t parent = x->parent, b = x->block;
    snap_release(c, n);
    c->node_of[b] = -1;
    c->free_list[c->n_free++] = b;
    x->next_sibling = c->node_free;
    c->node_free = n;
    c->n_nodes--;
    if (parent != 0) lru_update(c, parent);
}

int32_t engine_kv_evict(engine_kv_cache *c, int32_t n_blocks) {
    int32_t done = 0;
    while (done < n_blocks && c->lru_head >= 0) {
        drop_node(c, c->lru_head);
        c->n_evicted++;
        done++;
    }
    return done;
}

/* ---- lookup ------------------------------------------------------------------------------- */

static int32_t find_child(const engine_kv_cache *c, int32_t n, const int32_t *key, uint64_t h) {
    size_t bytes = (size_t)c->p.block_size * sizeof *key;
    for (int32_t ch = c->nodes[n].first_child; ch >= 0; ch = c->nodes[ch].next_sibling)
        if (c->nodes[ch].hash == h && c->nodes[ch].len == c->p.block_size &&
            memcmp(node_key(c, ch), key, bytes) == 0)
            return ch;
    return -1;
}

/* Match full blocks from the root; path (optional) receives the matched nodes. Fills m and
 * returns the depth (full blocks matched); *best = the child of the deepest node sharing the
 * most leading tokens with the rest of the request (-1 when none shares any). */
static int32_t walk(const engine_kv_cache *c, const int32_t *tokens, int32_t n, int32_t *path,
                    engine_kv_match *m, int32_t *best) {
    int32_t bs = c->p.block_size, node = 0, depth = 0;
    while ((depth + 1) * bs <= n) {
        const int32_t *key = tokens + (size_t)depth * bs;
        int32_t ch = find_child(c, node, key, key_hash(key, bs));
        if (ch < 0) break;
        if (path) path[depth] = ch;
        node = ch;
        depth++;
    }
    int32_t rem = n - depth * bs, lim = ENGINE_MIN(rem, bs), r = 0;
    int ended = 0; /* best's key (a partial leaf) ended before the request differed */
    *best = -1;
    for (int32_t ch = c->nodes[node].first_child; ch >= 0 && rem > 0;
         ch = c->nodes[ch].next_sibling) {
        const int32_t *k = node_key(c, ch), *t = tokens + (size_t)depth * bs;
        int32_t i = 0, kl = ENGINE_MIN(lim, c->nodes[ch].len);
        while (i < kl && k[i] == t[i])
            i++;
        int e = i == c->nodes[ch].len && i < lim;
        if (i > r || (i == r && i > 0 && e && !ended)) {
            r = i;
            ended = e;
            *best = ch;
        }
    }
    m->cached_tokens = 0;
    m->match_tokens = depth * bs + r;
    /* a difference only when a cached continuation exists, the request did not end, and the
     * most similar cached sequence did not end either */
    m->diverged_at =
        rem > 0 && c->nodes[node].first_child >= 0 && r < lim && !ended ? m->match_tokens : -1;
    return depth;
}

void engine_kv_prefix_peek(const engine_kv_cache *c, const int32_t *tokens, int32_t n,
                           engine_kv_match *m) {
    int32_t best;
    walk(c, tokens, n < 0 ? 0 : n, NULL, m, &best);
}

/* The attach of engine_kv_prefix_attach(_state); with state, whole blocks up to the deepest
 * node that carries a snapshot. */
static int attach(engine_kv_cache *c, engine_kv_seq *s, const int32_t *tokens, int32_t n,
                  int32_t max_tokens, engine_kv_match *m, const void **state) {
    if (s->n_blocks != 0 || s->n_pos != 0)
        return engine_err(ENGINE_EINVAL, "kv prefix attach: the sequence is not empty");
    if (n < 0) n = 0;
    int32_t bs = c->p.block_size, best;
    int32_t depth = walk(c, tokens, n, c->path, m, &best);
    int32_t target = ENGINE_MIN(m->match_tokens, max_tokens);
    target = ENGINE_MIN(target, s->max_blocks * bs);
    if (target < 0) target = 0;
    int32_t full = ENGINE_MIN(target / bs, depth), part = target - full * bs;
    if (state) {
        *state = NULL;
        while (full > 0 && c->nodes[c->path[full - 1]].snapshot < 0) full--;
        part = 0;
        if (full > 0) {
            int32_t slot = c->nodes[c->path[full - 1]].snapshot;
            *state = c->snaps + (size_t)slot * c->p.snap_bytes;
        }
    }
    for (int32_t i = 0; i < full; i++) {
        int32_t nd = c->path[i];
        engine_kv_block_ref(c, c->nodes[nd].block);
        touch(c, nd);
        engine_kv_seq_push(c, s, c->nodes[nd].block);
    }
    m->cached_tokens = full * bs;
    if (part > 0 && s->n_blocks < s->max_blocks) {
        int32_t src = full < depth ? c->path[full] : best, nb;
        ENGINE_ASSERT(src > 0);
        /* the source must survive the allocation's eviction: pin it meanwhile (no touch) */
        c->nodes[src].pin++;
        lru_update(c, src);
        int rc = engine_kv_block_alloc(c, &nb);
        c->nodes[src].pin--;
        lru_update(c, src);
        if (rc == 0) {
            engine_kv_block_copy(c, nb, c->nodes[src].block, part);
            engine_kv_seq_push(c, s, nb);
            m->cached_tokens += part;
        }
    }
    s->n_pos = m->cached_tokens;
    return 0;
}

int engine_kv_prefix_attach(engine_kv_cache *c, engine_kv_seq *s, const int32_t *tokens, int32_t n,
                            int32_t max_tokens, engine_kv_match *m) {
    return attach(c, s, tokens, n, max_tokens, m, NULL);
}

int engine_kv_prefix_attach_state(engine_kv_cache *c, engine_kv_seq *s, const int32_t *tokens,
                                  int32_t n, int32_t max_tokens, engine_kv_match *m,
                                  const void **state) {
    return attach(c, s, tokens, n, max_tokens, m, state);
}

/* ---- snapshots ---------------------------------------------------------------------------- */

void *engine_kv_snapshot_claim(engine_kv_cache *c, const int32_t *tokens, int32_t n,
                               int32_t *node) {
    int32_t bs = c->p.block_size, nd = 0;
    *node = -1;
    if (!c->snaps || n < bs || n % bs) return NULL;
    for (int32_t i = 0; i < n / bs && nd >= 0; i++) {
        const int32_t *key = tokens + (size_t)i * bs;
        nd = find_child(c, nd, key, key_hash(key, bs));
    }
    if (nd <= 0) return NULL;
    if (c->nodes[nd].snapshot >= 0) {
        touch(c, nd);
        return NULL;
    }
    if (c->n_snap_free == 0) {
        /* the least recently used slot whose owner is not pinned gives way */
        int32_t victim = -1;
        for (int32_t i = 0; i < c->p.n_snaps; i++) {
            int32_t o = c->snap_owner[i];
            if (o >= 0 && c->nodes[o].pin == 0 &&
                (victim < 0 || c->nodes[o].last_use < c->nodes[victim].last_use))
                victim = o;
        }
        if (victim < 0) return NULL;
        snap_release(c, victim);
        c->n_snaps_evicted++;
    }
    int32_t slot = c->snap_free[--c->n_snap_free];
    c->snap_owner[slot] = nd;
    c->nodes[nd].snapshot = slot;
    touch(c, nd);
    *node = nd;
    return c->snaps + (size_t)slot * c->p.snap_bytes;
}

void engine_kv_snapshot_drop(engine_kv_cache *c, int32_t node) {
    if (node > 0) snap_release(c, node);
}

/* Drop the idle partial leaves under parent whose rows the newer sibling `by` holds too (their
 * key is a prefix of by's): a cached partial block is worth keeping only until a longer one
 * replaces it. Partial leaves still referenced stay until the LRU takes them. */
static void drop_covered(engine_kv_cache *c, int32_t parent, int32_t by) {
    const engine_kv_node *y = &c->nodes[by];
    int32_t ch = c->nodes[parent].first_child;
    while (ch >= 0) {
        int32_t next = c->nodes[ch].next_sibling;
        const engine_kv_node *x = &c->nodes[ch];
        if (ch != by && x->len < c->p.block_size && x->len <= y->len && evictable(c, ch) &&
            memcmp(node_key(c, ch), node_key(c, by), (size_t)x->len * sizeof(int32_t)) == 0)
            drop_node(c, ch);
        ch = next;
    }
}

/* ---- insert and pin ----------------------------------------------------------------------- */

void engine_kv_prefix_insert(engine_kv_cache *c, const engine_kv_seq *s, const int32_t *tokens,
                             int32_t n) {
    int32_t bs = c->p.block_size, node = 0;
    int32_t full = ENGINE_MIN(n, s->n_pos) / bs;
    for (int32_t i = 0; i < full; i++) {
        const int32_t *key = tokens + (size_t)i * bs;
        uint64_t h = key_hash(key, bs);
        int32_t ch = find_child(c, node, key, h);
        if (ch < 0) {
            int32_t b = s->blocks[i];
            /* a block already in the tree belongs to its own prefix: only a caller passing
             * tokens other than the sequence's can get here */
            if (c->node_of[b] >= 0 || c->node_free < 0) return;
            ch = c->node_free;
            engine_kv_node *x = &c->nodes[ch];
            c->node_free = x->next_sibling;
            memset(x, 0, sizeof *x);
            x->parent = node;
            x->first_child = -1;
            x->prev_sibling = -1;
            x->next_sibling = c->nodes[node].first_child;
            if (x->next_sibling >= 0) c->nodes[x->next_sibling].prev_sibling = ch;
            c->nodes[node].first_child = ch;
            x->block = b;
            x->len = bs;
            x->lru_prev = x->lru_next = -1;
            x->snapshot = -1;
            x->hash = h;
            memcpy(c->node_tokens + (size_t)ch * bs, key, (size_t)bs * sizeof *key);
            c->node_of[b] = ch;
            c->n_nodes++;
            if (node != 0) lru_update(c, node); /* no longer a leaf */
        }
        touch(c, ch);
        lru_update(c, ch);
        drop_covered(c, node, ch);
        node = ch;
    }
}

void engine_kv_prefix_insert_tail(engine_kv_cache *c, const engine_kv_seq *s,
                                  const int32_t *tokens, int32_t n) {
    int32_t bs = c->p.block_size, node = 0, len = ENGINE_MIN(n, s->n_pos);
    int32_t full = len / bs, rem = len - full * bs;
    if (rem == 0 || full >= s->n_blocks) return;
    for (int32_t i = 0; i < full && node >= 0; i++) {
        const int32_t *key = tokens + (size_t)i * bs;
        node = find_child(c, node, key, key_hash(key, bs));
    }
    int32_t b = s->blocks[full];
    if (node < 0 || c->node_of[b] >= 0) return; /* the full blocks are not all cached */
    const int32_t *key = tokens + (size_t)full * bs;
    for (int32_t ch = c->nodes[node].first_child; ch >= 0; ch = c->nodes[ch].next_sibling)
        if (c->nodes[ch].len >= rem && memcmp(node_key(c, ch), key, (size_t)rem * sizeof *key) == 0)
            return; /* a cached block (full or partial) covers these rows already */
    if (c->node_free < 0) return;
    int32_t ch = c->node_free;
    engine_kv_node *x = &c->nodes[ch];
    c->node_free = x->next_sibling;
    memset(x, 0, sizeof *x);
    x->parent = node;
    x->first_child = -1;
    x->prev_sibling = -1;
    x->next_sibling = c->nodes[node].first_child;
    if (x->next_sibling >= 0) c->nodes[x->next_sibling].prev_sibling = ch;
    c->nodes[node].first_child = ch;
    x->block = b;
    x->len = rem;
    x->lru_prev = x->lru_next = -1;
    x->snapshot = -1;
    x->hash = key_hash(key, rem);
    memcpy(c->node_tokens + (size_t)ch * bs, key, (size_t)rem * sizeof *key);
    c->node_of[b] = ch;
    c->n_nodes++;
    if (node != 0) lru_update(c, node); /* no longer a leaf */
    touch(c, ch);
    lru_update(c, ch);
    drop_covered(c, node, ch);
}

int engine_kv_prefix_pin(engine_kv_cache *c, const int32_t *tokens, int32_t n, int32_t *n_tokens) {
    engine_kv_match m;
    int32_t best, depth = walk(c, tokens, n < 0 ? 0 : n, c->path, &m, &best);
    for (int32_t i = 0; i < depth; i++) {
        engine_kv_node *x = &c->nodes[c->path[i]];
        if (x->pin++ == 0) c->n_pinned++;
        lru_update(c, c->path[i]);
    }
    if (n_tokens) *n_tokens = depth * c->p.block_size;
    return 0;
}

int engine_kv_prefix_unpin(engine_kv_cache *c, const int32_t *tokens, int32_t n) {
    engine_kv_match m;
    int32_t best, bs = c->p.block_size;
    int32_t depth = walk(c, tokens, n < 0 ? 0 : n, c->path, &m, &best);
    if (depth * bs < (n / bs) * bs)
        return engine_err(ENGINE_EINVAL, "kv unpin: only %d of %d tokens are cached",
                          (int)(depth * bs), (int)n);
    for (int32_t i = 0; i < depth; i++)
        if (c->nodes[c->path[i]].pin == 0)
            return engine_err(ENGINE_EINVAL, "kv unpin: block %d of the prefix is not pinned",
                              (int)i);
    for (int32_t i = 0; i < depth; i++) {
        engine_kv_node *x = &c->nodes[c->path[i]];
        if (--x->pin == 0) c->n_pinned--;
        lru_update(c, c->path[i]);
    }
    return 0;
}
