/*
 * Answers from any thread (shmipc_http_response_defer() and shmipc_http_pending_* in shmipc.h):
 * a handler defers its request and hands a pending answer to whatever computes it (a thread
 * pool, another event loop); that code fills the answer in and sends it from its own thread.
 * Owns struct shmipc__pending (the handle and, once sent, the queued message) and the worker's
 * post box: a mutex-guarded queue and an eventfd watched by the worker's loop, which the
 * first deferral of a worker creates and its teardown closes. The worker drains the queue on
 * its thread and answers each request with shmipc__server_complete(); the request's state is
 * touched on the worker thread only, so a ticket that went stale meanwhile (the client left,
 * the deadline passed) is refused there, never raced.
 *
 * Lifetimes: a pending answer has two references, the owner's (given up by send or free) and
 * the worker's (given up when the request stops waiting: answered, cancelled, or the post box
 * closed); each pending holds one on its post box, which its worker holds too. The eventfd is
 * written under the post box's mutex and closed when the last reference goes, so a send that
 * races the worker's teardown never writes into a closed (or reused) descriptor.
 *
 * May call: server_defer.c (defer, complete, the deferral's cancel), server_conn.c (closing a
 * connection whose answer cannot be built), the reactor's watches.
 */
#include "net/server_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct shmipc__postbox {
    pthread_mutex_t mu;
    unsigned refs; /* the worker's, and one per pending answer (under mu) */
    int closed;    /* the worker's teardown ran: nothing is delivered any more */
    int efd;
    struct shmipc__watch *watch; /* the worker thread's */
    struct shmipc__pending *head, **tail;
};

/* A header of the answer, as offsets into the pending answer's byte buffer (which grows). */
struct pfield {
    uint32_t name, nlen, value, vlen;
};

struct shmipc__pending {
    struct shmipc__pending *next; /* the post box's queue */
    struct shmipc__postbox *pb;
    struct shmipc__server_ticket t;
    shmipc__pending_end_fn end;
    void *end_data;
    /* Under pb->mu. */
    unsigned refs;
    int ended; /* 0 while the request waits; then 1 + its SHMIPC__PENDING_* reason */
    /* The answer: the owner's until sent, the worker's after. */
    int status;
    int abandon;         /* freed unanswered: the worker answers 500 */
    int close;           /* Connection: close */
    int has_type;        /* Content-Type is fields[ntype] */
    int head;            /* the request is HEAD */
    int has_head_length; /* head_length: GET's Content-Length, said by the owner for HEAD */
    uint64_t head_length;
    uint32_t ntype;
    uint32_t nfields;
    struct pfield fields[SHMIPC__SERVER_MAX_RESP_HEADERS + 1];
    char *bytes;
    size_t used, cap;
    const void *body;
    size_t body_len;
    shmipc_destroy_cb body_release; /* free() for a copied body */
    void *body_data;
};

/* ---- references ---- */

static void postbox_unref_locked(struct shmipc__postbox *pb, int *last)
{
    *last = --pb->refs == 0;
}

static void postbox_free(struct shmipc__postbox *pb)
{
    close(pb->efd);
    pthread_mutex_destroy(&pb->mu);
    free(pb);
}

static void postbox_unref(struct shmipc__postbox *pb)
{
    int last;
    pthread_mutex_lock(&pb->mu);
    postbox_unref_locked(pb, &last);
    pthread_mutex_unlock(&pb->mu);
    if (last)
        postbox_free(pb);
}

static void body_drop(struct shmipc__pending *p)
{
    shmipc_destroy_cb fn = p->body_release;
    p->body_release = NULL;
    p->body = NULL;
    p->body_len = 0;
    if (fn != NULL)
        fn(p->body_data);
}

static void pending_unref(struct shmipc__pending *p)
{
    struct shmipc__postbox *pb = p->pb;
    int last, pb_last = 0;
    pthread_mutex_lock(&pb->mu);
    last = --p->refs == 0;
    if (last)
        postbox_unref_locked(pb, &pb_last);
    pthread_mutex_unlock(&pb->mu);
    if (!last)
        return;
    body_drop(p);
    free(p->bytes);
    free(p);
    if (pb_last)
        postbox_free(pb);
}

/* The request stopped waiting (on the worker thread): the owner's callback hears why, once. */
static void pending_ended(struct shmipc__pending *p, int reason)
{
    pthread_mutex_lock(&p->pb->mu);
    p->ended = 1 + reason;
    pthread_mutex_unlock(&p->pb->mu);
    if (p->end != NULL)
        p->end(p->end_data, reason);
    pending_unref(p); /* the worker's reference */
}

