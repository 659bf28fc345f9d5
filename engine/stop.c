/* stop.c - stop strings on streamed text, never emitting part of one.
 *
 * Matching.  Each stop string s_k runs its own Knuth-Morris-Pratt automaton
 * over the byte stream: state[k] is the length of the longest prefix of s_k
 * that is a suffix of all text fed so far.  A byte advances every automaton
 * (amortised O(1) each, through the failure table fail_k); the first byte at
 * which some state[k] reaches len_k ends a match, so the earliest-completing
 * stop wins, and among those completing at that byte the longest (the
 * earliest start).  The automata see the stream and nothing else, so chunk
 * boundaries cannot change the result.
 *
 * Holding back.  Without QSTOP_INCLUDE nothing of a possible stop string may
 * leave.  After a chunk without a match, hold = max_k state[k] is exactly
 * the longest suffix that could still grow into a stop string; every byte
 * before it is safe.  The buffer therefore keeps
 *
 *   window = the last max(hold, u) bytes of the stream
 *
 * where u is the length of an incomplete UTF-8 character at the very end
 * (held so that emitted text never ends inside a character).  Invariants:
 * the window is exactly the text fed but not yet emitted, and (without
 * QSTOP_INCLUDE) state[k] <= hold <= window length; so a match found in the
 * next chunk starts inside window + chunk, at buffer offset me - len_k >= 0,
 * and "emit everything before the match" is buf[0 .. me - len_k).  With
 * QSTOP_INCLUDE the hold is 0 (a partial stop would be emitted either way)
 * and a match emits buf[0 .. me).
 *
 * Stop strings must be valid UTF-8, so a match (or a held suffix) starts
 * where the stop's first byte, a lead byte, stands in the text: on a
 * character boundary of valid text.  Cutting there never splits a character.
 *
 * Buffer life.  The window sits at buf[off_win .. blen) after a call, and the
 * text returned points into buf; the next feed moves the window to the front
 * only then, so returned text stays valid until the next call.
 */
#define _GNU_SOURCE
#include "stop.h"
#include "qerr.h"
#include "utf8.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct qstop {
    int n;                 /* stop strings */
    unsigned flags;
    unsigned char *bytes;  /* all stop strings back to back */
    uint32_t *fail;        /* (sum of lengths) KMP failure table, same layout */
    size_t *off, *len;     /* (n) where each string starts in bytes, its length */
    uint32_t *state;       /* (n) matched prefix length */
    char *buf;             /* text not yet emitted, then one chunk */
    size_t cap, blen, off_win; /* buf capacity; window is buf[off_win .. blen) */
    int done;              /* stopped or flushed: emit nothing more */
    int disarmed;          /* completed stops are text (qstop_arm) */
    int stopped, stop_index;
};

int qstop_new(const char *const *stops, const size_t *lens, int n, unsigned flags, qstop **out, char *err,
              size_t errlen)
{
    *out = NULL;
    if (n < 0 || (n > 0 && !stops)) return qerr_set(err, errlen, QERR_INVAL, "stop strings: bad list (%d entries)", n);
    if (n > QSTOP_MAX_STRINGS)
        return qerr_set(err, errlen, QERR_LIMIT, "too many stop strings: %d, at most %d", n, QSTOP_MAX_STRINGS);
    if (flags & ~QSTOP_INCLUDE) return qerr_set(err, errlen, QERR_INVAL, "stop strings: unknown flags 0x%x", flags);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (!stops[i]) return qerr_set(err, errlen, QERR_INVAL, "stop string %d is NULL", i);
        size_t len = lens ? lens[i] : strlen(stops[i]);
        if (len == 0) return qerr_set(err, errlen, QERR_INVAL, "stop string %d is empty", i);
        if (len > QSTOP_MAX_BYTES)
            return qerr_set(err, errlen, QERR_LIMIT, "stop string %d is %zu bytes long, at most %d are allowed", i,
                            len, QSTOP_MAX_BYTES);
        if (!qutf8_valid(stops[i], len))
            return qerr_set(err, errlen, QERR_INVAL, "stop string %d is not valid UTF-8", i);
        total += len; /* at most QSTOP_MAX_STRINGS * QSTOP_MAX_BYTES */
    }

    qstop *m = calloc(1, sizeof *m);
    if (!m) goto fail_nomem;
    m->n = n;
    m->flags = flags;
    m->stop_index = -1;
    m->bytes = q_malloc(total ? total : 1);
    m->fail = q_mallocn(total ? total : 1, sizeof *m->fail);
    m->off = q_mallocn((size_t)(n ? n : 1), sizeof *m->off);
    m->len = q_mallocn((size_t)(n ? n : 1), sizeof *m->len);
    m->state = q_callocn((size_t)(n ? n : 1), sizeof *m->state);
    if (!m->bytes || !m->fail || !m->off || !m->len || !m->state) goto fail_nomem;

    size_t at = 0;
    for (int i = 0; i < n; i++) {
        size_t len = lens ? lens[i] : strlen(stops[i]);
        unsigned char *s = m->bytes + at;
        uint32_t *f = m->fail + at;
        memcpy(s, stops[i], len);
        m->off[i] = at;
        m->len[i] = len;
        /* f[j]: the longest proper prefix of s[0..j] that is also its suffix. */
        f[0] = 0;
        for (size_t j = 1, k = 0; j < len; j++) {
            while (k > 0 && s[j] != s[k]) k = f[k - 1];
            if (s[j] == s[k]) k++;
            f[j] = (uint32_t)k;
        }
        at += len;
    }
    *out = m;
    return 0;

