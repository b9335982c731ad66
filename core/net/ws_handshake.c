/* The WebSocket opening handshake; see ws_handshake.h. */
#include "net/ws_handshake.h"

#include <string.h>

#include "common/error.h"
#include "net/ws_codec.h"
#include "shmipc.h"

void shmipc__ws_accept(const char *key, size_t key_len, char out[SHMIPC__WS_ACCEPT_LEN + 1])
{
    struct shmipc__sha1 s;
    uint8_t digest[SHMIPC__SHA1_LEN];
    shmipc__sha1_init(&s);
    shmipc__sha1_update(&s, key, key_len);
    shmipc__sha1_update(&s, SHMIPC__WS_GUID, sizeof SHMIPC__WS_GUID - 1);
    shmipc__sha1_final(&s, digest);
    shmipc__base64_encode(digest, sizeof digest, out);
}

/* ---------------------------------------------------------------------------------------- */
/* Field values */

static int ieq(const char *a, size_t n, const char *lit)
{
    if (strlen(lit) != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = a[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != lit[i])
            return 0;
    }
    return 1;
}

static int is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/*
 * The next element of a comma-separated list (RFC 9110 §5.6.1) in v[*i..n), without the
 * optional whitespace around it; empty elements are skipped, as recipients must. Returns 1
 * with the element at v[*a..*z), or 0 at the end.
 */
static int next_element(const char *v, size_t n, size_t *i, size_t *a, size_t *z)
{
    for (;;) {
        while (*i < n && (v[*i] == ' ' || v[*i] == '\t' || v[*i] == ','))
            (*i)++;
        if (*i == n)
            return 0;
        *a = *i;
        while (*i < n && v[*i] != ',')
            (*i)++;
        *z = *i;
        while (*z > *a && (v[*z - 1] == ' ' || v[*z - 1] == '\t'))
            (*z)--;
        if (*z > *a)
            return 1;
    }
}

/* Whether any field `name` lists `token` (case-insensitive). */
static int lists_token(const struct shmipc__http_request *req, const char *name, const char *token)
{
    size_t name_len = strlen(name);
    for (int f = shmipc__http_find_header(req, name, name_len, 0); f >= 0;
         f = shmipc__http_find_header(req, name, name_len, (uint32_t)f + 1)) {
        const char *v = shmipc__http_at(req, req->fields[f].value);
        size_t n = req->fields[f].value.len, i = 0, a, z;
        while (next_element(v, n, &i, &a, &z))
            if (ieq(v + a, z - a, token))
                return 1;
    }
    return 0;
}

/* The only field `name`: its index, -1 when absent, -2 when repeated. */
static int only_field(const struct shmipc__http_request *req, const char *name)
{
    size_t name_len = strlen(name);
    int f = shmipc__http_find_header(req, name, name_len, 0);
    if (f >= 0 && shmipc__http_find_header(req, name, name_len, (uint32_t)f + 1) >= 0)
        return -2;
    return f;
}

int shmipc__ws_is_upgrade(const struct shmipc__http_request *req)
{
    return lists_token(req, "Upgrade", "websocket");
}

/* ---------------------------------------------------------------------------------------- */
/* The check */

static int refuse(struct shmipc__ws_handshake *hs, uint16_t status, const char *why)
{
    hs->status = status;
    hs->detail = why;
    return shmipc__fail(SHMIPC_EPROTO, "websocket handshake: %s (%u)", why, status);
}

/*
 * Chooses the subprotocol: the first server preference that some Sec-WebSocket-Protocol
 * element names. Returns 0 with hs->protocol set (or -1), or -1 for a malformed list.
 */
static int choose_protocol(struct shmipc__ws_handshake *hs, const struct shmipc__http_request *req,
                           const char *const *protocols, size_t nprotocols)
{
    static const char name[] = "Sec-WebSocket-Protocol";
    int best = -1;
    for (int f = shmipc__http_find_header(req, name, sizeof name - 1, 0); f >= 0;
         f = shmipc__http_find_header(req, name, sizeof name - 1, (uint32_t)f + 1)) {
        const char *v = shmipc__http_at(req, req->fields[f].value);
        size_t n = req->fields[f].value.len, i = 0, a, z;
        while (next_element(v, n, &i, &a, &z)) {
            for (size_t k = a; k < z; k++)
                if (!is_tchar((unsigned char)v[k]))
                    return -1;
            for (size_t p = 0; p < nprotocols && (best < 0 || p < (size_t)best); p++)
                if (strlen(protocols[p]) == z - a && memcmp(protocols[p], v + a, z - a) == 0)
                    best = (int)p;
        }
    }
    hs->protocol = best;
    return 0;
}

