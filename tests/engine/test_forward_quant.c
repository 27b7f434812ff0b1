/* Quantised models against the F32 model of the same seed, through the public API: tiny qwen3moe
 * q8_0, qwen3-tiny dense q8_0 and q4_k_m. Labelled slow (five generated models); the rest of the
 * forward pass is tested in test_forward.c.
 *
 * Quantised-model tolerances (cosine similarity of the logits against the F32 model of the
 * same seed, at every prompt position; greedy top-1 agreement over QUANT_STEPS steps with both
 * models fed the F32 model's tokens, so one early flip does not cascade).
 * Dense qwen3: Q8_0 keeps ~8 bits per weight with a scale per 32 (relative weight error ~0.4%)
 * and activations are quantised the same way: every position >= 0.999 (measured 0.9999);
 * Q4_K_M (4-6 bits): >= 0.98 (measured worst 0.986, median 0.992).
 * qwen3moe: the router makes a discrete top-2-of-8 choice, and a small perturbation that flips
 * one choice swaps half of the FFN output, so single positions can drop far (measured 0.937
 * worst over 40 positions); we require the median >= 0.995 and the worst >= 0.9. The random
 * model's logits are flat (rms ~1, many near-ties), so top-1 agreement is held to 12 of 16 for
 * the MoE and 15 of 16 for dense Q8_0. */
#define QUANT_STEPS 16

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "support.h"

static char tmpdir[] = "/tmp/spark_test_forward_quant_XXXXXX";

#define N_PROMPT 40

/* all-at-once vs token-by-token vs prefill-then-decode vs rollback, on one model */
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void test_quantised(const char *f32, const char *quant, const char *what, double worst_min,
                           double median_min, int top1_min) {
    engine_model *a = support_load(f32, 1, 256, ENGINE_DEVICE_AUTO),
                 *b = support_load(quant, 1, 256, ENGINE_DEVICE_AUTO);
    if (!a || !b) goto done;
    int32_t nv = engine_model_n_vocab(a), ids[N_PROMPT];
    size_t n = support_chat_prompt(a, ids, N_PROMPT);
    float *la = malloc(sizeof(float) * n * nv), *lb = malloc(sizeof(float) * n * nv);
    double cs[N_PROMPT];
    engine_session *sa = support_session(a, 64, ENGINE_KV_F32);
    engine_session *sb = support_session(b, 64, ENGINE_KV_F32);
    if (sa && sb) {
        CHECK(engine_session_append(sa, ids, n, la) == 0);
        CHECK(engine_session_append(sb, ids, n, lb) == 0);
        for (size_t t = 0; t < n; t++) cs[t] = support_cosine(la + t * nv, lb + t * nv, nv);
        qsort(cs, n, sizeof cs[0], cmp_double);
        int agree = 0;
        for (int i = 0; i < QUANT_STEPS; i++) {
            int32_t ta = support_argmax(engine_session_logits(sa), nv);
            agree += ta == support_argmax(engine_session_logits(sb), nv);
            CHECK(engine_session_append(sa, &ta, 1, NULL) == 0);
            CHECK(engine_session_append(sb, &ta, 1, NULL) == 0);
        }
        printf("%s vs f32: cosine worst %.5f median %.5f over %zu positions; greedy top-1 "
               "agreement %d/%d\n", what, cs[0], cs[n / 2], n, agree, QUANT_STEPS);
        CHECK(cs[0] >= worst_min);
        CHECK(cs[n / 2] >= median_min);
        CHECK(agree >= top1_min);
    }
    engine_session_free(sa);
    engine_session_free(sb);
    free(la);
    free(lb);
done:
    engine_model_free(a);
    engine_model_free(b);
}

int main(void) {
    int skip = support_init();
    if (skip) return skip;
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    char moe[512], dense[512], q8[512], dq8[512], dq4[512];
    snprintf(moe, sizeof moe, "%s/tiny-f32.gguf", tmpdir);
    snprintf(dense, sizeof dense, "%s/qwen3-tiny-f32.gguf", tmpdir);
    snprintf(q8, sizeof q8, "%s/tiny-q8_0.gguf", tmpdir);
    snprintf(dq8, sizeof dq8, "%s/qwen3-tiny-q8_0.gguf", tmpdir);
    snprintf(dq4, sizeof dq4, "%s/qwen3-tiny-q4_k_m.gguf", tmpdir);
    if (support_gen("tiny", "f32", 7, moe) || support_gen("qwen3-tiny", "f32", 7, dense) ||
        support_gen("tiny", "q8_0", 7, q8) || support_gen("qwen3-tiny", "q8_0", 7, dq8) ||
        support_gen("qwen3-tiny", "q4_k_m", 7, dq4)) {
        support_failures++;
        goto out;
    }
    test_quantised(moe, q8, "qwen3moe q8_0", 0.9, 0.995, 12);
    test_quantised(dense, dq8, "qwen3 q8_0", 0.999, 0.999, 15);
    test_quantised(dense, dq4, "qwen3 q4_k_m", 0.98, 0.98, 12);
out:
    unlink(moe);
    unlink(dense);
    unlink(q8);
    unlink(dq8);
    unlink(dq4);
    rmdir(tmpdir);
    return support_finish("test_forward_quant");
}
