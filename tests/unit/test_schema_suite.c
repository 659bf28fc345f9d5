/* test_schema_suite.c - no valid instance is out of reach: for every schema
 * of tests/fixtures/schema_suite/suite.json (the JSON-Schema-Test-Suite's
 * valid cases and instances hypothesis-jsonschema generated for the same
 * schemas; scripts/gen_schema_suite.py) that quire compiles in full mode,
 * each valid instance's compact text is fed to the grammar byte by byte and
 * must be taken whole; in strict mode, each instance the fixture marks
 * strict (valid with every listing schema closed) must be too.  Schemas
 * quire refuses (keywords it cannot enforce) are counted, not failed.
 *
 * Then the causes it found, one test each, so that a regression names its
 * cause. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"
#include "qerr.h"
#include "qtest.h"
#include "schema.h"

#define SUITE "tests/fixtures/schema_suite/suite.json"

/* 0 when g takes text whole; else the byte it stopped at, plus one. */
static size_t refused_at(const gram *g, const char *text)
{
    gram_m *m = gram_m_new(g);
    if (!m) return 1;
    const size_t n = strlen(text);
    size_t i = 0;
    while (i < n && gram_m_feed(m, (const uint8_t *)text + i, 1) == 0) i++;
    const int ok = i == n && gram_m_can_end(m);
    gram_m_free(m);
    return ok ? 0 : i + 1;
}

static int in_list(const json_t *a, size_t k)
{
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) if (json_is_integer(x) && (size_t)json_integer_value(x) == k) return 1;
    return 0;
}

/* The instances of one case in one mode: how many were refused (each
 * printed). */
static int refused(const char *id, const gram *g, const json_t *valid, const json_t *only, const char *mode, int *checked)
{
    int bad = 0;
    size_t i;
    json_t *x;
    json_array_foreach(valid, i, x)
    {
        if (only && !in_list(only, i)) continue;
        char *text = gram_json_text(x);
        if (!text) continue;
        (*checked)++;
        const size_t at = refused_at(g, text);
        if (at) {
            fprintf(stderr, "  %s (%s): valid instance %zu refused at byte %zu: %.300s\n", id, mode, i, at - 1, text);
            bad++;
        }
        free(text);
    }
    return bad;
}

static void test_suite(void)
{
    json_error_t je;
    json_t *doc = json_load_file(SUITE, 0, &je);
    if (!doc) fprintf(stderr, "  %s: %s\n", SUITE, je.text);
    REQUIRE(doc != NULL);
    const json_t *cases = json_object_get(doc, "cases");
    REQUIRE(json_array_size(cases) > 500);
    int compiled = 0, refused_schema = 0, strict_refused_schema = 0, checked = 0, strict_checked = 0, bad = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        const char *id = json_string_value(json_object_get(c, "id"));
        const json_t *schema = json_object_get(c, "schema"), *valid = json_object_get(c, "valid");
        gram *g = NULL;
        char err[800];
        if (gram_schema_compile_opts(schema, GRAM_SCHEMA_FULL, &g, err, sizeof err)) {
            refused_schema++;
            continue;
        }
        compiled++;
        bad += refused(id, g, valid, NULL, "full", &checked);
        gram_free(g);
        const json_t *strict = json_object_get(c, "strict");
        if (!json_array_size(strict)) continue;
        if (gram_schema_compile_opts(schema, 0, &g, err, sizeof err)) {
            /* Strict mode refuses no schema that full mode compiles. */
            fprintf(stderr, "  %s: compiled in full mode, not in strict mode: %s\n", id, err);
            strict_refused_schema++;
            continue;
        }
        bad += refused(id, g, valid, strict, "strict", &strict_checked);
        gram_free(g);
    }
    printf("  %zu schemas: %d compiled, %d refused; %d valid instances checked in full mode, %d in strict mode\n",
           json_array_size(cases), compiled, refused_schema, checked, strict_checked);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(strict_refused_schema, 0);
    /* Most of the suite compiles: a change that refused far more schemas
     * would pass the checks above by checking less. */
    CHECK(compiled * 10 >= (int)json_array_size(cases) * 7);
    json_decref(doc);
}

static gram *compile(const char *schema, unsigned flags, char *err, size_t errlen)
{
    json_t *s = json_loads(schema, JSON_DECODE_ANY, NULL);
    gram *g = NULL;
    if (!s) snprintf(err, errlen, "bad test schema");
    else if (gram_schema_compile_opts(s, flags, &g, err, errlen)) g = NULL;
    json_decref(s);
    return g;
}

/* Each schema compiles (full mode) and takes each instance. */
static void takes_all(const char *schema, const char *const *yes, int n)
{
    char err[800];
    gram *g = compile(schema, GRAM_SCHEMA_FULL, err, sizeof err);
    if (!g) fprintf(stderr, "  %s: %s\n", schema, err);
    CHECK(g != NULL);
    for (int i = 0; g && i < n; i++)
        if (refused_at(g, yes[i])) {
            fprintf(stderr, "  %s: refused %s\n", schema, yes[i]);
            CHECK(0);
        }
    gram_free(g);
}

/* The compact text of a string with a control character writes its \u
 * escape in lower case, as every grammar does (jansson writes upper case,
 * and each such instance was refused). */
