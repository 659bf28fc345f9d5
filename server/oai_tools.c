/* oai_tools.c - OpenAI's tools (oai.h): tools and tool_choice checked and
 * turned into the output's grammar (schema.h's call form), and the output
 * read back as content and tool_calls, whole or as stream deltas. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"
#include "oai.h"
#include "oai_int.h"
#include "qerr.h"
#include "schema.h"
#include "buf.h"
#include "util.h"

#define INVALID "invalid_request_error"
#define MAX_TOOLS 128


/* A function name as OpenAI allows them: 1 to 64 of [A-Za-z0-9_.-]. */
static int good_name(const char *s, size_t n)
{
    if (n < 1 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-' || s[i] == '.'))
            return 0;
    return 1;
}

/* tools[i]'s function (checked): its name and parameters into *t. */
static int one_tool(json_t *tl, size_t i, gram_tool *t, qoai_error *e)
{
    char prm[48];
    snprintf(prm, sizeof prm, "tools[%zu]", i);
    json_t *ty = json_is_object(tl) ? json_object_get(tl, "type") : NULL;
    json_t *fn = json_is_object(tl) ? json_object_get(tl, "function") : NULL;
    if (!json_is_string(ty) || strcmp(json_string_value(ty), "function") || !json_is_object(fn))
        return qoai_fail(e, 400, INVALID, prm, "%s must be {\"type\": \"function\", \"function\": {\"name\", ...}}",
                         prm);
    json_t *nm = json_object_get(fn, "name"), *pa = qoai_field(fn, "parameters"), *de = qoai_field(fn, "description");
    snprintf(prm, sizeof prm, "tools[%zu].function.name", i);
    if (!json_is_string(nm) || !good_name(json_string_value(nm), json_string_length(nm)))
        return qoai_fail(e, 400, INVALID, prm, "%s must be 1 to 64 letters, digits, '_', '-' or '.'", prm);
    snprintf(prm, sizeof prm, "tools[%zu].function.parameters", i);
    if (pa && !json_is_object(pa) && !json_is_boolean(pa))
        return qoai_fail(e, 400, INVALID, prm, "%s must be a JSON Schema (an object)", prm);
    if (de && !json_is_string(de)) {
        snprintf(prm, sizeof prm, "tools[%zu].function.description", i);
        return qoai_fail(e, 400, INVALID, prm, "%s must be a string", prm);
    }
    *t = (gram_tool){ json_string_value(nm), json_string_length(nm), pa };
    return 0;
}

/* Parameters of a function that names none: an object, as OpenAI reads it. */
static json_t *no_params(void) { return json_pack("{s:s}", "type", "object"); }

/* The request's grammar over the tools' vocabulary: where the form's
 * markers are special tokens, the output keeps them (the reader needs
 * them; no other special token can come, the grammar masks them). */
static void tools_vocab(const qoai_limits *lim, qoai_req *r)
{
    r->p.grammar = r->grammar;
    r->p.grammar_vocab = lim->gvocab_tools ? lim->gvocab_tools : lim->gvocab;
    if (lim->gvocab_tools) r->p.keep_special = 1;
}

int qoai_tools(json_t *o, const qoai_limits *lim, qoai_req *r, qoai_error *e)
{
    json_t *tools = qoai_field(o, "tools"), *choice = qoai_field(o, "tool_choice"), *par = qoai_field(o, "parallel_tool_calls");
    if (tools && !json_is_array(tools)) return qoai_fail(e, 400, INVALID, "tools", "'tools' must be an array");
    if (par && !json_is_boolean(par))
        return qoai_fail(e, 400, INVALID, "parallel_tool_calls", "'parallel_tool_calls' must be true or false");
    const size_t n = tools ? json_array_size(tools) : 0;
    if (n > MAX_TOOLS) return qoai_fail(e, 400, INVALID, "tools", "at most %d tools a request", MAX_TOOLS);
    /* The mode: none without tools, auto by default with them. */
    int mode = n ? QOAI_TOOLS_AUTO : QOAI_TOOLS_OFF;
    const char *named = NULL;
    if (json_is_string(choice)) {
        const char *c = json_string_value(choice);
        if (!strcmp(c, "none")) mode = QOAI_TOOLS_OFF;
        else if (!strcmp(c, "auto")) mode = n ? QOAI_TOOLS_AUTO : QOAI_TOOLS_OFF;
        else if (!strcmp(c, "required")) mode = QOAI_TOOLS_REQUIRED;
        else
            return qoai_fail(e, 400, INVALID, "tool_choice",
                             "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": "
                             "{\"name\": ...}}; '%s' is none of them",
                             c);
    } else if (choice) {
        json_t *fn = json_is_object(choice) ? json_object_get(choice, "function") : NULL;
        json_t *nm = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        json_t *ty = json_is_object(choice) ? json_object_get(choice, "type") : NULL;
        if (!json_is_string(nm) || (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "function"))))
            return qoai_fail(e, 400, INVALID, "tool_choice",
                             "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": "
                             "{\"name\": ...}}");
        mode = QOAI_TOOLS_NAMED;
        named = json_string_value(nm);
    }
    if (mode != QOAI_TOOLS_OFF && !n)
        return qoai_fail(e, 400, INVALID, "tool_choice", "'tool_choice' needs 'tools' with at least one function");
    if (mode == QOAI_TOOLS_OFF && !n) return 0;
    gram_tool *t = calloc(n, sizeof *t);
    if (!t) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    int rc = 0, pick = -1;
    for (size_t i = 0; i < n && !rc; i++) {
        rc = one_tool(json_array_get(tools, i), i, &t[i], e);
        for (size_t k = 0; !rc && k < i; k++)
            if (t[k].name_len == t[i].name_len && !memcmp(t[k].name, t[i].name, t[i].name_len)) {
                char prm[48];
                snprintf(prm, sizeof prm, "tools[%zu].function.name", i);
                rc = qoai_fail(e, 400, INVALID, prm, "two tools are named '%s'", t[i].name);
            }
        if (!rc && named && !strcmp(named, t[i].name)) pick = (int)i;
    }
    if (!rc && named && pick < 0)
        rc = qoai_fail(e, 400, INVALID, "tool_choice", "tool_choice names '%.64s', which is not among 'tools'", named);
    if (!rc && mode != QOAI_TOOLS_OFF && r->grammar)
        rc = qoai_fail(e, 400, INVALID, "tool_choice",
                       "tool calls and response_format / guided_* cannot be asked for together; set tool_choice to "
                       "'none' for structured output");
    if (!rc && mode != QOAI_TOOLS_OFF && (!lim || !lim->gvocab))
        rc = qoai_fail(e, 400, INVALID, "tool_choice", "tool calls need the model's tokenizer");
    if (rc || mode == QOAI_TOOLS_OFF) {
        free(t);
        return rc;
    }
    r->tool_mode = mode;
    r->tool_name = named;
    const int max_calls = par && json_is_false(par) ? 1 : 0;
    /* The same tools, choice and form again: the grammar compiled before. */
    json_t *k = json_pack("[s, O, i, s?, i, i, i]", "tools", tools, mode, named, max_calls, (int)lim->schema_flags,
                          (int)lim->tool_form);
    char *key = k ? json_dumps(k, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(k);
    if (key && lim->gcache && (r->grammar = gram_cache_get(lim->gcache, key, strlen(key)))) {
        free(key);
        free(t);
        tools_vocab(lim, r);
        return 0;
    }
    if (qoai_failcache_get(lim->gfail, key, e)) {
        free(key);
        free(t);
        return QERR_INVAL;
    }
    json_t *dflt = no_params();
    for (size_t i = 0; i < n; i++)
        if (!t[i].params) t[i].params = dflt;
    char err[800];
    int bad = -1;
    gram_budget_set(&(gram_budget){ .seconds = lim->grammar_seconds });
    if (!dflt) rc = QERR_NOMEM;
    else if (mode == QOAI_TOOLS_NAMED)
        rc = gram_schema_compile_opts(t[pick].params, lim->schema_flags, &r->grammar, err, sizeof err), bad = pick;
    else {
        const gram_tools_opts go = { lim->tool_form, mode == QOAI_TOOLS_AUTO, max_calls, lim->schema_flags };
        rc = gram_tools_grammar_opts(t, (int)n, &go, &bad, &r->grammar, err, sizeof err);
    }
    gram_budget_set(NULL);
    json_decref(dflt);
    free(t);
    if (!rc && key && lim->gcache) gram_cache_put(lim->gcache, key, strlen(key), r->grammar);
    if (rc == QERR_NOMEM) {
        free(key);
        return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    }
    if (rc) {
        char prm[48];
        if (bad >= 0) snprintf(prm, sizeof prm, "tools[%d].function.parameters", bad);
        else snprintf(prm, sizeof prm, "tools");
        const int frc = qoai_fail(e, 400, INVALID, prm, "%s", err);
        qoai_failcache_put(lim->gfail, key, e);
        free(key);
        return frc;
    }
    free(key);
    tools_vocab(lim, r);
    return 0;
}

