/* spark-agent sandbox: run one command exactly as the agent's tools would, so that users can
 * see what their build needs. Exit status: the command's, or 125 when the sandbox stopped or
 * refused it (the reason on stderr). */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sandbox.h"

extern char **environ;

static void usage(FILE *f) {
    fprintf(f,
            "usage: spark-agent sandbox [options] -- CMD [ARGS...]\n\n"
            "Run CMD isolated exactly as the agent runs build and test commands: new user, mount,\n"
            "PID, IPC, UTS and network namespaces, seccomp-bpf, landlock, resource limits.\n\n"
            "options:\n"
            "  --timeout S          wall-clock limit in seconds (default 60; 0 = none)\n"
            "  --network            keep the host network (default: loopback only)\n"
            "  --policy P           read-only | workspace-write (default workspace-write)\n"
            "  --memory BYTES       address-space limit (suffixes K, M, G)\n"
            "  --cpu S              CPU-time limit in seconds\n"
            "  --file-size BYTES    largest file the command may write\n"
            "  --processes N        process limit (default 512)\n"
            "  --output-cap BYTES   bytes kept per stream, head and tail (default 1M)\n"
            "  --workspace DIR      the writable tree (default: the enclosing git repository's\n"
            "                       root, as the agent uses it, else the current directory)\n"
            "  --ro PATH            also bind PATH read-only (toolchains); repeatable\n"
            "  --protect REL        keep REL (workspace-relative) read-only; repeatable\n"
            "  --unsandboxed        run WITHOUT isolation (limits and capture only); warns\n"
            "                       (with `sandbox = off` in the config, the same happens when\n"
            "                       this machine cannot isolate, as for the agent's tools)\n"
            "  -v, --verbose        print the stop reason, times and sizes to stderr\n\n"
            "Exit status: the command's; 125 when the sandbox stopped it (timeout, limits,\n"
            "output cap, a signal such as seccomp's SIGSYS) or refused to run it; 2 usage.\n");
}

static int parse_bytes(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || !isfinite(v)) return -1;
    double mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1024.0, end++;
    else if (*end == 'm' || *end == 'M') mul = 1048576.0, end++;
    else if (*end == 'g' || *end == 'G') mul = 1073741824.0, end++;
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (*end || v * mul >= 1.8e19) return -1;
    *out = (uint64_t)(v * mul);
    return 0;
}

