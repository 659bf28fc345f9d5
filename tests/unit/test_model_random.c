/* test_model_random.c - qmodel_random: real shapes from config.json, random
 * weights on the host or left for the device.
 *
 * Checks: every tensor of the bench/configs models has its HF shape and
 * BF16 dtype (Qwen2 biases, tied embeddings); the bench-1b/8b parameter
 * counts are the published 1.10B / 7.24B; host-filled weights are
 * deterministic in the seed, in range, and run through the CPU backend to
 * finite logits; the CPU backend refuses weights without data; bad configs
 * are errors with messages. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "arch.h"
#include "model.h"
#include "util.h"
#include "qtest.h"

static char g_tmp[256];

/* Writes text to g_tmp/name and returns the path (static buffer). */
static const char *write_tmp(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_tmp, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return path;
}

static const char *bench_config(const char *name)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/bench/configs/%s", qt_root(), name);
    return path;
}

static const char TINY[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 160, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 300, \"max_position_embeddings\": 256,"
    " \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"bos_token_id\": 1, \"eos_token_id\": [2, 3],"
    " \"tie_word_embeddings\": false}";

static const char TINY_QWEN2_TIED[] =
    "{\"model_type\": \"qwen2\", \"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 1,"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"vocab_size\": 100, \"tie_word_embeddings\": true}";

static int shape_is(const qtensor *t, int64_t d0, int64_t d1)
{
    if (t->dtype != QDT_BF16) return 0;
    if (d1) return t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1;
    return t->ndim == 1 && t->shape[0] == d0;
}

/* Every bound tensor has its shape from hp, BF16, and data present iff host. */
static void check_shapes(const qmodel *m, int host)
{
    const qhparams *hp = &m->hp;
    const qweights *w = &m->w;
    const int64_t D = hp->dim, Q = (int64_t)hp->n_heads * hp->head_dim, KV = (int64_t)hp->n_kv_heads * hp->head_dim;
    CHECK(shape_is(&w->tok_embd, hp->n_vocab, D));
    CHECK(shape_is(&w->output, hp->n_vocab, D));
    CHECK(shape_is(&w->out_norm, D, 0));
    /* (LongRoPE's factors come from config.json: always in host memory.) */
    CHECK(hp->rope_scaling == QROPE_SCALE_LONGROPE ? w->rope_freqs.data && w->rope_freqs.dtype == QDT_F32
                                                   : w->rope_freqs.ndim == 0 && !w->rope_freqs.data);
    CHECK(hp->tied_embeddings ? w->output.data == w->tok_embd.data : !host || w->output.data != w->tok_embd.data);
    CHECK(!w->tok_embd.data == !host);
    CHECK(!w->output.data == !host);
    for (int l = 0; l < hp->n_layers; l++) {
        const qlayer *L = &w->layers[l];
        CHECK(shape_is(&L->attn_norm, D, 0) && shape_is(&L->ffn_norm, D, 0));
        CHECK(shape_is(&L->wq, Q, D) && shape_is(&L->wk, KV, D) && shape_is(&L->wv, KV, D));
        CHECK(shape_is(&L->wo, D, Q));
        CHECK(shape_is(&L->w_gate, hp->ffn_dim, D) && shape_is(&L->w_up, hp->ffn_dim, D));
        CHECK(shape_is(&L->w_down, D, hp->ffn_dim));
        if (hp->attn_bias)
            CHECK(shape_is(&L->bq, Q, 0) && shape_is(&L->bk, KV, 0) && shape_is(&L->bv, KV, 0));
        else
            CHECK(L->bq.ndim == 0 && L->bk.ndim == 0 && L->bv.ndim == 0 && !L->bq.data);
        const qtensor *ts = &L->attn_norm;
        for (size_t i = 0; i < sizeof(qlayer) / sizeof(qtensor); i++)
            if (ts[i].ndim) CHECK(!ts[i].data == !host);
    }
}

static void test_bench_config_shapes(void)
{
    static const struct { const char *file; const char *family; int layers, dim, vocab, tied, bias; } cases[] = {
        { "bench-1b-v32k.json", "llama", 16, 2048, 32000, 0, 0 },
        { "bench-8b-v32k.json", "llama", 32, 4096, 32000, 0, 0 },
        { "llama-3.2-1b.json", "llama", 16, 2048, 128256, 1, 0 },
        { "llama-3.1-8b.json", "llama", 32, 4096, 128256, 0, 0 },
        { "qwen2.5-7b-instruct.json", "qwen2", 28, 3584, 152064, 0, 1 },
        { "qwen3-8b.json", "qwen3", 36, 4096, 151936, 0, 0 },
        { "gemma-3-12b-text.json", "gemma3", 48, 3840, 262208, 1, 0 },
        { "mistral-7b-instruct-v0.3.json", "mistral", 32, 4096, 32768, 0, 0 },
        { "phi-4-mini-instruct.json", "phi3", 32, 3072, 200064, 1, 0 },
    };
    char err[512];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        qmodel *m = NULL;
        int rc = qmodel_random(bench_config(cases[c].file), 0, 7, &m, err, sizeof err);
        if (rc) fprintf(stderr, "  %s: %s\n", cases[c].file, err);
        REQUIRE(rc == 0 && m);
        CHECK(!strcmp(qfamily_get(m->hp.family)->name, cases[c].family));
        CHECK_EQ_INT(m->hp.n_layers, cases[c].layers);
        CHECK_EQ_INT(m->hp.dim, cases[c].dim);
        CHECK_EQ_INT(m->hp.n_vocab, cases[c].vocab);
        CHECK_EQ_INT(m->hp.tied_embeddings, cases[c].tied);
        CHECK_EQ_INT(m->hp.attn_bias, cases[c].bias);
        CHECK(m->random_fill == QMODEL_RANDOM_DEVICE);
        CHECK(m->vocab.kind == QVOCAB_NONE);
        char want[128];
        snprintf(want, sizeof want, "random:%s", cases[c].file);
        CHECK(m->name && !strcmp(m->name, want));
        CHECK(m->bos_id >= 0 && m->n_eos >= 1);
        CHECK(strlen(m->fingerprint_hex) == 32);
        check_shapes(m, 0);
        qmodel_destroy(m);
    }
    /* The families' own shapes: Gemma 3's window and pattern, Phi-4-mini's
     * partial rotary and LongRoPE (long factors: its context passes 4,096). */
    qmodel *m = NULL;
    REQUIRE(qmodel_random(bench_config("gemma-3-12b-text.json"), 0, 7, &m, err, sizeof err) == 0);
    CHECK(m->hp.window == 1024 && m->hp.window_pattern == 6 && m->hp.rope_theta_local == 10000.0f &&
          m->hp.head_dim == 256 && m->hp.attn_scale == 0.0625f);
    qmodel_destroy(m);
    REQUIRE(qmodel_random(bench_config("phi-4-mini-instruct.json"), 0, 7, &m, err, sizeof err) == 0);
    CHECK(m->hp.rope_dim == 96 && m->hp.rope_scaling == QROPE_SCALE_LONGROPE && m->hp.rope_long &&
          m->hp.rope_orig_ctx == 4096 && fabsf(m->hp.rope_mscale - 1.1902381f) < 1e-5f);
    CHECK(((const float *)m->w.rope_freqs.data)[47] == 47.77f);
    qmodel_destroy(m);
}

