/* test_metrics.c - the server's Prometheus metrics (server/metrics.c):
 * what the text says after known observations, its format line by line,
 * the overflow of request labels, and exact counts under concurrent
 * recording. */
#include <pthread.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "qtest.h"

static qstore_stats g_sst;

static char *render(qmetrics *m, const qengine_stats *st)
{
    char *s = NULL;
    size_t len = 0;
    if (qmetrics_render(m, st, st ? &g_sst : NULL, 3, &s, &len)) return NULL;
    if (s && strlen(s) != len) {
        free(s);
        return NULL;
    }
    return s;
}

static void test_series(void)
{
    qmetrics *m = qmetrics_new();
    REQUIRE(m);
    qmetrics_request(m, "chat", 200);
    qmetrics_request(m, "chat", 200);
    qmetrics_request(m, "chat", 400);
    qmetrics_request(m, "ws", 200);
    qmetrics_tokens(m, 10, 5);
    qmetrics_tokens(m, 7, 0);
    qmetrics_ttft(m, 0.003); /* le 0.005 */
    qmetrics_ttft(m, 0.1);   /* le 0.1: bounds are inclusive */
    qmetrics_ttft(m, 500);   /* +Inf only */
    qmetrics_itl(m, -1);     /* a clock step: 0 */
    qmetrics_latency(m, 1.0);
    qengine_stats st;
    memset(&st, 0, sizeof st);
    st.running = 2, st.waiting = 1, st.kv_used = 5, st.kv_cached = 4, st.kv_free = 7, st.kv_blocks = 16;
    st.kv_utilisation = 0.75, st.prompt_tokens_total = 40, st.tokens_reused = 10, st.preemptions = 3;
    st.preemptions_swap = 1;
    st.disk_tokens_loaded = 4, st.prefill_tokens = 30;
    g_sst = (qstore_stats){ .blocks_written = 9, .blocks_loaded = 1, .blocks_evicted = 2, .blocks_dropped = 3,
                            .blocks_corrupt = 1, .disk_blocks = 7, .disk_bytes = 7000, .messages_written = 5 };
    char *s = render(m, &st);
    REQUIRE(s);
    CHECK_STR_CONTAINS(s, "quire_requests_total{endpoint=\"chat\",status=\"200\"} 2\n");
    CHECK_STR_CONTAINS(s, "quire_requests_total{endpoint=\"chat\",status=\"400\"} 1\n");
    CHECK_STR_CONTAINS(s, "quire_requests_total{endpoint=\"ws\",status=\"200\"} 1\n");
    CHECK_STR_CONTAINS(s, "quire_prompt_tokens_total 17\n");
    CHECK_STR_CONTAINS(s, "quire_generation_tokens_total 5\n");
    CHECK_STR_CONTAINS(s, "# TYPE quire_time_to_first_token_seconds histogram\n");
    CHECK_STR_CONTAINS(s, "quire_time_to_first_token_seconds_bucket{le=\"0.001\"} 0\n");
    CHECK_STR_CONTAINS(s, "quire_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n");
    CHECK_STR_CONTAINS(s, "quire_time_to_first_token_seconds_bucket{le=\"0.08\"} 1\n");
    CHECK_STR_CONTAINS(s, "quire_time_to_first_token_seconds_bucket{le=\"0.1\"} 2\n");
    CHECK_STR_CONTAINS(s, "quire_time_to_first_token_seconds_bucket{le=\"80\"} 2\n");
    CHECK_STR_CONTAINS(s, "quire_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n");
    CHECK_STR_CONTAINS(s, "quire_time_to_first_token_seconds_sum 500.103\n");
    CHECK_STR_CONTAINS(s, "quire_time_to_first_token_seconds_count 3\n");
    CHECK_STR_CONTAINS(s, "quire_inter_token_latency_seconds_bucket{le=\"0.001\"} 1\n");
    CHECK_STR_CONTAINS(s, "quire_e2e_request_latency_seconds_bucket{le=\"0.8\"} 0\n");
    CHECK_STR_CONTAINS(s, "quire_e2e_request_latency_seconds_bucket{le=\"1\"} 1\n");
    CHECK_STR_CONTAINS(s, "quire_queue_depth 3\n");
    CHECK_STR_CONTAINS(s, "quire_requests_running 2\n");
    CHECK_STR_CONTAINS(s, "quire_requests_waiting 1\n");
    CHECK_STR_CONTAINS(s, "quire_kv_blocks{state=\"used\"} 5\n");
    CHECK_STR_CONTAINS(s, "quire_kv_blocks{state=\"cached\"} 4\n");
    CHECK_STR_CONTAINS(s, "quire_kv_blocks{state=\"free\"} 7\n");
    CHECK_STR_CONTAINS(s, "quire_kv_utilisation_ratio 0.75\n");
    CHECK_STR_CONTAINS(s, "quire_prefix_cache_hit_ratio 0.25\n");
    CHECK_STR_CONTAINS(s, "quire_preemptions_total{mode=\"recompute\"} 2\n");
    CHECK_STR_CONTAINS(s, "quire_preemptions_total{mode=\"swap\"} 1\n");
    CHECK_STR_CONTAINS(s, "quire_prompt_tokens_cached_total{source=\"memory\"} 6\n");
    CHECK_STR_CONTAINS(s, "quire_prompt_tokens_cached_total{source=\"disk\"} 4\n");
    CHECK_STR_CONTAINS(s, "quire_prefill_tokens_total 30\n");
    CHECK_STR_CONTAINS(s, "quire_disk_blocks_total{event=\"written\"} 9\n");
    CHECK_STR_CONTAINS(s, "quire_disk_blocks_total{event=\"loaded\"} 1\n");
    CHECK_STR_CONTAINS(s, "quire_disk_blocks_total{event=\"evicted\"} 2\n");
    CHECK_STR_CONTAINS(s, "quire_disk_blocks_total{event=\"dropped\"} 3\n");
    CHECK_STR_CONTAINS(s, "quire_disk_blocks_total{event=\"corrupt\"} 1\n");
    CHECK_STR_CONTAINS(s, "quire_disk_cache_blocks 7\n");
    CHECK_STR_CONTAINS(s, "quire_disk_cache_bytes 7000\n");
    CHECK_STR_CONTAINS(s, "quire_session_messages_written_total 5\n");

    /* Every line: a comment (HELP, TYPE) or a sample "name{labels} value". */
    regex_t re;
    REQUIRE(regcomp(&re, "^(# (HELP|TYPE) quire_[a-z0-9_]+ .+|quire_[a-z0-9_]+(\\{[a-z_]+=\"[^\"]*\"(,[a-z_]+=\"[^\"]*\")*\\})? "
                         "[-+0-9.e]+)$",
                    REG_EXTENDED | REG_NOSUB) == 0);
    int lines = 0, bad = 0;
    for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n"), lines++)
        if (regexec(&re, line, 0, NULL, 0)) {
            fprintf(stderr, "  bad line: %s\n", line);
            bad++;
        }
    regfree(&re);
    CHECK(lines > 80);
    CHECK_EQ_INT(bad, 0);
    free(s);

    /* Without the engine's stats: the server's own series only. */
    s = render(m, NULL);
    REQUIRE(s);
    CHECK(!strstr(s, "quire_kv_blocks"));
    CHECK_STR_CONTAINS(s, "quire_queue_depth 3\n");
    free(s);
    qmetrics_free(m);
}

