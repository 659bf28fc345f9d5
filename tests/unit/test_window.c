/* test_window.c - sliding-window models hold only what they can attend to.
 *
 * The KV manager's kv_seq_drop_before (blocks behind every layer's window go
 * back to the pool, the prefix cache still finds the hashed ones, a dropped
 * entry is never truncated into, forked, swapped or freed twice), then the
 * engine on tiny-mistral-swa-random (every layer local, window 12; made by
 * HF transformers, scripts/gen_tiny_families.py): each of its 8 greedy
 * fixtures, 48 tokens past prompts of 5 to 40, so 4x the window and more,
 * comes out equal to transformers' (which masks the window over a full
 * cache), alone and all together, with the blocks held bounded by the
 * window at every step and a pool smaller than one sequence's whole length.
 * QUIRE_TEST_DEVICE=cuda runs the engine part on the CUDA backend (exact
 * mode); without a CUDA build or device it says "skipped" (exit 77). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kv.h"
#include "model.h"
#include "qmodels.h"
#include "qtest.h"
#ifdef QUIRE_HAVE_CUDA
#include "cuda_info.h"
#endif

static int g_device = QDEVICE_CPU;
static const uint8_t FP[KV_HASH_BYTES] = { 7 };

static void pool_ok(const kv_pool *p)
{
    char err[256];
    int rc = kv_pool_check(p, err, sizeof err);
    if (rc) fprintf(stderr, "  pool: %s\n", err);
    CHECK_EQ_INT(rc, 0);
}

static void test_kv_drop(void)
{
    kv_pool *p = NULL;
    char err[128];
    REQUIRE(kv_pool_create(16, 4, FP, &p, err, sizeof err) == 0);
    int32_t tok[200];
    for (int i = 0; i < 200; i++) tok[i] = 3 + i % 97;

    /* 40 tokens, 24 of them committed: blocks 0-5 hashed, 6-9 not. */
    kv_seq s;
    kv_seq_init(&s);
    REQUIRE(kv_seq_append(p, &s, tok, 40) == 0);
    kv_seq_commit(p, &s, 24);
    CHECK_EQ_INT(kv_seq_drop_before(p, &s, 0), 0);
    CHECK_EQ_INT(kv_seq_drop_before(p, &s, 29), 7); /* blocks 0-6 end at or before 28 */
    CHECK_EQ_INT(s.n_dropped, 7);
    CHECK(s.blocks[0] == KV_DROPPED && s.blocks[6] == KV_DROPPED && s.blocks[7] >= 0);
    CHECK_EQ_INT(kv_pool_num_used(p), 3);
    CHECK_EQ_INT(kv_pool_num_cached(p), 6); /* the hashed ones stay findable */
    CHECK_EQ_INT(kv_seq_drop_before(p, &s, 29), 0); /* nothing more */
    pool_ok(p);
    /* Never into the dropped blocks; never the last block. */
    CHECK_EQ_INT(kv_seq_truncate(p, &s, 28), QERR_RANGE);
    CHECK_EQ_INT(kv_seq_truncate(p, &s, 30), 0);
    CHECK_EQ_INT(kv_seq_drop_before(p, &s, 1000), 0); /* block 7 holds the last token */
    CHECK_EQ_INT(kv_seq_append(p, &s, tok + 30, 10), 0);
    /* The chain goes on past the unhashed dropped block 6. */
    CHECK(kv_seq_commit(p, &s, 40) >= 0);
    CHECK_EQ_INT(s.n_hashed, 10);
    kv_seq t;
    kv_seq_init(&t);
    CHECK_EQ_INT(kv_seq_match_prefix(p, &t, tok, 41), 24); /* 0-5 cached; 6 was never hashed */
    kv_seq_free(p, &t);

    /* Fork, exclusive blocks, swap: dropped entries hold no reference. */
    kv_seq f;
    kv_seq_init(&f);
    REQUIRE(kv_seq_fork(p, &s, &f) == 0);
    CHECK_EQ_INT(f.n_dropped, 7);
    int32_t idx[32];
    CHECK_EQ_INT(kv_seq_exclusive_blocks(p, &s, idx), 0); /* 7-9 are shared with f */
    kv_seq_free(p, &f);
    int n = kv_seq_exclusive_blocks(p, &s, idx);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(idx[0], 7);
    CHECK_EQ_INT(kv_seq_swap_out(p, &s, idx, n), 0);
    CHECK_EQ_INT(kv_seq_drop_before(p, &s, 40), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_swap_in(p, &s, idx), 3);
    pool_ok(p);
    kv_seq_free(p, &s);
    CHECK_EQ_INT(kv_pool_num_used(p), 0);
    pool_ok(p);

    /* A sequence 12x the pool, one token at a time with a window of 12:
     * never more than 5 blocks held, never out of blocks. */
    kv_seq_init(&s);
    int most = 0;
    for (int i = 0; i < 200 * 4 / 4; i++) {
        REQUIRE(kv_seq_can_append(p, &s, 1));
        REQUIRE(kv_seq_append(p, &s, &tok[i % 200], 1) == 0);
        kv_seq_commit(p, &s, s.n_tokens);
        kv_seq_drop_before(p, &s, s.n_tokens - 12 + 1);
        if (kv_pool_num_used(p) > most) most = kv_pool_num_used(p);
    }
    CHECK(most <= 5);
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK(st.dropped_blocks >= 45);
    pool_ok(p);
    kv_seq_free(p, &s);
    kv_pool_destroy(p);
}