static void test_control_escapes(void)
{
    json_t *v = json_pack("{s:s}", "k\x1b", "a\x0f\x7f");
    char *t = gram_json_text(v);
    REQUIRE(t != NULL);
    CHECK(!strcmp(t, "{\"k\\u001b\":\"a\\u000f\x7f\"}"));
    free(t);
    json_decref(v);
    static const char *const yes[] = { "\"a\\u000f\"" };
    takes_all("{\"type\":\"string\"}", yes, 1);
    takes_all("{\"enum\":[\"a\\u000F\",1]}", yes, 1);
}

/* additionalItems speaks of its own schema's tuple: beside an allOf whose
 * member has the tuple it holds nothing back; merged arrays hold each
 * side's item schema position by position. */
static void test_items_merge(void)
{
    static const char *const a[] = { "[1,null]", "[1]" };
    takes_all("{\"$schema\":\"http://json-schema.org/draft-04/schema#\",\"allOf\":[{\"items\":[{\"type\":\"integer\"}]}],"
              "\"additionalItems\":{\"type\":\"boolean\"}}",
              a, 2);
    char err[800];
    gram *g = compile("{\"allOf\":[{\"prefixItems\":[{\"type\":\"integer\"}]},{\"items\":{\"type\":\"number\",\"minimum\":0}}]}",
                      GRAM_SCHEMA_FULL, err, sizeof err);
    REQUIRE(g != NULL);
    CHECK(!refused_at(g, "[1,2.5]") && !refused_at(g, "[]"));
    CHECK(refused_at(g, "[-1]") && refused_at(g, "[1.5]") && refused_at(g, "[1,-2]"));
    gram_free(g);
    g = compile("{\"allOf\":[{\"prefixItems\":[{},{}]},{\"items\":false}]}", GRAM_SCHEMA_FULL, err, sizeof err);
    REQUIRE(g != NULL);
    CHECK(!refused_at(g, "[]") && refused_at(g, "[1]"));
    gram_free(g);
}

/* An "$anchor" inside an enum's value is data: the reference goes to the
 * schema that has it. */
static void test_anchor_in_enum(void)
{
    static const char *const yes[] = { "\"(\"", "\"\"", "{\"$anchor\":\"my_anchor\",\"type\":\"null\"}" };
    takes_all("{\"$defs\":{\"e\":{\"enum\":[{\"$anchor\":\"my_anchor\",\"type\":\"null\"}]},"
              "\"real\":{\"$anchor\":\"my_anchor\",\"type\":\"string\"}},\"anyOf\":[{\"$ref\":\"#/$defs/e\"},{\"$ref\":\"#my_anchor\"}]}",
              yes, 3);
}

/* minProperties that only keys beside the listed ones could meet twice
 * over is refused (the grammar counts such keys as one: two may share a
 * key), not compiled into a grammar that refuses {"x":1,"y":2}. */
static void test_min_properties(void)
{
    char err[800] = "";
    gram *g = compile("{\"type\":\"object\",\"minProperties\":2}", GRAM_SCHEMA_FULL, err, sizeof err);
    CHECK(g == NULL);
    CHECK_STR_CONTAINS(err, "minProperties 2");
    static const char *const yes[] = { "{\"a\":1,\"b\":2,\"c\":3}", "{\"b\":1,\"a\":2}" };
    takes_all("{\"properties\":{\"a\":{},\"b\":{}},\"required\":[\"a\",\"b\"],\"minProperties\":2}", yes, 2);
    static const char *const yes2[] = { "{\"a\":1,\"c\":3}" };
    takes_all("{\"properties\":{\"a\":{},\"b\":{},\"c\":{}},\"additionalProperties\":false,\"minProperties\":2}", yes2, 1);
}

/* Formats take what their RFCs allow: IPv6 ending in an IPv4 address,
 * e-mail addresses with a quoted local part or an address literal. */
static void test_formats(void)
{
    static const char *const v6[] = { "\"::ffff:192.168.0.1\"", "\"1:2::192.168.0.1\"", "\"1::d6:192.168.0.1\"",
                                      "\"1000:1000:1000:1000:1000:1000:255.255.255.255\"", "\"::1\"", "\"fe80::\"" };
    takes_all("{\"format\":\"ipv6\"}", v6, 6);
    static const char *const em[] = { "\"\\\"joe bloggs\\\"@example.com\"", "\"\\\"joe@bloggs\\\"@example.com\"",
                                      "\"joe.bloggs@[127.0.0.1]\"", "\"joe.bloggs@[IPv6:::1]\"", "\"a.b@c.example\"" };
    takes_all("{\"format\":\"email\"}", em, 5);
    char err[800];
    gram *g = compile("{\"type\":\"string\",\"format\":\"ipv6\"}", GRAM_SCHEMA_FULL, err, sizeof err);
    REQUIRE(g != NULL);
    CHECK(refused_at(g, "\"1::2::3\"") && refused_at(g, "\"1:2:3:4:5:6:7:8:9\"") && refused_at(g, "\"::256.1.1.1\""));
    gram_free(g);
    g = compile("{\"type\":\"string\",\"format\":\"email\"}", GRAM_SCHEMA_FULL, err, sizeof err);
    REQUIRE(g != NULL);
    CHECK(refused_at(g, "\"joe@\"") && refused_at(g, "\"\\\"joe\\\"x@a.b\"") && refused_at(g, "\"a@[1.2.3]\""));
    gram_free(g);
}

int main(void)
{
    QT_RUN(test_suite);
    QT_RUN(test_control_escapes);
    QT_RUN(test_items_merge);
    QT_RUN(test_anchor_in_enum);
    QT_RUN(test_min_properties);
    QT_RUN(test_formats);
    QT_MAIN_END();
}
