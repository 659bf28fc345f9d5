/* test_forward.c - the CPU forward pass against HF transformers.
 *
 * Fixtures (tests/fixtures, made by HF transformers; see README there):
 *   <model>.logits.json  input_ids and the float32 logits of every position;
 *   <model>.greedy.json  prompt_ids and the greedy continuation.
 * Checks: at every position, max |ours - HF| / max |HF| over the row <= 1e-4; greedy ids equal; a batch of
 * 8 different sequences gives bit-identical logits to each sequence alone
 * (and to other thread counts and prefill chunkings). */
#include <jansson.h>
#include <math.h>
#include <stdint.h>

#include "backend.h"
#include "model.h"
#include "sample.h"
#include "qmodels.h"
#include "qtest.h"

static json_t *load_json(const char *stem, const char *kind)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/%s.%s.json", qt_root(), stem, kind);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fprintf(stderr, "  %s: %s\n", path, je.text);
    return j;
}

static int32_t *json_ids(json_t *a, int *n)
{
    *n = (int)json_array_size(a);
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n + 1));
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return ids;
}

/* Runs one sequence of n tokens from position 0 on a CPU backend of the
 * given threads, in chunks of `chunk`: logits for every position (n, V). */
static float *run_all(qmodel *m, int threads, const int32_t *ids, int n, int chunk)
{
    char err[256];
    qbackend_opts o = { .n_threads = threads, .num_blocks = (n + 15) / 16 + 3, .block_size = 16 };
    qbackend *be = NULL;
    if (cpu_backend_create(&m->w, &o, &be, err, sizeof err)) return NULL;
    float *logits = logits_all(be, ids, n, m->hp.n_vocab, chunk);
    qbackend_destroy(be);
    return logits;
}

static void test_logits_match_hf(void)
{
    for (int c = 0; c < N_CASES; c++) {
        qmodel *m = load(cases[c].path);
        json_t *j = load_json(cases[c].name, "logits");
        REQUIRE(m && j);
        int n;
        int32_t *ids = json_ids(json_object_get(j, "input_ids"), &n);
        const int V = m->hp.n_vocab;
        json_t *rows = json_object_get(j, "logits");
        CHECK_EQ_INT(json_array_size(rows), n);
        float *ours = run_all(m, 2, ids, n, 64);
        REQUIRE(ours);
        /* Per position: the largest difference over the row, relative to the
         * row's largest reference logit; the worst position must be <= 1e-4.
         * (bf16-rounded RoPE frequencies gave about 1e-2 here.) */
        double worst = 0;
        int worst_t = -1;
        for (int t = 0; t < n; t++) {
            json_t *row = json_array_get(rows, (size_t)t);
            CHECK_EQ_INT(json_array_size(row), V);
            double dmax = 0, rmax = 0;
            for (int v = 0; v < V; v++) {
                double ref = json_number_value(json_array_get(row, (size_t)v));
                double d = fabs(ours[(size_t)t * V + v] - ref);
                if (!(d <= dmax)) dmax = d; /* NaN sticks */
                if (fabs(ref) > rmax) rmax = fabs(ref);
            }
            double e = rmax > 0 ? dmax / rmax : dmax;
            if (!(e <= worst)) worst = e, worst_t = t;
        }
        fprintf(stderr, "  %-40s %d positions, worst row error max|d|/max|ref| %.3g (position %d)\n",
                cases[c].path, n, worst, worst_t);
        CHECK(worst <= 1e-4);
        free(ours);
        free(ids);
        json_decref(j);
        qmodel_destroy(m);
    }
}

/* Greedy decoding of one prompt, token by token after the prefill; the
 * index of the first token that differs from want, or -1. */
static int greedy_one(qmodel *m, const int32_t *prompt, int np, const int32_t *want, int ng)
{
    const int V = m->hp.n_vocab, total = np + ng, bs = 16, nb = (total + bs - 1) / bs;
    char err[256];
    qbackend_opts o = { .n_threads = 1, .num_blocks = nb, .block_size = bs };
    qbackend *be = NULL;
    if (cpu_backend_create(&m->w, &o, &be, err, sizeof err)) {
        fprintf(stderr, "  %s\n", err);
        return 0;
    }
    int32_t *table = malloc(sizeof *table * (size_t)nb);
    for (int i = 0; i < nb; i++) table[i] = i;
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t li = np - 1;
    qbatch_seq sq = { 0, np, 0, table, nb };
    qbatch b = { np, prompt, 1, &sq, 1, &li, NULL, NULL, NULL, NULL, NULL };
    int mismatch = be->ops->forward(be, &b, logits) ? 0 : -1;
    for (int i = 0; i < ng && mismatch < 0; i++) {
        int32_t tok = qsample_argmax(logits, V);
        if (tok != want[i]) {
            mismatch = i;
            break;
        }
        qbatch_seq s1 = { 0, 1, np + i, table, nb };
        int32_t z = 0;
        qbatch b1 = { 1, &tok, 1, &s1, 1, &z, NULL, NULL, NULL, NULL, NULL };
        if (be->ops->forward(be, &b1, logits)) mismatch = i;
    }
    free(table);
    free(logits);
    qbackend_destroy(be);
    return mismatch;
}

