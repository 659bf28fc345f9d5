/* test_ops.c - the AVX2 kernels against the portable reference, on fresh
 * random inputs, for every dtype and for shapes with and without tails; and
 * the tile-shape invariance the batching guarantee rests on. */
#include <math.h>
#include <stdint.h>

#include "cpu/ops.h"
#include "util.h"
#include "qtest.h"

static uint64_t rng = 88172645463325252ULL;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53) * 2.0f - 1.0f;
}

static void *make_w(qdtype dt, int n)
{
    void *w = malloc((size_t)n * qdt_size(dt));
    for (int i = 0; i < n; i++) {
        float v = frand();
        if (dt == QDT_F32) ((float *)w)[i] = v;
        else if (dt == QDT_F16) ((uint16_t *)w)[i] = q_f32_to_f16(v);
        else ((uint16_t *)w)[i] = q_f32_to_bf16(v);
    }
    return w;
}

static int simd_available(void) { return strcmp(cpu_kernels_get()->name, "scalar") != 0; }

static void test_matmul_vs_reference(void)
{
    if (!simd_available()) {
        fprintf(stderr, "  (no AVX2 on this CPU: only the reference runs)\n");
        return;
    }
    const cpu_kernels *sets[2] = { cpu_kernels_avx2(), cpu_kernels_get() };
    for (int ks = 0; ks < 2; ks++) {
    const cpu_kernels *kern = sets[ks];
    const int shapes[][3] = { { 1, 37, 8 }, { 1, 64, 64 }, { 3, 17, 172 }, { 5, 33, 7 }, { 7, 100, 344 }, { 2, 9, 1 }, { 4, 24, 31 }, { 1, 19, 16 } };
    for (int dt = 0; dt < 3; dt++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int T = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            void *W = make_w((qdtype)dt, N * K);
            float *x = malloc(sizeof(float) * (size_t)T * K);
            for (int i = 0; i < T * K; i++) x[i] = frand();
            float *y1 = malloc(sizeof(float) * (size_t)T * N), *y2 = malloc(sizeof(float) * (size_t)T * N);
            /* Poison the outputs so an unwritten element fails. */
            for (int i = 0; i < T * N; i++) y1[i] = y2[i] = NAN;
            cpu_matmul_ref(y1, N, x, T, W, (qdtype)dt, K, 0, N);
            kern->matmul(y2, N, x, T, W, (qdtype)dt, K, 0, N);
            double num = 0, den = 0;
            int nan = 0;
            for (int i = 0; i < T * N; i++) {
                nan |= isnan(y2[i]);
                num += (y1[i] - y2[i]) * (double)(y1[i] - y2[i]);
                den += (double)y1[i] * y1[i];
            }
            CHECK(!nan);
            CHECK(sqrt(num / (den + 1e-30)) < 1e-6);
            free(W);
            free(x);
            free(y1);
            free(y2);
        }
    }
}

/* Row by row, token by token, or all at once: bit-identical. */
static void test_matmul_tile_invariance(void)
{
    const cpu_kernels *k = cpu_kernels_get();
    const int T = 7, N = 45, K = 133;
    for (int dt = 0; dt < 3; dt++) {
        void *W = make_w((qdtype)dt, N * K);
        float *x = malloc(sizeof(float) * T * K), *all = malloc(sizeof(float) * T * N), *one = malloc(sizeof(float) * T * N);
        for (int i = 0; i < T * K; i++) x[i] = frand();
        k->matmul(all, N, x, T, W, (qdtype)dt, K, 0, N);
        for (int t = 0; t < T; t++)
            for (int o = 0; o < N; o += 5) k->matmul(one + (size_t)t * N, N, x + (size_t)t * K, 1, W, (qdtype)dt, K, o, o + 5 < N ? o + 5 : N);
        CHECK(!memcmp(all, one, sizeof(float) * T * N));
        free(W);
        free(x);
        free(all);
        free(one);
    }
}

