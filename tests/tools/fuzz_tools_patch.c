/* Fuzz the unified-diff parser: any bytes must parse or fail cleanly, never crash or leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tool_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tool_patch p;
    if (tool_patch_parse(&p, (const char *)data, size) == 0) {
        for (size_t i = 0; i < p.n_files; i++)
            for (size_t h = 0; h < p.files[i].n_hunks; h++) {
                const tool_hunk *hk = &p.files[i].hunks[h];
                for (size_t l = 0; l < hk->n_lines; l++)
                    if (hk->lines[l][0] != ' ' && hk->lines[l][0] != '-' && hk->lines[l][0] != '+')
                        abort(); /* the parser promised one of three kinds */
            }
        tool_patch_deinit(&p);
    }
    return 0;
}
