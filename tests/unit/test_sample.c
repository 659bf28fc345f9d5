/* test_sample.c - greedy, temperature, top-k, top-p, min-p, seeds; penalties,
 * logit bias, allowed-token masks, logprobs, degenerate logits, errors. */
#include <math.h>
#include <stdint.h>

#include "qerr.h"
#include "sample.h"
#include "qtest.h"

#define V 16

/* logits whose softmax is p (up to a constant). */
static void from_probs(const double *p, float *l)
{
    for (int i = 0; i < V; i++) l[i] = p[i] > 0 ? (float)log(p[i]) : -INFINITY;
}

static void histogram(qsample_params sp, const float *l, int draws, int *hist)
{
    qsampler *s = qsampler_create(&sp, V);
    memset(hist, 0, sizeof(int) * V);
    for (int i = 0; i < draws; i++) hist[qsample(s, l)]++;
    qsampler_destroy(s);
}

static void test_greedy(void)
{
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(i % 5);
    CHECK_EQ_INT(qsample_argmax(l, V), 4); /* first of the maxima */
    qsample_params sp = qsample_defaults();
    sp.temperature = 0;
    qsampler *s = qsampler_create(&sp, V);
    REQUIRE(s);
    CHECK_EQ_INT(qsample(s, l), 4);
    qsampler_destroy(s);
    /* top_k = 1 equals greedy at any temperature. */
    sp.temperature = 5;
    sp.top_k = 1;
    s = qsampler_create(&sp, V);
    for (int i = 0; i < 50; i++) CHECK_EQ_INT(qsample(s, l), 4);
    qsampler_destroy(s);
}

static void test_seed_determinism(void)
{
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)sin(i);
    qsample_params sp = qsample_defaults();
    sp.seed = 42;
    int a[200], b[200], c[200];
    qsampler *s1 = qsampler_create(&sp, V), *s2 = qsampler_create(&sp, V);
    sp.seed = 43;
    qsampler *s3 = qsampler_create(&sp, V);
    for (int i = 0; i < 200; i++) a[i] = qsample(s1, l), b[i] = qsample(s2, l), c[i] = qsample(s3, l);
    CHECK(!memcmp(a, b, sizeof a));
    CHECK(memcmp(a, c, sizeof a) != 0);
    qsampler_destroy(s1);
    qsampler_destroy(s2);
    qsampler_destroy(s3);
}

static void test_distribution(void)
{
    double p[V] = { 0.4, 0.3, 0.2, 0.1 };
    float l[V];
    from_probs(p, l);
    int h[V];
    qsample_params sp = qsample_defaults();
    sp.seed = 7;
    const int N = 40000;
    histogram(sp, l, N, h);
    for (int i = 0; i < 4; i++) CHECK(fabs((double)h[i] / N - p[i]) < 0.015);
    for (int i = 4; i < V; i++) CHECK_EQ_INT(h[i], 0);

    /* Temperature 0.5 squares the odds: p ~ (16, 9, 4, 1) / 30. */
    sp.temperature = 0.5f;
    histogram(sp, l, N, h);
    double q[4] = { 16 / 30.0, 9 / 30.0, 4 / 30.0, 1 / 30.0 };
    for (int i = 0; i < 4; i++) CHECK(fabs((double)h[i] / N - q[i]) < 0.015);
}

static void test_filters(void)
{
    double p[V] = { 0.05, 0.4, 0.3, 0.15, 0.1 };
    float l[V];
    from_probs(p, l);
    int h[V];
    qsample_params sp = qsample_defaults();
    const int N = 20000;

    sp.top_k = 2; /* only ids 1 and 2, renormalised: 4/7, 3/7 */
    histogram(sp, l, N, h);
    CHECK_EQ_INT(h[0] + h[3] + h[4], 0);
    CHECK(fabs((double)h[1] / N - 4 / 7.0) < 0.02);

    sp.top_k = 0;
    sp.top_p = 0.8f; /* 0.4 + 0.3 = 0.7 < 0.8, + 0.15 = 0.85: ids 1, 2, 3 */
    histogram(sp, l, N, h);
    CHECK(h[1] > 0 && h[2] > 0 && h[3] > 0);
    CHECK_EQ_INT(h[0] + h[4], 0);

    sp.top_p = 1.0f;
    sp.min_p = 0.5f; /* keep p >= 0.2: ids 1, 2 */
    histogram(sp, l, N, h);
    CHECK(h[1] > 0 && h[2] > 0);
    CHECK_EQ_INT(h[0] + h[3] + h[4], 0);

    sp.min_p = 0;
    sp.top_p = 0.01f; /* only the best token */
    histogram(sp, l, 100, h);
    CHECK_EQ_INT(h[1], 100);
}

