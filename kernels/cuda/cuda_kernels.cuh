// cuda_kernels.cuh - launchers of the CUDA backend's kernels (defined in
// cuda_ops.cu and cuda_attn.cu, instantiated for float, bf16 and f16
// storage).  Each returns 0 or QERR_DEVICE (the launch failed) /
// QERR_UNSUPPORTED (no kernel for this shape).  All run on the given stream
// and never synchronise.
#ifndef QUIRE_CUDA_KERNELS_CUH
#define QUIRE_CUDA_KERNELS_CUH

#include "cuda_common.cuh"

// What the attention and cache-writing kernels need to find K/V: for token t,
// its position pos[t] and sequence seq[t]; sequence s's block table starts at
// tables[seq_info[2s]].  One layer's K (or V) cache is num_blocks blocks of
// block_elems = KV * bs * hd elements, laid out (block, kv head, slot, dim).
struct qattn_geom {
    const int32_t *pos, *seq, *seq_info, *tables;
    int H, KV, hd, bs;
    size_t block_elems;
    float scale;             // 1/sqrt(hd), or the model's attention scale
    int window;              // a local layer's: a token attends to its last window positions; 0: all
    float softcap;           // scores -> softcap * tanh(score / softcap); 0: none
    float rope_mscale;       // LongRoPE: cos and sin times this; 0: 1
};

// The geometry of one pass: the metadata arrays on the device and the
// model's head layout (block_elems and scale follow from them).
static inline qattn_geom qk_geom(const int32_t *pos, const int32_t *seq, const int32_t *seq_info,
                                 const int32_t *tables, int H, int KV, int hd, int bs)
{
    qattn_geom g;
    g.pos = pos;
    g.seq = seq;
    g.seq_info = seq_info;
    g.tables = tables;
    g.H = H;
    g.KV = KV;
    g.hd = hd;
    g.bs = bs;
    g.block_elems = (size_t)KV * bs * hd;
    g.scale = 1.0f / sqrtf((float)hd);
    g.window = 0;
    g.softcap = 0.0f;
    g.rope_mscale = 0.0f;
    return g;
}

// The first position token position p attends to under window w (0: none).
__host__ __device__ __forceinline__ int qk_window_lo(int p, int w) { return w > 0 && p + 1 > w ? p + 1 - w : 0; }

// A gated unit's output from its gate and up sums: SiLU (SwiGLU) or the
// tanh-approximated GELU (GeGLU), operation for operation as the CPU's
// cpu_swiglu and cpu_geglu; every kernel that applies one calls this, so
// that a fused projection gives the bits of the projection and glu after it.
__device__ __forceinline__ float qk_glu(float g, float up, int gelu)
{
    if (gelu) {
        const float c = 0.7978845608028654f; // sqrt(2 / pi)
        return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g))) * up;
    }
    return g / (1.0f + expf(-g)) * up;
}

// What rope_store reads for a token, for attention that does its work
// itself (qk_attn_decode): the raw projections (float, n x (H+2KV)*hd), the
// bias or NULL, the inverse frequencies (rope_dim/2; rope_dim 0: a NoPE
// layer), the pairing, and QK-norm's weights (both or neither).
struct qk_rope_in {
    const float *qkv, *bias, *inv_freq;
    int rope_dim, neox;
    float mscale;            // LongRoPE: cos and sin times this; 0: 1
    const float *qn, *kn;    // QK-norm: each query head RMS-normalised with qn (hd), the key with kn
    float eps;
};

