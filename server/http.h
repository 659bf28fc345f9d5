/* http.h - HTTP/1.1 requests read from bytes (RFC 9112), with no socket.
 *
 * The server's connections feed what they receive to qhttp_feed; it gives
 * back a whole request (head and body, the body de-chunked), a request
 * whose head is read (so that a body too large is refused before it is
 * sent, and "Expect: 100-continue" answered), a need for more bytes, or an
 * error with the status to answer before closing.  Bytes after a request
 * stay in the parser for the next one (pipelining: requests are answered in
 * order, one at a time).  Every size is bounded by qhttp_limits, so no
 * client can make the parser hold more than max_header + max_body bytes.
 *
 * Also here: the routes (method and path to an endpoint) and the head of a
 * reply, so that the fuzz target runs the same code as the server. */
#ifndef QUIRE_HTTP_H
#define QUIRE_HTTP_H

#include <stddef.h>

typedef struct {
    size_t max_header; /* request line and headers, in bytes (431 past it) */
    size_t max_uri;    /* the request target (414 past it) */
    size_t max_body;   /* the body, declared or de-chunked (413 past it) */
    int max_headers;   /* header lines (431 past it) */
} qhttp_limits;

typedef enum {
    QHTTP_M_OTHER = 0, /* a method this server does not implement (501) */
    QHTTP_GET,
    QHTTP_HEAD,
    QHTTP_POST,
    QHTTP_PUT,
    QHTTP_DELETE,
    QHTTP_PATCH,
    QHTTP_OPTIONS,
    QHTTP_CONNECT,
    QHTTP_TRACE,
} qhttp_method;

typedef struct {
    const char *name, *value; /* NUL-terminated, inside the parser's buffer */
} qhttp_header;

#define QHTTP_MAX_HEADERS 128

/* A request as read.  Strings point into the parser and live until the
 * next qhttp_next. */
typedef struct {
    qhttp_method method;
    const char *method_name;
    char *path;           /* percent-decoded, no NUL inside, valid UTF-8 */
    const char *query;    /* after '?', as sent ("" for none) */
    int minor;            /* HTTP/1.minor */
    int keep_alive;       /* the connection may carry another request */
    int expect_continue;  /* "Expect: 100-continue" */
    int chunked;          /* the body came chunked */
    long long content_length; /* declared, -1 for none */
    qhttp_header headers[QHTTP_MAX_HEADERS];
    int n_headers;
    char *body;           /* NUL-terminated; NULL for none */
    size_t body_len;
} qhttp_req;

typedef enum {
    QHTTP_R_MORE = 0,  /* more bytes are needed */
    QHTTP_R_HEAD = 1,  /* the head is read, the body not yet (returned once) */
    QHTTP_R_DONE = 2,  /* a whole request is in req */
    QHTTP_R_ERROR = 3, /* answer status (reason in err) and close */
} qhttp_rc;

typedef struct {
    qhttp_limits lim;
    char *in;          /* bytes received, not yet consumed */
    size_t in_len, in_cap;
    size_t scan;       /* where the search for the head's end resumes */
    int phase;         /* 0 head, 1 body by length, 2 chunk size, 3 chunk data, 4 chunk end, 5 trailers, 6 done */
    size_t head_len;   /* bytes of the head in `in` */
    size_t pos;        /* body phases: read position in `in` */
    unsigned long long chunk_left;
    char *head;        /* the head, copied and cut into strings */
    char *body;
    size_t body_len, body_cap;
    qhttp_req req;
    int status;        /* QHTTP_R_ERROR: the status to answer */
    char err[160];     /* QHTTP_R_ERROR: why, for the client */
} qhttp;

/* A parser with limits lim; qhttp_free releases it.  Cannot fail. */
void qhttp_init(qhttp *h, const qhttp_limits *lim);
void qhttp_free(qhttp *h);
/* Adds n received bytes: 0, or -1 when the parser already holds more than
 * a request can be (max_header + max_body + 64 KiB: a client that sends far
 * ahead of its answers) or memory runs out. */
int qhttp_feed(qhttp *h, const char *data, size_t n);
/* Reads as far as the bytes go (see qhttp_rc).  After QHTTP_R_DONE the
 * request stays until qhttp_next; after QHTTP_R_ERROR the parser stays in
 * error. */
