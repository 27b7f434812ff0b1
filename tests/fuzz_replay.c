/* Replays a fuzz corpus through LLVMFuzzerTestOneInput, so every CI run exercises the corpus
 * even without libFuzzer. Usage: NAME_replay DIR_OR_FILE... ; a crash or sanitizer report fails
 * the test, as it would under the fuzzer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_replay: cannot open %s\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = n > 0 ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 0;
}


int main(int argc, char **argv) {
    int files = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "fuzz_replay: %s does not exist\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(sb.st_mode)) {
            if (run_file(argv[i]) != 0) return 1;
            files++;
            continue;
        }
        struct dirent **list;
        int n = scandir(argv[i], &list, NULL, alphasort);
        for (int j = 0; j < n; j++) {
            if (list[j]->d_name[0] != '.') {
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", argv[i], list[j]->d_name);
                if (run_file(path) != 0) return 1;
                files++;
            }
            free(list[j]);
        }
        free(list);
    }
    if (files == 0) {
        fprintf(stderr, "fuzz_replay: empty corpus: nothing was tested\n");
        return 1;
    }
    printf("fuzz_replay: %d inputs replayed without a crash\n", files);
    return 0;
}
