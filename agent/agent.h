/*
 * agent.h - public door of agent/. (Conventions: functions return 0 or a negative AGENT_E* code;
 * agent_error_last() holds the calling thread's last error message. Nothing here prints or exits.)
 */
#ifndef SPARK_AGENT_H
#define SPARK_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "../tools/tools.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    AGENT_OK = 0,
    AGENT_EINVAL = -1,
    AGENT_ENOMEM = -2,
    AGENT_EINTERNAL = -3,
};

/* The calling thread's last error message ("" if none). Borrowed. */
const char *agent_error_last(void);

/* ----- chat templates (agent/template*.c) ---------------------------------------------------
 * A small Jinja interpreter for the chat templates models ship in their GGUF
 * (tokenizer.chat_template): Qwen3 (<think> handling, Hermes JSON tool calls) and Qwen3-Coder /
 * Qwen3.5 (XML tool calls) and templates written in the same subset: {{ }}, {% if/elif/else %},
 * {% for %} (with `if` filter, else, loop.*, break/continue), {% set %} (names, tuples,
 * namespace attributes, blocks), {% macro %} (defaults, kwargs/varargs), {% filter %},
 * comments, whitespace control, lstrip_blocks/trim_blocks as transformers enables them, the
 * operators, tests and filters of @huggingface/jinja 0.5.11 (tojson, trim, length, items,
 * selectattr/rejectattr, map(attribute), reverse, sort, unique, join, default, indent,
 * replace, string, int, float, first, last, list, dictsort, ...) and the string methods
 * (startswith, endswith, split, strip, lstrip, rstrip, replace, upper, lower, title, ...);
 * upper/lower use JavaScript's full Unicode case mappings (tables generated from node's ICU).
 *
 * The output equals @huggingface/jinja 0.5.11 byte for byte (tests/agent/test_template*.c run
 * the node reference). That reference differs from Python Jinja2 (transformers), and we follow
 * the reference: strip/lstrip/rstrip ignore their argument and trim all Unicode whitespace
 * (so Qwen3's `.lstrip('\n')` also drops leading spaces of an answer after </think>, which
 * Python keeps); booleans print as true/false; `1.0 ~ ''` is "1"; string length and indices
 * count UTF-16 units; integer-like object keys iterate first (JavaScript order); `none` inside
 * a list prints as "undefined" when concatenated; tuples cannot be printed; a break or
 * continue discards the output of its loop iteration. Ordinary conversations render the
 * same with both.
 * Not supported, with an error naming line and column instead of output: {% call %} blocks,
 * `*args`/`**kwargs` unpacking in calls, tojson(sort_keys=true) (locale collation),
 * break/continue escaping a macro. Unknown filters, tests, statements and every runtime
 * failure (raise_exception, None + str, ...) are errors too, never silent output.
 *
 * Prefix stability (matters for a token-level session that appends instead of re-rendering):
 * render(messages[0..N]) is NOT always a byte prefix of render(messages[0..N+1]).
 *  1. Qwen3 and Qwen3.5, a new user message after assistant turns: an assistant message
 *     after the last user query renders as "<|im_start|>assistant\n<think>\n" + reasoning +
 *     "\n</think>\n\n" + content (an empty think block when it has no reasoning); once a
 *     new user message follows, it renders as "<|im_start|>assistant\n" + content
 *     (reasoning_content and a <think>...</think> prefix of the content are dropped). The
 *     renders diverge at that "<think>" of the first assistant turn after the previous query.
 *     Qwen3.5 keeps the blocks when the variable preserve_thinking is true. Since the model
 *     itself generates "<think>...</think>" after the generation prompt, a session that keeps
 *     the generated tokens holds a history the template would render differently.
 *  2. All three templates, a second consecutive tool result: a tool message closes the
 *     user turn with "<|im_end|>\n" only while no tool message follows it, so appending the
 *     next result replaces that "<|im_end|>". Append all results of one turn together.
 * Every other append keeps the prefix: assistant after user or tool (also from the render
 * with add_generation_prompt to the render containing the generated turn), the first tool
 * result after an assistant turn, and with Qwen3-Coder (no reasoning) every user message.
 * tests/agent/test_template_prefix.c walks one agent conversation with the three templates
 * and asserts each divergence offset.
 * Thread-safety: a template is immutable after agent_template_new and may be rendered by any
 * number of threads at once; each render uses its own memory.
 * ------------------------------------------------------------------------------------------- */
