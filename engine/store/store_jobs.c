/* store_jobs.c - what the store thread does in sqlite for each job
 * (store.h): sessions and their messages, and the persistent tier of the
 * prefix cache (blocks keyed by fingerprint and chain hash, their K/V in
 * block_data, a checksum over both, LRU eviction under disk_max).
 *
 * Every job is one transaction.  A block's row and its K/V commit together
 * or not at all, and a block read back is checked against its checksum and
 * shape before it is handed out: a damaged one is deleted and counted, and
 * the chain ends before it. */
#define _GNU_SOURCE
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "qerr.h"
#include "store_int.h"
#include "util.h"

/* ---- helpers ------------------------------------------------------------------- */

/* Prepares sql into *st; on failure fills j's error.  0 or the code. */
static int prep(qstore *s, qstore_job *j, const char *sql, sqlite3_stmt **st)
{
    if (sqlite3_prepare_v2(s->db, sql, -1, st, NULL) == SQLITE_OK) return 0;
    j->rc = QERR_IO;
    snprintf(j->err, sizeof j->err, "sqlite: %s", sqlite3_errmsg(s->db));
    return j->rc;
}

/* Records sqlite's last error in j (unless one is set) and returns it. */
static int failed(qstore *s, qstore_job *j)
{
    if (!j->rc) {
        const int c = sqlite3_errcode(s->db) & 0xff;
        j->rc = c == SQLITE_CORRUPT || c == SQLITE_NOTADB ? QERR_FORMAT : c == SQLITE_NOMEM ? QERR_NOMEM : QERR_IO;
        snprintf(j->err, sizeof j->err, "sqlite: %s", sqlite3_errmsg(s->db));
    }
    return j->rc;
}

static int exec(qstore *s, qstore_job *j, const char *sql)
{
    return sqlite3_exec(s->db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : failed(s, j);
}

static void begin(qstore *s, qstore_job *j) { exec(s, j, "BEGIN IMMEDIATE"); }

/* Commits when the job went well, else rolls back. */
static void end(qstore *s, qstore_job *j)
{
    if (!j->rc && exec(s, j, "COMMIT") == 0) return;
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
}

static void text(sqlite3_stmt *st, int i, const char *v) { sqlite3_bind_text(st, i, v ? v : "", -1, SQLITE_TRANSIENT); }

static const char *col_text(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? (const char *)t : "";
}

static json_int_t now_s(void) { return (json_int_t)time(NULL); }

/* ---- sessions ------------------------------------------------------------------ */

/* A new session id: 128 random bits as hex, after "sess_". */
static int new_id(char out[QSTORE_ID_MAX])
{
    unsigned char r[16];
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t n = getrandom(r + got, sizeof r - got, 0);
        if (n <= 0) return QERR_IO;
        got += (size_t)n;
    }
    memcpy(out, "sess_", 5);
    for (int i = 0; i < 16; i++) snprintf(out + 5 + 2 * i, 3, "%02x", r[i]);
    return 0;
}

/* 1 when session id exists and belongs to owner; 0 (j->rc NOTFOUND) when
 * not; the error code from sqlite otherwise. */
static int owned(qstore *s, qstore_job *j)
{
    sqlite3_stmt *st = NULL;
    if (prep(s, j, "SELECT 1 FROM sessions WHERE id = ? AND owner = ?", &st)) return j->rc;
    text(st, 1, j->id);
    text(st, 2, j->owner);
    const int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc == SQLITE_ROW) return 1;
    if (rc != SQLITE_DONE) return failed(s, j);
    j->rc = QERR_NOTFOUND;
    snprintf(j->err, sizeof j->err, "no session '%s'", j->id);
    return 0;
}

/* The session's messages: [{role, content[, status, created]}] (full: all
 * four fields), or NULL with j's error. */
