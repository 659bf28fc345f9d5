/* main.c - the quire program: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#ifndef QUIRE_VERSION
#define QUIRE_VERSION "dev"
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "quire %s - an LLM serving system\n"
            "\n"
            "usage: quire COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  generate   load a model and generate tokens from a prompt (see quire generate --help)\n"
            "\n"
            "  quire --version   print the version and the compiled backends\n",
            QUIRE_VERSION);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
#ifdef QUIRE_HAVE_CUDA
        printf("quire %s (backends: cpu, cuda compiled in)\n", QUIRE_VERSION);
#else
        printf("quire %s (backends: cpu)\n", QUIRE_VERSION);
#endif
        return 0;
    }
    fprintf(stderr, "quire: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
