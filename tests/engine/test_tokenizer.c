/* Unit tests of the tokenizer on a small synthetic tokenizer.json: the JSON reader (valid and
 * hostile input), the spec API, the Qwen2 pre-tokenizer splits, BPE merge order, added tokens
 * with parse_special on/off, UTF-8 replacement, NFC, decode and the streaming detokenizer. */
#include "tokenizer/json.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_int.h"
#include "tokenizer/unicode.h"

#include <stdarg.h>
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

/* ---- a synthetic tokenizer.json ------------------------------------------------------------- */

static char *buf;
static size_t buf_n, buf_cap;

static void put(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void put(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (buf_n + (size_t)n + 1 > buf_cap) {
        buf_cap = (buf_n + (size_t)n + 1) * 2;
        buf = realloc(buf, buf_cap);
    }
    memcpy(buf + buf_n, tmp, (size_t)n + 1);
    buf_n += (size_t)n;
}

/* GPT-2 byte-level form of byte b, JSON-escaped */
static void put_byte(int b) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = b;
    if (!printable) {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
        cp = 256 + n;
    }
    if (cp == '"' || cp == '\\') put("\\%c", cp);
    else put("\\u%04x", cp);
}

static const char *WORDS[] = {"he", "ll", "hell", "hello", "aa", "\xc4\xa0" "w" /* " w" */,
                              "\xc4\xa0" "wo", "or", "wor"};
static const char *MERGES[] = {"h e", "l l", "he ll", "hell o", "a a", "\xc4\xa0 w", "o r",
                               "w or", "\xc4\xa0w o"};

static const char *PATTERN =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";

static char *make_json(int array_merges) {
    buf_n = 0;
    put("{\"version\": \"1.0\", \"added_tokens\": [");
    put("{\"id\": 300, \"content\": \"<|end|>\", \"special\": true, \"normalized\": false},");
    put("{\"id\": 301, \"content\": \"<|endless|>\", \"special\": true},");
    put("{\"id\": 302, \"content\": \"<x>\", \"special\": false}],");
    put("\"normalizer\": {\"type\": \"NFC\"}, \"pre_tokenizer\": {\"type\": \"Sequence\", "
        "\"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"%s\"}, "
        "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", "
        "\"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}]},",
        PATTERN);
    put("\"model\": {\"type\": \"BPE\", \"dropout\": null, \"byte_fallback\": false, "
        "\"vocab\": {");
    for (int b = 0; b < 256; b++) {
        put("\"");
        put_byte(b);
        put("\": %d, ", b);
    }
    for (size_t i = 0; i < sizeof WORDS / sizeof WORDS[0]; i++)
        put("\"%s\": %d%s", WORDS[i], 256 + (int)i, i + 1 < sizeof WORDS / sizeof WORDS[0] ? ", " : "");
    for (int i = 256 + (int)(sizeof WORDS / sizeof WORDS[0]); i < 300; i++) put(", \"pad%d\": %d", i, i);
    put("}, \"merges\": [");
    for (size_t i = 0; i < sizeof MERGES / sizeof MERGES[0]; i++) {
        const char *m = MERGES[i], *sp = strchr(m, ' ');
        if (array_merges) put("[\"%.*s\", \"%s\"]", (int)(sp - m), m, sp + 1);
        else put("\"%s\"", m);
        put(i + 1 < sizeof MERGES / sizeof MERGES[0] ? ", " : "");
    }
    put("]}}");
    return buf;
}

static const char *CONFIG =
    "{\"eos_token\": \"<|end|>\", \"pad_token\": {\"content\": \"<|endless|>\"}, "
    "\"bos_token\": null, \"add_bos_token\": false, \"chat_template\": \"{{ x }}\"}";

static engine_tokenizer *make_tok(void) {
    engine_tokenizer_spec *spec;
    engine_tokenizer *tok;
    char *j = make_json(0);
    if (engine_tokenizer_spec_from_hf(&spec, j, strlen(j), CONFIG, strlen(CONFIG))) {
        fprintf(stderr, "spec_from_hf: %s\n", engine_error_last());
        exit(1);
    }
    if (engine_tokenizer_new(&tok, spec)) {
        fprintf(stderr, "tokenizer_new: %s\n", engine_error_last());
        exit(1);
    }
    engine_tokenizer_spec_free(spec);
    return tok;
}

