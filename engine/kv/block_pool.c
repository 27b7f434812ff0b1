/* The KV block pool: storage planned from a byte budget, refcounts, free list, and the
 * sequences' block tables (see kv.h for the layout and the block states). */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kv/kv.h"

const char *engine_kv_type_name(engine_kv_type t) {
    switch (t) {
    case ENGINE_KV_DEFAULT: return "default";
    case ENGINE_KV_F16: return "f16";
    case ENGINE_KV_F32: return "f32";
    case ENGINE_KV_Q8_0: return "q8_0";
    }
    return "?";
}

int engine_kv_type_parse(const char *name) {
    static const engine_kv_type all[] = {ENGINE_KV_F16, ENGINE_KV_F32, ENGINE_KV_Q8_0};
    for (size_t i = 0; name && i < sizeof all / sizeof *all; i++)
        if (!strcmp(name, engine_kv_type_name(all[i]))) return (int)all[i];
    return -2;
}

int engine_kv_cache_new(engine_kv_cache **out, const engine_kv_params *p) {
    *out = NULL;
    if (!p || p->n_layer <= 0 || p->n_head_kv <= 0 || p->head_dim <= 0 || p->block_size < 0 ||
        (p->type != ENGINE_KV_F16 && p->type != ENGINE_KV_F32 && p->type != ENGINE_KV_Q8_0))
        return engine_err(ENGINE_EINVAL, "kv cache: bad parameters");
    if (p->n_layer > 4096 || p->n_head_kv > 4096 || p->head_dim > 65536 || p->block_size > 4096)
        return engine_err(ENGINE_EINVAL, "kv cache: shape out of range");
    if (p->n_snaps < 0 || p->n_snaps > 65536 || (p->n_snaps && p->snap_bytes == 0) ||
        p->snap_bytes > ((size_t)1 << 40))
        return engine_err(ENGINE_EINVAL, "kv cache: %d snapshots of %zu bytes", (int)p->n_snaps,
                          p->snap_bytes);
    size_t row_bytes = engine_cpu_kv_row_bytes(p->type, p->n_head_kv, p->head_dim);
    if (row_bytes == 0)
        return engine_err(ENGINE_EUNSUPPORTED, "kv cache: type %s needs a head size that is a "
                          "multiple of 32 (not %d)", engine_kv_type_name(p->type),
                          (int)p->head_dim);
    engine_kv_cache *c = calloc(1, sizeof *c);
    if (!c) return engine_err(ENGINE_ENOMEM, "kv cache: out of memory");
    c->p = *p;
    if (c->p.block_size == 0) c->p.block_size = ENGINE_KV_BLOCK_SIZE;
    c->row_bytes = row_bytes;
    c->block_rows_bytes = (size_t)c->p.block_size * c->row_bytes;
    size_t block_bytes = c->block_rows_bytes * 2 * (size_t)p->n_layer;
    size_t nb = p->budget_bytes / block_bytes;
    if (nb < 1) {
        free(c);
        return engine_err(ENGINE_ERANGE,
                          "kv cache: a budget of %zu bytes holds no block (one block needs %zu)",
                          p->budget_bytes, block_bytes);
    }
    if (nb > INT32_MAX / 2) nb = INT32_MAX / 2;
    c->n_blocks = (int32_t)nb;
    int rc = ENGINE_ENOMEM;
    c->k = calloc((size_t)p->n_layer, sizeof *c->k);
    c->v = calloc((size_t)p->n_layer, sizeof *c->v);
    c->refcount = calloc(nb, sizeof *c->refcount);
    c->node_of = malloc(nb * sizeof *c->node_of);
    c->free_list = malloc(nb * sizeof *c->free_list);
    if (!c->k || !c->v || !c->refcount || !c->node_of || !c->free_list) goto fail;
    for (int32_t l = 0; l < p->n_layer; l++) {
        /* not zeroed: every row is written before it is read */
        c->k[l] = malloc(nb * c->block_rows_bytes);
        c->v[l] = malloc(nb * c->block_rows_bytes);
        if (!c->k[l] || !c->v[l]) goto fail;
    }
    /* stack: block 0 is taken first */
    for (int32_t b = 0; b < c->n_blocks; b++) {
        c->node_of[b] = -1;
        c->free_list[b] = c->n_blocks - 1 - b;
    }
    c->n_free = c->n_blocks;
    if ((rc = engine_kv_radix_init(c)) < 0) goto fail;
    *out = c;
    return 0;
fail:
    engine_kv_cache_free(c);
    if (rc == ENGINE_ENOMEM)
        return engine_err(ENGINE_ENOMEM, "kv cache: out of memory for %zu bytes of KV and %d "
                          "snapshots of %zu bytes", nb * block_bytes, (int)p->n_snaps,
                          p->snap_bytes);
    return rc;
}

