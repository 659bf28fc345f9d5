/* tok_pretok.c - normalizers, pre-tokenizers and the regex engine bridge.
 *
 * Normalizers rewrite one piece of text (HF applies them to each piece left
 * between added tokens, never across one).  Pre-tokenizers cut pieces into
 * smaller ones; the model then encodes each piece on its own.
 *
 * Regexes.  HF compiles tokenizer.json patterns with Oniguruma; quire
 * compiles them with PCRE2 (UTF, UCP, JIT).  For the syntax these files use
 * (\p{L}, \p{N}, (?i:...), lookahead, classes) the two agree, except that
 * PCRE2's \s also matches U+180E; tok_regex_compile therefore rewrites \s
 * (and \S outside classes) to the White_Space class Oniguruma uses.  Matches
 * are enumerated with Oniguruma's find_iter rule (as the Rust onig crate
 * does): search from the end of the previous match; an empty match that ends
 * where the previous match ended is skipped by advancing one character.
 * Each piece is matched on its own, so lookarounds never see a neighbour.
 *
 * Splitting.  Every pre-tokenizer that cuts text first lists "segments"
 * (offsets, is_match) covering the piece, exactly like HF's
 * Pattern::find_matches, then applies the split behaviour (Removed, Isolated,
 * MergedWithPrevious, MergedWithNext, Contiguous; optionally inverted) and
 * drops empty results.  Keeping that two-step shape is what makes the corner
 * cases (empty matches, invert) come out as HF's do.
 *
 * NFC/NFD: text is scanned for characters that can change or interact with a
 * neighbour (tok_uni_unsafe); everything else is copied.  Around each unsafe
 * character the segment from the previous stable character to the next one
 * is decomposed, put in canonical order (stable counting sort by combining
 * class, so a hostile run of marks costs linear time) and, for NFC,
 * recomposed.  Stable characters are boundaries of normalization, so
 * segment-wise results equal whole-text results (UAX #15).
 */
#include "tok_internal.h"

#include <string.h>

#include "qerr.h"
#include "util.h"

/* ---- GPT-2 byte <-> character ------------------------------------------------------ */

const uint16_t tok_byte_to_cp[256] = {
    0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, 0x108, 0x109, 0x10a, 0x10b, 0x10c, 0x10d, 0x10e, 0x10f,
    0x110, 0x111, 0x112, 0x113, 0x114, 0x115, 0x116, 0x117, 0x118, 0x119, 0x11a, 0x11b, 0x11c, 0x11d, 0x11e, 0x11f,
    0x120, 0x21,  0x22,  0x23,  0x24,  0x25,  0x26,  0x27,  0x28,  0x29,  0x2a,  0x2b,  0x2c,  0x2d,  0x2e,  0x2f,
    0x30,  0x31,  0x32,  0x33,  0x34,  0x35,  0x36,  0x37,  0x38,  0x39,  0x3a,  0x3b,  0x3c,  0x3d,  0x3e,  0x3f,
    0x40,  0x41,  0x42,  0x43,  0x44,  0x45,  0x46,  0x47,  0x48,  0x49,  0x4a,  0x4b,  0x4c,  0x4d,  0x4e,  0x4f,
    0x50,  0x51,  0x52,  0x53,  0x54,  0x55,  0x56,  0x57,  0x58,  0x59,  0x5a,  0x5b,  0x5c,  0x5d,  0x5e,  0x5f,
    0x60,  0x61,  0x62,  0x63,  0x64,  0x65,  0x66,  0x67,  0x68,  0x69,  0x6a,  0x6b,  0x6c,  0x6d,  0x6e,  0x6f,
    0x70,  0x71,  0x72,  0x73,  0x74,  0x75,  0x76,  0x77,  0x78,  0x79,  0x7a,  0x7b,  0x7c,  0x7d,  0x7e,  0x121,
    0x122, 0x123, 0x124, 0x125, 0x126, 0x127, 0x128, 0x129, 0x12a, 0x12b, 0x12c, 0x12d, 0x12e, 0x12f, 0x130, 0x131,
    0x132, 0x133, 0x134, 0x135, 0x136, 0x137, 0x138, 0x139, 0x13a, 0x13b, 0x13c, 0x13d, 0x13e, 0x13f, 0x140, 0x141,
    0x142, 0xa1,  0xa2,  0xa3,  0xa4,  0xa5,  0xa6,  0xa7,  0xa8,  0xa9,  0xaa,  0xab,  0xac,  0x143, 0xae,  0xaf,
    0xb0,  0xb1,  0xb2,  0xb3,  0xb4,  0xb5,  0xb6,  0xb7,  0xb8,  0xb9,  0xba,  0xbb,  0xbc,  0xbd,  0xbe,  0xbf,
    0xc0,  0xc1,  0xc2,  0xc3,  0xc4,  0xc5,  0xc6,  0xc7,  0xc8,  0xc9,  0xca,  0xcb,  0xcc,  0xcd,  0xce,  0xcf,
    0xd0,  0xd1,  0xd2,  0xd3,  0xd4,  0xd5,  0xd6,  0xd7,  0xd8,  0xd9,  0xda,  0xdb,  0xdc,  0xdd,  0xde,  0xdf,
    0xe0,  0xe1,  0xe2,  0xe3,  0xe4,  0xe5,  0xe6,  0xe7,  0xe8,  0xe9,  0xea,  0xeb,  0xec,  0xed,  0xee,  0xef,
    0xf0,  0xf1,  0xf2,  0xf3,  0xf4,  0xf5,  0xf6,  0xf7,  0xf8,  0xf9,  0xfa,  0xfb,  0xfc,  0xfd,  0xfe,  0xff,
};