/* encode and compare with an expected id list terminated by -1 */
static void expect_ids(const engine_tokenizer *tok, const char *text, int special, ...) {
    int32_t want[64];
    size_t nw = 0;
    va_list ap;
    va_start(ap, special);
    for (int v; (v = va_arg(ap, int)) != -1;) want[nw++] = v;
    va_end(ap);
    int32_t got[64];
    size_t n;
    int rc = engine_tokenizer_encode(tok, text, strlen(text), special != 0, got, 64, &n);
    if (rc || n != nw || memcmp(got, want, n * sizeof *got)) {
        fprintf(stderr, "encode(\"%s\"): got", text);
        for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", (int)got[i]);
        fprintf(stderr, ", want");
        for (size_t i = 0; i < nw; i++) fprintf(stderr, " %d", (int)want[i]);
        fprintf(stderr, "\n");
        failures++;
    }
}

static void test_json_reader(void) {
    engine_json d;
    const char *ok = " {\"a\": [1, -2.5e3, true, false, null, \"x\\u00e9\\ud83d\\ude00\\n\"], "
                     "\"b\": {}, \"c\": []} ";
    CHECK(engine_json_parse(&d, ok, strlen(ok), "t") == 0);
    const engine_json_node *a = engine_json_get(&d, &d.nodes[0], "a");
    CHECK(a && a->type == ENGINE_JSON_ARRAY && a->count == 6);
    const engine_json_node *one = engine_json_first(&d, a);
    CHECK(one && one->is_int && one->ival == 1);
    const engine_json_node *f = engine_json_next(&d, one);
    CHECK(f && f->type == ENGINE_JSON_NUMBER && !f->is_int);
    const engine_json_node *s = engine_json_next(&d, engine_json_next(&d, engine_json_next(
                                    &d, engine_json_next(&d, f))));
    CHECK(s && s->type == ENGINE_JSON_STRING && s->len == 8 &&
          memcmp(engine_json_str(&d, s), "x\xc3\xa9\xf0\x9f\x98\x80\n", 8) == 0);
    CHECK(engine_json_get(&d, &d.nodes[0], "zz") == NULL);
    engine_json_deinit(&d);

    static const char *bad[] = {
        "", " ", "{", "[1,]", "[1 2]", "{\"a\" 1}", "{\"a\":}", "{a:1}", "[01]", "[-]", "[1.]",
        "[1e]", "[.5]", "[+1]", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"",
        "\"\\ud800\\u0041\"", "\"a\nb\"", "\"\xff\"", "\"\xc3\"", "\"\xed\xa0\x80\"", "[1] x",
        "tru", "nul", "[true false]", "{\"a\":1,}", "\"unterminated", "[\"\\",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = engine_json_parse(&d, bad[i], strlen(bad[i]), "t");
        if (rc != ENGINE_EFORMAT) {
            fprintf(stderr, "bad JSON #%zu accepted (rc %d)\n", i, rc);
            failures++;
            if (!rc) engine_json_deinit(&d);
        }
    }
    /* depth limit */
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    CHECK(engine_json_parse(&d, deep, 200, "t") == ENGINE_EFORMAT);
    CHECK(engine_json_parse(&d, deep, 60, "t") == ENGINE_EFORMAT); /* truncated */
    CHECK(engine_json_parse(&d, deep + 40, 120, "t") == 0); /* 60 deep is fine */
    engine_json_deinit(&d);
}