fail_nomem:
    qstop_free(m);
    return qerr_set(err, errlen, QERR_NOMEM, "out of memory for stop strings");
}

void qstop_free(qstop *m)
{
    if (!m) return;
    free(m->bytes);
    free(m->fail);
    free(m->off);
    free(m->len);
    free(m->state);
    free(m->buf);
    free(m);
}

void qstop_reset(qstop *m)
{
    memset(m->state, 0, (size_t)(m->n ? m->n : 1) * sizeof *m->state);
    m->blen = m->off_win = 0;
    m->done = m->stopped = 0;
    m->stop_index = -1;
}

static void set_out(const qstop *m, qstop_out *out, const char *text, size_t len)
{
    out->text = len ? text : "";
    out->len = len;
    out->stopped = m->stopped;
    out->stop_index = m->stop_index;
}

int qstop_feed(qstop *m, const char *chunk, size_t len, qstop_out *out)
{
    set_out(m, out, NULL, 0);
    if (!chunk && len) return QERR_INVAL;
    if (m->done) return 0;

    /* Room for window + chunk first, so that a failure changes nothing. */
    size_t win = m->blen - m->off_win, need;
    if (q_add_overflow(win, len, &need)) return QERR_NOMEM;
    if (need > m->cap) {
        size_t cap = m->cap ? m->cap : 256;
        while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        char *nb = q_reallocn(m->buf, cap, 1);
        if (!nb) return QERR_NOMEM;
        m->buf = nb;
        m->cap = cap;
    }
    if (win) memmove(m->buf, m->buf + m->off_win, win);
    if (len) memcpy(m->buf + win, chunk, len);
    m->off_win = 0;
    m->blen = win + len;

    const unsigned char *c = (const unsigned char *)chunk;
    for (size_t i = 0; i < len; i++) {
        int hit = -1;
        for (int k = 0; k < m->n; k++) {
            const unsigned char *s = m->bytes + m->off[k];
            const uint32_t *f = m->fail + m->off[k];
            uint32_t st = m->state[k];
            while (st > 0 && s[st] != c[i]) st = f[st - 1];
            if (s[st] == c[i]) st++;
            if (st == m->len[k] && m->disarmed) st = f[st - 1]; /* not a stop yet: keep matching */
            m->state[k] = st;
            if (st == m->len[k] && (hit < 0 || m->len[k] > m->len[hit])) hit = k;
        }
        if (hit >= 0) {
            size_t me = win + i + 1; /* the match is buf[me - len .. me) */
            size_t ms = me >= m->len[hit] ? me - m->len[hit] : 0; /* always the first */
            m->done = m->stopped = 1;
            m->stop_index = hit;
            set_out(m, out, m->buf, (m->flags & QSTOP_INCLUDE) ? me : ms);
            m->blen = m->off_win = 0;
            return 0;
        }
    }

    size_t hold = 0;
    if (!(m->flags & QSTOP_INCLUDE))
        for (int k = 0; k < m->n; k++)
            if (m->state[k] > hold) hold = m->state[k];
    size_t u = qutf8_partial_tail(m->buf, m->blen);
    size_t keep = hold > u ? hold : u;
    if (keep > m->blen) keep = m->blen; /* cannot happen (hold <= window + chunk) */
    m->off_win = m->blen - keep;
    set_out(m, out, m->buf, m->off_win);
    return 0;
}

void qstop_arm(qstop *m, int armed) { m->disarmed = !armed; }

void qstop_flush(qstop *m, qstop_out *out)
{
    if (m->done) {
        set_out(m, out, NULL, 0);
        return;
    }
    m->done = 1;
    set_out(m, out, m->buf + m->off_win, m->blen - m->off_win);
    m->blen = m->off_win = 0;
}
