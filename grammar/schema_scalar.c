/* schema_scalar.c - JSON Schema's strings and numbers as grammar
 * expressions (schema_int.h): patterns, formats and length bounds over
 * JSON-string bytes (with kept negations subtracted), integers and
 * integer-bounded numbers as digit patterns, multiples as residues. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram_re.h"
#include "qerr.h"
#include "schema_int.h"
#include "util.h"

/* ---- strings ----------------------------------------------------------------------------- */

/* A full date: years 0001-9999 (year zero is not a date to Python's
 * datetime or most validators), 31 days in the long months, 30 in the short
 * ones, 28 in February and the 29th only in Gregorian leap years (divisible
 * by 4 and not by 100, or by 400). */
#define YEAR "([1-9]\\d{3}|0[1-9]\\d{2}|00[1-9]\\d|000[1-9])"
#define LEAP4 "(0[48]|[2468][048]|[13579][26])"
#define LEAPYEAR "(\\d\\d" LEAP4 "|" LEAP4 "00)"
#define DATE                                                                                                     \
    "(" YEAR "-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))|" \
    LEAPYEAR "-02-29)"

#define IPV4 "((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"
/* RFC 3986's IPv6address: h16 groups around "::", the last 32 bits as two
 * groups or as an IPv4 address. */
#define H16 "[0-9a-fA-F]{1,4}"
#define LS32 "(" H16 ":" H16 "|" IPV4 ")"
#define IPV6                                                                                                        \
    "((" H16 ":){6}" LS32 "|::(" H16 ":){5}" LS32 "|(" H16 ")?::(" H16 ":){4}" LS32 "|((" H16 ":)?" H16 ")?::(" H16 \
    ":){3}" LS32 "|((" H16 ":){0,2}" H16 ")?::(" H16 ":){2}" LS32 "|((" H16 ":){0,3}" H16 ")?::" H16 ":" LS32      \
    "|((" H16 ":){0,4}" H16 ")?::" LS32 "|((" H16 ":){0,5}" H16 ")?::" H16 "|((" H16 ":){0,6}" H16 ")?::)"

/* Patterns of the formats (over code points; compiled in JSON-string mode). */
const char *sc_format_pattern(const char *f)
{
    static const struct {
        const char *name, *pattern;
    } F[] = {
        { "date", DATE },
        { "time", "([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d+)?([Zz]|[+-]([01]\\d|2[0-3]):[0-5]\\d)" },
        { "date-time", DATE "[Tt ]([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)"
                       "(\\.\\d+)?([Zz]|[+-]([01]\\d|2[0-3]):[0-5]\\d)" },
        /* RFC 5321's Mailbox: a dot-string or a quoted string, then a
         * domain or an address literal: [IPv4], or its general form
         * [tag:content] that IPv6 literals are written in. */
        { "email", "([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*|\"([ !#-\\[\\]-~]|\\\\[ -~])*\")@"
                   "([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*|"
                   "\\[" IPV4 "\\]|\\[[A-Za-z0-9-]*[A-Za-z0-9]:[!-Z^-~]+\\])" },
        { "uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}" },
        { "ipv4", IPV4 },
        { "ipv6", IPV6 },
        { "uri", "[A-Za-z][A-Za-z0-9+.-]*:[^\\s\"<>\\\\^`{|}]*" },
        { "hostname", "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*" },
        { "uri-reference", "[^\\s\"<>\\\\^`{|}]*" },
        { "json-pointer", "(/([^~/]|~[01])*)*" },
        /* Draft 3's names. */
        { "host-name", "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*" },
        { "ip-address", IPV4 },
        { "color", "#[0-9A-Fa-f]{3}([0-9A-Fa-f]{3})?|aqua|black|blue|fuchsia|gray|green|lime|maroon|navy|olive|orange|"
                   "purple|red|silver|teal|white|yellow" },
    };
    for (size_t i = 0; i < sizeof F / sizeof F[0]; i++)
        if (!strcmp(f, F[i].name)) return F[i].pattern;
    return NULL;
}

