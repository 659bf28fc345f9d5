/* bench_prefix.c - time to first token of turn N of a long conversation:
 * cold (no cache), warm (the history's blocks in memory), and after a
 * restart (a new engine and store on the same database: the history's
 * blocks come from sqlite).  Prints a table; the goal is
 * after-restart <= 0.2x cold.
 *
 *   bench_prefix [--config bench/configs/prefix-86m.json] [--history 4000]
 *                [--turn 32] [--threads N] [--device cpu|cuda] [--db PATH]
 *                [--repeat 3]
 *
 * The model has random weights (qmodel_random, fixed seed), so the figures
 * are the engine's and the tier's, not a checkpoint's.  Histories are
 * random token ids, computed once as the previous turn; each measured turn
 * adds --turn other tokens after one, so that every measurement reuses the
 * history and nothing more.
 *
 * After a restart the engine knows neither how fast it computes nor how
 * fast the tier loads, so it loads (row "after restart").  Once it has
 * measured both (a load, and a 512-token prefill of something else), the
 * default policy loads only when that is faster (row "after restart,
 * rates measured"): on a GPU small models' prefixes are computed faster
 * than sqlite gives them back. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "model.h"
#include "store.h"
#include "util.h"

typedef struct {
    double ttft;
    int cached;
    uint64_t computed, disk_tokens;
} shot;

static int g_history, g_turn, g_vocab;
static int g_device = QDEVICE_CPU, g_threads = 0;

static void fill(int32_t *t, int n, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        t[i] = 3 + (int32_t)((x >> 33) % (uint64_t)(g_vocab - 3));
    }
}

/* The new turn of measurement r after conversation c's history. */
static void new_turn(int32_t *c, int r) { fill(c + g_history, g_turn, 1000 + (uint64_t)r); }

static qengine *engine(const qmodel *m, qstore *s, int n_ctx)
{
    qengine_opts o;
    qengine_opts_default(&o);
    o.device = g_device;
    o.n_threads = g_threads;
    o.random_weights = 1;
    o.seed = 1;
    o.num_blocks = (n_ctx + 15) / 16 * 3 + 64;
    o.store = s;
    qengine *e = NULL;
    char err[512];
    if (qengine_create(m, NULL, &o, &e, err, sizeof err)) fprintf(stderr, "bench_prefix: %s\n", err);
    return e;
}

/* Runs n tokens as a prompt for one greedy token; its TTFT. */
static shot run(qengine *e, const int32_t *tokens, int n)
{
    qengine_stats a, b;
    qengine_stats_get(e, &a);
    qreq_params p = { .prompt = tokens, .n_prompt = n, .sp = qsample_defaults(), .max_tokens = 1, .ignore_eos = 1 };
    uint64_t id;
    char err[256];
    shot s = { -1, 0, 0, 0 };
    if (qengine_submit(e, &p, &id, err, sizeof err)) {
        fprintf(stderr, "bench_prefix: %s\n", err);
        return s;
    }
    for (int live = 1; live > 0;) {
        live = qengine_step(e);
        qevent ev;
        while (qengine_poll(e, &ev)) {
            if (ev.finish != QFINISH_NONE) s.ttft = ev.ttft_s, s.cached = ev.cached_tokens;
            qevent_free(&ev);
        }
    }
    qengine_stats_get(e, &b);
    s.computed = b.prefill_tokens - a.prefill_tokens;
    s.disk_tokens = b.disk_tokens_loaded - a.disk_tokens_loaded;
    return s;
}

