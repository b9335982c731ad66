/* Internal error helpers: every failure path records a detail for shmipc_error_detail(). */
#ifndef SHMIPC_CORE_ERROR_H
#define SHMIPC_CORE_ERROR_H

#include "shmipc.h"

/*
 * Records a printf-style detail for the calling thread and returns `code`, so a failure path
 * reads `return shmipc__fail(SHMIPC_EINVAL, "queue_capacity: %u is zero", n);`.
 */
int shmipc__fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Like shmipc__fail() for a failed system call: maps errno to a code and appends strerror. */
int shmipc__fail_errno(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Maps a positive errno value onto the closest shmipc code (SHMIPC_EIO when none fits). */
int shmipc__code_from_errno(int err);

/* The calling thread's detail buffer, read by shmipc_error_detail(). */
const char *shmipc__detail(void);

#endif
