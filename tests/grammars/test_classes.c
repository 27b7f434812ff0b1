/* Shared token caches of the index (grammars/mask.c): cache classes (states with equal caches
 * share one) and shared first-byte subtree walks must give exactly the caches each state gets
 * on its own. For free JSON, the project's tool set (Hermes and XML) and a recursive schema,
 * with the real Qwen3 vocabulary: states of shared classes (up to 40 per grammar, all of
 * JSON's) and representatives (up to 60) are built by an index that shares and by one that
 * does not (no_share), and compared as sets (accepted ids, uncertain ranks). Also: the classes
 * are fewer than the states, and some subtree walks were reused. The unshared index uses no
 * byte regions either (whole subtrees accepted at once from looping states), so the same
 * comparison checks them; some must have been built (strings, raw text, free text). The
 * grammars are the benchmark's (bench/grammars) plus tool mode none and a recursive schema. */
#include "qwen_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammars/grammar_int.h"

static int failures;
static unsigned long long total_hits;
static size_t total_regions;
static qwen_vocab qv;

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* The accepted ids of a cache as a sorted list (*n entries, caller frees). */
static int32_t *acc_list(const grammar_state_cache *c, size_t *n) {
    int32_t *l = malloc(((size_t)c->n_acc + 1) * sizeof *l);
    *n = 0;
    if (!l) abort();
    if (c->dense) {
        for (int32_t t = 0; t < QWEN_N_VOCAB; t++)
            if ((c->acc[t / 32] >> (t % 32)) & 1) l[(*n)++] = t;
    } else {
        for (uint32_t k = 0; k < c->n_acc; k++) l[(*n)++] = (int32_t)c->acc[k];
        qsort(l, *n, sizeof *l, cmp_i32);
    }
    return l;
}

static int same_cache(const grammar_state_cache *a, const grammar_state_cache *b) {
    size_t na, nb;
    int32_t *la = acc_list(a, &na), *lb = acc_list(b, &nb);
    int same = na == nb && !memcmp(la, lb, na * sizeof *la) && a->n_unc == b->n_unc;
    free(la);
    free(lb);
    if (!same) return 0;
    int32_t *ua = malloc(((size_t)a->n_unc + 1) * sizeof *ua);
    int32_t *ub = malloc(((size_t)b->n_unc + 1) * sizeof *ub);
    if (!ua || !ub) abort();
    if (a->n_unc) memcpy(ua, a->unc, a->n_unc * sizeof *ua);
    if (b->n_unc) memcpy(ub, b->unc, b->n_unc * sizeof *ub);
    qsort(ua, a->n_unc, sizeof *ua, cmp_i32);
    qsort(ub, b->n_unc, sizeof *ub, cmp_i32);
    same = !a->n_unc || !memcmp(ua, ub, a->n_unc * sizeof *ua);
    free(ua);
    free(ub);
    return same;
}

static void check(const char *name, grammar *g) {
    grammar_index *ix = NULL;
    if (grammar_index_new(&ix, g, qv.vocab)) {
        fprintf(stderr, "%s: %s\n", name, grammar_error_last());
        failures++;
        return;
    }
    grammar_index *own = NULL;
    if (grammar_index_new(&own, g, qv.vocab)) abort();
    own->no_share = 1;
    int shared = 0, reps = 0, checked = 0;
    for (int32_t q = 0; q < g->n_states; q++) {
        shared += g->has_bytes[q] && ix->rep[q] != q;
        reps += g->has_bytes[q] && ix->rep[q] == q;
    }
    int step_s = shared > 40 ? shared / 40 : 1, step_r = reps > 60 ? reps / 60 : 1, ks = 0, kr = 0;
    for (int32_t q = 0; q < g->n_states; q++) {
        if (!g->has_bytes[q]) continue;
        if (ix->rep[q] == q ? kr++ % step_r : ks++ % step_s) continue;
        const grammar_state_cache *cs, *co;
        if (grammar_index_state(ix, q, &cs) || grammar_index_state(own, q, &co)) abort();
        if (!same_cache(cs, co)) {
            fprintf(stderr, "%s: state %d (rule %s, representative %d): the shared cache "
                    "differs from its own\n", name, q, g->rule_names[g->state_rule[q]],
                    ix->rep[q]);
            failures++;
        }
        checked++;
    }
    printf("%s: %d states, %d classes, %d shared states, %d checked, %llu subtree walks "
           "reused, %zu byte regions\n", name, g->n_states, ix->n_classes, shared, checked,
           (unsigned long long)ix->sub_hits, ix->n_regions);
    if (own->n_regions) {
        fprintf(stderr, "%s: the unshared index used byte regions\n", name);
        failures++;
    }
    total_regions += ix->n_regions;
    if (ix->n_classes >= g->n_states) {
        fprintf(stderr, "%s: no state shares a cache\n", name);
        failures++;
    }
    total_hits += ix->sub_hits;
    grammar_index_free(own);
    grammar_index_free(ix);
}

