/* Each CPU op of the forward pass against a naive double-precision reference on random data:
 * rmsnorm, softmax, RoPE, attention (F32 and F16 KV, contiguous and paged block tables), MoE
 * routing, matrix-vector products of every supported weight type, and the thread pool. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/quant.h"
#include "engine.h"
#include "support.h"

static uint64_t rng = 0x1234567887654321ull;

static double urand(void) { /* [0, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-53;
}

static float nrand(void) { /* roughly N(0, 1) */
    double s = 0;
    for (int i = 0; i < 12; i++) s += urand();
    return (float)(s - 6.0);
}

static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = nrand() * scale;
}

/* max |a-b| / max(|b|, floor) */
static double rel_err(const float *a, const double *b, size_t n, double floor) {
    double md = 0, mb = floor;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md || isnan(d)) md = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return md / mb;
}

static void test_rmsnorm(void) {
    int n = 1000;
    float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * n),
          *y = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * n);
    fill(x, n, 3.0f);
    fill(w, n, 1.0f);
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; i++) ref[i] = w[i] * x[i] * sc;
    engine_cpu_rmsnorm(y, x, w, n, 1e-6f);
    CHECK(rel_err(y, ref, n, 1e-6) < 1e-6);
    engine_cpu_rmsnorm(x, x, w, n, 1e-6f); /* in place */
    CHECK(memcmp(x, y, sizeof(float) * n) == 0);
    free(x);
    free(w);
    free(y);
    free(ref);
}

static void test_softmax(void) {
    int n = 513;
    float *x = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * n);
    fill(x, n, 10.0f);
    x[7] = 300.0f; /* large values must not overflow */
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, x[i]);
    for (int i = 0; i < n; i++) s += exp(x[i] - mx);
    for (int i = 0; i < n; i++) ref[i] = exp(x[i] - mx) / s;
    engine_cpu_softmax(x, n);
    CHECK(rel_err(x, ref, n, 1e-30) < 1e-6);
    free(x);
    free(ref);
}

static void test_rope(void) {
    int nh = 3, hd = 64;
    float inv[32], x[3 * 64];
    engine_cpu_rope_inv_freq(inv, hd, 1e6f);
    for (int i = 0; i < hd / 2; i++) CHECK(fabs(inv[i] - pow(1e6, -2.0 * i / hd)) < 1e-6 * fabs(inv[i]) + 1e-12);
    int32_t positions[] = {0, 1, 17, 4095, 40000};
    for (size_t pi = 0; pi < sizeof positions / sizeof positions[0]; pi++) {
        int32_t pos = positions[pi];
        fill(x, (size_t)nh * hd, 1.0f);
        double ref[3 * 64];
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < hd / 2; i++) {
                double a = (double)(float)((float)pos * inv[i]);
                double x0 = x[h * hd + i], x1 = x[h * hd + i + hd / 2];
                ref[h * hd + i] = x0 * cos(a) - x1 * sin(a);
                ref[h * hd + i + hd / 2] = x0 * sin(a) + x1 * cos(a);
            }
        engine_cpu_rope_neox(x, nh, hd, pos, inv);
        CHECK(rel_err(x, ref, (size_t)nh * hd, 1e-3) < 1e-6);
    }
    /* position 0 is the identity */
    float y[64], z[64];
    fill(y, 64, 1.0f);
    memcpy(z, y, sizeof y);
    engine_cpu_rope_neox(y, 1, 64, 0, inv);
    CHECK(memcmp(y, z, sizeof y) == 0);
}

/* attention of every head of a random query over n_pos positions, with block size bs and the
 * blocks in shuffled order (a paged table) */
