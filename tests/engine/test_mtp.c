/* MTP speculative decoding for qwen35moe (engine/model/arch_qwen35moe.c: the MTP block;
 * engine/sample/spec.c: draft, verify, accept, roll back) on the generator's qwen35-tiny model
 * (seed 1, type bf16: a GGUF in BF16 and its HF copy in F32), which carries one MTP block.
 *
 *   load       the GGUF and the HF safetensors copy both load the block; their draft logits
 *              agree (cosine > 0.999: the BF16 matmuls round the activations)
 *   reference  on the HF copy, the MTP block's normed output and the logits of 64 ids, for
 *              the prompt pairs and a chain of 4 steps, against tests/fixtures/reference/
 *              qwen35-tiny-mtp-bf16-s1 (scripts/reference/mtp_ref_qwen35.py: PyTorch with HF's
 *              Qwen3_5Moe decoder layer): <= 1e-4 of the largest reference value
 *   rollback   a checkpoint + truncation inside a verify window, and a truncation back to a
 *              ring snapshot, give the same main logits and the same draft logits (bit for bit)
 *              as a session that never went further
 *   greedy     engine_generate with mtp_draft k emits exactly the tokens of plain greedy
 *              decoding and leaves the session holding the same tokens (the random MTP block's
 *              drafts are all rejected); with an oracle drafter (the true continuation, wrong
 *              every third position) the output is still identical while drafts are both
 *              accepted and rejected. Unit run: k 1 and 4, oracle k 4; --full: k 1..4 on one
 *              prompt and 2 on another, oracle k 1 and 4
 *   rule       the rejection rule on fixed p and q (mismatched, each with tokens the other
 *              lacks): the emitted token's histogram over 200,000 draws against p (chi-square,
 *              7 degrees of freedom, limit 24.3 = p 0.001) and the acceptance rate against
 *              sum min(p, q)
 *   sampling   end to end at temperature 1, top-k 2: the second generated token (the first one
 *              decided by a verify pass: an accepted draft or a correction) over many seeds with
 *              MTP (one draft, drawn from a q uniform over the tokens the target can give there,
 *              so that drafts are both kept and rejected) against plain sampling, chi-square
 *              two-sample test (p 0.001); --full only (test_mtp_full, label slow: 400 seeds)
 *   grammar    a mask hook (ids divisible by 3) with an accept hook: greedy output with MTP
 *              equals plain, and the accept hook saw exactly the emitted tokens
 *   preset     qwen35-35b-a3b-mtp lists blk.40 with the nextn tensors (shapes of the real model)
 *   errors     mtp_draft out of range, a step before MTP is enabled */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "gen/gen.h"
#include "model/arch.h"
#include "model/model_int.h"
#include "sample/spec.h"
#include "support.h"

#define N_CTX 256
#define REL_TOL 1e-4

typedef struct {
    int32_t toks[512];
    int n;
} collect;

static int on_token(void *user, const char *text, size_t len, int32_t token) {
    (void)text;
    (void)len;
    collect *c = user;
    if (token >= 0 && c->n < 512) c->toks[c->n++] = token;
    return 0;
}

static engine_session *mtp_session(engine_model *m, int32_t n_batch) {
    engine_session *s = support_session(m, n_batch, ENGINE_KV_F32);
    bool was = false;
    if (s) CHECK(engine_q35_mtp_enable(s, &was) == 0 && was);
    return s;
}

/* Draft logits of the pair (h_{n-1}, tok) after appending ids[0..n) to a fresh session. */
static bool draft_after(engine_model *m, const int32_t *ids, int32_t n, int32_t tok, float *out) {
    engine_session *s = mtp_session(m, 16);
    bool ok = s && engine_session_append(s, ids, (size_t)n, NULL) == 0 &&
              engine_q35_mtp_step(s, 0, tok, out) == 0;
    engine_session_free(s);
    return ok;
}

