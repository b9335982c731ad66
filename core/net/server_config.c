/*
 * The HTTP server's config (struct shmipc_server_config, server.h): the builder's setters and
 * their validation. Owns nothing but the config struct; a refused value leaves it unchanged.
 * May call: common/ (errors, logging). Nothing here knows a server or a connection.
 */
#include "net/server_int.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Config */

static const char *const timeout_names[] = {"header_timeout", "keepalive_timeout", "stop_timeout",
                                            "ws_ping_timeout", "ws_idle_timeout"};

int shmipc__server_config_new(struct shmipc_server_config **out)
{
    struct shmipc_server_config *cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "server_config_new: out of memory");
    strcpy(cfg->address, "127.0.0.1");
    cfg->port = SHMIPC__SERVER_DEFAULT_PORT;
    strcpy(cfg->server_name, "shmipc");
    cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_WS_PING] = -1;
    cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_WS_IDLE] = -1;
    *out = cfg;
    return 0;
}

static int parse_address(const char *address, void *buf)
{
    return inet_pton(AF_INET, address, buf) == 1 || inet_pton(AF_INET6, address, buf) == 1;
}

int shmipc__server_config_set_address(struct shmipc_server_config *cfg, const char *address)
{
    unsigned char buf[sizeof(struct in6_addr)];
    size_t len = strlen(address);
    if (len == 0 || len > SHMIPC_SERVER_MAX_ADDRESS)
        return shmipc__fail(SHMIPC_EINVAL, "address: %zu bytes, expected 1..%d", len,
                            SHMIPC_SERVER_MAX_ADDRESS);
    if (shmipc__is_unix_host(address)) {
        int rc = shmipc__unix_host_check(address);
        if (rc < 0)
            return rc;
    } else if (!parse_address(address, buf)) {
        return shmipc__fail(SHMIPC_EINVAL,
                            "address: \"%s\" is not a numeric IPv4 or IPv6 address, "
                            "unix:PATH or unix:@NAME",
                            address);
    }
    memcpy(cfg->address, address, len + 1);
    return 0;
}

/*
 * Stores a timeout in the config's form (-1: never, else ms), after checking the WebSocket
 * ping against the idle timeout: a ping that is not sent before the idle timeout runs out
 * cannot keep anything open.
 */
static int store_timeout(struct shmipc_server_config *cfg, int which, int64_t ms)
{
    int64_t ping = which == SHMIPC_SERVER_TIMEOUT_WS_PING
                       ? ms
                       : cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_WS_PING];
    int64_t idle = which == SHMIPC_SERVER_TIMEOUT_WS_IDLE
                       ? ms
                       : cfg->timeout_ms[SHMIPC_SERVER_TIMEOUT_WS_IDLE];
    if ((which == SHMIPC_SERVER_TIMEOUT_WS_PING || which == SHMIPC_SERVER_TIMEOUT_WS_IDLE) &&
        ping > 0 && idle > 0 && ping >= idle)
        return shmipc__fail(SHMIPC_EINVAL,
                            "%s: %lld ms, but ws_ping_timeout (%lld ms) must be below "
                            "ws_idle_timeout (%lld ms)",
                            timeout_names[which], (long long)ms, (long long)ping, (long long)idle);
    cfg->timeout_ms[which] = ms;
    cfg->timeout_set[which] = 1;
    return 0;
}

static int check_server_timeout_which(int which)
{
    if (which < SHMIPC_SERVER_TIMEOUT_HEADER || which > SHMIPC_SERVER_TIMEOUT_WS_IDLE)
        return shmipc__fail(SHMIPC_EINVAL, "server timeout: %d is not a shmipc_server_timeout",
                            which);
    return 0;
}

/* The deprecated setter, with its old ranges; 0 meant "never" for the WebSocket timeouts. */
int shmipc__server_config_set_timeout_ms(struct shmipc_server_config *cfg, int which, uint32_t ms)
{
    uint32_t min;
    int rc = check_server_timeout_which(which);
    if (rc < 0)
        return rc;
    min = which == SHMIPC_SERVER_TIMEOUT_HEADER || which == SHMIPC_SERVER_TIMEOUT_KEEPALIVE ? 1 : 0;
    if (ms < min || ms > SHMIPC__SERVER_MAX_TIMEOUT_MS)
        return shmipc__fail(SHMIPC_EINVAL, "%s: %u ms is outside %u..%u", timeout_names[which], ms,
                            min, SHMIPC__SERVER_MAX_TIMEOUT_MS);
    int ws = which == SHMIPC_SERVER_TIMEOUT_WS_PING || which == SHMIPC_SERVER_TIMEOUT_WS_IDLE;
    return store_timeout(cfg, which, ws && ms == 0 ? -1 : (int64_t)ms);
}

/*
 * The API's rule: negative is never (forever), 0 does not wait. For the header, ping and idle
 * timeouts "no wait" means nothing, so 0 is refused; for keep-alive it turns keep-alive off,
 * for the stop it closes at once.
 */
int shmipc__server_config_set_timeout(struct shmipc_server_config *cfg, int which, int timeout_ms)
{
    int rc = check_server_timeout_which(which);
    if (rc < 0)
        return rc;
    if (timeout_ms == 0 && which != SHMIPC_SERVER_TIMEOUT_KEEPALIVE &&
        which != SHMIPC_SERVER_TIMEOUT_STOP)
        return shmipc__fail(SHMIPC_EINVAL, "%s: 0 ms has no meaning (negative: never, else 1..%u)",
                            timeout_names[which], SHMIPC__SERVER_MAX_TIMEOUT_MS);
    if (timeout_ms > (int)SHMIPC__SERVER_MAX_TIMEOUT_MS)
        return shmipc__fail(SHMIPC_EINVAL, "%s: %d ms is above %u", timeout_names[which],
                            timeout_ms, SHMIPC__SERVER_MAX_TIMEOUT_MS);
    return store_timeout(cfg, which, timeout_ms < 0 ? -1 : timeout_ms);
}

