/*
 * engine.h - the one public door of spark-agent's inference engine.
 *
 * The engine loads model files (GGUF), tokenizes, runs the forward pass on the CPU or a CUDA GPU,
 * samples, and reports what the machine it runs on can do. It knows nothing of tools, agents or
 * JSON. It depends on libc, pthreads, libm and (optionally) CUDA only, so that it builds on the
 * GPU machine with nothing else installed (CMake option SPARK_ENGINE_ONLY).
 *
 * Conventions (shared by every module of the project):
 *   - Functions return int: 0 on success or a negative ENGINE_E* code. The detail of the last
 *     error of the calling thread is in engine_error_last(); it stays valid until the next
 *     engine call on the same thread fails.
 *   - x_new/x_free pairs; x_free(NULL) is a no-op. Out-parameters come first.
 *   - The engine never prints and never exits. Diagnostics go through engine_log(), whose sink
 *     the application installs (default: stderr, level INFO).
 *   - Unless a function says otherwise it is thread-safe with respect to distinct objects.
 */
#ifndef SPARK_ENGINE_H
#define SPARK_ENGINE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */
enum {
    ENGINE_OK = 0,
    ENGINE_EINVAL = -1,      /* bad argument from the caller */
    ENGINE_ENOMEM = -2,      /* out of host or device memory */
    ENGINE_EIO = -3,         /* file could not be opened, read, mapped or written */
    ENGINE_EFORMAT = -4,     /* malformed or hostile model file */
    ENGINE_EUNSUPPORTED = -5,/* valid input we do not support (architecture, tensor type, ...) */
    ENGINE_ENODEV = -6,      /* a requested device (GPU) is not available */
    ENGINE_ECANCELED = -7,   /* stopped by the caller's cancellation */
    ENGINE_ERANGE = -8,      /* a size limit was exceeded (context length, token count, ...) */
    ENGINE_EINTERNAL = -9,   /* a bug; the message says where */
};

/* The message describing the calling thread's last error ("" if none). Borrowed; valid until
 * the next failing engine call on this thread. */
const char *engine_error_last(void);

/* Short name of an error code ("EFORMAT"). Static string. */
const char *engine_error_name(int code);

/* ---------------------------------------------------------------------------------------------
 * Logging
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    ENGINE_LOG_DEBUG = 0,
    ENGINE_LOG_INFO = 1,
    ENGINE_LOG_WARN = 2,
    ENGINE_LOG_ERROR = 3,
    ENGINE_LOG_NONE = 4,
} engine_log_level;

/* A log sink. `msg` is one complete line without the trailing newline. Called from any thread;
 * the sink must be thread-safe. */
typedef void (*engine_log_fn)(engine_log_level level, const char *msg, void *user);

/* Install a sink (NULL restores the default stderr sink) and the minimum level it receives.
 * The process-wide sink is the one piece of shared state in the engine; set it once at start. */
void engine_log_set(engine_log_fn fn, void *user, engine_log_level min_level);

