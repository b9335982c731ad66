/*
 * shmipc-bench ipc, internal: what the files of bench/ipc/ share (options, results, the echo
 * server's and the client's state) and the functions and globals one file defines for another.
 * Like a user's program, the benchmark sees only the public header.
 */
#ifndef SHMIPC_BENCH_IPC_H
#define SHMIPC_BENCH_IPC_H

#include <shmipc.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SHMIPC_BENCH_BUILDTYPE
#define SHMIPC_BENCH_BUILDTYPE "unknown"
#endif

#define MAX_SIZES  32
#define MAX_COUNTS 16
#define MAX_ROUNDS 15
#define MAX_SIZE   (64u << 20)
#define HDR        4u
/* Messages start at one of this many offsets into the pattern, so consecutive ones differ. */
#define PATTERN_SLACK 64u
#define HANDSHAKE_MS  10000

/* The default run order. The V4 transports differ only in the wakeup the client asks for. */
enum transport { T_V3, T_V2, T_V4, T_V4E, T_V4P, T_UDS, T_TCP, T_COUNT };

struct opts {
    size_t sizes[MAX_SIZES];
    int nsizes;
    int counts[MAX_COUNTS]; /* stream counts of the parallel shape */
    int ncounts;
    int transports[T_COUNT]; /* in run order */
    int ntransports;
    int rounds;
    int samples_max, samples_min; /* one-stream round trips per size: clamp(bytes / size) */
    uint64_t sample_bytes;
    int duration_ms, warmup_ms; /* per parallel cell */
    uint64_t max_inflight;      /* cap on streams x size in the parallel shape */
    uint64_t buffer;
    char slices[256];
    uint32_t queue;
    uint32_t polling_us;
    int spin_us; /* the spin cap of both peers' configs; -1: the library's default */
    int idle_ms; /* CPU of each transport's idle session measured over this long; 0: not */
    int pin;
    int quick;
    int warm; /* warm the shmipc sessions up before the rounds */
    const char *json_path, *md_path;
    const char *connect_addr, *serve_addr;
    int serve_sessions;
    char command[2048];
};

struct env {
    char kernel[400];
    char cpu_model[256];
    long cpus;
    int pinned, client_cpu, server_cpu;
    char pinning[200];
    char load_start[64], load_end[64]; /* /proc/loadavg: how busy the machine was */
};
/* ------------------------------------------------------------------------------------ */
/* The echo server                                                                      */
/* ------------------------------------------------------------------------------------ */

/*
 * One thread serves everything: the shmipc listener and its sessions (each session's
 * streams multiplexed over one descriptor), and the unix and TCP echo connections, all in
 * one poll() set.
 */
struct sstream {
    shmipc_stream *st;
    uint8_t hdr[HDR];
    uint32_t hdr_got; /* bytes of the current message's length read so far */
    uint64_t left;    /* payload bytes of the current message still to echo */
    uint64_t last_ns; /* when it last had data */
};

/* How sstream_serve() decides to read a stream. */
enum probe {
    PROBE_NONE,  /* only when bytes are available */
    PROBE_ALL,   /* once anyway: finds streams the peer closed */
    PROBE_STALE, /* once anyway when the stream has been quiet for STALE_NS */
};
/* A stream quiet this long is probed for a close that came among other events. */
#define STALE_NS (50ull * 1000000u)

struct ssession {
    shmipc_session *s;
    struct sstream *streams;
    int n, cap;
    int polling; /* negotiated V4 event-queue polling: its descriptor fires every interval */
    int pi;      /* its entry in this turn's poll() set, or -1 */
};

struct sconn {
    int fd;
    uint8_t *buf;
    size_t cap, have; /* bytes read and not yet echoed */
    size_t msg;       /* length of the message being written back, 0 while reading */
    size_t sent;
};

