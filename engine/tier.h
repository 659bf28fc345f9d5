/* tier.h - the engine's side of the persistent prefix tier (engine
 * internal; the engine thread calls everything here but qtier_wait's
 * wake-up, which comes from the store thread).
 *
 * A new prompt whose cached prefix in the pool ends before its last full
 * block asks the store for the rest of its chain (qtier_lookup); the
 * request waits, without holding up the steps of others, until the answer
 * comes back (qtier_poll) and the blocks found are imported into its
 * sequence and their K/V written to the backend (qtier_import).  A finished
 * sequence's hashed blocks not persisted yet are read from the backend and
 * queued for writing (qtier_persist); those persisted already are marked
 * used.  Blocks are keyed by the tier fingerprint: the model's fingerprint,
 * the backend and the shape of its K/V bytes. */
#ifndef QUIRE_TIER_H
#define QUIRE_TIER_H

#include <stdint.h>

#include "backend.h"
#include "kv.h"
#include "store.h"

struct qmodel;
typedef struct qtier qtier;

typedef struct {
    uint64_t lookups;           /* chains asked of the store */
    uint64_t blocks_loaded;     /* blocks imported from it */
    uint64_t tokens_loaded;     /* their tokens */
    uint64_t blocks_queued;     /* blocks handed to the store to write */
    uint64_t blocks_dropped;    /* of those, refused (queue full, no memory, a failed read) */
} qtier_stats;

/* A tier over store for this pool and backend: 0, or QERR_NOMEM. */
int qtier_create(qstore *store, const struct qmodel *m, qbackend *be, kv_pool *pool, qtier **out);
/* Waits for the lookups in flight, then frees t.  NULL is a no-op. */
void qtier_destroy(qtier *t);

/* Asks the store for the blocks of prompt's chain from block `first` (the
 * blocks before it are in the pool) up to its last eligible one, for the
 * request tag.  1 when a lookup was queued (the answer comes through
 * qtier_poll), 0 when there is nothing to ask for or the store is gone. */
int qtier_lookup(qtier *t, uint64_t tag, const int32_t *prompt, int n, int first);
/* A finished lookup (the caller passes it to qtier_import or frees it with
 * qstore_job_free), or NULL.  Its tag is the request's. */
qstore_job *qtier_poll(qtier *t);
/* Imports the blocks j found into s, which must end at the block j started
 * from, and writes their K/V to the backend; frees j.  Returns the blocks
 * imported (0 when s moved on, or the pool had no room), or the backend's
 * error (s keeps what was written before it). */
int qtier_import(qtier *t, qstore_job *j, kv_seq *s);
/* Queues s's hashed blocks for the store (the ones it has already: marked
 * used).  Errors are counted, never returned. */
void qtier_persist(qtier *t, const kv_seq *s);
/* Waits up to seconds for a lookup to finish (an engine with nothing else
 * to do). */
void qtier_wait(qtier *t, double seconds);
/* Lookups in flight. */
int qtier_pending(qtier *t);
void qtier_stats_get(qtier *t, qtier_stats *out);

#endif
