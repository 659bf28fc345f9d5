// cuda_selftest_ops.cu - runs the backend's non-attention kernels (embedding
// gather, RMSNorm, RoPE/store, SwiGLU, the small-batch projection, the
// uniform fill and the conversions) once on host data, for
// tests/gpu/test_gpu_ops.c, which holds their CPU references.
//
// Each wrapper uploads host floats, rounds them to the storage type on the
// device, poisons every output with 0xff bytes (NaN in each storage type),
// runs the launcher on stream 0, synchronises and downloads the outputs as
// floats.  Inputs the kernels read as float (RMSNorm's x and w, RoPE's qkv,
// bias and frequencies, SwiGLU's gate/up) are uploaded unrounded.
#include <stdlib.h>
#include <string.h>

#include "cuda_selftest.cuh"

extern "C" {
#include "cuda_info.h"
}

// Calls fn<T>(args...) for the storage type named by dt.
#define BY_DTYPE(dt, fn, ...)                                                                                          \
    ((dt) == QDT_F32 ? fn<float>(__VA_ARGS__)                                                                         \
     : (dt) == QDT_BF16 ? fn<bf16>(__VA_ARGS__)                                                                        \
     : (dt) == QDT_F16  ? fn<__half>(__VA_ARGS__)                                                                      \
                        : QERR_INVAL)

static int sync_rc(int rc) { return !rc && cudaDeviceSynchronize() != cudaSuccess ? QERR_DEVICE : rc; }

template <typename T> static int embed_t(const float *emb, int V, int D, const int32_t *tok, int n, float *x)
{
    T *e = to_device<T>(emb, (size_t)V * D);
    int32_t *dt = (int32_t *)upload(tok, sizeof(int32_t) * (size_t)n);
    float *dx = poisoned<float>((size_t)n * D);
    int rc = e && dt && dx ? 0 : QERR_DEVICE;
    if (!rc) rc = sync_rc(qk_embed<T>(0, dx, e, dt, n, D));
    if (!rc && cudaMemcpy(x, dx, sizeof(float) * (size_t)n * D, cudaMemcpyDeviceToHost) != cudaSuccess)
        rc = QERR_DEVICE;
    cudaFree(e);
    cudaFree(dt);
    cudaFree(dx);
    return rc;
}

extern "C" int cuda_selftest_embed(int dtype, const float *emb, int V, int D, const int32_t *tok, int n, float *x)
{
    if (V <= 0 || D <= 0 || n <= 0) return QERR_INVAL;
    return BY_DTYPE(dtype, embed_t, emb, V, D, tok, n, x);
}

template <typename T>
static int rmsnorm_t(const float *x, int n_x, const float *w, int n, int D, float eps, const int32_t *rows, float *y)
{
    float *dx = (float *)upload(x, sizeof(float) * (size_t)n_x * D),
          *dw = w ? (float *)upload(w, sizeof(float) * D) : NULL;
    int32_t *dr = rows ? (int32_t *)upload(rows, sizeof(int32_t) * (size_t)n) : NULL;
    T *dy = poisoned<T>((size_t)n * D);
    int rc = dx && (dw || !w) && dy && (dr || !rows) ? 0 : QERR_DEVICE;
    if (!rc) rc = sync_rc(qk_rmsnorm<T>(0, dy, dx, dw, n, D, eps, dr));
    if (!rc) rc = to_host<T>(y, dy, (size_t)n * D);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dr);
    cudaFree(dy);
    return rc;
}

extern "C" int cuda_selftest_rmsnorm(int dtype, const float *x, int n_x, const float *w, int n, int D, float eps,
                                     const int32_t *rows, float *y)
{
    if (n <= 0 || D <= 0 || (!rows && n_x != n)) return QERR_INVAL;
    return BY_DTYPE(dtype, rmsnorm_t, x, n_x, w, n, D, eps, rows, y);
}

template <typename T> static int swiglu_t(const float *gu, int n, int F, float *h)
{
    float *dgu = (float *)upload(gu, sizeof(float) * 2 * (size_t)n * F);
    T *dh = poisoned<T>((size_t)n * F);
    int rc = dgu && dh ? 0 : QERR_DEVICE;
    if (!rc) rc = sync_rc(qk_swiglu<T>(0, dh, dgu, n, F));
    if (!rc) rc = to_host<T>(h, dh, (size_t)n * F);
    cudaFree(dgu);
    cudaFree(dh);
    return rc;
}