static void check_load(engine_model *m, engine_model *mh) {
    CHECK(engine_q35_has_mtp(m));
    CHECK(engine_q35_has_mtp(mh));
    int32_t ids[24], nv = engine_model_n_vocab(m);
    size_t n = support_chat_prompt(m, ids, 24);
    float *a = malloc(sizeof(float) * (size_t)nv), *b = malloc(sizeof(float) * (size_t)nv);
    if (a && b && draft_after(m, ids, (int32_t)n - 1, ids[n - 1], a) &&
        draft_after(mh, ids, (int32_t)n - 1, ids[n - 1], b)) {
        /* the GGUF is BF16 (its matmuls round the activations to BF16), the HF copy F32 */
        double c = support_cosine(a, b, nv);
        printf("draft logits, safetensors vs GGUF (bf16): cosine %.6f\n", c);
        CHECK(c > 0.999);
    } else {
        CHECK(!"draft logits of both formats");
    }
    free(a);
    free(b);
}

/* The fixture: <name>.json (vocab_map, n_embd, prompts with ids, n_main, positions) and
 * <name>.bin (per stored row: the block's normed output, then the logits of vocab_map's ids). */
static void check_reference(engine_model *m, const char *dir) {
    const char *name = "qwen35-tiny-mtp-bf16-s1";
    char path[4200];
    size_t jlen = 0, blen = 0;
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    char *js = support_slurp(path, &jlen);
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    char *bin = support_slurp(path, &blen);
    engine_json doc;
    memset(&doc, 0, sizeof doc);
    if (!js || !bin || engine_json_parse(&doc, js, jlen, path)) {
        support_fail("the MTP reference fixture %s/%s.{json,bin} is missing or unreadable", dir,
                     name);
        free(js);
        free(bin);
        return;
    }
    const engine_json_node *root = &doc.nodes[0];
    const engine_json_node *gv = engine_json_get(&doc, root, "generator_version");
    const engine_json_node *ne = engine_json_get(&doc, root, "n_embd");
    const engine_json_node *vm = engine_json_get(&doc, root, "vocab_map");
    const engine_json_node *prompts = engine_json_get(&doc, root, "prompts");
    int32_t nv = engine_model_n_vocab(m), E = 0, map[64], n_map = 0;
    const engine_json_node *lc = engine_json_get(&doc, root, "layer_check_max_diff");
    CHECK(gv && gv->is_int && gv->ival == ENGINE_GEN_VERSION);
    /* the script drove HF's decoder layer exactly as the model does (mask, RoPE) */
    CHECK(lc && lc->type == ENGINE_JSON_NUMBER && lc->dval < 1e-5);
    if (ne && ne->is_int) E = (int32_t)ne->ival;
    for (const engine_json_node *x = vm ? engine_json_first(&doc, vm) : NULL; x && n_map < 64;
         x = engine_json_next(&doc, x))
        if (x->is_int && x->ival >= 0 && x->ival < nv) map[n_map++] = (int32_t)x->ival;
    engine_model_info info;
    engine_model_info_get(m, &info);
    CHECK(E == info.n_embd && n_map == 64 && prompts);
    const float *rows = (const float *)bin;
    size_t row_floats = (size_t)E + (size_t)n_map, n_rows = blen / (sizeof(float) * row_floats);
    size_t at = 0;
    float *e = malloc(sizeof(float) * (size_t)nv);
    for (const engine_json_node *pj = E == info.n_embd && n_map == 64 && prompts
                                          ? engine_json_first(&doc, prompts)
                                          : NULL;
         pj && e; pj = engine_json_next(&doc, pj)) {
        const engine_json_node *pn = engine_json_get(&doc, pj, "name");
        const engine_json_node *nm = engine_json_get(&doc, pj, "n_main");
        const engine_json_node *ij = engine_json_get(&doc, pj, "ids");
        const engine_json_node *pp = engine_json_get(&doc, pj, "positions");
        int32_t ids[64], n = 0;
        for (const engine_json_node *x = ij ? engine_json_first(&doc, ij) : NULL; x && n < 64;
             x = engine_json_next(&doc, x))
            ids[n++] = x->is_int && x->ival >= 0 && x->ival < nv ? (int32_t)x->ival : 0;
        int32_t n_main = nm && nm->is_int ? (int32_t)nm->ival : 0;
        CHECK(n_main > 1 && n_main < n && pp);
        if (!(n_main > 1 && n_main < n && pp)) break;
        engine_session *s = mtp_session(m, 8);
        int32_t done = 0, chain = 0, worst_pos = -1;
        double worst = 0;
        for (const engine_json_node *x = engine_json_first(&doc, pp); x && s;
             x = engine_json_next(&doc, x)) {
            int32_t pos = x->is_int ? (int32_t)x->ival : -1;
            if (pos < 0 || at >= n_rows || pos + 1 >= n) {
                support_fail("mtp fixture: bad position %d or too few rows", pos);
                break;
            }
            int rc;
            if (pos + 1 < n_main) { /* a prompt pair (h_pos, ids[pos + 1]): uneven chunks */
                CHECK(pos + 1 >= done);
                CHECK(engine_session_append(s, ids + done, (size_t)(pos + 1 - done), NULL) == 0);
                done = pos + 1;
                rc = engine_q35_mtp_step(s, 0, ids[pos + 1], e);
            } else { /* the chain, in order */
                if (done < n_main)
                    CHECK(engine_session_append(s, ids + done, (size_t)(n_main - done), NULL) ==
                          0);
                done = n_main;
                CHECK(pos - (n_main - 1) == chain);
                rc = engine_q35_mtp_step(s, chain, ids[n_main + chain], e);
                chain++;
            }
            CHECK(rc == 0);
            const float *ref = rows + at * row_floats, *h = engine_q35_mtp_hidden(s);
            at++;
            double mh = 0, ml = 0, dh = 0, dl = 0;
            for (int32_t i = 0; i < E && h; i++) {
                mh = fmax(mh, fabs(ref[i]));
                dh = fmax(dh, fabs((double)h[i] - ref[i]));
            }
            for (int32_t i = 0; i < n_map; i++) {
                ml = fmax(ml, fabs(ref[E + i]));
                dl = fmax(dl, fabs((double)e[map[i]] - ref[E + i]));
            }
            double rel = fmax(dh / mh, dl / ml);
            if (!(rel <= worst)) {
                worst = rel;
                worst_pos = pos;
            }
        }
        printf("mtp reference %s: %d + %d tokens, worst relative error %.3g at position %d\n",
               pn ? engine_json_str(&doc, pn) : "?", n_main, n - n_main, worst, worst_pos);
        CHECK(worst <= REL_TOL && chain == n - n_main);
        engine_session_free(s);
    }
    CHECK(at == n_rows && n_rows > 0);
    free(e);
    engine_json_deinit(&doc);
    free(js);
    free(bin);
}

