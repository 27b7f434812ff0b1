/* MTP speculative decoding for qwen35moe on the CUDA backend: the session side (contracts in
 * q35_mtp.h). Included at the end of qwen35.cu (it works on that file's model and session
 * records); the kernels it adds are in q35_verify.cu.
 *
 * A verify pass of m tokens (one CUDA graph per m) at positions p0 .. p0+m-1, the tokens and
 * positions in device memory (vstep[m]):
 *   embed m | per block: DeltaNet: [qkv|z|ba] x m (one launch, weights read once) | m delta
 *     steps (each also stores the state after its token in slot (pos + 1) % VMAX of vsnap) |
 *     out_proj x m (+= residual); attention: [q|gate], k, v x m | m causal attention launches
 *     (each stores its KV row, then attends to 0..pos) | o_proj x m;
 *     MoE: router + shared gate x m | routed up (token, slot) in one launch | shared up |
 *     shared gate | down (+ combine + residual) in one launch
 *   head x m (logits of every token) | argmax of each | final norm -> hbuf rows 1..m
 *   MTP feed: the pairs (hbuf row t, token t) at positions max(p0 - 1 + t, 0) through the MTP
 *     block (its own KV; at p0 = 0 pair 0 is overwritten by pair 1 at position 0).
 * hbuf row 0 holds h_{n-1} of the session's last token (the first pair's hidden state).
 * A draft step (graphs for step 0 and for later steps): embed the token of dstep, [enorm(e) |
 * hnorm(h)] with h = hbuf row 0 (step 0) or the previous step's output, fc, the block's
 * attention at dstep.pos and MoE, the shared final norm -> mtp_h, head, greedy sample (dstep
 * advances, the draft lands in dtok).
 * Prompts (appends of at least pf_min tokens without per-token logits, SPARK_CUDA_MTP_PREFILL)
 * go through the session's prefill instead (q35_prefill.cu: the chunked pass of the main model,
 * which feeds the block's KV rows over the same positions; contract in q35_prefill.cuh). */
extern "C" {
#include "cuda/q35_mtp.h"
}
#include "q35_verify.cuh"

static_assert(ENGINE_CUDA_Q35_VMAX == ENGINE_CU_VMAX, "one verify width");

#define Q35M_NBUF 32

struct q35_spec {
    bool on;
    void *bufs[Q35M_NBUF];
    int n_bufs;
    void *mk, *mv;                /* the MTP block's KV [n_ctx][n_kv hd] */
    float *vsnap;                 /* [VMAX][ring | state] after each token of the last pass */
    float *hbuf;                  /* [VMAX + 1][E] */
    float *mtp_h;                 /* [E] the last draft step's normed output */
    float *snap_hid;              /* [SNAPSHOTS][E] h of the token before each snapshot */
    float *X2; /* [VMAX][E]: the MTP feed's residual when it runs beside the head */
    float *X, *emb, *cat, *big, *z, *ba, *k, *v, *att, *router, *shl, *h, *wts, *logits, *ascr;
    int32_t *ids, *y, *dtok;
    engine_cu_step *vstep, *dstep; /* device */
    engine_cu_spec_ctl *ctl;       /* device */
    uint8_t *pinned;               /* host: h_vstep[VMAX], h_dstep, h_ctl */
    engine_cu_step *h_vstep, *h_dstep;
    engine_cu_spec_ctl *h_ctl;
    size_t sbig, sz, sba, skv, satt, sh, sw; /* per-token strides (floats) */
    cudaGraphExec_t verify[ENGINE_CU_VMAX + 1], draft[2], fast[ENGINE_CU_VMAX];
    int32_t win_p0, win_m; /* the last pass's window (win_m 0: none) */
    unsigned fused;        /* Q35M_FUSED_* parts of the verify pass in one launch for all m */
    int32_t pf_min;        /* appends of at least this many tokens go through the prefill (0: no) */
    unsigned diag;         /* SPARK_CUDA_MTP_DIAG_SKIP: Q35M_DIAG_* ops verify passes leave out */
    unsigned diag_now;     /* diag while the verify pass's main stack is being enqueued, else 0 */
    unsigned diag_draft;   /* SPARK_CUDA_MTP_DIAG_DRAFT: Q35M_DIAG_* ops draft steps leave out */
    float *vssq;           /* [VMAX][nv][dv / 32]: the fused DeltaNet step's sums of squares */
    float *vpart;          /* [VMAX][nh][runners][hd + 2]: the fused attention's partials */
    /* SPARK_CUDA_MTP_MOE=dec: the MoE of the m tokens on the decode kernels, the tokens as a
     * grid dimension (moe.cuh m); the session's router fusion (s->rf) always takes them for
     * the main blocks */
    bool moe_dec;
    /* SPARK_CUDA_MTP_RF: the router fusion's launch of a verify pass (engine_cu_rf_args.seq):
     * 2 (default, "vec"): the decode grid, each block doing the m tokens at once; 1 ("seq"): the
     * tokens in turn in each block; 0 ("grid"): the tokens as a grid dimension */
    int rf_seq;
    bool serial_stage; /* SPARK_CUDA_MTP_STAGE=serial: engine_cu_vmv.serial_stage */
    /* SPARK_CUDA_MTP_MOE_WAVE (default 3; 0: off): the MoE launches of m > 1 tokens on the
     * decode kernels (q35m_moe_dec) take at most this many blocks per multiprocessor in all
     * (engine_cu_ffn_up_args.tok_blocks = SMs * N / m), one wave instead of m decode grids */
    int moe_wave;
    /* SPARK_CUDA_MTP_FORK=0: the verify pass's shared-expert gate/up after the routed one and
     * the DeltaNet z projection in the in-projections' launch, instead of on the decode step's
     * side branch (s->sh_fork, s->z_fork) */
    bool no_fork;
    /* SPARK_CUDA_MTP_FEED_FORK=0: the verify pass's MTP feed after the head instead of beside
     * it on the side branch */
    bool feed_fork;
    int mv_r3; /* the session's engine_cu_mv.r3 (SPARK_CUDA_MV_R3), for the verify's matvecs */
    float *ao; /* [VMAX][E]: the router fusion's output projections (q35m_rf_out) */
};

#define Q35M_FUSED_DELTA 1u /* one DeltaNet launch for the m tokens (q35_vdelta.cu) */
#define Q35M_FUSED_MOE 2u   /* MoE up / down blocks serving all m tokens (q35_verify.cu) */
#define Q35M_FUSED_ATTN 4u  /* the m queries of the gated attention in one launch (q35_vatt.cu) */
#define Q35M_FUSED_PF 8u    /* the matvec blocks ask L1 for all m vectors before staging them */
#define Q35M_FUSED_FEED 16u /* the verify pass's MTP feed computes only the block's KV rows */
#define Q35M_FUSED_SPLIT 32u /* matvecs of few row groups take the tokens as a grid dimension */
/* Not in "1" / "all" (they replace parts of it: tok the m-vector matvecs, dn the fused delta's
 * per-token alternative); test_cuda_mtp runs them as a set of their own. */
#define Q35M_FUSED_HEAD 64u  /* the heads: the decode matvec per token, tokens as a grid dim */
#define Q35M_FUSED_TOK 128u  /* every matvec of the passes so (the heads included) */
#define Q35M_FUSED_DN 256u   /* per-token DeltaNet steps with the decode's early reads / cluster */
#define Q35M_FUSED_HSEQ 512u /* the heads: the decode's grid, the tokens in turn in each block */
#define Q35M_FUSED_AEARLY 1024u /* per-query attention with the decode's early L2 prefetch */
#define Q35M_FUSED_DN2 2048u /* as dn, later tokens launched as usual, waiting before the reads */
#define Q35M_FUSED_H3 4096u  /* the heads' m-vector matvec with registers for 3 blocks per SM */
#define Q35M_FUSED_DEC1 8192u /* passes of one token (draft, verify m = 1): the decode matvecs */
#define Q35M_FUSED_FATT 16384u /* the feed's block without o_proj and MoE (its KV rows alone) */
#define Q35M_FUSED_H4 32768u  /* the heads' m-vector matvec with four rows per warp (over h3) */
/* "dearly" (implies delta): the one DeltaNet launch as the decode's early cluster kernel
 * (state before the wait, one reduction for the l2 norms, the RMSNorm through the cluster), for
 * passes of m >= 2 tokens; a pass of one token takes the per-token launch (dn / dn2 as set).
 * In the default since session 10 (call 5, full Qwen3.5-35B-A3B-MTP Q4_K_M, `bench_q35 M -n 32
 * -r 1 -M "SPARK_CUDA_MTP_FUSED=dec1,split,h3,fatt,dearly;...,delta"`, verify m = 1..5 in us):
 * the then default (dn2) 2213 3644 4677 5718 7020, dearly 2337 3649 4597 5546 6765 (m = 1
 * then still on it), the old one-launch delta 2419 3796 4830 5823 7024. */
#define Q35M_FUSED_DEARLY 65536u
/* The default (SPARK_CUDA_MTP_FUSED unset or empty), from GPU call 2 of session 6 (8-block cut
 * of the 35B-A3B shape, verify m = 1..5 in us, KV-only feed in all; the feed itself stays
 * whole-block, see below): "split" 816 1133 1401 1728 2076 (draft 310); the decode matvec for
 * the heads ("head") 743 1114 1443 1817 2214 (draft 226) and for every matvec ("tok") 729 1141
 * 1509 1906 2349 (draft 216): best at m = 1 (the m-vector kernel took 218 us for the draft's
 * head), worse from m = 2 (m times the unpacking: 124 / 229 / 341 us for the head at m = 1 /
 * 2 / 3); "h3" 779 1091 1358 1689 2034, the best head from m = 2; "dn" 800 1104 1363 1675 2016,
 * "dn2" 799 1102 1357 1664 2000. So: dec1 for passes of one token, else split with h3, and dn2;
 * the feed "fatt" (the whole block's own KV stores, o_proj and MoE left out; the KV-only feed's
 * flaky difference of session 5 keeps that opt-in). Call 3 (router fusion on, plain 555 us):
 * this default 643 1274 1649 2116 2585 (draft 217) against "0"'s 821 1420 1834 2344 2863
 * (draft 310); with "h4" instead of "h3" 645 1313 1689 2159 2629; with "feed" 632 1242 1606
 * 2060 2520. */
#define Q35M_FUSED_DEFAULT                                                                         \
    (Q35M_FUSED_DEC1 | Q35M_FUSED_SPLIT | Q35M_FUSED_H3 | Q35M_FUSED_DN2 | Q35M_FUSED_FATT |      \
     Q35M_FUSED_DELTA | Q35M_FUSED_DEARLY)
#define Q35M_FUSED_ALL                                                                             \
    (Q35M_FUSED_DELTA | Q35M_FUSED_MOE | Q35M_FUSED_ATTN | Q35M_FUSED_PF | Q35M_FUSED_FEED |      \
     Q35M_FUSED_SPLIT | Q35M_FUSED_H3 | Q35M_FUSED_H4)

