/* test_sample.c - greedy, temperature, top-k, top-p, min-p, seeds. */
#include <math.h>

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

int main(void)
{
    QT_RUN(test_greedy);
    QT_RUN(test_seed_determinism);
    QT_RUN(test_distribution);
    QT_RUN(test_filters);
    QT_RUN(test_param_errors);
    QT_MAIN_END();
}
