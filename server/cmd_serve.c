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
#include <errno.h>
#include <libwebsockets.h>
#include <netdb.h>
#include <pthread.h>
#include <dirent.h>
#include <sys/socket.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "chat.h"
#include "arch.h"
#include "cli.h"
#include "gram.h"
#include "schema.h"
#include "serve.h"
#include "engine.h"
#include "metrics.h"
#include "model.h"
#include "oai.h"
#include "opts.h"
#include "qerr.h"
#include "tokenizer.h"
#include "buf.h"
#include "util.h"


#define F_(field) offsetof(serve_opts, field)
static const qopt serve_table[] = {
    { "-m", "--model", "PATH", OPT_STR, F_(model), "model: a .gguf file or a Hugging Face folder (required)" },
    { NULL, "--host", "ADDR", OPT_STR, F_(host), "address to listen on (default 127.0.0.1)" },
    { NULL, "--port", "N", OPT_INT, F_(port), "port for HTTP (default 8080)" },
    { NULL, "--served-model-name", "NAME", OPT_STR, F_(name), "the model's id in the API; NAME,ALIAS,... for names a request may use too (default: the file's name, and the -m path as given)" },
    { NULL, "--api-key", "KEY", OPT_STR, F_(api_key), "require 'Authorization: Bearer KEY' on /v1 (default: none)" },
    { NULL, "--api-key-file", "PATH", OPT_STR, F_(api_key_file), "API keys from a file, one a line (kept out of ps); each key owns its sessions" },
    { NULL, "--db", "PATH", OPT_STR, F_(db), "the database: sessions and the persistent prefix cache (default quire.db)" },
    { NULL, "--no-persist", NULL, OPT_FLAG, F_(no_persist), "no database: no sessions, no prefix cache on disk" },
    { NULL, "--cache-disk-load", "WHEN", OPT_STR, F_(disk_load), "auto: load a prefix from disk while that is measured faster than computing it; always (default auto)" },
    { NULL, "--cache-disk-max", "MB", OPT_INT, F_(cache_disk_max), "disk for the persistent prefix cache, least recently used blocks evicted (default 4096 MiB)" },
    { NULL, "--web", "DIR", OPT_STR, F_(web), "static files served at / (default: the project's web/)" },
    { NULL, "--allowed-origins", "LIST", OPT_STR, F_(allow_origin), "pages from these origins may call the API (CORS, preflight answered) and open the WebSocket: a JSON list or commas, scheme://host:port each, or * for any (default: only the server's own pages)" },
    { NULL, "--allow-origin", "LIST", OPT_STR, F_(allow_origin), "the same as --allowed-origins" },
    { NULL, "--chat-template", "FILE", OPT_STR, F_(chat_template_path), "a Jinja chat template to use instead of the model's" },
    { NULL, "--json-schema-mode", "MODE", OPT_STR, F_(schema_mode), "strict: properties a schema does not list are not generated unless additionalProperties allows them (as XGrammar and llama.cpp); full: JSON Schema's own meaning (default strict)" },
    { NULL, "--tool-call-parser", "NAME", OPT_STR, F_(tool_parser), "the form tool calls are written and read in: hermes (<tool_call>), llama3_json ({\"name\", \"parameters\"}), mistral ([TOOL_CALLS]), or auto: the one the chat template shows, hermes when it shows none (default auto)" },
    { NULL, "--log-level", "LEVEL", OPT_STR, F_(log_level), "debug, info, warn, error or off (default info)" },
    { NULL, "--shutdown-grace", "S", OPT_FLOAT, F_(grace), "on SIGINT/SIGTERM, seconds running requests may finish before they are cancelled (default 5)" },
    { NULL, "--max-tokens", "N", OPT_INT, F_(max_tokens), "largest max_tokens a request may ask for (default 4096)" },
    { NULL, "--max-body", "KB", OPT_INT, F_(max_body_kb), "largest request body (default 1024 KiB)" },
    { NULL, "--max-requests", "N", OPT_INT, F_(max_requests), "requests in flight at most; more get 429 (default 256)" },
    { NULL, "--max-header", "KB", OPT_INT, F_(max_header_kb), "largest request line and headers; more get 431 (default 16 KiB; targets past 8 KiB get 414)" },
    { NULL, "--max-connections", "N", OPT_INT, F_(max_connections), "connections open at once; more are closed at once (default 1024)" },
    { NULL, "--max-pending", "MB", OPT_INT, F_(max_pending_mb), "output a connection's client has not read, at most; past it its requests are cancelled and the connection closed (default 8 MiB)" },
    { NULL, "--prep-threads", "N", OPT_INT, F_(prep_threads), "threads that parse, template, tokenize and compile requests, off the socket thread (default 2)" },
    { NULL, "--grammar-timeout", "S", OPT_FLOAT, F_(grammar_timeout), "seconds a request's schema, regex, choice or tools may take to compile, else 400 (default 10)" },
    { NULL, "--idle-timeout", "S", OPT_FLOAT, F_(idle_timeout), "seconds a kept-alive connection may wait for its next request (default 10)" },
    { NULL, "--request-timeout", "S", OPT_FLOAT, F_(request_timeout), "seconds a request may take to arrive whole, else 408 (default 30)" },
    { NULL, "--max-model-len", "N", OPT_INT, F_(max_model_len), "the context a request gets, prompt and output (default: the model's, lowered to what the KV cache holds)" },
    { "-c", "--ctx-size", "N", OPT_INT, F_(max_model_len), "the same as --max-model-len (llama-server's name)" },
    { "-h", "--help", NULL, OPT_FLAG, F_(help), "show this help" },
};
#undef F_
#define N_SERVE_OPTS (sizeof serve_table / sizeof serve_table[0])

