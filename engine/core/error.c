#include "common.h"

#include <stdarg.h>
#include <string.h>

static _Thread_local char last_error[1024];

int engine_err(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    /* Format into a scratch buffer first: callers may pass the previous message as an
     * argument ("%s: %s", path, x_error_last()), which must not overlap the destination. */
    char msg[sizeof last_error];
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(last_error, msg, sizeof msg);
    va_end(ap);
    return code;
}

const char *engine_error_last(void) {
    return last_error;
}

const char *engine_error_name(int code) {
    switch (code) {
    case ENGINE_OK: return "OK";
    case ENGINE_EINVAL: return "EINVAL";
    case ENGINE_ENOMEM: return "ENOMEM";
    case ENGINE_EIO: return "EIO";
    case ENGINE_EFORMAT: return "EFORMAT";
    case ENGINE_EUNSUPPORTED: return "EUNSUPPORTED";
    case ENGINE_ENODEV: return "ENODEV";
    case ENGINE_ECANCELED: return "ECANCELED";
    case ENGINE_ERANGE: return "ERANGE";
    case ENGINE_EINTERNAL: return "EINTERNAL";
    default: return "EUNKNOWN";
    }
}

void engine_assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "spark-agent engine: internal error at %s:%d: assertion `%s` failed\n", file,
            line, expr);
    abort();
}
