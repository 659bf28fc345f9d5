/* ws.h - the WebSocket protocol (RFC 6455) over bytes, with no socket.
 *
 * qws_accept makes the handshake's Sec-WebSocket-Accept; qws_parse reads a
 * client's frames into whole messages (fragments joined, control frames
 * answered by the caller); qws_frame builds a server frame.  Every size is
 * bounded: a message past max_message, a control frame past 125 bytes, an
 * unmasked frame, reserved bits or opcodes, a text message that is not
 * UTF-8, all end the connection with the close code RFC 6455 gives. */
#ifndef QUIRE_WS_H
#define QUIRE_WS_H

#include <stddef.h>
#include <stdint.h>

/* base64(SHA-1(key + the RFC's GUID)) into out (29 bytes with the NUL). */
void qws_accept(const char *key, char out[29]);

/* Opcodes; QWS_TOO_BIG is an event of qws_parse's own: a message past
 * max_message was dropped (its bytes skipped as they come; the connection
 * goes on). */
enum { QWS_TEXT = 1, QWS_BINARY = 2, QWS_CLOSE = 8, QWS_PING = 9, QWS_PONG = 10, QWS_TOO_BIG = 256 };

typedef struct {
    size_t max_message;
    char *in;                 /* bytes received, not yet read */
    size_t in_len, in_cap;
    char *msg;                /* the message being assembled */
    size_t msg_len, msg_cap;
    int msg_op;               /* its opcode (0: none under way) */
    unsigned long long skip;  /* payload bytes of a dropped frame still to come */
    int dropping;             /* the fragments of a dropped message go on */
    /* The last event (qws_parse's result): */
    int op;                   /* QWS_TEXT/BINARY (a whole message: msg, msg_len), CLOSE, PING, PONG */
    char ctl[126];            /* a control frame's payload */
    size_t ctl_len;
    int close_code;           /* QWS_ERROR: the close code to send (1002, 1007, 1009) */
    const char *err;          /* QWS_ERROR: why */
} qws;

typedef enum { QWS_MORE = 0, QWS_EVENT = 1, QWS_ERROR = 2 } qws_rc;

void qws_init(qws *w, size_t max_message);
void qws_free(qws *w);
/* Adds received bytes: 0, or -1 past max_message + 64 KiB unread (or out of
 * memory). */
int qws_feed(qws *w, const char *data, size_t n);
/* The next event in w->op (a whole data message in msg/msg_len, valid until
 * the next call; a control frame in ctl), QWS_MORE, or QWS_ERROR. */
qws_rc qws_parse(qws *w);
/* A server frame's header for a payload of n bytes with opcode op (final,
 * unmasked) into out: its length (2, 4 or 10). */
size_t qws_frame_head(uint8_t out[10], int op, size_t n);

#endif