/* The deferral's cancel (server_defer.c), on the worker thread. */
static void pending_cancelled(void *data, int reason)
{
    int why = SHMIPC__PENDING_CLIENT_GONE;
    if (reason == SHMIPC__SERVER_CANCEL_TIMEOUT)
        why = SHMIPC__PENDING_TIMEOUT;
    else if (reason == SHMIPC__SERVER_CANCEL_ERROR)
        why = SHMIPC__PENDING_FAILED;
    pending_ended(data, why);
}

/* ---- the worker side ---- */

/* Answers one sent pending answer on the worker thread; takes the message's reference. */
static void deliver(struct shmipc__pending *p)
{
    struct shmipc__http_header_out h[SHMIPC__SERVER_MAX_RESP_HEADERS + 1];
    uint32_t nh = 0;
    const char *type = NULL;
    int ended;
    pthread_mutex_lock(&p->pb->mu);
    ended = p->ended;
    pthread_mutex_unlock(&p->pb->mu);
    if (ended) { /* the client left (or the deadline passed) while the answer was on its way */
        pending_unref(p);
        return;
    }
    if (p->abandon) {
        /* Given up unsent: the server's own 500, as for a handler that failed. */
        body_drop(p);
        if (shmipc__server_complete_error(p->t, 500) == 0)
            pending_ended(p, SHMIPC__PENDING_ABANDONED);
        pending_unref(p);
        return;
    }
    for (uint32_t i = 0; i < p->nfields; i++) {
        const struct pfield *f = &p->fields[i];
        if (p->has_type && i == p->ntype) {
            type = p->bytes + f->value;
            continue;
        }
        h[nh++] = (struct shmipc__http_header_out){p->bytes + f->name, p->bytes + f->value, f->nlen,
                                                   f->vlen};
    }
    if (p->close)
        h[nh++] = (struct shmipc__http_header_out){"Connection", "close", 10, 5};
    /* An answer to HEAD that said GET's length: that length, and no body. */
    if (p->has_head_length) {
        body_drop(p);
        p->body_len = p->head_length > 0 ? (size_t)p->head_length : 0;
    }
    /* complete() owns the body from here (it releases it whatever happens). */
    shmipc_destroy_cb release = p->body_release;
    p->body_release = NULL;
    int rc = shmipc__server_complete(p->t, p->status, type, h, nh, p->body, p->body_len, release,
                                     p->body_data);
    if (rc == 0) {
        pending_ended(p, SHMIPC__PENDING_SENT);
    } else if (p->t.sc->defer_on && p->t.sc->defer_gen == p->t.gen) {
        /* Still waiting, so the answer could not be built (out of memory; its fields were
         * checked as they were added): the server's 500, which allocates nothing. The
         * client must not wait for an answer that cannot come. */
        SHMIPC__LOG(SHMIPC__LOG_WARN, "server: a pending answer could not be sent: %s",
                    shmipc__detail());
        if (shmipc__server_complete_error(p->t, 500) == 0)
            pending_ended(p, SHMIPC__PENDING_FAILED);
    }
    pending_unref(p); /* the message's (the owner's) reference */
}

/* The queue, taken whole (and, `close`, the post box closed in the same hold of its mutex). */
static struct shmipc__pending *postbox_take(struct shmipc__postbox *pb, int close)
{
    pthread_mutex_lock(&pb->mu);
    if (close)
        pb->closed = 1;
    struct shmipc__pending *p = pb->head;
    pb->head = NULL;
    pb->tail = &pb->head;
    pthread_mutex_unlock(&pb->mu);
    return p;
}

static void post_drain(struct shmipc__watch *watch, int fd, unsigned events, void *data)
{
    struct shmipc__postbox *pb = data;
    struct shmipc__pending *p;
    uint64_t n;
    (void)watch;
    (void)events;
    while (read(fd, &n, sizeof n) > 0)
        ;
    p = postbox_take(pb, 0);
    while (p != NULL) {
        struct shmipc__pending *next = p->next;
        p->next = NULL;
        deliver(p);
        p = next;
    }
}

