/* textDocument/inlineCompletion: fill-in-the-middle at a position of an open document or from
 * a given prefix/suffix, with context chunks from other files, a time budget and a cache of
 * recent results (docs/protocol.md §5). */
#include "rpc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ----- the result cache: per connection, most recent first, keyed by the whole prompt ----- */

#define CACHE_SLOTS 64

typedef struct {
    char *key;          /* NULL: empty slot */
    size_t key_len;
    uint64_t hash;
    char *text;         /* the completion */
    size_t text_len;
    json_t *timings;
    char stop[8];
    uint64_t used;      /* LRU clock */
} cache_slot;

struct agent_rpc_cache {
    cache_slot slot[CACHE_SLOTS];
    uint64_t clock;
};

void agent_rpc_cache_free(agent_rpc_cache *cache) {
    if (!cache) return;
    for (int i = 0; i < CACHE_SLOTS; i++) {
        free(cache->slot[i].key);
        free(cache->slot[i].text);
        json_decref(cache->slot[i].timings);
    }
    free(cache);
}

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static cache_slot *cache_find(agent_rpc_cache *c, const char *key, size_t len) {
    if (!c) return NULL;
    uint64_t h = fnv1a(key, len);
    for (int i = 0; i < CACHE_SLOTS; i++) {
        cache_slot *s = &c->slot[i];
        if (s->key && s->hash == h && s->key_len == len && !memcmp(s->key, key, len)) {
            s->used = ++c->clock;
            return s;
        }
    }
    return NULL;
}

static void cache_put(agent_rpc_conn *conn, const char *key, size_t len, const char *text,
                      size_t text_len, const json_t *timings, const char *stop) {
    if (!conn->cache && !(conn->cache = calloc(1, sizeof *conn->cache))) return;
    agent_rpc_cache *c = conn->cache;
    cache_slot *s = &c->slot[0];
    for (int i = 0; i < CACHE_SLOTS; i++) {
        if (!c->slot[i].key) {
            s = &c->slot[i];
            break;
        }
        if (c->slot[i].used < s->used) s = &c->slot[i];
    }
    char *k = malloc(len + 1), *t = malloc(text_len + 1);
    if (!k || !t) {
        free(k);
        free(t);
        return; /* a cache miss later, nothing worse */
    }
    memcpy(k, key, len);
    memcpy(t, text, text_len);
    free(s->key);
    free(s->text);
    json_decref(s->timings);
    s->key = k;
    s->key_len = len;
    s->hash = fnv1a(key, len);
    s->text = t;
    s->text_len = text_len;
    s->timings = json_deep_copy(timings);
    snprintf(s->stop, sizeof s->stop, "%s", stop);
    s->used = ++c->clock;
}

/* ----- one request ----- */

typedef struct {
    srv_complete_req req;
    srv_chunk chunks[RPC_MAX_EXTRA_CHUNKS];
    char *chunk_names[RPC_MAX_EXTRA_CHUNKS];
    char *prefix, *suffix, *file_name;  /* owned copies (a document may change meanwhile) */
    const char *repo_name;              /* borrowed from conn->folders */
    int64_t line, character;            /* the insertion position */
    bool single_line;
    srv_buf text;                       /* generated so far */
    bool cut;                           /* single_line ended it */
    char *key;                          /* the cache key (NULL: do not cache) */
    size_t key_len;
    double t0;
} compl;

static void compl_free(void *state) {
    compl *q = state;
    if (!q) return;
    for (int i = 0; i < RPC_MAX_EXTRA_CHUNKS; i++) free(q->chunk_names[i]);
    free(q->prefix);
    free(q->suffix);
    free(q->file_name);
    free(q->key);
    srv_buf_free(&q->text);
    free(q);
}

static json_t *result_json(const compl *q, const char *text, size_t len, bool cached,
                           const char *stop, json_t *timings) {
    json_t *items = json_array();
    if (items && len) {
        json_t *pos = json_pack("{s:I, s:I}", "line", (json_int_t)q->line, "character",
                                (json_int_t)q->character);
        json_array_append_new(items, json_pack("{s:o, s:{s:O, s:o}}", "insertText",
                                               agent_json_text(text, len), "range", "start",
                                               pos, "end", pos));
    }
    return json_pack("{s:o, s:b, s:s, s:o}", "items", items, "cached", cached, "stopReason",
                     stop, "timings", timings ? timings : json_object());
}

/* Cache key: everything that decides the output, length-prefixed so fields cannot run into
 * each other. */
