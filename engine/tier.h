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
    uint64_t skipped;           /* chains not asked for: their next block is not in the tier */
    uint64_t skipped_slower;    /* chains not asked for: loading measured slower than computing */
    double load_rate;           /* tokens a second a lookup has brought (moving average; 0: none yet) */
    uint64_t blocks_loaded;     /* blocks imported from it */
    uint64_t tokens_loaded;     /* their tokens */
    uint64_t blocks_queued;     /* blocks handed to the store to write */
    uint64_t blocks_dropped;    /* of those, refused (queue full, no memory, a failed read) */
} qtier_stats;

/* A tier over store for this pool and backend: 0, or QERR_NOMEM. */
int qtier_create(qstore *store, const struct qmodel *m, qbackend *be, kv_pool *pool, qtier **out);
/* Waits for the lookups in flight, then frees t.  NULL is a no-op. */
void qtier_destroy(qtier *t);

/* Whether a prefix should come from disk: loading at load_rate tokens a
 * second against computing at prefill_rate (0: not measured, so load);
 * when loading is slower, still 1 every 16th time (attempt counts them),
 * so that the rate measured stays current.  Pure; cannot fail. */
int qtier_should_load(double load_rate, double prefill_rate, uint64_t attempt);

/* Asks the store for the blocks of prompt's chain from block `first` (the
 * blocks before it are in the pool) up to its last eligible one, for the
 * request tag.  1 when a lookup was queued (the answer comes through
 * qtier_poll), 0 when there is nothing to ask for or the store is gone. */
int qtier_lookup(qtier *t, uint64_t tag, const int32_t *prompt, int n, int first);
/* As qtier_lookup, but first weighs loading against computing at
 * prefill_rate tokens a second (qtier_should_load); always_load skips the
 * weighing. */
int qtier_lookup_if_faster(qtier *t, uint64_t tag, const int32_t *prompt, int n, int first, double prefill_rate,
                           int always_load);
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
