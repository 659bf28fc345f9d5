// cuda_backend.cu - the CUDA backend: weights and the paged KV cache on one
// GPU, cuBLAS for the projections, the kernels of cuda_ops.cu and
// cuda_attn.cu for the rest.
//
// Storage type T: bf16 by default (f16 when the checkpoint's matrices are
// all f16), float with opts.exact (tests).  Projections read T and
// accumulate and write float (cublasGemmEx, CUBLAS_COMPUTE_32F; pedantic
// float32 in the exact mode).  The residual stream is float; the output
// and FFN-down projections add into it directly (beta = 1); on a shard of
// the model (tensor parallelism) they give partial sums, which are
// all-reduced in float32 (residual_proj).  Q, K, V are
// one fused projection, gate and up another.  Each RMSNorm's weights are
// folded into the projection after it at upload, so a norm is a scale per
// token: a kernel of its own for big passes, applied by the projection
// kernels themselves for passes of up to 8 tokens whose projections over
// the model's width take one of them (the weight-streaming kernel,
// use_gemv; the tensor-core kernel, use_mma, from 3 tokens where the width
// is a multiple of 128), which then also keep the residual stream in T, in xn.
//
// KV layout, as on the CPU: per layer, K and V each hold num_blocks blocks
// of (n_kv_heads, block_size, head_dim) elements of T.
//
// One forward pass: the host checks the batch, packs every index the
// kernels need (token ids, positions, sequence of each token, block tables,
// logit rows, the decode list and the prefill tiles) into one pinned buffer
// and copies it with one transfer; the kernels then run on one stream and
// the logits come back with one more.
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.cuh"

typedef struct {
    void *wqkv, *wo, *wgu, *wdown; // T: (Q + 2 KVd, D), (D, Q), (2F, D), (D, F)
    float *bqkv;                   // (Q + 2 KVd) or NULL
    float *attn_norm, *ffn_norm;   // (D), already folded into wqkv / wgu (qk_scale_cols)
    float *q_norm, *k_norm;        // QK-norm: (hd) each, or NULL
    float *post_attn, *post_ffn;   // sandwich norms: (D) each, or NULL
} dlayer;

typedef struct {
    int T, n_split, split_len, fuse_rope;
    unsigned gen;
    uint64_t used;                 // when it last ran (be->graph_clock)
    cudaGraphExec_t exec;
} dgraph;

typedef struct {
    qbackend base;
    int dev;                       // opts.device: made current at every entry
    int wt;                        // QDT_F32 / QDT_BF16 / QDT_F16: storage of weights, activations, KV
    size_t esz;
    cublasHandle_t blas;
    cudaStream_t stream;
    int n_sm;
    dlayer *L;
    void *tok_embd, *output;       // T: (V, D)
    float *out_norm, *inv_freq;
    float *inv_freq_local;         // local layers' RoPE (rope_theta_local), or NULL: inv_freq
    void *kc, *vc;                 // T: (n_layers, nb_alloc, block_elems)
    int nb_alloc;                  // num_blocks + 1: the last is scratch for padding tokens
    size_t block_elems;
    // scratch for cap_t tokens
    int cap_t;
    float *x, *qkv, *gu;
    float *tmp;                    // (cap_t, D): a block's output before its sandwich norm
    void *xn, *qb, *att, *h;
    int cap_logits;
    float *logits;
    uint8_t *d_rows;               // (cap_logits) QROW_* of each row
    int32_t *d_rowtok;             // (cap_logits) the tokens of reduced rows
    qrow_sample *d_rsample;        // (cap_logits) draws of QROW_SAMPLE rows
    qrow_logprobs *d_lp;           // (cap_logits) log-probabilities of reduced rows
    int cap_mask;                  // rows the mask buffers hold
    uint32_t *h_mask, *d_mask;     // (cap_mask, W) guided rows' token masks (host pinned, device)
    uint8_t *h_has, *d_has;        // (cap_mask) which rows have one
    cudaStream_t mstream;          // the masks' copy, beside the layers (made with the buffers)
    cudaEvent_t mdone;             // ... done: the mask kernel waits for it
    size_t cap_part;
    float *part_acc, *part_ml;
    int *part_cnt;                 // (cap_part) split counters, 0 between passes
    size_t meta_cap;               // int32 elements
    int32_t *h_meta, *d_meta;
    uint64_t seed_ctr;
    int gemv;                      // own kernel for projections of a few tokens (use_gemv; QUIRE_CUDA_GEMV=0: not used)
    // The most tokens it takes where the tensor-core kernel could take them
    // (QUIRE_CUDA_GEMV_TOKENS, default 0); elsewhere up to QK_GEMV_MAX.
    int gemv_tokens;
    // Projections of up to QK_MMA_MAX tokens the weight-streaming kernel
    // does not take go to the tensor-core kernel (QUIRE_CUDA_MMA=0: cuBLAS).
    int mma;
    // Decode steps fold RoPE and the cache store into attention and SwiGLU
    // into the gate/up projection (QUIRE_CUDA_FUSE=0: separate kernels).
    int fuse;
    // Passes of at most this many tokens apply the layer norms inside the
    // projection kernel, which reads the residual stream itself
    // (QUIRE_CUDA_NORM_FOLD=n; 0: a norm kernel before each).
    int norm_fold;
    // The shortest split of a decode context (QUIRE_CUDA_SPLIT_MIN, a power
    // of two from 32; default 32), the decode-attention blocks per SM the
    // splits aim at (QUIRE_CUDA_SPLIT_FILL) and the most splits
    // (QUIRE_CUDA_SPLIT_MAX, at most 64).
    int split_min, split_fill, split_max;
    // Weight rows a warp of the projection kernel takes for one token
    // (QUIRE_CUDA_GEMV_ROWS1: 1, 2, or 0 by the shape, the default; 2 for
    // more tokens).
    int rows1;
    // QUIRE_CUDA_SKIP=mask leaves steps out, for timing what each costs in
    // place (the output is then meaningless): 1 norms, 2 Q/K/V, 4 RoPE and
    // attention, 8 output projection, 16 gate/up (and SwiGLU), 32 down,
    // 64 the final norm and the logits, 128 a shard's all-reduces.
    int skip;
    // Decode steps run as CUDA graphs (QUIRE_CUDA_GRAPHS=0: launched one by
    // one), one per (tokens, splits, split length); scratch reallocation
    // bumps gen and so invalidates them.
    int graphs;
    unsigned gen;
    dgraph g[32];
    int n_graphs;
    uint64_t graph_clock;          // graph launches so far
    void *blas_ws;
    // QUIRE_CUDA_PROFILE=1: events around each step of layer 1 and the whole
    // pass, summed per batch size and printed when the batch size changes.
    int prof, prof_T, prof_n;
    cudaEvent_t ev[16];
    double prof_ms[16];
} cuda_be;

enum { PF_START, PF_NORM1, PF_QKV, PF_ROPE, PF_PREFILL, PF_DECODE, PF_WO, PF_NORM2, PF_GU, PF_SWIGLU, PF_DOWN, PF_L1START,
       PF_END, PF_N };
static const char *const pf_names[PF_N] = { "start", "norm", "qkv gemm", "rope+store", "attn prefill", "attn decode",
                                            "o gemm", "norm", "gate/up gemm", "swiglu", "down gemm", "-", "whole pass" };

static void prof_mark(cuda_be *be, int i, int layer)
{
    if (be->prof && (layer == 1 || i == PF_START || i == PF_END)) cudaEventRecord(be->ev[i], be->stream);
}

static void prof_dump(cuda_be *be)
{
    if (!be->prof || !be->prof_n) return;
    const int L = be->base.w->hp.n_layers;
    fprintf(stderr, "cuda profile: %d passes of %d tokens, ms per pass:", be->prof_n, be->prof_T);
    for (int i = PF_NORM1; i <= PF_DOWN; i++) fprintf(stderr, " %s %.3f;", pf_names[i], be->prof_ms[i] / be->prof_n * L);
    fprintf(stderr, " whole %.3f (layer steps x %d layers)\n", be->prof_ms[PF_END] / be->prof_n, L);
    memset(be->prof_ms, 0, sizeof be->prof_ms);
    be->prof_n = 0;
}

static void prof_collect(cuda_be *be, int T)
{
    if (!be->prof) return;
    if (T != be->prof_T) {
        prof_dump(be);
        be->prof_T = T;
    }
    float ms;
    for (int i = PF_NORM1; i <= PF_DOWN; i++)
        if (cudaEventElapsedTime(&ms, be->ev[i == PF_NORM1 ? PF_L1START : i - 1], be->ev[i]) == cudaSuccess)
            be->prof_ms[i] += ms;
    if (cudaEventElapsedTime(&ms, be->ev[PF_START], be->ev[PF_END]) == cudaSuccess) be->prof_ms[PF_END] += ms;
    be->prof_n++;
}

template <typename T> static int qdt_of();
template <> int qdt_of<float>() { return QDT_F32; }
template <> int qdt_of<bf16>() { return QDT_BF16; }
template <> int qdt_of<__half>() { return QDT_F16; }

static int qdt_cuda(int wt) { return wt == QDT_F32 ? CUDA_R_32F : wt == QDT_BF16 ? CUDA_R_16BF : CUDA_R_16F; }

