/* test_http.c - HTTP/1.1 requests and WebSocket frames read from bytes
 * (server/http.c, server/ws.c): whole requests fed in every split, bodies
 * by length and by chunks, pipelined requests, each refusal with its status,
 * the routes, and frames: the RFC's handshake example, masks, fragments,
 * control frames, dropped large messages and protocol errors. */
#include "http.h"
#include "qtest.h"
#include "ws.h"

static const qhttp_limits LIM = { 16384, 8192, 1024, 100 };

/* Feeds s in pieces of k bytes (0: whole); the first result other than MORE. */
static size_t fed;
static qhttp_rc feed_in(qhttp *h, const char *s, size_t n, size_t k)
{
    qhttp_rc rc = QHTTP_R_MORE;
    for (size_t i = fed = 0; i < n; fed = i) {
        const size_t m = k && n - i > k ? k : n - i;
        if (qhttp_feed(h, s + i, m)) return QHTTP_R_ERROR;
        i += m;
        fed = i;
        while ((rc = qhttp_parse(h)) == QHTTP_R_HEAD) {
        }
        if (rc != QHTTP_R_MORE) return rc;
    }
    return rc;
}

static int status_of(const char *req)
{
    qhttp h;
    qhttp_init(&h, &LIM);
    const qhttp_rc rc = feed_in(&h, req, strlen(req), 0);
    const int st = rc == QHTTP_R_ERROR ? h.status : rc == QHTTP_R_DONE ? 200 : 0;
    qhttp_free(&h);
    return st;
}

static void test_request_in_every_split(void)
{
    const char req[] = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                       "Content-Length: 11\r\n\r\n{\"a\": true}";
    for (size_t k = 0; k <= 8; k++) {
        qhttp h;
        qhttp_init(&h, &LIM);
        REQUIRE(feed_in(&h, req, sizeof req - 1, k) == QHTTP_R_DONE);
        CHECK_EQ_INT(h.req.method, QHTTP_POST);
        CHECK(!strcmp(h.req.path, "/v1/completions"));
        CHECK(!strcmp(h.req.query, "x=1"));
        CHECK_EQ_INT(h.req.body_len, 11);
        CHECK(h.req.body && !strcmp(h.req.body, "{\"a\": true}"));
        CHECK(h.req.keep_alive);
        CHECK(!strcmp(qhttp_header_get(&h.req, "content-type"), "application/json"));
        CHECK(!qhttp_pending(&h));
        qhttp_free(&h);
    }
}

static void test_chunked_and_pipelined(void)
{
    const char req[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: x\r\n\r\n"
                       "GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    for (size_t k = 0; k <= 5; k++) {
        qhttp h;
        qhttp_init(&h, &LIM);
        REQUIRE(feed_in(&h, req, sizeof req - 1, k) == QHTTP_R_DONE);
        CHECK(h.req.chunked);
        CHECK_EQ_INT(h.req.body_len, 5);
        CHECK(!strcmp(h.req.body, "abcde"));
        qhttp_next(&h);
        /* The next request: what was fed of it already, then the rest. */
        REQUIRE(qhttp_feed(&h, req + fed, sizeof req - 1 - fed) == 0);
        qhttp_rc rc;
        while ((rc = qhttp_parse(&h)) == QHTTP_R_HEAD) {
        }
        REQUIRE(rc == QHTTP_R_DONE);
        CHECK_EQ_INT(h.req.method, QHTTP_GET);
        CHECK(!strcmp(h.req.path, "/health"));
        CHECK(!h.req.keep_alive);
        CHECK(!h.req.body_len);
        qhttp_free(&h);
    }
}

