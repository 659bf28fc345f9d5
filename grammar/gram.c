/* gram.c - grammars over bytes: building and compiling (gram.h); matching
 * is gram_match.c's.
 *
 * Building: expressions live in the builder's arena (xnode), rules point
 * at their bodies.
 *
 * Compiling: each rule's body becomes an NFA whose edges read a byte range,
 * call a rule, or read nothing; a subset construction over the rule's byte
 * classes and the rules it calls makes it deterministic: from a state, one
 * next state a byte, one a called rule.  All rules' states go into one
 * array (gstate); a state's byte edges are sorted ranges. */
#include "gram.h"
#include "gram_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram_re.h"
#include "gram_nfa.h"
#include "qerr.h"
#include "util.h"

#define MAX_NFA 1000000 /* NFA states of one rule */

/* ---- the builder ------------------------------------------------------------------ */

typedef enum { X_EMPTY, X_BYTE, X_LIT, X_RE, X_REF, X_SEQ, X_ALT, X_REP, X_EXCEPT, X_PERM } xkind;

typedef struct {
    xkind k;
    int a, b;           /* SEQ, ALT: children; REP: child */
    int min, max;       /* REP */
    uint8_t lo, hi;     /* BYTE */
    size_t off, len;    /* LIT: bytes in lits; EXCEPT: the names, each a size_t length then its bytes */
    int count;          /* EXCEPT: how many names; PERM: index in perms */
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
    struct bperm {      /* gram_b_perm's: members are rules first..first + n - 1, the extra one first + n */
        int rule, n, first, has_extra, min, max, ndeps;
        uint8_t *required;
        int32_t (*deps)[2];
        size_t sep_off, sep_len;
    } *perms;
    int n_perms, cap_perms;
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
    for (int i = 0; i < b->n_perms; i++) free(b->perms[i].required), free(b->perms[i].deps);
    free(b->perms);
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


static gram_x new_x(gram_b *b, xkind k)
{
    if (b->err) return b->err;
    if (gram_grow((void **)&b->x, b->n_x, &b->cap_x, sizeof *b->x)) return b_fail(b, QERR_NOMEM, "out of memory");
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
    if (gram_grow((void **)&b->res, b->n_res, &b->cap_res, sizeof *b->res)) {
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

gram_x gram_b_perm(gram_b *b, const gram_perm *p)
{
    if (b->err) return b->err;
    if (p->n < 0 || p->ndeps < 0 || !p->sep || strlen(p->sep) != 1 || p->min < 0 || p->max < -1)
        return b_fail(b, QERR_INVAL, "a bad set of members");
    for (int i = 0; i < p->n; i++)
        if (p->member[i] < 0) return b_fail(b, p->member[i], "a bad expression");
    if (p->has_extra && p->extra < 0) return b_fail(b, p->extra, "a bad expression");
    for (int d = 0; d < p->ndeps; d++)
        if (p->deps[d][0] < 0 || p->deps[d][0] >= p->n || p->deps[d][1] < 0 || p->deps[d][1] >= p->n)
            return b_fail(b, QERR_RANGE, "a dependency on no member");
    if (gram_grow((void **)&b->perms, b->n_perms, &b->cap_perms, sizeof *b->perms))
        return b_fail(b, QERR_NOMEM, "out of memory");
    struct bperm *bp = &b->perms[b->n_perms];
    *bp = (struct bperm){ .n = p->n, .has_extra = p->has_extra, .min = p->min, .max = p->max, .ndeps = p->ndeps };
    bp->required = calloc((size_t)p->n + 1, 1);
    bp->deps = q_mallocn((size_t)p->ndeps + 1, sizeof *bp->deps);
    bp->sep_off = lit_put(b, p->sep, strlen(p->sep));
    bp->sep_len = strlen(p->sep);
    if (!bp->required || !bp->deps || bp->sep_off == (size_t)-1) {
        free(bp->required), free(bp->deps);
        return b_fail(b, QERR_NOMEM, "out of memory");
    }
    b->n_perms++;
    for (int i = 0; i < p->n; i++) bp->required[i] = p->required && p->required[i];
    for (int d = 0; d < p->ndeps; d++) bp->deps[d][0] = p->deps[d][0], bp->deps[d][1] = p->deps[d][1];
    /* The members' rules, one after the other (their tags are their order). */
    const int rule = gram_b_rule(b, "members");
    bp->rule = rule;
    bp->first = b->n_rules;
    for (int i = 0; i < p->n + p->has_extra && !b->err; i++) {
        const int r = gram_b_rule(b, i < p->n ? "member" : "extra member");
        if (r >= 0) gram_b_define(b, r, i < p->n ? p->member[i] : p->extra);
    }
    const gram_x x = new_x(b, X_PERM);
    if (x < 0) return x;
    b->x[x].count = b->n_perms - 1;
    if (gram_b_define(b, rule, x)) return b->err;
    return gram_b_ref(b, rule);
}

/* ---- a rule's NFA --------------------------------------------------------------------- */

typedef gram_nfa nfa;

static int n_state(nfa *a) { return gram_nfa_state(a); }

static void n_edge(nfa *a, int from, int to, int sym, int lo, int hi) { gram_nfa_edge(a, from, to, sym, lo, hi); }

#define EPS(a, f, t) GRAM_EPS_EDGE(a, f, t)

/* Any JSON string content but the names of e: the product of the any-string
 * pattern's DFA and a trie of the names, built breadth-first. */
static __attribute__((noinline)) void n_except(nfa *a, const gram_b *b, const xnode *e, int in, int out)
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
    uint8_t lo[256], hi[256];
    int32_t to[256];
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
    memset(map, 0xff, np * sizeof *map); /* -1: no state yet */
    int qh = 0, qt = 0;
    const size_t s0 = (size_t)gram_re_start(re) * (size_t)(nt + 1) + 1;
    map[s0] = n_state(a);
    EPS(a, in, map[s0]);
    queue[qt++] = (int32_t)s0;
    while (qh < qt && !a->rc) {
        const size_t ps = (size_t)queue[qh++];
        const int as = (int)(ps / (size_t)(nt + 1)), tn = (int)(ps % (size_t)(nt + 1)) - 1;
        if (gram_re_accepts(re, as) && (tn < 0 || !term[tn])) EPS(a, map[ps], out);
        /* By ranges of the pattern's next state; in the trie, a byte that
         * has a child stands alone.  States are made in byte order. */
        const int32_t *kids = tn >= 0 ? &child[(size_t)tn * 256] : NULL;
        const int nr = gram_re_ranges(re, as, lo, hi, to);
        for (int i = 0; i < nr; i++) {
            if (to[i] < 0) continue;
            for (int c = lo[i], d; c <= hi[i]; c = d + 1) {
                const int t2 = kids ? kids[c] : 0;
                d = c;
                if (!t2)
                    while (d < hi[i] && !(kids && kids[d + 1])) d++;
                const size_t q = (size_t)to[i] * (size_t)(nt + 1) + (size_t)(t2 ? t2 + 1 : 0);
                if (map[q] < 0) {
                    map[q] = n_state(a);
                    queue[qt++] = (int32_t)q;
                }
                n_edge(a, map[ps], map[q], GRAM_BYTES, c, d);
            }
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

/* A pattern's DFA between in and out, state for state: an edge a range of
 * bytes with one next state, the accepting states lead out.  (Not inlined
 * in n_expr: its arrays would sit in every frame of that recursion.) */
static __attribute__((noinline)) void n_regex(nfa *a, const gram_re *re, int in, int out)
{
    const int ns = gram_re_states(re);
    int32_t *map = q_mallocn((size_t)ns, sizeof *map);
    if (!map) {
        a->rc = QERR_NOMEM;
        return;
    }
    for (int s = 0; s < ns; s++) map[s] = n_state(a);
    EPS(a, in, map[gram_re_start(re)]);
    uint8_t lo[256], hi[256];
    int32_t to[256];
    for (int s = 0; s < ns && !a->rc; s++) {
        if (gram_re_accepts(re, s)) EPS(a, map[s], out);
        const int nr = gram_re_ranges(re, s, lo, hi, to);
        for (int i = 0; i < nr; i++)
            if (to[i] >= 0) n_edge(a, map[s], map[to[i]], GRAM_BYTES, lo[i], hi[i]);
    }
    free(map);
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
    case X_RE:
        n_regex(a, b->res[e->re], *in, *out);
        break;
    case X_REF:
        n_edge(a, *in, *out, e->rule, 0, 0);
        break;
    case X_EXCEPT:
        n_except(a, b, e, *in, *out);
        break;
    case X_PERM: {
        /* A member, then (the separator, a member) any number of times:
         * which members the matcher decides. */
        const struct bperm *p = &b->perms[e->count];
        const int mid = n_state(a);
        int cur = mid;
        for (size_t i = 0; i < p->sep_len; i++) {
            const int nx = n_state(a);
            const uint8_t c = (uint8_t)b->lits[p->sep_off + i];
            n_edge(a, cur, nx, GRAM_BYTES, c, c);
            cur = nx;
        }
        for (int r = p->first; r < p->first + p->n + p->has_extra; r++) {
            n_edge(a, *in, mid, r, 0, 0);
            n_edge(a, cur, mid, r, 0, 0);
        }
        EPS(a, *in, *out);
        EPS(a, mid, *out);
        break;
    }
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
    for (int i = 0; i < g->n_perms; i++) free(g->perms[i].req), free(g->perms[i].deps);
    free(g->perms);
    free(g->perm_of);
    free(g->tag);
    free(g);
}

int gram_states(const gram *g) { return g->n_st; }

static int g_push_state(gram *g)
{
    if (g->n_st >= gram_limits_now()->states) return QERR_LIMIT;
    if (gram_grow((void **)&g->st, g->n_st, &g->cap_st, sizeof *g->st)) return QERR_NOMEM;
    memset(&g->st[g->n_st], 0, sizeof g->st[0]);
    return g->n_st++;
}

/* What compiling a rule needs beside the rule: kept from one rule to the
 * next, its buffers cleared, not freed (a schema's grammar has many small
 * rules; allocating afresh for each was most of their cost). */
typedef struct {
    gram_sets m;
    gram_moves mv;
    gram_closures cl;
    int32_t *set, *stack;   /* (cap_s) */
    uint32_t *mark;         /* (cap_s), stamps go on rising across rules */
    int cap_s;
    uint32_t stamp;
    int32_t *callees;       /* (cap_e) */
    gcall *calls;           /* (cap_e) */
    int cap_e;
    int32_t *gid;           /* per subset: the global state */
    int cap_gid;
    gbyte bytes[256];
} rule_work;

/* Room in w for an NFA of n_s states and n_e edges.  0 or QERR_NOMEM. */
static int work_fit(rule_work *w, int n_s, int n_e)
{
    if (n_s > w->cap_s) {
        int32_t *set = q_reallocn(w->set, (size_t)n_s, sizeof *set);
        if (set) w->set = set;
        int32_t *stack = set ? q_reallocn(w->stack, (size_t)n_s, sizeof *stack) : NULL;
        if (stack) w->stack = stack;
        uint32_t *mark = stack ? q_reallocn(w->mark, (size_t)n_s, sizeof *mark) : NULL;
        if (!mark) return QERR_NOMEM;
        memset(mark + w->cap_s, 0, sizeof *mark * (size_t)(n_s - w->cap_s));
        w->mark = mark, w->cap_s = n_s;
    }
    if (n_e + 1 > w->cap_e) {
        int32_t *c = q_reallocn(w->callees, (size_t)n_e + 1, sizeof *c);
        if (c) w->callees = c;
        gcall *k = c ? q_reallocn(w->calls, (size_t)n_e + 1, sizeof *k) : NULL;
        if (!k) return QERR_NOMEM;
        w->calls = k, w->cap_e = n_e + 1;
    }
    return 0;
}

static void work_free(rule_work *w)
{
    gram_sets_free(&w->m);
    gram_moves_free(&w->mv);
    gram_closures_free(&w->cl);
    free(w->set);
    free(w->stack);
    free(w->mark);
    free(w->callees);
    free(w->calls);
    free(w->gid);
}

/* Compiles rule r's NFA (start in, accepting fin) into g's states; the rule's
 * start state to g->start[r]. */
static int compile_rule(gram *g, const nfa *a, int in, int fin, int r, rule_work *w)
{
    if (work_fit(w, a->n_s, a->n_e)) return QERR_NOMEM;
    gram_sets_clear(&w->m);
    gram_closures_clear(&w->cl);
    /* Byte classes of this rule. */
    uint8_t cut[257] = { 0 };
    cut[0] = 1;
    for (int i = 0; i < a->n_e; i++)
        if (a->e[i].sym == GRAM_BYTES) cut[a->e[i].lo] = 1, cut[a->e[i].hi + 1] = 1;
    int nc = 0;
    uint8_t lo_of[256], hi_of[256], cls[256];
    for (int c = 0; c < 256; c++) {
        if (cut[c]) {
            if (nc) hi_of[nc - 1] = (uint8_t)(c - 1);
            lo_of[nc++] = (uint8_t)c;
        }
        cls[c] = (uint8_t)(nc - 1);
    }
    hi_of[nc - 1] = 255;
    /* The rules this one calls. */
    int32_t *callees = w->callees;
    int n_callees = 0;
    for (int i = 0; i < a->n_e; i++)
        if (a->e[i].sym >= 0) callees[n_callees++] = a->e[i].sym;
    if (n_callees > 1) qsort(callees, (size_t)n_callees, sizeof *callees, gram_cmp_i32);
    int k = 0;
    for (int i = 0; i < n_callees; i++)
        if (!k || callees[k - 1] != callees[i]) callees[k++] = callees[i];
    n_callees = k;

    gram_sets *m = &w->m;
    int32_t *set = w->set, *stack = w->stack;
    uint32_t *mark = w->mark;
    int rc = 0;
    {
        set[0] = in;
        const int n = gram_nfa_closure(a, set, 1, mark, ++w->stamp, stack);
        if (gram_sets_get(m, set, n, mark, w->stamp) < 0) rc = QERR_NOMEM;
    }
    /* Byte edges and calls of a state are gathered here, then appended. */
    gbyte *bytes = w->bytes;
    gcall *calls = w->calls;
    for (int d = 0; !rc && d < m->n; d++) {
        if (!(d & 15) && gram_late()) {
            rc = QERR_LIMIT;
            break;
        }
        if (w->stamp > 0xf0000000u) { /* marks afresh before the stamps could wrap (none is kept across states) */
            memset(w->mark, 0, sizeof *w->mark * (size_t)w->cap_s);
            w->stamp = 0;
        }
        if (d >= w->cap_gid) {
            int cap = w->cap_gid ? w->cap_gid * 2 : 64;
            int32_t *ng = q_reallocn(w->gid, (size_t)cap, sizeof *ng);
            if (!ng) {
                rc = QERR_NOMEM;
                break;
            }
            w->gid = ng, w->cap_gid = cap;
        }
        /* The global ids of subsets are assigned in order: d -> base + d. */
        const int s = g_push_state(g);
        if (s < 0) {
            rc = s;
            break;
        }
        w->gid[d] = s;
        const int len = m->len[d];
        int accept = 0, nb = 0, ncall = 0;
        for (int i = 0; i < len; i++) accept |= m->items[m->off[d] + i] == fin;
        /* Byte classes are columns 0..nc-1, callees[c] column nc + c. */
        if (gram_nfa_moves(a, m->items + m->off[d], len, cls, nc, callees, n_callees, &w->mv)) {
            rc = QERR_NOMEM;
            break;
        }
        for (int c = 0; c < nc && !rc; c++) {
            const int n = gram_moves_set(&w->mv, c, set, mark, ++w->stamp);
            if (!n) continue;
            const int id = gram_closure_id(a, &w->cl, m, set, n, mark, &w->stamp, stack);
            if (id < 0) rc = QERR_NOMEM;
            /* Subset id: its global state is base + id (assigned in order). */
            else bytes[nb++] = (gbyte){ g->start[r] + id, lo_of[c], hi_of[c] };
        }
        for (int c = 0; c < n_callees && !rc; c++) {
            const int n = gram_moves_set(&w->mv, nc + c, set, mark, ++w->stamp);
            if (!n) continue;
            const int id = gram_closure_id(a, &w->cl, m, set, n, mark, &w->stamp, stack);
            if (id < 0) rc = QERR_NOMEM;
            else calls[ncall++] = (gcall){ callees[c], g->start[r] + id };
        }
        if (rc) break;
        /* Adjacent ranges with one target merge. */
        int wr = 0;
        for (int i = 0; i < nb; i++) {
            if (wr && bytes[wr - 1].to == bytes[i].to && bytes[wr - 1].hi + 1 == bytes[i].lo) bytes[wr - 1].hi = bytes[i].hi;
            else bytes[wr++] = bytes[i];
        }
        nb = wr;
        gstate *st = &g->st[s];
        st->accept = (uint8_t)accept;
        st->perm = g->perm_of[r];
        st->byte_off = g->n_be, st->n_byte = nb;
        st->call_off = g->n_ce, st->n_call = ncall;
        for (int i = 0; i < nb && !rc; i++) {
            if (gram_grow((void **)&g->be, g->n_be, &g->cap_be, sizeof *g->be)) rc = QERR_NOMEM;
            else g->be[g->n_be++] = bytes[i];
        }
        for (int i = 0; i < ncall && !rc; i++) {
            if (gram_grow((void **)&g->ce, g->n_ce, &g->cap_ce, sizeof *g->ce)) rc = QERR_NOMEM;
            else g->ce[g->n_ce++] = calls[i];
        }
    }
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
    if (l->oom || gram_grow((void **)&l->e, l->n, &l->cap, sizeof *l->e)) {
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

/* The builder's sets of members into g, with each rule's perm and tag. */
static int copy_perms(gram *g, const gram_b *b)
{
    g->perm_of = q_mallocn((size_t)b->n_rules, sizeof *g->perm_of);
    g->tag = q_mallocn((size_t)b->n_rules, sizeof *g->tag);
    g->perms = q_callocn((size_t)b->n_perms + 1, sizeof *g->perms);
    if (!g->perm_of || !g->tag || !g->perms) return QERR_NOMEM;
    for (int r = 0; r < b->n_rules; r++) g->perm_of[r] = -1, g->tag[r] = -1;
    for (int k = 0; k < b->n_perms; k++) {
        const struct bperm *bp = &b->perms[k];
        gperm *p = &g->perms[g->n_perms++];
        *p = (gperm){ .n = bp->n, .nw = (bp->n + 32) / 32, .ndeps = bp->ndeps, .has_extra = bp->has_extra,
                      .min = bp->min, .max = bp->max };
        p->req = q_callocn((size_t)p->nw, sizeof *p->req);
        p->deps = q_mallocn((size_t)bp->ndeps + 1, sizeof *p->deps);
        if (!p->req || !p->deps) return QERR_NOMEM;
        for (int i = 0; i < bp->n; i++)
            if (bp->required[i]) p->req[i / 32] |= 1u << (i % 32);
        if (bp->ndeps) memcpy(p->deps, bp->deps, sizeof *p->deps * (size_t)bp->ndeps);
        g->perm_of[bp->rule] = k;
        for (int i = 0; i < bp->n + bp->has_extra; i++) g->tag[bp->first + i] = i;
    }
    return 0;
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
    int rc = copy_perms(g, b) ? qerr_set(err, errlen, QERR_NOMEM, "out of memory") : 0;
    nfa a = { 0 };
    rule_work w = { 0 };
    for (int r = 0; r < b->n_rules && !rc; r++) {
        gram_nfa_clear(&a);
        a.max_s = MAX_NFA;
        int in, fin;
        n_expr(&a, b, b->body[r], &in, &fin, 0);
        a.fin1 = fin + 1;
        g->start[r] = g->n_st; /* the rule's states follow, its start first */
        rc = a.rc ? a.rc : compile_rule(g, &a, in, fin, r, &w);
        if (rc == QERR_LIMIT && gram_late())
            qerr_set(err, errlen, rc, "grammar: compiling took longer than the time budget (%g s)", gram_limits_now()->seconds);
        else if (rc)
            qerr_set(err, errlen, rc, rc == QERR_LIMIT ? "rule '%s': too many states" : "rule '%s': out of memory",
                     b->names[r]);
    }
    gram_nfa_free(&a);
    work_free(&w);
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