enum {
    AGENT_ETEMPLATE = -20, /* template syntax error, unsupported construct or render failure */
};

typedef struct agent_template agent_template;

/* Parse the Jinja `source` (UTF-8, NUL-terminated). Errors: AGENT_ETEMPLATE with
 * "template line L, column C: ..." in agent_error_last(), AGENT_EINVAL (NULL or invalid UTF-8),
 * AGENT_ENOMEM. *out is owned by the caller (agent_template_free). */
int agent_template_new(agent_template **out, const char *source);

/* Free a template. NULL: no-op. */
void agent_template_free(agent_template *t);

typedef struct {
    int version;                /* AGENT_TEMPLATE_OPTS_VERSION */
    bool add_generation_prompt; /* end with the assistant header ("<|im_start|>assistant\n") */
    int enable_thinking;        /* -1: leave undefined (the template's default), 0 false, 1 true */
    const char *bos_token;      /* NULL: undefined in the template */
    const char *eos_token;      /* NULL: undefined in the template */
    const char *extra_vars_json; /* NULL or a JSON object of more variables (borrowed) */
} agent_template_opts;

#define AGENT_TEMPLATE_OPTS_VERSION 1
#define AGENT_TEMPLATE_OPTS_INIT {AGENT_TEMPLATE_OPTS_VERSION, true, -1, NULL, NULL, NULL}

/* Render an OpenAI-style conversation: messages_json is a JSON array of messages
 * ({"role", "content", "reasoning_content", "tool_calls": [{"function": {"name",
 * "arguments"}}]}, ...), tools_json NULL (undefined in the template) or a JSON array of tool
 * definitions. opts NULL = AGENT_TEMPLATE_OPTS_INIT. On success *out is a malloc'd,
 * NUL-terminated string the caller frees and *out_len (may be NULL) its length in bytes.
 * Errors: AGENT_EINVAL (malformed JSON, with the JSON error's line and column),
 * AGENT_ETEMPLATE (render error: raise_exception from the template, an undefined operation,
 * a resource limit), AGENT_ENOMEM. */
int agent_template_render(const agent_template *t, const char *messages_json,
                          const char *tools_json, const agent_template_opts *opts, char **out,
                          size_t *out_len);

/* Render with exactly the variables of vars_json (a JSON object: messages, tools,
 * add_generation_prompt, ...). Same results and errors as agent_template_render. */
int agent_template_render_vars(const agent_template *t, const char *vars_json, char **out,
                               size_t *out_len);


/* ----- tool calls in model output (agent/toolcall_parse.c) ----------------------------------
 * The two formats the chat templates teach: Hermes / Qwen3 JSON
 *     <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
 * and Qwen3-Coder / Qwen3.5 XML
 *     <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
 * (an XML value is kept as a string when the parameter's schema says string, else read as
 * JSON, falling back to the string). Every call is checked: complete markup, a known tool
 * name, arguments that are a JSON object, and, when a validator is given, the tool's schema.
 * A call that fails any check carries an `error` naming exactly what is wrong (for the model);
 * such a call must never be executed. --------------------------------------------------------- */
enum {
    AGENT_ETOOLCALL = -21, /* reserved: a reply whose calls could not be parsed at all */
};

typedef enum {
    AGENT_TOOLCALL_HERMES = 0,
    AGENT_TOOLCALL_XML = 1,
} agent_toolcall_format;

typedef struct {
    char *name;      /* the tool named by the call, or NULL when none could be read */
    char *args_json; /* the arguments as compact JSON object text, or NULL */
    char *error;     /* NULL: valid; else the message for the model (never execute the call) */
} agent_toolcall;

typedef struct {
    char *content;          /* the reply without its tool calls (trimmed; "" when none) */
    agent_toolcall *calls;
    size_t n_calls;
} agent_reply;

/* Validate args (a JSON object text) for tool `name`: return 0, or non-zero and set *err to a
 * malloc'd message. */
typedef int (*agent_validate_fn)(void *user, const char *name, const char *args_json,
                                 char **err);

/* Largest call body (bytes between <tool_call> and </tool_call>) that is parsed; larger calls
 * get an error. */
#define AGENT_TOOLCALL_MAX_BYTES (256u * 1024u)

