/* Fuzz target of agent/server/split.c. Input: one flag byte (bit 0 raw, bit 1 think, bit 2
 * tools, bit 3 XML format), one seed byte for where the text is cut, then the text. The events
 * of the text fed in pieces must equal those of the whole text, and every event stays inside
 * the text (split_events.h aborts otherwise); with tool-call deltas on too, where the pieces
 * of a call's arguments must be exactly the start of the parsed call's arguments. */
#include <stdint.h>

#include "split_events.h"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"a\":{\"type\":\"integer\"},\"s\":{\"type\":\"string\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":{\"type\":\"object\"}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > 4096) return 0;
    unsigned flags = data[0], seed = data[1];
    const char *text = (const char *)data + 2;
    size_t n = size - 2;
    bool raw = flags & 1, think = flags & 2;
    const char *tools = flags & 4 ? TOOLS : NULL;
    agent_toolcall_format fmt = flags & 8 ? AGENT_TOOLCALL_XML : AGENT_TOOLCALL_HERMES;
    size_t cuts[64], n_cuts = 0;
    uint32_t x = seed * 2654435761u + 1;
    for (size_t at = 0; n_cuts < 64;) {
        x = x * 1103515245u + 12345u;
        at += 1 + (x >> 16) % 9;
        if (at >= n) break;
        cuts[n_cuts++] = at;
    }
    for (int deltas = 0; deltas < 2; deltas++) {
        char *whole = split_run_ex(text, n, NULL, 0, raw, think, tools, fmt, NULL, deltas, NULL);
        char *pieces =
            split_run_ex(text, n, cuts, n_cuts, raw, think, tools, fmt, NULL, deltas, NULL);
        if (strcmp(whole, pieces)) {
            fprintf(stderr, "fuzz_split: pieces differ:\n%s\nvs\n%s\n", pieces, whole);
            abort();
        }
        /* streamed arguments are exactly what the parsed call holds */
        if (split_mismatches) {
            fprintf(stderr, "fuzz_split: streamed arguments differ: %s\n", whole);
            abort();
        }
        free(whole);
        free(pieces);
    }
    return 0;
}
