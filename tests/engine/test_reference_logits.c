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

/* A little-endian reader over the fixture that fails (sets bad) instead of overrunning. */
typedef struct {
    const unsigned char *p, *end;
    bool bad;
} rd;

static uint32_t rd_u32(rd *r) {
    if (r->bad || r->end - r->p < 4) {
        r->bad = true;
        return 0;
    }
    uint32_t v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 |
                 (uint32_t)r->p[3] << 24;
    r->p += 4;
    return v;
}

static float rd_f32(rd *r) {
    uint32_t u = rd_u32(r);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void run_fixture(const char *dir, const char *name, const char *preset, const char *tmp) {
    char path[4096];
    size_t len = 0;

    /* Provenance: the fixture must come from this generator version. */
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    char *meta = support_slurp(path, &len);
    CHECK(meta != NULL);
    if (!meta) return;
    engine_json doc;
    memset(&doc, 0, sizeof doc);
    CHECK(engine_json_parse(&doc, meta, len, path) == 0);
    const engine_json_node *gv = engine_json_get(&doc, &doc.nodes[0], "generator_version");
    const engine_json_node *sd = engine_json_get(&doc, &doc.nodes[0], "seed");
    CHECK(gv && gv->is_int && gv->ival == ENGINE_GEN_VERSION);
    CHECK(sd && sd->is_int);
    uint64_t seed = sd && sd->is_int ? (uint64_t)sd->ival : 0;
    const engine_json_node *prompts = engine_json_get(&doc, &doc.nodes[0], "prompts");
    CHECK(prompts && prompts->type == ENGINE_JSON_ARRAY);

    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    char *bin = support_slurp(path, &len);
    CHECK(bin != NULL && len > 28 && !memcmp(bin, "SPRKREF1", 8));
    if (!bin || len <= 28 || memcmp(bin, "SPRKREF1", 8) || !prompts) {
        free(bin);
        engine_json_deinit(&doc);
        free(meta);
        return;
    }
    rd r = {(const unsigned char *)bin + 8, (const unsigned char *)bin + len, false};
    uint32_t version = rd_u32(&r), n_prompts = rd_u32(&r), n_vocab = rd_u32(&r);
    uint32_t stride = rd_u32(&r), top_k = rd_u32(&r);
    CHECK(version == 1 && n_prompts == prompts->count && n_vocab == 151936 && stride > 0 &&
          top_k > 0 && top_k <= 1024);

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
        free(bin);
        engine_json_deinit(&doc);
        free(meta);
        return;
    }
    CHECK(engine_model_n_vocab(m) == (int32_t)n_vocab);

    const engine_json_node *pj = engine_json_first(&doc, prompts);
    for (uint32_t pi = 0; pi < n_prompts && !r.bad && pj; pi++, pj = engine_json_next(&doc, pj)) {
        uint32_t n = rd_u32(&r);
        if (r.bad || n == 0 || n > 256) {
            r.bad = true;
            break;
        }
        int32_t *ids = malloc(n * sizeof *ids);
        for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)rd_u32(&r);
        const engine_json_node *pname = engine_json_get(&doc, pj, "name");
        const char *label = pname ? engine_json_str(&doc, pname) : "?";

        /* The engine's tokenizer gives the reference's ids for the same text. */
        const engine_json_node *text = engine_json_get(&doc, pj, "text");
        if (text) {
            int32_t got[512];
            size_t n_got = 0;
            CHECK(engine_model_tokenize(m, engine_json_str(&doc, text), text->len, true, got, 512,
                                        &n_got) == 0);
            if (n_got != n || memcmp(got, ids, n * sizeof *ids) != 0) {
                fprintf(stderr, "%s/%s: tokenizer gives %zu ids, the reference %u (or they differ)\n",
                        name, label, n_got, n);
                support_failures++;
            }
        }

        engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
        sp.kv_type = ENGINE_KV_F32;
        engine_session *s = NULL;
        float *all = malloc((size_t)n * n_vocab * sizeof *all);
        CHECK(engine_session_new(&s, m, &sp) == 0);
        if (s) CHECK(engine_session_append(s, ids, n, all) == 0);

        uint32_t n_pos = rd_u32(&r);
        double worst = 0;
        uint32_t worst_pos = 0;
        for (uint32_t k = 0; k < n_pos && !r.bad; k++) {
            uint32_t pos = rd_u32(&r);
            if (pos >= n) {
                r.bad = true;
                break;
            }
            const float *e = all + (size_t)pos * n_vocab;
            double maxref = 0, maxdiff = 0;
            for (uint32_t id = 0; id < n_vocab; id += stride) {
                float ref = rd_f32(&r);
                maxref = fmax(maxref, fabs(ref));
                maxdiff = fmax(maxdiff, fabs((double)e[id] - ref));
            }
            int32_t top_ids[1024];
            float top_vals[1024];
            for (uint32_t i = 0; i < top_k; i++) top_ids[i] = (int32_t)rd_u32(&r);
            for (uint32_t i = 0; i < top_k; i++) top_vals[i] = rd_f32(&r);
            if (r.bad) break;
            for (uint32_t i = 0; i < top_k; i++) {
                if (top_ids[i] < 0 || (uint32_t)top_ids[i] >= n_vocab) {
                    r.bad = true;
                    break;
                }
                maxref = fmax(maxref, fabs(top_vals[i]));
                maxdiff = fmax(maxdiff, fabs((double)e[top_ids[i]] - top_vals[i]));
            }
            double rel = maxref > 0 ? maxdiff / maxref : maxdiff;
            if (rel > worst) {
                worst = rel;
                worst_pos = pos;
            }
            /* Greedy agreement wherever the reference's choice is not a near-tie. */
            int32_t am = 0;
            for (uint32_t id = 1; id < n_vocab; id++)
                if (e[id] > e[am]) am = (int32_t)id;
            if (am != top_ids[0] && top_vals[0] - top_vals[1] > REL_TOL * maxref) {
                fprintf(stderr, "%s/%s pos %u: engine argmax %d, reference %d\n", name, label,
                        pos, am, top_ids[0]);
                support_failures++;
            }
        }
        printf("%s/%s: %u tokens, worst relative error %.3g at position %u\n", name, label, n,
               worst, worst_pos);
        if (!(worst <= REL_TOL)) {
            fprintf(stderr, "%s/%s: relative error %.3g > %.0e\n", name, label, worst, REL_TOL);
            support_failures++;
        }
        engine_session_free(s);
        free(all);
        free(ids);
    }
    CHECK(!r.bad && r.p == r.end);
    engine_model_free(m);
    free(bin);
    engine_json_deinit(&doc);
    free(meta);
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
