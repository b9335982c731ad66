/*
 * Exported session, stream and listener calls: argument checks, then the core. The
 * behaviour is documented in shmipc.h and implemented in core/ipc/.
 */
#include "shmipc.h"

#include "common/error.h"
#include "ipc/listener.h"
#include "ipc/manager.h"
#include "ipc/session.h"

/*
 * A stream call counted in flight (shmipc__stream_enter), so that shutdown and close from
 * another thread wake it and never free the stream under it. `expr` is evaluated between
 * enter and leave; RC_STREAM returns its code.
 */
#define IN_STREAM(st, even_shut, expr)                                                             \
    do {                                                                                           \
        int in_rc_ = shmipc__stream_enter((st), (even_shut));                                      \
        if (in_rc_ < 0)                                                                            \
            return in_rc_;                                                                         \
        in_rc_ = (expr);                                                                           \
        shmipc__stream_leave(st);                                                                  \
        return in_rc_;                                                                             \
    } while (0)

#define REQUIRE(cond, fn, what)                                                                    \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return shmipc__fail(SHMIPC_EINVAL, fn ": " what " is NULL");                           \
    } while (0)

SHMIPC_API int shmipc_session_connect(const char *address, const shmipc_config *cfg,
                                      shmipc_session **out)
{
    REQUIRE(address, "session_connect", "address");
    REQUIRE(out, "session_connect", "out");
    return shmipc__session_connect(address, cfg, out);
}

SHMIPC_API int shmipc_session_open_stream(shmipc_session *s, shmipc_stream **out)
{
    REQUIRE(s, "session_open_stream", "session");
    REQUIRE(out, "session_open_stream", "out");
    return shmipc__session_open_stream(s, out);
}

SHMIPC_API int shmipc_session_accept_stream(shmipc_session *s, int timeout_ms, shmipc_stream **out)
{
    REQUIRE(s, "session_accept_stream", "session");
    REQUIRE(out, "session_accept_stream", "out");
    /* The rule of every wait: any negative value waits forever, 0 does not wait. */
    return shmipc__session_accept_stream(s, timeout_ms < 0 ? SHMIPC_WAIT_FOREVER : timeout_ms, out);
}

SHMIPC_API int shmipc_session_fileno(const shmipc_session *s)
{
    REQUIRE(s, "session_fileno", "session");
    /* The object is the library's, allocated writable; const is the call's promise of no
     * change the caller can see. */
    shmipc__session_set_watched((shmipc_session *)s);
    return shmipc__session_fileno(s);
}

SHMIPC_API int shmipc_session_process(shmipc_session *s)
{
    REQUIRE(s, "session_process", "session");
    return shmipc__session_process(s);
}

SHMIPC_API int shmipc_session_spin(shmipc_session *s)
{
    REQUIRE(s, "session_spin", "session");
    return shmipc__session_spin(s);
}

SHMIPC_API int shmipc_session_status(const shmipc_session *s)
{
    REQUIRE(s, "session_status", "session");
    return shmipc__session_status(s);
}

SHMIPC_API int shmipc_session_version(const shmipc_session *s)
{
    REQUIRE(s, "session_version", "session");
    return s->version;
}

SHMIPC_API int shmipc_session_wakeup(const shmipc_session *s, uint32_t *polling_interval_us)
{
    REQUIRE(s, "session_wakeup", "session");
    if (polling_interval_us != NULL)
        *polling_interval_us = s->interval_us;
    return s->wakeup;
}

SHMIPC_API int shmipc_session_shutdown(shmipc_session *s)
{
    REQUIRE(s, "session_shutdown", "session");
    return shmipc__session_shutdown(s);
}

SHMIPC_API void shmipc_session_close(shmipc_session *s)
{
    if (s != NULL)
        shmipc__session_close(s);
}

SHMIPC_API uint32_t shmipc_stream_id(const shmipc_stream *st)
{
    return st ? st->id : 0;
}

SHMIPC_API int shmipc_stream_write(shmipc_stream *st, const void *buf, size_t len)
{
    REQUIRE(st, "stream_write", "stream");
    REQUIRE(buf || len == 0, "stream_write", "buf");
    IN_STREAM(st, 0, shmipc__stream_write(st, buf, len));
}

