/* Configuration: flags > environment (SPARK_*) > config file > defaults. The file is
 * $XDG_CONFIG_HOME/spark-agent/config (default ~/.config/spark-agent/config), lines of
 * `key = value`, `#` comments (not inside a JSON value: `key = {...}` runs to the line's end).
 * Unknown keys are an error so that typos do not go unnoticed. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void cli_errorf(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "spark-agent %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Shared by every command (declared in cli.h); here because config.c is linked wherever the
 * CLI helpers are, tests included. */
bool cli_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_kv_cache(const char *s, long *mib) {
    if (!strcmp(s, "auto")) {
        *mib = -1;
        return true;
    }
    return cli_parse_long(s, 0, 1L << 24, mib);
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
    return s;
}

static int set_str(char *dst, size_t cap, const char *v, char *src, size_t src_cap,
                   const char *origin) {
    if (strlen(v) >= cap) return -1;
    snprintf(dst, cap, "%s", v);
    if (src) snprintf(src, src_cap, "%s", origin);
    return 0;
}

/* `mcp.NAME = {...}`: appended to cfg->mcp_servers as "NAME": {...} (the value's JSON is
 * checked where it is used). Names: letters, digits, '_' and '-', at most 32 bytes, once. */
static int add_mcp(cli_config *cfg, const char *name, const char *val) {
    size_t nl = strlen(name);
    if (!nl || nl > 32 || val[0] != '{') return -1;
    for (const char *c = name; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '_' && *c != '-') return -1;
    char key[40];
    snprintf(key, sizeof key, "\"%s\":", name);
    if (strstr(cfg->mcp_servers, key)) return -1;
    size_t have = strlen(cfg->mcp_servers);
    int n = snprintf(cfg->mcp_servers + (have ? have - 1 : 0),
                     sizeof cfg->mcp_servers - (have ? have - 1 : 0), "%s%s%s}",
                     have ? "," : "{", key, val);
    if (n < 0 || (size_t)n >= sizeof cfg->mcp_servers - (have ? have - 1 : 0)) return -1;
    return 0;
}

static int parse_file(cli_config *cfg, FILE *f) {
    char line[8192];
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        /* '#' starts a comment, except inside a JSON value (`key = {...}` to the line's end) */
        char *s = trim(line), *eq0 = strchr(s, '=');
        char *hash = strchr(s, '#');
        if (hash && (!eq0 || hash < eq0 || *trim(eq0 + 1) != '{')) *hash = 0;
        s = trim(s);
        if (!*s) continue;
        char *eq = strchr(s, '=');
        if (!eq) goto bad;
        *eq = 0;
        char *key = trim(s), *val = trim(eq + 1);
        if (strcmp(key, "model") == 0) {
            if (set_str(cfg->model, sizeof cfg->model, val, cfg->model_source,
                        sizeof cfg->model_source, "config file") != 0)
                goto bad;
        } else if (strcmp(key, "device") == 0) {
            if (strcmp(val, "auto") && strcmp(val, "cpu") && strcmp(val, "cuda")) goto bad;
            set_str(cfg->device, sizeof cfg->device, val, cfg->device_source,
                    sizeof cfg->device_source, "config file");
        } else if (strcmp(key, "threads") == 0) {
            char *end;
            long t = strtol(val, &end, 10);
            if (*end || t < 0 || t > 4096) goto bad;
            cfg->threads = (int)t;
        } else if (strcmp(key, "sandbox") == 0) {
            if (strcmp(val, "required") == 0) cfg->sandbox_required = true;
            else if (strcmp(val, "off") == 0) cfg->sandbox_required = false;
            else goto bad;
        } else if (strcmp(key, "approval") == 0) {
            /* the mode name is checked by the agent commands (which know the modes) */
            if (set_str(cfg->approval, sizeof cfg->approval, val, NULL, 0, "") != 0) goto bad;
            snprintf(cfg->approval_source, sizeof cfg->approval_source, "%s:%d",
                     cfg->config_path, lineno);
        } else if (strcmp(key, "approval_rules") == 0) {
            if (val[0] != '{') goto bad;
            set_str(cfg->approval_rules_file, sizeof cfg->approval_rules_file, val, NULL, 0, "");
            cfg->approval_rules_line = lineno;
        } else if (strcmp(key, "kv_cache") == 0) {
            if (!cli_parse_kv_cache(val, &cfg->kv_cache_mib)) goto bad;
            snprintf(cfg->kv_cache_source, sizeof cfg->kv_cache_source, "config file");
        } else if (strcmp(key, "kv_type") == 0) {
            if ((cfg->kv_type = engine_kv_type_parse(val)) < 0) goto bad;
            snprintf(cfg->kv_type_source, sizeof cfg->kv_type_source, "config file");
        } else if (strcmp(key, "serve.host") == 0) {
            if (!*val || set_str(cfg->serve_host, sizeof cfg->serve_host, val, NULL, 0, ""))
                goto bad;
        } else if (strcmp(key, "serve.port") == 0) {
            char *end;
            long p = strtol(val, &end, 10);
            if (*end || p < 1 || p > 65535) goto bad;
            cfg->serve_port = (int)p;
        } else if (strncmp(key, "mcp.", 4) == 0) {
            if (add_mcp(cfg, key + 4, val) != 0) goto bad;
        } else {
            goto bad;
        }
    }
    return 0;
