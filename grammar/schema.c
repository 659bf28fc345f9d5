/* schema.c - JSON Schema to a grammar (schema.h).
 *
 * One walk over the schema builds expressions with gram_b (gram.h):
 *
 *   sx(s)      the expression of schema s: booleans, $ref (a rule per
 *              target, so recursion works), allOf (merged into one schema
 *              first), anyOf / oneOf (alternatives, each merged with the
 *              keywords beside it), enum / const (literals), then one
 *              alternative a type: with "type" absent every type is
 *              possible and each takes the keywords that apply to it;
 *   obj_x      properties in schema order; required ones always, optional
 *              ones may be skipped; commas placed by two rules a position
 *              ("first so far" and "after one"), so nothing is expanded twice;
 *   arr_x      prefix items then the rest, counts from minItems / maxItems;
 *   sc_str     (schema_scalar.c) pattern, format or length bounds over
 *              JSON-string bytes;
 *   sc_num     (schema_scalar.c) integers and integer-bounded numbers as
 *              digit patterns, multiples as residues.
 * "not" is said another way where it can be (not_rewrite); tool calls and
 * the API's regex and choice constraints are grammars of their own here.
 *
 * Shared pieces (any value, any string, numbers) are rules made once.
 * Keywords that cannot be enforced are errors with the JSON pointer of the
 * schema that holds them. */
#include "schema.h"
#include "schema_int.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qerr.h"
#include "gram_re.h"
#include "buf.h"
#include "util.h"


gram_x sc_fail(sctx *c, int rc, const char *fmt, ...)
{
    if (!c->rc) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        c->rc = rc;
        snprintf(c->err, sizeof c->err, "%s (at %s)", msg, c->path[0] ? c->path : "#");
    }
    return c->rc;
}


/* Alternation that treats "none yet" (-1000) as nothing. */
static gram_x alt_add(sctx *c, gram_x acc, gram_x x)
{
    if (x < 0) return x;
    return acc == NONE ? x : ALT(acc, x);
}

gram_x sc_none(sctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->none_why, sizeof c->none_why, fmt, ap);
    va_end(ap);
    return NONE;
}

gram_x sc_re(sctx *c, const char *pattern, unsigned flags)
{
    return gram_b_regex(B, pattern, strlen(pattern), flags);
}

/* A rule whose body is x: references to it expand x once. */
static gram_x as_rule(sctx *c, const char *name, gram_x x)
{
    if (x < 0) return x;
    const int r = gram_b_rule(B, name);
    if (r < 0 || gram_b_define(B, r, x)) return sc_fail(c, QERR_NOMEM, "out of memory");
    return gram_b_ref(B, r);
}

/* The compact JSON text of v, as a literal.  A whole number may be written
 * either way, 2 or 2.0 (equal values: JSON readers that keep the
 * difference write a float with its ".0"). */
static gram_x literal(sctx *c, const json_t *v)
{
    char *s = gram_json_text(v);
    if (!s) return sc_fail(c, QERR_NOMEM, "out of memory");
    gram_x x = LIT(s);
    const double d = json_number_value(v);
    if (json_is_integer(v) && json_integer_value(v) > -10000000000000000LL && json_integer_value(v) < 10000000000000000LL) {
        x = ALT(x, SEQ(LIT(s), LIT(".0")));
    } else if (json_is_real(v) && fabs(d) < 1e16 && d == floor(d) && !(d == 0 && signbit(d))) {
        char t[40];
        snprintf(t, sizeof t, "%lld", (long long)d);
        x = ALT(LIT(t), SEQ(LIT(t), LIT(".0")));
    }
    free(s);
    return x;
}

/* ---- keywords --------------------------------------------------------------------- */

/* Validation keywords quire cannot enforce: an error, never ignored. */
static const char *const REFUSED[] = { "contains",
                                       "minContains", "maxContains", "unevaluatedProperties", "unevaluatedItems",
                                       "$dynamicRef", "$recursiveRef" };

/* Keywords that only annotate: they never count as constraints. */
static const char *const ANNOTATIONS[] = { "title", "description", "default", "examples", "example", "$schema",
                                           "$id", "id", "$comment", "readOnly", "writeOnly", "deprecated",
                                           "contentMediaType", "contentEncoding", "$defs", "definitions", "$anchor",
                                           CLOSED_OBJ, CLOSED_TUPLE };

/* The keywords this compiler reads. */
static const char *const KNOWN[] = { "type", "properties", "required", "additionalProperties", "items", "prefixItems",
                                     "additionalItems", "minItems", "maxItems", "enum", "const", "anyOf", "oneOf",
                                     "allOf", "$ref", "pattern", "format", "minLength", "maxLength", "minimum",
                                     "maximum", "exclusiveMinimum", "exclusiveMaximum", "nullable", "multipleOf",
                                     "minProperties", "maxProperties", "uniqueItems", "patternProperties", "not",
                                     "dependencies", "dependentRequired", "dependentSchemas", "propertyNames", "if", "then",
                                     "else", NOT_KEY };

static int in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, list[i])) return 1;
    return 0;
}
#define IN(k, L) in_list(k, L, sizeof L / sizeof L[0])

int sc_is_annotation(const char *k) { return IN(k, ANNOTATIONS); }
int sc_is_keyword(const char *k) { return IN(k, KNOWN) || IN(k, REFUSED); }

/* 1 when s has a constraint besides skip1 and skip2 (NULL: none). */
int sc_constrains(const json_t *s, const char *skip1, const char *skip2)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v)
    {
        if ((skip1 && !strcmp(k, skip1)) || (skip2 && !strcmp(k, skip2))) continue;
        if (IN(k, KNOWN) || IN(k, REFUSED)) return 1;
    }
    return 0;
}

/* ---- $ref ------------------------------------------------------------------------- */

/* The schema a local reference names ("#", "#/definitions/x", with ~0 ~1
 * and %-escapes), or NULL. */
/* The subschema of s whose "$id", "id" or "$anchor" names fragment f
 * ("#name"), depth first; NULL when none.  Values (enum, const, default,
 * examples) are data, not schemas: an "$anchor" there names nothing. */
static const json_t *find_anchor(const json_t *s, const char *f, int depth)
{
    if (depth > 100) return NULL;
    if (json_is_object(s)) {
        const char *id = json_string_value(json_object_get(s, "$id"));
        if (!id) id = json_string_value(json_object_get(s, "id"));
        const char *an = json_string_value(json_object_get(s, "$anchor"));
        if ((id && !strcmp(id, f)) || (an && !strcmp(an, f + 1))) return s;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)s, k, v)
        {
            static const char *const DATA[] = { "enum", "const", "default", "examples", "example" };
            if (IN(k, DATA)) continue;
            const json_t *r = find_anchor(v, f, depth + 1);
            if (r) return r;
        }
    } else if (json_is_array(s)) {
        size_t i;
        json_t *v;
        json_array_foreach(s, i, v)
        {
            const json_t *r = find_anchor(v, f, depth + 1);
            if (r) return r;
        }
    }
    return NULL;
}

const json_t *sc_resolve(sctx *c, const char *ref)
{
    if (ref[0] != '#') return NULL;
    if (ref[1] && ref[1] != '/') return find_anchor(c->root, ref, 0);
    const json_t *cur = c->root;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/') return NULL;
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            char ch = *p++;
            if (ch == '~' && (*p == '0' || *p == '1')) ch = *p++ == '0' ? '~' : '/';
            else if (ch == '%' && p[0] && p[1]) {
                char hex[3] = { p[0], p[1], 0 };
                ch = (char)strtol(hex, NULL, 16);
                p += 2;
            }
            tok[n++] = ch;
        }
        tok[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) {
            char *end;
            const long i = strtol(tok, &end, 10);
            cur = *end || i < 0 ? NULL : json_array_get(cur, (size_t)i);
        } else {
            return NULL;
        }
        if (!cur) return NULL;
    }
    return cur;
}