extern "C" int cuda_selftest_swiglu(int dtype, const float *gu, int n, int F, float *h)
{
    if (n <= 0 || F <= 0) return QERR_INVAL;
    return BY_DTYPE(dtype, swiglu_t, gu, n, F, h);
}

// A rope case's inputs on the device: the raw projections, the bias (or
// NULL), the inverse frequencies (NULL for rope_dim 0), QK-norm's weights
// (or NULL), and the metadata in one array (pos, seq, seq_info, tables,
// then the token list 0 .. n_tok-1) with its geometry.
typedef struct {
    float *qkv, *bias, *freq, *qn, *kn;
    int32_t *meta;
    const int32_t *list;
    qattn_geom g;
} rope_dev;

static void rope_dev_free(rope_dev *d)
{
    cudaFree(d->qkv);
    cudaFree(d->bias);
    cudaFree(d->freq);
    cudaFree(d->qn);
    cudaFree(d->kn);
    cudaFree(d->meta);
}

static int rope_dev_upload(const cuda_rope_case *c, rope_dev *d)
{
    const int W = (c->H + 2 * c->KV) * c->hd;
    const size_t off_seq = c->n_tok, off_info = off_seq + c->n_tok, off_tab = off_info + 2 * (size_t)c->n_seqs,
                 off_list = off_tab + c->n_table, total = off_list + c->n_tok;
    memset(d, 0, sizeof *d);
    d->qkv = (float *)upload(c->qkv, sizeof(float) * (size_t)c->n_tok * W);
    d->bias = c->bias ? (float *)upload(c->bias, sizeof(float) * W) : NULL;
    d->freq = c->rope_dim ? (float *)upload(c->inv_freq, sizeof(float) * (size_t)(c->rope_dim / 2)) : NULL;
    d->qn = c->qn ? (float *)upload(c->qn, sizeof(float) * c->hd) : NULL;
    d->kn = c->kn ? (float *)upload(c->kn, sizeof(float) * c->hd) : NULL;
    int32_t *meta = (int32_t *)malloc(sizeof(int32_t) * total);
    if (meta) {
        memcpy(meta, c->pos, sizeof(int32_t) * c->n_tok);
        memcpy(meta + off_seq, c->seq, sizeof(int32_t) * c->n_tok);
        memcpy(meta + off_info, c->seq_info, sizeof(int32_t) * 2 * c->n_seqs);
        memcpy(meta + off_tab, c->tables, sizeof(int32_t) * c->n_table);
        for (int i = 0; i < c->n_tok; i++) meta[off_list + i] = i;
        d->meta = (int32_t *)upload(meta, sizeof(int32_t) * total);
        free(meta);
    }
    if (!d->qkv || (c->bias && !d->bias) || (c->rope_dim && !d->freq) || (c->qn && !d->qn) || (c->kn && !d->kn) ||
        !d->meta) {
        rope_dev_free(d);
        return QERR_DEVICE;
    }
    d->list = d->meta + off_list;
    d->g = qk_geom(d->meta, d->meta + off_seq, d->meta + off_info, d->meta + off_tab, c->H, c->KV, c->hd, c->bs);
    return 0;
}

template <typename T> static int rope_store_t(const cuda_rope_case *c, float *q, float *kc, float *vc)
{
    const size_t cache_n = (size_t)c->num_blocks * c->KV * c->bs * c->hd, q_n = (size_t)c->n_tok * c->H * c->hd;
    rope_dev d;
    int rc = rope_dev_upload(c, &d);
    if (rc) return rc;
    T *dq = poisoned<T>(q_n), *dk = poisoned<T>(cache_n), *dv = poisoned<T>(cache_n);
    if (!dq || !dk || !dv) rc = QERR_DEVICE;
    if (!rc)
        rc = sync_rc(qk_rope_store<T>(0, d.qkv, d.bias, dq, dk, dv, d.freq, &d.g, c->n_tok, c->rope_dim, c->neox, d.qn,
                                      d.kn, c->eps));
    if (!rc) rc = to_host<T>(q, dq, q_n);
    if (!rc) rc = to_host<T>(kc, dk, cache_n);
    if (!rc) rc = to_host<T>(vc, dv, cache_n);
    rope_dev_free(&d);
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dv);
    return rc;
}

extern "C" int cuda_selftest_rope_store(const cuda_rope_case *c, float *q, float *kc, float *vc)
{
    if (c->n_tok <= 0 || c->rope_dim <= 0 || c->rope_dim > c->hd || c->rope_dim % 2) return QERR_INVAL;
    return BY_DTYPE(c->dtype, rope_store_t, c, q, kc, vc);
}

