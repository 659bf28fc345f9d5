/* ngram.c - n-gram prompt lookup (spec.h). */
#include "spec.h"

#include <stdlib.h>
#include <string.h>

#include "qerr.h"

int qspec_ngram(const int32_t *hist, int n, int min_n, int max_n, int k, int32_t *out)
{
    if (!hist || !out || n < 2 || k < 1 || min_n < 1 || max_n < min_n) return 0;
    if (k > QSPEC_MAX_K) k = QSPEC_MAX_K;
    for (int g = max_n < n - 1 ? max_n : n - 1; g >= min_n; g--) {
        const int32_t *suf = hist + n - g;
        /* The latest occurrence followed by k tokens; failing that (a
         * repeat close to the end, as in a loop), the one followed by the
         * most.  An earlier occurrence ends before the suffix's last token,
         * so that at least one token follows it. */
        int best = -1, best_c = 0;
        for (int p = n - g - 1; p >= 0; p--) {
            if (hist[p + g - 1] != suf[g - 1] || memcmp(hist + p, suf, sizeof *suf * (size_t)g)) continue;
            const int c = n - (p + g);
            if (c > best_c) best = p, best_c = c;
            if (c >= k) break;
        }
        if (best >= 0) {
            const int c = best_c < k ? best_c : k;
            memcpy(out, hist + best + g, sizeof *out * (size_t)c);
            return c;
        }
    }
    return 0;
}

/* ---- the index ------------------------------------------------------------------ */

#define MAX_GRAM 8

/* Per suffix length g: a hash table of each g-gram's latest end position
 * (the index of its last token), and per position the end of the same
 * g-gram's occurrence before it (-1: none), so that a lookup walks a
 * gram's occurrences from the latest back. */
struct qspec_index {
    int min_n, max_n, n, cap;
    int32_t *prev[MAX_GRAM + 1];  /* (cap) per g */
    int32_t *tab[MAX_GRAM + 1];   /* per g: end position + 1, 0 empty */
    size_t tcap;
    int n_keys[MAX_GRAM + 1];
};

static uint64_t gram_hash(const int32_t *t, int g)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)g;
    for (int i = 0; i < g; i++) h = (h ^ (uint32_t)t[i]) * 0x100000001b3ULL;
    return h ^ (h >> 29);
}

qspec_index *qspec_index_new(int min_n, int max_n)
{
    if (min_n < 1 || max_n < min_n || max_n > MAX_GRAM) return NULL;
    qspec_index *x = calloc(1, sizeof *x);
    if (x) x->min_n = min_n, x->max_n = max_n;
    return x;
}

void qspec_index_free(qspec_index *x)
{
    if (!x) return;
    for (int g = 0; g <= MAX_GRAM; g++) free(x->prev[g]), free(x->tab[g]);
    free(x);
}

/* The slot of the g-gram ending at e in table t (tcap slots): where it is,
 * or the empty slot where it would go. */
static size_t slot(const qspec_index *x, const int32_t *t, const int32_t *hist, int g, int e)
{
    size_t j = gram_hash(hist + e - g + 1, g) & (x->tcap - 1);
    while (t[j]) {
        const int o = t[j] - 1;
        if (!memcmp(hist + o - g + 1, hist + e - g + 1, sizeof *hist * (size_t)g)) return j;
        j = (j + 1) & (x->tcap - 1);
    }
    return j;
}

/* Grows the tables to hold n positions (each g-gram a key at most). */
static int grow(qspec_index *x, const int32_t *hist, int n)
{
    if (n > x->cap) {
        int cap = x->cap ? x->cap : 256;
        while (cap < n) cap *= 2;
        for (int g = x->min_n; g <= x->max_n; g++) {
            int32_t *p = realloc(x->prev[g], sizeof *p * (size_t)cap);
            if (!p) return QERR_NOMEM;
            x->prev[g] = p;
        }
        x->cap = cap;
    }
    if ((size_t)n * 2 > x->tcap) {
        size_t tcap = x->tcap ? x->tcap : 512;
        while ((size_t)n * 2 > tcap) tcap *= 2;
        int32_t *nt[MAX_GRAM + 1] = { 0 };
        for (int g = x->min_n; g <= x->max_n; g++)
            if (!(nt[g] = calloc(tcap, sizeof *nt[g]))) {
                for (int h = x->min_n; h <= x->max_n; h++) free(nt[h]);
                return QERR_NOMEM;
            }
        const size_t old = x->tcap;
        x->tcap = tcap;
        for (int g = x->min_n; g <= x->max_n; g++) {
            for (size_t j = 0; j < old; j++)
                if (x->tab[g][j]) nt[g][slot(x, nt[g], hist, g, x->tab[g][j] - 1)] = x->tab[g][j];
            free(x->tab[g]);
            x->tab[g] = nt[g];
        }
    }
    return 0;
}

int qspec_index_update(qspec_index *x, const int32_t *hist, int n)
{
    if (n <= x->n) return 0;
    if (grow(x, hist, n)) return QERR_NOMEM;
    for (int e = x->n; e < n; e++)
        for (int g = x->min_n; g <= x->max_n; g++) {
            x->prev[g][e] = -1;
            if (e + 1 < g) continue;
            const size_t j = slot(x, x->tab[g], hist, g, e);
            if (x->tab[g][j]) x->prev[g][e] = x->tab[g][j] - 1;
            x->tab[g][j] = e + 1;
        }
    x->n = n;
    return 0;
}

int qspec_index_propose(const qspec_index *x, const int32_t *hist, int n, int k, int32_t *out)
{
    if (!x || !hist || !out || n < 2 || n != x->n || k < 1) return 0;
    if (k > QSPEC_MAX_K) k = QSPEC_MAX_K;
    for (int g = x->max_n < n - 1 ? x->max_n : n - 1; g >= x->min_n; g--) {
        /* The suffix is the latest occurrence of its gram; the ones before
         * it, latest first, are those qspec_ngram scans for.  Each is
         * followed by more tokens than the last, so at most k + 1 are
         * visited before one is followed by k. */
        int best = -1, best_c = 0;
        for (int e = x->prev[g][n - 1]; e >= 0; e = x->prev[g][e]) {
            const int c = n - 1 - e;
            if (c > best_c) best = e, best_c = c;
            if (c >= k) break;
        }
        if (best >= 0) {
            const int c = best_c < k ? best_c : k;
            memcpy(out, hist + best + 1, sizeof *out * (size_t)c);
            return c;
        }
    }
    return 0;
}
