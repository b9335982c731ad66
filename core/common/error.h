/*
 * Internal error helpers: every failure path records a detail (shmipc__detail()), and the
 * error table (shmipc__strerror(), shmipc__errname()) names the codes of SHMIPC_ERRNO_MAP.
 * bindings/error.c exports them as shmipc_error_detail(), shmipc_strerror(), shmipc_errname().
 */
#ifndef SHMIPC_CORE_ERROR_H
#define SHMIPC_CORE_ERROR_H

#include "shmipc.h"

/*
 * Records a printf-style detail for the calling thread and returns `code`, so a failure path
 * reads `return shmipc__fail(SHMIPC_EINVAL, "queue_capacity: %u is zero", n);`.
 */
int shmipc__fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * shmipc__fail(code, "stream %u: %s", id, msg) without vsnprintf: for the answers an event
 * loop gets once per message (a non-blocking read's "no data yet"), where formatting cost
 * more than the read.
 */
int shmipc__fail_stream(int code, uint32_t id, const char *msg);

/* Like shmipc__fail() for a failed system call: maps errno to a code and appends strerror. */
int shmipc__fail_errno(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Maps a positive errno value onto the closest shmipc code (SHMIPC_EIO when none fits). */
int shmipc__code_from_errno(int err);

/* The calling thread's detail buffer (what shmipc_error_detail() returns). */
const char *shmipc__detail(void);

/* The message of a code, "unknown error" for a code not in SHMIPC_ERRNO_MAP. */
const char *shmipc__strerror(int code);

/* "SHMIPC_EINVAL" for SHMIPC_EINVAL; NULL for a code not in SHMIPC_ERRNO_MAP. */
const char *shmipc__errname(int code);

#endif
