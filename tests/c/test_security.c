/*
 * Description: permissions and the peer-uid allow-list: the socket file and /dev/shm files are
 * created 0600 (whatever the umask), the socket mode can be configured, and SO_PEERCRED
 * checks refuse an unlisted peer in both roles without leaking an fd or a mapping.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc_helpers.h"
#include "shmipc.h"

static char address[128];
static char abstract[128];

/* Diagnostic lines, kept so a test can check what a refusing listener logged. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[8192];

static void log_sink(int level, const char *line)
{
    (void)level;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof log_text - n, "%s\n", line);
    pthread_mutex_unlock(&log_mu);
}

static int log_contains(const char *needle)
{
    pthread_mutex_lock(&log_mu);
    int found = strstr(log_text, needle) != NULL;
    pthread_mutex_unlock(&log_mu);
    return found;
}

static void log_clear(void)
{
    pthread_mutex_lock(&log_mu);
    log_text[0] = '\0';
    pthread_mutex_unlock(&log_mu);
}

static shmipc_config *config_with_uids(const uint32_t *uids, size_t n)
{
    shmipc_config *cfg;
    assert_int_equal(shmipc_config_new(&cfg), 0);
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, 5000), 0);
    assert_int_equal(shmipc_config_set_peer_uids(cfg, uids, n), 0);
    return cfg;
}

static void test_config_peer_uids(void **state)
{
    (void)state;
    shmipc_config *cfg, *copy;
    uint32_t uids[SHMIPC_MAX_PEER_UIDS + 1], out[4];
    for (uint32_t i = 0; i <= SHMIPC_MAX_PEER_UIDS; i++)
        uids[i] = 1000 + i;
    assert_int_equal(shmipc_config_new(&cfg), 0);
    assert_int_equal(shmipc_config_get_peer_uids(cfg, NULL, 0), 0);
    assert_int_equal(shmipc_config_set_peer_uids(cfg, uids, 3), 0);
    assert_int_equal(shmipc_config_get_peer_uids(cfg, out, 2), 3);
    assert_int_equal(out[0], 1000);
    assert_int_equal(out[1], 1001);
    assert_int_equal(shmipc_config_clone(cfg, &copy), 0);
    assert_int_equal(shmipc_config_get_peer_uids(copy, out, 4), 3);
    assert_int_equal(out[2], 1002);
    shmipc_config_free(copy);

    /* Refused values name the field and leave the list as it was. */
    assert_int_equal(shmipc_config_set_peer_uids(cfg, uids, SHMIPC_MAX_PEER_UIDS + 1),
                     SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "peer_uids"));
    assert_int_equal(shmipc_config_set_peer_uids(cfg, NULL, 1), SHMIPC_EINVAL);
    uids[0] = UINT32_MAX;
    assert_int_equal(shmipc_config_set_peer_uids(cfg, uids, 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc_config_get_peer_uids(cfg, NULL, 1), SHMIPC_EINVAL);
    assert_int_equal(shmipc_config_get_peer_uids(NULL, NULL, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc_config_get_peer_uids(cfg, NULL, 0), 3);
    assert_int_equal(shmipc_config_set_peer_uids(cfg, uids + 1, SHMIPC_MAX_PEER_UIDS), 0);
    assert_int_equal(shmipc_config_get_peer_uids(cfg, NULL, 0), SHMIPC_MAX_PEER_UIDS);
    assert_int_equal(shmipc_config_set_peer_uids(cfg, NULL, 0), 0);
    assert_int_equal(shmipc_config_get_peer_uids(cfg, NULL, 0), 0);

    assert_int_equal(shmipc_config_get_socket_mode(cfg), 0600);
    assert_int_equal(shmipc_config_set_socket_mode(cfg, 01777), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "socket_mode"));
    assert_int_equal(shmipc_config_set_socket_mode(cfg, 0660), 0);
    assert_int_equal(shmipc_config_get_socket_mode(cfg), 0660);
    assert_int_equal(shmipc_config_set_socket_mode(cfg, 0), 0);
    assert_int_equal(shmipc_config_get_socket_mode(cfg), 0600);
    shmipc_config_free(cfg);
}

