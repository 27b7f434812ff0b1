/* Metrics in the Prometheus text format (GET /metrics) and GET /health. Everything is counted
 * on the service thread: requests by route and status as the core answers them, tokens and
 * latencies as the chat service sees jobs finish; the scheduler's gauges are read at scrape
 * time. */
#include "server_core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_BUCKETS 14

typedef struct {
    const double *le;              /* upper bounds in seconds, N_BUCKETS */
    uint64_t count[N_BUCKETS + 1]; /* last: +Inf */
    double sum;
    uint64_t n;
} histo;

typedef struct {
    char route[64];
    int status;
    uint64_t n;
} route_count;

struct srv_metrics {
    route_count *routes;
    int n_routes, cap_routes;
    uint64_t finish[SRV_FINISH_ERROR + 1];
    uint64_t prompt_tokens, cached_tokens, completion_tokens;
    histo ttft, tpot, itl, e2e, queue;
    double started;
};

static const double le_ttft[N_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                          1,     2.5,  5,     10,   30,  60,   120};
static const double le_tpot[N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075,
                                          0.1,   0.15,   0.2,   0.3,  0.5,   1,    2.5};

int srv_metrics_new(srv_metrics **out) {
    srv_metrics *m = calloc(1, sizeof *m);
    if (!m) return agent_err(AGENT_ENOMEM, "out of memory");
    m->ttft.le = le_ttft;
    m->e2e.le = le_ttft;
    m->queue.le = le_ttft;
    m->tpot.le = le_tpot;
    m->itl.le = le_tpot;
    m->started = srv_now_ms();
    *out = m;
    return 0;
}

void srv_metrics_free(srv_metrics *m) {
    if (!m) return;
    free(m->routes);
    free(m);
}

static void observe(histo *h, double v) {
    int i = 0;
    while (i < N_BUCKETS && v > h->le[i])
        i++;
    h->count[i]++;
    h->sum += v;
    h->n++;
}

void srv_metrics_request(srv_metrics *m, const char *route, int status) {
    for (int i = 0; i < m->n_routes; i++)
        if (m->routes[i].status == status && !strcmp(m->routes[i].route, route)) {
            m->routes[i].n++;
            return;
        }
    if (m->n_routes == m->cap_routes) {
        int cap = m->cap_routes ? m->cap_routes * 2 : 32;
        route_count *r = realloc(m->routes, (size_t)cap * sizeof *r);
        if (!r) return;
        m->routes = r;
        m->cap_routes = cap;
    }
    route_count *r = &m->routes[m->n_routes++];
    snprintf(r->route, sizeof r->route, "%s", route);
    r->status = status;
    r->n = 1;
}

void srv_metrics_token_gaps(srv_metrics *m, const float *gaps_ms, size_t n) {
    for (size_t i = 0; i < n; i++)
        observe(&m->itl, gaps_ms[i] / 1e3);
}

void srv_metrics_job(srv_metrics *m, const srv_usage *u, srv_finish f) {
    if ((unsigned)f <= SRV_FINISH_ERROR) m->finish[f]++;
    m->prompt_tokens += (uint64_t)(u->prompt_tokens > 0 ? u->prompt_tokens : 0);
    m->cached_tokens += (uint64_t)(u->cached_tokens > 0 ? u->cached_tokens : 0);
    m->completion_tokens += (uint64_t)(u->completion_tokens > 0 ? u->completion_tokens : 0);
    if (f == SRV_FINISH_ERROR) return;
    observe(&m->queue, u->queue_ms / 1e3);
    observe(&m->e2e, u->total_ms / 1e3);
    if (u->completion_tokens > 0 && u->ttft_ms > 0) observe(&m->ttft, u->ttft_ms / 1e3);
    if (u->completion_tokens > 1 && u->total_ms > u->ttft_ms)
        observe(&m->tpot, (u->total_ms - u->ttft_ms) / 1e3 / (u->completion_tokens - 1));
}

static int histo_text(srv_buf *b, const char *name, const char *help, const histo *h) {
    int rc = 0;
    rc |= srv_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < N_BUCKETS; i++) {
        cum += h->count[i];
        rc |= srv_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i],
                             (unsigned long long)cum);
    }
    cum += h->count[N_BUCKETS];
    rc |= srv_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
                         (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->n);
    return rc;
}

static int counter(srv_buf *b, const char *name, const char *help, uint64_t v) {
    int rc = 0;
    rc |= srv_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
                         (unsigned long long)v);
    return rc;
}

static int gauge(srv_buf *b, const char *name, const char *help, double v) {
    int rc = 0;
    rc |= srv_buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %g\n", name, help, name, name, v);
    return rc;
}

