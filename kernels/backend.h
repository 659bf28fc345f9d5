/* backend.h - the interface every compute backend implements.
 *
 * A backend is created from a model's weights (qweights: hyperparameters and
 * tensors that stay owned by the model) and a KV-cache geometry (num_blocks
 * blocks of block_size tokens, for every layer, K and V).  It then runs
 * forward passes over batches of sequences.  Each sequence reads and writes
 * its K/V through a block table: logical block i of the sequence lives in
 * physical block table[i].  The engine owns the tables (engine/kv.*); the
 * backend owns the block memory.
 *
 * kernels/ is how the engine's work is computed: this interface, the CPU
 * backend (cpu/: the reference, threaded SIMD) and the CUDA one (cuda/).
 * Kernels include this header, their own folder and base/, nothing else
 * (scripts/check_includes.py checks); the engine above calls them only
 * through the qbackend table.
 */
#ifndef QUIRE_BACKEND_H
#define QUIRE_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "qerr.h"

/* ---- tensors ---------------------------------------------------------- */

typedef enum { QDT_F32 = 0, QDT_F16 = 1, QDT_BF16 = 2 } qdtype;

/* Bytes per element; 0 for an unknown dtype. */
static inline size_t qdt_size(int dt) { return dt == QDT_F32 ? 4 : (dt == QDT_F16 || dt == QDT_BF16) ? 2 : 0; }
static inline const char *qdt_name(int dt) { return dt == QDT_F32 ? "F32" : dt == QDT_F16 ? "F16" : dt == QDT_BF16 ? "BF16" : "?"; }

/* A view of a dense row-major tensor.  shape is in PyTorch order: shape[0]
 * is the outermost (slowest) dimension, so a linear layer's weight is
 * (out_features, in_features) and each output row is contiguous.  data is
 * NULL for an absent optional tensor.  The bytes belong to the model. */
#define QT_MAX_DIMS 4
typedef struct {
    const void *data;
    qdtype dtype;
    int ndim;
    int64_t shape[QT_MAX_DIMS];
} qtensor;

