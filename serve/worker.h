/*
 * shmipc-serve-worker's parts (serve/worker.c): the Lua handler (serve/worker_lua.c, or the
 * stubs of a build without Lua).
 */
#ifndef SHMIPC_SERVE_WORKER_H
#define SHMIPC_SERVE_WORKER_H

#include <stddef.h>

#include "shmipc_serve.h"

/* The symbol `--c LIB.so` resolves when no :SYMBOL is given. */
#define SHMIPC__WORKER_C_SYMBOL "shmipc_serve_handle"

/*
 * Loads the Lua handler MODULE[:FUNCTION] (require(MODULE) returns the handler function, or a
 * table holding FUNCTION) into a new Lua state: *fn and *data serve requests with it. -1 with
 * the reason in err.
 */
int shmipc__worker_lua_load(const char *spec, shmipc_serve_handler *fn, void **data, char *err,
                            size_t errlen);

/* Closes the Lua state of shmipc__worker_lua_load(); NULL is a no-op. */
void shmipc__worker_lua_free(void *data);

#endif
