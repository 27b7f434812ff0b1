/* The MoE block of a qwen3moe batch-1 decode step in ONE launch: the whole-grid form (`grid`
 * below; on by default, backend.cu mf_grid) or the slices (SPARK_CUDA_MOE_FUSED=1|32|64, off by
 * default, described first): routing, gate/up + SwiGLU, down, the weighted combine and the residual
 * add, in place of the engine_cu_ffn_up + engine_cu_ffn_down pair (moe.cuh), so that the down
 * products need no dependent launch of their own.
 *
 * Blocks = (expert slot j of k, slice s of S intermediate rows), block j * (n_ff / S) + s:
 *   1. every block routes (warp 0; with the router fusion from the scaled raw logits, as the up
 *      kernel does) while the other warps stage x (+ x_add) normalised; block 0 stores ids and
 *      weights; the routing warp asks L2 for the block's gate and up rows at once, and after the
 *      staging the block asks L2 for the down bytes of its rows (step 4);
 *   2. the block's S rows of gate/up: h[j][r] = silu(g) u, as the up kernel computes them (the
 *      same function, bit for bit), stored to h (global);
 *   3. the 256 / S blocks of one 256-value group of h wait for each other (a counter per group;
 *      the h values stored and fenced first) and each stages the group's 256 values from L2 as
 *      the down kernel stages h, so that the int8 values and scales are the unfused path's bit
 *      for bit (Q8_K: blocks of 256; Q8_0 / Q4_0: of 32; float types: F32);
 *   4. block m of its group takes rows m * n_embd / G .. of the group's down columns (chunks
 *      0..7 of the group in every row, eight lanes a row: coalesced, unlike a thin slice of
 *      every row, which call 2 measured at 42.8 us a layer) and stores partial[j, g][i] = w_j *
 *      (row i of D_e over the group's columns . h), the scratch [k * n_ff / 256][n_embd];
 *   5. a deterministic reduction (no float atomics): each block fences and counts itself in an
 *      arrival counter; the last R to arrive (R = n_embd / 64, at most n_blocks) each wait until
 *      all have arrived and reduce a 1/R share of the outputs over the partials in order
 *      (fixed: the sum never depends on timing), storing y = (y + y_add) + sum with the router
 *      fusion, else y += sum (the unfused down kernel's adds); or (class_reduce) the last block
 *      of each row class reduces that class's rows with no wait. The last reducer to finish resets
 *      the counters for the next launch. Results: the unfused path's up to F32 summation order of
 *      the down sums (relative ~1e-7), bit-reproducible from launch to launch.
 * Deadlock freedom: blocks wait for other blocks of the launch (group and reduction waits), so
 * the launcher fuses only when the whole grid is resident at once (blocks per multiprocessor
 * from the occupancy query x multiprocessors >= n_blocks), else it enqueues the unfused pair. A
 * waiting block has started, hence so have all blocks by the time the next kernel in the stream
 * can launch (programmatic dependent launch: the dependent starts once every block of this one
 * has triggered, at its start), and kernels before it finish on their own; so every block it
 * waits for is resident or gets a multiprocessor. All counter traffic comes after the kernel's
 * griddepcontrol.wait, so the launch before (a previous layer's) has completed and reset them.
 * One set of counters serves every layer (launches of a stream run one after the other).
 * STATUS: measured slower than the pair on the H200 (GPU call 3 of session 6, 12-block 30B-A3B
 * Q4_K_M cut: 1564.1 tok/s with PRE + RED against 1645.6; the launch 27.5-28.8 us a layer
 * against 24.6; per phase in docs/architecture.md), so it stays opt-in.
 * Host launchers only; no CUDA type leaves engine/cuda/. */
#ifndef SPARK_ENGINE_CUDA_MOE_FUSED_CUH
#define SPARK_ENGINE_CUDA_MOE_FUSED_CUH

#include "moe.cuh"

