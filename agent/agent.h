/*
 * agent.h - public door of agent/. (Conventions: functions return 0 or a negative AGENT_E* code;
 * agent_error_last() holds the calling thread's last error message. Nothing here prints or exits.)
 */
#ifndef SPARK_AGENT_H
#define SPARK_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    AGENT_OK = 0,
    AGENT_EINVAL = -1,
    AGENT_ENOMEM = -2,
    AGENT_EINTERNAL = -3,
};

/* The calling thread's last error message ("" if none). Borrowed. */
const char *agent_error_last(void);

#ifdef __cplusplus
}
#endif
#endif
