/*
 * shmipc-bench-ws, internal: what the files of bench/ws/ share (options, targets, connections,
 * cells, results) and the functions and globals one file defines for another. Like a user's
 * program, the benchmark sees only the public header.
 */
#ifndef SHMIPC_BENCH_WS_H
#define SHMIPC_BENCH_WS_H

#include <shmipc.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SHMIPC_BENCH_BUILDTYPE
#define SHMIPC_BENCH_BUILDTYPE "unknown"
#endif

#define MAX_LIST    8
#define MAX_TARGETS 6
#define MAX_ROUNDS  9
#define MAX_PAYLOAD (64u << 20)
/* Frames kept ready per cell; consecutive messages use the next one, so no two in a row are
 * the same bytes (other payload offset, other mask key). */
#define NFRAMES 4
/* Connections opened (connect + upgrade) before their responses are awaited. */
#define OPEN_BATCH 256
/* The longest the client waits without any progress before it calls a server stalled. */
#define STALL_MS 20000
/* RFC 6455's example key and its accept value: every upgrade of the client sends this key. */
#define WS_KEY    "dGhlIHNhbXBsZSBub25jZQ=="
#define WS_ACCEPT "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="

enum kind { K_TCP, K_OURS, K_NODE };

struct target {
    char name[32]; /* "tcp", "ours", "ours-epoll", "ours-io_uring", "node" */
    enum kind kind;
    char backend[16]; /* ours: what --backend asks for, "" for the example's default */
    pid_t pid;
    int port;
};

/* The options (see usage()). */
struct ws_opts {
    uint64_t sizes[MAX_LIST], conns[MAX_LIST], conns_large[MAX_LIST];
    int nsizes, nconns, nconns_large;
    uint64_t large; /* sizes from here use conns_large */
    int rounds;
    int samples; /* fewest timed round trips per connection */
    uint64_t cell_rts, cell_bytes;
    int warmup; /* untimed round trips per connection; -1: a tenth of the samples, >= 10 */
    char targets[MAX_TARGETS][32];
    int ntargets;
    int workers;
    const char *ws_echo, *ws_path, *npm_dir;
    int server_cpu, client_cpu;
    int idle;      /* connections of the idle measurement; 0: none */
    int idle_only; /* --idle given: only the idle measurement */
    int quick;
    const char *json, *md;
};
struct conn {
    int fd;
    int k;          /* the frame in flight */
    size_t sent;    /* its bytes written */
    int want_out;   /* EPOLLOUT is on */
    int in_flight;  /* a message is out, its echo not all back */
    uint8_t *rx;    /* what arrived of the echo */
    size_t rx_have; /* bytes in rx */
    size_t rx_pos;  /* frames parsed (WebSocket) */
    size_t got;     /* payload bytes of the echo checked (WebSocket) */
    uint64_t t0;    /* when the message's first byte was written */
    int done;       /* round trips completed in this cell */
};

/* The frames of one cell: the same payload at different offsets of a random pattern, each
 * masked with its own key, as a browser would send them. */
struct frames {
    size_t size, frame_len, hdr;
    uint8_t *payload[NFRAMES]; /* what the echo must carry (WebSocket) */
    uint8_t *frame[NFRAMES];   /* the bytes on the wire (what the TCP echo returns) */
};
struct cell {
    double p[5]; /* p50, p90, p99, p99.9, max in µs, over the samples of every round */
    double p50_round[MAX_ROUNDS];
    double rt_per_s, mib_per_s;
    double server_cpu_us; /* server CPU time per round trip */
    long samples;
};

/* What one pass (one round of a cell on one server) measured. */
struct pass {
    long completed;  /* round trips, warm-up and tail included */
    uint64_t ns;     /* wall time */
    uint64_t cpu_ns; /* the server's CPU time */
};

struct loop {
    const struct target *t;
    struct frames *fr;
    struct conn *c;
    int n, ep;
    int warm, timed;
    uint64_t *lat; /* n x timed */
    int stopping;  /* no new messages: drain */
    long completed, in_flight;
};
struct memstat {
    long vmrss_kib, rssanon_kib, heap_kib;
};

struct idle_result {
    int conns;
    struct memstat before, open, used;
    double open_ms;
};
struct plan { /* a cell of the run */
    size_t size;
    int conns;
};

/* The bar of issue 6, for one of our targets; -1 when a peer or cell it needs was not run. */
struct bar {
    int tcp64, node, tcp1m, scale;
    double worst_tcp64, worst_node, worst_tcp1m, scale_ratio;
};

/* main.c */
extern struct ws_opts opt;
extern struct plan plan[MAX_LIST * MAX_LIST * 2];
extern char self_exe[4096], ws_echo_path[4096], tmpdir[256];
extern char node_version[64], ws_version[64];
extern struct target targets[MAX_TARGETS];
extern int ntargets;
extern int nplan;
extern struct cell med[MAX_TARGETS][MAX_LIST * MAX_LIST * 2];
extern struct idle_result idle[MAX_TARGETS];
extern int idle_done[MAX_TARGETS];
int find_target(enum kind k);
int find_cell(size_t size, int conns);

/* common.c */
extern pid_t children[MAX_TARGETS * 2];
extern int nchildren;
void on_stop_signal(int sig);
__attribute__((noreturn, format(printf, 1, 2))) void die(const char *fmt, ...);
uint64_t now_ns(void);
void sleep_ms(int ms);
int have(const char *prog);
void pin(int cpu);
int parse_bytes(const char *s, uint64_t *out);
int parse_list(const char *s, uint64_t *out, uint64_t lo, uint64_t hi);
void fmt_size(char *buf, size_t cap, uint64_t v);
double loadavg(void);
int free_port(void);
int set_nonblock(int fd, int on);

/* tcp_echo.c */
int tcp_echo(int port);

/* servers.c */
int tcp_connect(int port);
void start_target(struct target *t);
void stop_target(struct target *t);
uint64_t server_cpu_ns(pid_t pid);
int node_prepare(void);

/* client.c */
extern uint8_t *pattern;
uint32_t rnd(void);
void frames_make(struct frames *fr, size_t size);
void frames_free(struct frames *fr);
struct conn *conns_open(const struct target *t, int n);
void conns_close(const struct target *t, struct conn *c, int n);

/* cell.c */
int cmp_u64(const void *a, const void *b);
int samples_for(uint64_t size, int n);
void run_pass(const struct target *t, struct conn *c, int n, size_t size, int timed, int warm,
              uint64_t *lat, struct pass *out);
double percentile_us(const uint64_t *sorted, long n, double q);
void cell_sum(struct cell *m, uint64_t *lat, long per_round, const struct pass *ps, size_t size);

/* idle.c */
void idle_measure(struct target *t, int n, struct idle_result *r);
double per_conn(long after_kib, long before_kib, int n);

/* report_text.c */
void bar_eval(int t, struct bar *b);
void env_line(char *buf, size_t cap, double load0, double load1);
void write_md(FILE *f, const char *env);

/* report_json.c */
void write_json(const char *env, const char *command, time_t started, double load0, double load1);

#endif
