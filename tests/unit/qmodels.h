/* qmodels.h - the fixture models the forward-pass tests share (CPU in
 * tests/unit/test_forward.c, GPU in tests/gpu/test_gpu_model.c): each with
 * the stem of its HF transformers fixtures in tests/fixtures. */
#ifndef QUIRE_QMODELS_H
#define QUIRE_QMODELS_H

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
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

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

#endif
