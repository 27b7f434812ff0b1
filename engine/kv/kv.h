/* Paged KV cache and radix-tree prefix cache (issue 4). Private to engine/.
 *
 * One engine_kv_cache owns a pool of fixed-size blocks of KV storage and a prefix tree over
 * token ids that maps cached full blocks to pool blocks.
 *
 * Block size: ENGINE_KV_BLOCK_SIZE = 16 positions.
 *   - Prefix sharing: a request reuses whole blocks only, so a divergence costs at most 15
 *     recomputed positions beyond the common prefix; the partly matching block is copied
 *     (copy-on-write) so even those rows are reused. Larger blocks (64+) waste more on every
 *     divergence; smaller ones (4-8) make the tree and the block tables 2-4x larger.
 *   - Copy-on-write copies at most 16 rows per layer (K and V): a few hundred KB on a 48-layer
 *     model, negligible against one forward.
 *   - Attention kernels: the CPU kernel pays one pointer load per 16 rows; a CUDA paged kernel
 *     processes 16 positions per warp tile (vLLM's default for the same reason).
 *   - Table size: a 32k-token context is a 2048-entry block table per layer.
 *
 * Storage: per layer, one K array and one V array of n_blocks * block_size rows, a row being
 * n_head_kv * head_dim values of F16 (default), F32 (exact tests) or Q8_0 (each head's values
 * as head_dim / 32 blocks of an F16 scale + 32 int8: 1.0625 bytes per value, 0.53x F16;
 * engine_cpu_kv_row_bytes). Block b of layer l starts at k[l] + b * block_size * row_bytes.
 * The number of blocks is planned at creation from a byte budget:
 * n_blocks = budget / (n_layer * 2 * block_size * row_bytes).
 *
 * Block states (every block is in exactly one):
 *   free   refcount 0, not in the tree, on the free list;
 *   used   refcount > 0 (held by the block tables of sequences; the tree may hold it too);
 *   cached refcount 0, held only by the tree: evictable (least recently used first) unless its
 *          node is pinned or has children.
 * The tree's hold is not counted in the refcount: refcount = number of sequence references.
 *
 * Tree: each node is one full block; its key is the block's block_size token ids and its
 * path from the root is the whole prefix, so the KV of a node is valid for exactly that token
 * prefix. Full blocks enter the tree as a sequence fills them; its partly filled last block
 * enters as a partial leaf (key of len < block_size tokens) when the sequence ends, so the next
 * turn of a conversation, which re-sends those tokens, copies the rows (copy-on-write) instead
 * of recomputing them. A partial leaf never has children and is never referenced by a block
 * table (lookups copy it); it is dropped when a longer block for the same rows is inserted. Node storage is preallocated (at most one node per block), children are linked
 * lists compared by a key hash first, and nothing allocates after creation.
 *
 * Not thread-safe: one owner (the scheduler thread) calls everything.
 */
#ifndef SPARK_ENGINE_KV_H
#define SPARK_ENGINE_KV_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu.h"
#include "engine.h"

#define ENGINE_KV_BLOCK_SIZE 16

typedef struct {
    int32_t n_layer;
    int32_t n_head_kv;
    int32_t head_dim;
    engine_kv_type type; /* ENGINE_KV_F16, ENGINE_KV_F32 or ENGINE_KV_Q8_0 */
    int32_t block_size;  /* positions per block; 0 = ENGINE_KV_BLOCK_SIZE */
    size_t budget_bytes; /* KV storage to plan for (K + V of every layer) */
    /* hybrid models (qwen35moe): recurrent-state snapshots kept in tree nodes, n_snaps of
     * snap_bytes each, allocated beside the blocks (not out of budget_bytes); 0: none */
    size_t snap_bytes;
    int32_t n_snaps;
} engine_kv_params;

typedef struct {
    engine_kv_type type; /* F16, F32 or Q8_0 */
    int32_t block_size;
    int32_t n_blocks;   /* planned from the budget */
    int32_t n_free;     /* on the free list */
    int32_t n_used;     /* refcount > 0 */
    int32_t n_cached;   /* refcount 0, held by the tree only */
    int32_t n_pinned;   /* tree nodes with a pin (their blocks are never evicted) */
    int32_t n_nodes;    /* tree nodes (= blocks held by the tree) */
    size_t block_bytes; /* one block: K + V of every layer */
    size_t total_bytes; /* n_blocks * block_bytes + n_snaps * snap_bytes */
    int64_t n_evicted;  /* blocks evicted since creation */
    int32_t n_snaps;        /* recurrent-state snapshot slots (hybrid models), 0 otherwise */
    int32_t n_snaps_used;   /* held by tree nodes */
    size_t snap_bytes;      /* one snapshot */
    int64_t n_snaps_evicted; /* snapshots dropped to make room for newer ones */
} engine_kv_stats;

