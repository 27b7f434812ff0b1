/* agent/server/split.c: generated text -> reasoning / text / tool-call events. Fixed cases in
 * both tool-call formats, and for each case every cut of the text into two pieces (and a cut
 * after every byte) gives the same events as the whole text. */
#include <stdint.h>

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
    const char *want;       /* NULL: an unknown-tool error; "...*": a prefix */
    int calls;
    const char *want_deltas; /* with tool-call deltas on, when different */
} tcase;

static const tcase cases[] = {
    {"raw", "hello <think> <tool_call> world", true, true, true, AGENT_TOOLCALL_HERMES,
     "T:hello <think> <tool_call> world", 0, NULL},
    {"plain", "just text\n", false, false, false, AGENT_TOOLCALL_HERMES, "T:just text\n", 0, NULL},
    {"think", "<think>\nplan it\n</think>\n\nThe answer.", false, true, false,
     AGENT_TOOLCALL_HERMES, "R:plan it|T:The answer.", 0, NULL},
    {"think, empty block", "<think>\n\n</think>\n\nok", false, true, false,
     AGENT_TOOLCALL_HERMES, "T:ok", 0, NULL},
    {"think, no newline", "<think>a</think>b", false, true, false, AGENT_TOOLCALL_HERMES,
     "R:a|T:b", 0, NULL},
    {"think off: the markup is text", "<think>\nx\n</think>y", false, false, false,
     AGENT_TOOLCALL_HERMES, "T:<think>\nx\n</think>y", 0, NULL},
    {"think not at the start", "x<think>y</think>", false, true, false, AGENT_TOOLCALL_HERMES,
     "T:x<think>y</think>", 0, NULL},
    {"think cut off", "<think>\nstill thinking", false, true, false, AGENT_TOOLCALL_HERMES,
     "R:still thinking", 0, NULL},
    {"hermes calls", "Sure. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"
     "</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>",
     false, false, true, AGENT_TOOLCALL_HERMES,
     "T:Sure. |C0:f:{\"a\":1}|C1:g:{}", 2, NULL},
    {"think then a call", "<think>\nneed f\n</think>\n\n<tool_call>\n{\"name\": \"f\", "
     "\"arguments\": {\"s\": \"</think>\"}}\n</tool_call>", false, true, true,
     AGENT_TOOLCALL_HERMES, "R:need f|C0:f:{\"s\":\"</think>\"}", 1, NULL},
    {"unknown tool", "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>", false,
     false, true, AGENT_TOOLCALL_HERMES, NULL, 1, NULL},
    {"call cut off", "x <tool_call>\n{\"name\": \"f\", \"argu", false, false, true,
     AGENT_TOOLCALL_HERMES, "T:x <tool_call>\n{\"name\": \"f\", \"argu", 0, NULL},
    {"no tools: markup is text", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", false, false,
     false, AGENT_TOOLCALL_HERMES, "T:<tool_call>\n{\"name\": \"f\"}\n</tool_call>", 0, NULL},
    {"almost a marker", "a <tool_cal b </tool_call> c", false, false, true,
     AGENT_TOOLCALL_HERMES, "T:a <tool_cal b </tool_call> c", 0, NULL},
    {"xml call", "<tool_call>\n<function=f>\n<parameter=a>\n7\n</parameter>\n<parameter=s>\n"
     "hi there\n</parameter>\n</function>\n</tool_call>", false, false, true,
     AGENT_TOOLCALL_XML, "C0:f:{\"a\":7,\"s\":\"hi there\"}", 1, NULL},
    {"utf-8 around markers", "é<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n"
     "</tool_call>ü", false, false, true, AGENT_TOOLCALL_HERMES, "T:é|C0:g:{}|T:ü", 1, NULL},
    /* streamed arguments are rewritten the way the parsed call is dumped (jansson, compact) */
    {"hermes escapes and numbers", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": "
     "\"q\\\"b\\\\c\\/d\\u00e9\\ud83d\\ude00\\n\\t\\u0001\\u007f é\", \"a\": 1.50,\n "
     "\"n\": [1, 2e3, true, null, {\"x\": -0, \"y\": 0.1}], \"e\": {}, \"l\": []}}\n"
     "</tool_call>", false, false, true, AGENT_TOOLCALL_HERMES,
     "C0:f:{\"s\":\"q\\\"b\\\\c/dé😀\\n\\t\\u0001\x7f é\",\"a\":1.5,\"n\":[1,2000.0,"
     "true,null,{\"x\":0,\"y\":0.10000000000000001}],\"e\":{},\"l\":[]}", 1, NULL},
    {"hermes arguments before the name", "<tool_call>{\"arguments\": {\"a\": 2}, "
     "\"name\": \"f\"}</tool_call>", false, false, true, AGENT_TOOLCALL_HERMES,
     "C0:f:{\"a\":2}", 1, NULL},
    {"hermes arguments as a string", "<tool_call>{\"name\": \"f\", \"arguments\": "
     "\"{\\\"a\\\": 3}\"}</tool_call>", false, false, true, AGENT_TOOLCALL_HERMES,
     "C0:f:{\"a\":3}", 1, NULL},
    {"hermes call with a bad body", "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": "
     "[1}}}</tool_call>", false, false, true, AGENT_TOOLCALL_HERMES, "E0::tool call 1: the body*",
     1, "E0:f:tool call 1: the body*"},
    {"hermes call cut off in its arguments", "<tool_call>{\"name\": \"f\", \"arguments\": "
     "{\"s\": \"abc", false, false, true, AGENT_TOOLCALL_HERMES,
     "T:<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"abc", 0,
     "E0:f:the tool call was cut off"},
    {"xml unknown tool", "<tool_call>\n<function=nope>\n<parameter=v>\n[1,2]\n</parameter>\n"
     "</function>\n</tool_call>", false, false, true, AGENT_TOOLCALL_XML, NULL, 1, NULL},
    {"xml strings verbatim, typed values", "<tool_call>\n<function=f>\n<parameter=s>\n"
     "say \"hi\"\\\n\ttwo lines </param\n\n</parameter>\n<parameter=a>\n 42 \n</parameter>\n"
     "<parameter=z>\n[1, {\"k\": 2.0}]\n</parameter>\n</function>\n</tool_call>", false, false,
     true, AGENT_TOOLCALL_XML,
     "C0:f:{\"s\":\"say \\\"hi\\\"\\\\\\n\\ttwo lines </param\\n\",\"a\":42,"
     "\"z\":\"[1, {\\\"k\\\": 2.0}]\"}", 1, NULL},
    {"xml tool without properties: strings", "<tool_call>\n<function=g>\n<parameter=v>\n"
     "[1,2]\n</parameter>\n<parameter=w>\nplain\n</parameter>\n</function>\n</tool_call>",
     false, false, true, AGENT_TOOLCALL_XML, "C0:g:{\"v\":\"[1,2]\",\"w\":\"plain\"}", 1, NULL},
    {"xml no parameters", "<tool_call>\n<function=g>\n</function>\n</tool_call>", false, false,
     true, AGENT_TOOLCALL_XML, "C0:g:{}", 1, NULL},
    {"xml empty and newline-only values", "<tool_call><function=f><parameter=s></parameter>"
     "<parameter=t>\n\n</parameter></function></tool_call>", false, false, true,
     AGENT_TOOLCALL_XML, "C0:f:{\"s\":\"\",\"t\":\"\"}", 1, NULL},
};

