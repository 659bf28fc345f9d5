/* test_gpu_kernels.c - the CUDA attention kernels against a CPU reference
 * in double precision, on fresh random inputs: random block tables (blocks
 * scattered over the pool), GQA, head sizes 8 to 128, contexts up to 3,000
 * positions, splits, cached prefixes under prefill chunks.  Inputs are
 * rounded to the storage type first, so the reference sees what the kernel
 * sees; outputs are poisoned with NaN before each run.
 *
 * Thresholds (relative L2 error of the whole output): float32 1e-5; f16
 * 5e-3 and bf16 2e-2 (the kernels round the probabilities and the output to
 * the storage type).  Skipped, with a message, without a device. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "qtest.h"
#include "gpu_test.h"

#ifdef QUIRE_HAVE_CUDA
static uint64_t rng = 12345;
static float frand(void)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static int irand(int n)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (int)((rng >> 33) % (uint64_t)n);
}

typedef struct {
    int n_seqs;
    int pos0[8], len[8];
} layout;

/* Builds a case: every sequence's blocks scattered over the pool. */
static double run_case(int dtype, int prefill, int H, int KV, int hd, const layout *lay, int n_split, int split_len)
{
    const int bs = 16;
    int n_tok = 0, n_table = 0;
    for (int s = 0; s < lay->n_seqs; s++) {
        n_tok += lay->len[s];
        n_table += (lay->pos0[s] + lay->len[s] + bs - 1) / bs;
    }
    const int nb = n_table + 5;
    const size_t cache_n = (size_t)nb * KV * bs * hd, q_n = (size_t)n_tok * H * hd;
    float *kc = malloc(cache_n * 4), *vc = malloc(cache_n * 4), *q = malloc(q_n * 4), *out = malloc(q_n * 4);
    int32_t *pos = malloc(4 * (size_t)n_tok), *seq = malloc(4 * (size_t)n_tok), *info = malloc(8 * (size_t)lay->n_seqs),
            *tables = malloc(4 * (size_t)n_table), *perm = malloc(4 * (size_t)nb);
    for (size_t i = 0; i < cache_n; i++) kc[i] = frand() * 2, vc[i] = frand();
    for (size_t i = 0; i < q_n; i++) q[i] = frand() * 2;
    if (cuda_selftest_round(dtype, kc, cache_n) || cuda_selftest_round(dtype, vc, cache_n) ||
        cuda_selftest_round(dtype, q, q_n))
        return 1e9;
    for (int i = 0; i < nb; i++) perm[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int t = 0, off = 0;
    for (int s = 0; s < lay->n_seqs; s++) {
        int need = (lay->pos0[s] + lay->len[s] + bs - 1) / bs;
        info[2 * s] = off;
        info[2 * s + 1] = need;
        for (int i = 0; i < need; i++) tables[off + i] = perm[off + i];
        off += need;
        for (int i = 0; i < lay->len[s]; i++, t++) pos[t] = lay->pos0[s] + i, seq[t] = s;
    }
    cuda_attn_case c = { dtype, prefill, H, KV, hd, bs, nb, kc, vc, q, n_tok, pos, seq, lay->n_seqs, info, tables,
                         n_table, n_split, split_len, 0 };
    double num = 0, den = 0;
    int rc = cuda_selftest_attention(&c, out);
    if (rc) num = 1e30, den = 1;
    if (!rc && !prefill && n_split > 1) {
        /* The splits combined in a cluster (up to 16) and through global
         * memory: the same bits. */
        float *out2 = malloc(q_n * 4);
        c.global_combine = 1;
        if (cuda_selftest_attention(&c, out2) || memcmp(out, out2, q_n * 4)) {
            fprintf(stderr, "  decode H=%d KV=%d hd=%d splits=%d: the two combines differ\n", H, KV, hd, n_split);
            num = INFINITY;
        }
        free(out2);
    }
    const int G = H / KV;
    double *sc = malloc(sizeof(double) * 8192);
    for (int tk = 0; !rc && tk < n_tok; tk++) {
        const int32_t *tab = tables + info[2 * seq[tk]];
        for (int h = 0; h < H; h++) {
            const int g = h / G, n = pos[tk] + 1;
            const float *qv = q + ((size_t)tk * H + h) * hd;
            double mx = -1e300, sum = 0;
            for (int p = 0; p < n; p++) {
                const float *kp = kc + (size_t)tab[p / bs] * KV * bs * hd + ((size_t)g * bs + p % bs) * hd;
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qv[i] * kp[i];
                sc[p] = d / sqrt((double)hd);
                if (sc[p] > mx) mx = sc[p];
            }
            for (int p = 0; p < n; p++) sum += sc[p] = exp(sc[p] - mx);
            for (int i = 0; i < hd; i++) {
                double a = 0;
                for (int p = 0; p < n; p++)
                    a += sc[p] * vc[(size_t)tab[p / bs] * KV * bs * hd + ((size_t)g * bs + p % bs) * hd + i];
                a /= sum;
                double o = out[((size_t)tk * H + h) * hd + i];
                if (isnan(o)) num = INFINITY;
                num += (o - a) * (o - a);
                den += a * a;
            }
        }
    }
    free(sc);
    free(kc), free(vc), free(q), free(out), free(pos), free(seq), free(info), free(tables), free(perm);
    return sqrt(num / den);
}

static const char *dname(int dt) { return dt == QDT_F32 ? "f32" : dt == QDT_BF16 ? "bf16" : "f16"; }
static double tol(int dt) { return dt == QDT_F32 ? 1e-5 : dt == QDT_F16 ? 5e-3 : 2e-2; }

static void test_decode_attention(void)
{
    const int dts[3] = { QDT_F32, QDT_BF16, QDT_F16 };
    const int shapes[][3] = { { 32, 8, 64 }, { 32, 8, 128 }, { 28, 4, 128 }, { 8, 4, 8 }, { 6, 2, 20 }, { 16, 1, 64 },
                              { 16, 8, 256 } };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int di = 0; di < 3; di++) {
            layout lay = { 6, { 0, 5, 100, 1000, 2999, 31 }, { 1, 1, 1, 1, 1, 1 } };
            for (int s = 0; s < 6; s++) lay.pos0[s] = irand(lay.pos0[s] + 1);
            const int splits[4][2] = { { 1, 3000 }, { 4, 768 }, { 16, 192 }, { 24, 128 } };
            for (int k = 0; k < 4; k++) {
                double e = run_case(dts[di], 0, shapes[si][0], shapes[si][1], shapes[si][2], &lay, splits[k][0],
                                    splits[k][1]);
                if (!(e < tol(dts[di])) || (si == 0 && k == 1))
                    fprintf(stderr, "  decode %s H=%d KV=%d hd=%d splits=%d: relative error %.3g\n", dname(dts[di]),
                            shapes[si][0], shapes[si][1], shapes[si][2], splits[k][0], e);
                CHECK(e < tol(dts[di]));
            }
        }
}

