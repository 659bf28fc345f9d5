/* cpu_backend.c - the reference backend: a Llama/Qwen2 forward pass in
 * float32 arithmetic over weights kept in their stored dtype, with K/V in a
 * paged cache.
 *
 * KV layout.  For each layer, K and V each hold num_blocks blocks; a block is
 * (n_kv_heads, block_size, head_dim) floats, so one head's keys within a
 * block are contiguous.  Token at position p of a sequence lives in physical
 * block table[p / block_size], slot p % block_size.
 *
 * One forward pass (T tokens from S sequences):
 *   x = embed(tokens)                                   (T, dim)
 *   (Gemma: x *= sqrt(dim))
 *   per layer:  xn = rmsnorm(x);  q,k,v = xn W^T (+b);  (QK-norm: rmsnorm of
 *               each head of q and k);  rope(q, k) at each
 *               token's position (local layers: their own base);  k, v -> cache;
 *               a = attention over the cache (causal: a token sees positions
 *               <= its own; local layers only the last `window` of them;
 *               scores soft-capped where the model says);
 *               x += a Wo^T;  xn = rmsnorm(x);  x += (act(xn Wg^T) * xn Wu^T) Wd^T
 *               (sandwich norms: each block's output is normed before it is added)
 *   logits = rmsnorm(x[logits_idx]) Wout^T              (n_logits, n_vocab)
 *            (soft-capped where the model says)
 *
 * Norm weights that scale by (1 + w) (Gemma's HF checkpoints) are turned
 * into float32 (1 + w) once, at creation.
 *
 * Work is split over the pool by output rows (projections) and by
 * (sequence, head) pairs (attention); each output element is computed by the
 * same instruction sequence whatever the split or batch, so a sequence's
 * logits do not depend on what else is in the batch.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "util.h"
#include "cpu/ops.h"
#include "pool.h"

typedef struct {
    qbackend base;
    qpool *pool;
    const cpu_kernels *k;
    int n_threads;
    size_t block_floats;    /* floats in one block of one layer's K (or V) */
    float *kc, *vc;         /* (n_layers, num_blocks, n_kv, block_size, head_dim) */
    float *inv_freq;        /* (rope_dim / 2) */
    float *inv_freq_local;  /* local layers': (rope_dim / 2), or NULL when they use inv_freq */
    /* The layers and output norm as the pass reads them (norms turned into
     * (1 + w) where the model says; norm_f32 holds those). */
    qlayer *layers;
    qtensor out_norm;
    float *norm_f32;
    /* Scratch for up to cap tokens. */
    int cap;
    float *x, *xn, *q, *kx, *vx, *att, *g, *u, *cs, *cs_local;
    int cap_ctx;
    float *scores;          /* (n_threads, cap_ctx) */
} cpu_be;

/* ---- RoPE frequencies ----------------------------------------------------- */

void qrope_inv_freq(const qweights *w, float *inv_freq)
{
    const qhparams *hp = &w->hp;
    int half = hp->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow((double)hp->rope_theta, (double)(2 * i) / hp->rope_dim);
        if (hp->rope_scaling == QROPE_SCALE_LINEAR) {
            f /= hp->rope_factor;
        } else if (hp->rope_scaling == QROPE_SCALE_LLAMA3) {
            /* As in Meta's reference and HF's _compute_llama3_parameters. */
            double lo_wl = hp->rope_orig_ctx / hp->rope_low_freq_factor;
            double hi_wl = hp->rope_orig_ctx / hp->rope_high_freq_factor;
            double wl = 2 * M_PI / f;
            if (wl > lo_wl) {
                f = f / hp->rope_factor;
            } else if (wl >= hi_wl) {
                double s = (hp->rope_orig_ctx / wl - hp->rope_low_freq_factor) /
                           (hp->rope_high_freq_factor - hp->rope_low_freq_factor);
                f = (1 - s) * f / hp->rope_factor + s * f;
            }
        }
        if (w->rope_freqs.data) f /= ((const float *)w->rope_freqs.data)[i];
        inv_freq[i] = (float)f;
    }
}

