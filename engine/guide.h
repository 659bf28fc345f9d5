/* guide.h - masks of guided decoding made on a thread of their own (engine
 * internal): the engine starts the masks of a step's grammar requests
 * before the forward pass and waits for them after it, so the two overlap
 * (DESIGN.md: the grammar's cost hides behind the model's).
 *
 * One thread; jobs are a step's (matcher, vocabulary, mask) triples.  The
 * matchers must not be touched by anyone else between qguide_start and
 * qguide_wait. */
#ifndef QUIRE_GUIDE_H
#define QUIRE_GUIDE_H

#include <stdint.h>

#include "gram.h"

typedef struct {
    gram_m *m;
    const gram_vocab *v;
    uint32_t *mask;
    int rc; /* gram_m_mask's answer, once done */
} qguide_job;

typedef struct qguide qguide;

/* A started thread in *out: 0 or QERR_NOMEM / QERR_INTERNAL. */
int qguide_new(qguide **out);
/* Stops the thread (after the jobs in hand) and frees g; NULL is fine. */
void qguide_free(qguide *g);
/* Starts the n jobs (the array stays the caller's, untouched until
 * qguide_wait returns); returns at once. */
void qguide_start(qguide *g, qguide_job *jobs, int n);
/* Returns when the jobs of the last qguide_start are done (at once when
 * there are none). */
void qguide_wait(qguide *g);

#endif