/* 1 for a format the JSON Schema specifications define that quire cannot
 * generate (an error); formats no specification defines only annotate, as
 * the specification says, and leave the string free. */
int sc_format_refused(const char *f)
{
    static const char *const R[] = { "idn-email", "idn-hostname", "iri", "iri-reference", "uri-template",
                                     "relative-json-pointer", "duration", "regex", "utc-millisec", "phone", "style" };
    for (size_t i = 0; i < sizeof R / sizeof R[0]; i++)
        if (!strcmp(f, R[i])) return 1;
    return 0;
}

/* A count keyword (minLength, maxItems...) as an int: dflt when absent,
 * clamped to [-1, 1e9] (a negative or fractional one is refused by the
 * caller's range checks). */
int sc_count_of(const json_t *v, int dflt)
{
    if (!json_is_number(v)) return dflt;
    const double d = json_number_value(v);
    if (!(d >= 0)) return -2; /* negative or NaN */
    return d > 1e9 ? 1000000000 : (int)d;
}

/* A regex (gram_re.h syntax) matching exactly the string v, in out. */
void sc_quote_re(const char *v, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 3 < cap; i++) {
        if (v[i] && strchr("\\^$.|?*+()[]{}/", v[i])) out[o++] = '\\';
        out[o++] = v[i];
    }
    out[o] = 0;
}

/* A string with its kept negations: the strings the rest allows (pattern or
 * format, length bounds) minus those matching a negated pattern and minus
 * the negated strings. */
static gram_x str_negated(sctx *c, const json_t *s, const json_t *pat, const char *p, int min, int max, int bounded,
                          const json_t *negs)
{
    (void)s;
    char err[300] = "", lp[64];
    gram_re *rx = NULL, *tmp = NULL, *y = NULL;
    int rc = pat ? gram_re_compile(json_string_value(pat), json_string_length(pat), GRAM_RE_JSON_STRING | GRAM_RE_SUBSET,
                                   &rx, err, sizeof err)
           : p   ? gram_re_compile(p, strlen(p), GRAM_RE_JSON_STRING | GRAM_RE_FULL, &rx, err, sizeof err)
                 : gram_re_compile("[\\s\\S]*", 7, GRAM_RE_JSON_STRING | GRAM_RE_FULL, &rx, err, sizeof err);
    if (!rc && bounded) {
        if (max >= 0) snprintf(lp, sizeof lp, "[\\s\\S]{%d,%d}", min, max);
        else snprintf(lp, sizeof lp, "[\\s\\S]{%d,}", min);
        rc = gram_re_compile(lp, strlen(lp), GRAM_RE_JSON_STRING | GRAM_RE_FULL | GRAM_RE_SUBSET, &y, err, sizeof err);
        if (!rc) rc = gram_re_intersect(rx, y, &tmp, err, sizeof err);
        gram_re_free(y), y = NULL;
        if (!rc) gram_re_free(rx), rx = tmp, tmp = NULL;
    }
    size_t i, j;
    json_t *n, *x;
    json_array_foreach(negs, i, n)
    {
        if (rc) break;
        const json_t *np = json_object_get(n, "pattern");
        if (json_is_string(np)) {
            /* Unanchored, as a schema's pattern: the strings holding a match. */
            rc = gram_re_compile(json_string_value(np), json_string_length(np), GRAM_RE_JSON_STRING, &y, err, sizeof err);
            if (!rc) rc = gram_re_minus(rx, y, &tmp, err, sizeof err);
            gram_re_free(y), y = NULL;
            if (!rc) gram_re_free(rx), rx = tmp, tmp = NULL;
        }
        json_array_foreach(json_object_get(n, "enum"), j, x)
        {
            if (rc || !json_is_string(x)) continue;
            char q[2048];
            if (json_string_length(x) > 500) {
                rc = QERR_UNSUPPORTED, snprintf(err, sizeof err, "not: a string over 500 bytes");
                break;
            }
            sc_quote_re(json_string_value(x), json_string_length(x), q, sizeof q);
            rc = gram_re_compile(q, strlen(q), GRAM_RE_JSON_STRING | GRAM_RE_FULL, &y, err, sizeof err);
            if (!rc) rc = gram_re_minus(rx, y, &tmp, err, sizeof err);
            gram_re_free(y), y = NULL;
            if (!rc) gram_re_free(rx), rx = tmp, tmp = NULL;
        }
    }
    if (!rc && gram_re_empty(rx)) rc = QERR_INVAL, snprintf(err, sizeof err, "no string satisfies the schema and its not");
    if (rc) {
        gram_re_free(rx);
        return sc_fail(c, rc, "%s", err);
    }
    return sc_seq3(c, LIT("\""), gram_b_regex_take(B, rx), LIT("\""));
}

