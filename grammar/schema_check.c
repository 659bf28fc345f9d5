/* schema_check.c - whether one given JSON value is an instance of a schema
 * (schema_int.h), and a value's compact text (schema.h): the compiler asks it of enum and const values, which it
 * writes out only when they satisfy everything beside them.  It reads the
 * validation keywords as Python's jsonschema does (numbers equal by value,
 * booleans apart from numbers, multipleOf in floating point, string lengths
 * in code points, patterns searched, not anchored, through PCRE2). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram_re.h"
#include "schema.h"
#include "schema_int.h"
#include "buf.h"
#include "util.h"

#define CHECK_DEPTH 64

typedef struct {
    sctx *c;
    const char *why; /* the keyword that could not be decided */
} chk;

static int check(chk *k, const json_t *s, const json_t *v, int depth);

/* JSON equality as jsonschema has it: 1 == 1.0, true != 1. */
static int same(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b)) return json_integer_value(a) == json_integer_value(b);
        return json_number_value(a) == json_number_value(b);
    }
    if (json_typeof(a) != json_typeof(b)) return 0;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b)) return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!same(json_array_get(a, i), json_array_get(b, i))) return 0;
        return 1;
    }
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b)) return 0;
        const char *key;
        json_t *x;
        json_object_foreach((json_t *)a, key, x)
        {
            const json_t *y = json_object_get(b, key);
            if (!y || !same(x, y)) return 0;
        }
        return 1;
    }
    return json_equal((json_t *)a, (json_t *)b);
}

static int is_type(const json_t *v, const char *t)
{
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, FRACTION_TYPE)) return json_is_number(v) && !is_type(v, "integer");
    if (!strcmp(t, "integer"))
        return json_is_integer(v) || (json_is_real(v) && isfinite(json_real_value(v)) &&
                                      json_real_value(v) == floor(json_real_value(v)));
    return 0;
}

/* Code points of a UTF-8 string. */
static size_t code_points(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* 1 when pattern p finds a match in s, 0 when not, -1 when PCRE2 cannot
 * compile it or gives up. */
int sc_search(const char *p, size_t pn, const char *s, size_t n)
{
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p, pn, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!re) return -1;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    int out = -1;
    if (md && mc) {
        pcre2_set_match_limit(mc, 1000000);
        const int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, mc);
        out = rc >= 0 ? 1 : rc == PCRE2_ERROR_NOMATCH ? 0 : -1;
    }
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return out;
}

/* A string against a format: 1, 0, or -1 (a format of the specification
 * this check cannot decide).  Formats no specification defines only
 * annotate (as in jsonschema). */
static int format_ok(chk *k, const char *f, const json_t *v)
{
    if (!strcmp(f, "regex")) {
        const int r = sc_search(json_string_value(v), json_string_length(v), "", 0);
        return r >= 0;
    }
    if (sc_format_refused(f)) {
        k->why = "format";
        return -1;
    }
    const char *p = sc_format_pattern(f);
    if (!p) return 1;
    /* The format's automaton, compiled once a compile (kept in the context). */
    sctx *c = k->c;
    int at = 0;
    while (at < SC_FORMATS && c->fmt_pat[at] && c->fmt_pat[at] != p) at++;
    if (at < SC_FORMATS && !c->fmt_pat[at]) {
        char err[200];
        if (!gram_re_compile(p, strlen(p), GRAM_RE_JSON_STRING | GRAM_RE_FULL, &c->fmt_re[at], err, sizeof err))
            c->fmt_pat[at] = p;
    }
    const gram_re *re = at < SC_FORMATS && c->fmt_pat[at] == p ? c->fmt_re[at] : NULL;
    /* The format automata read JSON-string bytes: v's text, quotes cut. */
    char *text = re ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    int out = -1;
    if (text) out = gram_re_match(re, text + 1, strlen(text) - 2);
    if (text) sc_dumps_free(text);
    if (out < 0) k->why = "format";
    return out;
}

