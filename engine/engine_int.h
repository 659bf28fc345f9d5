/* engine_int.h - what the engine's files share (engine internal): the
 * request and the engine, and the functions one file calls in another.
 * engine.c has the requests, the step and the API; sched.c the scheduler
 * (its lists, preemption and the swap space); engine_guided.c guided
 * decoding's masks; engine_spec.c speculative decoding's drafts and their
 * verification; engine_draft.c a draft model's proposals. */
#ifndef QUIRE_ENGINE_INT_H
#define QUIRE_ENGINE_INT_H

#include <pthread.h>
#include <stdint.h>

#include "pool.h"
#include "engine.h"
#include "gram.h"
#include "guide.h"
#include "kv.h"
#include "model.h"
#include "qerr.h"
#include "sched.h"
#include "draft.h"
#include "policy.h"
#include "spec.h"
#include "stop.h"
#include "tier.h"
#include "tokenizer.h"
#include "buf.h"
#include "util.h"

typedef struct req {
    uint64_t id;
    struct req *next;
    int32_t *tokens;        /* prompt then output */
    int n_tokens, cap_tokens;
    int n_prompt, n_gen;
    int max_tokens, ignore_eos;
    int32_t *stop_ids;
    int n_stop_ids;
    int min_tokens;         /* stop strings count from this many output tokens on (qreq_params) */
    int n_computed;         /* tokens whose K/V are in the cache */
    int cached_tokens;      /* of the prompt, reused from the prefix cache (first admission) */
    int cached_disk;        /* of those, loaded from the persistent tier */
    int admitted_once;
    uint64_t admit_seq;     /* order of (re)admission, for preemption */
    kv_seq kv;
    qsampler *smp;
    qdetok *detok;
    qstop *stop;
    int want_logprobs, top_logprobs;
    int cancelled;
    int tier_wait;          /* waiting for the store's answer (persistent tier) */
    int in_batch;           /* static batching: member of the current batch */
    int preempted_now;      /* preempted during the current step's scheduling */
    int index;              /* sample index within the request (n > 1) */
    struct req **forks;     /* samples 1..n-1, waiting for this one's prompt */
    int n_forks;
    gram_m *gm;             /* guided decoding: where the output is in the grammar, or NULL */
    const gram_vocab *gv;
    uint32_t *gmask;        /* (n_vocab + 31) / 32: the tokens the grammar allows now */
    uint32_t *gdst;         /* where this step's mask job writes: gmask, or the backend's row (mask_rows) */
    int gpend;              /* the last token, for the grammar to take with the next mask (-1: none) */
    int gdone;              /* the mask job found the output complete: the step's draw is not taken */
    int gm_failed;          /* the mask could not be made: the request ends in error */
    int gjob;               /* this step's mask job (index in e->gjobs), -1 for none */
    int stop_string;        /* it stopped on a stop string (what the matcher holds is dropped) */
    /* speculative decoding (engine_spec.c) */
    int spec;               /* it may speculate (the engine's spec_mode, not opted out) */
    qspec_ctl ctl;          /* how many drafts it asks for (spec/policy.h; ctl.passes: passes that verified them) */
    int32_t draft[QSPEC_MAX_K];
    int n_draft;            /* this step's drafts, in the batch after its next token */
    uint32_t *smask;        /* with a grammar: the mask of each draft row, (QSPEC_MAX_K + 1) rows (made on first use) */
    qspec_index *sidx;      /* its tokens' n-grams, for the lookup (made on first use; NULL: the lookup scans) */
    int spec_drafted, spec_accepted;
    /* a draft model's step (engine_draft.c) */
    int dwant;              /* drafts asked for */
    int dfed;               /* drafts its grammar took on the way (rolled back after) */
    float *dq;              /* (n_draft, n_vocab) the drafts' distributions (sampling; in e->dq), or NULL */
    int32_t *slots;         /* swapped out: swap slot of each hole of kv, in order */
    int n_slots;
    double t_submit, t_first;
} req;