static gram_x sx(sctx *c, const json_t *s);
static gram_x sx_body(sctx *c, const json_t *s);

/* A reference to the rule of schema t (made on first use: recursion goes
 * through the rule). */
static gram_x ref_rule(sctx *c, const json_t *t)
{
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo[i].s == t) return gram_b_ref(B, c->memo[i].rule);
    const int r = gram_b_rule(B, "ref");
    if (r < 0) return sc_fail(c, QERR_NOMEM, "out of memory");
    if (c->n_memo == c->cap_memo) {
        int cap = c->cap_memo ? c->cap_memo * 2 : 16;
        struct memo *m = q_reallocn(c->memo, (size_t)cap, sizeof *m);
        if (!m) return sc_fail(c, QERR_NOMEM, "out of memory");
        c->memo = m, c->cap_memo = cap;
    }
    c->memo[c->n_memo++] = (struct memo){ t, r };
    gram_x body = sx_body(c, t);
    if (body < 0) return body;
    if (gram_b_define(B, r, body)) return sc_fail(c, QERR_NOMEM, "out of memory");
    return gram_b_ref(B, r);
}

/* s with a lone $ref replaced by its target (several in a row). */
const json_t *sc_deref(sctx *c, const json_t *s)
{
    for (int hops = 0; hops < 32 && json_is_object(s); hops++) {
        const json_t *r = json_object_get(s, "$ref");
        if (!json_is_string(r) || sc_constrains(s, "$ref", NULL)) return s;
        const json_t *t = sc_resolve(c, json_string_value(r));
        if (!t) return s;
        s = t;
    }
    return s;
}

/* ---- arrays ------------------------------------------------------------------------------ */

/* The expression of schema s at path component name (for messages). */
static gram_x sub(sctx *c, const json_t *s, const char *name)
{
    const size_t l = strlen(c->path);
    sc_put(c->path, sizeof c->path, "/%s", name);
    gram_x x = sx(c, s);
    c->path[l] = 0;
    return x;
}

static gram_x arr_x(sctx *c, const json_t *s)
{
    const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    const json_t *addl = json_object_get(s, "additionalItems");
    const json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    const json_t *uniq = json_object_get(s, "uniqueItems");
    const int min = sc_count_of(mn, 0), max = sc_count_of(mx, -1);
    if (min < 0 || max < -1 || (max >= 0 && max < min)) return sc_fail(c, QERR_INVAL, "minItems / maxItems out of order");
    if (min > 1000 || max > 1000) return sc_fail(c, QERR_UNSUPPORTED, "minItems / maxItems above 1000");
    if (json_is_true(uniq) && !(max >= 0 && max <= 1))
        return sc_fail(c, QERR_UNSUPPORTED, "uniqueItems cannot be enforced");
    /* The tuple part and the schema of the rest (NULL: no more items). */
    const json_t *tuple = json_is_array(prefix) ? prefix : json_is_array(items) ? items : NULL;
    const json_t *rest = json_is_array(prefix) ? items : json_is_array(items) ? addl : items;
    const int k = tuple ? (int)json_array_size(tuple) : 0;
    /* Strict mode: a tuple without a schema for the rest ends there
     * (unless minItems asks for more). */
    const int closed = tuple && json_is_true(json_object_get(s, CLOSED_TUPLE)) && min <= k;
    if (!rest) rest = closed ? json_false() : json_true();
    if (json_is_false(rest)) rest = NULL;
    if (k > 1000) return sc_fail(c, QERR_UNSUPPORTED, "more than 1000 prefixItems");
    if (!rest && min > k) return sc_fail(c, QERR_INVAL, "minItems above the items allowed");
    if (max == 0) return LIT("[]");
    gram_x rx = NONE;
    if (rest) {
        rx = as_rule(c, "item", sub(c, rest, "items"));
        if (rx < 0) return rx;
    }
    /* From the end: tail(i) = the items from position i on (i >= 1, after a comma). */
    const int last = max >= 0 && max < k ? max : k;
    gram_x tail;
    if (rest && (max < 0 || max > k)) {
        const int lo = min > k ? min - k : 0, hi = max < 0 ? -1 : max - k;
        tail = gram_b_rep(B, SEQ(LIT(","), rx), lo, hi);
    } else {
        tail = gram_b_empty(B);
    }
    for (int i = last - 1; i >= 1 && !c->rc; i--) {
        char idx[32];
        snprintf(idx, sizeof idx, "prefixItems/%d", i);
        gram_x item = sub(c, json_array_get(tuple, (size_t)i), idx);
        gram_x one = sc_seq3(c, LIT(","), item, tail);
        tail = as_rule(c, "tuple", i < min ? one : ALT(one, gram_b_empty(B)));
    }
    /* The first item: tuple[0] or the rest's. */
    gram_x body;
    if (k > 0) {
        gram_x first = sub(c, json_array_get(tuple, 0), "prefixItems/0");
        body = SEQ(first, tail);
    } else if (rest) {
        const int lo = min > 1 ? min - 1 : 0, hi = max < 0 ? -1 : max - 1;
        body = SEQ(rx, gram_b_rep(B, SEQ(LIT(","), rx), lo, hi));
    } else {
        return LIT("[]");
    }
    if (min == 0) body = ALT(body, gram_b_empty(B));
    return sc_seq3(c, LIT("["), body, LIT("]"));
}

/* ---- objects ------------------------------------------------------------------------------ */

/* Objects with at most this many properties take them in any order. */

static int in_array(const json_t *a, const char *s)
{
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) if (json_is_string(x) && !strcmp(json_string_value(x), s)) return 1;
    return 0;
}

/* *base without the strings of pre[0..n) (each step a new automaton). */
static int minus_all(gram_re **base, gram_re *const *pre, int n, char *err, size_t errlen)
{
    for (int j = 0; j < n; j++) {
        gram_re *t = NULL;
        const int rc = gram_re_minus(*base, pre[j], &t, err, errlen);
        gram_re_free(*base);
        *base = t;
        if (rc) return rc;
    }
    return 0;
}

/* "key": value, with key the content of a string. */
static gram_x member(sctx *c, gram_x key, gram_x value) { return SEQ(sc_seq3(c, LIT("\""), key, LIT("\":")), value); }


/* The names propertyNames allows, as an automaton over the JSON-string
 * form of a key (NULL in *out: any name): a schema of string keywords only
 * (pattern, minLength, maxLength, format, enum / const of strings).  0, or
 * an error through sc_fail(). */
