/* store.c - opening quire's sqlite database and migrating its schema, and
 * the store thread with its queue (store.h).  What each job does in sqlite
 * is in store_jobs.c. */
#include "store.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qerr.h"
#include "store_int.h"
#include "util.h"

int qstore_level(sqlite3 *db)
{
    sqlite3_stmt *st = NULL;
    int level = -1;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        level = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return level;
}

/* sqlite's result code as ours. */
static int code(int rc)
{
    rc &= 0xff;
    return rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT ? QERR_FORMAT
           : rc == SQLITE_NOMEM                       ? QERR_NOMEM
           : rc == SQLITE_BUSY || rc == SQLITE_LOCKED ? QERR_BUSY
                                                      : QERR_IO;
}

#define DAMAGED "; move it aside or restore a backup"

/* PRAGMA quick_check over the whole file (every page of every b-tree is
 * read: linear in the file's size): 0, or QERR_FORMAT with sqlite's first
 * complaint. */
static int check_pages(sqlite3 *d, const char *path, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(d, "PRAGMA quick_check(10)", -1, &st, NULL);
    int bad = 0;
    char first[200] = "";
    if (rc == SQLITE_OK) {
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            const char *t = (const char *)sqlite3_column_text(st, 0);
            if (t && !strcmp(t, "ok")) continue;
            if (bad++) continue;
            /* One line: without sqlite's "*** in database main ***" head. */
            static const char head[] = "*** in database main ***\n";
            if (t && !strncmp(t, head, sizeof head - 1)) t += sizeof head - 1;
            snprintf(first, sizeof first, "%s", t ? t : "?");
            for (char *c = first; *c; c++)
                if (*c == '\n' || *c == '\r') *c = ' ';
        }
    }
    if (rc != SQLITE_DONE && !bad) {
        const int c = rc & 0xff;
        if (c != SQLITE_CORRUPT && c != SQLITE_NOTADB) { /* locked, out of memory, an I/O error: no verdict */
            qerr_set(err, errlen, code(rc), "cannot check the database %s: %s", path, sqlite3_errmsg(d));
            sqlite3_finalize(st);
            return code(rc);
        }
        snprintf(first, sizeof first, "%s", sqlite3_errmsg(d)); /* a page the check itself cannot read */
        bad = 1;
    }
    sqlite3_finalize(st);
    if (!bad) return 0;
    return qerr_set(err, errlen, QERR_FORMAT, "%s: the database is damaged (quick_check: %s%s)" DAMAGED, path, first,
                    bad > 1 ? ", and more" : "");
}

/* The column names of table in db, in order, joined by ',' into out
 * (cap > 0): 0, or -1 when sqlite fails. */
static int columns(sqlite3 *db, const char *table, char *out, size_t cap)
{
    sqlite3_stmt *st = NULL;
    size_t len = 0;
    out[0] = 0;
    if (sqlite3_prepare_v2(db, "SELECT name FROM pragma_table_info(?1) ORDER BY cid", -1, &st, NULL) != SQLITE_OK)
        return -1;
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *c = (const char *)sqlite3_column_text(st, 0);
        const int w = snprintf(out + len, cap - len, "%s%s", len ? "," : "", c ? c : "");
        if (w < 0 || (size_t)w >= cap - len) break; /* cut: compared cut, on both sides */
        len += (size_t)w;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : -1;
}

/* Checks that d holds what the first `level` migrations make: every table,
 * index, view and trigger they leave (by type and name), each table with
 * the same columns in the same order.  The reference is those migrations
 * run on an empty in-memory database, so the check cannot drift from
 * migrations/; objects added by hand are let be.  0, QERR_FORMAT (one is
 * missing or different), or QERR_INTERNAL/QERR_NOMEM (the reference could
 * not be built). */
