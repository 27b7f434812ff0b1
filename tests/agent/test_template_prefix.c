/* Prefix stability of the real templates, which the agent's token-level session relies on:
 * is render(messages[0..N]) a byte prefix of render(messages[0..N+1])? For each step of one
 * agent conversation this test computes where the two renders diverge and asserts the exact
 * places documented in agent.h:
 *   - Qwen3 and Qwen3.5, appending a user message after assistant turns: the turns after the
 *     previous query lose their <think> block (an empty one when they had no reasoning); the
 *     renders diverge right after the "<|im_start|>assistant\n" of the first of them.
 *   - both templates, appending a second consecutive tool result: the first result's
 *     "<|im_end|>\n" (written while it was last) is replaced by the next "<tool_response>".
 *   - every other append (assistant after user, tool after assistant, assistant after tool,
 *     and with Qwen3-Coder also user after assistant) keeps the prefix, also from a render with
 *     the generation prompt to the render that contains the generated assistant turn. */
#include "agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const MSGS[] = {
    "{\"role\":\"system\",\"content\":\"You are a coding agent.\"}",
    "{\"role\":\"user\",\"content\":\"Fix the build.\"}",
    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"Look at both files.\","
    "\"tool_calls\":[{\"function\":{\"name\":\"read_file\",\"arguments\":{\"path\":\"a.c\"}}},"
    "{\"function\":{\"name\":\"read_file\",\"arguments\":{\"path\":\"b.c\"}}}]}",
    "{\"role\":\"tool\",\"content\":\"int a;\"}",
    "{\"role\":\"tool\",\"content\":\"int b;\"}",
    "{\"role\":\"assistant\",\"content\":\"Both compile now.\",\"reasoning_content\":\"ok\"}",
    "{\"role\":\"user\",\"content\":\"Thanks!\"}",
    "{\"role\":\"assistant\",\"content\":\"You're welcome.\"}", /* no reasoning at all */
    "{\"role\":\"user\",\"content\":\"Bye.\"}",
};
#define N_MSGS (sizeof MSGS / sizeof MSGS[0])

static const char *TOOLS = "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\","
                           "\"description\":\"Read a file\",\"parameters\":{\"type\":\"object\","
                           "\"properties\":{\"path\":{\"type\":\"string\"}},"
                           "\"required\":[\"path\"]}}}]";

static int failures;

static char *render(agent_template *t, size_t n, bool agp) {
    char json[8192];
    size_t o = 0;
    json[o++] = '[';
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(json + o, sizeof json - o, "%s%s", i ? "," : "", MSGS[i]);
    snprintf(json + o, sizeof json - o, "]");
    agent_template_opts opts = AGENT_TEMPLATE_OPTS_INIT;
    opts.add_generation_prompt = agp;
    char *out = NULL;
    if (agent_template_render(t, json, TOOLS, &opts, &out, NULL)) return NULL;
    return out;
}

static size_t common_prefix(const char *a, const char *b) {
    size_t i = 0;
    while (a[i] && a[i] == b[i]) i++;
    return i;
}

/* Offset just after the "<|im_start|>assistant\n" of the first assistant message that comes
 * after `after` (an offset). */
static size_t after_assistant_header(const char *s, size_t after) {
    const char *h = strstr(s + after, "<|im_start|>assistant\n");
    return h ? (size_t)(h - s) + strlen("<|im_start|>assistant\n") : (size_t)-1;
}

static size_t last_im_end(const char *s) {
    const char *p = NULL, *q = s;
    while ((q = strstr(q, "<|im_end|>\n"))) p = q++;
    return p ? (size_t)(p - s) : (size_t)-1;
}

static void check(const char *tname, agent_template *t, bool thinking_template) {
    printf("%s:\n", tname);
    for (size_t n = 1; n < N_MSGS; n++) {
        char *a = render(t, n, false), *b = render(t, n + 1, false);
        if (!b) {
            fprintf(stderr, "FAIL %s: %zu messages do not render: %s\n", tname, n + 1,
                    agent_error_last());
            failures++;
            free(a);
            continue;
        }
        if (!a) {
            /* Qwen3.5 refuses a conversation without a user query */
            printf("  %zu messages: refused by the template (%s)\n", n, agent_error_last());
            free(b);
            continue;
        }
        size_t la = strlen(a), cp = common_prefix(a, b);
        bool prefix = cp == la;
        const char *added = strstr(MSGS[n], "\"role\":\"") + 8;
        size_t want = la; /* expected divergence offset; la = a is a prefix */
        const char *why = "prefix kept";
        if (!strncmp(added, "tool", 4) && strstr(MSGS[n - 1], "\"role\":\"tool\"")) {
            want = last_im_end(a);
            why = "consecutive tool result: the previous <|im_end|> goes";
        } else if (thinking_template && !strncmp(added, "user", 4) && n >= 3) {
            /* the previous last query is the last user message before n */
            size_t prev_user = 0;
            for (size_t k = 0; k < n; k++)
                if (strstr(MSGS[k], "\"role\":\"user\"")) prev_user = k;
            /* find the rendered previous query, then the next assistant header */
            char needle[256];
            const char *c0 = strstr(MSGS[prev_user], "\"content\":\"") + 11;
            size_t cl = (size_t)(strchr(c0, '"') - c0);
            snprintf(needle, sizeof needle, "<|im_start|>user\n%.*s", (int)cl, c0);
            const char *u = strstr(a, needle);
            want = u ? after_assistant_header(a, (size_t)(u - a)) : (size_t)-1;
            why = "new query: earlier <think> blocks are dropped";
        }
        printf("  %zu -> %zu messages (+%.*s): %s at byte %zu of %zu (%s)\n", n, n + 1,
               (int)(strchr(added, '"') - added), added, prefix ? "prefix" : "DIVERGES", cp, la,
               why);
        /* The renders may share a byte or two of the differing tokens ("<" of "<think>" and
         * "<tool_call>"), so the divergence lies within the dropped token, which starts at
         * `want` in the shorter render. */
        const char *token = !strncmp(why, "new", 3) ? "<think>" : "<|im_end|>";
        bool ok = prefix ? cp == want
                         : (want != (size_t)-1 && cp >= want && cp < want + strlen(token) &&
                            !strncmp(a + want, token, strlen(token)) &&
                            strncmp(b + want, token, strlen(token)));
        if (!ok) {
            fprintf(stderr, "FAIL %s %zu->%zu: diverges at %zu, expected the %s at %zu\n",
                    tname, n, n + 1, cp, prefix ? "end" : token, want);
            failures++;
        }
        /* generation prompt then the generated assistant turn */
        if (!strncmp(added, "assistant", 9)) {
            char *g = render(t, n, true);
            if (!g || strncmp(b, g, strlen(g))) {
                fprintf(stderr, "FAIL %s: prompt with generation prompt (%zu) is not a prefix\n",
                        tname, n);
                failures++;
            }
            free(g);
        }
        free(a);
        free(b);
    }
}

static agent_template *load(const char *name) {
    const char *src = getenv("SPARK_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/templates/%s", src ? src : ".", name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(1);
    }
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    agent_template *t;
    if (agent_template_new(&t, buf)) {
        fprintf(stderr, "%s: %s\n", name, agent_error_last());
        exit(1);
    }
    return t;
}

int main(void) {
    agent_template *q = load("qwen3.jinja"), *c = load("qwen3_coder.jinja"),
                   *q35 = load("qwen35.jinja");
    check("qwen3", q, true);
    check("qwen3_coder", c, false);
    check("qwen35", q35, true);
    agent_template_free(q);
    agent_template_free(c);
    agent_template_free(q35);
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
