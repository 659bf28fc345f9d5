/* serve_http.c - the server's connections (lws thread): HTTP/1.1 read by
 * http.c over libwebsockets' raw sockets, the routes, replies, limits and
 * timeouts; a connection that upgrades goes to serve_ws.c.
 *
 * A connection reads one request at a time.  Bytes that arrive while a
 * request runs wait in its parser (pipelining: answered in order, each once
 * the one before is written), up to a bound past which the connection
 * closes.  A request must arrive whole within --request-timeout seconds of
 * its first byte (else 408 and a close); a kept-alive connection with no
 * request closes after --idle-timeout seconds.  A connection that vanishes
 * cancels its request at the next engine step (raw sockets keep reading, so
 * a closed peer is seen while its whole reply is still being made). */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "qerr.h"
#include "serve.h"
#include "buf.h"
#include "util.h"

/* ---- output ------------------------------------------------------------------------ */

static void cors_headers(pss *p, char *out, size_t cap);

/* One info line per HTTP request: method, path, status, tokens, time. */
static void log_request(pss *p, int status)
{
    serve_state *srv = p->srv;
    if (qlog_get_level() > QLOG_INFO) return;
    const qhttp_req *rq = &p->h.req;
    int pt = 0, ct = 0;
    if (p->r) {
        pthread_mutex_lock(&srv->mu);
        pt = p->r->prompt_tokens, ct = p->r->completion_tokens;
        pthread_mutex_unlock(&srv->mu);
    }
    const double ms = p->t_req > 0 ? (q_now() - p->t_req) * 1e3 : 0;
    char path[128];
    snprintf(path, sizeof path, "%s", rq->path ? rq->path : "-");
    for (char *c = path; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    if (p->r) QLOGI("serve: %s %s %d, %d prompt + %d completion tokens, %.1f ms", rq->method_name ? rq->method_name : "-", path, status, pt, ct, ms);
    else QLOGI("serve: %s %s %d, %.1f ms", rq->method_name ? rq->method_name : "-", path, status, ms);
}

void serve_want_write(pss *p)
{
    if (p->wsi) lws_callback_on_writable(p->wsi);
}

/* Bytes onto the connection's output: 0, or -1 out of memory. */
int serve_put(pss *p, const void *s, size_t n) { return q_append(&p->out, &p->out_len, &p->out_cap, s, n); }

void serve_reply_ex(struct lws *wsi, pss *p, int status, const char *ctype, char *body, size_t len, const char *extra)
{
    serve_state *srv = p->srv;
    (void)wsi;
    char head[2048], hdrs[1024];
    if (status >= 400 && status != 401 && status != 404 && status != 405 && status != 429 && status != 503)
        p->keep_alive = 0; /* framing or size errors: the rest of the stream is not to be trusted */
    if (p->h.status) p->keep_alive = 0; /* the parser refused the request */
    cors_headers(p, hdrs, sizeof hdrs);
    if (extra) snprintf(hdrs + strlen(hdrs), sizeof hdrs - strlen(hdrs), "%s", extra);
    const size_t hl = qhttp_head(head, sizeof head, status, ctype, (long long)len, 0, p->keep_alive, hdrs);
    log_request(p, status);
    if (!hl || serve_put(p, head, hl) || (!p->head_only && len && serve_put(p, body, len))) p->keep_alive = 0;
    free(body);
    p->st = ST_REPLY;
    if (p->endpoint) qmetrics_request(srv->metrics, p->endpoint, status);
    serve_want_write(p);
}

void serve_reply(struct lws *wsi, pss *p, int status, const char *ctype, char *body, size_t len)
{
    serve_reply_ex(wsi, p, status, ctype, body, len, NULL);
}

void serve_reply_json(struct lws *wsi, pss *p, int status, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        s = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
        status = 500;
    }
    serve_reply(wsi, p, status, "application/json", s, s ? strlen(s) : 0);
}