static int make_key(compl *q, double temperature, const json_t *stop) {
    srv_buf b = {0};
    int rc = 0;
    const char *parts[4] = {q->prefix, q->suffix, q->file_name ? q->file_name : "",
                            q->repo_name ? q->repo_name : ""};
    for (int i = 0; !rc && i < 4; i++)
        rc = srv_buf_printf(&b, "%zu:", strlen(parts[i])) || srv_buf_add(&b, parts[i],
                                                                         strlen(parts[i]));
    for (int i = 0; !rc && i < q->req.n_extra; i++) {
        const char *n = q->req.extra[i].name ? q->req.extra[i].name : "";
        rc = srv_buf_printf(&b, "|%zu:%s%zu:", strlen(n), n, strlen(q->req.extra[i].text)) ||
             srv_buf_add(&b, q->req.extra[i].text, strlen(q->req.extra[i].text));
    }
    char *st = stop ? json_dumps(stop, JSON_COMPACT) : NULL;
    if (!rc) rc = srv_buf_printf(&b, "#%d,%d,%g,%s", q->req.sampling.max_tokens,
                                 q->single_line, temperature, st ? st : "");
    free(st);
    if (rc) {
        srv_buf_free(&b);
        return rc;
    }
    q->key = b.p;
    q->key_len = b.len;
    return 0;
}

static void finish(agent_rpc_call *call, const srv_event *ev) {
    compl *q = call->state;
    agent_rpc_conn *c = call->conn;
    const srv_usage *u = &ev->usage;
    double gen_ms = u->total_ms - u->ttft_ms;
    json_t *timings = json_pack("{s:i, s:i, s:i, s:f, s:f, s:f}", "promptTokens",
                                u->prompt_tokens, "cachedTokens", u->cached_tokens,
                                "generatedTokens", u->completion_tokens, "ttftMs", u->ttft_ms,
                                "totalMs", u->total_ms, "tokensPerSecond",
                                gen_ms > 0 && u->completion_tokens > 1
                                    ? (u->completion_tokens - 1) * 1000.0 / gen_ms : 0.0);
    agent_rpc_progress(call, "end", NULL, NULL, -1);
    if (call->cancelled && !q->cut) {
        agent_rpc_reply_error(c, call->id, RPC_REQUEST_CANCELLED, NULL, "request cancelled");
    } else if (ev->finish == SRV_FINISH_ERROR) {
        agent_rpc_reply_error(c, call->id, ev->status == 400 ? RPC_CONTEXT_TOO_LONG
                                                             : RPC_INTERNAL_ERROR,
                              NULL, "%s", ev->error ? ev->error : "generation failed");
    } else {
        const char *stop = q->cut ? "stop"
                           : ev->finish == SRV_FINISH_LENGTH ? "length"
                           : ev->finish == SRV_FINISH_TIME ? "time" : "eos";
        size_t len = agent_utf8_complete_len(q->text.p ? q->text.p : "", q->text.len);
        if (q->key && strcmp(stop, "time"))
            cache_put(c, q->key, q->key_len, q->text.p ? q->text.p : "", len, timings, stop);
        agent_rpc_reply(c, call->id, result_json(q, q->text.p, len, false, stop,
                                                 json_incref(timings)));
    }
    json_decref(timings);
    agent_rpc_call_end(call);
}

static void wake(srv_job *j, void *user) {
    agent_rpc_call *call = user;
    compl *q = call->state;
    srv_event ev;
    while (srv_job_next(j, &ev) == 1) {
        if (ev.type == SRV_EV_DONE) {
            if (ev.finish == SRV_FINISH_CANCELED && q->cut) ev.finish = SRV_FINISH_STOP;
            finish(call, &ev); /* frees call */
            return;
        }
        if (ev.type != SRV_EV_TEXT || q->cut) continue;
        size_t from = q->text.len;
        if (srv_buf_add(&q->text, ev.text, ev.len)) continue;
        if (q->single_line) {
            /* stop at the first newline that follows some non-blank text */
            bool seen = false;
            for (size_t i = 0; i < q->text.len; i++) {
                char ch = q->text.p[i];
                if (ch == '\n' && seen && i >= from) {
                    q->text.len = i;
                    q->text.p[i] = 0;
                    q->cut = true;
                    srv_job_cancel(j);
                    break;
                }
                if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') seen = true;
            }
        }
    }
}

