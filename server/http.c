/* http.c - HTTP/1.1 requests read from bytes (http.h).
 *
 * The head is read once its blank line has arrived (searched from where the
 * last search stopped, so a slow client costs nothing quadratic), copied
 * and cut into strings; the body is then read by Content-Length or by
 * chunks straight into a buffer of its own.  What the parser refuses, and
 * with which status:
 *   400  a malformed request line, header, length or chunk; Content-Length
 *        beside Transfer-Encoding (request smuggling); a path with %00, a
 *        bad escape or bytes that are not UTF-8; HTTP/1.1 without Host
 *   411  POST, PUT or PATCH with neither Content-Length nor chunks
 *   413  a body declared or de-chunked past max_body (at once: the client
 *        has not sent it yet)
 *   414  a request target past max_uri
 *   417  an Expect other than 100-continue
 *   431  a head past max_header bytes or max_headers lines
 *   501  an unknown method, or a transfer coding other than chunked
 *   505  an HTTP version other than 1.0 and 1.1 */
#define _GNU_SOURCE
#include "http.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"
#include "util.h"
#include <strings.h>

#define SLACK ((size_t)64 << 10)

void qhttp_init(qhttp *h, const qhttp_limits *lim)
{
    memset(h, 0, sizeof *h);
    h->lim = *lim;
    h->req.content_length = -1;
}

void qhttp_free(qhttp *h)
{
    free(h->in);
    free(h->head);
    free(h->body);
    memset(h, 0, sizeof *h);
}

int qhttp_feed(qhttp *h, const char *data, size_t n)
{
    if (!n) return 0;
    if (h->in_len + n > h->lim.max_header + h->lim.max_body + SLACK) return -1;
    if (h->in_len + n > h->in_cap) {
        size_t cap = h->in_cap ? h->in_cap : 4096;
        while (cap < h->in_len + n) cap *= 2;
        char *b = realloc(h->in, cap);
        if (!b) return -1;
        h->in = b, h->in_cap = cap;
    }
    memcpy(h->in + h->in_len, data, n);
    h->in_len += n;
    return 0;
}

static qhttp_rc fail(qhttp *h, int status, const char *why)
{
    h->status = status;
    snprintf(h->err, sizeof h->err, "%s", why);
    h->phase = 7;
    return QHTTP_R_ERROR;
}

