#include "grammar_int.h"

#include <stdarg.h>
#include <string.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

int grammar_err(int code, const char *fmt, ...) {
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

const char *grammar_error_last(void) {
    return last_error;
}
