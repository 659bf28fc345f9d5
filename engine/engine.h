/* engine.h - the request lifecycle and the step loop: the public engine API.
 *
 * An engine owns a model's backend, the KV block pool and every request.
 * Other threads submit and cancel requests and poll events; everything else
 * happens inside qengine_step, which the engine thread calls in a loop:
 * continuous batching (running sequences decode, waiting prompts fill the
 * rest of the token budget in chunks), prefix caching (a prompt reuses the
 * cached blocks of its longest cached prefix), and preemption when the pool
 * runs out of blocks: by recomputation, or by swapping the victim's blocks
 * to host memory (qengine_opts.preempt_mode).
 *
 * engine/ decides what to compute.  Here: the request lifecycle and the step
 * (engine*.c), the KV block manager (kv.*), sampling and stops (sample.*,
 * stop.*), guided decoding's token masks (guide.*), the persistent tier's
 * bridge to the store (tier.*), device choice and tensor parallelism
 * (device.c, tp.c).  Its rooms: model/ (what a model is and how files load),
 * text/ (tokenizers, chat templates), store/ (sqlite).  engine/ may include
 * its rooms, spec/, grammar/, kernels/ and base/; never server/.  The rooms
 * stand lower: model/ on kernels/ and base/, text/ on model/, store/ on
 * base/ only (scripts/check_includes.py checks). */
#ifndef QUIRE_ENGINE_H
#define QUIRE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "sample.h"

struct gram;
struct gram_vocab;
struct qmodel;
struct qstore;
struct qtok;

typedef struct qengine qengine;

/* Where the forward passes run.  AUTO: CUDA when the build has it and a
 * device is visible, else the CPU (with one log line saying why). */
typedef enum { QDEVICE_AUTO = 0, QDEVICE_CPU = 1, QDEVICE_CUDA = 2 } qdevice;

/* "auto", "cpu", "cuda"; "?" for anything else.  Cannot fail. */
const char *qdevice_name(int device);
/* Parses one of those names into *out: 0, or QERR_INVAL. */
int qdevice_parse(const char *s, int *out);
/* QDEVICE_CPU or QDEVICE_CUDA for device: AUTO becomes CUDA when the build
 * has it and a device is visible, else CPU with one log line saying why;
 * CPU and CUDA stay as they are (whether CUDA works is the backend's to say).
 * Cannot fail. */
int qdevice_resolve(int device);

/* What a preempted request loses.  RECOMPUTE: its blocks are freed and its
 * prompt and output so far are computed again when it resumes.  SWAP (vLLM's
 * swap space): the blocks it holds alone are copied to host memory and freed
 * (blocks it shares stay in the pool, referenced), and written back when it
 * resumes: no recomputation.  Swapped requests resume in the order they were
 * preempted, before any waiting prompt is admitted.  A victim whose blocks do
 * not fit in the free swap slots, or that holds no block alone, is
 * recomputed instead. */
typedef enum { QPREEMPT_RECOMPUTE = 0, QPREEMPT_SWAP = 1 } qpreempt_mode;

/* "recompute", "swap"; "?" for anything else.  Cannot fail. */
const char *qpreempt_name(int mode);
/* Parses one of those names into *out: 0, or QERR_INVAL. */
int qpreempt_parse(const char *s, int *out);

/* Swap space when QPREEMPT_SWAP is asked for with swap_space_mb 0 (vLLM's
 * default is 4 GiB). */
#define QENGINE_DEFAULT_SWAP_MB 1024

