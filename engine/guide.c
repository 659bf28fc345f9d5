/* guide.c - guided decoding's engine side: a grammar vocabulary
 * (grammar/gram.h) from a qtok (engine.h), and the thread that makes a
 * step's masks while the forward pass runs (guide.h). */
#include "guide.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "gram.h"
#include "qerr.h"
#include "tokenizer.h"
#include "util.h"

int qengine_grammar_vocab(const qtok *tok, gram_vocab **out) { return qengine_grammar_vocab_with(tok, NULL, NULL, out); }

/* 1 when the l bytes b are one of allow[]. */
static int allowed(const char *const *allow, const char *b, int l)
{
    for (int k = 0; allow && allow[k]; k++)
        if (strlen(allow[k]) == (size_t)l && !memcmp(allow[k], b, (size_t)l)) return 1;
    return 0;
}

int qengine_grammar_vocab_with(const qtok *tok, const char *const *allow, int *n_allowed, gram_vocab **out)
{
    *out = NULL;
    if (n_allowed) *n_allowed = 0;
    const int n = qtok_vocab_size(tok);
    uint8_t **bytes = q_callocn((size_t)n + 1, sizeof *bytes), *skip = calloc((size_t)n + 1, 1);
    size_t *lens = q_callocn((size_t)n + 1, sizeof *lens);
    int rc = bytes && skip && lens ? 0 : QERR_NOMEM;
    char buf[1024];
    for (int i = 0; i < n && !rc; i++) {
        const int l = qtok_token_bytes(tok, i, buf, sizeof buf);
        skip[i] = l <= 0 || qtok_is_special(tok, i);
        if (skip[i] && l > 0 && allowed(allow, buf, l)) {
            skip[i] = 0;
            if (n_allowed) (*n_allowed)++;
        }
        if (l > 0) {
            if (!(bytes[i] = malloc((size_t)l))) rc = QERR_NOMEM;
            else memcpy(bytes[i], buf, (size_t)l), lens[i] = (size_t)l;
        }
    }
    if (!rc) rc = gram_vocab_new(n, (const uint8_t *const *)bytes, lens, skip, out);
    for (int i = 0; bytes && i < n; i++) free(bytes[i]);
    free(bytes);
    free(skip);
    free(lens);
    return rc;
}

/* ---- masks on a thread of their own ------------------------------------------------- */

static void job_run(qguide_job *j)
{
    const size_t words = ((size_t)j->n_vocab + 31) / 32, gw = ((size_t)gram_vocab_size(j->v) + 31) / 32;
    if (j->feed >= 0 && (j->rc = j->feed_rc = gram_m_feed_token(j->m, j->v, j->feed))) return;
    j->done = gram_m_done(j->m);
    if ((j->rc = gram_m_mask(j->m, j->v, j->mask))) return;
    /* Ids past the grammar's vocabulary (a model's padded head) are never
     * allowed: the row may be memory another request's mask used. */
    if (gw < words) memset(j->mask + gw, 0, sizeof *j->mask * (words - gw));
    const int end = gram_m_can_end(j->m);
    for (int k = 0; k < j->n_eos; k++) {
        const int t = j->eos[k];
        if (t < 0 || t >= j->n_vocab) continue;
        if (end) j->mask[t / 32] |= 1u << (t % 32);
        else j->mask[t / 32] &= ~(1u << (t % 32));
    }
    uint32_t any = 0;
    for (int w = 0; w < (j->n_vocab + 31) / 32; w++) any |= j->mask[w];
    if (!any) j->rc = QERR_INTERNAL;
}

void qguide_job_run(qguide_job *j)
{
    const double t = q_now();
    j->feed_rc = 0, j->done = 0;
    job_run(j);
    if (j->rc) memset(j->mask, 0, sizeof *j->mask * (((size_t)j->n_vocab + 31) / 32));
    j->t_end = q_now();
    j->secs = j->t_end - t;
}

void qguide_mask_logits(const uint32_t *mask, float *lg, int n_vocab)
{
    for (int i = 0; i < n_vocab; i++)
        if (!((mask[i / 32] >> (i % 32)) & 1)) lg[i] = -INFINITY;
}

#define GUIDE_MAX_THREADS 8
#define WAITER_SPIN_S 0.0005 /* the waiter spins this long for the last jobs before it sleeps */

/* Jobs are taken from a counter tagged with its round (round << 32 | next
 * index): a thread that read an earlier round's jobs cannot take from a
 * later one.  A round ends when all its jobs are done (done == n), whether
 * or not every thread has woken: the waiter never waits for a thread's
 * wake-up, only for work.  (Threads that spin between rounds instead of
 * sleeping made the H200's 1B decode 35% slower, not faster: the host's
 * cores are not all the process's to burn.) */