static void test_label_overflow(void)
{
    qmetrics *m = qmetrics_new();
    REQUIRE(m);
    char ep[32];
    for (int i = 0; i < 100; i++) {
        snprintf(ep, sizeof ep, "e%d", i);
        qmetrics_request(m, ep, 200);
    }
    char *s = render(m, NULL);
    REQUIRE(s);
    CHECK_STR_CONTAINS(s, "quire_requests_total{endpoint=\"e62\",status=\"200\"} 1\n");
    CHECK(!strstr(s, "endpoint=\"e63\""));
    CHECK_STR_CONTAINS(s, "quire_requests_total{endpoint=\"other\",status=\"0\"} 37\n");
    free(s);
    qmetrics_free(m);
}

static void *worker(void *arg)
{
    qmetrics *m = arg;
    for (int i = 0; i < 20000; i++) {
        qmetrics_itl(m, 0.01);
        qmetrics_request(m, "chat", 200);
        qmetrics_tokens(m, 1, 2);
    }
    return NULL;
}

static void test_threads(void)
{
    qmetrics *m = qmetrics_new();
    REQUIRE(m);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) REQUIRE(pthread_create(&th[i], NULL, worker, m) == 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    char *s = render(m, NULL);
    REQUIRE(s);
    CHECK_STR_CONTAINS(s, "quire_inter_token_latency_seconds_count 80000\n");
    CHECK_STR_CONTAINS(s, "quire_inter_token_latency_seconds_bucket{le=\"0.005\"} 0\n");
    CHECK_STR_CONTAINS(s, "quire_inter_token_latency_seconds_bucket{le=\"0.01\"} 80000\n");
    CHECK_STR_CONTAINS(s, "quire_requests_total{endpoint=\"chat\",status=\"200\"} 80000\n");
    CHECK_STR_CONTAINS(s, "quire_prompt_tokens_total 80000\n");
    CHECK_STR_CONTAINS(s, "quire_generation_tokens_total 160000\n");
    free(s);
    qmetrics_free(m);
}

int main(void)
{
    QT_RUN(test_series);
    QT_RUN(test_label_overflow);
    QT_RUN(test_threads);
    QT_MAIN_END();
}
