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
 * are the engine's and the tier's, not a checkpoint's.  The history is
 * random token ids, computed once as the previous turn; each measured turn
 * adds --turn other tokens after it, so that every measurement reuses the
 * history and nothing more. */
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

static int32_t *g_tokens;
static int g_history, g_turn, g_vocab;

/* The new turn of measurement r after the history. */
static void new_turn(int r)
{
    uint64_t x = 1000 + (uint64_t)r;
    for (int i = 0; i < g_turn; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        g_tokens[g_history + i] = 3 + (int32_t)((x >> 33) % (uint64_t)(g_vocab - 3));
    }
}
static int g_device = QDEVICE_CPU, g_threads = 0;

static qengine *engine(const qmodel *m, qstore *s, int n_ctx)
{
    qengine_opts o;
    qengine_opts_default(&o);
    o.device = g_device;
    o.n_threads = g_threads;
    o.random_weights = 1;
    o.seed = 1;
    o.num_blocks = (n_ctx + 15) / 16 * 2 + 64;
    o.store = s;
    qengine *e = NULL;
    char err[512];
    if (qengine_create(m, NULL, &o, &e, err, sizeof err)) fprintf(stderr, "bench_prefix: %s\n", err);
    return e;
}

/* Runs the first n tokens as a prompt for one greedy token; its TTFT. */
static shot run(qengine *e, int n)
{
    qengine_stats a, b;
    qengine_stats_get(e, &a);
    qreq_params p = { .prompt = g_tokens, .n_prompt = n, .sp = qsample_defaults(), .max_tokens = 1, .ignore_eos = 1 };
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
    g_tokens = malloc(sizeof *g_tokens * (size_t)n);
    g_history = history, g_turn = turn, g_vocab = m->hp.n_vocab;
    uint64_t x = 7;
    for (int i = 0; i < history; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        g_tokens[i] = 3 + (int32_t)((x >> 33) % (uint64_t)(m->hp.n_vocab - 3));
    }
    unlink(db);
    char wal[1100];
    snprintf(wal, sizeof wal, "%s-wal", db);
    unlink(wal);

    double cold[16], warm[16], disk[16];
    shot sc = { 0 }, sw = { 0 }, sd = { 0 };
    if (repeat > 16) repeat = 16;
    /* Cold: an engine without the tier, nothing cached. */
    for (int r = 0; r < repeat; r++) {
        qengine *e = engine(m, NULL, n);
        if (!e) return 1;
        new_turn(r);
        sc = run(e, n);
        cold[r] = sc.ttft;
        qengine_destroy(e);
    }
    /* Warm: the previous turn (the history) ran in this engine. */
    qstore *s = store(db);
    qengine *e = s ? engine(m, s, n) : NULL;
    if (!e) return 1;
    run(e, history);
    for (int r = 0; r < repeat; r++) {
        new_turn(r);
        sw = run(e, n);
        warm[r] = sw.ttft;
    }
    qengine_destroy(e);
    qstore_stop(s);
    /* After a restart: new store and engine on the same file; nothing in
     * memory.  Each repeat restarts again. */
    for (int r = 0; r < repeat; r++) {
        s = store(db);
        e = s ? engine(m, s, n) : NULL;
        if (!e) return 1;
        new_turn(repeat + r);
        sd = run(e, n);
        disk[r] = sd.ttft;
        qengine_destroy(e);
        qstore_stop(s);
    }
    qsort(cold, (size_t)repeat, sizeof *cold, cmp_d);
    qsort(warm, (size_t)repeat, sizeof *warm, cmp_d);
    qsort(disk, (size_t)repeat, sizeof *disk, cmp_d);
    struct stat st;
    const double mb = stat(db, &st) == 0 ? (double)st.st_size / 1048576.0 : 0;
    const double c = cold[repeat / 2];
    printf("bench_prefix: %s (%.1fM parameters), %s, history %d + turn %d tokens, median of %d\n", config,
           (double)qmodel_param_count(m) / 1e6, qdevice_name(g_device), history, turn, repeat);
    printf("| TTFT of the turn | median s | min s | x cold | prompt tokens computed | from disk |\n");
    printf("|---|---|---|---|---|---|\n");
    printf("| cold (no cache) | %.3f | %.3f | 1.00 | %llu | 0 |\n", c, cold[0], (unsigned long long)sc.computed);
    printf("| warm (memory) | %.3f | %.3f | %.3f | %llu | 0 |\n", warm[repeat / 2], warm[0], warm[repeat / 2] / c,
           (unsigned long long)sw.computed);
    printf("| after restart (sqlite) | %.3f | %.3f | %.3f | %llu | %llu |\n", disk[repeat / 2], disk[0],
           disk[repeat / 2] / c, (unsigned long long)sd.computed, (unsigned long long)sd.disk_tokens);
    printf("database: %.1f MiB; goal after restart <= 0.2x cold: %s\n", mb, disk[repeat / 2] <= 0.2 * c ? "met" : "NOT met");
    if (g_device == QDEVICE_CPU) {
        /* The CPU keeps K/V in float32: what the restart read from sqlite. */
        const double kv_mib = (double)sd.disk_tokens * 2.0 * m->hp.n_layers * m->hp.n_kv_heads * m->hp.head_dim * 4 /
                              1048576.0;
        printf("after restart: %.1f MiB of K/V loaded in %.3f s (%.0f MiB/s, with the prefill of the turn)\n", kv_mib,
               disk[repeat / 2], kv_mib / disk[repeat / 2]);
    }
    qmodel_destroy(m);
    free(g_tokens);
    return 0;
}
