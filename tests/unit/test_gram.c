/* test_gram.c - grammars over bytes and their matchers (grammar/gram.c):
 * a JSON grammar built with the builder accepts compact JSON documents
 * byte by byte and refuses broken ones at the first bad byte; ambiguous
 * alternatives are followed together; completion and "done"; rollback by
 * commits; a refused byte changes nothing; undefined rules and left
 * recursion are reported, not looped on; members in any order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"
#include "qerr.h"
#include "qtest.h"
#include "gram_re.h"

/* Compact JSON: value, object, array, string, number, literals. */
static gram *json_grammar(void)
{
    gram_b *b = gram_b_new();
    const int value = gram_b_rule(b, "value"), object = gram_b_rule(b, "object"), array = gram_b_rule(b, "array"),
              string = gram_b_rule(b, "string"), number = gram_b_rule(b, "number");
    const char *any = "[\\s\\S]*", *num = "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?";
    gram_b_define(b, string,
                  gram_b_seq(b, gram_b_str(b, "\""),
                             gram_b_seq(b, gram_b_regex(b, any, strlen(any), GRAM_RE_JSON_STRING | GRAM_RE_FULL),
                                        gram_b_str(b, "\""))));
    gram_b_define(b, number, gram_b_regex(b, num, strlen(num), GRAM_RE_FULL));
    gram_x member = gram_b_seq(b, gram_b_ref(b, string), gram_b_seq(b, gram_b_str(b, ":"), gram_b_ref(b, value)));
    gram_x members = gram_b_seq(b, member, gram_b_rep(b, gram_b_seq(b, gram_b_str(b, ","),
                                                                      gram_b_seq(b, gram_b_ref(b, string),
                                                                                 gram_b_seq(b, gram_b_str(b, ":"),
                                                                                            gram_b_ref(b, value)))),
                                                      0, -1));
    gram_b_define(b, object,
                  gram_b_seq(b, gram_b_str(b, "{"), gram_b_seq(b, gram_b_rep(b, members, 0, 1), gram_b_str(b, "}"))));
    gram_x items = gram_b_seq(b, gram_b_ref(b, value),
                              gram_b_rep(b, gram_b_seq(b, gram_b_str(b, ","), gram_b_ref(b, value)), 0, -1));
    gram_b_define(b, array,
                  gram_b_seq(b, gram_b_str(b, "["), gram_b_seq(b, gram_b_rep(b, items, 0, 1), gram_b_str(b, "]"))));
    gram_x v = gram_b_ref(b, object);
    v = gram_b_alt(b, v, gram_b_ref(b, array));
    v = gram_b_alt(b, v, gram_b_ref(b, string));
    v = gram_b_alt(b, v, gram_b_ref(b, number));
    v = gram_b_alt(b, v, gram_b_alt(b, gram_b_str(b, "true"), gram_b_alt(b, gram_b_str(b, "false"), gram_b_str(b, "null"))));
    gram_b_define(b, value, v);
    gram *g = NULL;
    char err[256];
    if (gram_b_build(b, value, &g, err, sizeof err)) fprintf(stderr, "  build: %s\n", err);
    gram_b_free(b);
    return g;
}

/* Feeds s byte by byte: the offset of the first refused byte, or -1 when
 * all are taken; *end: complete afterwards. */
static int feed_all(gram_m *m, const char *s, int *end)
{
    const size_t n = strlen(s);
    for (size_t i = 0; i < n; i++)
        if (gram_m_feed(m, (const uint8_t *)s + i, 1)) return (int)i;
    *end = gram_m_can_end(m);
    return -1;
}

