/* spark-agent doctor: what a user needs to know before anything goes wrong. Every line is a
 * fact read from this machine; a problem is printed as "PROBLEM:" and makes the exit status 1
 * when the configuration asks for the missing thing. (A seeded lesson: an engine that silently
 * lost its GPU ran at a quarter speed for weeks - so the GPU line is never quiet.) */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine.h"

#ifdef SPARK_FULL_BUILD
#include <git2.h>
#include <jansson.h>
#include <libwebsockets.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <seccomp.h>
#include <tree_sitter/api.h>

#include "sandbox.h"
#endif

typedef struct {
    int problems; /* things the configuration asks for that are missing */
    int warnings;
} doctor_state;

__attribute__((format(printf, 2, 3))) static void problem(doctor_state *st, const char *fmt,
                                                          ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("  PROBLEM: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    st->problems++;
}

static void report_cpu(void) {
    engine_cpu_info c;
    engine_cpu_info_get(&c);
    printf("CPU: %s, %s, %d logical cores\n", c.model_name[0] ? c.model_name : "(model unknown)",
           c.arch, c.n_logical);
    printf("  features:");
    struct { const char *name; bool on; } f[] = {
        {"sse4.2", c.sse42}, {"avx", c.avx}, {"avx2", c.avx2}, {"fma", c.fma}, {"f16c", c.f16c},
        {"avx512f", c.avx512f}, {"avx512bw", c.avx512bw}, {"avx512vnni", c.avx512vnni},
        {"avx-vnni", c.avx_vnni}, {"neon", c.neon}, {"dotprod", c.dotprod}, {"i8mm", c.i8mm},
        {"sve", c.sve}};
    int any = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].on) printf(" %s", f[i].name), any = 1;
    printf("%s\n", any ? "" : " (none detected)");
    printf("  CPU kernels: %s\n", engine_cpu_simd_path());
}

static void report_gpu(doctor_state *st, const cli_config *cfg) {
    engine_gpu_info g;
    engine_gpu_info_get(&g);
    if (!g.backend_built) {
        printf("GPU: no GPU: generation will run on the CPU (%s)\n", g.status);
    } else if (g.n_devices == 0) {
        printf("GPU: no GPU: generation will run on the CPU (%s; CUDA runtime %d.%d)\n", g.status,
               g.runtime_version / 1000, (g.runtime_version % 1000) / 10);
    } else {
        printf("GPU: CUDA driver %d.%d, runtime %d.%d, %d device%s\n", g.driver_version / 1000,
               (g.driver_version % 1000) / 10, g.runtime_version / 1000,
               (g.runtime_version % 1000) / 10, g.n_devices, g.n_devices == 1 ? "" : "s");
        for (int i = 0; i < g.n_devices; i++) {
            const engine_gpu_device *d = &g.devices[i];
            double bw = d->mem_clock_khz && d->mem_bus_width_bits
                            ? 2.0 * d->mem_clock_khz * 1e3 * (d->mem_bus_width_bits / 8) / 1e9
                            : 0;
            printf("  [%d] %s, compute capability %d.%d, %.1f GiB (%.1f GiB free), %d SMs", i,
                   d->name, d->major, d->minor, d->total_mem / 1073741824.0,
                   d->free_mem / 1073741824.0, d->multiprocessors);
            if (bw > 0) printf(", ~%.0f GB/s peak memory bandwidth", bw);
            printf("\n");
        }
    }
    if (!strcmp(cfg->device, "cuda") && g.n_devices == 0) {
        problem(st, "device = cuda (from %s) but no GPU is usable", cfg->device_source);
    }
}

