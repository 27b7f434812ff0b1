/* Hostile GGUF files: a small valid file built byte by byte here (independently of the writer),
 * truncated at every offset and patched field by field. Each must fail with ENGINE_EFORMAT (or
 * EUNSUPPORTED) and a message naming the file and the field - and never crash.
 *
 * `test_gguf_malformed --write-corpus DIR` writes these files (the fuzz corpus of fuzz_gguf)
 * instead of testing: tests/fixtures/fuzz/gguf/ is regenerated that way (file names without
 * .gguf, which .gitignore excludes). */
#include "cpu/quant.h"
#include "model/gguf.h"
#include "engine.h"

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

typedef struct {
    uint8_t p[4096];
    size_t n;
} buf;

static void put(buf *b, const void *src, size_t n) {
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void u32(buf *b, uint32_t v) {
    put(b, &v, 4);
}
static void u64(buf *b, uint64_t v) {
    put(b, &v, 8);
}
static void str(buf *b, const char *s) {
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void patch32(buf *b, size_t at, uint32_t v) {
    memcpy(b->p + at, &v, 4);
}
static void patch64(buf *b, size_t at, uint64_t v) {
    memcpy(b->p + at, &v, 8);
}

/* Positions of fields in the base file, for patching. */
static struct {
    size_t version, n_tensors, n_kv, key0_len, key0_byte, arch_len, align_type, align_val, arr_type,
        arr_count, strarr_count, strarr_s1_len, bool_val, vtype_bool, nested_inner_n, t0_ndims,
        t0_ne0, t1_name_byte, t1_ne0, t1_ne1, t1_type, t2_name_byte, t2_offset, t2_ndims;
} at;

enum { V_BASE, V_DUP_KEY, V_DEEP, V_EMPTY_NAME, V_ALIGN_STR };

/* The base file: 7 metadata entries and 3 tensors:
 *   a: f32 [8] at 0 (32 bytes), b: q8_0 [32, 2] at 32 (68 bytes), c: f16 [16] at 128 (32). */
static void build(buf *b, int variant) {
    b->n = 0;
    put(b, "GGUF", 4);
    at.version = b->n;
    u32(b, 3);
    at.n_tensors = b->n;
    u64(b, 3);
    at.n_kv = b->n;
    u64(b, variant == V_DUP_KEY ? 8 : 7);
    /* general.architecture = "qwen3moe" */
    at.key0_len = b->n;
    str(b, "general.architecture");
    at.key0_byte = at.key0_len + 8 + 3;
    u32(b, ENGINE_GGUF_STRING);
    at.arch_len = b->n;
    str(b, "qwen3moe");
    /* general.alignment = 32 */
    str(b, "general.alignment");
    at.align_type = b->n;
    if (variant == V_ALIGN_STR) {
        u32(b, ENGINE_GGUF_STRING);
        str(b, "32");
    } else {
        u32(b, ENGINE_GGUF_UINT32);
        at.align_val = b->n;
        u32(b, 32);
    }
    /* t.ints = [1, 2, 3] (int32) */
    str(b, "t.ints");
    u32(b, ENGINE_GGUF_ARRAY);
    at.arr_type = b->n;
    u32(b, ENGINE_GGUF_INT32);
    at.arr_count = b->n;
    u64(b, 3);
    u32(b, 1), u32(b, 2), u32(b, 3);
    /* t.strs = ["x", "yy"] */
    str(b, "t.strs");
    u32(b, ENGINE_GGUF_ARRAY);
    u32(b, ENGINE_GGUF_STRING);
    at.strarr_count = b->n;
    u64(b, 2);
    str(b, "x");
    at.strarr_s1_len = b->n;
    str(b, "yy");
    /* t.flag = true */
    str(b, "t.flag");
    at.vtype_bool = b->n;
    u32(b, ENGINE_GGUF_BOOL);
    at.bool_val = b->n;
    b->p[b->n++] = 1;
    /* t.nested = [[7]] or, for V_DEEP, 9 levels of nesting */
    str(b, "t.nested");
    u32(b, ENGINE_GGUF_ARRAY);
    const int depth = variant == V_DEEP ? 9 : 1;
    for (int d = 0; d < depth; d++) {
        u32(b, ENGINE_GGUF_ARRAY);
        u64(b, 1);
    }
    u32(b, ENGINE_GGUF_UINT8);
    at.nested_inner_n = b->n;
    u64(b, 1);
    b->p[b->n++] = 7;
    /* t.pi = 3.0 (float64) */
    str(b, "t.pi");
    u32(b, ENGINE_GGUF_FLOAT64);
    const double pi = 3.0;
    put(b, &pi, 8);
    if (variant == V_DUP_KEY) {
        str(b, "t.ints");
        u32(b, ENGINE_GGUF_UINT8);
        b->p[b->n++] = 1;
    }
    /* tensor infos */
    str(b, variant == V_EMPTY_NAME ? "" : "a");
    at.t0_ndims = b->n;
    u32(b, 1);
    at.t0_ne0 = b->n;
    u64(b, 8);
    u32(b, ENGINE_TYPE_F32);
    u64(b, 0);
    at.t1_name_byte = b->n + 8;
    str(b, "b");
    u32(b, 2);
    at.t1_ne0 = b->n;
    u64(b, 32);
    at.t1_ne1 = b->n;
    u64(b, 2);
    at.t1_type = b->n;
    u32(b, ENGINE_TYPE_Q8_0);
    u64(b, 32);
    at.t2_name_byte = b->n + 8;
    str(b, "c");
    at.t2_ndims = b->n;
    u32(b, 1);
    u64(b, 16);
    u32(b, ENGINE_TYPE_F16);
    at.t2_offset = b->n;
    u64(b, 128);
    /* padding to 32, then 160 bytes of data */
    while (b->n % 32)
        b->p[b->n++] = 0;
    for (int i = 0; i < 160; i++)
        b->p[b->n++] = (uint8_t)i;
    /* a = 8 floats 1..8 */
    for (int i = 0; i < 8; i++) {
        const float f = (float)(i + 1);
        memcpy(b->p + b->n - 160 + 4 * i, &f, 4);
    }
}

static char tmpdir[256];

static int open_bytes(const buf *b, const char *name, engine_gguf **g, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s.gguf", tmpdir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1000;
    fwrite(b->p, 1, b->n, f);
    fclose(f);
    return engine_gguf_open(g, path);
}

typedef struct {
    const char *name;
    int variant;
    void (*patch)(buf *b);
    int code;
    const char *needle; /* must appear in the message */
} bad_case;

#define PATCH(nm, body)                                                                            \
    static void nm(buf *b) {                                                                       \
        body;                                                                                      \
    }
PATCH(p_magic, b->p[0] = 'X')
PATCH(p_v1, patch32(b, at.version, 1))
PATCH(p_v4, patch32(b, at.version, 4))
PATCH(p_vbe, patch32(b, at.version, 0x03000000u))
PATCH(p_ntensors_huge, patch64(b, at.n_tensors, (uint64_t)1 << 40))
PATCH(p_ntensors_fit, patch64(b, at.n_tensors, 1000))
PATCH(p_nkv_max, patch64(b, at.n_kv, UINT64_MAX))
PATCH(p_nkv_more, patch64(b, at.n_kv, 8))
PATCH(p_keylen, patch64(b, at.key0_len, (uint64_t)1 << 63))
PATCH(p_strlen, patch64(b, at.arch_len, 1000000))
PATCH(p_arrcount, patch64(b, at.arr_count, (uint64_t)1 << 61))
PATCH(p_arrtype, patch32(b, at.arr_type, 77))
PATCH(p_arrtype_str, patch32(b, at.arr_type, ENGINE_GGUF_STRING))
PATCH(p_vtype, patch32(b, at.vtype_bool, 13))
PATCH(p_bool, b->p[at.bool_val] = 2)
PATCH(p_align3, patch32(b, at.align_val, 3))
PATCH(p_align0, patch32(b, at.align_val, 0))
PATCH(p_align_huge, patch32(b, at.align_val, 1u << 30))
PATCH(p_ndims5, patch32(b, at.t0_ndims, 5))
PATCH(p_ndims0, patch32(b, at.t0_ndims, 0))
PATCH(p_ne0_zero, patch64(b, at.t0_ne0, 0))
PATCH(p_ne_overflow, patch64(b, at.t1_ne0, (uint64_t)1 << 32);
      patch64(b, at.t1_ne1, (uint64_t)1 << 32))
PATCH(p_ne_huge, patch64(b, at.t0_ne0, UINT64_MAX))
PATCH(p_type99, patch32(b, at.t1_type, 99))
PATCH(p_type_removed, patch32(b, at.t1_type, 4))
PATCH(p_type_unsupported_ok, patch32(b, at.t1_type, ENGINE_TYPE_Q4_1))
PATCH(p_partial_block, patch64(b, at.t1_ne0, 33))
PATCH(p_misaligned, patch64(b, at.t2_offset, 130))
PATCH(p_overlap, patch64(b, at.t2_offset, 64))
PATCH(p_beyond, patch64(b, at.t2_offset, (uint64_t)1 << 40))
PATCH(p_wrap, patch64(b, at.t2_offset, UINT64_MAX - 31))
PATCH(p_end, patch64(b, at.t2_offset, 160))
PATCH(p_dup_tensor, b->p[at.t2_name_byte] = 'a')
PATCH(p_key_nul, b->p[at.key0_byte] = 0)
PATCH(p_strarr_len, patch64(b, at.strarr_s1_len, 5000))
PATCH(p_strarr_count, patch64(b, at.strarr_count, 1000))
PATCH(p_nested_n, patch64(b, at.nested_inner_n, (uint64_t)1 << 62))
/* alignment 1 is legal GGUF, but the data section then starts right after the (odd-sized) infos */
PATCH(p_align1_odd, patch32(b, at.align_val, 1); patch64(b, at.t2_offset, 129))
PATCH(p_small, b->n = 10)
PATCH(p_empty, b->n = 0)
PATCH(p_none, (void)b)
#undef PATCH

static const bad_case cases[] = {
    {"bad_magic", V_BASE, p_magic, ENGINE_EFORMAT, "not a GGUF file"},
    {"version1", V_BASE, p_v1, ENGINE_EUNSUPPORTED, "version 1"},
    {"version4", V_BASE, p_v4, ENGINE_EFORMAT, "version 4"},
    {"big_endian", V_BASE, p_vbe, ENGINE_EFORMAT, "big-endian"},
    {"n_tensors_huge", V_BASE, p_ntensors_huge, ENGINE_EFORMAT, "tensor count"},
    {"n_tensors_cannot_fit", V_BASE, p_ntensors_fit, ENGINE_EFORMAT, "cannot fit"},
    {"n_kv_max", V_BASE, p_nkv_max, ENGINE_EFORMAT, "metadata count"},
    {"n_kv_one_more", V_BASE, p_nkv_more, ENGINE_EFORMAT, "tensor 0"}, /* infos read as a key */
    {"key_length_huge", V_BASE, p_keylen, ENGINE_EFORMAT, "key length"},
    {"string_past_eof", V_BASE, p_strlen, ENGINE_EFORMAT,
     "key 0 \"general.architecture\": string length"},
    {"array_count_huge", V_BASE, p_arrcount, ENGINE_EFORMAT, "key 2 \"t.ints\": array of"},
    {"array_type_unknown", V_BASE, p_arrtype, ENGINE_EFORMAT, "unknown element type 77"},
    {"array_type_wrong", V_BASE, p_arrtype_str, ENGINE_EFORMAT, "t.ints"},
    {"value_type_unknown", V_BASE, p_vtype, ENGINE_EFORMAT, "unknown value type 13"},
    {"bool_2", V_BASE, p_bool, ENGINE_EFORMAT, "neither 0 nor 1"},
    {"alignment_3", V_BASE, p_align3, ENGINE_EFORMAT, "general.alignment 3 is not a power of two"},
    {"alignment_0", V_BASE, p_align0, ENGINE_EFORMAT, "general.alignment 0"},
    {"alignment_huge", V_BASE, p_align_huge, ENGINE_EFORMAT, "general.alignment"},
    {"alignment_string", V_ALIGN_STR, p_none, ENGINE_EFORMAT,
     "general.alignment: expected uint32, found string"},
    {"n_dims_5", V_BASE, p_ndims5, ENGINE_EFORMAT, "tensor 0 \"a\": n_dims 5"},
    {"n_dims_0", V_BASE, p_ndims0, ENGINE_EFORMAT, "n_dims 0"},
    {"ne_zero", V_BASE, p_ne0_zero, ENGINE_EFORMAT, "ne[0] = 0"},
    {"ne_overflow", V_BASE, p_ne_overflow, ENGINE_EFORMAT,
     "tensor 1 \"b\": element count overflows"},
    {"ne_huge", V_BASE, p_ne_huge, ENGINE_EFORMAT, "ne[0]"},
    {"type_99", V_BASE, p_type99, ENGINE_EFORMAT, "unknown tensor type 99"},
    {"type_removed", V_BASE, p_type_removed, ENGINE_EFORMAT, "unknown tensor type 4"},
    {"partial_block", V_BASE, p_partial_block, ENGINE_EFORMAT,
     "not a multiple of the q8_0 block size"},
    {"misaligned_offset", V_BASE, p_misaligned, ENGINE_EFORMAT, "not a multiple of the alignment"},
    {"overlap", V_BASE, p_overlap, ENGINE_EFORMAT, "overlaps"},
    {"data_beyond_eof", V_BASE, p_beyond, ENGINE_EFORMAT,
     "tensor 2 \"c\": data offset 1099511627776 + size 32 beyond end of file"},
    {"offset_wraps", V_BASE, p_wrap, ENGINE_EFORMAT, "beyond end of file"},
    {"data_just_past_eof", V_BASE, p_end, ENGINE_EFORMAT, "beyond end of file"},
    {"duplicate_tensor", V_BASE, p_dup_tensor, ENGINE_EFORMAT, "duplicate tensor name"},
    {"duplicate_key", V_DUP_KEY, p_none, ENGINE_EFORMAT, "duplicate key"},
    {"nested_too_deep", V_DEEP, p_none, ENGINE_EFORMAT, "nested deeper"},
    {"empty_tensor_name", V_EMPTY_NAME, p_none, ENGINE_EFORMAT, "empty tensor name"},
    {"key_with_nul", V_BASE, p_key_nul, ENGINE_EFORMAT, "NUL"},
    {"string_array_elem_past_eof", V_BASE, p_strarr_len, ENGINE_EFORMAT, "array string length"},
    {"string_array_count", V_BASE, p_strarr_count, ENGINE_EFORMAT, "t.strs"},
    {"nested_count_huge", V_BASE, p_nested_n, ENGINE_EFORMAT, "t.nested"},
    {"misaligned_data", V_BASE, p_align1_odd, ENGINE_EUNSUPPORTED,
     "is not 4-byte aligned (general.alignment 1)"},
    {"too_small", V_BASE, p_small, ENGINE_EFORMAT, "too small"},
    {"empty_file", V_BASE, p_empty, ENGINE_EFORMAT, "too small"},
};

static void test_base(void) {
    buf b;
    build(&b, V_BASE);
    engine_gguf *g = NULL;
    char path[512];
    CHECK(open_bytes(&b, "base", &g, path, sizeof path) == 0, "base: %s", engine_error_last());
    if (!g) return;
    CHECK(engine_gguf_tensor_count(g) == 3 && engine_gguf_kv_count(g) == 7, "counts");
    const engine_gguf_tensor *a = engine_gguf_find_tensor(g, "a");
    float f[8];
    CHECK(a && engine_dequantize_row(a->type, a->data, f, 8) == 0 && f[0] == 1 && f[7] == 8,
          "tensor a data");
    const engine_gguf_tensor *c = engine_gguf_find_tensor(g, "c");
    CHECK(c && c->nbytes == 32 && ((const uint8_t *)c->data)[0] == 128, "tensor c data");
    const engine_gguf_value *v;
    CHECK(engine_gguf_get_arr(g, "t.nested", ENGINE_GGUF_ARRAY, &v) == 0 &&
              engine_gguf_arr_u64(&v->arr.vals[0], 0) == 7,
          "nested");
    CHECK(engine_gguf_data_offset(g) + 160 == engine_gguf_file_size(g), "data offset");
    engine_gguf_close(g);
    /* An unsupported but known type still loads (model info can describe it). */
    p_type_unsupported_ok(&b);
    CHECK(open_bytes(&b, "q4_1", &g, path, sizeof path) == 0, "q4_1 tensor: %s",
          engine_error_last());
    engine_gguf_close(g);
}

static void test_truncations(void) {
    buf b, t;
    build(&b, V_BASE);
    for (size_t len = 0; len < b.n; len++) {
        memcpy(t.p, b.p, len);
        t.n = len;
        engine_gguf *g = NULL;
        char path[512];
        const int rc = open_bytes(&t, "trunc", &g, path, sizeof path);
        CHECK(rc == ENGINE_EFORMAT && g == NULL, "truncated at %zu: rc %d", len, rc);
        CHECK(strstr(engine_error_last(), path) != NULL, "truncated at %zu: message %s", len,
              engine_error_last());
        engine_gguf_close(g);
    }
}

static void test_cases(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        buf b;
        build(&b, cases[i].variant);
        cases[i].patch(&b);
        engine_gguf *g = NULL;
        char path[512];
        const int rc = open_bytes(&b, cases[i].name, &g, path, sizeof path);
        const char *msg = engine_error_last();
        CHECK(rc == cases[i].code && g == NULL, "%s: rc %d, expected %d (%s)", cases[i].name, rc,
              cases[i].code, msg);
        CHECK(strstr(msg, path) != NULL, "%s: message does not name the file: %s", cases[i].name,
              msg);
        CHECK(strstr(msg, cases[i].needle) != NULL, "%s: message lacks \"%s\": %s", cases[i].name,
              cases[i].needle, msg);
        engine_gguf_close(g);
        unlink(path);
    }
}

static int write_file(const char *dir, const char *name, const buf *b) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    fwrite(b->p, 1, b->n, f);
    return fclose(f) != 0;
}

