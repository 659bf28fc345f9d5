/* test_shard.c - tensor parallelism's split of a model (engine/model/shard.h).
 *
 * For the fixture Llama-3 (8 heads, 2 KV heads, MLP 344) and Qwen2 (biases)
 * and 1, 2 and 4 shards (as far as the heads divide), in double precision:
 * each shard's Q/K/V rows are its heads' rows of the model's (the
 * concatenation over the shards is the model's projection, bit for bit),
 * the sum over the shards of their output projections of their heads'
 * attention is the model's, and the same for the MLP (gate/up rows, SwiGLU,
 * down columns, summed) - the all-reduce that makes n shards the model.
 * Bad splits are refused with messages.  And the whole forward: the tensor
 * parallel backend (engine/tp.c) on CPU shards, n threads in step through
 * qtp_allreduce, gives the model's logits (n = 1 bit for bit; n = 2 within
 * float rounding) and the same greedy tokens over a prefill and 12 decode
 * steps, and its blocks' bytes are the model's. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "model.h"
#include "qerr.h"
#include "shard.h"
#include "util.h"
#include "qtest.h"

static double elem(const qtensor *t, int64_t i)
{
    if (t->dtype == QDT_F32) return ((const float *)t->data)[i];
    const uint16_t h = ((const uint16_t *)t->data)[i];
    return t->dtype == QDT_BF16 ? q_bf16_to_f32(h) : q_f16_to_f32(h);
}

/* y (rows of t) = t x, t (rows, cols). */
static void matvec(const qtensor *t, const double *x, double *y)
{
    const int64_t rows = t->shape[0], cols = t->shape[1];
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t c = 0; c < cols; c++) s += elem(t, r * cols + c) * x[c];
        y[r] = s;
    }
}

