/* test_spec.c - speculative decoding's parts: n-gram prompt lookup
 * (spec/ngram.c) and the verification of a proposed token
 * (qsample_verify): the token kept is distributed as a plain draw, whatever
 * the draft (certain of it, or drawn from a proposal distribution), with
 * temperature and filters; greedy keeps the argmax. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "qerr.h"
#include "qtest.h"
#include "policy.h"
#include "sample.h"
#include "spec.h"

static void test_ngram(void)
{
    int32_t out[QSPEC_MAX_K + 4];
    /* 1 2 3 4 5 ... 2 3 -> the 2 3 earlier was followed by 4 5. */
    const int32_t h1[] = { 1, 2, 3, 4, 5, 9, 2, 3 };
    CHECK_EQ_INT(qspec_ngram(h1, 8, 1, 3, 2, out), 2);
    CHECK(out[0] == 4 && out[1] == 5);
    /* Up to k, fewer where the history ends (the continuation may run into
     * the suffix itself). */
    CHECK_EQ_INT(qspec_ngram(h1, 8, 2, 2, 10, out), 5);
    CHECK(out[0] == 4 && out[4] == 3);
    /* No suffix recurs. */
    const int32_t h2[] = { 1, 2, 3, 4 };
    CHECK_EQ_INT(qspec_ngram(h2, 4, 1, 3, 4, out), 0);
    /* The longest suffix first: 7 8 occurs once followed by 1, the lone 8
     * latest followed by 6. */
    const int32_t h3[] = { 7, 8, 1, 8, 6, 7, 8 };
    CHECK_EQ_INT(qspec_ngram(h3, 7, 1, 2, 1, out), 1);
    CHECK_EQ_INT(out[0], 1);
    CHECK_EQ_INT(qspec_ngram(h3, 7, 1, 1, 1, out), 1);
    CHECK_EQ_INT(out[0], 6);
    /* The latest occurrence among several that is followed by k tokens. */
    const int32_t h4[] = { 5, 1, 5, 2, 5, 3, 5 };
    CHECK_EQ_INT(qspec_ngram(h4, 7, 1, 1, 1, out), 1);
    CHECK_EQ_INT(out[0], 3);
    CHECK_EQ_INT(qspec_ngram(h4, 7, 1, 1, 3, out), 3);
    CHECK(out[0] == 2 && out[1] == 5 && out[2] == 3);
    /* k is clamped; bad arguments give nothing. */
    int32_t run[40];
    for (int i = 0; i < 40; i++) run[i] = 4;
    CHECK_EQ_INT(qspec_ngram(run, 40, 1, 3, 100, out), QSPEC_MAX_K);
    CHECK_EQ_INT(qspec_ngram(run, 1, 1, 3, 4, out), 0);
    CHECK_EQ_INT(qspec_ngram(run, 40, 0, 3, 4, out), 0);
    CHECK_EQ_INT(qspec_ngram(run, 40, 3, 2, 4, out), 0);
    CHECK_EQ_INT(qspec_ngram(run, 40, 1, 3, 0, out), 0);
}

/* The index proposes exactly what the scan does, for every prefix of
 * sequences over small alphabets (many repeats), grown a token or a chunk
 * at a time; bad arguments give no index. */
static void test_ngram_index(void)
{
    int32_t h[3000], a[QSPEC_MAX_K], b[QSPEC_MAX_K];
    uint64_t x = 99;
    int diff = 0, proposals = 0;
    for (int alpha = 2; alpha <= 40; alpha *= 3) {
        for (int i = 0; i < 3000; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            h[i] = (int32_t)((x >> 33) % (uint64_t)alpha);
        }
        for (int mn = 1; mn <= 2; mn++) {
            const int mx = mn + 2;
            qspec_index *ix = qspec_index_new(mn, mx);
            REQUIRE(ix);
            for (int n = 1; n <= 3000;) {
                REQUIRE(qspec_index_update(ix, h, n) == 0);
                for (int k = 1; k <= QSPEC_MAX_K; k += 7) {
                    const int ca = qspec_ngram(h, n, mn, mx, k, a), cb = qspec_index_propose(ix, h, n, k, b);
                    proposals += ca > 0;
                    if (ca != cb || memcmp(a, b, sizeof *a * (size_t)(ca > 0 ? ca : 0))) diff++;
                }
                n += n < 200 ? 1 : 1 + (int)(x % 37), x = x * 6364136223846793005ULL + 1;
            }
            qspec_index_free(ix);
        }
    }
    CHECK_EQ_INT(diff, 0);
    CHECK(proposals > 1000);
    CHECK(qspec_index_new(0, 3) == NULL);
    CHECK(qspec_index_new(3, 2) == NULL);
    CHECK(qspec_index_new(1, 9) == NULL);
    qspec_index_free(NULL);
}