static json_t *messages(qstore *s, qstore_job *j, int full)
{
    sqlite3_stmt *st = NULL;
    if (prep(s, j, "SELECT role, content, status, created FROM messages WHERE session_id = ? ORDER BY seq", &st))
        return NULL;
    text(st, 1, j->id);
    json_t *a = json_array();
    int rc;
    while (a && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *m = json_pack("{s:s, s:s}", "role", col_text(st, 0), "content", col_text(st, 1));
        if (m && full) {
            json_object_set_new(m, "status", json_string(col_text(st, 2)));
            json_object_set_new(m, "created", json_integer(sqlite3_column_int64(st, 3)));
        }
        if (!m || json_array_append_new(a, m)) {
            json_decref(a);
            a = NULL;
        }
    }
    if (a && rc != SQLITE_DONE) {
        json_decref(a);
        a = NULL;
        failed(s, j);
    }
    sqlite3_finalize(st);
    if (!a && !j->rc) j->rc = QERR_NOMEM, snprintf(j->err, sizeof j->err, "out of memory");
    return a;
}

/* Appends a message to session j->id and marks the session updated. */
static int append(qstore *s, qstore_job *j, const char *role, const char *content, const char *status)
{
    sqlite3_stmt *st = NULL;
    if (prep(s, j,
             "INSERT INTO messages (session_id, seq, role, content, status, created) VALUES (?1, (SELECT "
             "coalesce(max(seq), 0) + 1 FROM messages WHERE session_id = ?1), ?2, ?3, ?4, ?5)",
             &st))
        return j->rc;
    text(st, 1, j->id);
    text(st, 2, role);
    text(st, 3, content);
    text(st, 4, status);
    sqlite3_bind_int64(st, 5, now_s());
    const int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return failed(s, j);
    if (prep(s, j, "UPDATE sessions SET updated = ?2 WHERE id = ?1", &st)) return j->rc;
    text(st, 1, j->id);
    sqlite3_bind_int64(st, 2, now_s());
    const int rc2 = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc2 != SQLITE_DONE) return failed(s, j);
    pthread_mutex_lock(&s->mu);
    s->st.messages_written++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* A title from the first user message: its first line, at most 60 bytes,
 * cut at a character boundary. */
static void title_of(const json_t *msgs, char *out, size_t cap)
{
    out[0] = 0;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *r = json_string_value(json_object_get(m, "role"));
        const char *c = json_string_value(json_object_get(m, "content"));
        if (!r || !c || strcmp(r, "user")) continue;
        size_t n = strcspn(c, "\n");
        if (n > 60) n = 60;
        if (n >= cap) n = cap - 1;
        while (n > 0 && ((unsigned char)c[n] & 0xc0) == 0x80) n--;
        memcpy(out, c, n);
        out[n] = 0;
        return;
    }
}

static void run_list(qstore *s, qstore_job *j)
{
    sqlite3_stmt *st = NULL;
    if (prep(s, j,
             "SELECT id, title, created, updated, (SELECT count(*) FROM messages m WHERE m.session_id = s.id) "
             "FROM sessions s WHERE owner = ? ORDER BY updated DESC, created DESC, id LIMIT 1000",
             &st))
        return;
    text(st, 1, j->owner);
    json_t *a = json_array();
    int rc;
    while (a && (rc = sqlite3_step(st)) == SQLITE_ROW)
        json_array_append_new(a, json_pack("{s:s, s:s, s:I, s:I, s:I}", "id", col_text(st, 0), "title",
                                           col_text(st, 1), "created", (json_int_t)sqlite3_column_int64(st, 2),
                                           "updated", (json_int_t)sqlite3_column_int64(st, 3), "messages",
                                           (json_int_t)sqlite3_column_int64(st, 4)));
    if (a && rc != SQLITE_DONE) failed(s, j);
    sqlite3_finalize(st);
    if (!a && !j->rc) j->rc = QERR_NOMEM;
    if (j->rc) json_decref(a);
    else j->result = a;
}