int main(void) {
    if (qwen_vocab_load(&qv)) {
        printf("skip: the Qwen3 tokenizer is not installed (tests/node_modules)\n");
        return 77;
    }
    size_t n;
    char *json = test_read_source("grammars/json.gbnf", &n);
    grammar *g = NULL;
    if (!json || grammar_new_gbnf(&g, json, n, NULL)) return 1;
    check("free JSON", g);
    grammar_free(g);
    free(json);
    char *tools = test_read_source("tests/fixtures/grammars/agent_tools.json", &n);
    for (int f = 0; f < 3 && tools; f++) {
        static const char *const names[] = {"tools, Hermes", "tools, XML", "tools, none"};
        grammar_tool_options o = GRAMMAR_TOOL_OPTIONS_INIT;
        o.mode = f == 2 ? GRAMMAR_TOOLS_NONE : GRAMMAR_TOOLS_REQUIRED;
        o.format = f == 1 ? GRAMMAR_TOOLS_QWEN3_XML : GRAMMAR_TOOLS_HERMES;
        if (grammar_new_tools(&g, tools, n, &o)) return 1;
        check(names[f], g);
        grammar_free(g);
    }
    free(tools);
    static const char deep[] =
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"anyOf\":["
        "{\"type\":\"string\",\"maxLength\":40},{\"type\":\"integer\",\"minimum\":-5,\"maximum\":"
        "900},{\"$ref\":\"#\"}]},\"maxItems\":4},\"b\":{\"type\":\"string\",\"format\":\"date\"}},"
        "\"required\":[\"a\"]}";
    if (grammar_new_json_schema(&g, deep, strlen(deep))) return 1;
    check("recursive schema", g);
    grammar_free(g);
    static const char bench_deep[] = /* bench/grammars' deep nested schema */
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"b\":"
        "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"c\":{\"type\":"
        "\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":12},{\"type\":"
        "\"integer\",\"minimum\":-20,\"maximum\":300},{\"$ref\":\"#/$defs/t\"}]},\"maxItems\":3},"
        "\"d\":{\"enum\":[\"x\",\"y\",null]}},\"required\":[\"c\"]},\"minItems\":1,\"maxItems\":3}},"
        "\"required\":[\"b\"]},\"e\":{\"$ref\":\"#/$defs/t\"}},\"required\":[\"a\",\"e\"],\"$defs\":"
        "{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"string\",\"format\":"
        "\"date\"},\"w\":{\"type\":\"number\"},\"k\":{\"type\":\"array\",\"items\":{\"$ref\":"
        "\"#/$defs/t\"},\"maxItems\":3}},\"required\":[\"v\",\"k\"]}}}";
    if (grammar_new_json_schema(&g, bench_deep, strlen(bench_deep))) return 1;
    check("deep nested schema", g);
    grammar_free(g);
    if (!total_regions) {
        fprintf(stderr, "no byte region was built\n");
        failures++;
    }
    if (!total_hits) {
        fprintf(stderr, "no subtree walk was reused\n");
        failures++;
    }
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
