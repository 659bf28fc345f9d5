/* gram_re.c - JSON Schema regular expressions to a byte DFA (gram_re.h).
 *
 * Three stages, each over the last one's output:
 *
 *   1. parse: the pattern (UTF-8) becomes a tree of code-point sets,
 *      concatenations, alternations and repetitions (node[]);
 *   2. NFA (Thompson): every code-point set becomes byte paths - its UTF-8
 *      encodings, split into runs whose bytes vary in ranges (utf8_split);
 *      in JSON-string mode the code points a JSON string escapes become
 *      their escape sequences instead;
 *   3. DFA: subset construction over byte classes (bytes that no edge tells
 *      apart share a column), at most GRAM_RE_MAX_STATES states.  A subset's
 *      moves are gathered for all classes in one pass over its edges, and a
 *      move set met before gives its subset without a new closure
 *      (gram_nfa.h).
 *
 * Unanchored alternatives get "any string" before and after them, so the
 * DFA answers whole-input questions only. */
#include "gram_re.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram_nfa.h"
#include "qerr.h"
#include "utf8.h"
#include "util.h"

#define MAX_CP 0x10FFFF
#define MAX_REPEAT 1000
/* The work of building the DFA is counted as each subset's size times the
 * byte classes, plus the size of the subset each transition leads to
 * (counted whether it is made or found again); a pattern that needs more
 * than the compile budget allows (gram.h gram_budget: 20,000,000 steps,
 * tens of milliseconds, by default) is refused, as is one that needs more
 * states or runs past the budget's deadline (checked every 16 subsets). */

/* ---- code-point sets ------------------------------------------------------------- */

typedef struct {
    uint32_t lo, hi;
} crange;

typedef struct {
    crange *r;
    int n, cap;
} cset;

static int cset_add(cset *s, uint32_t lo, uint32_t hi)
{
    if (lo > hi) return 0;
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        crange *r = q_reallocn(s->r, (size_t)cap, sizeof *r);
        if (!r) return QERR_NOMEM;
        s->r = r, s->cap = cap;
    }
    s->r[s->n++] = (crange){ lo, hi };
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const crange *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Sorts and merges; drops the surrogates (not UTF-8). */
static int cset_norm(cset *s)
{
    if (!s->n) return 0;
    qsort(s->r, (size_t)s->n, sizeof *s->r, cmp_range);
    int k = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi) s->r[k].hi = s->r[i].hi;
        } else {
            s->r[++k] = s->r[i];
        }
    }
    s->n = k + 1;
    /* Cut out D800-DFFF. */
    for (int i = 0; i < s->n; i++) {
        crange c = s->r[i];
        if (c.hi < 0xD800 || c.lo > 0xDFFF) continue;
        if (c.lo < 0xD800 && c.hi > 0xDFFF) {
            s->r[i].hi = 0xD7FF;
            if (cset_add(s, 0xE000, c.hi)) return QERR_NOMEM;
            return cset_norm(s);
        }
        if (c.lo < 0xD800) s->r[i].hi = 0xD7FF;
        else if (c.hi > 0xDFFF) s->r[i].lo = 0xE000;
        else s->r[i].lo = 1, s->r[i].hi = 0; /* empty: removed below */
    }
    k = 0;
    for (int i = 0; i < s->n; i++)
        if (s->r[i].lo <= s->r[i].hi) s->r[k++] = s->r[i];
    s->n = k;
    return 0;
}