struct qguide {
    pthread_t th[GUIDE_MAX_THREADS];
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* work given, or quit */
    pthread_cond_t done_cv; /* the round's jobs are done */
    qguide_job *jobs;       /* the round's (under mu) */
    int n;
    atomic_ulong round;     /* rounds started (written under mu) */
    atomic_ullong next;     /* round << 32 | the next job to take */
    atomic_int done;        /* jobs of the round done */
    atomic_int quit;
};

static void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    sched_yield();
#endif
}

/* Takes round r's jobs one at a time until none is left (a slow mask holds
 * up only its own thread). */
static void take_jobs(qguide *g, qguide_job *jobs, int n, unsigned long r)
{
    for (;;) {
        unsigned long long v = atomic_load(&g->next);
        if ((unsigned long)(v >> 32) != (r & 0xffffffffUL) || (int)(v & 0xffffffffULL) >= n) return;
        if (!atomic_compare_exchange_weak(&g->next, &v, v + 1)) continue;
        qguide_job_run(&jobs[v & 0xffffffffULL]);
        if (atomic_fetch_add(&g->done, 1) + 1 == n) {
            pthread_mutex_lock(&g->mu);
            pthread_cond_broadcast(&g->done_cv);
            pthread_mutex_unlock(&g->mu);
        }
    }
}

static void *guide_main(void *arg)
{
    qguide *g = arg;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (atomic_load(&g->round) == seen && !atomic_load(&g->quit)) pthread_cond_wait(&g->cv, &g->mu);
        if (atomic_load(&g->round) == seen) { /* quit, nothing given */
            pthread_mutex_unlock(&g->mu);
            break;
        }
        seen = atomic_load(&g->round);
        qguide_job *jobs = g->jobs;
        const int n = g->n;
        pthread_mutex_unlock(&g->mu);
        take_jobs(g, jobs, n, seen);
    }
    return NULL;
}

int qguide_threads(int beside_gpu)
{
    const char *env = getenv("QUIRE_GUIDE_THREADS");
    if (env && atoi(env) >= 1 && atoi(env) <= GUIDE_MAX_THREADS) return atoi(env);
    const int nc = q_ncpus();
    return beside_gpu ? (nc >= 16 ? 4 : nc >= 4 ? 2 : 1) : 1;
}

int qguide_new(int n_threads, qguide **out)
{
    *out = NULL;
    qguide *g = calloc(1, sizeof *g);
    if (!g) return QERR_NOMEM;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    pthread_cond_init(&g->done_cv, NULL);
    atomic_init(&g->round, 0);
    atomic_init(&g->next, 0);
    atomic_init(&g->done, 0);
    atomic_init(&g->quit, 0);
    if (n_threads < 1) n_threads = 1;
    if (n_threads > GUIDE_MAX_THREADS) n_threads = GUIDE_MAX_THREADS;
    for (int t = 0; t < n_threads; t++) {
        if (pthread_create(&g->th[t], NULL, guide_main, g)) break;
        g->n_threads++;
    }
    if (!g->n_threads) {
        qguide_free(g);
        return QERR_INTERNAL;
    }
    *out = g;
    return 0;
}

void qguide_free(qguide *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    atomic_store(&g->quit, 1);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    for (int t = 0; t < g->n_threads; t++) pthread_join(g->th[t], NULL);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    pthread_cond_destroy(&g->done_cv);
    free(g);
}

void qguide_start(qguide *g, qguide_job *jobs, int n)
{
    if (n <= 0) return;
    pthread_mutex_lock(&g->mu);
    const unsigned long r = atomic_load(&g->round) + 1;
    g->jobs = jobs, g->n = n;
    atomic_store(&g->done, 0);
    atomic_store(&g->next, (unsigned long long)(r & 0xffffffffUL) << 32);
    atomic_store(&g->round, r);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void qguide_wait(qguide *g)
{
    pthread_mutex_lock(&g->mu);
    qguide_job *jobs = g->jobs;
    const int n = g->n;
    const unsigned long r = atomic_load(&g->round);
    pthread_mutex_unlock(&g->mu);
    if (!jobs || atomic_load(&g->done) >= n) return;
    /* The waiter takes jobs too, rather than sleep while some are left;
     * then it spins for the last ones, then sleeps. */
    take_jobs(g, jobs, n, r);
    const double t0 = q_now();
    for (unsigned i = 0; atomic_load(&g->done) < n; i++)
        if (i % 64 == 63 && q_now() - t0 > WAITER_SPIN_S) break;
        else relax();
    pthread_mutex_lock(&g->mu);
    while (atomic_load(&g->done) < n) pthread_cond_wait(&g->done_cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}
