/* One HTTP/1.1 connection's protocol logic without sockets; see http_conn.h. */
#include "net/http_conn.h"

#include <string.h>

#include "common/error.h"
#include "shmipc.h"

enum conn_phase {
    C_HEAD = 0, /* the next bytes start (or continue) a request head */
    C_BODY,     /* a head is complete; its body is being decoded */
    C_CLOSED,   /* a closing response was queued; input is ignored */
    C_DEFERRED, /* a request's answer comes later (shmipc__http_conn_complete) */
};

void shmipc__http_conn_init(struct shmipc__http_conn *c, const struct shmipc__http_limits *limits,
                            struct shmipc__http_field *fields, shmipc__http_handler_fn handler,
                            void *user_data)
{
    memset(c, 0, sizeof *c);
    shmipc__http_parser_init(&c->parser, limits, fields);
    c->handler = handler;
    c->user_data = user_data;
    c->head_reserve = SHMIPC__HTTP_CONN_HEAD_RESERVE;
    c->phase = C_HEAD;
}

/* Whether `out` can take whatever one more request may produce. */
static int batch_has_room(const struct shmipc__http_conn *c, const struct shmipc__http_batch *out)
{
    return out->cap - out->used >= c->head_reserve &&
           out->iov_cap - out->niov >= SHMIPC__HTTP_CONN_IOV_RESERVE;
}

/*
 * Queues the canned response for `status` and closes. The room reserved before the request
 * was parsed holds it; should it not, the owner still closes and the peer sees only FIN.
 */
static int fail(struct shmipc__http_conn *c, struct shmipc__http_batch *out, int status)
{
    (void)shmipc__http_batch_add_error(out, status);
    c->phase = C_CLOSED;
    return SHMIPC__HTTP_CONN_CLOSE;
}

/* The response's last checks, then into the batch (a 500 when it is refused). */
static int queue_response(const struct shmipc__http_request *req, struct shmipc__http_response *r,
                          int rc, struct shmipc__http_batch *out)
{
    struct shmipc__http_response resp = *r;
    if (rc == 0 && (resp.flags & SHMIPC__HTTP_RESP_STREAM))
        rc = shmipc__fail(SHMIPC_ENOTSUP, "http: a handler answered with a STREAM response");
    /* The client's "close" (or HTTP/1.0 without keep-alive) wins over the handler. */
    if (req != NULL && !(req->flags & SHMIPC__HTTP_KEEP_ALIVE))
        resp.flags |= SHMIPC__HTTP_RESP_CLOSE;
    if (rc == 0)
        rc = shmipc__http_batch_add(out, &resp);
    if (rc < 0) {
        /* Drop what the handler set; keep the flags the request implied (HEAD, 1.0). */
        uint16_t keep = r->flags & (SHMIPC__HTTP_RESP_HEAD | SHMIPC__HTTP_RESP_HTTP10);
        memset(&resp, 0, sizeof resp);
        resp.flags = keep;
        shmipc__http_response_error(&resp, 500); /* sets CLOSE */
        (void)shmipc__http_batch_add(out, &resp);
    }
    return shmipc__http_response_closes(&resp);
}

/* respond()'s answer for a deferred request (1 means "close", 0 "go on"). */
#define RESPOND_DEFERRED 2

/* Calls the handler for the complete request (or, `at_head`, for its head alone) and queues
 * its response. Returns 1 to close, RESPOND_DEFERRED when the handler deferred it. */
static int respond(struct shmipc__http_conn *c, const char *body, size_t body_len, int at_head,
                   struct shmipc__http_batch *out)
{
    const struct shmipc__http_request *req = &c->parser.req;
    struct shmipc__http_response resp;
    shmipc__http_response_init(&resp, req);
    int rc = c->handler(c->user_data, req, body, body_len, &resp);
    if (rc == SHMIPC__HTTP_DEFER) {
        /* The answer is the owner's to fill in later; what the request implies is kept. */
        shmipc__http_response_init(&c->deferred, req);
        c->deferred_flags = c->deferred.flags;
        return RESPOND_DEFERRED;
    }
    /* Answered at the head: the unread body must never be parsed as a next request. */
    if (at_head)
        resp.flags |= SHMIPC__HTTP_RESP_CLOSE;
    return queue_response(req, &resp, rc, out);
}

