/* fuzz_tokenizer_load.c - libFuzzer target for the tokenizer.json loader.
 *
 * Each input is tokenizer.json text: load it; when it loads, encode a fixed
 * text with and without special-token parsing, decode the ids, and stream
 * them through the detokenizer.  Any crash, sanitizer report, leak or
 * allocation over the cap is a bug: a tokenizer file must never do more than
 * fail to load.  jansson allocates from json_arena.h's arena (its checks
 * stand in for ASan's and LSan's on jansson's blocks).
 *
 *   CC=clang cmake -B build-fuzz -DQUIRE_FUZZ=ON -DBUILD_TESTING=OFF
 *   cmake --build build-fuzz --target fuzz_tokenizer_load
 *   cp -r tests/fuzz/corpus/tokenizer_load /tmp/corpus && ./build-fuzz/fuzz_tokenizer_load /tmp/corpus
 */
#include "json_arena.h"
#include "tokenizer.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    q_set_alloc_limit((size_t)256 << 20);
    qlog_set_level(QLOG_OFF);
    json_arena_init();
    return 0;
}

static const char sample[] = "Hello  world!\n\t<s>x</s> 12345 caf\xc3\xa9 e\xcc\x81 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\xa6\x99 ab";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    qtok *t;
    if (qtok_load_json_text((const char *)data, size, &t, err, sizeof err)) {
        json_arena_end();
        return 0;
    }
    for (unsigned flags = 0; flags < 4; flags++) {
        int32_t *ids;
        int n;
        if (qtok_encode(t, sample, sizeof sample - 1, flags, &ids, &n)) continue;
        char *text;
        size_t len;
        if (qtok_decode(t, ids, n, flags & 1 ? QTOK_SKIP_SPECIAL : 0, &text, &len) == 0) {
            qdetok *d = qdetok_new(t, flags & 1 ? QTOK_SKIP_SPECIAL : 0);
            size_t total = 0;
            const char *c;
            size_t cl;
            for (int i = 0; d && i < n; i++)
                if (qdetok_push(d, ids[i], &c, &cl) == 0) total += cl;
            if (d && qdetok_flush(d, &c, &cl) == 0) total += cl;
            if (d && total != len) abort(); /* streaming must equal the full decode */
            qdetok_free(d);
            free(text);
        }
        free(ids);
    }
    int32_t odd[] = { -1, 0, 1, 2, 3, qtok_vocab_size(t) - 1, qtok_vocab_size(t), 1 << 30 };
    char *text;
    size_t len;
    if (qtok_decode(t, odd, 8, 0, &text, &len) == 0) free(text);
    qtok_free(t);
    json_arena_end();
    return 0;
}
