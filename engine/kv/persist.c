/* Persisted prefixes (engine.h, "Persisted prefixes"): a pinned prefix's KV blocks written to a
 * file and loaded back into a model's prefix cache.
 *
 * File layout (version 1, little-endian; the engine only builds on little-endian hosts):
 *     0  magic "SPKVPRFX"              8 bytes
 *     8  u32 version (1)              12  u32 header bytes (128)
 *    16  u64 model fingerprint[2]
 *    32  u32 KV type (engine_kv_type) 36  u32 block size (positions)
 *    40  u32 n_layer                  44  u32 n_head_kv
 *    48  u32 head_dim                 52  u32 n_tokens (= n_blocks * block size)
 *    56  u32 n_blocks                 60  u32 reserved (0)
 *    64  u64 row bytes                72  u64 payload bytes
 *    80  u64 hash of the tokens       88  u64 hash of the payload
 *    96  24 reserved bytes (0)       120  u64 hash of bytes [0, 120)
 *   128  n_tokens x i32 token ids
 *        payload: for each block, for each layer, K rows then V rows (block size x row bytes
 *        each, the pool's own storage format)
 * Version 2 (hybrid models, qwen35moe) is version 1 plus the recurrent layers' state (conv +
 * DeltaNet, engine_q35_state_copy's snapshot format) at the prefix's last position:
 *    96  u64 state bytes (the model's snapshot size), 104..120 reserved (0)
 *        after the KV payload: the state snapshot (state bytes)
 *   and the payload hash (88) covers the KV payload and then the state. Version 1 files (models
 *   without recurrent layers) are written and read as before.
 * The header is checked field by field (and by its hash) before the sizes are trusted, the
 * file size must be exactly what the header says, and the tokens and the payload must match
 * their hashes: a damaged file is refused before anything enters the cache. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "kv/kv.h"
#include "model/model_int.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "persisted prefixes assume a little-endian host"
#endif

#define HDR_BYTES ENGINE_KV_PERSIST_HEADER_BYTES
#define FORMAT_VERSION 1u   /* models without recurrent layers */
#define FORMAT_VERSION_STATE 2u /* hybrid models: with the recurrent state */
static const char MAGIC[8] = {'S', 'P', 'K', 'V', 'P', 'R', 'F', 'X'};

/* Fingerprint sampling: FP_PAGES pages of FP_PAGE bytes spread evenly over the tensor data. */
#define FP_PAGES 256
#define FP_PAGE 4096

enum { SEED_FP = 0x5f1d, SEED_KEY = 0x6b3e };
#define SEED_TOKENS ENGINE_KV_PERSIST_SEED_TOKENS
#define SEED_PAYLOAD ENGINE_KV_PERSIST_SEED_PAYLOAD
#define SEED_HEADER ENGINE_KV_PERSIST_SEED_HEADER

/* ---- hashing --------------------------------------------------------------------------------
 * A streaming 64-bit-word hash: four independent multiply-rotate lanes over 32-byte stripes (a
 * few GB/s, so hashing the KV of a long prefix costs little against reading it), then a merge
 * and a final avalanche. Each round is a bijection of its lane for a fixed input word, so a
 * change in any one word always changes that lane. Not cryptographic (see engine.h). */
#define K1 0x9E3779B185EBCA87ull
#define K2 0xC2B2AE3D27D4EB4Full
#define K3 0x165667B19E3779F9ull
#define K4 0x85EBCA77C2B2AE63ull
#define K5 0x27D4EB2F165667C5ull

typedef struct {
    uint64_t v[4];
    uint64_t total;
    unsigned char tail[32];
    size_t n_tail;
} hasher;

