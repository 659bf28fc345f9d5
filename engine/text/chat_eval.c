/* chat_eval.c - executes a template tree: statements, expressions, scopes.
 *
 * A tree-walking interpreter that reproduces what jinja2's generated Python
 * code does, inside HF's ImmutableSandboxedEnvironment.
 *
 * Scopes.  A scope is a list of (name, value) pairs with a parent.  Lookups
 * walk outwards: current scope, enclosing scopes, the root scope (the
 * caller's context plus top-level {% set %}), then the globals.  Jinja2's
 * rules, which templates depend on:
 *   - {% if %} makes no scope: a set inside it is visible after it.
 *   - every iteration of a for loop starts a fresh scope whose parent is the
 *     scope around the loop: a set inside the loop is gone after it and is
 *     not carried to the next iteration (hence namespace()).
 *   - macros, call blocks, block sets, filter blocks and with blocks run in
 *     their own scope; a macro's parent scope is the one it was defined in,
 *     read when it runs (so a later top-level set is visible to it).
 *   - {% set ns.attr = v %} writes into a namespace object found by lookup.
 *
 * Attribute and item access follow the sandbox: x.y tries the attribute
 * (methods of str/dict/list, namespace attributes, loop fields) then the item;
 * x[y] tries the item then the attribute; a miss is an undefined value, never
 * an error.  Mutating methods (list.append, dict.update...) yield an
 * "unsafe" undefined that raises SecurityError's message when called.
 * Undefined values print as "" and iterate as empty, but raise
 * "'x' is undefined" when called, subscripted, compared or used in arithmetic.
 *
 * Control flow: exec() returns SIG_NONE, SIG_BREAK or SIG_CONTINUE; loops
 * consume the last two, set and filter blocks pass them on (they are inline
 * code in jinja2), and the parser rejects break/continue outside loops and
 * inside macros.  As in jinja2, a loop's else block runs unless some
 * iteration reached the end of the body.
 *
 * Limits (see qcj_ctx): nesting of evaluation (C stack), macro recursion,
 * loop iterations plus macro calls, wall-clock time, output size and memory
 * are all checked here or in the allocator; each failure is a clean error.
 */
#define _GNU_SOURCE /* memmem */
#include "chat_int.h"
#include "qerr.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { SIG_NONE, SIG_BREAK, SIG_CONTINUE };

static qcj_val eval(qcj_ctx *c, const qcj_node *n, qcj_scope *sc);
static int exec(qcj_ctx *c, const qcj_node *n, qcj_scope *sc);

static int lineof(const qcj_node *n) { return n ? n->line : 0; }

static void enter(qcj_ctx *c, const qcj_node *n)
{
    if (++c->depth > c->max_depth) qcj_fail(c, QERR_LIMIT, lineof(n), "template nested too deeply");
}

void qcj_tick(qcj_ctx *c, const qcj_node *at)
{
    if (++c->iters > c->max_iters)
        qcj_fail(c, QERR_LIMIT, lineof(at), "iteration limit exceeded (%llu loop iterations and macro calls)",
                 (unsigned long long)c->max_iters);
    if ((++c->tick & 1023) == 0 && c->deadline > 0 && q_now() > c->deadline)
        qcj_fail(c, QERR_LIMIT, lineof(at), "render time limit exceeded");
}

/* ---- scopes ---------------------------------------------------------------- */

