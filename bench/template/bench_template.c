/* Render time of the chat-template interpreter on a long agent conversation (N turns of
 * user / assistant with reasoning and a tool call / tool result, 3 tools), per template.
 *   bench_template TEMPLATE.jinja [N_TURNS] [REPEATS]
 * Prints the conversation JSON to stdout-free file bench_conv.json (for the node comparison)
 * and one line: parse and render CPU time per call, output bytes. Run via bench/template/bench.sh */
#define _POSIX_C_SOURCE 200809L
#include "agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU time of this process: the machine is often shared, and wall time then measures the
 * neighbours. */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"description\":\"Read a file\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\","
    "\"description\":\"Path\"},\"start_line\":{\"type\":\"integer\"}},\"required\":[\"path\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"description\":\"Search\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"pattern\":{\"type\":\"string\"},"
    "\"globs\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},\"required\":[\"pattern\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"edit\",\"description\":\"Edit a file\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"},"
    "\"old\":{\"type\":\"string\"},\"new\":{\"type\":\"string\"}}}}}]";

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s TEMPLATE.jinja [N_TURNS] [REPEATS]\n", argv[0]);
        return 2;
    }
    int turns = argc > 2 ? atoi(argv[2]) : 50, reps = argc > 3 ? atoi(argv[3]) : 200;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 1;
    static char src[1 << 16];
    size_t n = fread(src, 1, sizeof src - 1, f);
    fclose(f);
    src[n] = 0;
    size_t cap = (size_t)turns * 2048 + 4096, o = 0;
    char *msgs = malloc(cap);
    o += (size_t)snprintf(msgs + o, cap - o,
                          "[{\"role\":\"system\",\"content\":\"You are a coding agent.\"}");
    for (int i = 0; i < turns; i++)
        o += (size_t)snprintf(
            msgs + o, cap - o,
            ",{\"role\":\"user\",\"content\":\"Step %d: look at src/file%d.c and fix the bug "
            "in parse_args when argc is zero.\"},{\"role\":\"assistant\",\"content\":\"\","
            "\"reasoning_content\":\"I should read the file first to see how argc is used.\","
            "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"read_file\","
            "\"arguments\":{\"path\":\"src/file%d.c\",\"start_line\":1}}}]},{\"role\":\"tool\","
            "\"content\":\"int parse_args(int argc, char **argv) {\\n    if (argc < 1) return "
            "-1;\\n    return atoi(argv[1]);\\n}\\n\"},{\"role\":\"assistant\",\"content\":\"The "
            "check must be argc < 2. Fixed.\"}",
            i, i, i);
    o += (size_t)snprintf(msgs + o, cap - o, "]");
    FILE *cf = fopen("bench_conv.json", "wb");
    if (cf) {
        fprintf(cf, "{\"messages\":%s,\"tools\":%s,\"add_generation_prompt\":true}", msgs, TOOLS);
        fclose(cf);
    }
    agent_template *t;
    double t0 = now();
    for (int r = 0; r < 100; r++) {
        if (agent_template_new(&t, src)) {
            fprintf(stderr, "%s\n", agent_error_last());
            return 1;
        }
        if (r < 99) agent_template_free(t);
    }
    double parse = (now() - t0) / 100;
    char *out = NULL;
    size_t len = 0;
    t0 = now();
    for (int r = 0; r < reps; r++) {
        free(out);
        if (agent_template_render(t, msgs, TOOLS, NULL, &out, &len)) {
            fprintf(stderr, "%s\n", agent_error_last());
            return 1;
        }
    }
    double dt = (now() - t0) / reps;
    printf("C:    %-22s %3d turns (%zu messages bytes): parse %.3f ms, render %.3f ms CPU, "
           "%zu bytes out\n",
           strrchr(argv[1], '/') ? strrchr(argv[1], '/') + 1 : argv[1], turns, o, parse * 1e3,
           dt * 1e3, len);
    free(out);
    free(msgs);
    agent_template_free(t);
    return 0;
}
