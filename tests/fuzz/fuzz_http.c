/* fuzz_http.c - libFuzzer target for the server's HTTP request path
 * (server/http.c): the bytes a connection receives, in pieces whose size
 * the first byte picks, go through the parser as the connection's callback
 * feeds them (qhttp_feed, qhttp_parse, qhttp_next for pipelined requests),
 * each whole request through the routes and a reply head.  Every outcome
 * must be a request within the limits, more bytes wanted, or a refusal with
 * a status the server documents (no crash, hang, leak or sanitizer report).
 *
 *   CC=clang cmake -B build-fuzz -DQUIRE_FUZZ=ON -DBUILD_TESTING=OFF
 *   cmake --build build-fuzz --target fuzz_http
 *   cp -r tests/fuzz/corpus/http /tmp/corpus && ./build-fuzz/fuzz_http /tmp/corpus
 */
#include "http.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const qhttp_limits LIM = { 2048, 512, 4096, 32 };

static void check_request(const qhttp_req *r)
{
    if (r->body_len > LIM.max_body || (r->body_len && !r->body) || !r->path || !r->query) abort();
    if (strlen(r->path) > LIM.max_uri || r->n_headers > LIM.max_headers) abort();
    const char *allow = NULL;
    const qroute q = qhttp_route(r->method, r->path, &allow);
    if ((q == QR_BAD_METHOD && !allow) || (int)q < 0 || q >= QR_COUNT) abort();
    const qroute_info *ri = qhttp_route_info(q);
    /* A row's path is the request's, whole or (QM_PREFIX) its start. */
    if (ri->path && strncmp(r->path, ri->path, strlen(ri->path))) abort();
    if (!ri->endpoint) abort();
    char head[512];
    (void)qhttp_head(head, sizeof head, 200, "application/json", (long long)r->body_len, 0, r->keep_alive, NULL);
    (void)qhttp_header_has(r, "connection", "upgrade");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size) return 0;
    const size_t piece = 1 + data[0] % 64;
    data++, size--;
    qhttp h;
    qhttp_init(&h, &LIM);
    int requests = 0;
    for (size_t i = 0; i < size;) {
        const size_t n = size - i < piece ? size - i : piece;
        if (qhttp_feed(&h, (const char *)data + i, n)) break;
        i += n;
        for (;;) {
            const qhttp_rc rc = qhttp_parse(&h);
            if (rc == QHTTP_R_MORE) break;
            if (rc == QHTTP_R_HEAD) continue;
            if (rc == QHTTP_R_ERROR) {
                static const int ok[] = { 400, 411, 413, 414, 417, 431, 500, 501, 505 };
                int found = 0;
                for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) found |= h.status == ok[k];
                if (!found || !h.err[0]) abort();
                goto done;
            }
            check_request(&h.req);
            if (++requests > 1000) goto done;
            qhttp_next(&h);
        }
    }
done:
    qhttp_free(&h);
    return 0;
}
