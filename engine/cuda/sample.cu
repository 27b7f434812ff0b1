/* Embedding gather and on-device sampling (contract in sample.cuh). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dequant.cuh"
#include "sample.cuh"

/* Chunk c (32 values) of an embedding row into x. */
__device__ __forceinline__ void embed_chunk(int type, const uint8_t *row, int c, float *x) {
    float va[16], vb[16];
    int a0, b0;
    engine_cu_chunk_cols(type, c, &a0, &b0);
    engine_cu_decode_chunk(type, row, c, va, vb);
    for (int l = 0; l < 16; l++) {
        x[a0 + l] = va[l];
        x[b0 + l] = vb[l];
    }
}

/* T: the table's type fixed in the instance (its decode alone in the image), or -1: any. */
template <int T>
__global__ void embed_kernel(const uint8_t *emb, size_t row_bytes, int type, int n_embd,
                             const engine_cu_step *step, float *x) {
    if (T >= 0) type = T;
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= (n_embd >> 5)) return;
    /* row blockIdx.y of m */
    embed_chunk(type, emb + (size_t)step[blockIdx.y].token * row_bytes, c,
                x + (size_t)blockIdx.y * n_embd);
}

void engine_cu_embed(const uint8_t *emb, size_t row_bytes, int type, int n_embd,
                     const engine_cu_step *step, int m, float *x, cudaStream_t stream) {
    int chunks = n_embd / 32;
    auto fn = type == ENGINE_TYPE_Q4_K   ? embed_kernel<ENGINE_TYPE_Q4_K>
              : type == ENGINE_TYPE_Q6_K ? embed_kernel<ENGINE_TYPE_Q6_K>
              : type == ENGINE_TYPE_Q8_0 ? embed_kernel<ENGINE_TYPE_Q8_0>
                                         : embed_kernel<-1>;
    engine_cu_launch(fn, dim3((chunks + 127) / 128, m), dim3(128), 0, stream, emb, row_bytes, type,
                     n_embd, step, x);
}

/* better = (v > bv) or (v == bv and i < bi) */
__device__ __forceinline__ void arg_better(float v, int i, float *bv, int *bi) {
    if (v > *bv || (v == *bv && i < *bi)) {
        *bv = v;
        *bi = i;
    }
}

__device__ void block_argmax(float *bv, int *bi) {
    __shared__ float sv[32];
    __shared__ int si[32];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, *bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, *bi, o);
        arg_better(ov, oi, bv, bi);
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        sv[w] = *bv;
        si[w] = *bi;
    }
    __syncthreads();
    if (w == 0) {
        *bv = lane < nw ? sv[lane] : -INFINITY;
        *bi = lane < nw ? si[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, *bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, *bi, o);
            arg_better(ov, oi, bv, bi);
        }
    }
}

/* The top-k draw's keys: (orderable logit bits << 32) | ~id, so that a larger key is a larger
 * logit, ties to the lower id (as arg_better); NaN is -inf. 0: no candidate. */
__device__ __forceinline__ uint64_t topk_key(float v, int i) {
    if (v != v) v = -INFINITY;
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint32_t) ~(uint32_t)i;
}
__device__ __forceinline__ float topk_val(uint64_t k) {
    uint32_t u = (uint32_t)(k >> 32);
    return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}
__device__ __forceinline__ int topk_id(uint64_t k) {
    return (int)~(uint32_t)k;
}

/* One warp: the k largest keys of n_lists lists, each of len keys sorted descending at
 * lists[j * len ..], into out[0 .. k) descending (0 past the last key). cur: n_lists bytes of
 * shared memory (the lists' cursors; len <= 255). Lane l keeps the best head of its lists l,
 * l + 32, ...; each round takes the warp's largest and the winning lane moves on. Keys are
 * distinct (one id each), so one lane wins. Lane 0 stores every key of out. */
