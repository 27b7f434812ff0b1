/* The GPU prefill (engine/cuda/gemm.cu, prefill.cu) against the CPU backend.
 *
 * Error bounds (stated, not tuned to pass):
 *   GEMM, each type, several shapes (partial tiles in every dimension, rows of 96 values for
 *     the 32-blocked types: a zero-padded step): |y - y_exact| <= 1e-5 * sum_i |w_i xg_i| +
 *     1e-6 + tie slack, y_exact the double product of the CPU's dequantised row with xg, the
 *     activations the GPU uses: for the quantised types x quantised as the CPU quantises it
 *     for its dot products (Q8_K / Q8_0) and dequantised; for F16 / BF16 x rounded to the
 *     weight's type; for F32 x itself. Tie slack: sum of |w_i| * quantum_i over the values
 *     within 1e-3 of a rounding tie (the GPU's normalised x may differ in its last bit), and
 *     for Q8_0 activations sum of |w_i xg_i| 2^-10 over the blocks whose F16 scale is within
 *     2e-6 of a rounding tie (seen on the H200: a +norm row's block scale one F16 step off,
 *     the kernels bit-identical to each other and to a CPU emulation of the GPU's staging).
 *     Every kernel variant: 64- and 32-row tiles, dense and grouped (a tile list over groups
 *     of 1 to 70 rows, X gathered through a permutation, two weight matrices), three matrices
 *     in one launch, the staged cp.async kernels of every int8 type, the wide 8-warp tiles
 *     split-K and the first kernels (SPARK_CUDA_GEMM_OP);
 *     each variant but the first kernels, split-K and the int superblock order ("kint") bit
 *     for bit equal to the default on the same inputs (same order per element).
 *   Prefill of a 70-token prompt (chunks of 48 tokens: two chunks, attention tiles of 32),
 *     every token's next-token logits against the CPU session's, on the generated tiny models
 *     (qwen3moe "tiny" and dense "qwen3-tiny") in f32, q8_0 and q4_k_m, KV F32:
 *     f32: max |gpu - cpu| <= 1e-4 * (1 + max |logit|) at every position (the GPU keeps F32
 *       activations for F32 weights: summation order only);
 *     quantised: the same 8-bit activations as the CPU, so cosine >= 0.999 at every position
 *       of the dense model; in the MoE model a rounding difference can swap two near-tied
 *       experts, so at most 1 position in 10 below 0.999 and none below 0.9 (as
 *       test_cuda_forward's decode check).
 *   f32 models with an F16 KV cache: the prefill against the CPU with the same cache type,
 *     max |gpu - cpu| <= 5e-3 * (1 + max |logit|) (room for the
 *     default tensor-core attention, which rounds Q and the softmax weights to F16).
 *   Then 8 decode steps on the GPU after the prefill (the KV the prefill wrote) against the
 *     CPU with the same criteria, and against a GPU session that ran every token through the
 *     decode step (a control that tells a prefill KV fault from a decode fault); the prompt
 *     fed in two calls (30 + 40 tokens) and in one chunk give bit-identical logits (a token's
 *     results do not depend on the chunking); a session through engine.h (device cuda) gives
 *     the prefill's last logits bit for bit.
 *   The prefill's GEMM words that keep the arithmetic (SPARK_CUDA_PREFILL_GEMM: "wided", the
 *     8-warp tiles everywhere; "svec", the scales in fragment order, 4 blocks per SM;
 *     "direct", svec with Q4_K / Q5_K fragments read from the staged bytes; "pipe6", the
 *     staged kernels for Q6_K too; "nopipe8", the unstaged ones for Q8_0 / Q4_0) give the
 *     same logits bit for bit as the default (its Q4_K / Q5_K / Q6_K products in the int
 *     superblock order) or, with "nokint" (the F32 epilogue of every product), as "nokint"
 *     alone; "nokint", "nokintd" (the dense Q4_K / Q5_K products in the F32 epilogue) and
 *     "nokint6" (the Q6_K ones) against the CPU by the same criteria as the default.
 * Arguments: PRESET TYPE, one model only; "gemm [VARIANT...]", the GEMM op cases only, of the
 * named variants ("default" for the default kernels), for compute-sanitizer runs.
 * Exits 77 (skip) with the reason when no GPU is usable or the build has no CUDA backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
#include "test_cuda_check.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void) { return support_frand(&rng); }

static bool is_q8(engine_type t) {
    return t == ENGINE_TYPE_Q4_K || t == ENGINE_TYPE_Q5_K || t == ENGINE_TYPE_Q6_K ||
           t == ENGINE_TYPE_Q8_0 || t == ENGINE_TYPE_Q4_0;
}

/* The activations the GPU GEMM multiplies for weights of type t (see the header), and the tie
 * quantum of each value (0 where no rounding tie is near). */
