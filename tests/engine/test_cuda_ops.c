/* Every CUDA kernel against the CPU backend, on fresh random inputs of realistic sizes
 * (the Qwen3-30B-A3B shapes where it matters: hidden 2048, 32 q / 4 kv heads of 128).
 *
 * Error bounds (stated, not tuned to pass):
 *   matvec, each type: |y_gpu - y_exact| <= 1e-5 * sum_i |w_i xg_i| + 1e-6 + tie slack,
 *     y_exact the double dot product of the CPU's dequantised row (bit-exact with ggml) and xg:
 *     x itself for F32/F16/BF16 weights (the GPU keeps x in F32 there); for the quantised types
 *     x quantised as the CPU does for its dot products (Q8_K / Q8_0) and dequantised: the GPU
 *     stages the same int8 values (engine/cuda/qdot.cuh). Tie slack: sum of |w_i| * quantum_i
 *     over the values within 1e-3 of a rounding tie (the GPU's normalised x may differ in its
 *     last bit and round the other way). The errors of GPU and CPU against the F32-x product
 *     are reported and must stay under the quantisation bound (1% of sum |w_i x_i|); the GPU
 *     must also agree with the CPU's own dot product (engine_quant_matvec) to 2e-5 * sum
 *     |w_i xg_i| + tie slack.
 *   attention (q/k norm + RoPE + KV store + softmax(qK^T)V, split-K): |out - cpu| <= 2e-5 *
 *     (1 + max|v|); the stored K/V rows equal the CPU's bit for bit up to F32 rounding (1e-5).
 *     The sessions' launch (SPARK_CUDA_OP_ATT_SHORT=1 here: a block per query head below 256
 *     positions), also with SPARK_CUDA_OP_ATT_LONG=65536 (a block per query head and split at
 *     every length, the last of a head merging them), must give the per-KV-head launch's
 *     outputs and stored rows bit for bit (the same arithmetic in the same order).
 *   MoE block: same expert ids as engine_cpu_moe_route, weights within 1e-6, output within
 *     1e-4 * (1 + sum of |terms|) of a double reference (for the quantised types on x and h
 *     quantised as the CPU does, as for matvec; a tie flip there moves the output by ~1e-5 of
 *     the bound's scale, well inside it).
 *   MoE block in one launch (engine/cuda/moe_fused.cuh) against the unfused up + down launches
 *     on the same inputs: |y_fused - y_unfused| <= 1e-5 * max |y| (the same h, staged to the
 *     same 8-bit values; only the F32 order of the down sums differs), the CPU's routing, and a
 *     second launch bit for bit (fixed reduction order; its counters back at zero), as are the
 *     launches with the down items preloaded (SPARK_CUDA_MOE_FUSED_PRE) and with the reduction
 *     by row class (SPARK_CUDA_MOE_FUSED_RED), for the
 *     30B-A3B expert shape with Q4_K / Q6_K / Q8_0 downs, slices of 32 and 64, with and without
 *     the router fusion; a gate/up and down pair it has no instance for is refused.
 *   sampling: greedy = the CPU's argmax with ties to the lower id; temperature draws follow
 *     softmax(l / T) (chi-square style check, 3000 draws; 300 with the argument "quick", for
 *     compute-sanitizer).
 * The matvec and MoE cases run twice: as the stage-4 launches, and with SPARK_CUDA_OP_BPS=1 (the
 * decode stage-5 options of engine/cuda/matvec.cuh and moe.cuh: looping blocks, first weight
 * chunks preloaded into registers, the down kernel routing before its wait). The matvec cases
 * include a launch of two matrices, 8192 + 64 rows of 2048 (SPARK_CUDA_OP_SPLIT=8192 with
 * engine_cu_mv.r3: three-row groups in one wave, each matrix's last group partial). The ring
 * form of the heads (SPARK_CUDA_OP_RING) equals the plan's launch bit for bit (the argument
 * "ring": those cases alone, for compute-sanitizer).
 * Exits 77 (skip) with the reason when no GPU is usable or the build has no CUDA backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#ifndef SPARK_HAVE_CUDA
int main(void) {
    printf("skip: this build has no CUDA backend\n");
    return 77;
}
#else
#include "cpu/cpu.h"
#include "cpu/quant.h"
#include "cuda/cuda_backend.h"
#include "sample/spec.h"
#include "test_cuda_check.h"

static uint64_t rng_state = 0x1234567887654321ull;

static float frand(void) { return support_frand(&rng_state); }

static void fill(float *a, size_t n, float scale) {
    for (size_t i = 0; i < n; i++)
        a[i] = frand() * scale;
}

/* The weight types whose activations the GPU quantises to 8 bits (engine/cuda/qdot.cuh). */
static bool gpu_q8(engine_type t) {
    return t == ENGINE_TYPE_Q4_K || t == ENGINE_TYPE_Q5_K || t == ENGINE_TYPE_Q6_K ||
           t == ENGINE_TYPE_Q8_0 || t == ENGINE_TYPE_Q4_0;
}

/* The activations the GPU uses against weights of type t: for the quantised types x
 * quantised to the CPU's vec_dot type (Q8_K or Q8_0) and dequantised, as the GPU stages it;
 * else x. tie[i] (may be NULL): the value's quantum where x[i] * (the block's inverse scale)
 * lies within 1e-3 of a rounding tie (the GPU's normalised x may differ in its last bit and
 * round the other way), else 0. */
static void gpu_xhat(engine_type t, const float *x, int n, float *xhat, float *tie) {
    if (tie) memset(tie, 0, sizeof(float) * (size_t)n);
    if (!gpu_q8(t)) {
        memmove(xhat, x, sizeof(float) * (size_t)n);
        return;
    }
    engine_type vt = engine_type_traits_get(t)->vec_dot_type;
    const int bs = vt == ENGINE_TYPE_Q8_K ? 256 : 32;
    for (int b = 0; tie && b < n; b += bs) {
        float am = 0.0f;
        for (int i = b; i < b + bs; i++)
            am = fmaxf(am, fabsf(x[i]));
        const float is = am > 0.0f ? 127.0f / am : 0.0f;
        for (int i = b; i < b + bs; i++) {
            const float v = x[i] * is;
            tie[i] = fabsf(fabsf(v - rintf(v)) - 0.5f) < 1e-3f ? am / 127.0f : 0.0f;
        }
    }
    void *buf = malloc(engine_type_row_size(vt, n));
    engine_quantize_row(vt, x, buf, n);
    engine_dequantize_row(vt, buf, xhat, n);
    free(buf);
}

/* Random F32 rows quantised to `t`: rows * row_bytes bytes (caller frees). */
static void *make_weights(engine_type t, int64_t rows, int64_t cols, size_t *row_bytes) {
    *row_bytes = engine_type_row_size(t, cols);
    uint8_t *w = malloc((size_t)rows * *row_bytes);
    float *tmp = malloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        fill(tmp, (size_t)cols, 1.0f / sqrtf((float)cols) * 1.7f);
        engine_quantize_row(t, tmp, w + (size_t)r * *row_bytes, cols);
    }
    free(tmp);
    return w;
}

