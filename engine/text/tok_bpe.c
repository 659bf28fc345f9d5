/* tok_bpe.c - the BPE model: merge map, merge loop, byte fallback, word cache.
 *
 * A word (one pre-tokenized piece) becomes ids in two steps, as in HF's
 * BPE::merge_word and Word::merge_all:
 *
 * 1. Each character becomes a symbol: its vocabulary id (with the
 *    continuing_subword_prefix on all but the first character and the
 *    end_of_word_suffix on the last, when the file sets them); a character
 *    that is not in the vocabulary becomes its <0xXX> byte tokens when
 *    byte_fallback is on and all of them exist, else the unk token (runs of
 *    unknowns fused into one when fuse_unk), else it is dropped.  A pending
 *    unk is emitted only when the next known character arrives (HF's order,
 *    which puts it after intervening byte tokens).
 *
 * 2. Repeatedly, the adjacent pair with the lowest merge rank (leftmost on a
 *    tie) is replaced by its merged token, until no adjacent pair has a merge.
 *    HF pops a heap of (rank, position) and discards entries whose pair has
 *    changed; because a merged token's text is the text of the span it covers,
 *    that is the same as always merging the current best pair, so short
 *    words use a plain scan over an array and long ones (over SCAN_MAX
 *    symbols) a binary heap with lazy deletion.
 *
 * Invariants: the merge map has at most one entry per pair (a later merge of
 * the same pair overwrites, as in HF's HashMap); every id in it is a valid
 * vocabulary id (checked by the loaders).  Nothing here allocates per
 * character: symbols and heap live in the call's tok_work.
 *
 * SentencePiece-style files have no pre-tokenizer, so a whole text arrives as
 * one word.  When '▁' is a token and no token has '▁' right after another
 * character (split_meta, checked at load), no merge can cross the point before
 * such a '▁', and a long word is encoded piece by piece between those points:
 * the same ids, with short cacheable pieces instead of one huge heap.
 *
 * The cache maps a word's bytes to its ids (words under CACHE_MAX_WORD bytes).
 * It belongs to the qtok but is used by one encode call at a time: the call
 * that wins pthread_mutex_trylock uses it, concurrent calls encode without.
 * When it is full it is cleared, so it tracks what the current traffic uses.
 */
#include "tok_internal.h"

#include <string.h>

#include "qerr.h"
#include "util.h"

#define SCAN_MAX 48
#define CACHE_MAX_WORD 256
#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_ENTRIES (CACHE_SLOTS / 2)
#define CACHE_MAX_BYTES ((size_t)8 << 20)

static int is_meta(const char *s);

/* ---- merge map ------------------------------------------------------------------ */

static inline size_t merge_slot(uint64_t key, size_t mask)
{
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & mask;
}

static inline const tok_merge *merge_get(const tok_bpe *b, int32_t a, int32_t c)
{
    if (!b->merges) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)c;
    for (size_t i = merge_slot(key, b->merge_mask);; i = (i + 1) & b->merge_mask) {
        const tok_merge *m = &b->merges[i];
        if (m->key == key) return m;
        if (m->key == UINT64_MAX) return NULL;
    }
}

static int merge_grow(tok_bpe *b)
{
    size_t cap = b->merges ? (b->merge_mask + 1) * 2 : 1024;
    tok_merge *m = q_mallocn(cap, sizeof *m);
    if (!m) return QERR_NOMEM;
    memset(m, 0xff, cap * sizeof *m); /* every key UINT64_MAX: empty */
    if (b->merges) {
        for (size_t i = 0; i <= b->merge_mask; i++) {
            if (b->merges[i].key == UINT64_MAX) continue;
            size_t j = merge_slot(b->merges[i].key, cap - 1);
            while (m[j].key != UINT64_MAX) j = (j + 1) & (cap - 1);
            m[j] = b->merges[i];
        }
    }
    free(b->merges);
    b->merges = m;
    b->merge_mask = cap - 1;
    return 0;
}