static void gemm_xg(engine_type t, const float *x, int n, float *xg, float *tie) {
    memset(tie, 0, sizeof(float) * (size_t)n);
    if (t == ENGINE_TYPE_F32) {
        memcpy(xg, x, sizeof(float) * (size_t)n);
        return;
    }
    const engine_type vt = is_q8(t) ? engine_type_traits_get(t)->vec_dot_type : t;
    void *buf = malloc(engine_type_row_size(vt, n));
    engine_quantize_row(vt, x, buf, n);
    engine_dequantize_row(vt, buf, xg, n);
    free(buf);
    if (is_q8(t)) {
        const int bs = vt == ENGINE_TYPE_Q8_K ? 256 : 32;
        for (int b = 0; b < n; b += bs) {
            float am = 0.0f;
            for (int i = b; i < b + bs; i++)
                am = fmaxf(am, fabsf(x[i]));
            const float is = am > 0.0f ? 127.0f / am : 0.0f;
            for (int i = b; i < b + bs; i++) {
                const float v = x[i] * is;
                tie[i] = fabsf(fabsf(v - rintf(v)) - 0.5f) < 1e-3f ? am / 127.0f : 0.0f;
            }
            /* Q8_0 stores its scale am / 127 in F16: near a rounding tie of that (2e-6
             * relative) the GPU's scale may be the neighbouring F16 value, every value of the
             * block then off by up to 2^-10 of itself */
            if (bs == 32 && am > 0.0f) {
                const float a = am / 127.0f * (1.0f + 2e-6f), c = am / 127.0f * (1.0f - 2e-6f);
                uint16_t ha, hc;
                engine_quantize_row(ENGINE_TYPE_F16, &a, &ha, 1);
                engine_quantize_row(ENGINE_TYPE_F16, &c, &hc, 1);
                if (ha != hc)
                    for (int i = b; i < b + bs; i++)
                        tie[i] += fabsf(xg[i]) * 0x1.0p-10f;
            }
        }
    } else { /* 16-bit rounding: a value within 1e-6 (relative) of a midpoint may go either way */
        float up, dn;
        uint16_t h;
        for (int i = 0; i < n; i++) {
            const float a = x[i] * (1.0f + 1e-6f), c = x[i] * (1.0f - 1e-6f);
            engine_quantize_row(t, &a, &h, 1);
            engine_dequantize_row(t, &h, &up, 1);
            engine_quantize_row(t, &c, &h, 1);
            engine_dequantize_row(t, &h, &dn, 1);
            tie[i] = fabsf(up - dn);
        }
    }
}

