// cuda_attn.cu - paged attention on the GPU.
//
// Decode (and any token whose sequence has a single new token): one block
// of 4 warps per (token, KV head, split).  The query heads that share the KV
// head (GQA) are handled together, so K and V are read once for all of
// them.  For the scores each lane takes one key position (a K row read
// through the block table, vectorised); for the value sum each lane takes
// DPL consecutive dimensions and the 32 probabilities of the step are
// broadcast by shuffles.  The softmax is online (running max and sum).
// Long contexts are split over blocks (split_len positions each) whose
// partial maxima, sums and accumulators a second kernel combines.
//
// Prefill (chunks of several tokens of one sequence): flash attention with
// tensor cores (WMMA, bf16/f16 inputs, float accumulation), 64 queries by
// 64 keys per step, the causal mask applied per element, the cached prefix
// read through the block table like the new keys.
#include <math.h>
#include <mma.h>

#include "cuda_kernels.cuh"

using namespace nvcuda;

#define DEC_WARPS 4

template <typename T, int DPL, int MAXG>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    attn_decode_kernel(const T *__restrict__ q, const T *__restrict__ kc, const T *__restrict__ vc, qattn_geom g,
                       const int32_t *__restrict__ tok_list, int split_len, int n_split, float *part_acc,
                       float *part_ml, T *out)
{
    constexpr int HDMAX = 32 * DPL;
    __shared__ float qs[MAXG][HDMAX];
    __shared__ float wm[DEC_WARPS][MAXG], wl[DEC_WARPS][MAXG];
    __shared__ float sacc[MAXG][HDMAX];
    const int i = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z;
    const int t = tok_list[i], G = g.H / g.KV, hd = g.hd;
    const int ctx = g.pos[t] + 1;
    const int p0 = sp * split_len, p1 = min(ctx, p0 + split_len);
    const int32_t *tab = g.tables + g.seq_info[2 * g.seq[t]];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    for (int idx = threadIdx.x; idx < MAXG * HDMAX; idx += blockDim.x) {
        const int gi = idx / HDMAX, d = idx % HDMAX;
        float v = 0;
        if (gi < G && d < hd) v = tof(q[(size_t)t * g.H * hd + (size_t)(kvh * G + gi) * hd + d]) * g.scale;
        qs[gi][d] = v;
        sacc[gi][d] = 0;
    }
    __syncthreads();

    float m[MAXG], l[MAXG], acc[MAXG][DPL];
#pragma unroll
    for (int gi = 0; gi < MAXG; gi++) {
        m[gi] = -INFINITY;
        l[gi] = 0;
#pragma unroll
        for (int k = 0; k < DPL; k++) acc[gi][k] = 0;
    }
    const size_t head_off = (size_t)kvh * g.bs * hd;
    const bool vec8 = (hd % 8) == 0;
    for (int base = p0 + warp * 32; base < p1; base += DEC_WARPS * 32) {
        const int p = base + lane;
        const bool valid = p < p1;
        float s[MAXG];
#pragma unroll
        for (int gi = 0; gi < MAXG; gi++) s[gi] = 0;
        if (valid) {
            const T *kp = kc + (size_t)tab[p / g.bs] * g.block_elems + head_off + (size_t)(p % g.bs) * hd;
            if (vec8) {
                for (int d = 0; d < hd; d += 8) {
                    float kv[8];
                    load_vec<T, 8>(kp + d, kv);
#pragma unroll
                    for (int gi = 0; gi < MAXG; gi++)
                        if (gi < G) {
#pragma unroll
                            for (int e = 0; e < 8; e++) s[gi] += qs[gi][d + e] * kv[e];
                        }
                }
            } else {
                for (int d = 0; d < hd; d++) {
                    const float kv = tof(kp[d]);
#pragma unroll
                    for (int gi = 0; gi < MAXG; gi++)
                        if (gi < G) s[gi] += qs[gi][d] * kv;
                }
            }
        }
#pragma unroll
        for (int gi = 0; gi < MAXG; gi++) {
            if (gi >= G) break;
            const float sv = valid ? s[gi] : -INFINITY;
            const float mnew = fmaxf(m[gi], warp_max(sv)); // lane 0 is always valid: finite
            const float alpha = __expf(m[gi] - mnew);
            const float pr = valid ? __expf(sv - mnew) : 0.0f;
            l[gi] = l[gi] * alpha + warp_sum(pr);
#pragma unroll
            for (int k = 0; k < DPL; k++) acc[gi][k] *= alpha;
            m[gi] = mnew;
            s[gi] = pr;
        }
        const int nvalid = min(32, p1 - base);
        const int d0 = lane * DPL;
        for (int j = 0; j < nvalid; j++) {
            const int pj = base + j;
            const T *vp = vc + (size_t)tab[pj / g.bs] * g.block_elems + head_off + (size_t)(pj % g.bs) * hd;
            float v[DPL];
            if (d0 + DPL <= hd && (hd % DPL) == 0) {
                load_vec<T, DPL>(vp + d0, v);
            } else {
#pragma unroll
                for (int k = 0; k < DPL; k++) v[k] = d0 + k < hd ? tof(vp[d0 + k]) : 0.0f;
            }
#pragma unroll
            for (int gi = 0; gi < MAXG; gi++) {
                const float pg = __shfl_sync(0xffffffffu, s[gi], j);
#pragma unroll
                for (int k = 0; k < DPL; k++) acc[gi][k] += pg * v[k];
            }
        }
    }
    // Combine the warps: a common maximum, then scaled sums into shared memory.
    if (lane == 0) {
#pragma unroll
        for (int gi = 0; gi < MAXG; gi++) {
            wm[warp][gi] = m[gi];
            wl[warp][gi] = l[gi];
        }
    }
    __syncthreads();
#pragma unroll
    for (int gi = 0; gi < MAXG; gi++) {
        if (gi >= G) break;
        float M = -INFINITY;
        for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, wm[w][gi]);
        const float f = m[gi] == -INFINITY ? 0.0f : __expf(m[gi] - M);
#pragma unroll
        for (int k = 0; k < DPL; k++)
            if (lane * DPL + k < hd) atomicAdd(&sacc[gi][lane * DPL + k], acc[gi][k] * f);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * hd; idx += blockDim.x) {
        const int gi = idx / hd, d = idx % hd;
        float M = -INFINITY, L = 0;
        for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, wm[w][gi]);
        for (int w = 0; w < DEC_WARPS; w++)
            if (wm[w][gi] != -INFINITY) L += wl[w][gi] * __expf(wm[w][gi] - M);
        const int h = kvh * G + gi;
        if (n_split == 1) {
            out[(size_t)t * g.H * hd + (size_t)h * hd + d] = fromf<T>(sacc[gi][d] / L);
        } else {
            const size_t slot = ((size_t)i * g.H + h) * n_split + sp;
            part_acc[slot * hd + d] = sacc[gi][d];
            if (d == 0) {
                part_ml[2 * slot] = M;
                part_ml[2 * slot + 1] = L;
            }
        }
    }
}