__device__ void warp_topk(const uint64_t *lists, int n_lists, int len, int k, uint8_t *cur,
                          uint64_t *out) {
    const int lane = threadIdx.x & 31;
    uint64_t best = 0;
    int bj = -1;
    for (int j = lane; j < n_lists; j += 32) {
        cur[j] = 0;
        const uint64_t v = lists[(size_t)j * len];
        if (v > best) best = v, bj = j;
    }
    __syncwarp();
    for (int r = 0; r < k; r++) {
        uint64_t m = best;
        for (int o = 16; o > 0; o >>= 1) {
            const uint64_t x = __shfl_xor_sync(0xffffffffu, m, o);
            m = x > m ? x : m;
        }
        if (lane == 0) out[r] = m;
        if (m == 0) { /* the lists are spent */
            if (lane == 0)
                for (int q = r + 1; q < k; q++)
                    out[q] = 0;
            break;
        }
        if (best == m) { /* the lane's own lists and cursors only */
            cur[bj]++;
            best = 0;
            bj = -1;
            for (int j = lane; j < n_lists; j += 32) {
                const int cj = cur[j];
                if (cj < len) {
                    const uint64_t v = lists[(size_t)j * len + cj];
                    if (v > best) best = v, bj = j;
                }
            }
        }
    }
    __syncwarp();
}

/* The whole block (blockDim.x threads): the k largest of keys[0 .. cnt) (shared memory; nonzero
 * keys distinct), unordered, into sel[0 .. k) (shared memory; 0 past min(cnt, k)). A radix
 * select from the top byte down: a histogram of the byte among the keys that share the bytes
 * fixed so far (warp-aggregated atomics), the byte whose bin holds the k-th key fixed, until
 * that bin's keys are exactly the ones still needed; then every key at or above the prefix.
 * hist: 256 ints, ctl: 4 ints of shared memory. Ends with a barrier. */
__device__ void block_radix_topk(const uint64_t *keys, int cnt, int k, uint64_t *sel, int *hist,
                                 int *ctl) {
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;
    uint64_t prefix = 0, mask = 0;
    int need = k;
    for (int shift = 56; cnt > k && shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += nt)
            hist[b] = 0;
        __syncthreads();
        for (int base = 0; base < cnt; base += nt) { /* every lane of a warp in each trip */
            const int i = base + tid;
            const uint64_t key = i < cnt ? keys[i] : 0;
            const bool in = i < cnt && (key & mask) == prefix;
            const int bin = in ? (int)((key >> shift) & 255u) : -1;
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
        }
        __syncthreads();
        if (tid < 32) { /* lane l: bins 255 - 8 l down to 248 - 8 l; counts from the top */
            int c[8], sum = 0;
            for (int j = 0; j < 8; j++) {
                c[j] = hist[255 - 8 * lane - j];
                sum += c[j];
            }
            int incl = sum;
            for (int o = 1; o < 32; o <<= 1) {
                const int x = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += x;
            }
            int acc = incl - sum;
            if (acc < need && need <= incl)
                for (int j = 0; j < 8; j++) {
                    if (acc + c[j] >= need) {
                        ctl[0] = 255 - 8 * lane - j; /* the byte */
                        ctl[1] = acc;                /* keys above its bin */
                        ctl[2] = c[j];               /* keys in it */
                        break;
                    }
                    acc += c[j];
                }
        }
        __syncthreads();
        const int d = ctl[0], above = ctl[1], eq = ctl[2];
        need -= above;
        prefix |= (uint64_t)d << shift;
        mask |= (uint64_t)255u << shift;
        if (eq == need) break; /* the bin's keys are all in */
    }
    if (tid == 0) ctl[3] = 0;
    __syncthreads();
    for (int i = tid; i < cnt; i += nt) {
        const uint64_t key = keys[i];
        if ((key & mask) >= prefix) {
            const int at = atomicAdd(&ctl[3], 1);
            if (at < k) sel[at] = key;
        }
    }
    __syncthreads();
    for (int i = min(ctl[3], k) + tid; i < k; i += nt)
        sel[i] = 0;
    __syncthreads();
}

/* Inclusive prefix sum over the warp's lanes. */
__device__ __forceinline__ float warp_scan(float v) {
    const int lane = threadIdx.x & 31;
    for (int o = 1; o < 32; o <<= 1) {
        const float x = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += x;
    }
    return v;
}

/* Warp 0 of the last block: the draw from the merged candidates c[0 .. k) (descending keys):
 * the host sampler's softmax(l / T) over them, top_p, min_p, then the first candidate whose
 * running sum passes u * sum. Lane l holds candidates l and l + 32. Returns the id (every
 * lane), 0 where no candidate is finite. */
