/* GBNF syntax, errors with positions, the matcher on raw bytes (a 256-token byte vocabulary),
 * JSON Schema compilation (accepted and rejected strings, exhaustive integer ranges, patterns,
 * formats, errors with JSON pointers), tool-call grammars in both formats and all modes. */
#include "grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
static grammar_vocab *bytes_vocab;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            failures++;                                                                           \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);              \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fprintf(stderr, "\n");                                                                \
        }                                                                                         \
    } while (0)

/* 1: s is a complete sentence; 0: a proper prefix only; -1: rejected. */
static int match(grammar *g, const char *s) {
    grammar_index *ix;
    grammar_matcher *m;
    int32_t eog = 256; /* an extra id, no bytes */
    if (grammar_index_new(&ix, g, bytes_vocab) || grammar_matcher_new(&m, ix, &eog, 1)) {
        fprintf(stderr, "matcher: %s\n", grammar_error_last());
        exit(1);
    }
    int rc = grammar_matcher_accept_bytes(m, s, strlen(s));
    int r = rc ? -1 : grammar_matcher_is_complete(m) ? 1 : 0;
    grammar_matcher_free(m);
    grammar_index_free(ix);
    return r;
}

static grammar *gbnf(const char *text) {
    grammar *g = NULL;
    if (grammar_new_gbnf(&g, text, strlen(text), NULL)) {
        failures++;
        fprintf(stderr, "grammar does not compile: %s\n%s\n", grammar_error_last(), text);
    }
    return g;
}

static void expect_gbnf(const char *text, const char *const *yes, const char *const *prefix,
                        const char *const *no) {
    grammar *g = gbnf(text);
    if (!g) return;
    for (int i = 0; yes && yes[i]; i++) CHECK(match(g, yes[i]) == 1, "grammar %s: '%s' should match", text, yes[i]);
    for (int i = 0; prefix && prefix[i]; i++)
        CHECK(match(g, prefix[i]) == 0, "grammar %s: '%s' should be a prefix only", text, prefix[i]);
    for (int i = 0; no && no[i]; i++) CHECK(match(g, no[i]) == -1, "grammar %s: '%s' should be rejected", text, no[i]);
    grammar_free(g);
}

static void expect_gbnf_error(const char *text, const char *where) {
    grammar *g = NULL;
    int rc = grammar_new_gbnf(&g, text, strlen(text), NULL);
    CHECK(rc == GRAMMAR_EINVAL, "'%s' should fail with EINVAL, got %d", text, rc);
    CHECK(strstr(grammar_error_last(), where) != NULL, "'%s': error '%s' lacks '%s'", text,
          grammar_error_last(), where);
    grammar_free(g);
}

static grammar *schema(const char *json) {
    grammar *g = NULL;
    if (grammar_new_json_schema(&g, json, strlen(json))) {
        failures++;
        fprintf(stderr, "schema does not compile: %s\n%s\n", grammar_error_last(), json);
    }
    return g;
}

static void expect_schema(const char *json, const char *const *yes, const char *const *no) {
    grammar *g = schema(json);
    if (!g) return;
    for (int i = 0; yes && yes[i]; i++) CHECK(match(g, yes[i]) == 1, "schema %s: %s should match", json, yes[i]);
    for (int i = 0; no && no[i]; i++) CHECK(match(g, no[i]) != 1, "schema %s: %s should not match", json, no[i]);
    grammar_free(g);
}

static void expect_schema_error(const char *json, int code, const char *where) {
    char *text = NULL;
    int rc = grammar_schema_to_gbnf(&text, json, strlen(json));
    CHECK(rc == code, "schema %s should fail with %d, got %d", json, code, rc);
    CHECK(strstr(grammar_error_last(), where) != NULL, "schema %s: error '%s' lacks '%s'", json,
          grammar_error_last(), where);
    free(text);
}