static void test_spec(void) {
    engine_tokenizer_spec *spec;
    char *j = make_json(1);
    CHECK(engine_tokenizer_spec_from_hf(&spec, j, strlen(j), CONFIG, strlen(CONFIG)) == 0);
    CHECK(spec->n_tokens == 303 && spec->n_merges == 9);
    CHECK(strcmp(spec->merges[5], "\xc4\xa0 w") == 0); /* ["Ġ","w"] -> "Ġ w" */
    CHECK(spec->token_types[0] == ENGINE_TOKEN_NORMAL);
    CHECK(spec->token_types[300] == ENGINE_TOKEN_CONTROL);
    CHECK(spec->token_types[302] == ENGINE_TOKEN_USER_DEFINED);
    CHECK(spec->eos_id == 300 && spec->pad_id == 301 && spec->bos_id == -1);
    CHECK(spec->chat_template && strcmp(spec->chat_template, "{{ x }}") == 0);
    CHECK(strcmp(spec->model, "gpt2") == 0 && strcmp(spec->pre, "qwen2") == 0);
    CHECK(engine_tokenizer_spec_pad(spec, 310) == 0);
    CHECK(spec->n_tokens == 310 && strcmp(spec->tokens[309], "[PAD309]") == 0 &&
          spec->token_types[309] == ENGINE_TOKEN_UNUSED);
    CHECK(engine_tokenizer_spec_pad(spec, 300) == ENGINE_EINVAL);
    engine_tokenizer *tok;
    CHECK(engine_tokenizer_new(&tok, spec) == 0);
    CHECK(engine_tokenizer_n_vocab(tok) == 310);
    engine_tokenizer_free(tok);

    /* compile errors */
    CHECK(engine_tokenizer_spec_set_string(&spec->pre, "llama3", 6) == 0);
    CHECK(engine_tokenizer_new(&tok, spec) == ENGINE_EUNSUPPORTED && tok == NULL);
    CHECK(engine_tokenizer_spec_set_string(&spec->pre, "qwen2", 5) == 0);
    CHECK(engine_tokenizer_spec_set_merge(spec, 0, "h zz", 4) == 0);
    CHECK(engine_tokenizer_new(&tok, spec) == ENGINE_EFORMAT);
    char longm[2100];
    memset(longm, 'e', sizeof longm);
    longm[0] = 'h';
    longm[1] = ' ';
    CHECK(engine_tokenizer_spec_set_merge(spec, 0, longm, sizeof longm) == 0);
    CHECK(engine_tokenizer_new(&tok, spec) == ENGINE_EFORMAT); /* over-long side, no overflow */
    CHECK(engine_tokenizer_spec_set_merge(spec, 0, "h e", 3) == 0);
    CHECK(engine_tokenizer_spec_set_token(spec, 65, "B", 1, ENGINE_TOKEN_NORMAL) == 0);
    CHECK(engine_tokenizer_new(&tok, spec) == ENGINE_EFORMAT); /* duplicate "B" */
    CHECK(engine_tokenizer_spec_set_token(spec, 65, "A", 1, ENGINE_TOKEN_NORMAL) == 0);
    CHECK(engine_tokenizer_spec_set_token(spec, 7, "a b", 3, ENGINE_TOKEN_NORMAL) == 0);
    CHECK(engine_tokenizer_new(&tok, spec) == ENGINE_EFORMAT); /* ' ' is not byte-level */
    CHECK(engine_tokenizer_spec_set_token(spec, 7, "a\0b", 3, ENGINE_TOKEN_NORMAL) == ENGINE_EINVAL);
    CHECK(engine_tokenizer_spec_set_token(spec, 400, "x", 1, ENGINE_TOKEN_NORMAL) == ENGINE_EINVAL);
    engine_tokenizer_spec_free(spec);
    engine_tokenizer_spec_free(NULL);

    /* reader errors */
    static const char *unsup[] = {"\"type\": \"NFC\"", "\"Isolated\"", "\"use_regex\": false"};
    static const char *repl[] = {"\"type\": \"NFKC\"", "\"Removed\"", "\"use_regex\": true"};
    for (int i = 0; i < 3; i++) {
        char *js = NULL;
        CHECK(engine_tokenizer_spec_set_string(&js, make_json(0), strlen(make_json(0))) == 0);
        char *p = strstr(js, unsup[i]);
        CHECK(p != NULL);
        size_t n = strlen(js) + 32;
        char *mod = malloc(n);
        snprintf(mod, n, "%.*s%s%s", (int)(p - js), js, repl[i], p + strlen(unsup[i]));
        CHECK(engine_tokenizer_spec_from_hf(&spec, mod, strlen(mod), NULL, 0) == ENGINE_EUNSUPPORTED);
        free(mod);
        free(js);
    }
    /* an id far past the number of tokens: refused before any table is sized by it */
    {
        char *js = NULL;
        j = make_json(0);
        CHECK(engine_tokenizer_spec_set_string(&js, j, strlen(j)) == 0);
        char *p = strstr(js, "\"id\": 302");
        CHECK(p != NULL);
        size_t n = strlen(js) + 32;
        char *mod = malloc(n);
        snprintf(mod, n, "%.*s\"id\": 1000000000%s", (int)(p - js), js, p + strlen("\"id\": 302"));
        CHECK(engine_tokenizer_spec_from_hf(&spec, mod, strlen(mod), NULL, 0) ==
              ENGINE_EUNSUPPORTED);
        CHECK(strstr(engine_error_last(), "ids go up to 1000000000 but there are only 303 tokens"));
        free(mod);
        free(js);
    }
    const char *cfg_bad = "{\"eos_token\": \"<|nope|>\"}";
    j = make_json(0);
    CHECK(engine_tokenizer_spec_from_hf(&spec, j, strlen(j), cfg_bad, strlen(cfg_bad)) == ENGINE_EFORMAT);
    CHECK(engine_tokenizer_spec_from_hf(&spec, "{}", 2, NULL, 0) == ENGINE_EFORMAT);
    CHECK(engine_tokenizer_spec_from_hf(&spec, "[", 1, NULL, 0) == ENGINE_EFORMAT);
    CHECK(engine_tokenizer_spec_from_hf_files(&spec, "/nonexistent/tokenizer.json", NULL) == ENGINE_EIO);
}

