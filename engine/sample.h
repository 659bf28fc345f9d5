/* sample.h - turning logits into a token.
 *
 * The order of operations follows vLLM: temperature scaling, then top-k,
 * top-p (nucleus) and min-p filters on the resulting distribution, then one
 * draw from a per-sampler random stream.  temperature == 0 (or top_k == 1)
 * is greedy: the lowest id among the maximal logits, with no randomness.
 * The same seed and the same logits give the same tokens. */
#ifndef QUIRE_SAMPLE_H
#define QUIRE_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    float temperature;   /* 0: greedy */
    int top_k;           /* <= 0: off */
    float top_p;         /* >= 1: off */
    float min_p;         /* <= 0: off; keep tokens with p >= min_p * p_max */
    uint64_t seed;
} qsample_params;

/* Defaults as in the OpenAI API and vLLM: temperature 1, filters off, seed 0. */
qsample_params qsample_defaults(void);

typedef struct qsampler qsampler;

/* Returns NULL when out of memory or when params are out of range
 * (temperature < 0, top_p <= 0, min_p > 1). */
qsampler *qsampler_create(const qsample_params *p, int n_vocab);
void qsampler_destroy(qsampler *s);

/* Checks params; 0 or QERR_RANGE with a message. */
int qsample_check(const qsample_params *p, char *err, size_t errlen);

/* Samples a token from logits (n_vocab floats, not modified).  Cannot fail. */
int qsample(qsampler *s, const float *logits);

/* Index of the largest logit (lowest index on ties). */
int qsample_argmax(const float *logits, int n);

/* The generator behind the draws: splitmix64-seeded xoshiro256**. */
typedef struct { uint64_t s[4]; } qrng;
void qrng_seed(qrng *r, uint64_t seed);
uint64_t qrng_next(qrng *r);
/* Uniform in [0, 1) with 53 random bits. */
double qrng_uniform(qrng *r);

#endif