static inline int64_t qt_numel(const qtensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* ---- model hyperparameters and weights -------------------------------- */

/* LongRoPE (Phi-3/4): the frequencies divided by a factor each, long or
 * short (qweights.rope_freqs holds the set in use), and cos / sin times
 * rope_mscale. */
typedef enum { QROPE_SCALE_NONE = 0, QROPE_SCALE_LLAMA3 = 1, QROPE_SCALE_LINEAR = 2, QROPE_SCALE_LONGROPE = 3 } qrope_scale;
/* The gated MLP's activation: act(x W_gate^T) * (x W_up^T). */
typedef enum { QACT_SILU = 0, QACT_GELU_TANH = 1 } qact;
/* Where the norms sit: before each block (x + f(norm(x))), or before and
 * after it (x + norm(f(norm(x))), Gemma 2/3's "sandwich"). */
typedef enum { QNORM_PRE = 0, QNORM_SANDWICH = 1 } qnorm_place;

/* A model's hyperparameters and the feature flags of its family (its row in
 * engine/model/arch.c): the backends compute from these, never from the
 * family's name. */
typedef struct {
    int family;        /* the family's row (qfamily_get), for names and the fingerprint */
    int n_vocab;
    int dim;           /* hidden size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;      /* usually dim / n_heads, but may be set explicitly */
    int ffn_dim;       /* intermediate size of the SwiGLU MLP */
    int max_ctx;       /* trained context length */
    float norm_eps;    /* RMSNorm epsilon */
    float rope_theta;  /* RoPE base frequency */
    int rope_dim;      /* dimensions rotated per head (normally head_dim) */
    /* 1: rotate-half pairs (i, i + rope_dim/2), the HF layout and GGUF Qwen2;
     * 0: adjacent pairs (2i, 2i+1), llama.cpp's permuted Llama GGUF layout. */
    int rope_neox;
    qrope_scale rope_scaling;
    float rope_factor;           /* llama3 / linear */
    float rope_low_freq_factor;  /* llama3 */
    float rope_high_freq_factor; /* llama3 */
    int rope_orig_ctx;           /* llama3, longrope: original_max_position_embeddings */
    float rope_mscale;           /* longrope: cos and sin times this (0: 1) */
    int rope_long;               /* longrope: the long factors are in use (the context passes rope_orig_ctx) */
    int tied_embeddings;         /* output projection is tok_embd */
    int attn_bias;               /* q/k/v projections have biases (Qwen2) */
    /* Feature flags beyond the Llama baseline.  A backend that does not
     * compute one refuses the model (qhp_unsupported) rather than compute
     * something else. */
    qact act;
    qnorm_place norm_place;
    int qk_norm;                 /* RMSNorm over each head's q and k before RoPE (Qwen3, Gemma 3) */
    float attn_softcap;          /* attention logits -> c*tanh(x/c); 0: none (Gemma 2) */
    float final_softcap;         /* output logits likewise; 0: none */
    int embed_scale;             /* embeddings times sqrt(dim) (Gemma) */
    int n_experts;               /* MoE: experts per layer; 0: a dense MLP */
    int n_experts_used;          /* MoE: experts each token is routed to */
    /* RMSNorm scales by (1 + weight) rather than weight (Gemma's HF
     * checkpoints; llama.cpp's converter adds the 1 into its GGUF files). */
    int norm_add_one;
    float attn_scale;            /* attention logits' scale; 0: 1 / sqrt(head_dim) (Gemma:
                                  * query_pre_attn_scalar^-1/2) */
    /* Sliding-window attention: a local layer's token at position i attends
     * to positions j with i - window < j <= i (as transformers and
     * llama.cpp mask it); 0: none.  Which layers are local: qhp_layer_local. */
    int window;
    int window_pattern;          /* 0: every layer local; n > 0: every n-th layer (l % n == n - 1)
                                  * global, the others local (Gemma 2: 2, Gemma 3: 6) */
    float rope_theta_local;      /* RoPE base of local layers, unscaled; 0: as the global ones */
    int nope_interval;           /* n > 0: every n-th layer (l % n == n - 1) attends without RoPE
                                  * (SmolLM3: 4); 0: every layer rotates */
} qhparams;

/* Whether layer l attends through the sliding window.  Cannot fail. */
static inline int qhp_layer_local(const qhparams *hp, int l)
{
    if (hp->window <= 0) return 0;
    return hp->window_pattern <= 0 || l % hp->window_pattern != hp->window_pattern - 1;
}

/* Whether layer l rotates q and k (RoPE); not where it is a NoPE layer. */
static inline int qhp_layer_rope(const qhparams *hp, int l)
{
    return hp->nope_interval <= 0 || l % hp->nope_interval != hp->nope_interval - 1;
}

/* The window every layer attends within (the KV cache need hold no more of
 * a sequence than that): the window when every layer is local, else 0. */
static inline int qhp_all_local_window(const qhparams *hp)
{
    for (int l = 0; l < hp->n_layers; l++)
        if (!qhp_layer_local(hp, l)) return 0;
    return hp->window > 0 ? hp->window : 0;
}

/* Features beyond the Llama baseline that a backend computes (its caps for
 * qhp_unsupported). */
enum {
    QHP_QK_NORM = 1u, QHP_GELU = 2u, QHP_SANDWICH = 4u, QHP_SOFTCAP = 8u, QHP_EMBED_SCALE = 16u,
    QHP_NORM_ADD_ONE = 32u, QHP_ATTN_SCALE = 64u, QHP_WINDOW = 128u, QHP_ROPE_LOCAL = 256u, QHP_NOPE = 512u,
    QHP_ALL = 1023u
};

/* The first feature of hp beyond the Llama baseline and the backend's
 * feats (QHP_*), by name, or NULL when there is none.  Cannot fail. */
static inline const char *qhp_unsupported(const qhparams *hp, unsigned feats)
{
    if (hp->act != QACT_SILU && !(feats & QHP_GELU)) return "a GELU MLP";
    if (hp->norm_place != QNORM_PRE && !(feats & QHP_SANDWICH)) return "sandwich norms";
    if (hp->qk_norm && !(feats & QHP_QK_NORM)) return "QK-norm";
    if ((hp->attn_softcap > 0 || hp->final_softcap > 0) && !(feats & QHP_SOFTCAP)) return "logit soft-capping";
    if (hp->embed_scale && !(feats & QHP_EMBED_SCALE)) return "scaled embeddings";
    if (hp->norm_add_one && !(feats & QHP_NORM_ADD_ONE)) return "(1 + weight) RMSNorm";
    if (hp->attn_scale > 0 && !(feats & QHP_ATTN_SCALE)) return "a set attention scale";
    if (hp->window > 0 && !(feats & QHP_WINDOW)) return "sliding-window attention";
    if (hp->rope_theta_local > 0 && !(feats & QHP_ROPE_LOCAL)) return "a local layers' RoPE base";
    if (hp->nope_interval > 0 && !(feats & QHP_NOPE)) return "layers without RoPE";
    if (hp->n_experts) return "mixture-of-experts layers";
    return NULL;
}

typedef struct {
    qtensor attn_norm;           /* (dim) */
    qtensor wq, wk, wv;          /* (n_heads*head_dim, dim), (n_kv_heads*head_dim, dim) x2 */
    qtensor bq, bk, bv;          /* biases, or data == NULL */
    qtensor wo;                  /* (dim, n_heads*head_dim) */
    qtensor ffn_norm;            /* (dim) */
    qtensor w_gate, w_up;        /* (ffn_dim, dim) */
    qtensor w_down;              /* (dim, ffn_dim) */
    /* Added with the families that have them (absent: ndim 0); the tensors
     * above are the first QLAYER_BASE of the struct, the fingerprint's. */
    qtensor q_norm, k_norm;      /* QK-norm: (head_dim) RMSNorm weights, shared by every head */
    qtensor post_attn_norm;      /* sandwich norms: (dim) after attention ... */
    qtensor post_ffn_norm;       /* ... and after the MLP (ffn_norm is then the MLP's pre-norm) */
} qlayer;
#define QLAYER_BASE 12

typedef struct {
    qhparams hp;
    qtensor tok_embd;            /* (n_vocab, dim) */
    qtensor out_norm;            /* (dim) */
    qtensor output;              /* (n_vocab, dim); same bytes as tok_embd when tied */
    qtensor rope_freqs;          /* optional (rope_dim/2) frequency divisors (GGUF llama3; LongRoPE's factors) */
    qlayer *layers;              /* n_layers entries */
} qweights;

/* ---- batches ---------------------------------------------------------- */

/* One sequence's slice of a batch.  Its n_tokens new tokens are
 * batch->tokens[first .. first+n_tokens) at positions pos0 .. pos0+n_tokens-1;
 * positions 0 .. pos0-1 are already in the KV cache.  block_table holds at
 * least ceil((pos0+n_tokens) / block_size) physical block ids; on a model
 * whose every layer is local (qhp_all_local_window), the entries before
 * qbatch_first_block may be negative: blocks no token of the pass attends
 * to, given back to the pool. */
typedef struct {
    int first;
    int n_tokens;
    int pos0;
    const int32_t *block_table;
    int n_blocks;
} qbatch_seq;

/* The first block_table entry a pass over s reads.  Cannot fail. */
static inline int qbatch_first_block(const qhparams *hp, const qbatch_seq *s, int block_size)
{
    const int w = qhp_all_local_window(hp);
    return w > 0 && s->pos0 - w + 1 > 0 ? (s->pos0 - w + 1) / block_size : 0;
}

/* A forward pass over several sequences at once.  logits_idx lists the
 * batch token indices whose logits are wanted, in increasing order; the
 * pass writes n_logits rows of n_vocab floats, row r for logits_idx[r]. */
typedef struct {
    int n_tokens;
    const int32_t *tokens;       /* (n_tokens) */
    int n_seqs;
    const qbatch_seq *seqs;      /* (n_seqs), disjoint token ranges */
    int n_logits;
    const int32_t *logits_idx;   /* (n_logits) */
    /* Optional (NULL: off): rows reduced to a token by the backend.  For
     * every r with row_mode[r] == QROW_ARGMAX the pass writes row_token[r],
     * the lowest id among the maximal logits of row r (NaN never wins; all
     * NaN: 0), as qsample_argmax does; with QROW_SAMPLE (backends with
     * QBE_CAP_ROW_SAMPLE only) it writes the draw qrow_sample describes (the
     * other entries are unspecified).  When every row is such a row the
     * logits may be left unwritten: the CUDA backend then copies back only
     * the ids. */
    const uint8_t *row_mode;     /* (n_logits) QROW_* */
    int32_t *row_token;          /* (n_logits) */
    const struct qrow_sample *row_sample; /* (n_logits) for QROW_SAMPLE rows, or NULL */
    /* Optional (NULL: off; backends with QBE_CAP_ROW_LOGPROBS): for reduced
     * rows whose qrow_sample asks for n_logprobs, the chosen id's
     * log-probability and the most likely ids, as qsample_logprobs gives
     * them from the raw logits.  n stays -1 where the backend left a row
     * to the host (a draw it gave back). */
    struct qrow_logprobs *row_logprobs;  /* (n_logits) */
    /* Optional (NULL: none; backends with QBE_CAP_ROW_MASK): the token
     * masks of guided rows, applied before a row is reduced or copied back. */
    const struct qrow_masks *masks;
} qbatch;

/* Guided decoding's masks for a pass: row[r] NULL (no mask) or (n_vocab +
 * 31) / 32 words, bit i % 32 of word i / 32 set where token i is allowed;
 * the pass sets the logits of the other tokens to -inf.  ready, when set,
 * is called once the pass is under way on the device and before any mask
 * is read: the caller may go on making the masks on the host until then
 * (0, or an error, which fails the pass). */
typedef struct qrow_masks {
    const uint32_t *const *row; /* (n_logits) */
    int (*ready)(void *ctx);
    void *ctx;
} qrow_masks;

/* 1 + the most alternatives a row's log-probabilities may list (OpenAI's 20). */
#define QROW_MAX_LOGPROBS 21

typedef struct qrow_logprobs {
    int n;                       /* entries written: the chosen id, then the top n - 1 (-1: not done) */
    int32_t id[QROW_MAX_LOGPROBS];
    float logprob[QROW_MAX_LOGPROBS];
} qrow_logprobs;

enum { QROW_LOGITS = 0, QROW_ARGMAX = 1, QROW_SAMPLE = 2 };

/* A draw the backend makes for one row, as sample.c's draw() does with
 * temperature > 0: probabilities softmax(logits / temperature) (an +inf
 * logit takes all the mass, NaN none); candidates the ids of positive
 * probability in ascending id order; with top_k, the k most probable (ties:
 * lower ids), then with top_p the nucleus of the renormalised top-k (or of
 * all), sorted by probability (ties by id); min_p drops those below min_p
 * times the largest; then the first candidate whose running sum exceeds u
 * times the candidates' mass (the last one if none does).  All logits
 * -inf: id 0.  A backend that cannot make a draw (too many candidates for
 * a nucleus) writes -1 and the row's logits: the host then draws with u. */
typedef struct qrow_sample {
    float temperature;           /* > 0 */
    float min_p;                 /* 0: off */
    int top_k;                   /* 0: off */
    float top_p;                 /* 1: off */
    double u;                    /* uniform in [0, 1), from the request's stream */
    int n_logprobs;              /* QROW_ARGMAX and QROW_SAMPLE rows: 0, or 1 + the alternatives
                                  * wanted in row_logprobs (at most QROW_MAX_LOGPROBS) */
} qrow_sample;

/* The argmax row rule above, for backends that reduce on the host. */
static inline int32_t qrow_argmax(const float *row, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best] || (row[best] != row[best] && row[i] == row[i])) best = i;
    return best;
}

