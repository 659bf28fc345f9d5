/* bench_grammar.c - the grammar module over a directory of schemas in
 * MaskBench's format ({"schema", "tests": [{"data", "valid"}]}, one file
 * each; JSONSchemaBench's files or ../shared/schemas/maskbench):
 *
 *   bench_grammar [DIR] [--tokenizer tokenizer.json]
 *                        [--model PATH | --random-weights CONFIG.json]
 *                        [--device cpu|cuda] [--threads N] [--requests N] [--max-tokens N] [--rounds N] [--only-e2e]
 *                        [--list-refused]  (each refused file and its reason, on stderr)
 *                        (DIR default ../shared/schemas/maskbench)
 *
 * For every schema, in full mode (GRAM_SCHEMA_FULL: JSON Schema's own
 * meaning, which the tests' verdicts follow): compiled or refused (the
 * reasons are counted); for each test instance, its compact JSON text
 * (integral numbers written as integers) fed byte by byte: a valid one must
 * be accepted to the end and complete, an invalid one refused before it
 * ends.  Then in strict mode (schema.h, the server's default) the same,
 * reported beside: a valid instance with a key its schema does not list is
 * refused there by design, so strict mode's counts are not failures.
 * Prints a table per subset (the file name up to its last '_' or "---"),
 * the reasons, the instances that went wrong in full mode (first 20), and
 * the compile time (median, p99, full mode).  With a tokenizer, each instance is also produced token by token
 * from the masks alone (at each step the longest token the mask allows that
 * continues the text): valid ones must come out whole, invalid ones must
 * get stuck; every mask is timed (median, p99).
 *
 * With a model (a file, or random weights of a config with --tokenizer's
 * vocabulary), end to end: N requests (default 32) at temperature 1, each
 * guided by one of N schemas spread over the set, run together through the
 * engine (continuous batching, masks made during the forward pass); then
 * the same requests without a grammar, each made to produce exactly the
 * tokens its guided twin did (ignore_eos, max_tokens = that count).  Prints
 * tokens/s of each run: guided with grammars met for the first time (their
 * token classes made on the way); then, taking turns for --rounds rounds
 * (default 3), guided again (as a server's grammar cache has them) and free;
 * the best of each, each round's ratio, and the slowdown against free. */
#define _GNU_SOURCE
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "gram.h"
#include "schema.h"
#include "tokenizer.h"
#include "util.h"

typedef struct {
    char name[64];
    int files, compiled, valid, valid_ok, invalid, invalid_ok;
    int s_compiled, s_valid, s_valid_ok, s_invalid, s_invalid_ok; /* strict mode */
} subset;

static subset g_sub[256];
static int g_nsub;
static struct {
    char why[160];
    int n;
} g_why[512];
static int g_nwhy;

static subset *sub_of(const char *file)
{
    char name[64];
    snprintf(name, sizeof name, "%s", file);
    char *cut = strstr(name, "---");
    if (cut) *cut = 0;
    else if ((cut = strrchr(name, '_'))) *cut = 0;
    for (int i = 0; i < g_nsub; i++)
        if (!strcmp(g_sub[i].name, name)) return &g_sub[i];
    if (g_nsub == 256) return &g_sub[255];
    snprintf(g_sub[g_nsub].name, sizeof g_sub[0].name, "%s", name);
    return &g_sub[g_nsub++];
}

static void count_why(const char *err)
{
    char w[160];
    snprintf(w, sizeof w, "%.150s", err);
    char *at = strstr(w, " (at ");
    if (at) *at = 0;
    /* One bucket a keyword or format, whatever the schema. */
    char *q = strchr(w, '\'');
    if (q && !strncmp(w, "$ref", 4)) *q = 0;
    for (int i = 0; i < g_nwhy; i++)
        if (!strcmp(g_why[i].why, w)) {
            g_why[i].n++;
            return;
        }
    if (g_nwhy < 512) {
        snprintf(g_why[g_nwhy].why, sizeof g_why[0].why, "%s", w);
        g_why[g_nwhy++].n = 1;
    }
}

