/* test_regex.c - JSON Schema patterns to a byte DFA (grammar/gram_re.c),
 * with PCRE2 as the oracle: for a table of patterns and for random ones,
 * every string of a set (and random strings) matches exactly when PCRE2
 * finds a match, both on raw UTF-8 and on the JSON-string encoding; anchors,
 * classes, repetition counts, UTF-8 classes; and the constructs refused
 * with a message. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qerr.h"
#include "qtest.h"
#include "gram.h"
#include "gram_re.h"
#include "util.h"

/* PCRE2's verdict: the pattern found in s (ECMA-262-like options). */
static int oracle(const char *pat, const char *s, size_t n, int full)
{
    int ec;
    PCRE2_SIZE eo;
    char buf[600];
    if (full) snprintf(buf, sizeof buf, "^(?:%s)$", pat);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(full ? buf : pat), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_ALT_BSUX, &ec, &eo, NULL);
    if (!re) return -1;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    const int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

/* s as the inside of a JSON string (ensure_ascii off). */
static size_t json_encode(const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') out[o++] = '\\', out[o++] = (char)c;
        else if (c == '\n') out[o++] = '\\', out[o++] = 'n';
        else if (c == '\t') out[o++] = '\\', out[o++] = 't';
        else if (c == '\r') out[o++] = '\\', out[o++] = 'r';
        else if (c == '\b') out[o++] = '\\', out[o++] = 'b';
        else if (c == '\f') out[o++] = '\\', out[o++] = 'f';
        else if (c < 0x20) o += (size_t)sprintf(out + o, "\\u%04x", c);
        else out[o++] = (char)c;
    }
    return o;
}

static int g_mismatch;

/* Every string of strs against pattern, raw and JSON-encoded, both flags. */
static void agree(const char *pat, const char *const *strs, int n)
{
    char err[256];
    for (int full = 0; full < 2; full++)
        for (int json = 0; json < 2; json++) {
            gram_re *re = NULL;
            unsigned fl = (json ? GRAM_RE_JSON_STRING : 0) | (full ? GRAM_RE_FULL : 0);
            if (gram_re_compile(pat, strlen(pat), fl, &re, err, sizeof err)) {
                fprintf(stderr, "  /%s/: %s\n", pat, err);
                g_mismatch++;
                continue;
            }
            for (int i = 0; i < n; i++) {
                char enc[1024];
                const size_t len = strlen(strs[i]);
                const size_t el = json ? json_encode(strs[i], len, enc) : len;
                const int got = gram_re_match(re, json ? enc : strs[i], el);
                const int want = oracle(pat, strs[i], len, full);
                if (got != want) {
                    if (g_mismatch < 20)
                        fprintf(stderr, "  /%s/ %s%s on \"%s\": got %d, PCRE2 %d\n", pat, json ? "json " : "",
                                full ? "full " : "", strs[i], got, want);
                    g_mismatch++;
                }
            }
            gram_re_free(re);
        }
}

static const char *const STRS[] = {
    "", "a", "b", "ab", "abc", "abcabc", "aaa", "aab", "ba", "xyz", "0", "12", "123", "1234", "12345", "a1",
    "_", "a_b", " ", "a b", "\t", "a\nb", "\n", "\"", "a\"b", "\\", "a\\b", "\x01", "{", "{1}", "a{2}", "-", "a-b",
    "é", "ü", "日本", "日本語", "😀", "a😀b", "ÿ", "2020-01-31", "12:34:56", "x@y.z", "+1-555-0100", "AB_12",
    "http://x.org/a?b=c", "ACGT", "acgtn", "Z", "zz", ".", "..", "a.b", "$", "^", "|", "(", ")", "*", "+", "?",
};
#define NSTRS ((int)(sizeof STRS / sizeof STRS[0]))

