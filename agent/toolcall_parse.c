/* Tool calls in model output: Hermes JSON and Qwen3-Coder XML, each call checked (markup, name,
 * arguments, schema) so that only valid calls reach execution. */
#include "agent_int.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools.h"


static const char OPEN[] = "<tool_call>";
static const char CLOSE[] = "</tool_call>";

static char *xstrndup(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NULL;
    char *p = malloc((size_t)n + 1);
    if (!p) return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

static const char *memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == n[0] && !memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void trim(const char **s, size_t *n) {
    while (*n && is_space(**s)) (*s)++, (*n)--;
    while (*n && is_space((*s)[*n - 1])) (*n)--;
}

void agent_reply_clear(agent_reply *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n_calls; i++) {
        free(r->calls[i].name);
        free(r->calls[i].args_json);
        free(r->calls[i].error);
    }
    free(r->calls);
    free(r->content);
    memset(r, 0, sizeof *r);
}

/* The function object of tool `name` in the OpenAI-style array (or a bare {name,parameters}). */
static json_t *find_tool(json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        if (!f) f = t;
        const char *n = json_string_value(json_object_get(f, "name"));
        if (n && !strcmp(n, name)) return f;
    }
    return NULL;
}

static char *tool_names(json_t *tools) {
    size_t cap = 64, len = 0, i;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = 0;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        if (!f) f = t;
        const char *n = json_string_value(json_object_get(f, "name"));
        if (!n) continue;
        size_t nl = strlen(n);
        if (len + nl + 3 > cap) {
            while (len + nl + 3 > cap) cap *= 2;
            char *ns = realloc(s, cap);
            if (!ns) return free(s), NULL;
            s = ns;
        }
        if (len) memcpy(s + len, ", ", 2), len += 2;
        memcpy(s + len, n, nl + 1);
        len += nl;
    }
    return s;
}

