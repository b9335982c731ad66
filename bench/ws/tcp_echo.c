/*
 * shmipc-bench-ws, the TCP floor (`shmipc-bench-ws tcp-echo PORT`): one thread, level-triggered
 * epoll, echoing whatever arrives.
 */
#include "ws_bench.h"

/* ---------------------------------------------------------------------------------------- */
/* tcp-echo: the floor. One thread, level-triggered epoll, echoes whatever arrives; a
 * connection holds memory only while the peer is not reading (what write() did not take). */

struct echo_conn {
    uint8_t *pending;
    size_t len, off;
};

static volatile sig_atomic_t echo_stop;

static void echo_on_term(int sig)
{
    (void)sig;
    echo_stop = 1;
}

static void echo_close(int ep, struct echo_conn **tab, int fd)
{
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    if (tab[fd] != NULL) {
        free(tab[fd]->pending);
        free(tab[fd]);
        tab[fd] = NULL;
    }
}

int tcp_echo(int port)
{
    static uint8_t buf[256 << 10];
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct epoll_event ev = {.events = EPOLLIN}, evs[256];
    struct echo_conn **tab;
    int one = 1, lfd, ep;
    long maxfd = sysconf(_SC_OPEN_MAX);
    if (maxfd < 1024)
        maxfd = 1024;
    tab = calloc((size_t)maxfd, sizeof *tab);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (tab == NULL || lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(lfd, (struct sockaddr *)&sin, sizeof sin) < 0 || listen(lfd, 4096) < 0) {
        fprintf(stderr, "tcp-echo: port %d: %s\n", port, strerror(errno));
        return 1;
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    ev.data.fd = lfd;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) < 0) {
        fprintf(stderr, "tcp-echo: epoll: %s\n", strerror(errno));
        return 1;
    }
    signal(SIGTERM, echo_on_term);
    signal(SIGINT, echo_on_term);
    signal(SIGPIPE, SIG_IGN);
    while (!echo_stop) {
        int n = epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd) {
                int c;
                while ((c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
                    if (c >= maxfd) {
                        close(c);
                        continue;
                    }
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
                }
                continue;
            }
            if (tab[fd] != NULL) { /* flushing what the peer did not take yet */
                struct echo_conn *c = tab[fd];
                ssize_t w = write(fd, c->pending + c->off, c->len - c->off);
                if (w < 0 && errno != EAGAIN) {
                    echo_close(ep, tab, fd);
                    continue;
                }
                c->off += w > 0 ? (size_t)w : 0;
                if (c->off == c->len) {
                    struct epoll_event ce = {.events = EPOLLIN, .data.fd = fd};
                    free(c->pending);
                    free(c);
                    tab[fd] = NULL;
                    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ce);
                }
                continue;
            }
            ssize_t r = read(fd, buf, sizeof buf);
            if (r <= 0) {
                if (r == 0 || errno != EAGAIN)
                    echo_close(ep, tab, fd);
                continue;
            }
            ssize_t w = write(fd, buf, (size_t)r);
            if (w < 0 && errno != EAGAIN) {
                echo_close(ep, tab, fd);
                continue;
            }
            if (w < 0)
                w = 0;
            if (w < r) { /* keep the rest; stop reading until it is gone */
                struct echo_conn *c = malloc(sizeof *c);
                struct epoll_event ce = {.events = EPOLLOUT, .data.fd = fd};
                if (c == NULL || (c->pending = malloc((size_t)(r - w))) == NULL) {
                    free(c);
                    echo_close(ep, tab, fd);
                    continue;
                }
                memcpy(c->pending, buf + w, (size_t)(r - w));
                c->len = (size_t)(r - w);
                c->off = 0;
                tab[fd] = c;
                epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ce);
            }
        }
    }
    return 0;
}
