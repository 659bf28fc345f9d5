/* cmd_batch.c - `quire generate --batch FILE.jsonl`: every request of the
 * file submitted to the engine at once, continuous batching doing the rest.
 *
 * Input: one JSON object per line, with "prompt" (text), "prompt_ids"
 * (token ids) or "messages" (a chat, through the model's template, with
 * optional "tools") and optional sampling fields (OpenAI names: max_tokens,
 * temperature, top_p, top_k, min_p, seed, repetition_penalty,
 * frequency_penalty, presence_penalty, stop, ignore_eos, and the other
 * fields qoai_params reads) and "id"; a field it does not take is an error
 * line naming it.  Output:
 * one JSON object per request in input order (id, text, token_ids,
 * finish_reason, usage, timings), then one with the engine statistics. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "cli.h"
#include "engine.h"
#include "model.h"
#include "oai.h"
#include "tokenizer.h"
#include "util.h"

/* One of a request's n samples. */
typedef struct {
    int32_t *ids;
    int n_ids, cap_ids;
    char *text;
    size_t text_len, text_cap;
    json_t *logprobs;       /* [{"token", "logprob", "top": [[id, lp], ...]}] when asked */
    qevent fin;
} choice;

typedef struct {
    json_t *client_id;
    uint64_t id;
    int n;
    choice *ch;
    int failed;
    char err[256];
} item;

/* Fills p from one input line; token ids are stored in *ids, and the
 * sampling fields' own arrays (logit_bias, stop_token_ids) in *keep (the
 * caller frees both: qoai_req_free(keep) once the engine has them). */
static int parse_line(json_t *o, const qmodel *m, const qtok *tok, int default_max, qreq_params *p, int32_t **ids,
                      qoai_req *keep, char *err, size_t errlen)
{
    if (!json_is_object(o)) return qerr_set(err, errlen, QERR_INVAL, "not a JSON object");
    /* The fields its endpoint's body may carry (chat with "messages",
     * completions otherwise), the line's id and prompt_ids; of those, the
     * ones that a served reply alone has are refused by name below. */
    static const char *const own[] = { "id", "prompt_ids", NULL };
    qoai_error fe;
    if (qoai_check_fields(o, json_is_array(json_object_get(o, "messages")) ? QOAI_CHAT : QOAI_COMPLETION, own, &fe))
        return qerr_set(err, errlen, QERR_INVAL, "%s", fe.message);
    memset(p, 0, sizeof *p);
    p->sp = qsample_defaults();
    p->max_tokens = default_max;
    json_t *pr = json_object_get(o, "prompt"), *pi = json_object_get(o, "prompt_ids"), *msgs = json_object_get(o, "messages");
    int n = 0, rc;
    if (json_is_array(msgs)) {
        /* Chat: the model's template (ChatML if none); message text cannot
         * inject control tokens. */
        if (!tok) return qerr_set(err, errlen, QERR_INVAL, "\"messages\" needs the model's tokenizer");
        qchat_tmpl *t = NULL;
        if ((rc = qchat_for_model(m, &t, NULL, err, errlen))) return rc;
        json_t *ctx = json_pack("{s:O, s:b}", "messages", msgs, "add_generation_prompt", 1);
        json_t *tools = json_object_get(o, "tools");
        if (ctx && tools) json_object_set(ctx, "tools", tools);
        char *text = NULL;
        size_t tl;
        rc = ctx ? qchat_apply_tokens(t, m, tok, ctx, &text, &tl, ids, &n, err, errlen)
                 : qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        free(text);
        json_decref(ctx);
        qchat_free(t);
        if (rc) return rc;
    } else if (json_is_string(pr)) {
        if (!tok) return qerr_set(err, errlen, QERR_INVAL, "\"prompt\" needs the model's tokenizer; give \"prompt_ids\"");
        if ((rc = qtok_encode(tok, json_string_value(pr), json_string_length(pr), QTOK_ADD_SPECIAL | QTOK_PARSE_SPECIAL,
                              ids, &n)))
            return qerr_set(err, errlen, rc, "cannot tokenize \"prompt\": %s", qerr_str(rc));
    } else if (json_is_array(pi)) {
        size_t k = json_array_size(pi);
        if (!(*ids = q_mallocn(k + 1, sizeof **ids))) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        for (size_t i = 0; i < k; i++) {
            json_t *v = json_array_get(pi, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= m->hp.n_vocab)
                return qerr_set(err, errlen, QERR_RANGE, "prompt_ids[%zu] is not a token id below %d", i, m->hp.n_vocab);
            (*ids)[i] = (int32_t)json_integer_value(v);
        }
        n = (int)k;
    } else {
        return qerr_set(err, errlen, QERR_INVAL, "needs \"prompt\" (a string), \"prompt_ids\" or \"messages\" (arrays)");
    }
    p->prompt = *ids;
    p->n_prompt = n;
    /* The sampling fields as the server reads them (completions' logprobs). */
    qoai_error e;
    memset(keep, 0, sizeof *keep);
    keep->p = *p;
    rc = qoai_params(o, QOAI_COMPLETION, NULL, keep, &e);
    /* Fields that shape a served reply or its prompt, which a batch line
     * does not have: the reply's form, tool calls read back (a line's
     * "tools" only reach the template), the chat template's extras, and the
     * model a server picks by name (a line runs on -m's). */
    static const char *const served_only[] = { "echo", "request_id", "truncate_prompt_tokens", "add_special_tokens",
                                               "stream", "stream_options", "tool_choice", "parallel_tool_calls",
                                               "chat_template_kwargs", "add_generation_prompt",
                                               "continue_final_message", "documents", "top_logprobs", "model" };
    for (size_t i = 0; !rc && i < sizeof served_only / sizeof served_only[0]; i++)
        if (json_object_get(o, served_only[i]) && !json_is_null(json_object_get(o, served_only[i])))
            rc = qoai_fail(&e, 400, "invalid_request_error", served_only[i],
                           "'%s' is not taken by --batch lines (quire serve takes it)", served_only[i]);
    if (rc) return qerr_set(err, errlen, rc, "%s", e.message);
    *p = keep->p;
    return 0;
}

