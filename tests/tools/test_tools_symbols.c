/* Outlines of fixture files in every supported language, and the repo map (on fixtures and on
 * this project's own tools/ directory). */
#include "tt.h"

typedef struct {
    const char *name, *kind;
    int line;
    const char *parent; /* NULL: top level (not checked when "*") */
} want;

static int check_outline(tool_ctx *ctx, const char *file, const char *lang, const want *w) {
    char args[512];
    snprintf(args, sizeof args, "{\"path\":\"%s\"}", file);
    int rc;
    json_t *r = tt_call(ctx, "outline", args, &rc);
    CHECK_MSG(rc == 0, "%s: %s", file, tool_error_last());
    if (rc != 0) {
        json_decref(r);
        return 1;
    }
    CHECK(!strcmp(json_string_value(json_object_get(r, "language")), lang));
    json_t *syms = json_object_get(r, "symbols");
    int missing = 0;
    for (; w->name; w++) {
        bool found = false;
        size_t i;
        json_t *s;
        json_array_foreach(syms, i, s) {
            const char *pn = json_string_value(json_object_get(s, "parent"));
            if (strcmp(json_string_value(json_object_get(s, "name")), w->name) ||
                strcmp(json_string_value(json_object_get(s, "kind")), w->kind) ||
                json_integer_value(json_object_get(s, "start_line")) != w->line)
                continue;
            if (w->parent && strcmp(w->parent, "*") && (!pn || strcmp(pn, w->parent))) continue;
            if (!w->parent && pn) continue;
            CHECK(json_integer_value(json_object_get(s, "end_line")) >= w->line);
            found = true;
        }
        if (!found) {
            char *d = json_dumps(syms, JSON_COMPACT);
            CHECK_MSG(found, "%s: no %s '%s' at line %d (parent %s) in %s", file, w->kind, w->name,
                      w->line, w->parent ? w->parent : "-", d);
            free(d);
            missing++;
        }
    }
    json_decref(r);
    return missing;
}

