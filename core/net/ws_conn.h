/*
 * One server-side WebSocket connection's protocol logic without sockets (RFC 6455 §5-7):
 * bytes in, callbacks and bytes to send out. The owner is the server's connection after a
 * successful upgrade (ws_handshake.h), or the in-memory loopback of the tests.
 *
 * Input. The owner passes every received byte to shmipc__ws_conn_process(), in order, split
 * anywhere; each call uses all the bytes it is given, so the owner keeps no receive buffer
 * of its own (the reactor's transient buffer will do). Payloads are unmasked in place, so
 * the bytes must be writable, and they are garbage afterwards.
 *
 * Messages. A whole message (text or binary, reassembled from its fragments) is handed to
 * on_message. A message that arrived as one frame, whole in one call, is delivered straight
 * from the caller's buffer (unmasked in place, no copy). Otherwise its bytes gather in a
 * reassembly buffer that grows with the bytes that actually arrived (never from a declared
 * length), at most to max_message, and shrinks back once the message is delivered; they are
 * unmasked in the copy into it (one pass), or, with read_now, read straight into it.
 *
 * Output. Everything the connection sends - pongs, close frames, and the application's
 * messages (shmipc__ws_conn_send()) - goes through one queue, in order (a large message
 * sent while the queue is empty may first go straight out through the owner's write_now). The owner takes
 * bytes with shmipc__ws_conn_tx_peek(), writes them, and reports with shmipc__ws_conn_tx_sent()
 * how many went out. Peeked bytes stay where they are until they are reported sent (new
 * output gathers in a second buffer meanwhile), so they can be handed to an asynchronous
 * send (the reactor's shmipc__conn_send() with a completion callback) without a copy.
 *
 * Backpressure contract (what the server wires):
 * - shmipc__ws_conn_process() returns SHMIPC__WS_CONN_PAUSE when the queue holds tx_high_water
 *   bytes or more after the call: the server stops reading the socket (and stops calling
 *   process) until shmipc__ws_conn_tx_sent() returns 1, which it does once the queue has
 *   drained to tx_high_water / 2. TCP flow control then stops the peer, so a client that does
 *   not read cannot make the server buffer without bound.
 * - Should the owner keep feeding a paused connection, memory stays bounded anyway: pongs
 *   then replace an unsent pong at the queue's tail instead of adding one (RFC 6455 §5.5.3
 *   allows answering only the latest ping), and shmipc__ws_conn_send() refuses with
 *   SHMIPC_EAGAIN once tx_limit bytes are queued.
 * - shmipc__ws_conn_tx_queued() is the number of bytes queued, for the server's own
 *   accounting (for example the total per worker).
 *
 * Closing. On a close frame from the peer the connection echoes a close frame with the same
 * code (1000 when the frame had none), reports on_close, and process() returns
 * SHMIPC__WS_CONN_CLOSE: the server writes what is queued, then half-closes (shutdown(SHUT_WR)),
 * drains input until EOF or a timeout, and closes (RFC 6455 §7.1.1: the server closes the TCP
 * connection first). On a protocol error it sends a close frame with 1002, 1007 or 1009 and
 * does the same. After the application's shmipc__ws_conn_close() the connection ignores
 * data frames and pings until the peer's close frame arrives (then CLOSE); the server should
 * bound that wait with a timer and call shmipc__ws_conn_eof() when it gives up or the peer's
 * FIN arrives.
 *
 * The peer gone first. When the owner learns that the peer left or takes nothing more (a send
 * failed on a reset, the peer's FIN while the input was paused, a stall) before its close
 * frame was read, that frame may still wait unread behind the pause or in the socket: RFC
 * 6455 §7.1.5 makes its code the close's, even when the TCP connection ended right behind
 * it, and 1006 only a close without one. shmipc__ws_conn_peer_gone() keeps the connection
 * reading for that frame alone; the owner feeds it the input that is left, then calls
 * shmipc__ws_conn_eof().
 *
 * Threads: one owner thread per connection. Callbacks run inside shmipc__ws_conn_process()
 * (on_close also inside shmipc__ws_conn_eof()); they may call send, ping, close and the tx
 * functions of the same connection, but not process, eof or destroy.
 */
