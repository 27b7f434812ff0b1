/* Fuzz the argument checker and the result bounding with arbitrary JSON: every tool's schema
 * validates it (no crash, a clear verdict), and bounding it to a small cap terminates. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tool_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t e;
    json_t *v = json_loadb((const char *)data, size, JSON_DECODE_ANY, &e);
    if (!v) return 0;
    for (size_t i = 0; tool_name(i); i++) {
        char *s = NULL;
        if (tool_schema_json(&s, tool_name(i)) != 0) abort();
        json_t *schema = json_loads(s, 0, &e);
        free(s);
        if (!schema) abort();
        int rc = tool_schema_validate(schema, v, "arguments");
        if (rc != 0 && rc != TOOL_EINVAL) abort();
        json_decref(schema);
    }
    if (json_is_object(v)) {
        tool_bound_json(v, 256);
        char *s = json_dumps(v, JSON_COMPACT);
        free(s);
    }
    json_decref(v);
    return 0;
}