/* top-p after top-k works on the renormalised top-k distribution (vLLM's
 * apply_top_k_top_p), not on the original probabilities. */
static void test_top_k_then_top_p(void)
{
    double p[V] = { 0.05, 0.4, 0.3, 0.15, 0.1 };
    float l[V];
    from_probs(p, l);
    int h[V];
    qsample_params sp = qsample_defaults();
    sp.top_k = 2; /* ids 1 and 2, renormalised: 4/7 = 0.571, 3/7 */
    sp.top_p = 0.5f; /* 0.571 >= 0.5: id 1 alone (unrenormalised, 0.4 < 0.5 would keep id 2) */
    histogram(sp, l, 2000, h);
    CHECK_EQ_INT(h[1], 2000);
    sp.top_p = 0.6f; /* 0.571 < 0.6: both */
    histogram(sp, l, 20000, h);
    CHECK(fabs((double)h[1] / 20000 - 4 / 7.0) < 0.02);
    CHECK_EQ_INT(h[1] + h[2], 20000);
    /* Top-k over a flat tail: five near-equal tokens among many; top_p 0.9
     * keeps all five (each 0.2 after renormalisation), so the draws vary. */
    enum { N = 200 };
    float flat[N];
    for (int i = 0; i < N; i++) flat[i] = i < 5 ? 1.0f + 0.001f * (float)i : 0.9f;
    sp.top_k = 5;
    sp.top_p = 0.9f;
    sp.seed = 5;
    qsampler *s = qsampler_create(&sp, N);
    REQUIRE(s);
    int seen[5] = { 0 };
    for (int i = 0; i < 2000; i++) {
        int t = qsample(s, flat);
        REQUIRE(t >= 0 && t < 5);
        seen[t]++;
    }
    for (int i = 0; i < 5; i++) CHECK(seen[i] > 250);
    qsampler_destroy(s);
}

static void test_param_errors(void)
{
    char err[128];
    qsample_params sp = qsample_defaults();
    CHECK(qsample_check(&sp, err, sizeof err) == 0);
    sp.temperature = -1;
    CHECK(qsample_check(&sp, err, sizeof err) == QERR_RANGE);
    CHECK_STR_CONTAINS(err, "temperature");
    CHECK(qsampler_create(&sp, V) == NULL);
    sp = qsample_defaults();
    sp.top_p = 0;
    CHECK(qsample_check(&sp, err, sizeof err) == QERR_RANGE);
    CHECK_STR_CONTAINS(err, "top_p");
    sp = qsample_defaults();
    sp.min_p = 1.5f;
    CHECK(qsample_check(&sp, err, sizeof err) == QERR_RANGE);
    sp = qsample_defaults();
    sp.top_k = -5;
    CHECK(qsample_check(&sp, err, sizeof err) == QERR_RANGE);
    sp = qsample_defaults();
    sp.temperature = NAN;
    CHECK(qsample_check(&sp, err, sizeof err) == QERR_RANGE);
    CHECK(qsampler_create(&sp, 0) == NULL);
    qsampler_destroy(NULL);
}

static qsampler *make(qsample_params sp, int n_vocab)
{
    qsampler *s = NULL;
    char err[160];
    int rc = qsampler_new(&sp, n_vocab, &s, err, sizeof err);
    if (rc) fprintf(stderr, "  qsampler_new: %s\n", err);
    return s;
}

/* The worked example of the penalties: every number below is exact in
 * binary floating point, so the comparisons are exact. */
