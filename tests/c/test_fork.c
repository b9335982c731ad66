/*
 * Description: the fork rule. A fork() child that closes the sessions, streams, listener and
 * session manager it inherited (or exits through finalizers that do) releases its own copies
 * only: the parent's sessions, their shared memory, its socket file and its pool go on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc_helpers.h"
#include "shmipc.h"
#include "common/log.h"
#include "ipc/session.h"
#include "shm/mapping.h"

#if defined(__SANITIZE_THREAD__)
/* The fork rule: a child never joins its parent's threads (a handshake thread that had ended
 * but was not yet joined at the fork is the parent's to join), and TSan, at the child's exit,
 * reports such a thread as leaked (exit 66 in one CI run of two). Races stay reported. */
const char *__tsan_default_options(void);
const char *__tsan_default_options(void)
{
    return "report_thread_leaks=0";
}
#endif

enum kind { V3_MEMFD, V2_FILES, V4_EVENTFD };

static shmipc_config *config_for(enum kind k)
{
    shmipc_config *cfg;
    assert_int_equal(shmipc_config_new(&cfg), 0);
    assert_int_equal(shmipc_config_set_buffer_capacity(cfg, 1u << 20), 0);
    assert_int_equal(shmipc_config_set_queue_capacity(cfg, 256), 0);
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_READ, IPC_WAIT_MS), 0);
    assert_int_equal(shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_INITIALIZE, IPC_WAIT_MS), 0);
    if (k == V2_FILES)
        assert_int_equal(shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_DEVSHM), 0);
    if (k == V4_EVENTFD)
        assert_int_equal(shmipc_config_with_v4_eventfd(cfg), 0);
    return cfg;
}

/* A session manager being made on a thread, while the test accepts its session. */
struct manager_maker {
    const char *address;
    const shmipc_config *cfg;
    shmipc_session_manager *m;
    int rc;
};

static void *manager_main(void *arg)
{
    struct manager_maker *mm = arg;
    mm->rc = shmipc_session_manager_new(mm->address, mm->cfg, &mm->m);
    return NULL;
}

/* What the child inherits, and the parent goes on using. */
struct world {
    char path[128]; /* the listener's socket file */
    char address[160];
    shmipc_listener *l;
    shmipc_session *c, *s;    /* a client session and its server end */
    shmipc_stream *cst, *sst; /* a stream of theirs */
    shmipc_stream *cst2;      /* another, with data the child's copy never read */
    shmipc_stream *sst2;
    shmipc_session_manager *m;
    shmipc_session *ms;         /* the server end of the manager's session */
    shmipc_stream *mst, *msst;  /* a stream taken from the manager, and its server end */
    shmipc_stream *pooled_peer; /* the server end of the stream in the manager's pool */
};

static void world_open(struct world *w, const shmipc_config *cfg)
{
    static int n;
    memset(w, 0, sizeof *w);
    snprintf(w->path, sizeof w->path, "/tmp/shmipc-test-fork-%d-%d.sock", (int)getpid(), n++);
    snprintf(w->address, sizeof w->address, "unix:%s", w->path);
    assert_int_equal(shmipc_listener_new(w->address, cfg, &w->l), 0);
    ipc_connect_accept(w->l, w->address, cfg, &w->c, &w->s);
    assert_int_equal(shmipc_session_open_stream(w->c, &w->cst), 0);
    w->sst = ipc_ping_pong(w->s, w->cst, NULL);
    /* Bytes waiting unread on the client: the child's copy holds their slices. */
    assert_int_equal(shmipc_session_open_stream(w->c, &w->cst2), 0);
    w->sst2 = ipc_ping_pong(w->s, w->cst2, NULL);
    ipc_send_text(w->sst2, "unread");
    while (shmipc_stream_available(w->cst2) < 6)
        assert_true(shmipc_session_process(w->c) >= 0);

    struct manager_maker mm = {.address = w->address, .cfg = cfg};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, manager_main, &mm), 0);
    assert_int_equal(shmipc_listener_accept(w->l, IPC_WAIT_MS, &w->ms), 0);
    pthread_join(t, NULL);
    assert_int_equal(mm.rc, 0);
    w->m = mm.m;
    /* One stream of the manager's sits in its pool, another is out. */
    shmipc_stream *pooled;
    assert_int_equal(shmipc_session_manager_get_stream(w->m, &pooled), 0);
    w->pooled_peer = ipc_ping_pong(w->ms, pooled, NULL);
    assert_int_equal(shmipc_session_manager_get_stream(w->m, &w->mst), 0);
    w->msst = ipc_ping_pong(w->ms, w->mst, NULL);
    shmipc_session_manager_put_back(w->m, pooled);
}

