/* chat_value.c - the value model of the chat template interpreter.
 *
 * Values imitate the Python objects jinja2 would hold, because templates
 * observe Python's behaviour directly: what str() prints, how == compares,
 * what json.dumps writes.  The rules kept here:
 *
 *  1. str(): None -> "None", True -> "True", floats as repr() (shortest
 *     round-trip digits; fixed notation when the decimal exponent is in
 *     (-4, 16], else "1e+16" style), Undefined -> "", containers as repr()
 *     ("[1, 'a']", "{'k': None}", "(1,)").
 *  2. repr() of strings picks ' or " like Python and escapes \n, \t, \r,
 *     control characters and non-printable code points (\xNN, \uNNNN).
 *     Printability outside ASCII uses a short table (C1 controls, spaces,
 *     format characters, private use); unassigned code points count as
 *     printable, a known gap.
 *  3. json.dumps: ", " and ": " separators unless an indent is given (then
 *     "," and newlines), non-ASCII kept unless ensure_ascii, NaN/Infinity
 *     for non-finite floats, non-string keys converted like Python.
 *  4. Equality is deep and numeric across int/float/bool (1 == 1.0 == True);
 *     list == tuple is False.  Ordering works for numbers, strings (code
 *     point order, which is UTF-8 byte order) and same-kind sequences, and
 *     fails with Python's TypeError message otherwise.
 *  5. Dicts keep insertion order; a key that is set again keeps its place.
 *
 * Memory: everything lives in the context's arena (see chat_int.h); nothing
 * here frees.  Output buffers grow by doubling inside the arena, so a buffer
 * wastes at most its own size in abandoned copies.
 */
#include "chat_int.h"
#include "qerr.h"
#include "util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---------------------------------------------------------------- */

struct qcj_chunk {
    qcj_chunk *next;
    size_t cap, used;
    size_t pad; /* keeps data 16-byte aligned after a 32-byte header */
    unsigned char data[];
};

void *qcj_arena_alloc(qcj_arena *a, size_t n, int *over_budget)
{
    *over_budget = 0;
    if (n > ((size_t)1 << 40)) {
        *over_budget = 1;
        return NULL;
    }
    n = (n + 15) & ~(size_t)15;
    if (!n) n = 16;
    qcj_chunk *h = a->head;
    if (h && h->cap - h->used >= n) {
        void *p = h->data + h->used;
        h->used += n;
        return p;
    }
    size_t want = h ? h->cap * 2 : 16384;
    if (want > ((size_t)1 << 20)) want = (size_t)1 << 20;
    int dedicated = n > want / 2;
    size_t cap = dedicated ? n : want;
    size_t bytes = sizeof(qcj_chunk) + cap;
    if (a->total + bytes > a->budget) {
        *over_budget = 1;
        return NULL;
    }
    qcj_chunk *ch = q_malloc(bytes);
    if (!ch) return NULL;
    a->total += bytes;
    ch->cap = cap;
    ch->used = n;
    if (dedicated && h) {
        /* keep bumping in the current chunk */
        ch->next = h->next;
        h->next = ch;
    } else {
        ch->next = h;
        a->head = ch;
    }
    return ch->data;
}

