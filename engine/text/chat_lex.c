/* chat_lex.c - template text to tokens, as jinja2 3.1's lexer does it.
 *
 * The lexer mirrors jinja2/lexer.py configured as HF transformers configures
 * it (trim_blocks=True, lstrip_blocks=True, default delimiters).  It is a
 * hand-written version of the same regular expressions, so that the subtle
 * whitespace rules come out byte-identical:
 *
 *  1. Newlines are normalised first (qcj_lex does it on a copy): "\r\n" and "\r" become "\n", and one
 *     trailing newline at the very end of the source is dropped
 *     (keep_trailing_newline=False).
 *  2. Text runs up to the next "{{", "{%" or "{#".  A tag may carry a sign
 *     right after its opening: "-" strips all whitespace (str.rstrip) from
 *     the text before it; "+" disables lstrip_blocks for it.
 *  3. lstrip_blocks: for "{%" and "{#" (not "{{"), when the text between the
 *     last newline (or the start of a line) and the tag is only whitespace,
 *     that whitespace is dropped.  "Start of a line" without a newline in the
 *     text means the previous match ended with "\n" (line_starting), e.g.
 *     after a "%}" whose newline trim_blocks ate.
 *  4. trim_blocks: "%}" and "#}" swallow one directly following "\n"; "-%}",
 *     "-}}" and "-#}" swallow all following whitespace; "+%}" swallows none.
 *  5. Inside a tag, the end delimiter is recognised only while (), [] and {}
 *     are balanced, so "{{ {'a': {'b': 1}} }}" works.
 *  6. String literals are decoded as Python's unicode-escape after
 *     backslashreplace, including its odd corners ("\é" stays "\xe9").
 *  7. {% raw %}...{% endraw %} yields its content as text.
 *
 * Whitespace is Python's (str.isspace), so a no-break space counts.
 * Positions: line numbers as jinja2 counts them, columns in bytes.
 */
#include "chat_int.h"
#include "qerr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    qcj_ctx *c;
    const char *s; /* normalised source */
    size_t n;
    size_t pos;
    int line;
    size_t line_start;
    qcj_tok *toks;
    size_t ntoks, cap;
    int line_starting;
} lexer;

static _Noreturn void lfail(lexer *L, size_t at, const char *fmt, const char *arg)
{
    /* Recompute line/col at `at` (errors are rare; a scan is fine). */
    int line = 1;
    size_t ls = 0;
    for (size_t i = 0; i < at && i < L->n; i++)
        if (L->s[i] == '\n') {
            line++;
            ls = i + 1;
        }
    char m[256];
    snprintf(m, sizeof m, fmt, arg);
    qcj_fail(L->c, QERR_FORMAT, 0, "line %d, col %zu: %s", line, at - ls + 1, m);
}

/* Advances line bookkeeping over s[from, to). */
static void count_lines(lexer *L, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (L->s[i] == '\n') {
            L->line++;
            L->line_start = i + 1;
        }
}

static qcj_tok *push(lexer *L, int type, size_t at)
{
    if (L->ntoks == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        qcj_tok *nt = qcj_allocn(L->c, nc, sizeof *nt);
        if (L->ntoks) memcpy(nt, L->toks, L->ntoks * sizeof *nt);
        L->toks = nt;
        L->cap = nc;
    }
    qcj_tok *t = &L->toks[L->ntoks++];
    memset(t, 0, sizeof *t);
    t->t = (uint8_t)type;
    /* count_lines() has been called up to `at` by every caller */
    t->line = L->line;
    t->col = (int)(at >= L->line_start ? at - L->line_start + 1 : 1);
    return t;
}

/* Is there a whitespace code point at p?  Returns its length or 0. */
static size_t ws_at(const lexer *L, size_t p)
{
    if (p >= L->n) return 0;
    unsigned char ch = (unsigned char)L->s[p];
    if (ch < 0x80) return qcj_isspace(ch) ? 1 : 0;
    uint32_t cp;
    size_t k = qutf8_decode(L->s + p, L->n - p, &cp);
    return qcj_isspace(cp) ? k : 0;
}