#ifdef SPARK_FULL_BUILD
static void report_sandbox(doctor_state *st, const cli_config *cfg) {
    sandbox_caps c;
    sandbox_caps_probe(&c);
    printf("Sandbox: user namespaces %s, mount %s, PID %s, network %s, seccomp %s, landlock %s",
           c.user_namespaces ? "yes" : "NO", c.mount_namespaces ? "yes" : "NO",
           c.pid_namespaces ? "yes" : "NO", c.net_namespaces ? "yes" : "NO",
           c.seccomp_filter ? "yes" : "NO", c.landlock_abi ? "yes" : "no");
    if (c.landlock_abi) printf(" (ABI %d)", c.landlock_abi);
    printf("\n");
    bool usable = c.user_namespaces && c.mount_namespaces && c.pid_namespaces &&
                  c.net_namespaces && c.seccomp_filter;
    if (usable) {
        /* Each feature exists; now prove the whole set-up works, as a tool would use it. */
        int landlock = 0;
        double ms = 0;
        if (sandbox_self_test(&landlock, &ms) == 0) {
            printf("  a test command ran isolated in %.1f ms; landlock %s\n", ms,
                   landlock ? "enforced" : "not applied (kernel without it)");
        } else {
            usable = false;
            snprintf(c.detail, sizeof c.detail, "%s", sandbox_error_last());
        }
    }
    if (!usable && cfg->sandbox_required)
        problem(st, "the sandbox cannot isolate commands here (%s); build and test tools will "
                    "refuse to run unless you set `sandbox = off` in the config",
                c.detail);
    else if (!usable)
        printf("  warning: sandbox = off in the config: tool commands run UNSANDBOXED\n");
}

static void report_libraries(void) {
    int maj, min, rev;
    git_libgit2_version(&maj, &min, &rev);
    const struct scmp_version *sv = seccomp_version();
    char pcre[64] = "";
    pcre2_config(PCRE2_CONFIG_VERSION, pcre);
    printf("Libraries: jansson %s, libgit2 %d.%d.%d, libwebsockets %s, libseccomp %u.%u.%u, "
           "pcre2 %s, tree-sitter language ABI %d-%d\n",
           jansson_version_str(), maj, min, rev, lws_get_library_version(), sv->major, sv->minor,
           sv->micro, pcre, TREE_SITTER_MIN_COMPATIBLE_LANGUAGE_VERSION,
           TREE_SITTER_LANGUAGE_VERSION);
}
#endif

/* $XDG_CACHE_HOME/spark-agent/<sub> (else ~/.cache/spark-agent/<sub>), as the engine names its
 * cache directories; "" when neither variable gives a directory. */
static void cache_dir(char *dir, size_t cap, const char *sub) {
    const char *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    dir[0] = '\0';
    if (cache && cache[0] == '/') snprintf(dir, cap, "%s/spark-agent/%s", cache, sub);
    else if (home && *home) snprintf(dir, cap, "%s/.cache/spark-agent/%s", home, sub);
}

/* The prefix cache: the KV pool and type the engine commands will use, and the persisted
 * prefixes (engine_prefix_default_path's directory: what `run` saves of the agent's system
 * block). Doctor only reads: a missing directory is reported, not created. */
static void report_prefix_cache(const cli_config *cfg) {
    if (cfg->kv_cache_mib < 0)
        printf("Prefix cache: KV pool auto (ctx positions + 2 blocks; from %s), ",
               cfg->kv_cache_source);
    else if (cfg->kv_cache_mib == 0)
        printf("Prefix cache: OFF (kv_cache = 0 from %s), ", cfg->kv_cache_source);
    else
        printf("Prefix cache: KV pool %ld MiB (from %s), ", cfg->kv_cache_mib,
               cfg->kv_cache_source);
    printf("%s KV (from %s)\n",
           engine_kv_type_name((engine_kv_type)cfg->kv_type), cfg->kv_type_source);
    char dir[4096];
    cache_dir(dir, sizeof dir, "prefixes");
    if (!dir[0]) {
        printf("  persisted prefixes: no cache directory (HOME and XDG_CACHE_HOME unset)\n");
        return;
    }
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) printf("  persisted prefixes: %s (none yet)\n", dir);
        else printf("  warning: persisted prefixes: %s: %s\n", dir, strerror(errno));
        return;
    }
    long n = 0, other = 0;
    unsigned long long bytes = 0;
    char path[4400];
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        size_t len = strlen(e->d_name);
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (len > 4 && !strcmp(e->d_name + len - 4, ".kvp")) {
            n++;
            bytes += (unsigned long long)sb.st_size;
        } else {
            other++; /* e.g. the temporary of a save that was killed */
        }
    }
    closedir(d);
    printf("  persisted prefixes: %s: %ld file%s, %.1f MiB", dir, n, n == 1 ? "" : "s",
           bytes / 1048576.0);
    if (other) printf(" (and %ld other file%s)", other, other == 1 ? "" : "s");
    printf("\n");
}

