/*
 * The HTTP server's workers: each worker's setup and teardown on its loop thread (the date
 * timer, the acceptor, the graceful part of a stop), and its free lists of receive buffers,
 * batch buffers and connections, which a connection takes from and gives back to.
 * Owns struct shmipc__server_worker's pools and date; the connections themselves are
 * server_conn.c's (accepted there, closed there).
 * May call: the reactor, http_writer (the Date header) and server_conn.c's lifecycle entry
 * points (shmipc__server_conn_accept(), shmipc__server_conn_event(), shmipc__server_conn_close()).
 */
#include "net/server_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* ---- pools ---- */

char *shmipc__server_rx_get(struct shmipc__server_worker *w)
{
    char *b = w->free_rx;
    if (b != NULL) {
        w->free_rx = *(char **)b;
        w->nfree_rx--;
        return b;
    }
    return malloc(RX_STD);
}

void shmipc__server_rx_put(struct shmipc__server_worker *w, char *b, size_t cap)
{
    if (b == NULL)
        return;
    if (cap != RX_STD || w->nfree_rx >= POOL_KEEP) {
        free(b);
        return;
    }
    *(char **)b = w->free_rx;
    w->free_rx = b;
    w->nfree_rx++;
}

struct txbuf *shmipc__server_tx_get(struct shmipc__server_worker *w)
{
    struct txbuf *t = w->free_tx;
    if (t != NULL) {
        w->free_tx = t->next;
        w->nfree_tx--;
        return t;
    }
    return malloc(sizeof *t);
}

void shmipc__server_tx_put(struct shmipc__server_worker *w, struct txbuf *t)
{
    if (t == NULL)
        return;
    if (w->nfree_tx >= POOL_KEEP) {
        free(t);
        return;
    }
    t->next = w->free_tx;
    w->free_tx = t;
    w->nfree_tx++;
}

void shmipc__server_worker_free_pools(struct shmipc__server_worker *w)
{
    while (w->free_conns != NULL) {
        struct server_conn *sc = w->free_conns;
        w->free_conns = sc->next;
        free(sc);
    }
    while (w->free_rx != NULL) {
        char *b = w->free_rx;
        w->free_rx = *(char **)b;
        free(b);
    }
    while (w->free_tx != NULL) {
        struct txbuf *t = w->free_tx;
        w->free_tx = t->next;
        free(t);
    }
    w->nfree_rx = w->nfree_tx = 0;
}

static void date_tick(struct shmipc__timer *t)
{
    struct shmipc__server_worker *w = t->data;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    shmipc__http_date_refresh(&w->date, ts.tv_sec);
    /* Just past the next second, so the text changes when the second does. */
    if (shmipc__timer_start(&w->date_timer, 1000 - (uint64_t)ts.tv_nsec / 1000000 + 1) < 0)
        SHMIPC__LOG(SHMIPC__LOG_WARN, "server: date timer: %s", shmipc__detail());
}

int shmipc__server_worker_setup(struct shmipc__loop *loop, int listen_fd, unsigned index,
                                void *data)
{
    struct shmipc_server *s = data;
    struct shmipc__server_worker *w = &s->w[index];
    struct timespec ts;
    int rc;
    w->loop = loop;
    w->thread = pthread_self();
    clock_gettime(CLOCK_REALTIME, &ts);
    shmipc__http_date_init(&w->date, ts.tv_sec);
    shmipc__timer_init(loop, &w->date_timer, date_tick, w);
    rc = shmipc__timer_start(&w->date_timer, 1000 - (uint64_t)ts.tv_nsec / 1000000 + 1);
    if (rc < 0) {
        close(listen_fd);
        return rc;
    }
    rc = shmipc__acceptor_open(loop, listen_fd, &shmipc__server_conn_cbs,
                               shmipc__server_conn_accept, w, &w->acceptor);
    if (rc < 0) {
        shmipc__timer_stop(&w->date_timer);
        return rc;
    }
    if (s->thread_start != NULL &&
        (rc = s->thread_start(loop, index, s->nworkers, s->thread_data)) < 0) {
        shmipc__acceptor_close(w->acceptor);
        w->acceptor = NULL;
        shmipc__timer_stop(&w->date_timer);
        return rc;
    }
    if (index == 0)
        s->backend_name = shmipc__loop_backend_name(loop);
    return 0;
}

int shmipc__server_thread_hooks(struct shmipc_server *s, shmipc__server_thread_fn start,
                                shmipc__server_thread_fn end, void *data)
{
    if (s->workers != NULL || atomic_load(&s->running) || s->thread_start != NULL ||
        s->thread_end != NULL)
        return shmipc__fail(SHMIPC_EBUSY, "server: thread hooks set already, or running");
    s->thread_start = start;
    s->thread_end = end;
    s->thread_data = data;
    return 0;
}

/*
 * Runs on the worker thread once its loop was stopped: the graceful part of a stop. The loop
 * still works, so it is run here until the connections are gone or the stop timeout passed.
 */
void shmipc__server_worker_teardown(struct shmipc__loop *loop, unsigned index, void *data)
{
    struct shmipc_server *s = data;
    struct shmipc__server_worker *w = &s->w[index];
    /* A negative stop timeout waits for the requests in flight for as long as they take. */
    uint64_t deadline =
        s->stop_ms < 0 ? UINT64_MAX : shmipc__loop_now_ms(loop) + (uint64_t)s->stop_ms;
    struct server_conn *sc, *next;

    w->draining = 1;
    if (w->acceptor != NULL) {
        shmipc__acceptor_close(w->acceptor);
        w->acceptor = NULL;
    }
    /* Idle keep-alive connections get their FIN now; the others with their last answer.
     * WebSockets get a close frame (1001, going away) and the stop timeout to answer it. */
    for (sc = w->conns; sc != NULL; sc = next) {
        next = sc->next;
        shmipc__server_conn_event(sc, SHMIPC__CE_SHUTDOWN, NULL, 0);
    }
    while (w->nconns > 0) {
        uint64_t now = shmipc__loop_now_ms(loop);
        if (now >= deadline)
            break;
        if (shmipc__loop_run_once(loop, (int)(deadline - now < 50 ? deadline - now : 50)) < 0)
            break;
    }
    while (w->conns != NULL)
        shmipc__server_conn_close(w->conns);
    /* No request waits any more: answers sent from now on are refused. */
    shmipc__server_post_close(w);
    if (s->thread_end != NULL)
        s->thread_end(loop, index, s->nworkers, s->thread_data);
    shmipc__timer_stop(&w->date_timer);
    shmipc__loop_stats(loop, &w->stats.loop);
}
