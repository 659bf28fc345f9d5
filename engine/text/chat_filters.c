/* chat_filters.c - jinja2's filters and tests, as HF's environment has them.
 *
 * Each filter follows the code of jinja2/filters.py (3.1) rather than its
 * documentation, because templates see the difference:
 *   - map, select, reject, selectattr, rejectattr, unique, items and reverse
 *     return iterators in jinja2, so here they return generator lists
 *     (QL_GEN): `|length` on them fails, `if xs|select(...)` is always
 *     true, and they are empty once iterated.  `|list` gives a real list.
 *   - string filters (trim, upper, replace...) apply str() first, so an
 *     undefined value becomes "" and None becomes "None".
 *   - attribute paths ("a.b.0") look items up first, as make_attrgetter does.
 *   - sort, dictsort, unique, min and max ignore case unless told otherwise;
 *     sorting is stable, reverse=True included.
 *   - tojson is HF's: json.dumps(x, ensure_ascii=False, indent=None,
 *     separators=None, sort_keys=False), so ", " and ": " separators and
 *     non-ASCII kept; indent= switches to "," and newlines.
 *
 * A filter or test jinja2 has but this file does not implement (random,
 * groupby, urlize...) is accepted by the parser and fails when it runs,
 * naming itself; an unknown name fails at compile time like jinja2
 * ("No filter named 'x'.").
 */
#include "chat_int.h"
#include "qerr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int lineof(const qcj_node *n) { return n ? n->line : 0; }
static int given(qcj_val v) { return v.t != QV_MISSING; }
static int is_int(qcj_val v) { return v.t == QV_INT || v.t == QV_BOOL; }

static qcj_val strval(qcj_str *s)
{
    qcj_val v = { .t = QV_STR };
    v.u.s = s;
    return v;
}

/* markupsafe's soft_str: str(v), except that a string (a Markup too) stays as it is. */
static qcj_val soft_str(qcj_ctx *c, qcj_val v) { return v.t == QV_STR ? v : strval(qcj_to_str(c, v)); }
static int is_markup(qcj_val v) { return v.t == QV_STR && v.markup; }

void qcj_bind(qcj_ctx *c, const qcj_node *at, const char *fname, const qcj_args *a, const char *const *params,
              size_t nreq, qcj_val *slots)
{
    size_t np = 0;
    while (params[np]) np++;
    for (size_t i = 0; i < np; i++) slots[i] = qcj_missing();
    if (a->npos > np)
        qcj_fail(c, QERR_INVAL, lineof(at), "%s() takes at most %zu argument(s) (%zu given)", fname, np, a->npos);
    for (size_t i = 0; i < a->npos; i++) slots[i] = a->pos[i];
    for (size_t k = 0; k < a->nkw; k++) {
        size_t j;
        for (j = 0; j < np; j++)
            if (!strcmp(params[j], a->kwn[k])) break;
        if (j == np) qcj_fail(c, QERR_INVAL, lineof(at), "%s() got an unexpected keyword argument '%s'", fname, a->kwn[k]);
        if (given(slots[j])) qcj_fail(c, QERR_INVAL, lineof(at), "%s() got multiple values for argument '%s'", fname, a->kwn[k]);
        slots[j] = a->kwv[k];
    }
    for (size_t i = 0; i < nreq; i++)
        if (!given(slots[i])) qcj_fail(c, QERR_INVAL, lineof(at), "%s() missing required argument '%s'", fname, params[i]);
}

static qcj_list *gen_new(qcj_ctx *c, const char *name, size_t cap)
{
    qcj_list *l = qcj_list_new(c, QL_GEN, cap);
    l->gen_name = name;
    return l;
}

/* ---- attribute getters ----------------------------------------------------------- */

typedef struct {
    qcj_val *parts;
    size_t n;
    int lower;     /* postprocess: ignore case */
    qcj_val dflt;  /* QV_MISSING: none */
} getter;

static void getter_init(qcj_ctx *c, getter *g, qcj_val attr, int lower, qcj_val dflt)
{
    memset(g, 0, sizeof *g);
    g->lower = lower;
    g->dflt = dflt;
    if (!given(attr) || attr.t == QV_NONE) return;
    if (attr.t != QV_STR) {
        g->parts = qcj_alloc(c, sizeof *g->parts);
        g->parts[0] = attr;
        g->n = 1;
        return;
    }
    const qcj_str *s = attr.u.s;
    size_t cnt = 1;
    for (size_t i = 0; i < s->len; i++) cnt += s->s[i] == '.';
    g->parts = qcj_allocn(c, cnt, sizeof *g->parts);
    size_t st = 0;
    for (size_t i = 0; i <= s->len; i++) {
        if (i < s->len && s->s[i] != '.') continue;
        size_t len = i - st;
        int digits = len > 0 && len < 18;
        for (size_t k = st; k < i; k++)
            if (s->s[k] < '0' || s->s[k] > '9') digits = 0;
        g->parts[g->n++] = digits ? qcj_int(strtoll(s->s + st, NULL, 10)) : qcj_strv(c, s->s + st, len);
        st = i + 1;
    }
}

static qcj_val getter_apply(qcj_ctx *c, const qcj_node *at, const getter *g, qcj_val item)
{
    for (size_t i = 0; i < g->n; i++) {
        item = qcj_getitem(c, at, item, g->parts[i]);
        if (given(g->dflt) && g->dflt.t != QV_NONE && item.t == QV_UNDEF) item = g->dflt;
    }
    if (g->lower && item.t == QV_STR) item = strval(qcj_str_case(c, item.u.s, QC_LOWER));
    return item;
}

/* ---- sorting ------------------------------------------------------------------------ */

static int key_less(qcj_ctx *c, const qcj_node *at, const qcj_val *keys, size_t a, size_t b, int reverse)
{
    int r = qcj_order(c, at, keys[a], keys[b], "<");
    if (r == 2) return 0;
    return reverse ? r > 0 : r < 0;
}

