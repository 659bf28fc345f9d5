/* test_schema.c - JSON Schema to grammar (grammar/schema.c): for a table of
 * schemas, compact instances that must be accepted whole and ones that
 * must be refused (full mode); the keywords refused with a message and a JSON
 * pointer; integer and number ranges checked against brute force. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"
#include "qerr.h"
#include "qgram.h"
#include "qtest.h"
#include "schema.h"
#include "util.h"

/* The cases are JSON Schema's own meaning: full mode (strict mode, the
 * default, has test_schema_strict.c). */
static gram *compile(const char *schema) { return compile_flags(schema, GRAM_SCHEMA_FULL); }

typedef struct {
    const char *schema;
    const char *yes[8];
    const char *no[8];
} kase;

static const kase CASES[] = {
    /* not, said another way: not not, not anyOf (De Morgan), not required. */
    { "{\"not\":{\"not\":{\"type\":\"integer\",\"maximum\":5}}}", { "4", "-2" }, { "7", "\"x\"", "4.5" } },
    { "{\"not\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"object\"}]}}", { "[1]", "null", "3" },
      { "\"x\"", "{}" } },
    { "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},"
      "\"not\":{\"required\":[\"a\",\"b\"]}}",
      { "{}", "{\"a\":1}", "{\"b\":2}" }, { "{\"a\":1,\"b\":2}", "{\"b\":2,\"a\":1}", "[]" } },
    { "{\"properties\":{\"a\":{}},\"not\":{\"required\":[\"a\"]},\"additionalProperties\":false}",
      { "{}" }, { "{\"a\":1}", "\"s\"" } },
    /* not of strings, true / false / null, and of a pattern (which only a string can fail). */
    { "{\"type\":\"string\",\"not\":{\"enum\":[\"a.b\",\"x\"]}}", { "\"axb\"", "\"\"", "\"xx\"" }, { "\"a.b\"", "\"x\"" } },
    { "{\"not\":{\"enum\":[null,true,\"q\"]}}", { "false", "\"s\"", "1", "{}" }, { "null", "true", "\"q\"" } },
    { "{\"not\":{\"pattern\":\"^x\"}}", { "\"yx\"", "\"\"" }, { "\"xy\"", "3", "null" } },
    { "{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"maxLength\":4,\"not\":{\"const\":\"abc\"}}",
      { "\"abd\"", "\"abcd\"" }, { "\"abc\"", "\"abcde\"", "\"A\"" } },
    /* propertyNames: extra keys only among the names it allows; a listed name it refuses never given. */
    { "{\"type\":\"object\",\"properties\":{\"Bad\":{},\"ok\":{\"type\":\"integer\"}},\"propertyNames\":{\"pattern\":\"^[a-z]+$\",\"maxLength\":3}}",
      { "{}", "{\"ok\":1}", "{\"abc\":[]}", "{\"ok\":1,\"x\":\"y\"}" }, { "{\"Bad\":1}", "{\"abcd\":1}", "{\"A\":1}", "{\"ok\":\"1\"}" } },
    { "{\"propertyNames\":{\"enum\":[\"a\",\"b.c\"]}}", { "{}", "{\"a\":1}", "{\"b.c\":2,\"a\":3}", "5" }, { "{\"bxc\":1}", "{\"c\":1}" } },
    /* multipleOf a whole number: integers that are multiples (a number too). */
    { "{\"type\":\"number\",\"multipleOf\":11,\"maximum\":100}", { "0", "22", "-33", "99" }, { "7", "110", "1.5", "11.0" } },
    { "{\"multipleOf\":5}", { "15", "-5", "\"x\"", "[]" }, { "16", "2.5" } },
    /* A maxLength above 2000 is generated as 2000. */
    { "{\"type\":\"string\",\"maxLength\":65536}", { "\"\"", "\"abc\"" }, { "3" } },
    { "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}",
      { "{\"b\":\"x\"}", "{\"a\":1,\"b\":\"\"}", "{\"a\":-5,\"b\":\"q\",\"c\":null}", "{\"b\":\"x\",\"zz\":[1,{}]}" },
      { "{}", "{\"a\":1}", "{\"a\":\"1\",\"b\":\"x\"}", "{\"b\":1}", "{\"b\":\"x\",\"a\":\"no\"}", "{\"b\":\"x\",\"b\":\"y\"}" } },
    { "{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":false}",
      { "{}", "{\"a\":[1,\"x\"]}" }, { "{\"b\":1}", "{\"a\":1,\"b\":2}" } },
    { "{\"properties\":{\"dimensions\":{\"oneOf\":[{\"required\":[\"radius\"]},{\"required\":[\"length\",\"width\"]}],"
      "\"properties\":{\"length\":{\"type\":\"number\"},\"radius\":{\"type\":\"number\"},\"width\":{\"type\":\"number\"}},"
      "\"type\":\"object\"}},\"required\":[\"dimensions\"],\"type\":\"object\"}",
      { "{\"dimensions\":{\"radius\":5}}", "{\"dimensions\":{\"length\":1,\"width\":2.5}}" },
      { "{\"dimensions\":{}}", "{\"dimensions\":{\"length\":1}}" } },
    { "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":3}",
      { "[true]", "[true,false,true]" }, { "[]", "[true,true,true,true]", "[1]", "[true,]" } },
    { "{\"type\":\"array\",\"prefixItems\":[{\"const\":\"a\"},{\"type\":\"null\"}],\"items\":false}",
      { "[]", "[\"a\"]", "[\"a\",null]" }, { "[null]", "[\"a\",null,1]" } },
    { "{\"type\":\"array\",\"items\":[{\"type\":\"integer\"}],\"additionalItems\":{\"type\":\"string\"},\"minItems\":2}",
      { "[1,\"x\"]", "[1,\"x\",\"y\"]" }, { "[1]", "[\"x\",1]" } },
    { "{\"enum\":[\"red\",3,null,{\"k\":[1]}]}", { "\"red\"", "3", "null", "{\"k\":[1]}" }, { "\"blue\"", "4", "{\"k\":[]}" } },
    { "{\"type\":[\"string\",\"null\"],\"pattern\":\"^[a-z]+$\"}", { "\"abc\"", "null" }, { "\"ABC\"", "\"\"", "1" } },
    { "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", { "\"ab\"", "\"a\\\"b\"", "\"日本語\"" }, { "\"a\"", "\"abcd\"" } },
    { "{\"type\":\"string\",\"format\":\"date\"}", { "\"2024-02-29\"", "\"1999-12-31\"", "\"2000-02-29\"", "\"0004-02-29\"", "\"0001-01-01\"" },
      { "\"2024-13-01\"", "\"2024-02-30\"", "\"2024-04-31\"", "\"0000-05-04\"", "\"2023-02-29\"", "\"1900-02-29\"" } },
    { "{\"type\":\"string\",\"format\":\"date-time\"}", { "\"2024-02-29T23:59:60Z\"", "\"1999-12-31 01:02:03.5+01:00\"" },
      { "\"0000-01-01T00:00:00Z\"", "\"2023-02-29T00:00:00Z\"", "\"2024-01-01T24:00:00Z\"" } },
    { "{\"type\":\"string\",\"pattern\":\"^[a-z]+\",\"maxLength\":3}", { "\"abc\"", "\"a1\"" }, { "\"abcd\"", "\"1a\"", "\"\"" } },
    { "{\"type\":\"string\",\"format\":\"uuid\"}", { "\"123e4567-e89b-12d3-a456-426614174000\"" }, { "\"123e4567\"" } },
    { "{\"type\":\"integer\",\"minimum\":-3,\"exclusiveMaximum\":120}", { "-3", "0", "119", "7" }, { "-4", "120", "1.5", "01" } },
    { "{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", { "0", "0.5", "1", "1.000" }, { "-0.1", "1.5", "2", "1e5" } },
    { "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/node\"}},\"additionalProperties\":false}},"
      "\"$ref\":\"#/$defs/node\"}",
      { "{}", "{\"next\":{}}", "{\"next\":{\"next\":{\"next\":{}}}}" }, { "{\"next\":1}", "{\"x\":{}}" } },
    { "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]},"
      "{\"properties\":{\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}]}",
      { "{\"a\":\"x\",\"b\":true}" }, { "{\"a\":\"x\"}", "{\"b\":true}" } },
    { "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}],\"nullable\":true}",
      { "5", "\"z\"" }, { "\"zz\"", "true" } },
    { "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"patternProperties\":{\"^x-\":{\"type\":\"string\"},"
      "\"^x\":{\"type\":\"boolean\"}},\"additionalProperties\":false}",
      { "{}", "{\"id\":1,\"x-a\":\"s\"}", "{\"xb\":true,\"x-c\":\"t\"}" },
      { "{\"y\":1}", "{\"x-a\":true}", "{\"xb\":\"s\"}", "{\"id\":\"1\"}" } },
    { "{\"type\":\"object\",\"patternProperties\":{\"^n\":{\"type\":\"number\"}}}",
      { "{\"n1\":2,\"other\":\"any\"}", "{\"q\":[true]}" }, { "{\"n1\":\"two\"}" } },
    { "{\"not\":{\"type\":[\"string\",\"object\"]}}", { "1", "null", "[\"s\"]", "true" }, { "\"s\"", "{}" } },
    { "{\"type\":\"object\",\"properties\":{\"gone\":{\"not\":{}},\"ok\":{\"type\":\"null\"}}}",
      { "{}", "{\"ok\":null}", "{\"other\":1}" }, { "{\"gone\":1}", "{\"ok\":null,\"gone\":null}" } },
    { "{\"type\":\"object\",\"properties\":{\"card\":{\"type\":\"integer\"},\"billing\":{\"type\":\"string\"},"
      "\"note\":{\"type\":\"string\"}},\"dependencies\":{\"card\":[\"billing\"]},\"minProperties\":1,"
      "\"additionalProperties\":false}",
      { "{\"note\":\"x\"}", "{\"card\":1,\"billing\":\"b\"}", "{\"billing\":\"b\",\"card\":1}" },
      { "{}", "{\"card\":1}", "{\"note\":\"x\",\"card\":2}" } },
    /* enum / const values checked against everything beside them. */
    { "{\"enum\":[\"foo\",\"ab\",3],\"maxLength\":2}", { "\"ab\"", "3" }, { "\"foo\"" } },
    { "{\"allOf\":[{\"enum\":[-2.0001,-1,4]},{\"not\":{\"minimum\":-2}}]}", { "-2.0001" }, { "-1", "4" } },
    { "{\"allOf\":[{\"enum\":[{\"a\":1},{\"a\":true},{}]},{\"not\":{\"enum\":[{\"a\":true}]}},{\"not\":{\"maxProperties\":0}}]}",
      { "{\"a\":1}" }, { "{\"a\":true}", "{}" } },
    { "{\"enum\":[1,2.5,\"x\",[1,1],[1,2]],\"type\":[\"integer\",\"array\"],\"uniqueItems\":true}",
      { "1", "[1,2]" }, { "2.5", "\"x\"", "[1,1]" } },
    { "{\"const\":15,\"not\":{\"allOf\":[{\"multipleOf\":2}],\"anyOf\":[{\"multipleOf\":3}]}}", { "15" }, { "16" } },
    { "{\"enum\":[\"a\",\"b\"],\"nullable\":true,\"pattern\":\"b\"}", { "\"b\"", "null" }, { "\"a\"" } },
    { "{\"enum\":[{\"k\":\"v\"},{\"k\":\"2024-01-02\"}],\"$ref\":\"#/$defs/o\",\"$defs\":{\"o\":{\"properties\":{\"k\":{\"format\":\"date\"}}}}}",
      { "{\"k\":\"2024-01-02\"}" }, { "{\"k\":\"v\"}" } },
    /* Counts and dependencies: minProperties (extra keys count once),
     * maxProperties (each member), for few and for many listed properties. */
    { "{\"type\":\"object\",\"minProperties\":1}", { "{\"a\":1}", "{\"a\":1,\"b\":[]}" }, { "{}" } },
    { "{\"type\":\"object\",\"maxProperties\":2,\"properties\":{\"a\":{},\"b\":{},\"c\":{}}}",
      { "{\"a\":1,\"b\":2}", "{\"x\":1}", "{\"c\":1,\"x\":1}", "{}" }, { "{\"a\":1,\"b\":2,\"c\":3}", "{\"a\":1,\"x\":2,\"y\":3}" } },
    { "{\"minProperties\":1,\"maxProperties\":1,\"additionalProperties\":{\"type\":\"boolean\",\"enum\":[false]},\"type\":\"object\"}",
      { "{\"k\":false}" }, { "{}", "{\"a\":false,\"b\":false}", "{\"k\":true}" } },
    { "{\"type\":\"object\",\"properties\":{\"p1\":{\"type\":\"integer\"},\"p2\":{\"type\":\"integer\"},\"p3\":{\"type\":\"integer\"},\"p4\":{\"type\":\"integer\"},\"p5\":{\"type\":\"integer\"},\"p6\":{\"type\":\"integer\"},\"p7\":{\"type\":\"integer\"},\"p8\":{\"type\":\"integer\"}},\"dependencies\":{\"p1\":[\"p8\"]},\"minProperties\":2,\"additionalProperties\":false}",
      { "{\"p1\":1,\"p8\":2}", "{\"p2\":1,\"p3\":1}", "{\"p1\":1,\"p2\":1,\"p8\":1}" }, { "{\"p1\":1,\"p2\":2}", "{\"p2\":1}", "{}", "{\"p8\":1}" } },
    { "{\"type\":\"object\",\"properties\":{\"p1\":{\"type\":\"integer\"},\"p2\":{\"type\":\"integer\"},\"p3\":{\"type\":\"integer\"},\"p4\":{\"type\":\"integer\"},\"p5\":{\"type\":\"integer\"},\"p6\":{\"type\":\"integer\"},\"p7\":{\"type\":\"integer\"},\"p8\":{\"type\":\"integer\"}},\"maxProperties\":2}",
      { "{\"p1\":1,\"p2\":2}", "{\"p1\":1,\"zz\":1}", "{\"zz\":1}" }, { "{\"p1\":1,\"p2\":2,\"p3\":3}", "{\"p1\":1,\"x\":1,\"y\":2}" } },
    { "{\"type\":\"object\",\"properties\":{\"a\":{}},\"dependencies\":{\"b\":[\"c\"]}}",
      { "{\"b\":1,\"c\":2}", "{\"c\":1}", "{\"a\":1,\"c\":1,\"b\":1}" }, { "{\"b\":1}", "{\"a\":1,\"b\":1}" } },
    { "{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}},\"additionalProperties\":false,\"dependencies\":{\"a\":[\"z\"]}}",
      { "{\"b\":1}", "{}" }, { "{\"a\":1}", "{\"a\":1,\"z\":1}" } },
    { "{\"type\":\"object\",\"patternProperties\":{\"^x\":{\"type\":\"integer\"}},\"additionalProperties\":false,\"required\":[\"x1\"]}",
      { "{\"x1\":1}", "{\"x1\":1,\"x2\":2}" }, { "{}", "{\"x1\":\"s\"}", "{\"x1\":1,\"y\":1}" } },
    /* Past ANY_ORDER_MAX listed properties: any order still (the matcher's
     * sets), each at most once, extras anywhere, nested objects each their
     * own set. */
    { "{\"type\":\"object\",\"properties\":{\"p1\":{\"type\":\"integer\"},\"p2\":{\"type\":\"integer\"},\"p3\":{\"type\":\"integer\"},\"p4\":{\"type\":\"integer\"},\"p5\":{\"type\":\"integer\"},\"p6\":{\"type\":\"integer\"},\"p7\":{\"type\":\"integer\"},\"p8\":{\"type\":\"string\"}},\"required\":[\"p2\",\"p7\"]}",
      { "{\"p7\":1,\"p2\":2}", "{\"p8\":\"s\",\"p7\":1,\"x\":null,\"p1\":3,\"p2\":2}", "{\"p2\":1,\"p8\":\"a\",\"p7\":0,\"p6\":1,\"p5\":1,\"p4\":1,\"p3\":1,\"p1\":1}" },
      { "{\"p7\":1}", "{\"p7\":1,\"p2\":2,\"p7\":3}", "{\"p2\":1,\"p7\":2,\"p8\":1}", "{}" } },
    { "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"},\"b\":{},\"c\":{},\"d\":{},\"e\":{},\"f\":{},\"g\":{}},\"additionalProperties\":false,\"maxProperties\":3,\"required\":[\"g\"]}",
      { "{\"g\":1}", "{\"a\":{\"g\":1,\"b\":2},\"g\":1,\"b\":[]}", "{\"b\":1,\"a\":{\"a\":{\"g\":2},\"g\":2},\"g\":3}" },
      { "{\"a\":{\"g\":1,\"g\":1},\"g\":1}", "{\"b\":1,\"c\":2,\"d\":3,\"g\":4}", "{\"b\":1,\"c\":2,\"d\":3}", "{\"g\":1,\"z\":1}" } },
    { "{\"type\":\"object\",\"properties\":{\"p1\":{\"type\":\"integer\"},\"p2\":{\"type\":\"integer\"},\"p3\":{\"type\":\"integer\"},\"p4\":{\"type\":\"integer\"},\"p5\":{\"type\":\"integer\"},\"p6\":{\"type\":\"integer\"},\"p7\":{\"type\":\"integer\"},\"p8\":{\"type\":\"string\"}},\"maxProperties\":3,\"dependencies\":{\"p8\":[\"p1\",\"p2\"]}}",
      { "{\"p2\":1,\"p8\":\"s\",\"p1\":1}", "{\"x\":1,\"y\":2,\"p3\":1}", "{}" },
      { "{\"p3\":1,\"p8\":\"s\",\"p1\":1,\"p2\":2}", "{\"p8\":\"s\",\"p1\":1}", "{\"x\":1,\"p8\":\"s\"}" } },
    /* Drafts: up to 7 a $ref replaces its siblings; if/then/else from 7,
     * const from 6; with no $schema, 2020-12 (siblings apply). */
    { "{\"$schema\":\"http://json-schema.org/draft-07/schema#\",\"definitions\":{\"p\":{\"type\":\"object\"}},"
      "\"properties\":{\"s\":{\"$ref\":\"#/definitions/p\",\"enum\":[\"key\"]}}}",
      { "{\"s\":{\"k\":1}}", "{\"s\":{}}" }, { "{\"s\":\"key\"}" } },
    { "{\"definitions\":{\"p\":{\"type\":\"object\"}},\"properties\":{\"s\":{\"$ref\":\"#/definitions/p\",\"maxProperties\":0}}}",
      { "{\"s\":{}}" }, { "{\"s\":{\"k\":1}}" } },
    { "{\"$schema\":\"http://json-schema.org/draft-04/schema#\",\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
      "\"if\":{\"properties\":{\"a\":{\"const\":1}}},\"then\":{\"required\":[\"b\"]}}",
      { "{\"a\":1}", "{\"a\":1,\"b\":2}" }, { "{\"a\":\"1\"}" } },
    { "{\"$schema\":\"http://json-schema.org/draft-06/schema#\",\"type\":\"object\",\"properties\":{\"a\":{\"const\":1}},"
      "\"if\":{\"required\":[\"a\"]},\"then\":{\"required\":[\"b\"]}}",
      { "{\"a\":1}", "{}" }, { "{\"a\":2}" } },
    { "{\"$schema\":\"http://json-schema.org/draft-04/schema#\",\"type\":\"integer\",\"const\":1}", { "2", "1" }, { "\"1\"" } },
    { "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},"
      "\"if\":{\"properties\":{\"a\":{\"const\":\"x\"}}},\"then\":{\"required\":[\"b\"]}}",
      { "{\"a\":\"x\",\"b\":2}", "{\"a\":\"y\"}" }, { "{\"a\":\"x\"}" } },
    /* A whole number in enum / const either way, 2 or 2.0. */
    { "{\"enum\":[2.0,\"x\",-7]}", { "2", "2.0", "-7", "-7.0", "\"x\"" }, { "2.5", "7", "2.00" } },
    { "{\"const\":9007199254740993}", { "9007199254740993", "9007199254740993.0" }, { "9007199254740992" } },
    { "{\"enum\":[1e300,3]}", { "3", "3.0" }, { "1" } },
    /* Dependencies on a schema: without the property, or with it and the schema. */
    { "{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{\"type\":\"integer\"}},\"dependencies\":{\"a\":{\"required\":[\"b\"]}}}",
      { "{}", "{\"b\":1}", "{\"a\":1,\"b\":2}" }, { "{\"a\":1}", "{\"a\":1,\"b\":\"x\"}" } },
    { "{\"type\":\"object\",\"dependentSchemas\":{\"x\":{\"properties\":{\"y\":{\"type\":\"string\"}}}}}",
      { "{\"x\":1,\"y\":\"s\"}", "{\"y\":2}", "{\"x\":[]}" }, { "{\"x\":1,\"y\":2}" } },
    /* if / then / else, and not of an object's properties. */
    { "{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"a\",\"b\"]},\"n\":{\"type\":\"integer\"}},"
      "\"if\":{\"properties\":{\"kind\":{\"const\":\"a\"}}},\"then\":{\"required\":[\"n\"]},\"else\":{\"properties\":{\"n\":false}}}",
      { "{\"kind\":\"a\",\"n\":1}", "{\"kind\":\"b\"}", "{\"n\":1}", "{\"n\":3,\"kind\":\"a\"}" },
      { "{\"kind\":\"a\"}", "{\"kind\":\"b\",\"n\":1}", "{}" } },
    /* not of integer: numbers with a fraction; with integer allowed only, nothing of it. */
    { "{\"type\":\"number\",\"not\":{\"type\":\"integer\"}}", { "1.5", "-0.25" }, { "3", "-2", "1.0" } },
    { "{\"type\":[\"integer\",\"string\"],\"not\":{\"type\":\"integer\"}}", { "\"s\"" }, { "3", "1.5" } },
    { "{\"allOf\":[{\"if\":{\"type\":\"string\"},\"then\":{\"maxLength\":2}},{\"if\":{\"type\":\"integer\"},\"then\":{\"minimum\":5}}]}",
      { "\"ab\"", "7", "null", "[1]" }, { "\"abc\"", "3" } },
    { "{\"not\":{\"type\":\"object\",\"properties\":{\"a\":{\"const\":\"x\"}},\"required\":[\"b\"]}}",
      { "1", "{}", "{\"b\":1,\"a\":\"y\"}", "{\"a\":\"x\"}" }, { "{\"b\":1}", "{\"b\":1,\"a\":\"x\"}" } },
    /* Formats no specification defines only annotate; draft 3's names. */
    { "{\"type\":\"string\",\"format\":\"topic\"}", { "\"anything\"", "\"\"" }, { "1" } },
    { "{\"type\":\"string\",\"format\":\"host-name\"}", { "\"a.example\"" }, { "\"a b\"" } },
    { "{\"type\":\"string\",\"format\":\"color\"}", { "\"#fff\"", "\"#00ff00\"", "\"navy\"" }, { "\"#ff\"", "\"pink\"" } },
    { "true", { "1", "{\"a\":[null,true,\"s\"]}", "\"\\u0001\"" }, { "{", "tru", "1 " } },
    { "{\"type\":\"object\",\"properties\":{\"q\\\"uote\":{\"const\":1}},\"required\":[\"q\\\"uote\"]}",
      { "{\"q\\\"uote\":1}" }, { "{\"q\\\"uote\":2}" } },
};

