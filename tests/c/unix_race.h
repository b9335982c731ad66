/*
 * Races on a unix socket path, for every listener that makes a socket file (the IPC listener,
 * the HTTP server): a client connecting the moment the file appears, and two listeners started
 * at once on one path.
 */
#ifndef SHMIPC_TESTS_UNIX_RACE_H
#define SHMIPC_TESTS_UNIX_RACE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "shmipc.h"

/* How to open (0 or an error code) and close the listener under test. */
struct unix_race_ops {
    int (*open)(const char *addr, void **out);
    void (*close)(void *listener);
};

static inline uint64_t unix_race_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Watches for the socket file and connects the moment it appears. */
struct unix_race_prober {
    const char *path;
    int stop;
    int connected; /* connects that found a listener */
    int refused;   /* connects to a path that existed but refused: the file came before listen() */
    int gone;      /* files seen gone after a probe */
};

static inline void *unix_race_prober_main(void *arg)
{
    struct unix_race_prober *p = arg;
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    snprintf(un.sun_path, sizeof un.sun_path, "%s", p->path);
    struct stat st;
    while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
        if (lstat(p->path, &st) != 0)
            continue;
        int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (c < 0)
            continue;
        if (connect(c, (struct sockaddr *)&un, sizeof un) == 0 || errno == EAGAIN)
            __atomic_add_fetch(&p->connected, 1, __ATOMIC_RELAXED);
        else if (errno == ECONNREFUSED && lstat(p->path, &st) == 0)
            __atomic_add_fetch(&p->refused, 1, __ATOMIC_RELAXED); /* refused, yet still there */
        close(c);
        /* Wait for this listener's file to go before probing the next one. */
        while (lstat(p->path, &st) == 0 && !__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE))
            sched_yield();
        __atomic_add_fetch(&p->gone, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* Waits up to a second for *counter to move from `seen`, or for *stop_if to become nonzero. */
static inline void unix_race_wait(int *counter, int seen, int *stop_if)
{
    uint64_t end = unix_race_now_ms() + 1000;
    while (__atomic_load_n(counter, __ATOMIC_ACQUIRE) == seen &&
           !(stop_if && __atomic_load_n(stop_if, __ATOMIC_RELAXED)) && unix_race_now_ms() < end)
        sched_yield();
}

/* `rounds` listeners opened and closed on `path` while a thread connects the moment the file
 * appears: no connect is refused, and some found a listener. */
static inline void unix_race_appear(const char *path, const struct unix_race_ops *ops, int rounds)
{
    char addr[160];
    snprintf(addr, sizeof addr, "unix:%s", path);
    unlink(path);
    struct unix_race_prober p = {.path = path};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, unix_race_prober_main, &p), 0);
    for (int i = 0; i < rounds && !__atomic_load_n(&p.refused, __ATOMIC_RELAXED); i++) {
        void *l;
        int seen = __atomic_load_n(&p.connected, __ATOMIC_ACQUIRE);
        int rc = ops->open(addr, &l);
        if (rc != 0)
            fail_msg("open %s: %s: %s", addr, shmipc_errname(rc), shmipc_error_detail());
        /* Give the prober its look before the file goes, */
        unix_race_wait(&p.connected, seen, &p.refused);
        seen = __atomic_load_n(&p.gone, __ATOMIC_ACQUIRE);
        ops->close(l);
        /* and its look at the file gone before the next one comes. */
        unix_race_wait(&p.gone, seen, NULL);
    }
    __atomic_store_n(&p.stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    print_message("%d connects found a listener, %d were refused\n", p.connected, p.refused);
    assert_int_equal(p.refused, 0);
    assert_true(p.connected > 0);
}

struct unix_race_racer {
    const struct unix_race_ops *ops;
    const char *addr;
    pthread_barrier_t *go;
    int rc;
    void *l;
};

static inline void *unix_race_racer_main(void *arg)
{
    struct unix_race_racer *r = arg;
    pthread_barrier_wait(r->go);
    r->rc = r->ops->open(r->addr, &r->l);
    return NULL;
}

/* `rounds` times two listeners opened at once on `path`: exactly one gets it, the other
 * SHMIPC_EADDRINUSE. */
static inline void unix_race_two(const char *path, const struct unix_race_ops *ops, int rounds)
{
    char addr[160];
    int both = 0;
    snprintf(addr, sizeof addr, "unix:%s", path);
    for (int i = 0; i < rounds; i++) {
        unlink(path);
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, 2);
        struct unix_race_racer a = {ops, addr, &go, 0, NULL}, b = {ops, addr, &go, 0, NULL};
        pthread_t ta, tb;
        assert_int_equal(pthread_create(&ta, NULL, unix_race_racer_main, &a), 0);
        assert_int_equal(pthread_create(&tb, NULL, unix_race_racer_main, &b), 0);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        pthread_barrier_destroy(&go);
        assert_true(a.rc == 0 || a.rc == SHMIPC_EADDRINUSE);
        assert_true(b.rc == 0 || b.rc == SHMIPC_EADDRINUSE);
        if (a.rc == 0 && b.rc == 0)
            both++;
        else
            assert_int_not_equal(a.rc, b.rc); /* not both refused either */
        if (a.rc == 0)
            ops->close(a.l);
        if (b.rc == 0)
            ops->close(b.l);
    }
    unlink(path);
    print_message("%d of %d rounds gave the path to both\n", both, rounds);
    assert_int_equal(both, 0);
}

#endif