/* Stable merge sort of indices by keys. */
static void msort(qcj_ctx *c, const qcj_node *at, size_t *ix, size_t *tmp, size_t n, const qcj_val *keys, int reverse)
{
    if (n < 2) return;
    size_t h = n / 2;
    msort(c, at, ix, tmp, h, keys, reverse);
    msort(c, at, ix + h, tmp, n - h, keys, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = key_less(c, at, keys, ix[j], ix[i], reverse) ? ix[j++] : ix[i++];
    while (i < h) tmp[k++] = ix[i++];
    while (j < n) tmp[k++] = ix[j++];
    memcpy(ix, tmp, n * sizeof *ix);
}

static qcj_list *sorted(qcj_ctx *c, const qcj_node *at, const qcj_val *items, const qcj_val *keys, size_t n, int reverse)
{
    size_t *ix = qcj_allocn(c, n ? n : 1, sizeof *ix), *tmp = qcj_allocn(c, n ? n : 1, sizeof *tmp);
    for (size_t i = 0; i < n; i++) ix[i] = i;
    msort(c, at, ix, tmp, n, keys, reverse);
    qcj_list *l = qcj_list_new(c, QL_LIST, n);
    for (size_t i = 0; i < n; i++) l->v[i] = items[ix[i]];
    l->n = n;
    return l;
}

/* ---- filters -------------------------------------------------------------------------- */

#define FILTER(name) static qcj_val name(qcj_ctx *c, const qcj_node *at, qcj_val v, const qcj_args *a)

static const char *const P_NONE[] = { NULL };

FILTER(f_abs)
{
    qcj_val s[1];
    qcj_bind(c, at, "abs", a, P_NONE, 0, s);
    if (v.t == QV_FLOAT) return qcj_float(fabs(v.u.f));
    if (is_int(v)) {
        if (v.u.i == INT64_MIN) qcj_fail(c, QERR_INVAL, lineof(at), "integer overflow");
        return qcj_int(v.u.i < 0 ? -v.u.i : v.u.i);
    }
    qcj_fail(c, QERR_INVAL, lineof(at), "bad operand type for abs(): '%s'", qcj_type_name(v));
}

FILTER(f_attr)
{
    static const char *const P[] = { "name", NULL };
    qcj_val s[1], out;
    qcj_bind(c, at, "attr", a, P, 1, s);
    if (v.t == QV_UNDEF) qcj_fail_undef(c, lineof(at), v);
    const qcj_str *name = qcj_to_str(c, s[0]);
    if (qcj_attr(c, v, name->s, name->len, &out)) return out;
    return qcj_undef_attr(c, v, name->s);
}

FILTER(f_batch)
{
    static const char *const P[] = { "linecount", "fill_with", NULL };
    qcj_val s[2];
    qcj_bind(c, at, "batch", a, P, 1, s);
    if (!is_int(s[0])) qcj_fail(c, QERR_INVAL, lineof(at), "batch() linecount must be an integer");
    int64_t lc = s[0].u.i;
    const qcj_val *items;
    size_t n;
    qcj_iter(c, at, v, &items, &n);
    qcj_list *out = gen_new(c, "generator object do_batch", 0), *tmp = qcj_list_new(c, QL_LIST, 0);
    for (size_t i = 0; i < n; i++) {
        if ((int64_t)tmp->n == lc) {
            qcj_list_push(c, out, qcj_listv(tmp));
            tmp = qcj_list_new(c, QL_LIST, 0);
        }
        qcj_list_push(c, tmp, items[i]);
    }
    if (tmp->n) {
        if (given(s[1]) && s[1].t != QV_NONE)
            while ((int64_t)tmp->n < lc) qcj_list_push(c, tmp, s[1]);
        qcj_list_push(c, out, qcj_listv(tmp));
    }
    return qcj_listv(out);
}

static qcj_val case_filter(qcj_ctx *c, const qcj_node *at, qcj_val v, const qcj_args *a, int mode, const char *nm)
{
    qcj_val s[1];
    qcj_bind(c, at, nm, a, P_NONE, 0, s);
    return qcj_strval(qcj_str_case(c, qcj_to_str(c, v), mode), is_markup(v));
}

FILTER(f_capitalize) { return case_filter(c, at, v, a, QC_CAPITALIZE, "capitalize"); }
FILTER(f_upper) { return case_filter(c, at, v, a, QC_UPPER, "upper"); }
FILTER(f_lower) { return case_filter(c, at, v, a, QC_LOWER, "lower"); }

FILTER(f_title)
{
    /* jinja2 splits on runs of [-\s({\[<] and capitalises each piece */
    qcj_val s[1];
    qcj_bind(c, at, "title", a, P_NONE, 0, s);
    const qcj_str *str = qcj_to_str(c, v);
    char *out = qcj_alloc(c, str->len * 2 + 1);
    size_t i = 0, k = 0;
    int start = 1;
    while (i < str->len) {
        uint32_t cp;
        i += qutf8_decode(str->s + i, str->len - i, &cp);
        int sep = qcj_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
        uint32_t m = sep ? cp : start ? qcj_upper(cp) : qcj_lower(cp);
        if (!sep && start && cp == 0xDF) {
            out[k++] = 'S';
            out[k++] = 's';
        } else {
            k += qutf8_encode(m, out + k);
        }
        start = sep;
    }
    return qcj_strv(c, out, k);
}

FILTER(f_center)
{
    static const char *const P[] = { "width", NULL };
    qcj_val s[1];
    qcj_bind(c, at, "center", a, P, 0, s);
    qcj_val w = given(s[0]) ? s[0] : qcj_int(80);
    qcj_val self = soft_str(c, v);
    qcj_args ca = { &w, 1, NULL, NULL, 0 };
    qcj_val out;
    if (!qcj_attr(c, self, "center", 6, &out)) return self;
    return qcj_call(c, at, out, &ca);
}

FILTER(f_default)
{
    static const char *const P[] = { "default_value", "boolean", NULL };
    qcj_val s[2];
    qcj_bind(c, at, "default", a, P, 0, s);
    qcj_val dflt = given(s[0]) ? s[0] : qcj_strv(c, "", 0);
    int boolean = given(s[1]) && qcj_truthy(s[1]);
    if (v.t == QV_UNDEF || (boolean && !qcj_truthy(v))) return dflt;
    return v;
}

FILTER(f_dictsort)
{
    static const char *const P[] = { "case_sensitive", "by", "reverse", NULL };
    qcj_val s[3];
    qcj_bind(c, at, "dictsort", a, P, 0, s);
    int pos = 0;
    if (given(s[1])) {
        const qcj_str *by = qcj_to_str(c, s[1]);
        if (!strcmp(by->s, "value")) pos = 1;
        else if (strcmp(by->s, "key")) qcj_fail(c, QERR_INVAL, lineof(at), "You can only sort by either \"key\" or \"value\"");
    }
    if (v.t == QV_UNDEF) qcj_fail_undef(c, lineof(at), v);
    if (v.t != QV_DICT) qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object has no attribute 'items'", qcj_type_name(v));
    const qcj_dict *d = v.u.d;
    qcj_val *items = qcj_allocn(c, d->n ? d->n : 1, sizeof *items), *keys = qcj_allocn(c, d->n ? d->n : 1, sizeof *keys);
    int lower = !(given(s[0]) && qcj_truthy(s[0]));
    for (size_t i = 0; i < d->n; i++) {
        items[i] = qcj_pair(c, d->k[i], d->v[i]);
        qcj_val k = pos ? d->v[i] : d->k[i];
        keys[i] = lower && k.t == QV_STR ? strval(qcj_str_case(c, k.u.s, QC_LOWER)) : k;
    }
    return qcj_listv(sorted(c, at, items, keys, d->n, given(s[2]) && qcj_truthy(s[2])));
}

FILTER(f_escape)
{
    qcj_val s[1];
    qcj_bind(c, at, "escape", a, P_NONE, 0, s);
    return qcj_escape(c, v);
}

FILTER(f_forceescape)
{
    qcj_val s[1];
    qcj_bind(c, at, "forceescape", a, P_NONE, 0, s);
    return qcj_strval(qcj_escape_str(c, qcj_to_str(c, v)), 1);
}

FILTER(f_first)
{
    qcj_val s[1];
    qcj_bind(c, at, "first", a, P_NONE, 0, s);
    const qcj_val *items;
    size_t n;
    qcj_iter(c, at, v, &items, &n);
    return n ? items[0] : qcj_undef_hint(c, "No first item, sequence was empty.", 0);
}

FILTER(f_last)
{
    qcj_val s[1];
    qcj_bind(c, at, "last", a, P_NONE, 0, s);
    if (v.t == QV_LIST && v.u.l->kind == QL_GEN)
        qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object is not reversible", qcj_type_name(v));
    const qcj_val *items;
    size_t n;
    qcj_iter(c, at, v, &items, &n);
    return n ? items[n - 1] : qcj_undef_hint(c, "No last item, sequence was empty.", 0);
}

/* Python float(str): surrounding whitespace allowed, whole string consumed. */
static int parse_float(qcj_ctx *c, const qcj_str *s, double *out)
{
    qcj_str *t = qcj_strip(c, s, NULL, 1, 1);
    if (!t->len) return 0;
    char *end;
    *out = strtod(t->s, &end);
    if (end != t->s + t->len) return 0;
    /* strtod accepts hex floats; Python does not */
    for (size_t i = 0; i < t->len; i++)
        if (t->s[i] == 'x' || t->s[i] == 'X') return 0;
    return 1;
}

FILTER(f_float)
{
    static const char *const P[] = { "default", NULL };
    qcj_val s[1];
    qcj_bind(c, at, "float", a, P, 0, s);
    qcj_val dflt = given(s[0]) ? s[0] : qcj_float(0.0);
    if (v.t == QV_UNDEF) qcj_fail_undef(c, lineof(at), v);
    if (v.t == QV_FLOAT) return v;
    if (is_int(v)) return qcj_float((double)v.u.i);
    double d;
    if (v.t == QV_STR && parse_float(c, v.u.s, &d)) return qcj_float(d);
    return dflt;
}

/* Python int(str, base) for bases 2..36 and 0; 0 when it does not parse. */
static int parse_int(qcj_ctx *c, const qcj_str *s, int64_t base, int64_t *out)
{
    qcj_str *t = qcj_strip(c, s, NULL, 1, 1);
    const char *p = t->s, *e = t->s + t->len;
    int neg = 0;
    if (p < e && (*p == '+' || *p == '-')) neg = *p++ == '-';
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (e - p > 2 && p[0] == '0') {
            char k = (char)(p[1] | 0x20);
            int b = k == 'x' ? 16 : k == 'o' ? 8 : k == 'b' ? 2 : 0;
            if (b && (base == 0 || base == b)) {
                base = b;
                p += 2;
                if (p < e && *p == '_') p++;
            }
        }
        if (base == 0) base = 10;
    }
    if (base < 2 || base > 36 || p >= e) return 0;
    uint64_t v = 0;
    int last_us = 1;
    for (; p < e; p++) {
        if (*p == '_') {
            if (last_us) return 0;
            last_us = 1;
            continue;
        }
        int d = (*p >= '0' && *p <= '9') ? *p - '0' : ((*p | 0x20) >= 'a' && (*p | 0x20) <= 'z') ? (*p | 0x20) - 'a' + 10 : 99;
        if (d >= base) return 0;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return 0;
        v = v * (uint64_t)base + (uint64_t)d;
        last_us = 0;
    }
    if (last_us) return 0;
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg) return 0;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

