/* test_util.c - the base floor: error table, checked allocation, hashing,
 * fp16/bf16, files, UTF-8, growable buffers. */
#include <stdint.h>
#include <unistd.h>

#include <string.h>

#include "buf.h"
#include "qerr.h"
#include "utf8.h"
#include "util.h"
#include "qtest.h"

static void test_error_table(void)
{
    CHECK(!strcmp(qerr_str(0), "success"));
    CHECK(!strcmp(qerr_str(QERR_FORMAT), "malformed file"));
    CHECK(!strcmp(qerr_name(QERR_NOMEM), "QERR_NOMEM"));
    CHECK(!strcmp(qerr_str(-999), "unknown error"));
    CHECK(!strcmp(qerr_name(-999), "QERR_?"));
    char buf[32];
    CHECK(qerr_set(buf, sizeof buf, QERR_RANGE, "x=%d", 5) == QERR_RANGE);
    CHECK(!strcmp(buf, "x=5"));
    CHECK(qerr_set(NULL, 0, QERR_IO, "ignored") == QERR_IO);
    /* Truncation, never overflow. */
    char tiny[4];
    qerr_set(tiny, sizeof tiny, QERR_IO, "abcdefgh");
    CHECK(!strcmp(tiny, "abc"));
}

static void test_checked_alloc(void)
{
    CHECK(q_mallocn(SIZE_MAX / 2, 4) == NULL);
    CHECK(q_callocn(SIZE_MAX / 8, 16) == NULL);
    void *p = q_malloc(10);
    CHECK(p != NULL);
    void *r = q_reallocn(p, SIZE_MAX, 2);
    CHECK(r == NULL); /* p stays valid */
    free(p);
    q_set_alloc_limit(1024);
    CHECK(q_malloc(2048) == NULL);
    CHECK(q_malloc_aligned(4096) == NULL);
    q_set_alloc_limit((size_t)64 << 30);
    void *a = q_malloc_aligned(100);
    CHECK(a && ((uintptr_t)a & 63) == 0);
    q_free_aligned(a);
    char *s = q_strndup("hello world", 5);
    CHECK(s && !strcmp(s, "hello"));
    free(s);
    size_t out;
    CHECK(q_mul_overflow(SIZE_MAX, 2, &out));
    CHECK(!q_mul_overflow(3, 4, &out) && out == 12);
    CHECK(q_add_overflow(SIZE_MAX, 1, &out));
}

static void test_hash(void)
{
    qhash a, b;
    uint8_t h1[16], h2[16], h3[16];
    qhash_init(&a, 1);
    qhash_update(&a, "abcdefghij", 10);
    qhash_final(&a, h1);
    qhash_init(&b, 1);
    qhash_update(&b, "abcde", 5);
    qhash_update(&b, "fghij", 5);
    qhash_final(&b, h2);
    /* Chunking changes nothing only when chunks are whole words; what we
     * promise is determinism for the same sequence of calls. */
    qhash_init(&b, 1);
    qhash_update(&b, "abcdefghij", 10);
    qhash_final(&b, h3);
    CHECK(!memcmp(h1, h3, 16));
    qhash_init(&b, 2);
    qhash_update(&b, "abcdefghij", 10);
    qhash_final(&b, h3);
    CHECK(memcmp(h1, h3, 16) != 0); /* seed matters */
    qhash_init(&b, 1);
    qhash_update(&b, "abcdefghik", 10);
    qhash_final(&b, h3);
    CHECK(memcmp(h1, h3, 16) != 0); /* content matters */
    qhash_init(&b, 1);
    qhash_update(&b, "abcdefghij\0", 11);
    qhash_final(&b, h3);
    CHECK(memcmp(h1, h3, 16) != 0); /* length matters */
    char hex[33];
    q_hex(h1, 16, hex);
    CHECK(strlen(hex) == 32);
    (void)h2;
}