/* Truncation restores the main and the MTP state exactly. */
static void check_rollback(engine_model *m) {
    int32_t nv = engine_model_n_vocab(m), ids[40];
    for (int i = 0; i < 40; i++)
        ids[i] = 1000 + 977 * i % 90000;
    float *a = malloc(sizeof(float) * (size_t)nv), *b = malloc(sizeof(float) * (size_t)nv);
    float *da = malloc(sizeof(float) * (size_t)nv), *db = malloc(sizeof(float) * (size_t)nv);
    engine_session *s = mtp_session(m, 16), *c = mtp_session(m, 16);
    /* (prefix, extra appended after the checkpoint, kept): inside a verify window, and back
     * across a snapshot boundary (16, 32) to a ring snapshot */
    static const int32_t cases[][3] = {{20, 5, 2}, {13, 6, 3}, {30, 8, 1}, {33, 4, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0] && s && c && a && b && da && db;
         ci++) {
        int32_t n0 = cases[ci][0], extra = cases[ci][1], keep = cases[ci][2];
        CHECK(engine_session_truncate(s, 0) == 0 && engine_session_truncate(c, 0) == 0);
        CHECK(engine_session_append(s, ids, (size_t)n0, NULL) == 0);
        engine_q35_checkpoint(s);
        CHECK(engine_session_append(s, ids + n0, (size_t)extra, NULL) == 0);
        CHECK(engine_q35_mtp_step(s, 0, 77, da) == 0 && engine_q35_mtp_step(s, 1, 78, da) == 0);
        CHECK(engine_session_truncate(s, n0 + keep) == 0);
        CHECK(engine_session_append(s, ids + n0 + keep, 1, NULL) == 0);
        memcpy(a, engine_session_logits(s), sizeof(float) * (size_t)nv);
        CHECK(engine_q35_mtp_step(s, 0, 99, da) == 0);
        CHECK(engine_session_append(c, ids, (size_t)(n0 + keep + 1), NULL) == 0);
        memcpy(b, engine_session_logits(c), sizeof(float) * (size_t)nv);
        CHECK(engine_q35_mtp_step(c, 0, 99, db) == 0);
        double d1 = support_max_abs_diff(a, b, nv), d2 = support_max_abs_diff(da, db, nv);
        printf("rollback %d+%d -> %d: main max diff %g, draft max diff %g\n", n0, extra,
               n0 + keep, d1, d2);
        CHECK(d1 == 0 && d2 == 0);
    }
    engine_session_free(s);
    engine_session_free(c);
    free(a);
    free(b);
    free(da);
    free(db);
}