static qcj_scope *scope_new(qcj_ctx *c, qcj_scope *parent)
{
    qcj_scope *s = qcj_alloc(c, sizeof *s);
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

static int scope_find(const qcj_scope *sc, const char *name, size_t len, qcj_val *out)
{
    for (; sc; sc = sc->parent)
        for (size_t i = sc->n; i > 0; i--) {
            const qcj_var *v = &sc->vars[i - 1];
            if (v->len == len && !memcmp(v->name, name, len)) {
                *out = v->v;
                return 1;
            }
        }
    return 0;
}

static void scope_set(qcj_ctx *c, qcj_scope *sc, const char *name, size_t len, qcj_val v)
{
    for (size_t i = 0; i < sc->n; i++)
        if (sc->vars[i].len == len && !memcmp(sc->vars[i].name, name, len)) {
            sc->vars[i].v = v;
            return;
        }
    if (sc->n == sc->cap) {
        size_t nc = sc->cap ? sc->cap * 2 : 4;
        qcj_var *nv = qcj_allocn(c, nc, sizeof *nv);
        if (sc->n) memcpy(nv, sc->vars, sc->n * sizeof *nv);
        sc->vars = nv;
        sc->cap = nc;
    }
    sc->vars[sc->n].name = name;
    sc->vars[sc->n].len = len;
    sc->vars[sc->n].v = v;
    sc->n++;
}

/* ---- iteration ---------------------------------------------------------------- */

void qcj_iter(qcj_ctx *c, const qcj_node *at, qcj_val v, const qcj_val **items, size_t *n)
{
    *items = NULL;
    *n = 0;
    switch (v.t) {
    case QV_UNDEF: return;
    case QV_LIST:
        if (v.u.l->kind == QL_GEN) {
            if (v.u.l->consumed) return;
            v.u.l->consumed = 1;
        }
        *items = v.u.l->v;
        *n = v.u.l->n;
        return;
    case QV_DICT:
        *items = v.u.d->k;
        *n = v.u.d->n;
        return;
    case QV_STR: {
        const qcj_str *s = v.u.s;
        qcj_val *out = qcj_allocn(c, s->len ? s->len : 1, sizeof *out);
        size_t i = 0, k = 0;
        while (i < s->len) {
            uint32_t cp;
            size_t len = qutf8_decode(s->s + i, s->len - i, &cp);
            out[k++] = qcj_strv(c, s->s + i, len);
            i += len;
        }
        *items = out;
        *n = k;
        return;
    }
    default:
        qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object is not iterable", qcj_type_name(v));
    }
}

int qcj_contains(qcj_ctx *c, const qcj_node *at, qcj_val item, qcj_val cont)
{
    switch (cont.t) {
    case QV_UNDEF: return 0;
    case QV_STR:
        if (item.t != QV_STR)
            qcj_fail(c, QERR_INVAL, lineof(at), "'in <string>' requires string as left operand, not %s",
                     qcj_type_name(item));
        if (!item.u.s->len) return 1;
        return memmem(cont.u.s->s, cont.u.s->len, item.u.s->s, item.u.s->len) != NULL;
    case QV_DICT: {
        qcj_val out;
        return qcj_dict_get(c, at, cont.u.d, item, &out);
    }
    case QV_LIST: {
        const qcj_val *items;
        size_t n;
        qcj_iter(c, at, cont, &items, &n);
        for (size_t i = 0; i < n; i++)
            if (qcj_eq(items[i], item)) return 1;
        return 0;
    }
    default:
        qcj_fail(c, QERR_INVAL, lineof(at), "argument of type '%s' is not iterable", qcj_type_name(cont));
    }
}

/* ---- attribute and item access -------------------------------------------------- */

static qcj_val bound_method(qcj_ctx *c, qcj_val self, const qcj_builtin *b)
{
    if (b->unsafe) {
        char *m = qcj_alloc(c, 128);
        snprintf(m, 128, "access to attribute '%s' of '%s' object is unsafe.", b->name, qcj_type_name(self));
        return qcj_undef_hint(c, m, 1);
    }
    qcj_func *f = qcj_alloc(c, sizeof *f);
    memset(f, 0, sizeof *f);
    f->kind = QF_METHOD;
    f->b = b;
    f->self = self;
    qcj_val v = { .t = QV_FUNC };
    v.u.fn = f;
    return v;
}

static qcj_val loop_attr(qcj_ctx *c, qcj_val lv, const char *name, int *found)
{
    const qcj_loop *lp = lv.u.lp;
    size_t i = lp->i, n = lp->n;
    *found = 1;
    if (!strcmp(name, "index")) return qcj_int((int64_t)i + 1);
    if (!strcmp(name, "index0")) return qcj_int((int64_t)i);
    if (!strcmp(name, "revindex")) return qcj_int((int64_t)(n - i));
    if (!strcmp(name, "revindex0")) return qcj_int((int64_t)(n - i - 1));
    if (!strcmp(name, "first")) return qcj_bool(i == 0);
    if (!strcmp(name, "last")) return qcj_bool(i + 1 == n);
    if (!strcmp(name, "length")) return qcj_int((int64_t)n);
    if (!strcmp(name, "depth")) return qcj_int(lp->depth0 + 1);
    if (!strcmp(name, "depth0")) return qcj_int(lp->depth0);
    if (!strcmp(name, "previtem"))
        return i > 0 ? lp->items[i - 1] : qcj_undef_hint(c, "there is no previous item", 0);
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? lp->items[i + 1] : qcj_undef_hint(c, "there is no next item", 0);
    const qcj_builtin *b = qcj_find_method(lv, name);
    if (b) return bound_method(c, lv, b);
    *found = 0;
    return qcj_undef0();
}

int qcj_attr(qcj_ctx *c, qcj_val obj, const char *name, size_t len, qcj_val *out)
{
    if (strlen(name) != len) return 0;
    if (obj.t == QV_NS) return qcj_dict_get_str(obj.u.d, name, len, out);
    if (obj.t == QV_LOOP) {
        int found;
        *out = loop_attr(c, obj, name, &found);
        return found;
    }
    if (obj.t == QV_FUNC && obj.u.fn->kind == QF_CYCLER && !strcmp(name, "current")) {
        const qcj_list *items = obj.u.fn->state.u.l;
        *out = items->v[obj.u.fn->pos];
        return 1;
    }
    const qcj_builtin *b = qcj_find_method(obj, name);
    if (!b) return 0;
    *out = bound_method(c, obj, b);
    return 1;
}

qcj_val qcj_getattr(qcj_ctx *c, const qcj_node *at, qcj_val obj, const char *name, size_t len)
{
    if (obj.t == QV_UNDEF) qcj_fail_undef(c, lineof(at), obj);
    qcj_val v;
    if (qcj_attr(c, obj, name, len, &v)) return v;
    if (obj.t == QV_DICT && qcj_dict_get_str(obj.u.d, name, len, &v)) return v;
    return qcj_undef_attr(c, obj, name);
}

static int as_index(qcj_val k, int64_t *i)
{
    if (k.t != QV_INT && k.t != QV_BOOL) return 0;
    *i = k.u.i;
    return 1;
}

qcj_val qcj_getitem(qcj_ctx *c, const qcj_node *at, qcj_val obj, qcj_val key)
{
    if (obj.t == QV_UNDEF) qcj_fail_undef(c, lineof(at), obj);
    int64_t i;
    switch (obj.t) {
    case QV_DICT: {
        if (key.t == QV_LIST && key.u.l->kind == QL_LIST) break; /* unhashable */
        if (key.t == QV_DICT) break;
        qcj_val v;
        if (qcj_dict_get(c, at, obj.u.d, key, &v)) return v;
        break;
    }
    case QV_LIST:
        if ((obj.u.l->kind == QL_LIST || obj.u.l->kind == QL_TUPLE) && as_index(key, &i)) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) return obj.u.l->v[i];
        }
        break;
    case QV_STR:
        if (as_index(key, &i)) {
            const qcj_str *s = obj.u.s;
            int64_t n = (int64_t)s->nchars;
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                size_t a = qcj_str_off(s, (size_t)i), b = qcj_str_off(s, (size_t)i + 1);
                return qcj_strval(qcj_str_new(c, s->s + a, b - a), obj.markup);
            }
        }
        break;
    default: break;
    }
    qcj_val v;
    if (key.t == QV_STR && qcj_attr(c, obj, key.u.s->s, key.u.s->len, &v)) return v;
    return qcj_undef_elem(c, obj, key);
}

/* Python slice index normalisation (PySlice_AdjustIndices). */
static int64_t adjust(int64_t x, int64_t len, int64_t step)
{
    if (x < 0) {
        x += len;
        if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= len) {
        x = step < 0 ? len - 1 : len;
    }
    return x;
}

/* "None has no element slice(1, None, None)" */
static qcj_val slice_undef(qcj_ctx *c, qcj_val obj, const qcj_val *parts)
{
    qcj_buf b = { 0 };
    qcj_buf_puts(c, &b, qcj_obj_type_repr(obj));
    qcj_buf_puts(c, &b, " has no element slice(");
    for (int k = 0; k < 3; k++) {
        if (k) qcj_buf_put(c, &b, ", ", 2);
        qcj_write_repr(c, &b, parts[k]);
    }
    qcj_buf_put(c, &b, ")", 2); /* with the terminating NUL */
    return qcj_undef_hint(c, b.p, 0);
}

