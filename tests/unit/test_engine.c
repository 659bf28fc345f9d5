/* test_engine.c - continuous batching, chunked prefill, prefix caching,
 * preemption and cancellation, on the real stories260K model.
 *
 * The central check is batch invariance: every request's greedy output is
 * the same whether it runs alone, with 49 others, with a tiny token budget
 * (chunked prefill), with a tiny KV pool (preemption by recomputation, or by
 * swapping to host memory and back), or after its prefix was cached.  After
 * every scenario all KV blocks must be free or cached with no reference and
 * every swap slot free (no leaks); the swap scenarios check every step.
 *
 * QUIRE_TEST_DEVICE picks the backend every engine here runs on: "cpu" (the
 * default) or "cuda" (exact mode: float32 weights and KV, so that greedy
 * outputs stay comparable); with "cuda" and no CUDA build or device the test
 * prints "skipped: ..." and exits QT_SKIP_CODE (ctest: skipped).
 * QUIRE_TEST_TP=n splits the model among n shards (tensor parallelism: n
 * GPUs, or n groups of CPU threads). */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "model.h"
#include "tokenizer.h"
#include "qtest.h"
#ifdef QUIRE_HAVE_CUDA
#include "cuda_info.h"
#endif

#define NREQ 50
#define MAXGEN 24

static qmodel *g_model;
static qmodel *g_draft; /* stories260K cut to 4 layers: the draft model */
static qtok *g_tok;
static int g_device = QDEVICE_CPU;
static int g_tp; /* QUIRE_TEST_TP: the model split among this many shards */

/* Engine options for the device under test. */
static void test_opts(qengine_opts *o)
{
    qengine_opts_default(o);
    o->device = g_device;
    o->exact = g_device == QDEVICE_CUDA;
    o->tensor_parallel = g_tp;
}

typedef struct {
    int32_t prompt[80];
    int n;
    int32_t out[MAXGEN + 1];
    float lp[MAXGEN + 1];   /* logprob of each out[] token, when asked */
    int n_out;
    qfinish finish;
    int cached;
    char text[2048];
    size_t text_len;
} job;

static job jobs[NREQ];

static void make_jobs(void)
{
    uint64_t x = 42;
    int32_t shared[3][48];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 48; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            shared[s][i] = 3 + (int32_t)((x >> 33) % 509);
        }
    for (int j = 0; j < NREQ; j++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        int len = 1 + (int)((x >> 33) % 70);
        int pre = j % 3 == 0 ? 0 : (j % 3 == 1 ? 33 : 48); /* some share a prefix */
        if (pre > len) pre = len;
        jobs[j].prompt[0] = 1;
        for (int i = 1; i < len; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            jobs[j].prompt[i] = i < pre ? shared[j % 3][i] : 3 + (int32_t)((x >> 33) % 509);
        }
        jobs[j].n = len;
    }
}

static void check_clean(qengine *e);

/* Writes len bytes of text to a new file named from the mkstemp template
 * path (which gets the name); 0 or -1. */
static int write_temp(char *path, const char *text, size_t len)
{
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    const int ok = write(fd, text, len) == (ssize_t)len;
    close(fd);
    return ok ? 0 : -1;
}


/* How run_with submits and steps. */
typedef struct {
    float temp;
    uint64_t seed;
    int logprobs;           /* ask for the chosen token's logprob */
    int check_every_step;   /* qengine_check after every step, not only at the end */
} run_cfg;

/* Runs requests [lo, hi) of jobs in one engine (submitted together) and
 * stores their outputs in got[]. */
static int run_with(qengine *e, int lo, int hi, job *got, const run_cfg *c)
{
    uint64_t ids[NREQ];
    char err[256];
    for (int j = lo; j < hi; j++) {
        qreq_params p = { .prompt = jobs[j].prompt, .n_prompt = jobs[j].n, .sp = qsample_defaults(),
                          .max_tokens = MAXGEN, .ignore_eos = 1 };
        p.sp.temperature = c->temp;
        p.sp.seed = c->seed + (uint64_t)j;
        p.sp.logprobs = c->logprobs;
        if (qengine_submit(e, &p, &ids[j], err, sizeof err)) {
            fprintf(stderr, "  submit: %s\n", err);
            return -1;
        }
        memset(&got[j], 0, sizeof got[j]);
    }
    int live = 1, steps = 0;
    while (live > 0 && steps < 100000) {
        live = qengine_step(e);
        steps++;
        if (c->check_every_step) check_clean(e);
        qevent ev;
        while (qengine_poll(e, &ev)) {
            for (int j = lo; j < hi; j++) {
                if (ids[j] != ev.id) continue;
                if (ev.finish == QFINISH_NONE) {
                    if (got[j].n_out < MAXGEN + 1) {
                        got[j].lp[got[j].n_out] = ev.logprob;
                        got[j].out[got[j].n_out++] = ev.token;
                    }
                } else {
                    got[j].finish = ev.finish;
                    got[j].cached = ev.cached_tokens;
                }
                if (ev.text_len && got[j].text_len + ev.text_len < sizeof got[j].text) {
                    memcpy(got[j].text + got[j].text_len, ev.text, ev.text_len);
                    got[j].text_len += ev.text_len;
                }
            }
            qevent_free(&ev);
        }
    }
    return live;
}

/* Greedy (temp 0) or seeded sampling, checked at the end only. */
static int run(qengine *e, int lo, int hi, job *got, float temp, uint64_t seed)
{
    run_cfg c = { .temp = temp, .seed = seed };
    return run_with(e, lo, hi, got, &c);
}

static qengine *engine(int budget, int blocks, int max_seqs)
{
    qengine_opts o;
    test_opts(&o);
    o.n_threads = 2;
    if (budget) o.max_batch_tokens = budget;
    o.num_blocks = blocks ? blocks : 512;
    if (max_seqs) o.max_seqs = max_seqs;
    qengine *e = NULL;
    char err[256];
    if (qengine_create(g_model, g_tok, &o, &e, err, sizeof err)) fprintf(stderr, "  create: %s\n", err);
    return e;
}

static int same_outputs(const job *a, const job *b, const char *what)
{
    int bad = 0;
    for (int j = 0; j < NREQ; j++)
        if (a[j].n_out != b[j].n_out || memcmp(a[j].out, b[j].out, sizeof(int32_t) * (size_t)a[j].n_out)) {
            if (!bad) fprintf(stderr, "  %s: request %d differs (%d vs %d tokens)\n", what, j, a[j].n_out, b[j].n_out);
            bad++;
        }
    return bad == 0;
}

static void check_clean(qengine *e)
{
    char err[256];
    int rc = qengine_check(e, err, sizeof err);
    if (rc) fprintf(stderr, "  check: %s\n", err);
    CHECK(rc == 0);
}

static job alone[NREQ], batched[NREQ], chunked[NREQ], pressed[NREQ], cached[NREQ];

