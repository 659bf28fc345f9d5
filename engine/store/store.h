/* store.h - quire's sqlite database: opening it, its schema's migrations
 * (migrations/NNNN_*.sql, compiled into the program), and the store thread
 * that owns the connection (sessions, messages, the persistent tier of the
 * prefix cache).
 *
 * A database's level is PRAGMA user_version: the number of migrations
 * applied.  Opening applies the missing ones in order, each in its own
 * transaction (a migration that fails leaves the database at the level
 * before it), and refuses a database of a higher level than the program
 * knows, a file that is not a database, and a damaged one: a page that
 * PRAGMA quick_check finds bad, or a table, index or column that its
 * level's migrations made missing.  The journal is WAL.
 *
 * engine/store/ is the database and nothing else: it includes base/ only,
 * and knows blocks as bytes under a hash (the engine's tier.c decides which). */
#ifndef QUIRE_STORE_H
#define QUIRE_STORE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sqlite3 sqlite3;

/* The program's migrations, in order (from migrations/; generated). */
extern const char *const qstore_migrations[];
extern const int qstore_n_migrations;

/* Opens (creating) the database at path and brings it to the level of the
 * n migrations sql[] (qstore_migrations / qstore_n_migrations for the
 * program's own): 0 with *db open (sqlite3_close it), or a QERR_* code with
 * a message naming path: QERR_IO (cannot open or write), QERR_FORMAT (not
 * a database, damaged pages, or tables not what the migrations made: "PATH:
 * the database is damaged (...); move it aside or restore a backup"),
 * QERR_UNSUPPORTED (a newer database than these migrations know),
 * QERR_INTERNAL (a migration failed; the database is left at the level
 * before it).  Reads the whole file once (quick_check). */
int qstore_open(const char *path, const char *const *sql, int n, sqlite3 **db, char *err, size_t errlen);

/* The database's level (PRAGMA user_version), or -1 on error. */
int qstore_level(sqlite3 *db);

/* ---- the store thread ---------------------------------------------------
 *
 * One thread owns the connection.  Other threads hand it jobs through a
 * queue (qstore_submit, qstore_put_blocks, qstore_touch_blocks) and never
 * wait on the disk: a job's result comes back through its done callback,
 * which runs on the store thread.  Jobs run in the order they were queued,
 * each in its own transaction, so a write that committed survives a crash
 * of the process (WAL) and a torn write is never seen. */

typedef struct qstore qstore;

typedef struct {
    int64_t disk_max;   /* bytes of persisted blocks (tokens and K/V) kept at most; 0: no bound */
    size_t queue_max;   /* bytes of block writes queued at most, more are dropped (0: 256 MiB) */
} qstore_opts;

typedef struct {
    uint64_t blocks_written;    /* blocks added to the tier */
    uint64_t blocks_loaded;     /* blocks read back for a lookup */
    uint64_t blocks_evicted;    /* removed to stay under disk_max */
    uint64_t blocks_dropped;    /* writes not queued: the queue was full */
    uint64_t blocks_corrupt;    /* failed their checksum or shape: removed, never loaded */
    uint64_t lookups;           /* QSTORE_BLOCKS jobs */
    uint64_t messages_written;
    uint64_t jobs_failed;       /* jobs that ended with an error from sqlite */
    int64_t disk_blocks, disk_bytes;    /* the tier now */
    size_t queued_bytes;        /* block writes waiting */
} qstore_stats;

/* Opens path (qstore_open with the program's migrations), gives every turn
 * cut short by a stop (a session whose last message is not an assistant's)
 * an empty reply marked partial, and starts the store thread: 0 and *out,
 * or qstore_open's codes with a message. */
int qstore_start(const char *path, const qstore_opts *o, qstore **out, char *err, size_t errlen);
/* Runs every queued job, stops the thread, closes the database.  NULL is a
 * no-op. */
void qstore_stop(qstore *s);
/* Thread-safe.  Cannot fail. */
void qstore_stats_get(qstore *s, qstore_stats *out);

