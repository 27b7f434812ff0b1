/* The batched pass over several sequences (engine_cuda_batch_*, contract in cuda_backend.h):
 * the prefill pass of prefill.cu over the tokens of every sequence at once, its KV in a device
 * pool of blocks addressed through each sequence's block table (attention: paged_att.cu). */
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "prefill.cuh"

extern "C" {
#include "cuda/cuda_backend.h"
#include "model/model_int.h"
}

static size_t pb_al256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

struct engine_cuda_batch {
    engine_cuda_prefill *pf;
    const engine_model *m;
    int device;
    cudaStream_t stream;
    int32_t n_blocks, block_size, max_pos, max_tokens, max_seqs, max_blocks, n_layer;
    int kv_f32;
    uint8_t *pool;          /* device: per layer K then V, n_blocks * block_size rows each */
    size_t pool_bytes;
    void **k_layer, **v_layer; /* host [n_layer]: device pointers into pool */
    float *rope;            /* device [max_pos][hd / 2] (cos, sin) */
    int32_t *meta_d, *meta_h; /* device / pinned host: tok, pos_of, row_of, seq_of, out_rows,
                               * tables ([max_seqs][max_blocks]) */
    float **out;            /* host [max_seqs] */
};

static size_t pb_meta_ints(int32_t max_tokens, int32_t max_seqs, int32_t max_blocks) {
    return 4 * (size_t)max_tokens + (size_t)max_seqs + (size_t)max_seqs * max_blocks;
}

static size_t pb_pool_bytes(const engine_hparams *hp, int32_t n_blocks, int32_t block_size,
                            engine_kv_type kv) {
    const size_t row = (size_t)hp->n_head_kv * hp->head_dim_k * (kv == ENGINE_KV_F32 ? 4 : 2);
    return pb_al256(row * (size_t)n_blocks * block_size) * 2 * hp->n_layer;
}

extern "C" size_t engine_cuda_batch_bytes(const engine_cuda_model *cm, int32_t n_blocks,
                                          int32_t block_size, int32_t max_pos, int32_t max_tokens,
                                          int32_t max_seqs, engine_kv_type kv) {
    engine_cuda_model_view mv;
    engine_cuda_model_view_get(cm, &mv);
    const engine_hparams *hp = &mv.m->hp;
    const int32_t mb = block_size > 0 ? (max_pos + block_size - 1) / block_size : 0;
    return pb_pool_bytes(hp, n_blocks, block_size, kv) +
           pb_al256(sizeof(float) * (size_t)max_pos * hp->head_dim_k) +
           pb_al256(sizeof(int32_t) * pb_meta_ints(max_tokens, max_seqs, mb)) +
           engine_cuda_prefill_bytes(cm, max_tokens);
}

extern "C" void engine_cuda_batch_free(engine_cuda_batch *b) {
    if (!b) return;
    cudaSetDevice(b->device);
    engine_cuda_prefill_free(b->pf);
    if (b->stream) cudaStreamSynchronize(b->stream);
    cudaFree(b->pool);
    cudaFree(b->rope);
    cudaFree(b->meta_d);
    cudaFreeHost(b->meta_h);
    if (b->stream) cudaStreamDestroy(b->stream);
    free(b->k_layer);
    free(b->v_layer);
    free(b->out);
    free(b);
}

