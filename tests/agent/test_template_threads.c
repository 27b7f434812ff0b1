/* One parsed template rendered by several threads at once (agent.h: a template is immutable
 * and each render uses its own memory): every thread's output equals the single-threaded one,
 * and errors stay per thread. */
#include "agent.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_THREADS 4
#define N_RENDERS 40

static agent_template *tpl;
static char *want;
static size_t want_len;

static const char *MSGS =
    "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"Fix it\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"look\",\"tool_calls\":"
    "[{\"function\":{\"name\":\"read_file\",\"arguments\":{\"path\":\"a.c\"}}}]},"
    "{\"role\":\"tool\",\"content\":\"int a;\"},{\"role\":\"assistant\",\"content\":\"Done.\"}]";
static const char *TOOLS = "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\","
                           "\"parameters\":{\"type\":\"object\",\"properties\":{\"path\":"
                           "{\"type\":\"string\"}}}}}]";

static void *worker(void *arg) {
    long id = (long)arg;
    for (int i = 0; i < N_RENDERS; i++) {
        char *out = NULL;
        size_t len = 0;
        if (agent_template_render(tpl, MSGS, TOOLS, NULL, &out, &len) || len != want_len ||
            memcmp(out, want, len)) {
            free(out);
            return (void *)1;
        }
        free(out);
        /* an error in this thread must not leak into another thread's message */
        if (agent_template_render(tpl, "[", NULL, NULL, &out, NULL) != AGENT_EINVAL ||
            !strstr(agent_error_last(), "messages: invalid JSON"))
            return (void *)1;
        (void)id;
    }
    return NULL;
}

int main(void) {
    const char *src = getenv("SPARK_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/templates/qwen3.jinja", src ? src : ".");
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 1;
    }
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    if (agent_template_new(&tpl, buf) ||
        agent_template_render(tpl, MSGS, TOOLS, NULL, &want, &want_len)) {
        fprintf(stderr, "%s\n", agent_error_last());
        return 1;
    }
    pthread_t th[N_THREADS];
    for (long i = 0; i < N_THREADS; i++) pthread_create(&th[i], NULL, worker, (void *)i);
    int failures = 0;
    for (int i = 0; i < N_THREADS; i++) {
        void *r;
        pthread_join(th[i], &r);
        if (r) {
            fprintf(stderr, "FAIL thread %d\n", i);
            failures++;
        }
    }
    agent_template_free(tpl);
    free(want);
    printf("%d threads x %d renders, %d failures\n", N_THREADS, N_RENDERS, failures);
    return failures ? 1 : 0;
}
