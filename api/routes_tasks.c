/*
 * Route handlers for remote commands and their tasks (server/tasks.h):
 * /v1/commands (register, list, get, delete) and /v1/tasks (claim, complete,
 * fail). Writes are answered after their commit; a claim with wait_ms
 * parks its connection until the job layer answers it (a task arrived, the
 * wait ended, or drain), counted against --max-parked like ?wait=.
 *
 * Threading: handlers run on MHD pool threads; the job layer's callbacks
 * run on its threads (the store's completion thread, the timer thread)
 * and only hand their result to the request (park.c).
 */
#include "api/http_impl.h"

#include "api/problem.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "server/tasks.h"
#include "storage/store.h"

#include <cjson/cJSON.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static enum MHD_Result answer_ok(struct jd_req *r, const char *json)
{
    return http_respond_json(r, 200, json ? json : "{}", NULL, NULL);
}

/* 201 + Location for a new command, 200 for a replaced one. */
static enum MHD_Result answer_put(struct jd_req *r, const char *json)
{
    return http_respond_put(r, json, "/v1/commands");
}

static enum MHD_Result answer_deleted(struct jd_req *r, const char *json)
{
    (void)json;
    return http_respond(r, 204, NULL, NULL, 0, NULL, NULL, NULL, NULL);
}

/* 409 with the reason as the problem's type, or the usual problem. */
static enum MHD_Result refuse(struct jd_req *r, int rc, const char *reason,
                              const struct jd_error *err)
{
    if (rc != JD_ECONFLICT || reason == NULL) {
        /* A claim's unknown command is the body's fault; the path's id is
         * simply not found. */
        return http_respond_error(r, rc, err);
    }
    char *b = jd_problem_json_reason(409, reason, err->message, NULL, r->path, r->rid);
    return http_respond(r, 409, "application/problem+json", b, strlen(b), NULL, NULL, NULL, NULL);
}

/* GET /v1/commands */
enum MHD_Result route_command_list(struct jd_req *r)
{
    char *json = NULL;
    int rc = jd_jobs_commands_json(http_jobs_of(r->h), &json);
    return http_respond_json_rc(r, rc, json);
}

/* GET /v1/commands/{name} */
enum MHD_Result route_command_get(struct jd_req *r)
{
    char *json = NULL;
    int rc = jd_jobs_command_get_json(http_jobs_of(r->h), r->m.param, &json);
    if (rc == JD_ENOENT)
        return http_respond_problem(r, 404, "no such remote command", NULL);
    return http_respond_json_rc(r, rc, json);
}

/* PUT /v1/commands/{name} */
enum MHD_Result route_command_put(struct jd_req *r)
{
    struct jd_error err = {0};
    bool created = false;
    http_arm(r);
    http_req_ref(r);
    int rc = jd_jobs_command_put(http_jobs_of(r->h), r->m.param, r->body ? r->body : "", r->len,
                                 &created, http_on_action_done, r, &err);
    if (rc == JD_EINVAL && err.pointer[0] == '\0' &&
        strncmp(err.message, "a command name", 14) == 0)
        rc = JD_ENOENT, err.code = JD_ENOENT; /* a path that cannot name a command */
    pthread_mutex_lock(&r->mu);
    r->cb_existing = created;
    pthread_mutex_unlock(&r->mu);
    return http_async_started(r, rc, &err, answer_put);
}

/* DELETE /v1/commands/{name} */
enum MHD_Result route_command_delete(struct jd_req *r)
{
    struct jd_error err = {0};
    http_arm(r);
    http_req_ref(r);
    int rc = jd_jobs_command_delete(http_jobs_of(r->h), r->m.param, http_on_action_done, r, &err);
    return http_async_started(r, rc, &err, answer_deleted);
}

/* A suspended connection is not polled by MHD: look at the socket itself.
 * The peer's FIN (or a reset) reads as POLLRDHUP / POLLHUP / POLLERR at
 * once; a client that only half-closed after its request is taken as gone,
 * as for long-polls (README). */