/* Whether a pass of m tokens runs its DeltaNet steps as one launch (q35_vdelta.cu): "delta",
 * or "dearly" from two tokens on, for conv widths K the launch takes. */
static bool q35m_vdelta_on(const q35_spec *sp, int m, int K) {
    return (sp->fused & Q35M_FUSED_DELTA) && !((sp->fused & Q35M_FUSED_DEARLY) && m == 1) &&
           engine_cu_vdelta_ok(K);
}

/* SPARK_CUDA_MTP_FUSED (read when a session first turns MTP on): unset or empty: the default
 * parts (Q35M_FUSED_DEFAULT: dec1, split, h3, dn2, fatt, dearly); "0": every part per token as
 * the decode step with the m-vector matvecs and the whole MTP block in the feed; "1" or "all":
 * every fused part; else a comma list of parts ("delta", "dearly", "moe", "attn", "pf", "feed",
 * "split", "h3", "h4", and outside "1": "head", "tok", "dn", "dn2", "hseq", "aearly", "dec1",
 * "fatt"; "feed" wins over "fatt", "delta" (and "dearly" from m = 2 on) over "dn" / "dn2", "dn"
 * over "dn2", "attn" over "aearly",
 * "tok" (and "dec1" at m = 1) over "pf" / "split", "hseq" over "head" / "tok" over "h4" over
 * "h3" for the heads).
 * Unknown names are logged and ignored. ("feed" was the default for GPU call 2 of session 5,
 * where its f32 KV rows differed from the whole block's after verify passes of 3, 4, 5, 1, 2
 * (bit for bit in call 1 and for q4_k_m): back off until test_cuda_mtp's check_feed says which
 * side is wrong.) */
static unsigned q35m_fused_env(void) {
    const char *e = getenv("SPARK_CUDA_MTP_FUSED");
    if (!e || !*e) return Q35M_FUSED_DEFAULT;
    if (!strcmp(e, "0")) return 0;
    if (!strcmp(e, "1") || !strcmp(e, "all")) return Q35M_FUSED_ALL;
    unsigned f = 0;
    for (const char *p = e; *p;) {
        const size_t n = strcspn(p, ",");
        if (n == 5 && !strncmp(p, "delta", 5))
            f |= Q35M_FUSED_DELTA;
        else if (n == 6 && !strncmp(p, "dearly", 6))
            f |= Q35M_FUSED_DELTA | Q35M_FUSED_DEARLY;
        else if (n == 3 && !strncmp(p, "moe", 3))
            f |= Q35M_FUSED_MOE;
        else if (n == 4 && !strncmp(p, "attn", 4))
            f |= Q35M_FUSED_ATTN;
        else if (n == 2 && !strncmp(p, "pf", 2))
            f |= Q35M_FUSED_PF;
        else if (n == 4 && !strncmp(p, "feed", 4))
            f |= Q35M_FUSED_FEED;
        else if (n == 5 && !strncmp(p, "split", 5))
            f |= Q35M_FUSED_SPLIT;
        else if (n == 4 && !strncmp(p, "head", 4))
            f |= Q35M_FUSED_HEAD;
        else if (n == 3 && !strncmp(p, "tok", 3))
            f |= Q35M_FUSED_TOK;
        else if (n == 2 && !strncmp(p, "dn", 2))
            f |= Q35M_FUSED_DN;
        else if (n == 4 && !strncmp(p, "hseq", 4))
            f |= Q35M_FUSED_HSEQ;
        else if (n == 6 && !strncmp(p, "aearly", 6))
            f |= Q35M_FUSED_AEARLY;
        else if (n == 3 && !strncmp(p, "dn2", 3))
            f |= Q35M_FUSED_DN2;
        else if (n == 2 && !strncmp(p, "h3", 2))
            f |= Q35M_FUSED_H3;
        else if (n == 4 && !strncmp(p, "dec1", 4))
            f |= Q35M_FUSED_DEC1;
        else if (n == 4 && !strncmp(p, "fatt", 4))
            f |= Q35M_FUSED_FATT;
        else if (n == 2 && !strncmp(p, "h4", 2))
            f |= Q35M_FUSED_H4;
        else if (n)
            engine_log(ENGINE_LOG_INFO, "cuda: SPARK_CUDA_MTP_FUSED: unknown part '%.*s' ignored",
                       (int)n, p);
        p += n + (p[n] == ',');
    }
    return f;
}

/* SPARK_CUDA_MTP_MOE (read when a session first turns MTP on): "dec": the verify pass's MoE
 * (up, shared up, down) runs the decode step's kernels with the m tokens as a grid dimension
 * (q35m_moe_dec: each token's blocks are a decode launch's, bit for bit by construction, the
 * tokens in parallel); unset, empty, "0" or anything else: the verify kernels (q35_verify.cu:
 * each block serves the m tokens serially). With the router fusion (SPARK_CUDA_Q35_ROUTER_FUSE,
 * the default) the main blocks take the decode kernels either way (their RF mode). Opt-in: GPU
 * call 2 of session 6 (8-block cut, with "split") measured no gain, 1249 / 1535 / 1902 us at
 * m = 2 / 3 / 4 against 1234 / 1526 / 1880: at m >= 2 the m decode MoEs (256 up blocks a
 * token) no longer fit one wave, which costs what the verify kernels' serial dots cost. */
static bool q35m_moe_env(void) {
    const char *e = getenv("SPARK_CUDA_MTP_MOE");
    return e && !strcmp(e, "dec");
}

/* SPARK_CUDA_MTP_RF (read when a session first turns MTP on; with the router fusion): unset,
 * empty or "vec" (other values too): the verify pass's fused output projection + router launch
 * keeps the decode step's grid and each block does the m tokens at once, every weight loaded
 * once (session 8); "seq": the decode step's grid, each block doing the m tokens in turn (its
 * weights loaded again per token); "grid": the tokens as a grid dimension (m times the
 * blocks). All three bit for bit the decode step's launches. GPU call 2 of session 6
 * (8-block cut, with "split"): the grid dimension cost 1420 us at m = 2 against 1234 unfused
 * (824 vs 888 at m = 1): at m >= 2 its blocks no longer fit one wave, and the second wave's
 * [R | M] rows (6.3 MB a block) are read after the first wave's instead of before the launch's
 * wait. Call 3 (with the parts dec1,split,h4,dn2,fatt): "seq" 646 1260 1565 1957 2347 us at
 * m = 1..5 against the grid's 645 1313 1689 2159 2629; bit for bit (test_cuda_mtp). */
static int q35m_rf_env(void) {
    const char *e = getenv("SPARK_CUDA_MTP_RF");
    return e && !strcmp(e, "grid") ? 0 : e && !strcmp(e, "seq") ? 1 : 2;
}

/* Appends of at least this many tokens (without per-token logits) go through the session's
 * prefill by default: measured on the H200 with bench_q35 -P, the prefill's speed against
 * verify passes of 5 is, on an 8-block cut of the 35B-A3B shape, 0.81x at 8 tokens, 1.17x at 12,
 * 1.40x at 16, and on the full model (b19cda6) 0.62x at 8, 0.89x at 12, 1.09x at 16, 1.36x at 24:
 * the full model's crossover (~14) sets it. */
#define Q35M_PF_MIN 16

/* SPARK_CUDA_MTP_PREFILL (read when a session first turns MTP on): unset, empty or "1": appends
 * of at least Q35M_PF_MIN tokens without per-token logits go through the session's prefill
 * (q35_prefill.cu), which also feeds the MTP block; "0": every append goes through verify
 * passes; N > 1: appends of at least N tokens go through the prefill. */
static int32_t q35m_pf_min_env(void) {
    const char *e = getenv("SPARK_CUDA_MTP_PREFILL");
    if (!e || !*e) return Q35M_PF_MIN;
    if (!strcmp(e, "0")) return 0;
    const long v = strtol(e, NULL, 10);
    if (v > 1) return (int32_t)std::min(v, (long)INT32_MAX);
    if (v != 1)
        engine_log(ENGINE_LOG_INFO, "cuda: SPARK_CUDA_MTP_PREFILL=%s: not a number, taken as 1", e);
    return Q35M_PF_MIN;
}

/* Diagnosis only (wrong results): SPARK_CUDA_MTP_DIAG_SKIP, read when a session first turns MTP
 * on, a bit mask of the verify pass's launch kinds left out of its graphs, so that an A/B of the
 * verify timing (bench_q35 -M "SPARK_CUDA_MTP_DIAG_SKIP=4") gives each kind's cost on the
 * graph's critical path. The draft step ignores it; SPARK_CUDA_MTP_DIAG_DRAFT is the draft
 * step's mask (EMBED: embedding, norms and fc; AT_QKV, AT, AT_O, ROUTER, UP, DOWN: the block;
 * HEAD: the head; ARGMAX: the final norm and the sample). */
enum {
    Q35M_DIAG_EMBED = 1,     /* the m tokens' embeddings */
    Q35M_DIAG_DN_IN = 2,     /* DeltaNet in-projections qkv|z|beta|alpha */
    Q35M_DIAG_DN_STEP = 4,   /* DeltaNet steps (per token, or the fused launch) */
    Q35M_DIAG_DN_OUT = 8,    /* DeltaNet out_proj */
    Q35M_DIAG_AT_QKV = 16,   /* attention [q|gate], k, v */
    Q35M_DIAG_AT = 32,       /* gated attention (per query, or fused + merge) */
    Q35M_DIAG_AT_O = 64,     /* attention o_proj */
    Q35M_DIAG_ROUTER = 128,  /* router + shared-expert gate logit */
    Q35M_DIAG_UP = 256,      /* MoE gate/up, routed and shared */
    Q35M_DIAG_DOWN = 512,    /* MoE down (+ the shared gate's launch) */
    Q35M_DIAG_HEAD = 1024,   /* the head over the m tokens */
    Q35M_DIAG_ARGMAX = 2048, /* argmax of each row + the final norm into hbuf */
    Q35M_DIAG_FEED = 4096,   /* the MTP feed */
    Q35M_DIAG_RING = 8192,   /* the fused DeltaNet's ring commit */
};

/* Whether the verify pass being enqueued runs ops of diagnosis kind `bit`. */
static bool q35m_run(const q35_spec *sp, unsigned bit) {
    return !(sp->diag_now & bit);
}

/* Floats of one query's partials in the fused attention. */
static size_t q35m_vpart_stride(const q35_dims *d, int n_ctx) {
    return (size_t)d->nh * (size_t)engine_cu_vgatt_runners(n_ctx) * (size_t)(d->hd + 2);
}

