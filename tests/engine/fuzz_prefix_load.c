/* Fuzz target: engine_prefix_load on arbitrary bytes, into the default model (the tiny preset,
 * generated on first use into the XDG cache) with a small prefix cache. Whatever the input, the
 * loader either refuses it (and the pool is exactly as before) or inserts a pinned prefix
 * (undone here with engine_prefix_unpin, so every input starts from the same pool). Seed corpus:
 * tests/fixtures/fuzz/prefix, written by `test_prefix_persist --write-corpus DIR` (files for the
 * default model, so a valid one reaches the insertion). Without an embedded tokenizer there is
 * no default model: the target then only exercises argument checks. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "kv/kv.h"
#include "model/model_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static engine_model *model;
static char path[64];
static int ready; /* 0: not tried, 1: model, -1: none */

static void setup(void) {
    char mp[4096];
    ready = -1;
    engine_log_set(NULL, NULL, ENGINE_LOG_NONE);
    if (engine_default_model_path(mp, sizeof mp) != 0) return;
    engine_model_params p = ENGINE_MODEL_PARAMS_INIT;
    p.n_threads = 1;
    p.n_ctx = 256;
    p.device = ENGINE_DEVICE_CPU;
    p.prefix_cache_bytes = 1u << 20; /* 32 blocks of the tiny model */
    if (engine_model_load(&model, mp, &p) != 0) return;
    snprintf(path, sizeof path, "/tmp/spark_fuzz_prefix_%d.kvp", (int)getpid());
    ready = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ready) setup();
    if (ready < 0) return 0;
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || w != size) return 0;
    engine_kv_stats before, after;
    engine_kv_cache_stats(model->kvc, &before);
    engine_prefix_info info;
    int rc = engine_prefix_load(model, path, NULL, 0, &info);
    engine_kv_cache_stats(model->kvc, &after);
    if (rc == 0) {
        if (info.n_tokens <= 0 || after.n_pinned < info.n_blocks) abort();
        /* the tokens the file holds are what to unpin: they follow the 128-byte header */
        if (size < ENGINE_KV_PERSIST_HEADER_BYTES + (size_t)info.n_tokens * 4) abort();
        int32_t *toks = malloc((size_t)info.n_tokens * sizeof *toks);
        if (!toks) abort();
        memcpy(toks, data + ENGINE_KV_PERSIST_HEADER_BYTES, (size_t)info.n_tokens * 4);
        if (engine_prefix_unpin(model, toks, (size_t)info.n_tokens) != 0) abort();
        free(toks);
    } else {
        if (!engine_error_last()[0]) abort(); /* every refusal says why */
        /* (ENGINE_ENOMEM may have evicted unpinned cached blocks in its attempt) */
        if (rc != ENGINE_ENOMEM && (before.n_free != after.n_free || before.n_nodes != after.n_nodes ||
            before.n_pinned != after.n_pinned || before.n_used != after.n_used))
            abort(); /* a refused file changed the pool */
    }
    unlink(path);
    return 0;
}