// ---- weights --------------------------------------------------------------------------

// Uploads host tensor src (any dtype) into device memory dst of type T, at
// element offset off; or fills it with uniform random values in [lo, hi)
// when src has no data and the model is a random one.
template <typename T>
static int upload(cuda_be *be, T *dst, const qtensor *src, float lo, float hi)
{
    const size_t n = (size_t)qt_numel(src);
    if (!src->data) {
        if (!be->base.opts.random_weights) return QERR_INVAL;
        return qk_fill_uniform<T>(be->stream, dst, n, be->base.opts.seed + 0x632be59bd9b4e019ULL * ++be->seed_ctr, lo,
                                  hi);
    }
    const size_t ssz = qdt_size(src->dtype);
    if ((int)src->dtype == qdt_of<T>()) { // stored as is
        CK(cudaMemcpyAsync(dst, src->data, n * ssz, cudaMemcpyHostToDevice, be->stream));
        return 0;
    }
    // Convert on the device through a staging buffer, in chunks.
    const size_t chunk = (size_t)16 << 20;
    void *stage = NULL;
    CK(cudaMalloc(&stage, (n < chunk ? n : chunk) * ssz));
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i += chunk) {
        size_t c = n - i < chunk ? n - i : chunk;
        if (cudaMemcpyAsync(stage, (const char *)src->data + i * ssz, c * ssz, cudaMemcpyHostToDevice, be->stream) !=
            cudaSuccess) {
            rc = QERR_DEVICE;
            break;
        }
        if (src->dtype == QDT_F32) rc = qk_convert<T, float>(be->stream, dst + i, (const float *)stage, c);
        else if (src->dtype == QDT_BF16) rc = qk_convert<T, bf16>(be->stream, dst + i, (const bf16 *)stage, c);
        else rc = qk_convert<T, __half>(be->stream, dst + i, (const __half *)stage, c);
        // The staging buffer is reused: wait for the conversion.
        if (!rc && cudaStreamSynchronize(be->stream) != cudaSuccess) rc = QERR_DEVICE;
    }
    cudaFree(stage);
    return rc;
}

static int dmalloc(void **p, size_t bytes)
{
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        QLOGE("cuda: allocating %zu bytes: %s", bytes, cudaGetErrorString(e));
        *p = NULL;
        return QERR_DEVICE;
    }
    return 0;
}

// A layer's QK-norm and sandwich norms, as float on the device ((1 + w)
// where the model's norms scale so).
static int upload_norms(cuda_be *be, const qlayer *s, dlayer *d)
{
    const qhparams *hp = &be->base.w->hp;
    const size_t D = hp->dim, hd = hp->head_dim;
    const float n0 = hp->norm_add_one ? -0.1f : 0.9f, n1 = hp->norm_add_one ? 0.1f : 1.1f;
    struct { float **dst; const qtensor *src; size_t n; bool want; } ns[] = {
        { &d->q_norm, &s->q_norm, hd, hp->qk_norm != 0 },
        { &d->k_norm, &s->k_norm, hd, hp->qk_norm != 0 },
        { &d->post_attn, &s->post_attn_norm, D, hp->norm_place == QNORM_SANDWICH },
        { &d->post_ffn, &s->post_ffn_norm, D, hp->norm_place == QNORM_SANDWICH },
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof ns / sizeof ns[0] && !rc; i++) {
        if (!ns[i].want) continue;
        if (!(rc = dmalloc((void **)ns[i].dst, ns[i].n * 4)) && !(rc = upload<float>(be, *ns[i].dst, ns[i].src, n0, n1)) &&
            hp->norm_add_one)
            rc = qk_map(be->stream, *ns[i].dst, ns[i].n, QK_MAP_ADD, 1.0f);
    }
    return rc;
}

template <typename T> static int upload_weights(cuda_be *be)
{
    const qweights *w = be->base.w;
    const qhparams *hp = &w->hp;
    const size_t D = hp->dim, Q = (size_t)hp->n_heads * hp->head_dim, KVd = (size_t)hp->n_kv_heads * hp->head_dim,
                 F = hp->ffn_dim, V = hp->n_vocab;
    const float a = 0.0346f; // uniform(-a, a): standard deviation 0.02, like HF's initializer_range
    // The layers' output projections may be drawn smaller (random_residual):
    // a model whose layers add little, from which a draft cut to its first
    // layers agrees more often (speculative decoding's benchmarks).
    const float ar = be->base.opts.random_residual > 0 ? a * be->base.opts.random_residual : a;
    int rc = 0;
    for (int l = 0; l < hp->n_layers && !rc; l++) {
        const qlayer *s = &w->layers[l];
        dlayer *d = &be->L[l];
        // Random streams by place, not by order: layer l's are the same in
        // a model cut to fewer layers.
        be->seed_ctr = 16 * (uint64_t)(l + 1);
        if ((rc = dmalloc(&d->wqkv, (Q + 2 * KVd) * D * sizeof(T))) || (rc = dmalloc(&d->wo, D * Q * sizeof(T))) ||
            (rc = dmalloc(&d->wgu, 2 * F * D * sizeof(T))) || (rc = dmalloc(&d->wdown, D * F * sizeof(T))) ||
            (rc = dmalloc((void **)&d->attn_norm, D * 4)) || (rc = dmalloc((void **)&d->ffn_norm, D * 4)))
            break;
        const float n0 = hp->norm_add_one ? -0.1f : 0.9f, n1 = hp->norm_add_one ? 0.1f : 1.1f; // random norms' range
        T *qkv = (T *)d->wqkv, *gu = (T *)d->wgu;
        if ((rc = upload<T>(be, qkv, &s->wq, -a, a)) || (rc = upload<T>(be, qkv + Q * D, &s->wk, -a, a)) ||
            (rc = upload<T>(be, qkv + (Q + KVd) * D, &s->wv, -a, a)) || (rc = upload<T>(be, (T *)d->wo, &s->wo, -ar, ar)) ||
            (rc = upload<T>(be, gu, &s->w_gate, -a, a)) || (rc = upload<T>(be, gu + F * D, &s->w_up, -a, a)) ||
            (rc = upload<T>(be, (T *)d->wdown, &s->w_down, -ar, ar)) ||
            (rc = upload<float>(be, d->attn_norm, &s->attn_norm, n0, n1)) ||
            (rc = upload<float>(be, d->ffn_norm, &s->ffn_norm, n0, n1)) ||
            (hp->norm_add_one && ((rc = qk_map(be->stream, d->attn_norm, D, QK_MAP_ADD, 1.0f)) ||
                                  (rc = qk_map(be->stream, d->ffn_norm, D, QK_MAP_ADD, 1.0f)))))
            break;
        // The norms' weights go into the projections after them (rounded to
        // T once): the norm is then a scale, which the projection kernel
        // can apply itself (forward_t).
        if ((rc = qk_scale_cols<T>(be->stream, qkv, d->attn_norm, (int)(Q + 2 * KVd), (int)D)) ||
            (rc = qk_scale_cols<T>(be->stream, gu, d->ffn_norm, (int)(2 * F), (int)D)))
            break;
        if ((rc = upload_norms(be, s, d))) break;
        if (hp->attn_bias) {
            if ((rc = dmalloc((void **)&d->bqkv, (Q + 2 * KVd) * 4)) || (rc = upload<float>(be, d->bqkv, &s->bq, -a, a)) ||
                (rc = upload<float>(be, d->bqkv + Q, &s->bk, -a, a)) ||
                (rc = upload<float>(be, d->bqkv + Q + KVd, &s->bv, -a, a)))
                break;
        }
    }
    be->seed_ctr = 0;
    if (!rc) rc = dmalloc(&be->tok_embd, V * D * sizeof(T));
    if (!rc) rc = upload<T>(be, (T *)be->tok_embd, &w->tok_embd, -a, a);
    if (!rc) rc = dmalloc((void **)&be->out_norm, D * 4);
    if (!rc) rc = upload<float>(be, be->out_norm, &w->out_norm, hp->norm_add_one ? -0.1f : 0.9f,
                                hp->norm_add_one ? 0.1f : 1.1f);
    if (!rc && hp->norm_add_one) rc = qk_map(be->stream, be->out_norm, D, QK_MAP_ADD, 1.0f);
    if (!rc) {
        if (hp->tied_embeddings || (w->output.data && w->output.data == w->tok_embd.data)) {
            be->output = be->tok_embd;
        } else {
            rc = dmalloc(&be->output, V * D * sizeof(T));
            if (!rc) rc = upload<T>(be, (T *)be->output, &w->output, -a, a);
        }
    }
    if (!rc && cudaStreamSynchronize(be->stream) != cudaSuccess) rc = QERR_DEVICE;
    return rc;
}

// ---- scratch ------------------------------------------------------------------------------

