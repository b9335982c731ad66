#include "proto.h"

#include "common/error.h"

#include <string.h>

static const char *const type_names[] = {
    "ShareMemoryByFilePath",
    "Polling",
    "StreamClose",
    "FallbackData",
    "ExchangeProtoVersion",
    "ShareMemoryByMemfd",
    "AckShareMemory",
    "AckReadyRecvFD",
    "HotRestart",
    "HotRestartAck",
    "Negotiation",
};
_Static_assert(sizeof type_names / sizeof type_names[0] == SHMIPC__MSG_TYPE_MAX + 1,
               "every message type has a name");

const char *shmipc__msg_type_name(unsigned type)
{
    return type <= SHMIPC__MSG_TYPE_MAX ? type_names[type] : "unknown";
}

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void shmipc__header_encode(uint8_t out[SHMIPC__HEADER_SIZE], uint32_t length, uint8_t version,
                           uint8_t type)
{
    put_u32(out, length);
    put_u16(out + 4, SHMIPC__MAGIC);
    out[6] = version;
    out[7] = type;
}

void shmipc__header_decode(const uint8_t in[SHMIPC__HEADER_SIZE], struct shmipc__header *h)
{
    h->length = get_u32(in);
    h->magic = get_u16(in + 4);
    h->version = in[6];
    h->type = in[7];
}

/* The exact length of fixed-size messages, 0 for the variable ones. */
static uint32_t fixed_length(unsigned type)
{
    switch (type) {
    case SHMIPC__MSG_POLLING:
    case SHMIPC__MSG_EXCHANGE_VERSION:
    case SHMIPC__MSG_ACK_SHARE_MEMORY:
    case SHMIPC__MSG_ACK_READY_RECV_FD:
        return SHMIPC__HEADER_SIZE;
    case SHMIPC__MSG_STREAM_CLOSE:
        return SHMIPC__HEADER_SIZE + 4;
    case SHMIPC__MSG_HOT_RESTART:
    case SHMIPC__MSG_HOT_RESTART_ACK:
        return SHMIPC__HEADER_SIZE + 8;
    default:
        return 0;
    }
}

int shmipc__header_check(const struct shmipc__header *h, int allow_version0)
{
    if (h->magic != SHMIPC__MAGIC)
        return shmipc__fail(SHMIPC_EPROTO, "header: magic %#06x, expected 0x7758", h->magic);
    if (h->version == 0 && !allow_version0)
        return shmipc__fail(SHMIPC_EPROTO, "header: version 0 is not a legacy protocol version");
    if (h->type > SHMIPC__MSG_TYPE_MAX)
        return shmipc__fail(SHMIPC_EPROTO, "header: unknown message type %u", h->type);
    uint32_t fixed = fixed_length(h->type);
    /*
     * The reference reads exactly 8, 12 or 16 bytes for fixed messages whatever `length`
     * says. A length that disagrees would desynchronise the stream with any peer that does
     * trust it, so we refuse it instead.
     */
    if (fixed != 0 && h->length != fixed)
        return shmipc__fail(SHMIPC_EPROTO, "header: %s with length %u, expected %u",
                            type_names[h->type], h->length, fixed);
    if (h->type == SHMIPC__MSG_NEGOTIATION && h->version != 0)
        return shmipc__fail(SHMIPC_EPROTO, "header: Negotiation with version %u, not 0",
                            h->version);
    if (h->type == SHMIPC__MSG_NEGOTIATION && h->length > SHMIPC__MAX_NEGOTIATION)
        return shmipc__fail(SHMIPC_EPROTO, "header: Negotiation of %u bytes exceeds the limit %u",
                            h->length, SHMIPC__MAX_NEGOTIATION);
    if (h->type == SHMIPC__MSG_FALLBACK_DATA && h->length < SHMIPC__FALLBACK_HEADER_SIZE)
        return shmipc__fail(SHMIPC_EPROTO, "header: FallbackData with length %u, below 16",
                            h->length);
    if (fixed == 0 && h->length < SHMIPC__HEADER_SIZE + 4)
        return shmipc__fail(SHMIPC_EPROTO, "header: %s with length %u is too short",
                            type_names[h->type], h->length);
    if (h->length > SHMIPC__MAX_MESSAGE)
        return shmipc__fail(SHMIPC_EPROTO, "header: %s of %u bytes exceeds the limit %u",
                            type_names[h->type], h->length, SHMIPC__MAX_MESSAGE);
    return 0;
}

/*
 * True when `p` holds a control byte (below 0x20, or DEL) or a C1 control in UTF-8 (0xc2 0x80
 * .. 0xc2 0x9f, U+0080 .. U+009F: U+009B is a CSI to terminals that take C1 controls).
 */
static int has_control(const uint8_t *p, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] == 0x7f ||
            (p[i] == 0xc2 && i + 1 < n && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f))
            return 1;
    return 0;
}

