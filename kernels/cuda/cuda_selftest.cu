// cuda_selftest.cu - runs single kernels of the CUDA backend on host data,
// for tests/gpu (each kernel against a CPU reference computed there) and
// the ceilings of bench/gpu (copy bandwidth, cuBLAS bf16 matrix rate).
// Outputs are poisoned (NaN) before each run, so an element a kernel fails
// to write cannot pass.
#include <cublas_v2.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_selftest.cuh"

extern "C" {
#include "cuda_info.h"
}

// Decode attention run twice on the same input: the second run must give
// the same bits (the split counters were left at 0), or QERR_DEVICE.
template <typename T>
static int decode_twice(T *q, T *kc, T *vc, const qattn_geom *g, const int32_t *list, const cuda_attn_case *c,
                        float *pa, float *pm, int *pc, T *o, size_t q_n)
{
    const int ns = c->n_split > 0 ? c->n_split : 1;
    T *first = NULL;
    CK(cudaMalloc(&first, q_n * sizeof(T)));
    int rc = qk_attn_decode<T>(0, q, kc, vc, g, NULL, list, c->n_tok, ns, c->split_len, pa, pm, pc, first);
    if (!rc && cudaMemset(o, 0xff, q_n * sizeof(T)) != cudaSuccess) rc = QERR_DEVICE;
    if (!rc) rc = qk_attn_decode<T>(0, q, kc, vc, g, NULL, list, c->n_tok, ns, c->split_len, pa, pm, pc, o);
    T *h1 = (T *)malloc(q_n * sizeof(T)), *h2 = (T *)malloc(q_n * sizeof(T));
    if (!rc && (!h1 || !h2)) rc = QERR_NOMEM;
    if (!rc && (cudaMemcpy(h1, first, q_n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess ||
                cudaMemcpy(h2, o, q_n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess))
        rc = QERR_DEVICE;
    if (!rc && memcmp(h1, h2, q_n * sizeof(T))) {
        QLOGE("cuda selftest: decode attention gave other bits on its second run");
        rc = QERR_DEVICE;
    }
    free(h1);
    free(h2);
    cudaFree(first);
    return rc;
}

template <typename T>
static int attention_t(const cuda_attn_case *c, float *out)
{
    const size_t cache_n = (size_t)c->num_blocks * c->KV * c->bs * c->hd, q_n = (size_t)c->n_tok * c->H * c->hd;
    T *kc = to_device<T>(c->kc, cache_n), *vc = to_device<T>(c->vc, cache_n), *q = to_device<T>(c->q, q_n), *o = NULL;
    int32_t *meta = NULL;
    float *pa = NULL, *pm = NULL;
    int *pc = NULL;
    int rc = kc && vc && q ? 0 : QERR_DEVICE;
    // Metadata: pos, seq, seq_info, tables, token list, tiles (int4-aligned first).
    int n_tiles = 0;
    int4 *tiles = (int4 *)malloc(sizeof(int4) * (size_t)(c->n_tok + 1));
    int32_t *list = (int32_t *)malloc(sizeof(int32_t) * (size_t)(c->n_tok + 1));
    if (!tiles || !list) rc = QERR_NOMEM;
    for (int t = 0; !rc && t < c->n_tok;) {
        int e = t + 1;
        while (e < c->n_tok && e - t < 64 && c->seq[e] == c->seq[t] && c->pos[e] == c->pos[e - 1] + 1) e++;
        tiles[n_tiles++] = make_int4(t, e - t, c->seq[t], 0);
        t = e;
    }
    for (int t = 0; t < c->n_tok && list; t++) list[t] = t;
    const size_t nt4 = 4 * (size_t)n_tiles, off_pos = nt4, off_seq = off_pos + c->n_tok, off_info = off_seq + c->n_tok,
                 off_tab = off_info + 2 * (size_t)c->n_seqs, off_list = off_tab + c->n_table,
                 total = off_list + c->n_tok;
    if (!rc) {
        if (cudaMalloc(&meta, total * 4) != cudaSuccess) rc = QERR_DEVICE;
        else if (cudaMemcpy(meta, tiles, nt4 * 4, cudaMemcpyHostToDevice) ||
                 cudaMemcpy(meta + off_pos, c->pos, 4 * (size_t)c->n_tok, cudaMemcpyHostToDevice) ||
                 cudaMemcpy(meta + off_seq, c->seq, 4 * (size_t)c->n_tok, cudaMemcpyHostToDevice) ||
                 cudaMemcpy(meta + off_info, c->seq_info, 8 * (size_t)c->n_seqs, cudaMemcpyHostToDevice) ||
                 cudaMemcpy(meta + off_tab, c->tables, 4 * (size_t)c->n_table, cudaMemcpyHostToDevice) ||
                 cudaMemcpy(meta + off_list, list, 4 * (size_t)c->n_tok, cudaMemcpyHostToDevice))
            rc = QERR_DEVICE;
    }
    if (!rc && (cudaMalloc(&o, q_n * sizeof(T)) != cudaSuccess || cudaMemset(o, 0xff, q_n * sizeof(T)) != cudaSuccess))
        rc = QERR_DEVICE; // 0xff..: NaN in every storage type
    const size_t slots = (size_t)c->n_tok * c->H * (c->n_split > 0 ? c->n_split : 1);
    if (!rc && c->n_split > 1 &&
        (cudaMalloc(&pa, slots * c->hd * 4) != cudaSuccess || cudaMalloc(&pm, slots * 8) != cudaSuccess ||
         cudaMalloc(&pc, slots * 4) != cudaSuccess || cudaMemset(pc, 0, slots * 4) != cudaSuccess))
        rc = QERR_DEVICE;
    if (!rc) {
        const qattn_geom g = qk_geom(meta + off_pos, meta + off_seq, meta + off_info, meta + off_tab, c->H, c->KV,
                                     c->hd, c->bs);
        if (c->prefill) rc = qk_attn_prefill<T>(0, q, kc, vc, &g, (const int4 *)meta, n_tiles, o);
        else {
            const int keep = qk_attn_cluster;
            qk_attn_cluster = !c->global_combine;
            rc = decode_twice<T>(q, kc, vc, &g, meta + off_list, c, pa, pm, pc, o, q_n);
            qk_attn_cluster = keep;
        }
        if (!rc && cudaDeviceSynchronize() != cudaSuccess) rc = QERR_DEVICE;
        if (!rc) rc = to_host<T>(out, o, q_n);
    }
    cudaFree(kc);
    cudaFree(vc);
    cudaFree(q);
    cudaFree(o);
    cudaFree(meta);
    cudaFree(pa);
    cudaFree(pm);
    cudaFree(pc);
    free(tiles);
    free(list);
    return rc;
}

extern "C" int cuda_selftest_attention(const cuda_attn_case *c, float *out)
{
    if (c->dtype == QDT_F32) return attention_t<float>(c, out);
    if (c->dtype == QDT_BF16) return attention_t<bf16>(c, out);
    if (c->dtype == QDT_F16) return attention_t<__half>(c, out);
    return QERR_INVAL;
}

extern "C" int cuda_selftest_round(int dtype, float *x, size_t n)
{
    float *d = NULL;
    int rc = 0;
    if (dtype == QDT_F32) return 0;
    if (dtype == QDT_BF16) d = (float *)to_device<bf16>(x, n), rc = d ? to_host<bf16>(x, (bf16 *)d, n) : QERR_DEVICE;
    else d = (float *)to_device<__half>(x, n), rc = d ? to_host<__half>(x, (__half *)d, n) : QERR_DEVICE;
    cudaFree(d);
    return rc;
}

extern "C" int cuda_measure_ceilings(double *copy_tbs, double *bf16_tflops)
{
    const size_t bytes = (size_t)4 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    int rc = qk_fill_uniform<bf16>(0, (bf16 *)a, bytes / 2, 1, -1, 1);
    float ms = 0, best = 1e30f;
    for (int i = 0; !rc && i < 8; i++) {
        if (cudaEventRecord(e0) || cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice) || cudaEventRecord(e1) ||
            cudaEventSynchronize(e1) || cudaEventElapsedTime(&ms, e0, e1))
            rc = QERR_DEVICE;
        if (i >= 2 && ms < best) best = ms; // median-free: the best of six after two warm-ups
    }
    if (!rc) *copy_tbs = 2.0 * (double)bytes / (best * 1e-3) / 1e12;
    // 8192^3 bf16 product on random data, float accumulation.
    cublasHandle_t h = NULL;
    const int N = 8192;
    if (!rc && cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) rc = QERR_DEVICE;
    if (!rc) rc = qk_fill_uniform<bf16>(0, (bf16 *)b, (size_t)3 * N * N, 2, -1, 1);
    const float one = 1, zero = 0;
    bf16 *A = (bf16 *)b, *B = A + (size_t)N * N, *C = B + (size_t)N * N;
    best = 1e30f;
    for (int i = 0; !rc && i < 10; i++) {
        if (cudaEventRecord(e0) ||
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, A, CUDA_R_16BF, N, B, CUDA_R_16BF, N, &zero, C,
                         CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS ||
            cudaEventRecord(e1) || cudaEventSynchronize(e1) || cudaEventElapsedTime(&ms, e0, e1))
            rc = QERR_DEVICE;
        if (i >= 3 && ms < best) best = ms;
    }
    if (!rc) *bf16_tflops = 2.0 * N * (double)N * N / (best * 1e-3) / 1e12;
    if (h) cublasDestroy(h);
    cudaFree(a);
    cudaFree(b);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return rc;
}

// Weight-streaming rate (GB/s of weight bytes) of the small-batch projection
// kernel variants and of cuBLAS, on the projection shapes of the 1B and 8B
// bodies, for n tokens.  Median of 30 timed runs after warm-up; weights
// several times the L2 size are rotated so the cache does not serve them.
extern "C" int cuda_bench_gemv(FILE *f, int n)
{
    static const int shapes[][2] = { { 3072, 2048 }, { 2048, 2048 }, { 16384, 2048 }, { 2048, 8192 },
                                     { 6144, 4096 }, { 4096, 4096 }, { 28672, 4096 }, { 4096, 14336 } };
    const size_t pool = (size_t)1 << 30; // 1 GiB of weights, rotated
    bf16 *W = NULL;
    float *x = NULL, *y = NULL, *nw = NULL;
    CK(cudaMalloc(&W, pool));
    CK(cudaMalloc(&x, (size_t)n * 2 * 14336 * 4));
    CK(cudaMalloc(&y, (size_t)n * 28672 * 4));
    CK(cudaMalloc(&nw, 14336 * 4));
    int rc = qk_fill_uniform<bf16>(0, W, pool / 2, 3, -0.03f, 0.03f);
    if (!rc) rc = qk_fill_uniform<float>(0, x, (size_t)n * 2 * 14336, 4, -1, 1);
    if (!rc) rc = qk_fill_uniform<float>(0, nw, 14336, 5, 0.9f, 1.1f);
    cublasHandle_t h = NULL;
    if (!rc && cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) rc = QERR_DEVICE;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    fprintf(f,
            "| N x K (n=%d) | cuBLAS | quire, 1 row a warp | quire, 2 rows a warp | tensor cores, 16 rows a warp | "
            "tensor cores, 32 rows a warp |\n",
            n);
    fprintf(f, "|---|---|---|---|---|---|\n");
    for (size_t si = 0; !rc && si < sizeof shapes / sizeof shapes[0]; si++) {
        const int N = shapes[si][0], K = shapes[si][1];
        const size_t wbytes = (size_t)N * K * 2, copies = pool / wbytes;
        fprintf(f, "| %d x %d |", N, K);
        for (int v = 0; v < 5 && !rc; v++) {
            if ((v == 1 || v == 2) && !qk_gemv_ok(2, n, K)) {
                fprintf(f, " - |");
                continue;
            }
            if (v >= 3 && !qk_gemv_mma_ok(2, n, K)) {
                fprintf(f, " - |");
                continue;
            }
            float times[40], ms;
            for (int it = 0; it < 40 && !rc; it++) {
                const bf16 *w = W + (size_t)(it % copies) * N * K;
                cudaEventRecord(e0);
                if (v == 0) {
                    const float one = 1, zero = 0;
                    if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, w, CUDA_R_16BF, K, x, CUDA_R_16BF, K,
                                     &zero, y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) !=
                        CUBLAS_STATUS_SUCCESS)
                        rc = QERR_DEVICE;
                } else if (v >= 3) {
                    rc = qk_gemv_mma<bf16>(0, y, (const bf16 *)x, w, n, N, K, 0.0f, NULL, v - 2);
                } else {
                    rc = qk_gemv<bf16>(0, y, (const bf16 *)x, w, n, N, K, 0.0f, v);
                }
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
                cudaEventElapsedTime(&ms, e0, e1);
                times[it] = ms;
            }
            // median of the last 30
            for (int i = 10; i < 40; i++)
                for (int j = i + 1; j < 40; j++)
                    if (times[j] < times[i]) {
                        float t = times[i];
                        times[i] = times[j];
                        times[j] = t;
                    }
            fprintf(f, " %.0f |", wbytes / (times[25] * 1e-3) / 1e9);
        }
        fprintf(f, "\n");
    }
    if (h) cublasDestroy(h);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(W);
    cudaFree(x);
    cudaFree(y);
    cudaFree(nw);
    return rc;
}