/* the pieces the pre-tokenizer cuts `text` into, joined by '|' */
static void expect_split(const char *text, const char *want) {
    char got[512];
    size_t w = 0, n = strlen(text);
    for (size_t i = 0; i < n;) {
        size_t j = engine_pretok_qwen2_next((const unsigned char *)text, n, i);
        if (j <= i || j > n) {
            fprintf(stderr, "pretok stalls at %zu in \"%s\"\n", i, text);
            failures++;
            return;
        }
        if (i) got[w++] = '|';
        memcpy(got + w, text + i, j - i);
        w += j - i;
        i = j;
    }
    got[w] = 0;
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "split(\"%s\") = \"%s\", want \"%s\"\n", text, got, want);
        failures++;
    }
}

static void test_pretokenizer(void) {
    expect_split("Hello world", "Hello| world");
    expect_split("I'M fine, they're here", "I|'M| fine|,| they|'re| here");
    expect_split("it'S 'Ll 'x 'LL", "it|'S| '|Ll| '|x| '|LL");
    expect_split("a  b", "a| | b");
    expect_split("x\r\n\r\n  y", "x|\r\n\r\n| | y");
    expect_split("a \n", "a| \n");
    expect_split("x   ", "x|   ");
    expect_split("12345", "1|2|3|4|5");
    expect_split("foo.bar", "foo|.bar");
    expect_split("!!!\n\nx", "!!!\n\n|x");
    expect_split(" ?! x", " ?!| x");
    expect_split("\t\tx", "\t|\tx");
    expect_split("int main(void) {", "int| main|(void|)| {");
    expect_split("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac", "caf\xc3\xa9| \xe6\x97\xa5\xe6\x9c\xac");
    expect_split("\xc2\xa0x y\xe3\x80\x80z", "\xc2\xa0x| y|\xe3\x80\x80z"); /* NBSP, U+3000 */
    expect_split("x\xef\xbb\xbfy", "x|\xef\xbb\xbfy"); /* U+FEFF is not White_Space */
    expect_split("a\xc2\x85\xc2\x85", "a|\xc2\x85\xc2\x85"); /* U+0085 is */
    expect_split("3x", "3|x");
    expect_split("\xd9\xa3\xd9\xa4", "\xd9\xa3|\xd9\xa4"); /* Arabic-Indic digits */
    expect_split("\n\nabc", "\n\n|abc");
    expect_split(" \n \n  x", " \n \n| | x");
}