serve_state S;

static void stop_tick_cb(lws_sorted_usec_list_t *sul) { (void)sul; }

/* The model's size on disk: a file, or a folder's files. */
static double model_bytes(const char *path)
{
    struct stat st;
    if (stat(path, &st)) return 0;
    if (!S_ISDIR(st.st_mode)) return (double)st.st_size;
    double total = 0;
    DIR *d = opendir(path);
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
        char p[PATH_MAX + 256];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (e->d_name[0] != '.' && !stat(p, &st) && S_ISREG(st.st_mode)) total += (double)st.st_size;
    }
    if (d) closedir(d);
    return total;
}

/* Every 5 s while the model loads: a line that says so. */
static void load_tick_cb(lws_sorted_usec_list_t *sul)
{
    (void)sul;
    pthread_mutex_lock(&S.mu);
    const int waiting = !S.ready && !S.load_failed;
    pthread_mutex_unlock(&S.mu);
    if (!waiting || S.stop) return;
    QLOGI("serve: still loading %s (%.2f GB), %.0f s so far", S.o.model, S.load_bytes / 1e9, q_now() - S.load_t0);
    lws_sul_schedule(S.ctx, 0, &S.load_tick, load_tick_cb, 5 * LWS_US_PER_SEC);
}

static void on_signal(int sig)
{
    (void)sig;
    S.stop = 1;
    if (S.ctx) lws_cancel_service(S.ctx);
}

/* ---- output built under S.mu --------------------------------------------------- */

/* A connection's output past --max-pending (S.mu held): every request of
 * it is cancelled and failed, so that the lws thread closes the socket. */
static void over_budget(sconn *c)
{
    int n = 0;
    c->over = 1;
    for (sreq *q = S.reqs; q; q = q->next)
        if (q->conn == c) {
            if (!q->finished) qengine_cancel(S.eng, q->id);
            q->failed = 1;
            n++;
        }
    QLOGW("serve: a client fell %zu bytes behind (--max-pending %d MiB); its %d requests are cancelled and its "
          "connection closed",
          c->pending, S.o.max_pending_mb, n);
    qmetrics_conn_closed(S.metrics, QCONN_SLOW_READER);
    if (c->wsi) lws_cancel_service(S.ctx);
}

static void out_put(sreq *r, const char *s, size_t n)
{
    if (r->failed) return;
    sconn *c = r->conn;
    if (c && c->pending + n > ((size_t)S.o.max_pending_mb << 20)) {
        /* The client reads too slowly: the engine never waits for it. */
        if (!c->over) over_budget(c);
        r->failed = 1;
        return;
    }
    if (q_append(&r->out, &r->out_len, &r->out_cap, s, n)) r->failed = 1;
    else if (c) c->pending += n;
}

