/* The conversation as one token-level engine session: each new message group is rendered on its
 * own (as a delta after a one-message stub of the previous role) and its tokens appended after
 * what the engine holds; earlier turns are never re-rendered, so the cached prefix never drifts.
 * Generated assistant turns stay exactly as the model wrote them (a Qwen3 <think> block
 * included), then the turn is closed with the template's own closing text. */
#include "agent_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

struct agent_session {
    engine_model *model;
    engine_session *es;
    agent_template *tpl;
    char *system;            /* system prompt or NULL */
    char *tools_json;        /* OpenAI tool array or NULL */
    int enable_thinking;
    int32_t *toks;           /* the whole conversation, in order */
    size_t n, cap;
    size_t sys_end;          /* tokens of the system block (kept by compaction) */
    size_t *groups;          /* start of each appended user/tool message group */
    size_t n_groups, cap_groups;
    char prev_role[16];      /* role of the last message in toks ("" when empty) */
    char *close_text;        /* what closes an assistant turn ("<|im_end|>\n") */
    int compactions;
    bool pending_prompt;     /* toks end with the generation prompt */
};

static const char MARK[] = "\x01spark-agent-marker\x01";

static int render(agent_session *s, json_t *msgs, const char *tools, bool agp, char **out) {
    char *mj = json_dumps(msgs, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!mj) return agent_err(AGENT_ENOMEM, "out of memory rendering messages");
    agent_template_opts o = AGENT_TEMPLATE_OPTS_INIT;
    o.add_generation_prompt = agp;
    o.enable_thinking = s->enable_thinking;
    int rc = agent_template_render(s->tpl, mj, tools, &o, out, NULL);
    free(mj);
    return rc;
}

static int toks_reserve(agent_session *s, size_t extra) {
    if (s->n + extra <= s->cap) return 0;
    size_t nc = s->cap ? s->cap : 1024;
    while (nc < s->n + extra) nc *= 2;
    int32_t *p = realloc(s->toks, nc * sizeof *p);
    if (!p) return agent_err(AGENT_ENOMEM, "out of memory for %zu tokens", nc);
    s->toks = p;
    s->cap = nc;
    return 0;
}

/* Tokenize text into a malloc'd array (special-token texts become their ids). */
static int tokenize(agent_session *s, const char *text, size_t len, int32_t **out, size_t *n) {
    size_t need = 0;
    int rc = engine_model_tokenize(s->model, text, len, true, NULL, 0, &need);
    if (rc < 0 && rc != ENGINE_ERANGE)
        return agent_err(AGENT_EINTERNAL, "tokenize: %s", engine_error_last());
    int32_t *ids = malloc((need ? need : 1) * sizeof *ids);
    if (!ids) return agent_err(AGENT_ENOMEM, "out of memory tokenizing %zu bytes", len);
    if (need && engine_model_tokenize(s->model, text, len, true, ids, need, &need) < 0) {
        free(ids);
        return agent_err(AGENT_EINTERNAL, "tokenize: %s", engine_error_last());
    }
    *out = ids;
    *n = need;
    return 0;
}

static int append_text(agent_session *s, const char *text, size_t len) {
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenize(s, text, len, &ids, &n);
    if (rc) return rc;
    if (!(rc = toks_reserve(s, n))) {
        memcpy(s->toks + s->n, ids, n * sizeof *ids);
        s->n += n;
    }
    free(ids);
    return rc;
}

static json_t *stub(const char *role) {
    return json_pack("{s:s, s:s}", "role", role, "content", "x");
}

/* Render `after` (messages) as a delta after a stub of role `prev` ("": from the start, with
 * the system block and tools). *out is the new text. */
static int render_delta(agent_session *s, const char *prev, json_t *after, bool agp, char **out,
                        size_t *out_len) {
    json_t *a = json_array(), *b = json_array();
    char *ta = NULL, *tb = NULL;
    int rc = AGENT_ENOMEM;
    if (!a || !b) goto done;
    if (*prev) {
        json_array_append_new(a, stub(prev));
        json_array_append_new(b, stub(prev));
    }
    size_t i;
    json_t *m;
    json_array_foreach(after, i, m) json_array_append(b, m);
    const char *tools = *prev ? NULL : s->tools_json;
    if (*prev) {
        if ((rc = render(s, a, tools, false, &ta))) goto done;
    } else if (!(ta = strdup(""))) {
        goto done;
    }
    if ((rc = render(s, b, tools, agp, &tb))) goto done;
    size_t la = strlen(ta);
    if (strncmp(ta, tb, la)) {
        rc = agent_err(AGENT_ETEMPLATE, "the chat template renders a %s message differently once "
                       "more messages follow; cannot append without re-rendering", prev);
        goto done;
    }
    size_t lb = strlen(tb);
    memmove(tb, tb + la, lb - la + 1);
    *out = tb;
    *out_len = lb - la;
    tb = NULL;
    rc = 0;
done:
    json_decref(a);
    json_decref(b);
    free(ta);
    free(tb);
    return rc;
}