int main(void) {
    const char *src = getenv("SPARK_SOURCE_DIR");
    if (!src) {
        fprintf(stderr, "SPARK_SOURCE_DIR is not set (run through ctest)\n");
        return 1;
    }
    char fx[4096];
    snprintf(fx, sizeof fx, "%s/tests/fixtures/tools/outline", src);
    tool_ctx *ctx = tt_ctx(fx, false, 0);
    static const want c[] = {{"MAX_ITEMS", "macro", 3, NULL}, {"SQUARE", "macro", 4, NULL},
                             {"point", "struct", 6, NULL}, {"point", "type", 6, NULL},
                             {"color", "enum", 10, NULL}, {"point_dist", "prototype", 12, NULL},
                             {"split_words", "function", 14, NULL},
                             {"point_dist", "function", 19, NULL}, {NULL, NULL, 0, NULL}};
    static const want cpp[] = {{"geo", "namespace", 3, NULL}, {"Shape", "class", 5, "geo"},
                               {"id", "method", 9, "Shape"}, {"area", "method", 8, "Shape"},
                               {"Circle", "struct", 14, "geo"}, {"Circle::area", "function", 19, "geo"},
                               {"Name", "type", 23, "geo"}, {"main", "function", 27, NULL},
                               {NULL, NULL, 0, NULL}};
    static const want py[] = {{"Repo", "class", 4, NULL}, {"__init__", "method", 7, "Repo"},
                              {"files", "method", 10, "Repo"}, {"walk", "function", 14, NULL},
                              {"decorated", "function", 20, NULL}, {NULL, NULL, 0, NULL}};
    static const want js[] = {{"readConfig", "function", 3, NULL}, {"Server", "class", 7, NULL},
                              {"constructor", "method", 8, "Server"},
                              {"start", "method", 12, "Server"}, {"handler", "function", 17, NULL},
                              {"ids", "function", 19, NULL}, {NULL, NULL, 0, NULL}};
    static const want ts[] = {{"Options", "interface", 1, NULL}, {"Id", "type", 5, NULL},
                              {"Mode", "enum", 7, NULL}, {"Runner", "class", 12, NULL},
                              {"run", "method", 19, "Runner"}, {"makeRunner", "function", 24, NULL},
                              {"double", "function", 28, NULL}, {NULL, NULL, 0, NULL}};
    static const want tsx[] = {{"Props", "interface", 3, NULL}, {"Header", "function", 7, NULL},
                               {"Panel", "class", 11, NULL}, {"render", "method", 12, "Panel"},
                               {NULL, NULL, 0, NULL}};
    static const want go[] = {{"Store", "struct", 5, NULL}, {"Getter", "interface", 9, NULL},
                              {"Get", "method", 10, "Getter"}, {"Key", "type", 13, NULL},
                              {"New", "function", 15, NULL}, {"Get", "method", 19, NULL},
                              {NULL, NULL, 0, NULL}};
    static const want rs[] = {{"Cache", "struct", 3, NULL}, {"Event", "enum", 7, NULL},
                              {"Store", "trait", 12, NULL}, {"get", "method", 13, "Store"},
                              {"Cache", "impl", 16, NULL}, {"get", "method", 17, "Cache"},
                              {"LIMIT", "constant", 22, NULL}, {"twice", "macro", 24, NULL},
                              {"build", "function", 30, NULL}, {"tests", "module", 34, NULL},
                              {"helper", "function", 35, "tests"}, {NULL, NULL, 0, NULL}};
    static const want java[] = {{"Sample", "class", 5, NULL}, {"Sample", "constructor", 8, "Sample"},
                                {"count", "method", 12, "Sample"},
                                {"Visitor", "interface", 16, "Sample"},
                                {"visit", "method", 17, "Visitor"}, {"Kind", "enum", 20, "Sample"},
                                {NULL, NULL, 0, NULL}};
    check_outline(ctx, "sample.c", "c", c);
    check_outline(ctx, "sample.cpp", "cpp", cpp);
    check_outline(ctx, "sample.py", "python", py);
    check_outline(ctx, "sample.js", "javascript", js);
    check_outline(ctx, "sample.ts", "typescript", ts);
    check_outline(ctx, "sample.tsx", "tsx", tsx);
    check_outline(ctx, "sample.go", "go", go);
    check_outline(ctx, "sample.rs", "rust", rs);
    check_outline(ctx, "Sample.java", "java", java);
    int rc;
    json_t *r = tt_call(ctx, "outline", "{\"path\":\"missing.c\"}", &rc);
    CHECK(rc == TOOL_ENOTFOUND);
    json_decref(r);
    tool_ctx_free(ctx);

    /* unsupported language */
    char *dir = tt_tmpdir();
    tt_puts(dir, "x.cobol", "IDENTIFICATION DIVISION.\n");
    ctx = tt_ctx(dir, false, 0);
    r = tt_call(ctx, "outline", "{\"path\":\"x.cobol\"}", &rc);
    CHECK(rc == TOOL_EUNSUPPORTED);
    json_decref(r);
    /* repo map ranking: a helper every file calls outranks one nobody calls */
    tt_puts(dir, "lib.c", "int shared_helper(int x) { return x; }\nint unused_thing(void) { return 0; }\n");
    for (int i = 0; i < 5; i++) {
        char name[32], body[200];
        snprintf(name, sizeof name, "user%d.c", i);
        snprintf(body, sizeof body, "int shared_helper(int);\nint user_%d(void) { return "
                                    "shared_helper(%d); }\n", i, i);
        tt_puts(dir, name, body);
    }
    r = tt_call(ctx, "repo_map", "{\"max_tokens\":64}", &rc);
    CHECK(rc == 0);
    const char *map = json_string_value(json_object_get(r, "map"));
    CHECK_MSG(map && strstr(map, "shared_helper"), "%s", map);
    CHECK(!strcmp(json_string_value(json_array_get(json_object_get(r, "top_files"), 0)), "lib.c"));
    CHECK(json_integer_value(json_object_get(r, "tokens_estimated")) <= 64);
    CHECK(json_integer_value(json_object_get(r, "files_parsed")) == 6);
    json_decref(r);
    tool_ctx_free(ctx);
    tt_rmtree(dir);
    free(dir);

    /* this project's tools/: tool_err is defined once and called everywhere */
    char tdir[4096];
    snprintf(tdir, sizeof tdir, "%s/tools", src);
    ctx = tt_ctx(tdir, false, 0);
    r = tt_call(ctx, "repo_map", "{\"max_tokens\":1024}", &rc);
    CHECK(rc == 0);
    map = json_string_value(json_object_get(r, "map"));
    CHECK_MSG(map && strstr(map, "int tool_err(int code, const char *fmt, ...)"), "%s", map);
    CHECK(json_integer_value(json_object_get(r, "tokens_estimated")) <= 1024);
    CHECK(json_integer_value(json_object_get(r, "files_parsed")) >= 15);
    json_decref(r);
    tool_ctx_free(ctx);
    return tt_done("test_tools_symbols");
}
