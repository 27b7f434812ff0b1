/* Private to agent/. */
#ifndef SPARK_AGENT_INT_H
#define SPARK_AGENT_INT_H
#include "agent.h"

/* Record the calling thread's last error and return `code`. */
int agent_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