static void q35m_free(engine_cuda_q35_session *s) {
    q35_spec *sp = s->spec;
    if (!sp) return;
    cudaSetDevice(s->cm->device);
    for (int i = 0; i <= ENGINE_CU_VMAX; i++)
        if (sp->verify[i]) cudaGraphExecDestroy(sp->verify[i]);
    for (int i = 0; i < ENGINE_CU_VMAX; i++)
        if (sp->fast[i]) cudaGraphExecDestroy(sp->fast[i]);
    for (int i = 0; i < 2; i++)
        if (sp->draft[i]) cudaGraphExecDestroy(sp->draft[i]);
    for (int i = 0; i < sp->n_bufs; i++)
        cudaFree(sp->bufs[i]);
    cudaFreeHost(sp->pinned);
    free(sp);
    s->spec = NULL;
}

/* The model's MTP block: blk.<n_layer> as layers[n_layer] (uploaded by q35_upload_all's loop)
 * and the fc / norms here. */
static void q35_mtp_upload(q35_up *u) {
    engine_cuda_q35_model *cm = u->cm;
    engine_weight eh;
    const float *en = NULL, *hn = NULL, *nm = NULL;
    if (!cm->has_mtp || !engine_q35_mtp_weights(cm->m, &eh, &en, &hn, &nm)) return;
    const size_t E = (size_t)cm->d.E;
    cm->mtp_eh = q35_put_w(u, &eh);
    cm->mtp_enorm = q35_put_f(u, en, E);
    cm->mtp_hnorm = q35_put_f(u, hn, E);
    cm->mtp_norm = q35_put_f(u, nm, E);
}

/* Whether the block can run here: its weights as q35_check's, and every dense matrix's m
 * staged vectors within the shared memory of one block. Logs why not and turns MTP off. */
static int q35_mtp_check(engine_cuda_q35_model *cm) {
    const engine_model *m = cm->m;
    const q35_dims *d = &cm->d;
    engine_weight eh;
    const float *en, *hn, *nm;
    cm->has_mtp = engine_q35_has_mtp(m) && engine_q35_mtp_weights(m, &eh, &en, &hn, &nm);
    if (!cm->has_mtp) return 0;
    int rc = q35_check_w(m, &eh, (uint32_t)d->n_layer, "nextn.eh_proj");
    if (rc) return rc;
    size_t worst = 0;
    for (int l = 0; l <= d->n_layer; l++) {
        engine_q35_layer_w w;
        engine_q35_layer_weights(m, (uint32_t)l, &w);
        const engine_weight *mats[] = {w.attn ? &w.wq : &w.wqkv, w.attn ? &w.wo : &w.wout,
                                       &w.gate_inp, &m->output};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            worst = std::max(worst, engine_cu_vmatvec_smem(mats[i]->type, (int)mats[i]->cols,
                                                           ENGINE_CU_VMAX));
        worst = std::max(worst, engine_cu_vmatvec_smem(ENGINE_TYPE_F32, d->E, ENGINE_CU_VMAX));
    }
    worst = std::max(worst, engine_cu_vmatvec_smem(eh.type, (int)eh.cols, ENGINE_CU_VMAX));
    if (worst > Q35_MAX_STAGE_BYTES) {
        engine_log(ENGINE_LOG_INFO,
                   "cuda: %s: MTP off (a verify pass of %d tokens would stage %zu bytes of "
                   "activations per block, at most %d)",
                   m->path, ENGINE_CU_VMAX, worst, Q35_MAX_STAGE_BYTES);
        cm->has_mtp = false;
    }
    return 0;
}

extern "C" bool engine_cuda_q35_mtp_view_get(engine_cuda_q35_session *s,
                                             engine_cu_q35_mtp_view *o) {
    const engine_cuda_q35_model *cm = s->cm;
    if (!cm->has_mtp) return false;
    memset(o, 0, sizeof *o);
    engine_cuda_q35_layer_get(s, cm->d.n_layer, &o->ly);
    o->eh = q35_wview(&cm->mtp_eh, 1);
    o->enorm = cm->mtp_enorm;
    o->hnorm = cm->mtp_hnorm;
    q35_spec *sp = s->spec;
    if (sp && sp->on) {
        o->on = true;
        o->k_cache = sp->mk;
        o->v_cache = sp->mv;
        o->hbuf = sp->hbuf;
        o->snap_hid = sp->snap_hid;
        o->win_m = &sp->win_m;
    }
    return true;
}

extern "C" void engine_cuda_q35_prefill_set(engine_cuda_q35_session *s,
                                            engine_cuda_q35_prefill *p) {
    s->pf = p;
}

extern "C" engine_cuda_q35_prefill *engine_cuda_q35_prefill_get(engine_cuda_q35_session *s) {
    return s->pf;
}

extern "C" bool engine_cuda_q35_has_mtp(const engine_cuda_q35_model *cm) {
    return cm && cm->has_mtp;
}

static bool q35m_on(const engine_cuda_q35_session *s) {
    return s && s->spec && s->spec->on;
}

extern "C" bool engine_cuda_q35_mtp_on(const engine_cuda_q35_session *s) {
    return q35m_on(s);
}

static void *q35m_alloc(q35_spec *sp, size_t bytes, int *rc) {
    void *p = NULL;
    if (*rc) return NULL;
    if (sp->n_bufs == Q35M_NBUF) {
        *rc = engine_err(ENGINE_EINTERNAL, "cuda MTP: too many buffers");
        return NULL;
    }
    *rc = q35_cu_err(cudaMalloc(&p, bytes ? bytes : 4), "cudaMalloc (MTP)");
    if (*rc) return NULL;
    sp->bufs[sp->n_bufs++] = p;
    *rc = q35_cu_err(cudaMemset(p, 0, bytes ? bytes : 4), "cudaMemset (MTP)");
    return p;
}

extern "C" int engine_cuda_q35_mtp_enable(engine_cuda_q35_session *s, bool *was_off) {
    *was_off = false;
    engine_cuda_q35_model *cm = s->cm;
    const q35_dims *d = &cm->d;
    if (!cm->has_mtp)
        return engine_err(ENGINE_EUNSUPPORTED,
                          "%s has no MTP block the CUDA backend can run (nextn_predict_layers / "
                          "mtp.* tensors): speculative decoding with MTP is unavailable",
                          cm->m->path);
    if (s->spec) {
        *was_off = !s->spec->on;
        s->spec->on = true;
        return 0;
    }
    int rc = 0;
    CU(cudaSetDevice(cm->device));
    {
        q35_spec *sp = (q35_spec *)calloc(1, sizeof *sp);
        if (!sp) return engine_err(ENGINE_ENOMEM, "out of memory");
        s->spec = sp;
        const size_t f = sizeof(float), V = ENGINE_CU_VMAX, E = (size_t)d->E;
        const size_t kvd = (size_t)d->nkv * d->hd, elt = s->kv == ENGINE_KV_F32 ? 4 : 2;
        sp->sbig = std::max((size_t)d->C, 2 * (size_t)d->nh * d->hd);
        sp->sz = (size_t)d->di;
        sp->sba = 2 * (size_t)d->nv;
        sp->skv = kvd;
        sp->satt = std::max((size_t)d->nh * d->hd, (size_t)d->di);
        sp->sh = (size_t)d->k * d->F + (size_t)std::max(d->F, d->Fs);
        sp->sw = (size_t)d->k + 1;
        sp->mk = q35m_alloc(sp, (size_t)s->n_ctx * kvd * elt, &rc);
        sp->mv = q35m_alloc(sp, (size_t)s->n_ctx * kvd * elt, &rc);
        sp->vsnap = (float *)q35m_alloc(sp, f * V * s->snap_stride, &rc);
        sp->hbuf = (float *)q35m_alloc(sp, f * (V + 1) * E, &rc);
        sp->mtp_h = (float *)q35m_alloc(sp, f * E, &rc);
        sp->snap_hid = (float *)q35m_alloc(sp, f * ENGINE_CUDA_Q35_SNAPSHOTS * E, &rc);
        sp->X = (float *)q35m_alloc(sp, f * V * E, &rc);
        sp->X2 = (float *)q35m_alloc(sp, f * V * E, &rc);
        sp->emb = (float *)q35m_alloc(sp, f * V * E, &rc);
        sp->cat = (float *)q35m_alloc(sp, f * V * 2 * E, &rc);
        sp->big = (float *)q35m_alloc(sp, f * V * sp->sbig, &rc);
        sp->z = (float *)q35m_alloc(sp, f * V * sp->sz, &rc);
        sp->ba = (float *)q35m_alloc(sp, f * V * sp->sba, &rc);
        sp->k = (float *)q35m_alloc(sp, f * V * kvd, &rc);
        sp->v = (float *)q35m_alloc(sp, f * V * kvd, &rc);
        sp->att = (float *)q35m_alloc(sp, f * V * sp->satt, &rc);
        /* + 1 a token: the router fusion's raw shared-gate logit */
        sp->router = (float *)q35m_alloc(sp, f * V * (d->X + 1), &rc);
        sp->ao = (float *)q35m_alloc(sp, f * V * E, &rc);
        sp->shl = (float *)q35m_alloc(sp, f * V, &rc);
        sp->h = (float *)q35m_alloc(sp, f * V * sp->sh, &rc);
        sp->wts = (float *)q35m_alloc(sp, f * V * sp->sw, &rc);
        sp->ids = (int32_t *)q35m_alloc(sp, sizeof(int32_t) * V * sp->sw, &rc);
        sp->logits = (float *)q35m_alloc(sp, f * V * d->V, &rc);
        sp->ascr = (float *)q35m_alloc(sp, f * 2 * ENGINE_CU_VARGMAX_BLOCKS * V, &rc);
        sp->y = (int32_t *)q35m_alloc(sp, sizeof(int32_t) * V, &rc);
        sp->dtok = (int32_t *)q35m_alloc(sp, sizeof(int32_t) * V, &rc);
        sp->vstep = (engine_cu_step *)q35m_alloc(sp, sizeof(engine_cu_step) * V, &rc);
        sp->dstep = (engine_cu_step *)q35m_alloc(sp, sizeof(engine_cu_step), &rc);
        sp->ctl = (engine_cu_spec_ctl *)q35m_alloc(sp, sizeof(engine_cu_spec_ctl), &rc);
        sp->fused = q35m_fused_env();
        sp->pf_min = q35m_pf_min_env();
        sp->moe_dec = q35m_moe_env();
        sp->rf_seq = q35m_rf_env();
        {
            const char *e = getenv("SPARK_CUDA_MTP_STAGE");
            sp->serial_stage = e && !strcmp(e, "serial");
            e = getenv("SPARK_CUDA_MTP_MOE_WAVE");
            sp->moe_wave = e && *e ? (int)strtol(e, NULL, 10) : 3;
            if (sp->moe_wave < 0) sp->moe_wave = 0;
            e = getenv("SPARK_CUDA_MTP_FORK");
            sp->no_fork = e && e[0] == '0';
            e = getenv("SPARK_CUDA_MTP_FEED_FORK");
            sp->feed_fork = !(e && e[0] == '0');
            sp->mv_r3 = s->mv_r3;
        }
        {
            const char *e = getenv("SPARK_CUDA_MTP_DIAG_SKIP");
            sp->diag = e ? (unsigned)strtoul(e, NULL, 0) : 0u;
            e = getenv("SPARK_CUDA_MTP_DIAG_DRAFT");
            sp->diag_draft = e ? (unsigned)strtoul(e, NULL, 0) : 0u;
        }
        if (sp->fused & Q35M_FUSED_DELTA)
            sp->vssq = (float *)q35m_alloc(sp, f * V * d->nv * (size_t)(d->dv / 32), &rc);
        if (sp->fused & Q35M_FUSED_ATTN)
            sp->vpart = (float *)q35m_alloc(sp, f * V * q35m_vpart_stride(d, s->n_ctx), &rc);
        if (rc) goto done;
        const size_t pb = sizeof(engine_cu_step) * (V + 1) + sizeof(engine_cu_spec_ctl);
        CU(cudaMallocHost((void **)&sp->pinned, pb));
        memset(sp->pinned, 0, pb);
        sp->h_vstep = (engine_cu_step *)sp->pinned;
        sp->h_dstep = sp->h_vstep + V;
        sp->h_ctl = (engine_cu_spec_ctl *)(sp->h_dstep + 1);
        sp->on = true;
        *was_off = true;
        engine_log(ENGINE_LOG_INFO,
                   "cuda: MTP on (qwen35moe): block KV %.1f MiB, per-token states of a verify "
                   "pass %.1f MiB, fused parts 0x%x, MoE on the %s kernels, router fusion %s%s, "
                   "prompts of >= %d tokens through the prefill (0: none), diagnosis skip 0x%x",
                   2.0 * (double)((size_t)s->n_ctx * kvd * elt) / 1048576.0,
                   (double)(f * V * s->snap_stride) / 1048576.0, sp->fused,
                   sp->moe_dec ? "decode" : "verify", s->rf ? "on" : "off",
                   !s->rf              ? ""
                   : sp->rf_seq == 2   ? " (tokens at once)"
                   : sp->rf_seq == 1   ? " (tokens in turn)"
                                       : " (tokens as a grid dimension)",
                   sp->pf_min, sp->diag);
    }
done:
    if (rc) q35m_free(s);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Enqueueing a pass
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    int m;
    const int32_t *pos; /* device: token t's position at pos + t * pstride */
    size_t pstride;
} q35m_pass;