static void run_get(qstore *s, qstore_job *j)
{
    sqlite3_stmt *st = NULL;
    if (prep(s, j, "SELECT title, created, updated FROM sessions WHERE id = ? AND owner = ?", &st)) return;
    text(st, 1, j->id);
    text(st, 2, j->owner);
    const int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        j->result = json_pack("{s:s, s:s, s:I, s:I}", "id", j->id, "title", col_text(st, 0), "created",
                              (json_int_t)sqlite3_column_int64(st, 1), "updated",
                              (json_int_t)sqlite3_column_int64(st, 2));
    else if (rc == SQLITE_DONE) j->rc = QERR_NOTFOUND, snprintf(j->err, sizeof j->err, "no session '%s'", j->id);
    else failed(s, j);
    sqlite3_finalize(st);
    if (j->rc) return;
    json_t *m = messages(s, j, 1);
    if (!m || !j->result) {
        json_decref(m);
        json_decref(j->result);
        j->result = NULL;
        if (!j->rc) j->rc = QERR_NOMEM;
        return;
    }
    json_object_set_new(j->result, "messages", m);
}

static void run_change(qstore *s, qstore_job *j)
{
    sqlite3_stmt *st = NULL;
    const int del = j->kind == QSTORE_DELETE;
    if (!del && (!j->text || strlen(j->text) > QSTORE_TITLE_MAX)) {
        j->rc = QERR_INVAL;
        snprintf(j->err, sizeof j->err, "a title is a string of at most %d bytes", QSTORE_TITLE_MAX);
        return;
    }
    if (prep(s, j,
             del ? "DELETE FROM sessions WHERE id = ?1 AND owner = ?2"
                 : "UPDATE sessions SET title = ?3, updated = ?4 WHERE id = ?1 AND owner = ?2",
             &st))
        return;
    text(st, 1, j->id);
    text(st, 2, j->owner);
    if (!del) {
        text(st, 3, j->text);
        sqlite3_bind_int64(st, 4, now_s());
    }
    if (sqlite3_step(st) != SQLITE_DONE) failed(s, j);
    else if (sqlite3_changes(s->db) == 0) j->rc = QERR_NOTFOUND, snprintf(j->err, sizeof j->err, "no session '%s'", j->id);
    sqlite3_finalize(st);
}

/* Leaves only the first j->keep messages of session j->id (a keep past its
 * messages is refused: the caller's count of them is wrong). */
static int drop_after(qstore *s, qstore_job *j)
{
    sqlite3_stmt *st = NULL;
    if (prep(s, j, "SELECT count(*) FROM messages WHERE session_id = ?", &st)) return j->rc;
    text(st, 1, j->id);
    const int rc = sqlite3_step(st);
    const int have = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW) return failed(s, j);
    if (j->keep > have) {
        j->rc = QERR_INVAL;
        snprintf(j->err, sizeof j->err, "keep_messages is %d, but the session holds %d messages", j->keep, have);
        return j->rc;
    }
    if (prep(s, j,
             "DELETE FROM messages WHERE session_id = ?1 AND seq IN (SELECT seq FROM messages WHERE session_id = ?1 "
             "ORDER BY seq LIMIT -1 OFFSET ?2)",
             &st))
        return j->rc;
    text(st, 1, j->id);
    sqlite3_bind_int(st, 2, j->keep);
    if (sqlite3_step(st) != SQLITE_DONE) failed(s, j);
    sqlite3_finalize(st);
    return j->rc;
}

