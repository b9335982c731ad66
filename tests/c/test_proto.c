/*
 * Description: the control-message codec and both handshakes against the bytes captured
 * from shmipc-go (tests/vectors), plus malformed messages.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shmipc.h"
#include "ipc/proto.h"
#include "ipc/session.h"
#include "ipc/sockio.h"
#include "shm/buffer.h"
#include "shm/mapping.h"
#include "shm/queue.h"
#include "wire_vectors.h"

/* Re-encodes a parsed message with our encoders. */
static size_t reencode(const struct shmipc__msg *m, uint8_t *out, size_t cap)
{
    char q[300], b[300];
    switch (m->h.type) {
    case SHMIPC__MSG_SHARE_MEMORY_BY_PATH:
    case SHMIPC__MSG_SHARE_MEMORY_BY_MEMFD:
        memcpy(q, m->u.share.queue_path, m->u.share.queue_len);
        q[m->u.share.queue_len] = '\0';
        memcpy(b, m->u.share.buffer_path, m->u.share.buffer_len);
        b[m->u.share.buffer_len] = '\0';
        return shmipc__encode_share_memory(out, cap, m->h.version, m->h.type, q, b);
    case SHMIPC__MSG_STREAM_CLOSE:
        return shmipc__encode_stream_close(out, m->h.version, m->u.stream_close.stream_id);
    case SHMIPC__MSG_FALLBACK_DATA: {
        size_t n = shmipc__encode_fallback_head(out, m->h.version, m->u.fallback.stream_id,
                                                m->u.fallback.status, m->u.fallback.len);
        memcpy(out + n, m->u.fallback.data, m->u.fallback.len);
        return n + m->u.fallback.len;
    }
    case SHMIPC__MSG_HOT_RESTART:
    case SHMIPC__MSG_HOT_RESTART_ACK:
        return shmipc__encode_hot_restart(out, m->h.version, m->h.type, m->u.hot_restart.epoch);
    default:
        return shmipc__encode_simple(out, m->h.version, m->h.type);
    }
}

static void every_captured_message_round_trips(void **state)
{
    (void)state;
    uint8_t out[4096];
    assert_true(N_WIRE_MSGS >= 20);
    for (size_t i = 0; i < N_WIRE_MSGS; i++) {
        struct shmipc__msg m;
        const struct wire_msg *w = &wire_msgs[i];
        assert_int_equal(shmipc__msg_parse(w->bytes, w->len, &m, 0), (int)w->len);
        assert_int_equal(reencode(&m, out, sizeof out), w->len);
        assert_memory_equal(out, w->bytes, w->len);
        /* Every proper prefix is "incomplete", never an error. */
        for (size_t k = 0; k < w->len; k++)
            assert_int_equal(shmipc__msg_parse(w->bytes, k, &m, 0), 0);
    }
}

static void captured_fields(void **state)
{
    (void)state;
    struct shmipc__msg m;
    /* The V2 handshake of handshake-v2.json: queue path first, then the buffer path. */
    for (size_t i = 0; i < N_WIRE_MSGS; i++) {
        if (strcmp(wire_msgs[i].file, "handshake-v3.json") != 0 || wire_msgs[i].len < 20)
            continue;
        assert_int_equal(shmipc__msg_parse(wire_msgs[i].bytes, wire_msgs[i].len, &m, 0), 69);
        assert_int_equal(m.h.type, SHMIPC__MSG_SHARE_MEMORY_BY_MEMFD);
        assert_int_equal(m.h.version, 3);
        assert_int_equal(m.u.share.queue_len, strlen(V3_QUEUE_PATH));
        assert_memory_equal(m.u.share.queue_path, V3_QUEUE_PATH, strlen(V3_QUEUE_PATH));
        assert_memory_equal(m.u.share.buffer_path, V3_BUFFER_PATH, strlen(V3_BUFFER_PATH));
    }
    for (size_t i = 0; i < N_WIRE_MSGS; i++) {
        if (strcmp(wire_msgs[i].file, "exchange-fallback.json") != 0 || wire_msgs[i].len != 120)
            continue;
        assert_int_equal(shmipc__msg_parse(wire_msgs[i].bytes, 120, &m, 0), 120);
        assert_int_equal(m.u.fallback.stream_id, 2);
        assert_int_equal(m.u.fallback.status, 0);
        assert_int_equal(m.u.fallback.len, 104);
        /* The echo framing: u32 big-endian 100, then payload[i] = (i*7) & 0xff. */
        assert_int_equal(m.u.fallback.data[3], 100);
        assert_int_equal(m.u.fallback.data[4 + 5], 35);
    }
}

