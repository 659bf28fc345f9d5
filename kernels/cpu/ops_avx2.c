/* ops_avx2.c - AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c,
 * called only when the CPU has them).
 *
 * The matmul works on tiles of 4 weight rows x up to 3 token rows (8 rows x 1
 * token when decoding: more memory streams in flight) with one
 * 8-lane accumulator per (token, row) pair: a weight vector is loaded (and
 * widened from f16/bf16) once and used for every token of the tile.  Each
 * pair's sum is always built the same way - k ascending in steps of 8, the
 * tail zero-padded into a ninth step, then one fixed horizontal reduction - so
 * a tile's shape never changes a result.
 */
#include "ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

static inline __m256 ld_w(const void *W, qdtype dt, size_t i)
{
    if (dt == QDT_F32) return _mm256_loadu_ps((const float *)W + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)W + i));
    if (dt == QDT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The last K % 8 elements of a row, zero-padded to 8 (as floats). */
static inline __m256 ld_w_tail(const void *W, qdtype dt, size_t i, int n)
{
    uint16_t h[8] = { 0 };
    float f[8] = { 0 };
    if (dt == QDT_F32) {
        memcpy(f, (const float *)W + i, (size_t)n * 4);
        return _mm256_loadu_ps(f);
    }
    memcpy(h, (const uint16_t *)W + i, (size_t)n * 2);
    return ld_w(h, dt, 0);
}

static inline __m256 ld_x_tail(const float *x, int n)
{
    float f[8] = { 0 };
    memcpy(f, x, (size_t)n * 4);
    return _mm256_loadu_ps(f);
}

static inline float hsum(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);                    /* (0+4, 1+5, 2+6, 3+7) */
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));           /* (04+26, 15+37, ..) */
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* R tokens (1..3) x C rows (1..4).  The compiler unrolls for each constant
 * R, C pair since the function is inlined with literal arguments. */
static inline __attribute__((always_inline)) void tile(float *y, int ldy, const float *x, int K,
                                                       const void *W, qdtype dt, int o, int R, int C)
{
    __m256 acc[3][8];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 8; c++) acc[r][c] = _mm256_setzero_ps();
    const size_t base = (size_t)o * K;
    int k = 0;
    /* 12 accumulators + 3 x vectors + 1 weight vector = the 16 registers. */
    for (; k + 8 <= K; k += 8) {
        __m256 xv[3];
        for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(x + (size_t)r * K + k);
        for (int c = 0; c < C; c++) {
            __m256 w = ld_w(W, dt, base + (size_t)c * K + k);
            for (int r = 0; r < R; r++) acc[r][c] = _mm256_fmadd_ps(xv[r], w, acc[r][c]);
        }
    }
    if (k < K) {
        int n = K - k;
        __m256 w[8];
        for (int c = 0; c < C; c++) w[c] = ld_w_tail(W, dt, base + (size_t)c * K + k, n);
        for (int r = 0; r < R; r++) {
            __m256 xv = ld_x_tail(x + (size_t)r * K + k, n);
            for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(xv, w[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(size_t)r * ldy + o + c] = hsum(acc[r][c]);
}

/* Tokens are taken in groups of TG, and within a group weight rows in
 * blocks of 4: a block's rows stay in L1 while every token of the group
 * passes over them, and the group's activations stay in L2. */
#define TG 48

#define ROW_BLOCK(C)                                                              \
    do {                                                                          \
        int t = t0;                                                               \
        for (; t + 3 <= t1; t += 3)                                               \
            tile(y + (size_t)t * ldy, ldy, x + (size_t)t * K, K, W, dt, o, 3, C); \
        for (; t < t1; t++)                                                       \
            tile(y + (size_t)t * ldy, ldy, x + (size_t)t * K, K, W, dt, o, 1, C); \
    } while (0)

static inline __attribute__((always_inline)) void matmul_dt(float *y, int ldy, const float *x, int T,
                                                            const void *W, qdtype dt, int K, int o0, int o1)
{
    for (int t0 = 0; t0 < T; t0 += TG) {
        const int t1 = T - t0 < TG ? T : t0 + TG;
        int o = o0;
        if (T == 1) /* decode: 8 rows at once keep more memory streams in flight */
            for (; o + 8 <= o1; o += 8) tile(y, ldy, x, K, W, dt, o, 1, 8);
        for (; o + 4 <= o1; o += 4) ROW_BLOCK(4);
        for (; o < o1; o++) ROW_BLOCK(1);
    }
}

void cpu_matmul_avx2(float *y, int ldy, const float *x, int T, const void *W, qdtype dt,
                     int K, int o0, int o1)
{
    switch (dt) {
    case QDT_F16: matmul_dt(y, ldy, x, T, W, QDT_F16, K, o0, o1); break;
    case QDT_BF16: matmul_dt(y, ldy, x, T, W, QDT_BF16, K, o0, o1); break;
    default: matmul_dt(y, ldy, x, T, W, QDT_F32, K, o0, o1); break;
    }
}

float cpu_dot_avx2(const float *a, const float *b, int n)
{
    __m256 acc = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= n; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
    if (k < n) acc = _mm256_fmadd_ps(ld_x_tail(a + k, n - k), ld_x_tail(b + k, n - k), acc);
    return hsum(acc);
}

void cpu_axpy_avx2(float *y, float a, const float *x, int n)
{
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = __builtin_fmaf(a, x[i], y[i]);
}

void cpu_attn_scores_avx2(float *s, const float *q, const float *k, int n, int hd, float scale)
{
    for (int j = 0; j < n; j++) s[j] = cpu_dot_avx2(q, k + (size_t)j * hd, hd) * scale;
}

/* Each 8-wide slice of out stays in a register across the block's rows. */
void cpu_attn_accum_avx2(float *out, const float *p, const float *v, int n, int hd)
{
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
        __m256 acc = _mm256_loadu_ps(out + d);
        for (int j = 0; j < n; j++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + (size_t)j * hd + d), acc);
        _mm256_storeu_ps(out + d, acc);
    }
    for (; d < hd; d++) {
        float a = out[d];
        for (int j = 0; j < n; j++) a = __builtin_fmaf(p[j], v[(size_t)j * hd + d], a);
        out[d] = a;
    }
}

#else /* not x86-64: never selected */
void cpu_matmul_avx2(float *y, int ldy, const float *x, int T, const void *W, qdtype dt,
                     int K, int o0, int o1)
{
    cpu_matmul_ref(y, ldy, x, T, W, dt, K, o0, o1);
}
float cpu_dot_avx2(const float *a, const float *b, int n) { return cpu_dot_ref(a, b, n); }
void cpu_axpy_avx2(float *y, float a, const float *x, int n) { cpu_axpy_ref(y, a, x, n); }
void cpu_attn_scores_avx2(float *s, const float *q, const float *k, int n, int hd, float scale)
{
    cpu_attn_scores_ref(s, q, k, n, hd, scale);
}
void cpu_attn_accum_avx2(float *out, const float *p, const float *v, int n, int hd) { cpu_attn_accum_ref(out, p, v, n, hd); }
#endif
