/* tok_decode.c - decoders and the streaming detokenizer.
 *
 * HF decodes a list of token strings by passing the whole list through each
 * decoder in turn (Decoder::decode_chain) and joining the result.  quire
 * runs the same chain as a stream: a token goes through the decoders one at
 * a time, and each decoder keeps only the state its rule needs.  The full
 * decode (qtok_decode) is that stream fed with every id and then flushed, so
 * the streaming output equals the full output by construction; the work is
 * in giving each decoder streaming state that reproduces HF's list rule
 * exactly:
 *
 *  - Replace, Strip, Metaspace act on each token by itself (Metaspace drops
 *    its replacement character in the first token it sees, unless the prepend
 *    scheme is "never").  Stateless but for Metaspace's "first token" flag.
 *  - ByteFallback turns a run of consecutive <0xXX> tokens into one string,
 *    or, when the run's bytes are not valid UTF-8, into one U+FFFD per byte.
 *    The outcome depends on the whole run, so a run that is valid so far is
 *    held until a non-byte token (or the flush) ends it; once it is invalid,
 *    every byte of it is a U+FFFD and goes out at once.
 *  - Fuse and ByteLevel join all tokens into one string ("fusion").  After
 *    that the chain works on one growing text: ByteLevel's bytes are turned
 *    into text with from_utf8_lossy, holding an incomplete trailing
 *    character; a later Replace holds a tail that may start a match; Strip
 *    removes leading characters at the start of the stream and holds trailing
 *    ones until the flush; Metaspace sees the whole text as its first token.
 *    ByteLevel, ByteFallback and regex Replace after fusion are refused at
 *    load (they cannot stream).
 *  - Without a decoder HF joins the tokens with spaces.
 *
 * So every chunk handed out is valid UTF-8 that ends on a character boundary,
 * and nothing is held longer than its rule requires.
 */
#include "tok_internal.h"

#include <string.h>

#include "qerr.h"
#include "util.h"

#define FFFD "\xef\xbf\xbd"

typedef struct {
    qbuf tmp;   /* per-token scratch (Replace, Metaspace) */
    qbuf hold;  /* ByteFallback run / Replace tail / Strip trailing characters */
    size_t ok;     /* ByteFallback: hold's longest prefix of whole characters (tok_u8valid), kept as the run grows */
    int seen;      /* Metaspace: a token went through; Strip (fused): leading strip done */
    int left;      /* Strip (fused): leading characters still to remove */
    int bad;       /* ByteFallback: the current run is invalid */
    int held;      /* Strip (fused): trailing content characters held */
} dstate;

struct qdetok {
    const qtok *t;
    unsigned flags;
    int fuse_at;      /* index of the first Fuse/ByteLevel, or n_decs */
    int any;          /* a token went out (space joining) */
    dstate *st;       /* (n_decs) */
    qbuf bl;       /* ByteLevel: bytes of an incomplete character */
    qbuf out;
};

void tok_dec_free(tok_dec *d)
{
    free(d->pat);
    free(d->rep);
    if (d->re) pcre2_code_free(d->re);
    d->pat = d->rep = NULL;
    d->re = NULL;
}

static int text_push(qdetok *d, int k, const char *s, size_t n);

/* ---- per-token decoders ------------------------------------------------------------------- */

static int tok_push(qdetok *d, int k, const char *s, size_t n);

/* HF's ByteFallback test: "<0xXX>" with two hex digits (u8::from_str_radix,
 * which also takes a leading '+'). */
static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0, digits = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (h < 0) {
            if (i == 3 && c == '+') continue;
            return -1;
        }
        v = v * 16 + h;
        digits++;
    }
    return digits ? v : -1;
}

/* Ends the ByteFallback run of stage k. */
static int run_end(qdetok *d, int k)
{
    dstate *st = &d->st[k];
    int rc = 0;
    if (!st->bad && st->hold.len) {
        if (st->ok == st->hold.len) {
            rc = tok_push(d, k + 1, st->hold.p, st->hold.len);
        } else {
            for (size_t i = 0; i < st->hold.len && !rc; i++) rc = tok_push(d, k + 1, FFFD, 3);
        }
    }
    st->hold.len = st->ok = 0;
    st->bad = 0;
    return rc;
}

