/* Chat templates: errors are precise and never crash. Malformed templates, unsupported
 * constructs and render failures name the line and column; bad inputs get AGENT_EINVAL;
 * runaway templates stop at their limits. */
#include "agent.h"
#include "template_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "FAIL line %d: ", __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, "\n");                                                         \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

static const char *MSGS = "[{\"role\":\"user\",\"content\":\"hi\"}]";

/* Parse must fail with `code` and a message containing `want`. */
static void parse_fails(const char *src, int code, const char *want) {
    agent_template *t = (agent_template *)1;
    int rc = agent_template_new(&t, src);
    CHECK(rc == code, "parse of %s: rc %d, want %d (%s)", src, rc, code, agent_error_last());
    CHECK(t == NULL, "parse of %s: *out not NULL on error", src);
    CHECK(strstr(agent_error_last(), want), "parse of %s: error '%s' lacks '%s'", src,
          agent_error_last(), want);
}

/* Parse must succeed and render must fail with a message containing `want`. */
static void render_fails(const char *src, const char *vars, const char *want) {
    agent_template *t = NULL;
    int rc = agent_template_new(&t, src);
    CHECK(rc == 0, "parse of %s failed: %s", src, agent_error_last());
    if (rc) return;
    char *out = (char *)1;
    rc = vars ? agent_template_render_vars(t, vars, &out, NULL)
              : agent_template_render(t, MSGS, NULL, NULL, &out, NULL);
    CHECK(rc == AGENT_ETEMPLATE, "render of %s: rc %d (%s)", src, rc, agent_error_last());
    CHECK(out == NULL, "render of %s: *out not NULL on error", src);
    CHECK(strstr(agent_error_last(), want), "render of %s: error '%s' lacks '%s'", src,
          agent_error_last(), want);
    agent_template_free(t);
}