void qcj_arena_free(qcj_arena *a)
{
    if (!a) return;
    qcj_chunk *ch = a->head;
    while (ch) {
        qcj_chunk *nx = ch->next;
        free(ch);
        ch = nx;
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- errors and allocation -------------------------------------------------- */

void qcj_fail(qcj_ctx *c, int rc, int line, const char *fmt, ...)
{
    int k = 0;
    if (line > 0) k = snprintf(c->msg, sizeof c->msg, "line %d: ", line);
    if (k < 0 || (size_t)k >= sizeof c->msg) k = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg + k, sizeof c->msg - (size_t)k, fmt, ap);
    va_end(ap);
    c->rc = rc;
    longjmp(c->jb, 1);
}

void *qcj_alloc(qcj_ctx *c, size_t n)
{
    int over;
    void *p = qcj_arena_alloc(c->ar, n, &over);
    if (p) return p;
    if (over) qcj_fail(c, QERR_LIMIT, 0, "memory limit exceeded (%zu bytes)", c->ar->budget);
    qcj_fail(c, QERR_NOMEM, 0, "out of memory");
}

void *qcj_allocn(qcj_ctx *c, size_t n, size_t size)
{
    size_t total;
    if (q_mul_overflow(n, size, &total)) qcj_fail(c, QERR_LIMIT, 0, "memory limit exceeded (%zu bytes)", c->ar->budget);
    return qcj_alloc(c, total);
}

const char *qcj_obj_type_repr(qcj_val v)
{
    switch (v.t) {
    case QV_NONE: return "None";
    case QV_NS: return "jinja2.utils.Namespace object";
    case QV_LOOP: return "jinja2.runtime.LoopContext object";
    case QV_FUNC: return v.u.fn->kind == QF_MACRO ? "jinja2.runtime.Macro object" : "builtin_function_or_method object";
    case QV_UNDEF: return "jinja2.runtime.Undefined object";
    case QV_BOOL: return "bool object";
    case QV_INT: return "int object";
    case QV_FLOAT: return "float object";
    case QV_STR: return v.markup ? "markupsafe.Markup object" : "str object";
    case QV_DICT: return "dict object";
    case QV_LIST:
        switch (v.u.l->kind) {
        case QL_TUPLE: return "tuple object";
        case QL_GEN: return "generator object";
        case QL_ITEMS: return "dict_items object";
        case QL_KEYS: return "dict_keys object";
        case QL_VALUES: return "dict_values object";
        default: return "list object";
        }
    }
    return "object";
}

void qcj_fail_undef(qcj_ctx *c, int line, qcj_val u)
{
    const qcj_undef *d = u.t == QV_UNDEF ? u.u.un : NULL;
    if (!d) qcj_fail(c, QERR_INVAL, line, "value is undefined");
    switch (d->kind) {
    case QU_NAME: qcj_fail(c, QERR_INVAL, line, "'%s' is undefined", d->text);
    case QU_ATTR: qcj_fail(c, QERR_INVAL, line, "'%s' has no attribute '%s'", qcj_obj_type_repr(d->obj), d->text);
    case QU_ELEM: {
        qcj_buf b = { 0 };
        qcj_write_repr(c, &b, d->key);
        qcj_buf_putc(c, &b, 0);
        qcj_fail(c, QERR_INVAL, line, "%s has no element %s", qcj_obj_type_repr(d->obj), b.p);
    }
    default: qcj_fail(c, QERR_INVAL, line, "%s", d->text);
    }
}

/* ---- construction ------------------------------------------------------------- */

qcj_str *qcj_str_new(qcj_ctx *c, const char *p, size_t n)
{
    if (n > ((size_t)1 << 40)) qcj_fail(c, QERR_LIMIT, 0, "string too long");
    qcj_str *s = qcj_alloc(c, sizeof *s + n + 1);
    s->len = n;
    size_t nc = n;
    if (p) {
        memcpy(s->s, p, n);
        for (size_t i = 0; i < n; i++)
            if (((unsigned char)p[i] & 0xC0) == 0x80) nc--;
    }
    s->nchars = nc;
    s->s[n] = 0;
    return s;
}

qcj_val qcj_strv(qcj_ctx *c, const char *p, size_t n)
{
    qcj_val v = { .t = QV_STR };
    v.u.s = qcj_str_new(c, p, n);
    return v;
}

qcj_val qcj_cstrv(qcj_ctx *c, const char *s) { return qcj_strv(c, s, strlen(s)); }

/* ---- Markup ------------------------------------------------------------------ */

qcj_str *qcj_escape_str(qcj_ctx *c, qcj_str *str)
{
    qcj_buf b = { 0 };
    size_t run = 0;
    for (size_t i = 0; i < str->len; i++) {
        const char *rep = NULL;
        switch (str->s[i]) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '"': rep = "&#34;"; break;
        case '\'': rep = "&#39;"; break;
        default: break;
        }
        if (!rep) continue;
        qcj_buf_put(c, &b, str->s + run, i - run);
        qcj_buf_puts(c, &b, rep);
        run = i + 1;
    }
    if (!run) return str; /* nothing to replace (strings never change) */
    qcj_buf_put(c, &b, str->s + run, str->len - run);
    return qcj_str_new(c, b.p, b.n);
}

qcj_val qcj_escape(qcj_ctx *c, qcj_val v)
{
    if (v.t == QV_STR && v.markup) return v;
    return qcj_strval(qcj_escape_str(c, qcj_to_str(c, v)), 1);
}

qcj_val qcj_markup_items(qcj_val v)
{
    if (v.t == QV_STR) v.markup = 1;
    if (v.t == QV_LIST)
        for (size_t i = 0; i < v.u.l->n; i++)
            if (v.u.l->v[i].t == QV_STR) v.u.l->v[i].markup = 1;
    return v;
}

static qcj_val mk_undef(qcj_ctx *c, int kind, const char *text, qcj_val obj, qcj_val key, int security)
{
    qcj_undef *u = qcj_alloc(c, sizeof *u);
    u->kind = (uint8_t)kind;
    u->security = (uint8_t)security;
    u->text = text;
    u->obj = obj;
    u->key = key;
    qcj_val v = { .t = QV_UNDEF };
    v.u.un = u;
    return v;
}

qcj_val qcj_undef_name(qcj_ctx *c, const char *name) { return mk_undef(c, QU_NAME, name, qcj_none(), qcj_none(), 0); }
qcj_val qcj_undef_hint(qcj_ctx *c, const char *hint, int security)
{
    return mk_undef(c, QU_HINT, hint, qcj_none(), qcj_none(), security);
}
qcj_val qcj_undef_attr(qcj_ctx *c, qcj_val obj, const char *name)
{
    return mk_undef(c, QU_ATTR, name, obj, qcj_none(), 0);
}
qcj_val qcj_undef_elem(qcj_ctx *c, qcj_val obj, qcj_val key)
{
    if (key.t == QV_STR) return mk_undef(c, QU_ATTR, key.u.s->s, obj, key, 0);
    return mk_undef(c, QU_ELEM, NULL, obj, key, 0);
}

qcj_list *qcj_list_new(qcj_ctx *c, uint8_t kind, size_t cap)
{
    qcj_list *l = qcj_alloc(c, sizeof *l);
    memset(l, 0, sizeof *l);
    l->kind = kind;
    if (cap) {
        l->v = qcj_allocn(c, cap, sizeof *l->v);
        l->cap = cap;
    }
    return l;
}

void qcj_list_push(qcj_ctx *c, qcj_list *l, qcj_val v)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        qcj_val *nv = qcj_allocn(c, nc, sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
}

qcj_val qcj_listv(qcj_list *l)
{
    qcj_val v = { .t = QV_LIST };
    v.u.l = l;
    return v;
}

qcj_val qcj_pair(qcj_ctx *c, qcj_val a, qcj_val b)
{
    qcj_list *l = qcj_list_new(c, QL_TUPLE, 2);
    l->v[0] = a;
    l->v[1] = b;
    l->n = 2;
    return qcj_listv(l);
}

