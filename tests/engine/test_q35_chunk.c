/* The chunked form of the gated delta rule (engine_cpu_delta_chunk_rows / _fold, ops_ssm.c)
 * against the recurrent form (engine_cpu_delta_rule), one head at a time, on random inputs
 * shaped like the model's: q and k L2-normalised (q scaled by 1/sqrt(dk)), v ~ N(0, 1), log
 * gates A * softplus(a + dt) with A in [-16, -1] and dt as HF initialises it, beta = sigmoid.
 *
 *   equal     for n = 1, 63, 64, 65, 200, 1000 tokens, chunks of 64 (HF's size) and 16 (the
 *             qwen35 forward's: its snapshot grid), head sizes 128 x 128 (the real model),
 *             16 x 32 and 12 x 20 (columns outside the kernel's blocks of 8): every output and the final state within REL_TOL of the recurrent form's
 *             (max |chunked - recurrent| / max |recurrent|, per tensor)
 *   splits    one chunk appended in random pieces (1 row, a few, all at once) gives the same
 *             outputs, pending rows and folded state bit for bit: what keeps a session's
 *             logits independent of how its tokens were split into passes
 *   decay     gates of exp(-80) per token (everything before forgotten) and of 1 (nothing
 *             forgotten) stay finite and equal the recurrent form */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "engine.h"
#include "support.h"

#define REL_TOL 2e-5

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static float nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

typedef struct {
    int n, dk, dv;
    float *q, *k, *v, *lg, *beta, *s0;
} inputs;

/* gate_mode 0: realistic, 1: exp(-80) per token, 2: no decay */
static bool make_inputs(inputs *in, int n, int dk, int dv, int gate_mode) {
    in->n = n;
    in->dk = dk;
    in->dv = dv;
    in->q = malloc(sizeof(float) * (size_t)n * dk);
    in->k = malloc(sizeof(float) * (size_t)n * dk);
    in->v = malloc(sizeof(float) * (size_t)n * dv);
    in->lg = malloc(sizeof(float) * (size_t)n);
    in->beta = malloc(sizeof(float) * (size_t)n);
    in->s0 = malloc(sizeof(float) * (size_t)dk * dv);
    if (!in->q || !in->k || !in->v || !in->lg || !in->beta || !in->s0) return false;
    float A = -(float)(1.0 + 15.0 * urand());
    float dt = (float)exp(log(0.001) + urand() * (log(0.1) - log(0.001)));
    float dt_bias = dt + logf(-expm1f(-dt)); /* inverse softplus, HF's init */
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < dk; i++) {
            in->q[(size_t)t * dk + i] = nrand();
            in->k[(size_t)t * dk + i] = nrand();
        }
        engine_cpu_l2norm(in->q + (size_t)t * dk, in->q + (size_t)t * dk, dk, 1e-6f,
                          1.0f / sqrtf((float)dk));
        engine_cpu_l2norm(in->k + (size_t)t * dk, in->k + (size_t)t * dk, dk, 1e-6f, 1.0f);
        for (int c = 0; c < dv; c++)
            in->v[(size_t)t * dv + c] = nrand();
        float a = nrand() + dt_bias, sp = a > 20.0f ? a : log1pf(expf(a));
        in->lg[t] = gate_mode == 1 ? -80.0f : gate_mode == 2 ? 0.0f : A * sp;
        in->beta[t] = 1.0f / (1.0f + expf(-nrand()));
    }
    /* a state some tokens in: small random entries */
    for (size_t i = 0; i < (size_t)dk * dv; i++)
        in->s0[i] = 0.05f * nrand();
    return true;
}

static void free_inputs(inputs *in) {
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->lg);
    free(in->beta);
    free(in->s0);
}

static void run_recurrent(const inputs *in, float *s, float *o) {
    float *tmp = malloc(sizeof(float) * (size_t)in->dv);
    memcpy(s, in->s0, sizeof(float) * (size_t)in->dk * in->dv);
    for (int t = 0; t < in->n; t++)
        engine_cpu_delta_rule(s, in->dk, in->dv, in->q + (size_t)t * in->dk,
                              in->k + (size_t)t * in->dk, in->v + (size_t)t * in->dv,
                              expf(in->lg[t]), in->beta[t], o + (size_t)t * in->dv, tmp);
    free(tmp);
}

/* Chunks of `cap` rows from token 0, each appended in pieces of at most `piece` rows (0: the
 * whole chunk), folded at the chunk's end; the final state folded at the end. */
