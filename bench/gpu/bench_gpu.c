/* bench_gpu.c - the CUDA backend on real model shapes with random weights
 * (the config.json files in bench/configs), against the physical limits measured in the same
 * run: batch-1 decode time per token vs the floor (the weight bytes a step reads / copy
 * bandwidth), decode throughput at batch 1 to 256, and prefill of one long
 * prompt vs the bf16 GEMM roofline.  Timings are host clocks around whole
 * forward passes (each ends with a stream synchronisation and its output
 * - tokens, or logits into pinned memory - copied to the host), after a
 * warm-up.
 *
 * --tp 1,2 runs each configuration on one GPU and split between two
 * (tensor parallelism: qtp_backend_create), and adds a table of the
 * speedup and scaling efficiency (speedup / GPUs).
 *
 * Decode steps reduce their rows to tokens on the device, as the engine's
 * greedy and drawn rows are; --logits copies every logit back instead (the
 * tables before 2026-11-30 were measured so).
 *
 * usage: bench_gpu [--config PATH]... [--batches 1,8,64,256] [--prompt 128]
 *                  [--gen 128] [--prefill 2048] [--mem-util 0.85] [--gemv N]
 *                  [--tp 1,2] [--logits]
 * Prints a markdown table per configuration (and split). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda_info.h"
#include "model.h"
#include "shard.h"
#include "util.h"

typedef struct {
    const char *configs[8];
    int n_configs;
    int batches[16], n_batches;
    int prompt, gen, prefill;
    float mem_util;
    int gemv; /* > 0: only the projection-kernel table for this many tokens */
    int tps[4], n_tps; /* GPUs the model is split among, each in turn */
    int logits;        /* decode copies every logit back (default: tokens reduced on the device) */
} bopts;

static uint64_t rng = 0x1234;
static int32_t rand_tok(int V)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (int32_t)((rng >> 33) % (uint64_t)V);
}

static double weight_bytes(const qweights *w, double *matmul_params)
{
    const qhparams *hp = &w->hp;
    double per_layer = 0;
    const qlayer *L = &w->layers[0];
    const qtensor *ts[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) per_layer += (double)qt_numel(ts[i]);
    double mm = per_layer * hp->n_layers + (double)hp->n_vocab * hp->dim; /* + output projection */
    *matmul_params = mm;
    double embed = hp->tied_embeddings ? 0 : (double)hp->n_vocab * hp->dim;
    return 2.0 * (mm + embed);
}

/* Decode B sequences: prefill their prompts (several per pass), then time
 * gen steps of B tokens.  rows: each step's rows reduced to a token on the
 * device (QROW_ARGMAX, as the engine has its draws made), else every
 * logit copied back.  Returns seconds per step, or < 0. */
