/* test_gpu_ops.c - the CUDA backend's non-attention kernels (qk_convert,
 * qk_embed, qk_rmsnorm, qk_swiglu, qk_rope_store, qk_gemv, qk_fill_uniform)
 * against CPU references, and the fused forms decode steps use (attention
 * with rope_store folded in, gate/up with SwiGLU) against the unfused ones,
 * bit for bit, on fresh random inputs (seed from the clock, or
 * QUIRE_TEST_SEED; printed first).  Inputs a kernel reads in the storage
 * type are rounded to it first (cuda_selftest_round), so a reference sees
 * what the kernel sees; references are computed in double.  Every output is
 * poisoned with NaN before the run (kernels/cuda/cuda_selftest_ops.cu), so
 * an element a kernel does not write fails.
 *
 * Thresholds.  "ulp" is the spacing of the storage type's values at the
 * reference value (the subnormal spacing below its normal range):
 *   convert   bit-exact against base/util.h's q_f32_to_bf16 /
 *             q_f32_to_f16 / q_bf16_to_f32 / q_f16_to_f32 for all nine
 *             type pairs: every bf16 and f16 pattern, and ±0, float
 *             subnormals, ties, values that round to inf, inf; NaN stays NaN.
 *   embed     exact (a copy of the rounded table).
 *   rmsnorm   f32 4 ulp (three float roundings after the double sum);
 *             bf16 / f16 1 ulp (one rounding of that float).
 *   swiglu    f32 8 ulp (expf is within 2 ulp, then three roundings);
 *             bf16 / f16 1 ulp.
 *   rope      relative L2 error of each (token, head) vector of q, k and v:
 *             f32 1e-5, f16 5e-3, bf16 2e-2; every cache element that is
 *             not a written slot must still hold the poison.
 *   gemv      (bf16 / f16 inputs, float accumulation of products that are
 *             exact in float) per token ||y - ref|| / ||sum |x W| + |beta y0|||
 *             below 1e-5 (the worst-case bound, K/(32 S) + 6 + log2 S float
 *             roundings with K split over S warps, is at most 8.3e-6 on
 *             these shapes); bit-identical results for 1 and 2 rows a warp
 *             and for every batch size n = 1..8.
 *   fused     attention with RoPE folded in, gemv_swiglu: every output and
 *             cache element the bits of the unfused pair; no NaN.
 *   fill      each value within (f32) 4 float ulps / (bf16, f16) 1 ulp,
 *             at max(|lo|, |hi|), of the generator's formula evaluated on
 *             the CPU; all in [round(lo), round(hi)]; mean and variance
 *             of a uniform distribution within 0.5% and 2%; float output's
 *             64-bin chi-square below 150 (63 degrees of freedom).
 * Skipped, with a message, without a device or a CUDA build. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "gpu_test.h"
#include "qtest.h"
#ifdef QUIRE_HAVE_CUDA
#include "util.h"
#endif

#ifdef QUIRE_HAVE_CUDA
static uint64_t rng;
static uint64_t next_u64(void)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return rng;
}
/* Uniform in [-1, 1). */
static float frand(void) { return (float)((next_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static int irand(int n) { return (int)((next_u64() >> 33) % (uint64_t)n); }

static const int all_dts[3] = { QDT_F32, QDT_BF16, QDT_F16 };
static const char *dname(int dt) { return dt == QDT_F32 ? "f32" : dt == QDT_BF16 ? "bf16" : "f16"; }
static double tol_l2(int dt) { return dt == QDT_F32 ? 1e-5 : dt == QDT_F16 ? 5e-3 : 2e-2; }

/* Spacing of dtype's values at |v|: 2^(e - precision) for v in [2^(e-1),
 * 2^e), and the subnormal spacing below the smallest normal. */
static double ulp(int dt, double v)
{
    const int prec = dt == QDT_F32 ? 24 : dt == QDT_BF16 ? 8 : 11;
    const int emin = dt == QDT_F16 ? -13 : -125; /* frexp exponent of the smallest normal */
    int e = emin;
    if (v != 0) frexp(fabs(v), &e);
    if (e < emin) e = emin;
    return ldexp(1.0, e - prec);
}
/* |got - ref| in ulps of ref; infinite when got is NaN. */
static double ulps(int dt, double got, double ref) { return isnan(got) ? INFINITY : fabs(got - ref) / ulp(dt, ref); }

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- qk_convert ----------------------------------------------------------- */

static int is_nan16(int dt, uint16_t h) { return (h & 0x7fff) > (dt == QDT_BF16 ? 0x7f80 : 0x7c00); }
static float wide16(int dt, uint16_t h) { return dt == QDT_BF16 ? q_bf16_to_f32(h) : q_f16_to_f32(h); }
static uint16_t narrow16(int dt, float f) { return dt == QDT_BF16 ? q_f32_to_bf16(f) : q_f32_to_f16(f); }

/* Float sources: edge values, then random bit patterns (a third over every
 * exponent, the rest over the exponents of f16's range, subnormals
 * included), more than one grid of the kernel's threads. */
static size_t convert_sources(float *src, size_t n)
{
    static const uint32_t edge_bits[] = {
        0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007fffff, 0x00800000, 0x00400000, 0x7f7fffff,
        0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f7f8000, 0x7f7f7fff, 0x3f808000,
        0x3f818000, 0x3f808001, 0x3f807fff, 0x477fe000, 0x477fefff, 0x477ff000, 0x47800000, 0x33800000,
        0x33000000, 0x33000001, 0x33400000, 0x32ffffff, 0x38800000, 0x387fc000, 0x387fe000, 0x34000000,
        0x3f800000, 0xbf800000, 0x3f801000, 0x3f803000, 0x00008000, 0x00018000, 0x80008000,
    };
    size_t k = 0;
    for (; k < sizeof edge_bits / sizeof edge_bits[0] && k < n; k++) src[k] = bitsf(edge_bits[k]);
    for (; k < n; k++) {
        uint32_t u = (uint32_t)(next_u64() >> 32);
        if (k % 3) u = (u & 0x807fffff) | (uint32_t)(127 - 28 + irand(46)) << 23;
        src[k] = bitsf(u);
    }
    return k;
}

static void test_convert(void)
{
    /* Both counts above 1024 x 256 threads: the grid-stride loop runs twice. */
    const size_t nf = 300000, n16 = 5 * 65536, nmax = nf > n16 ? nf : n16;
    float *src = malloc(nf * 4), *outf = malloc(nmax * 4);
    uint16_t *src16 = malloc(n16 * 2), *out16 = malloc(nmax * 2);
    REQUIRE(src && outf && src16 && out16);
    convert_sources(src, nf);
    for (size_t i = 0; i < n16; i++) src16[i] = (uint16_t)i;
    for (int di = 0; di < 3; di++)
        for (int si = 0; si < 3; si++) {
            const int dst = all_dts[di], from = all_dts[si];
            const size_t n = from == QDT_F32 ? nf : n16;
            int rc = cuda_selftest_convert(dst, from, from == QDT_F32 ? (const void *)src : (const void *)src16, n,
                                           dst == QDT_F32 ? (void *)outf : (void *)out16);
            size_t bad = 0, shown = 0;
            for (size_t i = 0; !rc && i < n; i++) {
                const float x = from == QDT_F32 ? src[i] : wide16(from, src16[i]);
                uint32_t got, want;
                int nan_in = isnan(x), nan_out;
                if (dst == QDT_F32) {
                    got = fbits(outf[i]);
                    want = fbits(x);
                    nan_out = isnan(outf[i]);
                } else {
                    got = out16[i];
                    want = narrow16(dst, x);
                    nan_out = is_nan16(dst, out16[i]);
                }
                int ok = nan_in ? nan_out : got == want;
                if (!ok && shown++ < 5)
                    fprintf(stderr, "    %s -> %s: source bits 0x%08x (%.9g): got 0x%x, want 0x%x\n", dname(from),
                            dname(dst), from == QDT_F32 ? fbits(src[i]) : src16[i], x, got, want);
                bad += !ok;
            }
            fprintf(stderr, "  convert %s -> %s (%zu values): rc %d, %zu differ from the host's rounding\n",
                    dname(from), dname(dst), n, rc, bad);
            CHECK(rc == 0 && bad == 0);
        }
    free(src), free(outf), free(src16), free(out16);
}

/* ---- qk_embed ------------------------------------------------------------- */

static void test_embed(void)
{
    const int Ds[] = { 1, 64, 300, 4096 }, V = 50, n = 17;
    for (int di = 0; di < 3; di++)
        for (size_t k = 0; k < sizeof Ds / sizeof Ds[0]; k++) {
            const int dt = all_dts[di], D = Ds[k];
            float *emb = malloc(sizeof(float) * V * D), *x = malloc(sizeof(float) * n * D);
            int32_t tok[17];
            REQUIRE(emb && x);
            for (int i = 0; i < V * D; i++) emb[i] = frand() * 3;
            REQUIRE(cuda_selftest_round(dt, emb, (size_t)V * D) == 0);
            for (int i = 0; i < n; i++) tok[i] = i == 0 ? 0 : i == 1 ? V - 1 : irand(V);
            int rc = cuda_selftest_embed(dt, emb, V, D, tok, n, x);
            size_t bad = 0;
            for (int i = 0; !rc && i < n; i++)
                for (int j = 0; j < D; j++) bad += fbits(x[(size_t)i * D + j]) != fbits(emb[(size_t)tok[i] * D + j]);
            fprintf(stderr, "  embed %s D=%d n=%d: rc %d, %zu of %d elements differ (required 0)\n", dname(dt), D, n,
                    rc, bad, n * D);
            CHECK(rc == 0 && bad == 0);
            free(emb), free(x);
        }
}

/* ---- qk_rmsnorm ----------------------------------------------------------- */

static void test_rmsnorm(void)
{
    const int Ds[] = { 8, 64, 100, 2048, 5120, 8192 };
    /* Rows scaled by 1, 1e-3 (eps dominates), 40, 0 (all zeros) in turn. */
    const float row_scale[4] = { 1.0f, 1e-3f, 40.0f, 0.0f };
    for (int di = 0; di < 3; di++)
        for (size_t k = 0; k < sizeof Ds / sizeof Ds[0]; k++)
            for (int gather = 0; gather < 2; gather++) {
                const int dt = all_dts[di], D = Ds[k], n = 5, n_x = gather ? 9 : n;
                const float eps = gather ? 1e-6f : 1e-5f;
                float *x = malloc(sizeof(float) * n_x * D), *w = malloc(sizeof(float) * D),
                      *y = malloc(sizeof(float) * n * D);
                int32_t rows[5];
                REQUIRE(x && w && y);
                for (int r = 0; r < n_x; r++)
                    for (int i = 0; i < D; i++) x[(size_t)r * D + i] = frand() * row_scale[r % 4];
                for (int i = 0; i < D; i++) w[i] = frand() * 1.5f;
                for (int i = 0; i < n; i++) rows[i] = i == 0 ? n_x - 1 : irand(n_x);
                /* Gathered rows run without weights (the layers' norms, whose
                 * weights are folded into the projections after them). */
                const float *wk = gather ? NULL : w;
                int rc = cuda_selftest_rmsnorm(dt, x, n_x, wk, n, D, eps, gather ? rows : NULL, y);
                double worst = rc ? INFINITY : 0;
                for (int i = 0; !rc && i < n; i++) {
                    const float *xr = x + (size_t)(gather ? rows[i] : i) * D;
                    double ss = 0;
                    for (int j = 0; j < D; j++) ss += (double)xr[j] * xr[j];
                    const double inv = 1.0 / sqrt(ss / D + (double)eps);
                    for (int j = 0; j < D; j++) {
                        double e = ulps(dt, y[(size_t)i * D + j], xr[j] * inv * (wk ? w[j] : 1.0));
                        if (e > worst) worst = e;
                    }
                }
                const double lim = dt == QDT_F32 ? 4 : 1;
                fprintf(stderr, "  rmsnorm %s D=%d %s: rc %d, max error %.3g ulp (limit %g)\n", dname(dt), D,
                        gather ? "gathered rows, no weights" : "all rows", rc, worst, lim);
                CHECK(rc == 0 && worst <= lim);
                free(x), free(w), free(y);
            }
}

/* ---- qk_swiglu ------------------------------------------------------------ */

static void test_swiglu(void)
{
    const int shapes[][2] = { { 1, 8 }, { 3, 100 }, { 5, 8192 }, { 1, 14336 } };
    for (int di = 0; di < 3; di++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            const int dt = all_dts[di], n = shapes[k][0], F = shapes[k][1];
            float *gu = malloc(sizeof(float) * 2 * n * F), *h = malloc(sizeof(float) * n * F);
            REQUIRE(gu && h);
            /* Gates over [-20, 20] (silu's tails), up over [-2, 2]. */
            for (int t = 0; t < n; t++)
                for (int j = 0; j < F; j++) {
                    gu[(size_t)t * 2 * F + j] = frand() * (j % 4 == 0 ? 20.0f : 4.0f);
                    gu[(size_t)t * 2 * F + F + j] = frand() * 2;
                }
            int rc = cuda_selftest_swiglu(dt, gu, n, F, h);
            double worst = rc ? INFINITY : 0;
            for (int t = 0; !rc && t < n; t++)
                for (int j = 0; j < F; j++) {
                    const double g = gu[(size_t)t * 2 * F + j], u = gu[(size_t)t * 2 * F + F + j];
                    double e = ulps(dt, h[(size_t)t * F + j], g / (1.0 + exp(-g)) * u);
                    if (e > worst) worst = e;
                }
            const double lim = dt == QDT_F32 ? 8 : 1;
            fprintf(stderr, "  swiglu %s n=%d F=%d: rc %d, max error %.3g ulp (limit %g)\n", dname(dt), n, F, rc,
                    worst, lim);
            CHECK(rc == 0 && worst <= lim);
            free(gu), free(h);
        }
}

/* ---- qk_rope_store -------------------------------------------------------- */

typedef struct {
    int H, KV, hd, rope_dim, neox, bias;
    double theta;
} rope_shape;

typedef struct {
    const char *name;
    int n_seqs;
    int pos0[6], len[6]; /* pos0 < 0: a random start in [0, -pos0) */
} rope_layout;

/* ||got - ref|| / ||ref|| over n values; infinite when got holds a NaN. */
static double rel_l2(const float *got, const double *ref, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double g = got[i];
        if (isnan(g)) return INFINITY;
        num += (g - ref[i]) * (g - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double rope_case(int dt, const rope_shape *s, const rope_layout *lay, size_t *stray)
{
    const int bs = 16, W = (s->H + 2 * s->KV) * s->hd, half = s->rope_dim / 2;
    int n_tok = 0, n_table = 0, pos0[6];
    for (int q = 0; q < lay->n_seqs; q++) {
        pos0[q] = lay->pos0[q] < 0 ? irand(-lay->pos0[q]) : lay->pos0[q];
        n_tok += lay->len[q];
        n_table += (pos0[q] + lay->len[q] + bs - 1) / bs;
    }
    const int nb = n_table + 5; /* 5 blocks no table names: they must stay poisoned */
    const size_t cache_n = (size_t)nb * s->KV * bs * s->hd, block_elems = (size_t)s->KV * bs * s->hd;
    float *qkv = malloc(sizeof(float) * n_tok * W), *bias = malloc(sizeof(float) * W),
          *freq = malloc(sizeof(float) * half), *q = malloc(sizeof(float) * n_tok * s->H * s->hd),
          *kc = malloc(sizeof(float) * cache_n), *vc = malloc(sizeof(float) * cache_n);
    double *row = malloc(sizeof(double) * W);
    unsigned char *written = calloc(cache_n, 1);
    int32_t *pos = malloc(4 * (size_t)n_tok), *seq = malloc(4 * (size_t)n_tok), info[12],
            *tables = malloc(4 * (size_t)n_table), *perm = malloc(4 * (size_t)nb);
    double worst = INFINITY;
    if (!qkv || !bias || !freq || !q || !kc || !vc || !row || !written || !pos || !seq || !tables || !perm) goto done;
    for (int i = 0; i < n_tok * W; i++) qkv[i] = frand() * 2;
    for (int i = 0; i < W; i++) bias[i] = frand() * 0.5f;
    /* As qrope_inv_freq: computed in double, stored as float. */
    for (int i = 0; i < half; i++) freq[i] = (float)(1.0 / pow(s->theta, (double)(2 * i) / s->rope_dim));
    for (int i = 0; i < nb; i++) perm[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int qi = 0, t = 0, off = 0; qi < lay->n_seqs; qi++) {
        const int need = (pos0[qi] + lay->len[qi] + bs - 1) / bs;
        info[2 * qi] = off, info[2 * qi + 1] = need;
        for (int i = 0; i < need; i++) tables[off + i] = perm[off + i];
        off += need;
        for (int i = 0; i < lay->len[qi]; i++, t++) pos[t] = pos0[qi] + i, seq[t] = qi;
    }
    cuda_rope_case c = { dt, s->neox, s->rope_dim, s->H, s->KV, s->hd, bs, nb, qkv, s->bias ? bias : NULL, freq,
                         n_tok, pos, seq, lay->n_seqs, info, tables, n_table, NULL, NULL, 0.0f };
    int rc = cuda_selftest_rope_store(&c, q, kc, vc);
    if (rc) {
        fprintf(stderr, "    cuda_selftest_rope_store: rc %d\n", rc);
        goto done;
    }
    worst = 0;
    for (int t = 0; t < n_tok; t++) {
        const int p = pos[t];
        for (int i = 0; i < W; i++) row[i] = (double)qkv[(size_t)t * W + i] + (s->bias ? bias[i] : 0.0);
        for (int h = 0; h < s->H + s->KV; h++)
            for (int i = 0; i < half; i++) {
                /* The angle is the float product, as the CPU backend and the
                 * kernel form it; only its sine and cosine are exact here. */
                const float ang = (float)p * freq[i];
                const double cs = cos((double)ang), sn = sin((double)ang);
                double *base = row + (size_t)h * s->hd;
                const int a = s->neox ? i : 2 * i, b = s->neox ? i + half : 2 * i + 1;
                const double x0 = base[a], x1 = base[b];
                base[a] = x0 * cs - x1 * sn;
                base[b] = x1 * cs + x0 * sn;
            }
        const int32_t *tab = tables + info[2 * seq[t]];
        const size_t blk = (size_t)tab[p / bs] * block_elems;
        for (int h = 0; h < s->H; h++) {
            double e = rel_l2(q + ((size_t)t * s->H + h) * s->hd, row + (size_t)h * s->hd, s->hd);
            if (e > worst) worst = e;
        }
        for (int h = 0; h < s->KV; h++) {
            const size_t off = blk + ((size_t)h * bs + p % bs) * s->hd;
            const double *kref = row + (size_t)(s->H + h) * s->hd, *vref = row + (size_t)(s->H + s->KV + h) * s->hd;
            double ek = rel_l2(kc + off, kref, s->hd), ev = rel_l2(vc + off, vref, s->hd);
            if (ek > worst) worst = ek;
            if (ev > worst) worst = ev;
            memset(written + off, 1, (size_t)s->hd);
        }
    }
    *stray = 0;
    for (size_t i = 0; i < cache_n; i++) *stray += !written[i] && (!isnan(kc[i]) || !isnan(vc[i]));
done:
    free(qkv), free(bias), free(freq), free(q), free(kc), free(vc), free(row), free(written);
    free(pos), free(seq), free(tables), free(perm);
    return worst;
}

static void test_rope_store(void)
{
    static const rope_shape shapes[] = {
        { 32, 8, 128, 128, 1, 0, 500000 }, { 32, 8, 128, 128, 0, 0, 10000 }, { 14, 2, 64, 64, 1, 1, 1000000 },
        { 8, 4, 128, 64, 1, 1, 10000 },    { 6, 2, 80, 32, 0, 1, 10000 },    { 4, 1, 16, 16, 0, 0, 10000 },
    };
    /* Decode: six sequences of one token at random positions (<= 16 tokens:
     * 1024 threads a token).  Prefill: chunks, one after a cached prefix
     * (> 16 tokens: 256 threads a token). */
    static const rope_layout lays[] = {
        { "decode", 6, { -3000, -3000, -100, -17, 0, -3000 }, { 1, 1, 1, 1, 1, 1 } },
        { "prefill", 4, { 0, -400, 1000, -2040 }, { 40, 21, 1, 3 } },
    };
    for (int di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (size_t li = 0; li < sizeof lays / sizeof lays[0]; li++) {
                const int dt = all_dts[di];
                const rope_shape *s = &shapes[si];
                size_t stray = 0;
                double e = rope_case(dt, s, &lays[li], &stray);
                fprintf(stderr,
                        "  rope_store %s %s H=%d KV=%d hd=%d rope_dim=%d %s%s: max relative error %.3g (limit %g), "
                        "%zu cache elements outside the written slots changed\n",
                        dname(dt), lays[li].name, s->H, s->KV, s->hd, s->rope_dim, s->neox ? "neox" : "adjacent",
                        s->bias ? " +bias" : "", e, tol_l2(dt), stray);
                CHECK(e < tol_l2(dt));
                CHECK(stray == 0);
            }
}

/* ---- qk_attn_decode with RoPE folded in ------------------------------------ */

/* Decode steps (one token a sequence) fold rope_store into attention: the
 * output and both caches must be the bits that rope_store followed by the
 * plain attention kernel give (each tested against its CPU reference) -
 * plain, with QK-norm (Qwen3, Gemma 3), and with QK-norm and no rotation
 * (a NoPE layer: SmolLM3's every fourth). */
static void test_attn_rope(void)
{
    static const rope_shape shapes[] = {
        { 32, 8, 64, 64, 1, 0, 500000 }, { 32, 8, 128, 128, 1, 0, 500000 }, { 28, 4, 128, 128, 1, 1, 1000000 },
        { 8, 4, 128, 64, 0, 1, 10000 },  { 6, 2, 20, 12, 0, 1, 10000 },      { 16, 1, 64, 64, 1, 0, 10000 },
    };
    static const int splits[4][2] = { { 1, 4096 }, { 4, 1024 }, { 16, 256 }, { 32, 128 } };
    const int bs = 16, n = 6, pos0[6] = { 0, 5, 100, 1000, 4000, 31 };
    for (int di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const rope_shape *s = &shapes[si];
            const int dt = all_dts[di], W = (s->H + 2 * s->KV) * s->hd, half = s->rope_dim / 2;
            int pos[6], seq[6], info[12], n_table = 0;
            for (int i = 0; i < n; i++) {
                pos[i] = irand(pos0[i] + 1), seq[i] = i;
                info[2 * i] = n_table, info[2 * i + 1] = pos[i] / bs + 1;
                n_table += pos[i] / bs + 1;
            }
            const int nb = n_table + 3;
            const size_t cache_n = (size_t)nb * s->KV * bs * s->hd, q_n = (size_t)n * s->H * s->hd;
            float *qkv = malloc(sizeof(float) * n * W), *bias = malloc(sizeof(float) * W),
                  *freq = malloc(sizeof(float) * half), *kc = malloc(sizeof(float) * cache_n),
                  *vc = malloc(sizeof(float) * cache_n), *out = malloc(sizeof(float) * q_n),
                  *qn = malloc(sizeof(float) * s->hd), *kn = malloc(sizeof(float) * s->hd);
            int32_t *tables = malloc(4 * (size_t)n_table), *perm = malloc(4 * (size_t)nb);
            REQUIRE(qkv && bias && freq && kc && vc && out && qn && kn && tables && perm);
            for (int i = 0; i < s->hd; i++) qn[i] = 1.0f + frand() * 0.5f, kn[i] = 1.0f + frand() * 0.5f;
            for (int i = 0; i < n * W; i++) qkv[i] = frand() * 2;
            for (int i = 0; i < W; i++) bias[i] = frand() * 0.5f;
            for (int i = 0; i < half; i++) freq[i] = (float)(1.0 / pow(s->theta, (double)(2 * i) / s->rope_dim));
            for (size_t i = 0; i < cache_n; i++) kc[i] = frand(), vc[i] = frand();
            for (int i = 0; i < nb; i++) perm[i] = i;
            for (int i = nb - 1; i > 0; i--) {
                int j = irand(i + 1), t = perm[i];
                perm[i] = perm[j], perm[j] = t;
            }
            memcpy(tables, perm, 4 * (size_t)n_table);
            /* v 0: RoPE; 1: QK-norm and RoPE; 2: QK-norm, no rotation */
            for (int v = 0; v < 3; v++)
                for (int k = 0; k < 4; k++) {
                    cuda_rope_case c = { dt,   s->neox, v == 2 ? 0 : s->rope_dim, s->H, s->KV,      s->hd,   bs,
                                         nb,   qkv,     s->bias ? bias : NULL,    freq, n,          pos,     seq,
                                         n,    info,    tables,                   n_table, v ? qn : NULL, v ? kn : NULL,
                                         1e-6f };
                    size_t mismatch = 1;
                    int rc = cuda_selftest_attn_rope(&c, kc, vc, splits[k][0], splits[k][1], out, &mismatch);
                    size_t nan = 0;
                    for (size_t i = 0; !rc && i < q_n; i++) nan += isnan(out[i]) != 0;
                    fprintf(stderr,
                            "  attention with RoPE%s folded in, %s H=%d KV=%d hd=%d rope_dim=%d %s%s, %d splits: rc %d, "
                            "%zu elements differ in bits from rope_store + attention, %zu NaN\n",
                            v ? " and QK-norm" : "", dname(dt), s->H, s->KV, s->hd, c.rope_dim,
                            s->neox ? "neox" : "adjacent", s->bias ? " +bias" : "", splits[k][0], rc, mismatch, nan);
                    CHECK(rc == 0 && mismatch == 0 && nan == 0);
                }
            free(qkv), free(bias), free(freq), free(kc), free(vc), free(out), free(qn), free(kn), free(tables),
                free(perm);
        }
    /* Sequences that share a token are refused (the fold is for decode steps only). */
    float z[64] = { 0 }, o[64];
    int32_t zp[2] = { 0, 1 }, zs[2] = { 0, 0 }, zi[2] = { 0, 1 }, zt[1] = { 0 };
    cuda_rope_case bad = { QDT_BF16, 1, 8, 1, 1, 8, 16, 1, z, NULL, z, 2, zp, zs, 1, zi, zt, 1, NULL, NULL, 0.0f };
    size_t mm = 0;
    CHECK_EQ_INT(cuda_selftest_attn_rope(&bad, z, z, 1, 16, o, &mm), QERR_INVAL);
    /* QK-norm's weights come in pairs. */
    int32_t one_s[1] = { 0 };
    cuda_rope_case half_norm = { QDT_BF16, 1, 8, 1, 1, 8, 16, 1, z, NULL, z, 1, zp, one_s, 1, zi, zt, 1, z, NULL, 1e-6f };
    CHECK_EQ_INT(cuda_selftest_attn_rope(&half_norm, z, z, 1, 16, o, &mm), QERR_INVAL);
}

/* ---- qk_gemv -------------------------------------------------------------- */

#define GEMV_TOL 1e-5

/* Worst token's ||y - ref|| / ||scale|| over n tokens of N outputs. */
static double gemv_err(const float *y, const double *dot, const double *absdot, const float *y0, float beta, int n,
                       int N)
{
    double worst = 0;
    for (int t = 0; t < n; t++) {
        double num = 0, den = 0;
        for (int j = 0; j < N; j++) {
            const size_t i = (size_t)t * N + j;
            const double ref = dot[i] + (double)beta * y0[i], sc = absdot[i] + fabs((double)beta * y0[i]);
            if (isnan(y[i])) return INFINITY;
            num += (y[i] - ref) * (y[i] - ref);
            den += sc * sc;
        }
        if (sqrt(num / den) > worst) worst = sqrt(num / den);
    }
    return worst;
}

/* A projection case: x (n, K) and W (N, K) rounded to dtype, y0 (n, N) for
 * beta, the double-precision dot products and their absolute sums, and
 * room for two results (y, base) and a copy (yc). */
typedef struct {
    float *x, *W, *y0, *y, *base, *yc;
    double *dot, *absdot;
} gemv_case;

static void gemv_case_make(gemv_case *c, int dt, int n, int N, int K)
{
    const size_t yn = (size_t)n * N;
    c->x = malloc(sizeof(float) * n * K), c->W = malloc(sizeof(float) * N * K);
    c->y0 = malloc(sizeof(float) * yn), c->y = malloc(sizeof(float) * yn), c->base = malloc(sizeof(float) * yn);
    c->yc = malloc(sizeof(float) * yn);
    c->dot = malloc(sizeof(double) * yn), c->absdot = malloc(sizeof(double) * yn);
    REQUIRE(c->x && c->W && c->y0 && c->y && c->base && c->yc && c->dot && c->absdot);
    for (int i = 0; i < n * K; i++) c->x[i] = frand();
    for (size_t i = 0; i < (size_t)N * K; i++) c->W[i] = frand() * 0.1f;
    REQUIRE(cuda_selftest_round(dt, c->x, (size_t)n * K) == 0 && cuda_selftest_round(dt, c->W, (size_t)N * K) == 0);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < N; j++) {
            double d = 0, a = 0;
            for (int k = 0; k < K; k++) {
                const double pr = (double)c->x[(size_t)t * K + k] * c->W[(size_t)j * K + k];
                d += pr, a += fabs(pr);
            }
            c->dot[(size_t)t * N + j] = d, c->absdot[(size_t)t * N + j] = a;
            c->y0[(size_t)t * N + j] = frand() * (float)sqrt(a / K * 8);
        }
}

static void gemv_case_free(gemv_case *c)
{
    free(c->x), free(c->W), free(c->y0), free(c->y), free(c->base), free(c->yc), free(c->dot), free(c->absdot);
}

static void test_gemv(void)
{
    /* K split in 1, 2, 4 and 8 (cuda_ops.cu's gemv_split): K >= 2048 with at
     * most 8192 rows, and no more than 2048 of K a warp. */
    const int shapes[][2] = { { 1, 8 },      { 7, 64 },     { 17, 264 }, { 64, 520 },
                              { 300, 2048 }, { 2053, 4096 }, { 37, 8192 }, { 9, 14336 } };
    const int dts[2] = { QDT_BF16, QDT_F16 }, NT = 8;
    for (int di = 0; di < 2; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int dt = dts[di], N = shapes[si][0], K = shapes[si][1];
            gemv_case c;
            gemv_case_make(&c, dt, NT, N, K);
            float *x = c.x, *Wm = c.W, *y0 = c.y0, *y = c.y, *base = c.base;
            const double *dot = c.dot, *absdot = c.absdot;
            for (int bi = 0; bi < 2; bi++) {
                const float beta = (float)bi;
                double worst = 0;
                size_t diff_bits = 0;
                int rc = 0;
                /* Reference bits for the invariance checks: all 8 tokens, 1 row a warp. */
                rc = cuda_selftest_gemv(dt, x, Wm, NT, N, K, beta, y0, 1, base);
                if (!rc) worst = gemv_err(base, dot, absdot, y0, beta, NT, N);
                for (int n = 1; !rc && n <= NT; n++)
                    for (int R = 1; !rc && R <= 2; R++) {
                        rc = cuda_selftest_gemv(dt, x, Wm, n, N, K, beta, y0, R, y);
                        if (rc) break;
                        double e = gemv_err(y, dot, absdot, y0, beta, n, N);
                        if (e > worst) worst = e;
                        for (size_t i = 0; i < (size_t)n * N; i++) diff_bits += fbits(y[i]) != fbits(base[i]);
                    }
                /* Each token alone (n = 1, its own x and y0 rows) gives its batched result. */
                for (int t = 0; !rc && t < NT; t++)
                    for (int R = 1; !rc && R <= 2; R++) {
                        rc = cuda_selftest_gemv(dt, x + (size_t)t * K, Wm, 1, N, K, beta, y0 + (size_t)t * N, R, y);
                        for (int j = 0; !rc && j < N; j++) diff_bits += fbits(y[j]) != fbits(base[(size_t)t * N + j]);
                    }
                fprintf(stderr,
                        "  gemv %s N=%d K=%d beta=%g, n=1..8, 1 and 2 rows a warp: rc %d, max error %.3g (limit %g), "
                        "%zu results differ in bits from the 8-token batch\n",
                        dname(dt), N, K, beta, rc, rc ? INFINITY : worst, GEMV_TOL, diff_bits);
                CHECK(rc == 0 && worst < GEMV_TOL && diff_bits == 0);
            }
            gemv_case_free(&c);
        }
    /* Shapes the kernel does not take are refused, not run. */
    float z[16 * 9] = { 0 }, out[16 * 9];
    CHECK_EQ_INT(cuda_selftest_gemv(QDT_F32, z, z, 1, 1, 8, 0, NULL, 1, out), QERR_UNSUPPORTED);
    CHECK_EQ_INT(cuda_selftest_gemv(QDT_BF16, z, z, 9, 1, 8, 0, NULL, 1, out), QERR_UNSUPPORTED);
    CHECK_EQ_INT(cuda_selftest_gemv(QDT_BF16, z, z, 0, 1, 8, 0, NULL, 1, out), QERR_UNSUPPORTED);
    CHECK_EQ_INT(cuda_selftest_gemv(QDT_F16, z, z, 1, 1, 12, 0, NULL, 1, out), QERR_UNSUPPORTED);
}

/* The tensor-core projection, each of its variants: n = 1..8 tokens against
 * the double-precision dot products, beta 0 and 1, each token's result the
 * same bits whatever the others in the pass, its copy in the storage type
 * the float result rounded, and the shapes it does not take refused. */
static void test_gemv_mma(void)
{
    /* K of 24 chunks of 128 (3072): the warps' rings refilled and then cut short. */
    const int shapes[][2] = { { 1, 128 },     { 31, 256 },  { 33, 384 },  { 300, 2048 },
                              { 2053, 4096 }, { 96, 3072 }, { 40, 14336 } };
    const int dts[2] = { QDT_BF16, QDT_F16 }, NT = 8;
    for (int di = 0; di < 2; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int dt = dts[di], N = shapes[si][0], K = shapes[si][1];
            gemv_case c;
            gemv_case_make(&c, dt, NT, N, K);
            for (int v = 1; v <= 2; v++)
                for (int bi = 0; bi < 2; bi++) {
                    const float beta = (float)bi;
                    double worst = 0;
                    size_t bad_copy = 0, diff_bits = 0;
                    int rc = cuda_selftest_gemv_mma(dt, c.x, c.W, NT, N, K, beta, c.y0, v, c.base, NULL);
                    for (int n = 1; !rc && n <= NT; n++) {
                        rc = cuda_selftest_gemv_mma(dt, c.x, c.W, n, N, K, beta, c.y0, v, c.y, c.yc);
                        if (rc) break;
                        const double e = gemv_err(c.y, c.dot, c.absdot, c.y0, beta, n, N);
                        if (e > worst) worst = e;
                        for (size_t i = 0; i < (size_t)n * N; i++) {
                            diff_bits += fbits(c.y[i]) != fbits(c.base[i]);
                            float r = c.y[i];
                            REQUIRE(cuda_selftest_round(dt, &r, 1) == 0);
                            bad_copy += fbits(r) != fbits(c.yc[i]);
                        }
                    }
                    /* Each token alone (its own x and y0 rows, at column 0) gives its batched result. */
                    for (int t = 0; !rc && t < NT; t++) {
                        rc = cuda_selftest_gemv_mma(dt, c.x + (size_t)t * K, c.W, 1, N, K, beta, c.y0 + (size_t)t * N,
                                                    v, c.y, NULL);
                        for (int j = 0; !rc && j < N; j++)
                            diff_bits += fbits(c.y[j]) != fbits(c.base[(size_t)t * N + j]);
                    }
                    fprintf(stderr,
                            "  gemv_mma %s N=%d K=%d beta=%g variant %d, n=1..8 and each alone: rc %d, max error %.3g "
                            "(limit %g), %zu differ from the 8-token batch, %zu copies off\n",
                            dname(dt), N, K, beta, v, rc, rc ? INFINITY : worst, GEMV_TOL, diff_bits, bad_copy);
                    CHECK(rc == 0 && worst < GEMV_TOL && diff_bits == 0 && bad_copy == 0);
                }
            gemv_case_free(&c);
        }
    float z[9 * 256] = { 0 }, out[9 * 256];
    CHECK_EQ_INT(cuda_selftest_gemv_mma(QDT_F32, z, z, 2, 1, 128, 0, NULL, 0, out, NULL), QERR_UNSUPPORTED);
    CHECK_EQ_INT(cuda_selftest_gemv_mma(QDT_BF16, z, z, 0, 1, 128, 0, NULL, 0, out, NULL), QERR_UNSUPPORTED);
    CHECK_EQ_INT(cuda_selftest_gemv_mma(QDT_BF16, z, z, 9, 1, 128, 0, NULL, 0, out, NULL), QERR_UNSUPPORTED);
    CHECK_EQ_INT(cuda_selftest_gemv_mma(QDT_F16, z, z, 4, 1, 96, 0, NULL, 0, out, NULL), QERR_UNSUPPORTED);
}

/* ---- qk_gemv_swiglu ------------------------------------------------------- */

/* The gate/up projection with SwiGLU (GeGLU) on the way out gives the bits
 * of qk_gemv on the whole matrix and qk_swiglu (qk_geglu) after it, for 1 to
 * 8 tokens, with the K split (2F <= 8192, K >= 2048) and without it. */
static void test_gemv_swiglu(void)
{
    const int shapes[][2] = { { 4, 8 }, { 33, 264 }, { 300, 2048 }, { 2053, 4096 }, { 4200, 2048 }, { 40, 14336 } };
    const int dts[2] = { QDT_BF16, QDT_F16 }, ns[3] = { 1, 3, 8 };
    for (int di = 0; di < 2; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int dt = dts[di], F = shapes[si][0], K = shapes[si][1];
            float *x = malloc(sizeof(float) * 8 * K), *Wm = malloc(sizeof(float) * 2 * F * K),
                  *h = malloc(sizeof(float) * 8 * F);
            REQUIRE(x && Wm && h);
            for (int i = 0; i < 8 * K; i++) x[i] = frand();
            for (size_t i = 0; i < (size_t)2 * F * K; i++) Wm[i] = frand() * (float)(4.0 / sqrt(K));
            for (int k = 0; k < 6; k++) {
                const int gelu = k >= 3, n = ns[k % 3];
                size_t mismatch = 1, nan = 0;
                int rc = cuda_selftest_gemv_swiglu(dt, x, Wm, n, F, K, gelu, h, &mismatch);
                for (int i = 0; !rc && i < n * F; i++) nan += isnan(h[i]) != 0;
                fprintf(stderr, "  gemv_%s %s n=%d F=%d K=%d: rc %d, %zu differ in bits from gemv + %s, %zu NaN\n",
                        gelu ? "geglu" : "swiglu", dname(dt), n, F, K, rc, mismatch, gelu ? "geglu" : "swiglu", nan);
                CHECK(rc == 0 && mismatch == 0 && nan == 0);
            }
            free(x), free(Wm), free(h);
        }
    float z[16] = { 0 }, out[16];
    size_t mm = 0;
    CHECK_EQ_INT(cuda_selftest_gemv_swiglu(QDT_F32, z, z, 1, 1, 8, 0, out, &mm), QERR_UNSUPPORTED);
    CHECK_EQ_INT(cuda_selftest_gemv_swiglu(QDT_BF16, z, z, 9, 1, 8, 1, out, &mm), QERR_UNSUPPORTED);
}

/* ---- qk_gemv_norm, qk_gemv_swiglu_norm, qk_scale_cols ---------------------- */

static float round_to(int dt, float f);

/* The projections with the RMSNorm before them folded in, against a double
 * reference: y = (W x) / rms(x) from the residual rows in T (scaled by 1,
 * 1e-3 and 30, so that eps and large rows are seen), and h = silu(g) * u
 * (gelu_tanh(g) * u) of the two halves; and every token's bits the same
 * alone as in a batch of 8, with 1 and 2 rows a warp. */
static void test_gemv_norm(void)
{
    const int shapes[][2] = { { 7, 64 }, { 33, 264 }, { 300, 2048 }, { 96, 3072 }, { 2053, 4096 }, { 40, 8192 } };
    const int dts[2] = { QDT_BF16, QDT_F16 }, NT = 8;
    const float eps = 1e-5f, row_scale[3] = { 1.0f, 1e-3f, 30.0f };
    /* kind 0: the weight-streaming kernel; 1: the tensor-core one (K a multiple
     * of 128). */
    for (int kind = 0; kind < 2; kind++)
        for (int di = 0; di < 2; di++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                for (int sw = 0; sw < 3; sw++) {
                    const int dt = dts[di], N = shapes[si][0], K = shapes[si][1], rows = sw ? 2 * N : N;
                    const int R0 = kind ? -1 : 1;
                    if (kind && K % 128) continue;
                    const size_t on = (size_t)NT * N;
                    float *x = malloc(sizeof(float) * NT * K), *Wm = malloc(sizeof(float) * (size_t)rows * K),
                          *base = malloc(sizeof(float) * on), *y = malloc(sizeof(float) * on);
                    REQUIRE(x && Wm && base && y);
                    for (int t = 0; t < NT; t++)
                        for (int k = 0; k < K; k++) x[(size_t)t * K + k] = frand() * row_scale[t % 3];
                    for (size_t i = 0; i < (size_t)rows * K; i++) Wm[i] = frand() * (float)(2.0 / sqrt(K));
                    REQUIRE(cuda_selftest_round(dt, Wm, (size_t)rows * K) == 0 &&
                            cuda_selftest_round(dt, x, (size_t)NT * K) == 0);
                    int rc = cuda_selftest_gemv_norm(dt, x, Wm, NT, N, K, eps, sw, R0, base);
                    double num = 0, den = 0;
                    for (int t = 0; !rc && t < NT; t++) {
                        const float *xr = x + (size_t)t * K;
                        double ss = 0;
                        for (int k = 0; k < K; k++) ss += (double)xr[k] * xr[k];
                        const double inv = 1.0 / sqrt(ss / K + (double)eps);
                        for (int j = 0; j < N; j++) {
                            double d[2] = { 0, 0 };
                            for (int u = 0; u < (sw ? 2 : 1); u++)
                                for (int k = 0; k < K; k++) d[u] += (double)Wm[((size_t)u * N + j) * K + k] * xr[k];
                            const double g = d[0] * inv, u = d[1] * inv;
                            const double ref = sw == 2 ? 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u
                                               : sw ? g / (1.0 + exp(-g)) * u
                                                    : g;
                            const double got = base[(size_t)t * N + j];
                            if (isnan(got)) num = INFINITY;
                            num += (got - ref) * (got - ref);
                            den += ref * ref;
                        }
                    }
                    const double err = rc ? INFINITY : sqrt(num / den),
                                 lim = sw ? (dt == QDT_BF16 ? 8e-3 : 1e-3) : 1e-4;
                    size_t diff_bits = 0;
                    for (int n = 1; !rc && n <= NT; n++)
                        for (int R = R0; !rc && R <= (kind ? -1 : 2); R++) {
                            if (sw && R == 2) continue;
                            rc = cuda_selftest_gemv_norm(dt, x, Wm, n, N, K, eps, sw, R, y);
                            for (size_t i = 0; !rc && i < (size_t)n * N; i++)
                                diff_bits += fbits(y[i]) != fbits(base[i]);
                        }
                    for (int t = 0; !rc && t < NT; t++) {
                        rc = cuda_selftest_gemv_norm(dt, x + (size_t)t * K, Wm, 1, N, K, eps, sw, R0, y);
                        for (int j = 0; !rc && j < N; j++) diff_bits += fbits(y[j]) != fbits(base[(size_t)t * N + j]);
                    }
                    fprintf(stderr,
                            "  %s with the norm folded in%s, %s N=%d K=%d: rc %d, "
                            "relative error %.3g (limit %g), %zu "
                            "results differ in bits from the 8-token batch\n",
                            kind ? "gemv_mma" : "gemv", sw == 2 ? " and GeGLU" : sw ? " and SwiGLU" : "", dname(dt), N, K, rc, err, lim,
                            diff_bits);
                    CHECK(rc == 0 && err < lim && diff_bits == 0);
                    free(x), free(Wm), free(base), free(y);
                }
    float z[16] = { 0 }, out[16];
    CHECK_EQ_INT(cuda_selftest_gemv_norm(QDT_F32, z, z, 1, 1, 8, eps, 0, 1, out), QERR_UNSUPPORTED);
    CHECK_EQ_INT(cuda_selftest_gemv_norm(QDT_BF16, z, z, 9, 1, 8, eps, 1, 1, out), QERR_UNSUPPORTED);
    CHECK_EQ_INT(cuda_selftest_gemv_norm(QDT_F16, z, z, 1, 1, 12, eps, 0, 1, out), QERR_UNSUPPORTED);
    CHECK_EQ_INT(cuda_selftest_gemv_norm(QDT_F32, z, z, 1, 1, 128, eps, 0, -1, out), QERR_UNSUPPORTED);
    CHECK_EQ_INT(cuda_selftest_gemv_norm(QDT_BF16, z, z, 1, 1, 64, eps, 1, -1, out), QERR_UNSUPPORTED);
}

/* Folding a norm's weights into a matrix: each element rounded to the
 * storage type once, from the float product, exactly as the host rounds. */
static void test_scale_cols(void)
{
    const int N = 37, K = 264;
    for (int di = 0; di < 3; di++) {
        const int dt = all_dts[di];
        float *W = malloc(sizeof(float) * N * K), *g = malloc(sizeof(float) * K), *out = malloc(sizeof(float) * N * K);
        REQUIRE(W && g && out);
        for (int i = 0; i < N * K; i++) W[i] = frand();
        for (int k = 0; k < K; k++) g[k] = 0.5f + frand();
        int rc = cuda_selftest_scale_cols(dt, W, g, N, K, out);
        size_t bad = 0;
        for (int i = 0; !rc && i < N * K; i++)
            bad += fbits(out[i]) != fbits(round_to(dt, round_to(dt, W[i]) * g[i % K]));
        fprintf(stderr, "  scale_cols %s %dx%d: rc %d, %zu elements differ from the host's rounding\n", dname(dt), N, K,
                rc, bad);
        CHECK(rc == 0 && bad == 0);
        free(W), free(g), free(out);
    }
}

/* ---- qk_fill_uniform ------------------------------------------------------ */

/* The kernel's generator (cuda_ops.cu: fill_kernel) on the CPU: u in [0, 1). */
static double fill_u(uint64_t seed, size_t i)
{
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 40) / 16777216.0;
}

static float round_to(int dt, float f) { return dt == QDT_F32 ? f : wide16(dt, narrow16(dt, f)); }

static void test_fill_uniform(void)
{
    const size_t n = ((size_t)1 << 20) + 37; /* several rounds of the grid-stride loop, a ragged end */
    const float ranges[][2] = { { -1.0f, 1.0f }, { 0.9f, 1.1f }, { -0.03f, 0.03f } };
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    REQUIRE(a && b);
    for (int di = 0; di < 3; di++)
        for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
            const int dt = all_dts[di];
            const float lo = ranges[ri][0], hi = ranges[ri][1];
            const uint64_t seed = next_u64();
            int rc = cuda_selftest_fill_uniform(dt, n, seed, lo, hi, a);
            const double big = fmax(fabs((double)lo), fabs((double)hi));
            const double lim = dt == QDT_F32 ? 4 * ulp(QDT_F32, big) : ulp(dt, big);
            const float rlo = round_to(dt, lo), rhi = round_to(dt, hi);
            double worst = rc ? INFINITY : 0, sum = 0, sum2 = 0, chi2 = 0;
            size_t out_of_range = 0, hist[64] = { 0 };
            for (size_t i = 0; !rc && i < n; i++) {
                const double v = a[i], ref = lo + ((double)hi - lo) * fill_u(seed, i);
                const double e = isnan(v) ? INFINITY : fabs(v - ref);
                if (e > worst) worst = e;
                out_of_range += !(v >= rlo && v <= rhi);
                if (isnan(v)) continue;
                sum += v, sum2 += v * v;
                int bin = (int)((v - lo) / ((double)hi - lo) * 64);
                hist[bin < 0 ? 0 : bin > 63 ? 63 : bin]++;
            }
            for (int k = 0; k < 64; k++) chi2 += (hist[k] - n / 64.0) * (hist[k] - n / 64.0) / (n / 64.0);
            const double mean = sum / n, var = sum2 / n - mean * mean, w = (double)hi - lo;
            const double mean_err = fabs(mean - (lo + (double)hi) / 2) / w, var_err = fabs(var / (w * w / 12) - 1);
            /* The same seed again gives the same values; another seed, others. */
            size_t same_seed_diff = 0, other_seed_same = 0;
            if (!rc) rc = cuda_selftest_fill_uniform(dt, n, seed, lo, hi, b);
            for (size_t i = 0; !rc && i < n; i++) same_seed_diff += fbits(a[i]) != fbits(b[i]);
            if (!rc) rc = cuda_selftest_fill_uniform(dt, n, seed + 1, lo, hi, b);
            for (size_t i = 0; !rc && i < n; i++) other_seed_same += a[i] == b[i];
            fprintf(stderr,
                    "  fill %s [%g, %g): rc %d, max |value - CPU formula| %.3g (limit %.3g), %zu outside [%g, %g], "
                    "mean off by %.2g%% and variance by %.2g%% of uniform's, chi-square %.1f%s, "
                    "%zu differ on the same seed, %zu equal on the next seed\n",
                    dname(dt), lo, hi, rc, worst, lim, out_of_range, rlo, rhi, 100 * mean_err, 100 * var_err, chi2,
                    dt == QDT_F32 ? " (limit 150)" : " (not checked: rounding bins)", same_seed_diff,
                    other_seed_same);
            CHECK(rc == 0 && worst <= lim && out_of_range == 0);
            CHECK(mean_err < 0.005 && var_err < 0.02);
            if (dt == QDT_F32) CHECK(chi2 < 150);
            CHECK(same_seed_diff == 0);
            CHECK(other_seed_same < n / (dt == QDT_F32 ? 1000 : 10));
        }
    free(a), free(b);
}
#endif

int main(void)
{
    int skip = qt_gpu_skip();
    if (skip) return skip;
#ifdef QUIRE_HAVE_CUDA
    const char *s = getenv("QUIRE_TEST_SEED");
    rng = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
    fprintf(stderr, "seed %llu (QUIRE_TEST_SEED=%llu repeats this run)\n", (unsigned long long)rng,
            (unsigned long long)rng);
    /* Conversions first: the other references round through them. */
    QT_RUN(test_convert);
    QT_RUN(test_embed);
    QT_RUN(test_rmsnorm);
    QT_RUN(test_swiglu);
    QT_RUN(test_rope_store);
    QT_RUN(test_attn_rope);
    QT_RUN(test_gemv);
    QT_RUN(test_gemv_mma);
    QT_RUN(test_gemv_swiglu);
    QT_RUN(test_gemv_norm);
    QT_RUN(test_scale_cols);
    QT_RUN(test_fill_uniform);
    QT_MAIN_END();
#endif
}
