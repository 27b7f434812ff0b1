/* GGUF v3 writer: metadata and tensor list in memory, then the file is sized, mapped writable
 * and filled in place (by memcpy or by the caller's threads), and renamed into place. */
#include "model/gguf.h"
#include "cpu/quant.h"
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char *key;
    engine_gguf_value value; /* deep-owned */
} wkv;

typedef struct {
    char *name;
    engine_type type;
    int n_dims;
    int64_t ne[ENGINE_GGUF_MAX_DIMS];
    size_t nbytes;
    const void *data; /* borrowed, or NULL */
} wtensor;

struct engine_gguf_writer {
    wkv *kvs;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
    uint32_t *name_hash; /* tensor index + 1; 0 empty */
    size_t name_hash_cap;
};

struct engine_gguf_out {
    char *path, *tmp_path;
    int fd;
    uint8_t *map;
    size_t size;
    int64_t n_tensors;
    uint64_t *offsets; /* absolute file offsets */
    size_t *nbytes;
};

/* ---------------------------------------------------------------------------------------------
 * Values: validation, deep copy, free, encoded size, encoding
 * ------------------------------------------------------------------------------------------- */
static void value_free(engine_gguf_value *v) {
    if (v->type == ENGINE_GGUF_STRING) {
        free((void *)v->str.ptr);
    } else if (v->type == ENGINE_GGUF_ARRAY) {
        if (v->arr.type == ENGINE_GGUF_STRING) {
            for (uint64_t i = 0; i < v->arr.n; i++)
                free((void *)v->arr.strs[i].ptr);
            free((void *)v->arr.strs);
        } else if (v->arr.type == ENGINE_GGUF_ARRAY) {
            engine_gguf_value *vals = (engine_gguf_value *)v->arr.vals;
            for (uint64_t i = 0; i < v->arr.n; i++)
                value_free(&vals[i]);
            free(vals);
        } else {
            free((void *)v->arr.data);
        }
    }
    memset(v, 0, sizeof *v);
}

static int dup_bytes(const char *s, size_t n, engine_gguf_str *out) {
    char *p = malloc(n + 1);
    if (!p) return engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
    if (n) memcpy(p, s, n);
    p[n] = 0;
    out->ptr = p;
    out->len = n;
    return 0;
}

