/* schema.h - JSON Schema to a grammar (gram.h) whose sentences are the
 * compact JSON texts of the instances the schema accepts.
 *
 * Output form: compact (no whitespace anywhere), strings with raw UTF-8 and
 * only the escapes a compact serializer writes (\" \\ \b \f \n \r \t,
 * \u00xx in lower case for other controls), listed object properties
 * in any order, each at most once (required ones always, optional ones may
 * be left out), with further properties - where additionalProperties or
 * patternProperties allow them - anywhere among them.  Numbers: integers as
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
 * Extra keys (none of the listed names) count as at most one towards
 * minProperties, since two may share a key: a minProperties that a valid
 * object could meet only with two of them is refused, never compiled into
 * a grammar that refuses that object; uniqueItems only where it holds by
 * itself (at most one item).  allOf's arrays merge position by position
 * (one member's "items" holds for another's tuple; additionalItems only
 * for its own schema's).  Formats are asserted, each as its RFC reads it
 * (email: RFC 5321's mailbox, quoted local parts and address literals
 * included; ipv6: RFC 3986's, with an IPv4 tail).
 * Where a smaller set of outputs is as valid, it is made: maxLength above
 * 2000 is generated as 2000 (a pattern's, until its automaton fits), a
 * pattern's repetition count above 1000 as 1000, and a property no value
 * satisfies is never given.  Any other validation keyword (if, contains,
 * uniqueItems, ...) is an error naming it, never ignored.  Unknown keywords
 * are annotations, and so are formats no specification defines (the
 * specification says so); formats the specifications define that quire
 * cannot generate (iri, idn-email, duration, regex, ...) are errors.
 *
 * Strict mode (the default; GRAM_SCHEMA_FULL turns it off): what a schema
 * lists is what is generated, as XGrammar's strict_mode (vLLM's default:
 * as if unevaluatedProperties and unevaluatedItems were false) and
 * llama.cpp's json-schema-to-grammar (properties without
 * additionalProperties close the object) do, so that a model cannot invent
 * keys until it runs out of tokens.  Unlike XGrammar, which makes
 * {"type": "object"} only {} and {"type": "array"} only [], schemas that
 * list nothing stay open, as in llama.cpp.  Exactly:
 *   - An object whose schema has "properties" (even {}) or
 *     "patternProperties", and no "additionalProperties", takes only the
 *     keys that "properties", "required" and "dependentRequired" /
 *     "dependencies" name (a name listed only by the latter two takes any
 *     value) and the keys its patternProperties match: as if
 *     additionalProperties were false, but for the names listed.
 *   - The object is judged as merged: allOf members, a $ref beside other
 *     keywords, the keywords beside an anyOf / oneOf alternative, and an
 *     if's then / else are merged first, and the merge is closed when any
 *     part listed properties.  allOf [{properties {a}}, {properties {b}}]
 *     takes a and b; an anyOf alternative takes its own names and those
 *     beside the anyOf.  Schemas under not, if, propertyNames and contains
 *     only test instances: they close nothing.
 *   - An object schema that lists no properties ({"type": "object"}, one
 *     with only required, propertyNames, min/maxProperties) stays open, as
 *     llama.cpp keeps it (json_object mode and gram_json_any: any object).
 *   - additionalProperties true or a schema keeps its meaning: the object
 *     is open to keys of that schema.  unevaluatedProperties and
 *     unevaluatedItems are refused in both modes (errors, as above).
 *   - A tuple (prefixItems, or an "items" list in older drafts) without
 *     "items" / "additionalItems" for the rest takes no items past it.
 *     An array without a tuple ({"type": "array"}) stays open.
 *   - Where closing would leave no instance (minProperties above the names
 *     listed, minItems above the tuple's length), the object or array stays
 *     open.
 *   - enum and const values are taken as listed, whatever their keys.
 * Full mode is JSON Schema's meaning: keys and items a schema does not
 * forbid may be generated. */
