/*
 * Port ownership tests shared by test_server_uring.c and test_server_epoll.c (issue 18 item 5):
 * a server started on a port that another server or socket already listens on fails with
 * SHMIPC_EADDRINUSE instead of silently joining its SO_REUSEPORT group, unless it asks to
 * share (shmipc_server_config_set_reuse_port or SHMIPC_HTTP_REUSEPORT=1); a server's own
 * workers always share its port, the ephemeral one included. Include after
 * test_server_suite.h and add PORT_TESTS to the test list.
 */
#ifndef TEST_SERVER_PORT_H
#define TEST_SERVER_PORT_H

#include "test_server_suite.h"

#include "reactor/loop.h"

#include <netinet/in.h>

/* A started (not running) server on `address` (NULL: the default, 127.0.0.1) and `port` with
 * `workers` workers; 0 or the start's code. */
static int port_server_at(shmipc_server **out, const char *address, int port, unsigned workers,
                          int reuse)
{
    shmipc_server_config *cfg;
    int rc;
    CHECK(shmipc_server_config_new(&cfg));
    if (address != NULL)
        CHECK(shmipc_server_config_set_address(cfg, address));
    CHECK(shmipc_server_config_set_port(cfg, port));
    CHECK(shmipc_server_config_set_workers(cfg, workers));
    CHECK(shmipc_server_config_set_backend(cfg, suite_backend));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP, 500));
    if (reuse >= 0)
        CHECK(shmipc_server_config_set_reuse_port(cfg, reuse));
    rc = shmipc_server_new(cfg, out);
    shmipc_server_config_free(cfg);
    if (rc < 0)
        return rc;
    CHECK(shmipc_server_static(*out, NULL, "/", 200, "text/plain", "Hello, World!", 13));
    rc = shmipc_server_start(*out);
    if (rc < 0) {
        shmipc_server_close(*out);
        *out = NULL;
    }
    return rc;
}

static int port_server(shmipc_server **out, int port, unsigned workers, int reuse)
{
    return port_server_at(out, NULL, port, workers, reuse);
}

/* A raw listening socket on 127.0.0.1:port, with or without SO_REUSEPORT. */
static int raw_listener(int port, int reuseport)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), 0);
    if (reuseport)
        assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one), 0);
    if (bind(fd, (struct sockaddr *)&sin, sizeof sin) != 0)
        fail_msg("bind %d: %s", port, strerror(errno));
    assert_int_equal(listen(fd, 16), 0);
    return fd;
}

