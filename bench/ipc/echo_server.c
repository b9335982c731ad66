/*
 * shmipc-bench ipc, echo server process: its one poll() loop over the listener, the shmipc
 * sessions and the socket connections (--serve runs it alone), and the forked local server the
 * run drives over its control socket.
 */
#include "ipc_bench.h"

static volatile sig_atomic_t server_stop;

static void server_on_signal(int sig)
{
    (void)sig;
    server_stop = 1;
}

int grow(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return 0;
    int n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = realloc(*arr, (size_t)n * elem);
    if (p == NULL)
        return -1;
    *arr = p;
    *cap = n;
    return 0;
}

static void accept_sessions(struct server *sv)
{
    for (;;) {
        shmipc_session *s;
        int rc = shmipc_listener_accept(sv->l, 0, &s);
        if (rc == SHMIPC_EAGAIN)
            return;
        if (rc < 0) {
            shm_fail("server: accept session", rc);
            return;
        }
        if (grow((void **)&sv->sess, &sv->sess_cap, sv->nsess + 1, sizeof *sv->sess) < 0) {
            shmipc_session_close(s);
            fprintf(stderr, "shmipc-bench: server: out of memory\n");
            return;
        }
        sv->sess[sv->nsess++] = (struct ssession){
            .s = s, .polling = shmipc_session_wakeup(s, NULL) == SHMIPC_WAKEUP_POLLING};
    }
}

/* Reads and acknowledges the benchmark's commands; 1 when it closed its end (or failed). */
static int server_command(struct server *sv)
{
    char cmd[16];
    ssize_t n = read(sv->ctl_fd, cmd, sizeof cmd);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    if (n <= 0)
        return 1;
    for (ssize_t i = 0; i < n; i++) {
        if (cmd[i] == 'P' || cmd[i] == 'p')
            sv->watch_polling = cmd[i] == 'P';
        if (write(sv->ctl_fd, "A", 1) != 1)
            return 1;
    }
    return 0;
}

/* Turns served by a spin in a row before the loop polls its other descriptors once. */
#define LOOK_EVERY 16u

static int server_loop(struct server *sv)
{
    struct pollfd *pfd = NULL;
    int pcap = 0, status = 0;
    uint64_t last_sweep = now_ns();
    unsigned quiet_turns = 0; /* turns served by a spin without a poll */
    while (!server_stop) {
        if (sv->sessions_limit > 0 && sv->sessions_done >= sv->sessions_limit)
            break;
        if (grow((void **)&pfd, &pcap, 4 + sv->nsess + sv->nconns, sizeof *pfd) < 0) {
            fprintf(stderr, "shmipc-bench: server: out of memory\n");
            status = -1;
            break;
        }
        int k = 0, i_ctl = -1, i_l = -1, i_uds = -1, i_tcp = -1;
        if (sv->ctl_fd >= 0)
            i_ctl = k, pfd[k++] = (struct pollfd){.fd = sv->ctl_fd, .events = POLLIN};
        if (sv->l != NULL)
            i_l = k,
            pfd[k++] = (struct pollfd){.fd = shmipc_listener_fileno(sv->l), .events = POLLIN};
        if (sv->uds_fd >= 0)
            i_uds = k, pfd[k++] = (struct pollfd){.fd = sv->uds_fd, .events = POLLIN};
        if (sv->tcp_fd >= 0)
            i_tcp = k, pfd[k++] = (struct pollfd){.fd = sv->tcp_fd, .events = POLLIN};
        int ns = sv->nsess;
        for (int i = 0; i < ns; i++) {
            struct ssession *ss = &sv->sess[i];
            ss->pi = -1;
            if (ss->polling && !sv->watch_polling && sv->ctl_fd >= 0)
                continue;
            ss->pi = k;
            pfd[k++] = (struct pollfd){.fd = shmipc_session_fileno(ss->s), .events = POLLIN};
        }
        int c0 = k, nc = sv->nconns;
        for (int i = 0; i < nc; i++)
            pfd[k++] = (struct pollfd){.fd = sv->conns[i].fd,
                                       .events = sv->conns[i].msg > 0 ? POLLOUT : POLLIN};
        /*
         * Before sleeping, spin on the session that had news last (shmipc_session_spin): a
         * client in a ping-pong sends its next request within the spin, with no wakeup.
         */
        int spun = 0;
        if (sv->last >= 0 && !sv->sess[sv->last].polling) {
            int li = sv->last, src = shmipc_session_spin(sv->sess[li].s);
            if (src != 0) {
                /* Served; the poll below only looks (so other descriptors are not starved). */
                spun = 1;
                if (ssession_took(&sv->sess[li], now_ns(), src) < 0) {
                    ssession_end(sv, li);
                    continue; /* the pollfd set no longer matches the sessions */
                }
            }
        }
        /*
         * After a spin that served, the other descriptors are looked at only every
         * LOOK_EVERY turns: a poll is a system call, about what the rest of a round trip
         * costs, and the session just served answers again within the next spin.
         */
        int rc = 0;
        if (!spun || ++quiet_turns >= LOOK_EVERY) {
            quiet_turns = 0;
            rc = poll(pfd, (nfds_t)k, spun ? 0 : sv->nsess > 0 ? (int)(STALE_NS / 1000000u) : 1000);
        }
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            status = sys_fail("server: poll");
            break;
        }
        uint64_t now = now_ns();
        if (rc > 0 && i_ctl >= 0 && pfd[i_ctl].revents && server_command(sv) != 0)
            break; /* the benchmark closed its end: the run is over */
        /* Backwards, so that removing entry i (swapping in the last) keeps i-1..0 in place. */
        for (int i = rc > 0 ? ns - 1 : -1; i >= 0; i--) {
            int pi = sv->sess[i].pi;
            if (pi >= 0 && pfd[pi].revents) {
                sv->last = i;
                if (ssession_ready(&sv->sess[i], now) < 0)
                    ssession_end(sv, i);
            }
        }
        for (int i = rc > 0 ? nc - 1 : -1; i >= 0; i--)
            if (pfd[c0 + i].revents) {
                sv->last = -1; /* a socket peer is the busy one: no spinning on a session */
                if (sconn_ready(&sv->conns[i], pfd[c0 + i].revents) < 0)
                    sconn_close(sv, i);
            }
        if (rc > 0 && i_l >= 0 && pfd[i_l].revents)
            accept_sessions(sv);
        if (rc > 0 && i_uds >= 0 && pfd[i_uds].revents)
            accept_conns(sv, sv->uds_fd, 0);
        if (rc > 0 && i_tcp >= 0 && pfd[i_tcp].revents)
            accept_conns(sv, sv->tcp_fd, 1);
        if (now - last_sweep >= STALE_NS) {
            /* Streams quiet for a while may have been closed among other events: look. */
            for (int i = sv->nsess - 1; i >= 0; i--)
                if (ssession_pump(&sv->sess[i], now, PROBE_STALE) < 0)
                    ssession_end(sv, i);
            last_sweep = now;
        }
    }
    free(pfd);
    while (sv->nsess > 0)
        ssession_end(sv, sv->nsess - 1);
    while (sv->nconns > 0)
        sconn_close(sv, sv->nconns - 1);
    return status;
}