static void test_param_counts(void)
{
    char err[512];
    qmodel *m = NULL;
    REQUIRE(qmodel_random(bench_config("bench-1b-v32k.json"), 0, 0, &m, err, sizeof err) == 0);
    double p = (double)qmodel_param_count(m);
    fprintf(stderr, "  bench-1b-v32k: %.4fB parameters\n", p / 1e9);
    CHECK(fabs(p - 1.10e9) <= 0.01e9);
    qmodel_destroy(m);
    REQUIRE(qmodel_random(bench_config("bench-8b-v32k.json"), 0, 0, &m, err, sizeof err) == 0);
    p = (double)qmodel_param_count(m);
    fprintf(stderr, "  bench-8b-v32k: %.4fB parameters\n", p / 1e9);
    CHECK(fabs(p - 7.24e9) <= 0.01e9);
    qmodel_destroy(m);
    /* Tied embeddings count once: Llama-3.2-1B is the published 1.24B. */
    REQUIRE(qmodel_random(bench_config("llama-3.2-1b.json"), 0, 0, &m, err, sizeof err) == 0);
    p = (double)qmodel_param_count(m);
    CHECK(fabs(p - 1.236e9) <= 0.01e9);
    qmodel_destroy(m);
}

/* Sum of |x| and min/max of a bf16 tensor. */
static void stats(const qtensor *t, double *mean_abs, float *lo, float *hi)
{
    const uint16_t *d = t->data;
    size_t n = (size_t)qt_numel(t);
    double s = 0;
    *lo = INFINITY;
    *hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        float v = q_bf16_to_f32(d[i]);
        s += fabs(v);
        if (v < *lo) *lo = v;
        if (v > *hi) *hi = v;
    }
    *mean_abs = s / (double)n;
}

