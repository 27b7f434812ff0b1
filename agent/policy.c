/* Approval policy: a mode (Codex's four) and per-tool rules over three kinds of tools. */
#include "agent_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RULES 64

struct agent_policy {
    agent_approval_mode mode;
    int n_rules;
    struct {
        char pattern[64];
        agent_decision d;
    } rules[MAX_RULES];
};

static const char *const MODE_NAMES[] = {"read-only", "ask", "auto-edit", "full-auto"};
static const char *const DECISION_NAMES[] = {"allow", "ask", "deny"};

int agent_approval_parse(const char *name) {
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, MODE_NAMES[i])) return i;
    return -1;
}

const char *agent_approval_name(agent_approval_mode m) {
    return (unsigned)m < 4 ? MODE_NAMES[m] : "?";
}

int agent_decision_parse(const char *name) {
    for (int i = 0; name && i < 3; i++)
        if (!strcmp(name, DECISION_NAMES[i])) return i;
    return -1;
}

const char *agent_decision_name(agent_decision d) {
    return (unsigned)d < 3 ? DECISION_NAMES[d] : "?";
}

int agent_policy_new(agent_policy **out, agent_approval_mode mode) {
    if (!out) return agent_err(AGENT_EINVAL, "agent_policy_new: NULL");
    *out = NULL;
    if ((unsigned)mode > AGENT_APPROVAL_FULL_AUTO)
        return agent_err(AGENT_EINVAL, "unknown approval mode %d", (int)mode);
    agent_policy *p = calloc(1, sizeof *p);
    if (!p) return agent_err(AGENT_ENOMEM, "out of memory");
    p->mode = mode;
    *out = p;
    return 0;
}

void agent_policy_free(agent_policy *p) {
    free(p);
}

agent_approval_mode agent_policy_mode(const agent_policy *p) {
    return p ? p->mode : AGENT_APPROVAL_READ_ONLY;
}

int agent_policy_add_rule(agent_policy *p, const char *pattern, agent_decision d) {
    if (!p || !pattern || !*pattern) return agent_err(AGENT_EINVAL, "policy rule: empty pattern");
    if ((unsigned)d > AGENT_DECIDE_DENY)
        return agent_err(AGENT_EINVAL, "policy rule %s: unknown decision", pattern);
    if (strlen(pattern) >= sizeof p->rules[0].pattern)
        return agent_err(AGENT_EINVAL, "policy rule: pattern too long: %s", pattern);
    const char *star = strchr(pattern, '*');
    if (star && star[1])
        return agent_err(AGENT_EINVAL, "policy rule %s: '*' may only end a pattern", pattern);
    if (p->n_rules == MAX_RULES)
        return agent_err(AGENT_EINVAL, "policy: more than %d rules", MAX_RULES);
    strcpy(p->rules[p->n_rules].pattern, pattern);
    p->rules[p->n_rules++].d = d;
    return 0;
}

int agent_policy_add_rules_json(agent_policy *p, const char *json) {
    json_error_t je;
    json_t *o = json_loads(json ? json : "", 0, &je);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return agent_err(AGENT_EINVAL, "approval rules: not a JSON object (%s)", je.text);
    }
    const char *k;
    json_t *v;
    int rc = 0;
    json_object_foreach(o, k, v) {
        int d = agent_decision_parse(json_string_value(v));
        if (d < 0) {
            rc = agent_err(AGENT_EINVAL, "approval rule \"%s\": the value must be \"allow\", "
                           "\"ask\" or \"deny\"", k);
            break;
        }
        if ((rc = agent_policy_add_rule(p, k, (agent_decision)d))) break;
    }
    json_decref(o);
    return rc;
}

/* Commands: build and test, and every MCP server's tool (it may do anything its server can). */
static bool is_command(const char *tool) {
    return !strcmp(tool, "build") || !strcmp(tool, "test") || !strncmp(tool, "mcp__", 5);
}

agent_decision agent_policy_decide(const agent_policy *p, const char *tool) {
    if (!tool) return AGENT_DECIDE_DENY;
    for (int i = p ? p->n_rules - 1 : -1; i >= 0; i--) {
        const char *pat = p->rules[i].pattern;
        size_t n = strlen(pat);
        bool match = pat[n - 1] == '*' ? !strncmp(pat, tool, n - 1) : !strcmp(pat, tool);
        if (match) return p->rules[i].d;
    }
    agent_approval_mode m = agent_policy_mode(p);
    if (is_command(tool)) {
        if (m == AGENT_APPROVAL_READ_ONLY) return AGENT_DECIDE_DENY;
        return m == AGENT_APPROVAL_FULL_AUTO ? AGENT_DECIDE_ALLOW : AGENT_DECIDE_ASK;
    }
    if (tool_is_mutating(tool)) {
        if (m == AGENT_APPROVAL_READ_ONLY) return AGENT_DECIDE_DENY;
        return m == AGENT_APPROVAL_ASK ? AGENT_DECIDE_ASK : AGENT_DECIDE_ALLOW;
    }
    return AGENT_DECIDE_ALLOW;
}
