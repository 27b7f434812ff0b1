/* The remote OpenAI-compatible backend (--model-url). */
#include "loop_int.h"

int agent_backend_remote_new(agent_backend **out, const char *base_url, const char *api_key,
                             const char *model) {
    (void)api_key;
    (void)model;
    if (out) *out = NULL;
    return agent_err(AGENT_EINVAL, "--model-url %s: the remote backend is not implemented yet",
                     base_url ? base_url : "");
}
