/* Private to agent/: the model-backend interface behind agent_backend (loop.c, backend_*.c). */
#ifndef SPARK_AGENT_LOOP_INT_H
#define SPARK_AGENT_LOOP_INT_H
#include "agent_int.h"

#include <jansson.h>

typedef struct {
    int32_t max_tokens;     /* this turn */
    volatile int *cancel;
    agent_text_fn on_text;
    void *user;
} agent_turn_opts;

typedef struct {
    int64_t tokens;         /* generated in this turn (0 when the backend cannot count) */
    bool length;            /* the turn hit max_tokens without ending */
    double tokens_per_s;    /* decode speed (0 when unknown) */
    int64_t prompt_tokens;  /* the turn's prompt and how much of it the engine's cache served */
    int64_t cached_tokens;  /* (both 0 when the backend cannot count) */
} agent_turn_info;

struct agent_backend {
    /* msgs: the whole conversation (system first when there is one; assistant messages carry
     * their raw text in "raw"); tools_json: OpenAI tool array. *out: the reply text. */
    int (*turn)(agent_backend *b, json_t *msgs, const char *tools_json, const agent_turn_opts *o,
                char **out, agent_turn_info *info);
    void (*destroy)(agent_backend *b);
    agent_session *(*session)(agent_backend *b);
    agent_toolcall_format format;
};
#endif