static void test_matvec_type(engine_type t, int64_t rows, int64_t cols, bool norm, bool acc) {
    size_t rb;
    uint8_t *w = make_weights(t, rows, cols, &rb);
    float *x = malloc(sizeof(float) * cols), *xn = malloc(sizeof(float) * cols);
    float *nw = malloc(sizeof(float) * cols), *row = malloc(sizeof(float) * cols);
    float *y = malloc(sizeof(float) * rows), *y0 = malloc(sizeof(float) * rows);
    float *ycpu = malloc(sizeof(float) * rows);
    fill(x, cols, 2.0f);
    for (int64_t i = 0; i < cols; i++)
        nw[i] = 0.75f + 0.5f * (frand() + 1.0f) * 0.5f;
    fill(y0, rows, 1.0f);
    memcpy(y, y0, sizeof(float) * rows);
    if (norm)
        engine_cpu_rmsnorm(xn, x, nw, (int)cols, 1e-6f);
    else
        memcpy(xn, x, sizeof(float) * cols);
    int rc = engine_cuda_op_matvec(t, w, rows, cols, rb, x, norm ? nw : NULL, 1e-6f, acc, y);
    CHECK(rc == 0, "matvec %s", engine_type_name(t));
    /* the CPU path: x converted to the vec_dot type */
    engine_type vt = engine_type_traits_get(t)->vec_dot_type;
    void *xc = malloc(engine_type_row_size(vt, cols) + 64);
    if (vt == ENGINE_TYPE_F32)
        memcpy(xc, xn, sizeof(float) * cols);
    else
        engine_quantize_row(vt, xn, xc, cols);
    engine_quant_matvec(t, w, rb, (int)cols, 0, (int)rows, xc, ycpu);
    /* the GPU's activations */
    float *xg = malloc(sizeof(float) * cols), *tie = malloc(sizeof(float) * cols);
    gpu_xhat(t, xn, (int)cols, xg, tie);
    double worst = 0, worst_cpu = 0, worst_q = 0;
    for (int64_t r = 0; rc == 0 && r < rows; r++) {
        engine_dequantize_row(t, w + (size_t)r * rb, row, cols);
        double s = 0, mag = 0, sx = 0, magx = 0, slack = 0;
        for (int64_t i = 0; i < cols; i++) {
            s += (double)row[i] * xg[i];
            mag += fabs((double)row[i] * xg[i]);
            sx += (double)row[i] * xn[i];
            magx += fabs((double)row[i] * xn[i]);
            slack += fabs((double)row[i]) * tie[i];
        }
        double ref = s + (acc ? y0[r] : 0.0);
        double err = fabs(y[r] - ref) / (mag + 1e-6);
        double err_cpu = fabs(ycpu[r] - sx) / (magx + 1e-6);
        double err_q = fabs(y[r] - (acc ? y0[r] : 0.0) - sx) / (magx + 1e-6);
        if (err > worst) worst = err;
        if (err_cpu > worst_cpu) worst_cpu = err_cpu;
        if (err_q > worst_q) worst_q = err_q;
        if (fabs(y[r] - ref) > 1e-5 * mag + 1e-6 + slack + (acc ? 1e-6 * fabs(y0[r]) : 0)) {
            CHECK(0, "%s row %lld: gpu %.9g exact %.9g (sum|wx| %.3g, tie slack %.3g)",
                  engine_type_name(t), (long long)r, y[r], ref, mag, slack);
            break;
        }
        if (fabs(y[r] - (acc ? y0[r] : 0.0) - ycpu[r]) > 2e-5 * mag + 1e-6 + slack) {
            CHECK(0, "%s row %lld: gpu %.9g cpu %.9g (sum|wx| %.3g, tie slack %.3g)",
                  engine_type_name(t), (long long)r, y[r] - (acc ? y0[r] : 0.0), ycpu[r], mag,
                  slack);
            break;
        }
    }
    CHECK(worst_cpu < 1e-2, "%s: the CPU's activation quantisation error %.3g", engine_type_name(t),
          worst_cpu);
    CHECK(worst_q < 1e-2, "%s: the GPU's activation quantisation error %.3g", engine_type_name(t),
          worst_q);
    printf("matvec %-5s %5lld x %-5lld%s%s: worst |gpu-ref|/sum|w xg| = %.2e; vs F32 x: gpu %.2e, "
           "cpu %.2e\n",
           engine_type_name(t), (long long)rows, (long long)cols, norm ? " +norm" : "",
           acc ? " +acc" : "", worst, worst_q, worst_cpu);
    free(xg);
    free(tie);
    free(w);
    free(x);
    free(xn);
    free(nw);
    free(row);
    free(y);
    free(y0);
    free(ycpu);
    free(xc);
}

/* A bitwise A/B of the matvec op: random weights of type t (rows x cols) against x (with the
 * norm weights nw, or none), run as the environment says into y, then again with var=val set
 * into yr. Returns the rows whose bits differ (the first in *first), with both launches' codes
 * in rc[2]; the caller frees *w, *y, *yr. */
static int64_t matvec_ab(engine_type t, int64_t rows, int64_t cols, bool norm, const char *var,
                         const char *val, int rc[2], int64_t *first, float **y, float **yr) {
    size_t rb;
    uint8_t *w = make_weights(t, rows, cols, &rb);
    float *x = malloc(sizeof(float) * cols), *nw = malloc(sizeof(float) * cols);
    *y = malloc(sizeof(float) * rows);
    *yr = malloc(sizeof(float) * rows);
    fill(x, cols, 2.0f);
    for (int64_t i = 0; i < cols; i++)
        nw[i] = 0.75f + 0.25f * (frand() + 1.0f);
    rc[0] = engine_cuda_op_matvec(t, w, rows, cols, rb, x, norm ? nw : NULL, 1e-6f, false, *y);
    setenv(var, val, 1);
    rc[1] = engine_cuda_op_matvec(t, w, rows, cols, rb, x, norm ? nw : NULL, 1e-6f, false, *yr);
    unsetenv(var);
    int64_t diff = 0;
    *first = -1;
    for (int64_t r = 0; rc[0] == 0 && rc[1] == 0 && r < rows; r++)
        if (memcmp(&(*y)[r], &(*yr)[r], sizeof(float)) != 0) {
            if (*first < 0) *first = r;
            diff++;
        }
    free(w);
    free(x);
    free(nw);
    return diff;
}

/* The output head's repacked copy (SPARK_CUDA_OP_Q6R: engine/cuda/dequant.cuh Q6_KR): the
 * same sums as the Q6_K rows it was made from, bit for bit, for rows of whole groups of eight
 * superblocks, a partial last group, and rows shorter than one group (padded to 16 bytes). */
static void test_head_repack_case(int64_t rows, int64_t cols, bool norm, const char *mode) {
    int rc[2];
    int64_t first;
    float *y, *yr;
    const int64_t diff = matvec_ab(ENGINE_TYPE_Q6_K, rows, cols, norm, "SPARK_CUDA_OP_Q6R", mode,
                                   rc, &first, &y, &yr);
    CHECK(rc[0] == 0 && rc[1] == 0, "matvec Q6_K / repacked %lld x %lld", (long long)rows,
          (long long)cols);
    CHECK(diff == 0,
          "repacked head %lld x %lld: %lld rows differ from Q6_K (first %lld: %.9g vs %.9g)",
          (long long)rows, (long long)cols, (long long)diff, (long long)first,
          first >= 0 ? y[first] : 0.0, first >= 0 ? yr[first] : 0.0);
    printf("matvec Q6_K repacked (%s) %5lld x %-5lld%s: %lld of %lld rows differ from Q6_K\n",
           mode[0] == '4' ? "4 rows a warp" : "plan's rows", (long long)rows, (long long)cols,
           norm ? " +norm" : "", (long long)diff, (long long)rows);
    free(y);
    free(yr);
}

/* The ring form (SPARK_CUDA_OP_RING: engine_cu_mv.ring, the sessions' head launch): every row
 * bit for bit the plan's launch, for the head's repacked copy and the quantised types a head
 * can have, with a partial last tile; skipped, and said, where the device cannot take it. */