qcj_dict *qcj_dict_new(qcj_ctx *c)
{
    qcj_dict *d = qcj_alloc(c, sizeof *d);
    memset(d, 0, sizeof *d);
    return d;
}

/* ---- hashing and dict lookup ---------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return mix64(h);
}

/* Nesting past this is refused by hashing and ordering, and compares
 * unequal, instead of recursing without bound (Python raises RecursionError
 * near 1000 levels). */
#define QCJ_MAX_NESTING 200

/* Returns 1 and *h, or 0 when v is unhashable (*bad names its type). */
static int hash_val_d(qcj_val v, uint64_t *h, const char **bad, int depth)
{
    switch (v.t) {
    case QV_STR: *h = hash_bytes(v.u.s->s, v.u.s->len); return 1;
    case QV_INT:
    case QV_BOOL: *h = mix64((uint64_t)v.u.i); return 1;
    case QV_FLOAT:
        if (v.u.f == floor(v.u.f) && fabs(v.u.f) < 9.2e18) {
            *h = mix64((uint64_t)(int64_t)v.u.f);
        } else {
            uint64_t bits;
            memcpy(&bits, &v.u.f, sizeof bits);
            *h = mix64(bits);
        }
        return 1;
    case QV_NONE: *h = 0x9e3779b97f4a7c15ULL; return 1;
    case QV_UNDEF: *h = 0x51ed270b27a9f3c1ULL; return 1;
    case QV_DICT: *bad = "dict"; return 0;
    case QV_LIST:
        if (v.u.l->kind == QL_TUPLE) {
            uint64_t acc = 0x345678;
            for (size_t i = 0; i < v.u.l->n; i++) {
                uint64_t e;
                if (depth > QCJ_MAX_NESTING) {
                    *bad = "tuple (nested too deeply)";
                    return 0;
                }
                if (!hash_val_d(v.u.l->v[i], &e, bad, depth + 1)) return 0;
                acc = mix64(acc ^ e) + i;
            }
            *h = acc;
            return 1;
        }
        if (v.u.l->kind == QL_LIST) {
            *bad = "list";
            return 0;
        }
        *h = mix64((uint64_t)(uintptr_t)v.u.l);
        return 1;
    default: *h = mix64((uint64_t)(uintptr_t)v.u.fn); return 1;
    }
}

static int hash_val(qcj_val v, uint64_t *h, const char **bad) { return hash_val_d(v, h, bad, 0); }

static void build_index(qcj_ctx *c, qcj_dict *d)
{
    size_t icap = 16;
    while (icap < d->n * 2 + 2) icap *= 2;
    uint32_t *idx = qcj_allocn(c, icap, sizeof *idx);
    memset(idx, 0, icap * sizeof *idx);
    for (size_t i = 0; i < d->n; i++) {
        uint64_t h = 0;
        const char *bad;
        hash_val(d->k[i], &h, &bad);
        size_t j = (size_t)h & (icap - 1);
        while (idx[j]) j = (j + 1) & (icap - 1);
        idx[j] = (uint32_t)(i + 1);
    }
    d->idx = idx;
    d->icap = icap;
}

static long dict_find(const qcj_dict *d, qcj_val k, uint64_t h)
{
    if (!d->idx) {
        for (size_t i = 0; i < d->n; i++)
            if (qcj_eq(d->k[i], k)) return (long)i;
        return -1;
    }
    size_t j = (size_t)h & (d->icap - 1);
    while (d->idx[j]) {
        size_t e = d->idx[j] - 1;
        if (qcj_eq(d->k[e], k)) return (long)e;
        j = (j + 1) & (d->icap - 1);
    }
    return -1;
}

static uint64_t need_hash(qcj_ctx *c, const qcj_node *at, qcj_val k)
{
    uint64_t h = 0;
    const char *bad = "?";
    if (!hash_val(k, &h, &bad)) qcj_fail(c, QERR_INVAL, at ? at->line : 0, "unhashable type: '%s'", bad);
    return h;
}

void qcj_dict_set(qcj_ctx *c, const qcj_node *at, qcj_dict *d, qcj_val k, qcj_val v)
{
    uint64_t h = need_hash(c, at, k);
    long i = dict_find(d, k, h);
    if (i >= 0) {
        d->v[i] = v;
        return;
    }
    if (d->n >= UINT32_MAX - 1) qcj_fail(c, QERR_LIMIT, at ? at->line : 0, "dict too large");
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        qcj_val *nk = qcj_allocn(c, nc, sizeof *nk), *nv = qcj_allocn(c, nc, sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    if (d->n > 8 && (!d->idx || d->n * 2 >= d->icap)) {
        build_index(c, d);
    } else if (d->idx) {
        size_t j = (size_t)h & (d->icap - 1);
        while (d->idx[j]) j = (j + 1) & (d->icap - 1);
        d->idx[j] = (uint32_t)d->n;
    }
}

int qcj_dict_get(qcj_ctx *c, const qcj_node *at, const qcj_dict *d, qcj_val k, qcj_val *out)
{
    long i = dict_find(d, k, need_hash(c, at, k));
    if (i < 0) return 0;
    *out = d->v[i];
    return 1;
}

int qcj_dict_get_str(const qcj_dict *d, const char *k, size_t n, qcj_val *out)
{
    if (d->idx) {
        uint64_t h = hash_bytes(k, n);
        size_t j = (size_t)h & (d->icap - 1);
        while (d->idx[j]) {
            size_t e = d->idx[j] - 1;
            if (d->k[e].t == QV_STR && d->k[e].u.s->len == n && !memcmp(d->k[e].u.s->s, k, n)) {
                *out = d->v[e];
                return 1;
            }
            j = (j + 1) & (d->icap - 1);
        }
        return 0;
    }
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == QV_STR && d->k[i].u.s->len == n && !memcmp(d->k[i].u.s->s, k, n)) {
            *out = d->v[i];
            return 1;
        }
    return 0;
}