/* A client on its own thread: connects with `cfg`, sends one message and reads the echo. */
struct client_run {
    const char *address;
    const shmipc_config *cfg;
    int rc;
    char detail[256];
};

static void *client_main(void *arg)
{
    struct client_run *r = arg;
    shmipc_session *s;
    shmipc_stream *st;
    const void *p;
    r->rc = shmipc_session_connect(r->address, r->cfg, &s);
    snprintf(r->detail, sizeof r->detail, "%s", shmipc_error_detail());
    if (r->rc < 0)
        return NULL;
    if ((r->rc = shmipc_session_open_stream(s, &st)) == 0) {
        if ((r->rc = shmipc_stream_write(st, "hello!!!", 8)) == 0 &&
            (r->rc = shmipc_stream_flush(st)) == 0 &&
            (r->rc = shmipc_stream_read_exact_bytes(st, 8, &p, 0)) == 0)
            r->rc = memcmp(p, "hello!!!", 8) == 0 ? 0 : SHMIPC_EPROTO;
        shmipc_stream_close(st);
    }
    shmipc_session_close(s);
    return NULL;
}

/* Accepts one client on `l`, echoes its one message, and says the negotiated wakeup in
 * *wakeup (when not NULL). */
static int serve_one_wakeup(shmipc_listener *l, int timeout_ms, int *wakeup)
{
    shmipc_session *s;
    shmipc_stream *st;
    const void *p;
    int rc = shmipc_listener_accept(l, timeout_ms, &s);
    if (rc < 0)
        return rc;
    if (wakeup != NULL)
        *wakeup = shmipc_session_wakeup(s, NULL);
    if ((rc = shmipc_session_accept_stream(s, 5000, &st)) == 0) {
        if ((rc = shmipc_stream_read_exact_bytes(st, 8, &p, 0)) == 0 &&
            (rc = shmipc_stream_write(st, p, 8)) == 0)
            rc = shmipc_stream_flush(st);
        shmipc_stream_release(st);
        /* Wait for the client to hang up, so its read of the echo is not cut short. */
        (void)shmipc_stream_read_exact_bytes(st, 1, &p, 0);
        shmipc_stream_close(st);
    }
    shmipc_session_close(s);
    return rc;
}

static int serve_one(shmipc_listener *l, int timeout_ms)
{
    return serve_one_wakeup(l, timeout_ms, NULL);
}

static void test_listed_peers_talk(void **state)
{
    (void)state;
    uint32_t uids[] = {getuid() + 1, getuid()};
    shmipc_config *scfg = config_with_uids(uids, 2), *ccfg = config_with_uids(uids + 1, 1);
    shmipc_listener *l;
    pthread_t t;
    assert_int_equal(shmipc_listener_new(address, scfg, &l), 0);
    struct client_run r = {.address = address, .cfg = ccfg};
    assert_int_equal(pthread_create(&t, NULL, client_main, &r), 0);
    assert_int_equal(serve_one(l, 5000), 0);
    pthread_join(t, NULL);
    assert_int_equal(r.rc, 0);
    shmipc_listener_close(l);
    shmipc_config_free(scfg);
    shmipc_config_free(ccfg);
}

/* A listener whose list lacks our uid drops the client before reading a byte of it. */
static void test_listener_refuses_unlisted_client(void **state)
{
    (void)state;
    uint32_t other = getuid() + 1;
    shmipc_config *scfg = config_with_uids(&other, 1);
    shmipc_listener *l;
    pthread_t t;
    char want[64];
    struct ipc_held held = ipc_held_now();
    assert_int_equal(shmipc_listener_new(address, scfg, &l), 0);
    log_clear();
    struct client_run r = {.address = address, .cfg = NULL};
    assert_int_equal(pthread_create(&t, NULL, client_main, &r), 0);
    assert_int_equal(shmipc_listener_accept(l, 1000, &(shmipc_session *){NULL}), SHMIPC_ETIMEDOUT);
    pthread_join(t, NULL);
    assert_true(r.rc < 0);
    snprintf(want, sizeof want, "is uid %u, which is not in the allow-list", (unsigned)getuid());
    assert_true(log_contains("SHMIPC_EACCES"));
    assert_true(log_contains(want));
    assert_true(log_contains("the client"));
    shmipc_listener_close(l);
    ipc_assert_held(&held);
    shmipc_config_free(scfg);
}

