/* Private to the server core (server.c, chat.c, metrics.c, openai.c, routes.c): what the other
 * front ends do not need. */
#ifndef SPARK_AGENT_SERVER_CORE_H
#define SPARK_AGENT_SERVER_CORE_H
#include "server_int.h"

typedef struct srv_chat srv_chat;

/* Monotonic milliseconds. */
double srv_now_ms(void);
/* Any thread: wake the service loop (it then runs posts and srv_chat_service). */
void srv_wake(srv *s);
/* Open connections (service thread). */
int srv_http_connections(const srv *s);
int srv_ws_connections(const srv *s);

/* Every front end's init function, in order (routes.c). */
int srv_modules_init(srv *s);

/* The chat service (chat.c): the template, the grammar vocabulary and the engine scheduler.
 * max_seqs / n_ctx: scheduler parameters (0: defaults). */
int srv_chat_new(srv_chat **out, srv *s, int32_t max_seqs, int32_t n_ctx);
/* Stops the scheduler (every running request cancelled) and frees the jobs. */
void srv_chat_free(srv_chat *c);
srv_chat *srv_chat_of(srv *s);
/* Service thread, after a wake: deliver the jobs' events (wake callbacks), free finished
 * jobs. */
void srv_chat_service(srv_chat *c);
/* Jobs not finished yet. */
int srv_chat_active(const srv_chat *c);
void srv_chat_cancel_all(srv_chat *c);
/* The scheduler's figures (metrics). */
struct engine_sched *srv_chat_sched(srv_chat *c);

int srv_metrics_new(srv_metrics **out);
void srv_metrics_free(srv_metrics *m);
#endif
