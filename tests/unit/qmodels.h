/* qmodels.h - the fixture models the forward-pass tests share (CPU in
 * tests/unit/test_forward.c, GPU in tests/gpu/test_gpu_model.c): each with
 * the stem of its HF transformers fixtures in tests/fixtures. */
#ifndef QUIRE_QMODELS_H
#define QUIRE_QMODELS_H

#include <jansson.h>
#include <math.h>
#include <stdlib.h>

#include "backend.h"
#include "model.h"
#include "qtest.h"

typedef struct {
    const char *name; /* fixture stem: tests/fixtures/<name>.{logits,greedy}.json */
    const char *path; /* model path under QUIRE_ROOT */
} model_case;

static const model_case cases[] = {
    { "stories260K", "models/stories260K.gguf" },
    { "stories260K", "tests/fixtures/models/stories260K-hf" },
    { "tiny-llama3-random", "tests/fixtures/models/tiny-llama3-random" },
    { "tiny-qwen2-random", "tests/fixtures/models/tiny-qwen2-random" },
    { "tiny-qwen3-random", "tests/fixtures/models/tiny-qwen3-random" },
    { "tiny-qwen3-random", "tests/fixtures/models/tiny-qwen3-random.gguf" },
    { "tiny-gemma2-random", "tests/fixtures/models/tiny-gemma2-random" },
    { "tiny-gemma2-random", "tests/fixtures/models/tiny-gemma2-random.gguf" },
    { "tiny-gemma3-random", "tests/fixtures/models/tiny-gemma3-random" },
    { "tiny-gemma3-random", "tests/fixtures/models/tiny-gemma3-random.gguf" },
    { "tiny-mistral-swa-random", "tests/fixtures/models/tiny-mistral-swa-random" },
    { "tiny-mistral-swa-random", "tests/fixtures/models/tiny-mistral-swa-random.gguf" },
    { "tiny-phi3-random", "tests/fixtures/models/tiny-phi3-random" },
    { "tiny-phi3-random", "tests/fixtures/models/tiny-phi3-random.gguf" },
    { "tiny-smollm3-random", "tests/fixtures/models/tiny-smollm3-random" },
    { "tiny-smollm3-random", "tests/fixtures/models/tiny-smollm3-random.gguf" },
    { "tiny-llama32-random", "tests/fixtures/models/tiny-llama32-random" },
    { "tiny-llama32-random", "tests/fixtures/models/tiny-llama32-random.gguf" },
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

/* A model whose features a backend without them (feats: QHP_*) does not
 * compute: 1 after saying so (the case is skipped there), else 0. */
static inline int qmodel_case_skip(const qmodel *m, unsigned feats, const char *path)
{
    const char *f = qhp_unsupported(&m->hp, feats);
    if (f) printf("  %s: skipped here (%s is not computed by this backend yet)\n", path, f);
    return f != NULL;
}

/* The (prompt, continuation) pairs of a greedy fixture: {"prompts":
 * [{"prompt_ids", "greedy_ids"}, ...]} (scripts/gen_tiny_families.py) or
 * one pair at the top level.  Returns how many; pair i's arrays in *p, *g. */
static inline int greedy_pair(json_t *j, int i, json_t **p, json_t **g)
{
    json_t *list = json_object_get(j, "prompts"), *e = list ? json_array_get(list, (size_t)i) : (i ? NULL : j);
    *p = json_object_get(e, "prompt_ids");
    *g = json_object_get(e, "greedy_ids");
    return list ? (int)json_array_size(list) : 1;
}

/* Loads a model by its path under QUIRE_ROOT; NULL (with the reason on
 * stderr) on failure. */
static inline qmodel *load(const char *rel)
{
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s", qt_root(), rel);
    qmodel *m = NULL;
    if (qmodel_load(path, &m, err, sizeof err)) fprintf(stderr, "  load %s: %s\n", path, err);
    return m;
}

/* Relative error (L2) of b against a, n floats; infinity where either
 * holds a NaN (a pass that failed to write its rows). */
static inline double logits_rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        num += (a[i] - b[i]) * (double)(a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    return sqrt(num / den);
}

/* Logits of every position of one sequence of n tokens from position 0,
 * prefilled in chunks of `chunk`, its blocks in reverse order (the backend
 * needs (n + 15) / 16 blocks of 16): (n, V) floats, poisoned with NaN
 * before, or NULL when a pass fails. */
static inline float *logits_all(qbackend *be, const int32_t *ids, int n, int V, int chunk)
{
    const int nb = (n + 15) / 16;
    int32_t *table = malloc(sizeof *table * (size_t)nb), *li = malloc(sizeof *li * (size_t)n);
    float *out = malloc(sizeof(float) * (size_t)n * (size_t)V);
    for (int i = 0; i < nb; i++) table[i] = nb - 1 - i; /* scattered, not identity */
    for (int i = 0; i < n; i++) li[i] = i;
    for (size_t i = 0; i < (size_t)n * V; i++) out[i] = NAN;
    for (int s = 0; s < n; s += chunk) {
        int c = n - s < chunk ? n - s : chunk;
        qbatch_seq sq = { 0, c, s, table, nb };
        qbatch b = { c, ids + s, 1, &sq, c, li, NULL, NULL, NULL, NULL, NULL };
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

#endif
