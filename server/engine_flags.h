/* engine_flags.h - the engine's command-line flags, one table that `serve`
 * and `generate` share (a second qopt_set beside each one's own): each
 * flag's name, value, help and field are written once here, and so are its
 * checks and its mapping into qengine_opts (qeflags_apply). */
#ifndef QUIRE_ENGINE_FLAGS_H
#define QUIRE_ENGINE_FLAGS_H

#include <stddef.h>

#include "engine.h"
#include "opts.h"

typedef struct {
    const char *device;
    float gpu_mem_util;
    int tensor_parallel;
    int threads;
    int block_size;
    int kv_mem;
    int max_batch_tokens;
    int max_seqs;
    int static_batching;
    const char *preempt;
    int swap_space;         /* MiB; -1 when not given */
    const char *spec;
    const char *draft;      /* the draft model's path; the caller loads it into qengine_opts.draft */
    int spec_k;
    int spec_max_batch;
    int spec_always;
} qeflags;

#define QEFLAGS_N 18
extern const qopt qeflags_table[QEFLAGS_N];
/* The set a subcommand parses beside its own table: the engine's flags, its
 * qeflags at member `field` of its options struct `type`. */
#define QEFLAGS_SET(type, field) { qeflags_table, QEFLAGS_N, offsetof(type, field) }

/* The flags' defaults (nothing given). */
void qeflags_init(qeflags *f);
/* Checks f and writes the engine options it means into *eo (from
 * qengine_opts_default; draft not loaded).  0, or QERR_INVAL with a message
 * naming the flag. */
int qeflags_apply(const qeflags *f, qengine_opts *eo, char *err, size_t errlen);

#endif