/* ---- semantics -------------------------------------------------------------------- */

const char *qcj_type_name(qcj_val v)
{
    switch (v.t) {
    case QV_UNDEF: return "Undefined";
    case QV_NONE: return "NoneType";
    case QV_BOOL: return "bool";
    case QV_INT: return "int";
    case QV_FLOAT: return "float";
    case QV_STR: return v.markup ? "Markup" : "str";
    case QV_DICT: return "dict";
    case QV_NS: return "Namespace";
    case QV_LOOP: return "LoopContext";
    case QV_FUNC: return v.u.fn->kind == QF_MACRO || v.u.fn->kind == QF_CALLER ? "Macro" : "builtin_function_or_method";
    case QV_LIST:
        switch (v.u.l->kind) {
        case QL_TUPLE: return "tuple";
        case QL_GEN: return "generator";
        case QL_ITEMS: return "dict_items";
        case QL_KEYS: return "dict_keys";
        case QL_VALUES: return "dict_values";
        default: return "list";
        }
    default: return "object";
    }
}

int qcj_truthy(qcj_val v)
{
    switch (v.t) {
    case QV_UNDEF:
    case QV_NONE:
    case QV_MISSING: return 0;
    case QV_BOOL:
    case QV_INT: return v.u.i != 0;
    case QV_FLOAT: return v.u.f != 0.0;
    case QV_STR: return v.u.s->len != 0;
    case QV_LIST: return v.u.l->kind == QL_GEN || v.u.l->n != 0;
    case QV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int num_eq(qcj_val a, qcj_val b)
{
    if (a.t != QV_FLOAT && b.t != QV_FLOAT) return a.u.i == b.u.i;
    if (a.t == QV_FLOAT && b.t == QV_FLOAT) return a.u.f == b.u.f;
    double f = a.t == QV_FLOAT ? a.u.f : b.u.f;
    int64_t i = a.t == QV_FLOAT ? b.u.i : a.u.i;
    if (!(f >= -9.2233720368547758e18 && f < 9.2233720368547758e18)) return 0;
    if (f != floor(f)) return 0;
    return (int64_t)f == i;
}

static int eq_d(qcj_val a, qcj_val b, int depth)
{
    if (qcj_is_num(a) && qcj_is_num(b)) return num_eq(a, b);
    if (a.t != b.t) return 0;
    switch (a.t) {
    case QV_UNDEF:
    case QV_NONE: return 1;
    case QV_STR: return a.u.s->len == b.u.s->len && !memcmp(a.u.s->s, b.u.s->s, a.u.s->len);
    case QV_LIST: {
        const qcj_list *x = a.u.l, *y = b.u.l;
        if (x == y) return 1;
        if (x->kind != y->kind || (x->kind != QL_LIST && x->kind != QL_TUPLE && x->kind != QL_VALUES && x->kind != QL_ITEMS && x->kind != QL_KEYS)) return 0;
        if (x->kind == QL_VALUES) return 0; /* dict_values compare by identity */
        if (x->n != y->n || depth > QCJ_MAX_NESTING) return 0;
        for (size_t i = 0; i < x->n; i++)
            if (!eq_d(x->v[i], y->v[i], depth + 1)) return 0;
        return 1;
    }
    case QV_DICT: {
        const qcj_dict *x = a.u.d, *y = b.u.d;
        if (x == y) return 1;
        if (x->n != y->n || depth > QCJ_MAX_NESTING) return 0;
        for (size_t i = 0; i < x->n; i++) {
            uint64_t h = 0;
            const char *bad;
            hash_val(x->k[i], &h, &bad);
            long j = dict_find(y, x->k[i], h);
            if (j < 0 || !eq_d(x->v[i], y->v[j], depth + 1)) return 0;
        }
        return 1;
    }
    case QV_NS: return a.u.d == b.u.d;
    case QV_FUNC: return a.u.fn == b.u.fn;
    case QV_LOOP: return a.u.lp == b.u.lp;
    default: return 0;
    }
}

int qcj_eq(qcj_val a, qcj_val b) { return eq_d(a, b, 0); }

static int order_d(qcj_ctx *c, const qcj_node *at, qcj_val a, qcj_val b, const char *opname, int depth)
{
    int line = at ? at->line : 0;
    if (depth > QCJ_MAX_NESTING) qcj_fail(c, QERR_LIMIT, line, "maximum recursion depth exceeded in comparison");
    if (a.t == QV_UNDEF) qcj_fail_undef(c, line, a);
    if (b.t == QV_UNDEF) qcj_fail_undef(c, line, b);
    if (qcj_is_num(a) && qcj_is_num(b)) {
        if (a.t != QV_FLOAT && b.t != QV_FLOAT) return a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
        double x = qcj_num(a), y = qcj_num(b);
        if (isnan(x) || isnan(y)) return 2;
        return x < y ? -1 : x > y;
    }
    if (a.t == QV_STR && b.t == QV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int r = memcmp(a.u.s->s, b.u.s->s, n);
        if (r) return r < 0 ? -1 : 1;
        return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
    }
    if (a.t == QV_LIST && b.t == QV_LIST && a.u.l->kind == b.u.l->kind &&
        (a.u.l->kind == QL_LIST || a.u.l->kind == QL_TUPLE)) {
        const qcj_list *x = a.u.l, *y = b.u.l;
        for (size_t i = 0; i < x->n && i < y->n; i++)
            if (!qcj_eq(x->v[i], y->v[i])) return order_d(c, at, x->v[i], y->v[i], opname, depth + 1);
        return x->n < y->n ? -1 : x->n > y->n;
    }
    qcj_fail(c, QERR_INVAL, line, "'%s' not supported between instances of '%s' and '%s'", opname, qcj_type_name(a),
             qcj_type_name(b));
}

int qcj_order(qcj_ctx *c, const qcj_node *at, qcj_val a, qcj_val b, const char *opname)
{
    return order_d(c, at, a, b, opname, 0);
}

/* ---- UTF-8 and Unicode --------------------------------------------------------------- */

size_t qcj_str_off(const qcj_str *s, size_t i)
{
    if (s->nchars == s->len) return i < s->len ? i : s->len;
    size_t off = 0;
    while (i > 0 && off < s->len) {
        off++;
        while (off < s->len && ((unsigned char)s->s[off] & 0xC0) == 0x80) off++;
        i--;
    }
    return off;
}

int qcj_isspace(uint32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x1F);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Ranges where upper and lower case alternate: even code point upper. */
static int alt_pair_even_upper(uint32_t cp)
{
    return (cp >= 0x100 && cp <= 0x12F) || (cp >= 0x132 && cp <= 0x137) || (cp >= 0x14A && cp <= 0x177) ||
           (cp >= 0x1E00 && cp <= 0x1E95) || (cp >= 0x1EA0 && cp <= 0x1EFF) || (cp >= 0x460 && cp <= 0x481) ||
           (cp >= 0x48A && cp <= 0x4BF) || (cp >= 0x4D0 && cp <= 0x52F);
}

/* ... odd code point upper. */
static int alt_pair_odd_upper(uint32_t cp)
{
    return (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E) || (cp >= 0x4C1 && cp <= 0x4CE);
}

uint32_t qcj_upper(uint32_t cp)
{
    if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
    if ((cp >= 0xE0 && cp <= 0xFE && cp != 0xF7)) return cp - 32;
    if (cp == 0xFF) return 0x178;
    if (cp == 0xB5) return 0x39C;
    if (cp == 0x131) return 'I';
    if (cp == 0x17F) return 'S';
    if (alt_pair_even_upper(cp)) return (cp & 1) ? cp - 1 : cp;
    if (alt_pair_odd_upper(cp)) return (cp & 1) ? cp : cp - 1;
    if (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2) return cp - 32;
    if (cp == 0x3C2) return 0x3A3;
    if (cp == 0x3AC) return 0x386;
    if (cp >= 0x3AD && cp <= 0x3AF) return cp - 37;
    if (cp == 0x3CC) return 0x38C;
    if (cp == 0x3CD || cp == 0x3CE) return cp - 63;
    if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
    if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
    if (cp >= 0x561 && cp <= 0x586) return cp - 48;
    if (cp >= 0xFF41 && cp <= 0xFF5A) return cp - 32;
    return cp;
}

uint32_t qcj_lower(uint32_t cp)
{
    if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    if ((cp >= 0xC0 && cp <= 0xDE && cp != 0xD7)) return cp + 32;
    if (cp == 0x178) return 0xFF;
    if (cp == 0x130) return 'i';
    if (alt_pair_even_upper(cp)) return (cp & 1) ? cp : cp + 1;
    if (alt_pair_odd_upper(cp)) return (cp & 1) ? cp + 1 : cp;
    if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 32;
    if (cp == 0x386) return 0x3AC;
    if (cp >= 0x388 && cp <= 0x38A) return cp + 37;
    if (cp == 0x38C) return 0x3CC;
    if (cp == 0x38E || cp == 0x38F) return cp + 63;
    if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
    if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
    if (cp >= 0x531 && cp <= 0x556) return cp + 48;
    if (cp >= 0xFF21 && cp <= 0xFF3A) return cp + 32;
    return cp;
}

static int is_cased(uint32_t cp) { return qcj_upper(cp) != cp || qcj_lower(cp) != cp || cp == 0xDF; }

qcj_str *qcj_str_case(qcj_ctx *c, const qcj_str *s, int mode)
{
    /* 'ß' -> "SS" may double a 2-byte character; nothing else grows. */
    char *out = qcj_alloc(c, s->len * 2 + 1);
    size_t k = 0, i = 0;
    int prev_cased = 0, first = 1;
    while (i < s->len) {
        uint32_t cp;
        i += qutf8_decode(s->s + i, s->len - i, &cp);
        int up;
        switch (mode) {
        case QC_UPPER: up = 1; break;
        case QC_LOWER: up = 0; break;
        case QC_TITLE_WORDS: up = !prev_cased; break;
        case QC_CAPITALIZE: up = first; break;
        default: up = qcj_lower(cp) != cp ? 0 : qcj_upper(cp) != cp ? 1 : -1; break;
        }
        prev_cased = is_cased(cp);
        first = 0;
        if (up == 1 && cp == 0xDF) {
            if (mode == QC_UPPER) {
                out[k++] = 'S';
                out[k++] = 'S';
            } else {
                out[k++] = 'S';
                out[k++] = 's';
            }
            continue;
        }
        uint32_t m = up == 1 ? qcj_upper(cp) : up == 0 ? qcj_lower(cp) : cp;
        k += qutf8_encode(m, out + k);
    }
    return qcj_str_new(c, out, k);
}

/* ---- buffers ---------------------------------------------------------------------- */

void qcj_buf_put(qcj_ctx *c, qcj_buf *b, const char *p, size_t n)
{
    if (!n) return;
    if (n > c->max_output || b->n > c->max_output - n)
        qcj_fail(c, QERR_LIMIT, 0, "output limit exceeded (%zu bytes)", c->max_output);
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n) nc *= 2;
        char *np = qcj_alloc(c, nc);
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

void qcj_buf_puts(qcj_ctx *c, qcj_buf *b, const char *s) { qcj_buf_put(c, b, s, strlen(s)); }
void qcj_buf_putc(qcj_ctx *c, qcj_buf *b, char ch) { qcj_buf_put(c, b, &ch, 1); }

/* ---- str() and repr() ------------------------------------------------------------------ */

void qcj_fmt_float(double f, char *out)
{
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f > 0 ? "inf" : "-inf");
        return;
    }
    if (f == 0) {
        strcpy(out, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    char buf[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]xx */
    const char *p = buf;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    char digits[24];
    int nd = 0;
    while (*p && *p != 'e') {
        if (*p != '.') digits[nd++] = *p;
        p++;
    }
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int decpt = exp10 + 1;
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = digits[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++) *o++ = digits[i];
            for (int i = nd; i < decpt; i++) *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            for (int i = 0; i < decpt; i++) *o++ = digits[i];
            *o++ = '.';
            for (int i = decpt; i < nd; i++) *o++ = digits[i];
        }
        *o = 0;
        return;
    }
    *o++ = digits[0];
    if (nd > 1) {
        *o++ = '.';
        for (int i = 1; i < nd; i++) *o++ = digits[i];
    }
    int e = decpt - 1;
    sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
}