struct qengine {
    const qmodel *m;
    const qtok *tok;
    qengine_opts o;
    qbackend *be;
    kv_pool *pool;
    qtier *tier;            /* the persistent prefix tier, or NULL */
    double prefill_rate;    /* prompt tokens a second in steps with >= 128 of them (moving average) */
    qsched s;               /* the scheduler: the request lists, the swap space */
    uint64_t next_id;
    /* inbox */
    pthread_mutex_t mu;
    req *inbox_head, *inbox_tail;
    uint64_t *cancels;
    int n_cancels, cap_cancels;
    /* outbox */
    qevent *events;
    size_t ev_head, ev_n, ev_cap;
    /* live ids (for cancel), protected by mu */
    int live;
    /* step scratch */
    int32_t *b_tokens, *b_logits_idx;
    qbatch_seq *b_seqs;
    req **b_reqs;
    int *b_sample;
    uint8_t *b_rowmode;           /* (cap_rows) per logit row: QROW_*, how the backend reduces it */
    qrow_sample *b_rsample;       /* (cap_rows) the draws of QROW_SAMPLE rows */
    qrow_logprobs *b_rlp;         /* (cap_rows) log-probabilities the backend gives for reduced rows */
    const uint32_t **b_rowmask;   /* (cap_rows) guided rows' masks, for a backend that applies them (else NULL) */
    struct sdraw *draws;          /* (cap_draws) the draws of a step */
    qguide *guide;                /* the thread making masks during the forward pass (made on first use) */
    qguide_job *gjobs;            /* (cap_gjobs) a step's masks */
    int n_gjobs_out;              /* started and not yet waited for */
    double t_gjobs;               /* when they were started */
    int cap_gjobs;
    int cap_draws;
    qpool *spool;                 /* threads for the draws when the model runs on a GPU, or NULL */
    int32_t *b_rowtok;            /* (cap_rows) the backend's token of those rows */
    float *logits;
    int *b_row0;                  /* (cap_seqs) each sequence's first logit row */
    int cap_tokens, cap_seqs, cap_rows;
    qengine_stats st;
    /* a draft model (QSPEC_DRAFT): the proposer (spec/draft.h) and a step's
     * view of its requests for it (engine_draft.c) */
    qspec_draft *drafter;
    qspec_dseq *d_dseq;           /* (cap_dseq) */
    req **d_reqs;                 /* the step's drafting requests (the plan's), while the passes run */
    int cap_dseq;
    float *dq;                    /* (cap_dq) the step's drafts' distributions */
    size_t cap_dq;
    qspec_probe sp;               /* whether drafts pay (spec/policy.h) */
    /* A model whose every layer attends to its last kv_window positions
     * only (0: none, or a draft model reads the blocks too): blocks
     * behind every window go back to the pool as a sequence advances. */
    int kv_window;
};

/* Gives back q's blocks that no later token attends to (kv_window). */
static inline void qe_window_drop(qengine *e, req *q)
{
    if (e->kv_window) kv_seq_drop_before(e->pool, &q->kv, q->n_computed - e->kv_window + 1);
}

/* Resizes the array *pp to n elements; 0 or QERR_NOMEM (*pp unchanged). */
static inline int qe_grow_array(void **pp, size_t n, size_t size)
{
    void *p = q_reallocn(*pp, n, size);
    if (!p) return QERR_NOMEM;
    *pp = p;
    return 0;
}
#define GROW(arr, n) qe_grow_array((void **)&(arr), (size_t)(n), sizeof *(arr))

/* ---- request lists (FIFO) ---------------------------------------------------- */

static inline void rl_push_back(rlist *l, req *r)
{
    r->next = NULL;
    if (l->tail) l->tail->next = r;
    else l->head = r;
    l->tail = r;
    l->n++;
}

static inline void rl_push_front(rlist *l, req *r)
{
    r->next = l->head;
    l->head = r;
    if (!l->tail) l->tail = r;
    l->n++;
}

static inline void rl_remove(rlist *l, req *r)
{
    req **pp = &l->head, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp) return;
    *pp = r->next;
    if (l->tail == r) l->tail = prev;
    r->next = NULL;
    l->n--;
}