// One block per (token, head): combines the splits' partial results.
template <typename T>
__global__ void attn_reduce_kernel(const float *part_acc, const float *part_ml, const int32_t *tok_list, int H, int hd,
                                   int n_split, T *out)
{
    const int i = blockIdx.x, h = blockIdx.y, t = tok_list[i];
    const size_t slot0 = ((size_t)i * H + h) * n_split;
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, part_ml[2 * (slot0 + s)]);
    float L = 0;
    for (int s = 0; s < n_split; s++) {
        const float ms = part_ml[2 * (slot0 + s)];
        if (ms != -INFINITY) L += part_ml[2 * (slot0 + s) + 1] * __expf(ms - M);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0;
        for (int s = 0; s < n_split; s++) {
            const float ms = part_ml[2 * (slot0 + s)];
            if (ms != -INFINITY) a += part_acc[(slot0 + s) * hd + d] * __expf(ms - M);
        }
        out[(size_t)t * H * hd + (size_t)h * hd + d] = fromf<T>(a / L);
    }
}

template <typename T, int DPL, int MAXG>
static int decode_launch(cudaStream_t st, const T *q, const T *kc, const T *vc, const qattn_geom *g,
                         const int32_t *tok_list, int n, int n_split, int split_len, float *part_acc, float *part_ml,
                         T *out)
{
    dim3 grid(n, g->KV, n_split);
    attn_decode_kernel<T, DPL, MAXG>
        <<<grid, DEC_WARPS * 32, 0, st>>>(q, kc, vc, *g, tok_list, split_len, n_split, part_acc, part_ml, out);
    CK_LAUNCH("attn_decode");
    if (n_split > 1) {
        attn_reduce_kernel<T><<<dim3(n, g->H), 128, 0, st>>>(part_acc, part_ml, tok_list, g->H, g->hd, n_split, out);
        CK_LAUNCH("attn_reduce");
    }
    return 0;
}