static void test_syntax(void) {
    expect_gbnf("root ::= \"ab\" | \"c\"", (const char *[]){"ab", "c", NULL}, (const char *[]){"a", "", NULL},
                (const char *[]){"abc", "b", NULL});
    expect_gbnf("root ::= [a-c]+ [^a-c0-9]?", (const char *[]){"abc", "cx", "a!", NULL}, NULL,
                (const char *[]){"x", "a0", "ax!", NULL});
    expect_gbnf("root ::= x{2,3} y{2} z{1,}\nx ::= \"x\"\ny ::= \"y\"\nz ::= \"z\"",
                (const char *[]){"xxyyz", "xxxyyzzz", NULL}, (const char *[]){"xx", "xxxyy", NULL},
                (const char *[]){"xyyz", "xxxxyyz", "xxyz", NULL});
    expect_gbnf("root ::= ( \"a\"\n  | \"b\" ) # a comment\n  # another\n", (const char *[]){"a", "b", NULL}, NULL,
                (const char *[]){"c", NULL});
    expect_gbnf("root ::= \"\\x41\\u00e9\\n\\t\\\"\" [\\]\\-]", (const char *[]){"A\xc3\xa9\n\t\"]", "A\xc3\xa9\n\t\"-", NULL},
                NULL, (const char *[]){"Ae", NULL});
    /* UTF-8 classes: a token may end in the middle of a character */
    expect_gbnf("root ::= [α-ω]{2}", (const char *[]){"αω", NULL}, (const char *[]){"\xce", "α\xcf", NULL},
                (const char *[]){"a", "α\xce\x91", "\xff", NULL});
    expect_gbnf("root ::= . \"!\"", (const char *[]){"x!", "\xf0\x9f\x98\x80!", NULL}, NULL,
                (const char *[]){"\xed\xa0\x80!", "\xc0\x80!", NULL});
    expect_gbnf("root ::= a\na ::= \"(\" a \")\" | \"\"", (const char *[]){"", "()", "((()))", NULL},
                (const char *[]){"((", NULL}, (const char *[]){"())", NULL});
    expect_gbnf("root ::= [^\\x00-\\x7F]*", (const char *[]){"", "\xe6\x97\xa5", NULL}, NULL,
                (const char *[]){"a", NULL});
    /* errors with positions */
    expect_gbnf_error("root ::= foo\n", "1:10: undefined rule 'foo'");
    expect_gbnf_error("root ::= \"abc\n", "1:10: unterminated string");
    expect_gbnf_error("root ::= \"a\\q\"", "1:12: unknown escape");
    expect_gbnf_error("\n\nroot = \"a\"", "3:6: expected '::='");
    expect_gbnf_error("root ::= a\na ::= a \"x\" | \"y\"", "left recursion");
    expect_gbnf_error("root ::= b\nb ::= \"c\"? root", "left recursion");
    expect_gbnf_error("root ::= \"a\"{3,1}", "1:13: repetition maximum below its minimum");
    expect_gbnf_error("root ::= \"a\" )", "1:14: unmatched ')'");
    expect_gbnf_error("root ::= ( \"a\" ", "1:10: expected ')'");
    expect_gbnf_error("root ::= [z-a]", "1:11: character range out of order");
    expect_gbnf_error("root ::= \"a\"\nroot ::= \"b\"", "2:1: rule defined twice");
    expect_gbnf_error("a ::= \"x\"", "no rule named 'root'");
    expect_gbnf_error("root ::= <[12]>", "1:10: token references");
    expect_gbnf_error("", "no rules");
}

static void test_json_file(void) {
    char path[4096];
    const char *root = getenv("SPARK_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/grammars/json.gbnf", root ? root : ".");
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return;
    static char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    grammar *file = gbnf(text), *any = schema("{}");
    static const char *const samples[] = {
        "{}", "[]", "0", "-0.5e+10", "\"a\\u00e9\\n\"", "{\"a\": [1, true, null, {\"b\": \"c\"}]}",
        " [ 1 , 2 ] ", "12345678901234567", "1e100", "01", "[1,]", "{\"a\"}", "\"\\ud800\"", "tru",
        "\"\x01\"", "{\"a\":1,\"b\":2}", NULL};
    for (int i = 0; file && any && samples[i]; i++) {
        int a = match(file, samples[i]), b = match(any, samples[i]);
        /* json.gbnf allows outer whitespace, the schema grammar does not: compare trimmed */
        if (samples[i][0] == ' ') continue;
        CHECK(a == b, "json.gbnf (%d) and schema {} (%d) differ on %s", a, b, samples[i]);
    }
    CHECK(match(file, " [ 1 , 2 ] ") == 1, "json.gbnf with outer spaces");
    CHECK(match(file, "12345678901234567") == -1, "17-digit integers are out of the subset");
    grammar_free(file);
    grammar_free(any);
}

static grammar *shipped(const char *name) {
    char path[4096];
    const char *root = getenv("SPARK_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/grammars/%s", root ? root : ".", name);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return NULL;
    static char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    return gbnf(text);
}

