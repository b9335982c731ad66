/* Issue 19, item 3: no log sink runs with a library lock held. A sink may call back into the
 * library (the very session that logged, shmipc_set_log_sink) without deadlocking. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipc_helpers.h"
#include "shmipc.h"

static char address[128];
static shmipc_session *_Atomic target; /* the session the sink calls into */
static _Atomic int sink_calls, reentered, resets;

static void reentrant_sink(int level, const char *line)
{
    (void)level;
    (void)line;
    sink_calls++;
    shmipc_session *s = target;
    if (s != NULL) {
        shmipc_stream *st = NULL;
        /* Takes the session mutex: deadlocked when the sink ran under it. */
        if (shmipc_session_open_stream(s, &st) == 0)
            shmipc_stream_close(st);
        (void)shmipc_session_status(s);
        reentered++;
    }
    if (resets < 3) {
        resets++;
        shmipc_set_log_sink(reentrant_sink); /* set the sink from inside the sink */
    }
}

struct run {
    shmipc_session *server;
    _Atomic int done;
};

static void *accept_main(void *arg)
{
    struct run *r = arg;
    shmipc_stream *st = NULL;
    /* The peer is gone: this call finds EOF, ends the session and logs it. */
    int rc = shmipc_session_accept_stream(r->server, 5000, &st);
    if (rc == 0)
        shmipc_stream_close(st);
    r->done = 1;
    return NULL;
}

static void sink_calls_back_into_the_logging_session(void **state)
{
    (void)state;
    struct ipc_pair p;
    pthread_t th;
    ipc_pair_open(&p, address, NULL, NULL);
    struct run r = {.server = p.server};
    target = p.server;
    shmipc_set_log_sink(reentrant_sink);
    shmipc_session_close(p.client);
    p.client = NULL;
    assert_int_equal(pthread_create(&th, NULL, accept_main, &r), 0);
    for (int i = 0; i < 1000 && !r.done; i++)
        usleep(10000);
    if (!r.done)
        fail_msg("deadlock: the log sink ran under the session lock and called into the session");
    pthread_join(th, NULL);
    target = NULL;
    shmipc_set_log_sink(NULL);
    assert_true(reentered > 0);
    shmipc_session_close(p.server);
    shmipc_listener_close(p.l);
}

int main(void)
{
    setenv("SHMIPC_LOG_LEVEL", "debug", 1);
    signal(SIGPIPE, SIG_IGN);
    alarm(60); /* a deadlock ends the run (SIGALRM) instead of hanging it */
    ipc_pick_address(address, sizeof address, "logsink");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sink_calls_back_into_the_logging_session),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
