/* chat_int.h - internals shared by the files of the chat template interpreter.
 *
 * Only engine/chat*.c include this header; the public interface is chat.h.
 * Names that cross files carry the prefix qcj_ ("quire chat jinja") so they
 * cannot collide with other modules in the static library.
 *
 * The interpreter is split by responsibility:
 *   chat_lex.c      template text -> tokens (jinja2's lexer, whitespace control)
 *   chat_parse.c    tokens -> syntax tree (jinja2's grammar and precedence)
 *   chat_value.c    arena, values, Python str()/repr()/json.dumps formatting
 *   chat_eval.c     statements and expressions, scopes, macros, loops
 *   chat_filters.c  filters and tests
 *   chat_methods.c  str/dict/list methods, globals (range, namespace, ...)
 *   chat.c          the public API
 *
 * Two rules hold everywhere below:
 *  1. Memory comes from an arena (qcj_arena).  The template owns one for its
 *     tree; each render owns one for every value it makes, freed in one go
 *     when the render returns.  Nothing is freed piecemeal.
 *  2. Errors unwind with longjmp to the entry point (qchat_compile or
 *     qchat_render), which set the jmp_buf.  This is safe because of rule 1:
 *     between setjmp and its return nothing is allocated outside the arena
 *     and no other resource is held, so unwinding leaks nothing.  Functions
 *     that may fail are marked "may fail" in their comment.
 */
#ifndef QUIRE_CHAT_INT_H
#define QUIRE_CHAT_INT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "utf8.h"

/* ---- arena -------------------------------------------------------------- */

typedef struct qcj_chunk qcj_chunk;

typedef struct {
    qcj_chunk *head;
    size_t total;  /* bytes obtained from the allocator so far */
    size_t budget; /* refuse to go past this many bytes */
} qcj_arena;

/* Returns n bytes aligned to 16, or NULL when the budget or the allocator
 * refuses (*over_budget tells which).  Freed only by qcj_arena_free. */
void *qcj_arena_alloc(qcj_arena *a, size_t n, int *over_budget);
/* Frees every chunk.  Cannot fail; a zeroed arena is a no-op. */
void qcj_arena_free(qcj_arena *a);

/* ---- values ------------------------------------------------------------- */

typedef enum {
    QV_UNDEF = 0, /* jinja2's Undefined */
    QV_NONE,
    QV_BOOL,
    QV_INT,
    QV_FLOAT,
    QV_STR,
    QV_LIST,  /* list, tuple, generator, dict views (qcj_list.kind) */
    QV_DICT,
    QV_NS,    /* namespace(): u.d holds its attributes */
    QV_FUNC,  /* macro, builtin function, bound method */
    QV_LOOP,  /* the `loop` variable of a for loop */
    QV_MISSING /* internal: an argument that was not passed */
} qcj_type;

typedef struct qcj_str {
    size_t len;    /* bytes, not counting the NUL that always follows */
    size_t nchars; /* code points; == len when the string is ASCII */
    char s[];
} qcj_str;

struct qcj_list;
struct qcj_dict;
struct qcj_func;
struct qcj_loop;
struct qcj_undef;

/* A string may be a jinja2 Markup (`markup`): what |safe and |escape make.
 * As in markupsafe, + and % escape the plain strings they join to one, and
 * the string methods and filters that keep a Markup keep the flag; every
 * other operation gives a plain str, and equality and hashing ignore it. */
typedef struct qcj_val {
    uint8_t t;      /* qcj_type */
    uint8_t markup; /* QV_STR: a Markup (HTML-safe) string */
    union {
        int64_t i; /* QV_INT, QV_BOOL (0/1) */
        double f;
        qcj_str *s;
        struct qcj_list *l;
        struct qcj_dict *d; /* QV_DICT, QV_NS */
        struct qcj_func *fn;
        struct qcj_loop *lp;
        struct qcj_undef *un; /* may be NULL: an anonymous undefined */
    } u;
} qcj_val;