__device__ int topk_draw(const uint64_t *c, int k, const engine_cu_step *step, double u) {
    const int lane = threadIdx.x & 31;
    const float inv_t = 1.0f / step->temp;
    float x[2], p[2];
    bool live[2];
    for (int h = 0; h < 2; h++) {
        const int i = lane + 32 * h;
        const uint64_t key = i < k ? c[i] : 0;
        const float v = key ? topk_val(key) : -INFINITY;
        live[h] = v > -INFINITY;
        x[h] = v * inv_t;
    }
    const unsigned m0 = __ballot_sync(0xffffffffu, live[0]),
                   m1 = __ballot_sync(0xffffffffu, live[1]);
    const int n_live = __popc(m0) + __popc(m1); /* a prefix: the keys descend */
    if (n_live == 0) return 0;
    const float mx = __shfl_sync(0xffffffffu, x[0], 0);
    float z = 0.0f;
    for (int h = 0; h < 2; h++) {
        p[h] = live[h] ? expf(x[h] - mx) : 0.0f;
        z += p[h];
    }
    for (int o = 16; o > 0; o >>= 1)
        z += __shfl_xor_sync(0xffffffffu, z, o);
    for (int h = 0; h < 2; h++)
        p[h] /= z;
    /* running sums over the candidates in order */
    float cum[2];
    cum[0] = warp_scan(p[0]);
    const float tot0 = __shfl_sync(0xffffffffu, cum[0], 31);
    cum[1] = warp_scan(p[1]) + tot0;
    int n = n_live;
    if (step->top_p < 1.0f) { /* the first candidate whose running sum reaches top_p ends it */
        const unsigned r0 = __ballot_sync(0xffffffffu, live[0] && cum[0] >= step->top_p),
                       r1 = __ballot_sync(0xffffffffu, live[1] && cum[1] >= step->top_p);
        if (r0)
            n = __ffs(r0);
        else if (r1)
            n = 32 + __ffs(r1);
    }
    if (step->min_p > 0.0f) { /* p descends: the candidates above the threshold are a prefix */
        const float thr = step->min_p * __shfl_sync(0xffffffffu, p[0], 0);
        const int keep = __popc(__ballot_sync(0xffffffffu, live[0] && p[0] >= thr)) +
                         __popc(__ballot_sync(0xffffffffu, live[1] && p[1] >= thr));
        n = keep < n ? keep : n;
    }
    /* the draw over candidates 0 .. n-1 */
    const float sum = __shfl_sync(0xffffffffu, n > 32 ? cum[1] : cum[0], (n - 1) & 31);
    const float r = (float)(u * (double)sum);
    const unsigned h0 = __ballot_sync(0xffffffffu, lane < n && r < cum[0]),
                   h1 = __ballot_sync(0xffffffffu, lane + 32 < n && r < cum[1]);
    const int pick = h0 ? __ffs(h0) - 1 : h1 ? 31 + __ffs(h1) : n - 1;
    return topk_id(c[pick]);
}

/* the top-k launch's dynamic shared memory: a block's slice as keys, its warps' lists and
 * cursors (tk_algo 0) or the selection, the histogram and its control words (1); in the last
 * block every block's list, the merged one and the cursors, or the selection, the sorted one,
 * the histogram and its words */
#define TK_SMEM_A (ENGINE_CU_TOPK_SLICE * 8 + 8 * ENGINE_CU_TOPK_MAX * 8 + ENGINE_CU_TOPK_SLICE)
#define TK_SMEM_B (ENGINE_CU_TOPK_KEYS * 8 + 2 * ENGINE_CU_TOPK_MAX * 8 + 256 * 4 + 16)
#define TK_SMEM (TK_SMEM_A > TK_SMEM_B ? TK_SMEM_A : TK_SMEM_B)

__device__ __forceinline__ unsigned dyn_smem_bytes() {
    unsigned r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}

/* logits[i], or -inf where the launch's mask leaves token i out */
__device__ __forceinline__ float masked_logit(const float *logits, const uint32_t *allow, int i) {
    return allow && !(__ldg(allow + (i >> 5)) >> (i & 31) & 1u) ? -INFINITY : logits[i];
}

/* Logits a thread of the greedy instance loads at once: the whole of a 248,320-token vocabulary
 * in one round at 128 blocks of 256 threads. */
#define SAMPLE_GU 8

/* MODE 2: the launch brings the truncated draw's keys and shared memory
 * (engine_cu_sample_topk); 0 (engine_cu_sample): no truncated-draw code in the instance; 1:
 * nor the Gumbel draw's (greedy whatever step->temp says: a graph's node set to it only for
 * steps that draw greedily, engine_cu_sample_kernel). */