static void test_batch_invariance(void)
{
    /* Alone: one request at a time, a fresh engine each (no cache). */
    for (int j = 0; j < NREQ; j++) {
        qengine *e = engine(0, 0, 0);
        REQUIRE(e);
        CHECK(run(e, j, j + 1, alone, 0, 0) == 0);
        check_clean(e);
        qengine_destroy(e);
    }
    for (int j = 0; j < NREQ; j++) CHECK(alone[j].n_out == MAXGEN && alone[j].finish == QFINISH_LENGTH);

    qengine *e = engine(0, 0, 0);
    REQUIRE(e);
    CHECK(run(e, 0, NREQ, batched, 0, 0) == 0);
    CHECK(same_outputs(alone, batched, "all 50 at once"));
    check_clean(e);
    /* The same again in the same engine: prompts now hit the prefix cache. */
    qengine_stats st0, st1;
    qengine_stats_get(e, &st0);
    CHECK(run(e, 0, NREQ, cached, 0, 0) == 0);
    qengine_stats_get(e, &st1);
    CHECK(same_outputs(alone, cached, "after caching"));
    CHECK(st1.tokens_reused > st0.tokens_reused);
    fprintf(stderr, "  second pass reused %llu prompt tokens from the cache\n",
            (unsigned long long)(st1.tokens_reused - st0.tokens_reused));
    check_clean(e);
    qengine_destroy(e);

    /* A tiny token budget: prompts are prefilled in chunks of 7 tokens. */
    e = engine(7, 0, 7);
    REQUIRE(e);
    CHECK(run(e, 0, NREQ, chunked, 0, 0) == 0);
    CHECK(same_outputs(alone, chunked, "budget of 7 tokens"));
    check_clean(e);
    qengine_destroy(e);

    /* A tiny pool: 20 blocks of 16 tokens cannot hold the batch: preemption. */
    e = engine(0, 20, 0);
    REQUIRE(e);
    CHECK(run(e, 0, NREQ, pressed, 0, 0) == 0);
    qengine_stats_get(e, &st1);
    CHECK(same_outputs(alone, pressed, "20-block pool"));
    CHECK(st1.preemptions > 0);
    fprintf(stderr, "  20-block pool: %llu preemptions\n", (unsigned long long)st1.preemptions);
    check_clean(e);
    qengine_destroy(e);
}

/* ---- speculative decoding ---------------------------------------------------- */

/* Which proposer spec_engine's engines use: QSPEC_NGRAM or QSPEC_DRAFT. */
static int g_spec = QSPEC_NGRAM;

/* An engine with drafts (g_spec's) of up to k tokens (always: in every
 * step, else as the probe decides), blocks KV blocks (0: 512), preemption
 * mode. */
static qengine *spec_engine(int k, int blocks, int mode, int always)
{
    qengine_opts o;
    test_opts(&o);
    o.n_threads = 2;
    o.num_blocks = blocks ? blocks : 512;
    o.spec_mode = g_spec;
    o.draft = g_spec == QSPEC_DRAFT ? g_draft : NULL;
    o.spec_k = k;
    o.spec_max_batch = 1000; /* all 50 speculate together too */
    o.spec_always = always;
    o.preempt_mode = mode;
    qengine *e = NULL;
    char err[256];
    if (qengine_create(g_model, g_tok, &o, &e, err, sizeof err)) fprintf(stderr, "  create: %s\n", err);
    return e;
}

/* Greedy output with drafts (g_spec's) is the output without, for every
 * k, alone and batched, under preemption too; drafts were made and some
 * kept (else nothing was tested); the blocks all come back. */
