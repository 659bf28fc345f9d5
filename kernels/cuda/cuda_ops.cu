// cuda_ops.cu - the CUDA backend's small kernels: embedding gather, RMSNorm
// (to the storage type the next projection reads), RoPE fused with the bias
// add and the store of K and V into the paged cache, SwiGLU, and the fills
// and conversions used when weights are uploaded or made up.  Each mirrors a
// step of the CPU backend (kernels/cpu/cpu_backend.c); tests/gpu/test_gpu_ops.c
// compares each with a CPU reference.
#include "cuda_kernels.cuh"

int qk_pdl = 1;
int qk_gemv_split = 2;
int qk_gemv_preload = 3;
#define GEMV_PRE 4 // steps of weights a warp loads before the kernel waits (qk_gemv_preload)

template <typename T>
__global__ void embed_kernel(float *x, T *xc, const T *emb, const int32_t *tok, int D, float scale)
{
    pdl_wait();
    const T *row = emb + (size_t)tok[blockIdx.x] * D;
    float *out = x + (size_t)blockIdx.x * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = scale != 0.0f ? tof(row[i]) * scale : tof(row[i]);
        out[i] = v;
        if (xc) xc[(size_t)blockIdx.x * D + i] = fromf<T>(v);
    }
}

template <typename T>
int qk_embed(cudaStream_t st, float *x, const T *emb, const int32_t *tok, int n, int D, T *xc, float scale)
{
    if (n <= 0) return 0;
    qk_launch(embed_kernel<T>, n, 256, 0, st, x, xc, emb, tok, D, scale);
    CK_LAUNCH("embed");
    return 0;
}

// 1 / rms of a row of D floats, for one block: the sum of squares in
// double, as the CPU backend does (every thread gets the same value).
__device__ float row_rms_scale(const float *xr, int D, float eps)
{
    __shared__ double red[32];
    double s = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) s += (double)xr[i] * xr[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        double v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    return (float)(1.0 / sqrt(red[0] / D + eps));
}

// One block per row.
template <typename T>
__global__ void rmsnorm_kernel(T *y, const float *x, const float *w, int D, float eps, const int32_t *rows)
{
    pdl_wait();
    const int r = rows ? rows[blockIdx.x] : blockIdx.x;
    const float *xr = x + (size_t)r * D;
    const float scale = row_rms_scale(xr, D, eps);
    T *yr = y + (size_t)blockIdx.x * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) yr[i] = fromf<T>(w ? (xr[i] * scale) * w[i] : xr[i] * scale);
}

template <typename T>
int qk_rmsnorm(cudaStream_t st, T *y, const float *x, const float *w, int n, int D, float eps, const int32_t *rows)
{
    if (n <= 0) return 0;
    // Enough threads that each reads about four elements: a lone decode row
    // is then one round trip to memory, not several.
    int threads = ((D / 4 + 31) / 32) * 32;
    threads = threads < 64 ? 64 : threads > 1024 ? 1024 : threads;
    qk_launch(rmsnorm_kernel<T>, n, threads, 0, st, y, x, w, D, eps, rows);
    CK_LAUNCH("rmsnorm");
    return 0;
}

// One block per token.  The rotation is computed in float from the same
// inverse frequencies as the CPU; angles use the precise sincosf.
template <typename T>
__global__ void rope_store_kernel(const float *qkv, const float *bias, T *q_out, T *kc, T *vc, const float *inv_freq,
                                  qattn_geom g, int rope_dim, int neox, const float *qn, const float *kn, float eps)
{
    pdl_wait();
    extern __shared__ float row[]; // (H + 2 KV) * hd
    __shared__ float hscale[512];  // QK-norm: each q and k head's 1 / rms
    const int t = blockIdx.x, p = g.pos[t], half = rope_dim / 2;
    const int W = (g.H + 2 * g.KV) * g.hd;
    const float *src = qkv + (size_t)t * W;
    for (int i = threadIdx.x; i < W; i += blockDim.x) row[i] = src[i] + (bias ? bias[i] : 0.0f);
    __syncthreads();
    if (qn) {
        // QK-norm as the CPU's rmsnorm: a warp per head, the squares summed in double.
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int h = warp; h < g.H + g.KV; h += nw) {
            double s = 0;
            for (int i = lane; i < g.hd; i += 32) s += (double)row[h * g.hd + i] * row[h * g.hd + i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0) hscale[h] = (float)(1.0 / sqrt(s / g.hd + eps));
        }
        __syncthreads();
        for (int i = threadIdx.x; i < (g.H + g.KV) * g.hd; i += blockDim.x) {
            const int h = i / g.hd, d = i % g.hd;
            row[i] = (row[i] * hscale[h]) * (h < g.H ? qn[d] : kn[d]);
        }
        __syncthreads();
    }
    for (int idx = threadIdx.x; idx < (g.H + g.KV) * half; idx += blockDim.x) {
        const int h = idx / half, i = idx % half;
        float *base = row + (size_t)h * g.hd;
        qk_rotate(base + (neox ? i : 2 * i), base + (neox ? i + half : 2 * i + 1), p, inv_freq[i], g.rope_mscale);
    }
    __syncthreads();
    const int qd = g.H * g.hd, kvd = g.KV * g.hd;
    for (int i = threadIdx.x; i < qd; i += blockDim.x) q_out[(size_t)t * qd + i] = fromf<T>(row[i]);
    const int32_t *tab = g.tables + g.seq_info[2 * g.seq[t]];
    const size_t blk = (size_t)tab[p / g.bs] * g.block_elems;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        const int h = i / g.hd, d = i % g.hd;
        const size_t off = blk + ((size_t)h * g.bs + p % g.bs) * g.hd + d;
        kc[off] = fromf<T>(row[qd + i]);
        vc[off] = fromf<T>(row[qd + kvd + i]);
    }
}

