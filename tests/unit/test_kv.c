/* test_kv.c - the KV manager: allocation as tokens arrive, all-or-nothing
 * errors, prefix cache (hits, the last-token cap, LRU eviction, collision
 * defence), copy-on-write, statistics, and a randomized stress test that
 * checks every invariant after every step against a shadow model of what
 * each block holds. */
#include <limits.h>
#include <stdint.h>

#include "kv.h"
#include "qerr.h"
#include "buf.h"
#include "util.h"
#include "qtest.h"

static const uint8_t FP[KV_HASH_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static kv_pool *mk(int num_blocks, int block_size)
{
    kv_pool *p = NULL;
    int rc = kv_pool_create(num_blocks, block_size, FP, &p, NULL, 0);
    return rc ? NULL : p;
}

/* ids base, base+1, ... */
static void fill_ids(int32_t *out, int n, int base)
{
    for (int i = 0; i < n; i++) out[i] = base + i;
}

static int refcount(const kv_pool *p, int b)
{
    kv_block_info bi;
    return kv_pool_block_info(p, b, &bi) ? -1 : bi.refcount;
}

/* kv_pool_check, plus what the pool cannot see: every refcount equals the
 * number of table entries holding the block (no table holds one twice),
 * and each table's shape.  Returns 1 when all holds. */
static int check_tables(const kv_pool *p, kv_seq *const *seqs, int n_seqs)
{
    char err[256];
    if (kv_pool_check(p, err, sizeof err)) {
        fprintf(stderr, "  kv_pool_check: %s\n", err);
        return 0;
    }
    int nb = kv_pool_num_blocks(p), bs = kv_pool_block_size(p), ok = 1;
    int *count = calloc((size_t)nb, sizeof *count);
    int *mark = calloc((size_t)nb, sizeof *mark);
    for (int j = 0; j < n_seqs; j++) {
        const kv_seq *s = seqs[j];
        if (!s) continue;
        if (s->n_blocks != (s->n_tokens + bs - 1) / bs || s->n_hashed > s->n_tokens / bs) {
            fprintf(stderr, "  seq %d: %d tokens, %d blocks, %d hashed\n", j, s->n_tokens, s->n_blocks, s->n_hashed);
            ok = 0;
        }
        int holes = 0;
        for (int i = 0; i < s->n_blocks; i++) {
            int b = s->blocks[i];
            if (b == KV_SWAPPED_OUT) {
                holes++;
                continue;
            }
            if (b < 0 || b >= nb || mark[b] == j + 1) {
                fprintf(stderr, "  seq %d: block %d bad or twice\n", j, b);
                ok = 0;
                continue;
            }
            mark[b] = j + 1;
            count[b]++;
        }
        if (holes != s->n_swapped) {
            fprintf(stderr, "  seq %d: %d holes, n_swapped %d\n", j, holes, s->n_swapped);
            ok = 0;
        }
    }
    for (int b = 0; b < nb && ok; b++) {
        kv_block_info bi;
        kv_pool_block_info(p, b, &bi);
        if (bi.refcount != count[b] || (count[b] > 0) != (bi.state == KV_BLOCK_USED)) {
            fprintf(stderr, "  block %d: refcount %d state %d, %d table entries\n", b, bi.refcount, bi.state, count[b]);
            ok = 0;
        }
    }
    free(count);
    free(mark);
    return ok;
}

/* The leak check: with no live sequence, every block is free or cached with
 * refcount 0, nothing counts as used, and the invariants hold. */
static int check_no_leaks(const kv_pool *p)
{
    if (!check_tables(p, NULL, 0)) return 0;
    kv_stats st;
    kv_pool_stats(p, &st);
    if (st.used_blocks != 0 || st.used_tokens != 0 || st.free_blocks + st.cached_blocks != st.num_blocks)
        return 0;
    for (int b = 0; b < st.num_blocks; b++) {
        kv_block_info bi;
        kv_pool_block_info(p, b, &bi);
        if (bi.refcount != 0 || bi.state == KV_BLOCK_USED) return 0;
        if ((bi.state == KV_BLOCK_CACHED) != (bi.hashed != 0)) return 0;
    }
    return 1;
}

static int stats_equal(const kv_stats *a, const kv_stats *b)
{
    return a->free_blocks == b->free_blocks && a->used_blocks == b->used_blocks &&
           a->cached_blocks == b->cached_blocks && a->hashed_blocks == b->hashed_blocks &&
           a->used_tokens == b->used_tokens && a->hit_blocks == b->hit_blocks &&
           a->miss_blocks == b->miss_blocks && a->hit_tokens == b->hit_tokens &&
           a->miss_tokens == b->miss_tokens && a->evictions == b->evictions &&
           a->cow_copies == b->cow_copies && a->hash_collisions == b->hash_collisions;
}

/* ---- the pool ----------------------------------------------------------- */

static void test_create_errors(void)
{
    kv_pool *p = (kv_pool *)1;
    char err[128] = "";
    CHECK_EQ_INT(kv_pool_create(0, 16, FP, &p, err, sizeof err), QERR_RANGE);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(err, "at least one block");
    CHECK_EQ_INT(kv_pool_create(-5, 16, FP, &p, NULL, 0), QERR_RANGE);
    CHECK_EQ_INT(kv_pool_create(8, 0, FP, &p, NULL, 0), QERR_RANGE);
    CHECK_EQ_INT(kv_pool_create(8, -16, FP, &p, NULL, 0), QERR_RANGE);
    CHECK_EQ_INT(kv_pool_create(8, KV_MAX_BLOCK_SIZE + 1, FP, &p, NULL, 0), QERR_RANGE);
    CHECK_EQ_INT(kv_pool_create(INT_MAX, 16, FP, &p, err, sizeof err), QERR_RANGE);
    CHECK_STR_CONTAINS(err, "exceeds");
    CHECK_EQ_INT(kv_pool_create(INT_MAX, INT_MAX, FP, &p, NULL, 0), QERR_RANGE);
    CHECK_EQ_INT(kv_pool_create(8, 16, NULL, &p, NULL, 0), QERR_INVAL);
    CHECK_EQ_INT(kv_pool_create(8, 16, FP, NULL, NULL, 0), QERR_INVAL);
    /* Allocation failure is an error, not a crash. */
    q_set_alloc_limit((size_t)1 << 20);
    CHECK_EQ_INT(kv_pool_create(1 << 20, 16, FP, &p, err, sizeof err), QERR_NOMEM);
    CHECK(p == NULL);
    q_set_alloc_limit((size_t)64 << 30);
    kv_pool_destroy(NULL);

    p = mk(10, 16);
    REQUIRE(p);
    CHECK_EQ_INT(kv_pool_num_blocks(p), 10);
    CHECK_EQ_INT(kv_pool_block_size(p), 16);
    CHECK_EQ_INT(kv_pool_num_free(p), 10);
    CHECK_EQ_INT(kv_pool_num_used(p), 0);
    CHECK_EQ_INT(kv_pool_num_cached(p), 0);
    CHECK(check_no_leaks(p));
    kv_block_info bi;
    CHECK_EQ_INT(kv_pool_block_info(p, -1, &bi), QERR_RANGE);
    CHECK_EQ_INT(kv_pool_block_info(p, 10, &bi), QERR_RANGE);
    CHECK_EQ_INT(kv_pool_set_hash_bits(p, 0), QERR_RANGE);
    CHECK_EQ_INT(kv_pool_set_hash_bits(p, 129), QERR_RANGE);
    kv_pool_destroy(p);
}

/* ---- allocation --------------------------------------------------------- */

static void test_alloc_as_tokens_arrive(void)
{
    kv_pool *p = mk(10, 4);
    REQUIRE(p);
    kv_seq s;
    kv_seq_init(&s);
    kv_seq *all[] = {&s};
    CHECK_EQ_INT(kv_seq_append(p, &s, NULL, 0), 0);
    CHECK_EQ_INT(s.n_blocks, 0);
    CHECK_EQ_INT(kv_pool_num_used(p), 0);
    for (int t = 1; t <= 13; t++) {
        int32_t tok = 100 + t;
        CHECK_EQ_INT(kv_seq_blocks_needed(p, &s, 1), (t - 1) % 4 == 0 ? 1 : 0);
        CHECK_EQ_INT(kv_seq_append(p, &s, &tok, 1), 0);
        CHECK_EQ_INT(s.n_tokens, t);
        CHECK_EQ_INT(s.n_blocks, (t + 3) / 4);
        CHECK_EQ_INT(kv_pool_num_used(p), (t + 3) / 4);
        CHECK_EQ_INT(kv_pool_num_free(p), 10 - (t + 3) / 4);
        CHECK_EQ_INT(s.tokens[t - 1], 100 + t);
    }
    /* Fresh blocks come in order from the never-used ones. */
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(s.blocks[i], i);
    /* A batch: 3 more fill block 3, 5 more open two blocks. */
    int32_t ids[8];
    fill_ids(ids, 8, 500);
    CHECK_EQ_INT(kv_seq_blocks_needed(p, &s, 3), 0);
    CHECK_EQ_INT(kv_seq_blocks_needed(p, &s, 8), 2);
    CHECK_EQ_INT(kv_seq_append(p, &s, ids, 8), 0);
    CHECK_EQ_INT(s.n_tokens, 21);
    CHECK_EQ_INT(s.n_blocks, 6);
    CHECK(check_tables(p, all, 1));
    kv_seq_free(p, &s);
    CHECK_EQ_INT(s.n_blocks, 0);
    CHECK(s.blocks == NULL && s.tokens == NULL);
    kv_seq_free(p, NULL);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

static void test_exhaustion_leaves_state(void)
{
    kv_pool *p = mk(5, 4); /* 20 token slots */
    REQUIRE(p);
    kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq *all[] = {&a, &b};
    int32_t ids[32];
    fill_ids(ids, 32, 1);
    CHECK_EQ_INT(kv_seq_append(p, &a, ids, 10), 0); /* 3 blocks */
    CHECK_EQ_INT(kv_seq_append(p, &b, ids, 4), 0);  /* 1 block */
    CHECK_EQ_INT(kv_pool_num_free(p), 1);

    kv_stats before, after;
    kv_pool_stats(p, &before);
    /* b: 4 more tokens take the last block, 5 more need two. */
    CHECK_EQ_INT(kv_seq_blocks_needed(p, &b, 4), 1);
    CHECK_EQ_INT(kv_seq_blocks_needed(p, &b, 5), 2);
    CHECK_EQ_INT(kv_seq_can_append(p, &b, 4), 1);
    CHECK_EQ_INT(kv_seq_can_append(p, &b, 5), 0);
    CHECK_EQ_INT(kv_seq_append(p, &b, ids, 8), QERR_BUSY);
    CHECK_EQ_INT(b.n_tokens, 4);
    CHECK_EQ_INT(b.n_blocks, 1);
    /* a: 2 more tokens fit its last block, 6 more need one block, 7 two. */
    CHECK_EQ_INT(kv_seq_blocks_needed(p, &a, 2), 0);
    CHECK_EQ_INT(kv_seq_can_append(p, &a, 6), 1);
    CHECK_EQ_INT(kv_seq_can_append(p, &a, 7), 0);
    CHECK_EQ_INT(kv_seq_append(p, &a, ids, 7), QERR_BUSY);
    CHECK_EQ_INT(a.n_tokens, 10);
    CHECK_EQ_INT(a.n_blocks, 3);
    CHECK(!memcmp(a.tokens, ids, 10 * sizeof(int32_t)));
    /* More than the pool can ever hold: a different error. */
    CHECK_EQ_INT(kv_seq_blocks_needed(p, &b, 17), QERR_LIMIT);
    CHECK_EQ_INT(kv_seq_append(p, &b, ids, 17), QERR_LIMIT);
    CHECK_EQ_INT(kv_seq_append(p, &a, ids, 11), QERR_LIMIT);
    /* An absurd count is refused before the ids are read. */
    CHECK_EQ_INT(kv_seq_append(p, &a, ids, INT_MAX), QERR_LIMIT);
    CHECK_EQ_INT(kv_seq_blocks_needed(p, &a, INT_MAX), QERR_LIMIT);
    CHECK_EQ_INT(kv_seq_can_append(p, &a, INT_MAX), 0);
    kv_pool_stats(p, &after);
    CHECK(stats_equal(&before, &after));
    CHECK_EQ_INT(a.n_tokens, 10);
    CHECK_EQ_INT(b.n_tokens, 4);
    CHECK(check_tables(p, all, 2));

    /* Freeing a makes room for b. */
    kv_seq_free(p, &a);
    CHECK_EQ_INT(kv_pool_num_free(p), 4);
    CHECK_EQ_INT(kv_seq_append(p, &b, ids, 16), 0);
    CHECK_EQ_INT(kv_pool_num_free(p), 0);
    CHECK_EQ_INT(b.n_tokens, 20);
    CHECK(check_tables(p, all, 2));
    kv_seq_free(p, &b);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

static void test_invalid_input(void)
{
    kv_pool *p = mk(8, 4);
    REQUIRE(p);
    kv_seq s, t;
    kv_seq_init(&s);
    kv_seq_init(&t);
    kv_seq *all[] = {&s, &t};
    int32_t ids[8];
    fill_ids(ids, 8, 0);
    int32_t bad[3] = {5, -1, 6};
    CHECK_EQ_INT(kv_seq_append(p, &s, bad, 3), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_append(p, &s, NULL, 2), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_append(p, &s, ids, -1), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_blocks_needed(p, &s, -1), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_can_append(p, &s, -1), 0);
    CHECK_EQ_INT(s.n_tokens, 0);
    CHECK_EQ_INT(kv_pool_num_free(p), 8);

    CHECK_EQ_INT(kv_seq_match_prefix(p, &s, bad, 3), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_match_prefix(p, &s, NULL, 3), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_match_prefix(p, &s, ids, -3), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_match_prefix(p, &s, NULL, 0), 0);

    CHECK_EQ_INT(kv_seq_append(p, &s, ids, 6), 0);
    CHECK_EQ_INT(kv_seq_match_prefix(p, &s, ids, 6), QERR_INVAL); /* not empty */
    CHECK_EQ_INT(kv_seq_commit(p, &s, -1), QERR_RANGE);
    CHECK_EQ_INT(kv_seq_commit(p, &s, 7), QERR_RANGE);
    CHECK_EQ_INT(kv_seq_commit(p, &s, INT_MAX), QERR_RANGE);
    CHECK_EQ_INT(kv_seq_truncate(p, &s, 7), QERR_RANGE);
    CHECK_EQ_INT(kv_seq_truncate(p, &s, -1), QERR_RANGE);
    CHECK_EQ_INT(kv_seq_fork(p, &s, &s), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_append(p, &t, ids, 1), 0);
    CHECK_EQ_INT(kv_seq_fork(p, &s, &t), QERR_INVAL); /* dst not empty */
    CHECK_EQ_INT(t.n_tokens, 1);
    CHECK_EQ_INT(refcount(p, s.blocks[0]), 1);

    /* Commit is idempotent and monotone. */
    CHECK_EQ_INT(kv_seq_commit(p, &s, 6), 1);
    CHECK_EQ_INT(kv_seq_commit(p, &s, 6), 0);
    CHECK_EQ_INT(kv_seq_commit(p, &s, 2), 0);
    CHECK_EQ_INT(s.n_hashed, 1);
    /* The hash bits hook is refused once blocks are hashed. */
    CHECK_EQ_INT(kv_pool_set_hash_bits(p, 8), QERR_BUSY);
    CHECK(check_tables(p, all, 2));
    kv_seq_free(p, &s);
    kv_seq_free(p, &t);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

static void test_nomem_all_or_nothing(void)
{
    /* A table that cannot grow fails the call and changes nothing. */
    kv_pool *p = mk(512, 4);
    REQUIRE(p);
    kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq *all[] = {&a, &b};
    static int32_t ids[1024];
    fill_ids(ids, 1024, 0);
    CHECK_EQ_INT(kv_seq_append(p, &a, ids, 1000), 0);
    CHECK_EQ_INT(kv_seq_commit(p, &a, 1000), 250);
    kv_stats before, after;
    kv_pool_stats(p, &before);

    q_set_alloc_limit(512);
    CHECK_EQ_INT(kv_seq_append(p, &b, ids, 1000), QERR_NOMEM);
    CHECK_EQ_INT(kv_seq_match_prefix(p, &b, ids, 1001), QERR_NOMEM);
    CHECK_EQ_INT(kv_seq_fork(p, &a, &b), QERR_NOMEM);
    CHECK_EQ_INT(kv_seq_append(p, &a, ids, 1000), QERR_NOMEM);
    q_set_alloc_limit((size_t)64 << 30);
    CHECK_EQ_INT(b.n_tokens, 0);
    CHECK_EQ_INT(b.n_blocks, 0);
    CHECK_EQ_INT(a.n_tokens, 1000);
    kv_pool_stats(p, &after);
    CHECK(stats_equal(&before, &after));
    CHECK(check_tables(p, all, 2));

    CHECK_EQ_INT(kv_seq_match_prefix(p, &b, ids, 1001), 1000);
    CHECK(check_tables(p, all, 2));
    kv_seq_free(p, &a);
    kv_seq_free(p, &b);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

/* ---- prefix cache ------------------------------------------------------- */

static void test_prefix_reuse(void)
{
    kv_pool *p = mk(32, 4);
    REQUIRE(p);
    kv_seq a, b, c, d;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    kv_seq_init(&d);
    kv_seq *all[] = {&a, &b, &c, &d};
    int32_t prompt[18];
    fill_ids(prompt, 18, 1000);

    /* a computes the prompt: 4 full blocks and a partial one. */
    CHECK_EQ_INT(kv_seq_match_prefix(p, &a, prompt, 18), 0);
    CHECK_EQ_INT(kv_seq_append(p, &a, prompt, 18), 0);
    CHECK_EQ_INT(kv_seq_commit(p, &a, 18), 4);
    CHECK_EQ_INT(a.n_hashed, 4);
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.hashed_blocks, 4);
    CHECK_EQ_INT(st.hit_blocks, 0);
    CHECK_EQ_INT(st.miss_blocks, 4);
    CHECK_EQ_INT(st.miss_tokens, 18);

    /* b: the same prompt reuses exactly the 4 full blocks. */
    CHECK_EQ_INT(kv_seq_match_prefix(p, &b, prompt, 18), 16);
    CHECK_EQ_INT(b.n_blocks, 4);
    CHECK_EQ_INT(b.n_tokens, 16);
    CHECK_EQ_INT(b.n_hashed, 4);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(b.blocks[i], a.blocks[i]);
        CHECK_EQ_INT(refcount(p, a.blocks[i]), 2);
    }
    CHECK(!memcmp(b.tokens, prompt, 16 * sizeof(int32_t)));
    CHECK(!memcmp(b.hash, a.hash, KV_HASH_BYTES));
    CHECK_EQ_INT(kv_seq_append(p, &b, prompt + 16, 2), 0);
    CHECK(b.blocks[4] != a.blocks[4]);
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.hit_blocks, 4);
    CHECK_EQ_INT(st.hit_tokens, 16);
    CHECK_EQ_INT(st.miss_blocks, 4);
    CHECK_EQ_INT(st.miss_tokens, 18 + 2);

    /* c: a different token in block 2 reuses blocks 0 and 1 only. */
    int32_t other[18];
    memcpy(other, prompt, sizeof other);
    other[9] = 7;
    CHECK_EQ_INT(kv_seq_match_prefix(p, &c, other, 18), 8);
    CHECK_EQ_INT(c.n_blocks, 2);
    CHECK_EQ_INT(refcount(p, a.blocks[1]), 3);
    CHECK_EQ_INT(refcount(p, a.blocks[2]), 2);
    /* The rest of c is computed and committed: its block 2 is a new chain
     * link, and block 3 (same tokens as a's, other parent) is new too. */
    CHECK_EQ_INT(kv_seq_append(p, &c, other + 8, 10), 0);
    CHECK_EQ_INT(kv_seq_commit(p, &c, 18), 2);
    CHECK(c.blocks[3] != a.blocks[3]);

    /* d: a different first token reuses nothing. */
    other[9] = prompt[9];
    other[0] = 1;
    CHECK_EQ_INT(kv_seq_match_prefix(p, &d, other, 18), 0);
    CHECK_EQ_INT(d.n_blocks, 0);
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.hit_blocks, 4 + 2);
    CHECK_EQ_INT(st.miss_blocks, 4 + 2 + 4);
    CHECK_EQ_INT(st.hit_tokens, 16 + 8);
    CHECK_EQ_INT(st.miss_tokens, 18 + 2 + 10 + 18);
    CHECK(check_tables(p, all, 4));

    /* A fingerprint is part of the hash: another model finds nothing. */
    uint8_t fp2[KV_HASH_BYTES] = {9};
    kv_pool *q = NULL;
    REQUIRE(kv_pool_create(32, 4, fp2, &q, NULL, 0) == 0);
    kv_seq e;
    kv_seq_init(&e);
    CHECK_EQ_INT(kv_seq_append(q, &e, prompt, 18), 0);
    kv_seq_commit(q, &e, 18);
    kv_block_info bq, bp;
    kv_pool_block_info(q, e.blocks[0], &bq);
    kv_pool_block_info(p, a.blocks[0], &bp);
    CHECK(bq.hashed && bp.hashed && memcmp(bq.hash, bp.hash, KV_HASH_BYTES) != 0);
    CHECK(!memcmp(bp.tokens, prompt, 4 * sizeof(int32_t)));
    kv_seq_free(q, &e);
    kv_pool_destroy(q);

    for (int i = 0; i < 4; i++) kv_seq_free(p, all[i]);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

static void test_never_whole_prompt(void)
{
    kv_pool *p = mk(16, 4);
    REQUIRE(p);
    kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    int32_t prompt[17];
    fill_ids(prompt, 17, 50);
    CHECK_EQ_INT(kv_seq_append(p, &a, prompt, 17), 0);
    CHECK_EQ_INT(kv_seq_commit(p, &a, 17), 4);
    kv_seq_free(p, &a);
    CHECK_EQ_INT(kv_pool_num_cached(p), 4);

    /* The final token must be computed for its logits: a 16-token prompt,
     * all of it cached, reuses 12 tokens. */
    const int lens[] = {0, 1, 4, 5, 8, 15, 16, 17};
    const int want[] = {0, 0, 0, 4, 4, 12, 12, 16};
    for (int i = 0; i < 8; i++) {
        int r = kv_seq_match_prefix(p, &b, prompt, lens[i]);
        CHECK_EQ_INT(r, want[i]);
        CHECK(r < lens[i] || lens[i] == 0);
        kv_seq_free(p, &b);
    }
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

static void test_cached_lru_eviction(void)
{
    /* 6 blocks of 4.  Prompts of 9 tokens: 2 full blocks + 1 partial. */
    kv_pool *p = mk(6, 4);
    REQUIRE(p);
    kv_seq a, b, c, d;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    kv_seq_init(&d);
    int32_t pa[9], pb[9], junk[12];
    fill_ids(pa, 9, 100);
    fill_ids(pb, 9, 200);
    fill_ids(junk, 12, 300);

    CHECK_EQ_INT(kv_seq_append(p, &a, pa, 9), 0);
    CHECK_EQ_INT(kv_seq_commit(p, &a, 9), 2);
    int a0 = a.blocks[0], a1 = a.blocks[1];
    kv_seq_free(p, &a);
    CHECK_EQ_INT(kv_pool_num_cached(p), 2);  /* full + hashed: cached */
    CHECK_EQ_INT(kv_pool_num_free(p), 4);    /* the partial block: free */
    CHECK_EQ_INT(refcount(p, a0), 0);

    CHECK_EQ_INT(kv_seq_append(p, &b, pb, 9), 0);
    /* Free blocks are taken before cached ones: a's blocks survive. */
    CHECK(b.blocks[0] != a0 && b.blocks[1] != a0 && b.blocks[0] != a1 && b.blocks[1] != a1);
    CHECK_EQ_INT(kv_seq_commit(p, &b, 9), 2);
    int b1 = b.blocks[1];
    kv_seq_free(p, &b);
    CHECK_EQ_INT(kv_pool_num_cached(p), 4);
    CHECK_EQ_INT(kv_pool_num_free(p), 2);

    /* Found again after the free; d touches a's blocks, so the LRU order
     * becomes b1, b0, a1, a0 (each sequence released last block first). */
    CHECK_EQ_INT(kv_seq_match_prefix(p, &d, pa, 9), 8);
    CHECK_EQ_INT(d.blocks[0], a0);
    CHECK_EQ_INT(d.blocks[1], a1);
    CHECK_EQ_INT(kv_pool_num_cached(p), 2);
    kv_seq_free(p, &d);

    /* Pressure: 12 tokens need 3 blocks, 2 free + 1 evicted: b1. */
    CHECK_EQ_INT(kv_seq_append(p, &c, junk, 12), 0);
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.evictions, 1);
    CHECK_EQ_INT(c.blocks[2], b1);
    kv_block_info bi;
    kv_pool_block_info(p, b1, &bi);
    CHECK(!bi.hashed && bi.state == KV_BLOCK_USED);
    kv_seq_free(p, &c);

    CHECK_EQ_INT(kv_seq_match_prefix(p, &d, pb, 9), 4); /* b0 still there */
    kv_seq_free(p, &d);
    CHECK_EQ_INT(kv_seq_match_prefix(p, &d, pa, 9), 8); /* a untouched */
    kv_seq_free(p, &d);

    /* LRU now: b0, a1, a0 (then c's 3 unhashed blocks are free).  Taking
     * all 6 blocks evicts in that order. */
    int32_t big[24];
    fill_ids(big, 24, 400);
    CHECK_EQ_INT(kv_seq_append(p, &c, big, 24), 0);
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.evictions, 4);
    CHECK_EQ_INT(st.cached_blocks, 0);
    CHECK_EQ_INT(c.blocks[4], a1); /* after 3 free and b0 */
    CHECK_EQ_INT(c.blocks[5], a0);
    kv_seq_free(p, &c);
    CHECK_EQ_INT(kv_seq_match_prefix(p, &d, pa, 9), 0);
    kv_seq_free(p, &d);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

static void test_commit_no_dedupe(void)
{
    /* Two sequences compute the same prompt at once: the first commit is
     * canonical, the second block stays unhashed and is freed, not cached. */
    kv_pool *p = mk(8, 4);
    REQUIRE(p);
    kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq *all[] = {&a, &b};
    int32_t prompt[9];
    fill_ids(prompt, 9, 7);
    CHECK_EQ_INT(kv_seq_append(p, &a, prompt, 9), 0);
    CHECK_EQ_INT(kv_seq_append(p, &b, prompt, 9), 0);
    CHECK_EQ_INT(kv_seq_commit(p, &a, 9), 2);
    CHECK_EQ_INT(kv_seq_commit(p, &b, 9), 0);
    CHECK_EQ_INT(b.n_hashed, 2);
    CHECK(!memcmp(a.hash, b.hash, KV_HASH_BYTES));
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.hashed_blocks, 2);
    CHECK_EQ_INT(st.hash_collisions, 0);
    CHECK(check_tables(p, all, 2));
    kv_seq_free(p, &b);
    CHECK_EQ_INT(kv_pool_num_cached(p), 0);
    kv_seq_free(p, &a);
    CHECK_EQ_INT(kv_pool_num_cached(p), 2);
    CHECK_EQ_INT(kv_pool_num_free(p), 6);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

static void test_collision_defence(void)
{
    /* With 1 hash bit every other block hash collides.  A hit must still
     * need equal tokens, parent and depth. */
    kv_pool *p = mk(64, 4);
    REQUIRE(p);
    CHECK_EQ_INT(kv_pool_set_hash_bits(p, 1), 0);
    kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    int32_t pa[9];
    fill_ids(pa, 9, 10);
    CHECK_EQ_INT(kv_seq_append(p, &a, pa, 9), 0);
    int reg = kv_seq_commit(p, &a, 9);
    CHECK(reg == 1 || reg == 2);
    kv_seq_free(p, &a);

    /* The genuine prompt is found (as far as it was registered). */
    CHECK_EQ_INT(kv_seq_match_prefix(p, &b, pa, 9), 4 * reg);
    kv_seq_free(p, &b);

    /* 32 other prompts: about half hash like pa's first block.  None may
     * reuse anything. */
    kv_stats st;
    kv_pool_stats(p, &st);
    uint64_t coll0 = st.hash_collisions;
    for (int k = 0; k < 32; k++) {
        int32_t other[9];
        fill_ids(other, 9, 1000 + 16 * k);
        CHECK_EQ_INT(kv_seq_match_prefix(p, &b, other, 9), 0);
        kv_seq_free(p, &b);
    }
    kv_pool_stats(p, &st);
    CHECK(st.hash_collisions > coll0);
    CHECK_EQ_INT(st.hit_blocks, (uint64_t)reg);
    /* Same tokens in block 0 as pa's block 1, at depth 0: not a hit even
     * when the hashes agree. */
    CHECK_EQ_INT(kv_seq_match_prefix(p, &b, pa + 4, 5), 0);
    kv_seq_free(p, &b);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

static void test_collision_depth(void)
{
    /* With 1 hash bit, a chain whose block 0 hashes to zero gives block 1
     * the same parent bytes as a block 0 has: block 1's tokens, probed at
     * depth 0, then agree in hash, parent and tokens.  Only the depth tells
     * them apart (position 4..7 K/V is not position 0..3 K/V).  Search for
     * such a chain, then probe it. */
    int found = 0;
    for (int k = 0; k < 128 && !found; k++) {
        kv_pool *p = mk(8, 4);
        REQUIRE(p);
        REQUIRE(kv_pool_set_hash_bits(p, 1) == 0);
        kv_seq a;
        kv_seq_init(&a);
        int32_t pa[9];
        fill_ids(pa, 9, 5000 + 16 * k);
        CHECK_EQ_INT(kv_seq_append(p, &a, pa, 9), 0);
        kv_seq_commit(p, &a, 9);
        kv_block_info b0, b1;
        kv_pool_block_info(p, a.blocks[0], &b0);
        kv_pool_block_info(p, a.blocks[1], &b1);
        static const uint8_t zero[KV_HASH_BYTES];
        if (b0.hashed && b1.hashed && !memcmp(b0.hash, zero, KV_HASH_BYTES)) {
            found = 1;
            kv_seq_free(p, &a);
            kv_seq probe;
            kv_seq_init(&probe);
            CHECK_EQ_INT(kv_seq_match_prefix(p, &probe, pa + 4, 5), 0);
            kv_stats st;
            kv_pool_stats(p, &st);
            CHECK_EQ_INT(st.hash_collisions, 1);
            kv_seq_free(p, &probe);
            CHECK_EQ_INT(kv_seq_match_prefix(p, &probe, pa, 9), 8);
            kv_seq_free(p, &probe);
        }
        kv_seq_free(p, &a);
        CHECK(check_no_leaks(p));
        kv_pool_destroy(p);
    }
    CHECK(found);
}

/* ---- copy-on-write -------------------------------------------------------- */

static void test_fork_cow(void)
{
    kv_pool *p = mk(16, 4);
    REQUIRE(p);
    kv_seq a, b, c;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    kv_seq *all[] = {&a, &b, &c};
    int32_t prompt[6];
    fill_ids(prompt, 6, 20);
    CHECK_EQ_INT(kv_seq_append(p, &a, prompt, 6), 0);
    CHECK_EQ_INT(kv_seq_commit(p, &a, 6), 1);
    int b0 = a.blocks[0], b1 = a.blocks[1];
    CHECK_EQ_INT(kv_seq_fork(p, &a, &b), 0);
    CHECK_EQ_INT(kv_seq_fork(p, &a, &c), 0);
    CHECK_EQ_INT(refcount(p, b0), 3);
    CHECK_EQ_INT(refcount(p, b1), 3);
    CHECK_EQ_INT(b.n_tokens, 6);
    CHECK_EQ_INT(b.n_hashed, 1);
    CHECK(!memcmp(b.tokens, prompt, sizeof prompt));
    CHECK(check_tables(p, all, 3));
    /* Forking shares: no block is allocated. */
    CHECK_EQ_INT(kv_pool_num_used(p), 2);

    /* Each writer of the shared partial block gets its own copy... */
    int32_t t = 99;
    CHECK_EQ_INT(kv_seq_blocks_needed(p, &b, 1), 1);
    CHECK_EQ_INT(kv_seq_append(p, &b, &t, 1), QERR_INVAL); /* must prepare first */
    CHECK_EQ_INT(b.n_tokens, 6);
    int src = -1, dst = -1;
    CHECK_EQ_INT(kv_seq_prepare_write(p, &a, &src, &dst), 1);
    CHECK_EQ_INT(src, b1);
    CHECK(dst != b1 && dst != b0);
    CHECK_EQ_INT(a.blocks[1], dst);
    CHECK_EQ_INT(a.blocks[0], b0);
    CHECK_EQ_INT(refcount(p, b1), 2);
    CHECK_EQ_INT(refcount(p, dst), 1);
    CHECK_EQ_INT(kv_seq_prepare_write(p, &a, &src, &dst), 0); /* now a's own */
    CHECK_EQ_INT(kv_seq_append(p, &a, &t, 1), 0);
    CHECK_EQ_INT(kv_seq_prepare_write(p, &b, &src, &dst), 1);
    CHECK_EQ_INT(src, b1);
    CHECK_EQ_INT(kv_seq_append(p, &b, &t, 1), 0);
    /* ...but the last holder writes in place. */
    src = dst = -7;
    CHECK_EQ_INT(kv_seq_blocks_needed(p, &c, 1), 0);
    CHECK_EQ_INT(kv_seq_prepare_write(p, &c, &src, &dst), 0);
    CHECK(src == -7 && dst == -7);
    CHECK_EQ_INT(kv_seq_append(p, &c, &t, 1), 0);
    CHECK_EQ_INT(c.blocks[1], b1);
    CHECK_EQ_INT(refcount(p, b0), 3); /* full blocks stay shared */
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.cow_copies, 2);
    CHECK(check_tables(p, all, 3));

    /* A full last block is never copied: the next token opens a new one. */
    int32_t one = 5;
    CHECK_EQ_INT(kv_seq_append(p, &a, &one, 1), 0); /* a: 8 tokens */
    kv_seq_free(p, &b);
    CHECK_EQ_INT(kv_seq_fork(p, &a, &b), 0);
    CHECK_EQ_INT(kv_seq_prepare_write(p, &b, &src, &dst), 0);
    CHECK_EQ_INT(kv_seq_append(p, &b, &one, 1), 0);
    CHECK_EQ_INT(b.n_blocks, 3);
    CHECK_EQ_INT(refcount(p, a.blocks[1]), 2);
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.cow_copies, 2);
    CHECK(check_tables(p, all, 3));

    /* Copy-on-write needs a block too: refused when the pool is dry. */
    kv_seq_free(p, &b);
    kv_seq_free(p, &c);
    int32_t five[5] = {1, 2, 3, 4, 5};
    kv_seq_free(p, &a);
    CHECK_EQ_INT(kv_seq_append(p, &a, five, 5), 0);
    CHECK_EQ_INT(kv_seq_fork(p, &a, &b), 0);
    int32_t filler[64];
    fill_ids(filler, 64, 0);
    int room = kv_pool_num_allocatable(p);
    CHECK_EQ_INT(kv_seq_append(p, &c, filler, room * 4), 0);
    CHECK_EQ_INT(kv_seq_can_append(p, &b, 1), 0);
    CHECK_EQ_INT(kv_seq_prepare_write(p, &b, &src, &dst), QERR_BUSY);
    CHECK_EQ_INT(b.blocks[1], a.blocks[1]);
    CHECK(check_tables(p, all, 3));
    for (int i = 0; i < 3; i++) kv_seq_free(p, all[i]);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

static void test_hashed_blocks_immutable(void)
{
    /* b forks a before a commits, then truncates into a block a hashed.
     * Even after a is gone (b holds it alone), b must copy it. */
    kv_pool *p = mk(8, 4);
    REQUIRE(p);
    kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq *all[] = {&a, &b};
    int32_t prompt[8];
    fill_ids(prompt, 8, 60);
    CHECK_EQ_INT(kv_seq_append(p, &a, prompt, 8), 0);
    CHECK_EQ_INT(kv_seq_fork(p, &a, &b), 0);
    CHECK_EQ_INT(kv_seq_commit(p, &a, 8), 2);
    CHECK_EQ_INT(b.n_hashed, 0);
    CHECK_EQ_INT(kv_seq_truncate(p, &b, 6), 0);
    int h1 = b.blocks[1];
    CHECK_EQ_INT(h1, a.blocks[1]);
    kv_seq_free(p, &a);
    CHECK_EQ_INT(refcount(p, h1), 1);
    int src = -1, dst = -1;
    CHECK_EQ_INT(kv_seq_prepare_write(p, &b, &src, &dst), 1);
    CHECK_EQ_INT(src, h1);
    kv_block_info bi;
    kv_pool_block_info(p, h1, &bi);
    CHECK(bi.state == KV_BLOCK_CACHED && bi.hashed && bi.fill == 4);
    CHECK(!memcmp(bi.tokens, prompt + 4, 4 * sizeof(int32_t)));
    int32_t t = 1;
    CHECK_EQ_INT(kv_seq_append(p, &b, &t, 1), 0);
    CHECK(check_tables(p, all, 2));
    /* The cached block still serves a's prompt. */
    kv_seq_init(&a);
    CHECK_EQ_INT(kv_seq_match_prefix(p, &a, prompt, 8), 4);
    kv_seq_free(p, &a);
    int32_t p9[9];
    memcpy(p9, prompt, sizeof prompt);
    p9[8] = 0;
    CHECK_EQ_INT(kv_seq_match_prefix(p, &a, p9, 9), 8);
    CHECK_EQ_INT(a.blocks[1], h1);
    kv_seq_free(p, &a);
    kv_seq_free(p, &b);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

static void test_truncate(void)
{
    kv_pool *p = mk(8, 4);
    REQUIRE(p);
    kv_seq s;
    kv_seq_init(&s);
    kv_seq *all[] = {&s};
    int32_t ids[10];
    fill_ids(ids, 10, 3);
    CHECK_EQ_INT(kv_seq_append(p, &s, ids, 10), 0);
    CHECK_EQ_INT(kv_seq_truncate(p, &s, 5), 0);
    CHECK_EQ_INT(s.n_tokens, 5);
    CHECK_EQ_INT(s.n_blocks, 2);
    CHECK_EQ_INT(kv_pool_num_used(p), 2);
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.used_tokens, 5);
    CHECK_EQ_INT(kv_seq_commit(p, &s, 5), 1);
    CHECK_EQ_INT(kv_seq_truncate(p, &s, 3), QERR_RANGE); /* into a hashed block */
    CHECK_EQ_INT(s.n_tokens, 5);
    CHECK_EQ_INT(kv_seq_truncate(p, &s, 4), 0);
    CHECK_EQ_INT(s.n_blocks, 1);
    CHECK_EQ_INT(kv_seq_append(p, &s, ids, 3), 0);
    CHECK_EQ_INT(s.n_tokens, 7);
    CHECK(check_tables(p, all, 1));
    kv_seq_free(p, &s);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

/* A block's generation moves exactly when it is handed out again: not while
 * it is held, nor when a cached block is found again by a prefix match. */
static void test_block_gen(void)
{
    kv_pool *p = mk(2, 4);
    REQUIRE(p);
    CHECK_EQ_INT(kv_pool_block_gen(p, 0), 0);
    CHECK_EQ_INT(kv_pool_block_gen(p, -1), 0);
    CHECK_EQ_INT(kv_pool_block_gen(p, 2), 0);
    kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    int32_t ids[8];
    fill_ids(ids, 8, 1);
    CHECK_EQ_INT(kv_seq_append(p, &a, ids, 5), 0);
    const int b0 = a.blocks[0], b1 = a.blocks[1];
    const uint32_t g0 = kv_pool_block_gen(p, b0), g1 = kv_pool_block_gen(p, b1);
    CHECK(g0 >= 1 && g1 >= 1);
    CHECK_EQ_INT(kv_seq_append(p, &a, ids + 5, 2), 0);  /* writes into a held block */
    CHECK_EQ_INT(kv_pool_block_gen(p, b1), g1);
    CHECK_EQ_INT(kv_seq_commit(p, &a, 7), 1);
    kv_seq_free(p, &a);                                  /* b0 cached, b1 free */
    CHECK_EQ_INT(kv_seq_match_prefix(p, &b, ids, 6), 4); /* b0 found again */
    CHECK_EQ_INT(b.blocks[0], b0);
    CHECK_EQ_INT(kv_pool_block_gen(p, b0), g0);
    CHECK_EQ_INT(kv_seq_append(p, &b, ids + 4, 2), 0);   /* b1 handed out again */
    CHECK_EQ_INT(b.blocks[1], b1);
    CHECK_EQ_INT(kv_pool_block_gen(p, b1), g1 + 1);
    kv_seq_free(p, &b);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

/* ---- statistics --------------------------------------------------------- */

/* Swapping: only blocks held alone leave; shared ones keep the reference;
 * a swapped-out sequence is refused by every writer; swap-in refills the
 * holes (all or nothing) with the right fills. */
static void test_swap_out_in(void)
{
    kv_pool *p = mk(8, 4);
    REQUIRE(p);
    kv_seq a, b, c;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    kv_seq *all[] = {&a, &b, &c};
    int32_t ids[16], idx[8], src, dst;
    fill_ids(ids, 16, 30);
    CHECK_EQ_INT(kv_seq_append(p, &a, ids, 10), 0); /* 3 blocks, the last holds 2 */
    CHECK_EQ_INT(kv_seq_commit(p, &a, 10), 2);
    CHECK_EQ_INT(kv_seq_fork(p, &a, &b), 0);
    CHECK_EQ_INT(kv_seq_exclusive_blocks(p, &b, idx), 0); /* all shared */
    CHECK_EQ_INT(kv_seq_prepare_write(p, &b, &src, &dst), 1);
    CHECK_EQ_INT(kv_seq_append(p, &b, ids + 10, 3), 0); /* 13 tokens: block 2 its copy, block 3 new */
    int shared0 = b.blocks[0], shared1 = b.blocks[1];
    CHECK_EQ_INT(kv_seq_exclusive_blocks(p, &b, idx), 2);
    CHECK(idx[0] == 2 && idx[1] == 3);
    CHECK_EQ_INT(kv_seq_swap_out(p, &b, idx, 0), QERR_INVAL);
    int32_t bad[2] = {3, 2}, shared[1] = {0};
    CHECK_EQ_INT(kv_seq_swap_out(p, &b, bad, 2), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_swap_out(p, &b, shared, 1), QERR_INVAL);
    CHECK_EQ_INT(kv_pool_num_used(p), 5);
    CHECK_EQ_INT(kv_seq_swap_out(p, &b, idx, 2), 0);
    CHECK(b.blocks[0] == shared0 && b.blocks[1] == shared1 && b.blocks[2] == KV_SWAPPED_OUT &&
          b.blocks[3] == KV_SWAPPED_OUT);
    CHECK_EQ_INT(b.n_swapped, 2);
    CHECK_EQ_INT(b.n_tokens, 13);
    CHECK_EQ_INT(refcount(p, shared0), 2); /* kept: cannot be evicted */
    CHECK_EQ_INT(kv_pool_num_used(p), 3);
    CHECK(check_tables(p, all, 3));
    /* Parked: every writer refuses it. */
    int32_t t = 7;
    CHECK_EQ_INT(kv_seq_append(p, &b, &t, 1), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_prepare_write(p, &b, &src, &dst), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_commit(p, &b, 12), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_truncate(p, &b, 12), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_fork(p, &b, &c), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_swap_out(p, &b, idx, 2), QERR_INVAL);
    CHECK_EQ_INT(kv_seq_exclusive_blocks(p, &b, idx), 0);
    /* Its next token lands in block 3, its own once refilled: no copy. */
    CHECK_EQ_INT(kv_seq_blocks_needed(p, &b, 1), 0);
    /* Swap-in is all or nothing. */
    int room = kv_pool_num_allocatable(p);
    CHECK_EQ_INT(kv_seq_append(p, &c, ids, (room - 1) * 4), 0);
    kv_stats st0, st1;
    kv_pool_stats(p, &st0);
    CHECK_EQ_INT(kv_seq_swap_in(p, &b, idx), QERR_BUSY);
    kv_pool_stats(p, &st1);
    CHECK(stats_equal(&st0, &st1) && b.n_swapped == 2);
    kv_seq_free(p, &c);
    CHECK_EQ_INT(kv_seq_swap_in(p, &b, idx), 2);
    CHECK(idx[0] == 2 && idx[1] == 3);
    CHECK_EQ_INT(b.n_swapped, 0);
    CHECK(b.blocks[2] >= 0 && b.blocks[3] >= 0 && b.blocks[2] != b.blocks[3]);
    kv_block_info bi;
    kv_pool_block_info(p, b.blocks[2], &bi);
    CHECK(bi.fill == 4 && bi.refcount == 1 && !bi.hashed);
    kv_pool_block_info(p, b.blocks[3], &bi);
    CHECK(bi.fill == 1 && bi.refcount == 1);
    CHECK_EQ_INT(kv_seq_swap_in(p, &b, idx), 0); /* nothing to do */
    CHECK(check_tables(p, all, 3));
    /* Live again: it writes in place and commits on. */
    CHECK_EQ_INT(kv_seq_prepare_write(p, &b, &src, &dst), 0);
    CHECK_EQ_INT(kv_seq_append(p, &b, ids + 13, 3), 0);
    CHECK(kv_seq_commit(p, &b, 16) >= 1);
    CHECK(check_tables(p, all, 3));
    /* Freeing a swapped-out sequence skips its holes. */
    CHECK_EQ_INT(kv_seq_exclusive_blocks(p, &b, idx), 2);
    CHECK_EQ_INT(kv_seq_swap_out(p, &b, idx, 2), 0);
    kv_seq_free(p, &b);
    kv_seq_free(p, &a);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

static void test_stats_utilisation(void)
{
    kv_pool *p = mk(8, 4);
    REQUIRE(p);
    kv_seq a, b, c;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    int32_t ids[8];
    fill_ids(ids, 8, 1);
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.num_blocks, 8);
    CHECK_EQ_INT(st.block_size, 4);
    CHECK(st.utilisation == 0.0);

    CHECK_EQ_INT(kv_seq_append(p, &a, ids, 5), 0); /* 2 blocks, 5 of 8 slots */
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.used_blocks, 2);
    CHECK_EQ_INT(st.used_tokens, 5);
    CHECK(fabs(st.utilisation - 5.0 / 8) < 1e-12);

    CHECK_EQ_INT(kv_seq_append(p, &b, ids, 4), 0); /* + 1 full block */
    kv_pool_stats(p, &st);
    CHECK(fabs(st.utilisation - 9.0 / 12) < 1e-12);

    CHECK_EQ_INT(kv_seq_fork(p, &a, &c), 0); /* shared: counted once */
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.used_blocks, 3);
    CHECK(fabs(st.utilisation - 9.0 / 12) < 1e-12);

    int src, dst;
    CHECK_EQ_INT(kv_seq_prepare_write(p, &c, &src, &dst), 1); /* copy holds 1 token */
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.used_blocks, 4);
    CHECK(fabs(st.utilisation - 10.0 / 16) < 1e-12);
    CHECK_EQ_INT(kv_seq_append(p, &c, ids, 1), 0);
    kv_pool_stats(p, &st);
    CHECK(fabs(st.utilisation - 11.0 / 16) < 1e-12);
    CHECK_EQ_INT(st.free_blocks, 4);
    CHECK_EQ_INT(st.cached_blocks, 0);
    CHECK_EQ_INT(st.cow_copies, 1);

    CHECK_EQ_INT(kv_seq_commit(p, &b, 4), 1);
    kv_seq_free(p, &b);
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.used_blocks, 3);
    CHECK_EQ_INT(st.cached_blocks, 1);
    CHECK_EQ_INT(st.free_blocks, 4);
    CHECK_EQ_INT(st.used_tokens, 7);
    CHECK(fabs(st.utilisation - 7.0 / 12) < 1e-12);
    CHECK_EQ_INT(kv_pool_num_allocatable(p), 5);

    kv_seq_free(p, &a);
    kv_seq_free(p, &c);
    kv_pool_stats(p, &st);
    CHECK_EQ_INT(st.used_blocks, 0);
    CHECK(st.utilisation == 0.0);
    CHECK(check_no_leaks(p));
    kv_pool_destroy(p);
}

