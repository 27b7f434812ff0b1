/* spark-agent: one binary, one subcommand per job (docs/cli.md is the contract). */
#include "cli.h"

#include <string.h>

#include "engine.h"

typedef struct {
    const char *name;
    cli_command_fn fn;     /* NULL: not in this build or not built yet */
    const char *summary;
    const char *missing;   /* why fn is NULL: printed, exit 2 */
    bool full_only;        /* needs modules beyond the engine */
} cli_command;

/* Commands that need modules beyond the engine are wrapped in FULL(): an engine-only build
 * (SPARK_ENGINE_ONLY=ON) lists them but says they are not in this build. */
#ifdef SPARK_FULL_BUILD
#define FULL(fn) fn
#else
#define FULL(fn) NULL
#endif

static const cli_command commands[] = {
    {"run", FULL(cli_run), "carry out a task in the current repository",
     "not available yet: the agent loop comes with issue 9", true},
    {"chat", FULL(cli_chat), "interactive session",
     "not available yet: the agent loop comes with issue 9", true},
    {"serve", FULL(cli_serve), "WebSocket JSON-RPC + OpenAI-compatible HTTP on one port",
     "not available yet: the server comes with issue 10", true},
    {"complete", cli_complete, "raw text completion of a prompt",
     "not available yet: generation comes with issue 3", false},
    {"model", cli_model, "generate, inspect and tokenize model files",
     "not available yet: model files come with issue 3", false},
    {"bench", cli_bench, "prefill/decode speed",
     "not available yet: the benchmark comes with issue 3", false},
    {"doctor", cli_doctor, "check this machine, the GPU, the sandbox and the model", NULL, false},
    {"sandbox", FULL(cli_sandbox), "run a command exactly as the agent would", NULL, true},
    {"tool", FULL(cli_tool), "run one repo tool", NULL, true},
    {"undo", FULL(cli_undo), "restore the last checkpoint", NULL, true},
    {"sessions", FULL(cli_sessions), "list sessions", "not available yet: sessions come with issue 9",
     true},
    {"version", cli_version, "print the version and build", NULL, false},
    {"help", NULL, "this help", NULL, false},
};

#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f, "usage: spark-agent <command> [options]\n\n"
               "A local coding agent on an in-process mixture-of-experts engine.\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s%s\n", commands[i].name, commands[i].summary,
                commands[i].fn || !strcmp(commands[i].name, "help") ? "" : "  (not available)");
    fprintf(f, "\n'spark-agent <command> --help' for a command's options. Exit status: 0 success, "
               "1 failure, 2 usage error, 125 sandbox refusal.\n");
}

int cli_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("spark-agent %s\n", engine_version());
    printf("build: %s%s\n", engine_build_info(),
#ifdef SPARK_FULL_BUILD
           ""
#else
           ", engine-only"
#endif
    );
    return CLI_EXIT_OK;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "-V")) return cli_version(0, NULL);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(commands[i].name, name) != 0) continue;
        if (!commands[i].fn) {
#ifndef SPARK_FULL_BUILD
            if (commands[i].full_only) {
                fprintf(stderr, "spark-agent %s: not in this build: it was built with "
                                "SPARK_ENGINE_ONLY=ON, without this module\n", name);
                return CLI_EXIT_USAGE;
            }
#endif
            fprintf(stderr, "spark-agent %s: %s\n", name, commands[i].missing);
            return CLI_EXIT_USAGE;
        }
        return commands[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "spark-agent: unknown command '%s'\n\n", name);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
