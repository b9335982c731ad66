/*
 * The output side of the supervisor (sup_int.h): each worker's stdout and stderr pipes, read
 * without blocking, stdout searched for the "ready on ADDRESS" line while the worker starts,
 * both forwarded in whole lines (to out_fd and err_fd) so that lines of several workers never
 * mix; and the supervisor's own log lines on log_fd.
 */
#include "sup_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * Output nobody reads must not stall supervision: a blocking write to a full pipe (a stalled
 * log reader, a terminal stopped with Ctrl-S) held the loop, which then restarted, reloaded
 * and stopped nothing until someone read. So a destination that is not a regular file gets
 * pieces of at most PIPE_BUF, each after poll() says there is room (a pipe with room takes
 * such a write whole without waiting), and one that has no room within OUT_WAIT_MS loses the
 * rest. A regular file gets one write (O_APPEND: whole lines among other writers). Once a
 * destination had no room, later writes to it do not wait until it has room again: a worker
 * that writes many lines costs the loop one wait, not one per line. When it has room again, a
 * line says how many bytes it lost (on a line of its own when the drop cut one).
 */
static _Thread_local struct dest {
    int fd;       /* -1: a free slot */
    int nb;       /* a terminal's O_NONBLOCK description (below), or -1 */
    dev_t nb_dev; /* the terminal or pipe `nb` is of */
    ino_t nb_ino;
    int line_open;    /* what was last written left a line open (a line may come in two writes:
                       * a worker's last line, then its newline; a cut line, then its marker) */
    int stalled;      /* no room last time: later writes do not wait until there is */
    uint64_t dropped; /* bytes lost since then */
} dests[4] = {{-1, -1, 0, 0, 0, 0, 0},
              {-1, -1, 0, 0, 0, 0, 0},
              {-1, -1, 0, 0, 0, 0, 0},
              {-1, -1, 0, 0, 0, 0, 0}};

/* The state of destination `fd` (a pipe, socket or terminal), or NULL when four others hold
 * the table: then it is written as if new each time. */
static struct dest *dest_of(int fd)
{
    struct dest *free_slot = NULL;
    for (int i = 0; i < 4; i++) {
        if (dests[i].fd == fd)
            return &dests[i];
        if (dests[i].fd == -1 && free_slot == NULL)
            free_slot = &dests[i];
    }
    if (free_slot != NULL)
        *free_slot = (struct dest){fd, -1, 0, 0, 0, 0, 0};
    return free_slot;
}

/*
 * The O_NONBLOCK descriptions below are the thread's (the table is thread-local): each is closed
 * when its thread ends, by the destructor of a key the thread sets when it opens its first.
 * Before, they stayed open until the process ended: one more, and the pipe's write end held
 * open with it, per thread that had written to a pipe or a terminal (the library's threads log
 * through shmipc__sup_say; a supervisor may run on a thread of its own;
 * test_writer_descriptors_end_with_their_thread). The main thread's close with the process.
 */
static pthread_key_t dests_key;
static pthread_once_t dests_once = PTHREAD_ONCE_INIT;
static int dests_key_ok;

static void close_dests(void *unused)
{
    (void)unused;
    for (int i = 0; i < 4; i++) {
        if (dests[i].nb >= 0)
            close(dests[i].nb);
        dests[i] = (struct dest){-1, -1, 0, 0, 0, 0, 0};
    }
}

static void make_dests_key(void)
{
    dests_key_ok = pthread_key_create(&dests_key, close_dests) == 0;
}

/*
 * POLLOUT promises no room for the write that follows it. A pty whose reader stalled (an ssh
 * session whose client stopped reading) says writable with a few bytes free. A pipe says it
 * with one page free, which another thread writing here (the front's reactor threads log
 * through shmipc__sup_say) can take between our poll() and our write(). A blocking write then
 * waits for the reader. So a terminal or a pipe is written through a description of its own,
 * opened O_NONBLOCK (the one shared with the workers and the shell keeps its flags), and a
 * write it cannot take at once is a drop as no room is. Returns that description, or `fd`
 * itself when none could be had (a pipe whose reader is gone: the write fails anyway).
 */
