/* Private to the spark-agent command: one function per subcommand, shared helpers. */
#ifndef SPARK_CLI_H
#define SPARK_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine.h"

/* Exit statuses of the command-line contract (docs/cli.md). */
enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_FAIL = 1,
    CLI_EXIT_USAGE = 2,
    CLI_EXIT_SANDBOX = 125,
};

/* Each subcommand gets argv with argv[0] = its own name and returns the process exit status. */
typedef int (*cli_command_fn)(int argc, char **argv);

int cli_doctor(int argc, char **argv);
int cli_version(int argc, char **argv);
int cli_complete(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_model(int argc, char **argv);
/* `model gen` and `model info` (cmd_model_gen.c, cmd_model_info.c), called by cli_model. */
int cli_model_gen(int argc, char **argv);
int cli_model_info(int argc, char **argv);
int cli_tool(int argc, char **argv);
int cli_undo(int argc, char **argv);
/* `run`, `chat`, `sessions` (cmd_full_run.c, full builds only): the agent loop. */
int cli_run(int argc, char **argv);
int cli_chat(int argc, char **argv);
int cli_sessions(int argc, char **argv);
int cli_sandbox(int argc, char **argv);
/* `serve` (cmd_full_serve.c, full builds only): the HTTP + WebSocket server. */
int cli_serve(int argc, char **argv);
/* `model render` (cmd_full_render.c, full builds only): chat template of a model. */
int cli_model_render(int argc, char **argv);

/* Settings resolved from flags > environment (SPARK_*) > config file (XDG) > defaults. */
typedef struct {
    char model[4096];        /* model file; "" = the embedded default */
    char model_source[64];   /* where `model` came from: "flag", "SPARK_MODEL", config path... */
    char device[16];         /* "auto", "cpu" or "cuda" */
    char device_source[64];
    int threads;             /* 0 = all cores */
    bool sandbox_required;   /* false only when the user explicitly allowed unsandboxed runs */
    char approval[16];       /* approval mode name ("" = the command's default); checked by
                              * the agent commands */
    char approval_source[4200]; /* "flag", "SPARK_APPROVAL", "FILE:LINE" or "default" */
    /* Per-tool approval rules, JSON objects {"PATTERN": "allow"|"ask"|"deny"}: the config
     * file's `approval_rules` and SPARK_APPROVAL_RULES ("" when absent); the agent applies the
     * file's first, so the environment's win for the same pattern. */
    char approval_rules_file[8192];
    char approval_rules_env[8192];
    int approval_rules_line; /* the config file's line of approval_rules (0: none) */
    /* MCP servers from `mcp.NAME = {JSON}` lines, assembled as the text of one JSON object
     * {"NAME": {...}, ...} ("" when none); the agent parses and checks the values. */
    char mcp_servers[16384];
    /* KV pool of the model's prefix cache (engine_model_params.prefix_cache_bytes), MiB:
     * -1 = auto (cli_kv_cache_plan's default), 0 = off; `kv_cache =` / SPARK_KV_CACHE */
    long kv_cache_mib;
    char kv_cache_source[64];
    /* KV type of the model's sessions and prefix cache (engine_model_params.kv_type):
     * `kv_type = f16|f32|q8_0` / SPARK_KV_TYPE; default f16 */
    int kv_type;
    char kv_type_source[64];
    char serve_host[256];    /* serve.host ("" = not set) */
    int serve_port;          /* serve.port (0 = not set) */
    char config_path[4096];  /* the config file consulted ("" if none exists) */
    char error[4400];        /* set when the config file is malformed */
} cli_config;

/* Fill *cfg from the environment and the config file. Returns 0, or -1 with cfg->error set
 * when the config file exists but cannot be parsed. */
int cli_config_load(cli_config *cfg);

/* Engine commands' helpers (cmd_complete.c, cmd_model.c): the model file from the flag, else
 * SPARK_MODEL / config, else the embedded default (printing the error and returning -1 when
 * none is available); a strict UTF-8 check (*bad_at = offset of the first bad byte); all of
 * stdin in a malloc'ed NUL-terminated buffer (NULL with errno on failure). */
int cli_model_resolve(const char *cmd, const char *flag, const cli_config *cfg, char *out,
                      size_t cap);
bool cli_utf8_valid(const char *s, size_t n, size_t *bad_at);
char *cli_read_stdin(size_t *len);
/* Load a model (cli_load.c). On a terminal, for files of 256 MiB or more (SPARK_PROGRESS=
 * always|never overrides), a progress bar on stderr while the file is read ahead, then the
 * load time. Prints the error itself ("spark-agent CMD: ...") and returns the engine's code. */
int cli_model_load(const char *cmd, engine_model **out, const char *path,
                   const engine_model_params *params);
/* The prefix cache's KV pool for a model about to be loaded on the CPU, into
 * mp->prefix_cache_bytes: `flag` (--kv-cache: "auto", or MiB with 0 = off) > SPARK_KV_CACHE >
 * the config's kv_cache > auto. Auto reads the model's shape (a vocabulary-only load) and sizes
 * the pool for n_ctx positions (0: the model's default) plus two blocks: the session's KV lives
 * in the pool, so this costs what the session's own cache would; off where the engine has no
 * prefix cache (a GPU, qwen35moe). Prints a line on stderr when `log` ("spark-agent CMD: kv
 * cache ..."). Returns 0, or -1 after printing the error (a bad flag or value). */
bool cli_parse_kv_cache(const char *s, long *mib); /* "auto" (-1) or 0..16777216 MiB */
int cli_kv_cache_plan(const char *cmd, const char *flag, const cli_config *cfg, const char *path,
                      int32_t n_ctx, engine_model_params *mp, bool log);
/* mp->kv_type from `flag` (--kv f16|f32|q8_0) > SPARK_KV_TYPE > the config's kv_type > f16
 * (call before cli_kv_cache_plan, which sizes the pool for that type). Returns 0, or -1 after
 * printing the error (an unknown type). */
int cli_kv_type_plan(const char *cmd, const char *flag, const cli_config *cfg,
                     engine_model_params *mp);
/* Strict number parsing for options: the whole string, in [lo, hi] (u64: no sign). */
bool cli_parse_long(const char *s, long lo, long hi, long *out);
bool cli_parse_float(const char *s, double lo, double hi, float *out);
bool cli_parse_u64(const char *s, uint64_t *out);

/* Print "spark-agent NAME: message" to stderr (printf-style). */
void cli_errorf(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