/* s = the complement of s in [0, MAX_CP]. */
static int cset_negate(cset *s)
{
    int rc = cset_norm(s);
    if (rc) return rc;
    cset o = { 0 };
    uint32_t next = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        if (s->r[i].lo > next) rc = cset_add(&o, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (!rc && next <= MAX_CP) rc = cset_add(&o, next, MAX_CP);
    free(s->r);
    *s = o;
    return rc ? rc : cset_norm(s);
}

static int cset_union(cset *s, const cset *t)
{
    for (int i = 0; i < t->n; i++)
        if (cset_add(s, t->r[i].lo, t->r[i].hi)) return QERR_NOMEM;
    return 0;
}

/* ---- the parse tree --------------------------------------------------------------- */

typedef enum { N_EMPTY, N_SET, N_CAT, N_ALT, N_REP } ntype;

typedef struct {
    ntype t;
    int a, b;           /* children (CAT, ALT), child (REP) */
    int min, max;       /* REP: max -1 for no bound */
    cset set;           /* SET */
} node;

typedef struct {
    const char *p, *end, *start;
    unsigned flags;
    node *nodes;
    int n_nodes, cap_nodes;
    int rc;
    char *err;
    size_t errlen;
    int depth;
} parser;

static int fail_at(parser *ps, int rc, const char *what)
{
    if (!ps->rc) {
        ps->rc = rc;
        qerr_set(ps->err, ps->errlen, rc, "pattern: %s at offset %d", what, (int)(ps->p - ps->start));
    }
    return -1;
}

static int new_node(parser *ps, ntype t)
{
    if (ps->rc) return -1;
    if (ps->n_nodes == ps->cap_nodes) {
        int cap = ps->cap_nodes ? ps->cap_nodes * 2 : 64;
        node *n = q_reallocn(ps->nodes, (size_t)cap, sizeof *n);
        if (!n) return fail_at(ps, QERR_NOMEM, "out of memory");
        ps->nodes = n, ps->cap_nodes = cap;
    }
    memset(&ps->nodes[ps->n_nodes], 0, sizeof ps->nodes[0]);
    ps->nodes[ps->n_nodes].t = t;
    return ps->n_nodes++;
}

static int bin(parser *ps, ntype t, int a, int b)
{
    if (a < 0) return b;
    if (b < 0) return a;
    int n = new_node(ps, t);
    if (n >= 0) ps->nodes[n].a = a, ps->nodes[n].b = b;
    return n;
}

/* The next code point of the pattern (UTF-8), or -1 at a bad byte. */
static int32_t next_cp(parser *ps)
{
    if (ps->p >= ps->end) return -1;
    const size_t n = qutf8_char(ps->p, (size_t)(ps->end - ps->p));
    if (!n) return -1;
    uint32_t c;
    qutf8_decode_valid(ps->p, &c);
    ps->p += n;
    return (int32_t)c;
}

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* n hex digits; -1 when they are not there. */
static int32_t hex_n(parser *ps, int n)
{
    int32_t v = 0;
    for (int i = 0; i < n; i++) {
        if (ps->p >= ps->end || hexval((unsigned char)*ps->p) < 0) return -1;
        v = v * 16 + hexval((unsigned char)*ps->p++);
    }
    return v;
}

/* The class escapes \d \w \s into set (negated for \D \W \S). */
static int class_escape(int c, cset *set)
{
    cset t = { 0 };
    int rc = 0;
    const int lc = c | 0x20;
    if (lc == 'd') {
        rc = cset_add(&t, '0', '9');
    } else if (lc == 'w') {
        rc = cset_add(&t, '0', '9') || cset_add(&t, 'A', 'Z') || cset_add(&t, 'a', 'z') || cset_add(&t, '_', '_');
    } else {
        /* ECMA-262 WhiteSpace and LineTerminator. */
        static const uint32_t ws[][2] = { { 9, 13 },         { 32, 32 },         { 0xA0, 0xA0 },
                                          { 0x1680, 0x1680 }, { 0x2000, 0x200A }, { 0x2028, 0x2029 },
                                          { 0x202F, 0x202F }, { 0x205F, 0x205F }, { 0x3000, 0x3000 },
                                          { 0xFEFF, 0xFEFF } };
        for (size_t i = 0; i < sizeof ws / sizeof ws[0] && !rc; i++) rc = cset_add(&t, ws[i][0], ws[i][1]);
    }
    if (!rc && c != lc) rc = cset_negate(&t);
    if (!rc) rc = cset_union(set, &t);
    free(t.r);
    return rc ? QERR_NOMEM : 0;
}

/* After a backslash: one code point into *cp (0), or a class into set (1),
 * or -1 with the parser failed. */
static int escape(parser *ps, int32_t *cp, cset *set, int in_class)
{
    if (ps->p >= ps->end) return fail_at(ps, QERR_INVAL, "a pattern cannot end in a backslash");
    const int c = (unsigned char)*ps->p++;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        return class_escape(c, set) ? fail_at(ps, QERR_NOMEM, "out of memory") : 1;
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0':
        if (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            return fail_at(ps, QERR_INVAL, "octal escapes are not supported");
        *cp = 0;
        return 0;
    case 'x':
        if ((*cp = hex_n(ps, 2)) < 0) return fail_at(ps, QERR_INVAL, "\\x needs two hex digits");
        return 0;
    case 'u':
        if (ps->p < ps->end && *ps->p == '{') {
            ps->p++;
            int32_t v = 0;
            int digits = 0;
            while (ps->p < ps->end && hexval((unsigned char)*ps->p) >= 0 && digits < 7)
                v = v * 16 + hexval((unsigned char)*ps->p++), digits++;
            if (!digits || ps->p >= ps->end || *ps->p != '}' || v > MAX_CP)
                return fail_at(ps, QERR_INVAL, "bad \\u{...} escape");
            ps->p++;
            *cp = v;
            return 0;
        }
        if ((*cp = hex_n(ps, 4)) < 0) return fail_at(ps, QERR_INVAL, "\\u needs four hex digits");
        /* A surrogate pair written as two escapes. */
        if (*cp >= 0xD800 && *cp <= 0xDBFF && ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
            const char *save = ps->p;
            ps->p += 2;
            int32_t lo = hex_n(ps, 4);
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
                *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
                return 0;
            }
            ps->p = save;
        }
        if (*cp >= 0xD800 && *cp <= 0xDFFF) return fail_at(ps, QERR_INVAL, "a lone surrogate cannot be matched");
        return 0;
    case 'c':
        if (ps->p < ps->end && ((*ps->p | 0x20) >= 'a' && (*ps->p | 0x20) <= 'z')) {
            *cp = (*ps->p++ | 0x20) - 'a' + 1;
            return 0;
        }
        return fail_at(ps, QERR_INVAL, "bad \\c escape");
    case 'b':
        if (in_class) {
            *cp = 8;
            return 0;
        }
        return fail_at(ps, QERR_INVAL, "word boundaries (\\b) are not supported");
    case 'B': return fail_at(ps, QERR_INVAL, "word boundaries (\\B) are not supported");
    case 'p': case 'P': return fail_at(ps, QERR_INVAL, "Unicode property classes (\\p) are not supported");
    case 'k': return fail_at(ps, QERR_INVAL, "backreferences are not supported");
    default:
        if (c >= '1' && c <= '9') return fail_at(ps, QERR_INVAL, "backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return fail_at(ps, QERR_INVAL, "unknown escape");
        ps->p--;
        if ((*cp = next_cp(ps)) < 0) return fail_at(ps, QERR_INVAL, "invalid UTF-8");
        return 0;
    }
}

static int set_node(parser *ps, cset *s)
{
    int n = new_node(ps, N_SET);
    if (n < 0) {
        free(s->r);
        return -1;
    }
    ps->nodes[n].set = *s;
    return n;
}

/* [...] after the '['. */
static int parse_class(parser *ps)
{
    cset s = { 0 };
    int neg = 0;
    if (ps->p < ps->end && *ps->p == '^') neg = 1, ps->p++;
    int first = 1;
    for (;;) {
        if (ps->p >= ps->end) {
            free(s.r);
            return fail_at(ps, QERR_INVAL, "unterminated [");
        }
        if (*ps->p == ']' && !first) {
            ps->p++;
            break;
        }
        first = 0;
        int32_t lo = -1;
        if (*ps->p == '\\') {
            ps->p++;
            int k = escape(ps, &lo, &s, 1);
            if (k < 0) {
                free(s.r);
                return -1;
            }
            if (k == 1) continue;
        } else if ((lo = next_cp(ps)) < 0) {
            free(s.r);
            return fail_at(ps, QERR_INVAL, "invalid UTF-8");
        }
        int32_t hi = lo;
        if (ps->end - ps->p >= 2 && ps->p[0] == '-' && ps->p[1] != ']') {
            ps->p++;
            if (*ps->p == '\\') {
                ps->p++;
                cset dummy = { 0 };
                int k = escape(ps, &hi, &dummy, 1);
                free(dummy.r);
                if (k != 0) {
                    free(s.r);
                    return k < 0 ? -1 : fail_at(ps, QERR_INVAL, "a class cannot end a range");
                }
            } else if ((hi = next_cp(ps)) < 0) {
                free(s.r);
                return fail_at(ps, QERR_INVAL, "invalid UTF-8");
            }
            if (hi < lo) {
                free(s.r);
                return fail_at(ps, QERR_INVAL, "a range out of order");
            }
        }
        if (cset_add(&s, (uint32_t)lo, (uint32_t)hi)) {
            free(s.r);
            return fail_at(ps, QERR_NOMEM, "out of memory");
        }
    }
    if ((neg ? cset_negate(&s) : cset_norm(&s))) {
        free(s.r);
        return fail_at(ps, QERR_NOMEM, "out of memory");
    }
    return set_node(ps, &s);
}

/* Any code point but the line terminators ('.'), or any at all. */
static int any_node(parser *ps, int dot)
{
    cset s = { 0 };
    int rc = dot ? (cset_add(&s, 0, 9) || cset_add(&s, 11, 12) || cset_add(&s, 14, 0x2027) ||
                    cset_add(&s, 0x202A, MAX_CP))
                 : cset_add(&s, 0, MAX_CP);
    if (rc || cset_norm(&s)) {
        free(s.r);
        return fail_at(ps, QERR_NOMEM, "out of memory");
    }
    return set_node(ps, &s);
}

static int parse_alt(parser *ps);

/* A decimal count of a {n,m} repetition; -1 when none. */
static int count(parser *ps)
{
    int v = -1;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        v = (v < 0 ? 0 : v * 10) + (*ps->p++ - '0');
        if (v > 100000) v = 100000;
    }
    return v;
}

