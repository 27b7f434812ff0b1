/* search: regex, literal, case, word, globs, ignore files, binary files, context, caps,
 * pathological patterns; and a run over this project's own tree. */
#include "tt.h"

#include <time.h>

static json_t *search(tool_ctx *ctx, const char *args, int *rc) {
    return tt_call(ctx, "search", args, rc);
}

static long count(json_t *r) {
    return (long)json_integer_value(json_object_get(r, "match_count"));
}

static json_t *match(json_t *r, size_t i) {
    return json_array_get(json_object_get(r, "matches"), i);
}

int main(void) {
    char *dir = tt_tmpdir();
    tt_puts(dir, "a.c", "int foo(void);\nint foobar = 1;\n/* FOO */\nreturn foo();\n");
    tt_puts(dir, "b.h", "#define FOO 1\nfoo\n");
    tt_puts(dir, "sub/c.py", "def foo():\n    pass\n\n\nx = foo()\n");
    tt_puts(dir, "crlf.txt", "alpha\r\nfoo\r\nbeta\r\n");
    tt_write(dir, "bin.o", "foo\0\x01\x02", 6);
    tt_puts(dir, ".gitignore", "ignored/\n");
    tt_puts(dir, "ignored/x.c", "foo\n");
    tt_puts(dir, ".hid/h.c", "foo\n");
    tt_puts(dir, "multi.txt", "start\nend\nstart end\n");
    tt_puts(dir, "utf8.txt", "caf\xc3\xa9 foo\n\xff\xfe bad bytes foo\n");
    tool_ctx *ctx = tt_ctx(dir, false, 0);
    int rc;

    json_t *r = search(ctx, "{\"pattern\":\"foo\"}", &rc);
    CHECK(rc == 0);
    /* a.c: 3 lines (foo, foobar, foo()), b.h: 1, sub/c.py: 2, crlf: 1, utf8: 2 */
    CHECK_MSG(count(r) == 9, "%ld", count(r));
    CHECK(json_integer_value(json_object_get(r, "binary_files_skipped")) == 1);
    json_t *m0 = match(r, 0);
    CHECK(!strcmp(json_string_value(json_object_get(m0, "path")), "a.c"));
    CHECK(json_integer_value(json_object_get(m0, "line")) == 1);
    CHECK(!strcmp(json_string_value(json_object_get(m0, "text")), "int foo(void);"));
    char *s = json_dumps(r, 0);
    CHECK(!strstr(s, "ignored/x.c") && !strstr(s, ".hid/") && !strstr(s, "bin.o"));
    CHECK(strstr(s, "\"text\": \"foo\"") || strstr(s, "\"text\":\"foo\"")); /* CR dropped */
    CHECK(strstr(s, "\xEF\xBF\xBD\xEF\xBF\xBD bad bytes foo") != NULL); /* invalid UTF-8 shown, not lost */
    free(s);
    json_decref(r);

    r = search(ctx, "{\"pattern\":\"foo\",\"literal\":true,\"hidden\":true,\"no_ignore\":true}", &rc);
    CHECK_MSG(count(r) == 11, "%ld", count(r));
    json_decref(r);
    r = search(ctx, "{\"pattern\":\"foo\",\"case_insensitive\":true}", &rc);
    CHECK_MSG(count(r) == 11, "%ld", count(r)); /* + FOO in a.c and b.h */
    json_decref(r);
    r = search(ctx, "{\"pattern\":\"foo\",\"word\":true,\"include\":[\"*.c\"]}", &rc);
    CHECK_MSG(count(r) == 2, "%ld", count(r)); /* not foobar */
    json_decref(r);
    r = search(ctx, "{\"pattern\":\"foo\",\"literal\":true,\"word\":true,\"case_insensitive\":true,"
                    "\"include\":[\"*.c\",\"*.h\"]}", &rc);
    CHECK_MSG(count(r) == 5, "%ld", count(r));
    json_decref(r);
    r = search(ctx, "{\"pattern\":\"foo\",\"exclude\":[\"sub\",\"*.txt\"]}", &rc);
    CHECK_MSG(count(r) == 4, "%ld", count(r));
    json_decref(r);
    r = search(ctx, "{\"pattern\":\"^def \\\\w+\\\\(\\\\)\",\"path\":\"sub\"}", &rc);
    CHECK_MSG(rc == 0 && count(r) == 1, "%d %ld", rc, count(r));
    json_decref(r);
    /* a pattern that could only match across lines matches nothing; $ is per line */
    r = search(ctx, "{\"pattern\":\"start\\\\send\"}", &rc);
    CHECK_MSG(count(r) == 1, "%ld", count(r));
    CHECK(json_integer_value(json_object_get(match(r, 0), "line")) == 3);
    json_decref(r);
    r = search(ctx, "{\"pattern\":\"^end$\"}", &rc);
    CHECK_MSG(count(r) == 1, "%ld", count(r));
    json_decref(r);
    /* patterns whose required literal prefilters the lines */
    tt_puts(dir, "pf.txt", "color\ncolour\ncolr\nfood\nfod\na.bbbc\naxbc\nmutex_lock(\n"
                           "MUTEX_LOCK(\nx_alloc(\n_alloc(\nfoo\\bar\n");
    static const struct { const char *args; long n; } pf[] = {
        {"{\"pattern\":\"colou?r\",\"path\":\"pf.txt\"}", 2},
        {"{\"pattern\":\"fo{2}d\",\"path\":\"pf.txt\"}", 1},
        {"{\"pattern\":\"a\\\\.b+c\",\"path\":\"pf.txt\"}", 1},
        {"{\"pattern\":\"\\\\w+_alloc\\\\(\",\"path\":\"pf.txt\"}", 1},
        {"{\"pattern\":\"mutex_lock\\\\(\",\"case_insensitive\":true,\"path\":\"pf.txt\"}", 2},
        {"{\"pattern\":\"(colo)+ur|food\",\"path\":\"pf.txt\"}", 2},
        {"{\"pattern\":\"foo\\\\\\\\bar\",\"path\":\"pf.txt\"}", 1},
        {"{\"pattern\":\"_alloc(\",\"literal\":true,\"word\":true,\"path\":\"pf.txt\"}", 1},
    };
    for (size_t i = 0; i < sizeof pf / sizeof pf[0]; i++) {
        r = search(ctx, pf[i].args, &rc);
        CHECK_MSG(rc == 0 && count(r) == pf[i].n, "%s: rc %d, %ld matches, want %ld", pf[i].args,
                  rc, count(r), pf[i].n);
        json_decref(r);
    }
    /* a single file, even an ignored one, is searched when named */
    r = search(ctx, "{\"pattern\":\"foo\",\"path\":\"ignored/x.c\"}", &rc);
    CHECK(rc == 0 && count(r) == 1);
    json_decref(r);
    /* context lines */
    r = search(ctx, "{\"pattern\":\"x = foo\",\"context\":2}", &rc);
    json_t *m = match(r, 0);
    CHECK(json_integer_value(json_object_get(m, "line")) == 5);
    CHECK(json_array_size(json_object_get(m, "before")) == 2);
    CHECK(json_array_size(json_object_get(m, "after")) == 0);
    CHECK(!strcmp(json_string_value(json_array_get(json_object_get(m, "before"), 0)), ""));
    json_decref(r);
    /* caps */
    r = search(ctx, "{\"pattern\":\"o\",\"max_results\":3}", &rc);
    CHECK(count(r) == 3 && json_is_true(json_object_get(r, "truncated")));
    json_decref(r);
    /* errors */
    r = search(ctx, "{\"pattern\":\"(unclosed\"}", &rc);
    CHECK(rc == TOOL_EINVAL && strstr(json_string_value(json_object_get(json_object_get(r,
                                      "error"), "message")), "regular expression"));
    json_decref(r);
    r = search(ctx, "{\"pattern\":\"x\",\"path\":\"../\"}", &rc);
    CHECK(rc == TOOL_EPATH);
    json_decref(r);
    /* pathological backtracking ends, bounded, and says so */
    {
        char *line = malloc(40000);
        memset(line, 'a', 39998);
        line[39998] = '!';
        line[39999] = '\n';
        tt_write(dir, "patho.txt", line, 40000);
        free(line);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        r = search(ctx, "{\"pattern\":\"(a|aa)+$\",\"path\":\"patho.txt\"}", &rc);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        CHECK_MSG(rc == 0 && secs < 20, "rc %d, %.1f s", rc, secs);
        CHECK(count(r) == 0);
        CHECK(json_array_size(json_object_get(r, "match_limit_files")) == 1);
        json_decref(r);
    }
    tool_ctx_free(ctx);
    tt_rmtree(dir);
    free(dir);

    /* this project's tree: a known definition is found, build folders are ignored */
    const char *src = getenv("SPARK_SOURCE_DIR");
    if (src) {
        tool_ctx *p = tt_ctx(src, false, 0);
        r = search(p, "{\"pattern\":\"^int tool_call\\\\(\",\"include\":[\"*.c\"]}", &rc);
        CHECK_MSG(rc == 0 && count(r) == 1, "%d %ld", rc, count(r));
        CHECK(!strcmp(json_string_value(json_object_get(match(r, 0), "path")),
                      "tools/registry.c"));
        json_decref(r);
        tool_ctx_free(p);
    }
    return tt_done("test_tools_search");
}