/* Submits every line of text[0..len) to the engine as an item of *items
 * (a line that is not a request becomes an item with its error).  Returns
 * how many items, -1 when out of memory. */
static int submit_lines(qengine *e, const qmodel *m, const qtok *tok, int default_max, char *text, size_t len,
                        item **items_out)
{
    int n = 0, cap = 64;
    item *items = calloc((size_t)cap, sizeof *items);
    for (char *line = text, *end = text + len; items && line < end;) {
        char *nl = memchr(line, '\n', (size_t)(end - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(end - line);
        char *next = nl ? nl + 1 : end;
        if (ll == 0 || (ll == 1 && line[0] == '\r')) {
            line = next;
            continue;
        }
        if (n == cap) {
            item *ni = realloc(items, sizeof *ni * (size_t)cap * 2);
            if (!ni) break;
            memset(ni + cap, 0, sizeof *ni * (size_t)cap);
            items = ni;
            cap *= 2;
        }
        item *it = &items[n++];
        json_error_t je;
        json_t *o = json_loadb(line, ll, 0, &je);
        qreq_params p;
        qoai_req keep;
        memset(&keep, 0, sizeof keep);
        int32_t *ids = NULL;
        if (!o) {
            snprintf(it->err, sizeof it->err, "line %d is not JSON: %s", n, je.text);
            it->failed = 1;
        } else if (parse_line(o, m, tok, default_max, &p, &ids, &keep, it->err, sizeof it->err)) {
            it->failed = 1;
        } else {
            it->n = p.n > 1 ? p.n : 1;
            if (!(it->ch = calloc((size_t)it->n, sizeof *it->ch))) {
                snprintf(it->err, sizeof it->err, "out of memory");
                it->failed = 1;
            } else if (qengine_submit(e, &p, &it->id, it->err, sizeof it->err)) {
                it->failed = 1;
            }
        }
        if (o) it->client_id = json_incref(json_object_get(o, "id"));
        qoai_req_free(&keep);
        free(ids);
        json_decref(o);
        line = next;
    }
    *items_out = items;
    return items ? n : -1;
}

/* A token event into its choice: the id, its log-probabilities. */
static void add_token(choice *c, const qevent *ev)
{
    if (c->n_ids == c->cap_ids) {
        int nc = c->cap_ids ? c->cap_ids * 2 : 64;
        int32_t *ni = realloc(c->ids, sizeof *ni * (size_t)nc);
        if (ni) c->ids = ni, c->cap_ids = nc;
    }
    if (c->n_ids < c->cap_ids) c->ids[c->n_ids++] = ev->token;
    if (ev->n_top || ev->logprob != 0) {
        if (!c->logprobs) c->logprobs = json_array();
        json_t *top = json_array();
        for (int k = 0; k < ev->n_top; k++)
            json_array_append_new(top, json_pack("[if]", ev->top[k].id,
                                                 isfinite(ev->top[k].logprob) ? ev->top[k].logprob : -9999.0));
        json_array_append_new(c->logprobs, json_pack("{s:i, s:f, s:o}", "token", ev->token, "logprob",
                                                     isfinite(ev->logprob) ? ev->logprob : -9999.0, "top", top));
    }
}

/* Steps the engine until every request has finished, the events into the
 * items' choices.  0, or 1 when a step failed. */
static int collect(qengine *e, item *items, int n)
{
    for (int live = 1; live > 0;) {
        live = qengine_step(e);
        if (live < 0) {
            fprintf(stderr, "quire generate: engine step failed: %s\n", qerr_str(live));
            return 1;
        }
        qevent ev;
        while (qengine_poll(e, &ev)) {
            item *it = NULL;
            for (int i = 0; i < n && !it; i++)
                if (items[i].id == ev.id && !items[i].failed) it = &items[i];
            choice *c = it && ev.index >= 0 && ev.index < it->n ? &it->ch[ev.index] : NULL;
            if (c && ev.finish == QFINISH_NONE) add_token(c, &ev);
            if (c && ev.text_len) {
                if (c->text_len + ev.text_len + 1 > c->text_cap) {
                    size_t nc = (c->text_len + ev.text_len + 1) * 2;
                    char *nt = realloc(c->text, nc);
                    if (nt) c->text = nt, c->text_cap = nc;
                }
                if (c->text_len + ev.text_len + 1 <= c->text_cap) {
                    memcpy(c->text + c->text_len, ev.text, ev.text_len);
                    c->text_len += ev.text_len;
                }
            }
            if (c && ev.finish != QFINISH_NONE) {
                c->fin = ev;
                c->fin.text = NULL;
            }
            qevent_free(&ev);
        }
    }
    return 0;
}

/* An item's output line (n == 1: the fields at the top level; n > 1: one
 * "choices" entry per sample and the usage summed), and frees the item.
 * Returns its completion tokens. */
static int print_item(item *it)
{
    json_t *o;
    int completion = 0;
    if (it->failed) {
        o = json_pack("{s:O?, s:s}", "id", it->client_id, "error", it->err);
    } else {
        json_t *choices = json_array();
        for (int k = 0; k < it->n; k++) {
            choice *c = &it->ch[k];
            json_t *ids = json_array();
            for (int q = 0; q < c->n_ids; q++) json_array_append_new(ids, json_integer(c->ids[q]));
            completion += c->fin.completion_tokens;
            json_t *co = json_pack("{s:i, s:s%, s:o, s:s}", "index", k, "text", c->text ? c->text : "",
                                   c->text_len, "token_ids", ids, "finish_reason", qfinish_name(c->fin.finish));
            if (co && c->logprobs) json_object_set(co, "logprobs", c->logprobs);
            json_array_append_new(choices, co);
        }
        const qevent *f0 = &it->ch[0].fin;
        if (it->n == 1) {
            o = json_deep_copy(json_array_get(choices, 0));
            json_object_del(o, "index");
        } else {
            o = json_object();
            json_object_set(o, "choices", choices);
        }
        json_t *front = json_pack("{s:O?}", "id", it->client_id);
        json_object_update(front, o);
        json_decref(o);
        o = front;
        json_object_set_new(o, "usage", json_pack("{s:i, s:i, s:i}", "prompt_tokens", f0->prompt_tokens,
                                                  "completion_tokens", completion, "cached_tokens", f0->cached_tokens));
        json_object_set_new(o, "ttft_s", json_real(f0->ttft_s));
        json_object_set_new(o, "total_s", json_real(f0->total_s));
        json_decref(choices);
    }
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    if (s) puts(s);
    free(s);
    json_decref(o);
    json_decref(it->client_id);
    for (int k = 0; it->ch && k < it->n; k++) {
        free(it->ch[k].ids);
        free(it->ch[k].text);
        json_decref(it->ch[k].logprobs);
    }
    free(it->ch);
    return completion;
}

/* The last line: the engine's statistics. */
static void print_stats(qengine *e, int n, double wall, uint64_t gen)
{
    qengine_stats st;
    qengine_stats_get(e, &st);
    json_t *so = json_pack("{s:{s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:i, s:i, s:f, s:f, s:f, "
                           "s:I, s:I, s:I}}",
                           "stats", "requests", n, "steps", (json_int_t)st.steps,
                           "tokens_computed", (json_int_t)st.tokens_computed,
                           "tokens_reused", (json_int_t)st.tokens_reused, "prompt_tokens", (json_int_t)st.prompt_tokens_total,
                           "generated", (json_int_t)st.generated, "preemptions", (json_int_t)st.preemptions,
                           "preemptions_swap", (json_int_t)st.preemptions_swap,
                           "swap_fallbacks", (json_int_t)st.swap_fallbacks, "swap_ins", (json_int_t)st.swap_ins,
                           "swapped_out_blocks", (json_int_t)st.swapped_out_blocks,
                           "swapped_in_blocks", (json_int_t)st.swapped_in_blocks,
                           "kv_blocks", st.kv_blocks, "kv_free", st.kv_free, "kv_cached", st.kv_cached,
                           "kv_utilisation_avg", st.kv_util_avg, "wall_s", wall,
                           "generated_tokens_per_s", wall > 0 ? (double)gen / wall : 0.0, "spec_drafted",
                           (json_int_t)st.spec_drafted, "spec_accepted", (json_int_t)st.spec_accepted, "spec_passes",
                           (json_int_t)st.spec_passes);
    char *s = so ? json_dumps(so, JSON_COMPACT) : NULL;
    if (s) puts(s);
    free(s);
    json_decref(so);
}

int run_batch(const qmodel *m, const qtok *tok, const qengine_opts *eo, const char *path, int default_max)
{
    char err[512];
    char *text = NULL;
    size_t len = 0;
    if (q_read_file(path, (size_t)1 << 30, &text, &len, err, sizeof err)) {
        fprintf(stderr, "quire generate: --batch: %s\n", err);
        return 1;
    }
    qengine *e = NULL;
    if (qengine_create(m, tok, eo, &e, err, sizeof err)) {
        fprintf(stderr, "quire generate: %s\n", err);
        free(text);
        return 1;
    }
    const double t0 = q_now();
    item *items = NULL;
    const int n = submit_lines(e, m, tok, default_max, text, len, &items);
    const int status = n < 0 ? 1 : collect(e, items, n);
    const double wall = q_now() - t0;
    uint64_t gen = 0;
    for (int i = 0; i < n; i++) gen += (uint64_t)print_item(&items[i]);
    print_stats(e, n < 0 ? 0 : n, wall, gen);
    fprintf(stderr, "batch: %d requests, %llu tokens generated in %.3f s, %.1f tokens/s\n", n < 0 ? 0 : n,
            (unsigned long long)gen, wall, wall > 0 ? (double)gen / wall : 0.0);
    free(items);
    free(text);
    qengine_destroy(e);
    return status;
}