static void malformed_messages(void **state)
{
    (void)state;
    struct shmipc__msg m;
    static const struct {
        const char *what;
        uint8_t bytes[32];
        size_t len;
    } bad[] = {
        {"magic", {0, 0, 0, 8, 0x77, 0x59, 3, 1}, 8},
        {"version 0", {0, 0, 0, 8, 0x77, 0x58, 0, 1}, 8},
        {"unknown message type", {0, 0, 0, 8, 0x77, 0x58, 3, 11}, 8},
        {"Negotiation with version 3", {0, 0, 0, 12, 0x77, 0x58, 3, 10, '{', '}', ' ', ' '}, 12},
        {"Polling with length 12", {0, 0, 0, 12, 0x77, 0x58, 3, 1, 0, 0, 0, 0}, 12},
        {"StreamClose with length 8", {0, 0, 0, 8, 0x77, 0x58, 3, 2}, 8},
        {"FallbackData with length 15", {0, 0, 0, 15, 0x77, 0x58, 3, 3}, 15},
        {"exceeds the limit", {0x7f, 0, 0, 0, 0x77, 0x58, 3, 3}, 8},
        {"length 0", {0, 0, 0, 0, 0x77, 0x58, 3, 5}, 8},
        {"truncated queue path", {0, 0, 0, 14, 0x77, 0x58, 3, 5, 0, 9, 'a', 'b', 'c', 'd'}, 14},
        {"buffer path", {0, 0, 0, 16, 0x77, 0x58, 3, 5, 0, 1, 'q', 0, 5, 'b', 'b', 'b'}, 16},
        {"NUL byte", {0, 0, 0, 15, 0x77, 0x58, 3, 0, 0, 1, 'q', 0, 2, 'b', 0}, 15},
        {"path lengths", {0, 0, 0, 13, 0x77, 0x58, 3, 0, 0, 0, 0, 1, 'b'}, 13},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(shmipc__msg_parse(bad[i].bytes, bad[i].len, &m, 0), SHMIPC_EPROTO);
        if (strstr(shmipc_error_detail(), bad[i].what) == NULL)
            fail_msg("case %zu: detail \"%s\" lacks \"%s\"", i, shmipc_error_detail(), bad[i].what);
    }
    /* V4 messages carry version 0: only a caller that expects them admits it. */
    assert_int_equal(shmipc__msg_parse(bad[1].bytes, 8, &m, 1), 8);
}

/* ---- The client handshake against a scripted server replaying the captured replies ---- */

struct scripted {
    int fd;
    int rc;
    uint8_t got[3][512];
    size_t got_len[3];
    int fds[2];
};

/* The listener's abstract name, with our pid: two runs at once (a plain and a sanitizer CI
 * run side by side) must not take each other's (a fixed name failed the second's listen). */
static char proto_address[64];

static void *client_main(void *arg)
{
    shmipc_session **out = arg;
    shmipc_config *cfg;
    shmipc_config_new(&cfg);
    shmipc_config_set_path_prefix(cfg, "/dev/shm/shmipc");
    int rc = shmipc_session_connect(proto_address, cfg, out);
    shmipc_config_free(cfg);
    return (void *)(intptr_t)rc;
}