static int gen_tokens(engine_session *s, const int32_t *prompt, size_t n, int32_t k,
                      int32_t max, collect *out, engine_gen_stats *st) {
    engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
    gp.prompt = prompt;
    gp.n_prompt = n;
    gp.max_tokens = max;
    gp.sampling.temperature = 0.0f;
    gp.ignore_eog = true;
    gp.mtp_draft = k;
    out->n = 0;
    return engine_generate(s, &gp, on_token, out, st);
}

/* engine_generate's path with test hooks: a fresh prefill of gp's prompt on s (MTP enabled),
 * then engine_spec_decode_ex. */
static int spec_run(engine_model *m, engine_session *s, const engine_gen_params *gp,
                    const engine_spec_hooks *hooks, collect *out, engine_gen_stats *st) {
    engine_sampler *smp = NULL;
    engine_gen_text g;
    memset(st, 0, sizeof *st);
    out->n = 0;
    int rc = engine_sampler_new(&smp, &gp->sampling, engine_model_n_vocab(m));
    if (rc) return rc;
    if ((rc = engine_gen_text_init(&g, m, gp, on_token, out))) {
        engine_sampler_free(smp);
        return rc;
    }
    rc = engine_session_truncate(s, 0);
    for (size_t i = 0; i < gp->n_prompt && rc == 0; i++)
        rc = engine_sampler_accept(smp, gp->prompt[i], false);
    if (rc == 0) rc = engine_session_append(s, gp->prompt, gp->n_prompt, NULL);
    if (rc == 0) rc = engine_spec_decode_ex(s, gp, smp, &g, st, hooks);
    if (rc == 0) rc = engine_gen_text_finish(&g, &st->stop);
    engine_gen_text_deinit(&g);
    engine_sampler_free(smp);
    return rc;
}

typedef struct {
    const int32_t *all; /* prompt + the plain continuation */
    int32_t n_all;
    int32_t nv;
} oracle;

static void oracle_draft(void *user, int32_t pos, int32_t *tok) {
    const oracle *o = user;
    if (pos < o->n_all) *tok = pos % 3 ? o->all[pos] : (o->all[pos] + 1) % o->nv;
}

/* A grammar stand-in: only ids that are multiples of 3 may come next; the accept hook records
 * what it is given (it must see the emitted tokens only, in order). */
typedef struct {
    int32_t seen[64];
    int n;
} mask3;

static int mask3_mask(void *user, uint32_t *allowed, int32_t n_vocab) {
    (void)user;
    for (int32_t i = 0; i < n_vocab; i += 3)
        allowed[i >> 5] |= 1u << (i & 31);
    return 0;
}

static int mask3_accept(void *user, int32_t token) {
    mask3 *g = user;
    if (g->n < 64) g->seen[g->n++] = token;
    return token % 3 != 0; /* a token the mask excluded aborts */
}

static void check_grammar(engine_model *m) {
    int32_t prompt[17];
    for (int i = 0; i < 17; i++)
        prompt[i] = 700 + 613 * i % 80000;
    engine_session *s = mtp_session(m, 16);
    collect out[2];
    mask3 g[2];
    for (int with = 0; with < 2 && s; with++) {
        engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
        gp.prompt = prompt;
        gp.n_prompt = 17;
        gp.max_tokens = 8;
        gp.ignore_eog = true;
        gp.sampling.temperature = 0.0f;
        gp.sampling.mask = mask3_mask;
        gp.sampling.accept = mask3_accept;
        gp.sampling.grammar_user = &g[with];
        gp.mtp_draft = with ? 3 : 0;
        g[with].n = 0;
        out[with].n = 0;
        engine_gen_stats st;
        CHECK(engine_generate(s, &gp, on_token, &out[with], &st) == 0);
    }
    bool same = out[0].n == 8 && out[1].n == 8 &&
                !memcmp(out[0].toks, out[1].toks, sizeof(int32_t) * 8) && g[1].n == 8 &&
                !memcmp(g[1].seen, out[1].toks, sizeof(int32_t) * 8);
    printf("grammar mask, greedy with and without MTP: %s\n", same ? "identical" : "DIFFERENT");
    CHECK(same);
    engine_session_free(s);
}