static double rel(const double *a, const double *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static uint64_t g_rng = 42;
static double drand(void)
{
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(g_rng >> 11) / 9007199254740992.0 * 2 - 1;
}

static void check_model(const char *rel_path)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/%s", qt_root(), rel_path);
    qmodel *m = NULL;
    REQUIRE(qmodel_load(path, &m, err, sizeof err) == 0);
    const qweights *w = &m->w;
    const qhparams *hp = &w->hp;
    const int D = hp->dim, hd = hp->head_dim, Hq = hp->n_heads * hd, Hk = hp->n_kv_heads * hd, F = hp->ffn_dim;
    const size_t big = (size_t)(D > Hq ? (D > F ? D : F) : (Hq > F ? Hq : F));
    double *x = malloc(sizeof(double) * D), *att = malloc(sizeof(double) * Hq), *h = malloc(sizeof(double) * F);
    double *ref = malloc(sizeof(double) * big), *got = malloc(sizeof(double) * big), *tmp = malloc(sizeof(double) * big);
    double *gate = malloc(sizeof(double) * F), *up = malloc(sizeof(double) * F);
    REQUIRE(x && att && h && ref && got && tmp && gate && up);
    for (int n = 1; n <= 4; n *= 2) {
        if (hp->n_kv_heads % n || hp->n_heads % n || F % n) continue;
        qshard s[4];
        for (int r = 0; r < n; r++) REQUIRE(qshard_make(w, r, n, &s[r], err, sizeof err) == 0);
        CHECK_EQ_INT(s[0].w.hp.n_heads, hp->n_heads / n);
        CHECK_EQ_INT(s[0].w.hp.n_kv_heads, hp->n_kv_heads / n);
        CHECK_EQ_INT(s[0].w.hp.ffn_dim, F / n);
        CHECK(s[0].w.tok_embd.data == w->tok_embd.data && s[0].w.output.data == w->output.data);
        size_t qkv_diff = 0;
        double worst_o = 0, worst_mlp = 0;
        for (int l = 0; l < hp->n_layers; l++) {
            const qlayer *L = &w->layers[l];
            for (int i = 0; i < D; i++) x[i] = drand();
            /* Q, K, V (and their biases): the shards' rows, in order, are the model's. */
            const qtensor *full[3] = { &L->wq, &L->wk, &L->wv }, *fb[3] = { &L->bq, &L->bk, &L->bv };
            for (int k = 0; k < 3; k++) {
                const int len = k ? Hk : Hq, part = len / n;
                matvec(full[k], x, ref);
                for (int r = 0; r < n; r++) {
                    const qlayer *S = &s[r].w.layers[l];
                    const qtensor *sh[3] = { &S->wq, &S->wk, &S->wv }, *sb[3] = { &S->bq, &S->bk, &S->bv };
                    CHECK(sh[k]->shape[0] == part && sh[k]->shape[1] == D);
                    matvec(sh[k], x, got);
                    for (int i = 0; i < part; i++) qkv_diff += got[i] != ref[r * part + i];
                    if (fb[k]->data)
                        for (int i = 0; i < part; i++) qkv_diff += elem(sb[k], i) != elem(fb[k], r * part + i);
                    else
                        CHECK(sb[k]->data == NULL);
                }
            }
            /* The output projection: the shards' partial sums add up to the model's. */
            for (int i = 0; i < Hq; i++) att[i] = drand();
            matvec(&L->wo, att, ref);
            memset(got, 0, sizeof(double) * (size_t)D);
            for (int r = 0; r < n; r++) {
                matvec(&s[r].w.layers[l].wo, att + (size_t)r * (Hq / n), tmp);
                for (int i = 0; i < D; i++) got[i] += tmp[i];
            }
            const double eo = rel(got, ref, D);
            if (eo > worst_o) worst_o = eo;
            /* The MLP: gate/up rows, SwiGLU, down columns, summed. */
            matvec(&L->w_gate, x, gate);
            matvec(&L->w_up, x, up);
            for (int i = 0; i < F; i++) h[i] = gate[i] / (1 + exp(-gate[i])) * up[i];
            matvec(&L->w_down, h, ref);
            memset(got, 0, sizeof(double) * (size_t)D);
            for (int r = 0; r < n; r++) {
                const qlayer *S = &s[r].w.layers[l];
                double *g = gate, *u = up, *hs = h; /* reused: the full ones are no longer needed */
                matvec(&S->w_gate, x, g);
                matvec(&S->w_up, x, u);
                for (int i = 0; i < F / n; i++) hs[i] = g[i] / (1 + exp(-g[i])) * u[i];
                matvec(&S->w_down, hs, tmp);
                for (int i = 0; i < D; i++) got[i] += tmp[i];
            }
            const double em = rel(got, ref, D);
            if (em > worst_mlp) worst_mlp = em;
        }
        fprintf(stderr, "  %s, %d shard%s: Q/K/V rows %zu differ; output projection %.2g, MLP %.2g relative\n",
                rel_path, n, n > 1 ? "s" : "", qkv_diff, worst_o, worst_mlp);
        CHECK(qkv_diff == 0);
        CHECK(worst_o < 1e-12 && worst_mlp < 1e-12);
        for (int r = 0; r < n; r++) qshard_free(&s[r]);
    }
    /* Splits the model does not allow are refused, with the reason. */
    qshard bad;
    CHECK_EQ_INT(qshard_make(w, 0, 3, &bad, err, sizeof err), QERR_INVAL);
    CHECK(strstr(err, "divide by 3") != NULL);
    CHECK_EQ_INT(qshard_make(w, 2, 2, &bad, err, sizeof err), QERR_INVAL);
    CHECK_EQ_INT(qshard_make(w, 0, 0, &bad, err, sizeof err), QERR_INVAL);
    CHECK(bad.mem == NULL && bad.layers == NULL);
    free(x), free(att), free(h), free(ref), free(got), free(tmp), free(gate), free(up);
    qmodel_destroy(m);
}

static void test_llama3(void) { check_model("tests/fixtures/models/tiny-llama3-random"); }
static void test_qwen2_biases(void) { check_model("tests/fixtures/models/tiny-qwen2-random"); }


/* ---- the forward on shards ------------------------------------------------------------ */