/* ---- the form a template shows ------------------------------------------------------- */

gram_tools_form qoai_tool_form_of(const char *tmpl)
{
    if (!tmpl) return GRAM_TOOLS_HERMES;
    if (strstr(tmpl, "[TOOL_CALLS]")) return GRAM_TOOLS_MISTRAL;
    if (strstr(tmpl, "<tool_call>")) return GRAM_TOOLS_HERMES;
    /* Llama 3.x: '{"name": "' + name + '", "parameters": ' + arguments, and
     * the results in an ipython turn. */
    if (strstr(tmpl, "\"parameters\": ") && strstr(tmpl, "ipython")) return GRAM_TOOLS_LLAMA3_JSON;
    return GRAM_TOOLS_HERMES;
}

/* ---- reading the output back ---------------------------------------------------------- */

/* The output goes through these states (the grammar wrote it in the
 * form's shape, so only the markers matter): text until the form's
 * trigger (llama3_json: a '{' as the first byte, else all of it is text);
 * up to the next arguments' key (a call's head, and before any but the
 * first the last call's closing marks and the separator); the arguments up
 * to the '}' that closes their call, then the next head or the end. */
typedef enum { P_TEXT, P_PLAIN, P_HEAD, P_ARGS } pstate_t;

typedef struct {
    char *name;
    char *args;
    size_t args_len, args_cap;
} call;

