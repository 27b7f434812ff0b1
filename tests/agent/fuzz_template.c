/* Fuzz target for the chat-template interpreter: the input is a template source; it is parsed
 * and, when it parses, rendered with a small fixed conversation under tight limits. Any crash,
 * leak or sanitizer report is a bug; errors are the expected outcome for most inputs. */
#include "agent.h"
#include "template_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *VARS =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":"
    "\"hi \\u00e9\"},{\"role\":\"assistant\",\"content\":\"<think>\\nr\\n</think>\\n\\nok\","
    "\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1,\"b\":[true,null]}}}]},"
    "{\"role\":\"tool\",\"content\":\"res\"}],\"tools\":[{\"type\":\"function\",\"function\":"
    "{\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"a\":{\"type\":\"integer\"}}}}}],\"add_generation_prompt\":true,\"enable_thinking\":false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = 0;
    agent_template *t = NULL;
    if (agent_template_new(&t, src) == 0) {
        tpl_set_limits(t, (size_t)32 << 20, 200000);
        char *out = NULL;
        size_t len = 0;
        if (agent_template_render_vars(t, VARS, &out, &len) == 0 && strlen(out) > len) abort();
        free(out);
    }
    agent_template_free(t);
    free(src);
    return 0;
}