static void test_encode(const engine_tokenizer *tok) {
    expect_ids(tok, "hello", true, 259, -1);
    expect_ids(tok, "hellhe", true, 258, 256, -1);
    expect_ids(tok, "aaa", true, 260, 'a', -1); /* leftmost wins on equal rank */
    expect_ids(tok, "aaaa", true, 260, 260, -1);
    expect_ids(tok, "hello world", true, 259, 261, 263, 'l', 'd', -1);
    expect_ids(tok, "word", true, 264, 'd', -1);
    expect_ids(tok, "", true, -1);
    /* added tokens: longest first, CONTROL ones only with parse_special */
    expect_ids(tok, "a<|end|>b", true, 'a', 300, 'b', -1);
    expect_ids(tok, "<|endless|><|end|", true, 301, '<', '|', 'e', 'n', 'd', '|', -1);
    expect_ids(tok, "a<|end|>", false, 'a', '<', '|', 'e', 'n', 'd', '|', '>', -1);
    expect_ids(tok, "<x><|end|>", false, 302, '<', '|', 'e', 'n', 'd', '|', '>', -1);
    /* invalid UTF-8 becomes U+FFFD (EF BF BD) per maximal subpart */
    expect_ids(tok, "\xf0\x9f\x98", true, 0xEF, 0xBF, 0xBD, -1);
    expect_ids(tok, "\xc0\x80", true, 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD, -1);
    /* NFC: e + U+0301 -> U+00E9 (C3 A9) */
    expect_ids(tok, "e\xcc\x81", true, 0xC3, 0xA9, -1);

    int32_t ids[4];
    size_t n;
    CHECK(engine_tokenizer_encode(tok, "hello world", 11, true, ids, 2, &n) == ENGINE_ERANGE);
    CHECK(n == 5 && ids[0] == 259 && ids[1] == 261);
    CHECK(engine_tokenizer_encode(tok, "hello world", 11, true, NULL, 0, &n) == ENGINE_ERANGE &&
          n == 5);
    int32_t *all;
    CHECK(engine_tokenizer_encode_alloc(tok, "hello", 5, true, &all, &n) == 0 && n == 1 &&
          all[0] == 259);
    free(all);

    CHECK(engine_tokenizer_find(tok, "<x>", 3) == 302);
    CHECK(engine_tokenizer_find(tok, "hello", 5) == 259);
    CHECK(engine_tokenizer_find(tok, "nope!", 5) == -1);
    CHECK(engine_tokenizer_is_special(tok, 300) && !engine_tokenizer_is_special(tok, 302));
    CHECK(engine_tokenizer_is_eog(tok, 300) && !engine_tokenizer_is_eog(tok, 301));
    CHECK(engine_tokenizer_eos(tok) == 300 && engine_tokenizer_pad(tok) == 301 &&
          engine_tokenizer_bos(tok) == -1);
    CHECK(engine_tokenizer_token_type(tok, 999) == ENGINE_TOKEN_UNDEFINED);
    size_t len;
    const char *b = engine_tokenizer_token_bytes(tok, 262, &len);
    CHECK(b && len == 3 && memcmp(b, " wo", 3) == 0);
    CHECK(engine_tokenizer_token_bytes(tok, -1, &len) == NULL && len == 0);
    CHECK(strcmp(engine_tokenizer_chat_template(tok), "{{ x }}") == 0);
}

static void expect_utf8(const char *in, size_t n, const char *want) {
    char *out;
    size_t on;
    CHECK(engine_utf8_sanitize(in, n, &out, &on) == 0);
    const char *got = out ? out : in;
    size_t gl = out ? on : n;
    if (gl != strlen(want) || memcmp(got, want, gl)) {
        fprintf(stderr, "sanitize mismatch for %zu-byte input\n", n);
        failures++;
    }
    free(out);
}

static void expect_nfc(const char *in, const char *want) {
    char *out;
    size_t on;
    CHECK(engine_unicode_nfc(in, strlen(in), &out, &on) == 0);
    const char *got = out ? out : in;
    size_t gl = out ? on : strlen(in);
    if (gl != strlen(want) || memcmp(got, want, gl)) {
        fprintf(stderr, "NFC(\"%s\") = \"%.*s\", want \"%s\"\n", in, (int)gl, got, want);
        failures++;
    }
    free(out);
}

