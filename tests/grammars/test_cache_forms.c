/* The token caches of the index (grammars/mask.c) against their definition, over the whole
 * Qwen3 vocabulary. For a state q, every token is checked on its own from the stack
 * [unknown caller of q's rule, q]: accepted when it is consumed with q's frame kept (popping
 * the unknown caller not allowed), uncertain when it is not but is consumed once the rule may
 * return to any of its callers, else rejected. The cache must hold exactly the accepted ids
 * and the uncertain ranks. States are chosen to cover each way a cache is made:
 *   - from a byte region's shared result plus walks below its exits (strings, raw text);
 *   - a bitset built from the gaps between accepted rank ranges (most tokens accepted), a
 *     bitset built from the ranges, a list of ids;
 *   - with pass 2 answered by the pop memo (pops of a rule to its callers at a large trie
 *     node, walked once per (rule, node): the `ws` states of the tool grammars);
 * for free JSON, the project's tool set (Hermes and XML) and the benchmark's deep schema. The
 * test fails when a kind was never met. */
#include "qwen_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammars/grammar_int.h"

static qwen_vocab qv;
static int failures;
static int seen_region, seen_gaps, seen_ranges, seen_list, seen_pop;

/* 0 rejected, 1 accepted, 2 uncertain, per rank. */
static void classify(const grammar *g, const grammar_vocab *v, int32_t q, uint8_t *cls) {
    grammar_store st;
    grammar_stepper sp;
    grammar_checker ck;
    if (grammar_store_init(&st, 4096) || grammar_stepper_init(&sp, g, &st) ||
        grammar_checker_init(&ck, v, &st, &sp))
        abort();
    int32_t p0 = grammar_store_intern(&st, GQ_P0, g->state_rule[q]);
    int32_t top = grammar_store_intern(&st, q, p0);
    memset(cls, 0, (size_t)v->n_order);
    for (int pass = 1; pass <= 2; pass++) {
        sp.no_w = pass == 1;
        if (grammar_checker_begin(&ck, &top, 1)) abort();
        for (int32_t r = 0; r < v->n_order; r++) {
            if (cls[r]) continue;
            int32_t id = v->order[r];
            int ok = grammar_checker_try(&ck, v->bytes + v->off[id], v->off[id + 1] - v->off[id], 1);
            if (ok < 0) abort();
            if (ok) cls[r] = (uint8_t)pass;
        }
        grammar_checker_end(&ck);
    }
    grammar_checker_deinit(&ck);
    grammar_stepper_deinit(&sp);
    grammar_store_deinit(&st);
}

static int has_acc(const grammar_state_cache *c, int32_t id) {
    if (c->dense) return (c->acc[id / 32] >> (id % 32)) & 1;
    for (uint32_t k = 0; k < c->n_acc; k++)
        if ((int32_t)c->acc[k] == id) return 1;
    return 0;
}

static void check_state(const char *name, grammar_index *ix, int32_t q, const char *kind) {
    const grammar *g = ix->g;
    const grammar_vocab *v = ix->v;
    const grammar_state_cache *c;
    if (grammar_index_state(ix, q, &c)) {
        fprintf(stderr, "%s: state %d: %s\n", name, q, grammar_error_last());
        failures++;
        return;
    }
    uint8_t *cls = malloc((size_t)v->n_order);
    uint8_t *unc = calloc((size_t)v->n_order, 1);
    if (!cls || !unc) abort();
    classify(g, v, q, cls);
    int bad = 0;
    uint32_t n_acc = 0, n_unc = 0;
    for (uint32_t k = 0; k < c->n_unc; k++) {
        if (unc[c->unc[k]]) bad++; /* listed twice */
        unc[c->unc[k]] = 1;
    }
    for (int32_t r = 0; r < v->n_order && bad < 5; r++) {
        int32_t id = v->order[r];
        int a = c->n_acc ? has_acc(c, id) : 0;
        n_acc += cls[r] == 1;
        n_unc += cls[r] == 2;
        if (a != (cls[r] == 1) || unc[r] != (cls[r] == 2)) {
            fprintf(stderr, "%s: state %d (%s, rule %s): token %d (rank %d) is %s, the cache "
                    "says accepted %d uncertain %d\n", name, q, kind,
                    g->rule_names[g->state_rule[q]], id, r,
                    cls[r] == 1 ? "accepted" : cls[r] == 2 ? "uncertain" : "rejected", a, unc[r]);
            bad++;
        }
    }
    if (c->n_acc != n_acc || c->n_unc != n_unc) {
        fprintf(stderr, "%s: state %d (%s): counts %u/%u, expected %u/%u\n", name, q, kind,
                c->n_acc, c->n_unc, n_acc, n_unc);
        bad++;
    }
    if (bad) failures++;
    printf("  %-10s state %5d (%s): %u accepted, %u uncertain%s\n", kind, q,
           g->rule_names[g->state_rule[q]], n_acc, n_unc, bad ? "  MISMATCH" : "");
    free(cls);
    free(unc);
}

