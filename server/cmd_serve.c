/* cmd_serve.c - `quire serve`: the OpenAI-compatible HTTP server on
 * libwebsockets (one port).
 *
 * Threads (DESIGN.md): the lws service thread (this one) owns every socket;
 * the engine thread steps the engine whenever a request is live, moves its
 * events into the requests' output under the server's mutex, and wakes the
 * lws thread with lws_cancel_service(), which then asks for a writable
 * callback on each connection with output.  Nothing else is shared.
 *
 * Endpoints: POST /v1/chat/completions and /v1/completions (whole JSON, or
 * server-sent events with stream true), GET /v1/models, GET /health,
 * GET /metrics, and the WebSocket protocol at /v1/ws (README.md: several
 * requests a socket under client ids; chat and cancel in, start, delta,
 * done and error out).  A closed connection cancels its requests at the
 * next engine step.  Errors are OpenAI's error JSON (oai.h).  Static files
 * and a shutdown grace period come next (issue 6). */
#define _GNU_SOURCE
#include <libwebsockets.h>
#include <pthread.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "gram.h"
#include "serve.h"
#include "engine.h"
#include "metrics.h"
#include "model.h"
#include "oai.h"
#include "opts.h"
#include "qerr.h"
#include "tokenizer.h"
#include "util.h"


#define F_(field) offsetof(serve_opts, field)
static const qopt serve_table[] = {
    { "-m", "--model", "PATH", OPT_STR, F_(model), "model: a .gguf file or a Hugging Face folder (required)" },
    { NULL, "--host", "ADDR", OPT_STR, F_(host), "address to listen on (default 127.0.0.1)" },
    { NULL, "--port", "N", OPT_INT, F_(port), "port for HTTP (default 8080)" },
    { NULL, "--served-model-name", "NAME", OPT_STR, F_(name), "the model's id in the API (default: the file's name)" },
    { NULL, "--api-key", "KEY", OPT_STR, F_(api_key), "require 'Authorization: Bearer KEY' on /v1 (default: none)" },
    { NULL, "--api-key-file", "PATH", OPT_STR, F_(api_key_file), "API keys from a file, one a line (kept out of ps); each key owns its sessions" },
    { NULL, "--db", "PATH", OPT_STR, F_(db), "the database: sessions and the persistent prefix cache (default quire.db)" },
    { NULL, "--no-persist", NULL, OPT_FLAG, F_(no_persist), "no database: no sessions, no prefix cache on disk" },
    { NULL, "--cache-disk-load", "WHEN", OPT_STR, F_(disk_load), "auto: load a prefix from disk while that is measured faster than computing it; always (default auto)" },
    { NULL, "--cache-disk-max", "MB", OPT_INT, F_(cache_disk_max), "disk for the persistent prefix cache, least recently used blocks evicted (default 4096 MiB)" },
    { NULL, "--web", "DIR", OPT_STR, F_(web), "static files served at / (default: the project's web/)" },
    { NULL, "--allow-origin", "ORIGIN", OPT_STR, F_(allow_origin), "a page from ORIGIN (scheme://host:port, or * for any) may open the WebSocket too (default: only the server's own pages)" },
    { NULL, "--log-level", "LEVEL", OPT_STR, F_(log_level), "debug, info, warn, error or off (default info)" },
    { NULL, "--shutdown-grace", "S", OPT_FLOAT, F_(grace), "on SIGINT/SIGTERM, seconds running requests may finish before they are cancelled (default 5)" },
    { NULL, "--max-tokens", "N", OPT_INT, F_(max_tokens), "largest max_tokens a request may ask for (default 4096)" },
    { NULL, "--max-body", "KB", OPT_INT, F_(max_body_kb), "largest request body (default 1024 KiB)" },
    { NULL, "--max-requests", "N", OPT_INT, F_(max_requests), "requests in flight at most; more get 429 (default 256)" },
    { NULL, "--device", "NAME", OPT_STR, F_(device), "auto, cpu or cuda (default auto)" },
    { NULL, "--gpu-mem-util", "F", OPT_FLOAT, F_(gpu_mem_util), "cuda: fraction of device memory to use (default 0.9)" },
    { NULL, "--tensor-parallel", "N", OPT_INT, F_(tensor_parallel), "split the model among N GPUs, devices 0..N-1 (on the CPU: N groups of threads) (default 1)" },
    { NULL, "--kv-mem", "MB", OPT_INT, F_(kv_mem), "KV cache budget in MiB (default: 256 on the CPU)" },
    { NULL, "--max-batch-tokens", "N", OPT_INT, F_(max_batch_tokens), "tokens per engine step (default 512)" },
    { NULL, "--max-seqs", "N", OPT_INT, F_(max_seqs), "sequences per engine step (default 64)" },
    { "-t", "--threads", "N", OPT_INT, F_(threads), "CPU threads (default: all cores)" },
    { NULL, "--block-size", "N", OPT_INT, F_(block_size), "tokens per KV-cache block (default 16)" },
    { NULL, "--spec", "MODE", OPT_STR, F_(spec), "speculative decoding: none (default), ngram (drafts from n-gram lookup in each request's own tokens) or draft (--draft's)" },
    { NULL, "--draft", "PATH", OPT_STR, F_(draft), "speculative decoding with this draft model (GGUF file or HF folder with the model's vocabulary; implies --spec draft)" },
    { NULL, "--spec-k", "K", OPT_INT, F_(spec_k), "--spec: drafts a pass at most, 1 to 16 (default 4; each request's own k follows its acceptance)" },
    { NULL, "--spec-max-batch", "N", OPT_INT, F_(spec_max_batch), "--spec: no drafts in steps decoding N sequences or more (default 32)" },
    { NULL, "--spec-always", NULL, OPT_FLAG, F_(spec_always), "--spec: drafts in every step below --spec-max-batch (default: only while measured faster than none)" },
    { "-h", "--help", NULL, OPT_FLAG, F_(help), "show this help" },
};
#undef F_
#define N_SERVE_OPTS (sizeof serve_table / sizeof serve_table[0])

serve_state S;

static void on_signal(int sig)
{
    (void)sig;
    S.stop = 1;
    if (S.ctx) lws_cancel_service(S.ctx);
}

/* ---- output built under S.mu --------------------------------------------------- */

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

static void out_put(sreq *r, const char *s, size_t n)
{
    if (r->failed) return;
    if (r->out_len + n > MAX_PENDING) {
        /* The client reads too slowly: the request ends, its connection
         * is closed by the lws thread. */
        QLOGW("serve: a client fell %zu bytes behind; its request is cancelled", r->out_len);
        qengine_cancel(S.eng, r->id);
        r->failed = 1;
        return;
    }
    if (q_append(&r->out, &r->out_len, &r->out_cap, s, n)) r->failed = 1;
}

/* pre, JSON j (taken), post: an SSE event ("data: ", "\n\n"), a WebSocket
 * frame ("", "\n") or a whole reply ("", ""). */
void serve_out_json(sreq *r, json_t *j, const char *pre, const char *post)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        r->failed = 1;
        return;
    }
    out_put(r, pre, strlen(pre));
    out_put(r, s, strlen(s));
    out_put(r, post, strlen(post));
    free(s);
}