int tok_bpe_add_merge(tok_bpe *b, int32_t a, int32_t c, uint32_t rank, int32_t new_id)
{
    if (!b->merges || (b->n_merges + 1) * 2 > b->merge_mask + 1) {
        int rc = merge_grow(b);
        if (rc) return rc;
    }
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)c;
    size_t i = merge_slot(key, b->merge_mask);
    while (b->merges[i].key != UINT64_MAX && b->merges[i].key != key) i = (i + 1) & b->merge_mask;
    if (b->merges[i].key == UINT64_MAX) b->n_merges++;
    b->merges[i] = (tok_merge){ .key = key, .rank = rank, .id = new_id };
    return 0;
}

int tok_bpe_finish(tok_bpe *b)
{
    static const char hex[] = "0123456789ABCDEF";
    for (int i = 0; i < 256; i++) {
        char s[6] = { '<', '0', 'x', hex[i >> 4], hex[i & 15], '>' };
        b->byte_ids[i] = tok_strmap_get(&b->vocab, s, 6);
    }
    free(b->bmp_ids);
    b->bmp_ids = NULL;
    if (b->prefix || b->suffix) return 0; /* characters are looked up with affixes */
    /* '▁' must be a token itself, or unknown ones would fuse across the cut */
    b->split_meta = tok_strmap_get(&b->vocab, "\xe2\x96\x81", 3) >= 0;
    for (uint32_t e = 0; e < b->vocab.n && b->split_meta; e++) {
        const char *t = b->vocab.pool.p + b->vocab.off[e];
        uint32_t len = b->vocab.len[e];
        for (uint32_t i = 1; i + 3 <= len; i++)
            if (is_meta(t + i) && !(i >= 3 && is_meta(t + i - 3))) {
                b->split_meta = 0;
                break;
            }
    }
    /* The vocabulary's one-character tokens, found in one walk over it
     * rather than by looking up every code point: a token whose bytes are
     * the UTF-8 of a code point below 65536 (not a surrogate) is that code
     * point's.  Pages are made only where there are such tokens. */
    memset(b->bmp_page, 0, sizeof b->bmp_page);
    int pages = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            b->bmp_ids = q_mallocn((size_t)(pages ? pages : 1) * 256, sizeof *b->bmp_ids);
            if (!b->bmp_ids) return QERR_NOMEM;
            memset(b->bmp_ids, 0xff, (size_t)(pages ? pages : 1) * 256 * sizeof *b->bmp_ids); /* -1: absent */
        }
        for (uint32_t e = 0; e < b->vocab.n; e++) {
            const uint32_t len = b->vocab.len[e];
            if (len < 1 || len > 3) continue;
            const unsigned char *t = (const unsigned char *)b->vocab.pool.p + b->vocab.off[e];
            const uint32_t cp = len == 1   ? t[0]
                                : len == 2 ? (t[0] & 0x1fu) << 6 | (t[1] & 0x3fu)
                                           : (t[0] & 0x0fu) << 12 | (t[1] & 0x3fu) << 6 | (t[2] & 0x3fu);
            char enc[4];
            if ((cp >= 0xd800 && cp < 0xe000) || qutf8_encode(cp, enc) != (int)len || memcmp(enc, t, len)) continue;
            if (!pass) {
                if (!b->bmp_page[cp >> 8]) b->bmp_page[cp >> 8] = (uint16_t)++pages;
            } else {
                b->bmp_ids[(size_t)(b->bmp_page[cp >> 8] - 1) * 256 + (cp & 255)] = b->vocab.val[e];
            }
        }
    }
    return 0;
}

void tok_bpe_free(tok_bpe *b)
{
    tok_strmap_free(&b->vocab);
    free(b->merges);
    free(b->bmp_ids);
    free(b->prefix);
    free(b->suffix);
    memset(b, 0, sizeof *b);
}

/* ---- the merge loop --------------------------------------------------------------- */

typedef struct {
    int32_t id;
    int32_t prev, next; /* heap variant: neighbours, -1 at the ends */
    int32_t alive;
} sym;

typedef struct {
    uint32_t rank;
    int32_t pos;
    int32_t id;     /* the merged token */
    int32_t a, b;   /* the pair it was found for */
} qent;

static int work_syms(tok_work *w, size_t n)
{
    if (n <= w->sym_cap) return 0;
    size_t cap = n < 64 ? 64 : n * 2;
    void *p = q_reallocn(w->sym, cap, sizeof(sym));
    if (!p) return QERR_NOMEM;
    w->sym = p;
    w->sym_cap = cap;
    return 0;
}