static void test_penalties_exact(void)
{
    const float l[6] = { 2.0f, -1.0f, 0.5f, 3.0f, 0.0f, -2.0f };
    qsample_params sp = qsample_defaults();
    sp.repetition_penalty = 2.0f;
    sp.frequency_penalty = 0.5f;
    sp.presence_penalty = 0.25f;
    qsampler *s = make(sp, 6);
    REQUIRE(s);
    const int32_t prompt[2] = { 0, 1 };
    CHECK_EQ_INT(qsampler_observe_prompt(s, prompt, 2), 0);
    const int32_t gen[4] = { 3, 3, 1, 4 };
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(qsampler_accept(s, gen[i]), 0);
    float w[6];
    CHECK_EQ_INT(qsampler_process(s, l, NULL, w), 6);
    /* id 0: prompt only, positive:  2 / 2                      =  1
     * id 1: prompt + output x1, negative: -1 * 2 - 0.5*1 - 0.25 = -2.75
     * id 2: never seen                                          =  0.5
     * id 3: output x2, positive: 3 / 2 - 0.5*2 - 0.25           =  0.25
     * id 4: output x1, zero (not > 0, so * 2 = 0) - 0.5 - 0.25  = -0.75
     * id 5: never seen                                          = -2 */
    const float want[6] = { 1.0f, -2.75f, 0.5f, 0.25f, -0.75f, -2.0f };
    for (int i = 0; i < 6; i++) CHECK(w[i] == want[i]);
    qsampler_destroy(s);

    /* Greedy follows the processed logits: 3 without penalties, 0 with. */
    sp.temperature = 0;
    s = make(sp, 6);
    REQUIRE(s);
    CHECK_EQ_INT(qsample(s, l), 3);
    qsampler_observe_prompt(s, prompt, 2);
    for (int i = 0; i < 4; i++) qsampler_accept(s, gen[i]);
    CHECK_EQ_INT(qsample(s, l), 0);
    /* Reset forgets the tokens. */
    qsampler_reset(s);
    CHECK_EQ_INT(qsample(s, l), 3);
    CHECK_EQ_INT(qsampler_process(s, l, NULL, w), 6);
    for (int i = 0; i < 6; i++) CHECK(w[i] == l[i]);
    qsampler_destroy(s);
}

static void test_repetition_sign(void)
{
    const float l[4] = { 3.0f, -3.0f, 0.0f, 1.0f };
    const int32_t prompt[3] = { 0, 1, 2 };
    float w[4];
    qsample_params sp = qsample_defaults();
    /* > 1 discourages: positive logits shrink, negative ones grow away from 0:
     * 3 / 1.5 = 2, -3 * 1.5 = -4.5, 0 stays 0, id 3 unseen stays 1. */
    sp.repetition_penalty = 1.5f;
    qsampler *s = make(sp, 4);
    REQUIRE(s);
    qsampler_observe_prompt(s, prompt, 3);
    qsampler_process(s, l, NULL, w);
    CHECK(w[0] == 2.0f && w[1] == -4.5f && w[2] == 0.0f && w[3] == 1.0f);
    /* Observing a token twice (prompt and output) penalises it once. */
    qsampler_accept(s, 0);
    qsampler_accept(s, 0);
    qsampler_process(s, l, NULL, w);
    CHECK(w[0] == 2.0f);
    qsampler_destroy(s);
    /* < 1 encourages: 3 / 0.5 = 6, -3 * 0.5 = -1.5. */
    sp.repetition_penalty = 0.5f;
    s = make(sp, 4);
    REQUIRE(s);
    qsampler_observe_prompt(s, prompt, 3);
    qsampler_process(s, l, NULL, w);
    CHECK(w[0] == 6.0f && w[1] == -1.5f && w[2] == 0.0f && w[3] == 1.0f);
    qsampler_destroy(s);
}

static void test_frequency_counts(void)
{
    float zero[V] = { 0 }, w[V];
    qsample_params sp = qsample_defaults();
    sp.frequency_penalty = 0.5f;
    qsampler *s = make(sp, V);
    REQUIRE(s);
    /* Prompt tokens do not count for frequency or presence (OpenAI, vLLM). */
    const int32_t prompt[2] = { 7, 7 };
    qsampler_observe_prompt(s, prompt, 2);
    for (int i = 0; i < 3; i++) qsampler_accept(s, 2);
    qsampler_accept(s, 5);
    qsampler_process(s, zero, NULL, w);
    /* id 2: 0 - 0.5 * 3 = -1.5; id 5: 0 - 0.5 * 1 = -0.5; the rest 0. */
    for (int i = 0; i < V; i++) CHECK(w[i] == (i == 2 ? -1.5f : i == 5 ? -0.5f : 0.0f));
    qsampler_accept(s, 2);
    qsampler_process(s, zero, NULL, w);
    CHECK(w[2] == -2.0f);
    qsampler_destroy(s);

    /* Presence counts once; negative penalties encourage repetition:
     * id 2 (x3): 0 - (-1 * 3) - (-0.5) = 3.5; id 5 (x1): 0 + 1 + 0.5 = 1.5. */
    sp.frequency_penalty = -1.0f;
    sp.presence_penalty = -0.5f;
    s = make(sp, V);
    REQUIRE(s);
    for (int i = 0; i < 3; i++) qsampler_accept(s, 2);
    qsampler_accept(s, 5);
    qsampler_process(s, zero, NULL, w);
    for (int i = 0; i < V; i++) CHECK(w[i] == (i == 2 ? 3.5f : i == 5 ? 1.5f : 0.0f));
    qsampler_destroy(s);

    /* Greedy with a frequency penalty of 1 over equal logits cycles:
     * 0, 1, 2, 3 (each one step behind the next), then 0 again. */
    sp = qsample_defaults();
    sp.temperature = 0;
    sp.frequency_penalty = 1.0f;
    s = make(sp, 4);
    REQUIRE(s);
    float four[4] = { 0 };
    const int want[9] = { 0, 1, 2, 3, 0, 1, 2, 3, 0 };
    for (int i = 0; i < 9; i++) {
        int t = qsample(s, four);
        CHECK_EQ_INT(t, want[i]);
        qsampler_accept(s, t);
    }
    qsampler_destroy(s);
}

