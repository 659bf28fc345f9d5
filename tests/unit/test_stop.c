/* test_stop.c - stop strings on streamed text: chunk boundaries, held text,
 * overlapping stops, UTF-8, include_stop, errors, and a randomised check
 * against a brute-force reference on random chunkings. */
#include <stdint.h>

#include "qerr.h"
#include "stop.h"
#include "qtest.h"

static qstop *make(const char *const *stops, int n, unsigned flags)
{
    qstop *m = NULL;
    char err[160];
    int rc = qstop_new(stops, NULL, n, flags, &m, err, sizeof err);
    if (rc) fprintf(stderr, "  qstop_new: %s\n", err);
    return m;
}

/* Feeds one chunk and checks the text emitted for it. */
#define FEED(m, chunk, want)                                                 \
    do {                                                                     \
        qstop_out o_;                                                        \
        CHECK_EQ_INT(qstop_feed((m), (chunk), strlen(chunk), &o_), 0);       \
        CHECK_EQ_INT(o_.len, strlen(want));                                  \
        CHECK(o_.len == strlen(want) && !memcmp(o_.text, (want), o_.len));   \
        last = o_;                                                           \
    } while (0)

static void test_across_chunks(void)
{
    const char *stops[] = { "END" };
    qstop *m = make(stops, 1, 0);
    REQUIRE(m);
    qstop_out last;
    FEED(m, "Hello E", "Hello "); /* "E" could start "END": held */
    CHECK(!last.stopped && last.stop_index == -1);
    FEED(m, "N", "");
    FEED(m, "D world", ""); /* completed: nothing of it, nothing after it */
    CHECK(last.stopped && last.stop_index == 0);
    /* Sticky afterwards. */
    FEED(m, "more", "");
    CHECK(last.stopped && last.stop_index == 0);
    qstop_flush(m, &last);
    CHECK(last.len == 0 && last.stopped);

    /* The same stop inside one chunk, with text before it. */
    qstop_reset(m);
    FEED(m, "abcENDdef", "abc");
    CHECK(last.stopped && last.stop_index == 0);
    qstop_free(m);
}

static void test_release_and_flush(void)
{
    const char *stops[] = { "END" };
    qstop *m = make(stops, 1, 0);
    REQUIRE(m);
    qstop_out last;
    FEED(m, "abcE", "abc");
    FEED(m, "Nx", "ENx"); /* "ENx" cannot become "END": all released */
    FEED(m, "yEN", "y");
    qstop_flush(m, &last); /* the end of the sequence releases the held "EN" */
    CHECK(last.len == 2 && !memcmp(last.text, "EN", 2) && !last.stopped && last.stop_index == -1);
    FEED(m, "after flush", "");
    qstop_flush(m, &last);
    CHECK_EQ_INT(last.len, 0);

    /* Empty chunks are fine; a NULL chunk needs len 0. */
    qstop_reset(m);
    FEED(m, "", "");
    CHECK_EQ_INT(qstop_feed(m, NULL, 0, &last), 0);
    CHECK_EQ_INT(qstop_feed(m, NULL, 3, &last), QERR_INVAL);
    FEED(m, "ok", "ok");
    qstop_free(m);
}

static void test_kmp_fallback(void)
{
    /* "aab" in "aaab": after "aaa" the longest possible start is the last
     * "aa", so exactly one "a" is safe. */
    const char *stops[] = { "aab" };
    qstop *m = make(stops, 1, 0);
    REQUIRE(m);
    qstop_out last;
    FEED(m, "a", "");
    FEED(m, "a", "");
    FEED(m, "a", "a");
    FEED(m, "b", "");
    CHECK(last.stopped);
    qstop_free(m);

    /* "abab" in "abacabab": after "aba" then "c" all is released. */
    const char *s2[] = { "abab" };
    m = make(s2, 1, 0);
    REQUIRE(m);
    FEED(m, "aba", "");
    FEED(m, "c", "abac");
    FEED(m, "aba", "");
    FEED(m, "b!", "");
    CHECK(last.stopped);
    qstop_free(m);
}

