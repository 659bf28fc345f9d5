/* serve_engine.c - the server's bridge to the engine (serve.h): the engine
 * thread, which loads the model, steps the engine whenever a request is
 * live and moves its events into the requests' output under the server's
 * mutex, then wakes the lws thread (lws_cancel_service) to write them; and
 * serve_submit, which hands a prepared request to it.  A closed connection
 * cancels its requests at the next engine step. */
#define _GNU_SOURCE
#include <libwebsockets.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "backend.h"
#include "buf.h"
#include "chat.h"
#include "engine.h"
#include "gram.h"
#include "metrics.h"
#include "model.h"
#include "oai.h"
#include "qerr.h"
#include "schema.h"
#include "serve.h"
#include "tokenizer.h"
#include "util.h"

/* ---- output built under srv->mu --------------------------------------------------- */

/* A connection's output past --max-pending (srv->mu held): every request of
 * it is cancelled and failed, so that the lws thread closes the socket. */
static void over_budget(sconn *c)
{
    serve_state *srv = c->srv;
    int n = 0;
    c->over = 1;
    for (sreq *q = srv->reqs; q; q = q->next)
        if (q->conn == c) {
            if (!q->finished) qengine_cancel(srv->eng, q->id);
            q->failed = 1;
            n++;
        }
    QLOGW("serve: a client fell %zu bytes behind (--max-pending %d MiB); its %d requests are cancelled and its "
          "connection closed",
          c->pending, srv->o.max_pending_mb, n);
    qmetrics_conn_closed(srv->metrics, QCONN_SLOW_READER);
    if (c->wsi) lws_cancel_service(srv->ctx);
}

