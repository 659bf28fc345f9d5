/* test_tier.c - the persistent prefix tier end to end in the engine
 * (engine/tier.c over the store thread): blocks of finished requests are
 * written to sqlite; after a "restart" (new engine, new store, same file) a
 * prompt's prefix is loaded from disk instead of computed, and the greedy
 * output is the same as a cold run's; another model (or the same shapes
 * with other weights) never matches; a damaged block is never loaded; a
 * request cancelled while its prefix is being read leaves nothing behind.
 * Blocks written by a run on 2 CPU shards (tensor parallelism) load into
 * a run on the whole model and back.  QUIRE_TEST_DEVICE=cuda runs the
 * engines on the CUDA backend (exact mode); without a device or a CUDA
 * build it prints "skipped". */
#define _GNU_SOURCE
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "model.h"
#include "qerr.h"
#include "qtest.h"
#include "store.h"
#include "tier.h"

static char g_dir[] = "/tmp/quire-test-tier-XXXXXX";

static const char *path(const char *name)
{
    static char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    return p;
}

#define NP 150   /* prompt tokens: 9 full blocks of 16 may be reused */
#define GEN 12

static int32_t g_prompt[NP];
static int g_device = QDEVICE_CPU;
static int g_tp; /* the engines' tensor_parallel */

/* A small Llama of random weights (seed picks them). */
static qmodel *model(uint64_t seed)
{
    static const char cfg[] =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 128, "
        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 512, "
        "\"max_position_embeddings\": 1024, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, "
        "\"bos_token_id\": 1, \"eos_token_id\": 2, \"tie_word_embeddings\": false}";
    const char *p = path("config.json");
    FILE *f = fopen(p, "w");
    if (!f) return NULL;
    fputs(cfg, f);
    fclose(f);
    qmodel *m = NULL;
    char err[256];
    if (qmodel_random(p, 1, seed, &m, err, sizeof err)) fprintf(stderr, "  model: %s\n", err);
    return m;
}

static qengine *engine(const qmodel *m, qstore *s)
{
    qengine_opts o;
    qengine_opts_default(&o);
    o.device = g_device;
    o.exact = g_device == QDEVICE_CUDA;
    o.n_threads = 2;
    o.num_blocks = 64;
    o.tensor_parallel = g_tp;
    o.store = s;
    qengine *e = NULL;
    char err[256];
    if (qengine_create(m, NULL, &o, &e, err, sizeof err)) fprintf(stderr, "  engine: %s\n", err);
    return e;
}

static qstore *store(void)
{
    qstore *s = NULL;
    char err[256];
    if (qstore_start(path("tier.db"), NULL, &s, err, sizeof err)) fprintf(stderr, "  store: %s\n", err);
    return s;
}

typedef struct {
    int32_t out[GEN];
    int n_out, cached;
    qfinish fin;
} result;

/* Greedy run of the prompt's first n tokens; cancel_after_steps >= 0
 * cancels it after that many steps. */
static int generate(qengine *e, int n, result *r, int cancel_after_steps)
{
    memset(r, 0, sizeof *r);
    qreq_params p = { .prompt = g_prompt, .n_prompt = n, .sp = qsample_defaults(), .max_tokens = GEN, .ignore_eos = 1 };
    uint64_t id;
    char err[256];
    if (qengine_submit(e, &p, &id, err, sizeof err)) return -1;
    for (int steps = 0, live = 1; live > 0 && steps < 100000; steps++) {
        if (steps == cancel_after_steps) qengine_cancel(e, id);
        live = qengine_step(e);
        qevent ev;
        while (qengine_poll(e, &ev)) {
            if (ev.finish == QFINISH_NONE && r->n_out < GEN) r->out[r->n_out++] = ev.token;
            if (ev.finish != QFINISH_NONE) r->fin = ev.finish, r->cached = ev.cached_tokens;
            qevent_free(&ev);
        }
    }
    return 0;
}

static void clean(qengine *e)
{
    char err[256];
    const int rc = qengine_check(e, err, sizeof err);
    if (rc) fprintf(stderr, "  check: %s\n", err);
    CHECK(rc == 0);
}

static result g_cold;

/* A server's life: a model (weights from seed), the store on tier.db, an
 * engine over both. */
typedef struct {
    qmodel *m;
    qstore *s;
    qengine *e;
} rig;

