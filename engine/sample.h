/* sample.h - turning logits into a token.
 *
 * One sampling step runs in vLLM v1's order (vllm/v1/sample/sampler.py):
 *
 *   1. the allowed-token mask (the hook for grammars): disallowed logits
 *      become -inf;
 *   2. logit_bias: logit += bias (OpenAI's logit_bias; additive, as vLLM);
 *   3. penalties: repetition (tokens of the prompt or the output), then
 *      frequency and presence (tokens of the output only);
 *   4. temperature == 0 (or top_k == 1) is greedy: the lowest id among the
 *      maximal processed logits, with no randomness;
 *   5. otherwise temperature scaling, then top-k, top-p (nucleus, on the
 *      distribution renormalised after top-k, as vLLM) and min-p filters,
 *      then one draw from the sampler's random stream.
 *
 * Steps 1-3 change the logits every later step sees, greedy included.  The
 * same seed, the same logits and the same observed tokens give the same
 * tokens.  Log-probabilities for the API's logprobs come from
 * qsample_logprobs, which the caller runs on the raw model logits (vLLM's
 * default); see there. */
#ifndef QUIRE_SAMPLE_H
#define QUIRE_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

/* Most top alternatives a request may ask for (OpenAI's top_logprobs). */
#define QSAMPLE_MAX_LOGPROBS 20
/* Most logit_bias entries a request may carry. */
#define QSAMPLE_MAX_LOGIT_BIAS 1024
/* OpenAI's bound on one bias value. */
#define QSAMPLE_MAX_BIAS 100.0f

/* One logit_bias entry: logit[id] += bias. */
typedef struct {
    int32_t id;
    float bias; /* in [-100, 100] */
} qlogit_bias;

typedef struct {
    float temperature;        /* 0: greedy */
    int top_k;                /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off; keep tokens with p >= min_p * p_max */
    uint64_t seed;
    float repetition_penalty; /* 1: off; > 0.  Seen logits: l > 0 ? l / r : l * r */
    float frequency_penalty;  /* 0: off; [-2, 2].  l -= f * count in output */
    float presence_penalty;   /* 0: off; [-2, 2].  l -= p if in output */
    int logprobs;             /* 0/1: return the chosen token's log-probability */
    int top_logprobs;         /* 0..QSAMPLE_MAX_LOGPROBS alternatives; needs logprobs */
    /* (n_logit_bias) entries, distinct ids; NULL when n_logit_bias is 0.
     * Borrowed: the sampler copies them, the caller keeps ownership. */
    const qlogit_bias *logit_bias;
    int n_logit_bias;
    /* vLLM's min_tokens: until min_tokens tokens have been accepted
     * (qsampler_accept), the (n_min_ids) ids min_ids (the request's EOS and
     * stop token ids) get -inf.  Borrowed like logit_bias; NULL with 0. */
    int min_tokens;
    const int32_t *min_ids;
    int n_min_ids;
} qsample_params;

/* Defaults as in the OpenAI API and vLLM: temperature 1, filters and
 * penalties off (repetition_penalty 1), no logprobs, no bias, seed 0.  Start
 * from these: a zeroed struct has repetition_penalty 0, which is invalid. */
qsample_params qsample_defaults(void);

/* Checks every field that does not depend on the vocabulary: temperature in
 * [0, 100], top_p in (0, 1], min_p in [0, 1], top_k >= -1, the penalties'
 * ranges (vLLM's: repetition finite and > 0, frequency and presence in
 * [-2, 2]), logprobs 0 or 1, top_logprobs in [0, 20] and only with logprobs,
 * logit_bias at most QSAMPLE_MAX_LOGIT_BIAS entries with ids >= 0, distinct,
 * and biases in [-100, 100].  Returns 0, or QERR_RANGE / QERR_LIMIT /
 * QERR_INVAL with a message naming the field. */
int qsample_check(const qsample_params *p, char *err, size_t errlen);