static void test_attention_case(engine_kv_type type, int32_t n_pos, int32_t bs) {
    int nkv = 2, hd = 32, group = 3, nh = nkv * group, stride = nkv * hd;
    int32_t n_blocks = (n_pos + bs - 1) / bs;
    float *K = malloc(sizeof(float) * (size_t)n_pos * stride);
    float *V = malloc(sizeof(float) * (size_t)n_pos * stride);
    float *q = malloc(sizeof(float) * (size_t)nh * hd), *out = malloc(sizeof(float) * nh * hd);
    float *scores = malloc(sizeof(float) * (size_t)group * n_pos);
    void **kb = calloc((size_t)n_blocks, sizeof(void *)), **vb = calloc((size_t)n_blocks, sizeof(void *));
    size_t elt = type == ENGINE_KV_F32 ? 4 : 2;
    uint8_t *pool_k = malloc((size_t)n_blocks * bs * stride * elt);
    uint8_t *pool_v = malloc((size_t)n_blocks * bs * stride * elt);
    /* block i of the sequence lives in pool slot perm[i] */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int32_t i = 0; i < n_blocks; i++) perm[i] = i;
    for (int32_t i = n_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)(urand() * (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int32_t i = 0; i < n_blocks; i++) {
        kb[i] = pool_k + (size_t)perm[i] * bs * stride * elt;
        vb[i] = pool_v + (size_t)perm[i] * bs * stride * elt;
    }
    engine_kv_view kv = {kb, vb, bs, type, nkv, hd};
    fill(K, (size_t)n_pos * stride, 1.0f);
    fill(V, (size_t)n_pos * stride, 1.0f);
    fill(q, (size_t)nh * hd, 1.0f);
    for (int32_t p = 0; p < n_pos; p++) engine_cpu_kv_store(&kv, p, K + (size_t)p * stride, V + (size_t)p * stride);
    float scale = 1.0f / sqrtf((float)hd);
    for (int g = 0; g < nkv; g++)
        engine_cpu_attention_group(out + (size_t)g * group * hd, q + (size_t)g * group * hd,
                                   group, &kv, g, n_pos, scale, scores);
    double worst = 0;
    for (int h = 0; h < nh; h++) {
        int kvh = h / group;
        double ref[32], *w = malloc(sizeof(double) * (size_t)n_pos), mx = -INFINITY, s = 0;
        for (int32_t p = 0; p < n_pos; p++) {
            double d = 0;
            for (int i = 0; i < hd; i++) {
                float kk = K[(size_t)p * stride + kvh * hd + i];
                if (type == ENGINE_KV_F16) kk = engine_fp16_to_fp32(engine_fp32_to_fp16(kk));
                d += (double)q[h * hd + i] * kk;
            }
            w[p] = d * scale;
            mx = fmax(mx, w[p]);
        }
        for (int32_t p = 0; p < n_pos; p++) s += (w[p] = exp(w[p] - mx));
        for (int i = 0; i < hd; i++) {
            double a = 0;
            for (int32_t p = 0; p < n_pos; p++) {
                float vv = V[(size_t)p * stride + kvh * hd + i];
                if (type == ENGINE_KV_F16) vv = engine_fp16_to_fp32(engine_fp32_to_fp16(vv));
                a += w[p] / s * vv;
            }
            ref[i] = a;
        }
        double e = rel_err(out + (size_t)h * hd, ref, (size_t)hd, 1e-2);
        if (e > worst) worst = e;
        free(w);
    }
    if (!(worst < 1e-5))
        fprintf(stderr, "attention type %d n_pos %d bs %d: rel err %g\n", (int)type, n_pos, bs, worst);
    CHECK(worst < 1e-5);
    free(K);
    free(V);
    free(q);
    free(out);
    free(scores);
    free(kb);
    free(vb);
    free(pool_k);
    free(pool_v);
    free(perm);
}

static void test_attention(void) {
    test_attention_case(ENGINE_KV_F32, 1, 1);
    test_attention_case(ENGINE_KV_F32, 37, 37);   /* contiguous: one block */
    test_attention_case(ENGINE_KV_F32, 300, 16);  /* paged */
    test_attention_case(ENGINE_KV_F16, 300, 300);
    test_attention_case(ENGINE_KV_F16, 129, 32);
}

static void test_moe_route(void) {
    for (int trial = 0; trial < 50; trial++) {
        int ne = trial % 2 ? 128 : 8, k = trial % 2 ? 8 : 2;
        float logits[128], probs[128], w[8];
        int32_t ids[8];
        fill(logits, (size_t)ne, 2.0f);
        if (trial == 3) logits[5] = logits[1]; /* a tie: the lower id first */
        double p[128], mx = -INFINITY, s = 0;
        for (int e = 0; e < ne; e++) mx = fmax(mx, logits[e]);
        for (int e = 0; e < ne; e++) s += (p[e] = exp(logits[e] - mx));
        for (int e = 0; e < ne; e++) p[e] /= s;
        for (int norm = 0; norm < 2; norm++) {
            engine_cpu_moe_route(logits, ne, k, norm, ids, w, probs);
            bool used[128] = {false};
            double sum = 0;
            for (int j = 0; j < k; j++) sum += p[ids[j]];
            for (int j = 0; j < k; j++) {
                CHECK(ids[j] >= 0 && ids[j] < ne && !used[ids[j]]);
                used[ids[j]] = true;
                double want = norm ? p[ids[j]] / sum : p[ids[j]];
                CHECK(fabs(w[j] - want) < 1e-6);
                if (j) CHECK(w[j] <= w[j - 1]);
            }
            /* nothing left out is larger than what was taken */
            double min_taken = INFINITY;
            for (int j = 0; j < k; j++) min_taken = fmin(min_taken, p[ids[j]]);
            for (int e = 0; e < ne; e++)
                if (!used[e]) CHECK(p[e] <= min_taken);
        }
        if (trial == 3) {
            /* ids 1 and 5 share a probability: if both are taken, 1 comes first */
            int i1 = -1, i5 = -1;
            for (int j = 0; j < k; j++) {
                if (ids[j] == 1) i1 = j;
                if (ids[j] == 5) i5 = j;
            }
            if (i1 >= 0 && i5 >= 0) CHECK(i1 < i5);
        }
    }
}