static void test_matvec_ring(void) {
    static const engine_type types[] = {ENGINE_TYPE_Q6_K, ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q4_K,
                                        ENGINE_TYPE_Q5_K, ENGINE_TYPE_Q4_0};
    const int64_t rows = 20011, cols = 2048; /* enough tiles for 312 multiprocessors */
    for (int kk = 0; kk < 18; kk++) {
        const int k = kk % 6;
        const char *form = kk < 6 ? "1" : kk < 12 ? "2" : "3"; /* SPARK_CUDA_OP_RING */
        const engine_type t = k < 5 ? types[k] : ENGINE_TYPE_Q6_K;
        const char *q6r = k == 5 ? "4" : NULL; /* the repacked copy, as the heads read it */
        if (q6r) setenv("SPARK_CUDA_OP_Q6R", q6r, 1);
        int rc[2];
        int64_t first;
        float *y, *yr;
        const int64_t diff =
            matvec_ab(t, rows, cols, true, "SPARK_CUDA_OP_RING", form, rc, &first, &y, &yr);
        unsetenv("SPARK_CUDA_OP_Q6R");
        const char *name = q6r ? "Q6_K repacked" : engine_type_name(t);
        if (rc[0] == 0 && rc[1] == ENGINE_EUNSUPPORTED) {
            printf("SKIP matvec ring form %s %s: %s\n", form, name, engine_error_last());
        } else {
            CHECK(rc[0] == 0 && rc[1] == 0, "matvec %s / ring form %s %lld x %lld", name, form,
                  (long long)rows, (long long)cols);
            CHECK(diff == 0, "ring form %s %s: %lld of %lld rows differ (first %lld: %.9g vs %.9g)",
                  form, name, (long long)diff, (long long)rows, (long long)first,
                  first >= 0 ? y[first] : 0.0, first >= 0 ? yr[first] : 0.0);
            printf("matvec ring form %s %-13s %lld x %lld +norm: %lld rows differ from the plan's "
                   "launch\n",
                   form, name, (long long)rows, (long long)cols, (long long)diff);
        }
        free(y);
        free(yr);
    }
}

static void test_head_repack(void) {
    /* "1": the plan's one or two rows a warp; "4": four (the sessions' default) */
    static const char *const modes[] = {"1", "4"};
    for (int k = 0; k < 2; k++) {
        test_head_repack_case(4099, 2048, true, modes[k]); /* whole groups (Qwen3 / 3.5 heads) */
        test_head_repack_case(3001, 4096, true, modes[k]);
        test_head_repack_case(2050, 2560, true, modes[k]); /* a group and one of 2 superblocks */
        test_head_repack_case(5003, 256, true, modes[k]);  /* tiny: one superblock, padded rows */
        test_head_repack_case(1027, 1024, false, modes[k]);
    }
    /* and against the CPU as every matvec */
    setenv("SPARK_CUDA_OP_Q6R", "1", 1);
    printf("with SPARK_CUDA_OP_Q6R=1:\n");
    test_matvec_type(ENGINE_TYPE_Q6_K, 4099, 2048, true, false);
    test_matvec_type(ENGINE_TYPE_Q6_K, 2049 - 1 + 3, 768 + 256, true, false);
    /* other types have no repacked form: refused */
    size_t rb;
    uint8_t *w = make_weights(ENGINE_TYPE_Q4_K, 8, 256, &rb);
    float x[256], y[8];
    fill(x, 256, 1.0f);
    CHECK(engine_cuda_op_matvec(ENGINE_TYPE_Q4_K, w, 8, 256, rb, x, NULL, 1e-6f, false, y) ==
              ENGINE_EINVAL,
          "SPARK_CUDA_OP_Q6R with Q4_K is refused");
    free(w);
    unsetenv("SPARK_CUDA_OP_Q6R");
}

static void test_matvec(void) {
    const engine_type types[] = {ENGINE_TYPE_Q4_K, ENGINE_TYPE_Q5_K, ENGINE_TYPE_Q6_K,
                                 ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q4_0, ENGINE_TYPE_F16,
                                 ENGINE_TYPE_BF16, ENGINE_TYPE_F32};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        test_matvec_type(types[i], 1024, 2048, false, false);
        test_matvec_type(types[i], 2049 - 1 + 3, 768 + 256, true, false); /* odd row count */
    }
    test_matvec_type(ENGINE_TYPE_Q4_K, 2048, 4096, false, true); /* wo: += residual */
    test_matvec_type(ENGINE_TYPE_Q6_K, 4099, 2048, true, false); /* head-like */
    /* two matrices whose two-row groups need more than one wave (qwen35moe's DeltaNet
     * in-projection: [q|k|v] 8192 rows, [beta|alpha] 64): three-row groups in one wave
     * (engine_cu_mv.r3), the last group of each matrix partial */
    setenv("SPARK_CUDA_OP_SPLIT", "8192", 1);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (types[i] == ENGINE_TYPE_Q4_K || types[i] == ENGINE_TYPE_Q5_K ||
            types[i] == ENGINE_TYPE_Q6_K || types[i] == ENGINE_TYPE_Q8_0)
            test_matvec_type(types[i], 8192 + 64, 2048, true, false);
    unsetenv("SPARK_CUDA_OP_SPLIT");
}

/* ------------------------------------------------------------------------------------------ */

