/*
 * The output side of the supervisor (sup_int.h): each worker's stdout pipe, read without
 * blocking, searched for the "ready on ADDRESS" line while the worker starts and forwarded to
 * out_fd; and the supervisor's own log lines on log_fd.
 */
#include "sup_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void shmipc__sup_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return; /* a closed or full log is not a reason to stop supervising */
        p += k;
        n -= (size_t)k;
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

/* Checks a complete line of a starting worker's stdout for "ready on <its address>". */
static void check_ready_line(shmipc__sup *sup, struct slot *s, uint64_t now)
{
    static const char key[] = "ready on ";
    (void)sup;
    s->line[s->line_len] = '\0';
    size_t n = s->line_len;
    while (n > 0 && (s->line[n - 1] == '\r' || s->line[n - 1] == ' '))
        s->line[--n] = '\0';
    const char *p = strstr(s->line, key);
    if (p == NULL)
        return;
    if (strcmp(p + sizeof key - 1, s->address) != 0)
        return;
    s->state = SHMIPC__SUP_READY;
    s->ready_ns = now;
}

/* Reads what the worker wrote, forwards it to out_fd, and looks for its ready line while it
 * starts. Returns 0 at the pipe's end (the worker and any child holding it are done). */
int shmipc__sup_read_output(shmipc__sup *sup, struct slot *s, uint64_t now)
{
    char buf[4096];
    for (int rounds = 0; rounds < 16; rounds++) {
        ssize_t k = read(s->out, buf, sizeof buf);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return 1; /* EAGAIN: all read */
        if (k == 0)
            return 0;
        shmipc__sup_write_all(sup->cfg.out_fd, buf, (size_t)k);
        for (ssize_t i = 0; i < k && s->state == SHMIPC__SUP_STARTING; i++) {
            if (buf[i] == '\n') {
                check_ready_line(sup, s, now);
                s->line_len = 0;
            } else if (s->line_len < sizeof s->line - 1) {
                s->line[s->line_len++] = buf[i];
            }
            /* A longer line is cut: it cannot be the ready line of an address we gave. */
        }
    }
    return 1;
}

void shmipc__sup_close_out(struct slot *s)
{
    if (s->out >= 0)
        close(s->out);
    s->out = -1;
}
