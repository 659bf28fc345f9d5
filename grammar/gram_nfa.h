/* gram_nfa.h - what the two subset constructions share (grammar internal):
 * gram_re.c (patterns) and gram.c (rules) both build an NFA (gram_nfa:
 * edges that read a byte range, call a rule, or read nothing), gather the
 * moves of a set of states by byte class or called rule (gram_moves), take
 * epsilon closures, and keep each distinct set of NFA states once,
 * numbered in order of first sight (gram_sets).
 *
 * Sets are compared as sets, never sorted: the hash of a set is the same
 * whatever the order of its members, and a set s is equal to a kept set of
 * the same size when every member of the kept one is marked as s's (the
 * caller marks s's members in an array of stamps, as the closure and the
 * move gathering do anyway).  Which numbers the sets get depends only on the
 * order in which they are met, so the automata built are the same as with
 * sorted sets. */
#ifndef QUIRE_GRAM_NFA_H
#define QUIRE_GRAM_NFA_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t *items;         /* all sets, back to back, each in the order first given */
    size_t n_items, cap_items;
    int32_t *off, *len;     /* per set */
    uint64_t *hash;         /* per set */
    int n, cap;
    int32_t *tab;           /* open addressing: set + 1, 0 empty */
    size_t tcap;
} gram_sets;

/* The number of the set s[0..n) (distinct states, any order; a new number
 * when unseen), or -1 when out of memory.  mark[x] == stamp exactly for the
 * members x of s. */
int gram_sets_get(gram_sets *m, const int32_t *s, int n, const uint32_t *mark, uint32_t stamp);
/* Frees what m holds and zeroes it. */
void gram_sets_free(gram_sets *m);
/* Empties m, keeping its buffers. */
void gram_sets_clear(gram_sets *m);

/* An NFA: per state two lists of edges, those that read nothing apart (a
 * closure walks only them, a move only the others). */
typedef struct {
    int32_t to;
    int32_t sym;        /* GRAM_BYTES: bytes lo..hi; GRAM_EPS: nothing; >= 0: a call of that rule */
    uint8_t lo, hi;
} gram_nedge;

#define GRAM_BYTES (-1)
#define GRAM_EPS (-2)

typedef struct {
    gram_nedge *e;
    int32_t *next;      /* next edge of the same state and list */
    int n_e, cap_e;
    int32_t *head;      /* per state: its first edge that reads a byte or calls a rule, -1 for none */
    int32_t *eps_head;  /* per state: its first epsilon edge, -1 for none */
    int n_s, cap_s;
    int max_s;          /* states allowed (more: rc QERR_LIMIT) */
    int rc;             /* sticky: QERR_LIMIT, QERR_NOMEM */
    int32_t fin1;       /* 0, or 1 + the accepting state: closures then keep only it
                         * and the states with edges that read or call */
} gram_nfa;

/* A new state's id, or -1 with a->rc set. */
int gram_nfa_state(gram_nfa *a);
/* An edge (nothing when from or to is -1 or a->rc is set). */
void gram_nfa_edge(gram_nfa *a, int from, int to, int sym, int lo, int hi);
#define GRAM_EPS_EDGE(a, f, t) gram_nfa_edge(a, f, t, GRAM_EPS, 0, 0)
/* The epsilon closure of set[0..n) in place (room for every state), in
 * the order found; its size.  With a->fin1 set, only the states a subset's
 * moves and acceptance depend on are kept (the accepting state, those with
 * an edge that reads or calls): closures that differ only in states with
 * nothing but epsilon edges are one subset, and sets stay small.  mark: one
 * entry a state, stamp a value not used before in it (afterwards mark[x] ==
 * stamp exactly for the states reached, kept or not: as gram_sets_get
 * wants, since no kept set holds a state a closure drops); stack: room for
 * every state. */
int gram_nfa_closure(const gram_nfa *a, int32_t *set, int n, uint32_t *mark, uint32_t stamp, int32_t *stack);
/* 1 when every state reaches state fin (by edges of any kind), 0 when
 * one does not, -1 when out of memory. */
int gram_nfa_all_reach(const gram_nfa *a, int fin);
void gram_nfa_free(gram_nfa *a);
/* Empties a (no states, no edges, rc and fin1 0), keeping its buffers. */
void gram_nfa_clear(gram_nfa *a);
/* Where a set of NFA states goes, column by column: a column is a byte
 * class (bytes no edge tells apart) or a called rule.  Column c's targets
 * are to[off[c]..off[c + 1]), in the order of the set and of each state's
 * edges, repeats kept: what a scan of every edge for every column finds,
 * gathered in one pass over the edges instead of one a column. */
typedef struct {
    int32_t *to;
    size_t cap;
    int32_t *off;       /* (columns + 2) */
    int cap_off;
} gram_moves;

/* The moves of states cur[0..len) into mv: byte edges to the columns
 * cls[lo]..cls[hi] (cls: a byte's class, classes 0..nc-1, each edge's
 * range a union of whole classes), calls of rule callees[k] (sorted, every
 * rule that an edge calls) to column nc + k; epsilon edges nowhere.  0 or
 * QERR_NOMEM. */
int gram_nfa_moves(const gram_nfa *a, const int32_t *cur, int len, const uint8_t *cls, int nc, const int32_t *callees,
                   int n_callees, gram_moves *mv);
/* Column k's move set into s[0..n) (its distinct states), marked with
 * stamp in mark (a value not used before); returns n. */
int gram_moves_set(const gram_moves *mv, int k, int32_t *s, uint32_t *mark, uint32_t stamp);
void gram_moves_free(gram_moves *mv);

/* Subsets by the move sets that lead to them: a move set met before has
 * the same closure, so its subset is looked up, not recomputed. */
typedef struct {
    gram_sets seen;     /* move sets */
    int32_t *subset;    /* per move set: its closure's number in the subsets */
    int cap;
} gram_closures;

/* The number in m of the closure of the move set s[0..n) (distinct states,
 * mark[x] == *stamp exactly for its members; closed in place, room for
 * every state), as gram_sets_get of gram_nfa_closure's result would give;
 * -1 when out of memory.  Advances *stamp when it takes the closure. */
int gram_closure_id(const gram_nfa *a, gram_closures *c, gram_sets *m, int32_t *s, int n, uint32_t *mark, uint32_t *stamp,
                    int32_t *stack);
void gram_closures_free(gram_closures *c);
/* Empties c, keeping its buffers. */
void gram_closures_clear(gram_closures *c);

/* Builds one copy of a part between fresh states *in and *out. */
typedef void (*gram_nfa_part)(gram_nfa *a, void *ctx, int *in, int *out);
/* From in to out: min copies of part, then (max - min) optional ones, or
 * (max < 0) a loop over one more. */
void gram_nfa_repeat(gram_nfa *a, int in, int out, int min, int max, gram_nfa_part part, void *ctx);

/* This thread's compile budget (gram.h gram_budget) with its defaults
 * filled in: the deadline in q_now() seconds (0: none). */
typedef struct {
    double deadline, seconds;
    int re_states;
    long long re_work;
    int re_nfa, states;
} gram_limits;
const gram_limits *gram_limits_now(void);
/* 1 when this thread's compile deadline has passed. */
int gram_late(void);

/* qsort's comparison of int32_t. */
int gram_cmp_i32(const void *a, const void *b);

#endif
