/* pty_run: run a command on a pseudo-terminal and drive it like a person at a keyboard, for the
 * CLI tests (CI has neither script(1) nor python's pty module).
 *
 *   pty_run [-t TIMEOUT_S] [-o OUTPUT_FILE] STEP... -- COMMAND [ARGS...]
 *
 * Steps run in order: `wait:TEXT` waits until TEXT has appeared in the output (after what the
 * previous wait matched), `more:N` waits for N more bytes of output after that, `send:TEXT`
 * types TEXT (C escapes: \n \r \t \\ \xHH; \x03 is Ctrl-C,
 * \x04 Ctrl-D), `sleep:MS` pauses. After the steps it waits for the command to exit. Everything
 * the command wrote goes to OUTPUT_FILE (default stdout). Exit status: the command's, 128+N
 * when a signal N killed it, 124 on the timeout (default 60 s; the command is killed) or when
 * a wait fails, 125 when the command cannot be started. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char out[1 << 22];
static size_t out_len, seen;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t unescape(const char *s, char *d) {
    size_t n = 0;
    while (*s) {
        if (*s != '\\' || !s[1]) {
            d[n++] = *s++;
            continue;
        }
        s++;
        switch (*s) {
        case 'n': d[n++] = '\n'; s++; break;
        case 'r': d[n++] = '\r'; s++; break;
        case 't': d[n++] = '\t'; s++; break;
        case 'x': {
            unsigned v = 0;
            int k = 0;
            for (s++; k < 2 && ((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f') ||
                                (*s >= 'A' && *s <= 'F')); k++, s++)
                v = v * 16 + (unsigned)(*s <= '9' ? *s - '0' : (*s | 32) - 'a' + 10);
            d[n++] = (char)v;
            break;
        }
        default: d[n++] = *s++; break;
        }
    }
    return n;
}

/* Read what is there (up to `ms` milliseconds of waiting). Returns false at EOF. */
static bool pump(int fd, int ms) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, ms) <= 0) return true;
    char buf[4096];
    ssize_t r = read(fd, buf, sizeof buf);
    if (r <= 0) return r < 0 && errno == EINTR;
    size_t n = (size_t)r;
    if (n > sizeof out - 1 - out_len) n = sizeof out - 1 - out_len;
    memcpy(out + out_len, buf, n);
    out_len += n;
    out[out_len] = 0;
    return true;
}

int main(int argc, char **argv) {
    double timeout = 60;
    const char *out_path = NULL;
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--"); i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) timeout = atof(argv[++i]);
        else if (!strcmp(argv[i], "-o") && i + 1 < argc) out_path = argv[++i];
    }
    if (i >= argc - 1) {
        fprintf(stderr, "usage: pty_run [-t S] [-o FILE] STEP... -- COMMAND [ARGS...]\n");
        return 125;
    }
    int first_cmd = i + 1;
    struct winsize ws = {.ws_row = 40, .ws_col = 120};
    int master;
    pid_t pid = forkpty(&master, NULL, NULL, &ws);
    if (pid < 0) {
        perror("pty_run: forkpty");
        return 125;
    }
    if (pid == 0) {
        execvp(argv[first_cmd], argv + first_cmd);
        fprintf(stderr, "pty_run: cannot run %s: %s\n", argv[first_cmd], strerror(errno));
        _exit(125);
    }
    double deadline = now_s() + timeout;
    int rc = -1;
    bool eof = false;
    for (int s = 1; s < first_cmd - 1 && rc < 0; s++) {
        const char *st = argv[s];
        if (!strcmp(st, "-t") || !strcmp(st, "-o")) {
            s++;
            continue;
        }
        if (!strncmp(st, "wait:", 5)) {
            char want[1024];
            size_t wl = unescape(st + 5, want);
            want[wl] = 0;
            for (;;) {
                char *hit = out_len > seen ? memmem(out + seen, out_len - seen, want, wl) : NULL;
                if (hit) {
                    seen = (size_t)(hit - out) + wl;
                    break;
                }
                if (eof || now_s() > deadline) {
                    fprintf(stderr, "pty_run: '%s' did not appear%s\n", st + 5,
                            eof ? " (the command ended)" : " (timeout)");
                    rc = 124;
                    break;
                }
                eof = !pump(master, 50);
            }
        } else if (!strncmp(st, "more:", 5)) {
            size_t want = (size_t)atol(st + 5);
            while (out_len < seen + want) {
                if (eof || now_s() > deadline) {
                    fprintf(stderr, "pty_run: %zu more bytes did not come\n", want);
                    rc = 124;
                    break;
                }
                eof = !pump(master, 50);
            }
            seen = out_len;
        } else if (!strncmp(st, "send:", 5)) {
            char text[1024];
            size_t n = unescape(st + 5, text);
            if (write(master, text, n) != (ssize_t)n) perror("pty_run: write");
        } else if (!strncmp(st, "sleep:", 6)) {
            double until = now_s() + atof(st + 6) / 1000.0;
            while (!eof && now_s() < until) eof = !pump(master, 20);
        } else {
            fprintf(stderr, "pty_run: unknown step '%s'\n", st);
            rc = 125;
        }
    }
    int status = 0;
    bool exited = false;
    while (!exited) {
        if (rc < 0 && now_s() > deadline) {
            fprintf(stderr, "pty_run: timeout: killing the command\n");
            rc = 124;
        }
        if (rc >= 0) kill(pid, SIGKILL);
        if (!eof) eof = !pump(master, 50);
        else usleep(20000);
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) exited = true;
    }
    while (!eof && now_s() < deadline + 5) eof = !pump(master, 50); /* what is left */
    close(master);
    FILE *f = out_path ? fopen(out_path, "w") : stdout;
    if (f) {
        fwrite(out, 1, out_len, f);
        if (out_path) fclose(f);
    }
    if (rc >= 0) return rc;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