extern "C" int engine_cuda_batch_new(engine_cuda_batch **out, engine_cuda_model *cm,
                                     int32_t n_blocks, int32_t block_size, int32_t max_pos,
                                     int32_t max_tokens, int32_t max_seqs, engine_kv_type kv) {
    *out = NULL;
    engine_cuda_model_view mv;
    engine_cuda_model_view_get(cm, &mv);
    const engine_model *m = mv.m;
    const engine_hparams *hp = &m->hp;
    const int hd = (int)hp->head_dim_k;
    if (hp->arch != ENGINE_ARCH_QWEN3MOE && hp->arch != ENGINE_ARCH_QWEN3)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: the CUDA batched pass serves qwen3moe and "
                          "qwen3", m->path);
    if (hd != 64 && hd != 128 && hd != 256)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: head size %d (the CUDA batched pass takes "
                          "64, 128 or 256)", m->path, hd);
    if (kv != ENGINE_KV_F16 && kv != ENGINE_KV_F32)
        return engine_err(ENGINE_EUNSUPPORTED, "cuda batch: KV type %d (F16 or F32 only)", (int)kv);
    if (n_blocks < 1 || block_size < 1 || block_size > 4096 || max_pos < 1 || max_tokens < 1 ||
        max_seqs < 1 || max_seqs > max_tokens ||
        (int64_t)n_blocks * block_size > INT32_MAX)
        return engine_err(ENGINE_EINVAL, "cuda batch: %d blocks of %d positions, %d positions, "
                          "%d tokens, %d sequences", n_blocks, block_size, max_pos, max_tokens,
                          max_seqs);
    engine_cuda_batch *b = (engine_cuda_batch *)calloc(1, sizeof *b);
    if (!b) return engine_err(ENGINE_ENOMEM, "out of memory");
    int rc = 0;
    size_t free_b = 0, total_b = 0;
    float *t = NULL;
    b->m = m;
    b->device = mv.device;
    b->n_blocks = n_blocks;
    b->block_size = block_size;
    b->max_pos = max_pos;
    b->max_tokens = max_tokens;
    b->max_seqs = max_seqs;
    b->max_blocks = (max_pos + block_size - 1) / block_size;
    b->n_layer = (int32_t)hp->n_layer;
    b->kv_f32 = kv == ENGINE_KV_F32;
    b->k_layer = (void **)calloc(hp->n_layer, sizeof(void *));
    b->v_layer = (void **)calloc(hp->n_layer, sizeof(void *));
    b->out = (float **)calloc((size_t)max_seqs, sizeof(float *));
    if (!b->k_layer || !b->v_layer || !b->out) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory");
        goto done;
    }
    {
        const size_t need = engine_cuda_batch_bytes(cm, n_blocks, block_size, max_pos, max_tokens,
                                                    max_seqs, kv);
        const size_t meta = pb_meta_ints(max_tokens, max_seqs, b->max_blocks);
        const size_t layer = pb_pool_bytes(hp, n_blocks, block_size, kv) / (2 * hp->n_layer);
        const size_t rb = sizeof(float) * (size_t)max_pos * hd;
        if ((rc = engine_cu_pf_err(cudaSetDevice(mv.device), "cudaSetDevice"))) goto done;
        if ((rc = engine_cu_pf_err(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"))) goto done;
        engine_log(ENGINE_LOG_INFO, "cuda: batched pass: KV pool %d blocks of %d positions "
                   "(%.1f MiB, %s), %.1f MiB in all; %.2f GB free", n_blocks, block_size,
                   (double)(2 * layer * hp->n_layer) / 1048576.0, b->kv_f32 ? "F32" : "F16",
                   (double)need / 1048576.0, (double)free_b / 1e9);
        if (need + ((size_t)64 << 20) > free_b) {
            rc = engine_err(ENGINE_ENOMEM, "cuda batched pass (%d KV blocks, %d-token passes) "
                            "needs %.2f GB of GPU memory but %.2f GB are free", n_blocks,
                            max_tokens, (double)need / 1e9, (double)free_b / 1e9);
            goto done;
        }
        if ((rc = engine_cu_pf_err(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking),
                                   "cudaStreamCreate")))
            goto done;
        if ((rc = engine_cu_pf_err(cudaMalloc((void **)&b->pool, 2 * layer * hp->n_layer),
                                   "cudaMalloc (KV pool)")))
            goto done;
        b->pool_bytes = 2 * layer * hp->n_layer;
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            b->k_layer[l] = b->pool + (2 * (size_t)l) * layer;
            b->v_layer[l] = b->pool + (2 * (size_t)l + 1) * layer;
        }
        if ((rc = engine_cu_pf_err(cudaMalloc((void **)&b->meta_d, sizeof(int32_t) * meta),
                                   "cudaMalloc (batch tables)")))
            goto done;
        if ((rc = engine_cu_pf_err(cudaMallocHost((void **)&b->meta_h, sizeof(int32_t) * meta),
                                   "cudaMallocHost (batch tables)")))
            goto done;
        if ((rc = engine_cu_pf_err(cudaMalloc((void **)&b->rope, rb), "cudaMalloc (rope)")))
            goto done;
        t = (float *)malloc(rb);
        if (!t) {
            rc = engine_err(ENGINE_ENOMEM, "out of memory");
            goto done;
        }
        engine_cu_rope_table(t, m->rope_inv_freq, hd, max_pos);
        if ((rc = engine_cu_pf_err(cudaMemcpy(b->rope, t, rb, cudaMemcpyHostToDevice),
                                   "cudaMemcpy (rope)")))
            goto done;
    }
    {
        engine_cuda_session_view sv;
        sv.stream = (void *)b->stream;
        sv.n_ctx = max_pos;
        sv.kv_f32 = b->kv_f32;
        sv.k_cache = b->k_layer;
        sv.v_cache = b->v_layer;
        sv.rope = b->rope;
        if ((rc = engine_cu_pf_new_view(&b->pf, cm, NULL, &sv, max_tokens))) goto done;
    }
    *out = b;
    b = NULL;
done:
    free(t);
    engine_cuda_batch_free(b);
    return rc;
}