static int parse_seconds(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v < 0 || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

enum { OPT_TIMEOUT = 256, OPT_NETWORK, OPT_POLICY, OPT_MEMORY, OPT_CPU, OPT_FSIZE, OPT_PROCS,
       OPT_OUTCAP, OPT_WORKSPACE, OPT_RO, OPT_PROTECT, OPT_UNSANDBOXED };

#define MAX_LIST 32

/* The agent works on the repository root: the nearest directory above cwd holding a .git. */
static void default_workspace(const char *cwd, char *out, size_t cap) {
    snprintf(out, cap, "%s", cwd);
    char probe[PATH_MAX + 8];
    for (;;) {
        snprintf(probe, sizeof probe, "%s/.git", out);
        if (access(probe, F_OK) == 0) return;
        char *slash = strrchr(out, '/');
        if (!slash || slash == out) break;
        *slash = 0;
    }
    snprintf(out, cap, "%s", cwd);
}

int cli_sandbox(int argc, char **argv) {
    static const struct option opts[] = {
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {"network", no_argument, 0, OPT_NETWORK},
        {"policy", required_argument, 0, OPT_POLICY},
        {"memory", required_argument, 0, OPT_MEMORY},
        {"cpu", required_argument, 0, OPT_CPU},
        {"file-size", required_argument, 0, OPT_FSIZE},
        {"processes", required_argument, 0, OPT_PROCS},
        {"output-cap", required_argument, 0, OPT_OUTCAP},
        {"workspace", required_argument, 0, OPT_WORKSPACE},
        {"ro", required_argument, 0, OPT_RO},
        {"protect", required_argument, 0, OPT_PROTECT},
        {"unsandboxed", no_argument, 0, OPT_UNSANDBOXED},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    const char *ro[MAX_LIST + 1] = {0}, *prot[MAX_LIST + 1] = {0};
    int n_ro = 0, n_prot = 0;
    bool verbose = false;
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) {
        cli_errorf("sandbox", "cannot read the current directory: %s", strerror(errno));
        return CLI_EXIT_SANDBOX;
    }
    char repo_root[PATH_MAX];
    default_workspace(cwd, repo_root, sizeof repo_root);
    const char *workspace = repo_root;
    int c;
    optind = 1;
    /* '+': stop at the first non-option, the command's own options are not ours. */
    while ((c = getopt_long(argc, argv, "+hv", opts, NULL)) != -1) {
        uint64_t bytes;
        double secs;
        switch (c) {
        case 'h': usage(stdout); return CLI_EXIT_OK;
        case 'v': verbose = true; break;
        case OPT_TIMEOUT:
            if (parse_seconds(optarg, &secs)) goto bad_value;
            pol.timeout_s = secs;
            break;
        case OPT_NETWORK: pol.network = true; break;
        case OPT_POLICY:
            if (!strcmp(optarg, "read-only")) pol.fs_mode = SANDBOX_FS_READ_ONLY;
            else if (!strcmp(optarg, "workspace-write")) pol.fs_mode = SANDBOX_FS_WORKSPACE_WRITE;
            else goto bad_value;
            break;
        case OPT_MEMORY:
            if (parse_bytes(optarg, &bytes) || !bytes) goto bad_value;
            pol.memory_bytes = bytes;
            break;
        case OPT_CPU:
            if (parse_seconds(optarg, &secs)) goto bad_value;
            pol.cpu_s = secs;
            break;
        case OPT_FSIZE:
            if (parse_bytes(optarg, &bytes) || !bytes) goto bad_value;
            pol.file_size_bytes = bytes;
            break;
        case OPT_PROCS: {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > 1 << 20) goto bad_value;
            pol.max_processes = (int)v;
            break;
        }
        case OPT_OUTCAP:
            if (parse_bytes(optarg, &bytes) || bytes < 64 || bytes > ((uint64_t)1 << 32))
                goto bad_value;
            pol.output_cap = (size_t)bytes;
            break;
        case OPT_WORKSPACE: workspace = optarg; break;
        case OPT_RO:
            if (n_ro == MAX_LIST) goto bad_value;
            ro[n_ro++] = optarg;
            break;
        case OPT_PROTECT:
            if (n_prot == MAX_LIST) goto bad_value;
            prot[n_prot++] = optarg;
            break;
        case OPT_UNSANDBOXED: pol.unsandboxed = true; break;
        default: usage(stderr); return CLI_EXIT_USAGE;
        }
        continue;
    bad_value:
        cli_errorf("sandbox", "bad value '%s' for %s", optarg, argv[optind - 1]);
        return CLI_EXIT_USAGE;
    }
    if (optind < argc && !strcmp(argv[optind], "--")) optind++;
    if (optind >= argc) {
        cli_errorf("sandbox", "no command given (usage: spark-agent sandbox [options] -- CMD "
                              "[ARGS...])");
        return CLI_EXIT_USAGE;
    }
    char ws_real[PATH_MAX];
    if (!realpath(workspace, ws_real)) {
        cli_errorf("sandbox", "workspace %s: %s", workspace, strerror(errno));
        return CLI_EXIT_USAGE;
    }
    pol.workspace = ws_real;
    pol.extra_ro_paths = n_ro ? ro : NULL;
    pol.protected_paths = n_prot ? prot : NULL;
    if (pol.unsandboxed)
        fprintf(stderr, "spark-agent sandbox: WARNING: running UNSANDBOXED as requested: the "
                        "command can read your secrets, reach the network and change any of "
                        "your files\n");

    /* As the agent's tools do: the network namespace comes from a pool (sandbox.h). */
    sandbox_netns_pool *pool = pol.network ? NULL : sandbox_netns_pool_new();
    if (!pol.network && !pool) {
        cli_errorf("sandbox", "%s", sandbox_error_last());
        return CLI_EXIT_SANDBOX;
    }
    pol.netns_pool = pool;
    sandbox_result r;
    int rc = sandbox_run(&r, &pol, (const char *const *)(argv + optind),
                         (const char *const *)environ, cwd);
    cli_config cfg;
    if (rc == SANDBOX_EUNAVAILABLE && cli_config_load(&cfg) == 0 && !cfg.sandbox_required) {
        /* What the agent does with `sandbox = off`: run anyway, and say so every time. */
        fprintf(stderr, "spark-agent sandbox: WARNING: running UNSANDBOXED (sandbox = off in %s): "
                        "%s\n", cfg.config_path, sandbox_error_last());
        pol.unsandboxed = true;
        rc = sandbox_run(&r, &pol, (const char *const *)(argv + optind),
                         (const char *const *)environ, cwd);
    }
    sandbox_netns_pool_free(pool); /* no run uses it any more */
    if (rc) {
        cli_errorf("sandbox", "refused: %s", sandbox_error_last());
        return rc == SANDBOX_EINVAL ? CLI_EXIT_USAGE : CLI_EXIT_SANDBOX;
    }
    fwrite(r.out.data, 1, r.out.len, stdout);
    fflush(stdout);
    fwrite(r.err.data, 1, r.err.len, stderr);
    int status;
    if (r.stopped != SANDBOX_STOP_NONE) {
        char sig[48] = "";
        if (r.signal) snprintf(sig, sizeof sig, " (signal %d, %s)", r.signal, strsignal(r.signal));
        cli_errorf("sandbox", "stopped by the sandbox: %s%s after %.2f s%s",
                   sandbox_stop_reason_name(r.stopped), sig, r.wall_s,
                   r.stopped == SANDBOX_STOP_MEMORY ? " (the command failed near its memory "
                                                      "limit)" : "");
        status = CLI_EXIT_SANDBOX;
    } else {
        status = r.exit_code;
    }
    if (r.out.truncated || r.err.truncated)
        cli_errorf("sandbox", "output truncated: stdout %llu bytes, stderr %llu bytes written",
                   (unsigned long long)r.out.total, (unsigned long long)r.err.total);
    if (verbose)
        fprintf(stderr, "spark-agent sandbox: %s%s, landlock ABI %d; exit %d, signal %d, "
                        "stop %s; wall %.3f s, user %.3f s, sys %.3f s, peak RSS %llu KiB\n",
                r.isolated ? "isolated" : "UNSANDBOXED",
                r.netns_pooled ? " (pooled network namespace)" : "", r.landlock_abi, r.exit_code,
                r.signal, sandbox_stop_reason_name(r.stopped), r.wall_s, r.user_s, r.sys_s,
                (unsigned long long)(r.peak_rss_bytes / 1024));
    sandbox_result_deinit(&r);
    return status;
}
