// cuda_selftest.cuh - host-data helpers shared by the self-test wrappers
// (cuda_selftest.cu, cuda_selftest_ops.cu).  Every conversion between the
// host's floats and a storage type goes through qk_convert on the device,
// so there is one definition of rounding.
#ifndef QUIRE_CUDA_SELFTEST_CUH
#define QUIRE_CUDA_SELFTEST_CUH

#include "cuda_kernels.cuh"

// n host floats (n >= 1) to a new device array of T (rounded on the
// device), 16 bytes of slack for vector loads; NULL on failure.  The
// caller frees it with cudaFree.
template <typename T> static T *to_device(const float *h, size_t n)
{
    T *d = NULL;
    float *df = NULL;
    if (cudaMalloc(&df, n * 4 + 4) != cudaSuccess) return NULL;
    if (cudaMalloc(&d, n * sizeof(T) + 16) != cudaSuccess ||
        cudaMemcpy(df, h, n * 4, cudaMemcpyHostToDevice) != cudaSuccess || qk_convert<T, float>(0, d, df, n) ||
        cudaDeviceSynchronize() != cudaSuccess) {
        cudaFree(df);
        cudaFree(d);
        return NULL;
    }
    cudaFree(df);
    return d;
}

// n elements of T on the device to host floats (exact: every storage type
// widens to float without rounding); 0 or QERR_DEVICE.
template <typename T> static int to_host(float *h, const T *d, size_t n)
{
    float *df = NULL;
    CK(cudaMalloc(&df, n * 4 + 4));
    int rc = qk_convert<float, T>(0, df, d, n);
    if (!rc && cudaMemcpy(h, df, n * 4, cudaMemcpyDeviceToHost) != cudaSuccess) rc = QERR_DEVICE;
    cudaFree(df);
    return rc;
}

// A new device array of n T whose every byte is 0xff (NaN in float, bf16
// and f16), so an element a kernel fails to write reads back as NaN; NULL
// on failure.
template <typename T> static T *poisoned(size_t n)
{
    T *d = NULL;
    if (cudaMalloc(&d, n * sizeof(T) + 16) != cudaSuccess) return NULL;
    if (cudaMemset(d, 0xff, n * sizeof(T) + 16) != cudaSuccess) {
        cudaFree(d);
        return NULL;
    }
    return d;
}

// n bytes of host data in a new device array; NULL on failure.
static inline void *upload(const void *h, size_t n)
{
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 1) != cudaSuccess) return NULL;
    if (n && cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(d);
        return NULL;
    }
    return d;
}

#endif
