/* Constrained generation from >= 200 JSON Schemas (hand-written real-world ones from
 * tests/fixtures/grammars/schemas_real.json plus generated ones: nesting, recursion, enums,
 * unions, bounded arrays, patterns, formats, integer ranges) x 20 samples each, with the real
 * Qwen3 vocabulary and a random-logit "model". Every output must parse with Jansson here and
 * validate with ajv (tests/grammars/validate_ajv.js). Also the tool-call grammars of
 * tests/fixtures/grammars/agent_tools.json in both formats. */
#include "qwen_vocab.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SAMPLES 20
#define GENERATED 170

static test_rng R = {12345};

static json_t *gen_schema(int depth, json_t *defs, int *n_defs);

static json_t *gen_string_schema(void) {
    static const char *const patterns[] = {"^[a-z]{1,6}$", "^\\d{2}-\\d{2}$", "x.y", "^(ab|cd)+$",
                                           "^[^,;]{0,5}$", "^\\w+@\\w+\\.com$", "^\\s?[A-F0-9]{4}$"};
    static const char *const formats[] = {"date", "time", "date-time", "uuid", "email", "uri", "ipv4"};
    json_t *s = json_pack("{s:s}", "type", "string");
    switch (test_rng_below(&R, 6)) {
    case 0: {
        int lo = (int)test_rng_below(&R, 4);
        json_object_set_new(s, "minLength", json_integer(lo));
        json_object_set_new(s, "maxLength", json_integer(lo + (int)test_rng_below(&R, 8)));
        break;
    }
    case 1: json_object_set_new(s, "pattern", json_string(patterns[test_rng_below(&R, 7)])); break;
    case 2: json_object_set_new(s, "format", json_string(formats[test_rng_below(&R, 7)])); break;
    case 3: {
        json_t *e = json_array();
        int n = 1 + (int)test_rng_below(&R, 5);
        for (int i = 0; i < n; i++) {
            char b[32];
            snprintf(b, sizeof b, "v%d_%c\"%s", i, 'a' + (int)test_rng_below(&R, 26), i % 2 ? "é" : "\\");
            json_array_append_new(e, json_string(b));
        }
        json_object_set_new(s, "enum", e);
        break;
    }
    default: break;
    }
    return s;
}

static json_t *gen_int_schema(void) {
    json_t *s = json_pack("{s:s}", "type", "integer");
    long long a = (long long)test_rng_below(&R, 2000) - 1000, b = a + (long long)test_rng_below(&R, 5000);
    switch (test_rng_below(&R, 5)) {
    case 0: json_object_set_new(s, "minimum", json_integer(a)); break;
    case 1: json_object_set_new(s, "maximum", json_integer(b)); break;
    case 2:
        json_object_set_new(s, "minimum", json_integer(a));
        json_object_set_new(s, "maximum", json_integer(b));
        break;
    case 3: json_object_set_new(s, "exclusiveMinimum", json_integer(a)); break;
    default: break;
    }
    return s;
}

static json_t *gen_schema(int depth, json_t *defs, int *n_defs) {
    unsigned k = test_rng_below(&R, depth > 3 ? 6 : 13);
    switch (k) {
    case 0: case 1: return gen_string_schema();
    case 2: return gen_int_schema();
    case 3: {
        json_t *s = json_pack("{s:s}", "type", "number");
        if (test_rng_below(&R, 2)) json_object_set_new(s, "minimum", json_integer(0));
        return s;
    }
    case 4: return json_pack("{s:s}", "type", test_rng_below(&R, 2) ? "boolean" : "null");
    case 5: return json_pack("{s:[s,i,b,n]}", "enum", "x", (int)test_rng_below(&R, 9), 1);
    case 6: case 7: case 8: { /* object */
        json_t *props = json_object(), *req = json_array();
        int n = 1 + (int)test_rng_below(&R, 5);
        for (int i = 0; i < n; i++) {
            char name[16];
            snprintf(name, sizeof name, "%c%d", 'a' + (int)test_rng_below(&R, 26), i);
            json_object_set_new(props, name, gen_schema(depth + 1, defs, n_defs));
            if (test_rng_below(&R, 2)) json_array_append_new(req, json_string(name));
        }
        json_t *s = json_pack("{s:s,s:o,s:o}", "type", "object", "properties", props, "required", req);
        unsigned ap = test_rng_below(&R, 4);
        if (ap == 0) json_object_set_new(s, "additionalProperties", json_false());
        if (ap == 1) json_object_set_new(s, "additionalProperties", gen_schema(depth + 2, defs, n_defs));
        return s;
    }
    case 9: case 10: { /* array */
        json_t *s = json_pack("{s:s,s:o}", "type", "array", "items", gen_schema(depth + 1, defs, n_defs));
        int lo = (int)test_rng_below(&R, 3);
        if (test_rng_below(&R, 2)) json_object_set_new(s, "minItems", json_integer(lo));
        if (test_rng_below(&R, 2)) json_object_set_new(s, "maxItems", json_integer(lo + (int)test_rng_below(&R, 4)));
        if (test_rng_below(&R, 4) == 0) {
            json_t *p = json_array();
            json_array_append_new(p, gen_schema(depth + 1, defs, n_defs));
            json_object_set_new(s, "prefixItems", p);
        }
        return s;
    }
    case 11: { /* union */
        if (test_rng_below(&R, 2))
            return json_pack("{s:[s,s],s:i}", "type", "string", "null", "maxLength", 6);
        return json_pack("{s:[o,o,{s:s}]}", "anyOf", gen_schema(depth + 1, defs, n_defs),
                         gen_schema(depth + 1, defs, n_defs), "type", "boolean");
    }
    default: { /* recursive definition */
        char name[16], ref[32];
        snprintf(name, sizeof name, "d%d", (*n_defs)++);
        snprintf(ref, sizeof ref, "#/$defs/%s", name);
        json_t *node = json_pack("{s:s,s:{s:o,s:{s:s,s:{s:s},s:i}},s:[s]}", "type", "object", "properties",
                                 "v", gen_schema(depth + 2, defs, n_defs), "kids", "type", "array",
                                 "items", "$ref", ref, "maxItems", 2, "required", "v");
        json_object_set_new(defs, name, node);
        return json_pack("{s:s}", "$ref", ref);
    }
    }
}