static int tok_push(qdetok *d, int k, const char *s, size_t n)
{
    const qtok *t = d->t;
    if (k == d->fuse_at) {
        if (k < t->n_decs && t->decs[k].kind == TD_BYTELEVEL) {
            /* all characters through the byte table, else the raw bytes
             * (at most n either way: room is made once) */
            if (qbuf_reserve(&d->bl, n)) return QERR_NOMEM;
            char *const at = d->bl.p + d->bl.len;
            char *o = at;
            int ok = 1;
            for (size_t i = 0; i < n && ok;) {
                uint32_t cp;
                i += (size_t)qutf8_decode_valid(s + i, &cp);
                int b = tok_cp_to_byte(cp);
                if (b < 0) ok = 0;
                else *o++ = (char)b;
            }
            if (!ok) {
                memcpy(at, s, n);
                o = at + n;
            }
            d->bl.len = (size_t)(o - d->bl.p);
            d->bl.p[d->bl.len] = 0;
            qbuf *tmp = &d->st[k].tmp;
            tmp->len = 0;
            int held = tok_u8lossy(d->bl.p, d->bl.len, 1, tmp);
            if (held < 0) return QERR_NOMEM;
            memmove(d->bl.p, d->bl.p + d->bl.len - (size_t)held, (size_t)held);
            d->bl.len = (size_t)held;
            return text_push(d, k + 1, tmp->p, tmp->len);
        }
        if (k == t->n_decs && t->dec_join_space && d->any && text_push(d, k + 1, " ", 1)) return QERR_NOMEM;
        d->any = 1;
        return text_push(d, k + 1, s, n);
    }
    const tok_dec *dc = &t->decs[k];
    dstate *st = &d->st[k];
    int rc;
    switch (dc->kind) {
    case TD_BYTEFALLBACK: {
        int b = byte_token(s, n);
        if (b < 0) {
            if ((rc = run_end(d, k))) return rc;
            return tok_push(d, k + 1, s, n);
        }
        char c = (char)b;
        if (st->bad) return tok_push(d, k + 1, FFFD, 3);
        if (qbuf_putc(&st->hold, c)) return QERR_NOMEM;
        /* Whole characters stay whole: only the bytes after them are read
         * again (a run of n bytes costs n, not n * n / 2). */
        size_t v = st->ok + qutf8_valid_prefix(st->hold.p + st->ok, st->hold.len - st->ok);
        st->ok = v;
        if (v < st->hold.len && !qutf8_is_partial(st->hold.p + v, st->hold.len - v)) {
            /* not UTF-8 whatever follows: every byte of the run is U+FFFD */
            size_t nb = st->hold.len;
            st->hold.len = st->ok = 0;
            st->bad = 1;
            for (size_t i = 0; i < nb; i++)
                if ((rc = tok_push(d, k + 1, FFFD, 3))) return rc;
        }
        return 0;
    }
    case TD_REPLACE: {
        st->tmp.len = 0;
        if (!dc->re && dc->pat_len) {
            for (size_t i = 0; i < n;) {
                const char *f = i + dc->pat_len <= n ? tok_memmem(s + i, n - i, dc->pat, dc->pat_len) : NULL;
                size_t at = f ? (size_t)(f - s) : n;
                if (qbuf_put(&st->tmp, s + i, at - i)) return QERR_NOMEM;
                if (!f) break;
                if (qbuf_put(&st->tmp, dc->rep, dc->rep_len)) return QERR_NOMEM;
                i = at + dc->pat_len;
            }
        } else if (dc->re) {
            pcre2_match_data *md = pcre2_match_data_create(1, NULL);
            if (!md) return QERR_NOMEM;
            size_t last = 0, pos = 0;
            long last_match_end = -1;
            rc = 0;
            while (pos <= n) {
                int mr = pcre2_match(dc->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
                if (mr < 0) break; /* no match (or a limit: keep the rest as it is) */
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                size_t ms = ov[0] < last ? last : ov[0], me = ov[1] < ms ? ms : ov[1];
                if (ms == me && last_match_end == (long)me) {
                    if (pos >= n) break;
                    pos += (size_t)qutf8_lead_len((unsigned char)s[pos]);
                    continue;
                }
                pos = me;
                last_match_end = (long)me;
                if (qbuf_put(&st->tmp, s + last, ms - last) || qbuf_put(&st->tmp, dc->rep, dc->rep_len)) {
                    rc = QERR_NOMEM;
                    break;
                }
                last = me;
            }
            pcre2_match_data_free(md);
            if (rc || qbuf_put(&st->tmp, s + last, n - last)) return QERR_NOMEM;
        } else if (qbuf_put(&st->tmp, s, n)) {
            return QERR_NOMEM;
        }
        return tok_push(d, k + 1, st->tmp.p ? st->tmp.p : "", st->tmp.len);
    }
    case TD_STRIP: {
        size_t a = 0, b = n;
        for (int i = 0; i < dc->start && a < n; i++) {
            uint32_t cp;
            int cl = qutf8_decode_valid(s + a, &cp);
            if (cp != dc->ch) break;
            a += (size_t)cl;
        }
        for (int i = 0; i < dc->stop && b > a; i++) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xc0) == 0x80) p--;
            uint32_t cp;
            qutf8_decode_valid(s + p, &cp);
            if (cp != dc->ch) break;
            b = p;
        }
        return tok_push(d, k + 1, s + a, b - a);
    }
    case TD_METASPACE: {
        int first = !st->seen;
        st->seen = 1;
        char rep[4];
        int rl = qutf8_encode(dc->ch, rep);
        st->tmp.len = 0;
        for (size_t i = 0; i < n;) {
            if (n - i >= (size_t)rl && !memcmp(s + i, rep, (size_t)rl)) {
                if (!(first && dc->drop_first) && qbuf_putc(&st->tmp, ' ')) return QERR_NOMEM;
                i += (size_t)rl;
            } else {
                int cl = qutf8_lead_len((unsigned char)s[i]);
                if (qbuf_put(&st->tmp, s + i, (size_t)cl)) return QERR_NOMEM;
                i += (size_t)cl;
            }
        }
        return tok_push(d, k + 1, st->tmp.p ? st->tmp.p : "", st->tmp.len);
    }
    default:
        return QERR_INTERNAL;
    }
}