static uint64_t rotl64(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

static uint64_t lane_round(uint64_t acc, uint64_t w) {
    acc += w * K2;
    return rotl64(acc, 31) * K1;
}

static uint64_t load64(const unsigned char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

static void h_init(hasher *h, uint64_t seed) {
    h->v[0] = seed + K1 + K2;
    h->v[1] = seed + K2;
    h->v[2] = seed;
    h->v[3] = seed - K1;
    h->total = 0;
    h->n_tail = 0;
}

static void h_stripe(hasher *h, const unsigned char *p) {
    for (int i = 0; i < 4; i++) h->v[i] = lane_round(h->v[i], load64(p + 8 * i));
}

static void h_update(hasher *h, const void *data, size_t n) {
    const unsigned char *p = data;
    h->total += n;
    if (h->n_tail) {
        size_t take = ENGINE_MIN(n, 32 - h->n_tail);
        memcpy(h->tail + h->n_tail, p, take);
        h->n_tail += take;
        p += take;
        n -= take;
        if (h->n_tail < 32) return;
        h_stripe(h, h->tail);
        h->n_tail = 0;
    }
    for (; n >= 32; p += 32, n -= 32) h_stripe(h, p);
    memcpy(h->tail, p, n);
    h->n_tail = n;
}

static uint64_t avalanche(uint64_t x) {
    x ^= x >> 33;
    x *= K2;
    x ^= x >> 29;
    x *= K3;
    x ^= x >> 32;
    return x;
}

static void h_final(const hasher *h, uint64_t out[2]) {
    uint64_t a = rotl64(h->v[0], 1) + rotl64(h->v[1], 7) + rotl64(h->v[2], 12) +
                 rotl64(h->v[3], 18);
    for (int i = 0; i < 4; i++) a = (a ^ lane_round(0, h->v[i])) * K1 + K4;
    a += h->total;
    size_t i = 0;
    for (; i + 8 <= h->n_tail; i += 8)
        a = rotl64(a ^ lane_round(0, load64(h->tail + i)), 27) * K1 + K4;
    for (; i < h->n_tail; i++) a = rotl64(a ^ (h->tail[i] * K5), 11) * K1;
    out[0] = avalanche(a);
    out[1] = avalanche(a ^ (rotl64(h->v[0] ^ h->v[2], 17) + (h->v[1] ^ h->v[3]) * K5 + K3));
}

uint64_t engine_kv_persist_hash(const void *p, size_t n, uint64_t seed) {
    hasher h;
    uint64_t out[2];
    h_init(&h, seed);
    h_update(&h, p, n);
    h_final(&h, out);
    return out[0];
}

/* ---- model fingerprint and checks ---------------------------------------------------------- */

static int model_fingerprint(const engine_model *m, uint64_t fp[2]) {
    if (!m->gguf) return engine_err(ENGINE_EINVAL, "%s: no GGUF mapping to fingerprint", m->path);
    const unsigned char *map = engine_gguf_map(m->gguf);
    uint64_t size = engine_gguf_file_size(m->gguf), off = engine_gguf_data_offset(m->gguf);
    if (off > size) return engine_err(ENGINE_EINTERNAL, "data offset beyond the file");
    hasher h;
    h_init(&h, SEED_FP);
    h_update(&h, &size, sizeof size);
    h_update(&h, map, off); /* header, metadata, tensor table */
    uint64_t dlen = size - off;
    if (dlen <= (uint64_t)FP_PAGES * FP_PAGE) {
        h_update(&h, map + off, dlen);
    } else {
        for (uint64_t i = 0; i < FP_PAGES; i++)
            h_update(&h, map + off + (dlen - FP_PAGE) * i / (FP_PAGES - 1), FP_PAGE);
    }
    h_final(&h, fp);
    return 0;
}

/* The common argument checks: a prefix cache, at least one block, ids in range, the context. */
static int check_prefix(engine_model *m, const int32_t *tokens, size_t n, int32_t *n_full,
                        const char *what) {
    if (!m || (!tokens && n)) return engine_err(ENGINE_EINVAL, "%s: NULL argument", what);
    if (!m->kvc)
        return engine_err(ENGINE_EINVAL, "%s: %s has no prefix cache (load it with "
                          "engine_model_params.prefix_cache_bytes, on the CPU)", what, m->path);
    int32_t bs = m->kvc->p.block_size;
    if (n > (size_t)m->info.n_ctx_train)
        return engine_err(ENGINE_ERANGE, "%s: %zu tokens exceed the model's context (%d)", what,
                          n, (int)m->info.n_ctx_train);
    *n_full = (int32_t)(n / (size_t)bs) * bs;
    if (*n_full == 0)
        return engine_err(ENGINE_EINVAL, "%s: %zu tokens, fewer than one KV block (%d)", what, n,
                          (int)bs);
    for (int32_t i = 0; i < *n_full; i++)
        if (tokens[i] < 0 || tokens[i] >= m->info.n_vocab)
            return engine_err(ENGINE_EINVAL, "%s: token %d at index %d is out of range (vocabulary "
                              "of %d)", what, (int)tokens[i], (int)i, (int)m->info.n_vocab);
    return 0;
}

/* ---- save ---------------------------------------------------------------------------------- */

/* Take references to the cached blocks of tokens[0, n_full) into seq and pin them, when all are
 * cached (*held = true); otherwise leave nothing behind. Under the model's KV lock. */
static int hold_prefix(engine_model *m, engine_kv_seq *seq, const int32_t *tokens, int32_t n_full,
                       bool *held, const void **state) {
    engine_kv_cache *c = m->kvc;
    *held = false;
    *state = NULL;
    pthread_mutex_lock(&m->pool_mu);
    int rc = engine_kv_seq_init(c, seq, n_full);
    if (rc == 0) {
        engine_kv_match mt;
        /* hybrid models: the prefix is held only with the recurrent state at its end (the
         * snapshot of a pinned node keeps its slot) */
        rc = c->snaps ? engine_kv_prefix_attach_state(c, seq, tokens, n_full, n_full, &mt, state)
                      : engine_kv_prefix_attach(c, seq, tokens, n_full, n_full, &mt);
        if (rc == 0 && seq->n_pos == n_full) {
            int32_t covered = 0;
            rc = engine_kv_prefix_pin(c, tokens, n_full, &covered);
            ENGINE_ASSERT(rc == 0 && covered == n_full);
            *held = true;
        } else {
            engine_kv_seq_deinit(c, seq);
        }
    }
    pthread_mutex_unlock(&m->pool_mu);
    return rc;
}

/* Run tokens[0, n_full) through a paged session: its blocks enter the tree when it ends. */
static int compute_prefix(engine_model *m, const int32_t *tokens, int32_t n_full,
                          int32_t *computed) {
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_ctx = n_full;
    sp.kv_type = m->kvc->p.type;
    engine_session *s = NULL;
    int rc = engine_session_new(&s, m, &sp);
    if (rc) return rc;
    ENGINE_ASSERT(s->kv_paged);
    rc = engine_session_append(s, tokens, (size_t)n_full, NULL);
    *computed = rc ? 0 : n_full - s->kv_cached;
    engine_session_free(s);
    return rc;
}

typedef struct {
    int fd;
    const char *path; /* for messages */
    unsigned char *buf;
    size_t n, cap;
    uint64_t written;
} writer;

static int write_all(int fd, const void *p, size_t n, const char *path) {
    const unsigned char *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return engine_err(ENGINE_EIO, "%s: cannot write: %s", path,
                              w < 0 ? strerror(errno) : "no progress");
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static int w_flush(writer *w) {
    int rc = write_all(w->fd, w->buf, w->n, w->path);
    w->n = 0;
    return rc;
}

static int w_put(writer *w, const void *p, size_t n) {
    w->written += n;
    const unsigned char *b = p;
    while (n) {
        if (w->n == w->cap) {
            int rc = w_flush(w);
            if (rc) return rc;
        }
        size_t take = ENGINE_MIN(n, w->cap - w->n);
        memcpy(w->buf + w->n, b, take);
        w->n += take;
        b += take;
        n -= take;
    }
    return 0;
}

static void put32(unsigned char *h, size_t off, uint32_t v) {
    memcpy(h + off, &v, 4);
}

static void put64(unsigned char *h, size_t off, uint64_t v) {
    memcpy(h + off, &v, 8);
}

static uint32_t get32(const unsigned char *h, size_t off) {
    uint32_t v;
    memcpy(&v, h + off, 4);
    return v;
}

static uint64_t get64(const unsigned char *h, size_t off) {
    uint64_t v;
    memcpy(&v, h + off, 8);
    return v;
}

/* fsync the directory holding path, so that the rename is durable. */
static int sync_dir(const char *path) {
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, sizeof dir, ".");
    } else {
        size_t len = slash == path ? 1 : (size_t)(slash - path);
        if (len >= sizeof dir) return engine_err(ENGINE_EIO, "%s: path too long", path);
        memcpy(dir, path, len);
        dir[len] = '\0';
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return engine_err(ENGINE_EIO, "%s: cannot open its directory: %s", path,
                                  strerror(errno));
    int rc = fsync(fd) == 0 || errno == EINVAL ? 0 /* file systems without directory fsync */
                                               : engine_err(ENGINE_EIO, "%s: cannot sync its "
                                                            "directory: %s", path, strerror(errno));
    close(fd);
    return rc;
}

/* Write the held blocks of seq (cached full blocks: immutable while referenced) to a temporary
 * file beside path, then rename it over path. */
static int write_prefix(const engine_kv_cache *c, const engine_kv_seq *seq, const int32_t *tokens,
                        int32_t n_full, const void *state, const uint64_t fp[2], const char *path,
                        uint64_t *bytes) {
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 8);
    unsigned char *buf = malloc((size_t)1 << 20);
    int rc = 0, fd = -1;
    if (!tmp || !buf) {
        rc = engine_err(ENGINE_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".XXXXXX", 8);
    fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        tmp[0] = '\0'; /* nothing created: nothing to remove */
        rc = engine_err(ENGINE_EIO, "%s: cannot create a temporary file beside it: %s", path,
                        strerror(errno));
        goto done;
    }
    if (fchmod(fd, 0644) != 0) {
        rc = engine_err(ENGINE_EIO, "%s: chmod: %s", tmp, strerror(errno));
        goto done;
    }
    writer w = {fd, tmp, buf, 0, (size_t)1 << 20, 0};
    unsigned char hdr[HDR_BYTES] = {0};
    const engine_kv_params *p = &c->p;
    int32_t n_blocks = n_full / p->block_size;
    uint64_t payload = (uint64_t)n_blocks * (uint64_t)p->n_layer * 2 * c->block_rows_bytes;
    hasher hp;
    h_init(&hp, SEED_PAYLOAD);
    if ((rc = w_put(&w, hdr, HDR_BYTES))) goto done; /* filled in at the end */
    if ((rc = w_put(&w, tokens, (size_t)n_full * sizeof *tokens))) goto done;
    for (int32_t i = 0; i < n_blocks; i++) {
        for (int32_t l = 0; l < p->n_layer; l++) {
            const void *k = engine_kv_block_k(c, l, seq->blocks[i]);
            const void *v = engine_kv_block_v(c, l, seq->blocks[i]);
            h_update(&hp, k, c->block_rows_bytes);
            h_update(&hp, v, c->block_rows_bytes);
            if ((rc = w_put(&w, k, c->block_rows_bytes)) ||
                (rc = w_put(&w, v, c->block_rows_bytes)))
                goto done;
        }
    }
    size_t state_bytes = c->snaps ? c->p.snap_bytes : 0;
    if (state_bytes) {
        h_update(&hp, state, state_bytes);
        if ((rc = w_put(&w, state, state_bytes))) goto done;
    }
    if ((rc = w_flush(&w))) goto done;
    uint64_t hpay[2];
    h_final(&hp, hpay);
    memcpy(hdr, MAGIC, 8);
    put32(hdr, 8, state_bytes ? FORMAT_VERSION_STATE : FORMAT_VERSION);
    put32(hdr, 12, HDR_BYTES);
    put64(hdr, 16, fp[0]);
    put64(hdr, 24, fp[1]);
    put32(hdr, 32, (uint32_t)p->type);
    put32(hdr, 36, (uint32_t)p->block_size);
    put32(hdr, 40, (uint32_t)p->n_layer);
    put32(hdr, 44, (uint32_t)p->n_head_kv);
    put32(hdr, 48, (uint32_t)p->head_dim);
    put32(hdr, 52, (uint32_t)n_full);
    put32(hdr, 56, (uint32_t)n_blocks);
    put64(hdr, 64, c->row_bytes);
    put64(hdr, 72, payload);
    put64(hdr, 80, engine_kv_persist_hash(tokens, (size_t)n_full * sizeof *tokens, SEED_TOKENS));
    put64(hdr, 88, hpay[0]);
    put64(hdr, 96, state_bytes);
    put64(hdr, 120, engine_kv_persist_hash(hdr, 120, SEED_HEADER));
    for (size_t off = 0; off < HDR_BYTES;) {
        ssize_t r = pwrite(fd, hdr + off, HDR_BYTES - off, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            rc = engine_err(ENGINE_EIO, "%s: cannot write: %s", tmp,
                            r < 0 ? strerror(errno) : "no progress");
            goto done;
        }
        off += (size_t)r;
    }
    if (fsync(fd) != 0) {
        rc = engine_err(ENGINE_EIO, "%s: fsync: %s", tmp, strerror(errno));
        goto done;
    }
    int cr = close(fd);
    fd = -1;
    if (cr != 0) {
        rc = engine_err(ENGINE_EIO, "%s: close: %s", tmp, strerror(errno));
        goto done;
    }
    if (rename(tmp, path) != 0) {
        rc = engine_err(ENGINE_EIO, "%s: cannot rename %s over it: %s", path, tmp,
                        strerror(errno));
        goto done;
    }
    tmp[0] = '\0'; /* renamed: nothing to remove */
    rc = sync_dir(path);
    *bytes = w.written;
done:
    if (fd >= 0) close(fd);
    if (rc && tmp && tmp[0]) unlink(tmp);
    free(tmp);
    free(buf);
    return rc;
}

int engine_prefix_save(engine_model *m, const int32_t *tokens, size_t n, const char *path,
                       engine_prefix_info *info) {
    if (info) memset(info, 0, sizeof *info);
    if (!path) return engine_err(ENGINE_EINVAL, "engine_prefix_save: NULL path");
    int32_t n_full = 0, computed = 0;
    int rc = check_prefix(m, tokens, n, &n_full, "engine_prefix_save");
    if (rc) return rc;
    uint64_t fp[2];
    if ((rc = model_fingerprint(m, fp))) return rc;
    engine_kv_seq seq;
    bool held = false;
    const void *state = NULL;
    rc = hold_prefix(m, &seq, tokens, n_full, &held, &state);
    if (rc == 0 && !held) {
        rc = compute_prefix(m, tokens, n_full, &computed);
        if (rc == 0) rc = hold_prefix(m, &seq, tokens, n_full, &held, &state);
        if (rc == 0 && !held)
            rc = engine_err(ENGINE_ENOMEM, "engine_prefix_save: the prefix's %d blocks%s were "
                            "evicted as soon as they were computed: the prefix cache (%d blocks%s) "
                            "is too small for it", (int)(n_full / m->kvc->p.block_size),
                            m->kvc->snaps ? " or its recurrent-state snapshot" : "",
                            (int)m->kvc->n_blocks, m->kvc->snaps ? ", snapshot slots all pinned"
                                                                 : "");
    }
    if (rc) return rc;
    uint64_t bytes = 0;
    rc = write_prefix(m->kvc, &seq, tokens, n_full, state, fp, path, &bytes);
    pthread_mutex_lock(&m->pool_mu);
    if (rc) engine_kv_prefix_unpin(m->kvc, tokens, n_full); /* nothing saved: no pin either */
    engine_kv_seq_deinit(m->kvc, &seq);
    pthread_mutex_unlock(&m->pool_mu);
    if (rc) return rc;
    if (info) {
        info->n_tokens = n_full;
        info->n_blocks = n_full / m->kvc->p.block_size;
        info->computed_tokens = computed;
        info->file_bytes = bytes;
    }
    engine_log(ENGINE_LOG_DEBUG, "prefix of %d tokens saved to %s (%d computed)", (int)n_full, path,
               (int)computed);
    return 0;
}

/* ---- load ---------------------------------------------------------------------------------- */

/* Check the mapped file against m; on success *n_tokens and the pointers into the mapping. */
static int check_file(const engine_model *m, const char *path, const unsigned char *f,
                      uint64_t size, const int32_t *want, size_t n_want, int32_t *n_tokens_out,
                      const int32_t **toks_out, const unsigned char **payload_out,
                      const unsigned char **state_out) {
    const engine_kv_cache *c = m->kvc;
    const engine_kv_params *p = &c->p;
    if (size < HDR_BYTES)
        return engine_err(ENGINE_EFORMAT, "%s: truncated: %llu bytes, less than a prefix file's "
                          "header (%d)", path, (unsigned long long)size, HDR_BYTES);
    if (memcmp(f, MAGIC, 8) != 0)
        return engine_err(ENGINE_EFORMAT, "%s: not a spark-agent prefix file (bad magic)", path);
    uint32_t version = get32(f, 8);
    if (version != FORMAT_VERSION && version != FORMAT_VERSION_STATE)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: prefix file format version %u; this build "
                          "reads versions %u and %u", path, version, FORMAT_VERSION,
                          FORMAT_VERSION_STATE);
    if (get32(f, 12) != HDR_BYTES)
        return engine_err(ENGINE_EFORMAT, "%s: header size %u, version %u has %d", path,
                          get32(f, 12), version, HDR_BYTES);
    if (get64(f, 120) != engine_kv_persist_hash(f, 120, SEED_HEADER))
        return engine_err(ENGINE_EFORMAT, "%s: the header is damaged (its hash does not match)",
                          path);
    if (get32(f, 60) != 0) return engine_err(ENGINE_EFORMAT, "%s: reserved field set", path);
    for (size_t i = version == FORMAT_VERSION ? 96 : 104; i < 120; i++)
        if (f[i]) return engine_err(ENGINE_EFORMAT, "%s: reserved header bytes set", path);
    /* version 2 carries the recurrent state of a hybrid model, version 1 none */
    uint64_t state_bytes = version == FORMAT_VERSION ? 0 : get64(f, 96);
    if (version == FORMAT_VERSION && c->snaps)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: prefix file format version 1 holds no "
                          "recurrent state; %s is a hybrid model and needs version %u", path,
                          m->path, FORMAT_VERSION_STATE);
    if (version == FORMAT_VERSION_STATE && !c->snaps)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: prefix file format version %u holds a hybrid "
                          "model's recurrent state; %s has no recurrent layers (version %u)", path,
                          version, m->path, FORMAT_VERSION);
    if (c->snaps && state_bytes != c->p.snap_bytes)
        return engine_err(ENGINE_EFORMAT, "%s: recurrent state of %llu bytes, the model's is %zu",
                          path, (unsigned long long)state_bytes, c->p.snap_bytes);
    uint64_t fp[2];
    int rc = model_fingerprint(m, fp);
    if (rc) return rc;
    if (get64(f, 16) != fp[0] || get64(f, 24) != fp[1])
        return engine_err(ENGINE_EINVAL, "%s: saved for another model file (fingerprint "
                          "%016llx%016llx; %s has %016llx%016llx)", path,
                          (unsigned long long)get64(f, 16), (unsigned long long)get64(f, 24),
                          m->path, (unsigned long long)fp[0], (unsigned long long)fp[1]);
    uint32_t type = get32(f, 32);
    if (type != (uint32_t)p->type)
        return engine_err(ENGINE_EINVAL, "%s: KV type %s, the model's prefix cache holds %s", path,
                          type <= ENGINE_KV_Q8_0 ? engine_kv_type_name((engine_kv_type)type)
                                                 : "unknown",
                          engine_kv_type_name(p->type));
    uint32_t bs = get32(f, 36), nl = get32(f, 40), nh = get32(f, 44), hd = get32(f, 48);
    if (bs != (uint32_t)p->block_size || nl != (uint32_t)p->n_layer ||
        nh != (uint32_t)p->n_head_kv || hd != (uint32_t)p->head_dim)
        return engine_err(ENGINE_EINVAL, "%s: KV layout of %u layers x %u heads x %u dims in "
                          "blocks of %u; the model's is %d x %d x %d in blocks of %d", path, nl,
                          nh, hd, bs, (int)p->n_layer, (int)p->n_head_kv, (int)p->head_dim,
                          (int)p->block_size);
    if (get64(f, 64) != c->row_bytes)
        return engine_err(ENGINE_EFORMAT, "%s: row size %llu does not match its layout (%zu)",
                          path, (unsigned long long)get64(f, 64), c->row_bytes);
    uint32_t n_tokens = get32(f, 52), n_blocks = get32(f, 56);
    if (n_blocks == 0 || (uint64_t)n_blocks * bs != n_tokens)
        return engine_err(ENGINE_EFORMAT, "%s: %u tokens in %u blocks of %u", path, n_tokens,
                          n_blocks, bs);
    if (n_blocks > (uint32_t)c->n_blocks)
        return engine_err(ENGINE_ENOMEM, "%s: holds %u KV blocks, the model's prefix cache has "
                          "%d in all", path, n_blocks, (int)c->n_blocks);
    uint64_t payload = (uint64_t)n_blocks * nl * 2 * c->block_rows_bytes;
    if (get64(f, 72) != payload)
        return engine_err(ENGINE_EFORMAT, "%s: payload of %llu bytes, its layout needs %llu", path,
                          (unsigned long long)get64(f, 72), (unsigned long long)payload);
    uint64_t need = HDR_BYTES + (uint64_t)n_tokens * 4 + payload + state_bytes;
    if (size != need)
        return engine_err(ENGINE_EFORMAT, "%s: %s: %llu bytes, the header says %llu", path,
                          size < need ? "truncated" : "trailing bytes",
                          (unsigned long long)size, (unsigned long long)need);
    const int32_t *toks = (const int32_t *)(const void *)(f + HDR_BYTES);
    if (get64(f, 80) != engine_kv_persist_hash(toks, (size_t)n_tokens * 4, SEED_TOKENS))
        return engine_err(ENGINE_EFORMAT, "%s: the token ids are damaged (their hash does not "
                          "match)", path);
    for (uint32_t i = 0; i < n_tokens; i++)
        if (toks[i] < 0 || toks[i] >= m->info.n_vocab)
            return engine_err(ENGINE_EFORMAT, "%s: token %d at index %u is out of range "
                              "(vocabulary of %d)", path, (int)toks[i], i, (int)m->info.n_vocab);
    if (want) {
        size_t want_full = n_want / bs * bs;
        if (want_full != n_tokens)
            return engine_err(ENGINE_EINVAL, "%s: holds a prefix of %u tokens, not the %zu "
                              "expected", path, n_tokens, want_full);
        for (uint32_t i = 0; i < n_tokens; i++)
            if (toks[i] != want[i])
                return engine_err(ENGINE_EINVAL, "%s: holds another prefix: token %u is %d, %d "
                                  "expected", path, i, (int)toks[i], (int)want[i]);
    }
    const unsigned char *pay = f + HDR_BYTES + (size_t)n_tokens * 4;
    hasher hp;
    uint64_t hpay[2];
    h_init(&hp, SEED_PAYLOAD);
    h_update(&hp, pay, payload);
    h_update(&hp, pay + payload, state_bytes);
    h_final(&hp, hpay);
    if (get64(f, 88) != hpay[0])
        return engine_err(ENGINE_EFORMAT, "%s: the KV data%s is damaged (its hash does not match)",
                          path, state_bytes ? " or the recurrent state" : "");
    *n_tokens_out = (int32_t)n_tokens;
    *toks_out = toks;
    *payload_out = pay;
    *state_out = state_bytes ? pay + payload : NULL;
    return 0;
}