static void check_greedy(engine_model *m, bool full) {
    int32_t prompts[3][40];
    size_t lens[3] = {support_chat_prompt(m, prompts[0], 24), 17, 33};
    for (int i = 0; i < 40; i++) {
        prompts[1][i] = 500 + 311 * i % 70000;
        prompts[2][i] = 9000 + 7919 * i % 100000;
    }
    engine_session *plain = support_session(m, 16, ENGINE_KV_F32);
    engine_session *sp = mtp_session(m, 16);
    const int32_t max = 10;
    for (int pi = 0; pi < (full ? 2 : 1) && plain && sp; pi++) {
        collect ref, got;
        engine_gen_stats st;
        CHECK(gen_tokens(plain, prompts[pi], lens[pi], 0, max, &ref, &st) == 0);
        CHECK(ref.n == max && st.spec_steps == 0);
        /* full: k 1..4 on the first prompt, 2 on the second; else k 1 and 4 on the first */
        for (int32_t k = pi ? 2 : 1; k <= (pi ? 2 : 4); k += full || pi ? 1 : 3) {
            CHECK(gen_tokens(sp, prompts[pi], lens[pi], k, max, &got, &st) == 0);
            bool same = got.n == ref.n && !memcmp(got.toks, ref.toks, sizeof(int32_t) * ref.n);
            bool same_session =
                engine_session_n_tokens(sp) == engine_session_n_tokens(plain) &&
                !memcmp(engine_session_tokens(sp), engine_session_tokens(plain),
                        sizeof(int32_t) * (size_t)engine_session_n_tokens(plain));
            int32_t acc = 0, dr = 0;
            for (int i = 0; i < 4; i++) {
                acc += st.spec_accepted_at[i];
                dr += st.spec_drafted_at[i];
            }
            printf("greedy prompt %d, k %d: %s, %d verify steps, %d/%d drafts accepted\n", pi,
                   k, same && same_session ? "identical" : "DIFFERENT", st.spec_steps,
                   st.spec_accepted, st.spec_drafted);
            CHECK(same && same_session && st.stop == ENGINE_STOP_LENGTH);
            CHECK(st.spec_steps > 0 && st.spec_drafted > 0 && acc == st.spec_accepted &&
                  dr == st.spec_drafted && st.spec_accepted <= st.spec_drafted);
        }
        /* the oracle drafter: mostly right, wrong every third position */
        int32_t all[80];
        memcpy(all, prompts[pi], sizeof(int32_t) * lens[pi]);
        memcpy(all + lens[pi], ref.toks, sizeof(int32_t) * (size_t)ref.n);
        oracle o = {all, (int32_t)lens[pi] + ref.n, engine_model_n_vocab(m)};
        engine_spec_hooks hooks = {oracle_draft, NULL, &o};
        for (int32_t k = full ? 1 : 4; k <= 4 && pi == 0; k += 3) {
            engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
            gp.prompt = prompts[pi];
            gp.n_prompt = lens[pi];
            gp.max_tokens = max;
            gp.sampling.temperature = 0.0f;
            gp.ignore_eog = true;
            gp.mtp_draft = k;
            engine_gen_stats os;
            CHECK(spec_run(m, sp, &gp, &hooks, &got, &os) == 0);
            bool same = got.n == ref.n && !memcmp(got.toks, ref.toks, sizeof(int32_t) * ref.n);
            printf("oracle drafts, prompt %d, k %d: %s, %d/%d accepted in %d steps\n", pi, k,
                   same ? "identical" : "DIFFERENT", os.spec_accepted, os.spec_drafted,
                   os.spec_steps);
            CHECK(same && os.spec_accepted > 0 && os.spec_accepted < os.spec_drafted);
            CHECK(engine_session_n_tokens(sp) == engine_session_n_tokens(plain) &&
                  !memcmp(engine_session_tokens(sp), engine_session_tokens(plain),
                          sizeof(int32_t) * (size_t)engine_session_n_tokens(plain)));
        }
    }
    engine_session_free(plain);
    engine_session_free(sp);
}

