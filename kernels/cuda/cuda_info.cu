// cuda_info.cu - what the CUDA runtime can see.  The CUDA backend proper
// (paged attention, cuBLAS projections) builds on this; this file keeps the
// CUDA toolchain path of the build compiled and linked from day one.
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "backend.h"
#include "cuda_info.h"
}

extern "C" int cuda_device_count(char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (err && errlen) snprintf(err, errlen, "%s", cudaGetErrorString(e));
        return 0;
    }
    return n;
}

extern "C" int cuda_device_name(int dev, char *buf, size_t len)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return -1;
    snprintf(buf, len, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return 0;
}

extern "C" int cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) return QERR_DEVICE;
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return 0;
}
