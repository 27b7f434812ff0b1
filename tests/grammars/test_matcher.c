/* The matcher with the real Qwen3 vocabulary (151,936 ids):
 *  - the fast mask equals the naive one (every token checked against the stacks) along random
 *    constrained walks, for free JSON, tool calls (lazy AUTO and REQUIRED, both formats) and a
 *    deep nested schema, including tokens that end in the middle of a UTF-8 character;
 *  - random accept/rollback sequences give the same state and mask as replay from scratch;
 *  - end-of-generation only when the grammar is complete; refused tokens leave the state. */
#include "qwen_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORDS ((QWEN_N_VOCAB + 31) / 32)

static int failures;
static qwen_vocab qv;
static test_rng R = {777};
static uint32_t *ma, *mb;
static int n_compared, n_steps, n_partial, n_rollbacks, n_lazy_checked;

/* An index and a matcher (end of generation: QWEN_IM_END); 0, or counts a failure. */
static int open_matcher(grammar *g, grammar_index **ix, grammar_matcher **m, const char *what) {
    int32_t eog = QWEN_IM_END;
    *ix = NULL;
    *m = NULL;
    if (grammar_index_new(ix, g, qv.vocab) || grammar_matcher_new(m, *ix, &eog, 1)) {
        fprintf(stderr, "%s: %s\n", what, grammar_error_last());
        grammar_index_free(*ix);
        failures++;
        return -1;
    }
    return 0;
}

static int bit(const uint32_t *m, int32_t t) {
    return (m[t / 32] >> (t % 32)) & 1;
}

static int compare_masks(grammar_matcher *m, const char *what, int step) {
    if (grammar_matcher_mask(m, ma, QWEN_N_VOCAB) || grammar_matcher_mask_naive(m, mb, QWEN_N_VOCAB)) {
        fprintf(stderr, "%s: mask error %s\n", what, grammar_error_last());
        failures++;
        return -1;
    }
    if (memcmp(ma, mb, WORDS * sizeof *ma) != 0) {
        failures++;
        int shown = 0;
        for (int32_t t = 0; t < QWEN_N_VOCAB && shown < 8; t++)
            if (bit(ma, t) != bit(mb, t)) {
                fprintf(stderr, "%s step %d: token %d '%.*s' fast %d naive %d\n", what, step, t, (int)qv.len[t],
                        qv.piece[t] ? qv.piece[t] : "", bit(ma, t), bit(mb, t));
                shown++;
            }
        return -1;
    }
    return 0;
}

/* A random walk: at each step compare the masks (every `every` steps), then take a random
 * allowed token (a partial UTF-8 byte token when one is allowed and the draw says so). */
static void walk(grammar *g, const char *what, int steps, int every) {
    grammar_index *ix;
    grammar_matcher *m;
    if (open_matcher(g, &ix, &m, what)) return;
    for (int step = 0; step < steps; step++) {
        if (step % every == 0) {
            n_compared++;
            if (compare_masks(m, what, step)) break;
        } else if (grammar_matcher_mask(m, ma, QWEN_N_VOCAB)) {
            failures++;
            break;
        }
        int32_t pick = -1;
        uint32_t n = 0;
        int partial = test_rng_below(&R, 4) == 0;
        for (int32_t t = 0; t < QWEN_N_VOCAB; t++) {
            if (!bit(ma, t) || t == QWEN_IM_END) continue;
            if (partial && !(qv.len[t] == 1 && (unsigned char)qv.piece[t][0] >= 0xC2)) continue;
            if (test_rng_below(&R, ++n) == 0) pick = t;
        }
        if (pick < 0) {
            if (bit(ma, QWEN_IM_END)) break;
            if (partial) continue;
            fprintf(stderr, "%s: nothing allowed at step %d\n", what, step);
            failures++;
            break;
        }
        n_steps++;
        if (qv.len[pick] == 1 && (unsigned char)qv.piece[pick][0] >= 0x80) n_partial++;
        if (grammar_matcher_accept(m, pick)) {
            fprintf(stderr, "%s: allowed token %d refused: %s\n", what, pick, grammar_error_last());
            failures++;
            break;
        }
    }
    grammar_matcher_free(m);
    grammar_index_free(ix);
}