/* A client whose list lacks the server's uid refuses it before it creates any memory. */
static void test_client_refuses_unlisted_server(void **state)
{
    (void)state;
    uint32_t other = getuid() + 1;
    shmipc_config *ccfg = config_with_uids(&other, 1);
    shmipc_session *s = NULL;
    shmipc_listener *l;
    char want[64];
    struct ipc_held held = ipc_held_now();
    assert_int_equal(shmipc_listener_new(address, NULL, &l), 0);
    for (int v4 = 0; v4 < 2; v4++) {
        if (v4)
            assert_int_equal(shmipc_config_with_v4_eventfd(ccfg), 0);
        assert_int_equal(shmipc_session_connect(address, ccfg, &s), SHMIPC_EACCES);
        snprintf(want, sizeof want, "the server (pid %ld) is uid %u", (long)getpid(),
                 (unsigned)getuid());
        assert_non_null(strstr(shmipc_error_detail(), want));
        assert_null(s);
        /* The listener sees a client that hung up: it drops it and keeps listening. */
        assert_true(shmipc_listener_accept(l, 200, &s) < 0);
    }
    shmipc_listener_close(l);
    ipc_assert_held(&held);
    shmipc_config_free(ccfg);
}

/* A TCP peer has no uid: a list and TCP do not go together. */
static void test_tcp_with_list_is_refused(void **state)
{
    (void)state;
    uint32_t me = getuid();
    shmipc_config *cfg = config_with_uids(&me, 1);
    shmipc_listener *l;
    shmipc_session *s;
    assert_int_equal(shmipc_listener_new("tcp:127.0.0.1:0", cfg, &l), SHMIPC_EINVAL);
    assert_non_null(strstr(shmipc_error_detail(), "unix socket"));
    /* A client over TCP needs /dev/shm files (memfds travel over unix sockets only). */
    assert_int_equal(shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_DEVSHM), 0);
    char tcp[64];
    int rc = SHMIPC_EADDRINUSE;
    /* No way to learn an ephemeral port from a listener: try a few fixed ones. */
    for (int i = 0; i < 20 && rc == SHMIPC_EADDRINUSE; i++) {
        snprintf(tcp, sizeof tcp, "tcp:127.0.0.1:%d", 20000 + (int)((getpid() + i * 997) % 20000));
        rc = shmipc_listener_new(tcp, NULL, &l);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(shmipc_session_connect(tcp, cfg, &s), SHMIPC_EACCES);
    assert_non_null(strstr(shmipc_error_detail(), "TCP"));
    shmipc_listener_close(l);
    shmipc_config_free(cfg);
}

/*
 * With a real second uid (root only): a process running as nobody reaches an abstract socket
 * (which has no file permissions) and is refused or accepted by the list alone.
 */
static int child_connect_as(uid_t uid, const char *addr)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct client_run r = {.address = addr, .cfg = NULL};
        if (setgid(uid) != 0 || setuid(uid) != 0)
            _exit(100);
        client_main(&r);
        _exit(r.rc == 0 ? 0 : r.rc == SHMIPC_ECONNRESET ? 1 : 2);
    }
    return pid;
}