static int limit_range(int which, uint64_t value)
{
    static const char *const names[] = {"request_line",
                                        "head_bytes",
                                        "headers",
                                        "body",
                                        "pipeline",
                                        "ws_message",
                                        "ws_send_high_water",
                                        "ws_send_limit",
                                        "keepalive_requests"};
    static const uint64_t max[] = {
        SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES, SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES,
        SHMIPC__HTTP_LIMIT_MAX_HEADERS,    SHMIPC__SERVER_MAX_BODY,
        SHMIPC__SERVER_MAX_PIPELINE,       SHMIPC__WS_LIMIT_MAX_MESSAGE,
        SHMIPC__WS_LIMIT_MAX_TX,           SHMIPC__WS_LIMIT_MAX_TX,
        SHMIPC__SERVER_MAX_KA_REQUESTS};
    return shmipc__fail(SHMIPC_EINVAL, "limit %s: %llu is above %llu", names[which],
                        (unsigned long long)value, (unsigned long long)max[which]);
}

/* The WebSocket send queue's marks, checked against each other as they resolve (the one not
 * set at its default): the high-water mark may not exceed the limit. */
static int ws_tx_limit(struct shmipc_server_config *cfg, int which, uint64_t value)
{
    uint64_t high = cfg->ws_tx_high_water, limit = cfg->ws_tx_limit, rhigh, rlimit;
    if (value > SHMIPC__WS_LIMIT_MAX_TX)
        return limit_range(which, value);
    if (which == SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER)
        high = value;
    else
        limit = value;
    /* As shmipc__ws_limits_resolve() will resolve them. */
    rhigh = high != 0 ? high : SHMIPC__WS_DEFAULT_TX_HIGH_WATER;
    rlimit = limit != 0                            ? limit
             : rhigh > SHMIPC__WS_DEFAULT_TX_LIMIT ? rhigh
                                                   : SHMIPC__WS_DEFAULT_TX_LIMIT;
    if (rhigh > rlimit)
        return shmipc__fail(
            SHMIPC_EINVAL,
            "limit %s: %llu, but ws_send_high_water (%llu) may not be above "
            "ws_send_limit (%llu)",
            which == SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT ? "ws_send_limit" : "ws_send_high_water",
            (unsigned long long)value, (unsigned long long)rhigh, (unsigned long long)rlimit);
    cfg->ws_tx_high_water = high;
    cfg->ws_tx_limit = limit;
    return 0;
}

int shmipc__server_config_set_limit(struct shmipc_server_config *cfg, int which, uint64_t value)
{
    struct shmipc__http_limits l = cfg->limits;
    struct shmipc__http_limits resolved;
    int rc;
    switch (which) {
    case SHMIPC_SERVER_LIMIT_REQUEST_LINE:
        if (value > SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES)
            return limit_range(which, value);
        l.max_request_line = (uint32_t)value;
        break;
    case SHMIPC_SERVER_LIMIT_HEAD_BYTES:
        if (value > SHMIPC__HTTP_LIMIT_MAX_HEAD_BYTES)
            return limit_range(which, value);
        l.max_head_bytes = (uint32_t)value;
        break;
    case SHMIPC_SERVER_LIMIT_HEADERS:
        if (value > SHMIPC__HTTP_LIMIT_MAX_HEADERS)
            return limit_range(which, value);
        l.max_headers = (uint32_t)value;
        break;
    case SHMIPC_SERVER_LIMIT_BODY:
        /* The receive buffer holds a whole body, so the bound is memory, not the parser's. */
        if (value > SHMIPC__SERVER_MAX_BODY)
            return limit_range(which, value);
        l.max_body = value;
        break;
    case SHMIPC_SERVER_LIMIT_PIPELINE:
        if (value > SHMIPC__SERVER_MAX_PIPELINE)
            return limit_range(which, value);
        cfg->pipeline = (uint32_t)value;
        return 0;
    case SHMIPC_SERVER_LIMIT_WS_MESSAGE:
        if (value > SHMIPC__WS_LIMIT_MAX_MESSAGE)
            return limit_range(which, value);
        cfg->ws_max_message = value;
        return 0;
    case SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER:
    case SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT:
        return ws_tx_limit(cfg, which, value);
    case SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS:
        if (value > SHMIPC__SERVER_MAX_KA_REQUESTS)
            return limit_range(which, value);
        cfg->keepalive_requests = (uint32_t)value;
        return 0;
    default:
        return shmipc__fail(SHMIPC_EINVAL, "server limit: %d is not a shmipc_server_limit", which);
    }
    rc = shmipc__http_limits_resolve(&resolved, &l);
    if (rc < 0)
        return rc;
    cfg->limits = l;
    return 0;
}

int shmipc__server_config_set_server_name(struct shmipc_server_config *cfg, const char *name)
{
    size_t len = name != NULL ? strlen(name) : 0;
    if (len > SHMIPC_SERVER_MAX_NAME)
        return shmipc__fail(SHMIPC_EINVAL, "server_name: %zu bytes, at most %d", len,
                            SHMIPC_SERVER_MAX_NAME);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] >= 0x7f)
            return shmipc__fail(SHMIPC_EINVAL, "server_name: byte %zu is not visible ASCII", i);
    if (len > 0)
        memcpy(cfg->server_name, name, len + 1);
    else
        cfg->server_name[0] = '\0';
    return 0;
}