/* Chi-square of counts against expected probabilities (cells with p = 0 must stay empty). */
static double chi2_fit(const long *cnt, const double *p, int n, long total, int *bad_zero) {
    double x = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] == 0) {
            *bad_zero += cnt[i] != 0;
            continue;
        }
        double e = p[i] * (double)total;
        x += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    return x;
}

static void check_rule(void) {
    enum { NV = 8 };
    const float p[NV] = {0.3f, 0.2f, 0.15f, 0.1f, 0.1f, 0.1f, 0.05f, 0.0f};
    const float q[NV] = {0.05f, 0.05f, 0.1f, 0.1f, 0.2f, 0.2f, 0.0f, 0.3f};
    engine_sampling_params sp = ENGINE_SAMPLING_PARAMS_INIT;
    sp.seed = 7;
    engine_sampler *smp = NULL;
    CHECK(engine_sampler_new(&smp, &sp, NV) == 0);
    if (!smp) return;
    long cnt[NV] = {0}, kept = 0;
    const long N = 200000;
    uint64_t x = 12345;
    for (long t = 0; t < N; t++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(x >> 11) * 0x1.0p-53, acc = 0;
        int32_t d = NV - 1;
        for (int32_t j = 0; j < NV; j++) {
            acc += q[j];
            if (u < acc && q[j] > 0) {
                d = j;
                break;
            }
        }
        bool keep;
        int32_t tok = engine_spec_accept(smp, p, q, d, NV, &keep);
        kept += keep;
        if (tok >= 0 && tok < NV) cnt[tok]++;
    }
    double pe[NV], overlap = 0;
    for (int i = 0; i < NV; i++) {
        pe[i] = p[i];
        overlap += fmin(p[i], q[i]);
    }
    int bad_zero = 0;
    double chi = chi2_fit(cnt, pe, NV, N, &bad_zero);
    double rate = (double)kept / (double)N;
    printf("rejection rule: chi-square %.2f (7 df, limit 24.3), acceptance %.4f (sum min(p, q) "
           "%.4f)\n",
           chi, rate, overlap);
    CHECK(chi < 24.3 && bad_zero == 0 && fabs(rate - overlap) < 0.005);
    engine_sampler_free(smp);
}

/* The draft distribution of the sampling test: uniform over the tokens the target can give
 * at the second position (the union of its top-2 after each possible first token), so that
 * drafts are often kept and the residual norm(max(0, p - q)) is not simply p. */
typedef struct {
    int32_t ids[8];
    int n;
} uniq;

static void uniq_q(void *user, int32_t pos, float *q, int32_t n_vocab) {
    (void)pos;
    const uniq *u = user;
    memset(q, 0, sizeof(float) * (size_t)n_vocab);
    for (int i = 0; i < u->n; i++)
        q[u->ids[i]] = 1.0f / (float)u->n;
}

static void top2(const float *l, int32_t nv, int32_t *a, int32_t *b) {
    *a = support_argmax(l, nv);
    *b = *a ? 0 : 1;
    for (int32_t i = 0; i < nv; i++)
        if (i != *a && l[i] > l[*b]) *b = i;
}