static void test_greedy_matches_hf(void)
{
    for (int c = 0; c < N_CASES; c++) {
        qmodel *m = load(cases[c].path);
        json_t *j = load_json(cases[c].name, "greedy");
        REQUIRE(m && j);
        json_t *pa, *ga;
        int n_pairs = greedy_pair(j, 0, &pa, &ga), tokens = 0;
        for (int k = 0; k < n_pairs; k++) {
            greedy_pair(j, k, &pa, &ga);
            int np, ng;
            int32_t *prompt = json_ids(pa, &np), *want = json_ids(ga, &ng);
            int mismatch = greedy_one(m, prompt, np, want, ng);
            if (mismatch >= 0)
                fprintf(stderr, "  %s: prompt %d (%d ids): greedy differs at token %d\n", cases[c].path, k, np, mismatch);
            CHECK_EQ_INT(mismatch, -1);
            tokens += ng;
            free(prompt);
            free(want);
        }
        fprintf(stderr, "  %-40s %d prompts, %d greedy tokens equal to HF's\n", cases[c].path, n_pairs, tokens);
        json_decref(j);
        qmodel_destroy(m);
    }
}

/* Eight sequences of different lengths in one batch, each with its own
 * scattered blocks, against each alone; then as two steps (prefill, then a
 * mixed step where some sequences decode and others prefill). */
static void test_batch_invariance(void)
{
    for (int c = 0; c < N_CASES; c++) {
        qmodel *m = load(cases[c].path);
        REQUIRE(m);
        const int V = m->hp.n_vocab, S = 8, bs = 16;
        int len[8] = { 1, 5, 17, 33, 2, 48, 16, 9 };
        int32_t ids[8][48];
        uint64_t x = 12345 + (uint64_t)c;
        for (int s = 0; s < S; s++)
            for (int i = 0; i < len[s]; i++) {
                x = x * 6364136223846793005ULL + 1442695040888963407ULL;
                ids[s][i] = (int32_t)((x >> 33) % (uint64_t)V);
            }
        float *alone[8];
        for (int s = 0; s < S; s++) {
            alone[s] = run_all(m, 1, ids[s], len[s], 1000);
            REQUIRE(alone[s]);
        }
        /* All eight at once, 2 threads, blocks interleaved across sequences. */
        int total = 0, first[8];
        for (int s = 0; s < S; s++) first[s] = total, total += len[s];
        int32_t *tok = malloc(sizeof *tok * (size_t)total), *li = malloc(sizeof *li * (size_t)total);
        int32_t tables[8][4];
        int nb = 0;
        for (int k = 0; k < 4; k++)
            for (int s = 0; s < S; s++) tables[s][k] = nb++;
        qbatch_seq seqs[8];
        for (int s = 0; s < S; s++) {
            memcpy(tok + first[s], ids[s], sizeof(int32_t) * (size_t)len[s]);
            seqs[s] = (qbatch_seq){ first[s], len[s], 0, tables[s], 4 };
        }
        for (int i = 0; i < total; i++) li[i] = i;
        char err[256];
        qbackend_opts o = { .n_threads = 2, .num_blocks = nb, .block_size = bs };
        qbackend *be = NULL;
        REQUIRE(cpu_backend_create(&m->w, &o, &be, err, sizeof err) == 0);
        float *batched = malloc(sizeof(float) * (size_t)total * (size_t)V);
        qbatch b = { total, tok, S, seqs, total, li, NULL, NULL, NULL, NULL, NULL };
        CHECK(be->ops->forward(be, &b, batched) == 0);
        int same = 1;
        for (int s = 0; s < S; s++)
            same &= !memcmp(alone[s], batched + (size_t)first[s] * V, sizeof(float) * (size_t)len[s] * (size_t)V);
        CHECK(same);

        /* Mixed step: the first half of each sequence, then the rest of every
         * sequence together (decodes and prefill chunks side by side). */
        int half[8], n1 = 0, n2 = 0;
        for (int s = 0; s < S; s++) half[s] = len[s] > 1 ? len[s] - (len[s] > 4 ? len[s] / 2 : 1) : 1;
        qbatch_seq s1[8], s2[8];
        int k1 = 0, k2 = 0;
        for (int s = 0; s < S; s++) {
            memcpy(tok + n1, ids[s], sizeof(int32_t) * (size_t)half[s]);
            s1[k1++] = (qbatch_seq){ n1, half[s], 0, tables[s], 4 };
            n1 += half[s];
        }
        qbatch b1 = { n1, tok, k1, s1, 0, li, NULL, NULL, NULL, NULL, NULL };
        CHECK(be->ops->forward(be, &b1, NULL) == 0);
        int32_t idx2[48 * 8], owner[48 * 8], pos[48 * 8];
        for (int s = 0; s < S; s++) {
            if (len[s] == half[s]) continue;
            int rest = len[s] - half[s];
            memcpy(tok + n2, ids[s] + half[s], sizeof(int32_t) * (size_t)rest);
            s2[k2++] = (qbatch_seq){ n2, rest, half[s], tables[s], 4 };
            for (int i = 0; i < rest; i++) owner[n2 + i] = s, pos[n2 + i] = half[s] + i;
            n2 += rest;
        }
        for (int i = 0; i < n2; i++) idx2[i] = i;
        qbatch b2 = { n2, tok, k2, s2, n2, idx2, NULL, NULL, NULL, NULL, NULL };
        CHECK(be->ops->forward(be, &b2, batched) == 0);
        same = 1;
        for (int i = 0; i < n2; i++)
            same &= !memcmp(alone[owner[i]] + (size_t)pos[i] * V, batched + (size_t)i * V, sizeof(float) * (size_t)V);
        CHECK(same);

        for (int s = 0; s < S; s++) free(alone[s]);
        free(tok);
        free(li);
        free(batched);
        qbackend_destroy(be);
        qmodel_destroy(m);
    }
}