/*
 * The child: closes everything it inherited, as a binding's finalizers would at its exit, and
 * says in its exit code whether its own copies were released (its descriptors and shared
 * mappings back to what the parent held before the world was made). Exits without running
 * atexit handlers (the test harness's are the parent's).
 */
static int child_closes_everything(struct world *w, const struct ipc_held *before)
{
    int rc = 0;
    /* Its calls on the parent's pool are refused: the sessions are the parent's. */
    shmipc_stream *none = NULL;
    if (shmipc_session_manager_get_stream(w->m, &none) != SHMIPC_ECLOSED || none != NULL)
        rc = 2;
    shmipc_session_manager_put_back(w->m, w->mst);
    shmipc_session_manager_close(w->m);
    /* A flush_close sends nothing from here (not even the close). */
    if (shmipc_stream_flush_close(w->cst) != SHMIPC_ECLOSED && rc == 0)
        rc = 3;
    shmipc_stream_shutdown(w->sst);
    shmipc_stream_close(w->sst);
    shmipc_stream_close(w->cst2); /* with the received bytes its copy holds, unread */
    shmipc_stream_close(w->sst2);
    shmipc_stream_close(w->msst);
    shmipc_stream_close(w->pooled_peer);
    shmipc_session_shutdown(w->c);
    shmipc_session_close(w->c);
    shmipc_session_close(w->s);
    shmipc_session_close(w->ms);
    shmipc_listener_shutdown(w->l);
    shmipc_listener_close(w->l);
    if (ipc_count_fds() != before->fds && rc == 0)
        rc = 4;
    if (ipc_count_shm_maps() != before->maps && rc == 0)
        rc = 5;
    return rc;
}

static void child_closes_what_it_inherited(enum kind k)
{
    shmipc_config *cfg = config_for(k);
    struct world w;
    struct ipc_held before = ipc_held_now();
    world_open(&w, cfg);
    char buffer_path[SHMIPC__SHM_NAME_MAX];
    snprintf(buffer_path, sizeof buffer_path, "%s", w.c->buffer_path);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(30);
        _exit(child_closes_everything(&w, &before));
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);

    /* The parent's sessions live, and their streams carry data both ways. */
    assert_int_equal(shmipc_session_status(w.c), 0);
    assert_int_equal(shmipc_session_status(w.s), 0);
    ipc_ping_pong(w.s, w.cst, w.sst);
    ipc_send_text(w.cst, "after the child");
    ipc_expect_text(w.sst, "after the child");
    /* What the child's copy dropped unread is still the parent's to read. */
    ipc_expect_text(w.cst2, "unread");
    ipc_ping_pong(w.s, w.cst2, w.sst2);
    /* A new stream, and many messages: slices the child's copy held are not handed out twice. */
    shmipc_stream *cst3, *sst3 = NULL;
    assert_int_equal(shmipc_session_open_stream(w.c, &cst3), 0);
    for (int i = 0; i < 200; i++)
        sst3 = ipc_ping_pong(w.s, cst3, sst3);
    assert_int_equal(shmipc_session_status(w.c), 0);
    assert_int_equal(shmipc_session_status(w.s), 0);
    /* The child released its own copies, and was refused the parent's pool. */
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the child failed: %s %d", WIFEXITED(status) ? "exit" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    /* The pool: the stream out, and the one pooled, both still the parent's. */
    ipc_ping_pong(w.ms, w.mst, w.msst);
    shmipc_session_manager_put_back(w.m, w.mst);
    shmipc_stream *again;
    assert_int_equal(shmipc_session_manager_get_stream(w.m, &again), 0);
    ipc_ping_pong(w.ms, again, again == w.mst ? w.msst : w.pooled_peer);
    shmipc_session_manager_put_back(w.m, again);
    /* The files stay: the socket file (a new client connects), and V2's shared-memory files. */
    struct stat sb;
    assert_int_equal(stat(w.path, &sb), 0);
    if (k == V2_FILES)
        assert_int_equal(access(buffer_path, F_OK), 0);
    shmipc_session *c2, *s2;
    ipc_connect_accept(w.l, w.address, cfg, &c2, &s2);
    shmipc_session_close(c2);
    shmipc_session_close(s2);

    shmipc_stream_close(cst3);
    shmipc_stream_close(sst3);
    shmipc_stream_close(w.cst);
    shmipc_stream_close(w.sst);
    shmipc_stream_close(w.cst2);
    shmipc_stream_close(w.sst2);
    shmipc_stream_close(w.msst);
    shmipc_stream_close(w.pooled_peer);
    shmipc_session_manager_close(w.m);
    shmipc_session_close(w.c);
    shmipc_session_close(w.s);
    shmipc_session_close(w.ms);
    shmipc_listener_close(w.l);
    /* And the parent's own close does remove them. */
    assert_int_not_equal(stat(w.path, &sb), 0);
    if (k == V2_FILES)
        assert_int_not_equal(access(buffer_path, F_OK), 0);
    ipc_assert_held(&before);
    shmipc_config_free(cfg);
}