template <typename T, int DPL>
static int decode_dispatch_g(cudaStream_t st, const T *q, const T *kc, const T *vc, const qattn_geom *g,
                             const int32_t *tok_list, int n, int n_split, int split_len, float *pa, float *pm, T *out)
{
    const int G = g->H / g->KV;
    if (G <= 4) return decode_launch<T, DPL, 4>(st, q, kc, vc, g, tok_list, n, n_split, split_len, pa, pm, out);
    if (G <= 8) return decode_launch<T, DPL, 8>(st, q, kc, vc, g, tok_list, n, n_split, split_len, pa, pm, out);
    if (G <= 16) return decode_launch<T, DPL, 16>(st, q, kc, vc, g, tok_list, n, n_split, split_len, pa, pm, out);
    return QERR_UNSUPPORTED;
}

template <typename T>
int qk_attn_decode(cudaStream_t st, const T *q, const T *kc, const T *vc, const qattn_geom *g, const int32_t *tok_list,
                   int n, int n_split, int split_len, float *part_acc, float *part_ml, T *out)
{
    if (n <= 0) return 0;
    const int hd = g->hd;
    if (hd <= 32) return decode_dispatch_g<T, 1>(st, q, kc, vc, g, tok_list, n, n_split, split_len, part_acc, part_ml, out);
    if (hd <= 64) return decode_dispatch_g<T, 2>(st, q, kc, vc, g, tok_list, n, n_split, split_len, part_acc, part_ml, out);
    if (hd <= 128)
        return decode_dispatch_g<T, 4>(st, q, kc, vc, g, tok_list, n, n_split, split_len, part_acc, part_ml, out);
    if (hd <= 256)
        return decode_dispatch_g<T, 8>(st, q, kc, vc, g, tok_list, n, n_split, split_len, part_acc, part_ml, out);
    return QERR_UNSUPPORTED;
}

// ---- prefill: flash attention with WMMA ---------------------------------------------

#define PF_BM 64
#define PF_BN 64

template <int HD> struct pf_layout {
    static constexpr int LDT = HD + 8;     // Q/K/V rows (16-bit elements)
    static constexpr int LDS = PF_BN + 4;  // scores (float)
    static constexpr int LDP = PF_BN + 8;  // probabilities (16-bit)
    static constexpr int LDO = HD + 4;     // output accumulator (float)
    static constexpr size_t q_off = 0;
    static constexpr size_t k_off = q_off + (size_t)PF_BM * LDT * 2;
    static constexpr size_t v_off = k_off + (size_t)PF_BN * LDT * 2;
    static constexpr size_t s_off = v_off + (size_t)PF_BN * LDT * 2;
    static constexpr size_t p_off = s_off + (size_t)PF_BM * LDS * 4;
    static constexpr size_t o_off = p_off + (size_t)PF_BM * LDP * 2;
    static constexpr size_t r_off = o_off + (size_t)PF_BM * LDO * 4;
    static constexpr size_t bytes = r_off + 3 * PF_BM * 4;
};

// Copies 8 16-bit elements.
__device__ __forceinline__ void copy8(void *dst, const void *src) { *(uint4 *)dst = *(const uint4 *)src; }