/* Put the checked blocks into the cache, pinned: the cached part of the prefix by reference,
 * the rest copied from the file into new blocks, then inserted. Under the model's KV lock. */
static int insert_prefix(engine_model *m, const char *path, const int32_t *toks, int32_t n_full,
                         const unsigned char *pay, const unsigned char *state, int32_t *inserted) {
    engine_kv_cache *c = m->kvc;
    int32_t bs = c->p.block_size, n_blocks = n_full / bs;
    engine_kv_seq seq;
    pthread_mutex_lock(&m->pool_mu);
    int rc = engine_kv_seq_init(c, &seq, n_full);
    if (rc) goto done;
    engine_kv_match mt;
    if ((rc = engine_kv_prefix_attach(c, &seq, toks, n_full, n_full, &mt))) goto done;
    int32_t first_new = seq.n_pos / bs; /* a partly copied block is overwritten below */
    if ((rc = engine_kv_seq_extend(c, &seq, n_full))) {
        engine_kv_stats st;
        engine_kv_cache_stats(c, &st);
        rc = engine_err(rc, "%s: the prefix cache cannot take the prefix's %d new blocks (%d "
                        "blocks: %d free, %d in use, %d pinned)", path, (int)(n_blocks - first_new),
                        (int)st.n_blocks, (int)st.n_free, (int)st.n_used, (int)st.n_pinned);
        goto done;
    }
    size_t brb = c->block_rows_bytes;
    for (int32_t i = first_new; i < n_blocks; i++) {
        const unsigned char *src = pay + (size_t)i * (size_t)c->p.n_layer * 2 * brb;
        for (int32_t l = 0; l < c->p.n_layer; l++) {
            memcpy(engine_kv_block_k(c, l, seq.blocks[i]), src + (size_t)l * 2 * brb, brb);
            memcpy(engine_kv_block_v(c, l, seq.blocks[i]), src + ((size_t)l * 2 + 1) * brb, brb);
        }
    }
    engine_kv_prefix_insert(c, &seq, toks, n_full);
    int32_t covered = 0;
    rc = engine_kv_prefix_pin(c, toks, n_full, &covered);
    ENGINE_ASSERT(rc == 0 && covered == n_full);
    if (state) {
        /* the recurrent state at the prefix's end into its node's snapshot slot (a node that
         * has one already holds the same state: computed by the same model for the same
         * tokens); the node is pinned, so its snapshot stays */
        int32_t node;
        void *dst = engine_kv_snapshot_claim(c, toks, n_full, &node);
        if (dst) {
            memcpy(dst, state, c->p.snap_bytes);
        } else {
            engine_kv_seq probe;
            const void *have = NULL;
            bool ok = engine_kv_seq_init(c, &probe, n_full) == 0 &&
                      engine_kv_prefix_attach_state(c, &probe, toks, n_full, n_full, &mt,
                                                    &have) == 0 &&
                      probe.n_pos == n_full;
            engine_kv_seq_deinit(c, &probe);
            if (!ok) {
                engine_kv_prefix_unpin(c, toks, n_full);
                rc = engine_err(ENGINE_ENOMEM, "%s: no recurrent-state snapshot slot free for "
                                "the prefix (all %d belong to pinned prefixes)", path,
                                (int)c->p.n_snaps);
                goto done;
            }
        }
    }
    *inserted = n_blocks - first_new;
done:
    engine_kv_seq_deinit(c, &seq);
    pthread_mutex_unlock(&m->pool_mu);
    return rc;
}

