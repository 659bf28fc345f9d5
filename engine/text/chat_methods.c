/* chat_methods.c - Python methods templates call, and jinja2's globals.
 *
 * Chat templates call Python methods on the values they get: str.strip(),
 * str.split(), dict.items(), dict.get() and so on.  This file implements the
 * ones templates use, with Python's semantics (indices count code points,
 * whitespace is str.isspace(), split(None) collapses runs), plus the two
 * formatting languages a template can reach: `fmt % args` and str.format().
 *
 * The immutable sandbox: list.append, dict.update and the other mutating
 * methods are listed with `unsafe` set, so that looking them up yields an
 * undefined value whose call fails with SecurityError's message, as in HF.
 *
 * Globals: range (capped at 100000 items like the sandbox), dict, namespace,
 * cycler, joiner, raise_exception (fails the render with exactly its
 * message) and strftime_now (local time, or the pinned clock in UTC).
 */
#define _GNU_SOURCE /* memmem */
#include "chat_int.h"
#include "qerr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int lineof(const qcj_node *n) { return n ? n->line : 0; }

static int is_str(qcj_val v) { return v.t == QV_STR; }
static int is_int(qcj_val v) { return v.t == QV_INT || v.t == QV_BOOL; }
static int given(qcj_val v) { return v.t != QV_MISSING; }

static qcj_val dictv(qcj_dict *d)
{
    qcj_val v = { .t = QV_DICT };
    v.u.d = d;
    return v;
}

static const qcj_str *need_str(qcj_ctx *c, const qcj_node *at, qcj_val v, const char *what)
{
    if (v.t != QV_STR) qcj_fail(c, QERR_INVAL, lineof(at), "%s must be str, not %s", what, qcj_type_name(v));
    return v.u.s;
}

/* ---- string helpers ------------------------------------------------------------ */

static int in_chars(const qcj_str *chars, uint32_t cp)
{
    if (!chars) return qcj_isspace(cp);
    size_t i = 0;
    while (i < chars->len) {
        uint32_t x;
        i += qutf8_decode(chars->s + i, chars->len - i, &x);
        if (x == cp) return 1;
    }
    return 0;
}

qcj_str *qcj_strip(qcj_ctx *c, const qcj_str *s, const qcj_str *chars, int left, int right)
{
    size_t a = 0, b = s->len;
    while (left && a < b) {
        uint32_t cp;
        size_t k = qutf8_decode(s->s + a, b - a, &cp);
        if (!in_chars(chars, cp)) break;
        a += k;
    }
    while (right && b > a) {
        size_t q = b - 1;
        while (q > a && ((unsigned char)s->s[q] & 0xC0) == 0x80) q--;
        uint32_t cp;
        qutf8_decode(s->s + q, b - q, &cp);
        if (!in_chars(chars, cp)) break;
        b = q;
    }
    if (a == 0 && b == s->len) return (qcj_str *)s;
    return qcj_str_new(c, s->s + a, b - a);
}

static const char *find_bytes(const char *h, size_t hn, const char *n, size_t nn)
{
    if (!nn) return h;
    return memmem(h, hn, n, nn);
}

qcj_str *qcj_replace(qcj_ctx *c, const qcj_str *s, const qcj_str *old, const qcj_str *rep, int64_t count)
{
    qcj_buf b = { 0 };
    if (!old->len) {
        /* Python inserts `rep` before every character and at the end */
        size_t i = 0;
        int64_t done = 0;
        while (count < 0 || done < count) {
            qcj_buf_put(c, &b, rep->s, rep->len);
            done++;
            if (i >= s->len) break;
            uint32_t cp;
            size_t k = qutf8_decode(s->s + i, s->len - i, &cp);
            qcj_buf_put(c, &b, s->s + i, k);
            i += k;
        }
        qcj_buf_put(c, &b, s->s + i, s->len - i);
        return qcj_str_new(c, b.p ? b.p : "", b.n);
    }
    size_t i = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
        const char *f = find_bytes(s->s + i, s->len - i, old->s, old->len);
        if (!f) break;
        size_t at = (size_t)(f - s->s);
        qcj_buf_put(c, &b, s->s + i, at - i);
        qcj_buf_put(c, &b, rep->s, rep->len);
        i = at + old->len;
        done++;
    }
    if (!done) return (qcj_str *)s;
    qcj_buf_put(c, &b, s->s + i, s->len - i);
    return qcj_str_new(c, b.p ? b.p : "", b.n);
}

static int is_linebreak(uint32_t cp)
{
    return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
           cp == 0x2028 || cp == 0x2029;
}

qcj_list *qcj_splitlines(qcj_ctx *c, const qcj_str *s, int keepends)
{
    qcj_list *l = qcj_list_new(c, QL_LIST, 0);
    size_t start = 0, i = 0;
    while (i < s->len) {
        uint32_t cp;
        size_t k = qutf8_decode(s->s + i, s->len - i, &cp);
        if (is_linebreak(cp)) {
            size_t end = i + k;
            if (cp == '\r' && end < s->len && s->s[end] == '\n') end++;
            qcj_list_push(c, l, qcj_strv(c, s->s + start, (keepends ? end : i) - start));
            start = i = end;
        } else {
            i += k;
        }
    }
    if (start < s->len) qcj_list_push(c, l, qcj_strv(c, s->s + start, s->len - start));
    return l;
}

/* Code point index -> byte offset with Python's clamping of slice bounds. */
static size_t cp_bound(const qcj_str *s, qcj_val v, size_t dflt)
{
    if (!given(v) || v.t == QV_NONE || !is_int(v)) return dflt;
    int64_t i = v.u.i, n = (int64_t)s->nchars;
    if (i < 0) i += n;
    if (i < 0) i = 0;
    if (i > n) i = n;
    return qcj_str_off(s, (size_t)i);
}

static int64_t cp_index(const qcj_str *s, size_t off)
{
    if (s->nchars == s->len) return (int64_t)off;
    int64_t n = 0;
    for (size_t i = 0; i < off; i++)
        if (((unsigned char)s->s[i] & 0xC0) != 0x80) n++;
    return n;
}

/* ---- str methods ------------------------------------------------------------------- */

static const char *const P_CHARS[] = { "chars", NULL };
static const char *const P_SPLIT[] = { "sep", "maxsplit", NULL };
static const char *const P_SUB[] = { "sub", "start", "end", NULL };
static const char *const P_PREFIX[] = { "prefix", "start", "end", NULL };
static const char *const P_REPLACE[] = { "old", "new", "count", NULL };
static const char *const P_WIDTH[] = { "width", "fillchar", NULL };
static const char *const P_ONE[] = { "x", NULL };
static const char *const P_NONE[] = { NULL };
static const char *const P_KEEP[] = { "keepends", NULL };

static qcj_val m_strip_any(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a, int l, int r, const char *nm)
{
    qcj_val s[1];
    qcj_bind(c, at, nm, a, P_CHARS, 0, s);
    const qcj_str *chars = NULL;
    if (given(s[0]) && s[0].t != QV_NONE) {
        if (!is_str(s[0])) qcj_fail(c, QERR_INVAL, lineof(at), "%s arg must be None or str", nm);
        chars = s[0].u.s;
    }
    qcj_val v = { .t = QV_STR };
    v.u.s = qcj_strip(c, self.u.s, chars, l, r);
    return v;
}

static qcj_val m_strip(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return m_strip_any(c, at, self, a, 1, 1, "strip"); }
static qcj_val m_lstrip(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return m_strip_any(c, at, self, a, 1, 0, "lstrip"); }
static qcj_val m_rstrip(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return m_strip_any(c, at, self, a, 0, 1, "rstrip"); }

static qcj_val case_method(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a, int mode, const char *nm)
{
    qcj_val s[1];
    qcj_bind(c, at, nm, a, P_NONE, 0, s);
    qcj_val v = { .t = QV_STR };
    v.u.s = qcj_str_case(c, self.u.s, mode);
    return v;
}

