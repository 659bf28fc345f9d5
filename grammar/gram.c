/* gram.c - grammars over bytes: building, compiling, matching (gram.h).
 *
 * Building: expressions live in the builder's arena (xnode), rules point
 * at their bodies.
 *
 * Compiling: each rule's body becomes an NFA whose edges read a byte range,
 * call a rule, or read nothing; a subset construction over the rule's byte
 * classes and the rules it calls makes it deterministic: from a state, one
 * next state a byte, one a called rule.  All rules' states go into one
 * array (gstate); a state's byte edges are sorted ranges.
 *
 * Matching: a stack is a chain of nodes (state, parent), the top first; a
 * node's parent is where its rule returns to (the caller's state after the
 * call).  Nodes are hash-consed, so equal stacks are the same node and a
 * set of stacks is a set of ints.  The matcher keeps the frontier: the
 * stacks whose top can read a byte, with every call entered and every
 * finished rule returned from (closure), and whether some stack emptied
 * completely (the input so far is complete).  Reading a byte moves each top
 * along its byte edge, then takes the closure again.
 *
 * Invariants:
 *   1. every frontier node's state has at least one byte edge;
 *   2. a node's parent is -1 (the root rule returns to nothing) or a node
 *      whose state is a caller's return point;
 *   3. nodes are never freed or changed while the matcher lives, so saved
 *      frontiers (commits) stay valid. */
#include "gram.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram_re.h"
#include "gram_nfa.h"
#include "qerr.h"
#include "util.h"

#define MAX_STATES 1000000
#define MAX_CLOSURE 100000   /* nodes one closure may visit */

/* ---- the builder ------------------------------------------------------------------ */

typedef enum { X_EMPTY, X_BYTE, X_LIT, X_RE, X_REF, X_SEQ, X_ALT, X_REP, X_EXCEPT } xkind;

typedef struct {
    xkind k;
    int a, b;           /* SEQ, ALT: children; REP: child */
    int min, max;       /* REP */
    uint8_t lo, hi;     /* BYTE */
    size_t off, len;    /* LIT: bytes in lits; EXCEPT: the names, each a size_t length then its bytes */
    int count;          /* EXCEPT: how many names */
    int re;             /* RE: index in res */
    int rule;           /* REF */
} xnode;

struct gram_b {
    xnode *x;
    int n_x, cap_x;
    char *lits;
    size_t n_lits, cap_lits;
    gram_re **res;
    int n_res, cap_res;
    char **names;
    int *body;          /* per rule: its expression, -1 until defined */
    int n_rules, cap_rules;
    int any_string;     /* index in res of the pattern of any JSON string's content, -1 before first use */
    int err;
    char msg[256];
};

gram_b *gram_b_new(void)
{
    gram_b *b = calloc(1, sizeof(gram_b));
    if (b) b->any_string = -1;
    return b;
}

void gram_b_free(gram_b *b)
{
    if (!b) return;
    for (int i = 0; i < b->n_res; i++) gram_re_free(b->res[i]);
    for (int i = 0; i < b->n_rules; i++) free(b->names[i]);
    free(b->res);
    free(b->names);
    free(b->body);
    free(b->x);
    free(b->lits);
    free(b);
}

static int b_fail(gram_b *b, int rc, const char *msg)
{
    if (!b->err) {
        b->err = rc;
        snprintf(b->msg, sizeof b->msg, "%s", msg);
    }
    return b->err;
}

int gram_b_error(const gram_b *b, const char **msg)
{
    if (msg) *msg = b->msg;
    return b->err;
}

/* Grows *p (n elements used, *cap allocated) to hold one more. */
static int grow(void **p, int n, int *cap, size_t size)
{
    if (n < *cap) return 0;
    int c = *cap ? *cap * 2 : 64;
    void *q = q_reallocn(*p, (size_t)c, size);
    if (!q) return QERR_NOMEM;
    *p = q, *cap = c;
    return 0;
}

static gram_x new_x(gram_b *b, xkind k)
{
    if (b->err) return b->err;
    if (grow((void **)&b->x, b->n_x, &b->cap_x, sizeof *b->x)) return b_fail(b, QERR_NOMEM, "out of memory");
    memset(&b->x[b->n_x], 0, sizeof b->x[0]);
    b->x[b->n_x].k = k;
    return b->n_x++;
}

int gram_b_rule(gram_b *b, const char *name)
{
    if (b->err) return b->err;
    if (b->n_rules == b->cap_rules) {
        int cap = b->cap_rules ? b->cap_rules * 2 : 32;
        char **nm = q_reallocn(b->names, (size_t)cap, sizeof *nm);
        if (nm) b->names = nm;
        int *bd = nm ? q_reallocn(b->body, (size_t)cap, sizeof *bd) : NULL;
        if (!bd) return b_fail(b, QERR_NOMEM, "out of memory");
        b->body = bd, b->cap_rules = cap;
    }
    if (!(b->names[b->n_rules] = strdup(name ? name : "rule"))) return b_fail(b, QERR_NOMEM, "out of memory");
    b->body[b->n_rules] = -1;
    return b->n_rules++;
}

int gram_b_define(gram_b *b, int rule, gram_x body)
{
    if (b->err) return b->err;
    if (body < 0) return b_fail(b, body, "a bad expression");
    if (rule < 0 || rule >= b->n_rules) return b_fail(b, QERR_RANGE, "no such rule");
    b->body[rule] = body;
    return 0;
}

gram_x gram_b_empty(gram_b *b) { return new_x(b, X_EMPTY); }

static size_t lit_put(gram_b *b, const void *s, size_t n);

gram_x gram_b_lit(gram_b *b, const char *s, size_t n)
{
    gram_x x = new_x(b, X_LIT);
    if (x < 0) return x;
    const size_t off = lit_put(b, s, n);
    if (off == (size_t)-1) return b_fail(b, QERR_NOMEM, "out of memory");
    b->x[x].off = off, b->x[x].len = n;
    return x;
}

gram_x gram_b_byte(gram_b *b, uint8_t lo, uint8_t hi)
{
    gram_x x = new_x(b, X_BYTE);
    if (x >= 0) b->x[x].lo = lo, b->x[x].hi = hi;
    return x;
}

gram_x gram_b_regex(gram_b *b, const char *pattern, size_t len, unsigned flags)
{
    if (b->err) return b->err;
    gram_re *re = NULL;
    char err[256];
    int rc = gram_re_compile(pattern, len, flags, &re, err, sizeof err);
    if (rc) return b_fail(b, rc, err);
    return gram_b_regex_take(b, re);
}

gram_x gram_b_regex_take(gram_b *b, gram_re *re)
{
    if (b->err) {
        gram_re_free(re);
        return b->err;
    }
    if (grow((void **)&b->res, b->n_res, &b->cap_res, sizeof *b->res)) {
        gram_re_free(re);
        return b_fail(b, QERR_NOMEM, "out of memory");
    }
    b->res[b->n_res] = re;
    gram_x x = new_x(b, X_RE);
    if (x >= 0) b->x[x].re = b->n_res;
    b->n_res++;
    return x;
}

