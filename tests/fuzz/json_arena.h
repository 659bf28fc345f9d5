/* json_arena.h - jansson's allocations from an arena, for fuzz targets that
 * parse JSON on every input (included by one target each).
 *
 * Under ASan every malloc records a stack and every free goes through the
 * quarantine: for a tokenizer.json of 10 KB that was most of an input's
 * time.  Here jansson's nodes come from a bump arena emptied after each
 * input, and the checks ASan and LSan made stay:
 *
 *  - a block is unpoisoned when handed out and poisoned again when freed;
 *    between blocks lie poisoned red zones: a read or write past a block's
 *    end, or of a freed block, is an ASan report as before;
 *  - a block freed twice, or a free of a pointer the arena did not give,
 *    aborts;
 *  - json_arena_end (after each input) aborts when a block is still live:
 *    a json_t leaked (a missing json_decref) is found as LSan found it.
 *
 * The arena is 64 MiB; past it allocations fail (jansson reports out of
 * memory), which inputs of a few KiB never reach. */
#ifndef QUIRE_FUZZ_JSON_ARENA_H
#define QUIRE_FUZZ_JSON_ARENA_H

#include <jansson.h>
#include <sanitizer/asan_interface.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define JA_SIZE ((size_t)64 << 20)
#define JA_HEAD 16u /* the block's size and a live mark, poisoned while unused */
#define JA_RED 16u  /* red zone after each block */
#define JA_LIVE 0x4c495645u

static unsigned char *ja_base;
static size_t ja_used;
static long ja_live;

static void *ja_malloc(size_t n)
{
    const size_t need = (JA_HEAD + n + JA_RED + 15) & ~(size_t)15;
    if (n > JA_SIZE || need > JA_SIZE - ja_used) return NULL;
    unsigned char *h = ja_base + ja_used;
    ja_used += need;
    ASAN_UNPOISON_MEMORY_REGION(h, JA_HEAD);
    ((size_t *)h)[0] = n;
    ((size_t *)h)[1] = JA_LIVE;
    ASAN_POISON_MEMORY_REGION(h, JA_HEAD);
    ASAN_UNPOISON_MEMORY_REGION(h + JA_HEAD, n);
    ja_live++;
    return h + JA_HEAD;
}

static void ja_free(void *p)
{
    if (!p) return;
    unsigned char *h = (unsigned char *)p - JA_HEAD;
    if ((unsigned char *)p < ja_base + JA_HEAD || (unsigned char *)p >= ja_base + ja_used ||
        ((uintptr_t)h & 15)) {
        fprintf(stderr, "json_arena: free of %p, which the arena did not give\n", p);
        abort();
    }
    ASAN_UNPOISON_MEMORY_REGION(h, JA_HEAD);
    const size_t n = ((size_t *)h)[0];
    if (((size_t *)h)[1] != JA_LIVE) {
        fprintf(stderr, "json_arena: %p freed twice\n", p);
        abort();
    }
    ((size_t *)h)[1] = 0;
    ASAN_POISON_MEMORY_REGION(h, JA_HEAD + n);
    ja_live--;
}

/* Sets jansson to the arena (from LLVMFuzzerInitialize). */
static void json_arena_init(void)
{
    ja_base = aligned_alloc(16, JA_SIZE);
    if (!ja_base) abort();
    ASAN_POISON_MEMORY_REGION(ja_base, JA_SIZE);
    json_set_alloc_funcs(ja_malloc, ja_free);
}

/* After each input: every block must have been freed; the arena empties. */
static void json_arena_end(void)
{
    if (ja_live) {
        fprintf(stderr, "json_arena: %ld jansson blocks still live after the input (a json_t leaked)\n", ja_live);
        abort();
    }
    ASAN_POISON_MEMORY_REGION(ja_base, ja_used);
    ja_used = 0;
}

#endif
