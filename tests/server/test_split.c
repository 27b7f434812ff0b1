/* agent/server/split.c: generated text -> reasoning / text / tool-call events. Fixed cases in
 * both tool-call formats, and for each case every cut of the text into two pieces (and a cut
 * after every byte) gives the same events as the whole text. */
#include "split_events.h"

static int failures;

#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                \
            fprintf(stderr, __VA_ARGS__);                                                       \
            fputc('\n', stderr);                                                                \
            failures++;                                                                         \
        }                                                                                       \
    } while (0)

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"a\":{\"type\":\"integer\"},\"s\":{\"type\":\"string\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":{\"type\":\"object\"}}}]";

typedef struct {
    const char *name;
    const char *text;
    bool raw, think, tools;
    agent_toolcall_format fmt;
    const char *want;
    int calls;
} tcase;

static const tcase cases[] = {
    {"raw", "hello <think> <tool_call> world", true, true, true, AGENT_TOOLCALL_HERMES,
     "T:hello <think> <tool_call> world", 0},
    {"plain", "just text\n", false, false, false, AGENT_TOOLCALL_HERMES, "T:just text\n", 0},
    {"think", "<think>\nplan it\n</think>\n\nThe answer.", false, true, false,
     AGENT_TOOLCALL_HERMES, "R:plan it|T:The answer.", 0},
    {"think, empty block", "<think>\n\n</think>\n\nok", false, true, false,
     AGENT_TOOLCALL_HERMES, "T:ok", 0},
    {"think, no newline", "<think>a</think>b", false, true, false, AGENT_TOOLCALL_HERMES,
     "R:a|T:b", 0},
    {"think off: the markup is text", "<think>\nx\n</think>y", false, false, false,
     AGENT_TOOLCALL_HERMES, "T:<think>\nx\n</think>y", 0},
    {"think not at the start", "x<think>y</think>", false, true, false, AGENT_TOOLCALL_HERMES,
     "T:x<think>y</think>", 0},
    {"think cut off", "<think>\nstill thinking", false, true, false, AGENT_TOOLCALL_HERMES,
     "R:still thinking", 0},
    {"hermes calls", "Sure. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"
     "</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>",
     false, false, true, AGENT_TOOLCALL_HERMES,
     "T:Sure. |C0:f:{\"a\":1}|C1:g:{}", 2},
    {"think then a call", "<think>\nneed f\n</think>\n\n<tool_call>\n{\"name\": \"f\", "
     "\"arguments\": {\"s\": \"</think>\"}}\n</tool_call>", false, true, true,
     AGENT_TOOLCALL_HERMES, "R:need f|C0:f:{\"s\":\"</think>\"}", 1},
    {"unknown tool", "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>", false,
     false, true, AGENT_TOOLCALL_HERMES, NULL, 1},
    {"call cut off", "x <tool_call>\n{\"name\": \"f\", \"argu", false, false, true,
     AGENT_TOOLCALL_HERMES, "T:x <tool_call>\n{\"name\": \"f\", \"argu", 0},
    {"no tools: markup is text", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", false, false,
     false, AGENT_TOOLCALL_HERMES, "T:<tool_call>\n{\"name\": \"f\"}\n</tool_call>", 0},
    {"almost a marker", "a <tool_cal b </tool_call> c", false, false, true,
     AGENT_TOOLCALL_HERMES, "T:a <tool_cal b </tool_call> c", 0},
    {"xml call", "<tool_call>\n<function=f>\n<parameter=a>\n7\n</parameter>\n<parameter=s>\n"
     "hi there\n</parameter>\n</function>\n</tool_call>", false, false, true,
     AGENT_TOOLCALL_XML, "C0:f:{\"a\":7,\"s\":\"hi there\"}", 1},
    {"utf-8 around markers", "é<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n"
     "</tool_call>ü", false, false, true, AGENT_TOOLCALL_HERMES, "T:é|C0:g:{}|T:ü", 1},
};

int main(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const tcase *c = &cases[i];
        size_t n = strlen(c->text);
        const char *tools = c->tools ? TOOLS : NULL;
        int calls = -1;
        char *whole = split_run(c->text, n, NULL, 0, c->raw, c->think, tools, c->fmt, &calls);
        if (c->want) CHECK(!strcmp(whole, c->want), "%s: got '%s', want '%s'", c->name, whole,
                           c->want);
        else CHECK(!strncmp(whole, "E0:nope:", 8), "%s: got '%s'", c->name, whole);
        CHECK(calls == (c->want ? c->calls : 0) || (!c->want && calls == 1), "%s: %d calls",
              c->name, calls);
        for (size_t cut = 0; cut <= n; cut++) {
            char *two = split_run(c->text, n, &cut, 1, c->raw, c->think, tools, c->fmt, NULL);
            CHECK(!strcmp(two, whole), "%s: cut at %zu: '%s' vs '%s'", c->name, cut, two, whole);
            free(two);
        }
        size_t *all = malloc((n + 1) * sizeof *all);
        for (size_t k = 0; k < n; k++) all[k] = k + 1;
        char *bytes = split_run(c->text, n, all, n, c->raw, c->think, tools, c->fmt, NULL);
        CHECK(!strcmp(bytes, whole), "%s: byte by byte: '%s' vs '%s'", c->name, bytes, whole);
        free(bytes);
        free(all);
        free(whole);
    }
    if (failures) return 1;
    printf("test_split: %zu cases ok\n", sizeof cases / sizeof cases[0]);
    return 0;
}