typedef enum {
    /* in: owner.  result: [{id, title, created, updated, messages}], the most
     * recently updated first. */
    QSTORE_LIST = 0,
    /* in: id, owner.  result: {id, title, created, updated, messages:
     * [{role, content, status, created}]}. */
    QSTORE_GET,
    /* in: id, owner. */
    QSTORE_DELETE,
    /* in: id, owner, text (the new title). */
    QSTORE_RENAME,
    /* in: id (empty: a new session, whose id is written back to id), owner,
     * msgs (an array of {role, content}: appended), and with truncate set
     * keep: only the session's first keep messages stay before msgs are
     * appended (a reply asked for again, a message edited).  result: every
     * message of the session in order, as [{role, content}]. */
    QSTORE_TURN,
    /* in: id, text (the assistant's reply), partial (a cancelled request's). */
    QSTORE_REPLY,
    /* in: fp, hashes (n), block_size, block_bytes.  out: found, the leading
     * blocks of the chain present and intact, with their token ids in tokens
     * (found * block_size) and K/V in kv (found * block_bytes). */
    QSTORE_BLOCKS,
    /* Queued by qstore_put_blocks and qstore_touch_blocks only. */
    QSTORE_PUT,
    QSTORE_TOUCH,
} qstore_kind;

#define QSTORE_ID_MAX 48
#define QSTORE_TITLE_MAX 200

typedef struct qstore_job {
    qstore_kind kind;
    char id[QSTORE_ID_MAX];     /* a session's id */
    char owner[72];             /* who may see it ("" without API keys) */
    char *text;                 /* owned */
    json_t *msgs;               /* owned */
    int partial;
    int truncate, keep;         /* QSTORE_TURN */
    uint8_t fp[16];
    uint8_t (*hashes)[16];      /* owned */
    int n, block_size;
    int first;                  /* QSTORE_BLOCKS: where hashes[0] is in the caller's chain (not used by the store) */
    size_t block_bytes;
    int found;
    int32_t *tokens;            /* owned */
    unsigned char *kv;          /* owned */
    /* out: 0, or QERR_NOTFOUND (no such session for this owner), QERR_INVAL
     * (a bad argument), QERR_IO / QERR_FORMAT (sqlite), with err. */
    int rc;
    char err[256];
    json_t *result;             /* owned */
    /* Called on the store thread when the job is done; it owns the job from
     * then on (qstore_job_free).  NULL: the store frees the job. */
    void (*done)(struct qstore_job *j);
    void *user;
    uint64_t tag;
    double t_queued;            /* q_now() when it was queued (set by the store) */
    struct qstore_job *next;
} qstore_job;

/* A zeroed job of kind: NULL when out of memory. */
qstore_job *qstore_job_new(qstore_kind kind);
/* Frees j and what it owns.  NULL is a no-op. */
void qstore_job_free(qstore_job *j);
/* Thread-safe.  Queues j (the store owns it): 0, or QERR_BUSY when the
 * store is stopping (j stays the caller's). */
int qstore_submit(qstore *s, qstore_job *j);

/* Thread-safe.  Queues n full blocks of the chain for the tier: hashes and
 * parents (n each), token ids (n * block_size), and their K/V, kv (n *
 * block_bytes bytes, malloc'd: taken, freed by the store in every case).
 * Blocks already in the tier are marked used instead.  0, or QERR_BUSY when
 * the queue holds queue_max bytes already (the blocks are dropped and
 * counted), QERR_NOMEM. */
int qstore_put_blocks(qstore *s, const uint8_t fp[16], int n, const uint8_t (*hashes)[16],
                      const uint8_t (*parents)[16], const int32_t *tokens, int block_size, void *kv,
                      size_t block_bytes);
/* Thread-safe, in memory (no disk): 1 when the tier holds the block (fp,
 * hash) - or, rarely, another block with the same 64-bit key; 0 when it
 * certainly does not. */
int qstore_has_block(qstore *s, const uint8_t fp[16], const uint8_t hash[16]);
/* Thread-safe.  Marks blocks of the tier used (the LRU order).  0 or
 * QERR_NOMEM. */
int qstore_touch_blocks(qstore *s, const uint8_t fp[16], int n, const uint8_t (*hashes)[16]);

#endif