SHMIPC_API int shmipc_stream_reserve(shmipc_stream *st, size_t n, void **ptr)
{
    REQUIRE(st, "stream_reserve", "stream");
    REQUIRE(ptr, "stream_reserve", "ptr");
    IN_STREAM(st, 0, shmipc__stream_reserve(st, n, ptr));
}

SHMIPC_API int shmipc_stream_commit(shmipc_stream *st, size_t n)
{
    REQUIRE(st, "stream_commit", "stream");
    IN_STREAM(st, 0, shmipc__stream_commit(st, n));
}

SHMIPC_API int shmipc_stream_flush(shmipc_stream *st)
{
    REQUIRE(st, "stream_flush", "stream");
    IN_STREAM(st, 0, shmipc__stream_flush(st));
}

SHMIPC_API int shmipc_stream_read_chunk(shmipc_stream *st, size_t max, const void **ptr,
                                        size_t *len, int flags)
{
    REQUIRE(st, "stream_read_chunk", "stream");
    REQUIRE(ptr && len, "stream_read_chunk", "ptr or len");
    IN_STREAM(st, 0, shmipc__stream_read_chunk(st, max, ptr, len, flags));
}

SHMIPC_API int shmipc_stream_read_exact_bytes(shmipc_stream *st, size_t n, const void **ptr,
                                              int flags)
{
    REQUIRE(st, "stream_read_exact_bytes", "stream");
    REQUIRE(ptr, "stream_read_exact_bytes", "ptr");
    IN_STREAM(st, 0, shmipc__stream_read_exact(st, n, ptr, flags));
}

SHMIPC_API size_t shmipc_stream_available(const shmipc_stream *st)
{
    return st ? shmipc__stream_available((shmipc_stream *)st) : 0;
}

SHMIPC_API int shmipc_stream_release(shmipc_stream *st)
{
    REQUIRE(st, "stream_release", "stream");
    IN_STREAM(st, 1, shmipc__stream_release(st));
}

SHMIPC_API int shmipc_stream_forward(shmipc_stream *dst, shmipc_stream *src, size_t n, int flags)
{
    REQUIRE(dst && src, "stream_forward", "dst or src");
    int rc = shmipc__stream_enter(dst, 0);
    if (rc < 0)
        return rc;
    if ((rc = shmipc__stream_enter(src, 0)) == 0) {
        rc = shmipc__stream_forward(dst, src, n, flags);
        shmipc__stream_leave(src);
    }
    shmipc__stream_leave(dst);
    return rc;
}

/* Stores a stream timeout in the core's form: -1 waits forever, 0 does not wait. */
static int stream_timeout(shmipc_stream *st, const char *fn, int which, int64_t ms)
{
    if (which == SHMIPC_TIMEOUT_READ)
        st->read_timeout_ms = shmipc__stream_timeout(ms);
    else if (which == SHMIPC_TIMEOUT_WRITE)
        st->write_timeout_ms = shmipc__stream_timeout(ms);
    else
        return shmipc__fail(SHMIPC_EINVAL, "%s: %d is neither SHMIPC_TIMEOUT_READ nor _WRITE", fn,
                            which);
    return 0;
}

/* Deprecated: 0 means forever here. */
SHMIPC_API int shmipc_stream_set_timeout_ms(shmipc_stream *st, int which, uint32_t ms)
{
    REQUIRE(st, "stream_set_timeout_ms", "stream");
    return stream_timeout(st, "stream_set_timeout_ms", which, ms == 0 ? -1 : (int64_t)ms);
}

SHMIPC_API int shmipc_stream_set_timeout(shmipc_stream *st, int which, int timeout_ms)
{
    REQUIRE(st, "stream_set_timeout", "stream");
    return stream_timeout(st, "stream_set_timeout", which, timeout_ms < 0 ? -1 : timeout_ms);
}

SHMIPC_API int shmipc_stream_shutdown(shmipc_stream *st)
{
    REQUIRE(st, "stream_shutdown", "stream");
    return shmipc__stream_shutdown(st);
}

SHMIPC_API void shmipc_stream_close(shmipc_stream *st)
{
    if (st != NULL)
        shmipc__stream_close_handle(st);
}