template <typename T>
int qk_rope_store(cudaStream_t st, const float *qkv, const float *bias, T *q_out, T *kc, T *vc, const float *inv_freq,
                  const qattn_geom *g, int n, int rope_dim, int neox, const float *qn, const float *kn, float eps)
{
    if (n <= 0) return 0;
    size_t sh = sizeof(float) * (size_t)(g->H + 2 * g->KV) * g->hd;
    if (sh > 44 * 1024 || (qn && g->H + g->KV > 512)) return QERR_UNSUPPORTED;
    // Few tokens (decode): many threads per token, so each moves a few values.
    const int threads = n <= 16 ? 1024 : 256;
    qk_launch(rope_store_kernel<T>, n, threads, sh, st, qkv, bias, q_out, kc, vc, inv_freq, *g, rope_dim, neox, qn, kn,
              eps);
    CK_LAUNCH("rope_store");
    return 0;
}

// h = act(gate) * up, the gate and up halves of each token's gu row: SiLU
// (SwiGLU) or the tanh-approximated GELU (GeGLU), by qk_glu.
template <typename T, bool GELU> __global__ void glu_kernel(T *h, const float *gu, int F, size_t total)
{
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t t = i / F, j = i % F;
    h[i] = fromf<T>(qk_glu(gu[t * 2 * F + j], gu[t * 2 * F + F + j], GELU));
}

template <typename T, bool GELU> static int glu(cudaStream_t st, T *h, const float *gu, int n, int F)
{
    size_t total = (size_t)n * F;
    if (!total) return 0;
    qk_launch(glu_kernel<T, GELU>, (unsigned)((total + 255) / 256), 256, 0, st, h, gu, F, total);
    CK_LAUNCH(GELU ? "geglu" : "swiglu");
    return 0;
}

template <typename T> int qk_swiglu(cudaStream_t st, T *h, const float *gu, int n, int F) { return glu<T, false>(st, h, gu, n, F); }
template <typename T> int qk_geglu(cudaStream_t st, T *h, const float *gu, int n, int F) { return glu<T, true>(st, h, gu, n, F); }

__global__ void map_kernel(float *x, size_t n, int op, float a)
{
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    x[i] = op == QK_MAP_SOFTCAP ? a * tanhf(v / a) : v + a;
}

int qk_map(cudaStream_t st, float *x, size_t n, int op, float a)
{
    if (!n) return 0;
    qk_launch(map_kernel, (unsigned)((n + 255) / 256), 256, 0, st, x, n, op, a);
    CK_LAUNCH("map");
    return 0;
}

// One block per row, as rmsnorm_kernel: x += y / rms(y) * w (and xc = x in T).
template <typename T> __global__ void rmsnorm_add_kernel(float *x, const float *y, const float *w, int D, float eps, T *xc)
{
    pdl_wait();
    const float *yr = y + (size_t)blockIdx.x * D;
    const float scale = row_rms_scale(yr, D, eps);
    float *xr = x + (size_t)blockIdx.x * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        xr[i] += (yr[i] * scale) * w[i];
        if (xc) xc[(size_t)blockIdx.x * D + i] = fromf<T>(xr[i]);
    }
}

template <typename T>
int qk_rmsnorm_add(cudaStream_t st, float *x, const float *y, const float *w, int n, int D, float eps, T *xc)
{
    if (n <= 0) return 0;
    int threads = ((D / 4 + 31) / 32) * 32;
    threads = threads < 64 ? 64 : threads > 1024 ? 1024 : threads;
    qk_launch(rmsnorm_add_kernel<T>, n, threads, 0, st, x, y, w, D, eps, xc);
    CK_LAUNCH("rmsnorm_add");
    return 0;
}

__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

template <typename T> __global__ void fill_kernel(T *p, size_t n, uint64_t seed, float lo, float hi)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float u = (float)(mix64(seed + 0x9e3779b97f4a7c15ULL * (i + 1)) >> 40) * (1.0f / 16777216.0f);
        p[i] = fromf<T>(lo + (hi - lo) * u);
    }
}

template <typename T> int qk_fill_uniform(cudaStream_t st, T *p, size_t n, uint64_t seed, float lo, float hi)
{
    if (!n) return 0;
    fill_kernel<T><<<1024, 256, 0, st>>>(p, n, seed, lo, hi);
    CK_LAUNCH("fill_uniform");
    return 0;
}

template <typename T, typename S> __global__ void convert_kernel(T *dst, const S *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = fromf<T>(tof(src[i]));
}

template <typename T, typename S> int qk_convert(cudaStream_t st, T *dst, const S *src, size_t n)
{
    if (!n) return 0;
    convert_kernel<T, S><<<1024, 256, 0, st>>>(dst, src, n);
    CK_LAUNCH("convert");
    return 0;
}

// W (N, K) *= g (K) column by column, rounded to T once: a norm's weights
// folded into the projection after it.
template <typename T> __global__ void scale_cols_kernel(T *W, const float *g, size_t n, int K)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        W[i] = fromf<T>(tof(W[i]) * g[i % K]);
}