static void test_overlapping(void)
{
    qstop_out last;
    /* "abc" completes at 'c', before "bcd" can: the earliest completion. */
    const char *s1[] = { "abc", "bcd" };
    qstop *m = make(s1, 2, 0);
    REQUIRE(m);
    FEED(m, "xab", "x");
    FEED(m, "cd", "");
    CHECK(last.stopped && last.stop_index == 0);
    qstop_free(m);
    /* The list order does not matter. */
    const char *s2[] = { "bcd", "abc" };
    m = make(s2, 2, 0);
    REQUIRE(m);
    FEED(m, "xabcd", "x");
    CHECK(last.stopped && last.stop_index == 1);
    qstop_reset(m);
    /* "bcd" alone: "abce" releases everything at the "e". */
    FEED(m, "ab", "");
    FEED(m, "xbc", "abx");
    FEED(m, "d", "");
    CHECK(last.stopped && last.stop_index == 0);
    qstop_free(m);
    /* A long stop that started earlier loses to a short one that ends first. */
    const char *s3[] = { "abcde", "bcd" };
    m = make(s3, 2, 0);
    REQUIRE(m);
    FEED(m, "abcdef", "a");
    CHECK(last.stopped && last.stop_index == 1);
    qstop_free(m);
    /* Completing at the same byte: the longer one (the earlier start). */
    const char *s4[] = { "bc", "abc" };
    m = make(s4, 2, 0);
    REQUIRE(m);
    FEED(m, "xa", "x");
    FEED(m, "bc", "");
    CHECK(last.stopped && last.stop_index == 1);
    qstop_free(m);
}

static void test_include_stop(void)
{
    const char *stops[] = { "END" };
    qstop *m = make(stops, 1, QSTOP_INCLUDE);
    REQUIRE(m);
    qstop_out last;
    FEED(m, "Hello E", "Hello E"); /* nothing needs holding */
    FEED(m, "N", "N");
    FEED(m, "D world", "D"); /* the stop string, nothing after it */
    CHECK(last.stopped && last.stop_index == 0);
    qstop_free(m);
}

/* Disarmed (min_tokens not yet reached): a completed stop is text; armed
 * again, a stop that began before counts. */
static void test_arm(void)
{
    const char *stops[] = { "END" };
    qstop *m = make(stops, 1, 0);
    REQUIRE(m);
    qstop_out last;
    qstop_arm(m, 0);
    FEED(m, "aEND", "aEND");
    CHECK(!last.stopped);
    FEED(m, "bEN", "b"); /* "EN" held as usual */
    qstop_arm(m, 1);
    FEED(m, "Dc", ""); /* completes after arming: a stop */
    CHECK(last.stopped && last.stop_index == 0);
    qstop_free(m);
    /* Overlapping matches while disarmed keep the automaton right. */
    const char *s2[] = { "aa" };
    m = make(s2, 1, 0);
    REQUIRE(m);
    qstop_arm(m, 0);
    FEED(m, "aaa", "aa");
    qstop_arm(m, 1);
    FEED(m, "a", "");
    CHECK(last.stopped);
    qstop_free(m);
}

static void test_utf8(void)
{
    qstop_out last;
    /* No stops: only whole characters go out; € is E2 82 AC. */
    qstop *m = make(NULL, 0, 0);
    REQUIRE(m);
    FEED(m, "1 \xE2\x82", "1 ");
    FEED(m, "\xAC!", "\xE2\x82\xAC!");
    /* A 4-byte character fed a byte at a time. */
    FEED(m, "\xF0", "");
    FEED(m, "\x9F", "");
    FEED(m, "\x98", "");
    FEED(m, "\x80", "\xF0\x9F\x98\x80");
    /* Bytes that can never be valid are not held. */
    FEED(m, "a\xFF", "a\xFF");
    FEED(m, "b\xE0\x80", "b\xE0\x80"); /* E0 80 is an overlong start */
    /* An incomplete tail at the end comes out on flush, as it is. */
    FEED(m, "z\xC3", "z");
    qstop_flush(m, &last);
    CHECK(last.len == 1 && (unsigned char)last.text[0] == 0xC3);
    qstop_free(m);

    /* A multi-byte stop split inside its characters. */
    const char *s1[] = { "\xE2\x82\xACuro" }; /* "€uro" */
    m = make(s1, 1, 0);
    REQUIRE(m);
    FEED(m, "1 \xE2\x82", "1 ");
    FEED(m, "\xAC" "ur", "");
    FEED(m, "o!", "");
    CHECK(last.stopped);
    qstop_reset(m);
    FEED(m, "\xE2\x82\xAC" "ur", "");
    FEED(m, "i", "\xE2\x82\xAC" "uri");
    qstop_free(m);

    /* A stop that starts with the same lead byte as the text's character:
     * "é" (C3 A9) against the stop "ó!" (C3 B3 21). */
    const char *s2[] = { "\xC3\xB3!" };
    m = make(s2, 1, 0);
    REQUIRE(m);
    FEED(m, "caf\xC3", "caf");
    FEED(m, "\xA9", "\xC3\xA9");
    FEED(m, "\xC3\xB3", "");
    FEED(m, "?", "\xC3\xB3?");
    qstop_free(m);
}

