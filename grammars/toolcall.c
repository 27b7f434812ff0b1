/* Tool-call grammars: the tools' JSON Schemas composed into the call syntax of a chat format.
 *   Hermes / Qwen3:   <tool_call>\n{"name": "N", "arguments": ARGS}\n</tool_call>
 *   Qwen3-Coder XML:  <tool_call>\n<function=N>\n<parameter=P>\nV\n</parameter>\n...</function>\n</tool_call>
 * In the XML format a string parameter is raw text (as the Qwen3-Coder parser reads it), any
 * other parameter is JSON. */
#include "grammar_int.h"

#include <jansson.h>
#include <string.h>

static const char TRIGGER[] = "<tool_call>";

/* GBNF for text that never contains w, whose first byte occurs nowhere else in w:
 * ( other | partial* full )* partial*, where partial = w[0] and a proper prefix of the rest that
 * is cut by the next w[0], and full = such a prefix followed by a byte that breaks the match. */
static int text_without(grammar_buf *b, const char *name, const char *w) {
    size_t n = strlen(w);
    if (n < 2 || memchr(w + 1, w[0], n - 1)) return grammar_err(GRAMMAR_EINTERNAL, "text_without: bad word");
    char lit[8];
    grammar_buf part = {0}, full = {0};
    /* partial: w0 ( w1 ( w2 ... )? )? up to n-2 further bytes */
    for (size_t k = 1; k + 1 < n; k++) {
        grammar_buf_puts(&part, "( \"");
        grammar_buf_put_gbnf_literal(&part, w + k, 1);
        grammar_buf_puts(&part, "\" ");
    }
    for (size_t k = 1; k + 1 < n; k++) grammar_buf_puts(&part, ")? ");
    /* full: at each depth a byte other than w0 and w[k], or w[k] and deeper */
    for (size_t k = 1; k < n; k++) {
        grammar_buf_puts(&full, "( [^");
        snprintf(lit, sizeof lit, "\\x%02X", (unsigned char)w[0]);
        grammar_buf_puts(&full, lit);
        snprintf(lit, sizeof lit, "\\x%02X", (unsigned char)w[k]);
        grammar_buf_puts(&full, lit);
        grammar_buf_puts(&full, "]");
        if (k + 1 < n) {
            grammar_buf_puts(&full, " | \"");
            grammar_buf_put_gbnf_literal(&full, w + k, 1);
            grammar_buf_puts(&full, "\" ");
        }
    }
    for (size_t k = 1; k < n; k++) grammar_buf_puts(&full, " )");
    snprintf(lit, sizeof lit, "\\x%02X", (unsigned char)w[0]);
    grammar_buf_printf(b, "%s ::= ( [^%s] | %s-p* %s-f )* %s-p*\n", name, lit, name, name, name);
    grammar_buf_printf(b, "%s-p ::= \"", name);
    grammar_buf_put_gbnf_literal(b, w, 1);
    grammar_buf_printf(b, "\" %s\n", part.data ? part.data : "");
    grammar_buf_printf(b, "%s-f ::= \"", name);
    grammar_buf_put_gbnf_literal(b, w, 1);
    grammar_buf_printf(b, "\" %s\n", full.data ? full.data : "");
    int failed = part.failed || full.failed;
    free(part.data);
    free(full.data);
    return failed ? grammar_err(GRAMMAR_ENOMEM, "out of memory") : 0;
}

static void put_lit(grammar_buf *b, const char *s) {
    grammar_buf_puts(b, "\"");
    grammar_buf_put_gbnf_literal(b, s, strlen(s));
    grammar_buf_puts(b, "\"");
}

static int is_plain_string(json_t *s) {
    json_t *t = json_object_get(s, "type");
    if (!json_is_string(t) || strcmp(json_string_value(t), "string") != 0) return 0;
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (strcmp(k, "type") && strcmp(k, "description") && strcmp(k, "title") && strcmp(k, "default") &&
            strcmp(k, "examples") && strcmp(k, "enum"))
            return -1; /* string with constraints the raw form cannot carry */
    }
    return 1;
}