void agent_session_free(agent_session *s) {
    if (!s) return;
    engine_session_free(s->es);
    agent_template_free(s->tpl);
    free(s->system);
    free(s->tools_json);
    free(s->toks);
    free(s->groups);
    free(s->close_text);
    free(s);
}

int agent_session_new(agent_session **out, engine_model *m, const agent_session_opts *o) {
    if (!out || !m) return agent_err(AGENT_EINVAL, "agent_session_new: NULL argument");
    *out = NULL;
    agent_session_opts d = AGENT_SESSION_OPTS_INIT;
    if (!o) o = &d;
    agent_session *s = calloc(1, sizeof *s);
    if (!s) return agent_err(AGENT_ENOMEM, "out of memory");
    s->model = m;
    s->enable_thinking = o->enable_thinking;
    int rc;
    const char *src = o->template_source ? o->template_source : engine_model_chat_template(m);
    if (!src) {
        rc = agent_err(AGENT_EINVAL, "the model file has no chat template "
                       "(tokenizer.chat_template)");
        goto fail;
    }
    if ((rc = agent_template_new(&s->tpl, src))) goto fail;
    if ((o->system_prompt && !(s->system = strdup(o->system_prompt))) ||
        (o->tools_json && !(s->tools_json = strdup(o->tools_json)))) {
        rc = agent_err(AGENT_ENOMEM, "out of memory");
        goto fail;
    }
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_ctx = o->n_ctx;
    if (engine_session_new(&s->es, m, &sp) < 0) {
        rc = agent_err(AGENT_EINVAL, "engine session: %s", engine_error_last());
        goto fail;
    }
    /* The closing text of an assistant turn, as the template writes it. */
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "assistant", "content", MARK);
    char *r = NULL;
    rc = msgs ? render(s, msgs, NULL, false, &r) : agent_err(AGENT_ENOMEM, "out of memory");
    json_decref(msgs);
    if (rc) goto fail;
    char *at = strstr(r, MARK);
    s->close_text = at ? strdup(at + strlen(MARK)) : NULL;
    free(r);
    if (!s->close_text || !*s->close_text) {
        rc = agent_err(AGENT_ETEMPLATE, "cannot find how the template closes an assistant turn");
        goto fail;
    }
    *out = s;
    return 0;
fail:
    agent_session_free(s);
    return rc;
}

int32_t agent_session_n_ctx(const agent_session *s) {
    return engine_session_n_ctx(s->es);
}

size_t agent_session_n_tokens(const agent_session *s) {
    return s->n;
}

const int32_t *agent_session_tokens(const agent_session *s) {
    return s->toks;
}

int agent_session_compactions(const agent_session *s) {
    return s->compactions;
}

/* Drop the oldest groups after the system block until `need` more tokens fit, leaving a notice
 * in their place. The system block (and the tools in it) stays, so its cache stays. */
static int compact(agent_session *s, size_t need) {
    size_t n_ctx = (size_t)engine_session_n_ctx(s->es);
    static const char notice[] = "[Earlier turns of this conversation were removed to fit the "
                                 "context window.]";
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", notice);
    char *text = NULL;
    size_t tl = 0;
    int rc = msgs ? render_delta(s, "system", msgs, false, &text, &tl)
                  : agent_err(AGENT_ENOMEM, "out of memory");
    json_decref(msgs);
    if (rc) return rc;
    int32_t *nt = NULL;
    size_t nn = 0;
    rc = tokenize(s, text, tl, &nt, &nn);
    free(text);
    if (rc) return rc;
    /* The first group start that leaves half the conversation's room free (so that the next
     * turns do not compact again at once), else the first that makes just enough room. */
    size_t cut = 0, gi = 0;
    size_t slack = (n_ctx - s->sys_end) / 2;
    for (int pass = 0; pass < 2 && !cut; pass++) {
        for (size_t g = 1; g < s->n_groups; g++) {
            size_t start = s->groups[g];
            if (s->sys_end + nn + (s->n - start) + need + (pass ? 0 : slack) <= n_ctx) {
                cut = start;
                gi = g;
                break;
            }
        }
    }
    if (!cut) {
        free(nt);
        return agent_err(AGENT_ECONTEXT, "the conversation does not fit the context window "
                         "(%zu tokens held, %zu more needed, %zu in all) even after removing "
                         "old turns", s->n, need, n_ctx);
    }
    size_t keep = s->n - cut;
    size_t dropped = cut - s->sys_end;
    if (nn > dropped) { /* cannot happen: cut is chosen so that it fits */
        free(nt);
        return agent_err(AGENT_EINTERNAL, "compaction grew the conversation");
    }
    memmove(s->toks + s->sys_end + nn, s->toks + cut, keep * sizeof *s->toks);
    memcpy(s->toks + s->sys_end, nt, nn * sizeof *nt);
    free(nt);
    s->n = s->sys_end + nn + keep;
    size_t shift = cut - (s->sys_end + nn);
    size_t w = 0;
    s->groups[w++] = s->sys_end; /* the notice is a group of its own */
    for (size_t g = gi; g < s->n_groups; g++) s->groups[w++] = s->groups[g] - shift;
    s->n_groups = w;
    s->compactions++;
    return 0;
}

