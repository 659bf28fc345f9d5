/* metrics.c - the server's Prometheus metrics (metrics.h). */
#include "metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "qerr.h"

#define MAX_PAIRS 64

/* Bucket bounds (seconds), vLLM's for the same series. */
static const double TTFT_LE[] = { 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                  0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0 };
static const double ITL_LE[] = { 0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                                 0.1,   0.15,  0.2,  0.3,   0.4,  0.5,   0.75, 1.0,  2.5 };
static const double LAT_LE[] = { 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0 };
#define NB(a) ((int)(sizeof(a) / sizeof(a)[0]))
#define MAX_LE 19

typedef struct {
    const double *le;
    int n_le;
    unsigned long long count[MAX_LE + 1]; /* per bucket (not cumulative); the last: above every bound */
    double sum;
} hist;

struct qmetrics {
    pthread_mutex_t mu;
    struct {
        char endpoint[32];
        int status;
        unsigned long long n;
    } pairs[MAX_PAIRS];
    int n_pairs;
    unsigned long long prompt_tokens, generated_tokens;
    unsigned long long conn_closed[QCONN_N_REASONS];
    hist ttft, itl, lat;
};

qmetrics *qmetrics_new(void)
{
    qmetrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    if (pthread_mutex_init(&m->mu, NULL)) {
        free(m);
        return NULL;
    }
    m->ttft = (hist){ TTFT_LE, NB(TTFT_LE), { 0 }, 0 };
    m->itl = (hist){ ITL_LE, NB(ITL_LE), { 0 }, 0 };
    m->lat = (hist){ LAT_LE, NB(LAT_LE), { 0 }, 0 };
    return m;
}

void qmetrics_conn_closed(qmetrics *m, qconn_reason why)
{
    if (!m || (int)why < 0 || why >= QCONN_N_REASONS) return;
    pthread_mutex_lock(&m->mu);
    m->conn_closed[why]++;
    pthread_mutex_unlock(&m->mu);
}

void qmetrics_free(qmetrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void qmetrics_request(qmetrics *m, const char *endpoint, int status)
{
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_pairs && (m->pairs[i].status != status || strncmp(m->pairs[i].endpoint, endpoint, 31))) i++;
    if (i == m->n_pairs && m->n_pairs == MAX_PAIRS) { /* the last slot is "other", whatever the status */
        i = MAX_PAIRS - 1;
        snprintf(m->pairs[i].endpoint, sizeof m->pairs[i].endpoint, "other");
        m->pairs[i].status = 0;
    } else if (i == m->n_pairs) {
        snprintf(m->pairs[i].endpoint, sizeof m->pairs[i].endpoint, "%s", endpoint);
        m->pairs[i].status = status;
        m->pairs[i].n = 0;
        m->n_pairs++;
    }
    m->pairs[i].n++;
    pthread_mutex_unlock(&m->mu);
}

void qmetrics_tokens(qmetrics *m, int prompt_tokens, int generated_tokens)
{
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += prompt_tokens > 0 ? (unsigned)prompt_tokens : 0;
    m->generated_tokens += generated_tokens > 0 ? (unsigned)generated_tokens : 0;
    pthread_mutex_unlock(&m->mu);
}

static void observe(qmetrics *m, hist *h, double s)
{
    if (!(s >= 0)) s = 0; /* NaN or negative: a clock step, counted as 0 */
    pthread_mutex_lock(&m->mu);
    int b = 0;
    while (b < h->n_le && s > h->le[b]) b++;
    h->count[b]++;
    h->sum += s;
    pthread_mutex_unlock(&m->mu);
}

void qmetrics_ttft(qmetrics *m, double s) { observe(m, &m->ttft, s); }
void qmetrics_itl(qmetrics *m, double s) { observe(m, &m->itl, s); }
void qmetrics_latency(qmetrics *m, double s) { observe(m, &m->lat, s); }

/* The page being written; on failure it stays failed and keeps nothing. */
typedef struct {
    qbuf q;
    int failed;
} buf;