static int names_dfa(sctx *c, const json_t *pn, gram_re **out)
{
    *out = NULL;
    pn = sc_deref(c, pn);
    if (!pn || json_is_true(pn) || (json_is_object(pn) && !sc_constrains(pn, NULL, NULL))) return 0;
    if (!json_is_object(pn)) return sc_fail(c, QERR_UNSUPPORTED, "propertyNames false (no property at all) is not supported");
    static const char *const ok[] = { "pattern", "minLength", "maxLength", "format", "enum", "const", "type" };
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)pn, k, v) if (IN(k, KNOWN) && !IN(k, ok))
        return sc_fail(c, QERR_UNSUPPORTED, "propertyNames with '%s' is not supported", k);
    const json_t *ty = json_object_get(pn, "type");
    if (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "string")))
        return sc_fail(c, QERR_UNSUPPORTED, "propertyNames with a type other than string");
    char err[300] = "", lp[64];
    gram_re *re = NULL, *y = NULL, *t = NULL;
    const json_t *pat = json_object_get(pn, "pattern"), *fmt = json_object_get(pn, "format");
    const char *fp = json_is_string(fmt) ? sc_format_pattern(json_string_value(fmt)) : NULL;
    if (fmt && !fp) return sc_fail(c, QERR_UNSUPPORTED, "propertyNames: format not supported");
    int rc = gram_re_compile("[\\s\\S]*", 7, GRAM_RE_JSON_STRING | GRAM_RE_FULL, &re, err, sizeof err);
    /* Each keyword narrows the names (a key is classified: no subsets here). */
    if (!rc && json_is_string(pat)) {
        rc = gram_re_compile(json_string_value(pat), json_string_length(pat), GRAM_RE_JSON_STRING, &y, err, sizeof err);
        if (!rc) rc = gram_re_intersect(re, y, &t, err, sizeof err);
        gram_re_free(y), y = NULL;
        if (!rc) gram_re_free(re), re = t, t = NULL;
    }
    if (!rc && fp) {
        rc = gram_re_compile(fp, strlen(fp), GRAM_RE_JSON_STRING | GRAM_RE_FULL, &y, err, sizeof err);
        if (!rc) rc = gram_re_intersect(re, y, &t, err, sizeof err);
        gram_re_free(y), y = NULL;
        if (!rc) gram_re_free(re), re = t, t = NULL;
    }
    const int mn = sc_count_of(json_object_get(pn, "minLength"), 0), mx = sc_count_of(json_object_get(pn, "maxLength"), -1);
    if (!rc && (mn > 0 || mx >= 0)) {
        if (mn > 1000 || mx > 1000) rc = QERR_UNSUPPORTED, snprintf(err, sizeof err, "name lengths above 1000");
        else if (mx >= 0) snprintf(lp, sizeof lp, "[\\s\\S]{%d,%d}", mn, mx);
        else snprintf(lp, sizeof lp, "[\\s\\S]{%d,}", mn);
        if (!rc) rc = gram_re_compile(lp, strlen(lp), GRAM_RE_JSON_STRING | GRAM_RE_FULL, &y, err, sizeof err);
        if (!rc) rc = gram_re_intersect(re, y, &t, err, sizeof err);
        gram_re_free(y), y = NULL;
        if (!rc) gram_re_free(re), re = t, t = NULL;
    }
    const json_t *en = json_object_get(pn, "enum"), *cn = json_object_get(pn, "const");
    if (!rc && (en || cn)) {
        /* The listed names only: an alternation of the quoted strings. */
        char *alt = NULL;
        size_t al = 0, ac = 0;
        const size_t nv = cn ? 1 : json_array_size(en);
        for (size_t i = 0; !rc && i < nv; i++) {
            const json_t *x = cn ? cn : json_array_get(en, i);
            char q[2048];
            if (!json_is_string(x) || json_string_length(x) > 500) continue;
            sc_quote_re(json_string_value(x), json_string_length(x), q, sizeof q);
            if ((al && q_append(&alt, &al, &ac, "|", 1)) || q_append(&alt, &al, &ac, q, strlen(q))) rc = QERR_NOMEM;
        }
        if (!rc && !al) rc = QERR_UNSUPPORTED, snprintf(err, sizeof err, "propertyNames: no string in its enum");
        if (!rc) rc = gram_re_compile(alt, al, GRAM_RE_JSON_STRING | GRAM_RE_FULL, &y, err, sizeof err);
        free(alt);
        if (!rc) rc = gram_re_intersect(re, y, &t, err, sizeof err);
        gram_re_free(y), y = NULL;
        if (!rc) gram_re_free(re), re = t, t = NULL;
    }
    if (rc) {
        gram_re_free(re);
        return sc_fail(c, rc, "propertyNames: %s", err[0] ? err : "out of memory");
    }
    *out = re;
    return 0;
}

/* base (taken; NULL: any key) narrowed to the names of pn (NULL: all):
 * 0 or an error code with err filled. */
static int narrow_keys(gram_re **base, const gram_re *pn, char *err, size_t errlen)
{
    if (!pn) return 0;
    gram_re *t = NULL;
    int rc = 0;
    if (!*base) rc = gram_re_compile("[\\s\\S]*", 7, GRAM_RE_JSON_STRING | GRAM_RE_FULL, base, err, errlen);
    if (!rc) rc = gram_re_intersect(*base, pn, &t, err, errlen);
    if (!rc) gram_re_free(*base), *base = t;
    return rc;
}

/* 1 when no value satisfies s, as far as is plain: false, not {}, or an
 * enum / const none of whose values has an allowed type (a schema written
 * {"type": "object", "enum": ["a", "b"]}, which validators reject always). */
static int no_value_d(sctx *c, const json_t *s, int depth);
static int no_value(sctx *c, const json_t *s) { return no_value_d(c, s, 0); }

static int no_value_d(sctx *c, const json_t *s, int depth)
{
    s = sc_deref(c, s);
    if (json_is_false(s)) return 1;
    if (!json_is_object(s)) return 0;
    const json_t *nt = json_object_get(s, "not");
    if (json_is_true(nt) || (json_is_object(nt) && !json_object_size(nt))) return 1;
    if (json_is_true(json_object_get(s, "nullable"))) return 0;
    const json_t *type = json_object_get(s, "type"), *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (json_is_array(type) && !json_array_size(type)) return 1; /* types merged to none */
    /* Only objects, one of whose required properties cannot be given. */
    const json_t *only = json_is_array(type) && json_array_size(type) == 1 ? json_array_get(type, 0) : type;
    if (json_is_string(only) && !strcmp(json_string_value(only), "object") && depth < 8) {
        const json_t *props = json_object_get(s, "properties"), *addl = json_object_get(s, "additionalProperties");
        size_t i;
        json_t *r;
        json_array_foreach(json_object_get(s, "required"), i, r)
        {
            const json_t *ps = json_is_string(r) ? json_object_get(props, json_string_value(r)) : NULL;
            if (ps ? no_value_d(c, ps, depth + 1)
                   : json_is_string(r) && json_is_false(addl) && !json_object_get(s, "patternProperties"))
                return 1;
        }
    }
    if (!json_is_array(en) && !cn) return 0;
    /* An enum or const: none of whose values holds. */
    const json_t *rest = sc_without(c, s, cn ? "const" : "enum", NULL);
    const size_t n = cn ? 1 : json_array_size(en);
    for (size_t i = 0; rest && i < n; i++)
        if (sc_check(c, rest, cn ? cn : json_array_get(en, i), NULL)) return 0;
    return rest != NULL;
}

/* 1 when JSON-string content k matches one of the n patterns. */
static int any_match(gram_re *const *pre, int n, const char *k)
{
    json_t *js = json_string(k);
    char *e = js ? json_dumps(js, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    int hit = 0;
    for (int i = 0; e && i < n && !hit; i++) hit = gram_re_match(pre[i], e + 1, strlen(e) - 2);
    if (e) sc_dumps_free(e);
    json_decref(js);
    return hit;
}

/* The index of property k among names[0, *n); one not there is added,
 * optional, with an extra key's schema (true when a pattern matches it:
 * the patterns' schemas are merged in later).  -1 when k cannot appear. */
static int listed(const char *k, const char **names, const json_t **schemas, uint8_t *required, int *n,
                  const json_t *addl, gram_re *const *pre, int npp)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(names[i], k)) return schemas[i] ? i : -1;
    const json_t *sch = any_match(pre, npp, k) ? json_true() : addl;
    if (json_is_false(sch)) return -1;
    names[*n] = k, schemas[*n] = sch, required[*n] = 0;
    return (*n)++;
}

/* How many names dependencies hold (keys and listed names). */
static int dep_names(const json_t *deps)
{
    const char *k;
    json_t *v;
    int nd = 0;
    json_object_foreach((json_t *)deps, k, v) nd += 1 + (json_is_array(v) ? (int)json_array_size(v) : 0);
    return nd;
}

/* An object schema on its way to a grammar (obj_x's phases share it).
 * names/schemas/required/enc hold the n properties that may appear: the
 * listed ones, then names that required or dependencies add; a NULL
 * schema is a property never given. */