template <int MODE>
__global__ void sample_kernel(const float *logits, int n, engine_cu_step *step, int32_t *out,
                              float *scratch, uint64_t *keys, unsigned *counter,
                              const uint32_t *allow_all, engine_cu_embed_to emb) {
    __shared__ int s_last, s_tok;
    extern __shared__ __align__(16) uint8_t tk_smem[];
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const float temp = step->temp;
    const uint64_t key = engine_cu_draw_key(step->seed, step->n_out);
    const int top_k = step->top_k, algo = step->tk_algo;
    const uint32_t *allow = step->masked ? allow_all : nullptr;
    /* the truncated draw: only in a launch that brought its keys and shared memory */
    const bool tk = MODE == 2 && temp > 0.0f && top_k > 0 && top_k <= ENGINE_CU_TOPK_MAX && keys &&
                    dyn_smem_bytes() >= TK_SMEM && n <= (int)gridDim.x * ENGINE_CU_TOPK_SLICE;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    if (tk) {
        /* the block's slice as keys, each warp's top_k of its part, the block's of those */
        uint64_t *sk = (uint64_t *)tk_smem, *wl = sk + ENGINE_CU_TOPK_SLICE;
        uint8_t *cur = (uint8_t *)(wl + 8 * ENGINE_CU_TOPK_MAX);
        const int per = (n + (int)gridDim.x - 1) / (int)gridDim.x;
        const int i0 = (int)blockIdx.x * per, cnt = max(0, min(per, n - i0));
        for (int i = threadIdx.x; i < cnt; i += blockDim.x)
            sk[i] = topk_key(masked_logit(logits, allow, i0 + i), i0 + i);
        __syncthreads();
        if (algo == 1) { /* radix select into shared memory, then out to the block's list */
            uint64_t *bl = sk + ENGINE_CU_TOPK_SLICE;
            int *hist = (int *)(bl + ENGINE_CU_TOPK_MAX);
            block_radix_topk(sk, cnt, top_k, bl, hist, hist + 256);
            if ((int)threadIdx.x < top_k) {
                keys[(size_t)blockIdx.x * top_k + threadIdx.x] = bl[threadIdx.x];
                __threadfence();
            }
            __syncthreads();
            goto counted;
        }
        const int w = threadIdx.x >> 5, nw = blockDim.x >> 5, wp = (cnt + nw - 1) / nw;
        const int w0 = min(cnt, w * wp), wn = min(cnt, w0 + wp) - w0;
        warp_topk(sk + w0, wn, 1, top_k, cur + w * (ENGINE_CU_TOPK_SLICE / 8), wl + w * top_k);
        __syncthreads();
        if (w == 0) warp_topk(wl, nw, top_k, top_k, cur, keys + (size_t)blockIdx.x * top_k);
    } else if (MODE == 1) {
        /* greedy: a thread's logits loaded SAMPLE_GU at a time before any compare (the
         * launch reads them from L2 straight after the head; one load's latency each, not one
         * a value). The best under arg_better's order whatever the order of visits. */
        const int stride = (int)(gridDim.x * blockDim.x);
        for (int i0 = blockIdx.x * blockDim.x + threadIdx.x; i0 < n; i0 += SAMPLE_GU * stride) {
            float v[SAMPLE_GU];
#pragma unroll
            for (int u = 0; u < SAMPLE_GU; u++) {
                const int i = i0 + u * stride;
                v[u] = i < n ? masked_logit(logits, allow, i) : -INFINITY;
            }
#pragma unroll
            for (int u = 0; u < SAMPLE_GU; u++) {
                if (v[u] != v[u]) v[u] = -INFINITY; /* NaN never wins */
                if (i0 + u * stride < n) arg_better(v[u], i0 + u * stride, &bv, &bi);
            }
        }
        block_argmax(&bv, &bi);
    } else {
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
            float v = masked_logit(logits, allow, i);
            if (MODE != 1 && temp > 0.0f) {
                /* 53-bit uniform in (0, 1) */
                double u = engine_cu_key_uniform(engine_cu_splitmix64(key + (uint64_t)i));
                v = (float)((double)v / temp - log(-log(u)));
            }
            if (v != v) v = -INFINITY; /* NaN never wins */
            arg_better(v, i, &bv, &bi);
        }
        block_argmax(&bv, &bi);
    }
