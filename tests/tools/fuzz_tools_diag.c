/* Fuzz the diagnostics parser (it reads whatever a build prints). */
#include <stdint.h>
#include <stdlib.h>

#include "tool_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *d = NULL;
    if (tool_diag_parse((const char *)data, size, &d) == 0) {
        char *s = json_dumps(d, JSON_COMPACT); /* every string must be valid UTF-8 */
        if (!s) abort();
        free(s);
        json_decref(d);
    }
    return 0;
}