static void test_gemm_case(engine_type t, int rows, int cols, int m, bool norm, bool acc) {
    const size_t rb = engine_type_row_size(t, cols);
    uint8_t *w = malloc((size_t)rows * rb);
    float *x = malloc(sizeof(float) * (size_t)m * cols), *xn = malloc(sizeof(float) * cols);
    float *xg = malloc(sizeof(float) * cols), *tie = malloc(sizeof(float) * cols);
    float *nw = malloc(sizeof(float) * cols), *row = malloc(sizeof(float) * (size_t)rows * cols);
    float *y = malloc(sizeof(float) * (size_t)m * rows), *y0 = malloc(sizeof(float) * (size_t)m * rows);
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < cols; i++)
            xn[i] = frand() * 1.7f / sqrtf((float)cols);
        engine_quantize_row(t, xn, w + (size_t)r * rb, cols);
        engine_dequantize_row(t, w + (size_t)r * rb, row + (size_t)r * cols, cols);
    }
    for (size_t i = 0; i < (size_t)m * cols; i++)
        x[i] = frand() * 2.0f;
    for (int i = 0; i < cols; i++)
        nw[i] = 0.75f + 0.25f * (frand() + 1.0f);
    for (size_t i = 0; i < (size_t)m * rows; i++)
        y0[i] = y[i] = frand();
    int rc = engine_cuda_op_gemm(t, w, rows, cols, rb, m, x, norm ? nw : NULL, 1e-6f, acc, y);
    CHECK(rc == 0, "gemm %s %d x %d, m %d", engine_type_name(t), rows, cols, m);
    double worst = 0;
    int bad = 0;
    for (int i = 0; rc == 0 && i < m && !bad; i++) {
        if (norm)
            engine_cpu_rmsnorm(xn, x + (size_t)i * cols, nw, cols, 1e-6f);
        else
            memcpy(xn, x + (size_t)i * cols, sizeof(float) * cols);
        gemm_xg(t, xn, cols, xg, tie);
        for (int r = 0; r < rows; r++) {
            const float *wr = row + (size_t)r * cols;
            double s = 0, mag = 0, slack = 0;
            for (int c = 0; c < cols; c++) {
                s += (double)wr[c] * xg[c];
                mag += fabs((double)wr[c] * xg[c]);
                slack += fabs((double)wr[c]) * tie[c];
            }
            const double base = acc ? y0[(size_t)i * rows + r] : 0.0;
            const double got = y[(size_t)i * rows + r], err = fabs(got - base - s);
            if (err / (mag + 1e-6) > worst) worst = err / (mag + 1e-6);
            if (err > 1e-5 * mag + 1e-6 + slack + (acc ? 1e-6 * fabs(base) : 0.0)) {
                CHECK(0, "gemm %s %d x %d m %d: x row %d, w row %d: gpu %.9g exact %.9g "
                      "(sum|w xg| %.3g, tie slack %.3g)", engine_type_name(t), rows, cols, m,
                      i, r, got - base, s, mag, slack);
                bad = 1;
                break;
            }
        }
    }
    const char *var = getenv("SPARK_CUDA_GEMM_OP");
    printf("gemm %-5s %4d x %-4d m %-3d%s%s [%s]: worst |gpu-exact|/sum|w xg| = %.2e\n",
           engine_type_name(t), rows, cols, m, norm ? " +norm" : "", acc ? " +acc" : "",
           var && *var ? var : "default", worst);
    /* every variant but the first kernels, split-K and the int superblock order computes each
     * element in the same order: the same bits as the default on the same inputs */
    if (rc == 0 && var && *var && !strstr(var, "legacy") && !strstr(var, "splitk") &&
        !strstr(var, "kint")) {
        char saved[64];
        snprintf(saved, sizeof saved, "%s", var);
        float *yd = malloc(sizeof(float) * (size_t)m * rows);
        memcpy(yd, y0, sizeof(float) * (size_t)m * rows);
        setenv("SPARK_CUDA_GEMM_OP", "", 1);
        rc = engine_cuda_op_gemm(t, w, rows, cols, rb, m, x, norm ? nw : NULL, 1e-6f, acc, yd);
        setenv("SPARK_CUDA_GEMM_OP", saved, 1);
        CHECK(rc == 0, "gemm %s default", engine_type_name(t));
        for (size_t i = 0; rc == 0 && i < (size_t)m * rows; i++)
            if (memcmp(&y[i], &yd[i], sizeof(float)) != 0) {
                CHECK(0, "gemm %s %d x %d m %d [%s]: x row %zu, w row %zu: %.9g, default %.9g",
                      engine_type_name(t), rows, cols, m, saved, i / (size_t)rows,
                      i % (size_t)rows, y[i], yd[i]);
                break;
            }
        free(yd);
    }
    free(w);
    free(x);
    free(xn);
    free(xg);
    free(tie);
    free(nw);
    free(row);
    free(y);
    free(y0);
}