static void out_put(sreq *r, const char *s, size_t n)
{
    serve_state *srv = r->srv;
    if (r->failed) return;
    sconn *c = r->conn;
    if (c && c->pending + n > ((size_t)srv->o.max_pending_mb << 20)) {
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
        free(r->ch[i].rtext);
        qoai_reason_free(r->ch[i].reason);
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
    serve_state *srv = r->srv;
    for (sreq **pp = &srv->reqs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            return;
        }
}

/* echo: the prompt's text (completions) or the last message's (chat)
 * before choice index's first output (srv->mu held). */
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

/* The last choice of r finished: the usage, the WebSocket's "done" or the
 * stream's end, or the whole reply (srv->mu held). */
static void reply_done(serve_state *srv, sreq *r, const qevent *ev, double now)
{
    r->finished = !r->session[0]; /* a session's request once its reply is stored */
    srv->live--;
    qmetrics_tokens(srv->metrics, r->prompt_tokens, r->completion_tokens);
    qmetrics_latency(srv->metrics, now - r->t0);
    const int spec_on = srv->eo.spec_mode != QSPEC_NONE;
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
                                       r->ch[i].calls ? qoai_calls_message(r->ch[i].calls) : NULL,
                                       r->ch[i].reason ? (r->ch[i].rtext ? r->ch[i].rtext : "") : NULL, r->ch[i].rlen };
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

/* An engine event into its request's output (srv->mu held). */
static void dispatch(serve_state *srv, qevent *ev)
{
    sreq *r = srv->reqs;
    while (r && r->id != ev->id) r = r->next;
    if (!r || ev->index < 0 || ev->index >= r->n) return;
    acc *c = &r->ch[ev->index];
    if (!c->echoed) out_echo(r, c, ev->index);
    const double now = q_now();
    if (ev->finish == QFINISH_NONE) {
        if (r->t_last == 0) qmetrics_ttft(srv->metrics, now - r->t0);
        else if (ev->index == 0) qmetrics_itl(srv->metrics, now - r->t_last);
        if (ev->index == 0) r->t_last = now;
    }
    json_t *lp = NULL;
    if (ev->finish == QFINISH_NONE && r->req.logprobs)
        qoai_logprobs_add(r->req.stream || r->ws ? &lp : &c->lp, r->req.kind, srv->tok, ev, c->len);
    /* A reasoning model's output: its reasoning apart, the content on. */
    const char *txt = ev->text ? ev->text : "", *rs = "";
    size_t tlen = ev->text_len, rn = 0;
    if (r->req.reasoning && !c->reason && !(c->reason = qoai_reason_new(r->req.reasoning, r->req.in_think)))
        r->failed = 1;
    if (c->reason) {
        if (qoai_reason_feed(c->reason, txt, tlen, ev->finish != QFINISH_NONE)) r->failed = 1;
        rs = qoai_reason_part(c->reason, 0, &rn);
        txt = qoai_reason_part(c->reason, 1, &tlen);
    }
    /* Tools: the output read back as content and calls, as it comes when
     * streamed, whole at the end otherwise. */
    json_t *d = NULL;
    if (r->req.tool_mode && !c->calls) {
        char prefix[112];
        snprintf(prefix, sizeof prefix, "call_%.40s_%d_", strchr(r->rid, '-') ? strchr(r->rid, '-') + 1 : r->rid,
                 ev->index);
        if (!(c->calls = qoai_calls_new(r->req.tool_mode, srv->lim.tool_form, r->req.tool_name, prefix))) r->failed = 1;
    }
    if (c->calls && (r->req.stream || r->ws)) d = qoai_calls_feed(c->calls, txt, tlen, ev->finish != QFINISH_NONE);
    if (rn && r->req.stream && !r->ws) { /* streamed chat: the reasoning in the delta */
        if (!d) d = json_object();
        if (d) {
            json_object_set_new(d, "reasoning_content", json_stringn(rs, rn));
            json_object_set_new(d, "reasoning", json_stringn(rs, rn));
        }
    }
    if (r->ws) {
        json_t *dc = d ? json_object_get(d, "content") : NULL, *dt = d ? json_object_get(d, "tool_calls") : NULL;
        const char *wt = c->calls ? (dc ? json_string_value(dc) : "") : txt;
        const size_t wl = c->calls ? (dc ? json_string_length(dc) : 0) : tlen;
        if (wl || rn || dt || lp || (r->want_ids && ev->finish == QFINISH_NONE)) {
            json_t *f = json_pack("{s:s, s:s, s:i, s:s%}", "type", "delta", "id", r->cid, "index", ev->index, "text",
                                  wt, wl);
            if (f && rn) json_object_set_new(f, "reasoning", json_stringn(rs, rn));
            if (f && r->want_ids && ev->finish == QFINISH_NONE) json_object_set_new(f, "token", json_integer(ev->token));
            if (f && dt) json_object_set(f, "tool_calls", dt);
            if (f && lp) json_object_set_new(f, "logprobs", lp);
            else json_decref(lp);
            out_frame(r, f);
        } else {
            json_decref(lp);
        }
    } else if (r->req.stream && (c->calls || rn)) {
        const int first = !c->started && ev->finish == QFINISH_NONE;
        if (!c->calls && tlen && d) json_object_set_new(d, "content", json_stringn(txt, tlen));
        if (d || lp || first) {
            if (!d) d = json_object();
            if (d && !c->started) json_object_set_new(d, "role", json_string("assistant"));
            out_event(r, qoai_chunk_delta(&r->rep, ev->index, d, lp, NULL));
            d = NULL;
            c->started = 1;
        }
    } else if (r->req.stream) {
        if (tlen || lp || (r->req.kind == QOAI_CHAT && !c->started && ev->finish == QFINISH_NONE)) {
            out_event(r, qoai_chunk(&r->rep, ev->index, txt, tlen, lp, NULL, r->req.kind == QOAI_CHAT && !c->started));
            c->started = 1;
        }
    } else {
        if (tlen && q_append(&c->text, &c->len, &c->cap, txt, tlen)) r->failed = 1;
        if (rn && q_append(&c->rtext, &c->rlen, &c->rcap, rs, rn)) r->failed = 1;
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
    reply_done(srv, r, ev, now);
}

/* 1 once the engine runs; else a 503 for the connection ("loading"). */
int serve_ready(serve_state *srv)
{
    pthread_mutex_lock(&srv->mu);
    const int r = srv->ready;
    pthread_mutex_unlock(&srv->mu);
    return r;
}

/* The backend stopped for good (qengine_broken). */
int serve_broken(serve_state *srv)
{
    pthread_mutex_lock(&srv->mu);
    const int b = srv->broken;
    pthread_mutex_unlock(&srv->mu);
    return b;
}

/* --max-model-len against the model (before the engine exists): 0, or 1
 * after saying why. */
static int apply_max_model_len(serve_state *srv, qmodel *m)
{
    if (!srv->o.max_model_len) return 0;
    if (srv->o.max_model_len > m->hp.max_ctx) {
        fprintf(stderr,
                "quire serve: --max-model-len %d is more than the model's context (%d tokens); give at most %d\n",
                srv->o.max_model_len, m->hp.max_ctx, m->hp.max_ctx);
        return 1;
    }
    m->hp.max_ctx = srv->o.max_model_len;
    return 0;
}

/* The KV pool against the context the server advertises: a context the
 * pool cannot hold for one request is refused when --max-model-len asked
 * for it (as vLLM does), else lowered to what fits, said in the log.  0,
 * or 1 after saying why. */
static int fit_context(serve_state *srv, qmodel *m, qengine *e)
{
    qengine_stats st;
    qengine_stats_get(e, &st);
    const long cap = (long)st.kv_blocks * (srv->eo.block_size > 0 ? srv->eo.block_size : 16);
    if (cap >= m->hp.max_ctx) return 0;
    if (srv->o.max_model_len) {
        fprintf(stderr,
                "quire serve: --max-model-len %d does not fit in the KV cache, which holds %ld tokens; give more "
                "--kv-mem (or --gpu-memory-utilization), or a smaller --max-model-len\n",
                srv->o.max_model_len, cap);
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
static int load(serve_state *srv)
{
    char err[512];
    qmodel *m = NULL;
    qtok *tok = NULL;
    qengine *e = NULL;
    qmodel *dm = NULL;
    gram_vocab *gv = NULL;
    const double t0 = q_now();
    int rc = qmodel_load(srv->o.model, &m, err, sizeof err) || qtok_for_model(m, &tok, err, sizeof err);
    if (!rc && srv->o.ef.draft && qmodel_load(srv->o.ef.draft, &dm, err + 17, sizeof err - 17)) {
        memcpy(err, "the draft model: ", 17); /* before its own message */
        rc = 1;
    }
    srv->eo.draft = dm;
    if (!rc && apply_max_model_len(srv, m)) rc = 2;
    if (rc == 1 || (!rc && qengine_create(m, tok, &srv->eo, &e, err, sizeof err)) ||
        (!rc && qengine_grammar_vocab(tok, &gv) && snprintf(err, sizeof err, "out of memory for the grammar vocabulary")))
        rc = 1;
    if (!rc && fit_context(srv, m, e)) rc = 2;
    if (rc) {
        if (rc == 1) fprintf(stderr, "quire serve: %s\n", err);
        gram_vocab_free(gv);
        qengine_destroy(e);
        qtok_free(tok);
        qmodel_destroy(m);
        qmodel_destroy(dm);
        srv->eo.draft = NULL;
        return 1;
    }
    /* Tool calls in the form --tool-call-parser names, else the template's;
     * where its markers are special tokens, a vocabulary that allows them. */
    const int named_form = gram_tools_form_named(srv->o.tool_parser);
    const char *tmpl = srv->chat_template ? srv->chat_template : m->chat_template;
    const gram_tools_form form = named_form >= 0 ? (gram_tools_form)named_form : qoai_tool_form_of(tmpl);
    const char *const *markers = gram_tools_form_get(form)->tokens;
    gram_vocab *gvt = NULL;
    int n_markers = 0;
    for (int k = 0; markers[k] && !n_markers; k++) {
        const int id = qtok_token_to_id(tok, markers[k], strlen(markers[k]));
        n_markers = id >= 0 && qtok_is_special(tok, id);
    }
    if (n_markers && qengine_grammar_vocab_with(tok, markers, &n_markers, &gvt)) n_markers = 0;
    pthread_mutex_lock(&srv->mu);
    srv->gvocab_tools = gvt;
    srv->lim.gvocab_tools = srv->lim_ws.gvocab_tools = gvt;
    srv->lim.tool_form = srv->lim_ws.tool_form = form;
    /* Reasoning split as --reasoning-parser names, else as the template shows. */
    const int auto_reason = !srv->o.reasoning_parser || !strcmp(srv->o.reasoning_parser, "auto");
    const qoai_reason_kind reason = auto_reason ? qoai_reason_of(tmpl) : qoai_reason_named(srv->o.reasoning_parser);
    srv->lim.reasoning = srv->lim_ws.reasoning = reason;
    srv->model = m, srv->draft = dm, srv->tok = tok, srv->eng = e, srv->ready = 1;
    srv->gvocab = gv;
    srv->lim.gvocab = gv;
    srv->lim.gcache = srv->gcache;
    srv->lim.gfail = srv->gfail;
    srv->lim_ws.gvocab = gv;
    srv->lim_ws.gcache = srv->gcache;
    srv->lim_ws.gfail = srv->gfail;
    pthread_mutex_unlock(&srv->mu);
    qengine_stats st;
    qengine_stats_get(e, &st);
    const qhparams *hp = &m->hp;
    QLOGI("serve: model %s: %s, %.1fM parameters, %d layers, %s weights; context %d tokens; KV cache %ld tokens "
          "(%d blocks); loaded in %.1f s",
          m->name ? m->name : srv->name, qfamily_get(hp->family)->name, (double)qmodel_param_count(m) / 1e6,
          hp->n_layers, qdt_name(m->w.tok_embd.dtype), hp->max_ctx,
          (long)st.kv_blocks * (srv->eo.block_size > 0 ? srv->eo.block_size : 16), st.kv_blocks, q_now() - t0);
    if (srv->eo.tensor_parallel > 1)
        fprintf(stderr, "quire serve: %s ready on %s, split among %d (tensor parallel)\n", srv->name,
                qengine_backend_name(e), srv->eo.tensor_parallel);
    else fprintf(stderr, "quire serve: %s ready on %s\n", srv->name, qengine_backend_name(e));
    QLOGI("serve: tool calls in the %s form (%s)%s", gram_tools_form_get(form)->parser,
          named_form >= 0 ? "--tool-call-parser" : "the chat template's",
          n_markers ? ", its markers as the model's special tokens" : "");
    if (reason != QOAI_REASON_NONE)
        QLOGI("serve: chat replies split into reasoning_content and content (%s, %s)",
              reason == QOAI_REASON_QWEN3 ? "qwen3" : "deepseek_r1",
              auto_reason ? "the chat template writes </think>" : "--reasoning-parser");
    return 0;
}

void *serve_engine_main(void *arg)
{
    serve_state *srv = arg;
    if (load(srv)) {
        pthread_mutex_lock(&srv->mu);
        srv->load_failed = 1;
        pthread_mutex_unlock(&srv->mu);
        srv->stop = 1;
        lws_cancel_service(srv->ctx);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&srv->mu);
        while (!srv->engine_stop && srv->live == 0) pthread_cond_wait(&srv->cv, &srv->mu);
        const int quit = srv->engine_stop && srv->live == 0;
        pthread_mutex_unlock(&srv->mu);
        if (quit) break;
        const int rc = qengine_step(srv->eng);
        if (rc < 0) QLOGE("serve: engine step failed: %s", qerr_str(rc));
        const int down = rc < 0 && qengine_broken(srv->eng);
        qevent ev;
        int any = 0;
        pthread_mutex_lock(&srv->mu);
        while (qengine_poll(srv->eng, &ev) == 1) {
            dispatch(srv, &ev);
            qevent_free(&ev);
            any = 1;
        }
        /* Finished requests whose connection is gone. */
        for (sreq **pp = &srv->reqs; *pp;) {
            sreq *r = *pp;
            if (r->finished && !r->wsi) {
                *pp = r->next;
                serve_sreq_free(r);
            } else {
                pp = &r->next;
            }
        }
        qengine_stats_get(srv->eng, &srv->stats);
        srv->have_stats = 1;
        if (down && !srv->broken) {
            srv->broken = 1;
            QLOGE("serve: the backend can run no more passes (a GPU of the tensor-parallel group failed); /health "
                  "says so and new requests are refused: restart the server");
        }
        pthread_mutex_unlock(&srv->mu);
        if (any) lws_cancel_service(srv->ctx);
    }
    return NULL;
}

/* ---- HTTP ------------------------------------------------------------------------ *//* Parses body as a request of kind and gives it to the engine for wsi
 * (ws: a WebSocket request with client id cid): the new request, or NULL
 * with *e filled.  first, when not NULL, is the request's first frame. */
sreq *serve_submit(sconn *c, const char *body, size_t len, qoai_kind kind, const char *cid, int want_ids,
                   const char *session, qoai_error *e)
{
    serve_state *srv = c->srv;
    if (!serve_ready(srv)) return qoai_fail(e, 503, "server_error", NULL, "the model is loading; retry shortly"), NULL;
    if (serve_broken(srv))
        return qoai_fail(e, 503, "server_error", NULL,
                         "the backend can run no more passes (a GPU failed); restart the server"),
               NULL;
    sreq *r = calloc(1, sizeof *r);
    if (!r) return qoai_fail(e, 500, "server_error", NULL, "out of memory"), NULL;
    r->srv = srv;
    if (qoai_parse(body, len, kind, cid ? &srv->lim_ws : &srv->lim, srv->model, srv->tok, &r->req, e)) {
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
    pthread_mutex_lock(&srv->mu);
    if (srv->draining || c->closed) {
        pthread_mutex_unlock(&srv->mu);
        serve_sreq_free(r);
        qoai_fail(e, 503, "server_error", NULL, c->closed ? "the client went away" : "the server is shutting down");
        return NULL;
    }
    if (srv->live >= srv->o.max_requests) {
        pthread_mutex_unlock(&srv->mu);
        serve_sreq_free(r);
        qoai_fail(e, 429, "rate_limit_error", NULL, "the server is at its limit of %d requests in flight; retry later",
                  srv->o.max_requests);
        return NULL;
    }
    if (r->req.request_id) /* vLLM: the id is the client's request_id after the kind's prefix */
        snprintf(r->rid, sizeof r->rid, "%s-%s", kind == QOAI_CHAT ? "chatcmpl" : "cmpl", r->req.request_id);
    else
        snprintf(r->rid, sizeof r->rid, "%s-%llx%llu", kind == QOAI_CHAT ? "chatcmpl" : "cmpl",
                 (unsigned long long)time(NULL), ++srv->seq);
    r->rep = (qoai_reply){ kind, r->rid, (long long)time(NULL), srv->name };
    r->t0 = q_now();
    char err[256];
    if (qengine_submit(srv->eng, &r->req.p, &r->id, err, sizeof err)) {
        pthread_mutex_unlock(&srv->mu);
        serve_sreq_free(r);
        qoai_fail(e, 400, "invalid_request_error", NULL, "%s", err);
        return NULL;
    }
    r->conn = c;
    c->refs++;
    if (r->ws)
        out_frame(r, json_pack("{s:s, s:s, s:s, s:s*}", "type", "start", "id", r->cid, "model", srv->name, "session",
                               r->session[0] ? r->session : NULL));
    r->wsi = c->wsi;
    r->next = srv->reqs;
    srv->reqs = r;
    srv->live++;
    pthread_cond_signal(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    return r;
}
