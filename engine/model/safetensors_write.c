/* Hugging Face safetensors writer: see safetensors_write.h. */
#include "model/safetensors_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define ST_MAX_DIMS 8

typedef struct {
    char *name;
    engine_st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    uint64_t offset, nbytes;
} st_tensor;

struct engine_st_writer {
    st_tensor *t;
    int64_t n, cap;
    char **meta; /* key, value, key, value, ... */
    size_t n_meta;
    uint64_t data_size;
};

struct engine_st_out {
    char *path, *tmp;
    int fd;
    uint8_t *map;
    size_t map_size;
    size_t data_start;
};

static const char *const dtype_names[] = {"F32", "F16", "BF16"};
static const size_t dtype_sizes[] = {4, 2, 2};

int engine_st_writer_new(engine_st_writer **out) {
    *out = calloc(1, sizeof **out);
    return *out ? 0 : engine_err(ENGINE_ENOMEM, "out of memory");
}

void engine_st_writer_free(engine_st_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n; i++) free(w->t[i].name);
    for (size_t i = 0; i < 2 * w->n_meta; i++) free(w->meta[i]);
    free(w->meta);
    free(w->t);
    free(w);
}

int engine_st_writer_set_meta(engine_st_writer *w, const char *key, const char *value) {
    char **m = realloc(w->meta, (2 * w->n_meta + 2) * sizeof *m);
    if (!m) return engine_err(ENGINE_ENOMEM, "out of memory");
    w->meta = m;
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return engine_err(ENGINE_ENOMEM, "out of memory");
    }
    m[2 * w->n_meta] = k;
    m[2 * w->n_meta + 1] = v;
    w->n_meta++;
    return 0;
}

int64_t engine_st_writer_add(engine_st_writer *w, const char *name, engine_st_dtype dtype,
                             int n_dims, const int64_t *shape) {
    if ((int)dtype < 0 || dtype > ENGINE_ST_BF16)
        return engine_err(ENGINE_EINVAL, "safetensors: bad dtype %d", (int)dtype);
    if (n_dims < 1 || n_dims > ST_MAX_DIMS)
        return engine_err(ENGINE_EINVAL, "safetensors: tensor %s: %d dimensions", name, n_dims);
    if (!name[0] || !strcmp(name, "__metadata__"))
        return engine_err(ENGINE_EINVAL, "safetensors: bad tensor name \"%s\"", name);
    uint64_t n = dtype_sizes[dtype];
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] < 1 || (uint64_t)shape[i] > (UINT64_MAX >> 2) / n)
            return engine_err(ENGINE_EINVAL, "safetensors: tensor %s: bad shape", name);
        n *= (uint64_t)shape[i];
    }
    for (int64_t i = 0; i < w->n; i++)
        if (!strcmp(w->t[i].name, name))
            return engine_err(ENGINE_EINVAL, "safetensors: duplicate tensor %s", name);
    if (w->n == w->cap) {
        int64_t cap = w->cap ? 2 * w->cap : 64;
        st_tensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return engine_err(ENGINE_ENOMEM, "out of memory");
        w->t = t;
        w->cap = cap;
    }
    st_tensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return engine_err(ENGINE_ENOMEM, "out of memory");
    t->dtype = dtype;
    t->n_dims = n_dims;
    memcpy(t->shape, shape, (size_t)n_dims * sizeof *shape);
    t->offset = w->data_size;
    t->nbytes = n;
    w->data_size += n;
    return w->n++;
}

uint64_t engine_st_writer_offset(const engine_st_writer *w, int64_t i) {
    return i >= 0 && i < w->n ? w->t[i].offset : 0;
}

uint64_t engine_st_writer_nbytes(const engine_st_writer *w, int64_t i) {
    return i >= 0 && i < w->n ? w->t[i].nbytes : 0;
}

/* A growable string for the JSON header. */
typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        b->oom = true;
        return;
    }
    sb_put(b, tmp, (size_t)n);
}

