/* GGUF writer -> reader round trip: every metadata type (nested arrays too), tensors of every
 * supported type written by copy, by a multi-threaded fill callback and through the two-phase
 * API, custom alignment, lookups, typed getters and their error messages. */
#include "cpu/quant.h"
#include "model/gguf.h"
#include "engine.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)
#define OK(expr) CHECK((expr) == 0, "%s: %s", #expr, engine_error_last())

static char tmpdir[256];

static bool str_eq(engine_gguf_str s, const char *c) {
    return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

/* Tensor bytes are a function of (index, offset) so any misplacement shows. */
static uint8_t pattern(int64_t idx, size_t off) {
    return (uint8_t)(idx * 131 + off * 7 + (off >> 8));
}

static atomic_int fill_calls;

static int fill(int64_t idx, void *dst, size_t nbytes, void *user) {
    (void)user;
    atomic_fetch_add(&fill_calls, 1);
    uint8_t *p = dst;
    for (size_t i = 0; i < nbytes; i++)
        p[i] = pattern(idx, i);
    return 0;
}

static int fill_fail(int64_t idx, void *dst, size_t nbytes, void *user) {
    (void)dst;
    (void)nbytes;
    (void)user;
    if (idx == 2) {
        /* engine_err is private to the engine; mimic it through a failing engine call */
        float f;
        engine_dequantize_row(ENGINE_TYPE_Q4_0, "", &f, 3);
        return ENGINE_EIO;
    }
    return 0;
}

static void test_roundtrip(int alignment, int n_threads) {
    char path[512];
    snprintf(path, sizeof path, "%s/rt_%d_%d.gguf", tmpdir, alignment, n_threads);
    engine_gguf_writer *w;
    OK(engine_gguf_writer_new(&w));
    if (alignment) OK(engine_gguf_writer_set_u32(w, "general.alignment", (uint32_t)alignment));
    OK(engine_gguf_writer_set_str(w, "general.architecture", "qwen3moe"));
    OK(engine_gguf_writer_set_u8(w, "t.u8", 250));
    OK(engine_gguf_writer_set_i8(w, "t.i8", -120));
    OK(engine_gguf_writer_set_u16(w, "t.u16", 65000));
    OK(engine_gguf_writer_set_i16(w, "t.i16", -32000));
    OK(engine_gguf_writer_set_u32(w, "t.u32", 4000000000u));
    OK(engine_gguf_writer_set_i32(w, "t.i32", -2000000000));
    OK(engine_gguf_writer_set_u64(w, "t.u64", 0xfedcba9876543210ull));
    OK(engine_gguf_writer_set_i64(w, "t.i64", -0x123456789abcdefll));
    OK(engine_gguf_writer_set_f32(w, "t.f32", 1e-6f));
    OK(engine_gguf_writer_set_f64(w, "t.f64", 3.141592653589793));
    OK(engine_gguf_writer_set_bool(w, "t.bool", true));
    OK(engine_gguf_writer_set_str(w, "t.str", "héllo, GGUF"));
    OK(engine_gguf_writer_set_strn(w, "t.strn", "a\0b", 3));
    OK(engine_gguf_writer_set_str(w, "t.empty", ""));
    OK(engine_gguf_writer_set_u32(w, "t.replaced", 1));
    OK(engine_gguf_writer_set_u32(w, "t.replaced", 2)); /* replaces */
    const int32_t ints[5] = {1, -2, 3, -4, 2147483647};
    OK(engine_gguf_writer_set_arr(w, "t.arr_i32", ENGINE_GGUF_INT32, ints, 5));
    const float fl[3] = {0.5f, -1.25f, 1e30f};
    OK(engine_gguf_writer_set_arr(w, "t.arr_f32", ENGINE_GGUF_FLOAT32, fl, 3));
    const uint8_t bools[4] = {1, 0, 1, 1};
    OK(engine_gguf_writer_set_arr(w, "t.arr_bool", ENGINE_GGUF_BOOL, bools, 4));
    const double f64s[2] = {-0.0, 1e300};
    OK(engine_gguf_writer_set_arr(w, "t.arr_f64", ENGINE_GGUF_FLOAT64, f64s, 2));
    const uint64_t u64s[2] = {0, UINT64_MAX};
    OK(engine_gguf_writer_set_arr(w, "t.arr_u64", ENGINE_GGUF_UINT64, u64s, 2));
    OK(engine_gguf_writer_set_arr(w, "t.arr_empty", ENGINE_GGUF_UINT16, NULL, 0));
    const char *strs[3] = {"Ġthe", "", "<|im_end|>"};
    OK(engine_gguf_writer_set_arr_str(w, "t.arr_str", strs, NULL, 3));
    /* Nested: [[1, 2], [], [["x", "yz"]]] as array of arrays (of int16, of uint8, of array). */
    const int16_t i16s[2] = {1, 2};
    engine_gguf_str xs[2] = {{"x", 1}, {"yz", 2}};
    engine_gguf_value inner_s = {.type = ENGINE_GGUF_ARRAY,
                                 .arr = {.type = ENGINE_GGUF_STRING, .n = 2, .strs = xs}};
    engine_gguf_value elems[3] = {
        {.type = ENGINE_GGUF_ARRAY, .arr = {.type = ENGINE_GGUF_INT16, .n = 2, .data = i16s}},
        {.type = ENGINE_GGUF_ARRAY, .arr = {.type = ENGINE_GGUF_UINT8, .n = 0}},
        {.type = ENGINE_GGUF_ARRAY, .arr = {.type = ENGINE_GGUF_ARRAY, .n = 1, .vals = &inner_s}},
    };
    engine_gguf_value nested = {.type = ENGINE_GGUF_ARRAY,
                                .arr = {.type = ENGINE_GGUF_ARRAY, .n = 3, .vals = elems}};
    OK(engine_gguf_writer_set_value(w, "t.nested", &nested));

    /* Tensors: one per supported type (some copied, some filled), odd shapes. */
    const engine_type types[] = {ENGINE_TYPE_F32,  ENGINE_TYPE_F16,  ENGINE_TYPE_BF16,
                                 ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q4_0, ENGINE_TYPE_Q4_K,
                                 ENGINE_TYPE_Q5_K, ENGINE_TYPE_Q6_K, ENGINE_TYPE_Q2_K};
    const int nt = (int)(sizeof types / sizeof types[0]);
    uint8_t *copies[16] = {0};
    for (int i = 0; i < nt; i++) {
        const int64_t bs = engine_type_traits_get(types[i])->block_size;
        int64_t ne[4] = {bs * (i + 1) * (bs == 1 ? 3 : 1), i % 3 + 1, i % 2 + 1, 1};
        char name[64];
        snprintf(name, sizeof name, "blk.%d.%s.weight", i, engine_type_name(types[i]));
        const size_t nbytes =
            engine_type_row_size(types[i], ne[0]) * (size_t)(ne[1] * (i % 2 ? 1 : ne[2]));
        const void *data = NULL;
        if (i % 2 == 0) { /* copied */
            copies[i] = malloc(nbytes);
            for (size_t k = 0; k < nbytes; k++)
                copies[i][k] = pattern(i, k);
            data = copies[i];
        }
        const int64_t idx = engine_gguf_writer_add_tensor(w, name, types[i], 3 - i % 2, ne, data);
        CHECK(idx == i, "add_tensor returned %lld: %s", (long long)idx, engine_error_last());
        CHECK(engine_gguf_writer_tensor_nbytes(w, i) == nbytes, "nbytes %d", i);
    }
    /* Writer-side errors. */
    const int64_t ne1[1] = {33};
    CHECK(engine_gguf_writer_add_tensor(w, "bad", ENGINE_TYPE_Q4_0, 1, ne1, NULL) == ENGINE_EINVAL,
          "partial block accepted");
    CHECK(engine_gguf_writer_add_tensor(w, "blk.0.f32.weight", ENGINE_TYPE_F32, 1, ne1, NULL) ==
                  ENGINE_EINVAL &&
              strstr(engine_error_last(), "duplicate"),
          "duplicate tensor accepted");
    CHECK(engine_gguf_writer_set_arr(w, "x", ENGINE_GGUF_STRING, strs, 1) == ENGINE_EINVAL,
          "set_arr with strings");

    atomic_store(&fill_calls, 0);
    OK(engine_gguf_writer_write(w, path, fill, NULL, n_threads));
    CHECK(atomic_load(&fill_calls) == nt / 2, "fill called %d times", atomic_load(&fill_calls));
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0, "temporary file left behind");
    engine_gguf_writer_free(w);
    for (int i = 0; i < 16; i++)
        free(copies[i]);

    /* Read back. */
    engine_gguf *g;
    OK(engine_gguf_open(&g, path));
    if (!g) return;
    const size_t al = alignment ? (size_t)alignment : 32;
    CHECK(engine_gguf_version(g) == 3, "version");
    CHECK(engine_gguf_alignment(g) == al, "alignment %zu", engine_gguf_alignment(g));
    CHECK(engine_gguf_data_offset(g) % al == 0, "data offset alignment");
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f32;
    bool b;
    engine_gguf_str s;
    OK(engine_gguf_get_u32(g, "t.u32", &u32));
    CHECK(u32 == 4000000000u, "u32");
    OK(engine_gguf_get_u32(g, "t.u8", &u32));
    CHECK(u32 == 250, "u8 via u32 getter");
    OK(engine_gguf_get_i32(g, "t.i16", &i32));
    CHECK(i32 == -32000, "i16 via i32");
    OK(engine_gguf_get_i32(g, "t.i32", &i32));
    CHECK(i32 == -2000000000, "i32");
    OK(engine_gguf_get_u64(g, "t.u64", &u64));
    CHECK(u64 == 0xfedcba9876543210ull, "u64");
    OK(engine_gguf_get_u32(g, "t.replaced", &u32));
    CHECK(u32 == 2, "replaced value");
    const engine_gguf_kv *kv = engine_gguf_find_key(g, "t.i64");
    CHECK(kv && kv->value.type == ENGINE_GGUF_INT64 && kv->value.i64 == -0x123456789abcdefll,
          "i64");
    kv = engine_gguf_find_key(g, "t.i8");
    CHECK(kv && kv->value.type == ENGINE_GGUF_INT8 && kv->value.i64 == -120, "i8");
    kv = engine_gguf_find_key(g, "t.u16");
    CHECK(kv && kv->value.type == ENGINE_GGUF_UINT16 && kv->value.u64 == 65000, "u16");
    OK(engine_gguf_get_f32(g, "t.f32", &f32));
    CHECK(f32 == 1e-6f, "f32");
    kv = engine_gguf_find_key(g, "t.f64");
    CHECK(kv && kv->value.type == ENGINE_GGUF_FLOAT64 && kv->value.f64 == 3.141592653589793, "f64");
    OK(engine_gguf_get_bool(g, "t.bool", &b));
    CHECK(b, "bool");
    OK(engine_gguf_get_str(g, "t.str", &s));
    CHECK(str_eq(s, "héllo, GGUF"), "str");
    OK(engine_gguf_get_str(g, "t.strn", &s));
    CHECK(s.len == 3 && !memcmp(s.ptr, "a\0b", 3), "str with NUL");
    OK(engine_gguf_get_str(g, "t.empty", &s));
    CHECK(s.len == 0, "empty str");
    const engine_gguf_value *a;
    OK(engine_gguf_get_arr(g, "t.arr_i32", ENGINE_GGUF_INT32, &a));
    CHECK(a && a->arr.n == 5, "arr_i32 n");
    for (int i = 0; a && i < 5; i++)
        CHECK(engine_gguf_arr_i64(a, i) == ints[i], "arr_i32[%d]", i);
    OK(engine_gguf_get_arr(g, "t.arr_f32", ENGINE_GGUF_FLOAT32, &a));
    for (int i = 0; a && i < 3; i++)
        CHECK(engine_gguf_arr_f64(a, i) == fl[i], "arr_f32[%d]", i);
    OK(engine_gguf_get_arr(g, "t.arr_bool", ENGINE_GGUF_BOOL, &a));
    for (int i = 0; a && i < 4; i++)
        CHECK(engine_gguf_arr_i64(a, i) == bools[i], "bool[%d]", i);
    OK(engine_gguf_get_arr(g, "t.arr_f64", ENGINE_GGUF_FLOAT64, &a));
    CHECK(a && signbit(engine_gguf_arr_f64(a, 0)) && engine_gguf_arr_f64(a, 1) == 1e300, "f64 arr");
    OK(engine_gguf_get_arr(g, "t.arr_u64", -1, &a));
    CHECK(a && engine_gguf_arr_u64(a, 1) == UINT64_MAX, "u64 arr");
    OK(engine_gguf_get_arr(g, "t.arr_empty", ENGINE_GGUF_UINT16, &a));
    CHECK(a && a->arr.n == 0, "empty arr");
    OK(engine_gguf_get_arr(g, "t.arr_str", ENGINE_GGUF_STRING, &a));
    CHECK(a && a->arr.n == 3 && str_eq(a->arr.strs[0], "Ġthe") && a->arr.strs[1].len == 0 &&
              str_eq(a->arr.strs[2], "<|im_end|>"),
          "string array");
    OK(engine_gguf_get_arr(g, "t.nested", ENGINE_GGUF_ARRAY, &a));
    if (a && a->arr.n == 3) {
        const engine_gguf_value *v = a->arr.vals;
        CHECK(v[0].arr.type == ENGINE_GGUF_INT16 && v[0].arr.n == 2 &&
                  engine_gguf_arr_i64(&v[0], 1) == 2,
              "nested[0]");
        CHECK(v[1].arr.type == ENGINE_GGUF_UINT8 && v[1].arr.n == 0, "nested[1]");
        CHECK(v[2].arr.type == ENGINE_GGUF_ARRAY && v[2].arr.n == 1 &&
                  v[2].arr.vals[0].arr.type == ENGINE_GGUF_STRING &&
                  str_eq(v[2].arr.vals[0].arr.strs[1], "yz"),
              "nested[2]");
    } else {
        CHECK(0, "nested array shape");
    }
    /* Getter errors name the key and both types. */
    CHECK(engine_gguf_get_u32(g, "t.str", &u32) == ENGINE_EFORMAT &&
              strstr(engine_error_last(), "t.str") && strstr(engine_error_last(), "uint32") &&
              strstr(engine_error_last(), "string"),
          "type error message: %s", engine_error_last());
    CHECK(engine_gguf_get_u32(g, "t.i8", &u32) == ENGINE_EFORMAT, "negative into u32");
    CHECK(engine_gguf_get_i32(g, "t.u32", &i32) == ENGINE_EFORMAT &&
              strstr(engine_error_last(), "out of range"),
          "u32 4e9 into i32");
    CHECK(engine_gguf_get_u32(g, "t.u64", &u32) == ENGINE_EFORMAT, "u64 into u32");
    CHECK(engine_gguf_get_u32(g, "no.such.key", &u32) == ENGINE_EFORMAT &&
              strstr(engine_error_last(), "missing key no.such.key"),
          "missing key: %s", engine_error_last());
    CHECK(engine_gguf_get_arr(g, "t.arr_i32", ENGINE_GGUF_STRING, &a) == ENGINE_EFORMAT &&
              strstr(engine_error_last(), "expected array of string, found array of int32"),
          "array type: %s", engine_error_last());
    CHECK(engine_gguf_get_arr(g, "t.u8", -1, &a) == ENGINE_EFORMAT, "scalar as array");
    CHECK(engine_gguf_get_bool(g, "t.u8", &b) == ENGINE_EFORMAT, "u8 as bool");
    CHECK(engine_gguf_get_f32(g, "t.f64", &f32) == 0 && f32 == (float)3.141592653589793,
          "f64->f32");
    CHECK(engine_gguf_kv_count(g) == 24 + (alignment ? 1 : 0), "kv count %lld",
          (long long)engine_gguf_kv_count(g));

    /* Tensors. */
    CHECK(engine_gguf_tensor_count(g) == nt, "tensor count");
    for (int i = 0; i < nt; i++) {
        const engine_gguf_tensor *t = engine_gguf_tensor_at(g, i);
        char name[64];
        snprintf(name, sizeof name, "blk.%d.%s.weight", i, engine_type_name(types[i]));
        CHECK(t && !strcmp(t->name, name), "tensor %d name", i);
        if (!t) continue;
        CHECK(engine_gguf_find_tensor(g, name) == t, "find %s", name);
        CHECK(engine_gguf_find_tensor_index(g, name) == i, "find index %s", name);
        CHECK(t->type == types[i] && t->n_dims == 3 - i % 2, "type/dims %d", i);
        const int64_t bs = engine_type_traits_get(types[i])->block_size;
        CHECK(t->ne[0] == bs * (i + 1) * (bs == 1 ? 3 : 1) && t->ne[1] == i % 3 + 1 &&
                  t->ne[2] == (t->n_dims == 3 ? i % 2 + 1 : 1) && t->ne[3] == 1,
              "shape %d", i);
        CHECK(t->offset % al == 0, "offset alignment %d", i);
        CHECK(((const uint8_t *)t->data - (const uint8_t *)engine_gguf_map(g)) % al == 0,
              "data pointer alignment %d", i);
        const uint8_t *p = t->data;
        size_t bad = 0;
        for (size_t k = 0; k < t->nbytes; k++)
            bad += p[k] != pattern(i, k);
        CHECK(bad == 0, "tensor %d: %zu bytes differ", i, bad);
    }
    CHECK(engine_gguf_find_tensor(g, "nope") == NULL, "absent tensor");
    CHECK(engine_gguf_tensor_at(g, nt) == NULL && engine_gguf_tensor_at(g, -1) == NULL, "range");
    CHECK(engine_gguf_kv_at(g, -1) == NULL && engine_gguf_kv_at(g, 1000) == NULL, "kv range");
    struct stat st;
    stat(path, &st);
    CHECK((uint64_t)st.st_size == engine_gguf_file_size(g), "file size");
    engine_gguf_close(g);
    unlink(path);
}

