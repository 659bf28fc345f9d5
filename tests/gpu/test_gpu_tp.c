/* test_gpu_tp.c - tensor parallelism on GPUs: the model split between
 * devices 0 and 1 (qtp_backend_create: the all-reduce by quire's
 * peer-access kernel or NCCL, captured in the decode steps' CUDA graphs)
 * against the single-GPU CUDA backend:
 *   - exact mode (float32): logits of every position, prefilled in chunks
 *     of 64, 7 and 1, within 1e-5 relative;
 *   - bf16: within bf16 tolerance (3e-2 relative, the bound the GPU meets
 *     against the CPU);
 *   - greedy: 8 sequences decoded together for 24 steps: in exact mode
 *     the tokens (reduced on the device: rank 0's) are one GPU's; in bf16
 *     the same until a near-tie within bf16 tolerance tips (greedy_match);
 *   - the same on a random model of the Llama-3.2-1B body (4 layers);
 *   - blocks read in the unsplit layout (within tolerance of one GPU's),
 *     written back and copied, decode alike; bad calls fail and the
 *     backend goes on;
 *   - the all-reduce itself (quire's peer-access kernel and NCCL): exact
 *     float sums, the same on both ranks, and their bf16 copies, for sizes
 *     on both paths; a sum whose peer never comes ends when the group is
 *     aborted; a rank failing a pass fails it, and the backend, in seconds.
 * QUIRE_TP_P2P=0 runs it all through NCCL alone.
 * Skipped, with a message, with fewer than 2 devices or no CUDA build. */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "gpu_test.h"
#include "model.h"
#include "qerr.h"
#include "qtest.h"
#include "shard.h"
#include "util.h"
#ifdef QUIRE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "qmodels.h"
#endif

#ifdef QUIRE_HAVE_CUDA
/* One GPU (n 1) or n GPUs in step. */
static qbackend *make(qmodel *m, int n, int exact, int nb)
{
    char err[512];
    qbackend_opts o = { .num_blocks = nb, .block_size = 16, .exact = exact };
    qbackend *be = NULL;
    const int rc = n > 1 ? qtp_backend_create(&m->w, &o, n, 1, &be, err, sizeof err)
                         : cuda_backend_create(&m->w, &o, &be, err, sizeof err);
    if (rc) fprintf(stderr, "  backend (%d GPUs): %s\n", n, err);
    return be;
}

