/*
 * gguf.h - GGUF v3 model files: a hostile-input reader and a streaming writer.
 * Private to engine/ (and the `model info` command); not part of the public door engine.h.
 *
 * File layout (little-endian throughout):
 *   magic "GGUF" | u32 version (3; 2 is accepted too) | u64 n_tensors | u64 n_kv
 *   n_kv x { string key | u32 value type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 tensor type | u64 offset }
 *   padding to `general.alignment` (default 32) | data section (each tensor at its offset,
 *   relative to the start of the data section, a multiple of the alignment)
 *   string = u64 length + bytes (no NUL); array = u32 element type + u64 count + elements.
 *
 * Reader limits (anything beyond them is ENGINE_EFORMAT, checked before any allocation):
 *   n_tensors <= ENGINE_GGUF_MAX_TENSORS, n_kv <= ENGINE_GGUF_MAX_KV, n_dims <= 4 (GGUF's own
 *   maximum), every ne[i] >= 1 (a zero-size dimension is rejected) and the element count
 *   <= 2^62 without overflow, key and tensor-name length <= ENGINE_GGUF_MAX_NAME, nested
 *   arrays <= ENGINE_GGUF_MAX_DEPTH levels, alignment a power of two in [1, 2^20], and every
 *   count or length is also bounded by the bytes left in the file. Tensor data must lie inside
 *   the file, start at an aligned offset, and not overlap another tensor. Duplicate keys and
 *   duplicate tensor names are errors. The CPU kernels read f32/f16 values and block scales in
 *   place, so tensor data must also start at a file offset that is a multiple of
 *   ENGINE_GGUF_DATA_ALIGN (4); every real writer aligns to 32, and a file that does not is
 *   refused with ENGINE_EUNSUPPORTED rather than read misaligned.
 *
 * Errors follow the engine's convention (0 or a negative ENGINE_E*, detail in
 * engine_error_last()); a format error names the file and the field, e.g.
 *   model.gguf: tensor 12 "blk.0.attn_q.weight": data offset 123 + size 456 beyond end of
 *   file (789 bytes)
 *
 * Only little-endian hosts are supported (x86-64, arm64); the reader refuses big-endian files.
 */
#ifndef SPARK_ENGINE_GGUF_H
#define SPARK_ENGINE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ENGINE_GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define ENGINE_GGUF_VERSION 3
#define ENGINE_GGUF_DEFAULT_ALIGNMENT 32
#define ENGINE_GGUF_MAX_TENSORS (1u << 20) /* 1M tensors: a 1T-parameter model has ~100k */
#define ENGINE_GGUF_MAX_KV (1u << 20)
#define ENGINE_GGUF_MAX_DIMS 4
#define ENGINE_GGUF_MAX_NAME 65535 /* bytes in a key or a tensor name */
#define ENGINE_GGUF_MAX_DEPTH 8    /* array of array of ... */
#define ENGINE_GGUF_DATA_ALIGN 4   /* tensor data file offsets: a multiple of this */

/* Metadata value types (GGUF numbering). */
typedef enum {
    ENGINE_GGUF_UINT8 = 0,
    ENGINE_GGUF_INT8 = 1,
    ENGINE_GGUF_UINT16 = 2,
    ENGINE_GGUF_INT16 = 3,
    ENGINE_GGUF_UINT32 = 4,
    ENGINE_GGUF_INT32 = 5,
    ENGINE_GGUF_FLOAT32 = 6,
    ENGINE_GGUF_BOOL = 7,
    ENGINE_GGUF_STRING = 8,
    ENGINE_GGUF_ARRAY = 9,
    ENGINE_GGUF_UINT64 = 10,
    ENGINE_GGUF_INT64 = 11,
    ENGINE_GGUF_FLOAT64 = 12,
    ENGINE_GGUF_TYPE_COUNT = 13,
} engine_gguf_type;

/* Tensor types with ggml's numbering. The reader knows the block layout of every type ggml
 * defines (so `model info` can describe any file); the CPU kernels support the ones that
 * engine_type_traits_get(t)->supported says (cpu/quant.h). Q8_K is only used internally for
 * activations. Gaps in the numbering are types ggml removed. */