static void test_refusals(void)
{
    char big[20000];
    snprintf(big, sizeof big, "GET /x HTTP/1.1\r\nHost: a\r\nX: %0*d\r\n\r\n", 17000, 0);
    CHECK_EQ_INT(status_of(big), 431);
    snprintf(big, sizeof big, "GET /%0*d HTTP/1.1\r\nHost: a\r\n\r\n", 9000, 0);
    CHECK_EQ_INT(status_of(big), 414);
    CHECK_EQ_INT(status_of("GET /a%00 HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    CHECK_EQ_INT(status_of("GET /a%zz HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    CHECK_EQ_INT(status_of("GET /%ff HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    CHECK_EQ_INT(status_of("GET /%c3%a9 HTTP/1.1\r\nHost: a\r\n\r\n"), 200);
    CHECK_EQ_INT(status_of("FOO / HTTP/1.1\r\nHost: a\r\n\r\n"), 501);
    CHECK_EQ_INT(status_of("GET / HTTP/2.0\r\nHost: a\r\n\r\n"), 505);
    CHECK_EQ_INT(status_of("GET / HTTP/1.1\r\n\r\n"), 400);
    CHECK_EQ_INT(status_of("GET / HTTP/1.0\r\n\r\n"), 200);
    CHECK_EQ_INT(status_of("\x16\x03\x01\x00"), 400);
    CHECK_EQ_INT(status_of("\x01\x02\x03"), 400);
    CHECK_EQ_INT(status_of("GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n"), 400);
    CHECK_EQ_INT(status_of("POST / HTTP/1.1\r\nHost: a\r\n\r\n"), 411);
    CHECK_EQ_INT(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n"), 400);
    CHECK_EQ_INT(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2000\r\n\r\n"), 413);
    CHECK_EQ_INT(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"), 400);
    CHECK_EQ_INT(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
    CHECK_EQ_INT(status_of("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n"), 501);
    CHECK_EQ_INT(status_of("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nfffff\r\n"), 413);
    CHECK_EQ_INT(status_of("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nq\r\n"), 400);
    CHECK_EQ_INT(status_of("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc\r\n"), 400);
    CHECK_EQ_INT(status_of("POST / HTTP/1.1\r\nHost: a\r\nExpect: x\r\nContent-Length: 1\r\n\r\n"), 417);
    /* A client far ahead of its answers is cut off. */
    qhttp h;
    qhttp_init(&h, &LIM);
    static char junk[100000];
    CHECK(qhttp_feed(&h, junk, sizeof junk) == -1);
    qhttp_free(&h);
}

static void test_routes_and_head(void)
{
    const char *allow;
    CHECK_EQ_INT(qhttp_route(QHTTP_GET, "/health", &allow), QR_HEALTH);
    CHECK_EQ_INT(qhttp_route(QHTTP_HEAD, "/health", &allow), QR_HEALTH);
    CHECK_EQ_INT(qhttp_route(QHTTP_POST, "/health", &allow), QR_BAD_METHOD);
    CHECK(!strcmp(allow, "GET, HEAD"));
    CHECK_EQ_INT(qhttp_route(QHTTP_POST, "/v1/chat/completions", &allow), QR_CHAT);
    CHECK_EQ_INT(qhttp_route(QHTTP_GET, "/v1/chat/completions", &allow), QR_BAD_METHOD);
    CHECK(!strcmp(allow, "POST"));
    CHECK_EQ_INT(qhttp_route(QHTTP_GET, "/v1/ws", &allow), QR_WS);
    CHECK_EQ_INT(qhttp_route(QHTTP_DELETE, "/v1/sessions/abc", &allow), QR_SESSION);
    CHECK(!strcmp(allow, "GET, HEAD, PATCH, DELETE"));
    CHECK_EQ_INT(qhttp_route(QHTTP_HEAD, "/v1/ws", &allow), QR_BAD_METHOD);
    CHECK(!strcmp(allow, "GET"));
    CHECK_EQ_INT(qhttp_route_info(QR_CHAT)->key, QA_ROUTER);
    CHECK(!strcmp(qhttp_route_info(QR_DETOKENIZE)->endpoint, "detokenize"));
    CHECK_EQ_INT(qhttp_route(QHTTP_DELETE, "/v1/sessions", &allow), QR_BAD_METHOD);
    CHECK_EQ_INT(qhttp_route(QHTTP_TRACE, "/", &allow), QR_BAD_METHOD);
    CHECK_EQ_INT(qhttp_route(QHTTP_GET, "/index.html", &allow), QR_STATIC);
    CHECK_EQ_INT(qhttp_route(QHTTP_POST, "/nope", &allow), QR_NONE);
    CHECK_EQ_INT(qhttp_route(QHTTP_GET, "/v1/models/stories260K", &allow), QR_MODEL);
    CHECK_EQ_INT(qhttp_route(QHTTP_POST, "/v1/models/x", &allow), QR_BAD_METHOD);
    CHECK_EQ_INT(qhttp_route(QHTTP_GET, "/v1/models/", &allow), QR_STATIC);
    CHECK_EQ_INT(qhttp_route(QHTTP_GET, "/version", &allow), QR_VERSION);
    CHECK_EQ_INT(qhttp_route(QHTTP_POST, "/tokenize", &allow), QR_TOKENIZE);
    CHECK_EQ_INT(qhttp_route(QHTTP_POST, "/detokenize", &allow), QR_DETOKENIZE);
    CHECK_EQ_INT(qhttp_route(QHTTP_GET, "/tokenize", &allow), QR_BAD_METHOD);
    CHECK_EQ_INT(qhttp_route(QHTTP_OPTIONS, "/v1/chat/completions", &allow), QR_OPTIONS);
    char head[256];
    const size_t n = qhttp_head(head, sizeof head, 413, "application/json", 12, 0, 0, "x-a: b\r\n");
    REQUIRE(n > 0);
    CHECK(!strcmp(head, "HTTP/1.1 413 Content Too Large\r\ncontent-type: application/json\r\ncontent-length: 12\r\n"
                        "connection: close\r\nx-a: b\r\n\r\n"));
    CHECK_EQ_INT(qhttp_head(head, 20, 200, "text/plain", 1, 0, 1, NULL), 0);
}

/* A client frame: masked, opcode op, fin. */
static size_t client_frame(char *out, int op, int fin, const char *payload, size_t n)
{
    size_t k = 0;
    out[k++] = (char)((fin ? 0x80 : 0) | op);
    if (n < 126) out[k++] = (char)(0x80 | n);
    else out[k++] = (char)(0x80 | 126), out[k++] = (char)(n >> 8), out[k++] = (char)n;
    const char mask[4] = { 0x11, 0x22, 0x33, 0x44 };
    memcpy(out + k, mask, 4);
    k += 4;
    for (size_t i = 0; i < n; i++) out[k + i] = (char)(payload[i] ^ mask[i & 3]);
    return k + n;
}

static void test_websocket(void)
{
    char acc[29];
    qws_accept("dGhlIHNhbXBsZSBub25jZQ==", acc); /* RFC 6455's example */
    CHECK(!strcmp(acc, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="));
    qws w;
    qws_init(&w, 300);
    char buf[2048];
    size_t n = client_frame(buf, QWS_TEXT, 0, "hel", 3);
    n += client_frame(buf + n, QWS_PING, 1, "p", 1);
    n += client_frame(buf + n, 0, 1, "lo", 2);
    for (size_t i = 0; i < n; i++) REQUIRE(qws_feed(&w, buf + i, 1) == 0); /* a byte at a time */
    REQUIRE(qws_parse(&w) == QWS_EVENT);
    CHECK_EQ_INT(w.op, QWS_PING);
    CHECK(w.ctl_len == 1 && w.ctl[0] == 'p');
    REQUIRE(qws_parse(&w) == QWS_EVENT);
    CHECK_EQ_INT(w.op, QWS_TEXT);
    CHECK(w.msg_len == 5 && !strcmp(w.msg, "hello"));
    CHECK(qws_parse(&w) == QWS_MORE);
    /* Too large: dropped, and the next message still comes. */
    char big[400];
    memset(big, 'x', sizeof big);
    n = client_frame(buf, QWS_TEXT, 1, big, sizeof big);
    n += client_frame(buf + n, QWS_TEXT, 1, "ok", 2);
    REQUIRE(qws_feed(&w, buf, n) == 0);
    REQUIRE(qws_parse(&w) == QWS_EVENT);
    CHECK_EQ_INT(w.op, QWS_TOO_BIG);
    REQUIRE(qws_parse(&w) == QWS_EVENT);
    CHECK(w.op == QWS_TEXT && !strcmp(w.msg, "ok"));
    qws_free(&w);
    /* Errors with their close codes. */
    static const struct {
        const char *bytes;
        size_t n;
        int code;
    } bad[] = {
        { "\x81\x01x", 3, 1002 },                          /* unmasked */
        { "\xc1\x81\x00\x00\x00\x00x", 7, 1002 },          /* RSV1 */
        { "\x83\x81\x00\x00\x00\x00x", 7, 1002 },          /* opcode 3 */
        { "\x80\x81\x00\x00\x00\x00x", 7, 1002 },          /* continuation of nothing */
        { "\x09\x81\x00\x00\x00\x00x", 7, 1002 },          /* fragmented ping */
        { "\x81\x82\x00\x00\x00\x00\xff\xfe", 8, 1007 },   /* not UTF-8 */
        { "\x81\x82\x00\x00\x00\x00\xed\xa0", 8, 1007 },   /* cut surrogate */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qws_init(&w, 300);
        REQUIRE(qws_feed(&w, bad[i].bytes, bad[i].n) == 0);
        CHECK(qws_parse(&w) == QWS_ERROR);
        CHECK_EQ_INT(w.close_code, bad[i].code);
        qws_free(&w);
    }
    uint8_t fh[10];
    CHECK_EQ_INT(qws_frame_head(fh, QWS_TEXT, 5), 2);
    CHECK(fh[0] == 0x81 && fh[1] == 5);
    CHECK_EQ_INT(qws_frame_head(fh, QWS_TEXT, 300), 4);
    CHECK(fh[1] == 126 && fh[2] == 1 && fh[3] == 44);
    CHECK_EQ_INT(qws_frame_head(fh, QWS_CLOSE, 70000), 10);
}

int main(void)
{
    QT_RUN(test_request_in_every_split);
    QT_RUN(test_chunked_and_pipelined);
    QT_RUN(test_refusals);
    QT_RUN(test_routes_and_head);
    QT_RUN(test_websocket);
    QT_MAIN_END();
}
