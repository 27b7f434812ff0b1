/* The scheduler: one thread runs every request of a model, continuously batched (engine.h).
 *
 * Requests move: submitted (the `incoming` list, under mu) -> waiting (the thread's FIFO) ->
 * running (a slot) -> done (on_done, freed). A request's tokens are its prompt followed by the
 * tokens sampled so far; `n_done` of them have KV. A running request with n_done < n_toks needs
 * a forward over the rest: a decode (one token) or a prompt chunk (a share of prefill_chunk);
 * when a pass brings n_done to n_toks its logits are sampled and the new token appended. So
 * prefill, decode and recomputation after preemption are one mechanism.
 *
 * One step: take new submissions and cancellations; end cancelled requests; admit waiting
 * requests while a slot is free and the pool has room for their prompt (in queue order; a
 * request that does not fit yet is passed over by later ones that do, at most max_bypass
 * times: see admit()); reserve KV blocks for
 * each running request's tokens of this step, oldest first, preempting the youngest when the
 * pool is full; one forward pass; commit full blocks to the prefix tree; sample; stream text.
 *
 * Locks: mu guards what other threads see (incoming, the live list, cancel flags, counters);
 * the model's pool_mu guards the KV cache and the forward pass (sessions of the same model on
 * other threads take it too). Order: pool_mu before mu. No lock is held while a callback runs.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cpu/cpu.h"
#include "kv/kv.h"
#include "model/model_int.h"
#include "sched/sched_int.h"
#ifdef SPARK_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

typedef struct sched_req sched_req;
struct sched_req {
    uint64_t id;
    sched_req *live_next, *live_prev; /* every request not yet done (mu) */
    sched_req *next;                  /* incoming or waiting list */
    engine_request r;                 /* r.gen: pointers into the copies below */
    int32_t *toks;                    /* [n_ctx]: prompt, then sampled tokens */
    int32_t n_toks;
    int32_t *stop_tokens;
    char **stop_strings;
    engine_sampler *smp;
    engine_gen_text text;
    bool have_text;
    engine_request_stats st;
    double t_submit;
    bool cancel;                      /* set by engine_sched_cancel (mu) */
    bool cancel_seen;                 /* the thread's copy */
    bool admitted_once, cache_noted, sampled_once;
    int32_t slot;                     /* -1 when not running */
    int32_t bypassed;                 /* later requests admitted while this one waited */
};

typedef struct {
    sched_req *rq;                    /* NULL: free */
    engine_kv_seq kvs;                /* batched mode: the block table */
    engine_kv_view *views;            /* [n_layer] over kvs */
    int32_t n_done;                   /* positions with KV */
    int32_t committed;                /* full blocks inserted into the prefix tree */
    engine_session *sess;             /* sessions mode */
} sched_slot;

struct engine_sched {
    engine_model *m;
    engine_sched_params p;
    bool batched;
    engine_kv_cache *kvc;             /* batched: m->kvc or own_kvc */
    engine_kv_cache *own_kvc;
    engine_fwd *fwd;
    /* batched mode on the GPU (SPARK_SCHED_GPU_BATCH=1): the pass is engine_cuda_batch_run over
     * a device pool with the block ids of kvc (an own pool whose host storage stays unused); no
     * prefix reuse: the GPU's blocks are not inserted into the tree */
    bool gpu_mode;
    void *gpu;                        /* engine_cuda_batch */
    void *gpu_seqs;                   /* [max_seqs] engine_cuda_batch_seq */
    float *gpu_logits;                /* [max_seqs][n_vocab], whole pages */
    bool gpu_logits_pinned;           /* page-locked for the pass's copies into it */
    sched_slot *slots;                /* [max_seqs] */
    int32_t *order;                   /* running slots, oldest admission first */
    int32_t n_running;
    engine_fwd_seq *batch;            /* [max_seqs] */
    int32_t *batch_slot;
    /* batched: the step's tokens drawn on the model's thread pool after the pass (requests
     * without a mask hook, which must run on this thread): [max_seqs] each; pre_rc 1: none */
    int32_t *pre_tok;
    int *pre_rc;
    double *pre_ms;
    sched_req *wait_head, *wait_tail; /* thread-private FIFO */
    int32_t n_vocab;
    /* sessions mode on the GPU: a request decoding alone draws its tokens on the GPU, steps
     * queued ahead (step_streak). On by default (SPARK_SCHED_GPU_STREAK=0: off): `spark-agent
     * bench -B 1 -p 128 -n 128`, Qwen3-30B-A3B Q4_K_M, 532.3 / 532.4 tok/s against 457.8 / 465.2
     * (+15%; H200, session 31 call A) */
    bool gpu_streak;
    /* a grammar's free mask and the one after each streak token: [2][words], made at the first
     * streak with a grammar */
    uint32_t *streak_bits;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    bool stopping;
    sched_req *in_head, *in_tail;
    sched_req *live;
    uint64_t next_id;
    engine_sched_stats stats;
};

static void lock(engine_sched *s) {
    pthread_mutex_lock(&s->mu);
}