static int check_schema(sqlite3 *d, const char *path, const char *const *sql, int level, char *err, size_t errlen)
{
    if (level < 1) return 0;
    sqlite3 *ref = NULL;
    char *msg = NULL;
    int rc = sqlite3_open_v2(":memory:", &ref, SQLITE_OPEN_READWRITE | SQLITE_OPEN_MEMORY, NULL);
    if (rc != SQLITE_OK) {
        sqlite3_close(ref);
        return qerr_set(err, errlen, QERR_NOMEM, "cannot check the database %s: no memory for its reference schema",
                        path);
    }
    for (int i = 0; i < level && rc == SQLITE_OK; i++) rc = sqlite3_exec(ref, sql[i], NULL, NULL, &msg);
    if (rc != SQLITE_OK) {
        qerr_set(err, errlen, QERR_INTERNAL, "cannot check the database %s: its migrations fail on an empty one (%s)",
                 path, msg ? msg : sqlite3_errmsg(ref));
        sqlite3_free(msg);
        sqlite3_close(ref);
        return QERR_INTERNAL;
    }
    sqlite3_stmt *want = NULL, *have = NULL;
    rc = 0;
    if (sqlite3_prepare_v2(ref, "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
                                "ORDER BY type DESC, name",
                           -1, &want, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(d, "SELECT 1 FROM main.sqlite_master WHERE type = ?1 AND name = ?2", -1, &have, NULL) !=
            SQLITE_OK) {
        rc = qerr_set(err, errlen, code(sqlite3_errcode(want ? d : ref)), "cannot read the schema of %s: %s", path,
                      sqlite3_errmsg(want ? d : ref));
    }
    int step = SQLITE_DONE;
    while (!rc && (step = sqlite3_step(want)) == SQLITE_ROW) {
        const char *type = (const char *)sqlite3_column_text(want, 0);
        const char *name = (const char *)sqlite3_column_text(want, 1);
        if (!type || !name) continue;
        sqlite3_reset(have);
        sqlite3_bind_text(have, 1, type, -1, SQLITE_STATIC);
        sqlite3_bind_text(have, 2, name, -1, SQLITE_STATIC);
        const int h = sqlite3_step(have);
        if (h == SQLITE_DONE) {
            rc = qerr_set(err, errlen, QERR_FORMAT, "%s: the database is damaged (the %s '%s' is missing)" DAMAGED,
                          path, type, name);
        } else if (h != SQLITE_ROW) {
            rc = qerr_set(err, errlen, code(h), "cannot read the schema of %s: %s", path, sqlite3_errmsg(d));
        } else if (!strcmp(type, "table")) {
            char a[512], b[512];
            if (columns(ref, name, a, sizeof a) || columns(d, name, b, sizeof b))
                rc = qerr_set(err, errlen, code(sqlite3_errcode(d)), "cannot read the schema of %s: %s", path,
                              sqlite3_errmsg(d));
            else if (strcmp(a, b))
                rc = qerr_set(err, errlen, QERR_FORMAT,
                              "%s: the database is damaged (the table '%s' has the columns (%s), not (%s))" DAMAGED,
                              path, name, b, a);
        }
    }
    if (!rc && step != SQLITE_DONE)
        rc = qerr_set(err, errlen, QERR_INTERNAL, "cannot check the database %s: %s", path, sqlite3_errmsg(ref));
    sqlite3_finalize(want);
    sqlite3_finalize(have);
    sqlite3_close(ref);
    return rc;
}

int qstore_open(const char *path, const char *const *sql, int n, sqlite3 **db, char *err, size_t errlen)
{
    *db = NULL;
    sqlite3 *d = NULL;
    int rc = sqlite3_open_v2(path, &d, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL);
    if (rc != SQLITE_OK) {
        qerr_set(err, errlen, code(rc), "cannot open the database %s: %s", path, d ? sqlite3_errmsg(d) : "out of memory");
        sqlite3_close(d);
        return code(rc);
    }
    sqlite3_busy_timeout(d, 5000);
    char *msg = NULL;
    /* The first read finds out whether the file is a database at all. */
    const int level = qstore_level(d);
    if (level < 0) {
        rc = sqlite3_errcode(d);
        qerr_set(err, errlen, code(rc), "%s is not a quire database (%s)", path, sqlite3_errmsg(d));
        sqlite3_close(d);
        return code(rc);
    }
    if (level > n) {
        qerr_set(err, errlen, QERR_UNSUPPORTED,
                 "the database %s is at schema level %d, newer than this program knows (%d): use a newer quire", path,
                 level, n);
        sqlite3_close(d);
        return QERR_UNSUPPORTED;
    }
    /* A damaged file, or one whose tables are not what its level's
     * migrations made, is refused before anything is written to it. */
    if ((rc = check_pages(d, path, err, errlen)) || (rc = check_schema(d, path, sql, level, err, errlen))) {
        sqlite3_close(d);
        return rc;
    }
    if (sqlite3_exec(d, "PRAGMA journal_mode=WAL; PRAGMA foreign_keys=ON; PRAGMA synchronous=NORMAL; PRAGMA journal_size_limit=67108864;", NULL, NULL,
                     &msg) != SQLITE_OK) {
        rc = sqlite3_errcode(d);
        qerr_set(err, errlen, code(rc), "cannot set up the database %s: %s", path, msg ? msg : sqlite3_errmsg(d));
        sqlite3_free(msg);
        sqlite3_close(d);
        return code(rc);
    }
    for (int i = level; i < n; i++) {
        char setv[48];
        snprintf(setv, sizeof setv, "PRAGMA user_version=%d;", i + 1);
        rc = sqlite3_exec(d, "BEGIN IMMEDIATE;", NULL, NULL, &msg);
        if (rc == SQLITE_OK) rc = sqlite3_exec(d, sql[i], NULL, NULL, &msg);
        if (rc == SQLITE_OK) rc = sqlite3_exec(d, setv, NULL, NULL, &msg);
        if (rc == SQLITE_OK) rc = sqlite3_exec(d, "COMMIT;", NULL, NULL, &msg);
        if (rc != SQLITE_OK) {
            qerr_set(err, errlen, QERR_INTERNAL, "migration %d of the database %s failed: %s (left at level %d)",
                     i + 1, path, msg ? msg : sqlite3_errmsg(d), i);
            sqlite3_free(msg);
            sqlite3_exec(d, "ROLLBACK;", NULL, NULL, NULL);
            sqlite3_close(d);
            return QERR_INTERNAL;
        }
    }
    *db = d;
    return 0;
}

/* ---- the set of blocks in the tier ---------------------------------------------- */

uint64_t qstore_key(const uint8_t fp[16], const uint8_t hash[16])
{
    uint64_t a = 0, b = 0;
    for (int i = 0; i < 8; i++) a |= (uint64_t)hash[i] << (8 * i), b |= (uint64_t)fp[i] << (8 * i);
    uint64_t k = a ^ (b * 0x9e3779b97f4a7c15ULL);
    k ^= k >> 31;
    return k < 2 ? k + 2 : k;
}

/* The slot of k, or of the first free slot on its probe path (cap > 0). */
static size_t key_slot(const qstore *s, uint64_t k, int for_insert)
{
    size_t i = (size_t)(k * 0xff51afd7ed558ccdULL) & (s->key_cap - 1), tomb = (size_t)-1;
    for (;;) {
        const uint64_t v = s->keys[i];
        if (v == k) return i;
        if (v == 0) return for_insert && tomb != (size_t)-1 ? tomb : i;
        if (v == 1 && tomb == (size_t)-1) tomb = i;
        i = (i + 1) & (s->key_cap - 1);
    }
}

void qstore_key_add(qstore *s, uint64_t k)
{
    if ((s->key_n + s->key_dead + 1) * 10 > s->key_cap * 7) {
        size_t cap = s->key_cap ? s->key_cap : 1024;
        while ((s->key_n + 1) * 10 > cap * 5) cap *= 2;
        uint64_t *old = s->keys, *nk = calloc(cap, sizeof *nk);
        if (!nk) return;
        const size_t oc = s->key_cap;
        s->keys = nk, s->key_cap = cap, s->key_n = 0, s->key_dead = 0;
        for (size_t i = 0; i < oc; i++)
            if (old[i] > 1) s->keys[key_slot(s, old[i], 1)] = old[i], s->key_n++;
        free(old);
    }
    const size_t i = key_slot(s, k, 1);
    if (s->keys[i] == k) return;
    if (s->keys[i] == 1) s->key_dead--;
    s->keys[i] = k;
    s->key_n++;
}

void qstore_key_del(qstore *s, uint64_t k)
{
    if (!s->key_cap) return;
    const size_t i = key_slot(s, k, 0);
    if (s->keys[i] != k) return;
    s->keys[i] = 1;
    s->key_n--;
    s->key_dead++;
}

int qstore_has_block(qstore *s, const uint8_t fp[16], const uint8_t hash[16])
{
    const uint64_t k = qstore_key(fp, hash);
    pthread_mutex_lock(&s->mu);
    const int has = s->key_cap && s->keys[key_slot(s, k, 0)] == k;
    pthread_mutex_unlock(&s->mu);
    return has;
}

/* ---- the store thread ------------------------------------------------------------ */

qstore_job *qstore_job_new(qstore_kind kind)
{
    qstore_job *j = calloc(1, sizeof *j);
    if (j) j->kind = kind;
    return j;
}

void qstore_job_free(qstore_job *j)
{
    if (!j) return;
    free(j->text);
    json_decref(j->msgs);
    json_decref(j->result);
    free(j->hashes);
    free(j->tokens);
    free(j->kv);
    free(j);
}

/* Bytes a queued job holds against queue_max.  The queue runs in order,
 * but for lookups (enqueue). */
static size_t job_bytes(const qstore_job *j)
{
    return j->kind == QSTORE_PUT ? (size_t)j->n * j->block_bytes : 0;
}

static void *store_main(void *arg)
{
    qstore *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
        qstore_job *j = s->head;
        if (j) {
            s->head = j->next;
            if (!s->head) s->tail = NULL;
        }
        pthread_mutex_unlock(&s->mu);
        if (!j) break; /* stopping, and the queue is empty */
        j->next = NULL;
        qstore_run(s, j);
        pthread_mutex_lock(&s->mu);
        s->st.queued_bytes -= job_bytes(j);
        if (j->rc && j->rc != QERR_NOTFOUND && j->rc != QERR_INVAL) s->st.jobs_failed++;
        pthread_mutex_unlock(&s->mu);
        if (j->rc && j->rc != QERR_NOTFOUND && j->rc != QERR_INVAL)
            QLOGW("store: %s", j->err[0] ? j->err : qerr_str(j->rc));
        if (j->done) j->done(j);
        else qstore_job_free(j);
    }
    return NULL;
}

