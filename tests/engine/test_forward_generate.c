/* engine_generate on the tiny random model: greedy generation equals a hand-written argmax
 * loop; streamed text equals the decoded tokens; stop tokens, stop strings (across token
 * boundaries, never emitted), max_tokens, a full context, cancellation from the callback,
 * prefix reuse between calls, the grammar mask (EOS only when allowed), and bad input. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "support.h"

static char tmpdir[] = "/tmp/spark_test_generate_XXXXXX";

typedef struct {
    char text[8192];
    size_t len;
    int32_t toks[512];
    int n_toks, calls, cancel_at;
} sink;

static int on_text(void *user, const char *text, size_t len, int32_t token) {
    sink *k = user;
    k->calls++;
    if (len > 0 && k->len + len < sizeof k->text) {
        memcpy(k->text + k->len, text, len);
        k->len += len;
        k->text[k->len] = 0;
    }
    if (token >= 0 && k->n_toks < 512) k->toks[k->n_toks++] = token;
    return k->cancel_at && k->calls >= k->cancel_at;
}

static engine_gen_params greedy_params(const int32_t *prompt, size_t n, int32_t max) {
    engine_gen_params p = ENGINE_GEN_PARAMS_INIT;
    p.prompt = prompt;
    p.n_prompt = n;
    p.max_tokens = max;
    p.sampling.temperature = 0.0f;
    p.sampling.repeat_penalty = 1.0f;
    p.ignore_eog = true;
    return p;
}

typedef struct {
    const int32_t *ids;
    int n;
    int accepted;
} mask_set;

static int set_mask(void *user, uint32_t *allowed, int32_t n_vocab) {
    mask_set *m = user;
    for (int i = 0; i < m->n; i++)
        if (m->ids[i] < n_vocab) allowed[m->ids[i] / 32] |= 1u << (m->ids[i] % 32);
    return 0;
}

static int set_accept(void *user, int32_t token) {
    mask_set *m = user;
    m->accepted++;
    for (int i = 0; i < m->n; i++)
        if (m->ids[i] == token) return 0;
    return 1; /* a token outside the mask: the grammar would break */
}

/* Two sessions of one model generating on two threads at once (their passes serialise on the
 * model's pool) give what each gives alone. */
typedef struct {
    engine_session *s;
    const int32_t *prompt;
    size_t np;
    sink k;
    int rc;
} worker;

static void *gen_thread(void *arg) {
    worker *w = arg;
    engine_gen_params p = greedy_params(w->prompt, w->np, 8);
    memset(&w->k, 0, sizeof w->k);
    w->rc = engine_generate(w->s, &p, on_text, &w->k, NULL);
    return NULL;
}