typedef struct {
    int32_t prompt[64], want[64], got[64];
    int np, ng, n_got;
    uint64_t id;
} wjob;

/* Runs jobs [0, n) submitted together; the most KV blocks held at any step. */
static int run_jobs(qengine *e, wjob *jb, int n)
{
    char err[256];
    for (int j = 0; j < n; j++) {
        qreq_params p = { .prompt = jb[j].prompt, .n_prompt = jb[j].np, .sp = qsample_defaults(),
                          .max_tokens = jb[j].ng, .ignore_eos = 1 };
        p.sp.temperature = 0;
        jb[j].n_got = 0;
        if (qengine_submit(e, &p, &jb[j].id, err, sizeof err)) {
            fprintf(stderr, "  submit: %s\n", err);
            return -1;
        }
    }
    int live = 1, most = 0;
    for (int steps = 0; live > 0 && steps < 10000; steps++) {
        live = qengine_step(e);
        qengine_stats st;
        qengine_stats_get(e, &st);
        if (st.kv_used > most) most = st.kv_used;
        CHECK_EQ_INT(qengine_check(e, err, sizeof err), 0);
        qevent ev;
        while (qengine_poll(e, &ev)) {
            for (int j = 0; j < n; j++)
                if (jb[j].id == ev.id && ev.finish == QFINISH_NONE && jb[j].n_got < 64) jb[j].got[jb[j].n_got++] = ev.token;
            qevent_free(&ev);
        }
    }
    return most;
}

static void test_engine_window(void)
{
    qmodel *m = load("tests/fixtures/models/tiny-mistral-swa-random");
    REQUIRE(m);
    REQUIRE(qhp_all_local_window(&m->hp) == 12);
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/tiny-mistral-swa-random.greedy.json", qt_root());
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    REQUIRE(j);
    wjob jb[8];
    json_t *pa, *ga;
    REQUIRE(greedy_pair(j, 0, &pa, &ga) == 8);
    for (int k = 0; k < 8; k++) {
        greedy_pair(j, k, &pa, &ga);
        jb[k].np = (int)json_array_size(pa), jb[k].ng = (int)json_array_size(ga);
        REQUIRE(jb[k].np <= 64 && jb[k].ng <= 64 && jb[k].np + jb[k].ng >= 4 * 12);
        for (int i = 0; i < jb[k].np; i++) jb[k].prompt[i] = (int32_t)json_integer_value(json_array_get(pa, (size_t)i));
        for (int i = 0; i < jb[k].ng; i++) jb[k].want[i] = (int32_t)json_integer_value(json_array_get(ga, (size_t)i));
    }
    json_decref(j);

    /* One at a time on a pool of 8 blocks of 4 (32 slots, fewer than any
     * sequence's 53 to 88 tokens), prefill in chunks of 8. */
    qengine_opts o;
    qengine_opts_default(&o);
    o.device = g_device;
    o.exact = g_device == QDEVICE_CUDA;
    o.n_threads = 2;
    o.block_size = 4;
    o.num_blocks = 8;
    o.max_batch_tokens = 8;
    qengine *e = NULL;
    char err[256];
    REQUIRE(qengine_create(m, NULL, &o, &e, err, sizeof err) == 0);
    for (int k = 0; k < 8; k++) {
        int most = run_jobs(e, &jb[k], 1);
        int same = jb[k].n_got == jb[k].ng && !memcmp(jb[k].got, jb[k].want, sizeof(int32_t) * (size_t)jb[k].ng);
        if (!same) fprintf(stderr, "  prompt %d (%d ids): differs from transformers\n", k, jb[k].np);
        CHECK(same);
        /* The window's 12 positions span at most 4 blocks of 4, and one
         * more is being written. */
        CHECK(most >= 1 && most <= 5);
    }
    qengine_stats st;
    qengine_stats_get(e, &st);
    fprintf(stderr, "  one at a time: all 8 equal to transformers, %llu blocks given back\n",
            (unsigned long long)st.kv_dropped);
    CHECK(st.kv_dropped >= 8 * (48 - 12) / 4);
    qengine_destroy(e);

    /* All 8 together on 64 blocks: the same outputs, at most 5 blocks each. */
    o.num_blocks = 64;
    o.max_batch_tokens = 64;
    REQUIRE(qengine_create(m, NULL, &o, &e, err, sizeof err) == 0);
    int most = run_jobs(e, jb, 8);
    for (int k = 0; k < 8; k++)
        CHECK(jb[k].n_got == jb[k].ng && !memcmp(jb[k].got, jb[k].want, sizeof(int32_t) * (size_t)jb[k].ng));
    fprintf(stderr, "  all 8 together: equal to transformers, at most %d blocks held at once\n", most);
    CHECK(most <= 8 * 5);
    qengine_destroy(e);
    qmodel_destroy(m);
}

int main(void)
{
    const char *dev = getenv("QUIRE_TEST_DEVICE");
    if (dev && *dev && !strcmp(dev, "cuda")) {
#ifdef QUIRE_HAVE_CUDA
        char err[256];
        if (cuda_device_count(err, sizeof err) <= 0) {
            printf("skipped: QUIRE_TEST_DEVICE=cuda but no CUDA device (%s)\n", err);
            return QT_SKIP_CODE;
        }
        g_device = QDEVICE_CUDA;
#else
        printf("skipped: QUIRE_TEST_DEVICE=cuda but this build has no CUDA backend\n");
        return QT_SKIP_CODE;
#endif
    }
    QT_RUN(test_kv_drop);
    QT_RUN(test_engine_window);
    QT_MAIN_END();
}