void serve_sreq_free(sreq *r)
{
    for (int i = 0; r->ch && i < r->n; i++) {
        free(r->ch[i].text);
        json_decref(r->ch[i].lp);
        qoai_calls_free(r->ch[i].calls);
    }
    free(r->ch);
    free(r->out);
    json_decref(r->held);
    qoai_req_free(&r->req);
    free(r);
}

void serve_sreq_unlink(sreq *r)
{
    for (sreq **pp = &S.reqs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            return;
        }
}

/* An engine event into its request's output (S.mu held). */
static void dispatch(qevent *ev)
{
    sreq *r = S.reqs;
    while (r && r->id != ev->id) r = r->next;
    if (!r || ev->index < 0 || ev->index >= r->n) return;
    acc *c = &r->ch[ev->index];
    const double now = q_now();
    if (ev->finish == QFINISH_NONE) {
        if (r->t_last == 0) qmetrics_ttft(S.metrics, now - r->t0);
        else if (ev->index == 0) qmetrics_itl(S.metrics, now - r->t_last);
        if (ev->index == 0) r->t_last = now;
    }
    json_t *lp = NULL;
    if (ev->finish == QFINISH_NONE && r->req.logprobs)
        qoai_logprobs_add(r->req.stream || r->ws ? &lp : &c->lp, r->req.kind, S.tok, ev, c->len);
    /* Tools: the output read back as content and calls, as it comes when
     * streamed, whole at the end otherwise. */
    json_t *d = NULL;
    if (r->req.tool_mode && !c->calls) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "call_%s_%d_", strchr(r->rid, '-') ? strchr(r->rid, '-') + 1 : r->rid,
                 ev->index);
        if (!(c->calls = qoai_calls_new(r->req.tool_mode, r->req.tool_name, prefix))) r->failed = 1;
    }
    if (c->calls && (r->req.stream || r->ws))
        d = qoai_calls_feed(c->calls, ev->text ? ev->text : "", ev->text_len, ev->finish != QFINISH_NONE);
    if (r->ws) {
        json_t *dc = d ? json_object_get(d, "content") : NULL, *dt = d ? json_object_get(d, "tool_calls") : NULL;
        const char *txt = c->calls ? (dc ? json_string_value(dc) : "") : ev->text ? ev->text : "";
        const size_t tl = c->calls ? (dc ? json_string_length(dc) : 0) : ev->text_len;
        if (tl || dt || lp || (r->want_ids && ev->finish == QFINISH_NONE)) {
            json_t *f = json_pack("{s:s, s:s, s:i, s:s%}", "type", "delta", "id", r->cid, "index", ev->index, "text",
                                  txt, tl);
            if (f && r->want_ids && ev->finish == QFINISH_NONE) json_object_set_new(f, "token", json_integer(ev->token));
            if (f && dt) json_object_set(f, "tool_calls", dt);
            if (f && lp) json_object_set_new(f, "logprobs", lp);
            else json_decref(lp);
            out_frame(r, f);
        } else {
            json_decref(lp);
        }
    } else if (r->req.stream && c->calls) {
        const int first = !c->started && ev->finish == QFINISH_NONE;
        if (d || lp || first) {
            if (!d) d = json_object();
            if (d && !c->started) json_object_set_new(d, "role", json_string("assistant"));
            out_event(r, qoai_chunk_delta(&r->rep, ev->index, d, lp, NULL));
            d = NULL;
            c->started = 1;
        }
    } else if (r->req.stream) {
        if (ev->text_len || lp || (r->req.kind == QOAI_CHAT && !c->started && ev->finish == QFINISH_NONE)) {
            out_event(r, qoai_chunk(&r->rep, ev->index, ev->text, ev->text_len, lp,
                                    NULL, r->req.kind == QOAI_CHAT && !c->started));
            c->started = 1;
        }
    } else if (ev->text_len && q_append(&c->text, &c->len, &c->cap, ev->text, ev->text_len)) {
        r->failed = 1;
    }
    json_decref(d);
    if (ev->finish != QFINISH_NONE) {
        if (c->calls && !r->req.stream && !r->ws) json_decref(qoai_calls_feed(c->calls, c->text ? c->text : "", c->len, 1));
        if (qoai_calls_failed(c->calls)) r->failed = 1;
        /* A finished output whose calls are whole ends in "tool_calls". */
        c->finish = ev->finish == QFINISH_STOP && qoai_calls_complete(c->calls) ? "tool_calls"
                                                                                 : qoai_finish_reason(ev->finish);
        if (r->req.stream && !r->ws && c->calls) {
            json_t *fd = c->started ? NULL : json_pack("{s:s}", "role", "assistant");
            out_event(r, qoai_chunk_delta(&r->rep, ev->index, fd, NULL, c->finish));
            c->started = 1;
        } else if (r->req.stream && !r->ws) {
            out_event(r, qoai_chunk(&r->rep, ev->index, "", 0, NULL, c->finish, r->req.kind == QOAI_CHAT && !c->started));
        }
    }
    /* A session's reply is kept whole, to be stored. */
    if (r->session[0] && ev->index == 0 && ev->text_len &&
        q_append(&c->text, &c->len, &c->cap, ev->text, ev->text_len))
        r->failed = 1;
    else if ((r->req.stream || r->ws) && !(r->session[0] && ev->index == 0))
        c->len += ev->text_len; /* the text offset of the next token's logprobs */
    if (ev->finish == QFINISH_NONE) return;
    c->fin = ev->finish;
    r->prompt_tokens = ev->prompt_tokens;
    r->cached_tokens = ev->cached_tokens;
    r->cached_disk = ev->cached_disk_tokens;
    r->completion_tokens += ev->completion_tokens;
    r->spec[0] += ev->spec_drafted, r->spec[1] += ev->spec_accepted, r->spec[2] += ev->spec_passes;
    if (++r->n_done < r->n) return;
    r->finished = !r->session[0]; /* a session's request once its reply is stored */
    S.live--;
    qmetrics_tokens(S.metrics, r->prompt_tokens, r->completion_tokens);
    qmetrics_latency(S.metrics, now - r->t0);
    const int spec_on = S.eo.spec_mode != QSPEC_NONE;
    json_t *usage =
        qoai_usage(r->prompt_tokens, r->completion_tokens, r->cached_tokens, r->cached_disk, spec_on ? r->spec : NULL);
    if (r->ws) {
        json_t *chs = json_array();
        for (int i = 0; chs && i < r->n; i++)
            json_array_append_new(chs, json_pack("{s:i, s:s}", "index", i, "finish_reason",
                                                 r->ch[i].fin == QFINISH_CANCELLED ? "cancelled"
                                                 : r->ch[i].fin == QFINISH_ERROR   ? "error"
                                                                                   : r->ch[i].finish));
        const double total = now - r->t0, ttft = ev->ttft_s;
        json_t *done = json_pack("{s:s, s:s, s:o, s:o, s:{s:f, s:f, s:f}}", "type", "done", "id", r->cid, "choices",
                                 chs, "usage", usage, "timings", "ttft_s", ttft, "total_s", total, "tokens_per_s",
                                 total > ttft && r->completion_tokens > 1
                                     ? (r->completion_tokens - 1) / (total - ttft)
                                     : 0.0);
        /* Speculative decoding in the timings too: drafts kept, tokens a pass. */
        json_t *tm = done ? json_object_get(done, "timings") : NULL;
        if (tm && spec_on) {
            json_object_set_new(tm, "spec_acceptance", json_real(r->spec[0] ? (double)r->spec[1] / r->spec[0] : 0.0));
            json_object_set_new(tm, "spec_mean_accepted_length",
                                json_real(r->spec[2] ? (double)(r->spec[1] + r->spec[2]) / r->spec[2] : 0.0));
        }
        if (r->session[0]) sess_finish(r, done);
        else out_frame(r, done);
    } else if (r->req.stream) {
        if (r->req.include_usage) out_event(r, qoai_usage_chunk(&r->rep, usage));
        else json_decref(usage);
        out_put(r, "data: [DONE]\n\n", 14);
    } else {
        qoai_choice *ch = calloc((size_t)r->n, sizeof *ch);
        if (ch) {
            for (int i = 0; i < r->n; i++) {
                ch[i] = (qoai_choice){ r->ch[i].text ? r->ch[i].text : "", r->ch[i].len, r->ch[i].finish, r->ch[i].lp,
                                       r->ch[i].calls ? qoai_calls_message(r->ch[i].calls) : NULL };
                r->ch[i].lp = NULL;
            }
            serve_out_json(r, qoai_response(&r->rep, ch, r->n, usage), "", "");
            free(ch);
        } else {
            json_decref(usage);
            r->failed = 1;
        }
    }
}