/* Parse the reply text[0..len). tools_json is the OpenAI-style tool array (names, and the
 * parameter schemas XML values are typed by); validate may be NULL. out is cleared first and
 * owned by the caller (agent_reply_clear). Errors (the reply itself cannot be represented):
 * AGENT_EINVAL (NULL arguments, malformed tools_json), AGENT_ENOMEM. Problems of individual
 * calls are not errors of the function: they are in the calls' `error`. */
int agent_toolcall_parse(agent_reply *out, const char *text, size_t len,
                         agent_toolcall_format fmt, const char *tools_json,
                         agent_validate_fn validate, void *validate_user);
void agent_reply_clear(agent_reply *r);

/* The validator of the built-in tools (tools/ registry schemas); user is ignored. */
int agent_validate_builtin(void *user, const char *name, const char *args_json, char **err);


/* ----- the conversation as one token-level engine session (agent/session.c) -----------------
 * Messages become tokens appended after what the engine already holds; earlier turns are never
 * re-rendered, so the engine's cached prefix is always reused. Each new group of messages (a
 * user message, or all tool results of one turn together: see "Prefix stability" above) is
 * rendered by the chat template as a delta after a one-message stub of the previous role, and
 * the delta is checked to extend that stub's render byte for byte (else AGENT_ETEMPLATE).
 * Generated assistant turns are kept token for token as the model wrote them, including a
 * Qwen3 "<think>...</think>" block the template would drop on a re-render: the model always
 * sees the history it produced (deliberately; a re-rendering server would drop those tokens
 * and recompute everything after them). The turn is then closed with the template's own
 * closing text ("<|im_end|>\n", found by rendering a marker message).
 * Context: when a group does not fit, the oldest groups after the first (the task) are
 * replaced by one notice message; the system block with the tool definitions stays in place,
 * so its cache stays valid. Message text is tokenized with special tokens parsed (as
 * transformers does for a rendered chat), so text inside messages that spells a special token
 * becomes that token.
 * ------------------------------------------------------------------------------------------- */
enum {
    AGENT_ECONTEXT = -22,  /* the conversation cannot fit the context window */
    AGENT_ECANCELED = -23, /* stopped by the caller */
};

typedef struct agent_session agent_session;

typedef struct {
    int version;                 /* AGENT_SESSION_OPTS_VERSION */
    const char *system_prompt;   /* NULL: none */
    const char *tools_json;      /* OpenAI-style tool array rendered into the system block */
    int32_t n_ctx;               /* engine session context; 0: the model's default */
    int enable_thinking;         /* -1: the template's default, 0, 1 */
    const char *template_source; /* NULL: the model's tokenizer.chat_template */
} agent_session_opts;

#define AGENT_SESSION_OPTS_VERSION 1
#define AGENT_SESSION_OPTS_INIT {AGENT_SESSION_OPTS_VERSION, NULL, NULL, 0, -1, NULL}

/* A session on model m (borrowed; must outlive the session). */
int agent_session_new(agent_session **out, engine_model *m, const agent_session_opts *o);
void agent_session_free(agent_session *s);

/* Append a JSON array of user/tool (or system) messages; add_prompt ends them with the
 * generation prompt. Compacts when needed. AGENT_ECONTEXT when even compaction cannot make
 * room, AGENT_ETEMPLATE, AGENT_EINVAL (bad messages, or a generation prompt is pending). */
int agent_session_append(agent_session *s, const char *messages_json, bool add_prompt);

/* Generate the assistant turn after the pending generation prompt (max_tokens <= 0: until the
 * context is full; sampling NULL: engine defaults; its grammar hooks constrain the output).
 * The generated tokens stay as produced and the turn is closed. *out_text (caller frees) is
 * the generated text; stats (may be NULL) the engine's figures. AGENT_ECANCELED when cb
 * cancelled (the partial turn is kept and closed). */
int agent_session_generate(agent_session *s, int32_t max_tokens,
                           const engine_sampling_params *sampling, engine_token_fn cb,
                           void *user, char **out_text, engine_gen_stats *stats);

/* Add an assistant turn given as text (resume, scripted replies) after the generation prompt. */
int agent_session_add_assistant(agent_session *s, const char *text);

int32_t agent_session_n_ctx(const agent_session *s);
size_t agent_session_n_tokens(const agent_session *s);
/* The conversation's tokens (borrowed; valid until the next change). */
const int32_t *agent_session_tokens(const agent_session *s);
/* How many times old turns were removed. */
int agent_session_compactions(const agent_session *s);
engine_model *agent_session_model(const agent_session *s);


