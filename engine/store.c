/* store.c - opening quire's sqlite database and migrating its schema
 * (store.h). */
#include "store.h"

#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "qerr.h"

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
    if (sqlite3_exec(d, "PRAGMA journal_mode=WAL; PRAGMA foreign_keys=ON; PRAGMA synchronous=NORMAL;", NULL, NULL,
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