static int rig_start(rig *g, uint64_t seed)
{
    g->m = model(seed);
    g->s = g->m ? store() : NULL;
    g->e = g->s ? engine(g->m, g->s) : NULL;
    return g->e != NULL;
}

/* Engine, then store (its queue finished), then model; the store's stats
 * before it stops into *ss (when not NULL). */
static void rig_stop(rig *g, qstore_stats *ss)
{
    qengine_destroy(g->e);
    if (ss) qstore_stats_get(g->s, ss);
    qstore_stop(g->s);
    qmodel_destroy(g->m);
}

static void test_restart_loads_from_disk(void)
{
    qmodel *m = model(7);
    REQUIRE(m);
    /* Cold: no tier. */
    qengine *e = engine(m, NULL);
    REQUIRE(e);
    REQUIRE(generate(e, NP, &g_cold, -1) == 0);
    CHECK_EQ_INT(g_cold.n_out, GEN);
    CHECK_EQ_INT(g_cold.cached, 0);
    qengine_destroy(e);
    qmodel_destroy(m);

    /* First run with the tier: computed, then written. */
    rig g;
    REQUIRE(rig_start(&g, 7));
    result r;
    REQUIRE(generate(g.e, NP, &r, -1) == 0);
    CHECK(r.n_out == GEN && !memcmp(r.out, g_cold.out, sizeof r.out));
    qengine_stats st;
    qengine_stats_get(g.e, &st);
    CHECK_EQ_INT((int)st.disk_blocks_loaded, 0);
    CHECK_EQ_INT((int)st.disk_lookups, 0); /* nothing there: not even asked */
    /* 150 prompt + 11 fed-back tokens: 10 full blocks. */
    CHECK_EQ_INT((int)st.disk_blocks_queued, (NP + GEN - 1) / 16);
    rig_stop(&g, NULL);

    /* Restart: a new model instance, store and engine on the same file. */
    REQUIRE(rig_start(&g, 7));
    REQUIRE(generate(g.e, NP, &r, -1) == 0);
    CHECK(r.n_out == GEN && !memcmp(r.out, g_cold.out, sizeof r.out));
    qengine_stats_get(g.e, &st);
    const int reused = (NP - 1) / 16 * 16;
    CHECK_EQ_INT((int)st.disk_tokens_loaded, reused);
    CHECK_EQ_INT(r.cached, reused);
    /* Only the prompt's tail and the fed-back tokens were computed. */
    CHECK_EQ_INT((int)st.tokens_computed, NP - reused + GEN - 1);
    clean(g.e);
    /* The same prompt again: memory, not disk. */
    REQUIRE(generate(g.e, NP, &r, -1) == 0);
    qengine_stats st2;
    qengine_stats_get(g.e, &st2);
    CHECK_EQ_INT((int)st2.disk_lookups, (int)st.disk_lookups);
    CHECK(!memcmp(r.out, g_cold.out, sizeof r.out));
    qstore_stats ss;
    rig_stop(&g, &ss);
    CHECK_EQ_INT((int)ss.blocks_corrupt, 0);
}

/* Blocks stored by a run on 2 shards (tensor parallelism) load into a run
 * on the whole model and back: their bytes have one layout. */
static void test_other_split_loads(void)
{
    qmodel *m = model(9);
    REQUIRE(m);
    qengine *e = engine(m, NULL);
    REQUIRE(e);
    result cold, r;
    REQUIRE(generate(e, NP, &cold, -1) == 0);
    qengine_destroy(e);
    qmodel_destroy(m);
    const int reused = (NP - 1) / 16 * 16;
    for (int run = 0; run < 3; run++) {
        g_tp = run == 1 ? 1 : 2; /* written on 2 shards, read on 1, then on 2 */
        rig g;
        REQUIRE(rig_start(&g, 9));
        REQUIRE(generate(g.e, NP, &r, -1) == 0);
        qengine_stats st;
        qengine_stats_get(g.e, &st);
        fprintf(stderr, "  run %d on %d shard%s: %d prompt tokens from disk, output %s\n", run, g_tp,
                g_tp > 1 ? "s" : "", (int)st.disk_tokens_loaded,
                !memcmp(r.out, cold.out, sizeof r.out) ? "as the cold run's" : "DIFFERS");
        CHECK(r.n_out == GEN && !memcmp(r.out, cold.out, sizeof r.out));
        CHECK_EQ_INT((int)st.disk_tokens_loaded, run ? reused : 0);
        clean(g.e);
        rig_stop(&g, NULL);
    }
    g_tp = 0;
}