static void test_shipped_tool_grammars(void) {
    grammar *h = shipped("hermes_tool_call.gbnf"), *x = shipped("qwen3_xml_tool_call.gbnf");
    if (h) {
        CHECK(match(h, "<tool_call>\n{\"name\": \"any\", \"arguments\": {\"a\": [1, {}]}}\n</tool_call>") == 1,
              "hermes file");
        CHECK(match(h, "<tool_call>\n{\"name\": 3") == -1, "hermes file: name is a string");
    }
    if (x) {
        CHECK(match(x, "<tool_call>\n<function=f>\n<parameter=p>\na <b> </param\n</parameter>\n</function>\n</tool_call>") == 1,
              "xml file");
        CHECK(match(x, "<tool_call>\n<function=f>\n<parameter=p>\na</parameter>x") == -1, "xml file: raw text");
    }
    grammar_free(h);
    grammar_free(x);
}

static void test_integer_ranges(void) {
    static const long long ranges[][2] = {{0, 0}, {0, 9}, {5, 123}, {-17, 42}, {-1000, -17}, {99, 1000},
                                          {-5, -5}, {123, 98765}, {10, 19}, {1, 100000}};
    for (size_t r = 0; r < sizeof ranges / sizeof *ranges; r++) {
        long long lo = ranges[r][0], hi = ranges[r][1];
        char js[200];
        snprintf(js, sizeof js, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", lo, hi);
        grammar *g = schema(js);
        if (!g) continue;
        long long step = (hi - lo) > 3000 ? 37 : 1;
        for (long long x = lo - 60; x <= hi + 60; x += (x > lo + 60 && x < hi - 60) ? step : 1) {
            char s[32];
            snprintf(s, sizeof s, "%lld", x);
            int want = x >= lo && x <= hi;
            CHECK((match(g, s) == 1) == want, "%s: %lld %s", js, x, want ? "rejected" : "accepted");
        }
        CHECK(match(g, "007") != 1, "%s: leading zeros", js);
        grammar_free(g);
    }
    expect_schema("{\"type\":\"integer\",\"exclusiveMinimum\":10,\"exclusiveMaximum\":13}",
                  (const char *[]){"11", "12", NULL}, (const char *[]){"10", "13", "1", NULL});
    expect_schema("{\"type\":\"integer\",\"maximum\":-3}", (const char *[]){"-3", "-1000000", NULL},
                  (const char *[]){"-2", "0", "5", NULL});
    expect_schema("{\"type\":\"number\",\"minimum\":2,\"maximum\":7}",
                  (const char *[]){"2", "6.999", "7", "7.00", "3.5", NULL},
                  (const char *[]){"1.99", "7.01", "8", "-3", NULL});
}

static void test_schemas(void) {
    expect_schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"integer\"}},"
                  "\"required\":[\"b\"],\"additionalProperties\":false}",
                  (const char *[]){"{\"b\":1}", "{\"a\":\"x\",\"b\":-2}", "{ \"a\" : \"\" , \"b\" : 0 }", NULL},
                  (const char *[]){"{}", "{\"a\":\"x\"}", "{\"b\":1,\"a\":\"x\"}", "{\"b\":1,}", "{\"b\":1.5}",
                                   "{\"b\":1,\"c\":2}", NULL});
    expect_schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                  "\"additionalProperties\":{\"type\":\"boolean\"}}",
                  (const char *[]){"{}", "{\"a\":1,\"x\":true}", "{\"zz\":false,\"ab\":true}", NULL},
                  (const char *[]){"{\"a\":true}", "{\"x\":1}", NULL});
    expect_schema("{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":2,\"maxItems\":3}",
                  (const char *[]){"[true,false]", "[true, true, true]", NULL},
                  (const char *[]){"[]", "[true]", "[true,true,true,true]", "[1,2]", NULL});
    expect_schema("{\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}",
                  (const char *[]){"[]", "[\"a\"]", "[\"a\",1]", NULL}, (const char *[]){"[\"a\",1,2]", "[1]", NULL});
    expect_schema("{\"enum\":[\"a\",1,null,{\"k\":[true]}]}",
                  (const char *[]){"\"a\"", "1", "null", "{\"k\":[true]}", NULL}, (const char *[]){"\"b\"", "2", NULL});
    expect_schema("{\"type\":[\"string\",\"null\"],\"maxLength\":2}",
                  (const char *[]){"null", "\"ab\"", "\"\\u00e9\\n\"", "\"\xc3\xa9x\"", NULL},
                  (const char *[]){"\"abc\"", "1", NULL});
    expect_schema("{\"type\":\"string\",\"minLength\":2}", (const char *[]){"\"ab\"", "\"\xf0\x9f\x98\x80\xf0\x9f\x98\x80\"", NULL},
                  (const char *[]){"\"a\"", "\"\xf0\x9f\x98\x80\"", NULL});
    expect_schema("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2,3}-\\\\d{3,5}$\"}",
                  (const char *[]){"\"AB-123\"", "\"XYZ-12345\"", NULL},
                  (const char *[]){"\"ABCD-123\"", "\"AB-12\"", "\"ab-123\"", NULL});
    expect_schema("{\"type\":\"string\",\"pattern\":\"a(b|c)d\"}", (const char *[]){"\"abd\"", "\"xxacdyy\"", NULL},
                  (const char *[]){"\"ad\"", "\"abcd\"", NULL});
    expect_schema("{\"type\":\"string\",\"pattern\":\"^[^\\\"]+$\"}", (const char *[]){"\"a\\\\b\"", "\"x\\ny\"", NULL},
                  (const char *[]){"\"a\\\"b\"", "\"\"", NULL});
    expect_schema("{\"type\":\"string\",\"format\":\"date-time\"}",
                  (const char *[]){"\"2024-02-28T23:59:59Z\"", "\"1999-12-28T00:00:00.123+05:30\"", NULL},
                  (const char *[]){"\"2024-13-01T00:00:00Z\"", "\"2024-02-29\"", "\"2024-02-30T00:00:00Z\"", NULL});
    expect_schema("{\"type\":\"string\",\"format\":\"uuid\"}",
                  (const char *[]){"\"123e4567-e89b-12d3-a456-426614174000\"", NULL},
                  (const char *[]){"\"123e4567e89b12d3a456426614174000\"", NULL});
    expect_schema("{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},"
                  "\"required\":[\"k\"]}},\"$ref\":\"#/$defs/n\"}",
                  (const char *[]){"{\"k\":[]}", "{\"k\":[{\"k\":[{\"k\":[]}]},{\"k\":[]}]}", NULL},
                  (const char *[]){"{}", "{\"k\":[{}]}", NULL});
    expect_schema("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"enum\":[\"x\"]}],\"description\":\"d\"}",
                  (const char *[]){"3", "\"x\"", NULL}, (const char *[]){"\"y\"", "true", NULL});
    expect_schema("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
                  "{\"properties\":{\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}]}",
                  (const char *[]){"{\"a\":1,\"b\":true}", NULL}, (const char *[]){"{\"a\":1}", "{\"b\":true}", NULL});
    expect_schema("{\"type\":\"boolean\",\"nullable\":true}", (const char *[]){"true", "null", NULL}, (const char *[]){"0", NULL});
    expect_schema("{\"type\":\"object\",\"properties\":{\"\xc3\xa9\\\"\":{\"const\":\"\\n\"}},\"required\":[\"\xc3\xa9\\\"\"]}",
                  (const char *[]){"{\"\xc3\xa9\\\"\":\"\\n\"}", NULL}, (const char *[]){"{}", NULL});
    /* a pattern whose DFA blows up with large state sets: refused by the bound on the sets' size,
     * before the per-rule state limit, so that a hostile schema costs little time and memory */
    {
        const char *js = "{\"type\":\"string\",\"pattern\":\"^(.*a.{10})*$\"}";
        grammar *g = NULL;
        int rc = grammar_new_json_schema(&g, js, strlen(js));
        CHECK(rc == GRAMMAR_ELIMIT && g == NULL, "schema %s: rc %d, want GRAMMAR_ELIMIT", js, rc);
        CHECK(strstr(grammar_error_last(),
                     "schema too complex: grammar too large (its states hold more "
                     "than 2097152 NFA states in all)") != NULL,
              "schema %s: error '%s'", js, grammar_error_last());
        grammar_free(g);
    }
    /* errors name the place */
    expect_schema_error("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"foo\":1}}}",
                        GRAMMAR_EUNSUPPORTED, "#/properties/a/foo");
    expect_schema_error("{\"type\":\"integer\",\"multipleOf\":3}", GRAMMAR_EUNSUPPORTED, "#/multipleOf");
    expect_schema_error("{\"$ref\":\"#/$defs/missing\"}", GRAMMAR_EUNSUPPORTED, "does not resolve");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", GRAMMAR_EUNSUPPORTED, "lookaround");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", GRAMMAR_EUNSUPPORTED, "backreference");
    expect_schema_error("{\"type\":\"string\",\"format\":\"hostname\"}", GRAMMAR_EUNSUPPORTED, "format 'hostname'");
    expect_schema_error("{\"type\":\"string\",\"maxLength\":5000}", GRAMMAR_EUNSUPPORTED, "maxLength");
    expect_schema_error("{\"type\":\"widget\"}", GRAMMAR_EINVAL, "bad type");
    expect_schema_error("{\"type\":\"integer\",\"minimum\":5,\"maximum\":1}", GRAMMAR_EINVAL, "no integer");
    expect_schema_error("{\"items\":[1,", GRAMMAR_EINVAL, "schema JSON 1:");
    expect_schema_error("false", GRAMMAR_EINVAL, "admits no value");
    expect_schema_error("{\"type\":\"array\",\"uniqueItems\":true}", GRAMMAR_EUNSUPPORTED, "uniqueItems");
    expect_schema_error("{\"type\":\"number\",\"minimum\":-1.5}", GRAMMAR_EUNSUPPORTED, "#");
}

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"path\":{\"type\":\"string\"},\"line\":{\"type\":\"integer\",\"minimum\":1}},"
    "\"required\":[\"path\"]}}},{\"name\":\"git_status\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"mode\":{\"type\":\"string\",\"enum\":[\"short\",\"long\"]}}}}]";