int shmipc__http_conn_body_pending(const struct shmipc__http_conn *c)
{
    return shmipc__http_body_pending(&c->parser);
}

int shmipc__http_conn_upload(struct shmipc__http_conn *c, char *buf, size_t *len, size_t *piece,
                             size_t *drop, int *status)
{
    struct shmipc__http_parser *p = &c->parser;
    *piece = *drop = 0;
    *status = 0;
    if (c->phase != C_DEFERRED || !shmipc__http_body_pending(p))
        return shmipc__fail(SHMIPC_EINVAL, "http: no streamed body is being read");
    int rc = shmipc__http_body_decode(p, buf, len);
    if (rc < 0) {
        *status = p->status ? p->status : 400;
        return rc;
    }
    /* The decoded bytes leave the decoder's buffer (its offsets move down by them); at the
     * end, the framing behind them (the last chunk, trailers) goes too. */
    *piece = shmipc__http_body_take(p);
    *drop = *piece;
    if (rc == 1)
        *drop += shmipc__http_body_wire(p);
    return rc;
}

int shmipc__http_conn_deferred(const struct shmipc__http_conn *c)
{
    return c->phase == C_DEFERRED;
}

int shmipc__http_conn_complete(struct shmipc__http_conn *c, struct shmipc__http_batch *out)
{
    if (c->phase != C_DEFERRED)
        return shmipc__fail(SHMIPC_EINVAL, "http: complete without a deferred request");
    int rc = c->deferred.status == 0 ? SHMIPC_EINVAL : 0;
    c->deferred.flags |= c->deferred_flags; /* the owner may have replaced them */
    /* The request is gone (its bytes were dropped): the deferred response carries its flags,
     * and a CLOSE the client asked for is already among them. */
    if (shmipc__http_conn_body_pending(c)) /* a streamed body answered before its end */
        c->deferred.flags |= SHMIPC__HTTP_RESP_CLOSE;
    int closes = queue_response(NULL, &c->deferred, rc, out);
    c->phase = closes ? C_CLOSED : C_HEAD;
    return closes;
}

int shmipc__http_conn_stream_head(struct shmipc__http_conn *c, struct shmipc__http_batch *out,
                                  struct shmipc__http_response *body_resp)
{
    if (c->phase != C_DEFERRED || c->deferred.status == 0)
        return shmipc__fail(SHMIPC_EINVAL, "http: a stream head without a deferred request");
    c->deferred.flags |= c->deferred_flags;
    struct shmipc__http_response head = c->deferred;
    /* A sized body: the head says its length, the pieces follow raw (as HTTP/1.0's). */
    if (!(head.flags & SHMIPC__HTTP_RESP_STREAM))
        head.flags |= SHMIPC__HTTP_RESP_HEAD;
    int rc = shmipc__http_batch_add(out, &head);
    if (rc < 0)
        return rc;
    *body_resp = c->deferred;
    if (!(c->deferred.flags & SHMIPC__HTTP_RESP_STREAM))
        body_resp->flags |= SHMIPC__HTTP_RESP_STREAM | SHMIPC__HTTP_RESP_HTTP10;
    return shmipc__http_response_closes(&c->deferred);
}

void shmipc__http_conn_stream_done(struct shmipc__http_conn *c, int closes)
{
    if (c->phase == C_DEFERRED)
        c->phase = closes ? C_CLOSED : C_HEAD;
}

/*
 * The handler of a route that takes its body in pieces runs at the head. Deferred with the
 * body taken (c->upload), the head is consumed and the body is the owner's to read
 * (shmipc__http_conn_upload); "Expect: 100-continue" is answered now that the body is
 * wanted, unless a body byte came already. Any other answer closes after it.
 */