static void test_prefill_attention(void)
{
    const int dts[2] = { QDT_BF16, QDT_F16 };
    const int shapes[][3] = { { 32, 8, 64 }, { 32, 8, 128 }, { 28, 4, 128 }, { 8, 8, 64 }, { 16, 8, 256 } };
    /* A fresh prompt of 200 (4 tiles, the last partial), a chunk after a cached
     * prefix of 333, a 2-token chunk, and a 64-token chunk at position 1000. */
    layout lay = { 4, { 0, 333, 7, 1000 }, { 200, 70, 2, 64 } };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int di = 0; di < 2; di++) {
            double e = run_case(dts[di], 1, shapes[si][0], shapes[si][1], shapes[si][2], &lay, 1, 0);
            fprintf(stderr, "  prefill %s H=%d KV=%d hd=%d: relative error %.3g\n", dname(dts[di]), shapes[si][0],
                    shapes[si][1], shapes[si][2], e);
            CHECK(e < tol(dts[di]));
        }
}
#endif

int main(void)
{
    int skip = qt_gpu_skip();
    if (skip) return skip;
#ifdef QUIRE_HAVE_CUDA
    QT_RUN(test_decode_attention);
    QT_RUN(test_prefill_attention);
    QT_MAIN_END();
#endif
}
