/* serve_prep.c - request preparation off the lws thread.
 *
 * Parsing a body, applying the chat template, tokenizing and compiling a
 * grammar can take seconds for a hostile request (a schema of thousands of
 * alternatives, a 50 MB prompt).  The lws thread must never wait for that:
 * it hands each body to a small pool of threads (--prep-threads), which
 * run serve_submit (or, for a session turn, the check of the message as
 * sent) and put the result on a list for the lws thread, waking it with
 * lws_cancel_service.  The lws thread then goes on as it would have at once
 * (the HTTP reply's start, a WebSocket error frame, the session's store
 * job).  A connection that closes meanwhile is told by its sconn: a job
 * for it submits nothing (or cancels what it submitted), and its answer is
 * dropped.
 *
 * Jobs are taken in arrival order.  The queue holds at most --max-requests
 * + 64 jobs; more get 429 at once, so the queue cannot grow without bound. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qerr.h"
#include "serve.h"
#include "util.h"

/* The pool: its queue, its workers, the answers for the lws thread. */
struct serve_prep {
    serve_state *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sprep *head, *tail; /* waiting for a worker */
    int n_queued;
    int stop;
    pthread_t th[16];
    int n_th;
    sprep *done_list;   /* done jobs for the lws thread (under srv->mu) */
    /* Jobs given out and not yet answered, by connection (lws thread only):
     * so that a WebSocket id being prepared counts as running. */
    sprep *pending;
};

void sconn_unref(sconn *c)
{
    if (c && --c->refs == 0) free(c);
}

static void prep_free(sprep *j)
{
    free(j->body);
    json_decref(j->msg);
    json_decref(j->norm);
    json_decref(j->reply);
    free(j);
}

/* A session turn as sent: valid alone (parameters, messages), and its
 * messages as role and text, to be stored. */
static void check_turn(sprep *j)
{
    serve_state *srv = j->srv;
    qoai_req tmp;
    json_t *norm = NULL;
    if (qoai_parse(j->body, j->len, QOAI_CHAT, &srv->lim_ws, srv->model, srv->tok, &tmp, &j->e)) return;
    qoai_req_free(&tmp);
    if (qoai_messages(json_object_get(j->msg, "messages"), &norm, &j->e)) return;
    json_t *msgs = json_array();
    size_t i;
    json_t *x;
    json_array_foreach(norm, i, x) {
        const char *c = json_string_value(json_object_get(x, "content"));
        json_array_append_new(msgs, json_pack("{s:O, s:s}", "role", json_object_get(x, "role"), "content", c ? c : ""));
    }
    json_decref(norm);
    if (!msgs || json_array_size(msgs) != i) {
        json_decref(msgs);
        qoai_fail(&j->e, 500, "server_error", NULL, "%s", "out of memory");
        return;
    }
    j->norm = msgs;
    j->ok = 1;
}

/* POST /tokenize or /detokenize. */
static void tokenize(sprep *j)
{
    serve_state *srv = j->srv;
    json_error_t je;
    json_t *o = json_loadb(j->body, j->len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        qoai_fail(&j->e, 400, "invalid_request_error", NULL, "the body is not valid JSON (%s at byte %d)", je.text,
                  je.position);
        return;
    }
    if (j->what == PREP_TOKENIZE) j->ok = !qoai_tokenize(o, &srv->lim, srv->model, srv->tok, &j->reply, &j->e);
    else j->ok = !qoai_detokenize(o, &srv->lim, srv->model, srv->tok, &j->reply, &j->e);
    json_decref(o);
}

static void *worker(void *arg)
{
    serve_prep *P = arg;
    serve_state *srv = P->srv;
    for (;;) {
        pthread_mutex_lock(&P->mu);
        while (!P->stop && !P->head) pthread_cond_wait(&P->cv, &P->mu);
        sprep *j = P->head;
        if (!j) {
            pthread_mutex_unlock(&P->mu);
            return NULL;
        }
        P->head = j->next;
        if (!P->head) P->tail = NULL;
        P->n_queued--;
        pthread_mutex_unlock(&P->mu);
        j->next = NULL;
        pthread_mutex_lock(&srv->mu);
        const int gone = j->conn->closed;
        pthread_mutex_unlock(&srv->mu);
        if (gone) {
            qoai_fail(&j->e, 499, "invalid_request_error", NULL, "%s", "the client went away");
        } else if (j->what == PREP_CHECK) {
            check_turn(j);
        } else if (j->what == PREP_TOKENIZE || j->what == PREP_DETOKENIZE) {
            if (serve_ready(srv)) tokenize(j);
            else qoai_fail(&j->e, 503, "server_error", NULL, "%s", "the model is loading; retry shortly");
        } else {
            j->r = serve_submit(j->conn, j->body, j->len, j->kind, j->cid[0] ? j->cid : NULL, j->want_ids,
                                j->session[0] ? j->session : NULL, &j->e);
            j->ok = j->r != NULL;
        }
        pthread_mutex_lock(&srv->mu);
        /* Cancelled (a WebSocket cancel, or the connection closed) while
         * it was prepared: the engine lets it go at its next step. */
        if (j->r && (j->cancel || j->conn->closed)) qengine_cancel(srv->eng, j->r->id);
        j->next = P->done_list;
        P->done_list = j;
        pthread_mutex_unlock(&srv->mu);
        lws_cancel_service(srv->ctx);
    }
}

