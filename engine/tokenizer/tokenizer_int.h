/* Internals shared by the tokenizer's files (private). */
#ifndef SPARK_ENGINE_TOKENIZER_INT_H
#define SPARK_ENGINE_TOKENIZER_INT_H

#include "tokenizer.h"

/* One slot of the merge table: 16 bytes, so a probe touches one cache line. */
typedef struct {
    uint64_t key;   /* left id << 32 | right id */
    int32_t rank;
    int32_t res;    /* merged id; -1 marks an empty slot */
} engine_tok_merge;

struct engine_tokenizer {
    int32_t n_vocab;
    bool pre_qwen35;      /* pre-tokenizer: "qwen35" (else "qwen2") */
    char *bytes;          /* raw bytes of every token, back to back */
    size_t *off;          /* [n_vocab + 1] token i = bytes[off[i] .. off[i+1]) */
    uint8_t *types;       /* [n_vocab] engine_token_type */
    uint8_t *eog;         /* [n_vocab] end-of-generation flags */
    size_t max_token_len;

    int32_t *vhash;       /* open addressing over NORMAL tokens' raw bytes -> id, -1 empty */
    uint32_t vmask;

    engine_tok_merge *merges; /* open addressing: (left id << 32 | right id) -> rank, result */
    uint32_t mmask;

    int32_t byte_id[256]; /* the token of each single byte */

    int32_t *added;       /* added token ids (CONTROL, USER_DEFINED), by first byte, longest
                             first */
    uint32_t n_added;
    uint32_t added_start[257]; /* added[added_start[b] .. added_start[b+1]) start with byte b */

    int32_t bos, eos, pad;
    char *chat_template;
};

/* The end of the Qwen2 pre-tokenizer match that starts at s[i] (s[0..n) is valid UTF-8,
 * i < n); the same for the Qwen3.5 variant (pre "qwen35": marks in the letter runs). */
size_t engine_pretok_qwen2_next(const unsigned char *s, size_t n, size_t i);
size_t engine_pretok_qwen35_next(const unsigned char *s, size_t n, size_t i);

/* 64-bit FNV-1a style hash used by the tables. */
static inline uint32_t engine_tok_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return (uint32_t)(h ^ (h >> 32));
}

#endif
