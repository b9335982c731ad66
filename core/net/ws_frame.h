/*
 * WebSocket framing (RFC 6455 §5), without sockets: an incremental frame parser that unmasks
 * payloads in place, and frame writers for both roles.
 *
 * The parser reads frame headers and walks payloads; it knows nothing of messages (the
 * connection in ws_conn.h reassembles fragments and checks text). It is fed whatever bytes
 * arrived, split anywhere, keeps at most one partial header (14 bytes) of its own, and hands
 * payload bytes back where they lie in the caller's buffer, unmasked in place. Nothing is
 * allocated: a parser is a few dozen bytes of state.
 *
 * Header checks, in the order of the bytes they need, so the verdict does not depend on how
 * the bytes were split (each fails the connection with close code 1002 unless noted):
 * 1. byte 0: RSV1-3 set (no extension is negotiated); a reserved opcode (3-7, 11-15); a
 *    control frame (close, ping, pong) without FIN;
 * 2. byte 1: the MASK bit is not what the role requires (frames from a client must be masked,
 *    frames from a server must not be); a control frame with a payload over 125 bytes;
 * 3. the extended length, once whole: the most significant bit of a 64-bit length set; a
 *    length that was not encoded in the fewest bytes (RFC 6455 §5.2: "the minimal number of
 *    bytes MUST be used"; strict, see docs/websocket.md); a length over max_frame (1009,
 *    known before one payload byte is read, so nothing is sized by the peer).
 */
#ifndef SHMIPC_CORE_NET_WS_FRAME_H
#define SHMIPC_CORE_NET_WS_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* Opcodes (RFC 6455 §5.2). */
enum shmipc__ws_opcode {
    SHMIPC__WS_OP_CONT = 0x0,
    SHMIPC__WS_OP_TEXT = 0x1,
    SHMIPC__WS_OP_BINARY = 0x2,
    SHMIPC__WS_OP_CLOSE = 0x8,
    SHMIPC__WS_OP_PING = 0x9,
    SHMIPC__WS_OP_PONG = 0xa,
};

/* Close codes (RFC 6455 §7.4.1) this layer sends or reports. */
#define SHMIPC__WS_CLOSE_NORMAL       1000
#define SHMIPC__WS_CLOSE_GOING_AWAY   1001
#define SHMIPC__WS_CLOSE_PROTOCOL     1002
#define SHMIPC__WS_CLOSE_UNSUPPORTED  1003
#define SHMIPC__WS_CLOSE_NO_STATUS    1005 /* reported only: the close frame had no code */
#define SHMIPC__WS_CLOSE_ABNORMAL     1006 /* reported only: the connection ended without one */
#define SHMIPC__WS_CLOSE_INVALID_DATA 1007
#define SHMIPC__WS_CLOSE_POLICY       1008
#define SHMIPC__WS_CLOSE_TOO_BIG      1009
#define SHMIPC__WS_CLOSE_INTERNAL     1011

/* Largest control payload, and the largest close reason (the code takes two bytes). */
#define SHMIPC__WS_CONTROL_MAX 125u
#define SHMIPC__WS_REASON_MAX  123u
/* Longest frame head: 2 bytes, an 8-byte length, a 4-byte masking key. */
#define SHMIPC__WS_HEAD_MAX 14u
/* The largest payload length the protocol can carry (the 64-bit length's top bit is 0). */
#define SHMIPC__WS_LEN_MAX 0x7fffffffffffffffull

/* Whether `opcode` is a control opcode (close, ping, pong and the reserved 0xB-0xF). */
static inline int shmipc__ws_is_control(unsigned opcode)
{
    return (opcode & 0x8) != 0;
}

/*
 * Whether a close frame may carry `code` (RFC 6455 §7.4): 1000-1003, 1007-1014 (1012-1014
 * are registered with IANA since the RFC), 3000-4999. 1004-1006 and 1015 are reserved, and
 * everything else below 3000 or above 4999 is undefined.
 */