static void random_ids(int32_t *ids, int n, int V, uint64_t x)
{
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        ids[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
}

/* Logits of a 200-token sequence on 2 GPUs against 1, in three chunkings. */
static void logits_match(qmodel *m, const char *name, int exact, double tol)
{
    const int V = m->hp.n_vocab, n = 200;
    int32_t ids[200];
    random_ids(ids, n, V, 7);
    qbackend *one = make(m, 1, exact, 16), *two = make(m, 2, exact, 16);
    REQUIRE(one && two);
    float *a = logits_all(one, ids, n, V, 64);
    const int chunks[3] = { 64, 7, 1 };
    for (int k = 0; k < 3; k++) {
        float *b = logits_all(two, ids, n, V, chunks[k]);
        REQUIRE(a && b);
        const double e = logits_rel_err(a, b, (size_t)n * V);
        fprintf(stderr, "  %-40s %s, 2 GPUs against 1: logits relative error %.3g (chunks of %d)\n", name,
                exact ? "f32 " : "bf16", e, chunks[k]);
        CHECK(e < tol);
        free(b);
    }
    free(a);
    qbackend_destroy(one);
    qbackend_destroy(two);
}

/* Greedy decoding of NS sequences together, the argmax reduced on the
 * device (row_mode), each sequence its own scattered blocks. */
enum { NS = 8, NG = 24, NP = 40, PER = 8 };
static int greedy(qbackend *be, const int32_t prompts[NS][NP], int32_t out[NS][NG])
{
    int32_t tables[NS * PER], tok[NS], li[NS], rt[NS];
    uint8_t modes[NS];
    for (int i = 0; i < NS * PER; i++) tables[i] = (i * 37) % (NS * PER);
    qbatch_seq sq[NS];
    int rc = 0;
    for (int s = 0; s < NS && !rc; s++) {
        qbatch_seq q = { 0, NP - 1, 0, tables + s * PER, PER };
        qbatch b = { NP - 1, prompts[s], 1, &q, 0, NULL, NULL, NULL, NULL, NULL, NULL };
        rc = be->ops->forward(be, &b, NULL);
    }
    for (int s = 0; s < NS; s++) tok[s] = prompts[s][NP - 1], li[s] = s, modes[s] = QROW_ARGMAX;
    for (int g = 0; g < NG && !rc; g++) {
        for (int s = 0; s < NS; s++) sq[s] = (qbatch_seq){ s, 1, NP - 1 + g, tables + s * PER, PER };
        qbatch b = { NS, tok, NS, sq, NS, li, modes, rt, NULL, NULL, NULL };
        rc = be->ops->forward(be, &b, NULL);
        for (int s = 0; s < NS && !rc; s++) out[s][g] = tok[s] = rt[s];
    }
    return rc;
}

/* f32: the greedy tokens of 8 sequences decoded together (reduced on the
 * device: rank 0's) are one GPU's.  bf16: the two decode in lockstep, each
 * its own tokens, logits copied back; a sequence's tokens are the same
 * until the two part, and where they part, the two choices were within the
 * bf16 tolerance of each other in one GPU's logits (a near-tie that the
 * float rounding of the split sums tips): gap / RMS of the row < 6e-2,
 * twice the logits' tolerance. */
static void greedy_match(qmodel *m, const char *name, int exact)
{
    int32_t prompts[NS][NP], a[NS][NG], b[NS][NG];
    for (int s = 0; s < NS; s++) random_ids(prompts[s], NP, m->hp.n_vocab, 100 + (uint64_t)s);
    qbackend *one = make(m, 1, exact, NS * PER), *two = make(m, 2, exact, NS * PER);
    REQUIRE(one && two);
    if (exact) {
        CHECK(greedy(one, prompts, a) == 0);
        CHECK(greedy(two, prompts, b) == 0);
        int same = 0;
        for (int s = 0; s < NS; s++)
            for (int g = 0; g < NG; g++) same += a[s][g] == b[s][g];
        fprintf(stderr, "  %-40s f32 , 2 GPUs against 1: greedy %d of %d tokens the same (%d sequences together)\n",
                name, same, NS * NG, NS);
        CHECK(same == NS * NG);
    } else {
        const int V = m->hp.n_vocab;
        float *la = malloc(sizeof(float) * NS * V), *lb = malloc(sizeof(float) * NS * V);
        int32_t tables[NS * PER], ta[NS], tb[NS], li[NS], parted[NS];
        REQUIRE(la && lb);
        for (int i = 0; i < NS * PER; i++) tables[i] = (i * 37) % (NS * PER);
        for (int s = 0; s < NS; s++) {
            qbatch_seq q = { 0, NP - 1, 0, tables + s * PER, PER };
            qbatch pb = { NP - 1, prompts[s], 1, &q, 0, NULL, NULL, NULL, NULL, NULL, NULL };
            CHECK(one->ops->forward(one, &pb, NULL) == 0 && two->ops->forward(two, &pb, NULL) == 0);
            ta[s] = tb[s] = prompts[s][NP - 1], li[s] = s, parted[s] = -1;
        }
        int same = 0;
        double worst = 0;
        for (int g = 0; g < NG; g++) {
            qbatch_seq sq[NS];
            for (int s = 0; s < NS; s++) sq[s] = (qbatch_seq){ s, 1, NP - 1 + g, tables + s * PER, PER };
            qbatch ba = { NS, ta, NS, sq, NS, li, NULL, NULL, NULL, NULL, NULL }, bb = ba;
            bb.tokens = tb;
            REQUIRE(one->ops->forward(one, &ba, la) == 0 && two->ops->forward(two, &bb, lb) == 0);
            for (int s = 0; s < NS; s++) {
                const float *ra = la + (size_t)s * V, *rb = lb + (size_t)s * V;
                ta[s] = qrow_argmax(ra, V), tb[s] = qrow_argmax(rb, V);
                if (parted[s] >= 0) continue;
                if (ta[s] == tb[s]) {
                    same++;
                    continue;
                }
                parted[s] = g;
                double ms = 0;
                for (int v = 0; v < V; v++) ms += (double)ra[v] * ra[v];
                const double gap = (ra[ta[s]] - ra[tb[s]]) / sqrt(ms / V);
                if (gap > worst) worst = gap;
            }
        }
        int n_parted = 0;
        for (int s = 0; s < NS; s++) n_parted += parted[s] >= 0;
        fprintf(stderr,
                "  %-40s bf16, 2 GPUs against 1: greedy %d of %d tokens the same before the sequences part; %d of %d "
                "part, at gaps up to %.3g of the logits' RMS\n",
                name, same, NS * NG, n_parted, NS, worst);
        CHECK(worst < 6e-2);
        free(la), free(lb);
    }
    qbackend_destroy(one);
    qbackend_destroy(two);
}

static void test_fixture_models(void)
{
    for (int c = 0; c < N_CASES; c++) {
        qmodel *m = load(cases[c].path);
        REQUIRE(m);
        if (qmodel_case_skip(m, QHP_ALL, cases[c].path)) {
            qmodel_destroy(m);
            continue;
        }
        logits_match(m, cases[c].path, 1, 1e-5);
        logits_match(m, cases[c].path, 0, 3e-2);
        greedy_match(m, cases[c].path, 1);
        greedy_match(m, cases[c].path, 0);
        qmodel_destroy(m);
    }
}

/* Llama-3.2-1B's shapes cut to 4 layers, random weights made on the host
 * (the same values for both backends). */
static qmodel *random_1b(void)
{
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/tests/fixtures/configs/llama-3.2-1b.json", qt_root());
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg) return NULL;
    json_object_set_new(cfg, "num_hidden_layers", json_integer(4));
    char tmp[] = "/tmp/quire-tp-cfg-XXXXXX";
    const int fd = mkstemp(tmp);
    if (fd < 0 || json_dumpfd(cfg, fd, 0)) {
        json_decref(cfg);
        return NULL;
    }
    close(fd);
    json_decref(cfg);
    qmodel *m = NULL;
    if (qmodel_random(tmp, 1, 5, &m, err, sizeof err)) fprintf(stderr, "  random model: %s\n", err);
    unlink(tmp);
    return m;
}

