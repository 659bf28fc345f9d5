/* spec.h - speculative decoding's parts that know nothing of the engine:
 * proposers of draft tokens.  (The verification rule is the sampler's:
 * sample.h's qsample_verify; the engine runs the drafts through the target
 * in one pass and rolls back what it refuses.)
 *
 * n-gram prompt lookup (vLLM's "ngram", llama.cpp's lookup decoding): the
 * text so far often repeats itself (code, quotes of the prompt, lists,
 * JSON keys), so the tokens that followed the last few tokens' latest
 * earlier occurrence are a good guess of what follows now, at no cost.
 *
 * spec/ is speculative decoding's proposers (this n-gram lookup; a draft
 * model, draft.h) and its policy (policy.h: when to draft, how much); the
 * engine verifies the drafts with the sampler's rule.  spec/ includes
 * kernels/backend.h (the draft model's backend) and base/, nothing of the
 * engine: what it needs of a request comes through draft.h's qspec_host. */
#ifndef QUIRE_SPEC_H
#define QUIRE_SPEC_H

#include <stdint.h>

/* The verify loop.  The target's pass gave rows 0..d for a sequence with
 * d drafts after its next token; row j says what follows the drafts before
 * it.  row(ctx, j, &acc) takes row j's token into the sequence - draft j
 * when the sampler's rule keeps it (*acc = 1: greedy, when it is the
 * target's own choice; sampling, by rejection sampling, so the output is
 * distributed as without drafts), else the target's own - and returns
 * whether the sequence goes on.  The loop ends at the first refused draft
 * (its row gave the target's token instead) or where the sequence ends;
 * when all are kept the last row gives one token more.  Returns the drafts
 * kept.  Cannot fail. */
int qspec_verify(int d, int (*row)(void *ctx, int j, int *acc), void *ctx);

/* The most tokens a proposal holds. */
#define QSPEC_MAX_K 16

/* Proposes up to k tokens continuing hist[0..n): the longest suffix of
 * hist of max_n down to min_n tokens that occurs earlier in hist, at its
 * latest earlier occurrence followed by k tokens (else the one followed by
 * the most), and the tokens that followed it there (up to k).  Writes them to out; returns how many (0: no
 * suffix recurs, or bad arguments: n < 2, k < 1, min_n < 1, max_n <
 * min_n).  k is clamped to QSPEC_MAX_K.  Cannot fail. */
int qspec_ngram(const int32_t *hist, int n, int min_n, int max_n, int k, int32_t *out);

/* The same lookup from an index of the sequence's n-grams, kept up to
 * date as the sequence grows: a lookup costs O(k) rather than a scan of the
 * whole sequence (long conversations).  Proposes exactly what qspec_ngram
 * proposes. */
typedef struct qspec_index qspec_index;

/* An empty index for suffixes of min_n..max_n tokens (1 <= min_n <= max_n
 * <= 8); NULL on bad arguments or when out of memory. */
qspec_index *qspec_index_new(int min_n, int max_n);
void qspec_index_free(qspec_index *x);
/* Indexes hist[indexed .. n) (hist: the whole sequence so far, its earlier
 * tokens unchanged since the last call).  0 or QERR_NOMEM (the index then
 * stays as it was: the caller may try again or drop it). */
int qspec_index_update(qspec_index *x, const int32_t *hist, int n);
/* qspec_ngram(hist, n, min_n, max_n, k, out), from the index (which must
 * hold exactly n tokens of hist). */
int qspec_index_propose(const qspec_index *x, const int32_t *hist, int n, int k, int32_t *out);

#endif