int engine_prefix_load(engine_model *m, const char *path, const int32_t *tokens, size_t n,
                       engine_prefix_info *info) {
    if (info) memset(info, 0, sizeof *info);
    if (!m || !path) return engine_err(ENGINE_EINVAL, "engine_prefix_load: NULL argument");
    if (!m->kvc)
        return engine_err(ENGINE_EINVAL, "engine_prefix_load: %s has no prefix cache (load it "
                          "with engine_model_params.prefix_cache_bytes, on the CPU)", m->path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return engine_err(ENGINE_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int rc = engine_err(ENGINE_EIO, "%s: not a regular file", path);
        close(fd);
        return rc;
    }
    uint64_t size = (uint64_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int rc = engine_err(ENGINE_EIO, "%s: cannot map: %s", path, strerror(errno));
            close(fd);
            return rc;
        }
    }
    close(fd);
    int32_t n_tokens = 0, inserted = 0;
    const int32_t *toks = NULL;
    const unsigned char *pay = NULL, *state = NULL;
    int rc = check_file(m, path, map ? map : (const void *)"", size, tokens, n, &n_tokens, &toks,
                        &pay, &state);
    if (rc == 0) rc = insert_prefix(m, path, toks, n_tokens, pay, state, &inserted);
    if (map) munmap(map, (size_t)size);
    if (rc) return rc;
    if (info) {
        info->n_tokens = n_tokens;
        info->n_blocks = n_tokens / m->kvc->p.block_size;
        info->inserted_blocks = inserted;
        info->file_bytes = size;
    }
    engine_log(ENGINE_LOG_DEBUG, "prefix of %d tokens loaded from %s (%d new blocks)",
               (int)n_tokens, path, (int)inserted);
    return 0;
}

