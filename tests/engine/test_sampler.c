/* The sampler on synthetic logits: greedy, seeded reproducibility, the distribution at
 * temperature 1 against softmax, temperature, top-k, top-p, min-p, penalties (repetition,
 * presence, frequency, window), logit bias, the grammar mask and accept hooks, and bad
 * parameters. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "sample/spec.h"

static int failures;

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__,  \
                    #cond, engine_error_last());                                               \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

#define NV 1000

static engine_sampler *mk(const engine_sampling_params *p) {
    engine_sampler *s = NULL;
    if (engine_sampler_new(&s, p, NV) != 0) {
        fprintf(stderr, "sampler_new: %s\n", engine_error_last());
        failures++;
    }
    return s;
}

static engine_sampling_params plain(float temp) {
    engine_sampling_params p = ENGINE_SAMPLING_PARAMS_INIT;
    p.temperature = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 42;
    return p;
}

static int32_t draw(engine_sampler *s, const float *l) {
    int32_t t = -1;
    CHECK(engine_sampler_sample(s, l, &t) == 0);
    return t;
}

static void logits_init(float *l) {
    for (int i = 0; i < NV; i++) l[i] = (float)sin(i * 0.7) * 2.0f;
}

static void test_greedy(void) {
    float l[NV];
    logits_init(l);
    l[123] = 10.0f;
    engine_sampling_params p = plain(0.0f);
    engine_sampler *s = mk(&p);
    for (int i = 0; i < 5; i++) CHECK(draw(s, l) == 123);
    l[77] = 10.0f; /* tie: lowest id */
    CHECK(draw(s, l) == 77);
    engine_sampler_free(s);
    /* top_k = 1 and a tiny top_p are greedy too, at any temperature */
    l[77] = 0;
    p = plain(1.5f);
    p.top_k = 1;
    s = mk(&p);
    for (int i = 0; i < 20; i++) CHECK(draw(s, l) == 123);
    engine_sampler_free(s);
    p = plain(1.0f);
    p.top_p = 1e-6f;
    s = mk(&p);
    for (int i = 0; i < 20; i++) CHECK(draw(s, l) == 123);
    engine_sampler_free(s);
}

static void test_seed(void) {
    float l[NV];
    logits_init(l);
    engine_sampling_params p = plain(1.0f);
    int32_t a[200], b[200], c[200];
    engine_sampler *s = mk(&p);
    for (int i = 0; i < 200; i++) a[i] = draw(s, l);
    engine_sampler_reset(s); /* reset re-seeds */
    for (int i = 0; i < 200; i++) b[i] = draw(s, l);
    engine_sampler_free(s);
    p.seed = 43;
    s = mk(&p);
    for (int i = 0; i < 200; i++) c[i] = draw(s, l);
    engine_sampler_free(s);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
}

/* frequencies at temperature T against softmax(l / T): each of the 5 most likely tokens within
 * 5 standard deviations of its expected count */
static void check_distribution(float temp, int n_draws) {
    float l[NV];
    for (int i = 0; i < NV; i++) l[i] = -5.0f;
    float top[5] = {3.0f, 2.5f, 2.0f, 1.0f, 0.0f};
    for (int i = 0; i < 5; i++) l[100 + i] = top[i];
    double z = 0, pr[NV];
    for (int i = 0; i < NV; i++) z += exp(l[i] / temp);
    for (int i = 0; i < NV; i++) pr[i] = exp(l[i] / temp) / z;
    engine_sampling_params p = plain(temp);
    p.seed = 7;
    engine_sampler *s = mk(&p);
    int *count = calloc(NV, sizeof(int));
    for (int i = 0; i < n_draws; i++) count[draw(s, l)]++;
    for (int i = 100; i < 105; i++) {
        double e = n_draws * pr[i], sd = sqrt(n_draws * pr[i] * (1 - pr[i]));
        if (!(fabs(count[i] - e) <= 5 * sd + 1))
            fprintf(stderr, "temp %g token %d: %d draws, expected %.1f ± %.1f\n", (double)temp, i,
                    count[i], e, sd);
        CHECK(fabs(count[i] - e) <= 5 * sd + 1);
    }
    free(count);
    engine_sampler_free(s);
}

