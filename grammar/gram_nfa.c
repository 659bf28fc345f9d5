/* gram_nfa.c - NFAs, closures and interned state sets (gram_nfa.h). */
#include "gram_nfa.h"

#include <stdlib.h>
#include <string.h>

#include "qerr.h"
#include "util.h"

int gram_cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* A set's hash whatever the order of its members: a sum of their mixes. */
static uint64_t hash_set(const int32_t *s, int n)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL * (uint64_t)(n + 1);
    for (int i = 0; i < n; i++) {
        uint64_t x = (uint64_t)(uint32_t)s[i] + 0x9e3779b97f4a7c15ULL;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
        h += x ^ (x >> 31);
    }
    return h;
}

int gram_sets_get(gram_sets *m, const int32_t *s, int n, const uint32_t *mark, uint32_t stamp)
{
    if ((size_t)(m->n + 1) * 2 > m->tcap) {
        size_t cap = m->tcap ? m->tcap * 2 : 256;
        int32_t *t = calloc(cap, sizeof *t);
        if (!t) return -1;
        for (int i = 0; i < m->n; i++) {
            size_t j = m->hash[i] & (cap - 1);
            while (t[j]) j = (j + 1) & (cap - 1);
            t[j] = i + 1;
        }
        free(m->tab);
        m->tab = t, m->tcap = cap;
    }
    const uint64_t h = hash_set(s, n);
    size_t j = h & (m->tcap - 1);
    while (m->tab[j]) {
        const int id = m->tab[j] - 1;
        if (m->hash[id] == h && m->len[id] == n) {
            const int32_t *it = m->items + m->off[id];
            int k = 0;
            while (k < n && mark[it[k]] == stamp) k++;
            if (k == n) return id;
        }
        j = (j + 1) & (m->tcap - 1);
    }
    if (m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 64;
        int32_t *o = q_reallocn(m->off, (size_t)cap, sizeof *o);
        if (o) m->off = o;
        int32_t *l = o ? q_reallocn(m->len, (size_t)cap, sizeof *l) : NULL;
        if (l) m->len = l;
        uint64_t *hs = l ? q_reallocn(m->hash, (size_t)cap, sizeof *hs) : NULL;
        if (!hs) return -1;
        m->hash = hs, m->cap = cap;
    }
    if (m->n_items + (size_t)n > m->cap_items) {
        size_t cap = m->cap_items ? m->cap_items * 2 : 1024;
        while (cap < m->n_items + (size_t)n) cap *= 2;
        int32_t *it = q_reallocn(m->items, cap, sizeof *it);
        if (!it) return -1;
        m->items = it, m->cap_items = cap;
    }
    if (n) memcpy(m->items + m->n_items, s, sizeof *s * (size_t)n);
    m->off[m->n] = (int32_t)m->n_items;
    m->len[m->n] = n;
    m->hash[m->n] = h;
    m->n_items += (size_t)n;
    m->tab[j] = m->n + 1;
    return m->n++;
}

void gram_sets_free(gram_sets *m)
{
    free(m->items);
    free(m->off);
    free(m->len);
    free(m->hash);
    free(m->tab);
    memset(m, 0, sizeof *m);
}

void gram_sets_clear(gram_sets *m)
{
    /* Each set's slot is found from its hash by a probe that passes over
     * empty slots (those emptied here before it), so clearing costs the
     * sets kept, not the table's size. */
    for (int i = 0; i < m->n; i++) {
        size_t j = m->hash[i] & (m->tcap - 1);
        while (m->tab[j] != i + 1) j = (j + 1) & (m->tcap - 1);
        m->tab[j] = 0;
    }
    m->n = 0;
    m->n_items = 0;
}

int gram_nfa_state(gram_nfa *a)
{
    if (a->rc) return -1;
    if (a->n_s >= a->max_s) {
        a->rc = QERR_LIMIT;
        return -1;
    }
    if (a->n_s == a->cap_s) {
        const int cap = a->cap_s ? a->cap_s * 2 : 256;
        int32_t *h = q_reallocn(a->head, (size_t)cap, sizeof *h);
        if (h) a->head = h;
        int32_t *eh = h ? q_reallocn(a->eps_head, (size_t)cap, sizeof *eh) : NULL;
        if (!eh) {
            a->rc = QERR_NOMEM;
            return -1;
        }
        a->eps_head = eh, a->cap_s = cap;
    }
    a->head[a->n_s] = -1;
    a->eps_head[a->n_s] = -1;
    return a->n_s++;
}

