/* Embedding gather and on-device sampling (contract in sample.cuh). */
#include <math.h>

#include "dequant.cuh"
#include "sample.cuh"

__global__ void embed_kernel(const uint8_t *emb, size_t row_bytes, int type, int n_embd,
                             const engine_cu_step *step, float *x) {
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= (n_embd >> 5)) return;
    x += (size_t)blockIdx.y * n_embd; /* row blockIdx.y of m */
    const uint8_t *row = emb + (size_t)step[blockIdx.y].token * row_bytes;
    float va[16], vb[16];
    int a0, b0;
    engine_cu_chunk_cols(type, c, &a0, &b0);
    engine_cu_decode_chunk(type, row, c, va, vb);
    for (int l = 0; l < 16; l++) {
        x[a0 + l] = va[l];
        x[b0 + l] = vb[l];
    }
}

void engine_cu_embed(const uint8_t *emb, size_t row_bytes, int type, int n_embd,
                     const engine_cu_step *step, int m, float *x, cudaStream_t stream) {
    int chunks = n_embd / 32;
    engine_cu_launch(embed_kernel, dim3((chunks + 127) / 128, m), dim3(128), 0, stream, emb,
                     row_bytes, type, n_embd, step, x);
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
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

__global__ void sample_kernel(const float *logits, int n, engine_cu_step *step, int32_t *out,
                              float *scratch, unsigned *counter) {
    __shared__ int s_last;
    engine_cu_pdl_launch();
    engine_cu_pdl_wait();
    const float temp = step->temp;
    const uint64_t key = splitmix64(step->seed ^ splitmix64((uint64_t)step->n_out + 1));
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = logits[i];
        if (temp > 0.0f) {
            /* 53-bit uniform in (0, 1) */
            double u = ((double)(splitmix64(key + (uint64_t)i) >> 11) + 0.5) * 0x1.0p-53;
            v = (float)((double)v / temp - log(-log(u)));
        }
        if (v != v) v = -INFINITY; /* NaN never wins */
        arg_better(v, i, &bv, &bi);
    }
    block_argmax(&bv, &bi);
    if (threadIdx.x == 0) {
        scratch[2 * blockIdx.x] = bv;
        ((int *)scratch)[2 * blockIdx.x + 1] = bi;
        __threadfence();
        unsigned done = atomicAdd(counter, 1u);
        s_last = done == gridDim.x - 1;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    bv = -INFINITY;
    bi = 0x7fffffff;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x)
        arg_better(__ldcg(scratch + 2 * b), __ldcg((const int *)scratch + 2 * b + 1), &bv, &bi);
    block_argmax(&bv, &bi);
    if (threadIdx.x == 0) {
        if (bi == 0x7fffffff) bi = 0; /* every logit -inf or NaN: a defined answer */
        step->token = bi;
        if (step->n_out < step->out_cap) out[step->n_out] = bi;
        step->n_out++;
        step->pos++;
        *counter = 0;
    }
}

void engine_cu_sample(const float *logits, int n, engine_cu_step *step, int32_t *out,
                      float *scratch, unsigned *counter, cudaStream_t stream) {
    engine_cu_launch(sample_kernel, dim3(ENGINE_CU_SAMPLE_BLOCKS), dim3(256), 0, stream, logits, n,
                     step, out, scratch, counter);
}

ENGINE_CU_TRACE_TU(sample)