static bool matches(const char *got, const char *want) {
    size_t wl = strlen(want);
    if (wl && want[wl - 1] == '*') return !strncmp(got, want, wl - 1);
    return !strcmp(got, want);
}

/* Every cut into two pieces, and byte by byte, gives the whole text's events. */
static void check_cuts(const tcase *c, const char *whole, bool deltas) {
    size_t n = strlen(c->text);
    const char *tools = c->tools ? TOOLS : NULL;
    for (size_t cut = 0; cut <= n; cut++) {
        char *two = split_run_ex(c->text, n, &cut, 1, c->raw, c->think, tools, c->fmt, NULL,
                                 deltas, NULL);
        CHECK(!strcmp(two, whole), "%s%s: cut at %zu: '%s' vs '%s'", c->name,
              deltas ? " (deltas)" : "", cut, two, whole);
        free(two);
    }
    size_t *all = malloc((n + 1) * sizeof *all);
    for (size_t k = 0; k < n; k++) all[k] = k + 1;
    int nd = 0;
    char *bytes = split_run_ex(c->text, n, all, n, c->raw, c->think, tools, c->fmt, NULL, deltas,
                               &nd);
    CHECK(!strcmp(bytes, whole), "%s%s: byte by byte: '%s' vs '%s'", c->name,
          deltas ? " (deltas)" : "", bytes, whole);
    free(bytes);
    free(all);
}