static void test_cases(void)
{
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        gram *g = compile(CASES[i].schema);
        CHECK(g != NULL);
        if (!g) continue;
        for (int k = 0; k < 8 && CASES[i].yes[k]; k++)
            if (!takes(g, CASES[i].yes[k])) {
                fprintf(stderr, "  schema %zu: refused %s\n", i, CASES[i].yes[k]);
                CHECK(0);
            }
        for (int k = 0; k < 8 && CASES[i].no[k]; k++)
            if (takes(g, CASES[i].no[k])) {
                fprintf(stderr, "  schema %zu: accepted %s\n", i, CASES[i].no[k]);
                CHECK(0);
            }
        gram_free(g);
    }
}

static void test_refused(void)
{
    static const struct {
        const char *schema, *says;
    } R[] = {
        { "{\"not\":{\"enum\":[1]}}", "'not'" },
        { "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"array\",\"uniqueItems\":true}}}", "/properties/x" },
        { "{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems" },
        { "{\"type\":\"string\",\"format\":\"iri\"}", "format 'iri'" },
        { "{\"enum\":[{}],\"unevaluatedProperties\":false}", "unevaluatedProperties" },
        { "{\"enum\":[\"a\",\"b\"],\"minLength\":3}", "no enum" },
        { "{\"type\":\"number\",\"multipleOf\":0.3}", "multipleOf" },
        { "{\"$ref\":\"#/definitions/missing\"}", "missing" },
        { "{\"type\":\"string\",\"pattern\":\"(?=x)\"}", "lookaround" },
        { "false", "false schema" },
        { "{\"type\":\"strange\"}", "unknown type" },
    };
    /* An object listing 3,000 properties: refused, not a stack 3,000 calls deep. */
    json_t *big = json_pack("{s:s,s:o}", "type", "object", "properties", json_object());
    for (int i = 0; i < 3000; i++) {
        char k[16];
        snprintf(k, sizeof k, "p%d", i);
        json_object_set_new(json_object_get(big, "properties"), k, json_object());
    }
    gram *gb = NULL;
    char eb[800] = "";
    CHECK(gram_schema_compile(big, &gb, eb, sizeof eb) == QERR_LIMIT && gb == NULL);
    CHECK_STR_CONTAINS(eb, "more than 2000 properties");
    json_decref(big);
    for (size_t i = 0; i < sizeof R / sizeof R[0]; i++) {
        json_t *s = json_loads(R[i].schema, JSON_DECODE_ANY, NULL);
        REQUIRE(s);
        gram *g = NULL;
        char err[800] = "";
        const int rc = gram_schema_compile(s, &g, err, sizeof err);
        CHECK(rc < 0 && g == NULL);
        CHECK_STR_CONTAINS(err, R[i].says);
        json_decref(s);
    }
}