static void spec_greedy(void)
{
    static job got[NREQ];
    const char *by = qspec_mode_name(g_spec);
    for (int k = 1; k <= 8; k++) {
        qengine *e = spec_engine(k, 0, QPREEMPT_RECOMPUTE, 1);
        REQUIRE(e);
        CHECK(run(e, 0, NREQ, got, 0, 0) == 0);
        char what[64];
        snprintf(what, sizeof what, "%s drafts, k %d, batched", by, k);
        CHECK(same_outputs(alone, got, what));
        qengine_stats st;
        qengine_stats_get(e, &st);
        fprintf(stderr, "  %s, k %d: %llu drafted, %llu kept, %llu passes, %llu steps\n", by, k,
                (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_accepted,
                (unsigned long long)st.spec_passes, (unsigned long long)st.steps);
        CHECK(st.spec_drafted > 0 && st.spec_accepted > 0 && st.spec_accepted < st.spec_drafted);
        check_clean(e);
        qengine_destroy(e);
    }
    /* As the engine runs drafts by default: measured against none in turn
     * (probes), used only when faster; the output is the same either way. */
    {
        qengine *e = spec_engine(4, 0, QPREEMPT_RECOMPUTE, 0);
        REQUIRE(e);
        for (int rep = 0; rep < 4; rep++) {
            CHECK(run(e, 0, NREQ, got, 0, 0) == 0);
            CHECK(same_outputs(alone, got, g_spec == QSPEC_DRAFT ? "draft model, probed" : "n-gram drafts, probed"));
        }
        qengine_stats st;
        qengine_stats_get(e, &st);
        fprintf(stderr, "  %s, probed: %llu probes, drafts faster in %llu\n", by, (unsigned long long)st.spec_probes,
                (unsigned long long)st.spec_probes_won);
        CHECK(st.spec_probes > 0 && st.spec_drafted > 0);
        check_clean(e);
        qengine_destroy(e);
    }
    /* Cancellations mid-decode, with drafts in every step: every block
     * comes back. */
    {
        qengine *e = spec_engine(4, 0, QPREEMPT_RECOMPUTE, 1);
        REQUIRE(e);
        uint64_t ids[NREQ];
        char err[256];
        for (int j = 0; j < NREQ; j++) {
            qreq_params p = { .prompt = jobs[j].prompt, .n_prompt = jobs[j].n, .sp = qsample_defaults(),
                              .max_tokens = 200, .ignore_eos = 1 };
            p.sp.temperature = 0;
            REQUIRE(qengine_submit(e, &p, &ids[j], err, sizeof err) == 0);
        }
        for (int i = 0; i < 12; i++) qengine_step(e);
        for (int j = 0; j < NREQ; j += 2) CHECK(qengine_cancel(e, ids[j]) == 0);
        int cancelled = 0;
        for (int live = 1; live > 0;) {
            live = qengine_step(e);
            qevent ev;
            while (qengine_poll(e, &ev)) {
                cancelled += ev.finish == QFINISH_CANCELLED;
                qevent_free(&ev);
            }
        }
        CHECK_EQ_INT(cancelled, NREQ / 2);
        qengine_stats st;
        qengine_stats_get(e, &st);
        CHECK(st.spec_drafted > 0);
        CHECK_EQ_INT(st.kv_used, 0);
        check_clean(e);
        qengine_destroy(e);
    }
    /* Alone, every k: a fresh engine for each request. */
    for (int k = 1; k <= 8; k++) {
        for (int j = 0; j < NREQ; j++) {
            qengine *e = spec_engine(k, 0, QPREEMPT_RECOMPUTE, 1);
            REQUIRE(e);
            CHECK(run(e, j, j + 1, got, 0, 0) == 0);
            check_clean(e);
            qengine_destroy(e);
        }
        char what[64];
        snprintf(what, sizeof what, "%s drafts, k %d, alone", by, k);
        CHECK(same_outputs(alone, got, what));
    }
    /* A 20-block pool, by recomputation and by swapping, checked every step. */
    for (int mode = QPREEMPT_RECOMPUTE; mode <= QPREEMPT_SWAP; mode++) {
        qengine *e = spec_engine(4, 20, mode, 1);
        REQUIRE(e);
        run_cfg c = { .check_every_step = 1 };
        char what[64];
        CHECK(run_with(e, 0, NREQ, got, &c) == 0);
        snprintf(what, sizeof what, "%s drafts, 20 blocks, %s", by, mode == QPREEMPT_SWAP ? "swap" : "recompute");
        CHECK(same_outputs(alone, got, what));
        qengine_stats st;
        qengine_stats_get(e, &st);
        CHECK(st.preemptions > 0 && st.spec_drafted > 0);
        check_clean(e);
        qengine_destroy(e);
    }
}

/* Runs requests [lo, hi) one at a time in e (or, e NULL, each in a fresh
 * draft-model engine with k 3), adding the engine's speculation counts to
 * *sum; the outputs go to got. */
static void draft_one_by_one(qengine *e, int lo, int hi, job *got, qengine_stats *sum)
{
    for (int j = lo; j < hi; j++) {
        qengine_stats a, b;
        qengine *x = e ? e : spec_engine(3, 0, QPREEMPT_RECOMPUTE, 1);
        REQUIRE(x);
        qengine_stats_get(x, &a);
        CHECK(run(x, j, j + 1, got, 0, 0) == 0);
        qengine_stats_get(x, &b);
        sum->spec_drafted += b.spec_drafted - a.spec_drafted;
        sum->spec_accepted += b.spec_accepted - a.spec_accepted;
        sum->draft_tokens += b.draft_tokens - a.draft_tokens;
        check_clean(x);
        if (!e) qengine_destroy(x);
    }
}

/* The draft model's K/V sit at the target's block ids; they are trusted
 * only while a block's generation stands.  A draft proposal is a function
 * of the tokens before it, so with stale K/V the drafts would differ: the
 * counts of drafts and kept ones must be exactly those of fresh engines,
 * both where blocks are handed out again to other requests (no prefix
 * cache: each request takes the blocks the last one freed) and where a
 * cached prefix is found again (then the draft computes fewer tokens). */
static void test_spec_draft_blocks(void)
{
    static job got[NREQ];
    g_spec = QSPEC_DRAFT;
    qengine_stats fresh = { 0 }, reused = { 0 }, again = { 0 };
    draft_one_by_one(NULL, 0, NREQ, got, &fresh);
    CHECK(same_outputs(alone, got, "draft model, fresh engines"));
    qengine_opts o;
    test_opts(&o);
    o.n_threads = 2, o.num_blocks = 512, o.spec_mode = QSPEC_DRAFT, o.draft = g_draft, o.spec_k = 3, o.spec_always = 1;
    o.no_prefix_cache = 1;
    qengine *e = NULL;
    char err[256];
    REQUIRE(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == 0);
    draft_one_by_one(e, 0, NREQ, got, &reused);
    CHECK(same_outputs(alone, got, "draft model, blocks handed out again"));
    qengine_destroy(e);
    o.no_prefix_cache = 0;
    REQUIRE(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == 0);
    draft_one_by_one(e, 0, NREQ, got, &again); /* the same prompts twice: the second time from the cache */
    qengine_stats first = again;
    memset(&again, 0, sizeof again);
    draft_one_by_one(e, 0, NREQ, got, &again);
    CHECK(same_outputs(alone, got, "draft model, prefixes cached"));
    qengine_destroy(e);
    fprintf(stderr, "  drafted/kept/draft tokens: fresh %llu/%llu/%llu, blocks reused %llu/%llu/%llu, cached %llu/%llu/%llu\n",
            (unsigned long long)fresh.spec_drafted, (unsigned long long)fresh.spec_accepted,
            (unsigned long long)fresh.draft_tokens, (unsigned long long)reused.spec_drafted,
            (unsigned long long)reused.spec_accepted, (unsigned long long)reused.draft_tokens,
            (unsigned long long)again.spec_drafted, (unsigned long long)again.spec_accepted,
            (unsigned long long)again.draft_tokens);
    CHECK(fresh.spec_accepted > 0);
    CHECK(reused.spec_drafted == fresh.spec_drafted && reused.spec_accepted == fresh.spec_accepted);
    CHECK(first.spec_drafted == fresh.spec_drafted && first.spec_accepted == fresh.spec_accepted);
    CHECK(again.spec_drafted == fresh.spec_drafted && again.spec_accepted == fresh.spec_accepted);
    CHECK(again.draft_tokens < first.draft_tokens);
    g_spec = QSPEC_NGRAM;
}

static void test_spec_greedy(void)
{
    g_spec = QSPEC_NGRAM;
    spec_greedy();
    g_spec = QSPEC_DRAFT;
    spec_greedy();
    g_spec = QSPEC_NGRAM;
}

/* The second and third tokens of n requests from one prompt at temperature
 * 1 (seeds seed0 + i), drawn with drafts (k 2) by the proposer spec
 * (QSPEC_NGRAM or QSPEC_DRAFT) or without (0), into
 * pairs[i] (the first comes from the prompt's pass, where nothing is
 * drafted; the next two from one pass with drafts). */
static void two_tokens(const int32_t *prompt, int np, int n, int spec, uint64_t seed0, int32_t (*pairs)[2],
                       qengine_stats *st)
{
    if (spec) g_spec = spec;
    qengine *e = spec ? spec_engine(2, 0, QPREEMPT_RECOMPUTE, 1) : engine(0, 0, 0);
    g_spec = QSPEC_NGRAM;
    REQUIRE(e);
    char err[256];
    enum { AT_ONCE = 64 };
    for (int lo = 0; lo < n; lo += AT_ONCE) {
        const int hi = lo + AT_ONCE < n ? lo + AT_ONCE : n;
        uint64_t ids[AT_ONCE];
        int got[AT_ONCE] = { 0 }; /* tokens seen */
        for (int i = lo; i < hi; i++) {
            qreq_params p = { .prompt = prompt, .n_prompt = np, .sp = qsample_defaults(), .max_tokens = 3, .ignore_eos = 1 };
            p.sp.seed = seed0 + (uint64_t)i; /* independent samples */
            REQUIRE(qengine_submit(e, &p, &ids[i - lo], err, sizeof err) == 0);
        }
        for (int live = 1; live > 0;) {
            live = qengine_step(e);
            qevent ev;
            while (qengine_poll(e, &ev)) {
                for (int i = lo; i < hi; i++)
                    if (ids[i - lo] == ev.id && ev.finish == QFINISH_NONE && got[i - lo] < 3) {
                        if (got[i - lo] >= 1) pairs[i][got[i - lo] - 1] = ev.token;
                        got[i - lo]++;
                    }
                qevent_free(&ev);
            }
        }
        for (int i = lo; i < hi; i++) CHECK_EQ_INT(got[i - lo], 3);
    }
    qengine_stats_get(e, st);
    check_clean(e);
    qengine_destroy(e);
}

/* n greedy tokens after prompt (no drafts) into out. */
static void greedy_tokens(const int32_t *prompt, int np, int n, int32_t *out)
{
    qengine *e = engine(0, 0, 0);
    REQUIRE(e);
    qreq_params p = { .prompt = prompt, .n_prompt = np, .sp = qsample_defaults(), .max_tokens = n, .ignore_eos = 1 };
    p.sp.temperature = 0;
    uint64_t id;
    char err[256];
    REQUIRE(qengine_submit(e, &p, &id, err, sizeof err) == 0);
    int got = 0;
    for (int live = 1; live > 0;) {
        live = qengine_step(e);
        qevent ev;
        while (qengine_poll(e, &ev)) {
            if (ev.finish == QFINISH_NONE && got < n) out[got++] = ev.token;
            qevent_free(&ev);
        }
    }
    CHECK_EQ_INT(got, n);
    qengine_destroy(e);
}

/* The chi-square value above which two samples' homogeneity is refused at
 * significance 0.001, for df degrees of freedom (Wilson-Hilferty). */
static double chi2_crit(int df)
{
    const double z = 3.0902, a = 2.0 / (9.0 * df), c = 1 - a + z * sqrt(a);
    return df * c * c * c;
}

/* Pearson's two-sample chi-square over the pairs a and b (n each; cells
 * with fewer than 20 in both together pooled into one, so that no expected
 * count is small: with 10, two runs without drafts from different seeds
 * gave 130.6 for 101 degrees of freedom), checked below the 0.001 point. */
static void same_distribution(int32_t (*a)[2], int32_t (*b)[2], int n, const char *what, const qengine_stats *sb)
{
    int32_t *key = malloc(sizeof *key * 2 * (size_t)n);
    int *ca = malloc(sizeof *ca * 2 * (size_t)n), *cb = malloc(sizeof *cb * 2 * (size_t)n);
    REQUIRE(key && ca && cb);
    int nk = 0;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < n; i++) {
            const int32_t k = (s ? b : a)[i][0] * 65536 + (s ? b : a)[i][1];
            int j = 0;
            while (j < nk && key[j] != k) j++;
            if (j == nk) key[nk] = k, ca[nk] = cb[nk] = 0, nk++;
            (s ? cb : ca)[j]++;
        }
    double x = 0;
    int cells = 0, pa = 0, pb = 0;
    for (int j = 0; j < nk; j++) {
        if (ca[j] + cb[j] < 20) {
            pa += ca[j], pb += cb[j];
            continue;
        }
        const double t = ca[j] + cb[j];
        x += (ca[j] - t / 2) * (ca[j] - t / 2) / (t / 2) + (cb[j] - t / 2) * (cb[j] - t / 2) / (t / 2);
        cells++;
    }
    if (pa + pb >= 20) {
        const double t = pa + pb;
        x += (pa - t / 2) * (pa - t / 2) / (t / 2) + (pb - t / 2) * (pb - t / 2) / (t / 2);
        cells++;
    }
    free(key), free(ca), free(cb);
    CHECK(cells >= 10 || n < 4000);
    if (cells < 2) return;
    fprintf(stderr, "  %s: %d pairs seen, %d cells: chi-square %.1f (0.001 point %.1f); drafts %llu, kept %llu\n", what,
            nk, cells, x, chi2_crit(cells - 1), (unsigned long long)sb->spec_drafted,
            (unsigned long long)sb->spec_accepted);
    CHECK(x < chi2_crit(cells - 1));
}

