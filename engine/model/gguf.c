/* GGUF v3 reader: the file is hostile until every byte we use has been bounds-checked.
 * Every count and length is compared with the bytes left in the file before anything is
 * allocated for it, so memory use stays within a small multiple of the file size. */
#include "model/gguf.h"
#include "cpu/quant.h"
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

/* ---------------------------------------------------------------------------------------------
 * A bump arena for names, string views and nested values: freed in one go at close.
 * ------------------------------------------------------------------------------------------- */
typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} arena_chunk;

#define ARENA_CHUNK (64 * 1024)

struct engine_gguf {
    char *path;
    const uint8_t *map;
    size_t size;
    uint32_t version;
    size_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    engine_gguf_kv *kvs;
    int64_t n_tensors;
    engine_gguf_tensor *tensors;
    uint32_t *kv_hash; /* index + 1, 0 = empty; capacity a power of two */
    size_t kv_hash_cap;
    uint32_t *tensor_hash;
    size_t tensor_hash_cap;
    arena_chunk *arena;
};

static void *arena_alloc(engine_gguf *g, size_t n) {
    n = (n + 15) & ~(size_t)15;
    arena_chunk *c = g->arena;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        /* A big one-off block goes behind the current chunk so the current stays usable. */
        if (g->arena && n > ARENA_CHUNK) {
            c->next = g->arena->next;
            g->arena->next = c;
        } else {
            c->next = g->arena;
            g->arena = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

/* ---------------------------------------------------------------------------------------------
 * Parsing
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    engine_gguf *g;
    const uint8_t *p;
    size_t size, pos;
    char ctx[160]; /* the field being read, for error messages: "key 3 \"general.name\"" */
} parser;

__attribute__((format(printf, 2, 3))) static int perr(parser *ps, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return engine_err(ENGINE_EFORMAT, "%s: %s%s%s", ps->g->path, ps->ctx, ps->ctx[0] ? ": " : "",
                      msg);
}

static int need(parser *ps, size_t n, const char *what) {
    if (ps->size - ps->pos < n)
        return perr(ps, "%s at offset %zu needs %zu bytes, only %zu left (file is %zu bytes)", what,
                    ps->pos, n, ps->size - ps->pos, ps->size);
    return 0;
}

static uint32_t rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t rd_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static int read_u32(parser *ps, uint32_t *out, const char *what) {
    int rc = need(ps, 4, what);
    if (rc) return rc;
    *out = rd_u32(ps->p + ps->pos);
    ps->pos += 4;
    return 0;
}

static int read_u64(parser *ps, uint64_t *out, const char *what) {
    int rc = need(ps, 8, what);
    if (rc) return rc;
    *out = rd_u64(ps->p + ps->pos);
    ps->pos += 8;
    return 0;
}

static int read_str(parser *ps, engine_gguf_str *out, const char *what) {
    uint64_t len;
    int rc = read_u64(ps, &len, what);
    if (rc) return rc;
    if (len > ps->size - ps->pos)
        return perr(ps, "%s length %llu at offset %zu runs past the end of the file (%zu bytes)",
                    what, (unsigned long long)len, ps->pos - 8, ps->size);
    out->ptr = (const char *)ps->p + ps->pos;
    out->len = (size_t)len;
    ps->pos += (size_t)len;
    return 0;
}

/* A name (key or tensor name) as a NUL-terminated copy in the arena. */
static int read_name(parser *ps, const char **out, const char *what) {
    engine_gguf_str s = {0};
    int rc = read_str(ps, &s, what);
    if (rc) return rc;
    if (s.len == 0) return perr(ps, "empty %s", what);
    if (s.len > ENGINE_GGUF_MAX_NAME)
        return perr(ps, "%s of %zu bytes exceeds the limit of %d", what, s.len,
                    ENGINE_GGUF_MAX_NAME);
    if (memchr(s.ptr, 0, s.len)) return perr(ps, "%s contains a NUL byte", what);
    char *copy = arena_alloc(ps->g, s.len + 1);
    if (!copy) return engine_err(ENGINE_ENOMEM, "%s: out of memory", ps->g->path);
    memcpy(copy, s.ptr, s.len);
    copy[s.len] = 0;
    *out = copy;
    return 0;
}

size_t engine_gguf_scalar_size(int type) {
    switch (type) {
    case ENGINE_GGUF_UINT8:
    case ENGINE_GGUF_INT8:
    case ENGINE_GGUF_BOOL:
        return 1;
    case ENGINE_GGUF_UINT16:
    case ENGINE_GGUF_INT16:
        return 2;
    case ENGINE_GGUF_UINT32:
    case ENGINE_GGUF_INT32:
    case ENGINE_GGUF_FLOAT32:
        return 4;
    case ENGINE_GGUF_UINT64:
    case ENGINE_GGUF_INT64:
    case ENGINE_GGUF_FLOAT64:
        return 8;
    default:
        return 0; /* STRING, ARRAY, unknown */
    }
}

const char *engine_gguf_type_name(int type) {
    static const char *const names[ENGINE_GGUF_TYPE_COUNT] = {
        "uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
        "bool",  "string", "array",  "uint64", "int64",  "float64"};
    return type >= 0 && type < ENGINE_GGUF_TYPE_COUNT ? names[type] : "?";
}

/* Decode one scalar of `type` at p (bounds already checked). */
static int decode_scalar(parser *ps, int type, const uint8_t *p, engine_gguf_value *v) {
    v->type = (engine_gguf_type)type;
    switch (type) {
    case ENGINE_GGUF_UINT8:
        v->u64 = p[0];
        break;
    case ENGINE_GGUF_INT8:
        v->i64 = (int8_t)p[0];
        break;
    case ENGINE_GGUF_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        v->u64 = x;
        break;
    }
    case ENGINE_GGUF_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        v->i64 = x;
        break;
    }
    case ENGINE_GGUF_UINT32:
        v->u64 = rd_u32(p);
        break;
    case ENGINE_GGUF_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        v->i64 = x;
        break;
    }
    case ENGINE_GGUF_UINT64:
        v->u64 = rd_u64(p);
        break;
    case ENGINE_GGUF_INT64: {
        int64_t x;
        memcpy(&x, p, 8);
        v->i64 = x;
        break;
    }
    case ENGINE_GGUF_FLOAT32: {
        float x;
        memcpy(&x, p, 4);
        v->f64 = x;
        break;
    }
    case ENGINE_GGUF_FLOAT64:
        memcpy(&v->f64, p, 8);
        break;
    case ENGINE_GGUF_BOOL:
        if (p[0] > 1)
            return perr(ps, "bool value %u at offset %zu is neither 0 nor 1", p[0],
                        (size_t)(p - ps->p));
        v->b = p[0] != 0;
        break;
    default:
        return perr(ps, "internal: not a scalar type %d", type);
    }
    return 0;
}

