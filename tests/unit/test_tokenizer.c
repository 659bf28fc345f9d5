/* test_tokenizer.c - decoding ids to text for both vocabulary kinds. */
#include "model.h"
#include "tokenizer.h"
#include "qtest.h"

static void test_spm_pieces(void)
{
    char *toks[] = { "<unk>", "<s>", "</s>", "<0x0A>", "<0xE2>", "\xe2\x96\x81Once", "upon", "\xe2\x96\x81\xe2\x96\x81x" };
    int32_t types[] = { QTOK_UNKNOWN, QTOK_CONTROL, QTOK_CONTROL, QTOK_BYTE, QTOK_BYTE, QTOK_NORMAL, QTOK_NORMAL, QTOK_NORMAL };
    qvocab v = { .kind = QVOCAB_SPM, .n = 8, .tokens = toks, .types = types };
    char buf[64];
    int n = qvocab_decode_piece(&v, 5, 0, buf, sizeof buf);
    CHECK(n == 5 && !memcmp(buf, " Once", 5));
    n = qvocab_decode_piece(&v, 5, 1, buf, sizeof buf);
    CHECK(n == 4 && !memcmp(buf, "Once", 4));
    n = qvocab_decode_piece(&v, 3, 0, buf, sizeof buf);
    CHECK(n == 1 && buf[0] == '\n');
    n = qvocab_decode_piece(&v, 4, 0, buf, sizeof buf);
    CHECK(n == 1 && (unsigned char)buf[0] == 0xE2);
    CHECK_EQ_INT(qvocab_decode_piece(&v, 1, 0, buf, sizeof buf), 0); /* control: nothing */
    n = qvocab_decode_piece(&v, 7, 1, buf, sizeof buf);
    CHECK(n == 2 && !memcmp(buf, " x", 2)); /* only one space stripped */
    CHECK(qvocab_decode_piece(&v, 8, 0, buf, sizeof buf) < 0);
    CHECK(qvocab_decode_piece(&v, -1, 0, buf, sizeof buf) < 0);
    n = qvocab_decode_piece(&v, 6, 0, buf, 2); /* truncated to cap */
    CHECK(n == 2);
}

static void test_bpe_bytes(void)
{
    /* GPT-2 byte-level: 'Ġ' (U+0120) is a space, 'Ċ' (U+010A) a newline. */
    char *toks[] = { "\xc4\xa0hello", "\xc4\x8a", "caf\xc3\x83\xc2\xa9", "<|endoftext|>" };
    int32_t types[] = { QTOK_NORMAL, QTOK_NORMAL, QTOK_NORMAL, QTOK_CONTROL };
    qvocab v = { .kind = QVOCAB_BPE, .n = 4, .tokens = toks, .types = types };
    char buf[64];
    int n = qvocab_decode_piece(&v, 0, 0, buf, sizeof buf);
    CHECK(n == 6 && !memcmp(buf, " hello", 6));
    n = qvocab_decode_piece(&v, 1, 0, buf, sizeof buf);
    CHECK(n == 1 && buf[0] == '\n');
    n = qvocab_decode_piece(&v, 2, 0, buf, sizeof buf); /* "café" as bytes c3 a9 */
    CHECK(n == 5 && !memcmp(buf, "caf\xc3\xa9", 5));
    CHECK_EQ_INT(qvocab_decode_piece(&v, 3, 0, buf, sizeof buf), 0);
}

static void test_utf8_complete(void)
{
    CHECK_EQ_INT(qutf8_complete("abc", 3), 3);
    CHECK_EQ_INT(qutf8_complete("ab\xe2\x96", 4), 2);      /* cut 3-byte char */
    CHECK_EQ_INT(qutf8_complete("ab\xe2\x96\x81", 5), 5);
    CHECK_EQ_INT(qutf8_complete("\xf0\x9f\x98", 3), 0);    /* cut emoji */
    CHECK_EQ_INT(qutf8_complete("\xf0\x9f\x98\x80", 4), 4);
    CHECK_EQ_INT(qutf8_complete("a\x80\x80\x80\x80", 5), 5); /* stray continuations pass */
    CHECK_EQ_INT(qutf8_complete("", 0), 0);
}

int main(void)
{
    QT_RUN(test_spm_pieces);
    QT_RUN(test_bpe_bytes);
    QT_RUN(test_utf8_complete);
    QT_MAIN_END();
}
