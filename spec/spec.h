/* spec.h - speculative decoding's parts that know nothing of the engine:
 * proposers of draft tokens.  (The verification rule is the sampler's:
 * sample.h's qsample_verify; the engine runs the drafts through the target
 * in one pass and rolls back what it refuses.)
 *
 * n-gram prompt lookup (vLLM's "ngram", llama.cpp's lookup decoding): the
 * text so far often repeats itself (code, quotes of the prompt, lists,
 * JSON keys), so the tokens that followed the last few tokens' latest
 * earlier occurrence are a good guess of what follows now, at no cost. */
#ifndef QUIRE_SPEC_H
#define QUIRE_SPEC_H

#include <stdint.h>

/* The most tokens a proposal holds. */
#define QSPEC_MAX_K 16

/* Proposes up to k tokens continuing hist[0..n): the longest suffix of
 * hist of max_n down to min_n tokens that occurs earlier in hist, at its
 * latest earlier occurrence followed by k tokens (else the one followed by
 * the most), and the tokens that followed it there (up to k).  Writes them to out; returns how many (0: no
 * suffix recurs, or bad arguments: n < 2, k < 1, min_n < 1, max_n <
 * min_n).  k is clamped to QSPEC_MAX_K.  Cannot fail. */
int qspec_ngram(const int32_t *hist, int n, int min_n, int max_n, int k, int32_t *out);

#endif