static int parse_value(parser *ps, int type, int depth, engine_gguf_value *v) {
    int rc;
    memset(v, 0, sizeof *v);
    if (type < 0 || type >= ENGINE_GGUF_TYPE_COUNT)
        return perr(ps, "unknown value type %d at offset %zu", type, ps->pos - 4);
    if (type == ENGINE_GGUF_STRING) {
        v->type = ENGINE_GGUF_STRING;
        return read_str(ps, &v->str, "string");
    }
    if (type != ENGINE_GGUF_ARRAY) {
        const size_t sz = engine_gguf_scalar_size(type);
        if ((rc = need(ps, sz, engine_gguf_type_name(type)))) return rc;
        rc = decode_scalar(ps, type, ps->p + ps->pos, v);
        ps->pos += sz;
        return rc;
    }
    /* Array: u32 element type, u64 count, elements. */
    if (depth >= ENGINE_GGUF_MAX_DEPTH)
        return perr(ps, "arrays nested deeper than %d levels", ENGINE_GGUF_MAX_DEPTH);
    uint32_t et;
    uint64_t n;
    const size_t at = ps->pos;
    if ((rc = read_u32(ps, &et, "array element type"))) return rc;
    if (et >= ENGINE_GGUF_TYPE_COUNT)
        return perr(ps, "array at offset %zu has unknown element type %u", at, et);
    if ((rc = read_u64(ps, &n, "array length"))) return rc;
    v->type = ENGINE_GGUF_ARRAY;
    v->arr.type = (engine_gguf_type)et;
    v->arr.n = n;
    const size_t left = ps->size - ps->pos;
    /* The smallest encoding of one element: a scalar's size, 8 for a string (its length),
     * 12 for a nested array (type + count). */
    const size_t min_elem = et == ENGINE_GGUF_STRING  ? 8
                            : et == ENGINE_GGUF_ARRAY ? 12
                                                      : engine_gguf_scalar_size((int)et);
    if (n > left / min_elem)
        return perr(ps,
                    "array of %llu %s at offset %zu cannot fit in the %zu bytes left (file "
                    "is %zu bytes)",
                    (unsigned long long)n, engine_gguf_type_name((int)et), at, left, ps->size);
    if (et == ENGINE_GGUF_STRING) {
        engine_gguf_str *strs = n ? arena_alloc(ps->g, (size_t)n * sizeof *strs) : NULL;
        if (n && !strs) return engine_err(ENGINE_ENOMEM, "%s: out of memory", ps->g->path);
        for (uint64_t i = 0; i < n; i++)
            if ((rc = read_str(ps, &strs[i], "array string"))) return rc;
        v->arr.strs = strs;
    } else if (et == ENGINE_GGUF_ARRAY) {
        engine_gguf_value *vals = n ? arena_alloc(ps->g, (size_t)n * sizeof *vals) : NULL;
        if (n && !vals) return engine_err(ENGINE_ENOMEM, "%s: out of memory", ps->g->path);
        for (uint64_t i = 0; i < n; i++)
            if ((rc = parse_value(ps, ENGINE_GGUF_ARRAY, depth + 1, &vals[i]))) return rc;
        v->arr.vals = vals;
    } else {
        v->arr.data = ps->p + ps->pos;
        if (et == ENGINE_GGUF_BOOL) {
            for (uint64_t i = 0; i < n; i++)
                if (ps->p[ps->pos + i] > 1)
                    return perr(ps, "bool array element %llu at offset %zu is neither 0 nor 1",
                                (unsigned long long)i, ps->pos + (size_t)i);
        }
        ps->pos += (size_t)n * min_elem;
    }
    return 0;
}