/* log_softmax computed the plain way, in double. */
static void ref_log_softmax(const float *l, int n, double *out)
{
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) if (l[i] > mx) mx = l[i];
    for (int i = 0; i < n; i++) sum += exp(l[i] - mx);
    for (int i = 0; i < n; i++) out[i] = l[i] - mx - log(sum);
}

static void test_logprobs(void)
{
    float l[V];
    double ref[V];
    for (int i = 0; i < V; i++) l[i] = (float)(3 * sin(i * 1.7));
    ref_log_softmax(l, V, ref);
    qlogprob out[1 + QSAMPLE_MAX_LOGPROBS];
    int rank = 0;
    CHECK_EQ_INT(qsample_logprobs(l, V, 9, 5, out, &rank), 6);
    CHECK_EQ_INT(out[0].id, 9);
    CHECK(fabs(out[0].logprob - ref[9]) < 1e-6);
    int greater = 0;
    for (int i = 0; i < V; i++) greater += ref[i] >= ref[9];
    CHECK_EQ_INT(rank, greater);
    for (int k = 1; k <= 5; k++) {
        CHECK(fabs(out[k].logprob - ref[out[k].id]) < 1e-6);
        if (k > 1) CHECK(out[k].logprob <= out[k - 1].logprob);
    }
    /* out[1] is the argmax, and nothing outside the top 5 beats out[5]. */
    CHECK_EQ_INT(out[1].id, qsample_argmax(l, V));
    for (int i = 0; i < V; i++) {
        int listed = 0;
        for (int k = 1; k <= 5; k++) listed |= out[k].id == i;
        if (!listed) CHECK(ref[i] <= out[5].logprob + 1e-7);
    }
    /* All of them: the probabilities sum to 1. */
    CHECK_EQ_INT(qsample_logprobs(l, V, 0, QSAMPLE_MAX_LOGPROBS, out, NULL), 1 + V);
    double sum = 0;
    for (int k = 1; k <= V; k++) sum += exp(out[k].logprob);
    CHECK(fabs(sum - 1) < 1e-5);

    /* Ties by id: values 3 at ids 1, 2, 5; 2 at id 4; -inf and NaN at 6, 7. */
    float t[8] = { 1, 3, 3, 0, 2, 3, -INFINITY, NAN };
    CHECK_EQ_INT(qsample_logprobs(t, 8, 4, 4, out, &rank), 5);
    CHECK(out[1].id == 1 && out[2].id == 2 && out[3].id == 5 && out[4].id == 4);
    CHECK(out[1].logprob == out[2].logprob && out[2].logprob == out[3].logprob);
    CHECK_EQ_INT(rank, 4); /* ids 1, 2, 5 and 4 itself are >= */
    /* log(e^3 / (3e^3 + e^2 + e + 1)) by hand: */
    double z = 3 * exp(3.0) + exp(2.0) + exp(1.0) + 1;
    CHECK(fabs(out[1].logprob - (3 - log(z))) < 1e-6);
    CHECK_EQ_INT(qsample_logprobs(t, 8, 6, 0, out, &rank), 1);
    CHECK(out[0].logprob == -INFINITY);
    CHECK_EQ_INT(rank, 8);
    CHECK_EQ_INT(qsample_logprobs(t, 8, 7, 0, out, NULL), 1);
    CHECK(out[0].logprob == -INFINITY); /* NaN counts as -inf */
    /* top_n above the vocabulary is clamped. */
    CHECK_EQ_INT(qsample_logprobs(t, 3, 0, 20, out, NULL), 4);
    CHECK(out[1].id == 1 && out[2].id == 2 && out[3].id == 0);

    /* Raw logits, not the processed ones: a bias changes the draw, not the
     * reported distribution (vLLM's raw_logprobs). */
    qsample_params sp = qsample_defaults();
    qlogit_bias b = { 0, 50.0f };
    sp.logit_bias = &b;
    sp.n_logit_bias = 1;
    sp.temperature = 0;
    qsampler *s = make(sp, V);
    REQUIRE(s);
    int tok = qsample(s, l);
    CHECK_EQ_INT(tok, 0);
    qsample_logprobs(l, V, tok, 0, out, NULL);
    CHECK(fabs(out[0].logprob - ref[0]) < 1e-6);
    qsampler_destroy(s);

    /* Errors. */
    CHECK_EQ_INT(qsample_logprobs(l, V, -1, 0, out, NULL), QERR_RANGE);
    CHECK_EQ_INT(qsample_logprobs(l, V, V, 0, out, NULL), QERR_RANGE);
    CHECK_EQ_INT(qsample_logprobs(l, V, 0, 21, out, NULL), QERR_RANGE);
    CHECK_EQ_INT(qsample_logprobs(l, V, 0, -1, out, NULL), QERR_RANGE);
    CHECK_EQ_INT(qsample_logprobs(NULL, V, 0, 0, out, NULL), QERR_INVAL);
    CHECK_EQ_INT(qsample_logprobs(l, 0, 0, 0, out, NULL), QERR_INVAL);
    float dead[3] = { -INFINITY, NAN, -INFINITY };
    CHECK_EQ_INT(qsample_logprobs(dead, 3, 0, 1, out, NULL), QERR_INVAL);
    /* +inf takes all the mass. */
    float inf[3] = { 1, INFINITY, INFINITY };
    CHECK_EQ_INT(qsample_logprobs(inf, 3, 1, 2, out, NULL), 3);
    CHECK(fabs(out[0].logprob - (float)-log(2.0)) < 1e-6);
    CHECK(out[1].id == 1 && out[2].id == 2);
}