typedef struct {
    /* MoE (router set); h [k][n_ff] written; x_add: the router fusion (and then dn.y_add). The
     * stage-5/6 fields (max_bps, trigger_late, routed, stage_early) are not read. */
    engine_cu_ffn_up_args up;
    /* down, expert_bytes, row_bytes, type, cols (n_ff), rows (n_embd), k, y, y_add as for
     * engine_cu_ffn_down; the rest is not read (ids, weights and h come from the up part). */
    engine_cu_ffn_down_args dn;
    int slice;          /* S: 32 or 64 intermediate rows per block */
    float *partial;     /* device scratch, engine_cu_moe_fused_partial_floats floats */
    unsigned *counters; /* device, engine_cu_moe_fused_counters entries, zero (left zero) */
    /* quantised downs: each thread loads its first 4 (row, chunk) items of the down work into
     * registers right after its gate/up rows, before the group wait and the staging of h (the
     * bytes asked of L2 at the start), and computes on them after; the same sums bit for bit */
    int preload;
    /* Step 5 without waiting (SPARK_CUDA_MOE_FUSED_RED=1): the blocks of place m in their groups
     * (one per group, k * n_ff / 256) count themselves in a counter of their own, and the last of
     * them reduces those blocks' rows (a 1/G share of the outputs) at once; the same sums, in the
     * same association, bit for bit. */
    int class_reduce;
    /* Diagnosis only (wrong results; SPARK_CUDA_MOE_FUSED_DIAG): bits leave out 1 the down
     * products, 2 the reduction, 4 the group wait, 8 the gate/up rows, for an A/B of their cost.
     * The whole-grid form reads bits 0x10 and 0x20 alone: 0x10 its routing warp routes twice (the
     * same ids and weights, so the same results; the second routing's cost, with its code and
     * inputs warm), 0x20 it picks the experts after the block's RMS scale, as before session 27
     * (the same results; the cost of the copies waiting for the scale), 0x40 its staging warps
     * read their norm weights after the wait, as before session 27 (SPARK_CUDA_NW_LATE=1 sets
     * it; the same results); for timing only (wrong results), the grid form without its up
     * products (0x80), its staging of h (0x100) or its down products (0x200). */
    int diag;
    /* The whole-grid form (SPARK_CUDA_MOE_FUSED=g; slice, preload, class_reduce, partial and diag
     * but its bit 0x10 not read), 0 off. One block per multiprocessor, each with bulk copies
     * (common.cuh engine_cu_bulk_g2s, sm_90+) into shared memory:
     *   1. every block routes (warp 0, as the up kernel's routing warp: the same ids and weights)
     *      and at once copies the gate and up runs of its ipb up items (expert slot, 16 rows), the
     *      up kernel's items, while the other warps stage x (+ x_add) as the up kernel does;
     *   2. the block's items' h rows, computed as the up kernel computes them from its copy
     *      (moe_dev.cuh ffn_up_rows: the same function), stored to h;
     *   3. a barrier over the whole grid (counters[0] arrivals, counters[1] departures; the last
     *      block to leave zeroes both): every h value stored;
     *   4. the block stages all of h as the down kernel does (the same 8-bit values) and
     *      computes its gpb down row groups (FFN_WARPS rows of each of the k experts, the down
     *      kernel's groups) from its copy with the down kernel's function (moe_dev.cuh down_row),
     *      the weighted combine and the residual add (down_store) in its rows: the unfused
     *      pair's results bit for bit.
     * A block has three warp groups of FFN_WARPS warps (768 threads), which take its items and
     * row groups side by side (the up kernel's RMS scale still summed by the first FFN_WARPS
     * warps: the same bits). grid = 1: the down runs are copied into the up runs' space once
     * the block's up rows are done (before the barrier, so they arrive during it); grid = 2:
     * with the up runs at once (more shared memory); grid = 3: 2 where it fits, else 1. Deadlock
     * freedom as above: the launcher takes this form only when all blocks are resident at once (one
     * wave), and a block triggers its dependents at its start; a barrier wait longer than 10 s
     * traps (sync.cuh engine_cu_spin_bounded: an error, not a hang). Quantised types only;
     * Qwen3's MoE (no shared expert). */
    int grid;
    /* The whole-grid form: each up item's two runs counted on an mbarrier of their own (up to 8
     * items a block; more: one barrier), so that a warp group computes its item's rows once that
     * item has landed instead of once all of the block's items have. The same arithmetic
     * (SPARK_CUDA_MOE_ITEMS=1; pipe > 0 implies it). Alone it gains nothing: runs issued together
     * land together (session 18 call 2: item 0 at 13.13 us against 12.95 for all items without
     * it), 497.3 against 496.6 tok/s on Qwen3-30B-A3B Q4_K_M (call 1); hence pipe below. */
    int items;
    /* The whole-grid form, the order of its copies (SPARK_CUDA_MOE_PIPE=I[,D]; the sessions'
     * default 2,2, =0 all at the start). Issued together, a block's runs land together (session 18
     * call 2's timeline: with per-item barriers the first item lands no sooner than the last), so
     * the up products wait for all of the block's bytes, the down runs' included (grid 2). pipe = I
     * > 0 (with items): only I up items at the start; the group that computes item i issues item i
     * + I once item i has landed, so the first items land sooner and their products overlap the
     * later copies. pipe_down = D (grid 2): the down runs issued 0 at the start, 1 with the last up
     * item, 2 once the last up item has landed. The same arithmetic. Session 18 call 3,
     * Qwen3-30B-A3B tg128 in one process: Q4_K_M 490.8 tok/s with all at the start, 2,2 507.1, 2,1
     * 503.8, 1,2 502.2, 1,1 497.0; Q8_0 420.9 and 430.3 (2,2). With the copies at 128-byte
     * boundaries the order turned (session 21 call 3): Q4_K_M 571.4 (2,2), 574.5 (1,1), 567.8
     * (2,1), 565.6 (3,2), 544.1 (all at the start); Q8_0 477.7 (2), 491.6 (1), 469.6 (3), 464.4
     * (all). In turn with 2,2 (call 4): Q8_0 487.6 / 487.4 against 477.7 / 477.4 (+2.1%), Q4_K_M
     * 570.4 / 571.0 against 571.6 / 571.8 (-0.2%, within the same-process spread): 1,1.
     * Session 35 call G, with form 2's down runs merged (dn_merge): 1,2 577.1 / 577.0 against 1,1
     * 573.4 / 573.2 and 2,2 573.8 / 574.6, 2,1 563.3 (Q4_K_M); Q8_0 (form 1: I alone) 1 492.2 /
     * 492.0 against 2 482.8 / 482.9: 1,2 the default since then.
     * Tried and dropped in session 35 (bench/cuda/patches/s35-moe-pipe3-wq.patch): D = 3, the down
     * runs issued by group 0 once its item is computed, so that their issue holds no warp that
     * still has an item to compute: -1.0% (Q4_K_M, call C). */
    int pipe, pipe_down;
    /* The whole-grid form 1 (on in the sessions; SPARK_CUDA_MOE_ARRIVE=0 off): the block's arrival
     * at the grid barrier is counted before its down runs are issued, and warp 1's first thread
     * issues them. Before, thread 0 issued the 16 runs first and counted the arrival only then.
     * A bulk copy is accepted only as the copy queue drains, so every block waited for the last
     * block's issue. Session 35 call B, Q8_0 trace: 3.2 us from the last block's products to past
     * the barrier, against 1.3 us for Q4_K_M's form 2. The same results. Call C (H200, tg128 in
     * one process): Q8_0 491.3 / 491.2 against 486.9 / 487.2 tok/s (+0.85%). */
    int arrive;
    /* The whole-grid form: each expert slot's down runs (its gpb groups of FFN_WARPS consecutive
     * rows) issued as one bulk copy and laid out slot by slot, so a block issues k copies
     * instead of gpb k. SPARK_CUDA_MOE_DMERGE: 0 none, 1 both forms, default 2 form 2 only.
     * Session 35 call E (one process, H200): Q4_K_M (form 2) 573.9 / 573.9 against 570.4 / 569.9
     * tok/s (+0.65%); Q8_0 (form 1, arrival first) 488.6 / 488.5 against 491.4 / 491.7 (-0.6%).
     * The same bytes and sums. */
    int dn_merge;
    /* The whole-grid form: the down runs' copies issued by the lanes of a warp, a copy a lane,
     * where one thread issued them in turn (a bulk copy's issue took 0.07-0.33 us in bench_bulk,
     * session 29). SPARK_CUDA_MOE_LANES: 0 none, 1 both forms, default 2 form 2 only. Session 36
     * (H200, tg128 in one process): Q4_K_M (form 2) 575.3 / 575.8 against 572.5 / 573.1 tok/s
     * (+0.5%, call A), 573.1 / 573.2 against 568.9 / 569.3 (+0.7%, call B); Q8_0 (form 1) 487.0
     * / 487.2 against 492.4 / 492.9 (-1.1%, call A). The same copies. */
    int lanes;
    /* The whole-grid form's product loops kept rolled: 1 the down products' (down_row's unroll
     * 1, not 2), 2 the up products' (up_rows ROLL). The same sums in the same order, in less
     * code: each launch fetches its code anew (Nsight Compute, session 36 call G: 2,471
     * instructions executed, 39.5 KB in 345 lines of 128 bytes; 12.9% of the warp samples wait
     * for an instruction). SPARK_CUDA_MOE_ROLL=bits, default 3. Call G (H200, tg128 in one
     * process): down rolled Q4_K_M 577.8 / 577.8 against 570.3 / 570.2 tok/s (+1.3%), Q8_0 493.4
     * / 493.3 against 490.7 / 490.7 (+0.5%); 37.7 KB, 331 lines, 11.9% waiting. Call H: 0 / 1 /
     * 3 Q4_K_M 571.7, 572.9 / 577.6, 576.7 / 579.1, 579.7; Q8_0 485.5 / 489.9 / 491.6. */
    int roll;
    /* The whole-grid form with the router fusion: where gate/up and down are Q4_K and Q6_K, Q4_K
     * and Q4_K (1), or Q8_0 and Q8_0 (1, 2), a kernel instance whose code holds those types'
     * products alone (the generic one holds every type's of its staging mode; why the Q8_0
     * instance is faster is not measured). SPARK_CUDA_MOE_SPEC=0|2 (2: Q8_0's alone), default 1
     * since session 39; the same sums.
     * Session 38 call D (H200, tg128, twice each, against 0): 1 Q4_K_M 596.6, 595.4 against
     * 595.9, 598.2 (-0.2%), Q8_0 504.1, 504.7 against 497.8, 497.3 (+1.4%); with
     * SPARK_CUDA_ATT_ONE=1 as well 506.6, 507.2 (+0.5% over the instance alone). Since session
     * 39 the instance also fixes roll at 3 and diag at 0 (the launcher takes it only then), so its
     * image holds the rolled loops alone and no diagnosis branch: Q8_0/Q8_0 9,968 instructions
     * (was 15,232), the Q4_K pairs 11,456 (16,720 / 16,896). Session 39 call F (H200, tg128 with
     * eager modules, in both orders): Q8_0 533.0 / 530.9 against the generic 514.1 / 509.7
     * (+3.7% / +4.2%), Q4_K_M 623.5 / 625.0 against 604.1 / 603.4 (+3.2% / +3.6%); spark-agent
     * bench tg128 gen Q4_K_M 627.32 against 607.01, Q8_0 526.4 / 526.5 (510.7 before). Where
     * every switch the form reads is at the sessions' default (grid, items/pipe, pipe_down,
     * dn_merge, lanes, arrive, y_pre, up.coop), the instance of that form fixes them too
     * (moe_fused.cu mg_form_fixed); SPARK_CUDA_MOE_SPEC=3 keeps them read at run time. */
    int spec;
    /* The whole-grid form (SPARK_CUDA_MOE_YPRE; on in the sessions, =0 off): lane 0 of each warp
     * reads its first down row's y (and y_add) before the grid barrier, so that the store after
     * its down products waits on no load at the launch's end. The same adds in the same order.
     * Session 32 (H200, tg128 in one process): Q4_K_M 575.6 / 576.5 / 579.7 against 571.6-574.9
     * off, Q8_0 491.5 / 492.1 / 491.9 against 489.4-490.6. */
    int y_pre;
    /* The whole-grid form: pf_norm_n floats at pf_norm asked of L2 once the block's down rows
     * have landed (warp 1; NULL: none): the next layer's attention norm weights, which the q/k/v
     * launch after this one reads right after its wait. That launch's blocks cannot start beside
     * this launch's (registers), so they ask L2 for those weights only after it, and the
     * staging then waits for memory: its x staged 3.7-4.6 us after its wait against 2.3 in layer
     * 0 (session 17 call 1). SPARK_CUDA_NEXT_NORM=1; off by default: no gain measured (session
     * 18 call 1: 495.8 against 496.6 tok/s Q4_K_M, 432.9 against 431.1 Q8_0). */
    const float *pf_norm;
    int pf_norm_n;
    /* Set by the launcher (engine_cu_moe_fused) for the whole-grid form: up items and down row
     * groups per block, and the offset of the weight copies in shared memory. */
    int ipb, gpb;
    unsigned ws_off;
} engine_cu_moe_fused_args;

/* Scratch sizes for a layer shape. */
size_t engine_cu_moe_fused_partial_floats(int k, int n_ff, int n_embd);
size_t engine_cu_moe_fused_counters(int k, int n_ff);

/* NULL when the launch can fuse a (types, shapes, the grid resident at once: queried once per
 * kernel instance), else why not. */
const char *engine_cu_moe_fused_why(const engine_cu_moe_fused_args *a);

/* Enqueue the fused launch, or, when engine_cu_moe_fused_why says no, engine_cu_ffn_up and
 * engine_cu_ffn_down with a.up / a.dn (ids, weights, h of a.up). */
void engine_cu_moe_fused(const engine_cu_moe_fused_args *a, cudaStream_t stream);

#endif