/* The second generated token with and without MTP over many seeds: same distribution. */
static void check_sampling(engine_model *m, int n_seeds) {
    int32_t prompt[17];
    for (int i = 0; i < 17; i++)
        prompt[i] = 3000 + 401 * i % 50000;
    int32_t nv = engine_model_n_vocab(m);
    engine_session *s = mtp_session(m, 16), *plain = support_session(m, 16, ENGINE_KV_F32);
    uniq u = {.n = 0};
    if (s) { /* the first token's top 2, then the top 2 after each */
        int32_t f[2], a, b;
        CHECK(engine_session_append(s, prompt, 17, NULL) == 0);
        top2(engine_session_logits(s), nv, &f[0], &f[1]);
        for (int j = 0; j < 2; j++) {
            CHECK(engine_session_append(s, &f[j], 1, NULL) == 0);
            top2(engine_session_logits(s), nv, &a, &b);
            int32_t c[2] = {a, b};
            for (int k = 0; k < 2; k++) {
                int i = 0;
                while (i < u.n && u.ids[i] != c[k])
                    i++;
                if (i == u.n) u.ids[u.n++] = c[k];
            }
            CHECK(engine_session_truncate(s, 17) == 0);
        }
    }
    engine_spec_hooks hooks = {NULL, uniq_q, &u};
    enum { CELLS = 8 };
    int32_t ids[CELLS];
    long ca[CELLS] = {0}, cb[CELLS] = {0};
    int n_ids = 0, overflow = 0;
    int32_t drafted = 0, accepted = 0;
    for (int seed = 0; seed < n_seeds && s && plain; seed++) {
        for (int with = 0; with < 2; with++) {
            engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
            gp.prompt = prompt;
            gp.n_prompt = 17;
            gp.max_tokens = 2;
            gp.ignore_eog = true;
            gp.sampling.temperature = 1.0f;
            gp.sampling.top_k = 2;
            gp.sampling.top_p = 1.0f;
            gp.sampling.min_p = 0.0f;
            gp.sampling.seed = (uint64_t)seed * 2654435761u + 17;
            gp.mtp_draft = with ? 2 : 0;
            collect c = {.n = 0};
            engine_gen_stats st;
            int rc = with ? spec_run(m, s, &gp, &hooks, &c, &st)
                          : engine_generate(plain, &gp, on_token, &c, &st);
            CHECK(rc == 0 && c.n == 2);
            if (c.n != 2) continue;
            drafted += st.spec_drafted;
            accepted += st.spec_accepted;
            int j = 0;
            while (j < n_ids && ids[j] != c.toks[1])
                j++;
            if (j == n_ids) {
                if (n_ids == CELLS) {
                    overflow++;
                    continue;
                }
                ids[n_ids++] = c.toks[1];
            }
            (with ? cb : ca)[j]++;
        }
    }
    /* two-sample chi-square over the cells with expected counts >= 5 (the rest pooled) */
    double chi = 0;
    int df = -1;
    long pa = 0, pb = 0;
    for (int j = 0; j < n_ids; j++) {
        if (ca[j] + cb[j] < 10) {
            pa += ca[j];
            pb += cb[j];
            continue;
        }
        double e = (ca[j] + cb[j]) / 2.0;
        chi += (ca[j] - e) * (ca[j] - e) / e + (cb[j] - e) * (cb[j] - e) / e;
        df++;
    }
    if (pa + pb > 0) {
        double e = (pa + pb) / 2.0;
        chi += (pa - e) * (pa - e) / e + (pb - e) * (pb - e) / e;
        df++;
    }
    /* chi-square 0.999 quantiles for 1..7 degrees of freedom */
    static const double lim[8] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};
    printf("sampling, second token over %d seeds: %d distinct, chi-square %.2f (%d df), drafts "
           "(uniform over the %d possible tokens) accepted %d/%d\n",
           n_seeds, n_ids, chi, df, u.n, accepted, drafted);
    CHECK(overflow == 0 && df >= 1 && df <= 7 && chi < lim[df >= 1 && df <= 7 ? df : 0]);
    CHECK(u.n >= 2 && accepted > 0 && accepted < drafted);
    engine_session_free(s);
    engine_session_free(plain);
}

