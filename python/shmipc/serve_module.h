/*
 * serve_module.h - what serve.c and serve_encode.c (the shmipc._serve extension) share: the
 * module state and the frame errors. Nothing here is exported: only PyInit__serve is public.
 */
#ifndef SHMIPC_PY_SERVE_MODULE_H
#define SHMIPC_PY_SERVE_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "shmipc_serve.h"

/* The number of header names whose HTTP_* key is made once, at import (serve.c's common_names). */
#define NCOMMON 20

typedef struct {
    PyObject *frame_error; /* FrameError(ValueError) */
    PyObject *common_keys[NCOMMON];
    /* Interned environ keys. */
    PyObject *k_method, *k_script, *k_path, *k_query, *k_raw_uri, *k_request_uri, *k_content_type,
        *k_content_length, *k_server_name, *k_server_port, *k_protocol, *k_remote_addr,
        *k_remote_port, *k_scheme, *k_empty, *k_http, *k_https, *k_proto10, *k_proto11;
} serve_state;

/* serve.c */
PyObject *shmipcpy_serve_frame_error(serve_state *st, int64_t rc, const char *what);
/* Percent-decodes p[0..n) into out (room for n bytes); a '%' without two hex digits stays. */
size_t shmipcpy_serve_percent_decode(const uint8_t *p, size_t n, uint8_t *out);
const uint8_t *shmipcpy_serve_target_path(const shmipc_serve_request *r, size_t *len);

PyObject *shmipcpy_serve_decode_environ(serve_state *st, const void *buf, Py_ssize_t len,
                                        PyObject *base);

/* serve_encode.c */
/* A RESPONSE_HEAD frame as bytes (encode_response_head's work); NULL with an error. */
PyObject *shmipcpy_serve_encode_head(int status, PyObject *headers, uint32_t flags, uint64_t clen);
PyObject *shmipcpy_serve_py_encode_response_head(PyObject *module, PyObject *args, PyObject *kw);
PyObject *shmipcpy_serve_py_encode_request_head(PyObject *module, PyObject *args, PyObject *kw);
PyObject *shmipcpy_serve_py_encode_frame(PyObject *module, PyObject *args, PyObject *kw);

/* serve_wsgi.c */
/* The largest Content-Length an app may say (WSGI's start_response, ASGI's
 * http.response.start): INT64_MAX. The C server sends at most 19 digits (a larger one fails
 * the response there, and the front treats lengths over it as none), so the adapters refuse
 * a larger one as the app's error, in both modes, before anything is sent. The message takes
 * the value's repr. */
#define SHMIPCPY_SERVE_MAX_LENGTH 0x7fffffffffffffffull
#define SHMIPCPY_SERVE_TOO_LONG                                                                    \
    "Content-Length %R is more than 9223372036854775807, the largest the server sends"
/* Hop-by-hop fields (RFC 9110 §7.6.1), lower case; the server's own, dropped from an app's
 * response. The two read before they are dropped lead the list. */
enum { HOP_CONNECTION, HOP_CONTENT_LENGTH, NHOP = 8 };
extern const char *const shmipcpy_serve_hop_names[NHOP];
/* One WSGI response's state: WSGIResponse, and the worker's subclass (serve_wsgi_worker.c). */
typedef struct {
    PyObject_HEAD PyObject *method; /* the request's method (str) */
    PyObject *status;               /* the app's status line (str), None before start_response */
    PyObject *headers; /* the app's (name, value) tuples, hop-by-hop fields dropped, or None */
    PyObject *length;  /* the app's Content-Length (int) or None */
    PyObject *chunks;  /* the collected body pieces (write() of this type), or NULL */
    Py_ssize_t sent;   /* body bytes taken */
    int code;          /* the status code */
    unsigned flags;    /* RESP_CLOSE when the app said Connection: close */
    char head_sent;    /* the head is out (or, collecting: a body byte came) */
    PyObject *weak;
} wsgi_response;
/* 1xx, 204 and 304: no content, and no length to say. */
int shmipcpy_serve_no_content(const wsgi_response *r);
/* No body bytes go to the client (no_content, or HEAD). */
int shmipcpy_serve_bodyless(wsgi_response *r);
int shmipcpy_serve_add_wsgi(PyObject *module);
PyObject *shmipcpy_serve_py_response_fields(PyObject *module, PyObject *const *args,
                                            Py_ssize_t nargs);
/* (bytes, bytes) pairs for the C server: Date and Server dropped, a second Content-Type too,
 * Connection: close added when `close`. */
PyObject *shmipcpy_serve_server_fields(PyObject *pairs, int close);
/* A list of bytes as one bytes object. */
PyObject *shmipcpy_serve_join(PyObject *chunks);
/* Appends (b"Content-Length", digits of `length`) to the list `fields`: an answer to HEAD,
 * which says the length of GET's body (the C server sends it, and no body). 0 or -1. */
int shmipcpy_serve_head_length(PyObject *fields, unsigned long long length);

/* serve_wsgi_worker.c: WSGIWorker, the WSGI worker's route in C (after WSGIResponse). */
int shmipcpy_serve_add_wsgi_worker(PyObject *module);

/* serve_asgi.c */
int shmipcpy_serve_add_asgi(PyObject *module);
PyObject *shmipcpy_serve_py_asgi_start(PyObject *module, PyObject *message);

/* serve_scope.c */
PyObject *shmipcpy_serve_py_decode_request_scope(PyObject *module, PyObject *arg);

#endif
