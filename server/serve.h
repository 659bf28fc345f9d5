/* serve.h - the server's shared state and helpers (server internal):
 * cmd_serve.c (HTTP, WebSocket, the engine thread, start and stop) and
 * serve_sessions.c (sessions over HTTP and WebSocket, the store's answers).
 * Threads as DESIGN.md says: the lws thread owns the sockets, the engine
 * thread the engine, the store thread the database; what they share is
 * under srv->mu. */
#ifndef QUIRE_SERVE_H
#define QUIRE_SERVE_H

#include <jansson.h>
#include <libwebsockets.h>
#include <pthread.h>
#include <signal.h>

#include "engine.h"
#include "http.h"
#include "metrics.h"
#include "model.h"
#include "oai.h"
#include "engine_flags.h"
#include "store.h"
#include "tokenizer.h"
#include "ws.h"

typedef struct serve_state serve_state;
typedef struct serve_prep serve_prep;

typedef struct {
    const char *model, *host, *api_key, *api_key_file, *name, *web, *log_level, *db, *disk_load;
    const char *allow_origin; /* --allowed-origins / --allow-origin: pages' origins besides the server's own that may
                               * call (CORS) and open the WebSocket ("*": any) */
    int port, max_tokens, max_body_kb;
    qeflags ef;             /* the engine's flags (engine_flags.h), --draft's path among them */
    int max_requests, help, no_persist, cache_disk_max;
    int max_header_kb;      /* --max-header: a request's line and headers, KiB */
    int max_connections;    /* --max-connections: open at once; more are closed at once */
    float idle_timeout;     /* --idle-timeout: seconds a kept-alive connection may wait for a request */
    float request_timeout;  /* --request-timeout: seconds a request may take to arrive whole */
    int max_pending_mb;     /* --max-pending: output a connection's client has not read, at most */
    int prep_threads;       /* --prep-threads: threads that parse, template, tokenize and compile */
    float grammar_timeout;  /* --grammar-timeout: seconds a request's structured-output grammar may take to compile */
    int max_model_len;      /* --max-model-len / -c / --ctx-size: the context requests get (0: the model's) */
    const char *chat_template_path; /* --chat-template: a Jinja file instead of the model's template */
    const char *schema_mode; /* --json-schema-mode: strict (default) or full */
    const char *tool_parser; /* --tool-call-parser: auto (default), hermes, llama3_json or mistral */
    const char *reasoning_parser; /* --reasoning-parser: auto (default), none, qwen3 or deepseek_r1 */
    float grace;
} serve_opts;

/* One choice of a request, as it accumulates (whole replies). */
typedef struct {
    char *text;
    size_t len, cap;
    json_t *lp;
    const char *finish;
    qfinish fin;
    int started; /* a streamed chat choice has sent its role */
    int echoed;  /* the request's echo text has gone out (or into text) */
    qoai_calls *calls; /* a request with tools: its output read back as tool calls */
    qoai_reason *reason; /* a reasoning model's chat: its output split (oai.h) */
    char *rtext;         /* whole replies: the reasoning so far */
    size_t rlen, rcap;
} acc;

/* A connection as its requests and preparation jobs see it: it may close
 * (lws thread) while they run on other threads.  Reference-counted: the
 * connection, each request and each job hold one; every field under srv->mu. */
typedef struct sconn {
    serve_state *srv;
    int refs;
    int closed;         /* the connection is gone */
    size_t pending;     /* output its requests made that the socket has not taken */
    int over;           /* past --max-pending: its requests failed, the socket closes */
    struct lws *wsi;    /* while open */
} sconn;
/* Drops a reference (srv->mu held, or one thread left). */
void sconn_unref(sconn *c);

/* A request given to the engine.  Shared between the threads: every field
 * is read and written under srv->mu. */