/* obj[a:b:c].  Python's slicing is strict (TypeError for objects that do
 * not slice); `lenient` is the folding path, which yields undefined. */
static qcj_val do_slice(qcj_ctx *c, const qcj_node *n, qcj_val obj, qcj_scope *sc, int lenient)
{
    qcj_val parts[3];
    for (int k = 0; k < 3; k++) parts[k] = n->kid[k] ? eval(c, n->kid[k], sc) : qcj_none();
    if (obj.t == QV_UNDEF) qcj_fail_undef(c, lineof(n), obj);
    int seq = obj.t == QV_STR || (obj.t == QV_LIST && (obj.u.l->kind == QL_LIST || obj.u.l->kind == QL_TUPLE));
    if (!seq) {
        if (lenient) return slice_undef(c, obj, parts);
        if (obj.t == QV_DICT) qcj_fail(c, QERR_INVAL, lineof(n), "unhashable type: 'slice'");
        qcj_fail(c, QERR_INVAL, lineof(n), "'%s' object is not subscriptable", qcj_type_name(obj));
    }
    int64_t v[3] = { 0, 0, 1 };
    int have[3];
    for (int k = 0; k < 3; k++) {
        have[k] = parts[k].t != QV_NONE;
        if (have[k] && !as_index(parts[k], &v[k])) {
            if (lenient) return slice_undef(c, obj, parts);
            qcj_fail(c, QERR_INVAL, lineof(n), "slice indices must be integers or None or have an __index__ method");
        }
    }
    int64_t step = have[2] ? v[2] : 1;
    if (step == 0) qcj_fail(c, QERR_INVAL, lineof(n), "slice step cannot be zero");
    if (step == INT64_MIN) step = -INT64_MAX;
    int64_t len = obj.t == QV_STR ? (int64_t)obj.u.s->nchars : (int64_t)obj.u.l->n;
    int64_t start = have[0] ? adjust(v[0], len, step) : (step < 0 ? len - 1 : 0);
    int64_t stop = have[1] ? adjust(v[1], len, step) : (step < 0 ? -1 : len);
    int64_t count = 0;
    if (step > 0 && stop > start) count = (stop - start - 1) / step + 1;
    if (step < 0 && start > stop) count = (start - stop - 1) / (-step) + 1;
    if (obj.t == QV_LIST) {
        qcj_list *l = qcj_list_new(c, obj.u.l->kind, (size_t)count);
        for (int64_t k = 0; k < count; k++) l->v[k] = obj.u.l->v[start + k * step];
        l->n = (size_t)count;
        return qcj_listv(l);
    }
    const qcj_str *s = obj.u.s;
    if (step == 1) {
        size_t a = qcj_str_off(s, (size_t)start), b = qcj_str_off(s, (size_t)(start + count));
        return qcj_strval(qcj_str_new(c, s->s + a, b - a), obj.markup);
    }
    size_t *off = qcj_allocn(c, s->nchars + 1, sizeof *off);
    for (size_t i = 0, k = 0; k <= s->nchars; k++) {
        off[k] = i;
        if (i < s->len) {
            i++;
            while (i < s->len && ((unsigned char)s->s[i] & 0xC0) == 0x80) i++;
        }
    }
    char *out = qcj_alloc(c, s->len + 1);
    size_t o = 0;
    for (int64_t k = 0; k < count; k++) {
        int64_t ci = start + k * step;
        size_t a = off[ci], b = off[ci + 1];
        memcpy(out + o, s->s + a, b - a);
        o += b - a;
    }
    return qcj_strval(qcj_str_new(c, out, o), obj.markup);
}

/* ---- arithmetic ------------------------------------------------------------------ */

static const char *opsym(int op)
{
    static const char *const s[] = { "+", "-", "*", "/", "//", "%", "** or pow()" };
    return op >= 0 && op <= OP_POW ? s[op] : "?";
}

static _Noreturn void unsupported(qcj_ctx *c, const qcj_node *at, int op, qcj_val a, qcj_val b)
{
    qcj_fail(c, QERR_INVAL, lineof(at), "unsupported operand type(s) for %s: '%s' and '%s'", opsym(op),
             qcj_type_name(a), qcj_type_name(b));
}

static qcj_val repeat(qcj_ctx *c, const qcj_node *at, qcj_val seq, int64_t times)
{
    if (times < 0) times = 0;
    if (seq.t == QV_STR) {
        size_t n = seq.u.s->len;
        if (n && (uint64_t)times > c->max_output / n) qcj_fail(c, QERR_LIMIT, lineof(at), "string repetition too large");
        char *out = qcj_alloc(c, n * (size_t)times + 1);
        for (int64_t i = 0; i < times; i++) memcpy(out + (size_t)i * n, seq.u.s->s, n);
        return qcj_strval(qcj_str_new(c, out, n * (size_t)times), seq.markup);
    }
    const qcj_list *l = seq.u.l;
    if (l->n && (uint64_t)times > (c->max_output / 16) / l->n) qcj_fail(c, QERR_LIMIT, lineof(at), "list repetition too large");
    qcj_list *r = qcj_list_new(c, l->kind, l->n * (size_t)times);
    for (int64_t i = 0; i < times; i++) {
        memcpy(r->v + (size_t)i * l->n, l->v, l->n * sizeof *l->v);
    }
    r->n = l->n * (size_t)times;
    return qcj_listv(r);
}

static qcj_val int_pow(qcj_ctx *c, const qcj_node *at, int64_t b, int64_t e)
{
    if (e < 0) {
        if (b == 0) qcj_fail(c, QERR_INVAL, lineof(at), "0.0 cannot be raised to a negative power");
        return qcj_float(pow((double)b, (double)e));
    }
    int64_t r = 1;
    while (e) {
        if (e & 1 && __builtin_mul_overflow(r, b, &r)) qcj_fail(c, QERR_INVAL, lineof(at), "integer overflow");
        e >>= 1;
        if (e && __builtin_mul_overflow(b, b, &b)) qcj_fail(c, QERR_INVAL, lineof(at), "integer overflow");
    }
    return qcj_int(r);
}