/* A sequence's block table: position p is row p % block_size of block blocks[p / block_size].
 * k_ptr / v_ptr mirror the table as storage pointers per layer ([n_layer][max_blocks]) so
 * engine_kv_view can pass them to the attention kernels unchanged. Owned by the caller's
 * storage (engine_kv_seq_init / _deinit); blocks are references into the cache. */
typedef struct {
    int32_t *blocks; /* [max_blocks] pool block ids */
    void **k_ptr;    /* [n_layer * max_blocks] */
    void **v_ptr;
    int32_t n_blocks;   /* entries of blocks[] in use */
    int32_t max_blocks; /* ceil(n_ctx / block_size) */
    int32_t n_pos;      /* positions [0, n_pos) hold valid KV */
} engine_kv_seq;

/* Result of a prefix lookup, also the cache-miss explainer. */
typedef struct {
    int32_t cached_tokens; /* positions whose KV the sequence now holds from the cache (full
                            * blocks + copied rows of a partly matching block); 0 for a peek */
    int32_t match_tokens;  /* longest common prefix (token granularity) with any sequence in
                            * the tree */
    int32_t diverged_at;   /* token index where the request differs from the most similar
                            * cached sequence (= match_tokens), or -1 when there was no
                            * difference: the request or every cached continuation ended */
} engine_kv_match;

typedef struct engine_kv_node engine_kv_node;

struct engine_kv_cache {
    engine_kv_params p;
    size_t row_bytes;        /* n_head_kv * head_dim * element size */
    size_t block_rows_bytes; /* block_size * row_bytes: one block of one layer, K or V */
    int32_t n_blocks;
    unsigned char **k; /* [n_layer] -> n_blocks * block_rows_bytes */
    unsigned char **v;
    int32_t *refcount;  /* [n_blocks] */
    int32_t *node_of;   /* [n_blocks] tree node holding the block, or -1 */
    int32_t *free_list; /* stack of free block ids */
    int32_t n_free;
    int32_t n_used;
    int64_t n_evicted;

    /* radix tree (radix.c) */
    engine_kv_node *nodes; /* [n_blocks + 1]; node 0 is the root (no block) */
    int32_t *node_tokens;  /* [(n_blocks + 1) * block_size] keys */
    int32_t *path;         /* [n_blocks + 1] scratch for lookups */
    int32_t node_free;     /* head of the free node list (linked through next_sibling) */
    int32_t n_nodes;
    int32_t n_pinned;
    int32_t lru_head, lru_tail; /* evictable nodes, least recently used first */
    uint64_t clock;

    /* recurrent-state snapshots (radix.c; hybrid models) */
    unsigned char *snaps;  /* [n_snaps * snap_bytes] */
    int32_t *snap_owner;   /* [n_snaps] node holding the slot, or -1 */
    int32_t *snap_free;    /* stack of free slots */
    int32_t n_snap_free;
    int64_t n_snaps_evicted;
};
typedef struct engine_kv_cache engine_kv_cache;

/* ---- cache and pool (block_pool.c) ------------------------------------------------------- */

/* Plan and allocate the pool. ENGINE_EINVAL for bad shapes or type, ENGINE_ERANGE when the
 * budget holds less than one block (the message names the bytes one block needs),
 * ENGINE_ENOMEM naming the bytes it wanted. *out owned by the caller. */
int engine_kv_cache_new(engine_kv_cache **out, const engine_kv_params *p);
void engine_kv_cache_free(engine_kv_cache *c);
void engine_kv_cache_stats(const engine_kv_cache *c, engine_kv_stats *st);

/* Take a block (refcount 1): from the free list, else by evicting the least recently used
 * evictable cached block. ENGINE_ENOMEM when every block is used or pinned. */
int engine_kv_block_alloc(engine_kv_cache *c, int32_t *id);
void engine_kv_block_ref(engine_kv_cache *c, int32_t id);
/* Drop one reference; at 0 the block goes back to the free list, or stays cached when the
 * tree holds it. */
