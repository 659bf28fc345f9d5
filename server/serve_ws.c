/* serve_ws.c - the WebSocket protocol at /v1/ws (lws thread): the upgrade
 * (origin and API key checked), frames read by ws.c into messages, chat and
 * cancel, and the frames out: the connection's own first, then one of each
 * request's in turn, so that requests on one socket interleave.  A frame
 * that breaks RFC 6455 (unmasked, reserved bits, a control frame too long,
 * a text message that is not UTF-8, a message past --max-body) ends the
 * connection with the close code the RFC gives. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "qerr.h"
#include "serve.h"
#include "buf.h"
#include "util.h"

/* The first frame (up to a '\n', or all) of a buffer of frames, moved into
 * a new buffer with LWS_PRE bytes before it for lws_write; its length in
 * *n.  NULL when out of memory (the buffer unchanged). */
static unsigned char *take_frame(char *b, size_t *len, size_t *n)
{
    const char *nl = memchr(b, '\n', *len);
    *n = nl ? (size_t)(nl - b) : *len;
    unsigned char *f = malloc(LWS_PRE + *n + 1);
    if (!f) return NULL;
    memcpy(f + LWS_PRE, b, *n);
    const size_t rest = *len - *n - (nl ? 1 : 0);
    memmove(b, b + *len - rest, rest);
    *len = rest;
    return f;
}

/* A frame of the connection's own: {"type": "error", "id", "error"}. */
void serve_ws_error(struct lws *wsi, pss *p, const char *cid, const qoai_error *e)
{
    serve_state *srv = p->srv;
    json_t *j = qoai_error_json(e);
    json_t *f = j ? json_pack("{s:s, s:s?, s:O}", "type", "error", "id", cid, "error", json_object_get(j, "error")) : NULL;
    json_decref(j);
    char *s = f ? json_dumps(f, JSON_COMPACT) : NULL;
    json_decref(f);
    if (!s) return;
    if (p->wsout_len + strlen(s) > ((size_t)srv->o.max_pending_mb << 20)) {
        /* A client that sends bad messages and reads none of the answers. */
        if (!p->ws_close) {
            QLOGW("serve: a WebSocket client left %zu bytes of error frames unread (--max-pending); its connection is "
                  "closed",
                  p->wsout_len);
            qmetrics_conn_closed(srv->metrics, QCONN_SLOW_READER);
        }
        p->ws_close = 1008;
        p->wsout_len = 0;
        free(s);
        return;
    }
    if (!q_append(&p->wsout, &p->wsout_len, &p->wsout_cap, s, strlen(s)) &&
        !q_append(&p->wsout, &p->wsout_len, &p->wsout_cap, "\n", 1))
        lws_callback_on_writable(wsi);
    free(s);
}

/* The pool's answer to a chat: its error, or its frames to come. */
void serve_ws_chat_answer(sprep *j)
{
    serve_state *srv = j->srv;
    pss *p = j->p;
    if (!j->ok) return serve_ws_error(p->wsi, p, j->cid, &j->e);
    qmetrics_request(srv->metrics, "ws", 200);
    serve_want_write(p);
}

/* A whole client message: chat (a request) or cancel. */
static void ws_message(struct lws *wsi, pss *p)
{
    serve_state *srv = p->srv;
    qoai_error e;
    json_t *m = json_loadb(p->w.msg ? p->w.msg : "", p->w.msg_len, 0, NULL);
    json_t *ty = json_object_get(m, "type"), *id = json_object_get(m, "id");
    const char *cid = json_is_string(id) ? json_string_value(id) : NULL;
    if (!json_is_object(m) || !json_is_string(ty) || !cid || !cid[0] || strlen(cid) > 63) {
        qoai_fail(&e, 400, "invalid_request_error", NULL,
                  "a message is a JSON object with \"type\" (chat or cancel) and \"id\" (1-63 characters)");
        serve_ws_error(wsi, p, cid && strlen(cid) <= 63 ? cid : NULL, &e);
        json_decref(m);
        return;
    }
    const char *t = json_string_value(ty);
    /* The id runs if the engine has it, or the pool prepares it. */
    sprep *prep = serve_prep_find(p->conn, cid);
    pthread_mutex_lock(&srv->mu);
    sreq *same = srv->reqs;
    while (same && !(same->conn == p->conn && !strcmp(same->cid, cid) && !same->finished)) same = same->next;
    if (same && !strcmp(t, "cancel")) qengine_cancel(srv->eng, same->id);
    if (prep && !strcmp(t, "cancel")) prep->cancel = 1;
    pthread_mutex_unlock(&srv->mu);
    if (!strcmp(t, "cancel")) {
        if (!same && !prep) {
            qoai_fail(&e, 404, "invalid_request_error", "id", "no request '%s' runs on this connection", cid);
            serve_ws_error(wsi, p, cid, &e);
        }
    } else if (!strcmp(t, "chat")) {
        json_t *ti = json_object_get(m, "token_ids");
        if (same || prep) {
            qoai_fail(&e, 400, "invalid_request_error", "id", "a request '%s' already runs on this connection", cid);
            serve_ws_error(wsi, p, cid, &e);
        } else if (json_object_get(m, "session") || json_object_get(m, "new_session")) {
            sess_ws_chat(wsi, p, m, cid);
        } else {
            sprep *j = serve_prep_new(p, p->w.msg, p->w.msg_len,
                                      json_object_get(m, "messages") ? QOAI_CHAT : QOAI_COMPLETION);
            if (!j) {
                qoai_fail(&e, 500, "server_error", NULL, "%s", "out of memory");
                serve_ws_error(wsi, p, cid, &e);
            } else {
                snprintf(j->cid, sizeof j->cid, "%s", cid);
                j->want_ids = json_is_true(ti);
                j->answer = serve_ws_chat_answer;
                if (serve_prep_submit(j, &e)) serve_ws_error(wsi, p, cid, &e);
            }
        }
    } else {
        qoai_fail(&e, 400, "invalid_request_error", "type", "unknown message type '%s' (chat or cancel)", t);
        serve_ws_error(wsi, p, cid, &e);
    }
    json_decref(m);
}