void serve_reply_error(struct lws *wsi, pss *p, const qoai_error *e) { serve_reply_json(wsi, p, e->status, qoai_error_json(e)); }

void serve_fail(struct lws *wsi, pss *p, int status, const char *type, const char *fmt, const char *arg)
{
    qoai_error e;
    qoai_fail(&e, status, type, NULL, fmt, arg);
    serve_reply_error(wsi, p, &e);
}

/* ---- who may call ---------------------------------------------------------------- */

/* The key a browser's WebSocket offers among its subprotocols (it cannot
 * send an Authorization header): "quire.key.<the key's bytes in hex>",
 * beside "quire.v1", the protocol the server answers with.  The decoded
 * key to out: its length, or -1. */
static int ws_protocol_key(const qhttp_req *rq, char *out, size_t cap)
{
    const char *v = qhttp_header_get(rq, "sec-websocket-protocol");
    char h[1024];
    if (!v || strlen(v) >= sizeof h) return -1;
    strcpy(h, v);
    char *save = NULL;
    for (char *tok = strtok_r(h, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        if (strncmp(tok, "quire.key.", 10)) continue;
        const char *x = tok + 10;
        const size_t n = strlen(x);
        if (n % 2 || n / 2 >= cap) return -1;
        for (size_t i = 0; i < n / 2; i++) {
            int v2 = 0;
            for (int j = 0; j < 2; j++) {
                const char c = x[2 * i + j];
                const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
                if (d < 0) return -1;
                v2 = v2 * 16 + d;
            }
            out[i] = (char)v2;
        }
        out[n / 2] = 0;
        return (int)(n / 2);
    }
    return -1;
}

/* Whether key (n bytes) is k: time that depends on neither's bytes nor on
 * where they differ, nor on whether the lengths do. */
static int key_equal(const char *key, size_t n, const char *k)
{
    const size_t kl = strlen(k), m = n > kl ? n : kl;
    unsigned char d = (unsigned char)(n != kl);
    for (size_t i = 0; i < m; i++)
        d |= (unsigned char)(key[n ? i % n : 0] ^ k[kl ? i % kl : 0]) | (unsigned char)(i >= n) | (unsigned char)(i >= kl);
    return d == 0;
}

int serve_authorized(pss *p)
{
    serve_state *srv = p->srv;
    if (!srv->n_keys) return 0;
    const qhttp_req *rq = &p->h.req;
    char h[1024];
    const char *key = NULL;
    size_t n = 0;
    const char *a = qhttp_header_get(rq, "authorization");
    if (a && !strncasecmp(a, "Bearer ", 7)) key = a + 7, n = strlen(key);
    else {
        const int m = ws_protocol_key(rq, h, sizeof h);
        if (m >= 0) key = h, n = (size_t)m;
    }
    if (!key) return -1;
    int found = -1;
    for (int k = 0; k < srv->n_keys; k++)
        if (key_equal(key, n, srv->keys[k])) found = k;
    return found;
}

/* host (as in a Host header or an origin, "name:port" or "[v6]:port") is a
 * loopback name or an IP literal: a name a DNS-rebinding page could not
 * have pointed at this machine. */
static int host_literal(const serve_state *srv, const char *host)
{
    char h[256];
    snprintf(h, sizeof h, "%s", host);
    if (h[0] == '[') return strchr(h, ']') != NULL;
    char *colon = strrchr(h, ':');
    if (colon) *colon = 0;
    if (!strcasecmp(h, "localhost")) return 1;
    if (srv->o.host && !strcasecmp(h, srv->o.host)) return 1; /* the name the server was told to listen on */
    if (!*h) return 0;
    for (const char *c = h; *c; c++)
        if (!((*c >= '0' && *c <= '9') || *c == '.')) return 0;
    return 1;
}

int serve_cors_listed(const serve_state *srv, const char *origin)
{
    for (int i = 0; origin && srv->origins[i]; i++)
        if (!strcmp(srv->origins[i], "*") || !strcasecmp(srv->origins[i], origin)) return 1;
    return 0;
}

/* The CORS header lines for a reply to the connection's request: an Origin
 * of --allowed-origins is echoed (as Starlette's CORSMiddleware with a
 * list; "*" with any), with Vary: Origin.  "" otherwise. */
static void cors_headers(pss *p, char *out, size_t cap)
{
    const char *origin = p->h.req.method ? qhttp_header_get(&p->h.req, "origin") : NULL;
    out[0] = 0;
    if (!origin || !serve_cors_listed(p->srv, origin) || strpbrk(origin, "\r\n")) return;
    snprintf(out, cap, "access-control-allow-origin: %.400s\r\nvary: Origin\r\n", origin);
}

int serve_origin_allowed(pss *p)
{
    const qhttp_req *rq = &p->h.req;
    const char *origin = qhttp_header_get(rq, "origin");
    if (!origin) return 1; /* not a browser */
    if (serve_cors_listed(p->srv, origin)) return 1;
    /* The server's own pages: http://HOST where HOST is the Host the
     * request was sent to, and an IP literal, localhost or --host (a DNS
     * name of the attacker's, rebound to this address, is not). */
    const char *host = qhttp_header_get(rq, "host");
    if (!host || strncasecmp(origin, "http://", 7)) return 0;
    return !strcasecmp(origin + 7, host) && host_literal(p->srv, host);
}

/* ---- routes -------------------------------------------------------------------- */

json_t *serve_model_json(const serve_state *srv, const char *id)
{
    /* speculative: how this server drafts (none, ngram, draft), for clients
     * that offer the per-request opt-out. */
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:i, s:s}", "id", id, "object", "model", "created",
                     (json_int_t)time(NULL), "owned_by", "quire", "root", srv->name, "max_model_len", srv->model->hp.max_ctx,
                     "speculative", qspec_mode_name(srv->eo.spec_mode));
}

