/* store_int.h - the store thread's state, shared by store.c (the thread
 * and its queue) and store_jobs.c (what each job does in sqlite). */
#ifndef QUIRE_STORE_INT_H
#define QUIRE_STORE_INT_H

#include <pthread.h>

#include "store.h"

struct qstore {
    sqlite3 *db;
    qstore_opts o;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    qstore_job *head, *tail;    /* the queue, under mu */
    int stopping;
    qstore_stats st;            /* under mu */
    int64_t clock;              /* last_used of the newest use (store thread) */
    /* The blocks in the tier, as 64-bit keys of (fingerprint, hash), under
     * mu: open addressing, 0 empty, 1 deleted.  A false positive costs a
     * lookup that finds nothing; there are no false negatives. */
    uint64_t *keys;
    size_t key_cap, key_n, key_dead;
};

/* The set's key of a block. */
uint64_t qstore_key(const uint8_t fp[16], const uint8_t hash[16]);
/* Adds or removes a key (mu held).  Adding may fail to grow the table: the
 * key is then missing, which only costs its block a lookup never made. */
void qstore_key_add(qstore *s, uint64_t k);
void qstore_key_del(qstore *s, uint64_t k);

/* Runs j on the store thread (store_jobs.c): fills j->rc, j->err,
 * j->result. */
void qstore_run(qstore *s, qstore_job *j);
/* Gives each session whose last message is not an assistant's - its turn
 * was stored, then the process stopped before the reply was - an empty
 * assistant reply marked partial (what a request cancelled before its first
 * token stores), so that its roles alternate again.  Run at start, before
 * any turn can be in flight.  One transaction; a second run adds nothing.
 * 0 with *added the replies added, or a QERR_* code with a message. */
int qstore_repair_turns(qstore *s, const char *path, int *added, char *err, size_t errlen);
/* Reads the tier's size and the LRU clock at start (store_jobs.c): 0 or a
 * QERR_* code. */
int qstore_tier_init(qstore *s);

#endif