template <typename T> int qk_scale_cols(cudaStream_t st, T *W, const float *g, int N, int K)
{
    if (N <= 0 || K <= 0) return 0;
    scale_cols_kernel<T><<<1024, 256, 0, st>>>(W, g, (size_t)N * K, K);
    CK_LAUNCH("scale_cols");
    return 0;
}

#define INST(T)                                                                                                        \
    template int qk_embed<T>(cudaStream_t, float *, const T *, const int32_t *, int, int, T *, float);                 \
    template int qk_rmsnorm_add<T>(cudaStream_t, float *, const float *, const float *, int, int, float, T *);         \
    template int qk_rmsnorm<T>(cudaStream_t, T *, const float *, const float *, int, int, float, const int32_t *);     \
    template int qk_rope_store<T>(cudaStream_t, const float *, const float *, T *, T *, T *, const float *,            \
                                  const qattn_geom *, int, int, int, const float *, const float *, float);             \
    template int qk_swiglu<T>(cudaStream_t, T *, const float *, int, int);                                             \
    template int qk_geglu<T>(cudaStream_t, T *, const float *, int, int);                                              \
    template int qk_fill_uniform<T>(cudaStream_t, T *, size_t, uint64_t, float, float);                                \
    template int qk_scale_cols<T>(cudaStream_t, T *, const float *, int, int);                                         \
    template int qk_convert<T, float>(cudaStream_t, T *, const float *, size_t);                                       \
    template int qk_convert<T, bf16>(cudaStream_t, T *, const bf16 *, size_t);                                         \
    template int qk_convert<T, __half>(cudaStream_t, T *, const __half *, size_t);
INST(float)
INST(bf16)
INST(__half)

// ---- small-batch projections ------------------------------------------------------------
//
// y(n, N) = x(n, K) W(N, K)^T + beta y for n <= 8 tokens.  Decode is a
// stream over the weights: each warp reads R rows (1 for one token, 2 for
// more, so that x is loaded once for both) with 16-byte loads, several in
// flight, and keeps R x n sums; x (a few KB) comes from the L1/L2 caches.
// Every token's sums are formed in the same order whatever n and R are, so
// a sequence's result does not depend on what it is batched with.  On the
// H200 this streams the 1B and 8B projection shapes 5-80% faster than
// cuBLAS at one token (bench_gpu --gemv 1).
//
// SWI: the gate/up projection with SwiGLU applied on the way out.  W holds
// the N gate rows, then the N up rows; a warp takes gate row j and up row j
// (R = 2) and writes h[t][j] = silu(gate) * up as T - the sums formed as the
// plain kernel forms them, then qk_glu as glu_kernel applies it (gelu: GeGLU).
// Otherwise h, when given, receives a copy of y in T.
//
// NORM: the RMSNorm before the projection folded in (its weights already in
// W): x is the residual stream in T, each warp sums x^2 along with its
// products (in the same order whatever the batch), and the sums are scaled
// by 1 / sqrt(mean + eps).  This saves the norm kernel and its round trip
// between two projections, which at one token costs more than the sums.

template <typename T, int NT, int R, int S, bool SWI, bool NORM>
__global__ void __launch_bounds__(256) gemv_kernel(float *__restrict__ y, T *__restrict__ h, const T *__restrict__ x,
                                                   const T *__restrict__ W, int N, int K, float beta, float eps,
                                                   int gelu, int pre)
{
    static_assert(!SWI || R == 2, "a gate row and its up row");
    // S warps share each group of R rows, taking alternate 256-element
    // chunks of K; their sums meet in shared memory in a fixed order.
    constexpr int NQ = NORM ? NT : 0;
    __shared__ float other[8][R * NT + NQ];
    float ss[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) ss[t] = 0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % S;
    const int row0 = (blockIdx.x * (8 / S) + warp / S) * (SWI ? 1 : R);
    const bool live = row0 < N;
    const T *w[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        w[r] = SWI ? W + ((size_t)r * N + (live ? row0 : 0)) * K
                   : W + (size_t)(row0 + r < N ? row0 + r : (live ? row0 : 0)) * K;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0;
    // One step: the R rows' 8 weights at k (a) against every token's x.
    auto step = [&](const float (&a)[R][8], int k) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float xv[8];
            load_vec<T, 8>(x + (size_t)t * K + k, xv);
            if constexpr (NORM)
#pragma unroll
                for (int e = 0; e < 8; e++) ss[t] += xv[e] * xv[e];
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int e = 0; e < 8; e++) acc[r][t] += a[r][e] * xv[e];
        }
    };
    // pre: the weights of the warp's first GEMV_PRE steps (they do not
    // depend on the kernel before this one) are loaded before waiting for
    // it, and used after; the sums are formed in the same order either way.
    const int k0 = (part * 32 + lane) * 8;
    int kfrom = k0;
    uint4 pw[GEMV_PRE][R];
    if (pre & 1) {
#pragma unroll
        for (int u = 0; u < GEMV_PRE; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (live && k0 + u * 256 * S < K) pw[u][r] = ld_weights((const uint4 *)(w[r] + k0 + u * 256 * S));
    }
    pdl_wait();
    if (pre & 1) {
#pragma unroll
        for (int u = 0; u < GEMV_PRE; u++) {
            const int k = k0 + u * 256 * S;
            if (!live || k >= K) break;
            float a[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) unpack8<T>(pw[u][r], a[r]);
            step(a, k);
        }
        kfrom = k0 + GEMV_PRE * 256 * S;
    }
#pragma unroll 4
    for (int k = kfrom; live && k < K; k += 256 * S) {
        float a[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (pre & 2) unpack8<T>(ld_weights((const uint4 *)(w[r] + k)), a[r]);
            else load_vec<T, 8>(w[r] + k, a[r]);
        }
        step(a, k);
    }
    float v[R][NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
#pragma unroll
        for (int r = 0; r < R; r++) v[r][t] = warp_sum(acc[r][t]);
        if constexpr (NORM) ss[t] = warp_sum(ss[t]);
    }
    if (S > 1) {
        if (part != 0 && lane == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) {
#pragma unroll
                for (int r = 0; r < R; r++) other[warp][r * NT + t] = v[r][t];
                if constexpr (NORM) other[warp][R * NT + t] = ss[t];
            }
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int p = 1; p < S; p++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
#pragma unroll
                for (int r = 0; r < R; r++) v[r][t] += other[warp + p][r * NT + t];
                if constexpr (NORM) ss[t] += other[warp + p][R * NT + t];
            }
    }
    if constexpr (NORM) // x was the residual row itself: scale the sums by its 1 / rms
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float sc = 1.0f / sqrtf(ss[t] / (float)K + eps);
#pragma unroll
            for (int r = 0; r < R; r++) v[r][t] *= sc;
        }
    if (!live || lane != 0) return;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if constexpr (SWI) {
            const float gt = v[0][t], up = v[R - 1][t];
            h[(size_t)t * N + row0] = fromf<T>(qk_glu(gt, up, gelu));
        } else {
#pragma unroll
            for (int r = 0; r < R; r++)
                if (row0 + r < N) {
                    float *yp = y + (size_t)t * N + row0 + r;
                    *yp = beta != 0.0f ? v[r][t] + beta * *yp : v[r][t];
                    if (h) h[(size_t)t * N + row0 + r] = fromf<T>(*yp); // the copy in T
                }
        }
    }
}