static int ensure_tokens(cuda_be *be, int T)
{
    if (T <= be->cap_t) return 0;
    const qhparams *hp = &be->base.w->hp;
    const size_t cap = T < 64 ? 64 : (size_t)T, D = hp->dim, Q = (size_t)hp->n_heads * hp->head_dim,
                 KVd = (size_t)hp->n_kv_heads * hp->head_dim, F = hp->ffn_dim, e = be->esz;
    void **bufs[] = { (void **)&be->x, (void **)&be->qkv, (void **)&be->gu, &be->xn, &be->qb, &be->att, &be->h,
                      (void **)&be->tmp };
    const size_t sizes[] = { cap * D * 4, cap * (Q + 2 * KVd) * 4, cap * 2 * F * 4, cap * D * e, cap * Q * e,
                             cap * Q * e, cap * F * e, hp->norm_place == QNORM_SANDWICH ? cap * D * 4 : 4 };
    be->gen++;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        cudaFree(*bufs[i]);
        if (dmalloc(bufs[i], sizes[i])) return QERR_DEVICE;
    }
    be->cap_t = (int)cap;
    return 0;
}

static int ensure_logits(cuda_be *be, int n)
{
    if (n <= be->cap_logits) return 0;
    be->gen++;
    cudaFree(be->logits);
    cudaFree(be->d_rows);
    cudaFree(be->d_rowtok);
    cudaFree(be->d_rsample);
    cudaFree(be->d_lp);
    be->d_rows = NULL;
    be->d_rowtok = NULL;
    be->d_rsample = NULL;
    be->d_lp = NULL;
    if (dmalloc((void **)&be->logits, (size_t)n * be->base.w->hp.n_vocab * 4) || dmalloc((void **)&be->d_rows, n) ||
        dmalloc((void **)&be->d_rowtok, (size_t)n * 4) || dmalloc((void **)&be->d_rsample, (size_t)n * sizeof(qrow_sample)) ||
        dmalloc((void **)&be->d_lp, (size_t)n * sizeof(qrow_logprobs)))
        return QERR_DEVICE;
    be->cap_logits = n;
    return 0;
}

// Mask buffers for n rows (not part of any graph: no regeneration).
static int ensure_masks(cuda_be *be, int n)
{
    if (n <= be->cap_mask) return 0;
    const size_t W = ((size_t)be->base.w->hp.n_vocab + 31) / 32;
    cudaFreeHost(be->h_mask);
    cudaFreeHost(be->h_has);
    cudaFree(be->d_mask);
    cudaFree(be->d_has);
    be->h_mask = NULL, be->h_has = NULL, be->d_mask = NULL, be->d_has = NULL;
    be->cap_mask = 0;
    if (!be->mstream && cudaStreamCreateWithFlags(&be->mstream, cudaStreamNonBlocking) != cudaSuccess) {
        be->mstream = NULL;
        return QERR_DEVICE;
    }
    if (!be->mdone && cudaEventCreateWithFlags(&be->mdone, cudaEventDisableTiming) != cudaSuccess) {
        be->mdone = NULL;
        return QERR_DEVICE;
    }
    if (cudaMallocHost((void **)&be->h_mask, (size_t)n * W * 4) != cudaSuccess ||
        cudaMallocHost((void **)&be->h_has, (size_t)n) != cudaSuccess || dmalloc((void **)&be->d_mask, (size_t)n * W * 4) ||
        dmalloc((void **)&be->d_has, (size_t)n))
        return QERR_DEVICE;
    be->cap_mask = n;
    return 0;
}

static uint32_t *cuda_mask_rows(qbackend *base, int n_rows)
{
    cuda_be *be = (cuda_be *)base;
    if (cudaSetDevice(be->dev) != cudaSuccess) return NULL;
    return ensure_masks(be, n_rows) ? NULL : be->h_mask;
}

// Guided rows: waits for the caller's masks (the layers run meanwhile), then
// sets the logits of the tokens they refuse to -inf on the device.
static int apply_masks(cuda_be *be, const qbatch *b)
{
    int rc = b->masks->ready ? b->masks->ready(b->masks->ctx) : 0;
    int any = 0;
    for (int r = 0; b->masks->row && r < b->n_logits; r++) any |= b->masks->row[r] != NULL;
    if (rc || !any) return rc;
    if ((rc = ensure_masks(be, b->n_logits))) return rc;
    const int V = be->base.w->hp.n_vocab;
    const size_t W = ((size_t)V + 31) / 32;
    for (int r = 0; r < b->n_logits; r++) {
        const uint32_t *m = b->masks->row[r];
        be->h_has[r] = m != NULL;
        if (m && m != be->h_mask + (size_t)r * W) memcpy(be->h_mask + (size_t)r * W, m, W * 4);
    }
    // The copy runs beside the layers, which are still running as a rule.
    if (cudaMemcpyAsync(be->d_mask, be->h_mask, (size_t)b->n_logits * W * 4, cudaMemcpyHostToDevice, be->mstream) !=
            cudaSuccess ||
        cudaMemcpyAsync(be->d_has, be->h_has, (size_t)b->n_logits, cudaMemcpyHostToDevice, be->mstream) != cudaSuccess ||
        cudaEventRecord(be->mdone, be->mstream) != cudaSuccess ||
        cudaStreamWaitEvent(be->stream, be->mdone, 0) != cudaSuccess) {
        cudaStreamSynchronize(be->mstream); // nothing may still read h_mask when the next step writes it
        return QERR_DEVICE;
    }
    return qk_mask_rows(be->stream, be->logits, b->n_logits, V, be->d_mask, be->d_has);
}

static int ensure_part(cuda_be *be, size_t slots)
{
    if (slots <= be->cap_part) return 0;
    be->gen++;
    cudaFree(be->part_acc);
    cudaFree(be->part_ml);
    cudaFree(be->part_cnt);
    be->part_ml = NULL;
    be->part_cnt = NULL;
    if (dmalloc((void **)&be->part_acc, slots * be->base.w->hp.head_dim * 4) ||
        dmalloc((void **)&be->part_ml, slots * 2 * 4) || dmalloc((void **)&be->part_cnt, slots * 4))
        return QERR_DEVICE;
    CK(cudaMemset(be->part_cnt, 0, slots * 4));
    be->cap_part = slots;
    return 0;
}

static int ensure_meta(cuda_be *be, size_t n)
{
    if (n <= be->meta_cap) return 0;
    size_t cap = n * 2 > 4096 ? n * 2 : 4096;
    be->gen++;
    cudaFreeHost(be->h_meta);
    cudaFree(be->d_meta);
    be->h_meta = NULL;
    be->d_meta = NULL;
    be->meta_cap = 0;
    CK(cudaMallocHost((void **)&be->h_meta, cap * 4));
    CK(cudaMalloc((void **)&be->d_meta, cap * 4));
    be->meta_cap = cap;
    return 0;
}

// Projections of T tokens over K: the weight-streaming kernel up to
// gemv_tokens (use_gemv), then the tensor-core kernel up to QK_MMA_MAX
// where K is a multiple of 128 (use_mma), else cuBLAS; where the
// tensor-core kernel cannot take K (small models: stories260K's 64), the
// weight-streaming kernel keeps up to QK_GEMV_MAX.  The first does T
// multiply-adds a weight on the CUDA cores, which bound it from about 3
// tokens; the tensor cores stream the weights at one rate for 1-8 tokens.
// Whole 8B decode steps on the H200 (bench_gpu --batches 1,2,3,4,5,6,8;
// bench/RESULTS.md, session 5): at 3, 4 and 8 tokens 4.64, 4.64 and 4.68
// ms with the tensor cores, 4.66, 4.71 and 4.91 with cuBLAS, 4.93 and 5.51
// (3 and 4) with the CUDA cores.  At one token the tensor-core kernel,
// which loads its first weights before it waits for the kernel before it,
// leads too (H100, 2026-12-07: Llama-3.2-1B / 3.1-8B / Phi-4-mini /
// Gemma-3-12B 1.131 / 5.433 / 3.127 / 9.116 ms a step against 1.176 /
// 5.667 / 3.330 / 9.475 with the CUDA cores), so gemv_tokens is 0.
static bool use_gemv(const cuda_be *be, int T, int K)
{
    return be->gemv && qk_gemv_ok((int)be->esz, T, K) &&
           (T <= be->gemv_tokens || !qk_gemv_mma_ok((int)be->esz, T, K));
}

static bool use_mma(const cuda_be *be, int T, int K)
{
    return be->mma && !use_gemv(be, T, K) && qk_gemv_mma_ok((int)be->esz, T, K);
}

// Rows a warp of the weight-streaming kernel takes for T tokens.
static int gemv_rows(const cuda_be *be, int T) { return T == 1 ? be->rows1 : 2; }

