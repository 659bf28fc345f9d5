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
    float *dx = (float *)upload(x, sizeof(float) * (size_t)n_x * D), *dw = (float *)upload(w, sizeof(float) * D);
    int32_t *dr = rows ? (int32_t *)upload(rows, sizeof(int32_t) * (size_t)n) : NULL;
    T *dy = poisoned<T>((size_t)n * D);
    int rc = dx && dw && dy && (dr || !rows) ? 0 : QERR_DEVICE;
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

template <typename T> static int rope_store_t(const cuda_rope_case *c, float *q, float *kc, float *vc)
{
    const int W = (c->H + 2 * c->KV) * c->hd;
    const size_t cache_n = (size_t)c->num_blocks * c->KV * c->bs * c->hd, q_n = (size_t)c->n_tok * c->H * c->hd;
    float *dqkv = (float *)upload(c->qkv, sizeof(float) * (size_t)c->n_tok * W);
    float *dbias = c->bias ? (float *)upload(c->bias, sizeof(float) * W) : NULL;
    float *dfreq = (float *)upload(c->inv_freq, sizeof(float) * (size_t)(c->rope_dim / 2));
    // Metadata in one array: pos, seq, seq_info, tables.
    const size_t off_seq = c->n_tok, off_info = off_seq + c->n_tok, off_tab = off_info + 2 * (size_t)c->n_seqs,
                 total = off_tab + c->n_table;
    int32_t *meta = (int32_t *)malloc(sizeof(int32_t) * total), *dmeta = NULL;
    if (meta) {
        memcpy(meta, c->pos, sizeof(int32_t) * c->n_tok);
        memcpy(meta + off_seq, c->seq, sizeof(int32_t) * c->n_tok);
        memcpy(meta + off_info, c->seq_info, sizeof(int32_t) * 2 * c->n_seqs);
        memcpy(meta + off_tab, c->tables, sizeof(int32_t) * c->n_table);
        dmeta = (int32_t *)upload(meta, sizeof(int32_t) * total);
    }
    T *dq = poisoned<T>(q_n), *dk = poisoned<T>(cache_n), *dv = poisoned<T>(cache_n);
    int rc = dqkv && (dbias || !c->bias) && dfreq && dmeta && dq && dk && dv ? 0 : QERR_DEVICE;
    if (!rc) {
        const qattn_geom g =
            qk_geom(dmeta, dmeta + off_seq, dmeta + off_info, dmeta + off_tab, c->H, c->KV, c->hd, c->bs);
        rc = sync_rc(qk_rope_store<T>(0, dqkv, dbias, dq, dk, dv, dfreq, &g, c->n_tok, c->rope_dim, c->neox));
    }
    if (!rc) rc = to_host<T>(q, dq, q_n);
    if (!rc) rc = to_host<T>(kc, dk, cache_n);
    if (!rc) rc = to_host<T>(vc, dv, cache_n);
    free(meta);
    cudaFree(dqkv);
    cudaFree(dbias);
    cudaFree(dfreq);
    cudaFree(dmeta);
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