static void test_half_floats(void)
{
    CHECK(q_f16_to_f32(0x3c00) == 1.0f);
    CHECK(q_f16_to_f32(0xc000) == -2.0f);
    CHECK(q_f16_to_f32(0x0001) == 5.9604644775390625e-08f); /* smallest subnormal */
    CHECK(isinf(q_f16_to_f32(0x7c00)));
    CHECK(isnan(q_f16_to_f32(0x7e00)));
    /* Every finite f16 survives f16 -> f32 -> f16. */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        if (q_f32_to_f16(q_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(q_f32_to_f16(65520.0f) == 0x7c00); /* rounds to infinity */
    CHECK(q_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00); /* tie to even */
    CHECK(q_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(q_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(q_f32_to_bf16(1.00390625f) == 0x3f80); /* tie to even */
    CHECK(q_f32_to_bf16(1.01171875f) == 0x3f82);
    CHECK((q_f32_to_bf16(NAN) & 0x7fc0) == 0x7fc0);
}

static void test_read_file(void)
{
    char *buf;
    size_t n;
    char err[256];
    CHECK(q_read_file("/nonexistent/quire", 100, &buf, &n, err, sizeof err) == QERR_IO);
    CHECK_STR_CONTAINS(err, "/nonexistent/quire");
    char path[] = "/tmp/quire_test_XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    char data[10000];
    memset(data, 'x', sizeof data);
    CHECK(write(fd, data, sizeof data) == (ssize_t)sizeof data);
    close(fd);
    CHECK(q_read_file(path, 100000, &buf, &n, err, sizeof err) == 0);
    CHECK(n == sizeof data && buf[n] == 0);
    free(buf);
    CHECK(q_read_file(path, 500, &buf, &n, err, sizeof err) == QERR_LIMIT);
    CHECK(buf == NULL);
    unlink(path);
}

static void test_log_levels(void)
{
    qlog_set_level(QLOG_ERROR);
    CHECK(qlog_get_level() == QLOG_ERROR);
    QLOGI("this line is filtered out");
    qlog_set_level(QLOG_INFO);
    CHECK(qlog_get_level() == QLOG_INFO);
}

/* RFC 3629's edges: each rule has a case on both sides. */
static void test_utf8(void)
{
    static const struct { const char *s; int step, bad; } c[] = {
        { "a", 1, 1 },
        { "\xc2\x80", 2, 1 },         /* U+0080, the first 2-byte one */
        { "\xc1\xbf", 0, 1 },         /* overlong 2-byte */
        { "\xe0\xa0\x80", 3, 1 },     /* U+0800 */
        { "\xe0\x9f\xbf", 0, 1 },     /* overlong 3-byte */
        { "\xed\x9f\xbf", 3, 1 },     /* U+D7FF */
        { "\xed\xa0\x80", 0, 1 },     /* U+D800, a surrogate */
        { "\xf0\x90\x80\x80", 4, 1 }, /* U+10000 */
        { "\xf0\x8f\xbf\xbf", 0, 1 }, /* overlong 4-byte */
        { "\xf4\x8f\xbf\xbf", 4, 1 }, /* U+10FFFF */
        { "\xf4\x90\x80\x80", 0, 1 }, /* past U+10FFFF */
        { "\xf5\x80\x80\x80", 0, 1 }, /* no such lead byte */
        { "\x80", 0, 1 },             /* a lone continuation */
        { "\xe2\x96", -2, 1 },         /* unfinished */
        { "\xe2\x96x", 0, 2 },         /* cut by ASCII: one U+FFFD for two bytes */
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        int bad = -1;
        const int k = qutf8_step(c[i].s, strlen(c[i].s), &bad);
        CHECK_EQ_INT(k, c[i].step);
        if (k == 0) CHECK_EQ_INT(bad, c[i].bad);
        CHECK_EQ_INT((int)qutf8_char(c[i].s, strlen(c[i].s)), k > 0 ? k : 0);
        CHECK_EQ_INT(qutf8_valid(c[i].s, strlen(c[i].s)), k > 0);
    }
    uint32_t cp = 0;
    CHECK_EQ_INT((int)qutf8_decode("\xf0\x9f\xa6\x99", 4, &cp), 4);
    CHECK_EQ_INT((int)cp, 0x1f999);
    CHECK_EQ_INT((int)qutf8_decode("\xed\xa0\x80", 3, &cp), 1);
    CHECK_EQ_INT((int)cp, 0xfffd);
    const uint32_t cps[] = { 0, 0x7f, 0x80, 0x7ff, 0x800, 0xffff, 0x10000, 0x10ffff };
    for (size_t i = 0; i < sizeof cps / sizeof *cps; i++) {
        char b[4];
        const int n = qutf8_encode(cps[i], b);
        CHECK_EQ_INT(n, qutf8_enc_len(cps[i]));
        CHECK_EQ_INT(qutf8_step(b, (size_t)n, NULL), n);
        uint32_t back;
        CHECK_EQ_INT(qutf8_decode_valid(b, &back), n);
        CHECK_EQ_INT((int)back, (int)cps[i]);
    }
    CHECK_EQ_INT((int)qutf8_valid_prefix("abcdefghij\xc3\xa9k\xffz", 15), 13);
    CHECK_EQ_INT((int)qutf8_partial_tail("ab\xe2\x96", 4), 2);
    CHECK_EQ_INT((int)qutf8_partial_tail("ab\xe0\x80", 4), 0); /* can never become valid */
    CHECK_EQ_INT((int)qutf8_partial_tail("\xf0\x9f\x98", 3), 3);
    CHECK_EQ_INT((int)qutf8_partial_tail("\xf0\x9f\x98\x80", 4), 0);
    CHECK_EQ_INT((int)qutf8_complete("a\x80\x80\x80", 4), 4);
    CHECK(qutf8_is_partial("\xf4\x8f", 2));
    CHECK(!qutf8_is_partial("\xf4\x90", 2));
}

static void test_buf(void)
{
    qbuf b = { 0 };
    qbuf_free(&b); /* a zeroed buffer is a no-op */
    CHECK_EQ_INT(qbuf_put(&b, "ab", 2), 0);
    CHECK_EQ_INT(qbuf_putc(&b, 'c'), 0);
    CHECK_EQ_INT(qbuf_printf(&b, "%d-%s", 42, "x"), 0);
    CHECK(b.len == 7 && !strcmp(b.p, "abc42-x"));
    /* a printf past the capacity grows once and keeps what was there */
    char big[300];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = 0;
    CHECK_EQ_INT(qbuf_printf(&b, "%s", big), 0);
    CHECK(b.len == 7 + 299 && !memcmp(b.p, "abc42-x", 7) && b.p[b.len] == 0 && b.cap > b.len);
    /* past the allocation limit: refused, the buffer unchanged */
    const size_t len = b.len;
    q_set_alloc_limit(1024);
    CHECK_EQ_INT(qbuf_reserve(&b, 4096), QERR_NOMEM);
    CHECK_EQ_INT(qbuf_printf(&b, "%s%s%s%s", big, big, big, big), QERR_NOMEM);
    CHECK(b.len == len && b.p[len] == 0 && !memcmp(b.p, "abc42-x", 7));
    q_set_alloc_limit((size_t)64 << 30);
    CHECK_EQ_INT(qbuf_reserve(&b, SIZE_MAX), QERR_LIMIT);
    qbuf_free(&b);
    CHECK(!b.p && !b.len && !b.cap);
    char *p = NULL;
    size_t n = 0, cap = 0;
    CHECK_EQ_INT(q_append(&p, &n, &cap, "hi", 2), 0);
    CHECK(n == 2 && !strcmp(p, "hi"));
    free(p);
}

int main(void)
{
    QT_RUN(test_error_table);
    QT_RUN(test_checked_alloc);
    QT_RUN(test_hash);
    QT_RUN(test_half_floats);
    QT_RUN(test_read_file);
    QT_RUN(test_log_levels);
    QT_RUN(test_utf8);
    QT_RUN(test_buf);
    QT_MAIN_END();
}
