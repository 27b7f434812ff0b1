/* The MoE router folded into the wo launch (qwen3moe batch-1 decode; the sessions' default,
 * SPARK_CUDA_ROUTER_FUSE=0 turns it off).
 *
 * Unfused, a layer's attention block ends with x += Wo â (the wo launch; â the attention output
 * as the wo kernel stages it: quantised to 8 bits for quantised Wo, qdot.cuh, and used
 * dequantised by the integer dots), then the router launch computes logits = W_r (g ⊙ x) s with
 * s = 1 / sqrt(mean(x²) + eps), g the ffn_norm weights: a dependent launch for 1 MB of weights.
 * With h = x + Wo â that is logits = s (R x + M â), R = W_r diag(g) [n_expert][n_embd] and
 * M = R Wo [n_expert][n_att], both F32 (computed once per model, engine_cu_rf_build: Wo and W_r
 * dequantised as dequant.cuh decodes them, M by an F32 GEMM). So one launch does both:
 *   blocks [0, n_expert): block e computes raw[e] = [R | M]_e · [x ; â] (its threads take
 *     consecutive float4s of the row, loaded into registers before the wait, and the block sums
 *     their parts), with x and â staged in F32, â quantised exactly as the wo blocks stage it
 *     and dequantised (d * q);
 *   the other blocks: the wo product (mv_block with the plan engine_cu_matvec would use, so the
 *     same sums bit for bit) into ao, NOT accumulated into x: the router blocks read x during
 *     this launch.
 * Then the up kernel stages h = x + ao (the same F32 add the unfused wo kernel does) with the
 * norm, and its routing warp scales raw by h's RMS scale (computed as the staging computes it)
 * before the softmax (moe.cuh x_add); the down kernel writes x = (x + ao) + sum (moe.cuh
 * y_add), the unfused rounding. So the residual stream and the experts' input are the unfused
 * path's bit for bit; only the router logits differ, by F32 rounding (~1e-6 relative: a
 * routing can differ from the unfused one only where two experts are that close).
 * Router blocks come first in the grid: they carry the larger rows (4 (n_embd + n_att) bytes
 * against a wo block's 8 quantised rows) and are scheduled first.
 * Host launchers only; no CUDA type leaves engine/cuda/. */
#ifndef SPARK_ENGINE_CUDA_ROUTER_FUSE_CUH
#define SPARK_ENGINE_CUDA_ROUTER_FUSE_CUH

#include <stddef.h>
#include <stdint.h>

#include "common.cuh"
#include "matvec.cuh"

typedef struct {
    engine_cu_mv wo; /* one matrix: m[0].y = ao [n_embd], accumulate 0; x = â [n_att] (cols) */
    engine_cu_mv rm; /* one F32 matrix [n_expert][n_embd + n_att]: R | M; m[0].y = raw
                        [n_expert]; cols = n_embd + n_att; x, norm_w unused */
    const float *x;  /* device: the residual [n_embd] (read only during the launch) */
    int n_embd;
    /* 2: two rows per router block always (engine_cuda_op_router_fuse's tests; measured no
     * faster in sessions: GPU call 3); else two only when one per block would not fit one
     * wave */
    int rows_per_block;
    /* Tokens as a grid dimension (the MTP verify pass): m > 1: blockIdx.y = t of m, and token
     * t's blocks are the decode launch's blocks (the same rows per router block, the same wo
     * plan) on x + t x_stride, wo.x + t att_stride, wo.m[0].y + t ao_stride and rm.m[0].y +
     * t raw_stride: bit for bit m decode launches. m <= 1: the decode launch. seq (with m > 1):
     * the decode launch's grid instead, 1: each block doing its part for token 0, 1, .., m - 1
     * in turn (the same block code per token: one wave, and its rows from L1 / L2 after the
     * first token) instead of m times the blocks; 2 (quantised Wo; else as 1): each block doing
     * its part for the m tokens at once, every weight loaded once and multiplied with the m
     * tokens' vectors in the decode block's order (router_fuse.cu rf_wo_vec_kernel), the same
     * results. */
    int m, seq;
    size_t x_stride, att_stride, ao_stride, raw_stride;
    /* The decode launch (m <= 1) in a kernel instance holding Wo's type's products alone (the
     * generic one holds every type's of its staging mode): 1 (the sessions' default since
     * session 40; SPARK_CUDA_RF_SPEC=0..4) where Wo is Q4_K or Q8_0, 2 Q8_0 alone. The same
     * sums. Session 38 call H
     * (H200, tg128, two processes): Q8_0 509.2 / 509.3 against 506.4 / 506.6 (+0.5%); Q4_K_M
     * 603.2 / 603.1 against 604.6 / 604.3 (-0.2%). Since session 39, where the wo blocks take
     * the bulk-copy form (wo.tma), the instance holds that form alone (matvec_dev.cuh mv_block
     * TO); 3: Q8_0's instance with every form in its image, as before; 4: Q8_0's as 2, other
     * types in the generic instance with the bulk-copy form alone. Session 40 call F
     * (spark-agent bench tg128 gen, Q4_K_M, two processes each): 1 675.64 / 675.31 against 2
     * 662.99 / 663.18 (+1.9%). */
    int spec;
} engine_cu_rf_args;

/* Dynamic shared memory of a router block: the F32 vector [x ; â] and, for quantised Wo, â's
 * 8-bit staging. The launch takes the larger of this and the wo blocks'. */
size_t engine_cu_rf_smem(int wo_type, int n_embd, int n_att);

/* Enqueue the fused wo + router launch (programmatic dependent launch, as engine_cu_matvec). */
void engine_cu_rf_wo(const engine_cu_rf_args *a, cudaStream_t stream);

/* Enqueue the build of one layer's [R | M] into rm (device, n_expert rows of n_embd + n_att
 * floats): R = W_r diag(g), M = R Wo_deq. wo: device, n_embd rows of n_att values of wo_type
 * (wo_rb bytes each); wr: device, n_expert rows of n_embd values of wr_type; g: device
 * [n_embd]; scratch: device, n_embd * n_att floats (Wo dequantised). Types: those
 * engine_cu_type_supported accepts; n_embd and n_att multiples of 32. Returns 0, or an engine
 * error if a launch failed (cudaGetLastError). */
int engine_cu_rf_build(const uint8_t *wo, int wo_type, size_t wo_rb, const uint8_t *wr, int wr_type,
                       size_t wr_rb, const float *g, int n_expert, int n_embd, int n_att,
                       float *scratch, float *rm, cudaStream_t stream);

#endif