uint64_t engine_gguf_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static size_t hash_cap_for(int64_t n) {
    size_t cap = 16;
    while (cap < (size_t)n * 2)
        cap <<= 1;
    return cap;
}

/* Insert names[idx] (stride-addressed) into a table; returns the index of an existing equal
 * name, or -1 when inserted. */
static int64_t hash_insert(uint32_t *table, size_t cap, const char *name, uint32_t idx,
                           const char *(*name_at)(const engine_gguf *, uint32_t),
                           const engine_gguf *g) {
    size_t h = (size_t)engine_gguf_hash(name) & (cap - 1);
    while (table[h]) {
        if (!strcmp(name_at(g, table[h] - 1), name)) return table[h] - 1;
        h = (h + 1) & (cap - 1);
    }
    table[h] = idx + 1;
    return -1;
}

static int64_t hash_find(const uint32_t *table, size_t cap, const char *name,
                         const char *(*name_at)(const engine_gguf *, uint32_t),
                         const engine_gguf *g) {
    if (!table) return -1;
    size_t h = (size_t)engine_gguf_hash(name) & (cap - 1);
    while (table[h]) {
        if (!strcmp(name_at(g, table[h] - 1), name)) return table[h] - 1;
        h = (h + 1) & (cap - 1);
    }
    return -1;
}

static const char *kv_name_at(const engine_gguf *g, uint32_t i) {
    return g->kvs[i].key;
}

static const char *tensor_name_at(const engine_gguf *g, uint32_t i) {
    return g->tensors[i].name;
}

