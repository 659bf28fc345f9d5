/* fuzz_regex.c - libFuzzer target for the pattern compiler
 * (grammar/gram_re.c): the first byte picks the flags (JSON-string mode,
 * full match), the rest is the pattern.  Any input must compile or fail
 * with a message, within the state limit; a compiled automaton is then run
 * over the pattern's own bytes and every state it reaches must be in range
 * (no crash, hang, leak or sanitizer report).
 *
 * max_len: 256 (scripts/test.sh passes it: the deepest construct, 201
 * nested groups, fits; a longer pattern only repeats atoms, and counts up to
 * the 1000 limit are a few bytes)
 *
 * The compile budget (gram.h gram_budget) is smaller here than a server's:
 * 300 DFA states, 150,000 steps, 5,000 NFA states.  Inputs of a few dozen
 * bytes reach each limit, so the code at and past every limit runs as it
 * does with the defaults, and the time goes to a million inputs (about 90 s
 * in CI) instead of a few large automata.  Large ones are test_regex's.
 *
 *   CC=clang cmake -B build-fuzz -DQUIRE_FUZZ=ON -DBUILD_TESTING=OFF
 *   cmake --build build-fuzz --target fuzz_regex
 *   cp -r tests/fuzz/corpus/regex /tmp/corpus && ./build-fuzz/fuzz_regex /tmp/corpus
 */
#include "qerr.h"
#include "gram.h"
#include "gram_re.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define FUZZ_RE_STATES 300

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    q_set_alloc_limit((size_t)512 << 20);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096) return 0;
    const unsigned flags = data[0] & 3u;
    const char *pat = (const char *)data + 1;
    const size_t n = size - 1;
    char err[256];
    err[0] = 0;
    gram_re *re = NULL;
    gram_budget_set(&(gram_budget){ .re_states = FUZZ_RE_STATES, .re_work = 150000, .re_nfa = 5000 });
    const int rc = gram_re_compile(pat, n, flags, &re, err, sizeof err);
    if (rc) {
        if (re || !err[0]) abort(); /* a failure leaves nothing and says why */
        return 0;
    }
    const int states = gram_re_states(re);
    if (states < 1 || states > FUZZ_RE_STATES) abort();
    int s = gram_re_start(re);
    for (size_t i = 0; i < n && s >= 0; i++) {
        s = gram_re_step(re, s, (uint8_t)pat[i]);
        if (s >= states) abort();
    }
    (void)gram_re_accepts(re, s);
    gram_re_free(re);
    return 0;
}