/* ----- random calls: the streamed arguments are always the parsed call's ------------------ */
typedef struct {
    char *p;
    size_t len, cap;
} gbuf;

static void gput(gbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}
static void gputs(gbuf *b, const char *s) {
    gput(b, s, strlen(s));
}

static uint32_t rng_state;
static uint32_t rnd(uint32_t n) {
    rng_state = rng_state * 1103515245u + 12345u;
    return (rng_state >> 8) % n;
}

static void gws(gbuf *b) {
    static const char *ws[] = {"", "", "", " ", "\n", "  ", "\t", "\r\n "};
    gputs(b, ws[rnd(8)]);
}

/* A JSON string with every kind of escape jansson reads. */
static void gstring(gbuf *b) {
    static const char *parts[] = {"a", "Z", " ", "0", "/", "\\/", "\\\"", "\\\\", "\\n", "\\t",
                                  "\\b", "\\f", "\\r", "\\u0001", "\\u001f", "\\u00e9", "é",
                                  "\\u20AC", "€", "\\ud83d\\ude00", "😀", "<", "</tool", "\x7f",
                                  "\\u2028", "}", "]", ",", ":", "{"};
    gputs(b, "\"");
    for (uint32_t i = rnd(8); i > 0; i--) gputs(b, parts[rnd(sizeof parts / sizeof parts[0])]);
    gputs(b, "\"");
}

static void gvalue(gbuf *b, int depth) {
    static const char *lits[] = {"0", "-0", "7", "-12", "1.5", "1.50", "2e3", "-0.25", "1E-2",
                                 "0.1", "123456789", "true", "false", "null", "3.0e+2"};
    uint32_t k = rnd(depth > 1 ? 3 : 5);
    if (k == 0) {
        gstring(b);
    } else if (k <= 2) {
        gputs(b, lits[rnd(sizeof lits / sizeof lits[0])]);
    } else if (k == 3) {
        gputs(b, "[");
        for (uint32_t i = 0, n = rnd(4); i < n; i++) {
            if (i) gputs(b, ",");
            gws(b);
            gvalue(b, depth + 1);
            gws(b);
        }
        gputs(b, "]");
    } else {
        gputs(b, "{");
        for (uint32_t i = 0, n = rnd(4); i < n; i++) {
            char key[16];
            snprintf(key, sizeof key, "%s\"k%u\"", i ? "," : "", i);
            gputs(b, key);
            gws(b);
            gputs(b, ":");
            gws(b);
            gvalue(b, depth + 1);
            gws(b);
        }
        gputs(b, "}");
    }
}