typedef struct {
    const json_t *s, *props, *req, *addl, *named, *pp, *deps;
    int closed, npp, extras, nreq;
    const char **names;
    const json_t **schemas;
    char **enc;             /* each name's JSON text, quotes included */
    size_t *lens;
    uint8_t *required;
    int (*dep)[2];          /* (a, b): a given needs b given */
    int ndep;
    gram_re **pre;          /* patternProperties' patterns (npp) */
    gram_re *pnames;        /* propertyNames: the names allowed (NULL: any) */
    int n, min_props, max_props;
    char rerr[300];
} objw;

/* Reads the keywords and allocates the working arrays.  1 with *out set
 * when done (an error), else 0. */
static int obj_begin(sctx *c, objw *w, gram_x *out)
{
    const json_t *s = w->s;
    w->props = json_object_get(s, "properties"), w->req = json_object_get(s, "required");
    w->addl = json_object_get(s, "additionalProperties");
    if (w->props && !json_is_object(w->props)) return *out = sc_fail(c, QERR_INVAL, "properties must be an object"), 1;
    if (w->req && !json_is_array(w->req)) return *out = sc_fail(c, QERR_INVAL, "required must be an array"), 1;
    /* Strict mode: a listing schema without additionalProperties is closed;
     * names that required or dependencies give are listed (any value). */
    w->closed = !w->addl && json_is_true(json_object_get(s, CLOSED_OBJ));
    w->named = w->addl ? w->addl : json_true(); /* the value of a name listed outside properties */
    if (!w->addl) w->addl = w->closed ? json_false() : json_true();
    w->pp = json_object_get(s, "patternProperties");
    if (w->pp && !json_is_object(w->pp)) return *out = sc_fail(c, QERR_INVAL, "patternProperties must be an object"), 1;
    w->npp = w->pp ? (int)json_object_size(w->pp) : 0;
    w->extras = !json_is_false(w->addl) || w->npp > 0;
    const int np0 = w->props ? (int)json_object_size(w->props) : 0;
    w->nreq = w->req ? (int)json_array_size(w->req) : 0;
    w->deps = json_object_get(s, "dependentRequired");
    if (!w->deps) w->deps = json_object_get(s, "dependencies");
    if (w->deps && !json_is_object(w->deps)) return *out = sc_fail(c, QERR_INVAL, "dependencies must be an object"), 1;
    const int nd = w->deps ? dep_names(w->deps) : 0;
    const size_t cap = (size_t)(np0 + w->nreq + nd) + 1;
    w->names = q_callocn(cap, sizeof *w->names);
    w->schemas = q_callocn(cap, sizeof *w->schemas);
    w->enc = q_callocn(cap, sizeof *w->enc);
    w->lens = q_callocn(cap, sizeof *w->lens);
    w->required = calloc(cap, 1);
    w->dep = q_callocn((size_t)nd + 1, sizeof *w->dep);
    w->pre = w->npp ? q_callocn((size_t)w->npp, sizeof *w->pre) : NULL;
    if (!w->names || !w->schemas || !w->enc || !w->lens || !w->required || !w->dep || (w->npp && !w->pre))
        return *out = sc_fail(c, QERR_NOMEM, "out of memory"), 1;
    if (json_object_get(s, "propertyNames") && names_dfa(c, json_object_get(s, "propertyNames"), &w->pnames))
        return *out = c->rc, 1;
    const char *pk;
    json_t *pv;
    int i = 0;
    json_object_foreach((json_t *)w->pp, pk, pv)
    {
        const int rc = gram_re_compile(pk, strlen(pk), GRAM_RE_JSON_STRING, &w->pre[i++], w->rerr, sizeof w->rerr);
        if (rc) return *out = sc_fail(c, rc, "patternProperties: %s", w->rerr), 1;
    }
    return 0;
}

/* The listed properties, then required names not listed (which take
 * additionalProperties' schema; any value where strict mode closed the
 * object).  1 with *out set when done, else 0. */
static int obj_list(sctx *c, objw *w, gram_x *out)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)w->props, k, v)
    {
        /* A property that no value satisfies may not appear: listed (so no
         * extra takes its name), never given. */
        const int never = no_value(c, v), req = w->req && in_array(w->req, k);
        if (never && req) return *out = sc_none(c, "required property '%s' can have no value", k), 1;
        w->names[w->n] = k, w->schemas[w->n] = never ? NULL : v, w->required[w->n] = (uint8_t)req;
        w->n++;
    }
    for (int i = 0; i < w->nreq; i++) {
        const char *r = json_string_value(json_array_get(w->req, (size_t)i));
        if (!r) return *out = sc_fail(c, QERR_INVAL, "required must list strings"), 1;
        if (w->props && json_object_get(w->props, r)) continue;
        int dup = 0;
        for (int j = 0; j < w->n; j++) dup |= !strcmp(w->names[j], r);
        if (dup) continue;
        const int at = listed(r, w->names, w->schemas, w->required, &w->n, w->named, w->pre, w->npp);
        if (at < 0)
            return *out = sc_none(c, "required property '%s' is not allowed (additionalProperties false)", r), 1;
        w->required[at] = 1;
    }
    return 0;
}

/* Dependencies (dependentRequired, or dependencies' lists) as pairs of
 * properties.  A name not listed is listed here (optional, its value an
 * extra one's) when extra keys are allowed; else it never appears: as a
 * source its dependency holds, as a target its source is never given.
 * 1 with *out set when done, else 0. */
static int obj_deps(sctx *c, objw *w, gram_x *out)
{
    const char *dk;
    json_t *dv;
    json_object_foreach((json_t *)w->deps, dk, dv)
    {
        if (!json_is_array(dv))
            return *out = sc_fail(c, QERR_UNSUPPORTED, "dependencies with a schema ('%s') are not supported", dk), 1;
        const int a = listed(dk, w->names, w->schemas, w->required, &w->n, w->named, w->pre, w->npp);
        size_t j;
        json_t *x;
        json_array_foreach(dv, j, x)
        {
            if (!json_is_string(x)) return *out = sc_fail(c, QERR_INVAL, "dependencies must list strings"), 1;
            const int bi = listed(json_string_value(x), w->names, w->schemas, w->required, &w->n, w->named, w->pre,
                                  w->npp);
            if (a < 0 || bi == a) continue;
            if (bi < 0) {
                if (w->required[a])
                    return *out = sc_none(c, "required property '%s' needs '%s', which is not allowed", dk,
                                          json_string_value(x)),
                           1;
                w->schemas[a] = NULL;
                continue;
            }
            w->dep[w->ndep][0] = a, w->dep[w->ndep][1] = bi;
            w->ndep++;
        }
    }
    return 0;
}

/* minProperties and maxProperties against what can appear.  1 with *out
 * set when done, else 0. */
static int obj_counts(sctx *c, objw *w, gram_x *out)
{
    const json_t *mnp = json_object_get(w->s, "minProperties"), *mxp = json_object_get(w->s, "maxProperties");
    w->min_props = json_is_number(mnp) ? sc_count_of(mnp, 0) : 0;
    w->max_props = json_is_number(mxp) ? sc_count_of(mxp, -1) : -1;
    if (w->closed && w->min_props > w->n + w->extras) w->addl = json_true(), w->extras = 1; /* strict, it could not hold: open */
    /* Extra members count as one towards minProperties (two may share a
     * key, which a reader takes as one member): refused where a valid
     * object would need two of them, rather than that object refused. */
    int nreq_listed = 0;
    for (int i = 0; i < w->n; i++) nreq_listed += w->required[i];
    if (w->extras && w->min_props - nreq_listed >= 2)
        return *out = sc_fail(c, QERR_UNSUPPORTED,
                              "minProperties %d with keys beside the listed ones (a grammar cannot tell such keys "
                              "apart to count them)",
                              w->min_props),
               1;
    if (w->min_props > w->n + w->extras)
        return *out = sc_fail(c, QERR_UNSUPPORTED, "minProperties above the properties listed%s",
                              w->extras ? " and one more" : ""),
               1;
    return 0;
}

/* Keys as they appear in the output (the JSON text of each name); a name
 * propertyNames refuses may not appear; a name a pattern matches takes
 * both schemas.  1 with *out set when done, else 0. */
