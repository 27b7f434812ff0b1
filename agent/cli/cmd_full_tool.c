/* spark-agent tool NAME 'JSON' | tool --list: run one repo tool in the current directory. */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "tools.h"

static void tool_usage(FILE *f) {
    fprintf(f, "usage: spark-agent tool [--root DIR] [--no-checkpoint] NAME ['JSON'|-]\n"
               "       spark-agent tool --list [--grammar]   (the schemas, OpenAI 'tools' form)\n"
               "       spark-agent tool --schema NAME\n\n"
               "Runs one repo tool on the workspace (default: the current directory) and prints\n"
               "its JSON result. JSON '-' reads the arguments from stdin. Exit status: 0 success,\n"
               "1 the tool failed (its error JSON is printed), 2 usage error.\n\ntools:");
    for (size_t i = 0; tool_name(i); i++) fprintf(f, " %s", tool_name(i));
    fprintf(f, "\n");
}

static char *read_stdin(void) {
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    if (!b) return NULL;
    size_t r;
    while ((r = fread(b + n, 1, cap - n - 1, stdin)) > 0) {
        n += r;
        if (n + 1 == cap) {
            char *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                return NULL;
            }
            b = nb;
            cap *= 2;
        }
    }
    b[n] = '\0';
    return b;
}

int cli_tool(int argc, char **argv) {
    static const struct option opts[] = {
        {"list", no_argument, NULL, 'l'},      {"grammar", no_argument, NULL, 'g'},
        {"schema", required_argument, NULL, 's'}, {"root", required_argument, NULL, 'r'},
        {"no-checkpoint", no_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},      {NULL, 0, NULL, 0}};
    bool list = false, grammar = false, checkpoint = true;
    const char *schema = NULL, *root = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (c) {
        case 'l': list = true; break;
        case 'g': grammar = true; break;
        case 's': schema = optarg; break;
        case 'r': root = optarg; break;
        case 'n': checkpoint = false; break;
        case 'h': tool_usage(stdout); return CLI_EXIT_OK;
        default: tool_usage(stderr); return CLI_EXIT_USAGE;
        }
    }
    char *out = NULL;
    if (list || schema) {
        int rc = list ? tool_schemas_json(&out, grammar ? TOOL_FORMAT_GRAMMAR : TOOL_FORMAT_OPENAI)
                      : tool_schema_json(&out, schema);
        if (rc < 0) {
            cli_errorf("tool", "%s", tool_error_last());
            return rc == TOOL_ENOTFOUND ? CLI_EXIT_USAGE : CLI_EXIT_FAIL;
        }
        printf("%s\n", out);
        free(out);
        return CLI_EXIT_OK;
    }
    if (optind >= argc || argc - optind > 2) {
        tool_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *name = argv[optind];
    bool known = false;
    for (size_t i = 0; tool_name(i); i++) known = known || !strcmp(tool_name(i), name);
    if (!known) {
        cli_errorf("tool", "unknown tool '%s' ('spark-agent tool --help' lists them)", name);
        return CLI_EXIT_USAGE;
    }
    char *args = NULL;
    const char *json = optind + 1 < argc ? argv[optind + 1] : "{}";
    if (!strcmp(json, "-")) {
        if (!(args = read_stdin())) {
            cli_errorf("tool", "cannot read the arguments from stdin");
            return CLI_EXIT_FAIL;
        }
        json = args;
    }
    tool_options o = TOOL_OPTIONS_INIT;
    o.root = root;
    o.auto_checkpoint = checkpoint;
    o.result_cap = 1u << 20; /* a person or script reads this, not a model's context */
    tool_ctx *ctx = NULL;
    int rc = tool_ctx_new(&ctx, &o);
    if (rc < 0) {
        cli_errorf("tool", "%s", tool_error_last());
        free(args);
        return CLI_EXIT_FAIL;
    }
    rc = tool_call(ctx, name, json, &out);
    if (out) printf("%s\n", out);
    if (rc < 0) cli_errorf("tool", "%s: %s", name, tool_error_last());
    free(out);
    free(args);
    tool_ctx_free(ctx);
    if (rc == TOOL_EINVAL) return CLI_EXIT_USAGE;
    return rc < 0 ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
