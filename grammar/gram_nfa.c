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

static uint64_t hash_set(const int32_t *s, int n)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 1099511628211ULL;
    return h;
}

int gram_sets_get(gram_sets *m, const int32_t *s, int n)
{
    if ((size_t)(m->n + 1) * 2 > m->tcap) {
        size_t cap = m->tcap ? m->tcap * 2 : 256;
        int32_t *t = calloc(cap, sizeof *t);
        if (!t) return -1;
        for (int i = 0; i < m->n; i++) {
            size_t j = hash_set(m->items + m->off[i], m->len[i]) & (cap - 1);
            while (t[j]) j = (j + 1) & (cap - 1);
            t[j] = i + 1;
        }
        free(m->tab);
        m->tab = t, m->tcap = cap;
    }
    size_t j = hash_set(s, n) & (m->tcap - 1);
    while (m->tab[j]) {
        const int id = m->tab[j] - 1;
        if (m->len[id] == n && !memcmp(m->items + m->off[id], s, sizeof *s * (size_t)n)) return id;
        j = (j + 1) & (m->tcap - 1);
    }
    if (m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 64;
        int32_t *o = q_reallocn(m->off, (size_t)cap, sizeof *o);
        if (o) m->off = o;
        int32_t *l = o ? q_reallocn(m->len, (size_t)cap, sizeof *l) : NULL;
        if (!l) return -1;
        m->len = l, m->cap = cap;
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
    m->n_items += (size_t)n;
    m->tab[j] = m->n + 1;
    return m->n++;
}

void gram_sets_free(gram_sets *m)
{
    free(m->items);
    free(m->off);
    free(m->len);
    free(m->tab);
    memset(m, 0, sizeof *m);
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
        if (!h) {
            a->rc = QERR_NOMEM;
            return -1;
        }
        a->head = h, a->cap_s = cap;
    }
    a->head[a->n_s] = -1;
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
    a->next[a->n_e] = a->head[from];
    a->head[from] = a->n_e++;
}

int gram_nfa_closure(const gram_nfa *a, int32_t *set, int n, uint32_t *mark, uint32_t stamp, int32_t *stack)
{
    int sp = 0, out = 0;
    for (int i = 0; i < n; i++)
        if (mark[set[i]] != stamp) mark[set[i]] = stamp, stack[sp++] = set[i];
    while (sp) {
        const int32_t s = stack[--sp];
        set[out++] = s;
        for (int32_t e = a->head[s]; e >= 0; e = a->next[e])
            if (a->e[e].sym == GRAM_EPS && mark[a->e[e].to] != stamp) mark[a->e[e].to] = stamp, stack[sp++] = a->e[e].to;
    }
    qsort(set, (size_t)out, sizeof *set, gram_cmp_i32);
    return out;
}

void gram_nfa_free(gram_nfa *a)
{
    free(a->e);
    free(a->next);
    free(a->head);
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