/* Every kernel variant the op can pick (SPARK_CUDA_GEMM_OP, engine/cuda/gemm.cu): the default
 * (64-row tiles dense), 32-row tiles, grouped mode (groups of 1 to 70 rows, a permuted X, two
 * weight matrices) with its default 32-row and with 64-row tiles, three matrices in one launch
 * (dense and grouped), the L1 prefetch, the first kernels, the staged cp.async kernels
 * (every int8 type: Q4_K / Q5_K the prefill's default, Q6_K / Q8_0 / Q4_0 in 2-byte-aligned
 * covering pieces, rows of 96 values ending mid-step; F16 / BF16 fall back to the default),
 * the wide 8-warp 64 x 128 tiles (dense, grouped, staged; F16 / BF16: 4 warps), the SV scale
 * layout (svec) in the 4-warp kernels, the staged Q4_K / Q5_K products on fragments read
 * from the staged bytes (direct), split-K over 3 (dense, the partial sums added in order),
 * and the int superblock order of Q4_K / Q5_K (kint, kint3: the direct 32-row kernels; the
 * other types run their default kernels there; with split-K: splits of whole superblocks, or
 * the F32 epilogue where the splits outnumber the superblocks), and of Q6_K (kint with 32-row
 * tiles, not staged). */
static void test_gemm(char **only, int n_only) {
    const engine_type types[] = {ENGINE_TYPE_Q4_K, ENGINE_TYPE_Q5_K, ENGINE_TYPE_Q6_K,
                                 ENGINE_TYPE_Q8_0, ENGINE_TYPE_Q4_0, ENGINE_TYPE_F16,
                                 ENGINE_TYPE_BF16, ENGINE_TYPE_F32};
    const char *variants[] = {"",
                              "tile32",
                              "grouped",
                              "grouped tile64",
                              "fused",
                              "grouped fused",
                              "pfl1",
                              "legacy",
                              "pipe",
                              "grouped pipe",
                              "tile32 pipe",
                              "wide",
                              "wide pipe",
                              "grouped wide",
                              "grouped wide pipe",
                              "grouped fused wide pipe",
                              "splitk",
                              "fused splitk pipe",
                              "wide splitk pipe",
                              "svec",
                              "svec pipe",
                              "grouped svec pipe",
                              "tile32 svec",
                              "direct pipe",
                              "grouped direct pipe",
                              "grouped fused wide direct pipe",
                              "grouped direct pipe kint",
                              "grouped fused direct pipe kint3",
                              "tile32 direct pipe kint",
                              "tile32 splitk direct pipe kint",
                              "grouped kint",
                              "tile32 splitk kint"};
    const size_t nv = sizeof variants / sizeof variants[0];
    for (size_t v = 0; v < nv; v++) {
        bool want = n_only == 0;
        for (int k = 0; k < n_only; k++)
            want |= strcmp(only[k], variants[v]) == 0 ||
                    (strcmp(only[k], "default") == 0 && !*variants[v]);
        if (!want) continue;
        setenv("SPARK_CUDA_GEMM_OP", variants[v], 1);
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
            const engine_type t = types[i];
            test_gemm_case(t, 131, 512, 70, true, false);   /* partial tiles both ways */
            test_gemm_case(t, 64, 768, 1, false, false);    /* one row (the head of a prompt) */
            test_gemm_case(t, 200, 2048, 129, false, true); /* += residual, 3 X tiles */
            if (!(t == ENGINE_TYPE_Q4_K || t == ENGINE_TYPE_Q5_K || t == ENGINE_TYPE_Q6_K))
                test_gemm_case(t, 70, 96, 33, true, false); /* a 128-column step zero-padded */
        }
    }
    unsetenv("SPARK_CUDA_GEMM_OP");
}

/* ------------------------------------------------------------------------------------------ */

static char tmpdir[256];

#define N_PROMPT 70
#define N_DEC 8
#define CHUNK 48

