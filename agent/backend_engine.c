/* The in-process engine backend: a token-level agent_session that receives only the messages
 * it has not seen, and the tool-call grammar (lazy at <tool_call>, or required) on sampling. */
#include "loop_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "tool_grammar_int.h"

typedef struct {
    agent_backend base;
    engine_model *model;
    agent_engine_opts opts;
    agent_session *s;
    size_t seen;             /* messages of the conversation already in the session */
    grammar *g;
    grammar_vocab *v;
    grammar_index *ix;
    grammar_matcher *gm;
    /* persisted prefix: the system block's tokens and its file (engine_prefix_*) */
    int32_t *prefix;
    size_t n_prefix;
    bool prefix_pinned;      /* loaded or saved: pinned in the model's prefix cache */
    bool prefix_saving;      /* the save thread runs (joined by eng_destroy) */
    pthread_t prefix_thread;
    char prefix_path[4096];
} eng;

static void eng_destroy(agent_backend *b) {
    eng *e = (eng *)b;
    grammar_matcher_free(e->gm);
    grammar_index_free(e->ix);
    grammar_vocab_free(e->v);
    grammar_free(e->g);
    agent_session_free(e->s);
    if (e->prefix_saving) pthread_join(e->prefix_thread, NULL);
    if (e->prefix_pinned) engine_prefix_unpin(e->model, e->prefix, e->n_prefix);
    free(e->prefix);
    free(e);
}

static agent_session *eng_session(agent_backend *b) {
    return ((eng *)b)->s;
}

static int build_grammar_from(eng *e, const char *tools_json);

/* Bounded strings cost DFA states per character (the compiler refuses bounds above 1000 and
 * grammars above 262,144 states): the copy of the schemas the grammar sees keeps maxLength up
 * to 128 and leaves longer or unbounded strings unbounded (max_string_len 0), or bounds every
 * string at max_string_len (agent_schema_relax_ex). The parsed arguments are still validated
 * against the full schema before anything runs. */