static void gcall(gbuf *b, bool xml) {
    gputs(b, "<tool_call>");
    gws(b);
    if (!xml) {
        gputs(b, "{");
        gws(b);
        gputs(b, "\"name\":");
        gws(b);
        gputs(b, rnd(2) ? "\"f\"" : "\"g\"");
        gws(b);
        gputs(b, ",");
        gws(b);
        gputs(b, "\"arguments\":");
        gws(b);
        gputs(b, "{");
        static const char *keys[] = {"\"a\"", "\"s\"", "\"x\\u00e9\"", "\"q\\\"\"", "\"\""};
        for (uint32_t i = 0, n = rnd(5); i < n; i++) {
            if (i) gputs(b, ",");
            gws(b);
            gputs(b, keys[i]);
            gws(b);
            gputs(b, ":");
            gws(b);
            gvalue(b, 0);
            gws(b);
        }
        gputs(b, "}");
        gws(b);
        gputs(b, "}");
    } else {
        bool f = rnd(2);
        gputs(b, f ? "<function=f>" : "<function=g>");
        static const char *names[] = {"a", "s", "p", "longer_name"};
        static const char *texts[] = {"x", "\n", "\\", "\"", "</param", "<", " 42 ", "[1, 2]",
                                      "{\"k\": 1.0}", "é", "\t", "true", "</parameter", "\r"};
        for (uint32_t i = 0, n = rnd(5); i < n; i++) {
            gws(b);
            gputs(b, "<parameter=");
            gputs(b, names[i]);
            gputs(b, ">");
            if (rnd(2)) gputs(b, "\n");
            for (uint32_t k = rnd(6); k > 0; k--) gputs(b, texts[rnd(sizeof texts / sizeof texts[0])]);
            if (rnd(2)) gputs(b, "\n");
            gputs(b, "</parameter>");
        }
        gws(b);
        gputs(b, "</function>");
    }
    gws(b);
    gputs(b, "</tool_call>");
}

static void random_calls(void) {
    int bad = 0, streamed_calls = 0;
    for (uint32_t iter = 0; iter < 3000 && bad < 5; iter++) {
        rng_state = iter * 2654435761u + 7;
        bool xml = iter & 1;
        gbuf b = {0};
        gputs(&b, rnd(2) ? "text " : "");
        gcall(&b, xml);
        if (rnd(3) == 0) gcall(&b, xml);
        size_t n = b.len, cuts[16], nc = 0;
        for (size_t at = 0; nc < 16;) {
            at += 1 + rnd(12);
            if (at >= n) break;
            cuts[nc++] = at;
        }
        agent_toolcall_format fmt = xml ? AGENT_TOOLCALL_XML : AGENT_TOOLCALL_HERMES;
        char *whole = split_run(b.p, n, NULL, 0, false, false, TOOLS, fmt, NULL);
        int nd = 0;
        char *pieces = split_run_ex(b.p, n, cuts, nc, false, false, TOOLS, fmt, NULL, true, &nd);
        /* every call the parser accepts comes out the same streamed, with no error */
        if (strcmp(whole, pieces) || strstr(pieces, "E0") || strstr(pieces, "E1")) {
            fprintf(stderr, "FAIL random call %u:\n%s\n-> %s\nstreamed -> %s\n", iter, b.p, whole,
                    pieces);
            bad++;
        }
        streamed_calls += nd > 0;
        free(whole);
        free(pieces);
        free(b.p);
    }
    CHECK(!bad && !split_mismatches, "%d random calls differ streamed (%d mismatches)", bad,
          split_mismatches);
    CHECK(streamed_calls > 2500, "only %d of 3000 random calls streamed pieces", streamed_calls);
}

/* The reasoning's end for the token count: whatever the cut of the bytes into tokens, the
 * token that holds the last byte of the first "</think>" is the one the watcher names. */
static void think_watch_cuts(void) {
    const char *texts[] = {"plan\n</think>\n\nHi", "</think>", "a</thin</think>k>",
                           "<</think></think>", "0123456789abcdefghijklmnop</think>qrstuvwxyz",
                           "no end here </think", "x</ think>"};
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        const char *s = texts[t], *at = strstr(s, "</think>");
        size_t n = strlen(s), last = at ? (size_t)(at - s) + 7 : SIZE_MAX;
        /* every cut into up to three tokens */
        for (size_t i = 0; i <= n; i++) {
            for (size_t j = i; j <= n; j++) {
                size_t cut[4] = {0, i, j, n};
                srv_think_watch w = {0};
                int got = -1, want = -1;
                for (int k = 0; k < 3; k++) {
                    if (cut[k + 1] == cut[k]) continue;
                    if (last >= cut[k] && last < cut[k + 1]) want = k;
                    if (got < 0 && srv_think_watch_feed(&w, s + cut[k], cut[k + 1] - cut[k]))
                        got = k;
                }
                CHECK(got == want, "think watch '%s' cut %zu/%zu: token %d, want %d", s, i, j,
                      got, want);
            }
        }
        /* byte by byte */
        srv_think_watch w = {0};
        size_t got = SIZE_MAX;
        for (size_t i = 0; i < n && got == SIZE_MAX; i++)
            if (srv_think_watch_feed(&w, s + i, 1)) got = i;
        CHECK(got == last, "think watch '%s' bytewise: %zu, want %zu", s, got, last);
    }
}

