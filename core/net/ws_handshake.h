/*
 * The WebSocket opening handshake (RFC 6455 §4.2) on top of the HTTP/1.1 parser: validating
 * an upgrade request, choosing a subprotocol, and the 101 (or 400/426) response.
 *
 * The server parses the request head with shmipc__http_parse_head() as for any request, sees
 * that the route wants a WebSocket, and calls shmipc__ws_handshake_check(). On success it
 * queues the 101 response (shmipc__ws_handshake_response() fills a struct
 * shmipc__http_response for its batch, or shmipc__ws_handshake_write() writes the bytes), and
 * from the byte after the request head on, the connection speaks WebSocket frames
 * (ws_conn.h). On failure the same calls give the error response, which closes the
 * connection. Nothing is allocated.
 *
 * Checks, in this order (the first failure decides the status):
 * 1. the method is GET (else 400);
 * 2. the version is HTTP/1.1 (else 400);
 * 3. the request has no body: neither Content-Length above 0 nor Transfer-Encoding (else 400;
 *    the bytes after the head belong to the WebSocket);
 * 4. an Upgrade field lists the token "websocket" (case-insensitive) (else 400);
 * 5. a Connection field lists the token "upgrade" (case-insensitive) (else 400);
 * 6. exactly one Sec-WebSocket-Version field, whose value is "13" (else 426 with
 *    "Sec-WebSocket-Version: 13", so the client learns the version to retry with);
 * 7. exactly one Sec-WebSocket-Key field, the canonical padded base64 of 16 bytes (else 400);
 * 8. every Sec-WebSocket-Protocol field is a comma-separated list of tokens (else 400).
 * Sec-WebSocket-Extensions is ignored: no extension is negotiated, so RSV bits stay unused.
 */
#ifndef SHMIPC_CORE_NET_WS_HANDSHAKE_H
#define SHMIPC_CORE_NET_WS_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include "net/http_parser.h"
#include "net/http_writer.h"

/* The GUID of RFC 6455 §1.3, appended to the key before hashing. */
#define SHMIPC__WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
/* A Sec-WebSocket-Key (base64 of 16 bytes) and a Sec-WebSocket-Accept (of 20 bytes). */
#define SHMIPC__WS_KEY_LEN    24u
#define SHMIPC__WS_ACCEPT_LEN 28u

/*
 * Computes Sec-WebSocket-Accept for `key` (as received, key_len bytes):
 * base64(SHA-1(key + GUID)), NUL-terminated in `out`.
 */
void shmipc__ws_accept(const char *key, size_t key_len, char out[SHMIPC__WS_ACCEPT_LEN + 1]);

/*
 * Whether the request asks to become a WebSocket: an Upgrade field lists "websocket". A
 * server uses it to route; shmipc__ws_handshake_check() then validates the rest.
 */
int shmipc__ws_is_upgrade(const struct shmipc__http_request *req);

/*
 * The outcome of a handshake check, and the storage its response points into. Filled by
 * shmipc__ws_handshake_check(); the fields below `accept` are the response's.
 */
struct shmipc__ws_handshake {
    uint16_t status;              /* 101 when accepted, else 400 or 426 */
    uint16_t resp_flags;          /* HEAD and HTTP10 of the request, for an error response */
    int protocol;                 /* the chosen subprotocol's index in the server's list, or -1 */
    const char *detail;           /* why it was refused (static text), or NULL */
    const char *const *protocols; /* the server's list, when accepted */
    char accept[SHMIPC__WS_ACCEPT_LEN + 1];
    struct shmipc__http_header_out headers[4];
    uint32_t nheaders;
};

/*
 * Validates the upgrade request `req` (a complete head from shmipc__http_parse_head(), its
 * base still pointing at the head) and chooses the subprotocol: the first of `protocols`
 * (nprotocols NUL-terminated tokens, in the server's order of preference) that the client
 * offers in a Sec-WebSocket-Protocol field, compared case-sensitively; none when the client
 * offers none of them (the handshake still succeeds, without the header). Fills `hs`.
 * Returns 0 (hs->status 101), or SHMIPC_EPROTO (hs->status 400 or 426, detail set).
 */
int shmipc__ws_handshake_check(struct shmipc__ws_handshake *hs,
                               const struct shmipc__http_request *req, const char *const *protocols,
                               size_t nprotocols);

/*
 * Fills `resp` with the handshake's response: 101 Switching Protocols with Upgrade:
 * websocket, Connection: Upgrade, Sec-WebSocket-Accept and (when one was chosen)
 * Sec-WebSocket-Protocol; or the canned 400/426 error (Connection: close), the 426 with
 * Sec-WebSocket-Version: 13. The headers are written into `hs` now, so `resp` points into
 * `hs` and into the server's protocol list: both must outlive the response's use (a batch
 * copies the head when the response is added).
 */
void shmipc__ws_handshake_response(struct shmipc__ws_handshake *hs,
                                   struct shmipc__http_response *resp);

/*
 * Writes the whole response (head, and the error body of a 400/426) into out[0..cap), with
 * the Date line of `date` and the Server header `server` when not NULL. Returns its length,
 * or SHMIPC_ENOSPC.
 */
int shmipc__ws_handshake_write(struct shmipc__ws_handshake *hs, char *out, size_t cap,
                               const struct shmipc__http_date *date, const char *server);

#endif