/* Appends n bytes to the literal pool: their offset, or (size_t)-1. */
static size_t lit_put(gram_b *b, const void *s, size_t n)
{
    if (b->n_lits + n > b->cap_lits) {
        size_t cap = b->cap_lits ? b->cap_lits * 2 : 1024;
        while (cap < b->n_lits + n) cap *= 2;
        char *l = realloc(b->lits, cap);
        if (!l) return (size_t)-1;
        b->lits = l, b->cap_lits = cap;
    }
    if (n) memcpy(b->lits + b->n_lits, s, n);
    b->n_lits += n;
    return b->n_lits - n;
}

gram_x gram_b_string_except(gram_b *b, const char *const *names, const size_t *lens, int n)
{
    return gram_b_key(b, NULL, names, lens, n);
}

gram_x gram_b_key(gram_b *b, gram_re *base, const char *const *names, const size_t *lens, int n)
{
    if (b->err) {
        gram_re_free(base);
        return b->err;
    }
    int re_idx;
    if (base) {
        gram_x r = gram_b_regex_take(b, base);
        if (r < 0) return r;
        re_idx = b->x[r].re;
    } else {
        if (b->any_string < 0) {
            static const char any[] = "[\\s\\S]*";
            gram_x r = gram_b_regex(b, any, sizeof any - 1, GRAM_RE_JSON_STRING | GRAM_RE_FULL);
            if (r < 0) return r;
            b->any_string = b->x[r].re;
        }
        re_idx = b->any_string;
    }
    gram_x x = new_x(b, X_EXCEPT);
    if (x < 0) return x;
    b->x[x].re = re_idx;
    const size_t start = b->n_lits;
    for (int i = 0; i < n; i++)
        if (lit_put(b, &lens[i], sizeof lens[i]) == (size_t)-1 || lit_put(b, names[i], lens[i]) == (size_t)-1)
            return b_fail(b, QERR_NOMEM, "out of memory");
    b->x[x].off = start, b->x[x].len = b->n_lits - start, b->x[x].count = n;
    return x;
}

gram_x gram_b_ref(gram_b *b, int rule)
{
    if (!b->err && (rule < 0 || rule >= b->n_rules)) return b_fail(b, QERR_RANGE, "a reference to no rule");
    gram_x x = new_x(b, X_REF);
    if (x >= 0) b->x[x].rule = rule;
    return x;
}

static gram_x pair(gram_b *b, xkind k, gram_x x, gram_x y)
{
    if (b->err) return b->err;
    if (x < 0 || y < 0) return b_fail(b, x < 0 ? x : y, "a bad expression");
    gram_x n = new_x(b, k);
    if (n >= 0) b->x[n].a = x, b->x[n].b = y;
    return n;
}

gram_x gram_b_seq(gram_b *b, gram_x x, gram_x y) { return pair(b, X_SEQ, x, y); }
gram_x gram_b_alt(gram_b *b, gram_x x, gram_x y) { return pair(b, X_ALT, x, y); }

gram_x gram_b_rep(gram_b *b, gram_x x, int min, int max)
{
    if (b->err) return b->err;
    if (x < 0) return b_fail(b, x, "a bad expression");
    if (min < 0 || (max >= 0 && max < min) || min > 100000 || max > 100000)
        return b_fail(b, QERR_RANGE, "a repetition out of range");
    gram_x n = new_x(b, X_REP);
    if (n >= 0) b->x[n].a = x, b->x[n].min = min, b->x[n].max = max;
    return n;
}

/* ---- a rule's NFA --------------------------------------------------------------------- */

typedef gram_nfa nfa;

static int n_state(nfa *a) { return gram_nfa_state(a); }

static void n_edge(nfa *a, int from, int to, int sym, int lo, int hi) { gram_nfa_edge(a, from, to, sym, lo, hi); }

#define EPS(a, f, t) GRAM_EPS_EDGE(a, f, t)

/* Any JSON string content but the names of e: the product of the any-string
 * pattern's DFA and a trie of the names, built breadth-first. */
static void n_except(nfa *a, const gram_b *b, const xnode *e, int in, int out)
{
    const gram_re *re = b->res[e->re];
    /* The trie: node 0 the root; child[node * 256 + byte], 0 for none. */
    int cap_t = 1;
    for (size_t p = e->off; p < e->off + e->len;) {
        size_t l;
        memcpy(&l, b->lits + p, sizeof l);
        cap_t += (int)l;
        p += sizeof l + l;
    }
    int32_t *child = calloc((size_t)cap_t * 256, sizeof *child);
    uint8_t *term = calloc((size_t)cap_t, 1);
    const int na = gram_re_states(re);
    int32_t *map = NULL, *queue = NULL;
    if (!child || !term) goto oom;
    int nt = 1;
    for (size_t p = e->off; p < e->off + e->len;) {
        size_t l;
        memcpy(&l, b->lits + p, sizeof l);
        const uint8_t *nm = (const uint8_t *)b->lits + p + sizeof l;
        int t = 0;
        for (size_t i = 0; i < l; i++) {
            int32_t *c = &child[(size_t)t * 256 + nm[i]];
            if (!*c) *c = nt++;
            t = *c;
        }
        term[t] = 1;
        p += sizeof l + l;
    }
    /* Product states (pattern state, trie node + 1, 0 when out of the trie). */
    const size_t np = (size_t)na * (size_t)(nt + 1);
    map = malloc(np * sizeof *map);
    queue = q_mallocn(np, sizeof *queue);
    if (!map || !queue) goto oom;
    for (size_t i = 0; i < np; i++) map[i] = -1;
    int qh = 0, qt = 0;
    const size_t s0 = (size_t)gram_re_start(re) * (size_t)(nt + 1) + 1;
    map[s0] = n_state(a);
    EPS(a, in, map[s0]);
    queue[qt++] = (int32_t)s0;
    while (qh < qt && !a->rc) {
        const size_t ps = (size_t)queue[qh++];
        const int as = (int)(ps / (size_t)(nt + 1)), tn = (int)(ps % (size_t)(nt + 1)) - 1;
        if (gram_re_accepts(re, as) && (tn < 0 || !term[tn])) EPS(a, map[ps], out);
        for (int c = 0; c < 256; c++) {
            const int a2 = gram_re_step(re, as, (uint8_t)c);
            if (a2 < 0) continue;
            const int t2 = tn >= 0 ? child[(size_t)tn * 256 + (size_t)c] : 0;
            const size_t q = (size_t)a2 * (size_t)(nt + 1) + (size_t)(tn >= 0 && t2 ? t2 + 1 : 0);
            if (map[q] < 0) {
                map[q] = n_state(a);
                queue[qt++] = (int32_t)q;
            }
            n_edge(a, map[ps], map[q], GRAM_BYTES, c, c);
        }
    }
    free(child);
    free(term);
    free(map);
    free(queue);
    return;
oom:
    a->rc = QERR_NOMEM;
    free(child);
    free(term);
    free(map);
    free(queue);
}

