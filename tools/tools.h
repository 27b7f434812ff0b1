/*
 * tools.h - public door of tools/. (Conventions: functions return 0 or a negative TOOL_E* code;
 * tool_error_last() holds the calling thread's last error message. Nothing here prints or exits.)
 */
#ifndef SPARK_TOOL_H
#define SPARK_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    TOOL_OK = 0,
    TOOL_EINVAL = -1,
    TOOL_ENOMEM = -2,
    TOOL_EINTERNAL = -3,
};

/* The calling thread's last error message ("" if none). Borrowed. */
const char *tool_error_last(void);

#ifdef __cplusplus
}
#endif
#endif