#ifndef SHMIPC_CORE_NET_WS_CONN_H
#define SHMIPC_CORE_NET_WS_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "net/ws_frame.h"

/* Defaults for a zero field of struct shmipc__ws_limits. */
#define SHMIPC__WS_DEFAULT_MAX_MESSAGE   (16ull << 20)
#define SHMIPC__WS_DEFAULT_TX_HIGH_WATER (1u << 20)
#define SHMIPC__WS_DEFAULT_TX_LIMIT      (16u << 20)
#define SHMIPC__WS_DEFAULT_BUFFER_KEEP   1024u
/* The largest max_message (and max_frame) accepted. */
#define SHMIPC__WS_LIMIT_MAX_MESSAGE (1ull << 30)
/* The largest tx_high_water and tx_limit the server accepts (its public limits). */
#define SHMIPC__WS_LIMIT_MAX_TX (1ull << 30)

/*
 * The limits of a connection; zero means the default. Shared by every connection of a
 * server (resolve once).
 * - max_message (16 MiB): a message (all its fragments) above it fails with 1009, decided at
 *   the header of the frame that would cross it, before its payload is read;
 * - max_frame (max_message): one frame's payload above it fails with 1009; at most
 *   max_message;
 * - tx_high_water (1 MiB): process() says PAUSE at or above it (see the contract above);
 * - tx_limit (16 MiB): shmipc__ws_conn_send() refuses with SHMIPC_EAGAIN at or above it; at
 *   least tx_high_water;
 * - buffer_keep (1 KiB): the reassembly and output buffers are kept between messages up to
 *   this capacity and freed when larger, so an idle connection holds at most three such
 *   buffers (and none after shmipc__ws_conn_trim()).
 */
struct shmipc__ws_limits {
    uint64_t max_message;
    uint64_t max_frame;
    size_t tx_high_water;
    size_t tx_limit;
    size_t buffer_keep;
};

/*
 * Copies `in` (NULL for all defaults) to `out` with each zero replaced by its default.
 * Returns 0, or SHMIPC_EINVAL with a detail naming the field.
 */
int shmipc__ws_limits_resolve(struct shmipc__ws_limits *out, const struct shmipc__ws_limits *in);

/*
 * What the connection reports. Every pointer is valid only during the call. All optional
 * but on_message.
 */
struct shmipc__ws_callbacks {
    /*
     * A whole message: opcode SHMIPC__WS_OP_TEXT (valid UTF-8) or SHMIPC__WS_OP_BINARY. `data` may
     * point into the buffer passed to process(). Returns 0, or a negative code to fail the
     * connection with close code 1011.
     */
    int (*on_message)(void *user_data, unsigned opcode, const char *data, size_t len);
    /* A ping; the pong carrying the same payload is already queued. */
    void (*on_ping)(void *user_data, const char *data, size_t len);
    /* A pong (solicited or not). */
    void (*on_pong)(void *user_data, const char *data, size_t len);
    /*
     * The connection is closed at the WebSocket level; called once. `code` is the peer's
     * close code (1005 when its close frame had none), the code this side sent when it failed
     * the connection (1002, 1007, 1009, 1011), or 1006 when the input ended without a close
     * frame. `reason` is the peer's reason, or what went wrong.
     */
    void (*on_close)(void *user_data, unsigned code, const char *reason, size_t len);
    /*
     * Optional: writes what the socket takes of iov[0..n) now, without blocking. Called from
     * shmipc__ws_conn_send() for a message of SHMIPC__WS_WRITE_NOW_MIN bytes or more while
     * nothing of this connection is queued, so that it leaves from the caller's memory; the
     * owner must return 0 when anything of its own is still waiting to be written (the bytes
     * would overtake it). Returns the bytes taken; 0 for none, also on a failure (the rest is
     * queued, and the owner's asynchronous send then meets the failure).
     */
    size_t (*write_now)(void *user_data, const struct iovec *iov, int n);
    /*
     * Optional: reads up to `len` bytes of input into `buf` now, without blocking. Called
     * inside shmipc__ws_conn_process() when the buffer it was given ends inside a frame
     * payload that has SHMIPC__WS_READ_NOW_MIN bytes or more still to come, so that the rest
     * lands straight in the message. The owner must return 0 whenever bytes read now could
     * overtake input it has received but not yet passed to process(). Returns the bytes read;
     * 0 when none are ready, at the end of input and on a failure (the owner's own next read
     * then meets it).
     */
    size_t (*read_now)(void *user_data, void *buf, size_t len);
};