// y(T, N) = x(T, K) W(N, K)^T + beta y, row-major, through column-major GEMM.
// yc: y in T as well (16-bit storage only).
static int gemm(cuda_be *be, float *y, const void *x, const void *W, int T, int N, int K, float beta, void *yc = NULL)
{
    if (use_gemv(be, T, K)) { // a few tokens: the weight-streaming kernel
        const int rows = gemv_rows(be, T);
        if (be->wt == QDT_BF16)
            return qk_gemv<bf16>(be->stream, y, (const bf16 *)x, (const bf16 *)W, T, N, K, beta, rows, (bf16 *)yc);
        return qk_gemv<__half>(be->stream, y, (const __half *)x, (const __half *)W, T, N, K, beta, rows,
                               (__half *)yc);
    }
    if (use_mma(be, T, K)) { // a few more: the tensor cores
        if (be->wt == QDT_BF16)
            return qk_gemv_mma<bf16>(be->stream, y, (const bf16 *)x, (const bf16 *)W, T, N, K, beta, (bf16 *)yc);
        return qk_gemv_mma<__half>(be->stream, y, (const __half *)x, (const __half *)W, T, N, K, beta, (__half *)yc);
    }
    const float one = 1.0f;
    const cudaDataType dt = (cudaDataType)qdt_cuda(be->wt);
    const cublasComputeType_t ct = be->wt == QDT_F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    cublasStatus_t s = cublasGemmEx(be->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, W, dt, K, x, dt, K, &beta, y,
                                    CUDA_R_32F, N, ct, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        QLOGE("cuda: cublasGemmEx (%d x %d x %d) failed: %s", T, N, K, cublasGetStatusString(s));
        return QERR_DEVICE;
    }
    if (!yc) return 0;
    if (be->wt == QDT_BF16) return qk_convert<bf16, float>(be->stream, (bf16 *)yc, y, (size_t)T * N);
    if (be->wt == QDT_F16) return qk_convert<__half, float>(be->stream, (__half *)yc, y, (size_t)T * N);
    return QERR_UNSUPPORTED;
}

// ---- the forward pass ---------------------------------------------------------------

// Where each array lives in the packed metadata (int32 offsets).
typedef struct {
    size_t tiles, tok, pos, seq, lidx, dec, info, tables, total;
    int n_dec, n_tiles, n_split, split_len;
    int fuse_rope;                 // one token a sequence: attention does rope_store's work
    int T, n_logits;               // with padding: decode graphs run bucketed batch sizes
} meta_plan;

// Checks the batch (nothing invalid reaches a kernel) and packs the
// metadata.  graph (steps where every token has a logit row and no
// sequence has more than QBE_GRAPH_SEQ_TOKENS: decodes, and decodes verifying
// drafts) lays it out as a captured graph expects: every token's attention
// by the decode kernel (no prefill tiles; a sequence's tokens each see the
// positions up to their own), and the offsets a function of the token
// count alone (room for a sequence a token).  pad > 0 (graph steps only)
// appends that many padding tokens, each its own sequence at position 0 in
// the scratch block, with a logit row nobody reads: the pass then has a
// bucketed size whose graph is already captured.
static int plan_batch(cuda_be *be, const qbatch *b, bool graph, int pad, meta_plan *mp)
{
    const qhparams *hp = &be->base.w->hp;
    const int T = b->n_tokens, bs = be->base.opts.block_size, nb = be->base.opts.num_blocks;
    if (T <= 0 || b->n_seqs <= 0 || b->n_logits < 0 || b->n_logits > T) return QERR_INVAL;
    size_t n_table = 0;
    int covered = 0, n_dec = 0, n_tiles = 0;
    const bool tiles_ok = !graph && qk_attn_prefill_ok((int)be->esz, hp->head_dim);
    for (int s = 0; s < b->n_seqs; s++) {
        const qbatch_seq *q = &b->seqs[s];
        if (q->first != covered || q->n_tokens <= 0 || q->pos0 < 0) return QERR_INVAL;
        covered += q->n_tokens;
        if (covered > T) return QERR_RANGE;
        long need = ((long)q->pos0 + q->n_tokens + bs - 1) / bs;
        if (need > q->n_blocks) return QERR_RANGE;
        for (long i = qbatch_first_block(hp, q, bs); i < need; i++)
            if (q->block_table[i] < 0 || q->block_table[i] >= nb) return QERR_RANGE;
        n_table += (size_t)need;
        if (q->n_tokens > 1 && tiles_ok) n_tiles += (q->n_tokens + 63) / 64;
        else n_dec += q->n_tokens;
    }
    if (covered != T) return QERR_INVAL;
    mp->fuse_rope = be->fuse && b->n_seqs == T;
    for (int i = 0; i < T; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= hp->n_vocab) return QERR_RANGE;
    for (int r = 0; r < b->n_logits; r++)
        if (b->logits_idx[r] < 0 || b->logits_idx[r] >= T || (r && b->logits_idx[r] <= b->logits_idx[r - 1]))
            return QERR_INVAL;
    const int TP = T + pad, NL = b->n_logits + pad, NS = b->n_seqs + pad;
    mp->T = TP;
    mp->n_logits = NL;
    mp->tiles = 0;
    mp->tok = mp->tiles + 4 * (size_t)n_tiles;
    mp->pos = mp->tok + TP;
    mp->seq = mp->pos + TP;
    mp->lidx = mp->seq + TP;
    mp->dec = mp->lidx + NL;
    mp->info = mp->dec + n_dec + pad;
    mp->tables = mp->info + 2 * (size_t)(graph ? TP : NS);
    mp->total = mp->tables + n_table + 1;
    mp->n_dec = n_dec + pad;
    mp->n_tiles = n_tiles;
    if (ensure_meta(be, mp->total)) return QERR_DEVICE;
    int32_t *h = be->h_meta;
    memcpy(h + mp->tok, b->tokens, 4 * (size_t)T);
    if (b->n_logits) memcpy(h + mp->lidx, b->logits_idx, 4 * (size_t)b->n_logits);
    for (int j = 0; j < pad; j++) {
        h[mp->tok + T + j] = 0;
        h[mp->pos + T + j] = 0;
        h[mp->seq + T + j] = b->n_seqs + j;
        h[mp->lidx + b->n_logits + j] = T + j;
        h[mp->dec + n_dec + j] = T + j;
        h[mp->info + 2 * (b->n_seqs + j)] = (int32_t)n_table; // the one-entry table after the real ones
        h[mp->info + 2 * (b->n_seqs + j) + 1] = 1;
    }
    h[mp->tables + n_table] = be->base.opts.num_blocks; // the scratch block
    size_t off = 0;
    int di = 0, ti = 0, max_ctx = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const qbatch_seq *q = &b->seqs[s];
        const long need = ((long)q->pos0 + q->n_tokens + bs - 1) / bs;
        h[mp->info + 2 * s] = (int32_t)off;
        h[mp->info + 2 * s + 1] = (int32_t)need;
        memcpy(h + mp->tables + off, q->block_table, 4 * (size_t)need);
        off += (size_t)need;
        for (int i = 0; i < q->n_tokens; i++) {
            h[mp->pos + q->first + i] = q->pos0 + i;
            h[mp->seq + q->first + i] = s;
        }
        if (q->n_tokens > 1 && tiles_ok) {
            for (int i = 0; i < q->n_tokens; i += 64) {
                int32_t *t4 = h + mp->tiles + 4 * (size_t)ti++;
                t4[0] = q->first + i;
                t4[1] = q->n_tokens - i < 64 ? q->n_tokens - i : 64;
                t4[2] = s;
                t4[3] = 0;
            }
        } else {
            for (int i = 0; i < q->n_tokens; i++) h[mp->dec + di++] = q->first + i;
            if (q->pos0 + q->n_tokens > max_ctx) max_ctx = q->pos0 + q->n_tokens;
        }
    }
    // Splits: the shortest power-of-two length from 32 positions (one step
    // of the kernel's four warps) that gives at most 8 blocks an SM (a
    // block is latency-bound: at 4,000 positions and 16 sequences, 8 an SM
    // decode the 1B shape at 5,840 tok/s, 2 at 4,090), and at most 64
    // splits.  The grid's count is rounded up to a power of two (each
    // token uses what its context needs), so that few distinct plans, and
    // graphs, occur.
    mp->n_split = 1;
    mp->split_len = 32;
    if (n_dec > 0) {
        const long blocks = (long)n_dec * hp->n_kv_heads;
        long len = be->split_min;
        while (len < max_ctx && ((max_ctx + len - 1) / len) * blocks > (long)be->split_fill * be->n_sm) len *= 2;
        while ((max_ctx + len - 1) / len > be->split_max) len *= 2;
        const int need = (int)((max_ctx + len - 1) / len);
        mp->split_len = (int)len;
        while (mp->n_split < need) mp->n_split *= 2;
    }
    return 0;
}

// A projection over D with the norm before it folded in (x the residual
// stream in T): y = the N outputs, or, y NULL, h = the gated unit (SwiGLU or
// GeGLU, the model's) of W's N gate and N up rows - by the weight-streaming
// kernel or the tensor-core one.
template <typename T> static int proj_norm(cuda_be *be, float *y, T *h, const T *x, const T *W, int T_, int N)
{
    const qhparams *hp = &be->base.w->hp;
    const int D = hp->dim, gelu = hp->act != QACT_SILU;
    const float eps = hp->norm_eps;
    if (use_gemv(be, T_, D))
        return y ? qk_gemv_norm<T>(be->stream, y, x, W, T_, N, D, eps, gemv_rows(be, T_))
                 : qk_gemv_swiglu_norm<T>(be->stream, h, x, W, T_, N, D, eps, gelu);
    return y ? qk_gemv_mma_norm<T>(be->stream, y, x, W, T_, N, D, eps)
             : qk_gemv_mma_swiglu_norm<T>(be->stream, h, x, W, T_, N, D, eps, gelu);
}

