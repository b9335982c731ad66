/*
 * shmipc-serve-worker built without Lua (meson -Dlua=disabled, or no liblua5.4): --lua says so.
 */
#include <stdio.h>

#include "worker.h"

int shmipc__worker_lua_load(const char *spec, shmipc_serve_handler *fn, void **data, char *err,
                            size_t errlen)
{
    (void)fn;
    (void)data;
    snprintf(err, errlen, "--lua %s: this shmipc-serve-worker was built without Lua 5.4", spec);
    return -1;
}

void shmipc__worker_lua_free(void *data)
{
    (void)data;
}
