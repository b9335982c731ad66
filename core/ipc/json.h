/*
 * A small strict JSON reader for the V4 negotiation messages: the whole text is parsed into a
 * fixed array of nodes (no allocation), with limits on depth, nodes and string length, so a
 * hostile peer's message costs a bounded amount of work and memory. Strings are kept as
 * slices of the input (escapes are validated, and decoded only by shmipc__json_string()).
 */
#ifndef SHMIPC_CORE_IPC_JSON_H
#define SHMIPC_CORE_IPC_JSON_H

#include <stddef.h>
#include <stdint.h>

#define SHMIPC__JSON_MAX_NODES 256
#define SHMIPC__JSON_MAX_DEPTH 8

enum shmipc__json_type {
    SHMIPC__JSON_NULL,
    SHMIPC__JSON_BOOL,
    SHMIPC__JSON_NUMBER,
    SHMIPC__JSON_STRING,
    SHMIPC__JSON_ARRAY,
    SHMIPC__JSON_OBJECT,
};

struct shmipc__json_node {
    uint8_t type;
    uint8_t boolean;
    uint16_t depth;
    uint32_t start, len; /* the value's text in the input (a string's without quotes) */
    uint32_t children;   /* members of an array, or keys + values of an object */
    uint32_t next;       /* the next sibling (0: none; node 0 is the root, never a sibling) */
    double number;
};

struct shmipc__json {
    const char *text;
    size_t len;
    uint32_t n;
    struct shmipc__json_node nodes[SHMIPC__JSON_MAX_NODES];
};

/* Parses `text`; 0, or SHMIPC_EPROTO with a detail naming the fault and its byte offset. */
int shmipc__json_parse(struct shmipc__json *j, const char *text, size_t len);

/* The value of member `key` of object node `obj`, or -1. */
int shmipc__json_get(const struct shmipc__json *j, int obj, const char *key);

/* The first element of array node `arr` (-1 if empty); then shmipc__json_next(). */
int shmipc__json_first(const struct shmipc__json *j, int arr);
int shmipc__json_next(const struct shmipc__json *j, int node);

/* True when string node `node` equals the C string `s` (no escapes in either). */
int shmipc__json_string_is(const struct shmipc__json *j, int node, const char *s);

/*
 * Copies a string node, escapes decoded; an escape that stands for a control byte or for
 * anything beyond printable ASCII becomes '?', and so do DEL and C1 controls in UTF-8 when they
 * come raw (the text goes into details and logs). Its length.
 */
size_t shmipc__json_string(const struct shmipc__json *j, int node, char *out, size_t cap);

/* Writes `s` as a JSON string literal (quotes included) at out[*pos]; -1 when out is full. */
int shmipc__json_put_string(char *out, size_t cap, size_t *pos, const char *s);

#endif