/* Integral reals become integers (1.0 is an integer in JSON Schema). */
static json_t *normal(json_t *v)
{
    if (json_is_real(v)) {
        const double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9e15) return json_integer((json_int_t)d);
        return json_incref(v);
    }
    if (json_is_array(v)) {
        json_t *a = json_array();
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) json_array_append_new(a, normal(x));
        return a;
    }
    if (json_is_object(v)) {
        json_t *o = json_object();
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) json_object_set_new(o, k, normal(x));
        return o;
    }
    return json_incref(v);
}

/* 1 when the grammar takes text whole. */
/* 1 when g takes text whole; else 0, with *stuck the bytes it took. */
static int accepts_at(const gram *g, const char *text, size_t *stuck)
{
    gram_m *m = gram_m_new(g);
    const size_t n = strlen(text);
    size_t i = 0;
    while (m && i < n && gram_m_feed(m, (const uint8_t *)text + i, 1) == 0) i++;
    const int ok = m && i == n && gram_m_can_end(m);
    gram_m_free(m);
    if (stuck) *stuck = i;
    return ok;
}
static int accepts(const gram *g, const char *text) { return accepts_at(g, text, NULL); }

/* Strict mode's counts for doc into s: compiled, valid instances taken,
 * invalid ones refused (bytes only). */
static void strict_counts(subset *s, const json_t *doc)
{
    gram *g = NULL;
    char err[800];
    if (gram_schema_compile_opts(json_object_get(doc, "schema"), 0, &g, err, sizeof err)) return;
    s->s_compiled++;
    size_t k;
    json_t *t;
    json_array_foreach(json_object_get(doc, "tests"), k, t)
    {
        json_t *data = normal(json_object_get(t, "data"));
        char *text = gram_json_text(data);
        json_decref(data);
        if (!text) continue;
        const int ok = accepts(g, text);
        if (json_is_true(json_object_get(t, "valid"))) s->s_valid++, s->s_valid_ok += ok;
        else s->s_invalid++, s->s_invalid_ok += !ok;
        free(text);
    }
    gram_free(g);
}

/* ---- token by token ----------------------------------------------------------- */

static qtok *g_tok;
static gram_vocab *g_gv;
static int g_nv, g_maxlen;
static char **g_tb;         /* token bytes by id */
static int *g_tl;
static struct {
    uint64_t h;
    int id;
} *g_map;                   /* bytes -> id, open addressing */
static size_t g_mcap;
static double *g_mt;        /* mask times */
static size_t g_nmt, g_cmt;
static double *g_ft;        /* times to feed a token to the matcher */
static size_t g_nft, g_cft;

static uint64_t bytes_hash(const char *s, int n)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    for (int i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h | 1;
}

static int lookup(const char *s, int n)
{
    const uint64_t h = bytes_hash(s, n);
    for (size_t j = h & (g_mcap - 1); g_map[j].h; j = (j + 1) & (g_mcap - 1))
        if (g_map[j].h == h && g_tl[g_map[j].id] == n && !memcmp(g_tb[g_map[j].id], s, (size_t)n)) return g_map[j].id;
    return -1;
}

static int load_tokenizer(const char *path)
{
    char err[256], buf[1024];
    if (qtok_load_json(path, &g_tok, err, sizeof err) || qengine_grammar_vocab(g_tok, &g_gv)) {
        fprintf(stderr, "bench_grammar: %s: %s\n", path, err);
        return 1;
    }
    g_nv = qtok_vocab_size(g_tok);
    g_tb = calloc((size_t)g_nv, sizeof *g_tb);
    g_tl = calloc((size_t)g_nv, sizeof *g_tl);
    for (g_mcap = 1024; g_mcap < (size_t)g_nv * 2; g_mcap *= 2) {
    }
    g_map = calloc(g_mcap, sizeof *g_map);
    for (int i = 0; i < g_nv; i++) {
        const int l = qtok_token_bytes(g_tok, i, buf, sizeof buf);
        if (l <= 0 || qtok_is_special(g_tok, i)) continue;
        g_tb[i] = malloc((size_t)l);
        memcpy(g_tb[i], buf, (size_t)l);
        g_tl[i] = l;
        if (l > g_maxlen) g_maxlen = l;
        if (lookup(buf, l) >= 0) continue; /* two ids, one string: the first */
        const uint64_t h = bytes_hash(buf, l);
        size_t j = h & (g_mcap - 1);
        while (g_map[j].h) j = (j + 1) & (g_mcap - 1);
        g_map[j].h = h, g_map[j].id = i;
    }
    return 0;
}

