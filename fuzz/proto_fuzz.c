/*
 * Fuzz target: the control-message decoder (core/ipc/proto.c).
 *
 * Input: byte 0 bit 0 admits version 0 (V4) headers; the rest is a stream of control
 * messages as a peer sends them on the socket. The oracles, beyond the sanitizers: a parsed
 * message never claims more bytes than it was given, every pointer it returns lies inside
 * those bytes, any shorter prefix of a message parses as "incomplete" (each prefix checked is
 * copied to a heap buffer of its exact size, so ASan sees a read past it), and re-encoding a
 * parsed message yields the bytes it was parsed from.
 */
#include "ipc/proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* True when [p, p + n) lies inside [buf, buf + len). */
static int inside(const uint8_t *buf, size_t len, const uint8_t *p, size_t n)
{
    return p >= buf && (size_t)(p - buf) <= len && n <= len - (size_t)(p - buf);
}

/* Re-encodes `m` and compares with the bytes it came from; aborts on a difference. */
static void check_round_trip(const uint8_t *buf, const struct shmipc__msg *m)
{
    uint8_t out[SHMIPC__HEADER_SIZE + 4 + 2 * (SHMIPC__MAX_SHM_PATH + 1)];
    char q[SHMIPC__MAX_SHM_PATH + 1], b[SHMIPC__MAX_SHM_PATH + 1];
    size_t n = 0;
    switch (m->h.type) {
    case SHMIPC__MSG_POLLING:
    case SHMIPC__MSG_EXCHANGE_VERSION:
    case SHMIPC__MSG_ACK_SHARE_MEMORY:
    case SHMIPC__MSG_ACK_READY_RECV_FD:
        n = shmipc__encode_simple(out, m->h.version, m->h.type);
        break;
    case SHMIPC__MSG_STREAM_CLOSE:
        n = shmipc__encode_stream_close(out, m->h.version, m->u.stream_close.stream_id);
        break;
    case SHMIPC__MSG_FALLBACK_DATA:
        n = shmipc__encode_fallback_head(out, m->h.version, m->u.fallback.stream_id,
                                         m->u.fallback.status, m->u.fallback.len);
        if (m->u.fallback.data != buf + n || m->u.fallback.len != m->h.length - n)
            abort();
        break;
    case SHMIPC__MSG_HOT_RESTART:
    case SHMIPC__MSG_HOT_RESTART_ACK:
        n = shmipc__encode_hot_restart(out, m->h.version, m->h.type, m->u.hot_restart.epoch);
        break;
    case SHMIPC__MSG_SHARE_MEMORY_BY_PATH:
    case SHMIPC__MSG_SHARE_MEMORY_BY_MEMFD:
        if (m->u.share.queue_len > SHMIPC__MAX_SHM_PATH ||
            m->u.share.buffer_len > SHMIPC__MAX_SHM_PATH)
            abort();
        memcpy(q, m->u.share.queue_path, m->u.share.queue_len);
        q[m->u.share.queue_len] = '\0';
        memcpy(b, m->u.share.buffer_path, m->u.share.buffer_len);
        b[m->u.share.buffer_len] = '\0';
        /* A NUL inside a path would make the copy shorter: the parser refuses those. */
        if (strlen(q) != m->u.share.queue_len || strlen(b) != m->u.share.buffer_len)
            abort();
        n = shmipc__encode_share_memory(out, sizeof out, m->h.version, m->h.type, q, b);
        if (n != m->h.length)
            abort();
        break;
    case SHMIPC__MSG_NEGOTIATION:
        if (m->u.negotiation.json != buf + SHMIPC__HEADER_SIZE ||
            m->u.negotiation.len != m->h.length - SHMIPC__HEADER_SIZE)
            abort();
        shmipc__header_encode(out, m->h.length, m->h.version, m->h.type);
        n = SHMIPC__HEADER_SIZE;
        break;
    default:
        abort(); /* the parser let an unknown type through */
    }
    if (n == 0 || memcmp(out, buf, n) != 0)
        abort();
}

/*
 * Parses the first `cut` bytes of a message, which must be "incomplete". They are copied to a
 * heap buffer of exactly that size, so that ASan sees a read past them: in the input the read
 * would land on the message's next byte and go unseen.
 */
static void check_prefix(const uint8_t *buf, size_t cut, int v0)
{
    struct shmipc__msg part;
    uint8_t *c = malloc(cut ? cut : 1);
    if (c == NULL)
        abort();
    memcpy(c, buf, cut);
    if (shmipc__msg_parse(c, cut, &part, v0) != 0)
        abort();
    free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int v0 = data[0] & 1;
    data++;
    size--;
    size_t pos = 0;
    while (pos < size) {
        const uint8_t *buf = data + pos;
        size_t len = size - pos;
        struct shmipc__msg m;
        int rc = shmipc__msg_parse(buf, len, &m, v0);
        if (rc <= 0)
            break;
        size_t used = (size_t)rc;
        if (shmipc__msg_type_name(m.h.type)[0] == '\0')
            abort();
        if (used > len || used != m.h.length || used < SHMIPC__HEADER_SIZE)
            abort();
        if ((m.h.type == SHMIPC__MSG_SHARE_MEMORY_BY_PATH ||
             m.h.type == SHMIPC__MSG_SHARE_MEMORY_BY_MEMFD) &&
            (!inside(buf, used, m.u.share.queue_path, m.u.share.queue_len) ||
             !inside(buf, used, m.u.share.buffer_path, m.u.share.buffer_len)))
            abort();
        if (m.h.type == SHMIPC__MSG_FALLBACK_DATA &&
            !inside(buf, used, m.u.fallback.data, m.u.fallback.len))
            abort();
        if (m.h.type == SHMIPC__MSG_NEGOTIATION &&
            !inside(buf, used, m.u.negotiation.json, m.u.negotiation.len))
            abort();
        /* Every strict prefix of a whole message is incomplete, never an error or a message:
         * those up to 16 bytes past the header (its fixed fields), and the last 16. */
        size_t head = used < SHMIPC__HEADER_SIZE + 16 ? used : SHMIPC__HEADER_SIZE + 16;
        for (size_t cut = 0; cut < head; cut++)
            check_prefix(buf, cut, v0);
        for (size_t cut = used > head + 16 ? used - 16 : head; cut < used; cut++)
            check_prefix(buf, cut, v0);
        check_round_trip(buf, &m);
        pos += used;
    }
    return 0;
}