static int nb_writer(int fd, struct dest *d, const struct stat *st)
{
    if (d == NULL)
        return fd;
    if (d->nb >= 0 && (d->nb_dev != st->st_dev || d->nb_ino != st->st_ino)) {
        close(d->nb); /* the fd is another terminal or pipe now */
        d->nb = -1;
    }
    if (d->nb < 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        d->nb = open(path, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        d->nb_dev = st->st_dev;
        d->nb_ino = st->st_ino;
        /* Any non-NULL value: the destructor closes this thread's descriptions. */
        if (d->nb >= 0 && pthread_once(&dests_once, make_dests_key) == 0 && dests_key_ok)
            (void)pthread_setspecific(dests_key, dests);
    }
    return d->nb >= 0 ? d->nb : fd;
}

/* Test hook: called between a poll() that found room and the write (NULL: none). */
void (*shmipc__sup_after_poll_hook)(int fd);

/* The destination has room again: a line says how much it lost (one write under PIPE_BUF,
 * through `wfd`: a terminal's O_NONBLOCK description), on a line of its own. */
static void dropped_notice(int wfd, struct dest *d)
{
    char line[128];
    int n = snprintf(line, sizeof line,
                     "%sshmipc-serve[%d]: %llu bytes of output dropped: "
                     "nobody read them\n",
                     d->line_open ? "\n" : "", (int)getpid(), (unsigned long long)d->dropped);
    d->stalled = 0;
    d->dropped = 0;
    d->line_open = 0;
    while (n > 0 && write(wfd, line, (size_t)n) < 0 && errno == EINTR)
        ;
}

void shmipc__sup_write_all(int fd, const char *p, size_t n)
{
    struct stat st;
    int ok = fstat(fd, &st) == 0;
    int file = ok && S_ISREG(st.st_mode);
    struct dest *d = file ? NULL : dest_of(fd);
    int sock = ok && S_ISSOCK(st.st_mode);
    int wfd = ok && (S_ISFIFO(st.st_mode) || (S_ISCHR(st.st_mode) && isatty(fd)))
                  ? nb_writer(fd, d, &st)
                  : fd;
    int full = 0;
    while (n > 0) {
        if (!file) {
            int stalled = d != NULL && d->stalled;
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int r = full ? 0 : poll(&pf, 1, stalled ? 0 : OUT_WAIT_MS);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0 || !(pf.revents & POLLOUT)) {
                if (d != NULL) {
                    d->stalled = 1;
                    d->dropped += n;
                }
                return; /* full (or closed): dropped */
            }
            if (stalled)
                dropped_notice(wfd, d);
            if (shmipc__sup_after_poll_hook != NULL)
                shmipc__sup_after_poll_hook(fd);
        }
        size_t len = file || n <= PIPE_BUF ? n : PIPE_BUF;
        /* A socket cannot be reopened: its write is told not to wait. */
        ssize_t k = sock ? send(wfd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL) : write(wfd, p, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !file) {
            full = 1; /* POLLOUT, then no room: dropped as above */
            continue;
        }
        if (k <= 0)
            return; /* a closed or full log is not a reason to stop supervising */
        p += k;
        n -= (size_t)k;
        if (d != NULL)
            d->line_open = p[-1] != '\n';
    }
}

void shmipc__sup_logf(shmipc__sup *sup, const char *fmt, ...)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf, "shmipc-serve[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    size_t len = (size_t)n +
                 ((size_t)m < sizeof buf - (size_t)n - 1 ? (size_t)m : sizeof buf - (size_t)n - 2);
    buf[len++] = '\n';
    shmipc__sup_write_all(sup->cfg.log_fd, buf, len);
}

void shmipc__sup_say(int fd, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    size_t len = (size_t)n < sizeof buf - 1 ? (size_t)n : sizeof buf - 2;
    buf[len++] = '\n';
    shmipc__sup_write_all(fd, buf, len);
}

/* Checks a complete line (without its newline) of a starting worker's stdout for
 * "ready on <its address>". */
