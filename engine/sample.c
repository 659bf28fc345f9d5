/* sample.c - the sampler: logit processors, then one draw.
 *
 * A qsampler belongs to one sequence.  Each step (qsample_masked) runs
 *
 *   logits --copy--> w --mask--> w --bias--> w --penalties--> w
 *     --greedy?--> argmax(w)
 *     --else-----> softmax(w / T) --top-k--> --top-p--> --min-p--> draw
 *
 * in vLLM v1's order (allowed-token ids, logit bias, then repetition,
 * frequency and presence penalties; temperature after them).  top-p after
 * top-k measures the nucleus on the renormalised top-k distribution, as
 * vLLM's apply_top_k_top_p does.  The scratch vector s->prob holds w and
 * then, in place, the probabilities.
 *
 * Penalty state.  vLLM's penalties read two per-sequence facts: whether an id
 * occurred in the prompt or the output (repetition), and how often it occurred
 * in the output (frequency, presence).  These live in
 *
 *   count[id]      times id was accepted as output              (n_vocab ints)
 *   in_prompt      one bit per id seen in the prompt
 *   seen[0..n_seen) every id with count > 0 or its prompt bit, once each
 *
 * Invariant: id is in seen exactly when count[id] > 0 or its prompt bit is
 * set; so applying the penalties costs O(distinct tokens seen), not
 * O(n_vocab), and qsampler_reset clears only what seen names.  The arrays
 * exist only when some penalty is on; otherwise observing tokens only checks
 * their range.
 *
 * Determinism.  Greedy steps take no random numbers; every other step takes
 * exactly one uniform from s->rng.  Candidates are the ids of positive
 * probability in ascending order, sorted (probability descending, ties by
 * id) whenever a filter has reordered them, so a draw depends only on the
 * distribution and the stream.
 *
 * Robustness.  Nothing a request controls can crash here: parameters are
 * range-checked (qsample_check), bias ids are checked against the vocabulary
 * at creation, observed ids are range-checked, and degenerate logits (all
 * -inf, NaN, +inf) give a defined token rather than NaN arithmetic.
 */
#define _GNU_SOURCE
#include "sample.h"
#include "qerr.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PROPOSAL_SEED 0x64726166745f7171ULL /* "draft_qq" */

struct qsampler {
    qsample_params p;    /* p.logit_bias points at bias below */
    int n_vocab;
    qrng rng;
    qrng prng;           /* a draft model's proposals (qsample_propose): the draws keep their own stream */
    float *prob;         /* (n_vocab) processed logits, then probabilities */
    int *idx;            /* (n_vocab) candidate ids */
    qlogit_bias *bias;   /* (p.n_logit_bias) owned copy */
    int32_t *min_ids;    /* (p.n_min_ids) owned copy */
    int n_accepted;      /* tokens accepted since the start (min_tokens) */
    int penalize;        /* a penalty is on: the arrays below exist */
    int32_t *count;      /* (n_vocab) output occurrences */
    uint32_t *in_prompt; /* (QSAMPLE_MASK_WORDS(n_vocab)) prompt bits */
    int32_t *seen;       /* (n_vocab) ids with count > 0 or a prompt bit */
    int n_seen;
};

qsample_params qsample_defaults(void)
{
    qsample_params p = {
        .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0,
        .repetition_penalty = 1.0f, .frequency_penalty = 0.0f, .presence_penalty = 0.0f,
        .logprobs = 0, .top_logprobs = 0, .logit_bias = NULL, .n_logit_bias = 0,
    };
    return p;
}

/* ---- random stream --------------------------------------------------------- */

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void qrng_seed(qrng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        r->s[i] = z ^ (z >> 31);
    }
}