#ifndef QUIRE_GRAM_SCHEMA_H
#define QUIRE_GRAM_SCHEMA_H

#include <jansson.h>
#include <stddef.h>

#include "gram.h"

/* Flags of gram_schema_compile_opts and gram_tools_grammar_opts. */
#define GRAM_SCHEMA_FULL 1u /* full JSON Schema semantics: no strict mode */

/* Compiles schema (an object or a boolean) into *out, in strict mode
 * unless flags has GRAM_SCHEMA_FULL: 0, or QERR_INVAL / QERR_UNSUPPORTED
 * (a keyword named in err, with the JSON pointer where it is), QERR_LIMIT,
 * QERR_NOMEM.  The schema stays the caller's (not changed, not kept). */
int gram_schema_compile_opts(const json_t *schema, unsigned flags, gram **out, char *err, size_t errlen);
/* gram_schema_compile_opts(schema, 0, ...): strict mode. */
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
 * A call is the JSON object {"name": "NAME", "KEY": ARGS}, its head spaced
 * as the chat templates write it (json.dumps' separators) and ARGS an
 * instance of the tool's parameters schema (compact, as above).  Model
 * families wrap and separate calls in the forms their templates show,
 * named after vLLM's --tool-call-parser:
 *
 *   hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
 *                (Hermes, Qwen; several calls separated by '\n')
 *   llama3_json  {"name": "f", "parameters": {...}}
 *                (Llama 3.1-3.3; several separated by "; "; the calls are
 *                the whole output, and text is what does not begin with '{')
 *   mistral      [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]
 *                (Mistral v0.3 and later) */
typedef enum { GRAM_TOOLS_HERMES, GRAM_TOOLS_LLAMA3_JSON, GRAM_TOOLS_MISTRAL, GRAM_TOOLS_FORMS } gram_tools_form;

typedef struct {
    const char *parser;     /* its name (above) */
    const char *trigger;    /* the text that begins the calls; NULL: they begin the output, with '{' */
    const char *list_open;  /* before the first call */
    const char *list_close; /* after the last */
    const char *open;       /* around each call */
    const char *close;
    const char *sep;        /* between two calls (after close, before open) */
    const char *key;        /* the arguments' key: "arguments" or "parameters" */
    const char *tokens[3];  /* the markers a model may have as tokens of their own (NULL-terminated) */
} gram_tools_form_desc;

/* Form f's description (NULL for none). */
const gram_tools_form_desc *gram_tools_form_get(gram_tools_form f);
/* The form of a parser name, or -1. */
int gram_tools_form_named(const char *parser);

typedef struct {
    const char *name;     /* name_len bytes (any: written as a JSON string) */
    size_t name_len;
    const json_t *params; /* the arguments' schema; NULL: any JSON value */
} gram_tool;

typedef struct {
    gram_tools_form form;
    /* Text may come instead of the calls (tool_choice "auto"): any text
     * without the form's trigger first, then calls or nothing (llama3_json:
     * calls, or text that does not begin with '{'). */
    int text_first;
    int max_calls;  /* 1 to max_calls calls (< 1: no bound) */
    unsigned flags; /* as gram_schema_compile_opts' */
} gram_tools_opts;

/* Calls of tools[0..n) in the form and numbers o says (NULL: hermes, one
 * or more calls, strict), each one's arguments compiled as
 * gram_schema_compile_opts compiles them.  0, or an error as
 * gram_schema_compile's with *bad the index of the tool whose parameters
 * failed (-1 for none; bad may be NULL). */
int gram_tools_grammar_opts(const gram_tool *tools, int n, const gram_tools_opts *o, int *bad, gram **out, char *err,
                            size_t errlen);
/* Hermes calls in strict mode: gram_tools_grammar_opts with {HERMES,
 * text_first, max_calls, 0}. */
int gram_tools_grammar(const gram_tool *tools, int n, int text_first, int max_calls, int *bad, gram **out, char *err,
                       size_t errlen);

#endif
