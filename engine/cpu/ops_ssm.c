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