FILTER(f_int)
{
    static const char *const P[] = { "default", "base", NULL };
    qcj_val s[2];
    qcj_bind(c, at, "int", a, P, 0, s);
    qcj_val dflt = given(s[0]) ? s[0] : qcj_int(0);
    int64_t base = given(s[1]) && is_int(s[1]) ? s[1].u.i : 10;
    if (v.t == QV_UNDEF) qcj_fail_undef(c, lineof(at), v);
    if (is_int(v)) return qcj_int(v.u.i);
    double d;
    if (v.t == QV_FLOAT) {
        d = v.u.f;
    } else if (v.t == QV_STR) {
        int64_t i;
        if (parse_int(c, v.u.s, base, &i)) return qcj_int(i);
        if (!parse_float(c, v.u.s, &d)) return dflt;
    } else {
        return dflt;
    }
    if (isnan(d)) return dflt;
    if (isinf(d)) qcj_fail(c, QERR_INVAL, lineof(at), "cannot convert float infinity to integer");
    if (!(d > -9.2233720368547758e18 && d < 9.2233720368547758e18)) qcj_fail(c, QERR_INVAL, lineof(at), "integer overflow");
    return qcj_int((int64_t)d);
}

FILTER(f_format)
{
    if (a->npos && a->nkw) qcj_fail(c, QERR_INVAL, lineof(at), "can't handle positional and keyword arguments at the same time");
    qcj_val args;
    if (a->nkw) {
        qcj_dict *d = qcj_dict_new(c);
        for (size_t i = 0; i < a->nkw; i++) qcj_dict_set(c, at, d, qcj_cstrv(c, a->kwn[i]), a->kwv[i]);
        args.t = QV_DICT;
        args.u.d = d;
    } else {
        qcj_list *l = qcj_list_new(c, QL_TUPLE, a->npos);
        if (a->npos) memcpy(l->v, a->pos, a->npos * sizeof *l->v);
        l->n = a->npos;
        args = qcj_listv(l);
    }
    return qcj_percent_format(c, at, qcj_to_str(c, v), is_markup(v), args);
}