int qstore_start(const char *path, const qstore_opts *o, qstore **out, char *err, size_t errlen)
{
    *out = NULL;
    qstore *s = calloc(1, sizeof *s);
    if (!s) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    if (o) s->o = *o;
    if (!s->o.queue_max) s->o.queue_max = (size_t)256 << 20;
    int rc = qstore_open(path, qstore_migrations, qstore_n_migrations, &s->db, err, errlen);
    int mended = 0;
    if (!rc && (rc = qstore_repair_turns(s, path, &mended, err, errlen)) == 0 && mended)
        QLOGW("store: %d session%s had a turn cut by a stop before its reply; each got an empty reply marked partial",
              mended, mended == 1 ? "" : "s");
    if (!rc && (rc = qstore_tier_init(s))) qerr_set(err, errlen, rc, "cannot read the database %s: %s", path,
                                                   sqlite3_errmsg(s->db));
    if (rc) {
        sqlite3_close(s->db);
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->th, NULL, store_main, s)) {
        sqlite3_close(s->db);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return qerr_set(err, errlen, QERR_NOMEM, "cannot start the store thread");
    }
    *out = s;
    return 0;
}

void qstore_stop(qstore *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    sqlite3_close(s->db);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->keys);
    free(s);
}

void qstore_stats_get(qstore *s, qstore_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    pthread_mutex_unlock(&s->mu);
}

