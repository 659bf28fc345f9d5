/* oai.c - OpenAI-compatible request bodies: parsing, validation, errors
 * (oai.h says which fields and how they are checked). */
#include "oai.h"
#include "oai_int.h"
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

json_t *qoai_field(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) ? v : NULL;
}

/* A number in [lo, hi] (integers only with integral): 1 when present, 0
 * when absent, < 0 with *e filled. */
static int num(json_t *o, const char *k, double lo, double hi, int integral, double *out, qoai_error *e)
{
    json_t *v = qoai_field(o, k);
    if (!v) return 0;
    if (integral ? !json_is_integer(v) : !json_is_number(v))
        return qoai_fail(e, 400, INVALID, k, "'%s' must be %s", k, integral ? "an integer" : "a number");
    const double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return qoai_fail(e, 400, INVALID, k, "'%s' = %g is outside [%g, %g]", k, d, lo, hi);
    *out = d;
    return 1;
}

int qoai_flag(json_t *o, const char *k, int *out, qoai_error *e)
{
    json_t *v = qoai_field(o, k);
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

/* Where a request asks for structure: at most one of response_format
 * (json_object / json_schema), guided_json / guided_regex / guided_choice,
 * structured_outputs {json | regex | choice | json_object} (vLLM's current
 * name) and llama-server's top-level json_schema. */
typedef struct {
    const json_t *schema; /* a JSON Schema */
    json_t *regex, *choice;
    int any_object;       /* any JSON object */
    const char *param;    /* the field that asked */
    json_t *parsed;       /* a schema given as JSON text, parsed (owned) */
} gsource;

/* A schema field: an object, a boolean, or JSON text of one (vLLM takes
 * guided_json and structured_outputs.json as either).  1 when set, 0 when
 * absent, < 0 with *e filled. */
static int schema_field(json_t *v, const char *param, gsource *g, qoai_error *e)
{
    if (!v) return 0;
    if (json_is_string(v)) {
        json_error_t je;
        if (!(g->parsed = json_loads(json_string_value(v), JSON_REJECT_DUPLICATES, &je)))
            return qoai_fail(e, 400, INVALID, param, "'%s' is a string but not JSON (%s)", param, je.text);
        v = g->parsed;
    }
    if (!json_is_object(v) && !json_is_boolean(v))
        return qoai_fail(e, 400, INVALID, param, "'%s' must be a JSON Schema (an object)", param);
    g->schema = v;
    g->param = param;
    return 1;
}

/* The sources of structure in o into *g (none: g->param NULL). */
static int guided_source(json_t *o, gsource *g, qoai_error *e)
{
    int n_set = 0, rc;
    json_t *rf = qoai_field(o, "response_format");
    if (rf) {
        json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!json_is_string(t))
            return qoai_fail(e, 400, INVALID, "response_format", "'response_format' must be an object with a 'type'");
        const char *ty = json_string_value(t);
        if (!strcmp(ty, "json_object")) {
            g->any_object = 1, g->param = "response_format", n_set++;
        } else if (!strcmp(ty, "json_schema")) {
            json_t *js = json_object_get(rf, "json_schema");
            json_t *sc = json_is_object(js) ? json_object_get(js, "schema") : NULL;
            if (!sc)
                return qoai_fail(e, 400, INVALID, "response_format",
                                 "response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
            if ((rc = schema_field(sc, "response_format.json_schema.schema", g, e)) < 0) return rc;
            n_set++;
        } else if (strcmp(ty, "text")) {
            return qoai_fail(e, 400, INVALID, "response_format",
                             "response_format type '%s' is not one of text, json_object, json_schema", ty);
        }
    }
    json_t *so = qoai_field(o, "structured_outputs");
    if (so && !json_is_object(so))
        return qoai_fail(e, 400, INVALID, "structured_outputs", "'structured_outputs' must be an object");
    if (so) {
        const char *k;
        json_t *v;
        json_object_foreach(so, k, v) {
            if (json_is_null(v) || (json_is_false(v) && !strcmp(k, "json_object"))) continue;
            if (!strcmp(k, "json")) {
                if ((rc = schema_field(v, "structured_outputs.json", g, e)) < 0) return rc;
            } else if (!strcmp(k, "regex")) {
                g->regex = v, g->param = "structured_outputs.regex";
            } else if (!strcmp(k, "choice")) {
                g->choice = v, g->param = "structured_outputs.choice";
            } else if (!strcmp(k, "json_object")) {
                if (!json_is_true(v))
                    return qoai_fail(e, 400, INVALID, "structured_outputs.json_object",
                                     "'structured_outputs.json_object' must be true or false");
                g->any_object = 1, g->param = "structured_outputs.json_object";
            } else {
                char prm[48];
                snprintf(prm, sizeof prm, "structured_outputs.%s", k);
                return qoai_fail(e, 400, INVALID, prm,
                                 "'%s' is not supported: structured_outputs takes json, regex, choice or json_object",
                                 prm);
            }
            n_set++;
        }
    }
    if ((rc = schema_field(qoai_field(o, "guided_json"), "guided_json", g, e)) < 0) return rc;
    n_set += rc;
    if ((rc = schema_field(qoai_field(o, "json_schema"), "json_schema", g, e)) < 0) return rc;
    n_set += rc;
    if (qoai_field(o, "guided_regex")) g->regex = qoai_field(o, "guided_regex"), g->param = "guided_regex", n_set++;
    if (qoai_field(o, "guided_choice")) g->choice = qoai_field(o, "guided_choice"), g->param = "guided_choice", n_set++;
    if (n_set > 1)
        return qoai_fail(e, 400, INVALID, g->param,
                         "one of response_format (json), structured_outputs, json_schema, guided_json, guided_regex "
                         "and guided_choice at a time");
    return 0;
}

/* The output's grammar from g, compiled under the request's budget (or
 * taken from the cache), into r->grammar. */
static int guided_compile(const gsource *g, const qoai_limits *lim, qoai_req *r, qoai_error *e)
{
    const char *param = g->param;
    char err[800];
    int rc;
    if (g->regex && !json_is_string(g->regex))
        return qoai_fail(e, 400, INVALID, param, "'%s' must be a string", param);
    const size_t nc = json_is_array(g->choice) ? json_array_size(g->choice) : 0;
    if (g->choice && (!nc || nc > 4096))
        return qoai_fail(e, 400, INVALID, param, "'%s' must be a list of 1 to 4096 strings", param);
    for (size_t i = 0; i < nc; i++)
        if (!json_is_string(json_array_get(g->choice, i)) || !json_string_length(json_array_get(g->choice, i)))
            return qoai_fail(e, 400, INVALID, param, "'%s' must be a list of non-empty strings", param);
    /* The same request for structure again: the grammar compiled before. */
    char *key = NULL;
    {
        json_t *k = json_pack("[s, O?, O?, O?, i]", g->any_object ? "object" : "", (json_t *)g->schema, g->regex,
                              g->choice, (int)lim->schema_flags);
        key = k ? json_dumps(k, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(k);
    }
    if (key && lim->gcache && (r->grammar = gram_cache_get(lim->gcache, key, strlen(key)))) {
        free(key);
        return 0;
    }
    if (qoai_failcache_get(lim->gfail, key, e)) {
        free(key);
        return QERR_INVAL;
    }
    gram_budget_set(&(gram_budget){ .seconds = lim->grammar_seconds });
    if (g->regex) {
        rc = gram_regex_grammar(json_string_value(g->regex), json_string_length(g->regex), &r->grammar, err, sizeof err);
    } else if (g->choice) {
        const char **s = calloc(nc, sizeof *s);
        size_t *l = calloc(nc, sizeof *l);
        rc = s && l ? 0 : QERR_NOMEM;
        for (size_t i = 0; !rc && i < nc; i++)
            s[i] = json_string_value(json_array_get(g->choice, i)), l[i] = json_string_length(json_array_get(g->choice, i));
        if (!rc) rc = gram_choice_grammar(s, l, (int)nc, &r->grammar, err, sizeof err);
        else snprintf(err, sizeof err, "out of memory");
        free(s);
        free(l);
    } else {
        json_t *obj = g->any_object ? json_pack("{s:s}", "type", "object") : NULL;
        rc = obj || g->schema ? gram_schema_compile_opts(obj ? obj : g->schema, lim->schema_flags, &r->grammar, err,
                                                         sizeof err)
                              : QERR_NOMEM;
        if (rc == QERR_NOMEM && !obj && !g->schema) snprintf(err, sizeof err, "out of memory");
        json_decref(obj);
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
    return 0;
}

/* The output's grammar from the request's structure fields (guided_source),
 * into r->grammar and r->p. */
static int guided(json_t *o, const qoai_limits *lim, qoai_req *r, qoai_error *e)
{
    gsource g = { 0 };
    int rc = guided_source(o, &g, e);
    if (!rc && g.param && (!lim || !lim->gvocab))
        rc = qoai_fail(e, 400, INVALID, g.param, "structured output needs the model's tokenizer");
    if (!rc && g.param) rc = guided_compile(&g, lim, r, e);
    json_decref(g.parsed);
    if (rc || !g.param) return rc;
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
    json_t *seed = qoai_field(o, "seed");
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
    TRY(qoai_flag(o, "ignore_eos", &b, e));
    if (rc) p->ignore_eos = b;
    TRY(qoai_flag(o, "speculative", &b, e));
    if (rc) p->no_spec = !b;

    /* logprobs: a boolean with top_logprobs in chat, the number of
     * alternatives in completions. */
    if (kind == QOAI_CHAT) {
        TRY(qoai_flag(o, "logprobs", &b, e));
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

    json_t *st = qoai_field(o, "stop");
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

    TRY(qoai_flag(o, "stream", &b, e));
    r->stream = rc && b;
    json_t *so = qoai_field(o, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return qoai_fail(e, 400, INVALID, "stream_options", "'stream_options' must be an object");
        if (!r->stream)
            return qoai_fail(e, 400, INVALID, "stream_options", "'stream_options' is only allowed when 'stream' is true");
        TRY(qoai_flag(so, "include_usage", &b, e));
        r->include_usage = rc && b;
    }
    json_t *user = qoai_field(o, "user");
    if (user && !json_is_string(user)) return qoai_fail(e, 400, INVALID, "user", "'user' must be a string");
    if ((rc = qoai_extra_params(o, kind, r, e))) return rc;
    TRY(guided(o, lim, r, e));
    rc = kind == QOAI_CHAT ? qoai_tools(o, lim, r, e) : 0;
    if (!rc && r->echo && r->tool_mode)
        return qoai_fail(e, 400, INVALID, "echo", "'echo' does not go with tools");
    return rc;
}

/* An assistant message's tool_calls with each function's arguments as
 * vLLM hands them to the template: JSON text parsed into its value (HF
 * templates write arguments with tojson, which would encode a string
 * twice).  m is the message's own copy. */
static int tool_call_args(json_t *m, size_t i, qoai_error *e)
{
    json_t *tc = json_object_get(m, "tool_calls");
    if (!tc || json_is_null(tc)) return 0;
    char prm[48];
    snprintf(prm, sizeof prm, "messages[%u].tool_calls", (unsigned)i);
    if (!json_is_array(tc)) return qoai_fail(e, 400, INVALID, prm, "%s must be an array", prm);
    json_t *copy = json_deep_copy(tc);
    if (!copy || json_object_set_new(m, "tool_calls", copy)) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    size_t j;
    json_t *call;
    json_array_foreach(copy, j, call) {
        json_t *fn = json_is_object(call) ? json_object_get(call, "function") : NULL;
        json_t *args = json_is_object(fn) ? json_object_get(fn, "arguments") : NULL;
        snprintf(prm, sizeof prm, "messages[%u].tool_calls[%u]", (unsigned)i, (unsigned)j);
        if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
            return qoai_fail(e, 400, INVALID, prm, "%s must be {\"function\": {\"name\", \"arguments\"}, ...}", prm);
        if (!json_is_string(args)) continue;
        json_error_t je;
        json_t *v = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY, &je);
        if (!v) {
            snprintf(prm, sizeof prm, "messages[%u].tool_calls[%u]", (unsigned)i, (unsigned)j);
            return qoai_fail(e, 400, INVALID, prm, "%s.function.arguments is not JSON (%s)", prm, je.text);
        }
        if (json_object_set_new(fn, "arguments", v)) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    }
    return 0;
}

/* The chat's messages as the template takes them: roles checked
 * ("developer" read as "system"), content a string, or null where a
 * message may have none; text parts joined by newlines.  A new array in
 * *out, or an error. */
int qoai_messages(json_t *msgs, json_t **out, qoai_error *e)
{
    static const char *const roles[] = { "system", "user", "assistant", "tool", "developer" };
    char prm[48];
    int rc;
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
            nc = json_string(""); /* as vLLM: templates test and join content, and null breaks several */
        }
        json_t *nm = json_copy(m);
        if (nm && (rc = tool_call_args(nm, i, e))) {
            json_decref(nm);
            json_decref(nc);
            json_decref(arr);
            return rc;
        }
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

/* The template's variables beyond the messages: tools, documents,
 * add_generation_prompt and chat_template_kwargs, into ctx; *cont gets
 * continue_final_message. */
static int chat_context(json_t *o, json_t *ctx, int *cont, qoai_error *e)
{
    int agp = 1, rc, b = 0;
    json_t *kw = qoai_field(o, "chat_template_kwargs"), *docs = qoai_field(o, "documents");
    if (kw && !json_is_object(kw))
        return qoai_fail(e, 400, INVALID, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (docs && !json_is_array(docs))
        return qoai_fail(e, 400, INVALID, "documents", "'documents' must be an array of objects");
    const char *k;
    json_t *v;
    json_object_foreach(kw, k, v) {
        static const char *const own[] = { "messages", "tools", "documents", "add_generation_prompt",
                                           "continue_final_message" };
        for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
            if (!strcmp(k, own[i]))
                return qoai_fail(e, 400, INVALID, "chat_template_kwargs",
                                 "chat_template_kwargs may not set '%s': it is a field of the request", k);
        if (json_object_set(ctx, k, v)) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    }
    if (qoai_field(o, "tools")) json_object_set(ctx, "tools", qoai_field(o, "tools")); /* checked by qoai_tools */
    if (docs) json_object_set(ctx, "documents", docs);
    *cont = 0;
    TRY(qoai_flag(o, "add_generation_prompt", &b, e));
    if (rc) agp = b;
    TRY(qoai_flag(o, "continue_final_message", &b, e));
    if (rc) *cont = b;
    if (*cont && agp)
        return qoai_fail(e, 400, INVALID, "continue_final_message",
                         "continue_final_message and add_generation_prompt cannot both be true (set "
                         "add_generation_prompt to false)");
    json_t *msgs = json_object_get(ctx, "messages");
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    if (*cont && strcmp(json_string_value(json_object_get(last, "role")), "assistant"))
        return qoai_fail(e, 400, INVALID, "continue_final_message",
                         "continue_final_message needs the last message to be the assistant's");
    return json_object_set_new(ctx, "add_generation_prompt", json_boolean(agp))
               ? qoai_fail(e, 500, "server_error", NULL, "out of memory")
               : 0;
}

/* vLLM's echo for a chat: the reply starts with the last message's content
 * when the reply continues its role (the assistant's with
 * add_generation_prompt, else the last message's own). */
static int chat_echo(json_t *ctx, qoai_req *r, qoai_error *e)
{
    json_t *msgs = json_object_get(ctx, "messages");
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1), *c = json_object_get(last, "content");
    const int agp = json_is_true(json_object_get(ctx, "add_generation_prompt"));
    if (agp && strcmp(json_string_value(json_object_get(last, "role")), "assistant")) return 0;
    if (!json_is_string(c) || !json_string_length(c)) return 0;
    if (!(r->echo_text = malloc(json_string_length(c))))
        return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    memcpy(r->echo_text, json_string_value(c), json_string_length(c));
    r->echo_len = json_string_length(c);
    return 0;
}

int qoai_chat_ids(json_t *o, const qoai_limits *lim, const qmodel *m, const qtok *tok, qoai_req *r, int *n,
                    qoai_error *e)
{
    char err[256];
    json_t *msgs = NULL;
    int rc, cont = 0;
    if (!json_object_get(o, "messages")) return qoai_fail(e, 400, INVALID, "messages", "'messages' is required");
    if ((rc = qoai_messages(json_object_get(o, "messages"), &msgs, e))) return rc;
    json_t *ctx = json_pack("{s:o}", "messages", msgs);
    if (!ctx) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    if ((rc = chat_context(o, ctx, &cont, e)) || (r->echo && (rc = chat_echo(ctx, r, e)))) {
        json_decref(ctx);
        return rc;
    }
    qchat_tmpl *t = NULL;
    char *text = NULL;
    size_t tl;
    /* --chat-template's source, else the model's own. */
    if (lim && lim->chat_template) {
        rc = qchat_compile(lim->chat_template, strlen(lim->chat_template), &t, err, sizeof err);
    } else {
        rc = qchat_for_model(m, &t, NULL, err, sizeof err);
    }
    if (!rc)
        rc = qchat_apply_tokens_ex(t, m, tok, ctx, cont ? QCHAT_CONTINUE_FINAL : 0, &text, &tl, &r->ids, n, err,
                                   sizeof err);
    if (!rc && lim) {
        r->reasoning = lim->reasoning;
        r->in_think = qoai_prompt_in_think(text, tl);
    }
    free(text);
    qchat_free(t);
    json_decref(ctx);
    if (rc == QERR_NOMEM) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    if (rc) return qoai_fail(e, 400, INVALID, cont ? "continue_final_message" : "messages", "the chat template failed: %s", err);
    return 0;
}

/* The prompt's token ids into r->ids / r->p. */
static int prompt_ids(json_t *o, qoai_kind kind, const qoai_limits *lim, const qmodel *m, const qtok *tok, qoai_req *r,
                      qoai_error *e)
{
    int n = 0, rc;
    if (kind == QOAI_CHAT) {
        if ((rc = qoai_chat_ids(o, lim, m, tok, r, &n, e))) return rc;
    } else {
        json_t *pr = json_object_get(o, "prompt");
        if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0)))
            pr = json_array_get(pr, 0);
        if (json_is_string(pr)) {
            rc = qtok_encode(tok, json_string_value(pr), json_string_length(pr),
                             (r->no_special ? 0 : QTOK_ADD_SPECIAL) | QTOK_PARSE_SPECIAL, &r->ids, &n);
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
    /* truncate_prompt_tokens: the last k tokens (-1: as many as the context holds). */
    const int ctx = m->hp.max_ctx > 0 ? m->hp.max_ctx : 1 << 30;
    const int keep = r->truncate == -1 ? ctx - 1 : r->truncate;
    if (keep > 0 && n > keep) {
        memmove(r->ids, r->ids + (n - keep), sizeof *r->ids * (size_t)keep);
        n = keep;
    }
    r->p.prompt = r->ids;
    r->p.n_prompt = n;
    /* echo (completions): the reply starts with the prompt's text. */
    if (r->echo && kind == QOAI_COMPLETION) {
        json_t *pr = json_object_get(o, "prompt");
        if (json_is_array(pr) && json_array_size(pr) == 1) pr = json_array_get(pr, 0);
        if (json_is_string(pr) && keep <= 0) {
            r->echo_len = json_string_length(pr);
            r->echo_text = malloc(r->echo_len + 1);
            if (r->echo_text) memcpy(r->echo_text, json_string_value(pr), r->echo_len);
        } else {
            rc = qtok_decode(tok, r->ids, n, QTOK_SKIP_SPECIAL, &r->echo_text, &r->echo_len);
            if (rc) r->echo_text = NULL;
        }
        if (!r->echo_text) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    }
    return 0;
}

int qoai_model_check(json_t *o, const qoai_limits *lim, qoai_error *e)
{
    json_t *mo = qoai_field(o, "model");
    if (mo && !json_is_string(mo)) return qoai_fail(e, 400, INVALID, "model", "'model' must be a string");
    if (!mo || !lim || !lim->models) return 0;
    for (const char *const *n = lim->models; *n; n++)
        if (!strcmp(*n, json_string_value(mo))) return 0;
    const int rc = qoai_fail(e, 404, INVALID, "model", "The model `%.200s` does not exist.", json_string_value(mo));
    snprintf(e->code, sizeof e->code, "model_not_found");
    return rc;
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
    else if ((rc = qoai_model_check(r->body, lim, e)))
        ;
    else if ((rc = qoai_check_fields(r->body, kind, lim ? lim->envelope : NULL, e)))
        ;
    else if (!tok)
        rc = qoai_fail(e, 400, INVALID, NULL, "this model has no tokenizer; text requests cannot be served");
    else
        rc = qoai_params(r->body, kind, lim, r, e);
    for (int i = 0; !rc && i < r->p.sp.n_logit_bias; i++)
        if (r->p.sp.logit_bias[i].id >= m->hp.n_vocab)
            rc = qoai_fail(e, 400, INVALID, "logit_bias", "logit_bias names token %d, outside the vocabulary of %d",
                           (int)r->p.sp.logit_bias[i].id, m->hp.n_vocab);
    for (int i = 0; !rc && i < r->p.n_stop_ids; i++)
        if (r->p.stop_ids[i] >= m->hp.n_vocab)
            rc = qoai_fail(e, 400, INVALID, "stop_token_ids", "stop_token_ids[%d] is outside the vocabulary of %d", i,
                           m->hp.n_vocab);
    if (!rc) rc = prompt_ids(r->body, kind, lim, m, tok, r, e);
    if (!rc) {
        json_t *mo = qoai_field(r->body, "model");
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
        if (!rc && r->p.min_tokens > r->p.max_tokens)
            rc = qoai_fail(e, 400, INVALID, "min_tokens", "'min_tokens' (%d) must be at most max_tokens (%d)",
                           r->p.min_tokens, r->p.max_tokens);
        /* No seed: a fresh one, so that the same request draws anew (OpenAI's meaning). */
        r->seeded = qoai_field(r->body, "seed") != NULL;
        if (!rc && !r->seeded) r->p.sp.seed = q_random_u64();
    }
    if (rc) qoai_req_free(r);
    return rc;
}

void qoai_req_free(qoai_req *r)
{
    if (!r) return;
    json_decref(r->body);
    free(r->ids);
    free(r->bias);
    free(r->stop_ids);
    free(r->echo_text);
    gram_free(r->grammar);
    memset(r, 0, sizeof *r);
    r->model = "";
}
