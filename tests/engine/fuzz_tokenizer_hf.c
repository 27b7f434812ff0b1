/* Fuzz target: the Hugging Face tokenizer reader and, when it accepts the input, the tokenizer
 * built from it. Input: TOKENIZER_JSON [NUL CONFIG_JSON [NUL TEXT]] (JSON cannot hold a raw NUL,
 * so the first two NULs split the parts). Checks that encoding never fails on any text, that
 * the streaming detokenizer agrees with the one-shot decode, and that decode(encode(x)) == x
 * for ASCII text (which neither NFC nor U+FFFD replacement can change) with parse_special off
 * (added tokens that are not CONTROL still round-trip: their bytes are their text). */
#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what) {
    if (!cond) {
        fprintf(stderr, "fuzz_tokenizer_hf: %s\n", what);
        abort();
    }
}

static void exercise(const engine_tokenizer *tok, const char *text, size_t len) {
    for (int special = 0; special < 2; special++) {
        int32_t *ids;
        size_t n;
        check(engine_tokenizer_encode_alloc(tok, text, len, special, &ids, &n) == 0, "encode failed");
        char *dec;
        size_t dl;
        check(engine_tokenizer_decode(tok, ids, n, false, &dec, &dl) == 0, "decode failed");
        engine_detok *d;
        check(engine_detok_new(&d, tok, false) == 0, "detok_new failed");
        size_t pos = 0;
        for (size_t i = 0; i <= n; i++) {
            const char *p;
            size_t pl;
            if (i < n) check(engine_detok_feed(d, ids[i], &p, &pl) == 0, "feed failed");
            else engine_detok_flush(d, &p, &pl);
            check(pos + pl <= dl && memcmp(dec + pos, p, pl) == 0, "stream != decode");
            pos += pl;
        }
        check(pos == dl, "stream shorter than decode");
        bool ascii = true;
        for (size_t i = 0; i < len; i++) ascii = ascii && (unsigned char)text[i] < 0x80;
        if (ascii && !special) check(dl == len && memcmp(dec, text, len) == 0, "round trip");
        engine_detok_free(d);
        free(dec);
        free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *s = (const char *)data;
    const char *z1 = memchr(s, 0, size);
    size_t l1 = z1 ? (size_t)(z1 - s) : size;
    const char *cfg = NULL, *text = "hello world <|end|> 'S e\xcc\x81 \xf0\x9f\x98\x80\r\n";
    size_t lc = 0, lt = strlen(text);
    if (z1) {
        cfg = z1 + 1;
        size_t rest = size - l1 - 1;
        const char *z2 = memchr(cfg, 0, rest);
        lc = z2 ? (size_t)(z2 - cfg) : rest;
        if (z2) {
            text = z2 + 1;
            lt = rest - lc - 1;
        }
    }
    engine_tokenizer_spec *spec;
    if (engine_tokenizer_spec_from_hf(&spec, s, l1, cfg, lc) != 0) return 0;
    engine_tokenizer *tok;
    if (engine_tokenizer_new(&tok, spec) == 0) {
        exercise(tok, text, lt);
        engine_tokenizer_free(tok);
    }
    engine_tokenizer_spec_free(spec);
    return 0;
}
