/* test_schema_strict.c - strict mode of the JSON Schema compiler (schema.h,
 * the default): an object takes the keys its schema lists, as merged
 * through allOf / $ref / anyOf; patternProperties and additionalProperties
 * keep their meaning; objects and arrays that list nothing stay open;
 * tuples end where they end.  Each case: instances strict mode takes, ones
 * it refuses, and ones it refuses that full mode (GRAM_SCHEMA_FULL) takes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"
#include "qerr.h"
#include "qgram.h"
#include "qtest.h"
#include "schema.h"

static gram *compile(const char *schema, unsigned flags) { return compile_flags(schema, flags); }

typedef struct {
    const char *schema;
    const char *yes[6];  /* taken in both modes */
    const char *no[6];   /* refused in both modes */
    const char *full[6]; /* refused in strict mode, taken in full mode */
} kase;

static const kase CASES[] = {
    /* Listed properties only; required ones still required. */
    { "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}",
      { "{\"b\":\"x\"}", "{\"a\":1,\"b\":\"\"}", "{\"b\":\"\",\"a\":-3}" },
      { "{}", "{\"a\":1}", "{\"b\":1}" },
      { "{\"b\":\"x\",\"c\":null}", "{\"zz\":1,\"b\":\"x\"}", "{\"a\":1,\"b\":\"x\",\"b2\":{}}" } },
    /* An empty properties: no member at all. */
    { "{\"type\":\"object\",\"properties\":{}}", { "{}" }, { "[]" }, { "{\"a\":1}" } },
    /* additionalProperties true or a schema keeps its meaning. */
    { "{\"properties\":{\"a\":{}},\"additionalProperties\":true}", { "{\"a\":1,\"z\":2}", "{\"q\":[]}" }, { "{\"a\"}" }, { NULL } },
    { "{\"properties\":{\"a\":{}},\"additionalProperties\":{\"type\":\"integer\"}}", { "{\"z\":2}", "{\"a\":\"s\",\"y\":3}" },
      { "{\"z\":\"s\"}" }, { NULL } },
    /* patternProperties: the keys they match, nothing else. */
    { "{\"type\":\"object\",\"patternProperties\":{\"^x-\":{\"type\":\"string\"}}}", { "{}", "{\"x-a\":\"s\",\"x-b\":\"t\"}" },
      { "{\"x-a\":1}" }, { "{\"y\":1}", "{\"x-a\":\"s\",\"y\":true}" } },
    { "{\"properties\":{\"id\":{\"type\":\"integer\"}},\"patternProperties\":{\"^n\":{\"type\":\"number\"}}}",
      { "{\"id\":1,\"n1\":2.5}", "{\"n\":0}" }, { "{\"n1\":\"s\"}" }, { "{\"other\":1}", "{\"id\":1,\"m\":2}" } },
    /* allOf: closed as merged, not branch by branch. */
    { "{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}}},{\"properties\":{\"b\":{\"type\":\"string\"}}}]}",
      { "{}", "{\"a\":1,\"b\":\"x\"}", "{\"b\":\"y\"}" }, { "{\"a\":\"1\"}" }, { "{\"c\":1}", "{\"a\":1,\"c\":2}" } },
    { "{\"type\":\"object\",\"properties\":{\"a\":{}},\"allOf\":[{\"$ref\":\"#/$defs/b\"}],"
      "\"$defs\":{\"b\":{\"properties\":{\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}}}",
      { "{\"b\":true}", "{\"a\":[],\"b\":false}" }, { "{\"a\":1}" }, { "{\"b\":true,\"c\":1}" } },
    /* A $ref beside properties: the target's and the sibling's names. */
    { "{\"$defs\":{\"base\":{\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"]}},"
      "\"$ref\":\"#/$defs/base\",\"properties\":{\"name\":{\"type\":\"string\"}}}",
      { "{\"id\":1,\"name\":\"n\"}", "{\"id\":2}" }, { "{\"name\":\"n\"}" }, { "{\"id\":1,\"x\":1}" } },
    /* allOf with one member open to more keys: the merge is open to them. */
    { "{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}}},{\"additionalProperties\":{\"type\":\"integer\"}}]}",
      { "{\"a\":1,\"z\":2}" }, { "{\"z\":\"s\"}" }, { NULL } },
    /* Objects that list nothing stay open. */
    { "{\"type\":\"object\"}", { "{}", "{\"a\":[1]}", "{\"k\":{\"z\":null},\"j\":1}" }, { "[]" }, { NULL } },
    { "{\"type\":\"object\",\"required\":[\"a\"]}", { "{\"a\":1,\"b\":2}" }, { "{\"b\":2}" }, { NULL } },
    { "{\"type\":\"object\",\"propertyNames\":{\"maxLength\":2}}", { "{\"ab\":1,\"c\":2}" }, { "{\"abc\":1}" }, { NULL } },
    /* Names listed by required or dependencies only: allowed, any value. */
    { "{\"properties\":{\"a\":{}},\"required\":[\"b\"]}", { "{\"b\":1}", "{\"a\":1,\"b\":[]}" }, { "{\"a\":1}" },
      { "{\"b\":1,\"c\":1}" } },
    { "{\"properties\":{\"a\":{}},\"dependencies\":{\"a\":[\"b\"]}}", { "{\"a\":1,\"b\":2}", "{\"b\":{}}" }, { "{\"a\":1}" },
      { "{\"a\":1,\"b\":2,\"c\":3}" } },
    /* Nested objects, array items and recursion: each closed. */
    { "{\"properties\":{\"o\":{\"type\":\"object\",\"properties\":{\"x\":{}}}}}", { "{\"o\":{\"x\":1}}", "{\"o\":{}}" }, { "{\"o\":1}" },
      { "{\"o\":{\"y\":1}}", "{\"p\":{}}" } },
    { "{\"type\":\"array\",\"items\":{\"properties\":{\"k\":{\"type\":\"integer\"}}}}", { "[]", "[{\"k\":1},{}]" }, { "[{\"k\":\"1\"}]" },
      { "[{\"j\":1}]" } },
    { "{\"$defs\":{\"n\":{\"properties\":{\"next\":{\"$ref\":\"#/$defs/n\"},\"v\":{\"type\":\"integer\"}}}},\"$ref\":\"#/$defs/n\"}",
      { "{\"next\":{\"v\":1,\"next\":{}}}" }, { "{\"v\":\"1\"}" }, { "{\"next\":{\"w\":1}}" } },
    /* anyOf: each alternative with the names beside the anyOf. */
    { "{\"properties\":{\"kind\":{\"type\":\"string\"}},\"anyOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
      "{\"properties\":{\"b\":{\"type\":\"integer\"}},\"required\":[\"b\"]}]}",
      { "{\"kind\":\"x\",\"a\":1}", "{\"b\":2}" }, { "{}", "{\"kind\":\"x\"}" }, { "{\"a\":1,\"z\":1}", "{\"a\":1,\"b\":2}" } },
    /* not and if only test: they close nothing. */
    { "{\"type\":\"object\",\"not\":{\"properties\":{\"a\":{\"const\":\"x\"}},\"required\":[\"a\"]}}",
      { "{\"b\":2}", "{\"a\":2,\"z\":1}", "{}" }, { "{\"a\":\"x\"}" }, { NULL } },
    { "{\"type\":\"object\",\"if\":{\"properties\":{\"a\":{\"const\":\"x\"}}},\"then\":{\"required\":[\"b\"]}}",
      { "{\"a\":\"x\",\"b\":2,\"c\":3}", "{\"z\":1,\"b\":0}", "{\"a\":1,\"c\":1}" }, { "{\"a\":\"x\"}", "{\"z\":1}" }, { NULL } },
    /* enum and const values as listed. */
    { "{\"properties\":{\"a\":{}},\"enum\":[{\"a\":1,\"b\":2}]}", { "{\"a\":1,\"b\":2}" }, { "{\"a\":1}" }, { NULL } },
    /* Strict would leave nothing (minProperties above the names): open. */
    { "{\"properties\":{},\"minProperties\":1}", { "{\"z\":1}", "{\"b\":[]}" }, { "{}" }, { NULL } },
    /* Tuples: prefixItems without items end there; with items they go on. */
    { "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}", { "[]", "[1]", "[1,\"a\"]" },
      { "[\"a\"]" }, { "[1,\"a\",null]" } },
    { "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":{\"type\":\"string\"}}", { "[1,\"a\",\"b\"]" },
      { "[1,2]" }, { NULL } },
    { "{\"$schema\":\"http://json-schema.org/draft-04/schema#\",\"type\":\"array\",\"items\":[{\"type\":\"integer\"}]}",
      { "[1]", "[]" }, { "[\"a\"]" }, { "[1,2]" } },
    { "{\"$schema\":\"http://json-schema.org/draft-07/schema#\",\"items\":[{\"type\":\"integer\"}],\"additionalItems\":{\"type\":\"boolean\"}}",
      { "[1,true,false]" }, { "[1,2]" }, { NULL } },
    { "{\"type\":\"array\",\"prefixItems\":[{}],\"minItems\":2}", { "[1,2]", "[1,2,3]" }, { "[1]" }, { NULL } },
    { "{\"type\":\"array\"}", { "[]", "[1,\"a\",{\"k\":[]}]" }, { "{}" }, { NULL } },
    /* A tuple closes arrays, not the objects the same schema allows. */
    { "{\"prefixItems\":[{\"type\":\"integer\"}]}", { "{\"0\":\"x\",\"length\":2}", "[1]", "\"s\"" }, { "[\"1\"]" },
      { "[1,2]" } },
    /* Draft 7: a $ref replaces its siblings; its target is closed. */
    { "{\"$schema\":\"http://json-schema.org/draft-07/schema#\",\"definitions\":{\"p\":{\"properties\":{\"x\":{}}}},"
      "\"properties\":{\"s\":{\"$ref\":\"#/definitions/p\",\"additionalProperties\":true}}}",
      { "{\"s\":{\"x\":1}}", "{\"s\":5}" }, { NULL }, { "{\"s\":{\"y\":1}}", "{\"t\":1}" } },
};