/* 1 when text comes out whole, token by token, from g's masks. */
static int by_tokens(const gram *g, const char *text, uint32_t *mask)
{
    gram_m *m = gram_m_new(g);
    if (!m) return 0;
    const int n = (int)strlen(text);
    int at = 0, ok = 1;
    while (ok && at < n) {
        const double t0 = q_now();
        if (gram_m_mask(m, g_gv, mask)) {
            ok = 0;
            break;
        }
        if (g_nmt == g_cmt) g_mt = realloc(g_mt, sizeof *g_mt * (g_cmt = g_cmt ? g_cmt * 2 : 65536));
        g_mt[g_nmt++] = q_now() - t0;
        int pick = -1, l = n - at < g_maxlen ? n - at : g_maxlen;
        for (; l > 0 && pick < 0; l--) {
            const int id = lookup(text + at, l);
            if (id >= 0 && ((mask[id / 32] >> (id % 32)) & 1)) pick = id;
        }
        const double t1 = q_now();
        if (pick < 0 || gram_m_feed_token(m, g_gv, pick)) {
            ok = 0;
        } else {
            at += g_tl[pick];
            if (g_nft == g_cft) g_ft = realloc(g_ft, sizeof *g_ft * (g_cft = g_cft ? g_cft * 2 : 65536));
            g_ft[g_nft++] = q_now() - t1;
        }
    }
    ok = ok && gram_m_can_end(m);
    gram_m_free(m);
    return ok;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- end to end ------------------------------------------------------------------------ */

typedef struct {
    const char *model, *random_weights;
    int device, threads, n_req, max_tokens, rounds;
} e2e_opts;

static int g_e2e_errors;

/* The engine's mask timings over a run. */
typedef struct {
    double wait, work, slowest, span;
    double step, forward, after, feed; /* the engine's steps; the backend's passes, the work after them, grammars' feeds within them */
} mask_times;

/* Runs n requests to the end: the seconds it took, each one's output
 * tokens in got[], the engine's mask timings in *mt. */
static double run_all(qengine *e, qreq_params *ps, int n, int *got, mask_times *mt)
{
    qengine_stats a, b;
    qengine_stats_get(e, &a);
    uint64_t *ids = calloc((size_t)n, sizeof *ids);
    char err[256];
    const double t0 = q_now();
    for (int i = 0; i < n; i++)
        if (qengine_submit(e, &ps[i], &ids[i], err, sizeof err)) fprintf(stderr, "bench_grammar: %s\n", err);
    for (int live = 1; live > 0;) {
        live = qengine_step(e);
        qevent ev;
        while (qengine_poll(e, &ev)) {
            if (ev.finish != QFINISH_NONE)
                for (int i = 0; i < n; i++)
                    if (ids[i] == ev.id) got[i] = ev.completion_tokens;
            if (ev.finish == QFINISH_ERROR) fprintf(stderr, "bench_grammar: a request ended in error\n"), g_e2e_errors++;
            qevent_free(&ev);
        }
        if (live < 0) {
            fprintf(stderr, "bench_grammar: the engine failed (%d)\n", live);
            break;
        }
    }
    const double dt = q_now() - t0;
    qengine_stats_get(e, &b);
    *mt = (mask_times){ b.mask_wait_s - a.mask_wait_s, b.mask_work_s - a.mask_work_s,
                        b.mask_slowest_s - a.mask_slowest_s, b.mask_span_s - a.mask_span_s,
                        b.step_s - a.step_s, b.forward_s - a.forward_s, b.after_s - a.after_s, b.feed_s - a.feed_s };
    free(ids);
    return dt;
}

static int end_to_end(const char *dir, char **files, int nf, const e2e_opts *o)
{
    char err[800];
    qmodel *m = NULL;
    qtok *tok = NULL;
    int rc = o->model ? qmodel_load(o->model, &m, err, sizeof err)
                      : qmodel_random(o->random_weights, o->device != QDEVICE_CUDA, 1, &m, err, sizeof err);
    if (!rc && o->model) rc = qtok_for_model(m, &tok, err, sizeof err);
    if (rc) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        qmodel_destroy(m);
        return 1;
    }
    const qtok *t = o->model ? tok : g_tok;
    gram_vocab *gv = NULL;
    if (!t || qengine_grammar_vocab(t, &gv) || gram_vocab_size(gv) > m->hp.n_vocab) {
        fprintf(stderr, "bench_grammar: the end-to-end run needs a tokenizer no larger than the model's vocabulary "
                        "(--tokenizer with --random-weights)\n");
        qmodel_destroy(m);
        return 1;
    }
    /* The schemas: n spread evenly over the set, each the next one that compiles. */
    const int n = o->n_req;
    gram **gs = calloc((size_t)n, sizeof *gs);
    int ng = 0;
    for (int k = 0, i = 0; k < n; k++) {
        if (i < (int)((long long)k * nf / n)) i = (int)((long long)k * nf / n);
        for (; i < nf && ng == k; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, files[i]);
            json_t *doc = json_load_file(path, 0, NULL);
            if (doc && !gram_schema_compile(json_object_get(doc, "schema"), &gs[ng], err, sizeof err)) ng++;
            json_decref(doc);
        }
    }
    int32_t *prompt = NULL;
    int np = 0;
    qtok_encode(t, "The JSON:", 9, QTOK_ADD_SPECIAL, &prompt, &np);
    qengine_opts eo;
    qengine_opts_default(&eo);
    eo.device = o->device;
    eo.n_threads = o->threads;
    eo.random_weights = o->random_weights != NULL;
    eo.seed = 1;
    eo.num_blocks = ng * ((np + o->max_tokens) / 16 + 2) + 64;
    qengine *e = NULL;
    if (qengine_create(m, t, &eo, &e, err, sizeof err)) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    qreq_params *ps = calloc((size_t)ng, sizeof *ps);
    int *got = calloc((size_t)ng, sizeof *got), *want = calloc((size_t)ng, sizeof *want);
    for (int i = 0; i < ng; i++) {
        ps[i] = (qreq_params){ .prompt = prompt, .n_prompt = np, .sp = qsample_defaults(), .max_tokens = o->max_tokens };
        ps[i].sp.temperature = 1.0f;
        ps[i].sp.seed = 1 + (uint64_t)i;
        ps[i].grammar = gs[i];
        ps[i].grammar_vocab = gv;
    }
    mask_times w1, w2 = { 0 }, w0 = { 0 }, wf, w;
    /* Guided, grammars new; then guided again, best of three (the same
     * outputs each time: same seeds), as a server's grammar cache has them. */
    const double t1 = run_all(e, ps, ng, want, &w1);
    long long toks = 0;
    for (int i = 0; i < ng; i++) toks += want[i];
    /* Free: the same prompts and seeds, each as many tokens as its twin.
     * Guided again (the same outputs: same seeds) and free take turns, so
     * that the machine's drift falls on both; best of the rounds each. */
    qreq_params *pf = calloc((size_t)ng, sizeof *pf);
    for (int i = 0; i < ng; i++) {
        pf[i] = ps[i];
        pf[i].grammar = NULL, pf[i].grammar_vocab = NULL;
        pf[i].max_tokens = want[i] > 0 ? want[i] : 1;
        pf[i].ignore_eos = 1;
    }
    double t0 = 1e30, t2 = 1e30;
    printf("\nrounds (guided cached / free, and token classes made during the guided run):");
    for (int k = 0; k < o->rounds; k++) {
        const long long c0 = gram_classes_made();
        const double dg = run_all(e, ps, ng, got, &w);
        const long long made = gram_classes_made() - c0;
        if (dg < t2) t2 = dg, w2 = w;
        const double df = run_all(e, pf, ng, got, &wf);
        if (df < t0) t0 = df, w0 = wf;
        printf(" %.3f (%lld)", dg / df, made);
    }
    printf("\n");
    free(pf);
    printf("\nend to end: %s on %s, %d requests together (one schema each), temperature 1, up to %d tokens, %lld "
           "tokens a run\n",
           o->model ? o->model : o->random_weights, qengine_backend_name(e), ng, o->max_tokens, toks);
    printf("\n| run | seconds | tokens/s | vs free | waited for masks |\n|---|---|---|---|---|\n");
    printf("| free (no grammar) | %.3f | %.0f | 1.000 | - |\n", t0, toks / t0);
    printf("| guided, grammars new | %.3f | %.0f | %.3f | %.3f s |\n", t1, toks / t1, t0 / t1, w1.wait);
    printf("| guided, grammars cached | %.3f | %.0f | %.3f | %.3f s |\n", t2, toks / t2, t0 / t2, w2.wait);
    /* Where the masks' time goes: the span from starting a step's masks to
     * the last one done, against the slowest single mask of each step and
     * all masks' work (spread over the guide threads). */
    printf("\nmasks made during the passes of the best cached run (sums over its steps): waited %.4f s, span %.4f s, "
           "slowest mask of each step %.4f s, all masks' work %.4f s\n",
           w2.wait, w2.span, w2.slowest, w2.work);
    printf("host's own work between passes (steps less passes): free %.4f s, guided %.4f s; passes: free %.4f s, "
           "guided %.4f s\n",
           w0.step - w0.forward, w2.step - w2.forward, w0.forward, w2.forward);
    printf("of the host's work, after the passes: free %.4f s, guided %.4f s (feeding the grammars %.4f s)\n", w0.after,
           w2.after, w2.feed);
    printf("\nslowdown with a schema (cached grammars, as a server's cache holds them): %.1f%%\n",
           100.0 * (t2 / t0 - 1.0));
    if (g_e2e_errors) printf("\n%d requests ended in error\n", g_e2e_errors);
    qengine_destroy(e);
    for (int i = 0; i < ng; i++) gram_free(gs[i]);
    free(gs);
    free(ps);
    free(got);
    free(want);
    free(prompt);
    gram_vocab_free(gv);
    qtok_free(tok);
    qmodel_destroy(m);
    return g_e2e_errors ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *dir = "../shared/schemas/maskbench", *tokp = NULL;
    e2e_opts eo = { NULL, NULL, QDEVICE_CPU, 0, 32, 128, 3 };
    int only_e2e = 0, list_refused = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--tokenizer") && v) tokp = v, i++;
        else if (!strcmp(a, "--model") && v) eo.model = v, i++;
        else if (!strcmp(a, "--random-weights") && v) eo.random_weights = v, i++;
        else if (!strcmp(a, "--device") && v && !qdevice_parse(v, &eo.device)) i++;
        else if (!strcmp(a, "--threads") && v) eo.threads = atoi(v), i++;
        else if (!strcmp(a, "--requests") && v) eo.n_req = atoi(v), i++;
        else if (!strcmp(a, "--max-tokens") && v) eo.max_tokens = atoi(v), i++;
        else if (!strcmp(a, "--rounds") && v) eo.rounds = atoi(v), i++;
        else if (!strcmp(a, "--only-e2e")) only_e2e = 1;
        else if (!strcmp(a, "--list-refused")) list_refused = 1;
        else if (a[0] == '-') {
            fprintf(stderr, "usage: bench_grammar [DIR] [--tokenizer tokenizer.json] [--model PATH | --random-weights "
                            "CONFIG.json] [--device cpu|cuda] [--threads N] [--requests N] [--max-tokens N] [--rounds N] [--only-e2e] [--list-refused]\n");
            return 2;
        } else dir = a;
    }
    if (eo.n_req < 1 || eo.max_tokens < 1 || eo.rounds < 1) {
        fprintf(stderr, "bench_grammar: --requests, --max-tokens and --rounds must be at least 1\n");
        return 2;
    }
    if (tokp && load_tokenizer(tokp)) return 1;
    uint32_t *mask = tokp ? calloc(((size_t)g_nv + 31) / 32, sizeof *mask) : NULL;
    int tv = 0, tv_ok = 0, ti = 0, ti_ok = 0;
    int valid_refused = 0, verdicts_differ = 0; /* what makes the exit status 1 */
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "bench_grammar: cannot open %s\n", dir);
        return 1;
    }
    struct dirent *de;
    char **files = NULL;
    int nf = 0, cap = 0;
    while ((de = readdir(d))) {
        const size_t l = strlen(de->d_name);
        if (l < 6 || strcmp(de->d_name + l - 5, ".json")) continue;
        if (nf == cap) files = realloc(files, sizeof *files * (size_t)(cap = cap ? cap * 2 : 1024));
        files[nf++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(files, (size_t)nf, sizeof *files, (int (*)(const void *, const void *))strcmp);
    double *ct = malloc(sizeof *ct * (size_t)(nf + 1));
    int nct = 0, shown = 0;
    for (int i = 0; i < nf && !(only_e2e && (eo.model || eo.random_weights)); i++) {
        char path[4096], err[800];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        json_t *doc = json_load_file(path, 0, NULL);
        subset *s = sub_of(files[i]);
        s->files++;
        if (!doc) continue;
        gram *g = NULL;
        const double t0 = q_now();
        const int rc = gram_schema_compile_opts(json_object_get(doc, "schema"), GRAM_SCHEMA_FULL, &g, err, sizeof err);
        ct[nct++] = q_now() - t0;
        strict_counts(s, doc);
        if (rc) {
            count_why(err);
            if (list_refused) fprintf(stderr, "%s: %s\n", files[i], err);
        } else {
            s->compiled++;
            size_t k;
            json_t *t;
            const size_t mt0 = g_nmt;
            json_array_foreach(json_object_get(doc, "tests"), k, t)
            {
                json_t *data = normal(json_object_get(t, "data"));
                char *text = gram_json_text(data);
                json_decref(data);
                if (!text) continue;
                const int valid = json_is_true(json_object_get(t, "valid")), ok = accepts(g, text);
                if (valid) s->valid++, s->valid_ok += ok;
                else s->invalid++, s->invalid_ok += !ok;
                valid_refused += valid && !ok;
                if (mask) {
                    const int tok_ok = by_tokens(g, text, mask);
                    if (valid) tv++, tv_ok += tok_ok;
                    else ti++, ti_ok += !tok_ok;
                    verdicts_differ += tok_ok != ok;
                }
                if (ok != valid && shown < 20) {
                    printf("%s: %s instance %s: %.200s\n", files[i], valid ? "valid" : "invalid",
                           valid ? "refused" : "accepted", text);
                    shown++;
                }
                if (ok != valid && list_refused) {
                    size_t at = 0;
                    accepts_at(g, text, &at);
                    fprintf(stderr, "%s: %s instance %s (test %zu) at byte %zu: ...%.*s|%.40s\n", files[i],
                            valid ? "valid" : "invalid", valid ? "refused" : "accepted", k, at, (int)(at > 60 ? 60 : at),
                            text + (at > 60 ? at - 60 : 0), text + at);
                }
                free(text);
            }
            if (list_refused && g_nmt > mt0) {
                double sum = 0;
                for (size_t q = mt0; q < g_nmt; q++) sum += g_mt[q];
                fprintf(stderr, "%s: mask mean %.1f us over %zu masks\n", files[i], 1e6 * sum / (double)(g_nmt - mt0),
                        g_nmt - mt0);
            }
            gram_free(g);
        }
        json_decref(doc);
    }
    subset tot = { .name = "all" };
    printf("\nfull mode (JSON Schema's meaning: every valid instance must be taken), and strict mode beside it (the "
           "default: keys a schema does not list are refused, so valid instances with them are too)\n");
    printf("\n| subset | schemas | compiled | valid accepted | invalid rejected | strict: compiled | strict: valid taken "
           "| strict: invalid rejected |\n|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < g_nsub; i++) {
        const subset *s = &g_sub[i];
        printf("| %s | %d | %d (%.0f%%) | %d / %d | %d / %d | %d | %d / %d | %d / %d |\n", s->name, s->files, s->compiled,
               100.0 * s->compiled / (s->files ? s->files : 1), s->valid_ok, s->valid, s->invalid_ok, s->invalid,
               s->s_compiled, s->s_valid_ok, s->s_valid, s->s_invalid_ok, s->s_invalid);
        tot.files += s->files, tot.compiled += s->compiled, tot.valid += s->valid, tot.valid_ok += s->valid_ok;
        tot.invalid += s->invalid, tot.invalid_ok += s->invalid_ok;
        tot.s_compiled += s->s_compiled, tot.s_valid += s->s_valid, tot.s_valid_ok += s->s_valid_ok;
        tot.s_invalid += s->s_invalid, tot.s_invalid_ok += s->s_invalid_ok;
    }
    printf("| **all** | %d | %d (%.1f%%) | %d / %d (%.2f%%) | %d / %d (%.2f%%) | %d (%.1f%%) | %d / %d (%.2f%%) | %d / %d "
           "(%.2f%%) |\n",
           tot.files, tot.compiled, 100.0 * tot.compiled / (tot.files ? tot.files : 1), tot.valid_ok, tot.valid,
           100.0 * tot.valid_ok / (tot.valid ? tot.valid : 1), tot.invalid_ok, tot.invalid,
           100.0 * tot.invalid_ok / (tot.invalid ? tot.invalid : 1), tot.s_compiled,
           100.0 * tot.s_compiled / (tot.files ? tot.files : 1), tot.s_valid_ok, tot.s_valid,
           100.0 * tot.s_valid_ok / (tot.s_valid ? tot.s_valid : 1), tot.s_invalid_ok, tot.s_invalid,
           100.0 * tot.s_invalid_ok / (tot.s_invalid ? tot.s_invalid : 1));
    printf("\nrefused (full mode), by reason:\n");
    for (int i = 0; i < g_nwhy; i++)
        for (int j = i + 1; j < g_nwhy; j++)
            if (g_why[j].n > g_why[i].n) {
                __typeof__(g_why[0]) t = g_why[i];
                g_why[i] = g_why[j];
                g_why[j] = t;
            }
    for (int i = 0; i < g_nwhy && i < 40; i++) printf("  %5d  %s\n", g_why[i].n, g_why[i].why);
    qsort(ct, (size_t)nct, sizeof *ct, cmp_d);
    if (nct)
        printf("\ncompile time: median %.2f ms, p99 %.2f ms, max %.2f ms (%d schemas)\n", 1e3 * ct[nct / 2],
               1e3 * ct[(int)(nct * 0.99)], 1e3 * ct[nct - 1], nct);
    if (mask) {
        qsort(g_mt, g_nmt, sizeof *g_mt, cmp_d);
        printf("\ntoken by token (%s, %d tokens): valid produced %d / %d (%.2f%%), invalid stuck %d / %d (%.2f%%)\n",
               tokp, g_nv, tv_ok, tv, 100.0 * tv_ok / (tv ? tv : 1), ti_ok, ti, 100.0 * ti_ok / (ti ? ti : 1));
        double sum = 0;
        for (size_t i = 0; i < g_nmt; i++) sum += g_mt[i];
        if (g_nmt)
            printf("mask time: median %.1f us, p99 %.1f us, mean %.1f us (%zu masks; a grammar's token classes are "
                   "made the first time a state is met)\n",
                   1e6 * g_mt[g_nmt / 2], 1e6 * g_mt[(size_t)((double)g_nmt * 0.99)], 1e6 * sum / (double)g_nmt, g_nmt);
        qsort(g_ft, g_nft, sizeof *g_ft, cmp_d);
        if (g_nft)
            printf("feed time: median %.2f us, p99 %.2f us (%zu tokens fed to their matchers)\n", 1e6 * g_ft[g_nft / 2],
                   1e6 * g_ft[(size_t)((double)g_nft * 0.99)], g_nft);
    }
    /* The exit status says whether every valid instance of a compiled
     * schema was taken and the tokens agreed with the bytes everywhere
     * (invalid instances may be taken where only oneOf's exclusivity
     * refuses them: oneOf is generated as anyOf). */
    int rc = 0;
    if (valid_refused || verdicts_differ) {
        printf("\nFAILED: %d valid instances refused, %d token verdicts unlike the bytes'\n", valid_refused,
               verdicts_differ);
        rc = 1;
    }
    if (!rc && (eo.model || eo.random_weights)) rc = end_to_end(dir, files, nf, &eo);
    for (int i = 0; i < nf; i++) free(files[i]);
    free(files);
    free(ct);
    return rc;
}