static void test_filters(void) {
    float l[NV];
    for (int i = 0; i < NV; i++) l[i] = -10.0f;
    l[1] = 5.0f;
    l[2] = 4.0f;
    l[3] = 3.0f;
    l[4] = 2.9f;
    /* top-k 2: only 1 and 2 */
    engine_sampling_params p = plain(1.0f);
    p.top_k = 2;
    engine_sampler *s = mk(&p);
    bool seen[NV] = {false};
    for (int i = 0; i < 500; i++) seen[draw(s, l)] = true;
    CHECK(seen[1] && seen[2] && !seen[3] && !seen[4]);
    engine_sampler_free(s);
    /* top-p: p1 = 0.61, p2 = 0.22, p3 = 0.08, p4 = 0.07: top_p 0.8 keeps {1, 2} */
    p = plain(1.0f);
    p.top_p = 0.8f;
    s = mk(&p);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 500; i++) seen[draw(s, l)] = true;
    CHECK(seen[1] && seen[2] && !seen[3] && !seen[4]);
    engine_sampler_free(s);
    /* min-p 0.12: p3 / p1 = 0.135 stays, p4 / p1 = 0.122 stays, the -10s go */
    p = plain(1.0f);
    p.min_p = 0.3f; /* keeps p >= 0.3 * p1: only 1 and 2 (0.37) */
    s = mk(&p);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 500; i++) seen[draw(s, l)] = true;
    CHECK(seen[1] && seen[2] && !seen[3] && !seen[4]);
    engine_sampler_free(s);
    /* a low temperature sharpens: at 0.1, token 1 wins essentially always */
    p = plain(0.1f);
    s = mk(&p);
    int ones = 0;
    for (int i = 0; i < 500; i++) ones += draw(s, l) == 1;
    CHECK(ones >= 499);
    engine_sampler_free(s);
    /* top-p over the whole vocabulary (no top-k): a flat distribution needs the growing sort */
    for (int i = 0; i < NV; i++) l[i] = 0.0f;
    p = plain(1.0f);
    p.top_p = 0.5f;
    s = mk(&p);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 3000; i++) seen[draw(s, l)] = true;
    int n_seen = 0, max_id = 0;
    for (int i = 0; i < NV; i++)
        if (seen[i]) {
            n_seen++;
            max_id = i;
        }
    /* ties are ordered by id: the nucleus is ids 0..499 */
    CHECK(n_seen > 400 && max_id < 500);
    engine_sampler_free(s);
}

static void test_penalties(void) {
    float l[NV];
    for (int i = 0; i < NV; i++) l[i] = 0.0f;
    l[10] = 2.0f;
    l[11] = 1.9f;
    l[12] = -1.0f;
    /* repetition penalty 2: 10 -> 1.0, then 11 wins greedily */
    engine_sampling_params p = plain(0.0f);
    p.repeat_penalty = 2.0f;
    p.penalty_last_n = 4;
    engine_sampler *s = mk(&p);
    CHECK(draw(s, l) == 10);
    CHECK(engine_sampler_accept(s, 10, true) == 0);
    CHECK(draw(s, l) == 11);
    /* the window forgets: four other tokens push 10 out */
    for (int t = 500; t < 504; t++) CHECK(engine_sampler_accept(s, t, false) == 0);
    CHECK(draw(s, l) == 10);
    engine_sampler_free(s);
    /* negative logits are multiplied: 12 at -1 becomes -2, below the zeros */
    for (int i = 0; i < NV; i++) l[i] = -1.5f;
    l[12] = -1.0f;
    p = plain(0.0f);
    p.repeat_penalty = 2.0f;
    s = mk(&p);
    CHECK(draw(s, l) == 12);
    CHECK(engine_sampler_accept(s, 12, false) == 0);
    CHECK(draw(s, l) == 0); /* -2 < -1.5: the lowest id of the rest */
    engine_sampler_free(s);
    /* frequency and presence: 10 seen 3 times: 2.0 - 3 * 0.1 - 0.5 = 1.2 < 1.5 */
    for (int i = 0; i < NV; i++) l[i] = 0.0f;
    l[10] = 2.0f;
    l[11] = 1.5f;
    p = plain(0.0f);
    p.frequency_penalty = 0.1f;
    p.presence_penalty = 0.5f;
    s = mk(&p);
    for (int i = 0; i < 3; i++) CHECK(engine_sampler_accept(s, 10, false) == 0);
    CHECK(draw(s, l) == 11);
    engine_sampler_free(s);
    p.presence_penalty = 0.1f; /* 2.0 - 0.3 - 0.1 = 1.6 > 1.5 */
    s = mk(&p);
    for (int i = 0; i < 3; i++) CHECK(engine_sampler_accept(s, 10, false) == 0);
    CHECK(draw(s, l) == 10);
    engine_sampler_free(s);
}