/* With drafts two tokens are distributed as without, by either proposer:
 * n samples of each, compared by same_distribution (seeds fixed: the
 * outcome is deterministic).  The prompt repeats itself so that n-gram
 * drafts are made and, often enough, kept. */
static void test_spec_distribution(void)
{
#if defined(__SANITIZE_ADDRESS__)
    enum { N = 600 }; /* the sanitizers' run checks memory, not statistics */
#else
    enum { N = 4000 };
#endif
    /* A story the model tells greedily from BOS, then its start again: what
     * follows the second start is much like what followed the first, which
     * n-gram lookup finds. */
    int32_t g[20], prompt[32];
    const int32_t bos = 1;
    greedy_tokens(&bos, 1, 20, g);
    int np = 0;
    prompt[np++] = 1;
    for (int i = 0; i < 20; i++) prompt[np++] = g[i];
    prompt[np++] = 1;
    for (int i = 0; i < 8; i++) prompt[np++] = g[i];
    static int32_t a[N][2], b[N][2], c[N][2];
    qengine_stats sa, sb, sc;
    /* Seeds of their own each way: independent samples. */
    two_tokens(prompt, np, N, 0, 1, a, &sa);
    two_tokens(prompt, np, N, QSPEC_NGRAM, 1000003, b, &sb);
    two_tokens(prompt, np, N, QSPEC_DRAFT, 2000003, c, &sc);
    CHECK(sa.spec_drafted == 0);
    CHECK(sb.spec_drafted > 0 && sb.spec_accepted > 0);
    CHECK(sc.spec_drafted > 0 && sc.spec_accepted > 0 && sc.draft_passes > 0);
    same_distribution(a, b, N, "n-gram drafts", &sb);
    same_distribution(a, c, N, "draft model", &sc);
}

/* ---- preemption by swapping ------------------------------------------------ */

static qengine *swap_engine_for(const qmodel *m, const qtok *tok, int blocks, size_t swap_mb)
{
    qengine_opts o;
    test_opts(&o);
    o.n_threads = 2;
    o.num_blocks = blocks;
    o.preempt_mode = QPREEMPT_SWAP;
    o.swap_space_mb = swap_mb;
    qengine *e = NULL;
    char err[256];
    if (qengine_create(m, tok, &o, &e, err, sizeof err)) fprintf(stderr, "  create: %s\n", err);
    return e;
}

static qengine *swap_engine(int blocks, size_t swap_mb)
{
    return swap_engine_for(g_model, g_tok, blocks, swap_mb);
}

static double max_lp_diff(const job *a, const job *b, int n)
{
    double d = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < a[j].n_out && i < b[j].n_out; i++) {
            double x = fabs((double)a[j].lp[i] - (double)b[j].lp[i]);
            if (x > d) d = x;
        }
    return d;
}

static void print_swap_stats(const char *what, const qengine_stats *st)
{
    fprintf(stderr, "  %s: %llu preemptions (%llu swapped out, %llu fell back to recompute), %llu swap-ins, "
            "%llu blocks out, %llu in\n", what, (unsigned long long)st->preemptions,
            (unsigned long long)st->preemptions_swap, (unsigned long long)st->swap_fallbacks,
            (unsigned long long)st->swap_ins, (unsigned long long)st->swapped_out_blocks,
            (unsigned long long)st->swapped_in_blocks);
}

/* The 20-block pool again, preempting by swapping: every greedy output is
 * the one of the request alone, every logprob the one of a pool that never
 * preempts (the KV written back is the KV swapped out, partial last blocks
 * and shared prefix blocks included), swaps happened both ways, and nothing
 * was recomputed: each prompt token is computed or reused once and each
 * generated token but the last computed once. */
static void test_swap_invariance(void)
{
    static job ref[NREQ], got[NREQ];
    run_cfg c = { .logprobs = 1 };
    qengine *e = engine(0, 0, 0);
    REQUIRE(e);
    CHECK(run_with(e, 0, NREQ, ref, &c) == 0);
    qengine_destroy(e);

    e = swap_engine(20, 4);
    REQUIRE(e);
    qengine_stats st;
    qengine_stats_get(e, &st);
    CHECK(st.swap_slots > 0 && st.swap_slots_free == st.swap_slots);
    c.check_every_step = 1; /* refcounts and slots recounted with requests swapped out */
    CHECK(run_with(e, 0, NREQ, got, &c) == 0);
    qengine_stats_get(e, &st);
    print_swap_stats("swap, 20-block pool", &st);
    CHECK(same_outputs(alone, got, "swap, 20-block pool"));
    double d = max_lp_diff(ref, got, NREQ);
    fprintf(stderr, "  logprobs differ by %.3g at most\n", d);
    /* A block written back wrong moves them by far more (by 2.4 when the
     * last block of each victim was left unrestored). */
    CHECK(d <= (g_device == QDEVICE_CPU ? 1e-4 : 1e-3));
    CHECK(st.preemptions_swap > 0 && st.swap_ins > 0);
    CHECK(st.swapped_in_blocks > 0 && st.swapped_in_blocks <= st.swapped_out_blocks);
    uint64_t total = 0;
    for (int j = 0; j < NREQ; j++) total += (uint64_t)(jobs[j].n + MAXGEN - 1);
    if (st.preemptions == st.preemptions_swap && st.swap_fallbacks == 0)
        CHECK_EQ_INT(st.tokens_computed + st.tokens_reused, total);
    else
        fprintf(stderr, "  (some victims were recomputed: the exact token count is not checked)\n");
    CHECK_EQ_INT(st.swapped, 0);
    CHECK_EQ_INT(st.swap_slots_free, st.swap_slots);
    check_clean(e);
    qengine_destroy(e);
}

/* The tokens (at most max) that job's prompt gives as a request of its own,
 * sampled at temperature 1 with seed, in a fresh engine. */
static int sample_alone(const job *jb, uint64_t seed, int max, int32_t *out)
{
    qengine *e = engine(0, 0, 0);
    if (!e) return -1;
    qreq_params p = { .prompt = jb->prompt, .n_prompt = jb->n, .sp = qsample_defaults(), .max_tokens = max,
                      .ignore_eos = 1 };
    p.sp.temperature = 1.0f;
    p.sp.seed = seed;
    uint64_t id;
    char err[256];
    int n = 0;
    if (qengine_submit(e, &p, &id, err, sizeof err) == 0) {
        while (qengine_step(e) > 0) {
        }
        qevent ev;
        while (qengine_poll(e, &ev)) {
            if (!ev.finish && n < max) out[n++] = ev.token;
            qevent_free(&ev);
        }
    } else {
        n = -1;
    }
    qengine_destroy(e);
    return n;
}

/* Parallel samples (n = 4) of prompts that share a 48-token prefix, in a
 * pool too small for them: victims keep their references on the shared
 * prefix and forked blocks and swap out only their own.  Each sample
 * continues exactly as a request of its own with seed + index would. */
