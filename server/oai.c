/* oai.c - OpenAI-compatible request bodies: parsing, validation, errors
 * (oai.h says which fields and how they are checked). */
#include "oai.h"
#include "sha256.h"
#include "stop.h"

#include "gram.h"
#include "schema.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "model.h"
#include "qerr.h"
#include "tokenizer.h"
#include "util.h"

#define INVALID "invalid_request_error"

int qoai_fail(qoai_error *e, int status, const char *type, const char *param, const char *fmt, ...)
{
    memset(e, 0, sizeof *e);
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    if (param) snprintf(e->param, sizeof e->param, "%s", param);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status >= 400 && status < 500 ? QERR_INVAL : QERR_INTERNAL;
}

json_t *qoai_error_json(const qoai_error *e)
{
    return json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->message, "type", e->type, "param",
                     e->param[0] ? json_string(e->param) : json_null(), "code",
                     e->code[0] ? json_string(e->code) : json_null());
}

/* The field k of o, NULL when absent or null. */
static json_t *field(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) ? v : NULL;
}

/* A number in [lo, hi] (integers only with integral): 1 when present, 0
 * when absent, < 0 with *e filled. */
static int num(json_t *o, const char *k, double lo, double hi, int integral, double *out, qoai_error *e)
{
    json_t *v = field(o, k);
    if (!v) return 0;
    if (integral ? !json_is_integer(v) : !json_is_number(v))
        return qoai_fail(e, 400, INVALID, k, "'%s' must be %s", k, integral ? "an integer" : "a number");
    const double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return qoai_fail(e, 400, INVALID, k, "'%s' = %g is outside [%g, %g]", k, d, lo, hi);
    *out = d;
    return 1;
}

/* A boolean: 1 when present (value in *out), 0 when absent, < 0 on error. */
static int flag(json_t *o, const char *k, int *out, qoai_error *e)
{
    json_t *v = field(o, k);
    if (!v) return 0;
    if (!json_is_boolean(v)) return qoai_fail(e, 400, INVALID, k, "'%s' must be true or false", k);
    *out = json_is_true(v);
    return 1;
}

#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        if ((rc = (x)) < 0) return rc;                                                                                 \
    } while (0)

/* ---- structure requests that failed ------------------------------------------- */

struct qoai_failcache {
    pthread_mutex_t mu;
    int cap, n, next;
    struct fc_entry {
        uint8_t digest[32];
        qoai_error e;
    } *e;
};

qoai_failcache *qoai_failcache_new(int cap)
{
    qoai_failcache *c = calloc(1, sizeof *c);
    if (!c || cap < 1 || !(c->e = calloc((size_t)cap, sizeof *c->e))) {
        free(c);
        return NULL;
    }
    c->cap = cap;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void qoai_failcache_free(qoai_failcache *c)
{
    if (!c) return;
    pthread_mutex_destroy(&c->mu);
    free(c->e);
    free(c);
}

int qoai_failcache_get(qoai_failcache *c, const char *key, qoai_error *e)
{
    if (!c || !key) return 0;
    uint8_t digest[32];
    qsha256(key, strlen(key), digest);
    int hit = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n && !hit; i++)
        if (!memcmp(c->e[i].digest, digest, 32)) *e = c->e[i].e, hit = 1;
    pthread_mutex_unlock(&c->mu);
    return hit;
}

void qoai_failcache_put(qoai_failcache *c, const char *key, const qoai_error *e)
{
    if (!c || !key) return;
    uint8_t digest[32];
    qsha256(key, strlen(key), digest);
    pthread_mutex_lock(&c->mu);
    struct fc_entry *x = &c->e[c->next];
    memcpy(x->digest, digest, 32);
    x->e = *e;
    c->next = (c->next + 1) % c->cap;
    if (c->n < c->cap) c->n++;
    pthread_mutex_unlock(&c->mu);
}

/* The output's grammar from response_format or guided_json / guided_regex /
 * guided_choice, into r->grammar and r->p. */