static void run_turn(qstore *s, qstore_job *j)
{
    if (!json_is_array(j->msgs) || (j->truncate && (j->keep < 0 || !j->id[0]))) {
        j->rc = QERR_INVAL;
        snprintf(j->err, sizeof j->err, "%s", json_is_array(j->msgs) ? "nothing to keep" : "no messages to append");
        return;
    }
    begin(s, j);
    if (!j->rc && !j->id[0]) {
        char title[64];
        title_of(j->msgs, title, sizeof title);
        sqlite3_stmt *st = NULL;
        if (new_id(j->id)) j->rc = QERR_IO, snprintf(j->err, sizeof j->err, "no random bytes for a session id");
        else if (!prep(s, j, "INSERT INTO sessions (id, owner, title, created, updated) VALUES (?, ?, ?, ?, ?)", &st)) {
            text(st, 1, j->id);
            text(st, 2, j->owner);
            text(st, 3, title);
            sqlite3_bind_int64(st, 4, now_s());
            sqlite3_bind_int64(st, 5, now_s());
            if (sqlite3_step(st) != SQLITE_DONE) failed(s, j);
            sqlite3_finalize(st);
        }
    } else if (!j->rc && owned(s, j) == 1 && j->truncate) {
        drop_after(s, j);
    }
    size_t i;
    json_t *m;
    json_array_foreach(j->msgs, i, m) {
        if (j->rc) break;
        append(s, j, json_string_value(json_object_get(m, "role")), json_string_value(json_object_get(m, "content")),
               "done");
    }
    if (!j->rc) j->result = messages(s, j, 0);
    end(s, j);
    if (j->rc) {
        json_decref(j->result);
        j->result = NULL;
    }
}

static void run_reply(qstore *s, qstore_job *j)
{
    begin(s, j);
    /* The reply belongs to the session whatever its owner: the turn that
     * asked for it was checked. */
    sqlite3_stmt *st = NULL;
    if (!j->rc && !prep(s, j, "SELECT 1 FROM sessions WHERE id = ?", &st)) {
        text(st, 1, j->id);
        const int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE) j->rc = QERR_NOTFOUND, snprintf(j->err, sizeof j->err, "no session '%s'", j->id);
        else if (rc != SQLITE_ROW) failed(s, j);
        sqlite3_finalize(st);
    }
    if (!j->rc) append(s, j, "assistant", j->text, j->partial ? "partial" : "done");
    end(s, j);
}

int qstore_repair_turns(qstore *s, const char *path, int *added, char *err, size_t errlen)
{
    *added = 0;
    /* A session's tail is its highest seq (the primary key's order). */
    static const char sql[] =
        "INSERT INTO messages (session_id, seq, role, content, status, created) "
        "SELECT m.session_id, m.seq + 1, 'assistant', '', 'partial', m.created "
        "FROM (SELECT session_id, max(seq) AS seq FROM messages GROUP BY session_id) t "
        "JOIN messages m ON m.session_id = t.session_id AND m.seq = t.seq WHERE m.role <> 'assistant'";
    int rc = sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_exec(s->db, sql, NULL, NULL, NULL);
    const int n = rc == SQLITE_OK ? sqlite3_changes(s->db) : 0;
    if (rc == SQLITE_OK) rc = sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        const int c = sqlite3_extended_errcode(s->db) & 0xff;
        const int code = c == SQLITE_CORRUPT || c == SQLITE_NOTADB ? QERR_FORMAT
                         : c == SQLITE_NOMEM                       ? QERR_NOMEM
                                                                   : QERR_IO;
        qerr_set(err, errlen, code, "cannot mend the turns cut short in the database %s: %s", path,
                 sqlite3_errmsg(s->db));
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
        return code;
    }
    *added = n;
    return 0;
}

/* ---- the persistent tier ---------------------------------------------------------- */

/* The checksum of a block: 64 bits of qhash over its token bytes and K/V. */
static int64_t checksum(const void *tok, size_t tok_bytes, const void *kv, size_t kv_bytes)
{
    qhash h;
    qhash_init(&h, 0x626c6f636b73756dULL);
    qhash_u64(&h, tok_bytes);
    qhash_update(&h, tok, tok_bytes);
    qhash_update(&h, kv, kv_bytes);
    uint8_t out[16];
    qhash_final(&h, out);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)out[i] << (8 * i);
    return (int64_t)v;
}