typedef struct qsampler qsampler;

/* Creates a sampler for one sequence over a vocabulary of n_vocab ids.
 * Checks p (qsample_check) and that every logit_bias id is below n_vocab.
 * On success returns 0 and *out (owned by the caller, qsampler_destroy); p
 * and its logit_bias array need not outlive the call.  Otherwise returns
 * QERR_INVAL (n_vocab <= 0), QERR_RANGE, QERR_LIMIT or QERR_NOMEM with a
 * message, and *out is NULL.  The token counts behind the penalties take
 * about 8 bytes per vocabulary id, allocated only when a penalty is on. */
int qsampler_new(const qsample_params *p, int n_vocab, qsampler **out, char *err, size_t errlen);

/* The same without a message: NULL when out of memory or when p is
 * invalid for n_vocab. */
qsampler *qsampler_create(const qsample_params *p, int n_vocab);

/* Releases s; NULL is a no-op. */
void qsampler_destroy(qsampler *s);

/* Starts a new sequence with the same parameters: forgets the observed
 * prompt and output tokens and re-seeds the random stream.  Cannot fail. */
void qsampler_reset(qsampler *s);

/* Records prompt tokens (may be called several times, e.g. per prefill
 * chunk): they count for the repetition penalty only, as in vLLM.  All ids
 * are checked first; an id outside [0, n_vocab) gives QERR_RANGE and records
 * nothing.  QERR_INVAL for n < 0 or ids NULL with n > 0.  A no-op (after the
 * checks) when no penalty is on. */
int qsampler_observe_prompt(qsampler *s, const int32_t *ids, int n);

/* Records one generated token (call it with each token the sequence keeps,
 * before sampling the next).  0, or QERR_RANGE for an id outside the
 * vocabulary. */
int qsampler_accept(qsampler *s, int32_t id);

/* Words of an allowed-token bitmask for n_vocab ids: bit (id & 31) of word
 * (id >> 5) set means id may be sampled. */
#define QSAMPLE_MASK_WORDS(n_vocab) (((size_t)(n_vocab) + 31) / 32)

/* Writes the processed logits (steps 1-3 above: mask, bias, penalties) of
 * logits (n_vocab floats) into out (n_vocab floats; may be logits itself).
 * allowed: NULL (all allowed) or QSAMPLE_MASK_WORDS(n_vocab) words.  Returns
 * the number of allowed ids.  Cannot fail. */
int qsampler_process(qsampler *s, const float *logits, const uint32_t *allowed, float *out);

/* Samples a token from logits (n_vocab floats, not modified) with no mask.
 * Cannot fail: returns an id in [0, n_vocab). */
int qsample(qsampler *s, const float *logits);

/* Samples a token among the ids that allowed permits (NULL: all).  Returns
 * the id, or QERR_INVAL when the mask allows no id.  When every allowed id
 * has a logit of -inf (or NaN) the lowest allowed id is returned. */
int qsample_masked(qsampler *s, const float *logits, const uint32_t *allowed);

/* 1 when qsample(s, logits) is qsample_argmax(logits) whatever came before:
 * greedy (temperature 0 or top_k 1) with no penalty, no logit_bias and no
 * min_tokens ban in force, so
 * the step can be reduced where the logits are (the GPU). */
int qsampler_is_greedy(const qsampler *s);

/* 1 when a step of s may be drawn by the backend (a QROW_SAMPLE row,
 * backend.h's qrow_sample): temperature > 0, no penalty, no logit_bias and
 * no min_tokens ban in force
 * (top-k, top-p and min_p allowed); then the four outputs are set (top_k 0:
 * off).  The draw is the one qsample would make from the same logits (the
 * backend computes with its own exp and summation order, so a draw may
 * differ where the random number falls within rounding of a boundary). */
int qsampler_row_params(const qsampler *s, float *temperature, int *top_k, float *top_p, float *min_p);