void sconn_taken(sconn *c, size_t n)
{
    if (c) c->pending = c->pending > n ? c->pending - n : 0;
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
    sconn_taken(r->conn, r->out_len);
    sconn_unref(r->conn);
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

/* echo: the prompt's text (completions) or the last message's (chat)
 * before choice index's first output (S.mu held). */
static void out_echo(sreq *r, acc *c, int index)
{
    c->echoed = 1;
    const char *t = r->req.echo_text;
    const size_t n = r->req.echo_len;
    if (!t || !n) return;
    if (r->ws) {
        out_frame(r, json_pack("{s:s, s:s, s:i, s:s%}", "type", "delta", "id", r->cid, "index", index, "text", t, n));
    } else if (r->req.stream) {
        out_event(r, qoai_chunk(&r->rep, index, t, n, NULL, NULL, r->req.kind == QOAI_CHAT && !c->started));
        c->started = 1;
    }
    if ((!r->req.stream && !r->ws) || (r->session[0] && index == 0)) {
        if (q_append(&c->text, &c->len, &c->cap, t, n)) r->failed = 1;
    } else {
        c->len += n;
    }
}

/* An engine event into its request's output (S.mu held). */
static void dispatch(qevent *ev)
{
    sreq *r = S.reqs;
    while (r && r->id != ev->id) r = r->next;
    if (!r || ev->index < 0 || ev->index >= r->n) return;
    acc *c = &r->ch[ev->index];
    if (!c->echoed) out_echo(r, c, ev->index);
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
        char prefix[112];
        snprintf(prefix, sizeof prefix, "call_%.40s_%d_", strchr(r->rid, '-') ? strchr(r->rid, '-') + 1 : r->rid,
                 ev->index);
        if (!(c->calls = qoai_calls_new(r->req.tool_mode, S.lim.tool_form, r->req.tool_name, prefix))) r->failed = 1;
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
int serve_ready(void)
{
    pthread_mutex_lock(&S.mu);
    const int r = S.ready;
    pthread_mutex_unlock(&S.mu);
    return r;
}

/* The backend stopped for good (qengine_broken). */
int serve_broken(void)
{
    pthread_mutex_lock(&S.mu);
    const int b = S.broken;
    pthread_mutex_unlock(&S.mu);
    return b;
}

/* --max-model-len against the model (before the engine exists): 0, or 1
 * after saying why. */
static int apply_max_model_len(qmodel *m)
{
    if (!S.o.max_model_len) return 0;
    if (S.o.max_model_len > m->hp.max_ctx) {
        fprintf(stderr,
                "quire serve: --max-model-len %d is more than the model's context (%d tokens); give at most %d\n",
                S.o.max_model_len, m->hp.max_ctx, m->hp.max_ctx);
        return 1;
    }
    m->hp.max_ctx = S.o.max_model_len;
    return 0;
}

/* The KV pool against the context the server advertises: a context the
 * pool cannot hold for one request is refused when --max-model-len asked
 * for it (as vLLM does), else lowered to what fits, said in the log.  0,
 * or 1 after saying why. */
static int fit_context(qmodel *m, qengine *e)
{
    qengine_stats st;
    qengine_stats_get(e, &st);
    const long cap = (long)st.kv_blocks * (S.eo.block_size > 0 ? S.eo.block_size : 16);
    if (cap >= m->hp.max_ctx) return 0;
    if (S.o.max_model_len) {
        fprintf(stderr,
                "quire serve: --max-model-len %d does not fit in the KV cache, which holds %ld tokens; give more "
                "--kv-mem (or --gpu-memory-utilization), or a smaller --max-model-len\n",
                S.o.max_model_len, cap);
        return 1;
    }
    if (cap < 2) {
        fprintf(stderr, "quire serve: the KV cache holds %ld tokens; give more --kv-mem\n", cap);
        return 1;
    }
    QLOGW("serve: the KV cache holds %ld tokens, less than the model's context of %d: requests get %ld (raise "
          "--kv-mem or --gpu-memory-utilization for more)",
          cap, m->hp.max_ctx, cap);
    m->hp.max_ctx = (int)cap;
    return 0;
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
    const double t0 = q_now();
    int rc = qmodel_load(S.o.model, &m, err, sizeof err) || qtok_for_model(m, &tok, err, sizeof err);
    if (!rc && S.o.ef.draft && qmodel_load(S.o.ef.draft, &dm, err + 17, sizeof err - 17)) {
        memcpy(err, "the draft model: ", 17); /* before its own message */
        rc = 1;
    }
    S.eo.draft = dm;
    if (!rc && apply_max_model_len(m)) rc = 2;
    if (rc == 1 || (!rc && qengine_create(m, tok, &S.eo, &e, err, sizeof err)) ||
        (!rc && qengine_grammar_vocab(tok, &gv) && snprintf(err, sizeof err, "out of memory for the grammar vocabulary")))
        rc = 1;
    if (!rc && fit_context(m, e)) rc = 2;
    if (rc) {
        if (rc == 1) fprintf(stderr, "quire serve: %s\n", err);
        gram_vocab_free(gv);
        qengine_destroy(e);
        qtok_free(tok);
        qmodel_destroy(m);
        qmodel_destroy(dm);
        S.eo.draft = NULL;
        return 1;
    }
    /* Tool calls in the form --tool-call-parser names, else the template's;
     * where its markers are special tokens, a vocabulary that allows them. */
    const int named_form = gram_tools_form_named(S.o.tool_parser);
    const char *tmpl = S.chat_template ? S.chat_template : m->chat_template;
    const gram_tools_form form = named_form >= 0 ? (gram_tools_form)named_form : qoai_tool_form_of(tmpl);
    const char *const *markers = gram_tools_form_get(form)->tokens;
    gram_vocab *gvt = NULL;
    int n_markers = 0;
    for (int k = 0; markers[k] && !n_markers; k++) {
        const int id = qtok_token_to_id(tok, markers[k], strlen(markers[k]));
        n_markers = id >= 0 && qtok_is_special(tok, id);
    }
    if (n_markers && qengine_grammar_vocab_with(tok, markers, &n_markers, &gvt)) n_markers = 0;
    pthread_mutex_lock(&S.mu);
    S.gvocab_tools = gvt;
    S.lim.gvocab_tools = S.lim_ws.gvocab_tools = gvt;
    S.lim.tool_form = S.lim_ws.tool_form = form;
    S.model = m, S.draft = dm, S.tok = tok, S.eng = e, S.ready = 1;
    S.gvocab = gv;
    S.lim.gvocab = gv;
    S.lim.gcache = S.gcache;
    S.lim.gfail = S.gfail;
    S.lim_ws.gvocab = gv;
    S.lim_ws.gcache = S.gcache;
    S.lim_ws.gfail = S.gfail;
    pthread_mutex_unlock(&S.mu);
    qengine_stats st;
    qengine_stats_get(e, &st);
    const qhparams *hp = &m->hp;
    QLOGI("serve: model %s: %s, %.1fM parameters, %d layers, %s weights; context %d tokens; KV cache %ld tokens "
          "(%d blocks); loaded in %.1f s",
          m->name ? m->name : S.name, qfamily_get(hp->family)->name, (double)qmodel_param_count(m) / 1e6,
          hp->n_layers, qdt_name(m->w.tok_embd.dtype), hp->max_ctx,
          (long)st.kv_blocks * (S.eo.block_size > 0 ? S.eo.block_size : 16), st.kv_blocks, q_now() - t0);
    if (S.eo.tensor_parallel > 1)
        fprintf(stderr, "quire serve: %s ready on %s, split among %d (tensor parallel)\n", S.name,
                qengine_backend_name(e), S.eo.tensor_parallel);
    else fprintf(stderr, "quire serve: %s ready on %s\n", S.name, qengine_backend_name(e));
    QLOGI("serve: tool calls in the %s form (%s)%s", gram_tools_form_get(form)->parser,
          named_form >= 0 ? "--tool-call-parser" : "the chat template's",
          n_markers ? ", its markers as the model's special tokens" : "");
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

/* ---- HTTP ------------------------------------------------------------------------ *//* Parses body as a request of kind and gives it to the engine for wsi
 * (ws: a WebSocket request with client id cid): the new request, or NULL
 * with *e filled.  first, when not NULL, is the request's first frame. */
sreq *serve_submit(sconn *c, const char *body, size_t len, qoai_kind kind, const char *cid, int want_ids,
                   const char *session, qoai_error *e)
{
    if (!serve_ready()) return qoai_fail(e, 503, "server_error", NULL, "the model is loading; retry shortly"), NULL;
    if (serve_broken())
        return qoai_fail(e, 503, "server_error", NULL,
                         "the backend can run no more passes (a GPU failed); restart the server"),
               NULL;
    sreq *r = calloc(1, sizeof *r);
    if (!r) return qoai_fail(e, 500, "server_error", NULL, "out of memory"), NULL;
    if (qoai_parse(body, len, kind, cid ? &S.lim_ws : &S.lim, S.model, S.tok, &r->req, e)) {
        free(r);
        return NULL;
    }
    if (cid && r->req.request_id) { /* a WebSocket request is known by its id */
        qoai_req_free(&r->req);
        free(r);
        return qoai_fail(e, 400, "invalid_request_error", "request_id",
                         "'request_id' is for HTTP; a WebSocket request is known by its 'id'"),
               NULL;
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
    if (S.draining || c->closed) {
        pthread_mutex_unlock(&S.mu);
        serve_sreq_free(r);
        qoai_fail(e, 503, "server_error", NULL, c->closed ? "the client went away" : "the server is shutting down");
        return NULL;
    }
    if (S.live >= S.o.max_requests) {
        pthread_mutex_unlock(&S.mu);
        serve_sreq_free(r);
        qoai_fail(e, 429, "rate_limit_error", NULL, "the server is at its limit of %d requests in flight; retry later",
                  S.o.max_requests);
        return NULL;
    }
    if (r->req.request_id) /* vLLM: the id is the client's request_id after the kind's prefix */
        snprintf(r->rid, sizeof r->rid, "%s-%s", kind == QOAI_CHAT ? "chatcmpl" : "cmpl", r->req.request_id);
    else
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
    r->conn = c;
    c->refs++;
    if (r->ws)
        out_frame(r, json_pack("{s:s, s:s, s:s, s:s*}", "type", "start", "id", r->cid, "model", S.name, "session",
                               r->session[0] ? r->session : NULL));
    r->wsi = c->wsi;
    r->next = S.reqs;
    S.reqs = r;
    S.live++;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
    return r;
}

/* Every connection is a raw socket read by serve_http.c (HTTP/1.1, and
 * WebSocket after an upgrade). */
static const struct lws_protocols protocols[] = {
    { "quire", serve_conn_callback, sizeof(pss), 0, 0, NULL, 0 },
    { NULL, NULL, 0, 0, 0, NULL, 0 },
};

/* Splits list (a JSON array of strings, or names separated by commas) into
 * out (at most max, NULL-terminated), the strings copied into buf: the
 * count, or -1 when it does not fit or is malformed. */
static int split_list(const char *list, const char **out, int max, char *buf, size_t cap)
{
    json_t *a = list[0] == '[' ? json_loads(list, 0, NULL) : NULL;
    if (list[0] == '[' && !json_is_array(a)) {
        json_decref(a);
        return -1;
    }
    int n = 0;
    size_t used = 0;
    const char *at = list;
    for (size_t i = 0; n >= 0; i++) {
        const char *s;
        size_t l;
        if (a) {
            if (i == json_array_size(a)) break;
            s = json_string_value(json_array_get(a, i));
            l = s ? strlen(s) : 0;
        } else {
            if (!at) break;
            const char *comma = strchr(at, ',');
            s = at, l = comma ? (size_t)(comma - at) : strlen(at);
            at = comma ? comma + 1 : NULL;
            while (l && *s == ' ') s++, l--;
            while (l && s[l - 1] == ' ') l--;
        }
        if (!s || !l || n == max || used + l + 1 > cap) {
            n = -1;
            break;
        }
        memcpy(buf + used, s, l);
        buf[used + l] = 0;
        out[n++] = buf + used;
        used += l + 1;
    }
    json_decref(a);
    if (n >= 0) out[n] = NULL;
    return n;
}

/* The ids a request may name: --served-model-name's (the first is the id in
 * replies), else the file's name and the -m path as given (vLLM's id). */
static int serve_names(const serve_opts *o)
{
    if (o->name) {
        if (split_list(o->name, S.models, 8, S.names_buf, sizeof S.names_buf) < 1) {
            fprintf(stderr, "quire serve: --served-model-name: 1 to 8 names, separated by commas\n");
            return 1;
        }
    } else {
        const char *b = strrchr(o->model, '/');
        while (b && !b[1] && b > o->model) { /* a folder given with a trailing slash */
            const char *c = b - 1;
            while (c > o->model && *c != '/') c--;
            b = *c == '/' ? c : NULL;
        }
        /* The file's name, the same without its extension, and the path. */
        const char *base = b ? b + 1 : o->model;
        size_t bl = strcspn(base, "/");
        if (bl > 200) bl = 200;
        const char *dot = memrchr(base, '.', bl);
        const int n = snprintf(S.names_buf, sizeof S.names_buf, "%.*s%c%.*s", (int)bl, base, 0,
                               (int)(dot && dot > base ? (size_t)(dot - base) : bl), base);
        int k = 0;
        S.models[k++] = S.names_buf;
        if (n > 0 && strcmp(S.names_buf, S.names_buf + bl + 1)) S.models[k++] = S.names_buf + bl + 1;
        if (strcmp(o->model, S.names_buf)) S.models[k++] = o->model;
        S.models[k] = NULL;
    }
    S.name = S.models[0];
    return 0;
}

static int serve_origins(const serve_opts *o)
{
    if (!o->allow_origin) return 0;
    if (split_list(o->allow_origin, S.origins, 16, S.origins_buf, sizeof S.origins_buf) < 1) {
        fprintf(stderr, "quire serve: --allowed-origins: 1 to 16 origins (scheme://host:port or *), as a JSON list "
                        "or separated by commas\n");
        return 1;
    }
    return 0;
}

/* --chat-template FILE: read and compiled once, so that a bad one stops the start. */
static int serve_template(const serve_opts *o)
{
    if (!o->chat_template_path) return 0;
    char err[512];
    size_t len = 0;
    qchat_tmpl *t = NULL;
    if (q_read_file(o->chat_template_path, QCHAT_MAX_SOURCE, &S.chat_template, &len, err, sizeof err) ||
        qchat_compile(S.chat_template, len, &t, err, sizeof err)) {
        fprintf(stderr, "quire serve: --chat-template %s: %s\n", o->chat_template_path, err);
        return 1;
    }
    qchat_free(t);
    return 0;
}

/* Whether --host:--port can be bound, before lws tries (it would go on
 * without a listening socket): 0, or 1 after saying why. */
static int serve_can_bind(const serve_opts *o)
{
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    const int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai) {
        fprintf(stderr, "quire serve: --host %s: %s\n", o->host, gai_strerror(gai));
        return 1;
    }
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol), one = 1;
    int rc = fd < 0 ? -1 : setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (!rc) rc = bind(fd, ai->ai_addr, ai->ai_addrlen);
    const int err = errno;
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    if (rc) {
        fprintf(stderr, "quire serve: cannot listen on %s:%d: %s\n", o->host, o->port,
                err == EADDRINUSE ? "address already in use" : strerror(err));
        return 1;
    }
    return 0;
}

/* --api-key and the keys of --api-key-file (every non-empty line).  0, or
 * 2 after a message. */
static int load_keys(serve_opts *o)
{
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
    return 0;
}

/* The server's own flags' ranges.  0, or 2 after a message. */
static int check_serve_opts(const serve_opts *o)
{
    if (o->disk_load && strcmp(o->disk_load, "auto") && strcmp(o->disk_load, "always")) {
        fprintf(stderr, "quire serve: --cache-disk-load must be auto or always\n");
        return 2;
    }
    if (o->cache_disk_max < 0) {
        fprintf(stderr, "quire serve: --cache-disk-max must be at least 0\n");
        return 2;
    }
    if (o->port < 0 || o->port > 65535 || o->max_tokens < 1 || o->max_body_kb < 1 || o->max_requests < 1 ||
        o->max_body_kb > (1 << 20) || o->max_header_kb < 1 || o->max_header_kb > 1024 || o->max_connections < 1 ||
        o->max_pending_mb < 1 || o->max_pending_mb > 4096 || o->prep_threads < 1 || o->prep_threads > 16) {
        fprintf(stderr, "quire serve: --port, --max-tokens, --max-body (at most 1048576), --max-header (at most 1024), "
                        "--max-connections, --max-pending (at most 4096), --prep-threads (at most 16) and "
                        "--max-requests must be positive\n");
        return 2;
    }
    if (o->max_model_len < 0 || o->cache_disk_max < 0 || o->grace < 0) {
        fprintf(stderr, "quire serve: sizes and counts cannot be negative (--max-model-len, --cache-disk-max, "
                        "--shutdown-grace)\n");
        return 2;
    }
    if (!(o->idle_timeout > 0) || !(o->request_timeout > 0) || !(o->grammar_timeout > 0) || o->idle_timeout > 86400 ||
        o->request_timeout > 86400 || o->grammar_timeout > 86400) {
        fprintf(stderr, "quire serve: --idle-timeout, --request-timeout and --grammar-timeout are seconds, more than 0 "
                        "(at most 86400)\n");
        return 2;
    }
    if (o->schema_mode && strcmp(o->schema_mode, "strict") && strcmp(o->schema_mode, "full")) {
        fprintf(stderr, "quire serve: --json-schema-mode must be strict or full\n");
        return 2;
    }
    if (o->tool_parser && strcmp(o->tool_parser, "auto") && gram_tools_form_named(o->tool_parser) < 0) {
        fprintf(stderr, "quire serve: --tool-call-parser must be auto, hermes, llama3_json or mistral\n");
        return 2;
    }
    return 0;
}

/* The web folder: --web, else web/ beside the build folder or here.  0, or
 * 2 after a message. */
static int find_web(const serve_opts *o)
{
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
    return 0;
}

/* The lws loop until a signal; then new requests get 503, running ones
 * have --shutdown-grace seconds to finish before they are cancelled, and
 * the loop goes on until every connection has had its final event (at most
 * 5 s more). */
static void service(const serve_opts *o)
{
    double deadline = 0;
    int cancelled = 0;
    while (lws_service(S.ctx, 0) >= 0) {
        if (!S.stop) continue;
        /* lws waits in poll until its next timer: a tick every 50 ms
         * keeps this loop checking its deadlines while it drains. */
        lws_sul_schedule(S.ctx, 0, &S.stop_tick, stop_tick_cb, 50 * LWS_US_PER_MS);
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
}

/* Frees what the server made, whether it ran or not. */
static void serve_cleanup(void)
{
    serve_prep_stop();
    sess_drop_all();
    if (S.ctx) lws_context_destroy(S.ctx);
    while (S.reqs) {
        sreq *r = S.reqs;
        S.reqs = r->next;
        serve_sreq_free(r);
    }
    qengine_destroy(S.eng);
    gram_vocab_free(S.gvocab);
    gram_vocab_free(S.gvocab_tools);
    gram_cache_free(S.gcache);
    qoai_failcache_free(S.gfail);
    qstore_stop(S.store);
    qmetrics_free(S.metrics);
    free(S.web_root);
    free(S.chat_template);
    qtok_free(S.tok);
    qmodel_destroy(S.model);
    qmodel_destroy(S.draft);
}

int cmd_serve(int argc, char **argv)
{
    serve_opts *o = &S.o;
    memset(o, 0, sizeof *o);
    o->port = 8080, o->max_tokens = 4096, o->max_body_kb = 1024, o->max_requests = 256;
    qeflags_init(&o->ef);
    o->grace = 5;
    o->max_header_kb = 16, o->max_connections = 1024, o->idle_timeout = 10, o->request_timeout = 30;
    o->max_pending_mb = 8, o->prep_threads = 2, o->grammar_timeout = 10;
    o->host = "127.0.0.1";
    const qopt_set sets[] = { { serve_table, N_SERVE_OPTS, 0 }, QEFLAGS_SET(serve_opts, ef) };
    if (qopt_parse_sets("serve", sets, 2, argc, argv, o)) return 2;
    if (o->help) {
        printf("usage: quire serve -m MODEL [options]\n\nServes the model over HTTP: the OpenAI-compatible API\n"
               "(/v1/chat/completions, /v1/completions, /v1/models), /health and /metrics.\n\noptions:\n");
        qopt_usage_sets(stdout, sets, 2);
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
    if (load_keys(o)) return 2;
    if (check_serve_opts(o)) return 2;
    qengine_opts eo;
    char ferr[256];
    if (qeflags_apply(&o->ef, &eo, ferr, sizeof ferr)) {
        fprintf(stderr, "quire serve: %s\n", ferr);
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
    S.lim.grammar_seconds = o->grammar_timeout;
    S.lim.models = S.models;
    S.lim.schema_flags = o->schema_mode && !strcmp(o->schema_mode, "full") ? GRAM_SCHEMA_FULL : 0;
    if (serve_names(o) || serve_origins(o) || serve_template(o)) return 2;
    if (serve_can_bind(o)) return 1;
    if (find_web(o)) return 2;
    S.lim.chat_template = S.chat_template;
    S.lim_ws = S.lim;
    static const char *const ws_fields[] = { "type", "id", "token_ids", "session", "new_session", "keep_messages", "title", NULL };
    S.lim_ws.envelope = ws_fields;
    S.metrics = qmetrics_new();
    S.gcache = gram_cache_new(64);
    S.gfail = qoai_failcache_new(64);
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);

    lws_set_log_level(LLL_ERR, NULL);
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.port = o->port;
    info.iface = o->host;
    info.protocols = protocols;
    /* Raw sockets: serve_http.c reads HTTP/1.1 and WebSocket itself, with
     * the limits above (lws's own HTTP server cannot take pipelined
     * requests, nor say 413 before a body arrives). */
    info.options = LWS_SERVER_OPTION_DISABLE_IPV6 | LWS_SERVER_OPTION_ADOPT_APPLY_LISTEN_ACCEPT_CONFIG;
    info.listen_accept_role = "raw-skt";
    info.listen_accept_protocol = "quire";
    info.fd_limit_per_thread = (unsigned)o->max_connections + 64;
    S.load_t0 = q_now();
    S.load_bytes = model_bytes(o->model);
    S.ctx = S.metrics ? lws_create_context(&info) : NULL;
    pthread_t th;
    int status = 0;
    if (!S.ctx || serve_prep_start(o->prep_threads) || pthread_create(&th, NULL, engine_main, NULL)) {
        fprintf(stderr, "quire serve: cannot listen on %s:%d\n", o->host, o->port);
        status = 1;
    } else {
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        signal(SIGPIPE, SIG_IGN);
        printf("quire serve: %s (%s), listening on http://%s:%d (loading the model)\n", S.name, o->model, o->host,
               o->port);
        fflush(stdout);
        QLOGI("serve: loading %s (%.2f GB)", o->model, S.load_bytes / 1e9);
        lws_sul_schedule(S.ctx, 0, &S.load_tick, load_tick_cb, 5 * LWS_US_PER_SEC);
        service(o);
        /* Stop: cancel what runs, let the engine finish it, then leave. */
        pthread_mutex_lock(&S.mu);
        for (sreq *r = S.reqs; r; r = r->next)
            if (!r->finished) qengine_cancel(S.eng, r->id);
        S.engine_stop = 1;
        pthread_cond_signal(&S.cv);
        pthread_mutex_unlock(&S.mu);
        pthread_join(th, NULL);
        serve_prep_stop();
        /* The store finishes what is queued (replies, blocks) before the
         * process goes. */
        qstore_stop(S.store);
        S.store = NULL;
    }
    serve_cleanup();
    if (S.load_failed) status = 1;
    fprintf(stderr, "quire serve: stopped\n");
    return status;
}