/* Log a printf-style message through the installed sink. */
void engine_log(engine_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void engine_logv(engine_log_level level, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* ---------------------------------------------------------------------------------------------
 * Build and machine facts (what `spark-agent version` and `doctor` report)
 * ------------------------------------------------------------------------------------------- */

/* Version string of the engine library, e.g. "0.1.0". Static. */
const char *engine_version(void);

/* One line describing how the engine was built: compiler, build type, CUDA on/off and
 * architectures. Static. */
const char *engine_build_info(void);

/* True when the CUDA backend was compiled into this build. */
bool engine_cuda_built(void);

typedef struct {
    char arch[16];          /* "x86_64", "aarch64", ... */
    char model_name[128];   /* from /proc/cpuinfo where available, else "" */
    int n_logical;          /* online logical CPUs */
    bool sse42, avx, avx2, fma, f16c, avx512f, avx512bw, avx512vnni, avx_vnni;
    bool neon, dotprod, i8mm, sve; /* arm64 */
} engine_cpu_info;

/* Detect the running CPU's features (not the compiler's). Never fails. */
void engine_cpu_info_get(engine_cpu_info *out);

/* The SIMD path the CPU kernels chose at run time: "avx2", "neon", "scalar", ... Static. */
const char *engine_cpu_simd_path(void);

typedef struct {
    char name[256];
    int major, minor;       /* compute capability */
    size_t total_mem;       /* bytes */
    size_t free_mem;        /* bytes, at the time of the query */
    int multiprocessors;
    int mem_bus_width_bits;
    int mem_clock_khz;      /* 0 when the runtime does not report it */
} engine_gpu_device;

#define ENGINE_MAX_GPUS 16

typedef struct {
    bool backend_built;     /* engine_cuda_built() */
    int driver_version;     /* e.g. 13000; 0 when no driver */
    int runtime_version;    /* e.g. 13000; 0 when not built */
    int n_devices;
    engine_gpu_device devices[ENGINE_MAX_GPUS];
    char status[256];       /* human sentence: why there is no GPU, or "ok" */
} engine_gpu_info;

/* Query the CUDA driver and every visible GPU. Returns 0 even when no GPU is present (then
 * n_devices is 0 and `status` says why); returns ENGINE_EINTERNAL only on an unexpected error. */
int engine_gpu_info_get(engine_gpu_info *out);

/* ---------------------------------------------------------------------------------------------
 * Models and generation
 *
 * engine_model     a loaded model file: weights (mapped, never copied on the CPU), tokenizer,
 *                  chat template, and the CPU thread pool its forward passes run on.
 * engine_session   one sequence and its KV cache: append tokens (prefill), read the logits of
 *                  the last token, truncate back to n tokens (rollback). Many per model.
 * engine_sampler   logits -> token: grammar mask, logit bias, penalties, temperature,
 *                  top-k/top-p/min-p, seeded draw (or greedy).
 * engine_generate  prompt -> streamed text on a session, with stop tokens/strings,
 *                  cancellation and per-request stats.
 *
 * Thread-safety: a model is immutable after load and may be shared by any number of threads
 * and sessions. A session (and a sampler) is used by one thread at a time. Sessions of one
 * model may run on different threads; their forward passes are serialised on the model's
 * thread pool, which uses every core for one pass at a time.
 * ------------------------------------------------------------------------------------------- */
typedef struct engine_model engine_model;
typedef struct engine_session engine_session;
typedef struct engine_sampler engine_sampler;

typedef enum {
    ENGINE_DEVICE_AUTO = 0, /* CUDA when built and a GPU is usable, else the CPU (logged) */
    ENGINE_DEVICE_CPU = 1,
    ENGINE_DEVICE_CUDA = 2, /* ENGINE_ENODEV with the reason when the GPU cannot be used */
} engine_device;

/* Static "auto" / "cpu" / "cuda"; engine_device_parse returns the device or -1. */
const char *engine_device_name(engine_device d);
int engine_device_parse(const char *name);

/* The element type of a KV cache (model params: the prefix cache; session params). */
typedef enum {
    ENGINE_KV_DEFAULT = -1, /* sessions: the model's KV type (engine_model_params.kv_type) */
    ENGINE_KV_F16 = 0,  /* half the memory of F32; logits within ~1e-3 of F32 */
    ENGINE_KV_F32 = 1,  /* exact: what the reference-logits test uses */
    ENGINE_KV_Q8_0 = 2, /* blocks of 32 values: an F16 scale + 32 int8 (34 bytes, 0.53x F16);
                         * the query is quantised to Q8_0 too for the integer K dot. CPU only
                         * (ENGINE_EUNSUPPORTED on the GPU); head_dim a multiple of 32. Logits
                         * within 2e-2 of F16's relative to the largest on 4-8 layers, 6e-2
                         * measured on 12 (test_kv_q8) */
} engine_kv_type;

/* "f16", "f32", "q8_0" ("default" for ENGINE_KV_DEFAULT, "?" otherwise). Static. */
const char *engine_kv_type_name(engine_kv_type t);
/* The type named by `name` ("f16", "f32", "q8_0"), or -2 when unknown. */
int engine_kv_type_parse(const char *name);

typedef struct {
    int version;            /* ENGINE_MODEL_PARAMS_VERSION */
    int n_threads;          /* CPU threads for the forward pass; 0 = every CPU we may use */
    int32_t n_ctx;          /* default context length of new sessions; 0 = min(trained, 4096) */
    engine_device device;
    bool vocab_only;        /* load the tokenizer and metadata only: no sessions */
    size_t prefix_cache_bytes; /* 0: off. Else a paged KV pool of this many bytes (of type
                             * kv_type), shared by the model's CPU sessions of that KV type as
                             * a prefix cache: a session whose first tokens were computed before
                             * (by a live or an ended session) reuses them instead of computing
                             * them. Not on the GPU yet (logged and ignored there). qwen35moe:
                             * the pool holds the attention layers' KV, and half the budget (at
                             * least one) goes to snapshots of the recurrent state at the end of
                             * prompts and sessions; a hit restores the latest one it covers. */
    engine_kv_type kv_type; /* the prefix cache's KV type and that of sessions created with
                             * ENGINE_KV_DEFAULT; default F16. ENGINE_KV_Q8_0 on the GPU:
                             * ENGINE_EUNSUPPORTED at load */
} engine_model_params;

#define ENGINE_MODEL_PARAMS_VERSION 1
#define ENGINE_MODEL_PARAMS_INIT                                                                \
    {ENGINE_MODEL_PARAMS_VERSION, 0, 0, ENGINE_DEVICE_AUTO, false, 0, ENGINE_KV_F16}

/* Load the GGUF file at `path` (architectures qwen3moe and qwen3). The file is mapped and
 * validated (every tensor's shape and type) before anything runs. params may be NULL
 * (defaults). Errors: ENGINE_EIO (cannot open/map), ENGINE_EFORMAT (malformed or truncated
 * file: the message names the file and the field), ENGINE_EUNSUPPORTED (architecture or tensor
 * type), ENGINE_ENODEV (device), ENGINE_ENOMEM, ENGINE_EINVAL. *out owned by the caller. */
int engine_model_load(engine_model **out, const char *path, const engine_model_params *params);

/* Free the model. Every session of the model must have been freed first. NULL: no-op. */
void engine_model_free(engine_model *m);

typedef struct {
    char arch[32];              /* GGUF general.architecture: "qwen3moe", "qwen3" */
    char name[128];             /* general.name, or "" */
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_ctx;              /* default context of new sessions */
    int32_t n_layer, n_embd, n_head, n_head_kv, head_dim;
    int32_t n_expert, n_expert_used; /* 0 for dense models */
    uint64_t n_params;          /* total parameters */
    uint64_t n_params_active;   /* parameters used per token */
    uint64_t file_size;         /* bytes */
    uint64_t weight_bytes;      /* bytes of tensor data in the file */
    char weight_type[16];       /* the most common tensor type by bytes ("q4_K", "f32") */
    int n_threads;              /* CPU threads of the forward pass */
    engine_device device;       /* the device the model runs on (never AUTO) */
    bool vocab_only;
} engine_model_info;

void engine_model_info_get(const engine_model *m, engine_model_info *out);

/* Tokenize `len` bytes of `text` (any bytes; the tokenizer is byte-level). With parse_special,
 * special-token texts such as "<|im_start|>" become their ids; without, they are plain text.
 * Writes up to `cap` ids and the total count to *n_out; when cap is too small returns
 * ENGINE_ERANGE with *n_out = the count needed (call again with a larger buffer). */
int engine_model_tokenize(const engine_model *m, const char *text, size_t len, bool parse_special,
                          int32_t *ids, size_t cap, size_t *n_out);

/* The raw bytes of a token (special tokens: their text). Borrowed from the model; NULL and
 * *len = 0 for an id out of range. */
const char *engine_model_token_bytes(const engine_model *m, int32_t id, size_t *len);

/* Concatenate the bytes of n ids into buf (cap bytes, NUL-terminated when it fits) and set
 * *len_out to the byte count (without NUL). The result may end in or contain incomplete UTF-8
 * when the ids do. ENGINE_ERANGE when buf is too small (*len_out = the size needed);
 * ENGINE_EINVAL for an id out of range. */
int engine_model_detokenize(const engine_model *m, const int32_t *ids, size_t n, char *buf,
                            size_t cap, size_t *len_out);

int32_t engine_model_n_vocab(const engine_model *m);
/* Special ids from the file's tokenizer metadata; -1 when the file has none. */
int32_t engine_model_token_bos(const engine_model *m);
int32_t engine_model_token_eos(const engine_model *m);
/* End of generation: eos, <|im_end|>, <|endoftext|> and the like. */
bool engine_model_token_is_eog(const engine_model *m, int32_t id);
/* Control / special tokens (not ordinary text). */
bool engine_model_token_is_special(const engine_model *m, int32_t id);
/* The chat template (Jinja source) from tokenizer.chat_template, or NULL. Borrowed. */
const char *engine_model_chat_template(const engine_model *m);

/* ----- sessions ----- */

typedef struct {
    int version;            /* ENGINE_SESSION_PARAMS_VERSION */
    int32_t n_ctx;          /* positions; 0 = the model's default */
    int32_t n_batch;        /* prompt tokens per forward batch; 0 = 64 */
    engine_kv_type kv_type; /* ENGINE_KV_DEFAULT: the model's (engine_model_params.kv_type) */
} engine_session_params;

#define ENGINE_SESSION_PARAMS_VERSION 1
#define ENGINE_SESSION_PARAMS_INIT {ENGINE_SESSION_PARAMS_VERSION, 0, 0, ENGINE_KV_DEFAULT}

/* Create a session on m (params may be NULL). Everything the forward pass needs (KV cache,
 * activations, logits) is allocated here, so appending tokens allocates nothing.
 * ENGINE_ENOMEM names the bytes it wanted; ENGINE_EINVAL for a vocab-only model or a bad
 * n_ctx. The session borrows m: free it before the model. */
int engine_session_new(engine_session **out, engine_model *m, const engine_session_params *p);
void engine_session_free(engine_session *s);

int32_t engine_session_n_ctx(const engine_session *s);
/* Tokens in the cache, and the tokens themselves (borrowed; valid until the next change). */
int32_t engine_session_n_tokens(const engine_session *s);
const int32_t *engine_session_tokens(const engine_session *s);

/* Run the forward pass over n tokens appended after the cached ones (a prompt: in batches of
 * n_batch; one token: a decode step). Afterwards engine_session_logits() holds the next-token
 * logits after the last appended token. When logits_all is non-NULL it receives n * n_vocab
 * floats: the logits after each appended token (speculative verification, tests).
 * ENGINE_ERANGE when the tokens do not fit the context (nothing is appended),
 * ENGINE_EINVAL for an id out of range. */
int engine_session_append(engine_session *s, const int32_t *tokens, size_t n, float *logits_all);

/* n_vocab logits after the last appended token, or NULL before the first append or after a
 * truncate. Borrowed; valid until the next append or truncate. */
const float *engine_session_logits(const engine_session *s);

/* Forget every token from position n on (rollback; 0 clears). ENGINE_EINVAL when n is beyond
 * the current length. */
int engine_session_truncate(engine_session *s, int32_t n);

/* ----- sampling ----- */

/* Grammar hook. mask: set bit i of allowed[i / 32] (bit i % 32) for each token id that may
 * come next; the sampler clears the bitset to zero before the call. Return 0, or non-zero to
 * abort generation (ENGINE_ECANCELED). accept: called with the token chosen, so the grammar can
 * advance; return 0, or non-zero to abort. Tokens the mask leaves out (end-of-generation
 * tokens included) are never sampled; the mask is applied before penalties and temperature. */
typedef int (*engine_mask_fn)(void *user, uint32_t *allowed, int32_t n_vocab);
typedef int (*engine_accept_fn)(void *user, int32_t token);

typedef struct {
    int32_t token;
    float bias;             /* added to the logit; -INFINITY bans the token */
} engine_logit_bias;

typedef struct {
    int version;            /* ENGINE_SAMPLING_PARAMS_VERSION */
    float temperature;      /* <= 0: greedy (argmax after mask, bias and penalties) */
    int32_t top_k;          /* 0: off */
    float top_p;            /* 1: off */
    float min_p;            /* 0: off; drop tokens with p < min_p * p_max */
    float repeat_penalty;   /* 1: off; CTRL-style: logit > 0 ? logit / r : logit * r */
    float presence_penalty; /* 0: off; minus this once for a token seen in the window */
    float frequency_penalty;/* 0: off; minus this times the token's count in the window */
    int32_t penalty_last_n; /* window of recent tokens (prompt included); 0: off, -1: context */
    uint64_t seed;          /* the draw is reproducible for a given seed */
    const engine_logit_bias *logit_bias; /* borrowed for the sampler's lifetime */
    size_t n_logit_bias;
    engine_mask_fn mask;    /* optional grammar hook (both may be NULL) */
    engine_accept_fn accept;
    void *grammar_user;
    /* optional, with mask: whether the grammar is in a stretch whose masks are all one mask (a
     * lazy grammar before its trigger): 1 and that mask in allowed (when not NULL), 0 not now,
     * < 0 abort. With it, engine_generate on the GPU (unless SPARK_CUDA_GEN_FREE=0) draws such
     * stretches there. grammar_sampler_free implements it. */
    engine_mask_fn free_mask;
} engine_sampling_params;

#define ENGINE_SAMPLING_PARAMS_VERSION 1
#define ENGINE_SAMPLING_PARAMS_INIT                                                                \
    {                                                                                              \
        ENGINE_SAMPLING_PARAMS_VERSION, 0.8f, 40, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f, 64, 0, NULL, 0,  \
            NULL, NULL, NULL, NULL                                                                 \
    }

/* A sampler for a vocabulary of n_vocab ids; copies params (the bias array stays borrowed).
 * Scratch for the whole vocabulary is allocated here, none per token. */
int engine_sampler_new(engine_sampler **out, const engine_sampling_params *p, int32_t n_vocab);
void engine_sampler_free(engine_sampler *s);

/* Choose the next token from n_vocab logits (not modified). Does NOT call accept and does not
 * record the token: call engine_sampler_accept with the token you keep. ENGINE_ECANCELED when
 * the mask callback aborts, ENGINE_EINVAL when the mask allows no token at all. */
int engine_sampler_sample(engine_sampler *s, const float *logits, int32_t *out_token);

/* Record a kept token: into the penalty window and, when grammar is true, through the accept
 * hook (prompt tokens go in with grammar = false). ENGINE_ECANCELED when accept aborts. */
int engine_sampler_accept(engine_sampler *s, int32_t token, bool grammar);

/* Forget the penalty window and re-seed the generator (the grammar is the caller's). */
void engine_sampler_reset(engine_sampler *s);

/* ----- generation ----- */

typedef enum {
    ENGINE_STOP_NONE = 0,
    ENGINE_STOP_LENGTH,     /* max_tokens generated */
    ENGINE_STOP_EOG,        /* an end-of-generation token of the model (not emitted) */
    ENGINE_STOP_TOKEN,      /* one of stop_tokens (not emitted) */
    ENGINE_STOP_STRING,     /* one of stop_strings (the string and what follows not emitted) */
    ENGINE_STOP_CONTEXT,    /* the session's context is full */
    ENGINE_STOP_CANCELED,   /* the callback or a grammar hook asked to stop */
} engine_stop_reason;

/* Streaming callback: `text` (len bytes, not NUL-terminated) is the next piece of generated
 * text, complete UTF-8 only, with any possible beginning of a stop string held back until it
 * is decided; it may be empty (len 0) for a token that completed nothing yet. `token` is the
 * token just generated, or -1 for the text released at the end of generation (a held-back
 * tail). Return 0 to go on, non-zero to cancel. */
typedef int (*engine_token_fn)(void *user, const char *text, size_t len, int32_t token);

typedef struct {
    int version;            /* ENGINE_GEN_PARAMS_VERSION */
    const int32_t *prompt;  /* the full prompt (borrowed) */
    size_t n_prompt;
    int32_t max_tokens;     /* tokens to generate at most; <= 0: until stop or context full */
    engine_sampling_params sampling;
    bool ignore_eog;        /* do not stop at the model's end-of-generation tokens */
    const int32_t *stop_tokens;          /* extra stop ids (borrowed) */
    size_t n_stop_tokens;
    const char *const *stop_strings;     /* NUL-terminated, non-empty (borrowed) */
    size_t n_stop_strings;
    int32_t mtp_draft;      /* 0: off. 1..4: speculative decoding with the model's MTP block
                             * (qwen35moe files that carry it, CPU): it drafts this many tokens,
                             * one forward pass verifies them; greedy output is identical to
                             * plain decoding and sampled output has the same distribution.
                             * ENGINE_EUNSUPPORTED when the model has no MTP block or runs on
                             * the GPU */
} engine_gen_params;

#define ENGINE_GEN_PARAMS_VERSION 1
#define ENGINE_GEN_PARAMS_INIT                                                                  \
    {ENGINE_GEN_PARAMS_VERSION, NULL, 0, 128, ENGINE_SAMPLING_PARAMS_INIT, false, NULL, 0, NULL, 0, \
     0}

typedef struct {
    int32_t prompt_tokens;      /* n_prompt */
    int32_t cached_tokens;      /* prompt tokens reused from the session's cache */
    int32_t generated_tokens;   /* tokens sampled (stop token included) */
    double prefill_ms;          /* forward over the uncached prompt tokens */
    int32_t decode_tokens;      /* generated tokens run through the model (decode steps) */
    double decode_ms;           /* time of those decode steps */
    double sample_ms;           /* sampler, mask hook and detokenization (with the tokens drawn
                                 * on the GPU: the host's share, run while the GPU decodes) */
    engine_stop_reason stop;
    /* speculative decoding (mtp_draft > 0): verify passes, drafted and accepted tokens in all
     * and by draft position (i = 0: the first draft of a step; a draft after a rejected one
     * counts as drafted, not accepted), so spec_accepted_at[i] / spec_drafted_at[i] is the
     * rate at which the i-th draft of a step is kept */
    int32_t spec_steps;
    int32_t spec_drafted, spec_accepted;
    int32_t spec_drafted_at[4], spec_accepted_at[4];
    double draft_ms;            /* MTP drafting (inside decode_ms) */
} engine_gen_stats;

/* Generate on session s: the session keeps the longest common prefix of its tokens and the
 * prompt (prefix reuse) and computes the rest, then samples up to max_tokens tokens, appending
 * each to the session and streaming text through cb (may be NULL). stats (may be NULL) is
 * filled also on failure. Returns 0 when generation stopped for any reason in
 * engine_stop_reason other than cancellation, ENGINE_ECANCELED when cb or a hook cancelled,
 * ENGINE_ERANGE when the prompt does not fit the context, ENGINE_EINVAL for bad params. */
int engine_generate(engine_session *s, const engine_gen_params *p, engine_token_fn cb,
                    void *user, engine_gen_stats *stats);

/* ---------------------------------------------------------------------------------------------
 * Scheduler: many requests on one model, continuously batched (engine/sched/)
 *
 * A scheduler owns one thread that runs the model for all its requests. Front ends (server,
 * agent, CLI) submit from any thread and get a request id back at once. Each engine step runs
 * one forward pass over every active sequence: a bounded chunk of prompt tokens (chunked
 * prefill, so running decodes are not stalled) plus one decode token for each generating
 * sequence. Requests keep their KV in the model's paged pool (engine_model_params.
 * prefix_cache_bytes; the scheduler sizes one from n_ctx * max_seqs when the model has none),
 * so a prompt reuses the longest prefix computed by any earlier request, and a finished or
 * cancelled request releases its blocks at once. When blocks run out the scheduler queues new
 * requests or preempts the youngest running one (its work is recomputed later); it never fails
 * a request silently and never touches another request's blocks. Admission goes in submission
 * order, except that a request waiting for room lets later requests that fit now go first, a
 * bounded number of times (engine_sched_params.max_bypass), so a large request neither blocks
 * small ones nor starves.
 *
 * Callbacks (on_token, on_done, and the sampling mask/accept hooks) run ON THE SCHEDULER
 * THREAD: keep them short (copy the text and signal your own thread) and never call
 * engine_sched_free from them; engine_sched_submit/cancel/stats_get are allowed.
 * ------------------------------------------------------------------------------------------- */
typedef struct engine_sched engine_sched;

typedef struct {
    int version;            /* ENGINE_SCHED_PARAMS_VERSION */
    int32_t max_seqs;       /* sequences decoded together; 0 = 16 */
    int32_t max_queue;      /* waiting requests before submit returns ENGINE_ERANGE; 0 = 1024 */
    int32_t prefill_chunk;  /* prompt tokens per step over all sequences; 0 = 256 */
    int32_t n_ctx;          /* positions per request (prompt + generated); 0 = model's n_ctx */
    int32_t max_bypass;     /* admission: a waiting request that does not fit yet lets later
                             * ones that fit go first, at most this many times, then nothing
                             * behind it is admitted before it; 0 = 8, -1 = strict FCFS */
} engine_sched_params;

#define ENGINE_SCHED_PARAMS_VERSION 1
#define ENGINE_SCHED_PARAMS_INIT {ENGINE_SCHED_PARAMS_VERSION, 0, 0, 0, 0, 0}

typedef struct {
    engine_gen_stats gen;       /* as engine_generate's; gen.cached_tokens = prompt tokens
                                 * served from the prefix cache */
    int32_t cache_diverged_at;  /* cache-miss explainer: -1 when the whole cached match was
                                 * used, else the prompt index where this prompt departs from
                                 * the longest cached sequence it shares a prefix with */
    int32_t preemptions;        /* times the request's blocks were reclaimed and recomputed */
    double queue_ms;            /* submit -> admitted */
    double ttft_ms;             /* submit -> first generated token */
    double total_ms;            /* submit -> done */
    uint64_t admitted_step;     /* engine_sched_stats.steps when it was first admitted */
} engine_request_stats;

/* Called exactly once per submitted request, last of its callbacks: rc 0 (why it stopped in
 * st->gen.stop), ENGINE_ECANCELED (engine_sched_cancel, or a callback returned non-zero), or
 * an error (ENGINE_ERANGE: the prompt does not fit n_ctx; ENGINE_ENOMEM: the request alone
 * needs more blocks than the pool has). */
typedef void (*engine_done_fn)(void *user, uint64_t id, int rc, const engine_request_stats *st);

typedef struct {
    engine_gen_params gen;      /* prompt, max_tokens, sampling, stops: everything is copied
                                 * at submit except sampling.logit_bias and grammar_user,
                                 * which stay borrowed until on_done */
    engine_token_fn on_token;   /* streamed text, as engine_generate's callback; may be NULL */
    engine_done_fn on_done;     /* may be NULL */
    void *user;
} engine_request;

/* Start a scheduler on m (params may be NULL). The model must outlive it. Errors:
 * ENGINE_EINVAL (vocab-only model, bad params), ENGINE_ENOMEM. */
int engine_sched_new(engine_sched **out, engine_model *m, const engine_sched_params *p);

/* Cancel everything (on_done with ENGINE_ECANCELED for each request), join the thread, free.
 * NULL: no-op. */
void engine_sched_free(engine_sched *s);

/* Queue a request; *id (never 0) names it for cancel. ENGINE_ERANGE when the queue is full or
 * the prompt cannot fit n_ctx, ENGINE_EINVAL for bad params (on_done is not called then). */
int engine_sched_submit(engine_sched *s, const engine_request *r, uint64_t *id);

/* Cancel a queued or running request: it stops within one engine step, releases its blocks,
 * and gets on_done(ENGINE_ECANCELED). ENGINE_EINVAL when the id is unknown or already done. */
int engine_sched_cancel(engine_sched *s, uint64_t id);

typedef struct {
    int32_t running;            /* sequences admitted (prefilling or decoding) */
    int32_t queued;             /* waiting for admission */
    int32_t blocks_total, blocks_used, blocks_cached, blocks_pinned;
    int32_t block_tokens;       /* positions per KV block */
    uint64_t requests_done;     /* finished requests, whatever their rc */
    uint64_t requests_canceled; /* those of them that ended with ENGINE_ECANCELED */
    uint64_t preemptions;
    uint64_t prompt_tokens, cached_tokens, generated_tokens; /* totals over finished requests */
    uint64_t steps;             /* engine steps run */
} engine_sched_stats;

void engine_sched_stats_get(engine_sched *s, engine_sched_stats *out);

/* ---------------------------------------------------------------------------------------------
 * Persisted prefixes (engine/kv/persist.c)
 *
 * The KV of a prompt prefix (an agent's system prompt and tool definitions) saved to a file
 * and loaded into the prefix cache of a model in a later process, so the first request after
 * a restart does not recompute it. Needs a model with a prefix cache (engine_model_params.
 * prefix_cache_bytes, CPU); a loaded or saved prefix is pinned (never evicted) until
 * engine_prefix_unpin. Only whole KV blocks are stored: the first floor(n / B) * B tokens,
 * B = engine_sched_stats.block_tokens (16); the rest of a prompt is computed as usual.
 *
 * A file holds: a header (magic, version, the model's fingerprint, KV type and layout, token
 * and block counts, byte sizes, a hash of the tokens, a hash of the KV data and a hash of the
 * header itself), the token ids, then the KV of each block. Loading checks every field against
 * the model and the file's size, every token id against the vocabulary and all three hashes
 * before anything enters the cache.
 *
 * The model fingerprint (128 bits) is cheap for a 20 GB file: it hashes the file size, the
 * whole GGUF header, metadata and tensor table (tokenizer, hyper-parameters, every tensor's
 * name, shape, type and offset) and 256 pages of 4 KiB of tensor data at fixed offsets spread
 * over the data section (about 1 MiB read). It detects another model, a re-quantisation, a
 * fine-tune or another seed of the same shape (their data differs on every page), a changed
 * tokenizer or template, and a truncated or extended file. It does not detect a change
 * confined to tensor data outside the sampled pages (a hand-patched weight), and the hashes
 * are not cryptographic: they catch accidents (corruption, stale files), not a forger with
 * write access to the cache directory.
 *
 * A hybrid model's (qwen35moe) file (format version 2) also holds the recurrent (conv + DeltaNet)
 * state at the prefix's end, covered by the payload hash; the load puts it into the prefix's
 * snapshot slot, so a later prompt over the prefix restores it. A version 1 file (no state) is
 * refused by a hybrid model and a version 2 file by any other (ENGINE_EUNSUPPORTED).
 *
 * Writes are atomic: a temporary file in the same directory, fsync, rename over the target,
 * fsync of the directory; a failed save leaves the previous file (or none) and no temporary.
 * Thread-safe with respect to the model's sessions (the model's KV lock is taken).
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    int32_t n_tokens;        /* tokens whose KV the file holds (whole blocks) */
    int32_t n_blocks;
    int32_t computed_tokens; /* save: positions that had to be computed (not cached) */
    int32_t inserted_blocks; /* load: blocks that were not in the cache already */
    uint64_t file_bytes;
} engine_prefix_info;

/* Compute what is missing of the KV of tokens[0, floor(n / B) * B) in m's prefix cache, pin
 * it and write it to path (atomically, replacing any file there). info may be NULL. Errors:
 * ENGINE_EINVAL (no prefix cache, fewer than B tokens, an id out of range), ENGINE_ENOMEM (the
 * pool cannot hold the prefix), ENGINE_ERANGE (longer than the model's context), ENGINE_EIO
 * (the file cannot be written; the message names it and the reason). */
int engine_prefix_save(engine_model *m, const int32_t *tokens, size_t n, const char *path,
                       engine_prefix_info *info);

/* Load the prefix saved at path into m's prefix cache, pinned. With tokens non-NULL, the file
 * must hold exactly the prefix tokens[0, floor(n / B) * B); with NULL, whatever it holds.
 * info may be NULL. Errors, each with a message naming the file and the field, and nothing
 * inserted: ENGINE_EIO (cannot open or read), ENGINE_EFORMAT (not a prefix file, truncated,
 * damaged: a hash or size does not match, an id out of range), ENGINE_EUNSUPPORTED (another
 * format version), ENGINE_EINVAL (another model, KV type or layout, other tokens, no prefix
 * cache), ENGINE_ENOMEM (the pool cannot hold it; unpinned cached blocks may have been
 * evicted in the attempt). */
int engine_prefix_load(engine_model *m, const char *path, const int32_t *tokens, size_t n,
                       engine_prefix_info *info);

/* Drop one pin of the prefix tokens[0, floor(n / B) * B) (saved or loaded before): it becomes
 * evictable again when no other pin holds it. ENGINE_EINVAL when it is not pinned. */
int engine_prefix_unpin(engine_model *m, const int32_t *tokens, size_t n);

/* The file for the prefix tokens[0, floor(n / B) * B) of m in the spark-agent cache:
 * $XDG_CACHE_HOME/spark-agent/prefixes/<key>.kvp (else ~/.cache/...), the directory created;
 * the key hashes the model fingerprint, the KV type and layout and the tokens, so another
 * model or prompt names another file. Errors: ENGINE_EINVAL (no prefix cache, fewer than B
 * tokens), ENGINE_ERANGE (buf too small), ENGINE_EIO (no cache directory). */
int engine_prefix_default_path(engine_model *m, const int32_t *tokens, size_t n, char *buf,
                               size_t cap);

/* ---------------------------------------------------------------------------------------------
 * Random-model generator (engine/gen/)
 *
 * engine_model_gen() writes a GGUF file with the exact tensor names and metadata of a
 * converted model of a preset shape ("tiny", "qwen3-tiny", "small", "qwen3-0.6b",
 * "qwen3-30b-a3b"), random weights fully determined by the seed (the same bytes for any thread
 * count), and the real Qwen3 tokenizer and chat template. Optionally it writes the same weights
 * as Hugging Face safetensors + config.json for transformers' Qwen3MoeForCausalLM /
 * Qwen3ForCausalLM, in F32: for quantised types the dequantised values, exactly what the
 * engine computes with. It uses every core; thread-safe (no shared state).
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    const char *name;       /* GGUF tensor name, "blk.0.attn_q.weight" */
    const char *type;       /* ggml type name: "f32", "q4_K", ... */
    int n_dims;
    int64_t ne[4];          /* ggml order: ne[0] is the row length; unused dimensions are 1 */
    uint64_t nbytes;
} engine_model_gen_tensor;