typedef struct sreq {
    serve_state *srv;
    struct sreq *next;
    uint64_t id;
    qoai_req req;
    qoai_reply rep;
    char rid[80];
    int n, n_done, finished;
    acc *ch;
    int prompt_tokens, completion_tokens, cached_tokens, cached_disk;
    int spec[3];                /* speculative decoding over its choices: drafted, kept, passes */
    char *out; /* bytes for the client not yet taken by the lws thread */
    size_t out_len, out_cap;
    int failed;         /* out of memory while building the output */
    struct lws *wsi;    /* NULL once the connection closed */
    sconn *conn;        /* its connection (a reference), for the output budget */
    double t0, t_last;  /* arrival, last token */
    int ws;             /* a WebSocket request: out holds frames, each ending in '\n' */
    int want_ids;       /* ws: token ids in the deltas */
    unsigned long frames; /* ws: frames written */
    char cid[64];       /* ws: the client's id */
    char session[QSTORE_ID_MAX]; /* ws: the session it continues, "" for none */
    json_t *held;       /* session: the done frame, sent once the reply is stored */
} sreq;

/* A job given to the store for the lws thread (an HTTP session request,
 * or the stored turn of a session chat), until its answer is used.  The
 * list is the lws thread's; done is set under srv->mu by the store thread. */
typedef struct sjob {
    serve_state *srv;
    struct sjob *next;
    qstore_job *j;
    struct lws *wsi;    /* NULL once the connection closed */
    void *p;            /* the connection's pss */
    json_t *msg;        /* ws: the chat message, to submit with the whole conversation */
    char cid[64];
    int done;
} sjob;

/* The server's state: one, made by cmd_serve and reached through the lws
 * context (serve_of) or the objects that point to it; no global. */
struct serve_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    qengine *eng;
    qmodel *model;      /* set with eng when the engine thread has loaded them */
    qmodel *draft;      /* the draft model (--draft), or NULL */
    qtok *tok;
    struct lws_context *ctx;
    qmetrics *metrics;
    qengine_stats stats;
    int have_stats;
    sreq *reqs;
    int live;           /* requests the engine has not finished */
    volatile sig_atomic_t stop; /* the engine thread could not load the model: the loop ends */
    int draining;       /* stopping: new requests get 503 */
    int engine_stop;
    serve_opts o;
    qoai_limits lim;
    qoai_limits lim_ws; /* lim with the WebSocket message's own fields allowed */
    const char *name;   /* the model's id in replies (the first of models) */
    const char *models[9]; /* the ids a request may name (NULL-terminated) */
    char names_buf[512];
    const char *origins[17]; /* --allowed-origins, NULL-terminated */
    char origins_buf[2048];
    char *chat_template;  /* --chat-template's source, or NULL */
    unsigned long long seq;
    char *web_root;     /* realpath of the static files' folder, or NULL */
    char key_buf[8192]; /* --api-key-file's keys, NUL-separated */
    const char *keys[64]; /* the API keys (n_keys of them; none: no auth) */
    int n_keys;
    qstore *store;      /* the database (NULL with --no-persist) */
    struct gram_vocab *gvocab; /* the tokenizer as the grammars see it (guided decoding) */
    struct gram_vocab *gvocab_tools; /* the same with the tool-call form's special marker tokens, or NULL */
    struct gram_cache *gcache; /* compiled grammars, shared by requests that repeat one */
    qoai_failcache *gfail;     /* grammars that failed to compile, with their errors */
    sjob *sjobs;        /* jobs in the store for the lws thread */
    serve_prep *prep;   /* the preparation pool (serve_prep.c), or NULL */
    qengine_opts eo;
    int ready;          /* the model is loaded and the engine runs (under mu) */
    int broken;         /* the backend can run no more passes (qengine_broken; under mu) */
    int load_failed;
    int n_conns;        /* open connections (lws thread) */
    lws_sorted_usec_list_t stop_tick; /* wakes the lws loop while it drains at the stop */
    lws_sorted_usec_list_t load_tick; /* says, every few seconds, that the model is still loading */
    double load_t0;     /* when loading began */
    double load_bytes;  /* the model's size on disk */
};

/* The server of a connection's context. */
static inline serve_state *serve_of(struct lws *wsi) { return lws_context_user(lws_get_context(wsi)); }


/* The longest request target (414 past it). */
#define QSERVE_MAX_URI 8192

/* Per connection (lws allocates it; RAW_ADOPT fills it).  The lws thread's
 * alone. */
