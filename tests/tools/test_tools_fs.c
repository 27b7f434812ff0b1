/* Registry (schemas, argument checks, bounded results), read_file, list_dir, find_files, globs
 * and ignore rules. */
#include "tt.h"
#include "tool_int.h"

static const char *const ALLOWED[] = {"type", "properties", "required", "additionalProperties",
                                      "enum", "items", "minimum", "maximum", "minLength",
                                      "maxLength", "description", NULL};

static void check_keywords(json_t *schema, const char *tool) {
    const char *k;
    json_t *v;
    json_object_foreach(schema, k, v) {
        bool ok = false;
        for (int i = 0; ALLOWED[i]; i++) ok = ok || !strcmp(k, ALLOWED[i]);
        CHECK_MSG(ok, "%s uses keyword '%s'", tool, k);
        if (!strcmp(k, "properties")) {
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) check_keywords(pv, tool);
        } else if (!strcmp(k, "items")) {
            check_keywords(v, tool);
        }
    }
}

static void test_registry(void) {
    CHECK(tool_count() >= 19);
    char *s = NULL;
    CHECK(tool_schemas_json(&s, TOOL_FORMAT_OPENAI) == 0);
    json_t *all = json_loads(s, 0, NULL);
    free(s);
    CHECK(json_array_size(all) == tool_count());
    size_t i;
    json_t *t;
    json_array_foreach(all, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        CHECK(!strcmp(json_string_value(json_object_get(t, "type")), "function"));
        CHECK(name && !strcmp(name, tool_name(i)));
        CHECK(json_string_length(json_object_get(fn, "description")) > 20);
        json_t *p = json_object_get(fn, "parameters");
        CHECK(!strcmp(json_string_value(json_object_get(p, "type")), "object"));
        CHECK(json_is_false(json_object_get(p, "additionalProperties")));
        check_keywords(p, name);
    }
    json_decref(all);
    CHECK(tool_schemas_json(&s, TOOL_FORMAT_GRAMMAR) == 0);
    all = json_loads(s, 0, NULL);
    free(s);
    CHECK(json_is_object(json_object_get(json_array_get(all, 0), "schema")));
    json_decref(all);
    CHECK(tool_schema_json(&s, "nope") == TOOL_ENOTFOUND);
    CHECK(tool_is_mutating("edit_file") && !tool_is_mutating("read_file"));
}

static void test_args(tool_ctx *ctx) {
    int rc;
    json_t *r = tt_call(ctx, "read_file", "{\"path\":\"a.txt\",\"bogus\":1}", &rc);
    CHECK(rc == TOOL_EINVAL && strstr(json_string_value(json_object_get(json_object_get(r, "error"),
                                                                        "message")), "bogus"));
    json_decref(r);
    r = tt_call(ctx, "read_file", "{}", &rc);
    CHECK(rc == TOOL_EINVAL);
    json_decref(r);
    r = tt_call(ctx, "read_file", "{\"path\":7}", &rc);
    CHECK(rc == TOOL_EINVAL);
    json_decref(r);
    r = tt_call(ctx, "read_file", "{\"path\":\"a.txt\",\"start_line\":0}", &rc);
    CHECK(rc == TOOL_EINVAL);
    json_decref(r);
    r = tt_call(ctx, "git_diff", "{\"mode\":\"sideways\"}", &rc);
    CHECK(rc == TOOL_EINVAL);
    json_decref(r);
    r = tt_call(ctx, "read_file", "{\"path\":", &rc);
    CHECK(rc == TOOL_EINVAL && !strcmp(tt_err_code(r), "invalid_arguments"));
    json_decref(r);
    r = tt_call(ctx, "no_such_tool", "{}", &rc);
    CHECK(rc == TOOL_ENOTFOUND);
    json_decref(r);
}