void engine_kv_block_unref(engine_kv_cache *c, int32_t id);
int32_t engine_kv_block_refcount(const engine_kv_cache *c, int32_t id);
void *engine_kv_block_k(const engine_kv_cache *c, int32_t layer, int32_t id);
void *engine_kv_block_v(const engine_kv_cache *c, int32_t layer, int32_t id);
/* Copy rows [0, n_rows) of K and V of every layer from block src to block dst. */
void engine_kv_block_copy(engine_kv_cache *c, int32_t dst, int32_t src, int32_t n_rows);

/* Sequences. init: an empty table for n_ctx positions (ENGINE_ENOMEM, ENGINE_EINVAL);
 * deinit releases and frees the table (NULL-safe on a zeroed seq). */
int engine_kv_seq_init(engine_kv_cache *c, engine_kv_seq *s, int32_t n_ctx);
void engine_kv_seq_deinit(engine_kv_cache *c, engine_kv_seq *s);
/* Drop every block reference; n_pos = 0. */
void engine_kv_seq_release(engine_kv_cache *c, engine_kv_seq *s);
/* Make positions [n_pos, n) writable and set n_pos = n: allocate the blocks that are missing
 * and copy-on-write the block holding position n_pos when it is shared (refcount > 1 or held
 * by the tree). ENGINE_ERANGE beyond the table, ENGINE_ENOMEM when the pool is exhausted
 * (n_pos unchanged; blocks taken so far stay in the table and are released with it). */
int engine_kv_seq_extend(engine_kv_cache *c, engine_kv_seq *s, int32_t n);
/* Roll back to n positions (n <= n_pos): blocks wholly beyond n are released. */
void engine_kv_seq_truncate(engine_kv_cache *c, engine_kv_seq *s, int32_t n);
/* The view the attention kernels read for one layer. */
engine_kv_view engine_kv_seq_view(const engine_kv_cache *c, const engine_kv_seq *s, int32_t layer);

/* ---- prefix tree (radix.c) --------------------------------------------------------------- */

/* Longest-prefix lookup into an empty sequence s: the full cached blocks matching tokens are
 * appended to s's table by reference (refcounts bumped, nodes touched for LRU), and when the
 * request continues into a partly matching cached block, that block is copied
 * (copy-on-write) into a private block holding the matching rows. At most max_tokens
 * positions are reused (pass n - 1 so the last prompt token is computed and yields logits).
 * Sets s->n_pos = m->cached_tokens. ENGINE_EINVAL when s is not empty; a failed copy (pool
 * exhausted) is not an error: the partial rows are simply not reused. */
int engine_kv_prefix_attach(engine_kv_cache *c, engine_kv_seq *s, const int32_t *tokens, int32_t n,
                            int32_t max_tokens, engine_kv_match *m);
/* The same lookup without taking anything (m->cached_tokens = 0); touches nothing. */
void engine_kv_prefix_peek(const engine_kv_cache *c, const int32_t *tokens, int32_t n,
                           engine_kv_match *m);
/* Insert s's full blocks covering tokens [0, min(n, s->n_pos)) after a request. A block
 * already cached for the same prefix (e.g. computed twice concurrently) keeps the cached copy;
 * s's duplicate goes back to the pool when s is released. Never fails. */
void engine_kv_prefix_insert(engine_kv_cache *c, const engine_kv_seq *s, const int32_t *tokens,
                             int32_t n);
/* Pin (or unpin) the cached full blocks of the prefix tokens[0, n): pinned blocks are never
 * evicted. Pins nest. *n_tokens = the tokens covered (full cached blocks only). Unpinning a
 * prefix that is not pinned or not cached: ENGINE_EINVAL, nothing changed. */
/* At the end of a sequence, after engine_kv_prefix_insert: insert its partly filled last block
 * (tokens [full blocks, min(n, s->n_pos))) as a partial leaf when its full blocks are cached
 * and no cached block holds those rows already. s must be released or truncated before it
 * writes again (its block is the tree's now: a write would copy it first). Never fails. */
void engine_kv_prefix_insert_tail(engine_kv_cache *c, const engine_kv_seq *s,
                                  const int32_t *tokens, int32_t n);
int engine_kv_prefix_pin(engine_kv_cache *c, const int32_t *tokens, int32_t n, int32_t *n_tokens);
int engine_kv_prefix_unpin(engine_kv_cache *c, const int32_t *tokens, int32_t n);
/* Evict up to n_blocks cached blocks, least recently used first; returns how many. */
int32_t engine_kv_evict(engine_kv_cache *c, int32_t n_blocks);