int tok_cp_to_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff)) return (int)cp;
    if (cp < 0x100 || cp > 0x143) return -1;
    static const uint8_t low[68] = {
        0,   1,   2,   3,   4,   5,   6,   7,   8,   9,   10,  11,  12,  13,  14,  15,  16,
        17,  18,  19,  20,  21,  22,  23,  24,  25,  26,  27,  28,  29,  30,  31,  32,  127,
        128, 129, 130, 131, 132, 133, 134, 135, 136, 137, 138, 139, 140, 141, 142, 143, 144,
        145, 146, 147, 148, 149, 150, 151, 152, 153, 154, 155, 156, 157, 158, 159, 160, 173,
    };
    return low[cp - 0x100];
}

/* Appends the byte-level form of s[0..n) (one character per byte). */
static int bytelevel_map(const char *s, size_t n, qbuf *out)
{
    if (qbuf_reserve(out, 2 * n)) return QERR_NOMEM;
    char *o = out->p + out->len;
    for (size_t i = 0; i < n; i++) {
        unsigned cp = tok_byte_to_cp[(unsigned char)s[i]];
        if (cp < 0x80) {
            *o++ = (char)cp;
        } else {
            *o++ = (char)(0xc0 | (cp >> 6));
            *o++ = (char)(0x80 | (cp & 0x3f));
        }
    }
    out->len = (size_t)(o - out->p);
    out->p[out->len] = 0;
    return 0;
}

/* ---- regex ------------------------------------------------------------------------ */

#define WS_CLASS "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

pcre2_code *tok_regex_compile(const char *pat, size_t len, char *err, size_t errlen)
{
    qbuf b = { 0 };
    int in_class = 0, rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char d = pat[i + 1];
            if (d == 's') rc = qbuf_put(&b, in_class ? WS_CLASS : "[" WS_CLASS "]", strlen(in_class ? WS_CLASS : "[" WS_CLASS "]"));
            else if (d == 'S' && !in_class) rc = qbuf_put(&b, "[^" WS_CLASS "]", strlen("[^" WS_CLASS "]"));
            else rc = qbuf_put(&b, pat + i, 2);
            i += 2;
            continue;
        }
        if (!in_class && c == '[') {
            size_t j = i + 1;
            if (j < len && pat[j] == '^') j++;
            if (j < len && pat[j] == ']') j++; /* a leading ] is literal */
            rc = qbuf_put(&b, pat + i, j - i);
            in_class = 1;
            i = j;
            continue;
        }
        if (in_class && c == '[' && i + 1 < len && pat[i + 1] == ':') { /* [:alpha:] */
            const char *e = memchr(pat + i + 2, ']', len - i - 2);
            size_t j = e ? (size_t)(e - pat) + 1 : len;
            rc = qbuf_put(&b, pat + i, j - i);
            i = j;
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        rc = qbuf_put(&b, &c, 1);
        i++;
    }
    if (rc) {
        qbuf_free(&b);
        qerr_set(err, errlen, QERR_NOMEM, "out of memory compiling a regex");
        return NULL;
    }
    int ecode;
    PCRE2_SIZE eoff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(b.p ? b.p : ""), b.len, PCRE2_UTF | PCRE2_UCP, &ecode, &eoff, NULL);
    qbuf_free(&b);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        qerr_set(err, errlen, QERR_FORMAT, "bad regex \"%.*s\": %s", (int)(len > 80 ? 80 : len), pat, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT the interpreter runs */
    return re;
}