#define FFFD "\xef\xbf\xbd"
static void test_unicode(void) {
    expect_utf8("abc", 3, "abc");
    expect_utf8("\xf0\x9f\x98" "a", 4, FFFD "a");
    expect_utf8("\xed\xa0\x80", 3, FFFD FFFD FFFD);
    expect_utf8("\xe0\x80\x80", 3, FFFD FFFD FFFD);
    expect_utf8("\xf4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD);
    expect_utf8("\xe2\x82", 2, FFFD);
    expect_utf8("\xc3\xc3\xa9", 3, FFFD "\xc3\xa9");
    expect_utf8("\xff\xfe", 2, FFFD FFFD);
    expect_utf8("\xef\xbf\xbe", 3, "\xef\xbf\xbe"); /* a noncharacter is valid UTF-8 */

    expect_nfc("e\xcc\x81", "\xc3\xa9");
    expect_nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81");  /* jamo -> 각 */
    expect_nfc("s\xcc\x87\xcc\xa3", "\xe1\xb9\xa9");                     /* -> ṩ */
    expect_nfc("\xe2\x84\xab", "\xc3\x85");                              /* Å sign -> Å */
    expect_nfc("a\xcc\x81\xcc\x96", "\xc3\xa1\xcc\x96");                 /* reorder + compose */
    expect_nfc("\xc8\x8e\xcc\xa8", "\xc7\xaa\xcc\x91");                  /* Ȏ + ogonek */
    expect_nfc("<\xcc\xb8", "\xe2\x89\xae");                             /* < + U+0338 -> ≮ */
    expect_nfc("plain ascii", "plain ascii");
    expect_nfc("\xcc\x81x", "\xcc\x81x");                                /* leading mark */
}

static void test_decode(const engine_tokenizer *tok) {
    /* 😀 = F0 9F 98 80, fed byte by byte */
    int32_t ids[] = {'a', 0xF0, 0x9F, 0x98, 0x80, 'b', 0xF0, 0x9F, 'c', 300, 0xE2, 0x82};
    size_t n = sizeof ids / sizeof ids[0];
    char *text;
    size_t len;
    CHECK(engine_tokenizer_decode(tok, ids, n, false, &text, &len) == 0);
    const char *want = "a\xf0\x9f\x98\x80" "b" FFFD "c<|end|>" FFFD;
    CHECK(len == strlen(want) && memcmp(text, want, len) == 0);
    free(text);
    CHECK(engine_tokenizer_decode(tok, ids, n, true, &text, &len) == 0);
    const char *want2 = "a\xf0\x9f\x98\x80" "b" FFFD "c" FFFD;
    CHECK(len == strlen(want2) && memcmp(text, want2, len) == 0);
    free(text);
    int32_t bad = 5000;
    CHECK(engine_tokenizer_decode(tok, &bad, 1, false, &text, &len) == ENGINE_EINVAL);

    engine_detok *d;
    CHECK(engine_detok_new(&d, tok, false) == 0);
    const char *p;
    size_t pl;
    const char *expect[] = {"a", "", "", "", "\xf0\x9f\x98\x80", "b", "", "", FFFD "c", "<|end|>",
                            "", ""};
    for (size_t i = 0; i < n; i++) {
        CHECK(engine_detok_feed(d, ids[i], &p, &pl) == 0);
        if (pl != strlen(expect[i]) || memcmp(p, expect[i], pl)) {
            fprintf(stderr, "detok step %zu: got \"%.*s\", want \"%s\"\n", i, (int)pl, p, expect[i]);
            failures++;
        }
    }
    CHECK(engine_detok_pending(d) == 2);
    engine_detok_flush(d, &p, &pl);
    CHECK(pl == 3 && memcmp(p, FFFD, 3) == 0 && engine_detok_pending(d) == 0);
    CHECK(engine_detok_feed(d, -3, &p, &pl) == ENGINE_EINVAL);
    /* ill-formed as soon as proven: F0 then 'x' */
    CHECK(engine_detok_feed(d, 0xF0, &p, &pl) == 0 && pl == 0);
    CHECK(engine_detok_feed(d, 'x', &p, &pl) == 0 && pl == 4 && memcmp(p, FFFD "x", 4) == 0);
    /* C0 can never start a character: replaced at once */
    CHECK(engine_detok_feed(d, 0xC0, &p, &pl) == 0 && pl == 3);
    engine_detok_reset(d);
    engine_detok_free(d);
    engine_detok_free(NULL);
    CHECK(engine_detok_new(&d, tok, true) == 0);
    CHECK(engine_detok_feed(d, 300, &p, &pl) == 0 && pl == 0);
    engine_detok_free(d);
}

int main(void) {
    test_json_reader();
    test_spec();
    test_pretokenizer();
    test_unicode();
    engine_tokenizer *tok = make_tok();
    test_encode(tok);
    test_decode(tok);
    engine_tokenizer_free(tok);
    engine_tokenizer_free(NULL);
    free(buf);
    if (failures) {
        fprintf(stderr, "test_tokenizer: %d failures\n", failures);
        return 1;
    }
    printf("test_tokenizer: ok\n");
    return 0;
}
