/* tier.c - the engine's side of the persistent prefix tier (tier.h). */
#include "tier.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "qerr.h"
#include "util.h"

/* Blocks a write job holds at most. */
#define PUT_CHUNK 16

struct qtier {
    qstore *store;
    qbackend *be;
    kv_pool *pool;
    int bs;
    size_t bb;                  /* bytes of a block */
    uint8_t fp[16];
    /* The hash under which each pool block was persisted (or loaded), so
     * that a block is written once while it keeps that hash. */
    uint8_t (*mark)[16];
    uint8_t *marked;
    int num_blocks;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    qstore_job *done_head, *done_tail;  /* finished lookups, under mu */
    int pending;                        /* lookups in flight, under mu */
    uint64_t attempts;                  /* lookups weighed (qtier_should_load) */
    qtier_stats st;
};

int qtier_create(qstore *store, const qmodel *m, qbackend *be, kv_pool *pool, qtier **out)
{
    *out = NULL;
    qtier *t = calloc(1, sizeof *t);
    if (!t) return QERR_NOMEM;
    t->store = store, t->be = be, t->pool = pool;
    t->bs = kv_pool_block_size(pool);
    t->bb = be->ops->block_bytes(be);
    t->num_blocks = kv_pool_num_blocks(pool);
    t->mark = q_mallocn((size_t)t->num_blocks, sizeof *t->mark);
    t->marked = calloc((size_t)t->num_blocks, 1);
    if (!t->mark || !t->marked) {
        free(t->mark);
        free(t->marked);
        free(t);
        return QERR_NOMEM;
    }
    /* The tier fingerprint: what makes two blocks' bytes interchangeable. */
    qhash h;
    qhash_init(&h, 0x7469657266705f31ULL);
    qhash_update(&h, m->fingerprint, 16);
    qhash_update(&h, be->ops->name, strlen(be->ops->name));
    qhash_u64(&h, (uint64_t)be->opts.exact);
    qhash_u64(&h, (uint64_t)t->bs);
    qhash_u64(&h, (uint64_t)t->bb);
    qhash_final(&h, t->fp);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    *out = t;
    return 0;
}

void qtier_destroy(qtier *t)
{
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    while (t->pending > 0) pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    while (t->done_head) {
        qstore_job *j = t->done_head;
        t->done_head = j->next;
        qstore_job_free(j);
    }
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t->mark);
    free(t->marked);
    free(t);
}

