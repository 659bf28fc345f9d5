/* test_store_thread.c - the store thread (engine/store/store.c, store_jobs.c):
 * sessions and messages (create, append, list by owner, get, rename,
 * delete, another owner sees nothing), and the persistent tier of KV
 * blocks (write, look a chain up, another fingerprint never matches, a
 * damaged block is never loaded, LRU eviction under disk_max, the queue's
 * bound, everything still there after a restart, a database of level 1
 * migrated), a turn cut short by a stop mended at the next start (an empty
 * partial reply), and damaged databases refused by qstore_start. */
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qerr.h"
#include "qtest.h"
#include "store.h"

static char g_dir[] = "/tmp/quire-test-storet-XXXXXX";

static const char *path(const char *name)
{
    static char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    return p;
}

/* ---- running a job and waiting for it ---------------------------------------------- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

static void on_done(qstore_job *j)
{
    pthread_mutex_lock(&g_mu);
    j->tag = 1;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* Submits j and waits for it; returns j (the caller frees it). */
static qstore_job *run(qstore *s, qstore_job *j)
{
    j->done = on_done;
    j->tag = 0;
    if (qstore_submit(s, j)) return j;
    pthread_mutex_lock(&g_mu);
    while (!j->tag) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    return j;
}

static qstore_job *job(qstore_kind k, const char *id, const char *owner)
{
    qstore_job *j = qstore_job_new(k);
    if (id) snprintf(j->id, sizeof j->id, "%s", id);
    if (owner) snprintf(j->owner, sizeof j->owner, "%s", owner);
    return j;
}

/* A turn of one user message in session id (NULL or "": a new one); the
 * session's id to out. */
static int turn(qstore *s, const char *id, const char *owner, const char *content, char out[QSTORE_ID_MAX],
                int *n_msgs)
{
    qstore_job *j = job(QSTORE_TURN, id, owner);
    j->msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", content);
    run(s, j);
    const int rc = j->rc;
    if (out) snprintf(out, QSTORE_ID_MAX, "%s", j->id);
    if (n_msgs) *n_msgs = j->result ? (int)json_array_size(j->result) : -1;
    qstore_job_free(j);
    return rc;
}

static int reply(qstore *s, const char *id, const char *text, int partial)
{
    qstore_job *j = job(QSTORE_REPLY, id, NULL);
    j->text = strdup(text);
    j->partial = partial;
    run(s, j);
    const int rc = j->rc;
    qstore_job_free(j);
    return rc;
}

