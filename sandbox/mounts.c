/* The new root: planned in the caller (allocating, with error messages), carried out in the
 * init child (system calls only).
 *
 * The root is a small tmpfs mounted over the staging directory (the host's /tmp, hidden only
 * inside our mount namespace). System directories are bound into it read-only, then /proc,
 * /dev, /tmp, $HOME and the workspace; protected paths are bound read-only over themselves,
 * their directories pinned (a mount point cannot be renamed away, so `mv .git x; mkdir .git`
 * does not work); finally the root tmpfs turns read-only and becomes `/` with pivot_root. */
#include "sandbox_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

/* <linux/mount.h> clashes with <sys/mount.h> in glibc 2.36: the few names we need. */
struct sbx_mount_attr {
    uint64_t attr_set, attr_clr, propagation, userns_fd;
};
#define SBX_MOUNT_ATTR_RDONLY 0x1ULL
#define SBX_MOUNT_ATTR_NOSUID 0x2ULL
#define SBX_MOUNT_ATTR_NODEV 0x4ULL
#define SBX_MOUNT_ATTR_NOEXEC 0x8ULL
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif

static const char *const system_dirs[] = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
                                          "/libx32", "/etc"};
/* Files of /etc only root can read: masked, since a sandbox started by root runs as root. */
static const char *const etc_masked[] = {"/etc/shadow", "/etc/shadow-", "/etc/gshadow",
                                         "/etc/gshadow-", "/etc/sudoers", "/etc/security/opasswd",
                                         "/etc/ssl/private"};
static const char *const dev_nodes[] = {"null", "zero", "full", "random", "urandom"};
static const char *const default_protected[] = {".git/hooks", ".git/config"};

/* Is `path` equal to or below `dir`? Both absolute and normalised. */
static bool path_within(const char *path, const char *dir) {
    size_t n = strlen(dir);
    if (n == 1) return true; /* "/" */
    return !strncmp(path, dir, n) && (path[n] == 0 || path[n] == '/');
}

static sandbox_op *add_op(sandbox_plan *p, size_t cap, sandbox_op_kind kind, char *src,
                          char *dst, const char *data) {
    if (!dst || (kind != SANDBOX_OP_PIN && kind != SANDBOX_OP_TMPFS && kind != SANDBOX_OP_PROC &&
                 kind != SANDBOX_OP_REMOUNT_RO && kind != SANDBOX_OP_MASK && !src))
        return NULL;
    if (p->n_ops >= cap) return NULL;
    sandbox_op *op = &p->ops[p->n_ops++];
    op->kind = kind;
    op->src = src;
    op->dst = dst;
    op->data = data;
    /* Only a source below the staging directory is hidden by the new root's tmpfs (every
     * mount of the plan goes below it): the others are bound by name, saving an open, a close
     * and a lookup through /proc per mount. */
    op->host_src = (kind == SANDBOX_OP_BIND_RO || kind == SANDBOX_OP_BIND_RW ||
                    kind == SANDBOX_OP_DEVNODE) && path_within(src, p->stage);
    op->src_dir = kind == SANDBOX_OP_DEVNODE ? 0 : -1;
    op->src_fd = -1;
    return op;
}

/* The last op added: its source is (not) a directory, as the caller's lstat saw. */
static void known_dir(sandbox_plan *p, bool dir) {
    p->ops[p->n_ops - 1].src_dir = dir ? 1 : 0;
}

#define ADD(kind, src, dst, data)                                                              \
    do {                                                                                       \
        if (!add_op(p, cap, (kind), (src), (dst), (data)))                                     \
            return sandbox_err(SANDBOX_ENOMEM, "sandbox: out of memory planning the mounts");  \
    } while (0)

/* Placeholders: empty files of mode 0400 at a protected path that did not exist, covered by
 * /dev/null inside the sandbox. Concurrent runs in one workspace share them: each holds a
 * shared flock while it runs, and the last one (the one that gets the exclusive lock) removes
 * the file. */
