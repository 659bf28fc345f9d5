/* qgram.h - what the schema tests share (test_schema.c full mode,
 * test_schema_strict.c strict mode): a schema's text compiled with flags,
 * and whether a grammar takes a text whole. */
#ifndef QUIRE_QGRAM_H
#define QUIRE_QGRAM_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gram.h"
#include "schema.h"

/* The schema's JSON text compiled with flags; NULL (the reason on stderr)
 * when it is not JSON or does not compile. */
static inline gram *compile_flags(const char *schema, unsigned flags)
{
    json_error_t je;
    json_t *s = json_loads(schema, JSON_DECODE_ANY, &je);
    if (!s) {
        fprintf(stderr, "  bad test schema: %s\n", je.text);
        return NULL;
    }
    gram *g = NULL;
    char err[800];
    if (gram_schema_compile_opts(s, flags, &g, err, sizeof err)) fprintf(stderr, "  %s: %s\n", schema, err);
    json_decref(s);
    return g;
}

/* 1 when g takes all of text and may end there. */
static inline int takes(const gram *g, const char *text)
{
    gram_m *m = gram_m_new(g);
    const int ok = m && gram_m_feed(m, (const uint8_t *)text, strlen(text)) == 0 && gram_m_can_end(m);
    gram_m_free(m);
    return ok;
}

#endif