/* Deep copy of src into *dst (dst zeroed on failure). */
static int value_copy(engine_gguf_value *dst, const engine_gguf_value *src, int depth) {
    memset(dst, 0, sizeof *dst);
    if ((unsigned)src->type >= ENGINE_GGUF_TYPE_COUNT)
        return engine_err(ENGINE_EINVAL, "gguf writer: unknown value type %d", (int)src->type);
    if (src->type == ENGINE_GGUF_STRING) {
        if (!src->str.ptr && src->str.len)
            return engine_err(ENGINE_EINVAL, "gguf writer: NULL string");
        dst->type = ENGINE_GGUF_STRING;
        return dup_bytes(src->str.ptr, src->str.len, &dst->str);
    }
    if (src->type != ENGINE_GGUF_ARRAY) {
        *dst = *src;
        if (src->type == ENGINE_GGUF_BOOL) dst->b = src->b ? true : false;
        return 0;
    }
    if (depth >= ENGINE_GGUF_MAX_DEPTH)
        return engine_err(ENGINE_EINVAL, "gguf writer: arrays nested deeper than %d levels",
                          ENGINE_GGUF_MAX_DEPTH);
    const engine_gguf_type et = src->arr.type;
    const uint64_t n = src->arr.n;
    if ((unsigned)et >= ENGINE_GGUF_TYPE_COUNT)
        return engine_err(ENGINE_EINVAL, "gguf writer: unknown array element type %d", (int)et);
    if (n > (SIZE_MAX / 2) / sizeof(engine_gguf_value))
        return engine_err(ENGINE_EINVAL, "gguf writer: array of %llu elements is too long",
                          (unsigned long long)n);
    dst->type = ENGINE_GGUF_ARRAY;
    dst->arr.type = et;
    if (et == ENGINE_GGUF_STRING) {
        if (n && !src->arr.strs) return engine_err(ENGINE_EINVAL, "gguf writer: NULL strings");
        engine_gguf_str *strs = calloc(n ? n : 1, sizeof *strs);
        if (!strs) return engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
        dst->arr.strs = strs;
        for (uint64_t i = 0; i < n; i++) {
            int rc = dup_bytes(src->arr.strs[i].ptr, src->arr.strs[i].len, &strs[i]);
            if (rc) {
                dst->arr.n = i;
                value_free(dst);
                return rc;
            }
        }
    } else if (et == ENGINE_GGUF_ARRAY) {
        if (n && !src->arr.vals) return engine_err(ENGINE_EINVAL, "gguf writer: NULL arrays");
        engine_gguf_value *vals = calloc(n ? n : 1, sizeof *vals);
        if (!vals) return engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
        dst->arr.vals = vals;
        for (uint64_t i = 0; i < n; i++) {
            if (src->arr.vals[i].type != ENGINE_GGUF_ARRAY) {
                dst->arr.n = i;
                value_free(dst);
                return engine_err(ENGINE_EINVAL,
                                  "gguf writer: element %llu of an array of "
                                  "arrays is a %s",
                                  (unsigned long long)i,
                                  engine_gguf_type_name(src->arr.vals[i].type));
            }
            int rc = value_copy(&vals[i], &src->arr.vals[i], depth + 1);
            if (rc) {
                dst->arr.n = i;
                value_free(dst);
                return rc;
            }
        }
    } else {
        const size_t sz = engine_gguf_scalar_size(et);
        if (n && !src->arr.data) return engine_err(ENGINE_EINVAL, "gguf writer: NULL array data");
        void *data = malloc(n ? (size_t)n * sz : 1);
        if (!data) return engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
        if (n) memcpy(data, src->arr.data, (size_t)n * sz);
        if (et == ENGINE_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                ((uint8_t *)data)[i] = ((uint8_t *)data)[i] != 0;
        dst->arr.data = data;
    }
    dst->arr.n = n;
    return 0;
}

/* Bytes of the encoding of v without its own type tag (an array's elem type + count + data). */
static uint64_t value_size(const engine_gguf_value *v) {
    if (v->type == ENGINE_GGUF_STRING) return 8 + v->str.len;
    if (v->type != ENGINE_GGUF_ARRAY) return engine_gguf_scalar_size(v->type);
    uint64_t s = 4 + 8;
    if (v->arr.type == ENGINE_GGUF_STRING) {
        for (uint64_t i = 0; i < v->arr.n; i++)
            s += 8 + v->arr.strs[i].len;
    } else if (v->arr.type == ENGINE_GGUF_ARRAY) {
        for (uint64_t i = 0; i < v->arr.n; i++)
            s += value_size(&v->arr.vals[i]);
    } else {
        s += v->arr.n * engine_gguf_scalar_size(v->arr.type);
    }
    return s;
}

static uint8_t *put(uint8_t *p, const void *src, size_t n) {
    if (n) memcpy(p, src, n);
    return p + n;
}

static uint8_t *put_u32(uint8_t *p, uint32_t v) {
    return put(p, &v, 4);
}
static uint8_t *put_u64(uint8_t *p, uint64_t v) {
    return put(p, &v, 8);
}

static uint8_t *put_str(uint8_t *p, const char *s, size_t n) {
    return put(put_u64(p, n), s, n);
}

static uint8_t *put_value(uint8_t *p, const engine_gguf_value *v) {
    switch (v->type) {
    case ENGINE_GGUF_UINT8: {
        uint8_t x = (uint8_t)v->u64;
        return put(p, &x, 1);
    }
    case ENGINE_GGUF_INT8: {
        int8_t x = (int8_t)v->i64;
        return put(p, &x, 1);
    }
    case ENGINE_GGUF_UINT16: {
        uint16_t x = (uint16_t)v->u64;
        return put(p, &x, 2);
    }
    case ENGINE_GGUF_INT16: {
        int16_t x = (int16_t)v->i64;
        return put(p, &x, 2);
    }
    case ENGINE_GGUF_UINT32:
        return put_u32(p, (uint32_t)v->u64);
    case ENGINE_GGUF_INT32: {
        int32_t x = (int32_t)v->i64;
        return put(p, &x, 4);
    }
    case ENGINE_GGUF_UINT64:
        return put_u64(p, v->u64);
    case ENGINE_GGUF_INT64:
        return put(p, &v->i64, 8);
    case ENGINE_GGUF_FLOAT32: {
        float x = (float)v->f64;
        return put(p, &x, 4);
    }
    case ENGINE_GGUF_FLOAT64:
        return put(p, &v->f64, 8);
    case ENGINE_GGUF_BOOL: {
        uint8_t x = v->b ? 1 : 0;
        return put(p, &x, 1);
    }
    case ENGINE_GGUF_STRING:
        return put_str(p, v->str.ptr, v->str.len);
    case ENGINE_GGUF_ARRAY:
        p = put_u64(put_u32(p, (uint32_t)v->arr.type), v->arr.n);
        if (v->arr.type == ENGINE_GGUF_STRING) {
            for (uint64_t i = 0; i < v->arr.n; i++)
                p = put_str(p, v->arr.strs[i].ptr, v->arr.strs[i].len);
        } else if (v->arr.type == ENGINE_GGUF_ARRAY) {
            for (uint64_t i = 0; i < v->arr.n; i++)
                p = put_value(p, &v->arr.vals[i]);
        } else {
            p = put(p, v->arr.data, (size_t)v->arr.n * engine_gguf_scalar_size(v->arr.type));
        }
        return p;
    default:
        return p;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Building
 * ------------------------------------------------------------------------------------------- */
int engine_gguf_writer_new(engine_gguf_writer **out) {
    *out = calloc(1, sizeof **out);
    return *out ? 0 : engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
}

void engine_gguf_writer_free(engine_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        value_free(&w->kvs[i].value);
    }
    for (size_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->kvs);
    free(w->tensors);
    free(w->name_hash);
    free(w);
}

static int check_name(const char *what, const char *name) {
    if (!name || !name[0]) return engine_err(ENGINE_EINVAL, "gguf writer: empty %s", what);
    if (strlen(name) > ENGINE_GGUF_MAX_NAME)
        return engine_err(ENGINE_EINVAL, "gguf writer: %s longer than %d bytes", what,
                          ENGINE_GGUF_MAX_NAME);
    return 0;
}

int engine_gguf_writer_set_value(engine_gguf_writer *w, const char *key,
                                 const engine_gguf_value *v) {
    int rc = check_name("key", key);
    if (rc) return rc;
    engine_gguf_value copy;
    if ((rc = value_copy(&copy, v, 0))) return rc;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (!strcmp(w->kvs[i].key, key)) {
            value_free(&w->kvs[i].value);
            w->kvs[i].value = copy;
            return 0;
        }
    }
    if (w->n_kv >= ENGINE_GGUF_MAX_KV) {
        value_free(&copy);
        return engine_err(ENGINE_ERANGE, "gguf writer: more than %u keys", ENGINE_GGUF_MAX_KV);
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv *kvs = realloc(w->kvs, cap * sizeof *kvs);
        if (!kvs) {
            value_free(&copy);
            return engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
        }
        w->kvs = kvs;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) {
        value_free(&copy);
        return engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
    }
    w->kvs[w->n_kv].key = k;
    w->kvs[w->n_kv].value = copy;
    w->n_kv++;
    return 0;
}

#define SETTER(fn, ctype, gtype, field, conv)                                                      \
    int engine_gguf_writer_set_##fn(engine_gguf_writer *w, const char *key, ctype v) {             \
        engine_gguf_value val;                                                                     \
        memset(&val, 0, sizeof val);                                                               \
        val.type = gtype;                                                                          \
        val.field = conv;                                                                          \
        return engine_gguf_writer_set_value(w, key, &val);                                         \
    }