void qrope_inv_freq_layer(const qweights *w, int local, float *inv_freq)
{
    const qhparams *hp = &w->hp;
    if (!local || !(hp->rope_theta_local > 0)) {
        qrope_inv_freq(w, inv_freq);
        return;
    }
    for (int i = 0; i < hp->rope_dim / 2; i++)
        inv_freq[i] = (float)(1.0 / pow((double)hp->rope_theta_local, (double)(2 * i) / hp->rope_dim));
}

/* cs = (cos, sin) pairs for position pos, times mscale (LongRoPE's
 * attention factor) when it is not 0. */
static void rope_cs(const float *inv_freq, int half, int pos, float mscale, float *cs)
{
    for (int i = 0; i < half; i++) {
        float a = (float)pos * inv_freq[i];
        cs[2 * i] = cosf(a);
        cs[2 * i + 1] = sinf(a);
        if (mscale > 0) cs[2 * i] *= mscale, cs[2 * i + 1] *= mscale;
    }
}

static void rope_apply(float *v, int n_heads, int head_dim, int rope_dim, int neox, const float *cs)
{
    int half = rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *p = v + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float c = cs[2 * i], s = cs[2 * i + 1], x0 = p[a], x1 = p[b];
            p[a] = x0 * c - x1 * s;
            p[b] = x1 * c + x0 * s;
        }
    }
}

/* ---- parallel projections ------------------------------------------------- */

/* Up to three projections of the same input in one pool run (q/k/v, gate/up). */
typedef struct {
    const cpu_kernels *k;
    const float *x;
    int T, K;
    int n_mats;
    struct { const qtensor *W; float *y; int N; int first_task; } m[3];
    int rows_per_task;
} proj_job;

static void proj_task(void *ctx, int task, int tid)
{
    proj_job *j = ctx;
    int i = j->n_mats - 1;
    while (i > 0 && task < j->m[i].first_task) i--;
    int o0 = (task - j->m[i].first_task) * j->rows_per_task;
    int o1 = o0 + j->rows_per_task;
    if (o1 > j->m[i].N) o1 = j->m[i].N;
    j->k->matmul(j->m[i].y, j->m[i].N, j->x, j->T, j->m[i].W->data, j->m[i].W->dtype, j->K, o0, o1);
}

static void project(cpu_be *be, const float *x, int T, int K, int n, const qtensor *const *W,
                    float *const *y)
{
    proj_job j = { .k = be->k, .x = x, .T = T, .K = K, .n_mats = n };
    int total = 0;
    for (int i = 0; i < n; i++) total += (int)W[i]->shape[0];
    /* About 8 tasks per thread so that uneven cores even out; rows in
     * multiples of 8 to fill the 8-row decode tiles. */
    int rpt = total / (be->n_threads * 8);
    rpt = rpt < 8 ? 8 : (rpt + 7) & ~7;
    j.rows_per_task = rpt;
    int tasks = 0;
    for (int i = 0; i < n; i++) {
        j.m[i].W = W[i];
        j.m[i].y = y[i];
        j.m[i].N = (int)W[i]->shape[0];
        j.m[i].first_task = tasks;
        tasks += (j.m[i].N + rpt - 1) / rpt;
    }
    /* Small products are not worth waking the workers for: a task's result
     * does not depend on which thread runs it, so running them all here is
     * the same computation. */
    if ((double)total * K * T < 262144.0) {
        for (int t = 0; t < tasks; t++) proj_task(&j, t, 0);
        return;
    }
    qpool_run(be->pool, tasks, proj_task, &j);
}

/* ---- attention -------------------------------------------------------------- */

typedef struct {
    cpu_be *be;
    const qbatch *b;
    int layer;
    int window;      /* 0: every earlier position */
} attn_job;