static size_t skip_ws(const lexer *L, size_t p)
{
    size_t k;
    while ((k = ws_at(L, p)) > 0) p += k;
    return p;
}

/* Length of text[from, to) after Python's rstrip(). */
static size_t rstrip_end(const lexer *L, size_t from, size_t to)
{
    while (to > from) {
        size_t q = to - 1;
        while (q > from && ((unsigned char)L->s[q] & 0xC0) == 0x80) q--;
        uint32_t cp;
        qutf8_decode(L->s + q, to - q, &cp);
        if (!qcj_isspace(cp)) break;
        to = q;
    }
    return to;
}

/* Emits text[from, to) with the sign/lstrip rules applied (rule 2, 3). */
static void emit_text(lexer *L, size_t from, size_t to, char sign, int lstrip_ok)
{
    size_t end = to;
    if (sign == '-') {
        end = rstrip_end(L, from, to);
    } else if (sign != '+' && lstrip_ok) {
        size_t lpos = from;
        for (size_t i = to; i > from; i--)
            if (L->s[i - 1] == '\n') {
                lpos = i;
                break;
            }
        if ((lpos > from || L->line_starting) && lpos < to && skip_ws(L, lpos) == to) end = lpos;
    }
    if (end > from) {
        qcj_tok *t = push(L, T_DATA, from);
        t->s = L->s + from;
        t->slen = end - from;
    }
    count_lines(L, from, to);
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static int is_alpha(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }

/* (\d+_)*\d+ at p; returns the end or 0 when absent. */
static size_t scan_digits(const lexer *L, size_t p)
{
    if (p >= L->n || !is_digit(L->s[p])) return 0;
    for (;;) {
        while (p < L->n && is_digit(L->s[p])) p++;
        if (p + 1 < L->n && L->s[p] == '_' && is_digit(L->s[p + 1])) {
            p++;
            continue;
        }
        return p;
    }
}

/* jinja2's float_re at p; returns the end or 0. */
static size_t scan_float(const lexer *L, size_t p)
{
    if (p > 0 && L->s[p - 1] == '.') return 0;
    size_t e = scan_digits(L, p);
    if (!e) return 0;
    size_t frac = 0;
    if (e < L->n && L->s[e] == '.') frac = scan_digits(L, e + 1);
    size_t x = frac ? frac : e;
    if (x < L->n && (L->s[x] == 'e' || L->s[x] == 'E')) {
        size_t q = x + 1;
        if (q < L->n && (L->s[q] == '+' || L->s[q] == '-')) q++;
        size_t ee = scan_digits(L, q);
        if (ee) return ee;
    }
    if (frac) {
        /* with a fraction but no exponent: the first alternative needed an
         * exponent, the second takes the fraction alone */
        return frac;
    }
    /* no fraction: the exponent form without fraction was tried above */
    return 0;
}

static int digit_val(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return 99;
}

/* (_?D)+ for digits below base; returns end or 0. */
static size_t scan_based(const lexer *L, size_t p, int base)
{
    size_t q = p, last = 0;
    for (;;) {
        size_t r = q;
        if (r < L->n && L->s[r] == '_') r++;
        if (r < L->n && digit_val(L->s[r]) < base) {
            q = r + 1;
            last = q;
        } else {
            return last;
        }
    }
}

/* jinja2's integer_re at p; returns the end or 0 and the value base. */
static size_t scan_int(const lexer *L, size_t p, int *base)
{
    if (p >= L->n || !is_digit(L->s[p])) return 0;
    if (L->s[p] == '0' && p + 1 < L->n) {
        char k = L->s[p + 1];
        int b = (k == 'b' || k == 'B') ? 2 : (k == 'o' || k == 'O') ? 8 : (k == 'x' || k == 'X') ? 16 : 0;
        if (b) {
            size_t e = scan_based(L, p + 2, b);
            if (e) {
                *base = b;
                return e;
            }
        }
    }
    *base = 10;
    if (L->s[p] != '0') {
        size_t q = p + 1;
        for (;;) {
            size_t r = q;
            if (r < L->n && L->s[r] == '_') r++;
            if (r < L->n && is_digit(L->s[r]))
                q = r + 1;
            else
                return q;
        }
    }
    size_t q = p + 1; /* 0(_?0)* */
    for (;;) {
        size_t r = q;
        if (r < L->n && L->s[r] == '_') r++;
        if (r < L->n && L->s[r] == '0')
            q = r + 1;
        else
            return q;
    }
}

static void lex_int(lexer *L, size_t p, size_t e, int base)
{
    size_t i = p + (base == 10 ? 0 : 2);
    uint64_t v = 0;
    for (; i < e; i++) {
        if (L->s[i] == '_') continue;
        uint64_t d = (uint64_t)digit_val(L->s[i]);
        if (v > (UINT64_MAX - d) / (uint64_t)base) lfail(L, p, "%s", "integer literal too large");
        v = v * (uint64_t)base + d;
    }
    if (v > (uint64_t)INT64_MAX) lfail(L, p, "%s", "integer literal too large");
    qcj_tok *t = push(L, T_INT, p);
    t->i = (int64_t)v;
}

static void lex_float(lexer *L, size_t p, size_t e)
{
    char *tmp = qcj_alloc(L->c, e - p + 1);
    size_t k = 0;
    for (size_t i = p; i < e; i++)
        if (L->s[i] != '_') tmp[k++] = L->s[i];
    tmp[k] = 0;
    qcj_tok *t = push(L, T_FLOAT, p);
    t->f = strtod(tmp, NULL);
}

static int hexn(const char *p, size_t avail, int n, uint32_t *out)
{
    if ((size_t)n > avail) return 0;
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        int d = digit_val(p[i]);
        if (d > 15) return 0;
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 1;
}

/* Decodes a string literal body s[p, e) (rule 6). */
static void lex_string(lexer *L, size_t p, size_t e)
{
    /* Decoded text is never longer than 3x the source (a "\é" grows). */
    size_t cap = (e - p) * 3 + 1;
    char *out = qcj_alloc(L->c, cap);
    size_t k = 0;
    const char *s = L->s;
    size_t i = p + 1, end = e - 1;
    while (i < end) {
        char ch = s[i];
        if (ch != '\\') {
            out[k++] = ch;
            i++;
            continue;
        }
        char d = s[i + 1];
        i += 2;
        uint32_t cp = 0;
        int have = 1;
        switch (d) {
        case '\n': have = 0; break;
        case '\\': cp = '\\'; break;
        case '\'': cp = '\''; break;
        case '"': cp = '"'; break;
        case 'a': cp = 7; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        case 'v': cp = 11; break;
        case 'x':
            if (!hexn(s + i, end - i, 2, &cp)) lfail(L, p, "%s", "truncated \\xXX escape");
            i += 2;
            break;
        case 'u':
            if (!hexn(s + i, end - i, 4, &cp)) lfail(L, p, "%s", "truncated \\uXXXX escape");
            i += 4;
            break;
        case 'U':
            if (!hexn(s + i, end - i, 8, &cp)) lfail(L, p, "%s", "truncated \\UXXXXXXXX escape");
            if (cp > 0x10FFFF) lfail(L, p, "%s", "illegal Unicode character");
            i += 8;
            break;
        case 'N':
            lfail(L, p, "%s", "\\N{...} escapes are not supported");
        default:
            if (d >= '0' && d <= '7') {
                cp = (uint32_t)(d - '0');
                for (int n = 0; n < 2 && i < end && s[i] >= '0' && s[i] <= '7'; n++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
            } else if ((unsigned char)d >= 0x80) {
                /* backslashreplace turned the character into an escape whose
                 * backslash the preceding one then escaped */
                uint32_t c2;
                size_t len = qutf8_decode(s + i - 1, end - (i - 1), &c2);
                i = i - 1 + len;
                char tmp[16];
                int m = c2 < 0x100 ? snprintf(tmp, sizeof tmp, "\\x%02x", (unsigned)c2)
                      : c2 < 0x10000 ? snprintf(tmp, sizeof tmp, "\\u%04x", (unsigned)c2)
                                     : snprintf(tmp, sizeof tmp, "\\U%08x", (unsigned)c2);
                memcpy(out + k, tmp, (size_t)m);
                k += (size_t)m;
                have = 0;
            } else {
                out[k++] = '\\';
                cp = (uint32_t)(unsigned char)d;
            }
        }
        if (have) {
            if (cp >= 0xD800 && cp <= 0xDFFF) lfail(L, p, "%s", "surrogate code point in string literal");
            k += qutf8_encode(cp, out + k);
        }
    }
    out[k] = 0;
    qcj_tok *t = push(L, T_STRING, p);
    t->s = out;
    t->slen = k;
}

static const struct {
    const char *s;
    uint8_t op;
} OPS[] = {
    { "//", TK_FLOORDIV }, { "**", TK_POW }, { "==", TK_EQ }, { "!=", TK_NE }, { ">=", TK_GTEQ },
    { "<=", TK_LTEQ }, { "+", TK_ADD }, { "-", TK_SUB }, { "/", TK_DIV }, { "*", TK_MUL },
    { "%", TK_MOD }, { "~", TK_TILDE }, { "[", TK_LBRACKET }, { "]", TK_RBRACKET },
    { "(", TK_LPAREN }, { ")", TK_RPAREN }, { "{", TK_LBRACE }, { "}", TK_RBRACE },
    { ">", TK_GT }, { "<", TK_LT }, { "=", TK_ASSIGN }, { ".", TK_DOT }, { ":", TK_COLON },
    { "|", TK_PIPE }, { ",", TK_COMMA }, { ";", TK_SEMICOLON },
};

/* Tokens inside {{ }} or {% %}, up to and including the end delimiter. */
static void lex_tag(lexer *L, int is_block)
{
    char stack[256];
    size_t depth = 0;
    for (;;) {
        size_t p = L->pos;
        if (p >= L->n) return; /* the parser reports the missing end */
        const char *s = L->s + p;
        size_t left = L->n - p;
        if (depth == 0) {
            size_t e = 0;
            if (is_block) {
                if (left >= 3 && !memcmp(s, "+%}", 3)) e = p + 3;
                else if (left >= 3 && !memcmp(s, "-%}", 3)) e = skip_ws(L, p + 3);
                else if (left >= 2 && !memcmp(s, "%}", 2)) e = p + 2 + (left > 2 && s[2] == '\n');
            } else {
                if (left >= 3 && !memcmp(s, "-}}", 3)) e = skip_ws(L, p + 3);
                else if (left >= 2 && !memcmp(s, "}}", 2)) e = p + 2;
            }
            if (e) {
                push(L, is_block ? T_BLOCK_END : T_VAR_END, p);
                L->line_starting = L->s[e - 1] == '\n';
                count_lines(L, p, e);
                L->pos = e;
                return;
            }
        }
        size_t w = skip_ws(L, p);
        if (w > p) {
            count_lines(L, p, w);
            L->pos = w;
            continue;
        }
        size_t e = scan_float(L, p);
        if (e) {
            lex_float(L, p, e);
            L->pos = e;
            continue;
        }
        int base;
        e = scan_int(L, p, &base);
        if (e) {
            lex_int(L, p, e, base);
            L->pos = e;
            continue;
        }
        if (is_alpha(*s)) {
            e = p + 1;
            while (e < L->n && (is_alpha(L->s[e]) || is_digit(L->s[e]))) e++;
            char *name = qcj_alloc(L->c, e - p + 1);
            memcpy(name, s, e - p);
            name[e - p] = 0;
            qcj_tok *t = push(L, T_NAME, p);
            t->s = name;
            t->slen = e - p;
            L->pos = e;
            continue;
        }
        if (*s == '\'' || *s == '"') {
            size_t q = p + 1;
            while (q < L->n && L->s[q] != *s) q += (L->s[q] == '\\' && q + 1 < L->n) ? 2 : 1;
            if (q < L->n) {
                lex_string(L, p, q + 1);
                count_lines(L, p, q + 1);
                L->pos = q + 1;
                continue;
            }
        }
        size_t k;
        for (k = 0; k < sizeof OPS / sizeof OPS[0]; k++) {
            size_t ol = strlen(OPS[k].s);
            if (left >= ol && !memcmp(s, OPS[k].s, ol)) break;
        }
        if (k == sizeof OPS / sizeof OPS[0]) {
            char q[8];
            unsigned char ch = (unsigned char)*s;
            if (ch >= 0x20 && ch < 0x7f && ch != '\'') snprintf(q, sizeof q, "'%c'", ch);
            else if (ch == '\'') snprintf(q, sizeof q, "\"'\"");
            else snprintf(q, sizeof q, "'\\x%02x'", ch);
            lfail(L, p, "unexpected char %s", q);
        }
        uint8_t op = OPS[k].op;
        char ch = *s;
        if (ch == '{' || ch == '(' || ch == '[') {
            if (depth == sizeof stack) lfail(L, p, "%s", "brackets nested too deeply");
            stack[depth++] = ch == '{' ? '}' : ch == '(' ? ')' : ']';
        } else if (ch == '}' || ch == ')' || ch == ']') {
            if (depth == 0) {
                char m[4] = { ch, 0 };
                lfail(L, p, "unexpected '%s'", m);
            }
            char want = stack[--depth];
            if (want != ch) {
                char m[32];
                snprintf(m, sizeof m, "'%c', expected '%c'", ch, want);
                lfail(L, p, "unexpected %s", m);
            }
        }
        qcj_tok *t = push(L, T_OP, p);
        t->op = op;
        L->pos = p + strlen(OPS[k].s);
    }
}

/* Does "{%[-+]?\s*raw\s*(-%}\s*|%})" start at p?  Returns its end or 0. */
static size_t raw_begin(const lexer *L, size_t p)
{
    size_t q = p + 2;
    if (q < L->n && (L->s[q] == '-' || L->s[q] == '+')) q++;
    q = skip_ws(L, q);
    if (L->n - q < 3 || memcmp(L->s + q, "raw", 3)) return 0;
    q = skip_ws(L, q + 3);
    if (L->n - q >= 3 && !memcmp(L->s + q, "-%}", 3)) return skip_ws(L, q + 3);
    if (L->n - q >= 2 && !memcmp(L->s + q, "%}", 2)) return q + 2;
    return 0;
}

/* Finds "{%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)" from p.  Sets *tag (start),
 * *sign and returns the end, or 0. */
static size_t raw_end(const lexer *L, size_t p, size_t *tag, char *sign)
{
    for (size_t q = p; q + 1 < L->n; q++) {
        if (L->s[q] != '{' || L->s[q + 1] != '%') continue;
        size_t r = q + 2;
        char sg = 0;
        if (r < L->n && (L->s[r] == '-' || L->s[r] == '+')) sg = L->s[r++];
        r = skip_ws(L, r);
        if (L->n - r < 6 || memcmp(L->s + r, "endraw", 6)) continue;
        r = skip_ws(L, r + 6);
        size_t e = 0;
        if (L->n - r >= 3 && !memcmp(L->s + r, "+%}", 3)) e = r + 3;
        else if (L->n - r >= 3 && !memcmp(L->s + r, "-%}", 3)) e = skip_ws(L, r + 3);
        else if (L->n - r >= 2 && !memcmp(L->s + r, "%}", 2)) e = r + 2 + (r + 2 < L->n && L->s[r + 2] == '\n');
        if (!e) continue;
        *tag = q;
        *sign = sg;
        return e;
    }
    return 0;
}

void qcj_lex(qcj_ctx *c, const char *src, size_t len, qcj_tok **toks, size_t *ntoks)
{
    /* Rule 1: normalise newlines, drop one trailing newline. */
    char *s = qcj_alloc(c, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;

    lexer L = { .c = c, .s = s, .n = n, .line = 1, .line_starting = 1 };
    while (L.pos < L.n) {
        size_t p = L.pos;
        const char *hit = NULL;
        for (size_t q = p; q + 1 < n;) {
            const char *f = memchr(s + q, '{', n - q - 1);
            if (!f) break;
            if (f[1] == '{' || f[1] == '%' || f[1] == '#') {
                hit = f;
                break;
            }
            q = (size_t)(f - s) + 1;
        }
        if (!hit) {
            emit_text(&L, p, n, 0, 0);
            L.pos = n;
            break;
        }
        size_t at = (size_t)(hit - s);
        char kind = hit[1];
        size_t rb = kind == '%' ? raw_begin(&L, at) : 0;
        char sign = (at + 2 < n && (s[at + 2] == '-' || s[at + 2] == '+')) ? s[at + 2] : 0;
        emit_text(&L, p, at, sign, kind != '{');
        if (rb) {
            L.line_starting = s[rb - 1] == '\n';
            count_lines(&L, at, rb);
            size_t tag;
            char sg;
            size_t e = raw_end(&L, rb, &tag, &sg);
            if (!e) lfail(&L, at, "%s", "Missing end of raw directive");
            emit_text(&L, rb, tag, sg, 1);
            L.line_starting = s[e - 1] == '\n';
            count_lines(&L, tag, e);
            L.pos = e;
            continue;
        }
        size_t body = at + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t e = 0, q;
            for (q = body; q + 1 < n; q++) {
                if ((s[q] == '+' || s[q] == '-') && q + 2 < n && s[q + 1] == '#' && s[q + 2] == '}') {
                    e = s[q] == '+' ? q + 3 : skip_ws(&L, q + 3);
                    break;
                }
                if (s[q] == '#' && s[q + 1] == '}') {
                    e = q + 2 + (q + 2 < n && s[q + 2] == '\n');
                    break;
                }
            }
            if (!e) lfail(&L, at, "%s", "Missing end of comment tag");
            L.line_starting = s[e - 1] == '\n';
            count_lines(&L, at, e);
            L.pos = e;
            continue;
        }
        push(&L, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, at);
        L.pos = body;
        lex_tag(&L, kind == '%');
    }
    push(&L, T_EOF, L.n);
    *toks = L.toks;
    *ntoks = L.ntoks;
}

const char *qcj_tok_desc(const qcj_tok *t, char *buf, size_t n)
{
    static const char *const opnames[] = {
        "+", "-", "/", "//", "*", "%", "**", "~", "[", "]", "(", ")", "{", "}",
        "==", "!=", ">", ">=", "<", "<=", "=", ".", ":", "|", ",", ";",
    };
    switch (t->t) {
    case T_EOF: return "end of template";
    case T_DATA: return "template data / text";
    case T_VAR_BEGIN: return "begin of print statement";
    case T_VAR_END: return "end of print statement";
    case T_BLOCK_BEGIN: return "begin of statement block";
    case T_BLOCK_END: return "end of statement block";
    case T_NAME: snprintf(buf, n, "%s", t->s); return buf;
    case T_STRING: return "string";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    case T_OP: return t->op < sizeof opnames / sizeof opnames[0] ? opnames[t->op] : "operator";
    }
    return "token";
}