SETTER(u8, uint8_t, ENGINE_GGUF_UINT8, u64, v)
SETTER(i8, int8_t, ENGINE_GGUF_INT8, i64, v)
SETTER(u16, uint16_t, ENGINE_GGUF_UINT16, u64, v)
SETTER(i16, int16_t, ENGINE_GGUF_INT16, i64, v)
SETTER(u32, uint32_t, ENGINE_GGUF_UINT32, u64, v)
SETTER(i32, int32_t, ENGINE_GGUF_INT32, i64, v)
SETTER(u64, uint64_t, ENGINE_GGUF_UINT64, u64, v)
SETTER(i64, int64_t, ENGINE_GGUF_INT64, i64, v)
SETTER(f32, float, ENGINE_GGUF_FLOAT32, f64, (double)v)
SETTER(f64, double, ENGINE_GGUF_FLOAT64, f64, v)
SETTER(bool, bool, ENGINE_GGUF_BOOL, b, v)
#undef SETTER

int engine_gguf_writer_set_strn(engine_gguf_writer *w, const char *key, const char *s, size_t n) {
    if (!s && n) return engine_err(ENGINE_EINVAL, "gguf writer: key %s: NULL string", key);
    engine_gguf_value val;
    memset(&val, 0, sizeof val);
    val.type = ENGINE_GGUF_STRING;
    val.str.ptr = s ? s : "";
    val.str.len = n;
    return engine_gguf_writer_set_value(w, key, &val);
}