#define PLACEHOLDER_MODE 0400

static bool is_placeholder(const struct stat *st) {
    return S_ISREG(st->st_mode) && st->st_size == 0 && (st->st_mode & 07777) == PLACEHOLDER_MODE;
}

/* 0: joined (or created) it; 1: this run holds it already; -errno. */
static int placeholder_join(const char *path, sandbox_placeholders *ph) {
    for (int i = 0; i < ph->n; i++)
        if (!strcmp(ph->paths[i], path)) return 1; /* this run has it already */
    if (ph->n >= (int)(sizeof ph->paths / sizeof ph->paths[0])) return -E2BIG;
    for (int tries = 0; tries < 16; tries++) {
        int fd = open(path, O_CREAT | O_EXCL | O_RDONLY | O_NOFOLLOW | O_CLOEXEC,
                      PLACEHOLDER_MODE);
        if (fd < 0 && errno == EEXIST) fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT) continue; /* removed by the run that owned it: again */
            return -errno;
        }
        struct stat a, b;
        if (flock(fd, LOCK_SH) != 0 || fstat(fd, &a) != 0) {
            int e = errno;
            close(fd);
            return -e;
        }
        if (!is_placeholder(&a)) {
            close(fd);
            return -EEXIST; /* a real file took its place */
        }
        if (lstat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
            if (!(ph->paths[ph->n] = strdup(path))) {
                close(fd);
                return -ENOMEM;
            }
            ph->fds[ph->n++] = fd;
            return 0;
        }
        close(fd); /* unlinked while we waited for the lock */
    }
    return -EAGAIN;
}

static size_t path_depth(const char *p) {
    size_t n = 0;
    for (; *p; p++) n += *p == '/';
    return n;
}

