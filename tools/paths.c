/* Path resolution beneath the workspace root: openat2(RESOLVE_BENEATH), else a walk with fds. */
#include "tool_int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int tool_path_clean(tool_ctx *ctx, const char *in, char **out_rel) {
    *out_rel = NULL;
    if (!in) return tool_err(TOOL_EINVAL, "path missing");
    if (strlen(in) > 4000) return tool_err(TOOL_EINVAL, "path too long");
    const char *p = in;
    if (*p == '/') {
        size_t rl = strlen(ctx->root);
        if (!strcmp(ctx->root, "/")) {
            p = in + 1;
        } else if (!strncmp(in, ctx->root, rl) && (in[rl] == '/' || in[rl] == '\0')) {
            p = in + rl;
        } else {
            return tool_err(TOOL_EPATH, "'%s' is outside the workspace %s", in, ctx->root);
        }
    }
    size_t n = strlen(p);
    char *out = malloc(n + 2);
    if (!out) return tool_err(TOOL_ENOMEM, "out of memory");
    size_t o = 0;
    while (*p) {
        while (*p == '/') p++;
        if (!*p) break;
        const char *e = strchr(p, '/');
        size_t cl = e ? (size_t)(e - p) : strlen(p);
        if (cl == 1 && p[0] == '.') {
            /* skip */
        } else if (cl == 2 && p[0] == '.' && p[1] == '.') {
            if (o == 0) {
                free(out);
                return tool_err(TOOL_EPATH, "'%s' climbs above the workspace root", in);
            }
            while (o > 0 && out[o - 1] != '/') o--;
            if (o > 0) o--;
        } else {
            if (memchr(p, '\0', cl)) break;
            if (o) out[o++] = '/';
            memcpy(out + o, p, cl);
            o += cl;
        }
        p += cl;
    }
    if (o == 0) out[o++] = '.';
    out[o] = '\0';
    *out_rel = out;
    return 0;
}

static int map_errno(int e, const char *rel) {
    switch (e) {
    case EXDEV:
        return tool_err(TOOL_EPATH, "'%s' leads outside the workspace", rel);
    case ENOENT:
        return tool_err(TOOL_ENOTFOUND, "'%s' does not exist", rel);
    case ELOOP:
        return tool_err(TOOL_EPATH, "'%s' is a symbolic link (or a link loop)", rel);
    case ENOTDIR:
        return tool_err(TOOL_ENOTFOUND, "a component of '%s' is not a directory", rel);
    case EISDIR:
        return tool_err(TOOL_EINVAL, "'%s' is a directory", rel);
    case EEXIST:
        return tool_err(TOOL_ECONFLICT, "'%s' already exists", rel);
    case EACCES:
    case EPERM:
        return tool_err(TOOL_EIO, "'%s': permission denied", rel);
    case ENOMEM:
        return tool_err(TOOL_ENOMEM, "out of memory opening '%s'", rel);
    default:
        return tool_err(TOOL_EIO, "'%s': %s", rel, strerror(e));
    }
}

/* The fallback walk: one component at a time with O_NOFOLLOW; symlinks are expanded by hand
 * (relative targets only; an absolute target is refused), ".." pops a stack of directory fds
 * and may never pop the starting directory. */