static int count(const char *db_path, const char *sql)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int n = -1;
    if (sqlite3_open(db_path, &db) == SQLITE_OK && sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* ---- sessions ------------------------------------------------------------------------ */

static void test_sessions(void)
{
    char err[256], a[QSTORE_ID_MAX], b[QSTORE_ID_MAX];
    qstore *s = NULL;
    REQUIRE(qstore_start(path("sessions.db"), NULL, &s, err, sizeof err) == 0);
    int n = 0;
    /* A new session: an unguessable id, the first message as its title. */
    CHECK_EQ_INT(turn(s, NULL, "alice", "What is a KV cache?\nAnd why?", a, &n), 0);
    CHECK_EQ_INT((int)strlen(a), 5 + 32);
    CHECK(!strncmp(a, "sess_", 5));
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(reply(s, a, "Keys and values.", 0), 0);
    CHECK_EQ_INT(turn(s, a, "alice", "More?", NULL, &n), 0);
    CHECK_EQ_INT(n, 3); /* the whole conversation comes back */
    CHECK_EQ_INT(reply(s, a, "Cut sho", 1), 0);
    /* A message edited (or a reply asked for again): only the first 2 stay,
     * then the new one; another owner cannot, nor can a new session or a
     * negative count. */
    qstore_job *t = job(QSTORE_TURN, a, "alice");
    t->msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "More, edited?");
    t->truncate = 1, t->keep = 2;
    run(s, t);
    CHECK_EQ_INT(t->rc, 0);
    REQUIRE(t->result && json_array_size(t->result) == 3);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(t->result, 1), "content")), "Keys and values."));
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(t->result, 2), "content")), "More, edited?"));
    qstore_job_free(t);
    /* {case, keep}: 0 a new session, 1 negative, 2 bob's, 3 more than the session holds */
    const int bad_keep[4][2] = { { 1, -1 }, { 0, 1 }, { 2, 1 }, { 3, 4 } };
    for (int i = 0; i < 4; i++) {
        t = job(QSTORE_TURN, bad_keep[i][0] == 0 ? NULL : a, bad_keep[i][0] == 2 ? "bob" : "alice");
        t->msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "x");
        t->truncate = 1, t->keep = bad_keep[i][1];
        run(s, t);
        CHECK_EQ_INT(t->rc, bad_keep[i][0] == 2 ? QERR_NOTFOUND : QERR_INVAL);
        qstore_job_free(t);
    }
    CHECK_EQ_INT(reply(s, a, "Cut sho", 1), 0);
    CHECK_EQ_INT(turn(s, NULL, "alice", "second", b, NULL), 0);
    CHECK(strcmp(a, b) != 0);
    CHECK_EQ_INT(turn(s, NULL, "bob", "bob's", NULL, NULL), 0);

    /* Another owner can neither append to, read, rename nor delete it. */
    CHECK_EQ_INT(turn(s, a, "bob", "hijack", NULL, NULL), QERR_NOTFOUND);
    qstore_job *j = run(s, job(QSTORE_GET, a, "bob"));
    CHECK_EQ_INT(j->rc, QERR_NOTFOUND);
    CHECK(j->result == NULL);
    qstore_job_free(j);
    j = job(QSTORE_RENAME, a, "bob");
    j->text = strdup("mine");
    run(s, j);
    CHECK_EQ_INT(j->rc, QERR_NOTFOUND);
    qstore_job_free(j);
    j = run(s, job(QSTORE_DELETE, a, "bob"));
    CHECK_EQ_INT(j->rc, QERR_NOTFOUND);
    qstore_job_free(j);

    /* The owner's list: newest first; bob's is not in it. */
    j = run(s, job(QSTORE_LIST, NULL, "alice"));
    CHECK_EQ_INT(j->rc, 0);
    REQUIRE(json_array_size(j->result) == 2);
    int found_a = 0;
    for (size_t i = 0; i < 2; i++) {
        json_t *e = json_array_get(j->result, i);
        if (!strcmp(json_string_value(json_object_get(e, "id")), a)) {
            found_a = 1;
            CHECK(!strcmp(json_string_value(json_object_get(e, "title")), "What is a KV cache?"));
            CHECK_EQ_INT((int)json_integer_value(json_object_get(e, "messages")), 4);
        }
    }
    CHECK(found_a);
    qstore_job_free(j);

    /* Its messages, in order, with the partial reply marked. */
    j = run(s, job(QSTORE_GET, a, "alice"));
    CHECK_EQ_INT(j->rc, 0);
    json_t *m = json_object_get(j->result, "messages");
    REQUIRE(json_array_size(m) == 4);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(m, 1), "role")), "assistant"));
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(m, 1), "status")), "done"));
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(m, 3), "content")), "Cut sho"));
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(m, 3), "status")), "partial"));
    qstore_job_free(j);

    /* Rename (a title too long is refused), delete (messages go with it). */
    j = job(QSTORE_RENAME, a, "alice");
    j->text = strdup("Caches");
    run(s, j);
    CHECK_EQ_INT(j->rc, 0);
    qstore_job_free(j);
    j = job(QSTORE_RENAME, a, "alice");
    j->text = calloc(1, QSTORE_TITLE_MAX + 2);
    memset(j->text, 'x', QSTORE_TITLE_MAX + 1);
    run(s, j);
    CHECK_EQ_INT(j->rc, QERR_INVAL);
    qstore_job_free(j);
    j = run(s, job(QSTORE_GET, a, "alice"));
    CHECK(!strcmp(json_string_value(json_object_get(j->result, "title")), "Caches"));
    qstore_job_free(j);
    j = run(s, job(QSTORE_DELETE, a, "alice"));
    CHECK_EQ_INT(j->rc, 0);
    qstore_job_free(j);
    j = run(s, job(QSTORE_GET, a, "alice"));
    CHECK_EQ_INT(j->rc, QERR_NOTFOUND);
    qstore_job_free(j);
    CHECK_EQ_INT(reply(s, a, "too late", 0), QERR_NOTFOUND);
    qstore_stats st;
    qstore_stats_get(s, &st);
    CHECK_EQ_INT((int)st.messages_written, 8); /* 6, and the edited message and its reply */
    qstore_stop(s);
    CHECK_EQ_INT(count(path("sessions.db"), "SELECT count(*) FROM messages"), 2);

    /* After a restart the rest is there; b's turn, never answered, has an
     * empty partial reply. */
    REQUIRE(qstore_start(path("sessions.db"), NULL, &s, err, sizeof err) == 0);
    j = run(s, job(QSTORE_GET, b, "alice"));
    CHECK_EQ_INT(j->rc, 0);
    CHECK_EQ_INT((int)json_array_size(json_object_get(j->result, "messages")), 2);
    qstore_job_free(j);
    qstore_stop(s);
}

