/* opts.h - command-line options from one table per subcommand.
 *
 * Each subcommand lists its flags once (qopt rows naming a field of its
 * options struct by offset); parsing and --help both read that table, so
 * they cannot drift apart. */
#ifndef QUIRE_OPTS_H
#define QUIRE_OPTS_H

#include <stddef.h>
#include <stdio.h>

typedef enum { OPT_STR, OPT_INT, OPT_FLOAT, OPT_U64, OPT_FLAG } qopt_kind;

typedef struct {
    const char *s, *l, *arg;     /* short flag (or NULL), long flag, value name (NULL for flags) */
    qopt_kind kind;
    size_t off;                  /* offset of the field in the options struct */
    const char *help;
} qopt;

/* A table whose fields lie at off in the options struct: how subcommands
 * share a set of flags (the engine's, engine_flags.h). */
typedef struct {
    const qopt *table;
    size_t n;
    size_t off;
} qopt_set;

/* qopt_parse and qopt_usage over several tables, in order. */
int qopt_parse_sets(const char *cmd, const qopt_set *sets, size_t n_sets, int argc, char **argv, void *dst);
void qopt_usage_sets(FILE *f, const qopt_set *sets, size_t n_sets);

/* Parses argv[1..argc) into dst.  Prints a message naming the flag and
 * returns -1 on an unknown flag, a missing value or a bad number; else 0. */
int qopt_parse(const char *cmd, const qopt *table, size_t n, int argc, char **argv, void *dst);

/* Prints one line per flag. */
void qopt_usage(FILE *f, const qopt *table, size_t n);

#endif