static int parse_header_and_kv(parser *ps) {
    engine_gguf *g = ps->g;
    int rc;
    if (ps->size < 24)
        return perr(ps, "file too small for a GGUF header (%zu bytes, need at least 24)", ps->size);
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    read_u32(ps, &magic, "magic");
    if (magic != ENGINE_GGUF_MAGIC)
        return perr(ps, "not a GGUF file (magic %02x %02x %02x %02x, expected \"GGUF\")", ps->p[0],
                    ps->p[1], ps->p[2], ps->p[3]);
    read_u32(ps, &version, "version");
    if (version == 1)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s: GGUF version 1 is not supported (re-convert "
                          "the model with a current converter)",
                          g->path);
    if (version != 2 && version != 3) {
        if ((version & 0xffff) == 0 && version != 0)
            return perr(ps,
                        "GGUF version %u: a big-endian file? Only little-endian files are "
                        "supported",
                        version);
        return perr(ps, "unsupported GGUF version %u (expected 3)", version);
    }
    g->version = version;
    read_u64(ps, &n_tensors, "tensor count");
    read_u64(ps, &n_kv, "metadata count");
    if (n_tensors > ENGINE_GGUF_MAX_TENSORS)
        return perr(ps, "tensor count %llu exceeds the limit of %u", (unsigned long long)n_tensors,
                    ENGINE_GGUF_MAX_TENSORS);
    if (n_kv > ENGINE_GGUF_MAX_KV)
        return perr(ps, "metadata count %llu exceeds the limit of %u", (unsigned long long)n_kv,
                    ENGINE_GGUF_MAX_KV);
    /* A key-value takes at least 8 (key length) + 1 (key) + 4 (type) + 1 (value) bytes and a
     * tensor info at least 8 + 1 + 4 + 8 + 4 + 8. */
    const size_t left = ps->size - ps->pos;
    if (n_kv * 14 + n_tensors * 33 > left)
        return perr(ps,
                    "%llu metadata entries and %llu tensor infos cannot fit in the %zu bytes "
                    "after the header",
                    (unsigned long long)n_kv, (unsigned long long)n_tensors, left);
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    g->kvs = calloc(n_kv ? n_kv : 1, sizeof *g->kvs);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    g->kv_hash_cap = hash_cap_for((int64_t)n_kv);
    g->kv_hash = calloc(g->kv_hash_cap, sizeof *g->kv_hash);
    if (!g->kvs || !g->tensors || !g->kv_hash)
        return engine_err(ENGINE_ENOMEM, "%s: out of memory", g->path);

    for (uint64_t i = 0; i < n_kv; i++) {
        engine_gguf_kv *kv = &g->kvs[i];
        snprintf(ps->ctx, sizeof ps->ctx, "key %llu", (unsigned long long)i);
        if ((rc = read_name(ps, &kv->key, "key"))) return rc;
        snprintf(ps->ctx, sizeof ps->ctx, "key %llu \"%.100s\"", (unsigned long long)i, kv->key);
        uint32_t type;
        if ((rc = read_u32(ps, &type, "value type"))) return rc;
        if ((rc = parse_value(ps, (int)type, 0, &kv->value))) return rc;
        int64_t dup = hash_insert(g->kv_hash, g->kv_hash_cap, kv->key, (uint32_t)i, kv_name_at, g);
        if (dup >= 0) return perr(ps, "duplicate key (also key %lld)", (long long)dup);
    }
    ps->ctx[0] = 0;

    /* general.alignment: an unsigned integer (uint32 in every writer), a power of two. */
    g->alignment = ENGINE_GGUF_DEFAULT_ALIGNMENT;
    const engine_gguf_kv *al = engine_gguf_find_key(g, "general.alignment");
    if (al) {
        const engine_gguf_type t = al->value.type;
        if (t != ENGINE_GGUF_UINT8 && t != ENGINE_GGUF_UINT16 && t != ENGINE_GGUF_UINT32 &&
            t != ENGINE_GGUF_UINT64)
            return perr(ps, "general.alignment: expected uint32, found %s",
                        engine_gguf_type_name(t));
        const uint64_t a = al->value.u64;
        if (a == 0 || (a & (a - 1)) || a > (1u << 20))
            return perr(ps, "general.alignment %llu is not a power of two in [1, 1048576]",
                        (unsigned long long)a);
        g->alignment = (size_t)a;
    }
    return 0;
}

