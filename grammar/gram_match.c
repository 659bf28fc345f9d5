/* gram_match.c - matchers and token masks over a compiled grammar (gram.h,
 * gram_int.h).
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"
#include "gram_int.h"
#include "gram_nfa.h"
#include "qerr.h"
#include "util.h"

#define MAX_CLOSURE 100000   /* nodes one closure may visit */

/* ---- the matcher ------------------------------------------------------------------------ */

typedef struct {
    int32_t state, parent;
    int32_t set; /* a perm rule's node: the members given (sets[set - 1]), or SET_UNKNOWN; 0 otherwise */
    int32_t add; /* a perm rule's return point: the member that returns to it (its set is set + add), -1 */
} mnode;

/* The parent of a node whose stack below is not known (token classes). */
#define UNKNOWN (-2)
/* The set of a perm rule's node whose members given are not known (token
 * classes). */
#define SET_UNKNOWN (-1)

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
    /* sets of members given (perm rules), hash-consed: perm, extras given,
     * the set's words at sw + off */
    struct mset {
        int32_t perm, e;
        size_t off;
        uint64_t hash;
    } *sets;
    int n_sets, cap_sets;
    uint32_t *sw;
    size_t sw_n, sw_cap;
    int32_t *stab; /* set id, 0 empty */
    size_t stcap;
    uint32_t *scratch; /* 2 sets' words */
    int cap_scratch;
};

static uint64_t node_hash(int32_t s, int32_t p, int32_t set, int32_t add)
{
    return ((uint64_t)(uint32_t)s * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)(uint32_t)p * 0xc2b2ae3d27d4eb4fULL) ^
           ((uint64_t)(uint32_t)set * 0x165667b19e3779f9ULL) ^ ((uint64_t)(uint32_t)add * 0x27d4eb2f165667c5ULL);
}

/* The node (state, parent, set, add), made when new; -1 when out of memory. */
static int32_t intern(gram_m *m, int32_t s, int32_t p, int32_t set, int32_t add)
{
    if ((size_t)(m->n_nodes + 1) * 2 > m->tcap) {
        size_t cap = m->tcap ? m->tcap * 2 : 1024;
        int32_t *t = calloc(cap, sizeof *t);
        if (!t) return -1;
        for (int i = 0; i < m->n_nodes; i++) {
            const mnode *o = &m->nodes[i];
            size_t j = node_hash(o->state, o->parent, o->set, o->add) & (cap - 1);
            while (t[j]) j = (j + 1) & (cap - 1);
            t[j] = i + 1;
        }
        free(m->tab);
        m->tab = t, m->tcap = cap;
    }
    size_t j = node_hash(s, p, set, add) & (m->tcap - 1);
    while (m->tab[j]) {
        const int32_t n = m->tab[j] - 1;
        const mnode *o = &m->nodes[n];
        if (o->state == s && o->parent == p && o->set == set && o->add == add) return n;
        j = (j + 1) & (m->tcap - 1);
    }
    if (gram_grow((void **)&m->nodes, m->n_nodes, &m->cap_nodes, sizeof *m->nodes)) return -1;
    m->nodes[m->n_nodes] = (mnode){ s, p, set, add };
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

/* ---- sets of members given (perm rules) ------------------------------------------------ */

static int has_bit(const uint32_t *s, int i) { return (int)(s[i / 32] >> (i % 32) & 1u); }

int gram_perm_may_end(const gperm *p, const uint32_t *s, int e)
{
    int cnt = 0;
    for (int w = 0; w < p->nw; w++) {
        if (p->req[w] & ~s[w]) return 0;
        cnt += __builtin_popcount(s[w]);
    }
    for (int d = 0; d < p->ndeps; d++)
        if (has_bit(s, p->deps[d][0]) && !has_bit(s, p->deps[d][1])) return 0;
    return cnt + (e > 0) >= p->min && (p->max < 0 || cnt + e <= p->max);
}

/* Whether members s, member i added (-1: none), and e extras can still
 * end: enough members are left for min, and (with max) the required ones
 * and what dependencies pull in fit under it (without counting how
 * dependencies could make min and max pull against each other).  t: room
 * for a set, written only when max must be counted against. */
static int perm_live(const gperm *p, const uint32_t *s, int i, int e, uint32_t *t)
{
    if (p->n + (e > 0 || p->has_extra) < p->min) return 0;
    if (p->max < 0) return 1;
    for (int w = 0; w < p->nw; w++) t[w] = s[w] | p->req[w];
    if (i >= 0) t[i / 32] |= 1u << (i % 32);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int d = 0; d < p->ndeps; d++)
            if (has_bit(t, p->deps[d][0]) && !has_bit(t, p->deps[d][1]))
                t[p->deps[d][1] / 32] |= 1u << (p->deps[d][1] % 32), changed = 1;
    }
    int cnt = e;
    for (int w = 0; w < p->nw; w++) cnt += __builtin_popcount(t[w]);
    return cnt <= p->max;
}

