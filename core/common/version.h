/*
 * The library's version, for the core (a V4 handshake sends it as sdk_version) and for
 * bindings/error.c, which exports it. The numbers are the SHMIPC_VERSION_* macros of shmipc.h.
 */
#ifndef SHMIPC_CORE_VERSION_H
#define SHMIPC_CORE_VERSION_H

/* SHMIPC_VERSION_HEX: 0xMMmmpp. */
int shmipc__version(void);

/* "MAJOR.MINOR.PATCH", a static string. */
const char *shmipc__version_string(void);

#endif