static int respond_at_head(struct shmipc__http_conn *c, char *rx, size_t len, size_t *pos,
                           struct shmipc__http_batch *out)
{
    struct shmipc__http_parser *p = &c->parser;
    p->req.base = rx + *pos;
    c->upload = 0;
    int closes = respond(c, NULL, 0, 1, out);
    *pos += c->head_len;
    if (closes == RESPOND_DEFERRED) {
        c->phase = C_DEFERRED;
        if (c->upload && (p->req.flags & SHMIPC__HTTP_EXPECT_CONTINUE) && len == *pos)
            (void)shmipc__http_batch_add_continue(out);
        return SHMIPC__HTTP_CONN_DEFER;
    }
    c->phase = C_CLOSED;
    return SHMIPC__HTTP_CONN_CLOSE;
}

int shmipc__http_conn_process(struct shmipc__http_conn *c, char *rx, size_t *len, size_t *consumed,
                              struct shmipc__http_batch *out, unsigned budget)
{
    struct shmipc__http_parser *p = &c->parser;
    size_t pos = 0; /* the first byte of the current request */
    unsigned served = 0;
    int verdict;
    if (budget == 0)
        budget = SHMIPC__HTTP_CONN_BUDGET;
    *consumed = 0;
    if (c->phase == C_CLOSED) {
        *consumed = *len;
        return SHMIPC__HTTP_CONN_CLOSE;
    }
    if (c->phase == C_DEFERRED)
        return SHMIPC__HTTP_CONN_DEFER;
    for (;;) {
        if (c->phase == C_HEAD) {
            if (pos == *len) {
                verdict = SHMIPC__HTTP_CONN_MORE;
                break;
            }
            if (served >= budget || !batch_has_room(c, out)) {
                verdict = SHMIPC__HTTP_CONN_YIELD;
                break;
            }
            int rc = shmipc__http_parse_head(p, rx + pos, *len - pos);
            if (rc == 0) {
                verdict = SHMIPC__HTTP_CONN_MORE;
                break;
            }
            if (rc < 0) {
                verdict = fail(c, out, p->status ? p->status : 400);
                break;
            }
            c->head_len = (uint32_t)rc;
            c->phase = C_BODY;
            if (p->req.body_kind != SHMIPC__HTTP_BODY_NONE && c->at_head != NULL &&
                c->at_head(c->user_data, &p->req)) {
                verdict = respond_at_head(c, rx, *len, &pos, out);
                break;
            }
            /*
             * RFC 9110 §10.1.1: the client may wait for 100 Continue before sending the body.
             * Send it only when no body byte is here yet; a server may omit it otherwise.
             */
            if ((p->req.flags & SHMIPC__HTTP_EXPECT_CONTINUE) &&
                p->req.body_kind != SHMIPC__HTTP_BODY_NONE && *len - pos == (size_t)rc)
                (void)shmipc__http_batch_add_continue(out);
        }
        char *body = rx + pos + c->head_len;
        size_t blen = *len - pos - c->head_len;
        int rc = shmipc__http_body_decode(p, body, &blen);
        *len = pos + c->head_len + blen;
        if (rc == 0) {
            verdict = SHMIPC__HTTP_CONN_MORE;
            break;
        }
        if (rc < 0) {
            verdict = fail(c, out, p->status ? p->status : 400);
            break;
        }
        /* The head may have completed in an earlier call, in a buffer that has moved since. */
        p->req.base = rx + pos;
        int closes = respond(c, body, shmipc__http_body_len(p), 0, out);
        served++;
        pos += c->head_len + shmipc__http_body_wire(p);
        c->phase = C_HEAD;
        if (closes == RESPOND_DEFERRED) {
            c->phase = C_DEFERRED;
            verdict = SHMIPC__HTTP_CONN_DEFER;
            break;
        }
        if (closes) {
            c->phase = C_CLOSED;
            verdict = SHMIPC__HTTP_CONN_CLOSE;
            break;
        }
    }
    *consumed = verdict == SHMIPC__HTTP_CONN_CLOSE ? *len : pos;
    return verdict;
}