static void test_table(void)
{
    static const char *const pats[] = {
        "a", "^a", "a$", "^a$", "^$", "", "ab|c", "^ab$|^c$", "^(ab|c)$", "a*", "^a*$", "^a+$", "^a?b$",
        "^a{2}$", "^a{2,}$", "^a{1,2}b?$", "^[a-c]+$", "^[^a-c]+$", "^\\d+$", "^\\D+$", "^\\w+$", "^\\W*$",
        "^\\s$", "^.$", "^..$", "^.*$", "^[\\d_]+$", "^[a\\-b]+$", "^[-a]+$", "^[a-]+$", "\\.", "^\\.$",
        "^\\$$", "^\\^", "\\|", "^\\(\\)$", "^[\\\\\"]+$", "^\\\\$", "^\"$", "^[é-ü]$", "^[^é]$", "^日本",
        "語$", "^\\u65e5", "^[\\u0000-\\u007f]*$", "^\\x41", "^(?:ab)+$", "^(?<y>\\d{4})-(\\d{2})-\\d{2}$",
        "^\\d{2}:\\d{2}:\\d{2}$", "^[^@]+@[^@]+\\.[a-z]+$", "^\\+?[0-9-]+$", "^[ACGTacgtn]+$", "^[A-Z_0-9]+$",
        "^https?://", "a{", "^a{,2}$", "^(a|ab)(c|bcd)?$", "^((a)|b)*$", "[😀]", "^[^\\n]*$", "^\\t$",
        "^[\\s\\S]$", "^(|a)$", "a|", "^(a*)*$", "^[a-zA-Z]{1,3}$", "(x|y|z)+$", "^[\\w.+-]+$",
    };
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++) agree(pats[i], STRS, NSTRS);
    CHECK_EQ_INT(g_mismatch, 0);
}

/* Random patterns over a small alphabet against random strings. */
static void test_random(void)
{
    uint64_t x = 12345;
#define RND(n) ((int)((x = x * 6364136223846793005ULL + 1442695040888963407ULL) >> 33) % (n))
    static const char *const atoms[] = { "a", "b", "c", "[ab]", "[^a]", ".", "\\d", "\\w", "(a|b)", "(ab|c)", "\"",
                                         "\\\\", "é", "[a-c]", "(?:ba)", "\\s" };
    static const char *const reps[] = { "", "", "", "*", "+", "?", "{2}", "{1,3}", "{0,2}" };
    static const char alpha[] = "abc1 \"\\";
    char *strs[200];
    for (int i = 0; i < 200; i++) {
        strs[i] = calloc(16, 1);
        const int len = RND(8);
        for (int k = 0; k < len; k++) strs[i][k] = alpha[RND((int)sizeof alpha - 1)];
    }
    strcpy(strs[0], "é");
    strcpy(strs[1], "aé1");
    for (int t = 0; t < 300; t++) {
        char pat[256] = "";
        if (RND(3) == 0) strcat(pat, "^");
        const int n = 1 + RND(4);
        for (int k = 0; k < n; k++) {
            strcat(pat, atoms[RND((int)(sizeof atoms / sizeof atoms[0]))]);
            strcat(pat, reps[RND((int)(sizeof reps / sizeof reps[0]))]);
            if (RND(6) == 0 && k + 1 < n) strcat(pat, "|");
        }
        if (RND(3) == 0) strcat(pat, "$");
        agree(pat, (const char *const *)strs, 200);
    }
    for (int i = 0; i < 200; i++) free(strs[i]);
    CHECK_EQ_INT(g_mismatch, 0);
#undef RND
}

static void test_refused(void)
{
    static const char *const bad[] = { "(?=a)", "(?!a)", "(?<=a)b", "(?<!a)b", "(a)\\1", "\\bword", "\\p{L}",
                                       "a++", "(a", "a)", "[a", "*a", "a{2,1}", "a{1001}", "\\", "a^b",
                                       "a$b", "\\u12", "[b-a]", "\\q" };
    char err[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gram_re *re = NULL;
        err[0] = 0;
        const int rc = gram_re_compile(bad[i], strlen(bad[i]), 0, &re, err, sizeof err);
        if (rc == 0) fprintf(stderr, "  /%s/ compiled\n", bad[i]);
        CHECK(rc == QERR_INVAL || rc == QERR_LIMIT);
        CHECK(re == NULL);
        CHECK_STR_CONTAINS(err, "pattern: ");
    }
    /* Too many states: a counted repetition of a wide class after a choice. */
    gram_re *re = NULL;
    CHECK_EQ_INT(gram_re_compile("(a|b)*a(a|b){14}$", 17, 0, &re, err, sizeof err), QERR_LIMIT);
    CHECK_STR_CONTAINS(err, "states");
}