bool qk_gemv_ok(int elem_bytes, int n, int K) { return elem_bytes == 2 && n >= 1 && n <= QK_GEMV_MAX && K % 8 == 0; }

template <typename T, int R, int S, bool SWI, bool NORM>
static int gemv_rows(cudaStream_t st, float *y, T *h, const T *x, const T *W, int n, int N, int K, float beta,
                     float eps, int gelu)
{
    const int rows_per_block = 8 / S * (SWI ? 1 : R);
    const dim3 grid((N + rows_per_block - 1) / rows_per_block), block(256);
#define GEMV_CASE(NT)                                                                                                  \
    case NT:                                                                                                           \
        qk_launch(gemv_kernel<T, NT, R, S, SWI, NORM>, grid, block, 0, st, y, h, x, W, N, K, beta, eps, gelu,          \
                  qk_gemv_preload);                                                                                    \
        break;
    switch (n) {
        GEMV_CASE(1)
        GEMV_CASE(2)
        GEMV_CASE(3)
        GEMV_CASE(4)
        GEMV_CASE(5)
        GEMV_CASE(6)
        GEMV_CASE(7)
        GEMV_CASE(8)
    default: return QERR_UNSUPPORTED;
    }
#undef GEMV_CASE
    CK_LAUNCH("gemv");
    return 0;
}

// K split over S warps: two for the small and middling matrices, whose
// rows are otherwise too few to keep enough loads in flight, and enough
// that no warp streams more than 2,048 elements of a row (its loads then
// go out together, not in rounds).  Chosen from the shape alone, so a
// token's sums never depend on the batch.  qk_gemv_split (QUIRE_CUDA_GEMV_SPLIT):
// 0 never splits, 1 only the first rule, 2 (the default) both.
static int gemv_split(int N, int K)
{
    int S = qk_gemv_split && K >= 2048 && N <= 8192 ? 2 : 1;
    while (qk_gemv_split >= 2 && S < 8 && K > 2048 * S) S *= 2;
    return S;
}

template <typename T, int R, bool SWI, bool NORM>
static int gemv_split_rows(cudaStream_t st, float *y, T *h, const T *x, const T *W, int n, int N, int K, float beta,
                           int S, float eps, int gelu = 0)
{
    switch (S) {
    case 1: return gemv_rows<T, R, 1, SWI, NORM>(st, y, h, x, W, n, N, K, beta, eps, gelu);
    case 2: return gemv_rows<T, R, 2, SWI, NORM>(st, y, h, x, W, n, N, K, beta, eps, gelu);
    case 4: return gemv_rows<T, R, 4, SWI, NORM>(st, y, h, x, W, n, N, K, beta, eps, gelu);
    default: return gemv_rows<T, R, 8, SWI, NORM>(st, y, h, x, W, n, N, K, beta, eps, gelu);
    }
}

// Rows a warp for rows_per_warp = 0: two where one would need more blocks
// than the GPU holds at once (8 of 256 threads an SM), so that the stream
// is not cut into a full wave and a partial one; else one, whose extra
// blocks keep more loads in flight.  On the H200 at one token: the 8B
// shapes 254 tok/s with two against 248 with one, the 1B shapes 1,274
// with one against 1,205 with two.
static int gemv_rows_auto(int N, int S) { return (long)N * S / 8 > 8L * qk_n_sm() ? 2 : 1; }