static int postbox_open(struct shmipc__server_worker *w)
{
    struct shmipc__postbox *pb = calloc(1, sizeof *pb);
    int rc;
    if (pb == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "defer: out of memory for the post box");
    pb->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (pb->efd < 0) {
        rc = shmipc__fail_errno(errno, "defer: eventfd");
        free(pb);
        return rc;
    }
    rc = shmipc__watch_new(w->loop, pb->efd, SHMIPC__WATCH_READ, post_drain, pb, &pb->watch);
    if (rc < 0) {
        close(pb->efd);
        free(pb);
        return rc;
    }
    pthread_mutex_init(&pb->mu, NULL);
    pb->refs = 1;
    pb->tail = &pb->head;
    w->post = pb;
    return 0;
}

void shmipc__server_post_close(struct shmipc__server_worker *w)
{
    struct shmipc__postbox *pb = w->post;
    struct shmipc__pending *p;
    if (pb == NULL)
        return;
    w->post = NULL;
    shmipc__watch_free(pb->watch);
    pb->watch = NULL;
    p = postbox_take(pb, 1);
    /* Every connection is closed by now, so every request has stopped waiting: what is still
     * queued arrived too late, and goes (its body released here). */
    while (p != NULL) {
        struct shmipc__pending *next = p->next;
        p->next = NULL;
        pending_unref(p);
        p = next;
    }
    postbox_unref(pb);
}

/* ---- the owner's side ---- */

int shmipc__pending_new(struct shmipc_http_response *res, int timeout_ms,
                        shmipc__pending_end_fn end, void *data, struct shmipc__pending **out)
{
    struct server_conn *sc = res->conn;
    struct shmipc__pending *p;
    int rc;
    *out = NULL;
    if (timeout_ms == 0 || (timeout_ms > 0 && (uint32_t)timeout_ms > SHMIPC__SERVER_MAX_TIMEOUT_MS))
        return shmipc__fail(SHMIPC_EINVAL,
                            "defer: a timeout of %d ms (1..%u, or negative for none)", timeout_ms,
                            SHMIPC__SERVER_MAX_TIMEOUT_MS);
    if (res->deferred || res->ended || sc == NULL || sc->state != SHMIPC__CS_HANDLING)
        return shmipc__fail(SHMIPC_EBUSY, "defer: the response has ended, or was deferred");
    if (res->w->post == NULL && (rc = postbox_open(res->w)) < 0)
        return rc;
    p = calloc(1, sizeof *p);
    if (p == NULL)
        return shmipc__fail(SHMIPC_ENOMEM, "defer: out of memory");
    rc = shmipc__server_defer(res, timeout_ms < 0 ? 0 : (uint32_t)timeout_ms, pending_cancelled, p,
                              &p->t);
    if (rc < 0) {
        free(p);
        return rc;
    }
    res->ended = 1; /* what the handler set on res is not the answer any more */
    p->pb = res->w->post;
    p->refs = 2;
    p->end = end;
    p->end_data = data;
    p->status = 200;
    p->head = (res->r->flags & SHMIPC__HTTP_RESP_HEAD) != 0;
    pthread_mutex_lock(&p->pb->mu);
    p->pb->refs++;
    pthread_mutex_unlock(&p->pb->mu);
    *out = p;
    return 0;
}

int shmipc__pending_set_status(struct shmipc__pending *p, int status)
{
    if (status < 200 || status > 999)
        return shmipc__fail(SHMIPC_EINVAL, "http_pending_set_status: %d is outside 200..999",
                            status);
    p->status = status;
    return 0;
}