static void test_bias(void) {
    float l[NV];
    logits_init(l);
    l[5] = 100.0f;
    engine_logit_bias b[2] = {{5, -INFINITY}, {6, 200.0f}};
    engine_sampling_params p = plain(1.0f);
    p.logit_bias = b;
    p.n_logit_bias = 1;
    engine_sampler *s = mk(&p);
    for (int i = 0; i < 100; i++) CHECK(draw(s, l) != 5);
    engine_sampler_free(s);
    p.n_logit_bias = 2;
    s = mk(&p);
    CHECK(draw(s, l) == 6);
    engine_sampler_free(s);
    engine_logit_bias bad = {NV, 1.0f};
    p.logit_bias = &bad;
    p.n_logit_bias = 1;
    engine_sampler *x = NULL;
    CHECK(engine_sampler_new(&x, &p, NV) == ENGINE_EINVAL && x == NULL);
}

typedef struct {
    int32_t allowed[3];
    int n_allowed;
    int mask_calls, accept_calls;
    int32_t last;
    bool abort_mask, abort_accept;
} grammar_fake;

static int fake_mask(void *user, uint32_t *allowed, int32_t n_vocab) {
    grammar_fake *g = user;
    g->mask_calls++;
    for (int32_t i = 0; i < (n_vocab + 31) / 32; i++)
        if (allowed[i] != 0) return 1; /* the sampler must clear the bitset first */
    for (int i = 0; i < g->n_allowed; i++) allowed[g->allowed[i] / 32] |= 1u << (g->allowed[i] % 32);
    return g->abort_mask ? 1 : 0;
}

static int fake_accept(void *user, int32_t token) {
    grammar_fake *g = user;
    g->accept_calls++;
    g->last = token;
    return g->abort_accept ? 1 : 0;
}

static void test_mask(void) {
    float l[NV];
    logits_init(l);
    l[0] = 50.0f; /* the favourite is not allowed */
    grammar_fake g = {{33, 64, 999}, 3, 0, 0, -1, false, false};
    engine_sampling_params p = plain(1.0f);
    p.mask = fake_mask;
    p.accept = fake_accept;
    p.grammar_user = &g;
    p.repeat_penalty = 1.3f;
    engine_sampler *s = mk(&p);
    for (int i = 0; i < 100; i++) {
        int32_t t = draw(s, l);
        CHECK(t == 33 || t == 64 || t == 999);
        CHECK(engine_sampler_accept(s, t, true) == 0);
        CHECK(g.last == t);
    }
    CHECK(g.mask_calls == 100 && g.accept_calls == 100);
    /* prompt tokens do not reach the grammar */
    CHECK(engine_sampler_accept(s, 5, false) == 0 && g.accept_calls == 100);
    /* a mask that allows nothing, a mask or accept that aborts */
    g.n_allowed = 0;
    int32_t t;
    CHECK(engine_sampler_sample(s, l, &t) == ENGINE_EINVAL);
    g.n_allowed = 1;
    g.abort_mask = true;
    CHECK(engine_sampler_sample(s, l, &t) == ENGINE_ECANCELED);
    g.abort_mask = false;
    g.abort_accept = true;
    CHECK(engine_sampler_accept(s, 33, true) == ENGINE_ECANCELED);
    engine_sampler_free(s);
    /* greedy with a mask picks the best allowed token */
    g = (grammar_fake){{33, 64, 999}, 3, 0, 0, -1, false, false};
    l[64] = 49.0f;
    p = plain(0.0f);
    p.mask = fake_mask;
    p.grammar_user = &g;
    s = mk(&p);
    CHECK(draw(s, l) == 64);
    engine_sampler_free(s);
}

static void test_bad_params(void) {
    engine_sampler *s = NULL;
    engine_sampling_params p = plain(1.0f);
    p.top_p = 0.0f;
    CHECK(engine_sampler_new(&s, &p, NV) == ENGINE_EINVAL);
    p = plain(1.0f);
    p.temperature = NAN;
    CHECK(engine_sampler_new(&s, &p, NV) == ENGINE_EINVAL);
    p = plain(1.0f);
    p.version = 99;
    CHECK(engine_sampler_new(&s, &p, NV) == ENGINE_EINVAL);
    p = plain(1.0f);
    CHECK(engine_sampler_new(&s, &p, 0) == ENGINE_EINVAL);
    CHECK(s == NULL);
    s = mk(&p);
    CHECK(engine_sampler_accept(s, NV, false) == ENGINE_EINVAL);
    float l[NV];
    for (int i = 0; i < NV; i++) l[i] = NAN;
    int32_t t;
    CHECK(engine_sampler_sample(s, l, &t) == ENGINE_EINVAL); /* NaN logits never win */
    l[3] = 1.0f;
    CHECK(engine_sampler_sample(s, l, &t) == 0 && t == 3);
    engine_sampler_free(s);
    engine_sampler_free(NULL);
}