static void test_logit_bias(void)
{
    double p[V] = { 0.4, 0.3, 0.2, 0.1 };
    float l[V], w[V];
    from_probs(p, l);
    int h[V];
    qsample_params sp = qsample_defaults();
    qlogit_bias b[2] = { { 0, -100.0f }, { 2, 0.5f } };
    sp.logit_bias = b;
    sp.n_logit_bias = 2;
    sp.seed = 3;
    qsampler *s = make(sp, V);
    REQUIRE(s);
    /* Additive, as vLLM: exact in the processed logits. */
    qsampler_process(s, l, NULL, w);
    CHECK(w[0] == l[0] + -100.0f && w[2] == l[2] + 0.5f && w[1] == l[1]);
    /* The sampler copied the entries. */
    b[0].bias = 0;
    qsampler_process(s, l, NULL, w);
    CHECK(w[0] == l[0] + -100.0f);
    qsampler_destroy(s);
    b[0].bias = -100.0f;
    /* -100 bans: id 0 (the likeliest) is never drawn.  Greedy moves to id 2,
     * not 1: log 0.2 + 0.5 = -1.11 beats log 0.3 = -1.20. */
    histogram(sp, l, 5000, h);
    CHECK_EQ_INT(h[0], 0);
    CHECK(h[1] > 0 && h[2] > 0 && h[3] > 0);
    sp.temperature = 0;
    s = make(sp, V);
    REQUIRE(s);
    CHECK_EQ_INT(qsample(s, l), 2);
    qsampler_destroy(s);
    sp.n_logit_bias = 1; /* only the ban: greedy takes id 1 */
    s = make(sp, V);
    REQUIRE(s);
    CHECK_EQ_INT(qsample(s, l), 1);
    qsampler_destroy(s);
    /* +100 forces: id 3 (p = 0.1) is drawn every time. */
    qlogit_bias force = { 3, 100.0f };
    sp.logit_bias = &force;
    sp.n_logit_bias = 1;
    sp.temperature = 1.0f;
    histogram(sp, l, 2000, h);
    CHECK_EQ_INT(h[3], 2000);
}

/* min_tokens: the listed ids are -inf until min_tokens tokens have been
 * accepted, then back; the sampler is not greedy-reducible meanwhile. */