static int plan_protected(sandbox_plan *p, size_t cap, sandbox_strings *a, const char *ws,
                          const char *rel, sandbox_placeholders *ph) {
    if (!rel[0] || rel[0] == '/')
        return sandbox_err(SANDBOX_EINVAL, "sandbox: protected path '%s' must be relative to "
                                           "the workspace", rel);
    char cur[PATH_MAX];
    snprintf(cur, sizeof cur, "%s", ws);
    const char *s = rel;
    while (*s) {
        const char *e = strchr(s, '/');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n == 0 || (n == 1 && s[0] == '.')) {
            s += n + (e ? 1 : 0);
            continue;
        }
        if (n == 2 && s[0] == '.' && s[1] == '.')
            return sandbox_err(SANDBOX_EINVAL, "sandbox: protected path '%s' leaves the "
                                               "workspace", rel);
        size_t len = strlen(cur);
        if (len + 1 + n >= sizeof cur)
            return sandbox_err(SANDBOX_EINVAL, "sandbox: protected path '%s' too long", rel);
        cur[len] = '/';
        memcpy(cur + len + 1, s, n);
        cur[len + 1 + n] = 0;
        bool last = !e || !e[1];
        struct stat st;
        if (lstat(cur, &st) != 0) {
            if (errno != ENOENT)
                return sandbox_err(SANDBOX_ESPAWN, "sandbox: %s: %s", cur, strerror(errno));
            /* Missing: an empty placeholder blocks its creation for the run. */
            int rc = placeholder_join(cur, ph);
            if (rc < 0)
                return sandbox_err(SANDBOX_ESPAWN, "sandbox: cannot create the placeholder "
                                   "%s for a protected path: %s", cur, strerror(-rc));
            if (rc == 0) ADD(SANDBOX_OP_MASK, NULL, sandbox_strcat3(a, p->stage, cur, ""), NULL);
            return 0;
        }
        if (is_placeholder(&st)) { /* another run's, still in use: share it */
            int rc = placeholder_join(cur, ph);
            if (rc < 0)
                return sandbox_err(SANDBOX_ESPAWN, "sandbox: placeholder %s: %s", cur,
                                   strerror(-rc));
            if (rc == 0) ADD(SANDBOX_OP_MASK, NULL, sandbox_strcat3(a, p->stage, cur, ""), NULL);
            return 0;
        }
        if (S_ISLNK(st.st_mode)) {
            /* A symbolic link cannot be covered by a mount, and whoever may write its
             * directory may replace it: make the directory read-only instead. */
            char *dir = sandbox_strdup(a, cur);
            if (!dir) return sandbox_err(SANDBOX_ENOMEM, "sandbox: out of memory");
            *strrchr(dir, '/') = 0;
            char *d = sandbox_strcat3(a, p->stage, dir, "");
            ADD(SANDBOX_OP_BIND_RO, d, d, NULL);
            p->ops[p->n_ops - 1].host_src = false;
            known_dir(p, true);
            return 0;
        }
        char *d = sandbox_strcat3(a, p->stage, cur, "");
        if (last) {
            ADD(SANDBOX_OP_BIND_RO, d, d, NULL);
            p->ops[p->n_ops - 1].host_src = false;
            known_dir(p, S_ISDIR(st.st_mode));
            return 0;
        }
        if (!S_ISDIR(st.st_mode)) {
            /* Nothing can be created below a file as long as it stays one (a worktree's
             * `.git` file): keep it, read-only and impossible to replace. */
            for (size_t i = 0; i < p->n_ops; i++)
                if (p->ops[i].kind == SANDBOX_OP_BIND_RO && !strcmp(p->ops[i].dst, d)) return 0;
            ADD(SANDBOX_OP_BIND_RO, d, d, NULL);
            p->ops[p->n_ops - 1].host_src = false;
            known_dir(p, false);
            return 0;
        }
        bool pinned = false;
        for (size_t i = 0; i < p->n_ops; i++)
            if (p->ops[i].kind == SANDBOX_OP_PIN && !strcmp(p->ops[i].dst, d)) pinned = true;
        if (!pinned) ADD(SANDBOX_OP_PIN, NULL, d, NULL);
        s += n + (e ? 1 : 0);
    }
    return 0;
}