/* 1 once the engine runs; else a 503 for the connection ("loading"). */
static int ready(void)
{
    pthread_mutex_lock(&S.mu);
    const int r = S.ready;
    pthread_mutex_unlock(&S.mu);
    return r;
}

/* The backend stopped for good (qengine_broken). */
static int broken(void)
{
    pthread_mutex_lock(&S.mu);
    const int b = S.broken;
    pthread_mutex_unlock(&S.mu);
    return b;
}

/* Loads the model and creates the engine (on the engine thread, while the
 * port already answers /health with 503): 0, or 1 after saying why. */
static int load(void)
{
    char err[512];
    qmodel *m = NULL;
    qtok *tok = NULL;
    qengine *e = NULL;
    qmodel *dm = NULL;
    gram_vocab *gv = NULL;
    int rc = qmodel_load(S.o.model, &m, err, sizeof err) || qtok_for_model(m, &tok, err, sizeof err);
    if (!rc && S.o.draft && qmodel_load(S.o.draft, &dm, err + 17, sizeof err - 17)) {
        memcpy(err, "the draft model: ", 17); /* before its own message */
        rc = 1;
    }
    S.eo.draft = dm;
    if (rc || qengine_create(m, tok, &S.eo, &e, err, sizeof err) ||
        (qengine_grammar_vocab(tok, &gv) && snprintf(err, sizeof err, "out of memory for the grammar vocabulary"))) {
        fprintf(stderr, "quire serve: %s\n", err);
        qengine_destroy(e);
        qtok_free(tok);
        qmodel_destroy(m);
        qmodel_destroy(dm);
        S.eo.draft = NULL;
        return 1;
    }
    pthread_mutex_lock(&S.mu);
    S.model = m, S.draft = dm, S.tok = tok, S.eng = e, S.ready = 1;
    S.gvocab = gv;
    S.lim.gvocab = gv;
    S.lim.gcache = S.gcache;
    pthread_mutex_unlock(&S.mu);
    if (S.eo.tensor_parallel > 1)
        fprintf(stderr, "quire serve: %s ready on %s, split among %d (tensor parallel)\n", S.name,
                qengine_backend_name(e), S.eo.tensor_parallel);
    else fprintf(stderr, "quire serve: %s ready on %s\n", S.name, qengine_backend_name(e));
    return 0;
}

static void *engine_main(void *arg)
{
    (void)arg;
    if (load()) {
        pthread_mutex_lock(&S.mu);
        S.load_failed = 1;
        pthread_mutex_unlock(&S.mu);
        S.stop = 1;
        lws_cancel_service(S.ctx);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&S.mu);
        while (!S.engine_stop && S.live == 0) pthread_cond_wait(&S.cv, &S.mu);
        const int quit = S.engine_stop && S.live == 0;
        pthread_mutex_unlock(&S.mu);
        if (quit) break;
        const int rc = qengine_step(S.eng);
        if (rc < 0) QLOGE("serve: engine step failed: %s", qerr_str(rc));
        const int down = rc < 0 && qengine_broken(S.eng);
        qevent ev;
        int any = 0;
        pthread_mutex_lock(&S.mu);
        while (qengine_poll(S.eng, &ev) == 1) {
            dispatch(&ev);
            qevent_free(&ev);
            any = 1;
        }
        /* Finished requests whose connection is gone. */
        for (sreq **pp = &S.reqs; *pp;) {
            sreq *r = *pp;
            if (r->finished && !r->wsi) {
                *pp = r->next;
                serve_sreq_free(r);
            } else {
                pp = &r->next;
            }
        }
        qengine_stats_get(S.eng, &S.stats);
        S.have_stats = 1;
        if (down && !S.broken) {
            S.broken = 1;
            QLOGE("serve: the backend can run no more passes (a GPU of the tensor-parallel group failed); /health "
                  "says so and new requests are refused: restart the server");
        }
        pthread_mutex_unlock(&S.mu);
        if (any) lws_cancel_service(S.ctx);
    }
    return NULL;
}

/* ---- HTTP ------------------------------------------------------------------------ */