struct tok_seg {
    size_t s, e;
    int m;
};

static int seg_push(tok_work *w, size_t *n, size_t s, size_t e, int m)
{
    if (*n == w->seg_cap) {
        size_t cap = w->seg_cap ? w->seg_cap * 2 : 256;
        struct tok_seg *p = q_reallocn(w->seg, cap, sizeof *p);
        if (!p) return QERR_NOMEM;
        w->seg = p;
        w->seg_cap = cap;
    }
    w->seg[(*n)++] = (struct tok_seg){ s, e, m };
    return 0;
}

static int work_md(tok_work *w)
{
    if (w->md) return 0;
    w->md = pcre2_match_data_create(1, NULL);
    return w->md ? 0 : QERR_NOMEM;
}

/* Lists the segments of s[0..n) for the matches of re (HF's find_matches). */
static int regex_segments(pcre2_code *re, tok_work *w, const char *s, size_t n, size_t *nseg)
{
    int rc = work_md(w);
    if (rc) return rc;
    size_t prev = 0, last_end = 0;
    long last_match_end = -1;
    *nseg = 0;
    while (last_end <= n) {
        int mr = pcre2_match(re, (PCRE2_SPTR)s, n, last_end, PCRE2_NO_UTF_CHECK, w->md, NULL);
        if (mr == PCRE2_ERROR_NOMATCH) break;
        if (mr < 0) return QERR_LIMIT; /* match or depth limit on a hostile text */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t ms = ov[0], me = ov[1];
        if (ms > me || me > n) return QERR_INTERNAL;
        if (ms == me && last_match_end == (long)me) {
            if (last_end >= n) break;
            last_end += (size_t)qutf8_lead_len((unsigned char)s[last_end]);
            continue;
        }
        last_end = me;
        last_match_end = (long)me;
        if (ms < prev) ms = prev; /* only with \K; keeps segments ordered */
        if (ms > prev && (rc = seg_push(w, nseg, prev, ms, 0))) return rc;
        if ((rc = seg_push(w, nseg, ms, me, 1))) return rc;
        prev = me;
    }
    if (prev < n && (rc = seg_push(w, nseg, prev, n, 0))) return rc;
    return 0;
}

/* Segments for a character predicate: each matching character is a match. */
enum { PRED_NUMERIC, PRED_SPACE, PRED_PUNCT, PRED_CHAR };

static int pred_segments(int pred, uint32_t ch, tok_work *w, const char *s, size_t n, size_t *nseg)
{
    size_t last = 0;
    int rc;
    *nseg = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int cl = qutf8_decode_valid(s + i, &cp);
        int hit;
        switch (pred) {
        case PRED_NUMERIC: hit = tok_uni_is_numeric(cp); break;
        case PRED_SPACE: hit = tok_uni_is_space(cp); break;
        case PRED_PUNCT:
            hit = (cp < 0x80 && ((cp >= 0x21 && cp <= 0x2f) || (cp >= 0x3a && cp <= 0x40) || (cp >= 0x5b && cp <= 0x60) ||
                                 (cp >= 0x7b && cp <= 0x7e))) ||
                  tok_uni_is_punct(cp);
            break;
        default: hit = cp == ch; break;
        }
        if (hit) {
            if (last < i && (rc = seg_push(w, nseg, last, i, 0))) return rc;
            if ((rc = seg_push(w, nseg, i, i + (size_t)cl, 1))) return rc;
            last = i + (size_t)cl;
        }
        i += (size_t)cl;
    }
    if (last < n && (rc = seg_push(w, nseg, last, n, 0))) return rc;
    return 0;
}