static engine_cu_vmv q35m_vmv(const float *x, size_t xs, int cols, const float *norm_w, float eps,
                              int m, int coop) {
    engine_cu_vmv v;
    memset(&v, 0, sizeof v);
    v.mv.coop = coop; /* the decode step's setting (q35_mv): verify == decode bit for bit */
    v.mv.cols = cols;
    v.mv.x = x;
    v.mv.norm_w = norm_w;
    v.mv.eps = eps;
    v.m = m;
    v.x_stride = xs;
    return v;
}

static void q35m_add(engine_cu_vmv *v, const q35_w *w, float *y, size_t ys, int acc) {
    v->mv.m[v->mv.n_mat] = q35_mat(w, y, acc);
    v->y_stride[v->mv.n_mat++] = ys;
}

/* engine_cu_vmatvec with the session's fused "pf" part: the m vectors asked of L1 at once;
 * with "tok" (with "dec1": in passes of one token) the decode matvec per token, the tokens as a
 * grid dimension. */
static void q35m_vmatvec(const q35_spec *sp, engine_cu_vmv *v, cudaStream_t st) {
    v->mv.r3 = sp->mv_r3; /* the decode step's (SPARK_CUDA_MV_R3) */
    if ((sp->fused & Q35M_FUSED_TOK) || ((sp->fused & Q35M_FUSED_DEC1) && v->m == 1)) {
        engine_cu_vmatvec_tok(v, st);
        return;
    }
    v->prefetch = (sp->fused & Q35M_FUSED_PF) ? 1 : 0;
    v->serial_stage = sp->serial_stage ? 1 : 0;
    v->split = (sp->fused & Q35M_FUSED_SPLIT) ? 1 : 0; /* the router: 20 us per block at m = 2 */
    engine_cu_vmatvec(v, st);
}

/* A head (verify pass or draft step): with "head" (or "tok") the decode matvec per token, with
 * "hseq" the decode's grid doing the tokens in turn, with "h3" the m-vector matvec compiled for
 * 3 blocks per SM. */
static void q35m_vhead(const q35_spec *sp, engine_cu_vmv *v, cudaStream_t st) {
    if (sp->fused & Q35M_FUSED_HSEQ) {
        engine_cu_vmatvec_seq(v, st);
    } else if (sp->fused & Q35M_FUSED_HEAD) {
        engine_cu_vmatvec_tok(v, st);
    } else {
        v->dense = (sp->fused & Q35M_FUSED_H4) ? 2 : (sp->fused & Q35M_FUSED_H3) ? 1 : 0;
        q35m_vmatvec(sp, v, st);
    }
}

/* Whether the verify pass runs block ly with the router fusion: the session's rf (the decode
 * step's), main blocks only (the MTP block, layers[n_layer], has no [R | M]: it stays unfused
 * in the verify feed and the drafts alike). */
static bool q35m_rf(const engine_cuda_q35_session *s, const q35_cl *ly) {
    return s->rf && ly - s->cm->layers < s->cm->d.n_layer;
}

/* Router fusion for the m tokens of a verify pass: the decode step's launch (q35_rf_out) with
 * the tokens as a grid dimension: token t's att row projected into its ao row (X keeps the
 * residual), its raw router and shared-gate logits of X_t + ao_t into router + t (X + 1). */
static void q35m_rf_out(engine_cuda_q35_session *s, const q35_cl *ly, int m) {
    const q35_dims *d = &s->cm->d;
    q35_spec *sp = s->spec;
    engine_cu_rf_args a = q35_rf_args(s, ly, sp->X, sp->att, sp->ao, sp->router);
    a.m = m;
    a.x_stride = (size_t)d->E;
    a.att_stride = sp->satt;
    a.ao_stride = (size_t)d->E;
    a.raw_stride = (size_t)d->X + 1;
    a.seq = sp->rf_seq;
    engine_cu_rf_wo(&a, s->stream);
}

static void q35m_deltanet(engine_cuda_q35_session *s, const q35_cl *ly, float eps,
                          const q35m_pass *ps) {
    const engine_cuda_q35_model *cm = s->cm;
    const q35_dims *d = &cm->d;
    q35_spec *sp = s->spec;
    cudaStream_t st = s->stream;
    const size_t E = (size_t)d->E;
    /* z on the side branch, as the decode step (its SPARK_CUDA_Q35_Z_FORK) */
    const bool zf = s->z_fork && !sp->no_fork && q35m_run(sp, Q35M_DIAG_DN_IN);
    engine_cu_vmv in = q35m_vmv(sp->X, E, d->E, ly->attn_norm, eps, ps->m, s->coop_mv);
    q35m_add(&in, &ly->wqkv, sp->big, sp->sbig, 0);
    if (zf) {
        engine_cu_vmv zv = q35m_vmv(sp->X, E, d->E, ly->attn_norm, eps, ps->m, s->coop_mv);
        q35m_add(&zv, &ly->wz, sp->z, sp->sz, 0);
        cudaEventRecord(s->ev_fork, st);
        cudaStreamWaitEvent(s->side, s->ev_fork, 0);
        q35m_vmatvec(sp, &zv, s->side);
        cudaEventRecord(s->ev_join, s->side);
    } else {
        q35m_add(&in, &ly->wz, sp->z, sp->sz, 0);
    }
    q35m_add(&in, &ly->wba, sp->ba, sp->sba, 0);
    if (q35m_run(sp, Q35M_DIAG_DN_IN)) q35m_vmatvec(sp, &in, st);
    if (!ly->ba_fused && q35m_run(sp, Q35M_DIAG_DN_IN)) {
        engine_cu_vmv al = q35m_vmv(sp->X, E, d->E, ly->attn_norm, eps, ps->m, s->coop_mv);
        q35m_add(&al, &ly->walpha, sp->ba + d->nv, sp->sba, 0);
        q35m_vmatvec(sp, &al, st);
    }
    if (zf) cudaStreamWaitEvent(st, s->ev_join, 0); /* the step reads z */
    const bool step = q35m_run(sp, Q35M_DIAG_DN_STEP);
    const bool vd = q35m_vdelta_on(sp, ps->m, d->K);
    if (step && vd) { /* verify passes only: consecutive positions */
        engine_cu_vdelta a;
        a.d = q35_delta_args(s, ly, eps);
        a.d.qkv = sp->big;
        a.d.z = sp->z;
        a.d.beta = sp->ba;
        a.d.alpha = sp->ba + d->nv;
        a.d.snap_ring = sp->vsnap + (size_t)ly->slot * s->ring_per;
        a.d.snap_state =
            sp->vsnap + s->ring_per * (size_t)cm->n_lin + (size_t)ly->slot * s->state_per;
        a.d.snap_stride = s->snap_stride;
        a.d.snap_every = 1;
        a.d.n_snap = ENGINE_CU_VMAX;
        a.d.pos = ps->pos;
        a.d.out = sp->att;
        a.m = ps->m;
        a.qkv_stride = sp->sbig;
        a.z_stride = sp->sz;
        a.ba_stride = sp->sba;
        a.out_stride = sp->satt;
        a.ssq = sp->vssq;
        /* "dearly": the state read before the wait, as "dn" does for a pass's first token: no
         * kernel of the pass writes it before this launch */
        a.d.early = (sp->fused & Q35M_FUSED_DEARLY) ? 2 : 0;
        engine_cu_vdelta_step(&a, st);
    }
    for (int t = 0; step && t < ps->m && !vd; t++) {
        engine_cu_delta a = q35_delta_args(s, ly, eps);
        a.qkv = sp->big + (size_t)t * sp->sbig;
        a.z = sp->z + (size_t)t * sp->sz;
        a.beta = sp->ba + (size_t)t * sp->sba;
        a.alpha = a.beta + d->nv;
        /* the state after every token, in slot (pos + 1) % VMAX */
        a.snap_ring = sp->vsnap + (size_t)ly->slot * s->ring_per;
        a.snap_state =
            sp->vsnap + s->ring_per * (size_t)cm->n_lin + (size_t)ly->slot * s->state_per;
        a.snap_stride = s->snap_stride;
        a.snap_every = 1;
        a.n_snap = ENGINE_CU_VMAX;
        a.pos = ps->pos + (size_t)t * ps->pstride;
        a.out = sp->att + (size_t)t * sp->satt;
        if (sp->fused & (Q35M_FUSED_DN | Q35M_FUSED_DN2)) {
            /* "dn": the decode step's launch (early reads of state, ring, position and weights
             * before the wait; with 2 the head's norm through a cluster). Token 0's are safe as
             * in the decode step: no kernel of the pass writes them before it (the state and
             * ring: the previous pass or the restore, finished graphs; the positions: the host
             * or, in the greedy loop, the step's first spec_prep, complete before the serial
             * second one starts). Later tokens read what the previous token's launch writes:
             * launched serially, they start once it is complete ("dn2": launched as usual,
             * they wait before those reads). */
            a.early = s->dn_early;
            a.serial = t == 0 ? 0 : (sp->fused & Q35M_FUSED_DN) ? 1 : 2;
        }
        engine_cu_deltanet_step(&a, st);
    }
    if (q35m_rf(s, ly)) { /* out_proj into ao + the raw router logits, per token */
        if (q35m_run(sp, Q35M_DIAG_DN_OUT)) q35m_rf_out(s, ly, ps->m);
        return;
    }
    engine_cu_vmv o = q35m_vmv(sp->att, sp->satt, d->di, NULL, 0.0f, ps->m, s->coop_mv);
    q35m_add(&o, &ly->wout, sp->X, E, 1);
    if (q35m_run(sp, Q35M_DIAG_DN_OUT)) q35m_vmatvec(sp, &o, st);
}