static void server_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = server_on_signal; /* no SA_RESTART: poll() returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* --serve ADDR: only the shmipc echo server, until killed or --sessions have ended. */
int serve_main(const struct opts *o)
{
    struct env e;
    shmipc_config *cfg = NULL;
    struct server sv = {.uds_fd = -1, .tcp_fd = -1, .ctl_fd = -1, .last = -1};
    int rc;
    server_signals();
    env_probe(&e, o->pin);
    if (e.pinned && pin_to(e.server_cpu) < 0)
        return 1;
    if (make_config(o, T_V3, &cfg) < 0)
        return 1;
    if ((rc = shmipc_listener_new(o->serve_addr, cfg, &sv.l)) < 0) {
        shmipc_config_free(cfg);
        return shm_fail("listen", rc) < 0 ? 1 : 0;
    }
    sv.sessions_limit = o->serve_sessions;
    printf("shmipc-bench: echo server (shmipc %s) listening on %s, V2, V3 and V4; %s\n",
           shmipc_version_string(), o->serve_addr,
           e.pinned ? "pinned to the second allowed CPU" : "not pinned");
    if (e.pinned)
        printf("shmipc-bench: server on CPU %d; pin the client elsewhere (taskset -c %d)\n",
               e.server_cpu, e.client_cpu);
    fflush(stdout);
    rc = server_loop(&sv);
    shmipc_listener_close(sv.l);
    shmipc_config_free(cfg);
    printf("shmipc-bench: served %d session(s)\n", sv.sessions_done);
    return rc < 0 ? 1 : 0;
}

/* ------------------------------------------------------------------------------------ */
/* The local server process                                                             */
/* ------------------------------------------------------------------------------------ */

static void server_child(const struct opts *o, const struct env *e, const struct local *lc, int ctl,
                         int uds_fd, int tcp_fd, pid_t parent)
{
    struct server sv = {.uds_fd = uds_fd, .tcp_fd = tcp_fd, .ctl_fd = ctl, .last = -1};
    shmipc_config *cfg = NULL;
    int rc, status = 1;
    server_signals();
    /* The server must not outlive the benchmark, whatever ends it. */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
        _exit(1);
    if (e->pinned && pin_to(e->server_cpu) < 0)
        _exit(1);
    fcntl(uds_fd, F_SETFL, O_NONBLOCK);
    fcntl(tcp_fd, F_SETFL, O_NONBLOCK);
    if (make_config(o, T_V3, &cfg) < 0)
        _exit(1);
    if ((rc = shmipc_listener_new(lc->shm_addr, cfg, &sv.l)) < 0) {
        shm_fail("server: listen", rc);
        _exit(1);
    }
    if (write(ctl, "R", 1) == 1 && server_loop(&sv) == 0)
        status = 0;
    shmipc_listener_close(sv.l);
    shmipc_config_free(cfg);
    close(uds_fd);
    close(tcp_fd);
    fflush(stderr);
    _exit(status);
}