static void test_other_uid(void **state)
{
    (void)state;
    if (getuid() != 0)
        skip();
    const uid_t nobody = 65534;
    uint32_t root_only = 0, with_nobody[] = {0, nobody};
    shmipc_config *cfg = config_with_uids(&root_only, 1);
    shmipc_listener *l;
    int status;
    char want[64];
    assert_int_equal(shmipc_listener_new(abstract, cfg, &l), 0);
    log_clear();
    pid_t pid = child_connect_as(nobody, abstract);
    assert_int_equal(shmipc_listener_accept(l, 1000, &(shmipc_session *){NULL}), SHMIPC_ETIMEDOUT);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 1); /* the connection was reset */
    snprintf(want, sizeof want, "is uid %u, which is not", (unsigned)nobody);
    assert_true(log_contains(want));
    shmipc_listener_close(l);

    assert_int_equal(shmipc_config_set_peer_uids(cfg, with_nobody, 2), 0);
    assert_int_equal(shmipc_listener_new(abstract, cfg, &l), 0);
    pid = child_connect_as(nobody, abstract);
    assert_int_equal(serve_one(l, 5000), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
    shmipc_listener_close(l);

    /* Same for the path socket: 0600 keeps nobody out before any list is consulted. */
    assert_int_equal(shmipc_listener_new(address, cfg, &l), 0);
    pid = child_connect_as(nobody, address);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 2); /* SHMIPC_EACCES from connect() */
    shmipc_listener_close(l);
    shmipc_config_free(cfg);
}

/* A V4 client asking for eventfd wakeups: its echo's result, and the negotiated wakeup. */
static int eventfd_client(const char *addr, int *wakeup)
{
    shmipc_config *cfg;
    shmipc_session *s;
    shmipc_stream *st;
    const void *p;
    int rc = shmipc_config_new(&cfg);
    if (rc < 0 || (rc = shmipc_config_with_v4_eventfd(cfg)) < 0 ||
        (rc = shmipc_session_connect(addr, cfg, &s)) < 0) {
        shmipc_config_free(cfg);
        return rc;
    }
    shmipc_config_free(cfg);
    *wakeup = shmipc_session_wakeup(s, NULL);
    if ((rc = shmipc_session_open_stream(s, &st)) == 0) {
        if ((rc = shmipc_stream_write(st, "eventfd!", 8)) == 0 &&
            (rc = shmipc_stream_flush(st)) == 0 &&
            (rc = shmipc_stream_read_exact_bytes(st, 8, &p, 0)) == 0)
            rc = memcmp(p, "eventfd!", 8) == 0 ? 0 : SHMIPC_EPROTO;
        shmipc_stream_close(st);
    }
    shmipc_session_close(s);
    return rc;
}

struct eventfd_client_run {
    const char *addr;
    int rc, wakeup;
};

static void *eventfd_client_thread(void *arg)
{
    struct eventfd_client_run *r = arg;
    r->rc = eventfd_client(r->addr, &r->wakeup);
    return NULL;
}

/* Peers of one uid negotiate eventfd wakeups (the policy below leaves them alone). */
static void test_eventfd_with_same_uid(void **state)
{
    (void)state;
    shmipc_listener *l;
    pthread_t th;
    struct eventfd_client_run r = {.addr = abstract, .rc = -1, .wakeup = -1};
    int wakeup = -1;
    assert_int_equal(shmipc_listener_new(abstract, NULL, &l), 0);
    assert_int_equal(pthread_create(&th, NULL, eventfd_client_thread, &r), 0);
    assert_int_equal(serve_one_wakeup(l, 5000, &wakeup), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(r.rc, 0);
    assert_int_equal(r.wakeup, SHMIPC_WAKEUP_EVENTFD);
    assert_int_equal(wakeup, SHMIPC_WAKEUP_EVENTFD);
    shmipc_listener_close(l);
}

/*
 * Eventfd wakeups are not used with a peer of another uid (root only: it needs one). The
 * eventfd's open file is shared: the peer can clear O_NONBLOCK on it and fill its counter,
 * and our next wakeup write then blocks for good with the session's send lock held
 * (docs/security.md). Such a peer, client or server, now gets socket wakeups, and the session
 * works; before, a nobody client and a root server (and the reverse) negotiated eventfd.
 */
static void test_eventfd_not_with_other_uid(void **state)
{
    (void)state;
    if (getuid() != 0)
        skip();
    const uid_t nobody = 65534;
    shmipc_listener *l;
    int status, wakeup = -1;

    /* A nobody client of our listener. */
    assert_int_equal(shmipc_listener_new(abstract, NULL, &l), 0);
    pid_t pid = fork();
    if (pid == 0) {
        int w = -1;
        if (setgid(nobody) != 0 || setuid(nobody) != 0)
            _exit(100);
        int rc = eventfd_client(abstract, &w);
        _exit(rc < 0 ? 101 : 10 + w);
    }
    assert_int_equal(serve_one_wakeup(l, 5000, &wakeup), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 10 + SHMIPC_WAKEUP_SOCKET);
    assert_int_equal(wakeup, SHMIPC_WAKEUP_SOCKET);
    shmipc_listener_close(l);

    /* A nobody server, and our client asking for eventfd. */
    int ready[2];
    char c;
    assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
    pid = fork();
    if (pid == 0) {
        shmipc_listener *nl;
        int w = -1;
        close(ready[0]);
        if (setgid(nobody) != 0 || setuid(nobody) != 0)
            _exit(100);
        if (shmipc_listener_new(abstract, NULL, &nl) < 0)
            _exit(102);
        if (write(ready[1], "r", 1) != 1)
            _exit(103);
        int rc = serve_one_wakeup(nl, 5000, &w);
        shmipc_listener_close(nl);
        _exit(rc < 0 ? 101 : 10 + w);
    }
    close(ready[1]);
    assert_int_equal(read(ready[0], &c, 1), 1);
    close(ready[0]);
    wakeup = -1;
    assert_int_equal(eventfd_client(abstract, &wakeup), 0);
    assert_int_equal(wakeup, SHMIPC_WAKEUP_SOCKET);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 10 + SHMIPC_WAKEUP_SOCKET);
}