/* ---- the backend ------------------------------------------------------ */

typedef struct qbackend qbackend;

typedef struct {
    int n_threads;      /* CPU worker threads (0: all cores) */
    int num_blocks;     /* KV blocks in the pool.  CUDA: 0 sizes the pool from
                         * the device memory left after the weights and scratch
                         * (gpu_mem_util); the backend writes the number it
                         * chose back into its own opts, where its owner may
                         * lower it (tensor parallelism's ranks agree on the
                         * smallest pool): ids from there on are refused. */
    int block_size;     /* tokens per block */
    /* CUDA: keep weights, activations and KV in float32 (exactness tests);
     * otherwise weights are bf16 (f16 checkpoints stay f16) with float32
     * accumulation. */
    int exact;
    float gpu_mem_util; /* CUDA: fraction of the device memory quire may hold (0: 0.90) */
    /* Tensors whose data is NULL are filled with random values from seed
     * (benchmarks on real shapes without a checkpoint).  CUDA fills on the
     * device; the CPU backend refuses NULL weights. */
    int random_weights;
    uint64_t seed;
    /* Random weights: the layers' output projections (wo, w_down) drawn
     * from a range this many times the others' (0: the same), as
     * qmodel_random_ex does on the host.  Each layer's values depend on its
     * place only, so that a model cut to fewer layers (the same seed) holds
     * exactly the first layers. */
    float random_residual;
    int max_tokens;     /* CUDA: most tokens one forward pass will carry (0: 2048);
                         * scratch is sized for it up front */
    /* CUDA, when it sizes the pool (num_blocks 0): device memory another
     * backend on the same device will take (a draft model's weights and
     * scratch), left free, and bytes that backend will hold for each block
     * of this pool (its K/V at the same block ids), counted with each. */
    size_t reserve_bytes;
    size_t extra_block_bytes;
    /* Tensor parallelism: the backend holds one shard of the model
     * (engine/model/shard.h) and calls allreduce(allreduce_ctx, buf, n, stream,
     * copy, copy_dt) on the n floats of each layer's output and down
     * projections, its partial sums; allreduce leaves in buf their sum over
     * every shard, the same bits on each, and in copy (NULL: none; CUDA
     * only) the sum converted to copy_dt (bf16 or f16).  The CPU backend's
     * buf is host memory and stream NULL (the sum is done on return); the
     * CUDA backend's buf is device memory and stream its cudaStream_t (the
     * sum is enqueued there).  0, or a QERR_* code that fails the pass.
     * NULL: the whole model. */
    int (*allreduce)(void *ctx, float *buf, size_t n, void *stream, void *copy, int copy_dt);
    void *allreduce_ctx;
    /* With allreduce: the shard's rank.  The passes of ranks other than 0
     * give no logits (rank 0's pass gives them): their logits, row tokens
     * and log-probabilities are not written, masks are not read. */
    int tp_rank;
    /* CUDA: the device the backend lives on (0: the first); every call into
     * the backend may come from any thread. */
    int device;
} qbackend_opts;

