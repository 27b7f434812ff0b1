/* The "qwen35" pre-tokenizer (Qwen3.5/3.6 GGUFs say tokenizer.ggml.pre = qwen35; their
 * tokenizer.json has the regex): the Qwen2 split regex with \p{M} in the letter runs and out of
 * the punctuation runs (engine/tokenizer/pretokenize.c, the M bit of unicode_tables.c).
 *
 * Always: hand-made cases with combining marks, qwen2 and qwen35 side by side (the expected
 * pieces are what JavaScript's regex engine gives for the two patterns); the pieces tile the
 * text; spec handling ("qwen35" compiles, an unknown pre is EUNSUPPORTED).
 * With arguments (test_qwen35_tokenizer.sh, made by qwen35_tokenizer_ref.js with
 * @huggingface/tokenizers): TOKENIZER_JSON CONFIG PRETOK_BIN IDS_BIN: the tokenizer.json with
 * Qwen3.5's regex is recognised as "qwen35", the matcher gives the reference's pieces for every
 * assigned code point in context, and encoding gives the reference's ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_int.h"
#include "tokenizer/unicode.h"

typedef size_t (*pretok_fn)(const unsigned char *s, size_t n, size_t i);

/* Split text with fn into "|"-joined pieces. */
static void split(pretok_fn fn, const char *text, char *out, size_t cap) {
    const unsigned char *s = (const unsigned char *)text;
    size_t n = strlen(text), o = 0;
    out[0] = 0;
    for (size_t i = 0; i < n;) {
        size_t j = fn(s, n, i);
        if (j <= i || j > n) {
            snprintf(out, cap, "<stalled at %zu>", i);
            return;
        }
        if (i && o + 1 < cap) out[o++] = '|';
        for (size_t k = i; k < j && o + 1 < cap; k++)
            out[o++] = (char)s[k];
        out[o] = 0;
        i = j;
    }
}

static void expect(pretok_fn fn, const char *name, const char *text, const char *want) {
    char got[512];
    split(fn, text, got, sizeof got);
    if (strcmp(got, want) != 0)
        support_fail("%s(\"%s\"): got \"%s\", want \"%s\"", name, text, got, want);
}

static void hand_cases(void) {
    static const struct {
        const char *text, *qwen2, *qwen35;
    } cases[] = {
        /* Devanagari: the virama and vowel signs are marks, not letters */
        {"नमस्ते", "नमस|्त|े", "नमस्ते"},
        /* a combining acute that NFC cannot compose away */
        {"x\u0301", "x|\u0301", "x\u0301"},
        {"!\u0301", "!\u0301", "!\u0301"},
        {" \u0301x", " \u0301|x", " \u0301x"},
        {"1\u0301", "1|\u0301", "1|\u0301"},
        /* marks leave the punctuation run */
        {"..\u0301\u0301", "..\u0301\u0301", "..|\u0301\u0301"},
        {"a\u20dd b", "a|\u20dd| b", "a\u20dd| b"},
        {"\u0301\u0301", "\u0301\u0301", "\u0301\u0301"},
        {"'s\u0301", "'s|\u0301", "'s|\u0301"},
        {"\n\u0301", "\n|\u0301", "\n|\u0301"},
        {" \u0301 ", " \u0301| ", " \u0301| "},
        /* VS16 (U+FE0F) is a mark: it leaves the symbol run */
        {"👍🏽❤️", "👍🏽❤️", "👍🏽❤|\uFE0F"},
        /* no marks: both the same */
        {"Hello, world! It's 2026.\n\n  x", "Hello|,| world|!| It|'s| |2|0|2|6|.\n\n| |"
                                            " x",
         "Hello|,| world|!| It|'s| |2|0|2|6|.\n\n| | x"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        expect(engine_pretok_qwen2_next, "qwen2", cases[i].text, cases[i].qwen2);
        expect(engine_pretok_qwen35_next, "qwen35", cases[i].text, cases[i].qwen35);
    }
    /* the mark class itself: Mn, Mc, Me are marks; letters, digits, symbols are not */
    CHECK(engine_unicode_class(0x0301) & ENGINE_UC_M);  /* Mn */
    CHECK(engine_unicode_class(0x0903) & ENGINE_UC_M);  /* Mc */
    CHECK(engine_unicode_class(0x20DD) & ENGINE_UC_M);  /* Me */
    CHECK(engine_unicode_class(0xE0100) & ENGINE_UC_M); /* variation selector 17 */
    CHECK(!(engine_unicode_class('a') & ENGINE_UC_M));
    CHECK(!(engine_unicode_class(0x0915) & ENGINE_UC_M));
    CHECK(!(engine_unicode_class(0x200D) & ENGINE_UC_M)); /* ZWJ is Cf */
}

/* A two-byte-token spec with the given pre-tokenizer. */
static void spec_cases(void) {
    const char *pres[] = {"qwen2", "qwen35", "qwen9", "llama3"};
    for (int p = 0; p < 4; p++) {
        engine_tokenizer_spec *spec = NULL;
        CHECK(engine_tokenizer_spec_new(&spec, 256, 0) == 0);
        if (!spec) return;
        for (int b = 0; b < 256; b++) {
            /* the byte-level form of byte b (GPT-2's byte-to-unicode map) */
            unsigned cp = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174
                              ? (unsigned)b
                              : 0;
            if (!cp) {
                int k = 0;
                for (int c = 0; c < b; c++)
                    if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) k++;
                cp = 256u + (unsigned)k;
            }
            char u[4];
            size_t l = cp < 0x80 ? (u[0] = (char)cp, 1)
                                 : (u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)),
                                    2);
            CHECK(engine_tokenizer_spec_set_token(spec, b, u, l, ENGINE_TOKEN_NORMAL) == 0);
        }
        CHECK(engine_tokenizer_spec_set_string(&spec->pre, pres[p], strlen(pres[p])) == 0);
        engine_tokenizer *tok = NULL;
        int rc = engine_tokenizer_new(&tok, spec);
        if (p < 2) {
            CHECK(rc == 0);
            /* bytes only: one id per byte whatever the split */
            int32_t ids[64];
            size_t n = 0;
            const char *t = "x\u0301 नमस्ते";
            CHECK(tok && engine_tokenizer_encode(tok, t, strlen(t), false, ids, 64, &n) == 0 &&
                  n == strlen(t) && ids[0] == 'x');
        } else {
            CHECK(rc == ENGINE_EUNSUPPORTED && tok == NULL);
            CHECK(strstr(engine_error_last(), pres[p]) != NULL);
        }
        engine_tokenizer_free(tok);
        engine_tokenizer_spec_free(spec);
    }
}