static void q35m_attention(engine_cuda_q35_session *s, const q35_cl *ly, float eps,
                           const q35m_pass *ps, void *kc, void *vc) {
    const q35_dims *d = &s->cm->d;
    q35_spec *sp = s->spec;
    cudaStream_t st = s->stream;
    const size_t E = (size_t)d->E;
    engine_cu_vmv in = q35m_vmv(sp->X, E, d->E, ly->attn_norm, eps, ps->m, s->coop_mv);
    q35m_add(&in, &ly->wq, sp->big, sp->sbig, 0);
    q35m_add(&in, &ly->wk, sp->k, sp->skv, 0);
    q35m_add(&in, &ly->wv, sp->v, sp->skv, 0);
    if (q35m_run(sp, Q35M_DIAG_AT_QKV)) q35m_vmatvec(sp, &in, st);
    const bool att = q35m_run(sp, Q35M_DIAG_AT);
    if (att && (sp->fused & Q35M_FUSED_ATTN)) {
        engine_cu_vgatt a;
        a.a = q35_gatt_args(s, ly, eps, kc, vc);
        a.a.qg = sp->big;
        a.a.k = sp->k;
        a.a.v = sp->v;
        a.a.pos = ps->pos;
        a.a.out = sp->att;
        a.m = ps->m;
        a.runners = engine_cu_vgatt_runners(s->n_ctx);
        a.pos_stride = ps->pstride;
        a.qg_stride = sp->sbig;
        a.kv_stride = sp->skv;
        a.out_stride = sp->satt;
        a.partial_stride = q35m_vpart_stride(d, s->n_ctx);
        a.partial = sp->vpart;
        engine_cu_vgatt_run(&a, st);
    }
    for (int t = 0; att && t < ps->m && !(sp->fused & Q35M_FUSED_ATTN); t++) {
        /* causal: token t's KV row is stored before t + 1 reads */
        engine_cu_gatt a = q35_gatt_args(s, ly, eps, kc, vc);
        a.qg = sp->big + (size_t)t * sp->sbig;
        a.k = sp->k + (size_t)t * sp->skv;
        a.v = sp->v + (size_t)t * sp->skv;
        a.pos = ps->pos + (size_t)t * ps->pstride;
        a.out = sp->att + (size_t)t * sp->satt;
        /* "aearly": the decode's L2 prefetch of the rows before pos, before the wait (a hint:
         * a position not yet final there only moves which lines are asked for) */
        if ((sp->fused & Q35M_FUSED_AEARLY) && s->att_early && a.short_n > 0)
            a.short_n |= ENGINE_CU_GATT_EARLY;
        engine_cu_gatt_run(&a, st);
    }
    if (q35m_rf(s, ly)) { /* o_proj into ao + the raw router logits, per token */
        if (q35m_run(sp, Q35M_DIAG_AT_O)) q35m_rf_out(s, ly, ps->m);
        return;
    }
    engine_cu_vmv o = q35m_vmv(sp->att, sp->satt, d->nh * d->hd, NULL, 0.0f, ps->m, s->coop_mv);
    q35m_add(&o, &ly->wo, sp->X, E, 1);
    if (q35m_run(sp, Q35M_DIAG_AT_O)) q35m_vmatvec(sp, &o, st);
}

/* The verify pass's MoE up arguments (routed, shared) and down arguments (routed, and the
 * shared expert's own when it is not merged into the routed stack as expert X). */
static void q35m_ffn_args(const engine_cuda_q35_session *s, const q35_cl *ly, float eps,
                          engine_cu_ffn_up_args *up, engine_cu_ffn_up_args *sh,
                          engine_cu_ffn_down_args *dn, engine_cu_ffn_down_args *dsh) {
    const q35_dims *d = &s->cm->d;
    q35_spec *sp = s->spec;
    *up = q35_up_args(d, ly, eps, false);
    up->router = sp->router;
    up->x = sp->X;
    up->h = sp->h;
    up->ids = sp->ids;
    up->weights = sp->wts;
    *sh = q35_up_args(d, ly, eps, true);
    up->route = s->route; /* the decode step's routing and scale: verify == decode bit for bit */
    up->coop = sh->coop = s->coop;
    sh->x = sp->X;
    sh->h = sp->h + (size_t)d->k * d->F;
    memset(dn, 0, sizeof *dn);
    dn->down = ly->down_exps.d;
    dn->expert_bytes = q35_mat_bytes(&ly->down_exps);
    dn->row_bytes = ly->down_exps.row_bytes;
    dn->type = ly->down_exps.type;
    dn->cols = d->F;
    dn->rows = d->E;
    dn->k = ly->down_merged ? d->k + 1 : d->k;
    dn->h = sp->h;
    dn->ids = sp->ids;
    dn->weights = sp->wts;
    dn->y = sp->X;
    dn->pf_bulk = (s->route & ENGINE_CU_ROUTE_BULK) != 0;
    dn->tma = (s->route & ENGINE_CU_ROUTE_TMA_DN) != 0;
    *dsh = *dn;
    dsh->down = ly->down_sh.d;
    dsh->expert_bytes = 0;
    dsh->row_bytes = ly->down_sh.row_bytes;
    dsh->type = ly->down_sh.type;
    dsh->cols = d->Fs;
    dsh->k = 1;
    dsh->h = sp->h + (size_t)d->k * d->F;
    dsh->ids = sp->ids + d->k;
    dsh->weights = sp->wts + d->k;
}

/* The MoE of m tokens with blocks serving all m (fused "moe"): routed and shared up in one
 * launch when they stage alike, the shared expert's gate inside the down launch (no vshgate).
 * False (nothing enqueued) when a block's staged vectors would not fit. */
static bool q35m_moe_all(engine_cuda_q35_session *s, const q35_cl *ly, float eps, int m) {
    const q35_dims *d = &s->cm->d;
    q35_spec *sp = s->spec;
    cudaStream_t st = s->stream;
    const size_t E = (size_t)d->E, lim = ENGINE_CU_VFFN_ALL_SMEM;
    engine_cu_ffn_up_args up, sh;
    engine_cu_ffn_down_args dn, dsh;
    q35m_ffn_args(s, ly, eps, &up, &sh, &dn, &dsh);
    if (!(sp->fused & Q35M_FUSED_MOE) || engine_cu_vffn_all_smem(up.type, up.cols, m) > lim ||
        engine_cu_vffn_all_smem(sh.type, sh.cols, m) > lim ||
        engine_cu_vffn_all_smem(dn.type, dn.k * dn.cols, m) > lim ||
        (!ly->down_merged && engine_cu_vffn_all_smem(dsh.type, dsh.cols, m) > lim))
        return false;
    const bool same = engine_cu_x_mode(sh.type) == engine_cu_x_mode(up.type);
    if (q35m_run(sp, Q35M_DIAG_UP))
        engine_cu_vffn_up_all(&up, same ? &sh : NULL, m, (size_t)d->X, E, sp->sh, sp->sw, st);
    if (q35m_run(sp, Q35M_DIAG_UP) && !same)
        engine_cu_vffn_up_all(&sh, NULL, m, 0, E, sp->sh, 0, st);
    if (ly->down_merged) { /* slot k: the shared expert, stored as expert X */
        dn.sh_logit = sp->shl;
        dn.sh_id = d->X;
    }
    if (!q35m_run(sp, Q35M_DIAG_DOWN)) return true;
    engine_cu_vffn_down_all(&dn, m, sp->sh, sp->sw, E, 1, st);
    if (!ly->down_merged) {
        dsh.ids = NULL;
        dsh.weights = NULL;
        dsh.sh_logit = sp->shl;
        dsh.sh_id = 0;
        engine_cu_vffn_down_all(&dsh, m, sp->sh, sp->sw, E, 1, st);
    }
    return true;
}

/* The MoE of the m tokens on the decode step's kernels (q35_moe's launches) with the tokens as a
 * grid dimension (SPARK_CUDA_MTP_MOE=dec, and every main block with the router fusion): token
 * t's blocks run the decode blocks on its rows (X, router, shl, h, ids / wts, ao), so each
 * token's MoE is the decode step's bit for bit, the tokens in parallel. rf: the router fusion's
 * mode (the FFN input X + ao, the raw logits scaled in the routing, the shared gate's into shl,
 * the down launch adding ao), as q35_moe with s->rf. */
static void q35m_moe_dec(engine_cuda_q35_session *s, const q35_cl *ly, float eps, int m, bool rf) {
    const q35_dims *d = &s->cm->d;
    q35_spec *sp = s->spec;
    cudaStream_t st = s->stream;
    const size_t E = (size_t)d->E;
    engine_cu_ffn_up_args up, sh;
    engine_cu_ffn_down_args dn, dsh;
    q35m_ffn_args(s, ly, eps, &up, &sh, &dn, &dsh);
    up.m = sh.m = m;
    const int tb = sp->moe_wave > 0 && m > 1 ? std::max(1, engine_cu_sm_count() * sp->moe_wave / m)
                                             : 0;
    up.tok_blocks = sh.tok_blocks = tb;
    up.x_stride = sh.x_stride = E;
    up.router_stride = rf ? (size_t)d->X + 1 : (size_t)d->X;
    up.h_stride = sh.h_stride = sp->sh;
    up.ids_stride = sp->sw;
    if (rf) {
        up.x_add = sh.x_add = sp->ao;
        up.rf_sh = sp->shl;
    }
    /* the shared expert's gate/up on the side branch, as the decode step (its
     * SPARK_CUDA_Q35_SH_FORK): beside the routed launch instead of after it */
    const bool fork = s->sh_fork && !sp->no_fork;
    if (q35m_run(sp, Q35M_DIAG_UP)) {
        if (fork) {
            cudaEventRecord(s->ev_fork, st);
            cudaStreamWaitEvent(s->side, s->ev_fork, 0);
            engine_cu_ffn_up(&sh, s->side);
            cudaEventRecord(s->ev_join, s->side);
        }
        engine_cu_ffn_up(&up, st);
        if (fork)
            cudaStreamWaitEvent(st, s->ev_join, 0); /* the down launch reads both parts of h */
        else
            engine_cu_ffn_up(&sh, st);
    }
    if (!q35m_run(sp, Q35M_DIAG_DOWN)) return;
    dn.m = dsh.m = m;
    dn.tok_blocks = dsh.tok_blocks = tb;
    dn.h_stride = dsh.h_stride = sp->sh;
    dn.ids_stride = sp->sw;
    dn.y_stride = dsh.y_stride = E;
    dn.y_add = rf ? sp->ao : NULL; /* the first down launch adds the mixer's output */
    if (ly->down_merged) { /* slot k: the shared expert, stored as expert X */
        dn.sh_logit = sp->shl;
        dn.sh_id = d->X;
    }
    engine_cu_ffn_down(&dn, st);
    if (!ly->down_merged) {
        dsh.ids = NULL;
        dsh.weights = NULL;
        dsh.sh_logit = sp->shl;
        dsh.sh_id = 0;
        engine_cu_ffn_down(&dsh, st);
    }
}

