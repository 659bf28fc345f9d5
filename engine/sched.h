/* sched.h - the scheduler: which requests run in a step, with how many
 * tokens, on which blocks (engine internal; sched.c has the design).
 *
 * The engine thread owns a qsched and calls it once a step in two halves:
 * sched_decodes gives every running request its next token's slot (and
 * preempts when the pool is short); the engine's proposers may then add
 * drafts from the budget left; sched_admit resumes swapped requests and
 * fills the rest of the budget with prompt chunks.  The result is a plan
 * that the engine turns into one forward pass. */
#ifndef QUIRE_SCHED_H
#define QUIRE_SCHED_H

#include <stdint.h>

#include "backend.h"
#include "engine.h"
#include "kv.h"

typedef struct req req;

/* A FIFO list of requests, linked through req.next. */
typedef struct {
    req *head, *tail;
    int n;
} rlist;

/* One sequence of a step: n_tokens of r's tokens from r->n_computed on.
 * A decode's single token is its last sampled one (drafts, which the
 * engine adds, follow it); a prompt chunk's are the next uncomputed ones.
 * sample: the pass gives logits for it (a decode, or a prompt's last chunk). */
typedef struct {
    req *r;
    int n_tokens;
    int sample;
    int decode;
} sched_seq;

typedef struct {
    sched_seq *seqs;        /* (max_seqs) in the pass's order: decodes, resumed, prompt chunks */
    int n_seqs;
    int budget;             /* tokens still free in the step's budget */
    req **dec;              /* (max_seqs) the decodes of sched_decodes, oldest admission first */
    int n_dec;              /* how many: those the draft proposers see */
    int n_resumed;          /* decodes of swapped requests resumed by sched_admit (no drafts) */
    int n_run;              /* requests running when the step began */
    int preempted;          /* the step preempted (nothing resumes in it) */
} sched_plan;

typedef struct qsched {
    /* what it decides over: the engine's, not owned */
    kv_pool *pool;
    qbackend *be;
    const qengine_opts *o;
    qengine_stats *st;
    /* a request the scheduler gives up on (it can never fit, or its blocks
     * could not be restored): the owner ends it with an error */
    void (*fail)(void *ctx, req *r);
    void *fail_ctx;

    rlist waiting, running, swapped;
    uint64_t admit_counter;

    /* swap space (QPREEMPT_SWAP): n_slots one-block slots of block_bytes */
    char *swap_mem;
    size_t block_bytes;
    int n_slots;
    int32_t *slot_free;     /* (n_slots) stack of free slots; top handed out first */
    int n_slot_free;
    int32_t *sw_idx, *sw_blocks;  /* (num_blocks) scratch: logical and physical ids */

    sched_seq *seqs;        /* (max_seqs) the plan's */
    req **dec;              /* (max_seqs) the plan's */
    req **order;            /* (cap_order) scratch: the running list as a step began */
    int cap_order;
} qsched;

/* Sets s up over the engine's pool, backend, options and statistics, with
 * the swap space in swap mode.  0, or QERR_NOMEM / QERR_RANGE with a
 * message; sched_free undoes a partial setup. */
int sched_init(qsched *s, kv_pool *pool, qbackend *be, const qengine_opts *o, qengine_stats *st,
               void (*fail)(void *, req *), void *fail_ctx, char *err, size_t errlen);
/* Frees what sched_init allocated (not the requests).  A zeroed s is a no-op. */
void sched_free(qsched *s);

/* Starts a step's plan: every running request, oldest admission first,
 * gets its next token's slot within the budget and the sequence cap,
 * preempting the newest when the pool is short.  0 or a backend error. */
int sched_decodes(qsched *s, sched_plan *p);
/* Completes the plan: swapped requests resume (not after a preemption),
 * then waiting prompts get chunks, first come first served.  0 or an error
 * (requests it gave up on went to s->fail). */
int sched_admit(qsched *s, sched_plan *p);

/* Returns r's swap slots to the free stack.  Cannot fail. */
void sched_slots_release(qsched *s, req *r);
/* Requests waiting, running and swapped. */
static inline int sched_live(const qsched *s) { return s->waiting.n + s->running.n + s->swapped.n; }

#endif