static void attn_task(void *ctx, int task, int tid)
{
    attn_job *j = ctx;
    cpu_be *be = j->be;
    const qhparams *hp = &be->base.w->hp;
    const int H = hp->n_heads, hd = hp->head_dim, bs = be->base.opts.block_size;
    const int group = H / hp->n_kv_heads;
    const qbatch_seq *s = &j->b->seqs[task / H];
    const int h = task % H, g = h / group;
    const float scale = hp->attn_scale > 0 ? hp->attn_scale : 1.0f / sqrtf((float)hd), cap = hp->attn_softcap;
    float *sc = be->scores + (size_t)tid * be->cap_ctx;
    const size_t layer_off = (size_t)j->layer * be->base.opts.num_blocks * be->block_floats;
    const float *kc = be->kc + layer_off, *vc = be->vc + layer_off;

    for (int i = 0; i < s->n_tokens; i++) {
        const int t = s->first + i, n = s->pos0 + i + 1;
        /* Positions lo .. n-1; blocks before lo's are never read (a windowed
         * sequence's may have been given back). */
        const int lo = j->window > 0 && n > j->window ? n - j->window : 0, p_first = lo - lo % bs;
        const float *q = be->q + ((size_t)t * H + h) * hd;
        /* Scores block by block: a block holds this KV head's keys for
         * block_size consecutive positions, contiguous. */
        for (int p0 = p_first; p0 < n; p0 += bs) {
            const int cnt = n - p0 < bs ? n - p0 : bs;
            const float *kb = kc + (size_t)s->block_table[p0 / bs] * be->block_floats + (size_t)g * bs * hd;
            be->k->attn_scores(sc + p0, q, kb, cnt, hd, scale);
        }
        if (cap > 0)
            for (int p = lo; p < n; p++) sc[p] = cap * tanhf(sc[p] / cap);
        float mx = -INFINITY;
        for (int p = lo; p < n; p++)
            if (sc[p] > mx) mx = sc[p];
        float sum = 0;
        for (int p = p_first; p < n; p++) {
            sc[p] = p < lo ? 0.0f : expf(sc[p] - mx);
            sum += sc[p];
        }
        float *out = be->att + ((size_t)t * H + h) * hd;
        memset(out, 0, (size_t)hd * sizeof(float));
        for (int p0 = p_first; p0 < n; p0 += bs) {
            const int cnt = n - p0 < bs ? n - p0 : bs;
            const float *vb = vc + (size_t)s->block_table[p0 / bs] * be->block_floats + (size_t)g * bs * hd;
            be->k->attn_accum(out, sc + p0, vb, cnt, hd);
        }
        const float inv = 1.0f / sum;
        for (int d = 0; d < hd; d++) out[d] *= inv;
    }
}

/* ---- forward ------------------------------------------------------------------ */

static int ensure_scratch(cpu_be *be, int T, int ctx)
{
    const qhparams *hp = &be->base.w->hp;
    if (T > be->cap) {
        int cap = T < 16 ? 16 : T;
        float **bufs[] = { &be->x, &be->xn, &be->q, &be->kx, &be->vx, &be->att, &be->g, &be->u };
        size_t widths[] = { (size_t)hp->dim, (size_t)hp->dim, (size_t)hp->n_heads * hp->head_dim,
                            (size_t)hp->n_kv_heads * hp->head_dim, (size_t)hp->n_kv_heads * hp->head_dim,
                            (size_t)hp->n_heads * hp->head_dim, (size_t)hp->ffn_dim, (size_t)hp->ffn_dim };
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
            size_t n;
            if (q_mul_overflow((size_t)cap, widths[i], &n)) return QERR_NOMEM;
            float *nb = q_malloc_aligned(n * sizeof(float));
            if (!nb) return QERR_NOMEM;
            q_free_aligned(*bufs[i]);
            *bufs[i] = nb;
        }
        float *cs = q_mallocn((size_t)cap, (size_t)hp->rope_dim * sizeof(float));
        float *csl = be->inv_freq_local ? q_mallocn((size_t)cap, (size_t)hp->rope_dim * sizeof(float)) : NULL;
        if (!cs || (be->inv_freq_local && !csl)) {
            free(cs);
            return QERR_NOMEM;
        }
        free(be->cs);
        free(be->cs_local);
        be->cs = cs;
        be->cs_local = csl;
        be->cap = cap;
    }
    if (ctx > be->cap_ctx) {
        float *sc = q_mallocn((size_t)be->n_threads * (size_t)ctx, sizeof(float));
        if (!sc) return QERR_NOMEM;
        free(be->scores);
        be->scores = sc;
        be->cap_ctx = ctx;
    }
    return 0;
}

