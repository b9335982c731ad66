/*
 * cc -O2 -D_GNU_SOURCE -Icore -Ibindings core/reactor/ka_probe.c build/bindings/libshmipc_bindings.a \
 *    build/core/libshmipc_core.a -luring -lpthread -o ka_probe
 *
 * Measures what the reactor costs per keep-alive request (docs/reactor.md):
 *   ka_probe serve PORT REQUESTS   answers "GET ..." requests (pipelined too) with a fixed
 *                                  200 response on one loop; exits after REQUESTS answers and
 *                                  prints the loop's counters
 *   ka_probe client PORT CONNS N   CONNS connections, each sending N requests in lockstep
 * Run the server under `strace -f -c` to count its system calls; SHMIPC_REACTOR_BACKEND and
 * SHMIPC_RX_EPOLL choose the backend and the epoll mode. Not built by meson: a tool, not part
 * of the library.
 */
#include "common/error.h"
#include "reactor/loop.h"

#include "shmipc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char response[] = "HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\nHello, World!";
#define RESPONSE_LEN (sizeof response - 1)
#define BATCH        64

struct server {
    struct shmipc__loop *loop;
    long target;
    long answered;
    int open;
};

/* Where each connection is in "\r\n\r\n", so a terminator split across reads still counts. */
struct conn_state {
    struct server *server;
    int matched;
};

static void on_data(struct shmipc__conn *c, const void *data, size_t len)
{
    struct conn_state *cs = shmipc__conn_data(c);
    struct server *s = cs->server;
    static const char end[] = "\r\n\r\n";
    const char *p = data;
    struct iovec iov[BATCH];
    int n = 0;
    for (size_t i = 0; i < len; i++) {
        cs->matched = p[i] == end[cs->matched] ? cs->matched + 1 : (p[i] == '\r');
        if (cs->matched < 4)
            continue;
        cs->matched = 0;
        iov[n].iov_base = (void *)response;
        iov[n].iov_len = RESPONSE_LEN;
        /* One send per batch of pipelined requests. */
        if (++n == BATCH) {
            if (shmipc__conn_sendv(c, iov, n, NULL, NULL) < 0)
                return;
            s->answered += n;
            n = 0;
        }
    }
    if (n > 0 && shmipc__conn_sendv(c, iov, n, NULL, NULL) == 0)
        s->answered += n;
}

static void on_end(struct shmipc__conn *c, int status)
{
    struct conn_state *cs = shmipc__conn_data(c);
    struct server *s = cs->server;
    (void)status;
    free(cs);
    shmipc__conn_close(c);
    if (--s->open == 0 && s->answered >= s->target)
        shmipc__loop_stop(s->loop);
}

static void on_accept(struct shmipc__acceptor *a, struct shmipc__conn *c, void *data)
{
    struct conn_state *cs = calloc(1, sizeof *cs);
    (void)a;
    if (cs == NULL) {
        shmipc__conn_close(c);
        return;
    }
    cs->server = data;
    cs->server->open++;
    shmipc__conn_set_data(c, cs);
}

static int serve(int port, long target)
{
    static const struct shmipc__conn_cbs cbs = {on_data, on_end, NULL};
    struct server s = {0};
    struct shmipc__acceptor *acc;
    struct shmipc__loop_stats st;
    int fd, rc;

    s.target = target;
    rc = shmipc__loop_new(NULL, &s.loop);
    if (rc == 0)
        rc = shmipc__tcp_listen("127.0.0.1", (uint16_t)port, 0, 1, &fd);
    if (rc == 0)
        rc = shmipc__acceptor_open(s.loop, fd, &cbs, on_accept, &s, &acc);
    if (rc == 0)
        rc = shmipc__loop_run(s.loop);
    if (rc != 0) {
        fprintf(stderr, "serve: %s: %s\n", shmipc__errname(rc), shmipc__detail());
        return 1;
    }
    shmipc__loop_stats(s.loop, &st);
    printf("%s: %ld requests; %llu waits, %llu epoll_ctl, %llu events, %llu turns\n",
           shmipc__loop_backend_name(s.loop), s.answered, (unsigned long long)st.waits,
           (unsigned long long)st.epoll_ctl, (unsigned long long)st.events,
           (unsigned long long)st.turns);
    shmipc__loop_free(s.loop);
    return 0;
}

static int client(int port, int conns, long n)
{
    static const char req[] = "GET / HTTP/1.1\r\nHost: probe\r\n\r\n";
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct pollfd *p = calloc((size_t)conns, sizeof *p);
    long *left = calloc((size_t)conns, sizeof *left);
    size_t *got = calloc((size_t)conns, sizeof *got);
    int active = conns;
    char buf[4096];

    if (p == NULL || left == NULL || got == NULL)
        return 1;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < conns; i++) {
        p[i].fd = socket(AF_INET, SOCK_STREAM, 0);
        p[i].events = POLLIN;
        left[i] = n;
        if (connect(p[i].fd, (struct sockaddr *)&sin, sizeof sin) < 0 ||
            write(p[i].fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
            perror("client");
            return 1;
        }
    }
    while (active > 0) {
        if (poll(p, (nfds_t)conns, 5000) <= 0) {
            fprintf(stderr, "client: stalled\n");
            return 1;
        }
        for (int i = 0; i < conns; i++) {
            ssize_t r;
            if ((p[i].revents & POLLIN) == 0)
                continue;
            r = read(p[i].fd, buf, sizeof buf);
            if (r <= 0) {
                fprintf(stderr, "client: connection %d ended early\n", i);
                return 1;
            }
            got[i] += (size_t)r;
            if (got[i] < RESPONSE_LEN)
                continue;
            got[i] -= RESPONSE_LEN;
            if (--left[i] == 0) {
                close(p[i].fd);
                p[i].fd = -1;
                active--;
            } else if (write(p[i].fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
                perror("client");
                return 1;
            }
        }
    }
    free(p);
    free(left);
    free(got);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "serve") == 0)
        return serve(atoi(argv[2]), atol(argv[3]));
    if (argc == 5 && strcmp(argv[1], "client") == 0)
        return client(atoi(argv[2]), atoi(argv[3]), atol(argv[4]));
    fprintf(stderr, "usage: ka_probe serve PORT REQUESTS | client PORT CONNS N\n");
    return 2;
}
