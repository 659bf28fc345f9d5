/* schema_draft.c - a schema as the draft its "$schema" names reads it
 * (schema_int.h's sc_for_draft).
 *
 * The compiler reads keywords as draft 2020-12 does.  Older drafts differ
 * in what they ignore, and a validator of that draft (Python's jsonschema,
 * for one) accepts what they ignore:
 *   - up to draft 7, a "$ref" replaces the keywords beside it;
 *   - before draft 7 there is no if / then / else;
 *   - before draft 6 there is no const, contains or propertyNames;
 *   - before 2019-09 there is no dependentRequired, dependentSchemas,
 *     prefixItems, unevaluated* or min/maxContains.
 * So the schema is copied without those keywords, at every place that
 * holds a schema (never inside enum, const or property names).  Without a
 * "$schema", or with one of 2019-09 or later, it is taken as it is.
 *
 * In strict mode (schema.h) the same walk marks the schemas that list
 * properties or tuple items with CLOSED_OBJ / CLOSED_TUPLE, annotations
 * that merges carry along: obj_x and arr_x close the object or array as
 * merged, when it has the mark and nothing says what other members may
 * be. */
#include <string.h>

#include "schema_int.h"

#define MAX_DEPTH 256 /* deeper the compiler refuses anyway */

static int draft_of(const json_t *root)
{
    const char *s = json_string_value(json_object_get(root, "$schema"));
    if (!s) return 2020;
    static const struct {
        const char *tag;
        int draft;
    } D[] = { { "draft-03", 3 }, { "draft-04", 4 }, { "draft-06", 6 }, { "draft-07", 7 }, { "2019-09", 2019 } };
    for (size_t i = 0; i < sizeof D / sizeof D[0]; i++)
        if (strstr(s, D[i].tag)) return D[i].draft;
    return 2020;
}

static int in(const char *k, const char *const *list)
{
    for (; *list; list++)
        if (!strcmp(k, *list)) return 1;
    return 0;
}

/* Whether draft d ignores keyword k of a schema (beside_ref: the schema has
 * a "$ref"). */
static int ignored(int d, const char *k, int beside_ref)
{
    static const char *const SINCE7[] = { "if", "then", "else", NULL };
    static const char *const SINCE6[] = { "const", "contains", "propertyNames", NULL };
    static const char *const SINCE2019[] = { "dependentRequired", "dependentSchemas", "prefixItems",
                                             "unevaluatedProperties", "unevaluatedItems", "minContains",
                                             "maxContains", NULL };
    if (beside_ref && d <= 7 && strcmp(k, "$ref") && sc_is_keyword(k)) return 1;
    return (d < 7 && in(k, SINCE7)) || (d < 6 && in(k, SINCE6)) || (d < 2019 && in(k, SINCE2019));
}

static void rewrite(json_t *s, int d, int mark, int depth);

static void each_value(json_t *o, int d, int mark, int depth)
{
    const char *k;
    json_t *v;
    if (json_is_object(o)) json_object_foreach(o, k, v) rewrite(v, d, mark, depth);
}

static void each_item(json_t *a, int d, int mark, int depth)
{
    size_t i;
    json_t *v;
    if (json_is_array(a)) json_array_foreach(a, i, v) rewrite(v, d, mark, depth);
}

/* s as draft d reads it; with mark (strict mode), a schema that lists
 * properties gets CLOSED_OBJ, one with a tuple CLOSED_TUPLE.  Schemas
 * under not, if, propertyNames and contains are not marked: they test an
 * instance, they do not describe one. */
static void rewrite(json_t *s, int d, int mark, int depth)
{
    if (!json_is_object(s) || depth > MAX_DEPTH) return;
    const int beside_ref = json_is_string(json_object_get(s, "$ref"));
    const char *k;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(s, tmp, k, v) if (ignored(d, k, beside_ref)) json_object_del(s, k);
    static const char *const MAPS[] = { "properties", "patternProperties", "definitions", "$defs",
                                        "dependencies", "dependentSchemas", NULL };
    static const char *const LISTS[] = { "anyOf", "oneOf", "allOf", "prefixItems", NULL };
    static const char *const ONE[] = { "additionalItems", "additionalProperties", "not", "if", "then", "else",
                                       "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties", NULL };
    static const char *const TESTS[] = { "not", "if", "propertyNames", "contains", NULL };
    json_object_foreach(s, k, v)
    {
        const int m = mark && !in(k, TESTS);
        if (in(k, MAPS)) each_value(v, d, m, depth + 1);
        else if (in(k, LISTS)) each_item(v, d, m, depth + 1);
        else if (in(k, ONE)) rewrite(v, d, m, depth + 1);
        else if (!strcmp(k, "items")) json_is_array(v) ? each_item(v, d, m, depth + 1) : rewrite(v, d, m, depth + 1);
    }
    const int lists = json_is_object(json_object_get(s, "properties")) || json_is_object(json_object_get(s, "patternProperties"));
    if (mark && lists) json_object_set_new(s, CLOSED_OBJ, json_true());
    if (mark && (json_is_array(json_object_get(s, "prefixItems")) || json_is_array(json_object_get(s, "items"))))
        json_object_set_new(s, CLOSED_TUPLE, json_true());
}

json_t *sc_for_draft(const json_t *root, int strict)
{
    const int d = json_is_object(root) ? draft_of(root) : 2020;
    if (d >= 2019 && !strict) return json_incref((json_t *)root);
    json_t *copy = json_deep_copy(root);
    if (copy) rewrite(copy, d, strict, 0);
    return copy;
}
