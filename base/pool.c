/* pool.c - the CPU backend's worker pool: a run hands tasks out through an
 * atomic counter; workers and the caller spin briefly, then sleep on condition
 * variables (see pool.h for the contract). */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

typedef struct { qpool *p; int tid; } worker_arg;

struct qpool {
    int n_threads;
    pthread_t *threads;
    worker_arg *args;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    /* The current run; generation increments each run so workers know. */
    unsigned generation;
    int stop;
    qpool_fn fn;
    void *ctx;
    int n_tasks;
    int next;          /* atomic: next task to hand out */
    int active;        /* atomic: workers still inside the current run */
    int main_waiting;  /* the caller sleeps on `done` (under mu) */
};

/* Spins before sleeping, in pause instructions (a few hundred microseconds):
 * a decode step issues dozens of runs a few microseconds apart. */
#define SPIN_LIMIT 20000

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_tasks(qpool *p, int tid)
{
    for (;;) {
        int t = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, tid);
    }
}

static void *worker(void *arg)
{
    qpool *p = ((worker_arg *)arg)->p;
    int tid = ((worker_arg *)arg)->tid;
    unsigned seen = 0;
    for (;;) {
        /* Spin a little: the next run usually follows within microseconds. */
        for (int i = 0; i < SPIN_LIMIT; i++) {
            if (__atomic_load_n(&p->generation, __ATOMIC_ACQUIRE) != seen ||
                __atomic_load_n(&p->stop, __ATOMIC_ACQUIRE))
                break;
            cpu_relax();
        }
        pthread_mutex_lock(&p->mu);
        while (p->generation == seen && !p->stop) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);

        run_tasks(p, tid);

        if (__atomic_sub_fetch(&p->active, 1, __ATOMIC_ACQ_REL) == 0) {
            pthread_mutex_lock(&p->mu);
            if (p->main_waiting) pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

qpool *qpool_create(int n_threads)
{
    if (n_threads < 1) n_threads = 1;
    qpool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->args = calloc((size_t)n_threads - 1, sizeof *p->args);
        if (!p->threads || !p->args) goto fail;
        for (int i = 0; i < n_threads - 1; i++) {
            p->args[i].p = p;
            p->args[i].tid = i + 1;
            if (pthread_create(&p->threads[i], NULL, worker, &p->args[i])) {
                p->n_threads = i + 1; /* join the ones that started */
                qpool_destroy(p);
                return NULL;
            }
        }
    }
    return p;
fail:
    free(p->threads);
    free(p->args);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p);
    return NULL;
}

int qpool_threads(const qpool *p) { return p->n_threads; }

void qpool_run(qpool *p, int n_tasks, qpool_fn fn, void *ctx)
{
    if (n_tasks <= 0) return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    __atomic_store_n(&p->next, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&p->active, p->n_threads - 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->generation, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->wake); /* no system call when nobody sleeps */
    pthread_mutex_unlock(&p->mu);

    run_tasks(p, 0);

    for (int i = 0; i < SPIN_LIMIT && __atomic_load_n(&p->active, __ATOMIC_ACQUIRE) > 0; i++) cpu_relax();
    if (__atomic_load_n(&p->active, __ATOMIC_ACQUIRE) > 0) {
        pthread_mutex_lock(&p->mu);
        p->main_waiting = 1;
        while (__atomic_load_n(&p->active, __ATOMIC_ACQUIRE) > 0) pthread_cond_wait(&p->done, &p->mu);
        p->main_waiting = 0;
        pthread_mutex_unlock(&p->mu);
    }
}

void qpool_destroy(qpool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p->args);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p);
}