typedef void (*engine_model_gen_tensor_fn)(void *user, const engine_model_gen_tensor *t);

typedef struct {
    int version;                /* ENGINE_MODEL_GEN_PARAMS_VERSION */
    const char *preset;         /* a name from engine_model_gen_preset(); default "tiny" */
    const char *type;           /* one of engine_model_gen_types(); default "f32" */
    uint64_t seed;
    const char *out_path;       /* the GGUF file, written atomically (path.tmp, then rename) */
    const char *safetensors_dir;/* NULL, or a directory (created if absent) that receives
                                 * model.safetensors, config.json, tokenizer.json and
                                 * tokenizer_config.json */
    const char *tokenizer_dir;  /* directory of tokenizer.json + tokenizer_config.json; NULL:
                                 * the tokenizer embedded at build time (EINVAL if none) */
    int n_threads;              /* 0: every online CPU */
    bool dry_run;               /* report the tensors through on_tensor, write nothing */
    engine_model_gen_tensor_fn on_tensor; /* optional: each tensor in file order, before any
                                           * data is written (borrowed strings) */
    void *user;
    /* optional: bytes of tensor data written so far out of the total, called on the calling
     * thread about twice a second while writing and once at the end (user as above) */
    void (*on_progress)(void *user, uint64_t done, uint64_t total);
    uint32_t n_layer;           /* 0: the preset's block count; else that many blocks of the
                                 * preset's shape (a cut-down model for quick per-layer timing;
                                 * qwen35moe: a multiple of its full-attention interval) */
} engine_model_gen_params;

