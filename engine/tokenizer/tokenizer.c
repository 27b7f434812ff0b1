/* engine_tokenizer: compiling a spec, encoding (added tokens, NFC, Qwen2 pre-tokenizer,
 * byte-level BPE) and one-shot decoding. */
#include "tokenizer_int.h"

#include "common.h"
#include "unicode.h"

#include <string.h>

/* ---- GPT-2 byte <-> unicode mapping ---------------------------------------------------------
 * Printable bytes map to themselves ('!'..'~', 0xA1..0xAC, 0xAE..0xFF); the other 68 bytes map,
 * in order, to U+0100.. . */
static bool byte_is_printable(int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* code point -> byte, or -1 */
static int unicode_to_byte(uint32_t cp) {
    if (cp < 256 && byte_is_printable((int)cp)) return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        if (byte_is_printable(b)) continue;
        if ((uint32_t)(256 + n) == cp) return b;
        n++;
    }
    return -1;
}

static bool utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    int complete, invalid;
    for (size_t i = 0; i < n;) {
        size_t k = engine_utf8_scan(u + i, n - i, &complete, &invalid);
        if (!complete) return false;
        i += k;
    }
    return true;
}

/* Decode a token in byte-level form into raw bytes (out has room for strlen(s) bytes). */
static int bytelevel_decode(const char *s, unsigned char *out, size_t *n, const int *rev) {
    size_t len = strlen(s), w = 0;
    if (!utf8_valid(s, len)) return -1;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += engine_utf8_next((const unsigned char *)s + i, &cp);
        int b = cp < 512 ? rev[cp] : -1;
        if (b < 0) return -1;
        out[w++] = (unsigned char)b;
    }
    *n = w;
    return 0;
}

static uint32_t pow2_at_least(size_t n) {
    uint32_t c = 16;
    while (c < n) c *= 2;
    return c;
}

static int32_t vocab_lookup(const engine_tokenizer *t, const void *p, size_t n) {
    uint32_t h = engine_tok_hash(p, n) & t->vmask;
    for (;;) {
        int32_t id = t->vhash[h];
        if (id < 0) return -1;
        size_t len = t->off[id + 1] - t->off[id];
        if (len == n && memcmp(t->bytes + t->off[id], p, n) == 0) return id;
        h = (h + 1) & t->vmask;
    }
}

static inline uint32_t merge_slot(uint64_t key, uint32_t mask) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32) & mask;
}

static inline bool merge_lookup(const engine_tokenizer *t, int32_t a, int32_t b, int32_t *rank,
                                int32_t *res) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint32_t h = merge_slot(key, t->mmask);; h = (h + 1) & t->mmask) {
        const engine_tok_merge *m = &t->merges[h];
        if (m->res < 0) return false;
        if (m->key == key) {
            *rank = m->rank;
            *res = m->res;
            return true;
        }
    }
}

void engine_tokenizer_free(engine_tokenizer *t) {
    if (!t) return;
    free(t->bytes);
    free(t->off);
    free(t->types);
    free(t->eog);
    free(t->vhash);
    free(t->merges);
    free(t->added);
    free(t->chat_template);
    free(t);
}

static const char *const EOG_TEXTS[] = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>",
                                        "<|eom_id|>", "<|end|>", "<end_of_turn>"};

static int cmp_added(const void *a, const void *b, const engine_tokenizer *t) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    unsigned char fx = (unsigned char)t->bytes[t->off[x]], fy = (unsigned char)t->bytes[t->off[y]];
    if (fx != fy) return fx < fy ? -1 : 1;
    size_t lx = t->off[x + 1] - t->off[x], ly = t->off[y + 1] - t->off[y];
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

