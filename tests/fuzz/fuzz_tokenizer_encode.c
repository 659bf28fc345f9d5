/* fuzz_tokenizer_encode.c - libFuzzer target for encoding and decoding.
 *
 * Loads tests/fixtures/tokenizers/gpt2/tokenizer.json once (from $QUIRE_ROOT,
 * else the current directory: run from the repository root), and a small
 * SentencePiece-style tokenizer built in code.  An input's first byte picks
 * the tokenizer, the encode flags (special-token parsing, the
 * post-processor) and the decode flags; the rest is text: valid UTF-8 must
 * encode and, with special tokens as text, decode back to itself through
 * the byte-level tokenizer; the streaming detokenizer must give the full
 * decode chunk by chunk, each chunk whole UTF-8 characters.  Invalid UTF-8
 * must be refused.  The text is also read as ids (4 bytes each) and
 * decoded.  (One case an input, not all eight: the fuzzer reaches each
 * through the first byte, at an eighth of the cost.)
 *
 * max_len: 1025 (scripts/test.sh passes it: the byte, then 256 ids, all the
 * target reads as ids; words past the 256-byte cache limit and the
 * 48-symbol heap threshold fit; longer text only repeats words)
 *
 *   CC=clang cmake -B build-fuzz -DQUIRE_FUZZ=ON -DBUILD_TESTING=OFF
 *   cmake --build build-fuzz --target fuzz_tokenizer_encode
 *   cp -r tests/fuzz/corpus/tokenizer_encode /tmp/corpus && ./build-fuzz/fuzz_tokenizer_encode /tmp/corpus
 */
#include "qerr.h"
#include "tokenizer.h"
#include "utf8.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static qtok *gpt2, *spm;

/* A byte-fallback tokenizer with a Prepend/Replace normalizer and the
 * SentencePiece decoder chain, small enough to write down here. */
static const char spm_json[] =
    "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"},{\"type\":\"NFC\"}]},"
    "\"pre_tokenizer\":{\"type\":\"Digits\",\"individual_digits\":true},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},"
    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \","
    "\"start\":1,\"stop\":0}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
    "\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},{\"id\":1,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,"
    "\"rstrip\":false,\"normalized\":false,\"special\":true},{\"id\":2,\"content\":\"</s>\",\"single_word\":false,"
    "\"lstrip\":true,\"rstrip\":true,\"normalized\":false,\"special\":false}],"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,\"vocab\":{%s},"
    "\"merges\":[\"\\u2581 a\",\"\\u2581a b\",\"a b\",\"\\u2581 \\u2581\",\"\\u00e9 \\u00e9\"]}}";

static qtok *build_spm(void)
{
    static char vocab[8192], json[16384];
    size_t o = (size_t)snprintf(vocab, sizeof vocab, "\"<unk>\":0,\"<s>\":1,\"</s>\":2");
    for (int b = 0; b < 256; b++) o += (size_t)snprintf(vocab + o, sizeof vocab - o, ",\"<0x%02X>\":%d", b, 3 + b);
    snprintf(vocab + o, sizeof vocab - o,
             ",\"\\u2581\":259,\"a\":260,\"b\":261,\"\\u2581a\":262,\"\\u2581ab\":263,\"ab\":264,\"\\u2581\\u2581\":265,"
             "\"\\u00e9\":266,\"\\u00e9\\u00e9\":267,\"1\":268");
    snprintf(json, sizeof json, spm_json, vocab);
    char err[512];
    qtok *t = NULL;
    if (qtok_load_json_text(json, strlen(json), &t, err, sizeof err)) {
        fprintf(stderr, "fuzz_tokenizer_encode: built-in tokenizer: %s\n", err);
        abort();
    }
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    q_set_alloc_limit((size_t)256 << 20);
    qlog_set_level(QLOG_OFF);
    char path[4096], err[512];
    const char *root = getenv("QUIRE_ROOT");
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizers/gpt2/tokenizer.json", root ? root : ".");
    if (qtok_load_json(path, &gpt2, err, sizeof err)) {
        fprintf(stderr, "fuzz_tokenizer_encode: %s (run from the repository root or set QUIRE_ROOT)\n", err);
        abort();
    }
    spm = build_spm();
    return 0;
}

static int utf8_whole(const char *s, size_t n)
{
    return qutf8_complete(s, n) == n;
}

/* Decodes ids in full and streaming; the two must agree. */
static void check_stream(const qtok *t, const int32_t *ids, int n, unsigned flags)
{
    char *text;
    size_t len;
    if (qtok_decode(t, ids, n, flags, &text, &len)) return;
    qdetok *d = qdetok_new(t, flags);
    if (d) {
        size_t at = 0;
        const char *c;
        size_t cl;
        for (int i = 0; i <= n; i++) {
            if (i < n ? qdetok_push(d, ids[i], &c, &cl) : qdetok_flush(d, &c, &cl)) break;
            if (!utf8_whole(c, cl) || at + cl > len || memcmp(text + at, c, cl)) abort();
            at += cl;
        }
        if (at != len) abort();
        qdetok_free(d);
    }
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    /* The first byte picks the case: bits 0-1 the encode flags, bit 2 the
     * tokenizer, bit 3 how the raw ids decode; the rest is the text. */
    const unsigned pick = data[0];
    const char *s = (const char *)data + 1;
    const size_t len_s = size - 1;
    const qtok *t = pick & 4 ? spm : gpt2;
    const unsigned flags = pick & 3;
    int32_t *ids;
    int n;
    const int rc = qtok_encode(t, s, len_s, flags, &ids, &n);
    if (rc && rc != QERR_INVAL) abort(); /* the only refusal: not UTF-8 */
    if (!rc) {
        if (t == gpt2 && flags == 0) { /* byte-level: the text comes back */
            char *text;
            size_t len;
            if (qtok_decode(t, ids, n, 0, &text, &len) == 0) {
                if (len != len_s || memcmp(text, s, len_s)) abort();
                free(text);
            }
        }
        check_stream(t, ids, n, flags & 1 ? QTOK_SKIP_SPECIAL : 0);
        free(ids);
    }
    /* the bytes as ids */
    int32_t raw[256];
    n = (int)(len_s / 4 > 256 ? 256 : len_s / 4);
    for (int i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, s + 4 * i, 4);
        raw[i] = (int32_t)(v % (uint32_t)(qtok_vocab_size(t) + 8)) - 4;
    }
    check_stream(t, raw, n, pick & 8 ? QTOK_SKIP_SPECIAL : 0);
    return 0;
}
