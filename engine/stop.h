/* stop.h - stop strings on streamed text.
 *
 * A qstop belongs to one sequence.  Feed it each chunk of text the streaming
 * detokenizer emits; it returns the part that is safe to show now and says
 * when a stop string has completed.  As in the OpenAI API and vLLM
 * (include_stop_str_in_output false), the stop string and everything after
 * it are not emitted, and no partial stop string is ever emitted either: a
 * suffix that could still become a stop string is held back until it cannot
 * (then released) or the sequence ends (qstop_flush).  With QSTOP_INCLUDE
 * the stop string is emitted and nothing needs holding.
 *
 * Which stop wins: the one that completes first in the text; of those that
 * complete at the same byte, the longest.  This depends on the text only,
 * never on how it was cut into chunks.  (vLLM checks per token and, within
 * one token's text, takes the first stop in list order; the two agree
 * whenever each token completes at most one stop.)
 *
 * Emitted text never ends inside a UTF-8 character: the bytes of an
 * incomplete character at the end of a chunk are held until it completes.
 * The concatenation of everything fed and flushed is the text up to the
 * stop (or all of it when none matches). */
#ifndef QUIRE_STOP_H
#define QUIRE_STOP_H

#include <stddef.h>

/* Most stop strings per sequence (OpenAI allows 4; vLLM sets no limit). */
#define QSTOP_MAX_STRINGS 64
/* Longest stop string, in bytes. */
#define QSTOP_MAX_BYTES 512

/* Flags. */
#define QSTOP_INCLUDE 1u /* emit the stop string itself (include_stop_str_in_output) */

typedef struct qstop qstop;

typedef struct {
    const char *text; /* emit these bytes now (never NULL); valid until the next call on the qstop */
    size_t len;
    int stopped;      /* 1: a stop string has completed; the sequence should finish */
    int stop_index;   /* which one (index into the list given to qstop_new), or -1 */
} qstop_out;

/* Creates a matcher for n stop strings (0 <= n <= QSTOP_MAX_STRINGS; with 0
 * it only keeps UTF-8 characters whole).  stops[i] has lens[i] bytes, or is
 * NUL-terminated when lens is NULL; the strings are copied.  flags: 0 or
 * QSTOP_INCLUDE.  On success returns 0 and *out (owned by the caller,
 * qstop_free).  Otherwise *out is NULL and the return is QERR_INVAL (an
 * empty stop string, one that is not valid UTF-8, NULL pointers, unknown
 * flags), QERR_LIMIT (too many or too long, with the limit in the message)
 * or QERR_NOMEM, with one line in err. */
int qstop_new(const char *const *stops, const size_t *lens, int n, unsigned flags, qstop **out, char *err,
              size_t errlen);

/* Feeds the next len bytes of text (chunk may be NULL when len is 0).  On
 * success returns 0 and fills *out: the text to emit now and, when a stop
 * string completed inside this chunk, stopped = 1 and its index.  Once
 * stopped (or flushed), further feeds emit nothing and report the same
 * stop.  Fails with QERR_INVAL (chunk NULL with len > 0) or QERR_NOMEM; the
 * chunk is then not consumed and *out is empty. */
int qstop_feed(qstop *m, const char *chunk, size_t len, qstop_out *out);

/* Ends the sequence: *out gets the text still held back (nothing after a
 * stop).  Further feeds emit nothing until qstop_reset.  Cannot fail. */
void qstop_flush(qstop *m, qstop_out *out);

/* Disarms (armed 0) or arms m (new matchers are armed).  While disarmed, a
 * stop string that completes is not a stop: its bytes go out as text
 * (vLLM's min_tokens, before which stop strings do not count); what could
 * still become one is held back as usual, so a stop string that completes
 * after arming stops the sequence even if it began before.  Cannot fail. */
void qstop_arm(qstop *m, int armed);

/* Starts a new sequence with the same stop strings.  Cannot fail. */
void qstop_reset(qstop *m);

/* Releases m; NULL is a no-op. */
void qstop_free(qstop *m);

#endif
