/* model_random.c - models with real shapes and random weights.
 *
 * Benchmarks want the shapes of a real model (Llama-3.1-8B, Qwen2.5-7B) but
 * not its 16 GB checkpoint: qmodel_random() reads an HF config.json with the
 * same parser as hf.c, registers every tensor the architecture needs under
 * its HF name (BF16, as the checkpoints ship), and binds them with
 * qmodel_bind(), so the shapes are checked by the same code as a real load.
 *
 * Where the bytes live:
 *   - host_data = 0: nowhere yet.  Every tensor's data is NULL and the
 *     backend fills them on the device (qbackend_opts.random_weights); a
 *     model of 8B parameters costs no host memory at all.
 *   - host_data = 1: one buffer per tensor, owned by the model, filled here.
 *
 * The fill is deterministic and independent of the thread count: each
 * tensor is cut into chunks of FILL_CHUNK elements, and chunk c of tensor t
 * draws from a splitmix64 stream seeded with hash(seed, t, c).  Threads take
 * chunks from a shared counter.  Each 64-bit draw gives four 16-bit
 * uniforms, so a 1B-parameter model fills in about a second per core.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arch.h"
#include "model.h"
#include "util.h"

#define FILL_CHUNK ((size_t)1 << 20)
#define FILL_MAX_THREADS 64
#define CONFIG_MAX_BYTES ((size_t)1 << 20)

typedef enum { FILL_MATRIX, FILL_NORM, FILL_BIAS, FILL_RESIDUAL } fill_kind;

typedef struct {
    uint16_t *data;              /* (n) bf16 */
    size_t n;
    float center, half;          /* values in center +- half */
} fill_job;

typedef struct {
    fill_job *jobs;
    int n_jobs;
    size_t *first_chunk;         /* (n_jobs + 1) prefix sums of chunk counts */
    uint64_t seed;
    atomic_size_t next;
} fill_plan;

static inline uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Round to nearest even, for finite values (all this file makes); inline,
 * unlike q_f32_to_bf16, because it runs a billion times. */
