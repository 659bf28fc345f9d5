/* test_store.c - the database's migrations (engine/store/store.c): an empty
 * database, one at every earlier level, a newer one (refused), a corrupt
 * file and a file that is not a database (clear errors), a migration that
 * fails (rolled back to the level before it), WAL, the program's own
 * schema, and damaged databases refused (a page of garbage found by
 * quick_check; a table dropped or changed, checked against the
 * migrations). */
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qerr.h"
#include "qtest.h"
#include "store.h"

static char g_dir[] = "/tmp/quire-test-store-XXXXXX";

static const char *path(const char *name)
{
    static char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    return p;
}

/* Three migrations of a test schema. */
static const char *const MIG[3] = {
    "CREATE TABLE a (x INTEGER);",
    "ALTER TABLE a ADD COLUMN y TEXT; INSERT INTO a VALUES (1, 'one');",
    "CREATE TABLE b (z INTEGER); INSERT INTO b SELECT x FROM a;",
};

static int count(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    int n = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return n;
}

static void test_empty_and_every_level(void)
{
    char err[256];
    sqlite3 *db = NULL;
    /* An empty (new) database goes to the last level. */
    REQUIRE(qstore_open(path("new.db"), MIG, 3, &db, err, sizeof err) == 0);
    CHECK_EQ_INT(qstore_level(db), 3);
    CHECK_EQ_INT(count(db, "SELECT count(*) FROM b"), 1);
    sqlite3_stmt *st = NULL;
    REQUIRE(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW);
    CHECK(!strcmp((const char *)sqlite3_column_text(st, 0), "wal"));
    sqlite3_finalize(st);
    sqlite3_close(db);
    /* Reopening changes nothing. */
    REQUIRE(qstore_open(path("new.db"), MIG, 3, &db, err, sizeof err) == 0);
    CHECK_EQ_INT(count(db, "SELECT count(*) FROM b"), 1);
    sqlite3_close(db);
    /* A database left at each earlier level goes the rest of the way. */
    for (int level = 0; level < 3; level++) {
        char name[32];
        snprintf(name, sizeof name, "level%d.db", level);
        REQUIRE(qstore_open(path(name), MIG, level, &db, err, sizeof err) == 0);
        CHECK_EQ_INT(qstore_level(db), level);
        sqlite3_close(db);
        REQUIRE(qstore_open(path(name), MIG, 3, &db, err, sizeof err) == 0);
        CHECK_EQ_INT(qstore_level(db), 3);
        CHECK_EQ_INT(count(db, "SELECT count(*) FROM a WHERE y = 'one'"), 1);
        CHECK_EQ_INT(count(db, "SELECT count(*) FROM b"), 1);
        sqlite3_close(db);
    }
}

static void test_newer_refused(void)
{
    char err[256];
    sqlite3 *db = NULL;
    REQUIRE(qstore_open(path("newer.db"), MIG, 3, &db, err, sizeof err) == 0);
    sqlite3_close(db);
    CHECK_EQ_INT(qstore_open(path("newer.db"), MIG, 2, &db, err, sizeof err), QERR_UNSUPPORTED);
    CHECK(db == NULL);
    CHECK_STR_CONTAINS(err, "schema level 3, newer than this program knows (2)");
}

static void test_not_a_database(void)
{
    char err[256];
    sqlite3 *db = NULL;
    FILE *f = fopen(path("text.db"), "w");
    REQUIRE(f);
    for (int i = 0; i < 300; i++) fputs("this is not a database at all\n", f);
    fclose(f);
    CHECK_EQ_INT(qstore_open(path("text.db"), MIG, 3, &db, err, sizeof err), QERR_FORMAT);
    CHECK(db == NULL);
    CHECK_STR_CONTAINS(err, "is not a quire database");
    /* A real database with its pages overwritten. */
    REQUIRE(qstore_open(path("torn.db"), MIG, 3, &db, err, sizeof err) == 0);
    sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE);", NULL, NULL, NULL);
    sqlite3_close(db);
    f = fopen(path("torn.db"), "r+b");
    REQUIRE(f);
    fseek(f, 16, SEEK_SET);
    for (int i = 0; i < 4000; i++) fputc(0xA5, f);
    fclose(f);
    const int rc = qstore_open(path("torn.db"), MIG, 3, &db, err, sizeof err);
    CHECK(rc == QERR_FORMAT);
    CHECK(db == NULL);
    CHECK(strlen(err) > 0);
}