qcj_val qcj_binop(qcj_ctx *c, const qcj_node *at, int op, qcj_val a, qcj_val b)
{
    int line = lineof(at);
    if (a.t == QV_UNDEF) qcj_fail_undef(c, line, a);
    if (b.t == QV_UNDEF) qcj_fail_undef(c, line, b);
    int an = qcj_is_num(a), bn = qcj_is_num(b);
    if (an && bn) {
        int ints = a.t != QV_FLOAT && b.t != QV_FLOAT;
        int64_t x = a.u.i, y = b.u.i, r;
        double fx = qcj_num(a), fy = qcj_num(b);
        switch (op) {
        case OP_ADD:
            if (!ints) return qcj_float(fx + fy);
            if (__builtin_add_overflow(x, y, &r)) qcj_fail(c, QERR_INVAL, line, "integer overflow");
            return qcj_int(r);
        case OP_SUB:
            if (!ints) return qcj_float(fx - fy);
            if (__builtin_sub_overflow(x, y, &r)) qcj_fail(c, QERR_INVAL, line, "integer overflow");
            return qcj_int(r);
        case OP_MUL:
            if (!ints) return qcj_float(fx * fy);
            if (__builtin_mul_overflow(x, y, &r)) qcj_fail(c, QERR_INVAL, line, "integer overflow");
            return qcj_int(r);
        case OP_DIV:
            if (fy == 0) qcj_fail(c, QERR_INVAL, line, ints ? "division by zero" : "float division by zero");
            return qcj_float(fx / fy);
        case OP_FLOORDIV:
        case OP_MOD:
            if (ints) {
                if (y == 0)
                    qcj_fail(c, QERR_INVAL, line, op == OP_MOD ? "integer modulo by zero" : "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) {
                    if (op == OP_MOD) return qcj_int(0);
                    qcj_fail(c, QERR_INVAL, line, "integer overflow");
                }
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                return qcj_int(op == OP_MOD ? m : q);
            } else {
                if (fy == 0) qcj_fail(c, QERR_INVAL, line, op == OP_MOD ? "float modulo" : "float floor division by zero");
                double mod = fmod(fx, fy), div = (fx - mod) / fy;
                if (mod != 0) {
                    if ((fy < 0) != (mod < 0)) {
                        mod += fy;
                        div -= 1.0;
                    }
                } else {
                    mod = copysign(0.0, fy);
                }
                if (op == OP_MOD) return qcj_float(mod);
                double fl;
                if (div != 0) {
                    fl = floor(div);
                    if (div - fl > 0.5) fl += 1.0;
                } else {
                    fl = copysign(0.0, fx / fy);
                }
                return qcj_float(fl);
            }
        case OP_POW:
            if (ints) return int_pow(c, at, x, y);
            if (fx == 0 && fy < 0) qcj_fail(c, QERR_INVAL, line, "0.0 cannot be raised to a negative power");
            if (fx < 0 && fy != floor(fy)) qcj_fail(c, QERR_INVAL, line, "complex results are not supported");
            {
                double p = pow(fx, fy);
                if (isinf(p) && isfinite(fx) && isfinite(fy)) qcj_fail(c, QERR_INVAL, line, "(34, 'Numerical result out of range')");
                return qcj_float(p);
            }
        }
    }
    if (op == OP_ADD) {
        if (a.t == QV_STR && b.t == QV_STR) {
            /* Markup + str and str + Markup escape the str (markupsafe's
             * __add__ and __radd__): a Markup. */
            int markup = a.markup || b.markup;
            if (markup) a = qcj_escape(c, a), b = qcj_escape(c, b);
            size_t n = a.u.s->len + b.u.s->len;
            if (n > c->max_output) qcj_fail(c, QERR_LIMIT, line, "string too long");
            char *out = qcj_alloc(c, n + 1);
            memcpy(out, a.u.s->s, a.u.s->len);
            memcpy(out + a.u.s->len, b.u.s->s, b.u.s->len);
            return qcj_strval(qcj_str_new(c, out, n), markup);
        }
        if (a.t == QV_LIST && b.t == QV_LIST && a.u.l->kind == b.u.l->kind &&
            (a.u.l->kind == QL_LIST || a.u.l->kind == QL_TUPLE)) {
            qcj_list *l = qcj_list_new(c, a.u.l->kind, a.u.l->n + b.u.l->n);
            if (a.u.l->n) memcpy(l->v, a.u.l->v, a.u.l->n * sizeof *l->v);
            if (b.u.l->n) memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof *l->v);
            l->n = a.u.l->n + b.u.l->n;
            return qcj_listv(l);
        }
        if ((a.t == QV_STR && !a.markup) || (a.t == QV_LIST && (a.u.l->kind == QL_LIST || a.u.l->kind == QL_TUPLE)))
            qcj_fail(c, QERR_INVAL, line, "can only concatenate %s (not \"%s\") to %s", qcj_type_name(a),
                     qcj_type_name(b), qcj_type_name(a));
    }
    if (op == OP_MUL) {
        int aseq = a.t == QV_STR || (a.t == QV_LIST && (a.u.l->kind == QL_LIST || a.u.l->kind == QL_TUPLE));
        int bseq = b.t == QV_STR || (b.t == QV_LIST && (b.u.l->kind == QL_LIST || b.u.l->kind == QL_TUPLE));
        if (aseq && (b.t == QV_INT || b.t == QV_BOOL)) return repeat(c, at, a, b.u.i);
        if (bseq && (a.t == QV_INT || a.t == QV_BOOL)) return repeat(c, at, b, a.u.i);
        if (aseq && b.t != QV_FLOAT && !bseq)
            qcj_fail(c, QERR_INVAL, line, "can't multiply sequence by non-int of type '%s'", qcj_type_name(b));
    }
    if (op == OP_MOD && a.t == QV_STR) return qcj_percent_format(c, at, a.u.s, a.markup, b);
    unsupported(c, at, op, a, b);
}

static qcj_val compare(qcj_ctx *c, const qcj_node *at, int op, qcj_val a, qcj_val b)
{
    switch (op) {
    case OP_EQ: return qcj_bool(qcj_eq(a, b));
    case OP_NE: return qcj_bool(!qcj_eq(a, b));
    case OP_IN: return qcj_bool(qcj_contains(c, at, a, b));
    case OP_NOTIN: return qcj_bool(!qcj_contains(c, at, a, b));
    default: break;
    }
    static const char *const names[] = { [OP_LT] = "<", [OP_LE] = "<=", [OP_GT] = ">", [OP_GE] = ">=" };
    int r = qcj_order(c, at, a, b, names[op]);
    if (r == 2) return qcj_bool(0);
    switch (op) {
    case OP_LT: return qcj_bool(r < 0);
    case OP_LE: return qcj_bool(r <= 0);
    case OP_GT: return qcj_bool(r > 0);
    default: return qcj_bool(r >= 0);
    }
}