/*
 * The control socket of the local server (ctl_fd) carries one-byte commands from the
 * benchmark, each acknowledged with 'A': 'P' watch polling sessions, 'p' stop watching them.
 * Its end (EOF) stops the server. A polling session's descriptor fires every interval
 * whether or not the session carries anything, so while other transports are measured the
 * server leaves it out of poll(): its timer would otherwise wake the server every interval,
 * taking CPU from the measured transport and adding to its server CPU time. What watching an
 * idle polling session costs is measured on its own (idle_server_cpu()).
 */
struct server {
    shmipc_listener *l;
    int uds_fd, tcp_fd, ctl_fd;
    int watch_polling;
    struct ssession *sess;
    int nsess, sess_cap;
    struct sconn *conns;
    int nconns, conns_cap;
    int sessions_done, sessions_limit;
    int last; /* the session that had news last turn (spun on before poll()), or -1 */
};

struct local {
    char dir[64];
    char shm_addr[128];
    char uds_path[96]; /* fits sockaddr_un.sun_path */
    uint16_t tcp_port;
    int ctl_fd;
    int watching; /* the server watches polling sessions (see struct server) */
};

/* One transport's client side for one round: an shmipc session, or where to connect. */
struct client {
    int t;
    shmipc_session *sess;
    uint32_t window; /* largest reserve window: the largest slice class */
    double connect_secs;
    int version, wakeup; /* what the session negotiated */
    uint32_t interval_us;
    const char *uds_path;
    uint16_t tcp_port;
};

/* One stream or connection. */
struct chan {
    shmipc_stream *st;
    int fd;
    uint8_t *buf; /* sockets: the message written, then the echo read */
};

/*
 * A one-stream cell's figures: the latency percentiles, then the CPU time per round trip of
 * the client, of the echo server and of both (µs; negative where the server's CPU time is
 * not known: an external server), then the wall time per round trip (the mean).
 */
enum { P50, P90, P99, P999, PMAX, NPCT, CPU_CLIENT = NPCT, CPU_SERVER, CPU_TOTAL, WALL_MEAN, NVAL };

struct lat_cell {
    double us[NVAL];
    int samples;
    int done;
};

struct par_cell {
    double rtps, mibps, secs;
    long batches;
    int done;
};

/* What a session negotiated, and what its untimed warm-up cost. */
struct warm {
    int opened;
    int version, wakeup;
    uint32_t interval_us;
    double connect_secs; /* the handshake, which lays the buffer out */
    uint64_t round_trips;
    double secs;
};

struct results {
    const struct opts *o;
    int rounds_done;
    struct lat_cell *lat;           /* [size][transport][round] */
    struct par_cell *par;           /* [size][count][transport][round] */
    int eff[MAX_SIZES][MAX_COUNTS]; /* streams used; 0 when it repeats an earlier count */
    int has[T_COUNT];
};

/* main.c */
extern int io_timeout_ms;
extern int echo_copy;

/* common.c */
extern const char *const transport_name[T_COUNT];
extern const char *const transport_arg[T_COUNT];
int is_shmipc(int t);
int want_version(int t);
int want_wakeup(int t);
const char *wakeup_name(int w);
extern volatile sig_atomic_t interrupted;
extern pid_t server_pid;
int shm_fail(const char *what, int rc);
int sys_fail(const char *what);
void put_be32(uint8_t *p, uint32_t v);
uint32_t get_be32(const uint8_t *p);
size_t min_size(size_t a, size_t b);
uint64_t byte_sum(const uint8_t *p, size_t n);
extern uint8_t *pattern;
extern uint64_t expected_sum[MAX_SIZES][PATTERN_SLACK];
int pattern_init(const struct opts *o, size_t max);
void fmt_size(char *buf, size_t cap, uint64_t v);
void read_loadavg(char *buf, size_t cap);
void env_probe(struct env *e, int want_pin);
int pin_to(int cpu);