static void test_json_mode(void)
{
    char err[256];
    gram_re *re = NULL;
    /* A quote inside the string is \" in the JSON text, never a bare quote. */
    REQUIRE(gram_re_compile("^a\"b$", 5, GRAM_RE_JSON_STRING, &re, err, sizeof err) == 0);
    CHECK(gram_re_match(re, "a\\\"b", 4));
    CHECK(!gram_re_match(re, "a\"b", 3));
    gram_re_free(re);
    /* Control characters: \n, and \u0001 with lowercase hex. */
    REQUIRE(gram_re_compile("^[\\x00-\\x1f]$", 13, GRAM_RE_JSON_STRING, &re, err, sizeof err) == 0);
    CHECK(gram_re_match(re, "\\n", 2));
    CHECK(gram_re_match(re, "\\u0001", 6));
    CHECK(!gram_re_match(re, "\\u000A", 6));
    CHECK(!gram_re_match(re, "\n", 1));
    gram_re_free(re);
    /* The state count stays small for the usual formats. */
    const char *date = "^\\d{4}-\\d{2}-\\d{2}$";
    REQUIRE(gram_re_compile(date, strlen(date), GRAM_RE_JSON_STRING, &re, err, sizeof err) == 0);
    CHECK(gram_re_states(re) < 20);
    CHECK(gram_re_step(re, gram_re_start(re), 'x') < 0);
    gram_re_free(re);
}

/* The intersection matches exactly what both match. */
static void test_intersect(void)
{
    char err[256];
    gram_re *a = NULL, *b = NULL, *ab = NULL;
    REQUIRE(gram_re_compile("a", 1, 0, &a, err, sizeof err) == 0);          /* holds an a */
    REQUIRE(gram_re_compile("^.{2,3}$", 8, 0, &b, err, sizeof err) == 0);    /* 2 or 3 characters */
    REQUIRE(gram_re_intersect(a, b, &ab, err, sizeof err) == 0);
    for (int i = 0; i < NSTRS; i++) {
        const size_t n = strlen(STRS[i]);
        CHECK_EQ_INT(gram_re_match(ab, STRS[i], n), gram_re_match(a, STRS[i], n) && gram_re_match(b, STRS[i], n));
    }
    CHECK(gram_re_match(ab, "xa", 2) && !gram_re_match(ab, "xxxa", 4) && !gram_re_match(ab, "bb", 2));
    gram_re_free(a);
    gram_re_free(b);
    gram_re_free(ab);
    /* Dead ends are cut: once no continuation can match, a step gives -1
     * (a mask built on the automaton must never lead into one).  Here
     * "1.23" leaves no room for the second dot within 5 characters. */
    REQUIRE(gram_re_compile("^\\d+\\.\\d+\\.\\d+$", 15, 0, &a, err, sizeof err) == 0);
    REQUIRE(gram_re_compile("^.{0,5}$", 8, 0, &b, err, sizeof err) == 0);
    REQUIRE(gram_re_intersect(a, b, &ab, err, sizeof err) == 0);
    int st = gram_re_start(ab);
    for (const char *p = "1.2"; *p; p++) st = gram_re_step(ab, st, (uint8_t)*p);
    CHECK(st >= 0);
    CHECK(gram_re_step(ab, st, '3') < 0);
    CHECK(gram_re_step(ab, st, '.') >= 0);
    CHECK(gram_re_match(ab, "1.2.3", 5) && !gram_re_match(ab, "1.23.4", 6));
    gram_re *c = NULL;
    REQUIRE(gram_re_minus(b, a, &c, err, sizeof err) == 0); /* at most 5 characters, not of that form */
    CHECK(gram_re_match(c, "abc", 3) && !gram_re_match(c, "1.2.3", 5));
    st = gram_re_start(c);
    for (const char *p = "abcde"; *p; p++) st = gram_re_step(c, st, (uint8_t)*p);
    CHECK(st >= 0 && gram_re_step(c, st, 'f') < 0);
    gram_re_free(a);
    gram_re_free(b);
    gram_re_free(ab);
    gram_re_free(c);
}