static void unlock(engine_sched *s) {
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------------------------- */
static void req_free(sched_req *rq) {
    if (!rq) return;
    free(rq->toks);
    free(rq->stop_tokens);
    for (size_t i = 0; rq->stop_strings && i < rq->r.gen.n_stop_strings; i++)
        free(rq->stop_strings[i]);
    free(rq->stop_strings);
    engine_sampler_free(rq->smp);
    if (rq->have_text) engine_gen_text_deinit(&rq->text);
    free(rq);
}

/* Copy everything of r that the request needs after submit returns. */
static int req_new(sched_req **out, engine_sched *s, const engine_request *r) {
    const engine_gen_params *g = &r->gen;
    *out = NULL;
    sched_req *rq = calloc(1, sizeof *rq);
    if (!rq) return engine_err(ENGINE_ENOMEM, "out of memory for a request");
    rq->r = *r;
    rq->slot = -1;
    rq->r.gen.stop_tokens = NULL;
    rq->r.gen.stop_strings = NULL;
    int rc = ENGINE_ENOMEM;
    if (!(rq->toks = malloc(sizeof(int32_t) * (size_t)s->p.n_ctx))) goto nomem;
    memcpy(rq->toks, g->prompt, sizeof(int32_t) * g->n_prompt);
    rq->n_toks = (int32_t)g->n_prompt;
    rq->r.gen.prompt = rq->toks;
    if (g->n_stop_tokens) {
        if (!(rq->stop_tokens = malloc(sizeof(int32_t) * g->n_stop_tokens))) goto nomem;
        memcpy(rq->stop_tokens, g->stop_tokens, sizeof(int32_t) * g->n_stop_tokens);
        rq->r.gen.stop_tokens = rq->stop_tokens;
    }
    if (g->n_stop_strings) {
        if (!(rq->stop_strings = calloc(g->n_stop_strings, sizeof(char *)))) goto nomem;
        for (size_t i = 0; i < g->n_stop_strings; i++)
            if (!(rq->stop_strings[i] = strdup(g->stop_strings[i]))) goto nomem;
        rq->r.gen.stop_strings = (const char *const *)rq->stop_strings;
    }
    if ((rc = engine_sampler_new(&rq->smp, &g->sampling, s->n_vocab))) goto fail;
    if ((rc = engine_gen_text_init(&rq->text, s->m, &rq->r.gen, r->on_token, r->user)))
        goto fail;
    rq->have_text = true;
    for (size_t i = 0; i < g->n_prompt; i++)
        if ((rc = engine_sampler_accept(rq->smp, g->prompt[i], false))) goto fail;
    rq->st.gen.prompt_tokens = (int32_t)g->n_prompt;
    rq->st.cache_diverged_at = -1;
    *out = rq;
    return 0;
nomem:
    rc = engine_err(ENGINE_ENOMEM, "out of memory for a request of %zu prompt tokens",
                    g->n_prompt);
fail:
    req_free(rq);
    return rc;
}

static void wait_push_front(engine_sched *s, sched_req *rq) {
    rq->next = s->wait_head;
    s->wait_head = rq;
    if (!s->wait_tail) s->wait_tail = rq;
}

/* Unlink rq, which follows prev (NULL: rq is the head), from the waiting list. */
static void wait_remove(engine_sched *s, sched_req *prev, sched_req *rq) {
    if (prev) prev->next = rq->next;
    else s->wait_head = rq->next;
    if (s->wait_tail == rq) s->wait_tail = prev;
    rq->next = NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Slots and KV
 * ------------------------------------------------------------------------------------------- */
static int32_t blocks_for(const engine_sched *s, int32_t n_pos) {
    int32_t bs = s->kvc->p.block_size;
    return (n_pos + bs - 1) / bs;
}

/* Insert the slot's newly full blocks into the prefix tree (pool_mu held). */
static void slot_commit(engine_sched *s, sched_slot *sl) {
    if (s->gpu_mode) return; /* the tree holds no GPU blocks */
    int32_t full = sl->n_done / s->kvc->p.block_size;
    if (full <= sl->committed) return;
    engine_kv_prefix_insert(s->kvc, &sl->kvs, sl->rq->toks, sl->n_done);
    sl->committed = full;
}

/* Take the request out of its slot: its blocks stay in the prefix tree (cached; the partly
 * filled last one as a partial leaf), the rest go back to the pool at once. */
static void slot_release(engine_sched *s, sched_req *rq) {
    sched_slot *sl = &s->slots[rq->slot];
    pthread_mutex_lock(&s->m->pool_mu);
    if (s->batched) {
        if (sl->kvs.n_pos > sl->n_done) engine_kv_seq_truncate(s->kvc, &sl->kvs, sl->n_done);
        slot_commit(s, sl);
        /* the partly filled last block too: the next turn re-sends these tokens */
        if (!s->gpu_mode)
            engine_kv_prefix_insert_tail(s->kvc, &sl->kvs, sl->rq->toks, sl->n_done);
        engine_kv_seq_release(s->kvc, &sl->kvs);
    }
    pthread_mutex_unlock(&s->m->pool_mu);
    engine_session_free(sl->sess); /* takes pool_mu itself */
    sl->sess = NULL;
    sl->rq = NULL;
    sl->n_done = 0;
    sl->committed = 0;
    int32_t j = 0;
    for (int32_t i = 0; i < s->n_running; i++)
        if (s->order[i] != rq->slot) s->order[j++] = s->order[i];
    s->n_running = j;
    rq->slot = -1;
}

/* ---------------------------------------------------------------------------------------------
 * Completion
 * ------------------------------------------------------------------------------------------- */
static void req_finish(engine_sched *s, sched_req *rq, int rc) {
    if (rq->slot >= 0) slot_release(s, rq);
    if (rc == 0 && rq->have_text) rc = engine_gen_text_finish(&rq->text, &rq->st.gen.stop);
    if (rc == ENGINE_ECANCELED) rq->st.gen.stop = ENGINE_STOP_CANCELED;
    rq->st.total_ms = engine_time_ms() - rq->t_submit;
    lock(s);
    if (rq->live_prev) rq->live_prev->live_next = rq->live_next;
    else s->live = rq->live_next;
    if (rq->live_next) rq->live_next->live_prev = rq->live_prev;
    s->stats.requests_done++;
    if (rc == ENGINE_ECANCELED) s->stats.requests_canceled++;
    s->stats.prompt_tokens += (uint64_t)rq->st.gen.prompt_tokens;
    s->stats.cached_tokens += (uint64_t)rq->st.gen.cached_tokens;
    s->stats.generated_tokens += (uint64_t)rq->st.gen.generated_tokens;
    unlock(s);
    if (rq->r.on_done) rq->r.on_done(rq->r.user, rq->id, rc, &rq->st);
    req_free(rq);
}

/* A token drawn for the request (started at ts): count, accept, stream, decide; the token joins
 * rq->toks while the request goes on. Returns 0 with g->stop NONE (going on), 0 with a stop
 * reason, or an error; ending the request is the caller's (req_finish). */
static int req_take(engine_sched *s, sched_req *rq, int32_t tok, double ts) {
    engine_gen_stats *g = &rq->st.gen;
    g->generated_tokens++;
    if (!rq->sampled_once) {
        rq->sampled_once = true;
        rq->st.ttft_ms = ts - rq->t_submit;
    }
    int rc = engine_sampler_accept(rq->smp, tok, true);
    if (rc == 0) rc = engine_gen_text_token(&rq->text, tok, &g->stop);
    g->sample_ms += engine_time_ms() - ts;
    if (rc == 0 && g->stop == ENGINE_STOP_NONE) {
        int32_t max = rq->r.gen.max_tokens > 0 ? rq->r.gen.max_tokens : INT32_MAX;
        if (g->generated_tokens >= max) g->stop = ENGINE_STOP_LENGTH;
        else if (rq->n_toks >= s->p.n_ctx) g->stop = ENGINE_STOP_CONTEXT;
    }
    if (rc == 0 && g->stop == ENGINE_STOP_NONE) rq->toks[rq->n_toks++] = tok;
    return rc;
}

/* The logits after the request's last token are ready: sample (pre: the token already drawn
 * from them, or NULL), stream, decide. Returns true when the request is still running. */
static bool req_sample(engine_sched *s, sched_req *rq, const float *logits, const int32_t *pre) {
    double ts = engine_time_ms();
    int32_t tok = pre ? *pre : -1;
    int rc = pre ? 0 : engine_sampler_sample(rq->smp, logits, &tok);
    if (rc == 0)
        rc = req_take(s, rq, tok, ts);
    else
        rq->st.gen.sample_ms += engine_time_ms() - ts;
    if (rc || rq->st.gen.stop != ENGINE_STOP_NONE) {
        req_finish(s, rq, rc);
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------------------------------------
 * Admission and preemption
 * ------------------------------------------------------------------------------------------- */
/* The cache-miss explainer of the first admission (a recomputation does not change it). */
static void note_cached(sched_req *rq, int32_t cached, int32_t diverged_at) {
    if (rq->cache_noted) return;
    rq->cache_noted = true;
    rq->st.gen.cached_tokens = cached;
    rq->st.cache_diverged_at = diverged_at;
}

static int32_t free_slot(engine_sched *s) {
    for (int32_t i = 0; i < s->p.max_seqs; i++)
        if (!s->slots[i].rq) return i;
    return -1;
}

static void slot_take(engine_sched *s, int32_t i, sched_req *rq) {
    s->slots[i].rq = rq;
    rq->slot = i;
    if (!rq->admitted_once) {
        rq->st.queue_ms = engine_time_ms() - rq->t_submit;
        lock(s);
        rq->st.admitted_step = s->stats.steps;
        unlock(s);
    }
    rq->admitted_once = true;
    s->order[s->n_running++] = i;
}

/* Batched mode: attach the longest cached prefix and keep the request when the pool has room
 * for the rest of its tokens plus a block for each running request's next token. Returns 1
 * admitted, 0 not now (left waiting), or an error for the request (pool_mu held). */
static int admit_batched(engine_sched *s, sched_req *rq, int32_t slot) {
    engine_kv_stats ks;
    engine_kv_cache_stats(s->kvc, &ks);
    if (blocks_for(s, rq->n_toks + 1) > ks.n_blocks - ks.n_pinned)
        return engine_err(ENGINE_ENOMEM, "the request needs %d KV blocks of %d positions; the "
                          "pool has %d (%d pinned)", blocks_for(s, rq->n_toks + 1),
                          ks.block_size, ks.n_blocks, ks.n_pinned);
    sched_slot *sl = &s->slots[slot];
    engine_kv_match km = {0, 0, -1};
    if (s->gpu_mode ? sl->kvs.n_blocks != 0
                    : engine_kv_prefix_attach(s->kvc, &sl->kvs, rq->toks, rq->n_toks,
                                              rq->n_toks - 1, &km))
        return engine_err(ENGINE_EINTERNAL, "sched: a free slot's block table is not empty");
    int32_t need = blocks_for(s, rq->n_toks + 1) - sl->kvs.n_blocks + s->n_running;
    engine_kv_cache_stats(s->kvc, &ks);
    int32_t avail = ks.n_free + ks.n_cached - ks.n_pinned;
    if (s->n_running > 0 && need > avail) {
        engine_kv_seq_release(s->kvc, &sl->kvs);
        return 0;
    }
    sl->n_done = km.cached_tokens;
    sl->committed = km.cached_tokens / s->kvc->p.block_size;
    slot_take(s, slot, rq);
    note_cached(rq, km.cached_tokens, km.diverged_at);
    return 1;
}

static int admit_session(engine_sched *s, sched_req *rq, int32_t slot) {
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_ctx = s->p.n_ctx;
    sp.n_batch = s->p.prefill_chunk;
    int rc = engine_session_new(&s->slots[slot].sess, s->m, &sp);
    if (rc) return rc;
    slot_take(s, slot, rq);
    return 1;
}

/* Admission, in queue order, without head-of-line blocking: a request that does not fit now
 * (its blocks, or in sessions mode its session's memory, are not free while others run) keeps
 * its place and the walk goes on to the requests behind it, which are admitted when they fit.
 * Each admission that passes over waiting requests counts one bypass for each of them; a
 * waiting request already passed over max_bypass times stops the walk, so nothing behind it is
 * admitted until it is: it then waits only for running requests to end, which they do within
 * their max_tokens / n_ctx, and it cannot starve. (A request that could never fit the pool
 * ends at once with ENGINE_ENOMEM.) max_bypass -1 is strict first come, first served. */
static void admit(engine_sched *s) {
    sched_req *prev = NULL, *rq = s->wait_head;
    int32_t blocked = 0; /* waiting requests passed over in this walk */
    while (rq) {
        int32_t slot = free_slot(s);
        if (slot < 0) return;
        int rc;
        if (s->batched) {
            pthread_mutex_lock(&s->m->pool_mu);
            rc = admit_batched(s, rq, slot);
            pthread_mutex_unlock(&s->m->pool_mu);
        } else {
            rc = admit_session(s, rq, slot);
            if (rc == ENGINE_ENOMEM && s->n_running > 0) rc = 0; /* memory comes back later */
        }
        sched_req *next = rq->next;
        if (rc == 0) { /* not now: keep its place */
            if (s->p.max_bypass < 0 || rq->bypassed >= s->p.max_bypass) return;
            blocked++;
            prev = rq;
            rq = next;
            continue;
        }
        wait_remove(s, prev, rq);
        if (rc < 0) {
            req_finish(s, rq, rc);
        } else if (blocked) {
            bool limit = false;
            for (sched_req *w = s->wait_head; w && w != next; w = w->next)
                limit |= ++w->bypassed >= s->p.max_bypass;
            if (limit) return; /* one of them may be passed no more */
        }
        rq = next;
    }
}

/* Give the youngest running request's blocks back and queue it first for recomputation. */
static void preempt(engine_sched *s, int32_t slot) {
    sched_req *rq = s->slots[slot].rq;
    pthread_mutex_unlock(&s->m->pool_mu);
    slot_release(s, rq);
    pthread_mutex_lock(&s->m->pool_mu);
    rq->st.preemptions++;
    wait_push_front(s, rq);
    lock(s);
    s->stats.preemptions++;
    unlock(s);
}

/* ---------------------------------------------------------------------------------------------
 * Steps
 * ------------------------------------------------------------------------------------------- */

/* Tokens the slot's request runs this step (0: none), within *budget for prompt chunks. */
static int32_t step_tokens(const sched_slot *sl, int32_t *budget) {
    int32_t pending = sl->rq->n_toks - sl->n_done;
    if (pending <= 1) return pending; /* a decode never waits for the prefill budget */
    int32_t n = ENGINE_MIN(pending, *budget);
    *budget -= n;
    return n;
}

#ifdef SPARK_HAVE_CUDA
/* The GPU pass over the step's sequences (pool_mu held): their block tables as they are. */
static int gpu_run(engine_sched *s, int32_t n_batch) {
    engine_cuda_batch_seq *g = s->gpu_seqs;
    for (int32_t b = 0; b < n_batch; b++) {
        engine_fwd_seq *q = &s->batch[b];
        const sched_slot *sl = &s->slots[s->batch_slot[b]];
        float *out = q->logits ? s->gpu_logits + (size_t)b * s->n_vocab : NULL;
        g[b] = (engine_cuda_batch_seq){q->tokens, q->n, q->p0, sl->kvs.blocks, sl->kvs.n_blocks,
                                       out};
        q->logits_out = out;
    }
    return engine_cuda_batch_run(s->gpu, g, n_batch);
}

static int gpu_new(engine_sched *s) {
    engine_kv_stats ks;
    engine_kv_cache_stats(s->kvc, &ks);
    s->gpu_seqs = calloc((size_t)s->p.max_seqs, sizeof(engine_cuda_batch_seq));
    /* whole pages, page-locked: each step copies max_seqs x n_vocab floats into it (608 KB a
     * sequence for Qwen3), which pageable memory would take through the driver's staging;
     * unpinned, the copies still work */
    const size_t lb = (sizeof(float) * (size_t)s->p.max_seqs * (size_t)s->n_vocab + 4095) &
                      ~(size_t)4095;
    if (posix_memalign((void **)&s->gpu_logits, 4096, lb)) s->gpu_logits = NULL;
    if (!s->gpu_seqs || !s->gpu_logits)
        return engine_err(ENGINE_ENOMEM, "out of memory for a scheduler");
    s->gpu_logits_pinned = engine_cuda_host_pin(s->gpu_logits, lb) == 0;
    return engine_cuda_batch_new((engine_cuda_batch **)&s->gpu, s->m->cuda, ks.n_blocks,
                                 ks.block_size, s->p.n_ctx, s->p.prefill_chunk + s->p.max_seqs,
                                 s->p.max_seqs, s->m->kv_type);
}
#endif

typedef struct {
    engine_sched *s;
    int32_t n_batch;
} presample_job;

/* Thread ith of nth: draw the tokens of its share of the step's sequences whose logits are
 * out, for requests without a mask hook (the samplers are the requests' own; a failure is
 * drawn again on the scheduler thread for its message). */
static void presample_fn(void *ctx, int ith, int nth) {
    const presample_job *j = ctx;
    engine_sched *s = j->s;
    int64_t b0, b1;
    engine_split(j->n_batch, ith, nth, &b0, &b1);
    for (int64_t b = b0; b < b1; b++) {
        const sched_req *rq = s->slots[s->batch_slot[b]].rq;
        const float *l = s->batch[b].logits_out;
        s->pre_rc[b] = 1;
        if (!l || rq->r.gen.sampling.mask) continue;
        const double t0 = engine_time_ms();
        s->pre_rc[b] = engine_sampler_sample(rq->smp, l, &s->pre_tok[b]);
        s->pre_ms[b] = engine_time_ms() - t0;
    }
}

static void step_batched(engine_sched *s) {
    int32_t budget = s->p.prefill_chunk, n_batch = 0;
    double t0 = engine_time_ms();
    pthread_mutex_lock(&s->m->pool_mu);
    for (int32_t i = 0; i < s->n_running; i++) {
        int32_t si = s->order[i];
        sched_slot *sl = &s->slots[si];
        int32_t n = step_tokens(sl, &budget);
        if (n == 0) continue;
        int rc;
        while ((rc = engine_kv_seq_extend(s->kvc, &sl->kvs, sl->n_done + n)) == ENGINE_ENOMEM) {
            if (s->n_running == 1) break;
            int32_t young = s->order[s->n_running - 1];
            preempt(s, young); /* the youngest is never in this step's batch yet */
            if (young == si) break;
        }
        if (sl->rq == NULL) continue; /* preempted itself */
        if (rc) {
            if (sl->kvs.n_pos > sl->n_done) engine_kv_seq_truncate(s->kvc, &sl->kvs, sl->n_done);
            sched_req *rq = sl->rq;
            pthread_mutex_unlock(&s->m->pool_mu);
            if (rc == ENGINE_ENOMEM)
                rc = engine_err(ENGINE_ENOMEM, "the KV pool is exhausted at %d positions of "
                                "this request", sl->n_done + n);
            req_finish(s, rq, rc);
            pthread_mutex_lock(&s->m->pool_mu);
            i--; /* the order array shifted */
            continue;
        }
        engine_fwd_seq *q = &s->batch[n_batch];
        q->tokens = sl->rq->toks + sl->n_done;
        q->n = n;
        q->p0 = sl->n_done;
        q->views = sl->views;
        q->logits = sl->n_done + n == sl->rq->n_toks;
        s->batch_slot[n_batch++] = si;
    }
    if (n_batch == 0) {
        pthread_mutex_unlock(&s->m->pool_mu);
        return;
    }
#ifdef SPARK_HAVE_CUDA
    int rc = s->gpu_mode ? gpu_run(s, n_batch)
                         : engine_fwd_run_batch(s->m, s->fwd, s->batch, n_batch);
#else
    int rc = engine_fwd_run_batch(s->m, s->fwd, s->batch, n_batch);
#endif
    for (int32_t b = 0; b < n_batch; b++) {
        sched_slot *sl = &s->slots[s->batch_slot[b]];
        if (rc) {
            engine_kv_seq_truncate(s->kvc, &sl->kvs, sl->n_done);
            continue;
        }
        sl->n_done += s->batch[b].n;
        slot_commit(s, sl);
    }
    /* the samplers of the step in parallel on the model's pool (idle now; pool_mu held) */
    const bool pre = rc == 0 && n_batch > 1 && engine_pool_size(s->m->pool) > 1;
    if (pre) {
        presample_job pj = {s, n_batch};
        engine_pool_run(s->m->pool, presample_fn, &pj);
    }
    pthread_mutex_unlock(&s->m->pool_mu);
    double ms = engine_time_ms() - t0;
    for (int32_t b = 0; b < n_batch; b++) {
        sched_slot *sl = &s->slots[s->batch_slot[b]];
        sched_req *rq = sl->rq;
        if (rc) {
            req_finish(s, rq, rc);
            continue;
        }
        engine_gen_stats *g = &rq->st.gen;
        bool decode = s->batch[b].n == 1 && g->generated_tokens > 0 &&
                      sl->n_done == rq->n_toks;
        if (decode) {
            g->decode_ms += ms;
            g->decode_tokens++;
        } else {
            g->prefill_ms += ms;
        }
        if (!s->batch[b].logits_out) continue;
        if (pre && s->pre_rc[b] == 0) {
            rq->st.gen.sample_ms += s->pre_ms[b];
            req_sample(s, rq, s->batch[b].logits_out, &s->pre_tok[b]);
        } else {
            req_sample(s, rq, s->batch[b].logits_out, NULL);
        }
    }
}

/* step_streak's callback: a token the GPU drew after the step that appended the one before it
 * (req_take; the request's end is left to step_streak: req_finish frees the session, which
 * takes the lock the stream holds). Stops the streak at the request's end, when a request or a
 * cancel comes in, or when the request's grammar leaves its free stretch (allow: its mask
 * there; the ordinary step then appends the token and draws the next with the mask hook). */
typedef struct {
    engine_sched *s;
    sched_slot *sl;
    sched_req *rq;
    int rc;
    bool done;
    double t;
    const uint32_t *allow;
    uint32_t *cmp;
} streak;

static int streak_token(void *user, int32_t tok) {
    streak *c = user;
    sched_req *rq = c->rq;
    engine_gen_stats *g = &rq->st.gen;
    const double ts = engine_time_ms();
    c->sl->n_done++;
    g->decode_ms += ts - c->t;
    g->decode_tokens++;
    const int rc = req_take(c->s, rq, tok, ts);
    c->t = engine_time_ms();
    if (rc || g->stop != ENGINE_STOP_NONE) {
        c->rc = rc;
        c->done = true;
        return 1;
    }
    if (c->allow) {
        const int fr = engine_gen_free_still(&rq->r.gen.sampling, c->allow, c->cmp, c->s->n_vocab);
        if (fr <= 0) {
            c->rc = fr;
            c->done = fr < 0;
            return 1;
        }
    }
    lock(c->s);
    const bool other = c->s->in_head || c->s->stopping || rq->cancel;
    unlock(c->s);
    return other ? 1 : 0;
}

/* Sessions mode: the only running request, decoding on the GPU with sampling it draws there
 * (engine_session_gpu_draws: with a grammar, through its free stretches), runs its next steps
 * back to back with only token ids crossing to this thread. Returns false where it does not
 * apply (the ordinary step then runs). */
static bool step_streak(engine_sched *s) {
    if (!s->gpu_streak || s->n_running != 1 || s->wait_head) return false;
    sched_slot *sl = &s->slots[s->order[0]];
    sched_req *rq = sl->rq;
    engine_gen_stats *g = &rq->st.gen;
    const engine_sampling_params *sp = &rq->r.gen.sampling;
    if (g->generated_tokens == 0 || sl->n_done != rq->n_toks - 1 ||
        !engine_session_gpu_draws(sl->sess, sp))
        return false;
    const size_t words = ((size_t)s->n_vocab + 31) / 32;
    const uint32_t *allow = NULL;
    if (sp->mask) { /* a grammar (engine_session_gpu_draws: with free_mask): free now? */
        if (!s->streak_bits && !(s->streak_bits = malloc(2 * words * sizeof *s->streak_bits)))
            return false; /* the ordinary step: no memory for the masks is no error */
        const int fr = sp->free_mask(sp->grammar_user, s->streak_bits, s->n_vocab);
        if (fr < 0) {
            req_finish(s, rq, engine_err(ENGINE_ECANCELED, "the grammar's free_mask hook aborted"));
            return true;
        }
        if (fr != 1) return false;
        allow = s->streak_bits;
    }
    int64_t max = rq->r.gen.max_tokens > 0 ? rq->r.gen.max_tokens : INT32_MAX;
    int64_t steps = max - g->generated_tokens;
    const int64_t room = engine_session_n_ctx(sl->sess) - engine_session_n_tokens(sl->sess);
    if (steps > room) steps = room;
    if (steps < 1) return false;
    streak c = {
        s, sl, rq, 0, false, engine_time_ms(), allow, allow ? s->streak_bits + words : NULL};
    int rc = engine_session_gpu_generate(sl->sess, rq->toks[sl->n_done], (int32_t)steps, sp, allow,
                                         streak_token, &c);
    if (c.done) req_finish(s, rq, c.rc);
    else if (rc) req_finish(s, rq, rc);
    return true;
}

static void step_sessions(engine_sched *s) {
    if (step_streak(s)) return;
    int32_t budget = s->p.prefill_chunk;
    for (int32_t i = 0; i < s->n_running; i++) {
        sched_slot *sl = &s->slots[s->order[i]];
        sched_req *rq = sl->rq;
        int32_t n = step_tokens(sl, &budget);
        /* a session attaches the cached prefix of its first append only: give it the whole
         * prompt when there is a prefix cache (the CPU; the GPU has none and goes by chunks) */
        if (sl->n_done == 0 && s->m->kvc) n = rq->n_toks;
        if (n == 0) continue;
        double t0 = engine_time_ms();
        int rc = engine_session_append(sl->sess, rq->toks + sl->n_done, (size_t)n, NULL);
        double ms = engine_time_ms() - t0;
        if (rc) {
            req_finish(s, rq, rc);
            i--;
            continue;
        }
        if (sl->n_done == 0) note_cached(rq, sl->sess->kv_cached, sl->sess->kv_diverged_at);
        sl->n_done += n;
        engine_gen_stats *g = &rq->st.gen;
        if (n == 1 && g->generated_tokens > 0 && sl->n_done == rq->n_toks) {
            g->decode_ms += ms;
            g->decode_tokens++;
        } else {
            g->prefill_ms += ms;
        }
        if (sl->n_done == rq->n_toks && !req_sample(s, rq, engine_session_logits(sl->sess), NULL))
            i--;
    }
}

/* ---------------------------------------------------------------------------------------------
 * The thread
 * ------------------------------------------------------------------------------------------- */

/* Take new submissions and cancel flags; wait while there is nothing to do. Returns false when
 * the scheduler stops. */
static bool step_begin(engine_sched *s) {
    lock(s);
    while (!s->stopping && !s->in_head && s->n_running == 0 && !s->wait_head)
        pthread_cond_wait(&s->cv, &s->mu);
    if (s->in_head) {
        if (s->wait_tail) s->wait_tail->next = s->in_head;
        else s->wait_head = s->in_head;
        s->wait_tail = s->in_tail;
        s->in_head = s->in_tail = NULL;
    }
    for (sched_req *rq = s->live; rq; rq = rq->live_next) rq->cancel_seen = rq->cancel;
    bool stop = s->stopping;
    unlock(s);
    return !stop;
}

static void cancel_marked(engine_sched *s, bool all) {
    for (int32_t i = 0; i < s->n_running; i++) {
        sched_req *rq = s->slots[s->order[i]].rq;
        if (!all && !rq->cancel_seen) continue;
        req_finish(s, rq, engine_err(ENGINE_ECANCELED, "request %llu cancelled",
                                     (unsigned long long)rq->id));
        i--;
    }
    sched_req **pp = &s->wait_head, *last = NULL;
    while (*pp) {
        sched_req *rq = *pp;
        if (all || rq->cancel_seen) {
            *pp = rq->next;
            req_finish(s, rq, engine_err(ENGINE_ECANCELED, "request %llu cancelled",
                                         (unsigned long long)rq->id));
        } else {
            last = rq;
            pp = &rq->next;
        }
    }
    s->wait_tail = last;
}

static void stats_snapshot(engine_sched *s) {
    engine_kv_stats ks;
    memset(&ks, 0, sizeof ks);
    engine_kv_cache *c = s->batched ? s->kvc : s->m->kvc;
    if (c) {
        pthread_mutex_lock(&s->m->pool_mu);
        engine_kv_cache_stats(c, &ks);
        pthread_mutex_unlock(&s->m->pool_mu);
    }
    int32_t waiting = 0;
    for (sched_req *rq = s->wait_head; rq; rq = rq->next) waiting++;
    lock(s);
    s->stats.running = s->n_running;
    s->stats.queued = waiting;
    for (sched_req *rq = s->in_head; rq; rq = rq->next) s->stats.queued++;
    s->stats.blocks_total = ks.n_blocks;
    s->stats.blocks_used = ks.n_used;
    s->stats.blocks_cached = ks.n_cached;
    s->stats.blocks_pinned = ks.n_pinned;
    s->stats.block_tokens = ks.block_size;
    unlock(s);
}

static void *sched_main(void *arg) {
    engine_sched *s = arg;
    while (step_begin(s)) {
        cancel_marked(s, false);
        admit(s);
        if (s->n_running > 0) {
            if (s->batched) step_batched(s);
            else step_sessions(s);
            lock(s);
            s->stats.steps++;
            unlock(s);
        }
        stats_snapshot(s);
    }
    /* stopping: every request still here ends cancelled; on_done callbacks may submit more,
     * which submit refuses once stopping is set */
    step_begin(s);
    cancel_marked(s, true);
    stats_snapshot(s);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * API
 * ------------------------------------------------------------------------------------------- */
void engine_sched_free(engine_sched *s) {
    if (!s) return;
    if (s->thread_started) {
        lock(s);
        s->stopping = true;
        pthread_cond_signal(&s->cv);
        unlock(s);
        pthread_join(s->thread, NULL);
    }
    for (int32_t i = 0; s->slots && i < s->p.max_seqs; i++) {
        sched_slot *sl = &s->slots[i];
        if (s->kvc) {
            pthread_mutex_lock(&s->m->pool_mu);
            engine_kv_seq_deinit(s->kvc, &sl->kvs);
            pthread_mutex_unlock(&s->m->pool_mu);
        }
        free(sl->views);
    }
    free(s->slots);
    free(s->order);
    free(s->batch);
    free(s->batch_slot);
    free(s->pre_tok);
    free(s->pre_rc);
    free(s->pre_ms);
    free(s->streak_bits);
    engine_fwd_free(s->fwd);
#ifdef SPARK_HAVE_CUDA
    engine_cuda_batch_free(s->gpu);
    if (s->gpu_logits_pinned) engine_cuda_host_unpin(s->gpu_logits);
#endif
    free(s->gpu_seqs);
    free(s->gpu_logits);
    engine_kv_cache_free(s->own_kvc);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* The paged pool of batched mode: the model's prefix cache, or one of n_ctx * max_seqs
 * positions of the model's KV type (engine_model_params.kv_type) owned by the scheduler. */
static int sched_pool(engine_sched *s) {
    engine_model *m = s->m;
    if (m->kvc && !s->gpu_mode) {
        s->kvc = m->kvc;
        return 0;
    }
    const engine_hparams *hp = &m->hp;
    int64_t blocks = (int64_t)s->p.max_seqs *
                     ((s->p.n_ctx + ENGINE_KV_BLOCK_SIZE - 1) / ENGINE_KV_BLOCK_SIZE);
    size_t block_bytes = (size_t)hp->n_layer * 2 * ENGINE_KV_BLOCK_SIZE *
                         engine_cpu_kv_row_bytes(m->kv_type, (int)hp->n_head_kv,
                                                 (int)hp->head_dim_k);
    engine_kv_params kp = {(int32_t)hp->n_layer, (int32_t)hp->n_head_kv, (int32_t)hp->head_dim_k,
                           m->kv_type, 0, (size_t)blocks * block_bytes, 0, 0};
    int rc = engine_kv_cache_new(&s->own_kvc, &kp);
    s->kvc = s->own_kvc;
    return rc;
}

int engine_sched_new_mode(engine_sched **out, engine_model *m, const engine_sched_params *p,
                          engine_sched_mode mode) {
    *out = NULL;
    engine_sched_params sp = ENGINE_SCHED_PARAMS_INIT;
    if (p) {
        if (p->version != ENGINE_SCHED_PARAMS_VERSION)
            return engine_err(ENGINE_EINVAL, "scheduler params of version %d (this engine knows "
                              "%d)", p->version, ENGINE_SCHED_PARAMS_VERSION);
        sp = *p;
    }
    if (!m || m->info.vocab_only)
        return engine_err(ENGINE_EINVAL, "the scheduler needs a model loaded with its weights");
    if (sp.max_seqs == 0) sp.max_seqs = 16;
    if (sp.max_queue == 0) sp.max_queue = 1024;
    if (sp.prefill_chunk == 0) sp.prefill_chunk = 256;
    if (sp.max_bypass == 0) sp.max_bypass = 8;
    if (sp.n_ctx == 0) sp.n_ctx = m->info.n_ctx;
    if (sp.max_seqs < 1 || sp.max_seqs > 1024 || sp.max_queue < 1 || sp.prefill_chunk < 1 ||
        sp.prefill_chunk > 8192 || sp.n_ctx < 1 || sp.n_ctx > m->info.n_ctx_train ||
        sp.max_bypass < -1)
        return engine_err(ENGINE_EINVAL, "scheduler params out of range: max_seqs %d (1..1024), "
                          "max_queue %d (>= 1), prefill_chunk %d (1..8192), n_ctx %d (1..%d), "
                          "max_bypass %d (>= -1)", sp.max_seqs, sp.max_queue, sp.prefill_chunk,
                          sp.n_ctx, m->info.n_ctx_train, sp.max_bypass);
    bool gpu_batch = false; /* the GPU's batched pass: off by default until verified */
#ifdef SPARK_HAVE_CUDA
    const char *gb = getenv("SPARK_SCHED_GPU_BATCH");
    gpu_batch = m->cuda && !m->q35 && gb && !strcmp(gb, "1");
#endif
    bool can_batch = (!m->cuda || gpu_batch) && (m->hp.arch == ENGINE_ARCH_QWEN3MOE ||
                                                 m->hp.arch == ENGINE_ARCH_QWEN3);
    if (mode == ENGINE_SCHED_MODE_BATCHED && !can_batch)
        return engine_err(ENGINE_EUNSUPPORTED, "%s: no batched forward pass for this model "
                          "(architecture or device)", m->path);
    engine_sched *s = calloc(1, sizeof *s);
    if (!s) return engine_err(ENGINE_ENOMEM, "out of memory for a scheduler");
    s->m = m;
    s->p = sp;
    s->batched = mode == ENGINE_SCHED_MODE_BATCHED || (mode == ENGINE_SCHED_MODE_AUTO && can_batch);
    s->gpu_mode = s->batched && m->cuda;
    const char *gs = getenv("SPARK_SCHED_GPU_STREAK");
    s->gpu_streak = !s->batched && m->cuda && !(gs && !strcmp(gs, "0"));
    s->n_vocab = engine_model_n_vocab(m);
    s->next_id = 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int rc = 0;
    s->slots = calloc((size_t)sp.max_seqs, sizeof *s->slots);
    s->order = calloc((size_t)sp.max_seqs, sizeof *s->order);
    s->batch = calloc((size_t)sp.max_seqs, sizeof *s->batch);
    s->batch_slot = calloc((size_t)sp.max_seqs, sizeof *s->batch_slot);
    s->pre_tok = calloc((size_t)sp.max_seqs, sizeof *s->pre_tok);
    s->pre_rc = calloc((size_t)sp.max_seqs, sizeof *s->pre_rc);
    s->pre_ms = calloc((size_t)sp.max_seqs, sizeof *s->pre_ms);
    if (!s->slots || !s->order || !s->batch || !s->batch_slot || !s->pre_tok || !s->pre_rc ||
        !s->pre_ms) {
        rc = engine_err(ENGINE_ENOMEM, "out of memory for a scheduler of %d sequences",
                        sp.max_seqs);
        goto fail;
    }
    if (s->batched) {
        if ((rc = sched_pool(s))) goto fail;
#ifdef SPARK_HAVE_CUDA
        if (s->gpu_mode && (rc = gpu_new(s))) goto fail;
#endif
        if (!s->gpu_mode && (rc = engine_fwd_batch_new(&s->fwd, m, sp.n_ctx,
                                                       sp.prefill_chunk + sp.max_seqs,
                                                       sp.max_seqs)))
            goto fail;
        for (int32_t i = 0; i < sp.max_seqs; i++) {
            sched_slot *sl = &s->slots[i];
            pthread_mutex_lock(&m->pool_mu);
            rc = engine_kv_seq_init(s->kvc, &sl->kvs, sp.n_ctx);
            pthread_mutex_unlock(&m->pool_mu);
            if (rc) goto fail;
            if (!(sl->views = malloc(sizeof *sl->views * m->hp.n_layer))) {
                rc = engine_err(ENGINE_ENOMEM, "out of memory for a scheduler");
                goto fail;
            }
            for (uint32_t l = 0; l < m->hp.n_layer; l++)
                sl->views[l] = engine_kv_seq_view(s->kvc, &sl->kvs, (int32_t)l);
        }
    }
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        rc = engine_err(ENGINE_ENOMEM, "cannot start the scheduler thread");
        goto fail;
    }
    s->thread_started = true;
    stats_snapshot(s);
    if (s->batched) {
        engine_kv_stats ks;
        pthread_mutex_lock(&m->pool_mu);
        engine_kv_cache_stats(s->kvc, &ks);
        pthread_mutex_unlock(&m->pool_mu);
        engine_log(ENGINE_LOG_INFO, "scheduler: batched, %d sequences of %d positions, %d-token "
                   "prefill chunks; KV pool %s: %s, %d blocks of %d positions (%.1f MiB)",
                   sp.max_seqs, sp.n_ctx, sp.prefill_chunk,
                   s->gpu_mode ? "on the GPU (no prefix reuse)"
                   : s->own_kvc ? "own"
                                : "the model's",
                   engine_kv_type_name(ks.type), ks.n_blocks, ks.block_size,
                   (double)ks.total_bytes / (1 << 20));
    } else {
        engine_log(ENGINE_LOG_INFO, "scheduler: one session per request (%s), %d sequences of %d "
                   "positions", m->cuda ? "the GPU path is batch-1" : can_batch ? "as asked"
                   : "no batched pass for this architecture", sp.max_seqs, sp.n_ctx);
    }
    *out = s;
    return 0;
fail:
    engine_sched_free(s);
    return rc;
}

int engine_sched_new(engine_sched **out, engine_model *m, const engine_sched_params *p) {
    return engine_sched_new_mode(out, m, p, ENGINE_SCHED_MODE_AUTO);
}

int engine_sched_submit(engine_sched *s, const engine_request *r, uint64_t *id) {
    if (id) *id = 0;
    if (!s || !r || !id) return engine_err(ENGINE_EINVAL, "submit: missing argument");
    int rc = engine_gen_check_params(&r->gen);
    if (rc) return rc;
    if (r->gen.mtp_draft > 0) /* not silently dropped: the scheduler has no speculative step */
        return engine_err(ENGINE_EUNSUPPORTED, "speculative decoding (mtp_draft = %d) runs through "
                          "engine_generate only, not the scheduler", r->gen.mtp_draft);
    if (r->gen.n_prompt > (size_t)s->p.n_ctx)
        return engine_err(ENGINE_ERANGE, "the prompt has %zu tokens but a request holds %d",
                          r->gen.n_prompt, s->p.n_ctx);
    for (size_t i = 0; i < r->gen.n_prompt; i++)
        if (r->gen.prompt[i] < 0 || r->gen.prompt[i] >= s->n_vocab)
            return engine_err(ENGINE_EINVAL, "token id %d at %zu is not in [0, %d)",
                              r->gen.prompt[i], i, s->n_vocab);
    sched_req *rq;
    if ((rc = req_new(&rq, s, r))) return rc;
    rq->t_submit = engine_time_ms();
    lock(s);
    if (s->stopping) rc = engine_err(ENGINE_EINVAL, "the scheduler is shutting down");
    else if (s->stats.queued >= s->p.max_queue)
        rc = engine_err(ENGINE_ERANGE, "the queue is full (%d waiting requests)",
                        s->stats.queued);
    if (rc) {
        unlock(s);
        req_free(rq);
        return rc;
    }
    rq->id = s->next_id++;
    rq->live_next = s->live;
    if (s->live) s->live->live_prev = rq;
    s->live = rq;
    if (s->in_tail) s->in_tail->next = rq;
    else s->in_head = rq;
    s->in_tail = rq;
    s->stats.queued++;
    *id = rq->id;
    pthread_cond_signal(&s->cv);
    unlock(s);
    return 0;
}

int engine_sched_cancel(engine_sched *s, uint64_t id) {
    if (!s) return engine_err(ENGINE_EINVAL, "cancel: no scheduler");
    lock(s);
    sched_req *rq = s->live;
    while (rq && rq->id != id) rq = rq->live_next;
    if (rq) {
        rq->cancel = true;
        pthread_cond_signal(&s->cv);
    }
    unlock(s);
    if (!rq) return engine_err(ENGINE_EINVAL, "no request %llu (unknown or already done)",
                               (unsigned long long)id);
    return 0;
}

void engine_sched_stats_get(engine_sched *s, engine_sched_stats *out) {
    lock(s);
    *out = s->stats;
    unlock(s);
}