/* ---- calls ------------------------------------------------------------------------ */

typedef struct {
    qcj_val *pos;
    size_t npos, cpos;
    const char **kwn;
    qcj_val *kwv;
    size_t nkw, ckw;
} argbuf;

static void push_pos(qcj_ctx *c, argbuf *a, qcj_val v)
{
    if (a->npos == a->cpos) {
        size_t nc = a->cpos ? a->cpos * 2 : 4;
        qcj_val *nv = qcj_allocn(c, nc, sizeof *nv);
        if (a->npos) memcpy(nv, a->pos, a->npos * sizeof *nv);
        a->pos = nv;
        a->cpos = nc;
    }
    a->pos[a->npos++] = v;
}

static void push_kw(qcj_ctx *c, argbuf *a, const char *name, qcj_val v)
{
    if (a->nkw == a->ckw) {
        size_t nc = a->ckw ? a->ckw * 2 : 4;
        const char **nn = qcj_allocn(c, nc, sizeof *nn);
        qcj_val *nv = qcj_allocn(c, nc, sizeof *nv);
        if (a->nkw) {
            memcpy(nn, a->kwn, a->nkw * sizeof *nn);
            memcpy(nv, a->kwv, a->nkw * sizeof *nv);
        }
        a->kwn = nn;
        a->kwv = nv;
        a->ckw = nc;
    }
    a->kwn[a->nkw] = name;
    a->kwv[a->nkw++] = v;
}

/* Evaluates call arguments n->kid[from..]. */
static void eval_args(qcj_ctx *c, const qcj_node *n, uint32_t from, qcj_scope *sc, argbuf *a)
{
    for (uint32_t i = from; i < n->nkid; i++) {
        const qcj_node *k = n->kid[i];
        if (k->k == N_KWARG) {
            push_kw(c, a, k->s, eval(c, k->kid[0], sc));
        } else if (k->k == N_STARARGS) {
            qcj_val v = eval(c, k->kid[0], sc);
            const qcj_val *items;
            size_t cnt;
            qcj_iter(c, k, v, &items, &cnt);
            for (size_t j = 0; j < cnt; j++) push_pos(c, a, items[j]);
        } else if (k->k == N_STARKW) {
            qcj_val v = eval(c, k->kid[0], sc);
            if (v.t != QV_DICT)
                qcj_fail(c, QERR_INVAL, k->line, "argument after ** must be a mapping, not %s", qcj_type_name(v));
            for (size_t j = 0; j < v.u.d->n; j++) {
                if (v.u.d->k[j].t != QV_STR) qcj_fail(c, QERR_INVAL, k->line, "keywords must be strings");
                push_kw(c, a, v.u.d->k[j].u.s->s, v.u.d->v[j]);
            }
        } else {
            push_pos(c, a, eval(c, k, sc));
        }
    }
}

static qcj_args as_args(const argbuf *b)
{
    qcj_args a = { b->pos, b->npos, b->kwn, b->kwv, b->nkw };
    return a;
}

static void assign(qcj_ctx *c, const qcj_node *t, qcj_val v, qcj_scope *sc);

/* Renders body in scope sc into a fresh buffer; returns it as a string.
 * *sig (may be NULL) receives a break/continue that left the body early:
 * set and filter blocks are inline code in jinja2, so a {% break %} inside
 * one ends the enclosing loop and the block's result is dropped. */
static qcj_val capture(qcj_ctx *c, const qcj_node *body, qcj_scope *sc, int *sig)
{
    qcj_buf buf = { 0 }, *saved = c->out;
    c->out = &buf;
    int s = exec(c, body, sc);
    c->out = saved;
    if (sig) *sig = s;
    return qcj_strv(c, buf.p ? buf.p : "", buf.n);
}

static qcj_val call_macro(qcj_ctx *c, const qcj_node *at, const qcj_func *f, const qcj_args *a, qcj_val caller)
{
    const qcj_node *m = f->node;
    int is_macro = f->kind == QF_MACRO;
    const char *mname = is_macro ? m->s : "caller";
    const qcj_node *body = is_macro ? m->kid[0] : m->kid[1];
    uint32_t first = is_macro ? 1 : 2, np = m->nkid - first;
    int flags = m->op;
    if (++c->mdepth > c->max_mdepth) qcj_fail(c, QERR_LIMIT, lineof(at), "macro recursion limit exceeded");
    qcj_tick(c, at);
    qcj_scope *sc = scope_new(c, f->scope);
    uint8_t *set = qcj_alloc(c, np + 1);
    memset(set, 0, np + 1);
    qcj_list *varargs = qcj_list_new(c, QL_TUPLE, 0);
    qcj_dict *kwargs = qcj_dict_new(c);
    for (size_t i = 0; i < a->npos; i++) {
        if (i < np) {
            scope_set(c, sc, m->kid[first + i]->s, m->kid[first + i]->slen, a->pos[i]);
            set[i] = 1;
        } else if (flags & MF_VARARGS) {
            qcj_list_push(c, varargs, a->pos[i]);
        } else {
            qcj_fail(c, QERR_INVAL, lineof(at), "macro '%s' takes not more than %u argument(s)", mname, np);
        }
    }
    for (size_t i = 0; i < a->nkw; i++) {
        uint32_t j;
        for (j = 0; j < np; j++)
            if (!strcmp(m->kid[first + j]->s, a->kwn[i])) break;
        if (j < np) {
            if (set[j]) qcj_fail(c, QERR_INVAL, lineof(at), "macro '%s' got multiple values for argument '%s'", mname, a->kwn[i]);
            scope_set(c, sc, m->kid[first + j]->s, m->kid[first + j]->slen, a->kwv[i]);
            set[j] = 1;
        } else if (flags & MF_KWARGS) {
            qcj_dict_set(c, at, kwargs, qcj_cstrv(c, a->kwn[i]), a->kwv[i]);
        } else {
            qcj_fail(c, QERR_INVAL, lineof(at), "macro '%s' takes no keyword argument '%s'", mname, a->kwn[i]);
        }
    }
    for (uint32_t j = 0; j < np; j++) {
        if (set[j]) continue;
        const qcj_node *p = m->kid[first + j];
        qcj_val v;
        if (p->kid[0]) {
            v = eval(c, p->kid[0], sc);
        } else {
            char *h = qcj_alloc(c, p->slen + 40);
            snprintf(h, p->slen + 40, "parameter '%s' was not provided", p->s);
            v = qcj_undef_hint(c, h, 0);
        }
        scope_set(c, sc, p->s, p->slen, v);
    }
    if (flags & MF_VARARGS) scope_set(c, sc, "varargs", 7, qcj_listv(varargs));
    if (flags & MF_KWARGS) {
        qcj_val kv = { .t = QV_DICT };
        kv.u.d = kwargs;
        scope_set(c, sc, "kwargs", 6, kv);
    }
    if (caller.t != QV_MISSING) {
        if (!(flags & MF_CALLER)) qcj_fail(c, QERR_INVAL, lineof(at), "macro '%s' takes no keyword argument 'caller'", mname);
        scope_set(c, sc, "caller", 6, caller);
    } else if (flags & MF_CALLER) {
        scope_set(c, sc, "caller", 6, qcj_undef_hint(c, "No caller defined", 0));
    }
    qcj_val out = capture(c, body, sc, NULL);
    c->mdepth--;
    return out;
}