void engine_kv_cache_free(engine_kv_cache *c) {
    if (!c) return;
    engine_kv_radix_deinit(c);
    for (int32_t l = 0; c->k && l < c->p.n_layer; l++)
        free(c->k[l]);
    for (int32_t l = 0; c->v && l < c->p.n_layer; l++)
        free(c->v[l]);
    free(c->k);
    free(c->v);
    free(c->refcount);
    free(c->node_of);
    free(c->free_list);
    free(c);
}

void engine_kv_cache_stats(const engine_kv_cache *c, engine_kv_stats *st) {
    memset(st, 0, sizeof *st);
    st->type = c->p.type;
    st->block_size = c->p.block_size;
    st->n_blocks = c->n_blocks;
    st->n_free = c->n_free;
    st->n_used = c->n_used;
    st->n_cached = c->n_blocks - c->n_free - c->n_used;
    st->n_pinned = c->n_pinned;
    st->n_nodes = c->n_nodes;
    st->block_bytes = c->block_rows_bytes * 2 * (size_t)c->p.n_layer;
    st->n_evicted = c->n_evicted;
    if (c->snaps) {
        st->n_snaps = c->p.n_snaps;
        st->n_snaps_used = c->p.n_snaps - c->n_snap_free;
        st->snap_bytes = c->p.snap_bytes;
        st->n_snaps_evicted = c->n_snaps_evicted;
    }
    st->total_bytes = st->block_bytes * (size_t)c->n_blocks + st->snap_bytes * (size_t)st->n_snaps;
}

int engine_kv_block_alloc(engine_kv_cache *c, int32_t *id) {
    if (c->n_free == 0 && engine_kv_evict(c, 1) == 0)
        return engine_err(ENGINE_ENOMEM, "kv cache: all %d blocks are in use or pinned",
                          (int)c->n_blocks);
    int32_t b = c->free_list[--c->n_free];
    ENGINE_ASSERT(c->refcount[b] == 0 && c->node_of[b] < 0);
    c->refcount[b] = 1;
    c->n_used++;
    *id = b;
    return 0;
}

void engine_kv_block_ref(engine_kv_cache *c, int32_t id) {
    ENGINE_ASSERT(id >= 0 && id < c->n_blocks);
    ENGINE_ASSERT(c->refcount[id] > 0 || c->node_of[id] >= 0); /* never a free block */
    if (c->refcount[id]++ == 0) {
        c->n_used++;
        engine_kv_radix_on_busy(c, id);
    }
}

void engine_kv_block_unref(engine_kv_cache *c, int32_t id) {
    ENGINE_ASSERT(id >= 0 && id < c->n_blocks && c->refcount[id] > 0);
    if (--c->refcount[id] > 0) return;
    c->n_used--;
    if (c->node_of[id] >= 0)
        engine_kv_radix_on_idle(c, id);
    else
        c->free_list[c->n_free++] = id;
}

int32_t engine_kv_block_refcount(const engine_kv_cache *c, int32_t id) {
    return c->refcount[id];
}

void *engine_kv_block_k(const engine_kv_cache *c, int32_t layer, int32_t id) {
    return c->k[layer] + (size_t)id * c->block_rows_bytes;
}

void *engine_kv_block_v(const engine_kv_cache *c, int32_t layer, int32_t id) {
    return c->v[layer] + (size_t)id * c->block_rows_bytes;
}

void engine_kv_block_copy(engine_kv_cache *c, int32_t dst, int32_t src, int32_t n_rows) {
    size_t bytes = (size_t)n_rows * c->row_bytes;
    for (int32_t l = 0; l < c->p.n_layer; l++) {
        memcpy(engine_kv_block_k(c, l, dst), engine_kv_block_k(c, l, src), bytes);
        memcpy(engine_kv_block_v(c, l, dst), engine_kv_block_v(c, l, src), bytes);
    }
}

/* ---- sequences ----------------------------------------------------------------------------- */