qhttp_rc qhttp_parse(qhttp *h);
/* Drops the finished request, keeping the bytes after it (the next one). */
void qhttp_next(qhttp *h);
/* Whether bytes of another request are waiting. */
int qhttp_pending(const qhttp *h);
/* A header's value by name (case-insensitive), or NULL. */
const char *qhttp_header_get(const qhttp_req *r, const char *name);
/* Whether a comma-separated header holds token tok (case-insensitive). */
int qhttp_header_has(const qhttp_req *r, const char *name, const char *tok);

/* The reason phrase of a status. */
const char *qhttp_reason(int status);
/* The head of a reply into out (cap bytes): status line, content-type (NULL:
 * none), content-length (negative: none; with chunked 1, a chunked body),
 * connection close or keep-alive, then extra (NULL or header lines, each
 * ending in CRLF) and the empty line.  Its length, or 0 when it does not
 * fit. */
size_t qhttp_head(char *out, size_t cap, int status, const char *ctype, long long length, int chunked,
                  int keep_alive, const char *extra);

/* The endpoints, one row each: its name, path, the methods it takes, who
 * checks the API key, and the name /metrics counts it under.  http.c
 * matches requests against the rows; serve_http.c calls each row's handler
 * (route_<name>), so no row can lack one.  Methods: QM_GET (GET and HEAD),
 * QM_GET_ONLY (no HEAD: the WebSocket handshake), QM_POST, QM_PATCH,
 * QM_DELETE; QM_PREFIX: the path is a prefix that a non-empty rest follows.
 * Key: QA_ROUTER (checked once, before the handler: 401), QA_HANDLER (the
 * handler answers its own malformed requests first, then 401: the
 * WebSocket handshake, the sessions), 0 (open). */
enum { QM_GET = 1, QM_GET_ONLY = 2, QM_POST = 4, QM_PATCH = 8, QM_DELETE = 16, QM_PREFIX = 32 };
enum { QA_OPEN = 0, QA_ROUTER = 1, QA_HANDLER = 2 };
#define QHTTP_ROUTES(X)                                                                           \
    X(HEALTH, "/health", QM_GET, QA_OPEN, "health")                                               \
    X(MODELS, "/v1/models", QM_GET, QA_ROUTER, "models")                                          \
    X(MODEL, "/v1/models/", QM_GET | QM_PREFIX, QA_ROUTER, "models")                              \
    X(METRICS, "/metrics", QM_GET, QA_OPEN, "metrics")                                            \
    X(VERSION, "/version", QM_GET, QA_OPEN, "version")                                            \
    X(CHAT, "/v1/chat/completions", QM_POST, QA_ROUTER, "chat")                                   \
    X(COMPLETIONS, "/v1/completions", QM_POST, QA_ROUTER, "completions")                          \
    X(TOKENIZE, "/tokenize", QM_POST, QA_ROUTER, "tokenize")                                      \
    X(DETOKENIZE, "/detokenize", QM_POST, QA_ROUTER, "detokenize")                                \
    X(WS, "/v1/ws", QM_GET_ONLY, QA_HANDLER, "ws")                                                \
    X(SESSIONS, "/v1/sessions", QM_GET, QA_HANDLER, "sessions")                                   \
    X(SESSION, "/v1/sessions/", QM_GET | QM_PATCH | QM_DELETE | QM_PREFIX, QA_HANDLER, "sessions")

/* What qhttp_route picks: a row of the table, or one of the answers for
 * requests no row takes. */
typedef enum {
    QR_NONE = 0,   /* no such path: 404 */
    QR_BAD_METHOD, /* the path exists, not with this method: 405 */
    QR_OPTIONS,    /* OPTIONS of any path: a CORS preflight, or 405 */
    QR_STATIC,     /* GET/HEAD of anything else: a file of the web folder, or 404 */
#define QR_ENUM_(name, path, methods, key, endpoint) QR_##name,
    QHTTP_ROUTES(QR_ENUM_)
#undef QR_ENUM_
    QR_COUNT
} qroute;

typedef struct {
    const char *path;
    unsigned methods;
    int key;                /* QA_* */
    const char *endpoint;
} qroute_info;

/* The row of route r (QR_NONE and the others without a row: path NULL,
 * endpoint "other"; QR_STATIC "static").  Cannot fail. */
const qroute_info *qhttp_route_info(qroute r);
/* Picks the route for a method and a path; *allow gets the methods the
 * path takes (for 405). */
qroute qhttp_route(qhttp_method m, const char *path, const char **allow);

#endif