/* The integers in [-150, 1500] g gets wrong, against "in [lo, hi] and a
 * multiple of k" (the first few printed). */
static int ints_wrong(const gram *g, int lo, int hi, int k)
{
    int bad = 0;
    for (int v = -150; v <= 1500; v++) {
        char t[16];
        snprintf(t, sizeof t, "%d", v);
        const int want = v >= lo && v <= hi && v % k == 0;
        if (takes(g, t) != want && bad++ < 3) fprintf(stderr, "  [%d, %d] / %d: %d\n", lo, hi, k, v);
    }
    return bad;
}

/* Integer ranges against brute force over [-150, 1500]. */
static void test_ranges(void)
{
    static const int bounds[][2] = { { 0, 0 }, { 0, 9 }, { 1, 10 }, { 7, 123 }, { 99, 1000 }, { -100, -3 }, { -12, 45 },
                                     { 5, 1234 }, { 0, 99 }, { 10, 19 } };
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
        char schema[128];
        snprintf(schema, sizeof schema, "{\"type\":\"integer\",\"minimum\":%d,\"maximum\":%d}", bounds[i][0], bounds[i][1]);
        gram *g = compile(schema);
        REQUIRE(g);
        CHECK_EQ_INT(ints_wrong(g, bounds[i][0], bounds[i][1], 1), 0);
        gram_free(g);
    }
    /* multipleOf against brute force, with and without bounds. */
    for (int k = 2; k <= 13; k += 11) {
        char sch[128];
        snprintf(sch, sizeof sch, "{\"type\":\"integer\",\"multipleOf\":%d,\"minimum\":-40,\"maximum\":900}", k);
        gram *gm = compile(sch);
        REQUIRE(gm);
        CHECK_EQ_INT(ints_wrong(gm, -40, 900, k), 0);
        gram_free(gm);
    }
    /* Unbounded above. */
    gram *g = compile("{\"type\":\"integer\",\"minimum\":37}");
    REQUIRE(g);
    CHECK(takes(g, "37") && takes(g, "99") && takes(g, "100") && takes(g, "123456789"));
    CHECK(!takes(g, "36") && !takes(g, "-40") && !takes(g, "9"));
    gram_free(g);
    /* Numbers with a fraction, against their values. */
    g = compile("{\"type\":\"number\",\"exclusiveMinimum\":-2,\"maximum\":3}");
    REQUIRE(g);
    static const char *const nums[] = { "-2", "-1.99", "-2.5", "-1", "0", "0.25", "2.999", "3", "3.0", "3.01", "4", "-0.5" };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        const double v = atof(nums[i]);
        const int want = v > -2 && v <= 3;
        if (takes(g, nums[i]) != want) fprintf(stderr, "  (-2, 3]: %s\n", nums[i]);
        CHECK_EQ_INT(takes(g, nums[i]), want);
    }
    gram_free(g);
    /* Bounds that are not integers, against brute force over decimals of
     * up to three fraction digits in [-3.5, 3.5] (and trailing zeros). */
    static const struct {
        const char *lo, *hi;
        int lo_x, hi_x;
    } DB[] = { { "0.5", NULL, 0, 0 }, { "0.5", "2.25", 1, 0 }, { "-1.05", "0.3", 0, 1 }, { NULL, "-0.75", 0, 0 },
               { "-2.5", "-0.125", 1, 1 }, { "1.2", "1.25", 0, 0 }, { "0", "0.1", 1, 1 }, { "-0.001", NULL, 0, 0 },
               { "2.999", "3", 1, 0 } };
    for (size_t i = 0; i < sizeof DB / sizeof DB[0]; i++) {
        char sch[256] = "{\"type\":\"number\"";
        if (DB[i].lo) snprintf(sch + strlen(sch), sizeof sch - strlen(sch), ",\"%s\":%s", DB[i].lo_x ? "exclusiveMinimum" : "minimum", DB[i].lo);
        if (DB[i].hi) snprintf(sch + strlen(sch), sizeof sch - strlen(sch), ",\"%s\":%s", DB[i].hi_x ? "exclusiveMaximum" : "maximum", DB[i].hi);
        strcat(sch, "}");
        gram *gd = compile(sch);
        REQUIRE(gd);
        const double lo = DB[i].lo ? atof(DB[i].lo) : -INFINITY, hi = DB[i].hi ? atof(DB[i].hi) : INFINITY;
        int wrong = 0;
        for (int v = -3500; v <= 3500; v++) {
            for (int form = 0; form < 3; form++) {
                char t[32];
                const int a = abs(v);
                if (form == 0) snprintf(t, sizeof t, "%s%d.%03d", v < 0 ? "-" : "", a / 1000, a % 1000);
                else if (form == 1 && a % 100 == 0) snprintf(t, sizeof t, "%s%d.%d", v < 0 ? "-" : "", a / 1000, a % 1000 / 100);
                else if (form == 2 && a % 1000 == 0) snprintf(t, sizeof t, "%s%d", v < 0 ? "-" : "", a / 1000);
                else continue;
                const double x = v / 1000.0;
                const int want = (DB[i].lo_x ? x > lo : x >= lo) && (DB[i].hi_x ? x < hi : x <= hi);
                if (takes(gd, t) != want && wrong++ < 3) fprintf(stderr, "  %s: %s\n", sch, t);
            }
        }
        CHECK_EQ_INT(wrong, 0);
        gram_free(gd);
    }
}