#define TP_PROMPT 40
#define TP_STEPS 12
#define TP_BLOCKS 8

/* A prefill of TP_PROMPT tokens on be (blocks 0 .. 3), then TP_STEPS greedy
 * decode steps; logits of the prompt's last token and of each step to out
 * ((1 + TP_STEPS) * V), the greedy tokens to toks.  0 or the pass's error. */
static int run_greedy(qbackend *be, const int32_t *prompt, float *out, int32_t *toks)
{
    const int V = be->w->hp.n_vocab;
    int32_t table[TP_BLOCKS] = { 0, 1, 2, 3, 4, 5, 6, 7 }, li = TP_PROMPT - 1;
    qbatch_seq sq = { 0, TP_PROMPT, 0, table, 4 };
    qbatch b = { TP_PROMPT, prompt, 1, &sq, 1, &li, NULL, NULL, NULL, NULL, NULL };
    int rc = be->ops->forward(be, &b, out);
    for (int step = 0; step < TP_STEPS && !rc; step++) {
        toks[step] = qrow_argmax(out + (size_t)step * V, V);
        int32_t zero = 0;
        qbatch_seq sd = { 0, 1, TP_PROMPT + step, table, 4 };
        qbatch bd = { 1, &toks[step], 1, &sd, 1, &zero, NULL, NULL, NULL, NULL, NULL };
        rc = be->ops->forward(be, &bd, out + (size_t)(step + 1) * V);
    }
    return rc;
}

/* Relative error of got against ref (n floats), and how many are the same bits. */
static double rel_err(const float *got, const float *ref, size_t n, size_t *same)
{
    double num = 0, den = 0;
    *same = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]), den += (double)ref[i] * ref[i];
        *same += memcmp(&got[i], &ref[i], sizeof(float)) == 0;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* qtp_backend_create on the CPU (threads summing through qtp_allreduce)
 * against the unsplit CPU backend: the logits of a prefill and 12 greedy
 * steps (1 shard bit for bit; 2 within float rounding, the same tokens);
 * the blocks' bytes in the unsplit layout; blocks written back and copied
 * decode as the originals. */