/* Parse a Hermes body: {"name": ..., "arguments": {...}}. Sets c->name/args_json or c->error. */
static int parse_hermes(agent_toolcall *c, const char *b, size_t n, size_t idx) {
    json_error_t je;
    json_t *v = json_loadb(b, n, JSON_REJECT_DUPLICATES, &je);
    if (!v) {
        c->error = xasprintf("tool call %zu: the body is not valid JSON (line %d, column %d: %s); "
                             "write {\"name\": \"TOOL\", \"arguments\": {...}}",
                             idx, je.line, je.column, je.text);
        return c->error ? 0 : AGENT_ENOMEM;
    }
    int rc = 0;
    const char *key;
    json_t *val;
    if (!json_is_object(v)) {
        c->error = xasprintf("tool call %zu: the body must be a JSON object with \"name\" and "
                             "\"arguments\"", idx);
        goto done;
    }
    json_object_foreach(v, key, val) {
        if (strcmp(key, "name") && strcmp(key, "arguments")) {
            c->error = xasprintf("tool call %zu: unexpected key \"%s\" (only \"name\" and "
                                 "\"arguments\")", idx, key);
            goto done;
        }
    }
    const char *name = json_string_value(json_object_get(v, "name"));
    if (!name || !*name) {
        c->error = xasprintf("tool call %zu: \"name\" must be a non-empty string", idx);
        goto done;
    }
    if (!(c->name = strdup(name))) goto oom;
    json_t *args = json_object_get(v, "arguments");
    json_t *parsed = NULL;
    if (!args) {
        parsed = json_object();
    } else if (json_is_string(args)) { /* some models write the arguments as a JSON string */
        parsed = json_loads(json_string_value(args), JSON_REJECT_DUPLICATES, &je);
        if (!parsed || !json_is_object(parsed)) {
            json_decref(parsed);
            c->error = xasprintf("tool call %zu (%s): \"arguments\" must be a JSON object",
                                 idx, name);
            goto done;
        }
    } else if (json_is_object(args)) {
        parsed = json_incref(args);
    } else {
        c->error = xasprintf("tool call %zu (%s): \"arguments\" must be a JSON object", idx, name);
        goto done;
    }
    if (!parsed) goto oom;
    c->args_json = json_dumps(parsed, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(parsed);
    if (!c->args_json) goto oom;
done:
    json_decref(v);
    return rc;
oom:
    json_decref(v);
    return AGENT_ENOMEM;
}

static bool starts(const char *s, size_t n, const char *lit) {
    size_t l = strlen(lit);
    return n >= l && !memcmp(s, lit, l);
}

/* Whether the parameter's schema asks for a string (then the value is taken verbatim). */
static bool param_is_string(json_t *fn, const char *param) {
    json_t *ps = json_object_get(json_object_get(json_object_get(fn, "parameters"),
                                                 "properties"), param);
    json_t *ty = json_object_get(ps, "type");
    if (!ps || !ty) return true;
    if (json_is_string(ty)) return !strcmp(json_string_value(ty), "string");
    size_t i;
    json_t *x;
    json_array_foreach(ty, i, x) if (json_is_string(x) && !strcmp(json_string_value(x), "string"))
        return true;
    return false;
}

/* Parse an XML body: <function=N> (<parameter=P>\nV\n</parameter>)* </function>. */
static int parse_xml(agent_toolcall *c, const char *b, size_t n, size_t idx, json_t *tools) {
    if (!starts(b, n, "<function=")) {
        c->error = xasprintf("tool call %zu: expected <function=NAME> right after <tool_call>",
                             idx);
        return c->error ? 0 : AGENT_ENOMEM;
    }
    b += 10, n -= 10;
    const char *gt = memchr(b, '>', n);
    if (!gt || gt == b || memchr(b, '\n', (size_t)(gt - b))) {
        c->error = xasprintf("tool call %zu: malformed <function=NAME> tag", idx);
        return c->error ? 0 : AGENT_ENOMEM;
    }
    if (!(c->name = xstrndup(b, (size_t)(gt - b)))) return AGENT_ENOMEM;
    n -= (size_t)(gt + 1 - b), b = gt + 1;
    json_t *fn = find_tool(tools, c->name);
    json_t *args = json_object();
    if (!args) return AGENT_ENOMEM;
    bool closed = false;
    for (;;) {
        while (n && is_space(*b)) b++, n--;
        if (starts(b, n, "</function>")) {
            b += 11, n -= 11;
            closed = true;
            break;
        }
        if (!starts(b, n, "<parameter=")) {
            c->error = xasprintf("tool call %zu (%s): expected <parameter=NAME> or </function>",
                                 idx, c->name);
            goto out;
        }
        b += 11, n -= 11;
        gt = memchr(b, '>', n);
        if (!gt || gt == b || memchr(b, '\n', (size_t)(gt - b))) {
            c->error = xasprintf("tool call %zu (%s): malformed <parameter=NAME> tag", idx,
                                 c->name);
            goto out;
        }
        char *pname = xstrndup(b, (size_t)(gt - b));
        if (!pname) goto oom;
        n -= (size_t)(gt + 1 - b), b = gt + 1;
        const char *end = memfind(b, n, "</parameter>", 12);
        if (!end) {
            c->error = xasprintf("tool call %zu (%s): parameter \"%s\" has no </parameter>", idx,
                                 c->name, pname);
            free(pname);
            goto out;
        }
        const char *v = b;
        size_t vn = (size_t)(end - b);
        if (vn && v[0] == '\n') v++, vn--;
        if (vn && v[vn - 1] == '\n') vn--;
        if (json_object_get(args, pname)) {
            c->error = xasprintf("tool call %zu (%s): parameter \"%s\" given twice", idx, c->name,
                                 pname);
            free(pname);
            goto out;
        }
        json_t *jv = NULL;
        if (!fn || !param_is_string(fn, pname)) jv = json_loadb(v, vn, JSON_DECODE_ANY, NULL);
        if (!jv) jv = json_stringn(v, vn);
        if (!jv) {
            c->error = xasprintf("tool call %zu (%s): parameter \"%s\" is not valid UTF-8", idx,
                                 c->name, pname);
            free(pname);
            goto out;
        }
        int r = json_object_set_new(args, pname, jv);
        free(pname);
        if (r) goto oom;
        n -= (size_t)(end + 12 - b), b = end + 12;
    }
    while (n && is_space(*b)) b++, n--;
    if (closed && n) {
        c->error = xasprintf("tool call %zu (%s): unexpected text after </function>", idx,
                             c->name);
        goto out;
    }
    if (!(c->args_json = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER))) goto oom;
out:
    json_decref(args);
    return (c->error || c->args_json) ? 0 : AGENT_ENOMEM;
oom:
    json_decref(args);
    return AGENT_ENOMEM;
}

static int push_call(agent_reply *r, size_t *cap) {
    if (r->n_calls == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        agent_toolcall *p = realloc(r->calls, nc * sizeof *p);
        if (!p) return AGENT_ENOMEM;
        r->calls = p;
        *cap = nc;
    }
    memset(&r->calls[r->n_calls++], 0, sizeof r->calls[0]);
    return 0;
}

