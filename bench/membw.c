/* membw.c - measure main-memory bandwidth, for bench/generate.sh.
 *
 *     cc -O2 -march=native -pthread membw.c -o membw && ./membw [MiB] [threads...]
 *
 * For each thread count (default 1 and 2) it times, best of REPS passes:
 *
 *   read   summing a MiB-sized array of 64-bit words, as 8 concurrent streams
 *          (what decoding does to its weights: stream them in, write nothing back);
 *   copy   memcpy of one such array into another, counted as bytes read
 *          plus bytes written (the STREAM convention).
 *
 * The array (default 1024 MiB) is far larger than any cache here, so both
 * are DRAM figures.  Output, one line each, in GB/s (10^9 bytes per second):
 *
 *     read T GBPS
 *     copy T GBPS
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REPS 5

static uint64_t *src, *dst;
static size_t n_words;
static volatile uint64_t sink;

typedef struct {
    int kind; /* 0 read, 1 copy */
    size_t lo, hi;
    pthread_barrier_t *bar;
    uint64_t result;
} job;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *work(void *arg)
{
    job *j = arg;
    pthread_barrier_wait(j->bar);
    if (j->kind == 0) {
        /* Eight streams in lockstep over eight segments of the range: one
         * sequential stream leaves a core's prefetchers short of requests in
         * flight (quire's decode kernel reads 8 weight rows at once too). */
        enum { S = 8 };
        typedef uint64_t v4 __attribute__((vector_size(32)));
        v4 acc[S] = { { 0 } };
        size_t seg = (j->hi - j->lo) / S / 8 * 8;
        const uint64_t *base = src + j->lo;
        for (size_t i = 0; i < seg; i += 8)
            for (int s = 0; s < S; s++) {
                v4 a, b;
                memcpy(&a, base + (size_t)s * seg + i, sizeof a);
                memcpy(&b, base + (size_t)s * seg + i + 4, sizeof b);
                acc[s] += a + b;
            }
        uint64_t total = 0;
        for (size_t i = j->lo + S * seg; i < j->hi; i++) total += src[i];
        for (int s = 0; s < S; s++)
            for (int w = 0; w < 4; w++) total += acc[s][w];
        j->result = total;
    } else {
        memcpy(dst + j->lo, src + j->lo, (j->hi - j->lo) * sizeof *src);
        j->result = dst[j->lo];
    }
    return NULL;
}

/* One pass with nt threads; returns seconds. */
static double pass(int kind, int nt)
{
    pthread_t th[64];
    job jobs[64];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)nt + 1);
    for (int t = 0; t < nt; t++) {
        jobs[t] = (job){ .kind = kind, .lo = n_words * t / nt, .hi = n_words * (t + 1) / nt, .bar = &bar };
        pthread_create(&th[t], NULL, work, &jobs[t]);
    }
    double t0 = now();
    pthread_barrier_wait(&bar);
    uint64_t acc = 0;
    for (int t = 0; t < nt; t++) {
        pthread_join(th[t], NULL);
        acc += jobs[t].result;
    }
    double s = now() - t0;
    sink = acc;
    pthread_barrier_destroy(&bar);
    return s;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
    int threads[16], n_threads = 0;
    for (int i = 2; i < argc && n_threads < 16; i++) {
        int t = atoi(argv[i]);
        if (t >= 1 && t <= 64) threads[n_threads++] = t;
    }
    if (!n_threads) {
        threads[n_threads++] = 1;
        threads[n_threads++] = 2;
    }
    n_words = mib * 1024 * 1024 / sizeof(uint64_t);
    src = malloc(n_words * sizeof *src);
    dst = malloc(n_words * sizeof *dst);
    if (!src || !dst) {
        fprintf(stderr, "membw: out of memory for 2 x %zu MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < n_words; i++) src[i] = i; /* fault every page in */
    memset(dst, 0, n_words * sizeof *dst);

    double bytes = (double)n_words * sizeof *src;
    for (int k = 0; k < n_threads; k++) {
        int nt = threads[k];
        double best_r = 1e30, best_c = 1e30;
        for (int r = 0; r < REPS; r++) {
            double s = pass(0, nt);
            if (s < best_r) best_r = s;
            s = pass(1, nt);
            if (s < best_c) best_c = s;
        }
        printf("read %d %.2f\n", nt, bytes / best_r / 1e9);
        printf("copy %d %.2f\n", nt, 2 * bytes / best_c / 1e9);
    }
    return 0;
}