int engine_gguf_writer_set_str(engine_gguf_writer *w, const char *key, const char *s) {
    if (!s) return engine_err(ENGINE_EINVAL, "gguf writer: key %s: NULL string", key);
    return engine_gguf_writer_set_strn(w, key, s, strlen(s));
}

int engine_gguf_writer_set_arr(engine_gguf_writer *w, const char *key, engine_gguf_type elem_type,
                               const void *data, uint64_t n) {
    if (!engine_gguf_scalar_size(elem_type))
        return engine_err(ENGINE_EINVAL,
                          "gguf writer: key %s: set_arr takes scalar elements, "
                          "not %s",
                          key, engine_gguf_type_name(elem_type));
    engine_gguf_value val;
    memset(&val, 0, sizeof val);
    val.type = ENGINE_GGUF_ARRAY;
    val.arr.type = elem_type;
    val.arr.n = n;
    val.arr.data = data;
    return engine_gguf_writer_set_value(w, key, &val);
}

int engine_gguf_writer_set_arr_str(engine_gguf_writer *w, const char *key, const char *const *strs,
                                   const size_t *lens, uint64_t n) {
    if (n && !strs) return engine_err(ENGINE_EINVAL, "gguf writer: key %s: NULL strings", key);
    if (n > SIZE_MAX / sizeof(engine_gguf_str))
        return engine_err(ENGINE_EINVAL, "gguf writer: key %s: too many strings", key);
    engine_gguf_str *views = malloc(n ? (size_t)n * sizeof *views : 1);
    if (!views) return engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
    for (uint64_t i = 0; i < n; i++) {
        views[i].ptr = strs[i] ? strs[i] : "";
        views[i].len = lens ? lens[i] : strs[i] ? strlen(strs[i]) : 0;
    }
    engine_gguf_value val;
    memset(&val, 0, sizeof val);
    val.type = ENGINE_GGUF_ARRAY;
    val.arr.type = ENGINE_GGUF_STRING;
    val.arr.n = n;
    val.arr.strs = views;
    int rc = engine_gguf_writer_set_value(w, key, &val);
    free(views);
    return rc;
}

/* Returns true if `name` is already a tensor; otherwise records index `idx` for it. */
static int name_seen_or_insert(engine_gguf_writer *w, const char *name, size_t idx, bool *seen) {
    *seen = false;
    if ((idx + 1) * 2 > w->name_hash_cap) { /* grow and rehash */
        size_t cap = w->name_hash_cap ? w->name_hash_cap * 2 : 64;
        uint32_t *t = calloc(cap, sizeof *t);
        if (!t) return engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
        for (size_t i = 0; i < w->n_tensors; i++) {
            size_t h = (size_t)engine_gguf_hash(w->tensors[i].name) & (cap - 1);
            while (t[h])
                h = (h + 1) & (cap - 1);
            t[h] = (uint32_t)i + 1;
        }
        free(w->name_hash);
        w->name_hash = t;
        w->name_hash_cap = cap;
    }
    size_t h = (size_t)engine_gguf_hash(name) & (w->name_hash_cap - 1);
    while (w->name_hash[h]) {
        if (!strcmp(w->tensors[w->name_hash[h] - 1].name, name)) {
            *seen = true;
            return 0;
        }
        h = (h + 1) & (w->name_hash_cap - 1);
    }
    w->name_hash[h] = (uint32_t)idx + 1;
    return 0;
}