static void test_min_tokens(void)
{
    double p[V] = { 0.4, 0.3, 0.2, 0.1 };
    float l[V], w[V];
    from_probs(p, l);
    qsample_params sp = qsample_defaults();
    sp.temperature = 0;
    const int32_t ban[1] = { 0 };
    sp.min_tokens = 2, sp.min_ids = ban, sp.n_min_ids = 1;
    qsampler *s = make(sp, V);
    REQUIRE(s);
    CHECK(!qsampler_is_greedy(s));
    qsampler_process(s, l, NULL, w);
    CHECK(isinf(w[0]) && w[0] < 0 && w[1] == l[1]);
    CHECK_EQ_INT(qsample(s, l), 1);
    CHECK_EQ_INT(qsampler_accept(s, 1), 0);
    CHECK_EQ_INT(qsample(s, l), 1); /* one accepted: still banned */
    CHECK_EQ_INT(qsampler_accept(s, 1), 0);
    CHECK(qsampler_is_greedy(s));
    CHECK_EQ_INT(qsample(s, l), 0); /* two: free again */
    qsampler_reset(s);
    CHECK_EQ_INT(qsample(s, l), 1); /* a new sequence counts from zero */
    qsampler_destroy(s);
    char err[160];
    const int32_t far[1] = { V };
    sp.min_ids = far;
    CHECK_EQ_INT(qsampler_new(&sp, V, &s, err, sizeof err), QERR_RANGE);
    CHECK(strstr(err, "min_tokens") != NULL);
    sp.min_tokens = -1, sp.min_ids = ban;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
}

static void test_mask(void)
{
    enum { N = 40 }; /* two mask words */
    float l[N];
    for (int i = 0; i < N; i++) l[i] = (float)(N - i) / 8; /* id 0 likeliest */
    uint32_t allowed[QSAMPLE_MASK_WORDS(N)] = { 0 };
    const int ok[3] = { 3, 33, 39 };
    for (int i = 0; i < 3; i++) allowed[ok[i] >> 5] |= 1u << (ok[i] & 31);
    qsample_params sp = qsample_defaults();
    sp.seed = 11;
    qsampler *s = make(sp, N);
    REQUIRE(s);
    float w[N];
    CHECK_EQ_INT(qsampler_process(s, l, allowed, w), 3);
    for (int i = 0; i < N; i++) CHECK(i == 3 || i == 33 || i == 39 ? w[i] == l[i] : w[i] == -INFINITY);
    int h[N] = { 0 };
    for (int i = 0; i < 3000; i++) {
        int t = qsample_masked(s, l, allowed);
        REQUIRE(t >= 0 && t < N);
        h[t]++;
    }
    CHECK(h[3] > 0 && h[33] > 0 && h[39] > 0);
    CHECK_EQ_INT(h[3] + h[33] + h[39], 3000);
    /* NULL allows everything. */
    CHECK_EQ_INT(qsampler_process(s, l, NULL, w), N);
    qsampler_destroy(s);
    /* Greedy takes the best allowed id, not the best id. */
    sp.temperature = 0;
    s = make(sp, N);
    REQUIRE(s);
    CHECK_EQ_INT(qsample_masked(s, l, allowed), 3);
    /* Allowed ids that are all -inf: the lowest allowed one. */
    float dead[N];
    for (int i = 0; i < N; i++) dead[i] = i == 0 ? 5.0f : -INFINITY;
    CHECK_EQ_INT(qsample_masked(s, dead, allowed), 3);
    /* Nothing allowed: an error, not a token. */
    uint32_t none[QSAMPLE_MASK_WORDS(N)] = { 0 };
    CHECK_EQ_INT(qsample_masked(s, l, none), QERR_INVAL);
    qsampler_destroy(s);
    sp.temperature = 1.0f;
    s = make(sp, N);
    REQUIRE(s);
    CHECK_EQ_INT(qsample_masked(s, dead, allowed), 3);
    CHECK_EQ_INT(qsample_masked(s, l, none), QERR_INVAL);
    qsampler_destroy(s);
}

static void test_seeded_penalties(void)
{
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)cos(i * 0.9);
    qsample_params sp = qsample_defaults();
    sp.seed = 1234;
    sp.repetition_penalty = 1.3f;
    sp.frequency_penalty = 0.4f;
    sp.presence_penalty = 0.6f;
    sp.top_p = 0.9f;
    const int32_t prompt[3] = { 1, 2, 3 };
    int a[300], b[300], c[300];
    qsampler *s1 = make(sp, V), *s2 = make(sp, V);
    REQUIRE(s1 && s2);
    qsampler_observe_prompt(s1, prompt, 3);
    qsampler_observe_prompt(s2, prompt, 3);
    for (int i = 0; i < 300; i++) {
        a[i] = qsample(s1, l);
        b[i] = qsample(s2, l);
        qsampler_accept(s1, a[i]);
        qsampler_accept(s2, b[i]);
    }
    CHECK(!memcmp(a, b, sizeof a));
    /* Reset gives the same sequence again. */
    qsampler_reset(s1);
    qsampler_observe_prompt(s1, prompt, 3);
    for (int i = 0; i < 300; i++) {
        c[i] = qsample(s1, l);
        qsampler_accept(s1, c[i]);
    }
    CHECK(!memcmp(a, c, sizeof a));
    /* The penalties matter: without them the same seed draws otherwise. */
    qsample_params plain = qsample_defaults();
    plain.seed = 1234;
    plain.top_p = 0.9f;
    qsampler *s3 = make(plain, V);
    REQUIRE(s3);
    for (int i = 0; i < 300; i++) c[i] = qsample(s3, l);
    CHECK(memcmp(a, c, sizeof a) != 0);
    qsampler_destroy(s1);
    qsampler_destroy(s2);
    qsampler_destroy(s3);
}