int shmipc__ws_close_code_valid(unsigned code);

/* ---------------------------------------------------------------------------------------- */
/* Parser */

/* Which side the parser reads for: a server reads masked client frames, and vice versa. */
enum shmipc__ws_role {
    SHMIPC__WS_SERVER = 0, /* parse client frames: must be masked */
    SHMIPC__WS_CLIENT = 1, /* parse server frames: must not be masked */
};

/* A frame header. */
struct shmipc__ws_frame {
    uint64_t len; /* payload length */
    uint8_t fin;
    uint8_t rsv; /* RSV1-3 as bits 2..0 (always 0 once accepted) */
    uint8_t opcode;
    uint8_t masked;
    uint8_t key[4];
};

/* What one shmipc__ws_parse() call found. */
enum shmipc__ws_event_kind {
    SHMIPC__WS_EV_NONE = 0,  /* every byte was used; more are needed */
    SHMIPC__WS_EV_HEAD = 1,  /* a frame header is complete: frame */
    SHMIPC__WS_EV_DATA = 2,  /* payload bytes, unmasked: data[0..len); last ends the frame */
    SHMIPC__WS_EV_ERROR = 3, /* the frame is invalid: close with `code`; the parser stays failed */
};

struct shmipc__ws_event {
    int kind;
    uint16_t code;   /* ERROR: the close code (1002 or 1009) */
    uint8_t last;    /* DATA: these bytes end the frame's payload */
    const char *why; /* ERROR: what was wrong (static text) */
    char *data;      /* DATA: in the caller's buffer */
    size_t len;      /* DATA: bytes at data (0 only for an empty payload, with last) */
    uint64_t offset; /* DATA: where data starts within the payload */
    struct shmipc__ws_frame frame; /* HEAD, DATA: the current frame's header */
};

/* Per-connection parser state; zero it or call shmipc__ws_parser_init(). One owner. */
struct shmipc__ws_parser {
    uint64_t max_frame; /* payload lengths above this fail with 1009 */
    uint64_t done;      /* payload bytes of the current frame already returned */
    struct shmipc__ws_frame frame;
    uint8_t role;  /* enum shmipc__ws_role */
    uint8_t state; /* internal */
    uint8_t have;  /* header bytes gathered */
    uint8_t need;  /* header bytes the current header has (2 until byte 1 is read) */
    /* Set by the owner: DATA events hand payload bytes back still masked (the owner unmasks
     * them while copying them out, shmipc__ws_mask_copy(), or in place, shmipc__ws_mask(),
     * with the event's frame.key and offset). */
    uint8_t keep_masked;
    uint8_t head[SHMIPC__WS_HEAD_MAX];
    uint16_t code; /* after an error: its close code */
};

/* Prepares a parser for one connection. `max_frame` 0 means SHMIPC__WS_LEN_MAX. */
void shmipc__ws_parser_init(struct shmipc__ws_parser *p, enum shmipc__ws_role role,
                            uint64_t max_frame);

/*
 * Reads from buf[0..len) and reports the next event in `ev`; returns how many bytes it used.
 * Call again with the bytes after them until the event is SHMIPC__WS_EV_NONE (all bytes
 * used, more needed). Per frame the events are one HEAD, then DATA events whose lengths add
 * up to the payload length, the last one flagged `last` (one DATA of length 0 for an empty
 * payload, reported without using a byte). A DATA event returns every payload byte present
 * (up to the frame's end), so a frame that arrived whole is one DATA event with all of it.
 * Payload bytes are unmasked in place (unless keep_masked is set): `buf` must be writable, and
 * the caller must not feed the same bytes twice. After an ERROR event every call returns ERROR
 * again and uses nothing.
 */
size_t shmipc__ws_parse(struct shmipc__ws_parser *p, char *buf, size_t len,
                        struct shmipc__ws_event *ev);