#define ENGINE_MODEL_GEN_PARAMS_VERSION 1

/* Defaults: preset "tiny", type "f32", seed 0, all threads, no outputs. */
void engine_model_gen_params_init(engine_model_gen_params *p);

/* Generate. Errors: ENGINE_EINVAL (unknown preset or type, missing output, no tokenizer),
 * ENGINE_EIO (cannot write; nothing is left behind but the error), ENGINE_ENOMEM. */
int engine_model_gen(const engine_model_gen_params *p);

/* Presets: the i-th name (NULL past the end) and its one-line description. Static strings. */
size_t engine_model_gen_preset_count(void);
const char *engine_model_gen_preset(size_t i, const char **description);

/* "f32|f16|bf16|q8_0|q4_0|q4_k_m|q5_k_m|q6_k" (static). */
const char *engine_model_gen_types(void);

/* True when the Qwen3 tokenizer files were embedded at build time. */
bool engine_model_gen_tokenizer_embedded(void);

/* The path of the default model (the "tiny" preset, type q8_0, seed 0), generating it on first
 * use into $XDG_CACHE_HOME/spark-agent/models/ (default ~/.cache/spark-agent/models/), named
 * after the generator version, preset, type and seed so that a new generator never reuses a
 * stale file. Generation is atomic and serialised between processes by a lock file. Writes a
 * NUL-terminated path into buf. Errors: ENGINE_ERANGE (buf too small), ENGINE_EIO, and those
 * of engine_model_gen (e.g. no embedded tokenizer). */
int engine_default_model_path(char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* SPARK_ENGINE_H */