static void test_swap_parallel_samples(void)
{
    enum { NP = 3, N = 4, GEN = 24 };
    int pj[NP], np = 0;
    for (int j = 0; j < NREQ && np < NP; j++)
        if (j % 3 == 2 && jobs[j].n >= 52) pj[np++] = j;
    REQUIRE(np == NP);
    static int32_t sep[NP][N][GEN], par[NP][N][GEN];
    int nsep[NP][N] = { { 0 } }, npar[NP][N] = { { 0 } };
    char err[256];
    for (int k = 0; k < NP; k++)
        for (int i = 0; i < N; i++)
            REQUIRE((nsep[k][i] = sample_alone(&jobs[pj[k]], 100 + (uint64_t)i, GEN, sep[k][i])) >= 0);
    qengine *e = swap_engine(16, 4);
    REQUIRE(e);
    uint64_t ids[NP];
    for (int k = 0; k < NP; k++) {
        qreq_params p = { .prompt = jobs[pj[k]].prompt, .n_prompt = jobs[pj[k]].n, .sp = qsample_defaults(),
                          .max_tokens = GEN, .ignore_eos = 1, .n = N };
        p.sp.temperature = 1.0f;
        p.sp.seed = 100;
        REQUIRE(qengine_submit(e, &p, &ids[k], err, sizeof err) == 0);
    }
    int fins = 0, steps = 0, live = 1;
    while (live > 0 && steps++ < 100000) {
        live = qengine_step(e);
        check_clean(e);
        qevent ev;
        while (qengine_poll(e, &ev)) {
            for (int k = 0; k < NP; k++) {
                if (ev.id != ids[k] || ev.index < 0 || ev.index >= N) continue;
                if (ev.finish) fins++;
                else if (npar[k][ev.index] < GEN) par[k][ev.index][npar[k][ev.index]++] = ev.token;
            }
            qevent_free(&ev);
        }
    }
    CHECK_EQ_INT(fins, NP * N);
    for (int k = 0; k < NP; k++)
        for (int i = 0; i < N; i++) {
            CHECK_EQ_INT(npar[k][i], GEN);
            CHECK(!memcmp(sep[k][i], par[k][i], sizeof sep[k][i]));
        }
    qengine_stats st;
    qengine_stats_get(e, &st);
    print_swap_stats("swap, n = 4 samples, 16-block pool", &st);
    CHECK(st.preemptions_swap > 0 && st.swap_ins > 0);
    check_clean(e);
    qengine_destroy(e);
}

/* Requests cancelled while swapped out give back their swap slots and the
 * shared blocks they kept. */
static void test_swap_cancel(void)
{
    qengine *e = swap_engine(20, 4);
    REQUIRE(e);
    uint64_t ids[NREQ];
    char err[256];
    for (int j = 0; j < NREQ; j++) {
        qreq_params p = { .prompt = jobs[j].prompt, .n_prompt = jobs[j].n, .sp = qsample_defaults(),
                          .max_tokens = MAXGEN, .ignore_eos = 1 };
        p.sp.temperature = 0;
        REQUIRE(qengine_submit(e, &p, &ids[j], err, sizeof err) == 0);
    }
    qengine_stats st = { 0 };
    for (int i = 0; i < 1000 && st.swapped == 0; i++) {
        CHECK(qengine_step(e) > 0);
        qengine_stats_get(e, &st);
    }
    REQUIRE(st.swapped > 0);
    CHECK(st.swap_slots_free < st.swap_slots);
    check_clean(e);
    int swapped = st.swapped;
    for (int j = 0; j < NREQ; j++) CHECK(qengine_cancel(e, ids[j]) == 0);
    CHECK(qengine_step(e) == 0);
    int cancelled = 0;
    qevent ev;
    while (qengine_poll(e, &ev)) {
        cancelled += ev.finish == QFINISH_CANCELLED;
        qevent_free(&ev);
    }
    CHECK(cancelled >= swapped);
    qengine_stats_get(e, &st);
    CHECK_EQ_INT(st.swapped, 0);
    CHECK_EQ_INT(st.kv_used, 0);
    CHECK_EQ_INT(st.swap_slots_free, st.swap_slots);
    check_clean(e);
    qengine_destroy(e);
}

/* A model whose KV block is 256 KiB (8 layers, 4 KV heads of 64, float32,
 * 16 tokens): 1 MiB of swap space is 4 slots, fewer than a victim holds, so
 * victims fall back to recomputation when it is full, and outputs still
 * equal those of each request alone.  A block larger than the swap space
 * (block_size 128: 2 MiB) is refused. */
static void test_swap_space_full(void)
{
    static const char cfg[] =
        "{\"model_type\": \"llama\", \"hidden_size\": 256, \"intermediate_size\": 512, \"num_hidden_layers\": 8,"
        " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"vocab_size\": 600, \"eos_token_id\": 2}";
    char path[] = "/tmp/quire-test-engine-XXXXXX", err[512];
    REQUIRE(write_temp(path, cfg, sizeof cfg - 1) == 0);
    qmodel *m = NULL;
    int rc = qmodel_random(path, 1, 7, &m, err, sizeof err);
    unlink(path);
    if (rc) fprintf(stderr, "  random model: %s\n", err);
    REQUIRE(rc == 0);
    enum { NJ = 12 };
    static job ref[NJ], got[NJ];
    for (int j = 0; j < NJ; j++) {
        qengine *e = NULL;
        qengine_opts o;
        test_opts(&o);
        o.n_threads = 2;
        o.num_blocks = 64;
        REQUIRE(qengine_create(m, NULL, &o, &e, err, sizeof err) == 0);
        CHECK(run(e, j, j + 1, ref, 0, 0) == 0);
        qengine_destroy(e);
    }
    qengine *e = swap_engine_for(m, NULL, 12, 1);
    REQUIRE(e);
    qengine_stats st;
    qengine_stats_get(e, &st);
    CHECK_EQ_INT(st.swap_slots, 4);
    run_cfg c = { .check_every_step = 1 };
    CHECK(run_with(e, 0, NJ, got, &c) == 0);
    qengine_stats_get(e, &st);
    print_swap_stats("swap, 12-block pool, 4 swap slots", &st);
    for (int j = 0; j < NJ; j++) {
        CHECK_EQ_INT(got[j].n_out, MAXGEN);
        CHECK(got[j].n_out == ref[j].n_out && !memcmp(got[j].out, ref[j].out, sizeof(int32_t) * (size_t)ref[j].n_out));
    }
    CHECK(st.preemptions_swap > 0 && st.swap_ins > 0);
    CHECK(st.swap_fallbacks > 0);
    CHECK(st.preemptions > st.preemptions_swap);
    check_clean(e);
    qengine_destroy(e);

    qengine_opts o;
    test_opts(&o);
    o.num_blocks = 16;
    o.block_size = 128;
    o.preempt_mode = QPREEMPT_SWAP;
    o.swap_space_mb = 1;
    e = (qengine *)&e;
    CHECK(qengine_create(m, NULL, &o, &e, err, sizeof err) == QERR_RANGE && e == NULL);
    CHECK_STR_CONTAINS(err, "holds no KV block");
    qmodel_destroy(m);
}

