// cuda_attn.cu - paged attention on the GPU.
//
// Decode (and any token whose sequence has a single new token): one block
// of 4 warps per (token, KV head, split).  The query heads that share the KV
// head (GQA) are handled together, so K and V are read once for all of
// them.  A warp takes 8 positions a step: four lanes score each position
// (a quarter of its K row each, summed by shuffles), and for the value sum
// each lane takes DPL consecutive dimensions of the 8 V rows, whose
// probabilities are broadcast by shuffles.  A lane issues its K and V
// loads of a step together, so a step is one round trip to memory and a
// short chain of instructions (the kernel is latency-bound at batch 1).
// The softmax is online (running max and sum).  Contexts are split over
// blocks (split_len positions each).  Up to 16 splits are the blocks of one
// thread-block cluster: each block reads the others' partial maxima, sums
// and accumulators from their shared memory and forms its share of the
// outputs, in split order.  More splits write their partials to global
// memory and the last block of a token and KV head to finish combines
// them, in the same order (the same bits).  Before waiting for the kernel
// before it, a block asks L2 for its first step's keys and values, which
// earlier passes wrote.  For steps where every sequence has one new
// token, the kernel also does rope_store's work for its token
// (qk_rope_in): the projections are read raw, and the split holding the
// new position stores its key and value before reading the cache.
//
// Prefill (chunks of several tokens of one sequence): flash attention with
// tensor cores (WMMA, bf16/f16 inputs, float accumulation), 64 queries by
// 64 keys per step, the causal mask applied per element, the cached prefix
// read through the block table like the new keys.
#include <cooperative_groups.h>
#include <math.h>
#include <mma.h>

#include <pthread.h>

#include "cuda_kernels.cuh"

using namespace nvcuda;
namespace cg = cooperative_groups;

#define DEC_WARPS 4
#define DEC_QL 4                    // lanes that score one position together
#define DEC_PW (32 / DEC_QL)        // positions a warp takes per step
#define DEC_MAX_SPLIT 64            // splits of one token's context, at most
#define DEC_MAX_CLUSTER 16          // splits combined through distributed shared memory, at most

int qk_attn_cluster = 1;
int qk_attn_prefetch = 0;
int qk_cluster_pad = 48, qk_cluster_pad_small = 112;

int qk_func_attrs(const void *fn, int smem, bool cluster)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static struct {
        const void *fn;
        int dev;
    } done[256];
    static int n_done;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return QERR_DEVICE;
    pthread_mutex_lock(&mu);
    bool seen = false;
    for (int k = 0; k < n_done && !seen; k++) seen = done[k].fn == fn && done[k].dev == dev;
    cudaError_t e = cudaSuccess;
    if (!seen) {
        if (cluster) e = cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        if (e == cudaSuccess) e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e == cudaSuccess && n_done < 256) done[n_done].fn = fn, done[n_done++].dev = dev;
    }
    pthread_mutex_unlock(&mu);
    if (e != cudaSuccess) QLOGE("cuda: setting a kernel's shared memory (%d bytes): %s", smem, cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : QERR_DEVICE;
}

// n bytes (2, 4, 8 or a multiple of 16) at p into words w.
template <int B> __device__ __forceinline__ void load_words(uint32_t *w, const void *p)
{
    if constexpr (B >= 16) {
#pragma unroll
        for (int i = 0; i < B / 16; i++) {
            const uint4 u = ((const uint4 *)p)[i];
            w[4 * i] = u.x, w[4 * i + 1] = u.y, w[4 * i + 2] = u.z, w[4 * i + 3] = u.w;
        }
    } else if constexpr (B == 8) {
        const uint2 u = *(const uint2 *)p;
        w[0] = u.x, w[1] = u.y;
    } else if constexpr (B == 4) {
        w[0] = *(const uint32_t *)p;
    } else {
        w[0] = *(const unsigned short *)p;
    }
}

// A block of a cluster with nothing to combine: its part in the cluster's
// two barriers.
__device__ __forceinline__ void cluster_leave()
{
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    cl.sync();
}