int sandbox_mounts_plan(sandbox_plan *p, sandbox_strings *a, const sandbox_policy *pol,
                        const char *ws, const char *home, sandbox_placeholders *ph) {
    size_t cap = 160; /* the fixed mounts need ~60; /etc/ssh host keys vary */
    for (const char *const *x = pol->extra_ro_paths; x && *x; x++) cap++;
    for (const char *const *x = pol->protected_paths; x && *x; x++) cap += 16;
    p->ops = calloc(cap, sizeof *p->ops);
    if (!p->ops) return sandbox_err(SANDBOX_ENOMEM, "sandbox: out of memory");
    p->n_ops = 0;
    /* The staging directory must not lie inside a tree we bind from the host: a recursive
     * bind of that tree would carry the new root's tmpfs along (a workspace of /tmp). */
    static const char *const stages[] = {"/tmp", "/mnt", "/run", "/var/tmp", "/media", "/srv"};
    p->stage = NULL;
    for (size_t i = 0; i < sizeof stages / sizeof stages[0] && !p->stage; i++) {
        struct stat st;
        if (lstat(stages[i], &st) != 0 || !S_ISDIR(st.st_mode) || path_within(stages[i], ws))
            continue;
        bool clash = false;
        for (const char *const *x = pol->extra_ro_paths; x && *x && !clash; x++) {
            char real[PATH_MAX];
            clash = realpath(*x, real) && path_within(stages[i], real);
        }
        if (!clash) p->stage = sandbox_strdup(a, stages[i]);
    }
    if (!p->stage)
        return sandbox_err(SANDBOX_ESPAWN, "sandbox: no directory to assemble the new root in "
                                           "(tried /tmp, /mnt, /run, /var/tmp, /media, /srv "
                                           "outside the workspace and the read-only paths)");
    const char *S = p->stage;
    ADD(SANDBOX_OP_TMPFS, NULL, sandbox_strdup(a, S), "mode=0755,size=1m");

    for (size_t i = 0; i < sizeof system_dirs / sizeof system_dirs[0]; i++) {
        struct stat st;
        if (lstat(system_dirs[i], &st) != 0) continue;
        if (S_ISLNK(st.st_mode)) {
            char target[PATH_MAX];
            ssize_t n = readlink(system_dirs[i], target, sizeof target - 1);
            if (n <= 0) continue;
            target[n] = 0;
            ADD(SANDBOX_OP_SYMLINK, sandbox_strdup(a, target),
                sandbox_strcat3(a, S, system_dirs[i], ""), NULL);
        } else if (S_ISDIR(st.st_mode)) {
            ADD(SANDBOX_OP_BIND_RO, sandbox_strdup(a, system_dirs[i]),
                sandbox_strcat3(a, S, system_dirs[i], ""), NULL);
            known_dir(p, true);
        }
    }
    for (size_t i = 0; i < sizeof etc_masked / sizeof etc_masked[0]; i++) {
        struct stat st;
        if (lstat(etc_masked[i], &st) != 0) continue;
        if (S_ISREG(st.st_mode))
            ADD(SANDBOX_OP_MASK, NULL, sandbox_strcat3(a, S, etc_masked[i], ""), NULL);
        else if (S_ISDIR(st.st_mode))
            ADD(SANDBOX_OP_TMPFS, NULL, sandbox_strcat3(a, S, etc_masked[i], ""),
                "mode=0755,size=4k");
    }
    DIR *d = opendir("/etc/ssh");
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t n = strlen(de->d_name);
            if (n > 4 && !strcmp(de->d_name + n - 4, "_key") && !strncmp(de->d_name, "ssh_", 4) &&
                !add_op(p, cap, SANDBOX_OP_MASK, NULL,
                        sandbox_strcat3(a, S, "/etc/ssh/", de->d_name), NULL)) {
                closedir(d);
                return sandbox_err(SANDBOX_ENOMEM, "sandbox: out of memory");
            }
        }
        closedir(d);
    }
    /* With the network on, name resolution must work: /etc/resolv.conf is often a link into
     * /run (systemd-resolved, NetworkManager), which the new root does not have. */
    char resolv[PATH_MAX];
    if (pol->network && realpath("/etc/resolv.conf", resolv) && !path_within(resolv, "/etc") &&
        !path_within(resolv, "/usr") && strrchr(resolv, '/') != resolv) {
        *strrchr(resolv, '/') = 0;
        ADD(SANDBOX_OP_BIND_RO, sandbox_strdup(a, resolv), sandbox_strcat3(a, S, resolv, ""),
            NULL);
        known_dir(p, true);
    }

    /* /proc of the new PID namespace, its sysctls read-only after pid_max is set. */
    sandbox_op *proc = add_op(p, cap, SANDBOX_OP_PROC, NULL, sandbox_strcat3(a, S, "/proc", ""),
                              NULL);
    if (!proc) return sandbox_err(SANDBOX_ENOMEM, "sandbox: out of memory");
    proc->src = sandbox_strcat3(a, S, "/proc/sys/kernel/pid_max", "");
    char *sys = sandbox_strcat3(a, S, "/proc/sys", "");
    ADD(SANDBOX_OP_BIND_RO, sys, sys, NULL);
    p->ops[p->n_ops - 1].host_src = false;
    known_dir(p, true);

    ADD(SANDBOX_OP_TMPFS, NULL, sandbox_strcat3(a, S, "/dev", ""), "mode=0755,size=64k");
    for (size_t i = 0; i < sizeof dev_nodes / sizeof dev_nodes[0]; i++)
        ADD(SANDBOX_OP_DEVNODE, sandbox_strcat3(a, "/dev/", dev_nodes[i], ""),
            sandbox_strcat3(a, S, "/dev/", dev_nodes[i]), NULL);
    ADD(SANDBOX_OP_SYMLINK, sandbox_strdup(a, "/proc/self/fd"),
        sandbox_strcat3(a, S, "/dev/fd", ""), NULL);
    static const char *const stdio[] = {"stdin", "stdout", "stderr"};
    for (int i = 0; i < 3; i++) {
        char target[32];
        snprintf(target, sizeof target, "/proc/self/fd/%d", i);
        ADD(SANDBOX_OP_SYMLINK, sandbox_strdup(a, target),
            sandbox_strcat3(a, S, "/dev/", stdio[i]), NULL);
    }
    char tmpfs_opts[64];
    uint64_t tmp_size = pol->memory_bytes ? pol->memory_bytes : (uint64_t)2 << 30;
    snprintf(tmpfs_opts, sizeof tmpfs_opts, "mode=1777,size=%llu", (unsigned long long)tmp_size);
    char *tmpopts = sandbox_strdup(a, tmpfs_opts);
    ADD(SANDBOX_OP_TMPFS, NULL, sandbox_strcat3(a, S, "/dev/shm", ""), tmpopts);
    ADD(SANDBOX_OP_REMOUNT_RO, NULL, sandbox_strcat3(a, S, "/dev", ""), NULL);
    if (!path_within(ws, "/var") && !path_within(home, "/var"))
        ADD(SANDBOX_OP_SYMLINK, sandbox_strdup(a, "/tmp"), sandbox_strcat3(a, S, "/var/tmp", ""),
            NULL);

    /* The user's trees, outer before inner whatever their kind: /tmp, $HOME (the workspace is
     * often inside it), the extra read-only paths (toolchains in $HOME; or trees around the
     * workspace), the workspace. */
    size_t first = p->n_ops;
    ADD(SANDBOX_OP_TMPFS, NULL, sandbox_strcat3(a, S, "/tmp", ""), tmpopts);
    ADD(SANDBOX_OP_TMPFS, NULL, sandbox_strcat3(a, S, home, ""), "mode=0700,size=256m");
    for (const char *const *x = pol->extra_ro_paths; x && *x; x++) {
        char real[PATH_MAX];
        if ((*x)[0] != '/' || !realpath(*x, real))
            return sandbox_err(SANDBOX_EINVAL, "sandbox: read-only path '%s': %s", *x,
                               (*x)[0] != '/' ? "not absolute" : strerror(errno));
        if (!strcmp(real, "/") || path_within(real, "/proc") || path_within(real, "/dev"))
            return sandbox_err(SANDBOX_EINVAL, "sandbox: read-only path '%s' is not allowed "
                                               "(it would expose the host)", *x);
        ADD(SANDBOX_OP_BIND_RO, sandbox_strdup(a, real), sandbox_strcat3(a, S, real, ""), NULL);
    }
    ADD(pol->fs_mode == SANDBOX_FS_READ_ONLY ? SANDBOX_OP_BIND_RO : SANDBOX_OP_BIND_RW,
        sandbox_strdup(a, ws), sandbox_strcat3(a, S, ws, ""), NULL);
    known_dir(p, true); /* (sandbox_run checked) */
    for (size_t i = first + 1; i < p->n_ops; i++) { /* stable insertion sort by depth */
        sandbox_op op = p->ops[i];
        size_t j = i;
        while (j > first && path_depth(p->ops[j - 1].dst) > path_depth(op.dst)) {
            p->ops[j] = p->ops[j - 1];
            j--;
        }
        p->ops[j] = op;
    }
    if (pol->fs_mode != SANDBOX_FS_READ_ONLY) {
        for (size_t i = 0; i < sizeof default_protected / sizeof default_protected[0]; i++) {
            int rc = plan_protected(p, cap, a, ws, default_protected[i], ph);
            if (rc) return rc;
        }
        for (const char *const *x = pol->protected_paths; x && *x; x++) {
            int rc = plan_protected(p, cap, a, ws, *x, ph);
            if (rc) return rc;
        }
    }
    ADD(SANDBOX_OP_REMOUNT_RO, NULL, sandbox_strdup(a, S), NULL);
    for (size_t i = 0; i < p->n_ops; i++)
        if (!p->ops[i].dst) return sandbox_err(SANDBOX_ENOMEM, "sandbox: out of memory");
    return 0;
}