static int write_corpus(const char *dir) {
    buf b, t;
    int bad = 0;
    build(&b, V_BASE);
    bad |= write_file(dir, "base", &b);
    for (size_t len = 0; len < b.n; len += 23) {
        memcpy(t.p, b.p, len);
        t.n = len;
        char name[64];
        snprintf(name, sizeof name, "trunc_%04zu", len);
        bad |= write_file(dir, name, &t);
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        build(&b, cases[i].variant);
        cases[i].patch(&b);
        char name[96];
        snprintf(name, sizeof name, "%s", cases[i].name);
        bad |= write_file(dir, name, &b);
    }
    /* A writer-made file with every metadata type and every supported tensor type. */
    engine_gguf_writer *w;
    engine_gguf_writer_new(&w);
    engine_gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    engine_gguf_writer_set_u32(w, "qwen3moe.expert_count", 4);
    engine_gguf_writer_set_u32(w, "qwen3moe.expert_used_count", 2);
    engine_gguf_writer_set_i8(w, "t.i8", -1);
    engine_gguf_writer_set_u16(w, "t.u16", 7);
    engine_gguf_writer_set_i16(w, "t.i16", -7);
    engine_gguf_writer_set_i64(w, "t.i64", -7);
    engine_gguf_writer_set_u64(w, "t.u64", 7);
    engine_gguf_writer_set_f32(w, "t.f32", 0.5f);
    engine_gguf_writer_set_bool(w, "t.b", false);
    const char *toks[3] = {"a", "b", "<|im_end|>"};
    engine_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 3);
    engine_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    engine_gguf_writer_set_str(w, "tokenizer.chat_template", "{{ messages }}");
    const engine_type types[] = {ENGINE_TYPE_F32,  ENGINE_TYPE_F16,  ENGINE_TYPE_BF16,
                                 ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q4_0, ENGINE_TYPE_Q4_K,
                                 ENGINE_TYPE_Q5_K, ENGINE_TYPE_Q6_K};
    static uint8_t data[8][1024];
    for (int i = 0; i < 8; i++) {
        const int64_t ne[2] = {256, 1};
        float x[256];
        for (int k = 0; k < 256; k++)
            x[k] = (float)((k * 37 + i) % 19) - 9.0f;
        engine_quantize_row(types[i], x, data[i], 256);
        char name[64];
        snprintf(name, sizeof name, "blk.0.t%d.weight", i);
        engine_gguf_writer_add_tensor(w, name, types[i], 2, ne, data[i]);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/writer_all_types", dir);
    bad |= engine_gguf_writer_write(w, path, NULL, NULL, 1) != 0;
    engine_gguf_writer_free(w);
    return bad;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-corpus")) {
        mkdir(argv[2], 0755);
        if (write_corpus(argv[2])) {
            fprintf(stderr, "cannot write the corpus to %s\n", argv[2]);
            return 1;
        }
        return 0;
    }
    snprintf(tmpdir, sizeof tmpdir, "%s/spark_test_gguf_bad_XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_base();
    test_truncations();
    test_cases();
    char path[600];
    snprintf(path, sizeof path, "%s/base.gguf", tmpdir);
    unlink(path);
    snprintf(path, sizeof path, "%s/q4_1.gguf", tmpdir);
    unlink(path);
    snprintf(path, sizeof path, "%s/trunc.gguf", tmpdir);
    unlink(path);
    rmdir(tmpdir);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("test_gguf_malformed: ok (%zu crafted files, every truncation)\n",
           sizeof cases / sizeof cases[0]);
    return 0;
}