static qcj_val run_for(qcj_ctx *c, const qcj_node *n, qcj_scope *sc, qcj_val iterable, int depth0);

static qcj_val call_value(qcj_ctx *c, const qcj_node *at, qcj_val fn, const qcj_args *a, qcj_val caller)
{
    if (fn.t == QV_UNDEF) qcj_fail_undef(c, lineof(at), fn);
    if (fn.t == QV_LOOP) {
        const qcj_loop *lp = fn.u.lp;
        if (!lp->node->op)
            qcj_fail(c, QERR_INVAL, lineof(at), "Tried to call non recursive loop.  Maybe you forgot the 'recursive' modifier.");
        if (a->npos != 1 || a->nkw) qcj_fail(c, QERR_INVAL, lineof(at), "loop() takes exactly one argument");
        if (++c->mdepth > c->max_mdepth) qcj_fail(c, QERR_LIMIT, lineof(at), "recursive loop depth limit exceeded");
        qcj_buf buf = { 0 }, *saved = c->out;
        c->out = &buf;
        run_for(c, lp->node, lp->scope, a->pos[0], lp->depth0 + 1);
        c->out = saved;
        c->mdepth--;
        return qcj_strv(c, buf.p ? buf.p : "", buf.n);
    }
    if (fn.t != QV_FUNC) qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object is not callable", qcj_type_name(fn));
    const qcj_func *f = fn.u.fn;
    switch (f->kind) {
    case QF_MACRO:
    case QF_CALLER: return call_macro(c, at, f, a, caller);
    case QF_METHOD:
        if (f->self.t == QV_STR && f->self.markup) return qcj_markup_method(c, at, f->b, f->self, a);
        return f->b->fn(c, at, f->self, a);
    case QF_GLOBAL: return f->b->fn(c, at, fn, a);
    case QF_JOINER:
        if (!fn.u.fn->pos) {
            fn.u.fn->pos = 1;
            return qcj_strv(c, "", 0);
        }
        return fn.u.fn->state;
    default: qcj_fail(c, QERR_INVAL, lineof(at), "'%s' object is not callable", qcj_type_name(fn));
    }
}

qcj_val qcj_call(qcj_ctx *c, const qcj_node *at, qcj_val fn, const qcj_args *a)
{
    return call_value(c, at, fn, a, qcj_missing());
}

static qcj_val apply_builtin(qcj_ctx *c, const qcj_node *n, const qcj_builtin *b, const char *kind, qcj_val v,
                             const qcj_args *a)
{
    if (!b && n->op) qcj_fail(c, QERR_INVAL, lineof(n), "No %s named '%s' found.", kind, n->s);
    if (!b) qcj_fail(c, QERR_UNSUPPORTED, lineof(n), "the %s '%s' is not supported", kind, n->s);
    return b->fn(c, n, v, a);
}

/* Applies the one filter of node n to v. */
static qcj_val apply_filter_node(qcj_ctx *c, const qcj_node *n, qcj_val v, qcj_scope *sc)
{
    argbuf ab = { 0 };
    eval_args(c, n, 1, sc, &ab);
    qcj_args a = as_args(&ab);
    return apply_builtin(c, n, n->b, "filter", v, &a);
}

/* Applies a block filter chain ({% filter a|b %}, {% set x | a %}): the
 * innermost N_FILTER has no value child. */
static qcj_val filter_chain(qcj_ctx *c, const qcj_node *n, qcj_val v, qcj_scope *sc)
{
    if (n->kid[0]) v = filter_chain(c, n->kid[0], v, sc);
    return apply_filter_node(c, n, v, sc);
}

qcj_val qcj_apply_filter(qcj_ctx *c, const qcj_node *at, const char *name, qcj_val v, const qcj_args *a)
{
    int known = 0;
    const qcj_builtin *b = qcj_find_filter(name, &known);
    if (!b) qcj_fail(c, known ? QERR_UNSUPPORTED : QERR_INVAL, lineof(at), known ? "the filter '%s' is not supported" : "No filter named '%s'.", name);
    return b->fn(c, at, v, a);
}

int qcj_apply_test(qcj_ctx *c, const qcj_node *at, const char *name, qcj_val v, const qcj_args *a)
{
    int known = 0;
    const qcj_builtin *b = qcj_find_test(name, &known);
    if (!b) qcj_fail(c, known ? QERR_UNSUPPORTED : QERR_INVAL, lineof(at), known ? "the test '%s' is not supported" : "No test named '%s'.", name);
    return qcj_truthy(b->fn(c, at, v, a));
}

/* ---- expressions -------------------------------------------------------------------- */