static int obj_keys(sctx *c, objw *w, gram_x *out)
{
    for (int i = 0; i < w->n; i++) {
        json_t *js = json_string(w->names[i]);
        w->enc[i] = js ? json_dumps(js, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(js);
        if (!w->enc[i]) return *out = sc_fail(c, QERR_NOMEM, "out of memory"), 1;
    }
    for (int i = 0; i < w->n && w->pnames; i++) {
        if (gram_re_match(w->pnames, w->enc[i] + 1, strlen(w->enc[i]) - 2)) continue;
        if (w->required[i])
            return *out = sc_none(c, "required property '%s' is not allowed by propertyNames", w->names[i]), 1;
        w->schemas[i] = NULL;
    }
    for (int i = 0; i < w->n && w->npp; i++) {
        if (!w->schemas[i]) continue;
        const char *pk;
        json_t *pv;
        int k = 0;
        json_object_foreach((json_t *)w->pp, pk, pv)
        {
            if (!gram_re_match(w->pre[k++], w->enc[i] + 1, strlen(w->enc[i]) - 2)) continue;
            w->schemas[i] = sc_keep(c, sc_merge(c, w->schemas[i], pv));
            if (!w->schemas[i]) return *out = c->rc ? c->rc : sc_fail(c, QERR_NOMEM, "out of memory"), 1;
        }
        if (no_value(c, w->schemas[i])) { /* the schemas have no value in common */
            if (w->required[i]) return *out = sc_none(c, "required property '%s' can have no value", w->names[i]), 1;
            w->schemas[i] = NULL;
        }
    }
    return 0;
}

/* The extra properties' rule: a key none of the names, its value from the
 * first pattern it matches, else from additionalProperties.  The rule, or
 * a negative error. */
static gram_x obj_extra(sctx *c, objw *w)
{
    const char **inner = q_callocn((size_t)w->n + 1, sizeof *inner);
    if (!inner) return sc_fail(c, QERR_NOMEM, "out of memory");
    for (int i = 0; i < w->n; i++) inner[i] = w->enc[i] + 1, w->lens[i] = strlen(w->enc[i]) - 2;
    gram_x acc = NONE;
    const char *pk;
    json_t *pv;
    int k = 0, rc = 0;
    json_object_foreach((json_t *)w->pp, pk, pv)
    {
        /* Pattern k's keys, without those of earlier patterns. */
        gram_re *base = NULL;
        rc = gram_re_compile(pk, strlen(pk), GRAM_RE_JSON_STRING, &base, w->rerr, sizeof w->rerr);
        if (!rc) rc = minus_all(&base, w->pre, k, w->rerr, sizeof w->rerr);
        if (!rc) rc = narrow_keys(&base, w->pnames, w->rerr, sizeof w->rerr);
        if (rc) break;
        char where[300];
        snprintf(where, sizeof where, "patternProperties/%s", pk);
        acc = alt_add(c, acc, member(c, gram_b_key(B, base, inner, w->lens, w->n), sub(c, pv, where)));
        k++;
    }
    if (!rc && !json_is_false(w->addl)) {
        /* Keys no pattern matches. */
        gram_re *base = NULL;
        if (w->npp) {
            rc = gram_re_compile("[\\s\\S]*", 7, GRAM_RE_JSON_STRING | GRAM_RE_FULL, &base, w->rerr, sizeof w->rerr);
            if (!rc) rc = minus_all(&base, w->pre, w->npp, w->rerr, sizeof w->rerr);
        }
        if (!rc) rc = narrow_keys(&base, w->pnames, w->rerr, sizeof w->rerr);
        if (!rc)
            acc = alt_add(c, acc, member(c, gram_b_key(B, base, inner, w->lens, w->n),
                                         sub(c, w->addl, "additionalProperties")));
    }
    free(inner);
    if (rc) return sc_fail(c, rc, "patternProperties: %s", w->rerr);
    return as_rule(c, "extra", acc);
}

/* Each property as a rule (its key, a colon, its value), then the members
 * in any order the constraints allow, in braces. */
static gram_x obj_members(sctx *c, objw *w, gram_x extra)
{
    gram_x *prop = q_callocn((size_t)w->n + 1, sizeof *prop);
    if (!prop) return sc_fail(c, QERR_NOMEM, "out of memory");
    for (int i = 0; i < w->n && !c->rc; i++) {
        if (!w->schemas[i]) { /* never given */
            prop[i] = NONE;
            continue;
        }
        char where[300];
        snprintf(where, sizeof where, "properties/%s", w->names[i]);
        gram_x val = sub(c, w->schemas[i], where);
        prop[i] = as_rule(c, where, SEQ(LIT(w->enc[i]), SEQ(LIT(":"), val)));
    }
    if (c->rc) {
        free(prop);
        return c->rc;
    }
    const sc_obj ob = { w->n, prop, w->required, (const int (*)[2])w->dep, w->ndep, extra, w->min_props, w->max_props };
    const gram_x body = sc_members(c, &ob);
    free(prop);
    return body < 0 ? body : sc_seq3(c, LIT("{"), body, LIT("}"));
}

static void obj_free(objw *w)
{
    gram_re_free(w->pnames);
    for (int i = 0; i < w->npp && w->pre; i++) gram_re_free(w->pre[i]);
    free(w->pre);
    for (int i = 0; i < w->n; i++)
        if (w->enc[i]) sc_dumps_free(w->enc[i]);
    free(w->names);
    free(w->schemas);
    free(w->enc);
    free(w->lens);
    free(w->required);
    free(w->dep);
}

static gram_x obj_x(sctx *c, const json_t *s)
{
    objw w = { .s = s };
    gram_x out = 0;
    if (!obj_begin(c, &w, &out) && !obj_list(c, &w, &out) && !obj_deps(c, &w, &out) && !obj_counts(c, &w, &out) &&
        !obj_keys(c, &w, &out)) {
        const gram_x extra = w.extras ? obj_extra(c, &w) : NONE;
        out = w.extras && extra < 0 ? extra : obj_members(c, &w, extra);
    }
    obj_free(&w);
    return c->rc ? c->rc : out;
}

/* ---- the walk ------------------------------------------------------------------------------- */

static const char *const TYPES[] = { "null", "boolean", "object", "array", "string", "number", "integer", FRACTION_TYPE };
#define N_TYPES 8

/* 1 when a "type" value (a string or a list) names t. */
static int in_types(const json_t *ty, const char *t)
{
    for (size_t i = 0; i < (json_is_array(ty) ? json_array_size(ty) : 1); i++) {
        const char *n = json_string_value(json_is_array(ty) ? json_array_get(ty, i) : ty);
        if (n && !strcmp(n, t)) return 1;
    }
    return 0;
}

/* 1 when s's kept negations list val among values it may not take. */
static int negated(const json_t *s, const json_t *val)
{
    size_t i, j;
    json_t *n, *x;
    json_array_foreach(json_object_get(s, NOT_KEY), i, n) json_array_foreach(json_object_get(n, "enum"), j, x) if (json_equal(x, (json_t *)val)) return 1;
    return 0;
}

/* The type t's alternative of schema s. */
static gram_x typed(sctx *c, const json_t *s, const char *t)
{
    if (!strcmp(t, "null")) return LIT("null");
    if (!strcmp(t, "boolean")) {
        const int yes = !negated(s, json_true()), no = !negated(s, json_false());
        return yes && no ? ALT(LIT("true"), LIT("false")) : LIT(yes ? "true" : "false");
    }
    if (!strcmp(t, "object")) return obj_x(c, s);
    if (!strcmp(t, "array")) return arr_x(c, s);
    if (!strcmp(t, "string")) return sc_str(c, s);
    if (!strcmp(t, "integer")) return sc_num(c, s, 1);
    if (!strcmp(t, "number")) return sc_num(c, s, 0);
    if (!strcmp(t, FRACTION_TYPE)) {
        /* No exponent: a nonzero digit in the fraction makes it no integer. */
        static const char *const NUM_KEYS[] = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf" };
        for (size_t i = 0; i < sizeof NUM_KEYS / sizeof NUM_KEYS[0]; i++)
            if (json_object_get(s, NUM_KEYS[i]))
                return sc_fail(c, QERR_UNSUPPORTED, "a number that is not an integer, with '%s'", NUM_KEYS[i]);
        return sc_re(c, "-?(0|[1-9]\\d*)\\.\\d*[1-9]\\d*", GRAM_RE_FULL);
    }
    return sc_fail(c, QERR_INVAL, "unknown type '%s'", t);
}

/* enum / const: the values that satisfy everything beside them (checked
 * one by one, whatever the other keywords), as literals. */
static gram_x enum_x(sctx *c, const json_t *s)
{
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en && !json_is_array(en)) return sc_fail(c, QERR_INVAL, "enum must be an array");
    const json_t *rest = sc_without(c, s, en ? "enum" : "const", "nullable");
    if (!rest) return sc_fail(c, QERR_NOMEM, "out of memory");
    const int nullable = json_is_true(json_object_get(s, "nullable"));
    gram_x acc = NONE;
    int has_null = 0;
    const size_t n = en ? json_array_size(en) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *val = en ? json_array_get(en, i) : cn;
        const char *why;
        const int r = nullable && json_is_null(val) ? 1 : sc_check(c, rest, val, &why);
        if (r < 0) return sc_fail(c, QERR_UNSUPPORTED, "enum / const beside '%s', which cannot be checked", why);
        if (!r) continue;
        has_null |= json_is_null(val);
        acc = alt_add(c, acc, literal(c, val));
        if (acc < 0) return acc;
    }
    if (nullable && !has_null) acc = alt_add(c, acc, LIT("null"));
    if (acc == NONE) return sc_fail(c, QERR_UNSUPPORTED, "no enum / const value satisfies the schema");
    return acc;
}

