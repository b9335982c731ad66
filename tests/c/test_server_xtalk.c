/*
 * Description: no response reaches another client (issue 18, item 1). A server with 2 and
 * with 4 workers, on io_uring and on epoll, answers many short connections from client
 * threads; each request names a unique path, which the handler echoes in the body, and each
 * reading client checks that it got exactly its own answers and nothing else. A quarter of
 * the connections are abandoned right after the request (closed; another quarter reset with
 * SO_LINGER 0), so that the server closes connections while their responses are still queued,
 * and other workers accept new connections that take the closed fd numbers at once: on
 * io_uring, a send or receive SQE still naming such a number then reached the new client.
 * Bounded by XT_CONNS connections per thread and XT_MS per run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "shmipc.h"

#define XT_THREADS 16
#define XT_CONNS   4000 /* per client thread and run, at most */
#define XT_MS      1500 /* per run, at most */

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int check_rc_ = (call);                                                                    \
        if (check_rc_ < 0)                                                                         \
            fail_msg("%s: %s: %s", #call, shmipc_errname(check_rc_), shmipc_error_detail());       \
    } while (0)

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The body is the request's path, so a response names the request it answers. */
static int h_path(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    size_t len;
    const char *path = shmipc_http_request_path(req, &len);
    (void)ud;
    return shmipc_http_response_body(res, path, len);
}

struct run {
    int port;
    uint64_t deadline_ms;
    atomic_uint_fast64_t conns, answered, mismatched, lost, refused;
    pthread_mutex_t lock;
    char first_mismatch[256];
};

struct client {
    struct run *run;
    unsigned id;
};

static void note_mismatch(struct run *r, const char *want, const char *got, size_t got_len)
{
    atomic_fetch_add(&r->mismatched, 1);
    pthread_mutex_lock(&r->lock);
    if (r->first_mismatch[0] == '\0')
        snprintf(r->first_mismatch, sizeof r->first_mismatch, "asked %s, got %.*s", want,
                 (int)(got_len > 120 ? 120 : got_len), got);
    pthread_mutex_unlock(&r->lock);
}

static int write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/*
 * Reads the answers to the `n` requests of paths[], in order, and then makes sure nothing
 * else is on the way (a foreign response behind ours). Returns 0, or -1 when the connection
 * ended or timed out first (counted as lost).
 */
static int read_answers(struct run *r, int fd, char paths[][64], int n)
{
    char buf[4096];
    size_t have = 0;
    for (int k = 0; k < n; k++) {
        char *end, *cl;
        size_t head, body;
        for (;;) {
            end = have ? memmem(buf, have, "\r\n\r\n", 4) : NULL;
            if (end != NULL)
                break;
            ssize_t got = have < sizeof buf ? recv(fd, buf + have, sizeof buf - have, 0) : -1;
            if (got <= 0)
                return -1;
            have += (size_t)got;
        }
        head = (size_t)(end - buf) + 4;
        *end = '\0';
        cl = strcasestr(buf, "\r\nContent-Length:");
        if (strncmp(buf, "HTTP/1.1 200 ", 13) != 0 || cl == NULL) {
            note_mismatch(r, paths[k], buf, head);
            return 0;
        }
        body = strtoul(cl + 17, NULL, 10);
        if (body > sizeof buf - head) {
            note_mismatch(r, paths[k], buf, head);
            return 0;
        }
        while (have < head + body) {
            ssize_t got = recv(fd, buf + have, sizeof buf - have, 0);
            if (got <= 0)
                return -1;
            have += (size_t)got;
        }
        if (body != strlen(paths[k]) || memcmp(buf + head, paths[k], body) != 0)
            note_mismatch(r, paths[k], buf + head, body);
        else
            atomic_fetch_add(&r->answered, 1);
        memmove(buf, buf + head + body, have - head - body);
        have -= head + body;
    }
    if (have == 0) {
        /* A foreign response sent before ours would have been read above; one sent after
         * it usually is here by now. */
        ssize_t got = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (got > 0)
            have = (size_t)got;
    }
    if (have > 0)
        note_mismatch(r, "nothing more", buf, have);
    return 0;
}