int shmipc__pending_add_header(struct shmipc__pending *p, const char *name, const char *value)
{
    size_t nlen = strlen(name), vlen = strlen(value);
    int kind;
    uint64_t length = 0;
    int rc = shmipc__http_header_check(name, value, &kind, &length);
    if (rc < 0)
        return rc;
    if (kind == SHMIPC__HEADER_LENGTH) { /* as shmipc__http_response_add_header() */
        if (!p->head)
            return shmipc__fail(SHMIPC_EINVAL, "response header Content-Length: set by the "
                                               "server (but on an answer to HEAD)");
        if (p->has_head_length)
            return shmipc__fail(SHMIPC_EINVAL, "response header Content-Length: already set");
        p->has_head_length = 1;
        p->head_length = length;
        return 0;
    }
    /* 32 fields beside Content-Type (Connection: close one of them), 4096 bytes in all. */
    uint32_t plain = p->nfields - (uint32_t)p->has_type + (uint32_t)p->close;
    if (kind == SHMIPC__HEADER_CLOSE) {
        if (!p->close && plain >= SHMIPC__SERVER_MAX_RESP_HEADERS)
            return shmipc__fail(SHMIPC_ENOSPC, "response header %s: more than %u headers", name,
                                SHMIPC__SERVER_MAX_RESP_HEADERS);
        p->close = 1;
        return 0;
    }
    if (kind == SHMIPC__HEADER_TYPE && p->has_type)
        return shmipc__fail(SHMIPC_EINVAL, "response header Content-Type: already set");
    size_t need = nlen + vlen + 1; /* the value NUL-terminated (Content-Type is read so) */
    if (p->used + need > SHMIPC__SERVER_RESP_HEADER_BYTES ||
        (kind != SHMIPC__HEADER_TYPE && plain >= SHMIPC__SERVER_MAX_RESP_HEADERS))
        return shmipc__fail(SHMIPC_ENOSPC, "response header %s: more than %u headers or %u bytes",
                            name, SHMIPC__SERVER_MAX_RESP_HEADERS,
                            SHMIPC__SERVER_RESP_HEADER_BYTES);
    if (p->used + need > p->cap) {
        size_t cap = p->cap ? p->cap : 256;
        while (cap < p->used + need)
            cap *= 2;
        char *b = realloc(p->bytes, cap);
        if (b == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "response header %s: out of memory", name);
        p->bytes = b;
        p->cap = cap;
    }
    struct pfield *f = &p->fields[p->nfields];
    f->name = (uint32_t)p->used;
    f->nlen = (uint32_t)nlen;
    memcpy(p->bytes + p->used, name, nlen);
    p->used += nlen;
    f->value = (uint32_t)p->used;
    f->vlen = (uint32_t)vlen;
    memcpy(p->bytes + p->used, value, vlen + 1);
    p->used += vlen + 1;
    if (kind == SHMIPC__HEADER_TYPE) {
        p->has_type = 1;
        p->ntype = p->nfields;
    }
    p->nfields++;
    return 0;
}

int shmipc__pending_body(struct shmipc__pending *p, const void *data, size_t len, void *user_data,
                         shmipc_destroy_cb release, int borrow)
{
    if (!borrow || release == NULL) {
        /* Without a release the owner could not know when its memory is free again: copied,
         * as complete() copies such a body. */
        void *copy = NULL;
        if (len > 0 && (copy = malloc(len)) == NULL)
            return shmipc__fail(SHMIPC_ENOMEM, "http_pending_body: %zu bytes", len);
        if (len > 0)
            memcpy(copy, data, len);
        data = copy;
        user_data = copy;
        release = copy != NULL ? free : NULL;
    }
    body_drop(p); /* an earlier body */
    p->body = data;
    p->body_len = len;
    p->body_release = release;
    p->body_data = user_data;
    return 0;
}

/* Queues the pending answer for its worker; gives up the owner's reference either way. */
int shmipc__pending_send(struct shmipc__pending *p)
{
    struct shmipc__postbox *pb = p->pb;
    pthread_mutex_lock(&pb->mu);
    if (p->ended || pb->closed) {
        pthread_mutex_unlock(&pb->mu);
        /* The body is still the owner's: released here, before the call returns (the worker
         * may still hold its reference, in on_end, and would release it later, on its own
         * thread). */
        body_drop(p);
        pending_unref(p);
        return shmipc__fail(SHMIPC_ECLOSED, "http_pending_send: the request is no longer "
                                            "waiting (the client left, its deadline passed, or "
                                            "the server stopped)");
    }
    int wake = pb->head == NULL;
    p->next = NULL;
    *pb->tail = p;
    pb->tail = &p->next;
    if (wake) {
        uint64_t one = 1;
        /* Under the mutex: the worker's teardown cannot close the descriptor meanwhile.
         * EAGAIN (a saturated counter) still leaves it readable. */
        ssize_t n = write(pb->efd, &one, sizeof one);
        (void)n;
    }
    pthread_mutex_unlock(&pb->mu);
    return 0;
}

int shmipc__pending_waiting(const struct shmipc__pending *p)
{
    int ended;
    pthread_mutex_lock(&p->pb->mu);
    ended = p->ended;
    pthread_mutex_unlock(&p->pb->mu);
    return !ended;
}

void shmipc__pending_free(struct shmipc__pending *p)
{
    body_drop(p);
    p->abandon = 1;
    (void)shmipc__pending_send(p);
}