static void test_errors(void)
{
    char err[160];
    qstop *m = (qstop *)err; /* *out must come back NULL */
    const char *empty[] = { "ok", "" };
    CHECK_EQ_INT(qstop_new(empty, NULL, 2, 0, &m, err, sizeof err), QERR_INVAL);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(err, "stop string 1 is empty");
    const char *bad[] = { "\xC3" };
    CHECK_EQ_INT(qstop_new(bad, NULL, 1, 0, &m, err, sizeof err), QERR_INVAL);
    CHECK_STR_CONTAINS(err, "not valid UTF-8");
    const char *sur[] = { "\xED\xA0\x80" }; /* a UTF-16 surrogate */
    CHECK_EQ_INT(qstop_new(sur, NULL, 1, 0, &m, err, sizeof err), QERR_INVAL);
    const char *nul[] = { NULL };
    CHECK_EQ_INT(qstop_new(nul, NULL, 1, 0, &m, err, sizeof err), QERR_INVAL);
    CHECK_EQ_INT(qstop_new(NULL, NULL, 1, 0, &m, err, sizeof err), QERR_INVAL);
    CHECK_EQ_INT(qstop_new(NULL, NULL, -1, 0, &m, err, sizeof err), QERR_INVAL);
    const char *one[] = { "x" };
    CHECK_EQ_INT(qstop_new(one, NULL, 1, 0x10, &m, err, sizeof err), QERR_INVAL);
    CHECK_STR_CONTAINS(err, "flags");

    const char *many[QSTOP_MAX_STRINGS + 1];
    for (int i = 0; i <= QSTOP_MAX_STRINGS; i++) many[i] = "s";
    CHECK_EQ_INT(qstop_new(many, NULL, QSTOP_MAX_STRINGS + 1, 0, &m, err, sizeof err), QERR_LIMIT);
    CHECK_STR_CONTAINS(err, "at most 64");
    CHECK_EQ_INT(qstop_new(many, NULL, QSTOP_MAX_STRINGS, 0, &m, err, sizeof err), 0);
    qstop_free(m);

    static char longs[QSTOP_MAX_BYTES + 2];
    memset(longs, 'q', QSTOP_MAX_BYTES + 1);
    const char *lp[] = { longs };
    CHECK_EQ_INT(qstop_new(lp, NULL, 1, 0, &m, err, sizeof err), QERR_LIMIT);
    CHECK_STR_CONTAINS(err, "at most 512");
    longs[QSTOP_MAX_BYTES] = 0;
    CHECK_EQ_INT(qstop_new(lp, NULL, 1, 0, &m, err, sizeof err), 0);
    qstop_free(m);

    /* Explicit lengths: a stop with a NUL byte inside, and lens[i] == 0. */
    const char *withnul[] = { "a\0b" };
    size_t lens[] = { 3 };
    CHECK_EQ_INT(qstop_new(withnul, lens, 1, 0, &m, err, sizeof err), 0);
    qstop_out o;
    CHECK_EQ_INT(qstop_feed(m, "xa\0by", 5, &o), 0);
    CHECK(o.stopped && o.len == 1 && o.text[0] == 'x');
    qstop_free(m);
    size_t zero[] = { 0 };
    CHECK_EQ_INT(qstop_new(withnul, zero, 1, 0, &m, err, sizeof err), QERR_INVAL);
    qstop_free(NULL);
}

/* ---- randomised: any chunking, against a brute-force reference ------------ */

static uint64_t rng_state = 0x1234567;
static unsigned rnd(unsigned n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state % n);
}