typedef enum { ST_READ = 0, ST_WAIT, ST_STREAM, ST_REPLY } pstate;
typedef struct {
    serve_state *srv;   /* the server (set at every callback) */
    struct lws *wsi;
    int open;           /* adopted and not yet closed */
    pstate st;          /* HTTP: reading a request, waiting for a whole reply, streaming, writing a reply */
    qhttp h;            /* HTTP: the parser, with bytes of requests not yet answered */
    int deadline;       /* HTTP: a request has begun to arrive (its timer runs) */
    int draining;       /* HTTP: the last reply is out, the write side shut; reading until the client closes */
    size_t drained;
    int keep_alive, head_only, stream, kind;
    double t_req;       /* HTTP: when the request arrived whole (the log line's time) */
    char *out;          /* bytes for the socket, from out_off */
    size_t out_len, out_off, out_cap;
    sreq *r;            /* HTTP: the request this connection runs */
    const char *endpoint;
    int job;            /* HTTP: waiting for the store's answer */
    int key;            /* the API key the connection showed (index into srv->keys) */
    int req_key;        /* HTTP: the key the request shows, found once by the router (serve_authorized) */
    sconn *conn;        /* what other threads know of the connection */
    /* WebSocket connections: frames in, the connection's own frames out
     * (errors of messages that made no request; '\n'-separated), control. */
    int ws;
    qws w;
    char *wsout;
    size_t wsout_len, wsout_cap;
    int ws_close;       /* a close frame with this code is due */
    int ws_closing;     /* the close frame is written: close once it is out */
    int ping_due;
    char ping[126];
    size_t ping_len;
} pss;

/* A body given to the preparation pool (serve_prep.c). */
typedef enum { PREP_SUBMIT = 0, PREP_CHECK, PREP_TOKENIZE, PREP_DETOKENIZE } prep_what;
typedef struct sprep {
    serve_state *srv;
    struct sprep *next, *pnext;
    prep_what what;     /* SUBMIT: serve_submit; CHECK: a session turn as sent, checked */
    sconn *conn;        /* a reference */
    pss *p;             /* the connection's state, valid while conn is open (lws thread) */
    char *body;
    size_t len;
    qoai_kind kind;
    char cid[64];       /* ws: the client's id ("" for HTTP) */
    int want_ids;
    char session[QSTORE_ID_MAX];
    json_t *msg;        /* ws: the client's message (a reference), for the answer */
    int cancel;         /* ws: cancelled while being prepared (under srv->mu) */
    void (*answer)(struct sprep *j); /* lws thread, with the result, while the connection is open */
    sreq *r;            /* SUBMIT: the request given to the engine, or NULL with e */
    int ok;
    qoai_error e;
    json_t *norm;       /* CHECK: the messages as role and text */
    json_t *reply;      /* TOKENIZE, DETOKENIZE: the answer's body */
} sprep;

/* ---- serve_prep.c ---- */
/* Starts n workers: 0, or -1. */
int serve_prep_start(serve_state *srv, int n);
/* Stops them; jobs not answered are dropped. */
void serve_prep_stop(serve_state *srv);
/* A job for connection p with a copy of body, or NULL (out of memory). */
sprep *serve_prep_new(pss *p, const char *body, size_t len, qoai_kind kind);
/* Gives j to the pool (taken): 0, or an error in e (429 with the pool full; j freed). */
int serve_prep_submit(sprep *j, qoai_error *e);
/* The job being prepared for connection c under WebSocket id cid, or NULL. */
sprep *serve_prep_find(sconn *c, const char *cid);
/* Answers of the pool (lws thread). */
void serve_prep_answers(serve_state *srv);

/* ---- cmd_serve.c ---- */
/* pre, JSON j (taken), post into r's output (srv->mu held). */
void serve_out_json(sreq *r, json_t *j, const char *pre, const char *post);
#define out_event(r, j) serve_out_json(r, j, "data: ", "\n\n")
#define out_frame(r, j) serve_out_json(r, j, "", "\n")
/* Frees a request; takes it out of srv->reqs (srv->mu held). */
void serve_sreq_free(sreq *r);
void serve_sreq_unlink(sreq *r);
/* A whole HTTP reply for the connection (lws thread): body taken. */
void serve_reply(struct lws *wsi, pss *p, int status, const char *ctype, char *body, size_t len);
void serve_reply_json(struct lws *wsi, pss *p, int status, json_t *j);
void serve_reply_error(struct lws *wsi, pss *p, const qoai_error *e);
void serve_fail(struct lws *wsi, pss *p, int status, const char *type, const char *fmt, const char *arg);
/* A WebSocket error frame of the connection's own. */
void serve_ws_error(struct lws *wsi, pss *p, const char *cid, const qoai_error *e);
/* The index of the API key the connection's request carries (0 without
 * keys), or -1. */