/*
 * Forks a child that runs `server` (1: a listener serving one eventfd client, 0: an eventfd
 * client) as pid 1 of a new pid namespace, where our pid is not visible: SO_PEERCRED gives
 * each side pid 0 for the other, and the right uid. The child exits with 10 + the wakeup it
 * negotiated, 77 when it cannot make the namespace, 100 and up on a failure. A server child
 * writes to `ready` once it listens.
 */
static pid_t fork_in_pid_namespace(int server, int ready)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    int status;
    if (unshare(CLONE_NEWPID) != 0)
        _exit(77);
    pid_t inner = fork();
    if (inner == 0) {
        shmipc_listener *nl;
        int w = -1, rc;
        if (server) {
            if (shmipc_listener_new(abstract, NULL, &nl) < 0)
                _exit(102);
            if (write(ready, "r", 1) != 1)
                _exit(103);
            rc = serve_one_wakeup(nl, 5000, &w);
            shmipc_listener_close(nl);
        } else {
            rc = eventfd_client(abstract, &w);
        }
        _exit(rc < 0 ? 101 : 10 + w);
    }
    if (inner < 0 || waitpid(inner, &status, 0) != inner || !WIFEXITED(status))
        _exit(104);
    _exit(WEXITSTATUS(status));
}

/* Waits for the child `pid` to write its ready byte on ready[1] (closed here). False when it
 * exited 77 instead (what the test needs is not available here), which is then reaped. */
static int child_ready(int ready[2], pid_t pid)
{
    char c;
    int status;
    close(ready[1]);
    int ok = read(ready[0], &c, 1) == 1;
    close(ready[0]);
    if (!ok) {
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_int_equal(WEXITSTATUS(status), 77);
    }
    return ok;
}

/*
 * A peer of our uid in another pid namespace (a sidecar container: each container of a
 * Kubernetes pod has its own by default) gets eventfd wakeups as one in ours does. Its pid is
 * 0 to us, but the uid SO_PEERCRED gives is right, and the uid is what the policy is about.
 * The check used to take pid 0 for an untrusted peer: such sessions silently got socket
 * wakeups, in both roles.
 */