typedef struct {
    int device;             /* qdevice (default QDEVICE_AUTO) */
    int n_threads;          /* CPU threads (0: all cores) */
    int num_blocks;         /* KV pool size in blocks (0: from kv_mem_mb, or on CUDA
                             * from gpu_mem_util when kv_mem_mb is 0 too) */
    size_t kv_mem_mb;       /* KV pool budget in MiB when num_blocks is 0 (0: 256 on the
                             * CPU, float32 K/V; CUDA: what gpu_mem_util leaves) */
    float gpu_mem_util;     /* CUDA: fraction of device memory to hold (0: the backend's 0.90) */
    /* Tensor parallelism (engine/model/shard.h): the model split among this many
     * GPUs, devices 0 .. n-1 (on the CPU, as many groups of threads); 0 or
     * 1: one device.  A draft model runs whole on device 0. */
    int tensor_parallel;
    int exact;              /* CUDA: float32 weights, activations and KV (exactness tests) */
    /* The backend fills weights whose data is NULL from seed.  A model from
     * qmodel_random(host_data = 0) turns this on by itself, with its own seed. */
    int random_weights;
    uint64_t seed;
    int block_size;         /* tokens per block (default 16) */
    int max_batch_tokens;   /* token budget of one step (default 512) */
    int max_seqs;           /* sequences in one step (default 64) */
    int static_batching;    /* admit a new batch only when the previous one has finished (benchmarks) */
    int no_prefix_cache;    /* do not reuse cached blocks */
    int sample_threads;     /* threads for a step's draws: 0 (default) up to 16 when the
                             * backend is not the CPU's, else 1; > 1 forces that many */
    int preempt_mode;       /* qpreempt_mode (default QPREEMPT_RECOMPUTE) */
    /* QPREEMPT_SWAP: host memory for swapped-out blocks, in MiB, allocated
     * once at creation (pinned on CUDA) and cut into one-block slots (0:
     * QENGINE_DEFAULT_SWAP_MB).  Unused, and not allocated, with RECOMPUTE. */
    size_t swap_space_mb;
    /* The persistent prefix tier (borrowed; NULL: none): full blocks of
     * finished requests are written to it, and a prompt whose prefix is not
     * all in the pool looks the rest of its chain up there (the request
     * waits for the answer; other requests' steps do not).  The store must
     * outlive the engine. */
    struct qstore *store;
    /* 0 (default): a prefix is loaded from the tier only while loading is
     * measured faster than computing it (the GPU computes small models'
     * prefixes faster than sqlite gives them back); 1: always loaded. */
    int tier_always_load;
    /* Speculative decoding (spec/): QSPEC_NONE, QSPEC_NGRAM (drafts from
     * n-gram lookup in the request's own tokens: no second model), or
     * QSPEC_DRAFT (drafts from the draft model below).  Drafts
     * of up to spec_k tokens (1 to QENGINE_MAX_SPEC_K; 0: 4) go through the model
     * with the request's next token in one pass and are kept as far as the
     * target agrees (greedy: exactly its own choices; sampling: rejection
     * sampling, so the output is distributed as without speculation).  A
     * request's own k follows its acceptance; no request speculates in a
     * step that decodes spec_max_batch sequences or more (0: 32), where
     * the pass is bound by compute rather than by reading the weights. */
    int spec_mode;
    int spec_k;
    /* QSPEC_DRAFT: the draft model (borrowed; it must outlive the engine),
     * any model with the target's vocabulary.  It runs on the target's
     * device with a backend of its own whose K/V sit at the same block ids
     * as the target's: a request's block table serves both models, so its
     * blocks, prefix cache and preemption are the target's.  Each step it
     * proposes up to spec_k tokens for every drafting request, k batched
     * passes drawn as the request's sampler would draw them (and masked by
     * its grammar); the target verifies them with the draft's probabilities.
     * The pool is sized for both models (kv_mem_mb, or on CUDA the memory
     * left, is shared in proportion to their bytes a block). */
    const struct qmodel *draft;
    int spec_ngram_min, spec_ngram_max; /* suffix lengths looked up (0: 1 and 3) */
    int spec_max_batch;
    /* Whether drafting pays is measured, not assumed: decode steps run 8
     * with drafts and 8 without in turn, and the next 64 draft only when
     * the steps with drafts gave 5% more tokens a second (after each probe
     * lost in a row the next waits twice as long, up to 2048 steps).
     * spec_always: draft in every step (tests, benchmarks). */
    int spec_always;
} qengine_opts;

typedef enum { QSPEC_NONE = 0, QSPEC_NGRAM = 1, QSPEC_DRAFT = 2 } qspec_mode;
/* The largest spec_k (spec.h's QSPEC_MAX_K). */
#define QENGINE_MAX_SPEC_K 16
/* "none", "ngram", "draft"; "?" for anything else.  Cannot fail. */
const char *qspec_mode_name(int mode);
/* Parses one of those names into *out: 0, or QERR_INVAL. */
int qspec_mode_parse(const char *s, int *out);

void qengine_opts_default(qengine_opts *o);

#define QENGINE_MAX_STOP 16

/* One request.  Arrays are copied by qengine_submit. */
typedef struct {
    const int32_t *prompt;  /* (n_prompt) token ids, n_prompt >= 1 */
    int n_prompt;
    qsample_params sp;
    int max_tokens;         /* tokens to generate at most (>= 1) */
    int ignore_eos;
    const char *stop[QENGINE_MAX_STOP]; /* stop strings (NUL-terminated), n_stop of them */
    int n_stop;
    const int32_t *stop_ids; /* extra stop token ids */
    int n_stop_ids;
    int keep_special;       /* special tokens are output as their text (vLLM's skip_special_tokens false) */
    int include_stop_str;   /* a stop string that ends the output is part of it (vLLM's include_stop_str_in_output) */
    /* vLLM's min_tokens: the first min_tokens tokens are never EOS or a stop
     * id (their logits are -inf), and stop strings count from the
     * min_tokens-th token's text on (a stop string that ends earlier is
     * output as text).  0: off; at most max_tokens. */
    int min_tokens;
    int n;                  /* parallel samples (0 or 1: one).  They share the
                             * prompt's KV blocks; sample i draws with seed + i */
    /* Guided decoding (grammar/gram.h): every token is one the grammar
     * allows after the output so far, EOS only where the output is complete,
     * and the request ends (stop) once nothing can follow.  Both borrowed,
     * alive until the request's finish event; NULL: free text. */
    const struct gram *grammar;
    const struct gram_vocab *grammar_vocab;
    int no_spec;            /* this request does not speculate (qengine_opts.spec_mode) */
} qreq_params;

