/*
 * Route handlers for /v1/schedules: create or replace (PUT), get, list,
 * delete, pause, resume, trigger, and the schedule's history. Writes are
 * answered after their commit, like job submissions.
 *
 * Threading: handlers run on MHD pool threads (see routes_jobs.c); the
 * schedule engine's callbacks run on the store's completion thread and
 * only hand their result to the request (park.c).
 */
#include "api/http_impl.h"

#include "common/alloc.h"
#include "server/schedules.h"

#include <cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The engine for r, or NULL with *ret its answer: 503 before the engine
 * is attached, 404 for a path id it would refuse (with_id). */
static struct jd_schedules *engine(struct jd_req *r, bool with_id, enum MHD_Result *ret)
{
    struct jd_schedules *s = http_schedules_of(r->h);
    if (s == NULL) {
        struct jd_error err;
        jd_error_set(&err, JD_ESHUTDOWN, NULL, "schedules are not loaded yet");
        *ret = http_respond_error(r, JD_ESHUTDOWN, &err);
        return NULL;
    }
    struct jd_error err = {0};
    if (with_id && jd_schedules_check_id(r->m.param, &err) != 0) {
        *ret = http_respond_problem(r, 404, err.message, NULL);
        return NULL;
    }
    return s;
}

/* The engine took r for a callback (rc 0) or refused it (404 for no such
 * schedule). */
static enum MHD_Result started(struct jd_req *r, int rc, jd_async_answer_fn *answer)
{
    struct jd_error err = {0};
    if (rc == JD_ENOENT)
        jd_error_set(&err, rc, NULL, "no such schedule");
    return http_async_started(r, rc, &err, answer);
}

/* The engine's callback: created rides in cb_existing (a PUT that made a
 * new schedule), the rest as an action's. */
static void on_done(void *arg, int rc, bool created, const char *json)
{
    struct jd_req *r = arg;
    pthread_mutex_lock(&r->mu);
    r->cb_existing = created;
    pthread_mutex_unlock(&r->mu);
    http_on_action_done(arg, rc, json);
}

/* 201 + Location for a new schedule, 200 for a replaced one. */
static enum MHD_Result answer_put(struct jd_req *r, const char *json)
{
    return http_respond_put(r, json, "/v1/schedules");
}

static enum MHD_Result answer_ok(struct jd_req *r, const char *json)
{
    return http_respond_json(r, 200, json ? json : "{}", NULL, NULL);
}

static enum MHD_Result answer_deleted(struct jd_req *r, const char *json)
{
    (void)json;
    return http_respond(r, 204, NULL, NULL, 0, NULL, NULL, NULL, NULL);
}

/* 201 with the job and its Location. */
static enum MHD_Result answer_triggered(struct jd_req *r, const char *json)
{
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    char loc[48] = "";
    if (cJSON_IsString(id) && strlen(id->valuestring) < 24) {
        snprintf(loc, sizeof loc, "/v1/jobs/%s", id->valuestring);
        snprintf(r->job_label, sizeof r->job_label, "%s", id->valuestring);
    }
    cJSON_Delete(o);
    return http_respond_json(r, 201, json ? json : "{}", loc[0] ? MHD_HTTP_HEADER_LOCATION : NULL,
                             loc);
}

static int start_put(struct jd_req *r, struct jd_error *err)
{
    return jd_schedules_put(http_schedules_of(r->h), r->m.param, r->body ? r->body : "", r->len,
                            on_done, r, err);
}

/* PUT /v1/schedules/{id} */
enum MHD_Result route_schedule_put(struct jd_req *r)
{
    enum MHD_Result ret;
    struct jd_schedules *s = engine(r, true, &ret);
    if (s == NULL)
        return ret;
    return http_async_run(r, start_put, answer_put);
}

/* GET /v1/schedules/{id} */
enum MHD_Result route_schedule_get(struct jd_req *r)
{
    enum MHD_Result ret;
    struct jd_schedules *s = engine(r, true, &ret);
    if (s == NULL)
        return ret;
    char *json = NULL;
    int rc = jd_schedules_get_json(s, r->m.param, &json);
    if (rc == JD_ENOENT)
        return http_respond_problem(r, 404, "no such schedule", NULL);
    return http_respond_json_rc(r, rc, json);
}

/* GET /v1/schedules */
enum MHD_Result route_schedule_list(struct jd_req *r)
{
    enum MHD_Result ret;
    struct jd_schedules *s = engine(r, false, &ret);
    if (s == NULL)
        return ret;
    unsigned limit;
    enum MHD_Result lret;
    if (!http_query_limit(r, 0, 1000, &limit, &lret))
        return lret;
    char *json = NULL;
    struct jd_error err = {0};
    int rc = jd_schedules_list_json(s, http_query(r, "cursor"), limit, &json, &err);
    if (rc == JD_EINVAL)
        return http_respond_problem(r, 400, err.message, NULL);
    return http_respond_json_rc(r, rc, json);
}

/* DELETE /v1/schedules/{id} */
enum MHD_Result route_schedule_delete(struct jd_req *r)
{
    enum MHD_Result ret;
    struct jd_schedules *s = engine(r, true, &ret);
    if (s == NULL)
        return ret;
    http_arm(r);
    http_req_ref(r);
    return started(r, jd_schedules_delete(s, r->m.param, on_done, r), answer_deleted);
}

/* POST /v1/schedules/{id}/pause and .../resume */
enum MHD_Result route_schedule_pause(struct jd_req *r)
{
    enum MHD_Result ret;
    struct jd_schedules *s = engine(r, true, &ret);
    if (s == NULL)
        return ret;
    http_arm(r);
    http_req_ref(r);
    bool pause = r->m.route == JD_ROUTE_SCHEDULE_PAUSE;
    return started(r, jd_schedules_pause(s, r->m.param, pause, on_done, r), answer_ok);
}

/* POST /v1/schedules/{id}/trigger */
enum MHD_Result route_schedule_trigger(struct jd_req *r)
{
    enum MHD_Result ret;
    struct jd_schedules *s = engine(r, true, &ret);
    if (s == NULL)
        return ret;
    struct jd_error err = {0};
    http_arm(r);
    http_req_ref(r);
    int rc = jd_schedules_trigger(s, r->m.param, on_done, r, &err);
    return http_async_started(r, rc, &err, answer_triggered);
}

/* GET /v1/schedules/{id}/events */
enum MHD_Result route_schedule_events(struct jd_req *r)
{
    enum MHD_Result ret;
    struct jd_schedules *s = engine(r, true, &ret);
    if (s == NULL)
        return ret;
    int64_t after = 0;
    const char *a = http_query(r, "after");
    if (a != NULL && http_parse_i64(a, &after) != 0)
        return http_respond_problem(r, 400, "after must be an event sequence number", NULL);
    unsigned limit;
    enum MHD_Result lret;
    if (!http_query_limit(r, 1000, 10000, &limit, &lret))
        return lret;
    char *json = NULL;
    int rc = jd_schedules_events_json(s, r->m.param, after, limit, &json);
    if (rc == JD_ENOENT)
        return http_respond_problem(r, 404, "no such schedule", NULL);
    return http_respond_json_rc(r, rc, json);
}