/* ---- decoders on the fused text ------------------------------------------------------------- */

/* Longest suffix of s[0..n) that is a proper prefix of pat. */
static size_t partial_suffix(const char *s, size_t n, const char *pat, size_t pl)
{
    size_t m = pl - 1 < n ? pl - 1 : n;
    for (; m > 0; m--)
        if (!memcmp(s + n - m, pat, m)) return m;
    return 0;
}

static int text_push(qdetok *d, int k, const char *s, size_t n)
{
    const qtok *t = d->t;
    if (k >= t->n_decs) return n ? qbuf_put(&d->out, s, n) : 0;
    const tok_dec *dc = &t->decs[k];
    dstate *st = &d->st[k];
    switch (dc->kind) {
    case TD_FUSE:
        return text_push(d, k + 1, s, n);
    case TD_REPLACE: { /* string patterns only (checked at load) */
        if (!dc->pat_len) return text_push(d, k + 1, s, n);
        if (qbuf_put(&st->hold, s, n)) return QERR_NOMEM;
        const char *h = st->hold.p;
        size_t hn = st->hold.len, i = 0;
        st->tmp.len = 0;
        for (;;) {
            const char *f = i + dc->pat_len <= hn ? tok_memmem(h + i, hn - i, dc->pat, dc->pat_len) : NULL;
            if (!f) break;
            size_t at = (size_t)(f - h);
            if (qbuf_put(&st->tmp, h + i, at - i) || qbuf_put(&st->tmp, dc->rep, dc->rep_len)) return QERR_NOMEM;
            i = at + dc->pat_len;
        }
        size_t keep = partial_suffix(h + i, hn - i, dc->pat, dc->pat_len);
        if (qbuf_put(&st->tmp, h + i, hn - i - keep)) return QERR_NOMEM;
        memmove(st->hold.p, h + hn - keep, keep);
        st->hold.len = keep;
        return text_push(d, k + 1, st->tmp.p ? st->tmp.p : "", st->tmp.len);
    }
    case TD_STRIP: {
        size_t a = 0;
        if (!st->seen) { /* leading characters at the start of the stream */
            while (a < n && st->left > 0) {
                uint32_t cp;
                int cl = qutf8_decode_valid(s + a, &cp);
                if (cp != dc->ch) {
                    st->left = 0;
                    break;
                }
                a += (size_t)cl;
                st->left--;
            }
            if (a < n || st->left == 0) st->seen = 1;
        }
        if (a == n) return 0;
        if (!dc->stop) return text_push(d, k + 1, s + a, n - a);
        /* trailing content characters are held until more text or the flush */
        size_t b = n;
        int m = 0;
        while (b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xc0) == 0x80) p--;
            uint32_t cp;
            qutf8_decode_valid(s + p, &cp);
            if (cp != dc->ch) break;
            b = p;
            m++;
        }
        char c8[4];
        int cl = qutf8_encode(dc->ch, c8);
        st->tmp.len = 0;
        if (b > a) { /* the held run is no longer trailing */
            for (int i = 0; i < st->held; i++)
                if (qbuf_put(&st->tmp, c8, (size_t)cl)) return QERR_NOMEM;
            st->held = 0;
            if (qbuf_put(&st->tmp, s + a, b - a)) return QERR_NOMEM;
        }
        st->held += m;
        for (; st->held > dc->stop; st->held--)
            if (qbuf_put(&st->tmp, c8, (size_t)cl)) return QERR_NOMEM;
        return st->tmp.len ? text_push(d, k + 1, st->tmp.p, st->tmp.len) : 0;
    }
    case TD_METASPACE: { /* the fused text is the first (only) token */
        char rep[4];
        int rl = qutf8_encode(dc->ch, rep);
        st->tmp.len = 0;
        for (size_t i = 0; i < n;) {
            if (n - i >= (size_t)rl && !memcmp(s + i, rep, (size_t)rl)) {
                if (!dc->drop_first && qbuf_putc(&st->tmp, ' ')) return QERR_NOMEM;
                i += (size_t)rl;
            } else {
                int cl = qutf8_lead_len((unsigned char)s[i]);
                if (qbuf_put(&st->tmp, s + i, (size_t)cl)) return QERR_NOMEM;
                i += (size_t)cl;
            }
        }
        return text_push(d, k + 1, st->tmp.p ? st->tmp.p : "", st->tmp.len);
    }
    default:
        return QERR_INTERNAL;
    }
}