extern "C" int engine_cuda_batch_run(engine_cuda_batch *b, const engine_cuda_batch_seq *seqs,
                                     int32_t n_seqs) {
    const engine_hparams *hp = &b->m->hp;
    if (n_seqs < 1 || n_seqs > b->max_seqs)
        return engine_err(ENGINE_EINVAL, "cuda batch: %d sequences (1 .. %d)", n_seqs,
                          b->max_seqs);
    int32_t n = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const engine_cuda_batch_seq *q = &seqs[i];
        if (q->n_tokens < 1 || q->pos < 0 || q->pos > b->max_pos - q->n_tokens)
            return engine_err(ENGINE_ERANGE, "cuda batch: sequence %d: positions %d..%d (the "
                              "pass holds %d)", i, q->pos, q->pos + q->n_tokens - 1, b->max_pos);
        if (q->n_tokens > b->max_tokens - n)
            return engine_err(ENGINE_ERANGE, "cuda batch: more than %d tokens in one pass",
                              b->max_tokens);
        const int32_t need = (q->pos + q->n_tokens + b->block_size - 1) / b->block_size;
        if (!q->blocks || q->n_blocks < need || q->n_blocks > b->max_blocks)
            return engine_err(ENGINE_EINVAL, "cuda batch: sequence %d: a block table of %d "
                              "blocks for positions up to %d (blocks of %d)", i, q->n_blocks,
                              q->pos + q->n_tokens - 1, b->block_size);
        for (int32_t j = 0; j < need; j++)
            if (q->blocks[j] < 0 || q->blocks[j] >= b->n_blocks)
                return engine_err(ENGINE_EINVAL, "cuda batch: sequence %d: block id %d is not "
                                  "in [0, %d)", i, q->blocks[j], b->n_blocks);
        for (int32_t j = 0; j < q->n_tokens; j++)
            if (q->tokens[j] < 0 || (uint32_t)q->tokens[j] >= hp->n_vocab)
                return engine_err(ENGINE_EINVAL, "cuda batch: token id %d is not in [0, %u)",
                                  q->tokens[j], hp->n_vocab);
        n += q->n_tokens;
    }
    const int32_t mt = b->max_tokens, mb = b->max_blocks;
    int32_t *tok = b->meta_h, *pos_of = tok + mt, *row_of = pos_of + mt, *seq_of = row_of + mt,
            *out_rows = seq_of + mt, *tables = out_rows + b->max_seqs;
    int32_t t = 0, n_out = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const engine_cuda_batch_seq *q = &seqs[i];
        const int32_t need = (q->pos + q->n_tokens + b->block_size - 1) / b->block_size;
        memcpy(tables + (size_t)i * mb, q->blocks, sizeof(int32_t) * (size_t)need);
        for (int32_t j = 0; j < q->n_tokens; j++, t++) {
            const int32_t p = q->pos + j;
            tok[t] = q->tokens[j];
            pos_of[t] = p;
            row_of[t] = q->blocks[p / b->block_size] * b->block_size + p % b->block_size;
            seq_of[t] = i;
        }
        if (q->logits) {
            out_rows[n_out] = t - 1;
            b->out[n_out++] = q->logits;
        }
    }
    cudaStream_t st = b->stream;
    int rc = engine_cu_pf_err(cudaSetDevice(b->device), "cudaSetDevice");
    const size_t bytes = sizeof(int32_t) * (4 * (size_t)mt + b->max_seqs + (size_t)n_seqs * mb);
    if (!rc)
        rc = engine_cu_pf_err(cudaMemcpyAsync(b->meta_d, b->meta_h, bytes,
                                              cudaMemcpyHostToDevice, st),
                              "cudaMemcpyAsync (batch tables)");
    if (!rc) {
        const int32_t *d = b->meta_d;
        engine_cu_pf_paged pg;
        pg.pos_of = d + mt;
        pg.row_of = d + 2 * mt;
        pg.seq_of = d + 3 * mt;
        pg.out_rows_d = d + 4 * mt;
        pg.tables = d + 4 * mt + b->max_seqs;
        pg.max_blocks = mb;
        pg.block_size = b->block_size;
        pg.n_out = n_out;
        pg.out = b->out;
        rc = engine_cu_pf_chunk(b->pf, tok, n, 0, NULL, NULL, &pg);
    }
    /* the pinned tables are rewritten by the next call: wait for this pass to have read them */
    const int rs = engine_cu_pf_err(cudaStreamSynchronize(st), "batched pass");
    return rc ? rc : rs;
}