FILTER(f_indent)
{
    static const char *const P[] = { "width", "first", "blank", NULL };
    qcj_val s[3];
    qcj_bind(c, at, "indent", a, P, 0, s);
    if (v.t != QV_STR) {
        if (v.t == QV_UNDEF) qcj_fail_undef(c, lineof(at), v);
        qcj_fail(c, QERR_INVAL, lineof(at), "unsupported operand type(s) for +=: '%s' and 'str'", qcj_type_name(v));
    }
    const qcj_str *ind;
    if (given(s[0]) && s[0].t == QV_STR) {
        ind = s[0].u.s;
    } else {
        int64_t w = given(s[0]) && is_int(s[0]) ? s[0].u.i : 4;
        if (w < 0) w = 0;
        if (w > 4096) qcj_fail(c, QERR_LIMIT, lineof(at), "indent width too large");
        char *sp = qcj_alloc(c, (size_t)w + 1);
        memset(sp, ' ', (size_t)w);
        ind = qcj_str_new(c, sp, (size_t)w);
    }
    int first = given(s[1]) && qcj_truthy(s[1]), blank = given(s[2]) && qcj_truthy(s[2]);
    qcj_buf t = { 0 };
    qcj_buf_put(c, &t, v.u.s->s, v.u.s->len);
    qcj_buf_putc(c, &t, '\n');
    qcj_list *lines = qcj_splitlines(c, qcj_str_new(c, t.p, t.n), 0);
    qcj_buf b = { 0 };
    if (first) qcj_buf_put(c, &b, ind->s, ind->len);
    for (size_t i = 0; i < lines->n; i++) {
        const qcj_str *ln = lines->v[i].u.s;
        if (i) {
            qcj_buf_putc(c, &b, '\n');
            if (blank || ln->len) qcj_buf_put(c, &b, ind->s, ind->len);
        }
        qcj_buf_put(c, &b, ln->s, ln->len);
    }
    return qcj_strval(qcj_str_new(c, b.p ? b.p : "", b.n), v.markup);
}

FILTER(f_items)
{
    qcj_val s[1];
    qcj_bind(c, at, "items", a, P_NONE, 0, s);
    qcj_list *l = gen_new(c, "generator object do_items", 0);
    if (v.t == QV_UNDEF) return qcj_listv(l);
    if (v.t != QV_DICT) qcj_fail(c, QERR_INVAL, lineof(at), "Can only get item pairs from a mapping.");
    for (size_t i = 0; i < v.u.d->n; i++) qcj_list_push(c, l, qcj_pair(c, v.u.d->k[i], v.u.d->v[i]));
    return qcj_listv(l);
}

FILTER(f_join)
{
    static const char *const P[] = { "d", "attribute", NULL };
    qcj_val s[2];
    qcj_bind(c, at, "join", a, P, 0, s);
    const qcj_str *sep = given(s[0]) ? qcj_to_str(c, s[0]) : qcj_str_new(c, "", 0);
    getter g;
    getter_init(c, &g, s[1], 0, qcj_missing());
    const qcj_val *items;
    size_t n;
    qcj_iter(c, at, v, &items, &n);
    qcj_buf b = { 0 };
    for (size_t i = 0; i < n; i++) {
        if (i) qcj_buf_put(c, &b, sep->s, sep->len);
        qcj_write_str(c, &b, getter_apply(c, at, &g, items[i]));
    }
    return qcj_strv(c, b.p ? b.p : "", b.n);
}

FILTER(f_length)
{
    qcj_val s[1];
    qcj_bind(c, at, "length", a, P_NONE, 0, s);
    switch (v.t) {
    case QV_UNDEF: return qcj_int(0);
    case QV_STR: return qcj_int((int64_t)v.u.s->nchars);
    case QV_DICT: return qcj_int((int64_t)v.u.d->n);
    case QV_LIST:
        if (v.u.l->kind != QL_GEN) return qcj_int((int64_t)v.u.l->n);
        break;
    default: break;
    }
    qcj_fail(c, QERR_INVAL, lineof(at), "object of type '%s' has no len()", qcj_type_name(v));
}

FILTER(f_list)
{
    qcj_val s[1];
    qcj_bind(c, at, "list", a, P_NONE, 0, s);
    const qcj_val *items;
    size_t n;
    qcj_iter(c, at, v, &items, &n);
    qcj_list *l = qcj_list_new(c, QL_LIST, n);
    if (n) memcpy(l->v, items, n * sizeof *items);
    l->n = n;
    return qcj_listv(l);
}

FILTER(f_map)
{
    qcj_list *out = gen_new(c, "generator object sync_do_map", 0);
    if (!qcj_truthy(v)) return qcj_listv(out);
    const qcj_val *items;
    size_t n;
    int by_attr = !a->npos;
    getter g;
    if (by_attr) {
        qcj_val attr = qcj_missing(), dflt = qcj_missing();
        for (size_t i = 0; i < a->nkw; i++) {
            if (!strcmp(a->kwn[i], "attribute")) attr = a->kwv[i];
            else if (!strcmp(a->kwn[i], "default")) dflt = a->kwv[i];
            else qcj_fail(c, QERR_INVAL, lineof(at), "Unexpected keyword argument '%s'", a->kwn[i]);
        }
        if (!given(attr)) qcj_fail(c, QERR_INVAL, lineof(at), "map requires a filter argument");
        getter_init(c, &g, attr, 0, dflt);
    }
    qcj_iter(c, at, v, &items, &n);
    for (size_t i = 0; i < n; i++) {
        if (by_attr) {
            qcj_list_push(c, out, getter_apply(c, at, &g, items[i]));
        } else {
            const qcj_str *name = qcj_to_str(c, a->pos[0]);
            qcj_args rest = { a->pos + 1, a->npos - 1, a->kwn, a->kwv, a->nkw };
            qcj_list_push(c, out, qcj_apply_filter(c, at, name->s, items[i], &rest));
        }
    }
    return qcj_listv(out);
}

static qcj_val min_max(qcj_ctx *c, const qcj_node *at, qcj_val v, const qcj_args *a, int want_max)
{
    static const char *const P[] = { "case_sensitive", "attribute", NULL };
    qcj_val s[2];
    qcj_bind(c, at, want_max ? "max" : "min", a, P, 0, s);
    const qcj_val *items;
    size_t n;
    qcj_iter(c, at, v, &items, &n);
    if (!n) return qcj_undef_hint(c, "No aggregated item, sequence was empty.", 0);
    getter g;
    getter_init(c, &g, s[1], !(given(s[0]) && qcj_truthy(s[0])), qcj_missing());
    size_t best = 0;
    qcj_val bk = getter_apply(c, at, &g, items[0]);
    for (size_t i = 1; i < n; i++) {
        qcj_val k = getter_apply(c, at, &g, items[i]);
        int r = qcj_order(c, at, k, bk, want_max ? ">" : "<");
        if (r != 2 && (want_max ? r > 0 : r < 0)) {
            best = i;
            bk = k;
        }
    }
    return items[best];
}