/* ----- approval policy (agent/policy.c) ------------------------------------------------------
 * Modes as in Codex: read-only (reading tools only; edits and commands refused), ask (reading
 * tools run; edits and commands are asked), auto-edit (edits run; commands are asked),
 * full-auto (everything runs; commands always run in the sandbox). Tools are "read" (not
 * mutating), "edit" (tool_is_mutating) or "command" (build, test, and MCP tools "mcp__*"). Per-tool rules ("TOOL" or a
 * prefix pattern "git_*", later rules win) override the mode. Without an interactive asker an
 * "ask" decision is a refusal, reported to the model and in the result.
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    AGENT_APPROVAL_READ_ONLY = 0,
    AGENT_APPROVAL_ASK = 1,
    AGENT_APPROVAL_AUTO_EDIT = 2,
    AGENT_APPROVAL_FULL_AUTO = 3,
} agent_approval_mode;

typedef enum {
    AGENT_DECIDE_ALLOW = 0,
    AGENT_DECIDE_ASK = 1,
    AGENT_DECIDE_DENY = 2,
} agent_decision;

/* "read-only", "ask", "auto-edit", "full-auto" <-> mode; parse returns -1 when unknown. */
int agent_approval_parse(const char *name);
const char *agent_approval_name(agent_approval_mode m);
/* "allow", "ask", "deny" <-> decision; parse returns -1 when unknown. */
int agent_decision_parse(const char *name);
const char *agent_decision_name(agent_decision d);

typedef struct agent_policy agent_policy;
int agent_policy_new(agent_policy **out, agent_approval_mode mode);
void agent_policy_free(agent_policy *p);
/* Add a rule: pattern is a tool name or a prefix ending in '*'. At most 64 rules. */
int agent_policy_add_rule(agent_policy *p, const char *pattern, agent_decision d);
/* Add rules from a JSON object {"pattern": "allow"|"ask"|"deny", ...} (a config's "approval"
 * table). */
int agent_policy_add_rules_json(agent_policy *p, const char *json);
agent_decision agent_policy_decide(const agent_policy *p, const char *tool);
agent_approval_mode agent_policy_mode(const agent_policy *p);

/* ----- model backends (agent/backend_*.c) ----------------------------------------------------
 * A backend turns the conversation into the next assistant reply text (tool calls written in
 * its format's markup). The in-process engine appends only the messages it has not seen to its
 * token-level session; the scripted one replays fixture replies (tests); the remote one sends
 * the conversation to an OpenAI-compatible /v1/chat/completions endpoint (streaming).
 * ------------------------------------------------------------------------------------------- */
typedef struct agent_backend agent_backend;

/* Replies: a JSON array of strings, one per model turn (Hermes markup for tool calls). Past
 * the end a turn fails with AGENT_EINVAL ("script exhausted"). */
int agent_backend_scripted_new(agent_backend **out, const char *replies_json);

typedef enum {
    AGENT_TOOLS_AUTO = 0,     /* free text; the tool-call grammar takes over at <tool_call> */
    AGENT_TOOLS_REQUIRED = 1, /* every turn is tool calls only (grammar from the first token) */
    AGENT_TOOLS_UNCONSTRAINED = 2, /* no grammar at all */
} agent_tools_mode;

typedef struct {
    int version;                 /* AGENT_ENGINE_OPTS_VERSION */
    int32_t n_ctx;               /* 0: the model's default */
    agent_tools_mode tools_mode;
    float temperature;           /* sampling; <= 0 greedy */
    uint64_t seed;
    const char *template_source; /* NULL: the model's chat template */
    int enable_thinking;         /* -1: template default */
    bool parallel_calls;         /* the grammar allows several calls per turn */
    int max_string_len;          /* grammar-side bound of every string argument; 0: maxLength
                                  * up to 128 kept, longer and unbounded strings unbounded in
                                  * the grammar (a turn's token budget ends one that never
                                  * closes; bounded strings cost DFA states per character).
                                  * The parsed call is still validated against the full
                                  * schema */
} agent_engine_opts;