static int run_node(const char *jsonl) {
    char script[4096], cmd[9000];
    test_source_path("tests/grammars/validate_ajv.js", script, sizeof script);
    snprintf(cmd, sizeof cmd, "node '%s' '%s'", script, jsonl);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc)) return 1;
    return WEXITSTATUS(rc);
}

int main(int argc, char **argv) {
    /* "quick": 20 hand-written + 10 generated schemas (for sanitizer builds); default: all */
    int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    int generated = quick ? 10 : GENERATED;
    if (system("node --version > /dev/null 2>&1") != 0) {
        printf("SKIP: node is not installed\n");
        return 77;
    }
    qwen_vocab qv;
    int rc = qwen_vocab_load(&qv);
    if (rc) return rc;
    char path[4096];
    json_error_t je;
    json_t *real = json_load_file(test_source_path("tests/fixtures/grammars/schemas_real.json", path, sizeof path), 0, &je);
    if (!json_is_array(real)) {
        fprintf(stderr, "schemas_real.json: %s\n", je.text);
        return 1;
    }
    json_t *all = json_deep_copy(real);
    while (quick && json_array_size(all) > 20) json_array_remove(all, json_array_size(all) - 1);
    for (int i = 0; i < generated; i++) {
        json_t *defs = json_object();
        int n_defs = 0;
        json_t *s = gen_schema(0, defs, &n_defs);
        if (n_defs) json_object_set(s, "$defs", defs);
        json_decref(defs);
        json_array_append_new(all, s);
    }
    char jsonl[] = "/tmp/grammar_ajv_XXXXXX";
    int fd = mkstemp(jsonl);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) return 1;
    uint32_t *mask = malloc((QWEN_N_VOCAB + 31) / 32 * sizeof *mask);
    int32_t eog = QWEN_IM_END;
    int failures = 0, n_schemas = 0, n_outputs = 0;
    double build_ms = 0;
    size_t i;
    json_t *s;
    json_array_foreach(all, i, s) {
        char *text = json_dumps(s, JSON_ENCODE_ANY | JSON_COMPACT);
        grammar *g = NULL;
        if (grammar_new_json_schema(&g, text, strlen(text))) {
            fprintf(stderr, "schema %zu does not compile: %s\n  %s\n", i, grammar_error_last(), text);
            free(text);
            failures++;
            continue;
        }
        free(text);
        grammar_index *ix = NULL;
        grammar_matcher *m = NULL;
        if (grammar_index_new(&ix, g, qv.vocab) || grammar_matcher_new(&m, ix, &eog, 1)) {
            fprintf(stderr, "index/matcher: %s\n", grammar_error_last());
            return 1;
        }
        json_t *outs = json_array();
        for (int k = 0; k < SAMPLES; k++) {
            grammar_matcher_reset(m);
            char *out = NULL;
            size_t len = 0;
            if (test_generate(m, &qv, &R, 4 + (int)test_rng_below(&R, 24), 3000, &out, &len, mask)) {
                fprintf(stderr, "schema %zu sample %d: generation failed (text so far: %s)\n", i, k, out ? out : "");
                failures++;
                free(out);
                break;
            }
            json_error_t e;
            json_t *parsed = json_loadb(out ? out : "", len, JSON_DECODE_ANY, &e);
            if (!parsed) {
                fprintf(stderr, "schema %zu: output is not JSON (%s): %s\n", i, e.text, out);
                failures++;
            }
            json_decref(parsed);
            json_array_append_new(outs, json_stringn(out ? out : "", len));
            n_outputs++;
            free(out);
        }
        json_t *rec = json_pack("{s:O,s:o}", "schema", s, "outputs", outs);
        char *line = json_dumps(rec, JSON_COMPACT);
        fprintf(f, "%s\n", line);
        free(line);
        json_decref(rec);
        n_schemas++;
        build_ms += grammar_index_build_ms(ix);
        grammar_matcher_free(m);
        grammar_index_free(ix);
        grammar_free(g);
    }
    fclose(f);
    printf("generated %d outputs for %d schemas, %d failures here (token caches: %.0f ms)\n",
           n_outputs, n_schemas, failures, build_ms);
    int ajv = run_node(jsonl);
    if (ajv == 77) {
        printf("SKIP: ajv missing\n");
    } else if (ajv != 0) {
        failures++;
    }
    if (!getenv("KEEP_JSONL")) unlink(jsonl);
    else printf("kept %s\n", jsonl);
    json_decref(all);
    json_decref(real);
    free(mask);
    qwen_vocab_free(&qv);
    if (!quick && n_schemas < 200) {
        fprintf(stderr, "only %d schemas\n", n_schemas);
        return 1;
    }
    return failures ? 1 : (ajv == 77 ? 77 : 0);
}
