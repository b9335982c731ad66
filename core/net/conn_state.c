/* The connection lifecycle's table; see conn_state.h and docs/http.md, "Connection
 * lifecycle". */
#include "net/conn_state.h"

#include <stddef.h>

#define T(a, n)                                                                                    \
    {                                                                                              \
        SHMIPC__CA_##a, SHMIPC__CS_##n                                                             \
    }

static const struct shmipc__cs_transition table[SHMIPC__CS_COUNT][SHMIPC__CE_COUNT] = {
    /*                     DATA               SENT               PEER_FIN
     *                     ERROR              TIMEOUT            SHUTDOWN
     *                     COMPLETE */
    [SHMIPC__CS_READING] = {T(SERVE, HANDLING), T(BUG, CLOSED), T(CLOSE, CLOSED), T(CLOSE, CLOSED),
                            T(CLOSE, CLOSED), T(STOP_IDLE, LINGERING), T(BUG, CLOSED)},
    /* Handlers run inside the DATA (or SENT) event that answers: the reactor delivers nothing
     * until they return. */
    [SHMIPC__CS_HANDLING] = {T(BUG, CLOSED), T(BUG, CLOSED), T(BUG, CLOSED), T(BUG, CLOSED),
                             T(BUG, CLOSED), T(BUG, CLOSED), T(BUG, CLOSED)},
    [SHMIPC__CS_WRITING] = {T(BUFFER, WRITING), T(NEXT, READING), T(HALF_CLOSE, WRITING),
                            T(CLOSE, CLOSED), T(SEND_TIMER, WRITING), T(NONE, WRITING),
                            T(BUG, CLOSED)},
    [SHMIPC__CS_CLOSING] = {T(DRAIN, CLOSING), T(LINGER, LINGERING), T(HALF_CLOSE, CLOSING),
                            T(CLOSE, CLOSED), T(SEND_TIMER, CLOSING), T(NONE, CLOSING),
                            T(BUG, CLOSED)},
    [SHMIPC__CS_LINGERING] = {T(DRAIN, LINGERING), T(BUG, CLOSED), T(CLOSE, CLOSED),
                              T(CLOSE, CLOSED), T(CLOSE, CLOSED), T(NONE, LINGERING),
                              T(BUG, CLOSED)},
    [SHMIPC__CS_UPGRADED] = {T(WS, UPGRADED), T(WS, UPGRADED), T(WS, UPGRADED), T(WS, UPGRADED),
                             T(WS, UPGRADED), T(WS, UPGRADED), T(BUG, CLOSED)},
    /* A completion for a connection that closed is refused before it becomes an event (its
     * ticket is stale), so COMPLETE never reaches CLOSED; none, should it. */
    [SHMIPC__CS_CLOSED] = {T(NONE, CLOSED), T(RELEASE, CLOSED), T(NONE, CLOSED), T(RELEASE, CLOSED),
                           T(NONE, CLOSED), T(NONE, CLOSED), T(NONE, CLOSED)},
    /* The client leaving (FIN, as nginx's proxy takes it, or a reset) cancels the request at
     * its worker; a stop waits for the answer (the stop timeout bounds it). */
    [SHMIPC__CS_DEFERRED] = {T(BUFFER, DEFERRED), T(HOLD, DEFERRED), T(CLOSE, CLOSED),
                             T(CLOSE, CLOSED), T(DEFER_TIMER, DEFERRED), T(NONE, DEFERRED),
                             T(ANSWER, WRITING)},
};

void (*shmipc__server_cs_trace)(int from, int event, int action, int to);

static const struct shmipc__cs_transition bug = T(BUG, CLOSED);

const struct shmipc__cs_transition *shmipc__cs_lookup(int state, int event)
{
    if (state < 0 || state >= SHMIPC__CS_COUNT || event < 0 || event >= SHMIPC__CE_COUNT)
        return &bug;
    return &table[state][event];
}

const char *shmipc__cs_state_name(int state)
{
    static const char *const names[] = {"READING",   "HANDLING", "WRITING", "CLOSING",
                                        "LINGERING", "UPGRADED", "CLOSED",  "DEFERRED"};
    return state >= 0 && state < SHMIPC__CS_COUNT ? names[state] : "?";
}

const char *shmipc__cs_event_name(int event)
{
    static const char *const names[] = {"DATA",    "SENT",     "PEER_FIN", "ERROR",
                                        "TIMEOUT", "SHUTDOWN", "COMPLETE"};
    return event >= 0 && event < SHMIPC__CE_COUNT ? names[event] : "?";
}

const char *shmipc__cs_action_name(int action)
{
    static const char *const names[] = {
        "serve", "buffer", "drain",   "next", "linger", "half_close", "send_timer",  "stop_idle",
        "ws",    "close",  "release", "none", "bug",    "hold",       "defer_timer", "answer"};
    return action >= 0 && action < SHMIPC__CA_COUNT ? names[action] : "?";
}