/* A whole reply for the connection: status, type, body (taken). */
void serve_reply(struct lws *wsi, pss *p, int status, const char *ctype, char *body, size_t len)
{
    free(p->resp);
    p->status = status, p->ctype = ctype, p->resp = body, p->resp_len = len, p->resp_off = 0;
    p->st = ST_HEADERS;
    if (p->endpoint) qmetrics_request(S.metrics, p->endpoint, status);
    lws_callback_on_writable(wsi);
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

/* The key a browser's WebSocket offers among its subprotocols (it cannot
 * send an Authorization header): "quire.key.<the key's bytes in hex>",
 * beside "quire.v1", the protocol the server answers with.  The decoded
 * key to out: its length, or -1. */
static int ws_protocol_key(struct lws *wsi, char *out, size_t cap)
{
    char h[1024];
    if (lws_hdr_copy(wsi, h, sizeof h, WSI_TOKEN_PROTOCOL) <= 0) return -1;
    char *save = NULL;
    for (char *tok = strtok_r(h, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        if (strncmp(tok, "quire.key.", 10)) continue;
        const char *x = tok + 10;
        const size_t n = strlen(x);
        if (n % 2 || n / 2 >= cap) return -1;
        for (size_t i = 0; i < n / 2; i++) {
            int v = 0;
            for (int j = 0; j < 2; j++) {
                const char c = x[2 * i + j];
                const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
                if (d < 0) return -1;
                v = v * 16 + d;
            }
            out[i] = (char)v;
        }
        out[n / 2] = 0;
        return (int)(n / 2);
    }
    return -1;
}

/* Whether the WebSocket upgrade may go on as far as its origin goes.  A
 * browser sends Origin with every WebSocket: a page of another site (not
 * this server's Host, nor --allow-origin) is refused, so that a site the
 * user visits cannot drive a server on their machine (cross-site WebSocket
 * hijacking).  Clients that are not browsers send no Origin. */
static int origin_allowed(struct lws *wsi)
{
    char origin[512], host[256];
    if (lws_hdr_total_length(wsi, WSI_TOKEN_ORIGIN) <= 0) return 1;
    if (lws_hdr_copy(wsi, origin, sizeof origin, WSI_TOKEN_ORIGIN) <= 0) return 0;
    const char *allow = S.o.allow_origin;
    if (allow && (!strcmp(allow, "*") || !strcasecmp(allow, origin))) return 1;
    if (lws_hdr_copy(wsi, host, sizeof host, WSI_TOKEN_HOST) <= 0) return 0;
    const char *o = strstr(origin, "://");
    return o && !strcasecmp(o + 3, host);
}

int serve_authorized(struct lws *wsi)
{
    if (!S.n_keys) return 0;
    char h[1024];
    const char *key = NULL;
    int n = lws_hdr_copy(wsi, h, sizeof h, WSI_TOKEN_HTTP_AUTHORIZATION);
    if (n >= 7 && !strncasecmp(h, "Bearer ", 7)) key = h + 7, n -= 7;
    else if ((n = ws_protocol_key(wsi, h, sizeof h)) >= 0) key = h;
    if (!key) return -1;
    int found = -1;
    for (int k = 0; k < S.n_keys; k++) {
        const size_t kl = strlen(S.keys[k]);
        if ((size_t)n != kl) continue;
        unsigned char d = 0; /* constant time over the key's length */
        for (size_t i = 0; i < kl; i++) d |= (unsigned char)(key[i] ^ S.keys[k][i]);
        if (d == 0) found = k;
    }
    return found;
}

/* A file of the web folder for uri ("/" is index.html): 1 when answered.
 * Only regular files whose real path lies inside the folder are served,
 * up to 16 MiB. */
static int static_file(struct lws *wsi, pss *p, const char *uri)
{
    static const struct {
        const char *ext, *type;
    } types[] = { { ".html", "text/html; charset=utf-8" }, { ".js", "text/javascript; charset=utf-8" },
                  { ".css", "text/css; charset=utf-8" },   { ".json", "application/json" },
                  { ".svg", "image/svg+xml" },             { ".png", "image/png" },
                  { ".ico", "image/x-icon" },              { ".txt", "text/plain; charset=utf-8" } };
    if (!S.web_root || uri[0] != '/' || strstr(uri, "..") || strchr(uri, '\\')) return 0;
    char path[4096], real[PATH_MAX];
    if (snprintf(path, sizeof path, "%s%s", S.web_root, strcmp(uri, "/") ? uri : "/index.html") >= (int)sizeof path)
        return 0;
    const size_t rl = strlen(S.web_root);
    struct stat st;
    if (!realpath(path, real) || strncmp(real, S.web_root, rl) || real[rl] != '/' || stat(real, &st) ||
        !S_ISREG(st.st_mode) || st.st_size > (16 << 20))
        return 0;
    FILE *f = fopen(real, "rb");
    char *buf = f ? malloc((size_t)st.st_size + 1) : NULL;
    const size_t n = buf ? fread(buf, 1, (size_t)st.st_size, f) : 0;
    if (f) fclose(f);
    if (!buf || n != (size_t)st.st_size) {
        free(buf);
        return 0;
    }
    const char *type = "application/octet-stream";
    const size_t pl = strlen(real);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const size_t el = strlen(types[i].ext);
        if (pl > el && !strcmp(real + pl - el, types[i].ext)) type = types[i].type;
    }
    p->endpoint = "static";
    serve_reply(wsi, p, 200, type, buf, n);
    return 1;
}

static void handle_get(struct lws *wsi, pss *p, const char *uri)
{
    if (sess_http(wsi, p, "GET", uri, NULL, 0)) return;
    if (!strcmp(uri, "/health")) {
        p->endpoint = "health";
        const int up = ready(), down = broken();
        if (down)
            serve_reply_json(wsi, p, 503,
                             json_pack("{s:s, s:s}", "status", "error", "message",
                                       "the backend can run no more passes (a GPU failed): restart the server"));
        else serve_reply_json(wsi, p, up ? 200 : 503, json_pack("{s:s}", "status", up ? "ok" : "loading"));
    } else if (!strcmp(uri, "/v1/models")) {
        p->endpoint = "models";
        if (serve_authorized(wsi) < 0) return serve_fail(wsi, p, 401, "authentication_error", "%s", "invalid or missing API key");
        if (!ready()) return serve_fail(wsi, p, 503, "server_error", "%s", "the model is loading");
        /* speculative: how this server drafts (none, ngram, draft), for clients
         * that offer the per-request opt-out. */
        const char *spec = qspec_mode_name(S.eo.spec_mode);
        serve_reply_json(wsi, p, 200,
                   json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i, s:s}]}", "object", "list", "data", "id", S.name,
                             "object", "model", "created", (json_int_t)time(NULL), "owned_by", "quire",
                             "max_model_len", S.model->hp.max_ctx, "speculative", spec));
    } else if (!strcmp(uri, "/metrics")) {
        p->endpoint = "metrics";
        char *s = NULL;
        size_t len = 0;
        pthread_mutex_lock(&S.mu);
        const qengine_stats st = S.stats;
        const int have = S.have_stats;
        pthread_mutex_unlock(&S.mu);
        qstore_stats sst;
        if (S.store) qstore_stats_get(S.store, &sst);
        if (qmetrics_render(S.metrics, have ? &st : NULL, S.store ? &sst : NULL, 0, &s, &len))
            return serve_fail(wsi, p, 500, "server_error", "%s", "out of memory");
        serve_reply(wsi, p, 200, "text/plain; version=0.0.4", s, len);
    } else if (!static_file(wsi, p, uri)) {
        p->endpoint = "other";
        serve_fail(wsi, p, 404, "invalid_request_error", "no such endpoint: GET %s", uri);
    }
}

/* Parses body as a request of kind and gives it to the engine for wsi
 * (ws: a WebSocket request with client id cid): the new request, or NULL
 * with *e filled.  first, when not NULL, is the request's first frame. */
