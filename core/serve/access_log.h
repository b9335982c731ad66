/*
 * The access log of shmipc-serve's front (docs/serve.md, "The access log"): the formatter of
 * one request's line (common log format or JSON), the log file, and the per-thread buffer
 * the front's reactor threads write through.
 *
 * A reactor thread never waits for the log file on each request: it formats the line into its
 * own buffer, and the buffer goes to the file with one write() of whole lines when it fills or
 * on the front's flush timer (at most SHMIPC__ACCESS_FLUSH_MS late). The file is opened
 * O_APPEND, so threads (and processes) sharing it add whole lines; to a pipe or a terminal
 * (`-`, stdout) each write is at most PIPE_BUF bytes of whole lines, which the kernel never
 * mixes with another writer's. A failed write is counted (shmipc__access_log_counts) and its
 * lines dropped: serving goes on. shmipc__access_log_reopen() (SIGUSR2 in shmipc-serve, for
 * logrotate) opens the path again and puts it in place of the old file under the same
 * descriptor number (dup2), so a thread writing at that moment writes to one file or the other.
 */
#ifndef SHMIPC_CORE_SERVE_ACCESS_LOG_H
#define SHMIPC_CORE_SERVE_ACCESS_LOG_H

#include <stddef.h>
#include <stdint.h>

enum shmipc__access_format_kind {
    SHMIPC__ACCESS_COMMON = 1,
    SHMIPC__ACCESS_JSON = 2,
};

#define SHMIPC__ACCESS_FLUSH_MS 100u        /* a line waits in its thread's buffer at most this */
#define SHMIPC__ACCESS_BUF      (32u << 10) /* bytes of a thread's buffer */

/* One request as the front logs it; strings are bytes with lengths (NULL: "-"). */
typedef struct shmipc__access_entry {
    const char *remote; /* the client: "127.0.0.1", "::1", "unix:" */
    size_t remote_len;
    const char *method;
    size_t method_len;
    const char *target; /* as received */
    size_t target_len;
    const char *referer;
    size_t referer_len;
    const char *user_agent;
    size_t user_agent_len;
    const char *worker; /* the application worker's address (JSON only); NULL: none */
    size_t worker_len;
    int64_t time_sec; /* wall clock (seconds since 1970, UTC) and nanoseconds of the request */
    long time_nsec;
    unsigned version_minor; /* HTTP/1.x */
    unsigned status;        /* 100 .. 999 */
    uint64_t bytes;         /* body bytes sent */
    uint64_t duration_us;
} shmipc__access_entry;

/* A buffer size that always holds the formatted line of e. */
size_t shmipc__access_format_bound(const shmipc__access_entry *e);

/*
 * One line (with its '\n', NUL-terminated) into out: the common log format (`remote - - [time]
 * "METHOD target HTTP/1.x" status bytes`, time in UTC, nginx's escaping: '"', '\\', control
 * bytes and bytes >= 0x7F as \xHH; referer, user agent and worker are not in it) or a JSON
 * object (every field; control bytes as \u00XX, invalid UTF-8 as U+FFFD). Returns the length,
 * SHMIPC_EMSGSIZE when cap is too small, SHMIPC_EINVAL for NULL or a bad format. Pure: no I/O,
 * thread safe.
 */
int shmipc__access_format(int format, const shmipc__access_entry *e, char *out, size_t cap);

struct shmipc__access_log;

/*
 * Opens the log: `path` is a file (created 0666 less the umask, appended to) or "-" for
 * stdout. SHMIPC_EINVAL (NULL, a bad format), a negated errno of open(), SHMIPC_ENOMEM.
 */
int shmipc__access_log_open(const char *path, int format, struct shmipc__access_log **out);

/* Opens the path again in place of the old file (logrotate moved it). Any thread; 0 for "-". */
int shmipc__access_log_reopen(struct shmipc__access_log *log);

/* Lines written, and write() calls that failed (their lines dropped). Any thread. */
void shmipc__access_log_counts(struct shmipc__access_log *log, uint64_t *lines, uint64_t *errors);

/* After every buffer writing to it was flushed and freed. NULL is a no-op. */
void shmipc__access_log_free(struct shmipc__access_log *log);

/* A thread's buffer of whole lines. One thread only. */
struct shmipc__access_buf {
    struct shmipc__access_log *log;
    char *p;
    size_t n, cap;
};

/* SHMIPC_ENOMEM. */
int shmipc__access_buf_init(struct shmipc__access_buf *b, struct shmipc__access_log *log);

/*
 * Formats e into the buffer, writing the buffer out first when the line does not fit (a line
 * larger than the buffer is written alone). Returns 1 when lines wait in the buffer (the
 * caller flushes them within SHMIPC__ACCESS_FLUSH_MS), 0 when it is empty.
 */
int shmipc__access_buf_add(struct shmipc__access_buf *b, const shmipc__access_entry *e);

/* Writes what the buffer holds. */
void shmipc__access_buf_flush(struct shmipc__access_buf *b);

/* Flushes and frees; the struct may be initialised again. */
void shmipc__access_buf_free(struct shmipc__access_buf *b);

#endif