static void test_eventfd_across_pid_namespaces(void **state)
{
    (void)state;
    shmipc_listener *l;
    int status, wakeup = -1, ready[2];
    if (getuid() != 0)
        skip();

    /* A server in a new pid namespace, and our client asking for eventfd. */
    assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
    pid_t pid = fork_in_pid_namespace(1, ready[1]);
    assert_true(pid > 0);
    if (!child_ready(ready, pid))
        skip(); /* no pid namespaces here (CAP_SYS_ADMIN) */
    assert_int_equal(eventfd_client(abstract, &wakeup), 0);
    assert_int_equal(wakeup, SHMIPC_WAKEUP_EVENTFD);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 10 + SHMIPC_WAKEUP_EVENTFD);

    /* A client in a new pid namespace, and our listener. */
    assert_int_equal(shmipc_listener_new(abstract, NULL, &l), 0);
    pid = fork_in_pid_namespace(0, -1);
    assert_true(pid > 0);
    wakeup = -1;
    assert_int_equal(serve_one_wakeup(l, 5000, &wakeup), 0);
    assert_int_equal(wakeup, SHMIPC_WAKEUP_EVENTFD);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 10 + SHMIPC_WAKEUP_EVENTFD);
    shmipc_listener_close(l);
}

/*
 * In a user namespace, a peer whose uid the namespace does not map shows as the overflow uid
 * (65534): SO_PEERCRED cannot say who it is. A process there that is itself the overflow uid
 * (nobody, or a uid its namespace does not map: here a server in a new user namespace without
 * maps) took such a peer for one of its own uid and granted it eventfd wakeups. Here the
 * client is uid 2000 on the host, which the server's namespace does not map.
 */
static void test_eventfd_not_with_an_unmapped_uid(void **state)
{
    (void)state;
    const uid_t other = 2000;
    int status, ready[2], w;
    if (getuid() != 0)
        skip();
    assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
    pid_t pid = fork();
    if (pid == 0) {
        shmipc_listener *nl;
        close(ready[0]);
        if (unshare(CLONE_NEWUSER) != 0)
            _exit(77);
        if (shmipc_listener_new(abstract, NULL, &nl) < 0)
            _exit(102);
        if (write(ready[1], "r", 1) != 1)
            _exit(103);
        w = -1;
        int rc = serve_one_wakeup(nl, 5000, &w);
        shmipc_listener_close(nl);
        _exit(rc < 0 ? 101 : 10 + w);
    }
    assert_true(pid > 0);
    if (!child_ready(ready, pid))
        skip(); /* no user namespaces here */
    pid_t client = fork();
    if (client == 0) {
        w = -1;
        if (setgid(other) != 0 || setuid(other) != 0)
            _exit(100);
        int rc = eventfd_client(abstract, &w);
        _exit(rc < 0 ? 101 : 10 + w);
    }
    assert_true(client > 0);
    assert_int_equal(waitpid(client, &status, 0), client);
    assert_int_equal(WEXITSTATUS(status), 10 + SHMIPC_WAKEUP_SOCKET);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 10 + SHMIPC_WAKEUP_SOCKET);
}

static unsigned file_mode(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return st.st_mode & 07777;
}

/* 0600 whatever the umask, or what the config says. */
static void test_socket_file_mode(void **state)
{
    (void)state;
    shmipc_config *cfg;
    shmipc_listener *l;
    const char *path = address + strlen("unix:");
    mode_t old = umask(0);
    assert_int_equal(shmipc_listener_new(address, NULL, &l), 0);
    assert_int_equal(file_mode(path), 0600);
    shmipc_listener_close(l);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(shmipc_config_new(&cfg), 0);
    assert_int_equal(shmipc_config_set_socket_mode(cfg, 0660), 0);
    assert_int_equal(shmipc_listener_new(address, cfg, &l), 0);
    assert_int_equal(file_mode(path), 0660);
    shmipc_listener_close(l);
    shmipc_config_free(cfg);
    umask(old);
}

struct mode_poller {
    const char *path;
    _Atomic int stop;
    _Atomic int looser; /* a mode other than the configured one was seen */
    unsigned seen;
    long polls;
};

static void *mode_poller_main(void *arg)
{
    struct mode_poller *p = arg;
    while (!p->stop) {
        struct stat st;
        p->polls++;
        if (stat(p->path, &st) == 0 && (st.st_mode & 07777) != 0600) {
            p->looser = 1;
            p->seen = st.st_mode & 07777;
        }
    }
    return NULL;
}

/* Regression (issue 19, item 6e): the socket was bound at its final path and chmod-ed after, so
 * for a moment the file existed with the umask's mode (0777 under umask 0). Another thread polls
 * stat() while the listener is opened and closed again and again: the file must never show any
 * mode but the configured one. */