static int check_batch(const cpu_be *be, const qbatch *b)
{
    const qhparams *hp = &be->base.w->hp;
    const int bs = be->base.opts.block_size, nb = be->base.opts.num_blocks;
    if (b->n_tokens <= 0 || b->n_seqs <= 0 || !b->tokens || !b->seqs) return QERR_INVAL;
    for (int i = 0; i < b->n_tokens; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= hp->n_vocab) return QERR_RANGE;
    int covered = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const qbatch_seq *q = &b->seqs[s];
        if (q->first != covered || q->n_tokens <= 0 || q->pos0 < 0) return QERR_INVAL;
        covered += q->n_tokens;
        if (covered > b->n_tokens) return QERR_INVAL;
        long need = ((long)q->pos0 + q->n_tokens + bs - 1) / bs;
        if (need > q->n_blocks || !q->block_table) return QERR_RANGE;
        for (long i = qbatch_first_block(hp, q, bs); i < need; i++)
            if (q->block_table[i] < 0 || q->block_table[i] >= nb) return QERR_RANGE;
    }
    if (covered != b->n_tokens) return QERR_INVAL;
    for (int r = 0; r < b->n_logits; r++)
        if (b->logits_idx[r] < 0 || b->logits_idx[r] >= b->n_tokens || (r && b->logits_idx[r] <= b->logits_idx[r - 1]))
            return QERR_INVAL;
    /* Drawn rows are for backends with QBE_CAP_ROW_SAMPLE; this one draws on the host. */
    for (int r = 0; b->row_mode && r < b->n_logits; r++)
        if (b->row_mode[r] == QROW_SAMPLE || (b->row_sample && b->row_sample[r].n_logprobs))
            return QERR_UNSUPPORTED;
    return 0;
}

static void add_bias(float *y, const qtensor *b, int T, int N, float *tmp)
{
    if (!b->data) return;
    cpu_to_f32(tmp, b->data, b->dtype, 0, N);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < N; i++) y[(size_t)t * N + i] += tmp[i];
}

/* y = rmsnorm(x) row by row over T rows of D. */
static void norm_rows(float *y, const float *x, const qtensor *w, int T, int D, float eps)
{
    for (int t = 0; t < T; t++) cpu_rmsnorm(y + (size_t)t * D, x + (size_t)t * D, w->data, w->dtype, D, eps);
}

/* x += f where f is a block's output (xn), normed first with sandwich norms;
 * tensor parallelism sums the shards' partial f first. */
static int add_block_out(cpu_be *be, int T, const qtensor *post_norm)
{
    const qbackend_opts *o = &be->base.opts;
    const qhparams *hp = &be->base.w->hp;
    const int D = hp->dim;
    int rc;
    if (o->allreduce && (rc = o->allreduce(o->allreduce_ctx, be->xn, (size_t)T * D, NULL, NULL, 0))) return rc;
    if (hp->norm_place == QNORM_SANDWICH) norm_rows(be->xn, be->xn, post_norm, T, D, hp->norm_eps);
    for (size_t i = 0; i < (size_t)T * D; i++) be->x[i] += be->xn[i];
    return 0;
}

