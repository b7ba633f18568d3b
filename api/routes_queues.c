/*
 * Route handlers for /v1/queues: the queue counts with their controls, one
 * queue, setting a queue's controls (PUT), and pausing or resuming a queue
 * (writes answered after the commit).
 *
 * Threading: handlers run on MHD pool threads (see routes_jobs.c).
 */
#include "api/http_impl.h"

#include "common/alloc.h"

#include <stdlib.h>
#include <string.h>

static bool queue_name_ok(const char *q)
{
    size_t n = strlen(q);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = q[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              c == '-' || c == '_' || c == '.'))
            return false;
    }
    return true;
}

enum MHD_Result route_queues(struct jd_req *r)
{
    char *text = NULL;
    int rc = jd_jobs_queues_json(http_jobs_of(r->h), &text);
    return http_respond_json_rc(r, rc, text);
}

/* GET /v1/queues/{queue} */
enum MHD_Result route_queue_get(struct jd_req *r)
{
    char *text = NULL;
    if (!queue_name_ok(r->m.param))
        return http_respond_problem(r, 404, "no such queue (names are [A-Za-z0-9._-]{1,64})", NULL);
    int rc = jd_jobs_queue_json(http_jobs_of(r->h), r->m.param, &text);
    return http_respond_json_rc(r, rc, text);
}

static enum MHD_Result answer_queue(struct jd_req *r, const char *json)
{
    return http_respond_json(r, 200, json ? json : "{}", NULL, NULL);
}

/* PUT /v1/queues/{queue}: replace its controls; 200 with the queue. */
enum MHD_Result route_queue_put(struct jd_req *r)
{
    struct jd_error err = {0};
    if (!queue_name_ok(r->m.param))
        return http_respond_problem(r, 404, "no such queue (names are [A-Za-z0-9._-]{1,64})", NULL);
    http_arm(r);
    http_req_ref(r);
    int rc = jd_jobs_queue_configure(http_jobs_of(r->h), r->m.param, r->body ? r->body : "", r->len,
                                     http_on_action_done, r, &err);
    return http_async_started(r, rc, &err, answer_queue);
}

/* 200 with the queue's new state. */
static enum MHD_Result answer_paused(struct jd_req *r, const char *json)
{
    if (json != NULL)
        return http_respond_json(r, 200, json, NULL, NULL);
    char *b = jd_xasprintf("{\"name\":\"%s\",\"paused\":%s}\n", r->m.param,
                           r->m.route == JD_ROUTE_QUEUE_PAUSE ? "true" : "false");
    return http_respond(r, 200, "application/json", b, strlen(b), NULL, NULL, NULL, NULL);
}

/* POST /v1/queues/{queue}/pause and .../resume. */
enum MHD_Result route_queue_pause(struct jd_req *r)
{
    struct jd_error err = {0};
    if (!queue_name_ok(r->m.param))
        return http_respond_problem(r, 404, "no such queue (names are [A-Za-z0-9._-]{1,64})", NULL);
    http_arm(r);
    http_req_ref(r);
    int rc = jd_jobs_queue_pause(http_jobs_of(r->h), r->m.param, r->m.route == JD_ROUTE_QUEUE_PAUSE,
                                 http_on_action_done, r);
    return http_async_started(r, rc, &err, answer_paused);
}
