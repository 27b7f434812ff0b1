/* The qwen35moe prefill pass on the GPU (engine/cuda/q35_prefill.cu, deltanet_chunk.cu) against
 * the CPU forward and the GPU decode step, on the generator's qwen35-tiny in f32, q8_0 and
 * q4_k_m (8 blocks: 6 DeltaNet, 2 gated attention; 8 experts, top-2, plus the shared one).
 *
 * Error bounds (stated, not tuned to pass):
 *   last-token logits of prompts of 2, 17, 64, 100 and 300 tokens (on and off the snapshot
 *     grid of 16, one and several DeltaNet sub-chunks) against the CPU session's: f32 within
 *     5e-4 * (1 + max |logit|) (the decode step's bound in test_cuda_qwen35: summation order
 *     only), F16 KV on both sides 2e-3 * (1 + max |logit|); q8_0 / q4_k_m cosine >= 0.999 on
 *     at least 4 of the 5 and >= 0.97 on all (the activations are quantised as the CPU does,
 *     but a rounding tie can fall the other way and swap two near-tied experts of a token, and
 *     the recurrent state carries that token's difference to every later one: the GPU decode
 *     step itself parts from the CPU's greedy tokens at once on the q8_0 file, test_cuda_qwen35;
 *     the f32 bounds are the ones that pin the arithmetic)
 *   the conv rings and recurrent states after a 100-token prefill against 100 decode steps
 *     (f32): within 1e-3 * (1 + max |value|) (the chunked delta rule regroups the recurrent
 *     sums; a wrong decay, gate or fold is O(1))
 *   a 300-token prompt as one chunk, as two appends (123 + 177) and in 37-token chunks: the
 *     logits within 2e-4 * (1 + max |logit|) of each other (f32; cosine >= 0.97 quantised)
 *   8 greedy decode steps after the prefill against the CPU session with the same history:
 *     the f32 bound above (cosine >= 0.97 quantised, the reason above)
 *   rollback into the prefilled range (engine_cuda_q35_truncate from 100 to 70 and to 90,
 *     restoring the prefill's snapshots at 64 and 80): the next token's logits within 2e-4 *
 *     (1 + max) of a session that decoded every token (cosine >= 0.97 quantised); to 40 (no snapshot kept at or before
 *     it: recomputed from 0 by decode steps) bit for bit equal to it
 *   the tensor-core gated attention (engine_cuda_op_q35_prefill_att) against the SIMT one on
 *     the same F16 cache, head sizes 256 (16 / 2 heads, the 35B-A3B shape), 64 and 128, on and
 *     off the first tile: within 4e-3 * (1 + max |out|) (Q and P rounded to F16)
 *   through engine.h on a model loaded with device cuda: a 100-token append's logits within
 *     the bounds of the first check; bad token ids and positions are errors.
 * Exits 77 (skip) with the reason when no GPU is usable or the build has no CUDA backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

#ifndef SPARK_HAVE_CUDA
int main(void) {
    printf("skip: this build has no CUDA backend\n");
    return 77;
}
#else
#include "cpu/quant.h"
#include "cuda/cuda_backend.h"
#include "test_cuda_check.h"

static char tmpdir[] = "/tmp/spark_test_cuda_q35_prefill_XXXXXX";

#define N_CTX 512
#define N_TOK 320

/* ref vs got: within rel * (1 + max |ref|) (exact types) or cosine >= cmin; returns the
 * relative error (exact) or the cosine. */
static double compare(const float *ref, const float *got, size_t n, bool exact, double rel,
                      double cmin, const char *what) {
    const support_logit_row r = support_logit_compare(ref, got, (int32_t)n);
    if (exact) {
        const double e = r.max_diff / (1 + r.max_ref);
        CHECK(e <= rel, "%s: max |gpu - ref| / (1 + max |ref|) = %.3g > %.1g", what, e, rel);
        return e;
    }
    CHECK(r.cosine >= cmin, "%s: cosine %.6f < %.4f", what, r.cosine, cmin);
    return r.cosine;
}

/* The tensor-core gated attention against the SIMT one (F32 arithmetic on the same F16 cache)
 * for n queries at pos0..: within 4e-3 * (1 + max |out|) (Q and P rounded to F16: ~5e-4 each
 * on the weights and scores; a wrong row, mask or merge is O(0.1)). */