static void test_bound(void) {
    char *big = malloc(100001);
    for (int i = 0; i < 100000; i++) big[i] = (i % 50 == 49) ? '\n' : (char)('a' + i % 26);
    big[100000] = '\0';
    char *o = NULL;
    CHECK(tool_bound_text(&o, big, 100000, 1000) == 0);
    CHECK(strlen(o) <= 1000 && strlen(o) > 800);
    CHECK(strstr(o, "bytes (") && strstr(o, "lines) cut"));
    CHECK(!strncmp(o, big, 100)); /* head kept */
    CHECK(!strcmp(o + strlen(o) - 50, big + 100000 - 50)); /* tail kept */
    free(o);
    CHECK(tool_bound_text(&o, "short", 5, 1000) == 0 && !strcmp(o, "short"));
    free(o);
    free(big);
}

int main(void) {
    test_registry();
    test_bound();
    char *dir = tt_tmpdir();
    tt_puts(dir, "a.txt", "one\ntwo\nthree\nfour\nfive\n");
    tt_puts(dir, "noeol.txt", "x\ny");
    tt_write(dir, "bin.dat", "ab\0cd", 5);
    tt_puts(dir, ".gitignore", "build/\n*.log\n!keep.log\n/rootonly.txt\n");
    tt_puts(dir, "build/out.txt", "ignored\n");
    tt_puts(dir, "x.log", "ignored\n");
    tt_puts(dir, "keep.log", "kept\n");
    tt_puts(dir, "rootonly.txt", "ignored\n");
    tt_puts(dir, "src/rootonly.txt", "not ignored\n");
    tt_puts(dir, "src/main.c", "int main(void) { return 0; }\n");
    tt_puts(dir, "src/util/u.c", "int u;\n");
    tt_puts(dir, "src/util/u.h", "extern int u;\n");
    tt_puts(dir, "src/.ignore", "util/u.h\n");
    tt_puts(dir, ".hidden/h.c", "int h;\n");
    tool_ctx *ctx = tt_ctx(dir, false, 0);
    test_args(ctx);
    int rc;
    /* read_file */
    json_t *r = tt_call(ctx, "read_file", "{\"path\":\"a.txt\",\"start_line\":2,\"end_line\":3}", &rc);
    CHECK(rc == 0);
    CHECK(!strcmp(json_string_value(json_object_get(r, "content")), "     2\ttwo\n     3\tthree\n"));
    CHECK(json_integer_value(json_object_get(r, "total_lines")) == 5);
    json_decref(r);
    r = tt_call(ctx, "read_file", "{\"path\":\"noeol.txt\",\"line_numbers\":false}", &rc);
    CHECK(rc == 0 && !strcmp(json_string_value(json_object_get(r, "content")), "x\ny"));
    CHECK(json_integer_value(json_object_get(r, "total_lines")) == 2);
    json_decref(r);
    r = tt_call(ctx, "read_file", "{\"path\":\"a.txt\",\"start_line\":9}", &rc);
    CHECK(rc == TOOL_EINVAL);
    json_decref(r);
    r = tt_call(ctx, "read_file", "{\"path\":\"bin.dat\"}", &rc);
    CHECK(rc == TOOL_EBINARY && !strcmp(tt_err_code(r), "binary"));
    json_decref(r);
    r = tt_call(ctx, "read_file", "{\"path\":\"src\"}", &rc);
    CHECK(rc == TOOL_EINVAL);
    json_decref(r);
    r = tt_call(ctx, "read_file", "{\"path\":\"missing.txt\"}", &rc);
    CHECK(rc == TOOL_ENOTFOUND);
    json_decref(r);
    {   /* size cap */
        tool_options o = TOOL_OPTIONS_INIT;
        o.root = dir;
        o.max_file_bytes = 10;
        tool_ctx *small;
        CHECK(tool_ctx_new(&small, &o) == 0);
        r = tt_call(small, "read_file", "{\"path\":\"a.txt\"}", &rc);
        CHECK(rc == TOOL_ETOOLARGE);
        json_decref(r);
        tool_ctx_free(small);
    }
    {   /* bounded results: a long file through a 2 KiB cap keeps head and tail */
        char *big = malloc(200000);
        size_t o = 0;
        for (int i = 1; i <= 5000; i++) o += (size_t)sprintf(big + o, "line %d\n", i);
        tt_write(dir, "big.txt", big, o);
        free(big);
        tool_ctx *small = tt_ctx(dir, false, 2048);
        char *out = NULL;
        CHECK(tool_call(small, "read_file", "{\"path\":\"big.txt\"}", &out) == 0);
        CHECK(strlen(out) <= 2048 + 256);
        json_t *j = json_loads(out, 0, NULL);
        const char *c = json_string_value(json_object_get(j, "content"));
        CHECK(c && strstr(c, "line 1\n") && strstr(c, "line 5000\n") && strstr(c, "cut ..."));
        json_decref(j);
        free(out);
        tool_ctx_free(small);
    }
    /* list_dir honours .gitignore, .ignore, hidden, depth */
    r = tt_call(ctx, "list_dir", "{\"depth\":3}", &rc);
    CHECK(rc == 0);
    char *s = json_dumps(json_object_get(r, "entries"), JSON_COMPACT);
    CHECK_MSG(!strcmp(s, "[\"a.txt\",\"big.txt\",\"bin.dat\",\"keep.log\",\"noeol.txt\",\"src/\","
                         "\"src/main.c\",\"src/rootonly.txt\",\"src/util/\",\"src/util/u.c\"]"),
              "%s", s);
    free(s);
    json_decref(r);
    r = tt_call(ctx, "list_dir", "{\"depth\":1,\"hidden\":true,\"no_ignore\":true}", &rc);
    s = json_dumps(json_object_get(r, "entries"), JSON_COMPACT);
    CHECK_MSG(strstr(s, "\".gitignore\"") && strstr(s, "\"build/\"") && strstr(s, "\"x.log\"") &&
              strstr(s, "\".hidden/\"") && !strstr(s, "src/main.c"), "%s", s);
    free(s);
    json_decref(r);
    /* find_files */
    r = tt_call(ctx, "find_files", "{\"glob\":\"*.c\"}", &rc);
    s = json_dumps(json_object_get(r, "files"), JSON_COMPACT);
    CHECK_MSG(!strcmp(s, "[\"src/main.c\",\"src/util/u.c\"]"), "%s", s);
    free(s);
    json_decref(r);
    r = tt_call(ctx, "find_files", "{\"glob\":\"src/*.c\"}", &rc);
    s = json_dumps(json_object_get(r, "files"), JSON_COMPACT);
    CHECK_MSG(!strcmp(s, "[\"src/main.c\"]"), "%s", s);
    free(s);
    json_decref(r);
    r = tt_call(ctx, "find_files", "{\"glob\":\"**/u.?\",\"no_ignore\":true}", &rc);
    s = json_dumps(json_object_get(r, "files"), JSON_COMPACT);
    CHECK_MSG(!strcmp(s, "[\"src/util/u.c\",\"src/util/u.h\"]"), "%s", s);
    free(s);
    json_decref(r);
    r = tt_call(ctx, "find_files", "{\"glob\":\"*\",\"max_results\":2}", &rc);
    CHECK(json_array_size(json_object_get(r, "files")) == 2 &&
          json_is_true(json_object_get(r, "truncated")));
    json_decref(r);
    /* globs */
    CHECK(tool_glob_match("*.c", "a/b/x.c"));
    CHECK(!tool_glob_match("*.c", "a/b/x.h"));
    CHECK(tool_glob_match("a/**/x.c", "a/x.c"));
    CHECK(tool_glob_match("a/**/x.c", "a/b/c/x.c"));
    CHECK(!tool_glob_match("a/*/x.c", "a/b/c/x.c"));
    CHECK(tool_glob_match("**", "any/thing"));
    CHECK(tool_glob_match("[a-c]?.txt", "b1.txt"));
    CHECK(!tool_glob_match("[!a-c]?.txt", "b1.txt"));
    CHECK(tool_glob_match("/top.c", "top.c") && !tool_glob_match("/top.c", "d/top.c"));
    CHECK(!tool_glob_match("*a*a*a*a*a*a*a*a*a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
    tool_ctx_free(ctx);
    tt_rmtree(dir);
    free(dir);
    return tt_done("test_tools_fs");
}
