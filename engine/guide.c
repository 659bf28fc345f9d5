/* guide.c - guided decoding's engine side: a grammar vocabulary
 * (grammar/gram.h) from a qtok (engine.h), and the thread that makes a
 * step's masks while the forward pass runs (guide.h). */
#include "guide.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "gram.h"
#include "qerr.h"
#include "tokenizer.h"
#include "util.h"

int qengine_grammar_vocab(const qtok *tok, gram_vocab **out)
{
    *out = NULL;
    const int n = qtok_vocab_size(tok);
    uint8_t **bytes = q_callocn((size_t)n + 1, sizeof *bytes), *skip = calloc((size_t)n + 1, 1);
    size_t *lens = q_callocn((size_t)n + 1, sizeof *lens);
    int rc = bytes && skip && lens ? 0 : QERR_NOMEM;
    char buf[1024];
    for (int i = 0; i < n && !rc; i++) {
        const int l = qtok_token_bytes(tok, i, buf, sizeof buf);
        skip[i] = l <= 0 || qtok_is_special(tok, i);
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

struct qguide {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* work given, or quit */
    pthread_cond_t done_cv; /* the jobs are done */
    qguide_job *jobs;
    int n;
    int pending; /* jobs given and not done */
    int quit;
};

static void *guide_main(void *arg)
{
    qguide *g = arg;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->pending && !g->quit) pthread_cond_wait(&g->cv, &g->mu);
        if (!g->pending && g->quit) break;
        qguide_job *jobs = g->jobs;
        const int n = g->n;
        pthread_mutex_unlock(&g->mu);
        for (int i = 0; i < n; i++) jobs[i].rc = gram_m_mask(jobs[i].m, jobs[i].v, jobs[i].mask);
        pthread_mutex_lock(&g->mu);
        g->pending = 0;
        pthread_cond_broadcast(&g->done_cv);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int qguide_new(qguide **out)
{
    *out = NULL;
    qguide *g = calloc(1, sizeof *g);
    if (!g) return QERR_NOMEM;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    pthread_cond_init(&g->done_cv, NULL);
    if (pthread_create(&g->th, NULL, guide_main, g)) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        pthread_cond_destroy(&g->done_cv);
        free(g);
        return QERR_INTERNAL;
    }
    *out = g;
    return 0;
}

void qguide_free(qguide *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->quit = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->th, NULL);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    pthread_cond_destroy(&g->done_cv);
    free(g);
}

void qguide_start(qguide *g, qguide_job *jobs, int n)
{
    if (n <= 0) return;
    pthread_mutex_lock(&g->mu);
    g->jobs = jobs, g->n = n, g->pending = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void qguide_wait(qguide *g)
{
    pthread_mutex_lock(&g->mu);
    while (g->pending) pthread_cond_wait(&g->done_cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}
