/* spark-agent serve: the OpenAI-compatible HTTP APIs and the WebSocket JSON-RPC protocol on one
 * port (agent_server_*). Settings: flags > SPARK_* environment > config file > defaults. The
 * start-up line on stdout names the URL; logs go to stderr. SIGTERM / SIGINT drain: running
 * requests get --drain-timeout seconds, then are cancelled, and the process exits 0. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

static agent_server *g_server; /* for the signal handler only */

static void on_signal(int sig) {
    (void)sig;
    if (g_server) agent_server_stop(g_server);
}

/* --exit-with-parent, stdin half: a pipe from the editor reads EOF once every copy of its write
 * end is closed, i.e. when the editor exits or dies (also through a wrapper script, which
 * PR_SET_PDEATHSIG does not see through). The signal path then drains as on SIGTERM. */
static void *stdin_watch(void *arg) {
    (void)arg;
    char buf[256];
    for (;;) {
        ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
        if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    kill(getpid(), SIGTERM);
    return NULL;
}

/* Tie the server's life to the process that started it (editor plugins): SIGTERM when the
 * parent dies (PR_SET_PDEATHSIG), and, when stdin is a pipe or socket, when it reaches EOF.
 * Returns 1 when the parent is already gone, -1 when a watch could not be set up. */
static int watch_parent(pid_t parent) {
    int rc = prctl(PR_SET_PDEATHSIG, SIGTERM) == 0 ? 0 : -1;
    /* the parent may have died before the prctl: we were re-parented already */
    if (getppid() != parent) return 1;
    struct stat st;
    if (fstat(STDIN_FILENO, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
        pthread_t t;
        if (pthread_create(&t, NULL, stdin_watch, NULL) != 0) return -1;
        pthread_detach(t);
    }
    return rc;
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: spark-agent serve [-m FILE] [--host ADDR] [--port N] [options]\n\n"
        "OpenAI-compatible HTTP (/v1/chat/completions, /v1/completions, /v1/models, /health,\n"
        "/metrics and the other dialects) and WebSocket JSON-RPC (/rpc) on one port.\n"
        "Every route needs the token (Authorization: Bearer TOKEN or x-api-key: TOKEN): from\n"
        "SPARK_API_KEY, else $XDG_CONFIG_HOME/spark-agent/token (created, mode 0600).\n\n"
        "  -m, --model FILE       model (default: SPARK_MODEL, config `model`, the tiny model)\n"
        "      --host ADDR        listen address (default 127.0.0.1; SPARK_HOST, serve.host)\n"
        "      --port N           port, 0 = any free one (default 8088; SPARK_PORT, serve.port)\n"
        "      --listen-public    allow a non-loopback --host\n"
        "      --allow-host H     also accept this Host header (repeatable; name:port)\n"
        "      --allow-origin O   accept browser requests from this Origin (repeatable)\n"
        "      --model-name NAME  the model's name in the API (default: the file's)\n"
        "  -t, --threads N        CPU threads (default: all; SPARK_THREADS, threads)\n"
        "      --device D         auto|cpu|cuda (SPARK_DEVICE, device)\n"
        "  -c, --ctx N            positions per request (default: the model's)\n"
        "      --max-seqs N       sequences decoded together (default 16)\n"
        "      --kv-cache MIB     KV pool of the prefix cache, shared by every request\n"
        "                         (SPARK_KV_CACHE, kv_cache; default auto: ctx x max-seqs)\n"
        "      --max-tokens N     default max_tokens of a chat request (default 512)\n"
        "      --max-body BYTES   request body limit (default 8 MiB)\n"
        "      --max-conns N      open connections per client address (default 64)\n"
        "      --idle-timeout S   idle connection timeout (default 60)\n"
        "      --drain-timeout S  on SIGTERM, wait this long for running requests (default "
        "10)\n"
        "      --exit-with-parent stop (as on SIGTERM) when the process that started serve\n"
        "                         exits, or when stdin (a pipe) closes: for editor plugins\n");
}

enum {
    OPT_HOST = 256,
    OPT_PORT,
    OPT_PUBLIC,
    OPT_ALLOW_HOST,
    OPT_ALLOW_ORIGIN,
    OPT_NAME,
    OPT_DEVICE,
    OPT_SEQS,
    OPT_MAXTOK,
    OPT_BODY,
    OPT_CONNS,
    OPT_IDLE,
    OPT_DRAIN,
    OPT_KV,
    OPT_PARENT,
};

#define MAX_ALLOW 32

int cli_serve(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"host", required_argument, 0, OPT_HOST},
        {"port", required_argument, 0, OPT_PORT},
        {"listen-public", no_argument, 0, OPT_PUBLIC},
        {"allow-host", required_argument, 0, OPT_ALLOW_HOST},
        {"allow-origin", required_argument, 0, OPT_ALLOW_ORIGIN},
        {"model-name", required_argument, 0, OPT_NAME},
        {"threads", required_argument, 0, 't'},
        {"device", required_argument, 0, OPT_DEVICE},
        {"ctx", required_argument, 0, 'c'},
        {"max-seqs", required_argument, 0, OPT_SEQS},
        {"max-tokens", required_argument, 0, OPT_MAXTOK},
        {"max-body", required_argument, 0, OPT_BODY},
        {"max-conns", required_argument, 0, OPT_CONNS},
        {"idle-timeout", required_argument, 0, OPT_IDLE},
        {"drain-timeout", required_argument, 0, OPT_DRAIN},
        {"kv-cache", required_argument, 0, OPT_KV},
        {"exit-with-parent", no_argument, 0, OPT_PARENT},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "serve";
    const char *model_flag = NULL, *host = NULL, *device = NULL, *kv_flag = NULL;
    const char *hosts[MAX_ALLOW + 1] = {0}, *origins[MAX_ALLOW + 1] = {0};
    int n_hosts = 0, n_origins = 0;
    long port = -1, threads = -1, n_ctx = 0, seqs = 0, maxtok = 0, conns = 0, idle = 0, drain = 0;
    long kv = -1;
    uint64_t body = 0;
    bool with_parent = false;
    pid_t parent = getppid();
    agent_server_opts so = AGENT_SERVER_OPTS_INIT;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:t:c:h", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm':
            model_flag = optarg;
            break;
        case OPT_HOST:
            host = optarg;
            break;
        case OPT_PORT:
            ok = cli_parse_long(optarg, 0, 65535, &port);
            break;
        case OPT_PUBLIC:
            so.listen_public = true;
            break;
        case OPT_ALLOW_HOST:
            ok = n_hosts < MAX_ALLOW;
            if (ok) hosts[n_hosts++] = optarg;
            break;
        case OPT_ALLOW_ORIGIN:
            ok = n_origins < MAX_ALLOW;
            if (ok) origins[n_origins++] = optarg;
            break;
        case OPT_NAME:
            so.model_name = optarg;
            break;
        case 't':
            ok = cli_parse_long(optarg, 1, 1024, &threads);
            break;
        case OPT_DEVICE:
            device = optarg;
            ok = engine_device_parse(optarg) >= 0;
            break;
        case 'c':
            ok = cli_parse_long(optarg, 16, INT32_MAX, &n_ctx);
            break;
        case OPT_SEQS:
            ok = cli_parse_long(optarg, 1, 1024, &seqs);
            break;
        case OPT_MAXTOK:
            ok = cli_parse_long(optarg, 1, INT32_MAX, &maxtok);
            break;
        case OPT_BODY:
            ok = cli_parse_u64(optarg, &body) && body >= 1024;
            break;
        case OPT_CONNS:
            ok = cli_parse_long(optarg, 1, 100000, &conns);
            break;
        case OPT_IDLE:
            ok = cli_parse_long(optarg, 1, 86400, &idle);
            break;
        case OPT_DRAIN:
            ok = cli_parse_long(optarg, 1, 86400, &drain);
            break;
        case OPT_KV:
            kv_flag = optarg;
            ok = cli_parse_kv_cache(optarg, &kv) && kv != 0;
            break;
        case OPT_PARENT:
            with_parent = true;
            break;
        case 'h':
            usage(stdout);
            return CLI_EXIT_OK;
        case ':':
            cli_errorf(cmd, "option %s needs a value", argv[optind - 1]);
            return CLI_EXIT_USAGE;
        default:
            cli_errorf(cmd, "unknown option '%s'", argv[optind - 1]);
            usage(stderr);
            return CLI_EXIT_USAGE;
        }
        if (!ok) {
            cli_errorf(cmd, "bad value '%s' for %s", optarg, argv[optind - 1]);
            return CLI_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        cli_errorf(cmd, "unexpected argument '%s'", argv[optind]);
        return CLI_EXIT_USAGE;
    }
    cli_config cfg;
    if (cli_config_load(&cfg) != 0) {
        cli_errorf(cmd, "%s", cfg.error);
        return CLI_EXIT_USAGE;
    }
    /* flags > SPARK_HOST / SPARK_PORT > config file (serve.host, serve.port) > defaults */
    const char *v;
    if (!host && (v = getenv("SPARK_HOST")) && *v) host = v;
    if (!host && cfg.serve_host[0]) host = cfg.serve_host;
    if (port < 0 && (v = getenv("SPARK_PORT")) && *v && !cli_parse_long(v, 0, 65535, &port)) {
        cli_errorf(cmd, "SPARK_PORT=%s: expected a port number", v);
        return CLI_EXIT_USAGE;
    }
    if (port < 0 && cfg.serve_port > 0) port = cfg.serve_port;
    so.host = host ? host : "127.0.0.1";
    so.port = port < 0 ? 8088 : (int)port;

    char token[256], token_path[4200];
    if (agent_server_token_load(token, sizeof token, token_path, sizeof token_path)) {
        cli_errorf(cmd, "token: %s", agent_error_last());
        return CLI_EXIT_FAIL;
    }
    char path[4096];
    if (cli_model_resolve(cmd, model_flag, &cfg, path, sizeof path) != 0) return CLI_EXIT_FAIL;
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = threads > 0 ? (int)threads : cfg.threads;
    mp.device = (engine_device)engine_device_parse(device ? device : cfg.device);
    if (n_ctx) mp.n_ctx = (int32_t)n_ctx;
    /* the KV type: SPARK_KV_TYPE > kv_type (config) > f16 */
    if (cli_kv_type_plan(cmd, NULL, &cfg, &mp)) return CLI_EXIT_USAGE;
    /* --kv-cache MiB > SPARK_KV_CACHE > kv_cache: the model's paged pool, which the scheduler
     * then shares (and engine_prefix_* could use); auto (and 0) leave the pool to the
     * scheduler, sized n_ctx x max_seqs and logged by it */
    if (!kv_flag) kv = cfg.kv_cache_mib;
    if (kv > 0) {
        mp.prefix_cache_bytes = (size_t)kv << 20;
        fprintf(stderr, "spark-agent serve: kv cache %ld MiB (%s), %s KV\n", kv,
                kv_flag ? "--kv-cache" : cfg.kv_cache_source, engine_kv_type_name(mp.kv_type));
    }
    engine_model *m = NULL;
    if (engine_model_load(&m, path, &mp)) {
        cli_errorf(cmd, "%s: %s", path, engine_error_last());
        return CLI_EXIT_FAIL;
    }
    so.token = token;
    so.allow_hosts = hosts;
    so.allow_origins = origins;
    so.max_body = (size_t)body;
    so.max_conns_per_client = (int)conns;
    so.max_tokens_default = (int)maxtok;
    so.idle_timeout_s = (int)idle;
    so.drain_timeout_s = (int)drain;
    so.max_seqs = (int32_t)seqs;
    so.n_ctx = (int32_t)n_ctx;
    agent_server *s = NULL;
    if (agent_server_new(&s, m, &so)) {
        cli_errorf(cmd, "%s", agent_error_last());
        engine_model_free(m);
        return CLI_EXIT_FAIL;
    }
    g_server = s;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* after the handler is installed: a parent already gone stops the server at once */
    int w = with_parent ? watch_parent(parent) : 0;
    if (w > 0) {
        fprintf(stderr, "spark-agent serve: the parent process is gone: stopping\n");
        agent_server_stop(s);
    } else if (w < 0) {
        fprintf(stderr, "spark-agent serve: warning: --exit-with-parent: %s\n", strerror(errno));
    }
    bool v6 = strchr(so.host, ':') != NULL;
    printf("spark-agent serve: listening on http://%s%s%s:%d (WebSocket ws://%s%s%s:%d/rpc); "
           "token %s\n",
           v6 ? "[" : "", so.host, v6 ? "]" : "", agent_server_port(s), v6 ? "[" : "", so.host,
           v6 ? "]" : "", agent_server_port(s), token_path[0] ? token_path : "from SPARK_API_KEY");
    fflush(stdout);
    int rc = agent_server_run(s);
    g_server = NULL;
    agent_server_free(s);
    engine_model_free(m);
    fprintf(stderr, "spark-agent serve: stopped\n");
    return rc ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