int serve_prep_start(serve_state *srv, int n)
{
    serve_prep *P = calloc(1, sizeof *P);
    if (!P) return -1;
    P->srv = srv;
    pthread_mutex_init(&P->mu, NULL);
    pthread_cond_init(&P->cv, NULL);
    srv->prep = P;
    if (n < 1) n = 1;
    if (n > 16) n = 16;
    for (int i = 0; i < n; i++) {
        if (pthread_create(&P->th[i], NULL, worker, P)) return -1;
        P->n_th++;
    }
    return 0;
}

void serve_prep_stop(serve_state *srv)
{
    serve_prep *P = srv->prep;
    if (!P) return;
    pthread_mutex_lock(&P->mu);
    P->stop = 1;
    pthread_cond_broadcast(&P->cv);
    pthread_mutex_unlock(&P->mu);
    for (int i = 0; i < P->n_th; i++) pthread_join(P->th[i], NULL);
    P->n_th = 0;
    /* What was queued or answered and not taken. */
    while (P->head) {
        sprep *j = P->head;
        P->head = j->next;
        sconn_unref(j->conn);
        prep_free(j);
    }
    while (P->done_list) {
        sprep *j = P->done_list;
        P->done_list = j->next;
        sconn_unref(j->conn);
        prep_free(j);
    }
    pthread_mutex_destroy(&P->mu);
    pthread_cond_destroy(&P->cv);
    free(P);
    srv->prep = NULL;
}

sprep *serve_prep_new(pss *p, const char *body, size_t len, qoai_kind kind)
{
    sprep *j = calloc(1, sizeof *j);
    if (!j || !(j->body = malloc(len + 1))) {
        free(j);
        return NULL;
    }
    memcpy(j->body, body, len);
    j->body[len] = 0;
    j->len = len;
    j->kind = kind;
    j->p = p;
    j->srv = p->srv;
    j->conn = p->conn;
    return j;
}

int serve_prep_submit(sprep *j, qoai_error *e)
{
    serve_state *srv = j->srv;
    serve_prep *P = srv->prep;
    pthread_mutex_lock(&P->mu);
    const int cap = srv->o.max_requests + 64;
    if (P->n_queued >= cap || P->stop) {
        pthread_mutex_unlock(&P->mu);
        prep_free(j);
        return qoai_fail(e, P->stop ? 503 : 429, P->stop ? "server_error" : "rate_limit_error", NULL,
                         P->stop ? "the server is shutting down" : "%d requests wait to be prepared; retry later", cap);
    }
    pthread_mutex_lock(&srv->mu);
    j->conn->refs++;
    pthread_mutex_unlock(&srv->mu);
    if (P->tail) P->tail->next = j;
    else P->head = j;
    P->tail = j;
    P->n_queued++;
    pthread_cond_signal(&P->cv);
    pthread_mutex_unlock(&P->mu);
    /* The lws thread's own list of what it has given out. */
    j->pnext = P->pending;
    P->pending = j;
    return 0;
}

sprep *serve_prep_find(sconn *c, const char *cid)
{
    const serve_prep *P = c->srv->prep;
    for (sprep *j = P ? P->pending : NULL; j; j = j->pnext)
        if (j->conn == c && !strcmp(j->cid, cid)) return j;
    return NULL;
}

void serve_prep_answers(serve_state *srv)
{
    serve_prep *P = srv->prep;
    if (!P) return;
    pthread_mutex_lock(&srv->mu);
    sprep *list = P->done_list;
    P->done_list = NULL;
    pthread_mutex_unlock(&srv->mu);
    /* In the order they were given out (the list is newest first). */
    sprep *rev = NULL;
    while (list) {
        sprep *j = list;
        list = j->next;
        j->next = rev;
        rev = j;
    }
    while (rev) {
        sprep *j = rev;
        rev = j->next;
        for (sprep **pp = &P->pending; *pp; pp = &(*pp)->pnext)
            if (*pp == j) {
                *pp = j->pnext;
                break;
            }
        pthread_mutex_lock(&srv->mu);
        const int gone = j->conn->closed;
        pthread_mutex_unlock(&srv->mu);
        if (!gone) j->answer(j);
        pthread_mutex_lock(&srv->mu);
        sconn_unref(j->conn);
        pthread_mutex_unlock(&srv->mu);
        prep_free(j);
    }
}
