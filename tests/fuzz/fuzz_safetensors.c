/* fuzz_safetensors.c - libFuzzer target: safetensors_parse() on arbitrary
 * bytes must return an error or a table of tensors whose bytes lie inside
 * the input (or in buffers the model owns), never crash or over-allocate. */
#include "model.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    q_set_alloc_limit((size_t)256 << 20);
    qlog_set_level(QLOG_OFF);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qmodel *m = qmodel_new();
    if (!m) return 0;
    char err[256];
    int rc = safetensors_parse(m, data, size, "fuzz.safetensors", err, sizeof err);
    if (rc == 0) {
        /* Every tensor's bytes are inside the input or owned (copied when
         * misaligned): touch the first and the last byte of each. */
        volatile uint8_t sink = 0;
        for (int i = 0; i < m->n_tensors; i++) {
            const qtensor *t = &m->tensors[i].t;
            size_t n = (size_t)qt_numel(t) * qdt_size(t->dtype);
            const uint8_t *p = t->data;
            if (!p || n == 0) __builtin_trap();
            int inside = p >= data && p + n <= data + size;
            int owned = 0;
            for (int k = 0; k < m->n_owned; k++) owned |= m->owned[k] == (const void *)p;
            if (!inside && !owned) __builtin_trap();
            sink ^= p[0] ^ p[n - 1];
        }
        (void)sink;
    }
    qmodel_destroy(m);
    return 0;
}
