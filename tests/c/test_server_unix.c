/*
 * The HTTP server on unix sockets (shmipc_server_config_set_address(cfg, "unix:...")), on both
 * reactor backends: a path served by every worker thread, an abstract name, the file removed at
 * close, a stale socket file replaced, a live one refused, and the hostile paths: a regular
 * file, a symbolic link (to a file, dangling) and a directory at the path are refused with
 * SHMIPC_EEXIST and left exactly as they were; a path too long is refused at set time; a
 * socket file replaced by someone else while the server ran is not removed at close; the file
 * appears only once the server listens, and of two servers started at once on one path one wins.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "shmipc.h"
#include "unix_race.h"

static int suite_backend = SHMIPC_BACKEND_EPOLL;
static int seq;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int check_rc_ = (call);                                                                    \
        if (check_rc_ < 0)                                                                         \
            fail_msg("%s: %s: %s", #call, shmipc_errname(check_rc_), shmipc_error_detail());       \
    } while (0)

static int h_hello(shmipc_http_request *req, shmipc_http_response *res, void *ud)
{
    (void)req;
    (void)ud;
    return shmipc_http_response_body(res, "hello unix", 10);
}

/* A server on `address` (started: 0, or the start's error with the server freed). */
static int start(const char *address, unsigned workers, shmipc_server **out)
{
    shmipc_server_config *cfg;
    shmipc_server *s;
    CHECK(shmipc_server_config_new(&cfg));
    CHECK(shmipc_server_config_set_address(cfg, address));
    CHECK(shmipc_server_config_set_workers(cfg, workers));
    CHECK(shmipc_server_config_set_backend(cfg, suite_backend));
    CHECK(shmipc_server_config_set_timeout(cfg, SHMIPC_SERVER_TIMEOUT_STOP, 2000));
    CHECK(shmipc_server_new(cfg, &s));
    shmipc_server_config_free(cfg);
    CHECK(shmipc_server_route(s, "GET", "/hello", h_hello, NULL, NULL));
    int rc = shmipc_server_start(s);
    if (rc < 0) {
        shmipc_server_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

static int unix_connect(const char *address)
{
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    const char *p = address + 5;
    socklen_t len;
    if (p[0] == '@') {
        memcpy(un.sun_path + 1, p + 1, strlen(p + 1));
        len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(p));
    } else {
        memcpy(un.sun_path, p, strlen(p));
        len = sizeof un;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&un, len) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

/* One GET /hello on a new connection: the body matches. */
static void get_hello(const char *address)
{
    char buf[1024];
    size_t n = 0;
    int fd = unix_connect(address);
    assert_true(fd >= 0);
    static const char req[] = "GET /hello HTTP/1.1\r\nHost: u\r\nConnection: close\r\n\r\n";
    assert_int_equal(send(fd, req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)(sizeof req - 1));
    for (;;) {
        ssize_t k = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    buf[n] = '\0';
    close(fd);
    assert_memory_equal(buf, "HTTP/1.1 200", 12);
    assert_non_null(strstr(buf, "\r\n\r\nhello unix"));
}

static void tmp_path(char *out, size_t cap, const char *what)
{
    snprintf(out, cap, "/tmp/shmipc-http-unix-%d-%d-%s", (int)getpid(), seq++, what);
    unlink(out);
}

static int is_socket(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* A path: every one of 3 worker threads takes connections; the file is a socket while the
 * server runs, with the umask's mode, and gone after close; the port is 0. */
static void serve_unix_path(void **state)
{
    char path[128], addr[160];
    shmipc_server *s;
    (void)state;
    tmp_path(path, sizeof path, "s.sock");
    snprintf(addr, sizeof addr, "unix:%s", path);
    mode_t old = umask(0077);
    int rc = start(addr, 3, &s);
    umask(old);
    CHECK(rc);
    assert_true(is_socket(path));
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(shmipc_server_port(s), 0);
    for (int i = 0; i < 30; i++)
        get_hello(addr);
    shmipc_server_close(s);
    assert_false(is_socket(path));
    assert_int_equal(access(path, F_OK), -1);
    /* A second server on the same path after the first closed: the path is free again. */
    CHECK(start(addr, 1, &s));
    get_hello(addr);
    shmipc_server_close(s);
    assert_int_equal(access(path, F_OK), -1);
}

static void serve_abstract(void **state)
{
    char addr[128];
    shmipc_server *s, *s2 = NULL;
    (void)state;
    snprintf(addr, sizeof addr, "unix:@shmipc-http-unix-%d-%d", (int)getpid(), seq++);
    CHECK(start(addr, 2, &s));
    for (int i = 0; i < 10; i++)
        get_hello(addr);
    /* a second server on the same name: in use */
    assert_int_equal(start(addr, 1, &s2), SHMIPC_EADDRINUSE);
    shmipc_server_close(s);
    /* the name is free once closed */
    assert_true(unix_connect(addr) < 0);
    CHECK(start(addr, 1, &s));
    get_hello(addr);
    shmipc_server_close(s);
}

/* A socket file left by a server that died (bound, never unlinked) is replaced. */
static void stale_socket_replaced(void **state)
{
    char path[128], addr[160];
    shmipc_server *s;
    (void)state;
    tmp_path(path, sizeof path, "stale.sock");
    snprintf(addr, sizeof addr, "unix:%s", path);
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    memcpy(un.sun_path, path, strlen(path));
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&un, sizeof un), 0);
    close(fd); /* the file stays: a stale socket */
    assert_true(is_socket(path));
    CHECK(start(addr, 2, &s));
    get_hello(addr);
    shmipc_server_close(s);
    assert_int_equal(access(path, F_OK), -1);
}

/* A socket something listens on is in use: refused, and the other listener still works. */
static void live_socket_refused(void **state)
{
    char path[128], addr[160];
    shmipc_server *s, *other;
    (void)state;
    tmp_path(path, sizeof path, "live.sock");
    snprintf(addr, sizeof addr, "unix:%s", path);
    CHECK(start(addr, 1, &other));
    assert_int_equal(start(addr, 1, &s), SHMIPC_EADDRINUSE);
    assert_non_null(strstr(shmipc_error_detail(), "already accepts"));
    get_hello(addr);
    shmipc_server_close(other);
    assert_int_equal(access(path, F_OK), -1);
}

static int server_open(const char *addr, void **out)
{
    return start(addr, 1, (shmipc_server **)out);
}

static void server_close(void *s)
{
    shmipc_server_close(s);
}

static const struct unix_race_ops server_ops = {server_open, server_close};

/* The socket file appears only once the server listens: a client that sees it and connects at
 * once is never refused (it was bound at its path, then made to listen). */
static void socket_file_appears_only_when_listening(void **state)
{
    char path[128];
    (void)state;
    tmp_path(path, sizeof path, "appear.sock");
    unix_race_appear(path, &server_ops, 400);
}

/* Two servers started at once on one path: one gets it, the other SHMIPC_EADDRINUSE. The
 * second's "is the file stale?" probe used to find the first's socket still refusing (bound,
 * not yet listening), remove it and bind its own: both started, the first unreachable. */
static void two_servers_racing_for_a_path_one_wins(void **state)
{
    char path[128];
    (void)state;
    tmp_path(path, sizeof path, "race.sock");
    unix_race_two(path, &server_ops, 400);
}

/* A live listener whose backlog is full (it accepts nothing): the start says "in use" at once
 * rather than waiting in a blocking connect for the backlog to drain. */
static void busy_live_socket_refused_without_waiting(void **state)
{
    char path[128], addr[160];
    shmipc_server *s;
    int fill[16], nfill = 0;
    (void)state;
    tmp_path(path, sizeof path, "busy.sock");
    snprintf(addr, sizeof addr, "unix:%s", path);
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    memcpy(un.sun_path, path, strlen(path));
    int l = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(bind(l, (struct sockaddr *)&un, sizeof un), 0);
    assert_int_equal(listen(l, 0), 0);
    for (; nfill < 16; nfill++) { /* until the backlog refuses one */
        fill[nfill] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (connect(fill[nfill], (struct sockaddr *)&un, sizeof un) < 0) {
            assert_int_equal(errno, EAGAIN);
            nfill++;
            break;
        }
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(start(addr, 1, &s), SHMIPC_EADDRINUSE);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* not a speed check: a blocking connect would wait here until the test's timeout */
    assert_true(t1.tv_sec - t0.tv_sec < 60);
    assert_true(is_socket(path));
    for (int i = 0; i < nfill; i++)
        close(fill[i]);
    close(l);
    unlink(path);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void assert_file(const char *path, const char *text)
{
    char buf[256] = {0};
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    assert_string_equal(buf, text);
}

/* Anything but a socket at the path is refused with SHMIPC_EEXIST and left exactly as it
 * was: a regular file, a symbolic link to a file (neither the link nor its target goes), a
 * dangling link, a directory. */
static void not_a_socket_refused_and_kept(void **state)
{
    char path[128], addr[160], target[128];
    shmipc_server *s = NULL;
    struct stat st;
    (void)state;
    tmp_path(path, sizeof path, "file");
    snprintf(addr, sizeof addr, "unix:%s", path);
    write_file(path, "precious\n");
    assert_int_equal(start(addr, 2, &s), SHMIPC_EEXIST);
    assert_non_null(strstr(shmipc_error_detail(), "a regular file"));
    assert_file(path, "precious\n");
    unlink(path);

    tmp_path(target, sizeof target, "target");
    write_file(target, "the link's target\n");
    assert_int_equal(symlink(target, path), 0);
    assert_int_equal(start(addr, 1, &s), SHMIPC_EEXIST);
    assert_non_null(strstr(shmipc_error_detail(), "a symbolic link"));
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_file(target, "the link's target\n");
    unlink(target); /* dangling now */
    assert_int_equal(start(addr, 1, &s), SHMIPC_EEXIST);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    unlink(path);

    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(start(addr, 1, &s), SHMIPC_EEXIST);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    rmdir(path);
}

/* The name's limits, at set time: 107 bytes is the most sun_path holds (with its NUL; an
 * abstract name has the leading NUL instead). */
static void address_limits(void **state)
{
    shmipc_server_config *cfg;
    char addr[300];
    (void)state;
    CHECK(shmipc_server_config_new(&cfg));
    assert_int_equal(shmipc_server_config_set_address(cfg, "unix:"), SHMIPC_EINVAL);
    assert_int_equal(shmipc_server_config_set_address(cfg, "unix:@"), SHMIPC_EINVAL);
    strcpy(addr, "unix:/");
    memset(addr + 6, 'p', 106);
    addr[112] = '\0'; /* a 107-byte path */
    CHECK(shmipc_server_config_set_address(cfg, addr));
    strcat(addr, "p"); /* 108 */
    assert_int_equal(shmipc_server_config_set_address(cfg, addr), SHMIPC_ENAMETOOLONG);
    assert_non_null(strstr(shmipc_error_detail(), "at most 107"));
    strcpy(addr, "unix:@");
    memset(addr + 6, 'n', 107);
    addr[113] = '\0';
    CHECK(shmipc_server_config_set_address(cfg, addr));
    strcat(addr, "n");
    assert_int_equal(shmipc_server_config_set_address(cfg, addr), SHMIPC_ENAMETOOLONG);
    /* past the address limit altogether */
    memset(addr, 'x', sizeof addr - 1);
    addr[sizeof addr - 1] = '\0';
    memcpy(addr, "unix:/", 6);
    assert_int_equal(shmipc_server_config_set_address(cfg, addr), SHMIPC_EINVAL);
    /* a refused value left the config as it was: the 107-byte abstract name */
    shmipc_server_config_free(cfg);

    /* a path in a directory that does not exist: the start says so */
    shmipc_server *s;
    char path[128];
    tmp_path(path, sizeof path, "nodir");
    snprintf(addr, sizeof addr, "unix:%s/s.sock", path);
    assert_int_equal(start(addr, 1, &s), SHMIPC_ENOENT);
}

/* Someone removes the server's socket file and puts a file of theirs there while the server
 * runs: the close removes only what the server made. */
static void replaced_file_not_removed_at_close(void **state)
{
    char path[128], addr[160];
    shmipc_server *s;
    (void)state;
    tmp_path(path, sizeof path, "taken.sock");
    snprintf(addr, sizeof addr, "unix:%s", path);
    CHECK(start(addr, 2, &s));
    get_hello(addr);
    assert_int_equal(unlink(path), 0);
    write_file(path, "someone else's\n");
    shmipc_server_close(s);
    assert_file(path, "someone else's\n");
    unlink(path);
}

#define UNIX_TESTS                                                                                 \
    cmocka_unit_test(serve_unix_path), cmocka_unit_test(serve_abstract),                           \
        cmocka_unit_test(stale_socket_replaced), cmocka_unit_test(live_socket_refused),            \
        cmocka_unit_test(busy_live_socket_refused_without_waiting),                                \
        cmocka_unit_test(not_a_socket_refused_and_kept),                                           \
        cmocka_unit_test(replaced_file_not_removed_at_close),                                      \
        cmocka_unit_test(socket_file_appears_only_when_listening),                                 \
        cmocka_unit_test(two_servers_racing_for_a_path_one_wins)

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(address_limits), UNIX_TESTS};
    const struct CMUnitTest tests_uring[] = {UNIX_TESTS};
    int rc;
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    unsetenv("SHMIPC_REACTOR_BACKEND");
    suite_backend = SHMIPC_BACKEND_EPOLL;
    rc = cmocka_run_group_tests_name("server_unix_epoll", tests, NULL, NULL);
    suite_backend = SHMIPC_BACKEND_AUTO; /* io_uring where the kernel has it */
    rc |= cmocka_run_group_tests_name("server_unix_uring", tests_uring, NULL, NULL);
    return rc != 0;
}