// h = the gated unit (SwiGLU or GeGLU) of the gate/up projection of xn: the
// projection kernels do both for a few tokens, with the norm folded in (or,
// the weight-streaming kernel, without it: QUIRE_CUDA_NORM_FOLD=0), else
// cuBLAS and qk_swiglu / qk_geglu.
template <typename T> static int gate_up(cuda_be *be, T *h, const T *xn, const dlayer *L, int T_, int l, bool fold)
{
    const qhparams *hp = &be->base.w->hp;
    const int D = hp->dim, F = hp->ffn_dim, gelu = hp->act != QACT_SILU;
    if (fold) {
        const int rc = proj_norm<T>(be, NULL, h, xn, (const T *)L->wgu, T_, F);
        prof_mark(be, PF_GU, l);
        return rc;
    }
    if (be->fuse && use_gemv(be, T_, D)) {
        const int rc = qk_gemv_swiglu<T>(be->stream, h, xn, (const T *)L->wgu, T_, F, D, gelu);
        prof_mark(be, PF_GU, l);
        return rc;
    }
    int rc = gemm(be, be->gu, xn, L->wgu, T_, 2 * F, D, 0.0f);
    prof_mark(be, PF_GU, l);
    if (rc) return rc;
    return gelu ? qk_geglu<T>(be->stream, h, be->gu, T_, F) : qk_swiglu<T>(be->stream, h, be->gu, T_, F);
}

// A shard's pass other than rank 0's gives no logits (rank 0 gives them).
static bool no_head(const cuda_be *be) { return be->base.opts.allreduce && be->base.opts.tp_rank > 0; }

// x += the output or down projection of a (T_ tokens over K), and xn = x
// in T where the norms are folded.  On a shard: rank 0 adds its partial
// sum into x, the others write theirs alone, and the all-reduce of x adds
// them all (the stream once): every rank then holds the same x.
template <typename T>
static int residual_proj(cuda_be *be, const void *a, const void *W, int T_, int K, T *xn, bool fold)
{
    const int D = be->base.w->hp.dim;
    const qbackend_opts *o = &be->base.opts;
    if (!o->allreduce) return gemm(be, be->x, a, W, T_, D, K, 1.0f, fold ? xn : NULL);
    int rc = gemm(be, be->x, a, W, T_, D, K, o->tp_rank == 0 ? 1.0f : 0.0f);
    if (!rc && !(be->skip & 128))
        rc = o->allreduce(o->allreduce_ctx, be->x, (size_t)T_ * D, be->stream, fold ? xn : NULL, qdt_of<T>());
    else if (!rc && fold) rc = qk_convert<T, float>(be->stream, xn, be->x, (size_t)T_ * D);
    return rc;
}

// A block's output projection (T_ tokens over K) normed and added to x, for
// sandwich norms (Gemma): tmp = a W^T (summed over the shards), x +=
// rmsnorm(tmp) * post, and xn = x in T where the norms are folded.
template <typename T>
static int sandwich_proj(cuda_be *be, const void *a, const void *W, int T_, int K, const float *post, T *xn, bool fold)
{
    const qhparams *hp = &be->base.w->hp;
    const qbackend_opts *o = &be->base.opts;
    int rc = gemm(be, be->tmp, a, W, T_, hp->dim, K, 0.0f);
    if (!rc && o->allreduce) rc = o->allreduce(o->allreduce_ctx, be->tmp, (size_t)T_ * hp->dim, be->stream, NULL, 0);
    return rc ? rc : qk_rmsnorm_add<T>(be->stream, be->x, be->tmp, post, T_, hp->dim, hp->norm_eps, fold ? xn : NULL);
}

// One layer's attention: its geometry (a local layer's window), RoPE
// (a local layer's base), QK-norm, the cache stores and both kernels.
template <typename T>
static int attention(cuda_be *be, const meta_plan *mp, const qattn_geom *g0, int l, const dlayer *L, T *kc, T *vc)
{
    const qhparams *hp = &be->base.w->hp;
    const int T_ = mp->T, sk = be->skip;
    const int32_t *dm = be->d_meta;
    cudaStream_t st = be->stream;
    T *qb = (T *)be->qb, *att = (T *)be->att;
    qattn_geom g = *g0;
    const int local = qhp_layer_local(hp, l);
    g.window = local ? hp->window : 0;
    const float *inv = local && be->inv_freq_local ? be->inv_freq_local : be->inv_freq;
    g.rope_mscale = local && be->inv_freq_local ? 0.0f : hp->rope_mscale;
    const int rope_dim = qhp_layer_rope(hp, l) ? hp->rope_dim : 0; // a NoPE layer rotates nothing
    const qk_rope_in rope = { be->qkv,   L->bqkv,   inv,         rope_dim, hp->rope_neox, g.rope_mscale,
                              L->q_norm, L->k_norm, hp->norm_eps };
    int rc = 0;
    if (!mp->fuse_rope && !(sk & 4) &&
        (rc = qk_rope_store<T>(st, be->qkv, L->bqkv, qb, kc, vc, inv, &g, T_, rope_dim, hp->rope_neox, L->q_norm,
                               L->k_norm, hp->norm_eps)))
        return rc;
    prof_mark(be, PF_ROPE, l);
    if (!(sk & 4) && (rc = qk_attn_prefill<T>(st, qb, kc, vc, &g, (const int4 *)(dm + mp->tiles), mp->n_tiles, att)))
        return rc;
    prof_mark(be, PF_PREFILL, l);
    if (!(sk & 4) && (rc = qk_attn_decode<T>(st, qb, kc, vc, &g, mp->fuse_rope ? &rope : NULL, dm + mp->dec, mp->n_dec,
                                             mp->n_split, mp->split_len, be->part_acc, be->part_ml, be->part_cnt, att)))
        return rc;
    prof_mark(be, PF_DECODE, l);
    return 0;
}

template <typename T> static int forward_t(cuda_be *be, const qbatch *b, const meta_plan *mp)
{
    const qhparams *hp = &be->base.w->hp;
    const int T_ = mp->T, D = hp->dim, H = hp->n_heads, KV = hp->n_kv_heads, hd = hp->head_dim, F = hp->ffn_dim;
    const int qd = H * hd, kvd = KV * hd;
    cudaStream_t st = be->stream;
    const int32_t *dm = be->d_meta;
    qattn_geom g =
        qk_geom(dm + mp->pos, dm + mp->seq, dm + mp->info, dm + mp->tables, H, KV, hd, be->base.opts.block_size);
    if (hp->attn_scale > 0) g.scale = hp->attn_scale;
    g.softcap = hp->attn_softcap;
    const size_t layer_elems = (size_t)be->nb_alloc * be->block_elems;
    T *xn = (T *)be->xn, *att = (T *)be->att, *h = (T *)be->h;
    const bool sandwich = hp->norm_place == QNORM_SANDWICH;
    // Norms folded into the projections: xn then holds the residual stream
    // in T, written with it by the embedding (scaled, Gemma's) and the
    // residual projections (or the sandwich norms' adds).  Passes whose
    // projections over D take the weight-streaming or the tensor-core kernel.
    const bool fold = T_ <= be->norm_fold && be->fuse && (use_gemv(be, T_, D) || use_mma(be, T_, D));
    prof_mark(be, PF_START, 0);
    int rc = qk_embed<T>(st, be->x, (const T *)be->tok_embd, dm + mp->tok, T_, D, fold ? xn : NULL,
                         hp->embed_scale ? (float)sqrt((double)D) : 0.0f);
    for (int l = 0; l < hp->n_layers && !rc; l++) {
        const dlayer *L = &be->L[l];
        T *kc = (T *)be->kc + (size_t)l * layer_elems, *vc = (T *)be->vc + (size_t)l * layer_elems;
        prof_mark(be, PF_L1START, l);
        const int sk = be->skip;
        if (!fold && !(sk & 1) && (rc = qk_rmsnorm<T>(st, xn, be->x, NULL, T_, D, hp->norm_eps, NULL))) break;
        prof_mark(be, PF_NORM1, l);
        if (!(sk & 2) &&
            (rc = fold ? proj_norm<T>(be, be->qkv, NULL, xn, (const T *)L->wqkv, T_, qd + 2 * kvd)
                       : gemm(be, be->qkv, xn, L->wqkv, T_, qd + 2 * kvd, D, 0.0f)))
            break;
        prof_mark(be, PF_QKV, l);
        if ((rc = attention<T>(be, mp, &g, l, L, kc, vc))) break;
        if (!(sk & 8) && (rc = sandwich ? sandwich_proj<T>(be, att, L->wo, T_, qd, L->post_attn, xn, fold)
                                        : residual_proj<T>(be, att, L->wo, T_, qd, xn, fold)))
            break;
        prof_mark(be, PF_WO, l);
        if (!fold && !(sk & 1) && (rc = qk_rmsnorm<T>(st, xn, be->x, NULL, T_, D, hp->norm_eps, NULL))) break;
        prof_mark(be, PF_NORM2, l);
        if (!(sk & 16) && (rc = gate_up<T>(be, h, xn, L, T_, l, fold))) break;
        prof_mark(be, PF_SWIGLU, l);
        if (!(sk & 32) && (rc = sandwich ? sandwich_proj<T>(be, h, L->wdown, T_, F, L->post_ffn, xn, fold)
                                         : residual_proj<T>(be, h, L->wdown, T_, F, xn, fold)))
            break;
        prof_mark(be, PF_DOWN, l);
    }
    if (!rc && mp->n_logits > 0 && !(be->skip & 64) && !no_head(be)) {
        if ((rc = qk_rmsnorm<T>(st, xn, be->x, be->out_norm, mp->n_logits, D, hp->norm_eps, dm + mp->lidx)) ||
            (rc = gemm(be, be->logits, xn, be->output, mp->n_logits, hp->n_vocab, D, 0.0f)))
            return rc;
        if (hp->final_softcap > 0 &&
            (rc = qk_map(st, be->logits, (size_t)mp->n_logits * hp->n_vocab, QK_MAP_SOFTCAP, hp->final_softcap)))
            return rc;
    }
    prof_mark(be, PF_END, 0);
    return rc;
}