bad:
    snprintf(cfg->error, sizeof cfg->error, "%s:%d: cannot parse this line (keys: model, device "
             "= auto|cpu|cuda, threads, sandbox = required|off, approval = MODE, approval_rules "
             "= {JSON}, mcp.NAME = {JSON}, kv_cache = auto|MiB, kv_type = f16|f32|q8_0, serve.host, "
             "serve.port)",
             cfg->config_path, lineno);
    return -1;
}

int cli_config_load(cli_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->device, sizeof cfg->device, "auto");
    snprintf(cfg->device_source, sizeof cfg->device_source, "default");
    snprintf(cfg->model_source, sizeof cfg->model_source, "default");
    snprintf(cfg->approval_source, sizeof cfg->approval_source, "default");
    cfg->sandbox_required = true;
    cfg->kv_cache_mib = -1;
    snprintf(cfg->kv_cache_source, sizeof cfg->kv_cache_source, "default");
    cfg->kv_type = ENGINE_KV_F16;
    snprintf(cfg->kv_type_source, sizeof cfg->kv_type_source, "default");

    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    char path[4096] = "";
    if (xdg && *xdg) snprintf(path, sizeof path, "%s/spark-agent/config", xdg);
    else if (home && *home) snprintf(path, sizeof path, "%s/.config/spark-agent/config", home);
    int rc = 0;
    if (path[0]) {
        FILE *f = fopen(path, "r");
        if (f) {
            snprintf(cfg->config_path, sizeof cfg->config_path, "%s", path);
            rc = parse_file(cfg, f);
            fclose(f);
        } else if (errno != ENOENT) {
            snprintf(cfg->error, sizeof cfg->error, "%s: %s", path, strerror(errno));
            rc = -1;
        }
    }
    const char *v;
    if ((v = getenv("SPARK_MODEL")) && *v)
        set_str(cfg->model, sizeof cfg->model, v, cfg->model_source, sizeof cfg->model_source,
                "SPARK_MODEL");
    if ((v = getenv("SPARK_DEVICE")) && *v) {
        if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda")) {
            snprintf(cfg->error, sizeof cfg->error,
                     "SPARK_DEVICE=%s: expected auto, cpu or cuda", v);
            rc = -1;
        } else {
            set_str(cfg->device, sizeof cfg->device, v, cfg->device_source,
                    sizeof cfg->device_source, "SPARK_DEVICE");
        }
    }
    if ((v = getenv("SPARK_THREADS")) && *v) cfg->threads = atoi(v);
    if ((v = getenv("SPARK_KV_CACHE")) && *v) {
        if (!cli_parse_kv_cache(v, &cfg->kv_cache_mib)) {
            snprintf(cfg->error, sizeof cfg->error,
                     "SPARK_KV_CACHE=%.64s: expected auto or a size in MiB (0: off)", v);
            rc = -1;
        } else {
            snprintf(cfg->kv_cache_source, sizeof cfg->kv_cache_source, "SPARK_KV_CACHE");
        }
    }
    if ((v = getenv("SPARK_KV_TYPE")) && *v) {
        int t = engine_kv_type_parse(v);
        if (t < 0) {
            snprintf(cfg->error, sizeof cfg->error,
                     "SPARK_KV_TYPE=%.64s: expected f16, f32 or q8_0", v);
            rc = -1;
        } else {
            cfg->kv_type = t;
            snprintf(cfg->kv_type_source, sizeof cfg->kv_type_source, "SPARK_KV_TYPE");
        }
    }
    if ((v = getenv("SPARK_APPROVAL")) && *v) {
        if (set_str(cfg->approval, sizeof cfg->approval, v, cfg->approval_source,
                    sizeof cfg->approval_source, "SPARK_APPROVAL") != 0) {
            snprintf(cfg->error, sizeof cfg->error, "SPARK_APPROVAL=%.64s: unknown mode", v);
            rc = -1;
        }
    }
    if ((v = getenv("SPARK_APPROVAL_RULES")) && *v &&
        set_str(cfg->approval_rules_env, sizeof cfg->approval_rules_env, v, NULL, 0, "") != 0) {
        snprintf(cfg->error, sizeof cfg->error, "SPARK_APPROVAL_RULES: longer than %zu bytes",
                 sizeof cfg->approval_rules_env - 1);
        rc = -1;
    }
    return rc;
}