template <typename T>
int qk_gemv(cudaStream_t st, float *y, const T *x, const T *W, int n, int N, int K, float beta, int rows_per_warp, T *yc)
{
    const int S = gemv_split(N, K);
    if (rows_per_warp == 0) rows_per_warp = gemv_rows_auto(N, S);
    if (rows_per_warp == 2) return gemv_split_rows<T, 2, false, false>(st, y, yc, x, W, n, N, K, beta, S, 0.0f);
    return gemv_split_rows<T, 1, false, false>(st, y, yc, x, W, n, N, K, beta, S, 0.0f);
}

template <typename T> int qk_gemv_swiglu(cudaStream_t st, T *h, const T *x, const T *W, int n, int F, int K, int gelu)
{
    if (K % 8) return QERR_UNSUPPORTED;
    // The split of the plain kernel on the whole (2F, K) matrix: the same sums.
    return gemv_split_rows<T, 2, true, false>(st, NULL, h, x, W, n, F, K, 0.0f, gemv_split(2 * F, K), 0.0f, gelu);
}

template <typename T>
int qk_gemv_norm(cudaStream_t st, float *y, const T *x, const T *W, int n, int N, int K, float eps, int rows_per_warp)
{
    const int S = gemv_split(N, K);
    if (rows_per_warp == 0) rows_per_warp = gemv_rows_auto(N, S);
    if (rows_per_warp == 2) return gemv_split_rows<T, 2, false, true>(st, y, NULL, x, W, n, N, K, 0.0f, S, eps);
    return gemv_split_rows<T, 1, false, true>(st, y, NULL, x, W, n, N, K, 0.0f, S, eps);
}

template <typename T>
int qk_gemv_swiglu_norm(cudaStream_t st, T *h, const T *x, const T *W, int n, int F, int K, float eps, int gelu)
{
    if (K % 8) return QERR_UNSUPPORTED;
    return gemv_split_rows<T, 2, true, true>(st, NULL, h, x, W, n, F, K, 0.0f, gemv_split(2 * F, K), eps, gelu);
}

template <> int qk_gemv<float>(cudaStream_t, float *, const float *, const float *, int, int, int, float, int, float *)
{
    return QERR_UNSUPPORTED;
}
template <> int qk_gemv_swiglu<float>(cudaStream_t, float *, const float *, const float *, int, int, int, int)
{
    return QERR_UNSUPPORTED;
}
template <> int qk_gemv_norm<float>(cudaStream_t, float *, const float *, const float *, int, int, int, float, int)
{
    return QERR_UNSUPPORTED;
}
template <>
int qk_gemv_swiglu_norm<float>(cudaStream_t, float *, const float *, const float *, int, int, int, float, int)
{
    return QERR_UNSUPPORTED;
}
template int qk_gemv<bf16>(cudaStream_t, float *, const bf16 *, const bf16 *, int, int, int, float, int, bf16 *);
template int qk_gemv_norm<bf16>(cudaStream_t, float *, const bf16 *, const bf16 *, int, int, int, float, int);
template int qk_gemv_norm<__half>(cudaStream_t, float *, const __half *, const __half *, int, int, int, float, int);
template int qk_gemv_swiglu_norm<bf16>(cudaStream_t, bf16 *, const bf16 *, const bf16 *, int, int, int, float, int);
template int qk_gemv_swiglu_norm<__half>(cudaStream_t, __half *, const __half *, const __half *, int, int, int, float,
                                         int);
template int qk_gemv_swiglu<bf16>(cudaStream_t, bf16 *, const bf16 *, const bf16 *, int, int, int, int);
template int qk_gemv_swiglu<__half>(cudaStream_t, __half *, const __half *, const __half *, int, int, int, int);
template int qk_gemv<__half>(cudaStream_t, float *, const __half *, const __half *, int, int, int, float, int,
                             __half *);

// ---- greedy rows ----------------------------------------------------------------------------
//
// One block per logit row: the lowest id among the maximal logits, NaN never
// winning (all NaN: 0) - qsample_argmax's rule, so a greedy row reduced here
// picks what the host would from the same logits.

__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi)
{
    if (v != v) return false;   // NaN
    if (bv != bv) return true;
    return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(1024) argmax_kernel(const float *__restrict__ logits, int V,
                                                      const uint8_t *__restrict__ rows, int32_t *out)
{
    pdl_wait();
    const int r = blockIdx.x;
    if (rows[r] != QROW_ARGMAX) return;
    const float *row = logits + (size_t)r * V;
    float bv = NAN;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (argmax_better(row[i], i, bv, bi)) bv = row[i], bi = i;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, bv, o);
        const int i = __shfl_xor_sync(0xffffffffu, bi, o);
        if (argmax_better(v, i, bv, bi) || (bv != bv && v != v && i < bi)) bv = v, bi = i;
    }
    __shared__ float sv[32];
    __shared__ int si[32];
    if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = bv, si[threadIdx.x >> 5] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (argmax_better(sv[w], si[w], bv, bi) || (bv != bv && sv[w] != sv[w] && si[w] < bi)) bv = sv[w], bi = si[w];
        out[r] = bv != bv ? 0 : bi;
    }
}

int qk_argmax_rows(cudaStream_t st, const float *logits, int n, int V, const uint8_t *rows, int32_t *out)
{
    if (n <= 0) return 0;
    qk_launch(argmax_kernel, n, 1024, 0, st, logits, V, rows, out);
    CK_LAUNCH("argmax");
    return 0;
}

// ---- guided rows' masks --------------------------------------------------------------------

