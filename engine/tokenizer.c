#include "tokenizer.h"
#include "qerr.h"

#include <string.h>

/* GPT-2's byte <-> code point table: printable Latin-1 bytes map to
 * themselves, the other 68 bytes to U+0100.. in byte order. */
static int bpe_cp_to_byte(unsigned cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp < 256 || cp > 256 + 67) return -1;
    int n = (int)cp - 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (!printable && n-- == 0) return b;
    }
    return -1;
}

/* Decodes one UTF-8 code point; returns its length (1 for an invalid byte). */
static int utf8_next(const unsigned char *s, size_t n, unsigned *cp)
{
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || (size_t)len > n) {
        *cp = 0xfffd;
        return 1;
    }
    unsigned v = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            *cp = 0xfffd;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3f);
    }
    *cp = v;
    return len;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int qvocab_decode_piece(const qvocab *v, int id, int strip_space, char *buf, size_t cap)
{
    if (id < 0 || id >= v->n || !v->tokens || !v->tokens[id]) return QERR_RANGE;
    const char *p = v->tokens[id];
    size_t n = strlen(p), o = 0;
    int type = v->types ? v->types[id] : QTOK_NORMAL;
    if (type == QTOK_CONTROL || type == QTOK_UNUSED) return 0;
    if (v->kind == QVOCAB_BPE) {
        if (type == QTOK_USER) { /* added tokens are stored as plain text */
            if (n > cap) n = cap;
            memcpy(buf, p, n);
            return (int)n;
        }
        for (size_t i = 0; i < n && o < cap;) {
            unsigned cp;
            i += (size_t)utf8_next((const unsigned char *)p + i, n - i, &cp);
            int b = bpe_cp_to_byte(cp);
            if (b >= 0) buf[o++] = (char)b;
        }
    } else {
        if (n == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>' && hexval(p[3]) >= 0 &&
            hexval(p[4]) >= 0) {
            if (cap < 1) return 0;
            buf[0] = (char)(hexval(p[3]) * 16 + hexval(p[4]));
            return 1;
        }
        for (size_t i = 0; i < n && o < cap;) {
            if (i + 3 <= n && !memcmp(p + i, "\xe2\x96\x81", 3)) {
                buf[o++] = ' ';
                i += 3;
            } else {
                buf[o++] = p[i++];
            }
        }
    }
    if (strip_space && o > 0 && buf[0] == ' ') {
        memmove(buf, buf + 1, o - 1);
        o--;
    }
    return (int)o;
}

size_t qutf8_complete(const char *s, size_t n)
{
    /* Look back at most 3 bytes for a lead byte whose character is cut. */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xc0) == 0x80) continue; /* continuation byte */
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        return (size_t)len > back ? n - back : n;
    }
    return n;
}
