/* gram.h - grammars over bytes and their matchers: the core that JSON
 * Schemas, regexes and choice lists compile to, and that masks tokens.
 *
 * A grammar is a set of rules.  A rule's body is an expression over bytes,
 * literal strings, regex terminals (gram_re.h) and references to rules
 * (recursion allowed, left recursion refused), built with gram_b_* and
 * compiled (gram_b_build) into one deterministic automaton a rule, whose
 * edges read a byte or call a rule.  A compiled grammar is immutable and
 * may be shared by any number of matchers and threads.
 *
 * A matcher (gram_m) holds where a request is in the grammar: the set of
 * stacks of (rule, state) that the bytes so far allow (several when the
 * grammar is ambiguous at this point; stacks are shared nodes, so the set
 * stays small).  It advances by bytes or by tokens, says whether the input
 * so far is complete (EOS allowed), and rolls back by tokens (speculative
 * decoding).
 *
 * grammar/ is JSON Schema -> grammar -> token masks (gram*, schema*), with
 * PCRE2 for a schema's `pattern`.  It includes base/ only: no engine, no
 * sockets; a vocabulary comes in as token byte strings. */
#ifndef QUIRE_GRAM_H
#define QUIRE_GRAM_H

#include <stddef.h>
#include <stdint.h>

/* ---- building ---------------------------------------------------------------- */

typedef struct gram_b gram_b;
typedef struct gram_re gram_re;
typedef struct gram gram;

/* An expression of a builder: an index, or a negative QERR_* code (an
 * error sticks to the builder: every later call passes it on and
 * gram_b_build reports it). */
typedef int gram_x;

/* A new builder; NULL when out of memory. */
gram_b *gram_b_new(void);
/* NULL is a no-op. */
void gram_b_free(gram_b *b);

/* A rule (its body defined later with gram_b_define); name is for
 * messages.  Returns its id (>= 0) or the builder's error. */
int gram_b_rule(gram_b *b, const char *name);
/* Sets rule's body.  0 or the builder's error. */
int gram_b_define(gram_b *b, int rule, gram_x body);

gram_x gram_b_empty(gram_b *b);
/* The bytes s[0..n) in order. */
gram_x gram_b_lit(gram_b *b, const char *s, size_t n);
#define gram_b_str(b, s) gram_b_lit(b, s, strlen(s))
/* One byte in [lo, hi]. */
gram_x gram_b_byte(gram_b *b, uint8_t lo, uint8_t hi);
/* A pattern (gram_re.h, with its flags): compiled now; a bad one fails the
 * builder with the pattern's message. */
gram_x gram_b_regex(gram_b *b, const char *pattern, size_t len, unsigned flags);
/* A compiled pattern (taken: the builder frees it, also on error). */
gram_x gram_b_regex_take(gram_b *b, gram_re *re);
gram_x gram_b_ref(gram_b *b, int rule);
/* The content of a JSON string (between its quotes, in the output form of
 * gram_re.h's JSON-string mode) that is none of names[0..n) (lens[i] bytes
 * each, in that same form): the keys an object may add beside its listed
 * properties. */
gram_x gram_b_string_except(gram_b *b, const char *const *names, const size_t *lens, int n);
/* The same over the strings of base (a pattern in JSON-string mode, taken;
 * NULL: any string): the keys of patternProperties. */
gram_x gram_b_key(gram_b *b, gram_re *base, const char *const *names, const size_t *lens, int n);
gram_x gram_b_seq(gram_b *b, gram_x x, gram_x y);
gram_x gram_b_alt(gram_b *b, gram_x x, gram_x y);
/* x repeated min..max times (max -1: no bound). */
gram_x gram_b_rep(gram_b *b, gram_x x, int min, int max);

/* Members in any order (an object's, when it lists too many properties
 * for a rule per set of them): each of member[0..n) at most once and, with
 * has_extra, extra any number of times, sep between two; the whole may end
 * when every required member is given, when deps[d][0] given means
 * deps[d][1] given too, and when at least min members are given (extras
 * counting as one: two could share a key) and at most max (-1: no bound;
 * extras counting each).  A member is refused where no way to such an end
 * would be left.  The matcher remembers the members given as a set beside
 * the stack; a grammar stays a PDA otherwise.  sep is one byte (a longer
 * one's first bytes would be taken before the set decides whether a member
 * may follow); deps name members by index. */
typedef struct {
    int n;
    const gram_x *member;
    const unsigned char *required; /* NULL: none */
    const int (*deps)[2];
    int ndeps;
    int has_extra;
    gram_x extra;
    int min, max;
    const char *sep;
} gram_perm;
gram_x gram_b_perm(gram_b *b, const gram_perm *p);

/* The builder's first error (0: none) and its message. */
int gram_b_error(const gram_b *b, const char **msg);

/* Compiles the rules into *out with root as the start: 0, or the builder's
 * error, QERR_INVAL (a rule never defined, left recursion), QERR_LIMIT
 * (too many states), QERR_NOMEM, with a message.  The builder stays the
 * caller's. */
int gram_b_build(gram_b *b, int root, gram **out, char *err, size_t errlen);