static void test_random_1b(void)
{
    qmodel *m = random_1b();
    REQUIRE(m);
    logits_match(m, "random Llama-3.2-1B body, 4 layers", 0, 3e-2);
    greedy_match(m, "random Llama-3.2-1B body, 4 layers", 0);
    qmodel_destroy(m);
}

/* Blocks: the unsplit layout; written back and copied, they decode alike;
 * bad calls fail and the backend goes on. */
static void test_blocks(void)
{
    qmodel *m = load("tests/fixtures/models/tiny-llama3-random");
    REQUIRE(m);
    const int V = m->hp.n_vocab, n = 48;
    int32_t ids[48];
    random_ids(ids, n, V, 3);
    qbackend *one = make(m, 1, 1, 8), *two = make(m, 2, 1, 8);
    REQUIRE(one && two);
    CHECK(strcmp(two->ops->name, "cuda") == 0 && two->opts.num_blocks == 8);
    const size_t bb = one->ops->block_bytes(one);
    CHECK(two->ops->block_bytes(two) == bb);
    float *a = logits_all(one, ids, n, V, 48), *b = logits_all(two, ids, n, V, 48);
    REQUIRE(a && b);
    /* logits_all's table: blocks 2, 1, 0. */
    const int32_t blocks[3] = { 0, 1, 2 }, dst[3] = { 5, 4, 3 };
    float *ka = malloc(3 * bb), *kb = malloc(3 * bb);
    REQUIRE(ka && kb);
    CHECK(qbackend_read_blocks(one, blocks, 3, ka) == 0 && qbackend_read_blocks(two, blocks, 3, kb) == 0);
    const double e = logits_rel_err(ka, kb, 3 * bb / sizeof(float));
    fprintf(stderr, "  K/V of 48 tokens, 2 GPUs against 1 (f32): relative error %.3g\n", e);
    CHECK(e < 1e-5);
    /* Blocks 0-2 to 5, 4 (written) and 7 (written to 3, copied): the same next step. */
    CHECK(qbackend_write_blocks(two, dst, 2, kb) == 0);
    CHECK(two->ops->write_block(two, 3, (const char *)kb + 2 * bb) == 0 && two->ops->copy_block(two, 3, 7) == 0);
    const int32_t tok = 11, zero = 0;
    int32_t t_old[4] = { 2, 1, 0, 6 }, t_new[4] = { 7, 4, 5, 6 };
    float *x = malloc(sizeof(float) * V), *y = malloc(sizeof(float) * V);
    REQUIRE(x && y);
    qbatch_seq s_old = { 0, 1, n, t_old, 4 }, s_new = { 0, 1, n, t_new, 4 };
    qbatch b_old = { 1, &tok, 1, &s_old, 1, &zero, NULL, NULL, NULL, NULL, NULL }, b_new = b_old;
    b_new.seqs = &s_new;
    CHECK(two->ops->forward(two, &b_old, x) == 0 && two->ops->forward(two, &b_new, y) == 0);
    CHECK(memcmp(x, y, sizeof(float) * V) == 0);
    CHECK(two->ops->copy_block(two, 0, 8) == QERR_RANGE);
    const int32_t bad = V;
    qbatch b_bad = b_old;
    b_bad.tokens = &bad;
    CHECK(two->ops->forward(two, &b_bad, y) == QERR_RANGE);
    CHECK(two->ops->forward(two, &b_old, y) == 0 && memcmp(x, y, sizeof(float) * V) == 0);
    free(a), free(b), free(ka), free(kb), free(x), free(y);
    qbackend_destroy(one);
    qbackend_destroy(two);
    qmodel_destroy(m);
}
/* A rank that fails a pass before its first sum (QUIRE_TP_FAIL=r,k) leaves
 * the other waiting in it: the group is aborted, the pass fails within
 * seconds, every later call fails, and the backend is destroyed - also with
 * the decode steps' graphs captured before (holding NCCL's sums under
 * QUIRE_TP_P2P=0). */