sreq *serve_submit(struct lws *wsi, const char *body, size_t len, qoai_kind kind, const char *cid, int want_ids,
                   const char *session, qoai_error *e)
{
    if (!ready()) return qoai_fail(e, 503, "server_error", NULL, "the model is loading; retry shortly"), NULL;
    if (broken())
        return qoai_fail(e, 503, "server_error", NULL,
                         "the backend can run no more passes (a GPU failed); restart the server"),
               NULL;
    sreq *r = calloc(1, sizeof *r);
    if (!r) return qoai_fail(e, 500, "server_error", NULL, "out of memory"), NULL;
    if (qoai_parse(body, len, kind, &S.lim, S.model, S.tok, &r->req, e)) {
        free(r);
        return NULL;
    }
    r->n = r->req.p.n > 1 ? r->req.p.n : 1;
    r->ch = calloc((size_t)r->n, sizeof *r->ch);
    if (!r->ch) {
        serve_sreq_free(r);
        return qoai_fail(e, 500, "server_error", NULL, "out of memory"), NULL;
    }
    if (cid) {
        r->ws = 1, r->want_ids = want_ids;
        snprintf(r->cid, sizeof r->cid, "%s", cid);
    }
    if (session) snprintf(r->session, sizeof r->session, "%s", session);
    pthread_mutex_lock(&S.mu);
    if (S.draining) {
        pthread_mutex_unlock(&S.mu);
        serve_sreq_free(r);
        qoai_fail(e, 503, "server_error", NULL, "the server is shutting down");
        return NULL;
    }
    if (S.live >= S.o.max_requests) {
        pthread_mutex_unlock(&S.mu);
        serve_sreq_free(r);
        qoai_fail(e, 429, "rate_limit_error", NULL, "the server is at its limit of %d requests in flight; retry later",
                  S.o.max_requests);
        return NULL;
    }
    snprintf(r->rid, sizeof r->rid, "%s-%llx%llu", kind == QOAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)time(NULL), ++S.seq);
    r->rep = (qoai_reply){ kind, r->rid, (long long)time(NULL), S.name };
    r->t0 = q_now();
    char err[256];
    if (qengine_submit(S.eng, &r->req.p, &r->id, err, sizeof err)) {
        pthread_mutex_unlock(&S.mu);
        serve_sreq_free(r);
        qoai_fail(e, 400, "invalid_request_error", NULL, "%s", err);
        return NULL;
    }
    if (r->ws)
        out_frame(r, json_pack("{s:s, s:s, s:s, s:s*}", "type", "start", "id", r->cid, "model", S.name, "session",
                               r->session[0] ? r->session : NULL));
    r->wsi = wsi;
    r->next = S.reqs;
    S.reqs = r;
    S.live++;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
    return r;
}

/* A complete POST body: parse it, give it to the engine. */
static void handle_post(struct lws *wsi, pss *p)
{
    qoai_error e;
    sreq *r = serve_submit(wsi, p->body ? p->body : "", p->body_len, (qoai_kind)p->kind, NULL, 0, NULL, &e);
    if (!r) return serve_reply_error(wsi, p, &e);
    p->r = r;
    p->stream = r->req.stream;
    p->status = 200;
    qmetrics_request(S.metrics, p->endpoint, 200);
    lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0);
    if (p->stream) {
        p->st = ST_HEADERS;
        lws_callback_on_writable(wsi);
    } else {
        p->st = ST_WAIT; /* the reply is written once the engine has finished */
    }
}

/* Detaches the connection's request: cancelled if the engine still runs it. */
static void drop_request(pss *p)
{
    if (!p->r) return;
    pthread_mutex_lock(&S.mu);
    sreq *r = p->r;
    r->wsi = NULL;
    if (!r->finished) {
        qengine_cancel(S.eng, r->id);
    } else {
        serve_sreq_unlink(r);
        serve_sreq_free(r);
    }
    pthread_mutex_unlock(&S.mu);
    p->r = NULL;
}

static void reset(pss *p)
{
    free(p->body);
    free(p->resp);
    memset(p, 0, sizeof *p);
}

static int write_headers(struct lws *wsi, pss *p, lws_filepos_t len)
{
    unsigned char buf[LWS_PRE + 1024], *start = buf + LWS_PRE, *q = start, *end = buf + sizeof buf - 1;
    if (lws_add_http_common_headers(wsi, (unsigned)p->status, p->ctype, len, &q, end)) return -1;
    if (p->st == ST_STREAM &&
        lws_add_http_header_by_name(wsi, (const unsigned char *)"cache-control:", (const unsigned char *)"no-cache",
                                    8, &q, end))
        return -1;
    return lws_finalize_write_http_header(wsi, start, &q, end) ? -1 : 0;
}

/* Writes up to 16 KiB of data; 1 when all of it is out. */
static int write_some(struct lws *wsi, const char *data, size_t len, size_t *off, int final)
{
    unsigned char buf[LWS_PRE + 16384];
    const size_t n = len - *off < 16384 ? len - *off : 16384;
    memcpy(buf + LWS_PRE, data + *off, n);
    const int last = *off + n == len;
    if (lws_write(wsi, buf + LWS_PRE, n, last && final ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) < (int)n) return -1;
    *off += n;
    return last;
}

static int on_writable(struct lws *wsi, pss *p)
{
    if (p->st == ST_CLOSING) return -1;
    if (p->r && p->st == ST_HEADERS && p->stream) {
        p->st = ST_STREAM;
        p->ctype = "text/event-stream";
        if (write_headers(wsi, p, LWS_ILLEGAL_HTTP_CONTENT_LEN)) return -1;
        lws_callback_on_writable(wsi);
        return 0;
    }
    if (p->st == ST_STREAM) {
        /* Take what the engine produced, write it, and close after the end. */
        pthread_mutex_lock(&S.mu);
        sreq *r = p->r;
        char *data = r->out;
        size_t len = r->out_len;
        const int done = r->finished, failed = r->failed;
        r->out = NULL, r->out_len = r->out_cap = 0;
        pthread_mutex_unlock(&S.mu);
        if (failed) {
            free(data);
            return -1;
        }
        size_t off = 0;
        while (off < len) /* the chunks of one wake-up, in pieces */
            if (write_some(wsi, data, len, &off, 0) < 0) {
                free(data);
                return -1;
            }
        free(data);
        if (done) {
            p->st = ST_CLOSING;
            lws_callback_on_writable(wsi);
        }
        return 0;
    }
    if (p->st == ST_HEADERS) {
        if (write_headers(wsi, p, p->resp_len)) return -1;
        p->st = ST_BODY;
        lws_callback_on_writable(wsi);
        return 0;
    }
    if (p->st == ST_BODY) {
        const int all = write_some(wsi, p->resp, p->resp_len, &p->resp_off, 1);
        if (all < 0) return -1;
        if (!all) {
            lws_callback_on_writable(wsi);
            return 0;
        }
        drop_request(p);
        reset(p);
        return lws_http_transaction_completed(wsi) ? -1 : 0;
    }
    return 0;
}

/* ---- WebSocket: /v1/ws --------------------------------------------------------- */

/* A frame of the connection's own: {"type": "error", "id", "error"}. */
void serve_ws_error(struct lws *wsi, pss *p, const char *cid, const qoai_error *e)
{
    json_t *j = qoai_error_json(e);
    json_t *f = j ? json_pack("{s:s, s:s?, s:O}", "type", "error", "id", cid, "error", json_object_get(j, "error")) : NULL;
    json_decref(j);
    char *s = f ? json_dumps(f, JSON_COMPACT) : NULL;
    json_decref(f);
    if (!s) return;
    if (!q_append(&p->wsout, &p->wsout_len, &p->wsout_cap, s, strlen(s)) &&
        !q_append(&p->wsout, &p->wsout_len, &p->wsout_cap, "\n", 1))
        lws_callback_on_writable(wsi);
    free(s);
}

