/* Differential test: random templates from tests/agent/template_diff.mjs (seeded), rendered by
 * @huggingface/jinja and by us, must agree byte for byte or both fail. Needs node; exits 77
 * (skip) with the reason when node cannot run the generator. */
#include "agent.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *run(const char *cmd) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 20, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 2) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    int st = pclose(p);
    if (!buf || st != 0 || !n) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

int main(void) {
    const char *src = getenv("SPARK_SOURCE_DIR");
    if (!src) src = ".";
    static const int SEEDS[] = {11, 21};
    int total = 0, rendered = 0, both_fail = 0, failures = 0;
    for (size_t s = 0; s < sizeof SEEDS / sizeof SEEDS[0]; s++) {
        char cmd[4400];
        snprintf(cmd, sizeof cmd, "node '%s/tests/agent/template_diff.mjs' %d 600 2>&1", src,
                 SEEDS[s]);
        char *text = run(cmd);
        if (!text) {
            printf("skip: node could not run tests/agent/template_diff.mjs\n");
            return 77;
        }
        json_error_t e;
        json_t *root = json_loads(text, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &e);
        free(text);
        if (!root) {
            fprintf(stderr, "generator output: %s\n", e.text);
            return 1;
        }
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(root, "cases"), i, c) {
            total++;
            const char *source = json_string_value(json_object_get(c, "source"));
            json_t *want = json_object_get(c, "output");
            agent_template *t = NULL;
            char *out = NULL, *vars = NULL;
            size_t len = 0;
            int rc = agent_template_new(&t, source);
            if (!rc) {
                vars = json_dumps(json_object_get(c, "vars"), JSON_COMPACT);
                rc = agent_template_render_vars(t, vars, &out, &len);
            }
            if (!want) {
                if (rc == 0) {
                    fprintf(stderr, "FAIL seed %d case %zu: reference fails (%s), we render\n"
                                    "  %s\n",
                            SEEDS[s], i, json_string_value(json_object_get(c, "error")), source);
                    failures++;
                } else {
                    both_fail++;
                }
            } else if (rc) {
                fprintf(stderr, "FAIL seed %d case %zu: we fail (%s)\n  %s\n", SEEDS[s], i,
                        agent_error_last(), source);
                failures++;
            } else if (len != json_string_length(want) ||
                       memcmp(out, json_string_value(want), len)) {
                fprintf(stderr, "FAIL seed %d case %zu: output differs\n  src:  %s\n  want: %s\n"
                                "  got:  %s\n",
                        SEEDS[s], i, source, json_string_value(want), out);
                failures++;
            } else {
                rendered++;
            }
            free(out);
            free(vars);
            agent_template_free(t);
        }
        json_decref(root);
    }
    printf("%d random templates: %d rendered identically, %d fail in both, %d failures\n", total,
           rendered, both_fail, failures);
    return failures ? 1 : 0;
}
