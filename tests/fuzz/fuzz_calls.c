/* fuzz_calls.c - libFuzzer target for reading a model's output back as tool
 * calls (server/oai_tools.c qoai_calls): any bytes, in the form and
 * tool_choice mode the first byte picks, read whole and in pieces split
 * where the bytes say.  Both readings must give the same message and call
 * count, and nothing may crash, leak or trip a sanitizer.  The grammar
 * keeps a real model's output in the form; this checks the reader holds on
 * anything else.
 *
 *   CC=clang cmake -B build-fuzz -DQUIRE_FUZZ=ON -DBUILD_TESTING=OFF
 *   cmake --build build-fuzz --target fuzz_calls
 *   cp -r tests/fuzz/corpus/calls /tmp/corpus && ./build-fuzz/fuzz_calls /tmp/corpus
 *
 * max_len: 256
 */
#include "oai.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size) return 0;
    const gram_tools_form form = (gram_tools_form)(data[0] % GRAM_TOOLS_FORMS);
    const int mode = QOAI_TOOLS_NAMED + data[0] / GRAM_TOOLS_FORMS % 3;
    data++, size--;
    qoai_calls *whole = qoai_calls_new(mode, form, "f", "c"), *bits = qoai_calls_new(mode, form, "f", "c");
    if (!whole || !bits) abort();
    json_decref(qoai_calls_feed(whole, (const char *)data, size, 1));
    for (size_t at = 0; at < size;) {
        const size_t n = 1 + data[at] % 16 < size - at ? 1 + data[at] % 16 : size - at;
        json_decref(qoai_calls_feed(bits, (const char *)data + at, n, at + n == size));
        at += n;
    }
    if (!size) json_decref(qoai_calls_feed(bits, "", 0, 1));
    json_t *m1 = qoai_calls_message(whole), *m2 = qoai_calls_message(bits);
    if (!qoai_calls_failed(whole) && !qoai_calls_failed(bits) &&
        (!m1 || !m2 || qoai_calls_count(whole) != qoai_calls_count(bits) || !json_equal(m1, m2) ||
         qoai_calls_complete(whole) != qoai_calls_complete(bits)))
        abort();
    json_decref(m1);
    json_decref(m2);
    qoai_calls_free(whole);
    qoai_calls_free(bits);
    return 0;
}