/* Load the model the configuration names (or the cached default) the way `complete` would, and
 * say what it is; a model that is configured but does not load is a problem. */
static void report_model(doctor_state *st, const cli_config *cfg) {
    char path[4096];
    const char *source = cfg->model_source;
    printf("Model: embedded Qwen3 tokenizer %s\n",
           engine_model_gen_tokenizer_embedded() ? "present (the default model can be made)"
                                                 : "ABSENT (build without tests/node_modules)");
    if (!cfg->model[0]) {
        /* The default model is generated on first use; doctor reports, it does not generate. */
        char dir[4096];
        cache_dir(dir, sizeof dir, "models");
        printf("  configured: the embedded default (tiny random-weight Qwen3-MoE, made on first "
               "use in %s)\n", dir[0] ? dir : "(no cache directory: HOME unset)");
        if (!engine_model_gen_tokenizer_embedded())
            problem(st, "no model configured and no embedded tokenizer to make the default: "
                        "set SPARK_MODEL or `model =` in the config");
        return;
    }
    snprintf(path, sizeof path, "%s", cfg->model);
    printf("  configured: %s (from %s)\n", path, source);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        problem(st, "model %s (from %s): %s", path, source, strerror(errno));
        return;
    }
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    int dev = engine_device_parse(cfg->device);
    mp.device = dev < 0 ? ENGINE_DEVICE_AUTO : (engine_device)dev;
    mp.n_threads = cfg->threads;
    engine_model *m = NULL;
    int rc = engine_model_load(&m, path, &mp);
    if (rc != 0) {
        problem(st, "model %s does not load: %s", path, engine_error_last());
        return;
    }
    engine_model_info mi;
    engine_model_info_get(m, &mi);
    printf("  loads: %s, %d layers, %.2f B parameters (%.2f B active per token), %s weights, "
           "%.2f GiB, vocab %d, context %d (trained %d), runs on %s with %d threads, chat "
           "template %s\n",
           mi.arch, mi.n_layer, mi.n_params / 1e9, mi.n_params_active / 1e9, mi.weight_type,
           mi.file_size / 1073741824.0, mi.n_vocab, mi.n_ctx, mi.n_ctx_train,
           engine_device_name(mi.device), mi.n_threads,
           engine_model_chat_template(m) ? "present" : "ABSENT");
    engine_model_free(m);
}

int cli_doctor(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            printf("usage: spark-agent doctor\n\nReport the CPU, GPUs, sandbox support, library "
                   "versions, the configured model and the prefix cache.\nExit status 1 when something the "
                   "configuration asks for is missing.\n");
            return CLI_EXIT_OK;
        }
        return CLI_EXIT_USAGE;
    }
    doctor_state st = {0};
    cli_config cfg;
    int cfg_rc = cli_config_load(&cfg);
    printf("spark-agent %s (%s)\n", engine_version(), engine_build_info());
    printf("Config: %s; device = %s (%s)\n", cfg.config_path[0] ? cfg.config_path : "no config file",
           cfg.device, cfg.device_source);
    if (cfg_rc != 0) problem(&st, "%s", cfg.error);
    report_cpu();
    report_gpu(&st, &cfg);
#ifdef SPARK_FULL_BUILD
    report_sandbox(&st, &cfg);
    report_libraries();
#else
    printf("Sandbox: not in this build (engine-only)\n");
#endif
    report_model(&st, &cfg);
    report_prefix_cache(&cfg);
    if (st.problems) {
        printf("%d problem%s found.\n", st.problems, st.problems == 1 ? "" : "s");
        return CLI_EXIT_FAIL;
    }
    printf("All checks passed.\n");
    return CLI_EXIT_OK;
}