static void test_json(void)
{
    gram *g = json_grammar();
    REQUIRE(g);
    static const char *const good[] = {
        "{}", "[]", "0", "-0.5e10", "12", "true", "false", "null", "\"\"", "\"a\\\"b\\\\c\\n\\u0001\"",
        "\"日本語 😀\"", "{\"a\":1}", "[1,2,{\"b\":[true,false,null]}]", "{\"a\":{\"b\":{\"c\":[[[]]]}},\"d\":\"e\"}",
        "[\"x\",-1.25E+3,{}]",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        gram_m *m = gram_m_new(g);
        REQUIRE(m);
        int end = 0;
        const int bad = feed_all(m, good[i], &end);
        if (bad >= 0 || !end) fprintf(stderr, "  %s: refused at %d (end %d)\n", good[i], bad, end);
        CHECK(bad < 0 && end);
        gram_m_free(m);
    }
    /* Refused at the first byte that cannot continue a document. */
    static const struct {
        const char *s;
        int at;
    } bad[] = { { "{,", 1 }, { "[1,]", 3 }, { "{\"a\"}", 4 }, { "{\"a\":1,}", 7 }, { "01", 1 }, { "tru e", 3 },
                { "[1 ]", 2 }, { "{}x", 2 }, { "\"a\nb\"", 2 }, { "-", -2 }, { "1.", -2 }, { "[", -2 } };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gram_m *m = gram_m_new(g);
        int end = 0;
        const int at = feed_all(m, bad[i].s, &end);
        if (bad[i].at == -2) { /* every byte taken, but not complete */
            CHECK(at < 0 && !end);
        } else {
            if (at != bad[i].at) fprintf(stderr, "  %s: refused at %d, expected %d\n", bad[i].s, at, bad[i].at);
            CHECK_EQ_INT(at, bad[i].at);
        }
        gram_m_free(m);
    }
    gram_free(g);
}

static void test_state_and_rollback(void)
{
    gram *g = json_grammar();
    REQUIRE(g);
    gram_m *m = gram_m_new(g);
    REQUIRE(m);
    CHECK(!gram_m_can_end(m) && !gram_m_done(m));
    /* A refused chunk changes nothing, even when its first bytes were fine. */
    CHECK_EQ_INT(gram_m_feed(m, (const uint8_t *)"[1,]", 4), QERR_INVAL);
    CHECK(gram_m_allows(m, (const uint8_t *)"[1,2]", 5));
    CHECK(!gram_m_allows(m, (const uint8_t *)"]", 1));
    /* Tokens: "[1" "," "2" then rollback. */
    CHECK_EQ_INT(gram_m_feed(m, (const uint8_t *)"[1", 2), 0);
    CHECK_EQ_INT(gram_m_commit(m), 0);
    CHECK_EQ_INT(gram_m_feed(m, (const uint8_t *)",", 1), 0);
    CHECK_EQ_INT(gram_m_commit(m), 0);
    CHECK_EQ_INT(gram_m_feed(m, (const uint8_t *)"2", 1), 0);
    CHECK_EQ_INT(gram_m_commit(m), 0);
    CHECK(gram_m_allows(m, (const uint8_t *)"]", 1));
    CHECK_EQ_INT(gram_m_rollback(m, 1), 0); /* back to after "," */
    CHECK(!gram_m_allows(m, (const uint8_t *)"]", 1));
    CHECK(gram_m_allows(m, (const uint8_t *)"true]", 5));
    CHECK_EQ_INT(gram_m_rollback(m, 1), 0); /* after "[1" */
    CHECK(gram_m_allows(m, (const uint8_t *)"]", 1));
    CHECK(gram_m_allows(m, (const uint8_t *)"2]", 2)); /* "12" */
    CHECK_EQ_INT(gram_m_rollback(m, 5), QERR_RANGE);
    CHECK_EQ_INT(gram_m_feed(m, (const uint8_t *)"]", 1), 0);
    CHECK(gram_m_can_end(m) && gram_m_done(m));
    CHECK_EQ_INT(gram_m_feed(m, (const uint8_t *)" ", 1), QERR_INVAL);
    gram_m_reset(m);
    CHECK(!gram_m_can_end(m) && gram_m_allows(m, (const uint8_t *)"{}", 2));
    gram_m_free(m);
    gram_free(g);
}

static void test_ambiguity(void)
{
    /* ("ab" "c" | "a" "bd") as two rules that share a prefix, and a rule
     * that may be empty. */
    gram_b *b = gram_b_new();
    const int root = gram_b_rule(b, "root"), x = gram_b_rule(b, "x"), y = gram_b_rule(b, "y"), opt = gram_b_rule(b, "opt");
    gram_b_define(b, x, gram_b_str(b, "ab"));
    gram_b_define(b, y, gram_b_str(b, "a"));
    gram_b_define(b, opt, gram_b_rep(b, gram_b_str(b, "z"), 0, 1));
    gram_b_define(b, root,
                  gram_b_seq(b, gram_b_alt(b, gram_b_seq(b, gram_b_ref(b, x), gram_b_str(b, "c")),
                                           gram_b_seq(b, gram_b_ref(b, y), gram_b_str(b, "bd"))),
                             gram_b_ref(b, opt)));
    gram *g = NULL;
    char err[256];
    REQUIRE(gram_b_build(b, root, &g, err, sizeof err) == 0);
    gram_b_free(b);
    gram_m *m = gram_m_new(g);
    CHECK_EQ_INT(gram_m_feed(m, (const uint8_t *)"ab", 2), 0);
    CHECK(gram_m_allows(m, (const uint8_t *)"c", 1) && gram_m_allows(m, (const uint8_t *)"d", 1));
    CHECK_EQ_INT(gram_m_feed(m, (const uint8_t *)"d", 1), 0);
    CHECK(gram_m_can_end(m) && !gram_m_done(m)); /* "z" may follow */
    CHECK_EQ_INT(gram_m_feed(m, (const uint8_t *)"z", 1), 0);
    CHECK(gram_m_can_end(m) && gram_m_done(m));
    gram_m_free(m);
    gram_free(g);
}