/* n bytes from the reader (support_ref's little-endian reader over a file), NULL when short. */
static const unsigned char *rd_bytes(support_ref *r, size_t n) {
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = true;
        return NULL;
    }
    const unsigned char *p = r->p;
    r->p += n;
    return p;
}

static void reference(char **argv) {
    engine_tokenizer_spec *spec = NULL;
    CHECK(engine_tokenizer_spec_from_hf_files(&spec, argv[1], argv[2]) == 0);
    if (!spec) return;
    CHECK(spec->pre && !strcmp(spec->pre, "qwen35"));
    engine_tokenizer *tok = NULL;
    CHECK(engine_tokenizer_new(&tok, spec) == 0);
    engine_tokenizer_spec_free(spec);
    if (!tok) return;

    /* pieces of every assigned code point in context */
    size_t len;
    char *buf = support_slurp(argv[3], &len);
    CHECK(buf != NULL);
    support_ref r;
    memset(&r, 0, sizeof r);
    r.p = (const unsigned char *)buf;
    r.end = r.p + (buf ? len : 0);
    uint32_t n_chunks = support_ref_u32(&r), pieces = 0, bad = 0;
    for (uint32_t c = 0; c < n_chunks && !r.bad; c++) {
        uint32_t tl = support_ref_u32(&r);
        const unsigned char *t = rd_bytes(&r, tl);
        uint32_t np = support_ref_u32(&r);
        size_t pos = 0;
        for (uint32_t k = 0; k < np && !r.bad; k++) {
            uint32_t pl = support_ref_u32(&r);
            size_t end = pos < tl ? engine_pretok_qwen35_next(t, tl, pos) : pos;
            if (end != pos + pl && bad++ < 10)
                support_fail("pretok chunk %u piece %u at byte %zu: %zu bytes, reference %u", c,
                             k, pos, end - pos, pl);
            pos += pl;
            pieces++;
        }
        if (!r.bad && pos != tl) support_fail("pretok chunk %u: pieces do not tile", c);
    }
    CHECK(!r.bad && r.p == r.end && n_chunks > 0);
    printf("qwen35 pre-tokenizer: %u pieces of %u chunks compared, %u differ\n", pieces,
           n_chunks, bad);
    free(buf);

    /* whole encodings */
    buf = support_slurp(argv[4], &len);
    CHECK(buf != NULL);
    memset(&r, 0, sizeof r);
    r.p = (const unsigned char *)buf;
    r.end = r.p + (buf ? len : 0);
    uint32_t n_texts = support_ref_u32(&r), differ = 0;
    for (uint32_t d = 0; d < n_texts && !r.bad; d++) {
        uint32_t tl = support_ref_u32(&r);
        const unsigned char *t = rd_bytes(&r, tl);
        uint32_t n_want = support_ref_u32(&r);
        int32_t *got = NULL;
        size_t n_got = 0;
        CHECK(t && engine_tokenizer_encode_alloc(tok, (const char *)t, tl, false, &got,
                                                 &n_got) == 0);
        bool same = n_got == n_want;
        for (uint32_t i = 0; i < n_want && !r.bad; i++) {
            int32_t want = (int32_t)support_ref_u32(&r);
            if (same && got[i] != want) same = false;
        }
        if (!same && differ++ < 10)
            support_fail("text %u (%u bytes): %zu ids, reference %u (or they differ)", d, tl,
                         n_got, n_want);
        free(got);
    }
    CHECK(!r.bad && r.p == r.end && n_texts > 0);
    printf("qwen35 encodings: %u texts compared, %u differ\n", n_texts, differ);
    free(buf);
    engine_tokenizer_free(tok);
}

int main(int argc, char **argv) {
    hand_cases();
    spec_cases();
    if (argc == 5) reference(argv);
    else if (argc != 1) support_fail("usage: %s [TOKENIZER_JSON CONFIG PRETOK_BIN IDS_BIN]", argv[0]);
    return support_finish("test_qwen35_tokenizer");
}