// RoPE on one pair at position p, the same operations wherever it is done
// (explicit roundings: no contraction may differ between two kernels).
__device__ __forceinline__ void qk_rotate(float *x0, float *x1, int p, float inv_freq, float mscale = 0.0f)
{
    float s, c;
    sincosf((float)p * inv_freq, &s, &c);
    if (mscale > 0) { // LongRoPE's attention factor, as the CPU's rope_cs applies it
        c = __fmul_rn(c, mscale);
        s = __fmul_rn(s, mscale);
    }
    const float a = *x0, b = *x1;
    *x0 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    *x1 = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// x[i] (float, D) = emb[tok[i]] * scale (0: 1; Gemma's sqrt(D)) for n
// tokens; xc[i] (x in T) too unless NULL.
template <typename T>
int qk_embed(cudaStream_t st, float *x, const T *emb, const int32_t *tok, int n, int D, T *xc = NULL,
             float scale = 0.0f);
// y[i] = x[rows ? rows[i] : i] / rms * w (w NULL: 1), for n rows of D.
template <typename T>
int qk_rmsnorm(cudaStream_t st, T *y, const float *x, const float *w, int n, int D, float eps, const int32_t *rows);
// From qkv (float, n x (H+2KV)*hd, bias added when given): RoPE on q and k,
// q stored to q_out (n x H*hd), k and v stored to the layer's cache.  With
// qn and kn (QK-norm; both or neither): each query head RMS-normalised
// with weights qn (hd), each key head with kn, before RoPE.
template <typename T>
int qk_rope_store(cudaStream_t st, const float *qkv, const float *bias, T *q_out, T *kc, T *vc, const float *inv_freq,
                  const qattn_geom *g, int n, int rope_dim, int neox, const float *qn = NULL, const float *kn = NULL,
                  float eps = 0.0f);
// h[i][j] = silu(gu[i][j]) * gu[i][F + j].
template <typename T> int qk_swiglu(cudaStream_t st, T *h, const float *gu, int n, int F);
// h[i][j] = gelu_tanh(gu[i][j]) * gu[i][F + j] (GeGLU).
template <typename T> int qk_geglu(cudaStream_t st, T *h, const float *gu, int n, int F);
// Elementwise on n floats: QK_MAP_SOFTCAP x = a tanh(x / a), QK_MAP_ADD x += a.
enum { QK_MAP_SOFTCAP = 1, QK_MAP_ADD = 2 };
int qk_map(cudaStream_t st, float *x, size_t n, int op, float a);
// x[i] += rmsnorm(y[i]) * w for n rows of D (a sandwich norm's output added
// to the residual stream); xc[i] (x in T) too unless NULL.
template <typename T>
int qk_rmsnorm_add(cudaStream_t st, float *x, const float *y, const float *w, int n, int D, float eps, T *xc = NULL);
// Attention of n single query tokens (tok_list) over their whole context,
// split in ranges of split_len positions and reduced (one range: direct);
// n_split (at most 64) * split_len must cover every token's context
// (blocks for ranges past a token's context return at once).
// part_acc/part_ml hold n * H * n_split partial results, part_cnt n * KV
// counters that must be 0 before the first call (and are left 0);
// all three may be NULL when n_split is 1.  rope NULL: q holds the rotated
// queries and the cache the tokens' keys and values (qk_rope_store ran).
// rope given: q is not read; each token's query, key and value come from
// rope->qkv as qk_rope_store would make them, and the key and value are
// stored to the cache here - only for passes where no two tokens share a
// sequence.
template <typename T>
int qk_attn_decode(cudaStream_t st, const T *q, T *kc, T *vc, const qattn_geom *g, const qk_rope_in *rope,
                   const int32_t *tok_list, int n, int n_split, int split_len, float *part_acc, float *part_ml,
                   int *part_cnt, T *out);
// Tiled attention with tensor cores for chunks of up to 64 consecutive query
// tokens of one sequence (tiles: {first token, count, sequence, 0}); keys are
// the sequence's positions 0 .. last query, read through its block table.
// bf16 and f16 only, head_dim 64, 128 or 256 (qk_attn_prefill_ok).
template <typename T>
int qk_attn_prefill(cudaStream_t st, const T *q, const T *kc, const T *vc, const qattn_geom *g, const int4 *tiles,
                    int n_tiles, T *out);
bool qk_attn_prefill_ok(int elem_bytes, int hd);
// y(n, N) = x(n, K) W(N, K)^T + beta y for n <= QK_GEMV_MAX tokens
// (bf16/f16, K a multiple of 8: qk_gemv_ok); y float; 1 or 2 rows a warp
// (the same sums either way), or 0: 2 where one row a warp would take more
// than one wave of blocks (the 8B shapes), else 1.  yc, unless NULL, receives y in T as well
// (the residual stream for a projection with the norm folded in).
#define QK_GEMV_MAX 8
template <typename T>
int qk_gemv(cudaStream_t st, float *y, const T *x, const T *W, int n, int N, int K, float beta, int rows_per_warp,
            T *yc = NULL);
bool qk_gemv_ok(int elem_bytes, int n, int K);
// The same product on the tensor cores (cuda_mma.cu) for 1 <= n <=
// QK_MMA_MAX tokens and K a multiple of 128 (qk_gemv_mma_ok; else
// QERR_UNSUPPORTED): weights streamed once whatever n; float sums in
// another order than qk_gemv's, a token's the same whatever the others.
// variant: the shape of the warps' work (0 or 1 the default, 2; bench_gpu
// --gemv compares them).
#define QK_MMA_MAX 8
template <typename T>
int qk_gemv_mma(cudaStream_t st, float *y, const T *x, const T *W, int n, int N, int K, float beta, T *yc = NULL,
                int variant = 0);
bool qk_gemv_mma_ok(int elem_bytes, int n, int K);
// qk_gemv_norm and qk_gemv_swiglu_norm on the tensor cores (the shapes
// qk_gemv_mma_ok takes): the norm's mean summed from the x fragments the
// warps hold, in a fixed order; a token's result independent of the others.
template <typename T> int qk_gemv_mma_norm(cudaStream_t st, float *y, const T *x, const T *W, int n, int N, int K, float eps);
template <typename T>
int qk_gemv_mma_swiglu_norm(cudaStream_t st, T *h, const T *x, const T *W, int n, int F, int K, float eps,
                            int gelu = 0);
// h(n, F) = silu(x W_gate^T) * (x W_up^T) as T, W (2F, K) the gate rows then
// the up rows: the same bits as qk_gemv on the whole W and qk_swiglu after
// it (the shapes qk_gemv_ok takes).  gelu: GeGLU (qk_geglu's bits) instead;
// so for the _norm forms.
template <typename T> int qk_gemv_swiglu(cudaStream_t st, T *h, const T *x, const T *W, int n, int F, int K, int gelu = 0);
// The same with the RMSNorm before the projection folded in, for weights
// that already hold the norm's weights (qk_scale_cols): x is the residual
// stream itself (in T: qk_gemv's yc) and each token's sums are scaled by
// 1 / sqrt(mean(x^2) + eps), the mean summed in float alongside the
// products; y is written (no beta).  A token's result does not depend on
// the others in the pass.
template <typename T>
int qk_gemv_norm(cudaStream_t st, float *y, const T *x, const T *W, int n, int N, int K, float eps, int rows_per_warp);
template <typename T>
int qk_gemv_swiglu_norm(cudaStream_t st, T *h, const T *x, const T *W, int n, int F, int K, float eps, int gelu = 0);
// W (N, K) *= g (K) per column, rounded to T: a norm's weights folded into
// the projection that reads its output.
template <typename T> int qk_scale_cols(cudaStream_t st, T *W, const float *g, int N, int K);
// For each row r < n with rows[r] != 0: out[r] = the lowest id among the
// maximal logits of row r (NaN never wins; all NaN: 0).
int qk_argmax_rows(cudaStream_t st, const float *logits, int n, int V, const uint8_t *rows, int32_t *out);
// Guided rows: for each row r < n with has[r], logits of the tokens whose
// bit is clear in mask row r ((V + 31) / 32 words) become -inf.
int qk_mask_rows(cudaStream_t st, float *logits, int n, int V, const uint32_t *mask, const uint8_t *has);
// For each row r < n with mode[r] == QROW_SAMPLE: out[r] = the draw
// ps[r] describes (backend.h's qrow_sample, sample.c's draw()).
int qk_sample_rows(cudaStream_t st, const float *logits, int n, int V, const uint8_t *mode, const qrow_sample *ps,
                   int32_t *out);
// For reduced rows whose ps[r].n_logprobs > 0 (tokens[r] chosen): out[r]
// as qsample_logprobs gives it from the raw logits (n 0: no finite logit).
int qk_row_logprobs(cudaStream_t st, const float *logits, int n, int V, const uint8_t *mode, const qrow_sample *ps,
                    const int32_t *tokens, qrow_logprobs *out);
// p[i] uniform in [lo, hi) from seed (random-weight models).
template <typename T> int qk_fill_uniform(cudaStream_t st, T *p, size_t n, uint64_t seed, float lo, float hi);
// dst[i] = src[i] converted (weights uploaded as f32/f16/bf16 and stored as T).
template <typename T, typename S> int qk_convert(cudaStream_t st, T *dst, const S *src, size_t n);

#endif