static int is_tchar(unsigned char c)
{
    return isalnum(c) || strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static const struct {
    const char *name;
    qhttp_method m;
} METHODS[] = { { "GET", QHTTP_GET },         { "HEAD", QHTTP_HEAD },       { "POST", QHTTP_POST },
                { "PUT", QHTTP_PUT },         { "DELETE", QHTTP_DELETE },   { "PATCH", QHTTP_PATCH },
                { "OPTIONS", QHTTP_OPTIONS }, { "CONNECT", QHTTP_CONNECT }, { "TRACE", QHTTP_TRACE } };

/* The request target into a path and a query: origin form ("/p?q"),
 * absolute form ("http://host/p?q", which servers must accept) or "*". */
static qhttp_rc parse_target(qhttp *h, char *t)
{
    qhttp_req *r = &h->req;
    if (!strncasecmp(t, "http://", 7) || !strncasecmp(t, "https://", 8)) {
        char *s = strchr(t + (t[4] == ':' ? 7 : 8), '/');
        if (!s) t[0] = '/', t[1] = 0; /* "http://host": its root (the buffer is ours to write) */
        else t = s;
    }
    if (!strcmp(t, "*") || r->method == QHTTP_CONNECT) {
        r->path = t;
        r->query = "";
        return QHTTP_R_MORE;
    }
    if (t[0] != '/') return fail(h, 400, "the request target is not a path");
    char *q = strchr(t, '?');
    if (q) *q++ = 0;
    r->query = q ? q : "";
    /* Percent-decoding in place (it only shortens). */
    char *w = t;
    for (const char *s = t; *s; s++) {
        if (*s != '%') {
            *w++ = *s;
            continue;
        }
        const int a = hexval(s[1]), b = a < 0 ? -1 : hexval(s[2]);
        if (b < 0) return fail(h, 400, "the path has a bad %-escape");
        if (!(a | b)) return fail(h, 400, "the path holds %00");
        *w++ = (char)(a * 16 + b);
        s += 2;
    }
    *w = 0;
    if (!qutf8_valid(t, (size_t)(w - t))) return fail(h, 400, "the path is not UTF-8");
    r->path = t;
    return QHTTP_R_MORE;
}

/* The request line and headers in h->head (NUL-terminated, len bytes). */
static qhttp_rc parse_head(qhttp *h, size_t len)
{
    qhttp_req *r = &h->req;
    char *s = h->head, *end = h->head + len;
    /* The request line. */
    char *nl = memchr(s, '\n', (size_t)(end - s));
    if (!nl) return fail(h, 400, "no request line");
    *nl = 0;
    if (nl > s && nl[-1] == '\r') nl[-1] = 0;
    char *sp1 = strchr(s, ' ');
    if (!sp1 || sp1 == s) return fail(h, 400, "a malformed request line");
    *sp1 = 0;
    for (char *c = s; *c; c++)
        if (!is_tchar((unsigned char)*c)) return fail(h, 400, "a malformed request line");
    r->method_name = s;
    r->method = QHTTP_M_OTHER;
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (!strcmp(s, METHODS[i].name)) r->method = METHODS[i].m;
    char *target = sp1 + 1, *sp2 = strchr(target, ' ');
    if (!sp2 || sp2 == target) return fail(h, 400, "a malformed request line");
    *sp2 = 0;
    if (strlen(target) > h->lim.max_uri) return fail(h, 414, "the request target is too long");
    for (const unsigned char *c = (const unsigned char *)target; *c; c++)
        if (*c <= 0x20 || *c == 0x7f) return fail(h, 400, "a malformed request target");
    const char *ver = sp2 + 1;
    if (strncmp(ver, "HTTP/", 5) || !isdigit((unsigned char)ver[5]) || ver[6] != '.' ||
        !isdigit((unsigned char)ver[7]) || ver[8])
        return fail(h, 400, "a malformed request line");
    if (ver[5] != '1' || (ver[7] != '0' && ver[7] != '1')) return fail(h, 505, "only HTTP/1.0 and HTTP/1.1 are served");
    r->minor = ver[7] - '0';
    if (r->method == QHTTP_M_OTHER) return fail(h, 501, "this method is not implemented");
    /* Headers. */
    for (s = nl + 1; s < end;) {
        nl = memchr(s, '\n', (size_t)(end - s));
        if (!nl) nl = end;
        *nl = 0;
        if (nl > s && nl[-1] == '\r') nl[-1] = 0;
        if (!*s) break; /* the blank line */
        if (*s == ' ' || *s == '\t') return fail(h, 400, "folded header lines are not accepted");
        char *colon = strchr(s, ':');
        if (!colon || colon == s) return fail(h, 400, "a malformed header line");
        *colon = 0;
        for (char *c = s; *c; c++)
            if (!is_tchar((unsigned char)*c)) return fail(h, 400, "a malformed header name");
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        char *ve = v + strlen(v);
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) *--ve = 0;
        for (const unsigned char *c = (const unsigned char *)v; *c; c++)
            if ((*c < 0x20 && *c != '\t') || *c == 0x7f) return fail(h, 400, "a control character in a header");
        if (r->n_headers >= h->lim.max_headers || r->n_headers >= QHTTP_MAX_HEADERS)
            return fail(h, 431, "too many header lines");
        r->headers[r->n_headers++] = (qhttp_header){ s, v };
        s = nl + 1;
    }
    /* Framing: Content-Length or chunks, never both. */
    const char *te = NULL;
    int n_te = 0;
    r->content_length = -1;
    for (int i = 0; i < r->n_headers; i++) {
        const qhttp_header *x = &r->headers[i];
        if (!strcasecmp(x->name, "content-length")) {
            const char *v = x->value;
            if (!*v || strlen(v) > 18 || strspn(v, "0123456789") != strlen(v))
                return fail(h, 400, "a malformed Content-Length");
            const long long n = strtoll(v, NULL, 10);
            if (r->content_length >= 0 && r->content_length != n) return fail(h, 400, "two different Content-Lengths");
            r->content_length = n;
        } else if (!strcasecmp(x->name, "transfer-encoding")) {
            te = x->value, n_te++;
        }
    }
    if (te && r->content_length >= 0) return fail(h, 400, "Content-Length beside Transfer-Encoding is refused");
    if (te) {
        if (r->minor == 0) return fail(h, 400, "Transfer-Encoding in HTTP/1.0");
        if (n_te > 1 || strcasecmp(te, "chunked")) return fail(h, 501, "only the chunked transfer coding is served");
        r->chunked = 1;
    }
    if (r->minor == 1 && !qhttp_header_get(r, "host")) return fail(h, 400, "HTTP/1.1 without Host");
    const char *ex = qhttp_header_get(r, "expect");
    if (ex) {
        if (strcasecmp(ex, "100-continue")) return fail(h, 417, "only Expect: 100-continue is understood");
        r->expect_continue = 1;
    }
    if (!r->chunked && r->content_length < 0 &&
        (r->method == QHTTP_POST || r->method == QHTTP_PUT || r->method == QHTTP_PATCH))
        return fail(h, 411, "a body needs Content-Length or chunked Transfer-Encoding");
    if (r->content_length > 0 && (unsigned long long)r->content_length > h->lim.max_body)
        return fail(h, 413, "the body is larger than this server takes");
    r->keep_alive = r->minor == 1 ? !qhttp_header_has(r, "connection", "close")
                                  : qhttp_header_has(r, "connection", "keep-alive");
    if (r->method == QHTTP_CONNECT) r->keep_alive = 0;
    return parse_target(h, target);
}

