/* The network namespace pool (sandbox_netns_pool): runs reuse a namespace one after the other,
 * never at the same time, and nothing of one command reaches the next: not its /tmp, not its
 * processes, not its listening sockets, not a change to the loopback interface. A run that was
 * killed does not give its namespace back.
 * `test_sandbox_pool child ...` is this executable re-run inside the sandbox. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sbx_util.h"

#define PORT 47613

static int listen_on(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 4) != 0) return -1;
    return s;
}

static int connect_to(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = s >= 0 ? connect(s, (struct sockaddr *)&a, sizeof a) : -1;
    int e = errno;
    if (s >= 0) close(s);
    errno = e;
    return rc;
}

static int child(int argc, char **argv) {
    if (argc < 1) return 2;
    const char *m = argv[0];
    if (!strcmp(m, "netns")) { /* print the network namespace; optionally sleep (ms) */
        char link[64];
        ssize_t n = readlink("/proc/self/ns/net", link, sizeof link - 1);
        if (n <= 0) return 3;
        link[n] = 0;
        printf("%s\n", link);
        fflush(stdout);
        if (argc > 1) usleep((useconds_t)atoi(argv[1]) * 1000);
        return 0;
    }
    if (!strcmp(m, "write-tmp")) {
        FILE *f = fopen("/tmp/pool-marker", "w");
        if (!f) return 3;
        fclose(f);
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/pool-home-marker", getenv("HOME"));
        f = fopen(p, "w");
        if (!f) return 3;
        fclose(f);
        return 0;
    }
    if (!strcmp(m, "check-tmp")) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/pool-home-marker", getenv("HOME"));
        return access("/tmp/pool-marker", F_OK) == 0 || access(p, F_OK) == 0 ? 1 : 0;
    }
    if (!strcmp(m, "leave-behind")) { /* a listener and a sleeper outlive the command */
        int s = listen_on(PORT);
        if (s < 0) return 3;
        if (connect_to(PORT) != 0) return 4; /* loopback works */
        pid_t p = fork();
        if (p == 0) {
            setsid();
            sleep(30); /* holds the listening socket */
            _exit(0);
        }
        return p > 0 ? 0 : 5;
    }
    if (!strcmp(m, "see-nothing")) {
        /* Exit 0 when no process but init (1) and this one is visible, the port is refused,
         * and it can be bound again. */
        int others = 0;
        DIR *d = opendir("/proc");
        if (!d) return 3;
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] >= '1' && e->d_name[0] <= '9' && atoi(e->d_name) != 1 &&
                atoi(e->d_name) != (int)getpid())
                others++;
        closedir(d);
        if (others) return 10 + others;
        if (connect_to(PORT) == 0 || errno != ECONNREFUSED) return 4;
        int s = listen_on(PORT); /* the port is free again */
        if (s < 0 || connect_to(PORT) != 0) return 5;
        return 0;
    }
    if (!strcmp(m, "lo-down")) { /* exit 0 when lo cannot be taken down */
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        struct ifreq ifr;
        memset(&ifr, 0, sizeof ifr);
        memcpy(ifr.ifr_name, "lo", 3);
        if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0) return 3;
        if (!(ifr.ifr_flags & IFF_UP)) return 4;
        ifr.ifr_flags &= (short)~IFF_UP;
        return ioctl(s, SIOCSIFFLAGS, &ifr) == 0 ? 1 : 0;
    }
    return 2;
}

static char self[PATH_MAX], self_dir[PATH_MAX], root[PATH_MAX - 64], ws[PATH_MAX], home[PATH_MAX];
static sandbox_netns_pool *pool;

static int run(sandbox_result *r, const char *const *argv, double timeout_s) {
    const char *ro[] = {self_dir, NULL};
    sandbox_policy pol = SANDBOX_POLICY_INIT;
    pol.extra_ro_paths = ro;
    pol.workspace = ws;
    pol.netns_pool = pool;
    if (timeout_s > 0) pol.timeout_s = timeout_s;
    int rc = sandbox_run(r, &pol, argv, sbx_env(home, NULL), NULL);
    if (rc) printf("  sandbox_run: %d %s\n", rc, sandbox_error_last());
    return rc;
}

/* The namespace a command printed ("net:[N]"), "" on failure. */
static void run_netns(char *out, size_t cap, const char *sleep_ms, double timeout_s) {
    sandbox_result r;
    out[0] = 0;
    if (run(&r, (const char *[]){self, "child", "netns", sleep_ms, NULL}, timeout_s)) return;
    if (r.out.len > 0 && r.out.len < cap) {
        memcpy(out, r.out.data, r.out.len);
        out[r.out.len - 1] = 0;
    }
    sandbox_result_deinit(&r);
}

/* While a timed-out run sleeps, open its network namespace from the host (/proc/PID/ns/net of
 * the command, found by its "3000" argument) and keep the descriptor: the kernel recycles a
 * freed namespace's inode number, so without a reference a NEW namespace may show the number of
 * a dropped one and look "reused". Returns the descriptor, or -1 when none could be opened (the
 * check then still runs, without that guard). */
