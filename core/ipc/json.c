#include "ipc/json.h"

#include "shmipc.h"
#include "common/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct parser {
    struct shmipc__json *j;
    size_t pos;
};

static int fault(struct parser *p, const char *what)
{
    return shmipc__fail(SHMIPC_EPROTO, "negotiation JSON: %s at byte %zu", what, p->pos);
}

static void skip_ws(struct parser *p)
{
    while (p->pos < p->j->len) {
        char c = p->j->text[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static int new_node(struct parser *p, int type, int depth)
{
    if (p->j->n == SHMIPC__JSON_MAX_NODES)
        return fault(p, "too many values");
    int id = (int)p->j->n++;
    struct shmipc__json_node *n = &p->j->nodes[id];
    memset(n, 0, sizeof *n);
    n->type = (uint8_t)type;
    n->depth = (uint16_t)depth;
    n->start = (uint32_t)p->pos;
    return id;
}

static int hex4(const char *s)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    return v;
}

static int parse_string(struct parser *p, int depth)
{
    int id = new_node(p, SHMIPC__JSON_STRING, depth);
    if (id < 0)
        return id;
    const char *t = p->j->text;
    p->pos++; /* opening quote */
    size_t start = p->pos;
    while (p->pos < p->j->len && t[p->pos] != '"') {
        unsigned char c = (unsigned char)t[p->pos];
        if (c < 0x20)
            return fault(p, "control character in a string");
        if (c == '\\') {
            if (p->pos + 1 >= p->j->len)
                return fault(p, "unfinished escape");
            char e = t[p->pos + 1];
            if (e == 'u') {
                if (p->pos + 6 > p->j->len || hex4(t + p->pos + 2) < 0)
                    return fault(p, "bad \\u escape");
                p->pos += 6;
                continue;
            }
            /* e != '\0' first: strchr() finds the terminator of its set. */
            if (e == '\0' || strchr("\"\\/bfnrt", e) == NULL)
                return fault(p, "bad escape");
            p->pos += 2;
            continue;
        }
        p->pos++;
    }
    if (p->pos >= p->j->len)
        return fault(p, "unterminated string");
    p->j->nodes[id].start = (uint32_t)start;
    p->j->nodes[id].len = (uint32_t)(p->pos - start);
    p->pos++;
    return id;
}

static int parse_value(struct parser *p, int depth);

/* Parses members (object) or elements (array) after the opening bracket. */
static int parse_container(struct parser *p, int depth, int object)
{
    int id = new_node(p, object ? SHMIPC__JSON_OBJECT : SHMIPC__JSON_ARRAY, depth);
    if (id < 0)
        return id;
    if (depth >= SHMIPC__JSON_MAX_DEPTH)
        return fault(p, "nested too deep");
    char close = object ? '}' : ']';
    int last = -1;
    p->pos++;
    skip_ws(p);
    if (p->pos < p->j->len && p->j->text[p->pos] == close) {
        p->pos++;
        p->j->nodes[id].len = (uint32_t)(p->pos - p->j->nodes[id].start);
        return id;
    }
    for (;;) {
        skip_ws(p);
        int child;
        if (object) {
            if (p->pos >= p->j->len || p->j->text[p->pos] != '"')
                return fault(p, "expected a member name");
            int key = parse_string(p, depth + 1);
            if (key < 0)
                return key;
            skip_ws(p);
            if (p->pos >= p->j->len || p->j->text[p->pos] != ':')
                return fault(p, "expected ':'");
            p->pos++;
            skip_ws(p);
            int value = parse_value(p, depth + 1);
            if (value < 0)
                return value;
            p->j->nodes[key].next = (uint32_t)value;
            child = key;
            if (last >= 0)
                p->j->nodes[last].next = (uint32_t)key;
            else
                p->j->nodes[id].children = (uint32_t)key;
            last = value;
        } else {
            child = parse_value(p, depth + 1);
            if (child < 0)
                return child;
            if (last >= 0)
                p->j->nodes[last].next = (uint32_t)child;
            else
                p->j->nodes[id].children = (uint32_t)child;
            last = child;
        }
        (void)child;
        skip_ws(p);
        if (p->pos >= p->j->len)
            return fault(p, "unterminated container");
        char c = p->j->text[p->pos++];
        if (c == close)
            break;
        if (c != ',')
            return fault(p, "expected ',' or the end of the container");
    }
    p->j->nodes[id].len = (uint32_t)(p->pos - p->j->nodes[id].start);
    return id;
}

static int parse_number(struct parser *p, int depth)
{
    int id = new_node(p, SHMIPC__JSON_NUMBER, depth);
    if (id < 0)
        return id;
    const char *t = p->j->text;
    size_t s = p->pos, n = p->j->len;
    if (p->pos < n && t[p->pos] == '-')
        p->pos++;
    if (p->pos >= n || t[p->pos] < '0' || t[p->pos] > '9')
        return fault(p, "bad number");
    if (t[p->pos] == '0')
        p->pos++;
    else
        while (p->pos < n && t[p->pos] >= '0' && t[p->pos] <= '9')
            p->pos++;
    if (p->pos < n && t[p->pos] == '.') {
        p->pos++;
        if (p->pos >= n || t[p->pos] < '0' || t[p->pos] > '9')
            return fault(p, "bad fraction");
        while (p->pos < n && t[p->pos] >= '0' && t[p->pos] <= '9')
            p->pos++;
    }
    if (p->pos < n && (t[p->pos] == 'e' || t[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < n && (t[p->pos] == '+' || t[p->pos] == '-'))
            p->pos++;
        if (p->pos >= n || t[p->pos] < '0' || t[p->pos] > '9')
            return fault(p, "bad exponent");
        while (p->pos < n && t[p->pos] >= '0' && t[p->pos] <= '9')
            p->pos++;
    }
    char buf[64];
    size_t len = p->pos - s;
    if (len >= sizeof buf)
        return fault(p, "number too long");
    memcpy(buf, t + s, len);
    buf[len] = '\0';
    p->j->nodes[id].number = strtod(buf, NULL);
    p->j->nodes[id].len = (uint32_t)len;
    if (!isfinite(p->j->nodes[id].number))
        return fault(p, "number out of range");
    return id;
}

static int parse_literal(struct parser *p, int depth, const char *word, int type, int value)
{
    size_t n = strlen(word);
    if (p->pos + n > p->j->len || memcmp(p->j->text + p->pos, word, n) != 0)
        return fault(p, "unexpected character");
    int id = new_node(p, type, depth);
    if (id < 0)
        return id;
    p->j->nodes[id].boolean = (uint8_t)value;
    p->j->nodes[id].len = (uint32_t)n;
    p->pos += n;
    return id;
}

static int parse_value(struct parser *p, int depth)
{
    if (p->pos >= p->j->len)
        return fault(p, "unexpected end");
    switch (p->j->text[p->pos]) {
    case '{':
        return parse_container(p, depth, 1);
    case '[':
        return parse_container(p, depth, 0);
    case '"':
        return parse_string(p, depth);
    case 't':
        return parse_literal(p, depth, "true", SHMIPC__JSON_BOOL, 1);
    case 'f':
        return parse_literal(p, depth, "false", SHMIPC__JSON_BOOL, 0);
    case 'n':
        return parse_literal(p, depth, "null", SHMIPC__JSON_NULL, 0);
    default:
        return parse_number(p, depth);
    }
}

int shmipc__json_parse(struct shmipc__json *j, const char *text, size_t len)
{
    struct parser p = {j, 0};
    j->text = text;
    j->len = len;
    j->n = 0;
    skip_ws(&p);
    int root = parse_value(&p, 0);
    if (root < 0)
        return root;
    skip_ws(&p);
    if (p.pos != len)
        return fault(&p, "trailing characters");
    return 0;
}

int shmipc__json_get(const struct shmipc__json *j, int obj, const char *key)
{
    if (obj < 0 || j->nodes[obj].type != SHMIPC__JSON_OBJECT || j->nodes[obj].children == 0)
        return -1;
    for (int k = (int)j->nodes[obj].children; k > 0;) {
        int v = (int)j->nodes[k].next;
        if (shmipc__json_string_is(j, k, key))
            return v;
        k = (int)j->nodes[v].next;
    }
    return -1;
}

int shmipc__json_first(const struct shmipc__json *j, int arr)
{
    if (arr < 0 || j->nodes[arr].type != SHMIPC__JSON_ARRAY || j->nodes[arr].children == 0)
        return -1;
    return (int)j->nodes[arr].children;
}

int shmipc__json_next(const struct shmipc__json *j, int node)
{
    return j->nodes[node].next ? (int)j->nodes[node].next : -1;
}

int shmipc__json_string_is(const struct shmipc__json *j, int node, const char *s)
{
    if (node < 0 || j->nodes[node].type != SHMIPC__JSON_STRING)
        return 0;
    size_t n = strlen(s);
    return j->nodes[node].len == n && memcmp(j->text + j->nodes[node].start, s, n) == 0;
}

size_t shmipc__json_string(const struct shmipc__json *j, int node, char *out, size_t cap)
{
    size_t o = 0;
    if (cap == 0)
        return 0;
    if (node >= 0 && j->nodes[node].type == SHMIPC__JSON_STRING) {
        const char *t = j->text + j->nodes[node].start;
        for (size_t i = 0; i < j->nodes[node].len && o + 1 < cap; i++) {
            char c = t[i];
            /*
             * Raw text gets the same treatment as escapes: DEL, and a C1 control (U+0080 ..
             * U+009F, 0xc2 0x80 .. 0xc2 0x9f in UTF-8; U+009B is a CSI to terminals that take
             * C1 controls), become '?'. The parser already refused bytes below 0x20; other
             * UTF-8 passes.
             */
            if (c == 0x7f) {
                c = '?';
            } else if ((unsigned char)c == 0xc2 && i + 1 < j->nodes[node].len &&
                       (unsigned char)t[i + 1] >= 0x80 && (unsigned char)t[i + 1] <= 0x9f) {
                c = '?';
                i++;
            } else if (c == '\\') {
                char e = t[++i];
                if (e == 'u') {
                    int v = hex4(t + i + 1);
                    c = v >= 0x20 && v < 0x7f ? (char)v : '?';
                    i += 4;
                } else {
                    /*
                     * \n, \t, \r, \b, \f: control bytes, as from \u above. The text is
                     * the peer's and goes into error details and logs, where a newline
                     * would forge a line: '?' instead. \" \\ \/ stand for themselves.
                     */
                    c = strchr("ntrbf", e) != NULL ? '?' : e;
                }
            }
            out[o++] = c;
        }
    }
    out[o] = '\0';
    return o;
}

int shmipc__json_put_string(char *out, size_t cap, size_t *pos, const char *s)
{
    size_t o = *pos;
    if (o >= cap)
        return -1;
    out[o++] = '"';
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        const char *w = esc;
        size_t n = 1;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            n = 2;
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            n = 6;
        } else {
            esc[0] = (char)c;
        }
        if (o + n >= cap)
            return -1;
        memcpy(out + o, w, n);
        o += n;
    }
    if (o + 1 >= cap)
        return -1;
    out[o++] = '"';
    out[o] = '\0';
    *pos = o;
    return 0;
}