/* ---- flushing ---------------------------------------------------------------------------------- */

static int flush_text(qdetok *d, int k)
{
    const qtok *t = d->t;
    for (; k < t->n_decs; k++) {
        const tok_dec *dc = &t->decs[k];
        dstate *st = &d->st[k];
        int rc = 0;
        if (dc->kind == TD_REPLACE && st->hold.len) {
            /* a held tail is a proper prefix of the pattern: no match in it */
            size_t hn = st->hold.len;
            st->hold.len = 0;
            qbuf tmp = st->hold;
            rc = text_push(d, k + 1, tmp.p, hn);
        } else if (dc->kind == TD_STRIP) {
            st->held = 0; /* trailing characters at the end are stripped */
        }
        if (rc) return rc;
    }
    return 0;
}

static int flush_all(qdetok *d)
{
    const qtok *t = d->t;
    int rc;
    for (int k = 0; k < d->fuse_at; k++)
        if (t->decs[k].kind == TD_BYTEFALLBACK && (rc = run_end(d, k))) return rc;
    if (d->fuse_at < t->n_decs && t->decs[d->fuse_at].kind == TD_BYTELEVEL && d->bl.len) {
        qbuf *tmp = &d->st[d->fuse_at].tmp;
        tmp->len = 0;
        if (tok_u8lossy(d->bl.p, d->bl.len, 0, tmp) < 0) return QERR_NOMEM;
        d->bl.len = 0;
        if ((rc = text_push(d, d->fuse_at + 1, tmp->p, tmp->len))) return rc;
    }
    return flush_text(d, d->fuse_at + 1);
}

