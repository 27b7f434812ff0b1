/* The scripted backend: replies from a fixture, one per model turn (tests and demos). */
#include "loop_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    agent_backend base;
    json_t *replies;
    size_t next;
} scripted;

static int scripted_turn(agent_backend *b, json_t *msgs, const char *tools_json,
                         const agent_turn_opts *o, char **out, agent_turn_info *info) {
    (void)msgs;
    (void)tools_json;
    scripted *s = (scripted *)b;
    memset(info, 0, sizeof *info);
    if (o->cancel && *o->cancel) return agent_err(AGENT_ECANCELED, "canceled");
    if (s->next >= json_array_size(s->replies))
        return agent_err(AGENT_EINVAL, "script exhausted after %zu replies", s->next);
    const char *r = json_string_value(json_array_get(s->replies, s->next++));
    size_t len = strlen(r);
    /* A reply longer than the turn's budget is cut there, as a model that never stops is. */
    if (o->max_tokens > 0 && len > (size_t)o->max_tokens * 4) {
        len = (size_t)o->max_tokens * 4;
        info->length = true;
    }
    info->tokens = (int64_t)(len + 3) / 4;
    if (o->on_text) o->on_text(o->user, r, len);
    *out = malloc(len + 1);
    if (!*out) return agent_err(AGENT_ENOMEM, "out of memory");
    memcpy(*out, r, len);
    (*out)[len] = 0;
    return 0;
}

static void scripted_destroy(agent_backend *b) {
    scripted *s = (scripted *)b;
    json_decref(s->replies);
    free(s);
}

static agent_session *no_session(agent_backend *b) {
    (void)b;
    return NULL;
}

int agent_backend_scripted_new(agent_backend **out, const char *replies_json) {
    if (!out || !replies_json) return agent_err(AGENT_EINVAL, "agent_backend_scripted_new: NULL");
    *out = NULL;
    json_error_t je;
    json_t *r = json_loads(replies_json, 0, &je);
    size_t i;
    json_t *x;
    if (!r || !json_is_array(r)) {
        json_decref(r);
        return agent_err(AGENT_EINVAL, "script: not a JSON array (line %d: %s)", je.line,
                         je.text);
    }
    json_array_foreach(r, i, x) if (!json_is_string(x)) {
        json_decref(r);
        return agent_err(AGENT_EINVAL, "script: reply %zu is not a string", i);
    }
    scripted *s = calloc(1, sizeof *s);
    if (!s) {
        json_decref(r);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    s->base.turn = scripted_turn;
    s->base.destroy = scripted_destroy;
    s->base.session = no_session;
    s->base.format = AGENT_TOOLCALL_HERMES;
    s->replies = r;
    *out = &s->base;
    return 0;
}

void agent_backend_free(agent_backend *b) {
    if (b) b->destroy(b);
}

agent_session *agent_backend_session(agent_backend *b) {
    return b ? b->session(b) : NULL;
}
