/* Reading safetensors checkpoints: contracts in safetensors.h. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "tokenizer/json.h"

#define ST_MAX_HEADER (256u << 20) /* 256 MiB of JSON is far beyond any real header */
#define ST_MAX_FILES 512

typedef struct {
    void *map;
    size_t size;
} st_file;

struct engine_st {
    st_file files[ST_MAX_FILES];
    int n_files;
    engine_json docs[ST_MAX_FILES]; /* the headers: tensor names point into their strings */
    int n_docs;
    engine_st_tensor *t;
    int64_t n, cap;
    uint64_t bytes;
};

int engine_st_new(engine_st **out) {
    *out = calloc(1, sizeof **out);
    return *out ? 0 : engine_err(ENGINE_ENOMEM, "out of memory for a safetensors checkpoint");
}

void engine_st_close(engine_st *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++)
        munmap(st->files[i].map, st->files[i].size);
    for (int i = 0; i < st->n_docs; i++)
        engine_json_deinit(&st->docs[i]);
    free(st->t);
    free(st);
}

int64_t engine_st_count(const engine_st *st) {
    return st->n;
}

const engine_st_tensor *engine_st_at(const engine_st *st, int64_t i) {
    return i >= 0 && i < st->n ? &st->t[i] : NULL;
}

const engine_st_tensor *engine_st_find(const engine_st *st, const char *name) {
    for (int64_t i = 0; i < st->n; i++)
        if (!strcmp(st->t[i].name, name)) return &st->t[i];
    return NULL;
}

uint64_t engine_st_bytes(const engine_st *st) {
    return st->bytes;
}

static int st_dtype(const char *s, size_t *elt) {
    static const struct {
        const char *name;
        int type;
        size_t elt;
    } dt[] = {
        {"F32", ENGINE_TYPE_F32, 4},
        {"F16", ENGINE_TYPE_F16, 2},
        {"BF16", ENGINE_TYPE_BF16, 2},
        {"F64", -1, 8},
        {"I64", -1, 8},
        {"U64", -1, 8},
        {"I32", -1, 4},
        {"U32", -1, 4},
        {"I16", -1, 2},
        {"U16", -1, 2},
        {"I8", -1, 1},
        {"U8", -1, 1},
        {"BOOL", -1, 1},
        {"F8_E4M3", -1, 1},
        {"F8_E5M2", -1, 1},
    };
    for (size_t i = 0; i < sizeof dt / sizeof dt[0]; i++)
        if (!strcmp(s, dt[i].name)) {
            *elt = dt[i].elt;
            return dt[i].type;
        }
    *elt = 0;
    return -2; /* unknown */
}