static int run_layers(cuda_be *be, const qbatch *b, const meta_plan *mp)
{
    if (be->wt == QDT_F32) return forward_t<float>(be, b, mp);
    if (be->wt == QDT_BF16) return forward_t<bf16>(be, b, mp);
    return forward_t<__half>(be, b, mp);
}

// Decode batch sizes with a graph of their own: 1-8 exactly, then rounded
// up to multiples of 8 (to 64), 16 (to 128), 32 (beyond).
static int decode_bucket(int T)
{
    if (T <= 8) return T;
    const int step = T <= 64 ? 8 : T <= 128 ? 16 : 32;
    return (T + step - 1) / step * step;
}

static void drop_graphs(cuda_be *be)
{
    for (int i = 0; i < be->n_graphs; i++) cudaGraphExecDestroy(be->g[i].exec);
    be->n_graphs = 0;
}

// A step where every token has a logit row and no sequence more than
// QBE_GRAPH_SEQ_TOKENS tokens (decodes, decodes verifying drafts, a draft
// model's passes) replays a captured graph of the whole pass; anything else
// is launched directly.
static int run_graph(cuda_be *be, const qbatch *b, const meta_plan *mp)
{
    dgraph *e = NULL;
    for (int i = 0; i < be->n_graphs; i++)
        if (be->g[i].T == mp->T && be->g[i].n_split == mp->n_split && be->g[i].split_len == mp->split_len &&
            be->g[i].fuse_rope == mp->fuse_rope)
            e = &be->g[i];
    if (e && e->gen != be->gen) {
        cudaGraphExecDestroy(e->exec);
        *e = be->g[--be->n_graphs];
        e = NULL;
    }
    if (!e && be->n_graphs == (int)(sizeof be->g / sizeof be->g[0])) {
        // Full: the least recently run one goes (verifying passes vary in
        // size with what is kept, so more shapes come and go than decodes').
        int lru = 0;
        for (int i = 1; i < be->n_graphs; i++)
            if (be->g[i].used < be->g[lru].used) lru = i;
        cudaGraphExecDestroy(be->g[lru].exec);
        be->g[lru] = be->g[--be->n_graphs];
    }
    if (!e) {
        cudaGraph_t graph = NULL;
        CK(cudaStreamBeginCapture(be->stream, cudaStreamCaptureModeThreadLocal));
        int rc = run_layers(be, b, mp);
        cudaError_t ce = cudaStreamEndCapture(be->stream, &graph);
        if (rc || ce != cudaSuccess) {
            if (graph) cudaGraphDestroy(graph);
            QLOGE("cuda: capturing a pass's graph: %s", rc ? qerr_str(rc) : cudaGetErrorString(ce));
            return rc ? rc : QERR_DEVICE;
        }
        e = &be->g[be->n_graphs];
        ce = cudaGraphInstantiate(&e->exec, graph, 0);
        cudaGraphDestroy(graph);
        CK(ce);
        e->T = mp->T;
        e->n_split = mp->n_split;
        e->split_len = mp->split_len;
        e->fuse_rope = mp->fuse_rope;
        e->gen = be->gen;
        be->n_graphs++;
    }
    e->used = ++be->graph_clock;
    CK(cudaGraphLaunch(e->exec, be->stream));
    return 0;
}

static int cuda_forward(qbackend *base, const qbatch *b, float *logits)
{
    cuda_be *be = (cuda_be *)base;
    CK(cudaSetDevice(be->dev));
    meta_plan mp;
    // A step where every token has a logit row and each sequence a few
    // tokens (decodes, and decodes with drafts to verify) runs as a graph
    // captured for its bucketed size.
    int graph_step = b->n_tokens > 0 && b->n_logits == b->n_tokens;
    for (int i = 0; graph_step && i < b->n_seqs; i++) graph_step = b->seqs[i].n_tokens <= QBE_GRAPH_SEQ_TOKENS;
    const int use_graph = be->graphs && graph_step && !be->prof;
    int rc = plan_batch(be, b, use_graph, use_graph ? decode_bucket(b->n_tokens) - b->n_tokens : 0, &mp);
    if (rc) return rc;
    if ((rc = ensure_tokens(be, mp.T)) || (rc = ensure_logits(be, no_head(be) ? 0 : mp.n_logits)) ||
        (rc = ensure_part(be, (size_t)mp.n_dec * base->w->hp.n_heads * (mp.n_split > 1 ? mp.n_split : 0))))
        return rc;
    CK(cudaMemcpyAsync(be->d_meta, be->h_meta, 4 * mp.total, cudaMemcpyHostToDevice, be->stream));
    if (use_graph) rc = run_graph(be, b, &mp);
    else rc = run_layers(be, b, &mp);
    if (!rc && b->masks) rc = apply_masks(be, b);
    // Greedy and drawn rows are reduced here; when every row is one, only
    // the ids come back (4 bytes a row instead of the vocabulary's logits).
    int n_reduced = 0, n_drawn = 0, n_lp = 0;
    for (int r = 0; b->row_mode && r < b->n_logits; r++) {
        const int red = b->row_mode[r] == QROW_ARGMAX || b->row_mode[r] == QROW_SAMPLE;
        n_reduced += red;
        n_drawn += b->row_mode[r] == QROW_SAMPLE;
        if (red && b->row_sample && b->row_sample[r].n_logprobs) {
            if (b->row_sample[r].n_logprobs < 0 || b->row_sample[r].n_logprobs > QROW_MAX_LOGPROBS || !b->row_logprobs)
                rc = QERR_INVAL;
            n_lp++;
        }
    }
    if (!rc && n_drawn && !b->row_sample) rc = QERR_INVAL;
    const int V = base->w->hp.n_vocab;
    if (!rc && n_reduced) {
        if (cudaMemcpyAsync(be->d_rows, b->row_mode, (size_t)b->n_logits, cudaMemcpyHostToDevice, be->stream) !=
                cudaSuccess ||
            (n_drawn && cudaMemcpyAsync(be->d_rsample, b->row_sample, sizeof(qrow_sample) * (size_t)b->n_logits,
                                        cudaMemcpyHostToDevice, be->stream) != cudaSuccess))
            rc = QERR_DEVICE;
        if (!rc && n_drawn < n_reduced) rc = qk_argmax_rows(be->stream, be->logits, b->n_logits, V, be->d_rows, be->d_rowtok);
        if (!rc && n_drawn)
            rc = qk_sample_rows(be->stream, be->logits, b->n_logits, V, be->d_rows, be->d_rsample, be->d_rowtok);
        if (!rc && n_lp) {
            if ((!n_drawn && cudaMemcpyAsync(be->d_rsample, b->row_sample, sizeof(qrow_sample) * (size_t)b->n_logits,
                                             cudaMemcpyHostToDevice, be->stream) != cudaSuccess) ||
                cudaMemsetAsync(be->d_lp, 0xff, sizeof(qrow_logprobs) * (size_t)b->n_logits, be->stream) != cudaSuccess)
                rc = QERR_DEVICE; // n = -1: rows not done
            if (!rc)
                rc = qk_row_logprobs(be->stream, be->logits, b->n_logits, V, be->d_rows, be->d_rsample, be->d_rowtok,
                                     be->d_lp);
            if (!rc && cudaMemcpyAsync(b->row_logprobs, be->d_lp, sizeof(qrow_logprobs) * (size_t)b->n_logits,
                                       cudaMemcpyDeviceToHost, be->stream) != cudaSuccess)
                rc = QERR_DEVICE;
        }
        if (!rc && cudaMemcpyAsync(b->row_token, be->d_rowtok, 4 * (size_t)b->n_logits, cudaMemcpyDeviceToHost,
                                   be->stream) != cudaSuccess)
            rc = QERR_DEVICE;
    }
    if (!rc && b->n_logits > n_reduced && !no_head(be) &&
        cudaMemcpyAsync(logits, be->logits, sizeof(float) * b->n_logits * base->w->hp.n_vocab, cudaMemcpyDeviceToHost,
                        be->stream) != cudaSuccess)
        rc = QERR_DEVICE;
    cudaError_t e = cudaStreamSynchronize(be->stream);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
        QLOGE("cuda: forward: %s", cudaGetErrorString(e));
        return QERR_DEVICE;
    }
    // A draw the device gave back (-1: a nucleus too large to sort here)
    // needs its logits on the host, which an all-reduced pass did not copy.
    if (!rc && n_drawn && n_reduced == b->n_logits) {
        int back = 0;
        for (int r = 0; r < b->n_logits; r++) back |= b->row_mode[r] == QROW_SAMPLE && b->row_token[r] < 0;
        if (back && cudaMemcpy(logits, be->logits, sizeof(float) * b->n_logits * V, cudaMemcpyDeviceToHost) != cudaSuccess)
            rc = QERR_DEVICE;
    }
    if (!rc && base->w->hp.n_layers > 1) prof_collect(be, b->n_tokens);
    return rc;
}

