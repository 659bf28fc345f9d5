/* utf8.c - see utf8.h. */
#include "utf8.h"

#include <string.h>

int qutf8_step(const void *s, size_t n, int *bad)
{
    const unsigned char *u = s;
    const unsigned c = u[0];
    int sink;
    if (!bad) bad = &sink;
    *bad = 1;
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xbf; /* the second byte's range (RFC 3629's table) */
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0) lo = 0xa0; /* no overlong forms */
        if (c == 0xed) hi = 0x9f; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0) lo = 0x90; /* no overlong forms */
        if (c == 0xf4) hi = 0x8f; /* nothing past U+10FFFF */
    } else {
        return 0;
    }
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return -i;
        const unsigned d = u[i];
        if (i == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xbf)) {
            *bad = i;
            return 0;
        }
    }
    return need;
}

size_t qutf8_decode(const void *s, size_t n, uint32_t *cp)
{
    const int k = qutf8_step(s, n, NULL);
    if (k <= 0) {
        *cp = 0xfffd;
        return 1;
    }
    qutf8_decode_valid(s, cp);
    return (size_t)k;
}

int qutf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    const int n = qutf8_enc_len(cp);
    if (n == 1) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    for (int i = n - 1; i > 0; i--) {
        o[i] = (unsigned char)(0x80 | (cp & 0x3f));
        cp >>= 6;
    }
    o[0] = (unsigned char)((n == 2 ? 0xc0 : n == 3 ? 0xe0 : 0xf0) | cp);
    return n;
}

size_t qutf8_valid_prefix(const void *s, size_t n)
{
    const unsigned char *u = s;
    size_t i = 0;
    while (i < n) {
        /* ASCII eight bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, u + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        const int k = qutf8_step(u + i, n - i, NULL);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return n;
}

int qutf8_is_partial(const void *s, size_t n)
{
    return n > 0 && n < 4 && qutf8_step(s, n, NULL) == -(int)n;
}

size_t qutf8_partial_tail(const void *s, size_t n)
{
    const unsigned char *u = s;
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        if ((u[n - k] & 0xc0) == 0x80) continue; /* a continuation byte: look further back */
        return qutf8_is_partial(u + n - k, k) ? k : 0;
    }
    return 0;
}