/* ---- randomized stress -------------------------------------------------- */

#define ST_SEQS 12
#define ST_BLOCKS 48
#define ST_BS 4
#define ST_VOCAB 3

static uint64_t rng_state;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* What the backend would hold.  The K/V of token i depends on tokens 0..i,
 * so a slot is modelled by an id of that whole prefix: shadow[b][slot] is
 * the prefix id of the token last written there (0: never written). */
static uint64_t shadow[ST_BLOCKS][ST_BS];

/* ids[i] = an id of tokens[0..i] (64-bit, collisions negligible here). */
static void prefix_ids(const int32_t *tok, int n, uint64_t *ids)
{
    uint64_t h = 0x243f6a8885a308d3ULL;
    for (int i = 0; i < n; i++) {
        h = (h ^ (uint64_t)(uint32_t)tok[i]) * 0x100000001b3ULL;
        h ^= h >> 29;
        ids[i] = h | 1;
    }
}

/* Every live sequence sees the K/V of its own prefix through its table. */
static int shadow_ok(kv_seq *const *seqs)
{
    uint64_t ids[ST_BLOCKS * ST_BS];
    for (int j = 0; j < ST_SEQS; j++) {
        const kv_seq *s = seqs[j];
        if (!s) continue;
        prefix_ids(s->tokens, s->n_tokens, ids);
        for (int i = 0; i < s->n_tokens; i++)
            if (shadow[s->blocks[i / ST_BS]][i % ST_BS] != ids[i]) {
                fprintf(stderr, "  seq %d token %d: block %d holds another prefix\n", j, i, s->blocks[i / ST_BS]);
                return 0;
            }
    }
    return 1;
}