enum { QL_LIST, QL_TUPLE, QL_GEN, QL_ITEMS, QL_KEYS, QL_VALUES };

/* Lists never change once built: the sandbox forbids mutating methods.  A
 * generator (QL_GEN, what map/select/... return) is materialised eagerly but
 * keeps Python's observable behaviour: no len(), always true, and it is
 * empty after being iterated once (`consumed`). */
typedef struct qcj_list {
    size_t n, cap;
    qcj_val *v;
    uint8_t kind;
    uint8_t consumed;
    const char *gen_name; /* printed as "<gen_name>" */
} qcj_list;

/* Insertion-ordered dictionary (Python 3.7+ semantics).  Keys are hashable
 * values; a hash index is built once the dict grows past a few entries. */
typedef struct qcj_dict {
    size_t n, cap;
    qcj_val *k, *v;
    uint32_t *idx; /* open addressing, entry index + 1, 0 = empty */
    size_t icap;
} qcj_dict;

enum { QF_GLOBAL, QF_METHOD, QF_MACRO, QF_CALLER, QF_JOINER, QF_CYCLER };

struct qcj_node;
struct qcj_scope;
struct qcj_builtin;

typedef struct qcj_func {
    uint8_t kind;
    const struct qcj_builtin *b;   /* QF_GLOBAL, QF_METHOD */
    qcj_val self;                  /* QF_METHOD: the bound object */
    const struct qcj_node *node;   /* QF_MACRO, QF_CALLER */
    struct qcj_scope *scope;       /* QF_MACRO, QF_CALLER: defining scope */
    qcj_val state;                 /* QF_JOINER: used flag; QF_CYCLER: items */
    size_t pos;                    /* QF_CYCLER: current index */
} qcj_func;

typedef struct qcj_loop {
    const qcj_val *items;
    size_t n, i;
    int depth0;
    const struct qcj_node *node;  /* the for statement (recursive loops) */
    struct qcj_scope *scope;      /* scope the loop was started in */
    qcj_val changed_last;
    int has_changed;
} qcj_loop;

enum { QU_NAME, QU_ATTR, QU_ELEM, QU_HINT };

/* What an undefined value remembers, to name itself in an error when it is
 * misused (called, added, compared, subscripted...). */
typedef struct qcj_undef {
    uint8_t kind;
    uint8_t security; /* an unsafe attribute of the sandbox */
    const char *text; /* QU_NAME/QU_ATTR: the name; QU_HINT: the message */
    qcj_val obj;      /* QU_ATTR/QU_ELEM: the object that lacked it */
    qcj_val key;      /* QU_ELEM */
} qcj_undef;

/* ---- syntax tree -------------------------------------------------------- */

typedef enum {
    /* statements */
    N_BODY, N_DATA, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO,
    N_CALLBLOCK, N_FILTERBLOCK, N_WITH, N_BREAK, N_CONTINUE, N_UNSUPPORTED,
    /* expressions */
    N_CONST, N_NAME, N_NSREF, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_KWARG,
    N_STARARGS, N_STARKW, N_FILTER, N_TEST, N_NOT, N_NEG, N_POS, N_BIN, N_AND,
    N_OR, N_CONCAT, N_COMPARE, N_CMPOP, N_COND, N_LIST, N_TUPLE, N_DICT, N_PARAM
} qcj_nkind;

/* Binary and comparison operators (qcj_node.op). */
enum {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN
};

/* N_MACRO / N_CALLBLOCK flags (qcj_node.op): the body names these. */
enum { MF_VARARGS = 1, MF_KWARGS = 2, MF_CALLER = 4 };

/* One node type for the whole tree; the meaning of kid[] per kind is listed
 * in chat_parse.c.  Names (s) are NUL-terminated. */
