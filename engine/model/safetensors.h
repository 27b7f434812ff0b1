/*
 * safetensors.h - reading Hugging Face safetensors checkpoints (private to engine/).
 *
 * A checkpoint directory holds model.safetensors, or model.safetensors.index.json whose
 * "weight_map" names the shards. Each file: u64 little-endian header length N | N bytes of JSON
 * {name: {"dtype", "shape" (torch order), "data_offsets": [begin, end)}, "__metadata__": {...}}
 * | data. Files are mapped read-only; tensors point into the mappings (zero copy) and stay valid
 * until engine_st_close. Every offset, shape and size is checked against the file (hostile input
 * gets ENGINE_EFORMAT naming the file and tensor, never a crash): data_offsets inside the data
 * section, shape product x dtype size == end - begin, at most 8 dimensions, names unique.
 * Tensor dtypes the CPU kernels read in place are F32, F16 and BF16; others (I8, F8_E4M3, ...)
 * are listed with type -1 and refused by the caller that needs them.
 */
#ifndef SPARK_ENGINE_SAFETENSORS_H
#define SPARK_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h" /* engine_type */

#define ENGINE_ST_MAX_DIMS 8

typedef struct {
    const char *name; /* NUL-terminated, owned by the checkpoint */
    int type;         /* ENGINE_TYPE_F32/F16/BF16, or -1 for other dtypes */
    char dtype[16];   /* as written ("BF16") */
    int n_dims;
    int64_t shape[ENGINE_ST_MAX_DIMS]; /* torch order: shape[n_dims - 1] is contiguous */
    int64_t n_elements;
    const void *data;
    size_t nbytes;
} engine_st_tensor;

typedef struct engine_st engine_st;

/* Open the checkpoint in directory dir (single file or sharded). ENGINE_EIO, ENGINE_EFORMAT,
 * ENGINE_ENOMEM with the file named in the message. */
int engine_st_open(engine_st **out, const char *dir);
void engine_st_close(engine_st *st); /* NULL: no-op */

/* Parse one file's bytes (as mapped) into st's tensor list; `name` labels errors. Exposed for
 * the fuzz target; buf must outlive st. */
int engine_st_parse(engine_st *st, const uint8_t *buf, size_t len, const char *name);
/* An empty checkpoint to parse buffers into (the fuzz target). */
int engine_st_new(engine_st **out);

int64_t engine_st_count(const engine_st *st);
const engine_st_tensor *engine_st_at(const engine_st *st, int64_t i);
/* The tensor called name, or NULL. */
const engine_st_tensor *engine_st_find(const engine_st *st, const char *name);
/* Bytes of all tensors, and of those of each engine type (for `model info`). */
uint64_t engine_st_bytes(const engine_st *st);

/* A whole (small) text file, NUL-terminated (malloc'd, the caller frees), *len its length;
 * NULL when it cannot be read or exceeds 64 MiB. */
char *engine_st_read_text(const char *path, size_t *len);

#endif