static gram_x sx_inner(sctx *c, const json_t *s)
{
    if (json_is_true(s)) return gram_b_ref(B, c->r_value);
    if (json_is_false(s)) return sc_fail(c, QERR_UNSUPPORTED, "a false schema (no instance is valid)");
    if (!json_is_object(s)) return sc_fail(c, QERR_INVAL, "a schema must be an object or a boolean");
    if (json_object_get(s, "enum") || json_object_get(s, "const")) return enum_x(c, s);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) if (IN(k, REFUSED)) return sc_fail(c, QERR_UNSUPPORTED, "keyword '%s' is not supported", k);
    const json_t *dr = sc_dep_rewrite(c, s);
    if (dr) return sx(c, dr);
    if (c->rc) return c->rc;
    const json_t *ir = sc_if_rewrite(c, s);
    if (ir) return sx(c, ir);
    if (c->rc) return c->rc;
    /* not: only {} (nothing: an error here; a property's is handled by
     * its object) and a list of types taken out of the allowed ones. */
    const json_t *nt = json_object_get(s, "not");
    if (nt) {
        const json_t *rw = sc_not_rewrite(c, s, sc_deref(c, nt));
        if (rw) return sx(c, rw);
        if (c->rc) return c->rc;
        nt = sc_deref(c, nt);
        const json_t *nty = json_object_get(nt, "type");
        if (json_is_true(nt) || (json_is_object(nt) && !json_object_size(nt)))
            return sc_fail(c, QERR_UNSUPPORTED, "a schema no instance satisfies (not {})");
        if (!json_is_object(nt) || !nty || sc_constrains(nt, "type", NULL))
            return sc_fail(c, QERR_UNSUPPORTED, "keyword 'not' is supported only with {} or a type");
        json_t *w = json_copy((json_t *)s), *left = json_array();
        const json_t *have = json_object_get(s, "type");
        for (int t = 0; t < 7; t++) {
            int allowed = !have && t < 6, banned = 0;
            for (size_t i = 0; have && i < (json_is_array(have) ? json_array_size(have) : 1); i++) {
                const char *hn = json_string_value(json_is_array(have) ? json_array_get(have, i) : have);
                allowed |= hn && !strcmp(hn, TYPES[t]);
            }
            for (size_t i = 0; i < (json_is_array(nty) ? json_array_size(nty) : 1); i++) {
                const char *bn = json_string_value(json_is_array(nty) ? json_array_get(nty, i) : nty);
                banned |= bn && (!strcmp(bn, TYPES[t]) || (t == 6 && !strcmp(bn, "number")));
            }
            if (!allowed || banned) continue;
            /* A number that may not be an integer: one with a fraction. */
            const int frac = t == 5 && in_types(nty, "integer");
            json_array_append_new(left, json_string(frac ? FRACTION_TYPE : TYPES[t]));
        }
        json_object_del(w, "not");
        json_object_set_new(w, "type", left);
        return sx(c, sc_keep(c, w));
    }
    /* $ref (its siblings, if any, must hold too). */
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return sc_fail(c, QERR_INVAL, "$ref must be a string");
        const json_t *t = sc_resolve(c, json_string_value(ref));
        if (!t) return sc_fail(c, QERR_UNSUPPORTED, "$ref '%s' does not name a schema in this document", json_string_value(ref));
        if (!sc_constrains(s, "$ref", NULL)) return ref_rule(c, t);
        const json_t *m = sc_keep(c, sc_merge(c, sc_without(c, s, "$ref", NULL), t));
        return m ? sx(c, m) : c->rc ? c->rc : sc_fail(c, QERR_NOMEM, "out of memory");
    }
    /* allOf: one schema.  Beside anyOf / oneOf, the alternatives come
     * first (each merges the allOf), so that alternatives met in its
     * members are not pushed back into it again and again. */
    const json_t *all = json_object_get(s, "allOf");
    if (all && !json_object_get(s, "anyOf") && !json_object_get(s, "oneOf")) {
        if (!json_is_array(all) || !json_array_size(all)) return sc_fail(c, QERR_INVAL, "allOf must be a non-empty array");
        const json_t *m = sc_without(c, s, "allOf", NULL);
        size_t i;
        json_t *x;
        json_array_foreach(all, i, x)
        {
            m = sc_keep(c, sc_merge(c, m, x));
            if (!m) return c->rc ? c->rc : sc_fail(c, QERR_NOMEM, "out of memory");
        }
        return sx(c, m);
    }
    /* anyOf / oneOf: alternatives, each with the keywords beside it. */
    const char *ak = json_object_get(s, "anyOf") ? "anyOf" : json_object_get(s, "oneOf") ? "oneOf" : NULL;
    if (ak) {
        const json_t *alts = json_object_get(s, ak);
        if (!json_is_array(alts) || !json_array_size(alts)) return sc_fail(c, QERR_INVAL, "%s must be a non-empty array", ak);
        const json_t *base = sc_without(c, s, ak, NULL);
        const int plain = !sc_constrains(base, NULL, NULL);
        gram_x acc = NONE;
        size_t i;
        json_t *x;
        json_array_foreach(alts, i, x)
        {
            char where[32];
            snprintf(where, sizeof where, "%s/%zu", ak, i);
            const json_t *one = plain ? x : sc_keep(c, sc_merge(c, base, x));
            if (!one) return c->rc ? c->rc : sc_fail(c, QERR_NOMEM, "out of memory");
            if (no_value(c, one)) continue; /* an alternative the keywords beside it rule out */
            acc = alt_add(c, acc, sub(c, one, where));
            if (acc < 0) return acc;
        }
        if (acc == NONE) return sc_fail(c, QERR_UNSUPPORTED, "no alternative of %s can hold", ak);
        return acc;
    }
    const json_t *type = json_object_get(s, "type");
    if (type && !json_is_string(type) && !json_is_array(type)) return sc_fail(c, QERR_INVAL, "type must be a string or a list");
    /* One alternative a type; "integer" is left out when "number" is in. */
    int want[N_TYPES] = { 0 };
    if (!type) {
        for (int t = 0; t < 6; t++) want[t] = 1;
    } else {
        for (size_t i = 0; i < (json_is_array(type) ? json_array_size(type) : 1); i++) {
            const char *tn = json_string_value(json_is_array(type) ? json_array_get(type, i) : type);
            int found = 0;
            for (int t = 0; tn && t < N_TYPES; t++)
                if (!strcmp(tn, TYPES[t])) want[t] = found = 1;
            if (!found) return sc_fail(c, QERR_INVAL, "unknown type '%s'", tn ? tn : "?");
        }
        if (want[5]) want[6] = want[7] = 0;
    }
    if (json_is_true(json_object_get(s, "nullable"))) want[0] = 1;
    /* Values a kept negation rules out entirely. */
    if (negated(s, json_null())) want[0] = 0;
    if (negated(s, json_true()) && negated(s, json_false())) want[1] = 0;
    /* Without "type" and without keywords of a type, any value. */
    if (!type && !sc_constrains(s, NULL, NULL)) return gram_b_ref(B, c->r_value);
    gram_x acc = NONE;
    /* A type none of whose values holds (sc_none: an object no keyword
     * set allows) is left out; all of them: an error saying why. */
    char why[300] = "";
    for (int t = 0; t < N_TYPES; t++)
        if (want[t]) {
            const gram_x x = typed(c, s, TYPES[t]);
            if (x == NONE && !c->rc) {
                if (!why[0]) snprintf(why, sizeof why, "%s", c->none_why);
                continue;
            }
            acc = alt_add(c, acc, x);
            if (acc < 0) return acc;
        }
    if (acc == NONE) return sc_fail(c, QERR_INVAL, "%s", why[0] ? why : "an empty type list");
    return acc;
}

