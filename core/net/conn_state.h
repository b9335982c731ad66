/*
 * The HTTP server connection's lifecycle as one state machine (issue 18, item 3; the table is
 * in docs/http.md, "Connection lifecycle"). The table says, for every state and every event,
 * which named action runs and the state it leads to; core/net/server_conn.c performs the
 * actions.
 * The same code runs on every reactor backend: the events are the reactor's connection
 * callbacks (core/reactor/loop.h), which both backends deliver alike.
 */
#ifndef SHMIPC_NET_CONN_STATE_H
#define SHMIPC_NET_CONN_STATE_H

#include <stdint.h>

enum shmipc__cs_state {
    SHMIPC__CS_READING = 0, /* no batch in flight; waiting for (the rest of) a request */
    SHMIPC__CS_HANDLING,    /* parsing and running handlers into a batch (synchronous) */
    SHMIPC__CS_WRITING,     /* a batch is being sent; the connection stays open after it */
    SHMIPC__CS_CLOSING,     /* the last batch is being sent; a FIN is queued behind it */
    SHMIPC__CS_LINGERING,   /* the last batch left: input is drained until FIN/time/bytes */
    SHMIPC__CS_UPGRADED,    /* a WebSocket: every event goes to the WebSocket layer */
    SHMIPC__CS_CLOSED,      /* closed; the memory waits for the sends still in flight */
    SHMIPC__CS_DEFERRED,    /* a request waits for its answer (an application worker's);
                             * the answers before it may be in flight */
    SHMIPC__CS_COUNT
};

enum shmipc__cs_event {
    SHMIPC__CE_DATA = 0, /* bytes received (on_data) */
    SHMIPC__CE_SENT,     /* the batch in flight was written (on_sent, status 0) */
    SHMIPC__CE_PEER_FIN, /* the peer's FIN: a half-close (on_end, status 0) */
    SHMIPC__CE_ERROR,    /* a reset or a failed send (on_end or on_sent, status < 0) */
    SHMIPC__CE_TIMEOUT,  /* the connection's deadline passed */
    SHMIPC__CE_SHUTDOWN, /* the server stops gracefully (worker teardown) */
    SHMIPC__CE_COMPLETE, /* the deferred request's answer came (shmipc__server_complete) */
    SHMIPC__CE_COUNT
};

enum shmipc__cs_action {
    SHMIPC__CA_SERVE = 0,   /* append the input and answer what is complete: HANDLING */
    SHMIPC__CA_BUFFER,      /* append the input; it is answered once the batch is sent */
    SHMIPC__CA_DRAIN,       /* drop the input (counted against the linger limit) */
    SHMIPC__CA_NEXT,        /* batch sent: answer buffered input, close, linger, or wait */
    SHMIPC__CA_LINGER,      /* the last batch sent: wait for the FIN, or close if it came */
    SHMIPC__CA_HALF_CLOSE,  /* note the peer's FIN; close once nothing is owed */
    SHMIPC__CA_SEND_TIMER,  /* the send timeout: extend on progress, else close */
    SHMIPC__CA_STOP_IDLE,   /* a graceful stop: an idle connection lingers (FIN now) */
    SHMIPC__CA_WS,          /* the WebSocket layer handles it */
    SHMIPC__CA_CLOSE,       /* close now */
    SHMIPC__CA_RELEASE,     /* closed: free the memory once no send is in flight */
    SHMIPC__CA_NONE,        /* nothing to do */
    SHMIPC__CA_BUG,         /* cannot happen: logged, and the connection closes */
    SHMIPC__CA_HOLD,        /* DEFERRED: the batch before the deferred answer was sent */
    SHMIPC__CA_DEFER_TIMER, /* DEFERRED: the send timeout or the request's deadline (504) */
    SHMIPC__CA_ANSWER,      /* DEFERRED: queue the answer (once no batch is in flight) */
    SHMIPC__CA_COUNT
};

struct shmipc__cs_transition {
    uint8_t action; /* enum shmipc__cs_action */
    uint8_t next;   /* the state the action leads to when nothing else decides; the actions
                     * SERVE, NEXT, LINGER, HALF_CLOSE and STOP_IDLE choose among the
                     * states listed beside them in docs/http.md */
};

/* The cell for (state, event); out-of-range values get the BUG cell. */
const struct shmipc__cs_transition *shmipc__cs_lookup(int state, int event);

const char *shmipc__cs_state_name(int state);
const char *shmipc__cs_event_name(int event);
const char *shmipc__cs_action_name(int action);

/*
 * A test seam: when set (before the server starts), every event of every connection is
 * reported after its action ran, with the state it came in, its action and the state it
 * left. Called on the worker threads; NULL in production.
 */
extern void (*shmipc__server_cs_trace)(int from, int event, int action, int to);

#endif
