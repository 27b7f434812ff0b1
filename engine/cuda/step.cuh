/* The fused decode step: every op of every layer in one kernel launch (step.cu).
 *
 * The per-op kernels (matvec, attention, MoE up and down) each wait for the whole previous
 * kernel at a launch boundary, 6 boundaries per layer. The step kernel instead runs the same
 * block bodies (matvec_dev.cuh, attention_dev.cuh, moe_dev.cuh) as "phases" of one grid: a
 * block takes a ticket (an atomic counter, so blocks start their work in ticket order), finds
 * its phase and block within it, prefetches that block's weights and then waits only for the
 * op it depends on (a done counter in global memory, sync.cuh); while it waits the blocks of
 * the previous op still run. The MoE down blocks also fetch their experts' rows as soon as the
 * routing is stored, before the up products are done. Each block computes exactly what it
 * computes in the per-op kernel (the same row split and order): the step's results are bit
 * for bit those of the per-op launches.
 * Host side: the session builds a program (the list of phases, grouped by op) once, uploads it
 * and launches it as one node of the step's CUDA graph. */
#ifndef SPARK_ENGINE_CUDA_STEP_CUH
#define SPARK_ENGINE_CUDA_STEP_CUH

#include "attention.cuh"
#include "matvec.cuh"
#include "moe.cuh"

/* Phase kinds: the block body and its template instance. */
enum {
    ENGINE_CU_PH_MV = 0,    /* + 3 * staging mode + rows per warp (0: split-K, 1, 2) */
    ENGINE_CU_PH_UP = 9,    /* + staging mode */
    ENGINE_CU_PH_DOWN = 12, /* + staging mode */
    ENGINE_CU_PH_ATT = 15,
    ENGINE_CU_PH_KINDS = 16
};

typedef struct {
    int kind;
    int n_blocks; /* blocks (tickets) of this phase */
    int gx, gy;   /* the per-op grid (mv: gx = row groups; up: row groups x experts; attention:
                     KV heads x splits) */
    int grp;      /* the op this phase belongs to: its blocks count into done[grp] */
    int dep;      /* the op whose blocks must all be done first, -1: none */
    unsigned dep_n;
    int flag; /* MoE: the layer's routing flag (up sets it, down waits for it), -1: none */
    size_t smem;
    union {
        engine_cu_mv mv;
        engine_cu_ffn_up_args up;
        engine_cu_ffn_down_args dn;
        engine_cu_att at;
    } u;
} engine_cu_phase;

/* The phases of an op, as its per-op launcher would split it (the same grid, so the same
 * results): a matvec gives one per staging mode present (returns the count, at most 3). */
int engine_cu_matvec_phases(const engine_cu_mv *a, engine_cu_phase out[3]);
engine_cu_phase engine_cu_attention_phase(const engine_cu_att *a);
engine_cu_phase engine_cu_ffn_up_phase(const engine_cu_ffn_up_args *a);
engine_cu_phase engine_cu_ffn_down_phase(const engine_cu_ffn_down_args *a);

typedef struct {
    /* host, while building */
    engine_cu_phase *ph;
    int n_ph, cap;
    int n_grp, n_flag;
    unsigned last_n; /* blocks of the last op added */
    int hd;          /* attention head dimension (one kernel instance per 64, 128, 256) */
    int qm;          /* the quantised staging mode of the weights (set by the upload) */
    /* device, after engine_cu_prog_upload */
    uint8_t *mem;
    engine_cu_phase *d_ph;
    uint32_t *d_map; /* [total]: ticket -> phase << 16 | block in the phase */
    unsigned *d_ctr; /* ticket, finished, done[n_grp], flag[n_flag]: zero between launches */
    int total;       /* blocks of the launch */
    size_t smem;     /* dynamic shared memory: the largest phase's */
} engine_cu_prog;

/* Append an op: its n phases (from the functions above) run after every block of the op added
 * before it is done. flag: the MoE layer's routing flag for an up or down op (from
 * engine_cu_prog_flag), else -1. 0 or an engine error (ENGINE_ENOMEM, ENGINE_EUNSUPPORTED). */
int engine_cu_prog_add(engine_cu_prog *p, const engine_cu_phase *ph, int n, int flag);
int engine_cu_prog_flag(engine_cu_prog *p);
/* Copy the program to the device (once). 0 or an engine error. */
int engine_cu_prog_upload(engine_cu_prog *p);
/* Enqueue the whole program as one launch (programmatic dependent launch after the previous
 * kernel); errors surface in cudaGetLastError. */
void engine_cu_prog_launch(const engine_cu_prog *p, cudaStream_t stream);
/* Free host and device memory; the struct is zeroed (free of a zeroed program: no-op). */
void engine_cu_prog_free(engine_cu_prog *p);

#endif