/* Bad batches are refused with an error, not a crash. */
static void test_bad_batches(void)
{
    qmodel *m = load(cases[0].path);
    REQUIRE(m);
    char err[256];
    qbackend_opts o = { .n_threads = 1, .num_blocks = 2, .block_size = 16 };
    qbackend *be = NULL;
    REQUIRE(cpu_backend_create(&m->w, &o, &be, err, sizeof err) == 0);
    float logits[512];
    int32_t table[2] = { 0, 1 }, bad_table[2] = { 0, 7 }, tok[2] = { 1, 2 }, badtok[1] = { 512 }, li[1] = { 0 };
    qbatch_seq sq = { 0, 2, 0, table, 2 };
    qbatch b = { 2, tok, 1, &sq, 1, li, NULL, NULL, NULL, NULL, NULL };
    CHECK(be->ops->forward(be, &b, logits) == 0);
    qbatch bt = { 1, badtok, 1, &(qbatch_seq){ 0, 1, 0, table, 2 }, 1, li, NULL, NULL, NULL, NULL, NULL };
    CHECK(be->ops->forward(be, &bt, logits) == QERR_RANGE);
    qbatch bb = { 1, tok, 1, &(qbatch_seq){ 0, 1, 20, bad_table, 2 }, 1, li, NULL, NULL, NULL, NULL, NULL };
    CHECK(be->ops->forward(be, &bb, logits) == QERR_RANGE);
    qbatch bp = { 1, tok, 1, &(qbatch_seq){ 0, 1, 40, table, 2 }, 1, li, NULL, NULL, NULL, NULL, NULL };
    CHECK(be->ops->forward(be, &bp, logits) == QERR_RANGE); /* needs a third block */
    qbatch bc = { 2, tok, 1, &(qbatch_seq){ 0, 1, 0, table, 2 }, 1, li, NULL, NULL, NULL, NULL, NULL };
    CHECK(be->ops->forward(be, &bc, logits) == QERR_INVAL); /* tokens not covered */
    int32_t li_bad[1] = { 5 };
    qbatch bl = { 2, tok, 1, &sq, 1, li_bad, NULL, NULL, NULL, NULL, NULL };
    CHECK(be->ops->forward(be, &bl, logits) == QERR_INVAL);
    qbackend_opts z = { .n_threads = 1, .num_blocks = 0, .block_size = 16 };
    qbackend *be2 = NULL;
    CHECK(cpu_backend_create(&m->w, &z, &be2, err, sizeof err) == QERR_INVAL);
    CHECK(be2 == NULL);
    qbackend_destroy(be);
    qmodel_destroy(m);
}

/* Block copy and read/write round-trip. */
/* Greedy rows reduced by the backend: the same ids as qsample_argmax on the
 * logits, and the other rows untouched by the option. */
