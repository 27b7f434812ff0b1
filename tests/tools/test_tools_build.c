/* build/test: diagnostics parsing for gcc, clang, rustc, go, tsc and pytest output; build
 * system detection; a real make run with a compile error, through the sandbox. */
#include "tt.h"
#include "tool_int.h"

#include "sandbox.h"

typedef struct {
    const char *file;
    long line, col;
    const char *severity, *message, *tool;
} dwant;

static void check_diag(const char *text, const dwant *w, size_t n) {
    json_t *d = NULL;
    CHECK(tool_diag_parse(text, strlen(text), &d) == 0);
    char *s = json_dumps(d, JSON_COMPACT);
    CHECK_MSG(json_array_size(d) == n, "want %zu diagnostics, got %s", n, s);
    for (size_t i = 0; i < n && i < json_array_size(d); i++) {
        json_t *x = json_array_get(d, i);
        CHECK_MSG(!strcmp(json_string_value(json_object_get(x, "file")), w[i].file) &&
                  json_integer_value(json_object_get(x, "line")) == w[i].line &&
                  json_integer_value(json_object_get(x, "col")) == w[i].col &&
                  !strcmp(json_string_value(json_object_get(x, "severity")), w[i].severity) &&
                  !strcmp(json_string_value(json_object_get(x, "message")), w[i].message) &&
                  !strcmp(json_string_value(json_object_get(x, "tool")), w[i].tool),
                  "item %zu of %s", i, s);
    }
    free(s);
    json_decref(d);
}

static void test_parsers(void) {
    const char *gcc =
        "In file included from main.c:1:\n"
        "src/util.h:3:12: warning: 'x' defined but not used [-Wunused-variable]\n"
        "    3 | static int x;\n"
        "      |            ^\n"
        "main.c: In function 'main':\n"
        "main.c:5:3: error: 'y' undeclared (first use in this function)\n"
        "\x1b[01m\x1b[Kmain.c:6:1:\x1b[m\x1b[K \x1b[01;31m\x1b[Kerror: \x1b[m\x1b[Kexpected ';'\n"
        "main.c:5:3: error: 'y' undeclared (first use in this function)\n"
        "lib.c:9: warning: no column here\n"
        "make: *** [Makefile:2: all] Error 1\n";
    const dwant gw[] = {
        {"src/util.h", 3, 12, "warning", "'x' defined but not used [-Wunused-variable]", "cc"},
        {"main.c", 5, 3, "error", "'y' undeclared (first use in this function)", "cc"},
        {"main.c", 6, 1, "error", "expected ';'", "cc"},
        {"lib.c", 9, 0, "warning", "no column here", "cc"}};
    check_diag(gcc, gw, 4);
    const char *clang = "t.c:2:10: fatal error: 'nope.h' file not found\n#include <nope.h>\n";
    const dwant cw[] = {{"t.c", 2, 10, "error", "'nope.h' file not found", "cc"}};
    check_diag(clang, cw, 1);
    const char *rust =
        "error[E0308]: mismatched types\n"
        " --> src/main.rs:4:18\n"
        "  |\n"
        "4 |     let x: i32 = \"s\";\n"
        "warning: unused variable: `y`\n"
        "  --> src/lib.rs:10:9\n"
        "src/short.rs:1:5: error[E0425]: cannot find value `z` in this scope\n";
    const dwant rw[] = {{"src/main.rs", 4, 18, "error", "mismatched types", "rustc"},
                        {"src/lib.rs", 10, 9, "warning", "unused variable: `y`", "rustc"},
                        {"src/short.rs", 1, 5, "error", "cannot find value `z` in this scope",
                         "rustc"}};
    check_diag(rust, rw, 3);
    const char *go = "# example.com/m\n./main.go:7:2: undefined: fmt.Printx\n"
                     "./main.go:9:6: declared and not used: v\n";
    const dwant ow[] = {{"./main.go", 7, 2, "error", "undefined: fmt.Printx", "go"},
                        {"./main.go", 9, 6, "error", "declared and not used: v", "go"}};
    check_diag(go, ow, 2);
    const char *tsc = "src/a.ts(3,7): error TS2322: Type 'string' is not assignable to type 'number'.\n"
                      "src/b.ts:12:1 - error TS1005: ';' expected.\n";
    const dwant tw[] = {{"src/a.ts", 3, 7, "error",
                         "Type 'string' is not assignable to type 'number'.", "tsc"},
                        {"src/b.ts", 12, 1, "error", "';' expected.", "tsc"}};
    check_diag(tsc, tw, 2);
    const char *py = "tests/test_x.py:14: AssertionError\n"
                     "FAILED tests/test_x.py::test_add - assert 1 == 2\n"
                     "ERROR tests/test_y.py - ImportError: no module named z\n";
    const dwant pw[] = {{"tests/test_x.py", 14, 0, "error", "AssertionError", "pytest"},
                        {"tests/test_x.py", 0, 0, "error", "assert 1 == 2", "pytest"},
                        {"tests/test_y.py", 0, 0, "error", "ImportError: no module named z",
                         "pytest"}};
    check_diag(py, pw, 3);
    check_diag("", NULL, 0);
    check_diag("plain text: nothing to see\n:1: odd\n", NULL, 0);
}