static int body_put(qhttp *h, const char *s, size_t n)
{
    if (h->body_len + n > h->lim.max_body) return -1;
    if (h->body_len + n + 1 > h->body_cap) {
        size_t cap = h->body_cap ? h->body_cap : 1024;
        while (cap < h->body_len + n + 1) cap *= 2;
        char *b = realloc(h->body, cap);
        if (!b) return -2;
        h->body = b, h->body_cap = cap;
    }
    if (n) memcpy(h->body + h->body_len, s, n);
    h->body_len += n;
    h->body[h->body_len] = 0;
    return 0;
}

/* A line in `in` from h->pos: its length up to (not with) CRLF/LF, and *next
 * past it; -1 when its end has not arrived. */
static long line_at(const qhttp *h, size_t *next)
{
    const char *s = h->in + h->pos, *nl = memchr(s, '\n', h->in_len - h->pos);
    if (!nl) return -1;
    *next = (size_t)(nl - h->in) + 1;
    size_t n = (size_t)(nl - s);
    if (n && s[n - 1] == '\r') n--;
    return (long)n;
}

static qhttp_rc read_chunks(qhttp *h)
{
    for (;;) {
        size_t next;
        long n;
        switch (h->phase) {
        case 2: /* a chunk's size line */
            if ((n = line_at(h, &next)) < 0) {
                if (h->in_len - h->pos > 1024) return fail(h, 400, "a malformed chunk size");
                return QHTTP_R_MORE;
            }
            {
                const char *s = h->in + h->pos;
                unsigned long long v = 0;
                long i = 0;
                for (; i < n && hexval(s[i]) >= 0; i++) {
                    if (i >= 15) return fail(h, 413, "the body is larger than this server takes");
                    v = v * 16 + (unsigned)hexval(s[i]);
                }
                if (!i || (i < n && s[i] != ';' && s[i] != ' ' && s[i] != '\t'))
                    return fail(h, 400, "a malformed chunk size");
                if (h->body_len + v > h->lim.max_body) return fail(h, 413, "the body is larger than this server takes");
                h->pos = next;
                h->chunk_left = v;
                h->phase = v ? 3 : 5;
            }
            break;
        case 3: { /* chunk data */
            size_t k = h->in_len - h->pos;
            if (k > h->chunk_left) k = (size_t)h->chunk_left;
            const int rc = body_put(h, h->in + h->pos, k);
            if (rc == -1) return fail(h, 413, "the body is larger than this server takes");
            if (rc) return fail(h, 500, "out of memory");
            h->pos += k, h->chunk_left -= k;
            if (h->chunk_left) return QHTTP_R_MORE;
            h->phase = 4;
            break;
        }
        case 4: /* the CRLF after the data */
            if ((n = line_at(h, &next)) < 0) {
                if (h->in_len - h->pos >= 2) return fail(h, 400, "a chunk longer than its size");
                return QHTTP_R_MORE;
            }
            if (n) return fail(h, 400, "a chunk longer than its size");
            h->pos = next;
            h->phase = 2;
            break;
        case 5: /* trailers up to a blank line */
            if ((n = line_at(h, &next)) < 0) {
                if (h->in_len - h->pos > h->lim.max_header) return fail(h, 431, "the trailers are too large");
                return QHTTP_R_MORE;
            }
            h->pos = next;
            if (!n) {
                h->phase = 6;
                return QHTTP_R_DONE;
            }
            break;
        default:
            return QHTTP_R_MORE;
        }
    }
}