void gram_nfa_edge(gram_nfa *a, int from, int to, int sym, int lo, int hi)
{
    if (a->rc || from < 0 || to < 0) return;
    if (a->n_e == a->cap_e) {
        const int cap = a->cap_e ? a->cap_e * 2 : 1024;
        gram_nedge *e = q_reallocn(a->e, (size_t)cap, sizeof *e);
        if (e) a->e = e;
        int32_t *nx = e ? q_reallocn(a->next, (size_t)cap, sizeof *nx) : NULL;
        if (!nx) {
            a->rc = QERR_NOMEM;
            return;
        }
        a->next = nx, a->cap_e = cap;
    }
    a->e[a->n_e] = (gram_nedge){ to, sym, (uint8_t)lo, (uint8_t)hi };
    int32_t *first = sym == GRAM_EPS ? &a->eps_head[from] : &a->head[from];
    a->next[a->n_e] = *first;
    *first = a->n_e++;
}

int gram_nfa_closure(const gram_nfa *a, int32_t *set, int n, uint32_t *mark, uint32_t stamp, int32_t *stack)
{
    int sp = 0, out = 0;
    for (int i = 0; i < n; i++)
        if (mark[set[i]] != stamp) mark[set[i]] = stamp, stack[sp++] = set[i];
    while (sp) {
        const int32_t s = stack[--sp];
        if (!a->fin1 || a->head[s] >= 0 || s == a->fin1 - 1) set[out++] = s;
        for (int32_t e = a->eps_head[s]; e >= 0; e = a->next[e])
            if (mark[a->e[e].to] != stamp) mark[a->e[e].to] = stamp, stack[sp++] = a->e[e].to;
    }
    return out;
}

int gram_closure_id(const gram_nfa *a, gram_closures *c, gram_sets *m, int32_t *s, int n, uint32_t *mark, uint32_t *stamp,
                    int32_t *stack)
{
    if (c->seen.n == c->cap) {
        const int cap = c->cap ? c->cap * 2 : 256;
        int32_t *sub = q_reallocn(c->subset, (size_t)cap, sizeof *sub);
        if (!sub) return -1;
        c->subset = sub, c->cap = cap;
    }
    const int before = c->seen.n, k = gram_sets_get(&c->seen, s, n, mark, *stamp);
    if (k < 0) return -1;
    if (k < before) return c->subset[k];
    n = gram_nfa_closure(a, s, n, mark, ++*stamp, stack);
    return c->subset[k] = gram_sets_get(m, s, n, mark, *stamp);
}

void gram_closures_clear(gram_closures *c) { gram_sets_clear(&c->seen); }

void gram_closures_free(gram_closures *c)
{
    gram_sets_free(&c->seen);
    free(c->subset);
    memset(c, 0, sizeof *c);
}

/* Column k of rule r in callees[0..n) (sorted, r among them). */
static int callee_col(const int32_t *callees, int n, int32_t r)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (callees[mid] < r) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int gram_nfa_moves(const gram_nfa *a, const int32_t *cur, int len, const uint8_t *cls, int nc, const int32_t *callees,
                   int n_callees, gram_moves *mv)
{
    const int cols = nc + n_callees;
    if (cols + 2 > mv->cap_off) {
        int32_t *o = q_reallocn(mv->off, (size_t)cols + 2, sizeof *o);
        if (!o) return QERR_NOMEM;
        mv->off = o, mv->cap_off = cols + 2;
    }
    int32_t *off = mv->off;
    memset(off, 0, sizeof *off * ((size_t)cols + 2));
    /* Counted into off[c + 2] and summed, off[c + 1] is column c's start:
     * filling advances it to the column's end, which is column c + 1's start. */
    size_t total = 0;
    for (int i = 0; i < len; i++)
        for (int32_t e = a->head[cur[i]]; e >= 0; e = a->next[e]) {
            const gram_nedge *x = &a->e[e];
            if (x->sym == GRAM_BYTES) {
                const int c1 = cls[x->hi];
                for (int c = cls[x->lo]; c <= c1; c++) off[c + 2]++;
                total += (size_t)(c1 - cls[x->lo] + 1);
            } else if (x->sym >= 0) {
                off[nc + callee_col(callees, n_callees, x->sym) + 2]++;
                total++;
            }
        }
    if (total > INT32_MAX) return QERR_NOMEM;
    for (int c = 2; c < cols + 2; c++) off[c] += off[c - 1];
    if (total > mv->cap) {
        size_t cap = mv->cap ? mv->cap : 256;
        while (cap < total) cap *= 2;
        int32_t *t = q_reallocn(mv->to, cap, sizeof *t);
        if (!t) return QERR_NOMEM;
        mv->to = t, mv->cap = cap;
    }
    int32_t *to = mv->to;
    for (int i = 0; i < len; i++)
        for (int32_t e = a->head[cur[i]]; e >= 0; e = a->next[e]) {
            const gram_nedge *x = &a->e[e];
            if (x->sym == GRAM_BYTES) {
                const int c1 = cls[x->hi];
                for (int c = cls[x->lo]; c <= c1; c++) to[off[c + 1]++] = x->to;
            } else if (x->sym >= 0) {
                to[off[nc + callee_col(callees, n_callees, x->sym) + 1]++] = x->to;
            }
        }
    return 0;
}