static void client_v3_handshake_matches_capture(void **state)
{
    (void)state;
    struct shmipc__addr addr;
    shmipc_session *s = NULL;
    pthread_t t;
    void *ret;
    snprintf(proto_address, sizeof proto_address, "unix:@shmipc-test-proto-%d", (int)getpid());
    assert_int_equal(shmipc__addr_parse(proto_address, &addr), 0);
    struct shmipc__unix_file file; /* none: an abstract name */
    int lfd = shmipc__sock_listen(&addr, 0600, &file);
    assert_true(lfd >= 0);
    assert_int_equal(pthread_create(&t, NULL, client_main, &s), 0);
    assert_int_equal(shmipc__fd_wait(lfd, 1 /* POLLIN */, 0), 0);
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    assert_true(fd >= 0);
    uint64_t deadline = 0;
    for (size_t i = 0; i < N_V3_STEPS; i++) {
        const struct v3_step *step = &v3_steps[i];
        if (!step->c2s) {
            assert_int_equal(shmipc__write_full(fd, step->bytes, step->len, deadline), 0);
        } else if (step->sendmsg) {
            int fds[2];
            /* Received exactly as the Go server requires: one byte, CMSG_SPACE(8) control. */
            assert_int_equal(shmipc__recv_fds(fd, fds, step->num_fds, deadline), 0);
            assert_int_equal(step->controllen, CMSG_SPACE(2 * sizeof(int)));
            struct shmipc__mapping buf, q;
            shmipc__mapping_init(&buf);
            shmipc__mapping_init(&q);
            assert_int_equal(shmipc__mapping_map_fd(&buf, fds[0], NULL), 0);
            assert_int_equal(shmipc__mapping_map_fd(&q, fds[1], NULL), 0);
            /* fds[0] is the 32 MiB buffer and fds[1] the queue pair of cap 8192. */
            assert_int_equal(buf.size, 32u << 20);
            assert_int_equal(q.size, 196656);
            struct shmipc__buffer bm;
            assert_int_equal(shmipc__buffer_attach(&bm, buf.base, buf.size), 0);
            assert_int_equal(bm.nlists, 3);
            shmipc__mapping_unmap(&buf);
            shmipc__mapping_unmap(&q);
        } else {
            uint8_t got[512];
            struct shmipc__header h;
            assert_int_equal(shmipc__read_full(fd, got, 8, deadline), 0);
            shmipc__header_decode(got, &h);
            assert_true(h.length <= sizeof got);
            assert_int_equal(shmipc__read_full(fd, got + 8, h.length - 8, deadline), 0);
            if (step->len == 8) {
                assert_int_equal(h.length, 8);
                assert_memory_equal(got, step->bytes, 8);
            } else {
                /* Same message with our own names: "<prefix>_<pid>_<n>_buffer" and so on. */
                struct shmipc__msg m, cap;
                char expect[128];
                assert_int_equal(shmipc__msg_parse(got, h.length, &m, 0), (int)h.length);
                assert_int_equal(shmipc__msg_parse(step->bytes, step->len, &cap, 0),
                                 (int)step->len);
                assert_int_equal(m.h.version, cap.h.version);
                assert_int_equal(m.h.type, cap.h.type);
                snprintf(expect, sizeof expect, "/dev/shm/shmipc_%d_", (int)getpid());
                assert_memory_equal(m.u.share.buffer_path, expect, strlen(expect));
                assert_memory_equal(m.u.share.buffer_path + m.u.share.buffer_len - 7, "_buffer", 7);
                assert_memory_equal(m.u.share.queue_path + m.u.share.queue_len - 8, "_queue_0", 8);
            }
        }
    }
    pthread_join(t, &ret);
    assert_int_equal((intptr_t)ret, 0);
    assert_int_equal(shmipc_session_version(s), 3);
    shmipc_session_close(s);
    close(fd);
    close(lfd);
}

/* ---- The server handshake against a scripted client replaying the captured requests ---- */

struct server_run {
    int fd;
    shmipc_session *s;
    int rc;
};

static void *server_main(void *arg)
{
    struct server_run *r = arg;
    r->rc = shmipc__session_accept_fd(r->fd, NULL, &r->s);
    return NULL;
}

