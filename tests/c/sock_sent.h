/*
 * Waiting until a test client's bytes have left its socket.
 *
 * A client that resets (close() with SO_LINGER 0, or with unread input) drops what its kernel
 * has not sent yet: a frame Nagle holds behind an unacknowledged one never reaches the server.
 * A test that says "the client sent X, then reset" must see X leave first.
 */
#ifndef SHMIPC_TESTS_SOCK_SENT_H
#define SHMIPC_TESTS_SOCK_SENT_H

#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <time.h>

/* The bytes still unsent on `fd` after waiting up to `ms` for none (SIOCOUTQNSD); -1 when the
 * kernel cannot tell. */
static inline int sock_wait_sent(int fd, int ms)
{
    int unsent = -1;
    for (int waited = 0;; waited++) {
        if (ioctl(fd, SIOCOUTQNSD, &unsent) != 0)
            return -1;
        if (unsent == 0 || waited >= ms)
            return unsent;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

#endif