static void check_att(int nh, int nkv, int hd, int n, int pos0) {
    const size_t qd = (size_t)n * nh * hd, kvn = (size_t)(pos0 + n) * nkv * hd;
    float *q = malloc(sizeof(float) * qd), *qg = malloc(sizeof(float) * 2 * qd);
    float *o1 = malloc(sizeof(float) * qd), *o2 = malloc(sizeof(float) * qd);
    uint16_t *k = malloc(sizeof(uint16_t) * kvn), *v = malloc(sizeof(uint16_t) * kvn);
    uint64_t st = 0x9e3779b97f4a7c15ull + (uint64_t)(nh * 1000 + hd + pos0);
    if (q && qg && o1 && o2 && k && v) {
        for (size_t i = 0; i < qd; i++)
            q[i] = 4.0f * support_frand(&st);
        for (size_t i = 0; i < 2 * qd; i++)
            qg[i] = 2.0f * support_frand(&st);
        for (size_t i = 0; i < kvn; i++) {
            k[i] = engine_fp32_to_fp16(support_frand(&st));
            v[i] = engine_fp32_to_fp16(support_frand(&st));
        }
        CHECK(engine_cuda_op_q35_prefill_att(nh, nkv, hd, n, pos0, q, qg, k, v, 1, o1) == 0,
              "tensor-core attention op");
        CHECK(engine_cuda_op_q35_prefill_att(nh, nkv, hd, n, pos0, q, qg, k, v, 0, o2) == 0,
              "simt attention op");
        const support_logit_row r = support_logit_compare(o2, o1, (int32_t)qd);
        const double e = r.max_diff / (1 + r.max_ref);
        CHECK(e <= 4e-3, "attention %d/%d x %d, %d queries at %d: tensor cores vs simt %.3g", nh,
              nkv, hd, n, pos0, e);
        printf("prefill attention %2d/%d x %3d, %3d queries at %4d: tensor cores vs simt %.2e\n",
               nh, nkv, hd, n, pos0, e);
    } else {
        CHECK(0, "out of memory");
    }
    free(q), free(qg), free(o1), free(o2), free(k), free(v);
}