/* Random accept/rollback against replay from scratch. */
static void rollback(grammar *g, const char *what) {
    grammar_index *ix;
    grammar_matcher *m, *fresh;
    int32_t eog = QWEN_IM_END;
    if (grammar_index_new(&ix, g, qv.vocab) || grammar_matcher_new(&m, ix, &eog, 1) ||
        grammar_matcher_new(&fresh, ix, &eog, 1)) {
        failures++;
        return;
    }
    int32_t hist[512];
    int n = 0;
    for (int it = 0; it < 300 && n < 500; it++) {
        if (n > 0 && test_rng_below(&R, 3) == 0) {
            int k = 1 + (int)test_rng_below(&R, (uint32_t)(n < 6 ? n : 6));
            if (grammar_matcher_rollback(m, k)) {
                failures++;
                fprintf(stderr, "%s: rollback %d of %d: %s\n", what, k, n, grammar_error_last());
                break;
            }
            n -= k;
            n_rollbacks++;
        } else {
            if (grammar_matcher_mask(m, ma, QWEN_N_VOCAB)) {
                failures++;
                break;
            }
            int32_t pick = -1;
            uint32_t c = 0;
            int small = test_rng_below(&R, 2);
            for (int32_t t = 0; t < QWEN_N_VOCAB; t++)
                if (bit(ma, t) && (!small || qv.len[t] <= 2) && test_rng_below(&R, ++c) == 0) pick = t;
            if (pick < 0) continue;
            if (grammar_matcher_accept(m, pick)) {
                failures++;
                fprintf(stderr, "%s: accept: %s\n", what, grammar_error_last());
                break;
            }
            hist[n++] = pick;
        }
        if (it % 10 == 0) {
            grammar_matcher_reset(fresh);
            for (int i = 0; i < n; i++)
                if (grammar_matcher_accept(fresh, hist[i])) {
                    failures++;
                    fprintf(stderr, "%s: replay refused token %d\n", what, i);
                    break;
                }
            if (grammar_matcher_state_hash(fresh) != grammar_matcher_state_hash(m) ||
                grammar_matcher_n_tokens(fresh) != grammar_matcher_n_tokens(m) ||
                grammar_matcher_is_complete(fresh) != grammar_matcher_is_complete(m)) {
                failures++;
                fprintf(stderr, "%s: state after rollback differs from replay (iteration %d)\n", what, it);
                break;
            }
            grammar_matcher_mask(fresh, mb, QWEN_N_VOCAB);
            grammar_matcher_mask(m, ma, QWEN_N_VOCAB);
            if (memcmp(ma, mb, WORDS * sizeof *ma)) {
                failures++;
                fprintf(stderr, "%s: mask after rollback differs from replay\n", what);
                break;
            }
        }
    }
    grammar_matcher_free(fresh);
    grammar_matcher_free(m);
    grammar_index_free(ix);
}

static void eog_and_refusals(grammar *g) {
    grammar_index *ix;
    grammar_matcher *m;
    if (open_matcher(g, &ix, &m, "matcher")) return;
    grammar_matcher_mask(m, ma, QWEN_N_VOCAB);
    if (bit(ma, QWEN_IM_END) || grammar_matcher_accept(m, QWEN_IM_END) != GRAMMAR_EREJECT) {
        failures++;
        fprintf(stderr, "end of generation allowed before the grammar is complete\n");
    }
    if (grammar_matcher_accept_bytes(m, "{\"a\"", 4) || grammar_matcher_is_complete(m)) failures++;
    uint64_t h = grammar_matcher_state_hash(m);
    if (grammar_matcher_accept_bytes(m, "}", 1) != GRAMMAR_EREJECT || grammar_matcher_state_hash(m) != h) {
        failures++;
        fprintf(stderr, "a refused token changed the state\n");
    }
    if (grammar_matcher_accept_bytes(m, ": 1}", 4) || !grammar_matcher_is_complete(m)) failures++;
    grammar_matcher_mask(m, ma, QWEN_N_VOCAB);
    if (!bit(ma, QWEN_IM_END) || grammar_matcher_distance(m) != 0) {
        failures++;
        fprintf(stderr, "end of generation not allowed when complete\n");
    }
    if (grammar_matcher_accept(m, QWEN_IM_END) || !grammar_matcher_is_finished(m) ||
        grammar_matcher_accept_bytes(m, " ", 1) != GRAMMAR_EREJECT) {
        failures++;
        fprintf(stderr, "finishing\n");
    }
    if (grammar_matcher_rollback(m, 1) || grammar_matcher_is_finished(m) || !grammar_matcher_is_complete(m)) {
        failures++;
        fprintf(stderr, "rolling back the end\n");
    }
    if (grammar_matcher_rollback(m, 100) != GRAMMAR_EINVAL) failures++;
    if (grammar_matcher_mask(m, ma, 1000) != GRAMMAR_EINVAL) failures++;
    grammar_matcher_free(m);
    grammar_index_free(ix);
}

/* Lazy grammar before its trigger: every token's verdict in the mask equals what accept does
 * (brute force over the vocabulary), after text ending with a partial trigger too. */