static void test_rank_failure(void)
{
    qmodel *m = load("tests/fixtures/models/tiny-llama3-random");
    REQUIRE(m);
    int32_t prompts[NS][NP], out[NS][NG];
    for (int s = 0; s < NS; s++) random_ids(prompts[s], NP, m->hp.n_vocab, 40 + (uint64_t)s);
    for (int r = 1; r >= 0; r--) {
        char fail[16];
        snprintf(fail, sizeof fail, "%d,%d", r, NS + 6); /* the prefills, then the 6th decode step */
        setenv("QUIRE_TP_FAIL", fail, 1);
        qbackend *two = make(m, 2, 0, NS * PER);
        unsetenv("QUIRE_TP_FAIL");
        REQUIRE(two);
        const double t0 = q_now();
        const int rc = greedy(two, prompts, out);
        const double secs = q_now() - t0;
        fprintf(stderr, "  rank %d fails a decode step: the pass ends with %s after %.1f s\n", r, qerr_str(rc), secs);
        CHECK(rc == QERR_DEVICE && secs < 15);
        CHECK(greedy(two, prompts, out) == QERR_DEVICE);
        qbackend_destroy(two);
    }
    qmodel_destroy(m);
}

/* ---- the all-reduce itself -------------------------------------------------------------- */

typedef struct {
    cuda_tp *g;
    int rank, n_calls;
    size_t n;
    float *d;        /* on the rank's device */
    void *copy;      /* bf16 copy, or NULL */
    int rc;
} ar_job;

static void *ar_thread(void *arg)
{
    ar_job *j = arg;
    cudaSetDevice(j->rank);
    for (int k = 0; k < j->n_calls && !j->rc; k++)
        j->rc = cuda_tp_allreduce(cuda_tp_member(j->g, j->rank), j->d, j->n, NULL, j->copy, QDT_BF16);
    if (!j->rc && cudaDeviceSynchronize() != cudaSuccess) j->rc = QERR_DEVICE;
    return NULL;
}

/* Sums of 2 ranks' buffers, one thread a rank: quire's own kernel (sizes a
 * multiple of 4 up to 2^20 floats; its narrow channel below 2^16, its
 * wide one from there) and NCCL (longer, or odd sizes), each the float sum,
 * the same bits on both ranks, the bf16 copy its rounding;
 * called 3 times in a row (each time the sum of the last: 2^k times the
 * first). */