/* A mask of every third token and a few more (for test_fast_full). */
static int third_mask(void *user, uint32_t *allowed, int32_t n_vocab) {
    (void)user;
    for (int32_t i = 0; i < n_vocab; i += 3) allowed[i / 32] |= 1u << (i % 32);
    allowed[0] |= 0x1eu;
    return 0;
}

/* The single-pass greedy and top_k draws against building every candidate and quickselect
 * (SPARK_SAMPLER_FULL=1): the same probabilities bit for bit and the same tokens for a seed,
 * on a large vocabulary with ties, NaN and -inf, with and without a mask, bias and penalties,
 * top_k below, at and above the candidates. */
static void test_fast_full(void) {
    enum { BIG = 151936 };
    float *l = malloc(sizeof(float) * BIG), *pa = malloc(sizeof(float) * BIG),
          *pb = malloc(sizeof(float) * BIG);
    if (!l || !pa || !pb) {
        CHECK(0);
        goto out;
    }
    uint64_t x = 7;
    for (int i = 0; i < BIG; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((x >> 40) % 4001) / 200.0f - 10.0f; /* 0.005 steps: many ties */
    }
    l[17] = NAN;
    l[18] = -INFINITY;
    l[19] = 10.0f; /* ties with the largest */
    const engine_logit_bias bias[2] = {{5, 3.0f}, {6, -INFINITY}};
    struct {
        float temp;
        int32_t top_k;
        float top_p, min_p, rep;
        bool mask, bias;
    } cases[] = {
        {0.0f, 40, 0.95f, 0.05f, 1.0f, false, false}, {0.0f, 0, 1.0f, 0.0f, 1.0f, true, false},
        {0.8f, 40, 0.95f, 0.05f, 1.0f, false, false}, {1.0f, 1, 1.0f, 0.0f, 1.0f, false, false},
        {1.3f, 64, 0.5f, 0.0f, 1.0f, true, false},    {0.7f, 1000, 1.0f, 0.1f, 1.0f, false, true},
        {1.0f, 20, 0.9f, 0.0f, 1.3f, true, true},     {0.9f, BIG + 5, 1.0f, 0.3f, 1.0f, false, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        engine_sampling_params p = ENGINE_SAMPLING_PARAMS_INIT;
        p.temperature = cases[c].temp;
        p.top_k = cases[c].top_k;
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        p.repeat_penalty = cases[c].rep;
        p.seed = 11 + c;
        if (cases[c].mask) p.mask = third_mask;
        if (cases[c].bias) {
            p.logit_bias = bias;
            p.n_logit_bias = 2;
        }
        engine_sampler *fast = NULL, *full = NULL;
        CHECK(engine_sampler_new(&fast, &p, BIG) == 0);
        setenv("SPARK_SAMPLER_FULL", "1", 1);
        CHECK(engine_sampler_new(&full, &p, BIG) == 0);
        unsetenv("SPARK_SAMPLER_FULL");
        if (!fast || !full) {
            engine_sampler_free(fast);
            engine_sampler_free(full);
            continue;
        }
        int same = 0;
        const int draws = 40;
        for (int d = 0; d < draws; d++) {
            int32_t a = -1, b = -1;
            CHECK(engine_sampler_sample(fast, l, &a) == 0 && engine_sampler_sample(full, l, &b) == 0);
            same += a == b;
            CHECK(engine_sampler_accept(fast, a, false) == 0 && engine_sampler_accept(full, b, false) == 0);
        }
        CHECK(same == draws);
        CHECK(engine_sampler_probs(fast, l, pa) == 0 && engine_sampler_probs(full, l, pb) == 0 &&
              memcmp(pa, pb, sizeof(float) * BIG) == 0);
        if (same != draws) fprintf(stderr, "fast/full case %zu: %d of %d draws equal\n", c, same, draws);
        engine_sampler_free(fast);
        engine_sampler_free(full);
    }
out:
    free(l);
    free(pa);
    free(pb);
}

int main(void) {
    test_fast_full();
    test_greedy();
    test_seed();
    check_distribution(1.0f, 20000);
    check_distribution(0.7f, 20000);
    test_filters();
    test_penalties();
    test_bias();
    test_mask();
    test_bad_params();
    if (failures) {
        fprintf(stderr, "test_sampler: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_sampler: ok\n");
    return 0;
}
