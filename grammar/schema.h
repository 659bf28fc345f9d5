/* schema.h - JSON Schema to a grammar (gram.h) whose sentences are the
 * compact JSON texts of the instances the schema accepts.
 *
 * Output form: compact (no whitespace anywhere), strings with raw UTF-8 and
 * only the escapes a compact serializer writes (\" \\ \b \f \n \r \t,
 * \u00xx for other controls), object properties in any order when the
 * schema lists up to 6, else in the order it lists them (required ones
 * always, optional ones may be left out) with further properties - when
 * additionalProperties allows them - after those, named otherwise.  Numbers: integers as
 * -?(0|[1-9][0-9]*), numbers with an optional fraction and exponent.
 *
 * Keywords enforced: type (also a list), properties, required,
 * additionalProperties, items, prefixItems, additionalItems (tuples of
 * older drafts), minItems, maxItems, enum, const, anyOf, oneOf (generated
 * as anyOf), allOf (merged), $ref with $defs / definitions (local JSON
 * pointers, recursion allowed), pattern, format (date, time, date-time,
 * email, uuid, ipv4, ipv6, uri, hostname; and url, uri-reference,
 * json-pointer, byte, semver, draft 3's host-name, ip-address and color),
 * minLength, maxLength, minimum, maximum, exclusiveMinimum,
 * exclusiveMaximum (compared as decimals), nullable, patternProperties,
 * dependencies / dependentRequired / dependentSchemas, minProperties,
 * maxProperties, not (of {}, of types, of not, anyOf, a one-schema allOf,
 * required, a pattern, and an enum or const of strings, true, false and
 * null), multipleOf a whole number up to 10000 (the integers that are
 * multiples, for a number too), propertyNames of string keywords.
 * An enum or const takes only the values that satisfy every keyword beside
 * it, whatever those are (each value is checked as jsonschema checks it).
 * Extra keys count as at most one towards minProperties (two may share a
 * key); uniqueItems only where it holds by itself (at most one item).
 * Where a smaller set of outputs is as valid, it is made: maxLength above
 * 2000 is generated as 2000 (a pattern's, until its automaton fits), a
 * pattern's repetition count above 1000 as 1000, and a property no value
 * satisfies is never given.  Any other validation keyword (if, contains,
 * uniqueItems, ...) is an error naming it, never ignored.  Unknown keywords
 * are annotations, and so are formats no specification defines (the
 * specification says so); formats the specifications define that quire
 * cannot generate (iri, idn-email, duration, regex, ...) are errors. */
#ifndef QUIRE_GRAM_SCHEMA_H
#define QUIRE_GRAM_SCHEMA_H

#include <jansson.h>
#include <stddef.h>

#include "gram.h"

/* Compiles schema (an object or a boolean) into *out: 0, or QERR_INVAL /
 * QERR_UNSUPPORTED (a keyword named in err, with the JSON pointer where it
 * is), QERR_LIMIT, QERR_NOMEM. */
int gram_schema_compile(const json_t *schema, gram **out, char *err, size_t errlen);

/* The compact JSON text of v as the grammars write it (jansson's
 * strings, numbers in the fewest digits that read back the same: 2.1, not
 * 2.1000000000000001); NULL when out of memory.  free() it. */
char *gram_json_text(const json_t *v);

/* The grammar of any compact JSON value (json_object mode): 0 or as above. */
int gram_json_any(gram **out, char *err, size_t errlen);

/* Free text that the whole of which matches pattern (gram_re.h's syntax,
 * anchored at both ends): 0 or QERR_INVAL / QERR_LIMIT / QERR_NOMEM with a
 * message. */
int gram_regex_grammar(const char *pattern, size_t len, gram **out, char *err, size_t errlen);
/* Exactly one of the n strings s[i] (lens[i] bytes): 0 or as above. */
int gram_choice_grammar(const char *const *s, const size_t *lens, int n, gram **out, char *err, size_t errlen);

/* ---- tool calls ----
 *
 * A call is written as Hermes and Qwen models write theirs:
 *
 *   <tool_call>\n{"name":"NAME","arguments":ARGS}\n</tool_call>
 *
 * with ARGS an instance of the tool's parameters schema (compact, as
 * above), several calls separated by one '\n'. */
#define GRAM_TOOL_OPEN "<tool_call>\n"
#define GRAM_TOOL_CLOSE "\n</tool_call>"

typedef struct {
    const char *name;     /* name_len bytes (any: written as a JSON string) */
    size_t name_len;
    const json_t *params; /* the arguments' schema; NULL: any JSON value */
} gram_tool;

/* Calls of tools[0..n): 1 to max_calls of them (max_calls < 1: no bound);
 * with text_first, any text that does not hold "<tool_call>" comes first
 * and the calls may be left out (tool_choice "auto").  0, or an error as
 * gram_schema_compile's with *bad the index of the tool whose parameters
 * failed (-1 for none; bad may be NULL). */
int gram_tools_grammar(const gram_tool *tools, int n, int text_first, int max_calls, int *bad, gram **out, char *err,
                       size_t errlen);

#endif