static void run_model(const char *type) {
    char path[600];
    snprintf(path, sizeof path, "%s/qwen35-tiny-%s.gguf", tmpdir, type);
    if (support_gen("qwen35-tiny", type, 11, path) != 0) {
        CHECK(0, "model gen qwen35-tiny %s", type);
        return;
    }
    const bool exact = strcmp(type, "f32") == 0;
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_ctx = N_CTX;
    engine_model *m = NULL, *mg = NULL;
    engine_session *cs = NULL, *cs16 = NULL, *as = NULL;
    engine_cuda_q35_model *gm = NULL;
    engine_cuda_q35_session *gs = NULL, *gd = NULL, *g16 = NULL;
    engine_cuda_q35_prefill *pf = NULL, *pfs = NULL, *pf16 = NULL;
    float *lc = NULL, *lg = NULL, *l1 = NULL, *refd[3] = {NULL, NULL, NULL};
    float *ra = NULL, *rb = NULL, *sa = NULL, *sb = NULL;
    int32_t toks[N_TOK];
    if (engine_model_load(&m, path, &mp) != 0) {
        CHECK(0, "load %s", path);
        return;
    }
    const int32_t nv = engine_model_n_vocab(m);
    const size_t V = (size_t)nv;
    for (int i = 0; i < N_TOK; i++)
        toks[i] = (int32_t)((i * 7919 + 13) % nv);
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.kv_type = ENGINE_KV_F32;
    CHECK(engine_session_new(&cs, m, &sp) == 0, "cpu session");
    sp.kv_type = ENGINE_KV_F16;
    if (exact) CHECK(engine_session_new(&cs16, m, &sp) == 0, "cpu session (f16 kv)");
    CHECK(engine_cuda_q35_model_new(&gm, m, 0) == 0, "cuda model");
    if (gm) {
        CHECK(engine_cuda_q35_session_new(&gs, gm, N_CTX, ENGINE_KV_F32) == 0, "cuda session");
        CHECK(engine_cuda_q35_session_new(&gd, gm, N_CTX, ENGINE_KV_F32) == 0, "cuda session");
        if (exact)
            CHECK(engine_cuda_q35_session_new(&g16, gm, N_CTX, ENGINE_KV_F16) == 0,
                  "cuda session (f16 kv)");
    }
    if (gs) CHECK(engine_cuda_q35_prefill_new(&pf, gs, N_CTX) == 0 && pf, "prefill");
    if (gs) CHECK(engine_cuda_q35_prefill_new(&pfs, gs, 37) == 0 && pfs, "prefill (37)");
    if (g16) CHECK(engine_cuda_q35_prefill_new(&pf16, g16, 64) == 0 && pf16, "prefill (f16)");
    lc = malloc(sizeof(float) * V);
    lg = malloc(sizeof(float) * V);
    l1 = malloc(sizeof(float) * V);
    for (int j = 0; j < 3; j++)
        refd[j] = malloc(sizeof(float) * V);
    if (!cs || !gd || !pf || !pfs || (exact && (!cs16 || !pf16)) || !lc || !lg || !l1 ||
        !refd[2])
        goto out;

    { /* 1. last-token logits against the CPU */
        const int32_t lens[] = {2, 17, 64, 100, 300};
        int n_low = 0;
        double worst = exact ? 0 : 1;
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            const int32_t L = lens[i];
            char what[96];
            CHECK(engine_session_truncate(cs, 0) == 0, "cpu truncate");
            CHECK(engine_session_append(cs, toks, (size_t)L, NULL) == 0, "cpu append %d", L);
            memcpy(lc, engine_session_logits(cs), sizeof(float) * V);
            CHECK(engine_cuda_q35_prefill_run(pf, toks, L, 0, lg) == 0, "prefill %d", L);
            snprintf(what, sizeof what, "qwen35-tiny %s prefill of %d", type, L);
            const double r = compare(lc, lg, V, exact, 5e-4, 0.97, what);
            worst = exact ? fmax(worst, r) : fmin(worst, r);
            n_low += !exact && r < 0.999;
            if (exact) {
                CHECK(engine_session_truncate(cs16, 0) == 0, "cpu truncate");
                CHECK(engine_session_append(cs16, toks, (size_t)L, NULL) == 0, "append %d", L);
                CHECK(engine_cuda_q35_prefill_run(pf16, toks, L, 0, lg) == 0, "prefill %d", L);
                snprintf(what, sizeof what, "qwen35-tiny f32 prefill of %d, f16 kv", L);
                compare(engine_session_logits(cs16), lg, V, true, 2e-3, 0, what);
            }
        }
        CHECK(n_low <= 1, "qwen35-tiny %s: %d of 5 prompts below cosine 0.999", type, n_low);
        printf("qwen35-tiny %-6s: prefill logits vs cpu: %s %.3g\n", type,
               exact ? "max rel diff" : "min cosine", worst);
    }

    { /* 2. one chunk, two appends, 37-token chunks */
        CHECK(engine_cuda_q35_prefill_run(pf, toks, 300, 0, l1) == 0, "prefill 300");
        CHECK(engine_cuda_q35_prefill_run(pf, toks, 123, 0, NULL) == 0, "prefill 123");
        CHECK(engine_cuda_q35_prefill_run(pf, toks + 123, 177, 123, lg) == 0, "prefill +177");
        compare(l1, lg, V, exact, 2e-4, 0.97, "300 tokens as 123 + 177");
        CHECK(engine_cuda_q35_prefill_run(pfs, toks, 300, 0, lg) == 0, "prefill 300 (37)");
        compare(l1, lg, V, exact, 2e-4, 0.97, "300 tokens in chunks of 37");
    }

    { /* 3. state after a prefill against decode steps; 4. decode after the prefill */
        for (int32_t p = 0; p < 100; p++) {
            const int j = p == 40 ? 0 : p == 70 ? 1 : p == 90 ? 2 : -1;
            CHECK(engine_cuda_q35_decode(gd, toks[p], p, j >= 0 ? refd[j] : NULL, NULL) == 0,
                  "decode %d", p);
        }
        CHECK(engine_cuda_q35_prefill_run(pf, toks, 100, 0, lg) == 0, "prefill 100");
        size_t nr = 0, ns = 0;
        CHECK(engine_cuda_q35_state_get(gs, NULL, &nr, NULL, &ns) == 0, "state size");
        ra = malloc(sizeof(float) * nr);
        rb = malloc(sizeof(float) * nr);
        sa = malloc(sizeof(float) * ns);
        sb = malloc(sizeof(float) * ns);
        if (!ra || !rb || !sa || !sb) goto out;
        CHECK(engine_cuda_q35_state_get(gs, ra, &nr, sa, &ns) == 0, "state (prefill)");
        CHECK(engine_cuda_q35_state_get(gd, rb, &nr, sb, &ns) == 0, "state (decode)");
        const support_logit_row cr = support_logit_compare(rb, ra, (int32_t)nr);
        const support_logit_row cst = support_logit_compare(sb, sa, (int32_t)ns);
        const double dr = cr.max_diff / (1 + cr.max_ref), ds = cst.max_diff / (1 + cst.max_ref);
        if (exact) {
            CHECK(dr <= 1e-3, "conv rings after prefill vs decode: rel diff %.3g", dr);
            CHECK(ds <= 1e-3, "recurrent states after prefill vs decode: rel diff %.3g", ds);
        }
        printf("qwen35-tiny %-6s: state after 100-token prefill vs decode: ring %.2e, S %.2e "
               "(max |S| %.3g)\n",
               type, dr, ds, cst.max_ref);
        CHECK(engine_session_truncate(cs, 0) == 0, "cpu truncate");
        CHECK(engine_session_append(cs, toks, 100, NULL) == 0, "cpu append 100");
        int32_t tok = support_argmax(engine_session_logits(cs), nv);
        double worst = exact ? 0 : 1;
        for (int32_t p = 100; p < 108; p++) {
            int32_t next = -1;
            CHECK(engine_session_append(cs, &tok, 1, NULL) == 0, "cpu step %d", p);
            CHECK(engine_cuda_q35_decode(gs, tok, p, lg, &next) == 0, "decode %d", p);
            const double r = compare(engine_session_logits(cs), lg, V, exact, 5e-4, 0.97,
                                     "decode after prefill");
            worst = exact ? fmax(worst, r) : fmin(worst, r);
            tok = support_argmax(engine_session_logits(cs), nv);
        }
        printf("qwen35-tiny %-6s: 8 decode steps after the prefill vs cpu: %s %.3g\n", type,
               exact ? "max rel diff" : "min cosine", worst);
    }

    { /* 5. rollback into the prefilled range */
        const int32_t to[3] = {70, 90, 40};
        const int ref[3] = {1, 2, 0};
        for (int i = 0; i < 3; i++) {
            CHECK(engine_cuda_q35_prefill_run(pf, toks, 100, 0, NULL) == 0, "prefill 100");
            CHECK(engine_cuda_q35_truncate(gs, toks, 100, to[i]) == 0, "truncate to %d", to[i]);
            CHECK(engine_cuda_q35_decode(gs, toks[to[i]], to[i], lg, NULL) == 0, "decode %d",
                  to[i]);
            if (to[i] == 40)
                CHECK(memcmp(lg, refd[ref[i]], sizeof(float) * V) == 0,
                      "rollback 100 -> 40 (from 0): logits differ from the decoded session "
                      "(max diff %.3g)",
                      support_max_abs_diff(lg, refd[ref[i]], nv));
            else
                compare(refd[ref[i]], lg, V, exact, 2e-4, 0.97, "rollback into the prefill");
        }
    }

    { /* 6. through engine.h; bad input */
        engine_model_params mc = ENGINE_MODEL_PARAMS_INIT;
        mc.device = ENGINE_DEVICE_CUDA;
        mc.n_ctx = N_CTX;
        CHECK(engine_model_load(&mg, path, &mc) == 0, "load %s on cuda", path);
        sp.kv_type = ENGINE_KV_F32;
        if (mg) CHECK(engine_session_new(&as, mg, &sp) == 0, "cuda session through the API");
        if (as) {
            CHECK(engine_session_append(as, toks, 100, NULL) == 0, "api append 100");
            CHECK(engine_session_truncate(cs, 0) == 0, "cpu truncate");
            CHECK(engine_session_append(cs, toks, 100, NULL) == 0, "cpu append 100");
            const float *la = engine_session_logits(as);
            CHECK(la != NULL, "api logits");
            if (la) compare(engine_session_logits(cs), la, V, exact, 5e-4, 0.97, "api append");
        }
        int32_t bad[2] = {0, nv};
        CHECK(engine_cuda_q35_prefill_run(pf, bad, 2, 0, lg) == ENGINE_EINVAL, "token %d", nv);
        CHECK(engine_cuda_q35_prefill_run(pf, toks, 8, N_CTX - 4, lg) == ENGINE_ERANGE,
              "past the context");
        CHECK(engine_cuda_q35_prefill_run(pf, toks, 0, 0, lg) == ENGINE_ERANGE, "no tokens");
    }

