/* q35_mtp.h - MTP speculative decoding on the CUDA backend for qwen35moe (engine/cuda/
 * q35_mtp_host.cuh, compiled into qwen35.cu; kernels in q35_verify.cu). Part of the CUDA
 * backend's interface (cuda_backend.h); C callers: engine/model, tests, benchmarks.
 *
 * The model uploads the MTP block (blk.<n_layer>, nextn.*) when the file has one. A session
 * with MTP enabled feeds the block on every pass, as the CPU does (arch_qwen35moe.c): the
 * block's KV at position p holds the pair (h_p, token p+1), h_p the main model's final normed
 * hidden state after token p, kept on the device. Every pass of such a session is a verify
 * pass of m <= ENGINE_CUDA_Q35_VMAX tokens (one forward over the m tokens: each weight matrix
 * read once for all of them, the MoE, DeltaNet and attention per token inside one launch per
 * op where the kernels allow; one CUDA graph per m), which also keeps the recurrent state
 * after each of its tokens, so that truncating inside the last pass's window restores the
 * state of the kept tokens with one device copy (bit for bit a session that never saw the
 * rest); truncating elsewhere restores a snapshot and recomputes.
 * A prompt (an append of at least 12 tokens without per-token logits: SPARK_CUDA_MTP_PREFILL,
 * read when MTP turns on, "0" never, N > 1 from N tokens) goes through the session's prefill
 * (engine_cuda_q35_prefill_new: the one created last on the session) instead of verify passes
 * (21.7x faster at 4096 tokens on the H200's 8-block cut; 1.17x at 12 tokens, slower below):
 * the chunked pass of the main model, bit for bit the plain session's, which
 * also writes the block's KV rows of the same pairs (q35_prefill.cuh). It keeps no per-token
 * states, so a truncation into those tokens restores a snapshot (with the hidden state before
 * it) and recomputes; the main model's state after such a recompute equals the first pass's up
 * to summation order (the chunked delta rule's sub-chunks end elsewhere), not bit for bit. */
#ifndef SPARK_ENGINE_CUDA_Q35_MTP_H
#define SPARK_ENGINE_CUDA_Q35_MTP_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda/cuda_backend.h"

#define ENGINE_CUDA_Q35_VMAX 5 /* tokens of one verify pass (k + 1 for k <= 4 drafts) */

bool engine_cuda_q35_has_mtp(const engine_cuda_q35_model *cm);
/* From now on every pass feeds the MTP block. *was_off: it was off, so the tokens already in
 * the session did not feed it (the caller truncates to 0 and recomputes them).
 * ENGINE_EUNSUPPORTED without the block, ENGINE_ENOMEM when its buffers do not fit. */
int engine_cuda_q35_mtp_enable(engine_cuda_q35_session *s, bool *was_off);
bool engine_cuda_q35_mtp_on(const engine_cuda_q35_session *s);
/* Append n tokens at positions pos.. (MTP on; the session holds exactly pos tokens) in verify
 * passes of up to ENGINE_CUDA_Q35_VMAX tokens, or a prompt through the prefill (above);
 * logits_all (n * n_vocab; always verify passes) or NULL; last (n_vocab) receives the last
 * token's logits, or NULL. */
int engine_cuda_q35_append(engine_cuda_q35_session *s, const int32_t *tokens, int32_t n,
                           int32_t pos, float *logits_all, float *last);
/* Test op: rows 0..n-1 of the MTP block's K and V caches (n * n_kv * head_dim floats each;
 * sessions with MTP on and an F32 cache, else ENGINE_EINVAL). Synchronises the session. */
int engine_cuda_q35_mtp_kv_get(engine_cuda_q35_session *s, int32_t n, float *k, float *v);
/* Draft step i after n_tokens (>= 1) tokens: the pair (h_{n-1} for i = 0, else the previous
 * step's output; token) at position n - 1 + i -> logits (n_vocab floats, or NULL). */
int engine_cuda_q35_mtp_step(engine_cuda_q35_session *s, int32_t i, int32_t token,
                             int32_t n_tokens, float *logits);

/* The greedy speculative loop on the device (benchmarks): the session holds pos >= 1 tokens
 * with MTP on and x is the next token (chosen, not yet appended). Each step drafts k (1..4)
 * tokens with the MTP block, verifies them in one pass, accepts by exact match against the
 * greedy choice and rolls back on the device; only the accepted ids come back. Runs until at
 * least n_gen tokens are emitted; out (n_gen + ENGINE_CUDA_Q35_VMAX) receives them, *n_out
 * their count; the session then holds *n_pos tokens (every emitted token but the last).
 * Greedy output identical to plain greedy decoding. steps / accepted (or NULL): verify
 * passes and accepted drafts. */
int engine_cuda_q35_spec_generate(engine_cuda_q35_session *s, int32_t x, int32_t pos,
                                  int32_t n_gen, int32_t k, int32_t *out, int32_t *n_out,
                                  int32_t *n_pos, int32_t *steps, int32_t *accepted);

/* Timings for the benchmark (microseconds per call, CUDA events around reps replays of the
 * captured graphs at the session's current state, which they leave as a verify window
 * rolled back): a draft step, a verify pass of m tokens (1..ENGINE_CUDA_Q35_VMAX). The session
 * holds pos >= 1 tokens with MTP on; it is truncated back to pos afterwards. */
int engine_cuda_q35_spec_time(engine_cuda_q35_session *s, int32_t pos, int reps,
                              double *draft_us, double verify_us[ENGINE_CUDA_Q35_VMAX + 1]);

#endif