typedef struct {
    const char *name;
    /* Runs one forward pass; writes (batch->n_logits, n_vocab) floats into
     * logits.  Returns 0 or a QERR_* code; on error the KV contents of the
     * batch's new positions are undefined, nothing else changes. */
    int (*forward)(qbackend *be, const qbatch *batch, float *logits);
    /* Copies every layer's K and V of block src into block dst. */
    int (*copy_block)(qbackend *be, int src, int dst);
    /* Bytes of one block across all layers (K and V). */
    size_t (*block_bytes)(const qbackend *be);
    /* Reads / writes one block's bytes (all layers) for the persistent tier
     * and for swapping to host memory: every layer's K, then every layer's
     * V, each (n_kv_heads, block_size, head_dim) elements, on every backend
     * (tensor parallelism puts its shards' heads together so). */
    int (*read_block)(qbackend *be, int block, void *dst);
    int (*write_block)(qbackend *be, int block, const void *src);
    void (*destroy)(qbackend *be);
    /* Optional (NULL: a loop over read_block / write_block): n blocks at
     * once, block i's bytes at host + i * block_bytes, one wait for all. */
    int (*read_blocks)(qbackend *be, const int32_t *blocks, int n, void *host);
    int (*write_blocks)(qbackend *be, const int32_t *blocks, int n, const void *host);
    /* Optional (NULL: malloc / free): host memory that transfers fast
     * (pinned, on CUDA), for blocks swapped out of the pool. */
    void *(*host_alloc)(qbackend *be, size_t bytes);
    void (*host_free)(qbackend *be, void *p);
    unsigned caps;               /* QBE_CAP_* */
    /* Optional (NULL: none; with QBE_CAP_ROW_MASK): host memory for the
     * masks of n_rows rows of the next pass, row r at r * ((n_vocab + 31) /
     * 32) words; a qrow_masks row that points there is read in place (no
     * copy).  NULL when out of memory. */
    uint32_t *(*mask_rows)(qbackend *be, int n_rows);
    /* Optional (NULL: never): 1 once the backend can run no more passes
     * (tensor parallelism: a rank failed while the others waited for it,
     * and the group was stopped); every later call fails. */
    int (*broken)(const qbackend *be);
} qbackend_ops;