void sandbox_placeholders_remove(sandbox_placeholders *ph) {
    for (int i = 0; i < ph->n; i++) {
        struct stat a, b;
        /* Only the last run using it removes it, and only while it is still our empty file
         * (the sandbox could not replace it: it was covered by a mount). */
        if (flock(ph->fds[i], LOCK_EX | LOCK_NB) == 0 && fstat(ph->fds[i], &a) == 0 &&
            lstat(ph->paths[i], &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev &&
            is_placeholder(&b))
            unlink(ph->paths[i]);
        close(ph->fds[i]);
        free(ph->paths[i]);
    }
    ph->n = 0;
}

/* ---------------------------------------------------------------------------------------------
 * In the init child: system calls only.
 * ------------------------------------------------------------------------------------------- */

/* The last directory mkdirs_n made or found (in the plan's strings, which stay put): the ops
 * come in path order, so most parents are the one before (the root, /dev). A directory of the
 * new root, once there, stays there: nothing of the plan removes one. */
typedef struct {
    const char *path;
    size_t len;
} dir_cache;

/* mkdir -p of path[0..len), walked in a copy on this child's stack: the plan's strings are
 * the caller's memory, copied page by page on a write (a fork), so the children only read them.
 * From the end: most paths of the plan need one mkdir, their parent exists (one system call
 * instead of one per component). */
static int mkdirs_n(dir_cache *dc, const char *path, size_t len) {
    if (dc->path && len <= dc->len && !memcmp(path, dc->path, len) &&
        (len == dc->len || dc->path[len] == '/'))
        return 0; /* it, or a directory below it, exists */
    char buf[PATH_MAX];
    if (len == 0 || len >= sizeof buf) return -ENAMETOOLONG;
    memcpy(buf, path, len);
    buf[len] = 0;
    char *end = buf + len, *cut = end;
    int rc = 0;
    for (;;) { /* up until a prefix exists or is made */
        if (mkdir(buf, 0755) == 0 || errno == EEXIST) break;
        if (errno != ENOENT) {
            rc = -errno;
            break;
        }
        char *slash = cut - 1;
        while (slash > buf && *slash != '/') slash--;
        if (slash <= buf) {
            rc = -ENOENT;
            break;
        }
        *slash = 0;
        cut = slash;
    }
    while (rc == 0 && cut < end) { /* down again */
        *cut = '/';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) rc = -errno;
        cut += sandbox_cstr_len(cut);
    }
    if (rc == 0) {
        dc->path = path;
        dc->len = len;
    }
    return rc;
}

