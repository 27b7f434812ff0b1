/* Fuzz ignore files and globs: the first line of the input is a path, the rest an ignore
 * file; also the whole input as a glob against a fixed path (bounded time). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tool_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *s = (const char *)data;
    const char *nl = memchr(s, '\n', size);
    size_t pl = nl ? (size_t)(nl - s) : size;
    char *path = strndup(s, pl);
    if (!path) return 0;
    tool_ignore *ig = NULL;
    if (tool_ignore_parse(&ig, "", nl ? nl + 1 : "", nl ? size - pl - 1 : 0) == 0) {
        (void)tool_ignore_check(ig, path, false);
        (void)tool_ignore_check(ig, path, true);
        tool_ignore_free(ig);
    }
    if (tool_ignore_parse(&ig, "sub/dir", nl ? nl + 1 : "", nl ? size - pl - 1 : 0) == 0) {
        (void)tool_ignore_check(ig, "sub/dir/x/y.c", false);
        tool_ignore_free(ig);
    }
    (void)tool_glob_match_full(s, size, "a/b/c/d/e/f/g.txt", 17);
    (void)tool_glob_match(path, "src/main.c");
    free(path);
    return 0;
}