static void test_dot_axpy(void)
{
    const cpu_kernels *r = cpu_kernels_ref();
    const cpu_kernels *sets[2] = { cpu_kernels_avx2() ? cpu_kernels_avx2() : r, cpu_kernels_get() };
    for (int ks = 0; ks < 2; ks++)
    for (int n = 1; n < 70; n += 3) {
        const cpu_kernels *k = sets[ks];
        float a[70], b[70], y1[70], y2[70];
        for (int i = 0; i < n; i++) a[i] = frand(), b[i] = frand(), y1[i] = y2[i] = frand();
        float d1 = r->dot(a, b, n), d2 = k->dot(a, b, n);
        CHECK(fabsf(d1 - d2) <= 1e-5f * (1 + fabsf(d1)));
        r->axpy(y1, 0.37f, a, n);
        k->axpy(y2, 0.37f, a, n);
        for (int i = 0; i < n; i++) CHECK(fabsf(y1[i] - y2[i]) <= 1e-6f);
    }
}

static void test_attention_blocks(void)
{
    const cpu_kernels *r = cpu_kernels_ref();
    const cpu_kernels *sets[2] = { cpu_kernels_avx2() ? cpu_kernels_avx2() : r, cpu_kernels_get() };
    const int hds[] = { 8, 16, 24, 64, 72, 128 };
    for (int ks = 0; ks < 2; ks++)
        for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++) {
            const int hd = hds[h], n = 13;
            float q[128], k[13 * 128], v[13 * 128], s1[13], s2[13], o1[128], o2[128];
            for (int i = 0; i < hd; i++) q[i] = frand(), o1[i] = o2[i] = frand();
            for (int i = 0; i < n * hd; i++) k[i] = frand(), v[i] = frand();
            for (int j = 0; j < n; j++) s1[j] = s2[j] = NAN;
            r->attn_scores(s1, q, k, n, hd, 0.125f);
            sets[ks]->attn_scores(s2, q, k, n, hd, 0.125f);
            for (int j = 0; j < n; j++) CHECK(fabsf(s1[j] - s2[j]) <= 1e-5f * (1 + fabsf(s1[j])));
            r->attn_accum(o1, s1, v, n, hd);
            sets[ks]->attn_accum(o2, s1, v, n, hd);
            for (int d = 0; d < hd; d++) CHECK(fabsf(o1[d] - o2[d]) <= 1e-5f * (1 + fabsf(o1[d])));
        }
}

static void test_norm_swiglu_convert(void)
{
    float x[9] = { 1, -2, 3, -4, 5, -6, 7, -8, 9 }, y[9], w[9];
    for (int i = 0; i < 9; i++) w[i] = 0.5f;
    cpu_rmsnorm(y, x, w, QDT_F32, 9, 0);
    double ss = 0;
    for (int i = 0; i < 9; i++) ss += x[i] * x[i];
    double rms = sqrt(ss / 9);
    for (int i = 0; i < 9; i++) CHECK(fabs(y[i] - x[i] / rms * 0.5) < 1e-6);
    float g[3] = { 0, 1, -20 }, u[3] = { 2, 2, 2 }, o[3];
    cpu_swiglu(o, g, u, 3);
    CHECK(o[0] == 0.0f);
    CHECK(fabsf(o[1] - 2.0f / (1.0f + expf(-1.0f))) < 1e-6f);
    CHECK(fabsf(o[2]) < 1e-6f);
    uint16_t h[3] = { q_f32_to_f16(1.5f), q_f32_to_f16(-0.25f), q_f32_to_f16(3.0f) };
    float f[2];
    cpu_to_f32(f, h, QDT_F16, 1, 2);
    CHECK(f[0] == -0.25f && f[1] == 3.0f);
    uint16_t bf[2] = { q_f32_to_bf16(2.0f), q_f32_to_bf16(-1.0f) };
    cpu_to_f32(f, bf, QDT_BF16, 0, 2);
    CHECK(f[0] == 2.0f && f[1] == -1.0f);
}

int main(void)
{
    fprintf(stderr, "kernels in use: %s\n", cpu_kernels_get()->name);
    QT_RUN(test_matmul_vs_reference);
    QT_RUN(test_matmul_tile_invariance);
    QT_RUN(test_dot_axpy);
    QT_RUN(test_attention_blocks);
    QT_RUN(test_norm_swiglu_convert);
    QT_MAIN_END();
}
