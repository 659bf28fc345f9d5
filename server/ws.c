/* ws.c - the WebSocket protocol over bytes (ws.h). */
#include "ws.h"

#include <stdlib.h>
#include <string.h>

#include "sha256.h"
#include "utf8.h"
#include "util.h"

void qws_accept(const char *key, char out[29])
{
    static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char buf[128 + sizeof guid];
    size_t kl = strlen(key);
    if (kl > 128) kl = 128;
    memcpy(buf, key, kl);
    memcpy(buf + kl, guid, sizeof guid - 1);
    uint8_t d[21] = { 0 };
    qsha1(buf, kl + sizeof guid - 1, d);
    size_t o = 0;
    for (int i = 0; i < 21; i += 3) {
        const uint32_t v = (uint32_t)d[i] << 16 | (uint32_t)d[i + 1] << 8 | d[i + 2];
        out[o++] = b64[v >> 18 & 63];
        out[o++] = b64[v >> 12 & 63];
        out[o++] = i + 1 < 20 ? b64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < 20 ? b64[v & 63] : '=';
    }
    out[28] = 0;
}

/* ---- frames ------------------------------------------------------------------------- */

void qws_init(qws *w, size_t max_message)
{
    memset(w, 0, sizeof *w);
    w->max_message = max_message;
}

void qws_free(qws *w)
{
    free(w->in);
    free(w->msg);
    memset(w, 0, sizeof *w);
}

static int grow(char **b, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < need) c *= 2;
    char *nb = realloc(*b, c);
    if (!nb) return -1;
    *b = nb, *cap = c;
    return 0;
}

int qws_feed(qws *w, const char *data, size_t n)
{
    if (!n) return 0;
    if (w->in_len + n > w->max_message + (64u << 10) || grow(&w->in, &w->in_cap, w->in_len + n)) return -1;
    memcpy(w->in + w->in_len, data, n);
    w->in_len += n;
    return 0;
}

static qws_rc bad(qws *w, int code, const char *why)
{
    w->close_code = code;
    w->err = why;
    return QWS_ERROR;
}

qws_rc qws_parse(qws *w)
{
    if (w->close_code) return QWS_ERROR;
    for (;;) {
        if (w->skip) {
            const size_t k = w->in_len < w->skip ? w->in_len : (size_t)w->skip;
            memmove(w->in, w->in + k, w->in_len - k);
            w->in_len -= k, w->skip -= k;
            if (w->skip) return QWS_MORE;
        }
        const uint8_t *p = (const uint8_t *)w->in;
        if (w->in_len < 2) return QWS_MORE;
        const int fin = p[0] >> 7, rsv = p[0] >> 4 & 7, op = p[0] & 15, masked = p[1] >> 7;
        uint64_t len = p[1] & 127;
        size_t at = 2;
        if (rsv) return bad(w, 1002, "reserved bits set (no extension was agreed)");
        if (!masked) return bad(w, 1002, "a client's frame must be masked");
        if (len == 126) {
            if (w->in_len < 4) return QWS_MORE;
            len = (uint64_t)p[2] << 8 | p[3];
            at = 4;
        } else if (len == 127) {
            if (w->in_len < 10) return QWS_MORE;
            len = 0;
            for (int i = 0; i < 8; i++) len = len << 8 | p[2 + i];
            at = 10;
            if (len >> 63) return bad(w, 1002, "a malformed frame length");
        }
        const int control = op >= 8;
        if (control && (len > 125 || !fin)) return bad(w, 1002, "a malformed control frame");
        if (!control && op != 0 && op != QWS_TEXT && op != QWS_BINARY) return bad(w, 1002, "an unknown opcode");
        if (control && op != QWS_CLOSE && op != QWS_PING && op != QWS_PONG) return bad(w, 1002, "an unknown opcode");
        if (!control && op == 0 && w->dropping) {
            /* The rest of a dropped message. */
            w->skip = at + 4 + len;
            w->dropping = !fin;
            continue;
        }
        if (!control && len > w->max_message - (w->msg_op && op == 0 ? w->msg_len : 0)) {
            if (op == 0 && !w->msg_op) return bad(w, 1002, "a continuation with no message under way");
            if (op != 0 && w->msg_op) return bad(w, 1002, "a new message inside a fragmented one");
            w->skip = at + 4 + len;
            w->dropping = !fin;
            w->msg_op = 0, w->msg_len = 0;
            w->op = QWS_TOO_BIG;
            return QWS_EVENT;
        }
        if (w->in_len < at + 4 + len) return QWS_MORE;
        const uint8_t *mask = p + at;
        uint8_t *data = (uint8_t *)w->in + at + 4;
        for (uint64_t i = 0; i < len; i++) data[i] ^= mask[i & 3];
        const size_t used = at + 4 + (size_t)len;
        qws_rc rc = QWS_MORE;
        if (control) {
            memcpy(w->ctl, data, (size_t)len);
            w->ctl_len = (size_t)len;
            w->op = op;
            rc = QWS_EVENT;
        } else {
            if (op == 0 && !w->msg_op) return bad(w, 1002, "a continuation with no message under way");
            if (op != 0 && w->msg_op) return bad(w, 1002, "a new message inside a fragmented one");
            if (op != 0) w->msg_op = op, w->msg_len = 0;
            if (grow(&w->msg, &w->msg_cap, w->msg_len + (size_t)len + 1)) return bad(w, 1011, "out of memory");
            memcpy(w->msg + w->msg_len, data, (size_t)len);
            w->msg_len += (size_t)len;
            w->msg[w->msg_len] = 0;
            if (fin) {
                if (w->msg_op == QWS_TEXT && !qutf8_valid(w->msg, w->msg_len))
                    return bad(w, 1007, "a text message that is not UTF-8");
                w->op = w->msg_op;
                w->msg_op = 0;
                rc = QWS_EVENT;
            }
        }
        memmove(w->in, w->in + used, w->in_len - used);
        w->in_len -= used;
        if (rc == QWS_EVENT) return rc;
    }
}

size_t qws_frame_head(uint8_t out[10], int op, size_t n)
{
    out[0] = (uint8_t)(0x80 | (op & 15));
    if (n < 126) {
        out[1] = (uint8_t)n;
        return 2;
    }
    if (n < 65536) {
        out[1] = 126, out[2] = (uint8_t)(n >> 8), out[3] = (uint8_t)n;
        return 4;
    }
    out[1] = 127;
    for (int i = 0; i < 8; i++) out[2 + i] = (uint8_t)((uint64_t)n >> (8 * (7 - i)));
    return 10;
}