static void test_forward_on_shards(void)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/tests/fixtures/models/tiny-llama3-random", qt_root());
    qmodel *m = NULL;
    REQUIRE(qmodel_load(path, &m, err, sizeof err) == 0);
    const int V = m->hp.n_vocab;
    const size_t per = (size_t)(1 + TP_STEPS) * V;
    int32_t prompt[TP_PROMPT], whole_toks[TP_STEPS], toks[TP_STEPS];
    for (int i = 0; i < TP_PROMPT; i++) prompt[i] = (int32_t)((i * 7919 + 13) % V);
    qbackend_opts o = { .n_threads = 2, .num_blocks = TP_BLOCKS, .block_size = 16 };
    qbackend *whole = NULL;
    REQUIRE(cpu_backend_create(&m->w, &o, &whole, err, sizeof err) == 0);
    float *ref = malloc(sizeof(float) * per), *got = malloc(sizeof(float) * per);
    const size_t bb = whole->ops->block_bytes(whole);
    float *blk_ref = malloc(4 * bb), *blk = malloc(4 * bb);
    REQUIRE(ref && got && blk_ref && blk);
    REQUIRE(run_greedy(whole, prompt, ref, whole_toks) == 0);
    const int32_t first4[4] = { 0, 1, 2, 3 }, last4[4] = { 4, 5, 6, 7 };
    REQUIRE(qbackend_read_blocks(whole, first4, 4, blk_ref) == 0);
    for (int n = 1; n <= 2; n++) {
        qbackend *be = NULL;
        REQUIRE(qtp_backend_create(&m->w, &o, n, 0, &be, err, sizeof err) == 0);
        CHECK(strcmp(be->ops->name, "cpu") == 0 && be->opts.num_blocks == TP_BLOCKS);
        CHECK(be->ops->block_bytes(be) == bb);
        CHECK(run_greedy(be, prompt, got, toks) == 0);
        size_t same = 0;
        const double e = rel_err(got, ref, per, &same);
        const int same_tokens = !memcmp(toks, whole_toks, sizeof toks);
        fprintf(stderr, "  %d shard%s (CPU threads in step): logits relative error %.3g (%zu of %zu identical), "
                "greedy tokens %s\n", n, n > 1 ? "s" : "", e, same, per, same_tokens ? "the same" : "DIFFER");
        CHECK(same_tokens);
        CHECK(n == 1 ? same == per : e < 1e-5);
        /* The blocks' bytes: the unsplit model's layout (each layer's K and
         * V, the shards' heads in rank order); the first 3 are full (52
         * tokens were run), the fourth's last slots never written. */
        CHECK(qbackend_read_blocks(be, first4, 4, blk) == 0);
        const double eb = rel_err(blk, blk_ref, 3 * bb / sizeof(float), &same);
        fprintf(stderr, "  %d shard%s: K/V of the prompt's blocks against the unsplit model's: relative error %.3g\n",
                n, n > 1 ? "s" : "", eb);
        CHECK(n == 1 ? same == 3 * bb / sizeof(float) : eb < 1e-5);
        /* Written to blocks 4-7 (one of them through copy_block), they decode alike. */
        CHECK(qbackend_write_blocks(be, last4, 3, blk) == 0);
        CHECK(be->ops->write_block(be, 3, (const char *)blk + 3 * bb) == 0);
        CHECK(be->ops->copy_block(be, 3, 7) == 0);
        float *a = malloc(sizeof(float) * V), *c = malloc(sizeof(float) * V);
        REQUIRE(a && c);
        const int32_t tok = 5, zero = 0;
        int32_t t_old[4] = { 0, 1, 2, 3 }, t_new[4] = { 4, 5, 6, 7 };
        qbatch_seq s_old = { 0, 1, TP_PROMPT, t_old, 4 }, s_new = { 0, 1, TP_PROMPT, t_new, 4 };
        qbatch b_old = { 1, &tok, 1, &s_old, 1, &zero, NULL, NULL, NULL, NULL, NULL }, b_new = b_old;
        b_new.seqs = &s_new;
        CHECK(be->ops->forward(be, &b_old, a) == 0 && be->ops->forward(be, &b_new, c) == 0);
        CHECK(memcmp(a, c, sizeof(float) * V) == 0);
        /* Bad calls fail alike on every rank, and the backend goes on. */
        CHECK(be->ops->copy_block(be, 0, TP_BLOCKS) == QERR_RANGE);
        int32_t bad_tok = V;
        qbatch b_bad = b_old;
        b_bad.tokens = &bad_tok;
        CHECK(be->ops->forward(be, &b_bad, a) == QERR_RANGE);
        CHECK(be->ops->forward(be, &b_old, c) == 0 && memcmp(a, c, sizeof(float) * V) == 0);
        free(a), free(c);
        qbackend_destroy(be);
    }
    qbackend *be = NULL;
    CHECK(qtp_backend_create(&m->w, &o, 3, 0, &be, err, sizeof err) == QERR_INVAL && be == NULL);
    CHECK(strstr(err, "divide by 3") != NULL);
    CHECK(qtp_backend_create(&m->w, &o, 0, 0, &be, err, sizeof err) == QERR_INVAL && be == NULL);
#ifndef QUIRE_HAVE_CUDA
    CHECK(qtp_backend_create(&m->w, &o, 2, 1, &be, err, sizeof err) == QERR_UNSUPPORTED && be == NULL);
#endif
    CHECK(qtp_group_new(0, 16) == NULL && qtp_group_new(2, 0) == NULL);
    qbackend_destroy(whole);
    free(ref), free(got), free(blk_ref), free(blk);
    qmodel_destroy(m);
}

/* A member waiting in qtp_allreduce for one that never comes is woken by
 * qtp_group_abort, with an error; later calls fail at once. */
typedef struct {
    qtp_member mem;
    float buf[4];
    int rc;
} waiter;

