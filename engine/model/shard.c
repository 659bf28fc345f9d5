/* shard.c - tensor parallelism's split of a model (shard.h). */
#define _GNU_SOURCE
#include "shard.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qerr.h"

/* Rows [r0, r0 + nr) of t (a matrix or a vector) copied to dst: the view. */
static qtensor take_rows(const qtensor *t, int64_t r0, int64_t nr, unsigned char **dst)
{
    qtensor v = *t;
    v.shape[0] = nr;
    if (!t->data) return v;
    const size_t row = (size_t)(t->ndim > 1 ? t->shape[1] : 1) * qdt_size(t->dtype);
    memcpy(*dst, (const unsigned char *)t->data + (size_t)r0 * row, (size_t)nr * row);
    v.data = *dst;
    *dst += (size_t)nr * row;
    return v;
}

/* Columns [c0, c0 + nc) of matrix t copied to dst: the view. */
static qtensor take_cols(const qtensor *t, int64_t c0, int64_t nc, unsigned char **dst)
{
    qtensor v = *t;
    v.shape[1] = nc;
    if (!t->data) return v;
    const size_t es = qdt_size(t->dtype), rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
    for (size_t i = 0; i < rows; i++)
        memcpy(*dst + i * (size_t)nc * es, (const unsigned char *)t->data + (i * cols + (size_t)c0) * es,
               (size_t)nc * es);
    v.data = *dst;
    *dst += rows * (size_t)nc * es;
    return v;
}

static size_t bytes_of(const qtensor *t) { return t->data ? (size_t)qt_numel(t) * qdt_size(t->dtype) : 0; }

int qshard_make(const qweights *w, int rank, int n, qshard *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const qhparams *hp = &w->hp;
    if (n < 1 || rank < 0 || rank >= n) {
        snprintf(err, errlen, "shard %d of %d: no such shard", rank, n);
        return QERR_INVAL;
    }
    if (hp->n_heads % n || hp->n_kv_heads % n || hp->ffn_dim % n) {
        snprintf(err, errlen,
                 "%d shards: the model's %d attention heads, %d KV heads and MLP width %d must each divide by %d",
                 n, hp->n_heads, hp->n_kv_heads, hp->ffn_dim, n);
        return QERR_INVAL;
    }
    /* Every sliced tensor is 1/n of the model's. */
    size_t total = 0;
    for (int l = 0; l < hp->n_layers; l++) {
        const qlayer *L = &w->layers[l];
        const qtensor *ts[] = { &L->wq, &L->wk, &L->wv, &L->bq, &L->bk, &L->bv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) total += bytes_of(ts[i]) / (size_t)n;
    }
    out->layers = calloc((size_t)hp->n_layers, sizeof *out->layers);
    out->mem = malloc(total ? total : 1);
    if (!out->layers || !out->mem) {
        qshard_free(out);
        snprintf(err, errlen, "shard: out of memory (%zu bytes)", total);
        return QERR_NOMEM;
    }
    out->w = *w;
    out->w.layers = out->layers;
    out->w.hp.n_heads = hp->n_heads / n;
    out->w.hp.n_kv_heads = hp->n_kv_heads / n;
    out->w.hp.ffn_dim = hp->ffn_dim / n;
    out->rank = rank, out->n = n;
    const int64_t hd = hp->head_dim, q0 = (int64_t)rank * out->w.hp.n_heads * hd, nq = (int64_t)out->w.hp.n_heads * hd;
    const int64_t k0 = (int64_t)rank * out->w.hp.n_kv_heads * hd, nk = (int64_t)out->w.hp.n_kv_heads * hd;
    const int64_t f0 = (int64_t)rank * out->w.hp.ffn_dim, nf = out->w.hp.ffn_dim;
    unsigned char *p = out->mem;
    for (int l = 0; l < hp->n_layers; l++) {
        const qlayer *L = &w->layers[l];
        qlayer *S = &out->layers[l];
        *S = *L; /* the norms are the model's */
        S->wq = take_rows(&L->wq, q0, nq, &p);
        S->wk = take_rows(&L->wk, k0, nk, &p);
        S->wv = take_rows(&L->wv, k0, nk, &p);
        S->bq = take_rows(&L->bq, q0, nq, &p);
        S->bk = take_rows(&L->bk, k0, nk, &p);
        S->bv = take_rows(&L->bv, k0, nk, &p);
        S->wo = take_cols(&L->wo, q0, nq, &p);
        S->w_gate = take_rows(&L->w_gate, f0, nf, &p);
        S->w_up = take_rows(&L->w_up, f0, nf, &p);
        S->w_down = take_cols(&L->w_down, f0, nf, &p);
    }
    return 0;
}

void qshard_free(qshard *s)
{
    if (!s) return;
    free(s->layers);
    free(s->mem);
    memset(s, 0, sizeof *s);
}

/* ---- the all-reduce among threads ------------------------------------------------------ */

struct qtp_group {
    int n;
    size_t cap;    /* floats each member sums at a time */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiting;   /* members at the barrier */
    unsigned gen;  /* barriers passed */
    int aborted;
    float **bufs;  /* each member's buffer, while an all-reduce runs */
    float *sums;   /* n rooms of cap floats */
};

qtp_group *qtp_group_new(int n, size_t cap)
{
    if (n < 1 || cap < 1) return NULL;
    qtp_group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->n = n, g->cap = cap;
    g->bufs = calloc((size_t)n, sizeof *g->bufs);
    g->sums = malloc((size_t)n * cap * sizeof *g->sums);
    if (!g->bufs || !g->sums) {
        free(g->bufs), free(g->sums), free(g);
        return NULL;
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    return g;
}

void qtp_group_free(qtp_group *g)
{
    if (!g) return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->bufs), free(g->sums), free(g);
}

void qtp_group_abort(void *group)
{
    qtp_group *g = group;
    pthread_mutex_lock(&g->mu);
    g->aborted = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Waits until every member is here: 0, or QERR_DEVICE once aborted. */
static int barrier(qtp_group *g)
{
    pthread_mutex_lock(&g->mu);
    if (g->aborted) { /* never counted: a later call cannot pass with stale buffers */
        pthread_mutex_unlock(&g->mu);
        return QERR_DEVICE;
    }
    const unsigned gen = g->gen;
    if (++g->waiting == g->n) {
        g->waiting = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    }
    while (g->gen == gen && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
    const int rc = g->gen == gen ? QERR_DEVICE : 0;
    pthread_mutex_unlock(&g->mu);
    return rc;
}

int qtp_allreduce(void *member, float *buf, size_t n, void *stream, void *copy, int copy_dt)
{
    (void)stream, (void)copy_dt;
    if (copy) return QERR_UNSUPPORTED; /* the CPU backend keeps no copy */
    qtp_member *m = member;
    qtp_group *g = m->g;
    float *s = g->sums + (size_t)m->rank * g->cap;
    for (size_t off = 0; off < n; off += g->cap) { /* a piece of cap floats at a time: no allocation */
        const size_t len = n - off < g->cap ? n - off : g->cap;
        g->bufs[m->rank] = buf + off;
        if (barrier(g)) return QERR_DEVICE; /* every partial sum is ready */
        memcpy(s, g->bufs[0], len * sizeof *s);
        for (int k = 1; k < g->n; k++) {
            const float *b = g->bufs[k];
            for (size_t i = 0; i < len; i++) s[i] += b[i];
        }
        if (barrier(g)) return QERR_DEVICE; /* nobody reads the buffers any more */
        memcpy(buf + off, s, len * sizeof *s);
    }
    return 0;
}