static void *client_main(void *arg)
{
    const struct client *cl = arg;
    struct run *r = cl->run;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)r->port)};
    struct timeval tv = {.tv_sec = 2};
    struct linger reset = {.l_onoff = 1, .l_linger = 0};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (unsigned i = 0; i < XT_CONNS && mono_ms() < r->deadline_ms; i++) {
        char paths[2][64];
        char req[256];
        size_t len = 0;
        int mode = (int)((i + cl->id) % 4), n = mode == 1 ? 2 : 1;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0) {
            atomic_fetch_add(&r->refused, 1);
            if (fd >= 0)
                close(fd);
            continue;
        }
        atomic_fetch_add(&r->conns, 1);
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        /* Mode 1 pipelines two requests in one write. */
        for (int k = 0; k < n; k++) {
            snprintf(paths[k], sizeof paths[k], "/x/%u-%u-%d", cl->id, i, k);
            len += (size_t)snprintf(req + len, sizeof req - len,
                                    "GET %s HTTP/1.1\r\nHost: t\r\n\r\n", paths[k]);
        }
        if (write_all(fd, req, len) < 0) {
            atomic_fetch_add(&r->refused, 1);
        } else if (mode == 2) {
            /* Abandoned: the server reads the request, then the FIN. */
        } else if (mode == 3) {
            /* Abandoned with a reset: the server's receive fails while its answer waits. */
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
        } else if (read_answers(r, fd, paths, n) < 0) {
            atomic_fetch_add(&r->lost, 1);
        }
        close(fd);
    }
    return NULL;
}

static void xtalk(int backend, unsigned workers)
{
    shmipc_server_config *cfg;
    shmipc_server *s;
    struct run r;
    struct client cl[XT_THREADS];
    pthread_t th[XT_THREADS];
    int rc;

    CHECK(shmipc_server_config_new(&cfg));
    CHECK(shmipc_server_config_set_port(cfg, 0));
    CHECK(shmipc_server_config_set_workers(cfg, (int)workers));
    CHECK(shmipc_server_config_set_backend(cfg, backend));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP, 2000));
    CHECK(shmipc_server_new(cfg, &s));
    shmipc_server_config_free(cfg);
    CHECK(shmipc_server_route(s, "GET", "/x/*", h_path, NULL, NULL));
    rc = shmipc_server_start(s);
    if (rc == SHMIPC_ENOTSUP && backend == SHMIPC_BACKEND_IO_URING) {
        shmipc_server_close(s);
        skip();
    }
    CHECK(rc);

    memset(&r, 0, sizeof r);
    pthread_mutex_init(&r.lock, NULL);
    r.port = shmipc_server_port(s);
    r.deadline_ms = mono_ms() + XT_MS;
    for (unsigned i = 0; i < XT_THREADS; i++) {
        cl[i].run = &r;
        cl[i].id = i;
        assert_int_equal(pthread_create(&th[i], NULL, client_main, &cl[i]), 0);
    }
    for (unsigned i = 0; i < XT_THREADS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    CHECK(shmipc_server_stop(s));
    shmipc_server_close(s);
    pthread_mutex_destroy(&r.lock);

    print_message("%s, %u workers: %llu connections, %llu answers checked, %llu mismatched, "
                  "%llu lost, %llu refused%s%s\n",
                  backend == SHMIPC_BACKEND_IO_URING ? "io_uring" : "epoll", workers,
                  (unsigned long long)r.conns, (unsigned long long)r.answered,
                  (unsigned long long)r.mismatched, (unsigned long long)r.lost,
                  (unsigned long long)r.refused, r.first_mismatch[0] ? ": first: " : "",
                  r.first_mismatch);
    /* Enough answers to have tried reuse many times, and not a run where most connections
     * were refused (which would check little and could hide a broken server). */
    assert_true(r.answered >= 100);
    assert_true(r.refused * 4 <= r.conns);
    assert_int_equal(r.mismatched, 0);
    assert_int_equal(r.lost, 0);
}

static void xtalk_uring_2_workers(void **state)
{
    (void)state;
    xtalk(SHMIPC_BACKEND_IO_URING, 2);
}

static void xtalk_uring_4_workers(void **state)
{
    (void)state;
    xtalk(SHMIPC_BACKEND_IO_URING, 4);
}

static void xtalk_epoll_2_workers(void **state)
{
    (void)state;
    xtalk(SHMIPC_BACKEND_EPOLL, 2);
}

static void xtalk_epoll_4_workers(void **state)
{
    (void)state;
    xtalk(SHMIPC_BACKEND_EPOLL, 4);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(xtalk_uring_2_workers),
        cmocka_unit_test(xtalk_uring_4_workers),
        cmocka_unit_test(xtalk_epoll_2_workers),
        cmocka_unit_test(xtalk_epoll_4_workers),
    };
    struct rlimit rl;

    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096 && rl.rlim_max >= 4096) {
        rl.rlim_cur = 4096;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    unsetenv("SHMIPC_REACTOR_BACKEND");
    return cmocka_run_group_tests_name("server_xtalk", tests, NULL, NULL) != 0;
}
