/* The MCP client against a real stdio server written with the official SDK
 * (tests/agent/mcp_server.mjs, @modelcontextprotocol/sdk): start-up through the sandbox,
 * initialize, tools/list (with pagination), tools/call results and errors, schema checks,
 * environment, a read-only and a writable workspace, timeouts with a late answer, cancel,
 * broken servers; then the agent loop (scripted backend) calling an MCP tool beside a built-in
 * one under the approval policy. Exits 77 when node or the SDK is not installed. */
#include "agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandbox.h"

static int failures;
#define CHECK(c)                                                                               \
    do {                                                                                       \
        if (!(c)) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);              \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

static char ws[64];
static char script[4300], tests_dir[4200];
static char modules_dir[4200]; /* tests/node_modules resolved (it may be a symbolic link) */
static bool unsandboxed;

static int start(agent_mcp **m, const char *name, const char *mode, const char *const *env,
                 bool write, double call_timeout) {
    const char *argv[] = {"node", script, mode, NULL};
    const char *ro[] = {tests_dir, modules_dir, NULL};
    agent_mcp_opts o = AGENT_MCP_OPTS_INIT;
    o.name = name;
    o.argv = argv;
    o.env = env;
    o.workspace = ws;
    o.write = write;
    o.unsandboxed = unsandboxed;
    o.ro_paths = ro;
    o.call_timeout_s = call_timeout;
    int rc = agent_mcp_start(m, &o);
    if (rc) fprintf(stderr, "agent_mcp_start: %s\n", agent_error_last());
    return rc;
}

static int call(agent_mcp *m, const char *tool, const char *args, char **out, bool *is_err) {
    volatile int no = 0;
    return agent_mcp_call(m, tool, args, &no, out, is_err);
}

static void test_server(void) {
    agent_mcp *m = NULL;
    const char *env[] = {"SPARK_MCP_TEST=hello there", "MY_API_TOKEN=secret", NULL};
    CHECK(start(&m, "t", "-", env, false, 1.5) == 0);
    if (!m) return;
    CHECK(!strcmp(agent_mcp_name(m), "t"));
    const char *tj = agent_mcp_tools_json(m);
    CHECK(strstr(tj, "\"name\":\"mcp__t__add\""));
    CHECK(strstr(tj, "\"description\":\"Add two integers.\""));
    CHECK(strstr(tj, "\"required\":[\"a\",\"b\"]"));
    CHECK(strstr(tj, "mcp__t__write"));
    CHECK(!strcmp(agent_mcp_warnings(m), ""));
    CHECK(agent_mcp_has_tool(m, "mcp__t__add"));
    CHECK(!agent_mcp_has_tool(m, "add"));
    CHECK(!agent_mcp_has_tool(m, "mcp__t__nope"));

    char *out = NULL, *err = NULL;
    bool is_err = true;
    CHECK(call(m, "mcp__t__add", "{\"a\":2,\"b\":40}", &out, &is_err) == 0);
    CHECK(out && !strcmp(out, "{\"text\":\"42\"}") && !is_err);
    free(out);
    /* schema checks before anything is sent */
    CHECK(agent_mcp_check_args(m, "mcp__t__add", "{\"a\":2,\"b\":3}", &err) == 0 && !err);
    CHECK(agent_mcp_check_args(m, "mcp__t__add", "{\"a\":2}", &err) != 0);
    CHECK(err && strstr(err, "missing required argument 'b'"));
    free(err);
    CHECK(agent_mcp_check_args(m, "mcp__t__add", "{\"a\":2,\"b\":\"3\"}", &err) != 0);
    CHECK(err && strstr(err, "arguments.b must be of type integer"));
    free(err);
    CHECK(agent_mcp_check_args(m, "mcp__t__add", "{\"a\":1,\"b\":2,\"c\":3}", &err) != 0);
    CHECK(err && strstr(err, "unknown argument 'c'"));
    free(err);
    CHECK(agent_mcp_check_args(m, "mcp__t__concat", "{\"parts\":[\"a\",\"b\"],\"sep\":\"x\"}",
                               &err) != 0);
    CHECK(err && strstr(err, "arguments.sep must be one of"));
    free(err);
    CHECK(agent_mcp_check_args(m, "mcp__t__concat", "{\"parts\":[]}", &err) != 0);
    free(err);
    CHECK(call(m, "mcp__t__concat", "{\"parts\":[\"a\",\"b\",\"c\"],\"sep\":\"-\"}", &out,
               &is_err) == 0);
    CHECK(out && !strcmp(out, "{\"text\":\"a-b-c\"}") && !is_err);
    free(out);
    /* an error result, a JSON-RPC error (unknown tool on the server: call it by a name the
     * server does not know is impossible through the client, so send bad arguments) */
    CHECK(call(m, "mcp__t__fail", "{}", &out, &is_err) == 0);
    CHECK(is_err && out && strstr(out, "\"code\":\"tool_error\"") &&
          strstr(out, "this tool always fails"));
    free(out);
    CHECK(call(m, "mcp__t__nope", "{}", &out, &is_err) == AGENT_EINVAL && !out);
    /* the environment: ours plus opts.env, secrets filtered by the sandbox */
    CHECK(call(m, "mcp__t__env", "{\"name\":\"SPARK_MCP_TEST\"}", &out, &is_err) == 0);
    CHECK(out && !strcmp(out, "{\"text\":\"hello there\"}"));
    free(out);
    CHECK(call(m, "mcp__t__env", "{\"name\":\"MY_API_TOKEN\"}", &out, &is_err) == 0);
    CHECK(out && !strcmp(out, "{\"text\":\"(unset)\"}"));
    free(out);
    /* a read-only workspace */
    if (!unsandboxed) {
        CHECK(call(m, "mcp__t__write", "{\"path\":\"x.txt\",\"text\":\"x\"}", &out, &is_err) ==
              0);
        CHECK(is_err && out && strstr(out, "EROFS"));
        free(out);
        CHECK(access("x.txt", F_OK) != 0);
    }
    /* a timeout: the request is cancelled, the late answer skipped, the server still serves */
    CHECK(call(m, "mcp__t__sleep", "{\"ms\":2500}", &out, &is_err) == AGENT_EMCP);
    CHECK(!out && strstr(agent_error_last(), "did not answer within the time limit"));
    CHECK(call(m, "mcp__t__sleep", "{\"ms\":10}", &out, &is_err) == 0);
    CHECK(out && !strcmp(out, "{\"text\":\"slept 10 ms\"}"));
    free(out);
    /* cancel */
    volatile int cancel = 1;
    CHECK(agent_mcp_call(m, "mcp__t__add", "{\"a\":1,\"b\":1}", &cancel, &out, &is_err) ==
          AGENT_ECANCELED);
    CHECK(call(m, "mcp__t__add", "{\"a\":1,\"b\":1}", &out, &is_err) == 0);
    CHECK(out && !strcmp(out, "{\"text\":\"2\"}"));
    free(out);
    agent_mcp_free(m);

    /* a writable workspace; tools over several pages */
    CHECK(start(&m, "w-2", "many", NULL, true, 0) == 0);
    if (!m) return;
    CHECK(call(m, "mcp__w-2__write", "{\"path\":\"note.txt\",\"text\":\"from mcp\"}", &out,
               &is_err) == 0);
    CHECK(out && !is_err && !strcmp(out, "{\"text\":\"written\"}"));
    free(out);
    char p[128];
    snprintf(p, sizeof p, "%s/note.txt", ws);
    FILE *f = fopen(p, "r");
    char line[32] = "";
    CHECK(f && fgets(line, sizeof line, f) && !strcmp(line, "from mcp"));
    if (f) fclose(f);
    unlink(p);
    for (int i = 0; i < 7; i++) {
        char n[64];
        snprintf(n, sizeof n, "mcp__w-2__extra_%d", i);
        CHECK(agent_mcp_has_tool(m, n));
    }
    agent_mcp_free(m);
}