typedef struct {
    int fd;
} ns_hold;

static void *ns_hold_worker(void *arg) {
    ns_hold *h = arg;
    h->fd = -1;
    for (int tries = 0; tries < 200 && h->fd < 0; tries++) {
        DIR *d = opendir("/proc");
        if (!d) return NULL;
        struct dirent *de;
        while (h->fd < 0 && (de = readdir(d))) {
            if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
            char path[300], buf[4096];
            snprintf(path, sizeof path, "/proc/%s/cmdline", de->d_name);
            long n = sbx_read_file(path, buf, sizeof buf);
            static const char want[] = "netns\0" "3000";
            for (long i = 0; n > 0 && i + (long)sizeof want - 1 <= n; i++)
                if (!memcmp(buf + i, want, sizeof want - 1)) {
                    snprintf(path, sizeof path, "/proc/%s/ns/net", de->d_name);
                    h->fd = open(path, O_RDONLY | O_CLOEXEC);
                    break;
                }
        }
        closedir(d);
        if (h->fd < 0) usleep(2000);
    }
    return NULL;
}

static void run_netns_held(char *out, size_t cap, ns_hold *h) {
    pthread_t t;
    bool threaded = pthread_create(&t, NULL, ns_hold_worker, h) == 0;
    run_netns(out, cap, "3000", 0.5);
    if (threaded) pthread_join(t, NULL);
    else h->fd = -1;
}

static bool run_code(const char *mode, int want) {
    sandbox_result r;
    if (run(&r, (const char *[]){self, "child", mode, NULL}, 0)) return false;
    bool ok = r.exit_code == want && r.signal == 0;
    if (!ok) sbx_dump(mode, &r);
    sandbox_result_deinit(&r);
    return ok;
}

typedef struct {
    char ns[64];
} par_job;

static void *par_worker(void *arg) {
    par_job *j = arg;
    run_netns(j->ns, sizeof j->ns, "400", 0);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "child")) return child(argc - 2, argv + 2);
    int start = sbx_start(self, sizeof self, self_dir, sizeof self_dir);
    if (start) return start;
    sbx_mkdtemp(root, sizeof root);
    snprintf(ws, sizeof ws, "%s/ws", root);
    snprintf(home, sizeof home, "%s/home", root);
    mkdir(ws, 0755);
    mkdir(home, 0755);
    pool = sandbox_netns_pool_new();
    sbx_check(pool != NULL, "a pool");
    if (!pool) return 1;

    char host[64] = "", a[64], b[64], c[64];
    ssize_t n = readlink("/proc/self/ns/net", host, sizeof host - 1);
    if (n > 0) host[n] = 0;
    run_netns(a, sizeof a, NULL, 0);
    run_netns(b, sizeof b, NULL, 0);
    sbx_check(a[0] && !strcmp(a, b) && strcmp(a, host),
              "two runs one after the other share a pooled namespace (%s, %s; host %s)", a, b,
              host);

    sbx_check(run_code("write-tmp", 0) && run_code("check-tmp", 0),
              "a file written to /tmp or $HOME by one command is not there for the next");
    sbx_check(run_code("lo-down", 0), "a command cannot take the pooled loopback down");
    sbx_check(run_code("leave-behind", 0) && run_code("see-nothing", 0),
              "a listener and a sleeper left by one command are gone for the next: no process "
              "of it visible, its port refused, lo still up");
    sbx_check(sbx_count_procs_with("leave-behind") == 0, "nothing left on the host");

    par_job jobs[2];
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, par_worker, &jobs[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    sbx_check(jobs[0].ns[0] && jobs[1].ns[0] && strcmp(jobs[0].ns, jobs[1].ns),
              "two runs at the same time never share a namespace (%s, %s)", jobs[0].ns,
              jobs[1].ns);

    /* A killed run's namespace is dropped: drain the pool (two runs at once left two in it),
     * then time one out and look at the next. */
    ns_hold ha, hc;
    run_netns_held(a, sizeof a, &ha);
    run_netns_held(c, sizeof c, &hc);
    run_netns(b, sizeof b, NULL, 0);
    sbx_check(a[0] && c[0] && b[0] && strcmp(a, b) && strcmp(c, b),
              "the namespace of a run stopped by its timeout is not reused (%s, %s, then %s%s)",
              a, c, b, ha.fd >= 0 && hc.fd >= 0 ? "; both held open" : "; not held open");
    if (ha.fd >= 0) close(ha.fd);
    if (hc.fd >= 0) close(hc.fd);

    sandbox_netns_pool_free(pool);
    sandbox_netns_pool_free(NULL);
    sbx_rm_rf(root);
    sbx_rerun_as_nobody(self);
    printf("%d failure%s\n", sbx_failures, sbx_failures == 1 ? "" : "s");
    return sbx_failures ? 1 : 0;
}