static int parse_atom(parser *ps)
{
    const char c = *ps->p;
    if (c == '(') {
        ps->p++;
        if (ps->p < ps->end && *ps->p == '?') {
            ps->p++;
            if (ps->p < ps->end && *ps->p == ':') {
                ps->p++;
            } else if (ps->p < ps->end && (*ps->p == '<' || *ps->p == 'P') && ps->end - ps->p > 1 &&
                       (ps->p[1] != '=' && ps->p[1] != '!')) {
                /* A named group: (?<name>...) or (?P<name>...). */
                if (*ps->p == 'P') ps->p++;
                while (ps->p < ps->end && *ps->p != '>') ps->p++;
                if (ps->p >= ps->end) return fail_at(ps, QERR_INVAL, "unterminated group name");
                ps->p++;
            } else {
                return fail_at(ps, QERR_INVAL, "lookaround and inline flags are not supported");
            }
        }
        if (++ps->depth > 200) return fail_at(ps, QERR_LIMIT, "groups nested too deep");
        int n = parse_alt(ps);
        ps->depth--;
        if (ps->rc) return -1;
        if (ps->p >= ps->end || *ps->p != ')') return fail_at(ps, QERR_INVAL, "missing )");
        ps->p++;
        return n < 0 ? new_node(ps, N_EMPTY) : n;
    }
    if (c == '[') {
        ps->p++;
        return parse_class(ps);
    }
    if (c == '.') {
        ps->p++;
        return any_node(ps, 1);
    }
    if (c == '^' || c == '$') return fail_at(ps, QERR_INVAL, "anchors (^ $) only at the ends of the pattern's alternatives");
    if (c == '*' || c == '+' || c == '?') return fail_at(ps, QERR_INVAL, "nothing to repeat");
    if (c == ')') return fail_at(ps, QERR_INVAL, "unmatched )");
    cset s = { 0 };
    int32_t cp = -1;
    if (c == '\\') {
        ps->p++;
        int k = escape(ps, &cp, &s, 0);
        if (k < 0) return -1;
        if (k == 1) {
            if (cset_norm(&s)) {
                free(s.r);
                return fail_at(ps, QERR_NOMEM, "out of memory");
            }
            return set_node(ps, &s);
        }
    } else if ((cp = next_cp(ps)) < 0) {
        return fail_at(ps, QERR_INVAL, "invalid UTF-8");
    }
    if (cset_add(&s, (uint32_t)cp, (uint32_t)cp)) return fail_at(ps, QERR_NOMEM, "out of memory");
    return set_node(ps, &s);
}

static int parse_repeat(parser *ps, int atom)
{
    while (ps->p < ps->end && !ps->rc) {
        int min, max;
        const char c = *ps->p;
        if (c == '*') min = 0, max = -1, ps->p++;
        else if (c == '+') min = 1, max = -1, ps->p++;
        else if (c == '?') min = 0, max = 1, ps->p++;
        else if (c == '{') {
            const char *save = ps->p++;
            min = count(ps);
            max = min;
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                max = count(ps);
            }
            if (min < 0 || ps->p >= ps->end || *ps->p != '}') {
                /* Not a quantifier: a literal '{' (ECMA-262 Annex B). */
                ps->p = save;
                return atom;
            }
            ps->p++;
            /* An upper count over the limit is lowered to it where a smaller
             * language will do (GRAM_RE_SUBSET): what matches still matches
             * the pattern as written. */
            if (max > MAX_REPEAT && (ps->flags & GRAM_RE_SUBSET) && min <= MAX_REPEAT) max = MAX_REPEAT;
            if (min > MAX_REPEAT || max > MAX_REPEAT) return fail_at(ps, QERR_LIMIT, "a repetition count over 1000");
            if (max >= 0 && max < min) return fail_at(ps, QERR_INVAL, "a repetition {n,m} with m < n");
        } else {
            return atom;
        }
        if (ps->p < ps->end && *ps->p == '?') ps->p++; /* lazy: the same language */
        else if (ps->p < ps->end && *ps->p == '+') return fail_at(ps, QERR_INVAL, "possessive repetition is not supported");
        int n = new_node(ps, N_REP);
        if (n < 0) return -1;
        ps->nodes[n].a = atom, ps->nodes[n].min = min, ps->nodes[n].max = max;
        atom = n;
    }
    return atom;
}