FILTER(f_max) { return min_max(c, at, v, a, 1); }
FILTER(f_min) { return min_max(c, at, v, a, 0); }

static qcj_val select_reject(qcj_ctx *c, const qcj_node *at, qcj_val v, const qcj_args *a, int keep, int by_attr)
{
    qcj_list *out = gen_new(c, "generator object select_or_reject", 0);
    if (!qcj_truthy(v)) return qcj_listv(out);
    size_t off = 0;
    getter g;
    memset(&g, 0, sizeof g);
    g.dflt = qcj_missing();
    if (by_attr) {
        if (!a->npos) qcj_fail(c, QERR_INVAL, lineof(at), "Missing parameter for attribute name");
        getter_init(c, &g, a->pos[0], 0, qcj_missing());
        off = 1;
    }
    const qcj_str *test = a->npos > off ? qcj_to_str(c, a->pos[off]) : NULL;
    qcj_args rest = { a->npos > off ? a->pos + off + 1 : NULL, a->npos > off ? a->npos - off - 1 : 0, a->kwn, a->kwv,
                      a->nkw };
    const qcj_val *items;
    size_t n;
    qcj_iter(c, at, v, &items, &n);
    for (size_t i = 0; i < n; i++) {
        qcj_val x = by_attr ? getter_apply(c, at, &g, items[i]) : items[i];
        int r = test ? qcj_apply_test(c, at, test->s, x, &rest) : qcj_truthy(x);
        if (r == keep) qcj_list_push(c, out, items[i]);
    }
    return qcj_listv(out);
}

FILTER(f_select) { return select_reject(c, at, v, a, 1, 0); }
FILTER(f_reject) { return select_reject(c, at, v, a, 0, 0); }
FILTER(f_selectattr) { return select_reject(c, at, v, a, 1, 1); }
FILTER(f_rejectattr) { return select_reject(c, at, v, a, 0, 1); }

FILTER(f_replace)
{
    static const char *const P[] = { "old", "new", "count", NULL };
    qcj_val s[3];
    qcj_bind(c, at, "replace", a, P, 2, s);
    int64_t count = -1;
    if (given(s[2]) && s[2].t != QV_NONE) {
        if (!is_int(s[2])) qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object cannot be interpreted as an integer", qcj_type_name(s[2]));
        count = s[2].u.i;
    }
    return strval(qcj_replace(c, qcj_to_str(c, v), qcj_to_str(c, s[0]), qcj_to_str(c, s[1]), count));
}

FILTER(f_reverse)
{
    qcj_val s[1];
    qcj_bind(c, at, "reverse", a, P_NONE, 0, s);
    if (v.t == QV_STR) {
        const qcj_str *str = v.u.s;
        char *out = qcj_alloc(c, str->len + 1);
        size_t i = 0;
        while (i < str->len) {
            uint32_t cp;
            size_t k = qutf8_decode(str->s + i, str->len - i, &cp);
            memcpy(out + str->len - i - k, str->s + i, k);
            i += k;
        }
        return qcj_strval(qcj_str_new(c, out, str->len), v.markup);
    }
    int gen = v.t == QV_LIST && v.u.l->kind == QL_GEN;
    if (v.t != QV_LIST && v.t != QV_DICT && v.t != QV_UNDEF) qcj_fail(c, QERR_INVAL, lineof(at), "argument must be iterable");
    const qcj_val *items;
    size_t n;
    qcj_iter(c, at, v, &items, &n);
    qcj_list *l = gen ? qcj_list_new(c, QL_LIST, n) : gen_new(c, v.t == QV_DICT ? "dict_reversekeyiterator object" : "list_reverseiterator object", n);
    for (size_t i = 0; i < n; i++) l->v[i] = items[n - 1 - i];
    l->n = n;
    return qcj_listv(l);
}

/* Python round(x, ndigits) for floats: correctly rounded, ties to even. */
static double round_float(double x, int64_t nd)
{
    if (!isfinite(x)) return x;
    if (nd >= 0) {
        if (nd > 330) return x;
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)nd, x);
        return strtod(buf, NULL);
    }
    if (nd < -330) return copysign(0.0, x);
    double p = pow(10.0, (double)-nd);
    double r = nearbyint(x / p) * p;
    return isfinite(r) ? r : x;
}

FILTER(f_round)
{
    static const char *const P[] = { "precision", "method", NULL };
    qcj_val s[2];
    qcj_bind(c, at, "round", a, P, 0, s);
    int64_t prec = 0;
    if (given(s[0])) {
        if (!is_int(s[0])) qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object cannot be interpreted as an integer", qcj_type_name(s[0]));
        prec = s[0].u.i;
    }
    const char *method = "common";
    if (given(s[1])) method = qcj_to_str(c, s[1])->s;
    int common = !strcmp(method, "common"), ceil_m = !strcmp(method, "ceil"), floor_m = !strcmp(method, "floor");
    if (!common && !ceil_m && !floor_m) qcj_fail(c, QERR_INVAL, lineof(at), "method must be common, ceil or floor");
    if (v.t == QV_UNDEF) qcj_fail_undef(c, lineof(at), v);
    if (!qcj_is_num(v)) qcj_fail(c, QERR_INVAL, lineof(at), "type %s doesn't define __round__ method", qcj_type_name(v));
    if (common) {
        if (v.t == QV_FLOAT) return qcj_float(round_float(v.u.f, prec));
        if (prec >= 0) return qcj_int(v.u.i);
        if (prec < -18) return qcj_int(0);
        int64_t p = 1;
        for (int64_t i = 0; i < -prec; i++) p *= 10;
        int64_t q = v.u.i / p, r = v.u.i % p;
        if (r < 0) {
            r += p;
            q--;
        }
        if (2 * r > p || (2 * r == p && (q & 1))) q++;
        int64_t out;
        if (__builtin_mul_overflow(q, p, &out)) qcj_fail(c, QERR_INVAL, lineof(at), "integer overflow");
        return qcj_int(out);
    }
    double p = pow(10.0, (double)prec), x = qcj_num(v) * p;
    return qcj_float((ceil_m ? ceil(x) : floor(x)) / p);
}

FILTER(f_safe)
{
    qcj_val s[1];
    qcj_bind(c, at, "safe", a, P_NONE, 0, s);
    return qcj_strval(qcj_to_str(c, v), 1);
}