int main(void) {
    think_watch_cuts();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const tcase *c = &cases[i];
        size_t n = strlen(c->text);
        const char *tools = c->tools ? TOOLS : NULL;
        int calls = -1;
        char *whole = split_run(c->text, n, NULL, 0, c->raw, c->think, tools, c->fmt, &calls);
        if (c->want) CHECK(matches(whole, c->want), "%s: got '%s', want '%s'", c->name, whole,
                           c->want);
        else CHECK(!strncmp(whole, "E0:nope:", 8), "%s: got '%s'", c->name, whole);
        CHECK(calls == (c->want ? c->calls : 0) || (!c->want && calls == 1), "%s: %d calls",
              c->name, calls);
        check_cuts(c, whole, false);
        /* with deltas: the pieces plus each call's rest give the same calls */
        char *dw = split_run_ex(c->text, n, NULL, 0, c->raw, c->think, tools, c->fmt, NULL, true,
                                NULL);
        if (c->want_deltas)
            CHECK(matches(dw, c->want_deltas), "%s (deltas): got '%s', want '%s'", c->name, dw,
                  c->want_deltas);
        else if (c->want && c->want[strlen(c->want) - 1] != '*')
            CHECK(!strcmp(dw, whole), "%s (deltas): got '%s', want '%s'", c->name, dw, whole);
        else
            CHECK(!strncmp(dw, "E0:", 3), "%s (deltas): got '%s'", c->name, dw);
        check_cuts(c, dw, true);
        free(dw);
        free(whole);
    }
    /* the arguments come while they are written: fed byte by byte, a call whose arguments
     * hold a long string arrives in many pieces, each before the call's end */
    const char *long_call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": "
                            "\"0123456789abcdefghij0123456789\", \"a\": 12}}\n</tool_call>";
    const char *long_xml = "<tool_call>\n<function=f>\n<parameter=s>\n0123456789abcdefghij"
                           "0123456789\n</parameter>\n</function>\n</tool_call>";
    for (int k = 0; k < 2; k++) {
        const char *t = k ? long_xml : long_call;
        size_t n = strlen(t);
        size_t *all = malloc(n * sizeof *all);
        for (size_t j = 0; j < n; j++) all[j] = j + 1;
        int nd = 0;
        char *d = split_run_ex(t, n, all, n - 1, false, false, TOOLS,
                               k ? AGENT_TOOLCALL_XML : AGENT_TOOLCALL_HERMES, NULL, true, &nd);
        CHECK(nd >= 25, "%s call byte by byte: only %d argument pieces (%s)", k ? "xml" : "hermes",
              nd, d);
        free(d);
        free(all);
    }
    /* a prompt that opened the think block: the text starts as reasoning */
    for (int k = 0; k < 2; k++) {
        const char *t = k ? "plan\n</think>\n\nanswer" : "no end of the thoughts";
        srv_split sp;
        srv_split_init(&sp, false, false, NULL, AGENT_TOOLCALL_HERMES);
        srv_split_think_open(&sp);
        split_desc d = {0};
        d.delta_index = -1;
        desc_add(&d, "", 0);
        srv_event ev;
        if (srv_split_feed(&sp, t, strlen(t))) abort();
        while (srv_split_next(&sp, true, &ev)) desc_event(&d, &ev, strlen(t));
        const char *want = k ? "R:plan|T:answer" : "R:no end of the thoughts";
        CHECK(!strcmp(d.p, want), "think open: got '%s', want '%s'", d.p, want);
        free(d.p);
        srv_split_free(&sp);
    }
    random_calls();
    if (failures) return 1;
    printf("test_split: %zu cases and 3000 random calls ok\n", sizeof cases / sizeof cases[0]);
    return 0;
}