/* A sequence up to '|', ')' or the end; -1 for an empty one (or error). */
static int parse_cat(parser *ps)
{
    int seq = -1;
    while (ps->p < ps->end && *ps->p != '|' && *ps->p != ')' && !ps->rc) {
        /* A '$' that ends a top-level alternative is its anchor. */
        if (*ps->p == '$' && ps->depth == 0 && (ps->p + 1 == ps->end || ps->p[1] == '|')) break;
        int a = parse_atom(ps);
        if (a < 0) return -1;
        a = parse_repeat(ps, a);
        if (a < 0) return -1;
        seq = bin(ps, N_CAT, seq, a);
    }
    return seq;
}

static int parse_alt(parser *ps)
{
    int alt = parse_cat(ps);
    if (alt < 0 && !ps->rc) alt = new_node(ps, N_EMPTY);
    while (!ps->rc && ps->p < ps->end && *ps->p == '|') {
        ps->p++;
        int b = parse_cat(ps);
        if (b < 0 && !ps->rc) b = new_node(ps, N_EMPTY);
        alt = bin(ps, N_ALT, alt, b);
    }
    return ps->rc ? -1 : alt;
}

/* The top level: alternatives, each with its own anchors; an unanchored
 * side gets "any string" (unless GRAM_RE_FULL). */
static int parse_top(parser *ps)
{
    int top = -1;
    for (;;) {
        int anchored_start = 0, anchored_end = 0;
        if (ps->p < ps->end && *ps->p == '^') anchored_start = 1, ps->p++;
        /* The alternative's text ends at the next top-level '|'; a '$' just
         * before it (not escaped) anchors its end. */
        int alt = parse_cat(ps);
        if (ps->rc) return -1;
        if (ps->p < ps->end && *ps->p == '$') {
            anchored_end = 1;
            ps->p++;
            if (ps->p < ps->end && *ps->p != '|')
                return fail_at(ps, QERR_INVAL, "anchors (^ $) only at the ends of the pattern's alternatives");
        }
        if (ps->p < ps->end && *ps->p == ')') return fail_at(ps, QERR_INVAL, "unmatched )");
        if (!(ps->flags & GRAM_RE_FULL)) {
            if (!anchored_start) {
                int any = any_node(ps, 0), star = new_node(ps, N_REP);
                if (star < 0) return -1;
                ps->nodes[star].a = any, ps->nodes[star].min = 0, ps->nodes[star].max = -1;
                alt = bin(ps, N_CAT, star, alt);
            }
            if (!anchored_end) {
                int any = any_node(ps, 0), star = new_node(ps, N_REP);
                if (star < 0) return -1;
                ps->nodes[star].a = any, ps->nodes[star].min = 0, ps->nodes[star].max = -1;
                alt = bin(ps, N_CAT, alt, star);
            }
        }
        if (alt < 0) alt = new_node(ps, N_EMPTY);
        top = bin(ps, N_ALT, top, alt);
        if (ps->p >= ps->end) break;
        ps->p++; /* '|' */
    }
    return ps->rc ? -1 : top;
}

/* ---- the NFA ----------------------------------------------------------------------- */

typedef gram_nfa nfa;

static int nfa_state(nfa *a) { return gram_nfa_state(a); }

static void nfa_edge(nfa *a, int from, int to, int lo, int hi) { gram_nfa_edge(a, from, to, GRAM_BYTES, lo, hi); }

#define EPS(a, f, t) GRAM_EPS_EDGE(a, f, t)

/* A path of n byte ranges from s to t. */
static void nfa_path(nfa *a, int s, int t, const uint8_t *lo, const uint8_t *hi, int n)
{
    int cur = s;
    for (int i = 0; i < n; i++) {
        int nx = i == n - 1 ? t : nfa_state(a);
        nfa_edge(a, cur, nx, lo[i], hi[i]);
        cur = nx;
    }
}

/* Byte paths from s to t for the UTF-8 encodings of [lo, hi]. */
static void utf8_split(nfa *a, int s, int t, uint32_t lo, uint32_t hi)
{
    if (lo > hi || a->rc) return;
    static const uint32_t bounds[3] = { 0x7F, 0x7FF, 0xFFFF };
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && hi > bounds[i]) {
            utf8_split(a, s, t, lo, bounds[i]);
            utf8_split(a, s, t, bounds[i] + 1, hi);
            return;
        }
    const int n = qutf8_enc_len(lo);
    for (int i = 1; i < n; i++) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                utf8_split(a, s, t, lo, lo | m);
                utf8_split(a, s, t, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_split(a, s, t, lo, (hi & ~m) - 1);
                utf8_split(a, s, t, hi & ~m, hi);
                return;
            }
        }
    }
    uint8_t bl[4], bh[4];
    qutf8_encode(lo, (char *)bl);
    qutf8_encode(hi, (char *)bh);
    nfa_path(a, s, t, bl, bh, n);
}

