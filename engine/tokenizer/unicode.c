/* UTF-8 helpers and NFC normalisation over the generated tables (unicode_tables.c). */
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

size_t engine_utf8_put(uint32_t cp, unsigned char *out) {
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t engine_utf8_scan(const unsigned char *s, size_t n, int *complete, int *invalid) {
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    *complete = 0;
    *invalid = 0;
    if (c < 0x80) {
        *complete = 1;
        return 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *invalid = 1;
        return 1;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) return i; /* valid so far, unfinished */
        if (s[i] < lo || s[i] > hi) {
            *invalid = 1;
            return i;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    *complete = 1;
    return need + 1;
}

int engine_utf8_sanitize(const char *s, size_t n, char **out, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    int complete, invalid;
    *out = NULL;
    *out_len = 0;
    /* find the first problem; valid input (the common case) allocates nothing */
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = engine_utf8_scan(u + i, n - i, &complete, &invalid);
        if (!complete) break;
        i += k;
    }
    if (i == n) return 0;
    /* each ill-formed subpart of >= 1 byte becomes 3 bytes */
    if (n > (SIZE_MAX - 1) / 3) return -1;
    unsigned char *o = malloc(n * 3 + 1);
    if (!o) return -1;
    memcpy(o, u, i);
    size_t w = i;
    while (i < n) {
        size_t k = engine_utf8_scan(u + i, n - i, &complete, &invalid);
        if (complete) {
            memcpy(o + w, u + i, k);
            w += k;
        } else {
            /* ill-formed subpart, or an unfinished sequence cut by the end of input */
            o[w++] = 0xEF;
            o[w++] = 0xBF;
            o[w++] = 0xBD;
        }
        i += k;
    }
    o[w] = 0;
    *out = (char *)o;
    *out_len = w;
    return 0;
}

/* ---- NFC --------------------------------------------------------------------------------- */

#define NFC_MIN(a, b) ((a) < (b) ? (a) : (b))

enum { HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7,
       HANGUL_LN = 19, HANGUL_VN = 21, HANGUL_TN = 28, HANGUL_NN = 21 * 28, HANGUL_SN = 11172 };

static uint8_t ccc_rank(uint32_t cp) {
    size_t lo = 0, hi = engine_unicode_ccc_count;
    if (!(engine_unicode_class(cp) & ENGINE_UC_NFC_UNSAFE)) return 0;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t m = engine_unicode_ccc_table[mid].cp;
        if (m == cp) return engine_unicode_ccc_table[mid].rank;
        if (m < cp) lo = mid + 1;
        else hi = mid;
    }
    return 0;
}

static const engine_unicode_decomp *decomp_find(uint32_t cp) {
    size_t lo = 0, hi = engine_unicode_decomp_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t m = engine_unicode_decomp_table[mid].cp;
        if (m == cp) return &engine_unicode_decomp_table[mid];
        if (m < cp) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= HANGUL_L && a < HANGUL_L + HANGUL_LN && b >= HANGUL_V && b < HANGUL_V + HANGUL_VN)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_VN + (b - HANGUL_V)) * HANGUL_TN;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_SN && (a - HANGUL_S) % HANGUL_TN == 0 &&
        b > HANGUL_T && b < HANGUL_T + HANGUL_TN)
        return a + (b - HANGUL_T);
    size_t lo = 0, hi = engine_unicode_pair_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const engine_unicode_pair *p = &engine_unicode_pair_table[mid];
        if (p->first == a && p->second == b) return p->composite;
        if (p->first < a || (p->first == a && p->second < b)) lo = mid + 1;
        else hi = mid;
    }
    return 0;
}

typedef struct {
    uint32_t *cp;
    uint8_t *cc;
    size_t n, cap;
    unsigned char *out;
    size_t out_n, out_cap;
} nfc_buf;

static int buf_push(nfc_buf *b, uint32_t cp) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        uint32_t *c = realloc(b->cp, cap * sizeof *c);
        if (!c) return -1;
        b->cp = c;
        uint8_t *k = realloc(b->cc, cap);
        if (!k) return -1;
        b->cc = k;
        b->cap = cap;
    }
    b->cp[b->n] = cp;
    b->cc[b->n] = ccc_rank(cp);
    b->n++;
    return 0;
}

static int out_reserve(nfc_buf *b, size_t more) {
    if (b->out && b->out_cap - b->out_n >= more) return 0;
    size_t cap = b->out_cap ? b->out_cap : 256;
    while (cap - b->out_n < more) cap *= 2;
    unsigned char *o = realloc(b->out, cap);
    if (!o) return -1;
    b->out = o;
    b->out_cap = cap;
    return 0;
}

static int decompose(nfc_buf *b, uint32_t cp) {
    if (cp >= HANGUL_S && cp < HANGUL_S + HANGUL_SN) {
        uint32_t s = cp - HANGUL_S;
        if (buf_push(b, HANGUL_L + s / HANGUL_NN) || buf_push(b, HANGUL_V + (s % HANGUL_NN) / HANGUL_TN))
            return -1;
        if (s % HANGUL_TN && buf_push(b, HANGUL_T + s % HANGUL_TN)) return -1;
        return 0;
    }
    const engine_unicode_decomp *d =
        (engine_unicode_class(cp) & ENGINE_UC_DECOMP) ? decomp_find(cp) : NULL;
    if (!d) return buf_push(b, cp);
    for (uint16_t i = 0; i < d->len; i++)
        if (buf_push(b, engine_unicode_decomp_pool[d->off + i])) return -1;
    return 0;
}

