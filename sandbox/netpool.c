/* The network namespace pool (sandbox.h): loopback-only network namespaces, each owned by a
 * user namespace of its own that maps only the caller's uid/gid, kept as namespace file
 * descriptors (no process holds them) and handed to one run at a time. */
#include "sandbox_int.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define POOL_KEEP 8 /* namespaces kept for reuse; more concurrent runs create and close theirs */

struct sandbox_netns_pool {
    pthread_mutex_t mu;
    int n;
    int user_fd[POOL_KEEP], net_fd[POOL_KEEP];
};

sandbox_netns_pool *sandbox_netns_pool_new(void) {
    sandbox_netns_pool *p = calloc(1, sizeof *p);
    if (!p) {
        sandbox_err(SANDBOX_ENOMEM, "sandbox_netns_pool_new: out of memory");
        return NULL;
    }
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        sandbox_err(SANDBOX_ENOMEM, "sandbox_netns_pool_new: cannot create a mutex");
        return NULL;
    }
    return p;
}

void sandbox_netns_pool_free(sandbox_netns_pool *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) {
        close(p->user_fd[i]);
        close(p->net_fd[i]);
    }
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static int write_str(const char *path, const char *s) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = sandbox_cstr_len(s);
    ssize_t w = write(fd, s, n);
    close(fd);
    return w == (ssize_t)n ? 0 : -1;
}

/* The holder: a raw clone of a possibly multi-threaded caller (system calls only). It maps its
 * ids, brings up lo, reports on `ready` and waits to be killed (or dies with the caller). */
static _Noreturn void holder(int ready, pid_t caller, const char *uid_map, const char *gid_map) {
    char ok = 0;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != caller) _exit(1);
    (void)write_str("/proc/self/setgroups", "deny");
    if (write_str("/proc/self/uid_map", uid_map) == 0 &&
        write_str("/proc/self/gid_map", gid_map) == 0 && sandbox_loopback_up() == 0)
        ok = 1;
    (void)!write(ready, &ok, 1);
    if (!ok) _exit(1);
    for (;;) pause();
}

static int create_pair(int *user_fd, int *net_fd) {
    char uid_map[64], gid_map[64];
    snprintf(uid_map, sizeof uid_map, "%u %u 1\n", (unsigned)geteuid(), (unsigned)geteuid());
    snprintf(gid_map, sizeof gid_map, "%u %u 1\n", (unsigned)getegid(), (unsigned)getegid());
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return sandbox_err(SANDBOX_ESPAWN, "sandbox: pipe: %s", strerror(errno));
    pid_t caller = getpid();
    /* Exit signal 0 and __WALL below: the caller's SIGCHLD handling is left alone. */
    pid_t pid = (pid_t)syscall(SYS_clone, (unsigned long)(CLONE_NEWUSER | CLONE_NEWNET), NULL,
                               NULL, NULL, 0);
    if (pid == 0) {
        close(pfd[0]);
        holder(pfd[1], caller, uid_map, gid_map);
    }
    int e = errno;
    close(pfd[1]);
    if (pid < 0) {
        close(pfd[0]);
        return sandbox_err(SANDBOX_EUNAVAILABLE, "sandbox: cannot create a network namespace "
                                                 "for the pool: %s", strerror(e));
    }
    char ok = 0;
    ssize_t r;
    while ((r = read(pfd[0], &ok, 1)) < 0 && errno == EINTR) {
    }
    close(pfd[0]);
    int rc = 0;
    *user_fd = *net_fd = -1;
    if (r != 1 || !ok) {
        rc = sandbox_err(SANDBOX_ESPAWN, "sandbox: setting up a pooled network namespace failed");
    } else {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
        *user_fd = open(path, O_RDONLY | O_CLOEXEC);
        snprintf(path, sizeof path, "/proc/%d/ns/net", (int)pid);
        *net_fd = open(path, O_RDONLY | O_CLOEXEC);
        if (*user_fd < 0 || *net_fd < 0) {
            rc = sandbox_err(SANDBOX_ESPAWN, "sandbox: %s: %s", path, strerror(errno));
            if (*user_fd >= 0) close(*user_fd);
            if (*net_fd >= 0) close(*net_fd);
            *user_fd = *net_fd = -1;
        }
    }
    /* Not reaped yet, so the pid cannot have been reused. */
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR) {
    }
    return rc;
}

int sandbox_netns_acquire(sandbox_netns_pool *p, int *user_fd, int *net_fd) {
    pthread_mutex_lock(&p->mu);
    if (p->n > 0) {
        p->n--;
        *user_fd = p->user_fd[p->n];
        *net_fd = p->net_fd[p->n];
        pthread_mutex_unlock(&p->mu);
        return 0;
    }
    pthread_mutex_unlock(&p->mu);
    return create_pair(user_fd, net_fd);
}

void sandbox_netns_release(sandbox_netns_pool *p, int user_fd, int net_fd, bool reusable) {
    if (user_fd < 0 || net_fd < 0) return;
    if (reusable) {
        pthread_mutex_lock(&p->mu);
        if (p->n < POOL_KEEP) {
            p->user_fd[p->n] = user_fd;
            p->net_fd[p->n] = net_fd;
            p->n++;
            pthread_mutex_unlock(&p->mu);
            return;
        }
        pthread_mutex_unlock(&p->mu);
    }
    close(user_fd);
    close(net_fd);
}
