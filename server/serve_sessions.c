/* serve_sessions.c - conversations kept on the server (issue 7).
 *
 * Over HTTP: GET /v1/sessions (the caller's sessions), GET, DELETE and
 * PATCH ({"title": ...}) /v1/sessions/{id}.  Over the WebSocket, a chat
 * with "session": id (or "new_session": true) sends only the new messages
 * (with "keep_messages": n, after only the session's first n: a reply asked
 * for again, a message edited): they are appended to the session, the whole conversation goes through the
 * chat template to the engine, and the reply is stored when it finishes (a
 * cancelled one marked partial) before the client gets its done event, so
 * a reply the client saw finish is on disk.  A session belongs to the API
 * key that made it (the SHA-256 of the key is stored, never the key);
 * another key gets 404 for it, as for a session that does not exist.
 *
 * The lws thread never touches the database: jobs go to the store thread
 * and their answers come back through srv->sjobs (marked done under srv->mu, then
 * taken in sess_answers on the lws thread). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qerr.h"
#include "serve.h"
#include "sha256.h"

void sess_owner(const serve_state *srv, int k, char out[72])
{
    if (k < 0 || k >= srv->n_keys) {
        out[0] = 0;
        return;
    }
    qsha256_hex(srv->keys[k], strlen(srv->keys[k]), out);
}

/* The store thread: an lws-thread job is done. */
static void job_done(qstore_job *j)
{
    sjob *sj = j->user;
    serve_state *srv = sj->srv;
    pthread_mutex_lock(&srv->mu);
    sj->done = 1;
    pthread_mutex_unlock(&srv->mu);
    lws_cancel_service(srv->ctx);
}

/* Gives j to the store for connection wsi (msg: a ws chat, taken): 0, or
 * -1 when the store takes nothing more (j and msg freed). */
static int start_job(struct lws *wsi, pss *p, qstore_job *j, json_t *msg, const char *cid)
{
    serve_state *srv = p->srv;
    sjob *sj = calloc(1, sizeof *sj);
    if (!sj) {
        qstore_job_free(j);
        json_decref(msg);
        return -1;
    }
    sj->srv = srv, sj->j = j, sj->wsi = wsi, sj->p = p, sj->msg = msg;
    if (cid) snprintf(sj->cid, sizeof sj->cid, "%s", cid);
    j->user = sj;
    j->done = job_done;
    if (qstore_submit(srv->store, j)) {
        qstore_job_free(j);
        json_decref(msg);
        free(sj);
        return -1;
    }
    sj->next = srv->sjobs;
    srv->sjobs = sj;
    return 0;
}

static void sjob_free(sjob *sj)
{
    qstore_job_free(sj->j);
    json_decref(sj->msg);
    free(sj);
}

/* A store error as an API error. */
static void store_error(const qstore_job *j, qoai_error *e)
{
    if (j->rc == QERR_NOTFOUND) qoai_fail(e, 404, "invalid_request_error", "session", "no session '%s'", j->id);
    else if (j->rc == QERR_INVAL) qoai_fail(e, 400, "invalid_request_error", NULL, "%s", j->err);
    else qoai_fail(e, 500, "server_error", NULL, "the database failed: %s", j->err[0] ? j->err : qerr_str(j->rc));
}

/* ---- HTTP ---------------------------------------------------------------------------- */

