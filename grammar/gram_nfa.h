/* gram_nfa.h - what the two subset constructions share (grammar internal):
 * gram_re.c (patterns) and gram.c (rules) both build an NFA (gram_nfa:
 * edges that read a byte range, call a rule, or read nothing), take epsilon
 * closures, and keep each distinct sorted set of NFA states once, numbered
 * in order of first sight (gram_sets). */
#ifndef QUIRE_GRAM_NFA_H
#define QUIRE_GRAM_NFA_H

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

/* An NFA: per state a list of edges. */
typedef struct {
    int32_t to;
    int32_t sym;        /* GRAM_BYTES: bytes lo..hi; GRAM_EPS: nothing; >= 0: a call of that rule */
    uint8_t lo, hi;
} gram_nedge;

#define GRAM_BYTES (-1)
#define GRAM_EPS (-2)

typedef struct {
    gram_nedge *e;
    int32_t *next;      /* next edge of the same state */
    int n_e, cap_e;
    int32_t *head;      /* per state: its first edge, -1 for none */
    int n_s, cap_s;
    int max_s;          /* states allowed (more: rc QERR_LIMIT) */
    int rc;             /* sticky: QERR_LIMIT, QERR_NOMEM */
} gram_nfa;

/* A new state's id, or -1 with a->rc set. */
int gram_nfa_state(gram_nfa *a);
/* An edge (nothing when from or to is -1 or a->rc is set). */
void gram_nfa_edge(gram_nfa *a, int from, int to, int sym, int lo, int hi);
#define GRAM_EPS_EDGE(a, f, t) gram_nfa_edge(a, f, t, GRAM_EPS, 0, 0)
/* The epsilon closure of set[0..n) in place (room for every state),
 * sorted; its size.  mark: one entry a state, stamp a value not used
 * before in it; stack: room for every state. */
int gram_nfa_closure(const gram_nfa *a, int32_t *set, int n, uint32_t *mark, uint32_t stamp, int32_t *stack);
void gram_nfa_free(gram_nfa *a);
/* Builds one copy of a part between fresh states *in and *out. */
typedef void (*gram_nfa_part)(gram_nfa *a, void *ctx, int *in, int *out);
/* From in to out: min copies of part, then (max - min) optional ones, or
 * (max < 0) a loop over one more. */
void gram_nfa_repeat(gram_nfa *a, int in, int out, int min, int max, gram_nfa_part part, void *ctx);

/* qsort's comparison of int32_t. */
int gram_cmp_i32(const void *a, const void *b);

#endif
