/* cuda_info.h - CUDA devices visible to this process (built only when the
 * CUDA toolkit is found; QUIRE_HAVE_CUDA is then defined). */
#ifndef QUIRE_CUDA_INFO_H
#define QUIRE_CUDA_INFO_H

#include <stddef.h>

/* Number of usable devices; 0 (with the runtime's reason in err) when there
 * is no driver or no device.  Cannot crash without a GPU. */
int cuda_device_count(char *err, size_t errlen);
/* "NVIDIA H200 (sm_90, 139.8 GiB)"; 0 or -1. */
int cuda_device_name(int dev, char *buf, size_t len);

/* ---- self-tests and ceilings (kernels/cuda/cuda_selftest.cu) ---------- */

#include <stdint.h>

/* One attention kernel run on host data: K/V caches of num_blocks blocks of
 * (KV, bs, hd) floats, n_tok query tokens (H heads of hd), each with its
 * position and sequence; sequence s's block table starts at
 * tables[seq_info[2s]].  prefill: the tensor-core kernel over runs of
 * consecutive positions (bf16/f16, hd 64 or 128); otherwise the decode
 * kernel with n_split splits of split_len positions.  Inputs are rounded
 * to dtype on the device. */
typedef struct {
    int dtype, prefill;
    int H, KV, hd, bs, num_blocks;
    const float *kc, *vc, *q;
    int n_tok;
    const int32_t *pos, *seq;
    int n_seqs;
    const int32_t *seq_info, *tables;
    int n_table;
    int n_split, split_len;
    int global_combine; /* 1: decode splits combined through global memory even where a cluster could */
} cuda_attn_case;

/* Writes n_tok * H * hd floats into out; 0 or a QERR_* code. */
int cuda_selftest_attention(const cuda_attn_case *c, float *out);
/* Rounds x in place to dtype (QDT_BF16 / QDT_F16) as the device does. */
int cuda_selftest_round(int dtype, float *x, size_t n);
/* Device-to-device copy bandwidth (TB/s, bytes read + written, 4 GiB) and
 * cuBLAS bf16 8192^3 product rate (TFLOP/s) on random data. */
int cuda_measure_ceilings(double *copy_tbs, double *bf16_tflops);
/* Prints a table of the small-batch projection kernels' weight-streaming
 * rates against cuBLAS for n tokens (bench/gpu). */
#include <stdio.h>
int cuda_bench_gemv(FILE *f, int n);

/* ---- self-tests of the other kernels (kernels/cuda/cuda_selftest_ops.cu) -
 *
 * Each runs one launcher of cuda_kernels.cuh once on host data and returns
 * 0 or a QERR_* code.  Outputs are filled with 0xff bytes (NaN) before the
 * run; inputs the kernel reads in a storage type are rounded to dtype
 * (QDT_*) on the device, float inputs are passed as they are. */

/* qk_embed: emb (V, D) as dtype, tok (n) in [0, V); x (n, D) float. */
int cuda_selftest_embed(int dtype, const float *emb, int V, int D, const int32_t *tok, int n, float *x);
/* qk_rmsnorm: x (n_x, D) float, w (D) float; row i of y (n, D), stored as
 * dtype, normalises x row rows[i], or row i when rows is NULL (n_x == n). */
int cuda_selftest_rmsnorm(int dtype, const float *x, int n_x, const float *w, int n, int D, float eps,
                          const int32_t *rows, float *y);
/* qk_swiglu: gu (n, 2F) float (gate, then up); h (n, F) stored as dtype. */
int cuda_selftest_swiglu(int dtype, const float *gu, int n, int F, float *h);

/* qk_rope_store on n_tok tokens: qkv (n_tok, (H+2KV)*hd) float, bias
 * ((H+2KV)*hd) float or NULL, inv_freq (rope_dim/2) float; positions,
 * sequences and block tables as in cuda_attn_case; qn and kn (hd each; both
 * or neither, NULL: none) QK-norm's weights, with eps. */
