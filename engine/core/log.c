#include "common.h"

#include <pthread.h>
#include <stdarg.h>

/* The sink is process-wide by nature (stderr is); it is written once at start-up and read
 * under a lock so that a late engine_log_set() from another thread is still safe. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static engine_log_fn log_fn;
static void *log_user;
static engine_log_level log_min = ENGINE_LOG_INFO;

void engine_log_set(engine_log_fn fn, void *user, engine_log_level min_level) {
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_user = user;
    log_min = min_level;
    pthread_mutex_unlock(&log_lock);
}

void engine_logv(engine_log_level level, const char *fmt, va_list ap) {
    static const char *const names[] = {"debug", "info", "warn", "error"};
    char line[2048];
    pthread_mutex_lock(&log_lock);
    engine_log_fn fn = log_fn;
    void *user = log_user;
    engine_log_level min = log_min;
    pthread_mutex_unlock(&log_lock);
    if (level < min || level >= ENGINE_LOG_NONE) return;
    vsnprintf(line, sizeof line, fmt, ap);
    if (fn) {
        fn(level, line, user);
    } else {
        fprintf(stderr, "spark-agent: %s: %s\n", names[level], line);
    }
}

void engine_log(engine_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    engine_logv(level, fmt, ap);
    va_end(ap);
}