/* ---- public ------------------------------------------------------------------------------------- */

void qdetok_drop_held(qdetok *d)
{
    /* A byte-fallback run held whole (complete characters) belongs to what
     * was pushed so far; a run that ends mid-character may still complete. */
    for (int k = 0; k < d->t->n_decs; k++) {
        dstate *st = &d->st[k];
        if (d->t->decs[k].kind == TD_BYTEFALLBACK && !st->bad && st->ok == st->hold.len)
            st->hold.len = st->ok = 0;
    }
}

void qdetok_reset(qdetok *d)
{
    const qtok *t = d->t;
    for (int k = 0; k < t->n_decs; k++) {
        dstate *st = &d->st[k];
        st->hold.len = st->tmp.len = st->ok = 0;
        st->seen = st->bad = st->held = 0;
        st->left = t->decs[k].kind == TD_STRIP ? t->decs[k].start : 0;
    }
    d->bl.len = 0;
    d->out.len = 0;
    d->any = 0;
}

qdetok *qdetok_new(const qtok *t, unsigned flags)
{
    if (!t) return NULL;
    qdetok *d = q_callocn(1, sizeof *d);
    if (!d) return NULL;
    d->t = t;
    d->flags = flags;
    d->st = q_callocn(t->n_decs ? (size_t)t->n_decs : 1, sizeof *d->st);
    if (!d->st) {
        free(d);
        return NULL;
    }
    d->fuse_at = t->n_decs;
    for (int k = 0; k < t->n_decs; k++)
        if (t->decs[k].kind == TD_FUSE || t->decs[k].kind == TD_BYTELEVEL) {
            d->fuse_at = k;
            break;
        }
    qdetok_reset(d);
    return d;
}

void qdetok_free(qdetok *d)
{
    if (!d) return;
    for (int k = 0; k < d->t->n_decs; k++) {
        qbuf_free(&d->st[k].tmp);
        qbuf_free(&d->st[k].hold);
    }
    free(d->st);
    qbuf_free(&d->bl);
    qbuf_free(&d->out);
    free(d);
}

/* Appends id's text to d->out. */
static int push_id(qdetok *d, int32_t id)
{
    const qtok *t = d->t;
    if (id < 0 || id >= t->n_ids || !t->id_str[id]) return 0; /* HF skips unknown ids */
    if ((d->flags & QTOK_SKIP_SPECIAL) && (t->id_special[id] & TOK_ID_SKIP)) return 0;
    return tok_push(d, 0, t->id_str[id], t->id_len[id]);
}

int qdetok_push(qdetok *d, int32_t id, const char **text, size_t *len)
{
    d->out.len = 0;
    int rc = push_id(d, id);
    if (rc || qbuf_reserve(&d->out, 0)) {
        *text = "";
        *len = 0;
        return rc ? rc : QERR_NOMEM;
    }
    d->out.p[d->out.len] = 0;
    *text = d->out.p;
    *len = d->out.len;
    return 0;
}

int qdetok_flush(qdetok *d, const char **text, size_t *len)
{
    d->out.len = 0;
    int rc = flush_all(d);
    if (!rc && qbuf_reserve(&d->out, 0)) rc = QERR_NOMEM;
    if (rc) {
        *text = "";
        *len = 0;
        qdetok_reset(d);
        return rc;
    }
    d->out.p[d->out.len] = 0;
    *text = d->out.p;
    *len = d->out.len;
    /* ready for a new sequence; the text stays valid until the next call */
    size_t keep = d->out.len;
    qdetok_reset(d);
    d->out.len = keep;
    return 0;
}