typedef struct {
    int dtype, neox, rope_dim;
    int H, KV, hd, bs, num_blocks;
    const float *qkv, *bias, *inv_freq;
    int n_tok;
    const int32_t *pos, *seq;
    int n_seqs;
    const int32_t *seq_info, *tables;
    int n_table;
    const float *qn, *kn;
    float eps;
} cuda_rope_case;
/* q (n_tok, H*hd); kc, vc (num_blocks, KV, bs, hd): the whole caches, all
 * poisoned before the run. */
int cuda_selftest_rope_store(const cuda_rope_case *c, float *q, float *kc, float *vc);

/* qk_attn_decode with RoPE (rope_dim 0: none, a NoPE layer), QK-norm (c's
 * qn, kn) and the cache store folded in, against
 * qk_rope_store followed by qk_attn_decode, for c's tokens (one a sequence,
 * token i in sequence i) over caches (num_blocks, KV, bs, hd) that start as
 * kc0 / vc0, with n_split splits of split_len positions.  *mismatch counts
 * the elements of the output and of both caches whose bits differ between
 * the two; out (n_tok, H*hd) receives the folded form's output. */
int cuda_selftest_attn_rope(const cuda_rope_case *c, const float *kc0, const float *vc0, int n_split, int split_len,
                            float *out, size_t *mismatch);

/* qk_gemv: x (n, K) and W (N, K) as dtype; y (n, N) float.  beta 0: y is
 * poisoned and y0 unused; otherwise y starts as y0 (n, N).  QERR_UNSUPPORTED
 * where qk_gemv_ok refuses the shape (float storage, n > 8, K % 8). */
int cuda_selftest_gemv(int dtype, const float *x, const float *W, int n, int N, int K, float beta, const float *y0,
                       int rows_per_warp, float *y);
/* qk_gemv_mma (tensor cores), as cuda_selftest_gemv for 1 <= n <= 8 and K
 * a multiple of 128 (else QERR_UNSUPPORTED), in the given variant (1, 2:
 * the shapes of the warps' work; 0 the default); yc (NULL: not asked for)
 * receives y as dtype too. */
int cuda_selftest_gemv_mma(int dtype, const float *x, const float *W, int n, int N, int K, float beta, const float *y0,
                           int variant, float *y, float *yc);
/* qk_gemv_swiglu: x (n, K), W (2F, K) as dtype; h (n, F) stored as dtype;
 * gelu: its GeGLU form.  *mismatch counts the elements of h whose bits
 * differ from qk_gemv on the whole W followed by qk_swiglu (qk_geglu).
 * QERR_UNSUPPORTED where qk_gemv_ok refuses. */
int cuda_selftest_gemv_swiglu(int dtype, const float *x, const float *W, int n, int F, int K, int gelu, float *h,
                              size_t *mismatch);
/* qk_gemv_norm (swiglu 0; out y (n, N) float, poisoned first) or
 * qk_gemv_swiglu_norm (swiglu 1, or 2 for GeGLU; W (2N, K), out h (n, N)
 * stored as dtype):
 * x (n, K), the residual rows, and W rounded to dtype; rows_per_warp -1:
 * their tensor-core forms (qk_gemv_mma_norm, qk_gemv_mma_swiglu_norm).
 * QERR_UNSUPPORTED where qk_gemv_ok (qk_gemv_mma_ok) refuses the shape. */
int cuda_selftest_gemv_norm(int dtype, const float *x, const float *W, int n, int N, int K, float eps, int swiglu,
                            int rows_per_warp, float *out);
/* qk_scale_cols: W (N, K) rounded to dtype, times g (K) per column; out
 * (N, K) the stored result as floats. */
int cuda_selftest_scale_cols(int dtype, const float *W, const float *g, int N, int K, float *out);
/* qk_fill_uniform: n elements of dtype from seed, returned as floats. */
int cuda_selftest_fill_uniform(int dtype, size_t n, uint64_t seed, float lo, float hi, float *out);
/* qk_convert on raw storage: src holds n elements of src_dtype (float, or
 * uint16_t bits for bf16 / f16), dst receives n elements of dst_dtype. */
int cuda_selftest_convert(int dst_dtype, int src_dtype, const void *src, size_t n, void *dst);

#endif