static int mkdirs(dir_cache *dc, const char *path) {
    return mkdirs_n(dc, path, sandbox_cstr_len(path));
}

static int mkparent(dir_cache *dc, const char *path) {
    const char *slash = NULL;
    for (const char *c = path; *c; c++)
        if (*c == '/') slash = c;
    if (!slash || slash == path) return 0;
    return mkdirs_n(dc, path, (size_t)(slash - path));
}

/* An empty file to bind a non-directory on (mknod of a regular file: one system call). */
static int touch(dir_cache *dc, const char *path) {
    int rc = mkparent(dc, path);
    if (rc) return rc;
    if (mknod(path, S_IFREG | 0644, 0) != 0 && errno != EEXIST) return -errno;
    return 0;
}

static unsigned long statfs_flags(const char *path) {
    struct statfs sf;
    unsigned long f = 0;
    if (statfs(path, &sf) != 0 || !(sf.f_flags & 0x0020 /* ST_VALID */)) return 0;
    if (sf.f_flags & ST_NOSUID) f |= MS_NOSUID;
    if (sf.f_flags & ST_NODEV) f |= MS_NODEV;
    if (sf.f_flags & ST_NOEXEC) f |= MS_NOEXEC;
    if (sf.f_flags & ST_NOATIME) f |= MS_NOATIME;
    if (sf.f_flags & ST_NODIRATIME) f |= MS_NODIRATIME;
    if (sf.f_flags & ST_RELATIME) f |= MS_RELATIME;
    return f;
}