/* Options: the mode's names, a bad mode, the default swap space. */
static void test_swap_options(void)
{
    int mode = -1;
    CHECK(qpreempt_parse("swap", &mode) == 0 && mode == QPREEMPT_SWAP);
    CHECK(qpreempt_parse("recompute", &mode) == 0 && mode == QPREEMPT_RECOMPUTE);
    CHECK(qpreempt_parse("disk", &mode) == QERR_INVAL && mode == QPREEMPT_RECOMPUTE);
    CHECK(!strcmp(qpreempt_name(QPREEMPT_SWAP), "swap") && !strcmp(qpreempt_name(5), "?"));
    qengine_opts o;
    test_opts(&o);
    CHECK(o.preempt_mode == QPREEMPT_RECOMPUTE && o.swap_space_mb == 0);
    o.num_blocks = 16;
    char err[256];
    qengine *e = NULL;
    /* Recompute: no swap space at all, whatever swap_space_mb says. */
    o.swap_space_mb = 64;
    REQUIRE(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == 0);
    qengine_stats st;
    qengine_stats_get(e, &st);
    CHECK_EQ_INT(st.swap_slots, 0);
    qengine_destroy(e);
    o.preempt_mode = 7;
    CHECK(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == QERR_INVAL && e == NULL);
    CHECK_STR_CONTAINS(err, "preempt_mode");
    o.preempt_mode = QPREEMPT_SWAP;
    o.swap_space_mb = SIZE_MAX / 4;
    CHECK(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == QERR_RANGE && e == NULL);
    o.swap_space_mb = 0; /* the default */
    REQUIRE(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == 0);
    qengine_stats_get(e, &st);
    const qhparams *hp = &g_model->hp;
    size_t per_block = 2 * (size_t)hp->n_layers * (size_t)hp->n_kv_heads * (size_t)hp->head_dim * 4 * 16;
    CHECK_EQ_INT(st.swap_slots, (int)((size_t)QENGINE_DEFAULT_SWAP_MB * 1048576 / per_block));
    check_clean(e);
    qengine_destroy(e);
}

/* A step's draws on several threads (as when the model runs on a GPU) give
 * exactly what they give on one: seeded sampling with logprobs, greedy rows
 * and text, all 50 requests at once. */
static void test_parallel_draws(void)
{
    static job one[NREQ], four[NREQ];
    for (int k = 0; k < 2; k++) {
        qengine_opts o;
        test_opts(&o);
        o.n_threads = 2;
        o.num_blocks = 512;
        o.sample_threads = k ? 4 : 1;
        qengine *e = NULL;
        char err[256];
        REQUIRE(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == 0);
        run_cfg c = { .temp = 0.8f, .seed = 11, .logprobs = 1 };
        CHECK(run_with(e, 0, NREQ, k ? four : one, &c) == 0);
        check_clean(e);
        qengine_destroy(e);
    }
    CHECK(same_outputs(one, four, "4 draw threads vs 1"));
    int lp_same = 1;
    for (int j = 0; j < NREQ; j++)
        lp_same &= memcmp(one[j].lp, four[j].lp, sizeof(float) * (size_t)one[j].n_out) == 0 &&
                   one[j].text_len == four[j].text_len && memcmp(one[j].text, four[j].text, one[j].text_len) == 0;
    CHECK(lp_same);
}

static void test_seeded_sampling_batch_invariant(void)
{
    static job a[NREQ], b[NREQ];
    qengine *e = engine(0, 0, 0);
    REQUIRE(e);
    for (int j = 0; j < 10; j++) CHECK(run(e, j, j + 1, a, 0.9f, 77) == 0);
    qengine_destroy(e);
    e = engine(5, 30, 0);
    REQUIRE(e);
    CHECK(run(e, 0, 10, b, 0.9f, 77) == 0);
    for (int j = 0; j < 10; j++) CHECK(a[j].n_out == b[j].n_out && !memcmp(a[j].out, b[j].out, sizeof a[j].out));
    check_clean(e);
    qengine_destroy(e);
}

static void test_prefix_cache_counts(void)
{
    qengine *e = engine(0, 0, 0);
    REQUIRE(e);
    static job got[NREQ];
    /* jobs with a 48-token shared prefix: the second computes only its tail. */
    int a = -1, b = -1;
    for (int j = 0; j < NREQ; j++)
        if (j % 3 == 2 && jobs[j].n >= 60) {
            if (a < 0) a = j;
            else if (b < 0) b = j;
        }
    REQUIRE(a >= 0 && b >= 0);
    CHECK(run(e, a, a + 1, got, 0, 0) == 0);
    qengine_stats s0, s1;
    qengine_stats_get(e, &s0);
    CHECK(run(e, b, b + 1, got, 0, 0) == 0);
    qengine_stats_get(e, &s1);
    /* 48 shared tokens = 3 full blocks of 16. */
    CHECK_EQ_INT(s1.tokens_reused - s0.tokens_reused, 48);
    CHECK_EQ_INT(got[b].cached, 48);
    CHECK_EQ_INT(s1.tokens_computed - s0.tokens_computed, (uint64_t)(jobs[b].n - 48 + MAXGEN - 1));
    CHECK(got[b].n_out == alone[b].n_out && !memcmp(got[b].out, alone[b].out, sizeof got[b].out));
    check_clean(e);
    qengine_destroy(e);
}

static void test_cancel_frees_everything(void)
{
    char err[256];
    for (int when = 0; when < 2; when++) {
        qengine *e = engine(4, 0, 0); /* 4-token budget: a 70-token prompt takes many steps */
        REQUIRE(e);
        int j = 0;
        while (jobs[j].n < 40) j++;
        qreq_params p = { .prompt = jobs[j].prompt, .n_prompt = jobs[j].n, .sp = qsample_defaults(),
                          .max_tokens = 1000, .ignore_eos = 1 };
        p.sp.temperature = 0;
        uint64_t id;
        REQUIRE(qengine_submit(e, &p, &id, err, sizeof err) == 0);
        int steps = when == 0 ? 3 : 30; /* mid-prefill, mid-decode */
        for (int i = 0; i < steps; i++) qengine_step(e);
        qengine_stats st;
        qengine_stats_get(e, &st);
        CHECK(st.kv_used > 0);
        CHECK(qengine_cancel(e, id) == 0);
        CHECK(qengine_step(e) == 0);
        qevent ev;
        int fin = 0;
        while (qengine_poll(e, &ev)) {
            if (ev.finish == QFINISH_CANCELLED) fin = 1;
            qevent_free(&ev);
        }
        CHECK(fin);
        qengine_stats_get(e, &st);
        CHECK_EQ_INT(st.kv_used, 0);
        check_clean(e);
        CHECK(qengine_cancel(e, 9999) == QERR_NOTFOUND);
        qengine_destroy(e);
    }
}

static void test_stop_strings_and_eos(void)
{
    /* From BOS, stories260K greedily writes "Once upon a time, there was a
     * little girl named Lily." (karpathy/llama2.c's published output). */
    qengine *e = engine(0, 0, 0);
    REQUIRE(e);
    int32_t bos = 1;
    qreq_params p = { .prompt = &bos, .n_prompt = 1, .sp = qsample_defaults(), .max_tokens = 200 };
    p.sp.temperature = 0;
    p.stop[0] = "little girl";
    p.n_stop = 1;
    char err[256];
    uint64_t id;
    REQUIRE(qengine_submit(e, &p, &id, err, sizeof err) == 0);
    char text[4096] = "";
    size_t tl = 0;
    qfinish fin = QFINISH_NONE;
    while (qengine_step(e) > 0) {
    }
    qevent ev;
    while (qengine_poll(e, &ev)) {
        if (ev.text_len && tl + ev.text_len < sizeof text) memcpy(text + tl, ev.text, ev.text_len), tl += ev.text_len;
        if (ev.finish) fin = ev.finish;
        qevent_free(&ev);
    }
    text[tl] = 0;
    CHECK(fin == QFINISH_STOP);
    CHECK(!strcmp(text, "Once upon a time, there was a "));
    if (strcmp(text, "Once upon a time, there was a ")) fprintf(stderr, "  got '%s'\n", text);
    check_clean(e);
    qengine_destroy(e);
}

/* n = 4 samples of one prompt share its blocks, and each continues exactly
 * as a separate request with seed + index would: copy-on-write keeps the
 * shared last block apart. */
