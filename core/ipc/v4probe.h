/*
 * V4 against legacy-only peers. shmipc-go answers a V4 hello (version byte 0) with nothing:
 * it logs "invalid magic or version" and keeps the socket open. So a client with fallback
 * waits for the negotiation response only a short probe time, and remembers per address
 * that the peer speaks only V2/V3, so that later connects (session manager, reconnects) go
 * straight to the legacy handshake.
 */
#ifndef SHMIPC_IPC_V4PROBE_H
#define SHMIPC_IPC_V4PROBE_H

#include <stdint.h>

/* How long a client with fallback waits for the V4 negotiation response (ms). */
uint32_t shmipc__v4_probe_ms(void);

/* 1 when `address` was seen to speak only V2/V3 less than the cache time ago. */
int shmipc__v4_legacy_known(const char *address);

/* `address` fell back to legacy: remember it (no-op when the cache is off). */
void shmipc__v4_legacy_remember(const char *address);

/* A V4 connect to `address` succeeded: forget it. */
void shmipc__v4_legacy_forget(const char *address);

/* Test hook: empties the cache. */
void shmipc__v4_legacy_clear(void);

#endif