/* Queues j unless stopping; a PUT only within queue_max. */
static int enqueue(qstore *s, qstore_job *j)
{
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return QERR_BUSY;
    }
    const size_t b = job_bytes(j);
    if (b && s->st.queued_bytes + b > s->o.queue_max) {
        s->st.blocks_dropped += (uint64_t)j->n;
        pthread_mutex_unlock(&s->mu);
        return QERR_BUSY;
    }
    s->st.queued_bytes += b;
    j->t_queued = q_now();
    j->next = NULL;
    /* A lookup goes before the block writes and touches waiting (a request
     * waits for it; they wait for nobody), after everything else. */
    qstore_job **pp = s->tail ? &s->tail->next : &s->head;
    if (j->kind == QSTORE_BLOCKS)
        for (pp = &s->head; *pp && (*pp)->kind != QSTORE_PUT && (*pp)->kind != QSTORE_TOUCH; pp = &(*pp)->next) {
        }
    j->next = *pp;
    *pp = j;
    if (!j->next) s->tail = j;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int qstore_submit(qstore *s, qstore_job *j)
{
    return enqueue(s, j);
}

/* A block job of kind with n hashes (copied): NULL when out of memory. */
static qstore_job *block_job(qstore_kind kind, const uint8_t fp[16], int n, const uint8_t (*hashes)[16])
{
    qstore_job *j = qstore_job_new(kind);
    if (!j || n < 1 || !(j->hashes = malloc((size_t)n * 16))) {
        qstore_job_free(j);
        return NULL;
    }
    memcpy(j->fp, fp, 16);
    memcpy(j->hashes, hashes, (size_t)n * 16);
    j->n = n;
    return j;
}