static grammar *tools(grammar_tool_format fmt, grammar_tool_mode mode, const char *name, int parallel) {
    grammar_tool_options o = GRAMMAR_TOOL_OPTIONS_INIT;
    o.format = fmt;
    o.mode = mode;
    o.name = name;
    o.parallel = parallel;
    grammar *g = NULL;
    if (grammar_new_tools(&g, TOOLS, strlen(TOOLS), &o)) {
        failures++;
        fprintf(stderr, "tools grammar: %s\n", grammar_error_last());
    }
    return g;
}

/* grammar_sampler_free on the lazy tool grammar: free (and the same mask) on plain text, not
 * free once the text ends in the trigger's beginning, nor once it is triggered; never for a
 * grammar that is not lazy. */
static void test_free_state(grammar *lazy, grammar *strict) {
    grammar_index *ix = NULL;
    grammar_matcher *m = NULL;
    int32_t eog = 256;
    uint32_t a[9], b[9], c[9];
    if (grammar_index_new(&ix, lazy, bytes_vocab) || grammar_matcher_new(&m, ix, &eog, 1)) {
        CHECK(0, "matcher: %s", grammar_error_last());
        grammar_index_free(ix);
        return;
    }
    CHECK(grammar_sampler_free(m, a, 257) == 1, "free at the start");
    CHECK(grammar_matcher_accept_bytes(m, "Let me look. ", 13) == 0, "text");
    CHECK(grammar_sampler_free(m, b, 257) == 1 && !memcmp(a, b, sizeof a),
          "free after text, the same mask");
    CHECK(grammar_matcher_mask(m, c, 257) == 0 && !memcmp(b, c, sizeof b), "the matcher's mask");
    CHECK(grammar_matcher_accept_bytes(m, "a <tool", 7) == 0, "a trigger's beginning");
    CHECK(grammar_sampler_free(m, NULL, 257) == 0, "not free after \"<tool\"");
    CHECK(grammar_matcher_accept_bytes(m, "box> x", 6) == 0, "not the trigger after all");
    CHECK(grammar_sampler_free(m, b, 257) == 1 && !memcmp(a, b, sizeof a), "free again");
    CHECK(grammar_matcher_accept_bytes(m, "<tool_call>", 11) == 0, "the trigger");
    CHECK(grammar_sampler_free(m, NULL, 257) == 0, "not free once triggered");
    grammar_matcher_free(m);
    grammar_index_free(ix);
    m = NULL;
    ix = NULL;
    if (grammar_index_new(&ix, strict, bytes_vocab) || grammar_matcher_new(&m, ix, &eog, 1)) {
        CHECK(0, "matcher: %s", grammar_error_last());
    } else {
        CHECK(grammar_sampler_free(m, NULL, 257) == 0, "a grammar that is not lazy");
    }
    grammar_matcher_free(m);
    grammar_index_free(ix);
}