static void test_socket_never_visible_with_umask_mode(void **state)
{
    (void)state;
    struct mode_poller p = {.path = address + strlen("unix:")};
    pthread_t th;
    mode_t old = umask(0);
    assert_int_equal(pthread_create(&th, NULL, mode_poller_main, &p), 0);
    for (int i = 0; i < 400 && !p.looser; i++) {
        shmipc_listener *l;
        assert_int_equal(shmipc_listener_new(address, NULL, &l), 0);
        shmipc_listener_close(l);
    }
    p.stop = 1;
    pthread_join(th, NULL);
    umask(old);
    if (p.looser)
        fail_msg("socket file seen with mode %04o", p.seen);
}

/* Counts the /dev/shm files whose names start with `prefix` (after "/dev/shm/"); checks modes. */
static int shm_files(const char *prefix, unsigned want_mode)
{
    char path[512];
    int n = 0;
    DIR *d = opendir("/dev/shm");
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        assert_int_equal(file_mode(path), want_mode);
        n++;
    }
    closedir(d);
    return n;
}

struct v2_server {
    shmipc_listener *l;
    int rc;
};

static void *v2_server_main(void *arg)
{
    struct v2_server *v = arg;
    v->rc = serve_one(v->l, 5000);
    return NULL;
}

static void test_devshm_file_mode(void **state)
{
    (void)state;
    char prefix[64], full[80];
    shmipc_config *cfg;
    shmipc_session *s;
    shmipc_listener *l;
    pthread_t t;
    snprintf(prefix, sizeof prefix, "shmipc-sec-%ld", (long)getpid());
    snprintf(full, sizeof full, "/dev/shm/%s", prefix);
    mode_t old = umask(0);
    assert_int_equal(shmipc_config_new(&cfg), 0);
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
    assert_int_equal(shmipc_config_set_path_prefix(cfg, full), 0);
    assert_int_equal(shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_DEVSHM), 0);
    assert_int_equal(shmipc_listener_new(address, NULL, &l), 0);
    struct v2_server v = {.l = l, .rc = -1};
    assert_int_equal(pthread_create(&t, NULL, v2_server_main, &v), 0);
    assert_int_equal(shmipc_session_connect(address, cfg, &s), 0);
    assert_int_equal(shmipc_session_version(s), 2);
    assert_int_equal(shm_files(prefix, 0600), 2); /* the buffer and the queue */
    shmipc_stream *st;
    assert_int_equal(shmipc_session_open_stream(s, &st), 0);
    ipc_send_text(st, "12345678");
    ipc_expect_text(st, "12345678");
    shmipc_stream_close(st);
    shmipc_session_close(s);
    pthread_join(t, NULL);
    assert_int_equal(v.rc, 0);
    assert_int_equal(shm_files(prefix, 0600), 0);
    shmipc_listener_close(l);
    shmipc_config_free(cfg);
    umask(old);
}

int main(void)
{
    snprintf(address, sizeof address, "unix:/tmp/shmipc-test-security-%ld.sock", (long)getpid());
    snprintf(abstract, sizeof abstract, "unix:@shmipc-test-security-%ld", (long)getpid());
    signal(SIGPIPE, SIG_IGN);
    shmipc_set_log_sink(log_sink);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_peer_uids),
        cmocka_unit_test(test_listed_peers_talk),
        cmocka_unit_test(test_listener_refuses_unlisted_client),
        cmocka_unit_test(test_client_refuses_unlisted_server),
        cmocka_unit_test(test_tcp_with_list_is_refused),
        cmocka_unit_test(test_other_uid),
        cmocka_unit_test(test_eventfd_with_same_uid),
        cmocka_unit_test(test_eventfd_not_with_other_uid),
        cmocka_unit_test(test_eventfd_across_pid_namespaces),
        cmocka_unit_test(test_eventfd_not_with_an_unmapped_uid),
        cmocka_unit_test(test_socket_file_mode),
        cmocka_unit_test(test_socket_never_visible_with_umask_mode),
        cmocka_unit_test(test_devshm_file_mode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