/* Name and schema checks of a call whose markup parsed. */
static int check_call(agent_toolcall *c, size_t idx, json_t *tools, agent_validate_fn validate,
                      void *vu) {
    if (c->error) return 0;
    if (!find_tool(tools, c->name)) {
        char *names = tool_names(tools);
        c->error = xasprintf("tool call %zu: unknown tool \"%s\"; the tools are: %s", idx,
                             c->name, names ? names : "");
        free(names);
        return c->error ? 0 : AGENT_ENOMEM;
    }
    if (validate) {
        char *err = NULL;
        if (validate(vu, c->name, c->args_json, &err)) {
            c->error = xasprintf("tool call %zu (%s): invalid arguments: %s", idx, c->name,
                                 err ? err : "rejected");
            free(err);
            if (!c->error) return AGENT_ENOMEM;
        }
    }
    return 0;
}

int agent_toolcall_parse(agent_reply *out, const char *text, size_t len,
                         agent_toolcall_format fmt, const char *tools_json,
                         agent_validate_fn validate, void *validate_user) {
    if (!out || (!text && len) || !tools_json)
        return agent_err(AGENT_EINVAL, "agent_toolcall_parse: NULL argument");
    memset(out, 0, sizeof *out);
    if (fmt != AGENT_TOOLCALL_HERMES && fmt != AGENT_TOOLCALL_XML)
        return agent_err(AGENT_EINVAL, "agent_toolcall_parse: unknown format %d", (int)fmt);
    json_error_t je;
    json_t *tools = json_loads(tools_json, 0, &je);
    if (!tools || !json_is_array(tools)) {
        json_decref(tools);
        return agent_err(AGENT_EINVAL, "tools: not a JSON array (line %d: %s)", je.line,
                         je.text);
    }
    char *content = malloc(len + 1);
    size_t clen = 0, cap = 0;
    int rc = content ? 0 : AGENT_ENOMEM;
    const char *p = text, *end = text + len;
    while (!rc && p < end) {
        const char *o = memfind(p, (size_t)(end - p), OPEN, sizeof OPEN - 1);
        const char *seg_end = o ? o : end;
        memcpy(content + clen, p, (size_t)(seg_end - p));
        clen += (size_t)(seg_end - p);
        if (!o) break;
        if ((rc = push_call(out, &cap))) break;
        agent_toolcall *c = &out->calls[out->n_calls - 1];
        size_t idx = out->n_calls;
        const char *body = o + sizeof OPEN - 1;
        const char *cl = memfind(body, (size_t)(end - body), CLOSE, sizeof CLOSE - 1);
        /* A second <tool_call> before the close means this one was never finished. */
        const char *reopen = memfind(body, (size_t)((cl ? cl : end) - body), OPEN,
                                     sizeof OPEN - 1);
        if (!cl || reopen) {
            const char *stop = reopen ? reopen : end;
            c->error = xasprintf("tool call %zu is incomplete: no </tool_call> after its %zu "
                                 "bytes; it was not executed", idx, (size_t)(stop - body));
            if (!c->error) rc = AGENT_ENOMEM;
            p = stop;
            continue;
        }
        size_t bn = (size_t)(cl - body);
        p = cl + sizeof CLOSE - 1;
        if (bn > AGENT_TOOLCALL_MAX_BYTES) {
            c->error = xasprintf("tool call %zu is too large (%zu bytes, at most %u); it was "
                                 "not executed", idx, bn, AGENT_TOOLCALL_MAX_BYTES);
            if (!c->error) rc = AGENT_ENOMEM;
            continue;
        }
        const char *b = body;
        trim(&b, &bn);
        rc = fmt == AGENT_TOOLCALL_HERMES ? parse_hermes(c, b, bn, idx)
                                          : parse_xml(c, b, bn, idx, tools);
        if (!rc) rc = check_call(c, idx, tools, validate, validate_user);
    }
    json_decref(tools);
    if (rc) {
        free(content);
        agent_reply_clear(out);
        return rc == AGENT_ENOMEM ? agent_err(rc, "out of memory parsing tool calls") : rc;
    }
    const char *cs = content;
    size_t cn = clen;
    trim(&cs, &cn);
    memmove(content, cs, cn);
    content[cn] = 0;
    out->content = content;
    return 0;
}

int agent_validate_builtin(void *user, const char *name, const char *args_json, char **err) {
    (void)user;
    *err = NULL;
    /* the very check tool_call() applies before running, so approval sees the same verdict */
    if (tool_args_check(name, args_json) < 0) {
        *err = strdup(tool_error_last());
        return -1;
    }
    return 0;
}
