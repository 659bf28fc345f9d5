/* buf.h - the growable byte buffer: text built piece by piece (a reply, a
 * decoded stream, a metrics page).  The bytes are always NUL-terminated once
 * anything was put; an error leaves the buffer as it was.
 *
 *     qbuf b = { 0 };
 *     if (qbuf_put(&b, "ab", 2) || qbuf_printf(&b, "%d", 3)) ...;   // "ab3"
 *     qbuf_free(&b);
 *
 * (The chat templates' buffer, qcj_buf, lives in their arena instead.) */
#ifndef QUIRE_BUF_H
#define QUIRE_BUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct {
    char *p;    /* NULL until something is put; owned by the buffer */
    size_t len; /* bytes used, the NUL not counted */
    size_t cap; /* bytes allocated */
} qbuf;

/* Grows the allocation *p (*cap bytes) to hold need bytes: 0, QERR_NOMEM, or
 * QERR_LIMIT when need is past the allocation limit.  The one growth policy
 * (doubling from 64) of every buffer here. */
int q_grow(char **p, size_t *cap, size_t need);

/* Makes room for extra more bytes and a NUL.  0, QERR_NOMEM or QERR_LIMIT. */
int qbuf_reserve(qbuf *b, size_t extra);
/* Appends s[0..n).  0, QERR_NOMEM or QERR_LIMIT (the buffer unchanged). */
int qbuf_put(qbuf *b, const void *s, size_t n);
/* Appends formatted text.  0, QERR_NOMEM, QERR_LIMIT or QERR_INVAL (a bad format). */
int qbuf_printf(qbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int qbuf_vprintf(qbuf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* Frees the bytes and empties the buffer; a zeroed buffer is a no-op. */
void qbuf_free(qbuf *b);

static inline int qbuf_putc(qbuf *b, char c)
{
    if (b->len + 1 >= b->cap && qbuf_reserve(b, 1)) return -1;
    b->p[b->len++] = c;
    b->p[b->len] = 0;
    return 0;
}

/* Appends s[0..n) to the buffer *b (*len bytes used of *cap) and keeps a NUL
 * after them: qbuf_put for structs that hold the three fields themselves.
 * 0, or QERR_NOMEM / QERR_LIMIT with the buffer unchanged. */
int q_append(char **b, size_t *len, size_t *cap, const char *s, size_t n);

#endif