static void test_parallel_sampling(void)
{
    int j = 0;
    while (jobs[j].n < 40) j++;
    enum { N = 4, GEN = 16 };
    int32_t sep[N][GEN], par[N][GEN];
    int nsep[N] = { 0 }, npar[N] = { 0 };
    char err[256];
    for (int i = 0; i < N; i++) REQUIRE((nsep[i] = sample_alone(&jobs[j], 100 + (uint64_t)i, GEN, sep[i])) >= 0);
    qengine *e = engine(0, 0, 0);
    REQUIRE(e);
    qreq_params p = { .prompt = jobs[j].prompt, .n_prompt = jobs[j].n, .sp = qsample_defaults(),
                      .max_tokens = GEN, .ignore_eos = 1, .n = N };
    p.sp.temperature = 1.0f;
    p.sp.seed = 100;
    uint64_t id;
    REQUIRE(qengine_submit(e, &p, &id, err, sizeof err) == 0);
    qengine_step(e); /* the prompt, and each sample's first token */
    qengine_stats st;
    qengine_stats_get(e, &st);
    int prompt_blocks = (jobs[j].n + 15) / 16;
    CHECK_EQ_INT(st.kv_used, prompt_blocks); /* shared, not 4 copies */
    CHECK_EQ_INT(st.running, N);
    while (qengine_step(e) > 0) {
    }
    qevent ev;
    int fins = 0;
    while (qengine_poll(e, &ev)) {
        CHECK(ev.id == id && ev.index >= 0 && ev.index < N);
        if (ev.finish) fins++;
        else if (npar[ev.index] < GEN) par[ev.index][npar[ev.index]++] = ev.token;
        qevent_free(&ev);
    }
    CHECK_EQ_INT(fins, N);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(npar[i], GEN);
        CHECK(!memcmp(sep[i], par[i], sizeof sep[i]));
    }
    int distinct = 0;
    for (int i = 1; i < N; i++) distinct += memcmp(par[0], par[i], sizeof par[0]) != 0;
    CHECK(distinct > 0); /* different seeds, different samples */
    check_clean(e);
    /* Cancelling an n > 1 request ends every sample. */
    REQUIRE(qengine_submit(e, &p, &id, err, sizeof err) == 0);
    qengine_step(e);
    CHECK(qengine_cancel(e, id) == 0);
    CHECK(qengine_step(e) == 0);
    fins = 0;
    while (qengine_poll(e, &ev)) {
        fins += ev.finish == QFINISH_CANCELLED;
        qevent_free(&ev);
    }
    CHECK_EQ_INT(fins, N);
    check_clean(e);
    p.n = QENGINE_MAX_N + 1;
    CHECK(qengine_submit(e, &p, &id, err, sizeof err) == QERR_RANGE);
    qengine_destroy(e);
}

/* logprobs: the chosen token's and the top 5, from the raw distribution;
 * greedy picks the most likely, so it is top[0]. */
static void test_logprobs(void)
{
    qengine *e = engine(0, 0, 0);
    REQUIRE(e);
    int32_t bos = 1;
    qreq_params p = { .prompt = &bos, .n_prompt = 1, .sp = qsample_defaults(), .max_tokens = 5, .ignore_eos = 1 };
    p.sp.temperature = 0;
    p.sp.logprobs = 1;
    p.sp.top_logprobs = 5;
    char err[256];
    uint64_t id;
    REQUIRE(qengine_submit(e, &p, &id, err, sizeof err) == 0);
    while (qengine_step(e) > 0) {
    }
    qevent ev;
    int n = 0;
    while (qengine_poll(e, &ev)) {
        if (!ev.finish) {
            n++;
            CHECK_EQ_INT(ev.n_top, 5);
            CHECK(ev.top[0].id == ev.token && ev.top[0].logprob == ev.logprob);
            CHECK(ev.logprob <= 0 && ev.top[1].logprob <= ev.top[0].logprob && ev.top[4].logprob <= ev.top[3].logprob);
        }
        qevent_free(&ev);
    }
    CHECK_EQ_INT(n, 5);
    qengine_destroy(e);
}

/* Another thread submits and cancels while this one steps (the server's
 * lws thread and engine thread). */
typedef struct {
    qengine *e;
    int submitted, cancelled;
    volatile int done;
} feeder;

static void *feed(void *arg)
{
    feeder *f = arg;
    char err[256];
    for (int j = 0; j < 30; j++) {
        qreq_params p = { .prompt = jobs[j].prompt, .n_prompt = jobs[j].n, .sp = qsample_defaults(),
                          .max_tokens = 12, .ignore_eos = 1 };
        uint64_t id;
        if (qengine_submit(f->e, &p, &id, err, sizeof err) == 0) f->submitted++;
        struct timespec ts = { 0, 200000 };
        nanosleep(&ts, NULL);
        if (j % 3 == 0 && qengine_cancel(f->e, id) == 0) f->cancelled++;
    }
    __atomic_store_n(&f->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_threads(void)
{
    qengine *e = engine(16, 0, 0);
    REQUIRE(e);
    feeder f = { .e = e };
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, feed, &f) == 0);
    int finished = 0, cancelled = 0;
    /* Bounded by time, not by steps: an idle engine steps fast, and on a
     * loaded machine the feeder may wait long for a core.  Idle, the loop
     * yields so that the feeder gets one. */
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int live = qengine_step(e);
        qevent ev;
        while (qengine_poll(e, &ev)) {
            if (ev.finish) finished++, cancelled += ev.finish == QFINISH_CANCELLED;
            qevent_free(&ev);
        }
        if (live == 0 && __atomic_load_n(&f.done, __ATOMIC_ACQUIRE) && finished == f.submitted) break;
        if (live == 0) {
            struct timespec ts = { 0, 100000 };
            nanosleep(&ts, NULL);
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 120) break;
    }
    pthread_join(th, NULL);
    CHECK_EQ_INT(f.submitted, 30);
    CHECK_EQ_INT(finished, 30);
    CHECK(cancelled <= f.cancelled);
    check_clean(e);
    qengine_destroy(e);
}

static void test_submit_errors(void)
{
    qengine *e = engine(0, 0, 0);
    REQUIRE(e);
    char err[256];
    uint64_t id;
    int32_t bad[2] = { 1, 99999 }, ok[1] = { 1 };
    qreq_params p = { .prompt = bad, .n_prompt = 2, .sp = qsample_defaults(), .max_tokens = 5 };
    CHECK(qengine_submit(e, &p, &id, err, sizeof err) == QERR_RANGE);
    CHECK_STR_CONTAINS(err, "outside the vocabulary");
    p.n_prompt = 0;
    CHECK(qengine_submit(e, &p, &id, err, sizeof err) == QERR_INVAL);
    p.prompt = ok;
    p.n_prompt = 1;
    p.max_tokens = 0;
    CHECK(qengine_submit(e, &p, &id, err, sizeof err) == QERR_RANGE);
    p.max_tokens = 5;
    p.sp.temperature = -1;
    CHECK(qengine_submit(e, &p, &id, err, sizeof err) == QERR_RANGE);
    CHECK_STR_CONTAINS(err, "temperature");
    p.sp = qsample_defaults();
    p.stop[0] = "";
    p.n_stop = 1;
    CHECK(qengine_submit(e, &p, &id, err, sizeof err) == QERR_INVAL);
    check_clean(e);
    qengine_destroy(e);
}

