/*
 * greeter_server: the shmipc-go helloworld server in C. It accepts a client, reads
 * "client say hello world!!!" from its first stream and answers "server hello world!!!".
 * Go's greeter_client and ours both work with it, over V2 (/dev/shm files) or V3 (memfd).
 *
 * Build: cc greeter_server.c $(pkg-config --cflags --libs shmipc) -o greeter_server
 * Usage: greeter_server [ADDRESS [SESSIONS]]   (default unix:/tmp/shmipc_greeter.sock, 1)
 */
#include <shmipc.h>

#include <stdio.h>
#include <stdlib.h>

#define REQUEST "client say hello world!!!"
#define REPLY   "server hello world!!!"

static int fail(const char *what, int rc)
{
    fprintf(stderr, "greeter_server: %s: %s (%s)\n", what, shmipc_error_detail(),
            shmipc_errname(rc));
    return 1;
}

static int serve(shmipc_session *s)
{
    shmipc_stream *st;
    const void *req;
    int rc = shmipc_session_accept_stream(s, 5000, &st);
    if (rc < 0)
        return fail("accept stream", rc);
    /* Streams are byte streams: read exactly the request's length, as the Go server does. */
    rc = shmipc_stream_read_exact_bytes(st, sizeof REQUEST - 1, &req, 0);
    if (rc < 0) {
        shmipc_stream_close(st);
        return fail("read request", rc);
    }
    printf("server receive request message:%.*s\n", (int)(sizeof REQUEST - 1), (const char *)req);
    shmipc_stream_release(st);
    if ((rc = shmipc_stream_write(st, REPLY, sizeof REPLY - 1)) < 0 ||
        (rc = shmipc_stream_flush(st)) < 0) {
        shmipc_stream_close(st);
        return fail("reply", rc);
    }
    printf("server reply response: %s\n", REPLY);
    /* Wait for the client to hang up before closing, so the reply is surely read. */
    const void *p;
    size_t n;
    while (shmipc_stream_read_chunk(st, 0, &p, &n, 0) == 0)
        shmipc_stream_release(st);
    shmipc_stream_close(st);
    return 0;
}

int main(int argc, char **argv)
{
    const char *address = argc > 1 ? argv[1] : "unix:/tmp/shmipc_greeter.sock";
    int sessions = argc > 2 ? atoi(argv[2]) : 1;
    shmipc_listener *l;
    int rc = shmipc_listener_new(address, NULL, &l), status = 0;
    if (rc < 0)
        return fail("listen", rc);
    printf("greeter_server: listening on %s\n", address);
    fflush(stdout);
    for (int i = 0; i < sessions; i++) {
        shmipc_session *s;
        if ((rc = shmipc_listener_accept(l, 30000, &s)) < 0) {
            status = fail("accept", rc);
            break;
        }
        printf("greeter_server: session with protocol V%d\n", shmipc_session_version(s));
        status |= serve(s);
        shmipc_session_close(s);
        fflush(stdout);
    }
    shmipc_listener_close(l);
    return status;
}