/* A whole client message: chat (a request) or cancel. */
static void ws_message(struct lws *wsi, pss *p)
{
    qoai_error e;
    json_t *m = json_loadb(p->msg ? p->msg : "", p->msg_len, 0, NULL);
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
    pthread_mutex_lock(&S.mu);
    sreq *same = S.reqs;
    while (same && !(same->wsi == wsi && !strcmp(same->cid, cid) && !same->finished)) same = same->next;
    if (same && !strcmp(t, "cancel")) qengine_cancel(S.eng, same->id);
    pthread_mutex_unlock(&S.mu);
    if (!strcmp(t, "cancel")) {
        if (!same) {
            qoai_fail(&e, 404, "invalid_request_error", "id", "no request '%s' runs on this connection", cid);
            serve_ws_error(wsi, p, cid, &e);
        }
    } else if (!strcmp(t, "chat")) {
        json_t *ti = json_object_get(m, "token_ids");
        if (same) {
            qoai_fail(&e, 400, "invalid_request_error", "id", "a request '%s' already runs on this connection", cid);
            serve_ws_error(wsi, p, cid, &e);
        } else if (json_object_get(m, "session") || json_object_get(m, "new_session")) {
            sess_ws_chat(wsi, p, m, cid);
        } else if (!serve_submit(wsi, p->msg, p->msg_len, json_object_get(m, "messages") ? QOAI_CHAT : QOAI_COMPLETION, cid,
                           json_is_true(ti), NULL, &e)) {
            serve_ws_error(wsi, p, cid, &e);
        } else {
            qmetrics_request(S.metrics, "ws", 200);
            lws_callback_on_writable(wsi);
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
static int ws_writable(struct lws *wsi, pss *p)
{
    unsigned char *buf = NULL;
    size_t n = 0;
    if (p->wsout_len && !(buf = take_frame(p->wsout, &p->wsout_len, &n))) return -1;
    int more = p->wsout_len > 0;
    pthread_mutex_lock(&S.mu);
    sreq *pick = NULL;
    int failed = 0;
    for (sreq *r = S.reqs; r; r = r->next) failed |= r->wsi == wsi && r->failed;
    if (failed) { /* a request's output was lost (a reader too slow, or memory): the socket closes */
        pthread_mutex_unlock(&S.mu);
        free(buf);
        return -1;
    }
    for (sreq *r = S.reqs; !buf && r; r = r->next)
        if (r->wsi == wsi && r->out_len && (!pick || r->frames < pick->frames)) pick = r;
    for (sreq **pp = &S.reqs; *pp;) {
        sreq *r = *pp;
        if (r->wsi != wsi) {
            pp = &r->next;
            continue;
        }
        if (r == pick) {
            r->frames++;
            buf = take_frame(r->out, &r->out_len, &n);
        }
        if (r->out_len) more = 1;
        if (r->finished && !r->out_len) {
            *pp = r->next;
            serve_sreq_free(r);
        } else {
            pp = &r->next;
        }
    }
    pthread_mutex_unlock(&S.mu);
    int rc = 0;
    if (buf && lws_write(wsi, buf + LWS_PRE, n, LWS_WRITE_TEXT) < (int)n) rc = -1;
    free(buf);
    if (!rc && more) lws_callback_on_writable(wsi);
    return rc;
}

/* The connection closed: its running requests are cancelled, the finished
 * ones freed. */
static void ws_closed(struct lws *wsi, pss *p)
{
    pthread_mutex_lock(&S.mu);
    for (sreq **pp = &S.reqs; *pp;) {
        sreq *r = *pp;
        if (r->wsi != wsi) {
            pp = &r->next;
            continue;
        }
        r->wsi = NULL;
        if (!r->finished) {
            qengine_cancel(S.eng, r->id);
            pp = &r->next;
        } else {
            *pp = r->next;
            serve_sreq_free(r);
        }
    }
    pthread_mutex_unlock(&S.mu);
    free(p->msg);
    free(p->wsout);
    memset(p, 0, sizeof *p);
}

static int cb_http(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
    pss *p = user;
    switch (reason) {
    case LWS_CALLBACK_CLOSED_HTTP:
    case LWS_CALLBACK_CLOSED:
        /* lws drops a connection before its headers are whole (too large,
         * garbage, TLS, idle) without ever making its state. */
        sess_closed(wsi);
        if (!p) return 0;
        if (p->ws) ws_closed(wsi, p);
        else drop_request(p), reset(p);
        return 0;
    case LWS_CALLBACK_HTTP: {
        if (!p) return -1;
        const char *uri = in;
        reset(p);
        if (lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI) > 0) {
            p->is_post = 1;
            if (!strcmp(uri, "/v1/chat/completions")) p->kind = QOAI_CHAT, p->endpoint = "chat";
            else if (!strcmp(uri, "/v1/completions")) p->kind = QOAI_COMPLETION, p->endpoint = "completions";
            else return serve_fail(wsi, p, 404, "invalid_request_error", "no such endpoint: POST %s", uri), 0;
            if (serve_authorized(wsi) < 0) return serve_fail(wsi, p, 401, "authentication_error", "%s", "invalid or missing API key"), 0;
            char cl[32];
            if (lws_hdr_copy(wsi, cl, sizeof cl, WSI_TOKEN_HTTP_CONTENT_LENGTH) > 0 &&
                strtoull(cl, NULL, 10) > (unsigned long long)S.o.max_body_kb * 1024)
                p->too_big = 1;
            p->st = ST_NEW;
            return 0; /* the body follows */
        }
        if (lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI) > 0) return handle_get(wsi, p, uri), 0;
        if (lws_hdr_total_length(wsi, WSI_TOKEN_DELETE_URI) > 0) {
            if (!sess_http(wsi, p, "DELETE", uri, NULL, 0))
                serve_fail(wsi, p, 404, "invalid_request_error", "no such endpoint: DELETE %s", uri);
            return 0;
        }
        if (lws_hdr_total_length(wsi, WSI_TOKEN_PATCH_URI) > 0) {
            /* The body follows; answered at its end. */
            p->method = 'A';
            snprintf(p->uri, sizeof p->uri, "%s", uri);
            p->st = ST_NEW;
            return 0;
        }
        p->endpoint = "other";
        serve_fail(wsi, p, 405, "invalid_request_error", "%s", "only GET, POST, PATCH and DELETE are served");
        return 0;
    }
    case LWS_CALLBACK_HTTP_BODY:
        if (!p) return -1;
        if (p->too_big || p->st != ST_NEW) return 0;
        if (p->body_len + len > (size_t)S.o.max_body_kb * 1024) {
            p->too_big = 1;
            return 0;
        } else {
            char *b = realloc(p->body, p->body_len + len + 1);
            if (!b) {
                p->too_big = 1;
                return 0;
            }
            memcpy(b + p->body_len, in, len);
            p->body = b;
            p->body_len += len;
        }
        return 0;
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
        if (!p) return -1;
        if (p->st != ST_NEW) return 0;
        if (p->too_big) {
            char kb[16];
            snprintf(kb, sizeof kb, "%d", S.o.max_body_kb);
            serve_fail(wsi, p, 413, "invalid_request_error", "the body is larger than this server takes (%s KiB)", kb);
            return 0;
        }
        if (p->method == 'A') {
            if (!sess_http(wsi, p, "PATCH", p->uri, p->body ? p->body : "", p->body_len))
                serve_fail(wsi, p, 404, "invalid_request_error", "no such endpoint: PATCH %s", p->uri);
            return 0;
        }
        handle_post(wsi, p);
        return 0;
    case LWS_CALLBACK_HTTP_WRITEABLE:
        if (!p) return -1;
        if (p->st == ST_WAIT) {
            /* A whole reply: written once the engine has finished. */
            pthread_mutex_lock(&S.mu);
            sreq *r = p->r;
            const int done = r && r->finished, failed = r && r->failed;
            char *data = done ? r->out : NULL;
            const size_t dl = done ? r->out_len : 0;
            if (done) r->out = NULL, r->out_len = r->out_cap = 0;
            pthread_mutex_unlock(&S.mu);
            if (!done) return 0;
            if (failed || !data) {
                free(data);
                serve_fail(wsi, p, 500, "server_error", "%s", "out of memory");
                return 0;
            }
            p->status = 200, p->ctype = "application/json", p->resp = data, p->resp_len = dl, p->resp_off = 0;
            p->st = ST_HEADERS;
        }
        return on_writable(wsi, p);
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION: {
        char uri[64];
        if (lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_GET_URI) <= 0 || strcmp(uri, "/v1/ws")) return 1;
        if (!origin_allowed(wsi)) {
            QLOGW("serve: a WebSocket from another site's page refused (see --allow-origin)");
            return 1;
        }
        return serve_authorized(wsi) >= 0 ? 0 : 1;
    }
    case LWS_CALLBACK_ESTABLISHED:
        if (!p) return -1;
        memset(p, 0, sizeof *p);
        p->ws = 1;
        p->key = serve_authorized(wsi); /* checked at the upgrade: which key */
        return 0;
    case LWS_CALLBACK_RECEIVE:
        if (!p) return -1;
        if (!p->msg_too_big && p->msg_len + len > (size_t)S.o.max_body_kb * 1024) p->msg_too_big = 1;
        if (!p->msg_too_big) {
            char *b = realloc(p->msg, p->msg_len + len + 1);
            if (!b) p->msg_too_big = 1;
            else memcpy(b + p->msg_len, in, len), p->msg = b, p->msg_len += len;
        }
        if (lws_is_final_fragment(wsi)) {
            if (p->msg_too_big) {
                qoai_error e;
                qoai_fail(&e, 413, "invalid_request_error", NULL, "the message is larger than this server takes (%d KiB)",
                          S.o.max_body_kb);
                serve_ws_error(wsi, p, NULL, &e);
            } else {
                ws_message(wsi, p);
            }
            free(p->msg);
            p->msg = NULL, p->msg_len = 0, p->msg_too_big = 0;
        }
        return 0;
    case LWS_CALLBACK_SERVER_WRITEABLE:
        if (!p) return -1;
        return ws_writable(wsi, p);
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        if (lws_get_protocol(wsi) && strcmp(lws_get_protocol(wsi)->name, "http"))
            return 0; /* sent to each protocol: once is enough */
        sess_answers();
        /* The engine produced output: writable callbacks where it waits. */
        pthread_mutex_lock(&S.mu);
        for (sreq *r = S.reqs; r; r = r->next)
            if (r->wsi && (r->out_len || r->finished || r->failed)) lws_callback_on_writable(r->wsi);
        pthread_mutex_unlock(&S.mu);
        return 0;
    default:
        break;
    }
    return lws_callback_http_dummy(wsi, reason, user, in, len);
}

