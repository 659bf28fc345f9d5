/* chat_parse.c - tokens to a syntax tree, following jinja2/parser.py.
 *
 * A recursive-descent parser with jinja2's grammar and precedence, lowest
 * first:
 *
 *     condexpr   or ("if" or ("else" condexpr)?)*
 *     or         and ("or" and)*
 *     and        not ("and" not)*
 *     not        "not" not | compare
 *     compare    math1 (("=="|"!="|"<"|"<="|">"|">="|"in"|"not in") math1)*
 *     math1      concat (("+"|"-") concat)*
 *     concat     math2 ("~" math2)*
 *     math2      pow (("*"|"/"|"//"|"%") pow)*
 *     pow        unary ("**" unary)*          (left-associative, as jinja2)
 *     unary      ("-"|"+") unary-without-filters | primary postfix filters
 *     filters    ("|" name args? | "is" "not"? name arg? | call)*
 *
 * so `a + b|trim` is `a + (b|trim)` and `not x is defined` is
 * `not (x is defined)`.  Statements are the tags jinja2 knows plus the two of
 * the loopcontrols extension (break, continue) and HF's {% generation %}
 * (rendered as its body in a scope of its own, which is all HF does outside
 * assistant masks).
 * Templates cannot load other templates (HF gives jinja2 no loader): include,
 * import, from and extends parse and fail when executed, as in jinja2.
 *
 * Tree layout per node kind (qcj_node.kid):
 *   N_BODY        statements...
 *   N_DATA        s/slen = text
 *   N_OUTPUT      [0] expression to print
 *   N_IF          [0] test, [1] body, [2] else: N_BODY, N_IF (elif) or NULL
 *   N_FOR         [0] target, [1] iterable, [2] filter or NULL, [3] body,
 *                 [4] else or NULL; op = 1 when recursive
 *   N_SET         [0] target (N_NAME, N_NSREF, N_TUPLE), [1] value
 *   N_SETBLOCK    [0] target, [1] filter chain or NULL, [2] body
 *   N_MACRO       s = name, [0] body, [1..] N_PARAM; op = MF_* flags
 *   N_CALLBLOCK   [0] N_CALL, [1] body, [2..] N_PARAM; op = MF_* flags
 *   N_FILTERBLOCK [0] filter chain, [1] body
 *   N_WITH        [0] body, then target, value pairs
 *   N_UNSUPPORTED s = message raised when executed
 *   N_PARAM       s = name, [0] default or NULL
 *   N_NSREF       s = namespace variable, val = attribute name (string)
 *   N_GETATTR     [0] object, s = attribute
 *   N_GETITEM     [0] object, [1] key or N_SLICE; op = 1: lenient slice
 *   N_SLICE       [0] start, [1] stop, [2] step (each may be NULL)
 *   N_CALL        [0] callee, [1..] args: expression, N_KWARG (s = name,
 *                 [0] value), N_STARARGS [0], N_STARKW [0]
 *   N_FILTER      [0] value (NULL at the head of a block filter), s = name,
 *                 b = builtin (NULL: not implemented; op = 1 when jinja2 does
 *                 not know it either), [1..] args
 *   N_TEST        as N_FILTER
 *   N_COMPARE     [0] first operand, [1..] N_CMPOP (op, [0] operand)
 *   N_COND        [0] test, [1] value, [2] else value or NULL
 *   N_BIN         op, [0], [1];  N_AND, N_OR [0], [1];  N_NOT, N_NEG, N_POS [0]
 *   N_CONCAT, N_LIST, N_TUPLE  items;  N_DICT  key, value, key, value...
 *
 * Unknown filters and tests fail at compile time ("No filter named 'x'."),
 * as in jinja2, except inside if statements and inline ifs, where jinja2
 * defers the error to the moment the filter runs.  The same pass marks
 * slices of constants that jinja2's constant folding evaluates leniently
 * (`none[1:]` prints "" but `x[1:]` with x = None fails); the rule here
 * approximates jinja2's optimizer, which only matters for templates that
 * slice constants that are not sequences.  Nesting is bounded (QCJ_MAX_NEST statements,
 * QCJ_MAX_EXPR_DEPTH expression levels) so hostile input cannot exhaust
 * the C stack.
 */
#include "chat_int.h"
#include "qerr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define QCJ_MAX_NEST 100
#define QCJ_MAX_EXPR_DEPTH 200

typedef struct {
    qcj_ctx *c;
    const qcj_tok *t;
    size_t n, i;
    int depth;
    int loop_depth;
    const char *tags[QCJ_MAX_NEST + 1];
    int ntags;
    const char *const *ends[QCJ_MAX_NEST + 1];
    int nends;
    const qcj_node *stray; /* first break/continue outside a loop */
} parser;

typedef struct {
    qcj_node **v;
    uint32_t n, cap;
} kvec;

static const qcj_tok *cur(const parser *P) { return &P->t[P->i]; }
static const qcj_tok *look(const parser *P) { return &P->t[P->i + 1 < P->n ? P->i + 1 : P->i]; }
static const qcj_tok *next(parser *P)
{
    const qcj_tok *t = cur(P);
    if (P->i + 1 < P->n) P->i++;
    return t;
}