static void test_observe_errors(void)
{
    qsample_params sp = qsample_defaults();
    sp.presence_penalty = 1.0f;
    qsampler *s = make(sp, V);
    REQUIRE(s);
    CHECK_EQ_INT(qsampler_accept(s, -1), QERR_RANGE);
    CHECK_EQ_INT(qsampler_accept(s, V), QERR_RANGE);
    const int32_t bad[3] = { 1, V + 5, 2 };
    CHECK_EQ_INT(qsampler_observe_prompt(s, bad, 3), QERR_RANGE);
    CHECK_EQ_INT(qsampler_observe_prompt(s, bad, -1), QERR_INVAL);
    CHECK_EQ_INT(qsampler_observe_prompt(s, NULL, 2), QERR_INVAL);
    CHECK_EQ_INT(qsampler_observe_prompt(s, NULL, 0), 0);
    /* Nothing was recorded by the failed calls. */
    float zero[V] = { 0 }, w[V];
    qsampler_process(s, zero, NULL, w);
    for (int i = 0; i < V; i++) CHECK(w[i] == 0.0f);
    qsampler_destroy(s);
    /* Without penalties the ids are still checked. */
    s = make(qsample_defaults(), V);
    REQUIRE(s);
    CHECK_EQ_INT(qsampler_accept(s, V), QERR_RANGE);
    CHECK_EQ_INT(qsampler_accept(s, 3), 0);
    CHECK_EQ_INT(qsampler_observe_prompt(s, bad, 3), QERR_RANGE);
    qsampler_reset(s);
    qsampler_destroy(s);
}

static void test_degenerate_logits(void)
{
    qsample_params sp = qsample_defaults();
    qsampler *s = make(sp, 4);
    REQUIRE(s);
    float dead[4] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    CHECK_EQ_INT(qsample(s, dead), 0);
    float nan[4] = { NAN, 1.0f, NAN, 0.0f };
    for (int i = 0; i < 50; i++) {
        int t = qsample(s, nan);
        CHECK(t == 1 || t == 3);
    }
    CHECK_EQ_INT(qsample_argmax(nan, 4), 1);
    float inf[4] = { 0.0f, INFINITY, 2.0f, INFINITY };
    for (int i = 0; i < 50; i++) {
        int t = qsample(s, inf);
        CHECK(t == 1 || t == 3);
    }
    qsampler_destroy(s);
}