template <typename T, int DPL, int MAXG, bool ROPE, bool CL>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    attn_decode_kernel(const T *__restrict__ q, T *kc, T *vc, qattn_geom g, qk_rope_in rp,
                       const int32_t *__restrict__ tok_list, int split_len, int n_split, float *part_acc,
                       float *part_ml, int *part_cnt, T *out, int pf)
{
    constexpr int HDMAX = 32 * DPL;                    // the lanes' DPL dimensions cover the head
    constexpr int KQ = HDMAX / DEC_QL;                 // dimensions a lane scores
    constexpr int QST = KQ + 4;                        // their stride in shared memory (banks apart)
    constexpr int E = 16 / (int)sizeof(T);             // elements of a 16-byte load
    constexpr int KB = KQ * (int)sizeof(T);            // bytes of a lane's part of a K row
    constexpr int VB = DPL * (int)sizeof(T);           // bytes of a lane's part of a V row
    constexpr int EW = 4 / (int)sizeof(T) > 0 ? 4 / (int)sizeof(T) : 1; // elements a word
    constexpr int KW = KB / 4, VW = VB >= 4 ? VB / 4 : 1;
    constexpr int HP = HDMAX / 2;
    __shared__ __align__(16) float qs[MAXG][DEC_QL][QST];
    __shared__ float wm[DEC_WARPS][MAXG], wl[DEC_WARPS][MAXG], bm[MAXG], bl[MAXG];
    __shared__ float sm_[MAXG][DEC_MAX_SPLIT], sl_[MAXG][DEC_MAX_SPLIT]; // the last block's view of the splits
    __shared__ float hs[ROPE ? MAXG + 1 : 1]; // QK-norm: the query heads' and the key's 1 / rms
    // The warps' sums meet in one round where they fit (each warp's in its
    // own slot, added in warp order by the readers), else warp after warp
    // into one array.
    constexpr bool ONE_ROUND = DEC_WARPS * MAXG * HDMAX <= 4096;
    __shared__ float wacc[ONE_ROUND ? DEC_WARPS : 1][ONE_ROUND ? MAXG : 1][ONE_ROUND ? HDMAX : 1];
    __shared__ float sacc[ONE_ROUND && !CL ? 1 : MAXG][HDMAX];
    __shared__ int last;
    // Until pdl_wait, only what no kernel of the pass writes: the metadata,
    // copied before the pass.
    const int i = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z;
    const int t = tok_list[i], G = g.H / g.KV, hd = g.hd;
    const int pnew = g.pos[t], ctx = pnew + 1;
    // The positions it attends to: lo .. pnew (a local layer's window).
    const int lo = qk_window_lo(pnew, g.window);
    // This token's splits: the grid may have more (graphs are captured for
    // a bucketed count); the blocks past its context leave at once.
    // (With CL, the splits are the blocks of one cluster: every block takes
    // part in the cluster's two barriers, so those leave after them.)
    const int n_eff = (ctx - lo + split_len - 1) / split_len;
    if (sp >= n_eff) {
        if constexpr (CL) cluster_leave();
        return;
    }
    const int p0 = lo + sp * split_len, p1 = min(ctx, p0 + split_len);
    const int32_t *tab = g.tables + g.seq_info[2 * g.seq[t]];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t head_off = (size_t)kvh * g.bs * hd;
    const int qd = lane % DEC_QL, kd0 = qd * KQ;     // this lane's quarter of a K row
    const bool kvec = hd % E == 0;                   // 16-byte pieces lie wholly inside the head
    const int d0 = lane * DPL;                       // this lane's dimensions of a V row
    const bool vvec = hd % DPL == 0, vlane = d0 < hd;
    if (pf) {
        // The keys and values of the warp's first step were written by
        // earlier passes (all but the new position's, stored below): they
        // head for L2 while the kernel before this one finishes.
        const int pp = min(p0 + warp * DEC_PW + lane / DEC_QL, p1 - 1);
        const size_t row = (size_t)tab[pp / g.bs] * g.block_elems + head_off + (size_t)(pp % g.bs) * hd;
        for (int e = kd0; e < kd0 + KQ && e < hd; e += 32 / (int)sizeof(T)) {
            prefetch_l2(kc + row + e);
            prefetch_l2(vc + row + e);
        }
    }
    pdl_wait();
#define QS(gi, d) qs[gi][(d) / KQ][(d) % KQ]

    if (ROPE) {
        // The token's query heads and, in the split that holds its position,
        // its key and value: bias added, rotated and rounded to T exactly as
        // rope_store_kernel does, in one pass from the raw projections; the
        // key and value go to the cache.
        const bool own = sp == n_eff - 1;
        const int W = (g.H + 2 * g.KV) * hd, half = rp.rope_dim / 2;
        const float *src = rp.qkv + (size_t)t * W, *bias = rp.bias;
        const size_t off =
            own ? (size_t)tab[pnew / g.bs] * g.block_elems + ((size_t)kvh * g.bs + pnew % g.bs) * hd : 0;
        // The column of head h's dimension d (h = MAXG: the key head).
#define HCOL(h, d) (((h) < MAXG ? (kvh * G + (h)) * hd : (g.H + kvh) * hd) + (d))
        if (rp.qn) {
            // QK-norm as rope_store_kernel does it: a warp per head, the
            // squares of the biased projections summed in double.
            for (int h = warp; h <= MAXG; h += DEC_WARPS) {
                if ((h < MAXG && h >= G) || (h == MAXG && !own)) continue;
                double s = 0;
                for (int d = lane; d < hd; d += 32) {
                    const float x = src[HCOL(h, d)] + (bias ? bias[HCOL(h, d)] : 0.0f);
                    s += (double)x * x;
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                if (lane == 0) hs[h] = (float)(1.0 / sqrt(s / hd + rp.eps));
            }
            __syncthreads();
        }
        // A query or key element as rope_store_kernel has it before rotation.
        auto qk_in = [&](int h, int d) {
            const float x = src[HCOL(h, d)] + (bias ? bias[HCOL(h, d)] : 0.0f);
            return rp.qn ? (x * hs[h]) * (h < MAXG ? rp.qn[d] : rp.kn[d]) : x;
        };
        // Rotated pairs of the G query heads and (own) the key head (h = MAXG).
        for (int idx = threadIdx.x; idx < (MAXG + 1) * HP; idx += blockDim.x) {
            const int h = idx / HP, j = idx % HP;
            if (j >= half || (h < MAXG && h >= G) || (h == MAXG && !own)) continue;
            const int a = rp.neox ? j : 2 * j, b = rp.neox ? j + half : 2 * j + 1;
            float x0 = qk_in(h, a), x1 = qk_in(h, b);
            qk_rotate(&x0, &x1, pnew, rp.inv_freq[j], rp.mscale);
            const T r0 = fromf<T>(x0), r1 = fromf<T>(x1);
            if (h < MAXG) {
                QS(h, a) = tof(r0) * g.scale;
                QS(h, b) = tof(r1) * g.scale;
            } else {
                kc[off + a] = r0;
                kc[off + b] = r1;
            }
        }
        // The other dimensions: past rope_dim of the query heads and the key
        // (h = MAXG), and all of the value (h = MAXG + 1).
        for (int idx = threadIdx.x; idx < (MAXG + 2) * HDMAX; idx += blockDim.x) {
            const int h = idx / HDMAX, d = idx % HDMAX;
            if (d >= hd || (h < MAXG && h >= G) || (h >= MAXG && !own) || (h <= MAXG && d < rp.rope_dim)) continue;
            const int c = (g.H + g.KV + kvh) * hd + d; // (the value's column)
            const T r = fromf<T>(h <= MAXG ? qk_in(h, d) : src[c] + (bias ? bias[c] : 0.0f));
            if (h < MAXG) QS(h, d) = tof(r) * g.scale;
            else (h == MAXG ? kc : vc)[off + d] = r;
        }
#undef HCOL
    } else {
        for (int idx = threadIdx.x; idx < MAXG * HDMAX; idx += blockDim.x) {
            const int gi = idx / HDMAX, d = idx % HDMAX;
            float v = 0;
            if (gi < G && d < hd) v = tof(q[(size_t)t * g.H * hd + (size_t)(kvh * G + gi) * hd + d]) * g.scale;
            QS(gi, d) = v;
        }
    }
    if constexpr (!ONE_ROUND)
        for (int idx = threadIdx.x; idx < MAXG * HDMAX; idx += blockDim.x) sacc[idx / HDMAX][idx % HDMAX] = 0;
    __syncthreads(); // (the cache stores above are seen by the loads below)

    float m[MAXG], l[MAXG], acc[MAXG][DPL];
#pragma unroll
    for (int gi = 0; gi < MAXG; gi++) {
        m[gi] = -INFINITY;
        l[gi] = 0;
#pragma unroll
        for (int k = 0; k < DPL; k++) acc[gi][k] = 0;
    }
    for (int base = p0 + warp * DEC_PW; base < p1; base += DEC_WARPS * DEC_PW) {
        const int p = base + lane / DEC_QL;
        const bool valid = p < p1;
        // This lane's row (a valid one for lanes past the end: their weight is 0).
        const int pr = valid ? p : p1 - 1;
        const long long row = (long long)tab[pr / g.bs] * (long long)g.block_elems + (long long)head_off +
                              (long long)(pr % g.bs) * hd;
        // One round trip a step: a quarter of this lane's K row and this lane's
        // dimensions of the step's V rows, all issued before any is used.
        uint32_t kw[KW], vw[DEC_PW][VW];
        if (kvec) {
#pragma unroll
            for (int j = 0; j < KB / 16; j++)
                if (kd0 + j * E < hd) load_words<16>(kw + 4 * j, kc + row + kd0 + j * E);
        }
#pragma unroll
        for (int j = 0; j < DEC_PW; j++) {
            const long long rj = __shfl_sync(0xffffffffu, row, j * DEC_QL);
            if (vvec && vlane) load_words<VB>(vw[j], vc + rj + d0);
        }
        float s[MAXG];
#pragma unroll
        for (int gi = 0; gi < MAXG; gi++) s[gi] = 0;
        if (kvec) {
#pragma unroll
            for (int j = 0; j < KB / 16; j++) {
                if (kd0 + j * E >= hd) break;
#pragma unroll
                for (int e = 0; e < E; e++) {
                    const float kv = word_elem<T>(kw[4 * j + e / EW], e % EW);
#pragma unroll
                    for (int gi = 0; gi < MAXG; gi++)
                        if (gi < G) s[gi] += qs[gi][qd][j * E + e] * kv;
                }
            }
        } else {
            for (int e = 0; e < KQ && kd0 + e < hd; e++) {
                const float kv = tof(kc[row + kd0 + e]);
#pragma unroll
                for (int gi = 0; gi < MAXG; gi++)
                    if (gi < G) s[gi] += qs[gi][qd][e] * kv;
            }
        }
        // The quarters' sums, then the online softmax over the step's 8
        // positions (lanes xor 4, 8, 16 hold the other positions).
#pragma unroll
        for (int gi = 0; gi < MAXG; gi++) {
            if (gi >= G) break;
            float sv = s[gi];
            sv += __shfl_xor_sync(0xffffffffu, sv, 1);
            sv += __shfl_xor_sync(0xffffffffu, sv, 2);
            if (g.softcap > 0) sv = g.softcap * tanhf(sv / g.softcap);
            sv = valid ? sv : -INFINITY;
            float mx = sv;
#pragma unroll
            for (int o = DEC_QL; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float mnew = fmaxf(m[gi], mx); // the step's first position is valid: finite
            const float alpha = __expf(m[gi] - mnew);
            const float pw = valid ? __expf(sv - mnew) : 0.0f;
            float sum = pw;
#pragma unroll
            for (int o = DEC_QL; o < 32; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            l[gi] = l[gi] * alpha + sum;
#pragma unroll
            for (int k = 0; k < DPL; k++) acc[gi][k] *= alpha;
            m[gi] = mnew;
            s[gi] = pw;
        }
#pragma unroll
        for (int j = 0; j < DEC_PW; j++) {
            float v[DPL];
            if (vvec) {
#pragma unroll
                for (int k = 0; k < DPL; k++) v[k] = vlane ? word_elem<T>(vw[j][k / EW], k % EW) : 0.0f;
            } else {
                const T *vp = vc + __shfl_sync(0xffffffffu, row, j * DEC_QL);
#pragma unroll
                for (int k = 0; k < DPL; k++) v[k] = d0 + k < hd ? tof(vp[d0 + k]) : 0.0f;
            }
#pragma unroll
            for (int gi = 0; gi < MAXG; gi++) {
                const float pg = __shfl_sync(0xffffffffu, s[gi], j * DEC_QL);
#pragma unroll
                for (int k = 0; k < DPL; k++) acc[gi][k] += pg * v[k];
            }
        }
    }
#undef QS
    // Combine the warps: the block's maximum and sum for each query head,
    // and the warps' sums scaled to that maximum, added in warp order.
    if (lane == 0) {
#pragma unroll
        for (int gi = 0; gi < MAXG; gi++) {
            wm[warp][gi] = m[gi];
            wl[warp][gi] = l[gi];
        }
    }
    __syncthreads();
    if constexpr (ONE_ROUND) {
#pragma unroll
        for (int gi = 0; gi < MAXG; gi++) {
            if (gi >= G) break;
#pragma unroll
            for (int k = 0; k < DPL; k++)
                if (d0 + k < hd) wacc[warp][gi][d0 + k] = acc[gi][k];
        }
        __syncthreads();
    } else {
        if (threadIdx.x < G) {
            const int gi = threadIdx.x;
            float M = -INFINITY, L = 0;
            for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, wm[w][gi]);
            for (int w = 0; w < DEC_WARPS; w++)
                if (wm[w][gi] != -INFINITY) L += wl[w][gi] * __expf(wm[w][gi] - M);
            bm[gi] = M;
            bl[gi] = L;
        }
        __syncthreads();
        // The warps add their scaled sums one after another, in warp order:
        // the result is the same bits on every run (float atomics would not be).
        for (int w = 0; w < DEC_WARPS; w++) {
            if (warp == w) {
#pragma unroll
                for (int gi = 0; gi < MAXG; gi++) {
                    if (gi >= G) break;
                    const float f = m[gi] == -INFINITY ? 0.0f : __expf(m[gi] - bm[gi]);
#pragma unroll
                    for (int k = 0; k < DPL; k++)
                        if (d0 + k < hd) sacc[gi][d0 + k] += acc[gi][k] * f;
                }
            }
            __syncthreads();
        }
    }
    for (int idx = threadIdx.x; idx < MAXG * HDMAX; idx += blockDim.x) {
        const int gi = idx / HDMAX, d = idx % HDMAX;
        if (gi >= G || d >= hd) continue;
        const int h = kvh * G + gi;
        float a, M, L;
        if constexpr (ONE_ROUND) { // each reader forms the block's totals itself
            M = -INFINITY, L = 0, a = 0;
            for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, wm[w][gi]);
            for (int w = 0; w < DEC_WARPS; w++) {
                const float f = wm[w][gi] == -INFINITY ? 0.0f : __expf(wm[w][gi] - M);
                if (wm[w][gi] != -INFINITY) L += wl[w][gi] * f;
                a += wacc[w][gi][d] * f;
            }
        } else {
            a = sacc[gi][d], M = bm[gi], L = bl[gi];
        }
        if (n_eff == 1) {
            out[(size_t)t * g.H * hd + (size_t)h * hd + d] = fromf<T>(a / L);
        } else if constexpr (CL) {
            if constexpr (ONE_ROUND) {
                sacc[gi][d] = a;
                if (d == 0) bm[gi] = M, bl[gi] = L;
            }
        } else {
            const size_t slot = ((size_t)i * g.H + h) * n_split + sp;
            part_acc[slot * hd + d] = a;
            if (d == 0) {
                part_ml[2 * slot] = M;
                part_ml[2 * slot + 1] = L;
            }
        }
    }
    if (n_eff == 1) {
        if constexpr (CL) cluster_leave();
        return;
    }
    if constexpr (CL) {
        // The cluster's blocks are this token's splits (rank = split): after
        // the barrier, each block reads every split's maxima, sums and
        // accumulators from the others' shared memory and forms its share
        // of the outputs, adding in split order exactly as the combine
        // below does (the same bits either way).  The second barrier keeps
        // every block's shared memory until all have read it.
        cg::cluster_group cl = cg::this_cluster();
        cl.sync();
        // This block's share of the outputs: each thread's accumulators
        // from every split, requested along with the splits' maxima and
        // sums, then formed in split order as the combine below forms them.
        const int tot = G * hd, chunk = (tot + n_eff - 1) / n_eff, e1 = min(tot, (sp + 1) * chunk);
        float as[DEC_MAX_CLUSTER];
        auto gather = [&](int e) {
            const float *pa = &sacc[e / hd][e % hd];
#pragma unroll
            for (int s2 = 0; s2 < DEC_MAX_CLUSTER; s2++)
                if (s2 < n_eff) as[s2] = *cl.map_shared_rank(pa, s2);
        };
        int e = sp * chunk + threadIdx.x;
        if (e < e1) gather(e);
        for (int idx = threadIdx.x; idx < G * n_eff; idx += blockDim.x) {
            const int gi = idx / n_eff, s2 = idx % n_eff;
            sm_[gi][s2] = cl.map_shared_rank(&bm[0], s2)[gi];
            sl_[gi][s2] = cl.map_shared_rank(&bl[0], s2)[gi];
        }
        __syncthreads();
        for (; e < e1; e += blockDim.x) {
            if (e != sp * chunk + (int)threadIdx.x) gather(e);
            const int gi = e / hd, d = e % hd;
            float M = -INFINITY, L = 0, a = 0;
            for (int s2 = 0; s2 < n_eff; s2++) M = fmaxf(M, sm_[gi][s2]);
#pragma unroll
            for (int s2 = 0; s2 < DEC_MAX_CLUSTER; s2++)
                if (s2 < n_eff) {
                    const float f = sm_[gi][s2] == -INFINITY ? 0.0f : __expf(sm_[gi][s2] - M);
                    L += sl_[gi][s2] * f;
                    a += as[s2] * f;
                }
            out[(size_t)t * g.H * hd + (size_t)(kvh * G + gi) * hd + d] = fromf<T>(a / L);
        }
        cl.sync();
        return;
    }
    // The last split of this (token, KV head) to finish combines all of
    // them, in split order; its counter is left at 0 for the next pass.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(part_cnt + (size_t)i * g.KV + kvh, 1) == n_eff - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const size_t slot0 = ((size_t)i * g.H + (size_t)kvh * G) * n_split; // head gi's: slot0 + gi * n_split
    // The splits' maxima and sums in one round trip, then each head's
    // factors and total.
    for (int idx = threadIdx.x; idx < G * n_eff; idx += blockDim.x) {
        const int gi = idx / n_eff, s2 = idx % n_eff;
        const float2 ml = __ldcg((const float2 *)(part_ml + 2 * (slot0 + (size_t)gi * n_split + s2)));
        sm_[gi][s2] = ml.x;
        sl_[gi][s2] = ml.y;
    }
    __syncthreads();
    // Each reader forms its head's factors and total itself, in split order.
    for (int idx = threadIdx.x; idx < MAXG * HDMAX; idx += blockDim.x) {
        const int gi = idx / HDMAX, d = idx % HDMAX;
        if (gi >= G || d >= hd) continue;
        const float *pa = part_acc + (slot0 + (size_t)gi * n_split) * hd + d;
        float M = -INFINITY, L = 0, a = 0;
        for (int s2 = 0; s2 < n_eff; s2++) M = fmaxf(M, sm_[gi][s2]);
#pragma unroll 8
        for (int s2 = 0; s2 < n_eff; s2++) {
            const float f = sm_[gi][s2] == -INFINITY ? 0.0f : __expf(sm_[gi][s2] - M);
            L += sl_[gi][s2] * f;
            a += __ldcg(pa + (size_t)s2 * hd) * f;
        }
        out[(size_t)t * g.H * hd + (size_t)(kvh * G + gi) * hd + d] = fromf<T>(a / L);
    }
    if (threadIdx.x == 0) part_cnt[(size_t)i * g.KV + kvh] = 0;
}

template <typename T>
using decode_fn = void (*)(const T *, T *, T *, qattn_geom, qk_rope_in, const int32_t *, int, int, float *, float *,
                           int *, T *, int);

// The instance for a head size and a number of query heads per KV head.
template <typename T, bool ROPE, bool CL, int DPL> static decode_fn<T> decode_pick_g(int G)
{
    if (G <= 4) return attn_decode_kernel<T, DPL, 4, ROPE, CL>;
    if (G <= 8) return attn_decode_kernel<T, DPL, 8, ROPE, CL>;
    if (G <= 16) return attn_decode_kernel<T, DPL, 16, ROPE, CL>;
    return NULL;
}

template <typename T, bool ROPE, bool CL> static decode_fn<T> decode_pick(int hd, int G)
{
    if (hd <= 32) return decode_pick_g<T, ROPE, CL, 1>(G);
    if (hd <= 64) return decode_pick_g<T, ROPE, CL, 2>(G);
    if (hd <= 128) return decode_pick_g<T, ROPE, CL, 4>(G);
    if (hd <= 256) return decode_pick_g<T, ROPE, CL, 8>(G);
    return NULL;
}

template <typename T>
int qk_attn_decode(cudaStream_t st, const T *q, T *kc, T *vc, const qattn_geom *g, const qk_rope_in *rope,
                   const int32_t *tok_list, int n, int n_split, int split_len, float *part_acc, float *part_ml,
                   int *part_cnt, T *out)
{
    if (n <= 0) return 0;
    if (n_split < 1 || n_split > DEC_MAX_SPLIT || (n_split > 1 && (!part_acc || !part_ml || !part_cnt)))
        return QERR_INVAL;
    if (rope && (rope->rope_dim < 0 || rope->rope_dim > g->hd || rope->rope_dim % 2 || !rope->qn != !rope->kn))
        return QERR_INVAL;
    const int G = g->H / g->KV;
    // Up to 16 splits, one cluster's blocks, combine through distributed
    // shared memory (qk_attn_cluster = 0: always through global memory).
    const bool cl = qk_attn_cluster && n_split > 1 && n_split <= DEC_MAX_CLUSTER;
    const decode_fn<T> kernel = cl ? (rope ? decode_pick<T, true, true>(g->hd, G)
                                           : decode_pick<T, false, true>(g->hd, G))
                                   : (rope ? decode_pick<T, true, false>(g->hd, G)
                                           : decode_pick<T, false, false>(g->hd, G));
    if (!kernel) return QERR_UNSUPPORTED;
    if (cl) {
        // Clusters of more than 8 blocks (Hopper allows 16) and more than
        // 48 KB of shared memory are opt-in per kernel.
        if (qk_func_attrs((const void *)kernel, 160 << 10, true)) return QERR_DEVICE;
    }
    // A small grid's clusters are packed onto few SMs, which then share
    // their load bandwidth: unused shared memory keeps them apart.  On the
    // H200 at batch 1 (64 blocks), 112 KB (one block an SM): 1B 1,265 ->
    // 1,328 tok/s, 8B 253 -> 258; at batch 2 (128 blocks) 48 KB (three):
    // 1B 2,253 -> 2,380, where 112 KB gives 2,130.  Larger grids fill the
    // SMs anyway, and lose by it.
    const long blocks = (long)n * g->KV * n_split;
    const int pad_kb = !cl                       ? 0
                       : 2 * blocks <= qk_n_sm() ? qk_cluster_pad_small
                       : blocks <= qk_n_sm()     ? qk_cluster_pad
                                                 : 0;
    const size_t pad = pad_kb > 0 ? (size_t)min(pad_kb, 160) << 10 : 0;
    const qk_rope_in none = {};
    qk_launch_cluster(kernel, dim3(n, g->KV, n_split), DEC_WARPS * 32, pad, st, cl ? n_split : 0, q, kc, vc, *g,
                      rope ? *rope : none, tok_list, split_len, n_split, part_acc, part_ml, part_cnt, out,
                      qk_attn_prefetch);
    CK_LAUNCH("attn_decode");
    return 0;
}

// ---- prefill: flash attention with tensor cores ----------------------------------------
//
// FlashAttention-2 style: 4 warps, each owning 16 query rows of a 64-row
// tile; K and V tiles of 64 keys staged in shared memory; the scores, the
// softmax state and the output accumulator stay in registers in the
// layouts of mma.sync m16n8k16 (bf16/f16 in, float accumulate), so the
// probabilities feed the P.V product without leaving registers.

#define PF_BM 64
#define PF_BN 64

__device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<bf16>(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

template <int HD> struct pf_layout {
    static constexpr int LD = HD + 8; // row stride in elements: 16 bytes of padding against bank conflicts
    static constexpr size_t tile = (size_t)PF_BM * LD * 2;
    static constexpr size_t bytes = 5 * tile; // Q, and two stages of K and V
};

template <typename T, int HD>
__global__ void __launch_bounds__(128) attn_prefill_kernel(const T *__restrict__ q, const T *__restrict__ kc,
                                                           const T *__restrict__ vc, qattn_geom g,
                                                           const int4 *__restrict__ tiles, T *out)
{
    pdl_wait();
    typedef pf_layout<HD> Lay;
    constexpr int LD = Lay::LD, CH = HD / 8, NT = PF_BN / 8, DT = HD / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    T *Qs = (T *)smem;
    // Stage s: K at tile 1 + 2s, V at tile 2 + 2s.
#define PF_K(st) ((T *)(smem + (1 + 2 * (st)) * Lay::tile))
#define PF_V(st) ((T *)(smem + (2 + 2 * (st)) * Lay::tile))

    const int4 tile = tiles[blockIdx.x];
    const int t0 = tile.x, nq = tile.y, h = blockIdx.y, kvh = h / (g.H / g.KV);
    const int pos0 = g.pos[t0], n_keys = pos0 + nq;
    const int32_t *tab = g.tables + g.seq_info[2 * tile.z];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
    const size_t head_off = (size_t)kvh * g.bs * HD;
    const uint4 zero4 = make_uint4(0, 0, 0, 0);

    const int klo = qk_window_lo(pos0, g.window); // keys before it are masked for every query here
    auto load_kv = [&](int kb, int stage) {
        for (int idx = threadIdx.x; idx < PF_BN * CH; idx += blockDim.x) {
            const int r = idx / CH, c = (idx % CH) * 8, p = kb + r;
            if (p < n_keys && p >= klo) {
                const size_t off = (size_t)tab[p / g.bs] * g.block_elems + head_off + (size_t)(p % g.bs) * HD + c;
                cp_async16(PF_K(stage) + r * LD + c, kc + off);
                cp_async16(PF_V(stage) + r * LD + c, vc + off);
            } else {
                *(uint4 *)(PF_K(stage) + r * LD + c) = zero4;
                *(uint4 *)(PF_V(stage) + r * LD + c) = zero4;
            }
        }
        cp_async_commit();
    };

    for (int idx = threadIdx.x; idx < PF_BM * CH; idx += blockDim.x) {
        const int r = idx / CH, c = (idx % CH) * 8;
        if (r < nq) cp_async16(Qs + r * LD + c, q + (size_t)(t0 + r) * g.H * HD + (size_t)h * HD + c);
        else *(uint4 *)(Qs + r * LD + c) = zero4;
    }
    cp_async_commit();
    load_kv(klo / PF_BN * PF_BN, 0);
    cp_async_wait<1>();
    __syncthreads();

    // This warp's Q rows as A fragments, for every 16-wide slice of the head:
    // held in registers up to 128 dimensions; a wider head (Gemma's 256)
    // reads each slice from shared memory as it is used, leaving the
    // registers to the 256-wide accumulator.
    constexpr bool QREG = HD <= 128;
    const T *qbase;
    uint32_t qf[QREG ? HD / 16 : 1][4];
    {
        const int mi = lane >> 3, rr = lane & 7;
        qbase = Qs + (warp * 16 + rr + (mi & 1) * 8) * LD + (mi >> 1) * 8;
        if (QREG) {
#pragma unroll
            for (int kk = 0; kk < (QREG ? HD / 16 : 0); kk++) ldsm_x4(qf[kk], qbase + kk * 16);
        }
    }
    float o[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0;
    float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0, 0 };
    const int row0 = warp * 16 + gq, qpos0 = pos0 + row0, qpos1 = qpos0 + 8;
    const bool live0 = row0 < nq, live1 = row0 + 8 < nq;
    const float sl2 = g.scale * 1.4426950408889634f; // exp(x) = exp2(x log2 e)
    // A local layer's keys start at the first query's window (the tiles
    // before it are never read: their blocks may have been given back).
    const int k0 = klo / PF_BN * PF_BN;
    const int lo0 = qk_window_lo(qpos0, g.window), lo1 = qk_window_lo(qpos1, g.window);

    const int n_tiles = (n_keys - k0 + PF_BN - 1) / PF_BN;
    for (int it = 0; it < n_tiles; it++) {
        const int kb = k0 + it * PF_BN, st = it & 1;
        if (it + 1 < n_tiles) {
            load_kv(kb + PF_BN, st ^ 1); // the next tile streams in while this one is used
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const T *K = PF_K(st), *V = PF_V(st);
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0;
        {
            const int mi = lane >> 3, rr = lane & 7;
            const T *base = K + ((mi >> 1) * 8 + rr) * LD + (mi & 1) * 8;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t qs[4];
                const uint32_t *qa = qf[QREG ? kk : 0];
                if (!QREG) {
                    ldsm_x4(qs, qbase + kk * 16);
                    qa = qs;
                }
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t b[4];
                    ldsm_x4(b, base + np * 16 * LD + kk * 16);
                    mma16816<T>(s[2 * np], qa, b);
                    mma16816<T>(s[2 * np + 1], qa, b + 2);
                }
            }
        }
        // Mask (causal, padding rows) and the online softmax, in base 2.
        float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = kb + j * 8 + 2 * tq + (e & 1);
                const bool ok = e < 2 ? (live0 && key <= qpos0 && key >= lo0) : (live1 && key <= qpos1 && key >= lo1);
                const float sc = g.softcap > 0 ? g.softcap * tanhf(s[j][e] * g.scale / g.softcap) * 1.4426950408889634f
                                               : s[j][e] * sl2;
                const float v = ok ? sc : -INFINITY;
                s[j][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        float alpha[2], mb[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float mn = fmaxf(m[r], mx[r]);
            mb[r] = mn == -INFINITY ? 0.0f : mn;
            alpha[r] = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - mb[r]);
            m[r] = mn;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(s[j][e] - mb[e >> 1]);
                s[j][e] = p;
                l[e >> 1] += p;
            }
#pragma unroll
        for (int j = 0; j < DT; j++) {
            o[j][0] *= alpha[0];
            o[j][1] *= alpha[0];
            o[j][2] *= alpha[1];
            o[j][3] *= alpha[1];
        }
        // O += P V: the score accumulators of two key octets form one A fragment.
        {
            const int mi = lane >> 3, rr = lane & 7;
            const T *base = V + ((mi & 1) * 8 + rr) * LD + (mi >> 1) * 8;
#pragma unroll
            for (int kk = 0; kk < PF_BN / 16; kk++) {
                uint32_t a[4];
                a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
                a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
                a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                for (int dp = 0; dp < DT / 2; dp++) {
                    uint32_t b[4];
                    ldsm_x4_t(b, base + kk * 16 * LD + dp * 16);
                    mma16816<T>(o[2 * dp], a, b);
                    mma16816<T>(o[2 * dp + 1], a, b + 2);
                }
            }
        }
        __syncthreads(); // this stage is refilled two iterations on
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + r * 8;
        if (row >= nq) continue;
        const float inv = 1.0f / l[r];
        T *dst = out + (size_t)(t0 + row) * g.H * HD + (size_t)h * HD + 2 * tq;
#pragma unroll
        for (int j = 0; j < DT; j++) *(uint32_t *)(dst + j * 8) = pack2<T>(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
    }
}
#undef PF_K
#undef PF_V

// The backend's choice: the 16-bit types at the head dimensions with an
// instance (test_gpu_kernels checks each against a float reference).
bool qk_attn_prefill_ok(int elem_bytes, int hd) { return elem_bytes == 2 && (hd == 64 || hd == 128 || hd == 256); }

template <typename T, int HD>
static int prefill_launch(cudaStream_t st, const T *q, const T *kc, const T *vc, const qattn_geom *g, const int4 *tiles,
                          int n_tiles, T *out)
{
    const size_t sh = pf_layout<HD>::bytes;
    if (qk_func_attrs((const void *)attn_prefill_kernel<T, HD>, (int)sh, false)) return QERR_DEVICE;
    qk_launch(attn_prefill_kernel<T, HD>, dim3(n_tiles, g->H), 128, sh, st, q, kc, vc, *g, tiles, out);
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
    if (g->hd == 256) return prefill_launch<T, 256>(st, q, kc, vc, g, tiles, n_tiles, out);
    return QERR_UNSUPPORTED;
}

template <>
int qk_attn_prefill<float>(cudaStream_t, const float *, const float *, const float *, const qattn_geom *, const int4 *,
                           int n_tiles, float *)
{
    return n_tiles > 0 ? QERR_UNSUPPORTED : 0;
}

#define INST_DECODE(T)                                                                                                  \
    template int qk_attn_decode<T>(cudaStream_t, const T *, T *, T *, const qattn_geom *, const qk_rope_in *,           \
                                   const int32_t *, int, int, int, float *, float *, int *, T *);
INST_DECODE(float)
INST_DECODE(bf16)
INST_DECODE(__half)
template int qk_attn_prefill<bf16>(cudaStream_t, const bf16 *, const bf16 *, const bf16 *, const qattn_geom *,
                                   const int4 *, int, bf16 *);
template int qk_attn_prefill<__half>(cudaStream_t, const __half *, const __half *, const __half *, const qattn_geom *,
                                     const int4 *, int, __half *);