int sess_http(struct lws *wsi, pss *p, const char *method, const char *uri, const char *body, size_t len)
{
    serve_state *srv = p->srv;
    if (strncmp(uri, "/v1/sessions", 12) || (uri[12] && uri[12] != '/')) return 0;
    const int key = p->req_key;
    if (key < 0) return serve_fail(wsi, p, 401, "authentication_error", "%s", "invalid or missing API key"), 1;
    if (!srv->store)
        return serve_fail(wsi, p, 404, "invalid_request_error", "%s",
                          "sessions need the database; this server runs with --no-persist"),
               1;
    const char *id = uri[12] == '/' ? uri + 13 : NULL;
    if (id && (!*id || strlen(id) >= QSTORE_ID_MAX || strchr(id, '/')))
        return serve_fail(wsi, p, 404, "invalid_request_error", "no session '%s'", id), 1;
    qstore_kind kind;
    if (!strcmp(method, "GET")) kind = id ? QSTORE_GET : QSTORE_LIST;
    else if (id && !strcmp(method, "DELETE")) kind = QSTORE_DELETE;
    else if (id && !strcmp(method, "PATCH")) kind = QSTORE_RENAME;
    else return serve_fail(wsi, p, 405, "invalid_request_error", "%s /v1/sessions is not served", method), 1;
    qstore_job *j = qstore_job_new(kind);
    if (!j) return serve_fail(wsi, p, 500, "server_error", "%s", "out of memory"), 1;
    if (id) snprintf(j->id, sizeof j->id, "%s", id);
    sess_owner(p->srv, key, j->owner);
    if (kind == QSTORE_RENAME) {
        json_t *b = json_loadb(body ? body : "", len, 0, NULL), *t = json_object_get(b, "title");
        if (!json_is_string(t) || json_string_length(t) > QSTORE_TITLE_MAX) {
            json_decref(b);
            qstore_job_free(j);
            return serve_fail(wsi, p, 400, "invalid_request_error",
                              "the body must be {\"title\": a string of at most %s bytes}", "200"),
                   1;
        }
        j->text = strdup(json_string_value(t));
        json_decref(b);
        if (!j->text) {
            qstore_job_free(j);
            return serve_fail(wsi, p, 500, "server_error", "%s", "out of memory"), 1;
        }
    }
    if (start_job(wsi, p, j, NULL, NULL))
        return serve_fail(wsi, p, 503, "server_error", "%s", "the server is shutting down"), 1;
    p->job = 1;
    return 1;
}

/* The store's answer to an HTTP request. */
static void http_answer(sjob *sj)
{
    pss *p = sj->p;
    qstore_job *j = sj->j;
    p->job = 0;
    if (j->rc) {
        qoai_error e;
        store_error(j, &e);
        return serve_reply_error(sj->wsi, p, &e);
    }
    json_t *out = NULL;
    switch (j->kind) {
    case QSTORE_LIST:
        out = json_pack("{s:s, s:O}", "object", "list", "data", j->result);
        break;
    case QSTORE_GET:
        out = json_incref(j->result);
        if (out) json_object_set_new(out, "object", json_string("session"));
        break;
    case QSTORE_DELETE:
        out = json_pack("{s:s, s:s, s:b}", "id", j->id, "object", "session.deleted", "deleted", 1);
        break;
    default:
        out = json_pack("{s:s, s:s, s:s}", "id", j->id, "object", "session", "title", j->text ? j->text : "");
        break;
    }
    serve_reply_json(sj->wsi, p, 200, out);
}

/* ---- WebSocket ---------------------------------------------------------------------- */

/* The turn as sent is checked (the pool's answer): stored, then the whole
 * conversation goes to the engine (ws_answer). */
static void turn_checked(sprep *pj)
{
    qoai_error e;
    pss *p = pj->p;
    struct lws *wsi = p->wsi;
    json_t *m = pj->msg;
    const char *cid = pj->cid;
    if (!pj->ok) return serve_ws_error(wsi, p, cid, &pj->e);
    json_t *sid = json_object_get(m, "session"), *keep = json_object_get(m, "keep_messages");
    const int has_id = sid && !json_is_null(sid);
    qstore_job *j = qstore_job_new(QSTORE_TURN);
    if (!j) {
        qoai_fail(&e, 500, "server_error", NULL, "%s", "out of memory");
        return serve_ws_error(wsi, p, cid, &e);
    }
    if (has_id) snprintf(j->id, sizeof j->id, "%s", json_string_value(sid));
    if (keep && !json_is_null(keep)) j->truncate = 1, j->keep = (int)json_integer_value(keep);
    sess_owner(p->srv, p->key, j->owner);
    j->msgs = pj->norm;
    pj->norm = NULL;
    if (start_job(wsi, p, j, json_incref(m), cid)) {
        qoai_fail(&e, 503, "server_error", NULL, "%s", "the server is shutting down");
        serve_ws_error(wsi, p, cid, &e);
    }
}