/* W x for each supported weight type against dequantised rows dotted in double with the
 * unconverted activations. The activations are converted to Q8_0/Q8_K for quantised types,
 * which costs up to ~1% of sum |w x|; F32-dot types are exact to rounding. */
static void test_matvec(void) {
    const engine_type types[] = {ENGINE_TYPE_F32, ENGINE_TYPE_F16, ENGINE_TYPE_BF16,
                                 ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q4_0, ENGINE_TYPE_Q4_K,
                                 ENGINE_TYPE_Q5_K, ENGINE_TYPE_Q6_K};
    int rows = 40, cols = 512;
    float *wf = malloc(sizeof(float) * (size_t)rows * cols), *x = malloc(sizeof(float) * cols);
    float *deq = malloc(sizeof(float) * cols), *y = malloc(sizeof(float) * rows);
    fill(x, (size_t)cols, 1.0f);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        engine_type t = types[ti];
        const engine_type_traits *tr = engine_type_traits_get(t);
        CHECK(tr && tr->supported);
        if (!tr || !tr->supported) continue;
        size_t rb = engine_type_row_size(t, cols);
        uint8_t *W = malloc(rb * rows);
        uint8_t *xc = malloc(engine_type_row_size(tr->vec_dot_type, cols) + 64);
        fill(wf, (size_t)rows * cols, 0.05f);
        for (int r = 0; r < rows; r++) CHECK(engine_quantize_row(t, wf + (size_t)r * cols, W + r * rb, cols) == 0);
        CHECK(engine_quantize_row(tr->vec_dot_type, x, xc, cols) == 0);
        for (int r = 0; r < rows; r++) y[r] = NAN;
        engine_quant_matvec(t, W, rb, cols, 3, rows, xc, y); /* a row range */
        CHECK(isnan(y[0]) && isnan(y[2]));
        double worst = 0;
        for (int r = 3; r < rows; r++) {
            CHECK(engine_dequantize_row(t, W + r * rb, deq, cols) == 0);
            double ref = 0, mag = 0;
            for (int i = 0; i < cols; i++) {
                ref += (double)deq[i] * x[i];
                mag += fabs((double)deq[i] * x[i]);
            }
            double e = fabs(y[r] - ref) / mag;
            if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e;
        }
        double tol = tr->vec_dot_type == ENGINE_TYPE_F32 ? 1e-5 : 1e-2;
        if (!(worst <= tol)) fprintf(stderr, "matvec %s: rel err %g > %g\n", tr->name, worst, tol);
        CHECK(worst <= tol);
        free(W);
        free(xc);
    }
    free(wf);
    free(x);
    free(deq);
    free(y);
}

typedef struct {
    atomic_int calls[8];
    atomic_long sum;
} pool_probe;

static void probe_fn(void *ctx, int ith, int nth) {
    pool_probe *p = ctx;
    atomic_fetch_add(&p->calls[ith], 1);
    int64_t a, b;
    engine_split(1000, ith, nth, &a, &b);
    long s = 0;
    for (int64_t i = a; i < b; i++) s += i;
    atomic_fetch_add(&p->sum, s);
}

static void test_pool(void) {
    for (int n = 1; n <= 4; n++) {
        engine_pool *pool;
        CHECK(engine_pool_new(&pool, n) == 0);
        CHECK(engine_pool_size(pool) == n);
        pool_probe p;
        memset(&p, 0, sizeof p);
        for (int r = 0; r < 500; r++) engine_pool_run(pool, probe_fn, &p);
        for (int i = 0; i < n; i++) CHECK(atomic_load(&p.calls[i]) == 500);
        CHECK(atomic_load(&p.sum) == 500L * 999 * 1000 / 2);
        engine_pool_free(pool);
    }
    engine_pool *bad;
    CHECK(engine_pool_new(&bad, 0) == ENGINE_EINVAL);
    engine_pool_free(NULL);
    /* engine_split covers [0, n) exactly once, for awkward n and nth */
    for (int nth = 1; nth <= 7; nth++)
        for (int64_t n = 0; n < 20; n++) {
            int64_t next = 0;
            for (int i = 0; i < nth; i++) {
                int64_t a, b;
                engine_split(n, i, nth, &a, &b);
                CHECK(a == next && b >= a);
                next = b;
            }
            CHECK(next == n);
        }
}

int main(void) {
    test_rmsnorm();
    test_softmax();
    test_rope();
    test_attention();
    test_moe_route();
    test_matvec();
    test_pool();
    return support_finish("test_forward_ops");
}