static qcj_val m_upper(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return case_method(c, at, self, a, QC_UPPER, "upper"); }
static qcj_val m_lower(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return case_method(c, at, self, a, QC_LOWER, "lower"); }
static qcj_val m_title(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return case_method(c, at, self, a, QC_TITLE_WORDS, "title"); }
static qcj_val m_capitalize(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return case_method(c, at, self, a, QC_CAPITALIZE, "capitalize"); }
static qcj_val m_swapcase(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return case_method(c, at, self, a, QC_SWAPCASE, "swapcase"); }

static qcj_val split_impl(qcj_ctx *c, const qcj_node *at, const qcj_str *s, qcj_val sepv, int64_t maxsplit, int right)
{
    qcj_list *l = qcj_list_new(c, QL_LIST, 0);
    if (sepv.t == QV_NONE || !given(sepv)) {
        /* runs of whitespace; leading/trailing ignored */
        if (!right) {
            size_t i = 0;
            while (i < s->len) {
                uint32_t cp;
                size_t k;
                while (i < s->len && (k = qutf8_decode(s->s + i, s->len - i, &cp), qcj_isspace(cp))) i += k;
                if (i >= s->len) break;
                if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                    qcj_list_push(c, l, qcj_strv(c, s->s + i, s->len - i));
                    break;
                }
                size_t st = i;
                while (i < s->len && (k = qutf8_decode(s->s + i, s->len - i, &cp), !qcj_isspace(cp))) i += k;
                qcj_list_push(c, l, qcj_strv(c, s->s + st, i - st));
            }
        } else {
            qcj_list *rev = qcj_list_new(c, QL_LIST, 0);
            size_t e = s->len;
            while (e > 0) {
                size_t q;
                uint32_t cp;
                for (;;) {
                    if (!e) break;
                    q = e - 1;
                    while (q > 0 && ((unsigned char)s->s[q] & 0xC0) == 0x80) q--;
                    qutf8_decode(s->s + q, e - q, &cp);
                    if (!qcj_isspace(cp)) break;
                    e = q;
                }
                if (!e) break;
                if (maxsplit >= 0 && (int64_t)rev->n >= maxsplit) {
                    qcj_list_push(c, rev, qcj_strv(c, s->s, e));
                    break;
                }
                size_t st = e;
                for (;;) {
                    if (!st) break;
                    q = st - 1;
                    while (q > 0 && ((unsigned char)s->s[q] & 0xC0) == 0x80) q--;
                    qutf8_decode(s->s + q, st - q, &cp);
                    if (qcj_isspace(cp)) break;
                    st = q;
                }
                qcj_list_push(c, rev, qcj_strv(c, s->s + st, e - st));
                e = st;
            }
            for (size_t i = rev->n; i > 0; i--) qcj_list_push(c, l, rev->v[i - 1]);
        }
        return qcj_listv(l);
    }
    const qcj_str *sep = need_str(c, at, sepv, "sep");
    if (!sep->len) qcj_fail(c, QERR_INVAL, lineof(at), "empty separator");
    if (!right) {
        size_t i = 0;
        for (;;) {
            const char *f = (maxsplit < 0 || (int64_t)l->n < maxsplit) ? find_bytes(s->s + i, s->len - i, sep->s, sep->len) : NULL;
            if (!f) {
                qcj_list_push(c, l, qcj_strv(c, s->s + i, s->len - i));
                break;
            }
            size_t p = (size_t)(f - s->s);
            qcj_list_push(c, l, qcj_strv(c, s->s + i, p - i));
            i = p + sep->len;
        }
        return qcj_listv(l);
    }
    qcj_list *rev = qcj_list_new(c, QL_LIST, 0);
    size_t e = s->len;
    for (;;) {
        size_t found = (size_t)-1;
        if ((maxsplit < 0 || (int64_t)rev->n < maxsplit) && e >= sep->len)
            for (size_t p = e - sep->len + 1; p-- > 0;)
                if (!memcmp(s->s + p, sep->s, sep->len)) {
                    found = p;
                    break;
                }
        if (found == (size_t)-1) {
            qcj_list_push(c, rev, qcj_strv(c, s->s, e));
            break;
        }
        qcj_list_push(c, rev, qcj_strv(c, s->s + found + sep->len, e - found - sep->len));
        e = found;
    }
    for (size_t i = rev->n; i > 0; i--) qcj_list_push(c, l, rev->v[i - 1]);
    return qcj_listv(l);
}

static qcj_val m_split_any(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a, int right)
{
    qcj_val s[2];
    qcj_bind(c, at, right ? "rsplit" : "split", a, P_SPLIT, 0, s);
    int64_t maxsplit = -1;
    if (given(s[1])) {
        if (!is_int(s[1])) qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object cannot be interpreted as an integer", qcj_type_name(s[1]));
        maxsplit = s[1].u.i;
    }
    return split_impl(c, at, self.u.s, s[0], maxsplit, right);
}

static qcj_val m_split(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return m_split_any(c, at, self, a, 0); }
static qcj_val m_rsplit(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return m_split_any(c, at, self, a, 1); }

static qcj_val m_splitlines(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    qcj_val s[1];
    qcj_bind(c, at, "splitlines", a, P_KEEP, 0, s);
    return qcj_listv(qcj_splitlines(c, self.u.s, given(s[0]) && qcj_truthy(s[0])));
}

/* startswith/endswith: prefix may be a tuple of strings. */
static qcj_val affix(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a, int end)
{
    qcj_val s[3];
    const char *nm = end ? "endswith" : "startswith";
    qcj_bind(c, at, nm, a, P_PREFIX, 1, s);
    const qcj_str *str = self.u.s;
    size_t lo = cp_bound(str, s[1], 0), hi = cp_bound(str, s[2], str->len);
    const qcj_val *opts = &s[0];
    size_t n = 1;
    if (s[0].t == QV_LIST && s[0].u.l->kind == QL_TUPLE) {
        opts = s[0].u.l->v;
        n = s[0].u.l->n;
    }
    for (size_t i = 0; i < n; i++) {
        if (!is_str(opts[i]))
            qcj_fail(c, QERR_INVAL, lineof(at), "%s first arg must be str or a tuple of str, not %s", nm, qcj_type_name(opts[i]));
        const qcj_str *p = opts[i].u.s;
        if (hi < lo || hi - lo < p->len) continue;
        if (!memcmp(str->s + (end ? hi - p->len : lo), p->s, p->len)) return qcj_bool(1);
    }
    return qcj_bool(0);
}

static qcj_val m_startswith(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return affix(c, at, self, a, 0); }
static qcj_val m_endswith(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return affix(c, at, self, a, 1); }

/* find/rfind/index/rindex/count */
static qcj_val search(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a, const char *nm, int rev, int must,
                      int count)
{
    qcj_val s[3];
    qcj_bind(c, at, nm, a, P_SUB, 1, s);
    const qcj_str *str = self.u.s, *sub = need_str(c, at, s[0], "substring");
    size_t lo = cp_bound(str, s[1], 0), hi = cp_bound(str, s[2], str->len);
    if (count) {
        if (hi < lo) return qcj_int(0);
        if (!sub->len) return qcj_int(cp_index(str, hi) - cp_index(str, lo) + 1);
        int64_t k = 0;
        size_t i = lo;
        const char *f;
        while ((f = find_bytes(str->s + i, hi - i, sub->s, sub->len))) {
            k++;
            i = (size_t)(f - str->s) + sub->len;
        }
        return qcj_int(k);
    }
    long found = -1;
    if (hi >= lo && hi - lo >= sub->len) {
        if (!rev) {
            const char *f = find_bytes(str->s + lo, hi - lo, sub->s, sub->len);
            if (f) found = (long)(f - str->s);
        } else {
            for (size_t p = hi - sub->len + 1; p-- > lo;)
                if (!memcmp(str->s + p, sub->s, sub->len)) {
                    found = (long)p;
                    break;
                }
        }
    }
    if (found < 0) {
        if (must) qcj_fail(c, QERR_INVAL, lineof(at), "substring not found");
        return qcj_int(-1);
    }
    return qcj_int(cp_index(str, (size_t)found));
}

