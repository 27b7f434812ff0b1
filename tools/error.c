#include "tool_int.h"

#include <stdarg.h>
#include <string.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

int tool_err(int code, const char *fmt, ...) {
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

const char *tool_error_last(void) {
    return last_error;
}

const char *tool_error_name(int code) {
    switch (code) {
    case TOOL_OK: return "ok";
    case TOOL_EINVAL: return "invalid_arguments";
    case TOOL_ENOMEM: return "out_of_memory";
    case TOOL_EINTERNAL: return "internal";
    case TOOL_ENOTFOUND: return "not_found";
    case TOOL_EPATH: return "path_refused";
    case TOOL_EIO: return "io";
    case TOOL_EGIT: return "git";
    case TOOL_ECONFLICT: return "conflict";
    case TOOL_ETOOLARGE: return "too_large";
    case TOOL_EBINARY: return "binary";
    case TOOL_ESANDBOX: return "sandbox";
    case TOOL_EUNSUPPORTED: return "unsupported";
    default: return "unknown";
    }
}

int tool_err_git(int gitrc, const char *what) {
    const git_error *e = git_error_last();
    const char *msg = e && e->message ? e->message : "unknown libgit2 error";
    return tool_err(gitrc == GIT_ENOTFOUND ? TOOL_ENOTFOUND : TOOL_EGIT, "%s: %s", what, msg);
}
