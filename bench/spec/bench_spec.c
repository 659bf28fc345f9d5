/* bench_spec.c - speculative decoding's speed (engine.h's spec_mode): the
 * same greedy requests with drafts and without, by n-gram lookup or by a
 * draft model.
 *
 *   bench_spec [--model PATH | --random-weights CONFIG.json]
 *              [--draft PATH | --draft-random CONFIG.json] [--residual S]
 *              [--device cpu|cuda] [--threads N] [--k 1,2,4,8] [--batch 1,4,16,32,64]
 *              [--max-tokens N] [--prompt-tokens N] [--repeat N] [--exact]
 *
 * Without --draft the drafts come from n-gram lookup, and each request's
 * prompt is a random stretch of token ids said twice (text that quotes
 * itself, where lookup has something to find).  With --draft (a model
 * file) or --draft-random (a config.json filled with the same seed as the
 * target: given the target's config with fewer layers, it is the target
 * cut to its first layers, as stories260K-draft4 is stories260K) the draft
 * model proposes, from prompts of random ids.  --residual S draws random
 * models' layer output projections S times smaller (qmodel_random_ex), so
 * that a cut draft agrees more often: it sets the acceptance the figures
 * are measured at.  The model goes on greedily for
 * --max-tokens tokens (EOS ignored).  First a table against k, one request
 * at a time: tokens/s without and with drafts in every step, the speedup,
 * the share of drafts kept, the tokens a pass gave and the share of the
 * time the draft model took.  Then one against the batch size (k 4):
 * without drafts, with them as the engine runs them by default (drafts only
 * while a probe measures them faster, none from spec_max_batch sequences
 * on), and with drafts in every step whatever the batch.  Each figure is
 * the best of --repeat runs (3).  Every run's outputs are compared with the
 * run without drafts: they must be equal on the CPU and in the CUDA
 * backend's exact mode (exit status 1 otherwise); in bf16 a pass over more
 * tokens rounds differently from the one-token decode, and a near tie may
 * go the other way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "model.h"
#include "util.h"

#define MAX_LIST 16

typedef struct {
    const char *model, *random_weights, *draft, *draft_random;
    float residual;
    const qmodel *dm; /* the draft model, or NULL: n-gram drafts */
    int device, threads, max_tokens, prompt_tokens, repeat, exact;
    int k[MAX_LIST], nk, batch[MAX_LIST], nb;
} opts;

typedef struct {
    double secs;
    long long tokens;
    qengine_stats st;
    int32_t *out; /* (n, max_tokens) */
} result;