/* Appends with the checks around it: can_append agrees, errors change
 * nothing, and written slots are in blocks the sequence alone may write. */
static int st_append(kv_pool *p, kv_seq *s, const int32_t *tok, int n)
{
    int can = kv_seq_can_append(p, s, n);
    int src = -1, dst = -1;
    int rc = kv_seq_prepare_write(p, s, &src, &dst);
    if (rc == 1) memcpy(shadow[dst], shadow[src], sizeof shadow[0]);
    if (rc < 0) {
        CHECK(!can);
        return rc;
    }
    int old = s->n_tokens, old_blocks = s->n_blocks;
    rc = kv_seq_append(p, s, tok, n);
    CHECK_EQ_INT(rc == 0, can);
    if (rc) {
        CHECK(s->n_tokens == old && s->n_blocks == old_blocks);
        CHECK(rc == QERR_BUSY || rc == QERR_LIMIT);
        return rc;
    }
    uint64_t ids[ST_BLOCKS * ST_BS];
    prefix_ids(s->tokens, s->n_tokens, ids);
    for (int i = old; i < s->n_tokens; i++) {
        int b = s->blocks[i / ST_BS];
        kv_block_info bi;
        kv_pool_block_info(p, b, &bi);
        CHECK(bi.refcount == 1 && !bi.hashed);
        shadow[b][i % ST_BS] = ids[i];
    }
    return 0;
}