gram_x sc_str(sctx *c, const json_t *s)
{
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    const int min = sc_count_of(mn, 0);
    int max = sc_count_of(mx, -1);
    const int bounded = min > 0 || max >= 0;
    if ((pat && !json_is_string(pat)) || (fmt && !json_is_string(fmt)) || (mn && !json_is_number(mn)) ||
        (mx && !json_is_number(mx)) || min < 0 || max < -1 || (max >= 0 && max < min))
        return sc_fail(c, QERR_INVAL, "a string keyword with a bad value");
    if (min > 10000) return sc_fail(c, QERR_UNSUPPORTED, "minLength above 10000");
    /* A bound above 2000 characters is generated as 2000 (or minLength):
     * outputs stay valid, longer strings are never produced (the automaton
     * would need a state a character). */
    if (max > 2000) max = min > 2000 ? min : 2000;
    const char *p = NULL;
    if (fmt) {
        p = sc_format_pattern(json_string_value(fmt));
        if (!p && sc_format_refused(json_string_value(fmt)))
            return sc_fail(c, QERR_UNSUPPORTED, "format '%s' is not supported", json_string_value(fmt));
        if (p && pat) return sc_fail(c, QERR_UNSUPPORTED, "pattern and format together are not supported");
    }
    gram_x body;
    const json_t *negs = json_object_get(s, NOT_KEY);
    if (negs && json_array_size(negs)) return str_negated(c, s, pat, p, min, max, bounded, negs);
    if (pat || p) {
        /* The pattern (or format), intersected with the length bounds. */
        gram_re *rx = NULL, *len = NULL, *both = NULL;
        char err[300];
        int rc = pat ? gram_re_compile(json_string_value(pat), json_string_length(pat),
                                       GRAM_RE_JSON_STRING | GRAM_RE_SUBSET, &rx, err, sizeof err)
                     : gram_re_compile(p, strlen(p), GRAM_RE_JSON_STRING | GRAM_RE_FULL, &rx, err, sizeof err);
        /* A long maximum whose product with the pattern has too many
         * states is halved until it fits (shorter strings, as valid). */
        for (int tries = 0; !rc && bounded; tries++) {
            char lp[64];
            if (max >= 0) snprintf(lp, sizeof lp, "[\\s\\S]{%d,%d}", min, max);
            else snprintf(lp, sizeof lp, "[\\s\\S]{%d,}", min);
            rc = gram_re_compile(lp, strlen(lp), GRAM_RE_JSON_STRING | GRAM_RE_FULL | GRAM_RE_SUBSET, &len, err, sizeof err);
            if (!rc) rc = gram_re_intersect(rx, len, &both, err, sizeof err);
            gram_re_free(len), len = NULL;
            if (rc == QERR_LIMIT && max > 64 && max / 2 >= min && tries < 8) {
                max /= 2, rc = 0;
                continue;
            }
            gram_re_free(rx);
            rx = both;
            break;
        }
        if (rc) return sc_fail(c, rc, "%s", err);
        body = gram_b_regex_take(B, rx);
    } else if (bounded) {
        body = gram_b_rep(B, sc_re(c, "[\\s\\S]", GRAM_RE_JSON_STRING | GRAM_RE_FULL), min, max);
    } else {
        return gram_b_ref(B, c->r_string);
    }
    return sc_seq3(c, LIT("\""), body, LIT("\""));
}

/* ---- numbers --------------------------------------------------------------------------- */

