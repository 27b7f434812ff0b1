/* Configuration: flags > environment (SPARK_*) > config file > defaults. The file is
 * $XDG_CONFIG_HOME/spark-agent/config (default ~/.config/spark-agent/config), lines of
 * `key = value`, `#` comments. Unknown keys are an error so that typos do not go unnoticed. */
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

static int parse_file(cli_config *cfg, FILE *f) {
    char line[8192];
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *s = trim(line);
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
        } else {
            goto bad;
        }
    }
    return 0;
bad:
    snprintf(cfg->error, sizeof cfg->error, "%s:%d: cannot parse this line (keys: model, device "
             "= auto|cpu|cuda, threads, sandbox = required|off)", cfg->config_path, lineno);
    return -1;
}

int cli_config_load(cli_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->device, sizeof cfg->device, "auto");
    snprintf(cfg->device_source, sizeof cfg->device_source, "default");
    snprintf(cfg->model_source, sizeof cfg->model_source, "default");
    cfg->sandbox_required = true;

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
    return rc;
}