int engine_st_parse(engine_st *st, const uint8_t *buf, size_t len, const char *name) {
    if (len < 8)
        return engine_err(ENGINE_EFORMAT, "%s: %zu bytes, not a safetensors file", name, len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | buf[i];
    if (hl < 2 || hl > ST_MAX_HEADER || hl > len - 8)
        return engine_err(ENGINE_EFORMAT,
                          "%s: header length %llu does not fit the file of %zu "
                          "bytes",
                          name, (unsigned long long)hl, len);
    if (st->n_docs >= ST_MAX_FILES)
        return engine_err(ENGINE_EFORMAT, "%s: more than %d files", name, ST_MAX_FILES);
    engine_json *doc = &st->docs[st->n_docs];
    memset(doc, 0, sizeof *doc);
    int rc = engine_json_parse(doc, (const char *)buf + 8, (size_t)hl, name);
    if (rc) return rc;
    st->n_docs++;
    const engine_json_node *root = &doc->nodes[0];
    if (root->type != ENGINE_JSON_OBJECT)
        return engine_err(ENGINE_EFORMAT, "%s: the header is not a JSON object", name);
    const uint8_t *data = buf + 8 + hl;
    uint64_t data_len = len - 8 - hl;
    for (const engine_json_node *n = engine_json_first(doc, root); n;
         n = engine_json_next(doc, n)) {
        const char *tname = engine_json_key(doc, n);
        if (!strcmp(tname, "__metadata__")) continue;
        if (n->klen != strlen(tname) || n->klen == 0)
            return engine_err(ENGINE_EFORMAT, "%s: a tensor name is empty or holds a NUL", name);
        const engine_json_node *dt = engine_json_get(doc, n, "dtype");
        const engine_json_node *sh = engine_json_get(doc, n, "shape");
        const engine_json_node *off = engine_json_get(doc, n, "data_offsets");
        if (n->type != ENGINE_JSON_OBJECT || !dt || dt->type != ENGINE_JSON_STRING || !sh ||
            sh->type != ENGINE_JSON_ARRAY || !off || off->type != ENGINE_JSON_ARRAY ||
            off->count != 2)
            return engine_err(ENGINE_EFORMAT,
                              "%s: tensor %.200s: needs dtype, shape and two "
                              "data_offsets",
                              name, tname);
        engine_st_tensor t;
        memset(&t, 0, sizeof t);
        t.name = tname;
        size_t elt;
        t.type = st_dtype(engine_json_str(doc, dt), &elt);
        if (t.type == -2)
            return engine_err(ENGINE_EFORMAT, "%s: tensor %.200s: unknown dtype \"%.16s\"", name,
                              tname, engine_json_str(doc, dt));
        snprintf(t.dtype, sizeof t.dtype, "%s", engine_json_str(doc, dt));
        if (sh->count > ENGINE_ST_MAX_DIMS)
            return engine_err(ENGINE_EFORMAT, "%s: tensor %.200s: %u dimensions (max %d)", name,
                              tname, sh->count, ENGINE_ST_MAX_DIMS);
        uint64_t ne = 1;
        for (const engine_json_node *d = engine_json_first(doc, sh); d;
             d = engine_json_next(doc, d)) {
            if (d->type != ENGINE_JSON_NUMBER || !d->is_int || d->ival < 0 ||
                d->ival > ((int64_t)1 << 40))
                return engine_err(ENGINE_EFORMAT, "%s: tensor %.200s: bad dimension", name, tname);
            t.shape[t.n_dims++] = d->ival;
            if (d->ival && ne > UINT64_MAX / (uint64_t)d->ival / 8)
                return engine_err(ENGINE_EFORMAT, "%s: tensor %.200s: too large", name, tname);
            ne *= (uint64_t)d->ival;
        }
        const engine_json_node *b = engine_json_first(doc, off), *e = engine_json_next(doc, b);
        if (b->type != ENGINE_JSON_NUMBER || !b->is_int || e->type != ENGINE_JSON_NUMBER ||
            !e->is_int || b->ival < 0 || e->ival < b->ival || (uint64_t)e->ival > data_len)
            return engine_err(ENGINE_EFORMAT,
                              "%s: tensor %.200s: data_offsets outside the %llu "
                              "bytes of data",
                              name, tname, (unsigned long long)data_len);
        if (ne * elt != (uint64_t)(e->ival - b->ival))
            return engine_err(ENGINE_EFORMAT,
                              "%s: tensor %.200s: %llu values of %s need %llu "
                              "bytes, data_offsets span %lld",
                              name, tname, (unsigned long long)ne, t.dtype,
                              (unsigned long long)(ne * elt), (long long)(e->ival - b->ival));
        t.n_elements = (int64_t)ne;
        t.data = data + b->ival;
        t.nbytes = (size_t)(e->ival - b->ival);
        if (engine_st_find(st, tname))
            return engine_err(ENGINE_EFORMAT, "%s: tensor %.200s appears twice", name, tname);
        if (st->n == st->cap) {
            int64_t cap = st->cap ? 2 * st->cap : 256;
            engine_st_tensor *nt = realloc(st->t, (size_t)cap * sizeof *nt);
            if (!nt) return engine_err(ENGINE_ENOMEM, "out of memory reading %s", name);
            st->t = nt;
            st->cap = cap;
        }
        st->t[st->n++] = t;
        st->bytes += t.nbytes;
    }
    return 0;
}

static int st_map_file(engine_st *st, const char *path) {
    if (st->n_files >= ST_MAX_FILES)
        return engine_err(ENGINE_EFORMAT, "%s: more than %d shards", path, ST_MAX_FILES);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return engine_err(ENGINE_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 8) {
        close(fd);
        return engine_err(ENGINE_EFORMAT, "%s: not a safetensors file", path);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return engine_err(ENGINE_EIO, "%s: cannot map: %s", path, strerror(errno));
    st->files[st->n_files++] = (st_file){map, (size_t)sb.st_size};
    return engine_st_parse(st, map, (size_t)sb.st_size, path);
}

char *engine_st_read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? 2 * cap : 1 << 16;
            char *nb = cap <= (64u << 20) ? realloc(buf, cap) : NULL;
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, 65536, f);
        n += got;
        if (got < 65536) break;
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

int engine_st_open(engine_st **out, const char *dir) {
    *out = NULL;
    engine_st *st;
    int rc = engine_st_new(&st);
    if (rc) return rc;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    size_t len = 0;
    char *index = engine_st_read_text(path, &len);
    if (!index) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = st_map_file(st, path);
    } else {
        engine_json doc;
        memset(&doc, 0, sizeof doc);
        rc = engine_json_parse(&doc, index, len, path);
        const engine_json_node *wm = rc ? NULL : engine_json_get(&doc, &doc.nodes[0], "weight_map");
        if (!rc && (!wm || wm->type != ENGINE_JSON_OBJECT))
            rc = engine_err(ENGINE_EFORMAT, "%s: no weight_map object", path);
        /* each shard once, in order of first mention */
        const engine_json_node *seen[ST_MAX_FILES];
        int n_seen = 0;
        for (const engine_json_node *n = wm && !rc ? engine_json_first(&doc, wm) : NULL; n && !rc;
             n = engine_json_next(&doc, n)) {
            if (n->type != ENGINE_JSON_STRING || strchr(engine_json_str(&doc, n), '/') ||
                n->len == 0 || n->len != strlen(engine_json_str(&doc, n))) {
                rc = engine_err(ENGINE_EFORMAT, "%s: a weight_map entry is not a file name", path);
                break;
            }
            bool dup = false;
            for (int i = 0; i < n_seen && !dup; i++)
                dup = !strcmp(engine_json_str(&doc, seen[i]), engine_json_str(&doc, n));
            if (dup) continue;
            if (n_seen == ST_MAX_FILES) {
                rc = engine_err(ENGINE_EFORMAT, "%s: more than %d shards", path, ST_MAX_FILES);
                break;
            }
            seen[n_seen++] = n;
            char shard[4096];
            if ((size_t)snprintf(shard, sizeof shard, "%s/%s", dir, engine_json_str(&doc, n)) >=
                sizeof shard) {
                rc = engine_err(ENGINE_EINVAL, "%s: path too long", dir);
                break;
            }
            rc = st_map_file(st, shard);
        }
        engine_json_deinit(&doc);
        free(index);
    }
    if (rc) {
        engine_st_close(st);
        return rc;
    }
    *out = st;
    return 0;
}