int qtok_decode(const qtok *t, const int32_t *ids, int n, unsigned flags, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    qdetok *d = qdetok_new(t, flags);
    if (!d) return QERR_NOMEM;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = push_id(d, ids[i]);
    if (!rc) rc = flush_all(d);
    if (!rc) rc = qbuf_reserve(&d->out, 0);
    if (rc) {
        qdetok_free(d);
        return rc;
    }
    d->out.p[d->out.len] = 0;
    *text = d->out.p;
    *len = d->out.len;
    d->out.p = NULL;
    d->out.len = d->out.cap = 0;
    qdetok_free(d);
    return 0;
}

/* ---- one token's bytes ------------------------------------------------------------------------- */

int qtok_token_bytes(const qtok *t, int id, char *buf, size_t cap)
{
    if (id < 0 || id >= t->n_ids || !t->id_str[id]) return QERR_RANGE;
    qbuf cur = { 0 }, nxt = { 0 };
    int rc = qbuf_put(&cur, t->id_str[id], t->id_len[id]);
    /* The per-token stages as they act on a token in the middle of a text:
     * Metaspace never drops its replacement, Strip on the fused text (the
     * text's ends) does nothing, a byte token is its byte. */
    for (int k = 0; !rc && k < t->n_decs; k++) {
        const tok_dec *dc = &t->decs[k];
        nxt.len = 0;
        if (dc->kind == TD_BYTEFALLBACK) {
            const int b = byte_token(cur.p, cur.len);
            if (b >= 0) {
                cur.len = 0;
                rc = qbuf_putc(&cur, (char)b);
                break; /* a raw byte: nothing after changes it */
            }
            continue;
        }
        if (dc->kind == TD_BYTELEVEL) {
            /* Every character through the byte table, else the token as it is. */
            int ok = 1;
            for (size_t i = 0; i < cur.len && !rc && ok;) {
                uint32_t cp;
                i += (size_t)qutf8_decode_valid(cur.p + i, &cp);
                const int b = tok_cp_to_byte(cp);
                if (b < 0) ok = 0;
                else rc = qbuf_putc(&nxt, (char)b);
            }
            if (!ok) continue;
        } else if (dc->kind == TD_REPLACE && !dc->re && dc->pat_len) {
            for (size_t i = 0; i < cur.len && !rc;) {
                const char *f = i + dc->pat_len <= cur.len ? tok_memmem(cur.p + i, cur.len - i, dc->pat, dc->pat_len) : NULL;
                const size_t at = f ? (size_t)(f - cur.p) : cur.len;
                rc = qbuf_put(&nxt, cur.p + i, at - i);
                if (!f || rc) break;
                rc = qbuf_put(&nxt, dc->rep, dc->rep_len);
                i = at + dc->pat_len;
            }
        } else if (dc->kind == TD_METASPACE) {
            char rep[4];
            const int rl = qutf8_encode(dc->ch, rep);
            for (size_t i = 0; i < cur.len && !rc;) {
                if (cur.len - i >= (size_t)rl && !memcmp(cur.p + i, rep, (size_t)rl)) {
                    rc = qbuf_putc(&nxt, ' ');
                    i += (size_t)rl;
                } else {
                    const size_t cl = (size_t)qutf8_lead_len((unsigned char)cur.p[i]);
                    rc = qbuf_put(&nxt, cur.p + i, cl);
                    i += cl;
                }
            }
        } else {
            continue; /* Fuse, Strip, regex Replace: no change to one token mid-text */
        }
        qbuf sw = cur;
        cur = nxt;
        nxt = sw;
    }
    int n = rc ? rc : (int)cur.len;
    if (!rc && cur.len > cap) n = QERR_RANGE;
    else if (!rc && cur.len) memcpy(buf, cur.p, cur.len);
    free(cur.p);
    free(nxt.p);
    return n;
}