static void test_other_weights_never_match(void)
{
    rig g;
    REQUIRE(rig_start(&g, 8)); /* same shapes, other weights: another fingerprint */
    result r;
    REQUIRE(generate(g.e, NP, &r, -1) == 0);
    qengine_stats st;
    qengine_stats_get(g.e, &st);
    CHECK_EQ_INT((int)st.disk_blocks_loaded, 0);
    CHECK_EQ_INT(r.cached, 0);
    rig_stop(&g, NULL);
}

static void test_damaged_block_not_loaded(void)
{
    /* Damage the 4th block of the chain written by test_restart. */
    sqlite3 *db = NULL;
    REQUIRE(sqlite3_open(path("tier.db"), &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db,
                       "UPDATE block_data SET kv = zeroblob(length(kv)) WHERE id = (SELECT id FROM blocks ORDER BY "
                       "id LIMIT 1 OFFSET 3)",
                       NULL, NULL, NULL) == SQLITE_OK);
    CHECK_EQ_INT(sqlite3_changes(db), 1);
    sqlite3_close(db);
    rig g;
    REQUIRE(rig_start(&g, 7));
    result r;
    REQUIRE(generate(g.e, NP, &r, -1) == 0);
    qengine_stats st;
    qengine_stats_get(g.e, &st);
    CHECK_EQ_INT((int)st.disk_blocks_loaded, 3); /* up to the damaged one */
    CHECK(r.n_out == GEN && !memcmp(r.out, g_cold.out, sizeof r.out));
    clean(g.e);
    qstore_stats ss;
    rig_stop(&g, &ss);
    CHECK_EQ_INT((int)ss.blocks_corrupt, 1);
}

static void test_cancel_while_loading(void)
{
    rig g;
    REQUIRE(rig_start(&g, 7));
    result r;
    /* Cancelled at once: before or while its lookup runs. */
    REQUIRE(generate(g.e, NP, &r, 1) == 0);
    CHECK(r.fin == QFINISH_CANCELLED);
    clean(g.e);
    /* The engine goes on: the next one loads and matches the cold run. */
    REQUIRE(generate(g.e, NP, &r, -1) == 0);
    CHECK(r.n_out == GEN && !memcmp(r.out, g_cold.out, sizeof r.out));
    clean(g.e);
    rig_stop(&g, NULL);
}

/* The default policy: load unless loading was measured slower than
 * computing, and then still every 16th time. */
static void test_load_policy(void)
{
    CHECK_EQ_INT(qtier_should_load(0, 0, 1), 1);       /* nothing measured */
    CHECK_EQ_INT(qtier_should_load(0, 5e4, 1), 1);     /* the tier's rate unknown: try it */
    CHECK_EQ_INT(qtier_should_load(3e4, 0, 1), 1);     /* the prefill's unknown */
    CHECK_EQ_INT(qtier_should_load(3e4, 2e3, 1), 1);   /* a CPU: loading is 15x faster */
    int loads = 0;
    for (uint64_t k = 1; k <= 64; k++) loads += qtier_should_load(1.6e4, 1.2e5, k); /* a GPU: slower */
    CHECK_EQ_INT(loads, 4);
}

int main(void)
{
    const char *dev = getenv("QUIRE_TEST_DEVICE");
    if (dev && *dev && qdevice_parse(dev, &g_device)) {
        fprintf(stderr, "QUIRE_TEST_DEVICE=%s: expected cpu or cuda\n", dev);
        return 1;
    }
    if (g_device == QDEVICE_CUDA && qdevice_resolve(QDEVICE_AUTO) != QDEVICE_CUDA) {
        printf("skipped: QUIRE_TEST_DEVICE=cuda but no CUDA device here\n");
        return QT_SKIP_CODE;
    }
    if (g_device == QDEVICE_AUTO) g_device = QDEVICE_CPU;
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    uint64_t x = 11;
    g_prompt[0] = 1;
    for (int i = 1; i < NP; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        g_prompt[i] = 3 + (int32_t)((x >> 33) % 500);
    }
    QT_RUN(test_load_policy);
    QT_RUN(test_restart_loads_from_disk);
    if (g_device == QDEVICE_CPU) QT_RUN(test_other_split_loads);
    QT_RUN(test_other_weights_never_match);
    QT_RUN(test_damaged_block_not_loaded);
    QT_RUN(test_cancel_while_loading);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_dir);
    QT_MAIN_END();
}