static double run_decode(qbackend *be, int V, int B, int prompt, int gen, int max_tokens, int rows)
{
    const int bs = be->opts.block_size, per = (prompt + gen + 2 + bs - 1) / bs; /* + 2 warm-up steps */
    if ((long)B * per > be->opts.num_blocks) return -2;
    int32_t *tables = malloc(sizeof(int32_t) * (size_t)B * per), *tok = malloc(sizeof(int32_t) * (size_t)max_tokens),
            *li = malloc(sizeof(int32_t) * (size_t)B);
    qbatch_seq *sq = malloc(sizeof *sq * (size_t)B);
    float *lg = qbackend_host_alloc(be, sizeof(float) * (size_t)B * V);
    uint8_t *modes = malloc((size_t)B);
    int32_t *rt = malloc(sizeof(int32_t) * (size_t)B);
    if (!tables || !tok || !li || !sq || !lg || !modes || !rt) {
        free(tables), free(tok), free(li), free(sq), qbackend_host_free(be, lg), free(modes), free(rt);
        return -1;
    }
    memset(modes, QROW_ARGMAX, (size_t)B);
    for (int i = 0; i < B * per; i++) tables[i] = i;
    int rc = 0;
    /* Prefill: as many whole prompts per pass as fit max_tokens. */
    for (int s0 = 0; s0 < B && !rc;) {
        int ns = max_tokens / prompt;
        if (ns < 1) ns = 1;
        if (ns > B - s0) ns = B - s0;
        for (int s = 0; s < ns; s++) {
            qbatch_seq q = { s * prompt, prompt, 0, tables + (size_t)(s0 + s) * per, per };
            sq[s] = q;
            for (int i = 0; i < prompt; i++) tok[s * prompt + i] = rand_tok(V);
        }
        qbatch b = { ns * prompt, tok, ns, sq, 0, NULL, NULL, NULL, NULL, NULL, NULL };
        rc = be->ops->forward(be, &b, lg);
        s0 += ns;
    }
    double t0 = 0;
    for (int g = 0; g < gen + 2 && !rc; g++) {
        if (g == 2) t0 = q_now(); /* two warm-up steps */
        for (int s = 0; s < B; s++) {
            qbatch_seq q = { s, 1, prompt + g, tables + (size_t)s * per, per };
            sq[s] = q;
            tok[s] = rand_tok(V);
            li[s] = s;
        }
        qbatch b = { B, tok, B, sq, B, li, rows ? modes : NULL, rows ? rt : NULL, NULL, NULL, NULL };
        rc = be->ops->forward(be, &b, lg);
    }
    double dt = q_now() - t0;
    free(tables), free(tok), free(li), free(sq), free(modes), free(rt);
    qbackend_host_free(be, lg);
    return rc ? -1 : dt / gen;
}

static double run_prefill(qbackend *be, int V, int n)
{
    const int bs = be->opts.block_size, nb = (n + bs - 1) / bs;
    if (nb > be->opts.num_blocks) return -2;
    int32_t *table = malloc(sizeof(int32_t) * (size_t)nb), *tok = malloc(sizeof(int32_t) * (size_t)n), li = n - 1;
    float *lg = qbackend_host_alloc(be, sizeof(float) * (size_t)V);
    if (!table || !tok || !lg) {
        free(table), free(tok), qbackend_host_free(be, lg);
        return -1;
    }
    for (int i = 0; i < nb; i++) table[i] = nb - 1 - i;
    for (int i = 0; i < n; i++) tok[i] = rand_tok(V);
    qbatch_seq sq = { 0, n, 0, table, nb };
    qbatch b = { n, tok, 1, &sq, 1, &li, NULL, NULL, NULL, NULL, NULL };
    double times[7];
    int rc = 0;
    for (int r = 0; r < 7 && !rc; r++) {
        double t0 = q_now();
        rc = be->ops->forward(be, &b, lg);
        times[r] = q_now() - t0;
    }
    free(table), free(tok);
    qbackend_host_free(be, lg);
    if (rc) return -1;
    /* median of the last five */
    for (int i = 2; i < 7; i++)
        for (int j = i + 1; j < 7; j++)
            if (times[j] < times[i]) {
                double t = times[i];
                times[i] = times[j];
                times[j] = t;
            }
    return times[4];
}

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