static void n_expr(nfa *a, const gram_b *b, int x, int *in, int *out, int depth);

/* The repeated expression of an X_REP (gram_nfa_repeat's part). */
typedef struct {
    const gram_b *b;
    int x, depth;
} rep_ctx;

static void rep_part(gram_nfa *a, void *ctx, int *in, int *out)
{
    const rep_ctx *r = ctx;
    n_expr(a, r->b, r->x, in, out, r->depth);
}

/* Expression x between fresh states *in and *out. */
static void n_expr(nfa *a, const gram_b *b, int x, int *in, int *out, int depth)
{
    *in = n_state(a);
    *out = n_state(a);
    if (a->rc) return;
    if (depth > 5000) {
        a->rc = QERR_LIMIT;
        return;
    }
    const xnode *e = &b->x[x];
    int i1, o1, i2, o2;
    switch (e->k) {
    case X_EMPTY:
        EPS(a, *in, *out);
        break;
    case X_BYTE:
        n_edge(a, *in, *out, GRAM_BYTES, e->lo, e->hi);
        break;
    case X_LIT: {
        int cur = *in;
        for (size_t i = 0; i < e->len; i++) {
            int nx = i + 1 == e->len ? *out : n_state(a);
            const uint8_t c = (uint8_t)b->lits[e->off + i];
            n_edge(a, cur, nx, GRAM_BYTES, c, c);
            cur = nx;
        }
        if (!e->len) EPS(a, *in, *out);
        break;
    }
    case X_RE: {
        /* The pattern's DFA, state for state; its accepting states lead out. */
        const gram_re *re = b->res[e->re];
        const int ns = gram_re_states(re);
        int32_t *map = q_mallocn((size_t)ns, sizeof *map);
        if (!map) {
            a->rc = QERR_NOMEM;
            return;
        }
        for (int s = 0; s < ns; s++) map[s] = n_state(a);
        EPS(a, *in, map[gram_re_start(re)]);
        for (int s = 0; s < ns && !a->rc; s++) {
            if (gram_re_accepts(re, s)) EPS(a, map[s], *out);
            for (int c = 0; c < 256;) {
                const int t = gram_re_step(re, s, (uint8_t)c);
                int d = c + 1;
                while (d < 256 && gram_re_step(re, s, (uint8_t)d) == t) d++;
                if (t >= 0) n_edge(a, map[s], map[t], GRAM_BYTES, c, d - 1);
                c = d;
            }
        }
        free(map);
        break;
    }
    case X_REF:
        n_edge(a, *in, *out, e->rule, 0, 0);
        break;
    case X_EXCEPT:
        n_except(a, b, e, *in, *out);
        break;
    case X_SEQ:
        n_expr(a, b, e->a, &i1, &o1, depth + 1);
        n_expr(a, b, e->b, &i2, &o2, depth + 1);
        EPS(a, *in, i1);
        EPS(a, o1, i2);
        EPS(a, o2, *out);
        break;
    case X_ALT:
        n_expr(a, b, e->a, &i1, &o1, depth + 1);
        n_expr(a, b, e->b, &i2, &o2, depth + 1);
        EPS(a, *in, i1);
        EPS(a, *in, i2);
        EPS(a, o1, *out);
        EPS(a, o2, *out);
        break;
    case X_REP: {
        rep_ctx rc_ = { b, e->a, depth + 1 };
        gram_nfa_repeat(a, *in, *out, e->min, e->max, rep_part, &rc_);
        break;
    }
    }
}

/* ---- the compiled grammar ------------------------------------------------------------- */

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

gram *gram_retain(gram *g)
{
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

void gram_free(gram *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1) return;
    if (g->cache) {
        for (int b = 0; b < GCACHE_VOCABS; b++) {
            gclass *cls = g->cache->by[b].cls;
            for (int i = 0; cls && i < g->n_st; i++) free(cls[i].accept), free(cls[i].uncertain);
            free(cls);
        }
        pthread_mutex_destroy(&g->cache->mu);
        free(g->cache);
    }
    free(g->start);
    free(g->st);
    free(g->be);
    free(g->ce);
    free(g);
}

int gram_states(const gram *g) { return g->n_st; }

static int g_push_state(gram *g)
{
    if (g->n_st >= MAX_STATES) return QERR_LIMIT;
    if (grow((void **)&g->st, g->n_st, &g->cap_st, sizeof *g->st)) return QERR_NOMEM;
    memset(&g->st[g->n_st], 0, sizeof g->st[0]);
    return g->n_st++;
}

/* Compiles rule r's NFA (start in, accepting fin) into g's states; the rule's
 * start state to g->start[r]. */
