/*
 * libFuzzer harness for the request front door: the router, the
 * content-type and UTF-8 checks, bearer comparison and problem+json
 * rendering. Input: "<method> <path>\n<header value>\n<detail>". Asserts the
 * invariants the HTTP layer relies on (every input routes to 0/404/405, a
 * 405 has an Allow set, parameters are bounded, problem+json is valid JSON
 * ending in a newline). Single-threaded.
 */
#include "api/problem.h"
#include "api/router.h"
#include "common/error.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static char *take_line(const uint8_t **p, const uint8_t *end)
{
    const uint8_t *s = *p;
    const uint8_t *nl = memchr(s, '\n', (size_t)(end - s));
    size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
    char *out = malloc(n + 1);
    memcpy(out, s, n);
    out[n] = '\0';
    *p = nl ? nl + 1 : end;
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data, *end = data + size;
    char *first = take_line(&p, end);
    char *hdr = take_line(&p, end);
    char *detail = take_line(&p, end);

    char *sp = strchr(first, ' ');
    const char *method = first;
    const char *path = "";
    if (sp != NULL) {
        *sp = '\0';
        path = sp + 1;
    }
    struct jd_route_match m;
    int rc = jd_router_match(method, path, &m);
    if (rc == 0) {
        if (m.route <= JD_ROUTE_NONE || m.route >= JD_ROUTE_COUNT)
            abort();
        if (strlen(m.param) >= JD_ROUTE_PARAM_MAX)
            abort();
        if (jd_route_name(m.route)[0] != '/')
            abort();
    } else if (rc == JD_ECONFLICT) {
        if (m.allow == 0 || jd_router_allow_text(m.allow)[0] == '\0')
            abort();
    } else if (rc != JD_ENOENT) {
        abort();
    }

    (void)jd_content_type_is_json(hdr);
    (void)jd_auth_bearer_ok(hdr, "s3cret");
    if (jd_auth_bearer_ok(hdr, "s3cret") && strcmp(hdr + 7, "s3cret") != 0)
        abort(); /* a match must be the exact token */
    (void)jd_utf8_valid(detail, strlen(detail));

    /* Problem details must stay valid JSON whatever the detail holds (cJSON
     * escapes; invalid UTF-8 is passed through byte for byte). */
    if (jd_utf8_valid(detail, strlen(detail))) {
        char *json = jd_problem_json(422, detail, path, path, hdr);
        size_t n = strlen(json);
        if (n == 0 || json[n - 1] != '\n')
            abort();
        cJSON *o = cJSON_Parse(json);
        if (o == NULL)
            abort();
        cJSON *d = cJSON_GetObjectItem(o, "detail");
        if (detail[0] != '\0' && (d == NULL || strcmp(d->valuestring, detail) != 0))
            abort();
        cJSON_Delete(o);
        free(json);
    }
    free(first);
    free(hdr);
    free(detail);
    return 0;
}
