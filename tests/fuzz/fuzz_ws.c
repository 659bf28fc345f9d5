/* fuzz_ws.c - libFuzzer target for WebSocket message handling
 * (server/ws.c): the bytes a socket receives after its handshake, in pieces
 * whose size the first byte picks, read into messages and control frames as
 * the connection's callback does (qws_feed, qws_parse).  Every outcome must
 * be a message within the limit (a text one valid UTF-8), a control frame
 * of at most 125 bytes, a dropped large message, more bytes wanted, or a
 * close code RFC 6455 gives (no crash, hang, leak or sanitizer report).
 *
 *   CC=clang cmake -B build-fuzz -DQUIRE_FUZZ=ON -DBUILD_TESTING=OFF
 *   cmake --build build-fuzz --target fuzz_ws
 *   cp -r tests/fuzz/corpus/ws /tmp/corpus && ./build-fuzz/fuzz_ws /tmp/corpus
 */
#include "ws.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size) return 0;
    const size_t piece = 1 + data[0] % 64;
    data++, size--;
    qws w;
    qws_init(&w, 1024);
    for (size_t i = 0; i < size;) {
        const size_t n = size - i < piece ? size - i : piece;
        if (qws_feed(&w, (const char *)data + i, n)) break;
        i += n;
        for (;;) {
            const qws_rc rc = qws_parse(&w);
            if (rc == QWS_MORE) break;
            if (rc == QWS_ERROR) {
                if (w.close_code != 1002 && w.close_code != 1007 && w.close_code != 1009 && w.close_code != 1011)
                    abort();
                goto done;
            }
            if (w.op == QWS_TEXT || w.op == QWS_BINARY) {
                if (w.msg_len > 1024 || w.msg[w.msg_len]) abort();
            } else if (w.op == QWS_CLOSE || w.op == QWS_PING || w.op == QWS_PONG) {
                if (w.ctl_len > 125) abort();
            } else if (w.op != QWS_TOO_BIG) {
                abort();
            }
        }
    }
done:
    qws_free(&w);
    uint8_t fh[10];
    if (qws_frame_head(fh, QWS_TEXT, size) > 10) abort();
    return 0;
}