static void server_v3_handshake_matches_capture(void **state)
{
    (void)state;
    int sv[2];
    struct server_run r = {0};
    pthread_t t;
    struct shmipc__mapping buf, q;
    struct shmipc__buffer bm;
    struct shmipc__queue_pair qp;
    shmipc_slice_class classes[] = {{8172, 50}, {32748, 30}, {131052, 20}};
    shmipc__mapping_init(&buf);
    shmipc__mapping_init(&q);
    assert_int_equal(shmipc__mapping_create_memfd(&buf, V3_BUFFER_PATH, 32u << 20), 0);
    assert_int_equal(shmipc__mapping_create_memfd(&q, V3_QUEUE_PATH, 196656), 0);
    assert_int_equal(shmipc__buffer_format(&bm, buf.base, buf.size, classes, 3), 0);
    assert_int_equal(shmipc__queue_pair_format(&qp, q.base, q.size, 8192, SHMIPC__QUEUE_LEGACY), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
    r.fd = sv[1];
    assert_int_equal(pthread_create(&t, NULL, server_main, &r), 0);
    for (size_t i = 0; i < N_V3_STEPS; i++) {
        const struct v3_step *step = &v3_steps[i];
        if (step->c2s && step->sendmsg) {
            int fds[2] = {buf.fd, q.fd};
            assert_int_equal(shmipc__send_fds(sv[0], fds, 2, 0), 0);
        } else if (step->c2s) {
            assert_int_equal(shmipc__write_full(sv[0], step->bytes, step->len, 0), 0);
        } else {
            /* Our server's replies are byte for byte the Go server's. */
            uint8_t got[64];
            assert_true(step->len <= sizeof got);
            assert_int_equal(shmipc__read_full(sv[0], got, step->len, 0), 0);
            assert_memory_equal(got, step->bytes, step->len);
        }
    }
    pthread_join(t, NULL);
    assert_int_equal(r.rc, 0);
    assert_int_equal(shmipc_session_version(r.s), 3);
    /* The server uses the second half to send and the first to receive. */
    assert_ptr_equal(r.s->qp.recv.hdr, (uint8_t *)r.s->queue_map.base);
    shmipc_session_close(r.s);
    close(sv[0]);
    shmipc__mapping_unmap(&buf);
    shmipc__mapping_unmap(&q);
}

/* Runs our server handshake on `bytes` from a scripted client; returns its result. */
static int server_handshake_on(const uint8_t *bytes, size_t len)
{
    int sv[2];
    struct server_run r = {0};
    pthread_t t;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
    r.fd = sv[1];
    assert_int_equal(shmipc__write_full(sv[0], bytes, len, 0), 0);
    shutdown(sv[0], SHUT_WR);
    assert_int_equal(pthread_create(&t, NULL, server_main, &r), 0);
    pthread_join(t, NULL);
    close(sv[0]);
    if (r.rc == 0)
        shmipc_session_close(r.s);
    return r.rc;
}

static void server_refuses_bad_handshakes(void **state)
{
    (void)state;
    static const uint8_t v1[] = {0, 0, 0, 8, 0x77, 0x58, 1, 4};
    static const uint8_t v2_wrong_first[] = {0, 0, 0, 8, 0x77, 0x58, 2, 1};
    static const uint8_t v3_then_polling[] = {0, 0, 0, 8, 0x77, 0x58, 3, 4,
                                              0, 0, 0, 8, 0x77, 0x58, 3, 1};
    static const uint8_t v3_then_eof[] = {0, 0, 0, 8, 0x77, 0x58, 3, 4};
    /* A V2 client naming files that are not its shared memory. */
    static const uint8_t v2_etc[] = {0, 0,   0,   0x1a, 0x77, 0x58, 2,   0,   0,
                                     7, '/', 'e', 't',  'c',  '/',  'x', 'y', 0,
                                     7, '/', 'e', 't',  'c',  '/',  'x', 'z'};
    assert_int_equal(server_handshake_on(v1, sizeof v1), SHMIPC_EVERSION);
    assert_int_equal(server_handshake_on(v2_wrong_first, sizeof v2_wrong_first), SHMIPC_EPROTO);
    assert_int_equal(server_handshake_on(v3_then_polling, sizeof v3_then_polling), SHMIPC_EPROTO);
    assert_int_equal(server_handshake_on(v3_then_eof, sizeof v3_then_eof), SHMIPC_ECONNRESET);
    /* Refused for where they are, before anything is looked up (test_v2_paths.c). */
    assert_int_equal(server_handshake_on(v2_etc, sizeof v2_etc), SHMIPC_EACCES);
    for (size_t i = 0; i < N_WIRE_MSGS; i++)
        if (wire_msgs[i].c2s && wire_msgs[i].len == 69 &&
            strcmp(wire_msgs[i].file, "handshake-v2.json") == 0)
            /* The captured V2 message names files of a process long gone. */
            assert_int_equal(server_handshake_on(wire_msgs[i].bytes, wire_msgs[i].len),
                             SHMIPC_ENOENT);
}

static void server_refuses_files_not_on_tmpfs(void **state)
{
    (void)state;
    char qpath[64], bpath[64];
    uint8_t msg[200];
    snprintf(qpath, sizeof qpath, "/tmp/shmipc-test-%d-q", (int)getpid());
    snprintf(bpath, sizeof bpath, "/tmp/shmipc-test-%d-b", (int)getpid());
    FILE *f = fopen(qpath, "w");
    fclose(f);
    f = fopen(bpath, "w");
    fclose(f);
    size_t n = shmipc__encode_share_memory(msg, sizeof msg, 2, 0, qpath, bpath);
    int rc = server_handshake_on(msg, n);
    unlink(qpath);
    unlink(bpath);
    /* Outside /dev/shm: refused for that (EACCES) whatever /tmp is. */
    assert_true(rc == SHMIPC_EACCES || rc == SHMIPC_EPROTO);
}

/*
 * The paths of a ShareMemory message end up in error details, which the listener logs at
 * warning level and applications print: a newline forges a log line of the peer's choosing, an
 * escape sequence reaches the operator's terminal. Control bytes are refused when the message
 * is parsed, and the detail does not echo them.
 */
static void share_paths_with_control_bytes_are_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {"/dev/shm/x\nshmipc: warn: forged line",
                                      "/dev/shm/x\x1b[2Jcleared",
                                      "/dev/shm/x\ry",
                                      "/dev/shm/x\x7f",
                                      "/dev/shm/x\xc2\x9b"
                                      "2J",
                                      "/dev/shm/x\xc2\x85"};
    uint8_t msg[300];
    struct shmipc__msg m;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int which = 0; which < 2; which++) {
            const char *q = which == 0 ? bad[i] : "/dev/shm/shmipc_1_0_queue_0";
            const char *b = which == 1 ? bad[i] : "/dev/shm/shmipc_1_0_buffer";
            size_t n = shmipc__encode_share_memory(msg, sizeof msg, 2, 0, q, b);
            assert_true(n > 0);
            assert_int_equal(shmipc__msg_parse(msg, n, &m, 0), SHMIPC_EPROTO);
            assert_int_equal(server_handshake_on(msg, n), SHMIPC_EPROTO);
            for (const char *d = shmipc_error_detail(); *d != '\0'; d++)
                if ((unsigned char)*d < 0x20 || *d == 0x7f)
                    fail_msg("detail \"%s\" carries control byte %#x", shmipc_error_detail(),
                             (unsigned)(unsigned char)*d);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_captured_message_round_trips),
        cmocka_unit_test(captured_fields),
        cmocka_unit_test(malformed_messages),
        cmocka_unit_test(client_v3_handshake_matches_capture),
        cmocka_unit_test(server_v3_handshake_matches_capture),
        cmocka_unit_test(server_refuses_bad_handshakes),
        cmocka_unit_test(server_refuses_files_not_on_tmpfs),
        cmocka_unit_test(share_paths_with_control_bytes_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