static void test_failed_migration_rolls_back(void)
{
    char err[256];
    sqlite3 *db = NULL;
    const char *const bad[3] = { MIG[0], MIG[1], "CREATE TABLE b (z INTEGER); INSERT INTO nowhere VALUES (1);" };
    CHECK_EQ_INT(qstore_open(path("bad.db"), bad, 3, &db, err, sizeof err), QERR_INTERNAL);
    CHECK_STR_CONTAINS(err, "migration 3");
    CHECK_STR_CONTAINS(err, "left at level 2");
    REQUIRE(qstore_open(path("bad.db"), MIG, 2, &db, err, sizeof err) == 0);
    CHECK_EQ_INT(qstore_level(db), 2);
    CHECK_EQ_INT(count(db, "SELECT count(*) FROM sqlite_master WHERE name = 'b'"), 0); /* rolled back */
    sqlite3_close(db);
}

static void test_program_schema(void)
{
    char err[256];
    sqlite3 *db = NULL;
    REQUIRE(qstore_n_migrations >= 1);
    REQUIRE(qstore_open(path("quire.db"), qstore_migrations, qstore_n_migrations, &db, err, sizeof err) == 0);
    CHECK_EQ_INT(qstore_level(db), qstore_n_migrations);
    CHECK_EQ_INT(count(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                           "('sessions', 'messages', 'blocks')"),
                 3);
    /* Messages go with their session (foreign keys are on). */
    CHECK(sqlite3_exec(db, "INSERT INTO sessions (id, created, updated) VALUES ('s', 1, 1);"
                           "INSERT INTO messages (session_id, seq, role, content, created) VALUES ('s', 0, 'user', 'hi', 1);"
                           "DELETE FROM sessions WHERE id = 's';",
                       NULL, NULL, NULL) == SQLITE_OK);
    CHECK_EQ_INT(count(db, "SELECT count(*) FROM messages"), 0);
    CHECK(sqlite3_exec(db, "INSERT INTO messages (session_id, seq, role, content, created) VALUES ('none', 0, 'user', "
                           "'x', 1);",
                       NULL, NULL, NULL) != SQLITE_OK);
    CHECK_EQ_INT(count(db, "PRAGMA integrity_check") >= 0, 1);
    sqlite3_close(db);
}

/* ---- damaged databases ---------------------------------------------------------- */

/* A leaf page of table in the middle of its pages (dbstat), or without
 * dbstat its root page; 0 on error. */
static int page_of(sqlite3 *db, const char *table)
{
    sqlite3_stmt *st = NULL;
    int pg = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT pageno FROM dbstat WHERE name = ?1 AND pagetype = 'leaf' ORDER BY pageno LIMIT 1 "
                           "OFFSET (SELECT count(*) FROM dbstat WHERE name = ?1 AND pagetype = 'leaf') / 2",
                           -1, &st, NULL) != SQLITE_OK) {
        sqlite3_finalize(st);
        st = NULL;
        if (sqlite3_prepare_v2(db, "SELECT rootpage FROM sqlite_master WHERE name = ?1", -1, &st, NULL) != SQLITE_OK)
            return 0;
    }
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) pg = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return pg;
}

/* Overwrites page pg (1-based) of file with garbage: 0 or -1. */
static int garble(const char *file, int pg, int page_size)
{
    FILE *f = fopen(file, "r+b");
    if (!f) return -1;
    int rc = fseek(f, (long)(pg - 1) * page_size, SEEK_SET);
    uint32_t x = 0x9e3779b9u;
    for (int i = 0; !rc && i < page_size; i++) {
        x = x * 1664525u + 1013904223u;
        if (fputc((int)(x >> 24), f) == EOF) rc = -1;
    }
    if (fclose(f)) rc = -1;
    return rc;
}

/* The whole file, malloc'd, its size in *n; NULL on error. */
static unsigned char *slurp(const char *file, long *n)
{
    FILE *f = fopen(file, "rb");
    unsigned char *b = NULL;
    if (f && !fseek(f, 0, SEEK_END) && (*n = ftell(f)) > 0 && !fseek(f, 0, SEEK_SET) && (b = malloc((size_t)*n)) &&
        fread(b, 1, (size_t)*n, f) != (size_t)*n) {
        free(b);
        b = NULL;
    }
    if (f) fclose(f);
    return b;
}

/* A page of a table overwritten with garbage in the middle of the file
 * (its header too) is refused by quick_check, with the file's name, and
 * nothing is written to it. */