/*
 * Regression: a child that closed what it inherited across fork() ended its parent's sessions:
 * the session close shut the shared socket down (the peer saw the connection end), a stream's
 * close put a close element in the parent's queue and gave the slices it held back to the
 * shared free lists (which the parent then handed out twice), the listener's close removed the
 * parent's socket file and joined threads the child does not have, and V2 files were removed.
 * Now close in a process other than the maker releases that process's copies only.
 */
static void fork_child_closes_inherited_v3(void **state)
{
    (void)state;
    child_closes_what_it_inherited(V3_MEMFD);
}

static void fork_child_closes_inherited_v2(void **state)
{
    (void)state;
    child_closes_what_it_inherited(V2_FILES);
}

static void fork_child_closes_inherited_v4_eventfd(void **state)
{
    (void)state;
    child_closes_what_it_inherited(V4_EVENTFD);
}

/*
 * A thread that keeps the SIGBUS guard busy until told to stop: it maps and unmaps shared
 * memory (each mapping is registered and unregistered under the guard's registry lock), and
 * with `fault` it shrinks each file first and touches a page past the end, so that the guard's
 * handler is often in flight.
 */
struct guard_churn {
    atomic_int stop;
    int fault;
    unsigned long rounds;
};

static void *guard_churn_main(void *arg)
{
    struct guard_churn *g = arg;
    while (!atomic_load(&g->stop)) {
        struct shmipc__mapping m;
        shmipc__mapping_init(&m);
        if (shmipc__mapping_create_memfd(&m, "/fork-churn", 1u << 16) < 0)
            continue;
        if (g->fault && ftruncate(m.fd, 0) == 0)
            (void)*(volatile uint8_t *)((uint8_t *)m.base +
                                        8192); /* SIGBUS, which the guard takes */
        shmipc__mapping_unmap(&m);
        g->rounds++;
    }
    return NULL;
}

/*
 * Forks while the churn thread runs, up to FORKS times or for FORK_SECONDS; each child closes
 * the session pair it inherited and exits. A child still there after CHILD_SECONDS hangs.
 */
enum { FORKS = 200, FORK_SECONDS = 5, CHILD_SECONDS = 5 };

/*
 * Forks up to FORKS times or for FORK_SECONDS, stopping at the first hang; each child runs
 * `child(arg)` and exits 0. A child still there after CHILD_SECONDS hangs (it is killed). The
 * number of forks; *hung and *failed count the children that hung and that exited otherwise.
 */
static int fork_children(void (*child)(void *), void *arg, int *hung, int *failed)
{
    int forks = 0;
    uint64_t t0 = ipc_now_ms();
    *hung = *failed = 0;
    while (forks < FORKS && ipc_now_ms() - t0 < FORK_SECONDS * 1000 && *hung == 0) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            child(arg);
            _exit(0);
        }
        forks++;
        int status = 0;
        pid_t got = 0;
        uint64_t w0 = ipc_now_ms();
        while ((got = waitpid(pid, &status, WNOHANG)) == 0 &&
               ipc_now_ms() - w0 < CHILD_SECONDS * 1000)
            usleep(1000);
        if (got == 0) {
            (*hung)++;
            kill(pid, SIGKILL);
            assert_int_equal(waitpid(pid, &status, 0), pid);
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            (*failed)++;
        }
    }
    return forks;
}

struct inherited {
    shmipc_listener *l;
    shmipc_session *c, *s;
};

/* The guard's lock, or its count of handlers in flight, as the fork left them. */
static void child_closes_the_pair(void *arg)
{
    struct inherited *in = arg;
    shmipc_session_close(in->c);
    shmipc_session_close(in->s);
    shmipc_listener_close(in->l);
}