static void test_device_selection(void)
{
    int d = -1;
    CHECK(qdevice_parse("cpu", &d) == 0 && d == QDEVICE_CPU);
    CHECK(qdevice_parse("cuda", &d) == 0 && d == QDEVICE_CUDA);
    CHECK(qdevice_parse("auto", &d) == 0 && d == QDEVICE_AUTO);
    CHECK(qdevice_parse("gpu", &d) == QERR_INVAL && d == QDEVICE_AUTO);
    CHECK(qdevice_parse(NULL, &d) == QERR_INVAL);
    CHECK(!strcmp(qdevice_name(QDEVICE_CUDA), "cuda") && !strcmp(qdevice_name(7), "?"));

    char err[512] = "";
    qengine_opts o;
    qengine_opts_default(&o);
    CHECK(o.device == QDEVICE_AUTO && o.kv_mem_mb == 0);
    qengine *e = NULL;
    /* The CPU, its pool sized from 256 MiB of float32 K/V by default and
     * from kv_mem_mb when given. */
    o.device = QDEVICE_CPU;
    o.n_threads = 1;
    REQUIRE(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == 0);
    CHECK(!strcmp(qengine_backend_name(e), "cpu"));
    const qhparams *hp = &g_model->hp;
    double per_block = 2.0 * hp->n_layers * hp->n_kv_heads * hp->head_dim * 4.0 * 16;
    CHECK_EQ_INT(qengine_num_blocks(e), (int)(256.0 * 1048576.0 / per_block));
    qengine_destroy(e);
    o.kv_mem_mb = 1;
    REQUIRE(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == 0);
    CHECK_EQ_INT(qengine_num_blocks(e), (int)(1048576.0 / per_block));
    qengine_destroy(e);

    /* AUTO: CUDA exactly when a device is there. */
    int have_cuda = 0;
#ifdef QUIRE_HAVE_CUDA
    have_cuda = cuda_device_count(err, sizeof err) > 0;
#endif
    o.device = QDEVICE_AUTO;
    o.kv_mem_mb = 16;
    REQUIRE(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == 0);
    CHECK(!strcmp(qengine_backend_name(e), have_cuda ? "cuda" : "cpu"));
    qengine_destroy(e);

    /* CUDA without a device or without the build: an error, no engine. */
    o.device = QDEVICE_CUDA;
    e = (qengine *)&e;
    int rc = qengine_create(g_model, g_tok, &o, &e, err, sizeof err);
    if (have_cuda) {
        CHECK(rc == 0 && !strcmp(qengine_backend_name(e), "cuda"));
        qengine_destroy(e);
    } else {
        CHECK(rc < 0 && e == NULL);
        CHECK_STR_CONTAINS(err, "device cuda");
#ifndef QUIRE_HAVE_CUDA
        CHECK(rc == QERR_UNSUPPORTED);
        CHECK_STR_CONTAINS(err, "built without CUDA");
#endif
    }
    o.device = 9;
    CHECK(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == QERR_INVAL);
    o.device = QDEVICE_CPU;
    o.gpu_mem_util = 1.5f;
    CHECK(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == QERR_RANGE);
    CHECK_STR_CONTAINS(err, "gpu_mem_util");
}

/* Random weights through the engine: host-filled ones run on every device
 * and give the same greedy tokens for the same seed; device-filled ones are
 * refused by the CPU backend with a message. */
static void test_random_weights(void)
{
    static const char cfg[] =
        "{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
        " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 256, \"eos_token_id\": 2}";
    char path[] = "/tmp/quire-test-engine-XXXXXX", err[512];
    REQUIRE(write_temp(path, cfg, sizeof cfg - 1) == 0);
    int32_t out[2][8], prompt[4] = { 1, 7, 9, 11 };
    for (int k = 0; k < 2; k++) {
        qmodel *m = NULL;
        int rc = qmodel_random(path, 1, 99, &m, err, sizeof err);
        CHECK(rc == 0);
        if (rc) break;
        qengine_opts o;
        test_opts(&o);
        o.n_threads = 2;
        o.num_blocks = 16;
        qengine *e = NULL;
        rc = qengine_create(m, NULL, &o, &e, err, sizeof err);
        if (rc) fprintf(stderr, "  create: %s\n", err);
        CHECK(rc == 0);
        if (!rc) {
            qreq_params p = { .prompt = prompt, .n_prompt = 4, .sp = qsample_defaults(), .max_tokens = 8, .ignore_eos = 1 };
            p.sp.temperature = 0;
            uint64_t id;
            CHECK(qengine_submit(e, &p, &id, err, sizeof err) == 0);
            int n = 0, live = 1;
            while (live > 0) {
                live = qengine_step(e);
                qevent ev;
                while (qengine_poll(e, &ev)) {
                    if (ev.finish == QFINISH_NONE && n < 8) out[k][n++] = ev.token;
                    qevent_free(&ev);
                }
            }
            CHECK_EQ_INT(n, 8);
            check_clean(e);
            qengine_destroy(e);
        }
        qmodel_destroy(m);
    }
    CHECK(!memcmp(out[0], out[1], sizeof out[0]));

    qmodel *m = NULL;
    REQUIRE(qmodel_random(path, 0, 99, &m, err, sizeof err) == 0);
    qengine_opts o;
    qengine_opts_default(&o);
    o.device = QDEVICE_CPU;
    o.num_blocks = 16;
    qengine *e = NULL;
    CHECK(qengine_create(m, NULL, &o, &e, err, sizeof err) == QERR_INVAL && e == NULL);
    CHECK_STR_CONTAINS(err, "no data");
    qmodel_destroy(m);
    unlink(path);
}

int main(void)
{
    char path[1024], err[512];
    const char *dev = getenv("QUIRE_TEST_DEVICE");
    if (dev && *dev && qdevice_parse(dev, &g_device)) {
        fprintf(stderr, "QUIRE_TEST_DEVICE=%s: expected cpu or cuda\n", dev);
        return 1;
    }
    if (g_device == QDEVICE_AUTO) g_device = QDEVICE_CPU;
    if (g_device == QDEVICE_CUDA) {
#ifdef QUIRE_HAVE_CUDA
        if (cuda_device_count(err, sizeof err) <= 0) {
            printf("skipped: QUIRE_TEST_DEVICE=cuda but no CUDA device (%s)\n", err);
            return QT_SKIP_CODE;
        }
#else
        printf("skipped: QUIRE_TEST_DEVICE=cuda but this build has no CUDA backend\n");
        return QT_SKIP_CODE;
#endif
    }
    const char *tp = getenv("QUIRE_TEST_TP");
    g_tp = tp && *tp ? atoi(tp) : 0;
#ifdef QUIRE_HAVE_CUDA
    if (g_device == QDEVICE_CUDA && g_tp > 1 && cuda_device_count(err, sizeof err) < g_tp) {
        printf("skipped: QUIRE_TEST_TP=%d but fewer CUDA devices\n", g_tp);
        return QT_SKIP_CODE;
    }
#endif
    fprintf(stderr, "device: %s%s%s\n", qdevice_name(g_device), g_tp > 1 ? ", tensor parallel " : "",
            g_tp > 1 ? tp : "");
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", qt_root());
    if (qmodel_load(path, &g_model, err, sizeof err) || qtok_for_model(g_model, &g_tok, err, sizeof err)) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        return 1;
    }
    snprintf(path, sizeof path, "%s/tests/fixtures/models/stories260K-draft4.gguf", qt_root());
    if (qmodel_load(path, &g_draft, err, sizeof err)) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        return 1;
    }
    make_jobs();
    QT_RUN(test_batch_invariance);
    QT_RUN(test_spec_greedy);
    QT_RUN(test_spec_draft_blocks);
    QT_RUN(test_spec_distribution);
    QT_RUN(test_swap_invariance);
    QT_RUN(test_swap_parallel_samples);
    QT_RUN(test_swap_cancel);
    QT_RUN(test_swap_space_full);
    QT_RUN(test_swap_options);
    QT_RUN(test_seeded_sampling_batch_invariant);
    QT_RUN(test_parallel_draws);
    QT_RUN(test_prefix_cache_counts);
    QT_RUN(test_cancel_frees_everything);
    QT_RUN(test_stop_strings_and_eos);
    QT_RUN(test_parallel_sampling);
    QT_RUN(test_logprobs);
    QT_RUN(test_threads);
    QT_RUN(test_submit_errors);
    QT_RUN(test_device_selection);
    QT_RUN(test_random_weights);
    qtok_free(g_tok);
    qmodel_destroy(g_model);
    qmodel_destroy(g_draft);
    QT_MAIN_END();
}