static void test_damaged_page_refused(void)
{
    char err[256], file[256];
    sqlite3 *db = NULL;
    snprintf(file, sizeof file, "%s", path("pages.db"));
    REQUIRE(qstore_open(file, MIG, 3, &db, err, sizeof err) == 0);
    REQUIRE(sqlite3_exec(db,
                         "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000) "
                         "INSERT INTO a SELECT i, printf('%0100d', i) FROM n;"
                         "PRAGMA wal_checkpoint(TRUNCATE);",
                         NULL, NULL, NULL) == SQLITE_OK);
    const int pg = page_of(db, "a"), psz = count(db, "PRAGMA page_size"), pages = count(db, "PRAGMA page_count");
    sqlite3_close(db);
    REQUIRE(pages > 20);
    REQUIRE(pg > 1 && pg < pages); /* neither the header page nor the last */
    REQUIRE(garble(file, pg, psz) == 0);
    long n0 = 0, n1 = 0;
    unsigned char *before = slurp(file, &n0);
    REQUIRE(before);
    err[0] = 0;
    CHECK_EQ_INT(qstore_open(file, MIG, 3, &db, err, sizeof err), QERR_FORMAT);
    CHECK(db == NULL);
    CHECK_STR_CONTAINS(err, file);
    CHECK_STR_CONTAINS(err, ": the database is damaged (quick_check: ");
    CHECK_STR_CONTAINS(err, "; move it aside or restore a backup");
    CHECK(!strchr(err, '\n') && !strstr(err, "***")); /* one line, sqlite's own */
    unsigned char *after = slurp(file, &n1);
    CHECK(after && n1 == n0 && !memcmp(before, after, (size_t)n0));
    free(before);
    free(after);
    /* Refused again: nothing was mended in between. */
    CHECK_EQ_INT(qstore_open(file, MIG, 3, &db, err, sizeof err), QERR_FORMAT);
    CHECK(db == NULL);
}

/* The tables the migrations made are checked at open: one dropped, or one
 * with other columns, is refused (before any later migration runs); tables
 * and indexes added by hand are let be. */
static void test_schema_checked(void)
{
    char err[256], file[256];
    sqlite3 *db = NULL;
    snprintf(file, sizeof file, "%s", path("schema.db"));
    REQUIRE(qstore_open(file, MIG, 3, &db, err, sizeof err) == 0);
    REQUIRE(sqlite3_exec(db, "CREATE TABLE notes (t TEXT); CREATE INDEX a_x ON a(x);", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    REQUIRE(qstore_open(file, MIG, 3, &db, err, sizeof err) == 0); /* healthy, with extras */
    CHECK_EQ_INT(count(db, "SELECT count(*) FROM b"), 1);
    REQUIRE(sqlite3_exec(db, "DROP TABLE b;", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    err[0] = 0;
    CHECK_EQ_INT(qstore_open(file, MIG, 3, &db, err, sizeof err), QERR_FORMAT);
    CHECK(db == NULL);
    CHECK_STR_CONTAINS(err, file);
    CHECK_STR_CONTAINS(err, "the database is damaged (the table 'b' is missing); move it aside or restore a backup");
    /* b again, with another column. */
    REQUIRE(sqlite3_open(file, &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db, "CREATE TABLE b (w INTEGER);", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    CHECK_EQ_INT(qstore_open(file, MIG, 3, &db, err, sizeof err), QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "the table 'b' has the columns (w), not (z)");
    /* A database at level 2 without its table a is refused as it is: the
     * third migration does not run on it. */
    snprintf(file, sizeof file, "%s", path("schema2.db"));
    REQUIRE(qstore_open(file, MIG, 2, &db, err, sizeof err) == 0);
    REQUIRE(sqlite3_exec(db, "DROP TABLE a;", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    CHECK_EQ_INT(qstore_open(file, MIG, 3, &db, err, sizeof err), QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "the table 'a' is missing");
    REQUIRE(sqlite3_open(file, &db) == SQLITE_OK);
    CHECK_EQ_INT(qstore_level(db), 2);
    CHECK_EQ_INT(count(db, "SELECT count(*) FROM sqlite_master WHERE name = 'b'"), 0);
    sqlite3_close(db);
    /* Migrations that fail on an empty database give no reference to check
     * against: an internal error, not a verdict on the file. */
    const char *const broken[3] = { "CREATE TABLE a (x INTEGER); INSERT INTO nowhere VALUES (1);", MIG[1], MIG[2] };
    CHECK_EQ_INT(qstore_open(path("new.db"), broken, 3, &db, err, sizeof err), QERR_INTERNAL);
    CHECK(db == NULL);
    CHECK_STR_CONTAINS(err, "its migrations fail on an empty one");
}

int main(void)
{
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    QT_RUN(test_empty_and_every_level);
    QT_RUN(test_newer_refused);
    QT_RUN(test_not_a_database);
    QT_RUN(test_failed_migration_rolls_back);
    QT_RUN(test_program_schema);
    QT_RUN(test_damaged_page_refused);
    QT_RUN(test_schema_checked);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_dir);
    QT_MAIN_END();
}
