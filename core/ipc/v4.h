/*
 * V4 negotiation (docs/protocol.md §6): the JSON the client and the server exchange in a
 * Negotiation message (type 10, version byte 0) before the legacy memory hand-over.
 */
#ifndef SHMIPC_CORE_IPC_V4_H
#define SHMIPC_CORE_IPC_V4_H

#include "shmipc.h"

#include <stddef.h>
#include <stdint.h>

#define SHMIPC__V4_SDK_NAME             "shmipc-c"
#define SHMIPC__V4_FEATURE_POLLING_NAME "event_queue_polling"
#define SHMIPC__V4_FEATURE_EVENTFD_NAME "eventfd_wakeup"

struct shmipc__v4_request {
    int wants_v4;         /* 4 is among supports_protocols */
    unsigned features;    /* SHMIPC_V4_FEATURE_* asked for */
    uint32_t interval_us; /* settings.event_queue_polling.polling_interval_us, 0 if absent */
    char sdk_name[64];
    char sdk_version[32];
};

struct shmipc__v4_response {
    int protocol;         /* 4, or 0 with an error */
    unsigned features;    /* at most one wakeup feature */
    uint32_t interval_us; /* with polling */
    char error_code[48];  /* "" when accepted */
    char error_message[160];
};

/* Encodes a whole Negotiation message (header + JSON) into `out`; its length, or < 0. */
int shmipc__v4_encode_request(const struct shmipc__v4_request *r, uint8_t *out, size_t cap);
int shmipc__v4_encode_response(const struct shmipc__v4_response *r, uint8_t *out, size_t cap);

/* Parse a Negotiation body (the JSON); SHMIPC_EPROTO for malformed or ill-typed JSON. */
int shmipc__v4_parse_request(const uint8_t *json, size_t len, struct shmipc__v4_request *r);
int shmipc__v4_parse_response(const uint8_t *json, size_t len, struct shmipc__v4_response *r);

/*
 * The server's choice for request `req` given what it offers (`offered`, a feature mask) and
 * whether eventfds may be used (a unix socket, and a peer we trust with them: handshake.c):
 * polling wins over eventfd. Fills `resp`, with an
 * error code when the request cannot be served.
 */
void shmipc__v4_select(const struct shmipc__v4_request *req, unsigned offered, int eventfd_ok,
                       struct shmipc__v4_response *resp);

#endif
