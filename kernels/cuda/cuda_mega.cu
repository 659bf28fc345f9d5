// cuda_mega.cu - one token's decode pass (batch 1) as a chain of persistent
// kernels that stream the weights through shared memory.
//
// At batch 1 the pass is a stream of weight bytes with little arithmetic,
// and what keeps it from the copy bandwidth is the gaps: each projection
// kernel starts streaming only once the one before has finished, and
// memory idles while the last rows of one and the first of the next are
// in flight, a few microseconds per kernel, seven kernels a layer.  Here
// the projections between two attention steps (output, the FFN norm,
// gate/up with SwiGLU, down, the next layer's norm and Q/K/V, or the final
// norm and the logits) are one kernel of one block per SM:
//
//   - warp 0 streams the block's share of every stage's weights, in the
//     stages' order, into a ring of shared-memory slots with bulk copies
//     (cp.async.bulk, completion counted on an mbarrier per slot).  The
//     weights depend on nothing the pass computes, so it runs ahead across
//     stage boundaries and even before the kernel's inputs are ready (the
//     programmatic-launch wait), limited only by free slots;
//   - the other 15 warps wait at a grid barrier between stages (the next
//     stage reads what every block wrote), fill a shared copy of the
//     stage's input vector (loaded, or RMS-normalised from the residual
//     stream), and reduce each row of each slot to its output as it lands.
//
// Attention stays its own kernel between two of these (qk_attn_decode with
// RoPE folded in); while it runs, the next chain kernel's blocks, already
// resident, fill their rings.
//
// Every sum is formed exactly as the projection kernel of cuda_ops.cu forms
// it for one token (the same K split, lane pattern, shuffle tree and part
// order), and the norm exactly as rmsnorm_kernel does (its thread layout
// replayed), so a pass through here gives the same bits as the kernels one
// by one; test_gpu_model checks that.
#include <stdlib.h>

#include "cuda_kernels.cuh"

#define MG_WARPS 16
#define MG_NC (MG_WARPS - 1)        // consumer warps
#define MG_MAX_NS 24                // ring slots, at most
#define MG_HEAD 512                 // the mbarriers, before the ring
#define MG_SMEM (196 * 1024)        // dynamic shared memory aimed at: room for an attention block beside

// ---- mbarriers and bulk copies (sm_90) --------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mb_init(uint64_t *b, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}

__device__ __forceinline__ void mb_expect_tx(uint64_t *b, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mb_arrive(uint64_t *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}

__device__ __forceinline__ void mb_wait(uint64_t *b, unsigned parity, bool spin = false)
{
    uint32_t done;
    if (spin) {
        do {
            asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                         " selp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(done)
                         : "r"(smem_u32(b)), "r"(parity)
                         : "memory");
        } while (!done);
        return;
    }
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(smem_u32(b)), "r"(parity)
                     : "memory");
    } while (!done);
}

// bytes (a multiple of 16, both addresses 16-byte aligned) from global src
// to shared dst, counted on mbarrier b.
__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *b)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(b))
                 : "memory");
}

// The consumer warps only (warp 0 has its own loop).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(MG_NC * 32) : "memory"); }

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long add_release(unsigned long long *p, unsigned long long v)
{
    unsigned long long old;
    asm volatile("atom.add.release.gpu.global.u64 %0, [%1], %2;\n" : "=l"(old) : "l"(p), "l"(v) : "memory");
    return old;
}

// Every block's consumers reach here before any goes on.  *bar counts
// arrivals and only grows: the arrivals at one barrier are the G = gridDim.x
// values after a multiple of G (no block arrives at the next before all
// have arrived at this one, and every kernel of the chain has all its
// blocks meet at every barrier), so a block waits for the count to reach
// the next multiple of G above what it found.  Nothing to reset between
// passes (64 bits: no wrap), so long as one chain kernel runs at a time
// (they are on one stream).
__device__ __forceinline__ void grid_sync(unsigned long long *bar)
{
    consumers_sync();
    if (threadIdx.x == 32) {
        const unsigned long long G = gridDim.x, old = add_release(bar, 1), target = (old / G + 1) * G;
        while (ld_acquire(bar) < target) {
        }
    }
    consumers_sync();
}

// ---- the schedule both sides walk ------------------------------------------------------

// This block's rows of a stage, [lo, hi), cut into n_chunks chunks of as
// even a size as fits a slot; chunk c is rows [lo + n c / nch, lo + n (c+1) / nch).
struct mg_span {
    int lo, n, nch, per, N;
    bool inter;
};