void sess_ws_chat(struct lws *wsi, pss *p, json_t *m, const char *cid)
{
    serve_state *srv = p->srv;
    qoai_error e;
    json_t *sid = json_object_get(m, "session"), *ns = json_object_get(m, "new_session");
    for (sjob *sj = srv->sjobs; sj; sj = sj->next)
        if (sj->wsi == wsi && sj->msg && !strcmp(sj->cid, cid)) {
            qoai_fail(&e, 400, "invalid_request_error", "id", "a request '%s' already runs on this connection", cid);
            return serve_ws_error(wsi, p, cid, &e);
        }
    if (!srv->store) {
        qoai_fail(&e, 400, "invalid_request_error", "session", "%s",
                  "sessions need the database; this server runs with --no-persist");
        return serve_ws_error(wsi, p, cid, &e);
    }
    const int has_id = sid && !json_is_null(sid);
    if (has_id && (!json_is_string(sid) || !json_string_length(sid) || json_string_length(sid) >= QSTORE_ID_MAX)) {
        qoai_fail(&e, 400, "invalid_request_error", "session", "'session' must be a session's id");
        return serve_ws_error(wsi, p, cid, &e);
    }
    if (!has_id && !json_is_true(ns)) {
        qoai_fail(&e, 400, "invalid_request_error", "session", "%s",
                  "a session chat names its 'session' (an id) or asks for 'new_session': true");
        return serve_ws_error(wsi, p, cid, &e);
    }
    json_t *keep = json_object_get(m, "keep_messages");
    if (keep && !json_is_null(keep) &&
        (!has_id || !json_is_integer(keep) || json_integer_value(keep) < 0 || json_integer_value(keep) > 1000000)) {
        qoai_fail(&e, 400, "invalid_request_error", "keep_messages", "%s",
                  "'keep_messages' is how many of the session's messages stay (a whole number, 0 or more, with "
                  "'session')");
        return serve_ws_error(wsi, p, cid, &e);
    }
    if (!json_object_get(m, "messages")) {
        qoai_fail(&e, 400, "invalid_request_error", "messages", "%s",
                  "a session chat sends its new 'messages' (the rest are the session's)");
        return serve_ws_error(wsi, p, cid, &e);
    }
    pthread_mutex_lock(&srv->mu);
    const int up = srv->ready;
    pthread_mutex_unlock(&srv->mu);
    if (!up) {
        qoai_fail(&e, 503, "server_error", NULL, "%s", "the model is loading; retry shortly");
        return serve_ws_error(wsi, p, cid, &e);
    }
    /* The request as sent must be valid on its own (parameters, messages):
     * nothing is stored for a bad one.  The check runs on the preparation
     * pool (a template or a schema can take long); turn_checked goes on. */
    char *text = json_dumps(m, JSON_COMPACT);
    sprep *j = text ? serve_prep_new(p, text, strlen(text), QOAI_CHAT) : NULL;
    free(text);
    if (!j) {
        qoai_fail(&e, 500, "server_error", NULL, "%s", "out of memory");
        return serve_ws_error(wsi, p, cid, &e);
    }
    j->what = PREP_CHECK;
    j->msg = json_incref(m);
    snprintf(j->cid, sizeof j->cid, "%s", cid);
    j->answer = turn_checked;
    if (serve_prep_submit(j, &e)) serve_ws_error(wsi, p, cid, &e);
}

/* A stored turn that will have no reply: an empty one marked partial keeps
 * the conversation's roles alternating. */
static void reply_none(serve_state *srv, const char *id)
{
    qstore_job *rj = qstore_job_new(QSTORE_REPLY);
    if (rj) {
        snprintf(rj->id, sizeof rj->id, "%s", id);
        rj->text = strdup("");
        rj->partial = 1;
        rj->done = qstore_job_free;
    }
    if (rj && (!rj->text || qstore_submit(srv->store, rj))) qstore_job_free(rj);
}

/* The pool's answer to a stored turn's conversation. */
static void turn_answer(sprep *pj)
{
    if (!pj->ok) reply_none(pj->srv, pj->session);
    serve_ws_chat_answer(pj);
}