out:
    free(lc), free(lg), free(l1), free(ra), free(rb), free(sa), free(sb);
    for (int j = 0; j < 3; j++)
        free(refd[j]);
    engine_cuda_q35_prefill_free(pf);
    engine_cuda_q35_prefill_free(pfs);
    engine_cuda_q35_prefill_free(pf16);
    engine_cuda_q35_session_free(gs);
    engine_cuda_q35_session_free(gd);
    engine_cuda_q35_session_free(g16);
    engine_cuda_q35_model_free(gm);
    engine_session_free(as);
    engine_model_free(mg);
    engine_session_free(cs);
    engine_session_free(cs16);
    engine_model_free(m);
    unlink(path);
}

int main(void) {
    if (engine_cuda_usable() != 0) {
        printf("skip: %s\n", engine_error_last());
        return 77;
    }
    const int rc = support_init();
    if (rc) return rc;
    check_att(16, 2, 256, 200, 0);
    check_att(16, 2, 256, 77, 1000);
    check_att(4, 2, 64, 50, 30);
    check_att(8, 8, 128, 33, 5);
    if (support_tmpdir(tmpdir, sizeof tmpdir, "test_cuda_q35_prefill", false) != 0) return 1;
    const char *types[] = {"f32", "q8_0", "q4_k_m"};
    for (int i = 0; i < 3; i++)
        run_model(types[i]);
    support_rmtree(tmpdir);
    return support_finish("test_cuda_q35_prefill");
}
#endif
