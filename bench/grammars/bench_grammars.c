/* Grammar benchmark: per-token mask time at the Qwen3 vocabulary (151,936 ids) for free JSON,
 * the project's tool set (tests/fixtures/grammars/agent_tools.json, Hermes and XML formats) and
 * a deep nested schema; grammar compile time; the same states through naive checking (every
 * token against the matcher, as llama.cpp's GBNF sampler does) for the ratio.
 *   bench/grammars/run.sh [BUILD_DIR] [SAMPLES]
 * Generation: the random-logit sampler of the tests (tests/grammars/qwen_vocab.c). "cold" =
 * a fresh index (per-state caches filled lazily on first use, included in the times);
 * "warm" = the index filled beforehand (grammar_index_precompute), a new matcher per sample. */
#include "grammars/qwen_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU time of this thread (the benchmark machine is shared: wall time would count other
 * processes' slices); BENCH_WALL=1 for wall-clock time. */
static double now_us(void) {
    static int wall = -1;
    if (wall < 0) wall = getenv("BENCH_WALL") != NULL;
    struct timespec t;
    clock_gettime(wall ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    double *v;
    size_t n, cap;
} series;

static void add(series *s, double x) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = x;
}

static double pct(series *s, double p) {
    if (!s->n) return 0;
    qsort(s->v, s->n, sizeof *s->v, cmp_d);
    size_t i = (size_t)(p * (double)(s->n - 1) + 0.5);
    return s->v[i];
}

static qwen_vocab qv;
static uint32_t *mask;

/* The sampler of the tests, timing every mask call; every `naive_every`-th state also through
 * the naive mask. */
static void run(grammar_matcher *m, test_rng *r, series *t, series *naive, int naive_every, int *calls) {
    char *out = NULL;
    grammar_matcher_reset(m);
    for (int step = 0; step < 400; step++) {
        double t0 = now_us();
        if (grammar_matcher_mask(m, mask, QWEN_N_VOCAB)) {
            fprintf(stderr, "mask: %s\n", grammar_error_last());
            exit(1);
        }
        add(t, now_us() - t0);
        if (naive && naive_every && (*calls)++ % naive_every == 0) {
            static uint32_t *m2;
            if (!m2) m2 = malloc((QWEN_N_VOCAB + 31) / 32 * sizeof *m2);
            t0 = now_us();
            grammar_matcher_mask_naive(m, m2, QWEN_N_VOCAB);
            add(naive, now_us() - t0);
            if (memcmp(m2, mask, (QWEN_N_VOCAB + 31) / 32 * sizeof *m2)) {
                fprintf(stderr, "fast and naive masks differ\n");
                exit(1);
            }
        }
        int complete = (mask[QWEN_IM_END / 32] >> (QWEN_IM_END % 32)) & 1;
        int32_t pick = -1;
        if (step < 60) {
            if (complete && test_rng_below(r, 8) == 0) {
                pick = QWEN_IM_END;
            } else {
                int bytes_only = test_rng_below(r, 2) == 0;
                uint64_t best = 0;
                for (int32_t w = 0; w < (QWEN_N_VOCAB + 31) / 32; w++)
                    for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
                        int32_t tk = w * 32 + __builtin_ctz(bits);
                        if (tk == QWEN_IM_END || (bytes_only && qv.len[tk] != 1)) continue;
                        uint64_t l = test_rng_next(r) | 1;
                        if (l > best) best = l, pick = tk;
                    }
            }
        }
        if (pick < 0) {
            if (complete) break;
            uint32_t best = UINT32_MAX;
            for (int32_t tk = 0; tk < QWEN_N_VOCAB; tk++) {
                if (qv.len[tk] != 1 || !((mask[tk / 32] >> (tk % 32)) & 1)) continue;
                grammar_matcher_accept(m, tk);
                uint32_t d = grammar_matcher_distance(m);
                grammar_matcher_rollback(m, 1);
                if (d < best) best = d, pick = tk;
            }
        }
        if (pick == QWEN_IM_END || pick < 0) break;
        if (grammar_matcher_accept(m, pick)) {
            fprintf(stderr, "accept: %s\n", grammar_error_last());
            exit(1);
        }
    }
    free(out);
}