/* A backend that runs some passes as captured graphs (CUDA) does so for
 * those where every token has a logit row and no sequence has more than
 * this many tokens (a decode and up to 16 drafts to verify). */
#define QBE_GRAPH_SEQ_TOKENS 17

/* The backend draws QROW_SAMPLE rows itself. */
#define QBE_CAP_ROW_SAMPLE 1u
/* ... and fills row_logprobs for reduced rows. */
#define QBE_CAP_ROW_LOGPROBS 2u
/* The backend applies qbatch.masks. */
#define QBE_CAP_ROW_MASK 4u

struct qbackend {
    const qbackend_ops *ops;
    const qweights *w;
    qbackend_opts opts;
};

/* The CPU backend (kernels/cpu).  Returns 0 and *out, or a QERR_* code with
 * a message in err. */
int cpu_backend_create(const qweights *w, const qbackend_opts *opts, qbackend **out,
                       char *err, size_t errlen);

/* RoPE inverse frequencies (rope_dim / 2 floats) for w: theta, llama3 or
 * linear scaling, GGUF rope_freqs.  Always float32, whatever the weights'
 * dtype (as vLLM and llama.cpp compute them: rounding them to a bf16
 * checkpoint's dtype moves the logits by about 1%).  Every backend uses this
 * one definition.  Cannot fail. */