/* stats.c */
extern clockid_t server_clock;
extern int server_clock_ok;
uint64_t now_ns(void);
uint64_t client_cpu_ns(void);
uint64_t server_cpu_settled_ns(void);
uint64_t server_cpu_ns(void);
extern const char *const pct_key[NPCT];
extern const unsigned pct_permille[NPCT];
int cmp_u64(const void *a, const void *b);
extern double idle_watched, idle_unwatched;
extern int idle_ms;
struct lat_cell *lat_at(struct results *r, int si, int t, int round);
struct par_cell *par_at(struct results *r, int si, int ci, int t, int round);
double lat_median(struct results *r, int si, int t, int p);
double par_median(struct results *r, int si, int ci, int t, int mib);
extern double idle_share[T_COUNT][2]; /* [t][0] client, [t][1] server */
extern int idle_window_ms;
int measure_idle_after(const struct opts *o, const struct client *c);
extern double memcpy_gibps;
void measure_memcpy(void);
extern double wake_floor_us;
void measure_wake_floor(const struct env *e);
/* The spin floor: the payload of its ping-pong, and its percentiles (µs; -1: not measured). */
#define SPIN_FLOOR_SIZE 64u
extern double spin_floor_us[NPCT];
extern int spin_floor_samples;
void measure_spin_floor(const struct opts *o, const struct env *e);
int measure_idle(const struct opts *o, struct local *lc);

/* transport_shmipc.c */
int make_config(const struct opts *o, int t, shmipc_config **out);
int largest_slice(const shmipc_config *cfg, uint32_t *out);
void ssession_end(struct server *sv, int i);
int ssession_pump(struct ssession *ss, uint64_t now, int probe);
int ssession_took(struct ssession *ss, uint64_t now, int rc);
int ssession_ready(struct ssession *ss, uint64_t now);

/* transport_socket.c */
void sconn_close(struct server *sv, int i);
int sconn_ready(struct sconn *c, short revents);
void accept_conns(struct server *sv, int lfd, int tcp);
int listen_unix(const char *path);
int listen_tcp(uint16_t *port);
int sock_connect(const struct client *c);

/* echo_server.c */
int grow(void **arr, int *cap, int need, size_t elem);
int serve_main(const struct opts *o);
int server_start(const struct opts *o, const struct env *e, struct local *lc);
int server_watch_polling(struct local *lc, int on);
int server_stop_and_reap(struct local *lc);
int devshm_check(void);

/* client.c */
int client_open(struct client *c, int t, const char *shm_addr, shmipc_config *const cfg[T_COUNT],
                const struct local *lc, const struct opts *o);
void client_close(struct client *c);
void chans_close(const struct client *c, struct chan *ch, int n);
struct chan *chans_open(const struct client *c, int n, size_t size);
int chan_send(const struct client *c, struct chan *ch, size_t size, uint64_t seq);
int chan_recv(const struct client *c, struct chan *ch, size_t size, uint64_t want,
              const uint8_t *msg);
int round_trip(const struct client *c, struct chan *ch, size_t size, uint64_t seq,
               const uint64_t *sums, int verify);

/* shapes.c */
int samples_for(const struct opts *o, size_t size);
int run_latency(const struct opts *o, const struct client *c, int si, struct lat_cell *out);
int effective_streams(const struct opts *o, size_t size, int count);
int run_parallel(const struct opts *o, const struct client *c, int si, int n, struct par_cell *out);
extern struct warm warm_info[T_COUNT];
int session_warm(const struct opts *o, const struct client *c, const shmipc_config *cfg);
size_t warm_max_size(const shmipc_config *cfg);

/* report_text.c */
void write_env(FILE *f, const struct opts *o, const struct env *e, int markdown);
void write_tables(FILE *f, struct results *r);
int write_bar(FILE *f, struct results *r, int markdown);
int size64(const struct opts *o);
int write_bar4(FILE *f, struct results *r, int markdown);
void write_idle(FILE *f, const struct opts *o, int markdown);
void write_memcpy_floor(FILE *f, struct results *r);
void write_wake_floor(FILE *f, struct results *r);
void write_spin_floor(FILE *f, struct results *r);
int write_md(const char *path, struct results *r, const struct opts *o, const struct env *e);

/* report_json.c */
int write_json(const char *path, struct results *r, const struct env *e);

#endif