/* 1 if s[0..n) is valid UTF-8 (enough for the alphabet used here). */
static int valid_utf8(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = u[i] < 0x80 ? 1 : u[i] >= 0xF0 ? 4 : u[i] >= 0xE0 ? 3 : u[i] >= 0xC2 ? 2 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((u[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

/* Expected output: the text up to the earliest-completing stop (the longest
 * at equal ends), or all of it. */
static size_t reference(const char *t, size_t n, const char *const *stops, int ns, int include, int *idx)
{
    for (size_t e = 1; e <= n; e++) {
        int hit = -1;
        for (int k = 0; k < ns; k++) {
            size_t l = strlen(stops[k]);
            if (l <= e && !memcmp(t + e - l, stops[k], l) && (hit < 0 || l > strlen(stops[hit]))) hit = k;
        }
        if (hit >= 0) {
            *idx = hit;
            return include ? e : e - strlen(stops[hit]);
        }
    }
    *idx = -1;
    return n;
}

static void test_random_chunkings(void)
{
    static const char *alphabet[] = { "a", "b", "c", "x", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80" };
    static const char *pool[] = { "ab", "bca", "\xC3\xA9\xE2\x82\xAC" "a", "cc", "aab", "ccc",
                                  "x\xE2\x82\xAC\xC3\xA9", "abab", "\xF0\x9F\x98\x80" "b" };
    const int n_pool = (int)(sizeof pool / sizeof pool[0]);
    char text[256], got[256];
    int n_stopped = 0, n_held = 0;
    for (int trial = 0; trial < 4000; trial++) {
        const char *stops[3];
        int ns = (int)rnd(4);
        for (int k = 0; k < ns; k++) stops[k] = pool[rnd((unsigned)n_pool)];
        int include = (int)rnd(2);
        size_t n = 0;
        for (int i = (int)rnd(30); i > 0; i--) {
            const char *a = alphabet[rnd(7)];
            memcpy(text + n, a, strlen(a));
            n += strlen(a);
        }
        int want_idx;
        size_t want = reference(text, n, stops, ns, include, &want_idx);

        qstop *m = make(stops, ns, include ? QSTOP_INCLUDE : 0);
        REQUIRE(m);
        size_t fed = 0, out = 0;
        int stopped = 0, idx = -1, ok = 1;
        while (fed < n) {
            size_t len = 1 + rnd(6);
            if (len > n - fed) len = n - fed;
            qstop_out o;
            REQUIRE(qstop_feed(m, text + fed, len, &o) == 0);
            fed += len;
            /* Whole characters only, and never anything past the answer:
             * so no part of a stop string ever went out. */
            ok &= valid_utf8(o.text, o.len);
            ok &= out + o.len <= want && !memcmp(text + out, o.text, o.len);
            memcpy(got + out, o.text, o.len);
            out += o.len;
            stopped = o.stopped;
            idx = o.stop_index;
            if (!stopped) {
                /* What is held is a possible stop start or a split character. */
                size_t held = fed - out;
                int explained = held == 0 || (held <= 3 && !valid_utf8(text + out, held));
                for (int k = 0; k < ns && !explained && !include; k++)
                    explained = held < strlen(stops[k]) && !memcmp(text + out, stops[k], held);
                ok &= explained;
                n_held += held > 0;
            }
        }
        qstop_out o;
        qstop_flush(m, &o);
        memcpy(got + out, o.text, o.len);
        out += o.len;
        ok &= out == want && !memcmp(got, text, want);
        ok &= stopped == (want_idx >= 0) && idx == want_idx && o.stop_index == want_idx;
        if (!ok) {
            fprintf(stderr, "  trial %d: text \"%.*s\", %d stops, include %d\n", trial, (int)n, text, ns, include);
            CHECK(ok);
            qstop_free(m);
            return;
        }
        n_stopped += stopped;
        qstop_free(m);
    }
    /* The trials exercised both outcomes. */
    CHECK(n_stopped > 500 && n_stopped < 3500);
    CHECK(n_held > 1000);
}

int main(void)
{
    QT_RUN(test_across_chunks);
    QT_RUN(test_release_and_flush);
    QT_RUN(test_kmp_fallback);
    QT_RUN(test_overlapping);
    QT_RUN(test_include_stop);
    QT_RUN(test_arm);
    QT_RUN(test_utf8);
    QT_RUN(test_errors);
    QT_RUN(test_random_chunkings);
    QT_MAIN_END();
}
