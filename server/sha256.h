/* sha256.h - SHA-256 (FIPS 180-4), for the digests of API keys that own
 * sessions (a key itself is never stored), and SHA-1 for the WebSocket
 * handshake. */
#ifndef QUIRE_SHA256_H
#define QUIRE_SHA256_H

#include <stddef.h>
#include <stdint.h>

/* The digest of n bytes of data into out.  Cannot fail. */
void qsha256(const void *data, size_t n, uint8_t out[32]);
/* SHA-1 of n bytes into out, for the WebSocket handshake's accept key
 * (RFC 6455) only.  Cannot fail. */
void qsha1(const void *data, size_t n, uint8_t out[20]);
/* The same as 64 lowercase hex digits and a NUL. */
void qsha256_hex(const void *data, size_t n, char out[65]);

#endif