static int guided(json_t *o, const qoai_limits *lim, qoai_req *r, qoai_error *e)
{
    json_t *rf = field(o, "response_format"), *gj = field(o, "guided_json"), *gr = field(o, "guided_regex"),
           *gc = field(o, "guided_choice");
    const json_t *schema = NULL;
    const char *param = NULL;
    int any_object = 0;
    if (rf) {
        json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!json_is_string(t))
            return qoai_fail(e, 400, INVALID, "response_format", "'response_format' must be an object with a 'type'");
        const char *ty = json_string_value(t);
        if (!strcmp(ty, "json_object")) {
            any_object = 1;
            param = "response_format";
        } else if (!strcmp(ty, "json_schema")) {
            json_t *js = json_object_get(rf, "json_schema");
            schema = json_is_object(js) ? json_object_get(js, "schema") : NULL;
            param = "response_format.json_schema.schema";
            if (!schema)
                return qoai_fail(e, 400, INVALID, "response_format",
                                 "response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
        } else if (strcmp(ty, "text")) {
            return qoai_fail(e, 400, INVALID, "response_format",
                             "response_format type '%s' is not one of text, json_object, json_schema", ty);
        }
    }
    const int n_set = (param != NULL) + (gj != NULL) + (gr != NULL) + (gc != NULL);
    if (!n_set) return 0;
    if (n_set > 1)
        return qoai_fail(e, 400, INVALID, "response_format",
                         "one of response_format (json), guided_json, guided_regex and guided_choice at a time");
    if (!lim || !lim->gvocab)
        return qoai_fail(e, 400, INVALID, param ? param : gj ? "guided_json" : gr ? "guided_regex" : "guided_choice",
                         "structured output needs the model's tokenizer");
    char err[800];
    int rc;
    /* The same request for structure again: the grammar compiled before. */
    char *key = NULL;
    {
        json_t *k = json_pack("[s, O?, O?, O?, O?]", any_object ? "object" : "", (json_t *)schema, gj, gr, gc);
        key = k ? json_dumps(k, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(k);
    }
    if (key && lim->gcache && (r->grammar = gram_cache_get(lim->gcache, key, strlen(key)))) {
        free(key);
        r->p.grammar = r->grammar;
        r->p.grammar_vocab = lim->gvocab;
        return 0;
    }
    if (qoai_failcache_get(lim->gfail, key, e)) {
        free(key);
        return QERR_INVAL;
    }
    if (gr) {
        if (!json_is_string(gr)) {
            free(key);
            return qoai_fail(e, 400, INVALID, "guided_regex", "'guided_regex' must be a string");
        }
        param = "guided_regex";
        gram_budget_set(&(gram_budget){ .seconds = lim->grammar_seconds });
        rc = gram_regex_grammar(json_string_value(gr), json_string_length(gr), &r->grammar, err, sizeof err);
    } else if (gc) {
        const size_t n = json_is_array(gc) ? json_array_size(gc) : 0;
        param = "guided_choice";
        if (!n || n > 4096) {
            free(key);
            return qoai_fail(e, 400, INVALID, param, "'guided_choice' must be a list of 1 to 4096 strings");
        }
        const char **s = calloc(n, sizeof *s);
        size_t *l = calloc(n, sizeof *l);
        rc = s && l ? 0 : QERR_NOMEM;
        for (size_t i = 0; !rc && i < n; i++) {
            json_t *x = json_array_get(gc, i);
            if (!json_is_string(x) || !json_string_length(x)) {
                free(s);
                free(l);
                free(key);
                return qoai_fail(e, 400, INVALID, param, "'guided_choice' must be a list of non-empty strings");
            }
            s[i] = json_string_value(x), l[i] = json_string_length(x);
        }
        if (!rc) gram_budget_set(&(gram_budget){ .seconds = lim->grammar_seconds });
        if (!rc) rc = gram_choice_grammar(s, l, (int)n, &r->grammar, err, sizeof err);
        else snprintf(err, sizeof err, "out of memory");
        free(s);
        free(l);
    } else if (gj || schema || any_object) {
        if (gj) param = "guided_json";
        json_t *obj = any_object ? json_pack("{s:s}", "type", "object") : NULL;
        gram_budget_set(&(gram_budget){ .seconds = lim->grammar_seconds });
        rc = gram_schema_compile(gj ? gj : obj ? obj : schema, &r->grammar, err, sizeof err);
        json_decref(obj);
    } else {
        free(key);
        return 0;
    }
    gram_budget_set(NULL);
    if (!rc && key && lim->gcache) gram_cache_put(lim->gcache, key, strlen(key), r->grammar);
    if (rc == QERR_NOMEM) {
        free(key);
        return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    }
    if (rc) {
        const int frc = qoai_fail(e, 400, INVALID, param, "%s", err);
        qoai_failcache_put(lim->gfail, key, e);
        free(key);
        return frc;
    }
    free(key);
    r->p.grammar = r->grammar;
    r->p.grammar_vocab = lim->gvocab;
    return 0;
}

int qoai_params(json_t *o, qoai_kind kind, const qoai_limits *lim, qoai_req *r, qoai_error *e)
{
    qreq_params *p = &r->p;
    qsample_params *sp = &p->sp;
    double d = 0;
    int rc, b = 0;
    const double cap = lim && lim->max_tokens_cap > 0 ? lim->max_tokens_cap : (double)(1 << 24);
    static const char *const max_names[2] = { "max_tokens", "max_completion_tokens" };
    for (int i = 0; i < 2; i++) {
        TRY(num(o, max_names[i], 1, 1e18, 1, &d, e));
        if (!rc) continue;
        if (d > cap)
            return qoai_fail(e, 400, INVALID, max_names[i], "'%s' = %.0f is more than this server allows (%.0f)",
                             max_names[i], d, cap);
        p->max_tokens = (int)d;
        r->has_max_tokens = 1;
    }
    TRY(num(o, "temperature", 0, 100, 0, &d, e));
    if (rc) sp->temperature = (float)d;
    TRY(num(o, "top_p", 0, 1, 0, &d, e));
    if (rc && d == 0) return qoai_fail(e, 400, INVALID, "top_p", "'top_p' = 0 is outside (0, 1]");
    if (rc) sp->top_p = (float)d;
    TRY(num(o, "top_k", -1, 1 << 30, 1, &d, e));
    if (rc) sp->top_k = (int)d;
    TRY(num(o, "min_p", 0, 1, 0, &d, e));
    if (rc) sp->min_p = (float)d;
    json_t *seed = field(o, "seed");
    if (seed && !json_is_integer(seed)) return qoai_fail(e, 400, INVALID, "seed", "'seed' must be an integer");
    if (seed) sp->seed = (uint64_t)json_integer_value(seed);
    TRY(num(o, "frequency_penalty", -2, 2, 0, &d, e));
    if (rc) sp->frequency_penalty = (float)d;
    TRY(num(o, "presence_penalty", -2, 2, 0, &d, e));
    if (rc) sp->presence_penalty = (float)d;
    TRY(num(o, "repetition_penalty", 0, 1e6, 0, &d, e));
    if (rc && d == 0) return qoai_fail(e, 400, INVALID, "repetition_penalty", "'repetition_penalty' must be above 0");
    if (rc) sp->repetition_penalty = (float)d;
    TRY(num(o, "n", 1, QENGINE_MAX_N, 1, &d, e));
    if (rc) p->n = (int)d;
    TRY(flag(o, "ignore_eos", &b, e));
    if (rc) p->ignore_eos = b;
    TRY(flag(o, "speculative", &b, e));
    if (rc) p->no_spec = !b;

    /* logprobs: a boolean with top_logprobs in chat, the number of
     * alternatives in completions. */
    if (kind == QOAI_CHAT) {
        TRY(flag(o, "logprobs", &b, e));
        r->logprobs = rc && b;
        TRY(num(o, "top_logprobs", 0, QSAMPLE_MAX_LOGPROBS, 1, &d, e));
        if (rc && !r->logprobs)
            return qoai_fail(e, 400, INVALID, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
        if (rc) sp->top_logprobs = (int)d;
    } else {
        TRY(num(o, "logprobs", 0, QSAMPLE_MAX_LOGPROBS, 1, &d, e));
        r->logprobs = rc;
        if (rc) sp->top_logprobs = (int)d;
    }
    sp->logprobs = r->logprobs;

    json_t *st = field(o, "stop");
    p->n_stop = 0;
    if (json_is_string(st)) {
        if (!json_string_length(st)) return qoai_fail(e, 400, INVALID, "stop", "'stop' must not be empty");
        if (json_string_length(st) > QSTOP_MAX_BYTES)
            return qoai_fail(e, 400, INVALID, "stop", "a stop string is at most %d bytes", QSTOP_MAX_BYTES);
        p->stop[p->n_stop++] = json_string_value(st);
    } else if (json_is_array(st)) {
        size_t i;
        json_t *v;
        if (json_array_size(st) > QENGINE_MAX_STOP)
            return qoai_fail(e, 400, INVALID, "stop", "'stop' holds at most %d strings", QENGINE_MAX_STOP);
        json_array_foreach(st, i, v) {
            if (!json_is_string(v) || !json_string_length(v))
                return qoai_fail(e, 400, INVALID, "stop", "'stop' must hold non-empty strings");
            if (json_string_length(v) > QSTOP_MAX_BYTES)
                return qoai_fail(e, 400, INVALID, "stop", "a stop string is at most %d bytes", QSTOP_MAX_BYTES);
            p->stop[p->n_stop++] = json_string_value(v);
        }
    } else if (st) {
        return qoai_fail(e, 400, INVALID, "stop", "'stop' must be a string or an array of strings");
    }

    TRY(flag(o, "stream", &b, e));
    r->stream = rc && b;
    json_t *so = field(o, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return qoai_fail(e, 400, INVALID, "stream_options", "'stream_options' must be an object");
        if (!r->stream)
            return qoai_fail(e, 400, INVALID, "stream_options", "'stream_options' is only allowed when 'stream' is true");
        TRY(flag(so, "include_usage", &b, e));
        r->include_usage = rc && b;
    }
    json_t *user = field(o, "user");
    if (user && !json_is_string(user)) return qoai_fail(e, 400, INVALID, "user", "'user' must be a string");
    TRY(guided(o, lim, r, e));
    return kind == QOAI_CHAT ? qoai_tools(o, lim, r, e) : 0;
}

/* The chat's messages as the template takes them: roles checked
 * ("developer" read as "system"), content a string, or null where a
 * message may have none; text parts joined by newlines.  A new array in
 * *out, or an error. */
int qoai_messages(json_t *msgs, json_t **out, qoai_error *e)
{
    static const char *const roles[] = { "system", "user", "assistant", "tool", "developer" };
    char prm[48];
    if (!json_is_array(msgs)) return qoai_fail(e, 400, INVALID, "messages", "'messages' must be an array");
    if (!json_array_size(msgs)) return qoai_fail(e, 400, INVALID, "messages", "'messages' must not be empty");
    json_t *arr = json_array();
    if (!arr) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        snprintf(prm, sizeof prm, "messages[%zu]", i);
        json_t *role = json_is_object(m) ? json_object_get(m, "role") : NULL;
        int ok = 0;
        for (size_t k = 0; json_is_string(role) && k < sizeof roles / sizeof roles[0]; k++)
            ok |= !strcmp(json_string_value(role), roles[k]);
        if (!ok) {
            json_decref(arr);
            return qoai_fail(e, 400, INVALID, prm,
                             "%s must be an object whose 'role' is system, user, assistant, tool or developer", prm);
        }
        json_t *c = json_object_get(m, "content"), *nc = NULL;
        if (json_is_string(c)) {
            nc = json_incref(c);
        } else if (json_is_array(c)) {
            /* Text parts, joined by newlines; nothing else is understood. */
            size_t total = 0, j;
            json_t *part;
            json_array_foreach(c, j, part) {
                json_t *ty = json_is_object(part) ? json_object_get(part, "type") : NULL;
                json_t *tx = json_is_object(part) ? json_object_get(part, "text") : NULL;
                if (!json_is_string(ty) || strcmp(json_string_value(ty), "text") || !json_is_string(tx)) {
                    json_decref(arr);
                    return qoai_fail(e, 400, INVALID, prm,
                                     "%s.content[%zu]: only {\"type\": \"text\", \"text\": ...} parts are supported",
                                     prm, j);
                }
                total += json_string_length(tx) + 1;
            }
            char *s = malloc(total + 1), *w = s;
            if (s) {
                json_array_foreach(c, j, part) {
                    json_t *tx = json_object_get(part, "text");
                    if (j) *w++ = '\n';
                    memcpy(w, json_string_value(tx), json_string_length(tx));
                    w += json_string_length(tx);
                }
                nc = json_stringn_nocheck(s, (size_t)(w - s));
                free(s);
            }
        } else if (c && !json_is_null(c)) {
            json_decref(arr);
            return qoai_fail(e, 400, INVALID, prm, "%s.content must be a string, an array of text parts or null", prm);
        } else if (!strcmp(json_string_value(role), "user") || !strcmp(json_string_value(role), "system") ||
                   !strcmp(json_string_value(role), "developer")) {
            json_decref(arr);
            return qoai_fail(e, 400, INVALID, prm, "%s (%s) needs 'content'", prm, json_string_value(role));
        } else {
            nc = json_null();
        }
        json_t *nm = json_copy(m);
        if (!nc || !nm || json_object_set_new(nm, "content", nc) ||
            (!strcmp(json_string_value(role), "developer") && json_object_set_new(nm, "role", json_string("system"))) ||
            json_array_append_new(arr, nm)) {
            if (!nm) json_decref(nc);
            json_decref(arr);
            return qoai_fail(e, 500, "server_error", NULL, "out of memory");
        }
    }
    *out = arr;
    return 0;
}

/* The prompt's token ids into r->ids / r->p. */
static int prompt_ids(json_t *o, qoai_kind kind, const qmodel *m, const qtok *tok, qoai_req *r, qoai_error *e)
{
    char err[256];
    int n = 0, rc;
    if (kind == QOAI_CHAT) {
        json_t *msgs = NULL;
        if (!json_object_get(o, "messages")) return qoai_fail(e, 400, INVALID, "messages", "'messages' is required");
        if ((rc = qoai_messages(json_object_get(o, "messages"), &msgs, e))) return rc;
        json_t *tools = field(o, "tools"); /* checked by qoai_tools */
        json_t *ctx = json_pack("{s:o, s:b}", "messages", msgs, "add_generation_prompt", 1);
        if (ctx && tools) json_object_set(ctx, "tools", tools);
        qchat_tmpl *t = NULL;
        char *text = NULL;
        size_t tl;
        if (!ctx) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
        rc = qchat_for_model(m, &t, NULL, err, sizeof err);
        if (!rc) rc = qchat_apply_tokens(t, m, tok, ctx, &text, &tl, &r->ids, &n, err, sizeof err);
        free(text);
        qchat_free(t);
        json_decref(ctx);
        if (rc == QERR_NOMEM) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
        if (rc) return qoai_fail(e, 400, INVALID, "messages", "the chat template failed: %s", err);
    } else {
        json_t *pr = json_object_get(o, "prompt");
        if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0)))
            pr = json_array_get(pr, 0);
        if (json_is_string(pr)) {
            rc = qtok_encode(tok, json_string_value(pr), json_string_length(pr), QTOK_ADD_SPECIAL | QTOK_PARSE_SPECIAL,
                             &r->ids, &n);
            if (rc == QERR_NOMEM) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
            if (rc) return qoai_fail(e, 400, INVALID, "prompt", "cannot tokenize 'prompt': %s", qerr_str(rc));
        } else if (json_is_array(pr) && json_array_size(pr) && json_is_integer(json_array_get(pr, 0))) {
            const size_t k = json_array_size(pr);
            if (!(r->ids = q_mallocn(k, sizeof *r->ids))) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
            for (size_t i = 0; i < k; i++) {
                json_t *v = json_array_get(pr, i);
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= m->hp.n_vocab)
                    return qoai_fail(e, 400, INVALID, "prompt", "prompt[%zu] is not a token id below %d", i,
                                     m->hp.n_vocab);
                r->ids[i] = (int32_t)json_integer_value(v);
            }
            n = (int)k;
        } else if (json_is_array(pr) && json_array_size(pr) > 1) {
            return qoai_fail(e, 400, INVALID, "prompt", "one prompt a request: 'prompt' holds %zu",
                             json_array_size(pr));
        } else {
            return qoai_fail(e, 400, INVALID, "prompt",
                             "'prompt' must be a string, an array of one string, or an array of token ids");
        }
    }
    if (n < 1) return qoai_fail(e, 400, INVALID, kind == QOAI_CHAT ? "messages" : "prompt", "the prompt is empty");
    r->p.prompt = r->ids;
    r->p.n_prompt = n;
    return 0;
}