static int printable(uint32_t cp)
{
    if (cp < 0x20 || cp == 0x7F) return 0;
    if (cp < 0x7F) return 1;
    if (cp <= 0xA0 || cp == 0xAD) return 0;
    if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61C || cp == 0x6DD || cp == 0x70F || cp == 0x180E) return 0;
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F)) return 0;
    if ((cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF) return 0;
    if ((cp >= 0xD800 && cp <= 0xF8FF) || (cp >= 0xFFF9 && cp <= 0xFFFB) || cp == 0xFFFE || cp == 0xFFFF) return 0;
    if (cp == 0xE0001 || (cp >= 0xE0020 && cp <= 0xE007F) || cp >= 0xF0000) return 0;
    return 1;
}

static void write_str_repr(qcj_ctx *c, qcj_buf *b, const qcj_str *s)
{
    char q = '\'';
    if (memchr(s->s, '\'', s->len) && !memchr(s->s, '"', s->len)) q = '"';
    qcj_buf_putc(c, b, q);
    size_t i = 0, run = 0;
    while (i < s->len) {
        uint32_t cp;
        size_t k = qutf8_decode(s->s + i, s->len - i, &cp);
        char esc[16];
        int m = 0;
        if (cp == (uint32_t)q || cp == '\\') m = snprintf(esc, sizeof esc, "\\%c", (char)cp);
        else if (cp == '\t') m = snprintf(esc, sizeof esc, "\\t");
        else if (cp == '\n') m = snprintf(esc, sizeof esc, "\\n");
        else if (cp == '\r') m = snprintf(esc, sizeof esc, "\\r");
        else if (!printable(cp))
            m = cp <= 0xFF ? snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp)
              : cp <= 0xFFFF ? snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp)
                             : snprintf(esc, sizeof esc, "\\U%08x", (unsigned)cp);
        if (m) {
            qcj_buf_put(c, b, s->s + run, i - run);
            qcj_buf_put(c, b, esc, (size_t)m);
            run = i + k;
        }
        i += k;
    }
    qcj_buf_put(c, b, s->s + run, i - run);
    qcj_buf_putc(c, b, q);
}

