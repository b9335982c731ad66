/*
 * The control-message codec of the shmipc socket protocol (reference §1.1, §1.2). Headers
 * are 8 bytes, big-endian: u32 length (header included), u16 magic 0x7758, u8 version,
 * u8 type. Everything here works on caller buffers; nothing allocates.
 */
#ifndef SHMIPC_CORE_IPC_PROTO_H
#define SHMIPC_CORE_IPC_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define SHMIPC__HEADER_SIZE          8u
#define SHMIPC__MAGIC                0x7758u
#define SHMIPC__FALLBACK_HEADER_SIZE 16u

/*
 * Largest message we accept. The reference puts no bound on FallbackData, but a peer must not
 * make us buffer gigabytes: a fallback message carries one flush, and writers split large
 * writes (docs/protocol.md).
 */
#define SHMIPC__MAX_MESSAGE (64u << 20)
/* Longest path in a ShareMemory message: the reference's limit on a path is 255 bytes. */
#define SHMIPC__MAX_SHM_PATH 255u

enum shmipc__msg_type {
    SHMIPC__MSG_SHARE_MEMORY_BY_PATH = 0,
    SHMIPC__MSG_POLLING = 1,
    SHMIPC__MSG_STREAM_CLOSE = 2,
    SHMIPC__MSG_FALLBACK_DATA = 3,
    SHMIPC__MSG_EXCHANGE_VERSION = 4,
    SHMIPC__MSG_SHARE_MEMORY_BY_MEMFD = 5,
    SHMIPC__MSG_ACK_SHARE_MEMORY = 6,
    SHMIPC__MSG_ACK_READY_RECV_FD = 7,
    SHMIPC__MSG_HOT_RESTART = 8,
    SHMIPC__MSG_HOT_RESTART_ACK = 9,
    /* Ours for V4 (docs/protocol.md): a JSON body, only with version byte 0. */
    SHMIPC__MSG_NEGOTIATION = 10,
    SHMIPC__MSG_TYPE_MAX = 10,
};

/* Largest negotiation message we send or accept. */
#define SHMIPC__MAX_NEGOTIATION 65536u

struct shmipc__header {
    uint32_t length;
    uint16_t magic;
    uint8_t version;
    uint8_t type;
};

/* A decoded message; pointers point into the buffer that was parsed. */
struct shmipc__msg {
    struct shmipc__header h;
    union {
        struct {
            const uint8_t *queue_path, *buffer_path;
            uint16_t queue_len, buffer_len;
        } share; /* types 0 and 5 */
        struct {
            uint32_t stream_id;
        } stream_close; /* type 2 */
        struct {
            uint32_t stream_id;
            uint32_t status; /* only the low byte carries the stream state */
            const uint8_t *data;
            uint32_t len;
        } fallback; /* type 3 */
        struct {
            uint64_t epoch;
        } hot_restart; /* types 8 and 9 */
        struct {
            const uint8_t *json;
            uint32_t len;
        } negotiation; /* type 10 */
    } u;
};

const char *shmipc__msg_type_name(unsigned type);

void shmipc__header_encode(uint8_t out[SHMIPC__HEADER_SIZE], uint32_t length, uint8_t version,
                           uint8_t type);
void shmipc__header_decode(const uint8_t in[SHMIPC__HEADER_SIZE], struct shmipc__header *h);

/*
 * Checks a header as the reference's checkEventValid does (magic, non-zero version, known
 * type) and, beyond it, that the length fits the type: exact for fixed-size messages,
 * bounded by SHMIPC__MAX_MESSAGE for the others. Returns 0 or SHMIPC_EPROTO with a detail.
 * `allow_version0` admits version 0, which only V4 messages carry.
 */
int shmipc__header_check(const struct shmipc__header *h, int allow_version0);

/*
 * Parses one message from buf[0..len). Returns the bytes it takes (> 0), 0 when the buffer
 * holds only part of it (read more), or SHMIPC_EPROTO for a malformed message.
 */
int shmipc__msg_parse(const uint8_t *buf, size_t len, struct shmipc__msg *msg, int allow_version0);

/* Encoders. Each returns the message length written to `out` (which must be large enough). */
size_t shmipc__encode_simple(uint8_t out[SHMIPC__HEADER_SIZE], uint8_t version, uint8_t type);
size_t shmipc__encode_stream_close(uint8_t out[12], uint8_t version, uint32_t stream_id);
/* Only the 16-byte head of a FallbackData message; the payload follows it on the wire. */
size_t shmipc__encode_fallback_head(uint8_t out[SHMIPC__FALLBACK_HEADER_SIZE], uint8_t version,
                                    uint32_t stream_id, uint32_t status, uint32_t payload_len);
size_t shmipc__encode_hot_restart(uint8_t out[16], uint8_t version, uint8_t type, uint64_t epoch);
/* ShareMemoryByFilePath (0) or ByMemfd (5): u16 qlen, queue path, u16 blen, buffer path. */
size_t shmipc__encode_share_memory(uint8_t *out, size_t cap, uint8_t version, uint8_t type,
                                   const char *queue_path, const char *buffer_path);

#endif