int qoai_parse(const char *body, size_t len, qoai_kind kind, const qoai_limits *lim, const qmodel *m,
               const qtok *tok, qoai_req *r, qoai_error *e)
{
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->kind = kind;
    r->model = "";
    r->p.sp = qsample_defaults();
    json_error_t je;
    r->body = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    int rc;
    if (!r->body)
        rc = qoai_fail(e, 400, INVALID, NULL, "the body is not valid JSON (%s at byte %d)", je.text, je.position);
    else if (!json_is_object(r->body))
        rc = qoai_fail(e, 400, INVALID, NULL, "the body must be a JSON object");
    else if (field(r->body, "model") && !json_is_string(field(r->body, "model")))
        rc = qoai_fail(e, 400, INVALID, "model", "'model' must be a string");
    else if (!tok)
        rc = qoai_fail(e, 400, INVALID, NULL, "this model has no tokenizer; text requests cannot be served");
    else
        rc = qoai_params(r->body, kind, lim, r, e);
    if (!rc) rc = prompt_ids(r->body, kind, m, tok, r, e);
    if (!rc) {
        json_t *mo = field(r->body, "model");
        if (mo) r->model = json_string_value(mo);
        const int ctx = m->hp.max_ctx > 0 ? m->hp.max_ctx : 1 << 30, room = ctx - r->p.n_prompt;
        if (room < 1 || (r->has_max_tokens && r->p.max_tokens > room)) {
            rc = qoai_fail(e, 400, INVALID, kind == QOAI_CHAT ? "messages" : "prompt",
                           "This model's maximum context length is %d tokens. However, you requested %d tokens (%d "
                           "in the %s, %d in the completion). Please reduce the length of the %s or completion.",
                           ctx, r->p.n_prompt + (r->has_max_tokens ? r->p.max_tokens : 0), r->p.n_prompt,
                           kind == QOAI_CHAT ? "messages" : "prompt", r->has_max_tokens ? r->p.max_tokens : 0,
                           kind == QOAI_CHAT ? "messages" : "prompt");
            snprintf(e->code, sizeof e->code, "context_length_exceeded");
        } else if (!r->has_max_tokens) {
            const int cap = lim && lim->max_tokens_cap > 0 ? lim->max_tokens_cap : room;
            r->p.max_tokens = room < cap ? room : cap;
        }
    }
    if (rc) qoai_req_free(r);
    return rc;
}

void qoai_req_free(qoai_req *r)
{
    if (!r) return;
    json_decref(r->body);
    free(r->ids);
    gram_free(r->grammar);
    memset(r, 0, sizeof *r);
    r->model = "";
}
