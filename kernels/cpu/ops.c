/* ops.c - portable reference kernels and the run-time kernel choice. */
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static inline float load_w(const void *W, qdtype dt, size_t i)
{
    switch (dt) {
    case QDT_F16: return q_f16_to_f32(((const uint16_t *)W)[i]);
    case QDT_BF16: return q_bf16_to_f32(((const uint16_t *)W)[i]);
    default: return ((const float *)W)[i];
    }
}

void cpu_to_f32(float *dst, const void *src, qdtype dt, int64_t off, int n)
{
    if (dt == QDT_F32) {
        memcpy(dst, (const float *)src + off, (size_t)n * sizeof(float));
        return;
    }
    for (int i = 0; i < n; i++) dst[i] = load_w(src, dt, (size_t)off + (size_t)i);
}

void cpu_matmul_ref(float *y, int ldy, const float *x, int T, const void *W, qdtype dt,
                    int K, int o0, int o1)
{
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * K;
        for (int o = o0; o < o1; o++) {
            size_t base = (size_t)o * K;
            float acc[8] = { 0 };
            int k = 0;
            for (; k + 8 <= K; k += 8)
                for (int j = 0; j < 8; j++) acc[j] += xt[k + j] * load_w(W, dt, base + k + j);
            for (int j = 0; k < K; k++, j++) acc[j] += xt[k] * load_w(W, dt, base + k);
            y[(size_t)t * ldy + o] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        }
    }
}

float cpu_dot_ref(const float *a, const float *b, int n)
{
    float acc[8] = { 0 };
    int k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[k + j] * b[k + j];
    for (int j = 0; k < n; k++, j++) acc[j] += a[k] * b[k];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void cpu_axpy_ref(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

void cpu_rmsnorm(float *y, const float *x, const void *w, qdtype dt, int n, float eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) y[i] = (x[i] * scale) * load_w(w, dt, (size_t)i);
}

void cpu_swiglu(float *out, const float *g, const float *u, int n)
{
    for (int i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void cpu_geglu(float *out, const float *g, const float *u, int n)
{
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int i = 0; i < n; i++) {
        float x = g[i];
        out[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[i];
    }
}

void cpu_attn_scores_ref(float *s, const float *q, const float *k, int n, int hd, float scale)
{
    for (int j = 0; j < n; j++) s[j] = cpu_dot_ref(q, k + (size_t)j * hd, hd) * scale;
}

void cpu_attn_accum_ref(float *out, const float *p, const float *v, int n, int hd)
{
    for (int j = 0; j < n; j++) cpu_axpy_ref(out, p[j], v + (size_t)j * hd, hd);
}

static const cpu_kernels k_ref = { "scalar", cpu_matmul_ref, cpu_dot_ref, cpu_axpy_ref,
                                   cpu_attn_scores_ref, cpu_attn_accum_ref };
static const cpu_kernels k_avx2 = { "avx2", cpu_matmul_avx2, cpu_dot_avx2, cpu_axpy_avx2,
                                    cpu_attn_scores_avx2, cpu_attn_accum_avx2 };
static const cpu_kernels k_avx512 = { "avx512", cpu_matmul_avx512, cpu_dot_avx512, cpu_axpy_avx512,
                                      cpu_attn_scores_avx512, cpu_attn_accum_avx512 };

const cpu_kernels *cpu_kernels_ref(void) { return &k_ref; }

#if defined(__x86_64__)
#include <cpuid.h>

/* AVX2, FMA and F16C, and the OS saving YMM state (clang 14's
 * __builtin_cpu_supports knows no "f16c", so ask cpuid directly). */
static int cpu_has_avx2_fma_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!(fma && osxsave && avx && f16c)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6) != 6) return 0; /* XMM and YMM state enabled */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b >> 5) & 1; /* AVX2 */
}

/* AVX-512 F, DQ, BW and VL, and the OS saving opmask and ZMM state. */
static int cpu_has_avx512(void)
{
    unsigned a, b, c, d;
    if (!cpu_has_avx2_fma_f16c()) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xe6) != 0xe6) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1); /* F DQ BW VL */
}
#endif

const cpu_kernels *cpu_kernels_avx2(void)
{
#if defined(__x86_64__)
    if (cpu_has_avx2_fma_f16c()) return &k_avx2;
#endif
    return NULL;
}

const cpu_kernels *cpu_kernels_get(void)
{
    const char *e = getenv("QUIRE_CPU_SIMD");
    if (e && !strcmp(e, "0")) return &k_ref;
#if defined(__x86_64__)
    if (!(e && !strcmp(e, "avx2")) && cpu_has_avx512()) return &k_avx512;
    if (cpu_has_avx2_fma_f16c()) return &k_avx2;
#endif
    return &k_ref;
}