/* Segments for a literal string (non-overlapping, left to right). */
static int lit_segments(const char *lit, size_t ll, tok_work *w, const char *s, size_t n, size_t *nseg)
{
    size_t prev = 0;
    int rc;
    *nseg = 0;
    if (ll > 0) {
        for (size_t i = 0; i + ll <= n;) {
            const char *f = tok_memmem(s + i, n - i, lit, ll);
            if (!f) break;
            size_t at = (size_t)(f - s);
            if (at > prev && (rc = seg_push(w, nseg, prev, at, 0))) return rc;
            if ((rc = seg_push(w, nseg, at, at + ll, 1))) return rc;
            prev = i = at + ll;
        }
    }
    if (prev < n && (rc = seg_push(w, nseg, prev, n, 0))) return rc;
    return 0;
}

/* Applies a split behaviour to w->seg[0..n) in place; returns the new count. */
static size_t apply_behavior(struct tok_seg *g, size_t n, int behavior, int invert)
{
    if (invert)
        for (size_t i = 0; i < n; i++) g[i].m = !g[i].m;
    size_t k = 0;
    int prev = 0;
    switch (behavior) {
    case TB_ISOLATED:
        return n;
    case TB_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!g[i].m) g[k++] = g[i];
        return k;
    case TB_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            if (k && g[i].m == prev) g[k - 1].e = g[i].e;
            else g[k++] = g[i];
            prev = g[i].m;
        }
        return k;
    case TB_MERGED_PREV:
        for (size_t i = 0; i < n; i++) {
            if (g[i].m && !prev && k) g[k - 1].e = g[i].e;
            else g[k++] = g[i];
            prev = g[i].m;
        }
        return k;
    default: /* TB_MERGED_NEXT: the same from the right */
        k = n;
        for (size_t i = n; i-- > 0;) {
            if (g[i].m && !prev && k < n) g[k].s = g[i].s;
            else g[--k] = g[i];
            prev = g[i].m;
        }
        memmove(g, g + k, (n - k) * sizeof *g);
        return n - k;
    }
}

/* Appends the non-empty segments as pieces of out whose text starts at base. */
static int emit_segments(const tok_work *w, size_t nseg, size_t base, uint32_t origin, tok_plist *out)
{
    for (size_t i = 0; i < nseg; i++) {
        const struct tok_seg *g = &w->seg[i];
        if (g->e <= g->s) continue;
        int rc = tok_plist_add(out, base + g->s, g->e - g->s, -1, origin && g->s == 0);
        if (rc) return rc;
    }
    return 0;
}

/* ---- normalizers -------------------------------------------------------------------- */

static int u32_reserve(qbuf *b, size_t n)
{
    size_t bytes;
    if (q_mul_overflow(n, sizeof(uint32_t), &bytes)) return QERR_LIMIT;
    b->len = 0;
    return qbuf_reserve(b, bytes);
}

enum { S_BASE = 0xac00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11a7, L_COUNT = 19, V_COUNT = 21,
       T_COUNT = 28, N_COUNT = 588, S_COUNT = 11172 };

static size_t decompose_into(uint32_t cp, uint32_t *o)
{
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
        uint32_t si = cp - S_BASE;
        o[0] = L_BASE + si / N_COUNT;
        o[1] = V_BASE + (si % N_COUNT) / T_COUNT;
        if (si % T_COUNT) {
            o[2] = T_BASE + si % T_COUNT;
            return 3;
        }
        return 2;
    }
    const uint32_t *d;
    int k = tok_uni_decomp(cp, &d);
    if (!k) {
        o[0] = cp;
        return 1;
    }
    memcpy(o, d, (size_t)k * sizeof *o);
    return (size_t)k;
}

static uint32_t compose_pair(uint32_t a, uint32_t b)
{
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    return tok_uni_compose(a, b);
}