/* multipleOf as jsonschema computes it. */
static int multiple_ok(const json_t *m, const json_t *v)
{
    if (json_is_integer(m) && json_is_integer(v))
        return json_integer_value(m) != 0 && json_integer_value(v) % json_integer_value(m) == 0;
    const double d = json_number_value(m), x = json_number_value(v);
    if (!(d > 0)) return 0;
    if (json_is_integer(m)) return fmod(x, d) == 0;
    const double q = x / d;
    return isfinite(q) && q == trunc(q);
}

/* The number keywords (draft 4's boolean exclusive forms included). */
static int number_ok(const json_t *s, const json_t *v)
{
    const double x = json_number_value(v);
    const json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
    const json_t *emn = json_object_get(s, "exclusiveMinimum"), *emx = json_object_get(s, "exclusiveMaximum");
    if (json_is_number(mn) && (json_is_true(emn) ? x <= json_number_value(mn) : x < json_number_value(mn))) return 0;
    if (json_is_number(mx) && (json_is_true(emx) ? x >= json_number_value(mx) : x > json_number_value(mx))) return 0;
    if (json_is_number(emn) && x <= json_number_value(emn)) return 0;
    if (json_is_number(emx) && x >= json_number_value(emx)) return 0;
    const json_t *mo = json_object_get(s, "multipleOf");
    return !json_is_number(mo) || multiple_ok(mo, v);
}

static int string_ok(chk *k, const json_t *s, const json_t *v)
{
    const size_t len = code_points(json_string_value(v), json_string_length(v));
    const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    if (json_is_number(mn) && (double)len < json_number_value(mn)) return 0;
    if (json_is_number(mx) && (double)len > json_number_value(mx)) return 0;
    const json_t *p = json_object_get(s, "pattern"), *f = json_object_get(s, "format");
    if (json_is_string(p)) {
        const int r = sc_search(json_string_value(p), json_string_length(p), json_string_value(v), json_string_length(v));
        if (r < 0) k->why = "pattern";
        if (r <= 0) return r;
    }
    return json_is_string(f) ? format_ok(k, json_string_value(f), v) : 1;
}

/* Folds one result into an "all must hold" answer: 0 wins over -1. */
static int both(int acc, int r) { return acc == 0 || r == 0 ? 0 : acc < 0 || r < 0 ? -1 : 1; }

static int array_ok(chk *k, const json_t *s, const json_t *v, int depth)
{
    const size_t n = json_array_size(v);
    const json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    if (json_is_number(mn) && (double)n < json_number_value(mn)) return 0;
    if (json_is_number(mx) && (double)n > json_number_value(mx)) return 0;
    if (json_is_true(json_object_get(s, "uniqueItems")))
        for (size_t i = 0; i < n; i++)
            for (size_t j = i + 1; j < n; j++)
                if (same(json_array_get(v, i), json_array_get(v, j))) return 0;
    /* Positional schemas: prefixItems (then items), or items as a list (then
     * additionalItems). */
    const json_t *items = json_object_get(s, "items"), *pre = json_object_get(s, "prefixItems"), *rest = items;
    if (json_is_array(items)) pre = items, rest = json_object_get(s, "additionalItems");
    int acc = 1;
    for (size_t i = 0; i < n && acc; i++) {
        const json_t *sub = json_is_array(pre) && i < json_array_size(pre) ? json_array_get(pre, i) : rest;
        if (sub) acc = both(acc, check(k, sub, json_array_get(v, i), depth + 1));
    }
    const json_t *ct = json_object_get(s, "contains");
    if (ct && acc) {
        const json_t *mnc = json_object_get(s, "minContains"), *mxc = json_object_get(s, "maxContains");
        size_t hits = 0;
        for (size_t i = 0; i < n; i++) {
            const int r = check(k, ct, json_array_get(v, i), depth + 1);
            if (r < 0) return -1;
            hits += (size_t)r;
        }
        const double lo = json_is_number(mnc) ? json_number_value(mnc) : 1;
        if ((double)hits < lo || (json_is_number(mxc) && (double)hits > json_number_value(mxc))) return 0;
    }
    return acc;
}

