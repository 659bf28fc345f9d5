/* buf.c - see buf.h. */
#include "buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qerr.h"
#include "util.h"

int q_grow(char **p, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        if (q_mul_overflow(c, 2, &c)) return QERR_LIMIT;
    }
    char *np = q_reallocn(*p, c, 1);
    if (!np) return c > ((size_t)1 << 40) ? QERR_LIMIT : QERR_NOMEM;
    *p = np;
    *cap = c;
    return 0;
}

int q_append(char **b, size_t *len, size_t *cap, const char *s, size_t n)
{
    size_t need;
    if (q_add_overflow(*len, n, &need) || q_add_overflow(need, 1, &need)) return QERR_LIMIT;
    const int rc = q_grow(b, cap, need);
    if (rc) return rc;
    if (n) memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = 0;
    return 0;
}

int qbuf_reserve(qbuf *b, size_t extra)
{
    size_t need;
    if (q_add_overflow(b->len, extra, &need) || q_add_overflow(need, 1, &need)) return QERR_LIMIT;
    return q_grow(&b->p, &b->cap, need);
}

int qbuf_put(qbuf *b, const void *s, size_t n) { return q_append(&b->p, &b->len, &b->cap, s, n); }

int qbuf_vprintf(qbuf *b, const char *fmt, va_list ap)
{
    va_list again;
    va_copy(again, ap);
    const int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    int rc = 0;
    if (n < 0) {
        rc = QERR_INVAL;
    } else if (!b->p || (size_t)n >= b->cap - b->len) {
        rc = qbuf_reserve(b, (size_t)n);
        if (!rc) vsnprintf(b->p + b->len, b->cap - b->len, fmt, again);
    }
    va_end(again);
    if (!rc) b->len += (size_t)n;
    else if (b->p) b->p[b->len] = 0;
    return rc;
}

int qbuf_printf(qbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int rc = qbuf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void qbuf_free(qbuf *b)
{
    free(b->p);
    *b = (qbuf){ 0 };
}
