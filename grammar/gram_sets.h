/* gram_sets.h - sets of automaton states, interned (grammar internal):
 * the subset constructions of gram_re.c (patterns) and gram.c (rules) keep
 * each distinct sorted set once and number them in order of first sight. */
#ifndef QUIRE_GRAM_SETS_H
#define QUIRE_GRAM_SETS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t *items;         /* all sets, back to back */
    size_t n_items, cap_items;
    int32_t *off, *len;     /* per set */
    int n, cap;
    int32_t *tab;           /* open addressing: set + 1, 0 empty */
    size_t tcap;
} gram_sets;

/* The number of the sorted set s[0..n) (a new one when unseen), or -1 when
 * out of memory. */
int gram_sets_get(gram_sets *m, const int32_t *s, int n);
/* Frees what m holds and zeroes it. */
void gram_sets_free(gram_sets *m);
/* Set k's members (valid until the next gram_sets_get). */
static inline const int32_t *gram_sets_items(const gram_sets *m, int k) { return m->items + m->off[k]; }

/* qsort's comparison of int32_t. */
int gram_cmp_i32(const void *a, const void *b);

#endif
