/*
 * Fuzz target: the V4 negotiation JSON (core/ipc/json.c, core/ipc/v4.c).
 *
 * Input: byte 0 picks what the rest is: bit 0 clear, a client's request (the server side:
 * parse, select, answer); set, a server's response (the client side). Bits 1-2 pick the
 * features the server offers. The oracles, beyond the sanitizers: every node of a parsed
 * document lies inside the text and links only to later nodes; what the parsers accept
 * re-encodes into a message that parses back to the same values; and whatever a request
 * says, the server's answer is a well-formed response.
 */
#include "ipc/json.h"
#include "ipc/proto.h"
#include "ipc/v4.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Walks every node: in the text, children and siblings only forward, strings decodable. */
static void check_tree(const struct shmipc__json *j)
{
    if (j->n == 0 || j->n > SHMIPC__JSON_MAX_NODES)
        abort();
    for (uint32_t i = 0; i < j->n; i++) {
        const struct shmipc__json_node *n = &j->nodes[i];
        if ((uint64_t)n->start + n->len > j->len || n->depth > SHMIPC__JSON_MAX_DEPTH)
            abort();
        if ((n->children && (n->children <= i || n->children >= j->n)) ||
            (n->next && (n->next <= i || n->next >= j->n)))
            abort();
        if (n->type == SHMIPC__JSON_STRING) {
            char out[64];
            size_t len = shmipc__json_string(j, (int)i, out, sizeof out);
            if (len >= sizeof out || out[len] != '\0' || len > n->len)
                abort();
        }
    }
    /* Lookups of every kind on every node must stay inside the tree. */
    for (uint32_t i = 0; i < j->n; i++) {
        (void)shmipc__json_get(j, (int)i, "settings");
        int steps = 0;
        for (int e = shmipc__json_first(j, (int)i); e >= 0; e = shmipc__json_next(j, e))
            if (++steps > SHMIPC__JSON_MAX_NODES)
                abort();
    }
}

/*
 * Equal strings, but for control characters: the decoder turns "\n" into a newline and
 * "\u000a" into '?', and the encoder writes a newline as "\u000a", so they come back as '?'.
 */
static int same_text(const char *a, const char *b)
{
    for (; *a != '\0' && *b != '\0'; a++, b++) {
        char x = (unsigned char)*a < 0x20 ? '?' : *a, y = (unsigned char)*b < 0x20 ? '?' : *b;
        if (x != y)
            return 0;
    }
    return *a == *b;
}

static void check_request(const uint8_t *json, size_t len, unsigned offered)
{
    struct shmipc__v4_request req, again;
    struct shmipc__v4_response resp, back;
    uint8_t msg[4096];
    struct shmipc__msg m;
    if (shmipc__v4_parse_request(json, len, &req) < 0)
        return;
    if (strlen(req.sdk_name) >= sizeof req.sdk_name ||
        strlen(req.sdk_version) >= sizeof req.sdk_version)
        abort();
    /* What we accepted from a client we can say again (the client side's encoder). */
    req.wants_v4 = 1;
    int n = shmipc__v4_encode_request(&req, msg, sizeof msg);
    if (n < 0 || shmipc__msg_parse(msg, (size_t)n, &m, 1) != n ||
        shmipc__v4_parse_request(m.u.negotiation.json, m.u.negotiation.len, &again) < 0 ||
        again.features != req.features || !same_text(again.sdk_name, req.sdk_name) ||
        !same_text(again.sdk_version, req.sdk_version) || !again.wants_v4 ||
        (req.features & SHMIPC_V4_FEATURE_POLLING && again.interval_us != req.interval_us))
        abort();
    /* The server's answer, over a unix socket and not. */
    for (int unix_socket = 0; unix_socket < 2; unix_socket++) {
        shmipc__v4_select(&req, offered, unix_socket, &resp);
        if ((resp.features & ~(req.features & offered)) != 0 ||
            resp.features == (SHMIPC_V4_FEATURE_POLLING | SHMIPC_V4_FEATURE_EVENTFD))
            abort();
        n = shmipc__v4_encode_response(&resp, msg, sizeof msg);
        if (n < 0 || shmipc__msg_parse(msg, (size_t)n, &m, 1) != n ||
            shmipc__v4_parse_response(m.u.negotiation.json, m.u.negotiation.len, &back) < 0 ||
            back.protocol != resp.protocol || back.features != resp.features ||
            !same_text(back.error_code, resp.error_code))
            abort();
    }
}

static void check_response(const uint8_t *json, size_t len)
{
    struct shmipc__v4_response resp, back;
    uint8_t msg[4096];
    struct shmipc__msg m;
    if (shmipc__v4_parse_response(json, len, &resp) < 0)
        return;
    if (strlen(resp.error_code) >= sizeof resp.error_code ||
        strlen(resp.error_message) >= sizeof resp.error_message || resp.protocol < 0 ||
        resp.protocol > 255)
        abort();
    int n = shmipc__v4_encode_response(&resp, msg, sizeof msg);
    if (n < 0 || shmipc__msg_parse(msg, (size_t)n, &m, 1) != n ||
        shmipc__v4_parse_response(m.u.negotiation.json, m.u.negotiation.len, &back) < 0 ||
        back.protocol != resp.protocol || back.features != resp.features ||
        !same_text(back.error_code, resp.error_code) ||
        !same_text(back.error_message, resp.error_message) ||
        (resp.features & SHMIPC_V4_FEATURE_POLLING && back.interval_us != resp.interval_us))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct shmipc__json j;
    if (size < 1 || size - 1 > SHMIPC__MAX_NEGOTIATION)
        return 0;
    uint8_t mode = data[0];
    unsigned offered = (mode >> 1) & (SHMIPC_V4_FEATURE_POLLING | SHMIPC_V4_FEATURE_EVENTFD);
    data++;
    size--;
    /* An exact-size copy, so a read past the end is caught; the JSON is not NUL-terminated. */
    uint8_t *copy = malloc(size ? size : 1);
    if (copy == NULL)
        abort();
    memcpy(copy, data, size);
    if (shmipc__json_parse(&j, (const char *)copy, size) == 0)
        check_tree(&j);
    if (mode & 1)
        check_response(copy, size);
    else
        check_request(copy, size, offered);
    free(copy);
    return 0;
}