static void run_chunked(const inputs *in, int cap, int piece, float *s, float *o) {
    int dk = in->dk, dv = in->dv;
    float *pend = malloc(sizeof(float) * ENGINE_CPU_DELTA_PEND_FLOATS(cap, dk, dv));
    float *scratch = malloc(sizeof(float) * 2 * (size_t)cap * dv);
    memcpy(s, in->s0, sizeof(float) * (size_t)dk * dv);
    int m = 0;
    for (int t = 0; t < in->n;) {
        int np = cap - m;
        if (np > in->n - t) np = in->n - t;
        if (piece > 0 && np > piece) np = piece;
        engine_cpu_delta_chunk_rows(s, pend, cap, m, np, dk, dv, in->q + (size_t)t * dk,
                                    in->k + (size_t)t * dk, in->v + (size_t)t * dv, (size_t)dv,
                                    in->lg + t, in->beta + t, o + (size_t)t * dv, scratch);
        m += np;
        t += np;
        if (m == cap) {
            engine_cpu_delta_chunk_fold(s, pend, cap, m, dk, dv);
            m = 0;
        }
    }
    engine_cpu_delta_chunk_fold(s, pend, cap, m, dk, dv);
    free(pend);
    free(scratch);
}

static double rel_err(const float *a, const float *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double d = fabs((double)a[i] - b[i]);
        if (d > md) md = d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return mb > 0 ? md / mb : md;
}

static void check_equal(int dk, int dv, int gate_mode) {
    static const int lens[] = {1, 63, 64, 65, 200, 1000};
    static const int caps[] = {64, 16};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        int n = lens[li];
        inputs in;
        bool ok = make_inputs(&in, n, dk, dv, gate_mode);
        size_t ns = (size_t)dk * dv, no = (size_t)n * dv;
        float *sr = malloc(sizeof(float) * ns), *sc = malloc(sizeof(float) * ns);
        float *orr = malloc(sizeof(float) * no), *oc = malloc(sizeof(float) * no);
        CHECK(ok && sr && sc && orr && oc);
        if (ok && sr && sc && orr && oc) {
            run_recurrent(&in, sr, orr);
            for (size_t ci = 0; ci < sizeof caps / sizeof *caps; ci++) {
                run_chunked(&in, caps[ci], 0, sc, oc);
                double eo = rel_err(oc, orr, no), es = rel_err(sc, sr, ns);
                printf("dk %3d dv %3d gates %d n %4d chunk %2d: outputs %.2e, final state %.2e\n",
                       dk, dv, gate_mode, n, caps[ci], eo, es);
                if (!(eo <= REL_TOL && es <= REL_TOL))
                    support_fail("n %d chunk %d: relative error outputs %.3g state %.3g > %g", n,
                                 caps[ci], eo, es, REL_TOL);
            }
        }
        free(sr);
        free(sc);
        free(orr);
        free(oc);
        free_inputs(&in);
    }
}

/* Any split of the rows gives the same bits. */
static void check_splits(int DK, int DV) {
    enum { N = 200 };
    inputs in;
    bool ok = make_inputs(&in, N, DK, DV, 0);
    size_t ns = (size_t)DK * DV, no = (size_t)N * DV;
    float *s1 = malloc(sizeof(float) * ns), *s2 = malloc(sizeof(float) * ns);
    float *o1 = malloc(sizeof(float) * no), *o2 = malloc(sizeof(float) * no);
    CHECK(ok && s1 && s2 && o1 && o2);
    if (ok && s1 && s2 && o1 && o2) {
        static const int caps[] = {16, 64};
        for (size_t ci = 0; ci < 2; ci++) {
            run_chunked(&in, caps[ci], 0, s1, o1);
            static const int pieces[] = {1, 3, 7, 13};
            for (size_t pi = 0; pi < sizeof pieces / sizeof *pieces; pi++) {
                run_chunked(&in, caps[ci], pieces[pi], s2, o2);
                bool same = !memcmp(s1, s2, sizeof(float) * ns) &&
                            !memcmp(o1, o2, sizeof(float) * no);
                printf("dk %d dv %d chunk %d appended %d rows at a time: %s\n", DK, DV,
                       caps[ci], pieces[pi], same ? "same bits" : "DIFFERENT");
                CHECK(same);
            }
        }
    }
    free(s1);
    free(s2);
    free(o1);
    free(o2);
    free_inputs(&in);
}

int main(void) {
    check_equal(128, 128, 0);
    check_equal(16, 32, 0);
    check_equal(16, 32, 1);
    check_equal(16, 32, 2);
    check_equal(12, 20, 0); /* columns outside the blocks of 8 */
    check_splits(128, 128);
    check_splits(12, 20);
    return support_finish("test_q35_chunk");
}