/* Canonical ordering of cps[0..n): stable sort of each run of non-starters. */
static void canonical_order(uint32_t *cps, uint8_t *cc, size_t n, uint32_t *tmp)
{
    for (size_t i = 0; i < n;) {
        if (!cc[i]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && cc[j]) j++;
        size_t len = j - i;
        if (len < 16) {
            for (size_t a = i + 1; a < j; a++) {
                uint32_t v = cps[a];
                uint8_t c = cc[a];
                size_t b = a;
                while (b > i && cc[b - 1] > c) {
                    cps[b] = cps[b - 1];
                    cc[b] = cc[b - 1];
                    b--;
                }
                cps[b] = v;
                cc[b] = c;
            }
        } else {
            size_t count[257] = { 0 };
            for (size_t a = i; a < j; a++) count[cc[a] + 1]++;
            for (int c = 1; c < 257; c++) count[c] += count[c - 1];
            for (size_t a = i; a < j; a++) tmp[count[cc[a]]++] = cps[a];
            for (size_t a = 0; a < len; a++) {
                cps[i + a] = tmp[a];
                cc[i + a] = (uint8_t)tok_uni_ccc(tmp[a]);
            }
        }
        i = j;
    }
}

/* Normalizes the segment s[0..n) (NFD, or NFC with compose) into out. */
static int nf_segment(const char *s, size_t n, int compose, qbuf *scratch, qbuf *out)
{
    /* Each character decomposes into at most 4 code points (18 for a few
     * historic ones in theory; the table's longest is 4) per UTF-8 byte. */
    size_t max = 4 * n + 4;
    size_t need;
    if (q_mul_overflow(max, 2 * sizeof(uint32_t) + 1, &need)) return QERR_LIMIT;
    int rc = u32_reserve(scratch, need / sizeof(uint32_t) + 1);
    if (rc) return rc;
    uint32_t *cps = (uint32_t *)scratch->p, *tmp = cps + max;
    uint8_t *cc = (uint8_t *)(tmp + max);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)qutf8_decode_valid(s + i, &cp);
        k += decompose_into(cp, cps + k);
    }
    for (size_t i = 0; i < k; i++) cc[i] = (uint8_t)tok_uni_ccc(cps[i]);
    canonical_order(cps, cc, k, tmp);
    if (compose) {
        size_t o = 0;
        long starter = -1;
        int last_cc = 0;
        for (size_t i = 0; i < k; i++) {
            uint32_t ch = cps[i];
            int c = cc[i];
            if (starter >= 0) {
                int blocked = (long)o - 1 > starter && (last_cc == 0 || last_cc >= c);
                uint32_t comp = blocked ? 0 : compose_pair(cps[starter], ch);
                if (comp) {
                    cps[starter] = comp;
                    continue;
                }
            }
            if (c == 0) starter = (long)o;
            last_cc = c;
            cps[o++] = ch;
        }
        k = o;
    }
    if (qbuf_reserve(out, 4 * k)) return QERR_NOMEM;
    for (size_t i = 0; i < k; i++) out->len += (size_t)qutf8_encode(cps[i], out->p + out->len);
    out->p[out->len] = 0;
    return 0;
}

static int nf(const char *s, size_t n, int compose, qbuf *scratch, qbuf *out)
{
    int bit = compose ? 1 : 2, rc;
    size_t done = 0, i = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0xc0) {
            i++;
            continue;
        }
        uint32_t cp;
        int cl = qutf8_decode_valid(s + i, &cp);
        if (!(tok_uni_unsafe(cp) & bit)) {
            i += (size_t)cl;
            continue;
        }
        size_t st = i;
        if (i > done) { /* include the stable character before (it may compose) */
            st--;
            while (st > done && ((unsigned char)s[st] & 0xc0) == 0x80) st--;
        }
        size_t e = i + (size_t)cl;
        while (e < n) {
            int l2 = qutf8_decode_valid(s + e, &cp);
            if (!(tok_uni_unsafe(cp) & bit)) break;
            e += (size_t)l2;
        }
        if ((rc = qbuf_put(out, s + done, st - done))) return rc;
        if ((rc = nf_segment(s + st, e - st, compose, scratch, out))) return rc;
        done = i = e;
    }
    return qbuf_put(out, s + done, n - done);
}