/* Tool calls: named calls with their arguments' schemas, one or several,
 * text first for "auto"; a bad parameters schema names its tool. */
static void test_tools(void)
{
    json_error_t je;
    json_t *p0 = json_loads("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
                            "\"required\":[\"city\"],\"additionalProperties\":false}", 0, &je);
    json_t *p1 = json_loads("{\"$defs\":{\"n\":{\"type\":\"integer\",\"minimum\":1}},\"type\":\"object\","
                            "\"properties\":{\"n\":{\"$ref\":\"#/$defs/n\"}},\"required\":[\"n\"]}", 0, &je);
    REQUIRE(p0 && p1);
    const gram_tool tools[2] = { { "weather", 7, p0 }, { "roll", 4, p1 } };
    char err[800];
    int bad = 7;
    gram *one = NULL, *many = NULL, *aut = NULL;
    REQUIRE(gram_tools_grammar(tools, 2, 0, 1, &bad, &one, err, sizeof err) == 0);
    CHECK_EQ_INT(bad, -1);
    REQUIRE(gram_tools_grammar(tools, 2, 0, 0, NULL, &many, err, sizeof err) == 0);
    REQUIRE(gram_tools_grammar(tools, 2, 1, 0, NULL, &aut, err, sizeof err) == 0);
    const char *w = "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>";
    const char *r = "<tool_call>\n{\"name\": \"roll\", \"arguments\": {\"n\":6}}\n</tool_call>";
    char two[512];
    snprintf(two, sizeof two, "%s\n%s", w, r);
    CHECK(takes(one, w) && takes(one, r) && !takes(one, two));
    CHECK(!takes(one, "<tool_call>\n{\"name\": \"roll\", \"arguments\": {\"n\":0}}\n</tool_call>"));
    CHECK(!takes(one, "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"n\":6}}\n</tool_call>"));
    CHECK(!takes(one, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
    CHECK(!takes(one, "") && !takes(one, "Hello"));
    CHECK(takes(many, w) && takes(many, two) && !takes(many, ""));
    CHECK(takes(aut, "") && takes(aut, "Hello, <b>world</b>\n") && takes(aut, w) && takes(aut, two));
    char mixed[512];
    snprintf(mixed, sizeof mixed, "Let me look.\n%s", w);
    CHECK(takes(aut, mixed));
    CHECK(!takes(aut, "I said <tool_call> and stopped"));
    CHECK(!takes(aut, "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"));
    gram_free(one);
    gram_free(many);
    gram_free(aut);
    /* The second tool's parameters use a keyword that cannot be enforced. */
    json_t *p2 = json_loads("{\"type\":\"array\",\"uniqueItems\":true}", 0, &je);
    const gram_tool bad_tools[2] = { { "weather", 7, p0 }, { "x", 1, p2 } };
    gram *g = NULL;
    CHECK(gram_tools_grammar(bad_tools, 2, 0, 1, &bad, &g, err, sizeof err) != 0);
    CHECK(g == NULL);
    CHECK_EQ_INT(bad, 1);
    CHECK(strstr(err, "uniqueItems") != NULL);
    CHECK(gram_tools_grammar(tools, 0, 0, 1, &bad, &g, err, sizeof err) == QERR_INVAL);
    json_decref(p0);
    json_decref(p1);
    json_decref(p2);
}

/* Each family's form: Llama 3.x's bare objects with "parameters" joined by
 * "; " (text instead of calls only when it does not begin with '{'), and
 * Mistral's [TOOL_CALLS] list; the forms do not take each other's calls. */
static void test_tool_forms(void)
{
    CHECK_EQ_INT(gram_tools_form_named("hermes"), GRAM_TOOLS_HERMES);
    CHECK_EQ_INT(gram_tools_form_named("llama3_json"), GRAM_TOOLS_LLAMA3_JSON);
    CHECK_EQ_INT(gram_tools_form_named("mistral"), GRAM_TOOLS_MISTRAL);
    CHECK_EQ_INT(gram_tools_form_named("pythonic"), -1);
    CHECK_EQ_INT(gram_tools_form_named(NULL), -1);
    CHECK(gram_tools_form_get(GRAM_TOOLS_FORMS) == NULL);
    json_t *p0 = json_loads("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
                            "\"required\":[\"city\"],\"additionalProperties\":false}", 0, NULL);
    REQUIRE(p0);
    const gram_tool tools[2] = { { "weather", 7, p0 }, { "now", 3, NULL } };
    static const struct {
        gram_tools_form form;
        const char *one, *two, *text_then_call, *foreign;
    } F[] = {
        { GRAM_TOOLS_LLAMA3_JSON, "{\"name\": \"weather\", \"parameters\": {\"city\":\"Paris\"}}",
          "{\"name\": \"weather\", \"parameters\": {\"city\":\"Paris\"}}; {\"name\": \"now\", \"parameters\": {}}", NULL,
          "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>" },
        { GRAM_TOOLS_MISTRAL, "[TOOL_CALLS] [{\"name\": \"weather\", \"arguments\": {\"city\":\"Paris\"}}]",
          "[TOOL_CALLS] [{\"name\": \"weather\", \"arguments\": {\"city\":\"Paris\"}}, {\"name\": \"now\", \"arguments\": {}}]",
          "Let me look. [TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}]",
          "{\"name\": \"now\", \"parameters\": {}}" },
        { GRAM_TOOLS_HERMES, "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>",
          "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", "
          "\"arguments\": {}}\n</tool_call>",
          "Hm.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
          "[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}]" },
    };
    char err[800];
    for (size_t i = 0; i < sizeof F / sizeof F[0]; i++) {
        gram *one = NULL, *many = NULL, *aut = NULL;
        const gram_tools_opts o1 = { F[i].form, 0, 1, 0 }, om = { F[i].form, 0, 0, 0 }, oa = { F[i].form, 1, 0, 0 };
        REQUIRE(gram_tools_grammar_opts(tools, 2, &o1, NULL, &one, err, sizeof err) == 0);
        REQUIRE(gram_tools_grammar_opts(tools, 2, &om, NULL, &many, err, sizeof err) == 0);
        REQUIRE(gram_tools_grammar_opts(tools, 2, &oa, NULL, &aut, err, sizeof err) == 0);
        const char *trig = gram_tools_form_get(F[i].form)->trigger;
        CHECK(takes(one, F[i].one) && !takes(one, F[i].two) && !takes(one, "") && !takes(one, F[i].foreign));
        CHECK(takes(many, F[i].one) && takes(many, F[i].two) && !takes(many, "Hello"));
        CHECK(takes(aut, F[i].one) && takes(aut, F[i].two) && takes(aut, "") && takes(aut, "Hello, world"));
        /* Compact heads are not the form (the templates space them). */
        CHECK(!takes(many, "{\"name\":\"now\",\"parameters\":{}}"));
        CHECK(!takes(many, "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>"));
        if (F[i].text_then_call) CHECK(takes(aut, F[i].text_then_call));
        if (trig) {
            /* The trigger in text is the start of calls, or not taken. */
            char said[128];
            snprintf(said, sizeof said, "I said %s and stopped", trig);
            CHECK(!takes(aut, said));
        } else {
            /* llama3_json: text that begins with '{' is a call or nothing;
             * text then a call is text. */
            CHECK(!takes(aut, "{oops}") && takes(aut, "Hm. {\"name\": \"now\"}"));
        }
        gram_free(one);
        gram_free(many);
        gram_free(aut);
    }
    const gram_tools_opts bad = { GRAM_TOOLS_FORMS, 0, 0, 0 };
    gram *g = NULL;
    CHECK(gram_tools_grammar_opts(tools, 2, &bad, NULL, &g, err, sizeof err) == QERR_INVAL && g == NULL);
    CHECK(gram_tools_grammar_opts(tools, 2, NULL, NULL, &g, err, sizeof err) == 0 && g != NULL);
    CHECK(g && takes(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
    gram_free(g);
    json_decref(p0);
}

/* The compile budget reaches a whole schema: its grammar's states, and a
 * deadline passed mid-compile stop it with QERR_LIMIT and a message naming
 * the limit; without a budget the same schema compiles. */
static void test_budget(void)
{
    const char *text = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},"
                       "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150}},\"required\":[\"name\",\"age\"]}";
    json_t *s = json_loads(text, 0, NULL);
    REQUIRE(s != NULL);
    char err[512];
    gram *g = NULL;
    gram_budget_set(&(gram_budget){ .states = 20 });
    CHECK_EQ_INT(gram_schema_compile(s, &g, err, sizeof err), QERR_LIMIT);
    CHECK(g == NULL && strstr(err, "too many states"));
    gram_budget_set(&(gram_budget){ .seconds = 1e-6 });
    const double t0 = q_now();
    while (q_now() < t0 + 1e-5) {
    }
    CHECK_EQ_INT(gram_schema_compile(s, &g, err, sizeof err), QERR_LIMIT);
    CHECK(g == NULL && strstr(err, "time budget"));
    gram_budget_set(&(gram_budget){ .seconds = 60 });
    REQUIRE(gram_schema_compile(s, &g, err, sizeof err) == 0);
    const int states = gram_states(g);
    CHECK(states > 20 && takes(g, "{\"name\":\"Ann\",\"age\":30}"));
    gram_free(g);
    gram_budget_set(NULL);
    REQUIRE(gram_schema_compile(s, &g, err, sizeof err) == 0);
    CHECK_EQ_INT(gram_states(g), states);
    gram_free(g);
    json_decref(s);
}

/* An allOf merge leaves its inputs as they were: merging one side's
 * additionalProperties into the other side's properties changes the merge's
 * own copy, not the schema given (once it changed the schema, and a
 * recursive one came to hold itself: a cycle, leaked). */
static void test_merge_keeps_input(void)
{
    const char *text = "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}},"
                       "{\"additionalProperties\":{\"minimum\":3}}]}";
    json_t *s = json_loads(text, 0, NULL);
    REQUIRE(s != NULL);
    char *before = json_dumps(s, JSON_SORT_KEYS | JSON_COMPACT);
    char err[512];
    gram *g = NULL;
    const int rc = gram_schema_compile(s, &g, err, sizeof err);
    if (rc) fprintf(stderr, "  %s\n", err);
    REQUIRE(rc == 0);
    char *after = json_dumps(s, JSON_SORT_KEYS | JSON_COMPACT);
    CHECK(before && after && !strcmp(before, after));
    CHECK(takes(g, "{\"a\":5}") && !takes(g, "{\"a\":1}"));
    free(before);
    free(after);
    gram_free(g);
    json_decref(s);
    /* What fuzz_schema found (tests/fuzz/corpus/schema/merge_cycle.json):
     * recursive merges that were refused (too deep) left a schema holding
     * itself, 45 blocks leaked; now refused with nothing leaked (the ASan
     * build's run of this test checks). */
    static const char rec[] =
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"typ^\":\"string\"},\""
        "c\":{\"typepe\":\"number\"},\"f\":{\"$rees\":4,\"depenfencies\":{\"a\":[\"c\"]},\"additionalProp"
        "erties\":{\"te\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"typ^\":\"strin"
        "g\"},\"c\":{\"typepe\":\"number\"},\"f\":{\"$ref\":\"#\"},\"gh\":{\"type\":\"a2ray\"}},\"$ref\":"
        "\"#\"},\"gh\":{\"type\":\"a2ray\"}},\"rrequired\":[\"b\",\"h\"],\"maxProperties\":5,\"depenfenrp"
        "g\":\"integer\"}}";
    s = json_loadb(rec, sizeof rec - 1, 0, NULL);
    REQUIRE(s != NULL);
    g = NULL;
    CHECK_EQ_INT(gram_schema_compile(s, &g, err, sizeof err), QERR_LIMIT);
    CHECK(g == NULL && strstr(err, "merges nested more than 48 deep") != NULL);
    gram_free(g);
    json_decref(s);
}

int main(void)
{
    QT_RUN(test_tools);
    QT_RUN(test_tool_forms);
    QT_RUN(test_cases);
    QT_RUN(test_refused);
    QT_RUN(test_ranges);
    QT_RUN(test_budget);
    QT_RUN(test_merge_keeps_input);
    QT_MAIN_END();
}
