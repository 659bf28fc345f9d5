// cuda_common.cuh - what every CUDA file of the backend shares: error
// checks that log and return QERR_DEVICE, and float conversions for the
// three storage types (float for the exact mode, bf16 and f16 otherwise).
#ifndef QUIRE_CUDA_COMMON_CUH
#define QUIRE_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend.h"
#include "util.h"
}

// A CUDA runtime call that must succeed; otherwise log and return QERR_DEVICE.
#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            QLOGE("cuda: %s: %s", #call, cudaGetErrorString(e_));                                  \
            return QERR_DEVICE;                                                                    \
        }                                                                                          \
    } while (0)

// After a kernel launch: a bad configuration or a sticky error fails here.
#define CK_LAUNCH(what)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = cudaGetLastError();                                                       \
        if (e_ != cudaSuccess) {                                                                   \
            QLOGE("cuda: launching %s: %s", what, cudaGetErrorString(e_));                         \
            return QERR_DEVICE;                                                                    \
        }                                                                                          \
    } while (0)

typedef __nv_bfloat16 bf16;

// Programmatic dependent launch: kernels of the forward pass are launched
// with the attribute that lets the next one start (launch, block
// scheduling, prologue) while the previous drains; each calls pdl_wait()
// before it reads anything the previous kernel wrote.  qk_pdl = 0
// (QUIRE_CUDA_PDL=0) launches them plainly.
extern int qk_pdl;
// How the projection kernel splits K over warps (QUIRE_CUDA_GEMV_SPLIT: 0
// never, 1 in two for middling matrices only, 2 also long rows; cuda_ops.cu).
extern int qk_gemv_split;
// How the weight-streaming projection kernel reads its weights
// (QUIRE_CUDA_GEMV_PRELOAD, bits, default 3; cuda_ops.cu): 1, a warp loads
// its first GEMV_PRE steps (through ld_weights) before it waits for the
// kernel before it; 2, the other steps through ld_weights (no room in L1)
// instead of plain loads.  On the H100 at one
// token (2026-12-07, Phi-4-mini / Gemma-3-12B shapes, ms a step): 0 3.32 /
// 9.49, 1 3.27 / 9.29, 2 3.23 / 9.24, 3 3.19 / 9.13.
extern int qk_gemv_preload;
// Whether decode attention combines up to 16 splits in a thread-block
// cluster (QUIRE_CUDA_CLUSTER=0: through global memory; cuda_attn.cu).
extern int qk_attn_cluster;
// Whether decode attention asks the L2 cache for its first step's keys and
// values before it waits for the kernel before it (QUIRE_CUDA_ATTN_PREFETCH;
// cuda_attn.cu).
extern int qk_attn_prefetch;
// KB of shared memory that decode attention's blocks ask for beyond their
// own when they are clustered and no more than the GPU's SMs
// (QUIRE_CUDA_CLUSTER_PAD, default 48), or no more than half of them
// (QUIRE_CUDA_CLUSTER_PAD_SMALL, default 112), so that few share an SM
// (cuda_attn.cu).
extern int qk_cluster_pad, qk_cluster_pad_small;

// Sets kernel fn's dynamic shared memory limit to smem bytes (and, with
// cluster, allows non-portable cluster sizes) on the current device, once
// per function and device (attributes are a device's), from any thread:
// 0, or QERR_DEVICE (cuda_attn.cu).
int qk_func_attrs(const void *fn, int smem, bool cluster);

// The current device's SM count (132 if it cannot be read), cached: the
// GPUs of one process are taken to be alike.
static inline int qk_n_sm()
{
    static int n_sm;
    int dev = 0;
    if (!n_sm && (cudaGetDevice(&dev) != cudaSuccess ||
                  cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess))
        n_sm = 132;
    return n_sm;
}