/* Parse the extra chunks into q->chunks. */
static int parse_extra(agent_rpc_conn *c, const json_t *id, const json_t *extra, compl *q) {
    if (!extra || json_is_null(extra)) return 0;
    if (!json_is_array(extra) || json_array_size(extra) > RPC_MAX_EXTRA_CHUNKS) {
        agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS, json_pack("{s:s}", "field", "extra"),
                              "extra: must be an array of at most %d {filename|uri, text}",
                              RPC_MAX_EXTRA_CHUNKS);
        return -1;
    }
    size_t i;
    json_t *ch;
    json_array_foreach(extra, i, ch) {
        json_t *text = json_object_get(ch, "text");
        const char *fn = json_string_value(json_object_get(ch, "filename"));
        const char *uri = json_string_value(json_object_get(ch, "uri"));
        if (!json_is_string(text) || json_string_length(text) > RPC_MAX_CHUNK_BYTES) {
            agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS,
                                  json_pack("{s:s}", "field", "extra"),
                                  "extra[%zu].text: a string of at most %u bytes is required", i,
                                  RPC_MAX_CHUNK_BYTES);
            return -1;
        }
        char *name = NULL;
        if (fn) {
            name = strdup(fn);
        } else if (uri) {
            char *path = agent_rpc_uri_path(uri);
            const char *rel = NULL;
            if (path && agent_rpc_folder_of(c, path, &rel) >= 0) name = strdup(rel);
            else if (path) name = strdup(strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
            free(path);
        }
        q->chunk_names[i] = name;
        q->chunks[i].name = name ? name : "tmp";
        q->chunks[i].text = json_string_value(text);
    }
    q->req.extra = q->chunks;
    q->req.n_extra = (int)json_array_size(extra);
    return 0;
}

void agent_rpc_complete(agent_rpc_conn *c, const json_t *id, const json_t *params) {
    if (!c->fim) {
        agent_rpc_reply_error(c, id, RPC_UNSUPPORTED, NULL,
                              "the model has no fill-in-the-middle tokens");
        return;
    }
    compl *q = calloc(1, sizeof *q);
    if (!q) {
        agent_rpc_reply_error(c, id, RPC_INTERNAL_ERROR, NULL, "out of memory");
        return;
    }
    int64_t max_tokens = 64, budget = 2000, before = 256, after = 64;
    const char *prefix = NULL, *suffix = NULL;
    json_t *td = json_object_get(params, "textDocument");
    const char *uri = json_string_value(json_object_get(td, "uri"));
    json_t *temp = json_object_get(params, "temperature");
    json_t *stop = json_object_get(params, "stop");
    json_t *sl = json_object_get(params, "singleLine");
    if (agent_rpc_param_int(c, id, params, "maxTokens", 1, RPC_MAX_COMPLETION_TOKENS,
                            &max_tokens) ||
        agent_rpc_param_int(c, id, params, "timeBudgetMs", 1, 600000, &budget) ||
        agent_rpc_param_int(c, id, params, "maxPrefixLines", 0, 1000000, &before) ||
        agent_rpc_param_int(c, id, params, "maxSuffixLines", 0, 1000000, &after) ||
        agent_rpc_param_str(c, id, params, "prefix", false, &prefix) ||
        agent_rpc_param_str(c, id, params, "suffix", false, &suffix))
        goto fail_quiet;
    if (td && !json_is_null(td) && !uri) {
        agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS,
                              json_pack("{s:s}", "field", "textDocument.uri"),
                              "textDocument.uri: must be a string");
        goto fail_quiet;
    }
    if (temp && (!json_is_number(temp) || json_number_value(temp) < 0 ||
                 json_number_value(temp) > 2)) {
        agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS,
                              json_pack("{s:s}", "field", "temperature"),
                              "temperature: must be a number in [0, 2]");
        goto fail_quiet;
    }
    if (sl && !json_is_boolean(sl)) {
        agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS, json_pack("{s:s}", "field", "singleLine"),
                              "singleLine: must be a boolean");
        goto fail_quiet;
    }
    q->req.sampling = (srv_sampling)SRV_SAMPLING_INIT;
    q->req.sampling.temperature = temp ? (float)json_number_value(temp) : 0.0f;
    q->req.sampling.max_tokens = (int32_t)max_tokens;
    if (stop && !json_is_null(stop)) {
        size_t i;
        json_t *s;
        if (!json_is_array(stop) || json_array_size(stop) > 4) {
            agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS, json_pack("{s:s}", "field", "stop"),
                                  "stop: must be an array of at most 4 strings");
            goto fail_quiet;
        }
        json_array_foreach(stop, i, s) {
            if (!json_is_string(s) || !json_string_length(s)) {
                agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS,
                                      json_pack("{s:s}", "field", "stop"),
                                      "stop[%zu]: must be a non-empty string", i);
                goto fail_quiet;
            }
            q->req.sampling.stop[q->req.sampling.n_stop++] = json_string_value(s);
        }
    }
    q->single_line = json_is_true(sl);
    q->req.time_budget_ms = (int32_t)budget;
    if (prefix) {
        q->prefix = strdup(prefix);
        q->suffix = strdup(suffix ? suffix : "");
        agent_rpc_offset_pos(prefix, strlen(prefix), strlen(prefix), c->utf8, &q->line,
                             &q->character);
    } else if (uri) {
        size_t len, off, a, b;
        const char *text = agent_rpc_doc_text(c->docs, uri, &len, NULL);
        json_t *pos = json_object_get(params, "position");
        json_t *pl = json_object_get(pos, "line"), *pc = json_object_get(pos, "character");
        if (!text) {
            agent_rpc_reply_error(c, id, RPC_DOCUMENT_NOT_OPEN, NULL, "%s is not open", uri);
            goto fail_quiet;
        }
        if (!json_is_integer(pl) || !json_is_integer(pc) ||
            agent_rpc_pos_offset(text, len, json_integer_value(pl), json_integer_value(pc),
                                 c->utf8, &off)) {
            agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS,
                                  json_pack("{s:s}", "field", "position"),
                                  "position: %s", json_is_integer(pl) && json_is_integer(pc)
                                                      ? agent_error_last()
                                                      : "{line, character} integers required");
            goto fail_quiet;
        }
        agent_rpc_fim_window(text, len, off, before, after, &a, &b);
        q->prefix = strndup(text + a, off - a);
        q->suffix = strndup(text + off, b - off);
        agent_rpc_offset_pos(text, len, off, c->utf8, &q->line, &q->character);
    } else {
        agent_rpc_reply_error(c, id, RPC_INVALID_PARAMS,
                              json_pack("{s:s}", "field", "textDocument"),
                              "give textDocument.uri and position of an open document, or "
                              "prefix (and suffix)");
        goto fail_quiet;
    }
    if (uri) {
        char *path = agent_rpc_uri_path(uri);
        const char *rel = NULL;
        int f = path ? agent_rpc_folder_of(c, path, &rel) : -1;
        if (f >= 0) {
            q->file_name = strdup(rel);
            q->repo_name = json_string_value(json_object_get(json_array_get(c->folders,
                                                                            (size_t)f), "name"));
        } else if (path) {
            q->file_name = strdup(strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
        }
        free(path);
    }
    if (parse_extra(c, id, json_object_get(params, "extra"), q)) goto fail_quiet;
    if (!q->prefix || !q->suffix) goto fail_oom;
    q->req.prompt = q->prefix;
    q->req.suffix = q->suffix;
    q->req.file_name = q->file_name;
    q->req.repo_name = q->req.n_extra ? (q->repo_name ? q->repo_name : "repo") : NULL;
    if (q->req.sampling.temperature == 0.0f && make_key(q, 0, stop)) goto fail_oom;
    cache_slot *hit = q->key ? cache_find(c->cache, q->key, q->key_len) : NULL;
    if (hit) {
        agent_rpc_reply(c, id, result_json(q, hit->text, hit->text_len, true, hit->stop,
                                           json_incref(hit->timings)));
        compl_free(q);
        return;
    }
    agent_rpc_call *call = agent_rpc_call_new(c, id, params);
    if (!call) goto fail_oom;
    call->state = q;
    call->free_state = compl_free;
    agent_rpc_progress(call, "begin", "completion", NULL, -1);
    int status = 400;
    if (srv_complete_submit(c->s, &q->req, wake, call, &call->job, &status)) {
        int code = status == 429 || status == 503 ? RPC_BUSY
                   : status >= 500 ? RPC_INTERNAL_ERROR
                   : strstr(agent_error_last(), "fill-in-the-middle") ? RPC_UNSUPPORTED
                                                                      : RPC_CONTEXT_TOO_LONG;
        agent_rpc_progress(call, "end", NULL, NULL, -1);
        agent_rpc_reply_error(c, id, code, NULL, "%s", agent_error_last());
        agent_rpc_call_end(call);
    }
    return;
fail_oom:
    agent_rpc_reply_error(c, id, RPC_INTERNAL_ERROR, NULL, "out of memory");
fail_quiet:
    compl_free(q);
}