/* A compiled grammar is reference-counted: gram_retain adds a reference
 * (returns g), gram_free drops one and frees with the last.  Both
 * thread-safe; NULL is a no-op. */
gram *gram_retain(gram *g);
void gram_free(gram *g);

/* ---- the compile budget ------------------------------------------------------------ */

/* What compiling may spend on this thread: gram_b_build, gram_re_compile,
 * gram_re_intersect / gram_re_minus and the schema, regex, choice and tools
 * compilers above them (schema.h) stop with QERR_LIMIT and a message that
 * names the limit.  A field at 0 keeps the default; a limit above the
 * default is taken as the default (the defaults are what an unset budget
 * allows). */
typedef struct {
    double seconds;     /* wall time from gram_budget_set, for all compiles until the next (0: none) */
    int re_states;      /* states of one pattern's automaton (default GRAM_RE_MAX_STATES, 20,000) */
    long long re_work;  /* steps building one pattern's automaton (default 20,000,000, tens of ms) */
    int re_nfa;         /* states of the NFA a pattern's automaton is built from (default 100,000) */
    int states;         /* states of a grammar's rules together (default 1,000,000) */
} gram_budget;
/* Sets this thread's budget (NULL: the defaults, no time limit).  A server
 * sets it before each request's compile; a fuzz target sets smaller limits
 * to spend its time on many inputs rather than on a few large ones.
 * Cannot fail. */
void gram_budget_set(const gram_budget *b);

/* ---- a cache of compiled grammars ------------------------------------------------- */

/* Compiled grammars by key (a canonical text of what was compiled), the
 * least recently used dropped past a capacity: requests that repeat a
 * schema share its grammar and the token classes it has learnt.
 * Thread-safe. */
typedef struct gram_cache gram_cache;

/* A cache of cap grammars; NULL when out of memory. */
gram_cache *gram_cache_new(int cap);
void gram_cache_free(gram_cache *c);
/* The grammar under key (retained: the caller frees it), or NULL. */
gram *gram_cache_get(gram_cache *c, const char *key, size_t len);
/* Keeps g under key (the cache retains it; the caller keeps its own
 * reference).  Out of memory: not kept. */
void gram_cache_put(gram_cache *c, const char *key, size_t len, gram *g);
/* Automaton states over all rules (a size measure).  Cannot fail. */
int gram_states(const gram *g);

/* ---- matching ------------------------------------------------------------------- */

typedef struct gram_m gram_m;

/* A matcher at the start of g (which must outlive it); NULL when out of
 * memory. */
gram_m *gram_m_new(const gram *g);
void gram_m_free(gram_m *m);

/* Advances by n bytes when the grammar allows all of them: 0, or
 * QERR_INVAL (refused: the matcher is unchanged), QERR_LIMIT (the stacks
 * grew past their bound), QERR_NOMEM. */
int gram_m_feed(gram_m *m, const uint8_t *s, size_t n);
/* 1 when the bytes so far allow n more bytes s (nothing changes). */
int gram_m_allows(gram_m *m, const uint8_t *s, size_t n);
/* 1 when the input so far is a complete sentence of the grammar (the end,
 * EOS, is allowed here). */
int gram_m_can_end(const gram_m *m);
/* 1 when no byte can follow (the input is complete and nothing may be
 * added). */
int gram_m_done(const gram_m *m);

/* Marks a token boundary: the state now is the one gram_m_rollback(m, k)
 * returns to, k boundaries later.  0 or QERR_NOMEM. */
int gram_m_commit(gram_m *m);
/* Goes back k boundaries (k <= the boundaries marked since the start).
 * 0 or QERR_RANGE. */
int gram_m_rollback(gram_m *m, int k);
/* Back to the start.  Cannot fail. */
void gram_m_reset(gram_m *m);

/* ---- token masks -------------------------------------------------------------------- */

typedef struct gram_vocab gram_vocab;

/* A vocabulary of n tokens, token i being the bytes bytes[i][0..lens[i])
 * it adds to a text (copied); tokens with skip[i] set (special tokens) or
 * no bytes are never allowed by a grammar (EOS is the caller's: allowed
 * where gram_m_can_end).  0 or QERR_NOMEM. */
int gram_vocab_new(int n, const uint8_t *const *bytes, const size_t *lens, const uint8_t *skip, gram_vocab **out);
void gram_vocab_free(gram_vocab *v);
int gram_vocab_size(const gram_vocab *v);

/* Sets in mask ((n + 31) / 32 words, bit i of word i / 32) the tokens whose
 * bytes the grammar allows next, and clears the others.  0, or QERR_NOMEM /
 * QERR_LIMIT (the mask is then incomplete: treat as an error). */
int gram_m_mask(gram_m *m, const gram_vocab *v, uint32_t *mask);
/* How many states' token classes this process has made (walks of the
 * whole vocabulary: what makes a grammar met for the first time slower). */
long long gram_classes_made(void);
/* Advances by token's bytes and commits (a token boundary for rollback).
 * 0, QERR_INVAL (refused: nothing changes), QERR_RANGE (no such token). */
int gram_m_feed_token(gram_m *m, const gram_vocab *v, int token);

#endif
