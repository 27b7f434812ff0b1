/* The server's token: SPARK_API_KEY, else $XDG_CONFIG_HOME/spark-agent/token, created on first
 * use with 32 random bytes in hex, mode 0600 (O_EXCL, so a concurrent start never
 * overwrites a token another server already handed out). A token file that others can read or write
 * is refused rather than used. */
#include "server_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static int mkdirs(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int rc = mkdir(path, 0700);
        *p = '/';
        if (rc && errno != EEXIST) return -1;
    }
    return mkdir(path, 0700) && errno != EEXIST ? -1 : 0;
}

static int read_token(const char *path, char *out, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT) return 1;
    if (fd < 0) return agent_err(AGENT_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return agent_err(AGENT_EIO, "%s: not a regular file", path);
    }
    if (st.st_mode & 077) {
        close(fd);
        return agent_err(AGENT_EIO, "%s: readable by others (mode %03o); run chmod 600 on it", path,
                         (unsigned)(st.st_mode & 0777));
    }
    char buf[512];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0) return agent_err(AGENT_EIO, "%s: %s", path, strerror(errno));
    buf[n] = 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        buf[--n] = 0;
    if (n < 16) return agent_err(AGENT_EIO, "%s: the token is shorter than 16 characters", path);
    if ((size_t)n >= cap) return agent_err(AGENT_EIO, "%s: the token is too long", path);
    memcpy(out, buf, (size_t)n + 1);
    return 0;
}

int agent_server_token_load(char *out, size_t cap, char *path_out, size_t path_cap) {
    if (path_out && path_cap) path_out[0] = 0;
    const char *env = getenv("SPARK_API_KEY");
    if (env && *env) {
        if (strlen(env) < 16 || strlen(env) >= cap)
            return agent_err(AGENT_EINVAL, "SPARK_API_KEY must have 16 to %zu characters", cap - 1);
        snprintf(out, cap, "%s", env);
        return 0;
    }
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    char dir[4096];
    if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s/spark-agent", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.config/spark-agent", home);
    else
        return agent_err(AGENT_EIO, "neither XDG_CONFIG_HOME nor HOME is set");
    char path[4200];
    snprintf(path, sizeof path, "%s/token", dir);
    if (path_out) snprintf(path_out, path_cap, "%s", path);
    int rc = read_token(path, out, cap);
    if (rc != 1) return rc;
    if (mkdirs(dir)) return agent_err(AGENT_EIO, "%s: %s", dir, strerror(errno));
    unsigned char rnd[32];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        return agent_err(AGENT_EIO, "no random bytes for the token: %s", strerror(errno));
    char tok[65];
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(tok + 2 * i, 3, "%02x", rnd[i]);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        if (errno == EEXIST) { /* another server created it meanwhile */
            rc = read_token(path, out, cap);
            return rc == 1 ? agent_err(AGENT_EIO, "%s: vanished", path) : rc;
        }
        return agent_err(AGENT_EIO, "%s: %s", path, strerror(errno));
    }
    size_t len = strlen(tok);
    tok[len] = '\n';
    bool ok = write(fd, tok, len + 1) == (ssize_t)(len + 1) && fsync(fd) == 0;
    close(fd);
    tok[len] = 0;
    if (!ok) {
        unlink(path);
        return agent_err(AGENT_EIO, "%s: cannot write the token", path);
    }
    if (cap <= len) return agent_err(AGENT_EINVAL, "token buffer too small");
    memcpy(out, tok, len + 1);
    return 0;
}
