/* cli.h - the quire program's subcommands. */
#ifndef QUIRE_CLI_H
#define QUIRE_CLI_H

/* Each returns the process exit status. */
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);

#endif