static gram_x sx(sctx *c, const json_t *s)
{
    if (c->rc) return c->rc;
    /* Schemas that merge (allOf, $ref beside other keywords) go through a
     * rule of their own: met again through recursion, they reuse it. */
    if (json_is_object(s) && (json_object_get(s, "allOf") || (json_object_get(s, "$ref") && sc_constrains(s, "$ref", NULL))))
        return ref_rule(c, s);
    return sx_body(c, s);
}

/* Subschemas one compile may go through (each merge makes a new one). */
#define MAX_VISITS 20000

static gram_x sx_body(sctx *c, const json_t *s)
{
    if (c->rc) return c->rc;
    if (++c->depth > 200) return sc_fail(c, QERR_LIMIT, "schemas nested more than 200 deep");
    if (++c->visits > MAX_VISITS)
        return sc_fail(c, QERR_LIMIT, "more than %d subschemas to compile (merges and alternatives multiply them)",
                       MAX_VISITS);
    gram_x x = sx_inner(c, s);
    c->depth--;
    if (x < 0 && !c->rc) {
        const char *msg;
        const int rc = gram_b_error(B, &msg);
        return sc_fail(c, rc ? rc : x, "%s", rc ? msg : "cannot compile");
    }
    return x;
}

/* The shared rules: value, string, number, integer (compact JSON). */
static int shared_rules(sctx *c)
{
    c->r_value = gram_b_rule(B, "value");
    c->r_string = gram_b_rule(B, "string");
    c->r_number = gram_b_rule(B, "number");
    c->r_integer = gram_b_rule(B, "integer");
    const int r_obj = gram_b_rule(B, "object"), r_arr = gram_b_rule(B, "array");
    gram_b_define(B, c->r_string, sc_seq3(c, LIT("\""), sc_re(c, "[\\s\\S]*", GRAM_RE_JSON_STRING | GRAM_RE_FULL), LIT("\"")));
    gram_b_define(B, c->r_number, sc_re(c, "-?(0|[1-9]\\d*)(\\.\\d+)?([eE][+-]?\\d+)?", GRAM_RE_FULL));
    gram_b_define(B, c->r_integer, sc_re(c, "-?(0|[1-9]\\d*)", GRAM_RE_FULL));
    gram_x member = SEQ(gram_b_ref(B, c->r_string), SEQ(LIT(":"), gram_b_ref(B, c->r_value)));
    gram_b_define(B, r_obj,
                  sc_seq3(c, LIT("{"),
                       ALT(SEQ(member, gram_b_rep(B, SEQ(LIT(","), SEQ(gram_b_ref(B, c->r_string),
                                                                      SEQ(LIT(":"), gram_b_ref(B, c->r_value)))),
                                                  0, -1)),
                           gram_b_empty(B)),
                       LIT("}")));
    gram_b_define(B, r_arr,
                  sc_seq3(c, LIT("["),
                       ALT(SEQ(gram_b_ref(B, c->r_value), gram_b_rep(B, SEQ(LIT(","), gram_b_ref(B, c->r_value)), 0, -1)),
                           gram_b_empty(B)),
                       LIT("]")));
    gram_x v = ALT(gram_b_ref(B, r_obj), gram_b_ref(B, r_arr));
    v = ALT(v, gram_b_ref(B, c->r_string));
    v = ALT(v, gram_b_ref(B, c->r_number));
    v = ALT(v, ALT(LIT("true"), ALT(LIT("false"), LIT("null"))));
    gram_b_define(B, c->r_value, v);
    const char *msg;
    const int rc = gram_b_error(B, &msg);
    return rc ? sc_fail(c, rc, "%s", msg) : 0;
}

/* The grammar whose root is what top(c, arg) builds, with the shared rules
 * made first: 0 or an error with its message in err. */
static int compile_with(gram_x (*top)(sctx *, const void *), const void *arg, const json_t *root, unsigned flags,
                        gram **out, char *err, size_t errlen)
{
    *out = NULL;
    sctx c = { 0 };
    c.flags = flags;
    c.b = gram_b_new();
    c.keep = json_array();
    c.root = root;
    int rc = 0;
    if (!c.b || !c.keep) rc = sc_fail(&c, QERR_NOMEM, "out of memory");
    if (!rc) rc = shared_rules(&c);
    if (!rc) {
        gram_x x = top(&c, arg);
        const int r = x >= 0 ? gram_b_rule(c.b, "root") : x;
        if (r >= 0 && !gram_b_define(c.b, r, x)) rc = gram_b_build(c.b, r, out, c.err, sizeof c.err);
        else rc = c.rc ? c.rc : r < 0 ? r : QERR_INTERNAL;
    }
    if (rc) {
        if (!c.err[0]) {
            const char *msg = "";
            if (c.b) gram_b_error(c.b, &msg);
            snprintf(c.err, sizeof c.err, "%s", msg);
        }
        qerr_set(err, errlen, rc, "%s", c.err);
    }
    gram_b_free(c.b);
    json_decref(c.keep);
    free(c.memo);
    sc_merges_free(&c);
    sc_check_free(&c);
    return rc;
}

/* s read as the draft it names: the root of its references. */
static gram_x as_root(sctx *c, const json_t *s)
{
    const json_t *r = sc_keep(c, sc_for_draft(s, !(c->flags & GRAM_SCHEMA_FULL)));
    if (!r) return sc_fail(c, QERR_NOMEM, "out of memory");
    c->root = r;
    c->path[0] = 0;
    return sx(c, r);
}

static gram_x top_schema(sctx *c, const void *s) { return as_root(c, s); }
static gram_x top_any(sctx *c, const void *unused)
{
    (void)unused;
    return gram_b_ref(B, c->r_value);
}

int gram_schema_compile_opts(const json_t *schema, unsigned flags, gram **out, char *err, size_t errlen)
{
    return compile_with(top_schema, schema, schema, flags, out, err, errlen);
}

int gram_schema_compile(const json_t *schema, gram **out, char *err, size_t errlen)
{
    return gram_schema_compile_opts(schema, 0, out, err, errlen);
}

int gram_json_any(gram **out, char *err, size_t errlen)
{
    return compile_with(top_any, NULL, json_true(), GRAM_SCHEMA_FULL, out, err, errlen);
}

