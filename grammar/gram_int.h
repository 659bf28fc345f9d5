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
    int32_t perm;               /* the gperm of the state's rule, -1: none */
    uint8_t accept;
} gstate;

/* Members in any order (gram_b_perm): a rule whose states call member
 * rules, tagged 0..n-1 (the extra member's rule: n).  The matcher keeps
 * the set given beside the rule's stack node; a state of the rule accepts
 * only where gram_perm_may_end says so, and calls a member only where
 * gram_perm_may_add does. */
typedef struct {
    int n, nw;                  /* members; words of a set of them */
    uint32_t *req;              /* (nw) the required ones */
    int32_t (*deps)[2];
    int ndeps;
    int has_extra, min, max;
} gperm;

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
    gperm *perms;
    int n_perms;
    int32_t *perm_of;   /* per rule: its gperm, -1: none */
    int32_t *tag;       /* per rule: which member of its perm it is, -1: none */
};

/* Whether members set s (p->nw words) and e extra ones may end; may take
 * member i (i == p->n: an extra one) and still end some way.  scratch:
 * p->nw words. */
int gram_perm_may_end(const gperm *p, const uint32_t *s, int e);
int gram_perm_may_add(const gperm *p, const uint32_t *s, int e, int i, uint32_t *scratch);

#endif