static qcj_val m_find(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return search(c, at, self, a, "find", 0, 0, 0); }
static qcj_val m_rfind(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return search(c, at, self, a, "rfind", 1, 0, 0); }
static qcj_val m_index(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return search(c, at, self, a, "index", 0, 1, 0); }
static qcj_val m_rindex(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return search(c, at, self, a, "rindex", 1, 1, 0); }
static qcj_val m_count(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return search(c, at, self, a, "count", 0, 0, 1); }

static qcj_val m_replace(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    qcj_val s[3];
    qcj_bind(c, at, "replace", a, P_REPLACE, 2, s);
    int64_t count = -1;
    if (given(s[2])) {
        if (!is_int(s[2])) qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object cannot be interpreted as an integer", qcj_type_name(s[2]));
        count = s[2].u.i;
    }
    qcj_val v = { .t = QV_STR };
    v.u.s = qcj_replace(c, self.u.s, need_str(c, at, s[0], "replace() argument 1"), need_str(c, at, s[1], "replace() argument 2"), count);
    return v;
}

static qcj_val m_join(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    qcj_val s[1];
    qcj_bind(c, at, "join", a, P_ONE, 1, s);
    const qcj_val *items;
    size_t n;
    qcj_iter(c, at, s[0], &items, &n);
    qcj_buf b = { 0 };
    for (size_t i = 0; i < n; i++) {
        /* Markup.join escapes every item, whatever its type. */
        qcj_val it = self.markup ? qcj_escape(c, items[i]) : items[i];
        if (!is_str(it))
            qcj_fail(c, QERR_INVAL, lineof(at), "sequence item %zu: expected str instance, %s found", i, qcj_type_name(it));
        if (i) qcj_buf_put(c, &b, self.u.s->s, self.u.s->len);
        qcj_buf_put(c, &b, it.u.s->s, it.u.s->len);
    }
    return qcj_strval(qcj_str_new(c, b.p ? b.p : "", b.n), self.markup);
}

static qcj_val pad(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a, const char *nm, int mode)
{
    qcj_val s[2];
    qcj_bind(c, at, nm, a, P_WIDTH, 1, s);
    if (!is_int(s[0])) qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object cannot be interpreted as an integer", qcj_type_name(s[0]));
    const char *fill = " ";
    size_t fl = 1;
    if (given(s[1])) {
        const qcj_str *f = need_str(c, at, s[1], "fill character");
        if (f->nchars != 1) qcj_fail(c, QERR_INVAL, lineof(at), "The fill character must be exactly one character long");
        fill = f->s;
        fl = f->len;
    }
    const qcj_str *str = self.u.s;
    int64_t w = s[0].u.i, n = (int64_t)str->nchars;
    if (w <= n) return self;
    if (w - n > (int64_t)c->max_output) qcj_fail(c, QERR_LIMIT, lineof(at), "width too large");
    int64_t marg = w - n, left;
    if (mode == 0) left = marg / 2 + (marg & w & 1); /* center */
    else if (mode == 1) left = 0;                    /* ljust */
    else left = marg;                                /* rjust */
    qcj_buf b = { 0 };
    for (int64_t i = 0; i < left; i++) qcj_buf_put(c, &b, fill, fl);
    qcj_buf_put(c, &b, str->s, str->len);
    for (int64_t i = 0; i < marg - left; i++) qcj_buf_put(c, &b, fill, fl);
    return qcj_strv(c, b.p, b.n);
}

static qcj_val m_center(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return pad(c, at, self, a, "center", 0); }
static qcj_val m_ljust(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return pad(c, at, self, a, "ljust", 1); }
static qcj_val m_rjust(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return pad(c, at, self, a, "rjust", 2); }

static qcj_val m_zfill(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    qcj_val s[1];
    qcj_bind(c, at, "zfill", a, P_ONE, 1, s);
    if (!is_int(s[0])) qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object cannot be interpreted as an integer", qcj_type_name(s[0]));
    const qcj_str *str = self.u.s;
    int64_t w = s[0].u.i, n = (int64_t)str->nchars;
    if (w <= n) return self;
    if (w - n > (int64_t)c->max_output) qcj_fail(c, QERR_LIMIT, lineof(at), "width too large");
    qcj_buf b = { 0 };
    size_t st = 0;
    if (str->len && (str->s[0] == '+' || str->s[0] == '-')) {
        qcj_buf_putc(c, &b, str->s[0]);
        st = 1;
    }
    for (int64_t i = 0; i < w - n; i++) qcj_buf_putc(c, &b, '0');
    qcj_buf_put(c, &b, str->s + st, str->len - st);
    return qcj_strv(c, b.p, b.n);
}

static qcj_val affix_remove(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a, int suffix)
{
    qcj_val s[1];
    qcj_bind(c, at, suffix ? "removesuffix" : "removeprefix", a, P_ONE, 1, s);
    const qcj_str *str = self.u.s, *p = need_str(c, at, s[0], "argument");
    if (!p->len || p->len > str->len) return self;
    if (!suffix && !memcmp(str->s, p->s, p->len)) return qcj_strv(c, str->s + p->len, str->len - p->len);
    if (suffix && !memcmp(str->s + str->len - p->len, p->s, p->len)) return qcj_strv(c, str->s, str->len - p->len);
    return self;
}

static qcj_val m_removeprefix(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return affix_remove(c, at, self, a, 0); }
static qcj_val m_removesuffix(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return affix_remove(c, at, self, a, 1); }

enum { IS_ALNUM, IS_ALPHA, IS_DIGIT, IS_SPACE, IS_LOWER, IS_UPPER };

static qcj_val is_class(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a, int cls)
{
    qcj_val s[1];
    qcj_bind(c, at, "is...", a, P_NONE, 0, s);
    const qcj_str *str = self.u.s;
    if (!str->len) return qcj_bool(0);
    int cased = 0;
    size_t i = 0;
    while (i < str->len) {
        uint32_t cp;
        i += qutf8_decode(str->s + i, str->len - i, &cp);
        int letter = qcj_upper(cp) != cp || qcj_lower(cp) != cp || cp == 0xDF || (cp >= 0x80 && !qcj_isspace(cp) && !(cp >= 0x2000 && cp <= 0x206F));
        int digit = cp >= '0' && cp <= '9';
        switch (cls) {
        case IS_ALNUM: if (!letter && !digit) return qcj_bool(0); break;
        case IS_ALPHA: if (!letter) return qcj_bool(0); break;
        case IS_DIGIT: if (!digit) return qcj_bool(0); break;
        case IS_SPACE: if (!qcj_isspace(cp)) return qcj_bool(0); break;
        case IS_LOWER:
            if (qcj_lower(cp) != cp) return qcj_bool(0);
            if (qcj_upper(cp) != cp || cp == 0xDF) cased = 1;
            break;
        case IS_UPPER:
            if (qcj_upper(cp) != cp || cp == 0xDF) return qcj_bool(0);
            if (qcj_lower(cp) != cp) cased = 1;
            break;
        }
    }
    if (cls == IS_LOWER || cls == IS_UPPER) return qcj_bool(cased);
    return qcj_bool(1);
}

static qcj_val m_isalnum(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return is_class(c, at, self, a, IS_ALNUM); }
static qcj_val m_isalpha(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return is_class(c, at, self, a, IS_ALPHA); }
static qcj_val m_isdigit(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return is_class(c, at, self, a, IS_DIGIT); }
static qcj_val m_isspace(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return is_class(c, at, self, a, IS_SPACE); }
static qcj_val m_islower(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return is_class(c, at, self, a, IS_LOWER); }
static qcj_val m_isupper(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return is_class(c, at, self, a, IS_UPPER); }

/* ---- formatting: str.format and % ------------------------------------------------- */