qhttp_rc qhttp_parse(qhttp *h)
{
    qhttp_req *r = &h->req;
    if (h->phase == 7) return QHTTP_R_ERROR;
    if (h->phase == 6) return QHTTP_R_DONE;
    if (h->phase == 0) {
        /* Empty lines before a request are ignored (RFC 9112 2.2). */
        size_t skip = 0;
        while (skip < h->in_len && (h->in[skip] == '\r' || h->in[skip] == '\n')) skip++;
        if (skip) {
            memmove(h->in, h->in + skip, h->in_len - skip);
            h->in_len -= skip;
            h->scan = 0;
        }
        if (h->in_len && (unsigned char)h->in[0] == 0x16)
            return fail(h, 400, "TLS is not served on this port");
        /* The method's bytes are checked as they come, so that garbage is
         * refused at once rather than when a blank line never arrives. */
        for (size_t i = 0; i < h->in_len && h->in[i] != ' '; i++)
            if (i >= 32 || !is_tchar((unsigned char)h->in[i])) return fail(h, 400, "this is not an HTTP request");
        /* The head ends at the first blank line (CRLF CRLF or LF LF). */
        size_t end = 0;
        for (size_t i = h->scan; i < h->in_len && !end; i++)
            if (h->in[i] == '\n' && ((i >= 1 && h->in[i - 1] == '\n') || (i >= 2 && h->in[i - 1] == '\r' && h->in[i - 2] == '\n')))
                end = i + 1;
        if (!end) {
            h->scan = h->in_len > 2 ? h->in_len - 2 : 0;
            const char *nl = memchr(h->in, '\n', h->in_len);
            if (!nl && h->in_len > h->lim.max_uri + 32) return fail(h, 414, "the request target is too long");
            if (h->in_len > h->lim.max_header) return fail(h, 431, "the request's headers are too large");
            return QHTTP_R_MORE;
        }
        if (end > h->lim.max_header) {
            const char *nl = memchr(h->in, '\n', end);
            if (nl && (size_t)(nl - h->in) > h->lim.max_uri + 32) return fail(h, 414, "the request target is too long");
            return fail(h, 431, "the request's headers are too large");
        }
        free(h->head);
        if (!(h->head = malloc(end + 1))) return fail(h, 500, "out of memory");
        memcpy(h->head, h->in, end);
        h->head[end] = 0;
        h->head_len = end;
        h->pos = end;
        const qhttp_rc rc = parse_head(h, end);
        if (rc == QHTTP_R_ERROR) return rc;
        h->body_len = 0;
        h->phase = r->chunked ? 2 : 1;
        if (r->content_length > 0 || r->chunked) {
            return QHTTP_R_HEAD;
        }
    }
    if (h->phase == 1) {
        const size_t want = r->content_length > 0 ? (size_t)r->content_length : 0;
        if (h->in_len - h->pos < want) return QHTTP_R_MORE;
        if (body_put(h, h->in + h->pos, want)) return fail(h, 500, "out of memory");
        h->pos += want;
        h->phase = 6;
    } else {
        const qhttp_rc rc = read_chunks(h);
        if (rc != QHTTP_R_DONE) return rc;
    }
    r->body = h->body;
    r->body_len = h->body_len;
    return QHTTP_R_DONE;
}

void qhttp_next(qhttp *h)
{
    const size_t used = h->phase == 6 ? h->pos : 0;
    memmove(h->in, h->in + used, h->in_len - used);
    h->in_len -= used;
    h->scan = 0, h->pos = 0, h->head_len = 0, h->phase = 0, h->chunk_left = 0;
    h->body_len = 0;
    memset(&h->req, 0, sizeof h->req);
    h->req.content_length = -1;
}

int qhttp_pending(const qhttp *h) { return h->in_len > (h->phase == 6 ? h->pos : 0); }

const char *qhttp_header_get(const qhttp_req *r, const char *name)
{
    for (int i = 0; i < r->n_headers; i++)
        if (!strcasecmp(r->headers[i].name, name)) return r->headers[i].value;
    return NULL;
}

