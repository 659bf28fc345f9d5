/* test_sha256.c - SHA-256 (server/sha256.c) against FIPS 180-4's examples
 * and lengths around the padding boundary (checked with Python's hashlib). */
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

int main(void)
{
    QT_RUN(test_vectors);
    QT_MAIN_END();
}
