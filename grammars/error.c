#include "grammar_int.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

int grammar_err(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

const char *grammar_error_last(void) {
    return last_error;
}