typedef struct qcj_node {
    uint8_t k;
    uint8_t op;
    int line, col;
    const char *s;
    size_t slen;
    qcj_val val;                /* N_CONST */
    const struct qcj_builtin *b; /* N_FILTER, N_TEST: resolved at compile time */
    struct qcj_node **kid;
    uint32_t nkid;
} qcj_node;

/* ---- contexts ------------------------------------------------------------- */

#define QCJ_MSG 1024

typedef struct qcj_buf {
    char *p;
    size_t n, cap;
} qcj_buf;

typedef struct qcj_var {
    const char *name;
    size_t len;
    qcj_val v;
} qcj_var;

typedef struct qcj_scope {
    struct qcj_scope *parent;
    qcj_var *vars;
    size_t n, cap;
} qcj_scope;

/* One context type serves compiling and rendering; rendering uses all of it. */
typedef struct qcj_ctx {
    qcj_arena *ar;
    jmp_buf jb;
    int rc;
    int raw_msg; /* msg is raise_exception's text, no position prefix */
    char msg[QCJ_MSG];

    /* rendering */
    qcj_buf *out;
    size_t max_output;
    uint64_t iters, max_iters;
    int depth, max_depth;     /* nested evaluation (C stack) */
    int mdepth, max_mdepth;   /* nested macro calls */
    double deadline;
    uint32_t tick;
    int64_t now;              /* pinned clock, or INT64_MIN */
} qcj_ctx;

/* Formats an error into c->msg (prefixed "line L: " when line > 0) and
 * unwinds to the entry point.  Never returns. */
