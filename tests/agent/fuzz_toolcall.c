/* Fuzz target for the tool-call parser: the first byte picks the format (even: Hermes JSON,
 * odd: XML), the rest is a model reply, parsed against the built-in tools with their schema
 * validator. Every call must come out either valid (name and arguments set) or with an error. */
#include "agent.h"

#include <stdint.h>
#include <stdlib.h>

#include "tools.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char *tools;
    if (!tools && tool_schemas_json(&tools, TOOL_FORMAT_OPENAI) < 0) abort();
    if (size < 1 || size > (1u << 20)) return 0;
    agent_toolcall_format f = (data[0] & 1) ? AGENT_TOOLCALL_XML : AGENT_TOOLCALL_HERMES;
    agent_reply r;
    if (agent_toolcall_parse(&r, (const char *)data + 1, size - 1, f, tools,
                             agent_validate_builtin, NULL) == 0) {
        for (size_t i = 0; i < r.n_calls; i++)
            if (!r.calls[i].error && (!r.calls[i].name || !r.calls[i].args_json)) abort();
        agent_reply_clear(&r);
    }
    return 0;
}
