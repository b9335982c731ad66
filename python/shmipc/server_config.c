/*
 * server_config.c - the keyword arguments of shmipc.Server() turned into a
 * shmipc_server_config: limits, timeouts, the reactor backend, the WebSocket limits and the other
 * listen options.
 *
 * Owns: shmipcpy_build_config and the checks of each argument.
 * May call: the public C API (shmipc_server_config_*) and module.h's error helpers.
 */
#include "module.h"

/* ---------------------------------------------------------------------------------------- */
/* Server methods                                                                           */
/* ---------------------------------------------------------------------------------------- */

static const char *const backend_names[] = {"default", "auto", "io_uring", "epoll",
                                            "epoll_oneshot"};

static int config_limit(module_state *ms, shmipc_server_config *cfg, PyObject *v, int which,
                        const char *field)
{
    if (v == NULL || v == Py_None)
        return 0;
    unsigned long long n = PyLong_AsUnsignedLongLong(v);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            shmipcpy_raise_invalid(ms, field, "out of range");
        }
        return -1;
    }
    int rc = shmipc_server_config_set_limit(cfg, which, n);
    if (rc < 0) {
        shmipcpy_raise_last(ms, rc);
        return -1;
    }
    return 0;
}

static int config_timeout(module_state *ms, shmipc_server_config *cfg, PyObject *v, int which,
                          const char *field)
{
    int64_t ms_value;
    if (v == NULL || v == Py_None)
        return 0;
    /* None keeps the default (above). Negative: never; 0 is the C setter's to judge (no
     * keep-alive, an immediate stop; refused for the header, ping and idle timeouts). */
    if (shmipcpy_timeout_arg(ms, v, field, 1, &ms_value) < 0)
        return -1;
    int rc = shmipc_server_config_set_timeout(cfg, which, (int)ms_value);
    if (rc < 0) {
        shmipcpy_raise_last(ms, rc);
        return -1;
    }
    return 0;
}