typedef enum {
    ENGINE_TYPE_F32 = 0,
    ENGINE_TYPE_F16 = 1,
    ENGINE_TYPE_Q4_0 = 2,
    ENGINE_TYPE_Q4_1 = 3,
    ENGINE_TYPE_Q5_0 = 6,
    ENGINE_TYPE_Q5_1 = 7,
    ENGINE_TYPE_Q8_0 = 8,
    ENGINE_TYPE_Q8_1 = 9,
    ENGINE_TYPE_Q2_K = 10,
    ENGINE_TYPE_Q3_K = 11,
    ENGINE_TYPE_Q4_K = 12,
    ENGINE_TYPE_Q5_K = 13,
    ENGINE_TYPE_Q6_K = 14,
    ENGINE_TYPE_Q8_K = 15,
    ENGINE_TYPE_IQ2_XXS = 16,
    ENGINE_TYPE_IQ2_XS = 17,
    ENGINE_TYPE_IQ3_XXS = 18,
    ENGINE_TYPE_IQ1_S = 19,
    ENGINE_TYPE_IQ4_NL = 20,
    ENGINE_TYPE_IQ3_S = 21,
    ENGINE_TYPE_IQ2_S = 22,
    ENGINE_TYPE_IQ4_XS = 23,
    ENGINE_TYPE_I8 = 24,
    ENGINE_TYPE_I16 = 25,
    ENGINE_TYPE_I32 = 26,
    ENGINE_TYPE_I64 = 27,
    ENGINE_TYPE_F64 = 28,
    ENGINE_TYPE_IQ1_M = 29,
    ENGINE_TYPE_BF16 = 30,
    ENGINE_TYPE_TQ1_0 = 34,
    ENGINE_TYPE_TQ2_0 = 35,
    ENGINE_TYPE_MXFP4 = 39,
    ENGINE_TYPE_COUNT = 40, /* one past the largest number; not every value below is a type */
} engine_type;

/* A string inside the mapping: NOT NUL-terminated. Print with "%.*s", (int)s.len, s.ptr. */
typedef struct {
    const char *ptr;
    size_t len;
} engine_gguf_str;

/* A metadata value. Scalars are decoded; arrays point into the mapping. */
typedef struct engine_gguf_value {
    engine_gguf_type type;
    union {
        uint64_t u64;        /* UINT8, UINT16, UINT32, UINT64 (zero-extended) */
        int64_t i64;         /* INT8, INT16, INT32, INT64 (sign-extended) */
        double f64;          /* FLOAT32, FLOAT64 (FLOAT32 widened exactly) */
        bool b;              /* BOOL (any non-zero byte is an error: GGUF bools are 0 or 1) */
        engine_gguf_str str; /* STRING */
        struct {
            engine_gguf_type type; /* element type */
            uint64_t n;            /* element count */
            /* Scalar elements: the packed little-endian elements in the mapping. The pointer
             * may be unaligned: read them with engine_gguf_arr_*() below, not by casting. */
            const void *data;
            /* STRING elements: n views (allocated by the reader, owned by the file). */
            const engine_gguf_str *strs;
            /* ARRAY elements (nested arrays): n values, owned by the file. */
            const struct engine_gguf_value *vals;
        } arr;
    };
} engine_gguf_value;

typedef struct {
    const char *key; /* NUL-terminated copy, owned by the file */
    engine_gguf_value value;
} engine_gguf_kv;