#define V 12

/* Pearson's chi-square of counts against probabilities p (cells with p = 0
 * must be empty: they add a large value otherwise). */
static double chi2(const int *count, const double *p, int n)
{
    double x = 0;
    for (int i = 0; i < V; i++) {
        const double want = p[i] * n;
        if (want == 0) x += count[i] ? 1e9 : 0;
        else x += (count[i] - want) * (count[i] - want) / want;
    }
    return x;
}

/* The distribution qsample draws from: the same sampler's draws counted. */
static void plain_probs(const qsample_params *sp, const float *l, int n, double *p)
{
    qsampler *s = qsampler_create(sp, V);
    int c[V] = { 0 };
    for (int i = 0; i < n; i++) c[qsample(s, l)]++;
    for (int i = 0; i < V; i++) p[i] = (double)c[i] / n;
    qsampler_destroy(s);
}

static void test_verify_distribution(void)
{
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(0.4 * i - 0.03 * i * i);
    qsample_params sps[3];
    sps[0] = qsample_defaults();
    sps[1] = qsample_defaults();
    sps[1].temperature = 0.7f, sps[1].top_k = 6;
    sps[2] = qsample_defaults();
    sps[2].top_p = 0.8f, sps[2].seed = 9;
    for (int k = 0; k < 3; k++) {
        /* The exact distribution: softmax with the filters, from a million
         * plain draws (their noise is a tenth of the test's). */
        double p[V];
        plain_probs(&sps[k], l, 1000000, p);
        for (int draft = 0; draft < V; draft += 5) {
            qsampler *s = qsampler_create(&sps[k], V);
            REQUIRE(s);
            int c[V] = { 0 }, acc_n = 0;
            const int n = 100000;
            for (int i = 0; i < n; i++) {
                int acc;
                const int t = qsample_verify(s, l, NULL, draft, &acc);
                REQUIRE(t >= 0 && t < V);
                c[t]++;
                acc_n += acc;
                CHECK(!acc || t == draft);
            }
            qsampler_destroy(s);
            /* 11 degrees of freedom at most: 31.3 is the 0.1% point (fixed
             * seeds, so this is deterministic). */
            const double x = chi2(c, p, n);
            if (x > 31.3) fprintf(stderr, "  params %d draft %d: chi-square %.1f\n", k, draft, x);
            CHECK(x < 31.3);
            /* The draft is taken as often as it would be drawn. */
            CHECK(fabs((double)acc_n / n - p[draft]) < 0.01);
        }
    }
}

/* A draft drawn from a proposal q (a draft model's distribution): the kept
 * token is distributed as p whatever q is, and the draft is kept with
 * probability sum over ids of min(p, q). */
static void test_verify_proposal(void)
{
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(0.4 * i - 0.03 * i * i);
    qsample_params sps[2];
    sps[0] = qsample_defaults();
    sps[1] = qsample_defaults();
    sps[1].temperature = 0.8f, sps[1].top_p = 0.9f;
    /* Proposals: one close to p, one far (mass on ids p gives little). */
    float qs[2][V];
    double qsum[2] = { 0, 0 };
    for (int i = 0; i < V; i++) {
        qs[0][i] = (float)exp(0.35 * i - 0.03 * i * i), qsum[0] += qs[0][i];
        qs[1][i] = (float)exp(-0.3 * i), qsum[1] += qs[1][i];
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < V; i++) qs[k][i] = (float)(qs[k][i] / qsum[k]);
    for (int pi = 0; pi < 2; pi++) {
        double p[V];
        plain_probs(&sps[pi], l, 1000000, p);
        for (int qi = 0; qi < 2; qi++) {
            qsampler *s = qsampler_create(&sps[pi], V);
            REQUIRE(s);
            qrng draw;
            qrng_seed(&draw, 77 + (uint64_t)qi);
            int c[V] = { 0 }, acc_n = 0;
            const int n = 100000;
            for (int t = 0; t < n; t++) {
                /* The draft, drawn from q. */
                double u = qrng_uniform(&draw), cum = 0;
                int d = V - 1;
                for (int i = 0; i < V; i++)
                    if (u < (cum += qs[qi][i])) {
                        d = i;
                        break;
                    }
                int acc;
                const int tok = qsample_verify_q(s, l, NULL, qs[qi], d, &acc);
                REQUIRE(tok >= 0 && tok < V);
                c[tok]++;
                acc_n += acc;
            }
            qsampler_destroy(s);
            const double x = chi2(c, p, n);
            double want_acc = 0;
            for (int i = 0; i < V; i++) want_acc += p[i] < qs[qi][i] ? p[i] : qs[qi][i];
            fprintf(stderr, "  params %d, proposal %d: chi-square %.1f, kept %.3f (expected %.3f)\n", pi, qi, x,
                    (double)acc_n / n, want_acc);
            CHECK(x < 31.3);
            CHECK(fabs((double)acc_n / n - want_acc) < 0.01);
        }
    }
}