template <typename T, int HD>
__global__ void __launch_bounds__(128) attn_prefill_kernel(const T *__restrict__ q, const T *__restrict__ kc,
                                                           const T *__restrict__ vc, qattn_geom g,
                                                           const int4 *__restrict__ tiles, T *out)
{
    typedef pf_layout<HD> Lay;
    extern __shared__ __align__(128) unsigned char smem[];
    T *Qs = (T *)(smem + Lay::q_off), *Ks = (T *)(smem + Lay::k_off), *Vs = (T *)(smem + Lay::v_off);
    float *S = (float *)(smem + Lay::s_off), *O = (float *)(smem + Lay::o_off);
    T *P = (T *)(smem + Lay::p_off);
    float *rm = (float *)(smem + Lay::r_off), *rl = rm + PF_BM, *ra = rl + PF_BM;

    const int4 tile = tiles[blockIdx.x];
    const int t0 = tile.x, nq = tile.y, h = blockIdx.y, kvh = h / (g.H / g.KV);
    const int pos0 = g.pos[t0], n_keys = pos0 + nq;
    const int32_t *tab = g.tables + g.seq_info[2 * tile.z];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr int CH = HD / 8; // 16-byte chunks per row

    const uint4 zero4 = make_uint4(0, 0, 0, 0);
    for (int idx = threadIdx.x; idx < PF_BM * CH; idx += blockDim.x) {
        const int r = idx / CH, c = (idx % CH) * 8;
        if (r < nq) copy8(Qs + r * Lay::LDT + c, q + (size_t)(t0 + r) * g.H * HD + (size_t)h * HD + c);
        else *(uint4 *)(Qs + r * Lay::LDT + c) = zero4;
    }
    for (int idx = threadIdx.x; idx < PF_BM * HD; idx += blockDim.x) O[(idx / HD) * Lay::LDO + idx % HD] = 0;
    if (threadIdx.x < PF_BM) {
        rm[threadIdx.x] = -INFINITY;
        rl[threadIdx.x] = 0;
    }
    const size_t head_off = (size_t)kvh * g.bs * HD;

    for (int kb = 0; kb < n_keys; kb += PF_BN) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < PF_BN * CH; idx += blockDim.x) {
            const int r = idx / CH, c = (idx % CH) * 8, p = kb + r;
            if (p < n_keys) {
                const size_t off = (size_t)tab[p / g.bs] * g.block_elems + head_off + (size_t)(p % g.bs) * HD + c;
                copy8(Ks + r * Lay::LDT + c, kc + off);
                copy8(Vs + r * Lay::LDT + c, vc + off);
            } else {
                *(uint4 *)(Ks + r * Lay::LDT + c) = zero4;
                *(uint4 *)(Vs + r * Lay::LDT + c) = zero4;
            }
        }
        __syncthreads();
        // S = Q K^T for this warp's 16 rows.
        for (int nt = 0; nt < PF_BN / 16; nt++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
                wmma::load_matrix_sync(a, Qs + warp * 16 * Lay::LDT + kk * 16, Lay::LDT);
                wmma::load_matrix_sync(b, Ks + nt * 16 * Lay::LDT + kk * 16, Lay::LDT);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(S + warp * 16 * Lay::LDS + nt * 16, acc, Lay::LDS, wmma::mem_row_major);
        }
        __syncwarp();
        // Online softmax: two lanes per row, 32 columns each.
        {
            const int r = warp * 16 + (lane >> 1), c0 = (lane & 1) * 32;
            const int qpos = pos0 + r;
            float *srow = S + r * Lay::LDS;
            float mx = -INFINITY;
            for (int c = c0; c < c0 + 32; c++) {
                const int key = kb + c;
                float sv = (r < nq && key <= qpos) ? srow[c] * g.scale : -INFINITY;
                srow[c] = sv;
                mx = fmaxf(mx, sv);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            const float mold = rm[r];
            float mnew = fmaxf(mold, mx);
            if (mnew == -INFINITY) mnew = 0; // a padding row, or no visible key yet
            const float alpha = mold == -INFINITY ? 0.0f : __expf(mold - mnew);
            float sum = 0;
            T *prow = P + r * Lay::LDP;
            for (int c = c0; c < c0 + 32; c++) {
                const float pv = srow[c] == -INFINITY ? 0.0f : __expf(srow[c] - mnew);
                const T pt = fromf<T>(pv);
                prow[c] = pt;
                sum += tof(pt);
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            __syncwarp();
            if ((lane & 1) == 0) {
                rl[r] = rl[r] * alpha + sum;
                rm[r] = mold == -INFINITY && mx == -INFINITY ? -INFINITY : mnew;
                ra[r] = alpha;
            }
        }
        __syncwarp();
        for (int idx = lane; idx < 16 * HD; idx += 32) {
            const int r = warp * 16 + idx / HD;
            O[r * Lay::LDO + idx % HD] *= ra[r];
        }
        __syncwarp();
        // O += P V for this warp's rows.
        for (int nt = 0; nt < HD / 16; nt++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            float *op = O + warp * 16 * Lay::LDO + nt * 16;
            wmma::load_matrix_sync(acc, op, Lay::LDO, wmma::mem_row_major);
#pragma unroll
            for (int kk = 0; kk < PF_BN / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
                wmma::load_matrix_sync(a, P + warp * 16 * Lay::LDP + kk * 16, Lay::LDP);
                wmma::load_matrix_sync(b, Vs + kk * 16 * Lay::LDT + nt * 16, Lay::LDT);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(op, acc, Lay::LDO, wmma::mem_row_major);
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < nq * HD; idx += blockDim.x) {
        const int r = idx / HD, d = idx % HD;
        out[(size_t)(t0 + r) * g.H * HD + (size_t)h * HD + d] = fromf<T>(O[r * Lay::LDO + d] / rl[r]);
    }
}

bool qk_attn_prefill_ok(int elem_bytes, int hd) { return elem_bytes == 2 && (hd == 64 || hd == 128); }

template <typename T, int HD>
static int prefill_launch(cudaStream_t st, const T *q, const T *kc, const T *vc, const qattn_geom *g, const int4 *tiles,
                          int n_tiles, T *out)
{
    static bool attr_set = false; // per instantiation; the attribute is per function
    const size_t sh = pf_layout<HD>::bytes;
    if (!attr_set) {
        CK(cudaFuncSetAttribute(attn_prefill_kernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));
        attr_set = true;
    }
    attn_prefill_kernel<T, HD><<<dim3(n_tiles, g->H), 128, sh, st>>>(q, kc, vc, *g, tiles, out);
    CK_LAUNCH("attn_prefill");
    return 0;
}

template <typename T>
int qk_attn_prefill(cudaStream_t st, const T *q, const T *kc, const T *vc, const qattn_geom *g, const int4 *tiles,
                    int n_tiles, T *out)
{
    if (n_tiles <= 0) return 0;
    if (g->hd == 64) return prefill_launch<T, 64>(st, q, kc, vc, g, tiles, n_tiles, out);
    if (g->hd == 128) return prefill_launch<T, 128>(st, q, kc, vc, g, tiles, n_tiles, out);
    return QERR_UNSUPPORTED;
}

template <>
int qk_attn_prefill<float>(cudaStream_t, const float *, const float *, const float *, const qattn_geom *, const int4 *,
                           int n_tiles, float *)
{
    return n_tiles > 0 ? QERR_UNSUPPORTED : 0;
}

template int qk_attn_decode<float>(cudaStream_t, const float *, const float *, const float *, const qattn_geom *,
                                   const int32_t *, int, int, int, float *, float *, float *);
template int qk_attn_decode<bf16>(cudaStream_t, const bf16 *, const bf16 *, const bf16 *, const qattn_geom *,
                                  const int32_t *, int, int, int, float *, float *, bf16 *);
template int qk_attn_decode<__half>(cudaStream_t, const __half *, const __half *, const __half *, const qattn_geom *,
                                    const int32_t *, int, int, int, float *, float *, __half *);
template int qk_attn_prefill<bf16>(cudaStream_t, const bf16 *, const bf16 *, const bf16 *, const qattn_geom *,
                                   const int4 *, int, bf16 *);
template int qk_attn_prefill<__half>(cudaStream_t, const __half *, const __half *, const __half *, const qattn_geom *,
                                     const int4 *, int, __half *);