static void q35m_moe(engine_cuda_q35_session *s, const q35_cl *ly, float eps, int m) {
    const q35_dims *d = &s->cm->d;
    q35_spec *sp = s->spec;
    cudaStream_t st = s->stream;
    const size_t E = (size_t)d->E;
    if (q35m_rf(s, ly)) { /* the logits came with the output projection (q35m_rf_out) */
        q35m_moe_dec(s, ly, eps, m, true);
        return;
    }
    engine_cu_vmv r = q35m_vmv(sp->X, E, d->E, ly->post_norm, eps, m, s->coop_mv);
    q35m_add(&r, &ly->router, sp->router, (size_t)d->X, 0);
    q35m_add(&r, &ly->shg, sp->shl, 1, 0);
    if (q35m_run(sp, Q35M_DIAG_ROUTER)) q35m_vmatvec(sp, &r, st);
    if (sp->moe_dec) {
        q35m_moe_dec(s, ly, eps, m, false);
        return;
    }
    if (q35m_moe_all(s, ly, eps, m)) return;
    engine_cu_ffn_up_args up, sh;
    engine_cu_ffn_down_args dn, dsh;
    q35m_ffn_args(s, ly, eps, &up, &sh, &dn, &dsh);
    if (q35m_run(sp, Q35M_DIAG_UP)) {
        engine_cu_vffn_up(&up, m, (size_t)d->X, E, sp->sh, sp->sw, st);
        engine_cu_vffn_up(&sh, m, 0, E, sp->sh, 0, st);
    }
    if (!q35m_run(sp, Q35M_DIAG_DOWN)) return;
    engine_cu_vshgate(sp->shl, sp->wts + d->k, sp->ids + d->k, sp->sw,
                      ly->down_merged ? d->X : 0, m, st);
    engine_cu_vffn_down(&dn, m, sp->sh, sp->sw, E, st);
    if (!ly->down_merged) engine_cu_vffn_down(&dsh, m, sp->sh, sp->sw, E, st);
}

/* The MTP block's input of m pairs (hidden row t of hrows, token of tok[t]): fc([enorm(e) |
 * hnorm(h)]) in X. */
static void q35m_mtp_in(engine_cuda_q35_session *s, int m, const engine_cu_step *tok,
                        const float *hrows) {
    const engine_cuda_q35_model *cm = s->cm;
    const q35_dims *d = &cm->d;
    q35_spec *sp = s->spec;
    cudaStream_t st = s->stream;
    const float eps = cm->m->hp.rms_norm_eps;
    const size_t E = (size_t)d->E;
    if (!q35m_run(sp, Q35M_DIAG_EMBED)) return; /* the draft's diagnosis only */
    engine_cu_embed(cm->tok_embd.d, cm->tok_embd.row_bytes, cm->tok_embd.type, d->E, tok, m,
                    sp->emb, st);
    engine_cu_vcat_norm(sp->emb, hrows, cm->mtp_enorm, cm->mtp_hnorm, eps, d->E, m, sp->cat, st);
    engine_cu_vmv fc = q35m_vmv(sp->cat, 2 * E, 2 * d->E, NULL, 0.0f, m, s->coop_mv);
    q35m_add(&fc, &cm->mtp_eh, sp->X, E, 0);
    q35m_vmatvec(sp, &fc, st);
}

/* The verify pass's MTP feed with only what a later pass reads (fused "feed"): the block's K/V
 * rows of the m pairs at positions pos (their attention output, MoE and final norm are never
 * read: a draft starts from hbuf and its token, later drafts from the previous draft's output).
 * The k and v products are the full block's (the same m-vector matvec rows, attn_norm staged),
 * the rows stored by the attention's own norm/rope/store code: bit for bit its KV. */
static void q35m_mtp_feed(engine_cuda_q35_session *s, int m, const engine_cu_step *tok,
                          const float *hrows, const int32_t *pos, size_t pstride) {
    const engine_cuda_q35_model *cm = s->cm;
    const q35_dims *d = &cm->d;
    q35_spec *sp = s->spec;
    const float eps = cm->m->hp.rms_norm_eps;
    const q35_cl *ly = &cm->layers[d->n_layer];
    q35m_mtp_in(s, m, tok, hrows);
    engine_cu_vmv in = q35m_vmv(sp->X, (size_t)d->E, d->E, ly->attn_norm, eps, m, s->coop_mv);
    q35m_add(&in, &ly->wk, sp->k, sp->skv, 0);
    q35m_add(&in, &ly->wv, sp->v, sp->skv, 0);
    q35m_vmatvec(sp, &in, s->stream);
    engine_cu_vkv a;
    memset(&a, 0, sizeof a);
    a.k = sp->k;
    a.v = sp->v;
    a.kv_stride = sp->skv;
    a.k_norm = ly->k_norm;
    a.rope = (const float2 *)s->rope;
    a.rot = d->rot;
    a.eps = eps;
    a.k_cache = sp->mk;
    a.v_cache = sp->mv;
    a.kv_f32 = s->kv == ENGINE_KV_F32;
    a.pos = pos;
    a.pos_stride = pstride;
    a.m = m;
    a.n_kv = d->nkv;
    a.hd = d->hd;
    engine_cu_vkv_store(&a, s->stream);
}

/* The MTP block over m pairs (hidden row t of hrows, token of tok[t]) at positions pos: its
 * output (before the final norm) in X. */
static void q35m_mtp_block(engine_cuda_q35_session *s, int m, const engine_cu_step *tok,
                           const float *hrows, const int32_t *pos, size_t pstride) {
    const engine_cuda_q35_model *cm = s->cm;
    const q35_dims *d = &cm->d;
    q35_spec *sp = s->spec;
    const float eps = cm->m->hp.rms_norm_eps;
    q35m_mtp_in(s, m, tok, hrows);
    const q35_cl *ly = &cm->layers[d->n_layer];
    const q35m_pass ps = {m, pos, pstride};
    q35m_attention(s, ly, eps, &ps, sp->mk, sp->mv);
    q35m_moe(s, ly, eps, m);
}

static void q35m_enqueue_feed(engine_cuda_q35_session *s, int m, bool feed);

static void q35m_enqueue_verify(engine_cuda_q35_session *s, int m) {
    const engine_cuda_q35_model *cm = s->cm;
    const q35_dims *d = &cm->d;
    q35_spec *sp = s->spec;
    cudaStream_t st = s->stream;
    const float eps = cm->m->hp.rms_norm_eps;
    const size_t E = (size_t)d->E;
    const q35m_pass ps = {m, &sp->vstep[0].pos, sizeof(engine_cu_step) / sizeof(int32_t)};
    sp->diag_now = sp->diag;
    if (q35m_run(sp, Q35M_DIAG_EMBED)) /* the m tokens' rows in one launch */
        engine_cu_embed(cm->tok_embd.d, cm->tok_embd.row_bytes, cm->tok_embd.type, d->E, sp->vstep,
                        m, sp->X, st);
    for (int l = 0; l < d->n_layer; l++) {
        const q35_cl *ly = &cm->layers[l];
        if (ly->attn)
            q35m_attention(s, ly, eps, &ps, s->k_cache[ly->slot], s->v_cache[ly->slot]);
        else
            q35m_deltanet(s, ly, eps, &ps);
        q35m_moe(s, ly, eps, m);
    }
    if (q35m_vdelta_on(sp, m, cm->d.K) && cm->n_lin > 0 && q35m_run(sp, Q35M_DIAG_RING))
        engine_cu_vring_commit(sp->vsnap, s->snap_stride, s->ring, s->ring_per * (size_t)cm->n_lin,
                               &sp->vstep[m - 1].pos, ENGINE_CU_VMAX, st); /* the rings after it */
    const bool argmax = q35m_run(sp, Q35M_DIAG_ARGMAX), feed = q35m_run(sp, Q35M_DIAG_FEED);
    /* the feed on the side branch beside the head (it reads hbuf, normed first, and the
     * tokens; its own X2 for its block's residual, s->stream swapped while it is enqueued) */
    const bool beside = feed && s->side && sp->feed_fork;
    if (argmax) engine_cu_vrmsnorm(sp->X, E, cm->output_norm, eps, d->E, m, sp->hbuf + E, E, st);
    if (beside) {
        float *const X = sp->X;
        const unsigned diag_main = sp->diag_now;
        cudaEventRecord(s->ev_fork, st);
        cudaStreamWaitEvent(s->side, s->ev_fork, 0);
        s->stream = s->side;
        sp->X = sp->X2;
        q35m_enqueue_feed(s, m, feed);
        cudaEventRecord(s->ev_join, s->side);
        s->stream = st;
        sp->X = X;
        sp->diag_now = diag_main;
    }
    engine_cu_vmv hd = q35m_vmv(sp->X, E, d->E, cm->output_norm, eps, m, s->coop_mv);
    q35m_add(&hd, q35_head(s), sp->logits, (size_t)d->V, 0);
    hd.mv.q6r_rows = s->head_rows;
    if (q35m_run(sp, Q35M_DIAG_HEAD)) q35m_vhead(sp, &hd, st);
    if (argmax) engine_cu_vargmax(sp->logits, d->V, m, sp->ascr, sp->y, st);
    if (beside)
        cudaStreamWaitEvent(st, s->ev_join, 0); /* the pass ends with both branches */
    else
        q35m_enqueue_feed(s, m, feed); /* after the head: its block writes X */
    sp->diag_now = 0;
}

/* The verify pass's MTP feed (after hbuf holds the pass's normed hidden rows): the MTP block's
 * KV rows of the m pairs, on s->stream. */
static void q35m_enqueue_feed(engine_cuda_q35_session *s, int m, bool feed) {
    q35_spec *sp = s->spec;
    sp->diag_now = 0; /* the feed's block (q35m_attention / q35m_moe) runs whole */
    if (feed && (sp->fused & Q35M_FUSED_FEED)) {
        q35m_mtp_feed(s, m, sp->vstep, sp->hbuf, sp->ctl->mpos, 1);
    } else if (feed) {
        /* "fatt": the block's launches up to its attention, which stores the pairs' KV rows
         * with the whole block's own launches (so its rows by construction); the rest (o_proj,
         * router, MoE) only makes outputs nothing reads (a draft starts from hbuf and its
         * token, the next pass from its embeddings), so it is left out through the launch
         * kinds' mask */
        if (sp->fused & Q35M_FUSED_FATT)
            sp->diag_now = Q35M_DIAG_AT_O | Q35M_DIAG_ROUTER | Q35M_DIAG_UP | Q35M_DIAG_DOWN;
        q35m_mtp_block(s, m, sp->vstep, sp->hbuf, sp->ctl->mpos, 1);
        sp->diag_now = 0;
    }
}

