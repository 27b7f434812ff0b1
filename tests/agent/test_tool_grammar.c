/* The grammar's copy of the tool schemas (agent_schema_relax_ex): with bound_all false a
 * maxLength up to the limit is kept, a larger one dropped, unbounded strings stay unbounded,
 * enum/const strings untouched, XML string parameters lose their constraints; with bound_all
 * every string is bounded. And the built-in tool set, relaxed as the engine backend does by
 * default, compiles into a tool-call grammar in both formats and all modes (it once went past
 * the compiler's 262,144-state limit: "grammar too large"). */
#include "tool_grammar_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(c)                                                                               \
    do {                                                                                       \
        if (!(c)) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);              \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

static char *relaxed(const char *schema, json_int_t max, bool xml, bool all) {
    json_t *v = json_loads(schema, 0, NULL);
    if (!v) abort();
    agent_schema_relax_ex(v, max, xml, all);
    char *s = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(v);
    return s;
}

int main(void) {
    static const char *schema =
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":50},"
        "\"b\":{\"type\":\"string\",\"maxLength\":4096},\"c\":{\"type\":\"string\"},"
        "\"d\":{\"type\":\"string\",\"enum\":[\"x\",\"y\"]},\"e\":{\"type\":\"array\","
        "\"items\":{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}}}}";
    char *s = relaxed(schema, 128, false, false);
    CHECK(s && !strcmp(s, "{\"properties\":{\"a\":{\"maxLength\":50,\"type\":\"string\"},"
                          "\"b\":{\"type\":\"string\"},\"c\":{\"type\":\"string\"},"
                          "\"d\":{\"enum\":[\"x\",\"y\"],\"type\":\"string\"},\"e\":{\"items\":"
                          "{\"pattern\":\"^[a-z]+$\",\"type\":\"string\"},\"type\":\"array\"}},"
                          "\"type\":\"object\"}"));
    free(s);
    s = relaxed(schema, 16, false, true);
    CHECK(s && strstr(s, "\"b\":{\"maxLength\":16,") && strstr(s, "\"c\":{\"maxLength\":16,") &&
          strstr(s, "\"a\":{\"maxLength\":16,") && !strstr(s, "\"d\":{\"enum\":[\"x\",\"y\"],"
                                                             "\"maxLength\""));
    free(s);
    s = relaxed(schema, 128, true, false);
    CHECK(s && !strstr(s, "maxLength") && !strstr(s, "pattern"));
    free(s);

    char *tools = NULL;
    if (tool_schemas_json(&tools, TOOL_FORMAT_OPENAI) < 0) return 1;
    for (int xml = 0; xml < 2; xml++) {
        json_t *t = json_loads(tools, 0, NULL);
        agent_schema_relax_ex(t, 128, xml, false);
        char *tj = json_dumps(t, JSON_COMPACT);
        json_decref(t);
        for (int mode = 0; mode < 2; mode++) {
            grammar_tool_options o = GRAMMAR_TOOL_OPTIONS_INIT;
            o.format = xml ? GRAMMAR_TOOLS_QWEN3_XML : GRAMMAR_TOOLS_HERMES;
            o.mode = mode ? GRAMMAR_TOOLS_REQUIRED : GRAMMAR_TOOLS_AUTO;
            grammar *g = NULL;
            int rc = grammar_new_tools(&g, tj, strlen(tj), &o);
            if (rc) fprintf(stderr, "format %d mode %d: %s\n", xml, mode, grammar_error_last());
            CHECK(rc == 0);
            if (g) printf("built-in tools, %s, %s: %d states\n", xml ? "XML" : "Hermes",
                          mode ? "required" : "auto", grammar_n_states(g));
            grammar_free(g);
        }
        free(tj);
    }
    free(tools);
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