/* The smallest message that write_now is asked to write: below it a copy costs less than the
 * extra system call (and the reactor's batching of small sends). */
#define SHMIPC__WS_WRITE_NOW_MIN (4u << 10)
/* The least payload still to come for which read_now is asked, and the most it is asked for
 * at once (the bytes are unmasked right after, while they are in cache). */
#define SHMIPC__WS_READ_NOW_MIN   (16u << 10)
#define SHMIPC__WS_READ_NOW_CHUNK (256u << 10)
/* The most read through read_now in one process() call (then the owner's loop serves others). */
#define SHMIPC__WS_READ_NOW_BUDGET (1u << 20)

/* What the owner does after shmipc__ws_conn_process(). */
enum shmipc__ws_verdict {
    SHMIPC__WS_CONN_MORE = 0,  /* write what is queued; keep reading */
    SHMIPC__WS_CONN_PAUSE = 1, /* write what is queued; stop reading until tx_sent() returns 1 */
    SHMIPC__WS_CONN_CLOSE = 2, /* write what is queued, then shutdown(SHUT_WR), drain, close */
};

/* Connection states (shmipc__ws_conn_state()). */
enum shmipc__ws_state {
    SHMIPC__WS_OPEN = 0,    /* messages flow both ways */
    SHMIPC__WS_CLOSING = 1, /* this side sent a close frame; waiting for the peer's */
    SHMIPC__WS_CLOSED = 2,  /* the close handshake is over, or the connection failed */
};

/* Flags of shmipc__ws_conn_send(). */
#define SHMIPC__WS_SEND_TRUSTED 1u /* text known to be valid UTF-8 (an echo): not checked */

/* An output buffer: bytes [off, len) of p[0..cap) are queued. */
struct shmipc__ws_buf {
    char *p;
    size_t off;
    size_t len;
    size_t cap;
};

/* Per-connection state. Owns heap buffers: shmipc__ws_conn_destroy() frees them. */
struct shmipc__ws_conn {
    struct shmipc__ws_parser parser;
    const struct shmipc__ws_limits *limits;
    const struct shmipc__ws_callbacks *cbs;
    void *user_data;
    /* The message being reassembled. */
    char *msg;
    size_t msg_len;
    size_t msg_cap;
    uint64_t msg_total; /* declared payload bytes of its frames so far */
    /* Output: the buffer handed to the owner, and the one that gathers new frames. */
    struct shmipc__ws_buf flight;
    struct shmipc__ws_buf pending;
    size_t pong_at;     /* offset in `pending` of an unsent pong at its tail, or SIZE_MAX */
    uint8_t state;      /* enum shmipc__ws_state */
    uint8_t kind;       /* what the current frame's payload is for (internal) */
    uint8_t msg_opcode; /* TEXT or BINARY while a message is in progress, else 0 */
    uint8_t msg_fin;    /* the current data frame ends its message */
    uint8_t paused;     /* process() said PAUSE and tx_sent() has not yet said resume */
    uint8_t busy;       /* inside process() or eof() */
    uint8_t gone;       /* shmipc__ws_conn_peer_gone(): only the peer's close frame counts */
    uint8_t ctrl_len;
    uint32_t utf8; /* validator state of a text message in progress */
    char ctrl[SHMIPC__WS_CONTROL_MAX];
};

/*
 * Prepares a connection. `limits` (resolved) and `cbs` are the caller's and outlive it;
 * `user_data` is passed to every callback.
 */
void shmipc__ws_conn_init(struct shmipc__ws_conn *c, const struct shmipc__ws_limits *limits,
                          const struct shmipc__ws_callbacks *cbs, void *user_data);

/* Frees the connection's buffers. No callback runs. The struct may be reused after init. */
void shmipc__ws_conn_destroy(struct shmipc__ws_conn *c);

/*
 * Runs the protocol over buf[0..len) (writable; unmasked in place), calling back for each
 * event. Uses every byte. Returns a verdict (enum shmipc__ws_verdict); once CLOSE, every
 * later call returns CLOSE and ignores its bytes. SHMIPC_EBUSY when called from a callback.
 */