static void test_host_fill(void)
{
    char err[512];
    const char *path = write_tmp("tiny.json", TINY);
    qmodel *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    REQUIRE(qmodel_random(path, 1, 11, &a, err, sizeof err) == 0);
    REQUIRE(qmodel_random(path, 1, 11, &b, err, sizeof err) == 0);
    REQUIRE(qmodel_random(path, 1, 12, &c, err, sizeof err) == 0);
    REQUIRE(qmodel_random(path, 0, 11, &d, err, sizeof err) == 0);
    check_shapes(a, 1);
    CHECK(a->random_fill == QMODEL_RANDOM_HOST);
    CHECK(a->bos_id == 1 && a->n_eos == 2 && a->eos_ids[0] == 2 && a->eos_ids[1] == 3);
    /* The same seed gives the same bytes and fingerprint; another seed, or
     * device fill, another fingerprint. */
    size_t nb = (size_t)qt_numel(&a->w.tok_embd) * 2;
    CHECK(!memcmp(a->w.tok_embd.data, b->w.tok_embd.data, nb));
    CHECK(!memcmp(a->w.layers[1].w_down.data, b->w.layers[1].w_down.data, (size_t)qt_numel(&a->w.layers[1].w_down) * 2));
    CHECK(memcmp(a->w.tok_embd.data, c->w.tok_embd.data, nb) != 0);
    CHECK(!strcmp(a->fingerprint_hex, b->fingerprint_hex));
    CHECK(strcmp(a->fingerprint_hex, c->fingerprint_hex) != 0);
    CHECK(strcmp(a->fingerprint_hex, d->fingerprint_hex) != 0);
    /* Different tensors of the same shape get different values. */
    CHECK(memcmp(a->w.layers[0].wq.data, a->w.layers[1].wq.data, (size_t)qt_numel(&a->w.layers[0].wq) * 2) != 0);
    double ma;
    float lo, hi;
    stats(&a->w.layers[0].w_gate, &ma, &lo, &hi);
    CHECK(lo >= -0.0352f && hi <= 0.0352f && ma > 0.012 && ma < 0.023); /* uniform: E|x| = 0.0175 */
    stats(&a->w.out_norm, &ma, &lo, &hi);
    CHECK(lo >= 0.97f && hi <= 1.03f);
    stats(&a->w.layers[1].ffn_norm, &ma, &lo, &hi);
    CHECK(lo >= 0.97f && hi <= 1.03f && hi > lo);
    qmodel_destroy(a);
    qmodel_destroy(b);
    qmodel_destroy(c);
    qmodel_destroy(d);
}

/* A few tokens through the CPU backend give finite, non-constant logits. */
static void forward_finite(const qmodel *m)
{
    char err[512];
    qbackend_opts o = { .n_threads = 2, .num_blocks = 4, .block_size = 16 };
    qbackend *be = NULL;
    int rc = cpu_backend_create(&m->w, &o, &be, err, sizeof err);
    if (rc) fprintf(stderr, "  cpu backend: %s\n", err);
    REQUIRE(rc == 0);
    const int V = m->hp.n_vocab;
    int32_t toks[5] = { 1, 17, 42, 5, 99 }, table[1] = { 2 }, li[2] = { 3, 4 };
    float *logits = malloc(sizeof(float) * 2 * (size_t)V);
    REQUIRE(logits);
    qbatch_seq sq = { .first = 0, .n_tokens = 5, .pos0 = 0, .block_table = table, .n_blocks = 1 };
    qbatch bt = { .n_tokens = 5, .tokens = toks, .n_seqs = 1, .seqs = &sq, .n_logits = 2, .logits_idx = li };
    CHECK(be->ops->forward(be, &bt, logits) == 0);
    int finite = 1;
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < 2 * V; i++) {
        finite &= isfinite(logits[i]) != 0;
        if (logits[i] < lo) lo = logits[i];
        if (logits[i] > hi) hi = logits[i];
    }
    CHECK(finite);
    CHECK(hi > lo);
    free(logits);
    qbackend_destroy(be);
}

static void test_cpu_forward(void)
{
    char err[512];
    qmodel *m = NULL;
    REQUIRE(qmodel_random(write_tmp("tiny.json", TINY), 1, 3, &m, err, sizeof err) == 0);
    forward_finite(m);
    qmodel_destroy(m);
    /* Qwen2 (biases) with tied embeddings. */
    REQUIRE(qmodel_random(write_tmp("qwen.json", TINY_QWEN2_TIED), 1, 3, &m, err, sizeof err) == 0);
    CHECK(m->hp.attn_bias && m->hp.tied_embeddings);
    CHECK(!qmodel_find(m, "lm_head.weight"));
    check_shapes(m, 1);
    forward_finite(m);
    qmodel_destroy(m);
    /* The newer families from their fixtures' configs: Qwen3 (QK-norm),
     * Gemma 2/3 (sandwich norms, soft-caps, windows) and Phi-3 (fused
     * tensors, LongRoPE factors from config.json). */
    static const char *const fam[] = { "qwen3", "gemma2", "gemma3", "phi3" };
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/fixtures/models/tiny-%s-random/config.json", qt_root(), fam[i]);
        int rc = qmodel_random(path, 1, 3, &m, err, sizeof err);
        if (rc) fprintf(stderr, "  %s: %s\n", fam[i], err);
        REQUIRE(rc == 0);
        CHECK(!strcmp(qfamily_get(m->hp.family)->name, fam[i]));
        forward_finite(m);
        qmodel_destroy(m);
    }
}

