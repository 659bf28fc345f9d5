/* schema_int.h - what schema.c and schema_scalar.c share (grammar
 * internal): the compiler's context and its helpers. */
#ifndef QUIRE_GRAM_SCHEMA_INT_H
#define QUIRE_GRAM_SCHEMA_INT_H

#include <jansson.h>
#include <string.h>

#include "gram.h"

typedef struct {
    gram_b *b;
    unsigned flags; /* schema.h's GRAM_SCHEMA_* */
    const json_t *root;
    int rc;
    char err[800];
    int r_value, r_string, r_number, r_integer;
    struct memo {
        const json_t *s;
        int rule;
    } *memo;
    int n_memo, cap_memo;
    json_t *keep;       /* schemas made by merging, alive until the end */
    char path[256];     /* JSON pointer of the schema being compiled */
    int depth;
    int visits; /* subschemas compiled so far */
    int merge_depth; /* merges in progress (schema.c's merge) */
    struct mmemo {
        const json_t *a, *b; /* the inputs (held) */
        json_t *m;           /* their merge (held); NULL: a free slot */
    } *mm;
    size_t n_mm, cap_mm;
#define SC_FORMATS 8
    const char *fmt_pat[SC_FORMATS]; /* schema_check.c: format automata compiled, by their pattern */
    struct gram_re *fmt_re[SC_FORMATS];
    char none_why[300]; /* why the last sc_none had no value */
} sctx;

/* Records the first error (its message with the JSON pointer being
 * compiled) and returns its code. */
gram_x sc_fail(sctx *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* No value of this type can hold (not an error yet: the schema's other
 * types may): records why, returns NONE. */
gram_x sc_none(sctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A pattern (gram_re.h's syntax and flags) as an expression. */
gram_x sc_re(sctx *c, const char *pattern, unsigned flags);

#define B (c->b)
#define SEQ(x, y) gram_b_seq(B, x, y)
#define ALT(x, y) gram_b_alt(B, x, y)
#define LIT(s) gram_b_lit(B, s, strlen(s))

static inline gram_x sc_seq3(sctx *c, gram_x x, gram_x y, gram_x z) { return SEQ(x, SEQ(y, z)); }

/* Internal: negations kept for the string, boolean and null alternatives
 * (a list of {"pattern"} and {"enum"} schemas; schema.c's not_rewrite
 * makes it). */
#define NOT_KEY "$quire_not"
/* Internal (strict mode): this schema lists properties (CLOSED_OBJ) or
 * tuple items (CLOSED_TUPLE), so the object or array it describes, as
 * merged, takes no other members unless additionalProperties or items say
 * what they may be.  Annotations: merges copy them, checks ignore them. */
#define CLOSED_OBJ "$quire_closed"
#define CLOSED_TUPLE "$quire_tuple"
/* Internal: a type for numbers that are not integers (not {type: integer}). */
#define FRACTION_TYPE "$quire_fraction"

/* No expression (an alternative left out). */
#define NONE (-1000)
/* Objects of up to this many listed properties take them in any order. */
#define ANY_ORDER_MAX 6

/* An object's members, for sc_members. */
typedef struct {
    int n;                   /* listed properties */
    const gram_x *prop;      /* each one's member (key, colon, value); NONE: never given */
    const unsigned char *required;
    const int (*deps)[2];    /* property deps[d][0] given: deps[d][1] must be too */
    int ndeps;
    gram_x extra;            /* a member of another key; NONE: none allowed */
    int min, max;            /* minProperties, maxProperties (-1: none) */
} sc_obj;
/* The members of an object, between its braces (schema_obj.c). */
gram_x sc_members(sctx *c, const sc_obj *o);

/* Appends printf-style text to out (cap bytes; the end is cut, never
 * overrun). */
void sc_put(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The pattern of a supported format, or NULL. */
const char *sc_format_pattern(const char *f);
/* 1 for a format of the specifications quire cannot generate (formats
 * none defines only annotate). */
int sc_format_refused(const char *f);
/* The schema a local reference names, or NULL. */
const json_t *sc_resolve(sctx *c, const char *ref);
/* Whether the JSON value v is an instance of schema s (read as Python's
 * jsonschema reads it): 1 yes, 0 no, -1 when a keyword cannot be decided
 * (named in *why). */
int sc_check(sctx *c, const json_t *s, const json_t *v, const char **why);
/* Frees what sc_check kept in c. */
void sc_check_free(sctx *c);
/* Whether pattern p (pn bytes) finds a match in s (n bytes), through PCRE2:
 * 1, 0, or -1 when it cannot tell (a bad pattern, too much work). */
int sc_search(const char *p, size_t pn, const char *s, size_t n);
/* schema.c: a keyword that only annotates; one the compiler reads or
 * refuses (a constraint); whether s has a constraint besides skip1 / skip2
 * (NULL: none); s with a lone $ref replaced by its target. */
int sc_is_annotation(const char *k);
int sc_is_keyword(const char *k);
int sc_constrains(const json_t *s, const char *skip1, const char *skip2);
const json_t *sc_deref(sctx *c, const json_t *s);

/* schema_merge.c: the merge of two schemas that must both hold (a new
 * reference, NULL on errors with c->rc set or out of memory); a made
 * schema kept alive until the compile ends (returned); s without keys k1
 * and k2 (kept); s said another way for its not, its first dependency on a
 * schema, its if (kept; NULL when it has no such form); the merges'
 * memory freed. */
json_t *sc_merge(sctx *c, const json_t *a, const json_t *bb);
const json_t *sc_keep(sctx *c, json_t *s);
const json_t *sc_without(sctx *c, const json_t *s, const char *k1, const char *k2);
const json_t *sc_not_rewrite(sctx *c, const json_t *s, const json_t *nt);
const json_t *sc_dep_rewrite(sctx *c, const json_t *s);
const json_t *sc_if_rewrite(sctx *c, const json_t *s);
void sc_merges_free(sctx *c);

/* schema_draft.c: root as the draft its "$schema" names reads it, with
 * strict, its listing schemas marked CLOSED_OBJ / CLOSED_TUPLE (a new reference;
 * NULL when out of memory). */
json_t *sc_for_draft(const json_t *root, int strict);

/* The fewest significant digits (1 to 17) that write v so that it reads
 * back the same. */
int sc_shortest_digits(double v);
/* A count keyword (minLength, maxItems...) as an int: dflt when absent,
 * clamped to [-1, 1e9]. */
int sc_count_of(const json_t *v, int dflt);
/* A pattern matching exactly the n bytes of v, into out (cap bytes). */
void sc_quote_re(const char *v, size_t n, char *out, size_t cap);
/* The string alternative of schema s. */
gram_x sc_str(sctx *c, const json_t *s);
/* The integer (integer != 0) or number alternative of schema s. */
gram_x sc_num(sctx *c, const json_t *s, int integer);

/* Frees a string json_dumps made: with jansson's free (json_set_alloc_funcs
 * may have replaced malloc's; json_dumps then allocates with the
 * replacement). */
static inline void sc_dumps_free(char *s)
{
    json_free_t f;
    json_get_alloc_funcs(NULL, &f);
    f(s);
}

#endif