static void q35m_enqueue_draft(engine_cuda_q35_session *s, bool first) {
    const engine_cuda_q35_model *cm = s->cm;
    const q35_dims *d = &cm->d;
    q35_spec *sp = s->spec;
    cudaStream_t st = s->stream;
    const float eps = cm->m->hp.rms_norm_eps;
    const size_t E = (size_t)d->E;
    sp->diag_now = sp->diag_draft;
    q35m_mtp_block(s, 1, sp->dstep, first ? sp->hbuf : sp->mtp_h, &sp->dstep->pos, 0);
    engine_cu_vmv hd = q35m_vmv(sp->X, E, d->E, cm->mtp_norm, eps, 1, s->coop_mv);
    q35m_add(&hd, q35_head(s), sp->logits, (size_t)d->V, 0);
    hd.mv.q6r_rows = s->head_rows;
    if (q35m_run(sp, Q35M_DIAG_HEAD)) q35m_vhead(sp, &hd, st);
    if (q35m_run(sp, Q35M_DIAG_ARGMAX)) {
        engine_cu_vrmsnorm(sp->X, E, cm->mtp_norm, eps, d->E, 1, sp->mtp_h, E, st);
        engine_cu_sample(sp->logits, d->V, sp->dstep, sp->dtok, s->sscratch, s->counters + d->nkv,
                         st);
    }
    sp->diag_now = 0;
}

/* One greedy speculative step of k drafts (ctl->p0, ctl->k and vstep[0].token set). */
static void q35m_enqueue_fast(engine_cuda_q35_session *s, int k) {
    const engine_cuda_q35_model *cm = s->cm;
    q35_spec *sp = s->spec;
    cudaStream_t st = s->stream;
    const size_t nr = s->ring_per * (size_t)cm->n_lin, ns = s->state_per * (size_t)cm->n_lin;
    engine_cu_spec_prep(sp->ctl, sp->vstep, sp->dstep, sp->dtok, k + 1, false, false, st);
    for (int i = 0; i < k; i++)
        q35m_enqueue_draft(s, i == 0);
    /* "dn": serial, so the pass's first DeltaNet steps read the positions early safely */
    engine_cu_spec_prep(sp->ctl, sp->vstep, sp->dstep, sp->dtok, k + 1, true,
                        (sp->fused & (Q35M_FUSED_DN | Q35M_FUSED_DN2)) != 0, st);
    q35m_enqueue_verify(s, k + 1);
    engine_cu_spec_accept(sp->ctl, sp->y, sp->dtok, sp->hbuf, cm->d.E, sp->vstep, st);
    engine_cu_spec_restore(sp->ctl, sp->vsnap, s->snap_stride, s->ring, nr, st);
    engine_cu_spec_restore(sp->ctl, sp->vsnap + nr, s->snap_stride, s->state, ns, st);
}

/* kind 0: verify of m tokens, 1: draft (m = 1: step 0, else a later step), 2: fast step of m
 * drafts. */
static int q35m_graph(engine_cuda_q35_session *s, int kind, int m, cudaGraphExec_t *out) {
    if (*out) return 0;
    int rc = 0;
    cudaGraph_t g = NULL;
    CU(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal));
    if (kind == 0)
        q35m_enqueue_verify(s, m);
    else if (kind == 1)
        q35m_enqueue_draft(s, m == 1);
    else
        q35m_enqueue_fast(s, m);
    CU(cudaStreamEndCapture(s->stream, &g));
    CU(cudaGetLastError());
    CU(cudaGraphInstantiate(out, g, 0));
done:
    if (g) cudaGraphDestroy(g);
    return rc;
}

/* After a pass from p0 that keeps n tokens: the grid snapshots among them (state and the
 * hidden state of the token before) into the session's snapshot ring. */
static int q35m_grid(engine_cuda_q35_session *s, int32_t p0, int32_t n) {
    q35_spec *sp = s->spec;
    const size_t E = (size_t)s->cm->d.E, f = sizeof(float);
    int rc = 0;
    for (int32_t b = p0 + 1; b <= p0 + n; b++) {
        if (b % ENGINE_CUDA_Q35_SNAP_EVERY) continue;
        const int slot = (b / ENGINE_CUDA_Q35_SNAP_EVERY) % ENGINE_CUDA_Q35_SNAPSHOTS;
        CU(cudaMemcpyAsync(s->snap + (size_t)slot * s->snap_stride,
                           sp->vsnap + (size_t)(b % ENGINE_CU_VMAX) * s->snap_stride,
                           f * s->snap_stride, cudaMemcpyDeviceToDevice, s->stream));
        CU(cudaMemcpyAsync(sp->snap_hid + (size_t)slot * E, sp->hbuf + (size_t)(b - p0) * E,
                           f * E, cudaMemcpyDeviceToDevice, s->stream));
        s->snap_pos[slot] = b;
    }
done:
    return rc;
}

/* A new sequence: zero conv ring, recurrent state and the pending hidden state. */
static int q35m_reset(engine_cuda_q35_session *s) {
    const size_t nl = (size_t)s->cm->n_lin, f = sizeof(float);
    int rc = 0;
    CU(cudaMemsetAsync(s->ring, 0, f * s->ring_per * nl, s->stream));
    CU(cudaMemsetAsync(s->state, 0, f * s->state_per * nl, s->stream));
    CU(cudaMemsetAsync(s->spec->hbuf, 0, f * (size_t)s->cm->d.E, s->stream));
    q35_reset_state(s);
    s->spec->win_m = 0;
done:
    return rc;
}

extern "C" int engine_cuda_q35_append(engine_cuda_q35_session *s, const int32_t *tokens, int32_t n,
                                      int32_t pos, float *logits_all, float *last) {
    q35_spec *sp = s->spec;
    const q35_dims *d = &s->cm->d;
    const size_t E = (size_t)d->E, V = (size_t)d->V, f = sizeof(float);
    if (!sp || !sp->on) return engine_err(ENGINE_EINVAL, "cuda append: MTP is not on");
    if (pos < 0 || n < 1 || pos > s->n_ctx - n)
        return engine_err(ENGINE_ERANGE, "cuda append: positions %d..%d do not fit the context "
                          "of %d", pos, pos + n - 1, s->n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= d->V)
            return engine_err(ENGINE_EINVAL, "cuda append: token id %d is not in [0, %d)",
                              tokens[i], d->V);
    if (!logits_all && sp->pf_min > 0 && n >= sp->pf_min && engine_cu_q35_prefill_mtp_ok(s->pf))
        return engine_cuda_q35_prefill_run(s->pf, tokens, n, pos, last); /* feeds the block */
    int rc = 0;
    CU(cudaSetDevice(s->cm->device));
    if (pos == 0 && (rc = q35m_reset(s))) goto done;
    for (int32_t i = 0; i < n; i += ENGINE_CU_VMAX) {
        const int m = std::min((int)(n - i), ENGINE_CU_VMAX);
        const int32_t p0 = pos + i;
        if ((rc = q35m_graph(s, 0, m, &sp->verify[m]))) goto done;
        for (int t = 0; t < m; t++) {
            memset(&sp->h_vstep[t], 0, sizeof sp->h_vstep[t]);
            sp->h_vstep[t].token = tokens[i + t];
            sp->h_vstep[t].pos = p0 + t;
            sp->h_ctl->mpos[t] = std::max(p0 - 1 + t, 0);
        }
        sp->h_ctl->p0 = p0;
        sp->h_ctl->k = m - 1;
        CU(cudaMemcpyAsync(sp->vstep, sp->h_vstep, sizeof(engine_cu_step) * m,
                           cudaMemcpyHostToDevice, s->stream));
        CU(cudaMemcpyAsync(sp->ctl, sp->h_ctl, sizeof *sp->h_ctl, cudaMemcpyHostToDevice,
                           s->stream));
        CU(cudaGraphLaunch(sp->verify[m], s->stream));
        if (logits_all)
            CU(cudaMemcpyAsync(logits_all + (size_t)i * V, sp->logits, f * V * m,
                               cudaMemcpyDeviceToHost, s->stream));
        else if (last && i + m == n)
            CU(cudaMemcpyAsync(last, sp->logits + (size_t)(m - 1) * V, f * V,
                               cudaMemcpyDeviceToHost, s->stream));
        if ((rc = q35m_grid(s, p0, m))) goto done;
        CU(cudaMemcpyAsync(sp->hbuf, sp->hbuf + (size_t)m * E, f * E, cudaMemcpyDeviceToDevice,
                           s->stream));
        sp->win_p0 = p0;
        sp->win_m = m;
        CU(cudaStreamSynchronize(s->stream)); /* the pinned step records are reused */
    }
    if (logits_all && last) memcpy(last, logits_all + (size_t)(n - 1) * V, f * V);
done:
    return rc;
}

/* engine_cuda_q35_truncate with MTP on: inside the last pass's window from its per-token
 * states, else from a snapshot (with its hidden state) and recompute through verify passes. */
static int q35m_truncate(engine_cuda_q35_session *s, const int32_t *tokens, int32_t n_tokens,
                         int32_t n) {
    q35_spec *sp = s->spec;
    const engine_cuda_q35_model *cm = s->cm;
    const size_t E = (size_t)cm->d.E, f = sizeof(float);
    const size_t nr = s->ring_per * (size_t)cm->n_lin, ns = s->state_per * (size_t)cm->n_lin;
    int rc = 0, best = -1;
    CU(cudaSetDevice(cm->device));
    for (int i = 0; i < ENGINE_CUDA_Q35_SNAPSHOTS; i++) {
        if (s->snap_pos[i] > n)
            s->snap_pos[i] = -1;
        else if (s->snap_pos[i] > 0 && (best < 0 || s->snap_pos[i] > s->snap_pos[best]))
            best = i;
    }
    if (sp->win_m > 0 && sp->win_p0 + sp->win_m == n_tokens && n > sp->win_p0) {
        const float *src = sp->vsnap + (size_t)(n % ENGINE_CU_VMAX) * s->snap_stride;
        CU(cudaMemcpyAsync(s->ring, src, f * nr, cudaMemcpyDeviceToDevice, s->stream));
        CU(cudaMemcpyAsync(s->state, src + nr, f * ns, cudaMemcpyDeviceToDevice, s->stream));
        CU(cudaMemcpyAsync(sp->hbuf, sp->hbuf + (size_t)(n - sp->win_p0) * E, f * E,
                           cudaMemcpyDeviceToDevice, s->stream));
        sp->win_m = n - sp->win_p0;
        CU(cudaStreamSynchronize(s->stream));
        return 0;
    }
    {
        int32_t b = 0;
        if (best < 0) {
            if ((rc = q35m_reset(s))) goto done;
        } else {
            b = s->snap_pos[best];
            const float *src = s->snap + (size_t)best * s->snap_stride;
            CU(cudaMemcpyAsync(s->ring, src, f * nr, cudaMemcpyDeviceToDevice, s->stream));
            CU(cudaMemcpyAsync(s->state, src + nr, f * ns, cudaMemcpyDeviceToDevice, s->stream));
            CU(cudaMemcpyAsync(sp->hbuf, sp->snap_hid + (size_t)best * E, f * E,
                               cudaMemcpyDeviceToDevice, s->stream));
        }
        sp->win_m = 0;
        if (b < n)
            rc = engine_cuda_q35_append(s, tokens + b, n - b, b, NULL, NULL);
        else
            CU(cudaStreamSynchronize(s->stream));
    }
done:
    return rc;
}