__global__ void mask_rows_kernel(float *logits, int V, int W, const uint32_t *mask, const uint8_t *has)
{
    const int r = blockIdx.y;
    if (!has[r]) return;
    const uint32_t *m = mask + (size_t)r * W;
    float *row = logits + (size_t)r * V;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < V; i += gridDim.x * blockDim.x)
        if (!((m[i >> 5] >> (i & 31)) & 1u)) row[i] = -INFINITY;
}

int qk_mask_rows(cudaStream_t st, float *logits, int n, int V, const uint32_t *mask, const uint8_t *has)
{
    if (n <= 0) return 0;
    const int bx = (V + 1023) / 1024 < 32 ? (V + 1023) / 1024 : 32;
    qk_launch(mask_rows_kernel, dim3(bx, n), 1024, 0, st, logits, V, (V + 31) / 32, mask, has);
    CK_LAUNCH("mask_rows");
    return 0;
}

// ---- drawn rows -------------------------------------------------------------------------
//
// One block per QROW_SAMPLE row: sample.c's draw() for temperature > 0.
// Probabilities are softmax(w / T), the sum in double.  Without top-k and
// top-p the candidates stay in id order: each thread owns a contiguous chunk
// of ids, so the running sum is a block-wide exclusive scan of the chunk
// sums and one thread's walk through its chunk.  With top-k (a radix select
// on the probabilities' bits, ties taken by id) or top-p (the host's
// pre-cut), at most SAMPLE_CAP candidates are gathered in shared memory,
// sorted by probability then id (bitonic), and the nucleus, min_p and the
// draw are taken in that order.  More candidates than that: -1, and the
// host draws from the logits with the same uniform number.

#define SAMPLE_THREADS 1024
#define SAMPLE_CAP 2048

// The unnormalised probability of logit w, as draw() forms it.
__device__ __forceinline__ float draw_weight(float w, float mx, float inv_t, bool inf_max)
{
    if (inf_max) return w == INFINITY ? 1.0f : 0.0f;
    return w != w ? 0.0f : expf((w - mx) * inv_t);
}

template <typename V>
__device__ V block_reduce(V v, V *sh, bool is_max)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const V x = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? (x > v ? x : v) : v + x;
    }
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? sh[lane] : (is_max ? (V)-INFINITY : (V)0);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const V x = __shfl_xor_sync(0xffffffffu, v, o);
            v = is_max ? (x > v ? x : v) : v + x;
        }
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

// Exclusive scan of one value per thread over the block (in thread order);
// the total in *total.
template <typename V> __device__ V block_excl_scan(V v, V *sh, V *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    V incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const V x = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += x;
    }
    __syncthreads();
    if (lane == 31) sh[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        V t = lane < (int)(blockDim.x >> 5) ? sh[lane] : (V)0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const V x = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += x;
        }
        sh[lane] = t;
    }
    __syncthreads();
    const V before = (warp ? sh[warp - 1] : (V)0) + incl - v;
    *total = sh[(blockDim.x >> 5) - 1];
    __syncthreads();
    return before;
}