static void write_val(qcj_ctx *c, qcj_buf *b, qcj_val v, int repr, int depth);

static void write_seq(qcj_ctx *c, qcj_buf *b, const qcj_list *l, int depth)
{
    const char *open = "[", *close = "]";
    switch (l->kind) {
    case QL_TUPLE: open = "("; close = l->n == 1 ? ",)" : ")"; break;
    case QL_ITEMS: open = "dict_items(["; close = "])"; break;
    case QL_KEYS: open = "dict_keys(["; close = "])"; break;
    case QL_VALUES: open = "dict_values(["; close = "])"; break;
    default: break;
    }
    qcj_buf_puts(c, b, open);
    for (size_t i = 0; i < l->n; i++) {
        if (i) qcj_buf_put(c, b, ", ", 2);
        write_val(c, b, l->v[i], 1, depth + 1);
    }
    qcj_buf_puts(c, b, close);
}

static void write_dict(qcj_ctx *c, qcj_buf *b, const qcj_dict *d, int depth)
{
    qcj_buf_putc(c, b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) qcj_buf_put(c, b, ", ", 2);
        write_val(c, b, d->k[i], 1, depth + 1);
        qcj_buf_put(c, b, ": ", 2);
        write_val(c, b, d->v[i], 1, depth + 1);
    }
    qcj_buf_putc(c, b, '}');
}