static int object_ok(chk *k, const json_t *s, const json_t *v, int depth)
{
    const size_t n = json_object_size(v);
    const json_t *mn = json_object_get(s, "minProperties"), *mx = json_object_get(s, "maxProperties");
    if (json_is_number(mn) && (double)n < json_number_value(mn)) return 0;
    if (json_is_number(mx) && (double)n > json_number_value(mx)) return 0;
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(s, "required"), i, x) if (json_is_string(x) && !json_object_get(v, json_string_value(x))) return 0;
    const json_t *props = json_object_get(s, "properties"), *pp = json_object_get(s, "patternProperties");
    const json_t *addl = json_object_get(s, "additionalProperties"), *pn = json_object_get(s, "propertyNames");
    const json_t *deps[3] = { json_object_get(s, "dependencies"), json_object_get(s, "dependentRequired"),
                              json_object_get(s, "dependentSchemas") };
    int acc = 1;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val)
    {
        if (!acc) break;
        const json_t *ps = json_object_get(props, key);
        int matched = ps != NULL;
        if (ps) acc = both(acc, check(k, ps, val, depth + 1));
        const char *pk;
        json_t *pv;
        json_object_foreach((json_t *)pp, pk, pv)
        {
            const int r = sc_search(pk, strlen(pk), key, strlen(key));
            if (r < 0) k->why = "patternProperties";
            if (r) acc = both(acc, r < 0 ? -1 : check(k, pv, val, depth + 1));
            matched |= r > 0;
        }
        if (!matched && addl) acc = both(acc, check(k, addl, val, depth + 1));
        if (pn) {
            json_t *name = json_string(key);
            acc = both(acc, name ? check(k, pn, name, depth + 1) : -1);
            json_decref(name);
        }
        for (int d = 0; d < 3; d++) {
            const json_t *dv = json_object_get(deps[d], key);
            if (json_is_array(dv)) {
                json_array_foreach(dv, i, x) if (json_is_string(x) && !json_object_get(v, json_string_value(x))) return 0;
            } else if (dv) {
                acc = both(acc, check(k, dv, v, depth + 1));
            }
        }
    }
    return acc;
}

/* The keywords this check reads or knows to only annotate; others are
 * ignored as jsonschema ignores them, but those below cannot be decided. */
static const char *const UNDECIDED[] = { "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef" };

static int check(chk *k, const json_t *s, const json_t *v, int depth)
{
    if (json_is_boolean(s)) return json_is_true(s);
    if (!json_is_object(s)) {
        k->why = "a schema that is not an object";
        return -1;
    }
    if (depth > CHECK_DEPTH) {
        k->why = "$ref (nested too deep)";
        return -1;
    }
    for (size_t i = 0; i < sizeof UNDECIDED / sizeof UNDECIDED[0]; i++)
        if (json_object_get(s, UNDECIDED[i])) {
            k->why = UNDECIDED[i];
            return -1;
        }
    int acc = 1;
    const json_t *ref = json_object_get(s, "$ref");
    if (json_is_string(ref)) {
        const json_t *t = sc_resolve(k->c, json_string_value(ref));
        if (!t) {
            k->why = "$ref";
            return -1;
        }
        acc = check(k, t, v, depth + 1);
        if (!acc) return 0;
    }
    const json_t *type = json_object_get(s, "type");
    if (type && !(json_is_null(v) && json_is_true(json_object_get(s, "nullable")))) {
        int ok = 0;
        for (size_t i = 0; i < (json_is_array(type) ? json_array_size(type) : 1); i++) {
            const char *t = json_string_value(json_is_array(type) ? json_array_get(type, i) : type);
            ok |= t && is_type(v, t);
        }
        if (!ok) return 0;
    }
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (cn && !same(cn, v)) return 0;
    if (json_is_array(en)) {
        int in = 0;
        for (size_t i = 0; i < json_array_size(en) && !in; i++) in = same(json_array_get(en, i), v);
        if (!in) return 0;
    }
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(s, NOT_KEY), i, x) /* kept negations: {pattern} or {enum} */
    {
        const int r = check(k, x, v, depth + 1);
        acc = both(acc, r < 0 ? -1 : !r);
    }
    if (json_is_number(v) && !json_is_boolean(v)) acc = both(acc, number_ok(s, v));
    else if (json_is_string(v)) acc = both(acc, string_ok(k, s, v));
    else if (json_is_array(v)) acc = both(acc, array_ok(k, s, v, depth));
    else if (json_is_object(v)) acc = both(acc, object_ok(k, s, v, depth));
    if (!acc) return 0;
    json_array_foreach(json_object_get(s, "allOf"), i, x) acc = both(acc, check(k, x, v, depth + 1));
    const char *alts[2] = { "anyOf", "oneOf" };
    for (int a = 0; a < 2 && acc; a++) {
        const json_t *list = json_object_get(s, alts[a]);
        if (!json_is_array(list)) continue;
        int hits = 0, unknown = 0;
        json_array_foreach(list, i, x)
        {
            const int r = check(k, x, v, depth + 1);
            hits += r > 0, unknown |= r < 0;
        }
        const int r = a == 0 ? (hits ? 1 : unknown ? -1 : 0) : (unknown ? (hits > 1 ? 0 : -1) : hits == 1);
        acc = both(acc, r);
    }
    const json_t *nt = json_object_get(s, "not");
    if (nt && acc) {
        const int r = check(k, nt, v, depth + 1);
        acc = both(acc, r < 0 ? -1 : !r);
    }
    const json_t *cond = json_object_get(s, "if");
    if (cond && acc) {
        const int r = check(k, cond, v, depth + 1);
        const json_t *then = json_object_get(s, r ? "then" : "else");
        acc = r < 0 ? -1 : then ? both(acc, check(k, then, v, depth + 1)) : acc;
    }
    return acc;
}