/* One layer's attention block: x += attn(norm(x)). */
static int layer_attention(cpu_be *be, const qbatch *b, int l, int max_ctx)
{
    const qhparams *hp = &be->base.w->hp;
    const qlayer *L = &be->layers[l];
    const int T = b->n_tokens, D = hp->dim, H = hp->n_heads, KV = hp->n_kv_heads, hd = hp->head_dim;
    const int qd = H * hd, kvd = KV * hd, bs = be->base.opts.block_size;
    const int local = qhp_layer_local(hp, l);
    norm_rows(be->xn, be->x, &L->attn_norm, T, D, hp->norm_eps);
    const qtensor *Wqkv[3] = { &L->wq, &L->wk, &L->wv };
    float *yqkv[3] = { be->q, be->kx, be->vx };
    project(be, be->xn, T, D, 3, Wqkv, yqkv);
    add_bias(be->q, &L->bq, T, qd, be->g);
    add_bias(be->kx, &L->bk, T, kvd, be->g);
    add_bias(be->vx, &L->bv, T, kvd, be->g);
    if (hp->qk_norm) { /* QK-norm: each head's q and k RMS-normalised before RoPE (Qwen3, Gemma 3) */
        norm_rows(be->q, be->q, &L->q_norm, T * H, hd, hp->norm_eps);
        norm_rows(be->kx, be->kx, &L->k_norm, T * KV, hd, hp->norm_eps);
    }

    const size_t layer_off = (size_t)l * be->base.opts.num_blocks * be->block_floats;
    const float *cs_all = local && be->cs_local ? be->cs_local : be->cs;
    const int rotate = qhp_layer_rope(hp, l);
    for (int s = 0; s < b->n_seqs; s++) {
        const qbatch_seq *sq = &b->seqs[s];
        for (int i = 0; i < sq->n_tokens; i++) {
            const int t = sq->first + i, pos = sq->pos0 + i;
            const float *cs = cs_all + (size_t)t * hp->rope_dim;
            if (rotate) {
                rope_apply(be->q + (size_t)t * qd, H, hd, hp->rope_dim, hp->rope_neox, cs);
                rope_apply(be->kx + (size_t)t * kvd, KV, hd, hp->rope_dim, hp->rope_neox, cs);
            }
            const size_t blk = (size_t)sq->block_table[pos / bs] * be->block_floats;
            for (int g = 0; g < KV; g++) {
                size_t off = layer_off + blk + ((size_t)g * bs + pos % bs) * hd;
                memcpy(be->kc + off, be->kx + (size_t)t * kvd + (size_t)g * hd, (size_t)hd * sizeof(float));
                memcpy(be->vc + off, be->vx + (size_t)t * kvd + (size_t)g * hd, (size_t)hd * sizeof(float));
            }
        }
    }
    attn_job aj = { be, b, l, local ? hp->window : 0 };
    if ((double)T * max_ctx * qd < 262144.0)
        for (int t = 0; t < b->n_seqs * H; t++) attn_task(&aj, t, 0);
    else
        qpool_run(be->pool, b->n_seqs * H, attn_task, &aj);

    const qtensor *Wo[1] = { &L->wo };
    float *yo[1] = { be->xn };
    project(be, be->att, T, qd, 1, Wo, yo);
    return add_block_out(be, T, &L->post_attn_norm);
}

/* One layer's MLP block: x += down(act(gate(norm(x))) * up(norm(x))). */
static int layer_mlp(cpu_be *be, int T, int l)
{
    const qhparams *hp = &be->base.w->hp;
    const qlayer *L = &be->layers[l];
    norm_rows(be->xn, be->x, &L->ffn_norm, T, hp->dim, hp->norm_eps);
    const qtensor *Wgu[2] = { &L->w_gate, &L->w_up };
    float *ygu[2] = { be->g, be->u };
    project(be, be->xn, T, hp->dim, 2, Wgu, ygu);
    if (hp->act == QACT_GELU_TANH) cpu_geglu(be->g, be->g, be->u, T * hp->ffn_dim);
    else cpu_swiglu(be->g, be->g, be->u, T * hp->ffn_dim);
    const qtensor *Wd[1] = { &L->w_down };
    float *yd[1] = { be->xn };
    project(be, be->g, T, hp->ffn_dim, 1, Wd, yd);
    return add_block_out(be, T, &L->post_ffn_norm);
}

/* Embeddings of the batch's tokens into x, and each token's RoPE cos/sin
 * (shared by every layer and head; local layers' apart). */
static void embed(cpu_be *be, const qbatch *b)
{
    const qweights *w = be->base.w;
    const qhparams *hp = &w->hp;
    const int D = hp->dim;
    const float scale = (float)sqrt((double)D);
    for (int t = 0; t < b->n_tokens; t++) {
        float *x = be->x + (size_t)t * D;
        cpu_to_f32(x, w->tok_embd.data, w->tok_embd.dtype, (int64_t)b->tokens[t] * D, D);
        if (hp->embed_scale)
            for (int i = 0; i < D; i++) x[i] *= scale;
    }
    for (int s = 0; s < b->n_seqs; s++)
        for (int i = 0; i < b->seqs[s].n_tokens; i++) {
            const size_t at = (size_t)(b->seqs[s].first + i) * hp->rope_dim;
            rope_cs(be->inv_freq, hp->rope_dim / 2, b->seqs[s].pos0 + i, hp->rope_mscale, be->cs + at);
            if (be->cs_local)
                rope_cs(be->inv_freq_local, hp->rope_dim / 2, b->seqs[s].pos0 + i, 0.0f, be->cs_local + at);
        }
}