static void write_val(qcj_ctx *c, qcj_buf *b, qcj_val v, int repr, int depth)
{
    if (depth > 200) qcj_fail(c, QERR_LIMIT, 0, "maximum recursion depth exceeded while getting the repr of an object");
    char tmp[64];
    switch (v.t) {
    case QV_UNDEF:
        if (repr) qcj_buf_puts(c, b, "Undefined");
        return;
    case QV_MISSING: return;
    case QV_NONE: qcj_buf_puts(c, b, "None"); return;
    case QV_BOOL: qcj_buf_puts(c, b, v.u.i ? "True" : "False"); return;
    case QV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i);
        qcj_buf_puts(c, b, tmp);
        return;
    case QV_FLOAT:
        qcj_fmt_float(v.u.f, tmp);
        qcj_buf_puts(c, b, tmp);
        return;
    case QV_STR:
        if (!repr) qcj_buf_put(c, b, v.u.s->s, v.u.s->len);
        else if (!v.markup) write_str_repr(c, b, v.u.s);
        else {
            qcj_buf_puts(c, b, "Markup(");
            write_str_repr(c, b, v.u.s);
            qcj_buf_putc(c, b, ')');
        }
        return;
    case QV_LIST:
        if (v.u.l->kind == QL_GEN) {
            qcj_buf_puts(c, b, "<");
            qcj_buf_puts(c, b, v.u.l->gen_name ? v.u.l->gen_name : "generator object");
            qcj_buf_puts(c, b, ">");
            return;
        }
        write_seq(c, b, v.u.l, depth);
        return;
    case QV_DICT: write_dict(c, b, v.u.d, depth); return;
    case QV_NS:
        qcj_buf_puts(c, b, "<Namespace ");
        write_dict(c, b, v.u.d, depth);
        qcj_buf_putc(c, b, '>');
        return;
    case QV_LOOP:
        snprintf(tmp, sizeof tmp, "<LoopContext %zu/%zu>", v.u.lp->i + 1, v.u.lp->n);
        qcj_buf_puts(c, b, tmp);
        return;
    case QV_FUNC: {
        const qcj_func *f = v.u.fn;
        if (f->kind == QF_MACRO) {
            qcj_buf_puts(c, b, "<Macro '");
            qcj_buf_puts(c, b, f->node->s);
            qcj_buf_puts(c, b, "'>");
        } else if (f->kind == QF_CALLER) {
            qcj_buf_puts(c, b, "<Macro 'caller'>");
        } else if (f->kind == QF_METHOD) {
            qcj_buf_puts(c, b, "<built-in method ");
            qcj_buf_puts(c, b, f->b->name);
            qcj_buf_puts(c, b, " of ");
            qcj_buf_puts(c, b, qcj_obj_type_repr(f->self));
            qcj_buf_puts(c, b, ">");
        } else {
            qcj_buf_puts(c, b, "<function ");
            qcj_buf_puts(c, b, f->b ? f->b->name : "object");
            qcj_buf_puts(c, b, ">");
        }
        return;
    }
    }
}

void qcj_write_str(qcj_ctx *c, qcj_buf *b, qcj_val v) { write_val(c, b, v, 0, 0); }
void qcj_write_repr(qcj_ctx *c, qcj_buf *b, qcj_val v) { write_val(c, b, v, 1, 0); }

qcj_str *qcj_to_str(qcj_ctx *c, qcj_val v)
{
    if (v.t == QV_STR) return v.u.s;
    if (v.t == QV_UNDEF || v.t == QV_MISSING) return qcj_str_new(c, "", 0);
    qcj_buf b = { 0 };
    qcj_write_str(c, &b, v);
    return qcj_str_new(c, b.p ? b.p : "", b.n);
}

/* ---- json.dumps ---------------------------------------------------------------------- */

static void json_str(qcj_ctx *c, qcj_buf *b, const char *s, size_t n, int ascii)
{
    qcj_buf_putc(c, b, '"');
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char ch = (unsigned char)s[i];
        char esc[16];
        int m = 0;
        size_t k = 1;
        if (ch == '"') m = snprintf(esc, sizeof esc, "\\\"");
        else if (ch == '\\') m = snprintf(esc, sizeof esc, "\\\\");
        else if (ch == '\n') m = snprintf(esc, sizeof esc, "\\n");
        else if (ch == '\r') m = snprintf(esc, sizeof esc, "\\r");
        else if (ch == '\t') m = snprintf(esc, sizeof esc, "\\t");
        else if (ch == '\b') m = snprintf(esc, sizeof esc, "\\b");
        else if (ch == '\f') m = snprintf(esc, sizeof esc, "\\f");
        else if (ch < 0x20 || (ascii && ch == 0x7F)) m = snprintf(esc, sizeof esc, "\\u%04x", ch);
        else if (ascii && ch >= 0x80) {
            uint32_t cp;
            k = qutf8_decode(s + i, n - i, &cp);
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                m = snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                m = snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
        }
        if (m) {
            qcj_buf_put(c, b, s + run, i - run);
            qcj_buf_put(c, b, esc, (size_t)m);
            run = i + k;
        }
        i += k;
    }
    qcj_buf_put(c, b, s + run, i - run);
    qcj_buf_putc(c, b, '"');
}

static void json_float(qcj_ctx *c, qcj_buf *b, double f)
{
    char tmp[48];
    if (isnan(f)) strcpy(tmp, "NaN");
    else if (isinf(f)) strcpy(tmp, f > 0 ? "Infinity" : "-Infinity");
    else qcj_fmt_float(f, tmp);
    qcj_buf_puts(c, b, tmp);
}

static void json_newline(qcj_ctx *c, qcj_buf *b, const qcj_json_opts *o, int level)
{
    qcj_buf_putc(c, b, '\n');
    for (int i = 0; i < level; i++) qcj_buf_put(c, b, o->indent, o->indent_len);
}

static void json_val(qcj_ctx *c, const qcj_node *at, qcj_buf *b, qcj_val v, const qcj_json_opts *o, int level);