/* ---- tool calls ---------------------------------------------------------------------- */

static const gram_tools_form_desc FORMS[GRAM_TOOLS_FORMS] = {
    [GRAM_TOOLS_HERMES] = { "hermes", "<tool_call>", "", "", "<tool_call>\n", "\n</tool_call>", "\n", "arguments",
                            { "<tool_call>", "</tool_call>", NULL } },
    [GRAM_TOOLS_LLAMA3_JSON] = { "llama3_json", NULL, "", "", "", "", "; ", "parameters", { NULL } },
    [GRAM_TOOLS_MISTRAL] = { "mistral", "[TOOL_CALLS]", "[TOOL_CALLS] [", "]", "", "", ", ", "arguments",
                             { "[TOOL_CALLS]", NULL } },
};

const gram_tools_form_desc *gram_tools_form_get(gram_tools_form f)
{
    return (unsigned)f < GRAM_TOOLS_FORMS ? &FORMS[f] : NULL;
}

int gram_tools_form_named(const char *parser)
{
    for (int f = 0; parser && f < GRAM_TOOLS_FORMS; f++)
        if (!strcmp(parser, FORMS[f].parser)) return f;
    return -1;
}

typedef struct {
    const gram_tool *t;
    int n;
    const gram_tools_opts *o;
    int *bad;
} tools_arg;

/* {"name": NAME, "KEY": ARGS} for each tool, as alternatives. */
static gram_x one_call(sctx *c, const tools_arg *a, const gram_tools_form_desc *f)
{
    gram_x any = NONE;
    for (int i = 0; i < a->n && !c->rc; i++) {
        *a->bad = i;
        json_t *nm = json_stringn(a->t[i].name, a->t[i].name_len);
        char *q = nm ? json_dumps(nm, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(nm);
        if (!q) return sc_fail(c, QERR_NOMEM, "out of memory");
        char key[32];
        snprintf(key, sizeof key, ", \"%s\": ", f->key);
        gram_x head = SEQ(LIT("{\"name\": "), SEQ(LIT(q), LIT(key)));
        sc_dumps_free(q);
        /* The parameters are a schema of their own: its $refs start there. */
        gram_x args = as_root(c, a->t[i].params ? a->t[i].params : json_true());
        any = alt_add(c, any, sc_seq3(c, head, args, LIT("}")));
    }
    if (!c->rc) *a->bad = -1;
    return c->rc ? c->rc : any;
}

/* A regex compiled whole (GRAM_RE_FULL) into *re, or an error in c. */
static int full_re(sctx *c, const char *src, size_t len, gram_re **re)
{
    char msg[200] = "";
    const int rc = gram_re_compile(src, len, GRAM_RE_FULL, re, msg, sizeof msg);
    if (rc) sc_fail(c, rc, "%s", msg);
    return rc;
}

/* Text first: any text that does not hold the form's trigger (llama3_json:
 * none, or text that does not begin with '{'). */
static gram_x free_text(sctx *c, const gram_tools_form_desc *f)
{
    gram_re *all = NULL, *with = NULL, *text = NULL;
    if (!f->trigger) {
        static const char plain[] = "([^{][\\s\\S]*)?";
        return full_re(c, plain, sizeof plain - 1, &text) ? c->rc : gram_b_regex_take(B, text);
    }
    /* [\s\S]* less [\s\S]*TRIGGER[\s\S]*, the trigger's bytes escaped
     * (the triggers are the short constants above). */
    static const char any[] = "[\\s\\S]*";
    char src[128];
    size_t k = (size_t)snprintf(src, sizeof src, "%s", any);
    for (const char *t = f->trigger; *t && k + 16 < sizeof src; t++) {
        if (strchr("\\^$.|?*+()[]{}", *t)) src[k++] = '\\';
        src[k++] = *t;
    }
    k += (size_t)snprintf(src + k, sizeof src - k, "%s", any);
    int rc = full_re(c, any, sizeof any - 1, &all);
    if (!rc) rc = full_re(c, src, k, &with);
    if (!rc) {
        char msg[200] = "";
        rc = gram_re_minus(all, with, &text, msg, sizeof msg);
        if (rc) sc_fail(c, rc, "%s", msg);
    }
    gram_re_free(all);
    gram_re_free(with);
    return rc ? c->rc : gram_b_regex_take(B, text);
}

static gram_x top_tools(sctx *c, const void *arg)
{
    const tools_arg *a = arg;
    const gram_tools_form_desc *f = &FORMS[a->o->form];
    gram_x call = as_rule(c, "call", one_call(c, a, f));
    if (call < 0) return call;
    gram_x wrapped = sc_seq3(c, LIT(f->open), call, LIT(f->close));
    const int max = a->o->max_calls;
    gram_x calls = max == 1 ? wrapped
                            : SEQ(wrapped, gram_b_rep(B, SEQ(LIT(f->sep), wrapped), 0, max < 1 ? -1 : max - 1));
    calls = sc_seq3(c, LIT(f->list_open), calls, LIT(f->list_close));
    if (!a->o->text_first) return calls;
    gram_x text = free_text(c, f);
    if (text < 0) return text;
    /* llama3_json: calls or text; the others: text, then calls or nothing. */
    if (!f->trigger) return ALT(calls, text);
    return SEQ(text, ALT(calls, gram_b_empty(B)));
}

int gram_tools_grammar_opts(const gram_tool *tools, int n, const gram_tools_opts *o, int *bad, gram **out, char *err,
                            size_t errlen)
{
    static const gram_tools_opts dflt = { GRAM_TOOLS_HERMES, 0, 0, 0 };
    int dummy;
    if (!bad) bad = &dummy;
    if (!o) o = &dflt;
    *bad = -1;
    *out = NULL;
    if (n < 1) return qerr_set(err, errlen, QERR_INVAL, "no tools");
    if ((unsigned)o->form >= GRAM_TOOLS_FORMS) return qerr_set(err, errlen, QERR_INVAL, "no such tool-call form");
    tools_arg a = { tools, n, o, bad };
    return compile_with(top_tools, &a, json_true(), o->flags, out, err, errlen);
}

int gram_tools_grammar(const gram_tool *tools, int n, int text_first, int max_calls, int *bad, gram **out, char *err,
                       size_t errlen)
{
    const gram_tools_opts o = { GRAM_TOOLS_HERMES, text_first, max_calls, 0 };
    return gram_tools_grammar_opts(tools, n, &o, bad, out, err, errlen);
}

/* ---- other constraints: a pattern, a list of choices ---------------------------------- */

/* A grammar of one rule, body x (built by f), root. */
static int one_rule(gram_b *b, gram_x x, gram **out, char *err, size_t errlen)
{
    const int r = gram_b_rule(b, "root");
    int rc = r < 0 ? r : gram_b_define(b, r, x);
    if (!rc) rc = gram_b_build(b, r, out, err, errlen);
    else {
        const char *msg = "";
        gram_b_error(b, &msg);
        qerr_set(err, errlen, rc, "%s", msg);
    }
    gram_b_free(b);
    return rc;
}

int gram_regex_grammar(const char *pattern, size_t len, gram **out, char *err, size_t errlen)
{
    *out = NULL;
    gram_b *b = gram_b_new();
    if (!b) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    return one_rule(b, gram_b_regex(b, pattern, len, GRAM_RE_FULL), out, err, errlen);
}

int gram_choice_grammar(const char *const *s, const size_t *lens, int n, gram **out, char *err, size_t errlen)
{
    *out = NULL;
    if (n < 1) return qerr_set(err, errlen, QERR_INVAL, "no choices");
    gram_b *b = gram_b_new();
    if (!b) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    gram_x x = gram_b_lit(b, s[0], lens[0]);
    for (int i = 1; i < n; i++) x = gram_b_alt(b, x, gram_b_lit(b, s[i], lens[i]));
    return one_rule(b, x, out, err, errlen);
}