/* qsample with the uniform number u instead of the next one of the stream:
 * the host's fallback for a row the backend could not draw. */
int qsample_with_uniform(qsampler *s, const float *logits, double u);

/* Speculative decoding's verification of a proposed token (a proposer
 * certain of it, as n-gram lookup is): the token to keep, distributed
 * exactly as qsample_masked's (rejection sampling: the draft is accepted
 * with the probability the sampler gives it, else a token is drawn from the
 * rest of the distribution, renormalised); *accepted says whether it is the
 * draft.  Greedy: the argmax, accepted when it is the draft.  QERR_INVAL
 * when the mask allows no id. */
int qsample_verify(qsampler *s, const float *logits, const uint32_t *allowed, int draft, int *accepted);
/* The same for a draft drawn from a proposal distribution q (n_vocab
 * probabilities, a draft model's, processed as the request's sampler would):
 * accepted with probability min(1, p / q), else drawn from max(0, p - q)
 * renormalised; q NULL is qsample_verify. */
int qsample_verify_q(qsampler *s, const float *logits, const uint32_t *allowed, const float *q, int draft, int *accepted);

/* A draft model's proposal: draws a token from logits (a draft model's row)
 * processed as the request's own draws are (mask, bias, penalties,
 * temperature, top-k/p, min-p), and writes that distribution into q
 * (n_vocab probabilities, 0 outside the candidates; NULL: not written), as
 * qsample_verify_q takes it.  Its random numbers come from a stream of
 * their own, so the request's draws take the same numbers with or without
 * a draft model.  Greedy: the argmax, q one-hot.  QERR_INVAL when the mask
 * allows no id. */
int qsample_propose(qsampler *s, const float *logits, const uint32_t *allowed, float *q);

/* Takes the one uniform number the next draw consumes, for a draw made
 * elsewhere (a QROW_SAMPLE row), so that the stream stays where qsample
 * would leave it. */
double qsampler_take_uniform(qsampler *s);

/* Index of the largest logit (lowest index on ties; NaN never wins unless
 * every value is NaN, then 0).  Cannot fail. */
int qsample_argmax(const float *logits, int n);

/* ---- log-probabilities --------------------------------------------------- */

typedef struct {
    int32_t id;
    float logprob; /* natural log; -INFINITY for a token of probability 0 */
} qlogprob;

/* Log-probabilities of one step, as the API reports them: log_softmax of
 * logits (n_vocab floats) for the chosen id in out[0], then the top_n most
 * likely ids in out[1..], most likely first, ties by lower id (top_n is
 * clamped to n_vocab).  out has room for 1 + top_n entries.  *rank (if
 * rank) gets vLLM's rank of the chosen id: how many ids have a logprob >=
 * its own (1 for the most likely).
 *
 * Which logits to pass: vLLM v1's default (logprobs_mode "raw_logprobs")
 * reports the model's own distribution, before bias, penalties, temperature
 * and filters; pass the raw logits for that.  Passing qsampler_process's
 * output gives the distribution after bias and penalties instead.
 *
 * Returns the number of entries written (1 + clamped top_n), or QERR_INVAL
 * (NULL pointers, n_vocab <= 0, no logit above -inf) or QERR_RANGE (chosen
 * outside the vocabulary, top_n outside [0, QSAMPLE_MAX_LOGPROBS]).
 * NaN logits count as -inf. */
int qsample_logprobs(const float *logits, int n_vocab, int chosen, int top_n, qlogprob *out, int *rank);

/* ---- the random stream ----------------------------------------------------- */

/* The generator behind the draws: splitmix64-seeded xoshiro256**. */
typedef struct { uint64_t s[4]; } qrng;
void qrng_seed(qrng *r, uint64_t seed);
uint64_t qrng_next(qrng *r);
/* Uniform in [0, 1) with 53 random bits. */
double qrng_uniform(qrng *r);

#endif
