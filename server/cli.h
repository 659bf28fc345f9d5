/* cli.h - the quire program's subcommands. */
#ifndef QUIRE_CLI_H
#define QUIRE_CLI_H

#include <signal.h>

/* main.c holds the program's only globals: what a signal handler may reach.
 * quire serve's SIGINT/SIGTERM handler sets quire_stop and wakes the lws
 * context in quire_stop_ctx (a struct lws_context *, or NULL). */
extern volatile sig_atomic_t quire_stop;
extern void *volatile quire_stop_ctx;

/* Each returns the process exit status. */
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_serve(int argc, char **argv);

struct qmodel;
struct qtok;
#include "engine.h"
/* quire generate --batch: runs every request of a JSONL file through the
 * engine and prints the results (cmd_batch.c).  Returns the exit status. */
int run_batch(const struct qmodel *m, const struct qtok *tok, const qengine_opts *eo, const char *path,
              int default_max);

#endif