static qstore *store(const char *path)
{
    qstore *s = NULL;
    char err[512];
    if (qstore_start(path, NULL, &s, err, sizeof err)) fprintf(stderr, "bench_prefix: %s\n", err);
    return s;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

static void row(const char *what, double *v, int n, double cold, const shot *s)
{
    const double med = median(v, n);
    printf("| %s | %.3f | %.3f | %.3f | %llu | %llu |\n", what, med, v[0], med / cold, (unsigned long long)s->computed,
           (unsigned long long)s->disk_tokens);
}

int main(int argc, char **argv)
{
    const char *config = "bench/configs/prefix-86m.json", *db = "/tmp/quire-bench-prefix.db";
    int history = 4000, turn = 32, repeat = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config") && v) config = v, i++;
        else if (!strcmp(a, "--history") && v) history = atoi(v), i++;
        else if (!strcmp(a, "--turn") && v) turn = atoi(v), i++;
        else if (!strcmp(a, "--threads") && v) g_threads = atoi(v), i++;
        else if (!strcmp(a, "--repeat") && v) repeat = atoi(v), i++;
        else if (!strcmp(a, "--db") && v) db = v, i++;
        else if (!strcmp(a, "--device") && v && !qdevice_parse(v, &g_device)) i++;
        else {
            fprintf(stderr, "usage: bench_prefix [--config JSON] [--history N] [--turn N] [--threads N] "
                            "[--device cpu|cuda] [--db PATH] [--repeat N]\n");
            return 2;
        }
    }
    if (history < 16 || turn < 1 || repeat < 1) {
        fprintf(stderr, "bench_prefix: --history >= 16, --turn and --repeat >= 1\n");
        return 2;
    }
    if (repeat > 16) repeat = 16;
    char err[512];
    qmodel *m = NULL;
    /* Host weights for the CPU; the GPU fills its own. */
    if (qmodel_random(config, g_device != QDEVICE_CUDA, 1, &m, err, sizeof err)) {
        fprintf(stderr, "bench_prefix: %s\n", err);
        return 1;
    }
    const int n = history + turn;
    if (n >= m->hp.max_ctx) {
        fprintf(stderr, "bench_prefix: %d tokens exceed the model's context (%d)\n", n, m->hp.max_ctx);
        return 1;
    }
    g_history = history, g_turn = turn, g_vocab = m->hp.n_vocab;
    /* Two conversations (A measured in every row, B for the last), and an
     * unrelated prompt that makes the engine measure its prefill rate. */
    int32_t *a = malloc(sizeof *a * (size_t)n), *b = malloc(sizeof *b * (size_t)n), *other = malloc(sizeof *other * 512);
    fill(a, history, 7);
    fill(b, history, 8);
    unlink(db);
    char wal[1100];
    snprintf(wal, sizeof wal, "%s-wal", db);
    unlink(wal);

    double cold[16], warm[16], disk[16], autom[16];
    shot sc = { 0 }, sw = { 0 }, sd = { 0 }, sa = { 0 };
    double load_rate = 0, prefill_rate = 0;
    /* Cold: an engine without the tier, nothing cached. */
    for (int r = 0; r < repeat; r++) {
        qengine *e = engine(m, NULL, n);
        if (!e) return 1;
        new_turn(a, r);
        sc = run(e, a, n);
        cold[r] = sc.ttft;
        qengine_destroy(e);
    }
    /* Warm: the previous turns (the histories) ran in this engine. */
    qstore *s = store(db);
    qengine *e = s ? engine(m, s, n) : NULL;
    if (!e) return 1;
    run(e, a, history);
    run(e, b, history);
    for (int r = 0; r < repeat; r++) {
        new_turn(a, r);
        sw = run(e, a, n);
        warm[r] = sw.ttft;
    }
    qengine_destroy(e);
    qstore_stop(s);
    /* After a restart: new store and engine on the same file, nothing in
     * memory; each repeat restarts again. */
    for (int r = 0; r < repeat; r++) {
        s = store(db);
        e = s ? engine(m, s, n) : NULL;
        if (!e) return 1;
        new_turn(a, repeat + r);
        sd = run(e, a, n);
        disk[r] = sd.ttft;
        fill(other, 512, 99 + (uint64_t)r);
        run(e, other, 512);
        new_turn(b, repeat + r);
        sa = run(e, b, n);
        autom[r] = sa.ttft;
        qengine_stats st;
        qengine_stats_get(e, &st);
        load_rate = st.disk_load_rate, prefill_rate = st.prefill_rate;
        qengine_destroy(e);
        qstore_stop(s);
    }
    struct stat fst;
    const double mb = stat(db, &fst) == 0 ? (double)fst.st_size / 1048576.0 : 0;
    const double c = median(cold, repeat);
    printf("bench_prefix: %s (%.1fM parameters), %s, history %d + turn %d tokens, median of %d\n", config,
           (double)qmodel_param_count(m) / 1e6, qdevice_name(g_device), history, turn, repeat);
    printf("| TTFT of the turn | median s | min s | x cold | prompt tokens computed | from disk |\n");
    printf("|---|---|---|---|---|---|\n");
    row("cold (no cache)", cold, repeat, c, &sc);
    row("warm (memory)", warm, repeat, c, &sw);
    row("after restart (sqlite)", disk, repeat, c, &sd);
    row("after restart, rates measured (default policy)", autom, repeat, c, &sa);
    const double d = median(disk, repeat);
    printf("database: %.1f MiB; goal after restart <= 0.2x cold: %s\n", mb, d <= 0.2 * c ? "met" : "NOT met");
    printf("measured: the tier loads %.0f tokens/s, prefill computes %.0f tokens/s: the policy %s\n", load_rate,
           prefill_rate, load_rate >= prefill_rate ? "loads" : "computes (loading every 16th prefix to re-measure)");
    qmodel_destroy(m);
    free(a);
    free(b);
    free(other);
    return 0;
}
