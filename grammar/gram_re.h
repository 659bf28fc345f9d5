/* gram_re.h - JSON Schema regular expressions (ECMA-262's syntax, the subset
 * without lookaround and backreferences) compiled to a deterministic
 * automaton over bytes, for `pattern`, `format` and the API's regex
 * constraint.
 *
 * The automaton reads UTF-8.  In JSON-string mode it reads the bytes that
 * stand for such strings inside a JSON string literal (without its quotes):
 * every code point as its raw UTF-8 bytes, except '"' and '\' (escaped as
 * \" and \\) and the control characters below 0x20 (\b \f \n \r \t, the
 * others as \u00xx with lowercase hex), which is what a compact serializer
 * writes with ensure_ascii off (Python's json.dumps(..., ensure_ascii=False)).
 *
 * As JSON Schema says, a pattern is not anchored: "abc" matches any string
 * holding abc.  ^ and $ anchor where they begin or end a top-level
 * alternative; anywhere else they are refused.  Flags: none (the schema has
 * none).  Classes: \d [0-9], \w [A-Za-z0-9_], \s ECMA-262 white space and
 * line terminators, '.' any code point but line terminators.  Refused with a
 * message naming the construct: lookaround, backreferences, \b \B, named
 * classes (\p), possessive forms; repetition counts above 1000. */
#ifndef QUIRE_GRAM_RE_H
#define QUIRE_GRAM_RE_H

#include <stddef.h>
#include <stdint.h>

typedef struct gram_re gram_re;

/* The automaton reads the JSON-string encoding of the matching strings. */
#define GRAM_RE_JSON_STRING 1u
/* Match the whole input (as if between ^ and $), not a part of it. */
#define GRAM_RE_FULL 2u
/* A subset of the pattern's language will do (values to produce, not keys
 * to classify): an upper repetition count over 1000 is taken as 1000. */
#define GRAM_RE_SUBSET 4u

/* States a compiled pattern may have at most (more: QERR_LIMIT). */
#define GRAM_RE_MAX_STATES 20000

/* Compiles pattern (len bytes of UTF-8) into *out: 0, or QERR_INVAL (bad
 * or unsupported syntax), QERR_LIMIT (too many states), QERR_NOMEM, with a
 * message that names what and where. */
int gram_re_compile(const char *pattern, size_t len, unsigned flags, gram_re **out, char *err, size_t errlen);
/* NULL is a no-op. */
void gram_re_free(gram_re *re);

/* The automaton of the inputs both x and y match: 0 and *out, or
 * QERR_LIMIT (more than GRAM_RE_MAX_STATES states), QERR_NOMEM, with a
 * message. */
int gram_re_intersect(const gram_re *x, const gram_re *y, gram_re **out, char *err, size_t errlen);
/* The automaton of the inputs x matches and y does not; as above. */
int gram_re_minus(const gram_re *x, const gram_re *y, gram_re **out, char *err, size_t errlen);
/* 1 when re matches nothing. */
int gram_re_empty(const gram_re *re);
/* The integers (JSON: -?(0|[1-9][0-9]*)) that are multiples of k (1 to
 * 19997): 0 or QERR_LIMIT / QERR_NOMEM with a message. */
int gram_re_multiples(int k, gram_re **out, char *err, size_t errlen);

/* The start state.  Cannot fail. */
int gram_re_start(const gram_re *re);
/* The state after byte b from state s (>= 0), or -1 when no input that
 * continues this way can match.  Cannot fail. */
int gram_re_step(const gram_re *re, int s, uint8_t b);
/* State s's transitions as the fewest ranges of bytes with one next state
 * each: bytes lo[i]..hi[i] lead to to[i] (-1: none), i below the count
 * returned (1 to 256), in byte order, all 256 bytes in all.  The arrays
 * have room for 256.  Cannot fail. */
int gram_re_ranges(const gram_re *re, int s, uint8_t *lo, uint8_t *hi, int32_t *to);
/* 1 when the input read so far matches.  Cannot fail. */
int gram_re_accepts(const gram_re *re, int s);
/* States of the automaton.  Cannot fail. */
int gram_re_states(const gram_re *re);
/* 1 when all of s[0..n) is read and matches. */
int gram_re_match(const gram_re *re, const char *s, size_t n);

#endif
