/*
 * shmipc-bench-ws, client connections: connect and upgrade, and the masked frames a cell sends.
 */
#include "ws_bench.h"

uint8_t *pattern;
static uint64_t rng = 0x9e3779b97f4a7c15u;

uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static size_t ws_head(uint8_t *p, size_t len, int opcode, int masked)
{
    size_t n = 2;
    p[0] = (uint8_t)(0x80 | opcode);
    if (len < 126) {
        p[1] = (uint8_t)len;
    } else if (len <= 0xffff) {
        p[1] = 126;
        p[2] = (uint8_t)(len >> 8);
        p[3] = (uint8_t)len;
        n = 4;
    } else {
        p[1] = 127;
        for (int i = 0; i < 8; i++)
            p[2 + i] = (uint8_t)((uint64_t)len >> (56 - 8 * i));
        n = 10;
    }
    if (masked)
        p[1] |= 0x80;
    return n;
}

/* A masked client frame of `len` bytes of `data` into `out` (room for len + 14); its length. */
static size_t ws_client_frame(uint8_t *out, int opcode, const uint8_t *data, size_t len)
{
    size_t h = ws_head(out, len, opcode, 1);
    uint32_t key = rnd();
    uint8_t *m = out + h;
    memcpy(m, &key, 4);
    for (size_t i = 0; i < len; i++)
        m[4 + i] = data[i] ^ m[i & 3];
    return h + 4 + len;
}

void frames_make(struct frames *fr, size_t size)
{
    memset(fr, 0, sizeof *fr);
    fr->size = size;
    for (int k = 0; k < NFRAMES; k++) {
        fr->payload[k] = pattern + (size_t)k * 61;
        fr->frame[k] = malloc(size + 14);
        if (fr->frame[k] == NULL)
            die("out of memory");
        fr->frame_len = ws_client_frame(fr->frame[k], 2, fr->payload[k], size);
    }
    fr->hdr = fr->frame_len - size - 4;
}

void frames_free(struct frames *fr)
{
    for (int k = 0; k < NFRAMES; k++)
        free(fr->frame[k]);
}

/* Reads an upgrade response on a blocking socket; 0 when it is a 101 with our accept value. */
static int upgrade_response(int fd, char *resp, size_t cap)
{
    size_t n = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    resp[0] = '\0';
    while (n + 1 < cap) {
        ssize_t r;
        if (poll(&p, 1, STALL_MS) <= 0)
            return -1;
        r = read(fd, resp + n, cap - 1 - n);
        if (r <= 0)
            return -1;
        n += (size_t)r;
        resp[n] = '\0';
        if (strstr(resp, "\r\n\r\n") != NULL)
            break;
    }
    resp[n] = '\0';
    if (strncmp(resp, "HTTP/1.1 101", 12) != 0 || strstr(resp, WS_ACCEPT) == NULL)
        return -1;
    /* Nothing may follow the head: the server speaks only when spoken to. */
    return strstr(resp, "\r\n\r\n")[4] == '\0' ? 0 : -1;
}

/* Opens n connections to t (upgraded to WebSocket unless t is the TCP echo), non-blocking. */
struct conn *conns_open(const struct target *t, int n)
{
    struct conn *c = calloc((size_t)n, sizeof *c);
    char req[512], resp[1024];
    int len = snprintf(req, sizeof req,
                       "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                       "Connection: Upgrade\r\nSec-WebSocket-Key: " WS_KEY "\r\n"
                       "Sec-WebSocket-Version: 13\r\n\r\n",
                       opt.ws_path, t->port);
    if (c == NULL)
        die("out of memory");
    for (int b = 0; b < n; b += OPEN_BATCH) {
        int e = b + OPEN_BATCH < n ? b + OPEN_BATCH : n;
        for (int i = b; i < e; i++) {
            c[i].fd = tcp_connect(t->port);
            if (c[i].fd < 0)
                die("%s: connection %d of %d: connect: %s", t->name, i + 1, n, strerror(errno));
            if (t->kind != K_TCP && write(c[i].fd, req, (size_t)len) != len)
                die("%s: connection %d: upgrade request: %s", t->name, i + 1, strerror(errno));
        }
        for (int i = b; i < e; i++) {
            if (t->kind != K_TCP && upgrade_response(c[i].fd, resp, sizeof resp) < 0)
                die("%s: connection %d of %d: no valid 101 response:\n%s", t->name, i + 1, n, resp);
            set_nonblock(c[i].fd, 1);
        }
    }
    return c;
}

/* Closes them: WebSocket connections with a close handshake (1000), waiting for the server to
 * end the TCP connection first, so that TIME_WAIT stays on its side. */
void conns_close(const struct target *t, struct conn *c, int n)
{
    uint8_t fr[32], body[2] = {0x03, 0xe8};
    size_t flen = ws_client_frame(fr, 8, body, 2);
    for (int b = 0; b < n; b += OPEN_BATCH) {
        int e = b + OPEN_BATCH < n ? b + OPEN_BATCH : n;
        if (t->kind != K_TCP) {
            for (int i = b; i < e; i++) {
                set_nonblock(c[i].fd, 0);
                if (write(c[i].fd, fr, flen) != (ssize_t)flen)
                    die("%s: close frame: %s", t->name, strerror(errno));
            }
            for (int i = b; i < e; i++) {
                struct pollfd p = {.fd = c[i].fd, .events = POLLIN};
                uint8_t buf[256];
                ssize_t r = 1;
                while (r > 0 && poll(&p, 1, 5000) > 0)
                    r = read(c[i].fd, buf, sizeof buf);
                if (r != 0)
                    fprintf(stderr,
                            "shmipc-bench-ws: %s: connection %d not closed by the "
                            "server within 5 s of the close handshake\n",
                            t->name, i + 1);
            }
        }
        for (int i = b; i < e; i++) {
            close(c[i].fd);
            free(c[i].rx);
        }
    }
    free(c);
}