static void workload(const char *name, grammar *g, int samples) {
    int32_t eog = QWEN_IM_END;
    grammar_index *ix;
    grammar_matcher *m;
    series cold = {0}, warm = {0}, naive = {0};
    test_rng r = {42};
    int calls = 0;
    double ti = now_us();
    grammar_index_new(&ix, g, qv.vocab); /* includes the cache classes */
    double index_ms = (now_us() - ti) / 1e3;
    grammar_matcher_new(&m, ix, &eog, 1);
    for (int s = 0; s < samples; s++) run(m, &r, &cold, &naive, 25, &calls);
    double lazy_ms = grammar_index_build_ms(ix); /* wall clock (measured by the library) */
    grammar_matcher_free(m);
    grammar_index_free(ix);
    double t0 = now_us();
    grammar_index_new(&ix, g, qv.vocab);
    grammar_index_precompute(ix);
    double pre_ms = (now_us() - t0) / 1e3;
    grammar_matcher_new(&m, ix, &eog, 1);
    test_rng r2 = {4242};
    for (int s = 0; s < samples; s++) run(m, &r2, &warm, NULL, 0, &calls);
    double nmed = pct(&naive, 0.5);
    printf("%-22s states %5d | warm: median %6.1f us  p99 %7.1f us  (%zu masks) | cold: median %6.1f  p99 %8.1f us "
           "(index %.0f ms, lazy fills %.0f ms wall) | full precompute %.0f ms, %.1f MB | naive: median %8.0f us (%zu) -> %.0fx\n",
           name, grammar_n_states(g), pct(&warm, 0.5), pct(&warm, 0.99), warm.n, pct(&cold, 0.5), pct(&cold, 0.99),
           index_ms, lazy_ms, pre_ms, (double)grammar_index_bytes(ix) / 1e6, nmed, naive.n, nmed / pct(&warm, 0.5));
    grammar_matcher_free(m);
    grammar_index_free(ix);
    free(cold.v);
    free(warm.v);
    free(naive.v);
}

typedef int (*make_fn)(grammar **g, const char *src, const void *arg);

static int make_tools(grammar **g, const char *src, const void *arg) {
    return grammar_new_tools(g, src, strlen(src), arg);
}

static int make_schema(grammar **g, const char *src, const void *arg) {
    (void)arg;
    return grammar_new_json_schema(g, src, strlen(src));
}

static int make_gbnf(grammar **g, const char *src, const void *arg) {
    (void)arg;
    return grammar_new_gbnf(g, src, strlen(src), NULL);
}

static grammar *compile_timed(const char *name, make_fn f, const char *src, const void *arg) {
    series t = {0};
    grammar *g = NULL;
    for (int i = 0; i < 15; i++) {
        grammar_free(g);
        double t0 = now_us();
        if (f(&g, src, arg)) {
            fprintf(stderr, "%s: %s\n", name, grammar_error_last());
            exit(1);
        }
        add(&t, now_us() - t0);
    }
    printf("%-22s compile (text -> DFA, no vocabulary): median %.2f ms, min %.2f ms\n", name, pct(&t, 0.5) / 1e3,
           pct(&t, 0) / 1e3);
    free(t.v);
    return g;
}

int main(int argc, char **argv) {
    int samples = argc > 1 ? atoi(argv[1]) : 10;
    double t0 = now_us();
    if (qwen_vocab_load(&qv)) return 1;
    printf("vocabulary: %d ids, trie built in %.0f ms (load + decode included)\n", QWEN_N_VOCAB, (now_us() - t0) / 1e3);
    mask = malloc((QWEN_N_VOCAB + 31) / 32 * sizeof *mask);
    size_t n_json, n_tools;
    char *json = test_read_source("grammars/json.gbnf", &n_json);
    char *tools = test_read_source("tests/fixtures/grammars/agent_tools.json", &n_tools);
    static const char deep[] =
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"array\","
        "\"items\":{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":"
        "\"string\",\"maxLength\":12},{\"type\":\"integer\",\"minimum\":-20,\"maximum\":300},{\"$ref\":\"#/$defs/t\"}]},"
        "\"maxItems\":3},\"d\":{\"enum\":[\"x\",\"y\",null]}},\"required\":[\"c\"]},\"minItems\":1,\"maxItems\":3}},"
        "\"required\":[\"b\"]},\"e\":{\"$ref\":\"#/$defs/t\"}},\"required\":[\"a\",\"e\"],\"$defs\":{\"t\":{\"type\":"
        "\"object\",\"properties\":{\"v\":{\"type\":\"string\",\"format\":\"date\"},\"w\":{\"type\":\"number\"},"
        "\"k\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"},\"maxItems\":3}},\"required\":[\"v\",\"k\"]}}}";
    grammar_tool_options hermes = GRAMMAR_TOOL_OPTIONS_INIT, xml = GRAMMAR_TOOL_OPTIONS_INIT,
                         autom = GRAMMAR_TOOL_OPTIONS_INIT;
    hermes.mode = GRAMMAR_TOOLS_REQUIRED;
    xml.mode = GRAMMAR_TOOLS_REQUIRED;
    xml.format = GRAMMAR_TOOLS_QWEN3_XML;
    grammar *gj = compile_timed("free JSON", make_gbnf, json, NULL);
    grammar *gh = compile_timed("21 tools, Hermes", make_tools, tools, &hermes);
    grammar *ga = compile_timed("21 tools, Hermes auto", make_tools, tools, &autom);
    grammar *gx = compile_timed("21 tools, XML", make_tools, tools, &xml);
    grammar *gd = compile_timed("deep nested schema", make_schema, deep, NULL);
    workload("free JSON", gj, samples);
    workload("21 tools, Hermes", gh, samples);
    workload("21 tools, Hermes auto", ga, samples);
    workload("21 tools, XML", gx, samples);
    workload("deep nested schema", gd, samples);
    return 0;
}