static int replace_norm(const tok_norm *nm, tok_work *w, const char *s, size_t n, qbuf *out)
{
    size_t nseg;
    int rc = nm->re ? regex_segments(nm->re, w, s, n, &nseg) : lit_segments(nm->pat, nm->pat_len, w, s, n, &nseg);
    if (rc) return rc;
    for (size_t i = 0; i < nseg; i++) {
        const struct tok_seg *g = &w->seg[i];
        if (g->m) rc = qbuf_put(out, nm->rep, nm->rep_len);
        else rc = qbuf_put(out, s + g->s, g->e - g->s);
        if (rc) return rc;
    }
    return 0;
}

static int norm_one(const tok_norm *nm, tok_work *w, const char *s, size_t n, qbuf *out)
{
    switch (nm->kind) {
    case TN_PREPEND:
        if (n && qbuf_put(out, nm->pat, nm->pat_len)) return QERR_NOMEM;
        return qbuf_put(out, s, n);
    case TN_REPLACE:
        return replace_norm(nm, w, s, n, out);
    case TN_NFC:
    case TN_NFD:
        return nf(s, n, nm->kind == TN_NFC, &w->u32, out);
    case TN_STRIP: {
        size_t a = 0, b = n;
        uint32_t cp;
        if (nm->left)
            while (a < b) {
                int cl = qutf8_decode_valid(s + a, &cp);
                if (!tok_uni_is_space(cp)) break;
                a += (size_t)cl;
            }
        if (nm->right)
            while (b > a) {
                size_t p = b - 1;
                while (p > a && ((unsigned char)s[p] & 0xc0) == 0x80) p--;
                qutf8_decode_valid(s + p, &cp);
                if (!tok_uni_is_space(cp)) break;
                b = p;
            }
        return qbuf_put(out, s + a, b - a);
    }
    case TN_LOWER:
        if (qbuf_reserve(out, 2 * n)) return QERR_NOMEM;
        for (size_t i = 0; i < n;) {
            uint32_t cp, lo[2];
            i += (size_t)qutf8_decode_valid(s + i, &cp);
            int k = tok_uni_lower(cp, lo);
            for (int j = 0; j < k; j++) {
                if (qbuf_reserve(out, 4)) return QERR_NOMEM;
                out->len += (size_t)qutf8_encode(lo[j], out->p + out->len);
            }
        }
        out->p[out->len] = 0;
        return 0;
    default: /* TN_BYTELEVEL */
        return bytelevel_map(s, n, out);
    }
}

int tok_normalize(const qtok *t, tok_work *w, const char *s, size_t n, qbuf *out)
{
    if (t->n_norms == 0) return qbuf_put(out, s, n);
    const char *src = s;
    size_t sn = n;
    for (int k = 0; k < t->n_norms; k++) {
        qbuf *dst = k == t->n_norms - 1 ? out : &w->nb[k & 1];
        if (dst != out) dst->len = 0;
        int rc = norm_one(&t->norms[k], w, src, sn, dst);
        if (rc) return rc;
        src = dst->p ? dst->p : "";
        sn = dst->len;
        if (dst == out) break;
    }
    return 0;
}

/* ---- pre-tokenizers ------------------------------------------------------------------ */