/* Token ids as little-endian bytes (the tokens column). */
static void tokens_le(const int32_t *t, int n, unsigned char *out)
{
    for (int i = 0; i < n; i++) {
        const uint32_t v = (uint32_t)t[i];
        out[4 * i] = (unsigned char)v, out[4 * i + 1] = (unsigned char)(v >> 8);
        out[4 * i + 2] = (unsigned char)(v >> 16), out[4 * i + 3] = (unsigned char)(v >> 24);
    }
}

int qstore_tier_init(qstore *s)
{
    sqlite3_stmt *st = NULL;
    /* The set of blocks, from scratch. */
    free(s->keys);
    s->keys = NULL;
    s->key_cap = s->key_n = s->key_dead = 0;
    if (sqlite3_prepare_v2(s->db, "SELECT fingerprint, hash FROM blocks", -1, &st, NULL) != SQLITE_OK) return QERR_IO;
    int step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        const void *fp = sqlite3_column_blob(st, 0), *h = sqlite3_column_blob(st, 1);
        if (fp && h && sqlite3_column_bytes(st, 0) == 16 && sqlite3_column_bytes(st, 1) == 16)
            qstore_key_add(s, qstore_key(fp, h));
    }
    sqlite3_finalize(st);
    if (step != SQLITE_DONE) return QERR_IO;
    if (sqlite3_prepare_v2(s->db, "SELECT count(*), coalesce(sum(bytes), 0), coalesce(max(last_used), 0) FROM blocks",
                           -1, &st, NULL) != SQLITE_OK)
        return QERR_IO;
    int rc = QERR_IO;
    if (sqlite3_step(st) == SQLITE_ROW) {
        s->st.disk_blocks = sqlite3_column_int64(st, 0);
        s->st.disk_bytes = sqlite3_column_int64(st, 1);
        s->clock = sqlite3_column_int64(st, 2);
        rc = 0;
    }
    sqlite3_finalize(st);
    return rc;
}

