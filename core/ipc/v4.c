#include "ipc/v4.h"

#include "common/error.h"
#include "common/version.h"
#include "ipc/json.h"
#include "ipc/proto.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Appends printf-style text at out[*pos]; -1 when it does not fit. */
static int put(char *out, size_t cap, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int put(char *out, size_t cap, size_t *pos, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out + *pos, cap - *pos, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *pos)
        return -1;
    *pos += (size_t)n;
    return 0;
}

static int put_features(char *out, size_t cap, size_t *pos, unsigned features)
{
    int first = 1, rc = put(out, cap, pos, "[");
    if (rc == 0 && (features & SHMIPC_V4_FEATURE_POLLING)) {
        rc = put(out, cap, pos, "\"%s\"", SHMIPC__V4_FEATURE_POLLING_NAME);
        first = 0;
    }
    if (rc == 0 && (features & SHMIPC_V4_FEATURE_EVENTFD))
        rc = put(out, cap, pos, "%s\"%s\"", first ? "" : ",", SHMIPC__V4_FEATURE_EVENTFD_NAME);
    return rc == 0 ? put(out, cap, pos, "]") : rc;
}

static int put_settings(char *out, size_t cap, size_t *pos, unsigned features, uint32_t interval)
{
    if (features & SHMIPC_V4_FEATURE_POLLING)
        return put(out, cap, pos, "{\"%s\":{\"polling_interval_us\":%u}}",
                   SHMIPC__V4_FEATURE_POLLING_NAME, interval);
    return put(out, cap, pos, "{}");
}

/* Wraps the JSON written at out[8..pos) in a Negotiation header. */
static int finish(uint8_t *out, size_t pos, int rc)
{
    if (rc < 0)
        return shmipc__fail(SHMIPC_EMSGSIZE, "negotiation: message does not fit");
    shmipc__header_encode(out, (uint32_t)pos, 0, SHMIPC__MSG_NEGOTIATION);
    return (int)pos;
}

int shmipc__v4_encode_request(const struct shmipc__v4_request *r, uint8_t *out, size_t cap)
{
    char *o = (char *)out;
    size_t pos = SHMIPC__HEADER_SIZE;
    if (cap > SHMIPC__MAX_NEGOTIATION)
        cap = SHMIPC__MAX_NEGOTIATION;
    int rc = put(o, cap, &pos, "{\"supports_protocols\":[4],\"sdk_name\":");
    rc = rc ? rc : shmipc__json_put_string(o, cap, &pos, r->sdk_name);
    rc = rc ? rc : put(o, cap, &pos, ",\"sdk_version\":");
    rc = rc ? rc : shmipc__json_put_string(o, cap, &pos, r->sdk_version);
    rc = rc ? rc : put(o, cap, &pos, ",\"supports_features\":");
    rc = rc ? rc : put_features(o, cap, &pos, r->features);
    rc = rc ? rc : put(o, cap, &pos, ",\"settings\":");
    rc = rc ? rc : put_settings(o, cap, &pos, r->features, r->interval_us);
    rc = rc ? rc : put(o, cap, &pos, "}");
    return finish(out, pos, rc);
}

int shmipc__v4_encode_response(const struct shmipc__v4_response *r, uint8_t *out, size_t cap)
{
    char *o = (char *)out;
    size_t pos = SHMIPC__HEADER_SIZE;
    if (cap > SHMIPC__MAX_NEGOTIATION)
        cap = SHMIPC__MAX_NEGOTIATION;
    int rc = put(o, cap, &pos,
                 "{\"selected_protocol\":%d,\"sdk_name\":\"%s\",\"sdk_version\":\"%s\","
                 "\"selected_features\":",
                 r->protocol, SHMIPC__V4_SDK_NAME, shmipc__version_string());
    rc = rc ? rc : put_features(o, cap, &pos, r->features);
    rc = rc ? rc : put(o, cap, &pos, ",\"settings\":");
    rc = rc ? rc : put_settings(o, cap, &pos, r->features, r->interval_us);
    if (rc == 0 && r->error_code[0] != '\0') {
        rc = put(o, cap, &pos, ",\"error\":{\"code\":");
        rc = rc ? rc : shmipc__json_put_string(o, cap, &pos, r->error_code);
        rc = rc ? rc : put(o, cap, &pos, ",\"message\":");
        rc = rc ? rc : shmipc__json_put_string(o, cap, &pos, r->error_message);
        rc = rc ? rc : put(o, cap, &pos, "}");
    }
    rc = rc ? rc : put(o, cap, &pos, "}");
    return finish(out, pos, rc);
}

