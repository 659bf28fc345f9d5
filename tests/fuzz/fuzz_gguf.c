/* fuzz_gguf.c - libFuzzer target for the GGUF loader.
 *
 * Each input is a GGUF image: gguf_parse it into a fresh model, bind what
 * parsed, release.  Any crash, sanitizer report, leak or allocation over the
 * cap is a bug: a model file must never do more than fail to load.
 *
 *   CC=clang cmake -B build-fuzz -DQUIRE_FUZZ=ON -DBUILD_TESTING=OFF
 *   cmake --build build-fuzz --target fuzz_gguf
 *   cp -r tests/fuzz/corpus/gguf /tmp/corpus && ./build-fuzz/fuzz_gguf /tmp/corpus
 */
#include "model.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* A larger allocation can only come from trusting a count in the file. */
    q_set_alloc_limit((size_t)256 << 20);
    qlog_set_level(QLOG_OFF);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    qmodel *m = qmodel_new();
    if (!m) return 0;
    if (gguf_parse(m, data, size, err, sizeof err) == 0) qmodel_bind(m, err, sizeof err);
    qmodel_destroy(m);
    return 0;
}