static void test_two_phase_and_failures(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/two.gguf", tmpdir);
    engine_gguf_writer *w;
    OK(engine_gguf_writer_new(&w));
    OK(engine_gguf_writer_set_str(w, "general.architecture", "qwen3"));
    const int64_t ne[2] = {256, 4};
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", i);
        CHECK(engine_gguf_writer_add_tensor(w, name, ENGINE_TYPE_Q8_0, 2, ne, NULL) == i, "add");
    }
    /* A fill error aborts the write and leaves neither file nor temporary. */
    CHECK(engine_gguf_writer_write(w, path, fill_fail, NULL, 3) == ENGINE_EIO, "fill error");
    CHECK(strstr(engine_error_last(), "not a multiple") != NULL, "fill error message: %s",
          engine_error_last());
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(path, F_OK) != 0 && access(tmp, F_OK) != 0, "files left after a failed write");
    CHECK(engine_gguf_writer_write(w, path, NULL, NULL, 1) == ENGINE_EINVAL, "no data, no fill");

    /* Two-phase: the writer can be freed after begin; fill from "threads" (here, in order). */
    engine_gguf_out *o;
    OK(engine_gguf_writer_begin(w, path, &o));
    engine_gguf_writer_free(w);
    CHECK(engine_gguf_out_tensor_count(o) == 4, "out count");
    CHECK(engine_gguf_out_tensor_data(o, 4) == NULL, "out range");
    for (int i = 0; i < 4; i++) {
        uint8_t *p = engine_gguf_out_tensor_data(o, i);
        const size_t n = engine_gguf_out_tensor_nbytes(o, i);
        CHECK(n == 4 * 8 * 34, "out nbytes");
        for (size_t k = 0; k < n; k++)
            p[k] = pattern(i, k);
    }
    CHECK(access(path, F_OK) != 0, "final file visible before commit");
    OK(engine_gguf_out_commit(o));
    engine_gguf *g;
    OK(engine_gguf_open(&g, path));
    if (g) {
        const engine_gguf_tensor *t = engine_gguf_find_tensor(g, "t3");
        CHECK(t && ((const uint8_t *)t->data)[100] == pattern(3, 100), "two-phase data");
        engine_gguf_close(g);
    }
    /* Abort removes the temporary. */
    OK(engine_gguf_writer_new(&w));
    OK(engine_gguf_writer_begin(w, path, &o));
    engine_gguf_writer_free(w);
    CHECK(access(tmp, F_OK) == 0, "temporary exists during the write");
    engine_gguf_out_abort(o);
    CHECK(access(tmp, F_OK) != 0, "abort left the temporary");
    engine_gguf_out_abort(NULL);
    /* An empty model (no tensors, no metadata) round-trips. */
    OK(engine_gguf_writer_new(&w));
    OK(engine_gguf_writer_write(w, path, NULL, NULL, 4));
    engine_gguf_writer_free(w);
    OK(engine_gguf_open(&g, path));
    if (g) {
        CHECK(engine_gguf_tensor_count(g) == 0 && engine_gguf_kv_count(g) == 0, "empty");
        engine_gguf_close(g);
    }
    /* Bad alignment is refused by the writer. */
    OK(engine_gguf_writer_new(&w));
    OK(engine_gguf_writer_set_u32(w, "general.alignment", 48));
    CHECK(engine_gguf_writer_write(w, path, NULL, NULL, 1) == ENGINE_EINVAL, "alignment 48");
    OK(engine_gguf_writer_set_u32(w, "general.alignment", 2)); /* below the data alignment */
    CHECK(engine_gguf_writer_write(w, path, NULL, NULL, 1) == ENGINE_EINVAL, "alignment 2");
    engine_gguf_writer_free(w);
    engine_gguf_writer_free(NULL);
    engine_gguf_close(NULL);
    /* Open errors. */
    CHECK(engine_gguf_open(&g, "/nonexistent/x.gguf") == ENGINE_EIO &&
              strstr(engine_error_last(), "/nonexistent/x.gguf"),
          "missing file");
    CHECK(engine_gguf_open(&g, tmpdir) == ENGINE_EIO, "directory");
    unlink(path);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s/spark_test_gguf_XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip(0, 1);
    test_roundtrip(64, 4);
    test_roundtrip(4, 3);
    test_roundtrip(4096, 2);
    test_two_phase_and_failures();
    rmdir(tmpdir);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("test_gguf: ok\n");
    return 0;
}