void sc_put(char *out, size_t cap, const char *fmt, ...)
{
    const size_t l = strlen(out);
    if (l >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + l, cap - l, fmt, ap);
    va_end(ap);
}

/* A pattern (no anchors) for the integers in [lo, hi], 0 <= lo <= hi (hi
 * < 0: no upper bound), appended to out. */
static void int_range(long long lo, long long hi, char *out, size_t cap)
{
    int first = 1;
    sc_put(out, cap, "(");
    long long p10 = 1;
    int digits = 1;
    for (long long a = lo; hi < 0 || a <= hi;) {
        while (p10 * 10 <= a && digits < 18) p10 *= 10, digits++;
        if (digits >= 18) break;
        /* Numbers with this many digits: [a, e]. */
        const long long top = p10 * 10 - 1, e = hi < 0 || hi > top ? top : hi;
        for (long long s = a; s <= e;) {
            long long k = 1;
            while (s % (k * 10) == 0 && s + k * 10 - 1 <= e && k * 10 <= p10) k *= 10;
            /* Blocks of size k from s with the same prefix, up to 10. */
            long long n = 1;
            while (n < 10 && (s / k) % 10 + n <= 9 && s + (n + 1) * k - 1 <= e) n++;
            if (!first) sc_put(out, cap, "|");
            first = 0;
            const long long pre = s / k / 10, d0 = (s / k) % 10, d1 = d0 + n - 1;
            if (pre || (s / k >= 10)) sc_put(out, cap, "%lld", pre);
            if (d0 == d1) sc_put(out, cap, "%lld", d0);
            else sc_put(out, cap, "[%lld-%lld]", d0, d1);
            for (long long kk = k; kk > 1; kk /= 10) sc_put(out, cap, "\\d");
            s += n * k;
        }
        if (hi >= 0 && e >= hi) break;
        a = top + 1;
    }
    if (hi < 0) sc_put(out, cap, "%s[1-9]\\d{%d,}", first ? "" : "|", digits);
    sc_put(out, cap, ")");
}

/* Numbers without an exponent: any, non-negative, above zero. */
#define ANY_NUM "-?(0|[1-9]\\d*)(\\.\\d+)?"
#define NONNEG "((0|[1-9]\\d*)(\\.\\d+)?)"
#define POSITIVE "(0\\.\\d*[1-9]\\d*|[1-9]\\d*(\\.\\d+)?)"

int sc_shortest_digits(double v)
{
    char t[40];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(t, sizeof t, "%.*g", p, v);
        if (strtod(t, NULL) == v) break;
    }
    return p;
}

/* A non-negative bound v as a decimal: its integer part and its fraction's
 * digits (none trailing zero), in the fewest digits that read back as v. */
static void decimal_of(double v, long long *ip, char *frac, size_t cap)
{
    char e[64], dig[32];
    snprintf(e, sizeof e, "%.*e", sc_shortest_digits(v) - 1, v);
    int nd = 0;
    const char *q = e;
    for (; *q && *q != 'e' && nd < (int)sizeof dig; q++)
        if (*q >= '0' && *q <= '9') dig[nd++] = *q;
    const int nint = (*q == 'e' ? atoi(q + 1) : 0) + 1; /* digits before the point */
    long long ipart = 0;
    for (int i = 0; i < nint; i++) ipart = ipart * 10 + (i < nd ? dig[i] - '0' : 0);
    size_t k = 0;
    for (int z = 0; z < -nint && k + 1 < cap; z++) frac[k++] = '0';
    for (int i = nint > 0 ? nint : 0; i < nd && k + 1 < cap; i++) frac[k++] = dig[i];
    while (k > 0 && frac[k - 1] == '0') k--;
    frac[k] = 0;
    *ip = ipart;
}

