/* Chat templates: the public door (agent.h). Parsing happens once in agent_template_new; each
 * render converts the JSON inputs into values in its own arena and evaluates the AST. */
#include "template_int.h"

#include <stdlib.h>
#include <string.h>

int agent_template_new(agent_template **out, const char *source) {
    if (!out || !source) return agent_err(AGENT_EINVAL, "agent_template_new: NULL argument");
    *out = NULL;
    size_t len = strlen(source);
    if (!tpl_utf8_valid(source, len))
        return agent_err(AGENT_EINVAL, "chat template: not valid UTF-8");
    agent_template *t = calloc(1, sizeof *t);
    if (!t) return agent_err(AGENT_ENOMEM, "out of memory");
    tpl_limits lim = TPL_LIMITS_DEFAULT;
    t->limits = lim;
    t->src = malloc(len + 1);
    if (!t->src) {
        free(t);
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    memcpy(t->src, source, len + 1);
    t->src_len = len;
    tpl_tok *toks;
    size_t ntok;
    int rc = tpl_lex(&t->arena, t->src, len, &toks, &ntok);
    if (!rc) rc = tpl_parse(&t->arena, toks, ntok, t->src, len, &t->prog);
    if (rc) {
        agent_template_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void tpl_set_limits(agent_template *t, size_t max_bytes, uint64_t max_steps) {
    t->limits.max_bytes = max_bytes;
    t->limits.max_steps = max_steps;
}

void agent_template_free(agent_template *t) {
    if (!t) return;
    tpl_arena_free(&t->arena);
    free(t->src);
    free(t);
}

static int load_json(const char *what, const char *text, json_t **out) {
    json_error_t e;
    *out = json_loadb(text, strlen(text),
                      JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL | JSON_REJECT_DUPLICATES |
                          JSON_ALLOW_NUL,
                      &e);
    if (!*out)
        return agent_err(AGENT_EINVAL, "%s: invalid JSON at line %d, column %d: %s", what, e.line,
                         e.column, e.text);
    return 0;
}

int agent_template_render_vars(const agent_template *t, const char *vars_json, char **out,
                               size_t *out_len) {
    if (!t || !vars_json || !out) return agent_err(AGENT_EINVAL, "template render: NULL argument");
    *out = NULL;
    json_t *vars;
    int rc = load_json("template variables", vars_json, &vars);
    if (rc) return rc;
    rc = tpl_render_json(t, vars, &t->limits, out, out_len);
    json_decref(vars);
    return rc;
}

int agent_template_render(const agent_template *t, const char *messages_json,
                          const char *tools_json, const agent_template_opts *opts, char **out,
                          size_t *out_len) {
    if (!t || !messages_json || !out)
        return agent_err(AGENT_EINVAL, "template render: NULL argument");
    *out = NULL;
    agent_template_opts def = AGENT_TEMPLATE_OPTS_INIT;
    if (!opts) opts = &def;
    json_t *vars = NULL, *j = NULL;
    int rc = 0;
    if (opts->extra_vars_json) {
        if ((rc = load_json("extra template variables", opts->extra_vars_json, &vars))) return rc;
        if (!json_is_object(vars)) {
            json_decref(vars);
            return agent_err(AGENT_EINVAL, "extra template variables: not a JSON object");
        }
    } else if (!(vars = json_object())) {
        return agent_err(AGENT_ENOMEM, "out of memory");
    }
    if ((rc = load_json("messages", messages_json, &j))) goto done;
    if (!json_is_array(j)) {
        json_decref(j);
        rc = agent_err(AGENT_EINVAL, "messages: expected a JSON array");
        goto done;
    }
    json_object_set_new(vars, "messages", j);
    if (tools_json) {
        if ((rc = load_json("tools", tools_json, &j))) goto done;
        if (!json_is_array(j) && !json_is_null(j)) {
            json_decref(j);
            rc = agent_err(AGENT_EINVAL, "tools: expected a JSON array");
            goto done;
        }
        json_object_set_new(vars, "tools", j);
    }
    json_object_set_new(vars, "add_generation_prompt", json_boolean(opts->add_generation_prompt));
    if (opts->enable_thinking >= 0)
        json_object_set_new(vars, "enable_thinking", json_boolean(opts->enable_thinking > 0));
    if (opts->bos_token) json_object_set_new(vars, "bos_token", json_string(opts->bos_token));
    if (opts->eos_token) json_object_set_new(vars, "eos_token", json_string(opts->eos_token));
    rc = tpl_render_json(t, vars, &t->limits, out, out_len);
done:
    json_decref(vars);
    return rc;
}
