/* chat_model.c - a model's chat template applied to a conversation.
 *
 * The template is the model's own (GGUF tokenizer.chat_template, HF
 * tokenizer_config.json's chat_template or chat_template.jinja), else
 * QCHAT_DEFAULT_TEMPLATE (ChatML), as llama.cpp and vLLM fall back.  The
 * context gets bos_token and eos_token from the tokenizer when the caller did
 * not give them, as HF's apply_chat_template does from the tokenizer's
 * special tokens.
 *
 * qchat_apply_tokens also keeps message content from injecting control
 * tokens: before rendering, every special-token text (and every U+F8F0) in
 * a message's content is swapped for a marker U+F8F0 <index> U+F8F1; after
 * rendering the markers are swapped back and their byte ranges are handed to
 * the tokenizer as plain spans, where special tokens are not recognised.
 * Template transformations of content (trim, split, slicing) carry the
 * markers along with the text around them.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "model.h"
#include "qerr.h"
#include "tokenizer.h"

int qchat_for_model(const qmodel *m, qchat_tmpl **out, int *is_default, char *err, size_t errlen)
{
    const char *src = m && m->chat_template ? m->chat_template : QCHAT_DEFAULT_TEMPLATE;
    if (is_default) *is_default = !(m && m->chat_template);
    int rc = qchat_compile(src, strlen(src), out, err, errlen);
    if (rc && m && m->chat_template) {
        /* Name the source: the message alone would not say which template. */
        char inner[512];
        snprintf(inner, sizeof inner, "%s", err ? err : "");
        qerr_set(err, errlen, rc, "the model's chat template cannot be used: %s", inner);
    }
    return rc;
}

/* Sets key to token id's text unless the context already has it. */
static int fill_token(json_t *ctx, const char *key, const qtok *tok, int id)
{
    if (json_object_get(ctx, key) || !tok || id < 0) return 0;
    size_t n = 0;
    const char *s = qtok_id_to_token(tok, id, &n);
    if (!s) return 0;
    json_t *v = json_stringn(s, n);
    if (!v || json_object_set_new(ctx, key, v)) return QERR_NOMEM;
    return 0;
}

int qchat_apply(const qchat_tmpl *t, const qmodel *m, const qtok *tok, json_t *ctx, char **out, size_t *len,
                char *err, size_t errlen)
{
    *out = NULL;
    if (!json_is_object(ctx)) return qerr_set(err, errlen, QERR_INVAL, "the chat context must be a JSON object");
    int bos = m && m->bos_id >= 0 ? m->bos_id : tok ? qtok_bos_id(tok) : -1;
    int eos = m && m->n_eos ? m->eos_ids[0] : tok ? qtok_eos_id(tok) : -1;
    if (fill_token(ctx, "bos_token", tok, bos) || fill_token(ctx, "eos_token", tok, eos))
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    return qchat_render(t, ctx, out, len, err, errlen);
}

/* ---- content that cannot inject control tokens --------------------------- */

#define MARK_OPEN "\xef\xa3\xb0"  /* U+F8F0 */
#define MARK_CLOSE "\xef\xa3\xb1" /* U+F8F1 */

typedef struct {
    char **orig;
    size_t *len;
    size_t n, cap;
} stash;

static int stash_push(stash *st, const char *s, size_t n)
{
    if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 16;
        char **o = realloc(st->orig, cap * sizeof *o);
        if (!o) return QERR_NOMEM;
        st->orig = o;
        size_t *l = realloc(st->len, cap * sizeof *l);
        if (!l) return QERR_NOMEM;
        st->len = l;
        st->cap = cap;
    }
    char *c = malloc(n + 1);
    if (!c) return QERR_NOMEM;
    memcpy(c, s, n);
    c[n] = 0;
    st->orig[st->n] = c;
    st->len[st->n] = n;
    st->n++;
    return 0;
}

static void stash_free(stash *st)
{
    for (size_t i = 0; i < st->n; i++) free(st->orig[i]);
    free(st->orig);
    free(st->len);
}

/* The string v with its special-token texts and U+F8F0s swapped for markers. */
static json_t *defang(const qtok *tok, json_t *v, stash *st)
{
    const char *s = json_string_value(v);
    size_t n = json_string_length(v), pos = 0;
    char *out = malloc(n * 4 + 16), *o = out;
    size_t cap = n * 4 + 16;
    if (!out) return NULL;
    while (pos < n) {
        size_t ms = n, me = n, a, b;
        if (qtok_next_special(tok, s, n, pos, &a, &b)) ms = a, me = b;
        const char *pm = memmem(s + pos, n - pos, MARK_OPEN, 3);
        if (pm && (size_t)(pm - s) < ms) ms = (size_t)(pm - s), me = ms + 3;
        if (ms >= n) {
            memcpy(o, s + pos, n - pos);
            o += n - pos;
            break;
        }
        char mark[40];
        int ml = snprintf(mark, sizeof mark, MARK_OPEN "%zu" MARK_CLOSE, st->n);
        size_t used = (size_t)(o - out), need = used + (ms - pos) + (size_t)ml + (n - me) + 1;
        if (need > cap) {
            char *no = realloc(out, need * 2);
            if (!no) {
                free(out);
                return NULL;
            }
            out = no;
            o = out + used;
            cap = need * 2;
        }
        memcpy(o, s + pos, ms - pos);
        o += ms - pos;
        memcpy(o, mark, (size_t)ml);
        o += ml;
        if (stash_push(st, s + ms, me - ms)) {
            free(out);
            return NULL;
        }
        pos = me;
    }
    json_t *r = json_stringn(out, (size_t)(o - out));
    free(out);
    return r;
}