static void test_attention_case(int n_head, int n_kv, int hd, int32_t pos, engine_kv_type kvt) {
    const int32_t n_ctx = pos + 37;
    size_t kv_dim = (size_t)n_kv * hd, elt = kvt == ENGINE_KV_F32 ? 4 : 2;
    float *q = malloc(sizeof(float) * n_head * hd), *k = malloc(sizeof(float) * kv_dim);
    float *v = malloc(sizeof(float) * kv_dim), *qw = malloc(sizeof(float) * hd);
    float *kw = malloc(sizeof(float) * hd), *inv = malloc(sizeof(float) * hd / 2);
    float *out = malloc(sizeof(float) * n_head * hd), *ref = malloc(sizeof(float) * n_head * hd);
    float *krow = malloc(sizeof(float) * kv_dim), *vrow = malloc(sizeof(float) * kv_dim);
    float *scores = malloc(sizeof(float) * n_ctx);
    float *out_s = malloc(sizeof(float) * n_head * hd), *krow_s = malloc(sizeof(float) * kv_dim);
    float *vrow_s = malloc(sizeof(float) * kv_dim);
    uint8_t *kc = malloc((size_t)n_ctx * kv_dim * elt), *vc = malloc((size_t)n_ctx * kv_dim * elt);
    float *tmp = malloc(sizeof(float) * kv_dim), *tmp2 = malloc(sizeof(float) * kv_dim);
    fill(q, (size_t)n_head * hd, 3.0f);
    fill(k, kv_dim, 3.0f);
    fill(v, kv_dim, 2.0f);
    for (int i = 0; i < hd; i++) {
        qw[i] = 1.0f + 0.25f * frand();
        kw[i] = 1.0f + 0.25f * frand();
    }
    engine_cpu_rope_inv_freq(inv, hd, 1000000.0f);
    void *kb = kc, *vb = vc;
    engine_kv_view view = {&kb, &vb, n_ctx, kvt, n_kv, hd};
    /* earlier positions: keys of a realistic scale (normalised, |k| ~ sqrt(hd)) */
    for (int32_t p = 0; p < pos; p++) {
        fill(tmp, kv_dim, 1.7f);
        fill(tmp2, kv_dim, 2.0f);
        engine_cpu_kv_store(&view, p, tmp, tmp2);
    }
    int rc = engine_cuda_op_attention(n_head, n_kv, hd, pos, n_ctx, kvt, kc, vc, q, k, v, qw, kw,
                                      inv, 1e-6f, out, krow, vrow);
    CHECK(rc == 0, "attention");
    /* the same inputs through the sessions' SPARK_CUDA_ATT_SHORT launch (a block per query head
     * below 256 positions, the flat grid mapped to att_block's blocks above): the same outputs
     * and stored rows bit for bit */
    int rc_s = 0, n_out_diff = 0;
    /* variants: 1, and 2: also a block per (head, split) at every length
     * (SPARK_CUDA_OP_ATT_LONG) */
    for (int variant = 1; variant <= 2; variant++) {
        setenv("SPARK_CUDA_OP_ATT_SHORT", "1", 1);
        if (variant == 2) setenv("SPARK_CUDA_OP_ATT_LONG", "65536", 1);
        int rc1 = engine_cuda_op_attention(n_head, n_kv, hd, pos, n_ctx, kvt, kc, vc, q, k, v, qw,
                                           kw, inv, 1e-6f, out_s, krow_s, vrow_s);
        unsetenv("SPARK_CUDA_OP_ATT_SHORT");
        unsetenv("SPARK_CUDA_OP_ATT_LONG");
        CHECK(rc1 == 0, "attention (sessions' launch, variant %d)", variant);
        int nd = 0;
        for (int i = 0; rc1 == 0 && i < n_head * hd; i++)
            nd += memcmp(&out[i], &out_s[i], sizeof(float)) != 0;
        CHECK(nd == 0, "attention hd %d pos %d: variant %d output differs at %d of %d", hd, pos,
              variant, nd, n_head * hd);
        CHECK(rc1 != 0 || (memcmp(krow, krow_s, sizeof(float) * kv_dim) == 0 &&
                           memcmp(vrow, vrow_s, sizeof(float) * kv_dim) == 0),
              "attention hd %d pos %d: variant %d's stored K/V row differs", hd, pos, variant);
        rc_s |= rc1;
        n_out_diff += nd;
    }
    /* CPU: norms, rope, store, attention per head */
    for (int h = 0; h < n_head; h++)
        engine_cpu_rmsnorm(q + h * hd, q + h * hd, qw, hd, 1e-6f);
    for (int h = 0; h < n_kv; h++)
        engine_cpu_rmsnorm(k + h * hd, k + h * hd, kw, hd, 1e-6f);
    engine_cpu_rope_neox(q, n_head, hd, pos, inv);
    engine_cpu_rope_neox(k, n_kv, hd, pos, inv);
    /* the stored row: the CPU's values rounded to the cache type; an F16 value may round the
     * other way when GPU and CPU differ in the last F32 bit, so one F16 ulp is allowed */
    double worst = 0, worst_row = 0;
    for (size_t i = 0; rc == 0 && i < kv_dim; i++) {
        float ks = k[i], vs = v[i];
        double tol = 4e-5;
        if (kvt == ENGINE_KV_F16) {
            ks = engine_fp16_to_fp32(engine_fp32_to_fp16(ks));
            vs = engine_fp16_to_fp32(engine_fp32_to_fp16(vs));
            tol += fabs(ks) * 0x1.0p-10;
        }
        double e = fmax(fabs(krow[i] - ks), fabs(vrow[i] - vs));
        if (e > tol) CHECK(0, "stored K/V %zu: gpu %g/%g cpu %g/%g", i, krow[i], vrow[i], ks, vs);
        worst_row = fmax(worst_row, e);
    }
    /* attention itself over identical caches: the GPU's row for pos */
    engine_cpu_kv_store(&view, pos, krow, vrow);
    int group = n_head / n_kv;
    for (int h = 0; h < n_head; h++)
        engine_cpu_attention_head(ref + h * hd, q + h * hd, &view, h / group, pos + 1,
                                  1.0f / sqrtf((float)hd), scores);
    for (int i = 0; rc == 0 && i < n_head * hd; i++)
        worst = fmax(worst, fabs(out[i] - ref[i]));
    CHECK(worst <= 2e-5 * (1 + 2.0), "attention hd %d pos %d %s: worst |gpu - cpu| %.3g", hd, pos,
          kvt == ENGINE_KV_F32 ? "f32" : "f16", worst);
    printf("attention %2d/%d heads of %3d, pos %5d, kv %s: worst |gpu-cpu| = %.2e, K/V row %.2e; "
           "sessions' launch %s\n",
           n_head, n_kv, hd, pos, kvt == ENGINE_KV_F32 ? "f32" : "f16", worst, worst_row,
           rc_s == 0 && n_out_diff == 0 ? "identical, per-head long too" : "DIFFERS");
    free(q), free(k), free(v), free(qw), free(kw), free(inv), free(out), free(ref);
    free(krow), free(vrow), free(scores), free(kc), free(vc), free(tmp), free(tmp2);
    free(out_s), free(krow_s), free(vrow_s);
}

/* Each case also runs the short-context launch (positions < 256: a block per query head) and
 * checks it against the default bit for bit. */
static void test_attention(void) {
    test_attention_case(32, 4, 128, 0, ENGINE_KV_F32);
    test_attention_case(32, 4, 128, 1, ENGINE_KV_F16);
    test_attention_case(32, 4, 128, 17, ENGINE_KV_F32);
    test_attention_case(32, 4, 128, 100, ENGINE_KV_F16);
    test_attention_case(32, 4, 128, 200, ENGINE_KV_F16);
    test_attention_case(32, 4, 128, 255, ENGINE_KV_F32);  /* split boundary: 256 positions */
    test_attention_case(32, 4, 128, 255, ENGINE_KV_F16);
    test_attention_case(32, 4, 128, 256, ENGINE_KV_F32);  /* the new one opens a split */
    test_attention_case(32, 4, 128, 1500, ENGINE_KV_F16); /* 6 splits merged */
    test_attention_case(4, 2, 64, 0, ENGINE_KV_F16);
    test_attention_case(4, 2, 64, 77, ENGINE_KV_F32);
    test_attention_case(4, 2, 64, 255, ENGINE_KV_F16);
    test_attention_case(8, 8, 256, 17, ENGINE_KV_F32);
    test_attention_case(8, 8, 256, 255, ENGINE_KV_F16);
    test_attention_case(8, 8, 256, 600, ENGINE_KV_F16);
    test_attention_case(16, 1, 128, 100, ENGINE_KV_F32);  /* 16 heads per KV head */
    test_attention_case(16, 1, 128, 300, ENGINE_KV_F16);  /* ... 2 passes */
    test_attention_case(12, 1, 64, 1, ENGINE_KV_F16);     /* 12 per KV head */
    test_attention_case(12, 1, 64, 254, ENGINE_KV_F32);
    test_attention_case(12, 1, 64, 520, ENGINE_KV_F32);   /* ... padded pass */
    test_attention_case(32, 4, 128, 4100, ENGINE_KV_F16); /* 17 splits merged */
}

/* ------------------------------------------------------------------------------------------ */

