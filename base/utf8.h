/* utf8.h - UTF-8 as RFC 3629 defines it: no overlong forms, no surrogates,
 * nothing past U+10FFFF.  One implementation for the tokenizers, the chat
 * templates, stop strings, the grammar's patterns and the server's checks.
 *
 * Every function reads at most n bytes and cannot fail. */
#ifndef QUIRE_UTF8_H
#define QUIRE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The character at s[0..n), n >= 1: its length (1..4) when it is valid; 0
 * when it is not, with *bad (if not NULL) set to the length of the maximal
 * invalid subpart (what one U+FFFD replaces); -k when s[0..n) is the valid
 * but unfinished start of a character (k == n < its length). */
int qutf8_step(const void *s, size_t n, int *bad);

/* The length (1..4) of the valid character at s[0..n), or 0 when there is
 * none (an unfinished one included). */
static inline size_t qutf8_char(const void *s, size_t n)
{
    const int k = n ? qutf8_step(s, n, NULL) : 0;
    return k > 0 ? (size_t)k : 0;
}

/* Decodes the character at s[0..n), n >= 1, into *cp and returns its length;
 * an invalid or unfinished one reads as one byte of U+FFFD. */
size_t qutf8_decode(const void *s, size_t n, uint32_t *cp);

/* The length of the character a lead byte starts, for text known to be valid. */
static inline int qutf8_lead_len(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

/* Decodes one character of text known to be valid; returns its length. */
static inline int qutf8_decode_valid(const char *s, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xe0) {
        *cp = ((uint32_t)(u[0] & 0x1f) << 6) | (u[1] & 0x3f);
        return 2;
    }
    if (u[0] < 0xf0) {
        *cp = ((uint32_t)(u[0] & 0x0f) << 12) | ((uint32_t)(u[1] & 0x3f) << 6) | (u[2] & 0x3f);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3f) << 12) | ((uint32_t)(u[2] & 0x3f) << 6) |
          (u[3] & 0x3f);
    return 4;
}

/* Bytes that encode cp (1..4; cp <= U+10FFFF). */
static inline int qutf8_enc_len(uint32_t cp)
{
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

/* Writes cp (<= U+10FFFF) into out[0..4); returns the length (1..4). */
int qutf8_encode(uint32_t cp, char *out);

/* The length of the longest valid prefix of s[0..n) (n when all is valid;
 * an unfinished character at the end is not part of it). */
size_t qutf8_valid_prefix(const void *s, size_t n);

/* Whether s[0..n) is UTF-8. */
static inline int qutf8_valid(const void *s, size_t n) { return qutf8_valid_prefix(s, n) == n; }

/* Whether s[0..n), 0 < n < 4, is the valid start of a character still
 * waiting for bytes. */
int qutf8_is_partial(const void *s, size_t n);

/* How many bytes at the end of s[0..n) are the valid start of a character
 * still waiting for bytes (0..3): what a stream holds back until the rest
 * comes.  0 when the text ends on a boundary or its tail can never become
 * valid (those bytes go out as they are). */
size_t qutf8_partial_tail(const void *s, size_t n);

/* n less the partial tail: the length of s[0..n) that can go out now. */
static inline size_t qutf8_complete(const char *s, size_t n) { return n - qutf8_partial_tail(s, n); }

#endif