/* Merges an array of ids in place by scanning for the best pair each round. */
static size_t merge_scan(const tok_bpe *b, int32_t *ids, size_t n)
{
    uint32_t rank[SCAN_MAX];
    int32_t nid[SCAN_MAX];
    for (size_t i = 0; i + 1 < n; i++) {
        const tok_merge *m = merge_get(b, ids[i], ids[i + 1]);
        rank[i] = m ? m->rank : UINT32_MAX;
        nid[i] = m ? m->id : -1;
    }
    while (n > 1) {
        size_t best = 0;
        uint32_t br = UINT32_MAX;
        for (size_t i = 0; i + 1 < n; i++)
            if (rank[i] < br) {
                br = rank[i];
                best = i;
            }
        if (br == UINT32_MAX) break;
        ids[best] = nid[best];
        memmove(ids + best + 1, ids + best + 2, (n - best - 2) * sizeof *ids);
        if (best + 2 < n) {
            memmove(rank + best + 1, rank + best + 2, (n - best - 3) * sizeof *rank);
            memmove(nid + best + 1, nid + best + 2, (n - best - 3) * sizeof *nid);
        }
        n--;
        for (size_t i = best ? best - 1 : 0; i <= best && i + 1 < n; i++) {
            const tok_merge *m = merge_get(b, ids[i], ids[i + 1]);
            rank[i] = m ? m->rank : UINT32_MAX;
            nid[i] = m ? m->id : -1;
        }
    }
    return n;
}

static inline int qless(const qent *a, const qent *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(tok_work *w, size_t *n, qent e)
{
    if (*n == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 256;
        void *p = q_reallocn(w->heap, cap, sizeof(qent));
        if (!p) return QERR_NOMEM;
        w->heap = p;
        w->heap_cap = cap;
    }
    qent *h = w->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t par = (i - 1) / 2;
        if (!qless(&e, &h[par])) break;
        h[i] = h[par];
        i = par;
    }
    h[i] = e;
    return 0;
}