static void test_strict_cases(void)
{
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const kase *k = &CASES[i];
        gram *st = compile(k->schema, 0), *fu = compile(k->schema, GRAM_SCHEMA_FULL);
        CHECK(st != NULL && fu != NULL);
        if (!st || !fu) {
            gram_free(st);
            gram_free(fu);
            continue;
        }
        for (int j = 0; j < 6 && k->yes[j]; j++)
            if (!takes(st, k->yes[j]) || !takes(fu, k->yes[j])) {
                fprintf(stderr, "  case %zu: refused %s (strict %d, full %d)\n", i, k->yes[j], takes(st, k->yes[j]),
                        takes(fu, k->yes[j]));
                CHECK(0);
            }
        for (int j = 0; j < 6 && k->no[j]; j++)
            if (takes(st, k->no[j]) || takes(fu, k->no[j])) {
                fprintf(stderr, "  case %zu: accepted %s\n", i, k->no[j]);
                CHECK(0);
            }
        for (int j = 0; j < 6 && k->full[j]; j++)
            if (takes(st, k->full[j]) || !takes(fu, k->full[j])) {
                fprintf(stderr, "  case %zu: %s: strict %d (want 0), full %d (want 1)\n", i, k->full[j],
                        takes(st, k->full[j]), takes(fu, k->full[j]));
                CHECK(0);
            }
        gram_free(st);
        gram_free(fu);
    }
}