/* ---- recurrent-state snapshots in the tree (radix.c; hybrid models) ----------------------------
 *
 * A hybrid model's cached prefix is usable only where the state of its recurrent layers at
 * that position is known too: a node may carry a snapshot of that state after its block's
 * last position (a block boundary). Snapshots are large (63 MB for Qwen3.5-35B-A3B), so the
 * sessions take them at chosen boundaries only: the last boundary of each prompt and of each
 * finished sequence (kv_session.c). A snapshot lives as long as its node (it is freed with the
 * node's block when the LRU evicts it) unless a newer snapshot needs its slot: then the least
 * recently used one of an unpinned node gives way (the node and its KV stay). */

/* Like engine_kv_prefix_attach, but only up to the deepest cached node, within max_tokens,
 * that carries a snapshot: full blocks only, no partial rows. *state = that snapshot (valid
 * until the next change of the cache), NULL when nothing was attached. */
int engine_kv_prefix_attach_state(engine_kv_cache *c, engine_kv_seq *s, const int32_t *tokens,
                                  int32_t n, int32_t max_tokens, engine_kv_match *m,
                                  const void **state);
/* A slot for the snapshot of the cached prefix tokens[0, n) (n a positive multiple of the block
 * size): the buffer of snap_bytes the caller fills, and *node for engine_kv_snapshot_drop.
 * NULL when the cache takes no snapshots, the prefix's blocks are not all in the tree, its node
 * has a snapshot already (touched), or every slot belongs to a pinned node. */
void *engine_kv_snapshot_claim(engine_kv_cache *c, const int32_t *tokens, int32_t n,
                               int32_t *node);
/* Give a claimed slot back (its buffer could not be filled). */
void engine_kv_snapshot_drop(engine_kv_cache *c, int32_t node);

/* ---- sessions on the pool (kv_session.c; called by engine/model/model.c) ------------------ */

/* Give m a prefix cache of budget_bytes of KV storage of `type`, shared by the model's
 * sessions of the same KV type (others keep a private contiguous cache). Once, before any
 * session. Errors as engine_kv_cache_new, ENGINE_EINVAL when sessions exist. */
int engine_kv_model_enable(engine_model *m, size_t budget_bytes, engine_kv_type type);
/* The rest hold the model's pool_mu. init: decide paged or not, set up the block table. */
int engine_kv_session_init(engine_session *s);
/* Insert the session's full blocks into the tree and release its table. */
void engine_kv_session_deinit(engine_session *s);
/* For an empty session about to take tokens[0, n): attach the cached prefix (at most n - 1
 * positions); returns the positions reused (0 when not paged or not empty). */
int32_t engine_kv_session_attach(engine_session *s, const int32_t *tokens, int32_t n);
/* Make positions [n_tokens, n_pos) writable before a forward. ENGINE_ENOMEM: pool exhausted. */
int engine_kv_session_reserve(engine_session *s, int32_t n_pos);
/* After an append: drop unused reserved positions, insert newly full blocks into the tree. */
void engine_kv_session_commit(engine_session *s);
/* Hybrid models, after a prompt (and at the session's end): keep a snapshot of the recurrent
 * state at the last block boundary in the tree (when the session still has it). */
void engine_kv_session_snapshot(engine_session *s);
void engine_kv_session_truncate(engine_session *s, int32_t n);

/* ---- persisted prefixes (persist.c; the public API is in engine.h) ------------------------- */

#define ENGINE_KV_PERSIST_HEADER_BYTES 128
/* The 64-bit hash the prefix files use for their header, tokens and KV data (with a seed per
 * use; exported for tests that craft files). */
uint64_t engine_kv_persist_hash(const void *p, size_t n, uint64_t seed);
#define ENGINE_KV_PERSIST_SEED_TOKENS 0x70c1  /* the token ids (header offset 80) */
#define ENGINE_KV_PERSIST_SEED_PAYLOAD 0x9a77 /* the KV data (offset 88) */
#define ENGINE_KV_PERSIST_SEED_HEADER 0x4e21  /* header bytes [0, 120) (offset 120) */

/* Cross-file (block_pool.c <-> radix.c). */
void engine_kv_seq_push(engine_kv_cache *c, engine_kv_seq *s, int32_t b); /* owns the ref */
int engine_kv_radix_init(engine_kv_cache *c);
void engine_kv_radix_deinit(engine_kv_cache *c);
void engine_kv_radix_on_idle(engine_kv_cache *c, int32_t block); /* refcount fell to 0 */
void engine_kv_radix_on_busy(engine_kv_cache *c, int32_t block); /* refcount rose from 0 */


#endif
