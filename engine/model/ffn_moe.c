/* Shared CPU forward pieces: row-split matmul and the MoE expert passes (ffn_moe.h). */
#include "model/ffn_moe.h"

#include <string.h>

void engine_ffn_matmul_part(int n_w, const engine_weight *const *w, float *const *y,
                            const size_t *y_stride, const uint8_t *x, size_t x_stride, int32_t n,
                            int ith, int nth) {
    int64_t total = 0;
    for (int i = 0; i < n_w; i++)
        total += w[i]->rows;
    int64_t r0, r1;
    engine_split(total, ith, nth, &r0, &r1);
    int64_t base = 0;
    for (int i = 0; i < n_w; i++) {
        const engine_weight *wi = w[i];
        int64_t a = ENGINE_MAX(r0 - base, (int64_t)0), b = ENGINE_MIN(r1 - base, wi->rows);
        base += wi->rows;
        for (int64_t rb = a; rb < b; rb += ENGINE_FFN_ROW_BLOCK) {
            int64_t re = ENGINE_MIN(rb + ENGINE_FFN_ROW_BLOCK, b);
            for (int32_t t = 0; t < n; t++)
                engine_quant_matvec(wi->type, wi->data, wi->row_bytes, (int)wi->cols, (int)rb,
                                    (int)re, x + (size_t)t * x_stride,
                                    y[i] + (size_t)t * y_stride[i]);
        }
    }
}

void engine_ffn_convert_part(engine_type type, const float *src, size_t src_stride, int cols,
                             uint8_t *dst, size_t dst_stride, int32_t n, int ith, int nth) {
    int64_t a, b;
    engine_split(n, ith, nth, &a, &b);
    for (int64_t t = a; t < b; t++)
        engine_quantize_row(type, src + (size_t)t * src_stride, dst + (size_t)t * dst_stride,
                            cols);
}

void engine_ffn_swiglu_part(float *g, const float *u, size_t stride, int cols, engine_type type,
                            uint8_t *dst, size_t dst_stride, int32_t n, int ith, int nth) {
    int64_t a, b;
    engine_split(n, ith, nth, &a, &b);
    for (int64_t r = a; r < b; r++) {
        float *gr = g + (size_t)r * stride;
        engine_cpu_swiglu(gr, gr, u + (size_t)r * stride, cols);
        if (type != ENGINE_TYPE_F32)
            engine_quantize_row(type, gr, dst + (size_t)r * dst_stride, cols);
    }
}

const uint8_t *engine_moe_expert_rows(const engine_moe_weights *w, int which, int32_t e) {
    const engine_weight *m = which == 0 ? w->gate : which == 1 ? w->up : w->down;
    if (w->exp_ptr) return w->exp_ptr[(size_t)which * (size_t)m->n_mat + (size_t)e];
    int64_t stride = which == 2 ? m->rows : w->gu_stride;
    return (const uint8_t *)m->data + (size_t)e * (size_t)stride * m->row_bytes;
}

int engine_moe_group(const int32_t *sel, int32_t n_slots, int n_expert, int32_t *exp_start,
                     int32_t *exp_slots, int32_t *active) {
    memset(exp_start, 0, sizeof(int32_t) * (size_t)(n_expert + 1));
    for (int32_t sl = 0; sl < n_slots; sl++)
        exp_start[sel[sl] + 1]++;
    int n_active = 0;
    for (int e = 0; e < n_expert; e++) {
        if (exp_start[e + 1] > 0) active[n_active++] = e;
        exp_start[e + 1] += exp_start[e];
    }
    /* exp_start[e] runs as expert e's fill cursor, then shifts back by one expert */
    for (int32_t sl = 0; sl < n_slots; sl++)
        exp_slots[exp_start[sel[sl]]++] = sl;
    for (int e = n_expert; e > 0; e--)
        exp_start[e] = exp_start[e - 1];
    exp_start[0] = 0;
    return n_active;
}

void engine_moe_job_items(engine_moe_job *j, bool down) {
    int64_t rows = down ? j->w.down->rows : j->w.gate->rows;
    j->chunks = (rows + ENGINE_MOE_CHUNK - 1) / ENGINE_MOE_CHUNK;
    j->n_items = j->chunks * j->n_active;
    j->next = 0;
}

void engine_moe_up_fn(void *job, int ith, int nth) {
    (void)ith;
    (void)nth;
    engine_moe_job *j = job;
    const engine_weight *wg = j->w.gate, *wu = j->w.up;
    size_t nff = (size_t)wg->rows;
    for (;;) {
        int64_t it = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (it >= j->n_items) break;
        int32_t e = j->active[it / j->chunks];
        int64_t r0 = (it % j->chunks) * ENGINE_MOE_CHUNK;
        int64_t r1 = ENGINE_MIN(r0 + ENGINE_MOE_CHUNK, wg->rows);
        const uint8_t *g = engine_moe_expert_rows(&j->w, 0, e);
        const uint8_t *u = engine_moe_expert_rows(&j->w, 1, e);
        for (int32_t si = j->exp_start[e]; si < j->exp_start[e + 1]; si++) {
            int32_t slot = j->exp_slots[si], t = slot / j->k;
            engine_quant_matvec(wg->type, g, wg->row_bytes, (int)wg->cols, (int)r0, (int)r1,
                                j->xg + (size_t)t * j->xg_stride, j->g + (size_t)slot * nff);
            engine_quant_matvec(wu->type, u, wu->row_bytes, (int)wu->cols, (int)r0, (int)r1,
                                j->xu + (size_t)t * j->xu_stride, j->u + (size_t)slot * nff);
        }
    }
}

void engine_moe_down_fn(void *job, int ith, int nth) {
    (void)ith;
    (void)nth;
    engine_moe_job *j = job;
    const engine_weight *wd = j->w.down;
    size_t e_out = (size_t)wd->rows;
    for (;;) {
        int64_t it = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (it >= j->n_items) break;
        int32_t e = j->active[it / j->chunks];
        int64_t r0 = (it % j->chunks) * ENGINE_MOE_CHUNK;
        int64_t r1 = ENGINE_MIN(r0 + ENGINE_MOE_CHUNK, wd->rows);
        const uint8_t *d = engine_moe_expert_rows(&j->w, 2, e);
        for (int32_t si = j->exp_start[e]; si < j->exp_start[e + 1]; si++) {
            int32_t slot = j->exp_slots[si];
            engine_quant_matvec(wd->type, d, wd->row_bytes, (int)wd->cols, (int)r0, (int)r1,
                                j->x + (size_t)slot * j->x_stride, j->out + (size_t)slot * e_out);
        }
    }
}
