/* ops.h - the CPU backend's kernels.
 *
 * Each kernel has a portable C version (ops.c, the reference) and, where it
 * pays, an AVX2/FMA/F16C version (ops_avx2.c) chosen at run time.  Every
 * kernel computes each output element by one fixed sequence of operations
 * that depends only on that element's inputs, never on the batch size or on
 * how work is split over threads: batched results are bit-identical to
 * unbatched ones.
 */
#ifndef QUIRE_CPU_OPS_H
#define QUIRE_CPU_OPS_H

#include <stdint.h>

#include "backend.h"

/* Dot products of x rows with W rows, the inner kernel of every projection:
 * for t in [0, T), o in [o0, o1):  y[t*ldy + o] = sum_k x[t*K + k] * W[o*K + k].
 *   x: (T, K) float;  W: (N, K) in dtype dt;  y: (T, ldy) float. */
typedef void (*cpu_matmul_fn)(float *y, int ldy, const float *x, int T, const void *W, qdtype dt,
                              int K, int o0, int o1);

void cpu_matmul_ref(float *y, int ldy, const float *x, int T, const void *W, qdtype dt,
                    int K, int o0, int o1);
void cpu_matmul_avx2(float *y, int ldy, const float *x, int T, const void *W, qdtype dt,
                     int K, int o0, int o1);
void cpu_matmul_avx512(float *y, int ldy, const float *x, int T, const void *W, qdtype dt,
                       int K, int o0, int o1);

/* Dot product of n floats in a fixed order.  Used by attention. */
typedef float (*cpu_dot_fn)(const float *a, const float *b, int n);
float cpu_dot_ref(const float *a, const float *b, int n);
float cpu_dot_avx2(const float *a, const float *b, int n);
float cpu_dot_avx512(const float *a, const float *b, int n);

/* y += a * x over n floats. */
typedef void (*cpu_axpy_fn)(float *y, float a, const float *x, int n);
void cpu_axpy_ref(float *y, float a, const float *x, int n);
void cpu_axpy_avx2(float *y, float a, const float *x, int n);
void cpu_axpy_avx512(float *y, float a, const float *x, int n);

/* Attention over one KV block: k and v are (n, hd) rows, contiguous.
 * scores: s[j] = dot(q, k[j]) * scale.  accum: out[d] += sum_j p[j] * v[j][d],
 * j ascending. */
typedef void (*cpu_attn_scores_fn)(float *s, const float *q, const float *k, int n, int hd, float scale);
typedef void (*cpu_attn_accum_fn)(float *out, const float *p, const float *v, int n, int hd);
void cpu_attn_scores_ref(float *s, const float *q, const float *k, int n, int hd, float scale);
void cpu_attn_accum_ref(float *out, const float *p, const float *v, int n, int hd);
void cpu_attn_scores_avx2(float *s, const float *q, const float *k, int n, int hd, float scale);
void cpu_attn_accum_avx2(float *out, const float *p, const float *v, int n, int hd);
void cpu_attn_scores_avx512(float *s, const float *q, const float *k, int n, int hd, float scale);
void cpu_attn_accum_avx512(float *out, const float *p, const float *v, int n, int hd);

/* The kernels in use: AVX-512 (F, BW, VL) when the CPU and OS have it, else
 * AVX2 when the CPU has AVX2, FMA and F16C, else the reference.
 * QUIRE_CPU_SIMD=0 forces the reference, =avx2 caps the choice at AVX2.
 * One process uses one set throughout, so batch invariance holds. */
typedef struct {
    const char *name;
    cpu_matmul_fn matmul;
    cpu_dot_fn dot;
    cpu_axpy_fn axpy;
    cpu_attn_scores_fn attn_scores;
    cpu_attn_accum_fn attn_accum;
} cpu_kernels;

const cpu_kernels *cpu_kernels_get(void);
const cpu_kernels *cpu_kernels_ref(void);
/* The AVX2 set when the CPU has it, else NULL (for tests). */
const cpu_kernels *cpu_kernels_avx2(void);

/* Converts n elements of dtype dt at src (element offset off) to float. */
void cpu_to_f32(float *dst, const void *src, qdtype dt, int64_t off, int n);

/* y = x / rms(x) * w, over n elements; w in dtype dt.  y may alias x. */
void cpu_rmsnorm(float *y, const float *x, const void *w, qdtype dt, int n, float eps);

/* out = silu(g) * u over n elements. */
void cpu_swiglu(float *out, const float *g, const float *u, int n);

/* out = gelu_tanh(g) * u over n elements (GeGLU with the tanh-approximated
 * GELU, transformers' gelu_pytorch_tanh). */
void cpu_geglu(float *out, const float *g, const float *u, int n);

#endif