static void test_errors(void)
{
    char err[256];
    gram *g = NULL;
    gram_b *b = gram_b_new();
    const int r = gram_b_rule(b, "r"), u = gram_b_rule(b, "undefined");
    gram_b_define(b, r, gram_b_ref(b, u));
    CHECK_EQ_INT(gram_b_build(b, r, &g, err, sizeof err), QERR_INVAL);
    CHECK_STR_CONTAINS(err, "undefined");
    gram_b_free(b);
    /* A bad pattern fails the builder with the pattern's message. */
    b = gram_b_new();
    const int p = gram_b_rule(b, "p");
    gram_b_define(b, p, gram_b_regex(b, "(?=x)", 5, 0));
    CHECK_EQ_INT(gram_b_build(b, p, &g, err, sizeof err), QERR_INVAL);
    CHECK_STR_CONTAINS(err, "lookaround");
    gram_b_free(b);
    /* Left recursion, direct and through a rule that may be empty: named. */
    b = gram_b_new();
    const int l = gram_b_rule(b, "l");
    gram_b_define(b, l, gram_b_alt(b, gram_b_seq(b, gram_b_ref(b, l), gram_b_str(b, "a")), gram_b_str(b, "b")));
    CHECK_EQ_INT(gram_b_build(b, l, &g, err, sizeof err), QERR_INVAL);
    CHECK_STR_CONTAINS(err, "'l' calls itself");
    gram_b_free(b);
    b = gram_b_new();
    const int s1 = gram_b_rule(b, "s1"), e = gram_b_rule(b, "maybe"), s2 = gram_b_rule(b, "s2");
    gram_b_define(b, e, gram_b_rep(b, gram_b_str(b, "x"), 0, 1));
    gram_b_define(b, s1, gram_b_alt(b, gram_b_seq(b, gram_b_ref(b, e), gram_b_ref(b, s2)), gram_b_str(b, "b")));
    gram_b_define(b, s2, gram_b_seq(b, gram_b_ref(b, s1), gram_b_str(b, "c")));
    CHECK_EQ_INT(gram_b_build(b, s1, &g, err, sizeof err), QERR_INVAL);
    CHECK_STR_CONTAINS(err, "left recursion");
    gram_b_free(b);
    /* Right recursion is fine: "a"* "b" written as r = "a" r | "b". */
    b = gram_b_new();
    const int rr = gram_b_rule(b, "rr");
    gram_b_define(b, rr, gram_b_alt(b, gram_b_seq(b, gram_b_str(b, "a"), gram_b_ref(b, rr)), gram_b_str(b, "b")));
    REQUIRE(gram_b_build(b, rr, &g, err, sizeof err) == 0);
    gram_b_free(b);
    gram_m *m = gram_m_new(g);
    REQUIRE(m);
    CHECK_EQ_INT(gram_m_feed(m, (const uint8_t *)"aaaab", 5), 0);
    CHECK(gram_m_can_end(m));
    gram_m_free(m);
    gram_free(g);
}

/* Members in any order (gram_b_perm): each at most once, required ones
 * before the end, dependencies, max counting extras; rollback across
 * members restores the set; bad specs fail the builder. */