static int ensure_room(agent_session *s, size_t need) {
    size_t n_ctx = (size_t)engine_session_n_ctx(s->es);
    if (s->n + need <= n_ctx) return 0;
    return compact(s, need);
}

int agent_session_append(agent_session *s, const char *messages_json, bool add_prompt) {
    if (!s || !messages_json) return agent_err(AGENT_EINVAL, "agent_session_append: NULL");
    if (s->pending_prompt)
        return agent_err(AGENT_EINVAL, "agent_session_append: the session ends with a "
                         "generation prompt; add the assistant turn first");
    json_error_t je;
    json_t *msgs = json_loads(messages_json, 0, &je);
    if (!msgs || !json_is_array(msgs) || !json_array_size(msgs)) {
        json_decref(msgs);
        return agent_err(AGENT_EINVAL, "messages: not a non-empty JSON array (%s)", je.text);
    }
    size_t i;
    json_t *m;
    const char *last = NULL;
    json_array_foreach(msgs, i, m) {
        last = json_string_value(json_object_get(m, "role"));
        if (!last || (strcmp(last, "user") && strcmp(last, "tool") && strcmp(last, "system"))) {
            json_decref(msgs);
            return agent_err(AGENT_EINVAL, "messages[%zu]: role must be user, tool or system "
                             "(assistant turns come from agent_session_generate or "
                             "agent_session_add_assistant)", i);
        }
    }
    int rc;
    char *text = NULL;
    size_t tl = 0;
    bool first = s->n == 0;
    if (first && s->system) {
        json_t *all = json_pack("[{s:s, s:s}]", "role", "system", "content", s->system);
        json_array_extend(all, msgs);
        json_decref(msgs);
        msgs = all;
        /* the system block alone: where compaction cuts */
        json_t *sys = json_pack("[{s:s, s:s}]", "role", "system", "content", s->system);
        char *st = NULL;
        rc = render(s, sys, s->tools_json, false, &st);
        json_decref(sys);
        if (rc) goto done;
        int32_t *ids = NULL;
        size_t n = 0;
        rc = tokenize(s, st, strlen(st), &ids, &n);
        free(st);
        free(ids);
        if (rc) goto done;
        s->sys_end = n;
    }
    if ((rc = render_delta(s, s->prev_role, msgs, add_prompt, &text, &tl))) goto done;
    int32_t *ids = NULL;
    size_t n = 0;
    if ((rc = tokenize(s, text, tl, &ids, &n))) goto done;
    if (first && s->sys_end && (n < s->sys_end)) s->sys_end = 0;
    if (!first && (rc = ensure_room(s, n))) {
        free(ids);
        goto done;
    }
    if ((size_t)engine_session_n_ctx(s->es) < s->n + n) {
        free(ids);
        rc = agent_err(AGENT_ECONTEXT, "the first message does not fit the context window "
                       "(%zu tokens, %d in all)", n, engine_session_n_ctx(s->es));
        goto done;
    }
    if ((rc = toks_reserve(s, n))) {
        free(ids);
        goto done;
    }
    if (s->n_groups == s->cap_groups) {
        size_t nc = s->cap_groups ? s->cap_groups * 2 : 16;
        size_t *g = realloc(s->groups, nc * sizeof *g);
        if (!g) {
            free(ids);
            rc = agent_err(AGENT_ENOMEM, "out of memory");
            goto done;
        }
        s->groups = g;
        s->cap_groups = nc;
    }
    s->groups[s->n_groups++] = first ? s->sys_end : s->n;
    memcpy(s->toks + s->n, ids, n * sizeof *ids);
    s->n += n;
    free(ids);
    snprintf(s->prev_role, sizeof s->prev_role, "%s", last);
    s->pending_prompt = add_prompt;
done:
    free(text);
    json_decref(msgs);
    return rc;
}