/* Forks the echo server, pinned to the second CPU, and waits until it listens. */
int server_start(const struct opts *o, const struct env *e, struct local *lc)
{
    int ctl[2], uds_fd = -1, tcp_fd = -1;
    char ready;
    snprintf(lc->dir, sizeof lc->dir, "/tmp/shmipc-bench-XXXXXX");
    lc->ctl_fd = -1;
    if (mkdtemp(lc->dir) == NULL) {
        lc->dir[0] = '\0';
        return sys_fail("mkdtemp /tmp/shmipc-bench-XXXXXX");
    }
    snprintf(lc->shm_addr, sizeof lc->shm_addr, "unix:%s/shmipc.sock", lc->dir);
    snprintf(lc->uds_path, sizeof lc->uds_path, "%s/uds.sock", lc->dir);
    if ((uds_fd = listen_unix(lc->uds_path)) < 0 || (tcp_fd = listen_tcp(&lc->tcp_port)) < 0)
        goto err;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) != 0) {
        sys_fail("socketpair");
        goto err;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        sys_fail("fork");
        close(ctl[0]);
        close(ctl[1]);
        goto err;
    }
    if (pid == 0) {
        close(ctl[0]);
        server_child(o, e, lc, ctl[1], uds_fd, tcp_fd, parent);
    }
    server_pid = pid;
    server_clock_ok = clock_getcpuclockid(pid, &server_clock) == 0;
    close(ctl[1]);
    close(uds_fd);
    close(tcp_fd);
    lc->ctl_fd = ctl[0];
    struct pollfd p = {.fd = lc->ctl_fd, .events = POLLIN};
    if (poll(&p, 1, 10000) != 1 || read(lc->ctl_fd, &ready, 1) != 1 || ready != 'R') {
        fprintf(stderr, "shmipc-bench: the echo server did not start\n");
        return -1;
    }
    return 0;
err:
    if (uds_fd >= 0)
        close(uds_fd);
    if (tcp_fd >= 0)
        close(tcp_fd);
    return -1;
}

/*
 * Tells the local server to watch polling sessions or to leave them out of poll() (see
 * struct server), and waits for its acknowledgement. A no-op without a local server.
 */
int server_watch_polling(struct local *lc, int on)
{
    char c = on ? 'P' : 'p', ack;
    if (lc->ctl_fd < 0 || lc->watching == on)
        return 0;
    if (write(lc->ctl_fd, &c, 1) != 1)
        return sys_fail("server control socket");
    struct pollfd p = {.fd = lc->ctl_fd, .events = POLLIN};
    if (poll(&p, 1, HANDSHAKE_MS) != 1 || read(lc->ctl_fd, &ack, 1) != 1 || ack != 'A') {
        fprintf(stderr, "shmipc-bench: the echo server did not acknowledge a command\n");
        return -1;
    }
    lc->watching = on;
    return 0;
}

/* Stops the server (closing the control socket tells it to) and reaps it; -1 if it failed. */
int server_stop_and_reap(struct local *lc)
{
    int status = 0, rc = 0;
    if (lc->ctl_fd >= 0)
        close(lc->ctl_fd);
    lc->ctl_fd = -1;
    if (server_pid > 0) {
        uint64_t deadline = now_ns() + 5000000000ull;
        pid_t r;
        while ((r = waitpid(server_pid, &status, WNOHANG)) == 0 && now_ns() < deadline) {
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
        if (r == 0) {
            fprintf(stderr, "shmipc-bench: the echo server did not stop; killing it\n");
            kill(server_pid, SIGKILL);
            waitpid(server_pid, &status, 0);
            rc = -1;
        } else if (r < 0) {
            rc = sys_fail("waitpid");
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "shmipc-bench: the echo server failed (%s %d)\n",
                    WIFEXITED(status) ? "exit status" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            rc = -1;
        }
        server_pid = -1;
    }
    if (lc->dir[0] != '\0') {
        unlink(lc->uds_path);
        /* The listener removes its socket file: one a clean exit left behind is a bug. */
        if (unlink(lc->shm_addr + 5) == 0 && rc == 0)
            fprintf(stderr, "shmipc-bench: note: %s was left behind by the listener\n",
                    lc->shm_addr + 5);
        if (rmdir(lc->dir) != 0)
            sys_fail(lc->dir);
        lc->dir[0] = '\0';
    }
    return rc;
}

/* Removes what this run left in /dev/shm, saying so: a clean run leaves nothing. */
int devshm_check(void)
{
    char prefix[64];
    int left = 0;
    snprintf(prefix, sizeof prefix, "shmipc-bench-%ld", (long)getpid());
    DIR *d = opendir("/dev/shm");
    if (d == NULL)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "/dev/shm/%s", de->d_name);
        fprintf(stderr, "shmipc-bench: left behind in /dev/shm, removing: %s\n", path);
        unlink(path);
        left++;
    }
    closedir(d);
    return left;
}