/* qsample_propose: its q is the distribution the sampler would draw from
 * the draft's logits, its draws follow q, they leave the request's own
 * stream alone, and verification against them keeps p exactly. */
static void test_propose(void)
{
    float l[V], ld[V];
    for (int i = 0; i < V; i++) l[i] = (float)(0.4 * i - 0.03 * i * i), ld[i] = (float)(0.3 * i - 0.025 * i * i);
    qsample_params sp = qsample_defaults();
    sp.temperature = 0.9f, sp.top_k = 10, sp.seed = 5;
    double p[V], pd[V];
    plain_probs(&sp, l, 1000000, p);
    plain_probs(&sp, ld, 1000000, pd);
    qsampler *s = qsampler_create(&sp, V), *ref = qsampler_create(&sp, V);
    REQUIRE(s && ref);
    float q[V];
    int c[V] = { 0 }, cd[V] = { 0 }, acc_n = 0, same = 1;
    const int n = 100000;
    for (int t = 0; t < n; t++) {
        const int d = qsample_propose(s, ld, NULL, q);
        REQUIRE(d >= 0 && d < V);
        cd[d]++;
        if (t == 0) {
            double sum = 0, dev = 0;
            for (int i = 0; i < V; i++) sum += q[i], dev = fmax(dev, fabs(q[i] - pd[i]));
            CHECK(fabs(sum - 1) < 1e-5);
            CHECK(dev < 0.005);
            CHECK(q[d] > 0);
        }
        int acc;
        const int tok = qsample_verify_q(s, l, NULL, q, d, &acc);
        c[tok]++;
        acc_n += acc;
    }
    const double x = chi2(c, p, n), xd = chi2(cd, pd, n);
    double want_acc = 0;
    for (int i = 0; i < V; i++) want_acc += p[i] < pd[i] ? p[i] : pd[i];
    fprintf(stderr, "  kept tokens chi-square %.1f, drafts %.1f, kept %.3f (expected %.3f)\n", x, xd, (double)acc_n / n,
            want_acc);
    CHECK(x < 31.3 && xd < 31.3);
    CHECK(fabs((double)acc_n / n - want_acc) < 0.01);
    /* The proposals took none of the request's own numbers. */
    qsampler_reset(s);
    for (int t = 0; t < 100; t++) {
        (void)qsample_propose(s, ld, NULL, NULL);
        same &= qsample(s, l) == qsample(ref, l);
    }
    CHECK(same);
    /* Greedy: the argmax, q one-hot; a mask that allows nothing is refused. */
    qsample_params g = qsample_defaults();
    g.temperature = 0;
    qsampler *gs = qsampler_create(&g, V);
    CHECK_EQ_INT(qsample_propose(gs, ld, NULL, q), qsample_argmax(ld, V));
    CHECK(q[qsample_argmax(ld, V)] == 1.0f);
    uint32_t none[1] = { 0 };
    CHECK_EQ_INT(qsample_propose(gs, ld, none, q), QERR_INVAL);
    qsampler_destroy(gs);
    qsampler_destroy(s);
    qsampler_destroy(ref);
}

static void test_verify_greedy_and_masks(void)
{
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(i % 7);
    qsample_params sp = qsample_defaults();
    sp.temperature = 0;
    qsampler *s = qsampler_create(&sp, V);
    int acc;
    CHECK_EQ_INT(qsample_verify(s, l, NULL, 6, &acc), 6);
    CHECK_EQ_INT(acc, 1);
    CHECK_EQ_INT(qsample_verify(s, l, NULL, 5, &acc), 6);
    CHECK_EQ_INT(acc, 0);
    /* A mask: the best allowed id. */
    uint32_t m[1] = { 1u << 3 | 1u << 11 };
    CHECK_EQ_INT(qsample_verify(s, l, m, 3, &acc), 11);
    CHECK_EQ_INT(acc, 0);
    uint32_t none[1] = { 0 };
    CHECK_EQ_INT(qsample_verify(s, l, none, 3, &acc), QERR_INVAL);
    qsampler_destroy(s);
    /* Sampling under a mask: a refused draft is never taken. */
    sp = qsample_defaults();
    s = qsampler_create(&sp, V);
    for (int i = 0; i < 1000; i++) {
        const int t = qsample_verify(s, l, m, 5, &acc);
        CHECK(!acc && (t == 3 || t == 11));
    }
    qsampler_destroy(s);
}

