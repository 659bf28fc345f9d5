/* engine_values.c - the engine's value types (engine.h): finish reasons and
 * preemption modes by name, events freed, options' defaults.  Nothing here
 * touches an engine. */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "qerr.h"

const char *qfinish_name(qfinish f)
{
    static const char *const names[] = { "none", "length", "stop", "cancelled", "error" };
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

void qevent_free(qevent *e)
{
    if (!e) return;
    free(e->text);
    e->text = NULL;
}

const char *qpreempt_name(int mode)
{
    return mode == QPREEMPT_RECOMPUTE ? "recompute" : mode == QPREEMPT_SWAP ? "swap" : "?";
}

/* The value in lo..hi whose name(value) is s, into *out: 0 or QERR_INVAL. */
static int parse_named(const char *s, const char *(*name)(int), int lo, int hi, int *out)
{
    for (int m = lo; m <= hi; m++)
        if (s && !strcmp(s, name(m))) {
            *out = m;
            return 0;
        }
    return QERR_INVAL;
}

int qpreempt_parse(const char *s, int *out) { return parse_named(s, qpreempt_name, QPREEMPT_RECOMPUTE, QPREEMPT_SWAP, out); }

void qengine_opts_default(qengine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->block_size = 16;
    o->max_batch_tokens = 512;
    o->max_seqs = 64;
    o->spec_k = 4;
    o->spec_ngram_min = 1;
    o->spec_ngram_max = 3;
    o->spec_max_batch = 32;
}

const char *qspec_mode_name(int mode)
{
    return mode == QSPEC_NONE ? "none" : mode == QSPEC_NGRAM ? "ngram" : mode == QSPEC_DRAFT ? "draft" : "?";
}

int qspec_mode_parse(const char *s, int *out) { return parse_named(s, qspec_mode_name, QSPEC_NONE, QSPEC_DRAFT, out); }
