/* oai_reply.c - OpenAI's reply objects: completions and chat completions,
 * whole or as stream chunks, usage and logprobs (oai.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "oai.h"
#include "qerr.h"
#include "tokenizer.h"

const char *qoai_finish_reason(qfinish f)
{
    return f == QFINISH_STOP ? "stop" : f == QFINISH_LENGTH ? "length" : "abort";
}

json_t *qoai_usage(int prompt_tokens, int completion_tokens, int cached_tokens, int disk_cached, const int *spec)
{
    json_t *u = json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", prompt_tokens, "completion_tokens",
                          completion_tokens, "total_tokens", prompt_tokens + completion_tokens, "prompt_tokens_details",
                          "cached_tokens", cached_tokens);
    if (u && disk_cached > 0)
        json_object_set_new(json_object_get(u, "prompt_tokens_details"), "disk_cached_tokens",
                            json_integer(disk_cached));
    /* Speculative decoding: drafted tokens, those kept, the passes that
     * verified them; the acceptance rate and the tokens a pass gave. */
    if (u && spec)
        json_object_set_new(u, "speculative",
                            json_pack("{s:i, s:i, s:i, s:f, s:f}", "drafted_tokens", spec[0], "accepted_tokens", spec[1],
                                      "passes", spec[2], "acceptance_rate", spec[0] ? (double)spec[1] / spec[0] : 0.0,
                                      "mean_accepted_length",
                                      spec[2] ? (double)(spec[1] + spec[2]) / spec[2] : 0.0));
    return u;
}

/* JSON has no -inf: a token of probability 0 reads -9999, as OpenAI's. */
static double lp(float x) { return isfinite(x) ? (double)x : -9999.0; }

/* A token whose text comes out whole, to decode others after: a token's
 * text is what it adds after another one (SentencePiece drops the leading
 * space of a sequence's first piece only).  -1 when there is none. */
static int32_t anchor_id(const qtok *tok)
{
    int32_t *ids = NULL, a = -1;
    int n = 0;
    if (!qtok_encode(tok, "a", 1, 0, &ids, &n) && n >= 1) a = ids[n - 1];
    free(ids);
    return a;
}

/* id's text after the anchor (malloc'd in *s, *n bytes). */
static int piece(const qtok *tok, int32_t anchor, int32_t id, char **s, size_t *n)
{
    if (anchor < 0) return qtok_decode(tok, &id, 1, 0, s, n);
    qdetok *d = qdetok_new(tok, 0);
    const char *t1 = NULL, *t2 = NULL;
    size_t l1 = 0, l2 = 0;
    int rc = d ? qdetok_push(d, anchor, &t1, &l1) : QERR_NOMEM;
    char *out = NULL;
    if (!rc) rc = qdetok_push(d, id, &t1, &l1);
    if (!rc && (out = malloc(l1 + 1))) memcpy(out, t1, l1);
    if (!rc && out) rc = qdetok_flush(d, &t2, &l2);
    if (!rc && out) {
        char *o2 = realloc(out, l1 + l2 + 1);
        if (o2) memcpy(o2 + l1, t2, l2), out = o2;
        else rc = QERR_NOMEM;
    }
    qdetok_free(d);
    if (rc || !out) {
        free(out);
        return QERR_NOMEM;
    }
    out[l1 + l2] = 0;
    *s = out, *n = l1 + l2;
    return 0;
}

/* id's text (its decoded piece) as a JSON string, and its bytes. */
static int token_text(const qtok *tok, int32_t anchor, int32_t id, json_t **text, json_t **bytes)
{
    char *s = NULL;
    size_t n = 0;
    if (piece(tok, anchor, id, &s, &n)) return QERR_NOMEM;
    *text = json_stringn(s, n);
    if (bytes) *bytes = json_array();
    for (size_t i = 0; bytes && *bytes && i < n; i++) json_array_append_new(*bytes, json_integer((unsigned char)s[i]));
    free(s);
    if (!*text || (bytes && !*bytes)) {
        json_decref(*text);
        if (bytes) json_decref(*bytes);
        return QERR_NOMEM;
    }
    return 0;
}

static int chat_entry(const qtok *tok, int32_t anchor, int32_t id, float logprob, json_t **out)
{
    json_t *t, *b;
    if (token_text(tok, anchor, id, &t, &b)) return QERR_NOMEM;
    *out = json_pack("{s:o, s:f, s:o}", "token", t, "logprob", lp(logprob), "bytes", b);
    return *out ? 0 : QERR_NOMEM;
}

