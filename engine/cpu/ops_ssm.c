/* F32 ops of the Gated DeltaNet (linear attention) blocks: contracts in cpu.h. Reductions
 * accumulate in double, as in ops.c. */
#include "cpu.h"

#include <math.h>
#include <string.h>

void engine_cpu_l2norm(float *y, const float *x, int n, float eps, float scale) {
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)ss + eps);
    for (int i = 0; i < n; i++)
        y[i] = x[i] * inv * scale;
}

void engine_cpu_conv1d_causal(float *x, size_t stride, int n, const float *w, int k, float *state,
                              bool silu) {
    float win[ENGINE_CPU_MAX_CONV];
    memcpy(win, state, sizeof(float) * (size_t)(k - 1));
    for (int t = 0; t < n; t++) {
        float *xp = x + (size_t)t * stride;
        float xin = *xp, y = w[k - 1] * xin;
        for (int i = 0; i < k - 1; i++)
            y += w[i] * win[i];
        for (int i = 0; i + 1 < k - 1; i++)
            win[i] = win[i + 1];
        if (k > 1) win[k - 2] = xin;
        *xp = silu ? y / (1.0f + expf(-y)) : y;
    }
    memcpy(state, win, sizeof(float) * (size_t)(k - 1));
}

void engine_cpu_delta_rule(float *s, int dk, int dv, const float *q, const float *k, const float *v,
                           float g, float beta, float *o, float *tmp) {
    /* S *= g; tmp = S^T k (what the state predicts for k) */
    for (int c = 0; c < dv; c++)
        tmp[c] = 0.0f;
    for (int i = 0; i < dk; i++) {
        float *si = s + (size_t)i * dv, ki = k[i];
        for (int c = 0; c < dv; c++) {
            si[c] *= g;
            tmp[c] += si[c] * ki;
        }
    }
    /* the correction, written back along k: S += k ((v - S^T k) beta)^T; o = S^T q */
    for (int c = 0; c < dv; c++) {
        tmp[c] = (v[c] - tmp[c]) * beta;
        o[c] = 0.0f;
    }
    for (int i = 0; i < dk; i++) {
        float *si = s + (size_t)i * dv, ki = k[i], qi = q[i];
        for (int c = 0; c < dv; c++) {
            si[c] += ki * tmp[c];
            o[c] += si[c] * qi;
        }
    }
}

void engine_cpu_rmsnorm_gated(float *y, const float *x, const float *w, const float *z, int n,
                              float eps) {
    engine_cpu_rmsnorm(y, x, w, n, eps);
    for (int i = 0; i < n; i++)
        y[i] *= z[i] / (1.0f + expf(-z[i]));
}

