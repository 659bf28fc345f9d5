/* test_gpu.c - the CUDA backend against the CPU backend and HF's fixtures.
 * Skipped, with a message, where the build has no CUDA or the machine no
 * device (CI compiles it; the lent H200 runs it). */
#include <math.h>
#include <stdint.h>

#include "backend.h"
#include "model.h"
#include "sample.h"
#include "qtest.h"
#ifdef QUIRE_HAVE_CUDA
#include "cuda_info.h"
#endif

#ifdef QUIRE_HAVE_CUDA
static const char *const paths[] = { "models/stories260K.gguf", "tests/fixtures/models/stories260K-hf",
                                     "tests/fixtures/models/tiny-llama3-random", "tests/fixtures/models/tiny-qwen2-random" };

static float *logits_all(qbackend *be, const int32_t *ids, int n, int V, int chunk)
{
    int nb = (n + 15) / 16;
    int32_t *table = malloc(sizeof *table * (size_t)nb), *li = malloc(sizeof *li * (size_t)n);
    for (int i = 0; i < nb; i++) table[i] = nb - 1 - i;
    for (int i = 0; i < n; i++) li[i] = i;
    float *out = malloc(sizeof(float) * (size_t)n * (size_t)V);
    for (int s = 0; s < n; s += chunk) {
        int c = n - s < chunk ? n - s : chunk;
        qbatch_seq sq = { 0, c, s, table, nb };
        qbatch b = { c, ids + s, 1, &sq, c, li };
        if (be->ops->forward(be, &b, out + (size_t)s * V)) {
            free(out);
            out = NULL;
            break;
        }
    }
    free(table);
    free(li);
    return out;
}

static void test_cuda_matches_cpu(void)
{
    char err[256];
    for (size_t c = 0; c < sizeof paths / sizeof paths[0]; c++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", qt_root(), paths[c]);
        qmodel *m = NULL;
        REQUIRE(qmodel_load(path, &m, err, sizeof err) == 0);
        const int V = m->hp.n_vocab, n = 200;
        int32_t ids[200];
        uint64_t x = 7;
        for (int i = 0; i < n; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL, ids[i] = (int32_t)((x >> 33) % (uint64_t)V);
        qbackend_opts o = { .n_threads = 0, .num_blocks = 16, .block_size = 16 };
        qbackend *cpu = NULL, *gpu = NULL;
        REQUIRE(cpu_backend_create(&m->w, &o, &cpu, err, sizeof err) == 0);
        REQUIRE(cuda_backend_create(&m->w, &o, &gpu, err, sizeof err) == 0);
        float *a = logits_all(cpu, ids, n, V, 64), *b = logits_all(gpu, ids, n, V, 64), *b1 = logits_all(gpu, ids, n, V, 7);
        REQUIRE(a && b && b1);
        double num = 0, den = 0, num1 = 0;
        for (size_t i = 0; i < (size_t)n * V; i++) {
            num += (a[i] - b[i]) * (double)(a[i] - b[i]);
            num1 += (a[i] - b1[i]) * (double)(a[i] - b1[i]);
            den += (double)a[i] * a[i];
        }
        double rel = sqrt(num / den), rel1 = sqrt(num1 / den);
        fprintf(stderr, "  %-42s cuda vs cpu relative error %.3g (chunks of 64), %.3g (chunks of 7)\n", paths[c], rel, rel1);
        CHECK(rel < 1e-5 && rel1 < 1e-5);
        free(a);
        free(b);
        free(b1);
        qbackend_destroy(cpu);
        qbackend_destroy(gpu);
        qmodel_destroy(m);
    }
}
#endif

int main(void)
{
#ifdef QUIRE_HAVE_CUDA
    char err[256];
    int n = cuda_device_count(err, sizeof err);
    if (n > 0) {
        QT_RUN(test_cuda_matches_cpu);
        QT_MAIN_END();
    }
    printf("skipped: no CUDA device (%s)\n", err);
#else
    printf("skipped: built without CUDA\n");
#endif
    printf("0 passed, 0 failed\n");
    return 0;
}