int64_t engine_gguf_writer_add_tensor(engine_gguf_writer *w, const char *name, engine_type type,
                                      int n_dims, const int64_t *ne, const void *data) {
    int rc = check_name("tensor name", name);
    if (rc) return rc;
    const engine_type_traits *tr = engine_type_traits_get((int)type);
    if (!tr)
        return engine_err(ENGINE_EINVAL, "gguf writer: tensor %s: unknown type %d", name,
                          (int)type);
    if (n_dims < 1 || n_dims > ENGINE_GGUF_MAX_DIMS)
        return engine_err(ENGINE_EINVAL, "gguf writer: tensor %s: n_dims %d not in 1..4", name,
                          n_dims);
    if (w->n_tensors >= ENGINE_GGUF_MAX_TENSORS)
        return engine_err(ENGINE_ERANGE, "gguf writer: more than %u tensors",
                          ENGINE_GGUF_MAX_TENSORS);
    wtensor t = {.type = type, .n_dims = n_dims, .data = data};
    uint64_t nel = 1;
    for (int d = 0; d < ENGINE_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 1 || __builtin_mul_overflow(nel, (uint64_t)t.ne[d], &nel) ||
            nel > ((uint64_t)1 << 62))
            return engine_err(ENGINE_EINVAL, "gguf writer: tensor %s: bad shape (ne[%d] = %lld)",
                              name, d, (long long)t.ne[d]);
    }
    if (t.ne[0] % tr->block_size)
        return engine_err(ENGINE_EINVAL,
                          "gguf writer: tensor %s: ne[0] = %lld is not a multiple "
                          "of the %s block size %lld",
                          name, (long long)t.ne[0], tr->name, (long long)tr->block_size);
    t.nbytes = (size_t)(nel / (uint64_t)tr->block_size) * tr->type_size;
    bool seen;
    if ((rc = name_seen_or_insert(w, name, w->n_tensors, &seen))) return rc;
    if (seen) return engine_err(ENGINE_EINVAL, "gguf writer: duplicate tensor name %s", name);
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
        wtensor *ts = realloc(w->tensors, cap * sizeof *ts);
        if (!ts) return engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
        w->tensors = ts;
        w->cap_tensors = cap;
    }
    if (!(t.name = strdup(name))) return engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
    w->tensors[w->n_tensors] = t;
    return (int64_t)w->n_tensors++;
}

int64_t engine_gguf_writer_tensor_count(const engine_gguf_writer *w) {
    return (int64_t)w->n_tensors;
}

size_t engine_gguf_writer_tensor_nbytes(const engine_gguf_writer *w, int64_t i) {
    return i >= 0 && (size_t)i < w->n_tensors ? w->tensors[i].nbytes : 0;
}

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------- */
static int writer_alignment(const engine_gguf_writer *w, size_t *out) {
    *out = ENGINE_GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, "general.alignment")) continue;
        const engine_gguf_value *v = &w->kvs[i].value;
        if (v->type != ENGINE_GGUF_UINT32)
            return engine_err(ENGINE_EINVAL, "gguf writer: general.alignment must be a uint32");
        if (v->u64 < ENGINE_GGUF_DATA_ALIGN || (v->u64 & (v->u64 - 1)) || v->u64 > (1u << 20))
            return engine_err(ENGINE_EINVAL,
                              "gguf writer: general.alignment %llu is not a power "
                              "of two in [%d, 1048576]",
                              (unsigned long long)v->u64, ENGINE_GGUF_DATA_ALIGN);
        *out = (size_t)v->u64;
    }
    return 0;
}

static uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

void engine_gguf_out_abort(engine_gguf_out *o) {
    if (!o) return;
    if (o->map) munmap(o->map, o->size);
    if (o->fd >= 0) close(o->fd);
    if (o->tmp_path) unlink(o->tmp_path);
    free(o->path);
    free(o->tmp_path);
    free(o->offsets);
    free(o->nbytes);
    free(o);
}

