/* metrics.h - the server's Prometheus metrics (GET /metrics).
 *
 * Counters and latency histograms that the server's threads record into
 * (thread-safe), rendered in Prometheus' text format (version 0.0.4) with
 * the engine's gauges: requests by endpoint and HTTP status, prompt and
 * generated tokens, time to first token, inter-token latency and request
 * latency histograms, queue depth, running and waiting sequences, KV blocks
 * used / cached / free and utilisation, the prefix-cache hit rate, and
 * preemptions by mode, and speculative decoding's drafted and kept tokens
 * and verifying passes.  Every name starts with "quire_". */
#ifndef QUIRE_METRICS_H
#define QUIRE_METRICS_H

#include <stddef.h>

#include "engine.h"
#include "store.h"

typedef struct qmetrics qmetrics;

/* NULL when out of memory. */
qmetrics *qmetrics_new(void);
void qmetrics_free(qmetrics *m);

/* A request answered: endpoint ("chat", "completions", "ws", "models",
 * ...; at most 31 bytes are kept) and its HTTP status (WebSocket requests:
 * 200, or the status their error stands for).  Distinct pairs beyond 64
 * are counted under endpoint "other". */
void qmetrics_request(qmetrics *m, const char *endpoint, int status);
/* Connections the server closed on its own, by reason (one table: the
 * metric's label and its help text). */
#define QCONN_CLOSE_REASONS(X)                                                                                         \
    X(SLOW_READER, "slow_reader", "its client read too slowly (output past --max-pending)")                           \
    X(TIMEOUT, "timeout", "a request did not arrive within --request-timeout, or the connection was idle")            \
    X(TOO_MANY, "too_many", "more than --max-connections were open")                                                  \
    X(BAD_REQUEST, "bad_request", "a request or WebSocket frame that could not be read")                              \
    X(FLOOD, "flood", "its client sent far ahead of its answers")
typedef enum {
#define X(id, label, help) QCONN_##id,
    QCONN_CLOSE_REASONS(X)
#undef X
    QCONN_N_REASONS
} qconn_reason;
void qmetrics_conn_closed(qmetrics *m, qconn_reason why);
/* Tokens of a finished request. */
void qmetrics_tokens(qmetrics *m, int prompt_tokens, int generated_tokens);
/* Latencies in seconds. */
void qmetrics_ttft(qmetrics *m, double s);
void qmetrics_itl(qmetrics *m, double s);
void qmetrics_latency(qmetrics *m, double s);

/* The text for GET /metrics: the recorded series, then the engine's gauges
 * from st and the persistent tier's from sst (NULL: left out), and
 * queue_depth (requests accepted by the server and not yet given to the
 * engine).  *out is malloc'd (caller frees), *len its length.  0 or
 * QERR_NOMEM. */
int qmetrics_render(qmetrics *m, const qengine_stats *st, const qstore_stats *sst, int queue_depth, char **out,
                    size_t *len);

#endif