/* The verify loop over a scripted sequence: which drafts each row keeps,
 * and where the sequence ends. */
typedef struct {
    const int *keep;        /* row j keeps its draft */
    int end_at;             /* the sequence ends at this row (-1: never) */
    int rows;               /* rows taken */
} script;

static int script_row(void *ctx, int j, int *acc)
{
    script *s = ctx;
    s->rows++;
    *acc = s->keep[j];
    return j != s->end_at;
}

static void test_verify_loop(void)
{
    const int some[] = { 1, 1, 0, 1, 0 }, all[] = { 1, 1, 1, 0 };
    script s = { some, -1, 0 };
    CHECK_EQ_INT(qspec_verify(4, script_row, &s), 2); /* the first refusal ends it */
    CHECK_EQ_INT(s.rows, 3);
    s = (script){ all, -1, 0 };
    CHECK_EQ_INT(qspec_verify(3, script_row, &s), 3); /* all kept: the last row gives one more */
    CHECK_EQ_INT(s.rows, 4);
    s = (script){ all, 1, 0 };
    CHECK_EQ_INT(qspec_verify(3, script_row, &s), 2); /* the sequence ends on a kept draft */
    CHECK_EQ_INT(s.rows, 2);
    const int none[] = { 0 }; /* the row past the drafts keeps none: it is the target's token */
    s = (script){ none, -1, 0 };
    CHECK_EQ_INT(qspec_verify(0, script_row, &s), 0); /* no drafts: one row */
    CHECK_EQ_INT(s.rows, 1);
}

/* The policy: a request's k follows its acceptance and rests when its
 * drafts are refused; the probe keeps drafts on only where they paid. */
static void test_policy(void)
{
    qspec_ctl c = qspec_ctl_start(2);
    CHECK(qspec_ctl_awake(&c));
    qspec_ctl_passed(&c, 2, 2, 4);
    CHECK_EQ_INT(c.k, 3); /* all kept: one more */
    qspec_ctl_passed(&c, 3, 3, 4);
    qspec_ctl_passed(&c, 4, 4, 4);
    CHECK_EQ_INT(c.k, 4); /* at most k_max */
    qspec_ctl_passed(&c, 4, 1, 4);
    CHECK_EQ_INT(c.k, 2); /* kept + 1 */
    CHECK_EQ_INT(c.passes, 4);
    /* Passes that keep nothing bring the rate under 10%: a rest of 16 steps. */
    for (int i = 0; i < 8 && c.k; i++) qspec_ctl_passed(&c, 2, 0, 4);
    CHECK_EQ_INT(c.k, 0);
    CHECK_EQ_INT(c.rest, 16);
    int asleep = 0;
    while (!qspec_ctl_awake(&c)) asleep++;
    CHECK_EQ_INT(asleep, 15);
    CHECK_EQ_INT(c.k, 1);
    qspec_ctl_passed(&c, 1, 0, 4);
    qspec_ctl_passed(&c, 1, 0, 4);
    CHECK_EQ_INT(c.k, 0);
    CHECK_EQ_INT(c.rest, 32); /* the second rest in a row: twice as long */

    qspec_probe p = { 0 };
    CHECK(qspec_probe_allowed(&p, 1, 0)); /* always */
    uint64_t gen = 0;
    int with = 0, without = 0;
    for (int step = 0; step < 16; step++) {
        const int on = qspec_probe_allowed(&p, 0, gen);
        with += on, without += !on;
        gen += on ? 30 : 10; /* drafts give three times the tokens in the same time */
        qspec_probe_done(&p, 0, 1, 0.01, gen);
    }
    CHECK_EQ_INT(with, QSPEC_PROBE_STEPS);
    CHECK_EQ_INT(without, QSPEC_PROBE_STEPS);
    CHECK(p.probes == 1 && p.won == 1);
    CHECK(qspec_probe_allowed(&p, 0, gen)); /* drafts on while they are used */
    /* A step with prompt tokens does not count. */
    const int left = p.left;
    qspec_probe_done(&p, 0, 0, 1.0, gen);
    CHECK_EQ_INT(p.left, left);
}

int main(void)
{
    QT_RUN(test_ngram);
    QT_RUN(test_ngram_index);
    QT_RUN(test_verify_distribution);
    QT_RUN(test_verify_proposal);
    QT_RUN(test_propose);
    QT_RUN(test_verify_greedy_and_masks);
    QT_RUN(test_verify_loop);
    QT_RUN(test_policy);
    QT_MAIN_END();
}
