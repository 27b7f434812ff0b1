/* The sampler: logits -> (grammar mask) -> logit bias -> penalties -> greedy, or
 * temperature -> top-k -> top-p -> min-p -> seeded draw. Contract in engine.h.
 *
 * Temperature scales the logits before the top-p and min-p cuts (as Hugging Face's generate
 * does), so a hot sampler's nucleus is wider. Candidates are ordered by (logit desc, id asc), a
 * total order, so a seed reproduces the same tokens on every machine. */
#include "common.h"
#include "sample/spec.h"

#include <math.h>
#include <string.h>

#define PENALTY_WINDOW_ALL 32768 /* the window for penalty_last_n = -1 */

typedef struct {
    int32_t id;
    float l; /* logit, then probability */
} cand;

struct engine_sampler {
    engine_sampling_params p;
    int32_t n_vocab;
    float *work;      /* [n_vocab] */
    cand *cands;      /* [n_vocab] */
    uint32_t *mask;   /* [(n_vocab + 31) / 32] */
    int32_t *counts;  /* [n_vocab], zero between calls */
    int32_t *hist;    /* ring of recent tokens */
    int32_t hist_cap, hist_len, hist_pos;
    uint64_t rng[4];
    /* SPARK_SAMPLER_FULL=1 at creation: every candidate built and selected by quickselect, as
     * before the single-pass top_k (for the test that holds the two to the same draws) */
    bool full;
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** */
static uint64_t rng_next(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

static double rng_uniform(uint64_t *s) {
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

void engine_sampler_reset(engine_sampler *s) {
    uint64_t x = s->p.seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    s->hist_len = 0;
    s->hist_pos = 0;
}

int engine_sampler_new(engine_sampler **out, const engine_sampling_params *p, int32_t n_vocab) {
    *out = NULL;
    if (!p || p->version != ENGINE_SAMPLING_PARAMS_VERSION)
        return engine_err(ENGINE_EINVAL, "sampler: params missing or of another version");
    if (n_vocab <= 0) return engine_err(ENGINE_EINVAL, "sampler: vocabulary size %d", n_vocab);
    if (!(p->temperature == p->temperature) || p->top_k < 0 || !(p->top_p > 0.0f) ||
        p->top_p > 1.0f || !(p->min_p >= 0.0f) || p->min_p > 1.0f ||
        !(p->repeat_penalty > 0.0f) || !isfinite(p->presence_penalty) ||
        !isfinite(p->frequency_penalty) || p->penalty_last_n < -1)
        return engine_err(ENGINE_EINVAL,
                          "sampler: parameter out of range (temperature %g, top_k %d, top_p %g, "
                          "min_p %g, repeat_penalty %g, penalty_last_n %d)",
                          (double)p->temperature, p->top_k, (double)p->top_p, (double)p->min_p,
                          (double)p->repeat_penalty, p->penalty_last_n);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        int32_t t = p->logit_bias[i].token;
        if (t < 0 || t >= n_vocab || isnan(p->logit_bias[i].bias))
            return engine_err(ENGINE_EINVAL, "sampler: logit bias %zu: token %d not in [0, %d) "
                              "or bias NaN", i, t, n_vocab);
    }
    engine_sampler *s = calloc(1, sizeof *s);
    if (!s) return engine_err(ENGINE_ENOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    const char *full = getenv("SPARK_SAMPLER_FULL");
    s->full = full && full[0] == '1';
    s->hist_cap = p->penalty_last_n == -1 ? PENALTY_WINDOW_ALL : p->penalty_last_n;
    s->work = malloc(sizeof(float) * (size_t)n_vocab);
    s->cands = malloc(sizeof(cand) * (size_t)n_vocab);
    s->mask = malloc(sizeof(uint32_t) * (((size_t)n_vocab + 31) / 32));
    s->counts = calloc((size_t)n_vocab, sizeof(int32_t));
    s->hist = malloc(sizeof(int32_t) * (size_t)(s->hist_cap > 0 ? s->hist_cap : 1));
    if (!s->work || !s->cands || !s->mask || !s->counts || !s->hist) {
        engine_sampler_free(s);
        return engine_err(ENGINE_ENOMEM, "sampler: out of memory for %d tokens", n_vocab);
    }
    engine_sampler_reset(s);
    *out = s;
    return 0;
}

void engine_sampler_free(engine_sampler *s) {
    if (!s) return;
    free(s->work);
    free(s->cands);
    free(s->mask);
    free(s->counts);
    free(s->hist);
    free(s);
}

int engine_sampler_accept(engine_sampler *s, int32_t token, bool grammar) {
    if (token < 0 || token >= s->n_vocab)
        return engine_err(ENGINE_EINVAL, "sampler: token %d not in [0, %d)", token, s->n_vocab);
    if (s->hist_cap > 0) {
        s->hist[s->hist_pos] = token;
        s->hist_pos = (s->hist_pos + 1) % s->hist_cap;
        if (s->hist_len < s->hist_cap) s->hist_len++;
    }
    if (grammar && s->p.accept && s->p.accept(s->p.grammar_user, token) != 0)
        return engine_err(ENGINE_ECANCELED, "sampler: the grammar rejected token %d", token);
    return 0;
}

/* (logit desc, id asc): a total order. */
static inline bool cand_before(const cand *a, const cand *b) {
    return a->l > b->l || (a->l == b->l && a->id < b->id);
}

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return cand_before(x, y) ? -1 : cand_before(y, x) ? 1 : 0;
}

static inline void cand_swap(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Move the m first candidates in (logit desc, id asc) order to the front, sorted. */
static void cands_top(cand *c, int32_t n, int32_t m) {
    if (m <= 0) return;
    if (m < n) {
        int32_t lo = 0, hi = n - 1;
        while (lo < hi) { /* quickselect for the m-th element, median-of-three pivot */
            int32_t mid = lo + (hi - lo) / 2;
            if (cand_before(&c[mid], &c[lo])) cand_swap(&c[mid], &c[lo]);
            if (cand_before(&c[hi], &c[lo])) cand_swap(&c[hi], &c[lo]);
            if (cand_before(&c[hi], &c[mid])) cand_swap(&c[hi], &c[mid]);
            cand pivot = c[mid];
            int32_t i = lo, j = hi;
            while (i <= j) {
                while (cand_before(&c[i], &pivot)) i++;
                while (cand_before(&pivot, &c[j])) j--;
                if (i <= j) cand_swap(&c[i++], &c[j--]);
            }
            if (m - 1 <= j) hi = j;
            else if (m - 1 >= i) lo = i;
            else break;
        }
    }
    qsort(c, (size_t)(m < n ? m : n), sizeof *c, cand_cmp);
}

static void apply_penalties(engine_sampler *s, float *l) {
    const engine_sampling_params *p = &s->p;
    if (s->hist_len == 0 ||
        (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f))
        return;
    for (int32_t i = 0; i < s->hist_len; i++) s->counts[s->hist[i]]++;
    for (int32_t i = 0; i < s->hist_len; i++) {
        int32_t t = s->hist[i], c = s->counts[t];
        if (c == 0) continue; /* already applied */
        s->counts[t] = 0;
        float v = l[t];
        if (p->repeat_penalty != 1.0f) v = v > 0.0f ? v / p->repeat_penalty : v * p->repeat_penalty;
        v -= (float)c * p->frequency_penalty + p->presence_penalty;
        l[t] = v;
    }
}

/* Whether token i of l can be drawn: allowed by the mask (NULL: all), not -inf, not NaN. */
static inline bool cand_ok(const float *l, const uint32_t *mk, int32_t i) {
    return (!mk || (mk[i >> 5] >> (i & 31) & 1u)) && l[i] > -INFINITY;
}

/* The heap of the k best candidates so far, its root the worst of them (cand_before). */
static void heap_down(cand *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t w = i, a = 2 * i + 1, b = a + 1;
        if (a < n && cand_before(&h[w], &h[a])) w = a;
        if (b < n && cand_before(&h[w], &h[b])) w = b;
        if (w == i) return;
        cand_swap(&h[i], &h[w]);
        i = w;
    }
}

static void heap_up(cand *h, int32_t i) {
    while (i > 0) {
        int32_t up = (i - 1) / 2;
        if (!cand_before(&h[up], &h[i])) return;
        cand_swap(&h[up], &h[i]);
        i = up;
    }
}

/* The distribution the sampler draws from: greedy (*greedy set to the token), or candidates
 * s->cands[0 .. *n_out) with unnormalised probabilities.
 * Without bias or penalties the logits are read in place (the mask tested per token), and
 * greedy and top_k below the candidate count take one pass: the argmax, or a heap of the top_k
 * best, then sorted -- the candidates, order and arithmetic of building every candidate and
 * selecting with quickselect (s->full), ~5x less time on a 152K vocabulary. */
static int sampler_dist(engine_sampler *s, const float *logits, int32_t *n_out, int32_t *greedy) {
    const engine_sampling_params *p = &s->p;
    *greedy = -1;
    int32_t nv = s->n_vocab;
    const uint32_t *mk = NULL;
    if (p->mask) {
        size_t words = ((size_t)nv + 31) / 32;
        memset(s->mask, 0, words * sizeof(uint32_t));
        if (p->mask(p->grammar_user, s->mask, nv) != 0)
            return engine_err(ENGINE_ECANCELED, "sampler: the grammar mask hook aborted");
        mk = s->mask;
    }
    const float *l = logits;
    const bool pen = s->hist_len > 0 && (p->repeat_penalty != 1.0f ||
                                         p->presence_penalty != 0.0f ||
                                         p->frequency_penalty != 0.0f);
    if (p->n_logit_bias || pen || s->full) {
        float *w = s->work;
        memcpy(w, logits, sizeof(float) * (size_t)nv);
        if (mk) /* masked tokens stay -inf through bias and penalties */
            for (int32_t i = 0; i < nv; i++)
                if (!(mk[i >> 5] >> (i & 31) & 1u)) w[i] = -INFINITY;
        for (size_t i = 0; i < p->n_logit_bias; i++) w[p->logit_bias[i].token] += p->logit_bias[i].bias;
        apply_penalties(s, w);
        l = w;
        mk = NULL;
    }
    cand *c = s->cands;
    int32_t n = 0;
    if (!s->full && p->temperature <= 0.0f) {
        cand best = {-1, -INFINITY};
        if (!mk) { /* -inf and NaN never pass the first test: the first largest wins */
            for (int32_t i = 0; i < nv; i++)
                if (l[i] > best.l) best = (cand){i, l[i]};
        } else {
            for (int32_t i = 0; i < nv; i++)
                if (cand_ok(l, mk, i) && (best.id < 0 || l[i] > best.l)) best = (cand){i, l[i]};
        }
        if (best.id < 0)
            return engine_err(ENGINE_EINVAL, "sampler: no token can be sampled (the grammar "
                              "mask, logit bias or NaN logits exclude all %d)", nv);
        *greedy = best.id;
        return 0;
    }
    if (!s->full && p->top_k > 0) {
        const int32_t k = p->top_k;
        int32_t i = 0;
        for (; i < nv && n < k; i++)
            if (cand_ok(l, mk, i)) {
                c[n] = (cand){i, l[i]};
                heap_up(c, n++);
            }
        /* full: a later token (a higher id) goes in only above the root's logit */
        bool more = false;
        float thr = n ? c[0].l : INFINITY;
        for (; i < nv; i++) {
            const float v = l[i];
            if (v > thr) {
                if (mk && !(mk[i >> 5] >> (i & 31) & 1u)) continue;
                more = true;
                c[0] = (cand){i, v};
                heap_down(c, k, 0);
                thr = c[0].l;
            } else if (!more && cand_ok(l, mk, i)) {
                more = true;
            }
        }
        if (more) { /* more than k: the top k, sorted as quickselect leaves them */
            qsort(c, (size_t)k, sizeof *c, cand_cmp);
            n = k;
        } else { /* k or fewer: all of them, in id order as below */
            n = 0;
            for (i = 0; i < nv; i++)
                if (cand_ok(l, mk, i)) c[n++] = (cand){i, l[i]};
        }
    } else {
        /* Candidates: every token that can still be drawn. NaN logits never win. */
        for (int32_t i = 0; i < nv; i++)
            if (cand_ok(l, mk, i)) c[n++] = (cand){i, l[i]};
    }
    if (n == 0)
        return engine_err(ENGINE_EINVAL, "sampler: no token can be sampled (the grammar mask, "
                          "logit bias or NaN logits exclude all %d)", nv);
    if (p->temperature <= 0.0f) {
        cand best = c[0];
        for (int32_t i = 1; i < n; i++)
            if (cand_before(&c[i], &best)) best = c[i];
        *greedy = best.id;
        return 0;
    }
    if (s->full && p->top_k > 0 && p->top_k < n) {
        cands_top(c, n, p->top_k);
        n = p->top_k;
    }
    float inv_t = 1.0f / p->temperature;
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        c[i].l *= inv_t;
        if (c[i].l > mx) mx = c[i].l;
    }
    double z = 0.0;
    for (int32_t i = 0; i < n; i++) {
        c[i].l = expf(c[i].l - mx);
        z += c[i].l;
    }
    for (int32_t i = 0; i < n; i++) c[i].l = (float)(c[i].l / z);
    if (p->top_p < 1.0f) {
        /* The nucleus is usually small: sort a growing prefix instead of the whole vocab. */
        int32_t m = n < 64 ? n : 64;
        for (;;) {
            cands_top(c, n, m);
            double cum = 0.0;
            int32_t cut = -1;
            for (int32_t i = 0; i < m; i++) {
                cum += c[i].l;
                if (cum >= p->top_p) {
                    cut = i + 1;
                    break;
                }
            }
            if (cut > 0) {
                n = cut;
                break;
            }
            if (m == n) break;
            m = m > n / 4 ? n : m * 4;
        }
    }
    if (p->min_p > 0.0f) {
        float pmax = 0.0f;
        for (int32_t i = 0; i < n; i++)
            if (c[i].l > pmax) pmax = c[i].l;
        float thr = p->min_p * pmax;
        int32_t k = 0;
        for (int32_t i = 0; i < n; i++)
            if (c[i].l >= thr) c[k++] = c[i];
        n = k;
    }
    *n_out = n;
    return 0;
}

int engine_sampler_sample(engine_sampler *s, const float *logits, int32_t *out_token) {
    int32_t n = 0, greedy;
    int rc = sampler_dist(s, logits, &n, &greedy);
    if (rc) return rc;
    if (greedy >= 0) {
        *out_token = greedy;
        return 0;
    }
    const cand *c = s->cands;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += c[i].l;
    double r = rng_uniform(s->rng) * sum, acc = 0.0;
    int32_t pick = n - 1;
    for (int32_t i = 0; i < n; i++) {
        acc += c[i].l;
        if (r < acc) {
            pick = i;
            break;
        }
    }
    *out_token = c[pick].id;
    return 0;
}

int engine_sampler_probs(engine_sampler *s, const float *logits, float *probs) {
    int32_t n = 0, greedy;
    int rc = sampler_dist(s, logits, &n, &greedy);
    if (rc) return rc;
    memset(probs, 0, sizeof(float) * (size_t)s->n_vocab);
    if (greedy >= 0) {
        probs[greedy] = 1.0f;
        return 0;
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += s->cands[i].l;
    for (int32_t i = 0; i < n; i++) probs[s->cands[i].id] = (float)(s->cands[i].l / sum);
    return 0;
}

double engine_sampler_uniform(engine_sampler *s) {
    return rng_uniform(s->rng);
}

bool engine_sampler_is_greedy(const engine_sampler *s) {
    return s->p.temperature <= 0.0f;
}