int engine_gguf_writer_begin(engine_gguf_writer *w, const char *path, engine_gguf_out **out) {
    *out = NULL;
    size_t alignment;
    int rc = writer_alignment(w, &alignment);
    if (rc) return rc;
    /* Layout. */
    uint64_t header = 4 + 4 + 8 + 8;
    for (size_t i = 0; i < w->n_kv; i++)
        header += 8 + strlen(w->kvs[i].key) + 4 + value_size(&w->kvs[i].value);
    for (size_t i = 0; i < w->n_tensors; i++)
        header += 8 + strlen(w->tensors[i].name) + 4 + 8 * (uint64_t)w->tensors[i].n_dims + 4 + 8;
    const uint64_t data_start = align_up(header, alignment);

    engine_gguf_out *o = calloc(1, sizeof *o);
    if (!o) return engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
    o->fd = -1;
    o->n_tensors = (int64_t)w->n_tensors;
    o->offsets = calloc(w->n_tensors ? w->n_tensors : 1, sizeof *o->offsets);
    o->nbytes = calloc(w->n_tensors ? w->n_tensors : 1, sizeof *o->nbytes);
    o->path = strdup(path);
    o->tmp_path = malloc(strlen(path) + 5);
    if (!o->offsets || !o->nbytes || !o->path || !o->tmp_path) {
        free(o->tmp_path);
        o->tmp_path = NULL; /* nothing created yet: nothing to unlink */
        engine_gguf_out_abort(o);
        return engine_err(ENGINE_ENOMEM, "gguf writer: out of memory");
    }
    strcpy(stpcpy(o->tmp_path, path), ".tmp");
    uint64_t rel = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        o->offsets[i] = data_start + rel;
        o->nbytes[i] = w->tensors[i].nbytes;
        rel += align_up(w->tensors[i].nbytes, alignment);
    }
    const uint64_t total = data_start + rel;
    if (total > (uint64_t)SIZE_MAX / 2) {
        free(o->tmp_path);
        o->tmp_path = NULL;
        engine_gguf_out_abort(o);
        return engine_err(ENGINE_ERANGE, "%s: file of %llu bytes is too large", path,
                          (unsigned long long)total);
    }
    o->size = (size_t)total;

    o->fd = open(o->tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o->fd < 0) {
        rc = engine_err(ENGINE_EIO, "%s: cannot create: %s", o->tmp_path, strerror(errno));
        free(o->tmp_path);
        o->tmp_path = NULL;
        engine_gguf_out_abort(o);
        return rc;
    }
    if (ftruncate(o->fd, (off_t)o->size) != 0) {
        rc = engine_err(ENGINE_EIO, "%s: cannot size to %zu bytes: %s", o->tmp_path, o->size,
                        strerror(errno));
        engine_gguf_out_abort(o);
        return rc;
    }
    /* Reserve the blocks now, so a full disk is an error here and not a SIGBUS while threads
     * write into the mapping. File systems without fallocate keep the sparse file. */
    if (o->size && fallocate(o->fd, 0, 0, (off_t)o->size) != 0 && errno != EOPNOTSUPP &&
        errno != ENOSYS) {
        rc = engine_err(ENGINE_EIO, "%s: cannot reserve %zu bytes: %s", o->tmp_path, o->size,
                        strerror(errno));
        engine_gguf_out_abort(o);
        return rc;
    }
    void *m = mmap(NULL, o->size, PROT_READ | PROT_WRITE, MAP_SHARED, o->fd, 0);
    if (m == MAP_FAILED) {
        rc = engine_err(ENGINE_EIO, "%s: cannot map %zu bytes: %s", o->tmp_path, o->size,
                        strerror(errno));
        engine_gguf_out_abort(o);
        return rc;
    }
    o->map = m;

    /* Header, metadata, tensor infos. */
    uint8_t *p = o->map;
    p = put_u32(p, ENGINE_GGUF_MAGIC);
    p = put_u32(p, ENGINE_GGUF_VERSION);
    p = put_u64(p, w->n_tensors);
    p = put_u64(p, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        p = put_str(p, w->kvs[i].key, strlen(w->kvs[i].key));
        p = put_u32(p, (uint32_t)w->kvs[i].value.type);
        p = put_value(p, &w->kvs[i].value);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        p = put_str(p, t->name, strlen(t->name));
        p = put_u32(p, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++)
            p = put_u64(p, (uint64_t)t->ne[d]);
        p = put_u32(p, (uint32_t)t->type);
        p = put_u64(p, o->offsets[i] - data_start);
    }
    ENGINE_ASSERT((uint64_t)(p - o->map) == header);
    /* Padding and unfilled bytes are zero: the file was created empty and extended. */
    for (size_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].data)
            memcpy(o->map + o->offsets[i], w->tensors[i].data, w->tensors[i].nbytes);
    *out = o;
    return 0;
}