/* Build caches in state order (as a run would fill them: shared results and memos from
 * earlier states are used) and check up to `per` states of each kind. */
static void check(const char *name, grammar *g, int per, int no_share) {
    grammar_index *ix = NULL;
    if (grammar_index_new(&ix, g, qv.vocab)) {
        fprintf(stderr, "%s: %s\n", name, grammar_error_last());
        failures++;
        return;
    }
    ix->no_share = no_share; /* every cache from its own walk (the rank-range forms alone) */
    printf("%s (%d states)\n", name, g->n_states);
    const grammar_vocab *v = qv.vocab;
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    int n_kind[5] = {0};
    int32_t last[5] = {-1, -1, -1, -1, -1};
    static const char *const kinds[5] = {"region", "pop memo", "gaps", "ranges", "list"};
    for (int32_t q = 0; q < g->n_states; q++) {
        if (!g->has_bytes[q] || ix->rep[q] != q) continue;
        uint64_t rb = ix->region_builds, pu = ix->pop_unions;
        const grammar_state_cache *c;
        if (grammar_index_state(ix, q, &c)) {
            fprintf(stderr, "%s: state %d: %s\n", name, q, grammar_error_last());
            failures++;
            break;
        }
        int k;
        if (ix->region_builds != rb) k = 0;
        else if (ix->pop_unions != pu) k = 1;
        else if (c->dense && (size_t)c->n_acc * 2 > (size_t)v->n_order) k = 2;
        else if (c->dense) k = 3;
        else if (c->n_acc > 0 && c->n_acc <= words) k = 4;
        else continue;
        if (n_kind[k]++ < per) check_state(name, ix, q, kinds[k]);
        else last[k] = q;
    }
    /* and the last of each kind: made when most shared results and memos exist */
    for (int k = 0; k < 5; k++)
        if (last[k] >= 0) check_state(name, ix, last[k], kinds[k]);
    seen_region += n_kind[0] > 0;
    seen_pop += n_kind[1] > 0;
    seen_gaps += n_kind[2] > 0;
    seen_ranges += n_kind[3] > 0;
    seen_list += n_kind[4] > 0;
    grammar_index_free(ix);
}

int main(void) {
    if (qwen_vocab_load(&qv)) {
        printf("skip: the Qwen3 tokenizer is not installed (tests/node_modules)\n");
        return 77;
    }
    size_t n;
    grammar *g = NULL;
    char *json = test_read_source("grammars/json.gbnf", &n);
    if (!json || grammar_new_gbnf(&g, json, n, NULL)) return 1;
    check("free JSON", g, 1, 0);
    grammar_free(g);
    free(json);
    char *tools = test_read_source("tests/fixtures/grammars/agent_tools.json", &n);
    for (int f = 0; f < 2 && tools; f++) {
        grammar_tool_options o = GRAMMAR_TOOL_OPTIONS_INIT;
        o.mode = GRAMMAR_TOOLS_REQUIRED;
        o.format = f ? GRAMMAR_TOOLS_QWEN3_XML : GRAMMAR_TOOLS_HERMES;
        if (grammar_new_tools(&g, tools, n, &o)) return 1;
        check(f ? "tools, XML" : "tools, Hermes", g, 1, 0);
        grammar_free(g);
    }
    free(tools);
    static const char deep[] = /* bench/grammars' deep nested schema */
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"b\":"
        "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"c\":{\"type\":"
        "\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":12},{\"type\":"
        "\"integer\",\"minimum\":-20,\"maximum\":300},{\"$ref\":\"#/$defs/t\"}]},\"maxItems\":3},"
        "\"d\":{\"enum\":[\"x\",\"y\",null]}},\"required\":[\"c\"]},\"minItems\":1,\"maxItems\":3}},"
        "\"required\":[\"b\"]},\"e\":{\"$ref\":\"#/$defs/t\"}},\"required\":[\"a\",\"e\"],\"$defs\":"
        "{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"string\",\"format\":"
        "\"date\"},\"w\":{\"type\":\"number\"},\"k\":{\"type\":\"array\",\"items\":{\"$ref\":"
        "\"#/$defs/t\"},\"maxItems\":3}},\"required\":[\"v\",\"k\"]}}}";
    if (grammar_new_json_schema(&g, deep, strlen(deep))) return 1;
    check("deep nested schema", g, 1, 0);
    check("deep nested schema, nothing shared", g, 1, 1);
    grammar_free(g);
    const char *names[] = {"region", "pop memo", "gaps", "ranges", "list"};
    int seen[] = {seen_region, seen_pop, seen_gaps, seen_ranges, seen_list};
    for (int k = 0; k < 5; k++)
        if (!seen[k]) {
            fprintf(stderr, "no cache of kind '%s' was checked\n", names[k]);
            failures++;
        }
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