/* One frame a writable callback: the connection's own first, then the
 * request with output that has had the fewest frames written (so that
 * requests on one socket interleave).  A finished request goes once its
 * frames are out. */
static int next_frame(struct lws *wsi, pss *p)
{
    serve_state *srv = p->srv;
    unsigned char *buf = NULL;
    size_t n = 0;
    if (p->wsout_len && !(buf = take_frame(p->wsout, &p->wsout_len, &n))) return -1;
    int more = p->wsout_len > 0;
    pthread_mutex_lock(&srv->mu);
    sreq *pick = NULL;
    int failed = 0;
    for (sreq *r = srv->reqs; r; r = r->next) failed |= r->conn == p->conn && r->failed;
    if (failed) { /* a request's output was lost (a reader too slow, or memory): the socket closes */
        pthread_mutex_unlock(&srv->mu);
        free(buf);
        return -1;
    }
    for (sreq *r = srv->reqs; !buf && r; r = r->next)
        if (r->conn == p->conn && r->out_len && (!pick || r->frames < pick->frames)) pick = r;
    for (sreq **pp = &srv->reqs; *pp;) {
        sreq *r = *pp;
        if (r->conn != p->conn) {
            pp = &r->next;
            continue;
        }
        if (r == pick) {
            r->frames++;
            const size_t before = r->out_len;
            buf = take_frame(r->out, &r->out_len, &n);
            sconn_taken(r->conn, before - r->out_len);
        }
        if (r->out_len) more = 1;
        if (r->finished && !r->out_len) {
            *pp = r->next;
            serve_sreq_free(r);
        } else {
            pp = &r->next;
        }
    }
    pthread_mutex_unlock(&srv->mu);
    int rc = 0;
    if (buf) {
        uint8_t fh[10];
        const size_t hl = qws_frame_head(fh, QWS_TEXT, n);
        if (serve_put(p, fh, hl) || serve_put(p, buf + LWS_PRE, n)) rc = -1;
    }
    free(buf);
    if (!rc && (more || p->out_len)) lws_callback_on_writable(wsi);
    return rc;
}

/* The connection closed: its running requests are cancelled, the finished
 * ones freed. */
void serve_ws_closed(struct lws *wsi, pss *p)
{
    (void)wsi;
    qws_free(&p->w);
    free(p->wsout);
    p->wsout = NULL;
    p->wsout_len = p->wsout_cap = 0;
}