/* The turn is stored: the whole conversation goes to the engine. */
static void ws_answer(sjob *sj)
{
    qoai_error e;
    pss *p = sj->p;
    qstore_job *j = sj->j;
    if (j->rc) {
        store_error(j, &e);
        return serve_ws_error(sj->wsi, p, sj->cid, &e);
    }
    json_t *b = json_copy(sj->msg);
    char *body = NULL;
    if (b) {
        json_object_set(b, "messages", j->result);
        json_object_del(b, "session");
        json_object_del(b, "new_session");
        json_object_del(b, "keep_messages");
        body = json_dumps(b, JSON_COMPACT);
    }
    json_decref(b);
    if (!body) {
        qoai_fail(&e, 500, "server_error", NULL, "%s", "out of memory");
        return serve_ws_error(sj->wsi, p, sj->cid, &e);
    }
    sprep *pj = serve_prep_new(p, body, strlen(body), QOAI_CHAT);
    if (pj) {
        snprintf(pj->cid, sizeof pj->cid, "%s", sj->cid);
        snprintf(pj->session, sizeof pj->session, "%s", j->id);
        pj->want_ids = json_is_true(json_object_get(sj->msg, "token_ids"));
        pj->answer = turn_answer;
    }
    if (!pj) qoai_fail(&e, 500, "server_error", NULL, "%s", "out of memory");
    if (!pj || serve_prep_submit(pj, &e)) {
        reply_none(sj->srv, j->id);
        serve_ws_error(sj->wsi, p, sj->cid, &e);
    }
    free(body);
}

void sess_answers(serve_state *srv)
{
    sjob *ready = NULL;
    pthread_mutex_lock(&srv->mu);
    for (sjob **pp = &srv->sjobs; *pp;) {
        sjob *sj = *pp;
        if (sj->done) {
            *pp = sj->next;
            sj->next = ready;
            ready = sj;
        } else {
            pp = &sj->next;
        }
    }
    pthread_mutex_unlock(&srv->mu);
    while (ready) {
        sjob *sj = ready;
        ready = sj->next;
        if (sj->wsi) {
            if (sj->msg) ws_answer(sj);
            else http_answer(sj);
        }
        sjob_free(sj);
    }
}

void sess_closed(serve_state *srv, struct lws *wsi)
{
    for (sjob *sj = srv->sjobs; sj; sj = sj->next)
        if (sj->wsi == wsi) sj->wsi = NULL;
}

void sess_drop_all(serve_state *srv)
{
    while (srv->sjobs) {
        sjob *sj = srv->sjobs;
        srv->sjobs = sj->next;
        sjob_free(sj);
    }
}

/* ---- storing a reply ------------------------------------------------------------------ */

/* The store thread: the reply is on disk (or failed); the done frame goes. */
static void reply_done(qstore_job *j)
{
    sreq *r = j->user;
    serve_state *srv = r->srv;
    pthread_mutex_lock(&srv->mu);
    if (r->held) {
        json_object_set_new(r->held, "session", json_string(r->session));
        json_object_set_new(r->held, "stored", json_boolean(j->rc == 0));
        out_frame(r, r->held);
        r->held = NULL;
    }
    r->finished = 1;
    if (!r->wsi) { /* nobody to tell */
        serve_sreq_unlink(r);
        serve_sreq_free(r);
    }
    pthread_mutex_unlock(&srv->mu);
    qstore_job_free(j);
    lws_cancel_service(srv->ctx);
}

void sess_finish(sreq *r, json_t *frame)
{
    serve_state *srv = r->srv;
    qstore_job *j = srv->store ? qstore_job_new(QSTORE_REPLY) : NULL;
    const acc *c = &r->ch[0];
    if (j) {
        snprintf(j->id, sizeof j->id, "%s", r->session);
        j->text = strndup(c->text ? c->text : "", c->len);
        j->partial = c->fin == QFINISH_CANCELLED || c->fin == QFINISH_ERROR;
        j->user = r;
        j->done = reply_done;
    }
    r->held = frame;
    if (!j || !j->text || qstore_submit(srv->store, j)) {
        qstore_job_free(j);
        json_object_set_new(frame, "session", json_string(r->session));
        json_object_set_new(frame, "stored", json_false());
        out_frame(r, frame);
        r->held = NULL;
        r->finished = 1;
    }
}