/* Swaps the content strings of every message (and of text parts). */
static int defang_messages(const qtok *tok, json_t *ctx, stash *st)
{
    json_t *msgs = json_object_get(ctx, "messages"), *m;
    size_t i;
    json_array_foreach(msgs, i, m) {
        json_t *c = json_object_get(m, "content");
        if (json_is_string(c)) {
            json_t *d = defang(tok, c, st);
            if (!d || json_object_set_new(m, "content", d)) return QERR_NOMEM;
        } else if (json_is_array(c)) {
            size_t k;
            json_t *part;
            json_array_foreach(c, k, part) {
                json_t *tx = json_object_get(part, "text");
                if (!json_is_string(tx)) continue;
                json_t *d = defang(tok, tx, st);
                if (!d || json_object_set_new(part, "text", d)) return QERR_NOMEM;
            }
        }
    }
    return 0;
}

/* The last occurrence of n bytes p in s[0, sl), or NULL. */
static const char *last_of(const char *s, size_t sl, const char *p, size_t n)
{
    const char *found = NULL;
    for (const char *at = s; n && (at = memmem(at, sl - (size_t)(at - s), p, n)); at++) found = at;
    return found;
}

/* HF's continue_final_message: the rendered chat r (*rlen bytes) cut right
 * after the last occurrence of the final message's content (its last text
 * part; failing that, the content without surrounding whitespace). */
static int cut_after_final(json_t *ctx, const char *r, size_t *rlen, char *err, size_t errlen)
{
    json_t *msgs = json_object_get(ctx, "messages");
    json_t *c = json_object_get(json_array_get(msgs, json_array_size(msgs) - 1), "content");
    if (json_is_array(c)) c = json_object_get(json_array_get(c, json_array_size(c) - 1), "text");
    if (!json_is_string(c) || !json_string_length(c))
        return qerr_set(err, errlen, QERR_INVAL, "continue_final_message needs a final message with content");
    const char *s = json_string_value(c);
    size_t n = json_string_length(c);
    const char *at = last_of(r, *rlen, s, n);
    if (!at) {
        while (n && (s[0] == ' ' || s[0] == '\t' || s[0] == '\r' || s[0] == '\n')) s++, n--;
        while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n')) n--;
        at = last_of(r, *rlen, s, n);
    }
    if (!at)
        return qerr_set(err, errlen, QERR_INVAL,
                        "continue_final_message is set but the final message does not appear in the rendered chat");
    *rlen = (size_t)(at - r) + n;
    return 0;
}

int qchat_apply_tokens(const qchat_tmpl *t, const qmodel *m, const qtok *tok, const json_t *ctx, char **text,
                       size_t *text_len, int32_t **ids, int *n_ids, char *err, size_t errlen)
{
    return qchat_apply_tokens_ex(t, m, tok, ctx, 0, text, text_len, ids, n_ids, err, errlen);
}

int qchat_apply_tokens_ex(const qchat_tmpl *t, const qmodel *m, const qtok *tok, const json_t *ctx, unsigned flags,
                          char **text, size_t *text_len, int32_t **ids, int *n_ids, char *err, size_t errlen)
{
    *text = NULL;
    *ids = NULL;
    *n_ids = 0;
    if (!tok) return qerr_set(err, errlen, QERR_INVAL, "no tokenizer");
    json_t *c = json_deep_copy(ctx);
    stash st = { 0 };
    char *r = NULL, *out = NULL;
    qtok_span *spans = NULL;
    size_t rlen = 0, ns = 0;
    int rc;
    if (!c) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    if ((rc = defang_messages(tok, c, &st))) {
        qerr_set(err, errlen, rc, "out of memory");
        goto done;
    }
    if ((rc = qchat_apply(t, m, tok, c, &r, &rlen, err, errlen))) goto done;
    if ((flags & QCHAT_CONTINUE_FINAL) && (rc = cut_after_final(c, r, &rlen, err, errlen))) goto done;
    /* Markers back to their text; each restored range is a plain span. */
    size_t total = rlen;
    for (size_t i = 0; i < st.n; i++) total += st.len[i];
    out = malloc(total + 1);
    spans = calloc(st.n + 1, sizeof *spans);
    if (!out || !spans) {
        rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        goto done;
    }
    size_t o = 0, pos = 0;
    while (pos < rlen) {
        const char *pm = memmem(r + pos, rlen - pos, MARK_OPEN, 3);
        size_t at = pm ? (size_t)(pm - r) : rlen;
        memcpy(out + o, r + pos, at - pos);
        o += at - pos;
        pos = at;
        if (!pm) break;
        size_t k = 0, q = at + 3;
        int digits = 0;
        while (q < rlen && r[q] >= '0' && r[q] <= '9' && digits < 19) k = k * 10 + (size_t)(r[q++] - '0'), digits++;
        if (digits && q + 3 <= rlen && !memcmp(r + q, MARK_CLOSE, 3) && k < st.n && o + st.len[k] <= total) {
            memcpy(out + o, st.orig[k], st.len[k]);
            if (ns < st.n + 1) spans[ns++] = (qtok_span){ o, st.len[k] };
            o += st.len[k];
            pos = q + 3;
        } else { /* not one of ours (a template's own U+F8F0): keep it */
            memcpy(out + o, r + at, 3);
            o += 3;
            pos = at + 3;
        }
    }
    out[o] = 0;
    if ((rc = qtok_encode_spans(tok, out, o, QTOK_PARSE_SPECIAL, spans, (int)ns, ids, n_ids))) {
        qerr_set(err, errlen, rc, "cannot tokenize the prompt: %s", qerr_str(rc));
        goto done;
    }
    *text = out;
    *text_len = o;
    out = NULL;
done:
    free(out);
    free(r);
    free(spans);
    stash_free(&st);
    json_decref(c);
    return rc;
}