typedef support_logit_stats cmp_stats;

static void compare(cmp_stats *c, const float *lc, const float *lg, int32_t nv, int pos) {
    const support_logit_row r = support_logit_add(c, lc, lg, nv);
    if (c->exact)
        CHECK(r.max_diff <= 1e-4 * (1 + r.max_ref),
              "%s position %d: max |gpu-cpu| %.3g (max |l| %.3g)", c->what, pos, r.max_diff,
              r.max_ref);
    else if (!c->moe)
        CHECK(r.cosine >= 0.999, "%s position %d: cosine %.6f", c->what, pos, r.cosine);
}

static void finish(cmp_stats *c) { support_logit_finish(c, "gpu-cpu", 34); }

static void run_model(const char *preset, const char *type) {
    char path[600], what[96];
    snprintf(path, sizeof path, "%s/%s-%s.gguf", tmpdir, preset, type);
    if (support_gen(preset, type, 23, path) != 0) {
        CHECK(0, "model gen %s %s", preset, type);
        return;
    }
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_ctx = 256;
    engine_model *m = NULL, *m2 = NULL;
    engine_session *cs = NULL, *s2 = NULL;
    engine_cuda_model *gm = NULL;
    engine_cuda_session *gs = NULL, *gs2 = NULL, *gs3 = NULL;
    engine_cuda_prefill *pf = NULL, *pf2 = NULL;
    float *lc = NULL, *lg = NULL, *lg2 = NULL, *ld = NULL, *lcd = NULL, *lgd = NULL;
    if (engine_model_load(&m, path, &mp) != 0) {
        CHECK(0, "load %s", path);
        return;
    }
    const int32_t nv = engine_model_n_vocab(m);
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.kv_type = ENGINE_KV_F32;
    CHECK(engine_session_new(&cs, m, &sp) == 0, "cpu session");
    CHECK(engine_cuda_model_new(&gm, m, 0) == 0, "cuda model");
    if (gm) {
        CHECK(engine_cuda_session_new(&gs, gm, 256, ENGINE_KV_F32) == 0, "cuda session");
        CHECK(engine_cuda_session_new(&gs2, gm, 256, ENGINE_KV_F32) == 0, "cuda session 2");
        CHECK(engine_cuda_session_new(&gs3, gm, 256, ENGINE_KV_F32) == 0, "cuda session 3");
    }
    if (gs) CHECK(engine_cuda_prefill_new(&pf, gm, gs, CHUNK) == 0, "prefill");
    if (gs2) CHECK(engine_cuda_prefill_new(&pf2, gm, gs2, 256) == 0, "prefill 2");
    lc = malloc(sizeof(float) * nv * N_PROMPT);
    lg = malloc(sizeof(float) * nv * N_PROMPT);
    lg2 = malloc(sizeof(float) * nv * N_PROMPT);
    ld = malloc(sizeof(float) * nv);
    lcd = malloc(sizeof(float) * nv * N_DEC);
    lgd = malloc(sizeof(float) * nv * N_DEC);
    if (!cs || !pf || !pf2 || !gs3 || !lc || !lg || !lg2 || !ld || !lcd || !lgd) goto out;
    int32_t tok[N_PROMPT + N_DEC];
    for (int i = 0; i < N_PROMPT; i++)
        tok[i] = (int32_t)((i * 7919 + 13) % nv);
    CHECK(engine_session_append(cs, tok, N_PROMPT, lc) == 0, "cpu prompt");
    CHECK(engine_cuda_prefill_run(pf, tok, N_PROMPT, 0, lg, NULL) == 0, "gpu prefill");
    cmp_stats c = {.exact = strcmp(type, "f32") == 0,
                   .moe = strcmp(preset, "tiny") == 0,
                   .worst_cos = 1,
                   .what = what};
    snprintf(what, sizeof what, "%s %s prefill", preset, type);
    for (int i = 0; i < N_PROMPT; i++)
        compare(&c, lc + (size_t)i * nv, lg + (size_t)i * nv, nv, i);
    finish(&c);
    /* decode steps over the KV the prefill wrote */
    cmp_stats cd = {.exact = c.exact, .moe = c.moe, .worst_cos = 1, .what = what};
    char what2[96];
    snprintf(what2, sizeof what2, "%s %s decode after", preset, type);
    cd.what = what2;
    tok[N_PROMPT] = support_argmax(lc + (size_t)(N_PROMPT - 1) * nv, nv);
    for (int i = N_PROMPT; i < N_PROMPT + N_DEC; i++) {
        if (engine_cuda_decode(gs, tok[i], i, ld, NULL) != 0 ||
            engine_session_append(cs, &tok[i], 1, NULL) != 0) {
            CHECK(0, "decode step %d", i);
            goto out;
        }
        compare(&cd, engine_session_logits(cs), ld, nv, i);
        memcpy(lcd + (size_t)(i - N_PROMPT) * nv, engine_session_logits(cs), sizeof(float) * nv);
        memcpy(lgd + (size_t)(i - N_PROMPT) * nv, ld, sizeof(float) * nv);
        if (i + 1 < N_PROMPT + N_DEC) tok[i + 1] = support_argmax(engine_session_logits(cs), nv);
    }
    finish(&cd);
    /* control: the decode step alone, token by token from position 0, against the CPU and
     * against the decode after the prefill (tells a prefill KV fault from a decode fault) */
    {
        char w3[96], w4[96];
        snprintf(w3, sizeof w3, "%s %s decode alone", preset, type);
        snprintf(w4, sizeof w4, "%s %s decode after vs alone", preset, type);
        cmp_stats ca = {.exact = c.exact, .moe = c.moe, .worst_cos = 1, .what = w3},
                  cx = {.exact = c.exact, .moe = c.moe, .worst_cos = 1, .what = w4};
        for (int i = 0; i < N_PROMPT + N_DEC; i++) {
            if (engine_cuda_decode(gs3, tok[i], i, ld, NULL) != 0) {
                CHECK(0, "control decode step %d", i);
                goto out;
            }
            if (i < N_PROMPT) continue;
            compare(&ca, lcd + (size_t)(i - N_PROMPT) * nv, ld, nv, i);
            compare(&cx, lgd + (size_t)(i - N_PROMPT) * nv, ld, nv, i);
        }
        finish(&ca);
        finish(&cx);
    }
    /* the same prompt in two calls on another session (one chunk each): bit for bit */
    CHECK(engine_cuda_prefill_run(pf2, tok, 30, 0, lg2, NULL) == 0 &&
              engine_cuda_prefill_run(pf2, tok + 30, N_PROMPT - 30, 30, lg2 + (size_t)30 * nv,
                                      ld) == 0,
          "prefill in two calls");
    CHECK(memcmp(lg, lg2, sizeof(float) * nv * N_PROMPT) == 0,
          "%s %s: chunked and two-call prefill logits differ", preset, type);
    CHECK(memcmp(ld, lg + (size_t)(N_PROMPT - 1) * nv, sizeof(float) * nv) == 0,
          "%s %s: logits_last differs from the last row", preset, type);
    /* the prefill's GEMM words (SPARK_CUDA_PREFILL_GEMM, read when a prefill is made):
     * - those that keep each product's arithmetic give the same logits bit for bit as their
     *   reference: the default (lg) or the F32 epilogue of "nokint" (ln);
     * - "nokint", "nokintd", "nokint6" (other rounding): against the CPU by the default's
     *   criteria;
     * - the default's int superblock order against "nokint": how many logits differ (0 where
     *   no Q4_K / Q5_K product takes it) */
    {
        static const struct {
            const char *words;
            int ref; /* 0: bit for bit the default, 1: bit for bit "nokint", 2: vs the CPU */
        } runs[] = {{"nokint", 2},         {"nokintd", 2},
                    {"nokint6", 2},        {"svec", 0},
                    {"direct nopipe8", 0}, {"nokint wided", 1},
                    {"nokint svec", 1},    {"nokint wided pipe6 pipe8", 1}};
        const char *env = getenv("SPARK_CUDA_PREFILL_GEMM");
        char saved[128];
        snprintf(saved, sizeof saved, "%s", env ? env : "");
        float *ln = malloc(sizeof(float) * nv * N_PROMPT);
        for (size_t wi = 0; ln && wi < sizeof runs / sizeof runs[0]; wi++) {
            const char *w = runs[wi].words;
            engine_cuda_prefill *pw = NULL;
            if (env && *env) { /* the run's own words would mix with these */
                printf("%s %s: GEMM words \"%s\" not run (the run's words are \"%s\")\n", preset,
                       type, w, env);
                continue;
            }
            setenv("SPARK_CUDA_PREFILL_GEMM", w, 1);
            CHECK(engine_cuda_prefill_new(&pw, gm, gs2, CHUNK) == 0, "prefill %s", w);
            if (env)
                setenv("SPARK_CUDA_PREFILL_GEMM", saved, 1);
            else
                unsetenv("SPARK_CUDA_PREFILL_GEMM");
            if (!pw) continue;
            float *out = runs[wi].ref == 2 && strcmp(w, "nokint") == 0 ? ln : lg2;
            const int rw = engine_cuda_prefill_run(pw, tok, N_PROMPT, 0, out, NULL);
            CHECK(rw == 0, "prefill %s run", w);
            engine_cuda_prefill_free(pw);
            if (rw) continue;
            if (runs[wi].ref == 2) {
                char wk[96];
                snprintf(wk, sizeof wk, "%s %s prefill %s", preset, type, w);
                cmp_stats ck = {.exact = c.exact, .moe = c.moe, .worst_cos = 1, .what = wk};
                for (int i = 0; i < N_PROMPT; i++)
                    compare(&ck, lc + (size_t)i * nv, out + (size_t)i * nv, nv, i);
                finish(&ck);
                size_t diff = 0;
                for (size_t i = 0; i < (size_t)nv * N_PROMPT; i++)
                    diff += memcmp(&lg[i], &out[i], sizeof(float)) != 0;
                printf("%s %s prefill, GEMM words \"%s\": %zu logits differ from the default's\n",
                       preset, type, w, diff);
                continue;
            }
            const float *ref = runs[wi].ref == 0 ? lg : ln;
            size_t diff = 0;
            for (size_t i = 0; i < (size_t)nv * N_PROMPT; i++)
                diff += memcmp(&ref[i], &lg2[i], sizeof(float)) != 0;
            CHECK(diff == 0, "%s %s: prefill with GEMM words \"%s\": %zu logits differ from %s",
                  preset, type, w, diff, runs[wi].ref == 0 ? "the default's" : "nokint's");
            printf("%s %s prefill, GEMM words \"%s\": %s%s\n", preset, type, w,
                   diff ? "DIFFERENT from " : "bit for bit ",
                   runs[wi].ref == 0 ? "the default" : "nokint");
        }
        free(ln);
    }
    /* F16 KV (the f32 models): the prefill against the CPU with the same cache type; with
     * the default tensor-core attention (Q and P rounded to F16; SPARK_CUDA_PREFILL_NEXT=0:
     * the SIMT one) */
    if (c.exact) {
        engine_session *c16 = NULL;
        engine_cuda_session *g16 = NULL;
        engine_cuda_prefill *p16 = NULL;
        engine_session_params sp16 = sp;
        sp16.kv_type = ENGINE_KV_F16;
        CHECK(engine_session_new(&c16, m, &sp16) == 0, "cpu session f16 kv");
        CHECK(engine_cuda_session_new(&g16, gm, 256, ENGINE_KV_F16) == 0, "cuda session f16 kv");
        if (g16) CHECK(engine_cuda_prefill_new(&p16, gm, g16, CHUNK) == 0, "prefill f16 kv");
        if (c16 && p16 && engine_session_append(c16, tok, N_PROMPT, lc) == 0 &&
            engine_cuda_prefill_run(p16, tok, N_PROMPT, 0, lg2, NULL) == 0) {
            double worst = 0;
            for (int i = 0; i < N_PROMPT; i++) {
                const float *a = lc + (size_t)i * nv, *b = lg2 + (size_t)i * nv;
                double mx = 0, d = 0;
                for (int32_t t = 0; t < nv; t++) {
                    mx = fmax(mx, fabs(a[t]));
                    d = fmax(d, fabs(a[t] - b[t]));
                }
                worst = fmax(worst, d / (1 + mx));
                if (d > 5e-3 * (1 + mx)) {
                    CHECK(0, "%s %s f16 kv position %d: max |gpu-cpu| %.3g (max |l| %.3g)",
                          preset, type, i, d, mx);
                    break;
                }
            }
            printf("%-34s: max |gpu-cpu|/(1+max|l|) %.2e\n",
                   strcmp(preset, "tiny") == 0 ? "tiny f32 prefill, f16 kv"
                                               : "qwen3-tiny f32 prefill, f16 kv",
                   worst);
        } else {
            CHECK(0, "%s %s: f16 kv prefill", preset, type);
        }
        engine_cuda_prefill_free(p16);
        engine_cuda_session_free(g16);
        engine_session_free(c16);
    }
    /* bad input: an error, not a crash */
    int32_t bad = nv;
    CHECK(engine_cuda_prefill_run(pf2, &bad, 1, 0, NULL, NULL) == ENGINE_EINVAL, "bad token");
    CHECK(engine_cuda_prefill_run(pf2, tok, 8, 250, NULL, NULL) == ENGINE_ERANGE, "past context");
    /* the public API (device cuda): a prompt appended without logits_all goes through the
     * prefill (chunks of 256 here) */
    if (strcmp(type, "q4_k_m") == 0) {
        engine_model_params mg = ENGINE_MODEL_PARAMS_INIT;
        mg.device = ENGINE_DEVICE_CUDA;
        mg.n_ctx = 256;
        CHECK(engine_model_load(&m2, path, &mg) == 0, "load %s on cuda", path);
        if (m2) CHECK(engine_session_new(&s2, m2, &sp) == 0, "cuda session through the API");
        if (s2) {
            CHECK(engine_session_append(s2, tok, N_PROMPT, NULL) == 0, "append prompt");
            const float *l = engine_session_logits(s2);
            CHECK(l && memcmp(l, lg + (size_t)(N_PROMPT - 1) * nv, sizeof(float) * nv) == 0,
                  "%s %s: API prompt logits differ from the prefill's", preset, type);
        }
    }
out:
    free(lc);
    free(lg);
    free(lg2);
    free(ld);
    free(lcd);
    free(lgd);
    engine_session_free(s2);
    engine_model_free(m2);
    engine_cuda_prefill_free(pf);
    engine_cuda_prefill_free(pf2);
    engine_cuda_session_free(gs);
    engine_cuda_session_free(gs2);
    engine_cuda_session_free(gs3);
    engine_cuda_model_free(gm);
    engine_session_free(cs);
    engine_model_free(m);
    unlink(path);
}

int main(int argc, char **argv) {
    if (engine_cuda_usable() != 0) {
        printf("skip: %s\n", engine_error_last());
        return 77;
    }
    /* "gemm [VARIANT...]": the GEMM op cases alone, of the named variants ("default": ""), for
     * compute-sanitizer runs */
    if (argc >= 2 && strcmp(argv[1], "gemm") == 0) {
        test_gemm(argv + 2, argc - 2);
        return support_finish("test_cuda_batch gemm");
    }
    test_gemm(NULL, 0);
    const int rc = support_init();
    if (rc) return rc;
    if (support_tmpdir(tmpdir, sizeof tmpdir, "test_cuda_batch", false) != 0) return 1;
    if (argc == 3) {
        run_model(argv[1], argv[2]);
    } else {
        const char *types[] = {"f32", "q8_0", "q4_k_m"};
        for (int i = 0; i < 3; i++) {
            run_model("tiny", types[i]);
            run_model("qwen3-tiny", types[i]);
        }
    }
    support_rmtree(tmpdir);
    return support_finish("test_cuda_batch");
}
#endif
