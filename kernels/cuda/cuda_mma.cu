// cuda_mma.cu - projections of a few tokens on the tensor cores: y(n, N) =
// x(n, K) W(N, K)^T + beta y for 2 <= n <= 16 (a decode verifying drafts,
// a small batch), streaming the weights once.
//
// The weight-streaming kernel of cuda_ops.cu (qk_gemv) does n multiply-adds
// per weight on the CUDA cores: from three or four tokens on it is bound by
// them rather than by memory (8B at batch 4 ran 1.4 times as long a step
// as at batch 1).  Here each warp feeds mma.sync.m16n8k16 (bf16 or f16 in,
// float accumulation): W's rows are the MMA's M, the tokens its N (one or
// two tiles of 8, the missing ones zero), K in steps of 16.
//
// The K order within a step is free (a dot product does not care) as long
// as W and x use the same: thread (g = lane / 4, t = lane % 4) loads 8
// consecutive elements of its rows at K offset 8 t of a 32-element chunk,
// one 16-byte load a row, and uses them as the k slots {2t, 2t+1, 2t+8,
// 2t+9} of two MMA steps; the x fragment of token g comes from the same 8
// elements of x's row g.  Each warp takes 32 rows (two M tiles, sharing the
// x fragments) and every WARPS-th chunk of K; the block's warps then add
// their partial sums through shared memory.  Weights are read before the
// kernel waits for the one before it (they do not depend on it).
#include "cuda_kernels.cuh"

#define MMA_WARPS 8
#define MMA_ROWS 32 // rows of W a block (and each of its warps)
#define MMA_UNROLL 4 // chunks of 32 a warp has in flight

