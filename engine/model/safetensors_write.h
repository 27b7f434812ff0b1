/*
 * safetensors_write.h - writing Hugging Face safetensors files (private to engine/).
 *
 * Format: u64 little-endian header length N | N bytes of JSON header | data. The header maps
 * each tensor name to {"dtype", "shape" (torch order: outermost first), "data_offsets":
 * [begin, end)} relative to the data start, plus an optional "__metadata__" object of string
 * values. The reference loader requires the tensors to cover the data without gaps or
 * overlaps, so tensors are laid out back to back in add order; the header is padded with
 * spaces to a multiple of 8 bytes so that every tensor of an 8-byte-or-smaller dtype is
 * aligned in the file.
 *
 * Writing mirrors the GGUF writer's two-phase mode: describe the tensors, begin (creates
 * "path.tmp", sizes it, maps it writable, writes the header), let any number of threads fill
 * disjoint tensor ranges through engine_st_out_tensor_data(), then commit (unmap, rename to
 * path) or abort (unlink). The writer itself is not thread-safe; the out object's data
 * pointers may be written concurrently.
 */
#ifndef SPARK_ENGINE_SAFETENSORS_WRITE_H
#define SPARK_ENGINE_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    ENGINE_ST_F32 = 0, /* "F32" */
    ENGINE_ST_F16 = 1, /* "F16" */
    ENGINE_ST_BF16 = 2,/* "BF16" */
} engine_st_dtype;

typedef struct engine_st_writer engine_st_writer;
typedef struct engine_st_out engine_st_out;

int engine_st_writer_new(engine_st_writer **out);
void engine_st_writer_free(engine_st_writer *w); /* NULL: no-op */

/* A "__metadata__" entry (both strings copied; JSON-escaped on output). */
int engine_st_writer_set_meta(engine_st_writer *w, const char *key, const char *value);

/* Add a tensor: name (unique, copied), dtype, shape in torch order (n_dims 1..8, each >= 1).
 * Returns its index >= 0 or a negative ENGINE_E*. */
int64_t engine_st_writer_add(engine_st_writer *w, const char *name, engine_st_dtype dtype,
                             int n_dims, const int64_t *shape);

/* Byte offset of tensor i from the start of the data section, and its size. */
uint64_t engine_st_writer_offset(const engine_st_writer *w, int64_t i);
uint64_t engine_st_writer_nbytes(const engine_st_writer *w, int64_t i);

/* Phase two (see above). The writer may be freed after begin. */
int engine_st_writer_begin(engine_st_writer *w, const char *path, engine_st_out **out);
/* Start of the data section (tensor 0); tensor i is at that + engine_st_writer_offset(i). */
void *engine_st_out_data(engine_st_out *o);
int engine_st_out_commit(engine_st_out *o); /* frees o, also on failure */
void engine_st_out_abort(engine_st_out *o); /* frees o; NULL: no-op */

#endif
