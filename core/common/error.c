#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One buffer per thread: a binding reads it right after the failing call on the same thread. */
static _Thread_local char detail[512];

static void set_detail(const char *fmt, va_list ap, const char *suffix)
{
    int n = vsnprintf(detail, sizeof detail, fmt, ap);
    if (n < 0) {
        detail[0] = '\0';
        return;
    }
    if (suffix != NULL && (size_t)n < sizeof detail)
        snprintf(detail + n, sizeof detail - (size_t)n, ": %s", suffix);
}

int shmipc__fail(int code, const char *fmt, ...)
{
    /*
     * A message without conversions is copied, not formatted: some are on hot paths (an
     * event loop's accept_stream(0) finds no new stream once per message it serves), and
     * vsnprintf costs several times a copy.
     */
    if (strchr(fmt, '%') == NULL) {
        size_t n = strlen(fmt);
        if (n >= sizeof detail)
            n = sizeof detail - 1;
        memcpy(detail, fmt, n);
        detail[n] = '\0';
        return code;
    }
    va_list ap;
    va_start(ap, fmt);
    set_detail(fmt, ap, NULL);
    va_end(ap);
    return code;
}

int shmipc__fail_stream(int code, uint32_t id, const char *msg)
{
    static const char head[] = "stream ";
    char num[10];
    size_t k = 0, n = sizeof head - 1;
    do {
        num[k++] = (char)('0' + id % 10);
        id /= 10;
    } while (id != 0);
    memcpy(detail, head, n); /* 7 + 10 + 2 bytes fit in the buffer whatever the id */
    while (k > 0)
        detail[n++] = num[--k];
    detail[n++] = ':';
    detail[n++] = ' ';
    size_t len = strlen(msg);
    if (len > sizeof detail - 1 - n)
        len = sizeof detail - 1 - n;
    memcpy(detail + n, msg, len);
    detail[n + len] = '\0';
    return code;
}

int shmipc__code_from_errno(int err)
{
    switch (err) {
#define MAP_ERRNO(name, value, msg)                                                                \
    case -(value):                                                                                 \
        return (value);
        SHMIPC_ERRNO_MAP(MAP_ERRNO)
#undef MAP_ERRNO
    case EPIPE:
        return SHMIPC_ECONNRESET;
    case ENFILE:
        return SHMIPC_EMFILE;
    case EPERM:
        return SHMIPC_EACCES;
    default:
        return SHMIPC_EIO;
    }
}

int shmipc__fail_errno(int err, const char *fmt, ...)
{
    char why[128];
    va_list ap;
    /* strerror_r (GNU) may return a static string rather than fill `why`. */
    const char *msg = strerror_r(err, why, sizeof why);
    va_start(ap, fmt);
    set_detail(fmt, ap, msg);
    va_end(ap);
    return shmipc__code_from_errno(err);
}

const char *shmipc__detail(void)
{
    return detail;
}

const char *shmipc__strerror(int code)
{
    switch (code) {
#define ERR_MSG(name, value, msg)                                                                  \
    case (value):                                                                                  \
        return msg;
        SHMIPC_ERRNO_MAP(ERR_MSG)
#undef ERR_MSG
    default:
        return "unknown error";
    }
}

const char *shmipc__errname(int code)
{
    switch (code) {
#define ERR_NAME(name, value, msg)                                                                 \
    case (value):                                                                                  \
        return "SHMIPC_" #name;
        SHMIPC_ERRNO_MAP(ERR_NAME)
#undef ERR_NAME
    default:
        return NULL;
    }
}
