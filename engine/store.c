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