static int parse_tensor_infos(parser *ps) {
    engine_gguf *g = ps->g;
    int rc;
    g->tensor_hash_cap = hash_cap_for(g->n_tensors);
    g->tensor_hash = calloc(g->tensor_hash_cap, sizeof *g->tensor_hash);
    if (!g->tensor_hash) return engine_err(ENGINE_ENOMEM, "%s: out of memory", g->path);
    for (int64_t i = 0; i < g->n_tensors; i++) {
        engine_gguf_tensor *t = &g->tensors[i];
        snprintf(ps->ctx, sizeof ps->ctx, "tensor %lld", (long long)i);
        if ((rc = read_name(ps, &t->name, "tensor name"))) return rc;
        snprintf(ps->ctx, sizeof ps->ctx, "tensor %lld \"%.100s\"", (long long)i, t->name);
        int64_t dup = hash_insert(g->tensor_hash, g->tensor_hash_cap, t->name, (uint32_t)i,
                                  tensor_name_at, g);
        if (dup >= 0) return perr(ps, "duplicate tensor name (also tensor %lld)", (long long)dup);
        uint32_t n_dims, type;
        if ((rc = read_u32(ps, &n_dims, "n_dims"))) return rc;
        if (n_dims < 1 || n_dims > ENGINE_GGUF_MAX_DIMS)
            return perr(ps, "n_dims %u is not in 1..%d", n_dims, ENGINE_GGUF_MAX_DIMS);
        t->n_dims = (int)n_dims;
        uint64_t nel = 1;
        for (int d = 0; d < ENGINE_GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t ne;
            if ((rc = read_u64(ps, &ne, "dimension"))) return rc;
            if (ne == 0 || ne > ((uint64_t)1 << 62))
                return perr(ps, "ne[%u] = %llu is not in 1..2^62", d, (unsigned long long)ne);
            if (__builtin_mul_overflow(nel, ne, &nel) || nel > ((uint64_t)1 << 62))
                return perr(ps, "element count overflows (ne[%u] = %llu)", d,
                            (unsigned long long)ne);
            t->ne[d] = (int64_t)ne;
        }
        t->n_elements = (int64_t)nel;
        if ((rc = read_u32(ps, &type, "type"))) return rc;
        const engine_type_traits *tr = engine_type_traits_get((int)type);
        if (!tr) return perr(ps, "unknown tensor type %u", type);
        t->type = (engine_type)type;
        if (t->ne[0] % tr->block_size)
            return perr(ps, "ne[0] = %lld is not a multiple of the %s block size %lld",
                        (long long)t->ne[0], tr->name, (long long)tr->block_size);
        uint64_t nbytes = (uint64_t)(t->ne[0] / tr->block_size) * tr->type_size;
        for (int d = 1; d < ENGINE_GGUF_MAX_DIMS; d++)
            if (__builtin_mul_overflow(nbytes, (uint64_t)t->ne[d], &nbytes))
                return perr(ps, "byte size overflows");
        if (nbytes > SIZE_MAX) return perr(ps, "byte size overflows");
        t->nbytes = (size_t)nbytes;
        if ((rc = read_u64(ps, &t->offset, "data offset"))) return rc;
    }
    ps->ctx[0] = 0;
    return 0;
}

static int cmp_by_offset(const void *a, const void *b, void *arg) {
    const engine_gguf_tensor *t = arg;
    const uint64_t x = t[*(const uint32_t *)a].offset, y = t[*(const uint32_t *)b].offset;
    return x < y ? -1 : x > y;
}

static int check_tensor_data(parser *ps) {
    engine_gguf *g = ps->g;
    /* The data section starts at the next multiple of the alignment after the infos. */
    const uint64_t start = ((uint64_t)ps->pos + g->alignment - 1) / g->alignment * g->alignment;
    if (start > g->size) {
        if (g->n_tensors > 0)
            return perr(ps,
                        "data section at offset %llu starts beyond the end of the file "
                        "(%zu bytes)",
                        (unsigned long long)start, g->size);
    }
    g->data_offset = start > g->size ? g->size : start;
    const uint64_t avail = g->size - g->data_offset;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        engine_gguf_tensor *t = &g->tensors[i];
        snprintf(ps->ctx, sizeof ps->ctx, "tensor %lld \"%.100s\"", (long long)i, t->name);
        if (t->offset % g->alignment)
            return perr(ps, "data offset %llu is not a multiple of the alignment %zu",
                        (unsigned long long)t->offset, g->alignment);
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return perr(ps,
                        "data offset %llu + size %zu beyond end of file (%zu bytes, data "
                        "section at %llu)",
                        (unsigned long long)t->offset, t->nbytes, g->size,
                        (unsigned long long)g->data_offset);
        if ((g->data_offset + t->offset) % ENGINE_GGUF_DATA_ALIGN)
            return engine_err(ENGINE_EUNSUPPORTED,
                              "%s: %s: data at file offset %llu is not "
                              "%d-byte aligned (general.alignment %zu); the CPU kernels need "
                              "aligned tensor data",
                              g->path, ps->ctx, (unsigned long long)(g->data_offset + t->offset),
                              ENGINE_GGUF_DATA_ALIGN, g->alignment);
        t->data = g->map + g->data_offset + t->offset;
    }
    ps->ctx[0] = 0;
    if (g->n_tensors < 2) return 0;
    uint32_t *order = malloc((size_t)g->n_tensors * sizeof *order);
    if (!order) return engine_err(ENGINE_ENOMEM, "%s: out of memory", g->path);
    for (int64_t i = 0; i < g->n_tensors; i++)
        order[i] = (uint32_t)i;
    qsort_r(order, (size_t)g->n_tensors, sizeof *order, cmp_by_offset, g->tensors);
    int rc = 0;
    for (int64_t k = 1; k < g->n_tensors && !rc; k++) {
        const engine_gguf_tensor *a = &g->tensors[order[k - 1]], *b = &g->tensors[order[k]];
        if (a->offset + a->nbytes > b->offset)
            rc = perr(ps,
                      "tensor %u \"%.100s\" (data %llu..%llu) overlaps tensor %u \"%.100s\" "
                      "(data from %llu)",
                      order[k - 1], a->name, (unsigned long long)a->offset,
                      (unsigned long long)(a->offset + a->nbytes), order[k], b->name,
                      (unsigned long long)b->offset);
    }
    free(order);
    return rc;
}