static void test_row_argmax(void)
{
    qmodel *m = load(cases[0].path);
    REQUIRE(m);
    char err[256];
    qbackend_opts o = { .n_threads = 2, .num_blocks = 4, .block_size = 16 };
    qbackend *be = NULL;
    REQUIRE(cpu_backend_create(&m->w, &o, &be, err, sizeof err) == 0);
    const int V = m->hp.n_vocab;
    int32_t table[4] = { 2, 0, 3, 1 }, tok[5] = { 1, 40, 77, 300, 12 }, li[3] = { 1, 3, 4 }, ids[3] = { -1, -1, -1 };
    uint8_t rows[3] = { 1, 0, 1 };
    qbatch_seq sq = { 0, 5, 0, table, 4 };
    float *lg = malloc(sizeof(float) * 3 * (size_t)V);
    qbatch b = { 5, tok, 1, &sq, 3, li, rows, ids, NULL, NULL, NULL };
    REQUIRE(be->ops->forward(be, &b, lg) == 0);
    CHECK_EQ_INT(ids[0], qsample_argmax(lg, V));
    CHECK_EQ_INT(ids[2], qsample_argmax(lg + 2 * (size_t)V, V));
    float t[4] = { NAN, 2.0f, 5.0f, 5.0f }, u[3] = { NAN, NAN, NAN }, w[3] = { -INFINITY, -INFINITY, -INFINITY };
    uint8_t drawn[3] = { 1, QROW_SAMPLE, 1 };
    const qrow_sample one = { .temperature = 1.0f, .top_p = 1.0f, .u = 0.5 };
    qrow_sample rs[3] = { one, one, one };
    qbatch bd = { 5, tok, 1, &sq, 3, li, drawn, ids, rs, NULL, NULL };
    CHECK(be->ops->forward(be, &bd, lg) == QERR_UNSUPPORTED); /* the CPU backend draws on the host */
    CHECK_EQ_INT(qrow_argmax(t, 4), 2);
    CHECK_EQ_INT(qrow_argmax(u, 3), 0);
    CHECK_EQ_INT(qrow_argmax(w, 3), 0);
    free(lg);
    qbackend_destroy(be);
    qmodel_destroy(m);
}

static void test_block_ops(void)
{
    qmodel *m = load(cases[0].path);
    REQUIRE(m);
    char err[256];
    qbackend_opts o = { .n_threads = 1, .num_blocks = 4, .block_size = 16 };
    qbackend *be = NULL;
    REQUIRE(cpu_backend_create(&m->w, &o, &be, err, sizeof err) == 0);
    int32_t table[1] = { 2 }, tok[16], li[1] = { 15 };
    for (int i = 0; i < 16; i++) tok[i] = 1 + i * 7;
    float l1[512], l2[512];
    qbatch_seq sq = { 0, 16, 0, table, 1 };
    qbatch b = { 16, tok, 1, &sq, 1, li, NULL, NULL, NULL, NULL, NULL };
    CHECK(be->ops->forward(be, &b, l1) == 0);
    size_t n = be->ops->block_bytes(be);
    CHECK(n == 2u * 5 * 4 * 16 * 8 * 4);
    char *buf = malloc(n), *buf2 = malloc(n);
    CHECK(be->ops->read_block(be, 2, buf) == 0);
    CHECK(be->ops->copy_block(be, 2, 0) == 0);
    CHECK(be->ops->read_block(be, 0, buf2) == 0);
    CHECK(!memcmp(buf, buf2, n));
    CHECK(be->ops->write_block(be, 3, buf) == 0);
    /* Decoding one more token from block 3's copy gives the same logits as
     * from the original block. */
    int32_t t17[1] = { 5 }, z[1] = { 0 }, tab_a[2] = { 2, 1 }, tab_b[2] = { 3, 1 };
    qbatch_seq sa = { 0, 1, 16, tab_a, 2 }, sb = { 0, 1, 16, tab_b, 2 };
    qbatch ba = { 1, t17, 1, &sa, 1, z, NULL, NULL, NULL, NULL, NULL }, bb = { 1, t17, 1, &sb, 1, z, NULL, NULL, NULL, NULL, NULL };
    CHECK(be->ops->forward(be, &ba, l1) == 0);
    CHECK(be->ops->forward(be, &bb, l2) == 0);
    CHECK(!memcmp(l1, l2, sizeof l1));
    CHECK(be->ops->copy_block(be, 9, 0) == QERR_RANGE);
    CHECK(be->ops->read_block(be, -1, buf) == QERR_RANGE);
    free(buf);
    free(buf2);
    qbackend_destroy(be);
    qmodel_destroy(m);
}

int main(void)
{
    QT_RUN(test_logits_match_hf);
    QT_RUN(test_greedy_matches_hf);
    QT_RUN(test_batch_invariance);
    QT_RUN(test_bad_batches);
    QT_RUN(test_row_argmax);
    QT_RUN(test_block_ops);
    QT_MAIN_END();
}
