/* qtest.h - the unit-test harness.
 *
 * A test file defines functions `static void test_x(void)` and lists them in
 * main with QT_RUN(test_x); QT_MAIN_END prints "N passed, N failed" and
 * returns non-zero on any failure.  CHECK records a failure and continues;
 * REQUIRE returns from the test function. */
#ifndef QUIRE_QTEST_H
#define QUIRE_QTEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int qt_failed_checks_ __attribute__((unused));
static int qt_passed_ __attribute__((unused)), qt_failed_ __attribute__((unused));
static const char *qt_current_ __attribute__((unused));

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "  FAIL %s:%d in %s: %s\n", __FILE__, __LINE__,          \
                    qt_current_, #cond);                                             \
            qt_failed_checks_++;                                                     \
        }                                                                            \
    } while (0)

#define REQUIRE(cond)                                                                \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "  FAIL %s:%d in %s: %s (required)\n", __FILE__,         \
                    __LINE__, qt_current_, #cond);                                   \
            qt_failed_checks_++;                                                     \
            return;                                                                  \
        }                                                                            \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                           \
    do {                                                                             \
        long long qa_ = (long long)(a), qb_ = (long long)(b);                        \
        if (qa_ != qb_) {                                                            \
            fprintf(stderr, "  FAIL %s:%d in %s: %s == %s (%lld vs %lld)\n",         \
                    __FILE__, __LINE__, qt_current_, #a, #b, qa_, qb_);              \
            qt_failed_checks_++;                                                     \
        }                                                                            \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                              \
    do {                                                                             \
        const char *qh_ = (hay), *qn_ = (needle);                                    \
        if (!qh_ || !strstr(qh_, qn_)) {                                             \
            fprintf(stderr, "  FAIL %s:%d in %s: \"%s\" does not contain \"%s\"\n",  \
                    __FILE__, __LINE__, qt_current_, qh_ ? qh_ : "(null)", qn_);     \
            qt_failed_checks_++;                                                     \
        }                                                                            \
    } while (0)

#define QT_RUN(fn)                                                                   \
    do {                                                                             \
        int before_ = qt_failed_checks_;                                             \
        qt_current_ = #fn;                                                           \
        fn();                                                                        \
        if (qt_failed_checks_ == before_) {                                          \
            qt_passed_++;                                                            \
            fprintf(stderr, "ok   %s\n", #fn);                                       \
        } else {                                                                     \
            qt_failed_++;                                                            \
            fprintf(stderr, "FAIL %s\n", #fn);                                       \
        }                                                                            \
    } while (0)

#define QT_MAIN_END()                                                                \
    do {                                                                             \
        printf("%d passed, %d failed\n", qt_passed_, qt_failed_);                    \
        return qt_failed_ ? 1 : 0;                                                   \
    } while (0)

/* Path helpers: QUIRE_ROOT (the source tree) and QUIRE_SHARED (../shared). */
static inline const char *qt_root(void)
{
    const char *r = getenv("QUIRE_ROOT");
    return r ? r : ".";
}

static inline const char *qt_shared(void)
{
    const char *r = getenv("QUIRE_SHARED");
    return r ? r : "../shared";
}

#endif
