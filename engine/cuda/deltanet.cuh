/* The Gated DeltaNet (linear attention) block of qwen35moe on the GPU, one token (decode).
 *
 * engine_cu_deltanet_step: one launch per block does, for every value head h (32 columns of
 * its state per thread block), with kh the key head h reads (h % nk when v_tiled, else
 * h / (nv / nk)):
 *   qkv channels of h (q and k of kh, v of h) = silu(causal depthwise conv1d, kernel K) over
 *     the channel's last K inputs; the input of position pos is stored in the channel's ring
 *     slot pos % K (ring [C][K], zero for positions < 0), so no state shifts and the blocks
 *     that share a key head never race: they read slots of earlier positions and the first
 *     column block of the key head's first value head (its "owner") alone writes slot pos % K
 *     of the q and k channels (each block the v channels of its columns)
 *   q = l2norm(q) / sqrt(dk), k = l2norm(k)  (x * rsqrt(sum x^2 + 1e-6))
 *   beta = sigmoid(b[h]), g = exp(a[h] * softplus(alpha[h] + dt_bias[h]))   (a = -exp(A_log))
 *   S_h *= g; delta = (v - S_h^T k) beta; S_h += k delta^T; o = S_h^T q   (S_h [dk][dv] F32)
 *   out[h] = rmsnorm(o) * norm_w * silu(z[h])
 * The state columns are independent in the delta rule: a block takes 32 columns of a head
 * (grid nv x dv / 32), a thread one column of 16 consecutive rows in registers (lanes take
 * consecutive columns: coalesced rows, warps split the rows), and the two column sums (S^T k
 * and S^T q) are added over the row warps in shared memory; S is read and written once per
 * token. Each block recomputes its key head's conv and l2 norms (2 dk values). The RMSNorm of
 * a head spans its column blocks: each stores its o and its sum of squares (ssq), and the last
 * block of the head to finish (an atomic counter, reset by it) normalises the dv outputs.
 * Snapshots: after a token whose position pos + 1 is a multiple of snap_every, each block
 * also copies its part of the ring and its S_h into snapshot slot ((pos + 1) / snap_every) %
 * n_snap (snap_ring / snap_state + slot * snap_stride floats), so rollback can restore them.
 * Limits (engine_cu_deltanet_ok): dk and dv multiples of 32, dk <= 512, K <= 8.
 * (The shared expert's sigmoid gate is taken inside the MoE down kernel: moe.cuh sh_logit.) */
#ifndef SPARK_ENGINE_CUDA_DELTANET_CUH
#define SPARK_ENGINE_CUDA_DELTANET_CUH

#include <stddef.h>
#include <stdint.h>

#include "common.cuh"

#define ENGINE_CU_DELTA_MAX_CONV 8

typedef struct {
    const float *qkv;              /* [C] this token's projections (before the conv) */
    const float *z;                /* [nv * dv] output gate */
    const float *beta, *alpha;     /* [nv] logits */
    const float *conv_w;           /* [C][K] */
    const float *dt_bias, *a;      /* [nv] */
    const float *norm_w;           /* [dv] */
    float *ring;                   /* [C][K] */
    float *state;                  /* [nv][dk][dv] */
    float *snap_ring, *snap_state; /* slot 0 of this block's snapshot parts, or NULL */
    size_t snap_stride;            /* floats from one snapshot slot to the next */
    int snap_every, n_snap;
    const int32_t *pos; /* device: the token's position */
    int nk, nv, dk, dv, K, v_tiled;
    float eps;
    int early;          /* 1: read state, ring, position and weights before the PDL wait (only
                         * where no kernel of the chain writes them: the decode step; see
                         * deltanet.cu); 2: also the head's norm through a block cluster;
                         * 0: after it */
    int serial;         /* for early reads that follow a kernel writing the state (the MTP
                         * verify pass's tokens after the first: q35_mtp_host.cuh): 1: launch
                         * without programmatic dependent launch (the kernel starts once every
                         * earlier kernel of the stream is complete); 2: launched as usual, the
                         * kernel waits before its early reads (its start overlaps the previous
                         * kernel's tail, its reads follow that kernel's writes); 0: neither */
    float *out;         /* [nv * dv] */
    float *ssq;         /* [nv][dv / 32] scratch */
    unsigned *counters; /* [nv], zero between launches */
} engine_cu_delta;

bool engine_cu_deltanet_ok(int dk, int dv, int K);
void engine_cu_deltanet_step(const engine_cu_delta *a, cudaStream_t stream);

#endif