int gram_moves_set(const gram_moves *mv, int k, int32_t *s, uint32_t *mark, uint32_t stamp)
{
    int n = 0;
    if (mv->off[k] == mv->off[k + 1]) return 0; /* (to may be NULL) */
    const int32_t *t = mv->to + mv->off[k], *end = mv->to + mv->off[k + 1];
    for (; t < end; t++) {
        const int32_t x = *t;
        if (mark[x] != stamp) mark[x] = stamp, s[n++] = x;
    }
    return n;
}

void gram_moves_free(gram_moves *mv)
{
    free(mv->to);
    free(mv->off);
    memset(mv, 0, sizeof *mv);
}

int gram_nfa_all_reach(const gram_nfa *a, int fin)
{
    const int n = a->n_s;
    /* The edges reversed, grouped by target (counting sort, as in
     * gram_nfa_moves): t's sources are from[at[t]..at[t + 1]). */
    int32_t *at = q_callocn((size_t)n + 2, sizeof *at), *from = q_mallocn((size_t)a->n_e + 1, sizeof *from);
    int32_t *queue = q_mallocn((size_t)n + 1, sizeof *queue);
    uint8_t *seen = calloc((size_t)n + 1, 1);
    int reached = -1;
    if (at && from && queue && seen) {
        for (int s = 0; s < n; s++) {
            for (int32_t e = a->head[s]; e >= 0; e = a->next[e]) at[a->e[e].to + 2]++;
            for (int32_t e = a->eps_head[s]; e >= 0; e = a->next[e]) at[a->e[e].to + 2]++;
        }
        for (int t = 2; t < n + 2; t++) at[t] += at[t - 1];
        for (int s = 0; s < n; s++) {
            for (int32_t e = a->head[s]; e >= 0; e = a->next[e]) from[at[a->e[e].to + 1]++] = s;
            for (int32_t e = a->eps_head[s]; e >= 0; e = a->next[e]) from[at[a->e[e].to + 1]++] = s;
        }
        int head = 0, tail = 0;
        seen[fin] = 1, queue[tail++] = fin;
        while (head < tail) {
            const int t = queue[head++];
            for (int32_t k = at[t]; k < at[t + 1]; k++)
                if (!seen[from[k]]) seen[from[k]] = 1, queue[tail++] = from[k];
        }
        reached = tail == n;
    }
    free(at);
    free(from);
    free(queue);
    free(seen);
    return reached;
}

void gram_nfa_clear(gram_nfa *a)
{
    a->n_s = a->n_e = 0;
    a->rc = 0;
    a->fin1 = 0;
}

void gram_nfa_free(gram_nfa *a)
{
    free(a->e);
    free(a->next);
    free(a->head);
    free(a->eps_head);
    memset(a, 0, sizeof *a);
}

void gram_nfa_repeat(gram_nfa *a, int in, int out, int min, int max, gram_nfa_part part, void *ctx)
{
    int cur = in, i1, o1;
    for (int k = 0; k < min && !a->rc; k++) {
        part(a, ctx, &i1, &o1);
        GRAM_EPS_EDGE(a, cur, i1);
        cur = o1;
    }
    if (max < 0) {
        part(a, ctx, &i1, &o1);
        GRAM_EPS_EDGE(a, cur, i1);
        GRAM_EPS_EDGE(a, o1, cur);
        GRAM_EPS_EDGE(a, cur, out);
        return;
    }
    GRAM_EPS_EDGE(a, cur, out);
    for (int k = min; k < max && !a->rc; k++) {
        part(a, ctx, &i1, &o1);
        GRAM_EPS_EDGE(a, cur, i1);
        GRAM_EPS_EDGE(a, o1, out);
        cur = o1;
    }
}