static qcj_val eval_inner(qcj_ctx *c, const qcj_node *n, qcj_scope *sc)
{
    switch (n->k) {
    case N_CONST: return n->val;
    case N_NAME: {
        qcj_val v;
        if (scope_find(sc, n->s, n->slen, &v)) return v;
        return qcj_undef_name(c, n->s);
    }
    case N_GETATTR: return qcj_getattr(c, n, eval(c, n->kid[0], sc), n->s, n->slen);
    case N_GETITEM: {
        qcj_val obj = eval(c, n->kid[0], sc);
        if (n->kid[1]->k == N_SLICE) return do_slice(c, n->kid[1], obj, sc, n->op);
        return qcj_getitem(c, n, obj, eval(c, n->kid[1], sc));
    }
    case N_CALL: {
        qcj_val fn = eval(c, n->kid[0], sc);
        argbuf ab = { 0 };
        eval_args(c, n, 1, sc, &ab);
        qcj_args a = as_args(&ab);
        return call_value(c, n, fn, &a, qcj_missing());
    }
    case N_FILTER: return apply_filter_node(c, n, eval(c, n->kid[0], sc), sc);
    case N_TEST: {
        qcj_val v = eval(c, n->kid[0], sc);
        argbuf ab = { 0 };
        eval_args(c, n, 1, sc, &ab);
        qcj_args a = as_args(&ab);
        return qcj_bool(qcj_truthy(apply_builtin(c, n, n->b, "test", v, &a)));
    }
    case N_NOT: return qcj_bool(!qcj_truthy(eval(c, n->kid[0], sc)));
    case N_NEG:
    case N_POS: {
        qcj_val v = eval(c, n->kid[0], sc);
        if (v.t == QV_UNDEF) qcj_fail_undef(c, n->line, v);
        if (v.t == QV_FLOAT) return n->k == N_NEG ? qcj_float(-v.u.f) : v;
        if (v.t == QV_INT || v.t == QV_BOOL) {
            if (n->k == N_POS) return qcj_int(v.u.i);
            if (v.u.i == INT64_MIN) qcj_fail(c, QERR_INVAL, n->line, "integer overflow");
            return qcj_int(-v.u.i);
        }
        qcj_fail(c, QERR_INVAL, n->line, "bad operand type for unary %c: '%s'", n->k == N_NEG ? '-' : '+', qcj_type_name(v));
    }
    case N_BIN: {
        qcj_val a = eval(c, n->kid[0], sc);
        qcj_val b = eval(c, n->kid[1], sc);
        return qcj_binop(c, n, n->op, a, b);
    }
    case N_AND: {
        qcj_val a = eval(c, n->kid[0], sc);
        return qcj_truthy(a) ? eval(c, n->kid[1], sc) : a;
    }
    case N_OR: {
        qcj_val a = eval(c, n->kid[0], sc);
        return qcj_truthy(a) ? a : eval(c, n->kid[1], sc);
    }
    case N_CONCAT: {
        qcj_buf b = { 0 };
        for (uint32_t i = 0; i < n->nkid; i++) qcj_write_str(c, &b, eval(c, n->kid[i], sc));
        return qcj_strv(c, b.p ? b.p : "", b.n);
    }
    case N_COMPARE: {
        qcj_val left = eval(c, n->kid[0], sc);
        for (uint32_t i = 1; i < n->nkid; i++) {
            const qcj_node *o = n->kid[i];
            qcj_val right = eval(c, o->kid[0], sc);
            if (!qcj_truthy(compare(c, o, o->op, left, right))) return qcj_bool(0);
            left = right;
        }
        return qcj_bool(1);
    }
    case N_COND:
        if (qcj_truthy(eval(c, n->kid[0], sc))) return eval(c, n->kid[1], sc);
        if (n->kid[2]) return eval(c, n->kid[2], sc);
        {
            char *h = qcj_alloc(c, 128);
            snprintf(h, 128, "the inline if-expression on line %d evaluated to false and no else section was defined.", n->line);
            return qcj_undef_hint(c, h, 0);
        }
    case N_LIST:
    case N_TUPLE: {
        qcj_list *l = qcj_list_new(c, n->k == N_LIST ? QL_LIST : QL_TUPLE, n->nkid);
        for (uint32_t i = 0; i < n->nkid; i++) l->v[i] = eval(c, n->kid[i], sc);
        l->n = n->nkid;
        return qcj_listv(l);
    }
    case N_DICT: {
        qcj_dict *d = qcj_dict_new(c);
        for (uint32_t i = 0; i + 1 < n->nkid; i += 2) {
            qcj_val k = eval(c, n->kid[i], sc);
            qcj_dict_set(c, n->kid[i], d, k, eval(c, n->kid[i + 1], sc));
        }
        qcj_val v = { .t = QV_DICT };
        v.u.d = d;
        return v;
    }
    default: qcj_fail(c, QERR_INTERNAL, n->line, "cannot evaluate this expression");
    }
}

static qcj_val eval(qcj_ctx *c, const qcj_node *n, qcj_scope *sc)
{
    enter(c, n);
    qcj_val v = eval_inner(c, n, sc);
    c->depth--;
    return v;
}

/* ---- statements ------------------------------------------------------------------------ */

static void assign(qcj_ctx *c, const qcj_node *t, qcj_val v, qcj_scope *sc)
{
    if (t->k == N_NAME) {
        scope_set(c, sc, t->s, t->slen, v);
    } else if (t->k == N_NSREF) {
        qcj_val ns;
        if (!scope_find(sc, t->s, t->slen, &ns) || ns.t != QV_NS)
            qcj_fail(c, QERR_INVAL, t->line, "cannot assign attribute on non-namespace object");
        qcj_dict_set(c, t, ns.u.d, t->val, v);
    } else {
        const qcj_val *items;
        size_t n;
        if (v.t != QV_LIST && v.t != QV_DICT && v.t != QV_STR && v.t != QV_UNDEF)
            qcj_fail(c, QERR_INVAL, t->line, "cannot unpack non-iterable %s object", qcj_type_name(v));
        qcj_iter(c, t, v, &items, &n);
        if (n < t->nkid)
            qcj_fail(c, QERR_INVAL, t->line, "not enough values to unpack (expected %u, got %zu)", t->nkid, n);
        if (n > t->nkid) qcj_fail(c, QERR_INVAL, t->line, "too many values to unpack (expected %u)", t->nkid);
        for (uint32_t i = 0; i < t->nkid; i++) assign(c, t->kid[i], items[i], sc);
    }
}