static int compile_rule(gram *g, const nfa *a, int in, int fin, int r)
{
    /* Byte classes of this rule. */
    uint8_t cut[257] = { 0 };
    cut[0] = 1;
    for (int i = 0; i < a->n_e; i++)
        if (a->e[i].sym == GRAM_BYTES) cut[a->e[i].lo] = 1, cut[a->e[i].hi + 1] = 1;
    int nc = 0;
    uint8_t lo_of[256], hi_of[256];
    for (int c = 0; c < 256; c++) {
        if (cut[c]) {
            if (nc) hi_of[nc - 1] = (uint8_t)(c - 1);
            lo_of[nc++] = (uint8_t)c;
        }
    }
    hi_of[nc - 1] = 255;
    /* The rules this one calls. */
    int32_t *callees = q_mallocn((size_t)a->n_e + 1, sizeof *callees);
    int n_callees = 0;
    for (int i = 0; callees && i < a->n_e; i++)
        if (a->e[i].sym >= 0) callees[n_callees++] = a->e[i].sym;
    if (callees) qsort(callees, (size_t)n_callees, sizeof *callees, gram_cmp_i32);
    int k = 0;
    for (int i = 0; i < n_callees; i++)
        if (!k || callees[k - 1] != callees[i]) callees[k++] = callees[i];
    n_callees = k;

    gram_sets m = { 0 };
    int32_t *set = q_mallocn((size_t)a->n_s, sizeof *set), *stack = q_mallocn((size_t)a->n_s, sizeof *stack);
    uint32_t *mark = calloc((size_t)a->n_s, sizeof *mark);
    int32_t *gid = NULL; /* per subset: the global state */
    int cap_gid = 0, rc = 0;
    uint32_t stamp = 0;
    if (!set || !stack || !mark || !callees) rc = QERR_NOMEM;
    if (!rc) {
        set[0] = in;
        const int n = gram_nfa_closure(a, set, 1, mark, ++stamp, stack);
        if (gram_sets_get(&m, set, n) < 0) rc = QERR_NOMEM;
    }
    /* Byte edges and calls of a state are gathered here, then appended. */
    gbyte *bytes = q_mallocn((size_t)nc, sizeof *bytes);
    gcall *calls = q_mallocn((size_t)n_callees + 1, sizeof *calls);
    if (!bytes || !calls) rc = QERR_NOMEM;
    for (int d = 0; !rc && d < m.n; d++) {
        if (d >= cap_gid) {
            int cap = cap_gid ? cap_gid * 2 : 64;
            int32_t *ng = q_reallocn(gid, (size_t)cap, sizeof *ng);
            if (!ng) {
                rc = QERR_NOMEM;
                break;
            }
            gid = ng, cap_gid = cap;
        }
        /* The global ids of subsets are assigned in order: d -> base + d. */
        const int s = g_push_state(g);
        if (s < 0) {
            rc = s;
            break;
        }
        gid[d] = s;
        const int len = m.len[d];
        int accept = 0, nb = 0, ncall = 0;
        for (int i = 0; i < len; i++) accept |= m.items[m.off[d] + i] == fin;
        for (int c = 0; c < nc && !rc; c++) {
            int n = 0;
            ++stamp;
            for (int i = 0; i < len; i++)
                for (int32_t e = a->head[m.items[m.off[d] + i]]; e >= 0; e = a->next[e])
                    if (a->e[e].sym == GRAM_BYTES && a->e[e].lo <= lo_of[c] && lo_of[c] <= a->e[e].hi &&
                        mark[a->e[e].to] != stamp)
                        mark[a->e[e].to] = stamp, set[n++] = a->e[e].to;
            if (!n) continue;
            n = gram_nfa_closure(a, set, n, mark, ++stamp, stack);
            const int id = gram_sets_get(&m, set, n);
            if (id < 0) rc = QERR_NOMEM;
            /* Subset id: its global state is base + id (assigned in order). */
            else bytes[nb++] = (gbyte){ g->start[r] + id, lo_of[c], hi_of[c] };
        }
        for (int c = 0; c < n_callees && !rc; c++) {
            int n = 0;
            ++stamp;
            for (int i = 0; i < len; i++)
                for (int32_t e = a->head[m.items[m.off[d] + i]]; e >= 0; e = a->next[e])
                    if (a->e[e].sym == callees[c] && mark[a->e[e].to] != stamp)
                        mark[a->e[e].to] = stamp, set[n++] = a->e[e].to;
            if (!n) continue;
            n = gram_nfa_closure(a, set, n, mark, ++stamp, stack);
            const int id = gram_sets_get(&m, set, n);
            if (id < 0) rc = QERR_NOMEM;
            else calls[ncall++] = (gcall){ callees[c], g->start[r] + id };
        }
        if (rc) break;
        /* Adjacent ranges with one target merge. */
        int w = 0;
        for (int i = 0; i < nb; i++) {
            if (w && bytes[w - 1].to == bytes[i].to && bytes[w - 1].hi + 1 == bytes[i].lo) bytes[w - 1].hi = bytes[i].hi;
            else bytes[w++] = bytes[i];
        }
        nb = w;
        gstate *st = &g->st[s];
        st->accept = (uint8_t)accept;
        st->byte_off = g->n_be, st->n_byte = nb;
        st->call_off = g->n_ce, st->n_call = ncall;
        for (int i = 0; i < nb && !rc; i++) {
            if (grow((void **)&g->be, g->n_be, &g->cap_be, sizeof *g->be)) rc = QERR_NOMEM;
            else g->be[g->n_be++] = bytes[i];
        }
        for (int i = 0; i < ncall && !rc; i++) {
            if (grow((void **)&g->ce, g->n_ce, &g->cap_ce, sizeof *g->ce)) rc = QERR_NOMEM;
            else g->ce[g->n_ce++] = calls[i];
        }
    }
    gram_sets_free(&m);
    free(set);
    free(stack);
    free(mark);
    free(gid);
    free(bytes);
    free(calls);
    free(callees);
    return rc;
}

/* States reachable from s without reading a byte: through calls of nullable
 * rules.  Calls f(ctx, callee) for every call met on the way; 1 when an
 * accepting state is reached.  seen: per state, stamp marks visits. */
static int walk_eps(const gram *g, int32_t s, const uint8_t *nullable, uint32_t *seen, uint32_t stamp, int32_t *stack,
                    void (*f)(void *, int), void *ctx)
{
    int sp = 0, accept = 0;
    stack[sp++] = s;
    seen[s] = stamp;
    while (sp) {
        const gstate *st = &g->st[stack[--sp]];
        accept |= st->accept;
        for (int i = 0; i < st->n_call; i++) {
            const gcall c = g->ce[st->call_off + i];
            if (f) f(ctx, c.rule);
            if (nullable[c.rule] && seen[c.to] != stamp) seen[c.to] = stamp, stack[sp++] = c.to;
        }
    }
    return accept;
}

/* Calls made before reading a byte, as (caller, callee) pairs. */
typedef struct {
    int32_t (*e)[2];
    int n, cap, r, oom;
} leftcalls;

static void note_call(void *ctx, int callee)
{
    leftcalls *l = ctx;
    if (l->oom || grow((void **)&l->e, l->n, &l->cap, sizeof *l->e)) {
        l->oom = 1;
        return;
    }
    l->e[l->n][0] = l->r, l->e[l->n][1] = callee;
    l->n++;
}

static int cmp_pair(const void *x, const void *y)
{
    const int32_t *a = x, *b = y;
    return a[0] != b[0] ? (a[0] > b[0]) - (a[0] < b[0]) : (a[1] > b[1]) - (a[1] < b[1]);
}

/* A rule that calls itself before reading a byte (left recursion): its id,
 * or -1 (*oom set when out of memory). */
static int left_recursive(const gram *g, int *oom)
{
    const int n = g->n_rules;
    uint8_t *nullable = calloc((size_t)n, 1), *color = calloc((size_t)n, 1);
    uint32_t *seen = calloc((size_t)g->n_st, sizeof *seen);
    int32_t *stack = q_mallocn((size_t)g->n_st + 1, sizeof *stack), *path = q_mallocn((size_t)n + 1, sizeof *path),
            *it = q_mallocn((size_t)n + 1, sizeof *it), *off = q_callocn((size_t)n + 1, sizeof *off);
    leftcalls l = { 0 };
    int found = -1;
    uint32_t stamp = 0;
    *oom = 0;
    if (!nullable || !color || !seen || !stack || !path || !it || !off) {
        *oom = 1;
        goto out;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++)
            if (!nullable[r] && walk_eps(g, g->start[r], nullable, seen, ++stamp, stack, NULL, NULL))
                nullable[r] = 1, changed = 1;
    }
    for (int r = 0; r < n; r++) {
        l.r = r;
        walk_eps(g, g->start[r], nullable, seen, ++stamp, stack, note_call, &l);
    }
    if (l.oom) {
        *oom = 1;
        goto out;
    }
    /* The pairs as adjacency lists: callees of r in e[off[r]..off[r+1]). */
    if (l.n) qsort(l.e, (size_t)l.n, sizeof *l.e, cmp_pair);
    for (int i = 0; i < l.n; i++) off[l.e[i][0] + 1]++;
    for (int r = 0; r < n; r++) off[r + 1] += off[r];
    /* A cycle: depth-first, colours 0 new, 1 on the path, 2 done. */
    for (int r0 = 0; r0 < n && found < 0; r0++) {
        if (color[r0]) continue;
        int d = 0;
        path[0] = r0, it[0] = off[r0], color[r0] = 1;
        while (d >= 0 && found < 0) {
            const int r = path[d];
            if (it[d] == off[r + 1]) {
                color[r] = 2;
                d--;
                continue;
            }
            const int c = l.e[it[d]++][1];
            if (color[c] == 1) found = c;
            else if (!color[c]) path[++d] = c, it[d] = off[c], color[c] = 1;
        }
    }
