/* Landlock: the extra layer under the mounts. Read and execute everywhere in the new root,
 * write only beneath the writable trees of the plan; on ABI >= 6 signals and abstract UNIX
 * sockets are scoped to the sandbox. The system headers of Debian 12 predate ABI 4, so the
 * newer constants are spelled out here. */
#include "sandbox_int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef LANDLOCK_ACCESS_FS_REFER
#define LANDLOCK_ACCESS_FS_REFER (1ULL << 13)
#endif
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif
#ifndef LANDLOCK_ACCESS_FS_IOCTL_DEV
#define LANDLOCK_ACCESS_FS_IOCTL_DEV (1ULL << 15)
#endif
#define SBX_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)
#define SBX_SCOPE_SIGNAL (1ULL << 1)

/* struct landlock_ruleset_attr as of ABI 6; older kernels accept it when the newer fields are
 * zero. */
struct sbx_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};

int sandbox_landlock_abi(void) {
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    return abi > 0 ? (int)abi : 0;
}

#define FS_READ (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | \
                 LANDLOCK_ACCESS_FS_READ_DIR)
#define FS_WRITE_V1 (LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR | \
                     LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_DIR | \
                     LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_MAKE_SOCK | \
                     LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_SYM)
#define FS_DEVICES (LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_BLOCK)

/* The descriptors opened here (close-on-exec) are left to the command's execve to close, one
 * system call fewer each: the command is on its way to exec (or to _exit on a failure). */
static int add_rule(int ruleset, const char *path, uint64_t access) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct landlock_path_beneath_attr pb = {.allowed_access = access, .parent_fd = fd};
    long rc = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &pb, 0);
    return rc == 0 ? 0 : -errno;
}

/* In the command child, after no_new_privs. Returns the ABI enforced (> 0), 0 when landlock
 * is absent, or -errno with *what set. */
int sandbox_landlock_apply(const sandbox_plan *p, const char **what) {
    int abi = p->landlock_abi;
    if (abi <= 0) return 0;
    uint64_t write = FS_WRITE_V1;
    if (abi >= 2) write |= LANDLOCK_ACCESS_FS_REFER;
    if (abi >= 3) write |= LANDLOCK_ACCESS_FS_TRUNCATE;
    uint64_t handled = FS_READ | write | FS_DEVICES;
    if (abi >= 5) handled |= LANDLOCK_ACCESS_FS_IOCTL_DEV;
    struct sbx_ruleset_attr attr = {.handled_access_fs = handled};
    if (abi >= 6) attr.scoped = SBX_SCOPE_ABSTRACT_UNIX_SOCKET | SBX_SCOPE_SIGNAL;
    size_t attr_size = abi >= 6 ? sizeof attr : sizeof attr.handled_access_fs;
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, attr_size, 0);
    if (ruleset < 0) {
        *what = "landlock: create ruleset";
        return -errno;
    }
    int rc = add_rule(ruleset, "/", FS_READ);
    if (rc) *what = "landlock: rule for /";
    for (int i = 0; rc == 0 && i < p->n_ll_write; i++) {
        rc = add_rule(ruleset, p->ll_write[i], FS_READ | write);
        if (rc) *what = p->ll_write[i];
    }
    if (rc == 0 && p->ll_dev) {
        uint64_t dev = FS_READ | LANDLOCK_ACCESS_FS_WRITE_FILE;
        if (abi >= 3) dev |= LANDLOCK_ACCESS_FS_TRUNCATE;
        if (abi >= 5) dev |= LANDLOCK_ACCESS_FS_IOCTL_DEV;
        rc = add_rule(ruleset, p->ll_dev, dev);
        if (rc) *what = "landlock: rule for /dev";
    }
    if (rc == 0 && syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) {
        rc = -errno;
        *what = "landlock: restrict self";
    }
    return rc == 0 ? abi : rc; /* (the ruleset is close-on-exec too) */
}