#define AGENT_ENGINE_OPTS_VERSION 1
#define AGENT_ENGINE_OPTS_INIT                                                                 \
    {AGENT_ENGINE_OPTS_VERSION, 0, AGENT_TOOLS_AUTO, 0.7f, 0, NULL, -1, true, 0}

/* The in-process engine on model m (borrowed). The tool-call format follows the template:
 * XML when it mentions "<function=", else Hermes JSON. */
int agent_backend_engine_new(agent_backend **out, engine_model *m, const agent_engine_opts *o);

/* An OpenAI-compatible server: base_url like "http://host:8000/v1" (http only), api_key may
 * be NULL, model the "model" field (NULL: "default"). */
int agent_backend_remote_new(agent_backend **out, const char *base_url, const char *api_key,
                             const char *model);
/* The remote backend's "tool_choice" on every turn: "auto", "required" (each turn is tool
 * calls only, as AGENT_TOOLS_REQUIRED) or "none"; NULL: not sent (the server's default).
 * AGENT_EINVAL when b is not a remote backend or the choice is none of these. */
int agent_backend_remote_set_tool_choice(agent_backend *b, const char *choice);

void agent_backend_free(agent_backend *b);
/* The engine backend's session (NULL for other backends). */
agent_session *agent_backend_session(agent_backend *b);

/* ----- MCP servers (agent/mcp.c) -------------------------------------------------------------
 * A Model Context Protocol client over the stdio transport: the server is started through the
 * sandbox (sandbox_run, the one choke point: a thread holds the run while the server lives; its
 * stdin and stdout are two FIFOs in a private host directory bound read-only into the sandbox,
 * opened by `/bin/sh -c 'exec "$@" <in >out'`), then JSON-RPC 2.0, one message per line:
 * initialize (+ notifications/initialized), tools/list (all pages), tools/call. Requests the
 * server sends are answered (ping; anything else "method not found"), notifications ignored.
 * The server's tools are offered as "mcp__SERVER__TOOL" with their inputSchema (so the engine
 * backend grammar-constrains them like the built-in tools); a tool whose schema the grammar
 * compiler refuses, or whose name is not [A-Za-z0-9_.-]{1,64}, is left out with a warning.
 * The approval policy treats MCP tools as commands (read-only: denied; ask and auto-edit:
 * asked; full-auto: run) unless a rule ("mcp__fs__*": "allow") says otherwise.
 * The sandbox filters secrets out of the environment (names containing KEY, TOKEN, SECRET, ...),
 * also those given in opts.env: a server that needs a credential cannot get it this way.
 * ------------------------------------------------------------------------------------------- */
enum {
    AGENT_EMCP = -24, /* the server could not be started, broke the protocol, or timed out */
};

typedef struct agent_mcp agent_mcp;

typedef struct {
    int version;                   /* AGENT_MCP_OPTS_VERSION */
    const char *name;              /* [A-Za-z0-9_-]{1,32}: the "SERVER" of the tool names */
    const char *const *argv;       /* the server command (argv[0] looked up in PATH) */
    const char *const *env;        /* NULL-terminated "NAME=VALUE" added to the environment */
    const char *workspace;         /* absolute: the server's working directory and sandbox
                                    * workspace */
    bool write;                    /* the workspace is writable for the server (else read-only) */
    bool network;                  /* network access (else loopback only) */
    bool unsandboxed;              /* explicit user choice: run without isolation */
    const char *const *ro_paths;   /* NULL-terminated: more read-only paths inside the sandbox */
    double start_timeout_s;        /* start-up and initialize; 0: 30 */
    double call_timeout_s;         /* each tools/call; 0: 120 */
} agent_mcp_opts;

#define AGENT_MCP_OPTS_VERSION 1
#define AGENT_MCP_OPTS_INIT {AGENT_MCP_OPTS_VERSION, NULL, NULL, NULL, NULL, false, false, false, \
                             NULL, 0, 0}

/* Start the server, initialize and list its tools. Errors: AGENT_EINVAL (bad options),
 * AGENT_EMCP (with the server's stderr tail or the sandbox's reason), AGENT_ENOMEM. */