out:
    free(nullable);
    free(color);
    free(seen);
    free(stack);
    free(path);
    free(it);
    free(off);
    free(l.e);
    return found;
}

int gram_b_build(gram_b *b, int root, gram **out, char *err, size_t errlen)
{
    *out = NULL;
    if (b->err) return qerr_set(err, errlen, b->err, "%s", b->msg);
    if (root < 0 || root >= b->n_rules) return qerr_set(err, errlen, QERR_RANGE, "no root rule");
    for (int r = 0; r < b->n_rules; r++)
        if (b->body[r] < 0) return qerr_set(err, errlen, QERR_INVAL, "rule '%s' is never defined", b->names[r]);
    gram *g = calloc(1, sizeof *g);
    if (!g || !(g->start = q_mallocn((size_t)b->n_rules, sizeof *g->start))) {
        free(g);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    g->n_rules = b->n_rules;
    g->root = root;
    atomic_init(&g->refs, 1);
    int rc = 0;
    for (int r = 0; r < b->n_rules && !rc; r++) {
        nfa a = { 0 };
        a.max_s = MAX_STATES;
        int in, fin;
        n_expr(&a, b, b->body[r], &in, &fin, 0);
        g->start[r] = g->n_st; /* the rule's states follow, its start first */
        rc = a.rc ? a.rc : compile_rule(g, &a, in, fin, r);
        gram_nfa_free(&a);
        if (rc) qerr_set(err, errlen, rc, rc == QERR_LIMIT ? "rule '%s': too many states" : "rule '%s': out of memory",
                         b->names[r]);
    }
    if (!rc) {
        int oom;
        const int lr = left_recursive(g, &oom);
        if (oom) rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        else if (lr >= 0)
            rc = qerr_set(err, errlen, QERR_INVAL, "rule '%s' calls itself before reading anything (left recursion)",
                          b->names[lr]);
    }
    if (!rc) {
        if (!(g->cache = calloc(1, sizeof *g->cache))) rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        else pthread_mutex_init(&g->cache->mu, NULL);
    }
    if (rc) {
        gram_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* ---- the matcher ------------------------------------------------------------------------ */

typedef struct {
    int32_t state, parent;
} mnode;

/* The parent of a node whose stack below is not known (token classes). */
#define UNKNOWN (-2)

struct gram_m {
    const gram *g;
    mnode *nodes;
    int n_nodes, cap_nodes;
    int32_t *tab;           /* hash-consing: node + 1, 0 empty */
    size_t tcap;
    int32_t *front;         /* the frontier */
    int n_front, cap_front;
    int can_end;
    /* scratch for a step: the next frontier, the closure's stack and marks */
    int32_t *nfront, *stk;
    int cap_nfront, cap_stk;
    uint32_t *mark;
    int cap_mark;
    uint32_t stamp;
    /* masks of recent frontiers (a frontier met again - inside a string, a
     * repeated array item - gives the same mask): MASK_CACHE entries */
    struct mcache {
        uint64_t hash;
        int32_t *nodes;
        int n, end, used;
        uint32_t *mask;
    } mc[8];
    const gram_vocab *mc_vocab;
    int mc_next;
    int unknown;            /* a closure returned into UNKNOWN (classifying a state) */
    /* commits: frontiers back to back in h_items, one hent each */
    int32_t *h_items;
    size_t h_n, h_cap;
    struct hent {
        size_t off;
        int len, end;
    } *h;
    int n_h, cap_h;
};

static uint64_t node_hash(int32_t s, int32_t p) { return ((uint64_t)(uint32_t)s * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)(uint32_t)p * 0xc2b2ae3d27d4eb4fULL); }

/* The node (state, parent), made when new; -1 when out of memory. */
static int32_t intern(gram_m *m, int32_t s, int32_t p)
{
    if ((size_t)(m->n_nodes + 1) * 2 > m->tcap) {
        size_t cap = m->tcap ? m->tcap * 2 : 1024;
        int32_t *t = calloc(cap, sizeof *t);
        if (!t) return -1;
        for (int i = 0; i < m->n_nodes; i++) {
            size_t j = node_hash(m->nodes[i].state, m->nodes[i].parent) & (cap - 1);
            while (t[j]) j = (j + 1) & (cap - 1);
            t[j] = i + 1;
        }
        free(m->tab);
        m->tab = t, m->tcap = cap;
    }
    size_t j = node_hash(s, p) & (m->tcap - 1);
    while (m->tab[j]) {
        const int32_t n = m->tab[j] - 1;
        if (m->nodes[n].state == s && m->nodes[n].parent == p) return n;
        j = (j + 1) & (m->tcap - 1);
    }
    if (grow((void **)&m->nodes, m->n_nodes, &m->cap_nodes, sizeof *m->nodes)) return -1;
    m->nodes[m->n_nodes] = (mnode){ s, p };
    m->tab[j] = m->n_nodes + 1;
    return m->n_nodes++;
}

static int ensure(void **p, int *cap, int need, size_t size)
{
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = q_reallocn(*p, (size_t)c, size);
    if (!q) return QERR_NOMEM;
    *p = q, *cap = c;
    return 0;
}

/* The closure of the n raw tops in stk[0..n): frontier into nfront
 * (*n_out), completeness into *end.  0, QERR_LIMIT or QERR_NOMEM. */
static int take_closure(gram_m *m, int sp, int *n_out, int *end)
{
    const gram *g = m->g;
    int nf = 0, visited = 0;
    *end = 0;
    ++m->stamp;
    while (sp) {
        const int32_t n = m->stk[--sp];
        if (m->n_nodes > m->cap_mark) {
            /* New nodes start unmarked. */
            const int old = m->cap_mark;
            if (ensure((void **)&m->mark, &m->cap_mark, m->n_nodes, sizeof *m->mark)) return QERR_NOMEM;
            memset(m->mark + old, 0, sizeof *m->mark * (size_t)(m->cap_mark - old));
        }
        if (m->mark[n] == m->stamp) continue;
        m->mark[n] = m->stamp;
        if (++visited > MAX_CLOSURE) return QERR_LIMIT;
        const mnode nd = m->nodes[n];
        const gstate *st = &g->st[nd.state];
        if (st->n_byte) {
            if (ensure((void **)&m->nfront, &m->cap_nfront, nf + 1, sizeof *m->nfront)) return QERR_NOMEM;
            m->nfront[nf++] = n;
        }
        if (ensure((void **)&m->stk, &m->cap_stk, sp + st->n_call + 1, sizeof *m->stk)) return QERR_NOMEM;
        for (int i = 0; i < st->n_call; i++) {
            const gcall c = g->ce[st->call_off + i];
            const int32_t ret = intern(m, c.to, nd.parent);
            const int32_t child = ret < 0 ? -1 : intern(m, g->start[c.rule], ret);
            if (child < 0) return QERR_NOMEM;
            m->stk[sp++] = child;
        }
        if (st->accept) {
            if (nd.parent == UNKNOWN) m->unknown = 1; /* returns into a stack not known here */
            else if (nd.parent < 0) *end = 1;
            else m->stk[sp++] = nd.parent;
        }
    }
    /* A stable order: the frontier as a sorted set. */
    if (nf > 1) qsort(m->nfront, (size_t)nf, sizeof *m->nfront, gram_cmp_i32);
    *n_out = nf;
    return 0;
}

/* The next state of s on byte c, or -1. */
static int32_t byte_next(const gram *g, int32_t s, uint8_t c)
{
    const gstate *st = &g->st[s];
    int lo = 0, hi = st->n_byte - 1;
    const gbyte *e = g->be + st->byte_off;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        if (c < e[mid].lo) hi = mid - 1;
        else if (c > e[mid].hi) lo = mid + 1;
        else return e[mid].to;
    }
    return -1;
}

/* One byte from frontier f[0..n): the next frontier in m->nfront (*n_out,
 * *end).  0 (possibly an empty result), or an error. */
static int step(gram_m *m, const int32_t *f, int n, uint8_t c, int *n_out, int *end)
{
    if (ensure((void **)&m->stk, &m->cap_stk, n + 1, sizeof *m->stk)) return QERR_NOMEM;
    int sp = 0;
    for (int i = 0; i < n; i++) {
        const int32_t t = byte_next(m->g, m->nodes[f[i]].state, c);
        if (t < 0) continue;
        const int32_t nn = intern(m, t, m->nodes[f[i]].parent);
        if (nn < 0) return QERR_NOMEM;
        m->stk[sp++] = nn;
    }
    return take_closure(m, sp, n_out, end);
}

static int set_front(gram_m *m, const int32_t *f, int n, int end)
{
    if (ensure((void **)&m->front, &m->cap_front, n + 1, sizeof *m->front)) return QERR_NOMEM;
    if (n) memmove(m->front, f, sizeof *f * (size_t)n);
    m->n_front = n;
    m->can_end = end;
    return 0;
}

gram_m *gram_m_new(const gram *g)
{
    gram_m *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = g;
    const int32_t root = intern(m, g->start[g->root], -1);
    int n = 0, end = 0;
    if (root < 0 || ensure((void **)&m->stk, &m->cap_stk, 1, sizeof *m->stk)) goto fail;
    m->stk[0] = root;
    if (take_closure(m, 1, &n, &end) || set_front(m, m->nfront, n, end) || gram_m_commit(m)) goto fail;
    return m;
fail:
    gram_m_free(m);
    return NULL;
}

void gram_m_free(gram_m *m)
{
    if (!m) return;
    free(m->nodes);
    free(m->tab);
    free(m->front);
    free(m->nfront);
    free(m->stk);
    free(m->mark);
    free(m->h_items);
    free(m->h);
    for (int i = 0; i < 8; i++) free(m->mc[i].nodes), free(m->mc[i].mask);
    free(m);
}

int gram_m_feed(gram_m *m, const uint8_t *s, size_t n)
{
    /* Work on a copy so that a refusal leaves m as it was. */
    int32_t *cur = q_mallocn((size_t)m->n_front + 1, sizeof *cur);
    if (!cur) return QERR_NOMEM;
    memcpy(cur, m->front, sizeof *cur * (size_t)m->n_front);
    int nc = m->n_front, end = m->can_end, rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        int nn;
        rc = step(m, cur, nc, s[i], &nn, &end);
        if (rc) break;
        if (!nn && !end) {
            rc = QERR_INVAL;
            break;
        }
        if (nn > nc) {
            int32_t *c2 = q_reallocn(cur, (size_t)nn, sizeof *c2);
            if (!c2) {
                rc = QERR_NOMEM;
                break;
            }
            cur = c2;
        }
        memcpy(cur, m->nfront, sizeof *cur * (size_t)nn);
        nc = nn;
        /* Complete with nothing that can follow: only the end is left. */
        if (!nn && i + 1 < n) rc = QERR_INVAL;
    }
    if (!rc) rc = set_front(m, cur, nc, end);
    free(cur);
    return rc;
}

