/* One-shot and streaming detokenization. Both apply the same UTF-8 rule (engine_utf8_scan):
 * complete characters pass, a maximal ill-formed subpart becomes U+FFFD as soon as it is proven
 * ill-formed, an unfinished tail waits (streaming) or becomes one U+FFFD at the end. */
#include "tokenizer_int.h"

#include "common.h"
#include "unicode.h"

#include <string.h>

struct engine_detok {
    const engine_tokenizer *tok;
    bool skip_special;
    unsigned char pending[4];
    size_t n_pending;
    unsigned char *in;   /* pending + token bytes */
    char *out;
    size_t cap;          /* of in; out has 3 * cap */
};

/* Convert in[0..n) to out; returns bytes written; an unfinished tail is left in *tail_len bytes
 * at the end of `in` (not written) unless `final`, when it becomes U+FFFD. */
static size_t convert(const unsigned char *in, size_t n, char *out, bool final, size_t *tail) {
    size_t w = 0, i = 0;
    int complete, invalid;
    *tail = 0;
    while (i < n) {
        if (in[i] < 0x80) {
            out[w++] = (char)in[i++];
            continue;
        }
        size_t k = engine_utf8_scan(in + i, n - i, &complete, &invalid);
        if (complete) {
            memcpy(out + w, in + i, k);
            w += k;
        } else if (!invalid && i + k == n && !final) {
            *tail = k;
            return w;
        } else {
            memcpy(out + w, "\xEF\xBF\xBD", 3);
            w += 3;
        }
        i += k;
    }
    return w;
}

int engine_tokenizer_decode(const engine_tokenizer *t, const int32_t *ids, size_t n,
                            bool skip_special, char **text, size_t *len) {
    size_t total = 0;
    *text = NULL;
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return engine_err(ENGINE_EINVAL, "tokenizer: id %d out of range (vocabulary %d)",
                              (int)ids[i], (int)t->n_vocab);
        if (skip_special && t->types[ids[i]] == ENGINE_TOKEN_CONTROL) continue;
        total += t->off[ids[i] + 1] - t->off[ids[i]];
    }
    unsigned char *raw = malloc(total + 1);
    char *out = total <= (SIZE_MAX - 1) / 3 ? malloc(total * 3 + 1) : NULL;
    if (!raw || !out) {
        free(raw);
        free(out);
        return engine_err(ENGINE_ENOMEM, "tokenizer: out of memory");
    }
    size_t w = 0, tail;
    for (size_t i = 0; i < n; i++) {
        if (skip_special && t->types[ids[i]] == ENGINE_TOKEN_CONTROL) continue;
        size_t l = t->off[ids[i] + 1] - t->off[ids[i]];
        memcpy(raw + w, t->bytes + t->off[ids[i]], l);
        w += l;
    }
    size_t o = convert(raw, w, out, true, &tail);
    free(raw);
    out[o] = 0;
    *text = out;
    *len = o;
    return 0;
}

int engine_detok_new(engine_detok **out, const engine_tokenizer *tok, bool skip_special) {
    *out = NULL;
    engine_detok *d = calloc(1, sizeof *d);
    if (!d) return engine_err(ENGINE_ENOMEM, "detok: out of memory");
    d->tok = tok;
    d->skip_special = skip_special;
    d->cap = tok->max_token_len + sizeof d->pending;
    d->in = malloc(d->cap);
    d->out = malloc(d->cap * 3 + 1);
    if (!d->in || !d->out) {
        engine_detok_free(d);
        return engine_err(ENGINE_ENOMEM, "detok: out of memory");
    }
    *out = d;
    return 0;
}

void engine_detok_free(engine_detok *d) {
    if (!d) return;
    free(d->in);
    free(d->out);
    free(d);
}

void engine_detok_reset(engine_detok *d) { d->n_pending = 0; }

size_t engine_detok_pending(const engine_detok *d) { return d->n_pending; }

int engine_detok_feed(engine_detok *d, int32_t id, const char **text, size_t *len) {
    const engine_tokenizer *t = d->tok;
    *text = d->out;
    *len = 0;
    if (id < 0 || id >= t->n_vocab)
        return engine_err(ENGINE_EINVAL, "detok: id %d out of range (vocabulary %d)", (int)id,
                          (int)t->n_vocab);
    if (d->skip_special && t->types[id] == ENGINE_TOKEN_CONTROL) return 0;
    size_t l = t->off[id + 1] - t->off[id];
    memcpy(d->in, d->pending, d->n_pending);
    memcpy(d->in + d->n_pending, t->bytes + t->off[id], l);
    size_t n = d->n_pending + l, tail;
    *len = convert(d->in, n, d->out, false, &tail);
    memcpy(d->pending, d->in + n - tail, tail);
    d->n_pending = tail;
    return 0;
}

void engine_detok_flush(engine_detok *d, const char **text, size_t *len) {
    size_t tail;
    memcpy(d->in, d->pending, d->n_pending);
    *len = convert(d->in, d->n_pending, d->out, true, &tail);
    *text = d->out;
    d->n_pending = 0;
}