bool jd_http_claim_alive(void *req)
{
    struct jd_req *r = req;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL)
        return true;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) != 1)
        return true;
    return !(p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* POST /v1/tasks/claim */
enum MHD_Result route_task_claim(struct jd_req *r)
{
    struct jd_http *h = r->h;
    if (!http_parked_slot_take(r))
        return http_respond_problem(r, 429, "too many waiting connections", NULL);
    struct jd_error err = {0};
    http_arm(r);
    http_req_ref(r);
    /* The parked slot goes back with the request, however it ends (on_completed). */
    /* A claim another node forwarded takes only this node's tasks (one hop). */
    bool here = http_header(r, "Jackdaw-Forwarded") != NULL;
    int rc = (here ? jd_jobs_task_claim_here : jd_jobs_task_claim)(
        http_jobs_of(h), r->body ? r->body : "", r->len, http_on_action_done, r, &err);
    return http_async_started(r, rc, &err, answer_ok);
}

/* POST /v1/tasks/{id}/complete (which 0), /fail (1), /heartbeat (2) */
static enum MHD_Result task_end(struct jd_req *r, int which)
{
    struct jd_error err = {0};
    const char *reason = NULL;
    int64_t node = 0;
    /* A cluster node answers for the tasks it made; another node's go to
     * it (one hop: a request another node forwarded is answered here). */
    if (r->h->fwd && jd_task_id_parse(r->m.param, &node) && node != 0 &&
        node != jd_store_node_id(r->h->store) && http_header(r, "Jackdaw-Forwarded") == NULL)
        return http_forward_relay(r, node, which);
    http_arm(r);
    http_req_ref(r);
    struct jd_jobs *j = http_jobs_of(r->h);
    const char *b = r->body ? r->body : "";
    const char *id = r->m.param;
    int rc;
    if (which == 0)
        rc = jd_jobs_task_complete(j, id, b, r->len, http_on_action_done, r, &reason, &err);
    else if (which == 1)
        rc = jd_jobs_task_fail(j, id, b, r->len, http_on_action_done, r, &reason, &err);
    else
        rc = jd_jobs_task_heartbeat(j, id, b, r->len, http_on_action_done, r, &reason, &err);
    if (rc == JD_ECONFLICT) {
        http_req_unref(r); /* the callback's reference: it will never run */
        pthread_mutex_lock(&r->mu);
        r->armed = false;
        pthread_mutex_unlock(&r->mu);
        return refuse(r, rc, reason, &err);
    }
    return http_async_started(r, rc, &err, answer_ok);
}

enum MHD_Result route_task_complete(struct jd_req *r)
{
    return task_end(r, 0);
}

enum MHD_Result route_task_fail(struct jd_req *r)
{
    return task_end(r, 1);
}

/* Whether a batch (not forwarded to this node) names another node's task. */
static bool batch_names_others(struct jd_req *r)
{
    if (!r->h->fwd || http_header(r, "Jackdaw-Forwarded") != NULL)
        return false;
    cJSON *o = cJSON_ParseWithLength(r->body ? r->body : "", r->len);
    int64_t me = jd_store_node_id(r->h->store), node;
    bool any = false;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(o, "tasks"))
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        any |= cJSON_IsString(id) && jd_task_id_parse(id->valuestring, &node) && node != 0 &&
               node != me;
    }
    cJSON_Delete(o);
    return any;
}

/* POST /v1/tasks/complete */
enum MHD_Result route_task_batch(struct jd_req *r)
{
    struct jd_error err = {0};
    if (batch_names_others(r)) {
        /* Checked whole here first: all or nothing for bad input. */
        int rc = jd_jobs_task_batch_check(http_jobs_of(r->h), r->body ? r->body : "", r->len, &err);
        if (rc)
            return http_respond_error(r, rc, &err);
        return http_forward_relay(r, 0, -1);
    }
    http_arm(r);
    http_req_ref(r);
    int rc = jd_jobs_task_end_batch(http_jobs_of(r->h), r->body ? r->body : "", r->len,
                                    http_on_action_done, r, &err);
    return http_async_started(r, rc, &err, answer_ok);
}

enum MHD_Result route_task_heartbeat(struct jd_req *r)
{
    return task_end(r, 2);
}

#define WORKERS_DEFAULT_MS (5 * 60 * 1000) /* "seen lately" */
#define WORKERS_MAX_MS (24 * 3600 * 1000)

/* GET /v1/workers?within=5m */
enum MHD_Result route_workers(struct jd_req *r)
{
    const char *w = http_query(r, "within");
    int64_t ms = WORKERS_DEFAULT_MS;
    if (w != NULL && (jd_duration_parse(w, &ms) != 0 || ms <= 0 || ms > WORKERS_MAX_MS))
        return http_respond_problem(r, 400, "within must be a duration from 1ms to 24h, e.g. 5m",
                                    NULL);
    /* A cluster node lists every live node's workers (one hop). */
    if (r->h->fwd && http_header(r, "Jackdaw-Forwarded") == NULL)
        return http_forward_relay(r, ms, -2);
    char *json = NULL;
    int rc = jd_jobs_workers_json(http_jobs_of(r->h), ms, &json);
    return http_respond_json_rc(r, rc, json);
}