void *engine_gguf_out_tensor_data(engine_gguf_out *o, int64_t i) {
    return i >= 0 && i < o->n_tensors ? o->map + o->offsets[i] : NULL;
}

size_t engine_gguf_out_tensor_nbytes(const engine_gguf_out *o, int64_t i) {
    return i >= 0 && i < o->n_tensors ? o->nbytes[i] : 0;
}

int64_t engine_gguf_out_tensor_count(const engine_gguf_out *o) {
    return o->n_tensors;
}

int engine_gguf_out_commit(engine_gguf_out *o) {
    int rc = 0;
    if (o->map && munmap(o->map, o->size) != 0)
        rc = engine_err(ENGINE_EIO, "%s: munmap: %s", o->tmp_path, strerror(errno));
    o->map = NULL;
    if (!rc && close(o->fd) != 0)
        rc = engine_err(ENGINE_EIO, "%s: close: %s", o->tmp_path, strerror(errno));
    o->fd = -1;
    if (!rc && rename(o->tmp_path, o->path) != 0)
        rc = engine_err(ENGINE_EIO, "cannot rename %s to %s: %s", o->tmp_path, o->path,
                        strerror(errno));
    if (!rc) {
        free(o->tmp_path);
        o->tmp_path = NULL; /* renamed: nothing left to unlink */
    }
    engine_gguf_out_abort(o);
    return rc;
}

/* Threads of engine_gguf_writer_write: each takes the next unfilled tensor. */
typedef struct {
    const engine_gguf_writer *w;
    engine_gguf_out *o;
    engine_gguf_fill_fn fill;
    void *user;
    atomic_size_t next;
    atomic_int rc;
    pthread_mutex_t lock;
    char msg[1024];
} fill_job;

static void *fill_worker(void *arg) {
    fill_job *j = arg;
    for (;;) {
        if (atomic_load(&j->rc)) break;
        const size_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->w->n_tensors) break;
        if (j->w->tensors[i].data) continue;
        const int rc = j->fill((int64_t)i, j->o->map + j->o->offsets[i], j->o->nbytes[i], j->user);
        if (rc) {
            int expected = 0;
            pthread_mutex_lock(&j->lock);
            if (atomic_compare_exchange_strong(&j->rc, &expected, rc < 0 ? rc : ENGINE_EINTERNAL))
                snprintf(j->msg, sizeof j->msg, "%s", engine_error_last());
            pthread_mutex_unlock(&j->lock);
            break;
        }
    }
    return NULL;
}

int engine_gguf_writer_write(engine_gguf_writer *w, const char *path, engine_gguf_fill_fn fill,
                             void *user, int n_threads) {
    for (size_t i = 0; i < w->n_tensors; i++)
        if (!w->tensors[i].data && !fill)
            return engine_err(ENGINE_EINVAL,
                              "gguf writer: tensor %s has no data and no fill "
                              "callback was given",
                              w->tensors[i].name);
    engine_gguf_out *o;
    int rc = engine_gguf_writer_begin(w, path, &o);
    if (rc) return rc;
    fill_job job = {.w = w, .o = o, .fill = fill, .user = user};
    atomic_init(&job.next, 0);
    atomic_init(&job.rc, 0);
    pthread_mutex_init(&job.lock, NULL);
    if (n_threads < 1) n_threads = 1;
    if ((size_t)n_threads > w->n_tensors) n_threads = w->n_tensors ? (int)w->n_tensors : 1;
    pthread_t tids[256];
    if (n_threads > 256) n_threads = 256;
    int started = 0;
    if (fill) {
        for (; started < n_threads - 1; started++)
            if (pthread_create(&tids[started], NULL, fill_worker, &job) != 0) break;
        fill_worker(&job); /* the calling thread works too */
        for (int t = 0; t < started; t++)
            pthread_join(tids[t], NULL);
    }
    pthread_mutex_destroy(&job.lock);
    rc = atomic_load(&job.rc);
    if (rc) {
        engine_gguf_out_abort(o);
        return engine_err(rc, "%s", job.msg);
    }
    return engine_gguf_out_commit(o);
}
