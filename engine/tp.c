/* tp.c - tensor parallelism: a backend of n shards in step (shard.h).
 *
 * Shard r of the model (qshard_make) runs on a backend of its own: a CUDA
 * backend on device r, the shards' partial sums added by cuda_tp_allreduce
 * (a peer-access kernel of quire's own, or NCCL), or a CPU backend, the
 * sums added among threads (qtp_allreduce).  Rank 0 runs on the caller's thread, every other rank on
 * a thread of its own; each call (a pass, a block copy, blocks to or from
 * the host) is handed to all ranks and returns when all are done.
 *
 * A pass: every rank gets the batch; rank 0's backend gives the logits,
 * row tokens and log-probabilities, and reads the masks; the others'
 * passes stop after the layers (qbackend_opts.tp_rank).
 *
 * Blocks: a block id names the same block in every rank's pool, which holds
 * its rank's KV heads.  A block's bytes are every layer's K, then every
 * layer's V, each the heads of rank 0, then rank 1, ...: the unsplit
 * model's layout (backend.h), so the persistent tier and swap see one
 * backend, and blocks stored by a run on n GPUs load on any other n.
 *
 * A rank that fails a pass while the others wait in an all-reduce for it
 * would leave them waiting forever: the failed rank's thread (the caller's
 * for rank 0) waits up to 2 s for the others to finish, then aborts the
 * group (its sums fail at once); a call during which the group was aborted,
 * or found stopped (cuda_tp_ok), fails, and so does every later one.
 *
 * A test hook: QUIRE_TP_FAIL=r,k (read at creation) makes rank r fail its
 * k-th pass without running it, as a rank that fails before its first sum.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shard.h"
#include "util.h"

#define TP_MAX 16
/* Blocks moved to or from the host at a time (staging memory per rank). */
#define TP_STAGE_BLOCKS 64

typedef struct tp_be tp_be;
typedef int (*rank_fn)(tp_be *t, int rank, void *arg);

typedef struct {
    tp_be *t;
    int rank;
    pthread_t th;
    int started;
    qshard shard;
    qbackend *be;
    qtp_member member;     /* CPU ranks */
    size_t bb;             /* its block bytes */
    void *stage;           /* TP_STAGE_BLOCKS blocks, from its backend's host_alloc */
} tp_rank;

struct tp_be {
    qbackend base;
    qbackend_ops ops;
    const qweights *w;
    qbackend_opts opts;    /* what each rank was asked for */
    int n, cuda;
    tp_rank r[TP_MAX];
    size_t bb;             /* the sum of the ranks' block bytes */
    qtp_group *group;      /* CPU */
#ifdef QUIRE_HAVE_CUDA
    cuda_tp *ctp;          /* CUDA */
#endif
    void (*abort)(void *);
    int (*ok)(void *);     /* the group can still sum (NULL: always) */
    void *abort_ctx;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned job;          /* calls handed out so far */
    rank_fn fn;
    void *arg;
    int pending;           /* ranks 1 .. n-1 still in the call (their watch included) */
    int running;           /* ranks still running its function, rank 0 included */
    int rc[TP_MAX];
    int quit, broken;
    int fail_rank, fail_at; /* QUIRE_TP_FAIL */
    int n_passes[TP_MAX];
};

/* A rank's call failed (t->mu held): wait up to 2 s for the others; if any
 * still runs, it waits for this rank's sums, which will never come: abort
 * the group. */
static void watch_failure(tp_be *t)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 2;
    int w = 0;
    while (t->running > 0 && !t->broken && w != ETIMEDOUT) w = pthread_cond_timedwait(&t->done, &t->mu, &ts);
    if (t->running > 0 && !t->broken && t->abort) {
        QLOGE("tensor parallelism: a rank failed and the others still wait for its sums: aborting the group");
        t->broken = 1;
        pthread_mutex_unlock(&t->mu);
        t->abort(t->abort_ctx);
        pthread_mutex_lock(&t->mu);
    }
}