static void test_perm(void)
{
    char err[256];
    gram *g = NULL;
    gram_b *b = gram_b_new();
    const int root = gram_b_rule(b, "root");
    const gram_x mem[4] = { gram_b_str(b, "a"), gram_b_str(b, "b"), gram_b_str(b, "c"), gram_b_str(b, "d") };
    const unsigned char req[4] = { 0, 1, 0, 0 };
    const int deps[1][2] = { { 2, 3 } }; /* c given: d too */
    const gram_perm p = { 4, mem, req, deps, 1, 1, gram_b_str(b, "x"), 0, 3, "," };
    gram_b_define(b, root, gram_b_seq(b, gram_b_str(b, "{"), gram_b_seq(b, gram_b_perm(b, &p), gram_b_str(b, "}"))));
    REQUIRE(gram_b_build(b, root, &g, err, sizeof err) == 0);
    gram_b_free(b);
    static const struct {
        const char *s;
        int ok;
    } C[] = { { "{b}", 1 },     { "{a,b}", 1 },   { "{b,a}", 1 },   { "{x,b,x}", 1 }, { "{d,c,b}", 1 },
              { "{}", 0 },      { "{a}", 0 },     { "{b,b}", 0 },   { "{c,b}", 0 },   { "{a,b,d,x}", 0 },
              { "{x,x,x,b}", 0 }, { "{c,b,a}", 0 }, { "{b,}", 0 } };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        gram_m *m = gram_m_new(g);
        REQUIRE(m);
        int end = 0;
        const int at = feed_all(m, C[i].s, &end);
        const int ok = at < 0 && end;
        if (ok != C[i].ok) fprintf(stderr, "  %s: %s\n", C[i].s, ok ? "taken" : "refused");
        CHECK_EQ_INT(ok, C[i].ok);
        gram_m_free(m);
    }
    /* "{c,b," needs d next (max 3): a and x are refused there, before the end. */
    gram_m *m = gram_m_new(g);
    REQUIRE(m);
    CHECK_EQ_INT(gram_m_feed(m, (const uint8_t *)"{c,", 3), 0);
    CHECK_EQ_INT(gram_m_commit(m), 0);
    CHECK_EQ_INT(gram_m_feed(m, (const uint8_t *)"b,", 2), 0);
    CHECK(!gram_m_allows(m, (const uint8_t *)"a", 1));
    CHECK(!gram_m_allows(m, (const uint8_t *)"x", 1));
    CHECK(gram_m_allows(m, (const uint8_t *)"d}", 2));
    /* Back to "{c,": b is allowed again, c is not. */
    CHECK_EQ_INT(gram_m_rollback(m, 0), 0);
    CHECK(gram_m_allows(m, (const uint8_t *)"b", 1));
    CHECK(!gram_m_allows(m, (const uint8_t *)"c", 1));
    gram_m_free(m);
    gram_free(g);
    /* Bad specs. */
    b = gram_b_new();
    gram_perm bad = { 1, mem, NULL, NULL, 0, 0, 0, 0, -1, ", " };
    CHECK(gram_b_perm(b, &bad) == QERR_INVAL);
    gram_b_free(b);
    b = gram_b_new();
    const gram_x one = gram_b_str(b, "a");
    const int far[1][2] = { { 0, 5 } };
    bad = (gram_perm){ 1, &one, NULL, far, 1, 0, 0, 0, -1, "," };
    CHECK(gram_b_perm(b, &bad) == QERR_RANGE);
    gram_b_free(b);
}

/* The cache: the same key gives the same grammar, retained; the least
 * recently used goes past the capacity; a grammar outlives its eviction
 * while someone holds it. */
static void test_cache(void)
{
    gram_cache *c = gram_cache_new(2);
    REQUIRE(c);
    gram *g[3];
    for (int i = 0; i < 3; i++) g[i] = json_grammar();
    REQUIRE(g[0] && g[1] && g[2]);
    CHECK(gram_cache_get(c, "a", 1) == NULL);
    gram_cache_put(c, "a", 1, g[0]);
    gram_cache_put(c, "b", 1, g[1]);
    gram *x = gram_cache_get(c, "a", 1); /* a is now the most recently used */
    CHECK(x == g[0]);
    gram_free(x);
    gram_cache_put(c, "c", 1, g[2]); /* b goes */
    CHECK(gram_cache_get(c, "b", 1) == NULL);
    x = gram_cache_get(c, "c", 1);
    CHECK(x == g[2]);
    gram_free(x);
    /* Ours are still alive after the cache is gone. */
    gram_cache_free(c);
    for (int i = 0; i < 3; i++) {
        gram_m *m = gram_m_new(g[i]);
        CHECK(m && gram_m_feed(m, (const uint8_t *)"[1]", 3) == 0);
        gram_m_free(m);
        gram_free(g[i]);
    }
}

int main(void)
{
    QT_RUN(test_json);
    QT_RUN(test_state_and_rollback);
    QT_RUN(test_ambiguity);
    QT_RUN(test_errors);
    QT_RUN(test_perm);
    QT_RUN(test_cache);
    QT_MAIN_END();
}
