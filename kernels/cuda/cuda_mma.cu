// cuda_mma.cu - projections of a few tokens on the tensor cores: y(n, N) =
// x(n, K) W(N, K)^T + beta y for n <= QK_MMA_MAX tokens (a decode step of
// one sequence, one verifying drafts, a small batch), streaming the weights
// once.
//
// The weight-streaming kernel of cuda_ops.cu (qk_gemv) does n multiply-adds
// a weight on the CUDA cores: from three tokens on the 8B shapes they, not
// memory, bound it, and cuBLAS runs such steps at about 1.2 times the time
// of one token.  Here each warp feeds mma.sync.m16n8k16 (bf16 or f16 in,
// float sums): W's rows are the MMA's M (16 rows a tile, MT tiles a warp),
// the tokens its N (8, the missing ones zero), K in steps of 16.
//
// The K order within a step is free (a dot product does not care) as long
// as W and x use the same.  Thread (g = lane / 4, t = lane % 4) of a warp
// loads, for each of its rows (g and g + 8 of each tile), J 16-byte pieces
// of a chunk of 32 J elements: piece j at element 8 (4 j + t), so that each
// load instruction of the warp reads 64 consecutive bytes of 8 rows.  A
// piece's 8 elements serve as the k slots {2t, 2t+1, 2t+8, 2t+9} of two
// MMA steps; the x fragment of token g is the same 8 elements of x's row g.
// The block's warps take every MMA_WARPS-th chunk of K and add their sums
// through shared memory in a fixed order.  Each warp keeps D chunks of
// weights in flight, the first ones read before the kernel waits for the
// one before it (weights do not depend on it).
#include "cuda_kernels.cuh"

#define MMA_WARPS 8