int serve_authorized(pss *p);
/* Whether the request's Origin (none: not a browser) may call: the server's
 * own pages (Origin http://HOST with HOST the request's Host, an IP literal,
 * localhost or --host, so no DNS-rebound name) or --allow-origin. */
int serve_origin_allowed(pss *p);
/* The model is loaded / the backend broke (under srv->mu). */
/* serve_engine.c: the engine thread (its argument: the serve_state), from start to stop. */
void *serve_engine_main(void *srv);
/* serve_static.c: a file of the web folder for uri ("/" is index.html)
 * answered: 1, or 0 (no such file: the caller answers 404). */
int serve_static_file(struct lws *wsi, pss *p, const char *uri);
int serve_ready(serve_state *srv);
int serve_broken(serve_state *srv);
/* Parses body as a request of kind and gives it to the engine (ws: with
 * the client's id cid; session: the conversation it continues, or NULL):
 * the new request, or NULL with *e filled. */
sreq *serve_submit(sconn *c, const char *body, size_t len, qoai_kind kind, const char *cid, int want_ids,
                   const char *session, qoai_error *e);
/* n bytes of connection c's output taken by the socket, or dropped (srv->mu
 * held; c may be NULL). */
void sconn_taken(sconn *c, size_t n);

/* ---- serve_http.c ---- */
/* Whether origin is one of --allowed-origins (or it holds "*"). */
int serve_cors_listed(const serve_state *srv, const char *origin);
/* The model card of id (GET /v1/models): id, object, created, owned_by,
 * root, max_model_len, speculative.  NULL when out of memory. */
json_t *serve_model_json(const serve_state *srv, const char *id);
/* lws's callback for every connection (raw sockets: HTTP read by http.c). */
int serve_conn_callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len);
/* A reply with extra header lines (each ending in CRLF). */
void serve_reply_ex(struct lws *wsi, pss *p, int status, const char *ctype, char *body, size_t len, const char *extra);
/* Bytes onto the connection's output: 0, or -1 out of memory. */
int serve_put(pss *p, const void *s, size_t n);
void serve_want_write(pss *p);
/* Up to 64 KiB of the output onto the socket (another writable callback
 * asked for while more is left): 0, or -1 when the write failed. */
int serve_flush(struct lws *wsi, pss *p);

/* ---- serve_ws.c ---- */
void serve_ws_upgrade(struct lws *wsi, pss *p);
int serve_ws_rx(struct lws *wsi, pss *p, const void *in, size_t len);
int serve_ws_writable(struct lws *wsi, pss *p);
void serve_ws_closed(struct lws *wsi, pss *p);
/* The pool's answer to a WebSocket chat (also a session's). */
void serve_ws_chat_answer(sprep *j);

/* ---- serve_sessions.c ---- */

/* The owner of what a connection with API key index k makes: the
 * SHA-256 of the key, in hex; "" without keys. */
void sess_owner(const serve_state *srv, int k, char out[72]);
/* GET/DELETE/PATCH under /v1/sessions (lws thread): 1 when uri is one of
 * them (answered now or when the store has answered), else 0. */
int sess_http(struct lws *wsi, pss *p, const char *method, const char *uri, const char *body, size_t len);
/* A WebSocket chat m with "session" or "new_session" (lws thread): the
 * turn is stored, then the whole conversation goes to the engine.  Errors
 * go to the client as error frames. */
void sess_ws_chat(struct lws *wsi, pss *p, json_t *m, const char *cid);
/* The store's answers for the lws thread: replies and submissions. */
void sess_answers(serve_state *srv);
/* A connection closed: its pending store answers are dropped. */
void sess_closed(serve_state *srv, struct lws *wsi);
/* Frees every job left (at exit, the store stopped). */
void sess_drop_all(serve_state *srv);
/* A session request finished (engine thread, srv->mu held): its reply is
 * stored, and frame (taken: the done frame) follows once it is. */
void sess_finish(sreq *r, json_t *frame);

#endif