/* The real shape with its MTP block: the tensors a converter writes for it (blk.40). */
static void check_preset(void) {
    const engine_arch_preset *pr = engine_arch_preset_find("qwen35-35b-a3b-mtp");
    const engine_arch_preset *p0 = engine_arch_preset_find("qwen35-35b-a3b");
    CHECK(pr && p0 && pr->hp.n_nextn == 1 && p0->hp.n_nextn == 0);
    if (!pr || !p0) return;
    engine_tensor_desc *d = NULL, *d0 = NULL;
    size_t n = 0, n0 = 0;
    CHECK(engine_arch_tensors(&pr->hp, &d, &n) == 0 && engine_arch_tensors(&p0->hp, &d0, &n0) == 0);
    int found = 0;
    for (size_t i = 0; d && i < n; i++) {
        const engine_tensor_desc *t = &d[i];
        if (!strcmp(t->name, "blk.40.nextn.eh_proj.weight"))
            found += t->ne[0] == 4096 && t->ne[1] == 2048;
        if (!strcmp(t->name, "blk.40.nextn.shared_head_norm.weight")) found += t->is_norm;
        if (!strcmp(t->name, "blk.40.attn_q.weight")) found += t->ne[1] == 2 * 16 * 256;
        if (!strcmp(t->name, "blk.40.ffn_gate_exps.weight")) found += t->ne[2] == 256;
    }
    uint64_t tot = 0, tot0 = 0, act = 0, act0 = 0;
    engine_arch_param_count(&pr->hp, &tot, &act);
    engine_arch_param_count(&p0->hp, &tot0, &act0);
    printf("qwen35-35b-a3b-mtp: %zu tensors (%zu without MTP), %llu parameters (+%llu)\n", n, n0,
           (unsigned long long)tot, (unsigned long long)(tot - tot0));
    CHECK(found == 4 && n == n0 + 20 && act == act0 && tot > tot0);
    free(d);
    free(d0);
}

static void check_errors(engine_model *m) {
    engine_session *s = support_session(m, 16, ENGINE_KV_F32);
    int32_t ids[4] = {10, 20, 30, 40};
    collect c;
    engine_gen_stats st;
    CHECK(s && gen_tokens(s, ids, 4, 5, 4, &c, &st) == ENGINE_EINVAL);
    CHECK(s && gen_tokens(s, ids, 4, -1, 4, &c, &st) == ENGINE_EINVAL);
    float *l = malloc(sizeof(float) * (size_t)engine_model_n_vocab(m));
    /* no MTP state before enabling */
    CHECK(s && l && engine_q35_mtp_step(s, 0, 1, l) == ENGINE_EINVAL);
    free(l);
    engine_session_free(s);
}

int main(int argc, char **argv) {
    int skip = support_init();
    if (skip) return skip;
    /* default: the unit run (small enough for ASan); --full: every greedy case (k 1..4 on one
     * prompt, 2 on another), the oracle at k 1 and 4, and the end-to-end sampling comparison
     * over --sampling N seeds (default 400) */
    bool full = false;
    int n_seeds = 400;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--full")) full = true;
        else if (!strcmp(argv[i], "--sampling") && i + 1 < argc) n_seeds = atoi(argv[++i]);
    }
    if (n_seeds < 10) n_seeds = 10;
    check_rule();
    check_preset();
    char tmp[512];
    if (support_tmpdir(tmp, sizeof tmp, "mtp", true)) return 1;
    char path[600], sdir[600];
    snprintf(path, sizeof path, "%s/qwen35-tiny.gguf", tmp);
    snprintf(sdir, sizeof sdir, "%s/hf", tmp);
    engine_model_gen_params gp;
    support_gen_params(&gp, "qwen35-tiny", "bf16", 1, path);
    gp.safetensors_dir = sdir;
    if (engine_model_gen(&gp) == 0) {
        const char *src = getenv("SPARK_SOURCE_DIR");
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/tests/fixtures/reference", src ? src : ".");
        engine_model *m = support_load(path, 2, N_CTX, ENGINE_DEVICE_CPU);
        engine_model *mh = support_load(sdir, 2, N_CTX, ENGINE_DEVICE_CPU);
        if (m && mh) check_load(m, mh);
        engine_model_free(m);
        /* the rest on the HF copy: F32 values (the reference's arithmetic), F32 matmuls */
        if (mh) {
            double t0 = engine_time_ms();
            check_reference(mh, dir);
            check_rollback(mh);
            check_errors(mh);
            double t1 = engine_time_ms();
            check_greedy(mh, full);
            check_grammar(mh);
            double t2 = engine_time_ms();
            if (full) check_sampling(mh, n_seeds);
            printf("times: reference+rollback %.0f ms, greedy+grammar %.0f ms, sampling %.0f ms\n",
                   t1 - t0, t2 - t1, engine_time_ms() - t2);
        }
        engine_model_free(mh);
    } else {
        support_fail("gen qwen35-tiny: %s", engine_error_last());
    }
    unlink(path);
    support_rmtree(tmp);
    return support_finish("test_mtp");
}
