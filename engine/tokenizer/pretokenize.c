/* The Qwen2 pre-tokenizer regex, matched by hand:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+
 * and its Qwen3.5 variant ("qwen35"), where marks join the letter runs and leave the others:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|
 *    ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * The optional prefix of the letter run still admits a mark, but that changes no match: a mark
 * there is itself the start of an [\p{L}\p{M}]+ run that ends at the same place. So both are
 * one matcher with the letter class a parameter (\p{L}, or \p{L} | \p{M}). With the
 * reference's semantics: alternatives tried in order at each position (leftmost
 * first, backtracking), \s = White_Space, (?i:) folding ASCII only. Every position matches one
 * alternative, so consecutive matches tile the text. */
#include "tokenizer_int.h"
#include "unicode.h"

static inline uint8_t cls_at(const unsigned char *s, size_t i, size_t *len, uint32_t *cp) {
    if (s[i] < 0x80) {
        *len = 1;
        *cp = s[i];
    } else {
        *len = engine_utf8_next(s + i, cp);
    }
    return engine_unicode_class(*cp);
}

static inline int lower(unsigned char c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

static inline size_t pretok_next(const unsigned char *s, size_t n, size_t i, uint8_t letter) {
    size_t l0, l1;
    uint32_t c0, c1;
    uint8_t k0 = cls_at(s, i, &l0, &c0);

    /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (c0 == '\'' && i + 1 < n) {
        int a = lower(s[i + 1]);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n) {
            int b = lower(s[i + 2]);
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
                return i + 3;
        }
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    {
        size_t j = 0;
        if (k0 & letter) {
            j = i + l0;
        } else if (c0 != '\r' && c0 != '\n' && !(k0 & (ENGINE_UC_L | ENGINE_UC_N)) &&
                   i + l0 < n && (cls_at(s, i + l0, &l1, &c1) & letter)) {
            j = i + l0 + l1;
        }
        if (j) {
            while (j < n && (cls_at(s, j, &l1, &c1) & letter)) j += l1;
            return j;
        }
    }
    /* \p{N} */
    if (k0 & ENGINE_UC_N) return i + l0;
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    {
        size_t j = i;
        if (c0 == ' ') j = i + 1;
        const uint8_t other = ENGINE_UC_WS | letter | ENGINE_UC_N;
        if (j < n && !(cls_at(s, j, &l1, &c1) & other)) {
            j += l1;
            while (j < n && !(cls_at(s, j, &l1, &c1) & other)) j += l1;
            while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
            return j;
        }
    }
    /* k0 must be whitespace now: every other class matched above */
    size_t end = i, last_nl = n, last_start = i;
    while (end < n) {
        uint32_t c;
        size_t l;
        if (!(cls_at(s, end, &l, &c) & ENGINE_UC_WS)) break;
        if (c == '\r' || c == '\n') last_nl = end;
        last_start = end;
        end += l;
    }
    if (end == i) return i + l0; /* unreachable for well-formed tables; never stall */
    /* \s*[\r\n]+ : up to and including the last CR/LF of the run */
    if (last_nl != n) return last_nl + 1;
    /* \s+(?!\S) */
    if (end == n) return end;
    if (last_start > i) return last_start;
    /* \s+ */
    return end;
}

size_t engine_pretok_qwen2_next(const unsigned char *s, size_t n, size_t i) {
    return pretok_next(s, n, i, ENGINE_UC_L);
}

size_t engine_pretok_qwen35_next(const unsigned char *s, size_t n, size_t i) {
    return pretok_next(s, n, i, ENGINE_UC_L | ENGINE_UC_M);
}