struct qoai_calls {
    int mode;
    const gram_tools_form_desc *form;
    char key[32];      /* "KEY": */
    size_t key_len;
    char *named;       /* QOAI_TOOLS_NAMED: the function */
    char id_prefix[64];
    pstate_t st;
    char *held;        /* P_TEXT: bytes that may begin the trigger; P_HEAD: the head so far */
    size_t held_len, held_cap;
    size_t seen;       /* P_HEAD: bytes of held already searched for the key */
    char *content;     /* the text before the calls */
    size_t content_len, content_cap;
    int depth, in_str, esc; /* P_ARGS: where the arguments' JSON is */
    call *calls;
    int n_calls, cap_calls;
    int nomem;
};

qoai_calls *qoai_calls_new(int mode, gram_tools_form form, const char *name, const char *id_prefix)
{
    qoai_calls *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->mode = mode;
    if (!(p->form = gram_tools_form_get(form))) p->form = gram_tools_form_get(GRAM_TOOLS_HERMES);
    p->key_len = (size_t)snprintf(p->key, sizeof p->key, "\"%s\":", p->form->key);
    snprintf(p->id_prefix, sizeof p->id_prefix, "%s", id_prefix ? id_prefix : "call_");
    if (mode == QOAI_TOOLS_NAMED) {
        /* The whole output is the arguments of the one call. */
        if (!(p->named = q_strdup(name ? name : ""))) {
            qoai_calls_free(p);
            return NULL;
        }
        p->st = P_ARGS;
    }
    return p;
}

void qoai_calls_free(qoai_calls *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].args);
    }
    free(p->calls);
    free(p->named);
    free(p->held);
    free(p->content);
    free(p);
}

int qoai_calls_count(const qoai_calls *p) { return p ? p->n_calls : 0; }

static void grow(qoai_calls *p, char **b, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (n && q_append(b, len, cap, s, n)) p->nomem = 1;
}

/* The delta being built: content and tool_calls parts. */
typedef struct {
    char *text;
    size_t len, cap;
    json_t *calls;
} delta;

static json_t *call_delta(delta *d, int index)
{
    if (!d->calls) d->calls = json_array();
    /* Calls come in order: the one asked for is the last listed, or new. */
    const size_t n = json_array_size(d->calls);
    json_t *c = n ? json_array_get(d->calls, n - 1) : NULL;
    if (c && json_integer_value(json_object_get(c, "index")) == index) return c;
    c = json_pack("{s:i}", "index", index);
    if (c && d->calls) json_array_append_new(d->calls, c);
    return c;
}