/* Close the assistant turn whose tokens end the conversation. */
static int close_turn(agent_session *s) {
    const char *ct = s->close_text;
    size_t cl = strlen(ct);
    if (s->n) { /* the generation may already have ended with the first token of the close */
        size_t bl = 0;
        const char *b = engine_model_token_bytes(s->model, s->toks[s->n - 1], &bl);
        if (b && bl && bl <= cl && !memcmp(b, ct, bl) &&
            engine_model_token_is_eog(s->model, s->toks[s->n - 1]))
            ct += bl, cl -= bl;
    }
    int rc = cl ? append_text(s, ct, cl) : 0;
    if (!rc) {
        snprintf(s->prev_role, sizeof s->prev_role, "assistant");
        s->pending_prompt = false;
    }
    return rc;
}

int agent_session_add_assistant(agent_session *s, const char *text) {
    if (!s || !text) return agent_err(AGENT_EINVAL, "agent_session_add_assistant: NULL");
    if (!s->pending_prompt)
        return agent_err(AGENT_EINVAL, "agent_session_add_assistant: no generation prompt");
    int rc = append_text(s, text, strlen(text));
    return rc ? rc : close_turn(s);
}

typedef struct {
    char *buf;
    size_t len, cap;
    bool oom;
    engine_token_fn cb;
    void *user;
} gen_acc;

static int on_token(void *user, const char *text, size_t len, int32_t token) {
    gen_acc *a = user;
    if (a->len + len + 1 > a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 256;
        while (nc < a->len + len + 1) nc *= 2;
        char *p = realloc(a->buf, nc);
        if (!p) {
            a->oom = true;
            return 1;
        }
        a->buf = p;
        a->cap = nc;
    }
    memcpy(a->buf + a->len, text, len);
    a->len += len;
    a->buf[a->len] = 0;
    return a->cb ? a->cb(a->user, text, len, token) : 0;
}

int agent_session_generate(agent_session *s, int32_t max_tokens,
                           const engine_sampling_params *sampling, engine_token_fn cb,
                           void *user, char **out_text, engine_gen_stats *stats) {
    if (!s || !out_text) return agent_err(AGENT_EINVAL, "agent_session_generate: NULL");
    *out_text = NULL;
    if (!s->pending_prompt)
        return agent_err(AGENT_EINVAL, "agent_session_generate: no generation prompt");
    size_t n_ctx = (size_t)engine_session_n_ctx(s->es);
    /* room for at least a short answer and the close; compaction makes it when needed */
    size_t want = max_tokens > 0 ? (size_t)max_tokens + 8 : 256;
    if (want > 512) want = 512; /* beyond that the turn gets what room there is */
    if (want > n_ctx / 2) want = n_ctx / 2;
    int rc = ensure_room(s, want);
    if (rc) return rc;
    size_t room = n_ctx - s->n;
    int32_t mt = max_tokens > 0 ? max_tokens : (int32_t)room;
    if ((size_t)mt + 4 > room) mt = (int32_t)(room > 4 ? room - 4 : 1);
    engine_gen_params gp = ENGINE_GEN_PARAMS_INIT;
    gp.prompt = s->toks;
    gp.n_prompt = s->n;
    gp.max_tokens = mt;
    if (sampling) gp.sampling = *sampling;
    gen_acc acc = {.cb = cb, .user = user};
    engine_gen_stats st;
    memset(&st, 0, sizeof st);
    int er = engine_generate(s->es, &gp, on_token, &acc, &st);
    if (stats) *stats = st;
    if (acc.oom) {
        free(acc.buf);
        return agent_err(AGENT_ENOMEM, "out of memory collecting generated text");
    }
    if (er < 0 && er != ENGINE_ECANCELED) {
        free(acc.buf);
        return agent_err(AGENT_EINTERNAL, "generation: %s", engine_error_last());
    }
    /* Keep exactly the tokens the model produced (the engine session holds them). */
    int32_t en = engine_session_n_tokens(s->es);
    const int32_t *et = engine_session_tokens(s->es);
    size_t ng = en > 0 && (size_t)en > s->n ? (size_t)en - s->n : 0;
    if ((rc = toks_reserve(s, ng + 1))) {
        free(acc.buf);
        return rc;
    }
    memcpy(s->toks + s->n, et + s->n, ng * sizeof *et);
    s->n += ng;
    if ((rc = close_turn(s))) {
        free(acc.buf);
        return rc;
    }
    *out_text = acc.buf ? acc.buf : strdup("");
    if (!*out_text) return agent_err(AGENT_ENOMEM, "out of memory");
    return er == ENGINE_ECANCELED ? agent_err(AGENT_ECANCELED, "generation canceled") : 0;
}

engine_model *agent_session_model(const agent_session *s) {
    return s->model;
}
