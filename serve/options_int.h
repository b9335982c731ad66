/*
 * What serve/options.c shares with serve/check.c and nothing else: the error message helpers
 * and the final check of the parsed options (which --check runs again).
 */
#ifndef SHMIPC_SERVE_OPTIONS_INT_H
#define SHMIPC_SERVE_OPTIONS_INT_H

#include "options.h"

#include <stddef.h>

/* printf into err (NUL-terminated when errlen > 0; nothing when err is NULL or errlen 0). */
void shmipc__serve_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A value for a message: printable ASCII ('?' for other bytes), cut with "..." to fit cap. */
const char *shmipc__serve_shown(const char *v, char *buf, size_t cap);

/* The checks made once every source is read (an APP is given, and has its kind's shape). */
int shmipc__serve_validate(shmipc__serve_options *o, char *err, size_t errlen);

#endif
