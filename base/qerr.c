/* qerr.c - messages and names for the error codes of qerr.h's one table. */
#include "qerr.h"

#include <stdarg.h>
#include <stdio.h>

const char *qerr_str(int rc)
{
    switch (rc) {
#define QERR_STR_(name, code, msg) case code: return msg;
        QERR_TABLE(QERR_STR_)
#undef QERR_STR_
    }
    return "unknown error";
}

const char *qerr_name(int rc)
{
    switch (rc) {
#define QERR_NAME_(name, code, msg) case code: return "QERR_" #name;
        QERR_TABLE(QERR_NAME_)
#undef QERR_NAME_
    }
    return "QERR_?";
}

int qerr_set(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}
