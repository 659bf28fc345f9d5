/* ops_avx512.c - AVX-512 (F, BW, VL) kernels, compiled with -mavx512f
 * -mavx512bw -mavx512vl -mfma -mf16c and called only when the CPU and the OS
 * support them.
 *
 * Same scheme as ops_avx2.c with 16-lane vectors: tiles of 8 weight rows x up
 * to 3 token rows, one accumulator per (token, row) pair - 24 accumulators,
 * 3 token vectors and 1 weight vector fill 28 of the 32 registers.  Each
 * pair's sum is built the same way whatever the tile: k ascending in steps
 * of 16, the tail through a masked load, then one fixed reduction; so a
 * result never depends on the batch around it.
 */
#include "ops.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* QDT_F32 rows that are not 64-byte aligned (GGUF aligns tensors to 32) are
 * read as two 32-byte halves: a 64-byte load that straddles two cache lines
 * costs more than the extra shuffle.  The lanes hold the same values either
 * way, so results do not depend on the path. */
#define QDT_F32_SPLIT ((qdtype)100)

static inline __m512 ld_w(const void *W, qdtype dt, size_t i)
{
    if (dt == QDT_F32) return _mm512_loadu_ps((const float *)W + i);
    if (dt == QDT_F32_SPLIT) {
        const float *p = (const float *)W + i;
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(p)), _mm256_loadu_ps(p + 8), 1);
    }
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)W + i));
    if (dt == QDT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __m512 ld_w_tail(const void *W, qdtype dt, size_t i, __mmask16 m)
{
    if (dt == QDT_F32 || dt == QDT_F32_SPLIT) return _mm512_maskz_loadu_ps(m, (const float *)W + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)W + i);
    if (dt == QDT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline float hsum(__m512 v)
{
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) void tile(float *y, int ldy, const float *x, int K,
                                                       const void *W, qdtype dt, int o, int R, int C)
{
    __m512 acc[3][8];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 8; c++) acc[r][c] = _mm512_setzero_ps();
    const size_t base = (size_t)o * K;
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 xv[3];
        for (int r = 0; r < R; r++) xv[r] = _mm512_loadu_ps(x + (size_t)r * K + k);
        for (int c = 0; c < C; c++) {
            __m512 w = ld_w(W, dt, base + (size_t)c * K + k);
            for (int r = 0; r < R; r++) acc[r][c] = _mm512_fmadd_ps(xv[r], w, acc[r][c]);
        }
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        __m512 xv[3];
        for (int r = 0; r < R; r++) xv[r] = _mm512_maskz_loadu_ps(m, x + (size_t)r * K + k);
        for (int c = 0; c < C; c++) {
            __m512 w = ld_w_tail(W, dt, base + (size_t)c * K + k, m);
            for (int r = 0; r < R; r++) acc[r][c] = _mm512_fmadd_ps(xv[r], w, acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(size_t)r * ldy + o + c] = hsum(acc[r][c]);
}

/* Tokens are taken in groups of TG, and within a group weight rows in
 * blocks of 8: a block's rows stay in L1 while every token of the group
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
        for (; o + 8 <= o1; o += 8) ROW_BLOCK(8);
        for (; o < o1; o++) ROW_BLOCK(1);
    }
}

void cpu_matmul_avx512(float *y, int ldy, const float *x, int T, const void *W, qdtype dt,
                       int K, int o0, int o1)
{
    switch (dt) {
    case QDT_F16: matmul_dt(y, ldy, x, T, W, QDT_F16, K, o0, o1); break;
    case QDT_BF16: matmul_dt(y, ldy, x, T, W, QDT_BF16, K, o0, o1); break;
    default:
        if ((uintptr_t)W % 64 == 0 && K % 16 == 0) matmul_dt(y, ldy, x, T, W, QDT_F32, K, o0, o1);
        else matmul_dt(y, ldy, x, T, W, QDT_F32_SPLIT, K, o0, o1);
        break;
    }
}

float cpu_dot_avx512(const float *a, const float *b, int n)
{
    __m512 acc = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= n; k += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), acc);
    if (k < n) {
        __mmask16 m = (__mmask16)((1u << (n - k)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k), acc);
    }
    return hsum(acc);
}

void cpu_axpy_avx512(float *y, float a, const float *x, int n)
{
    __m512 av = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

void cpu_attn_scores_avx512(float *s, const float *q, const float *k, int n, int hd, float scale)
{
    for (int j = 0; j < n; j++) s[j] = cpu_dot_avx512(q, k + (size_t)j * hd, hd) * scale;
}

/* Each 16-wide slice of out stays in a register across the block's rows. */
void cpu_attn_accum_avx512(float *out, const float *p, const float *v, int n, int hd)
{
    for (int d = 0; d < hd; d += 16) {
        __mmask16 m = hd - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - d)) - 1);
        __m512 acc = _mm512_maskz_loadu_ps(m, out + d);
        for (int j = 0; j < n; j++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(m, v + (size_t)j * hd + d), acc);
        _mm512_mask_storeu_ps(out + d, m, acc);
    }
}

#else /* not x86-64: never selected */
void cpu_matmul_avx512(float *y, int ldy, const float *x, int T, const void *W, qdtype dt,
                       int K, int o0, int o1)
{
    cpu_matmul_ref(y, ldy, x, T, W, dt, K, o0, o1);
}
float cpu_dot_avx512(const float *a, const float *b, int n) { return cpu_dot_ref(a, b, n); }
void cpu_axpy_avx512(float *y, float a, const float *x, int n) { cpu_axpy_ref(y, a, x, n); }
void cpu_attn_scores_avx512(float *s, const float *q, const float *k, int n, int hd, float scale)
{
    cpu_attn_scores_ref(s, q, k, n, hd, scale);
}
void cpu_attn_accum_avx512(float *out, const float *p, const float *v, int n, int hd) { cpu_attn_accum_ref(out, p, v, n, hd); }
#endif
