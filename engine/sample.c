#define _GNU_SOURCE
#include "sample.h"
#include "qerr.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>

struct qsampler {
    qsample_params p;
    int n_vocab;
    qrng rng;
    float *prob;     /* (n_vocab) */
    int *idx;        /* (n_vocab) candidate ids */
};

qsample_params qsample_defaults(void)
{
    qsample_params p = { .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0 };
    return p;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void qrng_seed(qrng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        r->s[i] = z ^ (z >> 31);
    }
}

uint64_t qrng_next(qrng *r)
{
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double qrng_uniform(qrng *r) { return (double)(qrng_next(r) >> 11) * 0x1.0p-53; }

int qsample_check(const qsample_params *p, char *err, size_t errlen)
{
    if (!(p->temperature >= 0 && p->temperature <= 100))
        return qerr_set(err, errlen, QERR_RANGE, "temperature must be in [0, 100], got %g", (double)p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return qerr_set(err, errlen, QERR_RANGE, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return qerr_set(err, errlen, QERR_RANGE, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (p->top_k < -1)
        return qerr_set(err, errlen, QERR_RANGE, "top_k must be -1, 0 or positive, got %d", p->top_k);
    return 0;
}

qsampler *qsampler_create(const qsample_params *p, int n_vocab)
{
    if (n_vocab <= 0 || qsample_check(p, NULL, 0)) return NULL;
    qsampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->prob = q_mallocn((size_t)n_vocab, sizeof(float));
    s->idx = q_mallocn((size_t)n_vocab, sizeof(int));
    if (!s->prob || !s->idx) {
        qsampler_destroy(s);
        return NULL;
    }
    qrng_seed(&s->rng, p->seed);
    return s;
}

void qsampler_destroy(qsampler *s)
{
    if (!s) return;
    free(s->prob);
    free(s->idx);
    free(s);
}

int qsample_argmax(const float *logits, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* Orders ids by prob descending, ties by id ascending (deterministic). */
static int cmp_desc(const void *a, const void *b, void *arg)
{
    const float *prob = arg;
    int x = *(const int *)a, y = *(const int *)b;
    float px = prob[x], py = prob[y];
    if (px > py) return -1;
    if (px < py) return 1;
    return (x > y) - (x < y);
}

/* Moves the k most probable of idx[0..n) to the front (unordered). */
static void select_top(int *idx, int n, int k, const float *prob)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = prob[idx[(lo + hi) / 2]];
        int i = lo, j = hi;
        while (i <= j) {
            while (prob[idx[i]] > pivot) i++;
            while (prob[idx[j]] < pivot) j--;
            if (i <= j) {
                int t = idx[i];
                idx[i] = idx[j];
                idx[j] = t;
                i++;
                j--;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

int qsample(qsampler *s, const float *logits)
{
    const int V = s->n_vocab;
    const qsample_params *p = &s->p;
    if (p->temperature <= 0 || p->top_k == 1) return qsample_argmax(logits, V);

    /* Softmax of logits / T. */
    float mx = logits[qsample_argmax(logits, V)];
    double sum = 0;
    for (int i = 0; i < V; i++) {
        s->prob[i] = expf((logits[i] - mx) / p->temperature);
        sum += s->prob[i];
    }
    int n = V;
    for (int i = 0; i < V; i++) {
        s->idx[i] = i;
        s->prob[i] = (float)(s->prob[i] / sum);
    }
    int sorted = 0;
    if (p->top_k > 0 && p->top_k < n) {
        select_top(s->idx, n, p->top_k, s->prob);
        n = p->top_k;
    }
    if (p->top_p < 1.0f) {
        /* Tokens below (1 - top_p) / (n - 1) can never be inside the nucleus;
         * dropping them first keeps the sort short. */
        float cut = (1.0f - p->top_p) / (float)(n > 1 ? n - 1 : 1);
        int m = 0;
        for (int i = 0; i < n; i++)
            if (s->prob[s->idx[i]] >= cut) s->idx[m++] = s->idx[i];
        if (m == 0) m = 1; /* keep at least the best token */
        n = m;
        qsort_r(s->idx, (size_t)n, sizeof(int), cmp_desc, s->prob);
        sorted = 1;
        double c = 0;
        for (int i = 0; i < n; i++) {
            c += s->prob[s->idx[i]];
            if (c >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        float best = 0;
        for (int i = 0; i < n; i++)
            if (s->prob[s->idx[i]] > best) best = s->prob[s->idx[i]];
        float cut = p->min_p * best;
        int m = 0;
        for (int i = 0; i < n; i++)
            if (s->prob[s->idx[i]] >= cut) s->idx[m++] = s->idx[i];
        n = m;
    }
    if (!sorted && p->top_k > 0 && p->top_k < V) {
        /* Quickselect left the top k in no defined order; fix one so that a
         * draw depends on the distribution only. */
        qsort_r(s->idx, (size_t)n, sizeof(int), cmp_desc, s->prob);
    }
    double mass = 0;
    for (int i = 0; i < n; i++) mass += s->prob[s->idx[i]];
    double r = qrng_uniform(&s->rng) * mass, c = 0;
    for (int i = 0; i < n; i++) {
        c += s->prob[s->idx[i]];
        if (r < c) return s->idx[i];
    }
    return s->idx[n - 1];
}