static void expect_start_error(const char *const *argv, const char *what) {
    agent_mcp_opts o = AGENT_MCP_OPTS_INIT;
    o.name = "bad";
    o.argv = argv;
    o.workspace = ws;
    o.unsandboxed = unsandboxed;
    o.start_timeout_s = 5;
    agent_mcp *m = (agent_mcp *)1;
    int rc = agent_mcp_start(&m, &o);
    CHECK(rc == AGENT_EMCP && m == NULL);
    if (!strstr(agent_error_last(), what)) {
        fprintf(stderr, "expected '%s' in: %s\n", what, agent_error_last());
        failures++;
    }
}

static void test_broken(void) {
    const char *missing[] = {"no-such-mcp-server-xyz", NULL};
    expect_start_error(missing, "exited with status 127");
    expect_start_error(missing, "not found");
    const char *exits[] = {"sh", "-c", "echo dying >&2; exit 3", NULL};
    expect_start_error(exits, "exited with status 3 while answering initialize; its stderr "
                              "ends: dying");
    const char *garbage[] = {"sh", "-c", "echo hello; sleep 5", NULL};
    expect_start_error(garbage, "wrote a line that is not JSON-RPC");
    const char *silent[] = {"sleep", "30", NULL};
    agent_mcp_opts o = AGENT_MCP_OPTS_INIT;
    o.name = "slow";
    o.argv = silent;
    o.workspace = ws;
    o.unsandboxed = unsandboxed;
    o.start_timeout_s = 0.5;
    agent_mcp *m = NULL;
    CHECK(agent_mcp_start(&m, &o) == AGENT_EMCP && !m);
    CHECK(strstr(agent_error_last(), "did not answer within the time limit"));
    /* bad options */
    o.name = "a b";
    CHECK(agent_mcp_start(&m, &o) == AGENT_EINVAL);
    o.name = "ok";
    o.workspace = "relative";
    CHECK(agent_mcp_start(&m, &o) == AGENT_EINVAL);
    o.workspace = ws;
    o.argv = NULL;
    CHECK(agent_mcp_start(&m, &o) == AGENT_EINVAL);
}