static int cpu_forward(qbackend *base, const qbatch *b, float *logits)
{
    cpu_be *be = (cpu_be *)base;
    const qweights *w = base->w;
    const qhparams *hp = &w->hp;
    const int T = b->n_tokens, D = hp->dim;
    int rc = check_batch(be, b);
    if (rc) return rc;
    int max_ctx = 0;
    for (int s = 0; s < b->n_seqs; s++)
        if (b->seqs[s].pos0 + b->seqs[s].n_tokens > max_ctx) max_ctx = b->seqs[s].pos0 + b->seqs[s].n_tokens;
    if ((rc = ensure_scratch(be, T > b->n_logits ? T : b->n_logits, max_ctx))) return rc;

    embed(be, b);
    for (int l = 0; l < hp->n_layers; l++)
        if ((rc = layer_attention(be, b, l, max_ctx)) || (rc = layer_mlp(be, T, l))) return rc;

    /* A shard's pass other than rank 0's gives no logits (rank 0 gives them). */
    if (b->n_logits > 0 && !(base->opts.allreduce && base->opts.tp_rank > 0)) {
        for (int r = 0; r < b->n_logits; r++)
            cpu_rmsnorm(be->xn + (size_t)r * D, be->x + (size_t)b->logits_idx[r] * D, be->out_norm.data,
                        be->out_norm.dtype, D, hp->norm_eps);
        const qtensor *Wout[1] = { &w->output };
        float *yl[1] = { logits };
        project(be, be->xn, b->n_logits, D, 1, Wout, yl);
        const float cap = hp->final_softcap;
        if (cap > 0)
            for (size_t i = 0; i < (size_t)b->n_logits * hp->n_vocab; i++) logits[i] = cap * tanhf(logits[i] / cap);
        for (int r = 0; b->row_mode && r < b->n_logits; r++)
            if (b->row_mode[r] == QROW_ARGMAX)
                b->row_token[r] = qrow_argmax(logits + (size_t)r * hp->n_vocab, hp->n_vocab);
    }
    return 0;
}

/* ---- blocks ------------------------------------------------------------------- */

static size_t cpu_block_bytes(const qbackend *base)
{
    const cpu_be *be = (const cpu_be *)base;
    return 2 * (size_t)base->w->hp.n_layers * be->block_floats * sizeof(float);
}

static int cpu_copy_block(qbackend *base, int src, int dst)
{
    cpu_be *be = (cpu_be *)base;
    const int nb = base->opts.num_blocks;
    if (src < 0 || src >= nb || dst < 0 || dst >= nb) return QERR_RANGE;
    if (src == dst) return 0;
    for (int l = 0; l < base->w->hp.n_layers; l++) {
        size_t lo = (size_t)l * nb * be->block_floats, n = be->block_floats * sizeof(float);
        memcpy(be->kc + lo + (size_t)dst * be->block_floats, be->kc + lo + (size_t)src * be->block_floats, n);
        memcpy(be->vc + lo + (size_t)dst * be->block_floats, be->vc + lo + (size_t)src * be->block_floats, n);
    }
    return 0;
}

/* Block bytes are laid out as every layer's K, then every layer's V. */
static int cpu_rw_block(qbackend *base, int block, void *host, int write)
{
    cpu_be *be = (cpu_be *)base;
    const int nb = base->opts.num_blocks, L = base->w->hp.n_layers;
    if (block < 0 || block >= nb) return QERR_RANGE;
    size_t n = be->block_floats * sizeof(float);
    char *h = host;
    for (int c = 0; c < 2; c++) {
        float *cache = c ? be->vc : be->kc;
        for (int l = 0; l < L; l++, h += n) {
            float *p = cache + ((size_t)l * nb + (size_t)block) * be->block_floats;
            if (write) memcpy(p, h, n);
            else memcpy(h, p, n);
        }
    }
    return 0;
}