int engine_tokenizer_new(engine_tokenizer **out, const engine_tokenizer_spec *spec) {
    *out = NULL;
    if (!spec || !spec->tokens || !spec->token_types || spec->n_tokens <= 0 ||
        (spec->n_merges > 0 && !spec->merges))
        return engine_err(ENGINE_EINVAL, "tokenizer: empty or incomplete spec");
    if (!spec->model || strcmp(spec->model, "gpt2") != 0)
        return engine_err(ENGINE_EUNSUPPORTED, "tokenizer: model \"%s\" is not supported (only "
                          "byte-level BPE, \"gpt2\")", spec->model ? spec->model : "(none)");
    if (!spec->pre || (strcmp(spec->pre, "qwen2") != 0 && strcmp(spec->pre, "qwen35") != 0))
        return engine_err(ENGINE_EUNSUPPORTED, "tokenizer: pre-tokenizer \"%s\" is not supported "
                          "(only \"qwen2\" and \"qwen35\")", spec->pre ? spec->pre : "(none)");
    int rev[512];
    for (int i = 0; i < 512; i++) rev[i] = unicode_to_byte((uint32_t)i);

    engine_tokenizer *t = calloc(1, sizeof *t);
    int rc = ENGINE_ENOMEM;
    unsigned char *tmp = NULL;
    if (!t) goto oom;
    int32_t n = spec->n_tokens;
    t->n_vocab = n;
    t->pre_qwen35 = strcmp(spec->pre, "qwen35") == 0;
    t->off = malloc(((size_t)n + 1) * sizeof *t->off);
    t->types = calloc((size_t)n, 1);
    t->eog = calloc((size_t)n, 1);
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!spec->tokens[i]) {
            rc = engine_err(ENGINE_EFORMAT, "tokenizer: token %d is missing", (int)i);
            goto fail;
        }
        total += strlen(spec->tokens[i]);
    }
    t->bytes = malloc(total + 1);
    tmp = malloc(total + 1024); /* a token, or the two sides of a merge (< 512 bytes each) */
    if (!t->off || !t->types || !t->eog || !t->bytes || !tmp) goto oom;
    size_t w = 0;
    for (int32_t i = 0; i < n; i++) {
        const char *s = spec->tokens[i];
        int32_t ty = spec->token_types[i];
        if (ty < ENGINE_TOKEN_UNDEFINED || ty > ENGINE_TOKEN_BYTE) {
            rc = engine_err(ENGINE_EFORMAT, "tokenizer: token %d has bad type %d", (int)i, (int)ty);
            goto fail;
        }
        if (ty == ENGINE_TOKEN_UNDEFINED) ty = ENGINE_TOKEN_NORMAL;
        t->types[i] = (uint8_t)ty;
        t->off[i] = w;
        size_t len = strlen(s);
        if (ty == ENGINE_TOKEN_NORMAL) {
            size_t bl;
            if (bytelevel_decode(s, tmp, &bl, rev)) {
                rc = engine_err(ENGINE_EFORMAT, "tokenizer: token %d \"%.64s\" is not in the "
                                "byte-level form", (int)i, s);
                goto fail;
            }
            memcpy(t->bytes + w, tmp, bl);
            w += bl;
        } else {
            if ((ty == ENGINE_TOKEN_CONTROL || ty == ENGINE_TOKEN_USER_DEFINED) &&
                (len == 0 || !utf8_valid(s, len))) {
                rc = engine_err(ENGINE_EFORMAT, "tokenizer: added token %d is empty or not UTF-8",
                                (int)i);
                goto fail;
            }
            memcpy(t->bytes + w, s, len);
            w += len;
        }
        if (w - t->off[i] > t->max_token_len) t->max_token_len = w - t->off[i];
    }
    t->off[n] = w;

    /* vocabulary hash over NORMAL tokens (the ones BPE produces) */
    t->vmask = pow2_at_least((size_t)n * 2) - 1;
    t->vhash = malloc(((size_t)t->vmask + 1) * sizeof *t->vhash);
    if (!t->vhash) goto oom;
    memset(t->vhash, 0xff, ((size_t)t->vmask + 1) * sizeof *t->vhash);
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    uint32_t n_added = 0;
    for (int32_t i = 0; i < n; i++) {
        if (t->types[i] == ENGINE_TOKEN_CONTROL || t->types[i] == ENGINE_TOKEN_USER_DEFINED)
            n_added++;
        if (t->types[i] != ENGINE_TOKEN_NORMAL) continue;
        size_t len = t->off[i + 1] - t->off[i];
        const char *p = t->bytes + t->off[i];
        if (len == 0) {
            rc = engine_err(ENGINE_EFORMAT, "tokenizer: token %d is empty", (int)i);
            goto fail;
        }
        uint32_t h = engine_tok_hash(p, len) & t->vmask;
        for (;; h = (h + 1) & t->vmask) {
            int32_t o = t->vhash[h];
            if (o < 0) break;
            if (t->off[o + 1] - t->off[o] == len && memcmp(t->bytes + t->off[o], p, len) == 0) {
                rc = engine_err(ENGINE_EFORMAT, "tokenizer: tokens %d and %d are the same",
                                (int)o, (int)i);
                goto fail;
            }
        }
        t->vhash[h] = i;
        if (len == 1) t->byte_id[(unsigned char)p[0]] = i;
    }
    for (int b = 0; b < 256; b++) {
        if (t->byte_id[b] < 0) {
            rc = engine_err(ENGINE_EUNSUPPORTED, "tokenizer: no token for byte 0x%02x", b);
            goto fail;
        }
    }

    /* merges: (left id, right id) -> rank, merged id */
    int32_t nm = spec->n_merges;
    t->mmask = pow2_at_least((size_t)nm * 2 + 1) - 1;
    t->merges = malloc(((size_t)t->mmask + 1) * sizeof *t->merges);
    if (!t->merges) goto oom;
    for (size_t i = 0; i <= t->mmask; i++) t->merges[i].res = -1;
    for (int32_t r = 0; r < nm; r++) {
        const char *m = spec->merges[r];
        const char *sp = m ? strchr(m, ' ') : NULL;
        if (!sp || sp == m || !sp[1] || strchr(sp + 1, ' ')) {
            rc = engine_err(ENGINE_EFORMAT, "tokenizer: merge %d is not \"left right\"", (int)r);
            goto fail;
        }
        size_t ll = (size_t)(sp - m);
        char left[512];
        if (ll >= sizeof left || strlen(sp + 1) >= sizeof left) {
            rc = engine_err(ENGINE_EFORMAT, "tokenizer: merge %d is too long", (int)r);
            goto fail;
        }
        memcpy(left, m, ll);
        left[ll] = 0;
        size_t la, lb;
        if (bytelevel_decode(left, tmp, &la, rev) || bytelevel_decode(sp + 1, tmp + la, &lb, rev)) {
            rc = engine_err(ENGINE_EFORMAT, "tokenizer: merge %d \"%.64s\" is not in the "
                            "byte-level form", (int)r, m);
            goto fail;
        }
        int32_t a = vocab_lookup(t, tmp, la), b = vocab_lookup(t, tmp + la, lb);
        int32_t res = vocab_lookup(t, tmp, la + lb);
        if (a < 0 || b < 0 || res < 0) {
            rc = engine_err(ENGINE_EFORMAT, "tokenizer: merge %d \"%.64s\": %s is not in the "
                            "vocabulary", (int)r, m, a < 0 || b < 0 ? "a part" : "the result");
            goto fail;
        }
        uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
        uint32_t h = merge_slot(key, t->mmask);
        for (; t->merges[h].res >= 0 && t->merges[h].key != key; h = (h + 1) & t->mmask) {}
        if (t->merges[h].res >= 0) continue; /* a repeated merge keeps its first (lowest) rank */
        t->merges[h].key = key;
        t->merges[h].rank = r;
        t->merges[h].res = res;
    }

    /* added tokens, grouped by first byte, longest first */
    t->added = malloc((n_added ? n_added : 1) * sizeof *t->added);
    if (!t->added) goto oom;
    for (int32_t i = 0; i < n; i++)
        if (t->types[i] == ENGINE_TOKEN_CONTROL || t->types[i] == ENGINE_TOKEN_USER_DEFINED)
            t->added[t->n_added++] = i;
    /* insertion sort: few added tokens in practice, and no qsort_r in C17 */
    for (uint32_t i = 1; i < t->n_added; i++) {
        int32_t x = t->added[i];
        uint32_t j = i;
        while (j > 0 && cmp_added(&t->added[j - 1], &x, t) > 0) {
            t->added[j] = t->added[j - 1];
            j--;
        }
        t->added[j] = x;
    }
    {
        uint32_t k = 0;
        for (int b = 0; b <= 256; b++) {
            while (b < 256 && k < t->n_added && (unsigned char)t->bytes[t->off[t->added[k]]] < b) k++;
            t->added_start[b] = k;
        }
        t->added_start[256] = t->n_added;
    }

    t->bos = spec->bos_id >= 0 && spec->bos_id < n ? spec->bos_id : -1;
    t->eos = spec->eos_id >= 0 && spec->eos_id < n ? spec->eos_id : -1;
    t->pad = spec->pad_id >= 0 && spec->pad_id < n ? spec->pad_id : -1;
    if (t->eos >= 0) t->eog[t->eos] = 1;
    for (uint32_t i = 0; i < t->n_added; i++) {
        int32_t id = t->added[i];
        if (t->types[id] != ENGINE_TOKEN_CONTROL) continue;
        size_t len = t->off[id + 1] - t->off[id];
        for (size_t e = 0; e < sizeof EOG_TEXTS / sizeof EOG_TEXTS[0]; e++)
            if (strlen(EOG_TEXTS[e]) == len && memcmp(EOG_TEXTS[e], t->bytes + t->off[id], len) == 0)
                t->eog[id] = 1;
    }
    if (spec->chat_template) {
        t->chat_template = malloc(strlen(spec->chat_template) + 1);
        if (!t->chat_template) goto oom;
        strcpy(t->chat_template, spec->chat_template);
    }
    free(tmp);
    *out = t;
    return 0;