static int parse_share(const uint8_t *body, uint32_t len, struct shmipc__msg *msg)
{
    uint32_t qlen, blen;
    if (len < 2 || (qlen = get_u16(body)) > len - 2 || len - 2 - qlen < 2)
        return shmipc__fail(SHMIPC_EPROTO, "share memory message: truncated queue path");
    blen = get_u16(body + 2 + qlen);
    if (blen != len - 4 - qlen)
        return shmipc__fail(SHMIPC_EPROTO,
                            "share memory message: buffer path of %u bytes in %u remaining", blen,
                            len - 4 - qlen);
    if (qlen == 0 || blen == 0 || qlen > SHMIPC__MAX_SHM_PATH || blen > SHMIPC__MAX_SHM_PATH)
        return shmipc__fail(SHMIPC_EPROTO, "share memory message: path lengths %u and %u", qlen,
                            blen);
    if (memchr(body + 2, 0, qlen) != NULL || memchr(body + 4 + qlen, 0, blen) != NULL)
        return shmipc__fail(SHMIPC_EPROTO, "share memory message: NUL byte in a path");
    /*
     * Nor any other control byte: the paths go into error details and logs, where a newline
     * would forge a line of the peer's choosing and an escape sequence would reach the
     * operator's terminal. Every client names its memory in printable text.
     */
    if (has_control(body + 2, qlen) || has_control(body + 4 + qlen, blen))
        return shmipc__fail(SHMIPC_EPROTO, "share memory message: control byte in a path");
    msg->u.share.queue_path = body + 2;
    msg->u.share.queue_len = (uint16_t)qlen;
    msg->u.share.buffer_path = body + 4 + qlen;
    msg->u.share.buffer_len = (uint16_t)blen;
    return 0;
}

int shmipc__msg_parse(const uint8_t *buf, size_t len, struct shmipc__msg *msg, int allow_version0)
{
    int rc;
    if (len < SHMIPC__HEADER_SIZE)
        return 0;
    shmipc__header_decode(buf, &msg->h);
    if ((rc = shmipc__header_check(&msg->h, allow_version0)) < 0)
        return rc;
    if (len < msg->h.length)
        return 0;
    const uint8_t *body = buf + SHMIPC__HEADER_SIZE;
    uint32_t body_len = msg->h.length - SHMIPC__HEADER_SIZE;
    switch (msg->h.type) {
    case SHMIPC__MSG_SHARE_MEMORY_BY_PATH:
    case SHMIPC__MSG_SHARE_MEMORY_BY_MEMFD:
        if ((rc = parse_share(body, body_len, msg)) < 0)
            return rc;
        break;
    case SHMIPC__MSG_STREAM_CLOSE:
        msg->u.stream_close.stream_id = get_u32(body);
        break;
    case SHMIPC__MSG_FALLBACK_DATA:
        msg->u.fallback.stream_id = get_u32(body);
        msg->u.fallback.status = get_u32(body + 4);
        msg->u.fallback.data = body + 8;
        msg->u.fallback.len = body_len - 8;
        break;
    case SHMIPC__MSG_HOT_RESTART:
    case SHMIPC__MSG_HOT_RESTART_ACK:
        msg->u.hot_restart.epoch = (uint64_t)get_u32(body) << 32 | get_u32(body + 4);
        break;
    case SHMIPC__MSG_NEGOTIATION:
        msg->u.negotiation.json = body;
        msg->u.negotiation.len = body_len;
        break;
    default:
        break;
    }
    return (int)msg->h.length;
}

size_t shmipc__encode_simple(uint8_t out[SHMIPC__HEADER_SIZE], uint8_t version, uint8_t type)
{
    shmipc__header_encode(out, SHMIPC__HEADER_SIZE, version, type);
    return SHMIPC__HEADER_SIZE;
}

size_t shmipc__encode_stream_close(uint8_t out[12], uint8_t version, uint32_t stream_id)
{
    shmipc__header_encode(out, 12, version, SHMIPC__MSG_STREAM_CLOSE);
    put_u32(out + 8, stream_id);
    return 12;
}

size_t shmipc__encode_fallback_head(uint8_t out[SHMIPC__FALLBACK_HEADER_SIZE], uint8_t version,
                                    uint32_t stream_id, uint32_t status, uint32_t payload_len)
{
    shmipc__header_encode(out, SHMIPC__FALLBACK_HEADER_SIZE + payload_len, version,
                          SHMIPC__MSG_FALLBACK_DATA);
    put_u32(out + 8, stream_id);
    put_u32(out + 12, status);
    return SHMIPC__FALLBACK_HEADER_SIZE;
}

size_t shmipc__encode_hot_restart(uint8_t out[16], uint8_t version, uint8_t type, uint64_t epoch)
{
    shmipc__header_encode(out, 16, version, type);
    put_u32(out + 8, (uint32_t)(epoch >> 32));
    put_u32(out + 12, (uint32_t)epoch);
    return 16;
}

size_t shmipc__encode_share_memory(uint8_t *out, size_t cap, uint8_t version, uint8_t type,
                                   const char *queue_path, const char *buffer_path)
{
    size_t qlen = strlen(queue_path), blen = strlen(buffer_path);
    size_t total = SHMIPC__HEADER_SIZE + 2 + qlen + 2 + blen;
    if (total > cap || qlen > SHMIPC__MAX_SHM_PATH || blen > SHMIPC__MAX_SHM_PATH)
        return 0;
    shmipc__header_encode(out, (uint32_t)total, version, type);
    put_u16(out + 8, (uint16_t)qlen);
    memcpy(out + 10, queue_path, qlen);
    put_u16(out + 10 + qlen, (uint16_t)blen);
    memcpy(out + 12 + qlen, buffer_path, blen);
    return total;
}
