/* Unicode data for the tokenizer (private): class bits per code point and NFC normalisation.
 * The tables (unicode_tables.c) are generated from node by gen_unicode_tables.js so that they
 * follow the Unicode version of the reference tokenizer's JavaScript engine. */
#ifndef SPARK_ENGINE_TOKENIZER_UNICODE_H
#define SPARK_ENGINE_TOKENIZER_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum {
    ENGINE_UC_L = 1,          /* \p{L} */
    ENGINE_UC_N = 2,          /* \p{N} */
    ENGINE_UC_WS = 4,         /* \p{White_Space} */
    ENGINE_UC_NFC_UNSAFE = 8, /* may change under NFC: not NFC-stable alone, a non-zero
                                 combining class, or the second half of a composition */
    ENGINE_UC_DECOMP = 16,    /* has a canonical decomposition (Hangul syllables excluded) */
    ENGINE_UC_M = 32,         /* \p{M} (marks: Mn, Mc, Me), for the qwen35 pre-tokenizer */
};

typedef struct { uint32_t cp; uint8_t rank; } engine_unicode_ccc;           /* rank ~ ccc order */
typedef struct { uint32_t cp; uint16_t off, len; } engine_unicode_decomp;   /* full NFD */
typedef struct { uint32_t first, second, composite; } engine_unicode_pair;

extern const char engine_unicode_version[];
extern const uint16_t engine_unicode_stage1[0x110000 / 256];
extern const uint8_t engine_unicode_stage2[][256];
extern const engine_unicode_ccc engine_unicode_ccc_table[];
extern const size_t engine_unicode_ccc_count;
extern const uint32_t engine_unicode_decomp_pool[];
extern const engine_unicode_decomp engine_unicode_decomp_table[];
extern const size_t engine_unicode_decomp_count;
extern const engine_unicode_pair engine_unicode_pair_table[];
extern const size_t engine_unicode_pair_count;

/* Class bits of code point cp (0 for cp > 0x10FFFF). */
static inline uint8_t engine_unicode_class(uint32_t cp) {
    if (cp >= 0x110000) return 0;
    return engine_unicode_stage2[engine_unicode_stage1[cp >> 8]][cp & 255];
}

/* Decode one code point from valid UTF-8 at s (n > 0 bytes available); returns its length. The
 * caller guarantees validity (see engine_utf8_sanitize). */
static inline size_t engine_utf8_next(const unsigned char *s, uint32_t *cp) {
    unsigned char c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xE0) { *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F); return 2; }
    if (c < 0xF0) {
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
          ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

/* Encode cp (a scalar value) as UTF-8 into out[4]; returns the length. */
size_t engine_utf8_put(uint32_t cp, unsigned char *out);

/* Length of the longest prefix of s[0..n) that could still be part of one well-formed UTF-8
 * character: returns k > 0 and sets *complete when s starts with a whole valid character of k
 * bytes; returns k > 0 with *complete false when the k bytes are a valid but unfinished prefix
 * that ends at n; returns the length of the maximal ill-formed subpart (>= 1) with *complete
 * false and *invalid true otherwise. n must be > 0. */
size_t engine_utf8_scan(const unsigned char *s, size_t n, int *complete, int *invalid);

/* Replace every maximal ill-formed subpart of s[0..n) by U+FFFD (WHATWG decoding). Returns 0 and
 * *out = NULL when s is already valid UTF-8, else 0 with *out a malloc'ed copy (*out_len bytes),
 * or -1 when out of memory. */
int engine_utf8_sanitize(const char *s, size_t n, char **out, size_t *out_len);

/* NFC-normalise the valid UTF-8 s[0..n). Returns 0 and *out = NULL when s is already NFC (the
 * common case, found without allocating), else 0 with *out a malloc'ed result, -1 on ENOMEM. */
int engine_unicode_nfc(const char *s, size_t n, char **out, size_t *out_len);

#endif