/* ---- turns cut short, damaged databases ------------------------------------------------ */

/* "role/status/content" of each message of session id, joined by " | ". */
static void roles(qstore *s, const char *id, char *out, size_t cap)
{
    qstore_job *j = run(s, job(QSTORE_GET, id, ""));
    size_t len = 0, i;
    json_t *m;
    out[0] = 0;
    json_array_foreach(json_object_get(j->result, "messages"), i, m) {
        const int w = snprintf(out + len, cap - len, "%s%s/%s/%s", i ? " | " : "",
                               json_string_value(json_object_get(m, "role")),
                               json_string_value(json_object_get(m, "status")),
                               json_string_value(json_object_get(m, "content")));
        if (w < 0 || (size_t)w >= cap - len) break;
        len += (size_t)w;
    }
    if (j->rc) snprintf(out, cap, "error %d", j->rc);
    qstore_job_free(j);
}

/* Runs sql on the database at db_path (no store open): 0 or sqlite's code. */
static int exec_on(const char *db_path, const char *sql)
{
    sqlite3 *db = NULL;
    int rc = sqlite3_open(db_path, &db);
    if (rc == SQLITE_OK) rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    sqlite3_close(db);
    return rc;
}

/* Stores a turn of session id with no reply, then adds a trigger that
 * refuses partial replies: 0 or an error. */
static int turn_cut_then_block(const char *db_path, const char *id)
{
    char err[256], file[256];
    snprintf(file, sizeof file, "%s", db_path);
    qstore *s = NULL;
    if (qstore_start(file, NULL, &s, err, sizeof err)) return -1;
    const int rc = turn(s, id, "", "q4", NULL, NULL);
    qstore_stop(s);
    return rc ? rc
              : exec_on(file, "CREATE TRIGGER no_partial BEFORE INSERT ON messages WHEN NEW.status = 'partial' "
                              "BEGIN SELECT RAISE(ABORT, 'no replies today'); END;");
}

/* A turn stored, then the process gone before its reply (kill -9): at the
 * next start the session gets an empty reply marked partial, as a request
 * cancelled before its first token, so its roles alternate; a second start
 * adds nothing; answered sessions are untouched. */
