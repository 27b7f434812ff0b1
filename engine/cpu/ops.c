/* F32 ops of the CPU backend (contracts in cpu.h). Reductions accumulate in double: the
 * vectors are short (a few thousand values) and it keeps us within 1e-6 of the reference. */
#include "cpu.h"

#include "cpu/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

void engine_cpu_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    /* The reference computes mean and rsqrt in F32; the double sum only removes rounding. */
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * scale);
}

void engine_cpu_softmax(float *x, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void engine_cpu_rope_inv_freq(float *inv_freq, int head_dim, float theta) {
    for (int i = 0; i < head_dim / 2; i++) {
        float e = (float)(2 * i) / (float)head_dim;
        inv_freq[i] = 1.0f / powf(theta, e);
    }
}

void engine_cpu_rope_neox(float *x, int n_heads, int head_dim, int32_t pos,
                          const float *inv_freq) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* The angle is rounded to F32 as the reference's F32 outer product does; cos and sin
         * of that value are then computed exactly. */
        float ang = (float)pos * inv_freq[i];
        float c = (float)cos((double)ang), s = (float)sin((double)ang);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)h * head_dim;
            float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * c - x1 * s;
            v[i + half] = x0 * s + x1 * c;
        }
    }
}

void engine_cpu_swiglu(float *y, const float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) {
        float a = g[i];
        y[i] = a / (1.0f + expf(-a)) * u[i];
    }
}

/* F16 -> F32 for the KV cache through a 64K-entry table (256 KiB, filled once per process and
 * read-only after): a load instead of the branchy bit conversion, portable to every CPU. */
static float f16_table[65536];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

static void f16_table_fill(void) {
    for (uint32_t i = 0; i < 65536; i++) f16_table[i] = engine_fp16_to_fp32((uint16_t)i);
}

static inline const void *kv_row(void *const *blocks, int32_t bs, int32_t pos, size_t row_bytes) {
    return (const uint8_t *)blocks[pos / bs] + (size_t)(pos % bs) * row_bytes;
}

size_t engine_cpu_kv_row_bytes(engine_kv_type t, int n_head_kv, int head_dim) {
    size_t n = (size_t)n_head_kv * (size_t)head_dim;
    switch (t) {
    case ENGINE_KV_F32: return n * 4;
    case ENGINE_KV_F16: return n * 2;
    case ENGINE_KV_Q8_0:
        if (head_dim % ENGINE_QK8_0) return 0;
        return n / ENGINE_QK8_0 * sizeof(engine_block_q8_0);
    default: return 0;
    }
}

void engine_cpu_kv_store(const engine_kv_view *kv, int32_t pos, const float *k, const float *v) {
    int stride = kv->n_head_kv * kv->head_dim;
    size_t off = (size_t)(pos % kv->block_size) * stride;
    if (kv->type == ENGINE_KV_Q8_0) {
        size_t rb = (size_t)stride / ENGINE_QK8_0 * sizeof(engine_block_q8_0);
        size_t boff = (size_t)(pos % kv->block_size) * rb;
        engine_quantize_row(ENGINE_TYPE_Q8_0, k,
                            (uint8_t *)kv->k_blocks[pos / kv->block_size] + boff, stride);
        engine_quantize_row(ENGINE_TYPE_Q8_0, v,
                            (uint8_t *)kv->v_blocks[pos / kv->block_size] + boff, stride);
    } else if (kv->type == ENGINE_KV_F32) {
        memcpy((float *)kv->k_blocks[pos / kv->block_size] + off, k, sizeof(float) * stride);
        memcpy((float *)kv->v_blocks[pos / kv->block_size] + off, v, sizeof(float) * stride);
    } else {
        uint16_t *kd = (uint16_t *)kv->k_blocks[pos / kv->block_size] + off;
        uint16_t *vd = (uint16_t *)kv->v_blocks[pos / kv->block_size] + off;
        for (int i = 0; i < stride; i++) {
            kd[i] = engine_fp32_to_fp16(k[i]);
            vd[i] = engine_fp32_to_fp16(v[i]);
        }
    }
}

/* One head's row of K or V at `pos` as F32: in place for an F32 cache, else converted into buf. */
static inline const float *kv_head_row(const engine_kv_view *kv, void *const *blocks, int32_t pos,
                                       int kv_head, float *buf) {
    int d = kv->head_dim, stride = kv->n_head_kv * d;
    if (kv->type == ENGINE_KV_F32)
        return (const float *)kv_row(blocks, kv->block_size, pos, sizeof(float) * stride) +
               (size_t)kv_head * d;
    const uint16_t *h = (const uint16_t *)kv_row(blocks, kv->block_size, pos,
                                                 sizeof(uint16_t) * stride) + (size_t)kv_head * d;
    for (int i = 0; i < d; i++) buf[i] = f16_table[h[i]];
    return buf;
}

