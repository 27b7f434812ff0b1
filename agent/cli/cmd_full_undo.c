/* spark-agent undo: restore the newest checkpoint of the repository holding the current
 * directory (the one taken before the agent's first edit), or a named one. */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "tools.h"

int cli_undo(int argc, char **argv) {
    static const struct option opts[] = {{"list", no_argument, NULL, 'l'},
                                         {"root", required_argument, NULL, 'r'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    bool list = false;
    const char *root = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (c) {
        case 'l': list = true; break;
        case 'r': root = optarg; break;
        case 'h':
            printf("usage: spark-agent undo [--root DIR] [--list] [CHECKPOINT]\n\n"
                   "Puts the worktree, the index and HEAD back as they were at the newest\n"
                   "checkpoint (or CHECKPOINT, a number or ref from --list). Files created since\n"
                   "are removed unless git ignores them. The checkpoint is kept.\n");
            return CLI_EXIT_OK;
        default: return CLI_EXIT_USAGE;
        }
    }
    if (argc - optind > 1) {
        cli_errorf("undo", "too many arguments");
        return CLI_EXIT_USAGE;
    }
    tool_options o = TOOL_OPTIONS_INIT;
    o.root = root;
    o.auto_checkpoint = false;
    o.result_cap = 1u << 20;
    tool_ctx *ctx = NULL;
    if (tool_ctx_new(&ctx, &o) < 0) {
        cli_errorf("undo", "%s", tool_error_last());
        return CLI_EXIT_FAIL;
    }
    char *out = NULL;
    int rc;
    if (list) {
        rc = tool_call(ctx, "git_checkpoint", "{\"action\":\"list\"}", &out);
    } else {
        rc = tool_checkpoint_restore(ctx, optind < argc ? argv[optind] : NULL, &out);
    }
    if (rc < 0) {
        cli_errorf("undo", "%s", tool_error_last());
    } else if (out) {
        printf("%s\n", out);
    }
    free(out);
    tool_ctx_free(ctx);
    return rc < 0 ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