uint64_t qrng_next(qrng *r)
{
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double qrng_uniform(qrng *r) { return (double)(qrng_next(r) >> 11) * 0x1.0p-53; }

/* ---- parameters -------------------------------------------------------------- */

int qsample_check(const qsample_params *p, char *err, size_t errlen)
{
    if (!p) return qerr_set(err, errlen, QERR_INVAL, "no sampling parameters");
    if (!(p->temperature >= 0 && p->temperature <= 100))
        return qerr_set(err, errlen, QERR_RANGE, "temperature must be in [0, 100], got %g", (double)p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return qerr_set(err, errlen, QERR_RANGE, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return qerr_set(err, errlen, QERR_RANGE, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (p->top_k < -1)
        return qerr_set(err, errlen, QERR_RANGE, "top_k must be -1, 0 or positive, got %d", p->top_k);
    if (!(p->repetition_penalty > 0 && isfinite(p->repetition_penalty)))
        return qerr_set(err, errlen, QERR_RANGE, "repetition_penalty must be a finite number > 0 (1 is off), got %g",
                        (double)p->repetition_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return qerr_set(err, errlen, QERR_RANGE, "frequency_penalty must be in [-2, 2], got %g",
                        (double)p->frequency_penalty);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return qerr_set(err, errlen, QERR_RANGE, "presence_penalty must be in [-2, 2], got %g",
                        (double)p->presence_penalty);
    if (p->logprobs != 0 && p->logprobs != 1)
        return qerr_set(err, errlen, QERR_RANGE, "logprobs must be 0 (off) or 1 (on), got %d", p->logprobs);
    if (p->top_logprobs < 0 || p->top_logprobs > QSAMPLE_MAX_LOGPROBS)
        return qerr_set(err, errlen, QERR_RANGE, "top_logprobs must be in [0, %d], got %d", QSAMPLE_MAX_LOGPROBS,
                        p->top_logprobs);
    if (p->top_logprobs > 0 && !p->logprobs)
        return qerr_set(err, errlen, QERR_INVAL, "top_logprobs (%d) needs logprobs to be on", p->top_logprobs);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return qerr_set(err, errlen, QERR_INVAL, "logit_bias: %d entries but %s", p->n_logit_bias,
                        p->logit_bias ? "a negative count" : "no array");
    if (p->n_logit_bias > QSAMPLE_MAX_LOGIT_BIAS)
        return qerr_set(err, errlen, QERR_LIMIT, "logit_bias has %d entries, at most %d are allowed", p->n_logit_bias,
                        QSAMPLE_MAX_LOGIT_BIAS);
    for (int i = 0; i < p->n_logit_bias; i++) {
        const qlogit_bias *b = &p->logit_bias[i];
        if (b->id < 0)
            return qerr_set(err, errlen, QERR_RANGE, "logit_bias names token %d; token ids are >= 0", (int)b->id);
        if (!(b->bias >= -QSAMPLE_MAX_BIAS && b->bias <= QSAMPLE_MAX_BIAS))
            return qerr_set(err, errlen, QERR_RANGE, "logit_bias for token %d must be in [-100, 100], got %g",
                            (int)b->id, (double)b->bias);
        /* Quadratic, but over at most QSAMPLE_MAX_LOGIT_BIAS entries once per
         * request; it saves an allocation in a function that cannot fail
         * for want of memory. */
        for (int j = 0; j < i; j++)
            if (p->logit_bias[j].id == b->id)
                return qerr_set(err, errlen, QERR_INVAL, "logit_bias names token %d twice", (int)b->id);
    }
    if (p->min_tokens < 0) return qerr_set(err, errlen, QERR_RANGE, "min_tokens must be >= 0, got %d", p->min_tokens);
    if (p->n_min_ids < 0 || (p->n_min_ids > 0 && !p->min_ids))
        return qerr_set(err, errlen, QERR_INVAL, "min_tokens: %d banned ids but %s", p->n_min_ids,
                        p->min_ids ? "a negative count" : "no array");
    for (int i = 0; i < p->n_min_ids; i++)
        if (p->min_ids[i] < 0) return qerr_set(err, errlen, QERR_RANGE, "min_tokens bans token %d", p->min_ids[i]);
    return 0;
}

/* ---- lifetime ---------------------------------------------------------------- */

int qsampler_new(const qsample_params *p, int n_vocab, qsampler **out, char *err, size_t errlen)
{
    *out = NULL;
    if (n_vocab <= 0)
        return qerr_set(err, errlen, QERR_INVAL, "vocabulary size must be positive, got %d", n_vocab);
    int rc = qsample_check(p, err, errlen);
    if (rc) return rc;
    for (int i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].id >= n_vocab)
            return qerr_set(err, errlen, QERR_RANGE, "logit_bias names token %d, outside the vocabulary of %d tokens",
                            (int)p->logit_bias[i].id, n_vocab);
    for (int i = 0; i < p->n_min_ids; i++)
        if (p->min_ids[i] >= n_vocab)
            return qerr_set(err, errlen, QERR_RANGE, "min_tokens bans token %d, outside the vocabulary of %d tokens",
                            p->min_ids[i], n_vocab);

    qsampler *s = calloc(1, sizeof *s);
    if (!s) goto fail_nomem;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->prob = q_mallocn((size_t)n_vocab, sizeof(float));
    s->idx = q_mallocn((size_t)n_vocab, sizeof(int));
    if (!s->prob || !s->idx) goto fail_nomem;
    if (p->n_logit_bias > 0) {
        s->bias = q_mallocn((size_t)p->n_logit_bias, sizeof *s->bias);
        if (!s->bias) goto fail_nomem;
        memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->bias);
    }
    s->p.logit_bias = s->bias;
    if (p->n_min_ids > 0) {
        if (!(s->min_ids = q_mallocn((size_t)p->n_min_ids, sizeof *s->min_ids))) goto fail_nomem;
        memcpy(s->min_ids, p->min_ids, (size_t)p->n_min_ids * sizeof *s->min_ids);
    }
    s->p.min_ids = s->min_ids;
    s->penalize = p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    if (s->penalize) {
        s->count = q_callocn((size_t)n_vocab, sizeof *s->count);
        s->in_prompt = q_callocn(QSAMPLE_MASK_WORDS(n_vocab), sizeof *s->in_prompt);
        s->seen = q_mallocn((size_t)n_vocab, sizeof *s->seen);
        if (!s->count || !s->in_prompt || !s->seen) goto fail_nomem;
    }
    qrng_seed(&s->rng, p->seed);
    qrng_seed(&s->prng, p->seed ^ PROPOSAL_SEED);
    *out = s;
    return 0;

fail_nomem:
    qsampler_destroy(s);
    return qerr_set(err, errlen, QERR_NOMEM, "out of memory for a sampler over %d tokens", n_vocab);
}

qsampler *qsampler_create(const qsample_params *p, int n_vocab)
{
    qsampler *s;
    return qsampler_new(p, n_vocab, &s, NULL, 0) ? NULL : s;
}

void qsampler_destroy(qsampler *s)
{
    if (!s) return;
    free(s->prob);
    free(s->idx);
    free(s->bias);
    free(s->min_ids);
    free(s->count);
    free(s->in_prompt);
    free(s->seen);
    free(s);
}

void qsampler_reset(qsampler *s)
{
    for (int i = 0; i < s->n_seen; i++) {
        int32_t id = s->seen[i];
        s->count[id] = 0;
        s->in_prompt[id >> 5] = 0;
    }
    s->n_seen = 0;
    s->n_accepted = 0;
    qrng_seed(&s->rng, s->p.seed);
    qrng_seed(&s->prng, s->p.seed ^ PROPOSAL_SEED);
}

/* ---- observed tokens ----------------------------------------------------------- */

static inline int prompt_has(const qsampler *s, int32_t id) { return (s->in_prompt[id >> 5] >> (id & 31)) & 1u; }

int qsampler_observe_prompt(qsampler *s, const int32_t *ids, int n)
{
    if (n < 0 || (n > 0 && !ids)) return QERR_INVAL;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->n_vocab) return QERR_RANGE;
    if (!s->penalize) return 0;
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (prompt_has(s, id)) continue;
        if (s->count[id] == 0) s->seen[s->n_seen++] = id;
        s->in_prompt[id >> 5] |= 1u << (id & 31);
    }
    return 0;
}

int qsampler_accept(qsampler *s, int32_t id)
{
    if (id < 0 || id >= s->n_vocab) return QERR_RANGE;
    if (s->n_accepted < INT32_MAX) s->n_accepted++;
    if (!s->penalize) return 0;
    if (s->count[id] == 0 && !prompt_has(s, id)) s->seen[s->n_seen++] = id;
    if (s->count[id] < INT32_MAX) s->count[id]++;
    return 0;
}

/* ---- logit processors ------------------------------------------------------------ */

static inline int allowed_id(const uint32_t *allowed, int id) { return (allowed[id >> 5] >> (id & 31)) & 1u; }

int qsampler_process(qsampler *s, const float *logits, const uint32_t *allowed, float *out)
{
    const int V = s->n_vocab;
    int n_allowed = V;
    if (out != logits) memcpy(out, logits, (size_t)V * sizeof *out);
    if (allowed) {
        n_allowed = 0;
        for (int i = 0; i < V; i++) {
            if (allowed_id(allowed, i)) n_allowed++;
            else out[i] = -INFINITY;
        }
    }
    for (int i = 0; i < s->p.n_logit_bias; i++) out[s->bias[i].id] += s->bias[i].bias;
    if (s->n_accepted < s->p.min_tokens)
        for (int i = 0; i < s->p.n_min_ids; i++) out[s->min_ids[i]] = -INFINITY;
    if (s->penalize) {
        /* vLLM's apply_penalties: repetition on prompt | output tokens,
         * then frequency * count and presence * (count > 0) subtracted. */
        const float rep = s->p.repetition_penalty, fp = s->p.frequency_penalty, pp = s->p.presence_penalty;
        for (int i = 0; i < s->n_seen; i++) {
            int32_t id = s->seen[i];
            float l = out[id];
            if (rep != 1.0f) l = l > 0 ? l / rep : l * rep;
            int32_t c = s->count[id];
            if (c > 0) {
                l -= fp * (float)c;
                l -= pp;
            }
            out[id] = l;
        }
    }
    return n_allowed;
}

/* ---- drawing ---------------------------------------------------------------------- */

/* min_tokens' ban is in force. */
static int banning(const qsampler *s) { return s->p.n_min_ids > 0 && s->n_accepted < s->p.min_tokens; }

int qsampler_is_greedy(const qsampler *s)
{
    return (s->p.temperature <= 0 || s->p.top_k == 1) && !s->penalize && s->p.n_logit_bias == 0 && !banning(s);
}

int qsampler_row_params(const qsampler *s, float *temperature, int *top_k, float *top_p, float *min_p)
{
    const qsample_params *p = &s->p;
    if (!(p->temperature > 0) || p->top_k == 1 || s->penalize || p->n_logit_bias || banning(s)) return 0;
    *temperature = p->temperature;
    *top_k = p->top_k > 0 ? p->top_k : 0;
    *top_p = p->top_p;
    *min_p = p->min_p;
    return 1;
}

double qsampler_take_uniform(qsampler *s) { return qrng_uniform(&s->rng); }

int qsample_argmax(const float *logits, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (isnan(logits[i])) continue;
        if (best < 0 || logits[i] > logits[best]) best = i;
    }
    return best < 0 ? 0 : best;
}

