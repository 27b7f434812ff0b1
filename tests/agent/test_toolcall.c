/* Tool-call parsing for both formats: valid calls, and every kind of bad call (malformed,
 * incomplete, unknown, schema-invalid, oversized) carries a precise error and no executable
 * arguments are trusted. */
#include "agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools.h"

static int failures;
#define CHECK(c)                                                                               \
    do {                                                                                       \
        if (!(c)) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);              \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

static char *TOOLS;

static int parse(agent_reply *r, const char *text, agent_toolcall_format f) {
    return agent_toolcall_parse(r, text, strlen(text), f, TOOLS, agent_validate_builtin, NULL);
}

static bool err_has(const agent_toolcall *c, const char *needle) {
    bool ok = c->error && strstr(c->error, needle);
    if (!ok) fprintf(stderr, "  error was: %s (wanted '%s')\n", c->error ? c->error : "(none)",
                     needle);
    return ok;
}

static void test_hermes(void) {
    agent_reply r;
    CHECK(parse(&r, "I will read it.\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": "
                    "{\"path\": \"a.c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"git_status\","
                    " \"arguments\": {}}\n</tool_call>", AGENT_TOOLCALL_HERMES) == 0);
    CHECK(r.n_calls == 2);
    CHECK(!strcmp(r.content, "I will read it."));
    if (r.n_calls == 2) {
        CHECK(!r.calls[0].error && !strcmp(r.calls[0].name, "read_file"));
        CHECK(!strcmp(r.calls[0].args_json, "{\"path\":\"a.c\"}"));
        CHECK(!r.calls[1].error && !strcmp(r.calls[1].args_json, "{}"));
    }
    agent_reply_clear(&r);

    /* arguments given as a JSON string */
    CHECK(parse(&r, "<tool_call>{\"name\":\"read_file\",\"arguments\":\"{\\\"path\\\":\\\"x\\\"}\"}"
                    "</tool_call>", AGENT_TOOLCALL_HERMES) == 0);
    CHECK(r.n_calls == 1 && !r.calls[0].error && !strcmp(r.calls[0].args_json, "{\"path\":\"x\"}"));
    agent_reply_clear(&r);

    /* no calls at all */
    CHECK(parse(&r, "  The answer is 42.\n", AGENT_TOOLCALL_HERMES) == 0);
    CHECK(r.n_calls == 0 && !strcmp(r.content, "The answer is 42."));
    agent_reply_clear(&r);

    struct {
        const char *text, *needle;
    } bad[] = {
        {"<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.c\"}\n</tool_call>",
         "not valid JSON"},
        {"<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.c\"}}", "incomplete"},
        {"<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
         "unknown tool \"rm_rf\"; the tools are: read_file"},
        {"<tool_call>{\"name\": \"read_file\", \"arguments\": {}}</tool_call>", "path"},
        {"<tool_call>{\"name\": \"read_file\", \"arguments\": {\"path\": 7}}</tool_call>",
         "invalid arguments"},
        {"<tool_call>{\"name\": \"read_file\", \"arguments\": [1]}</tool_call>",
         "must be a JSON object"},
        {"<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>", "non-empty string"},
        {"<tool_call>{\"name\": \"git_status\", \"arguments\": {}, \"id\": 1}</tool_call>",
         "unexpected key \"id\""},
        {"<tool_call>[1,2]</tool_call>", "JSON object"},
        {"<tool_call>{\"name\":\"git_status\",\"name\":\"x\",\"arguments\":{}}</tool_call>",
         "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(parse(&r, bad[i].text, AGENT_TOOLCALL_HERMES) == 0);
        CHECK(r.n_calls == 1);
        if (r.n_calls == 1) {
            if (!err_has(&r.calls[0], bad[i].needle)) fprintf(stderr, "  case %zu\n", i);
            CHECK(r.calls[0].error != NULL);
        }
        agent_reply_clear(&r);
    }

    /* an unfinished call followed by a complete one: the first is an error, the second valid */
    CHECK(parse(&r, "<tool_call>{\"name\":\"read_file\"<tool_call>{\"name\":\"git_status\","
                    "\"arguments\":{}}</tool_call>", AGENT_TOOLCALL_HERMES) == 0);
    CHECK(r.n_calls == 2);
    if (r.n_calls == 2) {
        CHECK(err_has(&r.calls[0], "incomplete"));
        CHECK(!r.calls[1].error);
    }
    agent_reply_clear(&r);

    /* oversized: never parsed */
    size_t big = AGENT_TOOLCALL_MAX_BYTES + 100;
    char *t = malloc(big + 128);
    strcpy(t, "<tool_call>{\"name\":\"read_file\",\"arguments\":{\"path\":\"");
    size_t o = strlen(t);
    memset(t + o, 'a', big);
    strcpy(t + o + big, "\"}}</tool_call>");
    CHECK(parse(&r, t, AGENT_TOOLCALL_HERMES) == 0);
    CHECK(r.n_calls == 1 && err_has(&r.calls[0], "too large") && !r.calls[0].args_json);
    agent_reply_clear(&r);
    free(t);
}

static void test_xml(void) {
    agent_reply r;
    CHECK(parse(&r, "Reading.\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/a b.c\n"
                    "</parameter>\n<parameter=start_line>\n3\n</parameter>\n</function>\n"
                    "</tool_call>", AGENT_TOOLCALL_XML) == 0);
    CHECK(r.n_calls == 1 && !strcmp(r.content, "Reading."));
    if (r.n_calls == 1) {
        if (r.calls[0].error) fprintf(stderr, "  %s\n", r.calls[0].error);
        CHECK(!r.calls[0].error);
        CHECK(r.calls[0].args_json &&
              !strcmp(r.calls[0].args_json, "{\"path\":\"src/a b.c\",\"start_line\":3}"));
    }
    agent_reply_clear(&r);

    /* a string parameter keeps JSON-looking text verbatim, including inner newlines */
    CHECK(parse(&r, "<tool_call>\n<function=git_commit>\n<parameter=message>\n{\"a\": 1}\n\nbody\n"
                    "</parameter>\n</function>\n</tool_call>", AGENT_TOOLCALL_XML) == 0);
    CHECK(r.n_calls == 1 && !r.calls[0].error &&
          !strcmp(r.calls[0].args_json, "{\"message\":\"{\\\"a\\\": 1}\\n\\nbody\"}"));
    agent_reply_clear(&r);

    struct {
        const char *text, *needle;
    } bad[] = {
        {"<tool_call>\n<function=read_file>\n<parameter=path>\na.c\n</function>\n</tool_call>",
         "no </parameter>"},
        {"<tool_call>\n<function=nope>\n</function>\n</tool_call>", "unknown tool \"nope\""},
        {"<tool_call>\n{\"name\":\"read_file\"}\n</tool_call>", "expected <function=NAME>"},
        {"<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter>\n<parameter=path>"
         "\nb\n</parameter>\n</function>\n</tool_call>", "given twice"},
        {"<tool_call>\n<function=read_file>\n<parameter=start_line>\nten\n</parameter>\n"
         "</function>\n</tool_call>", "invalid arguments"},
        {"<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter>\n</function>\nxx"
         "</tool_call>", "after </function>"},
        {"<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter>\n", "incomplete"},
        {"<tool_call>\n<function=read_file>\n<bogus>\n</function>\n</tool_call>",
         "expected <parameter=NAME>"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(parse(&r, bad[i].text, AGENT_TOOLCALL_XML) == 0);
        CHECK(r.n_calls == 1);
        if (r.n_calls == 1) {
            if (!err_has(&r.calls[0], bad[i].needle)) fprintf(stderr, "  xml case %zu\n", i);
        }
        agent_reply_clear(&r);
    }
}

static void test_api(void) {
    agent_reply r;
    CHECK(agent_toolcall_parse(&r, "x", 1, AGENT_TOOLCALL_HERMES, "{", NULL, NULL) ==
          AGENT_EINVAL);
    CHECK(agent_toolcall_parse(&r, "x", 1, 7, TOOLS, NULL, NULL) == AGENT_EINVAL);
    CHECK(agent_toolcall_parse(NULL, "x", 1, 0, TOOLS, NULL, NULL) == AGENT_EINVAL);
    agent_reply_clear(NULL);
}

int main(void) {
    if (tool_schemas_json(&TOOLS, TOOL_FORMAT_OPENAI) < 0) {
        fprintf(stderr, "tool_schemas_json: %s\n", tool_error_last());
        return 1;
    }
    test_hermes();
    test_xml();
    test_api();
    free(TOOLS);
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