/* Non-negative decimals (no exponent) at least v (above it: excl). */
static void ge_re(double v, int excl, char *out, size_t cap)
{
    long long a;
    char d[40];
    decimal_of(v, &a, d, sizeof d);
    sc_put(out, cap, "(");
    int_range(a + 1, -1, out, cap);
    sc_put(out, cap, "(\\.\\d+)?");
    if (!d[0]) {
        sc_put(out, cap, excl ? "|%lld\\.\\d*[1-9]\\d*" : "|%lld(\\.\\d+)?", a);
    } else {
        /* The integer part a: a fraction above d, or d itself then more. */
        const int k = (int)strlen(d);
        for (int i = 0; i < k; i++)
            if (d[i] < '9') sc_put(out, cap, "|%lld\\.%.*s[%c-9]\\d*", a, i, d, d[i] + 1);
        sc_put(out, cap, "|%lld\\.%s\\d*%s", a, d, excl ? "[1-9]\\d*" : "");
    }
    sc_put(out, cap, ")");
}

/* Non-negative decimals (no exponent) at most v (below it: excl); 0 when
 * there are none. */
static int le_re(double v, int excl, char *out, size_t cap)
{
    long long b;
    char g[40];
    decimal_of(v, &b, g, sizeof g);
    int any = 0;
    sc_put(out, cap, "(");
    if (b >= 1) {
        int_range(0, b - 1, out, cap);
        sc_put(out, cap, "(\\.\\d+)?");
        any = 1;
    }
    if (!g[0]) {
        if (!excl) sc_put(out, cap, "%s%lld(\\.0+)?", any ? "|" : "", b), any = 1;
    } else {
        /* The integer part b: a fraction below g (a digit under g's, or a
         * part of g), or g itself then zeros. */
        const int k = (int)strlen(g);
        sc_put(out, cap, "%s%lld(\\.0+)?", any ? "|" : "", b);
        any = 1;
        for (int i = 0; i < k; i++)
            if (g[i] > '0') sc_put(out, cap, "|%lld\\.%.*s[0-%c]\\d*", b, i, g, g[i] - 1);
        for (int j = 1; j < k; j++) sc_put(out, cap, "|%lld\\.%.*s", b, j, g);
        if (!excl) sc_put(out, cap, "|%lld\\.%s0*", b, g);
    }
    sc_put(out, cap, ")");
    return any;
}