__attribute__((format(printf, 2, 3))) static void put(buf *b, const char *fmt, ...)
{
    if (b->failed) return;
    va_list ap;
    va_start(ap, fmt);
    const int bad = qbuf_vprintf(&b->q, fmt, ap);
    va_end(ap);
    if (bad) {
        qbuf_free(&b->q);
        b->failed = 1;
    }
}

static void head(buf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void put_hist(buf *b, const char *name, const char *help, const hist *h)
{
    head(b, name, "histogram", help);
    unsigned long long cum = 0;
    for (int i = 0; i < h->n_le; i++) {
        cum += h->count[i];
        put(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], cum);
    }
    cum += h->count[h->n_le];
    put(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, cum, name, h->sum, name, cum);
}

int qmetrics_render(qmetrics *m, const qengine_stats *st, const qstore_stats *sst, int queue_depth, char **out,
                    size_t *len)
{
    buf b = { 0 };
    pthread_mutex_lock(&m->mu);
    head(&b, "quire_requests_total", "counter", "Requests answered, by endpoint and HTTP status.");
    for (int i = 0; i < m->n_pairs; i++)
        put(&b, "quire_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", m->pairs[i].endpoint,
            m->pairs[i].status, m->pairs[i].n);
    head(&b, "quire_connections_closed_total", "counter", "Connections the server closed on its own, by reason.");
    {
        static const char *const label[] = {
#define X(id, l, help) l,
            QCONN_CLOSE_REASONS(X)
#undef X
        };
        for (int i = 0; i < QCONN_N_REASONS; i++)
            put(&b, "quire_connections_closed_total{reason=\"%s\"} %llu\n", label[i], m->conn_closed[i]);
    }
    head(&b, "quire_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
    put(&b, "quire_prompt_tokens_total %llu\n", m->prompt_tokens);
    head(&b, "quire_generation_tokens_total", "counter", "Tokens generated for finished requests.");
    put(&b, "quire_generation_tokens_total %llu\n", m->generated_tokens);
    put_hist(&b, "quire_time_to_first_token_seconds", "From a request's arrival to its first token.", &m->ttft);
    put_hist(&b, "quire_inter_token_latency_seconds", "Between two tokens of a stream.", &m->itl);
    put_hist(&b, "quire_e2e_request_latency_seconds", "From a request's arrival to its last token.", &m->lat);
    pthread_mutex_unlock(&m->mu);
    head(&b, "quire_queue_depth", "gauge", "Requests accepted and not yet given to the engine.");
    put(&b, "quire_queue_depth %d\n", queue_depth);
    if (st) {
        head(&b, "quire_requests_running", "gauge", "Sequences in the running batch.");
        put(&b, "quire_requests_running %d\n", st->running);
        head(&b, "quire_requests_waiting", "gauge", "Requests waiting for admission (swapped ones included).");
        put(&b, "quire_requests_waiting %d\n", st->waiting);
        head(&b, "quire_kv_blocks", "gauge", "KV cache blocks by state: held by sequences, cached and free, free.");
        put(&b, "quire_kv_blocks{state=\"used\"} %d\nquire_kv_blocks{state=\"cached\"} %d\n", st->kv_used,
            st->kv_cached);
        put(&b, "quire_kv_blocks{state=\"free\"} %d\nquire_kv_blocks{state=\"total\"} %d\n", st->kv_free,
            st->kv_blocks);
        head(&b, "quire_kv_window_dropped_blocks_total", "counter",
             "KV blocks given back because no later token attends to them (sliding-window models).");
        put(&b, "quire_kv_window_dropped_blocks_total %llu\n", (unsigned long long)st->kv_dropped);
        head(&b, "quire_kv_utilisation_ratio", "gauge", "Token slots holding real tokens / slots in used blocks.");
        put(&b, "quire_kv_utilisation_ratio %.6g\n", st->kv_utilisation);
        head(&b, "quire_prefix_cache_hit_ratio", "gauge", "Prompt tokens served from the prefix cache / prompt tokens.");
        put(&b, "quire_prefix_cache_hit_ratio %.6g\n",
            st->prompt_tokens_total ? (double)st->tokens_reused / (double)st->prompt_tokens_total : 0.0);
        head(&b, "quire_prompt_tokens_cached_total", "counter",
             "Prompt tokens not computed: their K/V came from the prefix cache in memory, or from disk.");
        put(&b, "quire_prompt_tokens_cached_total{source=\"memory\"} %llu\n",
            (unsigned long long)(st->tokens_reused - st->disk_tokens_loaded));
        put(&b, "quire_prompt_tokens_cached_total{source=\"disk\"} %llu\n", (unsigned long long)st->disk_tokens_loaded);
        head(&b, "quire_prefill_tokens_total", "counter", "Prompt tokens run through the model (recomputation included).");
        put(&b, "quire_prefill_tokens_total %llu\n", (unsigned long long)st->prefill_tokens);
        head(&b, "quire_preemptions_total", "counter", "Requests preempted, by mode.");
        put(&b, "quire_preemptions_total{mode=\"recompute\"} %llu\nquire_preemptions_total{mode=\"swap\"} %llu\n",
            (unsigned long long)(st->preemptions - st->preemptions_swap), (unsigned long long)st->preemptions_swap);
        head(&b, "quire_spec_tokens_total", "counter", "Speculative decoding: tokens drafted, and of those kept.");
        put(&b, "quire_spec_tokens_total{kind=\"drafted\"} %llu\nquire_spec_tokens_total{kind=\"accepted\"} %llu\n",
            (unsigned long long)st->spec_drafted, (unsigned long long)st->spec_accepted);
        head(&b, "quire_spec_passes_total", "counter", "Speculative decoding: passes that verified drafts.");
        put(&b, "quire_spec_passes_total %llu\n", (unsigned long long)st->spec_passes);
        head(&b, "quire_spec_draft_passes_total", "counter", "Speculative decoding: the draft model's passes.");
        put(&b, "quire_spec_draft_passes_total %llu\n", (unsigned long long)st->draft_passes);
        head(&b, "quire_spec_draft_seconds_total", "counter", "Speculative decoding: time in the draft model's passes.");
        put(&b, "quire_spec_draft_seconds_total %.6f\n", st->draft_s);
    }
    if (sst) {
        head(&b, "quire_disk_blocks_total", "counter",
             "Persistent prefix tier: KV blocks written, loaded, evicted (LRU), dropped (queue full), corrupt.");
        put(&b, "quire_disk_blocks_total{event=\"written\"} %llu\nquire_disk_blocks_total{event=\"loaded\"} %llu\n",
            (unsigned long long)sst->blocks_written, (unsigned long long)sst->blocks_loaded);
        put(&b, "quire_disk_blocks_total{event=\"evicted\"} %llu\nquire_disk_blocks_total{event=\"dropped\"} %llu\n",
            (unsigned long long)sst->blocks_evicted, (unsigned long long)sst->blocks_dropped);
        put(&b, "quire_disk_blocks_total{event=\"corrupt\"} %llu\n", (unsigned long long)sst->blocks_corrupt);
        head(&b, "quire_disk_cache_blocks", "gauge", "KV blocks in the persistent tier.");
        put(&b, "quire_disk_cache_blocks %lld\n", (long long)sst->disk_blocks);
        head(&b, "quire_disk_cache_bytes", "gauge", "Bytes of KV blocks (tokens and K/V) in the persistent tier.");
        put(&b, "quire_disk_cache_bytes %lld\n", (long long)sst->disk_bytes);
        head(&b, "quire_session_messages_written_total", "counter", "Session messages stored.");
        put(&b, "quire_session_messages_written_total %llu\n", (unsigned long long)sst->messages_written);
    }
    if (b.failed) return QERR_NOMEM;
    *out = b.q.p;
    *len = b.q.len;
    return 0;
}