static _Noreturn void pfail(parser *P, const qcj_tok *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static _Noreturn void pfail(parser *P, const qcj_tok *at, const char *fmt, ...)
{
    char m[QCJ_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    qcj_fail(P->c, QERR_FORMAT, 0, "line %d, col %d: %s", at->line, at->col, m);
}

static int is_name(const qcj_tok *t, const char *name) { return t->t == T_NAME && !strcmp(t->s, name); }
static int is_op(const qcj_tok *t, int op) { return t->t == T_OP && t->op == op; }

static int skip_name(parser *P, const char *name)
{
    if (!is_name(cur(P), name)) return 0;
    next(P);
    return 1;
}

static int skip_op(parser *P, int op)
{
    if (!is_op(cur(P), op)) return 0;
    next(P);
    return 1;
}

static _Noreturn void expect_fail(parser *P, const char *what)
{
    const qcj_tok *t = cur(P);
    char b[64];
    if (t->t == T_EOF) pfail(P, t, "unexpected end of template, expected '%s'.", what);
    pfail(P, t, "expected token '%s', got '%s'", what, qcj_tok_desc(t, b, sizeof b));
}

static const qcj_tok *expect_op(parser *P, int op, const char *what)
{
    if (!is_op(cur(P), op)) expect_fail(P, what);
    return next(P);
}

static const qcj_tok *expect_type(parser *P, int type, const char *what)
{
    if (cur(P)->t != type) expect_fail(P, what);
    return next(P);
}

static void expect_name(parser *P, const char *name)
{
    if (!is_name(cur(P), name)) expect_fail(P, name);
    next(P);
}

static qcj_node *mk(parser *P, int kind, const qcj_tok *at)
{
    qcj_node *n = qcj_alloc(P->c, sizeof *n);
    memset(n, 0, sizeof *n);
    n->k = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static void kpush(parser *P, kvec *v, qcj_node *n)
{
    if (v->n == v->cap) {
        uint32_t nc = v->cap ? v->cap * 2 : 4;
        qcj_node **nv = qcj_allocn(P->c, nc, sizeof *nv);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = n;
}

static void set_kids(qcj_node *n, const kvec *v)
{
    n->kid = v->v;
    n->nkid = v->n;
}

static qcj_node *mk_kids(parser *P, int kind, const qcj_tok *at, int nk)
{
    qcj_node *n = mk(P, kind, at);
    n->kid = qcj_allocn(P->c, (size_t)nk, sizeof *n->kid);
    memset(n->kid, 0, (size_t)nk * sizeof *n->kid);
    n->nkid = (uint32_t)nk;
    return n;
}

static qcj_node *mk1(parser *P, int kind, const qcj_tok *at, qcj_node *a)
{
    qcj_node *n = mk_kids(P, kind, at, 1);
    n->kid[0] = a;
    return n;
}

static qcj_node *mk2(parser *P, int kind, const qcj_tok *at, qcj_node *a, qcj_node *b)
{
    qcj_node *n = mk_kids(P, kind, at, 2);
    n->kid[0] = a;
    n->kid[1] = b;
    return n;
}

static void enter(parser *P)
{
    if (++P->depth > QCJ_MAX_EXPR_DEPTH) pfail(P, cur(P), "expression nested too deeply");
}

/* ---- expressions ---------------------------------------------------------- */

static qcj_node *parse_expression(parser *P, int with_condexpr);
static qcj_node *parse_tuple(parser *P, int simplified, int with_condexpr, const char *const *extra_end,
                             int explicit_parens, int with_namespace);
static qcj_node *parse_unary(parser *P, int with_filter);
static qcj_node *parse_primary(parser *P, int with_namespace);
static qcj_node *parse_postfix(parser *P, qcj_node *node);
static qcj_node *parse_or(parser *P);

static qcj_node *parse_condexpr(parser *P)
{
    const qcj_tok *at = cur(P);
    qcj_node *e1 = parse_or(P);
    while (skip_name(P, "if")) {
        qcj_node *e2 = parse_or(P);
        qcj_node *e3 = NULL;
        if (skip_name(P, "else")) {
            enter(P);
            e3 = parse_condexpr(P);
            P->depth--;
        }
        qcj_node *n = mk_kids(P, N_COND, at, 3);
        n->kid[0] = e2;
        n->kid[1] = e1;
        n->kid[2] = e3;
        e1 = n;
        at = cur(P);
    }
    return e1;
}

static qcj_node *parse_not(parser *P);

static qcj_node *parse_and(parser *P)
{
    qcj_node *left = parse_not(P);
    for (;;) {
        const qcj_tok *at = cur(P);
        if (!skip_name(P, "and")) return left;
        left = mk2(P, N_AND, at, left, parse_not(P));
    }
}

static qcj_node *parse_or(parser *P)
{
    qcj_node *left = parse_and(P);
    for (;;) {
        const qcj_tok *at = cur(P);
        if (!skip_name(P, "or")) return left;
        left = mk2(P, N_OR, at, left, parse_and(P));
    }
}

static qcj_node *parse_math1(parser *P);

static qcj_node *parse_compare(parser *P)
{
    const qcj_tok *at = cur(P);
    qcj_node *expr = parse_math1(P);
    kvec ops = { 0 };
    for (;;) {
        const qcj_tok *t = cur(P);
        int op = -1;
        if (t->t == T_OP) {
            switch (t->op) {
            case TK_EQ: op = OP_EQ; break;
            case TK_NE: op = OP_NE; break;
            case TK_LT: op = OP_LT; break;
            case TK_LTEQ: op = OP_LE; break;
            case TK_GT: op = OP_GT; break;
            case TK_GTEQ: op = OP_GE; break;
            default: break;
            }
            if (op >= 0) next(P);
        } else if (is_name(t, "in")) {
            next(P);
            op = OP_IN;
        } else if (is_name(t, "not") && is_name(look(P), "in")) {
            next(P);
            next(P);
            op = OP_NOTIN;
        }
        if (op < 0) break;
        qcj_node *o = mk1(P, N_CMPOP, t, parse_math1(P));
        o->op = (uint8_t)op;
        kpush(P, &ops, o);
    }
    if (!ops.n) return expr;
    qcj_node *n = mk(P, N_COMPARE, at);
    kvec all = { 0 };
    kpush(P, &all, expr);
    for (uint32_t i = 0; i < ops.n; i++) kpush(P, &all, ops.v[i]);
    set_kids(n, &all);
    return n;
}

static qcj_node *parse_not(parser *P)
{
    const qcj_tok *at = cur(P);
    if (skip_name(P, "not")) {
        enter(P);
        qcj_node *n = mk1(P, N_NOT, at, parse_not(P));
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static qcj_node *parse_pow(parser *P)
{
    qcj_node *left = parse_unary(P, 1);
    for (;;) {
        const qcj_tok *at = cur(P);
        if (!skip_op(P, TK_POW)) return left;
        qcj_node *n = mk2(P, N_BIN, at, left, parse_unary(P, 1));
        n->op = OP_POW;
        left = n;
    }
}

static qcj_node *parse_math2(parser *P)
{
    qcj_node *left = parse_pow(P);
    for (;;) {
        const qcj_tok *t = cur(P);
        int op = -1;
        if (t->t == T_OP) {
            switch (t->op) {
            case TK_MUL: op = OP_MUL; break;
            case TK_DIV: op = OP_DIV; break;
            case TK_FLOORDIV: op = OP_FLOORDIV; break;
            case TK_MOD: op = OP_MOD; break;
            default: break;
            }
        }
        if (op < 0) return left;
        next(P);
        qcj_node *n = mk2(P, N_BIN, t, left, parse_pow(P));
        n->op = (uint8_t)op;
        left = n;
    }
}

static qcj_node *parse_concat(parser *P)
{
    const qcj_tok *at = cur(P);
    qcj_node *first = parse_math2(P);
    if (!is_op(cur(P), TK_TILDE)) return first;
    kvec v = { 0 };
    kpush(P, &v, first);
    while (skip_op(P, TK_TILDE)) kpush(P, &v, parse_math2(P));
    qcj_node *n = mk(P, N_CONCAT, at);
    set_kids(n, &v);
    return n;
}

static qcj_node *parse_math1(parser *P)
{
    qcj_node *left = parse_concat(P);
    for (;;) {
        const qcj_tok *t = cur(P);
        if (!is_op(t, TK_ADD) && !is_op(t, TK_SUB)) return left;
        next(P);
        qcj_node *n = mk2(P, N_BIN, t, left, parse_concat(P));
        n->op = t->op == TK_ADD ? OP_ADD : OP_SUB;
        left = n;
    }
}

/* Parses "(args)" into kids of n after index `from` (already pushed). */
static void parse_call_args(parser *P, kvec *v)
{
    const qcj_tok *lp = expect_op(P, TK_LPAREN, "(");
    int require_comma = 0, have_kw = 0, have_dyn = 0, have_dynkw = 0;
    while (!is_op(cur(P), TK_RPAREN)) {
        if (require_comma) {
            expect_op(P, TK_COMMA, ",");
            if (is_op(cur(P), TK_RPAREN)) break;
        }
        const qcj_tok *t = cur(P);
        if (is_op(t, TK_MUL)) {
            if (have_dyn || have_dynkw) pfail(P, lp, "invalid syntax for function call expression");
            next(P);
            kpush(P, v, mk1(P, N_STARARGS, t, parse_expression(P, 1)));
            have_dyn = 1;
        } else if (is_op(t, TK_POW)) {
            if (have_dynkw) pfail(P, lp, "invalid syntax for function call expression");
            next(P);
            kpush(P, v, mk1(P, N_STARKW, t, parse_expression(P, 1)));
            have_dynkw = 1;
        } else if (t->t == T_NAME && is_op(look(P), TK_ASSIGN)) {
            if (have_dynkw) pfail(P, lp, "invalid syntax for function call expression");
            next(P);
            next(P);
            qcj_node *kw = mk1(P, N_KWARG, t, parse_expression(P, 1));
            kw->s = t->s;
            kw->slen = t->slen;
            kpush(P, v, kw);
            have_kw = 1;
        } else {
            if (have_dyn || have_dynkw || have_kw) pfail(P, lp, "invalid syntax for function call expression");
            kpush(P, v, parse_expression(P, 1));
        }
        require_comma = 1;
    }
    expect_op(P, TK_RPAREN, ")");
}

static qcj_node *parse_call(parser *P, qcj_node *callee)
{
    const qcj_tok *at = cur(P);
    kvec v = { 0 };
    kpush(P, &v, callee);
    parse_call_args(P, &v);
    qcj_node *n = mk(P, N_CALL, at);
    set_kids(n, &v);
    return n;
}

/* "name(.name)*" for filters and tests. */
static const char *dotted_name(parser *P, size_t *len)
{
    const qcj_tok *t = expect_type(P, T_NAME, "name");
    const char *name = t->s;
    size_t n = t->slen;
    while (is_op(cur(P), TK_DOT)) {
        next(P);
        const qcj_tok *u = expect_type(P, T_NAME, "name");
        char *joined = qcj_alloc(P->c, n + u->slen + 2);
        memcpy(joined, name, n);
        joined[n] = '.';
        memcpy(joined + n + 1, u->s, u->slen + 1);
        name = joined;
        n += u->slen + 1;
    }
    *len = n;
    return name;
}

static qcj_node *parse_filter(parser *P, qcj_node *node, int start_inline)
{
    while (is_op(cur(P), TK_PIPE) || start_inline) {
        if (!start_inline) next(P);
        const qcj_tok *at = cur(P);
        size_t len;
        const char *name = dotted_name(P, &len);
        kvec v = { 0 };
        kpush(P, &v, node);
        if (is_op(cur(P), TK_LPAREN)) parse_call_args(P, &v);
        qcj_node *f = mk(P, N_FILTER, at);
        set_kids(f, &v);
        f->s = name;
        f->slen = len;
        int known = 0;
        f->b = qcj_find_filter(name, &known);
        f->op = (uint8_t)(!f->b && !known); /* checked by check_stmt() */
        node = f;
        start_inline = 0;
    }
    return node;
}

static qcj_node *parse_test(parser *P, qcj_node *node)
{
    const qcj_tok *at = next(P); /* "is" */
    int negated = skip_name(P, "not");
    size_t len;
    const char *name = dotted_name(P, &len);
    kvec v = { 0 };
    kpush(P, &v, node);
    const qcj_tok *t = cur(P);
    if (is_op(t, TK_LPAREN)) {
        parse_call_args(P, &v);
    } else if ((t->t == T_NAME || t->t == T_STRING || t->t == T_INT || t->t == T_FLOAT || is_op(t, TK_LPAREN) ||
                is_op(t, TK_LBRACKET) || is_op(t, TK_LBRACE)) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
        if (is_name(t, "is")) pfail(P, t, "You cannot chain multiple tests with is");
        enter(P);
        qcj_node *arg = parse_postfix(P, parse_primary(P, 0));
        P->depth--;
        kpush(P, &v, arg);
    }
    qcj_node *n = mk(P, N_TEST, at);
    set_kids(n, &v);
    n->s = name;
    n->slen = len;
    int known = 0;
    n->b = qcj_find_test(name, &known);
    n->op = (uint8_t)(!n->b && !known); /* checked by check_stmt() */
    if (negated) n = mk1(P, N_NOT, at, n);
    return n;
}

static qcj_node *parse_filter_expr(parser *P, qcj_node *node)
{
    for (;;) {
        const qcj_tok *t = cur(P);
        if (is_op(t, TK_PIPE)) node = parse_filter(P, node, 0);
        else if (is_name(t, "is")) node = parse_test(P, node);
        else if (is_op(t, TK_LPAREN)) node = parse_call(P, node);
        else return node;
    }
}

static qcj_node *parse_subscribed(parser *P)
{
    const qcj_tok *at = cur(P);
    qcj_node *args[3] = { NULL, NULL, NULL };
    if (is_op(at, TK_COLON)) {
        next(P);
    } else {
        qcj_node *node = parse_expression(P, 1);
        if (!is_op(cur(P), TK_COLON)) return node;
        next(P);
        args[0] = node;
    }
    if (!is_op(cur(P), TK_COLON) && !is_op(cur(P), TK_RBRACKET) && !is_op(cur(P), TK_COMMA))
        args[1] = parse_expression(P, 1);
    if (is_op(cur(P), TK_COLON)) {
        next(P);
        if (!is_op(cur(P), TK_RBRACKET) && !is_op(cur(P), TK_COMMA)) args[2] = parse_expression(P, 1);
    }
    qcj_node *n = mk_kids(P, N_SLICE, at, 3);
    memcpy(n->kid, args, sizeof args);
    return n;
}

static qcj_node *parse_subscript(parser *P, qcj_node *node)
{
    const qcj_tok *t = next(P);
    if (is_op(t, TK_DOT)) {
        const qcj_tok *a = next(P);
        if (a->t == T_NAME) {
            qcj_node *n = mk1(P, N_GETATTR, t, node);
            n->s = a->s;
            n->slen = a->slen;
            return n;
        }
        if (a->t != T_INT) pfail(P, a, "expected name or number");
        qcj_node *k = mk(P, N_CONST, a);
        k->val = qcj_int(a->i);
        return mk2(P, N_GETITEM, t, node, k);
    }
    kvec v = { 0 };
    while (!is_op(cur(P), TK_RBRACKET)) {
        if (v.n) expect_op(P, TK_COMMA, ",");
        kpush(P, &v, parse_subscribed(P));
    }
    expect_op(P, TK_RBRACKET, "]");
    qcj_node *key;
    if (v.n == 1) {
        key = v.v[0];
    } else {
        key = mk(P, N_TUPLE, t);
        set_kids(key, &v);
    }
    return mk2(P, N_GETITEM, t, node, key);
}

static qcj_node *parse_postfix(parser *P, qcj_node *node)
{
    for (;;) {
        const qcj_tok *t = cur(P);
        if (is_op(t, TK_DOT) || is_op(t, TK_LBRACKET)) node = parse_subscript(P, node);
        else if (is_op(t, TK_LPAREN)) node = parse_call(P, node);
        else return node;
    }
}

static qcj_node *parse_unary(parser *P, int with_filter)
{
    const qcj_tok *t = cur(P);
    qcj_node *node;
    enter(P);
    if (is_op(t, TK_SUB) || is_op(t, TK_ADD)) {
        next(P);
        node = mk1(P, t->op == TK_SUB ? N_NEG : N_POS, t, parse_unary(P, 0));
    } else {
        node = parse_primary(P, 0);
    }
    node = parse_postfix(P, node);
    if (with_filter) node = parse_filter_expr(P, node);
    P->depth--;
    return node;
}

static qcj_node *parse_list(parser *P)
{
    const qcj_tok *at = expect_op(P, TK_LBRACKET, "[");
    kvec v = { 0 };
    while (!is_op(cur(P), TK_RBRACKET)) {
        if (v.n) expect_op(P, TK_COMMA, ",");
        if (is_op(cur(P), TK_RBRACKET)) break;
        kpush(P, &v, parse_expression(P, 1));
    }
    expect_op(P, TK_RBRACKET, "]");
    qcj_node *n = mk(P, N_LIST, at);
    set_kids(n, &v);
    return n;
}

static qcj_node *parse_dict(parser *P)
{
    const qcj_tok *at = expect_op(P, TK_LBRACE, "{");
    kvec v = { 0 };
    while (!is_op(cur(P), TK_RBRACE)) {
        if (v.n) expect_op(P, TK_COMMA, ",");
        if (is_op(cur(P), TK_RBRACE)) break;
        kpush(P, &v, parse_expression(P, 1));
        expect_op(P, TK_COLON, ":");
        kpush(P, &v, parse_expression(P, 1));
    }
    expect_op(P, TK_RBRACE, "}");
    qcj_node *n = mk(P, N_DICT, at);
    set_kids(n, &v);
    return n;
}

static qcj_node *parse_primary(parser *P, int with_namespace)
{
    const qcj_tok *t = cur(P);
    qcj_node *node;
    if (t->t == T_NAME) {
        next(P);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True") || !strcmp(t->s, "false") || !strcmp(t->s, "False")) {
            node = mk(P, N_CONST, t);
            node->val = qcj_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
            node = mk(P, N_CONST, t);
            node->val = qcj_none();
        } else if (with_namespace && is_op(cur(P), TK_DOT)) {
            next(P);
            const qcj_tok *a = expect_type(P, T_NAME, "name");
            node = mk(P, N_NSREF, t);
            node->s = t->s;
            node->slen = t->slen;
            node->val = qcj_strv(P->c, a->s, a->slen);
        } else {
            node = mk(P, N_NAME, t);
            node->s = t->s;
            node->slen = t->slen;
        }
    } else if (t->t == T_STRING) {
        next(P);
        node = mk(P, N_CONST, t);
        if (cur(P)->t != T_STRING) {
            node->val = qcj_strv(P->c, t->s, t->slen);
        } else {
            size_t total = t->slen;
            for (size_t j = P->i; P->t[j].t == T_STRING; j++) total += P->t[j].slen;
            char *buf = qcj_alloc(P->c, total + 1);
            memcpy(buf, t->s, t->slen);
            size_t k = t->slen;
            while (cur(P)->t == T_STRING) {
                const qcj_tok *u = next(P);
                memcpy(buf + k, u->s, u->slen);
                k += u->slen;
            }
            node->val = qcj_strv(P->c, buf, total);
        }
    } else if (t->t == T_INT || t->t == T_FLOAT) {
        next(P);
        node = mk(P, N_CONST, t);
        node->val = t->t == T_INT ? qcj_int(t->i) : qcj_float(t->f);
    } else if (is_op(t, TK_LPAREN)) {
        next(P);
        node = parse_tuple(P, 0, 1, NULL, 1, 0);
        expect_op(P, TK_RPAREN, ")");
    } else if (is_op(t, TK_LBRACKET)) {
        node = parse_list(P);
    } else if (is_op(t, TK_LBRACE)) {
        node = parse_dict(P);
    } else {
        char b[64];
        pfail(P, t, "unexpected '%s'", qcj_tok_desc(t, b, sizeof b));
    }
    return node;
}

static int is_tuple_end(parser *P, const char *const *extra_end)
{
    const qcj_tok *t = cur(P);
    if (t->t == T_VAR_END || t->t == T_BLOCK_END || is_op(t, TK_RPAREN)) return 1;
    for (; extra_end && *extra_end; extra_end++)
        if (is_name(t, *extra_end)) return 1;
    return 0;
}

static qcj_node *parse_tuple(parser *P, int simplified, int with_condexpr, const char *const *extra_end,
                             int explicit_parens, int with_namespace)
{
    const qcj_tok *at = cur(P);
    kvec v = { 0 };
    int is_tuple = 0;
    enter(P);
    for (;;) {
        if (v.n) expect_op(P, TK_COMMA, ",");
        if (is_tuple_end(P, extra_end)) break;
        kpush(P, &v, simplified ? parse_primary(P, with_namespace) : parse_expression(P, with_condexpr));
        if (is_op(cur(P), TK_COMMA)) is_tuple = 1;
        else break;
    }
    P->depth--;
    if (!is_tuple) {
        if (v.n) return v.v[0];
        if (!explicit_parens) {
            char b[64];
            pfail(P, cur(P), "Expected an expression, got '%s'", qcj_tok_desc(cur(P), b, sizeof b));
        }
    }
    qcj_node *n = mk(P, N_TUPLE, at);
    set_kids(n, &v);
    return n;
}

static qcj_node *parse_expression(parser *P, int with_condexpr)
{
    enter(P);
    qcj_node *n = with_condexpr ? parse_condexpr(P) : parse_or(P);
    P->depth--;
    return n;
}

/* ---- statements ---------------------------------------------------------- */

static qcj_node *subparse(parser *P, const char *const *ends);

static const char *const END_FOR[] = { "endfor", "else", NULL };
static const char *const END_FOR2[] = { "endfor", NULL };
static const char *const END_IF[] = { "elif", "else", "endif", NULL };
static const char *const END_IF2[] = { "endif", NULL };
static const char *const END_SET[] = { "endset", NULL };
static const char *const END_MACRO[] = { "endmacro", NULL };
static const char *const END_CALL[] = { "endcall", NULL };
static const char *const END_FILTER[] = { "endfilter", NULL };
static const char *const END_WITH[] = { "endwith", NULL };
static const char *const END_BLOCK[] = { "endblock", NULL };
static const char *const END_GEN[] = { "endgeneration", NULL };
static const char *const END_AUTOESC[] = { "endautoescape", NULL };
static const char *const IN_END[] = { "in", NULL };
static const char *const REC_END[] = { "recursive", NULL };

static void list_tags(char *out, size_t n, const char *const *ends)
{
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; ends[i]; i++) {
        int w = snprintf(out + k, n - k, "%s'%s'", i ? " or " : "", ends[i]);
        if (w < 0 || (size_t)w >= n - k) break;
        k += (size_t)w;
    }
}

/* jinja2's _fail_ut_eof: unknown tag (name) or end of template (NULL). */
static _Noreturn void fail_ut_eof(parser *P, const qcj_tok *at, const char *name, const char *const *extra)
{
    char msg[QCJ_MSG], looking[160];
    size_t k = 0;
    const char *const *top = extra ? extra : (P->nends ? P->ends[P->nends - 1] : NULL);
    if (name) k += (size_t)snprintf(msg, sizeof msg, "Encountered unknown tag '%s'.", name);
    else k += (size_t)snprintf(msg, sizeof msg, "Unexpected end of template.");
    if (top) {
        int expected = 0;
        for (int s = 0; name && s <= P->nends; s++) {
            const char *const *e = s < P->nends ? P->ends[s] : extra;
            for (; e && *e; e++)
                if (!strcmp(*e, name)) expected = 1;
        }
        list_tags(looking, sizeof looking, top);
        if (expected)
            k += (size_t)snprintf(msg + k, sizeof msg - k,
                                  " You probably made a nesting mistake. Jinja is expecting this tag, but "
                                  "currently looking for %s.", looking);
        else
            k += (size_t)snprintf(msg + k, sizeof msg - k, " Jinja was looking for the following tags: %s.", looking);
    }
    if (P->ntags && k < sizeof msg)
        snprintf(msg + k, sizeof msg - k, " The innermost block that needs to be closed is '%s'.",
                 P->tags[P->ntags - 1]);
    pfail(P, at, "%s", msg);
}

static qcj_node *parse_statements(parser *P, const char *const *ends, int drop_needle)
{
    skip_op(P, TK_COLON);
    expect_type(P, T_BLOCK_END, "end of statement block");
    qcj_node *body = subparse(P, ends);
    if (cur(P)->t == T_EOF) fail_ut_eof(P, cur(P), NULL, ends);
    if (drop_needle) next(P);
    return body;
}

static void check_target(parser *P, const qcj_node *t)
{
    if (t->k == N_NAME || t->k == N_NSREF) return;
    if (t->k == N_TUPLE) {
        for (uint32_t i = 0; i < t->nkid; i++) check_target(P, t->kid[i]);
        return;
    }
    const char *what = t->k == N_CONST ? "const" : t->k == N_LIST ? "list" : t->k == N_DICT ? "dict" : "expression";
    qcj_tok at = { .line = t->line, .col = t->col };
    pfail(P, &at, "can't assign to '%s'", what);
}

static qcj_node *parse_assign_target(parser *P, const char *const *extra_end, int with_namespace)
{
    qcj_node *t = parse_tuple(P, 1, 1, extra_end, 0, with_namespace);
    check_target(P, t);
    return t;
}

static const qcj_tok *name_only(parser *P)
{
    const qcj_tok *t = expect_type(P, T_NAME, "name");
    return t;
}

static int names_in(const qcj_node *n, const char *name)
{
    if (!n) return 0;
    if (n->k == N_NAME && !strcmp(n->s, name)) return 1;
    for (uint32_t i = 0; i < n->nkid; i++)
        if (names_in(n->kid[i], name)) return 1;
    return 0;
}

static int macro_flags(const qcj_node *body)
{
    return (names_in(body, "varargs") ? MF_VARARGS : 0) | (names_in(body, "kwargs") ? MF_KWARGS : 0) |
           (names_in(body, "caller") ? MF_CALLER : 0);
}

/* Appends N_PARAM nodes to v; the first lands at index `base`. */
static void parse_signature(parser *P, kvec *v, uint32_t base)
{
    expect_op(P, TK_LPAREN, "(");
    int have_default = 0;
    while (!is_op(cur(P), TK_RPAREN)) {
        if (v->n > base) expect_op(P, TK_COMMA, ",");
        const qcj_tok *a = name_only(P);
        qcj_node *p = mk_kids(P, N_PARAM, a, 1);
        p->s = a->s;
        p->slen = a->slen;
        if (skip_op(P, TK_ASSIGN)) {
            p->kid[0] = parse_expression(P, 1);
            have_default = 1;
        } else if (have_default) {
            pfail(P, a, "non-default argument follows default argument");
        }
        kpush(P, v, p);
    }
    expect_op(P, TK_RPAREN, ")");
}

static qcj_node *parse_statement(parser *P);

static qcj_node *parse_for(parser *P, const qcj_tok *at)
{
    qcj_node *n = mk_kids(P, N_FOR, at, 5);
    n->kid[0] = parse_assign_target(P, IN_END, 0);
    expect_name(P, "in");
    n->kid[1] = parse_tuple(P, 0, 0, REC_END, 0, 0);
    if (skip_name(P, "if")) n->kid[2] = parse_expression(P, 1);
    n->op = (uint8_t)skip_name(P, "recursive");
    P->loop_depth++;
    n->kid[3] = parse_statements(P, END_FOR, 0);
    P->loop_depth--;
    if (!strcmp(next(P)->s, "endfor")) return n;
    n->kid[4] = parse_statements(P, END_FOR2, 1);
    return n;
}

static qcj_node *parse_if(parser *P, const qcj_tok *at)
{
    qcj_node *result = mk_kids(P, N_IF, at, 3), *node = result;
    for (;;) {
        node->kid[0] = parse_tuple(P, 0, 0, NULL, 0, 0);
        node->kid[1] = parse_statements(P, END_IF, 0);
        const qcj_tok *t = next(P);
        if (!strcmp(t->s, "elif")) {
            qcj_node *e = mk_kids(P, N_IF, t, 3);
            node->kid[2] = e;
            node = e;
            continue;
        }
        if (!strcmp(t->s, "else")) node->kid[2] = parse_statements(P, END_IF2, 1);
        return result;
    }
}

static qcj_node *parse_set(parser *P, const qcj_tok *at)
{
    qcj_node *target = parse_assign_target(P, NULL, 1);
    if (skip_op(P, TK_ASSIGN)) return mk2(P, N_SET, at, target, parse_tuple(P, 0, 1, NULL, 0, 0));
    qcj_node *n = mk_kids(P, N_SETBLOCK, at, 3);
    n->kid[0] = target;
    n->kid[1] = is_op(cur(P), TK_PIPE) ? parse_filter(P, NULL, 0) : NULL;
    n->kid[2] = parse_statements(P, END_SET, 1);
    return n;
}

static qcj_node *parse_macro(parser *P, const qcj_tok *at)
{
    const qcj_tok *name = name_only(P);
    kvec v = { 0 };
    kpush(P, &v, NULL);
    parse_signature(P, &v, 1);
    int saved = P->loop_depth;
    P->loop_depth = 0;
    v.v[0] = parse_statements(P, END_MACRO, 1);
    P->loop_depth = saved;
    qcj_node *n = mk(P, N_MACRO, at);
    set_kids(n, &v);
    n->s = name->s;
    n->slen = name->slen;
    n->op = (uint8_t)macro_flags(v.v[0]);
    return n;
}

static qcj_node *parse_call_block(parser *P, const qcj_tok *at)
{
    kvec v = { 0 };
    kpush(P, &v, NULL);
    kpush(P, &v, NULL);
    if (is_op(cur(P), TK_LPAREN)) parse_signature(P, &v, 2);
    qcj_node *call = parse_expression(P, 1);
    if (call->k != N_CALL) pfail(P, at, "expected call");
    v.v[0] = call;
    int saved = P->loop_depth;
    P->loop_depth = 0;
    v.v[1] = parse_statements(P, END_CALL, 1);
    P->loop_depth = saved;
    qcj_node *n = mk(P, N_CALLBLOCK, at);
    set_kids(n, &v);
    n->op = (uint8_t)macro_flags(v.v[1]);
    return n;
}

static qcj_node *parse_with(parser *P, const qcj_tok *at)
{
    kvec v = { 0 };
    kpush(P, &v, NULL);
    while (cur(P)->t != T_BLOCK_END) {
        if (v.n > 1) expect_op(P, TK_COMMA, ",");
        qcj_node *t = parse_assign_target(P, NULL, 0);
        expect_op(P, TK_ASSIGN, "=");
        kpush(P, &v, t);
        kpush(P, &v, parse_expression(P, 1));
    }
    v.v[0] = parse_statements(P, END_WITH, 1);
    qcj_node *n = mk(P, N_WITH, at);
    set_kids(n, &v);
    return n;
}

/* include/import/from/extends: parse loosely, fail when executed. */
static qcj_node *parse_loader_tag(parser *P, const qcj_tok *at)
{
    while (cur(P)->t != T_BLOCK_END && cur(P)->t != T_EOF) next(P);
    qcj_node *n = mk(P, N_UNSUPPORTED, at);
    n->s = "no loader for this environment specified";
    return n;
}

static qcj_node *parse_statement(parser *P)
{
    const qcj_tok *t = cur(P);
    if (t->t != T_NAME) pfail(P, t, "tag name expected");
    if (P->ntags >= QCJ_MAX_NEST) pfail(P, t, "statements nested too deeply");
    const char *name = t->s;
    P->tags[P->ntags++] = name;
    next(P);
    qcj_node *n = NULL;
    if (!strcmp(name, "for")) n = parse_for(P, t);
    else if (!strcmp(name, "if")) n = parse_if(P, t);
    else if (!strcmp(name, "set")) n = parse_set(P, t);
    else if (!strcmp(name, "macro")) n = parse_macro(P, t);
    else if (!strcmp(name, "call")) n = parse_call_block(P, t);
    else if (!strcmp(name, "with")) n = parse_with(P, t);
    else if (!strcmp(name, "filter")) {
        n = mk_kids(P, N_FILTERBLOCK, t, 2);
        n->kid[0] = parse_filter(P, NULL, 1);
        n->kid[1] = parse_statements(P, END_FILTER, 1);
    } else if (!strcmp(name, "print")) {
        kvec v = { 0 };
        while (cur(P)->t != T_BLOCK_END) {
            if (v.n) expect_op(P, TK_COMMA, ",");
            kpush(P, &v, mk1(P, N_OUTPUT, cur(P), parse_expression(P, 1)));
        }
        n = mk(P, N_BODY, t);
        set_kids(n, &v);
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        n = mk(P, name[0] == 'b' ? N_BREAK : N_CONTINUE, t);
        n->op = (uint8_t)!P->loop_depth; /* reported by check_stmt() */
    } else if (!strcmp(name, "generation")) {
        /* HF's AssistantTracker: a call block whose caller() is the body, so
         * the body gets its own scope and cannot break out of a loop */
        int saved = P->loop_depth;
        P->loop_depth = 0;
        n = mk_kids(P, N_WITH, t, 1);
        n->kid[0] = parse_statements(P, END_GEN, 1);
        P->loop_depth = saved;
    } else if (!strcmp(name, "block")) {
        const qcj_tok *bn = name_only(P);
        skip_name(P, "scoped");
        skip_name(P, "required");
        if (is_op(cur(P), TK_SUB))
            pfail(P, cur(P), "Block names in Jinja have to be valid Python identifiers and may not contain "
                             "hyphens, use an underscore instead.");
        n = parse_statements(P, END_BLOCK, 1);
        skip_name(P, bn->s);
    } else if (!strcmp(name, "autoescape")) {
        parse_expression(P, 1);
        parse_statements(P, END_AUTOESC, 1);
        n = mk(P, N_UNSUPPORTED, t);
        n->s = "the autoescape tag is not supported";
    } else if (!strcmp(name, "include") || !strcmp(name, "import") || !strcmp(name, "from") ||
               !strcmp(name, "extends")) {
        n = parse_loader_tag(P, t);
    } else {
        P->ntags--;
        fail_ut_eof(P, t, name, NULL);
    }
    P->ntags--;
    return n;
}

static qcj_node *subparse(parser *P, const char *const *ends)
{
    kvec body = { 0 };
    const qcj_tok *start = cur(P);
    if (ends) {
        if (P->nends >= QCJ_MAX_NEST) pfail(P, start, "statements nested too deeply");
        P->ends[P->nends++] = ends;
    }
    for (;;) {
        const qcj_tok *t = cur(P);
        if (t->t == T_EOF) break;
        if (t->t == T_DATA) {
            qcj_node *d = mk(P, N_DATA, t);
            d->s = t->s;
            d->slen = t->slen;
            kpush(P, &body, d);
            next(P);
        } else if (t->t == T_VAR_BEGIN) {
            next(P);
            kpush(P, &body, mk1(P, N_OUTPUT, t, parse_tuple(P, 0, 1, NULL, 0, 0)));
            expect_type(P, T_VAR_END, "end of print statement");
        } else if (t->t == T_BLOCK_BEGIN) {
            next(P);
            int hit = 0;
            for (const char *const *e = ends; e && *e; e++)
                if (is_name(cur(P), *e)) hit = 1;
            if (hit) break;
            kpush(P, &body, parse_statement(P));
            expect_type(P, T_BLOCK_END, "end of statement block");
        } else {
            char b[64];
            pfail(P, t, "unexpected '%s'", qcj_tok_desc(t, b, sizeof b));
        }
    }
    if (ends) P->nends--;
    qcj_node *n = mk(P, N_BODY, start);
    set_kids(n, &body);
    return n;
}

/* ---- checks jinja2 makes when it generates code --------------------------- */

/* Would jinja2's optimizer fold n to a constant?  (Calls never fold in the
 * sandbox; filters that take the context, like map and select, never do.) */
static int is_const(const qcj_node *n)
{
    if (!n) return 1;
    switch (n->k) {
    case N_CONST: return 1;
    case N_COND:
        /* folds when the test and the branch taken are constant */
        return is_const(n->kid[0]) && (is_const(n->kid[1]) || (n->kid[2] && is_const(n->kid[2])));
    case N_FILTER:
        if (!n->b || !n->kid[0]) return 0;
        if (!strcmp(n->s, "map") || !strcmp(n->s, "select") || !strcmp(n->s, "reject") ||
            !strcmp(n->s, "selectattr") || !strcmp(n->s, "rejectattr"))
            return 0;
        break;
    case N_TEST:
        if (!n->b) return 0;
        break;
    case N_LIST: case N_TUPLE: case N_DICT: case N_BIN: case N_NOT: case N_NEG: case N_POS:
    case N_AND: case N_OR: case N_CONCAT: case N_COMPARE: case N_CMPOP: case N_GETATTR:
    case N_GETITEM: case N_SLICE: case N_KWARG: case N_STARARGS: case N_STARKW:
        break;
    default: return 0;
    }
    for (uint32_t i = 0; i < n->nkid; i++)
        if (!is_const(n->kid[i])) return 0;
    return 1;
}

/* soft: inside an if statement or an inline if, where jinja2 defers unknown
 * filters and tests to run time ("No filter named 'x' found.").
 * pconst: the parent folds to a constant (or n is printed directly), so a
 * constant slice here is evaluated with the lenient getitem of folding
 * (none[1:] -> undefined) rather than Python's strict slicing. */
static void check_expr(parser *P, qcj_node *n, int soft, int pconst)
{
    if (!n) return;
    /* wrappers (comparison operands, keyword arguments) fold with their parent */
    int wrapper = n->k == N_CMPOP || n->k == N_KWARG || n->k == N_STARARGS || n->k == N_STARKW;
    int c = wrapper ? pconst : is_const(n);
    if (n->k == N_GETITEM && n->kid[1]->k == N_SLICE && c && pconst) n->op = 1;
    if ((n->k == N_FILTER || n->k == N_TEST) && n->op && !soft) {
        qcj_tok at = { .line = n->line, .col = n->col };
        pfail(P, &at, "No %s named '%s'.", n->k == N_FILTER ? "filter" : "test", n->s);
    }
    if (n->k == N_COND) {
        /* jinja2 folds an inline if whose test and taken branch are constant;
         * a lenient slice in the test is undefined, hence false: the else
         * branch decides */
        int tc = c || (is_const(n->kid[0]) && n->kid[2] && is_const(n->kid[2]));
        check_expr(P, n->kid[0], 1, tc);
        check_expr(P, n->kid[1], 1, c);
        check_expr(P, n->kid[2], 1, c);
        return;
    }
    for (uint32_t i = 0; i < n->nkid; i++) check_expr(P, n->kid[i], soft, c);
}

static void check_stmt(parser *P, qcj_node *n, int soft)
{
    if (!n) return;
    switch (n->k) {
    case N_BODY:
        for (uint32_t i = 0; i < n->nkid; i++) check_stmt(P, n->kid[i], soft);
        return;
    case N_OUTPUT: check_expr(P, n->kid[0], soft, 1); return;
    case N_IF:
        check_expr(P, n->kid[0], 1, 0);
        check_stmt(P, n->kid[1], 1);
        check_stmt(P, n->kid[2], 1);
        return;
    case N_FOR:
        check_expr(P, n->kid[0], 0, 0);
        check_expr(P, n->kid[1], soft, 0);
        check_expr(P, n->kid[2], 0, 0);
        check_stmt(P, n->kid[3], 0);
        check_stmt(P, n->kid[4], 0);
        return;
    case N_SET:
        check_expr(P, n->kid[0], soft, 0);
        check_expr(P, n->kid[1], soft, 0);
        return;
    case N_SETBLOCK:
        check_expr(P, n->kid[1], 0, 0);
        check_stmt(P, n->kid[2], 0);
        return;
    case N_MACRO:
        check_stmt(P, n->kid[0], 0);
        for (uint32_t i = 1; i < n->nkid; i++) check_expr(P, n->kid[i], 0, 0);
        return;
    case N_CALLBLOCK:
        check_expr(P, n->kid[0], soft, 0);
        check_stmt(P, n->kid[1], 0);
        for (uint32_t i = 2; i < n->nkid; i++) check_expr(P, n->kid[i], 0, 0);
        return;
    case N_FILTERBLOCK:
        check_expr(P, n->kid[0], 0, 0);
        check_stmt(P, n->kid[1], 0);
        return;
    case N_WITH:
        for (uint32_t i = 1; i < n->nkid; i++) check_expr(P, n->kid[i], soft, 0);
        check_stmt(P, n->kid[0], 0);
        return;
    case N_BREAK:
    case N_CONTINUE:
        if (n->op && !P->stray) P->stray = n;
        return;
    default: return;
    }
}

qcj_node *qcj_parse(qcj_ctx *c, const qcj_tok *toks, size_t ntoks)
{
    parser P = { .c = c, .t = toks, .n = ntoks };
    qcj_node *body = subparse(&P, NULL);
    check_stmt(&P, body, 0);
    if (P.stray) {
        /* Python's own messages, found last: jinja2 meets them when Python
         * compiles the code jinja2 generated */
        qcj_tok at = { .line = P.stray->line, .col = P.stray->col };
        pfail(&P, &at, P.stray->k == N_BREAK ? "'break' outside loop" : "'continue' not properly in loop");
    }
    return body;
}