/* One draw of a step: the request, its logits row, and what the draw gave.
 * Draws touch only their own request's sampler, so a step's draws can run
 * on several threads; their effects (events, stops) are then applied in
 * order by take_token. */
_Static_assert(QROW_MAX_LOGPROBS == 1 + QSAMPLE_MAX_LOGPROBS, "a row's log-probabilities fit the API's");

typedef struct sdraw {
    req *r;
    const float *lg;
    int tok;                 /* the backend's token for a reduced row, or -1 to sample */
    const double *u;         /* a drawn row the backend gave back: the uniform it was given */
    const qrow_logprobs *blp; /* the backend's log-probabilities of the row, or NULL */
    int n_lp;                /* entries in lp: 0 when no logprobs were asked for */
    qlogprob lp[1 + QSAMPLE_MAX_LOGPROBS];
} sdraw;

/* engine.c */
/* Fills d's token (drawn when the backend gave none) and its
 * log-probabilities when r asked for them. */
void qe_draw_one(qengine *e, sdraw *d);
/* Takes d's token into its request (the grammar, the stop conditions, the
 * text, an event): QFINISH_NONE while it goes on. */
qfinish qe_take_token(qengine *e, req *r, const sdraw *d);
/* Ends r (an event with why; its blocks released, full ones kept cached)
 * and frees it. */
void qe_finish(qengine *e, req *r, qfinish why);
/* Releases r's blocks (full ones stay cached) and swap slots. */
void qe_release_kv(qengine *e, req *r);

/* engine_spec.c */
/* Drafts for running request r, its next token's slot reserved, with room
 * for at most room more tokens this step: appended to r's kv, r->n_draft
 * set (0: none).  Cannot fail. */
void qe_spec_draft(qengine *e, req *r, int room);
/* Verifies r's drafts against the pass's logit rows row0..row0+n_draft and
 * takes the tokens kept plus one of the target's own (in order, through
 * qe_take_token, stopping where the request ends); the rejected drafts
 * leave the kv.  QFINISH_NONE while it goes on. */
qfinish qe_spec_take(qengine *e, req *r, int row0);
/* Whether this step may draft (the probe's say), as it begins. */
int qe_spec_allowed(qengine *e);
/* The step's outcome for the probe: decode_only (no prompt tokens in it),
 * its seconds; the tokens it gave are counted from st.generated. */
void qe_spec_step_done(qengine *e, int decode_only, double secs);

/* How many drafts r may take this step (either proposer), with room for
 * at most room more tokens: 0 while it does not draft. */
int qe_spec_want(qengine *e, req *r, int room);
/* Readies r's grammar for drafts: room for the draft rows' masks
 * (r->smask) and its pending token taken.  1, or 0 for no drafts this step
 * (no memory for the masks; or the grammar refused the token: gm_failed). */
int qe_spec_grammar_start(qengine *e, req *r);
/* Makes the mask of r's draft row j (r->smask row j) from where its
 * grammar stands: 0, or 1 when there is none (nothing allowed, or an error). */
int qe_spec_mask_row(qengine *e, req *r, int j);

/* engine_draft.c */
/* Drafts from the draft model for the n scheduled decodes rs (each with its
 * next token's slot reserved), taking drafts' room from *budget: each
 * one's drafts appended to its kv, n_draft and dq set.  Cannot fail (a
 * failed pass leaves no drafts). */
void qe_draft_run(qengine *e, req **rs, int n, int *budget);
/* r keeps its first keep tokens (the rest were refused): what the draft
 * wrote past them is forgotten.  Before the kv is truncated. */
void qe_draft_cut(qengine *e, const req *r, int keep);

/* engine_guided.c */
/* Feeds r's grammar its pending token now: 0 or the matcher's refusal. */
int qe_feed_now(qengine *e, req *r);
/* r's mask for this step applied (on_device: by the backend): 0 or an error. */
int qe_apply_mask(qengine *e, req *r, float *lg, int on_device);
/* qrow_masks.ready: the step's masks are done. */
int qe_masks_ready(void *ctx);
/* Starts the step's masks on the guide threads: how many. */
int qe_start_masks(qengine *e, int n_seqs);

#endif