/* The store thread: a lookup is done. */
static void lookup_done(qstore_job *j)
{
    qtier *t = j->user;
    pthread_mutex_lock(&t->mu);
    j->next = NULL;
    if (t->done_tail) t->done_tail->next = j;
    else t->done_head = j;
    t->done_tail = j;
    t->pending--;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

int qtier_lookup(qtier *t, uint64_t tag, const int32_t *prompt, int n, int first)
{
    /* The blocks match_prefix may reuse: before the one holding the last
     * token, at most the pool's size. */
    int eligible = n > 0 ? (n - 1) / t->bs : 0;
    if (eligible > t->num_blocks) eligible = t->num_blocks;
    if (!prompt || first >= eligible) return 0;
    qstore_job *j = qstore_job_new(QSTORE_BLOCKS);
    uint8_t (*all)[16] = q_mallocn((size_t)eligible, 16);
    if (!j || !all) {
        qstore_job_free(j);
        free(all);
        return 0;
    }
    kv_chain_hashes(t->pool, prompt, eligible, all);
    /* Only when the tier has the first block missing here (its set is in
     * memory): most prompts' chains go on to blocks nobody wrote. */
    if (!qstore_has_block(t->store, t->fp, all[first])) {
        qstore_job_free(j);
        free(all);
        t->st.skipped++;
        return 0;
    }
    memmove(all, all + first, (size_t)(eligible - first) * 16);
    j->hashes = all;
    j->n = eligible - first;
    j->first = first;
    memcpy(j->fp, t->fp, 16);
    j->block_size = t->bs;
    j->block_bytes = t->bb;
    j->tag = tag;
    j->user = t;
    j->done = lookup_done;
    pthread_mutex_lock(&t->mu);
    t->pending++;
    pthread_mutex_unlock(&t->mu);
    if (qstore_submit(t->store, j)) {
        pthread_mutex_lock(&t->mu);
        t->pending--;
        pthread_mutex_unlock(&t->mu);
        qstore_job_free(j);
        return 0;
    }
    t->st.lookups++;
    return 1;
}

int qtier_should_load(double load_rate, double prefill_rate, uint64_t attempt)
{
    if (load_rate <= 0 || prefill_rate <= 0 || load_rate >= prefill_rate) return 1;
    return attempt % 16 == 0;
}

int qtier_lookup_if_faster(qtier *t, uint64_t tag, const int32_t *prompt, int n, int first, double prefill_rate,
                           int always_load)
{
    if (!always_load && !qtier_should_load(t->st.load_rate, prefill_rate, ++t->attempts)) {
        t->st.skipped_slower++;
        return 0;
    }
    return qtier_lookup(t, tag, prompt, n, first);
}

qstore_job *qtier_poll(qtier *t)
{
    pthread_mutex_lock(&t->mu);
    qstore_job *j = t->done_head;
    if (j) {
        t->done_head = j->next;
        if (!t->done_head) t->done_tail = NULL;
        j->next = NULL;
    }
    pthread_mutex_unlock(&t->mu);
    return j;
}

int qtier_import(qtier *t, qstore_job *j, kv_seq *s)
{
    if (!j->rc && j->found > 0) {
        /* How fast the tier brings tokens: from queueing to the answer. */
        const double dt = q_now() - j->t_queued, rate = dt > 0 ? j->found * t->bs / dt : 0;
        if (rate > 0) t->st.load_rate = t->st.load_rate > 0 ? 0.7 * t->st.load_rate + 0.3 * rate : rate;
    }
    if (j->rc || j->found < 1 || s->n_hashed != j->first || s->n_tokens != s->n_hashed * t->bs) {
        qstore_job_free(j);
        return 0;
    }
    int32_t *blocks = q_mallocn((size_t)j->found, sizeof *blocks);
    int n = 0, rc = 0;
    for (; blocks && n < j->found; n++) {
        /* The tokens must hash to what was asked for: a row that holds
         * other tokens under this hash is not used. */
        if (kv_seq_import(t->pool, s, j->tokens + (size_t)n * (size_t)t->bs, j->hashes[n], &blocks[n])) break;
    }
    if (n > 0) rc = qbackend_write_blocks(t->be, blocks, n, j->kv);
    if (!rc)
        for (int i = 0; i < n; i++) {
            memcpy(t->mark[blocks[i]], j->hashes[i], 16);
            t->marked[blocks[i]] = 1;
        }
    free(blocks);
    qstore_job_free(j);
    if (rc) return rc;
    t->st.blocks_loaded += (uint64_t)n;
    t->st.tokens_loaded += (uint64_t)n * (uint64_t)t->bs;
    return n;
}

void qtier_persist(qtier *t, const kv_seq *s)
{
    const int n = s->n_hashed;
    if (n < 1 || s->n_swapped) return;
    uint8_t (*h)[16] = q_mallocn((size_t)n, 16);
    uint8_t (*put_h)[16] = q_mallocn((size_t)n, 16), (*put_p)[16] = q_mallocn((size_t)n, 16);
    uint8_t (*touch)[16] = q_mallocn((size_t)n, 16);
    int32_t *put_b = q_mallocn((size_t)n, sizeof *put_b);
    int32_t *put_t = q_mallocn((size_t)n * (size_t)t->bs, sizeof *put_t);
    int np = 0, nt = 0;
    if (h && put_h && put_p && touch && put_b && put_t) {
        kv_chain_hashes(t->pool, s->tokens, n, h);
        for (int i = 0; i < n; i++) {
            const int32_t b = s->blocks[i];
            kv_block_info bi;
            /* Only the canonical block of a hash (the one registered). */
            if (kv_pool_block_info(t->pool, b, &bi) || !bi.hashed || memcmp(bi.hash, h[i], 16)) continue;
            if (t->marked[b] && !memcmp(t->mark[b], h[i], 16)) {
                memcpy(touch[nt++], h[i], 16);
                continue;
            }
            memcpy(put_h[np], h[i], 16);
            if (i) memcpy(put_p[np], h[i - 1], 16);
            else memset(put_p[np], 0, 16);
            memcpy(put_t + (size_t)np * (size_t)t->bs, s->tokens + (size_t)i * (size_t)t->bs,
                   sizeof *put_t * (size_t)t->bs);
            put_b[np++] = b;
        }
        if (nt) qstore_touch_blocks(t->store, t->fp, nt, (const uint8_t(*)[16])touch);
        /* In jobs of at most PUT_CHUNK blocks: a lookup waits for one
         * transaction at most. */
        for (int i0 = 0; i0 < np; i0 += PUT_CHUNK) {
            const int k = np - i0 < PUT_CHUNK ? np - i0 : PUT_CHUNK;
            void *kv = q_mallocn((size_t)k, t->bb);
            int rc = kv ? qbackend_read_blocks(t->be, put_b + i0, k, kv) : QERR_NOMEM;
            if (rc) free(kv);
            else rc = qstore_put_blocks(t->store, t->fp, k, (const uint8_t(*)[16])(put_h + i0),
                                        (const uint8_t(*)[16])(put_p + i0), put_t + (size_t)i0 * (size_t)t->bs, t->bs,
                                        kv, t->bb);
            if (rc) {
                t->st.blocks_dropped += (uint64_t)k;
                continue;
            }
            t->st.blocks_queued += (uint64_t)k;
            for (int i = i0; i < i0 + k; i++) {
                memcpy(t->mark[put_b[i]], put_h[i], 16);
                t->marked[put_b[i]] = 1;
            }
        }
    }
    free(h);
    free(put_h);
    free(put_p);
    free(touch);
    free(put_b);
    free(put_t);
}

void qtier_wait(qtier *t, double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const long ns = ts.tv_nsec + (long)(seconds * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_mutex_lock(&t->mu);
    while (!t->done_head && t->pending > 0)
        if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT) break;
    pthread_mutex_unlock(&t->mu);
}

int qtier_pending(qtier *t)
{
    pthread_mutex_lock(&t->mu);
    const int n = t->pending + (t->done_head != NULL);
    pthread_mutex_unlock(&t->mu);
    return n;
}

void qtier_stats_get(qtier *t, qtier_stats *out) { *out = t->st; }