static void test_moe_type(engine_type t, int n_expert, int k, int n_embd, int n_ff) {
    size_t rbi = engine_type_row_size(t, n_embd), rbf = engine_type_row_size(t, n_ff);
    size_t rb;
    uint8_t *gate = make_weights(t, (int64_t)n_expert * n_ff, n_embd, &rb);
    uint8_t *up = make_weights(t, (int64_t)n_expert * n_ff, n_embd, &rb);
    uint8_t *down = make_weights(t, (int64_t)n_expert * n_embd, n_ff, &rb);
    float *router = malloc(sizeof(float) * n_expert), *probs = malloc(sizeof(float) * n_expert);
    float *x = malloc(sizeof(float) * n_embd), *xg = malloc(sizeof(float) * n_embd);
    float *xn = malloc(sizeof(float) * n_embd), *nw = malloc(sizeof(float) * n_embd);
    float *row = malloc(sizeof(float) * (n_embd > n_ff ? n_embd : n_ff));
    double *h = malloc(sizeof(double) * n_ff), *ref = malloc(sizeof(double) * n_embd);
    double *mag = malloc(sizeof(double) * n_embd);
    int32_t ids[16], gids[16];
    float wts[16], gw[16];
    fill(router, n_expert, 3.0f);
    fill(x, n_embd, 1.5f);
    for (int i = 0; i < n_embd; i++)
        nw[i] = 1.0f + 0.2f * frand();
    memcpy(xg, x, sizeof(float) * n_embd);
    int rc = engine_cuda_op_moe(t, n_expert, k, true, n_embd, n_ff, router, gate, up, down, rbi,
                                rbf, nw, 1e-6f, xg, gids, gw);
    CHECK(rc == 0, "moe %s", engine_type_name(t));
    engine_cpu_moe_route(router, n_expert, k, 1, ids, wts, probs);
    engine_cpu_rmsnorm(xn, x, nw, n_embd, 1e-6f);
    const bool q8 = gpu_q8(t);
    float *hf = malloc(sizeof(float) * n_ff);
    if (q8) gpu_xhat(t, xn, n_embd, xn, NULL); /* the GPU's 8-bit x */
    for (int i = 0; i < n_embd; i++) {
        ref[i] = x[i];
        mag[i] = fabs(x[i]);
    }
    for (int j = 0; j < k; j++) {
        int e = ids[j];
        for (int r = 0; r < n_ff; r++) {
            double g = 0, u = 0;
            engine_dequantize_row(t, gate + ((size_t)e * n_ff + r) * rbi, row, n_embd);
            for (int i = 0; i < n_embd; i++)
                g += (double)row[i] * xn[i];
            engine_dequantize_row(t, up + ((size_t)e * n_ff + r) * rbi, row, n_embd);
            for (int i = 0; i < n_embd; i++)
                u += (double)row[i] * xn[i];
            h[r] = g / (1.0 + exp(-g)) * u;
        }
        if (q8) { /* the GPU's 8-bit h */
            for (int r = 0; r < n_ff; r++)
                hf[r] = (float)h[r];
            gpu_xhat(t, hf, n_ff, hf, NULL);
            for (int r = 0; r < n_ff; r++)
                h[r] = hf[r];
        }
        for (int r = 0; r < n_embd; r++) {
            engine_dequantize_row(t, down + ((size_t)e * n_embd + r) * rbf, row, n_ff);
            double s = 0, m = 0;
            for (int i = 0; i < n_ff; i++) {
                s += row[i] * h[i];
                m += fabs(row[i] * h[i]);
            }
            ref[r] += wts[j] * s;
            mag[r] += wts[j] * m;
        }
    }
    for (int j = 0; rc == 0 && j < k; j++) {
        CHECK(gids[j] == ids[j], "moe slot %d: expert %d, cpu %d", j, gids[j], ids[j]);
        CHECK(fabsf(gw[j] - wts[j]) <= 1e-6f, "moe slot %d: weight %.9g, cpu %.9g", j, gw[j],
              wts[j]);
    }
    double worst = 0;
    for (int r = 0; rc == 0 && r < n_embd; r++) {
        double e = fabs(xg[r] - ref[r]) / (1 + mag[r]);
        if (e > worst) worst = e;
    }
    CHECK(worst <= 1e-4, "moe %s: worst error %.3g", engine_type_name(t), worst);
    printf("moe %-5s %d experts (%d used), %d -> %d: worst |gpu-exact|/(1+sum|terms|) = %.2e\n",
           engine_type_name(t), n_expert, k, n_embd, n_ff, worst);
    free(gate), free(up), free(down), free(router), free(probs), free(x), free(xg), free(xn);
    free(nw), free(row), free(h), free(ref), free(mag), free(hf);
}

/* The routing warp's two top-k forms (engine/cuda/moe_dev.cuh: the warp reductions' route, the
 * default; the shuffles' (SPARK_CUDA_ROUTE=shfl)) on random logits, on logits with many exact
 * ties, and with a few -inf and NaN among them (fewer than n - k, where the forms are defined
 * alike): the same ids and weights bit for bit; on the random logits also the CPU's ids,
 * weights within 1e-6. */
static void test_route(void) {
    static const int ns[] = {8, 60, 128, 256}, ks[] = {1, 2, 8};
    static const int flags[2] = {0, 1};
    float *l = malloc(sizeof(float) * 256), *probs = malloc(sizeof(float) * 256);
    int cases = 0;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++)
            for (int c = 0; c < 3; c++)
                for (int norm = 0; norm < 2; norm++) {
                    const int n = ns[a], k = ks[b];
                    if (k > n) continue;
                    for (int i = 0; i < n; i++)
                        l[i] = c == 0 ? 3.0f * frand() : 0.25f * (float)(int)(4.0f * frand());
                    if (c == 2 && n - k >= 4) {
                        l[1] = -INFINITY;
                        l[n - 1] = NAN;
                        l[n / 2] = -INFINITY;
                    }
                    int32_t ids[2][16];
                    float w[2][16];
                    int rc = 0;
                    for (int f = 0; f < 2 && !rc; f++)
                        rc = engine_cuda_op_route(l, n, k, norm, flags[f], ids[f], w[f]);
                    CHECK(rc == 0, "route n %d k %d: %s", n, k, engine_error_last());
                    if (rc) continue;
                    for (int f = 1; f < 2; f++)
                        CHECK(!memcmp(ids[f], ids[0], sizeof(int32_t) * k) &&
                                  !memcmp(w[f], w[0], sizeof(float) * k),
                              "route n %d k %d case %d norm %d: flags %d differ from the default "
                              "(slot 0: %d %.9g against %d %.9g)",
                              n, k, c, norm, flags[f], ids[f][0], w[f][0], ids[0][0], w[0][0]);
                    if (c == 0) {
                        int32_t ci[16];
                        float cw[16];
                        engine_cpu_moe_route(l, n, k, norm, ci, cw, probs);
                        for (int j = 0; j < k; j++)
                            CHECK(ci[j] == ids[0][j] && fabsf(cw[j] - w[0][j]) <= 1e-6f,
                                  "route n %d k %d slot %d: %d %.9g, cpu %d %.9g", n, k, j,
                                  ids[0][j], w[0][j], ci[j], cw[j]);
                    }
                    cases++;
                }
    printf("route: %d cases, the shuffles' top-k bit for bit the warp reductions'\n", cases);
    free(l);
    free(probs);
}

static void test_moe(void) {
    test_moe_type(ENGINE_TYPE_Q4_K, 16, 8, 2048, 768); /* the 30B-A3B expert shape */
    test_moe_type(ENGINE_TYPE_Q6_K, 32, 8, 512, 256);
    test_moe_type(ENGINE_TYPE_Q8_0, 16, 4, 512, 256);
    test_moe_type(ENGINE_TYPE_F16, 8, 2, 256, 256);
}

/* The MoE block in one launch (engine/cuda/moe_fused.cuh, SPARK_CUDA_MOE_FUSED) against the
 * unfused up + down launches on the same inputs (gate/up of type ut, down of dt; rf: the router
 * fusion's input x + x_add and raw logits): the two compute the same h, staged to the same 8-bit
 * values, and differ only by the F32 order of the down sums, so |y_fused - y_unfused| <= 1e-5 *
 * max |y|; the fused routing is the CPU's (without rf); a second launch gives y bit for bit (the
 * reduction's order is fixed; the op also checks that the counters are back at zero). */