int shmipc__ws_conn_process(struct shmipc__ws_conn *c, char *buf, size_t len);

/*
 * The peer is gone, or takes nothing more, and its close frame was not read yet: what is left
 * of the input is only looked through for it. Data frames, pings and pongs are skipped (no
 * on_message, no pong; a message in progress is dropped), nothing more can be queued (send,
 * ping, pong and close return SHMIPC_ECLOSED), process() never says PAUSE, and the close frame
 * is reported by on_close with its code, unanswered (nobody would read the answer). A protocol
 * error is reported as ever (1002, 1007). The owner then calls shmipc__ws_conn_eof() for a
 * connection the input did not close. Idempotent; not from a callback of this connection.
 */
void shmipc__ws_conn_peer_gone(struct shmipc__ws_conn *c);

/*
 * The input ended (the peer's FIN, a read error, or the owner's close timer) before the close
 * handshake finished: reports on_close with 1006 unless the connection is already closed.
 */
void shmipc__ws_conn_eof(struct shmipc__ws_conn *c);

/*
 * Queues one message, unfragmented: opcode SHMIPC__WS_OP_TEXT (checked to be valid UTF-8 unless
 * SHMIPC__WS_SEND_TRUSTED) or SHMIPC__WS_OP_BINARY. The bytes are copied, or written at once
 * through write_now (a message of SHMIPC__WS_WRITE_NOW_MIN bytes or more while nothing is
 * queued) with only what the socket did not take copied; either way `data` is the caller's
 * again on return. Returns 0, SHMIPC_ECLOSED once a close frame was sent or received,
 * SHMIPC_EAGAIN when tx_limit bytes are already queued, SHMIPC_EINVAL for another opcode or
 * invalid text, SHMIPC_ENOMEM.
 */
int shmipc__ws_conn_send(struct shmipc__ws_conn *c, unsigned opcode, const void *data, size_t len,
                         unsigned flags);

/* Queues a ping (at most 125 bytes of payload). Errors as shmipc__ws_conn_send(). */
int shmipc__ws_conn_ping(struct shmipc__ws_conn *c, const void *data, size_t len);
/* Queues an unsolicited pong (a heartbeat, RFC 6455 §5.5.3). Errors as ping. */
int shmipc__ws_conn_pong(struct shmipc__ws_conn *c, const void *data, size_t len);

/*
 * Starts the close handshake: queues a close frame with `code` (0 for none; else a code
 * shmipc__ws_close_code_valid() accepts) and `reason` (valid UTF-8, cut at a character
 * boundary to 123 bytes). Nothing may be sent afterwards; incoming data frames are ignored
 * until the peer's close frame, which ends the connection. Returns 0, SHMIPC_ECLOSED,
 * SHMIPC_EINVAL (code or reason), SHMIPC_ENOMEM.
 */
int shmipc__ws_conn_close(struct shmipc__ws_conn *c, unsigned code, const char *reason,
                          size_t reason_len);

/*
 * The next bytes to write: sets *data and returns their count (0 when nothing is queued).
 * They stay valid and unchanged until shmipc__ws_conn_tx_sent() reports all of them sent;
 * until then every peek returns the rest of them.
 */
size_t shmipc__ws_conn_tx_peek(struct shmipc__ws_conn *c, const char **data);

/*
 * Reports that the first `n` peeked bytes were written. Returns 1 when the connection was
 * paused and the queue has drained to tx_high_water / 2 (reading may resume), else 0.
 */
int shmipc__ws_conn_tx_sent(struct shmipc__ws_conn *c, size_t n);

/* Bytes queued for the peer (peeked but unsent, and not yet peeked). */
static inline size_t shmipc__ws_conn_tx_queued(const struct shmipc__ws_conn *c)
{
    return (c->flight.len - c->flight.off) + c->pending.len;
}

/* The connection's state (enum shmipc__ws_state). */
static inline int shmipc__ws_conn_state(const struct shmipc__ws_conn *c)
{
    return c->state;
}

/* Frees the buffers that hold nothing now (for idle connections). */
void shmipc__ws_conn_trim(struct shmipc__ws_conn *c);

#endif