/* `n` requests on fresh connections to `port`, each answered 200. */
static void port_get(int port, int n)
{
    for (int i = 0; i < n; i++) {
        struct resp p;
        get_once(port, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", &p);
        assert_int_equal(p.status, 200);
        assert_string_equal(p.body, "Hello, World!");
        free(p.body);
    }
}

/* Regression: a second server on a port a first one serves joined its SO_REUSEPORT group and
 * took part of its connections; now the start fails with EADDRINUSE and says so. */
static void port_in_use_is_eaddrinuse(void **state)
{
    shmipc_server *a = NULL, *b = NULL;
    int port;
    (void)state;
    assert_int_equal(port_server(&a, 0, 2, -1), 0);
    port = shmipc_server_port(a);
    assert_true(port > 0);
    for (unsigned workers = 1; workers <= 2; workers++) {
        assert_int_equal(port_server(&b, port, workers, -1), SHMIPC_EADDRINUSE);
        assert_null(b);
        assert_non_null(strstr(shmipc_error_detail(), "in use"));
    }
    /* Asking for exclusive use explicitly is the same. */
    assert_int_equal(port_server(&b, port, 1, 0), SHMIPC_EADDRINUSE);
    port_get(port, 4); /* the first server is untouched */
    shmipc_server_close(a);
}

/* Any other listener counts, with or without SO_REUSEPORT (another program, a raw socket). */
static void port_in_use_by_raw_socket(void **state)
{
    shmipc_server *s = NULL;
    (void)state;
    for (int reuseport = 0; reuseport <= 1; reuseport++) {
        int fd = raw_listener(0, reuseport);
        struct sockaddr_in sin;
        socklen_t len = sizeof sin;
        assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
        assert_int_equal(port_server(&s, ntohs(sin.sin_port), 2, -1), SHMIPC_EADDRINUSE);
        assert_null(s);
        close(fd);
    }
}

/* The knob: a server that asks to share joins the other's group, and both answer. */
static void port_shared_when_asked(void **state)
{
    shmipc_server *a = NULL, *b = NULL;
    int port;
    (void)state;
    assert_int_equal(port_server(&a, 0, 2, 1), 0);
    port = shmipc_server_port(a);
    assert_int_equal(port_server(&b, port, 2, 1), 0);
    assert_int_equal(shmipc_server_port(b), port);
    port_get(port, 8);
    shmipc_server_close(a);
    port_get(port, 4); /* b alone serves the port now */
    shmipc_server_close(b);

    /* The environment knob, read at shmipc_server_new(); the config wins over it. */
    assert_int_equal(port_server(&a, 0, 1, -1), 0);
    port = shmipc_server_port(a);
    assert_int_equal(setenv("SHMIPC_HTTP_REUSEPORT", "1", 1), 0);
    assert_int_equal(port_server(&b, port, 1, -1), 0);
    shmipc_server_close(b);
    assert_int_equal(port_server(&b, port, 1, 0), SHMIPC_EADDRINUSE);
    assert_int_equal(setenv("SHMIPC_HTTP_REUSEPORT", "yes", 1), 0);
    assert_int_equal(port_server(&b, port, 1, -1), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "SHMIPC_HTTP_REUSEPORT"));
    assert_int_equal(unsetenv("SHMIPC_HTTP_REUSEPORT"), 0);
    shmipc_server_close(a);
}

/* A server's own workers share its port: a fixed port and the ephemeral one, 1 to 4 workers,
 * and the port is free again once the server is freed. */
static void port_own_workers_share(void **state)
{
    shmipc_server *s = NULL;
    int port;
    (void)state;
    assert_int_equal(port_server(&s, 0, 4, -1), 0);
    port = shmipc_server_port(s);
    port_get(port, 16);
    shmipc_server_close(s);
    for (unsigned workers = 1; workers <= 4; workers *= 2) {
        assert_int_equal(port_server(&s, port, workers, -1), 0);
        assert_int_equal(shmipc_server_port(s), port);
        port_get(port, 8);
        shmipc_server_close(s);
    }
}

/* The foreign listener that race_hook() binds between our probe and our binds. */
static struct {
    const char *address; /* numeric; "::" or "0.0.0.0" for a wildcard */
    int v6only;
    int fd;
    int calls;
} race;

/* Installed as shmipc__sock_after_probe_hook: plays a second program that binds the port with
 * SO_REUSEPORT right after our probe passed and before our workers bind. */
