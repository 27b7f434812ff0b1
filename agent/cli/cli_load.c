/* Model loading for the commands, with a progress bar on a terminal: the file is read ahead
 * into the page cache with a bar (the engine maps it, so this is most of a cold load), then
 * engine_model_load runs on a helper thread while an elapsed-time line is kept up to date
 * (weights repacked or uploaded to the GPU). Engine-only: no module beyond the engine. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

#define CLI_PROGRESS_MIN_BYTES ((uint64_t)256 << 20)
#define CHUNK ((size_t)16 << 20)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Bytes of memory the kernel says are available (MemAvailable), or 0 when unknown. */
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static void bar(const char *name, uint64_t done, uint64_t total, double t0) {
    const int width = 30;
    double f = total ? (double)done / (double)total : 1.0;
    int fill = (int)(f * width);
    char b[64];
    for (int i = 0; i < width; i++) b[i] = i < fill ? '=' : i == fill ? '>' : ' ';
    b[width] = 0;
    double dt = now_s() - t0;
    fprintf(stderr, "\rloading %s [%s] %3d%%  %.1f/%.1f GiB  %.2f GiB/s\033[K", name, b,
            (int)(f * 100), (double)done / (1 << 30), (double)total / (1 << 30),
            dt > 0 ? (double)done / (1 << 30) / dt : 0.0);
    fflush(stderr);
}

typedef struct {
    const char *path;
    const engine_model_params *mp;
    engine_model *model;
    int rc;
    char err[1024];
    int done; /* atomic */
} load_job;

static void *load_thread(void *p) {
    load_job *j = p;
    j->rc = engine_model_load(&j->model, j->path, j->mp);
    if (j->rc) snprintf(j->err, sizeof j->err, "%s", engine_error_last());
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

int cli_model_load(const char *cmd, engine_model **out, const char *path,
                   const engine_model_params *mp) {
    *out = NULL;
    const char *mode = getenv("SPARK_PROGRESS");
    bool show = isatty(2);
    if (mode && !strcmp(mode, "never")) show = false;
    struct stat st;
    uint64_t size = stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
    if (!(mode && !strcmp(mode, "always")) && size < CLI_PROGRESS_MIN_BYTES) show = false;
    if (!show) {
        int rc = engine_model_load(out, path, mp);
        if (rc) cli_errorf(cmd, "%s", engine_error_last());
        return rc;
    }
    const char *name = base_name(path);
    double t0 = now_s();
    /* read ahead into the page cache when it fits; a file larger than the available memory
     * would only evict itself */
    uint64_t avail = mem_available();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && size && (avail == 0 || size < avail / 10 * 9)) {
        double last = 0;
        for (uint64_t off = 0; off < size;) {
            size_t n = size - off < CHUNK ? (size_t)(size - off) : CHUNK;
            if (readahead(fd, (off64_t)off, n) != 0) break; /* not supported here: skip */
            off += n;
            double t = now_s();
            if (t - last > 0.1 || off == size) {
                bar(name, off, size, t0);
                last = t;
            }
        }
    }
    if (fd >= 0) close(fd);
    /* the engine's own work (parsing, repacking, a GPU upload) with a running clock */
    load_job j = {.path = path, .mp = mp};
    pthread_t th;
    int rc;
    if (pthread_create(&th, NULL, load_thread, &j) != 0) {
        load_thread(&j);
    } else {
        while (!__atomic_load_n(&j.done, __ATOMIC_ACQUIRE)) {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
            if (!__atomic_load_n(&j.done, __ATOMIC_ACQUIRE)) {
                fprintf(stderr, "\rloading %s: preparing the weights %.1f s\033[K", name,
                        now_s() - t0);
                fflush(stderr);
            }
        }
        pthread_join(th, NULL);
    }
    rc = j.rc;
    if (rc) {
        fprintf(stderr, "\r\033[K");
        cli_errorf(cmd, "%s", j.err);
        return rc;
    }
    fprintf(stderr, "\rloaded %s (%.1f GiB) in %.1f s\033[K\n", name,
            (double)size / (1 << 30), now_s() - t0);
    *out = j.model;
    return 0;
}