/* gram_schema_compile is strict; the schema given is not changed (the
 * marks go on a copy); json_object mode's grammar takes any object. */
static void test_strict_default(void)
{
    const char *text = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                       "\"$defs\":{\"x\":{\"prefixItems\":[{}]}}}";
    json_t *s = json_loads(text, 0, NULL);
    REQUIRE(s != NULL);
    char *before = json_dumps(s, JSON_SORT_KEYS | JSON_COMPACT);
    char err[512];
    gram *g = NULL;
    REQUIRE(gram_schema_compile(s, &g, err, sizeof err) == 0);
    char *after = json_dumps(s, JSON_SORT_KEYS | JSON_COMPACT);
    CHECK(before && after && !strcmp(before, after));
    CHECK(takes(g, "{\"a\":1}") && !takes(g, "{\"a\":1,\"b\":2}"));
    free(before);
    free(after);
    gram_free(g);
    json_decref(s);
    REQUIRE(gram_json_any(&g, err, sizeof err) == 0);
    CHECK(takes(g, "{\"anything\":[1,{\"b\":null}]}") && takes(g, "{}"));
    gram_free(g);
}

/* Tool calls: arguments strict by default, full with the flag. */
static void test_strict_tools(void)
{
    json_t *p = json_loads("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}",
                           0, NULL);
    REQUIRE(p != NULL);
    const gram_tool tools[1] = { { "weather", 7, p } };
    char err[800];
    gram *st = NULL, *fu = NULL, *dflt = NULL;
    const gram_tools_opts so = { GRAM_TOOLS_HERMES, 0, 1, 0 }, fo = { GRAM_TOOLS_HERMES, 0, 1, GRAM_SCHEMA_FULL };
    REQUIRE(gram_tools_grammar_opts(tools, 1, &so, NULL, &st, err, sizeof err) == 0);
    REQUIRE(gram_tools_grammar_opts(tools, 1, &fo, NULL, &fu, err, sizeof err) == 0);
    REQUIRE(gram_tools_grammar(tools, 1, 0, 1, NULL, &dflt, err, sizeof err) == 0);
    const char *ok = "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>";
    const char *more = "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\":\"Paris\",\"unit\":\"C\"}}\n</tool_call>";
    CHECK(takes(st, ok) && takes(fu, ok) && takes(dflt, ok));
    CHECK(!takes(st, more) && takes(fu, more) && !takes(dflt, more));
    gram_free(st);
    gram_free(fu);
    gram_free(dflt);
    json_decref(p);
}

int main(void)
{
    QT_RUN(test_strict_cases);
    QT_RUN(test_strict_default);
    QT_RUN(test_strict_tools);
    QT_MAIN_END();
}
