/* test_sha256.c - SHA-256 and SHA-1 (server/sha256.c) against FIPS 180-4's examples
 * and lengths around the padding boundary (checked with Python's hashlib). */
#include <stdio.h>
#include <string.h>

#include "qtest.h"
#include "sha256.h"

static void test_vectors(void)
{
    char hex[65];
    qsha256_hex("", 0, hex);
    CHECK(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    qsha256_hex("abc", 3, hex);
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 56 bytes: two blocks of padding */
    qsha256_hex(two, strlen(two), hex);
    CHECK(!strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
    char a[200];
    memset(a, 'a', sizeof a);
    qsha256_hex(a, 55, hex);
    CHECK(!strcmp(hex, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"));
    qsha256_hex(a, 64, hex);
    CHECK(!strcmp(hex, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"));
    qsha256_hex(a, 200, hex);
    CHECK(!strcmp(hex, "c2a908d98f5df987ade41b5fce213067efbcc21ef2240212a41e54b5e7c28ae5"));
}

/* SHA-1 (the WebSocket handshake's) of s[0..n) in hex is want. */
static int sha1_is(const char *s, size_t n, const char *want)
{
    uint8_t d[20];
    char hex[41];
    qsha1(s, n, d);
    for (int i = 0; i < 20; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return !strcmp(hex, want);
}

static void test_sha1_vectors(void)
{
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    char a[200];
    memset(a, 'a', sizeof a);
    CHECK(sha1_is("", 0, "da39a3ee5e6b4b0d3255bfef95601890afd80709"));
    CHECK(sha1_is("abc", 3, "a9993e364706816aba3e25717850c26c9cd0d89d"));
    CHECK(sha1_is(two, strlen(two), "84983e441c3bd26ebaae4aa1f95129e5e54670f1"));
    CHECK(sha1_is(a, 55, "c1c8bbdc22796e28c0e15163d20899b65621d65a"));
    CHECK(sha1_is(a, 64, "0098ba824b5c16427bd7a1122a5a442a25ec644d"));
    CHECK(sha1_is(a, 200, "e61cfffe0d9195a525fc6cf06ca2d77119c24a40"));
}

int main(void)
{
    QT_RUN(test_vectors);
    QT_RUN(test_sha1_vectors);
    QT_MAIN_END();
}