/* A JSON string literal (quotes, backslash and control characters escaped). */
static void sb_json_str(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            sb_put(b, e, 2);
        } else if (*p < 0x20) {
            sb_printf(b, "\\u%04x", *p);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

int engine_st_writer_begin(engine_st_writer *w, const char *path, engine_st_out **out) {
    *out = NULL;
    sbuf h = {0};
    sb_put(&h, "{", 1);
    if (w->n_meta) {
        sb_put(&h, "\"__metadata__\":{", 16);
        for (size_t i = 0; i < w->n_meta; i++) {
            if (i) sb_put(&h, ",", 1);
            sb_json_str(&h, w->meta[2 * i]);
            sb_put(&h, ":", 1);
            sb_json_str(&h, w->meta[2 * i + 1]);
        }
        sb_put(&h, "}", 1);
    }
    for (int64_t i = 0; i < w->n; i++) {
        const st_tensor *t = &w->t[i];
        if (i || w->n_meta) sb_put(&h, ",", 1);
        sb_json_str(&h, t->name);
        sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", dtype_names[t->dtype]);
        for (int d = 0; d < t->n_dims; d++) sb_printf(&h, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->offset,
                  (unsigned long long)(t->offset + t->nbytes));
    }
    sb_put(&h, "}", 1);
    while (!h.oom && h.n % 8) sb_put(&h, " ", 1);
    if (h.oom) {
        free(h.p);
        return engine_err(ENGINE_ENOMEM, "safetensors: out of memory for the header");
    }

    engine_st_out *o = calloc(1, sizeof *o);
    size_t plen = strlen(path);
    if (o) o->path = strdup(path);
    if (o) o->tmp = malloc(plen + 5);
    if (!o || !o->path || !o->tmp) {
        if (o) free(o->path);
        free(o);
        free(h.p);
        return engine_err(ENGINE_ENOMEM, "out of memory");
    }
    memcpy(o->tmp, path, plen);
    memcpy(o->tmp + plen, ".tmp", 5);
    o->fd = -1;
    o->data_start = 8 + h.n;
    o->map_size = o->data_start + (size_t)w->data_size;

    int rc = 0;
    o->fd = open(o->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o->fd < 0) {
        rc = engine_err(ENGINE_EIO, "%s: cannot create: %s", o->tmp, strerror(errno));
        goto fail;
    }
    if (ftruncate(o->fd, (off_t)o->map_size) != 0) {
        rc = engine_err(ENGINE_EIO, "%s: cannot size to %zu bytes: %s", o->tmp, o->map_size,
                        strerror(errno));
        goto fail;
    }
    /* Reserve the blocks now: a full disk must be an error here, not a SIGBUS when a thread
     * later writes into a hole of the mapping. Without fallocate the file stays sparse. */
    if (fallocate(o->fd, 0, 0, (off_t)o->map_size) != 0 && errno != EOPNOTSUPP &&
        errno != ENOSYS) {
        rc = engine_err(ENGINE_EIO, "%s: cannot reserve %zu bytes: %s", o->tmp, o->map_size,
                        strerror(errno));
        goto fail;
    }
    o->map = mmap(NULL, o->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, o->fd, 0);
    if (o->map == MAP_FAILED) {
        o->map = NULL;
        rc = engine_err(ENGINE_EIO, "%s: cannot map %zu bytes: %s", o->tmp, o->map_size,
                        strerror(errno));
        goto fail;
    }
    uint64_t hl = h.n;
    for (int i = 0; i < 8; i++) o->map[i] = (uint8_t)(hl >> (8 * i));
    memcpy(o->map + 8, h.p, h.n);
    free(h.p);
    *out = o;
    return 0;
fail:
    free(h.p);
    engine_st_out_abort(o);
    return rc;
}

void *engine_st_out_data(engine_st_out *o) {
    return o->map + o->data_start;
}

static void out_free(engine_st_out *o) {
    free(o->path);
    free(o->tmp);
    free(o);
}

int engine_st_out_commit(engine_st_out *o) {
    int rc = 0;
    if (munmap(o->map, o->map_size) != 0)
        rc = engine_err(ENGINE_EIO, "%s: munmap: %s", o->tmp, strerror(errno));
    o->map = NULL;
    if (!rc && close(o->fd) != 0)
        rc = engine_err(ENGINE_EIO, "%s: close: %s", o->tmp, strerror(errno));
    o->fd = -1;
    if (!rc && rename(o->tmp, o->path) != 0)
        rc = engine_err(ENGINE_EIO, "%s: cannot rename to %s: %s", o->tmp, o->path,
                        strerror(errno));
    if (rc) {
        engine_st_out_abort(o);
        return rc;
    }
    out_free(o);
    return 0;
}

void engine_st_out_abort(engine_st_out *o) {
    if (!o) return;
    if (o->map) munmap(o->map, o->map_size);
    if (o->fd >= 0) close(o->fd);
    unlink(o->tmp);
    out_free(o);
}