template <typename T> struct mma_op;
template <> struct mma_op<bf16> {
    static __device__ __forceinline__ void run(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct mma_op<__half> {
    static __device__ __forceinline__ void run(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// Streamed once: no room in L1 for what will not be read again.
__device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// NT: tiles of 8 tokens (1 or 2).
template <typename T, int NT>
__global__ void __launch_bounds__(MMA_WARPS * 32, 2) gemv_mma_kernel(float *y, const T *x, const T *W, int n, int N,
                                                                   int K, float beta, T *yc)
{
    __shared__ float red[MMA_WARPS][MMA_ROWS][NT * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * MMA_ROWS, chunks = K / 32;
    // This thread's four rows: g, g + 8 (tile 0), g + 16, g + 24 (tile 1);
    // rows past N read row N - 1 (their sums are never written).
    const T *wr[4];
    for (int i = 0; i < 4; i++) {
        const int r = row0 + g + 8 * i;
        wr[i] = W + (size_t)(r < N ? r : N - 1) * K + 8 * t;
    }
    float acc[2][NT][4] = {};
    // A software pipeline MMA_UNROLL chunks deep: each slot's weights and x
    // for its next chunk are loaded before its math, so that the loads of
    // MMA_UNROLL chunks are always in flight.
    uint4 wv[MMA_UNROLL][4], xv[MMA_UNROLL][NT];
    const int step = MMA_UNROLL * MMA_WARPS;
#pragma unroll
    for (int u = 0; u < MMA_UNROLL; u++)
        if (warp + u * MMA_WARPS < chunks)
            for (int i = 0; i < 4; i++) wv[u][i] = ld_stream(wr[i] + (size_t)(warp + u * MMA_WARPS) * 32);
    pdl_wait();
    const T *xr[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) xr[nt] = nt * 8 + g < n ? x + (size_t)(nt * 8 + g) * K + 8 * t : NULL;
#pragma unroll
    for (int u = 0; u < MMA_UNROLL; u++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            xv[u][nt] = xr[nt] && warp + u * MMA_WARPS < chunks ? *(const uint4 *)(xr[nt] + (size_t)(warp + u * MMA_WARPS) * 32)
                                                                : make_uint4(0, 0, 0, 0);
    for (int c = warp; c < chunks; c += step) {
#pragma unroll
        for (int u = 0; u < MMA_UNROLL; u++) {
            const int cu = c + u * MMA_WARPS;
            if (cu >= chunks) break;
            const uint4 w0 = wv[u][0], w1 = wv[u][1], w2 = wv[u][2], w3 = wv[u][3];
            uint4 xc[NT];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) xc[nt] = xv[u][nt];
            const int cn = cu + step;
            if (cn < chunks) {
                for (int i = 0; i < 4; i++) wv[u][i] = ld_stream(wr[i] + (size_t)cn * 32);
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    if (xr[nt]) xv[u][nt] = *(const uint4 *)(xr[nt] + (size_t)cn * 32);
            }
            // Step 0 takes elements 0-3 of each load, step 1 elements 4-7.
            const uint32_t a00[4] = { w0.x, w1.x, w0.y, w1.y }, a01[4] = { w0.z, w1.z, w0.w, w1.w };
            const uint32_t a10[4] = { w2.x, w3.x, w2.y, w3.y }, a11[4] = { w2.z, w3.z, w2.w, w3.w };
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                mma_op<T>::run(acc[0][nt], a00, xc[nt].x, xc[nt].y);
                mma_op<T>::run(acc[0][nt], a01, xc[nt].z, xc[nt].w);
                mma_op<T>::run(acc[1][nt], a10, xc[nt].x, xc[nt].y);
                mma_op<T>::run(acc[1][nt], a11, xc[nt].z, xc[nt].w);
            }
        }
    }
    // c0, c1: row g, tokens 2t, 2t + 1; c2, c3: row g + 8.
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            red[warp][16 * m + g][nt * 8 + 2 * t] = acc[m][nt][0];
            red[warp][16 * m + g][nt * 8 + 2 * t + 1] = acc[m][nt][1];
            red[warp][16 * m + g + 8][nt * 8 + 2 * t] = acc[m][nt][2];
            red[warp][16 * m + g + 8][nt * 8 + 2 * t + 1] = acc[m][nt][3];
        }
    __syncthreads();
    for (int i = threadIdx.x; i < MMA_ROWS * NT * 8; i += blockDim.x) {
        const int r = i / (NT * 8), tok = i % (NT * 8), row = row0 + r;
        if (tok >= n || row >= N) continue;
        float s = 0;
#pragma unroll
        for (int w = 0; w < MMA_WARPS; w++) s += red[w][r][tok];
        float *yo = y + (size_t)tok * N + row;
        const float v = beta != 0.0f ? s + beta * *yo : s;
        *yo = v;
        if (yc) yc[(size_t)tok * N + row] = fromf<T>(v);
    }
}

bool qk_gemv_mma_ok(int elem_bytes, int n, int K)
{
    return elem_bytes == 2 && n >= 2 && n <= QK_MMA_MAX && K % 32 == 0 && K > 0;
}

template <typename T>
int qk_gemv_mma(cudaStream_t st, float *y, const T *x, const T *W, int n, int N, int K, float beta, T *yc)
{
    if (!qk_gemv_mma_ok((int)sizeof(T), n, K) || N <= 0) return QERR_UNSUPPORTED;
    const dim3 grid((N + MMA_ROWS - 1) / MMA_ROWS), block(MMA_WARPS * 32);
    if (n <= 8) qk_launch(gemv_mma_kernel<T, 1>, grid, block, 0, st, y, x, W, n, N, K, beta, yc);
    else qk_launch(gemv_mma_kernel<T, 2>, grid, block, 0, st, y, x, W, n, N, K, beta, yc);
    CK_LAUNCH("gemv_mma");
    return 0;
}

template <> int qk_gemv_mma<float>(cudaStream_t, float *, const float *, const float *, int, int, int, float, float *)
{
    return QERR_UNSUPPORTED; // float storage: cuBLAS
}
template int qk_gemv_mma<bf16>(cudaStream_t, float *, const bf16 *, const bf16 *, int, int, int, float, bf16 *);
template int qk_gemv_mma<__half>(cudaStream_t, float *, const __half *, const __half *, int, int, int, float, __half *);