/*
 * The owner read `n` payload bytes of the current frame itself, straight from the socket
 * into its own memory, after at least one DATA event of the frame: the parser moves past
 * them as if it had returned them (and expects the next header when they end the frame).
 * Returns 0, or -1 (nothing changes) when no payload is being walked or `n` goes beyond it.
 */
int shmipc__ws_parser_consumed(struct shmipc__ws_parser *p, uint64_t n);

/* Payload bytes of the current frame not yet returned (0 while reading a header). */
uint64_t shmipc__ws_parser_left(const struct shmipc__ws_parser *p);

/*
 * XORs data[0..len) with the masking key, starting `offset` bytes into the payload (so a
 * payload can be unmasked in pieces). Eight bytes per step.
 */
void shmipc__ws_mask(void *data, size_t len, const uint8_t key[4], uint64_t offset);

/* ---------------------------------------------------------------------------------------- */
/* Writers */

/*
 * Writes the head of a server frame (unmasked) into `head`; returns its length: 2, 4 or 10
 * (7-, 16- or 64-bit length, the shortest that fits, as §5.2 requires). `len` must not
 * exceed SHMIPC__WS_LEN_MAX. `fin` 0 starts or continues a fragmented message.
 */
size_t shmipc__ws_frame_head(uint8_t head[SHMIPC__WS_HEAD_MAX], int fin, unsigned opcode,
                             uint64_t len);

/*
 * Writes the head of a client frame, masked with `key` (4 bytes more: 6, 8 or 14). The
 * payload must then be masked with the same key (shmipc__ws_mask() or
 * shmipc__ws_mask_copy()). Clients must pick a fresh, unpredictable key per frame (§5.3).
 */
size_t shmipc__ws_frame_head_masked(uint8_t head[SHMIPC__WS_HEAD_MAX], int fin, unsigned opcode,
                                    uint64_t len, const uint8_t key[4]);

/*
 * Copies src[0..len) to dst masked (or unmasked: XOR is its own inverse) with `key` from
 * payload offset `offset`, in one pass: the unmasking of a received payload is fused into the
 * copy out of the receive buffer. Eight bytes per step once `dst` is word-aligned, the key
 * rotated to the offset reached there. The areas must not overlap (unless dst == src).
 */
void shmipc__ws_mask_copy(void *dst, const void *src, size_t len, const uint8_t key[4],
                          uint64_t offset);

/*
 * A whole unfragmented server frame as iovecs, [head, payload], for one vectored write with
 * no copy: the head is written into `head`, the payload is referenced (it must stay valid
 * and unchanged until written). Returns the number of iovecs: 1 for an empty payload, else 2.
 */
int shmipc__ws_frame_iov(uint8_t head[SHMIPC__WS_HEAD_MAX], unsigned opcode, const void *payload,
                         size_t len, struct iovec iov[2]);

/*
 * Writes a close payload into out[0..125): the code (big-endian) and `reason`, cut at a UTF-8
 * boundary to SHMIPC__WS_REASON_MAX bytes (`reason` must be valid UTF-8). `code` 0 means a
 * close without a code (and then without a reason): the payload is empty. Returns its length.
 */
size_t shmipc__ws_close_payload(char out[SHMIPC__WS_CONTROL_MAX], unsigned code, const char *reason,
                                size_t reason_len);

/* The longest whole control frame: a masked head (6 bytes) and 125 bytes of payload. */
#define SHMIPC__WS_CONTROL_FRAME_MAX (6u + SHMIPC__WS_CONTROL_MAX)

/*
 * Writes a whole control frame (close, ping or pong; payload at most 125 bytes) into `out`:
 * a server frame when `key` is NULL, else a client frame masked with `key`. Returns its
 * length, or 0 when the opcode is not a control opcode or the payload is too long.
 */
size_t shmipc__ws_control_frame(char out[SHMIPC__WS_CONTROL_FRAME_MAX], unsigned opcode,
                                const void *payload, size_t len, const uint8_t *key);

#endif