static void stress(uint64_t seed, int hash_bits, int steps)
{
    rng_state = seed;
    memset(shadow, 0, sizeof shadow);
    kv_pool *p = mk(ST_BLOCKS, ST_BS);
    REQUIRE(p);
    if (hash_bits < 128) REQUIRE(kv_pool_set_hash_bits(p, hash_bits) == 0);
    kv_seq store[ST_SEQS];
    kv_seq *live[ST_SEQS] = {0};
    int32_t prefixes[3][24];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 24; i++) prefixes[k][i] = (int32_t)rnd(ST_VOCAB);
    int matched_total = 0, ok = 1;

    for (int step = 0; step < steps && ok; step++) {
        int j = (int)rnd(ST_SEQS);
        kv_seq *s = live[j];
        int op = (int)rnd(100);
        if (!s) {
            /* A new request: shared prefix + random tail, match, append. */
            kv_seq_init(&store[j]);
            s = live[j] = &store[j];
            int32_t prompt[40];
            int k = (int)rnd(3), plen = (int)rnd(25), n = plen + 1 + (int)rnd(12);
            memcpy(prompt, prefixes[k], sizeof(int32_t) * (size_t)plen);
            for (int i = plen; i < n; i++) prompt[i] = (int32_t)rnd(ST_VOCAB);
            int r = kv_seq_match_prefix(p, s, prompt, n);
            CHECK(r >= 0 && r < n && r % ST_BS == 0);
            matched_total += r > 0 ? r : 0;
            /* Reused blocks hold exactly the K/V of the prompt's prefix. */
            uint64_t ids[40];
            prefix_ids(prompt, n, ids);
            for (int i = 0; i < r; i++)
                if (shadow[s->blocks[i / ST_BS]][i % ST_BS] != ids[i]) ok = 0;
            CHECK(ok);
            if (r < 0 || st_append(p, s, prompt + r, n - r)) {
                kv_seq_free(p, s); /* would be preempted / refused */
                live[j] = NULL;
            } else if (rnd(2)) {
                kv_seq_commit(p, s, s->n_tokens);
            }
        } else if (op < 40) {
            /* A decode step: commit what was computed, write 1-3 tokens. */
            CHECK(kv_seq_commit(p, s, s->n_tokens) >= 0);
            int32_t t[3] = {(int32_t)rnd(ST_VOCAB), (int32_t)rnd(ST_VOCAB), (int32_t)rnd(ST_VOCAB)};
            if (st_append(p, s, t, 1 + (int)rnd(3))) {
                kv_seq_free(p, s); /* preempted */
                live[j] = NULL;
            }
        } else if (op < 55) {
            int d = (int)rnd(ST_SEQS);
            if (!live[d]) {
                kv_seq_init(&store[d]);
                CHECK_EQ_INT(kv_seq_fork(p, s, &store[d]), 0);
                live[d] = &store[d];
            }
        } else if (op < 65) {
            int lo = s->n_hashed * ST_BS;
            int n = lo + (int)rnd((uint32_t)(s->n_tokens - lo + 1));
            CHECK_EQ_INT(kv_seq_truncate(p, s, n), 0);
        } else if (op < 80) {
            int n = (int)rnd((uint32_t)s->n_tokens + 1);
            CHECK(kv_seq_commit(p, s, n) >= 0);
        } else {
            kv_seq_free(p, s);
            live[j] = NULL;
        }
        if (!check_tables(p, live, ST_SEQS) || !shadow_ok(live)) {
            fprintf(stderr, "  stress seed %llu bits %d: broken after step %d (op %d)\n",
                    (unsigned long long)seed, hash_bits, step, op);
            ok = 0;
        }
        kv_stats st;
        kv_pool_stats(p, &st);
        if (st.free_blocks + st.used_blocks + st.cached_blocks != ST_BLOCKS ||
            st.used_tokens > (int64_t)st.used_blocks * ST_BS)
            ok = 0;
    }
    CHECK(ok);
    kv_stats st;
    kv_pool_stats(p, &st);
    /* The workload must have exercised the cache, eviction and copies. */
    CHECK(matched_total > 0 && st.hit_blocks > 0 && st.evictions > 0 && st.cow_copies > 0);
    if (hash_bits < 128) CHECK(st.hash_collisions > 0);
    for (int j = 0; j < ST_SEQS; j++) kv_seq_free(p, live[j]);
    CHECK(check_no_leaks(p));
    kv_pool_stats(p, &st);
    CHECK(st.cached_blocks > 0);
    kv_pool_destroy(p);
}