static void test_cut_turn_repaired(void)
{
    char err[256], a[QSTORE_ID_MAX], b[QSTORE_ID_MAX], c[QSTORE_ID_MAX], d[QSTORE_ID_MAX], got[512];
    qstore *s = NULL;
    REQUIRE(qstore_start(path("cut.db"), NULL, &s, err, sizeof err) == 0);
    CHECK_EQ_INT(turn(s, NULL, "", "q1", a, NULL), 0);
    CHECK_EQ_INT(reply(s, a, "a1", 0), 0);
    CHECK_EQ_INT(turn(s, a, "", "q2", NULL, NULL), 0); /* cut */
    CHECK_EQ_INT(turn(s, NULL, "", "only", b, NULL), 0); /* cut on its first turn */
    CHECK_EQ_INT(turn(s, NULL, "", "fine", c, NULL), 0);
    CHECK_EQ_INT(reply(s, c, "answered", 0), 0);
    /* A turn of a tool's result, cut: its reply is missing just the same. */
    qstore_job *j = job(QSTORE_TURN, NULL, "");
    j->msgs = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "user", "content", "weather?", "role", "tool", "content",
                        "sunny");
    run(s, j);
    CHECK_EQ_INT(j->rc, 0);
    snprintf(d, sizeof d, "%s", j->id);
    qstore_job_free(j);
    qstore_stop(s); /* as good as a kill -9 here: every job committed */
    CHECK_EQ_INT(count(path("cut.db"), "SELECT count(*) FROM messages"), 8);

    for (int pass = 0; pass < 2; pass++) {
        REQUIRE(qstore_start(path("cut.db"), NULL, &s, err, sizeof err) == 0);
        roles(s, a, got, sizeof got);
        CHECK(!strcmp(got, "user/done/q1 | assistant/done/a1 | user/done/q2 | assistant/partial/"));
        roles(s, b, got, sizeof got);
        CHECK(!strcmp(got, "user/done/only | assistant/partial/"));
        roles(s, c, got, sizeof got);
        CHECK(!strcmp(got, "user/done/fine | assistant/done/answered"));
        roles(s, d, got, sizeof got);
        CHECK(!strcmp(got, "user/done/weather? | tool/done/sunny | assistant/partial/"));
        qstore_stats st;
        qstore_stats_get(s, &st);
        CHECK_EQ_INT((int)st.messages_written, 0);
        qstore_stop(s);
        CHECK_EQ_INT(count(path("cut.db"), "SELECT count(*) FROM messages"), 11); /* 3 added, once */
    }
    /* The conversation goes on after the mended reply. */
    REQUIRE(qstore_start(path("cut.db"), NULL, &s, err, sizeof err) == 0);
    CHECK_EQ_INT(turn(s, a, "", "q3", NULL, NULL), 0);
    CHECK_EQ_INT(reply(s, a, "a3", 0), 0);
    roles(s, a, got, sizeof got);
    CHECK(!strcmp(got, "user/done/q1 | assistant/done/a1 | user/done/q2 | assistant/partial/ | user/done/q3 | "
                       "assistant/done/a3"));
    qstore_stop(s);

    /* A mend that fails (here a trigger added by hand refuses it) stops the
     * start with a message, and leaves the database as it was. */
    CHECK_EQ_INT(turn_cut_then_block(path("cut.db"), a), 0);
    s = NULL;
    err[0] = 0;
    CHECK(qstore_start(path("cut.db"), NULL, &s, err, sizeof err) < 0);
    CHECK(s == NULL);
    CHECK_STR_CONTAINS(err, "cannot mend the turns cut short in the database");
    CHECK_STR_CONTAINS(err, "no replies today");
    CHECK_EQ_INT(count(path("cut.db"), "SELECT count(*) FROM messages"), 14);
    CHECK_EQ_INT(count(path("cut.db"), "SELECT count(*) FROM messages WHERE status = 'partial'"), 3);
}

/* ---- the persistent tier ------------------------------------------------------------- */

enum { BS = 4, BB = 256 };

/* A chain of n blocks: tokens i*BS.., K/V bytes from (seed, block). */
typedef struct {
    uint8_t h[8][16], p[8][16];
    int32_t tok[8 * BS];
} chain;

static void make_chain(chain *c, int n, int seed)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 16; k++) c->h[i][k] = (uint8_t)(seed * 31 + i * 7 + k + 1);
        if (i) memcpy(c->p[i], c->h[i - 1], 16);
        for (int k = 0; k < BS; k++) c->tok[i * BS + k] = seed * 1000 + i * BS + k;
    }
}

static void *kv_of(int n, int seed)
{
    unsigned char *kv = malloc((size_t)n * BB);
    for (int i = 0; i < n * BB; i++) kv[i] = (unsigned char)(seed + i * 13);
    return kv;
}

static qstore_job *lookup(qstore *s, const uint8_t fp[16], const chain *c, int n)
{
    qstore_job *j = qstore_job_new(QSTORE_BLOCKS);
    memcpy(j->fp, fp, 16);
    j->hashes = malloc((size_t)n * 16);
    memcpy(j->hashes, c->h, (size_t)n * 16);
    j->n = n, j->block_size = BS, j->block_bytes = BB;
    return run(s, j);
}

/* Waits until the store has written everything queued (a job behind them). */
static void sync_store(qstore *s) { qstore_job_free(run(s, job(QSTORE_LIST, NULL, ""))); }