gram_x sc_num(sctx *c, const json_t *s, int integer)
{
    const json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
    const json_t *xmn = json_object_get(s, "exclusiveMinimum"), *xmx = json_object_get(s, "exclusiveMaximum");
    const json_t *mul = json_object_get(s, "multipleOf");
    /* multipleOf a whole number k: integers that are multiples of k (for a
     * number too: fewer outputs, all valid, and exact in floating point). */
    int mk = 0;
    if (mul) {
        const double m = json_is_number(mul) ? json_number_value(mul) : -1;
        if (!(m > 0)) return sc_fail(c, QERR_INVAL, "multipleOf must be a number above 0");
        if (m != floor(m) || m > 10000)
            return sc_fail(c, QERR_UNSUPPORTED, "multipleOf %g is not supported (only whole numbers up to 10000)", m);
        mk = (int)m;
        integer = 1;
    }
    double lo = -INFINITY, hi = INFINITY;
    int lo_x = 0, hi_x = 0;
    if (json_is_number(mn)) lo = json_number_value(mn);
    if (json_is_number(mx)) hi = json_number_value(mx);
    if (json_is_true(xmn)) lo_x = 1; /* draft 4: a flag on minimum */
    if (json_is_true(xmx)) hi_x = 1;
    if (json_is_number(xmn) && json_number_value(xmn) >= lo) lo = json_number_value(xmn), lo_x = 1;
    if (json_is_number(xmx) && json_number_value(xmx) <= hi) hi = json_number_value(xmx), hi_x = 1;
    if (isinf(lo) && isinf(hi) && mk <= 1) return gram_b_ref(B, integer ? c->r_integer : c->r_number);
    if (lo > 1e17 || hi < -1e17 || (!isinf(lo) && fabs(lo) > 1e17) || (!isinf(hi) && fabs(hi) > 1e17))
        return sc_fail(c, QERR_UNSUPPORTED, "numeric bounds beyond 1e17");
    if (integer) {
        /* Integers: the bounds rounded inward. */
        long long l = isinf(lo) ? LLONG_MIN : (long long)ceil(lo), h = isinf(hi) ? LLONG_MAX : (long long)floor(hi);
        if (lo_x && !isinf(lo) && (double)l == lo) l++;
        if (hi_x && !isinf(hi) && (double)h == hi) h--;
        if (l > h) return sc_fail(c, QERR_INVAL, "no integer lies between minimum and maximum");
        char p[4096] = "";
        sc_put(p, sizeof p, "(");
        int any = 0;
        if (h >= 0) {
            int_range(l > 0 ? l : 0, h == LLONG_MAX ? -1 : h, p, sizeof p);
            any = 1;
        }
        if (l < 0) {
            /* -x for x in [max(1, -h), -l]. */
            sc_put(p, sizeof p, "%s-", any ? "|" : "");
            int_range(h < 0 ? -h : 1, l == LLONG_MIN ? -1 : -l, p, sizeof p);
        }
        sc_put(p, sizeof p, ")");
        if (strlen(p) >= sizeof p - 1) return sc_fail(c, QERR_LIMIT, "numeric bounds too wide");
        if (mk <= 1) return sc_re(c, p, GRAM_RE_FULL);
        gram_re *range = NULL, *mult = NULL, *both = NULL;
        char err[300];
        int rc = gram_re_compile(p, strlen(p), GRAM_RE_FULL, &range, err, sizeof err);
        if (!rc) rc = gram_re_multiples(mk, &mult, err, sizeof err);
        if (!rc) rc = gram_re_intersect(range, mult, &both, err, sizeof err);
        gram_re_free(range);
        gram_re_free(mult);
        if (rc) return sc_fail(c, rc, "multipleOf %d: %s", mk, err);
        if (gram_re_empty(both)) {
            gram_re_free(both);
            return sc_fail(c, QERR_INVAL, "no multiple of %d lies between minimum and maximum", mk);
        }
        return gram_b_regex_take(B, both);
    }
    /* Numbers: the bounds compared as decimals (no exponent within bounds). */
    char lp[8192] = "", hp[8192] = "";
    if (isinf(lo)) sc_put(lp, sizeof lp, "%s", ANY_NUM);
    else if (lo >= 0) ge_re(lo, lo_x, lp, sizeof lp);
    else {
        char le[8192] = "";
        le_re(-lo, lo_x, le, sizeof le);
        sc_put(lp, sizeof lp, "(%s|-%s)", NONNEG, le);
    }
    if (isinf(hi)) sc_put(hp, sizeof hp, "%s", ANY_NUM);
    else if (hi < 0) {
        char ge[8192] = "";
        ge_re(-hi, hi_x, ge, sizeof ge);
        sc_put(hp, sizeof hp, "-%s", ge);
    } else {
        char le[8192] = "";
        const int some = le_re(hi, hi_x, le, sizeof le);
        const char *neg = hi == 0 && hi_x ? POSITIVE : NONNEG;
        if (some) sc_put(hp, sizeof hp, "(%s|-%s)", le, neg);
        else sc_put(hp, sizeof hp, "-%s", neg);
    }
    if (strlen(lp) >= sizeof lp - 1 || strlen(hp) >= sizeof hp - 1) return sc_fail(c, QERR_LIMIT, "numeric bounds too wide");
    gram_re *lr = NULL, *hr = NULL, *both = NULL;
    char err[300];
    int rc = gram_re_compile(lp, strlen(lp), GRAM_RE_FULL, &lr, err, sizeof err);
    if (!rc) rc = gram_re_compile(hp, strlen(hp), GRAM_RE_FULL, &hr, err, sizeof err);
    if (!rc) rc = gram_re_intersect(lr, hr, &both, err, sizeof err);
    gram_re_free(lr);
    gram_re_free(hr);
    if (rc) return sc_fail(c, rc, "numeric bounds: %s", err);
    if (gram_re_empty(both)) {
        gram_re_free(both);
        return sc_fail(c, QERR_INVAL, "no number lies between minimum and maximum");
    }
    return gram_b_regex_take(B, both);
}