static void test_moe_fused_case(engine_type ut, engine_type dt, int n_expert, int k, int n_embd,
                                int n_ff, bool rf, int slice) {
    size_t rbi, rbf;
    uint8_t *gate = make_weights(ut, (int64_t)n_expert * n_ff, n_embd, &rbi);
    uint8_t *up = make_weights(ut, (int64_t)n_expert * n_ff, n_embd, &rbi);
    uint8_t *down = make_weights(dt, (int64_t)n_expert * n_embd, n_ff, &rbf);
    float *router = malloc(sizeof(float) * n_expert), *probs = malloc(sizeof(float) * n_expert);
    float *x = malloc(sizeof(float) * n_embd), *xa = malloc(sizeof(float) * n_embd);
    float *nw = malloc(sizeof(float) * n_embd), *yref = malloc(sizeof(float) * n_embd);
    float *yf = malloc(sizeof(float) * 2 * n_embd), *yp = malloc(sizeof(float) * 2 * n_embd);
    float *yc = malloc(sizeof(float) * 2 * n_embd);
    int32_t gids[16], ids[16];
    float gw[16], wts[16];
    fill(router, n_expert, 3.0f);
    fill(x, n_embd, 1.5f);
    fill(xa, n_embd, 0.5f);
    for (int i = 0; i < n_embd; i++)
        nw[i] = 1.0f + 0.2f * frand();
    int rc = engine_cuda_op_moe_fused(ut, dt, n_expert, k, true, n_embd, n_ff, router, gate, up,
                                      down, rbi, rbf, nw, 1e-6f, x, rf ? xa : NULL, slice, 0, 2,
                                      yref, yf, gids, gw);
    if (rc == 0) /* the first down items preloaded: the same sums */
        rc = engine_cuda_op_moe_fused(ut, dt, n_expert, k, true, n_embd, n_ff, router, gate, up,
                                      down, rbi, rbf, nw, 1e-6f, x, rf ? xa : NULL, slice, 1, 2,
                                      yref, yp, gids, gw);
    if (rc == 0) /* the reduction by row class, with no wait: the same sums */
        rc = engine_cuda_op_moe_fused(ut, dt, n_expert, k, true, n_embd, n_ff, router, gate, up,
                                      down, rbi, rbf, nw, 1e-6f, x, rf ? xa : NULL, slice, 2, 2,
                                      yref, yc, gids, gw);
    CHECK(rc == 0, "moe fused %s/%s slice %d%s: %s", engine_type_name(ut), engine_type_name(dt),
          slice, rf ? " rf" : "", engine_error_last());
    if (rc == 0) {
        double mx = 0, worst = 0, moved = 0;
        for (int i = 0; i < n_embd; i++) {
            mx = fmax(mx, fabs(yref[i]));
            worst = fmax(worst, fabs((double)yf[i] - yref[i]));
            moved = fmax(moved, fabs((double)yref[i] - x[i] - (rf ? xa[i] : 0.0f)));
        }
        CHECK(moved > 1e-3 * mx, "moe fused: the reference left x unchanged (%.3g)", moved);
        CHECK(worst <= 1e-5 * mx,
              "moe fused %s/%s slice %d%s: max |fused - unfused| %.3g (max |y| %.3g)",
              engine_type_name(ut), engine_type_name(dt), slice, rf ? " rf" : "", worst, mx);
        CHECK(memcmp(yf, yf + n_embd, sizeof(float) * n_embd) == 0,
              "moe fused %s/%s slice %d%s: the second launch differs", engine_type_name(ut),
              engine_type_name(dt), slice, rf ? " rf" : "");
        CHECK(memcmp(yf, yp, sizeof(float) * 2 * n_embd) == 0,
              "moe fused %s/%s slice %d%s: with preload the outputs differ", engine_type_name(ut),
              engine_type_name(dt), slice, rf ? " rf" : "");
        CHECK(memcmp(yf, yc, sizeof(float) * 2 * n_embd) == 0,
              "moe fused %s/%s slice %d%s: with the class reduction the outputs differ",
              engine_type_name(ut), engine_type_name(dt), slice, rf ? " rf" : "");
        if (!rf) {
            engine_cpu_moe_route(router, n_expert, k, 1, ids, wts, probs);
            for (int j = 0; j < k; j++)
                CHECK(gids[j] == ids[j] && fabsf(gw[j] - wts[j]) <= 1e-6f,
                      "moe fused slot %d: expert %d weight %.9g, cpu %d %.9g", j, gids[j], gw[j],
                      ids[j], wts[j]);
        }
        printf("moe fused %-5s/%-5s %d experts (%d used), %d -> %d, slice %d%s: max |fused - "
               "unfused| = %.2e of max |y| %.3g; repeat, preload, class reduce bit for bit\n",
               engine_type_name(ut), engine_type_name(dt), n_expert, k, n_embd, n_ff, slice,
               rf ? ", router fusion" : "", worst / mx, mx);
    }
    /* The whole-grid forms (moe_fused.cuh grid 1, 2; quantised types, sm_90+), each also with
     * per-item barriers (items) and copy orders (pipe I, pipe_down D): the unfused pair's
     * arithmetic, so y bit for bit, in two launches each (the barrier's counters reset) */
    /* bits: 2 y read early (y_pre), 4 form 1's arrival before its down copies (arrive), 8 the
     * down runs merged per expert slot (dn_merge 1), 16 the down copies a lane each (lanes 1), 32
     * the down loop rolled and 64 the up loop rolled (roll 1, 2), 128 the instance of the types
     * alone (spec; with the router fusion, for Q4_K/Q6_K, Q4_K/Q4_K, Q8_0/Q8_0), 512 the block's
     * RMS scale with the router fusion (up.coop, as in the sessions: with 128 and every other
     * switch at the sessions' default, the instance of the form with them fixed) */
    static const int forms[][5] = {
        /* form, items, I, D, bits */
        {1, 0, 0, 0, 0},   {1, 1, 0, 0, 0},   {2, 0, 0, 0, 0},   {2, 1, 0, 0, 0},
        {2, 0, 1, 0, 0},   {2, 0, 1, 1, 0},   {2, 0, 1, 2, 0},   {2, 0, 2, 1, 0},
        {2, 1, 0, 2, 0},   {1, 0, 1, 0, 0},   {2, 0, 2, 2, 0},   {1, 1, 0, 0, 2},
        {1, 0, 2, 0, 2},   {2, 0, 1, 1, 2},   {1, 0, 1, 0, 2},   {1, 0, 1, 0, 6},
        {1, 1, 0, 0, 4},   {1, 0, 2, 0, 6},   {2, 0, 1, 1, 10},  {2, 0, 1, 2, 8},
        {2, 1, 0, 0, 8},   {1, 0, 1, 0, 14},  {1, 1, 0, 0, 12},  {2, 0, 1, 2, 26},
        {2, 0, 1, 1, 18},  {2, 0, 0, 0, 16},  {1, 0, 1, 0, 22},  {1, 0, 1, 0, 30},
        {2, 0, 1, 2, 58},  {2, 0, 1, 2, 122}, {2, 0, 1, 2, 90},  {1, 0, 1, 0, 38},
        {1, 0, 1, 0, 102}, {2, 0, 1, 2, 250}, {1, 0, 1, 0, 230}, {2, 0, 1, 2, 762},
        {1, 0, 1, 0, 742}};
    for (int fi = 0; rc == 0 && fi < (int)(sizeof forms / sizeof forms[0]) &&
                     engine_type_traits_get(ut)->block_size > 1;
         fi++) {
        const int form = forms[fi][0], items = forms[fi][1], pi = forms[fi][2], pd = forms[fi][3];
        const int bits = forms[fi][4];
        char pipe[120] = ""; /* the variant, in every line about this case */
        snprintf(pipe, sizeof pipe, "%s", items ? ", per-item barriers" : "");
        if (pi || pd)
            snprintf(pipe + strlen(pipe), sizeof pipe - strlen(pipe), ", copies %d,%d", pi, pd);
        if (bits & 2) snprintf(pipe + strlen(pipe), sizeof pipe - strlen(pipe), ", y read early");
        if (bits & 4) snprintf(pipe + strlen(pipe), sizeof pipe - strlen(pipe), ", arrival first");
        if (bits & 8) snprintf(pipe + strlen(pipe), sizeof pipe - strlen(pipe), ", down merged");
        if (bits & 16) snprintf(pipe + strlen(pipe), sizeof pipe - strlen(pipe), ", lanes");
        if (bits & 32) snprintf(pipe + strlen(pipe), sizeof pipe - strlen(pipe), ", down rolled");
        if (bits & 64) snprintf(pipe + strlen(pipe), sizeof pipe - strlen(pipe), ", up rolled");
        if (bits & 128) snprintf(pipe + strlen(pipe), sizeof pipe - strlen(pipe), ", types' own");
        if (bits & 512) snprintf(pipe + strlen(pipe), sizeof pipe - strlen(pipe), ", block scale");
        int rg = engine_cuda_op_moe_fused(ut, dt, n_expert, k, true, n_embd, n_ff, router, gate, up,
                                          down, rbi, rbf, nw, 1e-6f, x, rf ? xa : NULL, 0,
                                          form << 2 | items << 4 | pi << 5 | pd << 8 | bits << 10,
                                          2, yref, yf, gids, gw);
        if (rg == ENGINE_EUNSUPPORTED) { /* said, and only for what the device lacks */
            const char *why = engine_error_last();
            CHECK(strstr(why, "before sm_90") || strstr(why, "do not fit shared memory"),
                  "moe grid %s/%s form %d%s%s refused: %s", engine_type_name(ut),
                  engine_type_name(dt), form, pipe, rf ? " rf" : "", why);
            printf("moe grid %s/%s form %d%s: skipped (%s)\n", engine_type_name(ut),
                   engine_type_name(dt), form, pipe, why);
            continue;
        }
        CHECK(rg == 0, "moe grid %s/%s form %d%s%s: %s", engine_type_name(ut), engine_type_name(dt),
              form, pipe, rf ? " rf" : "", engine_error_last());
        if (rg) continue;
        CHECK(memcmp(yf, yref, sizeof(float) * n_embd) == 0 &&
                  memcmp(yf + n_embd, yref, sizeof(float) * n_embd) == 0,
              "moe grid %s/%s form %d%s%s: y differs from the unfused pair's", engine_type_name(ut),
              engine_type_name(dt), form, pipe, rf ? " rf" : "");
        printf("moe grid  %-5s/%-5s %d experts (%d used), %d -> %d, form %d%s%s: the unfused "
               "pair's y bit for bit, twice\n",
               engine_type_name(ut), engine_type_name(dt), n_expert, k, n_embd, n_ff, form, pipe,
               rf ? ", router fusion" : "");
    }
    free(gate), free(up), free(down), free(router), free(probs), free(x), free(xa), free(nw);
    free(yref), free(yf), free(yp), free(yc);
}