typedef struct {
    uint32_t fill;
    char align; /* 0, '<', '>', '^', '=' */
    char sign;  /* 0, '+', '-', ' ' */
    int alt, zero;
    int64_t width, prec; /* -1: absent */
    char group;          /* 0, ',', '_' */
    char type;
} fspec;

static void parse_spec(qcj_ctx *c, const qcj_node *at, const char *p, size_t n, fspec *f)
{
    memset(f, 0, sizeof *f);
    f->fill = ' ';
    f->width = f->prec = -1;
    size_t i = 0;
    if (n) {
        uint32_t cp;
        size_t k = qutf8_decode(p, n, &cp);
        if (k < n && strchr("<>^=", p[k])) {
            f->fill = cp;
            f->align = p[k];
            i = k + 1;
        } else if (strchr("<>^=", p[0])) {
            f->align = p[0];
            i = 1;
        }
    }
    if (i < n && strchr("+- ", p[i])) f->sign = p[i++];
    if (i < n && p[i] == '#') f->alt = 1, i++;
    if (i < n && p[i] == '0') f->zero = 1, i++;
    if (i < n && p[i] >= '0' && p[i] <= '9') {
        f->width = 0;
        while (i < n && p[i] >= '0' && p[i] <= '9' && f->width < 100000000) f->width = f->width * 10 + (p[i++] - '0');
    }
    if (i < n && (p[i] == ',' || p[i] == '_')) f->group = p[i++];
    if (i < n && p[i] == '.') {
        i++;
        f->prec = 0;
        if (i >= n || p[i] < '0' || p[i] > '9') qcj_fail(c, QERR_INVAL, lineof(at), "Format specifier missing precision");
        while (i < n && p[i] >= '0' && p[i] <= '9' && f->prec < 100000000) f->prec = f->prec * 10 + (p[i++] - '0');
    }
    if (i < n) f->type = p[i++];
    if (i < n) qcj_fail(c, QERR_INVAL, lineof(at), "Invalid format specifier");
    if (f->width > (int64_t)c->max_output || f->prec > 300) qcj_fail(c, QERR_LIMIT, lineof(at), "format width or precision too large");
}

/* Pads body (already signed/formatted) per spec; `num` allows '=' and zero padding. */
static void emit_padded(qcj_ctx *c, qcj_buf *b, const fspec *f, const char *body, size_t blen, int num, char dflt_align)
{
    size_t nchars = 0;
    for (size_t i = 0; i < blen; i++)
        if (((unsigned char)body[i] & 0xC0) != 0x80) nchars++;
    char align = f->align ? f->align : (num && f->zero ? '=' : dflt_align);
    uint32_t fill = f->fill;
    if (!f->align && num && f->zero) fill = '0';
    char fb[4];
    size_t fl = qutf8_encode(fill, fb);
    int64_t marg = f->width > (int64_t)nchars ? f->width - (int64_t)nchars : 0;
    int64_t left = align == '<' ? 0 : align == '^' ? marg / 2 : marg;
    if (align == '=' && num && blen && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) {
        qcj_buf_putc(c, b, body[0]);
        body++;
        blen--;
    }
    for (int64_t i = 0; i < left; i++) qcj_buf_put(c, b, fb, fl);
    qcj_buf_put(c, b, body, blen);
    for (int64_t i = 0; i < marg - left; i++) qcj_buf_put(c, b, fb, fl);
}

static void group_digits(char *out, const char *digits, char sep)
{
    size_t n = strlen(digits), k = 0;
    for (size_t i = 0; i < n; i++) {
        out[k++] = digits[i];
        if (sep && (n - i - 1) % 3 == 0 && i + 1 < n) out[k++] = sep;
    }
    out[k] = 0;
}

static void format_float(qcj_ctx *c, const qcj_node *at, qcj_buf *b, double x, const fspec *f)
{
    char t = f->type, body[3200], tmp[2048];
    int prec = f->prec >= 0 ? (int)f->prec : 6;
    if (!t) {
        if (f->prec < 0) {
            qcj_fmt_float(x, tmp);
        } else {
            snprintf(tmp, sizeof tmp, "%.*g", prec ? prec : 1, x);
            if (isfinite(x) && !strpbrk(tmp, ".e")) strcat(tmp, ".0");
        }
    } else if (t == '%') {
        snprintf(tmp, sizeof tmp, "%.*f%%", prec, x * 100);
    } else if (strchr("eEfFgG", t)) {
        char fmt[16];
        snprintf(fmt, sizeof fmt, "%%%s.*%c", f->alt ? "#" : "", t);
        snprintf(tmp, sizeof tmp, fmt, prec, x);
    } else {
        qcj_fail(c, QERR_INVAL, lineof(at), "Unknown format code '%c' for object of type 'float'", t);
    }
    const char *digits = tmp[0] == '-' ? tmp + 1 : tmp;
    char grouped[3072];
    if (f->group && isfinite(x)) {
        size_t ip = strspn(digits, "0123456789");
        char ipart[2048];
        memcpy(ipart, digits, ip);
        ipart[ip] = 0;
        group_digits(grouped, ipart, f->group);
        strcat(grouped, digits + ip);
        digits = grouped;
    }
    snprintf(body, sizeof body, "%s%s", signbit(x) && !(x == 0 && !signbit(x)) && tmp[0] == '-' ? "-" : (f->sign == '+' ? "+" : f->sign == ' ' ? " " : ""), digits);
    emit_padded(c, b, f, body, strlen(body), 1, '>');
}

static void format_int(qcj_ctx *c, const qcj_node *at, qcj_buf *b, int64_t v, const fspec *f)
{
    char t = f->type ? f->type : 'd';
    if (strchr("eEfFgG%", t)) {
        format_float(c, at, b, (double)v, f);
        return;
    }
    char digits[80], body[200];
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    const char *prefix = "";
    switch (t) {
    case 'd':
    case 'n': snprintf(digits, sizeof digits, "%llu", (unsigned long long)u); break;
    case 'x': snprintf(digits, sizeof digits, "%llx", (unsigned long long)u); prefix = f->alt ? "0x" : ""; break;
    case 'X': snprintf(digits, sizeof digits, "%llX", (unsigned long long)u); prefix = f->alt ? "0X" : ""; break;
    case 'o': snprintf(digits, sizeof digits, "%llo", (unsigned long long)u); prefix = f->alt ? "0o" : ""; break;
    case 'b': {
        int k = 0;
        char rev[70];
        do {
            rev[k++] = (char)('0' + (u & 1));
            u >>= 1;
        } while (u);
        for (int i = 0; i < k; i++) digits[i] = rev[k - 1 - i];
        digits[k] = 0;
        prefix = f->alt ? "0b" : "";
        break;
    }
    case 'c': {
        if (v < 0 || v > 0x10FFFF) qcj_fail(c, QERR_INVAL, lineof(at), "%%c arg not in range(0x110000)");
        size_t k = qutf8_encode((uint32_t)v, body);
        emit_padded(c, b, f, body, k, 0, '<');
        return;
    }
    default: qcj_fail(c, QERR_INVAL, lineof(at), "Unknown format code '%c' for object of type 'int'", t);
    }
    char grouped[110];
    if (f->group) {
        group_digits(grouped, digits, f->group);
    } else {
        strcpy(grouped, digits);
    }
    snprintf(body, sizeof body, "%s%s%s", v < 0 ? "-" : f->sign == '+' ? "+" : f->sign == ' ' ? " " : "", prefix, grouped);
    emit_padded(c, b, f, body, strlen(body), 1, '>');
}