void sc_check_free(sctx *c)
{
    for (int i = 0; i < SC_FORMATS; i++) gram_re_free(c->fmt_re[i]), c->fmt_re[i] = NULL, c->fmt_pat[i] = NULL;
}

int sc_check(sctx *c, const json_t *s, const json_t *v, const char **why)
{
    chk k = { c, NULL };
    const int r = check(&k, s, v, 0);
    if (why) *why = k.why ? k.why : "?";
    return r < 0 ? -1 : r;
}

/* ---- compact text ------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
    int bad;
} tbuf;

static void tput(tbuf *b, const char *s, size_t n)
{
    if (!b->bad && q_append(&b->p, &b->n, &b->cap, s, n)) b->bad = 1;
}

static void text_of(tbuf *b, const json_t *v)
{
    char tmp[40];
    if (json_is_real(v)) {
        const double d = json_real_value(v);
        snprintf(tmp, sizeof tmp, "%.*g", sc_shortest_digits(d), d);
        if (!strpbrk(tmp, ".eEn")) strcat(tmp, ".0");
        tput(b, tmp, strlen(tmp));
    } else if (json_is_array(v)) {
        tput(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) tput(b, ",", 1);
            text_of(b, json_array_get(v, i));
        }
        tput(b, "]", 1);
    } else if (json_is_object(v)) {
        tput(b, "{", 1);
        const char *key;
        json_t *x;
        int first = 1;
        json_object_foreach((json_t *)v, key, x)
        {
            if (!first) tput(b, ",", 1);
            first = 0;
            json_t *ks = json_string(key);
            text_of(b, ks);
            json_decref(ks);
            tput(b, ":", 1);
            text_of(b, x);
        }
        tput(b, "}", 1);
    } else {
        char *s = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        if (!s) b->bad = 1;
        /* \u escapes in lower case, as the grammars write them (jansson
         * writes upper case: a control character's string was written in
         * a form no grammar takes). */
        for (char *e = s; e && *e; e++)
            if (*e == '\\' && *++e == 'u')
                for (int i = 0; i < 4 && e[1]; i++) e++, *e = (char)(*e >= 'A' && *e <= 'F' ? *e + 32 : *e);
        if (s) tput(b, s, strlen(s));
        if (s) sc_dumps_free(s);
    }
}

char *gram_json_text(const json_t *v)
{
    tbuf b = { 0 };
    text_of(&b, v);
    if (!b.bad && !b.p) tput(&b, "", 0);
    if (b.bad) free(b.p);
    return b.bad ? NULL : b.p;
}