static void *rank_thread(void *arg)
{
    tp_rank *rk = arg;
    tp_be *t = rk->t;
    unsigned seen = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (t->job == seen && !t->quit) pthread_cond_wait(&t->go, &t->mu);
        if (t->quit) break;
        seen = t->job;
        const rank_fn fn = t->fn;
        void *a = t->arg;
        pthread_mutex_unlock(&t->mu);
        const int rc = fn(t, rk->rank, a);
        pthread_mutex_lock(&t->mu);
        t->rc[rk->rank] = rc;
        t->running--;
        pthread_cond_broadcast(&t->done);
        if (rc) watch_failure(t);
        t->pending--; /* only now: the next call may not start while this one's watch runs */
        pthread_cond_broadcast(&t->done);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* Runs fn on every rank (rank 0 here) and waits for all: 0, or the first
 * rank's error in rank order; QERR_DEVICE when the group was aborted. */
static int run_all(tp_be *t, rank_fn fn, void *arg)
{
    if (t->broken) return QERR_DEVICE;
    pthread_mutex_lock(&t->mu);
    t->fn = fn, t->arg = arg;
    t->pending = t->n - 1, t->running = t->n;
    memset(t->rc, 0, sizeof t->rc);
    t->job++;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    const int rc0 = fn(t, 0, arg);
    pthread_mutex_lock(&t->mu);
    t->rc[0] = rc0;
    t->running--;
    pthread_cond_broadcast(&t->done);
    if (rc0) watch_failure(t);
    while (t->pending > 0) pthread_cond_wait(&t->done, &t->mu);
    int rc = 0;
    for (int r = 0; r < t->n && !rc; r++) rc = t->rc[r];
    if (!t->broken && t->ok && !t->ok(t->abort_ctx)) {
        QLOGE("tensor parallelism: the group's sums stopped (a rank waited too long for another)");
        t->broken = 1;
    }
    if (t->broken && !rc) rc = QERR_DEVICE; /* what the aborted sums left is not the model's */
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* ---- the backend's functions --------------------------------------------------------- */

typedef struct {
    const qbatch *b;
    float *logits;
} fwd_job;

static int rank_forward(tp_be *t, int r, void *arg)
{
    const fwd_job *j = arg;
    qbackend *be = t->r[r].be;
    if (r == t->fail_rank && ++t->n_passes[r] == t->fail_at) return QERR_DEVICE; /* the test hook */
    if (r == 0) return be->ops->forward(be, j->b, j->logits);
    qbatch b = *j->b; /* the layers only: rank 0 gives the rest */
    b.row_mode = NULL, b.row_token = NULL, b.row_sample = NULL, b.row_logprobs = NULL, b.masks = NULL;
    return be->ops->forward(be, &b, NULL);
}

static int tp_forward(qbackend *base, const qbatch *b, float *logits)
{
    fwd_job j = { b, logits };
    return run_all((tp_be *)base, rank_forward, &j);
}

typedef struct {
    int src, dst;
} copy_job;

static int rank_copy(tp_be *t, int r, void *arg)
{
    const copy_job *j = arg;
    return t->r[r].be->ops->copy_block(t->r[r].be, j->src, j->dst);
}

static int tp_copy_block(qbackend *base, int src, int dst)
{
    copy_job j = { src, dst };
    return run_all((tp_be *)base, rank_copy, &j);
}

static size_t tp_block_bytes(const qbackend *base) { return ((const tp_be *)base)->bb; }

typedef struct {
    const int32_t *blocks;
    int n;
    char *host;
    int write;
} io_job;

/* Rank r's part of n blocks, through its staging memory: per block, its
 * 2 L pieces (K and V of each layer) sit at piece p of rank r in the
 * host's layout (p n + r). */
static int rank_io(tp_be *t, int r, void *arg)
{
    const io_job *j = arg;
    tp_rank *rk = &t->r[r];
    const size_t piece = rk->bb / (2 * (size_t)t->w->hp.n_layers), pieces = 2 * (size_t)t->w->hp.n_layers;
    for (int i0 = 0; i0 < j->n; i0 += TP_STAGE_BLOCKS) {
        const int m = j->n - i0 < TP_STAGE_BLOCKS ? j->n - i0 : TP_STAGE_BLOCKS;
        char *stage = rk->stage;
        int rc = 0;
        if (!j->write && (rc = qbackend_read_blocks(rk->be, j->blocks + i0, m, stage))) return rc;
        for (int i = 0; i < m; i++) {
            char *blk = j->host + (size_t)(i0 + i) * t->bb;
            for (size_t p = 0; p < pieces; p++) {
                char *h = blk + (p * (size_t)t->n + (size_t)r) * piece, *s = stage + (size_t)i * rk->bb + p * piece;
                if (j->write) memcpy(s, h, piece);
                else memcpy(h, s, piece);
            }
        }
        if (j->write && (rc = qbackend_write_blocks(rk->be, j->blocks + i0, m, stage))) return rc;
    }
    return 0;
}

static int tp_read_blocks(qbackend *base, const int32_t *blocks, int n, void *host)
{
    io_job j = { blocks, n, host, 0 };
    return n > 0 ? run_all((tp_be *)base, rank_io, &j) : 0;
}

static int tp_write_blocks(qbackend *base, const int32_t *blocks, int n, const void *host)
{
    io_job j = { blocks, n, (char *)host, 1 };
    return n > 0 ? run_all((tp_be *)base, rank_io, &j) : 0;
}

static int tp_read_block(qbackend *base, int block, void *dst)
{
    const int32_t b = block;
    return tp_read_blocks(base, &b, 1, dst);
}

static int tp_write_block(qbackend *base, int block, const void *src)
{
    const int32_t b = block;
    return tp_write_blocks(base, &b, 1, src);
}

static void *tp_host_alloc(qbackend *base, size_t bytes)
{
    tp_be *t = (tp_be *)base;
    return qbackend_host_alloc(t->r[0].be, bytes);
}

static void tp_host_free(qbackend *base, void *p)
{
    tp_be *t = (tp_be *)base;
    qbackend_host_free(t->r[0].be, p);
}

static uint32_t *tp_mask_rows(qbackend *base, int n_rows)
{
    tp_be *t = (tp_be *)base;
    qbackend *be = t->r[0].be;
    return be->ops->mask_rows ? be->ops->mask_rows(be, n_rows) : NULL;
}

static int tp_broken(const qbackend *base)
{
    tp_be *t = (tp_be *)base;
    pthread_mutex_lock(&t->mu);
    const int b = t->broken;
    pthread_mutex_unlock(&t->mu);
    return b;
}

static void tp_destroy(qbackend *base)
{
    tp_be *t = (tp_be *)base;
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->quit = 1;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    for (int r = 1; r < t->n; r++)
        if (t->r[r].started) pthread_join(t->r[r].th, NULL);
    for (int r = 0; r < t->n; r++) {
        tp_rank *rk = &t->r[r];
        if (rk->be) {
            qbackend_host_free(rk->be, rk->stage);
            qbackend_destroy(rk->be);
        }
        qshard_free(&rk->shard);
    }
#ifdef QUIRE_HAVE_CUDA
    cuda_tp_destroy(t->ctp);
#endif
    qtp_group_free(t->group);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->go);
    pthread_cond_destroy(&t->done);
    free(t);
}

/* ---- creation ------------------------------------------------------------------------ */

typedef struct {
    char err[TP_MAX][256];
} make_job;

/* Rank r's shard and backend (each rank on its own thread: the n devices
 * are filled at once). */
static int rank_make(tp_be *t, int r, void *arg)
{
    make_job *j = arg;
    tp_rank *rk = &t->r[r];
    char *err = j->err[r];
    int rc = qshard_make(t->w, r, t->n, &rk->shard, err, sizeof j->err[r]);
    if (rc) return rc;
    qbackend_opts o = t->opts;
    o.tp_rank = r;
    if (r > 0) o.reserve_bytes = 0, o.extra_block_bytes = 0; /* a draft model lives on device 0 */
    if (t->cuda) {
#ifdef QUIRE_HAVE_CUDA
        o.device = r;
        o.allreduce = cuda_tp_allreduce;
        o.allreduce_ctx = cuda_tp_member(t->ctp, r);
        rc = cuda_backend_create(&rk->shard.w, &o, &rk->be, err, sizeof j->err[r]);
        /* The weights are on the device now: the shard's host copy goes
         * (the backend reads only the hyperparameters from here on). */
        if (!rc) {
            for (int l = 0; l < rk->shard.w.hp.n_layers; l++) {
                qlayer *L = &rk->shard.layers[l];
                qtensor *ts[] = { &L->wq, &L->wk, &L->wv, &L->bq,     &L->bk,
                                  &L->bv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
                for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ts[i]->data = NULL;
            }
            free(rk->shard.mem);
            rk->shard.mem = NULL;
        }
#else
        rc = qerr_set(err, sizeof j->err[r], QERR_UNSUPPORTED, "quire was built without CUDA");
#endif
    } else {
        o.allreduce = qtp_allreduce;
        o.allreduce_ctx = &rk->member;
        rk->member.g = t->group, rk->member.rank = r;
        rc = cpu_backend_create(&rk->shard.w, &o, &rk->be, err, sizeof j->err[r]);
    }
    if (rc) return rc;
    rk->bb = rk->be->ops->block_bytes(rk->be);
    if (!(rk->stage = qbackend_host_alloc(rk->be, rk->bb * TP_STAGE_BLOCKS))) {
        snprintf(err, sizeof j->err[r], "out of memory for staging blocks");
        return QERR_NOMEM;
    }
    return 0;
}

int qtp_backend_create(const qweights *w, const qbackend_opts *opts, int n, int cuda, qbackend **out, char *err,
                       size_t errlen)
{
    *out = NULL;
    if (n < 1 || n > TP_MAX)
        return qerr_set(err, errlen, QERR_INVAL, "tensor parallelism over %d (1 to %d)", n, TP_MAX);
    if (w->hp.n_heads % n || w->hp.n_kv_heads % n || w->hp.ffn_dim % n)
        return qerr_set(err, errlen, QERR_INVAL,
                        "tensor parallelism over %d: the model's %d attention heads, %d KV heads and MLP width %d "
                        "must each divide by %d",
                        n, w->hp.n_heads, w->hp.n_kv_heads, w->hp.ffn_dim, n);
    tp_be *t = calloc(1, sizeof *t);
    if (!t) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    t->w = w, t->n = n, t->cuda = cuda, t->opts = *opts;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    int rc = 0;
    if (cuda) {
#ifdef QUIRE_HAVE_CUDA
        if (!(rc = cuda_tp_create(n, &t->ctp, err, errlen)))
            t->abort = cuda_tp_abort, t->ok = cuda_tp_ok, t->abort_ctx = t->ctp;
#else
        rc = qerr_set(err, errlen, QERR_UNSUPPORTED, "tensor parallelism on CUDA: quire was built without CUDA");
#endif
    } else {
        /* The cores are shared among the ranks. */
        const int nt = opts->n_threads > 0 ? opts->n_threads : q_ncpus();
        t->opts.n_threads = nt / n > 0 ? nt / n : 1;
        if (!(t->group = qtp_group_new(n, (size_t)1 << 16)))
            rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        else t->abort = qtp_group_abort, t->abort_ctx = t->group;
    }
    for (int r = 0; r < n; r++) t->r[r].t = t, t->r[r].rank = r;
    const char *fail = getenv("QUIRE_TP_FAIL");
    t->fail_rank = -1;
    if (fail && sscanf(fail, "%d,%d", &t->fail_rank, &t->fail_at) != 2) t->fail_rank = -1;
    for (int r = 1; r < n && !rc; r++) {
        if (pthread_create(&t->r[r].th, NULL, rank_thread, &t->r[r]))
            rc = qerr_set(err, errlen, QERR_NOMEM, "tensor parallelism: cannot start a thread");
        else t->r[r].started = 1;
    }
    make_job *mj = rc ? NULL : calloc(1, sizeof *mj);
    if (!rc && !mj) rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    if (!rc && (rc = run_all(t, rank_make, mj))) {
        for (int r = 0; r < n; r++)
            if (mj->err[r][0]) {
                qerr_set(err, errlen, rc, "tensor parallelism, shard %d of %d: %s", r, n, mj->err[r]);
                break;
            }
    }
    free(mj);
    if (rc) {
        tp_destroy(&t->base);
        return rc;
    }
    /* One pool: the block ids every rank has.  Ranks that sized theirs
     * larger (CUDA, from their device's free memory; device 0 leaves room
     * for a draft model) refuse the ids beyond it too, as rank 0 does, so
     * that a bad id fails every rank alike (backend.h). */
    qbackend *b0 = t->r[0].be;
    t->base.opts = b0->opts;
    for (int r = 0; r < n; r++) {
        const int nb = t->r[r].be->opts.num_blocks;
        if (nb < t->base.opts.num_blocks) t->base.opts.num_blocks = nb;
        t->bb += t->r[r].bb;
    }
    for (int r = 0; r < n && cuda; r++) t->r[r].be->opts.num_blocks = t->base.opts.num_blocks;
    t->base.opts.allreduce = NULL, t->base.opts.allreduce_ctx = NULL, t->base.opts.tp_rank = 0;
    t->base.opts.n_threads = opts->n_threads;
    t->ops = (qbackend_ops){
        .name = b0->ops->name, /* blocks are the unsplit model's: the persistent tier sees the same backend */
        .forward = tp_forward,
        .copy_block = tp_copy_block,
        .block_bytes = tp_block_bytes,
        .read_block = tp_read_block,
        .write_block = tp_write_block,
        .destroy = tp_destroy,
        .read_blocks = tp_read_blocks,
        .write_blocks = tp_write_blocks,
        .host_alloc = tp_host_alloc,
        .host_free = tp_host_free,
        .caps = b0->ops->caps,
        .mask_rows = b0->ops->mask_rows ? tp_mask_rows : NULL,
        .broken = tp_broken,
    };
    t->base.ops = &t->ops;
    t->base.w = w;
    QLOGI("tensor parallelism: %d shards on %s, KV pool %d blocks", n, cuda ? "CUDA devices 0.." : "CPU threads",
          t->base.opts.num_blocks);
    *out = &t->base;
    return 0;
}