/* Stable sort of b->cp[lo..hi) by combining class (a run of non-starters): insertion sort for
 * short runs, merge sort for long ones so hostile input stays O(n log n). */
static int sort_run(nfc_buf *b, size_t lo, size_t hi) {
    size_t n = hi - lo;
    if (n < 2) return 0;
    if (n <= 32) {
        for (size_t i = lo + 1; i < hi; i++) {
            uint32_t c = b->cp[i];
            uint8_t k = b->cc[i];
            size_t j = i;
            while (j > lo && b->cc[j - 1] > k) {
                b->cp[j] = b->cp[j - 1];
                b->cc[j] = b->cc[j - 1];
                j--;
            }
            b->cp[j] = c;
            b->cc[j] = k;
        }
        return 0;
    }
    uint64_t *a = malloc(n * sizeof *a), *t = malloc(n * sizeof *t);
    if (!a || !t) {
        free(a);
        free(t);
        return -1;
    }
    for (size_t i = 0; i < n; i++) a[i] = ((uint64_t)b->cc[lo + i] << 32) | b->cp[lo + i];
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t s = 0; s < n; s += 2 * w) {
            size_t m = NFC_MIN(s + w, n), e = NFC_MIN(s + 2 * w, n);
            size_t i = s, j = m, k = s;
            while (i < m && j < e) t[k++] = (a[j] >> 32) < (a[i] >> 32) ? a[j++] : a[i++];
            while (i < m) t[k++] = a[i++];
            while (j < e) t[k++] = a[j++];
        }
        uint64_t *x = a;
        a = t;
        t = x;
    }
    for (size_t i = 0; i < n; i++) {
        b->cp[lo + i] = (uint32_t)a[i];
        b->cc[lo + i] = (uint8_t)(a[i] >> 32);
    }
    free(a);
    free(t);
    return 0;
}

/* Normalise the chunk s[0..n) (valid UTF-8 starting with a starter or at a text boundary) and
 * append it to b->out. */
static int nfc_chunk(nfc_buf *b, const unsigned char *s, size_t n) {
    b->n = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += engine_utf8_next(s + i, &cp);
        if (decompose(b, cp)) return -1;
    }
    for (size_t i = 0; i < b->n;) {
        if (b->cc[i] == 0) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < b->n && b->cc[j] != 0) j++;
        if (sort_run(b, i, j)) return -1;
        i = j;
    }
    /* canonical composition */
    size_t starter = 0, w = 1;
    int have_starter = b->n > 0 && b->cc[0] == 0;
    int last = have_starter ? 0 : 256;
    for (size_t i = 1; i < b->n; i++) {
        uint32_t c = b->cp[i];
        int k = b->cc[i];
        uint32_t comp = have_starter ? compose_pair(b->cp[starter], c) : 0;
        if (comp && (last < k || last == 0)) {
            b->cp[starter] = comp;
            continue;
        }
        if (k == 0) {
            starter = w;
            have_starter = 1;
        }
        last = k;
        b->cp[w] = c;
        b->cc[w] = (uint8_t)k;
        w++;
    }
    if (b->n == 0) w = 0;
    if (out_reserve(b, w * 4)) return -1;
    for (size_t i = 0; i < w; i++) b->out_n += engine_utf8_put(b->cp[i], b->out + b->out_n);
    return 0;
}

int engine_unicode_nfc(const char *str, size_t n, char **out, size_t *out_len) {
    const unsigned char *s = (const unsigned char *)str;
    nfc_buf b = {0};
    size_t i = 0, copied = 0, prev = 0; /* prev: start of the previous (safe) char */
    int have_prev = 0;
    *out = NULL;
    *out_len = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            prev = i++;
            have_prev = 1;
            continue;
        }
        uint32_t cp;
        size_t k = engine_utf8_next(s + i, &cp);
        if (!(engine_unicode_class(cp) & ENGINE_UC_NFC_UNSAFE)) {
            prev = i;
            have_prev = 1;
            i += k;
            continue;
        }
        /* a chunk from the last safe char (a starter nothing before can reach) to the next
         * safe char (which nothing in the chunk can reach) */
        size_t start = have_prev ? prev : 0;
        if (start < copied) start = copied;
        size_t end = i + k;
        while (end < n) {
            uint32_t c2;
            size_t k2 = engine_utf8_next(s + end, &c2);
            if (!(engine_unicode_class(c2) & ENGINE_UC_NFC_UNSAFE)) break;
            end += k2;
        }
        if (out_reserve(&b, start - copied) < 0) goto oom;
        memcpy(b.out + b.out_n, s + copied, start - copied);
        b.out_n += start - copied;
        if (nfc_chunk(&b, s + start, end - start)) goto oom;
        copied = end;
        i = end;
        have_prev = 0;
    }
    free(b.cp);
    free(b.cc);
    if (!b.out) return 0; /* nothing unsafe: already NFC */
    if (out_reserve(&b, n - copied + 1) < 0) goto oom_out;
    memcpy(b.out + b.out_n, s + copied, n - copied);
    b.out_n += n - copied;
    if (b.out_n == n && memcmp(b.out, s, n) == 0) { /* chunks that normalised to themselves */
        free(b.out);
        return 0;
    }
    b.out[b.out_n] = 0;
    *out = (char *)b.out;
    *out_len = b.out_n;
    return 0;
oom:
    free(b.cp);
    free(b.cc);
oom_out:
    free(b.out);
    return -1;
}