// ---- blocks ---------------------------------------------------------------------------

static size_t cuda_block_bytes(const qbackend *base)
{
    const cuda_be *be = (const cuda_be *)base;
    return 2 * (size_t)base->w->hp.n_layers * be->block_elems * be->esz;
}

static int cuda_copy_block(qbackend *base, int src, int dst)
{
    cuda_be *be = (cuda_be *)base;
    const int nb = base->opts.num_blocks;
    if (src < 0 || src >= nb || dst < 0 || dst >= nb) return QERR_RANGE;
    if (src == dst) return 0;
    CK(cudaSetDevice(be->dev));
    const size_t n = be->block_elems * be->esz, layer = (size_t)be->nb_alloc * n;
    for (int c = 0; c < 2; c++) {
        char *cache = (char *)(c ? be->vc : be->kc);
        for (int l = 0; l < base->w->hp.n_layers; l++)
            CK(cudaMemcpyAsync(cache + l * layer + (size_t)dst * n, cache + l * layer + (size_t)src * n, n,
                               cudaMemcpyDeviceToDevice, be->stream));
    }
    CK(cudaStreamSynchronize(be->stream));
    return 0;
}

static int cuda_rw_block(qbackend *base, int block, void *host, int write)
{
    cuda_be *be = (cuda_be *)base;
    const int nb = base->opts.num_blocks, L = base->w->hp.n_layers;
    if (block < 0 || block >= nb) return QERR_RANGE;
    CK(cudaSetDevice(be->dev));
    const size_t n = be->block_elems * be->esz, layer = (size_t)be->nb_alloc * n;
    char *h = (char *)host;
    for (int c = 0; c < 2; c++) {
        char *cache = (char *)(c ? be->vc : be->kc);
        for (int l = 0; l < L; l++, h += n) {
            char *p = cache + l * layer + (size_t)block * n;
            if (write) CK(cudaMemcpyAsync(p, h, n, cudaMemcpyHostToDevice, be->stream));
            else CK(cudaMemcpyAsync(h, p, n, cudaMemcpyDeviceToHost, be->stream));
        }
    }
    CK(cudaStreamSynchronize(be->stream));
    return 0;
}

// n blocks in one go: every layer's K and V of each, then one wait.
static int cuda_rw_blocks(qbackend *base, const int32_t *blocks, int n, void *host, int write)
{
    cuda_be *be = (cuda_be *)base;
    const int nb = base->opts.num_blocks, L = base->w->hp.n_layers;
    for (int i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= nb) return QERR_RANGE;
    CK(cudaSetDevice(be->dev));
    const size_t sz = be->block_elems * be->esz, layer = (size_t)be->nb_alloc * sz;
    char *h = (char *)host;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < 2; c++) {
            char *cache = (char *)(c ? be->vc : be->kc);
            for (int l = 0; l < L; l++, h += sz) {
                char *p = cache + l * layer + (size_t)blocks[i] * sz;
                if (write) CK(cudaMemcpyAsync(p, h, sz, cudaMemcpyHostToDevice, be->stream));
                else CK(cudaMemcpyAsync(h, p, sz, cudaMemcpyDeviceToHost, be->stream));
            }
        }
    CK(cudaStreamSynchronize(be->stream));
    return 0;
}
static int cuda_read_blocks(qbackend *base, const int32_t *blocks, int n, void *host)
{
    return cuda_rw_blocks(base, blocks, n, host, 0);
}
static int cuda_write_blocks(qbackend *base, const int32_t *blocks, int n, const void *host)
{
    return cuda_rw_blocks(base, blocks, n, (void *)host, 1);
}
static void *cuda_host_alloc(qbackend *base, size_t bytes)
{
    void *p = NULL;
    if (cudaSetDevice(((cuda_be *)base)->dev) != cudaSuccess) return NULL;
    return cudaMallocHost(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}
static void cuda_host_free(qbackend *, void *p) { cudaFreeHost(p); }

static int cuda_read_block(qbackend *base, int block, void *dst) { return cuda_rw_block(base, block, dst, 0); }
static int cuda_write_block(qbackend *base, int block, const void *src)
{
    return cuda_rw_block(base, block, (void *)src, 1);
}

static void cuda_destroy(qbackend *base)
{
    cuda_be *be = (cuda_be *)base;
    if (!be) return;
    cudaSetDevice(be->dev);
    prof_dump(be);
    for (int i = 0; i < PF_N && be->prof; i++) cudaEventDestroy(be->ev[i]);
    drop_graphs(be);
    cudaFree(be->blas_ws);
    if (be->L) {
        for (int l = 0; l < base->w->hp.n_layers; l++) {
            dlayer *d = &be->L[l];
            void *ps[] = { d->wqkv, d->wo, d->wgu, d->wdown, d->bqkv, d->attn_norm, d->ffn_norm, d->q_norm, d->k_norm,
                           d->post_attn, d->post_ffn };
            for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) cudaFree(ps[i]);
        }
        free(be->L);
    }
    if (be->output && be->output != be->tok_embd) cudaFree(be->output);
    void *bufs[] = { be->tok_embd, be->out_norm, be->inv_freq, be->inv_freq_local, be->tmp, be->kc, be->vc, be->x,
                     be->qkv, be->gu, be->xn,
                     be->qb, be->att, be->h, be->logits, be->d_rows, be->d_rowtok, be->d_rsample, be->d_lp,
                     be->part_acc, be->part_ml, be->part_cnt, be->d_meta };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    cudaFreeHost(be->h_meta);
    cudaFreeHost(be->h_mask);
    cudaFreeHost(be->h_has);
    cudaFree(be->d_mask);
    cudaFree(be->d_has);
    if (be->blas) cublasDestroy(be->blas);
    if (be->mstream) cudaStreamDestroy(be->mstream);
    if (be->mdone) cudaEventDestroy(be->mdone);
    if (be->stream) cudaStreamDestroy(be->stream);
    free(be);
}

static const qbackend_ops cuda_ops = {
    "cuda",           cuda_forward,      cuda_copy_block,  cuda_block_bytes, cuda_read_block,
    cuda_write_block, cuda_destroy,      cuda_read_blocks, cuda_write_blocks, cuda_host_alloc,
    cuda_host_free,   QBE_CAP_ROW_SAMPLE | QBE_CAP_ROW_LOGPROBS | QBE_CAP_ROW_MASK, cuda_mask_rows,
};

// The storage type: float in the exact mode; f16 when every matrix of the
// checkpoint is f16; bf16 otherwise (and for random weights).
static int pick_storage(const qweights *w, int exact)
{
    if (exact) return QDT_F32;
    int all_f16 = w->tok_embd.data != NULL;
    for (int l = 0; l < w->hp.n_layers && all_f16; l++) {
        const qlayer *s = &w->layers[l];
        const qtensor *m[] = { &s->wq, &s->wk, &s->wv, &s->wo, &s->w_gate, &s->w_up, &s->w_down };
        for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
            if (m[i]->dtype != QDT_F16) all_f16 = 0;
    }
    if (w->tok_embd.dtype != QDT_F16) all_f16 = 0;
    return all_f16 ? QDT_F16 : QDT_BF16;
}