int shmipcpy_build_config(module_state *ms, PyObject *args, PyObject *kwargs,
                          shmipc_server_config *cfg)
{
    static char *kwlist[] = {"address",
                             "port",
                             "workers",
                             "backend",
                             "header_timeout",
                             "keepalive_timeout",
                             "stop_timeout",
                             "max_request_line",
                             "max_head_bytes",
                             "max_headers",
                             "max_body",
                             "pipeline",
                             "server_name",
                             "max_ws_message",
                             "ws_ping_timeout",
                             "ws_idle_timeout",
                             "ws_send_high_water",
                             "ws_send_limit",
                             "reuse_port",
                             "keepalive_requests",
                             NULL};
    const char *address = NULL;
    int port = -1, rc;
    PyObject *workers = Py_None, *backend = Py_None, *header_to = NULL, *keepalive_to = NULL,
             *stop_to = NULL, *line = NULL, *head = NULL, *nheaders = NULL, *body = NULL,
             *pipeline = NULL, *name = NULL, *ws_message = NULL, *ws_ping = NULL, *ws_idle = NULL,
             *ws_high = NULL, *ws_limit = NULL, *reuse = Py_None, *kreqs = NULL;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "|zi$OOOOOOOOOOOOOOOOOO:Server", kwlist, &address, &port, &workers,
            &backend, &header_to, &keepalive_to, &stop_to, &line, &head, &nheaders, &body,
            &pipeline, &name, &ws_message, &ws_ping, &ws_idle, &ws_high, &ws_limit, &reuse, &kreqs))
        return -1;
    if (address != NULL && (rc = shmipc_server_config_set_address(cfg, address)) < 0)
        goto fail;
    if (port != -1 && (rc = shmipc_server_config_set_port(cfg, port)) < 0)
        goto fail;
    if (workers != Py_None) {
        long n = PyLong_AsLong(workers);
        if (n == -1 && PyErr_Occurred())
            return -1;
        if (n < 1 || n > 1024) {
            shmipcpy_raise_invalid(ms, "workers", "must be 1..1024, or None for the default");
            return -1;
        }
        if ((rc = shmipc_server_config_set_workers(cfg, (unsigned)n)) < 0)
            goto fail;
    }
    if (backend != Py_None) {
        const char *b = PyUnicode_Check(backend) ? PyUnicode_AsUTF8(backend) : NULL;
        int which = -1;
        for (int i = 0; b != NULL && i < 5; i++)
            if (strcmp(b, backend_names[i]) == 0)
                which = i;
        if (which < 0) {
            if (!PyErr_Occurred())
                shmipcpy_raise_invalid(ms, "backend",
                                       "must be 'auto', 'io_uring', 'epoll', 'epoll_oneshot', "
                                       "'default' or None");
            return -1;
        }
        if ((rc = shmipc_server_config_set_backend(cfg, which)) < 0)
            goto fail;
    }
    if (config_timeout(ms, cfg, header_to, SHMIPC_SERVER_TIMEOUT_HEADER, "header_timeout") < 0 ||
        config_timeout(ms, cfg, keepalive_to, SHMIPC_SERVER_TIMEOUT_KEEPALIVE,
                       "keepalive_timeout") < 0 ||
        config_timeout(ms, cfg, stop_to, SHMIPC_SERVER_TIMEOUT_STOP, "stop_timeout") < 0 ||
        config_limit(ms, cfg, line, SHMIPC_SERVER_LIMIT_REQUEST_LINE, "max_request_line") < 0 ||
        config_limit(ms, cfg, head, SHMIPC_SERVER_LIMIT_HEAD_BYTES, "max_head_bytes") < 0 ||
        config_limit(ms, cfg, nheaders, SHMIPC_SERVER_LIMIT_HEADERS, "max_headers") < 0 ||
        config_limit(ms, cfg, body, SHMIPC_SERVER_LIMIT_BODY, "max_body") < 0 ||
        config_limit(ms, cfg, pipeline, SHMIPC_SERVER_LIMIT_PIPELINE, "pipeline") < 0 ||
        config_limit(ms, cfg, kreqs, SHMIPC_SERVER_LIMIT_KEEPALIVE_REQUESTS, "keepalive_requests") <
            0 ||
        config_limit(ms, cfg, ws_message, SHMIPC_SERVER_LIMIT_WS_MESSAGE, "max_ws_message") < 0 ||
        config_timeout(ms, cfg, ws_ping, SHMIPC_SERVER_TIMEOUT_WS_PING, "ws_ping_timeout") < 0 ||
        config_timeout(ms, cfg, ws_idle, SHMIPC_SERVER_TIMEOUT_WS_IDLE, "ws_idle_timeout") < 0 ||
        /* The high-water mark first: each is checked against the other as it would resolve,
         * so a small limit beside the default 1 MiB mark would be refused. */
        config_limit(ms, cfg, ws_high, SHMIPC_SERVER_LIMIT_WS_SEND_HIGH_WATER,
                     "ws_send_high_water") < 0 ||
        config_limit(ms, cfg, ws_limit, SHMIPC_SERVER_LIMIT_WS_SEND_LIMIT, "ws_send_limit") < 0)
        return -1;
    if (reuse != Py_None) {
        if (!PyBool_Check(reuse)) {
            shmipcpy_raise_invalid(ms, "reuse_port", "must be True, False or None");
            return -1;
        }
        if ((rc = shmipc_server_config_set_reuse_port(cfg, reuse == Py_True)) < 0)
            goto fail;
    }
    if (name != NULL) {
        const char *n = NULL;
        if (name != Py_None && (n = PyUnicode_AsUTF8(name)) == NULL)
            return -1;
        if ((rc = shmipc_server_config_set_server_name(cfg, n)) < 0)
            goto fail;
    }
    return 0;
fail:
    shmipcpy_raise_last(ms, rc);
    return -1;
}