__global__ void __launch_bounds__(SAMPLE_THREADS) sample_kernel(const float *__restrict__ logits, int V,
                                                               const uint8_t *__restrict__ mode,
                                                               const qrow_sample *__restrict__ ps, int32_t *out)
{
    pdl_wait();
    const int r = blockIdx.x;
    if (mode[r] != QROW_SAMPLE) return;
    __shared__ double shd[32];
    __shared__ float shf[32];
    __shared__ int shi[32];
    __shared__ int pick_sh, last_sh, n_cand;
    __shared__ unsigned hist[256];
    __shared__ float cp[SAMPLE_CAP];
    __shared__ int ci[SAMPLE_CAP];
    const float *row = logits + (size_t)r * V;
    const qrow_sample p = ps[r];
    // 1. the largest logit (NaN never counts)
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (row[i] > mx) mx = row[i];
    mx = block_reduce<float>(mx, shf, true);
    if (!(mx > -INFINITY)) {
        if (threadIdx.x == 0) out[r] = 0;
        return;
    }
    const bool inf_max = mx == INFINITY;
    const float inv_t = 1.0f / p.temperature;
    // 2. the softmax's sum, in double
    double sum = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += (double)draw_weight(row[i], mx, inv_t, inf_max);
    sum = block_reduce<double>(sum, shd, false);
#define PROB(i) ((float)((double)draw_weight(row[(i)], mx, inv_t, inf_max) / sum))
    const int chunk = (V + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * chunk, hi = min(V, lo + chunk);

    if (p.top_k <= 0 && !(p.top_p < 1.0f)) {
        // ---- candidates in id order: the min_p cut, then a scan ----
        float cut = 0;
        if (p.min_p > 0) {
            float best = 0;
            for (int i = threadIdx.x; i < V; i += blockDim.x) best = fmaxf(best, PROB(i));
            best = block_reduce<float>(best, shf, true);
            cut = p.min_p * best;
        }
        double mine = 0;
        int last = -1;
        for (int i = lo; i < hi; i++) {
            const float pr = PROB(i);
            if (pr > 0 && pr >= cut) mine += pr, last = i;
        }
        if (threadIdx.x == 0) pick_sh = 0x7fffffff, last_sh = -1;
        double mass;
        const double before = block_excl_scan<double>(mine, shd, &mass);
        const double target = p.u * mass;
        // The thread whose chunk holds the crossing walks it (should rounding
        // let two chunks claim it, the lower id wins).
        if (mine > 0 && target < before + mine && target >= before) {
            double c = before;
            int pick = last;
            for (int i = lo; i < hi; i++) {
                const float pr = PROB(i);
                if (!(pr > 0 && pr >= cut)) continue;
                c += pr;
                if (target < c) {
                    pick = i;
                    break;
                }
            }
            atomicMin(&pick_sh, pick);
        }
        if (last >= 0) atomicMax(&last_sh, last);
        __syncthreads();
        if (threadIdx.x == 0) out[r] = pick_sh != 0x7fffffff ? pick_sh : (last_sh >= 0 ? last_sh : 0);
        return;
    }

    // ---- sorted candidates: top-k and / or top-p ----
    int npos = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) npos += PROB(i) > 0;
    npos = (int)block_reduce<float>((float)npos, shf, false); // exact: counts below 2^24
    const int k = p.top_k > 0 && p.top_k < npos ? p.top_k : 0;
    unsigned thr = 0;   // with top-k: the k-th largest probability's bits
    int need_ties = 0;  // how many ids of probability exactly thr make the top k
    float pcut = 0;     // without top-k: the host's pre-cut of the nucleus
    if (k > SAMPLE_CAP) {
        if (threadIdx.x == 0) out[r] = -1;
        return;
    }
    if (k) {
        // Radix select, 8 bits a pass, on the bits of positive floats (their
        // order is the numbers' order).
        unsigned prefix = 0, mask = 0;
        int kk = k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            for (int i = threadIdx.x; i < V; i += blockDim.x) {
                const float pr = PROB(i);
                const unsigned bits = __float_as_uint(pr);
                if (pr > 0 && (bits & mask) == prefix) atomicAdd(&hist[(bits >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                int cum = 0, d = 255;
                for (; d > 0; d--) {
                    if (cum + (int)hist[d] >= kk) break;
                    cum += (int)hist[d];
                }
                shi[0] = d;
                shi[1] = kk - cum;
            }
            __syncthreads();
            prefix |= (unsigned)shi[0] << shift;
            mask |= 255u << shift;
            kk = shi[1];
            __syncthreads();
        }
        thr = prefix;
        need_ties = kk;
    } else {
        pcut = (1.0f - p.top_p) / (float)(npos > 1 ? npos - 1 : 1);
    }
    // Members: with top-k, probability above thr, or equal to it and among
    // the first need_ties such ids; without, probability >= the pre-cut.
    int my_ties = 0, my_members = 0;
    for (int i = lo; i < hi; i++) {
        const float pr = PROB(i);
        if (!(pr > 0)) continue;
        if (k) {
            const unsigned bits = __float_as_uint(pr);
            if (bits == thr) my_ties++;
            else if (bits > thr) my_members++;
        } else if (pr >= pcut) {
            my_members++;
        }
    }
    int total_ties;
    const int tie_before = block_excl_scan<int>(my_ties, shi, &total_ties);
    int n_members;
    block_excl_scan<int>(my_members + (k ? max(0, min(my_ties, need_ties - tie_before)) : 0), shi, &n_members);
    if (n_members > SAMPLE_CAP) {
        if (threadIdx.x == 0) out[r] = -1;
        return;
    }
    if (threadIdx.x == 0) n_cand = 0;
    __syncthreads();
    int tie_rank = tie_before;
    for (int i = lo; i < hi; i++) {
        const float pr = PROB(i);
        if (!(pr > 0)) continue;
        bool in;
        if (k) {
            const unsigned bits = __float_as_uint(pr);
            in = bits > thr || (bits == thr && tie_rank++ < need_ties);
        } else {
            in = pr >= pcut;
        }
        if (in) {
            const int at = atomicAdd(&n_cand, 1);
            cp[at] = pr;
            ci[at] = i;
        }
    }
    __syncthreads();
    int m = n_cand;
    if (m == 0) {
        // Everything fell below the pre-cut: the nucleus is the best token.
        float bv = -1;
        int bi = 0x7fffffff;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const float pr = PROB(i);
            if (pr > bv || (pr == bv && i < bi)) bv = pr, bi = i;
        }
        // (a plain argmax over the block, by probability then id)
        __syncthreads();
        if (threadIdx.x == 0) pick_sh = 0x7fffffff;
        __syncthreads();
        const float top = block_reduce<float>(bv, shf, true);
        if (bv == top) atomicMin(&pick_sh, bi);
        __syncthreads();
        if (threadIdx.x == 0) out[r] = pick_sh;
        return;
    }
    // Bitonic sort by (probability descending, id ascending), padded to a
    // power of two with entries that sort last.
    int n2 = 1;
    while (n2 < m) n2 <<= 1;
    for (int i = m + threadIdx.x; i < n2; i += blockDim.x) cp[i] = -1.0f, ci[i] = 0x7fffffff;
    __syncthreads();
    for (int size = 2; size <= n2; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < n2 / 2; t += blockDim.x) {
                const int a = 2 * t - (t & (stride - 1)), b = a + stride;
                const bool up = (a & size) == 0;
                const bool a_first = cp[a] > cp[b] || (cp[a] == cp[b] && ci[a] < ci[b]);
                if (a_first != up) {
                    const float tp = cp[a];
                    cp[a] = cp[b];
                    cp[b] = tp;
                    const int ti = ci[a];
                    ci[a] = ci[b];
                    ci[b] = ti;
                }
            }
            __syncthreads();
        }
    if (threadIdx.x != 0) return;
    // The rest is short and sequential, in the host's order.
    if (p.top_p < 1.0f) {
        double kept = 1.0, target = p.top_p;
        if (k) {
            kept = 0;
            for (int i = 0; i < m; i++) kept += cp[i];
            target = p.top_p * kept;
            const float cut = (float)((kept - target) / (m > 1 ? m - 1 : 1));
            int n = 0;
            for (int i = 0; i < m; i++)
                if (cp[i] >= cut) cp[n] = cp[i], ci[n] = ci[i], n++;
            if (n == 0) n = 1; // the best token (first in this order) alone
            m = n;
        }
        double c = 0;
        for (int i = 0; i < m; i++) {
            c += cp[i];
            if (c >= target) {
                m = i + 1;
                break;
            }
        }
    }
    if (p.min_p > 0) {
        const float cut = p.min_p * cp[0];
        int n = 0;
        for (int i = 0; i < m; i++)
            if (cp[i] >= cut) cp[n] = cp[i], ci[n] = ci[i], n++;
        m = n;
    }
    double mass = 0;
    for (int i = 0; i < m; i++) mass += cp[i];
    const double target = p.u * mass;
    double c = 0;
    int pick = ci[m - 1];
    for (int i = 0; i < m; i++) {
        c += cp[i];
        if (target < c) {
            pick = ci[i];
            break;
        }
    }
    out[r] = pick;
#undef PROB
}