FILTER(f_sort)
{
    static const char *const P[] = { "reverse", "case_sensitive", "attribute", NULL };
    qcj_val s[3];
    qcj_bind(c, at, "sort", a, P, 0, s);
    const qcj_val *items;
    size_t n;
    qcj_iter(c, at, v, &items, &n);
    int lower = !(given(s[1]) && qcj_truthy(s[1]));
    /* attribute may list several comma-separated paths: keys are tuples */
    getter gs[8];
    size_t ng = 0;
    if (given(s[2]) && s[2].t == QV_STR && memchr(s[2].u.s->s, ',', s[2].u.s->len)) {
        const qcj_str *as = s[2].u.s;
        size_t st = 0;
        for (size_t i = 0; i <= as->len && ng < 8; i++) {
            if (i < as->len && as->s[i] != ',') continue;
            getter_init(c, &gs[ng++], qcj_strv(c, as->s + st, i - st), lower, qcj_missing());
            st = i + 1;
        }
    } else {
        getter_init(c, &gs[ng++], s[2], lower, qcj_missing());
    }
    qcj_val *keys = qcj_allocn(c, n ? n : 1, sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        if (ng == 1) {
            keys[i] = getter_apply(c, at, &gs[0], items[i]);
            continue;
        }
        qcj_list *t = qcj_list_new(c, QL_TUPLE, ng);
        for (size_t k = 0; k < ng; k++) t->v[k] = getter_apply(c, at, &gs[k], items[i]);
        t->n = ng;
        keys[i] = qcj_listv(t);
    }
    return qcj_listv(sorted(c, at, items, keys, n, given(s[0]) && qcj_truthy(s[0])));
}

FILTER(f_string)
{
    qcj_val s[1];
    qcj_bind(c, at, "string", a, P_NONE, 0, s);
    return soft_str(c, v);
}

FILTER(f_sum)
{
    static const char *const P[] = { "attribute", "start", NULL };
    qcj_val s[2];
    qcj_bind(c, at, "sum", a, P, 0, s);
    getter g;
    getter_init(c, &g, s[0], 0, qcj_missing());
    const qcj_val *items;
    size_t n;
    qcj_iter(c, at, v, &items, &n);
    qcj_val acc = given(s[1]) ? s[1] : qcj_int(0);
    if (acc.t == QV_STR) qcj_fail(c, QERR_INVAL, lineof(at), "sum() can't sum strings [use ''.join(seq) instead]");
    for (size_t i = 0; i < n; i++) acc = qcj_binop(c, at, OP_ADD, acc, getter_apply(c, at, &g, items[i]));
    return acc;
}

FILTER(f_tojson)
{
    static const char *const P[] = { "ensure_ascii", "indent", "separators", "sort_keys", NULL };
    qcj_val s[4];
    qcj_bind(c, at, "tojson", a, P, 0, s);
    qcj_json_opts o = { 0 };
    o.ensure_ascii = given(s[0]) && qcj_truthy(s[0]);
    o.sort_keys = given(s[3]) && qcj_truthy(s[3]);
    if (given(s[1]) && s[1].t != QV_NONE) {
        if (s[1].t == QV_STR) {
            o.indent = s[1].u.s->s;
            o.indent_len = s[1].u.s->len;
        } else if (is_int(s[1])) {
            int64_t w = s[1].u.i < 0 ? 0 : s[1].u.i;
            if (w > 4096) qcj_fail(c, QERR_LIMIT, lineof(at), "indent too large");
            char *sp = qcj_alloc(c, (size_t)w + 1);
            memset(sp, ' ', (size_t)w);
            o.indent = sp;
            o.indent_len = (size_t)w;
        } else {
            qcj_fail(c, QERR_INVAL, lineof(at), "indent must be an int or a str, not %s", qcj_type_name(s[1]));
        }
    }
    o.item_sep = o.indent ? "," : ", ";
    o.key_sep = ": ";
    if (given(s[2]) && s[2].t != QV_NONE) {
        const qcj_val *sp;
        size_t n;
        qcj_iter(c, at, s[2], &sp, &n);
        if (n != 2 || sp[0].t != QV_STR || sp[1].t != QV_STR)
            qcj_fail(c, QERR_INVAL, lineof(at), "separators must be a pair of strings");
        o.item_sep = sp[0].u.s->s;
        o.key_sep = sp[1].u.s->s;
        o.item_sep_len = sp[0].u.s->len;
        o.key_sep_len = sp[1].u.s->len;
    } else {
        o.item_sep_len = strlen(o.item_sep);
        o.key_sep_len = strlen(o.key_sep);
    }
    qcj_buf b = { 0 };
    qcj_write_json(c, at, &b, v, &o);
    return qcj_strv(c, b.p ? b.p : "", b.n);
}

FILTER(f_trim)
{
    static const char *const P[] = { "chars", NULL };
    qcj_val s[1];
    qcj_bind(c, at, "trim", a, P, 0, s);
    const qcj_str *chars = NULL;
    if (given(s[0]) && s[0].t != QV_NONE) {
        if (s[0].t != QV_STR) qcj_fail(c, QERR_INVAL, lineof(at), "strip arg must be None or str");
        chars = s[0].u.s;
    }
    return qcj_strval(qcj_strip(c, qcj_to_str(c, v), chars, 1, 1), is_markup(v));
}

FILTER(f_truncate)
{
    static const char *const P[] = { "length", "killwords", "end", "leeway", NULL };
    qcj_val s[4];
    qcj_bind(c, at, "truncate", a, P, 0, s);
    int64_t length = given(s[0]) && is_int(s[0]) ? s[0].u.i : 255;
    int killwords = given(s[1]) && qcj_truthy(s[1]);
    const qcj_str *end = given(s[2]) ? qcj_to_str(c, s[2]) : qcj_str_new(c, "...", 3);
    int64_t leeway = given(s[3]) && is_int(s[3]) ? s[3].u.i : 5;
    if (length < (int64_t)end->nchars) qcj_fail(c, QERR_INVAL, lineof(at), "expected length >= %zu, got %lld", end->nchars, (long long)length);
    if (leeway < 0) qcj_fail(c, QERR_INVAL, lineof(at), "expected leeway >= 0, got %lld", (long long)leeway);
    /* jinja2 takes len() of the value as it is: short sequences pass through */
    int64_t n = v.t == QV_STR ? (int64_t)v.u.s->nchars : v.t == QV_DICT ? (int64_t)v.u.d->n
              : v.t == QV_LIST && v.u.l->kind != QL_GEN ? (int64_t)v.u.l->n : v.t == QV_UNDEF ? 0 : -1;
    if (n < 0) qcj_fail(c, QERR_INVAL, lineof(at), "object of type '%s' has no len()", qcj_type_name(v));
    if (n <= length + leeway) return v;
    if (v.t != QV_STR) qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object has no attribute 'rsplit'", qcj_type_name(v));
    const qcj_str *str = v.u.s;
    size_t cut = qcj_str_off(str, (size_t)(length - (int64_t)end->nchars));
    if (!killwords) {
        size_t k = cut;
        while (k > 0 && str->s[k - 1] != ' ') k--;
        if (k > 0) cut = k - 1;
    }
    /* A Markup's cut + end escapes end (Markup.__add__). */
    if (v.markup) end = qcj_escape_str(c, qcj_str_new(c, end->s, end->len));
    qcj_buf b = { 0 };
    qcj_buf_put(c, &b, str->s, cut);
    qcj_buf_put(c, &b, end->s, end->len);
    return qcj_strval(qcj_str_new(c, b.p ? b.p : "", b.n), v.markup);
}