/* Orders ids by prob descending, ties by id ascending (deterministic). */
static int cmp_desc(const void *a, const void *b, void *arg)
{
    const float *prob = arg;
    int x = *(const int *)a, y = *(const int *)b;
    float px = prob[x], py = prob[y];
    if (px > py) return -1;
    if (px < py) return 1;
    return (x > y) - (x < y);
}

/* Moves the k most probable of idx[0..n) to the front (unordered). */
/* a comes before b: more probable, or as probable and a lower id.  A total
 * order, so which ids make the top k is defined even among equal
 * probabilities (a GPU can reproduce it). */
static inline int before(const float *prob, int a, int b) { return prob[a] > prob[b] || (prob[a] == prob[b] && a < b); }

static void select_top(int *idx, int n, int k, const float *prob)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int pivot = idx[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (before(prob, idx[i], pivot)) i++;
            while (before(prob, pivot, idx[j])) j--;
            if (i <= j) {
                int t = idx[i];
                idx[i] = idx[j];
                idx[j] = t;
                i++;
                j--;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* The most probable of idx[0..n) (lowest id on ties). */
static int best_of(const int *idx, int n, const float *prob)
{
    int best = idx[0];
    for (int i = 1; i < n; i++)
        if (prob[idx[i]] > prob[best] || (prob[idx[i]] == prob[best] && idx[i] < best)) best = idx[i];
    return best;
}

/* The candidates of a draw on processed logits (s->prob): their ids in
 * s->idx[0..*n) (in a defined order), their probabilities in s->prob (not
 * renormalised after the filters).  Returns -1, or the id itself when the
 * draw needs no randomness (greedy; no finite logit). */
static int candidates(qsampler *s, const uint32_t *allowed, int *n_out)
{
    const int V = s->n_vocab;
    const qsample_params *p = &s->p;
    float *prob = s->prob;
    int top = qsample_argmax(prob, V);
    float mx = prob[top];
    /* Masked ids are -inf, so a finite maximum is always an allowed id. */
    if (!(mx > -INFINITY)) {
        for (int i = 0; i < V; i++)
            if (!allowed || allowed_id(allowed, i)) return i;
        return 0;
    }
    if (p->temperature <= 0 || p->top_k == 1) return top;

    /* Softmax of w / T; candidates are the ids of positive probability.  An
     * +inf logit takes all the mass (shared among equals), NaN none. */
    double sum = 0;
    if (mx == INFINITY) {
        for (int i = 0; i < V; i++) prob[i] = prob[i] == INFINITY ? 1.0f : 0.0f;
    } else {
        for (int i = 0; i < V; i++) prob[i] = isnan(prob[i]) ? 0.0f : expf((prob[i] - mx) / p->temperature);
    }
    for (int i = 0; i < V; i++) sum += prob[i];
    int n = 0;
    for (int i = 0; i < V; i++) {
        prob[i] = (float)(prob[i] / sum);
        if (prob[i] > 0) s->idx[n++] = i;
    }
    if (n == 0) return top; /* cannot happen: the maximum has probability >= 1 / V */

    int sorted = 0, top_k_cut = 0;
    if (p->top_k > 0 && p->top_k < n) {
        select_top(s->idx, n, p->top_k, prob);
        n = p->top_k;
        top_k_cut = 1;
    }
    if (p->top_p < 1.0f) {
        /* After top-k the nucleus is taken on the renormalised distribution,
         * as vLLM's apply_top_k_top_p does: top_p is scaled by the mass
         * top-k kept.  Tokens below (mass - top_p * mass) / (n - 1) can never
         * be inside the nucleus unless they are its only (most probable)
         * member; dropping them first keeps the sort short. */
        double kept = 1.0;
        if (top_k_cut) {
            kept = 0;
            for (int i = 0; i < n; i++) kept += prob[s->idx[i]];
        }
        double target = top_k_cut ? p->top_p * kept : p->top_p;
        float cut = top_k_cut ? (float)((kept - target) / (n > 1 ? n - 1 : 1))
                              : (1.0f - p->top_p) / (float)(n > 1 ? n - 1 : 1);
        int m = 0;
        for (int i = 0; i < n; i++)
            if (prob[s->idx[i]] >= cut) s->idx[m++] = s->idx[i];
        if (m == 0) {
            /* Everything fell below the cut: the nucleus is the best token. */
            s->idx[0] = best_of(s->idx, n, prob);
            m = 1;
        }
        n = m;
        qsort_r(s->idx, (size_t)n, sizeof(int), cmp_desc, prob);
        sorted = 1;
        double c = 0;
        for (int i = 0; i < n; i++) {
            c += prob[s->idx[i]];
            if (c >= target) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        float best = 0;
        for (int i = 0; i < n; i++)
            if (prob[s->idx[i]] > best) best = prob[s->idx[i]];
        float cut = p->min_p * best;
        int m = 0;
        for (int i = 0; i < n; i++)
            if (prob[s->idx[i]] >= cut) s->idx[m++] = s->idx[i];
        n = m;
    }
    if (!sorted && top_k_cut) {
        /* Quickselect left the top k in no defined order; fix one so that a
         * draw depends on the distribution only. */
        qsort_r(s->idx, (size_t)n, sizeof(int), cmp_desc, prob);
    }
    *n_out = n;
    return -1;
}

/* The candidate at mass fraction u of candidates idx[0..n). */
static int pick(const qsampler *s, int n, double u)
{
    double mass = 0;
    for (int i = 0; i < n; i++) mass += s->prob[s->idx[i]];
    double r = u * mass, c = 0;
    for (int i = 0; i < n; i++) {
        c += s->prob[s->idx[i]];
        if (r < c) return s->idx[i];
    }
    return s->idx[n - 1];
}

/* The draw proper, on processed logits (s->prob); returns the id.  u: the
 * uniform number to use, or NULL to take the next from s's stream. */
static int draw(qsampler *s, const uint32_t *allowed, const double *u)
{
    int n;
    const int id = candidates(s, allowed, &n);
    if (id >= 0) return id;
    return pick(s, n, u ? *u : qrng_uniform(&s->rng));
}

int qsample_verify(qsampler *s, const float *logits, const uint32_t *allowed, int draft, int *accepted)
{
    return qsample_verify_q(s, logits, allowed, NULL, draft, accepted);
}

int qsample_verify_q(qsampler *s, const float *logits, const uint32_t *allowed, const float *q, int draft, int *accepted)
{
    *accepted = 0;
    if (qsampler_process(s, logits, allowed, s->prob) == 0) return QERR_INVAL;
    int n;
    const int id = candidates(s, allowed, &n);
    if (id >= 0) { /* no randomness: the draft is the token or not */
        *accepted = id == draft;
        return id;
    }
    /* Rejection sampling (Leviathan et al., Chen et al.): take the draft
     * with probability min(1, p(draft) / q(draft)); else draw from the
     * residual max(0, p - q), renormalised.  Either way the token is
     * distributed as p.  A proposal certain of its token (q NULL: q = 1 on
     * draft) takes it with probability p(draft), else draws from p without
     * it. */
    double mass = 0, pd = 0;
    int at = -1;
    for (int i = 0; i < n; i++) {
        mass += s->prob[s->idx[i]];
        if (s->idx[i] == draft) at = i, pd = s->prob[draft];
    }
    const double qd = q ? (draft >= 0 && draft < s->n_vocab ? q[draft] : 0) : 1;
    if (at >= 0 && qd > 0 && qrng_uniform(&s->rng) * mass * qd < pd) {
        *accepted = 1;
        return draft;
    }
    if (!q) {
        if (at >= 0) {
            if (n == 1) return draft; /* p(draft) = 1: cannot be refused (rounding) */
            memmove(s->idx + at, s->idx + at + 1, sizeof *s->idx * (size_t)(n - at - 1));
            n--;
        }
        return pick(s, n, qrng_uniform(&s->rng));
    }
    /* The residual, over the candidates (p is 0 elsewhere). */
    double total = 0;
    for (int i = 0; i < n; i++) {
        const double r = s->prob[s->idx[i]] / mass - q[s->idx[i]];
        if (r > 0) total += r;
    }
    if (!(total > 0)) return pick(s, n, qrng_uniform(&s->rng)); /* p = q: any draw from p */
    const double u = qrng_uniform(&s->rng) * total;
    double c = 0;
    int last = s->idx[0];
    for (int i = 0; i < n; i++) {
        const double r = s->prob[s->idx[i]] / mass - q[s->idx[i]];
        if (r <= 0) continue;
        c += r, last = s->idx[i];
        if (u < c) return s->idx[i];
    }
    return last;
}

int qsample_propose(qsampler *s, const float *logits, const uint32_t *allowed, float *q)
{
    if (qsampler_process(s, logits, allowed, s->prob) == 0) return QERR_INVAL;
    int n;
    const int id = candidates(s, allowed, &n);
    if (q) memset(q, 0, sizeof *q * (size_t)s->n_vocab);
    if (id >= 0) {
        if (q) q[id] = 1;
        return id;
    }
    if (q) {
        double mass = 0;
        for (int i = 0; i < n; i++) mass += s->prob[s->idx[i]];
        for (int i = 0; i < n; i++) q[s->idx[i]] = (float)(s->prob[s->idx[i]] / mass);
    }
    return pick(s, n, qrng_uniform(&s->prng));
}

int qsample_masked(qsampler *s, const float *logits, const uint32_t *allowed)
{
    if (qsampler_process(s, logits, allowed, s->prob) == 0) return QERR_INVAL;
    return draw(s, allowed, NULL);
}

int qsample(qsampler *s, const float *logits) { return qsample_masked(s, logits, NULL); }

int qsample_with_uniform(qsampler *s, const float *logits, double u)
{
    qsampler_process(s, logits, NULL, s->prob);
    return draw(s, NULL, &u);
}

/* ---- log-probabilities ------------------------------------------------------------- */

/* NaN sorts as -inf. */
static inline float clean(float x) { return isnan(x) ? -INFINITY : x; }

int qsample_logprobs(const float *logits, int n_vocab, int chosen, int top_n, qlogprob *out, int *rank)
{
    if (!logits || !out || n_vocab <= 0) return QERR_INVAL;
    if (chosen < 0 || chosen >= n_vocab || top_n < 0 || top_n > QSAMPLE_MAX_LOGPROBS) return QERR_RANGE;
    if (top_n > n_vocab) top_n = n_vocab;

    float mx = -INFINITY;
    for (int i = 0; i < n_vocab; i++)
        if (clean(logits[i]) > mx) mx = clean(logits[i]);
    if (mx == -INFINITY) return QERR_INVAL;

    /* log_softmax(l) = l - (mx + log(sum exp(l - mx))), summed in double.
     * With +inf logits the +inf ones share the mass equally. */
    double lse;
    int n_inf = 0;
    if (mx == INFINITY) {
        for (int i = 0; i < n_vocab; i++) n_inf += logits[i] == INFINITY;
        lse = log((double)n_inf);
    } else {
        double sum = 0;
        for (int i = 0; i < n_vocab; i++) sum += exp((double)clean(logits[i]) - (double)mx);
        lse = (double)mx + log(sum);
    }
#define LOGPROB_(l) (n_inf ? ((l) == INFINITY ? (float)-lse : -INFINITY) : (float)((double)clean(l) - lse))

    /* Top n by an insertion list: scanning ids upwards and inserting after
     * equal values keeps ties in id order. */
    qlogprob *top = out + 1;
    int k = 0;
    for (int i = 0; i < n_vocab && top_n > 0; i++) {
        float l = clean(logits[i]);
        if (k == top_n && !(l > clean(logits[top[k - 1].id]))) continue;
        int j = k < top_n ? k++ : k - 1;
        while (j > 0 && clean(logits[top[j - 1].id]) < l) {
            top[j] = top[j - 1];
            j--;
        }
        top[j].id = i;
    }
    for (int i = 0; i < k; i++) top[i].logprob = LOGPROB_(logits[top[i].id]);
    out[0].id = chosen;
    out[0].logprob = LOGPROB_(logits[chosen]);
    if (rank) {
        float lc = clean(logits[chosen]);
        int r = 0;
        for (int i = 0; i < n_vocab; i++) r += clean(logits[i]) >= lc;
        *rank = r;
    }
#undef LOGPROB_
    return 1 + k;
}
