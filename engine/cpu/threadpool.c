/* Persistent thread pool with a spin-then-sleep hand-off (see cpu.h for the contract). */
#include "cpu.h"

#include "common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

/* How a thread waits: POOL_SPIN polls with a pause (a forward pass hands out a job every few
 * microseconds, so this keeps the token loop off the futex), then POOL_YIELDS polls that give
 * the core away (when there are more runnable threads than cores, the thread we wait for may
 * be waiting for our core: spinning there would stall the whole pass for a time slice), then
 * sleep on the condition variable (an idle engine burns nothing). */
#define POOL_SPIN 2000
#define POOL_YIELDS 64

typedef struct {
    engine_pool *pool;
    int ith;
} pool_worker;

struct engine_pool {
    int n;
    pthread_t *threads;
    pool_worker *workers;
    int n_started;

    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    atomic_uint gen;      /* bumped for every job */
    atomic_int pending;   /* workers still inside the current job */
    atomic_bool quit;
    engine_pool_fn fn;
    void *ctx;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *pool_main(void *arg) {
    pool_worker *w = arg;
    engine_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load(&p->gen);
        for (int i = 0; g == seen && i < POOL_SPIN; i++) {
            cpu_relax();
            g = atomic_load(&p->gen);
        }
        for (int i = 0; g == seen && i < POOL_YIELDS; i++) {
            sched_yield();
            g = atomic_load(&p->gen);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->cv_work, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load(&p->quit)) return NULL;
        p->fn(p->ctx, w->ith, p->n);
        if (atomic_fetch_sub(&p->pending, 1) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int engine_pool_new(engine_pool **out, int n_threads) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return engine_err(ENGINE_EINVAL, "thread count %d out of range [1, 1024]", n_threads);
    engine_pool *p = calloc(1, sizeof *p);
    if (!p) return engine_err(ENGINE_ENOMEM, "out of memory for the thread pool");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->quit, false);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads, sizeof *p->threads);
        p->workers = calloc((size_t)n_threads, sizeof *p->workers);
        if (!p->threads || !p->workers) {
            engine_pool_free(p);
            return engine_err(ENGINE_ENOMEM, "out of memory for %d threads", n_threads);
        }
        for (int i = 1; i < n_threads; i++) {
            p->workers[i] = (pool_worker){p, i};
            if (pthread_create(&p->threads[i], NULL, pool_main, &p->workers[i]) != 0) {
                engine_pool_free(p);
                return engine_err(ENGINE_ENOMEM, "cannot start worker thread %d of %d", i,
                                  n_threads);
            }
            p->n_started = i;
        }
    }
    *out = p;
    return 0;
}

void engine_pool_free(engine_pool *p) {
    if (!p) return;
    if (p->n_started > 0) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->quit, true);
        atomic_fetch_add(&p->gen, 1);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i <= p->n_started; i++) pthread_join(p->threads[i], NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    free(p->threads);
    free(p->workers);
    free(p);
}

int engine_pool_size(const engine_pool *p) {
    return p->n;
}

void engine_pool_run(engine_pool *p, engine_pool_fn fn, void *ctx) {
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    for (int i = 0; atomic_load(&p->pending) > 0 && i < POOL_SPIN; i++) cpu_relax();
    for (int i = 0; atomic_load(&p->pending) > 0 && i < POOL_YIELDS; i++) sched_yield();
    if (atomic_load(&p->pending) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

int engine_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    return 1;
}
