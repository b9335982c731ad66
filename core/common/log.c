#include "log.h"

#include "env.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const level_names[] = {"off", "error", "warn", "info", "debug"};

static int level = SHMIPC__LOG_WARN;
static pthread_once_t level_once = PTHREAD_ONCE_INIT;

/*
 * The sink that replaces stderr, read atomically so that logging without one takes no lock.
 * No sink ever runs with a library lock held (shmipc.h): `sink_mu` only guards the pointer and
 * the count of calls in flight, and is released around the call. shmipc__log_set_sink() waits
 * until no call of the old sink is in flight (other than the caller's own, when a sink sets the
 * sink), so once it returns nobody runs the old sink: the caller may free it (a libffi
 * closure, for instance). Sinks are called from any thread, several at once.
 */
static shmipc_log_sink sink;
static pthread_mutex_t sink_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sink_idle = PTHREAD_COND_INITIALIZER;
static int sink_inflight; /* under sink_mu */

/*
 * Records logged while this thread holds a library lock (shmipc__log_defer_begin) wait here,
 * formatted, and are emitted by the shmipc__log_defer_end() that drops the last lock.
 */
#define DEFER_MAX 8
struct deferred {
    int n, dropped;
    int lvl[DEFER_MAX];
    char line[DEFER_MAX][1024];
};
/* Thread-locals stay a few words: the library may be dlopen-ed, where static TLS is scarce. The
 * queue is allocated by the first record deferred and freed when it is emitted. */
static __thread int defer_depth, in_sink;
static __thread struct deferred *defer_q;

int shmipc__log_parse_level(const char *name)
{
    for (int i = 0; i < (int)(sizeof level_names / sizeof level_names[0]); i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

static void read_level(void)
{
    const char *v = shmipc__getenv("SHMIPC_LOG_LEVEL");
    int parsed = v != NULL ? shmipc__log_parse_level(v) : -1;
    if (parsed >= 0)
        level = parsed;
    else if (v != NULL)
        fprintf(stderr, "shmipc: SHMIPC_LOG_LEVEL=%s is not one of off|error|warn|info|debug\n", v);
}

int shmipc__log_level(void)
{
    pthread_once(&level_once, read_level);
    return level;
}

static void emit(int lvl, const char *line)
{
    if (__atomic_load_n(&sink, __ATOMIC_ACQUIRE) != NULL) {
        pthread_mutex_lock(&sink_mu);
        shmipc_log_sink fn = sink;
        if (fn != NULL)
            sink_inflight++;
        pthread_mutex_unlock(&sink_mu);
        if (fn != NULL) {
            in_sink++;
            fn(lvl, line);
            in_sink--;
            pthread_mutex_lock(&sink_mu);
            if (--sink_inflight == 0)
                pthread_cond_broadcast(&sink_idle);
            pthread_mutex_unlock(&sink_mu);
            return;
        }
    }
    /* One write per line so lines from several threads or processes do not interleave. */
    fprintf(stderr, "%s\n", line);
}

void shmipc__log(int lvl, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    int n = snprintf(line, sizeof line, "shmipc[%d] %s: ", (int)getpid(),
                     level_names[lvl > 0 && lvl <= SHMIPC__LOG_DEBUG ? lvl : 1]);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (defer_depth > 0) {
        if (defer_q == NULL && (defer_q = calloc(1, sizeof *defer_q)) == NULL)
            return; /* no memory: the record is lost rather than emitted under a lock */
        if (defer_q->n == DEFER_MAX) {
            defer_q->dropped++;
            return;
        }
        defer_q->lvl[defer_q->n] = lvl;
        memcpy(defer_q->line[defer_q->n++], line, sizeof line);
        return;
    }
    emit(lvl, line);
}

void shmipc__log_defer_begin(void)
{
    defer_depth++;
}

void shmipc__log_defer_end(void)
{
    if (--defer_depth > 0 || defer_q == NULL)
        return;
    /* Detached first: a sink may log again (and defer again) while we emit. */
    struct deferred *q = defer_q;
    defer_q = NULL;
    for (int i = 0; i < q->n; i++)
        emit(q->lvl[i], q->line[i]);
    if (q->dropped > 0)
        shmipc__log(SHMIPC__LOG_WARN, "%d log records dropped (logged under a lock)", q->dropped);
    free(q);
}

/*
 * In a fork child only the forking thread goes on: calls of the sink that other threads of the
 * parent were making at the fork never end there, and one of them may have held sink_mu. Both
 * start over (the forking thread's own call, a sink that forks, stays counted), or the child's
 * shmipc_set_log_sink() waited forever for them (test_fork.c
 * fork_child_sets_the_log_sink_while_a_thread_logs). No prepare handler takes sink_mu around
 * the fork, as the SIGBUS guard's lock is taken (guard.c): the child resets it, which is enough
 * for a lock held a few instructions at a time and never across a sink call.
 */
static void sink_after_fork_child(void)
{
    pthread_mutex_init(&sink_mu, NULL);
    pthread_cond_init(&sink_idle, NULL);
    sink_inflight = in_sink;
}

static pthread_once_t sink_fork_once = PTHREAD_ONCE_INIT;

static void sink_fork_register(void)
{
    /* ENOMEM only; the child then keeps the old risk, which it had before any sink was set. */
    (void)pthread_atfork(NULL, NULL, sink_after_fork_child);
}

void shmipc__log_set_sink(shmipc_log_sink fn)
{
    pthread_once(&sink_fork_once, sink_fork_register);
    pthread_mutex_lock(&sink_mu);
    __atomic_store_n(&sink, fn, __ATOMIC_RELEASE);
    /* A sink that sets the sink must not wait for itself. */
    while (sink_inflight > in_sink)
        pthread_cond_wait(&sink_idle, &sink_mu);
    pthread_mutex_unlock(&sink_mu);
}