int qk_sample_rows(cudaStream_t st, const float *logits, int n, int V, const uint8_t *mode, const qrow_sample *ps,
                   int32_t *out)
{
    if (n <= 0) return 0;
    qk_launch(sample_kernel, n, SAMPLE_THREADS, 0, st, logits, V, mode, ps, out);
    CK_LAUNCH("sample");
    return 0;
}

// ---- log-probabilities of reduced rows ------------------------------------------------
//
// One block per row that asks for them, after its token is known:
// qsample_logprobs on the raw logits.  NaN counts as -inf; the log-sum-exp
// is summed in double; with +inf logits those share the mass.  The top n
// come from n block-wide maxima, each the largest (value, then lower id)
// below the previous one in that order.

__device__ __forceinline__ float lp_clean(float x) { return x != x ? -INFINITY : x; }

__global__ void __launch_bounds__(SAMPLE_THREADS) logprobs_kernel(const float *__restrict__ logits, int V,
                                                                 const uint8_t *__restrict__ mode,
                                                                 const qrow_sample *__restrict__ ps,
                                                                 const int32_t *__restrict__ tokens,
                                                                 qrow_logprobs *out)
{
    pdl_wait();
    const int r = blockIdx.x;
    const int want = (mode[r] == QROW_ARGMAX || mode[r] == QROW_SAMPLE) ? ps[r].n_logprobs : 0;
    if (want <= 0) return;
    const int chosen = tokens[r];
    if (chosen < 0 || chosen >= V) return; // a draw left to the host: n stays -1
    __shared__ double shd[32];
    __shared__ float shf[32];
    __shared__ int best_id;
    const float *row = logits + (size_t)r * V;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, lp_clean(row[i]));
    mx = block_reduce<float>(mx, shf, true);
    if (mx == -INFINITY) {
        if (threadIdx.x == 0) out[r].n = 0;
        return;
    }
    double lse;
    int n_inf = 0;
    if (mx == INFINITY) {
        float c = 0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) c += row[i] == INFINITY;
        n_inf = (int)block_reduce<float>(c, shf, false);
        lse = log((double)n_inf);
    } else {
        double sum = 0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) sum += exp((double)lp_clean(row[i]) - (double)mx);
        sum = block_reduce<double>(sum, shd, false);
        lse = (double)mx + log(sum);
    }
#define LP(l) (n_inf ? ((l) == INFINITY ? (float)-lse : -INFINITY) : (float)((double)lp_clean(l) - lse))
    int top_n = want - 1;
    if (top_n > V) top_n = V;
    float pv = INFINITY;
    int pid = -1;
    for (int k = 0; k < top_n; k++) {
        // The largest (value desc, id asc) strictly after (pv, pid).
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const float v = lp_clean(row[i]);
            const bool after = v < pv || (v == pv && i > pid);
            if (after && (v > bv || (v == bv && i < bi))) bv = v, bi = i;
        }
        const float top = block_reduce<float>(bv, shf, true);
        if (threadIdx.x == 0) best_id = 0x7fffffff;
        __syncthreads();
        if (bv == top && bi != 0x7fffffff) atomicMin(&best_id, bi);
        __syncthreads();
        pv = top;
        pid = best_id;
        if (threadIdx.x == 0) {
            out[r].id[1 + k] = pid;
            out[r].logprob[1 + k] = LP(row[pid]);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[r].id[0] = chosen;
        out[r].logprob[0] = LP(row[chosen]);
        out[r].n = 1 + top_n;
    }
#undef LP
}

int qk_row_logprobs(cudaStream_t st, const float *logits, int n, int V, const uint8_t *mode, const qrow_sample *ps,
                    const int32_t *tokens, qrow_logprobs *out)
{
    if (n <= 0) return 0;
    qk_launch(logprobs_kernel, n, SAMPLE_THREADS, 0, st, logits, V, mode, ps, tokens, out);
    CK_LAUNCH("logprobs");
    return 0;
}
