/* qtest.h - the unit-test harness.
 *
 * A test file defines functions `static void test_x(void)` and lists them in
 * main with QT_RUN(test_x); QT_MAIN_END prints "P passed, F failed, S skipped"
 * and returns 1 on any failure, QT_SKIP_CODE when every test skipped, else 0.
 * CHECK records a failure and continues; REQUIRE returns from the test
 * function; QT_SKIP says why (part of) a test did not run, which counts it as
 * skipped unless it also failed.  A program that cannot run at all (no GPU)
 * returns qt_skip_all("why"). */
#ifndef QUIRE_QTEST_H
#define QUIRE_QTEST_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The exit status of a test program that did not run: ctest's
 * SKIP_RETURN_CODE for every test (CMakeLists.txt), the autotools value. */
#define QT_SKIP_CODE 77

static int qt_failed_checks_ __attribute__((unused)), qt_skip_now_ __attribute__((unused));
static int qt_passed_ __attribute__((unused)), qt_failed_ __attribute__((unused));
static int qt_skipped_ __attribute__((unused));
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

/* Marks the current test skipped, with the reason (printf arguments) on
 * stderr; the test goes on (return or continue as the caller sees fit). */
#define QT_SKIP(...)                                                                 \
    do {                                                                             \
        fprintf(stderr, "  skip %s: ", qt_current_);                                 \
        fprintf(stderr, __VA_ARGS__);                                                \
        fputc('\n', stderr);                                                         \
        qt_skip_now_ = 1;                                                            \
    } while (0)

#define QT_RUN(fn)                                                                   \
    do {                                                                             \
        int before_ = qt_failed_checks_;                                             \
        qt_current_ = #fn;                                                           \
        qt_skip_now_ = 0;                                                            \
        fn();                                                                        \
        if (qt_failed_checks_ != before_) {                                          \
            qt_failed_++;                                                            \
            fprintf(stderr, "FAIL %s\n", #fn);                                       \
        } else if (qt_skip_now_) {                                                   \
            qt_skipped_++;                                                           \
            fprintf(stderr, "skip %s\n", #fn);                                       \
        } else {                                                                     \
            qt_passed_++;                                                            \
            fprintf(stderr, "ok   %s\n", #fn);                                       \
        }                                                                            \
    } while (0)

#define QT_MAIN_END()                                                                \
    do {                                                                             \
        printf("%d passed, %d failed, %d skipped\n", qt_passed_, qt_failed_,         \
               qt_skipped_);                                                         \
        return qt_failed_ ? 1 : !qt_passed_ && qt_skipped_ ? QT_SKIP_CODE : 0;       \
    } while (0)

/* A program none of whose tests can run here: prints why (printf
 * arguments) and the empty summary; main returns what this returns. */
static inline int qt_skip_all(const char *fmt, ...) __attribute__((format(printf, 1, 2), unused));
static inline int qt_skip_all(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("skipped: ");
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n0 passed, 0 failed, 0 skipped\n");
    return QT_SKIP_CODE;
}

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