/* "quire.v1": the WebSocket protocol by name, for clients that offer
 * subprotocols (the page does, to carry its API key); the same callback. */
static const struct lws_protocols protocols[] = {
    { "http", cb_http, sizeof(pss), 0, 0, NULL, 0 },
    { "quire.v1", cb_http, sizeof(pss), 0, 0, NULL, 0 },
    { NULL, NULL, 0, 0, 0, NULL, 0 },
};

int cmd_serve(int argc, char **argv)
{
    serve_opts *o = &S.o;
    memset(o, 0, sizeof *o);
    o->port = 8080, o->max_tokens = 4096, o->max_body_kb = 1024, o->max_requests = 256, o->gpu_mem_util = 0.9f;
    o->grace = 5;
    o->host = "127.0.0.1";
    if (qopt_parse("serve", serve_table, N_SERVE_OPTS, argc, argv, o)) return 2;
    if (o->help) {
        printf("usage: quire serve -m MODEL [options]\n\nServes the model over HTTP: the OpenAI-compatible API\n"
               "(/v1/chat/completions, /v1/completions, /v1/models), /health and /metrics.\n\noptions:\n");
        qopt_usage(stdout, serve_table, N_SERVE_OPTS);
        return 0;
    }
    if (!o->model) {
        fprintf(stderr, "quire serve: -m MODEL is required (see quire serve --help)\n");
        return 2;
    }
    if (o->log_level) {
        static const char *const names[] = { "debug", "info", "warn", "error", "off" };
        int lv = -1;
        for (int i = 0; i < 5; i++)
            if (!strcmp(o->log_level, names[i])) lv = i;
        if (lv < 0) {
            fprintf(stderr, "quire serve: --log-level must be debug, info, warn, error or off\n");
            return 2;
        }
        qlog_set_level((qlog_level)lv);
    }
    if (o->api_key) S.keys[S.n_keys++] = o->api_key;
    if (o->api_key_file) {
        /* Every non-empty line is a key. */
        FILE *f = fopen(o->api_key_file, "r");
        size_t used = 0;
        char line[1024];
        const int before = S.n_keys;
        while (f && fgets(line, sizeof line, f)) {
            line[strcspn(line, "\r\n")] = 0;
            const size_t l = strlen(line);
            if (!l) continue;
            if (used + l + 1 > sizeof S.key_buf || S.n_keys == (int)(sizeof S.keys / sizeof S.keys[0])) {
                fprintf(stderr, "quire serve: --api-key-file %s: too many keys\n", o->api_key_file);
                fclose(f);
                return 2;
            }
            memcpy(S.key_buf + used, line, l + 1);
            S.keys[S.n_keys++] = S.key_buf + used;
            used += l + 1;
        }
        if (f) fclose(f);
        if (S.n_keys == before) {
            fprintf(stderr, "quire serve: --api-key-file %s: cannot read a key\n", o->api_key_file);
            return 2;
        }
    }
    if (o->disk_load && strcmp(o->disk_load, "auto") && strcmp(o->disk_load, "always")) {
        fprintf(stderr, "quire serve: --cache-disk-load must be auto or always\n");
        return 2;
    }
    if (o->cache_disk_max < 0) {
        fprintf(stderr, "quire serve: --cache-disk-max must be at least 0\n");
        return 2;
    }
    if (o->port < 0 || o->port > 65535 || o->max_tokens < 1 || o->max_body_kb < 1 || o->max_requests < 1) {
        fprintf(stderr, "quire serve: --port, --max-tokens, --max-body and --max-requests must be positive\n");
        return 2;
    }
    qengine_opts eo;
    qengine_opts_default(&eo);
    if (o->device && qdevice_parse(o->device, &eo.device)) {
        fprintf(stderr, "quire serve: --device must be auto, cpu or cuda\n");
        return 2;
    }
    eo.n_threads = o->threads;
    eo.gpu_mem_util = o->gpu_mem_util;
    if (o->tensor_parallel < 0 || o->tensor_parallel > 16) {
        fprintf(stderr, "quire serve: --tensor-parallel must be 1 to 16\n");
        return 2;
    }
    eo.tensor_parallel = o->tensor_parallel;
    if (o->kv_mem > 0) eo.kv_mem_mb = (size_t)o->kv_mem;
    if (o->max_batch_tokens > 0) eo.max_batch_tokens = o->max_batch_tokens;
    if (o->max_seqs > 0) eo.max_seqs = o->max_seqs;
    if (o->block_size > 0) eo.block_size = o->block_size;
    if (o->draft) eo.spec_mode = QSPEC_DRAFT;
    if (o->spec && qspec_mode_parse(o->spec, &eo.spec_mode)) {
        fprintf(stderr, "quire serve: --spec must be none, ngram or draft\n");
        return 2;
    }
    if ((eo.spec_mode == QSPEC_DRAFT) != (o->draft != NULL)) {
        fprintf(stderr, o->draft ? "quire serve: --draft goes with --spec draft (or no --spec)\n"
                                 : "quire serve: --spec draft needs --draft PATH\n");
        return 2;
    }
    if (o->spec_k < 0 || o->spec_k > QENGINE_MAX_SPEC_K || o->spec_max_batch < 0) {
        fprintf(stderr, "quire serve: --spec-k must be 1 to %d, --spec-max-batch positive\n", QENGINE_MAX_SPEC_K);
        return 2;
    }
    if (o->spec_k) eo.spec_k = o->spec_k;
    if (o->spec_max_batch) eo.spec_max_batch = o->spec_max_batch;
    eo.spec_always = o->spec_always;
    if (eo.spec_always && eo.spec_mode == QSPEC_NONE) {
        fprintf(stderr, "quire serve: --spec-always goes with --spec or --draft\n");
        return 2;
    }

    /* The database opens before the port: a database the program cannot use
     * (corrupt, newer) stops the start with its message. */
    if (!o->no_persist) {
        char err[512];
        qstore_opts so = { .disk_max = (int64_t)(o->cache_disk_max ? o->cache_disk_max : 4096) << 20 };
        if (qstore_start(o->db ? o->db : "quire.db", &so, &S.store, err, sizeof err)) {
            fprintf(stderr, "quire serve: %s\n", err);
            return 1;
        }
        eo.store = S.store;
        eo.tier_always_load = o->disk_load && !strcmp(o->disk_load, "always");
    }
    S.eo = eo;
    S.lim.max_tokens_cap = o->max_tokens;
    if (o->name) S.name = o->name;
    else {
        const char *b = strrchr(o->model, '/');
        S.name = b && b[1] ? b + 1 : o->model;
    }
    /* The web folder: --web, else web/ beside the build folder or here. */
    char exe[PATH_MAX], cand[PATH_MAX + 16];
    const ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (o->web) {
        if (!(S.web_root = realpath(o->web, NULL))) {
            fprintf(stderr, "quire serve: --web %s: no such folder\n", o->web);
            return 2;
        }
    } else {
        if (el > 0) {
            exe[el] = 0;
            char *slash = strrchr(exe, '/');
            if (slash) *slash = 0;
            snprintf(cand, sizeof cand, "%s/../web", exe);
            S.web_root = realpath(cand, NULL);
        }
        if (!S.web_root) S.web_root = realpath("web", NULL);
    }
    S.metrics = qmetrics_new();
    S.gcache = gram_cache_new(64);
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);

    lws_set_log_level(LLL_ERR, NULL);
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.port = o->port;
    info.iface = o->host;
    info.protocols = protocols;
    info.options = LWS_SERVER_OPTION_DISABLE_IPV6;
    S.ctx = S.metrics ? lws_create_context(&info) : NULL;
    pthread_t th;
    int status = 0;
    if (!S.ctx || pthread_create(&th, NULL, engine_main, NULL)) {
        fprintf(stderr, "quire serve: cannot listen on %s:%d\n", o->host, o->port);
        status = 1;
    } else {
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        signal(SIGPIPE, SIG_IGN);
        printf("quire serve: %s (%s), listening on http://%s:%d (loading the model)\n", S.name, o->model, o->host,
               o->port);
        fflush(stdout);
        /* Until a signal; then new requests get 503, running ones have
         * --shutdown-grace seconds to finish before they are cancelled, and
         * the loop goes on until every connection has had its final event
         * (at most 5 s more). */
        double deadline = 0;
        int cancelled = 0;
        while (lws_service(S.ctx, 0) >= 0) {
            if (!S.stop) continue;
            const double now = q_now();
            pthread_mutex_lock(&S.mu);
            if (!S.draining) {
                S.draining = 1;
                deadline = now + (o->grace >= 0 ? o->grace : 0);
                fprintf(stderr, "quire serve: stopping (%d requests running)\n", S.live);
            }
            if (!cancelled && now >= deadline) {
                for (sreq *r = S.reqs; r; r = r->next)
                    if (!r->finished) qengine_cancel(S.eng, r->id);
                cancelled = 1;
                deadline = now + 5;
            }
            int busy = 0;
            for (sreq *r = S.reqs; r; r = r->next) busy |= r->wsi != NULL;
            pthread_mutex_unlock(&S.mu);
            if (!busy || (cancelled && now >= deadline)) break;
        }
        /* Stop: cancel what runs, let the engine finish it, then leave. */
        pthread_mutex_lock(&S.mu);
        for (sreq *r = S.reqs; r; r = r->next)
            if (!r->finished) qengine_cancel(S.eng, r->id);
        S.engine_stop = 1;
        pthread_cond_signal(&S.cv);
        pthread_mutex_unlock(&S.mu);
        pthread_join(th, NULL);
        /* The store finishes what is queued (replies, blocks) before the
         * process goes. */
        qstore_stop(S.store);
        S.store = NULL;
    }
    sess_drop_all();
    if (S.ctx) lws_context_destroy(S.ctx);
    while (S.reqs) {
        sreq *r = S.reqs;
        S.reqs = r->next;
        serve_sreq_free(r);
    }
    qengine_destroy(S.eng);
    gram_vocab_free(S.gvocab);
    gram_cache_free(S.gcache);
    qstore_stop(S.store);
    qmetrics_free(S.metrics);
    free(S.web_root);
    qtok_free(S.tok);
    qmodel_destroy(S.model);
    qmodel_destroy(S.draft);
    if (S.load_failed) status = 1;
    fprintf(stderr, "quire serve: stopped\n");
    return status;
}