static void lazy_brute(grammar *g) {
    grammar_index *ix;
    grammar_matcher *m;
    if (open_matcher(g, &ix, &m, "matcher")) return;
    static const char *const prefixes[] = {"Let me check.", "Let me check <tool", "x <", "<tool_call"};
    for (int p = 0; p < 4; p++) {
        grammar_matcher_reset(m);
        if (grammar_matcher_accept_bytes(m, prefixes[p], strlen(prefixes[p]))) {
            failures++;
            continue;
        }
        if (grammar_matcher_mask(m, ma, QWEN_N_VOCAB)) {
            failures++;
            continue;
        }
        int bad = 0, n_allowed = 0;
        for (int32_t t = 0; t < QWEN_N_VOCAB; t++) {
            int ok = grammar_matcher_accept(m, t) == 0;
            if (ok) grammar_matcher_rollback(m, 1);
            n_allowed += ok;
            if (ok != bit(ma, t) && bad++ < 5)
                fprintf(stderr, "lazy after '%s': token %d '%.*s' mask %d accept %d\n", prefixes[p], t,
                        (int)qv.len[t], qv.piece[t] ? qv.piece[t] : "", bit(ma, t), ok);
        }
        if (bad) failures++;
        n_lazy_checked += QWEN_N_VOCAB;
        int32_t n_text = 0;
        for (int32_t t = 0; t < QWEN_N_VOCAB; t++) n_text += qv.len[t] > 0;
        if (p == 3 && n_allowed > n_text + 1 - 50) {
            failures++;
            fprintf(stderr, "after '<tool_call' the tokens that break the call must be refused (%d of %d allowed)\n",
                    n_allowed, n_text);
        }
    }
    grammar_matcher_free(m);
    grammar_index_free(ix);
}

int main(void) {
    int rc = qwen_vocab_load(&qv);
    if (rc) return rc;
    ma = malloc(WORDS * sizeof *ma);
    mb = malloc(WORDS * sizeof *mb);
    size_t n;
    char *json = test_read_source("grammars/json.gbnf", &n);
    char *tools = test_read_source("tests/fixtures/grammars/agent_tools.json", &n);
    grammar *gj, *gh, *gx, *gr, *gd, *gs;
    grammar_tool_options o = GRAMMAR_TOOL_OPTIONS_INIT;
    static const char deep[] =
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"array\","
        "\"items\":{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":"
        "\"string\",\"maxLength\":4},{\"type\":\"integer\",\"minimum\":-20,\"maximum\":300}]},\"maxItems\":3},"
        "\"d\":{\"enum\":[\"x\",\"y\",null]}},\"required\":[\"c\"]},\"minItems\":1,\"maxItems\":2}},\"required\":"
        "[\"b\"]},\"e\":{\"$ref\":\"#/$defs/t\"}},\"required\":[\"a\",\"e\"],\"$defs\":{\"t\":{\"type\":\"object\","
        "\"properties\":{\"v\":{\"type\":\"string\",\"format\":\"date\"},\"k\":{\"type\":\"array\",\"items\":"
        "{\"$ref\":\"#/$defs/t\"},\"maxItems\":2}},\"required\":[\"v\"]}}}";
    static const char small[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}";
    if (grammar_new_gbnf(&gj, json, strlen(json), NULL) || grammar_new_tools(&gh, tools, strlen(tools), &o)) {
        fprintf(stderr, "%s\n", grammar_error_last());
        return 1;
    }
    o.format = GRAMMAR_TOOLS_QWEN3_XML;
    o.mode = GRAMMAR_TOOLS_REQUIRED;
    if (grammar_new_tools(&gx, tools, strlen(tools), &o)) return 1;
    o.format = GRAMMAR_TOOLS_HERMES;
    if (grammar_new_tools(&gr, tools, strlen(tools), &o)) return 1;
    if (grammar_new_json_schema(&gd, deep, strlen(deep)) || grammar_new_json_schema(&gs, small, strlen(small))) {
        fprintf(stderr, "%s\n", grammar_error_last());
        return 1;
    }
    walk(gj, "json", 40, 4);
    walk(gh, "tools-hermes-auto", 60, 6);
    walk(gr, "tools-hermes-required", 60, 6);
    walk(gx, "tools-xml", 60, 6);
    walk(gd, "deep-schema", 60, 5);
    rollback(gj, "json");
    rollback(gr, "tools-hermes-required");
    rollback(gd, "deep-schema");
    rollback(gh, "tools-hermes-auto");
    eog_and_refusals(gs);
    lazy_brute(gh);
    grammar_free(gj);
    grammar_free(gh);
    grammar_free(gx);
    grammar_free(gr);
    grammar_free(gd);
    grammar_free(gs);
    free(json);
    free(tools);
    free(ma);
    free(mb);
    qwen_vocab_free(&qv);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("test_matcher: %d masks compared with the naive ones over %d steps (%d partial-UTF-8 "
           "tokens), %d rollbacks checked against replay, %d lazy-mode verdicts checked against accept: "
           "all passed\n",
           n_compared, n_steps, n_partial, n_rollbacks, n_lazy_checked);
    if (n_compared < 40 || n_partial < 3 || n_rollbacks < 50) {
        fprintf(stderr, "the walks were too short to mean much\n");
        return 1;
    }
    return 0;
}