#define WALK_MAX_DEPTH 256
int tool_path_openat_walk(int dirfd, const char *rel, int flags, mode_t mode, bool nofollow) {
    int stack[WALK_MAX_DEPTH];
    int depth = 0;
    size_t cap = strlen(rel) + 1;
    char *rest = malloc(cap);
    if (!rest) return tool_err(TOOL_ENOMEM, "out of memory");
    memcpy(rest, rel, cap);
    int links = 0, rc = 0;
    stack[0] = dirfd;  /* borrowed: never closed */
    size_t pos = 0;
    for (;;) {
        while (rest[pos] == '/') pos++;
        if (!rest[pos]) { /* path ended on a directory: reopen it with the asked flags */
            int fd = openat(stack[depth], ".", flags | O_CLOEXEC, mode);
            rc = fd >= 0 ? fd : map_errno(errno, rel);
            break;
        }
        char *comp = rest + pos;
        char *slash = strchr(comp, '/');
        size_t cl = slash ? (size_t)(slash - comp) : strlen(comp);
        char name[256];
        if (cl >= sizeof name) {
            rc = tool_err(TOOL_EINVAL, "a component of '%s' is too long", rel);
            break;
        }
        memcpy(name, comp, cl);
        name[cl] = '\0';
        pos += cl;
        size_t after = pos;
        while (rest[after] == '/') after++;
        bool last = rest[after] == '\0';
        if (!strcmp(name, ".")) continue;
        if (!strcmp(name, "..")) {
            if (depth == 0) {
                rc = tool_err(TOOL_EPATH, "'%s' leads outside the workspace", rel);
                break;
            }
            close(stack[depth--]);
            continue;
        }
        struct stat st;
        if (fstatat(stack[depth], name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT && last && (flags & O_CREAT)) {
                int fd = openat(stack[depth], name, flags | O_CLOEXEC | O_NOFOLLOW, mode);
                rc = fd >= 0 ? fd : map_errno(errno, rel);
            } else {
                rc = map_errno(errno, rel);
            }
            break;
        }
        if (S_ISLNK(st.st_mode) && !(last && nofollow)) {
            if (++links > 40) {
                rc = map_errno(ELOOP, rel);
                break;
            }
            char target[4096];
            ssize_t tl = readlinkat(stack[depth], name, target, sizeof target - 1);
            if (tl <= 0) {
                rc = map_errno(tl < 0 ? errno : ENOENT, rel);
                break;
            }
            target[tl] = '\0';
            if (target[0] == '/') {
                rc = tool_err(TOOL_EPATH, "'%s' goes through a symbolic link to an absolute path",
                              rel);
                break;
            }
            size_t rl = strlen(rest + pos);
            char *nr = malloc((size_t)tl + rl + 2);
            if (!nr) {
                rc = tool_err(TOOL_ENOMEM, "out of memory");
                break;
            }
            memcpy(nr, target, (size_t)tl);
            nr[tl] = '/';
            memcpy(nr + tl + 1, rest + pos, rl + 1);
            free(rest);
            rest = nr;
            pos = 0;
            continue;
        }
        if (last) {
            int fd = openat(stack[depth], name, flags | O_CLOEXEC | O_NOFOLLOW, mode);
            rc = fd >= 0 ? fd : map_errno(errno, rel);
            break;
        }
        if (!S_ISDIR(st.st_mode)) {
            rc = map_errno(ENOTDIR, rel);
            break;
        }
        if (depth + 1 >= WALK_MAX_DEPTH) {
            rc = tool_err(TOOL_EINVAL, "'%s' is too deep", rel);
            break;
        }
        int d = openat(stack[depth], name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (d < 0) {
            rc = map_errno(errno, rel);
            break;
        }
        stack[++depth] = d;
    }
    while (depth > 0) close(stack[depth--]);
    free(rest);
    return rc;
}

int tool_path_openat_beneath(int dirfd, const char *rel, int flags, mode_t mode, bool nofollow) {
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = (uint64_t)(flags | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));
    how.mode = (flags & O_CREAT) ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
    if (fd >= 0) return (int)fd;
    if (errno == ENOSYS || errno == EPERM /* seccomp'd away */)
        return tool_path_openat_walk(dirfd, rel, flags, mode, nofollow);
    if (errno == EAGAIN) /* a concurrent rename raced the lookup: the walk is race-free too */
        return tool_path_openat_walk(dirfd, rel, flags, mode, nofollow);
    return map_errno(errno, rel);
}

int tool_path_open(tool_ctx *ctx, const char *rel, int flags, mode_t mode, bool nofollow) {
    return tool_path_openat_beneath(ctx->rootfd, rel, flags, mode, nofollow);
}

int tool_path_open_parent(tool_ctx *ctx, const char *rel, const char **base) {
    return tool_path_open_parent_at(ctx->rootfd, rel, base);
}

int tool_path_open_parent_at(int basefd, const char *rel, const char **base) {
    const char *slash = strrchr(rel, '/');
    *base = slash ? slash + 1 : rel;
    if (!**base || !strcmp(*base, ".") || !strcmp(*base, ".."))
        return tool_err(TOOL_EINVAL, "'%s' names no file", rel);
    if (!slash) return tool_path_openat_beneath(basefd, ".", O_RDONLY | O_DIRECTORY, 0, false);
    size_t dl = (size_t)(slash - rel);
    char *dir = strndup(rel, dl);
    if (!dir) return tool_err(TOOL_ENOMEM, "out of memory");
    int fd = tool_path_openat_beneath(basefd, dir, O_RDONLY | O_DIRECTORY, 0, false);
    free(dir);
    return fd;
}