counted:
    if (threadIdx.x == 0) {
        if (!tk) {
            scratch[2 * blockIdx.x] = bv;
            ((int *)scratch)[2 * blockIdx.x + 1] = bi;
        }
        __threadfence();
        unsigned done = atomicAdd(counter, 1u);
        s_last = done == gridDim.x - 1;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    if (tk) {
        /* every block's list, merged by warp 0 (or selected by the block and sorted by rank),
         * and the draw */
        uint64_t *all = (uint64_t *)tk_smem, *fin = all + ENGINE_CU_TOPK_KEYS;
        uint8_t *cur = (uint8_t *)(fin + ENGINE_CU_TOPK_MAX);
        const int nk = (int)gridDim.x * top_k;
        for (int i = threadIdx.x; i < nk; i += blockDim.x)
            all[i] = __ldcg(keys + i);
        __syncthreads();
        if (algo == 1) {
            uint64_t *sel = fin + ENGINE_CU_TOPK_MAX;
            int *hist = (int *)(sel + ENGINE_CU_TOPK_MAX);
            block_radix_topk(all, nk, top_k, sel, hist, hist + 256);
            if ((int)threadIdx.x < top_k) { /* rank: the keys above (zeros: by slot) */
                const uint64_t me = sel[threadIdx.x];
                int rank = 0;
                for (int j = 0; j < top_k; j++) {
                    const uint64_t o = sel[j];
                    rank += o > me || (o == me && j < (int)threadIdx.x);
                }
                fin[rank] = me;
            }
            __syncthreads();
            if (threadIdx.x < 32) bi = topk_draw(fin, top_k, step, engine_cu_key_uniform(key));
        } else if (threadIdx.x < 32) {
            warp_topk(all, (int)gridDim.x, top_k, top_k, cur, fin);
            bi = topk_draw(fin, top_k, step, engine_cu_key_uniform(key));
        }
    } else {
        bv = -INFINITY;
        bi = 0x7fffffff;
        for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x)
            arg_better(__ldcg(scratch + 2 * b), __ldcg((const int *)scratch + 2 * b + 1), &bv, &bi);
        block_argmax(&bv, &bi);
    }
    if (threadIdx.x == 0) {
        if (bi == 0x7fffffff) bi = 0; /* every logit -inf or NaN: a defined answer */
        step->token = bi;
        if (step->n_out < step->out_cap) out[step->n_out] = bi;
        step->n_out++;
        step->pos++;
        *counter = 0;
        s_tok = bi;
    }
    if (!emb.x) return;
    __syncthreads();
    for (int c = threadIdx.x; c < (emb.n_embd >> 5); c += blockDim.x)
        embed_chunk(emb.type, emb.table + (size_t)s_tok * emb.row_bytes, c, emb.x);
}

static engine_cu_embed_to embed_to(const engine_cu_embed_to *e) {
    engine_cu_embed_to none;
    memset(&none, 0, sizeof none);
    return e ? *e : none;
}

void engine_cu_sample(const float *logits, int n, engine_cu_step *step, int32_t *out,
                      float *scratch, unsigned *counter, cudaStream_t stream, const uint32_t *allow,
                      const engine_cu_embed_to *emb) {
    engine_cu_launch(sample_kernel<0>, dim3(ENGINE_CU_SAMPLE_BLOCKS), dim3(256), 0, stream, logits,
                     n, step, out, scratch, (uint64_t *)nullptr, counter, allow, embed_to(emb));
}

const void *engine_cu_sample_kernel(bool greedy) {
    return greedy ? (const void *)sample_kernel<1> : (const void *)sample_kernel<0>;
}

/* The radix select by default: Qwen3-30B-A3B Q4_K_M `complete` with the default sampling 510.4 /
 * 509.9 tok/s against 500.7 / 501.8 with the merges (+1.8%; H200, session 31 call A);
 * SPARK_CUDA_TOPK=merge the merges. */
int engine_cu_topk_algo_env(void) {
    const char *e = getenv("SPARK_CUDA_TOPK");
    return e && !strcmp(e, "merge") ? 0 : 1;
}

cudaError_t engine_cu_sample_topk_prepare(void) {
    return cudaFuncSetAttribute(sample_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)TK_SMEM);
}

void engine_cu_sample_topk(const float *logits, int n, engine_cu_step *step, int32_t *out,
                           float *scratch, uint64_t *keys, unsigned *counter, cudaStream_t stream,
                           const uint32_t *allow, const engine_cu_embed_to *emb) {
    static_assert(ENGINE_CU_TOPK_MAX <= 255, "a cursor is a byte");
    engine_cu_launch(sample_kernel<2>, dim3(ENGINE_CU_SAMPLE_BLOCKS), dim3(256), (size_t)TK_SMEM,
                     stream, logits, n, step, out, scratch, keys, counter, allow, embed_to(emb));
}

ENGINE_CU_TRACE_TU(sample)