static void test_moe_fused(void) {
    /* the 30B-A3B expert shape with each down type of its Q4_K_M and Q8_0 files */
    test_moe_fused_case(ENGINE_TYPE_Q4_K, ENGINE_TYPE_Q4_K, 16, 8, 2048, 768, false, 32);
    test_moe_fused_case(ENGINE_TYPE_Q4_K, ENGINE_TYPE_Q6_K, 16, 8, 2048, 768, true, 32);
    test_moe_fused_case(ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q8_0, 16, 8, 2048, 768, false, 32);
    test_moe_fused_case(ENGINE_TYPE_Q4_K, ENGINE_TYPE_Q4_K, 16, 8, 2048, 768, true, 64);
    test_moe_fused_case(ENGINE_TYPE_Q4_K, ENGINE_TYPE_Q6_K, 16, 8, 2048, 768, false, 64);
    test_moe_fused_case(ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q8_0, 16, 8, 2048, 768, true, 64);
    /* 6 experts used: the whole-grid form's blocks do not divide its work evenly (on 132
     * multiprocessors: 288 up items, 3 a block, 96 blocks; 256 down groups, 3 a block, so the
     * 86th block has one and the last 10 none) */
    test_moe_fused_case(ENGINE_TYPE_Q4_K, ENGINE_TYPE_Q6_K, 16, 6, 2048, 768, true, 32);
    test_moe_fused_case(ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q8_0, 16, 6, 2048, 768, false, 64);
    /* the tiny model's shape, F32 and F16 (staged in F32) */
    test_moe_fused_case(ENGINE_TYPE_F32, ENGINE_TYPE_F32, 8, 2, 256, 256, true, 32);
    test_moe_fused_case(ENGINE_TYPE_F16, ENGINE_TYPE_F16, 8, 2, 256, 256, false, 64);
    /* gate/up and down staged differently: no fused instance, a clear error */
    size_t rb;
    uint8_t *w = make_weights(ENGINE_TYPE_Q8_0, 8 * 256, 256, &rb);
    float v[256], y[512];
    int32_t i2[2];
    float w2[2];
    for (int i = 0; i < 256; i++)
        v[i] = 1.0f;
    CHECK(engine_cuda_op_moe_fused(ENGINE_TYPE_Q4_K, ENGINE_TYPE_Q8_0, 8, 2, true, 256, 256, v, w,
                                   w, w, engine_type_row_size(ENGINE_TYPE_Q4_K, 256),
                                   engine_type_row_size(ENGINE_TYPE_Q8_0, 256), v, 1e-6f, v, NULL,
                                   32, 0, 1, y, y + 256, i2, w2) == ENGINE_EUNSUPPORTED,
          "moe fused: Q4_K gate/up with a Q8_0 down must be refused");
    free(w);
}

/* ------------------------------------------------------------------------------------------ */

/* Draws of the temperature check (fewer with the argument "quick", for compute-sanitizer). */
static int n_draws = 3000;
#define ENGINE_CUDA_TOPK_MAX_TEST 64 /* the truncated draw's top_k limit (sample.cuh) */

static void test_sample(void) {
    int n = 151936;
    float *l = malloc(sizeof(float) * n);
    fill(l, n, 10.0f);
    int best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    int32_t tok = -1;
    CHECK(engine_cuda_op_sample(l, n, 0.0f, 0, 0, &tok) == 0 && tok == best, "greedy %d, cpu %d",
          tok, best);
    if (best != n - 1) l[n - 1] = l[best]; /* ties with higher ids: the lower id wins */
    l[77] = l[best];
    CHECK(engine_cuda_op_sample(l, n, 0.0f, 0, 0, &tok) == 0 && tok == (best < 77 ? best : 77),
          "greedy tie %d", tok);
    l[5] = NAN;
    l[6] = INFINITY;
    CHECK(engine_cuda_op_sample(l, n, 0.0f, 0, 0, &tok) == 0 && tok == 6, "inf/NaN: %d", tok);
    /* temperature: 4 live tokens, the rest -inf; draws vs softmax(l / T) */
    for (int i = 0; i < n; i++)
        l[i] = -INFINITY;
    const int ids[4] = {3, 1000, 70000, 151935};
    const float lv[4] = {1.0f, 0.0f, 2.0f, 1.5f};
    for (int i = 0; i < 4; i++)
        l[ids[i]] = lv[i];
    const float T = 0.8f;
    double p[4], z = 0;
    for (int i = 0; i < 4; i++)
        z += p[i] = exp(lv[i] / T);
    int cnt[4] = {0}, other = 0, draws = n_draws;
    for (int d = 0; d < draws; d++) {
        CHECK(engine_cuda_op_sample(l, n, T, 42, d, &tok) == 0, "sample");
        int hit = 0;
        for (int i = 0; i < 4; i++)
            if (tok == ids[i]) cnt[i]++, hit = 1;
        other += !hit;
    }
    CHECK(other == 0, "%d draws of a -inf token", other);
    for (int i = 0; i < 4; i++) {
        double f = (double)cnt[i] / draws, want = p[i] / z;
        double sd = sqrt(want * (1 - want) / draws);
        CHECK(fabs(f - want) < 5 * sd, "token %d drawn %.4f, softmax %.4f", ids[i], f, want);
        printf("sample T=%.1f token %6d: %.4f (softmax %.4f)\n", T, ids[i], f, want);
    }
    int32_t a, b;
    CHECK(engine_cuda_op_sample(l, n, T, 9, 17, &a) == 0 &&
              engine_cuda_op_sample(l, n, T, 9, 17, &b) == 0 && a == b,
          "same seed, same draw");
    free(l);
}

