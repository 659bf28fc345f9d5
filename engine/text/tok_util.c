/* tok_util.c - the tokenizer's containers and UTF-8 helpers.
 *
 * Growable buffers, the string -> int hash map that holds vocabularies, the
 * piece and id lists of the encoder, and UTF-8 validation/encoding/lossy
 * conversion.  Everything allocates through the checked allocators of util.h
 * and reports QERR_NOMEM (or QERR_LIMIT past 32-bit offsets) instead of
 * failing hard.
 *
 * tok_u8lossy follows Rust's String::from_utf8_lossy exactly (the "maximal
 * subpart" rule of Unicode 3.9 / W3C): HF's ByteLevel decoder turns bytes
 * into text with it, and the streaming detokenizer must produce the same
 * U+FFFD characters, in the same places, as the full decode.
 */
#include "tok_internal.h"

#include <string.h>

#include "qerr.h"
#include "util.h"

const char *tok_memmem(const char *h, size_t hn, const char *nd, size_t nn)
{
    if (nn == 0) return h;
    while (hn >= nn) {
        const char *f = memchr(h, nd[0], hn - nn + 1);
        if (!f) return NULL;
        if (!memcmp(f, nd, nn)) return f;
        hn -= (size_t)(f - h) + 1;
        h = f + 1;
    }
    return NULL;
}

int tok_plist_add(tok_plist *l, size_t off, size_t len, int32_t id, uint32_t origin)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        tok_piece *p = q_reallocn(l->p, cap, sizeof *p);
        if (!p) return QERR_NOMEM;
        l->p = p;
        l->cap = cap;
    }
    l->p[l->n++] = (tok_piece){ .off = off, .len = len, .id = id, .origin = origin };
    return 0;
}

void tok_plist_free(tok_plist *l)
{
    qbuf_free(&l->text);
    free(l->p);
    l->p = NULL;
    l->n = l->cap = 0;
}

int tok_ids_push(tok_ids *o, int32_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        int32_t *v = q_reallocn(o->v, cap, sizeof *v);
        if (!v) return QERR_NOMEM;
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return 0;
}

/* ---- UTF-8 ------------------------------------------------------------------ */

int tok_u8lossy(const char *s, size_t n, int hold, qbuf *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of the pending valid stretch */
    if (qbuf_reserve(out, n + 3)) return -1;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int bad, k = qutf8_step(u + i, n - i, &bad);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (qbuf_put(out, s + run, i - run)) return -1;
        if (k < 0) { /* incomplete at the end */
            if (hold) return (int)(n - i);
            if (qbuf_put(out, "\xef\xbf\xbd", 3)) return -1;
            return 0;
        }
        if (qbuf_put(out, "\xef\xbf\xbd", 3)) return -1;
        i += (size_t)bad;
        run = i;
    }
    if (qbuf_put(out, s + run, n - run)) return -1;
    return 0;
}

/* ---- hashing and the string map ------------------------------------------------ */

uint64_t tok_hash(const void *s, size_t n)
{
    /* 64-bit multiply-xorshift over 8-byte words; fast for the short keys of
     * a vocabulary and good enough for open addressing. */
    const unsigned char *p = s;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    h = (h ^ w) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

long tok_strmap_find(const tok_strmap *m, const char *s, size_t n)
{
    if (!m->slots) return -1;
    uint64_t h = tok_hash(s, n);
    for (uint32_t i = (uint32_t)h & m->mask;; i = (i + 1) & m->mask) {
        uint32_t e = m->slots[i];
        if (!e) return -1;
        e--;
        if (m->len[e] == n && !memcmp(m->pool.p + m->off[e], s, n)) return (long)e;
    }
}

static int strmap_grow(tok_strmap *m)
{
    uint32_t cap = m->mask ? (m->mask + 1) * 2 : 1024;
    if (cap > (1u << 30)) return QERR_LIMIT;
    uint32_t *slots = q_callocn(cap, sizeof *slots);
    if (!slots) return QERR_NOMEM;
    for (uint32_t e = 0; e < m->n; e++) {
        uint64_t h = tok_hash(m->pool.p + m->off[e], m->len[e]);
        uint32_t i = (uint32_t)h & (cap - 1);
        while (slots[i]) i = (i + 1) & (cap - 1);
        slots[i] = e + 1;
    }
    free(m->slots);
    m->slots = slots;
    m->mask = cap - 1;
    return 0;
}

int tok_strmap_put(tok_strmap *m, const char *s, size_t n, int32_t val, int *existed)
{
    long f = tok_strmap_find(m, s, n);
    if (existed) *existed = f >= 0;
    if (f >= 0) {
        m->val[f] = val;
        return 0;
    }
    if (n > UINT32_MAX || m->pool.len + n > UINT32_MAX) return QERR_LIMIT;
    if ((size_t)(m->n + 1) * 2 > (size_t)m->mask + 1 || !m->slots) {
        int rc = strmap_grow(m);
        if (rc) return rc;
    }
    if (m->n == m->ecap) {
        uint32_t cap = m->ecap ? m->ecap * 2 : 256;
        uint32_t *off = q_reallocn(m->off, cap, sizeof *off);
        if (!off) return QERR_NOMEM;
        m->off = off;
        uint32_t *len = q_reallocn(m->len, cap, sizeof *len);
        if (!len) return QERR_NOMEM;
        m->len = len;
        int32_t *v = q_reallocn(m->val, cap, sizeof *v);
        if (!v) return QERR_NOMEM;
        m->val = v;
        m->ecap = cap;
    }
    uint32_t off = (uint32_t)m->pool.len;
    int rc = qbuf_put(&m->pool, s, n);
    if (rc) return rc;
    m->pool.len++; /* keep each key NUL-terminated in the pool */
    m->off[m->n] = off;
    m->len[m->n] = (uint32_t)n;
    m->val[m->n] = val;
    uint64_t h = tok_hash(s, n);
    uint32_t i = (uint32_t)h & m->mask;
    while (m->slots[i]) i = (i + 1) & m->mask;
    m->slots[i] = m->n + 1;
    m->n++;
    return 0;
}

void tok_strmap_free(tok_strmap *m)
{
    qbuf_free(&m->pool);
    free(m->off);
    free(m->len);
    free(m->val);
    free(m->slots);
    memset(m, 0, sizeof *m);
}