int main(void) {
    test_parsers();
    char *dir = tt_tmpdir();
    tool_ctx *ctx = tt_ctx(dir, false, 0);
    int rc;
    json_t *r = tt_call(ctx, "build", "{}", &rc);
    CHECK(rc == TOOL_EUNSUPPORTED && !strcmp(tt_err_code(r), "unsupported"));
    json_decref(r);
    tt_puts(dir, "pytest.ini", "[pytest]\n");
    r = tt_call(ctx, "build", "{}", &rc);
    CHECK(rc == TOOL_EUNSUPPORTED); /* python: no build step */
    json_decref(r);
    tt_puts(dir, "Makefile", "all:\n\tcc -c bad.c -o bad.o\ntest:\n\t@echo tests ran\n");
    tt_puts(dir, "bad.c", "int main(void) {\n    return undeclared_thing;\n}\n");
    /* is the sandbox able to run anything here? */
    sandbox_caps caps;
    sandbox_caps_probe(&caps);
    r = tt_call(ctx, "build", "{\"timeout_s\":120}", &rc);
    if (rc == TOOL_ESANDBOX) {
        printf("SKIP build run: the sandbox refused to run on this machine: %s (%s)\n",
               tool_error_last(), caps.detail);
        json_decref(r);
        tool_ctx_free(ctx);
        tt_rmtree(dir);
        free(dir);
        int f = tt_done("test_tools_build (parsers only)");
        return f ? f : 77;
    }
    CHECK_MSG(rc == 0, "%s", tool_error_last());
    CHECK(!strcmp(json_string_value(json_object_get(r, "build_system")), "make"));
    CHECK(json_is_false(json_object_get(r, "ok")));
    CHECK(json_integer_value(json_object_get(r, "exit_code")) != 0);
    json_t *d = json_array_get(json_object_get(r, "diagnostics"), 0);
    char *s = json_dumps(r, JSON_COMPACT);
    CHECK_MSG(d && !strcmp(json_string_value(json_object_get(d, "file")), "bad.c") &&
              json_integer_value(json_object_get(d, "line")) == 2 &&
              !strcmp(json_string_value(json_object_get(d, "severity")), "error") &&
              strstr(json_string_value(json_object_get(d, "message")), "undeclared_thing"),
              "%s", s);
    free(s);
    json_decref(r);
    r = tt_call(ctx, "test", "{}", &rc);
    CHECK(rc == 0 && json_is_true(json_object_get(r, "ok")) &&
          strstr(json_string_value(json_object_get(r, "stdout")), "tests ran"));
    json_decref(r);
    r = tt_call(ctx, "build", "{\"command\":[\"sh\",\"-c\",\"sleep 30\"],\"timeout_s\":1}", &rc);
    CHECK(rc == 0 && json_is_false(json_object_get(r, "ok")) &&
          !strcmp(json_string_value(json_object_get(r, "stopped")), "timeout"));
    json_decref(r);
    /* the build cannot rewrite the repository's own metadata (hooks, config) */
    tt_puts(dir, ".git/config", "[core]\n");
    r = tt_call(ctx, "build", "{\"command\":[\"sh\",\"-c\",\"echo evil >> .git/config\"]}", &rc);
    CHECK(rc == 0 && json_is_false(json_object_get(r, "ok")));
    json_decref(r);
    char *cfg = tt_read(dir, ".git/config", NULL);
    CHECK_MSG(cfg && !strcmp(cfg, "[core]\n"), "a build changed .git/config: %s", cfg);
    free(cfg);
    tool_ctx_free(ctx);
    tt_rmtree(dir);
    free(dir);
    return tt_done("test_tools_build");
}