/* The JSON escape of control character c (< 0x20): a path from s to t. */
static void json_control(nfa *a, int s, int t, uint32_t c)
{
    static const char shortc[] = { 'b', 't', 'n', 0, 'f', 'r' }; /* 8..13; 11 has none */
    uint8_t b[6];
    if (c >= 8 && c <= 13 && shortc[c - 8]) {
        b[0] = '\\', b[1] = (uint8_t)shortc[c - 8];
        nfa_path(a, s, t, b, b, 2);
        return;
    }
    static const char hex[] = "0123456789abcdef";
    b[0] = '\\', b[1] = 'u', b[2] = '0', b[3] = '0', b[4] = (uint8_t)hex[c >> 4], b[5] = (uint8_t)hex[c & 15];
    nfa_path(a, s, t, b, b, 6);
}

/* The code points of set as bytes from s to t (JSON-string mode: the ones
 * a JSON string escapes as their escapes). */
static void nfa_set(nfa *a, int s, int t, const cset *set, int json)
{
    for (int i = 0; i < set->n; i++) {
        uint32_t lo = set->r[i].lo, hi = set->r[i].hi;
        if (json) {
            for (uint32_t c = lo; c <= hi && c < 0x20; c++) json_control(a, s, t, c);
            if (lo < 0x20) lo = 0x20;
            for (uint32_t c = '"'; c <= '\\'; c += '\\' - '"')
                if (lo <= c && c <= hi) {
                    uint8_t b[2] = { '\\', (uint8_t)c };
                    nfa_path(a, s, t, b, b, 2);
                    utf8_split(a, s, t, lo, c - 1);
                    lo = c + 1;
                }
        }
        utf8_split(a, s, t, lo, hi);
    }
}

static void nfa_node(nfa *a, const node *nodes, int n, int json, int *in, int *out, int depth);

/* The repeated node of an N_REP (gram_nfa_repeat's part). */
typedef struct {
    const node *nodes;
    int n, json, depth;
} rep_ctx;

static void rep_part(gram_nfa *a, void *ctx, int *in, int *out)
{
    const rep_ctx *r = ctx;
    nfa_node(a, r->nodes, r->n, r->json, in, out, r->depth);
}

/* Node n between fresh states: its start to *in, end to *out. */
static void nfa_node(nfa *a, const node *nodes, int n, int json, int *in, int *out, int depth)
{
    *in = nfa_state(a);
    *out = nfa_state(a);
    if (a->rc) return;
    if (depth > 10000) {
        a->rc = QERR_LIMIT;
        return;
    }
    const node *x = &nodes[n];
    int i1, o1, i2, o2;
    switch (x->t) {
    case N_EMPTY:
        EPS(a, *in, *out);
        break;
    case N_SET:
        nfa_set(a, *in, *out, &x->set, json);
        break;
    case N_CAT:
        nfa_node(a, nodes, x->a, json, &i1, &o1, depth + 1);
        nfa_node(a, nodes, x->b, json, &i2, &o2, depth + 1);
        EPS(a, *in, i1);
        EPS(a, o1, i2);
        EPS(a, o2, *out);
        break;
    case N_ALT:
        nfa_node(a, nodes, x->a, json, &i1, &o1, depth + 1);
        nfa_node(a, nodes, x->b, json, &i2, &o2, depth + 1);
        EPS(a, *in, i1);
        EPS(a, *in, i2);
        EPS(a, o1, *out);
        EPS(a, o2, *out);
        break;
    case N_REP: {
        rep_ctx rc_ = { nodes, x->a, json, depth + 1 };
        gram_nfa_repeat(a, *in, *out, x->min, x->max, rep_part, &rc_);
        break;
    }
    }
}

/* ---- the DFA ----------------------------------------------------------------------- */

struct gram_re {
    int n_states, n_classes;
    uint8_t cls[256];
    int32_t *next;      /* (n_states, n_classes); -1 dead */
    uint8_t *accept;    /* (n_states) */
    int n_runs;         /* runs of bytes of one class: run r starts at byte run_lo[r] */
    uint8_t run_lo[256];
};

static int prune(gram_re *re);

/* The runs of cls (set once cls is). */
static void set_runs(gram_re *re)
{
    re->n_runs = 0;
    for (int b = 0; b < 256; b++)
        if (!b || re->cls[b] != re->cls[b - 1]) re->run_lo[re->n_runs++] = (uint8_t)b;
}