static qcj_val run_for(qcj_ctx *c, const qcj_node *n, qcj_scope *sc, qcj_val iterable, int depth0)
{
    const qcj_val *items;
    size_t cnt;
    qcj_iter(c, n, iterable, &items, &cnt);
    qcj_scope *frame = scope_new(c, sc);
    if (n->kid[2]) {
        /* the loop filter sees the target, not `loop` */
        qcj_val *kept = qcj_allocn(c, cnt ? cnt : 1, sizeof *kept);
        size_t k = 0;
        for (size_t i = 0; i < cnt; i++) {
            qcj_tick(c, n);
            frame->n = 0;
            assign(c, n->kid[0], items[i], frame);
            if (qcj_truthy(eval(c, n->kid[2], frame))) kept[k++] = items[i];
        }
        items = kept;
        cnt = k;
    }
    qcj_loop *lp = qcj_alloc(c, sizeof *lp);
    memset(lp, 0, sizeof *lp);
    lp->items = items;
    lp->n = cnt;
    lp->depth0 = depth0;
    lp->node = n;
    lp->scope = sc;
    qcj_val lv = { .t = QV_LOOP };
    lv.u.lp = lp;
    /* jinja2 runs the else block unless some iteration reached the end of
     * the body: an empty loop, but also one whose every iteration ended in
     * break or continue (its generated code clears the flag at the end of
     * the body). */
    int completed = 0;
    for (size_t i = 0; i < cnt; i++) {
        qcj_tick(c, n);
        lp->i = i;
        /* A fresh scope per iteration, reusing the frame's storage.  A macro
         * defined inside a loop body keeps this frame and so sees the last
         * iteration's values, a corner jinja2 handles differently. */
        frame->n = 0;
        assign(c, n->kid[0], items[i], frame);
        scope_set(c, frame, "loop", 4, lv);
        int sig = exec(c, n->kid[3], frame);
        if (sig == SIG_NONE) completed = 1;
        if (sig == SIG_BREAK) break;
    }
    if (!completed && n->kid[4]) exec(c, n->kid[4], scope_new(c, sc));
    return qcj_none();
}

static int exec_inner(qcj_ctx *c, const qcj_node *n, qcj_scope *sc)
{
    switch (n->k) {
    case N_BODY:
        for (uint32_t i = 0; i < n->nkid; i++) {
            int sig = exec(c, n->kid[i], sc);
            if (sig) return sig;
        }
        return SIG_NONE;
    case N_DATA: qcj_buf_put(c, c->out, n->s, n->slen); return SIG_NONE;
    case N_OUTPUT: qcj_write_str(c, c->out, eval(c, n->kid[0], sc)); return SIG_NONE;
    case N_IF:
        if (qcj_truthy(eval(c, n->kid[0], sc))) return exec(c, n->kid[1], sc);
        return n->kid[2] ? exec(c, n->kid[2], sc) : SIG_NONE;
    case N_FOR: run_for(c, n, sc, eval(c, n->kid[1], sc), 0); return SIG_NONE;
    case N_SET:
        if (n->kid[0]->k == N_NSREF) {
            /* jinja2 checks the namespace before evaluating the value */
            qcj_val ns;
            if (!scope_find(sc, n->kid[0]->s, n->kid[0]->slen, &ns) || ns.t != QV_NS)
                qcj_fail(c, QERR_INVAL, n->line, "cannot assign attribute on non-namespace object");
        }
        assign(c, n->kid[0], eval(c, n->kid[1], sc), sc);
        return SIG_NONE;
    case N_SETBLOCK: {
        int sig;
        qcj_val v = capture(c, n->kid[2], scope_new(c, sc), &sig);
        if (sig) return sig;
        if (n->kid[1]) v = filter_chain(c, n->kid[1], v, sc);
        assign(c, n->kid[0], v, sc);
        return SIG_NONE;
    }
    case N_MACRO: {
        qcj_func *f = qcj_alloc(c, sizeof *f);
        memset(f, 0, sizeof *f);
        f->kind = QF_MACRO;
        f->node = n;
        f->scope = sc;
        qcj_val v = { .t = QV_FUNC };
        v.u.fn = f;
        scope_set(c, sc, n->s, n->slen, v);
        return SIG_NONE;
    }
    case N_CALLBLOCK: {
        qcj_func *f = qcj_alloc(c, sizeof *f);
        memset(f, 0, sizeof *f);
        f->kind = QF_CALLER;
        f->node = n;
        f->scope = sc;
        qcj_val caller = { .t = QV_FUNC };
        caller.u.fn = f;
        const qcj_node *call = n->kid[0];
        qcj_val fn = eval(c, call->kid[0], sc);
        argbuf ab = { 0 };
        eval_args(c, call, 1, sc, &ab);
        qcj_args a = as_args(&ab);
        if (fn.t == QV_FUNC && fn.u.fn->kind == QF_MACRO) {
            qcj_write_str(c, c->out, call_value(c, call, fn, &a, caller));
        } else {
            push_kw(c, &ab, "caller", caller);
            a = as_args(&ab);
            qcj_write_str(c, c->out, call_value(c, call, fn, &a, qcj_missing()));
        }
        return SIG_NONE;
    }
    case N_FILTERBLOCK: {
        int sig;
        qcj_val v = capture(c, n->kid[1], scope_new(c, sc), &sig);
        if (sig) return sig;
        qcj_write_str(c, c->out, filter_chain(c, n->kid[0], v, sc));
        return SIG_NONE;
    }
    case N_WITH: {
        qcj_scope *inner = scope_new(c, sc);
        for (uint32_t i = 1; i + 1 < n->nkid; i += 2) assign(c, n->kid[i], eval(c, n->kid[i + 1], sc), inner);
        return exec(c, n->kid[0], inner);
    }
    case N_BREAK: return SIG_BREAK;
    case N_CONTINUE: return SIG_CONTINUE;
    case N_UNSUPPORTED: qcj_fail(c, QERR_UNSUPPORTED, n->line, "%s", n->s);
    default: qcj_fail(c, QERR_INTERNAL, n->line, "cannot execute this statement");
    }
}

static int exec(qcj_ctx *c, const qcj_node *n, qcj_scope *sc)
{
    enter(c, n);
    int sig = exec_inner(c, n, sc);
    c->depth--;
    return sig;
}

void qcj_exec_template(qcj_ctx *c, const qcj_node *body, qcj_scope *root)
{
    exec(c, body, root);
}