int main(void) {
    int skip = support_init();
    if (skip) return skip;
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/tiny-f32.gguf", tmpdir);
    engine_model *m = NULL;
    engine_session *s = NULL, *r = NULL, *small = NULL;
    if (support_gen("tiny", "f32", 3, path) != 0) {
        support_failures++;
        goto out;
    }
    engine_model_params mp = ENGINE_MODEL_PARAMS_INIT;
    mp.n_ctx = 128;
    mp.n_threads = 1; /* deterministic anyway; one thread is fastest on a loaded CI machine */
    CHECK(engine_model_load(&m, path, &mp) == 0);
    if (!m) goto out;
    int32_t nv = engine_model_n_vocab(m);
    CHECK(engine_session_new(&s, m, NULL) == 0);
    CHECK(engine_session_new(&r, m, NULL) == 0);
    if (!s || !r) goto out;
    const char *text = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";
    int32_t prompt[64];
    size_t np = 0;
    CHECK(engine_model_tokenize(m, text, strlen(text), true, prompt, 64, &np) == 0);

    /* greedy generate == argmax loop; streamed text == decoded tokens */
    enum { N = 12 };
    int32_t ref[N];
    CHECK(engine_session_append(r, prompt, np, NULL) == 0);
    for (int i = 0; i < N; i++) {
        ref[i] = support_argmax(engine_session_logits(r), nv);
        CHECK(engine_session_append(r, &ref[i], 1, NULL) == 0);
    }
    sink k;
    memset(&k, 0, sizeof k);
    engine_gen_params p = greedy_params(prompt, np, N);
    engine_gen_stats st;
    CHECK(engine_generate(s, &p, on_text, &k, &st) == 0);
    CHECK(st.stop == ENGINE_STOP_LENGTH && st.generated_tokens == N);
    CHECK(st.prompt_tokens == (int32_t)np && st.cached_tokens == 0);
    CHECK(st.decode_tokens == N && st.prefill_ms > 0 && st.decode_ms > 0);
    CHECK(k.n_toks == N && memcmp(k.toks, ref, sizeof ref) == 0);
    char dec[8192];
    size_t dlen = 0;
    CHECK(engine_model_detokenize(m, ref, N, dec, sizeof dec, &dlen) == 0);
    /* the streamed text is the decoded text, invalid UTF-8 aside (then U+FFFD) */
    bool has_bad = false;
    for (size_t i = 0; i < k.len; i++)
        if ((unsigned char)k.text[i] == 0xef && i + 2 < k.len &&
            (unsigned char)k.text[i + 1] == 0xbf && (unsigned char)k.text[i + 2] == 0xbd)
            has_bad = true;
    if (!has_bad) CHECK(k.len == dlen && memcmp(k.text, dec, dlen) == 0);
    char full[8192];
    size_t full_len = k.len;
    memcpy(full, k.text, k.len + 1);

    /* prefix reuse: the same prompt again reuses all but the last prompt token */
    memset(&k, 0, sizeof k);
    CHECK(engine_generate(s, &p, on_text, &k, &st) == 0);
    CHECK(st.cached_tokens == (int32_t)np - 1);
    CHECK(k.n_toks == N && memcmp(k.toks, ref, sizeof ref) == 0);
    /* a prompt sharing the first 5 tokens */
    int32_t other[64];
    memcpy(other, prompt, sizeof(int32_t) * np);
    other[5] = (other[5] + 1) % 1000;
    engine_gen_params po = greedy_params(other, np, 2);
    memset(&k, 0, sizeof k);
    CHECK(engine_generate(s, &po, on_text, &k, &st) == 0);
    CHECK(st.cached_tokens == 5);

    /* stop token: the 6th greedy token stops generation and is not emitted */
    int32_t stop_tok = ref[5];
    int first = 0;
    while (ref[first] != stop_tok) first++;
    p.stop_tokens = &stop_tok;
    p.n_stop_tokens = 1;
    memset(&k, 0, sizeof k);
    CHECK(engine_generate(s, &p, on_text, &k, &st) == 0);
    CHECK(st.stop == ENGINE_STOP_TOKEN && st.generated_tokens == first + 1);
    CHECK(k.n_toks == first);
    p.stop_tokens = NULL;
    p.n_stop_tokens = 0;

    /* stop string spanning a token boundary (tokens i and i+1 whole, both starting on a
     * character boundary): the text before its first occurrence is emitted, nothing after */
    size_t off[N + 1];
    off[0] = 0;
    for (int i = 0; i < N; i++) {
        size_t l;
        engine_model_token_bytes(m, ref[i], &l);
        off[i + 1] = off[i] + l;
    }
    int bi = -1;
    for (int i = 1; i + 2 <= N && bi < 0 && !has_bad; i++) {
        size_t a0 = off[i], a2 = off[i + 2];
        if (off[i + 1] > a0 && a2 > off[i + 1] && a2 < full_len &&
            ((unsigned char)full[a0] & 0xc0) != 0x80 && ((unsigned char)full[a2] & 0xc0) != 0x80)
            bi = i;
    }
    CHECK(bi >= 0);
    if (bi >= 0) {
        char stop[256];
        size_t sl = off[bi + 2] - off[bi];
        if (sl >= sizeof stop) sl = sizeof stop - 1;
        memcpy(stop, full + off[bi], sl);
        stop[sl] = 0;
        const char *first_hit = strstr(full, stop);
        size_t want = (size_t)(first_hit - full);
        const char *stops[2] = {"\x01never", stop};
        p.stop_strings = stops;
        p.n_stop_strings = 2;
        memset(&k, 0, sizeof k);
        CHECK(engine_generate(s, &p, on_text, &k, &st) == 0);
        CHECK(st.stop == ENGINE_STOP_STRING);
        CHECK(k.len == want && memcmp(k.text, full, want) == 0);
        CHECK(strstr(k.text, stop) == NULL);
        p.stop_strings = NULL;
        p.n_stop_strings = 0;
    }
    /* a stop string that never occurs: everything is emitted at the end */
    const char *never[1] = {"\x01\x02never"};
    p.stop_strings = never;
    p.n_stop_strings = 1;
    memset(&k, 0, sizeof k);
    CHECK(engine_generate(s, &p, on_text, &k, &st) == 0);
    CHECK(st.stop == ENGINE_STOP_LENGTH && k.len == full_len && !memcmp(k.text, full, full_len));
    p.stop_strings = NULL;
    p.n_stop_strings = 0;

    /* cancellation from the callback */
    memset(&k, 0, sizeof k);
    k.cancel_at = 3;
    CHECK(engine_generate(s, &p, on_text, &k, &st) == ENGINE_ECANCELED);
    CHECK(st.stop == ENGINE_STOP_CANCELED && st.generated_tokens == 3);

    /* a full context */
    engine_session_params sp = ENGINE_SESSION_PARAMS_INIT;
    sp.n_ctx = (int32_t)np + 5;
    CHECK(engine_session_new(&small, m, &sp) == 0);
    if (small) {
        engine_gen_params pc = greedy_params(prompt, np, 0);
        memset(&k, 0, sizeof k);
        CHECK(engine_generate(small, &pc, on_text, &k, &st) == 0);
        CHECK(st.stop == ENGINE_STOP_CONTEXT && st.generated_tokens == 6);
        CHECK(k.n_toks == 6 && memcmp(k.toks, ref, sizeof(int32_t) * 6) == 0);
        int32_t longp[200] = {0};
        pc.prompt = longp;
        pc.n_prompt = 200;
        CHECK(engine_generate(small, &pc, on_text, &k, &st) == ENGINE_ERANGE);
    }

    /* grammar mask: only three tokens allowed, sampled at temperature 1 */
    int32_t allow[3] = {ref[0], 9707, 1879};
    mask_set ms = {allow, 3, 0};
    engine_gen_params pm = greedy_params(prompt, np, 10);
    pm.ignore_eog = false;
    pm.sampling.temperature = 1.0f;
    pm.sampling.top_k = 0;
    pm.sampling.top_p = 1.0f;
    pm.sampling.min_p = 0.0f;
    pm.sampling.mask = set_mask;
    pm.sampling.accept = set_accept;
    pm.sampling.grammar_user = &ms;
    memset(&k, 0, sizeof k);
    CHECK(engine_generate(s, &pm, on_text, &k, &st) == 0);
    CHECK(st.generated_tokens == 10 && ms.accepted == 10);
    for (int i = 0; i < k.n_toks; i++)
        CHECK(k.toks[i] == allow[0] || k.toks[i] == allow[1] || k.toks[i] == allow[2]);
    /* EOS only when the mask allows it: a mask of <|im_end|> alone ends at once */
    int32_t eog = 151645;
    CHECK(engine_model_token_is_eog(m, eog));
    mask_set me = {&eog, 1, 0};
    pm.sampling.grammar_user = &me;
    memset(&k, 0, sizeof k);
    CHECK(engine_generate(s, &pm, on_text, &k, &st) == 0);
    CHECK(st.stop == ENGINE_STOP_EOG && st.generated_tokens == 1 && k.len == 0);

    /* concurrent sessions */
    worker wk[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        wk[i] = (worker){NULL, prompt, np, {{0}, 0, {0}, 0, 0, 0}, -1};
        CHECK(engine_session_new(&wk[i].s, m, NULL) == 0);
    }
    if (wk[0].s && wk[1].s) {
        for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, gen_thread, &wk[i]) == 0);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 2; i++) {
            CHECK(wk[i].rc == 0 && wk[i].k.n_toks == 8);
            CHECK(memcmp(wk[i].k.toks, ref, sizeof(int32_t) * 8) == 0);
        }
    }
    for (int i = 0; i < 2; i++) engine_session_free(wk[i].s);

    /* bad params */
    engine_gen_params pb = greedy_params(prompt, 0, 4);
    CHECK(engine_generate(s, &pb, NULL, NULL, &st) == ENGINE_EINVAL);
    const char *empty[1] = {""};
    pb = greedy_params(prompt, np, 4);
    pb.stop_strings = empty;
    pb.n_stop_strings = 1;
    CHECK(engine_generate(s, &pb, NULL, NULL, &st) == ENGINE_EINVAL);
    pb = greedy_params(prompt, np, 4);
    pb.sampling.top_p = 2.0f;
    CHECK(engine_generate(s, &pb, NULL, NULL, &st) == ENGINE_EINVAL);
    /* no callback is fine */
    pb = greedy_params(prompt, np, 4);
    CHECK(engine_generate(s, &pb, NULL, NULL, NULL) == 0);
out:
    engine_session_free(s);
    engine_session_free(r);
    engine_session_free(small);
    engine_model_free(m);
    unlink(path);
    rmdir(tmpdir);
    return support_finish("test_forward_generate");
}
