/*
 * greeter_client: the shmipc-go helloworld client in C. It sends "client say hello world!!!"
 * and reads "server hello world!!!". It works with Go's greeter_server and with ours.
 *
 * Build: cc greeter_client.c $(pkg-config --cflags --libs shmipc) -o greeter_client
 * Usage: greeter_client [ADDRESS [v2|v3|v4|v4-eventfd|v4-polling]]
 *        (default unix:/tmp/shmipc_greeter.sock, v3). Use v2 or v3 against shmipc-go: a V4
 *        mode first offers V4 on one connection and, when the server rejects it, falls back to
 *        V3 on a new connection. shmipc-go's greeter_server accepts a single connection and
 *        spends it on the rejected V4 offer (it neither answers nor closes it), so the
 *        fallback connection is never accepted and this client fails after its timeouts.
 */
#include <shmipc.h>

#include <stdio.h>
#include <string.h>

#define REQUEST "client say hello world!!!"
#define REPLY   "server hello world!!!"

int main(int argc, char **argv)
{
    const char *address = argc > 1 ? argv[1] : "unix:/tmp/shmipc_greeter.sock";
    const char *mode = argc > 2 ? argv[2] : "v3";
    static const char *const wakeups[] = {"socket", "eventfd", "polling"};
    shmipc_config *cfg = NULL;
    shmipc_session *s = NULL;
    shmipc_stream *st = NULL;
    const void *reply;
    int rc;
    if ((rc = shmipc_config_new(&cfg)) < 0 ||
        (rc = shmipc_config_set_path_prefix(cfg, "/dev/shm/client.ipc.shm")) < 0 ||
        (strcmp(mode, "v2") == 0 &&
         (rc = shmipc_config_set_memmap_type(cfg, SHMIPC_MEMMAP_DEVSHM)) < 0) ||
        (strcmp(mode, "v4") == 0 && (rc = shmipc_config_with_v4(cfg)) < 0) ||
        (strcmp(mode, "v4-eventfd") == 0 && (rc = shmipc_config_with_v4_eventfd(cfg)) < 0) ||
        (strcmp(mode, "v4-polling") == 0 &&
         (rc = shmipc_config_with_v4_event_queue_polling(cfg, 100)) < 0) ||
        (rc = shmipc_config_set_timeout(cfg, SHMIPC_TIMEOUT_READ, 5000)) < 0 ||
        (rc = shmipc_session_connect(address, cfg, &s)) < 0 ||
        (rc = shmipc_session_open_stream(s, &st)) < 0)
        goto out;
    uint32_t interval = 0;
    int wakeup = shmipc_session_wakeup(s, &interval);
    printf("client stream send request:%s (protocol V%d, %s wakeups", REQUEST,
           shmipc_session_version(s), wakeups[wakeup]);
    if (wakeup == SHMIPC_WAKEUP_POLLING)
        printf(" every %u us", interval);
    printf(")\n");
    if ((rc = shmipc_stream_write(st, REQUEST, sizeof REQUEST - 1)) < 0 ||
        (rc = shmipc_stream_flush(st)) < 0 ||
        (rc = shmipc_stream_read_exact_bytes(st, sizeof REPLY - 1, &reply, 0)) < 0)
        goto out;
    printf("client stream receive response %.*s\n", (int)(sizeof REPLY - 1), (const char *)reply);
    rc = memcmp(reply, REPLY, sizeof REPLY - 1) == 0 ? 0 : SHMIPC_EPROTO;
    shmipc_stream_release(st);
out:
    if (rc < 0)
        fprintf(stderr, "greeter_client: %s (%s)\n", shmipc_error_detail(), shmipc_errname(rc));
    shmipc_stream_close(st);
    shmipc_session_close(s);
    shmipc_config_free(cfg);
    return rc < 0 ? 1 : 0;
}
