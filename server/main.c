/* main.c - the quire program: dispatches to a subcommand.
 *
 * server/ is the top floor: the subcommands (cmd_*.c) and their shared
 * engine flags (engine_flags.c); the wire formats (http.c with the route
 * table, ws.c); the server by protocol: HTTP routes (serve_http.c), the
 * WebSocket protocol (serve_ws.c), the web folder (serve_static.c), the
 * engine bridge (serve_engine.c), request preparation (serve_prep.c),
 * sessions (serve_sessions.c), all over one serve_state reached through the
 * lws context; the OpenAI-compatible API (oai*.c) and metrics.  It may
 * include every folder below it; nothing below includes server/.  This file
 * holds the program's only globals (cli.h says which). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#ifdef QUIRE_HAVE_CUDA
#include "cuda_info.h"
#endif

volatile sig_atomic_t quire_stop;
void *volatile quire_stop_ctx;

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
            "  serve      serve a model over HTTP: the OpenAI-compatible API, /health, /metrics\n"
            "  generate   load a model and generate tokens from a prompt (see quire generate --help)\n"
            "  tokenize   text to token ids and back, as the model's tokenizer does\n"
            "  template   render a chat template with a JSON context (apply_chat_template)\n"
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
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "template")) return cmd_template(argc - 1, argv + 1);
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
#ifdef QUIRE_HAVE_CUDA
        char err[256] = "", name[256];
        int n = cuda_device_count(err, sizeof err);
        printf("quire %s (backends: cpu, cuda)\n", QUIRE_VERSION);
        if (n == 0) printf("cuda: no usable device (%s)\n", err);
        for (int i = 0; i < n; i++)
            if (!cuda_device_name(i, name, sizeof name)) printf("cuda device %d: %s\n", i, name);
#else
        printf("quire %s (backends: cpu)\n", QUIRE_VERSION);
#endif
        return 0;
    }
    fprintf(stderr, "quire: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