oom:
    rc = engine_err(ENGINE_ENOMEM, "tokenizer: out of memory");
fail:
    free(tmp);
    engine_tokenizer_free(t);
    return rc;
}

/* ---- accessors ------------------------------------------------------------------------------ */

int32_t engine_tokenizer_n_vocab(const engine_tokenizer *t) { return t->n_vocab; }
int32_t engine_tokenizer_bos(const engine_tokenizer *t) { return t->bos; }
int32_t engine_tokenizer_eos(const engine_tokenizer *t) { return t->eos; }
int32_t engine_tokenizer_pad(const engine_tokenizer *t) { return t->pad; }
const char *engine_tokenizer_chat_template(const engine_tokenizer *t) { return t->chat_template; }

const char *engine_tokenizer_token_bytes(const engine_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = t->off[id + 1] - t->off[id];
    return t->bytes + t->off[id];
}

engine_token_type engine_tokenizer_token_type(const engine_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return ENGINE_TOKEN_UNDEFINED;
    return (engine_token_type)t->types[id];
}

bool engine_tokenizer_is_special(const engine_tokenizer *t, int32_t id) {
    return engine_tokenizer_token_type(t, id) == ENGINE_TOKEN_CONTROL;
}

bool engine_tokenizer_is_eog(const engine_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

int32_t engine_tokenizer_find(const engine_tokenizer *t, const char *text, size_t len) {
    if (len == 0) return -1;
    unsigned char f = (unsigned char)text[0];
    for (uint32_t k = t->added_start[f]; k < t->added_start[f + 1]; k++) {
        int32_t id = t->added[k];
        if (t->off[id + 1] - t->off[id] == len && memcmp(t->bytes + t->off[id], text, len) == 0)
            return id;
    }
    return vocab_lookup(t, text, len);
}

/* ---- encoding ------------------------------------------------------------------------------- */

typedef struct {
    int32_t *ids;
    size_t cap, n;
    bool grow;
} emitter;

static int emit(emitter *e, int32_t id) {
    if (e->n < e->cap) {
        e->ids[e->n++] = id;
        return 0;
    }
    if (e->grow) {
        size_t cap = e->cap ? e->cap * 2 : 256;
        int32_t *ids = realloc(e->ids, cap * sizeof *ids);
        if (!ids) return engine_err(ENGINE_ENOMEM, "tokenizer: out of memory");
        e->ids = ids;
        e->cap = cap;
        e->ids[e->n++] = id;
        return 0;
    }
    e->n++; /* count what does not fit */
    return 0;
}

typedef struct {
    int32_t rank;
    uint32_t pos;   /* start byte of the left symbol: leftmost wins among equal ranks */
    uint32_t left, right;
    int32_t left_id, right_id, res;
} bigram;

typedef struct {
    /* per-piece symbol list */
    int32_t *id;
    uint32_t *pos, *prev, *next;
    bigram *heap;
    size_t cap, heap_n, heap_cap;
    /* piece cache: bytes -> ids (open addressing), reset when full */
    uint32_t *c_slot;     /* entry index + 1, 0 empty */
    uint32_t c_mask;
    uint32_t *c_koff, *c_klen, *c_voff, *c_vlen;
    size_t c_n, c_max;
    char *c_keys;
    size_t c_keys_n, c_keys_cap;
    int32_t *c_vals;
    size_t c_vals_n, c_vals_cap;
    size_t text_len;
} bpe_work;

static void work_free(bpe_work *w) {
    free(w->id);
    free(w->pos);
    free(w->prev);
    free(w->next);
    free(w->heap);
    free(w->c_slot);
    free(w->c_koff);
    free(w->c_klen);
    free(w->c_voff);
    free(w->c_vlen);
    free(w->c_keys);
    free(w->c_vals);
}

static int work_reserve(bpe_work *w, size_t n) {
    if (n <= w->cap) return 0;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *id = realloc(w->id, cap * sizeof *id);
    if (id) w->id = id;
    uint32_t *pos = realloc(w->pos, cap * sizeof *pos);
    if (pos) w->pos = pos;
    uint32_t *prev = realloc(w->prev, cap * sizeof *prev);
    if (prev) w->prev = prev;
    uint32_t *next = realloc(w->next, cap * sizeof *next);
    if (next) w->next = next;
    bigram *heap = realloc(w->heap, cap * 2 * sizeof *heap);
    if (heap) w->heap = heap;
    if (!id || !pos || !prev || !next || !heap)
        return engine_err(ENGINE_ENOMEM, "tokenizer: out of memory");
    w->cap = cap;
    w->heap_cap = cap * 2;
    return 0;
}

static inline bool bigram_less(const bigram *a, const bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(bpe_work *w, bigram g) {
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap * 2;
        bigram *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return engine_err(ENGINE_ENOMEM, "tokenizer: out of memory");
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_less(&g, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = g;
    return 0;
}

static bigram heap_pop(bpe_work *w) {
    bigram top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!bigram_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

#define NONE UINT32_MAX

static int try_pair(const engine_tokenizer *t, bpe_work *w, uint32_t l, uint32_t r) {
    int32_t rank, res;
    if (l == NONE || r == NONE) return 0;
    if (!merge_lookup(t, w->id[l], w->id[r], &rank, &res)) return 0;
    bigram g = {rank, w->pos[l], l, r, w->id[l], w->id[r], res};
    return heap_push(w, g);
}

/* BPE over one pre-token piece of raw bytes; appends its ids to e. */
static int bpe_piece(const engine_tokenizer *t, bpe_work *w, const unsigned char *p, size_t n,
                     emitter *e) {
    int rc;
    if (n == 1) return emit(e, t->byte_id[p[0]]);
    if ((rc = work_reserve(w, n))) return rc;
    for (size_t i = 0; i < n; i++) {
        w->id[i] = t->byte_id[p[i]];
        w->pos[i] = (uint32_t)i;
        w->prev[i] = i ? (uint32_t)i - 1 : NONE;
        w->next[i] = i + 1 < n ? (uint32_t)i + 1 : NONE;
    }
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if ((rc = try_pair(t, w, (uint32_t)i, (uint32_t)i + 1))) return rc;
    while (w->heap_n) {
        bigram g = heap_pop(w);
        uint32_t l = g.left, r = g.right;
        /* stale: a side was merged away or changed since this pair was queued */
        if (w->id[l] != g.left_id || w->id[r] != g.right_id || w->next[l] != r) continue;
        w->id[l] = g.res;
        w->id[r] = -1;
        w->next[l] = w->next[r];
        if (w->next[r] != NONE) w->prev[w->next[r]] = l;
        w->next[r] = NONE;
        if ((rc = try_pair(t, w, w->prev[l], l)) || (rc = try_pair(t, w, l, w->next[l]))) return rc;
    }
    for (uint32_t i = 0; i != NONE; i = w->next[i])
        if ((rc = emit(e, w->id[i]))) return rc;
    return 0;
}

/* The piece cache keeps repeated words from running BPE again (per call, so the tokenizer
 * stays immutable and thread-safe). */
enum { CACHE_MAX_PIECE = 256, CACHE_ENTRIES = 1 << 15 };

static int cached_piece(const engine_tokenizer *t, bpe_work *w, const unsigned char *p, size_t n,
                        emitter *e) {
    if (n == 1) return emit(e, t->byte_id[p[0]]);
    if (n > CACHE_MAX_PIECE) return bpe_piece(t, w, p, n, e);
    int rc;
    if (!w->c_slot) {
        /* sized to the text: a short prompt should not pay for a big table */
        size_t want = w->text_len / 8;
        w->c_max = 64;
        while (w->c_max < want && w->c_max < CACHE_ENTRIES) w->c_max *= 2;
        w->c_mask = (uint32_t)w->c_max * 2 - 1;
        w->c_slot = calloc((size_t)w->c_mask + 1, sizeof *w->c_slot);
        w->c_koff = malloc(w->c_max * sizeof *w->c_koff);
        w->c_klen = malloc(w->c_max * sizeof *w->c_klen);
        w->c_voff = malloc(w->c_max * sizeof *w->c_voff);
        w->c_vlen = malloc(w->c_max * sizeof *w->c_vlen);
        if (!w->c_slot || !w->c_koff || !w->c_klen || !w->c_voff || !w->c_vlen)
            return engine_err(ENGINE_ENOMEM, "tokenizer: out of memory");
    }
    uint32_t h = engine_tok_hash(p, n) & w->c_mask;
    for (; w->c_slot[h]; h = (h + 1) & w->c_mask) {
        uint32_t k = w->c_slot[h] - 1;
        if (w->c_klen[k] == n && memcmp(w->c_keys + w->c_koff[k], p, n) == 0) {
            for (uint32_t j = 0; j < w->c_vlen[k]; j++)
                if ((rc = emit(e, w->c_vals[w->c_voff[k] + j]))) return rc;
            return 0;
        }
    }
    /* miss: run BPE into a growable side buffer, then record and emit */
    if (w->c_n == w->c_max) { /* full: start over */
        memset(w->c_slot, 0, ((size_t)w->c_mask + 1) * sizeof *w->c_slot);
        w->c_n = w->c_keys_n = w->c_vals_n = 0;
        h = engine_tok_hash(p, n) & w->c_mask;
    }
    emitter side = {w->c_vals, w->c_vals_cap, w->c_vals_n, true};
    if ((rc = bpe_piece(t, w, p, n, &side))) {
        w->c_vals = side.ids;
        w->c_vals_cap = side.cap;
        return rc;
    }
    w->c_vals = side.ids;
    w->c_vals_cap = side.cap;
    if (w->c_keys_cap - w->c_keys_n < n) {
        size_t cap = w->c_keys_cap ? w->c_keys_cap * 2 : 1 << 16;
        while (cap - w->c_keys_n < n) cap *= 2;
        char *k = realloc(w->c_keys, cap);
        if (!k) return engine_err(ENGINE_ENOMEM, "tokenizer: out of memory");
        w->c_keys = k;
        w->c_keys_cap = cap;
    }
    memcpy(w->c_keys + w->c_keys_n, p, n);
    size_t k = w->c_n++;
    w->c_koff[k] = (uint32_t)w->c_keys_n;
    w->c_klen[k] = (uint32_t)n;
    w->c_voff[k] = (uint32_t)w->c_vals_n;
    w->c_vlen[k] = (uint32_t)(side.n - w->c_vals_n);
    w->c_keys_n += n;
    w->c_slot[h] = (uint32_t)k + 1;
    for (size_t j = w->c_vals_n; j < side.n; j++)
        if ((rc = emit(e, w->c_vals[j]))) return rc;
    w->c_vals_n = side.n;
    return 0;
}

/* A text section (no added tokens inside): NFC, pre-tokenize, BPE. */
static int encode_section(const engine_tokenizer *t, bpe_work *w, const char *s, size_t n,
                          emitter *e) {
    char *norm = NULL;
    size_t nn;
    if (n == 0) return 0;
    if (engine_unicode_nfc(s, n, &norm, &nn)) return engine_err(ENGINE_ENOMEM, "tokenizer: out of memory");
    const unsigned char *u = (const unsigned char *)(norm ? norm : s);
    size_t len = norm ? nn : n;
    int rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        size_t j = t->pre_qwen35 ? engine_pretok_qwen35_next(u, len, i)
                                 : engine_pretok_qwen2_next(u, len, i);
        rc = cached_piece(t, w, u + i, j - i, e);
        i = j;
    }
    free(norm);
    return rc;
}

/* The added token starting at s[i] (leftmost-longest), or -1. */
static int32_t match_added(const engine_tokenizer *t, const unsigned char *s, size_t n, size_t i,
                           bool parse_special) {
    unsigned char f = s[i];
    for (uint32_t k = t->added_start[f]; k < t->added_start[f + 1]; k++) {
        int32_t id = t->added[k];
        if (!parse_special && t->types[id] == ENGINE_TOKEN_CONTROL) continue;
        size_t len = t->off[id + 1] - t->off[id];
        if (len <= n - i && memcmp(t->bytes + t->off[id], s + i, len) == 0) return id;
    }
    return -1;
}

static int encode_into(const engine_tokenizer *t, const char *text, size_t len, bool parse_special,
                       emitter *e) {
    char *clean = NULL;
    size_t clean_len;
    if (len && !text) return engine_err(ENGINE_EINVAL, "tokenizer: NULL text");
    if (len >= UINT32_MAX / 4) /* symbol indices and positions are 32-bit */
        return engine_err(ENGINE_ERANGE, "tokenizer: text of %zu bytes is too long (1 GiB max)",
                          len);
    if (engine_utf8_sanitize(text, len, &clean, &clean_len))
        return engine_err(ENGINE_ENOMEM, "tokenizer: out of memory");
    const unsigned char *s = (const unsigned char *)(clean ? clean : text);
    size_t n = clean ? clean_len : len;
    bpe_work w = {0};
    w.text_len = n;
    int rc = 0;
    size_t start = 0;
    for (size_t i = 0; i < n && !rc;) {
        int32_t id = t->added_start[s[i]] != t->added_start[s[i] + 1]
                         ? match_added(t, s, n, i, parse_special)
                         : -1;
        if (id < 0) {
            i++;
            continue;
        }
        rc = encode_section(t, &w, (const char *)s + start, i - start, e);
        if (!rc) rc = emit(e, id);
        i += t->off[id + 1] - t->off[id];
        start = i;
    }
    if (!rc) rc = encode_section(t, &w, (const char *)s + start, n - start, e);
    work_free(&w);
    free(clean);
    return rc;
}

int engine_tokenizer_encode(const engine_tokenizer *t, const char *text, size_t len,
                            bool parse_special, int32_t *ids, size_t cap, size_t *n_out) {
    emitter e = {ids, ids ? cap : 0, 0, false};
    int rc = encode_into(t, text, len, parse_special, &e);
    *n_out = e.n;
    if (rc) return rc;
    if (e.n > e.cap)
        return engine_err(ENGINE_ERANGE, "tokenizer: %zu tokens do not fit in %zu", e.n, cap);
    return 0;
}

int engine_tokenizer_encode_alloc(const engine_tokenizer *t, const char *text, size_t len,
                                  bool parse_special, int32_t **ids, size_t *n_out) {
    emitter e = {NULL, 0, 0, true};
    int rc = encode_into(t, text, len, parse_special, &e);
    if (rc) {
        free(e.ids);
        *ids = NULL;
        *n_out = 0;
        return rc;
    }
    *ids = e.ids;
    *n_out = e.n;
    return 0;
}
