/* test_shard.c - tensor parallelism's split of a model (engine/shard.h).
 *
 * For the fixture Llama-3 (8 heads, 2 KV heads, MLP 344) and Qwen2 (biases)
 * and 1, 2 and 4 shards (as far as the heads divide), in double precision:
 * each shard's Q/K/V rows are its heads' rows of the model's (the
 * concatenation over the shards is the model's projection, bit for bit),
 * the sum over the shards of their output projections of their heads'
 * attention is the model's, and the same for the MLP (gate/up rows, SwiGLU,
 * down columns, summed) - the all-reduce that makes n shards the model.
 * Bad splits are refused with messages.  And the whole forward: the CPU
 * backend on each of n shards, n threads in step through qtp_allreduce,
 * gives the model's logits (n = 1 bit for bit; n = 2 within float
 * rounding) and the same greedy tokens over a prefill and 12 decode steps. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* One shard's (or the model's) run: a prefill of TP_PROMPT tokens, then
 * TP_STEPS greedy decode steps; logits of the prompt's last token and of
 * each step to out ((1 + TP_STEPS) * V), the greedy tokens to toks. */
typedef struct {
    const qweights *w;
    qtp_member *member; /* NULL: unsplit */
    const int32_t *prompt;
    float *out;
    int32_t toks[TP_STEPS];
    int rc;
} tp_run;

static void *tp_thread(void *arg)
{
    tp_run *r = arg;
    char err[256];
    qbackend_opts o = { .n_threads = 1, .num_blocks = 8, .block_size = 16 };
    if (r->member) o.allreduce = qtp_allreduce, o.allreduce_ctx = r->member;
    qbackend *be = NULL;
    if ((r->rc = cpu_backend_create(r->w, &o, &be, err, sizeof err))) {
        fprintf(stderr, "  backend: %s\n", err);
        return NULL;
    }
    const int V = r->w->hp.n_vocab;
    int32_t table[8] = { 0, 1, 2, 3, 4, 5, 6, 7 }, li = TP_PROMPT - 1;
    qbatch_seq sq = { 0, TP_PROMPT, 0, table, 8 };
    qbatch b = { TP_PROMPT, r->prompt, 1, &sq, 1, &li, NULL, NULL, NULL, NULL, NULL };
    r->rc = be->ops->forward(be, &b, r->out);
    for (int step = 0; step < TP_STEPS && !r->rc; step++) {
        const float *lg = r->out + (size_t)step * V;
        int32_t best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        r->toks[step] = best;
        int32_t zero = 0;
        qbatch_seq sd = { 0, 1, TP_PROMPT + step, table, 8 };
        qbatch bd = { 1, &r->toks[step], 1, &sd, 1, &zero, NULL, NULL, NULL, NULL, NULL };
        r->rc = be->ops->forward(be, &bd, r->out + (size_t)(step + 1) * V);
    }
    qbackend_destroy(be);
    return NULL;
}

static void test_forward_on_shards(void)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/tests/fixtures/models/tiny-llama3-random", qt_root());
    qmodel *m = NULL;
    REQUIRE(qmodel_load(path, &m, err, sizeof err) == 0);
    const int V = m->hp.n_vocab, D = m->hp.dim;
    const size_t per = (size_t)(1 + TP_STEPS) * V;
    int32_t prompt[TP_PROMPT];
    for (int i = 0; i < TP_PROMPT; i++) prompt[i] = (int32_t)((i * 7919 + 13) % V);
    tp_run whole = { &m->w, NULL, prompt, malloc(sizeof(float) * per), { 0 }, 0 };
    REQUIRE(whole.out);
    tp_thread(&whole);
    REQUIRE(whole.rc == 0);
    for (int n = 1; n <= 2; n++) {
        qshard s[2];
        qtp_member mem[2];
        tp_run runs[2];
        pthread_t th[2];
        /* A small piece (less than a pass's floats) so that the all-reduce goes in pieces too. */
        qtp_group *g = qtp_group_new(n, (size_t)D * 3 + 5);
        REQUIRE(g);
        for (int r = 0; r < n; r++) {
            REQUIRE(qshard_make(&m->w, r, n, &s[r], err, sizeof err) == 0);
            mem[r] = (qtp_member){ g, r };
            runs[r] = (tp_run){ &s[r].w, &mem[r], prompt, malloc(sizeof(float) * per), { 0 }, 0 };
            REQUIRE(runs[r].out);
        }
        for (int r = 0; r < n; r++) REQUIRE(pthread_create(&th[r], NULL, tp_thread, &runs[r]) == 0);
        for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
        double num = 0, den = 0;
        size_t same_bits = 0, ranks_equal = 1;
        for (size_t i = 0; i < per; i++) {
            const double a = runs[0].out[i], b = whole.out[i];
            num += (a - b) * (a - b), den += b * b;
            same_bits += memcmp(&runs[0].out[i], &whole.out[i], sizeof(float)) == 0;
            if (n == 2) ranks_equal &= memcmp(&runs[0].out[i], &runs[1].out[i], sizeof(float)) == 0;
        }
        const int same_tokens = !memcmp(runs[0].toks, whole.toks, sizeof whole.toks);
        fprintf(stderr,
                "  %d shard%s, CPU threads in step: logits relative error %.3g (%zu of %zu identical), greedy tokens %s, "
                "ranks %s\n",
                n, n > 1 ? "s" : "", sqrt(num / den), same_bits, per, same_tokens ? "the same" : "DIFFER",
                ranks_equal ? "agree" : "DIFFER");
        CHECK(runs[0].rc == 0 && (n < 2 || runs[1].rc == 0));
        CHECK(same_tokens && ranks_equal);
        CHECK(n == 1 ? same_bits == per : sqrt(num / den) < 1e-5);
        for (int r = 0; r < n; r++) free(runs[r].out), qshard_free(&s[r]);
        qtp_group_free(g);
    }
    CHECK(qtp_group_new(0, 16) == NULL && qtp_group_new(2, 0) == NULL);
    free(whole.out);
    qmodel_destroy(m);
}

int main(void)
{
    QT_RUN(test_llama3);
    QT_RUN(test_qwen2_biases);
    QT_RUN(test_forward_on_shards);
    QT_MAIN_END();
}
