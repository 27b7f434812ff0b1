/* Fuzz target: JSON Schema -> GBNF -> grammar (also as a tool list in both formats). Must never
 * crash, and every GBNF the compiler writes must compile. */
#include "grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 8192) return 0;
    char *text = NULL;
    if (grammar_schema_to_gbnf(&text, (const char *)data, size) == 0) {
        grammar *g = NULL;
        int rc = grammar_new_gbnf(&g, text, strlen(text), NULL);
        /* what the compiler writes always parses; only size limits and degenerate schemas
         * ($ref cycles that consume nothing: left recursion) may refuse it */
        if (rc != 0 && rc != GRAMMAR_ELIMIT && !strstr(grammar_error_last(), "left recursion")) {
            fprintf(stderr, "schema compiler wrote a grammar that does not compile: %s\n%s\n",
                    grammar_error_last(), text);
            abort();
        }
        grammar_free(g);
        free(text);
    }
    for (int f = 0; f < 2; f++) {
        grammar_tool_options o = GRAMMAR_TOOL_OPTIONS_INIT;
        o.format = f ? GRAMMAR_TOOLS_QWEN3_XML : GRAMMAR_TOOLS_HERMES;
        grammar *g = NULL;
        grammar_new_tools(&g, (const char *)data, size, &o);
        grammar_free(g);
    }
    return 0;
}