/* XML-format arguments of one tool: its parameters in schema order. */
static int xml_args(grammar_buf *b, json_t *params, int ti, uint32_t *used, char *name,
                    int *need_raw) {
    json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    snprintf(name, 64, "t%d-params", ti);
    if (params && !json_is_object(props) && json_object_size(props) == 0 && !json_object_get(params, "type"))
        props = NULL;
    const char *k;
    json_t *v;
    size_t n = json_object_size(props), i = 0;
    grammar_buf body = {0};
    json_object_foreach(props, k, v) {
        int required = 0;
        size_t j;
        json_t *r;
        json_array_foreach(req, j, r) if (json_is_string(r) && strcmp(json_string_value(r), k) == 0) required = 1;
        if (strchr(k, '>') || strchr(k, '\n')) {
            free(body.data);
            return grammar_err(GRAMMAR_EUNSUPPORTED, "tool %d: parameter name '%s' cannot be written in the XML format", ti, k);
        }
        char vname[64];
        int plain = is_plain_string(v);
        if (plain < 0) {
            free(body.data);
            return grammar_err(GRAMMAR_EUNSUPPORTED,
                               "tool %d: parameter '%s': string constraints other than enum are not "
                               "supported in the XML format", ti, k);
        }
        if (plain) {
            json_t *en = json_object_get(v, "enum");
            if (en) {
                snprintf(vname, sizeof vname, "t%d-p%zu-enum", ti, i);
                grammar_buf_printf(b, "%s ::= ", vname);
                size_t e;
                json_t *ev;
                int first = 1;
                json_array_foreach(en, e, ev) if (json_is_string(ev)) {
                    if (!first) grammar_buf_puts(b, " | ");
                    first = 0;
                    put_lit(b, json_string_value(ev));
                }
                if (first) {
                    free(body.data);
                    return grammar_err(GRAMMAR_EINVAL, "tool %d: parameter '%s': empty enum", ti, k);
                }
                grammar_buf_puts(b, "\n");
            } else {
                strcpy(vname, "xml-raw");
                *need_raw = 1;
            }
        } else {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "t%d-p%zu-", ti, i);
            int rc = grammar_schema_rules(b, v, prefix, vname, used);
            if (rc) {
                free(body.data);
                return rc;
            }
        }
        grammar_buf_puts(&body, required ? "" : "( ");
        grammar_buf_puts(&body, "\"<parameter=");
        grammar_buf_put_gbnf_literal(&body, k, strlen(k));
        grammar_buf_printf(&body, ">\\n\" %s \"\\n</parameter>\\n\"", vname);
        grammar_buf_puts(&body, required ? " " : " )? ");
        i++;
    }
    (void)n;
    grammar_buf_printf(b, "%s ::= %s\n", name, body.data ? body.data : "\"\"");
    int failed = body.failed;
    free(body.data);
    return failed ? grammar_err(GRAMMAR_ENOMEM, "out of memory") : 0;
}