static void fork_while_guard_busy(int fault)
{
    shmipc_config *cfg = config_for(V3_MEMFD);
    struct ipc_held before = ipc_held_now();
    char address[128];
    shmipc_listener *l;
    shmipc_session *c, *s;
    ipc_pick_address(address, sizeof address, fault ? "fork-guard-fault" : "fork-guard-map");
    assert_int_equal(shmipc_listener_new(address, cfg, &l), 0);
    ipc_connect_accept(l, address, cfg, &c, &s);

    struct guard_churn g = {.fault = fault};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, guard_churn_main, &g), 0);
    struct inherited in = {l, c, s};
    int hung, failed, forks = fork_children(child_closes_the_pair, &in, &hung, &failed);
    atomic_store(&g.stop, 1);
    pthread_join(t, NULL);
    print_message("%d forks, %lu mappings made meanwhile\n", forks, g.rounds);
    assert_int_equal(hung, 0);
    assert_int_equal(failed, 0);
    assert_true(g.rounds > 0);
    /* The parent's session is untouched. */
    assert_int_equal(shmipc_session_status(c), 0);
    shmipc_stream *cst;
    assert_int_equal(shmipc_session_open_stream(c, &cst), 0);
    shmipc_stream *sst = ipc_ping_pong(s, cst, NULL);
    shmipc_stream_close(cst);
    shmipc_stream_close(sst);
    shmipc_session_close(c);
    shmipc_session_close(s);
    shmipc_listener_close(l);
    ipc_assert_held(&before);
    shmipc_config_free(cfg);
}

/*
 * Regression: a fork child's close of an inherited session unregisters its mappings from the
 * SIGBUS guard, under the guard's registry lock. When another thread of the parent held that
 * lock at the fork (mapping or unmapping shared memory), the child's copy of it stayed held
 * for good and the child's close hung forever. Now the guard takes the lock around fork()
 * (pthread_atfork), so the child gets it free.
 */
static void fork_child_close_while_a_thread_maps(void **state)
{
    (void)state;
    fork_while_guard_busy(0);
}

/*
 * Regression: the same close waits until no SIGBUS handler is between its lookup and its last
 * use of a slot. A handler in flight on another thread of the parent at the fork stayed counted
 * in the child, where no thread ever finished it: the child's close spun forever. Now the
 * count starts from zero in the child.
 */
static void fork_child_close_while_a_thread_faults(void **state)
{
    (void)state;
    fork_while_guard_busy(1);
}

/* A log sink that takes its time, so that a thread is often inside it when the main forks. */
static atomic_ulong sink_calls;

static void slow_sink(int level, const char *line)
{
    (void)level;
    (void)line;
    atomic_fetch_add(&sink_calls, 1);
    usleep(200);
}

static void quiet_sink(int level, const char *line)
{
    (void)level;
    (void)line;
}

/* The sink's lock, or its count of calls in flight, as the fork left them. */
static void child_sets_the_sink(void *arg)
{
    (void)arg;
    shmipc_set_log_sink(quiet_sink);
    shmipc__log(SHMIPC__LOG_ERROR, "fork test: a line from the child");
    shmipc_set_log_sink(NULL);
}

struct log_churn {
    atomic_int stop;
};

/* Logs through the library's own logger, as its threads do, until told to stop. */
static void *log_churn_main(void *arg)
{
    struct log_churn *lc = arg;
    while (!atomic_load(&lc->stop))
        shmipc__log(SHMIPC__LOG_ERROR, "fork test: a line from the churn thread");
    return NULL;
}

/*
 * Regression: a thread of the parent inside the log sink at the fork stayed counted as a call
 * in flight in the child, where it never ends: the child's shmipc_set_log_sink() (which waits
 * until the old sink is idle, so that the caller may free it) waited forever. Now the count
 * (and the sink's lock, which a parent thread may have held at the fork too) start over in the
 * child, which has no other thread.
 */
static void fork_child_sets_the_log_sink_while_a_thread_logs(void **state)
{
    (void)state;
    struct log_churn lc = {0};
    pthread_t t;
    atomic_store(&sink_calls, 0);
    shmipc_set_log_sink(slow_sink);
    assert_int_equal(pthread_create(&t, NULL, log_churn_main, &lc), 0);
    int hung, failed, forks = fork_children(child_sets_the_sink, NULL, &hung, &failed);
    atomic_store(&lc.stop, 1);
    pthread_join(t, NULL);
    shmipc_set_log_sink(NULL);
    print_message("%d forks, %lu sink calls meanwhile\n", forks, atomic_load(&sink_calls));
    assert_int_equal(hung, 0);
    assert_int_equal(failed, 0);
    assert_true(atomic_load(&sink_calls) > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fork_child_closes_inherited_v3),
        cmocka_unit_test(fork_child_closes_inherited_v2),
        cmocka_unit_test(fork_child_closes_inherited_v4_eventfd),
        cmocka_unit_test(fork_child_close_while_a_thread_maps),
        cmocka_unit_test(fork_child_close_while_a_thread_faults),
        cmocka_unit_test(fork_child_sets_the_log_sink_while_a_thread_logs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