static void test_cpu_refuses_null_weights(void)
{
    char err[512] = "";
    qmodel *m = NULL;
    REQUIRE(qmodel_random(write_tmp("tiny.json", TINY), 0, 3, &m, err, sizeof err) == 0);
    qbackend_opts o = { .n_threads = 1, .num_blocks = 4, .block_size = 16 };
    qbackend *be = NULL;
    CHECK(cpu_backend_create(&m->w, &o, &be, err, sizeof err) == QERR_INVAL);
    CHECK(be == NULL);
    CHECK_STR_CONTAINS(err, "no data");
    qmodel_destroy(m);
}

static void test_errors(void)
{
    char err[512] = "";
    qmodel *m = (qmodel *)&m;
    char missing[600];
    snprintf(missing, sizeof missing, "%s/does-not-exist.json", g_tmp);
    CHECK(qmodel_random(missing, 0, 0, &m, err, sizeof err) == QERR_IO);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(err, "does-not-exist.json");

    CHECK(qmodel_random(write_tmp("bad.json", "{\"model_type\": \"llama\", "), 0, 0, &m, err, sizeof err) == QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "invalid JSON");
    CHECK_STR_CONTAINS(err, "bad.json");

    CHECK(qmodel_random(write_tmp("gpt2.json", "{\"model_type\": \"gpt2\", \"hidden_size\": 64}"), 0, 0, &m, err,
                        sizeof err) == QERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err, "gpt2");

    /* Every size in range on its own, 2^20 x 2^23 x 1024 layers in all. */
    const char *huge = write_tmp("huge.json",
                                 "{\"model_type\": \"llama\", \"hidden_size\": 1048576, \"intermediate_size\": 1048576,"
                                 " \"num_hidden_layers\": 1024, \"num_attention_heads\": 256, \"vocab_size\": 4000}");
    CHECK(qmodel_random(huge, 0, 0, &m, err, sizeof err) == QERR_RANGE);
    CHECK_STR_CONTAINS(err, "parameters");
    CHECK(qmodel_random(huge, 1, 0, &m, err, sizeof err) == QERR_RANGE);

    CHECK(qmodel_random(write_tmp("neg.json", "{\"model_type\": \"llama\", \"hidden_size\": -4, \"intermediate_size\": 8,"
                                              " \"num_hidden_layers\": 1, \"num_attention_heads\": 1, \"vocab_size\": 10}"),
                        0, 0, &m, err, sizeof err) == QERR_RANGE);
    CHECK_STR_CONTAINS(err, "hidden_size");
    CHECK(qmodel_random(write_tmp("arr.json", "[1, 2]"), 0, 0, &m, err, sizeof err) == QERR_FORMAT);
    CHECK(m == NULL);

    /* 0.55T parameters (1 TiB of bf16, under the 2^40 limit): more host
     * memory than any test machine has, refused before allocating; without
     * host data the same shapes are fine. */
    const char *big = write_tmp("big.json",
                                "{\"model_type\": \"llama\", \"hidden_size\": 16384, \"intermediate_size\": 65536,"
                                " \"num_hidden_layers\": 128, \"num_attention_heads\": 128, \"vocab_size\": 4000}");
    CHECK(qmodel_random(big, 1, 0, &m, err, sizeof err) == QERR_NOMEM);
    CHECK_STR_CONTAINS(err, "GiB");
    CHECK(m == NULL);
    CHECK(qmodel_random(big, 0, 0, &m, err, sizeof err) == 0);
    CHECK(m && qmodel_param_count(m) > 500000000000LL);
    qmodel_destroy(m);
}

int main(void)
{
    snprintf(g_tmp, sizeof g_tmp, "/tmp/quire-test-random-XXXXXX");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    QT_RUN(test_bench_config_shapes);
    QT_RUN(test_param_counts);
    QT_RUN(test_host_fill);
    QT_RUN(test_cpu_forward);
    QT_RUN(test_cpu_refuses_null_weights);
    QT_RUN(test_errors);
    const char *names[] = { "tiny.json", "qwen.json", "bad.json", "gpt2.json", "huge.json", "neg.json", "arr.json", "big.json" };
    char p[600];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", g_tmp, names[i]);
        unlink(p);
    }
    rmdir(g_tmp);
    QT_MAIN_END();
}