extern "C" int cuda_backend_create(const qweights *w, const qbackend_opts *opts, qbackend **out, char *err,
                                   size_t errlen)
{
    *out = NULL;
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess || n == 0)
        return qerr_set(err, errlen, QERR_DEVICE, "no CUDA device (%s)",
                        ce != cudaSuccess ? cudaGetErrorString(ce) : "none found");
    if (opts->device < 0 || opts->device >= n)
        return qerr_set(err, errlen, QERR_DEVICE, "cuda backend: no device %d (this machine has %d)", opts->device, n);
    if ((ce = cudaSetDevice(opts->device)) != cudaSuccess)
        return qerr_set(err, errlen, QERR_DEVICE, "cuda backend: device %d: %s", opts->device, cudaGetErrorString(ce));
    const qhparams *hp = &w->hp;
    const char *feature = qhp_unsupported(hp, QHP_ALL);
    if (feature) return qerr_set(err, errlen, QERR_UNSUPPORTED, "cuda backend: the model needs %s, which it does not compute yet", feature);
    if (opts->num_blocks < 0 || opts->block_size <= 0 || opts->block_size > 4096)
        return qerr_set(err, errlen, QERR_INVAL, "cuda backend: %d blocks of %d tokens", opts->num_blocks,
                        opts->block_size);
    if (opts->gpu_mem_util < 0 || opts->gpu_mem_util > 1)
        return qerr_set(err, errlen, QERR_INVAL, "cuda backend: gpu_mem_util %g is not in (0, 1]",
                        (double)opts->gpu_mem_util);
    if (hp->head_dim > 256 || hp->n_heads % hp->n_kv_heads || hp->n_heads / hp->n_kv_heads > 16)
        return qerr_set(err, errlen, QERR_UNSUPPORTED,
                        "cuda backend: head_dim %d with %d query heads per KV head (at most 256 and 16)", hp->head_dim,
                        hp->n_heads / (hp->n_kv_heads ? hp->n_kv_heads : 1));
    if ((size_t)(hp->n_heads + 2 * hp->n_kv_heads) * hp->head_dim * 4 > 44 * 1024)
        return qerr_set(err, errlen, QERR_UNSUPPORTED, "cuda backend: %d + 2 x %d heads of %d do not fit the RoPE kernel",
                        hp->n_heads, hp->n_kv_heads, hp->head_dim);
    cuda_be *be = (cuda_be *)calloc(1, sizeof *be);
    if (!be) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    be->base.ops = &cuda_ops;
    be->base.w = w;
    be->base.opts = *opts;
    be->dev = opts->device;
    be->wt = pick_storage(w, opts->exact);
    be->esz = qdt_size(be->wt);
    be->block_elems = (size_t)hp->n_kv_heads * opts->block_size * hp->head_dim;
    int rc = 0;
    const char *what = "creating the stream and cuBLAS";
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, be->dev) != cudaSuccess || cudaStreamCreate(&be->stream) != cudaSuccess ||
        cublasCreate(&be->blas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(be->blas, be->stream) != CUBLAS_STATUS_SUCCESS)
        rc = QERR_DEVICE;
    const char *pe = getenv("QUIRE_CUDA_PROFILE");
    if (!rc && pe && *pe == '1') {
        be->prof = 1;
        for (int i = 0; i < PF_N; i++)
            if (cudaEventCreate(&be->ev[i]) != cudaSuccess) rc = QERR_DEVICE;
    }
    const char *ge = getenv("QUIRE_CUDA_GRAPHS"), *gv = getenv("QUIRE_CUDA_GEMV");
    be->graphs = !(ge && *ge == '0');
    be->gemv = !(gv && *gv == '0');
    const char *gt = getenv("QUIRE_CUDA_GEMV_TOKENS"), *mm = getenv("QUIRE_CUDA_MMA");
    be->gemv_tokens = gt && *gt ? atoi(gt) : 0;
    be->mma = !(mm && *mm == '0');
    const char *sk = getenv("QUIRE_CUDA_SKIP");
    be->skip = sk ? atoi(sk) : 0;
    if (be->skip) QLOGW("cuda: QUIRE_CUDA_SKIP=%d: steps left out, outputs are meaningless", be->skip);
    const char *fu = getenv("QUIRE_CUDA_FUSE");
    be->fuse = !(fu && *fu == '0');
    const char *nf = getenv("QUIRE_CUDA_NORM_FOLD");
    be->norm_fold = nf && *nf ? atoi(nf) : QK_GEMV_MAX;
    const char *sm = getenv("QUIRE_CUDA_SPLIT_MIN");
    be->split_min = 32;
    while (sm && be->split_min < atoi(sm) && be->split_min < (1 << 20)) be->split_min *= 2;
    const char *sf = getenv("QUIRE_CUDA_SPLIT_FILL"), *sx = getenv("QUIRE_CUDA_SPLIT_MAX");
    be->split_fill = sf && atoi(sf) > 0 ? atoi(sf) : 8;
    be->split_max = sx && atoi(sx) > 0 && atoi(sx) < 64 ? atoi(sx) : 64;
    const char *pd = getenv("QUIRE_CUDA_PDL");
    qk_pdl = !(pd && *pd == '0');
    const char *gs = getenv("QUIRE_CUDA_GEMV_SPLIT");
    qk_gemv_split = gs && *gs ? atoi(gs) : 2;
    const char *gp = getenv("QUIRE_CUDA_GEMV_PRELOAD");
    qk_gemv_preload = gp && *gp ? atoi(gp) : 3;
    const char *ac = getenv("QUIRE_CUDA_CLUSTER");
    qk_attn_cluster = !(ac && *ac == '0');
    const char *r1 = getenv("QUIRE_CUDA_GEMV_ROWS1");
    be->rows1 = r1 && (*r1 == '1' || *r1 == '2') ? *r1 - '0' : 0;
    const char *cp = getenv("QUIRE_CUDA_CLUSTER_PAD");
    qk_cluster_pad = cp && *cp ? atoi(cp) : 48;
    const char *cq = getenv("QUIRE_CUDA_CLUSTER_PAD_SMALL");
    qk_cluster_pad_small = cq && *cq ? atoi(cq) : 112;
    const char *ap = getenv("QUIRE_CUDA_ATTN_PREFETCH");
    qk_attn_prefetch = ap && *ap ? atoi(ap) != 0 : 1;
    // cuBLAS gets its workspace up front: nothing may allocate during graph capture.
    const size_t ws = (size_t)32 << 20;
    if (!rc && (dmalloc(&be->blas_ws, ws) || cublasSetWorkspace(be->blas, be->blas_ws, ws) != CUBLAS_STATUS_SUCCESS))
        rc = QERR_DEVICE;
    if (!rc) {
        be->n_sm = prop.multiProcessorCount;
        // Exact float32 products in the exact mode: no TF32 shortcut.
        cublasSetMathMode(be->blas, be->wt == QDT_F32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH);
        be->L = (dlayer *)calloc((size_t)hp->n_layers, sizeof *be->L);
        if (!be->L) rc = QERR_NOMEM;
    }
    if (!rc) {
        what = "uploading the weights";
        if (be->wt == QDT_F32) rc = upload_weights<float>(be);
        else if (be->wt == QDT_BF16) rc = upload_weights<bf16>(be);
        else rc = upload_weights<__half>(be);
        if (rc == QERR_INVAL) what = "uploading the weights (a tensor has no data)";
    }
    // RoPE frequencies: computed once on the host exactly as the CPU backend does.
    if (!rc) {
        what = "RoPE frequencies";
        int half = hp->rope_dim / 2;
        float *f = (float *)malloc(sizeof(float) * (half + 1));
        if (!f) rc = QERR_NOMEM;
        else {
            qrope_inv_freq(w, f);
            if (dmalloc((void **)&be->inv_freq, sizeof(float) * (half + 1)) ||
                cudaMemcpy(be->inv_freq, f, sizeof(float) * half, cudaMemcpyHostToDevice) != cudaSuccess)
                rc = QERR_DEVICE;
            if (!rc && hp->window > 0 && hp->rope_theta_local > 0) {
                qrope_inv_freq_layer(w, 1, f);
                if (dmalloc((void **)&be->inv_freq_local, sizeof(float) * (half + 1)) ||
                    cudaMemcpy(be->inv_freq_local, f, sizeof(float) * half, cudaMemcpyHostToDevice) != cudaSuccess)
                    rc = QERR_DEVICE;
            }
            free(f);
        }
    }
    if (!rc) {
        what = "scratch buffers";
        rc = ensure_tokens(be, opts->max_tokens > 0 ? opts->max_tokens : 2048);
        if (!rc) rc = ensure_logits(be, 256);
        if (!rc) rc = ensure_meta(be, 1 << 16);
    }
    const size_t per_block = 2 * (size_t)hp->n_layers * be->block_elems * be->esz;
    if (!rc && opts->num_blocks == 0) {
        what = "sizing the KV pool";
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) rc = QERR_DEVICE;
        else {
            double util = opts->gpu_mem_util > 0 ? opts->gpu_mem_util : 0.90;
            double avail = (double)fr - (1.0 - util) * (double)tot - 512.0 * 1048576.0 // cuBLAS, logits, splits
                           - (double)opts->reserve_bytes;
            double nbk = avail / (double)(per_block + opts->extra_block_bytes);
            if (nbk < 1) {
                rc = QERR_NOMEM;
                what = "sizing the KV pool: no device memory left for one block after the weights";
            } else be->base.opts.num_blocks = nbk > (1 << 24) ? (1 << 24) : (int)nbk;
        }
    }
    if (!rc) {
        what = "allocating the KV pool";
        be->nb_alloc = be->base.opts.num_blocks + 1;
        size_t total = per_block / 2 * (size_t)be->nb_alloc;
        if (dmalloc(&be->kc, total) || dmalloc(&be->vc, total)) rc = QERR_DEVICE;
    }
    if (!rc && cudaStreamSynchronize(be->stream) != cudaSuccess) rc = QERR_DEVICE;
    if (rc) {
        cuda_destroy(&be->base);
        return qerr_set(err, errlen, rc, "cuda backend: %s failed (%s)", what, qerr_str(rc));
    }
    QLOGI("cuda: %s (device %d), %s weights, KV pool %d blocks of %d tokens (%.1f MiB)%s", prop.name, be->dev,
          qdt_name(be->wt), be->base.opts.num_blocks, opts->block_size,
          (double)per_block * be->base.opts.num_blocks / 1048576.0, opts->allreduce ? ", a shard of the model" : "");
    *out = &be->base;
    return 0;
}