int engine_prefix_unpin(engine_model *m, const int32_t *tokens, size_t n) {
    int32_t n_full = 0;
    int rc = check_prefix(m, tokens, n, &n_full, "engine_prefix_unpin");
    if (rc) return rc;
    pthread_mutex_lock(&m->pool_mu);
    rc = engine_kv_prefix_unpin(m->kvc, tokens, n_full);
    pthread_mutex_unlock(&m->pool_mu);
    if (rc) return engine_err(rc, "engine_prefix_unpin: the prefix of %d tokens is not pinned",
                              (int)n_full);
    return 0;
}

int engine_prefix_default_path(engine_model *m, const int32_t *tokens, size_t n, char *buf,
                               size_t cap) {
    int32_t n_full = 0;
    int rc = check_prefix(m, tokens, n, &n_full, "engine_prefix_default_path");
    if (rc) return rc;
    if (!buf) return engine_err(ENGINE_EINVAL, "engine_prefix_default_path: NULL buffer");
    uint64_t fp[2], key[2];
    if ((rc = model_fingerprint(m, fp))) return rc;
    const engine_kv_params *p = &m->kvc->p;
    int32_t layout[6] = {(int32_t)p->type, p->block_size, p->n_layer, p->n_head_kv, p->head_dim,
                         n_full};
    hasher h;
    h_init(&h, SEED_KEY);
    h_update(&h, fp, sizeof fp);
    h_update(&h, layout, sizeof layout);
    h_update(&h, tokens, (size_t)n_full * sizeof *tokens);
    h_final(&h, key);
    char dir[4096];
    if ((rc = engine_cache_dir(dir, sizeof dir, "prefixes", true))) return rc;
    int w = snprintf(buf, cap, "%s/%016llx%016llx.kvp", dir, (unsigned long long)key[0],
                     (unsigned long long)key[1]);
    if (w < 0 || (size_t)w >= cap)
        return engine_err(ENGINE_ERANGE, "engine_prefix_default_path: %d bytes needed, %zu given",
                          w + 1, cap);
    return 0;
}
