/* gram_sets.c - interned sets of automaton states (gram_sets.h). */
#include "gram_sets.h"

#include <stdlib.h>
#include <string.h>

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