int grammar_tools_to_gbnf(char **out, const char **trigger_out, const char *tools_json, size_t len,
                          const grammar_tool_options *opt) {
    if (!out || !tools_json || !opt) return grammar_err(GRAMMAR_EINVAL, "NULL argument");
    *out = NULL;
    if (trigger_out) *trigger_out = NULL;
    if (opt->version != GRAMMAR_TOOL_OPTIONS_VERSION) return grammar_err(GRAMMAR_EINVAL, "tool options version");
    if (opt->format != GRAMMAR_TOOLS_HERMES && opt->format != GRAMMAR_TOOLS_QWEN3_XML)
        return grammar_err(GRAMMAR_EINVAL, "unknown tool-call format");
    grammar_buf b = {0};
    if (opt->mode == GRAMMAR_TOOLS_NONE) {
        int rc = text_without(&b, "root", TRIGGER);
        if (rc || b.failed) {
            free(b.data);
            return rc ? rc : grammar_err(GRAMMAR_ENOMEM, "out of memory");
        }
        *out = b.data;
        return 0;
    }
    json_error_t e;
    json_t *tools = json_loadb(tools_json, len, 0, &e);
    if (!tools) return grammar_err(GRAMMAR_EINVAL, "tools JSON %d:%d: %s", e.line, e.column, e.text);
    int rc = 0;
    if (!json_is_array(tools) || json_array_size(tools) == 0) {
        rc = grammar_err(GRAMMAR_EINVAL, "tools must be a non-empty JSON array");
        goto done;
    }
    uint32_t used = 0;
    int need_raw = 0, n_alts = 0;
    grammar_buf alts = {0};
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        if (!fn) fn = t;
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *params = json_object_get(fn, "parameters");
        if (!name || !name[0]) {
            rc = grammar_err(GRAMMAR_EINVAL, "tools[%zu]: no name", i);
            break;
        }
        if (opt->mode == GRAMMAR_TOOLS_NAMED && (!opt->name || strcmp(opt->name, name) != 0)) continue;
        if (params && !json_is_object(params)) {
            rc = grammar_err(GRAMMAR_EINVAL, "tools[%zu] (%s): parameters is not an object", i, name);
            break;
        }
        json_t *own = params ? json_incref(params) : json_pack("{s:s}", "type", "object");
        char args[64];
        if (opt->format == GRAMMAR_TOOLS_HERMES) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "t%zu-", i);
            rc = grammar_schema_rules(&b, own, prefix, args, &used);
            if (!rc) {
                json_t *js = json_string(name);
                char *q = json_dumps(js, JSON_ENCODE_ANY);
                json_decref(js);
                grammar_buf_printf(&alts, "%s\"", n_alts ? " | " : "");
                if (q) grammar_buf_put_gbnf_literal(&alts, q, strlen(q));
                free(q);
                grammar_buf_printf(&alts, ", \\\"arguments\\\": \" %s", args);
            }
        } else {
            if (strchr(name, '>') || strchr(name, '\n')) {
                rc = grammar_err(GRAMMAR_EUNSUPPORTED, "tool name '%s' cannot be written in the XML format", name);
            } else {
                rc = xml_args(&b, own, (int)i, &used, args, &need_raw);
                if (!rc) {
                    grammar_buf_printf(&alts, "%s\"<function=", n_alts ? " | " : "");
                    grammar_buf_put_gbnf_literal(&alts, name, strlen(name));
                    grammar_buf_printf(&alts, ">\\n\" %s", args);
                }
            }
        }
        json_decref(own);
        if (rc) {
            char msg[900];
            snprintf(msg, sizeof msg, "%s", grammar_error_last());
            rc = grammar_err(rc, "tool '%s': %s", name, msg);
            break;
        }
        n_alts++;
    }
    if (!rc && n_alts == 0)
        rc = grammar_err(GRAMMAR_EINVAL, "no tool named '%s'", opt->name ? opt->name : "(null)");
    if (!rc) {
        if (opt->format == GRAMMAR_TOOLS_HERMES)
            grammar_buf_printf(&b, "call ::= \"<tool_call>\\n{\\\"name\\\": \" ( %s ) ws \"}\\n</tool_call>\"\n",
                               alts.data);
        else
            grammar_buf_printf(&b, "call ::= \"<tool_call>\\n\" ( %s ) \"</function>\\n</tool_call>\"\n",
                               alts.data);
        if (opt->format == GRAMMAR_TOOLS_HERMES) used |= GRAMMAR_CORE_WS;
        if (opt->parallel) grammar_buf_puts(&b, "root ::= call ( \"\\n\" call )*\n");
        else grammar_buf_puts(&b, "root ::= call\n");
        if (need_raw) rc = text_without(&b, "xml-raw", "</parameter>");
        grammar_schema_core(&b, used);
        if (!rc && b.failed) rc = grammar_err(GRAMMAR_ENOMEM, "out of memory");
    }
    free(alts.data);
    if (!rc && trigger_out && opt->mode == GRAMMAR_TOOLS_AUTO) *trigger_out = TRIGGER;
done:
    json_decref(tools);
    if (rc) {
        free(b.data);
        return rc;
    }
    *out = b.data;
    return 0;
}

int grammar_new_tools(grammar **out, const char *tools_json, size_t len, const grammar_tool_options *opt) {
    if (!out) return grammar_err(GRAMMAR_EINVAL, "out is NULL");
    *out = NULL;
    char *text;
    const char *trigger;
    int rc = grammar_tools_to_gbnf(&text, &trigger, tools_json, len, opt);
    if (rc) return rc;
    rc = grammar_new_gbnf(out, text, strlen(text), "root");
    free(text);
    if (rc == 0 && trigger) {
        rc = grammar_set_triggers(*out, &trigger, 1);
        if (rc) {
            grammar_free(*out);
            *out = NULL;
        }
    }
    return rc;
}