static void test_blocks(void)
{
    char err[256];
    qstore *s = NULL;
    const uint8_t fp[16] = { 1, 2, 3 }, other[16] = { 9 };
    REQUIRE(qstore_start(path("blocks.db"), NULL, &s, err, sizeof err) == 0);
    chain c;
    make_chain(&c, 4, 1);
    CHECK_EQ_INT(qstore_put_blocks(s, fp, 3, (const uint8_t(*)[16])c.h, (const uint8_t(*)[16])c.p, c.tok, BS,
                                   kv_of(3, 5), BB),
                 0);
    sync_store(s);
    /* Asking for 4: the 3 written come back, exactly. */
    qstore_job *j = lookup(s, fp, &c, 4);
    CHECK_EQ_INT(j->rc, 0);
    CHECK_EQ_INT(j->found, 3);
    unsigned char *want = kv_of(3, 5);
    CHECK(j->kv && !memcmp(j->kv, want, 3 * BB));
    CHECK(j->tokens && !memcmp(j->tokens, c.tok, sizeof(int32_t) * 3 * BS));
    free(want);
    qstore_job_free(j);
    /* Another fingerprint never matches. */
    j = lookup(s, other, &c, 4);
    CHECK_EQ_INT(j->found, 0);
    qstore_job_free(j);
    /* The set in memory says the same without asking the disk. */
    CHECK_EQ_INT(qstore_has_block(s, fp, c.h[0]), 1);
    CHECK_EQ_INT(qstore_has_block(s, fp, c.h[2]), 1);
    CHECK_EQ_INT(qstore_has_block(s, fp, c.h[3]), 0);
    CHECK_EQ_INT(qstore_has_block(s, other, c.h[0]), 0);
    /* Writing the same blocks again adds nothing. */
    CHECK_EQ_INT(qstore_put_blocks(s, fp, 2, (const uint8_t(*)[16])c.h, (const uint8_t(*)[16])c.p, c.tok, BS,
                                   kv_of(2, 5), BB),
                 0);
    sync_store(s);
    qstore_stats st;
    qstore_stats_get(s, &st);
    CHECK_EQ_INT((int)st.blocks_written, 3);
    CHECK_EQ_INT((int)st.disk_blocks, 3);
    CHECK_EQ_INT((int)st.disk_bytes, 3 * (BB + 4 * BS));
    CHECK_EQ_INT((int)st.blocks_loaded, 3);
    qstore_stop(s);

    /* A damaged block (its K/V changed behind the store's back) is never
     * loaded: the chain ends before it and the block is removed. */
    sqlite3 *db = NULL;
    REQUIRE(sqlite3_open(path("blocks.db"), &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db,
                       "UPDATE block_data SET kv = zeroblob(256) WHERE id = (SELECT id FROM blocks ORDER BY id "
                       "LIMIT 1 OFFSET 1)",
                       NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    REQUIRE(qstore_start(path("blocks.db"), NULL, &s, err, sizeof err) == 0);
    qstore_stats_get(s, &st);
    CHECK_EQ_INT((int)st.disk_blocks, 3); /* counted again at start */
    CHECK_EQ_INT(qstore_has_block(s, fp, c.h[1]), 1); /* the set too */
    j = lookup(s, fp, &c, 3);
    CHECK_EQ_INT(j->found, 1);
    qstore_job_free(j);
    qstore_stats_get(s, &st);
    CHECK_EQ_INT((int)st.blocks_corrupt, 1);
    CHECK_EQ_INT((int)st.disk_blocks, 2);
    CHECK_EQ_INT(qstore_has_block(s, fp, c.h[1]), 0); /* removed from the set */
    qstore_stop(s);
    CHECK_EQ_INT(count(path("blocks.db"), "SELECT count(*) FROM block_data"), 2);
}

static void test_disk_bound(void)
{
    char err[256];
    qstore *s = NULL;
    const uint8_t fp[16] = { 7 };
    const int per = BB + 4 * BS;
    /* Room for 3 blocks: the cap is 7/8 of disk_max. */
    qstore_opts o = { .disk_max = (int64_t)(3 * per) * 8 / 7 + 8 };
    REQUIRE(qstore_start(path("bound.db"), &o, &s, err, sizeof err) == 0);
    chain c[5];
    for (int i = 0; i < 5; i++) make_chain(&c[i], 1, 10 + i);
    for (int i = 0; i < 3; i++)
        qstore_put_blocks(s, fp, 1, (const uint8_t(*)[16])c[i].h, (const uint8_t(*)[16])c[i].p, c[i].tok, BS,
                          kv_of(1, i), BB);
    /* Block 0 is used again (a lookup), then 3 and 4 arrive: 1 and 2, the
     * least recently used, go.  (A lookup overtakes queued writes: wait
     * for them first.) */
    sync_store(s);
    qstore_job *j = lookup(s, fp, &c[0], 1);
    CHECK_EQ_INT(j->found, 1);
    qstore_job_free(j);
    for (int i = 3; i < 5; i++)
        qstore_put_blocks(s, fp, 1, (const uint8_t(*)[16])c[i].h, (const uint8_t(*)[16])c[i].p, c[i].tok, BS,
                          kv_of(1, i), BB);
    sync_store(s);
    const int expect[5] = { 1, 0, 0, 1, 1 };
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_INT(qstore_has_block(s, fp, c[i].h[0]), expect[i]); /* evicted: out of the set */
        j = lookup(s, fp, &c[i], 1);
        CHECK_EQ_INT(j->found, expect[i]);
        qstore_job_free(j);
    }
    qstore_stats st;
    qstore_stats_get(s, &st);
    CHECK_EQ_INT((int)st.blocks_evicted, 2);
    CHECK_EQ_INT((int)st.disk_blocks, 3);
    CHECK(st.disk_bytes <= o.disk_max);
    /* Touching moves a block to the back of the line: touch 3, then two more
     * arrive, and 0 and 4 go. */
    qstore_touch_blocks(s, fp, 1, (const uint8_t(*)[16])c[3].h);
    for (int i = 1; i < 3; i++)
        qstore_put_blocks(s, fp, 1, (const uint8_t(*)[16])c[i].h, (const uint8_t(*)[16])c[i].p, c[i].tok, BS,
                          kv_of(1, i), BB);
    sync_store(s);
    const int expect2[5] = { 0, 1, 1, 1, 0 };
    for (int i = 0; i < 5; i++) {
        j = lookup(s, fp, &c[i], 1);
        CHECK_EQ_INT(j->found, expect2[i]);
        qstore_job_free(j);
    }
    qstore_stop(s);

    /* A full queue drops block writes (counted) and never blocks. */
    qstore_opts q = { .queue_max = 2 * BB };
    REQUIRE(qstore_start(path("queue.db"), &q, &s, err, sizeof err) == 0);
    chain big;
    make_chain(&big, 3, 3);
    CHECK_EQ_INT(qstore_put_blocks(s, fp, 3, (const uint8_t(*)[16])big.h, (const uint8_t(*)[16])big.p, big.tok, BS,
                                   kv_of(3, 1), BB),
                 QERR_BUSY);
    qstore_stats_get(s, &st);
    CHECK_EQ_INT((int)st.blocks_dropped, 3);
    qstore_stop(s);
}

/* A database left at level 1 (0001's blocks table) opens at the program's
 * level with the tier's new tables, its sessions kept. */
static void test_level1_upgrade(void)
{
    char err[256];
    sqlite3 *db = NULL;
    REQUIRE(qstore_n_migrations >= 2);
    REQUIRE(qstore_open(path("old.db"), qstore_migrations, 1, &db, err, sizeof err) == 0);
    CHECK(sqlite3_exec(db,
                       "INSERT INTO sessions (id, created, updated) VALUES ('sess_old', 1, 1);"
                       "INSERT INTO blocks VALUES (x'01', NULL, x'02', x'03', x'04', 0, 1, 1);",
                       NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    qstore *s = NULL;
    REQUIRE(qstore_start(path("old.db"), NULL, &s, err, sizeof err) == 0);
    qstore_job *j = run(s, job(QSTORE_GET, "sess_old", ""));
    CHECK_EQ_INT(j->rc, 0);
    qstore_job_free(j);
    qstore_stats st;
    qstore_stats_get(s, &st);
    CHECK_EQ_INT((int)st.disk_blocks, 0);
    qstore_stop(s);
    CHECK_EQ_INT(count(path("old.db"), "PRAGMA user_version"), qstore_n_migrations);
    CHECK_EQ_INT(count(path("old.db"), "SELECT count(*) FROM block_data"), 0);
}

/* The program's database: a page of the messages table overwritten with
 * garbage after many turns, the messages table dropped, or an index of it
 * gone: qstore_start refuses each with a message naming the file; a
 * healthy one starts. */
static void test_damaged_refused(void)
{
    char err[256], file[256];
    snprintf(file, sizeof file, "%s", path("damaged.db"));
    qstore *s = NULL;
    REQUIRE(qstore_start(file, NULL, &s, err, sizeof err) == 0);
    char long_text[300];
    memset(long_text, 'w', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = 0;
    for (int k = 0; k < 8; k++) {
        char id[QSTORE_ID_MAX] = "";
        for (int i = 0; i < 12; i++) {
            CHECK_EQ_INT(turn(s, id[0] ? id : NULL, "", long_text, id, NULL), 0);
            CHECK_EQ_INT(reply(s, id, long_text, 0), 0);
        }
    }
    qstore_stop(s);
    /* Healthy: it starts (twice), and nothing is mended. */
    for (int i = 0; i < 2; i++) {
        REQUIRE(qstore_start(file, NULL, &s, err, sizeof err) == 0);
        qstore_stop(s);
    }
    CHECK_EQ_INT(count(file, "SELECT count(*) FROM messages"), 8 * 24);
    const int psz = count(file, "PRAGMA page_size"), pages = count(file, "PRAGMA page_count");
    int pg = count(file, "SELECT pageno FROM dbstat WHERE name = 'messages' AND pagetype = 'leaf' ORDER BY pageno LIMIT "
                         "1 OFFSET (SELECT count(*) FROM dbstat WHERE name = 'messages' AND pagetype = 'leaf') / 2");
    if (pg < 1) pg = count(file, "SELECT rootpage FROM sqlite_master WHERE name = 'messages'"); /* no dbstat */
    REQUIRE(pages > 10 && pg > 1 && pg < pages);
    FILE *f = fopen(file, "r+b");
    REQUIRE(f);
    REQUIRE(fseek(f, (long)(pg - 1) * psz, SEEK_SET) == 0);
    for (int i = 0; i < psz; i++) fputc((i * 151 + 7) & 0xff, f);
    fclose(f);
    err[0] = 0;
    CHECK_EQ_INT(qstore_start(file, NULL, &s, err, sizeof err), QERR_FORMAT);
    CHECK(s == NULL);
    CHECK_STR_CONTAINS(err, file);
    CHECK_STR_CONTAINS(err, ": the database is damaged (quick_check: ");
    CHECK_STR_CONTAINS(err, "move it aside or restore a backup");
    CHECK(!strchr(err, '\n'));

    /* The messages table dropped (sessions kept): refused. */
    snprintf(file, sizeof file, "%s", path("dropped.db"));
    REQUIRE(qstore_start(file, NULL, &s, err, sizeof err) == 0);
    char id[QSTORE_ID_MAX];
    CHECK_EQ_INT(turn(s, NULL, "", "hello", id, NULL), 0);
    CHECK_EQ_INT(reply(s, id, "hi", 0), 0);
    qstore_stop(s);
    REQUIRE(exec_on(file, "DROP TABLE messages;") == SQLITE_OK);
    err[0] = 0;
    CHECK_EQ_INT(qstore_start(file, NULL, &s, err, sizeof err), QERR_FORMAT);
    CHECK(s == NULL);
    CHECK_STR_CONTAINS(err, file);
    CHECK_STR_CONTAINS(err, ": the database is damaged (the table 'messages' is missing); move it aside");
    CHECK_EQ_INT(count(file, "SELECT count(*) FROM sessions"), 1); /* left as it was */

    /* An index the migrations made, dropped: refused too. */
    snprintf(file, sizeof file, "%s", path("noindex.db"));
    REQUIRE(qstore_start(file, NULL, &s, err, sizeof err) == 0);
    qstore_stop(s);
    REQUIRE(exec_on(file, "DROP INDEX sessions_owner;") == SQLITE_OK);
    CHECK_EQ_INT(qstore_start(file, NULL, &s, err, sizeof err), QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "the index 'sessions_owner' is missing");
}

int main(void)
{
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    QT_RUN(test_sessions);
    QT_RUN(test_blocks);
    QT_RUN(test_disk_bound);
    QT_RUN(test_level1_upgrade);
    QT_RUN(test_cut_turn_repaired);
    QT_RUN(test_damaged_refused);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_dir);
    QT_MAIN_END();
}