int gram_perm_may_add(const gperm *p, const uint32_t *s, int e, int i, uint32_t *scratch)
{
    if (i < p->n) return !has_bit(s, i) && perm_live(p, s, i, e, scratch);
    return p->has_extra && perm_live(p, s, -1, e + 1, scratch);
}

static uint64_t set_hash(int32_t perm, int32_t e, const uint32_t *w, int nw)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)(uint32_t)perm << 32 | (uint32_t)e);
    for (int i = 0; i < nw; i++) h = (h ^ w[i]) * 0x100000001b3ULL;
    return h;
}

/* The id (>= 1) of the set w (perm's words) with e extras, made when new;
 * -1 when out of memory. */
static int32_t set_intern(gram_m *m, int32_t perm, int32_t e, const uint32_t *w)
{
    const int nw = m->g->perms[perm].nw;
    if ((size_t)(m->n_sets + 1) * 2 > m->stcap) {
        size_t cap = m->stcap ? m->stcap * 2 : 256;
        int32_t *t = calloc(cap, sizeof *t);
        if (!t) return -1;
        for (int i = 0; i < m->n_sets; i++) {
            size_t j = m->sets[i].hash & (cap - 1);
            while (t[j]) j = (j + 1) & (cap - 1);
            t[j] = i + 1;
        }
        free(m->stab);
        m->stab = t, m->stcap = cap;
    }
    const uint64_t h = set_hash(perm, e, w, nw);
    size_t j = h & (m->stcap - 1);
    while (m->stab[j]) {
        const struct mset *o = &m->sets[m->stab[j] - 1];
        if (o->hash == h && o->perm == perm && o->e == e && !memcmp(m->sw + o->off, w, sizeof *w * (size_t)nw))
            return m->stab[j];
        j = (j + 1) & (m->stcap - 1);
    }
    if (gram_grow((void **)&m->sets, m->n_sets, &m->cap_sets, sizeof *m->sets)) return -1;
    if (m->sw_n + (size_t)nw > m->sw_cap) {
        size_t cap = m->sw_cap ? m->sw_cap * 2 : 256;
        while (cap < m->sw_n + (size_t)nw) cap *= 2;
        uint32_t *sw = q_reallocn(m->sw, cap, sizeof *sw);
        if (!sw) return -1;
        m->sw = sw, m->sw_cap = cap;
    }
    memcpy(m->sw + m->sw_n, w, sizeof *w * (size_t)nw);
    m->sets[m->n_sets] = (struct mset){ perm, e, m->sw_n, h };
    m->sw_n += (size_t)nw;
    m->stab[j] = ++m->n_sets;
    return m->n_sets;
}