#define QENGINE_MAX_N 64
/* Most stop token ids a request may give. */
#define QENGINE_MAX_STOP_IDS 256
/* Most ids min_tokens bans (the model's EOS ids and the stop ids). */
#define QENGINE_MAX_MIN_IDS (QENGINE_MAX_STOP_IDS + 16)

typedef enum { QFINISH_NONE = 0, QFINISH_LENGTH, QFINISH_STOP, QFINISH_CANCELLED, QFINISH_ERROR } qfinish;
const char *qfinish_name(qfinish f);

/* An event for one request: a generated token with the text to show now
 * (text may be empty while UTF-8 or a possible stop string is held back), or
 * the finish with usage and timings (then token is -1). */
typedef struct {
    uint64_t id;
    int index;              /* which of the request's n samples */
    int32_t token;
    char *text;             /* owned by the event: qevent_free */
    size_t text_len;
    float logprob;          /* of token, when the request asked for logprobs */
    int n_top;              /* top_logprobs alternatives in top[], most likely first */
    qlogprob top[QSAMPLE_MAX_LOGPROBS];
    qfinish finish;         /* QFINISH_NONE for token events */
    int prompt_tokens, completion_tokens, cached_tokens;
    int cached_disk_tokens; /* of cached_tokens, those loaded from disk (the persistent tier) */
    double ttft_s, total_s; /* time to first token, and to finish, from submission */
    /* Speculative decoding, in the finish event: drafted tokens, those the
     * target kept, and the passes that verified drafts (each gives the kept
     * drafts and one token of its own). */
    int spec_drafted, spec_accepted, spec_passes;
} qevent;

void qevent_free(qevent *e);

typedef struct {
    int running, waiting;
    int kv_blocks, kv_free, kv_used, kv_cached;
    uint64_t kv_dropped;         /* blocks given back behind a sliding window (kv_seq_drop_before) */
    double kv_utilisation;  /* token slots holding real tokens / slots in used blocks */
    double kv_util_avg;     /* kv_utilisation averaged over the steps that ran */
    uint64_t prefix_hit_tokens, prompt_tokens_total;
    uint64_t tokens_computed;   /* prompt and decode tokens run through the model */
    uint64_t tokens_reused;     /* prompt tokens served from the prefix cache (memory or disk) */
    uint64_t prefill_tokens;    /* prompt tokens run through the model (recomputation included) */
    uint64_t generated;
    uint64_t preemptions;       /* requests preempted, by either mode */
    uint64_t preemptions_swap;  /* of which swapped out (the rest recompute) */
    uint64_t swap_fallbacks;    /* swap-mode victims recomputed instead: swap space
                                 * full, no block held alone, or a swapped request
                                 * dropped to unblock a stalled pool */
    uint64_t swap_ins;          /* swapped requests resumed */
    uint64_t swapped_out_blocks, swapped_in_blocks;
    int swapped;                /* requests swapped out now */
    int swap_slots, swap_slots_free;    /* swap space, in one-block slots */
    uint64_t steps;
    uint64_t finished;
    uint64_t spec_drafted, spec_accepted, spec_passes; /* speculative decoding, as qevent's */
    uint64_t spec_probes, spec_probes_won;  /* drafts measured against none, and found faster */
    uint64_t draft_passes;  /* the draft model's passes */
    uint64_t draft_tokens;  /* tokens they computed (catching up with the target, and drafts) */
    double draft_s;         /* and their time, summed (part of step_s) */
    /* The persistent tier (zeros without one). */
    uint64_t disk_lookups;          /* chains looked up */
    uint64_t disk_blocks_loaded;    /* blocks loaded from it into the pool */
    uint64_t disk_tokens_loaded;    /* their tokens: prompt tokens not computed */
    uint64_t disk_blocks_queued;    /* blocks handed to it for writing */
    uint64_t disk_blocks_dropped;   /* blocks it could not take (queue full) */
    uint64_t disk_skipped_slower;   /* prefixes computed: loading was measured slower */
    double disk_load_rate;          /* tokens/s the tier brings (moving average) */
    double prefill_rate;            /* tokens/s prefill computes (moving average) */
    /* Guided decoding. */
    uint64_t masks;                 /* token masks made */
    uint64_t masks_overlapped;      /* of which made while the forward pass ran */
    double mask_wait_s;             /* time the engine waited for masks after the forward pass */
    double mask_work_s;             /* time the masks made during passes took, summed */
    double mask_slowest_s;          /* the slowest mask of each such step, summed */
    double mask_span_s;             /* from starting a step's masks to the last one done, summed */
    double step_s;                  /* time in steps that ran a pass, summed */
    double forward_s;               /* of which in the backend's forward (the rest: the host's own work) */
    double after_s;                 /* of which after the forward (draws, tokens taken, events) */
    double feed_s;                  /* of which feeding tokens to grammars */
    double util_sum;        /* internal: sum of per-step utilisation */
} qengine_stats;