static void *wait_sum(void *arg)
{
    waiter *w = arg;
    w->rc = qtp_allreduce(&w->mem, w->buf, 4, NULL, NULL, 0);
    return NULL;
}

static void test_allreduce_abort(void)
{
    qtp_group *g = qtp_group_new(2, 3); /* pieces of 3 floats: 4 go in two */
    REQUIRE(g);
    waiter a = { { g, 0 }, { 1, 2, 3, 4 }, -1 }, b = { { g, 1 }, { 10, 20, 30, 40 }, -1 };
    pthread_t ta, tb;
    REQUIRE(pthread_create(&ta, NULL, wait_sum, &a) == 0 && pthread_create(&tb, NULL, wait_sum, &b) == 0);
    pthread_join(ta, NULL), pthread_join(tb, NULL);
    CHECK(a.rc == 0 && b.rc == 0 && a.buf[0] == 11 && a.buf[3] == 44 && !memcmp(a.buf, b.buf, sizeof a.buf));
    REQUIRE(pthread_create(&ta, NULL, wait_sum, &a) == 0);
    struct timespec ts = { 0, 50 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    qtp_group_abort(g);
    pthread_join(ta, NULL);
    CHECK(a.rc == QERR_DEVICE);
    CHECK(qtp_allreduce(&b.mem, b.buf, 4, NULL, NULL, 0) == QERR_DEVICE);
    qtp_group_free(g);
}

/* A rank that fails a pass before its first sum (QUIRE_TP_FAIL=r,k, the
 * test hook) leaves the others waiting in it: the group is aborted, the
 * pass fails within seconds, and so does every later call - for rank 1
 * failing while rank 0 (the caller's thread) waits, and the other way. */
static void test_rank_failure(void)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/tests/fixtures/models/tiny-llama3-random", qt_root());
    qmodel *m = NULL;
    REQUIRE(qmodel_load(path, &m, err, sizeof err) == 0);
    const int V = m->hp.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)(1 + TP_STEPS) * V);
    int32_t prompt[TP_PROMPT], toks[TP_STEPS];
    for (int i = 0; i < TP_PROMPT; i++) prompt[i] = (int32_t)((i * 31 + 5) % V);
    REQUIRE(out);
    for (int r = 1; r >= 0; r--) {
        char fail[16];
        snprintf(fail, sizeof fail, "%d,4", r);
        setenv("QUIRE_TP_FAIL", fail, 1);
        qbackend_opts o = { .n_threads = 2, .num_blocks = TP_BLOCKS, .block_size = 16 };
        qbackend *be = NULL;
        REQUIRE(qtp_backend_create(&m->w, &o, 2, 0, &be, err, sizeof err) == 0);
        unsetenv("QUIRE_TP_FAIL");
        const double t0 = q_now();
        const int rc = run_greedy(be, prompt, out, toks); /* the prefill and 2 steps, then the 4th pass fails */
        const double secs = q_now() - t0;
        fprintf(stderr, "  rank %d fails its 4th pass: the pass ends with %s after %.1f s\n", r, qerr_str(rc), secs);
        CHECK(rc == QERR_DEVICE && secs < 10);
        int32_t zero = 0, tok = 1, table[4] = { 0, 1, 2, 3 };
        qbatch_seq sq = { 0, 1, 0, table, 4 };
        qbatch b = { 1, &tok, 1, &sq, 1, &zero, NULL, NULL, NULL, NULL, NULL };
        CHECK(be->ops->forward(be, &b, out) == QERR_DEVICE); /* broken for good */
        CHECK(be->ops->copy_block(be, 0, 1) == QERR_DEVICE);
        qbackend_destroy(be);
    }
    free(out);
    qmodel_destroy(m);
}

int main(void)
{
    QT_RUN(test_llama3);
    QT_RUN(test_qwen2_biases);
    QT_RUN(test_forward_on_shards);
    QT_RUN(test_allreduce_abort);
    QT_RUN(test_rank_failure);
    QT_MAIN_END();
}