/* The empty set of perm's members. */
static int32_t set_empty(gram_m *m, int32_t perm)
{
    const int nw = m->g->perms[perm].nw;
    if (ensure((void **)&m->scratch, &m->cap_scratch, 2 * nw, sizeof *m->scratch)) return -1;
    memset(m->scratch + nw, 0, sizeof *m->scratch * (size_t)nw);
    return set_intern(m, perm, 0, m->scratch + nw);
}

/* Set id with member i added (i == n: an extra one). */
static int32_t set_with(gram_m *m, int32_t perm, int32_t id, int i)
{
    const gperm *p = &m->g->perms[perm];
    if (ensure((void **)&m->scratch, &m->cap_scratch, 2 * p->nw, sizeof *m->scratch)) return -1;
    const struct mset *o = &m->sets[id - 1];
    uint32_t *w = m->scratch + p->nw;
    memcpy(w, m->sw + o->off, sizeof *w * (size_t)p->nw);
    int e = o->e;
    if (i < p->n) w[i / 32] |= 1u << (i % 32);
    else e = p->max >= 0 ? e + 1 : 1;
    return set_intern(m, perm, e, w);
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
        const gperm *pm = st->perm >= 0 ? &g->perms[st->perm] : NULL;
        if (nd.add >= 0) { /* member add returned here: the set with it */
            const int32_t set = set_with(m, st->perm, nd.set, nd.add);
            const int32_t n2 = set < 0 ? -1 : intern(m, nd.state, nd.parent, set, -1);
            if (n2 < 0 || ensure((void **)&m->stk, &m->cap_stk, sp + 1, sizeof *m->stk)) return QERR_NOMEM;
            m->stk[sp++] = n2;
            continue;
        }
        if (st->n_byte) {
            if (ensure((void **)&m->nfront, &m->cap_nfront, nf + 1, sizeof *m->nfront)) return QERR_NOMEM;
            m->nfront[nf++] = n;
        }
        if (ensure((void **)&m->stk, &m->cap_stk, sp + st->n_call + 1, sizeof *m->stk)) return QERR_NOMEM;
        for (int i = 0; i < st->n_call; i++) {
            const gcall c = g->ce[st->call_off + i];
            int32_t ret;
            if (pm) { /* a member: if the set allows it */
                if (nd.set == SET_UNKNOWN) {
                    m->unknown = 1;
                    continue;
                }
                const int tag = g->tag[c.rule];
                const struct mset *ms = &m->sets[nd.set - 1];
                if (ensure((void **)&m->scratch, &m->cap_scratch, 2 * pm->nw, sizeof *m->scratch)) return QERR_NOMEM;
                if (!gram_perm_may_add(pm, m->sw + ms->off, ms->e, tag, m->scratch)) continue;
                ret = intern(m, c.to, nd.parent, nd.set, tag);
            } else {
                ret = intern(m, c.to, nd.parent, 0, -1);
            }
            const int cp = g->perm_of[c.rule];
            const int32_t cset = cp < 0 ? 0 : set_empty(m, cp);
            const int32_t child = ret < 0 || cset < 0 ? -1 : intern(m, g->start[c.rule], ret, cset, -1);
            if (child < 0) return QERR_NOMEM;
            m->stk[sp++] = child;
        }
        if (st->accept && pm && nd.set != SET_UNKNOWN) {
            const struct mset *ms = &m->sets[nd.set - 1];
            if (!gram_perm_may_end(pm, m->sw + ms->off, ms->e)) continue;
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
        const mnode *o = &m->nodes[f[i]];
        const int32_t nn = intern(m, t, o->parent, o->set, -1);
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
    const int rp = g->perm_of[g->root];
    const int32_t rset = rp < 0 ? 0 : set_empty(m, rp);
    const int32_t root = rset < 0 ? -1 : intern(m, g->start[g->root], -1, rset, -1);
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
    free(m->sets);
    free(m->sw);
    free(m->stab);
    free(m->scratch);
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
            const int32_t node = intern(m, s, UNKNOWN, m->g->st[s].perm >= 0 ? SET_UNKNOWN : 0, -1);
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