int shmipc__ws_handshake_check(struct shmipc__ws_handshake *hs,
                               const struct shmipc__http_request *req, const char *const *protocols,
                               size_t nprotocols)
{
    memset(hs, 0, sizeof *hs);
    hs->protocol = -1;
    if (req->flags & SHMIPC__HTTP_IS_HEAD)
        hs->resp_flags |= SHMIPC__HTTP_RESP_HEAD;
    if (req->minor == 0)
        hs->resp_flags |= SHMIPC__HTTP_RESP_HTTP10;

    if (req->method != SHMIPC__HTTP_GET)
        return refuse(hs, 400, "the method is not GET");
    if (req->minor != 1)
        return refuse(hs, 400, "the version is not HTTP/1.1");
    if (req->body_kind != SHMIPC__HTTP_BODY_NONE)
        return refuse(hs, 400, "an upgrade request has a body");
    if (!lists_token(req, "Upgrade", "websocket"))
        return refuse(hs, 400, "no Upgrade: websocket");
    if (!(req->flags & SHMIPC__HTTP_CONN_UPGRADE))
        return refuse(hs, 400, "Connection does not list upgrade");

    int f = only_field(req, "Sec-WebSocket-Version");
    if (f < 0 || !ieq(shmipc__http_at(req, req->fields[f].value), req->fields[f].value.len, "13"))
        return refuse(hs, 426,
                      f == -1   ? "no Sec-WebSocket-Version"
                      : f == -2 ? "Sec-WebSocket-Version is repeated"
                                : "Sec-WebSocket-Version is not 13");

    f = only_field(req, "Sec-WebSocket-Key");
    if (f < 0)
        return refuse(hs, 400, f == -1 ? "no Sec-WebSocket-Key" : "Sec-WebSocket-Key is repeated");
    const char *key = shmipc__http_at(req, req->fields[f].value);
    size_t key_len = req->fields[f].value.len;
    uint8_t nonce[16];
    if (key_len != SHMIPC__WS_KEY_LEN ||
        shmipc__base64_decode(key, key_len, nonce, sizeof nonce) != (long)sizeof nonce)
        return refuse(hs, 400, "Sec-WebSocket-Key is not the base64 of 16 bytes");

    if (choose_protocol(hs, req, protocols, nprotocols) != 0)
        return refuse(hs, 400, "Sec-WebSocket-Protocol is not a list of tokens");

    shmipc__ws_accept(key, key_len, hs->accept);
    hs->status = 101;
    hs->protocols = protocols;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The response */

#define HEADER(n, v) ((struct shmipc__http_header_out){n, v, sizeof n - 1, (uint32_t)strlen(v)})

void shmipc__ws_handshake_response(struct shmipc__ws_handshake *hs,
                                   struct shmipc__http_response *resp)
{
    memset(resp, 0, sizeof *resp);
    hs->nheaders = 0;
    if (hs->status == 101) {
        resp->status = 101;
        hs->headers[hs->nheaders++] = HEADER("Upgrade", "websocket");
        hs->headers[hs->nheaders++] = HEADER("Connection", "Upgrade");
        hs->headers[hs->nheaders++] = HEADER("Sec-WebSocket-Accept", hs->accept);
        if (hs->protocol >= 0)
            hs->headers[hs->nheaders++] =
                HEADER("Sec-WebSocket-Protocol", hs->protocols[hs->protocol]);
    } else {
        resp->flags = hs->resp_flags;
        shmipc__http_response_error(resp, hs->status ? hs->status : 400);
        if (hs->status == 426)
            hs->headers[hs->nheaders++] = HEADER("Sec-WebSocket-Version", "13");
    }
    resp->headers = hs->headers;
    resp->nheaders = hs->nheaders;
}

int shmipc__ws_handshake_write(struct shmipc__ws_handshake *hs, char *out, size_t cap,
                               const struct shmipc__http_date *date, const char *server)
{
    struct shmipc__http_response resp;
    struct iovec iov[2];
    shmipc__ws_handshake_response(hs, &resp);
    int niov = shmipc__http_response_iov(&resp, date, server, out, cap, iov);
    if (niov < 0)
        return niov;
    size_t n = iov[0].iov_len;
    if (niov == 2) {
        if (cap - n < iov[1].iov_len)
            return shmipc__fail(SHMIPC_ENOSPC,
                                "websocket handshake: the response needs more "
                                "than %zu bytes",
                                cap);
        memcpy(out + n, iov[1].iov_base, iov[1].iov_len);
        n += iov[1].iov_len;
    }
    return (int)n;
}