int gram_m_allows(gram_m *m, const uint8_t *s, size_t n)
{
    int32_t *cur = q_mallocn((size_t)m->n_front + 1, sizeof *cur);
    if (!cur) return 0;
    memcpy(cur, m->front, sizeof *cur * (size_t)m->n_front);
    int nc = m->n_front, end = m->can_end, ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        int nn;
        if (step(m, cur, nc, s[i], &nn, &end) || (!nn && !end) || (!nn && i + 1 < n)) {
            ok = 0;
            break;
        }
        if (nn > nc) {
            int32_t *c2 = q_reallocn(cur, (size_t)nn, sizeof *c2);
            if (!c2) {
                ok = 0;
                break;
            }
            cur = c2;
        }
        memcpy(cur, m->nfront, sizeof *cur * (size_t)nn);
        nc = nn;
    }
    free(cur);
    return ok;
}

int gram_m_can_end(const gram_m *m) { return m->can_end; }

int gram_m_done(const gram_m *m) { return m->n_front == 0; }

int gram_m_commit(gram_m *m)
{
    if (ensure((void **)&m->h, &m->cap_h, m->n_h + 1, sizeof *m->h)) return QERR_NOMEM;
    if (m->h_n + (size_t)m->n_front > m->h_cap) {
        size_t cap = m->h_cap ? m->h_cap * 2 : 256;
        while (cap < m->h_n + (size_t)m->n_front) cap *= 2;
        int32_t *it = q_reallocn(m->h_items, cap, sizeof *it);
        if (!it) return QERR_NOMEM;
        m->h_items = it, m->h_cap = cap;
    }
    if (m->n_front) memcpy(m->h_items + m->h_n, m->front, sizeof *m->front * (size_t)m->n_front);
    m->h[m->n_h] = (struct hent){ m->h_n, m->n_front, m->can_end };
    m->h_n += (size_t)m->n_front;
    m->n_h++;
    return 0;
}

int gram_m_rollback(gram_m *m, int k)
{
    if (k < 0 || k >= m->n_h) return QERR_RANGE;
    const int i = m->n_h - 1 - k;
    int rc = set_front(m, m->h_items + m->h[i].off, m->h[i].len, m->h[i].end);
    if (rc) return rc;
    m->n_h = i + 1;
    m->h_n = m->h[i].off + (size_t)m->h[i].len;
    return 0;
}

void gram_m_reset(gram_m *m)
{
    if (m->n_h > 0) gram_m_rollback(m, m->n_h - 1);
}