static int pre_piece(const tok_pre *p, tok_work *w, const char *s, size_t n, uint32_t origin, tok_plist *out)
{
    size_t nseg = 0, base;
    int rc;
    switch (p->kind) {
    case TP_BYTELEVEL: {
        const char *src = s;
        size_t sn = n;
        if (p->add_prefix_space && (n == 0 || s[0] != ' ')) {
            qbuf *t = &w->nb[0];
            t->len = 0;
            if (qbuf_put(t, " ", 1) || qbuf_put(t, s, n)) return QERR_NOMEM;
            src = t->p;
            sn = t->len;
        }
        if (p->re) {
            if ((rc = regex_segments(p->re, w, src, sn, &nseg))) return rc;
        } else {
            if ((rc = seg_push(w, &nseg, 0, sn, 0))) return rc;
        }
        for (size_t i = 0; i < nseg; i++) {
            const struct tok_seg *g = &w->seg[i];
            if (g->e <= g->s) continue;
            size_t at = out->text.len;
            if ((rc = bytelevel_map(src + g->s, g->e - g->s, &out->text))) return rc;
            if ((rc = tok_plist_add(out, at, out->text.len - at, -1, origin && g->s == 0))) return rc;
        }
        return 0;
    }
    case TP_METASPACE: {
        base = out->text.len;
        /* HF replaces spaces first, then looks for a leading replacement. */
        int starts = (n > 0 && s[0] == ' ') || (n >= (size_t)p->repl_len && !memcmp(s, p->repl, (size_t)p->repl_len));
        if (n > 0 && !starts && (p->prepend == TM_ALWAYS || (p->prepend == TM_FIRST && origin)))
            if (qbuf_put(&out->text, p->repl, (size_t)p->repl_len)) return QERR_NOMEM;
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') rc = qbuf_put(&out->text, p->repl, (size_t)p->repl_len);
            else rc = qbuf_put(&out->text, s + i, 1);
            if (rc) return rc;
        }
        size_t tn = out->text.len - base;
        if (!p->split) return tn ? tok_plist_add(out, base, tn, -1, origin) : 0;
        uint32_t ch;
        qutf8_decode_valid(p->repl, &ch);
        if ((rc = pred_segments(PRED_CHAR, ch, w, out->text.p + base, tn, &nseg))) return rc;
        nseg = apply_behavior(w->seg, nseg, TB_MERGED_NEXT, 0);
        return emit_segments(w, nseg, base, origin, out);
    }
    case TP_WHITESPACE: {
        base = out->text.len;
        if ((rc = qbuf_put(&out->text, s, n))) return rc;
        /* \w+|[^\w\s]+ : runs of word characters, runs of other non-space characters */
        int cur = 0; /* 0 none, 1 word, 2 other */
        size_t st = 0;
        for (size_t i = 0; i <= n;) {
            uint32_t cp = 0;
            int cl = 1, cls = 0;
            if (i < n) {
                cl = qutf8_decode_valid(s + i, &cp);
                cls = tok_uni_is_word(cp) ? 1 : tok_uni_is_space(cp) ? 0 : 2;
            }
            if (cls != cur) {
                if (cur && (rc = tok_plist_add(out, base + st, i - st, -1, origin && st == 0))) return rc;
                cur = cls;
                st = i;
            }
            if (i == n) break;
            i += (size_t)cl;
        }
        return 0;
    }
    default:
        break;
    }
    /* Pure splitters: the text is copied, the pieces cut. */
    base = out->text.len;
    if ((rc = qbuf_put(&out->text, s, n))) return rc;
    int behavior = p->behavior, invert = p->invert;
    switch (p->kind) {
    case TP_SPLIT:
        rc = p->re ? regex_segments(p->re, w, s, n, &nseg) : lit_segments(p->lit, p->lit_len, w, s, n, &nseg);
        break;
    case TP_DIGITS:
        rc = pred_segments(PRED_NUMERIC, 0, w, s, n, &nseg);
        behavior = p->individual ? TB_ISOLATED : TB_CONTIGUOUS;
        invert = 0;
        break;
    case TP_WSSPLIT:
        rc = pred_segments(PRED_SPACE, 0, w, s, n, &nseg);
        behavior = TB_REMOVED;
        invert = 0;
        break;
    default: /* TP_PUNCT */
        rc = pred_segments(PRED_PUNCT, 0, w, s, n, &nseg);
        invert = 0;
        break;
    }
    if (rc) return rc;
    nseg = apply_behavior(w->seg, nseg, behavior, invert);
    return emit_segments(w, nseg, base, origin, out);
}

int tok_pretokenize(const tok_pre *p, tok_work *w, const tok_plist *in, tok_plist *out)
{
    out->n = 0;
    out->text.len = 0;
    for (size_t i = 0; i < in->n; i++) {
        const tok_piece *pc = &in->p[i];
        int rc;
        if (pc->id >= 0) rc = tok_plist_add(out, 0, 0, pc->id, 0);
        else rc = pre_piece(p, w, in->text.p + pc->off, pc->len, pc->origin, out);
        if (rc) return rc;
    }
    return 0;
}

void tok_norm_free(tok_norm *n)
{
    free(n->pat);
    free(n->rep);
    if (n->re) pcre2_code_free(n->re);
}

void tok_pre_free(tok_pre *p)
{
    free(p->lit);
    if (p->re) pcre2_code_free(p->re);
}