/* Reads an integer member within lo..hi; -1 when absent, SHMIPC_EPROTO when ill-typed. */
static int64_t get_int(const struct shmipc__json *j, int obj, const char *key, int64_t lo,
                       int64_t hi)
{
    int v = shmipc__json_get(j, obj, key);
    if (v < 0)
        return -1;
    double d = j->nodes[v].number;
    if (j->nodes[v].type != SHMIPC__JSON_NUMBER || d != floor(d) || d < (double)lo ||
        d > (double)hi)
        return shmipc__fail(SHMIPC_EPROTO, "negotiation: \"%s\" must be an integer in %lld..%lld",
                            key, (long long)lo, (long long)hi);
    return (int64_t)d;
}

/* Reads a feature list; unknown names are ignored, as a newer peer may offer more. */
static int get_features(const struct shmipc__json *j, int obj, const char *key, unsigned *out)
{
    int arr = shmipc__json_get(j, obj, key);
    *out = 0;
    if (arr < 0)
        return 0;
    if (j->nodes[arr].type != SHMIPC__JSON_ARRAY)
        return shmipc__fail(SHMIPC_EPROTO, "negotiation: \"%s\" must be an array", key);
    for (int e = shmipc__json_first(j, arr); e >= 0; e = shmipc__json_next(j, e)) {
        if (j->nodes[e].type != SHMIPC__JSON_STRING)
            return shmipc__fail(SHMIPC_EPROTO, "negotiation: \"%s\" must hold strings", key);
        if (shmipc__json_string_is(j, e, SHMIPC__V4_FEATURE_POLLING_NAME))
            *out |= SHMIPC_V4_FEATURE_POLLING;
        else if (shmipc__json_string_is(j, e, SHMIPC__V4_FEATURE_EVENTFD_NAME))
            *out |= SHMIPC_V4_FEATURE_EVENTFD;
    }
    return 0;
}

static int get_interval(const struct shmipc__json *j, int root, uint32_t *out)
{
    int settings = shmipc__json_get(j, root, "settings");
    int polling = shmipc__json_get(j, settings, SHMIPC__V4_FEATURE_POLLING_NAME);
    int64_t v = get_int(j, polling, "polling_interval_us", 0, UINT32_MAX);
    if (v < -1)
        return (int)v;
    *out = v < 0 ? 0 : (uint32_t)v;
    return 0;
}

static int parse_root(struct shmipc__json *j, const uint8_t *json, size_t len)
{
    int rc = shmipc__json_parse(j, (const char *)json, len);
    if (rc < 0)
        return rc;
    if (j->nodes[0].type != SHMIPC__JSON_OBJECT)
        return shmipc__fail(SHMIPC_EPROTO, "negotiation: the message is not a JSON object");
    return 0;
}

int shmipc__v4_parse_request(const uint8_t *json, size_t len, struct shmipc__v4_request *r)
{
    /* Zeroed only to spare the static analyser a false alarm; the parser fills what it uses. */
    struct shmipc__json j = {0};
    int rc;
    memset(r, 0, sizeof *r);
    if ((rc = parse_root(&j, json, len)) < 0)
        return rc;
    int protos = shmipc__json_get(&j, 0, "supports_protocols");
    if (protos < 0 || j.nodes[protos].type != SHMIPC__JSON_ARRAY)
        return shmipc__fail(SHMIPC_EPROTO, "negotiation: \"supports_protocols\" is missing");
    for (int e = shmipc__json_first(&j, protos); e >= 0; e = shmipc__json_next(&j, e)) {
        if (j.nodes[e].type != SHMIPC__JSON_NUMBER)
            return shmipc__fail(SHMIPC_EPROTO, "negotiation: protocols must be numbers");
        r->wants_v4 |= j.nodes[e].number == 4;
    }
    if ((rc = get_features(&j, 0, "supports_features", &r->features)) < 0 ||
        (rc = get_interval(&j, 0, &r->interval_us)) < 0)
        return rc;
    shmipc__json_string(&j, shmipc__json_get(&j, 0, "sdk_name"), r->sdk_name, sizeof r->sdk_name);
    shmipc__json_string(&j, shmipc__json_get(&j, 0, "sdk_version"), r->sdk_version,
                        sizeof r->sdk_version);
    return 0;
}

int shmipc__v4_parse_response(const uint8_t *json, size_t len, struct shmipc__v4_response *r)
{
    /* Zeroed only to spare the static analyser a false alarm; the parser fills what it uses. */
    struct shmipc__json j = {0};
    int rc;
    memset(r, 0, sizeof *r);
    if ((rc = parse_root(&j, json, len)) < 0)
        return rc;
    int64_t proto = get_int(&j, 0, "selected_protocol", 0, 255);
    if (proto < -1)
        return (int)proto;
    if (proto < 0)
        return shmipc__fail(SHMIPC_EPROTO, "negotiation: \"selected_protocol\" is missing");
    r->protocol = (int)proto;
    int err = shmipc__json_get(&j, 0, "error");
    if (err >= 0 && j.nodes[err].type == SHMIPC__JSON_OBJECT) {
        shmipc__json_string(&j, shmipc__json_get(&j, err, "code"), r->error_code,
                            sizeof r->error_code);
        shmipc__json_string(&j, shmipc__json_get(&j, err, "message"), r->error_message,
                            sizeof r->error_message);
        if (r->error_code[0] == '\0')
            strcpy(r->error_code, "UNKNOWN");
    }
    if ((rc = get_features(&j, 0, "selected_features", &r->features)) < 0 ||
        (rc = get_interval(&j, 0, &r->interval_us)) < 0)
        return rc;
    return 0;
}

void shmipc__v4_select(const struct shmipc__v4_request *req, unsigned offered, int eventfd_ok,
                       struct shmipc__v4_response *resp)
{
    memset(resp, 0, sizeof *resp);
    if (!req->wants_v4) {
        strcpy(resp->error_code, "VERSION_NOT_SUPPORTED");
        snprintf(resp->error_message, sizeof resp->error_message,
                 "this server speaks protocol 4 (and legacy 2 and 3)");
        return;
    }
    resp->protocol = 4;
    if ((req->features & SHMIPC_V4_FEATURE_POLLING) && (offered & SHMIPC_V4_FEATURE_POLLING)) {
        if (req->interval_us < SHMIPC_MIN_POLLING_INTERVAL_US ||
            req->interval_us > SHMIPC_MAX_POLLING_INTERVAL_US) {
            resp->protocol = 0;
            strcpy(resp->error_code, "INVALID_SETTINGS");
            snprintf(resp->error_message, sizeof resp->error_message,
                     "polling_interval_us %u is outside %u..%u", req->interval_us,
                     SHMIPC_MIN_POLLING_INTERVAL_US, SHMIPC_MAX_POLLING_INTERVAL_US);
            return;
        }
        resp->features = SHMIPC_V4_FEATURE_POLLING;
        resp->interval_us = req->interval_us;
    } else if ((req->features & SHMIPC_V4_FEATURE_EVENTFD) &&
               (offered & SHMIPC_V4_FEATURE_EVENTFD) && eventfd_ok) {
        resp->features = SHMIPC_V4_FEATURE_EVENTFD;
    }
}
