/* gram_int.h - the compiled grammar as gram.c builds it and gram_match.c
 * matches it (grammar internal). */
#ifndef QUIRE_GRAM_INT_H
#define QUIRE_GRAM_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "gram.h"
#include "qerr.h"
#include "util.h"

/* Grows *p (n elements used, *cap allocated) to hold one more. */
static inline int gram_grow(void **p, int n, int *cap, size_t size)
{
    if (n < *cap) return 0;
    int c = *cap ? *cap * 2 : 64;
    void *q = q_reallocn(*p, (size_t)c, size);
    if (!q) return QERR_NOMEM;
    *p = q, *cap = c;
    return 0;
}

typedef struct {
    int32_t to;
    uint8_t lo, hi;
} gbyte;

typedef struct {
    int32_t rule, to;
} gcall;

typedef struct {
    int32_t byte_off, n_byte;   /* sorted ranges in g->be */
    int32_t call_off, n_call;   /* in g->ce */
    uint8_t accept;
} gstate;

/* Token classes of a state, for one vocabulary (filled on first use): from
 * the state with an unknown stack below it, the tokens taken without
 * returning below (accept: whatever the stack), and those that return below
 * it (uncertain: the real stack decides); the rest are refused whatever
 * the stack. */
typedef struct {
    uint32_t *accept;       /* bits; NULL until made */
    int32_t *uncertain;     /* positions in the vocabulary's order (gram_vocab.order), increasing */
    int n_uncertain;
} gclass;

#define GCACHE_VOCABS 4

typedef struct {
    pthread_mutex_t mu;
    struct {
        const struct gram_vocab *v;   /* the vocabulary the classes are for */
        gclass *cls;                  /* (n_st) */
    } by[GCACHE_VOCABS];
} gcache;

struct gram {
    atomic_int refs;    /* gram_free drops one; the last frees */
    gcache *cache;
    int n_rules, root;
    int32_t *start;     /* per rule: its start state */
    gstate *st;
    int n_st, cap_st;
    gbyte *be;
    int n_be, cap_be;
    gcall *ce;
    int n_ce, cap_ce;
};

#endif
