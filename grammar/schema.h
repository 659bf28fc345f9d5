/* schema.h - JSON Schema to a grammar (gram.h) whose sentences are the
 * compact JSON texts of the instances the schema accepts.
 *
 * Output form: compact (no whitespace anywhere), strings with raw UTF-8 and
 * only the escapes a compact serializer writes (\" \\ \b \f \n \r \t,
 * \u00xx for other controls), object properties in the order the schema
 * lists them (required ones always, optional ones may be left out),
 * further properties - when additionalProperties allows them - after
 * those, with names other than the listed ones.  Numbers: integers as
 * -?(0|[1-9][0-9]*), numbers with an optional fraction and exponent.
 *
 * Keywords enforced: type (also a list), properties, required,
 * additionalProperties, items, prefixItems, additionalItems (tuples of
 * older drafts), minItems, maxItems, enum, const, anyOf, oneOf (generated
 * as anyOf), allOf (merged), $ref with $defs / definitions (local JSON
 * pointers, recursion allowed), pattern, format (date, time, date-time,
 * email, uuid, ipv4, ipv6, uri, hostname), minLength, maxLength, minimum,
 * maximum, exclusiveMinimum, exclusiveMaximum (integers; numbers with
 * integer bounds), nullable.  minProperties, maxProperties, uniqueItems and
 * multipleOf only where they hold by themselves.  Any other validation
 * keyword (not, if, patternProperties, ...) is an error naming it, never
 * ignored; unknown keywords are annotations, as the specification says. */
#ifndef QUIRE_GRAM_SCHEMA_H
#define QUIRE_GRAM_SCHEMA_H

#include <jansson.h>
#include <stddef.h>

#include "gram.h"

/* Compiles schema (an object or a boolean) into *out: 0, or QERR_INVAL /
 * QERR_UNSUPPORTED (a keyword named in err, with the JSON pointer where it
 * is), QERR_LIMIT, QERR_NOMEM. */
int gram_schema_compile(const json_t *schema, gram **out, char *err, size_t errlen);

/* The grammar of any compact JSON value (json_object mode): 0 or as above. */
int gram_json_any(gram **out, char *err, size_t errlen);

/* Free text that the whole of which matches pattern (gram_re.h's syntax,
 * anchored at both ends): 0 or QERR_INVAL / QERR_LIMIT / QERR_NOMEM with a
 * message. */
int gram_regex_grammar(const char *pattern, size_t len, gram **out, char *err, size_t errlen);
/* Exactly one of the n strings s[i] (lens[i] bytes): 0 or as above. */
int gram_choice_grammar(const char *const *s, const size_t *lens, int n, gram **out, char *err, size_t errlen);

#endif
