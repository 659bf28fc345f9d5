/* pool.h - the CPU backend's worker pool.
 *
 * qpool_run(pool, n_tasks, fn, ctx) calls fn(ctx, task, tid) once for every task
 * in 0..n_tasks-1, spread over the pool's threads and the calling thread, and
 * returns when all are done.  Tasks are handed out by an atomic counter, so
 * which thread runs a task varies; a task's result must depend only on its
 * index (that is what keeps batched results bit-identical).  Workers spin
 * briefly before sleeping, because a decode step issues many short runs. */
#ifndef QUIRE_POOL_H
#define QUIRE_POOL_H

typedef struct qpool qpool;
/* tid is the running thread's index, 0 .. n_threads-1 (0: the caller), for
 * per-thread scratch. */
typedef void (*qpool_fn)(void *ctx, int task, int tid);

/* n_threads counts the caller: 1 means no workers.  NULL on failure. */
qpool *qpool_create(int n_threads);
int qpool_threads(const qpool *p);
/* Runs every task; cannot fail.  Not reentrant: one run at a time. */
void qpool_run(qpool *p, int n_tasks, qpool_fn fn, void *ctx);
/* Joins the workers; NULL is a no-op. */
void qpool_destroy(qpool *p);

#endif