// MT: 16-row tiles a warp; J: 16-byte pieces a row a chunk (chunks of
// 32 J elements); D: chunks in flight a warp.
// NORM: the RMSNorm before the projection folded in (its weights already
// in W, as for qk_gemv_norm): x is the residual stream in T; each thread
// also sums the squares of the x elements it holds (each once), the block
// adds them up in a fixed order, and the sums are scaled by 1 / sqrt(mean +
// eps).  SWI (with NORM, MT 2): W holds the N gate rows, then the N up
// rows; tile 0 takes gate rows, tile 1 the up rows of the same outputs, and
// h[t][j] = silu(gate) * up is written as T (qk_glu; gelu: GeGLU).
template <typename T, int MT, int J, int D, bool NORM, bool SWI>
__global__ void __launch_bounds__(MMA_WARPS * 32)
    gemv_mma_kernel(float *__restrict__ y, T *__restrict__ h, const T *__restrict__ x, const T *__restrict__ W, int n,
                    int N, int K, float beta, T *__restrict__ yc, float eps, int gelu)
{
    static_assert(!SWI || (MT == 2 && NORM), "a gate tile and its up tile, the norm folded in");
    constexpr int ROWS = SWI ? 16 : 16 * MT; // outputs a block
    __shared__ float red[MMA_WARPS][16 * MT][8];
    __shared__ float red_ss[MMA_WARPS][8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * ROWS, chunks = K / (32 * J);
    // Rows g + 8 i; rows past N read row N - 1 (their sums are not written).
    const uint4 *wr[2 * MT];
#pragma unroll
    for (int i = 0; i < 2 * MT; i++) {
        int r = row0 + g + 8 * (SWI ? i & 1 : i);
        r = r < N ? r : N - 1;
        if (SWI && i >= 2) r += N;
        wr[i] = (const uint4 *)(W + (size_t)r * K) + t;
    }
    float ss = 0.0f;
    uint4 wv[D][2 * MT][J];
#pragma unroll
    for (int s = 0; s < D; s++) {
        const int c = warp + s * MMA_WARPS;
        if (c < chunks) {
#pragma unroll
            for (int i = 0; i < 2 * MT; i++)
#pragma unroll
                for (int j = 0; j < J; j++) wv[s][i][j] = ld_weights(wr[i] + (size_t)c * 4 * J + 4 * j);
        }
    }
    pdl_wait();
    // x's fragments travel with the weights' (from L2: x is a few KB).
    const uint4 *xr = g < n ? (const uint4 *)(x + (size_t)g * K) + t : NULL;
    uint4 xv[D][J];
#pragma unroll
    for (int s = 0; s < D; s++) {
        const int c = warp + s * MMA_WARPS;
#pragma unroll
        for (int j = 0; j < J; j++)
            xv[s][j] = xr && c < chunks ? xr[(size_t)c * 4 * J + 4 * j] : make_uint4(0, 0, 0, 0);
    }
    float acc[MT][4];
#pragma unroll
    for (int m = 0; m < MT; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
    for (int c0 = warp; c0 < chunks; c0 += D * MMA_WARPS) {
#pragma unroll
        for (int s = 0; s < D; s++) {
            const int c = c0 + s * MMA_WARPS;
            if (c >= chunks) break;
            if constexpr (NORM) {
#pragma unroll
                for (int j = 0; j < J; j++) {
                    const uint32_t u[4] = { xv[s][j].x, xv[s][j].y, xv[s][j].z, xv[s][j].w };
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float lo = word_elem<T>(u[e], 0), hi = word_elem<T>(u[e], 1);
                        ss += lo * lo + hi * hi;
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < J; j++)
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    const uint4 a = wv[s][2 * m][j], b = wv[s][2 * m + 1][j], xf = xv[s][j];
                    const uint32_t a0[4] = { a.x, b.x, a.y, b.y }, a1[4] = { a.z, b.z, a.w, b.w };
                    const uint32_t b0[2] = { xf.x, xf.y }, b1[2] = { xf.z, xf.w };
                    mma16816<T>(acc[m], a0, b0);
                    mma16816<T>(acc[m], a1, b1);
                }
            const int cn = c + D * MMA_WARPS;
            if (cn < chunks) {
#pragma unroll
                for (int i = 0; i < 2 * MT; i++)
#pragma unroll
                    for (int j = 0; j < J; j++) wv[s][i][j] = ld_weights(wr[i] + (size_t)cn * 4 * J + 4 * j);
                if (xr) {
#pragma unroll
                    for (int j = 0; j < J; j++) xv[s][j] = xr[(size_t)cn * 4 * J + 4 * j];
                }
            }
        }
    }
    // c0, c1: row g, tokens 2t and 2t + 1; c2, c3: row g + 8.
#pragma unroll
    for (int m = 0; m < MT; m++) {
        red[warp][16 * m + g][2 * t] = acc[m][0];
        red[warp][16 * m + g][2 * t + 1] = acc[m][1];
        red[warp][16 * m + g + 8][2 * t] = acc[m][2];
        red[warp][16 * m + g + 8][2 * t + 1] = acc[m][3];
    }
    if constexpr (NORM) {
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);
        ss += __shfl_xor_sync(0xffffffffu, ss, 2);
        if (t == 0) red_ss[warp][g] = ss;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ROWS * 8; i += blockDim.x) {
        const int r = i >> 3, tok = i & 7, row = row0 + r;
        if (tok >= n || row >= N) continue;
        float v = 0, up = 0, sc = 1.0f;
#pragma unroll
        for (int w = 0; w < MMA_WARPS; w++) v += red[w][r][tok];
        if constexpr (NORM) {
            float q = 0;
#pragma unroll
            for (int w = 0; w < MMA_WARPS; w++) q += red_ss[w][tok];
            sc = 1.0f / sqrtf(q / (float)K + eps);
            v *= sc;
        }
        if constexpr (SWI) {
#pragma unroll
            for (int w = 0; w < MMA_WARPS; w++) up += red[w][16 + r][tok];
            up *= sc;
            h[(size_t)tok * N + row] = fromf<T>(qk_glu(v, up, gelu));
        } else {
            float *yo = y + (size_t)tok * N + row;
            if (beta != 0.0f) v += beta * *yo;
            *yo = v;
            if (yc) yc[(size_t)tok * N + row] = fromf<T>(v);
        }
    }
}

bool qk_gemv_mma_ok(int elem_bytes, int n, int K)
{
    return elem_bytes == 2 && n >= 1 && n <= QK_MMA_MAX && K > 0 && K % 128 == 0;
}

template <typename T, int MT, int J, int D, bool NORM = false, bool SWI = false>
static void launch_mma(cudaStream_t st, float *y, T *h, const T *x, const T *W, int n, int N, int K, float beta, T *yc,
                       float eps, int gelu = 0)
{
    const int rows = SWI ? 16 : 16 * MT;
    const dim3 grid((N + rows - 1) / rows), block(MMA_WARPS * 32);
    qk_launch(gemv_mma_kernel<T, MT, J, D, NORM, SWI>, grid, block, 0, st, y, h, x, W, n, N, K, beta, yc, eps,
              gelu);
}

// Variant 1 (the default): 16 rows a warp, 4 pieces a row, 2 chunks in
// flight; 2: 32 rows, 2 pieces, 2 chunks (the SwiGLU form's shape).  On the
// H200 the first streams the 8B and 1B shapes as fast or faster at 1-8
// tokens (bench_gpu --gemv N).
template <typename T>
int qk_gemv_mma(cudaStream_t st, float *y, const T *x, const T *W, int n, int N, int K, float beta, T *yc, int variant)
{
    if (!qk_gemv_mma_ok((int)sizeof(T), n, K) || N <= 0) return QERR_UNSUPPORTED;
    if (variant == 2) launch_mma<T, 2, 2, 2>(st, y, NULL, x, W, n, N, K, beta, yc, 0.0f);
    else launch_mma<T, 1, 4, 2>(st, y, NULL, x, W, n, N, K, beta, yc, 0.0f);
    CK_LAUNCH("gemv_mma");
    return 0;
}

template <typename T>
int qk_gemv_mma_norm(cudaStream_t st, float *y, const T *x, const T *W, int n, int N, int K, float eps)
{
    if (!qk_gemv_mma_ok((int)sizeof(T), n, K) || N <= 0) return QERR_UNSUPPORTED;
    launch_mma<T, 1, 4, 2, true>(st, y, NULL, x, W, n, N, K, 0.0f, NULL, eps);
    CK_LAUNCH("gemv_mma_norm");
    return 0;
}

template <typename T>
int qk_gemv_mma_swiglu_norm(cudaStream_t st, T *h, const T *x, const T *W, int n, int F, int K, float eps, int gelu)
{
    if (!qk_gemv_mma_ok((int)sizeof(T), n, K) || F <= 0) return QERR_UNSUPPORTED;
    launch_mma<T, 2, 2, 2, true, true>(st, NULL, h, x, W, n, F, K, 0.0f, NULL, eps, gelu);
    CK_LAUNCH("gemv_mma_swiglu_norm");
    return 0;
}

template <>
int qk_gemv_mma<float>(cudaStream_t, float *, const float *, const float *, int, int, int, float, float *, int)
{
    return QERR_UNSUPPORTED; // float storage: cuBLAS
}
template <> int qk_gemv_mma_norm<float>(cudaStream_t, float *, const float *, const float *, int, int, int, float)
{
    return QERR_UNSUPPORTED;
}
template <>
int qk_gemv_mma_swiglu_norm<float>(cudaStream_t, float *, const float *, const float *, int, int, int, float, int)
{
    return QERR_UNSUPPORTED;
}
#define INST(T)                                                                                                        \
    template int qk_gemv_mma<T>(cudaStream_t, float *, const T *, const T *, int, int, int, float, T *, int);          \
    template int qk_gemv_mma_norm<T>(cudaStream_t, float *, const T *, const T *, int, int, int, float);               \
    template int qk_gemv_mma_swiglu_norm<T>(cudaStream_t, T *, const T *, const T *, int, int, int, float, int);
INST(bf16)
INST(__half)