int engine_gguf_open(engine_gguf **out, const char *path) {
    *out = NULL;
    engine_gguf *g = calloc(1, sizeof *g);
    if (!g) return engine_err(ENGINE_ENOMEM, "%s: out of memory", path);
    int rc = 0, fd = -1;
    g->path = strdup(path);
    if (!g->path) {
        rc = engine_err(ENGINE_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = engine_err(ENGINE_EIO, "%s: cannot open: %s", path, strerror(errno));
        goto done;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = engine_err(ENGINE_EIO, "%s: cannot stat: %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = engine_err(ENGINE_EIO, "%s: not a regular file", path);
        goto done;
    }
    if (st.st_size < 24) {
        rc = engine_err(ENGINE_EFORMAT,
                        "%s: file too small for a GGUF header (%lld bytes, need at least 24)", path,
                        (long long)st.st_size);
        goto done;
    }
    g->size = (size_t)st.st_size;
    void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        rc = engine_err(ENGINE_EIO, "%s: cannot map %zu bytes: %s", path, g->size, strerror(errno));
        goto done;
    }
    g->map = m;
    parser ps = {.g = g, .p = g->map, .size = g->size};
    if ((rc = parse_header_and_kv(&ps))) goto done;
    if ((rc = parse_tensor_infos(&ps))) goto done;
    if ((rc = check_tensor_data(&ps))) goto done;
done:
    if (fd >= 0) close(fd);
    if (rc) {
        engine_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

void engine_gguf_close(engine_gguf *g) {
    if (!g) return;
    if (g->map) munmap((void *)g->map, g->size);
    for (arena_chunk *c = g->arena, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(g->kvs);
    free(g->tensors);
    free(g->kv_hash);
    free(g->tensor_hash);
    free(g->path);
    free(g);
}

/* ---------------------------------------------------------------------------------------------
 * Accessors
 * ------------------------------------------------------------------------------------------- */
const char *engine_gguf_path(const engine_gguf *g) {
    return g->path;
}
uint32_t engine_gguf_version(const engine_gguf *g) {
    return g->version;
}
uint64_t engine_gguf_file_size(const engine_gguf *g) {
    return g->size;
}
size_t engine_gguf_alignment(const engine_gguf *g) {
    return g->alignment;
}
uint64_t engine_gguf_data_offset(const engine_gguf *g) {
    return g->data_offset;
}
const void *engine_gguf_map(const engine_gguf *g) {
    return g->map;
}
int64_t engine_gguf_kv_count(const engine_gguf *g) {
    return g->n_kv;
}
int64_t engine_gguf_tensor_count(const engine_gguf *g) {
    return g->n_tensors;
}

const engine_gguf_kv *engine_gguf_kv_at(const engine_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? &g->kvs[i] : NULL;
}

const engine_gguf_kv *engine_gguf_find_key(const engine_gguf *g, const char *key) {
    const int64_t i = hash_find(g->kv_hash, g->kv_hash_cap, key, kv_name_at, g);
    return i >= 0 ? &g->kvs[i] : NULL;
}

const engine_gguf_tensor *engine_gguf_tensor_at(const engine_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

int64_t engine_gguf_find_tensor_index(const engine_gguf *g, const char *name) {
    return hash_find(g->tensor_hash, g->tensor_hash_cap, name, tensor_name_at, g);
}

const engine_gguf_tensor *engine_gguf_find_tensor(const engine_gguf *g, const char *name) {
    const int64_t i = engine_gguf_find_tensor_index(g, name);
    return i >= 0 ? &g->tensors[i] : NULL;
}

static bool is_unsigned(engine_gguf_type t) {
    return t == ENGINE_GGUF_UINT8 || t == ENGINE_GGUF_UINT16 || t == ENGINE_GGUF_UINT32 ||
           t == ENGINE_GGUF_UINT64;
}

static bool is_signed(engine_gguf_type t) {
    return t == ENGINE_GGUF_INT8 || t == ENGINE_GGUF_INT16 || t == ENGINE_GGUF_INT32 ||
           t == ENGINE_GGUF_INT64;
}

static int lookup(const engine_gguf *g, const char *key, const engine_gguf_kv **kv) {
    *kv = engine_gguf_find_key(g, key);
    if (!*kv) return engine_err(ENGINE_EFORMAT, "%s: missing key %s", g->path, key);
    return 0;
}

static int type_error(const engine_gguf *g, const char *key, const char *expected,
                      engine_gguf_type actual) {
    return engine_err(ENGINE_EFORMAT, "%s: key %s: expected %s, found %s", g->path, key, expected,
                      engine_gguf_type_name(actual));
}

/* An integer key as a value in [lo, hi]. */
static int get_int(const engine_gguf *g, const char *key, const char *expected, int64_t lo,
                   uint64_t hi, uint64_t *u, int64_t *s) {
    const engine_gguf_kv *kv;
    int rc = lookup(g, key, &kv);
    if (rc) return rc;
    const engine_gguf_value *v = &kv->value;
    if (is_unsigned(v->type)) {
        if (v->u64 > hi)
            return engine_err(ENGINE_EFORMAT, "%s: key %s: value %llu out of range for %s", g->path,
                              key, (unsigned long long)v->u64, expected);
        *u = v->u64;
        *s = (int64_t)v->u64; /* hi never exceeds INT64_MAX for signed targets */
        return 0;
    }
    if (is_signed(v->type)) {
        if (v->i64 < lo || (v->i64 >= 0 && (uint64_t)v->i64 > hi))
            return engine_err(ENGINE_EFORMAT, "%s: key %s: value %lld out of range for %s", g->path,
                              key, (long long)v->i64, expected);
        *u = (uint64_t)v->i64;
        *s = v->i64;
        return 0;
    }
    return type_error(g, key, expected, v->type);
}

int engine_gguf_get_u32(const engine_gguf *g, const char *key, uint32_t *out) {
    uint64_t u = 0;
    int64_t s = 0;
    int rc = get_int(g, key, "uint32", 0, UINT32_MAX, &u, &s);
    if (!rc) *out = (uint32_t)u;
    return rc;
}

int engine_gguf_get_i32(const engine_gguf *g, const char *key, int32_t *out) {
    uint64_t u = 0;
    int64_t s = 0;
    int rc = get_int(g, key, "int32", INT32_MIN, INT32_MAX, &u, &s);
    if (!rc) *out = (int32_t)s;
    return rc;
}

int engine_gguf_get_u64(const engine_gguf *g, const char *key, uint64_t *out) {
    uint64_t u = 0;
    int64_t s = 0;
    int rc = get_int(g, key, "uint64", 0, UINT64_MAX, &u, &s);
    if (!rc) *out = u;
    return rc;
}

int engine_gguf_get_f32(const engine_gguf *g, const char *key, float *out) {
    const engine_gguf_kv *kv;
    int rc = lookup(g, key, &kv);
    if (rc) return rc;
    if (kv->value.type != ENGINE_GGUF_FLOAT32 && kv->value.type != ENGINE_GGUF_FLOAT64)
        return type_error(g, key, "float32", kv->value.type);
    *out = (float)kv->value.f64;
    return 0;
}

int engine_gguf_get_bool(const engine_gguf *g, const char *key, bool *out) {
    const engine_gguf_kv *kv;
    int rc = lookup(g, key, &kv);
    if (rc) return rc;
    if (kv->value.type != ENGINE_GGUF_BOOL) return type_error(g, key, "bool", kv->value.type);
    *out = kv->value.b;
    return 0;
}

int engine_gguf_get_str(const engine_gguf *g, const char *key, engine_gguf_str *out) {
    const engine_gguf_kv *kv;
    int rc = lookup(g, key, &kv);
    if (rc) return rc;
    if (kv->value.type != ENGINE_GGUF_STRING) return type_error(g, key, "string", kv->value.type);
    *out = kv->value.str;
    return 0;
}

int engine_gguf_get_arr(const engine_gguf *g, const char *key, int elem_type,
                        const engine_gguf_value **out) {
    const engine_gguf_kv *kv;
    int rc = lookup(g, key, &kv);
    if (rc) return rc;
    if (kv->value.type != ENGINE_GGUF_ARRAY) {
        char want[48];
        snprintf(want, sizeof want, "array of %s",
                 elem_type < 0 ? "anything" : engine_gguf_type_name(elem_type));
        return type_error(g, key, want, kv->value.type);
    }
    if (elem_type >= 0 && (int)kv->value.arr.type != elem_type)
        return engine_err(ENGINE_EFORMAT, "%s: key %s: expected array of %s, found array of %s",
                          g->path, key, engine_gguf_type_name(elem_type),
                          engine_gguf_type_name(kv->value.arr.type));
    *out = &kv->value;
    return 0;
}

/* Element i of a scalar array, decoded (bounds checked by assertion only). */
static engine_gguf_value arr_elem(const engine_gguf_value *v, uint64_t i) {
    ENGINE_ASSERT(v->type == ENGINE_GGUF_ARRAY && i < v->arr.n);
    const size_t sz = engine_gguf_scalar_size(v->arr.type);
    ENGINE_ASSERT(sz > 0);
    const uint8_t *p = (const uint8_t *)v->arr.data + i * sz;
    engine_gguf_value e;
    memset(&e, 0, sizeof e);
    e.type = v->arr.type;
    switch (v->arr.type) {
    case ENGINE_GGUF_UINT8:
        e.u64 = p[0];
        break;
    case ENGINE_GGUF_INT8:
        e.i64 = (int8_t)p[0];
        break;
    case ENGINE_GGUF_BOOL:
        e.u64 = p[0] != 0;
        e.type = ENGINE_GGUF_UINT8;
        break;
    case ENGINE_GGUF_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        e.u64 = x;
        break;
    }
    case ENGINE_GGUF_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        e.i64 = x;
        break;
    }
    case ENGINE_GGUF_UINT32:
        e.u64 = rd_u32(p);
        break;
    case ENGINE_GGUF_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        e.i64 = x;
        break;
    }
    case ENGINE_GGUF_UINT64:
        e.u64 = rd_u64(p);
        break;
    case ENGINE_GGUF_INT64: {
        int64_t x;
        memcpy(&x, p, 8);
        e.i64 = x;
        break;
    }
    case ENGINE_GGUF_FLOAT32: {
        float x;
        memcpy(&x, p, 4);
        e.f64 = x;
        break;
    }
    case ENGINE_GGUF_FLOAT64:
        memcpy(&e.f64, p, 8);
        break;
    default:
        break;
    }
    return e;
}

int64_t engine_gguf_arr_i64(const engine_gguf_value *v, uint64_t i) {
    const engine_gguf_value e = arr_elem(v, i);
    if (is_unsigned(e.type)) return (int64_t)e.u64;
    if (is_signed(e.type)) return e.i64;
    return e.f64 > -9.2e18 && e.f64 < 9.2e18 ? (int64_t)e.f64 : 0; /* NaN, huge: no UB */
}

uint64_t engine_gguf_arr_u64(const engine_gguf_value *v, uint64_t i) {
    const engine_gguf_value e = arr_elem(v, i);
    if (is_unsigned(e.type)) return e.u64;
    if (is_signed(e.type)) return (uint64_t)e.i64;
    return e.f64 >= 0 && e.f64 < 1.8e19 ? (uint64_t)e.f64 : 0; /* NaN, negative, huge: no UB */
}

double engine_gguf_arr_f64(const engine_gguf_value *v, uint64_t i) {
    const engine_gguf_value e = arr_elem(v, i);
    if (is_unsigned(e.type)) return (double)e.u64;
    if (is_signed(e.type)) return (double)e.i64;
    return e.f64;
}