int main(void) {
    /* syntax errors with positions */
    parse_fails("{{ 'abc }}", AGENT_ETEMPLATE, "line 1, column 4: unterminated string");
    parse_fails("ok\n{% frob %}", AGENT_ETEMPLATE, "line 2, column 4: unknown or unsupported "
                                                   "statement (at 'frob')");
    parse_fails("{% for x in y %}\nabc", AGENT_ETEMPLATE, "missing {% endfor %}");
    parse_fails("{% if x %}a{% else %}b", AGENT_ETEMPLATE, "missing {% endif %}");
    parse_fails("{{ x ; }}", AGENT_ETEMPLATE, "line 1, column 6: unexpected character ';'");
    parse_fails("a\nb {# never closed", AGENT_ETEMPLATE, "line 2, column 3: missing end of "
                                                        "comment");
    parse_fails("{{ f(a=1, 2) }}", AGENT_ETEMPLATE, "positional argument follows keyword");
    parse_fails("{% macro m(a=1, b) %}{% endmacro %}", AGENT_ETEMPLATE, "non-default parameter");
    parse_fails("{% call m() %}x{% endcall %}", AGENT_ETEMPLATE, "unsupported statement: {% call");
    parse_fails("{{ f(*args) }}", AGENT_ETEMPLATE, "unsupported: argument unpacking");
    parse_fails("{{ x[] }}", AGENT_ETEMPLATE, "expected an index or a slice");
    parse_fails("{{ 'a' \\ }}", AGENT_ETEMPLATE, "unexpected character");
    parse_fails("{{ '\\q' }}", AGENT_ETEMPLATE, "unexpected escaped character");
    parse_fails("\xff\xfe", AGENT_EINVAL, "not valid UTF-8");
    {
        char deep[2000];
        size_t n = 0;
        n += (size_t)snprintf(deep + n, sizeof deep - n, "{{ ");
        for (int i = 0; i < 500; i++) deep[n++] = '(';
        deep[n] = 0;
        parse_fails(deep, AGENT_ETEMPLATE, "nested too deeply");
    }
    /* the position survives lstrip_blocks/trim_blocks preprocessing */
    render_fails("line one\n  {% if true %}\n  {{ 'x' | frobnicate }}\n  {% endif %}", NULL,
                 "line 3, column 10: unknown StringValue filter: frobnicate");
    render_fails("{{ 1 is frob }}", NULL, "line 1, column 6: unknown test: frob");
    render_fails("\n\n{{- raise_exception('Conversation roles must alternate!') }}", NULL,
                 "line 3, column 5: raise_exception: Conversation roles must alternate!");
    render_fails("{{ messages[0].content + none }}", NULL, "null values");
    render_fails("{{ nope + 1 }}", NULL, "undefined values");
    render_fails("{{ x|tojson(sort_keys=true) }}", "{\"x\":{}}", "sort_keys=true) is not "
                                                              "supported");
    render_fails("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", NULL,
                 "macro calls nested too deeply");
    render_fails("{% break %}", NULL, "break or continue outside a loop");
    {
        /* deep evaluation (macro recursion through nested literals) stops before the stack */
        char deep[1200] = "{% macro f(n) %}{% if n > 0 %}{{ ";
        for (int i = 0; i < 60; i++) strcat(deep, "[");
        strcat(deep, "f(n - 1)");
        for (int i = 0; i < 60; i++) strcat(deep, "]");
        strcat(deep, " }}{% endif %}{% endmacro %}{{ f(99) }}");
        render_fails(deep, NULL, "evaluation nested too deeply");
    }
    render_fails("{% set ns = namespace(x=1) %}{% for i in range(2000) %}{% set ns.x = [ns.x] %}"
                 "{% endfor %}{{ ns.x|tojson }}",
                 NULL, "value nested too deeply");
    {
        agent_template *t = NULL;
        CHECK(agent_template_new(&t, "{% for i in range(100000) %}{% for j in range(1000) %}"
                                     "{% endfor %}{% endfor %}") == 0,
              "parse budget template");
        tpl_set_limits(t, (size_t)64 << 20, 20000);
        char *out = NULL;
        int rc = agent_template_render(t, MSGS, NULL, NULL, &out, NULL);
        CHECK(rc == AGENT_ETEMPLATE && strstr(agent_error_last(), "evaluation budget exceeded"),
              "budget: rc %d %s", rc, agent_error_last());
        tpl_set_limits(t, (size_t)1 << 20, 100000000);
        rc = agent_template_render(t, MSGS, NULL, NULL, &out, NULL);
        CHECK(rc == AGENT_ENOMEM && strstr(agent_error_last(), "render limit"),
              "memory limit: rc %d %s", rc, agent_error_last());
        agent_template_free(t);
    }

    /* bad inputs */
    agent_template *t = NULL;
    CHECK(agent_template_new(&t, "{{ messages|length }}") == 0, "parse");
    char *out = NULL;
    size_t len = 0;
    CHECK(agent_template_render(t, "[{\"role\": ", NULL, NULL, &out, NULL) == AGENT_EINVAL &&
              strstr(agent_error_last(), "messages: invalid JSON at line 1"),
          "truncated JSON: %s", agent_error_last());
    CHECK(agent_template_render(t, "{}", NULL, NULL, &out, NULL) == AGENT_EINVAL,
          "messages object");
    CHECK(agent_template_render(t, "[]", "{\"a\":1}", NULL, &out, NULL) == AGENT_EINVAL,
          "tools object");
    CHECK(agent_template_render(t, "[{\"a\":1,\"a\":2}]", NULL, NULL, &out, NULL) ==
              AGENT_EINVAL,
          "duplicate keys");
    CHECK(agent_template_render_vars(t, "[1]", &out, NULL) == AGENT_EINVAL, "vars not object");
    CHECK(agent_template_render_vars(t, "{\"true\": 1}", &out, NULL) == AGENT_EINVAL,
          "shadowing a built-in");
    CHECK(agent_template_render(NULL, MSGS, NULL, NULL, &out, NULL) == AGENT_EINVAL, "NULL t");
    CHECK(agent_template_new(NULL, "x") == AGENT_EINVAL, "NULL out");
    CHECK(agent_template_render(t, "[1,2,3]", NULL, NULL, &out, &len) == 0 && len == 1 &&
              !strcmp(out, "3"),
          "render ok");
    free(out);
    /* a NUL inside a JSON string survives with the exact length */
    agent_template *t2 = NULL;
    CHECK(agent_template_new(&t2, "[{{ messages[0].content }}]") == 0, "parse");
    CHECK(agent_template_render(t2, "[{\"content\":\"a\\u0000b\"}]", NULL, NULL, &out, &len) ==
                  0 &&
              len == 5 && !memcmp(out, "[a\0b]", 5),
          "NUL in content");
    free(out);
    agent_template_free(t2);
    agent_template_free(t);
    agent_template_free(NULL);
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