/* Removes block row id (its K/V go with it) of `bytes`. */
static int drop_block(qstore *s, qstore_job *j, int64_t id, int64_t bytes)
{
    sqlite3_stmt *st = NULL;
    if (prep(s, j, "DELETE FROM blocks WHERE id = ? RETURNING fingerprint, hash", &st)) return j->rc;
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    uint64_t key = 0;
    if (rc == SQLITE_ROW) {
        const void *fp = sqlite3_column_blob(st, 0), *h = sqlite3_column_blob(st, 1);
        if (fp && h && sqlite3_column_bytes(st, 0) == 16 && sqlite3_column_bytes(st, 1) == 16) key = qstore_key(fp, h);
        rc = sqlite3_step(st);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return failed(s, j);
    pthread_mutex_lock(&s->mu);
    if (key) qstore_key_del(s, key);
    s->st.disk_blocks--;
    s->st.disk_bytes -= bytes;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* The blocks' bytes kept at most: 7/8 of disk_max, the rest left for
 * sqlite's pages, indexes and the sessions, so that the file stays under
 * disk_max; 0 without a bound. */
static int64_t cap_bytes(const qstore *s)
{
    return s->o.disk_max > 0 ? s->o.disk_max - s->o.disk_max / 8 : 0;
}

/* Evicts least recently used blocks until `need` more bytes fit under
 * the cap. */
static int evict(qstore *s, qstore_job *j, int64_t need)
{
    const int64_t cap = cap_bytes(s);
    if (cap <= 0) return 0;
    while (!j->rc && s->st.disk_bytes + need > cap && s->st.disk_blocks > 0) {
        sqlite3_stmt *st = NULL;
        if (prep(s, j, "SELECT id, bytes FROM blocks ORDER BY last_used LIMIT 32", &st)) return j->rc;
        int64_t ids[32], bytes[32];
        int n = 0, rc;
        while (n < 32 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
            ids[n] = sqlite3_column_int64(st, 0);
            bytes[n++] = sqlite3_column_int64(st, 1);
        }
        sqlite3_finalize(st);
        if (n == 0) break;
        for (int i = 0; i < n && !j->rc && s->st.disk_bytes + need > cap; i++)
            if (!drop_block(s, j, ids[i], bytes[i])) {
                pthread_mutex_lock(&s->mu);
                s->st.blocks_evicted++;
                pthread_mutex_unlock(&s->mu);
            }
    }
    return j->rc;
}

/* Sets last_used of block (fp, hash) to the next tick: 1 when it exists. */
static int touch(qstore *s, qstore_job *j, const uint8_t hash[16])
{
    sqlite3_stmt *st = NULL;
    if (prep(s, j, "UPDATE blocks SET last_used = ? WHERE fingerprint = ? AND hash = ?", &st)) return j->rc;
    sqlite3_bind_int64(st, 1, ++s->clock);
    sqlite3_bind_blob(st, 2, j->fp, 16, SQLITE_STATIC);
    sqlite3_bind_blob(st, 3, hash, 16, SQLITE_STATIC);
    const int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return failed(s, j);
    return sqlite3_changes(s->db) > 0;
}

static void run_put(qstore *s, qstore_job *j)
{
    const size_t tb = (size_t)j->block_size * 4;
    const int64_t bytes = (int64_t)(tb + j->block_bytes);
    unsigned char *tle = malloc(tb);
    if (!tle) {
        j->rc = QERR_NOMEM;
        return;
    }
    begin(s, j);
    for (int i = 0; i < j->n && !j->rc; i++) {
        if (touch(s, j, j->hashes[i]) != 0) continue; /* there already, or an error */
        if (cap_bytes(s) > 0 && bytes > cap_bytes(s)) break; /* never fits */
        if (evict(s, j, bytes)) break;
        const unsigned char *kv = j->kv + (size_t)i * j->block_bytes;
        tokens_le(j->tokens + (size_t)i * (size_t)j->block_size, j->block_size, tle);
        sqlite3_stmt *st = NULL;
        if (prep(s, j,
                 "INSERT INTO blocks (fingerprint, hash, parent, tokens, checksum, bytes, last_used) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?)",
                 &st))
            break;
        sqlite3_bind_blob(st, 1, j->fp, 16, SQLITE_STATIC);
        sqlite3_bind_blob(st, 2, j->hashes[i], 16, SQLITE_STATIC);
        sqlite3_bind_blob(st, 3, j->hashes[j->n + i], 16, SQLITE_STATIC);
        sqlite3_bind_blob(st, 4, tle, (int)tb, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, checksum(tle, tb, kv, j->block_bytes));
        sqlite3_bind_int64(st, 6, bytes);
        sqlite3_bind_int64(st, 7, ++s->clock);
        int rc = sqlite3_step(st);
        sqlite3_finalize(st);
        if (rc != SQLITE_DONE) {
            failed(s, j);
            break;
        }
        const int64_t id = sqlite3_last_insert_rowid(s->db);
        if (prep(s, j, "INSERT INTO block_data (id, kv) VALUES (?, ?)", &st)) break;
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_blob64(st, 2, kv, j->block_bytes, SQLITE_STATIC);
        rc = sqlite3_step(st);
        sqlite3_finalize(st);
        if (rc != SQLITE_DONE) {
            failed(s, j);
            break;
        }
        pthread_mutex_lock(&s->mu);
        qstore_key_add(s, qstore_key(j->fp, j->hashes[i]));
        s->st.blocks_written++;
        s->st.disk_blocks++;
        s->st.disk_bytes += bytes;
        pthread_mutex_unlock(&s->mu);
    }
    free(tle);
    end(s, j);
    if (j->rc) {
        /* Rolled back: the counts go back to what the database holds. */
        pthread_mutex_lock(&s->mu);
        qstore_tier_init(s);
        pthread_mutex_unlock(&s->mu);
    }
}

static void run_touch(qstore *s, qstore_job *j)
{
    begin(s, j);
    for (int i = 0; i < j->n && !j->rc; i++) touch(s, j, j->hashes[i]);
    end(s, j);
}

static void run_blocks(qstore *s, qstore_job *j)
{
    const size_t tb = (size_t)j->block_size * 4;
    pthread_mutex_lock(&s->mu);
    s->st.lookups++;
    pthread_mutex_unlock(&s->mu);
    if (j->n < 1 || j->block_size < 1 || !j->block_bytes) {
        j->rc = QERR_INVAL;
        return;
    }
    j->tokens = q_mallocn((size_t)j->n * (size_t)j->block_size, sizeof *j->tokens);
    j->kv = q_mallocn((size_t)j->n, j->block_bytes);
    if (!j->tokens || !j->kv) {
        j->rc = QERR_NOMEM;
        return;
    }
    begin(s, j);
    sqlite3_stmt *st = NULL;
    if (!j->rc && !prep(s, j,
                        "SELECT b.id, b.tokens, b.checksum, b.bytes, d.kv FROM blocks b JOIN block_data d ON d.id = "
                        "b.id WHERE b.fingerprint = ? AND b.hash = ?",
                        &st)) {
        sqlite3_bind_blob(st, 1, j->fp, 16, SQLITE_STATIC);
        for (int i = 0; i < j->n; i++) {
            sqlite3_bind_blob(st, 2, j->hashes[i], 16, SQLITE_STATIC);
            const int rc = sqlite3_step(st);
            if (rc != SQLITE_ROW) {
                if (rc != SQLITE_DONE) failed(s, j);
                break;
            }
            const int64_t id = sqlite3_column_int64(st, 0), bytes = sqlite3_column_int64(st, 3);
            const unsigned char *tok = sqlite3_column_blob(st, 1);
            const size_t tl = (size_t)sqlite3_column_bytes(st, 1);
            const unsigned char *kv = sqlite3_column_blob(st, 4);
            const size_t kl = (size_t)sqlite3_column_bytes(st, 4);
            if (!tok || !kv || tl != tb || kl != j->block_bytes ||
                checksum(tok, tl, kv, kl) != sqlite3_column_int64(st, 2)) {
                sqlite3_reset(st);
                QLOGW("store: a persisted KV block failed its check; it is removed");
                drop_block(s, j, id, bytes);
                pthread_mutex_lock(&s->mu);
                s->st.blocks_corrupt++;
                pthread_mutex_unlock(&s->mu);
                break;
            }
            for (int k = 0; k < j->block_size; k++)
                j->tokens[(size_t)i * (size_t)j->block_size + (size_t)k] =
                    (int32_t)((uint32_t)tok[4 * k] | (uint32_t)tok[4 * k + 1] << 8 | (uint32_t)tok[4 * k + 2] << 16 |
                              (uint32_t)tok[4 * k + 3] << 24);
            memcpy(j->kv + (size_t)i * j->block_bytes, kv, kl);
            j->found = i + 1;
            sqlite3_reset(st);
        }
        sqlite3_finalize(st);
    }
    for (int i = 0; i < j->found && !j->rc; i++) touch(s, j, j->hashes[i]);
    end(s, j);
    if (j->rc) j->found = 0;
    pthread_mutex_lock(&s->mu);
    s->st.blocks_loaded += (uint64_t)j->found;
    pthread_mutex_unlock(&s->mu);
}

void qstore_run(qstore *s, qstore_job *j)
{
    j->rc = 0;
    j->err[0] = 0;
    switch (j->kind) {
    case QSTORE_LIST: run_list(s, j); break;
    case QSTORE_GET: run_get(s, j); break;
    case QSTORE_DELETE:
    case QSTORE_RENAME: run_change(s, j); break;
    case QSTORE_TURN: run_turn(s, j); break;
    case QSTORE_REPLY: run_reply(s, j); break;
    case QSTORE_BLOCKS: run_blocks(s, j); break;
    case QSTORE_PUT: run_put(s, j); break;
    case QSTORE_TOUCH: run_touch(s, j); break;
    default: j->rc = QERR_INVAL, snprintf(j->err, sizeof j->err, "unknown store job %d", (int)j->kind);
    }
}