int engine_kv_seq_init(engine_kv_cache *c, engine_kv_seq *s, int32_t n_ctx) {
    memset(s, 0, sizeof *s);
    if (n_ctx <= 0) return engine_err(ENGINE_EINVAL, "kv sequence: n_ctx %d", (int)n_ctx);
    int32_t bs = c->p.block_size;
    s->max_blocks = (int32_t)(((int64_t)n_ctx + bs - 1) / bs);
    size_t np = (size_t)c->p.n_layer * (size_t)s->max_blocks;
    s->blocks = malloc((size_t)s->max_blocks * sizeof *s->blocks);
    s->k_ptr = calloc(np, sizeof *s->k_ptr);
    s->v_ptr = calloc(np, sizeof *s->v_ptr);
    if (!s->blocks || !s->k_ptr || !s->v_ptr) {
        engine_kv_seq_deinit(c, s);
        return engine_err(ENGINE_ENOMEM, "kv sequence: out of memory for %d blocks",
                          (int)s->max_blocks);
    }
    return 0;
}

void engine_kv_seq_deinit(engine_kv_cache *c, engine_kv_seq *s) {
    if (!s) return;
    if (c) engine_kv_seq_release(c, s);
    free(s->blocks);
    free(s->k_ptr);
    free(s->v_ptr);
    memset(s, 0, sizeof *s);
}

/* Point table entry i at block b (the caller owns the reference). */
static void seq_set(engine_kv_cache *c, engine_kv_seq *s, int32_t i, int32_t b) {
    s->blocks[i] = b;
    for (int32_t l = 0; l < c->p.n_layer; l++) {
        s->k_ptr[(size_t)l * s->max_blocks + i] = engine_kv_block_k(c, l, b);
        s->v_ptr[(size_t)l * s->max_blocks + i] = engine_kv_block_v(c, l, b);
    }
}

/* Append block b (reference owned by the sequence from now on). */
void engine_kv_seq_push(engine_kv_cache *c, engine_kv_seq *s, int32_t b) {
    ENGINE_ASSERT(s->n_blocks < s->max_blocks);
    seq_set(c, s, s->n_blocks++, b);
}

void engine_kv_seq_release(engine_kv_cache *c, engine_kv_seq *s) {
    /* in table order: the tree touches each cached block as it goes idle */
    for (int32_t i = 0; i < s->n_blocks; i++)
        engine_kv_block_unref(c, s->blocks[i]);
    s->n_blocks = 0;
    s->n_pos = 0;
}

int engine_kv_seq_extend(engine_kv_cache *c, engine_kv_seq *s, int32_t n) {
    int32_t bs = c->p.block_size;
    if (n < s->n_pos) return engine_err(ENGINE_EINVAL, "kv sequence: extend backwards");
    if (n > s->max_blocks * bs)
        return engine_err(ENGINE_ERANGE, "kv sequence: %d positions exceed the table (%d)", (int)n,
                          (int)(s->max_blocks * bs));
    if (n == s->n_pos) return 0;
    int32_t bi = s->n_pos / bs;
    if (bi < s->n_blocks) {
        /* the block receiving position n_pos already exists: write into it only when it is
         * ours alone */
        int32_t b = s->blocks[bi];
        if (c->refcount[b] > 1 || c->node_of[b] >= 0) {
            int32_t nb;
            int rc = engine_kv_block_alloc(c, &nb);
            if (rc < 0) return rc;
            engine_kv_block_copy(c, nb, b, s->n_pos - bi * bs);
            seq_set(c, s, bi, nb);
            engine_kv_block_unref(c, b);
        }
    }
    int32_t need = (n + bs - 1) / bs;
    while (s->n_blocks < need) {
        int32_t nb;
        int rc = engine_kv_block_alloc(c, &nb);
        if (rc < 0) return rc;
        seq_set(c, s, s->n_blocks++, nb);
    }
    s->n_pos = n;
    return 0;
}

void engine_kv_seq_truncate(engine_kv_cache *c, engine_kv_seq *s, int32_t n) {
    if (n < 0) n = 0;
    if (n >= s->n_pos) return;
    int32_t bs = c->p.block_size, keep = (n + bs - 1) / bs;
    while (s->n_blocks > keep)
        engine_kv_block_unref(c, s->blocks[--s->n_blocks]);
    s->n_pos = n;
}

engine_kv_view engine_kv_seq_view(const engine_kv_cache *c, const engine_kv_seq *s, int32_t layer) {
    engine_kv_view v = {
        .k_blocks = s->k_ptr + (size_t)layer * s->max_blocks,
        .v_blocks = s->v_ptr + (size_t)layer * s->max_blocks,
        .block_size = c->p.block_size,
        .type = c->p.type,
        .n_head_kv = c->p.n_head_kv,
        .head_dim = c->p.head_dim,
    };
    return v;
}