_Noreturn void qcj_fail(qcj_ctx *c, int rc, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Unwinds with an undefined value's own error message ("'x' is undefined"). */
_Noreturn void qcj_fail_undef(qcj_ctx *c, int line, qcj_val u);

/* Arena allocation that unwinds on failure.  May fail. */
void *qcj_alloc(qcj_ctx *c, size_t n);
void *qcj_allocn(qcj_ctx *c, size_t n, size_t size);

/* ---- builtins (filters, tests, methods, globals) ------------------------- */

typedef struct qcj_args {
    const qcj_val *pos;
    size_t npos;
    const char *const *kwn;
    const qcj_val *kwv;
    size_t nkw;
} qcj_args;

/* at: the node being evaluated (for error lines).  self: the filtered or
 * tested value, the bound object of a method, unused for globals. */
typedef qcj_val (*qcj_builtin_fn)(qcj_ctx *c, const qcj_node *at, qcj_val self, const qcj_args *a);

typedef struct qcj_builtin {
    const char *name;
    qcj_builtin_fn fn;
    uint8_t unsafe; /* methods the immutable sandbox refuses */
} qcj_builtin;

/* Lookups by name; NULL when absent.  *known (may be NULL) tells whether
 * jinja2 knows a filter or test that this interpreter does not implement. */
const qcj_builtin *qcj_find_filter(const char *name, int *known);
const qcj_builtin *qcj_find_test(const char *name, int *known);
/* Methods of a value (str, dict, list, tuple, loop, cycler), by name. */
const qcj_builtin *qcj_find_method(qcj_val obj, const char *name);
/* The globals every render starts with, in table order. */
const qcj_builtin *qcj_globals(size_t *n);

/* Binds arguments to parameter names like Python does (positional first,
 * then by keyword); slots[i] is QV_MISSING when not given.  The first nreq
 * parameters are required.  May fail. */
void qcj_bind(qcj_ctx *c, const qcj_node *at, const char *fname, const qcj_args *a,
              const char *const *params, size_t nreq, qcj_val *slots);

/* ---- values: construction (chat_value.c) ---------------------------------- */

static inline qcj_val qcj_none(void) { qcj_val v = { .t = QV_NONE }; return v; }
static inline qcj_val qcj_missing(void) { qcj_val v = { .t = QV_MISSING }; return v; }
static inline qcj_val qcj_bool(int b) { qcj_val v = { .t = QV_BOOL, .u.i = b ? 1 : 0 }; return v; }
static inline qcj_val qcj_int(int64_t i) { qcj_val v = { .t = QV_INT, .u.i = i }; return v; }
static inline qcj_val qcj_float(double f) { qcj_val v = { .t = QV_FLOAT, .u.f = f }; return v; }
static inline qcj_val qcj_undef0(void) { qcj_val v = { .t = QV_UNDEF, .u.un = NULL }; return v; }

/* All may fail (out of memory / memory limit). */
qcj_str *qcj_str_new(qcj_ctx *c, const char *p, size_t n);
qcj_val qcj_strv(qcj_ctx *c, const char *p, size_t n);
/* s as a value, a Markup when markup is set.  Cannot fail. */
static inline qcj_val qcj_strval(qcj_str *s, int markup)
{
    qcj_val v = { .t = QV_STR, .markup = (uint8_t)(markup != 0) };
    v.u.s = s;
    return v;
}
/* markupsafe's escape(v): a Markup is returned as it is; anything else is
 * str(v) with & < > " ' replaced by entities, as a Markup.  May fail. */
qcj_val qcj_escape(qcj_ctx *c, qcj_val v);
/* The same, always escaping (jinja2's |forceescape).  May fail. */
qcj_str *qcj_escape_str(qcj_ctx *c, qcj_str *s);
/* Marks the strings of a list or tuple that a Markup method returned (split,
 * partition...) as Markup; returns v.  Cannot fail. */
qcj_val qcj_markup_items(qcj_val v);
qcj_val qcj_cstrv(qcj_ctx *c, const char *s);
qcj_val qcj_undef_name(qcj_ctx *c, const char *name);
qcj_val qcj_undef_hint(qcj_ctx *c, const char *hint, int security);
qcj_val qcj_undef_attr(qcj_ctx *c, qcj_val obj, const char *name);
qcj_val qcj_undef_elem(qcj_ctx *c, qcj_val obj, qcj_val key);
qcj_list *qcj_list_new(qcj_ctx *c, uint8_t kind, size_t cap);
void qcj_list_push(qcj_ctx *c, qcj_list *l, qcj_val v);
qcj_val qcj_listv(qcj_list *l);
qcj_dict *qcj_dict_new(qcj_ctx *c);
/* Python d[k] = v: replaces in place when present, else appends. */
void qcj_dict_set(qcj_ctx *c, const qcj_node *at, qcj_dict *d, qcj_val k, qcj_val v);
/* Returns 1 and *out when present.  Fails when k is unhashable. */
int qcj_dict_get(qcj_ctx *c, const qcj_node *at, const qcj_dict *d, qcj_val k, qcj_val *out);
/* Lookup by string key without allocating; cannot fail. */
int qcj_dict_get_str(const qcj_dict *d, const char *k, size_t n, qcj_val *out);
/* A tuple (a, b). */
qcj_val qcj_pair(qcj_ctx *c, qcj_val a, qcj_val b);
/* Deep copy of a JSON value; rejects non-UTF-8 strings and nesting past
 * max_depth.  May fail. */
qcj_val qcj_from_json(qcj_ctx *c, const json_t *j, int depth);

/* ---- values: semantics ------------------------------------------------------ */

/* Python truthiness (generators are always true).  Cannot fail. */
int qcj_truthy(qcj_val v);
/* Python ==, deep.  Cannot fail (unhashable values still compare; nesting
 * deeper than 200 levels compares unequal). */
int qcj_eq(qcj_val a, qcj_val b);
/* Python <, <=, >, >= as -1/0/1 ordering; fails with Python's TypeError text
 * when the types do not order ("'<' not supported between ..."). */
int qcj_order(qcj_ctx *c, const qcj_node *at, qcj_val a, qcj_val b, const char *opname);
/* jinja2's object_type_repr for messages: "dict object", "None"... */
const char *qcj_obj_type_repr(qcj_val v);
/* Python's type name: "str", "int", "NoneType", "list", "Undefined"... */
const char *qcj_type_name(qcj_val v);
/* True for numbers, including bool (an int subclass in Python). */
static inline int qcj_is_num(qcj_val v) { return v.t == QV_INT || v.t == QV_BOOL || v.t == QV_FLOAT; }
static inline double qcj_num(qcj_val v) { return v.t == QV_FLOAT ? v.u.f : (double)v.u.i; }

/* ---- formatting ---------------------------------------------------------- */

/* Appends bytes; fails past c->max_output or the memory budget. */
void qcj_buf_put(qcj_ctx *c, qcj_buf *b, const char *p, size_t n);
void qcj_buf_puts(qcj_ctx *c, qcj_buf *b, const char *s);
void qcj_buf_putc(qcj_ctx *c, qcj_buf *b, char ch);
/* str(v) appended to b (Undefined -> "", None -> "None", lists as repr). */
void qcj_write_str(qcj_ctx *c, qcj_buf *b, qcj_val v);
/* repr(v) appended to b. */
void qcj_write_repr(qcj_ctx *c, qcj_buf *b, qcj_val v);
/* str(v) as a string value (returns v itself when it is a string). */
qcj_str *qcj_to_str(qcj_ctx *c, qcj_val v);
/* Python repr() of a float ("1.0", "1e+20", "inf") into out[32]. */
void qcj_fmt_float(double f, char *out);

typedef struct {
    int ensure_ascii;
    int sort_keys;
    const char *indent; /* NULL: single line */
    size_t indent_len;
    const char *item_sep, *key_sep;
    size_t item_sep_len, key_sep_len;
} qcj_json_opts;

/* json.dumps(v, ...) appended to b; fails like Python on values JSON cannot
 * hold ("Object of type Undefined is not JSON serializable"). */
void qcj_write_json(qcj_ctx *c, const qcj_node *at, qcj_buf *b, qcj_val v, const qcj_json_opts *o);

/* ---- UTF-8 and Unicode helpers ------------------------------------------- */

/* Byte offset of code point index i in s (i <= nchars). */
size_t qcj_str_off(const qcj_str *s, size_t i);
/* Python str.isspace() for one code point. */
int qcj_isspace(uint32_t cp);
/* Simple case mapping (Latin, Greek, Cyrillic, fullwidth); 'ß' upper-cases
 * to "SS" in qcj_str_case. */
uint32_t qcj_upper(uint32_t cp);
uint32_t qcj_lower(uint32_t cp);
enum { QC_UPPER, QC_LOWER, QC_TITLE_WORDS, QC_CAPITALIZE, QC_SWAPCASE };
/* str.upper()/lower()/title()/capitalize()/swapcase(). */
qcj_str *qcj_str_case(qcj_ctx *c, const qcj_str *s, int mode);

/* ---- evaluation (chat_eval.c) --------------------------------------------- */

/* Renders the template body into c->out.  May fail. */
void qcj_exec_template(qcj_ctx *c, const qcj_node *body, qcj_scope *root);
/* Attribute and item access with the sandbox's rules (getattr then item for
 * x.y, item then attribute for x[y]); missing -> undefined. */
qcj_val qcj_getattr(qcj_ctx *c, const qcj_node *at, qcj_val obj, const char *name, size_t len);
qcj_val qcj_getitem(qcj_ctx *c, const qcj_node *at, qcj_val obj, qcj_val key);
/* Calls any callable value. */
qcj_val qcj_call(qcj_ctx *c, const qcj_node *at, qcj_val fn, const qcj_args *a);
/* Iterates like Python's iter(): fills items and n; marks generators used.
 * Fails for values that are not iterable. */
void qcj_iter(qcj_ctx *c, const qcj_node *at, qcj_val v, const qcj_val **items, size_t *n);
/* Python `a in b`. */
int qcj_contains(qcj_ctx *c, const qcj_node *at, qcj_val item, qcj_val container);
/* Binary arithmetic (OP_ADD ... OP_POW) with Python semantics. */
qcj_val qcj_binop(qcj_ctx *c, const qcj_node *at, int op, qcj_val a, qcj_val b);
/* The attribute half of the sandbox's access (methods, namespace and loop
 * fields); returns 0 on a miss.  Used by x.y, x[y] and the attr filter. */
int qcj_attr(qcj_ctx *c, qcj_val obj, const char *name, size_t len, qcj_val *out);
/* Python's `fmt % args` (printf-style formatting); a Markup fmt (markup set)
 * escapes what its conversions insert and gives a Markup. */
qcj_val qcj_percent_format(qcj_ctx *c, const qcj_node *at, const qcj_str *fmt, int markup, qcj_val args);
/* A method called on a Markup string: markupsafe's escaping of the arguments
 * that join the result (replace's new, the fill of center/ljust/rjust) and a
 * Markup result where markupsafe keeps one. */
qcj_val qcj_markup_method(qcj_ctx *c, const qcj_node *at, const qcj_builtin *b, qcj_val self, const qcj_args *a);
/* Python's str.strip/lstrip/rstrip: chars NULL strips whitespace. */
qcj_str *qcj_strip(qcj_ctx *c, const qcj_str *s, const qcj_str *chars, int left, int right);
/* Python's str.replace(old, new, count); count < 0 replaces all. */
qcj_str *qcj_replace(qcj_ctx *c, const qcj_str *s, const qcj_str *old, const qcj_str *rep, int64_t count);
/* Python's str.splitlines() (keepends 0/1). */
qcj_list *qcj_splitlines(qcj_ctx *c, const qcj_str *s, int keepends);
/* Applies a test by name with arguments (used by select/reject). */
int qcj_apply_test(qcj_ctx *c, const qcj_node *at, const char *name, qcj_val v, const qcj_args *a);
/* Applies a filter by name (used by map). */
qcj_val qcj_apply_filter(qcj_ctx *c, const qcj_node *at, const char *name, qcj_val v, const qcj_args *a);
/* Counts work against the loop/time limits. */
void qcj_tick(qcj_ctx *c, const qcj_node *at);

/* ---- parsing (chat_lex.c, chat_parse.c) ----------------------------------- */

typedef enum {
    T_EOF, T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END,
    T_NAME, T_STRING, T_INT, T_FLOAT, T_OP
} qcj_ttype;

/* Operator tokens (qcj_tok.op). */
enum {
    TK_ADD, TK_SUB, TK_DIV, TK_FLOORDIV, TK_MUL, TK_MOD, TK_POW, TK_TILDE,
    TK_LBRACKET, TK_RBRACKET, TK_LPAREN, TK_RPAREN, TK_LBRACE, TK_RBRACE,
    TK_EQ, TK_NE, TK_GT, TK_GTEQ, TK_LT, TK_LTEQ, TK_ASSIGN, TK_DOT,
    TK_COLON, TK_PIPE, TK_COMMA, TK_SEMICOLON
};

typedef struct qcj_tok {
    uint8_t t;
    uint8_t op;
    int line, col;
    const char *s; /* T_DATA, T_NAME, T_STRING: NUL-terminated */
    size_t slen;
    int64_t i;
    double f;
} qcj_tok;

/* Tokenizes src (normalising newlines on a copy) with
 * trim_blocks and lstrip_blocks on.  May fail (syntax errors). */
void qcj_lex(qcj_ctx *c, const char *src, size_t len, qcj_tok **toks, size_t *ntoks);
/* Parses tokens into a tree (an N_BODY).  May fail. */
qcj_node *qcj_parse(qcj_ctx *c, const qcj_tok *toks, size_t ntoks);
/* Token description for messages, as jinja2 words it. */
const char *qcj_tok_desc(const qcj_tok *t, char *buf, size_t n);

#endif