/* A call starts: its id, type and name (arguments to come). */
static void start_call(qoai_calls *p, delta *d, const char *name, size_t n)
{
    if (p->n_calls == p->cap_calls) {
        const int cap = p->cap_calls ? 2 * p->cap_calls : 4;
        call *c = q_reallocn(p->calls, (size_t)cap, sizeof *c);
        if (!c) {
            p->nomem = 1;
            return;
        }
        p->calls = c, p->cap_calls = cap;
    }
    call *c = &p->calls[p->n_calls++];
    memset(c, 0, sizeof *c);
    if (!(c->name = q_strndup(name, n))) p->nomem = 1;
    json_t *o = call_delta(d, p->n_calls - 1);
    char id[96];
    snprintf(id, sizeof id, "%s%d", p->id_prefix, p->n_calls - 1);
    json_t *head = json_pack("{s:s, s:s, s:{s:s%, s:s}}", "id", id, "type", "function", "function", "name", name, n,
                             "arguments", "");
    if (!o || !head || json_object_update(o, head)) p->nomem = 1;
    json_decref(head);
}

static void add_args(qoai_calls *p, delta *d, const char *s, size_t n)
{
    if (!n || !p->n_calls) return;
    call *c = &p->calls[p->n_calls - 1];
    grow(p, &c->args, &c->args_len, &c->args_cap, s, n);
    json_t *o = call_delta(d, p->n_calls - 1);
    json_t *f = o ? json_object_get(o, "function") : NULL;
    if (o && !f) json_object_set_new(o, "function", f = json_object());
    if (!f) return;
    json_t *a = json_object_get(f, "arguments");
    if (json_is_string(a)) {
        char *both = malloc(json_string_length(a) + n);
        if (!both) return;
        memcpy(both, json_string_value(a), json_string_length(a));
        memcpy(both + json_string_length(a), s, n);
        json_object_set_new(f, "arguments", json_stringn_nocheck(both, json_string_length(a) + n));
        free(both);
    } else {
        json_object_set_new(f, "arguments", json_stringn_nocheck(s, n));
    }
}

