/* store.h - quire's sqlite database: opening it, and its schema's
 * migrations (migrations/NNNN_*.sql, compiled into the program).
 *
 * A database's level is PRAGMA user_version: the number of migrations
 * applied.  Opening applies the missing ones in order, each in its own
 * transaction (a migration that fails leaves the database at the level
 * before it), and refuses a database of a higher level than the program
 * knows, and a file that is not a database.  The journal is WAL. */
#ifndef QUIRE_STORE_H
#define QUIRE_STORE_H

#include <stddef.h>

typedef struct sqlite3 sqlite3;

/* The program's migrations, in order (from migrations/; generated). */
extern const char *const qstore_migrations[];
extern const int qstore_n_migrations;

/* Opens (creating) the database at path and brings it to the level of the
 * n migrations sql[] (qstore_migrations / qstore_n_migrations for the
 * program's own): 0 with *db open (sqlite3_close it), or a QERR_* code with
 * a message: QERR_IO (cannot open or write), QERR_FORMAT (not a database,
 * or corrupt), QERR_UNSUPPORTED (a newer database than these migrations
 * know), QERR_INTERNAL (a migration failed; the database is left at the
 * level before it). */
int qstore_open(const char *path, const char *const *sql, int n, sqlite3 **db, char *err, size_t errlen);

/* The database's level (PRAGMA user_version), or -1 on error. */
int qstore_level(sqlite3 *db);

#endif