static void test_new_param_errors(void)
{
    char err[160];
    qsample_params sp = qsample_defaults();
    CHECK_EQ_INT(qsample_check(NULL, err, sizeof err), QERR_INVAL);
    sp.repetition_penalty = 0;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
    CHECK_STR_CONTAINS(err, "repetition_penalty");
    sp.repetition_penalty = -1;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
    sp.repetition_penalty = INFINITY;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
    sp.repetition_penalty = NAN;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
    sp.repetition_penalty = 3.5f; /* vLLM sets no upper bound */
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), 0);

    sp = qsample_defaults();
    sp.frequency_penalty = 2.5f;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
    CHECK_STR_CONTAINS(err, "frequency_penalty must be in [-2, 2]");
    sp.frequency_penalty = -2.0f; /* the bounds are inclusive */
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), 0);
    sp.frequency_penalty = NAN;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);

    sp = qsample_defaults();
    sp.presence_penalty = -2.01f;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
    CHECK_STR_CONTAINS(err, "presence_penalty");
    sp.presence_penalty = 2.0f;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), 0);

    sp = qsample_defaults();
    sp.logprobs = 2;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
    CHECK_STR_CONTAINS(err, "logprobs");
    sp.logprobs = 1;
    sp.top_logprobs = 21;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
    CHECK_STR_CONTAINS(err, "top_logprobs must be in [0, 20]");
    sp.top_logprobs = -1;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
    sp.top_logprobs = 20;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), 0);
    sp.logprobs = 0;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_INVAL);
    CHECK_STR_CONTAINS(err, "needs logprobs");

    sp = qsample_defaults();
    qlogit_bias b[3] = { { 1, 5.0f }, { 2, 100.5f }, { 1, 1.0f } };
    sp.logit_bias = b;
    sp.n_logit_bias = 2;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
    CHECK_STR_CONTAINS(err, "logit_bias for token 2 must be in [-100, 100]");
    b[1].bias = NAN;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
    b[1].bias = -100.0f;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), 0);
    sp.n_logit_bias = 3;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_INVAL);
    CHECK_STR_CONTAINS(err, "token 1 twice");
    b[2].id = -4;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_RANGE);
    CHECK_STR_CONTAINS(err, "-4");
    sp.n_logit_bias = QSAMPLE_MAX_LOGIT_BIAS + 1;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_LIMIT);
    CHECK_STR_CONTAINS(err, "at most");
    sp.n_logit_bias = -1;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_INVAL);
    sp.logit_bias = NULL;
    sp.n_logit_bias = 1;
    CHECK_EQ_INT(qsample_check(&sp, err, sizeof err), QERR_INVAL);

    /* Ids against the vocabulary, at creation. */
    b[2].id = V;
    sp.logit_bias = b;
    sp.n_logit_bias = 3;
    b[0].id = 0;
    qsampler *other = make(qsample_defaults(), V), *s = other; /* *out is set to NULL on failure */
    REQUIRE(other);
    CHECK_EQ_INT(qsampler_new(&sp, V, &s, err, sizeof err), QERR_RANGE);
    CHECK(s == NULL);
    CHECK_STR_CONTAINS(err, "outside the vocabulary");
    qsampler_destroy(other);
    CHECK(qsampler_create(&sp, V) == NULL);
    CHECK_EQ_INT(qsampler_new(&sp, V + 1, &s, err, sizeof err), 0); /* id V fits V + 1 */
    CHECK(s != NULL);
    qsampler_destroy(s);
    sp = qsample_defaults();
    CHECK_EQ_INT(qsampler_new(&sp, 0, &s, err, sizeof err), QERR_INVAL);
    CHECK_STR_CONTAINS(err, "vocabulary");
    CHECK_EQ_INT(qsampler_new(NULL, V, &s, err, sizeof err), QERR_INVAL);
    /* A zeroed struct is not valid (repetition_penalty 0): use the defaults. */
    qsample_params zero;
    memset(&zero, 0, sizeof zero);
    CHECK_EQ_INT(qsample_check(&zero, err, sizeof err), QERR_RANGE);
}

/* Equal probabilities at the top-k boundary: the lowest ids are kept (a
 * defined set, which the GPU's draws reproduce). */
static void test_top_k_ties_by_id(void)
{
    float logits[64];
    for (int i = 0; i < 64; i++) logits[i] = i % 2 ? 1.0f : 0.0f; /* 32 equal maxima at odd ids */
    int seen[64] = { 0 };
    for (uint64_t seed = 0; seed < 400; seed++) {
        qsample_params p = qsample_defaults();
        p.top_k = 5;
        p.seed = seed;
        qsampler *s = qsampler_create(&p, 64);
        REQUIRE(s);
        seen[qsample(s, logits)]++;
        qsampler_destroy(s);
    }
    for (int i = 0; i < 64; i++) {
        const int in_top = i == 1 || i == 3 || i == 5 || i == 7 || i == 9;
        if (in_top) CHECK(seen[i] > 0);
        else CHECK_EQ_INT(seen[i], 0);
    }
}

int main(void)
{
    QT_RUN(test_greedy);
    QT_RUN(test_seed_determinism);
    QT_RUN(test_distribution);
    QT_RUN(test_filters);
    QT_RUN(test_param_errors);
    QT_RUN(test_top_k_then_top_p);
    QT_RUN(test_top_k_ties_by_id);
    QT_RUN(test_penalties_exact);
    QT_RUN(test_repetition_sign);
    QT_RUN(test_frequency_counts);
    QT_RUN(test_logprobs);
    QT_RUN(test_logit_bias);
    QT_RUN(test_min_tokens);
    QT_RUN(test_mask);
    QT_RUN(test_seeded_penalties);
    QT_RUN(test_observe_errors);
    QT_RUN(test_degenerate_logits);
    QT_RUN(test_new_param_errors);
    QT_MAIN_END();
}