int agent_mcp_start(agent_mcp **out, const agent_mcp_opts *o);
/* Close the server's stdin, give it 2 s to exit, then stop its sandbox. NULL: no-op. */
void agent_mcp_free(agent_mcp *m);
const char *agent_mcp_name(const agent_mcp *m);
/* The offered tools: an OpenAI-style JSON array (borrowed, valid while m lives). */
const char *agent_mcp_tools_json(const agent_mcp *m);
/* Why tools were left out, one per line ("" when none). Borrowed. */
const char *agent_mcp_warnings(const agent_mcp *m);
/* Whether `tool` (a full "mcp__SERVER__TOOL" name) is one of m's offered tools. */
bool agent_mcp_has_tool(const agent_mcp *m, const char *tool);
/* Check args_json against the tool's inputSchema (tool_schema_check's keywords): 0, or
 * non-zero and *err a malloc'd message. */
int agent_mcp_check_args(const agent_mcp *m, const char *tool, const char *args_json, char **err);
/* Call a tool. On return 0, *out_json (caller frees) is the result for the model:
 * {"text": joined text content, "structured": structuredContent (when given), "other":
 * [non-text content summaries] (when any)}, or {"error":{"code":"tool_error","message":...}}
 * with *is_error true when the tool reported an error (isError or a JSON-RPC error).
 * Errors: AGENT_EMCP (timeout: the request is cancelled with notifications/cancelled; the
 * server died; a protocol violation), AGENT_ECANCELED (*cancel became non-zero),
 * AGENT_EINVAL (unknown tool). */
int agent_mcp_call(agent_mcp *m, const char *tool, const char *args_json,
                   volatile int *cancel, char **out_json, bool *is_error);

/* ----- the agent loop (agent/loop.c) ---------------------------------------------------------
 * model turn -> parse calls -> policy -> tools/ (sandboxed builds) -> results -> next turn,
 * until a final answer (a turn without tool calls), the step or token budget, a cancel, or the
 * same call repeated. Every message is appended to a JSONL transcript when one is given.
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    AGENT_STOP_ANSWER = 0,   /* the model answered without tool calls */
    AGENT_STOP_STEPS,        /* max_steps model turns */
    AGENT_STOP_TOKENS,       /* token budget, or a turn that never ended */
    AGENT_STOP_CANCELED,
    AGENT_STOP_REPEAT,       /* the same call (name and arguments) repeat_limit times in a row */
    AGENT_STOP_ERROR,        /* the backend failed (the message says why) */
} agent_stop;

const char *agent_stop_name(agent_stop s);

/* Events for a UI or the --json stream: one JSON object text per event ({"type": "assistant"|
 * "tool_call"|"tool_result"|"refused"|"invalid_call"|"stop", ...}). Borrowed for the call. */
typedef void (*agent_event_fn)(void *user, const char *event_json);
/* Streaming text of the model's turn as it is produced. */
typedef void (*agent_text_fn)(void *user, const char *text, size_t len);
/* Ask the user about a call (interactive mode): return true to run it. */
typedef bool (*agent_ask_fn)(void *user, const char *tool, const char *args_json);

typedef struct {
    int version;                 /* AGENT_LOOP_OPTS_VERSION */
    tool_ctx *tools;             /* the workspace (borrowed) */
    const agent_policy *policy;  /* borrowed; NULL: read-only */
    const char *system_prompt;   /* NULL: a built-in one */
    int max_steps;               /* model turns per task; 0: 50 */
    int64_t max_tokens;          /* generated tokens per task (a turn stops there too); 0:
                                  * unlimited */
    int32_t max_turn_tokens;     /* per model turn; 0: 4096 */
    size_t tool_output_cap;      /* bytes of a tool result shown to the model; 0: 16 KiB */
    int repeat_limit;            /* 0: 3 */
    volatile int *cancel;        /* non-zero: stop at the next token or step (may be NULL) */
    agent_event_fn on_event;
    agent_text_fn on_text;
    agent_ask_fn ask;            /* NULL: non-interactive (an "ask" decision is a refusal) */
    void *user;                  /* for the three callbacks */
    const char *transcript_path; /* JSONL, appended atomically line by line; NULL: none */
    const char *const *tool_names; /* NULL-terminated subset of the tools offered; NULL: all */
    agent_mcp *const *mcp;       /* MCP servers whose tools are offered too (borrowed) */
    int n_mcp;
} agent_loop_opts;

#define AGENT_LOOP_OPTS_VERSION 1
#define AGENT_LOOP_OPTS_INIT                                                                    \
    {AGENT_LOOP_OPTS_VERSION, NULL, NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, \
     NULL, NULL, 0}