/* The host sampler's draw with uniform u (engine/sample/sampler.c): its kept candidates
 * (engine_sampler_probs) in its order (logit descending, ties to the lower id), the first whose
 * running probability passes u. *gap: how near u lies to a boundary of that walk. */
static int32_t ref_draw(const float *l, const float *probs, int n, double u, double *gap) {
    int32_t ids[ENGINE_CUDA_TOPK_MAX_TEST];
    int m = 0;
    for (int i = 0; i < n && m < ENGINE_CUDA_TOPK_MAX_TEST; i++)
        if (probs[i] > 0.0f) ids[m++] = i;
    for (int i = 1; i < m; i++) /* insertion sort: m <= 64 */
        for (int j = i; j > 0 && (l[ids[j]] > l[ids[j - 1]] ||
                                  (l[ids[j]] == l[ids[j - 1]] && ids[j] < ids[j - 1]));
             j--) {
            const int32_t t = ids[j];
            ids[j] = ids[j - 1];
            ids[j - 1] = t;
        }
    double cum = 0.0;
    *gap = 1.0;
    int32_t pick = m ? ids[m - 1] : -1;
    for (int i = 0; i < m; i++) {
        cum += probs[ids[i]];
        *gap = fmin(*gap, fabs(u - cum));
        if (u < cum) {
            pick = ids[i];
            break;
        }
    }
    return pick;
}

/* The GPU's truncated draw (engine_cuda_stream's top_k path) against the host sampler's with
 * the same uniform: the same token, except where u lies within 1e-4 of a boundary (float
 * sums; counted, at most 1% of the draws), on logits that make each cut bite. algo: the
 * SPARK_CUDA_TOPK selection ("merge", the default, or "radix"). */
static void test_sample_topk(const char *algo) {
    setenv("SPARK_CUDA_TOPK", algo, 1);
    const int n = 151936;
    float *l = malloc(sizeof(float) * n), *probs = malloc(sizeof(float) * n);
    struct {
        const char *name;
        int kind; /* 0 flat, 1 peaked, 2 five finite + NaN */
        engine_cuda_sampling p;
    } cases[] = {
        {"flat, defaults", 0, {0.8f, 40, 0.95f, 0.05f, 1, NULL}},
        {"flat, k 64 top_p 0.9", 0, {1.0f, 64, 0.9f, 0.0f, 2, NULL}},
        {"peaked, defaults", 1, {0.8f, 40, 0.95f, 0.05f, 3, NULL}},
        {"peaked, k 20", 1, {1.0f, 20, 1.0f, 0.0f, 4, NULL}},
        {"peaked, k 64 top_p 0.5", 1, {1.3f, 64, 0.5f, 0.0f, 5, NULL}},
        {"peaked, min_p 0.2", 1, {0.7f, 50, 1.0f, 0.2f, 6, NULL}},
        {"peaked, k 1", 1, {1.0f, 1, 1.0f, 0.0f, 7, NULL}},
        {"five finite", 2, {1.0f, 20, 0.95f, 0.0f, 8, NULL}},
    };
    const int draws = n_draws / 10 > 30 ? n_draws / 10 : 30;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const engine_cuda_sampling *p = &cases[c].p;
        if (cases[c].kind == 2) {
            for (int i = 0; i < n; i++)
                l[i] = -INFINITY;
            const int ids[5] = {3, 1000, 70000, 120001, 151935};
            for (int i = 0; i < 5; i++)
                l[ids[i]] = 0.5f * (float)i;
            l[9] = NAN;
        } else {
            fill(l, (size_t)n, cases[c].kind == 0 ? 10.0f : 2.0f);
            if (cases[c].kind == 1) /* 48 ids well above the rest, spread over 6 logits */
                for (int i = 0; i < 48; i++)
                    l[(i * 7919 + 11) % n] = 4.0f + 0.75f * (float)(i % 8) + 0.01f * (float)i;
        }
        engine_sampling_params hp = ENGINE_SAMPLING_PARAMS_INIT;
        hp.temperature = p->temperature;
        hp.top_k = p->top_k;
        hp.top_p = p->top_p;
        hp.min_p = p->min_p;
        engine_sampler *smp = NULL;
        CHECK(engine_sampler_new(&smp, &hp, n) == 0 && engine_sampler_probs(smp, l, probs) == 0,
              "host sampler");
        engine_sampler_free(smp);
        int kept = 0;
        for (int i = 0; i < n; i++)
            kept += probs[i] > 0.0f;
        int same = 0, near = 0, far = 0;
        for (int d = 0; d < draws; d++) {
            int32_t tok = -1;
            double u = -1.0, gap = 1.0;
            if (engine_cuda_op_sample_topk(l, n, p, d, &tok, &u) != 0) {
                CHECK(0, "sample_topk: %s", engine_error_last());
                break;
            }
            const int32_t want = ref_draw(l, probs, n, u, &gap);
            if (tok == want)
                same++;
            else if (gap < 1e-4 && tok >= 0 && tok < n && probs[tok] > 0.0f)
                near++;
            else {
                far++;
                if (far <= 3)
                    printf("  %s draw %d: u %.6f gpu %d, host %d (gap %.2g)\n", cases[c].name, d, u,
                           tok, want, gap);
            }
        }
        CHECK(far == 0 && near * 100 <= draws,
              "top-k draw (%s), %s: %d of %d draws differ from the host sampler's (%d at a "
              "boundary)",
              algo, cases[c].name, far + near, draws, near);
        printf("sample top-k (%s) %-24s: %d kept, %d of %d draws == host sampler (%d at a "
               "boundary)\n",
               algo, cases[c].name, kept, same, draws, near);
    }
    unsetenv("SPARK_CUDA_TOPK");
    free(l);
    free(probs);
}

int main(int argc, char **argv) {
    if (engine_cuda_usable() != 0) {
        printf("skip: %s\n", engine_error_last());
        return 77;
    }
    if (argc > 1 && !strcmp(argv[1], "quick")) n_draws = 300;
    if (argc > 1 && !strcmp(argv[1], "ring")) { /* the ring form alone (compute-sanitizer) */
        test_matvec_ring();
        return support_finish("test_cuda_ops");
    }
    if (argc > 1 && !strcmp(argv[1], "sample")) { /* the samplers alone */
        test_sample();
        test_sample_topk("merge");
        test_sample_topk("radix");
        return support_finish("test_cuda_ops");
    }
    if (argc > 1 && !strcmp(argv[1], "moe")) { /* the MoE launches alone (compute-sanitizer) */
        test_moe_fused();
        return support_finish("test_cuda_ops");
    }
    test_matvec();
    test_head_repack();
    test_matvec_ring();
    test_attention();
    test_route();
    test_moe();
    test_moe_fused();
    test_sample();
    test_sample_topk("merge");
    test_sample_topk("radix");
    /* the decode stage-5 launches of sessions: few blocks looping over their rows, the MoE
     * down kernel routing before its wait (engine/cuda/moe.cuh) */
    printf("with SPARK_CUDA_OP_BPS=1:\n");
    setenv("SPARK_CUDA_OP_BPS", "1", 1);
    test_matvec();
    test_moe();
    unsetenv("SPARK_CUDA_OP_BPS");
    /* the sessions' default: weight rows bulk-copied into shared memory (matvec.cuh .tma) */
    printf("with SPARK_CUDA_OP_TMA=1:\n");
    setenv("SPARK_CUDA_OP_TMA", "1", 1);
    test_matvec();
    test_moe();
    unsetenv("SPARK_CUDA_OP_TMA");
    return support_finish("test_cuda_ops");
}
#endif