FILTER(f_unique)
{
    static const char *const P[] = { "case_sensitive", "attribute", NULL };
    qcj_val s[2];
    qcj_bind(c, at, "unique", a, P, 0, s);
    getter g;
    getter_init(c, &g, s[1], !(given(s[0]) && qcj_truthy(s[0])), qcj_missing());
    const qcj_val *items;
    size_t n;
    qcj_iter(c, at, v, &items, &n);
    qcj_dict *seen = qcj_dict_new(c);
    qcj_list *out = gen_new(c, "generator object do_unique", 0);
    for (size_t i = 0; i < n; i++) {
        qcj_val k = getter_apply(c, at, &g, items[i]), dummy;
        if (qcj_dict_get(c, at, seen, k, &dummy)) continue;
        qcj_dict_set(c, at, seen, k, qcj_none());
        qcj_list_push(c, out, items[i]);
    }
    return qcj_listv(out);
}

static int word_char(uint32_t cp)
{
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') || cp == '_';
    if (qcj_isspace(cp) || cp <= 0xBF) return cp == 0xAA || cp == 0xB2 || cp == 0xB3 || cp == 0xB5 || cp == 0xB9 || cp == 0xBA;
    if (cp == 0xD7 || cp == 0xF7) return 0;
    if ((cp >= 0x2000 && cp <= 0x206F) || (cp >= 0x3000 && cp <= 0x303F) || (cp >= 0xFF00 && cp <= 0xFF0F)) return 0;
    return 1;
}

FILTER(f_wordcount)
{
    qcj_val s[1];
    qcj_bind(c, at, "wordcount", a, P_NONE, 0, s);
    const qcj_str *str = qcj_to_str(c, v);
    int64_t n = 0;
    int in = 0;
    size_t i = 0;
    while (i < str->len) {
        uint32_t cp;
        i += qutf8_decode(str->s + i, str->len - i, &cp);
        int w = word_char(cp);
        if (w && !in) n++;
        in = w;
    }
    return qcj_int(n);
}

/* ---- tests ------------------------------------------------------------------------------ */

#define TEST(name) static qcj_val name(qcj_ctx *c, const qcj_node *at, qcj_val v, const qcj_args *a)

static qcj_val one_arg(qcj_ctx *c, const qcj_node *at, const qcj_args *a, const char *nm)
{
    static const char *const P[] = { "other", NULL };
    qcj_val s[1];
    qcj_bind(c, at, nm, a, P, 1, s);
    return s[0];
}

static void no_args(qcj_ctx *c, const qcj_node *at, const qcj_args *a, const char *nm)
{
    qcj_val s[1];
    qcj_bind(c, at, nm, a, P_NONE, 0, s);
}

TEST(t_defined) { no_args(c, at, a, "defined"); return qcj_bool(v.t != QV_UNDEF); }
TEST(t_undefined) { no_args(c, at, a, "undefined"); return qcj_bool(v.t == QV_UNDEF); }
TEST(t_none) { no_args(c, at, a, "none"); return qcj_bool(v.t == QV_NONE); }
TEST(t_boolean) { no_args(c, at, a, "boolean"); return qcj_bool(v.t == QV_BOOL); }
TEST(t_true) { no_args(c, at, a, "true"); return qcj_bool(v.t == QV_BOOL && v.u.i); }
TEST(t_false) { no_args(c, at, a, "false"); return qcj_bool(v.t == QV_BOOL && !v.u.i); }
TEST(t_integer) { no_args(c, at, a, "integer"); return qcj_bool(v.t == QV_INT); }
TEST(t_float) { no_args(c, at, a, "float"); return qcj_bool(v.t == QV_FLOAT); }
TEST(t_number) { no_args(c, at, a, "number"); return qcj_bool(qcj_is_num(v)); }
TEST(t_string) { no_args(c, at, a, "string"); return qcj_bool(v.t == QV_STR); }
TEST(t_mapping) { no_args(c, at, a, "mapping"); return qcj_bool(v.t == QV_DICT); }
TEST(t_escaped) { no_args(c, at, a, "escaped"); return qcj_bool(is_markup(v)); }

TEST(t_iterable)
{
    no_args(c, at, a, "iterable");
    return qcj_bool(v.t == QV_STR || v.t == QV_LIST || v.t == QV_DICT || v.t == QV_UNDEF);
}

TEST(t_sequence)
{
    no_args(c, at, a, "sequence");
    int ok = v.t == QV_STR || v.t == QV_DICT || v.t == QV_UNDEF ||
             (v.t == QV_LIST && (v.u.l->kind == QL_LIST || v.u.l->kind == QL_TUPLE));
    return qcj_bool(ok);
}

TEST(t_callable)
{
    no_args(c, at, a, "callable");
    return qcj_bool((v.t == QV_FUNC && v.u.fn->kind != QF_CYCLER) || v.t == QV_LOOP || v.t == QV_UNDEF);
}

TEST(t_sameas)
{
    qcj_val o = one_arg(c, at, a, "sameas");
    if (v.t != o.t) return qcj_bool(0);
    switch (v.t) {
    case QV_NONE:
    case QV_UNDEF: return qcj_bool(v.t == QV_NONE);
    case QV_BOOL: return qcj_bool(v.u.i == o.u.i);
    case QV_INT: return qcj_bool(v.u.i == o.u.i && v.u.i >= -5 && v.u.i <= 256);
    case QV_STR: return qcj_bool(v.u.s == o.u.s);
    case QV_FLOAT: return qcj_bool(0);
    default: return qcj_bool(v.u.l == o.u.l);
    }
}

TEST(t_divisibleby)
{
    static const char *const P[] = { "num", NULL };
    qcj_val s[1];
    qcj_bind(c, at, "divisibleby", a, P, 1, s);
    return qcj_bool(qcj_eq(qcj_binop(c, at, OP_MOD, v, s[0]), qcj_int(0)));
}