static int parse_list(const char *s, int *out)
{
    int n = 0;
    for (const char *p = s; *p && n < MAX_LIST;) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 100000) return -1;
        out[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

/* n requests at once (prompts[i], np tokens each), greedy, max_tokens each. */
static int run(const qmodel *m, const opts *o, int spec, int k, int max_batch, int always, int n, int32_t **prompts,
               int np, result *r)
{
    qengine_opts eo;
    qengine_opts_default(&eo);
    eo.device = o->device;
    eo.n_threads = o->threads;
    eo.exact = o->exact;
    eo.spec_mode = !spec ? QSPEC_NONE : o->dm ? QSPEC_DRAFT : QSPEC_NGRAM;
    eo.draft = spec ? o->dm : NULL;
    eo.spec_k = k;
    eo.spec_max_batch = max_batch;
    eo.spec_always = always;
    if (eo.max_seqs < n) eo.max_seqs = n;
    qengine *e = NULL;
    char err[512];
    if (qengine_create(m, NULL, &eo, &e, err, sizeof err)) {
        fprintf(stderr, "bench_spec: %s\n", err);
        return -1;
    }
    /* A warm-up request first (kernels, graphs, caches). */
    uint64_t *ids = calloc((size_t)n + 1, sizeof *ids);
    int *got = calloc((size_t)n + 1, sizeof *got);
    r->out = calloc((size_t)n * (size_t)o->max_tokens + 1, sizeof *r->out);
    int rc = ids && got && r->out ? 0 : -1;
    /* Then the run, repeat times: the fastest counts (short runs on a
     * shared machine vary). */
    r->secs = 1e30;
    for (int pass = 0; pass < 1 + o->repeat && !rc; pass++) {
        const int cnt = pass ? n : 1;
        memset(got, 0, sizeof *got * (size_t)n);
        qengine_stats a;
        qengine_stats_get(e, &a);
        const double t0 = q_now();
        for (int i = 0; i < cnt && !rc; i++) {
            qreq_params p = { .prompt = prompts[i], .n_prompt = np, .sp = qsample_defaults(),
                              .max_tokens = pass ? o->max_tokens : 8, .ignore_eos = 1 };
            p.sp.temperature = 0;
            if (qengine_submit(e, &p, &ids[i], err, sizeof err)) fprintf(stderr, "bench_spec: %s\n", err), rc = -1;
        }
        for (int live = 1; live > 0 && !rc;) {
            live = qengine_step(e);
            if (live < 0) rc = -1;
            qevent ev;
            while (qengine_poll(e, &ev)) {
                for (int i = 0; pass && i < cnt; i++)
                    if (ids[i] == ev.id && ev.finish == QFINISH_NONE && got[i] < o->max_tokens)
                        r->out[(size_t)i * (size_t)o->max_tokens + (size_t)got[i]++] = ev.token;
                if (ev.finish == QFINISH_ERROR) rc = -1;
                qevent_free(&ev);
            }
        }
        const double dt = q_now() - t0;
        if (pass && dt < r->secs) {
            r->secs = dt;
            qengine_stats_get(e, &r->st);
            r->st.spec_drafted -= a.spec_drafted, r->st.spec_accepted -= a.spec_accepted;
            r->st.spec_passes -= a.spec_passes, r->st.generated -= a.generated;
            r->st.draft_s -= a.draft_s;
            r->tokens = (long long)r->st.generated;
        }
    }
    free(ids);
    free(got);
    qengine_destroy(e);
    return rc;
}

static int same(const result *a, const result *b, int n, int max_tokens)
{
    return !memcmp(a->out, b->out, sizeof *a->out * (size_t)n * (size_t)max_tokens);
}

int main(int argc, char **argv)
{
    opts o = { NULL, NULL, NULL, NULL, 0, NULL, QDEVICE_CPU, 0, 128, 48, 3, 0, { 1, 2, 4, 8 }, 4, { 1, 4, 16, 32, 64 }, 5 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--model") && v) o.model = v, i++;
        else if (!strcmp(a, "--random-weights") && v) o.random_weights = v, i++;
        else if (!strcmp(a, "--draft") && v) o.draft = v, i++;
        else if (!strcmp(a, "--draft-random") && v) o.draft_random = v, i++;
        else if (!strcmp(a, "--residual") && v) bad = !((o.residual = (float)atof(v)) > 0), i++;
        else if (!strcmp(a, "--device") && v) bad = qdevice_parse(v, &o.device), i++;
        else if (!strcmp(a, "--threads") && v) o.threads = atoi(v), i++;
        else if (!strcmp(a, "--max-tokens") && v) o.max_tokens = atoi(v), i++;
        else if (!strcmp(a, "--prompt-tokens") && v) o.prompt_tokens = atoi(v), i++;
        else if (!strcmp(a, "--repeat") && v) o.repeat = atoi(v), i++;
        else if (!strcmp(a, "--exact")) o.exact = 1;
        else if (!strcmp(a, "--k") && v) bad = (o.nk = parse_list(v, o.k)) <= 0, i++;
        else if (!strcmp(a, "--batch") && v) bad = (o.nb = parse_list(v, o.batch)) <= 0, i++;
        else bad = 1;
        if (bad || o.max_tokens < 1 || o.prompt_tokens < 2 || o.repeat < 1 || (o.draft && o.draft_random)) {
            fprintf(stderr, "usage: bench_spec [--model PATH | --random-weights CONFIG.json] [--draft PATH | "
                            "--draft-random CONFIG.json] [--residual S] [--device cpu|cuda] [--threads N] [--k 1,2,4,8] "
                            "[--batch 1,4,16,32,64] [--max-tokens N] [--prompt-tokens N] [--repeat N] [--exact]\n");
            return 2;
        }
    }
    if (!o.model && !o.random_weights) o.model = "models/stories260K.gguf";
    char err[512];
    qmodel *m = NULL;
    if (o.model ? qmodel_load(o.model, &m, err, sizeof err)
                : qmodel_random_ex(o.random_weights, o.device != QDEVICE_CUDA, 1, o.residual, &m, err, sizeof err)) {
        fprintf(stderr, "bench_spec: %s\n", err);
        return 1;
    }
    qmodel *dm = NULL;
    if ((o.draft || o.draft_random) &&
        (o.draft ? qmodel_load(o.draft, &dm, err, sizeof err)
                 : qmodel_random_ex(o.draft_random, o.device != QDEVICE_CUDA, 1, o.residual, &dm, err, sizeof err))) {
        fprintf(stderr, "bench_spec: the draft model: %s\n", err);
        return 1;
    }
    o.dm = dm;
    int nmax = 1;
    for (int i = 0; i < o.nb; i++)
        if (o.batch[i] > nmax) nmax = o.batch[i];
    /* Prompts: BOS, then a random stretch said twice. */
    const int half = (o.prompt_tokens - 1) / 2, np = 1 + 2 * half;
    int32_t **prompts = calloc((size_t)nmax, sizeof *prompts);
    uint64_t x = 12345;
    for (int i = 0; i < nmax; i++) {
        prompts[i] = calloc((size_t)np, sizeof **prompts);
        prompts[i][0] = m->bos_id >= 0 ? m->bos_id : 1;
        for (int j = 0; j < half; j++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            prompts[i][1 + j] = prompts[i][1 + half + j] = 3 + (int32_t)((x >> 33) % (uint64_t)(m->hp.n_vocab - 3));
            if (dm) { /* a draft model: no repetition to find */
                x = x * 6364136223846793005ULL + 1442695040888963407ULL;
                prompts[i][1 + half + j] = 3 + (int32_t)((x >> 33) % (uint64_t)(m->hp.n_vocab - 3));
            }
        }
    }
    int fail = 0;
    if (dm)
        printf("bench_spec: %s with the draft %s%s on %s, greedy, %d-token prompts of random ids, %d tokens each",
               o.model ? o.model : o.random_weights, o.draft ? o.draft : o.draft_random, o.draft ? "" : " (same seed)",
               qdevice_name(o.device), np, o.max_tokens);
    else
        printf("bench_spec: %s on %s, n-gram drafts, greedy, %d-token prompts (a stretch said twice), %d tokens each",
               o.model ? o.model : o.random_weights, qdevice_name(o.device), np, o.max_tokens);
    if (o.residual > 0) printf(", layer outputs drawn %gx", (double)o.residual);
    printf("\n");
    result off1 = { 0 };
    if (run(m, &o, 0, 1, 1, 0, 1, prompts, np, &off1)) return 1;
    printf("\n| k | tok/s without | tok/s with drafts every step | speedup | drafts kept | tokens a pass | draft's time | same output |\n"
           "|---|---|---|---|---|---|---|---|\n");
    for (int ki = 0; ki < o.nk; ki++) {
        result r = { 0 };
        if (run(m, &o, 1, o.k[ki], 1000000, 1, 1, prompts, np, &r)) return 1;
        const int ok = same(&off1, &r, 1, o.max_tokens);
        fail |= !ok;
        printf("| %d | %.1f | %.1f | %.2fx | %.2f | %.2f | %.0f%% | %s |\n", o.k[ki], off1.tokens / off1.secs,
               r.tokens / r.secs, off1.secs / r.secs,
               r.st.spec_drafted ? (double)r.st.spec_accepted / (double)r.st.spec_drafted : 0,
               r.st.spec_passes ? (double)(r.st.spec_accepted + r.st.spec_passes) / (double)r.st.spec_passes : 0,
               100.0 * r.st.draft_s / r.secs, ok ? "yes" : "NO");
        free(r.out);
    }
    printf("\n| batch | tok/s without | with drafts as the engine runs them (probe, back-off) | speedup | drafts every step | "
           "speedup | same output |\n|---|---|---|---|---|---|---|\n");
    for (int bi = 0; bi < o.nb; bi++) {
        const int b = o.batch[bi];
        result off = { 0 }, dflt = { 0 }, any = { 0 };
        if (run(m, &o, 0, 4, 1, 0, b, prompts, np, &off) || run(m, &o, 1, 4, 0, 0, b, prompts, np, &dflt) ||
            run(m, &o, 1, 4, 1000000, 1, b, prompts, np, &any))
            return 1;
        const int ok = same(&off, &dflt, b, o.max_tokens) && same(&off, &any, b, o.max_tokens);
        fail |= !ok;
        printf("| %d | %.1f | %.1f | %.2fx | %.1f | %.2fx | %s |\n", b, off.tokens / off.secs, dflt.tokens / dflt.secs,
               off.secs / dflt.secs, any.tokens / any.secs, off.secs / any.secs, ok ? "yes" : "NO");
        free(off.out), free(dflt.out), free(any.out);
    }
    free(off1.out);
    for (int i = 0; i < nmax; i++) free(prompts[i]);
    free(prompts);
    qmodel_destroy(m);
    qmodel_destroy(dm);
    /* Equal outputs are required where the arithmetic is the same whatever
     * the batch's shape: the CPU, the CUDA backend's exact mode. */
    const int strict = o.device == QDEVICE_CPU || o.exact;
    if (fail)
        printf(strict ? "\nFAILED: outputs with drafts differ from those without\n"
                      : "\noutputs with drafts differ in places (bf16: see above; --exact compares them exactly)\n");
    return fail && strict;
}