static void check_ready_line(struct slot *s, const char *line, size_t n, uint64_t now)
{
    static const char key[] = "ready on ";
    const size_t kl = sizeof key - 1, al = strlen(s->address);
    while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' '))
        n--;
    /* the line ends in the key and the address: "... ready on ADDRESS" */
    if (n < kl + al || memcmp(line + n - al, s->address, al) != 0 ||
        memcmp(line + n - al - kl, key, kl) != 0)
        return;
    s->state = SHMIPC__SUP_READY;
    s->ready_ns = now;
}

/*
 * Takes n bytes read from a worker's pipe: complete lines go to `dest` at once (the bytes up
 * to the last newline in one write when nothing is pending), the start of a line waits in
 * p->buf for its end. A line that fills the buffer is cut: forwarded with the marker and a
 * newline, its rest a new line. So lines of several workers never mix: the loop is the only
 * writer, and writes whole lines.
 */
static void take(struct slot *s, struct sup_pipe *p, int dest, int starting, const char *d,
                 size_t n, uint64_t now)
{
    static const char mark[] = SHMIPC__SUP_CUT_MARK "\n";
    while (n > 0) {
        if (p->cut) { /* the line ended right at the cut: its newline is the marker's */
            p->cut = 0;
            if (*d == '\n') {
                d++;
                n--;
                continue;
            }
        }
        const char *nl = memchr(d, '\n', n);
        if (p->len == 0 && nl != NULL && !starting) {
            const char *last = memrchr(d, '\n', n);
            size_t k = (size_t)(last - d) + 1;
            shmipc__sup_write_all(dest, d, k);
            d += k;
            n -= k;
            continue;
        }
        size_t k = nl != NULL ? (size_t)(nl - d) + 1 : n, room = sizeof p->buf - p->len;
        if (k > room) { /* the line does not fit: cut */
            memcpy(p->buf + p->len, d, room);
            shmipc__sup_write_all(dest, p->buf, sizeof p->buf);
            shmipc__sup_write_all(dest, mark, sizeof mark - 1);
            p->len = 0;
            d += room;
            n -= room;
            p->cut = 1;
            continue;
        }
        memcpy(p->buf + p->len, d, k);
        p->len += k;
        d += k;
        n -= k;
        if (p->buf[p->len - 1] == '\n') {
            if (starting && s->state == SHMIPC__SUP_STARTING)
                check_ready_line(s, p->buf, p->len - 1, now);
            shmipc__sup_write_all(dest, p->buf, p->len);
            p->len = 0;
        }
    }
}

/* Forwards what is pending of a line (a last one without a newline), ended by a newline, and
 * closes the pipe. */
static void close_pipe(struct sup_pipe *p, int dest)
{
    if (p->len > 0) {
        shmipc__sup_write_all(dest, p->buf, p->len);
        shmipc__sup_write_all(dest, "\n", 1);
        p->len = 0;
    }
    p->cut = 0;
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
}

/* Reads what the worker wrote on stdout and stderr, forwards it in whole lines to out_fd and
 * err_fd, and looks for its ready line on stdout while it starts. A pipe at its end (the
 * worker and any child holding it are done) is closed, its last line forwarded. */
void shmipc__sup_read_output(shmipc__sup *sup, struct slot *s, uint64_t now)
{
    char buf[4096];
    for (int i = 0; i < 2; i++) {
        struct sup_pipe *p = &s->out[i];
        int dest = i == 0 ? sup->cfg.out_fd : sup->cfg.err_fd;
        for (int rounds = 0; p->fd >= 0 && rounds < 16; rounds++) {
            ssize_t k = read(p->fd, buf, sizeof buf);
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0)
                break; /* EAGAIN: all read */
            if (k == 0) {
                close_pipe(p, dest);
                break;
            }
            take(s, p, dest, i == 0 && s->state == SHMIPC__SUP_STARTING, buf, (size_t)k, now);
        }
    }
}

void shmipc__sup_close_out(shmipc__sup *sup, struct slot *s)
{
    close_pipe(&s->out[0], sup->cfg.out_fd);
    close_pipe(&s->out[1], sup->cfg.err_fd);
}