static inline uint16_t bf16_round(float f)
{
    union { float f; uint32_t u; } v = { .f = f };
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* Fills data[0..n) of one chunk: value = center + 2 half (u - 0.5) with u
 * uniform in [0, 1) at 16-bit resolution. */
static void fill_chunk(uint16_t *data, size_t n, float center, float half, uint64_t stream)
{
    const float scale = 2.0f * half / 65536.0f;
    uint64_t s = stream;
    size_t i = 0;
    while (i < n) {
        uint64_t r = splitmix64(&s);
        for (int k = 0; k < 4 && i < n; k++, i++) {
            float u = (float)(uint16_t)(r >> (16 * k));
            data[i] = bf16_round(center - half + u * scale);
        }
    }
}

static void *fill_worker(void *arg)
{
    fill_plan *p = arg;
    size_t total = p->first_chunk[p->n_jobs];
    int j = 0;
    for (;;) {
        size_t c = atomic_fetch_add(&p->next, 1);
        if (c >= total) break;
        while (p->first_chunk[j + 1] <= c) j++; /* chunks are taken in increasing order */
        const fill_job *fj = &p->jobs[j];
        size_t local = c - p->first_chunk[j], off = local * FILL_CHUNK;
        size_t n = fj->n - off < FILL_CHUNK ? fj->n - off : FILL_CHUNK;
        uint64_t s = p->seed ^ ((uint64_t)j * 0xd1b54a32d192ed03ULL);
        s = splitmix64(&s) ^ ((uint64_t)local * 0x8cb92ba72f3d8dd7ULL);
        fill_chunk(fj->data + off, n, fj->center, fj->half, splitmix64(&s));
    }
    return NULL;
}

/* Fills every job, over up to one thread per core. */
static int fill_all(fill_job *jobs, int n_jobs, uint64_t seed, char *err, size_t errlen)
{
    fill_plan p = { .jobs = jobs, .n_jobs = n_jobs, .seed = seed };
    p.first_chunk = q_mallocn((size_t)n_jobs + 1, sizeof *p.first_chunk);
    if (!p.first_chunk) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    p.first_chunk[0] = 0;
    for (int j = 0; j < n_jobs; j++)
        p.first_chunk[j + 1] = p.first_chunk[j] + (jobs[j].n + FILL_CHUNK - 1) / FILL_CHUNK;
    atomic_init(&p.next, 0);
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    size_t total = p.first_chunk[n_jobs];
    int nt = nc > 0 ? (int)nc : 1;
    if (nt > FILL_MAX_THREADS) nt = FILL_MAX_THREADS;
    if ((size_t)nt > total) nt = total ? (int)total : 1;
    pthread_t th[FILL_MAX_THREADS];
    int started = 0;
    for (int i = 1; i < nt; i++) {
        if (pthread_create(&th[started], NULL, fill_worker, &p)) break; /* fewer threads is fine */
        started++;
    }
    fill_worker(&p);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(p.first_chunk);
    return 0;
}

/* ---- building the model ---------------------------------------------------- */

typedef struct {
    qmodel *m;
    int host;
    fill_job *jobs;
    int n_jobs, cap_jobs;
    float residual;              /* FILL_RESIDUAL's range against FILL_MATRIX's (0: the same) */
    char *err;
    size_t errlen;
} builder;

/* Registers one tensor (d1 == 0: a vector of d0) under name, with a fresh
 * host buffer when b->host. */
static int add(builder *b, const char *name, int64_t d0, int64_t d1, fill_kind kind)
{
    int64_t shape[2] = { d0, d1 };
    int ndim = d1 ? 2 : 1;
    size_t numel = (size_t)d0 * (size_t)(d1 ? d1 : 1), bytes = numel * 2; /* bounded by the caller */
    uint16_t *data = NULL;
    if (b->host) {
        if (b->n_jobs == b->cap_jobs) {
            int nc = b->cap_jobs ? b->cap_jobs * 2 : 64;
            fill_job *nj = q_reallocn(b->jobs, (size_t)nc, sizeof *nj);
            if (!nj) return qerr_set(b->err, b->errlen, QERR_NOMEM, "out of memory");
            b->jobs = nj;
            b->cap_jobs = nc;
        }
        data = q_malloc(bytes);
        if (!data || qmodel_take_buffer(b->m, data)) {
            free(data);
            return qerr_set(b->err, b->errlen, QERR_NOMEM, "out of memory for tensor '%s' (%.1f MiB)", name,
                            (double)bytes / (1 << 20));
        }
        const float half = kind == FILL_MATRIX ? 0.035f
                           : kind == FILL_RESIDUAL ? 0.035f * (b->residual > 0 ? b->residual : 1.0f)
                                                   : 0.02f;
        b->jobs[b->n_jobs++] = (fill_job){ data, numel, kind == FILL_NORM && !b->m->hp.norm_add_one ? 1.0f : 0.0f, half };
    }
    return qmodel_add_tensor(b->m, name, strlen(name), QDT_BF16, ndim, shape, data, bytes, b->err, b->errlen);
}

/* Parameters of the architecture hp describes, or -1 past the limit. */
static int64_t count_params(const qhparams *hp)
{
    const double dim = hp->dim, hd = hp->head_dim, q = (double)hp->n_heads * hd, kv = (double)hp->n_kv_heads * hd;
    double layer = 2 * dim + q * dim + 2 * kv * dim + dim * q + 3 * (double)hp->ffn_dim * dim;
    if (hp->attn_bias) layer += q + 2 * kv;
    if (hp->qk_norm) layer += 2 * hd;
    if (hp->norm_place == QNORM_SANDWICH) layer += 2 * dim;
    double n = (double)hp->n_vocab * dim * (hp->tied_embeddings ? 1 : 2) + dim + layer * hp->n_layers;
    return n > (double)QMODEL_RANDOM_MAX_PARAMS ? -1 : (int64_t)n;
}

/* Each tensor's shape (rows, cols: 0 = dim, 1 = n_heads*head_dim,
 * 2 = n_kv_heads*head_dim, 3 = ffn_dim, 4 = n_vocab, 5 = head_dim, -1 =
 * none) and fill. */
static const struct { int rows, cols; fill_kind kind; } shapes[QTN_COUNT] = {
    [QTN_EMBD] = { 4, 0, FILL_MATRIX },       [QTN_NORM] = { 0, -1, FILL_NORM },
    [QTN_OUTPUT] = { 4, 0, FILL_MATRIX },     [QTN_ROPE_FREQS] = { -1, -1, FILL_NORM },
    [QTN_ATTN_NORM] = { 0, -1, FILL_NORM },   [QTN_WQ] = { 1, 0, FILL_MATRIX },
    [QTN_WK] = { 2, 0, FILL_MATRIX },         [QTN_WV] = { 2, 0, FILL_MATRIX },
    [QTN_BQ] = { 1, -1, FILL_BIAS },          [QTN_BK] = { 2, -1, FILL_BIAS },
    [QTN_BV] = { 2, -1, FILL_BIAS },          [QTN_WO] = { 0, 1, FILL_RESIDUAL },
    [QTN_FFN_NORM] = { 0, -1, FILL_NORM },    [QTN_GATE] = { 3, 0, FILL_MATRIX },
    [QTN_UP] = { 3, 0, FILL_MATRIX },         [QTN_DOWN] = { 0, 3, FILL_RESIDUAL },
    [QTN_Q_NORM] = { 5, -1, FILL_NORM },      [QTN_K_NORM] = { 5, -1, FILL_NORM },
    [QTN_POST_ATTN_NORM] = { 0, -1, FILL_NORM }, [QTN_POST_FFN_NORM] = { 0, -1, FILL_NORM },
    [QTN_WQKV] = { 6, 0, FILL_MATRIX },       [QTN_GATE_UP] = { 7, 0, FILL_MATRIX },
    [QTN_ROPE_LONG] = { -1, -1, FILL_NORM },  [QTN_ROPE_SHORT] = { -1, -1, FILL_NORM },
};

/* Whether the model has tensor i: the family names it, and the flags want it. */
static int wanted(const qhparams *hp, const char *const *names, int i)
{
    if (!names[i] || i == QTN_ROPE_FREQS || i == QTN_ROPE_LONG || i == QTN_ROPE_SHORT) return 0; /* (config.json's) */
    if (i == QTN_OUTPUT) return !hp->tied_embeddings;
    if (i == QTN_BQ || i == QTN_BK || i == QTN_BV) return hp->attn_bias;
    if (i == QTN_Q_NORM || i == QTN_K_NORM) return hp->qk_norm;
    if (i == QTN_POST_ATTN_NORM || i == QTN_POST_FFN_NORM) return hp->norm_place == QNORM_SANDWICH;
    return 1;
}

/* Registers the family's tensors under their HF names, in the table's order
 * (the fill of tensor t depends on t), then binds them. */
static int build(builder *b, uint64_t seed)
{
    qmodel *m = b->m;
    const qhparams *hp = &m->hp;
    const char *const *names = qfamily_get(hp->family)->hf_names->name;
    const int64_t sizes[8] = { hp->dim, (int64_t)hp->n_heads * hp->head_dim, (int64_t)hp->n_kv_heads * hp->head_dim,
                               hp->ffn_dim, hp->n_vocab, hp->head_dim,
                               (int64_t)(hp->n_heads + 2 * hp->n_kv_heads) * hp->head_dim, 2 * (int64_t)hp->ffn_dim };
    char name[QMODEL_MAX_NAME];
    int rc;
    for (int l = -1; l < hp->n_layers; l++) {
        const int lo = l < 0 ? 0 : QTN_FIRST_LAYER, hi = l < 0 ? QTN_FIRST_LAYER : QTN_COUNT;
        for (int i = lo; i < hi; i++) {
            if (!wanted(hp, names, i) || (l >= 0 && QTN_IS_GLOBAL(i))) continue;
            snprintf(name, sizeof name, names[i], l);
            const int64_t cols = shapes[i].cols < 0 ? 0 : sizes[shapes[i].cols];
            if ((rc = add(b, name, sizes[shapes[i].rows], cols, shapes[i].kind))) return rc;
        }
    }
    if (b->host && (rc = fill_all(b->jobs, b->n_jobs, seed, b->err, b->errlen))) return rc;
    return qmodel_bind(m, b->err, b->errlen);
}

int qmodel_random(const char *config_path, int host_data, uint64_t seed, qmodel **out, char *err, size_t errlen)
{
    return qmodel_random_ex(config_path, host_data, seed, 0.0f, out, err, errlen);
}

int qmodel_random_ex(const char *config_path, int host_data, uint64_t seed, float residual, qmodel **out, char *err,
                     size_t errlen)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = q_read_file(config_path, CONFIG_MAX_BYTES, &text, &len, err, errlen);
    if (rc) return rc;
    qmodel *m = qmodel_new();
    if (!m || !(m->path = q_strdup(config_path))) {
        free(text);
        qmodel_destroy(m);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    m->format = QFMT_HF;
    m->random_fill = host_data ? QMODEL_RANDOM_HOST : QMODEL_RANDOM_DEVICE;
    m->random_seed = seed;
    m->random_residual = residual > 0 && residual != 1.0f ? residual : 0.0f;
    builder b = { .m = m, .host = host_data, .residual = m->random_residual, .err = err, .errlen = errlen };
    rc = hf_parse_config(m, text, len, err, errlen);
    free(text);
    if (rc) {
        /* hf_parse_config's messages start with "config.json:"; say which file. */
        char inner[384];
        snprintf(inner, sizeof inner, "%s", err ? err : "");
        qerr_set(err, errlen, rc, "%s: %s", config_path, inner);
        goto fail;
    }
    int64_t params = count_params(&m->hp);
    if (params < 0) {
        rc = qerr_set(err, errlen, QERR_RANGE, "%s: the model would have more than %lld parameters", config_path,
                      (long long)QMODEL_RANDOM_MAX_PARAMS);
        goto fail;
    }
    if (host_data) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        double mem = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
        if (mem > 0 && 2.0 * (double)params > mem) {
            rc = qerr_set(err, errlen, QERR_NOMEM, "%s: %.2fB parameters need %.1f GiB of bf16, more than the %.1f GiB of memory",
                          config_path, (double)params / 1e9, 2.0 * (double)params / (1 << 30), mem / (1 << 30));
            goto fail;
        }
    }
    const char *base = strrchr(config_path, '/');
    base = base && base[1] ? base + 1 : config_path;
    size_t nl = strlen(base) + 8;
    if (!(m->name = q_malloc(nl))) {
        rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        goto fail;
    }
    snprintf(m->name, nl, "random:%s", base);
    double t0 = q_now();
    if ((rc = build(&b, seed))) goto fail;
    if (host_data)
        QLOGD("random weights: %.2fB parameters filled in %.2f s", (double)params / 1e9, q_now() - t0);
    free(b.jobs);
    *out = m;
    return 0;
fail:
    free(b.jobs);
    qmodel_destroy(m);
    return rc;
}