static qent heap_pop(tok_work *w, size_t *n)
{
    qent *h = w->heap;
    qent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && qless(&h[c + 1], &h[c])) c++;
        if (!qless(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* HF's Word::merge_all over a linked list with a heap; returns the new count. */
static int merge_heap(const tok_bpe *b, tok_work *w, int32_t *ids, size_t n, size_t *out_n)
{
    if (n > INT32_MAX) return QERR_LIMIT; /* positions are int32 */
    int rc = work_syms(w, n);
    if (rc) return rc;
    sym *s = w->sym;
    for (size_t i = 0; i < n; i++)
        s[i] = (sym){ .id = ids[i], .prev = (int32_t)i - 1, .next = i + 1 < n ? (int32_t)i + 1 : -1, .alive = 1 };
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        const tok_merge *m = merge_get(b, ids[i], ids[i + 1]);
        if (m && (rc = heap_push(w, &hn, (qent){ m->rank, (int32_t)i, m->id, ids[i], ids[i + 1] }))) return rc;
    }
    while (hn) {
        qent top = heap_pop(w, &hn);
        sym *L = &s[top.pos];
        if (!L->alive || L->next < 0) continue;
        sym *R = &s[L->next];
        /* stale entry: the pair changed.  (HF compares the merge result; a
         * pair with the same result covers the same text, so is the same.) */
        if (L->id != top.a || R->id != top.b) continue;
        L->id = top.id;
        R->alive = 0;
        L->next = R->next;
        if (R->next >= 0) s[R->next].prev = top.pos;
        if (L->prev >= 0) {
            const tok_merge *pm = merge_get(b, s[L->prev].id, L->id);
            if (pm && (rc = heap_push(w, &hn, (qent){ pm->rank, L->prev, pm->id, s[L->prev].id, L->id }))) return rc;
        }
        if (L->next >= 0) {
            const tok_merge *nm = merge_get(b, L->id, s[L->next].id);
            if (nm && (rc = heap_push(w, &hn, (qent){ nm->rank, top.pos, nm->id, L->id, s[L->next].id }))) return rc;
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i].alive) ids[k++] = s[i].id;
    *out_n = k;
    return 0;
}

/* ---- the word cache --------------------------------------------------------------- */

typedef struct {
    uint64_t h;     /* 0 = empty */
    uint32_t koff, ioff;
    uint16_t klen, nids;
} cslot;

struct tok_cache {
    cslot *slots;   /* cap slots (a power of two, at most CACHE_SLOTS), NULL before the first word */
    uint32_t cap;
    size_t count;
    qbuf keys;
    int32_t *ids;
    size_t n_ids, cap_ids;
};

tok_cache *tok_cache_new(void)
{
    return q_callocn(1, sizeof(tok_cache));
}

void tok_cache_free(tok_cache *c)
{
    if (!c) return;
    free(c->slots);
    qbuf_free(&c->keys);
    free(c->ids);
    free(c);
}

static const cslot *cache_get(const tok_cache *c, uint64_t h, const char *s, size_t n)
{
    if (!c->slots) return NULL;
    for (uint32_t i = (uint32_t)h & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
        const cslot *e = &c->slots[i];
        if (!e->h) return NULL;
        if (e->h == h && e->klen == n && !memcmp(c->keys.p + e->koff, s, n)) return e;
    }
}

/* Room for one more entry at most half full: the table doubles (up to
 * CACHE_SLOTS, which CACHE_MAX_ENTRIES keeps half full), so a tokenizer
 * that encodes little keeps a small one.  0, or -1 (no room: skip). */
static int cache_room(tok_cache *c)
{
    if (c->slots && (c->count + 1) * 2 <= c->cap) return 0;
    const uint32_t cap = c->slots ? c->cap * 2 : 256;
    if (cap > CACHE_SLOTS) return -1;
    cslot *t = q_callocn(cap, sizeof *t);
    if (!t) return -1;
    for (uint32_t i = 0; c->slots && i < c->cap; i++) {
        if (!c->slots[i].h) continue;
        uint32_t j = (uint32_t)c->slots[i].h & (cap - 1);
        while (t[j].h) j = (j + 1) & (cap - 1);
        t[j] = c->slots[i];
    }
    free(c->slots);
    c->slots = t, c->cap = cap;
    return 0;
}

static void cache_put(tok_cache *c, uint64_t h, const char *s, size_t n, const int32_t *ids, size_t k)
{
    if (c->count >= CACHE_MAX_ENTRIES || c->keys.len + n > CACHE_MAX_BYTES || c->n_ids + k > CACHE_MAX_BYTES) {
        if (c->slots) memset(c->slots, 0, c->cap * sizeof *c->slots);
        c->count = 0;
        c->keys.len = 0;
        c->n_ids = 0;
    }
    if (k > UINT16_MAX || cache_room(c)) return;
    if (k && c->n_ids + k > c->cap_ids) {
        size_t cap = c->cap_ids ? c->cap_ids * 2 : 4096;
        while (cap < c->n_ids + k) cap *= 2;
        int32_t *v = q_reallocn(c->ids, cap, sizeof *v);
        if (!v) return; /* the cache is an optimisation: skip */
        c->ids = v;
        c->cap_ids = cap;
    }
    size_t koff = c->keys.len;
    if (qbuf_put(&c->keys, s, n)) return;
    if (k) memcpy(c->ids + c->n_ids, ids, k * sizeof *ids);
    uint32_t i = (uint32_t)h & (c->cap - 1);
    while (c->slots[i].h) i = (i + 1) & (c->cap - 1);
    c->slots[i] = (cslot){ .h = h, .koff = (uint32_t)koff, .ioff = (uint32_t)c->n_ids, .klen = (uint16_t)n,
                           .nids = (uint16_t)k };
    c->n_ids += k;
    c->count++;
}

/* ---- one word ----------------------------------------------------------------------- */

/* Looks up one character (with affixes when the model has them). */
static int32_t char_id(const tok_bpe *b, tok_work *w, const char *s, int cl, uint32_t cp, int first, int last,
                       const char **full, size_t *full_len)
{
    if (b->bmp_ids) {
        *full = s;
        *full_len = (size_t)cl;
        if (cp < 65536) {
            const unsigned pg = b->bmp_page[cp >> 8];
            return pg ? b->bmp_ids[(size_t)(pg - 1) * 256 + (cp & 255)] : -1;
        }
        return tok_strmap_get(&b->vocab, s, (size_t)cl);
    }
    qbuf *t = &w->nb[2];
    t->len = 0;
    if ((!first && b->prefix && qbuf_put(t, b->prefix, b->prefix_len)) || qbuf_put(t, s, (size_t)cl) ||
        (last && b->suffix && qbuf_put(t, b->suffix, b->suffix_len))) {
        *full = s;
        *full_len = (size_t)cl;
        return -2;
    }
    *full = t->p;
    *full_len = t->len;
    return tok_strmap_get(&b->vocab, t->p, t->len);
}

static int bpe_word(const tok_bpe *b, tok_work *w, const char *s, size_t n, tok_ids *out)
{
    if (n == 0) return 0;
    if (b->ignore_merges) {
        int32_t id = tok_strmap_get(&b->vocab, s, n);
        if (id >= 0) return tok_ids_push(out, id);
    }
    uint64_t h = 0;
    if (w->cache && n < CACHE_MAX_WORD) {
        h = tok_hash(s, n) | 1;
        const cslot *e = cache_get(w->cache, h, s, n);
        if (e) {
            for (uint16_t i = 0; i < e->nids; i++)
                if (tok_ids_push(out, w->cache->ids[e->ioff + i])) return QERR_NOMEM;
            return 0;
        }
    }
    /* Step 1: characters -> symbols, appended to out directly. */
    size_t base = out->n;
    int32_t unk = -1;
    int rc;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int cl = qutf8_decode_valid(s + i, &cp);
        const char *full;
        size_t full_len;
        int32_t id = char_id(b, w, s + i, cl, cp, i == 0, i + (size_t)cl == n, &full, &full_len);
        if (id == -2) return QERR_NOMEM;
        i += (size_t)cl;
        if (id >= 0) {
            if (unk >= 0) {
                if ((rc = tok_ids_push(out, unk))) return rc;
                unk = -1;
            }
            if ((rc = tok_ids_push(out, id))) return rc;
            continue;
        }
        if (b->byte_fallback) {
            size_t k = 0;
            while (k < full_len && b->byte_ids[(unsigned char)full[k]] >= 0) k++;
            if (k == full_len) {
                for (k = 0; k < full_len; k++)
                    if ((rc = tok_ids_push(out, b->byte_ids[(unsigned char)full[k]]))) return rc;
                continue;
            }
        }
        if (b->unk_id >= 0) {
            if (unk >= 0 && !b->fuse_unk && (rc = tok_ids_push(out, unk))) return rc;
            unk = b->unk_id;
        }
    }
    if (unk >= 0 && (rc = tok_ids_push(out, unk))) return rc;

    /* Step 2: merges. */
    size_t k = out->n - base;
    if (k > 1 && b->merges) {
        if (k <= SCAN_MAX) {
            k = merge_scan(b, out->v + base, k);
        } else if ((rc = merge_heap(b, w, out->v + base, k, &k))) {
            return rc;
        }
        out->n = base + k;
    }
    if (h) cache_put(w->cache, h, s, n, k ? out->v + base : NULL, k);
    return 0;
}

/* "▁" (U+2581) */
static int is_meta(const char *s)
{
    return (unsigned char)s[0] == 0xe2 && (unsigned char)s[1] == 0x96 && (unsigned char)s[2] == 0x81;
}

int tok_bpe_word(const tok_bpe *b, tok_work *w, const char *s, size_t n, tok_ids *out)
{
    /* A SentencePiece text arrives as one long word.  When no token has a
     * '▁' right after another character (checked at load: split_meta), no
     * merge can join the two sides of such a point, so the word is encoded
     * piece by piece (each short, cached) with the same result. */
    if (!b->split_meta || n < CACHE_MAX_WORD) return bpe_word(b, w, s, n, out);
    size_t st = 0;
    for (size_t i = 3; i + 3 <= n; i++) {
        if (is_meta(s + i) && !is_meta(s + i - 3)) {
            int rc = bpe_word(b, w, s + st, i - st, out);
            if (rc) return rc;
            st = i;
            i += 2;
        }
    }
    return bpe_word(b, w, s + st, n - st, out);
}