__device__ __forceinline__ mg_span stage_span(const qk_mstage &s, int slot, int esz, bool inter)
{
    mg_span sp;
    sp.per = slot / (s.K * esz * (s.swiglu ? 2 : 1));
    sp.N = s.N;
    sp.inter = inter;
    if (inter) { // chunks of per rows dealt round the blocks
        const int total = (s.N + sp.per - 1) / sp.per;
        sp.lo = 0;
        sp.n = 0;
        sp.nch = (int)blockIdx.x < total ? (total - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x : 0;
        return sp;
    }
    sp.lo = (int)((long long)s.N * blockIdx.x / gridDim.x);
    sp.n = (int)((long long)s.N * (blockIdx.x + 1) / gridDim.x) - sp.lo;
    sp.nch = (sp.n + sp.per - 1) / sp.per;
    return sp;
}

// Chunk c of the block's: its first row and row count.
__device__ __forceinline__ void chunk_at(const mg_span &sp, int c, int *r0, int *m)
{
    if (sp.inter) {
        *r0 = (blockIdx.x + c * gridDim.x) * sp.per;
        *m = sp.N - *r0 < sp.per ? sp.N - *r0 : sp.per;
        return;
    }
    *r0 = sp.lo + sp.n * c / sp.nch;
    *m = sp.lo + sp.n * (c + 1) / sp.nch - *r0;
}

// ---- the sums ----------------------------------------------------------------------------

// Rows i0 .. i0 + nr - 1 of a slot (nr <= RB; U = 2: each with its up row,
// m rows on) against xs, as gemv_kernel forms each for one token: part p of
// S takes the 8-element groups at (p*32 + lane)*8 + j*256*S in order of j,
// each part's sum is reduced by the shuffle tree, and the parts are added
// in order.  The RB x U x S sums are independent chains, interleaved here
// (gemv_kernel spreads them over warps instead): one warp keeps several
// FMAs in flight.  Every lane returns the totals in v.
template <typename T, int S, int RB, int U>
__device__ __forceinline__ void group_sums(const T *rows, int i0, int nr, int m, const T *xs, int K, int lane,
                                           float (*v)[2])
{
    float acc[RB][U][S];
#pragma unroll
    for (int r = 0; r < RB; r++)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int p = 0; p < S; p++) acc[r][u][p] = 0;
    const int steps = (K + 256 * S - 1) / (256 * S);
#pragma unroll 2
    for (int j = 0; j < steps; j++) {
#pragma unroll
        for (int p = 0; p < S; p++) {
            const int k = (p * 32 + lane) * 8 + j * 256 * S;
            if (k >= K) continue;
            float xv[8];
            load_vec<T, 8>(xs + k, xv);
#pragma unroll
            for (int r = 0; r < RB; r++) {
                if (r >= nr) break;
#pragma unroll
                for (int u = 0; u < U; u++) {
                    float a[8];
                    load_vec<T, 8>(rows + (size_t)(u * m + i0 + r) * K + k, a);
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[r][u][p] += a[e] * xv[e];
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RB; r++)
#pragma unroll
        for (int u = 0; u < U; u++) {
            float t = warp_sum(acc[r][u][0]);
#pragma unroll
            for (int p = 1; p < S; p++) t += warp_sum(acc[r][u][p]);
            v[r][u] = t;
        }
}

// Rows in a group: about eight chains a warp, at most four rows.
__host__ __device__ __forceinline__ int group_rows(int S, int U, int cap)
{
    int rb = 8 / (S * U);
    if (rb > cap) rb = cap;
    return rb >= 4 ? 4 : rb >= 2 ? 2 : 1;
}

template <typename T, int S, int U>
__device__ __forceinline__ void group_dispatch_rb(const T *rows, int i0, int nr, int m, const T *xs, int K, int lane,
                                                  float (*v)[2], int cap)
{
    switch (group_rows(S, U, cap)) {
    case 4: group_sums<T, S, 4, U>(rows, i0, nr, m, xs, K, lane, v); break;
    case 2: group_sums<T, S, 2, U>(rows, i0, nr, m, xs, K, lane, v); break;
    default: group_sums<T, S, 1, U>(rows, i0, nr, m, xs, K, lane, v); break;
    }
}

template <typename T, int U>
__device__ __forceinline__ void group_dispatch(const T *rows, int i0, int nr, int m, const T *xs, int K, int S,
                                               int lane, float (*v)[2], int cap)
{
    switch (S) {
    case 1: group_dispatch_rb<T, 1, U>(rows, i0, nr, m, xs, K, lane, v, cap); break;
    case 2: group_dispatch_rb<T, 2, U>(rows, i0, nr, m, xs, K, lane, v, cap); break;
    case 4: group_dispatch_rb<T, 4, U>(rows, i0, nr, m, xs, K, lane, v, cap); break;
    default: group_dispatch_rb<T, 8, U>(rows, i0, nr, m, xs, K, lane, v, cap); break;
    }
}

// xs = x / rms(x) * w as T (D elements): rmsnorm_kernel's sums replayed for
// its block of nt threads (thread i sums elements i, i + nt, ... in double,
// each warp's 32 by the shuffle tree, then the warps' sums likewise).
template <typename T>
__device__ void norm_into(T *xs, const float *x, const float *w, int D, float eps, int nt, double *red, float *scale)
{
    const int ct = threadIdx.x - 32, cw = ct >> 5, lane = ct & 31, nw = nt / 32;
    for (int vw = cw; vw < nw; vw += MG_NC) {
        double s = 0;
        for (int i = vw * 32 + lane; i < D; i += nt) {
            const float xi = __ldcg(x + i);
            s += (double)xi * xi;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) red[vw] = s;
    }
    consumers_sync();
    if (cw == 0) {
        double v = lane < nw ? red[lane] : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) *scale = (float)(1.0 / sqrt(v / D + eps));
    }
    consumers_sync();
    const float sc = *scale;
    for (int i = ct; i < D; i += MG_NC * 32) xs[i] = fromf<T>((__ldcg(x + i) * sc) * w[i]);
}

// ---- the kernel ----------------------------------------------------------------------------

template <typename T> __global__ void __launch_bounds__(MG_WARPS * 32, 1) mega_kernel(qk_mpass P)
{
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ double red[32];
    __shared__ float scale;
    uint64_t *full = (uint64_t *)sm, *empty = full + MG_MAX_NS;
    unsigned char *ring = sm + MG_HEAD;
    T *xs = (T *)(ring + (size_t)P.ns * P.slot);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, esz = (int)sizeof(T);
    if (threadIdx.x == 0) {
        for (int i = 0; i < P.ns; i++) {
            mb_init(&full[i], P.dbg & 16 ? 32 : 1);
            mb_init(&empty[i], MG_NC);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == 0) { // the loader: every stage's rows, slot after slot
        const bool lanes = P.dbg & 16; // the whole warp with 16-byte cp.async, not one bulk copy
        if (!lanes && lane != 0) return;
        int it = 0;
        for (int si = 0; si < P.n; si++) {
            const qk_mstage &s = P.st[si];
            const mg_span sp = stage_span(s, P.slot, esz, P.dbg & 32);
            const size_t rb = (size_t)s.K * esz;
            for (int c = 0; c < sp.nch; c++, it++) {
                const int slot = it % P.ns;
                int r0, m;
                chunk_at(sp, c, &r0, &m);
                if (it >= P.ns) mb_wait(&empty[slot], (unsigned)(it / P.ns - 1) & 1, P.dbg & 2);
                unsigned char *dst = ring + (size_t)slot * P.slot;
                const unsigned char *W = (const unsigned char *)s.W;
                if (lanes) {
                    const size_t part = m * rb;
                    for (int h = 0; h < (s.swiglu ? 2 : 1); h++) {
                        const unsigned char *src = W + ((size_t)(h ? s.N : 0) + r0) * rb;
                        for (size_t o = (size_t)lane * 16; o < part; o += 512)
                            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst + h * part + o)),
                                         "l"(src + o)
                                         : "memory");
                    }
                    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(&full[slot]))
                                 : "memory");
                    continue;
                }
                mb_expect_tx(&full[slot], (unsigned)(m * rb * (s.swiglu ? 2 : 1)));
                bulk_load(dst, W + r0 * rb, (unsigned)(m * rb), &full[slot]);
                if (s.swiglu) bulk_load(dst + m * rb, W + ((size_t)s.N + r0) * rb, (unsigned)(m * rb), &full[slot]);
            }
        }
        if (lanes) asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }

    const int cw = warp - 1, ct = threadIdx.x - 32;
    int it = 0;
    for (int si = 0; si < P.n; si++) {
        const qk_mstage &s = P.st[si];
        if (si == 0) pdl_wait();
        else if (!(P.dbg & 8)) grid_sync(P.bar);
        if (s.in) {
            const uint4 *src = (const uint4 *)s.in;
            for (int i = ct; i < s.K / 8; i += MG_NC * 32) ((uint4 *)xs)[i] = __ldcg(src + i);
        } else {
            norm_into<T>(xs, P.x, s.norm_w, s.K, P.eps, P.norm_threads, red, &scale);
        }
        consumers_sync();
        const mg_span sp = stage_span(s, P.slot, esz, P.dbg & 32);
        const int U = s.swiglu ? 2 : 1, RB = group_rows(s.S, U, P.rb);
        int gbase = 0; // groups of the stage before this chunk
        for (int c = 0; c < sp.nch; c++, it++) {
            const int slot = it % P.ns;
            int r0, m;
            chunk_at(sp, c, &r0, &m);
            const int ng = (m + RB - 1) / RB;
            mb_wait(&full[slot], (unsigned)(it / P.ns) & 1, P.dbg & 4);
            const T *rows = (const T *)(ring + (size_t)slot * P.slot);
            // Group g of the stage goes to warp g % MG_NC, so that chunks of
            // one group (long rows) spread over the warps too.
            for (int g = (cw - gbase % MG_NC + MG_NC) % MG_NC; g < ng && !(P.dbg & 1); g += MG_NC) {
                const int i0 = g * RB, nr = m - i0 < RB ? m - i0 : RB;
                float v[4][2] = {};
                if (s.swiglu) group_dispatch<T, 2>(rows, i0, nr, m, xs, s.K, s.S, lane, v, P.rb);
                else group_dispatch<T, 1>(rows, i0, nr, m, xs, s.K, s.S, lane, v, P.rb);
                if (lane < nr) {
                    float vg = v[0][0], vu = v[0][1];
#pragma unroll
                    for (int r = 1; r < 4; r++)
                        if (lane == r) vg = v[r][0], vu = v[r][1];
                    const int row = r0 + i0 + lane;
                    if (s.swiglu) ((T *)s.h)[row] = fromf<T>(vg / (1.0f + expf(-vg)) * vu);
                    else s.y[row] = s.resid ? vg + __ldcg(s.y + row) : vg;
                }
            }
            gbase += ng;
            __syncwarp();
            if (lane == 0) mb_arrive(&empty[slot]);
        }
    }
}