TEST(t_even) { no_args(c, at, a, "even"); return qcj_bool(qcj_eq(qcj_binop(c, at, OP_MOD, v, qcj_int(2)), qcj_int(0))); }
TEST(t_odd) { no_args(c, at, a, "odd"); return qcj_bool(qcj_eq(qcj_binop(c, at, OP_MOD, v, qcj_int(2)), qcj_int(1))); }
TEST(t_eq) { return qcj_bool(qcj_eq(v, one_arg(c, at, a, "eq"))); }
TEST(t_ne) { return qcj_bool(!qcj_eq(v, one_arg(c, at, a, "ne"))); }

static qcj_val ordered(qcj_ctx *c, const qcj_node *at, qcj_val v, const qcj_args *a, const char *op)
{
    int r = qcj_order(c, at, v, one_arg(c, at, a, op), op);
    if (r == 2) return qcj_bool(0);
    if (!strcmp(op, "<")) return qcj_bool(r < 0);
    if (!strcmp(op, "<=")) return qcj_bool(r <= 0);
    if (!strcmp(op, ">")) return qcj_bool(r > 0);
    return qcj_bool(r >= 0);
}

TEST(t_lt) { return ordered(c, at, v, a, "<"); }
TEST(t_le) { return ordered(c, at, v, a, "<="); }
TEST(t_gt) { return ordered(c, at, v, a, ">"); }
TEST(t_ge) { return ordered(c, at, v, a, ">="); }
TEST(t_in) { return qcj_bool(qcj_contains(c, at, v, one_arg(c, at, a, "in"))); }

static qcj_val case_test(qcj_ctx *c, const qcj_node *at, qcj_val v, const qcj_args *a, const char *nm)
{
    no_args(c, at, a, nm);
    qcj_val s = soft_str(c, v), out;
    qcj_args none = { 0 };
    if (!qcj_attr(c, s, nm[0] == 'l' ? "islower" : "isupper", 7, &out)) return qcj_bool(0);
    return qcj_call(c, at, out, &none);
}

TEST(t_lower) { return case_test(c, at, v, a, "lower"); }
TEST(t_upper) { return case_test(c, at, v, a, "upper"); }

TEST(t_filter)
{
    no_args(c, at, a, "filter");
    int known = 0;
    return qcj_bool(v.t == QV_STR && qcj_find_filter(v.u.s->s, &known) != NULL);
}

TEST(t_test)
{
    no_args(c, at, a, "test");
    int known = 0;
    return qcj_bool(v.t == QV_STR && qcj_find_test(v.u.s->s, &known) != NULL);
}

/* ---- tables ---------------------------------------------------------------------------------- */

static const qcj_builtin FILTERS[] = {
    { "abs", f_abs, 0 }, { "attr", f_attr, 0 }, { "batch", f_batch, 0 }, { "capitalize", f_capitalize, 0 },
    { "center", f_center, 0 }, { "count", f_length, 0 }, { "d", f_default, 0 }, { "default", f_default, 0 },
    { "dictsort", f_dictsort, 0 }, { "e", f_escape, 0 }, { "escape", f_escape, 0 }, { "first", f_first, 0 },
    { "float", f_float, 0 }, { "forceescape", f_forceescape, 0 }, { "format", f_format, 0 }, { "indent", f_indent, 0 },
    { "int", f_int, 0 }, { "items", f_items, 0 }, { "join", f_join, 0 }, { "last", f_last, 0 },
    { "length", f_length, 0 }, { "list", f_list, 0 }, { "lower", f_lower, 0 }, { "map", f_map, 0 },
    { "max", f_max, 0 }, { "min", f_min, 0 }, { "reject", f_reject, 0 }, { "rejectattr", f_rejectattr, 0 },
    { "replace", f_replace, 0 }, { "reverse", f_reverse, 0 }, { "round", f_round, 0 }, { "safe", f_safe, 0 },
    { "select", f_select, 0 }, { "selectattr", f_selectattr, 0 }, { "sort", f_sort, 0 }, { "string", f_string, 0 },
    { "sum", f_sum, 0 }, { "title", f_title, 0 }, { "tojson", f_tojson, 0 }, { "trim", f_trim, 0 },
    { "truncate", f_truncate, 0 }, { "unique", f_unique, 0 }, { "upper", f_upper, 0 }, { "wordcount", f_wordcount, 0 },
};

/* jinja2's filters that are not implemented here. */
static const char *const FILTERS_KNOWN[] = {
    "filesizeformat", "groupby", "pprint", "random", "slice", "striptags", "urlencode", "urlize", "wordwrap",
    "xmlattr", NULL,
};

static const qcj_builtin TESTS[] = {
    { "!=", t_ne, 0 }, { "<", t_lt, 0 }, { "<=", t_le, 0 }, { "==", t_eq, 0 }, { ">", t_gt, 0 }, { ">=", t_ge, 0 },
    { "boolean", t_boolean, 0 }, { "callable", t_callable, 0 }, { "defined", t_defined, 0 },
    { "divisibleby", t_divisibleby, 0 }, { "eq", t_eq, 0 }, { "equalto", t_eq, 0 }, { "escaped", t_escaped, 0 },
    { "even", t_even, 0 }, { "false", t_false, 0 }, { "filter", t_filter, 0 }, { "float", t_float, 0 },
    { "ge", t_ge, 0 }, { "greaterthan", t_gt, 0 }, { "gt", t_gt, 0 }, { "in", t_in, 0 }, { "integer", t_integer, 0 },
    { "iterable", t_iterable, 0 }, { "le", t_le, 0 }, { "lessthan", t_lt, 0 }, { "lower", t_lower, 0 },
    { "lt", t_lt, 0 }, { "mapping", t_mapping, 0 }, { "ne", t_ne, 0 }, { "none", t_none, 0 },
    { "number", t_number, 0 }, { "odd", t_odd, 0 }, { "sameas", t_sameas, 0 }, { "sequence", t_sequence, 0 },
    { "string", t_string, 0 }, { "test", t_test, 0 }, { "true", t_true, 0 }, { "undefined", t_undefined, 0 },
    { "upper", t_upper, 0 },
};

static const qcj_builtin *lookup(const qcj_builtin *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

const qcj_builtin *qcj_find_filter(const char *name, int *known)
{
    const qcj_builtin *b = lookup(FILTERS, sizeof FILTERS / sizeof FILTERS[0], name);
    if (known) {
        *known = b != NULL;
        for (int i = 0; !b && FILTERS_KNOWN[i]; i++)
            if (!strcmp(FILTERS_KNOWN[i], name)) *known = 1;
    }
    return b;
}

const qcj_builtin *qcj_find_test(const char *name, int *known)
{
    const qcj_builtin *b = lookup(TESTS, sizeof TESTS / sizeof TESTS[0], name);
    if (known) *known = b != NULL;
    return b;
}