/* Dot product in 8 float lanes (vectorisable, and the same order whatever the caller). */
static float ssm_dot(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += a[i + l] * b[i + l];
    for (; i < n; i++)
        acc[0] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* 4 floats in a register (GCC/clang vector extension: SSE, NEON); each lane's arithmetic is
 * the scalar one, so blocked and unblocked sums give the same bits. */
typedef float ssm_v4 __attribute__((vector_size(16)));

static inline ssm_v4 ssm_load4(const float *p) {
    ssm_v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ok[t][c] = sum_i k[t][i] s[i][c] and oq[t][c] likewise from q, for n rows of dk (s is
 * [dk][dv]), each sum in order of i from 0 whatever the blocking (so a row's bits do not
 * depend on n). Blocks of 2 tokens (4 rows) x 8 columns keep their sums in registers: one load
 * of s per 4 rows, and one pass over s for k and q even when n is 1 (decode). */
static void ssm_rows_by_state(float *ok, float *oq, const float *k, const float *q, int n,
                              const float *s, int dk, int dv) {
    int c = 0;
    for (; c + 8 <= dv; c += 8) {
        int t = 0;
        for (; t + 2 <= n; t += 2) {
            const float *k0 = k + (size_t)t * dk, *k1 = k0 + dk;
            const float *q0 = q + (size_t)t * dk, *q1 = q0 + dk;
            ssm_v4 a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
            for (int i = 0; i < dk; i++) {
                ssm_v4 sa = ssm_load4(s + (size_t)i * dv + c);
                ssm_v4 sb = ssm_load4(s + (size_t)i * dv + c + 4);
                a0 += k0[i] * sa;
                b0 += k0[i] * sb;
                a1 += q0[i] * sa;
                b1 += q0[i] * sb;
                a2 += k1[i] * sa;
                b2 += k1[i] * sb;
                a3 += q1[i] * sa;
                b3 += q1[i] * sb;
            }
            float *pk = ok + (size_t)t * dv + c, *pq = oq + (size_t)t * dv + c;
            memcpy(pk, &a0, sizeof a0);
            memcpy(pk + 4, &b0, sizeof b0);
            memcpy(pq, &a1, sizeof a1);
            memcpy(pq + 4, &b1, sizeof b1);
            memcpy(pk + dv, &a2, sizeof a2);
            memcpy(pk + dv + 4, &b2, sizeof b2);
            memcpy(pq + dv, &a3, sizeof a3);
            memcpy(pq + dv + 4, &b3, sizeof b3);
        }
        for (; t < n; t++) {
            const float *k0 = k + (size_t)t * dk, *q0 = q + (size_t)t * dk;
            ssm_v4 a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0};
            for (int i = 0; i < dk; i++) {
                ssm_v4 sa = ssm_load4(s + (size_t)i * dv + c);
                ssm_v4 sb = ssm_load4(s + (size_t)i * dv + c + 4);
                a0 += k0[i] * sa;
                b0 += k0[i] * sb;
                a1 += q0[i] * sa;
                b1 += q0[i] * sb;
            }
            float *pk = ok + (size_t)t * dv + c, *pq = oq + (size_t)t * dv + c;
            memcpy(pk, &a0, sizeof a0);
            memcpy(pk + 4, &b0, sizeof b0);
            memcpy(pq, &a1, sizeof a1);
            memcpy(pq + 4, &b1, sizeof b1);
        }
    }
    for (; c < dv; c++)
        for (int t = 0; t < n; t++) {
            float a = 0.0f, b = 0.0f;
            for (int i = 0; i < dk; i++) {
                a += k[(size_t)t * dk + i] * s[(size_t)i * dv + c];
                b += q[(size_t)t * dk + i] * s[(size_t)i * dv + c];
            }
            ok[(size_t)t * dv + c] = a;
            oq[(size_t)t * dv + c] = b;
        }
}

void engine_cpu_delta_chunk_rows(const float *s, float *pend, int cap, int m, int n, int dk,
                                 int dv, const float *q, const float *k, const float *v,
                                 size_t v_stride, const float *lg, const float *beta, float *o,
                                 float *scratch) {
    float *kp = pend, *dp = pend + (size_t)cap * dk, *cp = dp + (size_t)cap * dv;
    float *pk = scratch, *pq = scratch + (size_t)n * dv;
    float e[ENGINE_CPU_DELTA_CHUNK_MAX];
    /* s^T k_t and s^T q_t for every row */
    ssm_rows_by_state(pk, pq, k, q, n, s, dk, dv);
    for (int t = 0; t < n; t++) {
        int r = m + t;
        const float *kt = k + (size_t)t * dk, *qt = q + (size_t)t * dk;
        const float *vt = v + (size_t)t * v_stride, *pkt = pk + (size_t)t * dv;
        const float *pqt = pq + (size_t)t * dv;
        float cr = (r > 0 ? cp[r - 1] : 0.0f) + lg[t], gam = expf(cr), bt = beta[t];
        float *d = dp + (size_t)r * dv, *ot = o + (size_t)t * dv;
        memcpy(kp + (size_t)r * dk, kt, sizeof(float) * (size_t)dk);
        cp[r] = cr;
        for (int j = 0; j < r; j++)
            e[j] = expf(cr - cp[j]);
        e[r] = 1.0f;
        /* the correction: forward substitution against the rows before */
        for (int c = 0; c < dv; c++)
            d[c] = vt[c] - gam * pkt[c];
        for (int j = 0; j < r; j++) {
            float w = e[j] * ssm_dot(kt, kp + (size_t)j * dk, dk);
            const float *dj = dp + (size_t)j * dv;
            for (int c = 0; c < dv; c++)
                d[c] -= w * dj[c];
        }
        for (int c = 0; c < dv; c++) {
            d[c] *= bt;
            ot[c] = gam * pqt[c];
        }
        for (int j = 0; j <= r; j++) {
            float w = e[j] * ssm_dot(qt, kp + (size_t)j * dk, dk);
            const float *dj = dp + (size_t)j * dv;
            for (int c = 0; c < dv; c++)
                ot[c] += w * dj[c];
        }
    }
}

void engine_cpu_delta_chunk_fold(float *s, const float *pend, int cap, int m, int dk, int dv) {
    if (m <= 0) return;
    const float *kp = pend, *dp = pend + (size_t)cap * dk, *cp = dp + (size_t)cap * dv;
    float e[ENGINE_CPU_DELTA_CHUNK_MAX];
    float cl = cp[m - 1], gl = expf(cl);
    for (int j = 0; j < m; j++)
        e[j] = expf(cl - cp[j]);
    /* per element: s * gl, then the rows in order; 8 columns of one row of s in registers */
    for (int i = 0; i < dk; i++) {
        float *si = s + (size_t)i * dv, w[ENGINE_CPU_DELTA_CHUNK_MAX];
        for (int j = 0; j < m; j++)
            w[j] = e[j] * kp[(size_t)j * dk + i];
        int c = 0;
        for (; c + 8 <= dv; c += 8) {
            ssm_v4 a = ssm_load4(si + c) * gl, b = ssm_load4(si + c + 4) * gl;
            for (int j = 0; j < m; j++) {
                a += w[j] * ssm_load4(dp + (size_t)j * dv + c);
                b += w[j] * ssm_load4(dp + (size_t)j * dv + c + 4);
            }
            memcpy(si + c, &a, sizeof a);
            memcpy(si + c + 4, &b, sizeof b);
        }
        for (; c < dv; c++) {
            float a = si[c] * gl;
            for (int j = 0; j < m; j++)
                a += w[j] * dp[(size_t)j * dv + c];
            si[c] = a;
        }
    }
}