/* Python's format(value, spec) for the types templates format. */
static void format_value(qcj_ctx *c, const qcj_node *at, qcj_buf *b, qcj_val v, const char *spec, size_t n)
{
    if (!n) {
        qcj_write_str(c, b, v);
        return;
    }
    fspec f;
    parse_spec(c, at, spec, n, &f);
    if (v.t == QV_INT || v.t == QV_BOOL) {
        format_int(c, at, b, v.u.i, &f);
    } else if (v.t == QV_FLOAT) {
        format_float(c, at, b, v.u.f, &f);
    } else if (v.t == QV_STR || v.t == QV_UNDEF) {
        if (f.type && f.type != 's') qcj_fail(c, QERR_INVAL, lineof(at), "Unknown format code '%c' for object of type 'str'", f.type);
        const qcj_str *s = qcj_to_str(c, v);
        size_t len = f.prec >= 0 ? qcj_str_off(s, (size_t)f.prec) : s->len;
        emit_padded(c, b, &f, s->s, len, 0, '<');
    } else {
        qcj_fail(c, QERR_INVAL, lineof(at), "unsupported format string passed to %s.__format__", qcj_type_name(v));
    }
}

static qcj_val m_format(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    const qcj_str *s = self.u.s;
    qcj_buf b = { 0 };
    size_t i = 0, autonum = 0;
    int mode = 0; /* 1 auto, 2 manual */
    while (i < s->len) {
        char ch = s->s[i];
        if (ch == '}') {
            if (i + 1 < s->len && s->s[i + 1] == '}') {
                qcj_buf_putc(c, &b, '}');
                i += 2;
                continue;
            }
            qcj_fail(c, QERR_INVAL, lineof(at), "Single '}' encountered in format string");
        }
        if (ch != '{') {
            qcj_buf_putc(c, &b, ch);
            i++;
            continue;
        }
        if (i + 1 < s->len && s->s[i + 1] == '{') {
            qcj_buf_putc(c, &b, '{');
            i += 2;
            continue;
        }
        size_t e = i + 1;
        while (e < s->len && s->s[e] != '}' && s->s[e] != '{') e++;
        if (e >= s->len) qcj_fail(c, QERR_INVAL, lineof(at), "expected '}' before end of string");
        if (s->s[e] == '{') qcj_fail(c, QERR_UNSUPPORTED, lineof(at), "nested replacement fields are not supported");
        const char *f = s->s + i + 1;
        size_t fl = e - i - 1;
        const char *spec = memchr(f, ':', fl);
        size_t specl = spec ? fl - (size_t)(spec - f) - 1 : 0;
        size_t head = spec ? (size_t)(spec - f) : fl;
        const char *conv = memchr(f, '!', head);
        char cv = 0;
        if (conv) {
            if ((size_t)(conv - f) + 2 != head) qcj_fail(c, QERR_INVAL, lineof(at), "expected ':' after conversion specifier");
            cv = conv[1];
            head = (size_t)(conv - f);
        }
        size_t nl = 0;
        while (nl < head && f[nl] != '.' && f[nl] != '[') nl++;
        qcj_val v;
        if (nl == 0) {
            if (mode == 2) qcj_fail(c, QERR_INVAL, lineof(at), "cannot switch from manual field specification to automatic field numbering");
            mode = 1;
            if (autonum >= a->npos) qcj_fail(c, QERR_INVAL, lineof(at), "Replacement index %zu out of range for positional args tuple", autonum);
            v = a->pos[autonum++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            if (mode == 1) qcj_fail(c, QERR_INVAL, lineof(at), "cannot switch from automatic field numbering to manual field specification");
            mode = 2;
            size_t idx = 0;
            for (size_t k = 0; k < nl; k++) {
                if (f[k] < '0' || f[k] > '9' || idx > 1000000) qcj_fail(c, QERR_INVAL, lineof(at), "invalid format field");
                idx = idx * 10 + (size_t)(f[k] - '0');
            }
            if (idx >= a->npos) qcj_fail(c, QERR_INVAL, lineof(at), "Replacement index %zu out of range for positional args tuple", idx);
            v = a->pos[idx];
        } else {
            size_t k;
            for (k = 0; k < a->nkw; k++)
                if (strlen(a->kwn[k]) == nl && !memcmp(a->kwn[k], f, nl)) break;
            if (k == a->nkw) qcj_fail(c, QERR_INVAL, lineof(at), "format field '%.*s' is not given", (int)nl, f);
            v = a->kwv[k];
        }
        size_t p = nl;
        while (p < head) {
            if (f[p] == '.') {
                size_t q = p + 1;
                while (q < head && f[q] != '.' && f[q] != '[') q++;
                char *name = qcj_alloc(c, q - p);
                memcpy(name, f + p + 1, q - p - 1);
                name[q - p - 1] = 0;
                qcj_val out;
                if (!qcj_attr(c, v, name, q - p - 1, &out))
                    qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object has no attribute '%s'", qcj_type_name(v), name);
                v = out;
                p = q;
            } else {
                const char *close = memchr(f + p, ']', head - p);
                if (!close) qcj_fail(c, QERR_INVAL, lineof(at), "Missing ']' in format string");
                const char *k = f + p + 1;
                size_t kl = (size_t)(close - k);
                int digits = kl > 0;
                for (size_t j = 0; j < kl; j++)
                    if (k[j] < '0' || k[j] > '9') digits = 0;
                qcj_val key = digits && kl < 18 ? qcj_int(strtoll(k, NULL, 10)) : qcj_strv(c, k, kl);
                v = qcj_getitem(c, at, v, key);
                if (v.t == QV_UNDEF) qcj_fail(c, QERR_INVAL, lineof(at), "format field '%.*s' not found", (int)kl, k);
                p = (size_t)(close - f) + 1;
            }
        }
        if (cv == 'r' || cv == 'a') {
            qcj_buf r = { 0 };
            qcj_write_repr(c, &r, v);
            v = qcj_strv(c, r.p ? r.p : "", r.n);
        } else if (cv == 's') {
            qcj_val sv = { .t = QV_STR };
            sv.u.s = qcj_to_str(c, v);
            v = sv;
        } else if (cv) {
            qcj_fail(c, QERR_INVAL, lineof(at), "Unknown conversion specifier %c", cv);
        }
        if (!self.markup) {
            format_value(c, at, &b, v, spec ? spec + 1 : NULL, specl);
        } else if (v.t == QV_STR && v.markup) {
            if (specl) qcj_fail(c, QERR_INVAL, lineof(at), "Unsupported format specification for Markup.");
            qcj_buf_put(c, &b, v.u.s->s, v.u.s->len);
        } else {
            /* Markup.format escapes each formatted field. */
            qcj_buf fb = { 0 };
            format_value(c, at, &fb, v, spec ? spec + 1 : NULL, specl);
            const qcj_str *fs = qcj_escape_str(c, qcj_str_new(c, fb.p ? fb.p : "", fb.n));
            qcj_buf_put(c, &b, fs->s, fs->len);
        }
        i = e + 1;
    }
    return qcj_strval(qcj_str_new(c, b.p ? b.p : "", b.n), self.markup);
}

qcj_val qcj_percent_format(qcj_ctx *c, const qcj_node *at, const qcj_str *fmt, int markup, qcj_val args)
{
    const qcj_val *items = &args;
    size_t n = 1, next = 0;
    const qcj_dict *map = NULL;
    if (args.t == QV_LIST && args.u.l->kind == QL_TUPLE) {
        items = args.u.l->v;
        n = args.u.l->n;
    } else if (args.t == QV_DICT) {
        map = args.u.d;
    }
    qcj_buf b = { 0 };
    size_t i = 0;
    while (i < fmt->len) {
        char ch = fmt->s[i];
        if (ch != '%') {
            const char *q = memchr(fmt->s + i, '%', fmt->len - i);
            size_t e = q ? (size_t)(q - fmt->s) : fmt->len;
            qcj_buf_put(c, &b, fmt->s + i, e - i);
            i = e;
            continue;
        }
        size_t start = i++;
        qcj_val v = qcj_none();
        int have = 0;
        if (i < fmt->len && fmt->s[i] == '(') {
            size_t depth = 1, k = ++i;
            while (k < fmt->len && depth) {
                if (fmt->s[k] == '(') depth++;
                else if (fmt->s[k] == ')') depth--;
                if (depth) k++;
            }
            if (k >= fmt->len) qcj_fail(c, QERR_INVAL, lineof(at), "incomplete format key");
            if (!map) qcj_fail(c, QERR_INVAL, lineof(at), "format requires a mapping");
            if (!qcj_dict_get_str(map, fmt->s + i, k - i, &v)) qcj_fail(c, QERR_INVAL, lineof(at), "'%.*s'", (int)(k - i), fmt->s + i);
            have = 1;
            i = k + 1;
        }
        fspec f;
        memset(&f, 0, sizeof f);
        f.fill = ' ';
        f.width = f.prec = -1;
        char flags[8] = { 0 };
        size_t nf = 0;
        while (i < fmt->len && strchr("-+ #0", fmt->s[i])) {
            if (nf < 6) flags[nf++] = fmt->s[i];
            i++;
        }
        int64_t width = -1, prec = -1;
        if (i < fmt->len && fmt->s[i] == '*') qcj_fail(c, QERR_UNSUPPORTED, lineof(at), "'*' width is not supported");
        /* Digits past 10^9 only keep the value large: the limit check below fails it. */
        while (i < fmt->len && fmt->s[i] >= '0' && fmt->s[i] <= '9') {
            int64_t d = fmt->s[i++] - '0';
            width = width < 0 ? d : width < 1000000000 ? width * 10 + d : width;
        }
        if (i < fmt->len && fmt->s[i] == '.') {
            i++;
            prec = 0;
            while (i < fmt->len && fmt->s[i] >= '0' && fmt->s[i] <= '9') {
                int64_t d = fmt->s[i++] - '0';
                prec = prec < 1000000000 ? prec * 10 + d : prec;
            }
        }
        while (i < fmt->len && strchr("hlL", fmt->s[i])) i++;
        if (i >= fmt->len) qcj_fail(c, QERR_INVAL, lineof(at), "incomplete format");
        char t = fmt->s[i++];
        if (width > (int64_t)c->max_output || prec > 300) qcj_fail(c, QERR_LIMIT, lineof(at), "format width or precision too large");
        if (t == '%') {
            qcj_buf_putc(c, &b, '%');
            continue;
        }
        if (!have) {
            if (map) {
                v = args;
                next = 1;
            } else {
                if (next >= n) qcj_fail(c, QERR_INVAL, lineof(at), "not enough arguments for format string");
                v = items[next++];
            }
        }
        int left = strchr(flags, '-') != NULL;
        f.width = width;
        f.align = left ? '<' : '>';
        char tmp[1200];
        if (t == 's' || t == 'r' || t == 'a') {
            qcj_buf r = { 0 };
            if (t == 's') qcj_write_str(c, &r, v);
            else qcj_write_repr(c, &r, v);
            qcj_str *s = qcj_str_new(c, r.p ? r.p : "", r.n);
            /* A Markup's % escapes its arguments before precision and width. */
            if (markup && !(t == 's' && v.t == QV_STR && v.markup)) s = qcj_escape_str(c, s);
            size_t len = prec >= 0 ? qcj_str_off(s, (size_t)prec) : s->len;
            emit_padded(c, &b, &f, s->s, len, 0, '>');
            continue;
        }
        if (t == 'c') {
            size_t k;
            /* markupsafe hands %c a wrapper that is neither an int nor a char */
            if (markup) qcj_fail(c, QERR_INVAL, lineof(at), "%%c requires int or char");
            if (is_int(v)) k = qutf8_encode((uint32_t)(v.u.i & 0x1FFFFF), tmp);
            else if (v.t == QV_STR && v.u.s->nchars == 1) k = v.u.s->len, memcpy(tmp, v.u.s->s, k);
            else qcj_fail(c, QERR_INVAL, lineof(at), "%%c requires int or char");
            emit_padded(c, &b, &f, tmp, k, 0, '>');
            continue;
        }
        if (!qcj_is_num(v)) {
            qcj_fail(c, QERR_INVAL, lineof(at), "%%%c format: %s is required, not %s", t,
                     strchr("oxX", t) ? "an integer" : "a real number", qcj_type_name(v));
        }
        char cfmt[24];
        size_t k = 0;
        cfmt[k++] = '%';
        for (size_t j = 0; j < nf && k < 10; j++) cfmt[k++] = flags[j];
        cfmt[k] = 0;
        if (width >= 0) k += (size_t)snprintf(cfmt + k, sizeof cfmt - k, "%d", (int)width);
        if (prec >= 0) k += (size_t)snprintf(cfmt + k, sizeof cfmt - k, ".%d", (int)prec);
        if (strchr("diu", t)) {
            double d = qcj_num(v);
            if (v.t == QV_FLOAT && !isfinite(d)) qcj_fail(c, QERR_INVAL, lineof(at), "cannot convert float infinity or NaN to integer");
            long long x = v.t == QV_FLOAT ? (long long)d : (long long)v.u.i;
            snprintf(cfmt + k, sizeof cfmt - k, "lld");
            snprintf(tmp, sizeof tmp, cfmt, x);
        } else if (strchr("oxX", t)) {
            if (v.t == QV_FLOAT) qcj_fail(c, QERR_INVAL, lineof(at), "%%%c format: an integer is required, not float", t);
            long long x = (long long)v.u.i;
            unsigned long long u = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
            snprintf(cfmt + k, sizeof cfmt - k, "ll%c", t);
            char body[100];
            snprintf(body, sizeof body, cfmt, u);
            if (x < 0) {
                /* put the sign in front of any padding zeros */
                size_t z = 0;
                while (body[z] == ' ') z++;
                snprintf(tmp, sizeof tmp, "%.*s-%s", (int)z, body, body + z);
            } else {
                snprintf(tmp, sizeof tmp, "%s", body);
            }
        } else if (strchr("eEfFgG", t)) {
            snprintf(cfmt + k, sizeof cfmt - k, "%c", t);
            snprintf(tmp, sizeof tmp, cfmt, qcj_num(v));
        } else {
            qcj_fail(c, QERR_INVAL, lineof(at), "unsupported format character '%c' (0x%x) at index %zu", t, (unsigned)(unsigned char)t, start + (size_t)(i - start - 1));
        }
        qcj_buf_puts(c, &b, tmp);
    }
    if (!map && next < n) qcj_fail(c, QERR_INVAL, lineof(at), "not all arguments converted during string formatting");
    return qcj_strval(qcj_str_new(c, b.p ? b.p : "", b.n), markup);
}

/* ---- dict, list, loop, cycler methods ------------------------------------------------ */

static qcj_val dict_view(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a, int kind)
{
    qcj_val s[1];
    qcj_bind(c, at, kind == QL_ITEMS ? "items" : kind == QL_KEYS ? "keys" : "values", a, P_NONE, 0, s);
    const qcj_dict *d = self.u.d;
    qcj_list *l = qcj_list_new(c, (uint8_t)kind, d->n);
    for (size_t i = 0; i < d->n; i++)
        l->v[i] = kind == QL_ITEMS ? qcj_pair(c, d->k[i], d->v[i]) : kind == QL_KEYS ? d->k[i] : d->v[i];
    l->n = d->n;
    return qcj_listv(l);
}

static qcj_val m_items(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return dict_view(c, at, self, a, QL_ITEMS); }
static qcj_val m_keys(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return dict_view(c, at, self, a, QL_KEYS); }
static qcj_val m_values(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a) { return dict_view(c, at, self, a, QL_VALUES); }

static qcj_val m_get(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    static const char *const P[] = { "key", "default", NULL };
    qcj_val s[2], v;
    qcj_bind(c, at, "get", a, P, 1, s);
    if (qcj_dict_get(c, at, self.u.d, s[0], &v)) return v;
    return given(s[1]) ? s[1] : qcj_none();
}

static qcj_val m_copy(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    qcj_val s[1];
    qcj_bind(c, at, "copy", a, P_NONE, 0, s);
    if (self.t == QV_DICT) {
        qcj_dict *d = qcj_dict_new(c);
        for (size_t i = 0; i < self.u.d->n; i++) qcj_dict_set(c, at, d, self.u.d->k[i], self.u.d->v[i]);
        return dictv(d);
    }
    qcj_list *l = qcj_list_new(c, self.u.l->kind, self.u.l->n);
    if (self.u.l->n) memcpy(l->v, self.u.l->v, self.u.l->n * sizeof *l->v);
    l->n = self.u.l->n;
    return qcj_listv(l);
}

static qcj_val m_list_count(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    qcj_val s[1];
    qcj_bind(c, at, "count", a, P_ONE, 1, s);
    int64_t k = 0;
    for (size_t i = 0; i < self.u.l->n; i++) k += qcj_eq(self.u.l->v[i], s[0]);
    return qcj_int(k);
}

static qcj_val m_list_index(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    qcj_val s[1];
    qcj_bind(c, at, "index", a, P_ONE, 1, s);
    for (size_t i = 0; i < self.u.l->n; i++)
        if (qcj_eq(self.u.l->v[i], s[0])) return qcj_int((int64_t)i);
    if (self.u.l->kind == QL_TUPLE) qcj_fail(c, QERR_INVAL, lineof(at), "tuple.index(x): x not in tuple");
    qcj_buf r = { 0 };
    qcj_write_repr(c, &r, s[0]);
    qcj_buf_putc(c, &r, 0);
    qcj_fail(c, QERR_INVAL, lineof(at), "%s is not in list", r.p);
}

static qcj_val m_unsafe(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    (void)self;
    (void)a;
    qcj_fail(c, QERR_INVAL, lineof(at), "this method is unsafe in the sandbox");
}

static qcj_val m_cycle(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    if (a->nkw) qcj_fail(c, QERR_INVAL, lineof(at), "cycle() takes no keyword arguments");
    if (!a->npos) qcj_fail(c, QERR_INVAL, lineof(at), "no items for cycling given");
    return a->pos[self.u.lp->i % a->npos];
}

static qcj_val m_changed(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    (void)at;
    qcj_list *l = qcj_list_new(c, QL_TUPLE, a->npos);
    if (a->npos) memcpy(l->v, a->pos, a->npos * sizeof *l->v);
    l->n = a->npos;
    qcj_val v = qcj_listv(l);
    qcj_loop *lp = self.u.lp;
    if (lp->has_changed && qcj_eq(lp->changed_last, v)) return qcj_bool(0);
    lp->changed_last = v;
    lp->has_changed = 1;
    return qcj_bool(1);
}

static qcj_val m_cycler_next(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    qcj_val s[1];
    qcj_bind(c, at, "next", a, P_NONE, 0, s);
    qcj_func *f = self.u.fn;
    qcj_val v = f->state.u.l->v[f->pos];
    f->pos = (f->pos + 1) % f->state.u.l->n;
    return v;
}

static qcj_val m_cycler_reset(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    qcj_val s[1];
    qcj_bind(c, at, "reset", a, P_NONE, 0, s);
    self.u.fn->pos = 0;
    return qcj_none();
}

static const qcj_builtin STR_METHODS[] = {
    { "capitalize", m_capitalize, 0 }, { "casefold", m_lower, 0 }, { "center", m_center, 0 },
    { "count", m_count, 0 }, { "endswith", m_endswith, 0 }, { "find", m_find, 0 },
    { "format", m_format, 0 }, { "index", m_index, 0 }, { "isalnum", m_isalnum, 0 },
    { "isalpha", m_isalpha, 0 }, { "isdigit", m_isdigit, 0 }, { "islower", m_islower, 0 },
    { "isnumeric", m_isdigit, 0 }, { "isspace", m_isspace, 0 }, { "isupper", m_isupper, 0 },
    { "join", m_join, 0 }, { "ljust", m_ljust, 0 }, { "lower", m_lower, 0 },
    { "lstrip", m_lstrip, 0 }, { "removeprefix", m_removeprefix, 0 }, { "removesuffix", m_removesuffix, 0 },
    { "replace", m_replace, 0 }, { "rfind", m_rfind, 0 }, { "rindex", m_rindex, 0 },
    { "rjust", m_rjust, 0 }, { "rsplit", m_rsplit, 0 }, { "rstrip", m_rstrip, 0 },
    { "split", m_split, 0 }, { "splitlines", m_splitlines, 0 }, { "startswith", m_startswith, 0 },
    { "strip", m_strip, 0 }, { "swapcase", m_swapcase, 0 }, { "title", m_title, 0 },
    { "upper", m_upper, 0 }, { "zfill", m_zfill, 0 },
};

/* markupsafe's Markup overrides these str methods to return a Markup (the
 * pieces, for the splits); replace escapes its `new`, center/ljust/rjust
 * their fill (argument 1).  join and format escape inside m_join and
 * m_format.  The other methods (count, find, startswith...) answer as on a
 * str. */
static const struct {
    qcj_builtin_fn fn;
    uint8_t escape_arg1;
} MARKUP_KEEPS[] = {
    { m_capitalize, 0 }, { m_center, 1 }, { m_format, 0 }, { m_join, 0 }, { m_ljust, 1 },
    { m_lower, 0 }, { m_lstrip, 0 }, { m_removeprefix, 0 }, { m_removesuffix, 0 }, { m_replace, 1 },
    { m_rjust, 1 }, { m_rsplit, 0 }, { m_rstrip, 0 }, { m_split, 0 }, { m_splitlines, 0 },
    { m_strip, 0 }, { m_swapcase, 0 }, { m_title, 0 }, { m_upper, 0 }, { m_zfill, 0 },
};

qcj_val qcj_markup_method(qcj_ctx *c, const qcj_node *at, const qcj_builtin *b, qcj_val self, const qcj_args *a)
{
    const size_t nk = sizeof MARKUP_KEEPS / sizeof MARKUP_KEEPS[0];
    size_t k = 0;
    while (k < nk && MARKUP_KEEPS[k].fn != b->fn) k++;
    if (k == nk) return b->fn(c, at, self, a);
    qcj_args esc = *a;
    if (MARKUP_KEEPS[k].escape_arg1 && a->npos > 1) {
        qcj_val *pos = qcj_allocn(c, a->npos, sizeof *pos);
        memcpy(pos, a->pos, a->npos * sizeof *pos);
        pos[1] = qcj_escape(c, pos[1]);
        esc.pos = pos;
    }
    return qcj_markup_items(b->fn(c, at, self, &esc));
}

static const qcj_builtin DICT_METHODS[] = {
    { "clear", m_unsafe, 1 }, { "copy", m_copy, 0 }, { "get", m_get, 0 }, { "items", m_items, 0 },
    { "keys", m_keys, 0 }, { "pop", m_unsafe, 1 }, { "popitem", m_unsafe, 1 },
    { "setdefault", m_unsafe, 1 }, { "update", m_unsafe, 1 }, { "values", m_values, 0 },
};

static const qcj_builtin LIST_METHODS[] = {
    { "append", m_unsafe, 1 }, { "clear", m_unsafe, 1 }, { "copy", m_copy, 0 },
    { "count", m_list_count, 0 }, { "extend", m_unsafe, 1 }, { "index", m_list_index, 0 },
    { "insert", m_unsafe, 1 }, { "pop", m_unsafe, 1 }, { "remove", m_unsafe, 1 },
    { "reverse", m_unsafe, 1 }, { "sort", m_unsafe, 1 },
};

static const qcj_builtin TUPLE_METHODS[] = { { "count", m_list_count, 0 }, { "index", m_list_index, 0 } };
static const qcj_builtin LOOP_METHODS[] = { { "changed", m_changed, 0 }, { "cycle", m_cycle, 0 } };
static const qcj_builtin CYCLER_METHODS[] = { { "next", m_cycler_next, 0 }, { "reset", m_cycler_reset, 0 } };

static const qcj_builtin *find_in(const qcj_builtin *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

#define FIND(tab, name) find_in(tab, sizeof tab / sizeof tab[0], name)

const qcj_builtin *qcj_find_method(qcj_val obj, const char *name)
{
    switch (obj.t) {
    case QV_STR: return FIND(STR_METHODS, name);
    case QV_DICT: return FIND(DICT_METHODS, name);
    case QV_LIST:
        if (obj.u.l->kind == QL_LIST) return FIND(LIST_METHODS, name);
        if (obj.u.l->kind == QL_TUPLE) return FIND(TUPLE_METHODS, name);
        return NULL;
    case QV_LOOP: return FIND(LOOP_METHODS, name);
    case QV_FUNC: return obj.u.fn->kind == QF_CYCLER ? FIND(CYCLER_METHODS, name) : NULL;
    default: return NULL;
    }
}

/* ---- globals ----------------------------------------------------------------------------- */

static qcj_val g_range(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    (void)self;
    if (a->nkw) qcj_fail(c, QERR_INVAL, lineof(at), "range() takes no keyword arguments");
    if (a->npos < 1 || a->npos > 3) qcj_fail(c, QERR_INVAL, lineof(at), "range expected at most 3 arguments, got %zu", a->npos);
    for (size_t i = 0; i < a->npos; i++)
        if (!is_int(a->pos[i])) qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object cannot be interpreted as an integer", qcj_type_name(a->pos[i]));
    int64_t start = 0, stop, step = 1;
    if (a->npos == 1) {
        stop = a->pos[0].u.i;
    } else {
        start = a->pos[0].u.i;
        stop = a->pos[1].u.i;
        if (a->npos == 3) step = a->pos[2].u.i;
    }
    if (step == 0) qcj_fail(c, QERR_INVAL, lineof(at), "range() arg 3 must not be zero");
    double cnt = 0;
    if (step > 0 && stop > start) cnt = ceil(((double)stop - (double)start) / (double)step);
    if (step < 0 && stop < start) cnt = ceil(((double)start - (double)stop) / -(double)step);
    if (cnt > 100000)
        qcj_fail(c, QERR_LIMIT, lineof(at), "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    qcj_list *l = qcj_list_new(c, QL_LIST, (size_t)cnt);
    for (size_t i = 0; i < (size_t)cnt; i++) l->v[i] = qcj_int(start + (int64_t)i * step);
    l->n = (size_t)cnt;
    return qcj_listv(l);
}

/* dict(*args, **kwargs) semantics, shared by dict() and namespace(). */
static qcj_dict *dict_from_args(qcj_ctx *c, const qcj_node *at, const qcj_args *a, const char *nm)
{
    qcj_dict *d = qcj_dict_new(c);
    if (a->npos > 1) qcj_fail(c, QERR_INVAL, lineof(at), "%s expected at most 1 argument, got %zu", nm, a->npos);
    if (a->npos == 1) {
        qcj_val src = a->pos[0];
        if (src.t == QV_DICT || src.t == QV_NS) {
            for (size_t i = 0; i < src.u.d->n; i++) qcj_dict_set(c, at, d, src.u.d->k[i], src.u.d->v[i]);
        } else {
            const qcj_val *items;
            size_t n;
            qcj_iter(c, at, src, &items, &n);
            for (size_t i = 0; i < n; i++) {
                const qcj_val *kv;
                size_t m;
                qcj_iter(c, at, items[i], &kv, &m);
                if (m != 2)
                    qcj_fail(c, QERR_INVAL, lineof(at), "dictionary update sequence element #%zu has length %zu; 2 is required", i, m);
                qcj_dict_set(c, at, d, kv[0], kv[1]);
            }
        }
    }
    for (size_t i = 0; i < a->nkw; i++) qcj_dict_set(c, at, d, qcj_cstrv(c, a->kwn[i]), a->kwv[i]);
    return d;
}

static qcj_val g_dict(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    (void)self;
    return dictv(dict_from_args(c, at, a, "dict"));
}

static qcj_val g_namespace(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    (void)self;
    qcj_val v = { .t = QV_NS };
    v.u.d = dict_from_args(c, at, a, "namespace");
    for (size_t i = 0; i < v.u.d->n; i++)
        if (v.u.d->k[i].t != QV_STR) qcj_fail(c, QERR_INVAL, lineof(at), "namespace attribute names must be strings");
    return v;
}

static qcj_val g_cycler(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    (void)self;
    if (!a->npos) qcj_fail(c, QERR_INVAL, lineof(at), "at least one item has to be provided");
    qcj_list *l = qcj_list_new(c, QL_TUPLE, a->npos);
    memcpy(l->v, a->pos, a->npos * sizeof *l->v);
    l->n = a->npos;
    qcj_func *f = qcj_alloc(c, sizeof *f);
    memset(f, 0, sizeof *f);
    f->kind = QF_CYCLER;
    f->state = qcj_listv(l);
    qcj_val v = { .t = QV_FUNC };
    v.u.fn = f;
    return v;
}

static qcj_val g_joiner(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    (void)self;
    static const char *const P[] = { "sep", NULL };
    qcj_val s[1];
    qcj_bind(c, at, "joiner", a, P, 0, s);
    qcj_func *f = qcj_alloc(c, sizeof *f);
    memset(f, 0, sizeof *f);
    f->kind = QF_JOINER;
    f->state = given(s[0]) ? s[0] : qcj_cstrv(c, ", ");
    qcj_val v = { .t = QV_FUNC };
    v.u.fn = f;
    return v;
}

static qcj_val g_raise_exception(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    (void)self;
    static const char *const P[] = { "message", NULL };
    qcj_val s[1];
    qcj_bind(c, at, "raise_exception", a, P, 1, s);
    const qcj_str *m = qcj_to_str(c, s[0]);
    c->raw_msg = 1;
    qcj_fail(c, QERR_INVAL, 0, "%s", m->s);
}

static qcj_val g_strftime_now(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a)
{
    (void)self;
    static const char *const P[] = { "format", NULL };
    qcj_val s[1];
    qcj_bind(c, at, "strftime_now", a, P, 1, s);
    const qcj_str *fmt = need_str(c, at, s[0], "strftime() argument 1");
    struct tm tm;
    long usec = 0;
    if (c->now != INT64_MIN) {
        time_t t = (time_t)c->now;
        gmtime_r(&t, &tm);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        time_t t = ts.tv_sec;
        usec = ts.tv_nsec / 1000;
        localtime_r(&t, &tm);
    }
    /* Python's naive datetime: %f is microseconds, %z and %Z are empty. */
    qcj_buf pre = { 0 };
    for (size_t i = 0; i < fmt->len && fmt->s[i]; i++) {
        if (fmt->s[i] == '%' && i + 1 < fmt->len) {
            char k = fmt->s[i + 1];
            if (k == 'f') {
                char us[32];
                snprintf(us, sizeof us, "%06ld", usec);
                qcj_buf_puts(c, &pre, us);
                i++;
                continue;
            }
            if (k == 'z' || k == 'Z') {
                i++;
                continue;
            }
            qcj_buf_put(c, &pre, fmt->s + i, 2);
            i++;
            continue;
        }
        qcj_buf_putc(c, &pre, fmt->s[i]);
    }
    qcj_buf_putc(c, &pre, 0);
    if (pre.n == 1) return qcj_strv(c, "", 0);
    for (size_t cap = 256; cap <= 65536; cap *= 4) {
        char *out = qcj_alloc(c, cap);
        size_t n = strftime(out, cap, pre.p, &tm);
        if (n) return qcj_strv(c, out, n);
    }
    return qcj_strv(c, "", 0);
}

static const qcj_builtin GLOBALS[] = {
    { "cycler", g_cycler, 0 }, { "dict", g_dict, 0 }, { "joiner", g_joiner, 0 },
    { "namespace", g_namespace, 0 }, { "raise_exception", g_raise_exception, 0 }, { "range", g_range, 0 },
    { "strftime_now", g_strftime_now, 0 },
};

const qcj_builtin *qcj_globals(size_t *n)
{
    *n = sizeof GLOBALS / sizeof GLOBALS[0];
    return GLOBALS;
}