static int cpu_read_block(qbackend *base, int block, void *dst) { return cpu_rw_block(base, block, dst, 0); }
static int cpu_write_block(qbackend *base, int block, const void *src) { return cpu_rw_block(base, block, (void *)src, 1); }

static void cpu_destroy(qbackend *base)
{
    cpu_be *be = (cpu_be *)base;
    qpool_destroy(be->pool);
    q_free_aligned(be->kc);
    q_free_aligned(be->vc);
    free(be->inv_freq);
    free(be->inv_freq_local);
    free(be->layers);
    free(be->norm_f32);
    free(be->cs_local);
    float *bufs[] = { be->x, be->xn, be->q, be->kx, be->vx, be->att, be->g, be->u };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) q_free_aligned(bufs[i]);
    free(be->cs);
    free(be->scores);
    free(be);
}

static const qbackend_ops cpu_ops = {
    .name = "cpu",
    .forward = cpu_forward,
    .copy_block = cpu_copy_block,
    .block_bytes = cpu_block_bytes,
    .read_block = cpu_read_block,
    .write_block = cpu_write_block,
    .destroy = cpu_destroy,
};

/* QERR_INVAL naming the first tensor that is present (ndim > 0) but has no
 * bytes: a random model meant to be filled on a device. */
static int check_weights_present(const qweights *w, char *err, size_t errlen)
{
    static const char *const layer_names[] = { "attn_norm", "wq", "wk", "wv", "bq", "bk", "bv",
                                               "wo", "ffn_norm", "w_gate", "w_up", "w_down", "q_norm", "k_norm",
                                               "post_attn_norm", "post_ffn_norm" };
    _Static_assert(sizeof layer_names / sizeof layer_names[0] == sizeof(qlayer) / sizeof(qtensor),
                   "one name per qlayer tensor");
    const char *missing = NULL;
    int layer = -1;
    if (!w->tok_embd.data) missing = "tok_embd";
    else if (!w->out_norm.data) missing = "out_norm";
    else if (!w->output.data) missing = "output";
    for (int l = 0; !missing && w->layers && l < w->hp.n_layers; l++) {
        const qtensor *ts = &w->layers[l].attn_norm;
        for (size_t i = 0; i < sizeof(qlayer) / sizeof(qtensor) && !missing; i++)
            if (ts[i].ndim && !ts[i].data) missing = layer_names[i], layer = l;
        if (!missing && w->hp.qk_norm && (!w->layers[l].q_norm.data || !w->layers[l].k_norm.data))
            missing = "q_norm or k_norm (QK-norm)", layer = l;
        if (!missing && w->hp.norm_place == QNORM_SANDWICH &&
            (!w->layers[l].post_attn_norm.data || !w->layers[l].post_ffn_norm.data))
            missing = "post_attn_norm or post_ffn_norm (sandwich norms)", layer = l;
    }
    if (!missing && !w->layers) missing = "layers";
    if (!missing) return 0;
    if (layer >= 0)
        return qerr_set(err, errlen, QERR_INVAL,
                        "cpu backend: layer %d's %s has no data (random weights for the device?); "
                        "the CPU backend needs weights in host memory", layer, missing);
    return qerr_set(err, errlen, QERR_INVAL,
                    "cpu backend: %s has no data (random weights for the device?); "
                    "the CPU backend needs weights in host memory", missing);
}

/* Turns norm t, when present, into float32 (1 + w) at p (NULL: only counts);
 * returns the floats it takes. */
static size_t plus_one(qtensor *t, float *p)
{
    if (!t->data) return 0;
    const int len = (int)qt_numel(t);
    if (p) {
        cpu_to_f32(p, t->data, t->dtype, 0, len);
        for (int k = 0; k < len; k++) p[k] += 1.0f;
        t->data = p;
        t->dtype = QDT_F32;
    }
    return (size_t)len;
}