/* The first k bytes long needle in s[0..n), or NULL. */
static const char *find(const char *s, size_t n, const char *needle, size_t k)
{
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n'; }

/* The longest end of s[0..n) that begins tag (k bytes). */
static size_t tag_start(const char *s, size_t n, const char *tag, size_t k)
{
    for (size_t m = n < k - 1 ? n : k - 1; m > 0; m--)
        if (!memcmp(s + n - m, tag, m)) return m;
    return 0;
}

static void text_out(qoai_calls *p, delta *d, const char *s, size_t n)
{
    grow(p, &p->content, &p->content_len, &p->content_cap, s, n);
    grow(p, &d->text, &d->len, &d->cap, s, n);
}

/* The arguments' key in b[pos..len), searched once: what an earlier feed
 * searched (less a key's length) is not searched again. */
static const char *find_key(qoai_calls *p, const char *b, size_t pos, size_t len)
{
    const size_t from = p->seen >= p->key_len ? pos + p->seen - p->key_len + 1 : pos;
    const char *k = from < len ? find(b + from, len - from, p->key, p->key_len) : NULL;
    p->seen = k ? 0 : len - pos;
    return k;
}

/* P_HEAD: {"name": NAME, "KEY": - the call starts once its key is in;
 * 0 when it is not yet. */
static int head(qoai_calls *p, delta *d, const char *b, size_t *pos, size_t len)
{
    const char *k = find_key(p, b, *pos, len);
    if (!k) return 0;
    const char *nm = find(b + *pos, (size_t)(k - b) - *pos, "\"name\":", 7);
    json_t *name = nm ? json_loadb(nm + 7, (size_t)(k - nm - 7), JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    const int ok = json_is_string(name);
    start_call(p, d, ok ? json_string_value(name) : "", ok ? json_string_length(name) : 0);
    json_decref(name);
    *pos = (size_t)(k - b) + p->key_len;
    p->st = P_ARGS;
    p->depth = p->in_str = p->esc = 0;
    return 1;
}

/* P_ARGS: up to the '}' that closes the call around them (named: all of
 * the output); 0 when it has not come yet. */
static int args(qoai_calls *p, delta *d, const char *b, size_t *pos, size_t len)
{
    if (p->named && !p->n_calls) start_call(p, d, p->named, strlen(p->named));
    /* The space after the key ("KEY": ARGS) is not the arguments'. */
    if (p->n_calls && !p->calls[p->n_calls - 1].args_len)
        while (*pos < len && is_space(b[*pos])) (*pos)++;
    size_t i = *pos;
    int end = 0;
    for (; i < len && !end; i++) {
        const char ch = b[i];
        if (p->in_str) {
            if (p->esc) p->esc = 0;
            else if (ch == '\\') p->esc = 1;
            else if (ch == '"') p->in_str = 0;
        } else if (ch == '"') {
            p->in_str = 1;
        } else if (ch == '{' || ch == '[') {
            p->depth++;
        } else if (ch == '}' || ch == ']') {
            if (p->depth == 0 && p->mode != QOAI_TOOLS_NAMED) end = 1;
            else p->depth--;
        }
    }
    add_args(p, d, b + *pos, (end ? i - 1 : i) - *pos);
    *pos = i;
    if (end) p->st = P_HEAD;
    return end;
}

/* Bytes s[0..n) in the current state; last: the output ends after them.
 * They join what was held back, and one pass over that buffer goes through
 * the states (linear in the bytes however many calls they hold); what may
 * still be the start of the trigger, or a call's head so far, stays held. */
static void step(qoai_calls *p, delta *d, const char *s, size_t n, int last)
{
    grow(p, &p->held, &p->held_len, &p->held_cap, s, n);
    if (p->nomem || !p->held_len) return;
    const char *b = p->held, *trig = p->form->trigger;
    const size_t len = p->held_len, tlen = trig ? strlen(trig) : 0;
    size_t pos = 0;
    for (int more = 1; more && !p->nomem;) {
        if (p->st == P_PLAIN) {
            text_out(p, d, b + pos, len - pos);
            pos = len;
            more = 0;
        } else if (p->st == P_TEXT && !trig) {
            /* The first byte decides: a call, or text. */
            if (pos == len) break;
            p->st = b[pos] == '{' && !p->content_len ? P_HEAD : P_PLAIN;
        } else if (p->st == P_TEXT) {
            const char *at = find(b + pos, len - pos, trig, tlen);
            const size_t upto = at ? (size_t)(at - b) : len - (last ? 0 : tag_start(b + pos, len - pos, trig, tlen));
            text_out(p, d, b + pos, upto - pos);
            pos = upto;
            if (!at) break;
            pos += tlen; /* the trigger: what follows is the first call's head */
            p->st = P_HEAD;
        } else if (p->st == P_HEAD) {
            more = head(p, d, b, &pos, len);
        } else {
            more = args(p, d, b, &pos, len);
        }
    }
    if (p->nomem || !pos) return;
    memmove(p->held, p->held + pos, len - pos);
    p->held_len = len - pos;
}

int qoai_calls_complete(const qoai_calls *p)
{
    if (!p || !p->n_calls) return 0;
    if (p->mode == QOAI_TOOLS_NAMED) return !p->in_str && p->depth == 0 && p->calls[0].args_len > 0;
    return p->st == P_HEAD; /* past a call's closing '}' (and not inside the next one's arguments) */
}

int qoai_calls_failed(const qoai_calls *p) { return p && p->nomem; }

json_t *qoai_calls_feed(qoai_calls *p, const char *s, size_t n, int last)
{
    delta d = { 0 };
    step(p, &d, s, n, last);
    json_t *o = NULL;
    if (!p->nomem && (d.len || d.calls)) {
        o = json_object();
        if (o && d.len) json_object_set_new(o, "content", json_stringn_nocheck(d.text, d.len));
        if (o && d.calls) json_object_set(o, "tool_calls", d.calls);
    }
    free(d.text);
    json_decref(d.calls);
    return o;
}

json_t *qoai_calls_message(qoai_calls *p)
{
    if (p->named && !p->n_calls) {
        delta d = { 0 };
        start_call(p, &d, p->named, strlen(p->named)); /* an empty output: the call still is one */
        json_decref(d.calls);
    }
    /* Content: the text before the calls, null when it is only white space. */
    size_t a = 0, b = p->content_len;
    while (a < b && is_space(p->content[a])) a++;
    while (b > a && is_space(p->content[b - 1])) b--;
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                          b > a ? json_stringn_nocheck(p->content, p->content_len) : json_null());
    if (!m || !p->n_calls) return m;
    json_t *arr = json_array();
    for (int i = 0; arr && i < p->n_calls; i++) {
        char id[96];
        snprintf(id, sizeof id, "%s%d", p->id_prefix, i);
        json_array_append_new(arr, json_pack("{s:s, s:s, s:{s:s, s:s%}}", "id", id, "type", "function", "function",
                                             "name", p->calls[i].name ? p->calls[i].name : "", "arguments",
                                             p->calls[i].args ? p->calls[i].args : "", p->calls[i].args_len));
    }
    if (!arr || json_object_set_new(m, "tool_calls", arr)) {
        json_decref(m);
        return NULL;
    }
    return m;
}