static void test_tools(void) {
    const char *call1 = "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.c\", \"line\": 3}}\n</tool_call>";
    const char *call2 = "<tool_call>\n{\"name\": \"git_status\", \"arguments\": {}}\n</tool_call>";
    char two[1024];
    snprintf(two, sizeof two, "%s\n%s", call1, call2);
    grammar *g = tools(GRAMMAR_TOOLS_HERMES, GRAMMAR_TOOLS_REQUIRED, NULL, 1);
    if (g) {
        CHECK(match(g, call1) == 1, "hermes call");
        CHECK(match(g, two) == 1, "two calls");
        CHECK(match(g, "<tool_call>\n{\"name\": \"rm\"") == -1, "unknown tool");
        CHECK(match(g, "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"line\": 3}}\n</tool_call>") != 1,
              "missing required argument");
        CHECK(match(g, "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\", \"line\": 0}}") == -1,
              "minimum");
        CHECK(match(g, "Sure!") == -1, "required: no free text");
        grammar_free(g);
    }
    g = tools(GRAMMAR_TOOLS_HERMES, GRAMMAR_TOOLS_REQUIRED, NULL, 0);
    if (g) {
        CHECK(match(g, two) == -1, "not parallel: one call");
        grammar_free(g);
    }
    g = tools(GRAMMAR_TOOLS_HERMES, GRAMMAR_TOOLS_NAMED, "git_status", 1);
    if (g) {
        CHECK(match(g, call2) == 1, "named tool");
        CHECK(match(g, call1) == -1, "other tool refused");
        grammar_free(g);
    }
    g = tools(GRAMMAR_TOOLS_HERMES, GRAMMAR_TOOLS_AUTO, NULL, 1);
    grammar *req = tools(GRAMMAR_TOOLS_HERMES, GRAMMAR_TOOLS_REQUIRED, NULL, 1);
    if (g && req) test_free_state(g, req);
    grammar_free(req);
    if (g) {
        char s[2048];
        snprintf(s, sizeof s, "Let me look. %s", call1);
        CHECK(match(g, s) == 1, "auto: text then a call");
        CHECK(match(g, "Just text, no call.") == 1, "auto: text alone");
        CHECK(match(g, "text <tool_call>\n{\"name\": \"nope\"") == -1, "auto: grammar after the trigger");
        CHECK(match(g, "a <tool_ca") == 1, "auto: part of a trigger is text");
        grammar_free(g);
    }
    g = tools(GRAMMAR_TOOLS_HERMES, GRAMMAR_TOOLS_NONE, NULL, 1);
    if (g) {
        CHECK(match(g, "plain <b>text</b> <tool_cal x <<tool") == 1, "none: text");
        CHECK(match(g, "x <tool_call>") == -1, "none: no calls");
        CHECK(match(g, "<<tool_call>") == -1, "none: no calls after <");
        grammar_free(g);
    }
    g = tools(GRAMMAR_TOOLS_QWEN3_XML, GRAMMAR_TOOLS_REQUIRED, NULL, 1);
    if (g) {
        const char *x1 = "<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/a b.c\n</parameter>\n"
                         "<parameter=line>\n7\n</parameter>\n</function>\n</tool_call>";
        CHECK(match(g, x1) == 1, "xml call");
        CHECK(match(g, "<tool_call>\n<function=git_status>\n<parameter=mode>\nshort\n</parameter>\n</function>\n</tool_call>") == 1,
              "xml enum");
        CHECK(match(g, "<tool_call>\n<function=git_status>\n<parameter=mode>\nmedium") == -1, "xml enum refuses");
        CHECK(match(g, "<tool_call>\n<function=read_file>\n<parameter=line>\n7\n</parameter>\n</function>") == -1,
              "xml: required path first");
        CHECK(match(g, "<tool_call>\n<function=read_file>\n<parameter=path>\na</parameter>b\n</parameter>") == -1,
              "xml: raw text cannot contain the closing tag");
        grammar_free(g);
    }
}

int main(void) {
    const char *pieces[256];
    uint32_t lens[257];
    char raw[256];
    for (int i = 0; i < 256; i++) {
        raw[i] = (char)i;
        pieces[i] = &raw[i];
        lens[i] = 1;
    }
    const char *all[257];
    memcpy(all, pieces, sizeof pieces);
    all[256] = NULL;
    lens[256] = 0;
    if (grammar_vocab_new(&bytes_vocab, 257, all, lens)) {
        fprintf(stderr, "vocab: %s\n", grammar_error_last());
        return 1;
    }
    test_syntax();
    test_json_file();
    test_shipped_tool_grammars();
    test_integer_ranges();
    test_schemas();
    test_tools();
    grammar_vocab_free(bytes_vocab);
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("test_gbnf: all checks passed\n");
    return 0;
}
