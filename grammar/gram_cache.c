/* gram_cache.c - compiled grammars by key, least recently used out
 * (gram.h).  A small array searched in order: the capacity is tens. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"
#include "util.h"

struct gram_cache {
    pthread_mutex_t mu;
    int cap, n;
    uint64_t tick;
    struct entry {
        char *key;
        size_t len;
        gram *g;
        uint64_t used;
    } *e;
};

gram_cache *gram_cache_new(int cap)
{
    gram_cache *c = calloc(1, sizeof *c);
    if (!c || cap < 1 || !(c->e = q_callocn((size_t)cap, sizeof *c->e))) {
        free(c);
        return NULL;
    }
    c->cap = cap;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void gram_cache_free(gram_cache *c)
{
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        free(c->e[i].key);
        gram_free(c->e[i].g);
    }
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

gram *gram_cache_get(gram_cache *c, const char *key, size_t len)
{
    gram *g = NULL;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n && !g; i++)
        if (c->e[i].len == len && !memcmp(c->e[i].key, key, len)) {
            c->e[i].used = ++c->tick;
            g = gram_retain(c->e[i].g);
        }
    pthread_mutex_unlock(&c->mu);
    return g;
}

void gram_cache_put(gram_cache *c, const char *key, size_t len, gram *g)
{
    char *k = malloc(len + 1);
    if (!k) return;
    memcpy(k, key, len);
    k[len] = 0;
    pthread_mutex_lock(&c->mu);
    int slot = c->n < c->cap ? c->n++ : 0;
    if (slot == 0 && c->n == c->cap) /* full: the least recently used goes */
        for (int i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[slot].used) slot = i;
    if (slot < c->n && c->e[slot].key) {
        free(c->e[slot].key);
        gram_free(c->e[slot].g);
    }
    c->e[slot] = (struct entry){ k, len, gram_retain(g), ++c->tick };
    pthread_mutex_unlock(&c->mu);
}