int main(int argc, char **argv)
{
    bopts o = { .n_configs = 0, .prompt = 128, .gen = 128, .prefill = 2048, .mem_util = 0.85f };
    o.n_batches = parse_list("1,8,32,64,128,256", o.batches, 16);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--logits")) {
            o.logits = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "bench_gpu: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--config") && o.n_configs < 8) o.configs[o.n_configs++] = v;
        else if (!strcmp(a, "--batches")) o.n_batches = parse_list(v, o.batches, 16);
        else if (!strcmp(a, "--prompt")) o.prompt = atoi(v);
        else if (!strcmp(a, "--gen")) o.gen = atoi(v);
        else if (!strcmp(a, "--prefill")) o.prefill = atoi(v);
        else if (!strcmp(a, "--mem-util")) o.mem_util = (float)atof(v);
        else if (!strcmp(a, "--gemv")) o.gemv = atoi(v);
        else if (!strcmp(a, "--tp")) o.n_tps = parse_list(v, o.tps, 4);
        else {
            fprintf(stderr, "bench_gpu: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (!o.n_configs) o.configs[o.n_configs++] = "bench/configs/bench-1b-v32k.json";
    if (!o.n_tps) o.tps[o.n_tps++] = 1;
    for (int i = 0; i < o.n_tps; i++)
        if (o.tps[i] < 1 || o.tps[i] > CUDA_TP_MAX) {
            fprintf(stderr, "bench_gpu: --tp %d: 1 to %d\n", o.tps[i], CUDA_TP_MAX);
            return 2;
        }
    char err[512], name[256] = "?";
    if (cuda_device_count(err, sizeof err) <= 0) {
        fprintf(stderr, "bench_gpu: no CUDA device (%s)\n", err);
        return 1;
    }
    cuda_device_name(0, name, sizeof name);
    double copy_tbs = 0, tflops = 0;
    if (cuda_measure_ceilings(&copy_tbs, &tflops)) {
        fprintf(stderr, "bench_gpu: measuring the ceilings failed\n");
        return 1;
    }
    printf("device: %s; measured: copy %.2f TB/s (read + write), cuBLAS bf16 8192^3 %.0f TFLOP/s\n\n", name, copy_tbs,
           tflops);
    if (o.gemv > 0) return cuda_bench_gemv(stdout, o.gemv) ? 1 : 0;
    for (int c = 0; c < o.n_configs; c++) {
        qmodel *m = NULL;
        if (qmodel_random(o.configs[c], 0, 1, &m, err, sizeof err)) {
            fprintf(stderr, "bench_gpu: %s: %s\n", o.configs[c], err);
            return 1;
        }
        int maxb = 0;
        for (int i = 0; i < o.n_batches; i++) maxb = o.batches[i] > maxb ? o.batches[i] : maxb;
        int max_tokens = o.prefill > maxb ? o.prefill : maxb;
        if (max_tokens < 2048) max_tokens = 2048;
        if (max_tokens < o.prompt) max_tokens = o.prompt; /* a prompt is prefilled in one pass */
        qbackend_opts bo = { .num_blocks = 0, .block_size = 16, .gpu_mem_util = o.mem_util, .random_weights = 1,
                             .seed = 7, .max_tokens = max_tokens };
        const int V = m->hp.n_vocab;
        double mm_params, wbytes = weight_bytes(&m->w, &mm_params);
        const qhparams *hp = &m->hp;
        double step_s[4][16] = { { 0 } }; /* seconds a decode step, per split and batch */
        for (int t = 0; t < o.n_tps; t++) {
            const int tp = o.tps[t];
            qbackend *be = NULL;
            double t0 = q_now();
            if (tp > 1 ? qtp_backend_create(&m->w, &bo, tp, 1, &be, err, sizeof err)
                       : cuda_backend_create(&m->w, &bo, &be, err, sizeof err)) {
                fprintf(stderr, "bench_gpu: %s on %d GPU%s: %s\n", o.configs[c], tp, tp > 1 ? "s" : "", err);
                return 1;
            }
            printf("### %s on %d GPU%s: %.2fB parameters, bf16 weights %.2f GB (made on the device%s in %.1f s), KV "
                   "pool %d blocks\n\n",
                   o.configs[c], tp, tp > 1 ? "s (tensor parallel)" : "", wbytes / 2e9, wbytes / 1e9, tp > 1 ? "s" : "",
                   q_now() - t0, be->opts.num_blocks);
            printf("| workload | quire | floor or roofline | quire / limit |\n|---|---|---|---|\n");
            /* The floor: the weights a step reads at the copy bandwidth -
             * every projection and the output projection, not an untied
             * embedding table (a step reads one row of it; before
             * 2026-12-07 the floor counted it whole, which credited untied
             * models with bytes no step reads); split, the layers' share
             * of each GPU, and the output projection (rank 0 gives the
             * logits). */
            const double split_bytes = 2.0 * (mm_params - (double)V * hp->dim) * (1.0 - 1.0 / tp);
            const double floor_s = (2.0 * mm_params - split_bytes) / (copy_tbs * 1e12);
            for (int i = 0; i < o.n_batches; i++) {
                const int B = o.batches[i];
                double s = run_decode(be, V, B, o.prompt, o.gen, max_tokens, !o.logits);
                step_s[t][i] = s;
                if (s < 0) {
                    printf("| decode, batch %d (tok/s) | %s | | |\n", B, s < -1.5 ? "pool too small" : "failed");
                    continue;
                }
                if (B == 1)
                    printf("| decode, batch 1: ms per token | %.3f | %.3f (weights a step reads / copy bandwidth%s) | "
                           "%.0f%% of the floor's speed |\n",
                           s * 1e3, floor_s * 1e3, tp > 1 ? ": each GPU its layers' share and the head" : "",
                           100.0 * floor_s / s);
                printf("| decode, batch %d, context %d-%d (tok/s, sum) | %.0f | | |\n", B, o.prompt, o.prompt + o.gen,
                       B / s);
                fflush(stdout);
            }
            double ps = o.prefill > 0 ? run_prefill(be, V, o.prefill) : 0;
            if (o.prefill <= 0) {
                /* --prefill 0: decode only */
            } else if (ps > 0) {
                const double n = o.prefill;
                /* projections of every token, the output projection of the last */
                double flops = 2.0 * (mm_params - (double)V * hp->dim) * n + 2.0 * V * hp->dim;
                /* q.k and p.v over the keys each token sees: all before it,
                 * or the window's on a local layer */
                double attn = 0;
                for (int l = 0; l < hp->n_layers; l++) {
                    const double w = qhp_layer_local(hp, l) ? hp->window : n;
                    const double keys = w >= n ? n * (n + 1) / 2 : w * (w + 1) / 2 + (n - w) * w;
                    attn += 4.0 * hp->n_heads * (double)hp->head_dim * keys;
                }
                double roof = (flops + attn) / (tflops * 1e12 * tp);
                printf("| prefill, %d-token prompt (tok/s) | %.0f | %.0f (GEMM roofline%s) | %.0f%% |\n", o.prefill,
                       n / ps, n / roof, tp > 1 ? " of all the GPUs" : "", 100.0 * roof / ps);
            } else {
                printf("| prefill, %d-token prompt | failed | | |\n", o.prefill);
            }
            printf("\n");
            fflush(stdout);
            qbackend_destroy(be);
        }
        /* Scaling: each split against the first (one GPU, as a rule). */
        for (int t = 1; t < o.n_tps; t++) {
            const int tp = o.tps[t], t1 = o.tps[0];
            printf("#### %s: %d GPUs against %d (tensor parallelism)\n\n", o.configs[c], tp, t1);
            printf("| workload | %d GPU%s | %d GPUs | speedup | scaling efficiency (speedup x %d / %d) |\n"
                   "|---|---|---|---|---|\n",
                   t1, t1 > 1 ? "s" : "", tp, t1, tp);
            for (int i = 0; i < o.n_batches; i++) {
                const double a = step_s[0][i], b = step_s[t][i];
                if (a <= 0 || b <= 0) continue;
                const int B = o.batches[i];
                if (B == 1)
                    printf("| decode, batch 1: ms per token | %.3f | %.3f | %.2fx | %.0f%% |\n", a * 1e3, b * 1e3,
                           a / b, 100.0 * (a / b) * t1 / tp);
                printf("| decode, batch %d (tok/s, sum) | %.0f | %.0f | %.2fx | %.0f%% |\n", B, B / a, B / b, a / b,
                       100.0 * (a / b) * t1 / tp);
            }
            printf("\n");
        }
        fflush(stdout);
        qmodel_destroy(m);
    }
    return 0;
}