static int build_dfa(const nfa *a, int start, int accept, gram_re *re, char *err, size_t errlen)
{
    /* Byte classes: bytes that start a range, or follow one, begin a class. */
    uint8_t cut[257] = { 0 };
    cut[0] = 1;
    for (int i = 0; i < a->n_e; i++)
        if (a->e[i].sym == GRAM_BYTES) cut[a->e[i].lo] = 1, cut[a->e[i].hi + 1] = 1;
    int nc = 0;
    for (int b = 0; b < 256; b++) {
        nc += cut[b];
        re->cls[b] = (uint8_t)(nc - 1);
    }
    re->n_classes = nc;
    gram_sets m = { 0 };
    gram_moves mv = { 0 };
    gram_closures cl = { 0 };
    int32_t *set = q_mallocn((size_t)a->n_s, sizeof *set), *stack = q_mallocn((size_t)a->n_s, sizeof *stack);
    uint32_t *mark = calloc((size_t)a->n_s, sizeof *mark);
    int rc = 0, cap_next = 0;
    uint32_t stamp = 0;
    long long work = 0;
    const gram_limits *lim = gram_limits_now();
    if (!set || !stack || !mark) rc = QERR_NOMEM;
    if (!rc) {
        set[0] = start;
        int n = gram_nfa_closure(a, set, 1, mark, ++stamp, stack);
        if (gram_sets_get(&m, set, n, mark, stamp) < 0) rc = QERR_NOMEM;
    }
    for (int d = 0; !rc && d < m.n; d++) {
        if (m.n > cap_next) {
            int cap = cap_next ? cap_next * 2 : 16;
            while (cap < m.n) cap *= 2;
            int32_t *nx = q_reallocn(re->next, (size_t)cap * (size_t)nc, sizeof *nx);
            uint8_t *ac = nx ? realloc(re->accept, (size_t)cap) : NULL;
            if (nx) re->next = nx;
            if (!ac) {
                rc = QERR_NOMEM;
                break;
            }
            re->accept = ac, cap_next = cap;
        }
        const int32_t *cur = m.items + m.off[d];
        const int len = m.len[d];
        work += (long long)len * nc;
        if (work > lim->re_work || (!(d & 15) && gram_late())) {
            rc = QERR_LIMIT;
            break;
        }
        re->accept[d] = 0;
        for (int i = 0; i < len; i++) re->accept[d] |= cur[i] == accept;
        if (gram_nfa_moves(a, cur, len, re->cls, nc, NULL, 0, &mv)) {
            rc = QERR_NOMEM;
            break;
        }
        for (int c = 0; c < nc && !rc; c++) {
            const int n = gram_moves_set(&mv, c, set, mark, ++stamp);
            if (!n) {
                re->next[(size_t)d * (size_t)nc + (size_t)c] = -1;
                continue;
            }
            const int id = gram_closure_id(a, &cl, &m, set, n, mark, &stamp, stack);
            if (id < 0) {
                rc = QERR_NOMEM;
                break;
            }
            work += m.len[id]; /* the closure's size, whether made now or looked up */
            if (m.n > lim->re_states) rc = QERR_LIMIT;
            else re->next[(size_t)d * (size_t)nc + (size_t)c] = id;
        }
    }
    re->n_states = m.n;
    set_runs(re);
    /* Every subset reaches an accepting one when every NFA state reaches
     * the NFA's accepting state (a word that leads one member there leads
     * the subset to a subset holding it): then there is nothing to prune. */
    if (!rc) {
        const int all = gram_nfa_all_reach(a, accept);
        rc = all < 0 ? QERR_NOMEM : all ? 0 : prune(re);
    }
    gram_sets_free(&m);
    gram_moves_free(&mv);
    gram_closures_free(&cl);
    free(set);
    free(stack);
    free(mark);
    if (rc == QERR_LIMIT && gram_late())
        return qerr_set(err, errlen, rc, "pattern: compiling took longer than the time budget (%g s)", lim->seconds);
    if (rc == QERR_LIMIT)
        return qerr_set(err, errlen, rc, "pattern: too complex (more than %d automaton states, or too much work to build them)",
                        lim->re_states);
    if (rc) return qerr_set(err, errlen, rc, "pattern: out of memory");
    return 0;
}

int gram_re_compile(const char *pattern, size_t len, unsigned flags, gram_re **out, char *err, size_t errlen)
{
    *out = NULL;
    parser ps = { pattern, pattern + len, pattern, flags, NULL, 0, 0, 0, err, errlen, 0 };
    int top = parse_top(&ps);
    nfa a = { 0 };
    a.max_s = gram_limits_now()->re_nfa;
    gram_re *re = NULL;
    int rc = ps.rc;
    if (!rc && top >= 0) {
        int in, fin;
        nfa_node(&a, ps.nodes, top, (flags & GRAM_RE_JSON_STRING) != 0, &in, &fin, 0);
        if (a.rc) {
            rc = a.rc;
            if (rc == QERR_LIMIT)
                qerr_set(err, errlen, rc, "pattern: too large an automaton (more than %d NFA states)", a.max_s);
            else
                qerr_set(err, errlen, rc, "pattern: out of memory");
        } else if (!(re = calloc(1, sizeof *re))) {
            rc = qerr_set(err, errlen, QERR_NOMEM, "pattern: out of memory");
        } else {
            a.fin1 = fin + 1;
            rc = build_dfa(&a, in, fin, re, err, errlen);
        }
    } else if (!rc) {
        rc = qerr_set(err, errlen, QERR_INVAL, "pattern: cannot parse");
    }
    for (int i = 0; i < ps.n_nodes; i++)
        if (ps.nodes[i].t == N_SET) free(ps.nodes[i].set.r);
    free(ps.nodes);
    gram_nfa_free(&a);
    if (rc) {
        gram_re_free(re);
        return rc;
    }
    *out = re;
    return 0;
}

void gram_re_free(gram_re *re)
{
    if (!re) return;
    free(re->next);
    free(re->accept);
    free(re);
}

int gram_re_start(const gram_re *re)
{
    (void)re;
    return 0;
}

int gram_re_step(const gram_re *re, int s, uint8_t b)
{
    return re->next[(size_t)s * (size_t)re->n_classes + re->cls[b]];
}

int gram_re_ranges(const gram_re *re, int s, uint8_t *lo, uint8_t *hi, int32_t *to)
{
    const int32_t *row = re->next + (size_t)s * (size_t)re->n_classes;
    int n = 0;
    for (int r = 0; r < re->n_runs; r++) {
        const int32_t t = row[re->cls[re->run_lo[r]]];
        if (n && to[n - 1] == t) continue;
        if (n) hi[n - 1] = (uint8_t)(re->run_lo[r] - 1);
        lo[n] = re->run_lo[r], to[n] = t, n++;
    }
    hi[n - 1] = 255;
    return n;
}

int gram_re_accepts(const gram_re *re, int s) { return s >= 0 && re->accept[s]; }

int gram_re_states(const gram_re *re) { return re->n_states; }

int gram_re_match(const gram_re *re, const char *s, size_t n)
{
    int st = gram_re_start(re);
    for (size_t i = 0; i < n && st >= 0; i++) st = gram_re_step(re, st, (uint8_t)s[i]);
    return gram_re_accepts(re, st);
}

/* ---- dead ends ----------------------------------------------------------------------------- */

/* Cuts every transition into a state from which no accepting state can be
 * reached (products of automata have them; a bounded length reached before
 * the pattern's end is one), so that gram_re_step's -1 means "cannot match"
 * as soon as the bytes say so.  0 or QERR_NOMEM. */
