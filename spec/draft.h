/* draft.h - the draft-model proposer: a second, smaller model of the same
 * vocabulary guesses the next tokens, and the target checks them in one
 * pass (the verification is the engine's, with the sampler's rule).
 *
 * The draft model has a backend of its own, created with as many blocks as
 * the target's, and keeps its K/V at the same block ids: a request's block
 * table serves both models.  The pool, the prefix cache and preemption know
 * only the target; the draft follows them through each block's generation
 * (the host's block_gen), which changes exactly when the block is handed
 * out again.  For every block the drafter keeps the generation it saw when
 * it last wrote there (gen) and how many of its slots it filled (fill): a
 * sequence's draft K/V are current through the leading blocks whose
 * generation stands, as far as they are filled.  So a prefix found in the
 * cache is the draft's too when the draft wrote it, a block copied, swapped
 * back or recomputed is not, and nothing needs telling.
 *
 * A step's passes (qspec_draft_passes): pass 0 feeds each sequence the
 * tokens its draft K/V lack (the newest token, one or two after a step, or
 * part of a whole prompt) and gives its first draft; pass j feeds draft
 * j - 1 and gives draft j.  The host draws each draft from its row (as the
 * request's sampler draws, masked by its grammar) and appends it to the
 * sequence, or ends the sequence's drafts there.
 *
 * spec/ includes kernels/backend.h (the draft runs on a backend) and base/. */
#ifndef QUIRE_SPEC_DRAFT_H
#define QUIRE_SPEC_DRAFT_H

#include <stdint.h>

#include "backend.h"

/* What the drafter asks of its host (the engine). */
typedef struct {
    void *ctx;
    /* The generation of block b of the target's pool. */
    uint32_t (*block_gen)(void *ctx, int b);
    /* Sequence s's tokens (its drafts so far after them) and block table, now. */
    void (*seq)(void *ctx, int s, const int32_t **tokens, const int32_t **blocks, int *n_blocks);
    /* Draft j of sequence s from its row: the logits (n_vocab floats), or
     * for an argmax row (argmax set) the backend's token tok (then logits
     * are not read).  The host draws it and appends it to s, returning it,
     * or returns -1: s's drafts end before it. */
    int (*take)(void *ctx, int s, int j, const float *logits, int argmax, int tok);
} qspec_host;

/* A sequence of a step.  The host fills pos0 (qspec_draft_held), feed,
 * k, n_tokens and argmax; the passes fill k (lowered where its drafts
 * end) and n_draft. */
typedef struct {
    int n_tokens;           /* its tokens, the newest not yet in the target's cache */
    int pos0, feed;         /* pass 0 feeds tokens [pos0, pos0 + feed) (feed 0: not in the passes) */
    int k;                  /* drafts it may take (0: it only catches up) */
    int argmax;             /* its rows are reduced to their argmax (greedy, no grammar) */
    int n_draft;            /* drafts taken */
} qspec_dseq;

typedef struct qspec_draft qspec_draft;

/* A drafter on backend be (owned from now on: destroyed with it), for a
 * pool of num_blocks blocks of block_size tokens and a vocabulary of
 * n_vocab.  0, or QERR_NOMEM (be destroyed). */
int qspec_draft_new(qbackend *be, int num_blocks, int block_size, int n_vocab, qspec_draft **out);
/* NULL is a no-op. */
void qspec_draft_free(qspec_draft *d);
/* Whether its backend runs passes where every token has a row as graphs
 * (then a first pass of few tokens a sequence gives every token a row). */
int qspec_draft_graphs(const qspec_draft *d);

/* The positions of a sequence (n_tokens tokens, on blocks) whose draft K/V
 * are current; never the newest token (the first pass feeds it).  Cannot
 * fail. */
int qspec_draft_held(const qspec_draft *d, const qspec_host *h, const int32_t *blocks, int n_blocks, int n_tokens);
/* The sequence on blocks keeps its first keep tokens: what the draft wrote
 * past them is forgotten.  Cannot fail. */
void qspec_draft_cut(qspec_draft *d, const qspec_host *h, const int32_t *blocks, int n_blocks, int keep);

/* Runs the step's passes over the n sequences (kmax: the most drafts any
 * may take; all_rows: the first pass gives every token a row, see
 * qspec_draft_graphs).  0, or QERR_NOMEM / the backend's error: then no
 * pass's drafts should be kept.  The pass counters add up in *passes,
 * *tokens, *seconds. */
int qspec_draft_passes(qspec_draft *d, const qspec_host *h, qspec_dseq *seqs, int n, int kmax, int all_rows,
                       uint64_t *passes, uint64_t *tokens, double *seconds);

#endif