// ---- host side --------------------------------------------------------------------------

template <typename T> int qk_mega_config(int max_unit_bytes, int xs_elems, int *slot, int *ns, size_t *smem)
{
    const int xs = ((xs_elems * (int)sizeof(T)) + 127) / 128 * 128;
    const char *se = getenv("QUIRE_CUDA_MEGA_SLOT");
    int sl = se && atoi(se) >= 4096 ? atoi(se) / 1024 * 1024 : 32 * 1024;
    if (max_unit_bytes > sl) sl = (max_unit_bytes + 1023) / 1024 * 1024;
    int n = (MG_SMEM - MG_HEAD - xs) / sl;
    if (n > MG_MAX_NS) n = MG_MAX_NS;
    if (n < 3) return QERR_UNSUPPORTED;
    const size_t bytes = MG_HEAD + (size_t)n * sl + xs;
    int dev = 0, optin = 0, major = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 9 || (size_t)optin < bytes + 1024) return QERR_UNSUPPORTED;
    CK(cudaFuncSetAttribute(mega_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mega_kernel<T>, MG_WARPS * 32, bytes));
    if (per_sm < 1) return QERR_UNSUPPORTED;
    *slot = sl;
    *ns = n;
    *smem = bytes;
    return 0;
}

template <typename T> int qk_mega(cudaStream_t st, const qk_mpass *P, int n_blocks, size_t smem)
{
    if (P->n < 1 || P->n > QK_MEGA_STAGES || P->ns < 1 || P->ns > MG_MAX_NS) return QERR_INVAL;
    qk_launch(mega_kernel<T>, n_blocks, MG_WARPS * 32, smem, st, *P);
    CK_LAUNCH("mega");
    return 0;
}

template int qk_mega_config<bf16>(int, int, int *, int *, size_t *);
template int qk_mega_config<__half>(int, int, int *, int *, size_t *);
template int qk_mega<bf16>(cudaStream_t, const qk_mpass *, int, size_t);
template int qk_mega<__half>(cudaStream_t, const qk_mpass *, int, size_t);
template <> int qk_mega<float>(cudaStream_t, const qk_mpass *, int, size_t) { return QERR_UNSUPPORTED; }
