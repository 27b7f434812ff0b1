/* The engine's F32 logits against Hugging Face transformers (float32) on the same random
 * weights: the fixtures in tests/fixtures/reference (format and provenance in its README.md,
 * made by scripts/reference/make_fixture.sh). For each fixture the test regenerates the F32
 * model from (preset, seed) - the generator is deterministic - runs every prompt through one
 * session with an F32 KV cache (the 128-token prompt spans two prefill batches of 64), and
 * checks at every stored position
 *     max_i |engine[i] - hf[i]| / max_i |hf[i]| <= 1e-4
 * over the stored ids (every 61st id and the reference's top 64), plus the argmax where the
 * reference's top two are not within that tolerance of each other. It also checks that the
 * engine's tokenizer turns each prompt's text into the reference's ids. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "support.h"
#include "gen/gen.h"
#include "tokenizer/json.h"

#define REL_TOL 1e-4

static void run_fixture(const char *dir, const char *name, const char *preset, const char *tmp) {
    support_ref r;
    if (support_ref_open(&r, dir, name)) return;
    const engine_json_node *sd = engine_json_get(&r.doc, &r.doc.nodes[0], "seed");
    CHECK(sd && sd->is_int);
    uint64_t seed = sd && sd->is_int ? (uint64_t)sd->ival : 0;
    uint32_t n_vocab = r.n_vocab;
    CHECK(n_vocab == 151936);

    /* The model, regenerated. */
    char model_path[600];
    snprintf(model_path, sizeof model_path, "%s/%s.gguf", tmp, name);
    int rc = support_gen(preset, "f32", seed, model_path);
    CHECK(rc == 0);
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_ctx = 256;
    engine_model *m = NULL;
    if (!rc) CHECK(engine_model_load(&m, model_path, &mp) == 0);
    unlink(model_path);
    if (!m) {
        support_ref_close(&r);
        return;
    }
    CHECK(engine_model_n_vocab(m) == (int32_t)n_vocab);

    const engine_json_node *pj = engine_json_first(&r.doc, r.prompts);
    for (uint32_t pi = 0; pi < r.n_prompts && !r.bad && pj;
         pi++, pj = engine_json_next(&r.doc, pj)) {
        uint32_t n;
        int32_t *ids = support_ref_ids(&r, 256, &n);
        if (!ids) break;
        const engine_json_node *pname = engine_json_get(&r.doc, pj, "name");
        char label[128];
        snprintf(label, sizeof label, "%s/%s", name, pname ? engine_json_str(&r.doc, pname) : "?");
        support_ref_check_text(&r, m, pj, ids, n, label);

        engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
        sp.kv_type = ENGINE_KV_F32;
        engine_session *s = NULL;
        float *all = malloc((size_t)n * n_vocab * sizeof *all);
        CHECK(engine_session_new(&s, m, &sp) == 0);
        if (s) CHECK(engine_session_append(s, ids, n, all) == 0);

        uint32_t n_pos = support_ref_u32(&r);
        double worst = 0;
        uint32_t worst_pos = 0;
        for (uint32_t k = 0; k < n_pos && !r.bad; k++) {
            uint32_t pos = support_ref_u32(&r);
            if (pos >= n) {
                r.bad = true;
                break;
            }
            double rel = support_ref_compare(&r, all + (size_t)pos * n_vocab, REL_TOL, label, pos);
            if (rel > worst) {
                worst = rel;
                worst_pos = pos;
            }
        }
        printf("%s: %u tokens, worst relative error %.3g at position %u\n", label, n, worst,
               worst_pos);
        if (!(worst <= REL_TOL))
            support_fail("%s: relative error %.3g > %.0e", label, worst, REL_TOL);
        engine_session_free(s);
        free(all);
        free(ids);
    }
    CHECK(!r.bad && r.p == r.end);
    engine_model_free(m);
    support_ref_close(&r);
}

int main(void) {
    int skip = support_init();
    if (skip) return skip;
    const char *src = getenv("SPARK_SOURCE_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/reference", src ? src : ".");
    char tmp[] = "/tmp/spark_test_reference_XXXXXX";
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    run_fixture(dir, "tiny-f32-s1", "tiny", tmp);
    run_fixture(dir, "qwen3-tiny-f32-s1", "qwen3-tiny", tmp);
    rmdir(tmp);
    return support_finish("test_reference_logits");
}