static int build_grammar(eng *e, const char *tools_json_full) {
    json_t *tj = json_loads(tools_json_full, 0, NULL);
    if (!tj) return agent_err(AGENT_EINVAL, "tools: not JSON");
    agent_schema_relax_ex(tj, e->opts.max_string_len > 0 ? e->opts.max_string_len : 128,
                          e->base.format == AGENT_TOOLCALL_XML, e->opts.max_string_len > 0);
    char *tools_json = json_dumps(tj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(tj);
    if (!tools_json) return agent_err(AGENT_ENOMEM, "out of memory");
    int grc = build_grammar_from(e, tools_json);
    free(tools_json);
    return grc;
}

static int build_grammar_from(eng *e, const char *tools_json) {
    grammar_tool_options go = GRAMMAR_TOOL_OPTIONS_INIT;
    go.format = e->base.format == AGENT_TOOLCALL_XML ? GRAMMAR_TOOLS_QWEN3_XML
                                                      : GRAMMAR_TOOLS_HERMES;
    go.mode = e->opts.tools_mode == AGENT_TOOLS_REQUIRED ? GRAMMAR_TOOLS_REQUIRED
                                                         : GRAMMAR_TOOLS_AUTO;
    go.parallel = e->opts.parallel_calls;
    if (grammar_new_tools(&e->g, tools_json, strlen(tools_json), &go) < 0)
        return agent_err(AGENT_EINVAL, "tool-call grammar: %s", grammar_error_last());
    int32_t *eog = NULL;
    int n_eog = 0;
    int rc = agent_grammar_vocab_new(&e->v, &eog, &n_eog, e->model);
    if (rc == 0 && (grammar_index_new(&e->ix, e->g, e->v) < 0 ||
                    grammar_matcher_new(&e->gm, e->ix, eog, n_eog) < 0))
        rc = agent_err(AGENT_EINTERNAL, "tool-call grammar: %s", grammar_error_last());
    free(eog);
    return rc;
}

typedef struct {
    const agent_turn_opts *o;
} cb_ctx;

static int on_token(void *user, const char *text, size_t len, int32_t token) {
    (void)token;
    const agent_turn_opts *o = ((cb_ctx *)user)->o;
    if (len && o->on_text) o->on_text(o->user, text, len);
    return o->cancel && *o->cancel;
}

/* Persisted prefix. The system block (system prompt and tool definitions) is the same in
 * every run of a configuration, so its KV is kept on disk (engine_prefix_*: the file is named
 * after the model file and the tokens, under $XDG_CACHE_HOME/spark-agent/prefixes) and loaded,
 * pinned, before the first turn, which then computes only what follows it. Without a usable
 * file it is saved after the first turn, when its blocks are cached. A cache only: any failure
 * leaves the turn as it would have been. Needs a model loaded with a prefix cache
 * (engine_model_params.prefix_cache_bytes); without one nothing happens. */
static void prefix_load(eng *e, const char *system, const char *tools_json) {
    const char *src = e->opts.template_source ? e->opts.template_source
                                              : engine_model_chat_template(e->model);
    if ((!system && !tools_json) || !src) return;
    json_t *msgs = system ? json_pack("[{s:s, s:s}]", "role", "system", "content", system)
                          : json_array();
    char *mj = msgs ? json_dumps(msgs, JSON_COMPACT) : NULL, *text = NULL;
    json_decref(msgs);
    agent_template *t = NULL;
    agent_template_opts to = AGENT_TEMPLATE_OPTS_INIT;
    to.add_generation_prompt = false;
    to.enable_thinking = e->opts.enable_thinking;
    size_t len = 0, n = 0;
    if (!mj || agent_template_new(&t, src) || agent_template_render(t, mj, tools_json, &to, &text,
                                                                    &len))
        goto done;
    engine_model_tokenize(e->model, text, len, true, NULL, 0, &n);
    if (!n || !(e->prefix = malloc(n * sizeof *e->prefix)) ||
        engine_model_tokenize(e->model, text, len, true, e->prefix, n, &n) ||
        engine_prefix_default_path(e->model, e->prefix, n, e->prefix_path,
                                   sizeof e->prefix_path)) {
        free(e->prefix); /* no prefix cache, shorter than a block, ... */
        e->prefix = NULL;
        goto done;
    }
    e->n_prefix = n;
    e->prefix_pinned = engine_prefix_load(e->model, e->prefix_path, e->prefix, n, NULL) == 0;
done:
    agent_template_free(t);
    free(text);
    free(mj);
}

static void *prefix_save_thread(void *arg) {
    eng *e = arg;
    e->prefix_pinned = engine_prefix_save(e->model, e->prefix, e->n_prefix, e->prefix_path,
                                          NULL) == 0;
    return NULL;
}

/* After the first turn: save the prefix when none was loaded and the conversation does start
 * with it (the session renders the system block the same way). The file can be large (the KV
 * of thousands of tokens) and is fsynced: written on a thread of its own (engine_prefix_save
 * is safe beside the session's turns), so the next step does not wait for the disk. */
static void prefix_save(eng *e) {
    if (e->prefix_saving || !e->prefix || e->prefix_pinned) return; /* (the thread owns pinned) */
    const int32_t *t = agent_session_tokens(e->s);
    if (agent_session_n_tokens(e->s) >= e->n_prefix &&
        !memcmp(t, e->prefix, e->n_prefix * sizeof *t) &&
        pthread_create(&e->prefix_thread, NULL, prefix_save_thread, e) == 0) {
        e->prefix_saving = true;
        return;
    }
    free(e->prefix);
    e->prefix = NULL;
}

static int eng_turn(agent_backend *b, json_t *msgs, const char *tools_json,
                    const agent_turn_opts *o, char **out, agent_turn_info *info) {
    eng *e = (eng *)b;
    memset(info, 0, sizeof *info);
    *out = NULL;
    int rc;
    size_t n = json_array_size(msgs);
    if (!e->s) {
        agent_session_opts so = AGENT_SESSION_OPTS_INIT;
        json_t *m0 = json_array_get(msgs, 0);
        const char *r0 = json_string_value(json_object_get(m0, "role"));
        if (r0 && !strcmp(r0, "system")) {
            so.system_prompt = json_string_value(json_object_get(m0, "content"));
            e->seen = 1;
        }
        so.tools_json = tools_json;
        so.n_ctx = e->opts.n_ctx;
        so.enable_thinking = e->opts.enable_thinking;
        so.template_source = e->opts.template_source;
        if ((rc = agent_session_new(&e->s, e->model, &so))) return rc;
        prefix_load(e, so.system_prompt, tools_json);
        if (tools_json && e->opts.tools_mode != AGENT_TOOLS_UNCONSTRAINED &&
            (rc = build_grammar(e, tools_json)))
            return rc;
    }
    /* Feed what the session has not seen: groups of user/tool messages, and assistant turns
     * (from a resumed transcript) as their raw text. */
    while (e->seen < n) {
        json_t *m = json_array_get(msgs, e->seen);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role && !strcmp(role, "assistant")) {
            const char *raw = json_string_value(json_object_get(m, "raw"));
            if (!raw) raw = json_string_value(json_object_get(m, "content"));
            if ((rc = agent_session_add_assistant(e->s, raw ? raw : ""))) return rc;
            e->seen++;
            continue;
        }
        size_t end = e->seen;
        json_t *group = json_array();
        if (!group) return agent_err(AGENT_ENOMEM, "out of memory");
        while (end < n) {
            json_t *x = json_array_get(msgs, end);
            const char *r = json_string_value(json_object_get(x, "role"));
            if (r && !strcmp(r, "assistant")) break;
            json_t *copy = json_pack("{s:s, s:O}", "role", r ? r : "user", "content",
                                     json_object_get(x, "content"));
            if (!copy) {
                json_decref(group);
                return agent_err(AGENT_EINVAL, "message %zu: no content", end);
            }
            json_array_append_new(group, copy);
            end++;
        }
        char *gj = json_dumps(group, JSON_COMPACT);
        json_decref(group);
        if (!gj) return agent_err(AGENT_ENOMEM, "out of memory");
        rc = agent_session_append(e->s, gj, true);
        free(gj);
        if (rc) return rc;
        e->seen = end;
    }
    engine_sampling_params sp = ENGINE_SAMPLING_PARAMS_INIT;
    sp.temperature = e->opts.temperature;
    sp.seed = e->opts.seed;
    if (e->gm) {
        grammar_matcher_reset(e->gm);
        sp.mask = grammar_sampler_mask;
        sp.accept = grammar_sampler_accept;
        sp.free_mask = grammar_sampler_free;
        sp.grammar_user = e->gm;
    }
    cb_ctx cc = {o};
    engine_gen_stats st;
    rc = agent_session_generate(e->s, o->max_tokens, &sp, on_token, &cc, out, &st);
    if (rc == 0) prefix_save(e);
    info->tokens = st.generated_tokens;
    info->length = st.stop == ENGINE_STOP_LENGTH || st.stop == ENGINE_STOP_CONTEXT;
    info->tokens_per_s = st.decode_ms > 0 ? st.decode_tokens * 1000.0 / st.decode_ms : 0;
    info->prompt_tokens = st.prompt_tokens;
    info->cached_tokens = st.cached_tokens;
    if (rc == 0 || rc == AGENT_ECANCELED) e->seen = n + 1; /* the assistant message the loop adds next */
    return rc;
}

int agent_backend_engine_new(agent_backend **out, engine_model *m, const agent_engine_opts *o) {
    if (!out || !m) return agent_err(AGENT_EINVAL, "agent_backend_engine_new: NULL");
    *out = NULL;
    agent_engine_opts d = AGENT_ENGINE_OPTS_INIT;
    eng *e = calloc(1, sizeof *e);
    if (!e) return agent_err(AGENT_ENOMEM, "out of memory");
    e->base.turn = eng_turn;
    e->base.destroy = eng_destroy;
    e->base.session = eng_session;
    e->model = m;
    e->opts = o ? *o : d;
    const char *tpl = e->opts.template_source ? e->opts.template_source
                                              : engine_model_chat_template(m);
    e->base.format = agent_toolcall_format_of(tpl);
    *out = &e->base;
    return 0;
}