static void route_HEALTH(struct lws *wsi, pss *p)
{
    const int up = serve_ready(p->srv), down = serve_broken(p->srv);
    if (down)
        serve_reply_json(wsi, p, 503,
                         json_pack("{s:s, s:s}", "status", "error", "message",
                                   "the backend can run no more passes (a GPU failed): restart the server"));
    else serve_reply_json(wsi, p, up ? 200 : 503, json_pack("{s:s}", "status", up ? "ok" : "loading"));
}

static void route_MODELS(struct lws *wsi, pss *p)
{
    serve_state *srv = p->srv;
    if (!serve_ready(p->srv)) return serve_fail(wsi, p, 503, "server_error", "%s", "the model is loading");
    json_t *data = json_array();
    for (int i = 0; data && srv->models[i]; i++) json_array_append_new(data, serve_model_json(srv, srv->models[i]));
    serve_reply_json(wsi, p, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static void route_VERSION(struct lws *wsi, pss *p)
{
    serve_reply_json(wsi, p, 200, json_pack("{s:s}", "version", QUIRE_VERSION));
}

static void route_METRICS(struct lws *wsi, pss *p)
{
    serve_state *srv = p->srv;
    char *s = NULL;
    size_t len = 0;
    pthread_mutex_lock(&srv->mu);
    const qengine_stats st = srv->stats;
    const int have = srv->have_stats;
    pthread_mutex_unlock(&srv->mu);
    qstore_stats sst;
    if (srv->store) qstore_stats_get(srv->store, &sst);
    if (qmetrics_render(srv->metrics, have ? &st : NULL, srv->store ? &sst : NULL, 0, &s, &len))
        return serve_fail(wsi, p, 500, "server_error", "%s", "out of memory");
    serve_reply(wsi, p, 200, "text/plain; version=0.0.4", s, len);
}

/* GET /v1/models/{id}: the model's card, or 404 as OpenAI answers. */
static void route_MODEL(struct lws *wsi, pss *p)
{
    serve_state *srv = p->srv;
    const char *id = p->h.req.path + strlen(qhttp_route_info(QR_MODEL)->path);
    if (!serve_ready(p->srv)) return serve_fail(wsi, p, 503, "server_error", "%s", "the model is loading");
    for (int i = 0; srv->models[i]; i++)
        if (!strcmp(srv->models[i], id)) return serve_reply_json(wsi, p, 200, serve_model_json(srv, srv->models[i]));
    qoai_error e;
    qoai_fail(&e, 404, "invalid_request_error", "model", "The model `%.200s` does not exist.", id);
    snprintf(e.code, sizeof e.code, "model_not_found");
    serve_reply_error(wsi, p, &e);
}

/* The pool's answer to POST /tokenize or /detokenize. */
static void tokenize_answer(sprep *j)
{
    if (!j->ok) return serve_reply_error(j->p->wsi, j->p, &j->e);
    json_t *r = j->reply;
    j->reply = NULL;
    serve_reply_json(j->p->wsi, j->p, 200, r);
}

/* OPTIONS: a CORS preflight from a listed origin is answered (any method
 * and the headers it asks for, as vLLM's defaults); one from another origin
 * gets 400, as Starlette's; OPTIONS that is not a preflight gets 405. */
static void preflight(struct lws *wsi, pss *p)
{
    const qhttp_req *rq = &p->h.req;
    const char *origin = qhttp_header_get(rq, "origin"), *method = qhttp_header_get(rq, "access-control-request-method");
    const char *hdrs = qhttp_header_get(rq, "access-control-request-headers");
    p->endpoint = "other";
    if (!origin || !method) {
        qoai_error e;
        qoai_fail(&e, 405, "invalid_request_error", NULL, "%s", "OPTIONS is only a CORS preflight here");
        json_t *j = qoai_error_json(&e);
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        return serve_reply_ex(wsi, p, 405, "application/json", s, s ? strlen(s) : 0,
                              "allow: GET, HEAD, POST, PATCH, DELETE, OPTIONS\r\n");
    }
    if (!serve_cors_listed(p->srv, origin)) {
        QLOGW("serve: a CORS preflight from %.200s refused (not in --allowed-origins)", origin);
        return serve_reply(wsi, p, 400, "text/plain; charset=utf-8", strdup("Disallowed CORS origin"), 22);
    }
    char extra[1024];
    snprintf(extra, sizeof extra,
             "access-control-allow-methods: DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT\r\n"
             "access-control-max-age: 600\r\n%s%.600s%s",
             hdrs && !strpbrk(hdrs, "\r\n") ? "access-control-allow-headers: " : "",
             hdrs && !strpbrk(hdrs, "\r\n") ? hdrs : "", hdrs && !strpbrk(hdrs, "\r\n") ? "\r\n" : "");
    serve_reply_ex(wsi, p, 200, "text/plain; charset=utf-8", strdup("OK"), 2, extra);
}

/* The pool's answer to a POST: the reply's start, or its error. */
static void post_answer(sprep *j)
{
    serve_state *srv = j->srv;
    pss *p = j->p;
    struct lws *wsi = p->wsi;
    if (!j->ok) return serve_reply_error(wsi, p, &j->e);
    sreq *r = j->r;
    p->r = r;
    p->stream = r->req.stream;
    qmetrics_request(srv->metrics, p->endpoint, 200);
    p->st = p->stream ? ST_STREAM : ST_WAIT;
    if (p->stream) {
        /* Server-sent events, chunked so that the connection can go on. */
        char head[2048], hdrs[1024];
        cors_headers(p, hdrs, sizeof hdrs);
        snprintf(hdrs + strlen(hdrs), sizeof hdrs - strlen(hdrs), "cache-control: no-cache\r\n");
        const size_t hl = qhttp_head(head, sizeof head, 200, "text/event-stream", -1, p->h.req.minor == 1,
                                     p->keep_alive && p->h.req.minor == 1, hdrs);
        if (p->h.req.minor == 0) p->keep_alive = 0;
        if (!hl || serve_put(p, head, hl)) p->keep_alive = 0;
    }
    serve_want_write(p);
}

/* A complete POST body: to the preparation pool, then the engine. */
static void handle_post(struct lws *wsi, pss *p, qoai_kind kind)
{
    qoai_error e;
    const qhttp_req *rq = &p->h.req;
    p->kind = kind;
    sprep *j = serve_prep_new(p, rq->body ? rq->body : "", rq->body_len, kind);
    if (!j) return serve_fail(wsi, p, 500, "server_error", "%s", "out of memory");
    j->answer = post_answer;
    p->st = ST_WAIT; /* p->r comes with the answer */
    if (serve_prep_submit(j, &e)) return serve_reply_error(wsi, p, &e);
}

static void route_CHAT(struct lws *wsi, pss *p) { handle_post(wsi, p, QOAI_CHAT); }
static void route_COMPLETIONS(struct lws *wsi, pss *p) { handle_post(wsi, p, QOAI_COMPLETION); }

/* POST /tokenize and /detokenize, on the preparation pool. */
static void tokenize(struct lws *wsi, pss *p, int what)
{
    const qhttp_req *rq = &p->h.req;
    qoai_error e;
    sprep *j = serve_prep_new(p, rq->body ? rq->body : "", rq->body_len, QOAI_COMPLETION);
    if (!j) return serve_fail(wsi, p, 500, "server_error", "%s", "out of memory");
    j->what = what;
    j->answer = tokenize_answer;
    p->st = ST_WAIT;
    if (serve_prep_submit(j, &e)) return serve_reply_error(wsi, p, &e);
}

static void route_TOKENIZE(struct lws *wsi, pss *p) { tokenize(wsi, p, PREP_TOKENIZE); }
static void route_DETOKENIZE(struct lws *wsi, pss *p) { tokenize(wsi, p, PREP_DETOKENIZE); }
static void route_WS(struct lws *wsi, pss *p) { serve_ws_upgrade(wsi, p); }

static void route_SESSIONS(struct lws *wsi, pss *p)
{
    const qhttp_req *rq = &p->h.req;
    sess_http(wsi, p, rq->method == QHTTP_HEAD ? "GET" : rq->method_name, rq->path, rq->body ? rq->body : "",
              rq->body_len);
    if (p->job) p->st = ST_WAIT;
}

static void route_SESSION(struct lws *wsi, pss *p) { route_SESSIONS(wsi, p); }

/* Each route's handler (http.h's table names them). */
typedef void (*route_fn)(struct lws *wsi, pss *p);
static const route_fn route_handlers[QR_COUNT] = {
#define ROUTE_HANDLER_(name, path, methods, key, endpoint) [QR_##name] = route_##name,
    QHTTP_ROUTES(ROUTE_HANDLER_)
#undef ROUTE_HANDLER_
};

/* 405, with the methods the path takes. */
static void bad_method(struct lws *wsi, pss *p, const char *allow)
{
    char extra[128];
    snprintf(extra, sizeof extra, "allow: %s\r\n", allow);
    qoai_error e;
    qoai_fail(&e, 405, "invalid_request_error", NULL, "%s is not served for this path", p->h.req.method_name);
    json_t *j = qoai_error_json(&e);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    serve_reply_ex(wsi, p, 405, "application/json", s, s ? strlen(s) : 0, extra);
}

/* A whole request: routed by http.h's table, the API key checked once. */
static void handle_request(struct lws *wsi, pss *p)
{
    qhttp_req *rq = &p->h.req;
    p->keep_alive = rq->keep_alive;
    p->head_only = rq->method == QHTTP_HEAD;
    p->t_req = q_now();
    const char *allow = NULL;
    const qroute route = qhttp_route(rq->method, rq->path, &allow);
    const qroute_info *ri = qhttp_route_info(route);
    p->endpoint = ri->endpoint;
    if (route == QR_OPTIONS) return preflight(wsi, p);
    if (!serve_origin_allowed(p)) {
        p->endpoint = "other";
        QLOGW("serve: a request from another site's page refused (Origin %s; see --allow-origin)",
              qhttp_header_get(rq, "origin"));
        return serve_fail(wsi, p, 403, "invalid_request_error", "%s",
                          "a page of another site may not call this server (see --allow-origin)");
    }
    if (route == QR_BAD_METHOD) return bad_method(wsi, p, allow);
    if (route == QR_NONE) return serve_fail(wsi, p, 404, "invalid_request_error", "no such endpoint: %s", rq->path);
    if (route == QR_STATIC) {
        if (!serve_static_file(wsi, p, rq->path)) {
            p->endpoint = "other";
            serve_fail(wsi, p, 404, "invalid_request_error", "no such endpoint: GET %s", rq->path);
        }
        return;
    }
    p->req_key = serve_authorized(p);
    if (ri->key == QA_ROUTER && p->req_key < 0)
        return serve_fail(wsi, p, 401, "authentication_error", "%s", "invalid or missing API key");
    route_handlers[route](wsi, p);
}

/* Reads requests while the connection is free for one. */
static void process(struct lws *wsi, pss *p)
{
    serve_state *srv = p->srv;
    while (p->st == ST_READ && !p->ws) {
        const qhttp_rc rc = qhttp_parse(&p->h);
        if (rc == QHTTP_R_MORE) {
            if (p->h.in_len && !p->deadline) {
                p->deadline = 1; /* the request has begun: it has --request-timeout seconds to arrive */
                lws_set_timer_usecs(wsi, (lws_usec_t)(srv->o.request_timeout * 1e6));
            }
            return;
        }
        if (rc == QHTTP_R_HEAD) {
            /* A body follows; a client that waits to be asked for it is. */
            if (p->h.req.expect_continue && serve_put(p, "HTTP/1.1 100 Continue\r\n\r\n", 25) == 0) serve_want_write(p);
            continue;
        }
        lws_set_timer_usecs(wsi, LWS_SET_TIMER_USEC_CANCEL);
        p->deadline = 0;
        if (rc == QHTTP_R_ERROR) {
            p->endpoint = "other";
            p->keep_alive = 0;
            QLOGD("serve: a request refused with %d: %s", p->h.status, p->h.err);
            serve_fail(wsi, p, p->h.status, p->h.status == 500 ? "server_error" : "invalid_request_error", "%s", p->h.err);
            return;
        }
        handle_request(wsi, p);
    }
}

/* The reply is written: the next request, or the close. */
static int transaction_done(struct lws *wsi, pss *p)
{
    serve_state *srv = p->srv;
    if (!p->keep_alive) {
        /* A lingering close: the client may still be sending (a body
         * refused before it arrived), and closing with its bytes unread
         * would reset the connection before it reads the answer.  So the
         * write side is shut, what comes is read and dropped, and the
         * socket closes when the client closes, or after 2 s. */
        lws_set_timer_usecs(wsi, LWS_SET_TIMER_USEC_CANCEL);
        p->draining = 1;
        shutdown(lws_get_socket_fd(wsi), SHUT_WR);
        lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, 2);
        return 0;
    }
    if (p->r) {
        pthread_mutex_lock(&srv->mu);
        sreq *r = p->r;
        r->wsi = NULL;
        if (r->finished) {
            serve_sreq_unlink(r);
            serve_sreq_free(r);
        } else {
            qengine_cancel(srv->eng, r->id);
        }
        pthread_mutex_unlock(&srv->mu);
        p->r = NULL;
    }
    qhttp_next(&p->h);
    p->st = ST_READ;
    p->stream = 0, p->kind = 0, p->endpoint = NULL, p->head_only = 0;
    lws_set_timer_usecs(wsi, (lws_usec_t)(srv->o.idle_timeout * 1e6));
    process(wsi, p);
    return 0;
}

int serve_flush(struct lws *wsi, pss *p)
{
    if (p->out_off >= p->out_len) return 0;
    unsigned char buf[LWS_PRE + 65536];
    size_t n = p->out_len - p->out_off;
    if (n > 65536) n = 65536;
    memcpy(buf + LWS_PRE, p->out + p->out_off, n);
    if (lws_write(wsi, buf + LWS_PRE, n, LWS_WRITE_RAW) < (int)n) return -1;
    p->out_off += n;
    if (p->out_off == p->out_len) p->out_off = p->out_len = 0;
    else serve_want_write(p);
    return 0;
}

static int http_writable(struct lws *wsi, pss *p)
{
    serve_state *srv = p->srv;
    if (p->st == ST_WAIT && p->r) {
        /* A whole reply: written once the engine has finished. */
        pthread_mutex_lock(&srv->mu);
        sreq *r = p->r;
        const int done = r->finished, failed = r->failed;
        char *data = done ? r->out : NULL;
        const size_t dl = done ? r->out_len : 0;
        if (done) r->out = NULL, r->out_len = r->out_cap = 0;
        if (done) sconn_taken(r->conn, dl);
        pthread_mutex_unlock(&srv->mu);
        if (done) {
            if (failed || !data) {
                free(data);
                p->keep_alive = 0;
                serve_fail(wsi, p, 500, "server_error", "%s", "out of memory");
            } else {
                p->endpoint = NULL; /* counted when it was taken */
                serve_reply(wsi, p, 200, "application/json", data, dl);
            }
        }
    } else if (p->st == ST_STREAM) {
        /* What the engine produced, as chunks; the last chunk at the end. */
        pthread_mutex_lock(&srv->mu);
        sreq *r = p->r;
        char *data = r->out;
        const size_t len = r->out_len;
        const int done = r->finished, failed = r->failed;
        r->out = NULL, r->out_len = r->out_cap = 0;
        sconn_taken(r->conn, len);
        pthread_mutex_unlock(&srv->mu);
        if (failed) {
            free(data);
            return -1;
        }
        const int chunked = p->h.req.minor == 1;
        char sz[24];
        int bad = 0;
        if (len && chunked) {
            snprintf(sz, sizeof sz, "%zx\r\n", len);
            bad |= serve_put(p, sz, strlen(sz));
        }
        if (len) bad |= serve_put(p, data, len);
        if (len && chunked) bad |= serve_put(p, "\r\n", 2);
        free(data);
        if (done) {
            if (chunked) bad |= serve_put(p, "0\r\n\r\n", 5);
            p->st = ST_REPLY;
            log_request(p, 200);
        }
        if (bad) return -1;
    }
    if (lws_partial_buffered(wsi)) { /* lws still holds part of the last write */
        serve_want_write(p);
        return 0;
    }
    if (serve_flush(wsi, p)) return -1;
    if (p->st == ST_REPLY && !p->out_len) {
        if (lws_partial_buffered(wsi)) {
            serve_want_write(p);
            return 0;
        }
        return transaction_done(wsi, p);
    }
    return 0;
}

/* ---- the connection's life ---------------------------------------------------------------- */

static void conn_closed(struct lws *wsi, pss *p)
{
    serve_state *srv = p->srv;
    sess_closed(srv, wsi);
    if (p->ws) serve_ws_closed(wsi, p);
    /* Every request of the connection (one being answered, one whose
     * preparation finished meanwhile, a WebSocket's): cancelled if the
     * engine still runs it, else freed. */
    pthread_mutex_lock(&srv->mu);
    p->conn->closed = 1;
    p->conn->wsi = NULL;
    for (sreq **pp = &srv->reqs; *pp;) {
        sreq *r = *pp;
        if (r->conn != p->conn) {
            pp = &r->next;
            continue;
        }
        r->wsi = NULL;
        if (!r->finished) {
            qengine_cancel(srv->eng, r->id);
            pp = &r->next;
        } else {
            *pp = r->next;
            serve_sreq_free(r);
        }
    }
    p->r = NULL;
    sconn_unref(p->conn);
    pthread_mutex_unlock(&srv->mu);
    p->conn = NULL;
    qhttp_free(&p->h);
    free(p->out);
    p->out = NULL;
    srv->n_conns--;
}

int serve_conn_callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
    serve_state *srv = serve_of(wsi);
    pss *p = user;
    switch (reason) {
    case LWS_CALLBACK_RAW_ADOPT:
        if (!p) return -1;
        memset(p, 0, sizeof *p);
        p->srv = srv;
        if (!(p->conn = calloc(1, sizeof *p->conn))) return -1;
        p->conn->srv = srv;
        p->conn->refs = 1;
        p->conn->wsi = wsi;
        p->wsi = wsi;
        p->open = 1;
        srv->n_conns++;
        {
            const qhttp_limits lim = { (size_t)srv->o.max_header_kb << 10, QSERVE_MAX_URI, (size_t)srv->o.max_body_kb << 10,
                                       QHTTP_MAX_HEADERS };
            qhttp_init(&p->h, &lim);
        }
        if (srv->n_conns > srv->o.max_connections) {
            QLOGW("serve: %d connections, more than --max-connections: one closed", srv->n_conns);
            qmetrics_conn_closed(srv->metrics, QCONN_TOO_MANY);
            return -1;
        }
        lws_set_timer_usecs(wsi, (lws_usec_t)(srv->o.idle_timeout * 1e6));
        return 0;
    case LWS_CALLBACK_RAW_RX:
        if (!p || !p->open) return -1;
        if (p->draining) return (p->drained += len) > ((size_t)srv->o.max_body_kb << 10) + (1u << 20) ? -1 : 0;
        if (p->ws) return serve_ws_rx(wsi, p, in, len);
        if (qhttp_feed(&p->h, in, len)) {
            QLOGW("serve: a client sent more than a request can be while its last ran; its connection is closed");
            qmetrics_conn_closed(srv->metrics, QCONN_FLOOD);
            return -1;
        }
        process(wsi, p);
        return 0;
    case LWS_CALLBACK_RAW_WRITEABLE:
        if (!p || !p->open) return -1;
        if (p->draining) return 0;
        if (p->ws) return serve_ws_writable(wsi, p);
        return http_writable(wsi, p);
    case LWS_CALLBACK_TIMER:
        if (!p || !p->open || p->ws || p->draining) return 0;
        if (p->st != ST_READ) return 0;
        if (p->h.in_len) {
            /* A request that did not arrive in time: 408, then the close. */
            p->endpoint = "other";
            p->keep_alive = 0;
            serve_fail(wsi, p, 408, "invalid_request_error", "%s", "the request did not arrive in time");
            lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, 5);
            qmetrics_conn_closed(srv->metrics, QCONN_TIMEOUT);
            return 0;
        }
        qmetrics_conn_closed(srv->metrics, QCONN_TIMEOUT);
        return -1; /* idle */
    case LWS_CALLBACK_RAW_CLOSE:
        if (p && p->open) {
            conn_closed(wsi, p);
            p->open = 0;
        }
        return 0;
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        serve_prep_answers(srv);
        sess_answers(srv);
        /* The engine produced output: writable callbacks where it waits. */
        pthread_mutex_lock(&srv->mu);
        for (sreq *r = srv->reqs; r; r = r->next)
            if (r->wsi && (r->out_len || r->finished || r->failed)) lws_callback_on_writable(r->wsi);
        /* Failed connections (a slow reader) close from their writable callback. */
        pthread_mutex_unlock(&srv->mu);
        return 0;
    default:
        return 0;
    }
}