/* ---- token masks ------------------------------------------------------------------------ */

/* A vocabulary as byte strings, sorted so that tokens sharing a prefix are
 * neighbours: a mask walks them in that order and steps the frontier only
 * over the bytes a token does not share with the one before. */
struct gram_vocab {
    int n;
    uint8_t *bytes;     /* all tokens' bytes back to back */
    size_t *off;        /* (n + 1) */
    int32_t *order;     /* (n_usable) token ids, their bytes in increasing order */
    int32_t *lcp;       /* (n_usable) bytes shared with the previous in order */
    int n_usable;
    size_t max_len;
};

static const gram_vocab *g_sort_vocab; /* qsort has no context argument */

static int cmp_tok(const void *x, const void *y)
{
    const gram_vocab *v = g_sort_vocab;
    const int a = *(const int32_t *)x, b = *(const int32_t *)y;
    const size_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b];
    const int c = memcmp(v->bytes + v->off[a], v->bytes + v->off[b], la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

int gram_vocab_new(int n, const uint8_t *const *bytes, const size_t *lens, const uint8_t *skip, gram_vocab **out)
{
    *out = NULL;
    gram_vocab *v = calloc(1, sizeof *v);
    if (!v) return QERR_NOMEM;
    v->n = n;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += lens[i];
    v->bytes = malloc(total + 1);
    v->off = q_mallocn((size_t)n + 1, sizeof *v->off);
    v->order = q_mallocn((size_t)n + 1, sizeof *v->order);
    v->lcp = q_mallocn((size_t)n + 1, sizeof *v->lcp);
    if (!v->bytes || !v->off || !v->order || !v->lcp) {
        gram_vocab_free(v);
        return QERR_NOMEM;
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        v->off[i] = at;
        if (lens[i]) memcpy(v->bytes + at, bytes[i], lens[i]);
        at += lens[i];
        if (lens[i] > v->max_len) v->max_len = lens[i];
        /* Tokens with no bytes, or marked (special tokens), the grammar never takes. */
        if (lens[i] && !(skip && skip[i])) v->order[v->n_usable++] = i;
    }
    v->off[n] = at;
    g_sort_vocab = v;
    qsort(v->order, (size_t)v->n_usable, sizeof *v->order, cmp_tok);
    g_sort_vocab = NULL;
    for (int k = 0; k < v->n_usable; k++) {
        int l = 0;
        if (k) {
            const int a = v->order[k - 1], b = v->order[k];
            const size_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b];
            while ((size_t)l < la && (size_t)l < lb && v->bytes[v->off[a] + (size_t)l] == v->bytes[v->off[b] + (size_t)l]) l++;
        }
        v->lcp[k] = l;
    }
    *out = v;
    return 0;
}

void gram_vocab_free(gram_vocab *v)
{
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->order);
    free(v->lcp);
    free(v);
}

int gram_vocab_size(const gram_vocab *v) { return v->n; }

int gram_m_feed_token(gram_m *m, const gram_vocab *v, int token)
{
    if (token < 0 || token >= v->n) return QERR_RANGE;
    const size_t l = v->off[token + 1] - v->off[token];
    if (!l) return QERR_INVAL;
    int rc = gram_m_feed(m, v->bytes + v->off[token], l);
    if (!rc) rc = gram_m_commit(m);
    return rc;
}

static uint64_t front_hash(const int32_t *f, int n, int end)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)(n * 2 + end);
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)f[i]) * 0x100000001b3ULL;
    return h;
}

static int walk(gram_m *m, const gram_vocab *v, const int32_t *f0, int n0, int end0, const int32_t *pos, int npos,
                uint32_t *acc, uint32_t *unk);

#define BIT(w, i) (((w)[(i) / 32] >> ((i) % 32)) & 1u)
#define SET(w, i) ((w)[(i) / 32] |= 1u << ((i) % 32))

/* The token classes of state s for v (made on first use, kept in the
 * grammar), or NULL when the grammar's classes are for another vocabulary
 * or memory is short. */
static atomic_llong g_classes_made;

long long gram_classes_made(void) { return atomic_load(&g_classes_made); }

static const gclass *class_of(gram_m *m, const gram_vocab *v, int32_t s)
{
    gcache *c = m->g->cache;
    const gclass *out = NULL;
    pthread_mutex_lock(&c->mu);
    int b = 0;
    while (b < GCACHE_VOCABS && c->by[b].v && c->by[b].v != v) b++;
    if (b < GCACHE_VOCABS && !c->by[b].v && (c->by[b].cls = q_callocn((size_t)m->g->n_st, sizeof *c->by[b].cls)))
        c->by[b].v = v;
    if (b < GCACHE_VOCABS && c->by[b].v == v) {
        gclass *k = &c->by[b].cls[s];
        if (!k->accept) {
            const size_t words = ((size_t)v->n + 31) / 32;
            uint32_t *acc = q_callocn(words, sizeof *acc), *unk = q_callocn(words, sizeof *unk);
            const int32_t node = intern(m, s, UNKNOWN);
            if (acc && unk && node >= 0 && walk(m, v, &node, 1, 0, NULL, 0, acc, unk) == 0) {
                int n = 0;
                for (int i = 0; i < v->n; i++) n += (int)BIT(unk, i);
                k->uncertain = q_mallocn((size_t)n + 1, sizeof *k->uncertain);
                if (k->uncertain) {
                    for (int p = 0; p < v->n_usable; p++)
                        if (BIT(unk, v->order[p])) k->uncertain[k->n_uncertain++] = p;
                    k->accept = acc, acc = NULL;
                    atomic_fetch_add(&g_classes_made, 1);
                }
            }
            free(acc);
            free(unk);
        }
        if (k->accept) out = k;
    }
    pthread_mutex_unlock(&c->mu);
    return out;
}

/* The mask from the token classes of the frontier's states, with the
 * uncertain tokens decided by a walk of the whole frontier over them only;
 * 1 when some class was missing (the caller walks everything). */
static int cmp_int32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int mask_by_classes(gram_m *m, const gram_vocab *v, uint32_t *mask, int *rc)
{
    const size_t words = ((size_t)v->n + 31) / 32;
    memset(mask, 0, sizeof *mask * words);
    const gclass *one[8], **ks = m->n_front <= 8 ? one : q_mallocn((size_t)m->n_front, sizeof *ks);
    if (!ks) return 1;
    int total = 0;
    for (int i = 0; i < m->n_front; i++) {
        ks[i] = class_of(m, v, m->nodes[m->front[i]].state);
        if (!ks[i]) {
            if (ks != one) free(ks);
            return 1;
        }
        for (size_t w = 0; w < words; w++) mask[w] |= ks[i]->accept[w];
        total += ks[i]->n_uncertain;
    }
    /* The uncertain tokens no class accepts, by their positions in the
     * vocabulary's order (once each). */
    int32_t *pos = q_mallocn((size_t)total + 1, sizeof *pos);
    uint32_t *seen = m->n_front > 1 ? q_callocn(words, sizeof *seen) : NULL;
    int n = 0;
    if (!pos || (m->n_front > 1 && !seen)) {
        free(pos);
        free(seen);
        if (ks != one) free(ks);
        return 1;
    }
    for (int i = 0; i < m->n_front; i++)
        for (int j = 0; j < ks[i]->n_uncertain; j++) {
            const int p = ks[i]->uncertain[j], tok = v->order[p];
            if (BIT(mask, tok) || (seen && BIT(seen, tok))) continue;
            if (seen) SET(seen, tok);
            pos[n++] = p;
        }
    if (seen) qsort(pos, (size_t)n, sizeof *pos, cmp_int32);
    *rc = n ? walk(m, v, m->front, m->n_front, m->can_end, pos, n, mask, NULL) : 0;
    free(pos);
    free(seen);
    if (ks != one) free(ks);
    return 0;
}

