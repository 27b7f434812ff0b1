/* The front ends of the server: each init function registers its routes or the WebSocket
 * handler. A front end adds its row here (part B: srv_rpc_init, srv_anthropic_init,
 * srv_responses_init, srv_infill_init). */
#include "server_core.h"
#include "dialects.h"

static const struct {
    const char *name;
    srv_module_init_fn init;
} modules[] = {
    {"metrics", srv_metrics_init},
    {"openai", srv_openai_init},
    {"anthropic", srv_anthropic_init},
    {"responses", srv_responses_init},
    {"infill", srv_infill_init},
    {"rpc", srv_rpc_init},
};

int srv_modules_init(srv *s) {
    for (size_t i = 0; i < sizeof modules / sizeof modules[0]; i++) {
        int rc = modules[i].init(s);
        if (rc) return agent_err(rc, "server module %s: %s", modules[i].name, agent_error_last());
    }
    return 0;
}