/* Set attributes on the mount at path (recursively when asked). mount_setattr() (Linux 5.12)
 * keeps the flags a user namespace may not clear; the fallback re-reads them for remount. */
static int set_attr(const char *path, uint64_t set, bool recursive) {
    struct sbx_mount_attr attr = {.attr_set = set};
    if (syscall(SYS_mount_setattr, AT_FDCWD, path, recursive ? AT_RECURSIVE : 0, &attr,
                sizeof attr) == 0)
        return 0;
    if (errno != ENOSYS) return -errno;
    unsigned long f = statfs_flags(path) | MS_BIND | MS_REMOUNT;
    if (set & SBX_MOUNT_ATTR_RDONLY) f |= MS_RDONLY;
    if (set & SBX_MOUNT_ATTR_NOSUID) f |= MS_NOSUID;
    if (set & SBX_MOUNT_ATTR_NODEV) f |= MS_NODEV;
    if (set & SBX_MOUNT_ATTR_NOEXEC) f |= MS_NOEXEC;
    return mount(NULL, path, NULL, f, NULL) == 0 ? 0 : -errno;
}

static int bind_path(dir_cache *dc, const char *src, int src_dir, const char *dst,
                     bool recursive) {
    if (src_dir < 0) {
        struct stat st;
        if (stat(src, &st) != 0) return -errno; /* through /proc/self/fd: the opened file */
        src_dir = S_ISDIR(st.st_mode);
    }
    int rc = src_dir ? mkdirs(dc, dst) : touch(dc, dst);
    if (rc) return rc;
    return mount(src, dst, NULL, MS_BIND | (recursive ? MS_REC : 0), NULL) == 0 ? 0 : -errno;
}

static int write_file(const char *path, const char *s) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    size_t n = sandbox_cstr_len(s);
    ssize_t w = write(fd, s, n);
    int e = errno;
    close(fd);
    return w == (ssize_t)n ? 0 : -(w < 0 ? e : EIO);
}