static void race_hook(const char *host, uint16_t port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int one = 1;
    (void)host;
    memset(&ss, 0, sizeof ss);
    if (inet_pton(AF_INET, race.address, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
        ss.ss_family = AF_INET;
        ((struct sockaddr_in *)&ss)->sin_port = htons(port);
        len = sizeof(struct sockaddr_in);
    } else {
        assert_int_equal(
            inet_pton(AF_INET6, race.address, &((struct sockaddr_in6 *)&ss)->sin6_addr), 1);
        ss.ss_family = AF_INET6;
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons(port);
        len = sizeof(struct sockaddr_in6);
    }
    race.calls++;
    race.fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(race.fd >= 0);
    assert_int_equal(setsockopt(race.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), 0);
    assert_int_equal(setsockopt(race.fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one), 0);
    if (ss.ss_family == AF_INET6)
        assert_int_equal(
            setsockopt(race.fd, IPPROTO_IPV6, IPV6_V6ONLY, &race.v6only, sizeof race.v6only), 0);
    if (bind(race.fd, (struct sockaddr *)&ss, len) != 0)
        fail_msg("race bind %s port %u: %s", race.address, (unsigned)port, strerror(errno));
    assert_int_equal(listen(race.fd, 16), 0);
}

/* A port no one listens on now (bound ephemeral, then closed). */
static int port_unused(const char *address)
{
    shmipc_server *s = NULL;
    int port;
    assert_int_equal(port_server_at(&s, address, 0, 1, -1), 0);
    port = shmipc_server_port(s);
    shmipc_server_close(s);
    return port;
}

/* One race: our server on `ours`, a foreign SO_REUSEPORT listener on `theirs` (v6only for an
 * AF_INET6 one) bound after our probe; returns our start's code. On success the server is
 * checked to serve and freed; the foreign socket is always closed. */
static int race_start(const char *ours, const char *theirs, int v6only, unsigned workers, int reuse)
{
    shmipc_server *s = NULL;
    int port = port_unused(ours);
    int rc;
    race.address = theirs;
    race.v6only = v6only;
    race.fd = -1;
    race.calls = 0;
    shmipc__sock_after_probe_hook = race_hook;
    rc = port_server_at(&s, ours, port, workers, reuse);
    shmipc__sock_after_probe_hook = NULL;
    assert_int_equal(race.calls, reuse == 1 ? 0 : 1); /* sharing skips the probe */
    if (rc == 0) {
        if (strchr(ours, ':') == NULL)
            port_get(port, 2);
        shmipc_server_close(s);
    } else {
        assert_null(s);
        assert_non_null(strstr(shmipc_error_detail(), "in use"));
    }
    if (race.fd >= 0)
        close(race.fd);
    if (rc == SHMIPC_EADDRINUSE) {
        /* Our sockets were closed on the way out: the port is free again. */
        assert_int_equal(port_server_at(&s, ours, port, workers, -1), 0);
        shmipc_server_close(s);
    }
    return rc;
}

/* Regression: the probe ran before our binds, so a program that bound the port with
 * SO_REUSEPORT in between (two servers started at the same instant) was joined silently; the
 * check after our binds now finds its socket among the port's listeners and fails the start. */
static void port_race_after_probe_is_eaddrinuse(void **state)
{
    (void)state;
    for (unsigned workers = 1; workers <= 2; workers++) {
        assert_int_equal(race_start("127.0.0.1", "127.0.0.1", 0, workers, -1), SHMIPC_EADDRINUSE);
        assert_int_equal(race_start("::1", "::1", 1, workers, -1), SHMIPC_EADDRINUSE);
    }
    /* Overlapping, not only equal, addresses count, as for the probe: an IPv4-mapped IPv6
     * listener covers its IPv4 address. (Wildcards overlap too, but tests bind loopback only.) */
    assert_int_equal(race_start("127.0.0.1", "::ffff:127.0.0.1", 0, 2, -1), SHMIPC_EADDRINUSE);
}

/* What does not overlap is not in use: another loopback address of the same family, or of the
 * other family. Asking to share still shares (and skips the probe). */
static void port_race_disjoint_or_shared_is_ok(void **state)
{
    (void)state;
    assert_int_equal(race_start("127.0.0.1", "127.0.0.2", 0, 2, -1), 0);
    assert_int_equal(race_start("::1", "127.0.0.1", 0, 2, -1), 0);
    assert_int_equal(race_start("127.0.0.1", "127.0.0.1", 0, 2, 1), 0);
}

#define PORT_TESTS                                                                                 \
    cmocka_unit_test(port_in_use_is_eaddrinuse), cmocka_unit_test(port_in_use_by_raw_socket),      \
        cmocka_unit_test(port_shared_when_asked), cmocka_unit_test(port_own_workers_share),        \
        cmocka_unit_test(port_race_after_probe_is_eaddrinuse),                                     \
        cmocka_unit_test(port_race_disjoint_or_shared_is_ok)

#endif
