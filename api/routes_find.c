/*
 * Route handlers for finding and acting on many jobs (issue 19): bulk
 * cancel and retry (202 with an operation, or 200 when nothing matches),
 * the operation's progress, and deleting a finished job. The filters of
 * GET /v1/jobs itself are read in routes_jobs.c (route_job_list).
 *
 * Threading: MHD pool threads, once per request; DELETE answers after the
 * commit (http_arm ... http_async_started), the others at once.
 */
#include "api/http_impl.h"

#include "api/problem.h"
#include "common/alloc.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct labels_acc {
    const char **out;
    size_t n, max;
};

static enum MHD_Result label_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *value)
{
    (void)kind;
    struct labels_acc *a = cls;
    if (strcmp(key, "label") != 0)
        return MHD_YES;
    if (a->n < a->max)
        a->out[a->n] = value ? value : "";
    a->n++;
    return a->n > a->max ? MHD_NO : MHD_YES; /* one past max is enough to refuse */
}

size_t http_query_labels(struct jd_req *r, const char **out, size_t max)
{
    struct labels_acc a = {.out = out, .n = 0, .max = max};
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, label_arg, &a);
    return a.n;
}

static enum MHD_Result answer_deleted(struct jd_req *r, const char *json)
{
    (void)json;
    return http_respond(r, 204, NULL, NULL, 0, NULL, NULL, NULL, NULL);
}

enum MHD_Result route_job_delete(struct jd_req *r)
{
    struct jd_error err = {0};
    int64_t id = 0;
    if (jd_jobs_parse_id(r->m.param, &id) != 0)
        return http_respond_bad_job_id(r);
    snprintf(r->job_label, sizeof r->job_label, "%" PRId64, id);
    http_arm(r);
    http_req_ref(r);
    int rc = jd_jobs_delete(http_jobs_of(r->h), id, http_on_action_done, r);
    if (rc == JD_ECONFLICT)
        jd_error_set(&err, rc, NULL, "job %" PRId64 " has not finished; cancel it first, or wait",
                     id);
    return http_async_started(r, rc, &err, answer_deleted);
}

enum MHD_Result route_jobs_bulk(struct jd_req *r)
{
    struct jd_error err = {0};
    enum jd_bulk_kind kind = r->m.route == JD_ROUTE_JOBS_CANCEL ? JD_BULK_CANCEL : JD_BULK_RETRY;
    char *json = NULL;
    bool started = false;
    int rc = jd_jobs_bulk_start(http_jobs_of(r->h), kind, r->body ? r->body : "", r->len, &json,
                                &started, &err);
    if (rc != 0)
        return http_respond_error(r, rc, &err);
    enum MHD_Result ret;
    if (started) {
        char loc[64];
        const char *id = strstr(json, "\"id\":\"");
        snprintf(loc, sizeof loc, "/v1/operations/%.*s", id ? (int)strcspn(id + 6, "\"") : 0,
                 id ? id + 6 : "");
        char *b = jd_xasprintf("%s\n", json);
        ret = http_respond(r, 202, "application/json", b, strlen(b), MHD_HTTP_HEADER_LOCATION, loc,
                           NULL, NULL);
    } else {
        ret = http_respond_json(r, 200, json, NULL, NULL);
    }
    free(json);
    return ret;
}

enum MHD_Result route_operation_get(struct jd_req *r)
{
    char *json = NULL;
    int rc = jd_jobs_operation_json(http_jobs_of(r->h), r->m.param, &json);
    if (rc == JD_ENOENT) {
        struct jd_error err = {0};
        jd_error_set(&err, rc, NULL,
                     "no operation with id %.32s (operations are kept in memory: the newest %d, "
                     "until a restart)",
                     r->m.param, JD_BULK_OPS_KEEP);
        return http_respond_error(r, rc, &err);
    }
    if (rc != 0)
        return http_respond_error(r, rc, NULL);
    enum MHD_Result ret = http_respond_json(r, 200, json, NULL, NULL);
    free(json);
    return ret;
}
