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

int qpreempt_parse(const char *s, int *out)
{
    for (int m = QPREEMPT_RECOMPUTE; m <= QPREEMPT_SWAP; m++)
        if (s && !strcmp(s, qpreempt_name(m))) {
            *out = m;
            return 0;
        }
    return QERR_INVAL;
}

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
    return mode == QSPEC_NONE ? "none" : mode == QSPEC_NGRAM ? "ngram" : "?";
}

int qspec_mode_parse(const char *s, int *out)
{
    for (int m = QSPEC_NONE; m <= QSPEC_NGRAM; m++)
        if (s && !strcmp(s, qspec_mode_name(m))) {
            *out = m;
            return 0;
        }
    return QERR_INVAL;
}