/* be->layers and be->out_norm: the model's, with every norm weight turned
 * into float32 (1 + w) when the model's norms scale so.  QERR_NOMEM. */
static int copy_norms(cpu_be *be)
{
    const qweights *w = be->base.w;
    const qhparams *hp = &w->hp;
    be->layers = q_callocn((size_t)hp->n_layers, sizeof *be->layers);
    if (!be->layers) return QERR_NOMEM;
    memcpy(be->layers, w->layers, sizeof *be->layers * (size_t)hp->n_layers);
    be->out_norm = w->out_norm;
    if (!hp->norm_add_one) return 0;
    /* Two rounds: count, then convert. */
    for (int round = 0; round < 2; round++) {
        float *p = be->norm_f32;
        size_t total = plus_one(&be->out_norm, p);
        for (int l = 0; l < hp->n_layers; l++) {
            qlayer *L = &be->layers[l];
            qtensor *each[] = { &L->attn_norm, &L->ffn_norm, &L->q_norm, &L->k_norm, &L->post_attn_norm,
                                &L->post_ffn_norm };
            for (size_t i = 0; i < sizeof each / sizeof each[0]; i++)
                total += plus_one(each[i], p ? p + total : NULL);
        }
        if (!round && !(be->norm_f32 = q_mallocn(total ? total : 1, sizeof(float)))) return QERR_NOMEM;
    }
    return 0;
}

int cpu_backend_create(const qweights *w, const qbackend_opts *opts, qbackend **out, char *err, size_t errlen)
{
    *out = NULL;
    const qhparams *hp = &w->hp;
    if (opts->num_blocks <= 0 || opts->block_size <= 0 || opts->block_size > 4096)
        return qerr_set(err, errlen, QERR_INVAL, "cpu backend: %d blocks of %d tokens", opts->num_blocks, opts->block_size);
    const char *feature = qhp_unsupported(hp, QHP_ALL);
    if (feature) return qerr_set(err, errlen, QERR_UNSUPPORTED, "cpu backend: the model needs %s, which it does not compute yet", feature);
    int rc = check_weights_present(w, err, errlen);
    if (rc) return rc;
    cpu_be *be = calloc(1, sizeof *be);
    if (!be) return qerr_set(err, errlen, QERR_NOMEM, "cpu backend: out of memory");
    be->base.ops = &cpu_ops;
    be->base.w = w;
    be->base.opts = *opts;
    be->k = cpu_kernels_get();
    int nt = opts->n_threads;
    if (nt <= 0) nt = q_ncpus();
    be->n_threads = nt;
    be->base.opts.n_threads = nt;
    be->block_floats = (size_t)hp->n_kv_heads * opts->block_size * hp->head_dim;
    size_t total;
    if (q_mul_overflow(be->block_floats, (size_t)opts->num_blocks * hp->n_layers, &total) ||
        q_mul_overflow(total, sizeof(float), &total)) {
        free(be);
        return qerr_set(err, errlen, QERR_RANGE, "cpu backend: KV cache size overflows");
    }
    be->kc = q_malloc_aligned(total);
    be->vc = q_malloc_aligned(total);
    be->inv_freq = q_mallocn((size_t)hp->rope_dim / 2 + 1, sizeof(float));
    if (hp->window > 0 && hp->rope_theta_local > 0)
        be->inv_freq_local = q_mallocn((size_t)hp->rope_dim / 2 + 1, sizeof(float));
    be->pool = qpool_create(nt);
    if (!be->kc || !be->vc || !be->inv_freq || !be->pool || (hp->window > 0 && hp->rope_theta_local > 0 && !be->inv_freq_local) ||
        copy_norms(be)) {
        cpu_destroy(&be->base);
        return qerr_set(err, errlen, QERR_NOMEM, "cpu backend: cannot allocate %.1f MiB of KV cache",
                        2.0 * (double)total / (1 << 20));
    }
    /* Not zeroed: a position is always written before any pass reads it,
     * and untouched pages of a large pool then cost no memory. */
    qrope_inv_freq(w, be->inv_freq);
    if (be->inv_freq_local) qrope_inv_freq_layer(w, 1, be->inv_freq_local);
    *out = &be->base;
    return 0;
}