static void test_allreduce(void)
{
    char err[256];
    cuda_tp *g = NULL;
    REQUIRE(cuda_tp_create(2, &g, err, sizeof err) == 0);
    const char *pe = getenv("QUIRE_TP_P2P");
    fprintf(stderr, "  sums up to 2^20 floats by %s\n", cuda_tp_peer_sums(g) ? "quire's peer-access kernel" : "NCCL");
    CHECK(cuda_tp_peer_sums(g) == !(pe && *pe == '0')); /* the H200 pair reaches each other's memory */
    const size_t sizes[] = { 4, 4096, 3 * 4096 + 4, 65532, 65536, (size_t)1 << 20, ((size_t)1 << 20) + 4, 1001 };
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const size_t n = sizes[k];
        float *h[2], *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
        uint16_t *gotc = malloc(n * 2);
        ar_job j[2];
        pthread_t th[2];
        REQUIRE(want && got && gotc);
        for (int r = 0; r < 2; r++) {
            h[r] = malloc(n * sizeof(float));
            REQUIRE(h[r]);
            for (size_t i = 0; i < n; i++) h[r][i] = (float)((i * 2654435761u + (size_t)r * 977) % 1000) / 7.0f - 70.0f;
            j[r] = (ar_job){ g, r, 3, n, NULL, NULL, 0 };
            REQUIRE(cudaSetDevice(r) == cudaSuccess && cudaMalloc((void **)&j[r].d, n * 4) == cudaSuccess &&
                    cudaMalloc(&j[r].copy, n * 2) == cudaSuccess &&
                    cudaMemcpy(j[r].d, h[r], n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        }
        for (size_t i = 0; i < n; i++) {
            float s = 0.0f + h[0][i];
            s += h[1][i];
            want[i] = s * 4; /* the next two sums double it, exactly */
        }
        for (int r = 0; r < 2; r++) REQUIRE(pthread_create(&th[r], NULL, ar_thread, &j[r]) == 0);
        for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
        int same = 1, copies = 1;
        for (int r = 0; r < 2; r++) {
            CHECK(j[r].rc == 0);
            cudaSetDevice(r);
            REQUIRE(cudaMemcpy(got, j[r].d, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess &&
                    cudaMemcpy(gotc, j[r].copy, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
            same &= !memcmp(got, want, n * 4);
            for (size_t i = 0; i < n; i++) {
                uint32_t u;
                memcpy(&u, &want[i], 4);
                const uint16_t b = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); /* round to nearest even */
                copies &= gotc[i] == b;
            }
            cudaFree(j[r].d), cudaFree(j[r].copy);
            free(h[r]);
        }
        fprintf(stderr, "  all-reduce of %zu floats, 3 in a row: sums %s, bf16 copies %s\n", n,
                same ? "exact on both ranks" : "WRONG", copies ? "exact" : "WRONG");
        CHECK(same && copies);
        free(want), free(got), free(gotc);
    }
    /* A rank whose peer never comes: the group is aborted, the waiting sum
     * ends, and every later one fails. */
    float *d = NULL;
    REQUIRE(cudaSetDevice(0) == cudaSuccess && cudaMalloc((void **)&d, 4096 * 4) == cudaSuccess);
    cudaStream_t st;
    REQUIRE(cudaStreamCreate(&st) == cudaSuccess);
    CHECK(cuda_tp_allreduce(cuda_tp_member(g, 0), d, 4096, st, NULL, 0) == 0);
    usleep(100 * 1000);
    CHECK(cudaStreamQuery(st) == cudaErrorNotReady); /* waiting for rank 1 */
    cuda_tp_abort(g);
    CHECK(cudaStreamSynchronize(st) == cudaSuccess);
    CHECK(cuda_tp_allreduce(cuda_tp_member(g, 0), d, 4096, st, NULL, 0) == QERR_DEVICE);
    cudaStreamDestroy(st);
    cudaFree(d);
    cuda_tp_destroy(g);
}
#endif

int main(void)
{
    int skip = qt_gpu_skip();
    if (skip) return skip;
#ifdef QUIRE_HAVE_CUDA
    char err[256];
    if (cuda_device_count(err, sizeof err) < 2) return qt_skip_all("tensor parallelism needs 2 CUDA devices");
    const char *only = getenv("QUIRE_TP_TEST_FAILURE"); /* 1: the failure test alone */
    if (only && *only == '1') {
        QT_RUN(test_rank_failure);
        QT_MAIN_END();
    }
    QT_RUN(test_blocks);
    QT_RUN(test_allreduce);
    QT_RUN(test_fixture_models);
    QT_RUN(test_random_1b);
    QT_RUN(test_rank_failure);
#endif
    QT_MAIN_END();
}