int qstore_put_blocks(qstore *s, const uint8_t fp[16], int n, const uint8_t (*hashes)[16],
                      const uint8_t (*parents)[16], const int32_t *tokens, int block_size, void *kv,
                      size_t block_bytes)
{
    if (n < 1 || block_size < 1) {
        free(kv);
        return QERR_INVAL;
    }
    qstore_job *j = block_job(QSTORE_PUT, fp, n, hashes);
    /* Parents follow the hashes in one array: hashes[n..2n). */
    uint8_t (*hp)[16] = j ? realloc(j->hashes, (size_t)n * 32) : NULL;
    int32_t *tok = hp ? q_mallocn((size_t)n * (size_t)block_size, sizeof *tok) : NULL;
    if (!tok) {
        if (hp) j->hashes = hp;
        qstore_job_free(j);
        free(kv);
        return QERR_NOMEM;
    }
    j->hashes = hp;
    memcpy(hp + n, parents, (size_t)n * 16);
    memcpy(tok, tokens, sizeof *tok * (size_t)n * (size_t)block_size);
    j->tokens = tok;
    j->kv = kv;
    j->block_size = block_size;
    j->block_bytes = block_bytes;
    int rc = enqueue(s, j);
    if (rc) qstore_job_free(j);
    return rc;
}

int qstore_touch_blocks(qstore *s, const uint8_t fp[16], int n, const uint8_t (*hashes)[16])
{
    if (n < 1) return 0;
    qstore_job *j = block_job(QSTORE_TOUCH, fp, n, hashes);
    if (!j) return QERR_NOMEM;
    int rc = enqueue(s, j);
    if (rc) qstore_job_free(j);
    return rc;
}