/* A dict key as json.dumps converts it; fails for unsupported key types. */
static void json_key(qcj_ctx *c, const qcj_node *at, qcj_buf *b, qcj_val k, const qcj_json_opts *o)
{
    char tmp[48];
    switch (k.t) {
    case QV_STR: json_str(c, b, k.u.s->s, k.u.s->len, o->ensure_ascii); return;
    case QV_BOOL: qcj_buf_puts(c, b, k.u.i ? "\"true\"" : "\"false\""); return;
    case QV_NONE: qcj_buf_puts(c, b, "\"null\""); return;
    case QV_INT: snprintf(tmp, sizeof tmp, "\"%lld\"", (long long)k.u.i); qcj_buf_puts(c, b, tmp); return;
    case QV_FLOAT:
        qcj_buf_putc(c, b, '"');
        json_float(c, b, k.u.f);
        qcj_buf_putc(c, b, '"');
        return;
    default:
        qcj_fail(c, QERR_INVAL, at ? at->line : 0, "keys must be str, int, float, bool or None, not %s",
                 qcj_type_name(k));
    }
}

static void sort_idx(qcj_ctx *c, const qcj_node *at, const qcj_dict *d, size_t *ix)
{
    /* insertion sort is fine for the sizes JSON objects in prompts have;
     * it is also stable, like Python's sorted() */
    for (size_t i = 1; i < d->n; i++) {
        size_t x = ix[i], j = i;
        while (j > 0 && qcj_order(c, at, d->k[x], d->k[ix[j - 1]], "<") < 0) {
            ix[j] = ix[j - 1];
            j--;
        }
        ix[j] = x;
    }
}

static void json_val(qcj_ctx *c, const qcj_node *at, qcj_buf *b, qcj_val v, const qcj_json_opts *o, int level)
{
    int line = at ? at->line : 0;
    if (level > 200) qcj_fail(c, QERR_LIMIT, line, "maximum recursion depth exceeded while encoding a JSON object");
    char tmp[48];
    switch (v.t) {
    case QV_NONE: qcj_buf_puts(c, b, "null"); return;
    case QV_BOOL: qcj_buf_puts(c, b, v.u.i ? "true" : "false"); return;
    case QV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i); qcj_buf_puts(c, b, tmp); return;
    case QV_FLOAT: json_float(c, b, v.u.f); return;
    case QV_STR: json_str(c, b, v.u.s->s, v.u.s->len, o->ensure_ascii); return;
    case QV_LIST:
        if (v.u.l->kind == QL_LIST || v.u.l->kind == QL_TUPLE) {
            const qcj_list *l = v.u.l;
            if (!l->n) {
                qcj_buf_puts(c, b, "[]");
                return;
            }
            qcj_buf_putc(c, b, '[');
            for (size_t i = 0; i < l->n; i++) {
                if (i) qcj_buf_put(c, b, o->item_sep, o->item_sep_len);
                if (o->indent) json_newline(c, b, o, level + 1);
                json_val(c, at, b, l->v[i], o, level + 1);
            }
            if (o->indent) json_newline(c, b, o, level);
            qcj_buf_putc(c, b, ']');
            return;
        }
        break;
    case QV_DICT: {
        const qcj_dict *d = v.u.d;
        if (!d->n) {
            qcj_buf_puts(c, b, "{}");
            return;
        }
        size_t *ix = qcj_allocn(c, d->n, sizeof *ix);
        for (size_t i = 0; i < d->n; i++) ix[i] = i;
        if (o->sort_keys) sort_idx(c, at, d, ix);
        qcj_buf_putc(c, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) qcj_buf_put(c, b, o->item_sep, o->item_sep_len);
            if (o->indent) json_newline(c, b, o, level + 1);
            json_key(c, at, b, d->k[ix[i]], o);
            qcj_buf_put(c, b, o->key_sep, o->key_sep_len);
            json_val(c, at, b, d->v[ix[i]], o, level + 1);
        }
        if (o->indent) json_newline(c, b, o, level);
        qcj_buf_putc(c, b, '}');
        return;
    }
    default: break;
    }
    qcj_fail(c, QERR_INVAL, line, "Object of type %s is not JSON serializable", qcj_type_name(v));
}

void qcj_write_json(qcj_ctx *c, const qcj_node *at, qcj_buf *b, qcj_val v, const qcj_json_opts *o)
{
    json_val(c, at, b, v, o, 0);
}

/* ---- from JSON ------------------------------------------------------------------------- */

qcj_val qcj_from_json(qcj_ctx *c, const json_t *j, int depth)
{
    if (depth > 200) qcj_fail(c, QERR_LIMIT, 0, "context nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL: return qcj_none();
    case JSON_TRUE: return qcj_bool(1);
    case JSON_FALSE: return qcj_bool(0);
    case JSON_INTEGER: return qcj_int((int64_t)json_integer_value(j));
    case JSON_REAL: return qcj_float(json_real_value(j));
    case JSON_STRING: {
        const char *s = json_string_value(j);
        size_t n = json_string_length(j);
        if (!qutf8_valid(s, n)) qcj_fail(c, QERR_INVAL, 0, "context string is not valid UTF-8");
        return qcj_strv(c, s, n);
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        qcj_list *l = qcj_list_new(c, QL_LIST, n);
        for (size_t i = 0; i < n; i++) l->v[i] = qcj_from_json(c, json_array_get(j, i), depth + 1);
        l->n = n;
        return qcj_listv(l);
    }
    case JSON_OBJECT: {
        qcj_dict *d = qcj_dict_new(c);
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            size_t kl = strlen(key);
            if (!qutf8_valid(key, kl)) qcj_fail(c, QERR_INVAL, 0, "context key is not valid UTF-8");
            qcj_dict_set(c, NULL, d, qcj_strv(c, key, kl), qcj_from_json(c, val, depth + 1));
        }
        qcj_val v = { .t = QV_DICT };
        v.u.d = d;
        return v;
    }
    }
    return qcj_none();
}