int sandbox_loopback_up(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -errno;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    int rc = ioctl(s, SIOCGIFFLAGS, &ifr);
    if (rc == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        rc = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    int e = errno;
    close(s);
    return rc == 0 ? 0 : -e;
}

/* "/proc/self/fd/N" without stdio. */
static void fd_path(char out[32], int fd) {
    char digits[12];
    int n = 0;
    do digits[n++] = (char)('0' + fd % 10);
    while ((fd /= 10) && n < 11);
    sandbox_cstr_copy(out, 32, "/proc/self/fd/", "", "");
    size_t len = sandbox_cstr_len(out);
    while (n) out[len++] = digits[--n];
    out[len] = 0;
}

int sandbox_mounts_apply(sandbox_plan *p, const char **what) {
    dir_cache dc = {NULL, 0};
    *what = "make / private";
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return -errno;
    /* Host sources first: the root tmpfs may hide them (a workspace below /tmp). */
    for (size_t i = 0; i < p->n_ops; i++) {
        sandbox_op *op = &p->ops[i];
        if (!op->host_src) continue;
        *what = op->src;
        op->src_fd = open(op->src, O_PATH | O_CLOEXEC);
        if (op->src_fd < 0) return -errno;
        fd_path(op->src_fd_path, op->src_fd);
    }
    for (size_t i = 0; i < p->n_ops; i++) {
        sandbox_op *op = &p->ops[i];
        const char *src = op->host_src ? op->src_fd_path : op->src;
        int rc = 0;
        *what = op->dst;
        switch (op->kind) {
        case SANDBOX_OP_BIND_RO:
        case SANDBOX_OP_BIND_RW:
            rc = bind_path(&dc, src, op->src_dir, op->dst, true);
            if (rc == 0)
                rc = set_attr(op->dst, SBX_MOUNT_ATTR_NOSUID | SBX_MOUNT_ATTR_NODEV |
                                           (op->kind == SANDBOX_OP_BIND_RO ? SBX_MOUNT_ATTR_RDONLY
                                                                           : 0), true);
            break;
        case SANDBOX_OP_PIN:
            rc = mount(op->dst, op->dst, NULL, MS_BIND, NULL) == 0 ? 0 : -errno;
            break;
        case SANDBOX_OP_MASK:
            rc = mount("/dev/null", op->dst, NULL, MS_BIND, NULL) == 0 ? 0 : -errno;
            if (rc == 0) rc = set_attr(op->dst, SBX_MOUNT_ATTR_RDONLY | SBX_MOUNT_ATTR_NOEXEC,
                                       false);
            break;
        case SANDBOX_OP_TMPFS:
            rc = mkdirs(&dc, op->dst);
            if (rc == 0 && mount("tmpfs", op->dst, "tmpfs", MS_NOSUID | MS_NODEV, op->data))
                rc = -errno;
            break;
        case SANDBOX_OP_SYMLINK:
            rc = mkparent(&dc, op->dst);
            if (rc == 0 && symlink(op->src, op->dst) != 0 && errno != EEXIST) rc = -errno;
            break;
        case SANDBOX_OP_DEVNODE:
            rc = bind_path(&dc, src, op->src_dir, op->dst, false);
            if (rc == 0) rc = set_attr(op->dst, SBX_MOUNT_ATTR_NOSUID | SBX_MOUNT_ATTR_NOEXEC,
                                       false);
            break;
        case SANDBOX_OP_PROC:
            rc = mkdirs(&dc, op->dst);
            if (rc == 0 && mount("proc", op->dst, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
                rc = -errno;
            /* The process cap of the namespace (per-namespace pid_max, Linux >= 6.14); older
             * kernels refuse it and RLIMIT_NPROC alone applies. */
            if (rc == 0 && p->pid_max[0]) (void)write_file(op->src, p->pid_max);
            break;
        case SANDBOX_OP_REMOUNT_RO:
            rc = set_attr(op->dst, SBX_MOUNT_ATTR_RDONLY, false);
            break;
        }
        if (rc) return rc;
        size_t dl = sandbox_cstr_len(op->dst);
        if (dc.path && dl < dc.len && dc.path[dl] == '/' && !memcmp(dc.path, op->dst, dl))
            dc.path = NULL; /* something was put over a parent of the known directory */
        if (op->src_fd >= 0) { /* (written only when set: see mkdirs_n) */
            close(op->src_fd);
            op->src_fd = -1;
        }
    }
    *what = "pivot_root";
    if (chdir(p->stage) != 0) return -errno;
    if (syscall(SYS_pivot_root, ".", ".") != 0) return -errno;
    if (umount2(".", MNT_DETACH) != 0) return -errno;
    if (chdir("/") != 0) return -errno;
    if (!p->network && p->ns_user_fd < 0) { /* a pooled namespace is set up already */
        *what = "bring up the loopback interface";
        int rc = sandbox_loopback_up();
        if (rc) return rc;
    }
    return 0;
}