extern "C" int engine_cuda_q35_mtp_kv_get(engine_cuda_q35_session *s, int32_t n, float *k,
                                          float *v) {
    const q35_dims *d = &s->cm->d;
    if (!q35m_on(s) || s->kv != ENGINE_KV_F32 || n < 0 || n > s->n_ctx)
        return engine_err(ENGINE_EINVAL, "MTP KV rows: needs MTP on, an F32 cache and 0..%d rows",
                          s->n_ctx);
    const size_t bytes = sizeof(float) * (size_t)n * (size_t)d->nkv * (size_t)d->hd;
    int rc = 0;
    CU(cudaSetDevice(s->cm->device));
    CU(cudaStreamSynchronize(s->stream));
    CU(cudaMemcpy(k, s->spec->mk, bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(v, s->spec->mv, bytes, cudaMemcpyDeviceToHost));
done:
    return rc;
}

extern "C" int engine_cuda_q35_mtp_step(engine_cuda_q35_session *s, int32_t i, int32_t token,
                                        int32_t n_tokens, float *logits) {
    q35_spec *sp = s->spec;
    const q35_dims *d = &s->cm->d;
    const int32_t pos = n_tokens - 1 + i;
    if (!sp || !sp->on || n_tokens < 1)
        return engine_err(ENGINE_EINVAL, "MTP step: the session has no MTP state (enable it, "
                          "then append at least one token)");
    if (i < 0 || pos >= s->n_ctx || token < 0 || token >= d->V)
        return engine_err(ENGINE_EINVAL, "MTP step %d at position %d (context %d), token %d", i,
                          pos, s->n_ctx, token);
    int rc = 0;
    CU(cudaSetDevice(s->cm->device));
    if ((rc = q35m_graph(s, 1, i == 0 ? 1 : 2, &sp->draft[i == 0 ? 0 : 1]))) goto done;
    memset(sp->h_dstep, 0, sizeof *sp->h_dstep);
    sp->h_dstep->token = token;
    sp->h_dstep->pos = pos;
    sp->h_dstep->out_cap = ENGINE_CU_VMAX;
    CU(cudaMemcpyAsync(sp->dstep, sp->h_dstep, sizeof *sp->h_dstep, cudaMemcpyHostToDevice,
                       s->stream));
    CU(cudaGraphLaunch(sp->draft[i == 0 ? 0 : 1], s->stream));
    if (logits)
        CU(cudaMemcpyAsync(logits, sp->logits, sizeof(float) * (size_t)d->V,
                           cudaMemcpyDeviceToHost, s->stream));
    CU(cudaStreamSynchronize(s->stream));
done:
    return rc;
}

extern "C" int engine_cuda_q35_spec_generate(engine_cuda_q35_session *s, int32_t x, int32_t pos,
                                             int32_t n_gen, int32_t k, int32_t *out,
                                             int32_t *n_out, int32_t *n_pos, int32_t *steps,
                                             int32_t *accepted) {
    q35_spec *sp = s->spec;
    *n_out = 0;
    *n_pos = pos;
    if (!sp || !sp->on || pos < 1 || k < 1 || k + 1 > ENGINE_CU_VMAX || n_gen < 1)
        return engine_err(ENGINE_EINVAL, "cuda speculative loop: needs MTP on, a session of at "
                          "least one token and 1..%d drafts", ENGINE_CU_VMAX - 1);
    if (x < 0 || x >= s->cm->d.V)
        return engine_err(ENGINE_EINVAL, "cuda speculative loop: token id %d", x);
    int rc = 0;
    int32_t p0 = pos, got = 0, n_steps = 0, n_acc = 0;
    CU(cudaSetDevice(s->cm->device));
    if ((rc = q35m_graph(s, 2, k, &sp->fast[k]))) goto done;
    memset(sp->h_ctl, 0, sizeof *sp->h_ctl);
    sp->h_ctl->p0 = pos;
    sp->h_ctl->k = k;
    memset(&sp->h_vstep[0], 0, sizeof sp->h_vstep[0]);
    sp->h_vstep[0].token = x;
    sp->h_vstep[0].pos = pos;
    CU(cudaMemcpyAsync(sp->ctl, sp->h_ctl, sizeof *sp->h_ctl, cudaMemcpyHostToDevice, s->stream));
    CU(cudaMemcpyAsync(sp->vstep, sp->h_vstep, sizeof sp->h_vstep[0], cudaMemcpyHostToDevice,
                       s->stream));
    sp->win_m = 0;
    while (got < n_gen && p0 + k + 1 <= s->n_ctx) {
        CU(cudaGraphLaunch(sp->fast[k], s->stream));
        CU(cudaMemcpyAsync(sp->h_ctl, sp->ctl, sizeof *sp->h_ctl, cudaMemcpyDeviceToHost,
                           s->stream));
        CU(cudaStreamSynchronize(s->stream));
        const int32_t j = sp->h_ctl->j;
        for (int32_t t = 0; t <= j; t++)
            out[got++] = sp->h_ctl->emit[t];
        n_steps++;
        n_acc += j;
        if ((rc = q35m_grid(s, p0, j + 1))) goto done;
        p0 += j + 1;
    }
    CU(cudaStreamSynchronize(s->stream));
done:
    *n_out = got;
    *n_pos = p0;
    if (steps) *steps = n_steps;
    if (accepted) *accepted = n_acc;
    return rc;
}

extern "C" int engine_cuda_q35_spec_time(engine_cuda_q35_session *s, int32_t pos, int reps,
                                         double *draft_us,
                                         double verify_us[ENGINE_CUDA_Q35_VMAX + 1]) {
    q35_spec *sp = s->spec;
    const engine_cuda_q35_model *cm = s->cm;
    const size_t nr = s->ring_per * (size_t)cm->n_lin, ns = s->state_per * (size_t)cm->n_lin;
    const size_t f = sizeof(float);
    if (!sp || !sp->on || pos < 1 || pos + ENGINE_CU_VMAX > s->n_ctx || reps < 1)
        return engine_err(ENGINE_EINVAL, "cuda MTP timing: needs MTP on and room after pos");
    int rc = 0;
    float *keep = NULL, ms = 0.0f;
    cudaEvent_t e0 = NULL, e1 = NULL;
    CU(cudaSetDevice(cm->device));
    CU(cudaMalloc((void **)&keep, f * (nr + ns + (size_t)cm->d.E)));
    CU(cudaMemcpyAsync(keep, s->ring, f * nr, cudaMemcpyDeviceToDevice, s->stream));
    CU(cudaMemcpyAsync(keep + nr, s->state, f * ns, cudaMemcpyDeviceToDevice, s->stream));
    CU(cudaMemcpyAsync(keep + nr + ns, sp->hbuf, f * cm->d.E, cudaMemcpyDeviceToDevice, s->stream));
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    if ((rc = q35m_graph(s, 1, 1, &sp->draft[0]))) goto done;
    memset(sp->h_dstep, 0, sizeof *sp->h_dstep);
    sp->h_dstep->token = 1;
    sp->h_dstep->pos = pos - 1;
    sp->h_dstep->out_cap = ENGINE_CU_VMAX;
    CU(cudaGraphLaunch(sp->draft[0], s->stream)); /* warm */
    CU(cudaEventRecord(e0, s->stream));
    for (int r = 0; r < reps; r++) { /* the step advances dstep: start it over each time */
        CU(cudaMemcpyAsync(sp->dstep, sp->h_dstep, sizeof *sp->h_dstep, cudaMemcpyHostToDevice,
                           s->stream));
        CU(cudaGraphLaunch(sp->draft[0], s->stream));
    }
    CU(cudaEventRecord(e1, s->stream));
    CU(cudaEventSynchronize(e1));
    CU(cudaEventElapsedTime(&ms, e0, e1));
    *draft_us = 1e3 * ms / reps;
    verify_us[0] = 0.0;
    for (int m = 1; m <= ENGINE_CU_VMAX; m++) {
        if ((rc = q35m_graph(s, 0, m, &sp->verify[m]))) goto done;
        for (int t = 0; t < m; t++) {
            memset(&sp->h_vstep[t], 0, sizeof sp->h_vstep[t]);
            sp->h_vstep[t].token = 1 + t;
            sp->h_vstep[t].pos = pos + t;
            sp->h_ctl->mpos[t] = pos - 1 + t;
        }
        sp->h_ctl->p0 = pos;
        sp->h_ctl->k = m - 1;
        CU(cudaMemcpyAsync(sp->vstep, sp->h_vstep, sizeof(engine_cu_step) * m,
                           cudaMemcpyHostToDevice, s->stream));
        CU(cudaMemcpyAsync(sp->ctl, sp->h_ctl, sizeof *sp->h_ctl, cudaMemcpyHostToDevice,
                           s->stream));
        CU(cudaGraphLaunch(sp->verify[m], s->stream)); /* warm */
        CU(cudaEventRecord(e0, s->stream));
        for (int r = 0; r < reps; r++)
            CU(cudaGraphLaunch(sp->verify[m], s->stream));
        CU(cudaEventRecord(e1, s->stream));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&ms, e0, e1));
        verify_us[m] = 1e3 * ms / reps;
    }
    /* back to the state at pos (the passes moved it on; KV past pos is rewritten later) */
    CU(cudaMemcpyAsync(s->ring, keep, f * nr, cudaMemcpyDeviceToDevice, s->stream));
    CU(cudaMemcpyAsync(s->state, keep + nr, f * ns, cudaMemcpyDeviceToDevice, s->stream));
    CU(cudaMemcpyAsync(sp->hbuf, keep + nr + ns, f * cm->d.E, cudaMemcpyDeviceToDevice, s->stream));
    CU(cudaStreamSynchronize(s->stream));
    sp->win_m = 0;
    for (int i = 0; i < ENGINE_CUDA_Q35_SNAPSHOTS; i++)
        if (s->snap_pos[i] > pos) s->snap_pos[i] = -1;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(keep);
    return rc;
}
