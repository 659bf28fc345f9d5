/* guide.h - masks of guided decoding made on a thread of their own (engine
 * internal): the engine starts the masks of a step's grammar requests
 * before the forward pass and waits for them after it, so the two overlap
 * (DESIGN.md: the grammar's cost hides behind the model's).
 *
 * A few threads share a step's jobs, (matcher, vocabulary, mask) triples,
 * taking them one at a time; qguide_wait's caller takes its share too.
 * The grammars' caches are theirs to share, under their locks.  The
 * matchers must not be touched by anyone else between qguide_start and
 * qguide_wait. */
#ifndef QUIRE_GUIDE_H
#define QUIRE_GUIDE_H

#include <stdint.h>

#include "gram.h"

typedef struct {
    gram_m *m;
    const gram_vocab *v;
    uint32_t *mask;      /* (n_vocab + 31) / 32 words, bit i: token i allowed */
    int n_vocab;         /* the model's (the grammar's vocabulary may be smaller) */
    const int *eos;      /* the model's end ids: allowed exactly where the output may end */
    int n_eos;
    int feed;            /* a token the matcher takes first (the last step's), -1: none */
    int feed_rc;         /* once done: the matcher's answer to it (0: taken) */
    int done;            /* once done: nothing more can follow (the output is complete) */
    int rc;              /* once done: 0, gram_m_mask's error, or QERR_INTERNAL when nothing is allowed */
    double t_end, secs;  /* once done: when it ended (q_now), how long it took */
} qguide_job;

/* Makes j's mask now, on this thread: all n_vocab bits written (a token
 * past the grammar's vocabulary refused); on an error, none allowed. */
void qguide_job_run(qguide_job *j);

/* Sets to -inf the logits of the tokens mask refuses (on the host). */
void qguide_mask_logits(const uint32_t *mask, float *lg, int n_vocab);

typedef struct qguide qguide;

/* How many threads to start: one beside a CPU backend (its pool has the
 * cores); beside a GPU a few, as the host's cores allow; QUIRE_GUIDE_THREADS
 * (1 to 8) overrides either. */
int qguide_threads(int beside_gpu);
/* n_threads (1 to 8) started threads in *out: 0 or QERR_NOMEM / QERR_INTERNAL. */
int qguide_new(int n_threads, qguide **out);
/* Stops the threads (after the jobs in hand) and frees g; NULL is fine. */
void qguide_free(qguide *g);
/* Starts the n jobs (the array stays the caller's, untouched until
 * qguide_wait returns); returns at once. */
void qguide_start(qguide *g, qguide_job *jobs, int n);
/* Runs jobs of the last qguide_start not yet taken, then returns when
 * all of them are done (at once when there are none). */
void qguide_wait(qguide *g);

#endif