void qrope_inv_freq(const qweights *w, float *inv_freq);
/* Those of local layers (rope_theta_local, unscaled) when local is set and
 * the model has a local base, else qrope_inv_freq's.  Cannot fail. */
void qrope_inv_freq_layer(const qweights *w, int local, float *inv_freq);

#ifdef QUIRE_HAVE_CUDA
/* The CUDA backend (kernels/cuda): bf16/f16 weights (float32 with
 * opts->exact), cuBLAS projections, paged-attention kernels.  QERR_DEVICE
 * with a message when there is no usable device or a CUDA call fails. */
int cuda_backend_create(const qweights *w, const qbackend_opts *opts, qbackend **out, char *err, size_t errlen);
/* Free and total bytes of device memory; 0 or QERR_DEVICE. */
int cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* Tensor parallelism between the GPUs of this process (cuda_tp.cu): NCCL
 * communicators for devices 0 .. n-1, one a rank, each CUDA backend on a
 * shard given allreduce = cuda_tp_allreduce, allreduce_ctx =
 * cuda_tp_member(g, rank), device = rank.  NCCL is loaded by the first
 * cuda_tp_create (libnccl.so.2, or the file QUIRE_NCCL_LIB names):
 * QERR_UNSUPPORTED with a message when it cannot be, QERR_DEVICE when a
 * device or NCCL fails.  NVLink multicast (NVLS) stays off unless
 * NCCL_NVLS_ENABLE is set. */
#define CUDA_TP_MAX 16
typedef struct cuda_tp cuda_tp;
int cuda_tp_create(int n, cuda_tp **out, char *err, size_t errlen);
void *cuda_tp_member(cuda_tp *g, int rank);
int cuda_tp_allreduce(void *member, float *buf, size_t n, void *stream, void *copy, int copy_dt);
/* Ends every pending and later all-reduce of the group with an error (a
 * rank failed: the others would wait for it forever). */
void cuda_tp_abort(void *g);
/* 1 while the group can sum: not aborted, and none of its sums gave up
 * waiting for a peer (those leave what they had; the pass is not the
 * model's). */
int cuda_tp_ok(void *g);
/* Whether sums of up to 2^20 floats take quire's peer-access kernel (else
 * NCCL takes them all). */
int cuda_tp_peer_sums(const cuda_tp *g);
void cuda_tp_destroy(cuda_tp *g);
#endif

/* n blocks to / from host memory (block i at host + i * block_bytes), with
 * the backend's batched form when it has one.  0 or a QERR_* code. */
static inline int qbackend_read_blocks(qbackend *be, const int32_t *blocks, int n, void *host)
{
    if (be->ops->read_blocks) return be->ops->read_blocks(be, blocks, n, host);
    const size_t bb = be->ops->block_bytes(be);
    for (int i = 0; i < n; i++) {
        int rc = be->ops->read_block(be, blocks[i], (char *)host + (size_t)i * bb);
        if (rc) return rc;
    }
    return 0;
}
static inline int qbackend_write_blocks(qbackend *be, const int32_t *blocks, int n, const void *host)
{
    if (be->ops->write_blocks) return be->ops->write_blocks(be, blocks, n, host);
    const size_t bb = be->ops->block_bytes(be);
    for (int i = 0; i < n; i++) {
        int rc = be->ops->write_block(be, blocks[i], (const char *)host + (size_t)i * bb);
        if (rc) return rc;
    }
    return 0;
}
/* Host memory for swapped blocks (pinned where the backend can); NULL when
 * out of memory.  Free with qbackend_host_free. */
static inline void *qbackend_host_alloc(qbackend *be, size_t bytes)
{
    return be->ops->host_alloc ? be->ops->host_alloc(be, bytes) : malloc(bytes);
}
static inline void qbackend_host_free(qbackend *be, void *p)
{
    if (be->ops->host_free) be->ops->host_free(be, p);
    else free(p);
}

static inline void qbackend_destroy(qbackend *be)
{
    if (be) be->ops->destroy(be);
}

#endif
