/*
 * Helpers shared by the IPC tests (sessions, listeners, managers, V4, security, chaos): unique
 * socket addresses, a client connected from a thread and accepted on a listener, short text
 * messages over a stream, and counts of what the process holds (fds, shared-memory mappings).
 *
 * Header-only: every function is static inline, so a test uses what it needs and nothing
 * else is compiled in. Include it after <cmocka.h>'s own prerequisites, like cmocka.h.
 */
#ifndef SHMIPC_TESTS_IPC_HELPERS_H
#define SHMIPC_TESTS_IPC_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shmipc.h"

/* How long the helpers wait for a handshake or a stream. */
#define IPC_WAIT_MS 5000

/* ---- Addresses ---- */

/*
 * Writes a fresh abstract socket address, "unix:@shmipc-test-TAG-PID-N", into `out`: unique
 * within the process (N counts up) and across processes (PID).
 */
static inline void ipc_pick_address(char *out, size_t size, const char *tag)
{
    static int n;
    snprintf(out, size, "unix:@shmipc-test-%s-%d-%d", tag, (int)getpid(), n++);
}

/* ---- A client connecting from a thread ---- */

/*
 * The config the helpers use where a case passes NULL: the defaults, with a handshake of
 * IPC_WAIT_MS (the library's 1 s timed out on the listener's side under TSan beside another
 * CI run). A case that passes its own config keeps its own handshake timeout. Made once, kept
 * for the process.
 */
static shmipc_config *ipc__patient_cfg;
static pthread_once_t ipc__patient_once = PTHREAD_ONCE_INIT;

static inline void ipc__patient_make(void)
{
    if (shmipc_config_new(&ipc__patient_cfg) == 0 &&
        shmipc_config_set_timeout(ipc__patient_cfg, SHMIPC_TIMEOUT_INITIALIZE, IPC_WAIT_MS) != 0) {
        shmipc_config_free(ipc__patient_cfg);
        ipc__patient_cfg = NULL;
    }
}

static inline const shmipc_config *ipc_cfg_or_patient(const shmipc_config *cfg)
{
    if (cfg != NULL)
        return cfg;
    pthread_once(&ipc__patient_once, ipc__patient_make);
    assert_non_null(ipc__patient_cfg);
    return ipc__patient_cfg;
}

/* A client session being connected on its own thread (a listener must accept it meanwhile). */
struct ipc_connector {
    const char *address;
    const shmipc_config *cfg;
    shmipc_session *s; /* the client's session once connected */
    int rc;            /* what shmipc_session_connect() returned */
    pthread_t thread;
};

static inline void *ipc__connector_main(void *arg)
{
    struct ipc_connector *c = arg;
    c->rc = shmipc_session_connect(c->address, c->cfg, &c->s);
    return NULL;
}

/* Starts connecting to `address` with `cfg` (NULL: defaults). Both must outlive the join. */
static inline void ipc_connector_start(struct ipc_connector *c, const char *address,
                                       const shmipc_config *cfg)
{
    memset(c, 0, sizeof *c);
    c->address = address;
    c->cfg = cfg;
    assert_int_equal(pthread_create(&c->thread, NULL, ipc__connector_main, c), 0);
}

/* Waits for the connecting thread; returns what connect returned (the session is in c->s). */
static inline int ipc_connector_join(struct ipc_connector *c)
{
    pthread_join(c->thread, NULL);
    return c->rc;
}

/*
 * Connects a client to listener `l` at `address` with `cfg` and accepts it: the two ends of one
 * session in this process. Fails the test unless both sides succeed.
 */
static inline void ipc_connect_accept(shmipc_listener *l, const char *address,
                                      const shmipc_config *cfg, shmipc_session **client,
                                      shmipc_session **server)
{
    struct ipc_connector c;
    ipc_connector_start(&c, address, ipc_cfg_or_patient(cfg));
    int arc = shmipc_listener_accept(l, IPC_WAIT_MS, server);
    /* Joined before any check: a failed check leaves the case, and c with it. */
    int crc = ipc_connector_join(&c);
    if (arc != 0 || crc != 0) {
        if (arc == 0)
            shmipc_session_close(*server);
        if (crc == 0)
            shmipc_session_close(c.s);
        fail_msg("connect %s: accept %d, connect %d", address, arc, crc);
    }
    *client = c.s;
}