/* GET /v1/ws: the handshake (RFC 6455 4.2), then WebSocket frames. */
void serve_ws_upgrade(struct lws *wsi, pss *p)
{
    serve_state *srv = p->srv;
    const qhttp_req *rq = &p->h.req;
    p->endpoint = "ws";
    const char *key = qhttp_header_get(rq, "sec-websocket-key"), *ver = qhttp_header_get(rq, "sec-websocket-version");
    if (!qhttp_header_has(rq, "upgrade", "websocket") || !qhttp_header_has(rq, "connection", "upgrade") || !key ||
        strlen(key) != 24) {
        p->keep_alive = 0;
        return serve_fail(wsi, p, 400, "invalid_request_error", "%s", "/v1/ws takes a WebSocket handshake");
    }
    if (!ver || strcmp(ver, "13")) {
        p->keep_alive = 0;
        return serve_reply_ex(wsi, p, 426, "text/plain", strdup("WebSocket version 13 only"), 25,
                              "sec-websocket-version: 13\r\n");
    }
    const int k = p->req_key;
    if (k < 0) return serve_fail(wsi, p, 401, "authentication_error", "%s", "invalid or missing API key");
    char accept[29], extra[256];
    qws_accept(key, accept);
    const int proto = qhttp_header_has(rq, "sec-websocket-protocol", "quire.v1");
    snprintf(extra, sizeof extra,
             "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
             "sec-websocket-accept: %s\r\n%s\r\n",
             accept, proto ? "sec-websocket-protocol: quire.v1\r\n" : "");
    if (serve_put(p, extra, strlen(extra))) return serve_fail(wsi, p, 500, "server_error", "%s", "out of memory");
    p->ws = 1;
    p->key = k;
    p->st = ST_READ;
    lws_set_timer_usecs(wsi, LWS_SET_TIMER_USEC_CANCEL);
    qws_init(&p->w, (size_t)srv->o.max_body_kb << 10);
    /* Bytes after the handshake are the first frames. */
    qhttp *h = &p->h;
    const size_t used = h->pos;
    const int left = h->in_len > used && qws_feed(&p->w, h->in + used, h->in_len - used);
    qhttp_free(h);
    if (left) p->ws_close = 1009;
    serve_want_write(p);
    if (!left && serve_ws_rx(wsi, p, NULL, 0)) p->ws_close = 1011; /* frames that came with the handshake */
}

/* A control frame onto the output (before any other frame not yet begun). */
static int put_control(pss *p, int op, const void *data, size_t n)
{
    uint8_t fh[10];
    const size_t hl = qws_frame_head(fh, op, n);
    return serve_put(p, fh, hl) || (n && serve_put(p, data, n));
}

int serve_ws_rx(struct lws *wsi, pss *p, const void *in, size_t len)
{
    serve_state *srv = p->srv;
    if (p->ws_closing) return 0;
    if (qws_feed(&p->w, in, len)) {
        qmetrics_conn_closed(srv->metrics, QCONN_FLOOD);
        return -1;
    }
    for (;;) {
        const qws_rc rc = qws_parse(&p->w);
        if (rc == QWS_MORE) return 0;
        if (rc == QWS_ERROR) {
            QLOGD("serve: a WebSocket closed (%d): %s", p->w.close_code, p->w.err);
            p->ws_close = p->w.close_code;
            qmetrics_conn_closed(srv->metrics, QCONN_BAD_REQUEST);
            serve_want_write(p);
            return 0;
        }
        switch (p->w.op) {
        case QWS_TOO_BIG: {
            qoai_error e;
            qoai_fail(&e, 413, "invalid_request_error", NULL, "the message is larger than this server takes (%d KiB)",
                      srv->o.max_body_kb);
            serve_ws_error(wsi, p, NULL, &e);
            break;
        }
        case QWS_TEXT:
        case QWS_BINARY:
            ws_message(wsi, p);
            break;
        case QWS_PING:
            p->ping_len = p->w.ctl_len;
            memcpy(p->ping, p->w.ctl, p->w.ctl_len);
            p->ping_due = 1;
            serve_want_write(p);
            break;
        case QWS_CLOSE:
            p->ws_close = 1000;
            serve_want_write(p);
            return 0;
        default: /* pong */
            break;
        }
    }
}

int serve_ws_writable(struct lws *wsi, pss *p)
{
    if (lws_partial_buffered(wsi)) { /* lws still holds part of the last write */
        lws_callback_on_writable(wsi);
        return 0;
    }
    if (!p->out_len && p->ws_closing) return -1; /* the close frame is out */
    if (!p->out_len && p->ping_due) {
        p->ping_due = 0;
        if (put_control(p, QWS_PONG, p->ping, p->ping_len)) return -1;
    }
    if (!p->out_len && p->ws_close && !p->wsout_len) {
        const uint8_t code[2] = { (uint8_t)(p->ws_close >> 8), (uint8_t)p->ws_close };
        if (put_control(p, QWS_CLOSE, code, 2)) return -1;
        p->ws_closing = 1;
    }
    if (!p->out_len && !p->ws_closing && next_frame(wsi, p)) return -1;
    if (p->out_off < p->out_len) {
        if (serve_flush(wsi, p)) return -1;
        lws_callback_on_writable(wsi);
    } else if (p->ws_closing || p->ws_close) {
        lws_callback_on_writable(wsi);
    }
    return 0;
}