// How many of the n elements of T at a and b (device memory) differ in their bits.
template <typename T> static size_t bits_differ(const T *a, const T *b, size_t n)
{
    T *ha = (T *)malloc(n * sizeof(T)), *hb = (T *)malloc(n * sizeof(T));
    size_t bad = n;
    if (ha && hb && cudaMemcpy(ha, a, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(hb, b, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess) {
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += memcmp(ha + i, hb + i, sizeof(T)) != 0;
    }
    free(ha);
    free(hb);
    return bad;
}

template <typename T>
static int attn_rope_t(const cuda_rope_case *c, const float *kc0, const float *vc0, int n_split, int split_len,
                       float *out, size_t *mismatch)
{
    const size_t cache_n = (size_t)c->num_blocks * c->KV * c->bs * c->hd, q_n = (size_t)c->n_tok * c->H * c->hd;
    const size_t slots = (size_t)c->n_tok * c->H * n_split;
    rope_dev d;
    int rc = rope_dev_upload(c, &d);
    if (rc) return rc;
    // Two copies of the caches: one for each form.
    T *kr = to_device<T>(kc0, cache_n), *vr = to_device<T>(vc0, cache_n), *kf = to_device<T>(kc0, cache_n),
      *vf = to_device<T>(vc0, cache_n), *dq = poisoned<T>(q_n), *or_ = poisoned<T>(q_n), *of = poisoned<T>(q_n);
    float *pa = NULL, *pm = NULL;
    int *pc = NULL;
    if (!kr || !vr || !kf || !vf || !dq || !or_ || !of) rc = QERR_DEVICE;
    if (!rc && (cudaMalloc(&pa, slots * c->hd * 4) != cudaSuccess || cudaMalloc(&pm, slots * 8) != cudaSuccess ||
                cudaMalloc(&pc, slots * 4) != cudaSuccess || cudaMemset(pc, 0, slots * 4) != cudaSuccess))
        rc = QERR_DEVICE;
    if (!rc) {
        const qk_rope_in rope = { d.qkv, d.bias, d.freq, c->rope_dim, c->neox, 0.0f, d.qn, d.kn, c->eps };
        rc = sync_rc(qk_rope_store<T>(0, d.qkv, d.bias, dq, kr, vr, d.freq, &d.g, c->n_tok, c->rope_dim, c->neox, d.qn,
                                      d.kn, c->eps));
        if (!rc)
            rc = sync_rc(qk_attn_decode<T>(0, dq, kr, vr, &d.g, NULL, d.list, c->n_tok, n_split, split_len, pa, pm, pc,
                                           or_));
        if (!rc)
            rc = sync_rc(qk_attn_decode<T>(0, NULL, kf, vf, &d.g, &rope, d.list, c->n_tok, n_split, split_len, pa, pm,
                                           pc, of));
    }
    if (!rc) {
        *mismatch = bits_differ<T>(or_, of, q_n) + bits_differ<T>(kr, kf, cache_n) + bits_differ<T>(vr, vf, cache_n);
        rc = to_host<T>(out, of, q_n);
    }
    rope_dev_free(&d);
    void *bufs[] = { kr, vr, kf, vf, dq, or_, of, pa, pm, pc };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    return rc;
}

extern "C" int cuda_selftest_attn_rope(const cuda_rope_case *c, const float *kc0, const float *vc0, int n_split,
                                       int split_len, float *out, size_t *mismatch)
{
    if (c->n_tok <= 0 || c->rope_dim < 0 || c->rope_dim > c->hd || c->rope_dim % 2 || n_split < 1 || !c->qn != !c->kn)
        return QERR_INVAL;
    for (int i = 0; i < c->n_tok; i++)
        if (c->seq[i] != i) return QERR_INVAL; // one token a sequence
    return BY_DTYPE(c->dtype, attn_rope_t, c, kc0, vc0, n_split, split_len, out, mismatch);
}

template <typename T>
static int gemv_t(const float *x, const float *W, int n, int N, int K, float beta, const float *y0, int rows_per_warp,
                  float *y)
{
    T *dx = to_device<T>(x, (size_t)n * K), *dW = to_device<T>(W, (size_t)N * K);
    const size_t yn = (size_t)n * N;
    // beta 0: y is output only and is poisoned; otherwise it is read too.
    float *dy = beta != 0.0f ? (float *)upload(y0, sizeof(float) * yn) : poisoned<float>(yn);
    int rc = dx && dW && dy ? 0 : QERR_DEVICE;
    if (!rc) rc = sync_rc(qk_gemv<T>(0, dy, dx, dW, n, N, K, beta, rows_per_warp));
    if (!rc && cudaMemcpy(y, dy, sizeof(float) * yn, cudaMemcpyDeviceToHost) != cudaSuccess) rc = QERR_DEVICE;
    cudaFree(dx);
    cudaFree(dW);
    cudaFree(dy);
    return rc;
}

extern "C" int cuda_selftest_gemv(int dtype, const float *x, const float *W, int n, int N, int K, float beta,
                                  const float *y0, int rows_per_warp, float *y)
{
    if (!qk_gemv_ok((int)qdt_size(dtype), n, K) || N <= 0) return QERR_UNSUPPORTED;
    if (beta != 0.0f && !y0) return QERR_INVAL;
    return BY_DTYPE(dtype, gemv_t, x, W, n, N, K, beta, y0, rows_per_warp, y);
}

template <typename T>
static int gemv_mma_t(const float *x, const float *W, int n, int N, int K, float beta, const float *y0, int variant,
                      float *y, float *yc)
{
    T *dx = to_device<T>(x, (size_t)n * K), *dW = to_device<T>(W, (size_t)N * K);
    const size_t yn = (size_t)n * N;
    float *dy = beta != 0.0f ? (float *)upload(y0, sizeof(float) * yn) : poisoned<float>(yn);
    T *dyc = yc ? poisoned<T>(yn) : NULL;
    int rc = dx && dW && dy && (!yc || dyc) ? 0 : QERR_DEVICE;
    if (!rc) rc = sync_rc(qk_gemv_mma<T>(0, dy, dx, dW, n, N, K, beta, dyc, variant));
    if (!rc && cudaMemcpy(y, dy, sizeof(float) * yn, cudaMemcpyDeviceToHost) != cudaSuccess) rc = QERR_DEVICE;
    if (!rc && yc) rc = to_host<T>(yc, dyc, yn);
    cudaFree(dx);
    cudaFree(dW);
    cudaFree(dy);
    cudaFree(dyc);
    return rc;
}

extern "C" int cuda_selftest_gemv_mma(int dtype, const float *x, const float *W, int n, int N, int K, float beta,
                                      const float *y0, int variant, float *y, float *yc)
{
    if (!qk_gemv_mma_ok((int)qdt_size(dtype), n, K) || N <= 0) return QERR_UNSUPPORTED;
    if (beta != 0.0f && !y0) return QERR_INVAL;
    return BY_DTYPE(dtype, gemv_mma_t, x, W, n, N, K, beta, y0, variant, y, yc);
}

template <typename T>
static int gemv_swiglu_t(const float *x, const float *W, int n, int F, int K, int gelu, float *h, size_t *mismatch)
{
    const size_t hn = (size_t)n * F;
    T *dx = to_device<T>(x, (size_t)n * K), *dW = to_device<T>(W, (size_t)2 * F * K), *dh = poisoned<T>(hn),
      *dh2 = poisoned<T>(hn);
    float *dgu = poisoned<float>(2 * hn);
    int rc = dx && dW && dh && dh2 && dgu ? 0 : QERR_DEVICE;
    if (!rc) rc = sync_rc(qk_gemv_swiglu<T>(0, dh, dx, dW, n, F, K, gelu));
    if (!rc) rc = sync_rc(qk_gemv<T>(0, dgu, dx, dW, n, 2 * F, K, 0.0f, 1));
    if (!rc) rc = sync_rc(gelu ? qk_geglu<T>(0, dh2, dgu, n, F) : qk_swiglu<T>(0, dh2, dgu, n, F));
    if (!rc) {
        *mismatch = bits_differ<T>(dh, dh2, hn);
        rc = to_host<T>(h, dh, hn);
    }
    void *bufs[] = { dx, dW, dh, dh2, dgu };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    return rc;
}

extern "C" int cuda_selftest_gemv_swiglu(int dtype, const float *x, const float *W, int n, int F, int K, int gelu,
                                         float *h, size_t *mismatch)
{
    if (!qk_gemv_ok((int)qdt_size(dtype), n, K) || F <= 0) return QERR_UNSUPPORTED;
    return BY_DTYPE(dtype, gemv_swiglu_t, x, W, n, F, K, gelu, h, mismatch);
}

template <typename T>
static int gemv_norm_t(const float *x, const float *W, int n, int N, int K, float eps, int swiglu, int rows_per_warp,
                       float *out)
{
    const size_t on = (size_t)n * N;
    float *dy = swiglu ? NULL : poisoned<float>(on);
    T *dx = to_device<T>(x, (size_t)n * K), *dW = to_device<T>(W, (size_t)(swiglu ? 2 : 1) * N * K),
      *dh = swiglu ? poisoned<T>(on) : NULL;
    int rc = dx && dW && (dy || dh) ? 0 : QERR_DEVICE;
    if (!rc && rows_per_warp < 0) // the tensor-core kernel
        rc = sync_rc(swiglu ? qk_gemv_mma_swiglu_norm<T>(0, dh, dx, dW, n, N, K, eps, swiglu == 2)
                            : qk_gemv_mma_norm<T>(0, dy, dx, dW, n, N, K, eps));
    else if (!rc)
        rc = sync_rc(swiglu ? qk_gemv_swiglu_norm<T>(0, dh, dx, dW, n, N, K, eps, swiglu == 2)
                            : qk_gemv_norm<T>(0, dy, dx, dW, n, N, K, eps, rows_per_warp));
    if (!rc && swiglu) rc = to_host<T>(out, dh, on);
    if (!rc && !swiglu && cudaMemcpy(out, dy, sizeof(float) * on, cudaMemcpyDeviceToHost) != cudaSuccess)
        rc = QERR_DEVICE;
    void *bufs[] = { dx, dy, dW, dh };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    return rc;
}

extern "C" int cuda_selftest_gemv_norm(int dtype, const float *x, const float *W, int n, int N, int K, float eps,
                                       int swiglu, int rows_per_warp, float *out)
{
    const int eb = (int)qdt_size(dtype);
    if (!(rows_per_warp < 0 ? qk_gemv_mma_ok(eb, n, K) : qk_gemv_ok(eb, n, K)) || N <= 0) return QERR_UNSUPPORTED;
    return BY_DTYPE(dtype, gemv_norm_t, x, W, n, N, K, eps, swiglu, rows_per_warp, out);
}

template <typename T> static int scale_cols_t(const float *W, const float *g, int N, int K, float *out)
{
    T *dW = to_device<T>(W, (size_t)N * K);
    float *dg = (float *)upload(g, sizeof(float) * K);
    int rc = dW && dg ? sync_rc(qk_scale_cols<T>(0, dW, dg, N, K)) : QERR_DEVICE;
    if (!rc) rc = to_host<T>(out, dW, (size_t)N * K);
    cudaFree(dW);
    cudaFree(dg);
    return rc;
}

extern "C" int cuda_selftest_scale_cols(int dtype, const float *W, const float *g, int N, int K, float *out)
{
    if (N <= 0 || K <= 0) return QERR_INVAL;
    return BY_DTYPE(dtype, scale_cols_t, W, g, N, K, out);
}

template <typename T> static int fill_t(size_t n, uint64_t seed, float lo, float hi, float *out)
{
    T *d = poisoned<T>(n);
    int rc = d ? sync_rc(qk_fill_uniform<T>(0, d, n, seed, lo, hi)) : QERR_DEVICE;
    if (!rc) rc = to_host<T>(out, d, n);
    cudaFree(d);
    return rc;
}

extern "C" int cuda_selftest_fill_uniform(int dtype, size_t n, uint64_t seed, float lo, float hi, float *out)
{
    if (!n) return QERR_INVAL;
    return BY_DTYPE(dtype, fill_t, n, seed, lo, hi, out);
}

// Raw storage in and out: no other conversion takes part.
template <typename T, typename S> static int convert_ts(const void *src, size_t n, void *dst)
{
    S *ds = (S *)upload(src, sizeof(S) * n);
    T *dd = poisoned<T>(n);
    int rc = ds && dd ? 0 : QERR_DEVICE;
    if (!rc) rc = sync_rc(qk_convert<T, S>(0, dd, ds, n));
    if (!rc && cudaMemcpy(dst, dd, sizeof(T) * n, cudaMemcpyDeviceToHost) != cudaSuccess) rc = QERR_DEVICE;
    cudaFree(ds);
    cudaFree(dd);
    return rc;
}

template <typename T> static int convert_t(int src_dtype, const void *src, size_t n, void *dst)
{
    if (src_dtype == QDT_F32) return convert_ts<T, float>(src, n, dst);
    if (src_dtype == QDT_BF16) return convert_ts<T, bf16>(src, n, dst);
    if (src_dtype == QDT_F16) return convert_ts<T, __half>(src, n, dst);
    return QERR_INVAL;
}

extern "C" int cuda_selftest_convert(int dst_dtype, int src_dtype, const void *src, size_t n, void *dst)
{
    if (!n) return QERR_INVAL;
    return BY_DTYPE(dst_dtype, convert_t, src_dtype, src, n, dst);
}