/* A connected client and server session in this process, and the listener between them. */
struct ipc_pair {
    shmipc_session *client, *server;
    shmipc_listener *l;
};

/*
 * Listens at `address` with `listener_cfg`, connects with `client_cfg` and accepts (either
 * config may be NULL for the defaults).
 */
static inline void ipc_pair_open(struct ipc_pair *p, const char *address,
                                 const shmipc_config *listener_cfg, const shmipc_config *client_cfg)
{
    memset(p, 0, sizeof *p);
    assert_int_equal(shmipc_listener_new(address, ipc_cfg_or_patient(listener_cfg), &p->l), 0);
    ipc_connect_accept(p->l, address, client_cfg, &p->client, &p->server);
}

static inline void ipc_pair_close(struct ipc_pair *p)
{
    shmipc_session_close(p->client);
    shmipc_session_close(p->server);
    shmipc_listener_close(p->l);
}

/* ---- Text over a stream ---- */

/* Writes `text` (without its NUL) as one message. */
static inline void ipc_send_text(shmipc_stream *st, const char *text)
{
    assert_int_equal(shmipc_stream_write(st, text, strlen(text)), 0);
    assert_int_equal(shmipc_stream_flush(st), 0);
}

/* Reads exactly the bytes of `text`, checks them and releases them. */
static inline void ipc_expect_text(shmipc_stream *st, const char *text)
{
    const void *p;
    assert_int_equal(shmipc_stream_read_exact_bytes(st, strlen(text), &p, 0), 0);
    assert_memory_equal(p, text, strlen(text));
    assert_int_equal(shmipc_stream_release(st), 0);
}

/*
 * "ping" from the client stream `cs`, "pong" back from the server. The server answers on `ss`,
 * or, when `ss` is NULL, on the stream it accepts from `server`; returns the stream it used.
 */
static inline shmipc_stream *ipc_ping_pong(shmipc_session *server, shmipc_stream *cs,
                                           shmipc_stream *ss)
{
    ipc_send_text(cs, "ping");
    if (ss == NULL)
        assert_int_equal(shmipc_session_accept_stream(server, IPC_WAIT_MS, &ss), 0);
    ipc_expect_text(ss, "ping");
    ipc_send_text(ss, "pong");
    ipc_expect_text(cs, "pong");
    return ss;
}

/* ---- What the process holds ---- */

/* Entries of directory `path` (such as /proc/self/fd), its own fd included; -1 if unreadable. */
static inline int ipc_count_dir(const char *path)
{
    int n = 0;
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Open file descriptors of this process. */
static inline int ipc_count_fds(void)
{
    return ipc_count_dir("/proc/self/fd") - 1; /* the directory's own fd */
}

/* Lines of /proc/self/maps that map shared memory (memfd or /dev/shm). */
static inline int ipc_count_shm_maps(void)
{
    char line[512];
    int n = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        n += strstr(line, "/memfd:") != NULL || strstr(line, "/dev/shm/") != NULL;
    if (f != NULL)
        fclose(f);
    return n;
}

/* What a session could leak: counted before, compared after. */
struct ipc_held {
    int fds;
    int maps;
};

static inline struct ipc_held ipc_held_now(void)
{
    return (struct ipc_held){ipc_count_fds(), ipc_count_shm_maps()};
}

/* Fails unless the process holds as many fds and shared-memory mappings as in `before`. */
static inline void ipc_assert_held(const struct ipc_held *before)
{
    assert_int_equal(ipc_count_fds(), before->fds);
    assert_int_equal(ipc_count_shm_maps(), before->maps);
}

/* ---- Time ---- */

/* The monotonic clock in microseconds. */
static inline uint64_t ipc_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* The monotonic clock in milliseconds. */
static inline uint64_t ipc_now_ms(void)
{
    return ipc_now_us() / 1000u;
}

/* This process's CPU time in milliseconds. */
static inline uint64_t ipc_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#endif
