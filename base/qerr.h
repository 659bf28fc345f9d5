/* qerr.h - the one table of error codes.
 *
 * Every fallible function in quire returns int: 0 on success, a negative
 * QERR_* code on failure.  Where a user needs more detail than the code, the
 * function also takes a caller-owned message buffer (char *err, size_t errlen)
 * and writes one line there.  The table is an X-macro so that the enum, the
 * names and the messages cannot drift apart.
 */
#ifndef QUIRE_QERR_H
#define QUIRE_QERR_H

#include <stddef.h>

#define QERR_TABLE(X)                                                      \
    X(OK,          0,  "success")                                          \
    X(NOMEM,      -1,  "out of memory")                                    \
    X(IO,         -2,  "I/O error")                                        \
    X(FORMAT,     -3,  "malformed file")                                   \
    X(UNSUPPORTED,-4,  "unsupported feature")                              \
    X(INVAL,      -5,  "invalid argument")                                 \
    X(RANGE,      -6,  "value out of range")                               \
    X(NOTFOUND,   -7,  "not found")                                        \
    X(LIMIT,      -8,  "limit exceeded")                                   \
    X(BUSY,       -9,  "resource busy")                                    \
    X(CANCELLED,  -10, "cancelled")                                        \
    X(INTERNAL,   -11, "internal error")                                   \
    X(DEVICE,     -12, "device error")

enum {
#define QERR_ENUM_(name, code, msg) QERR_##name = (code),
    QERR_TABLE(QERR_ENUM_)
#undef QERR_ENUM_
};

/* Returns a static message for rc ("unknown error" for codes not in the
 * table).  Cannot fail. */
const char *qerr_str(int rc);

/* Returns the symbolic name of rc ("QERR_FORMAT"), or "QERR_?".  Cannot fail. */
const char *qerr_name(int rc);

/* Formats a message into err (if err && errlen) and returns rc, so that
 * error paths read `return qerr_set(err, errlen, QERR_FORMAT, "...", ...)`. */
int qerr_set(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