static int route_metrics(srv_req *r) {
    srv *s = srv_req_server(r);
    srv_metrics *m = srv_metrics_of(s);
    engine_sched_stats st;
    engine_sched_stats_get(srv_chat_sched(srv_chat_of(s)), &st);
    srv_buf b = {0};
    int bad = 0;
    bad |= srv_buf_printf(
        &b, "# HELP spark_requests_total HTTP requests answered (and WebSocket "
            "handshakes) by route and status.\n# TYPE spark_requests_total counter\n");
    for (int i = 0; i < m->n_routes; i++)
        bad |= srv_buf_printf(&b, "spark_requests_total{route=\"%s\",status=\"%d\"} %llu\n",
                              m->routes[i].route, m->routes[i].status,
                              (unsigned long long)m->routes[i].n);
    bad |= srv_buf_printf(&b,
                          "# HELP spark_generations_total Generations finished, by finish reason.\n"
                          "# TYPE spark_generations_total counter\n");
    for (int f = 0; f <= SRV_FINISH_ERROR; f++)
        bad |= srv_buf_printf(&b, "spark_generations_total{finish=\"%s\"} %llu\n",
                              srv_finish_name((srv_finish)f), (unsigned long long)m->finish[f]);
    bad |= counter(&b, "spark_prompt_tokens_total", "Prompt tokens of finished generations.",
                   m->prompt_tokens);
    bad |= counter(&b, "spark_cached_prompt_tokens_total",
                   "Prompt tokens served from the prefix cache.", m->cached_tokens);
    bad |= counter(&b, "spark_generated_tokens_total", "Tokens generated.", m->completion_tokens);
    bad |= gauge(&b, "spark_prefix_cache_hit_ratio",
                 "Cached prompt tokens / prompt tokens over the server's life.",
                 m->prompt_tokens ? (double)m->cached_tokens / (double)m->prompt_tokens : 0.0);
    bad |= histo_text(&b, "spark_time_to_first_token_seconds", "Submit to first generated token.",
                      &m->ttft);
    bad |= histo_text(&b, "spark_time_per_output_token_seconds",
                      "Mean time per generated token after the first, per generation.", &m->tpot);
    bad |= histo_text(&b, "spark_inter_token_latency_seconds",
                      "Time between consecutive generated tokens, every token.", &m->itl);
    bad |= histo_text(&b, "spark_queue_time_seconds", "Submit to admission by the scheduler.",
                      &m->queue);
    bad |= histo_text(&b, "spark_generation_duration_seconds", "Submit to the end of a generation.",
                      &m->e2e);
    bad |= gauge(&b, "spark_requests_running", "Sequences admitted by the scheduler.", st.running);
    bad |= gauge(&b, "spark_queue_depth", "Requests waiting for admission.", st.queued);
    bad |= gauge(&b, "spark_kv_blocks_total", "KV blocks in the pool.", st.blocks_total);
    bad |= gauge(&b, "spark_kv_blocks_used", "KV blocks in use (running sequences and cache).",
                 st.blocks_used);
    bad |= gauge(&b, "spark_kv_blocks_cached", "KV blocks held only by the prefix cache.",
                 st.blocks_cached);
    bad |= gauge(&b, "spark_kv_block_tokens", "Positions per KV block.", st.block_tokens);
    bad |= counter(&b, "spark_preemptions_total", "Requests whose blocks were reclaimed.",
                   st.preemptions);
    bad |= counter(&b, "spark_engine_steps_total", "Engine steps run.", st.steps);
    bad |= gauge(&b, "spark_jobs_active", "Generations not finished yet.",
                 srv_chat_active(srv_chat_of(s)));
    bad |= gauge(&b, "spark_http_connections", "Open HTTP connections.", srv_http_connections(s));
    bad |= gauge(&b, "spark_websocket_connections", "Open WebSocket connections.",
                 srv_ws_connections(s));
    bad |= gauge(&b, "spark_uptime_seconds", "Seconds since the server started.",
                 (srv_now_ms() - m->started) / 1e3);
    /* an out-of-memory add leaves the text short: answer 500 rather than half a scrape */
    int rc = bad ? agent_err(AGENT_ENOMEM, "out of memory")
                 : srv_reply_raw(r, 200, "text/plain; version=0.0.4", b.p, b.len);
    srv_buf_free(&b);
    return rc;
}

static int route_health(srv_req *r) {
    srv *s = srv_req_server(r);
    bool d = srv_draining(s);
    return srv_reply_json(
        r, d ? 503 : 200,
        json_pack("{s:s, s:s}", "status", d ? "draining" : "ok", "model", srv_model_name(s)));
}

int srv_metrics_init(srv *s) {
    int rc = srv_route_add(s, "GET", "/metrics", route_metrics, SRV_ROUTE_NO_DRAIN);
    if (!rc) rc = srv_route_add(s, "GET", "/health", route_health, SRV_ROUTE_NO_DRAIN);
    return rc;
}