int qhttp_header_has(const qhttp_req *r, const char *name, const char *tok)
{
    const size_t tl = strlen(tok);
    for (int i = 0; i < r->n_headers; i++) {
        if (strcasecmp(r->headers[i].name, name)) continue;
        for (const char *s = r->headers[i].value; *s;) {
            while (*s == ' ' || *s == '\t' || *s == ',') s++;
            const size_t n = strcspn(s, ", \t");
            if (n == tl && !strncasecmp(s, tok, tl)) return 1;
            s += n;
        }
    }
    return 0;
}

const char *qhttp_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 426: return "Upgrade Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

size_t qhttp_head(char *out, size_t cap, int status, const char *ctype, long long length, int chunked,
                  int keep_alive, const char *extra)
{
    int n = snprintf(out, cap, "HTTP/1.1 %d %s\r\n", status, qhttp_reason(status));
    if (n < 0 || (size_t)n >= cap) return 0;
    size_t k = (size_t)n;
#define PUT(...)                                                                                                       \
    do {                                                                                                               \
        n = snprintf(out + k, cap - k, __VA_ARGS__);                                                                   \
        if (n < 0 || (size_t)n >= cap - k) return 0;                                                                   \
        k += (size_t)n;                                                                                                \
    } while (0)
    if (ctype) PUT("content-type: %s\r\n", ctype);
    if (chunked) PUT("transfer-encoding: chunked\r\n");
    else if (length >= 0) PUT("content-length: %lld\r\n", length);
    PUT("connection: %s\r\n", keep_alive ? "keep-alive" : "close");
    if (extra) PUT("%s", extra);
    PUT("\r\n");
#undef PUT
    return k;
}

static const qroute_info route_rows[QR_COUNT] = {
    [QR_NONE] = { NULL, 0, QA_OPEN, "other" },
    [QR_BAD_METHOD] = { NULL, 0, QA_OPEN, "other" },
    [QR_OPTIONS] = { NULL, 0, QA_OPEN, "other" },
    [QR_STATIC] = { NULL, QM_GET, QA_OPEN, "static" },
#define QR_ROW_(name, path, methods, key, endpoint) [QR_##name] = { path, methods, key, endpoint },
    QHTTP_ROUTES(QR_ROW_)
#undef QR_ROW_
};

const qroute_info *qhttp_route_info(qroute r)
{
    return &route_rows[r >= 0 && r < QR_COUNT ? r : QR_NONE];
}

/* The "allow" header's value for a row's methods. */
static const char *allow_of(unsigned methods)
{
    static const struct { unsigned m; const char *allow; } forms[] = {
        { QM_GET, "GET, HEAD" },
        { QM_GET_ONLY, "GET" },
        { QM_POST, "POST" },
        { QM_GET | QM_PATCH | QM_DELETE, "GET, HEAD, PATCH, DELETE" },
    };
    methods &= ~(unsigned)QM_PREFIX;
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
        if (forms[i].m == methods) return forms[i].allow;
    return "GET, HEAD, POST, PATCH, DELETE";
}

qroute qhttp_route(qhttp_method m, const char *path, const char **allow)
{
    *allow = "GET, HEAD";
    if (m == QHTTP_OPTIONS) return QR_OPTIONS;
    const int get = m == QHTTP_GET || m == QHTTP_HEAD;
    if (!get && m != QHTTP_POST && m != QHTTP_PATCH && m != QHTTP_DELETE) {
        *allow = "GET, HEAD, POST, PATCH, DELETE";
        return QR_BAD_METHOD; /* PUT, TRACE, CONNECT: on no path */
    }
    const unsigned want = m == QHTTP_GET ? QM_GET | QM_GET_ONLY : m == QHTTP_HEAD ? QM_GET : m == QHTTP_POST ? QM_POST
                          : m == QHTTP_PATCH ? QM_PATCH : QM_DELETE;
    for (int r = QR_STATIC + 1; r < QR_COUNT; r++) {
        const qroute_info *ri = &route_rows[r];
        const size_t n = strlen(ri->path);
        const int hit = ri->methods & QM_PREFIX ? !strncmp(path, ri->path, n) && path[n] : !strcmp(path, ri->path);
        if (!hit) continue;
        *allow = allow_of(ri->methods);
        return ri->methods & want ? (qroute)r : QR_BAD_METHOD;
    }
    return get ? QR_STATIC : QR_NONE;
}