typedef struct {
    agent_stop stop;
    int steps;          /* model turns */
    int tool_calls;     /* executed */
    int tool_errors;    /* executed but failed */
    int refused;        /* refused by the policy */
    int invalid;        /* malformed, unknown or schema-invalid calls (never executed) */
    int64_t tokens;     /* generated tokens (backends that count them) */
    char *answer;       /* the final answer text (caller frees), or NULL */
    char message[512];  /* why it stopped, for people */
} agent_result;

typedef struct agent agent;

/* An agent on a backend (borrowed; must outlive it). opts is copied (its pointers borrowed). */
int agent_new(agent **out, agent_backend *b, const agent_loop_opts *opts);
void agent_free(agent *a);
/* Load an earlier session's messages from a transcript so the next task continues it. */
int agent_resume(agent *a, const char *transcript_path);
/* Carry out one task (a user message). *res is filled also on error; free res->answer.
 * Returns 0 when the loop ran (whatever stop reason), a negative code when it could not. */
int agent_run_task(agent *a, const char *task, agent_result *res);
/* The conversation so far as a JSON array of messages (caller frees). */
char *agent_messages_json(const agent *a);

/* ----- the server (agent/server/): `spark-agent serve` ---------------------------------------
 * One libwebsockets listener for HTTP (OpenAI-compatible routes, /health, /metrics and the other
 * dialects) and WebSocket JSON-RPC (/rpc), one service thread, one engine scheduler shared by
 * every client. Every route and the WebSocket handshake need the token. See docs/cli.md
 * (serve) and docs/architecture.md (Server).
 * ------------------------------------------------------------------------------------------- */
enum {
    AGENT_EIO = -40,      /* server: cannot listen, token file unusable */
};

typedef struct agent_server agent_server;

typedef struct {
    int version;                  /* AGENT_SERVER_OPTS_VERSION */
    const char *host;             /* listen address; NULL: "127.0.0.1" */
    int port;                     /* 0: an ephemeral port (agent_server_port tells which) */
    bool listen_public;           /* required for a non-loopback host */
    const char *token;            /* required (see agent_server_token_load) */
    const char *model_name;       /* public model name; NULL: the file's name */
    const char *const *allow_hosts;   /* NULL-terminated extra Host values ("box.lan:8088") */
    const char *const *allow_origins; /* NULL-terminated Origins allowed (exact match) */
    size_t max_body;              /* 0: 8 MiB */
    size_t max_ws_message;        /* 0: 8 MiB */
    int max_json_depth;           /* 0: 64 */
    int max_conns_per_client;     /* 0: 64 */
    int max_tokens_default;       /* 0: 512 */
    int idle_timeout_s;           /* 0: 60 */
    int drain_timeout_s;          /* SIGTERM: wait this long for running work; 0: 10 */
    int32_t max_seqs;             /* scheduler: sequences decoded together; 0: 16 */
    int32_t n_ctx;                /* scheduler: positions per request; 0: the model's */
} agent_server_opts;

#define AGENT_SERVER_OPTS_VERSION 1
#define AGENT_SERVER_OPTS_INIT                                                                 \
    {AGENT_SERVER_OPTS_VERSION, NULL, 8088, false, NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0, 0, 0,  \
     0, 0}

/* Listen on host:port with model m (borrowed; must outlive the server). Errors: AGENT_EINVAL
 * (no token, a public address without listen_public, bad options), AGENT_EIO (cannot listen),
 * AGENT_ENOMEM. */
int agent_server_new(agent_server **out, engine_model *m, const agent_server_opts *o);
/* The port listened on. */
int agent_server_port(const agent_server *s);
/* Serve until agent_server_stop; then drain (running work gets drain_timeout_s, then is
 * cancelled), close every connection and return 0. */
int agent_server_run(agent_server *s);
/* Async-signal-safe, any thread: make agent_server_run drain and return. */
void agent_server_stop(agent_server *s);
void agent_server_free(agent_server *s);

/* The token: from the environment variable SPARK_API_KEY when set, else the file
 * $XDG_CONFIG_HOME/spark-agent/token (~/.config/...), created with 32 random bytes in hex and
 * mode 0600 on first use (a file readable by others is refused). path_out (may be NULL) gets
 * the file used ("" for the environment). */
int agent_server_token_load(char *out, size_t cap, char *path_out, size_t path_cap);

#ifdef __cplusplus
}
#endif
#endif