SHMIPC_API int shmipc_stream_flush_close(shmipc_stream *st)
{
    REQUIRE(st, "stream_flush_close", "stream");
    /* A fork child's copy of its parent's stream: closed here, nothing flushed (fork rule). */
    if (shmipc__session_foreign(st->s)) {
        int rc = shmipc__fail(SHMIPC_ECLOSED,
                              "stream %u: made by process %d, closed here without a flush "
                              "(an object inherited across fork)",
                              st->id, (int)st->s->pid);
        shmipc__stream_close_handle(st);
        return rc;
    }
    int rc = shmipc__stream_enter(st, 0);
    if (rc == 0) {
        /* A signal that cut a wait short is waited out: no handle is left to retry with. */
        do
            rc = shmipc__stream_flush_close(st);
        while (rc == SHMIPC_EINTR);
        shmipc__stream_leave(st);
    }
    /* close_handle records no failure: the flush's detail stays for the caller. */
    shmipc__stream_close_handle(st);
    return rc;
}

SHMIPC_API int shmipc_listener_new(const char *address, const shmipc_config *cfg,
                                   shmipc_listener **out)
{
    REQUIRE(address, "listener_new", "address");
    REQUIRE(out, "listener_new", "out");
    return shmipc__ipc_listener_new(address, cfg, out);
}

SHMIPC_API int shmipc_listener_accept(shmipc_listener *l, int timeout_ms, shmipc_session **out)
{
    REQUIRE(l, "listener_accept", "listener");
    REQUIRE(out, "listener_accept", "out");
    return shmipc__ipc_listener_accept(l, timeout_ms < 0 ? SHMIPC_WAIT_FOREVER : timeout_ms, out);
}

SHMIPC_API int shmipc_listener_fileno(const shmipc_listener *l)
{
    REQUIRE(l, "listener_fileno", "listener");
    return shmipc__ipc_listener_fileno(l);
}

SHMIPC_API int shmipc_listener_shutdown(shmipc_listener *l)
{
    REQUIRE(l, "listener_shutdown", "listener");
    return shmipc__ipc_listener_shutdown(l);
}

SHMIPC_API void shmipc_listener_close(shmipc_listener *l)
{
    if (l != NULL)
        shmipc__ipc_listener_close(l);
}

SHMIPC_API int shmipc_session_manager_new(const char *address, const shmipc_config *cfg,
                                          shmipc_session_manager **out)
{
    REQUIRE(address, "session_manager_new", "address");
    REQUIRE(out, "session_manager_new", "out");
    return shmipc__manager_new(address, cfg, out);
}

SHMIPC_API int shmipc_session_manager_get_stream(shmipc_session_manager *m, shmipc_stream **out)
{
    REQUIRE(m, "session_manager_get_stream", "manager");
    REQUIRE(out, "session_manager_get_stream", "out");
    return shmipc__manager_get_stream(m, out);
}

SHMIPC_API void shmipc_session_manager_put_back(shmipc_session_manager *m, shmipc_stream *st)
{
    if (st == NULL)
        return;
    if (m == NULL)
        shmipc__stream_close_handle(st);
    else
        shmipc__manager_put_back(m, st);
}

SHMIPC_API void shmipc_session_manager_close(shmipc_session_manager *m)
{
    if (m != NULL)
        shmipc__manager_close(m);
}

SHMIPC_API int shmipc_listener_serve(shmipc_listener *l, shmipc_stream_cb on_stream,
                                     shmipc_stream_cb on_data, void *user_data,
                                     shmipc_destroy_cb destroy)
{
    /* destroy runs on every path, a refused argument too: bindings free their state there. */
    if (l == NULL || on_stream == NULL || on_data == NULL) {
        if (destroy != NULL)
            destroy(user_data);
        REQUIRE(l, "listener_serve", "listener");
        REQUIRE(on_stream, "listener_serve", "on_stream");
        REQUIRE(on_data, "listener_serve", "on_data");
    }
    return shmipc__ipc_listener_serve(l, on_stream, on_data, user_data, destroy);
}

SHMIPC_API int shmipc_listener_stop(shmipc_listener *l)
{
    REQUIRE(l, "listener_stop", "listener");
    return shmipc__ipc_listener_stop(l);
}