/* The compile budget (gram.h): fewer states, less work or a deadline
 * refuse with QERR_LIMIT and a message naming the limit; the defaults come
 * back with gram_budget_set(NULL). */
static void test_budget(void)
{
    char err[256];
    gram_re *re = NULL, *a = NULL, *b = NULL;
    const char *pat = "^[a-z]{0,300}$"; /* 302 states */
    gram_budget_set(&(gram_budget){ .re_states = 100 });
    CHECK_EQ_INT(gram_re_compile(pat, strlen(pat), 0, &re, err, sizeof err), QERR_LIMIT);
    CHECK(re == NULL && strstr(err, "more than 100 automaton states"));
    gram_budget_set(&(gram_budget){ .re_states = 1000000 }); /* above the default: the default */
    REQUIRE(gram_re_compile(pat, strlen(pat), 0, &re, err, sizeof err) == 0);
    CHECK(gram_re_states(re) > 300);
    gram_re_free(re);
    gram_budget_set(&(gram_budget){ .re_work = 1000 });
    CHECK_EQ_INT(gram_re_compile(pat, strlen(pat), 0, &re, err, sizeof err), QERR_LIMIT);
    CHECK(strstr(err, "too much work") != NULL);
    gram_budget_set(&(gram_budget){ .re_nfa = 50 });
    CHECK_EQ_INT(gram_re_compile(pat, strlen(pat), 0, &re, err, sizeof err), QERR_LIMIT);
    CHECK(strstr(err, "more than 50 NFA states") != NULL);
    gram_budget_set(NULL);
    REQUIRE(gram_re_compile(pat, strlen(pat), 0, &re, err, sizeof err) == 0);
    gram_re_free(re);
    /* The product of two automata: its states within the budget too. */
    REQUIRE(gram_re_compile("^[a-z]{0,200}$", 14, 0, &a, err, sizeof err) == 0);
    REQUIRE(gram_re_compile("^[a-m]*$", 8, 0, &b, err, sizeof err) == 0);
    gram_budget_set(&(gram_budget){ .re_states = 50 });
    CHECK_EQ_INT(gram_re_intersect(a, b, &re, err, sizeof err), QERR_LIMIT);
    CHECK(re == NULL && strstr(err, "more than 50 states"));
    /* A deadline passed: every compile and product stops with a message
     * that names the time budget. */
    gram_budget_set(&(gram_budget){ .seconds = 1e-6 });
    const double t0 = q_now();
    while (q_now() < t0 + 1e-5) {
    }
    CHECK_EQ_INT(gram_re_compile(pat, strlen(pat), 0, &re, err, sizeof err), QERR_LIMIT);
    CHECK(strstr(err, "time budget") != NULL);
    CHECK_EQ_INT(gram_re_minus(a, b, &re, err, sizeof err), QERR_LIMIT);
    CHECK(re == NULL && strstr(err, "time budget"));
    /* A budget of a minute: both as without one. */
    gram_budget_set(&(gram_budget){ .seconds = 60 });
    REQUIRE(gram_re_intersect(a, b, &re, err, sizeof err) == 0);
    CHECK(gram_re_match(re, "abc", 3) && !gram_re_match(re, "xyz", 3));
    gram_re_free(re);
    gram_budget_set(NULL);
    gram_re_free(a);
    gram_re_free(b);
}

int main(void)
{
    QT_RUN(test_table);
    QT_RUN(test_random);
    QT_RUN(test_refused);
    QT_RUN(test_json_mode);
    QT_RUN(test_intersect);
    QT_RUN(test_budget);
    QT_MAIN_END();
}