static int prune(gram_re *re)
{
    const int n = re->n_states, nc = re->n_classes;
    const size_t ne = (size_t)n * (size_t)nc;
    int32_t *deg = calloc((size_t)n + 1, sizeof *deg), *from = q_mallocn(ne ? ne : 1, sizeof *from);
    int32_t *queue = q_mallocn((size_t)n + 1, sizeof *queue);
    uint8_t *live = calloc((size_t)n + 1, 1);
    int rc = deg && from && queue && live ? 0 : QERR_NOMEM;
    if (!rc) {
        /* Reverse edges, grouped by target (counting sort). */
        for (size_t i = 0; i < ne; i++)
            if (re->next[i] >= 0) deg[re->next[i] + 1]++;
        for (int t = 0; t < n; t++) deg[t + 1] += deg[t];
        int32_t *fill = q_mallocn((size_t)n + 1, sizeof *fill);
        if (!fill) rc = QERR_NOMEM;
        for (int t = 0; !rc && t <= n; t++) fill[t] = deg[t];
        for (size_t i = 0; !rc && i < ne; i++)
            if (re->next[i] >= 0) from[fill[re->next[i]]++] = (int32_t)(i / (size_t)nc);
        free(fill);
    }
    if (!rc) {
        int head = 0, tail = 0;
        for (int t = 0; t < n; t++)
            if (re->accept[t]) live[t] = 1, queue[tail++] = t;
        while (head < tail) {
            const int t = queue[head++];
            for (int32_t k = deg[t]; k < deg[t + 1]; k++)
                if (!live[from[k]]) live[from[k]] = 1, queue[tail++] = from[k];
        }
        for (size_t i = 0; i < ne; i++)
            if (re->next[i] >= 0 && !live[re->next[i]]) re->next[i] = -1;
    }
    free(deg);
    free(from);
    free(queue);
    free(live);
    return rc;
}

int gram_re_empty(const gram_re *re)
{
    /* Dead ends are pruned: a start that cannot match has no way out. */
    if (re->accept[0]) return 0;
    for (int k = 0; k < re->n_classes; k++)
        if (re->next[k] >= 0) return 0;
    return 1;
}

/* ---- multiples ------------------------------------------------------------------------------ */

