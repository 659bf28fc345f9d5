/* fuzz_schema.c - libFuzzer target for the JSON Schema compiler
 * (grammar/schema.c) and the matcher (grammar/gram.c): the input is a
 * schema as JSON text, compiled in strict mode or in full mode (GRAM_SCHEMA_FULL)
 * as its length is even or odd; one that parses must compile or fail with a
 * message, and a compiled grammar then reads the input's own bytes until it
 * refuses one, with a commit and a rollback on the way (no crash, hang,
 * leak or sanitizer report).  jansson allocates from json_arena.h's arena.
 * The compile budget is smaller than a server's (gram.h gram_budget: 300
 * states a pattern, 20,000 a grammar): the code past each limit runs on
 * small inputs, and the time goes to many inputs instead of a few large
 * automata.
 *
 * max_len: 1024 (scripts/test.sh passes it: three times the largest seed;
 * longer schemas only repeat keywords and properties)
 * max_time: 480 (its speed swings with the corpus it grows: 1M executions
 * took 142 s in one CI run and 300 s were short of them in others)
 * min_runs: 500000 (what it must reach when those 480 s run out first: the
 * path its mutations take shifts with any change to the binary, and on some
 * paths its inputs grow into grammars that run at under 2,000 a second,
 * 836,676 in 481 s on 2026-12-07, against 1M in 155 s for the same code
 * built elsewhere)
 *
 *   CC=clang cmake -B build-fuzz -DQUIRE_FUZZ=ON -DBUILD_TESTING=OFF
 *   cmake --build build-fuzz --target fuzz_schema
 *   cp -r tests/fuzz/corpus/schema /tmp/corpus && ./build-fuzz/fuzz_schema /tmp/corpus
 */
#include "gram.h"
#include "json_arena.h"
#include "qerr.h"
#include "schema.h"
#include "util.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    q_set_alloc_limit((size_t)1 << 30);
    json_arena_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096) return 0;
    json_t *s = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!s) {
        json_arena_end();
        return 0;
    }
    gram *g = NULL;
    char err[800];
    err[0] = 0;
    gram_budget_set(&(gram_budget){ .re_states = 300, .re_work = 150000, .re_nfa = 5000, .states = 20000 });
    /* Both modes: strict (the default) for inputs of even length, full for odd. */
    const int rc = gram_schema_compile_opts(s, size & 1 ? GRAM_SCHEMA_FULL : 0, &g, err, sizeof err);
    json_decref(s);
    json_arena_end(); /* the compiler keeps no JSON */
    if (rc) {
        if (g || !err[0]) abort();
        return 0;
    }
    gram_m *m = gram_m_new(g);
    if (m) {
        size_t i = 0;
        while (i < size && gram_m_feed(m, data + i, 1) == 0) {
            i++;
            if (i == 8 && gram_m_commit(m)) break;
        }
        if (i > 8 && gram_m_rollback(m, 0)) abort(); /* back to the commit after 8 bytes */
        (void)gram_m_can_end(m);
        gram_m_free(m);
    }
    gram_free(g);
    return 0;
}
