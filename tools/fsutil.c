/* Reading, atomic writing, binary detection and diffs of workspace files. */
#include "tool_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int tool_fd_read_all(int fd, size_t cap, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) return tool_err(TOOL_EIO, "stat: %s", strerror(errno));
    if (S_ISDIR(st.st_mode)) return tool_err(TOOL_EINVAL, "is a directory");
    if (!S_ISREG(st.st_mode)) return tool_err(TOOL_EINVAL, "not a regular file");
    if ((uint64_t)st.st_size > cap)
        return tool_err(TOOL_ETOOLARGE, "file is %lld bytes, over the %zu-byte cap",
                        (long long)st.st_size, cap);
    size_t want = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(want + 1);
    if (!buf) return tool_err(TOOL_ENOMEM, "out of memory");
    for (;;) {
        if (n == want) {
            if (want > cap) {
                free(buf);
                return tool_err(TOOL_ETOOLARGE, "file grew over the %zu-byte cap", cap);
            }
            want *= 2;
            char *nb = realloc(buf, want + 1);
            if (!nb) {
                free(buf);
                return tool_err(TOOL_ENOMEM, "out of memory");
            }
            buf = nb;
        }
        ssize_t r = read(fd, buf + n, want - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            free(buf);
            return tool_err(TOOL_EIO, "read: %s", strerror(errno));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    if (n > cap) {
        free(buf);
        return tool_err(TOOL_ETOOLARGE, "file is over the %zu-byte cap", cap);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

static int write_full(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int tool_file_write_atomic(tool_ctx *ctx, const char *rel, const char *data, size_t len,
                           mode_t mode, bool must_exist, bool must_not_exist) {
    return tool_file_write_atomic_at(ctx->rootfd, rel, data, len, mode, false, must_exist,
                                     must_not_exist);
}

int tool_file_write_atomic_at(int basefd, const char *rel, const char *data, size_t len,
                              mode_t mode, bool force_mode, bool must_exist,
                              bool must_not_exist) {
    const char *base;
    int dfd = tool_path_open_parent_at(basefd, rel, &base);
    if (dfd < 0) return dfd;
    int rc = 0, tfd = -1;
    char tmp[300];
    tmp[0] = '\0';
    struct stat st;
    if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (must_not_exist) {
            rc = tool_err(TOOL_ECONFLICT, "'%s' already exists", rel);
            goto done;
        }
        if (S_ISLNK(st.st_mode)) {
            rc = tool_err(TOOL_EPATH, "'%s' is a symbolic link; edit its target instead", rel);
            goto done;
        }
        if (!S_ISREG(st.st_mode)) {
            rc = tool_err(TOOL_EINVAL, "'%s' is not a regular file", rel);
            goto done;
        }
        if (!force_mode) mode = st.st_mode & 07777;
    } else if (errno != ENOENT) {
        rc = tool_err(TOOL_EIO, "'%s': %s", rel, strerror(errno));
        goto done;
    } else if (must_exist) {
        rc = tool_err(TOOL_ENOTFOUND, "'%s' does not exist", rel);
        goto done;
    }
    if (strlen(base) > 200) {
        rc = tool_err(TOOL_EINVAL, "file name too long");
        goto done;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    for (int attempt = 0; attempt < 100 && tfd < 0; attempt++) {
        snprintf(tmp, sizeof tmp, ".%s.spark-%ld-%lx%d.tmp", base, (long)getpid(),
                 (unsigned long)ts.tv_nsec, attempt);
        tfd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (tfd < 0 && errno != EEXIST) break;
    }
    if (tfd < 0) {
        tmp[0] = '\0';
        rc = tool_err(TOOL_EIO, "cannot create a temporary file beside '%s': %s", rel,
                      strerror(errno));
        goto done;
    }
    if (write_full(tfd, data, len) != 0 || fchmod(tfd, mode) != 0 || fsync(tfd) != 0) {
        rc = tool_err(TOOL_EIO, "writing '%s': %s", rel, strerror(errno));
        goto done;
    }
    close(tfd);
    tfd = -1;
    if (must_not_exist) {
        int r = renameat2(dfd, tmp, dfd, base, RENAME_NOREPLACE);
        if (r != 0 && (errno == EINVAL || errno == ENOSYS)) {
            /* no RENAME_NOREPLACE on this filesystem: a hard link fails the same way */
            r = linkat(dfd, tmp, dfd, base, 0);
            if (r == 0) unlinkat(dfd, tmp, 0);
        }
        if (r != 0) {
            rc = errno == EEXIST ? tool_err(TOOL_ECONFLICT, "'%s' already exists", rel)
                                 : tool_err(TOOL_EIO, "rename '%s': %s", rel, strerror(errno));
            goto done;
        }
    } else if (renameat(dfd, tmp, dfd, base) != 0) {
        rc = tool_err(TOOL_EIO, "rename '%s': %s", rel, strerror(errno));
        goto done;
    }
    tmp[0] = '\0';
    fsync(dfd);
done:
    if (tfd >= 0) close(tfd);
    if (tmp[0]) unlinkat(dfd, tmp, 0);
    close(dfd);
    return rc;
}

bool tool_is_binary(const char *data, size_t len) {
    size_t n = len < 8192 ? len : 8192;
    if (memchr(data, '\0', n)) return true;
    /* Invalid UTF-8 in most of the sample: some legacy encoding or binary data. Count bad
     * sequences; a few (Latin-1 names in comments) are tolerated. */
    size_t bad = 0;
    const unsigned char *p = (const unsigned char *)data, *e = p + n;
    while (p < e) {
        unsigned c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        int k = c >= 0xF0 && c <= 0xF4 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 && c < 0xE0 ? 1 : -1;
        if (k < 0) {
            bad++;
            p++;
            continue;
        }
        int j = 1;
        for (; j <= k && p + j < e; j++)
            if ((p[j] & 0xC0) != 0x80) break;
        if (j <= k && p + j < e) bad++;
        p += j;
    }
    return bad * 10 > n / 16 + 8;
}

int tool_diff_text(const char *path, const char *a, size_t alen, const char *b, size_t blen,
                   char **out) {
    *out = NULL;
    git_patch *patch = NULL;
    git_buf buf = {0};
    git_diff_options o;
    git_diff_options_init(&o, GIT_DIFF_OPTIONS_VERSION);
    o.context_lines = 3;
    o.flags = GIT_DIFF_FORCE_TEXT;
    int rc = git_patch_from_buffers(&patch, a, alen, path, b, blen, path, &o);
    if (rc < 0) return tool_err_git(rc, "diff");
    rc = git_patch_to_buf(&buf, patch);
    if (rc < 0) {
        git_patch_free(patch);
        return tool_err_git(rc, "diff");
    }
    const char *s = buf.ptr ? buf.ptr : "";
    /* git_patch_to_buf starts with a "diff --git" line: keep it, it names the file. */
    *out = strdup(s);
    git_buf_dispose(&buf);
    git_patch_free(patch);
    return *out ? 0 : tool_err(TOOL_ENOMEM, "out of memory");
}