/* Dot product with four partial sums (vectorisable without -ffast-math). */
static inline float dot(const float *a, const float *b, int n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* Q8_0 KV: per query head, q is quantised once; the scores of a block's rows come from one
 * integer mat-vec over the block (rows of the same head are row_bytes apart); V rows are
 * dequantised block by block into the weighted sums (w * scale folded once per block). */
static void attention_group_q8(float *out, const float *q, int n_q, const engine_kv_view *kv,
                               int kv_head, int32_t n_pos, float scale, float *scores) {
    enum { QBUF = ENGINE_CPU_MAX_HEAD_DIM / ENGINE_QK8_0 };
    int d = kv->head_dim, nbh = d / ENGINE_QK8_0, bs = kv->block_size;
    size_t bq = sizeof(engine_block_q8_0);
    size_t rb = (size_t)kv->n_head_kv * (size_t)nbh * bq, hoff = (size_t)kv_head * nbh * bq;
    engine_block_q8_0 qq[QBUF];
    for (int h = 0; h < n_q; h++) {
        float *sc = scores + (size_t)h * n_pos;
        engine_quantize_row(ENGINE_TYPE_Q8_0, q + (size_t)h * d, qq, d);
        for (int32_t p0 = 0; p0 < n_pos; p0 += bs) {
            int32_t n = n_pos - p0 < bs ? n_pos - p0 : bs;
            const uint8_t *base = (const uint8_t *)kv->k_blocks[p0 / bs] + hoff;
            /* y is indexed by absolute row: row r of this block lands at sc[p0 + r] */
            engine_quant_matvec(ENGINE_TYPE_Q8_0, base, rb, d, 0, n, qq, sc + p0);
        }
        for (int32_t p = 0; p < n_pos; p++) sc[p] *= scale;
        engine_cpu_softmax(sc, n_pos);
        for (int i = 0; i < d; i++) out[(size_t)h * d + i] = 0.0f;
    }
    for (int32_t p = 0; p < n_pos; p++) {
        const engine_block_q8_0 *vb =
            (const engine_block_q8_0 *)((const uint8_t *)kv->v_blocks[p / bs] +
                                        (size_t)(p % bs) * rb + hoff);
        for (int j = 0; j < nbh; j++) {
            float dv = f16_table[vb[j].d];
            const int8_t *qs = vb[j].qs;
            for (int h = 0; h < n_q; h++) {
                float w = scores[(size_t)h * n_pos + p] * dv;
                float *o = out + (size_t)h * d + (size_t)j * ENGINE_QK8_0;
                for (int i = 0; i < ENGINE_QK8_0; i++) o[i] += w * (float)qs[i];
            }
        }
    }
}

void engine_cpu_attention_group(float *out, const float *q, int n_q, const engine_kv_view *kv,
                                int kv_head, int32_t n_pos, float scale, float *scores) {
    int d = kv->head_dim;
    float buf[ENGINE_CPU_MAX_HEAD_DIM];
    if (kv->type != ENGINE_KV_F32) pthread_once(&f16_once, f16_table_fill);
    if (kv->type == ENGINE_KV_Q8_0) {
        attention_group_q8(out, q, n_q, kv, kv_head, n_pos, scale, scores);
        return;
    }
    for (int32_t p = 0; p < n_pos; p++) {
        const float *k = kv_head_row(kv, kv->k_blocks, p, kv_head, buf);
        for (int h = 0; h < n_q; h++) scores[(size_t)h * n_pos + p] = dot(q + (size_t)h * d, k, d) * scale;
    }
    for (int h = 0; h < n_q; h++) {
        engine_cpu_softmax(scores + (size_t)h * n_pos, n_pos);
        for (int i = 0; i < d; i++) out[(size_t)h * d + i] = 0.0f;
    }
    for (int32_t p = 0; p < n_pos; p++) {
        const float *v = kv_head_row(kv, kv->v_blocks, p, kv_head, buf);
        for (int h = 0; h < n_q; h++) {
            float w = scores[(size_t)h * n_pos + p], *o = out + (size_t)h * d;
            for (int i = 0; i < d; i++) o[i] += w * v[i];
        }
    }
}

void engine_cpu_attention_head(float *out, const float *q, const engine_kv_view *kv,
                               int kv_head, int32_t n_pos, float scale, float *scores) {
    engine_cpu_attention_group(out, q, 1, kv, kv_head, n_pos, scale, scores);
}

void engine_cpu_moe_route(const float *logits, int n_expert, int k, int norm_topk,
                          int32_t *ids, float *weights, float *probs) {
    memcpy(probs, logits, sizeof(float) * (size_t)n_expert);
    engine_cpu_softmax(probs, n_expert);
    /* k is small (8 of 128): selection by repeated scan keeps ties in id order, as torch.topk
     * does on CPU for distinct values. */
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++) {
            bool taken = false;
            for (int t = 0; t < j; t++)
                if (ids[t] == e) taken = true;
            if (taken) continue;
            if (best < 0 || probs[e] > probs[best]) best = e;
        }
        ids[j] = best;
        weights[j] = probs[best];
    }
    if (norm_topk) {
        double s = 0.0;
        for (int j = 0; j < k; j++) s += weights[j];
        for (int j = 0; j < k; j++) weights[j] = (float)(weights[j] / s);
    }
}