int gram_m_mask(gram_m *m, const gram_vocab *v, uint32_t *mask)
{
    const size_t words = ((size_t)v->n + 31) / 32;
    if (m->mc_vocab != v) { /* another vocabulary: the cache starts over */
        for (int i = 0; i < 8; i++) m->mc[i].used = 0;
        m->mc_vocab = v;
    }
    const uint64_t h = front_hash(m->front, m->n_front, m->can_end);
    for (int i = 0; i < 8; i++) {
        const struct mcache *c = &m->mc[i];
        if (c->used && c->hash == h && c->n == m->n_front && c->end == m->can_end &&
            !memcmp(c->nodes, m->front, sizeof *c->nodes * (size_t)c->n)) {
            memcpy(mask, c->mask, sizeof *mask * words);
            return 0;
        }
    }
    int rc = 0;
    if (!m->g->cache || mask_by_classes(m, v, mask, &rc)) {
        memset(mask, 0, sizeof *mask * words);
        rc = walk(m, v, m->front, m->n_front, m->can_end, NULL, 0, mask, NULL);
    }
    if (rc) return rc;
    struct mcache *c = &m->mc[m->mc_next];
    m->mc_next = (m->mc_next + 1) % 8;
    int32_t *nodes = q_reallocn(c->nodes, (size_t)m->n_front + 1, sizeof *nodes);
    if (nodes) c->nodes = nodes;
    uint32_t *mk = nodes && !c->mask ? q_mallocn(words, sizeof *mk) : c->mask;
    if (!nodes || !mk) { /* no cache entry: the mask is right all the same */
        c->used = 0;
        return 0;
    }
    c->mask = mk;
    memcpy(c->nodes, m->front, sizeof *nodes * (size_t)m->n_front);
    memcpy(c->mask, mask, sizeof *mask * words);
    c->hash = h, c->n = m->n_front, c->end = m->can_end, c->used = 1;
    return 0;
}

/* Walks the vocabulary (only the npos tokens at positions pos of its
 * order, increasing, when pos is not NULL) from frontier f0 (end0:
 * complete there): sets in acc the tokens the frontier takes.
 * With unk (classifying a state whose stack below is UNKNOWN), sets in unk
 * the tokens not taken on whose way some path returned into UNKNOWN. */
static int walk(gram_m *m, const gram_vocab *v, const int32_t *f0, int n0, int end0, const int32_t *pos, int npos,
                uint32_t *acc, uint32_t *unk)
{
    /* Frontiers by depth: depth d is the frontier after d bytes of the
     * current token, in pool[off[d] .. off[d] + len[d]); un[d]: a path went
     * into UNKNOWN on the way there. */
    const size_t D = v->max_len + 1;
    size_t *off = q_mallocn(D + 1, sizeof *off);
    int *len = q_mallocn(D + 1, sizeof *len), *un = q_callocn(D + 1, sizeof *un);
    size_t cap = (size_t)n0 * 4 + 1024;
    int32_t *pool = q_mallocn(cap, sizeof *pool);
    int rc = off && len && un && pool ? 0 : QERR_NOMEM;
    if (!rc) {
        if (n0) memcpy(pool, f0, sizeof *pool * (size_t)n0);
        off[0] = 0, len[0] = n0;
    }
    (void)end0;
    int depth = 0;     /* frontiers valid for depths 0..depth */
    int dead = -1;     /* tokens sharing this many bytes with the last refused one are refused */
    int dead_un = 0;   /* ... and that one met UNKNOWN */
    int eff = 1 << 30; /* bytes shared with the last token walked */
    const int nk = pos ? npos : v->n_usable;
    int prev = -1; /* the last token walked (pos given) */
    for (int j = 0; !rc && j < nk; j++) {
        const int tok = v->order[pos ? pos[j] : j];
        int shared;
        if (pos) {
            /* Bytes shared with the last one walked, counted. */
            shared = 0;
            if (prev >= 0) {
                const uint8_t *x = v->bytes + v->off[prev], *y = v->bytes + v->off[tok];
                const size_t lx = v->off[prev + 1] - v->off[prev], ly = v->off[tok + 1] - v->off[tok];
                while ((size_t)shared < lx && (size_t)shared < ly && x[shared] == y[shared]) shared++;
            }
            prev = tok;
        } else {
            if (v->lcp[j] < eff) eff = v->lcp[j];
            shared = eff;
            eff = 1 << 30;
        }
        if (dead >= 0) {
            if (shared >= dead) {
                if (unk && dead_un) SET(unk, tok);
                continue;
            }
            dead = -1;
        }
        if (shared < depth) depth = shared;
        const uint8_t *b = v->bytes + v->off[tok];
        const int l = (int)(v->off[tok + 1] - v->off[tok]);
        int ok = 1;
        while (depth < l) {
            /* Complete with nothing after it: no byte can follow. */
            if (!len[depth]) {
                ok = 0;
                break;
            }
            int nn, e;
            m->unknown = 0;
            rc = step(m, pool + off[depth], len[depth], b[depth], &nn, &e);
            if (rc) break;
            const int went = un[depth] || m->unknown;
            if (!nn && !e) {
                un[depth + 1] = went;
                ok = 0;
                break;
            }
            const size_t need = off[depth] + (size_t)len[depth] + (size_t)nn;
            if (need > cap) {
                size_t c2 = cap * 2;
                while (c2 < need) c2 *= 2;
                int32_t *p2 = q_reallocn(pool, c2, sizeof *p2);
                if (!p2) {
                    rc = QERR_NOMEM;
                    break;
                }
                pool = p2, cap = c2;
            }
            off[depth + 1] = off[depth] + (size_t)len[depth];
            if (nn) memcpy(pool + off[depth + 1], m->nfront, sizeof *pool * (size_t)nn);
            len[depth + 1] = nn;
            un[depth + 1] = went;
            depth++;
        }
        if (rc) break;
        if (!ok) {
            dead = depth + 1;
            dead_un = un[depth + 1 <= (int)D ? depth + 1 : depth];
            if (unk && dead_un) SET(unk, tok);
            continue;
        }
        SET(acc, tok);
    }
    free(off);
    free(len);
    free(un);
    free(pool);
    return rc;
}