/* The grammar vocabulary of tok (grammar/gram.h): each token's bytes mid-text
 * (qtok_token_bytes); special tokens and tokens with no bytes never allowed
 * by a grammar.  0 and *out (gram_vocab_free), or QERR_NOMEM. */
int qengine_grammar_vocab(const struct qtok *tok, struct gram_vocab **out);
/* The same, but the special tokens whose bytes are one of allow[] (NULL-
 * terminated; NULL: none) are allowed where a grammar writes those bytes
 * (tool-call markers such as Mistral's [TOOL_CALLS]); *n_allowed (may be
 * NULL) gets how many were. */
int qengine_grammar_vocab_with(const struct qtok *tok, const char *const *allow, int *n_allowed,
                               struct gram_vocab **out);

/* Creates an engine for m (which must outlive it); tok (may be NULL: no
 * text, no stop strings) is borrowed too.  0 or a QERR_* code with a message. */
int qengine_create(const struct qmodel *m, const struct qtok *tok, const qengine_opts *o, qengine **out,
                   char *err, size_t errlen);
void qengine_destroy(qengine *e);

/* The backend o->device names, for m's weights, with num_blocks KV blocks
 * (0: sized from o->kv_mem_mb, or on CUDA from gpu_mem_util) and scratch for
 * max_tokens tokens per forward pass.  beside (NULL: none): a second model
 * (the draft) whose backend will hold as many blocks on the same device:
 * a pool sized here leaves room for its weights and blocks too.  qengine_create uses it; so do tools
 * that run the backend directly.  The pool size chosen is
 * (*out)->opts.num_blocks.  QERR_UNSUPPORTED "built without CUDA",
 * QERR_DEVICE (no usable device) or the backend's error, with a message. */
int qengine_backend_create(const struct qmodel *m, const qengine_opts *o, int num_blocks, int max_tokens,
                           const struct qmodel *beside, qbackend **out, char *err, size_t errlen);

/* The backend this engine runs on ("cpu", "cuda").  Cannot fail. */
const char *qengine_backend_name(const qengine *e);
/* KV blocks in the engine's pool.  Cannot fail. */
int qengine_num_blocks(const qengine *e);

/* Thread-safe.  Checks the request (QERR_INVAL / QERR_RANGE with a message:
 * empty or too long prompt, bad ids, bad sampling parameters), queues it and
 * returns its id in *id. */
int qengine_submit(qengine *e, const qreq_params *r, uint64_t *id, char *err, size_t errlen);
/* Thread-safe.  The request finishes (QFINISH_CANCELLED) at the next step;
 * QERR_NOTFOUND when no such request is live. */
int qengine_cancel(qengine *e, uint64_t id);
/* Runs one step (engine thread).  Returns the number of live requests
 * after it (0: idle), or a QERR_* code when the backend failed (requests in
 * the failed step finish with QFINISH_ERROR). */
int qengine_step(qengine *e);

/* 1 once the engine's backend can run no more passes (backend.h's broken:
 * a tensor-parallel group stopped after a GPU failed); its requests then
 * end with QFINISH_ERROR, and so would every new one.  Engine thread. */
int qengine_broken(const qengine *e);
/* Thread-safe.  Moves the oldest event into *ev: 1, or 0 when none. */
int qengine_poll(qengine *e, qevent *ev);
/* Engine thread (between steps). */
void qengine_stats_get(qengine *e, qengine_stats *s);
/* Debug: checks the KV pool's invariants, that every block's refcount
 * equals the number of requests' table entries holding it, that every swap
 * slot is free or held by exactly one swapped-out block, and that, once no
 * request is live, every block is free or cached and every swap slot free.
 * 0 or QERR_INTERNAL with a message. */
int qengine_check(qengine *e, char *err, size_t errlen);

#endif