static void test_stress(void)
{
    stress(0x9e3779b97f4a7c15ULL, 128, 5000);
    stress(12345, 128, 5000);
}

static void test_stress_collisions(void)
{
    /* Few hash bits: collisions at every depth, caught by verification. */
    for (int bits = 2; bits <= 6; bits++) {
        stress(777 + (uint64_t)bits, bits, 5000);
        stress(4242 * (uint64_t)bits, bits, 5000);
    }
}

int main(void)
{
    QT_RUN(test_create_errors);
    QT_RUN(test_alloc_as_tokens_arrive);
    QT_RUN(test_exhaustion_leaves_state);
    QT_RUN(test_invalid_input);
    QT_RUN(test_nomem_all_or_nothing);
    QT_RUN(test_prefix_reuse);
    QT_RUN(test_never_whole_prompt);
    QT_RUN(test_cached_lru_eviction);
    QT_RUN(test_commit_no_dedupe);
    QT_RUN(test_collision_defence);
    QT_RUN(test_collision_depth);
    QT_RUN(test_fork_cow);
    QT_RUN(test_hashed_blocks_immutable);
    QT_RUN(test_truncate);
    QT_RUN(test_block_gen);
    QT_RUN(test_swap_out_in);
    QT_RUN(test_stats_utilisation);
    QT_RUN(test_stress);
    QT_RUN(test_stress_collisions);
    QT_MAIN_END();
}