/* a Hermes call as the text of a JSON string (args already escaped for that) */
#define CALL(name, args) "<tool_call>\\n{\\\"name\\\": \\\"" name "\\\", \\\"arguments\\\": " args "}\\n</tool_call>"

/* The loop: MCP tools offered beside the built-in ones, validated, approved and executed. */
static void test_loop(void) {
    agent_mcp *m = NULL;
    CHECK(start(&m, "t", "-", NULL, false, 0) == 0);
    if (!m) return;
    const char *replies =
        "[\"" CALL("mcp__t__add", "{\\\"a\\\": 20, \\\"b\\\": 22}") "\","
        "\"" CALL("mcp__t__add", "{\\\"a\\\": 1}") "\","
        "\"" CALL("mcp__t__fail", "{}") "\","
        "\"" CALL("read_file", "{\\\"path\\\": \\\"hello.txt\\\"}") "\","
        "\"The sum is 42.\"]";
    for (int mode = 0; mode < 2; mode++) {
        agent_backend *b = NULL;
        CHECK(agent_backend_scripted_new(&b, replies) == 0);
        tool_options to = TOOL_OPTIONS_INIT;
        to.root = ws;
        to.auto_checkpoint = false;
        tool_ctx *ctx = NULL;
        CHECK(tool_ctx_new(&ctx, &to) == 0);
        agent_policy *pol = NULL;
        /* mode 0: auto-edit asks for MCP tools (a command) and nobody can answer: refused;
         * mode 1: a rule allows the server's tools */
        CHECK(agent_policy_new(&pol, AGENT_APPROVAL_AUTO_EDIT) == 0);
        CHECK(agent_policy_decide(pol, "mcp__t__add") == AGENT_DECIDE_ASK);
        if (mode == 1) CHECK(agent_policy_add_rules_json(pol, "{\"mcp__t__*\": \"allow\"}") == 0);
        agent_loop_opts o = AGENT_LOOP_OPTS_INIT;
        o.tools = ctx;
        o.policy = pol;
        agent_mcp *servers[] = {m};
        o.mcp = servers;
        o.n_mcp = 1;
        agent *a = NULL;
        CHECK(agent_new(&a, b, &o) == 0);
        agent_result res;
        CHECK(agent_run_task(a, "add 20 and 22", &res) == 0);
        CHECK(res.stop == AGENT_STOP_ANSWER && res.answer && !strcmp(res.answer,
                                                                     "The sum is 42."));
        CHECK(res.invalid == 1); /* the call without b: never sent */
        char *msgs = agent_messages_json(a);
        if (mode == 0) {
            CHECK(res.refused == 2 && res.tool_calls == 1 && res.tool_errors == 0);
            CHECK(msgs && strstr(msgs, "mcp__t__add was not run: the approval policy"));
        } else {
            CHECK(res.refused == 0 && res.tool_calls == 3 && res.tool_errors == 1);
            CHECK(msgs && strstr(msgs, "{\\\"text\\\":\\\"42\\\"}"));
            CHECK(msgs && strstr(msgs, "this tool always fails"));
        }
        CHECK(msgs && strstr(msgs, "missing required argument 'b'"));
        CHECK(msgs && strstr(msgs, "hi from the workspace"));
        free(msgs);
        free(res.answer);
        agent_free(a);
        agent_policy_free(pol);
        tool_ctx_free(ctx);
        agent_backend_free(b);
    }
    agent_mcp_free(m);
}

int main(void) {
    const char *src = getenv("SPARK_SOURCE_DIR");
    snprintf(tests_dir, sizeof tests_dir, "%s/tests", src ? src : ".");
    snprintf(script, sizeof script, "%s/agent/mcp_server.mjs", tests_dir);
    char sdk[4400];
    snprintf(sdk, sizeof sdk, "%s/node_modules/@modelcontextprotocol/sdk/package.json", tests_dir);
    char nm[4300];
    snprintf(nm, sizeof nm, "%s/node_modules", tests_dir);
    if (system("node --version > /dev/null 2>&1") != 0 || access(sdk, R_OK) != 0 ||
        !realpath(nm, modules_dir)) {
        printf("skip: node or @modelcontextprotocol/sdk (tests/node_modules) is not installed\n");
        return 77;
    }
    int abi = 0;
    if (sandbox_self_test(&abi, NULL) != 0) {
        printf("note: the sandbox does not work here (%s): servers run unsandboxed\n",
               sandbox_error_last());
        unsandboxed = true;
    }
    snprintf(ws, sizeof ws, "/tmp/test_mcp_XXXXXX");
    if (!mkdtemp(ws) || chdir(ws) != 0) return 1;
    FILE *f = fopen("hello.txt", "w");
    if (!f) return 1;
    fputs("hi from the workspace\n", f);
    fclose(f);
    test_server();
    test_broken();
    test_loop();
    unlink("hello.txt");
    if (chdir("/") != 0 || rmdir(ws) != 0) {
        fprintf(stderr, "the workspace %s is not empty\n", ws);
        failures++;
    }
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    else printf("test_mcp: ok\n");
    return failures ? 1 : 0;
}