int qoai_logprobs_add(json_t **acc, qoai_kind kind, const qtok *tok, const qevent *ev, size_t text_offset)
{
    if (!*acc)
        *acc = kind == QOAI_CHAT ? json_pack("{s:[]}", "content")
                                 : json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                                             "text_offset");
    if (!*acc) return QERR_NOMEM;
    const int32_t anchor = anchor_id(tok);
    if (kind == QOAI_CHAT) {
        json_t *e = NULL, *top = json_array();
        int rc = top ? chat_entry(tok, anchor, ev->token, ev->logprob, &e) : QERR_NOMEM;
        for (int k = 0; !rc && k < ev->n_top; k++) {
            json_t *a;
            if (!(rc = chat_entry(tok, anchor, ev->top[k].id, ev->top[k].logprob, &a)))
                rc = json_array_append_new(top, a);
        }
        if (!rc) rc = json_object_set_new(e, "top_logprobs", top) ? QERR_NOMEM : 0;
        else json_decref(top);
        if (!rc) rc = json_array_append_new(json_object_get(*acc, "content"), e) ? QERR_NOMEM : 0;
        else json_decref(e);
        return rc ? QERR_NOMEM : 0;
    }
    json_t *t, *top = json_object();
    if (!top || token_text(tok, anchor, ev->token, &t, NULL)) {
        json_decref(top);
        return QERR_NOMEM;
    }
    int rc = json_array_append_new(json_object_get(*acc, "tokens"), t);
    rc |= json_array_append_new(json_object_get(*acc, "token_logprobs"), json_real(lp(ev->logprob)));
    for (int k = 0; k < ev->n_top; k++) {
        json_t *a;
        if (token_text(tok, anchor, ev->top[k].id, &a, NULL)) {
            rc = -1;
            break;
        }
        /* Alternatives whose texts coincide keep the likelier one, as a JSON
         * object must. */
        if (!json_object_get(top, json_string_value(a)))
            rc |= json_object_set_new(top, json_string_value(a), json_real(lp(ev->top[k].logprob)));
        json_decref(a);
    }
    rc |= json_array_append_new(json_object_get(*acc, "top_logprobs"), top);
    rc |= json_array_append_new(json_object_get(*acc, "text_offset"), json_integer((json_int_t)text_offset));
    return rc ? QERR_NOMEM : 0;
}

/* {"id", "object", "created", "model", "choices": [choice]} */
static json_t *envelope(const qoai_reply *c, const char *object, json_t *choices)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", c->id, "object", object, "created", (json_int_t)c->created,
                     "model", c->model, "choices", choices);
}

json_t *qoai_chunk_delta(const qoai_reply *c, int index, json_t *delta, json_t *logprobs, const char *finish)
{
    json_t *fr = finish ? json_string(finish) : json_null(), *lpj = logprobs ? logprobs : json_null();
    json_t *ch = json_pack("{s:i, s:o, s:o, s:o}", "index", index, "delta", delta ? delta : json_object(), "logprobs",
                           lpj, "finish_reason", fr);
    json_t *arr = ch ? json_pack("[o]", ch) : NULL;
    return arr ? envelope(c, "chat.completion.chunk", arr) : NULL;
}

json_t *qoai_chunk(const qoai_reply *c, int index, const char *text, size_t len, json_t *logprobs, const char *finish,
                   int first)
{
    if (c->kind == QOAI_CHAT) {
        json_t *delta = json_object();
        if (delta && first) json_object_set_new(delta, "role", json_string("assistant"));
        if (delta && (len || !finish)) json_object_set_new(delta, "content", json_stringn(text ? text : "", len));
        return qoai_chunk_delta(c, index, delta, logprobs, finish);
    }
    json_t *ch = json_pack("{s:i, s:s%, s:o, s:o}", "index", index, "text", text ? text : "", len, "logprobs",
                           logprobs ? logprobs : json_null(), "finish_reason", finish ? json_string(finish) : json_null());
    json_t *arr = ch ? json_pack("[o]", ch) : NULL;
    return arr ? envelope(c, "text_completion", arr) : NULL;
}

json_t *qoai_usage_chunk(const qoai_reply *c, json_t *usage)
{
    json_t *o = envelope(c, c->kind == QOAI_CHAT ? "chat.completion.chunk" : "text_completion", json_array());
    if (o && json_object_set_new(o, "usage", usage)) {
        json_decref(o);
        return NULL;
    }
    if (!o) json_decref(usage);
    return o;
}

json_t *qoai_response(const qoai_reply *c, qoai_choice *ch, int n, json_t *usage)
{
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        json_t *lpj = ch[i].logprobs ? ch[i].logprobs : json_null(), *o;
        ch[i].logprobs = NULL;
        json_t *msg = ch[i].message;
        ch[i].message = NULL;
        if (c->kind == QOAI_CHAT && ch[i].reasoning && !msg) /* a split reply: content null when there is none */
            msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                            ch[i].len ? json_stringn(ch[i].text, ch[i].len) : json_null());
        if (c->kind == QOAI_CHAT && ch[i].reasoning && msg) {
            json_t *rv = ch[i].rlen ? json_stringn(ch[i].reasoning, ch[i].rlen) : json_null();
            json_object_set(msg, "reasoning_content", rv);
            json_object_set_new(msg, "reasoning", rv);
        }
        if (c->kind == QOAI_CHAT && msg)
            o = json_pack("{s:i, s:o, s:o, s:s}", "index", i, "message", msg, "logprobs", lpj, "finish_reason",
                          ch[i].finish);
        else if (c->kind == QOAI_CHAT)
            o = json_pack("{s:i, s:{s:s, s:s%}, s:o, s:s}", "index", i, "message", "role", "assistant", "content",
                          ch[i].text ? ch[i].text : "", ch[i].len, "logprobs", lpj, "finish_reason", ch[i].finish);
        else
            o = json_pack("{s:i, s:s%, s:o, s:s}", "index", i, "text", ch[i].text ? ch[i].text : "", ch[i].len,
                          "logprobs", lpj, "finish_reason", ch[i].finish);
        if (!arr || !o || json_array_append_new(arr, o)) {
            json_decref(arr);
            json_decref(usage);
            for (int k = i + 1; k < n; k++) json_decref(ch[k].logprobs), json_decref(ch[k].message);
            return NULL;
        }
    }
    json_t *r = arr ? envelope(c, c->kind == QOAI_CHAT ? "chat.completion" : "text_completion", arr) : NULL;
    if (r && json_object_set_new(r, "usage", usage)) {
        json_decref(r);
        return NULL;
    }
    if (!r) json_decref(usage);
    return r;
}
