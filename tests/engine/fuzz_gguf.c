/* libFuzzer target for the GGUF reader: the input becomes a file (a memfd, so no disk I/O),
 * is opened, and everything a loader would touch is read: every metadata value (nested arrays
 * and string arrays included, through the typed getters), every tensor's bytes, and a
 * dequantised row of each tensor whose type the CPU supports. Any crash or sanitizer report is
 * a bug; an error return is the expected outcome for most inputs.
 * The corpus in tests/fixtures/fuzz/gguf/ is written by `test_gguf_malformed --write-corpus`. */
#include "cpu/quant.h"
#include "model/gguf.h"
#include "engine.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t sink;

static void walk_value(const engine_gguf_value *v) {
    switch (v->type) {
    case ENGINE_GGUF_STRING:
        for (size_t i = 0; i < v->str.len; i++)
            sink += (unsigned char)v->str.ptr[i];
        break;
    case ENGINE_GGUF_ARRAY:
        if (v->arr.type == ENGINE_GGUF_STRING) {
            for (uint64_t i = 0; i < v->arr.n; i++)
                if (v->arr.strs[i].len)
                    sink += (unsigned char)v->arr.strs[i].ptr[v->arr.strs[i].len - 1];
        } else if (v->arr.type == ENGINE_GGUF_ARRAY) {
            for (uint64_t i = 0; i < v->arr.n; i++)
                walk_value(&v->arr.vals[i]);
        } else {
            for (uint64_t i = 0; i < v->arr.n; i++)
                sink += engine_gguf_arr_u64(v, i) + (uint64_t)engine_gguf_arr_i64(v, i) +
                        (uint64_t)(engine_gguf_arr_f64(v, i) != 0);
        }
        break;
    default:
        sink += v->u64;
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz_gguf", MFD_CLOEXEC);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    engine_gguf *g = NULL;
    if (engine_gguf_open(&g, path) == 0) {
        for (int64_t i = 0; i < engine_gguf_kv_count(g); i++) {
            const engine_gguf_kv *kv = engine_gguf_kv_at(g, i);
            walk_value(&kv->value);
            /* the typed getters on every key: type errors are fine, crashes are not */
            uint32_t u32;
            int32_t i32;
            uint64_t u64;
            float f32;
            bool b;
            engine_gguf_str s;
            const engine_gguf_value *arr;
            sink += engine_gguf_get_u32(g, kv->key, &u32) + engine_gguf_get_i32(g, kv->key, &i32) +
                    engine_gguf_get_u64(g, kv->key, &u64) + engine_gguf_get_f32(g, kv->key, &f32) +
                    engine_gguf_get_bool(g, kv->key, &b) + engine_gguf_get_str(g, kv->key, &s) +
                    engine_gguf_get_arr(g, kv->key, -1, &arr) +
                    engine_gguf_get_arr(g, kv->key, ENGINE_GGUF_STRING, &arr);
            sink += engine_gguf_find_key(g, kv->key) == kv;
        }
        static float row[4096];
        for (int64_t i = 0; i < engine_gguf_tensor_count(g); i++) {
            const engine_gguf_tensor *t = engine_gguf_tensor_at(g, i);
            sink += engine_gguf_find_tensor(g, t->name) == t;
            const uint8_t *p = t->data;
            if (t->nbytes) sink += p[0] + p[t->nbytes - 1];
            const engine_type_traits *tr = engine_type_traits_get((int)t->type);
            int64_t n = t->ne[0] < 4096 ? t->ne[0] : 4096 / tr->block_size * tr->block_size;
            if (tr->supported && n > 0 && engine_dequantize_row(t->type, t->data, row, n) == 0)
                sink += row[0] != 0;
        }
        engine_gguf_close(g);
    }
    close(fd);
    return 0;
}