typedef struct {
    const char *name; /* NUL-terminated copy, owned by the file */
    engine_type type;
    int n_dims;                       /* 1..4 */
    int64_t ne[ENGINE_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused = 1 */
    int64_t n_elements;               /* product of ne[] */
    uint64_t offset;                  /* relative to the data section */
    size_t nbytes;
    const void *data; /* into the read-only mapping (zero-copy); valid until close */
} engine_gguf_tensor;

typedef struct engine_gguf engine_gguf;

/* ---------------------------------------------------------------------------------------------
 * Reader
 * ------------------------------------------------------------------------------------------- */

/* Open and validate `path`: map it read-only (MAP_PRIVATE), parse header, metadata and tensor
 * infos, and check every tensor's data range. On success *out owns the mapping (close with
 * engine_gguf_close). Errors: ENGINE_EIO (open/stat/mmap), ENGINE_EFORMAT (malformed, with the
 * file and field named), ENGINE_ENOMEM. Thread-safety: a successfully opened file is immutable;
 * any number of threads may read it concurrently. */
int engine_gguf_open(engine_gguf **out, const char *path);

/* Unmap and free everything; every pointer obtained from `g` becomes invalid. NULL: no-op. */
void engine_gguf_close(engine_gguf *g);

const char *engine_gguf_path(const engine_gguf *g); /* as given to open */
uint32_t engine_gguf_version(const engine_gguf *g);
uint64_t engine_gguf_file_size(const engine_gguf *g);
size_t engine_gguf_alignment(const engine_gguf *g);
uint64_t engine_gguf_data_offset(const engine_gguf *g); /* start of the data section */
const void *engine_gguf_map(const engine_gguf *g);      /* the whole mapped file */

/* Metadata. Keys are unique; lookups are hashed. */
int64_t engine_gguf_kv_count(const engine_gguf *g);
const engine_gguf_kv *engine_gguf_kv_at(const engine_gguf *g, int64_t i); /* NULL: out of range */
const engine_gguf_kv *engine_gguf_find_key(const engine_gguf *g,
                                           const char *key); /* NULL: absent */

/* Typed getters. Missing key: ENGINE_EFORMAT "FILE: missing key KEY". Wrong type:
 * ENGINE_EFORMAT naming the key, the expected and the actual type. Integer getters accept any
 * integer type whose value fits the requested one (files disagree on u32 vs u64 for counts);
 * a value out of range is an error. get_f32 accepts FLOAT32 and FLOAT64. `*out` is written only
 * on success. */
int engine_gguf_get_u32(const engine_gguf *g, const char *key, uint32_t *out);
int engine_gguf_get_i32(const engine_gguf *g, const char *key, int32_t *out);
int engine_gguf_get_u64(const engine_gguf *g, const char *key, uint64_t *out);
int engine_gguf_get_f32(const engine_gguf *g, const char *key, float *out);
int engine_gguf_get_bool(const engine_gguf *g, const char *key, bool *out);
int engine_gguf_get_str(const engine_gguf *g, const char *key, engine_gguf_str *out);
/* An array whose element type is `elem_type` (or any element type when elem_type < 0). */
int engine_gguf_get_arr(const engine_gguf *g, const char *key, int elem_type,
                        const engine_gguf_value **out);

/* Element i of a scalar array, converted. No bounds or type checks beyond an assertion: check
 * v->arr.type and v->arr.n first. */
int64_t engine_gguf_arr_i64(const engine_gguf_value *v, uint64_t i);  /* integer/bool elements */
uint64_t engine_gguf_arr_u64(const engine_gguf_value *v, uint64_t i); /* integer/bool elements */
double engine_gguf_arr_f64(const engine_gguf_value *v, uint64_t i);   /* any numeric element */

/* Static names: "uint32", "array", ...; "?" for an unknown value. */
const char *engine_gguf_type_name(int type);

/* Bytes of one scalar value of `type` (BOOL: 1); 0 for STRING, ARRAY and unknown types. */
size_t engine_gguf_scalar_size(int type);

/* The hash the reader and the writer use for key and tensor-name tables (64-bit FNV-1a). */
uint64_t engine_gguf_hash(const char *s);

/* Tensors, in file order; lookup by name is hashed. */
int64_t engine_gguf_tensor_count(const engine_gguf *g);
const engine_gguf_tensor *engine_gguf_tensor_at(const engine_gguf *g, int64_t i); /* NULL: range */
const engine_gguf_tensor *engine_gguf_find_tensor(const engine_gguf *g, const char *name);
/* Index of the named tensor, or -1. */
int64_t engine_gguf_find_tensor_index(const engine_gguf *g, const char *name);

/* ---------------------------------------------------------------------------------------------
 * Writer (gguf_write.c)
 *
 * Build the metadata and the tensor list in memory, then write the file in one of two ways:
 *
 *  1. engine_gguf_writer_write(w, path, fill, user, n_threads): simple. Tensors added with a
 *     data pointer are copied; for tensors added with data == NULL the writer calls
 *     fill(tensor_index, dst, nbytes, user) to produce the bytes in place. With n_threads > 1
 *     the writer runs fill on that many threads, each on whole, distinct tensors (so fill must
 *     be thread-safe across tensors; one call per tensor).
 *
 *  2. begin / tensor_data / commit, for a caller with its own thread pool:
 *       engine_gguf_out *o; engine_gguf_writer_begin(w, path, &o);
 *       ... any threads: memcpy or generate into engine_gguf_out_tensor_data(o, i) ...
 *       engine_gguf_out_commit(o);   (or engine_gguf_out_abort(o) on failure)
 *     begin creates "path.tmp", sizes it with ftruncate (holes read as zero, so the alignment
 *     padding costs nothing), maps it writable (MAP_SHARED), and writes the header. Each
 *     tensor's destination is a disjoint range, so threads may fill different tensors (or
 *     different rows of one tensor) concurrently without locking. commit unmaps, closes and
 *     renames path.tmp to path atomically; abort unlinks path.tmp. Data pages are not fsynced:
 *     the rename guarantees readers see a complete file or none, not durability across a crash.
 *
 * The writer object may be freed once begin returned; it is not thread-safe itself (build it
 * from one thread). Keys are unique (setting a key again replaces its value); tensor names
 * are unique. Tensor offsets are assigned in add order, each aligned to general.alignment
 * (set it with set_u32 before begin; default 32; a power of two >= ENGINE_GGUF_DATA_ALIGN).
 * ------------------------------------------------------------------------------------------- */
typedef struct engine_gguf_writer engine_gguf_writer;
typedef struct engine_gguf_out engine_gguf_out;

/* Produce tensor `tensor_index`'s nbytes bytes at dst. Return 0 or a negative ENGINE_E* (after
 * engine_err); the write then fails with that code. */
typedef int (*engine_gguf_fill_fn)(int64_t tensor_index, void *dst, size_t nbytes, void *user);

int engine_gguf_writer_new(engine_gguf_writer **out);
void engine_gguf_writer_free(engine_gguf_writer *w);

/* Scalars. Copies the key and value. */
int engine_gguf_writer_set_u8(engine_gguf_writer *w, const char *key, uint8_t v);
int engine_gguf_writer_set_i8(engine_gguf_writer *w, const char *key, int8_t v);
int engine_gguf_writer_set_u16(engine_gguf_writer *w, const char *key, uint16_t v);
int engine_gguf_writer_set_i16(engine_gguf_writer *w, const char *key, int16_t v);
int engine_gguf_writer_set_u32(engine_gguf_writer *w, const char *key, uint32_t v);
int engine_gguf_writer_set_i32(engine_gguf_writer *w, const char *key, int32_t v);
int engine_gguf_writer_set_u64(engine_gguf_writer *w, const char *key, uint64_t v);
int engine_gguf_writer_set_i64(engine_gguf_writer *w, const char *key, int64_t v);
int engine_gguf_writer_set_f32(engine_gguf_writer *w, const char *key, float v);
int engine_gguf_writer_set_f64(engine_gguf_writer *w, const char *key, double v);
int engine_gguf_writer_set_bool(engine_gguf_writer *w, const char *key, bool v);
int engine_gguf_writer_set_str(engine_gguf_writer *w, const char *key, const char *s);
int engine_gguf_writer_set_strn(engine_gguf_writer *w, const char *key, const char *s, size_t n);
/* Array of scalars: `data` holds n elements of `elem_type` in native (little-endian) layout;
 * BOOL elements are one byte each. Copied. */
int engine_gguf_writer_set_arr(engine_gguf_writer *w, const char *key, engine_gguf_type elem_type,
                               const void *data, uint64_t n);
/* Array of strings: n NUL-terminated strings (lens == NULL) or n byte strings with lengths. */
int engine_gguf_writer_set_arr_str(engine_gguf_writer *w, const char *key, const char *const *strs,
                                   const size_t *lens, uint64_t n);
/* Any value, including nested arrays, given as a reader-style value tree (arrays of scalars in
 * arr.data, arrays of strings in arr.strs, nested arrays in arr.vals). Deep-copied. */
int engine_gguf_writer_set_value(engine_gguf_writer *w, const char *key,
                                 const engine_gguf_value *v);

/* Add a tensor: n_dims in 1..4, ne[0] a multiple of the type's block size. `data` (nbytes
 * bytes, borrowed until the file is written) or NULL to fill it later. Returns the index >= 0
 * or a negative error. */
int64_t engine_gguf_writer_add_tensor(engine_gguf_writer *w, const char *name, engine_type type,
                                      int n_dims, const int64_t *ne, const void *data);
int64_t engine_gguf_writer_tensor_count(const engine_gguf_writer *w);
size_t engine_gguf_writer_tensor_nbytes(const engine_gguf_writer *w, int64_t i);

/* Write everything in one call (see above). fill may be NULL when every tensor has data. */
int engine_gguf_writer_write(engine_gguf_writer *w, const char *path, engine_gguf_fill_fn fill,
                             void *user, int n_threads);

/* Two-phase writing (see above). */
int engine_gguf_writer_begin(engine_gguf_writer *w, const char *path, engine_gguf_out **out);
void *engine_gguf_out_tensor_data(engine_gguf_out *o, int64_t i); /* NULL: out of range */
size_t engine_gguf_out_tensor_nbytes(const engine_gguf_out *o, int64_t i);
int64_t engine_gguf_out_tensor_count(const engine_gguf_out *o);
int engine_gguf_out_commit(engine_gguf_out *o); /* frees o, also on failure */
void engine_gguf_out_abort(engine_gguf_out *o); /* frees o; NULL: no-op */

#ifdef __cplusplus
}
#endif
#endif /* SPARK_ENGINE_GGUF_H */