int gram_re_multiples(int k, gram_re **out, char *err, size_t errlen)
{
    *out = NULL;
    if (k < 1 || k > gram_limits_now()->re_states - 3) return qerr_set(err, errlen, QERR_LIMIT, "multipleOf %d: too large", k);
    /* States: 0 start, 1 after '-', 2 a lone 0, 3 + r: digits read so far,
     * their value r modulo k.  Classes: '-', '0', '1'..'9' one each, the rest. */
    gram_re *re = calloc(1, sizeof *re);
    const int n = 3 + k, nc = 12;
    if (!re) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    re->n_states = n, re->n_classes = nc;
    re->next = q_mallocn((size_t)n * nc, sizeof *re->next);
    re->accept = calloc((size_t)n, 1);
    if (!re->next || !re->accept) {
        gram_re_free(re);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    for (int b = 0; b < 256; b++) re->cls[b] = b == '-' ? 10 : (b >= '0' && b <= '9') ? (uint8_t)(b - '0') : 11;
    for (size_t i = 0; i < (size_t)n * nc; i++) re->next[i] = -1;
    for (int d = 1; d <= 9; d++) {
        re->next[0 * nc + d] = 3 + d % k;
        re->next[1 * nc + d] = 3 + d % k;
    }
    re->next[0 * nc + 0] = 2;
    re->next[0 * nc + 10] = 1;
    for (int r = 0; r < k; r++)
        for (int d = 0; d <= 9; d++) re->next[(size_t)(3 + r) * nc + d] = 3 + (int)((10LL * r + d) % k);
    re->accept[2] = 1, re->accept[3] = 1;
    set_runs(re);
    const int rc = prune(re);
    if (rc) {
        gram_re_free(re);
        return qerr_set(err, errlen, rc, "out of memory");
    }
    *out = re;
    return 0;
}

/* ---- intersection ------------------------------------------------------------------------- */

/* Product states met, by pair: open addressing over pair keys (a x ny + b),
 * room kept at twice the states, so memory follows the states made, not
 * the product of the two automata's sizes. */
typedef struct {
    uint64_t *key; /* key + 1, 0 empty */
    int32_t *val;
    size_t cap;
} pairmap;

static uint64_t pair_hash(uint64_t k)
{
    k = (k ^ (k >> 31)) * 0x7fb5d329728ea185ULL;
    return k ^ (k >> 29);
}

/* The product state of key k, or -1 when not met. */
static int32_t pair_get(const pairmap *p, uint64_t k)
{
    for (size_t j = pair_hash(k) & (p->cap - 1);; j = (j + 1) & (p->cap - 1)) {
        if (!p->key[j]) return -1;
        if (p->key[j] == k + 1) return p->val[j];
    }
}

/* Keeps k -> v (k not met); n: the states kept so far.  0 or QERR_NOMEM. */
static int pair_put(pairmap *p, uint64_t k, int32_t v, int n)
{
    if ((size_t)(n + 1) * 2 > p->cap) {
        pairmap q = { NULL, NULL, p->cap ? p->cap * 2 : 256 };
        q.key = q_callocn(q.cap, sizeof *q.key);
        q.val = q_mallocn(q.cap, sizeof *q.val);
        if (!q.key || !q.val) {
            free(q.key);
            free(q.val);
            return QERR_NOMEM;
        }
        for (size_t i = 0; i < p->cap; i++)
            if (p->key[i]) {
                size_t j = pair_hash(p->key[i] - 1) & (q.cap - 1);
                while (q.key[j]) j = (j + 1) & (q.cap - 1);
                q.key[j] = p->key[i], q.val[j] = p->val[i];
            }
        free(p->key);
        free(p->val);
        *p = q;
    }
    size_t j = pair_hash(k) & (p->cap - 1);
    while (p->key[j]) j = (j + 1) & (p->cap - 1);
    p->key[j] = k + 1, p->val[j] = v;
    return 0;
}

/* The product of x and y: with and_not, the inputs x matches and y does
 * not (y may die: its dead state is index ny). */
static int combine(const gram_re *x, const gram_re *y, int and_not, gram_re **out, char *err, size_t errlen)
{
    *out = NULL;
    const int ny = y->n_states + (and_not ? 1 : 0);
    const gram_limits *lim = gram_limits_now();
    /* Joint classes: bytes in one class of x and one of y, numbered in
     * order of their first byte; all bytes of one act alike on every pair. */
    uint8_t jcls[256], jrep[256];
    int nj = 0;
    int16_t *joint = q_mallocn((size_t)x->n_classes * (size_t)y->n_classes, sizeof *joint);
    /* Product states by pair, breadth first; a column a joint class,
     * compressed after. */
    pairmap ids = { 0 };
    int32_t *pairs = NULL, *wide = NULL;
    int n = 0, cap = 0, rc = 0;
    gram_re *re = calloc(1, sizeof *re);
    if (!re || !joint) rc = QERR_NOMEM;
    if (!rc) {
        memset(joint, 0xff, sizeof *joint * (size_t)x->n_classes * (size_t)y->n_classes);
        for (int c = 0; c < 256; c++) {
            int16_t *j = &joint[(size_t)x->cls[c] * (size_t)y->n_classes + y->cls[c]];
            if (*j < 0) jrep[nj] = (uint8_t)c, *j = (int16_t)nj++;
            jcls[c] = (uint8_t)*j;
        }
        cap = 64;
        pairs = q_mallocn((size_t)cap, 2 * sizeof *pairs);
        wide = q_mallocn((size_t)cap, (size_t)nj * sizeof *wide);
        if (!pairs || !wide || pair_put(&ids, 0, 0, 0)) rc = QERR_NOMEM; /* both start at 0 */
        else pairs[0] = 0, pairs[1] = 0, n = 1;
    }
    free(joint);
    for (int s = 0; !rc && s < n; s++) {
        if (!(s & 15) && gram_late()) {
            rc = QERR_LIMIT;
            break;
        }
        const int a = pairs[2 * s], b = pairs[2 * s + 1];
        for (int j = 0; j < nj; j++) {
            const uint8_t c = jrep[j];
            const int na = gram_re_step(x, a, c);
            int nb = na < 0 || b == y->n_states ? -1 : gram_re_step(y, b, c);
            if (and_not && nb < 0) nb = y->n_states; /* y is dead: it never matches */
            int t = -1;
            if (na >= 0 && nb >= 0) {
                const uint64_t k = (uint64_t)na * (uint64_t)ny + (uint64_t)nb;
                t = pair_get(&ids, k);
                if (t < 0) {
                    if (n >= lim->re_states) {
                        rc = QERR_LIMIT;
                        break;
                    }
                    if (n == cap) {
                        cap *= 2;
                        int32_t *p2 = q_reallocn(pairs, (size_t)cap, 2 * sizeof *p2);
                        if (p2) pairs = p2;
                        int32_t *w2 = p2 ? q_reallocn(wide, (size_t)cap, (size_t)nj * sizeof *w2) : NULL;
                        if (!w2) {
                            rc = QERR_NOMEM;
                            break;
                        }
                        wide = w2;
                    }
                    if (pair_put(&ids, k, n, n)) {
                        rc = QERR_NOMEM;
                        break;
                    }
                    pairs[2 * n] = na, pairs[2 * n + 1] = nb;
                    t = n++;
                }
            }
            wide[(size_t)s * (size_t)nj + (size_t)j] = t;
        }
    }
    if (!rc) {
        /* Byte classes: bytes whose columns are equal, numbered in order of
         * their first byte (a joint class's bytes share a column). */
        int nc = 0;
        uint8_t rep[256], fin[256];
        for (int j = 0; j < nj; j++) {
            int same = -1;
            for (int k = 0; k < nc && same < 0; k++) {
                int eq = 1;
                for (int s = 0; s < n && eq; s++)
                    eq = wide[(size_t)s * (size_t)nj + (size_t)j] == wide[(size_t)s * (size_t)nj + rep[k]];
                if (eq) same = k;
            }
            if (same < 0) rep[nc] = (uint8_t)j, same = nc++;
            fin[j] = (uint8_t)same;
        }
        for (int c = 0; c < 256; c++) re->cls[c] = fin[jcls[c]];
        set_runs(re);
        re->n_states = n, re->n_classes = nc;
        re->next = q_mallocn((size_t)n * (size_t)nc, sizeof *re->next);
        re->accept = malloc((size_t)n);
        if (!re->next || !re->accept) rc = QERR_NOMEM;
        for (int s = 0; !rc && s < n; s++) {
            const int yb = pairs[2 * s + 1], ya = yb < y->n_states && y->accept[yb];
            re->accept[s] = (uint8_t)(x->accept[pairs[2 * s]] && (and_not ? !ya : ya));
            for (int k = 0; k < nc; k++) re->next[(size_t)s * (size_t)nc + (size_t)k] = wide[(size_t)s * (size_t)nj + rep[k]];
        }
        if (!rc) rc = prune(re);
    }
    free(ids.key);
    free(ids.val);
    free(pairs);
    free(wide);
    if (rc) {
        gram_re_free(re);
        if (rc == QERR_LIMIT && gram_late())
            return qerr_set(err, errlen, rc, "pattern: compiling took longer than the time budget (%g s)", lim->seconds);
        return rc == QERR_LIMIT ? qerr_set(err, errlen, rc, "pattern: the intersection has more than %d states", lim->re_states)
                                : qerr_set(err, errlen, rc, "pattern: out of memory");
    }
    *out = re;
    return 0;
}

int gram_re_intersect(const gram_re *x, const gram_re *y, gram_re **out, char *err, size_t errlen)
{
    return combine(x, y, 0, out, err, errlen);
}

int gram_re_minus(const gram_re *x, const gram_re *y, gram_re **out, char *err, size_t errlen)
{
    return combine(x, y, 1, out, err, errlen);
}