// The cache line holding p, fetched into L2 (no registers, no wait).
__device__ __forceinline__ void prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    // Once this kernel runs (its input complete), the next may be scheduled:
    // at most one grid ever waits, so waiting blocks cannot starve the one
    // they wait for.
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// A launch whose blocks form clusters of cz along z (cz = 0: none).
template <typename... KArgs, typename... Args>
static inline cudaError_t qk_launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                            cudaStream_t st, int cz, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (qk_pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cz > 0) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = 1;
        at[n].val.clusterDim.y = 1;
        at[n++].val.clusterDim.z = (unsigned)cz;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}

template <typename... KArgs, typename... Args>
static inline cudaError_t qk_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                    Args... args)
{
    return qk_launch_cluster(kernel, grid, block, smem, st, 0, args...);
}

__device__ __forceinline__ float tof(float x) { return x; }
__device__ __forceinline__ float tof(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float tof(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T fromf(float x);
template <> __device__ __forceinline__ float fromf<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 fromf<bf16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half fromf<__half>(float x) { return __float2half(x); }

// Weights: read once, never written while kernels run, so the load may be
// placed anywhere (not volatile); no room taken in L1.
__device__ __forceinline__ uint4 ld_weights(const uint4 *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// The 8 elements of T (2 bytes each) in u, as floats.
template <typename T> __device__ __forceinline__ void unpack8(const uint4 &u, float *out)
{
    const T *h = (const T *)&u;
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = tof(h[i]);
}

// Loads n (1, 2, 4 or 8) consecutive elements as floats; p must be aligned
// to n elements.
template <typename T, int N> __device__ __forceinline__ void load_vec(const T *p, float *out)
{
#pragma unroll
    for (int i = 0; i < N; i++) out[i] = tof(p[i]);
}
template <> __device__ __forceinline__ void load_vec<bf16, 8>(const bf16 *p, float *out)
{
    unpack8<bf16>(*(const uint4 *)p, out);
}
template <> __device__ __forceinline__ void load_vec<__half, 8>(const __half *p, float *out)
{
    unpack8<__half>(*(const uint4 *)p, out);
}
template <> __device__ __forceinline__ void load_vec<bf16, 4>(const bf16 *p, float *out)
{
    uint2 u = *(const uint2 *)p;
    const bf16 *h = (const bf16 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) out[i] = __bfloat162float(h[i]);
}
template <> __device__ __forceinline__ void load_vec<__half, 4>(const __half *p, float *out)
{
    uint2 u = *(const uint2 *)p;
    const __half *h = (const __half *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) out[i] = __half2float(h[i]);
}
template <> __device__ __forceinline__ void load_vec<float, 4>(const float *p, float *out)
{
    float4 u = *(const float4 *)p;
    out[0] = u.x, out[1] = u.y, out[2] = u.z, out[3] = u.w;
}

// Element i of a 32-bit word holding 4 / sizeof(T) elements of T, as float
// (register data: no trip through memory).
template <typename T> __device__ __forceinline__ float word_elem(uint32_t w, int i);
template <> __device__ __forceinline__ float word_elem<bf16>(uint32_t w, int i)
{
    return __uint_as_float(i ? w & 0xffff0000u : w << 16);
}
template <> __device__ __forceinline__ float word_elem<__half>(uint32_t w, int i)
{
    return __half2float(__ushort_as_half((unsigned short)(i ? w >> 16 : w & 0xffffu)));
}
template <> __device__ __forceinline__ float word_elem<float>(uint32_t w, int) { return __uint_as_float(w); }

// c += a b on the tensor cores, mma.sync m16n8k16 (A row-major 16 x 16,
// B column-major 16 x 8, float accumulators; the fragments as PTX lays
// them out: a[0] rows g, k 2t..2t+1; a[1] rows g+8; a[2], a[3] the same at
// k + 8; b[0] k 2t..2t+1 of column g, b[1] k + 8; g = lane / 4, t = lane % 4).
template <typename T> __device__ __forceinline__ void mma16816(float *c, const uint32_t *a, const uint32_t *b);
template <> __device__ __forceinline__ void mma16816<bf16>(float *c, const uint32_t *a, const uint32_t *b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma16816<__half>(float *c, const uint32_t *a, const uint32_t *b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif
