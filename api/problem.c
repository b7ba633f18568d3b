/*
 * Problem details, bearer-token comparison and content-type checks. The
 * problem JSON is built with cJSON so that any detail text (which may echo
 * user input) is escaped correctly. The type is "about:blank" (the
 * status says what kind of problem it is), except for the few conflicts a
 * client must tell apart (jd_problem_json_reason). No shared state.
 */
#include "api/problem.h"

#include "common/alloc.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct status_text {
    int status;
    const char *reason;
};

static const struct status_text statuses[] = {
    {200, "OK"},
    {201, "Created"},
    {202, "Accepted"},
    {400, "Bad Request"},
    {401, "Unauthorized"},
    {403, "Forbidden"},
    {404, "Not Found"},
    {405, "Method Not Allowed"},
    {409, "Conflict"},
    {413, "Content Too Large"},
    {415, "Unsupported Media Type"},
    {422, "Unprocessable Content"},
    {429, "Too Many Requests"},
    {500, "Internal Server Error"},
    {503, "Service Unavailable"},
    {504, "Gateway Timeout"},
};

static const struct status_text *find(int status)
{
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
        if (statuses[i].status == status)
            return &statuses[i];
    return NULL;
}

const char *jd_http_reason(int status)
{
    const struct status_text *s = find(status);
    return s ? s->reason : "Error";
}

char *jd_problem_json(int status, const char *detail, const char *pointer, const char *instance,
                      const char *request_id)
{
    return jd_problem_json_reason(status, NULL, detail, pointer, instance, request_id);
}

char *jd_problem_json_reason(int status, const char *reason, const char *detail,
                             const char *pointer, const char *instance, const char *request_id)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        abort();
    /* "about:blank" (RFC 9457 section 4.2.1): the problem means no more than
     * its HTTP status, and the title is that status's phrase. Every error
     * here is one per status, so a type URI of our own would add nothing but
     * a link to a page that does not exist; detail and pointer say what to
     * fix. */
    if (reason != NULL) {
        /* The status alone cannot say which of several conflicts it was
         * (a task's lease lost, its job cancelled, already completed). */
        char type[96];
        snprintf(type, sizeof type, "urn:jackdaw:problem:%.60s", reason);
        cJSON_AddStringToObject(o, "type", type);
        cJSON_AddStringToObject(o, "reason", reason);
    } else {
        cJSON_AddStringToObject(o, "type", "about:blank");
    }
    cJSON_AddStringToObject(o, "title", jd_http_reason(status));
    cJSON_AddNumberToObject(o, "status", status);
    if (detail != NULL && detail[0] != '\0')
        cJSON_AddStringToObject(o, "detail", detail);
    if (instance != NULL && instance[0] != '\0')
        cJSON_AddStringToObject(o, "instance", instance);
    if (pointer != NULL && pointer[0] != '\0')
        cJSON_AddStringToObject(o, "pointer", pointer);
    if (request_id != NULL && request_id[0] != '\0')
        cJSON_AddStringToObject(o, "request_id", request_id);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (text == NULL)
        abort();
    size_t n = strlen(text);
    char *out = jd_xmalloc(n + 2);
    memcpy(out, text, n);
    out[n] = '\n';
    out[n + 1] = '\0';
    cJSON_free(text);
    return out;
}

int jd_auth_bearer_ok(const char *header, const char *token)
{
    if (header == NULL || token == NULL)
        return 0;
    if (strncasecmp(header, "Bearer ", 7) != 0)
        return 0;
    const unsigned char *given = (const unsigned char *)header + 7;
    const unsigned char *want = (const unsigned char *)token;
    size_t gl = strlen((const char *)given);
    size_t wl = strlen(token);
    /* Walk the full length of the presented value, comparing with the token
     * cyclically, and fold the length difference in: the loop count depends
     * on the header only, the result on every byte. */
    volatile unsigned char diff = (unsigned char)(gl != wl);
    for (size_t i = 0; i < gl; i++)
        diff |= (unsigned char)(given[i] ^ (wl ? want[i % wl] : 0xff));
    return diff == 0 && wl > 0;
}

int jd_content_type_is_json(const char *ct)
{
    if (ct == NULL)
        return 1;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    if (*ct == '\0')
        return 1;
    size_t n = strcspn(ct, ";");
    while (n > 0 && isspace((unsigned char)ct[n - 1]))
        n--;
    if (n == 16 && strncasecmp(ct, "application/json", 16) == 0)
        return 1;
    /* application/<something>+json, e.g. application/merge-patch+json */
    if (n > 17 && strncasecmp(ct, "application/", 12) == 0 &&
        strncasecmp(ct + n - 5, "+json", 5) == 0)
        return 1;
    return 0;
}

int jd_utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned cp, min;
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
            cp = c & 0x1f;
            min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            cp = c & 0x0f;
            min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            cp = c & 0x07;
            min = 0x10000;
        } else {
            return 0;
        }
        if (n - i < len)
            return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += len;
    }
    return 1;
}
