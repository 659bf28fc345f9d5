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
};

/* Runs j on the store thread (store_jobs.c): fills j->rc, j->err,
 * j->result. */
void qstore_run(qstore *s, qstore_job *j);
/* Reads the tier's size and the LRU clock at start (store_jobs.c): 0 or a
 * QERR_* code. */
int qstore_tier_init(qstore *s);

#endif
