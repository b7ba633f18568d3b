/*
 * Route handlers for /v1/jobs: submit, batch, get (with long-poll), list,
 * events (JSON or SSE), cancel, message, retry.
 *
 * Threading: every handler runs on an MHD pool thread, once per request,
 * after http.c routed, authenticated and read the body. A handler answers
 * at once, or hands the request to the job layer (http_arm, http_req_ref,
 * then http_async_started) or parks it (park.c).
 */
#include "api/http_impl.h"

#include "api/problem.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "storage/store.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* v in decimal at out (room for 21 bytes), NUL-terminated; returns its
 * length. As "%" PRId64 without printf's cost (ids and versions on every
 * submit and long-poll). */
static size_t i64_text(char *out, int64_t v)
{
    char tmp[24];
    size_t n = 0;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    size_t len = 0;
    if (v < 0)
        out[len++] = '-';
    while (n)
        out[len++] = tmp[--n];
    out[len] = '\0';
    return len;
}

static bool job_id_from_param(struct jd_req *r, int64_t *id)
{
    if (jd_jobs_parse_id(r->m.param, id) != 0)
        return false;
    _Static_assert(sizeof r->job_label >= 21, "job_label holds an int64");
    i64_text(r->job_label, *id);
    return true;
}

/* Answer with the job as it is now (long-poll end, or no wait at all). */
enum MHD_Result http_answer_job(struct jd_req *r)
{
    char *json = NULL;
    int64_t version = 0;
    bool terminal = false;
    int rc = jd_jobs_get_json(http_jobs_of(r->h), r->job_id, &json, &version, &terminal);
    if (rc != 0)
        return http_respond_error(r, rc, NULL);
    enum MHD_Result ret = http_respond_job(r, json, version);
    free(json);
    return ret;
}

/* The job's Location, /v1/jobs/{id}, at out (room for 48 bytes). */
static void job_location(char *out, int64_t id)
{
    memcpy(out, "/v1/jobs/", 9);
    i64_text(out + 9, id);
}

enum MHD_Result http_respond_job(struct jd_req *r, const char *json, int64_t version)
{
    char etag[32];
    etag[0] = '"';
    size_t n = 1 + i64_text(etag + 1, version);
    etag[n] = '"';
    etag[n + 1] = '\0';
    if (r->submit_status == 0)
        return http_respond_json(r, 200, json, MHD_HTTP_HEADER_ETAG, etag);
    /* the end of POST /v1/jobs?wait=: the submit's status and Location */
    char loc[48];
    job_location(loc, r->job_id);
    size_t len;
    char *b = http_answer_body(r, json, &len);
    return http_respond(r, r->submit_status, "application/json", b, len, MHD_HTTP_HEADER_LOCATION,
                        loc, MHD_HTTP_HEADER_ETAG, etag);
}

/* Wait up to wait_ms for r->job_id to change (since, terminal_only set),
 * then answer with the job (http_finish_parked). Answers at once when
 * there is nothing to wait for (wait_ms 0, the server draining, the job
 * gone); *parked is false when no parked slot was free (nothing answered:
 * the caller decides). */
static enum MHD_Result park_on_job(struct jd_req *r, int64_t wait_ms, bool *parked)
{
    struct jd_http *h = r->h;
    *parked = true;
    /* seq_cst: pairs with jd_http_drain, which sets draining and then wakes
     * the parked list; one of the two sees the other. */
    if (wait_ms == 0 || atomic_load(&h->draining))
        return http_answer_job(r);
    if (!http_parked_slot_take(r)) {
        *parked = false;
        return MHD_YES;
    }

    http_arm(r);
    http_req_ref(r); /* for the watch callback */
    uint64_t wid = 0;
    int rc = jd_jobs_watch_json(http_jobs_of(h), r->job_id, r->since, r->terminal_only,
                                http_on_watch_json, r, &wid);
    if (rc != 0) {
        http_req_unref(r);
        http_park_release(r);
        if (rc == JD_ESHUTDOWN)
            return http_answer_job(r);
        return http_respond_error(r, rc, NULL);
    }
    r->watch_id = wid;
    r->watching = true;
    r->phase = PH_PARKED;
    pthread_mutex_lock(&r->mu);
    bool fired = r->fired;
    if (!fired) {
        http_park_list_add(r, jd_now_ns() + (uint64_t)wait_ms * 1000000ull);
        http_park_suspend_locked(r);
    }
    pthread_mutex_unlock(&r->mu);
    if (fired) /* the job changed before we could suspend: answer now */
        return http_finish_parked(r);
    if (atomic_load(&h->draining))
        http_wake(r, WAKE_SHUTDOWN); /* drain ran between our check and the list add */
    return MHD_YES;
}

/* ?wait=: a duration (absent: the server's cap), capped at --max-wait.
 * False when it is not a duration. */
static bool wait_param(struct jd_req *r, const char *w, int64_t *ms)
{
    *ms = r->h->max_wait_ms;
    if (w != NULL && (jd_duration_parse(w, ms) != 0 || *ms < 0))
        return false;
    if (*ms > r->h->max_wait_ms)
        *ms = r->h->max_wait_ms;
    return true;
}

enum MHD_Result route_job_get(struct jd_req *r)
{
    if (!job_id_from_param(r, &r->job_id))
        return http_respond_bad_job_id(r);
    const char *w = http_query(r, "wait");
    const char *s = http_query(r, "since");
    if (w == NULL && s == NULL)
        return http_answer_job(r);
    int64_t wait_ms = 0;
    if (!wait_param(r, w, &wait_ms))
        return http_respond_problem(r, 400, "wait must be a duration such as 30s or 500ms", NULL);
    r->since = 0;
    r->terminal_only = s == NULL;
    if (s != NULL && http_parse_i64(s, &r->since) != 0)
        return http_respond_problem(r, 400, "since must be a job version (a non-negative integer)",
                                    NULL);
    bool parked;
    enum MHD_Result ret = park_on_job(r, wait_ms, &parked);
    if (!parked)
        return http_respond_problem(r, 429, "too many waiting connections", NULL);
    return ret;
}

enum MHD_Result route_job_list(struct jd_req *r)
{
    struct jd_jobs_list_query q = {0};
    q.state = http_query(r, "state");
    q.queue = http_query(r, "queue");
    q.schedule = http_query(r, "schedule");
    q.cursor = http_query(r, "cursor");
    q.handler = http_query(r, "handler");
    q.created_after = http_query(r, "created_after");
    q.created_before = http_query(r, "created_before");
    q.n_labels = http_query_labels(r, q.labels, JD_JOBS_LABEL_FILTERS);
    if (q.n_labels > JD_JOBS_LABEL_FILTERS)
        return http_respond_problem(r, 400, "at most 8 label filters", NULL);
    enum MHD_Result lret;
    if (!http_query_limit(r, q.limit, 1000, &q.limit, &lret))
        return lret;
    if (q.state != NULL && jd_job_state_parse(q.state) < 0)
        return http_respond_problem(r, 400,
                                    "state must be one of queued, running, waiting, succeeded, "
                                    "failed, cancelled",
                                    NULL);
    char *json = NULL;
    struct jd_error err = {0};
    int rc = jd_jobs_list_json(http_jobs_of(r->h), &q, &json, &err);
    if (rc == JD_EINVAL || rc == JD_EPARSE)
        return http_respond_problem(r, 400, err.message[0] ? err.message : "invalid query", NULL);
    if (rc != 0)
        return http_respond_error(r, rc, &err);
    enum MHD_Result ret = http_respond_json(r, 200, json, NULL, NULL);
    free(json);
    return ret;
}

enum MHD_Result route_job_events(struct jd_req *r)
{
    struct jd_http *h = r->h;
    if (!job_id_from_param(r, &r->job_id))
        return http_respond_bad_job_id(r);
    int64_t after = 0;
    const char *a = http_query(r, "after");
    const char *leid = http_header(r, "Last-Event-ID");
    if (a != NULL && http_parse_i64(a, &after) != 0)
        return http_respond_problem(r, 400, "after must be an event sequence number", NULL);
    const char *accept = http_header(r, MHD_HTTP_HEADER_ACCEPT);
    bool sse = accept != NULL && strstr(accept, "text/event-stream") != NULL;
    if (!sse) {
        unsigned limit;
        enum MHD_Result lret;
        if (!http_query_limit(r, 1000, 10000, &limit, &lret))
            return lret;
        char *json = NULL;
        int rc = jd_jobs_events_json(http_jobs_of(h), r->job_id, after, limit, &json);
        if (rc != 0)
            return http_respond_error(r, rc, NULL);
        enum MHD_Result ret = http_respond_json(r, 200, json, NULL, NULL);
        free(json);
        return ret;
    }
    if (leid != NULL && http_parse_i64(leid, &after) != 0)
        return http_respond_problem(r, 400, "Last-Event-ID must be an event sequence number", NULL);
    char *json = NULL;
    int64_t version;
    bool terminal;
    int rc = jd_jobs_get_json(http_jobs_of(h), r->job_id, &json, &version, &terminal);
    if (rc != 0)
        return http_respond_error(r, rc, NULL);
    free(json);
    if (!http_parked_slot_take(r))
        return http_respond_problem(r, 429, "too many streaming connections", NULL);
    r->sse_seq = after;
    return http_sse_start(r);
}

/* 201 with the job and its Location (Idempotent-Replayed when the key
 * named a job stored earlier). */
/* A unique key was held: 409 naming the holder (reject), or 200 with it. */
static enum MHD_Result answer_unique(struct jd_req *r, const char *json, const char *loc)
{
    if (r->cb_unique == JD_SUBMIT_UNIQUE_EXISTING) {
        size_t n;
        char *b = http_answer_body(r, json ? json : "{}", &n);
        return http_respond(r, 200, "application/json", b, n, MHD_HTTP_HEADER_LOCATION, loc, NULL,
                            NULL);
    }
    char detail[96];
    snprintf(detail, sizeof detail, "job %" PRId64 " holds this unique key", r->cb_job_id);
    char *p = jd_problem_json(409, detail, "/unique/key", r->path, r->rid);
    /* p ends "}\n": add the holder's id as a member of the problem. */
    size_t n = strlen(p);
    char *b =
        jd_xasprintf("%.*s,\"existing_job_id\":\"%" PRId64 "\"}\n", (int)(n - 2), p, r->cb_job_id);
    free(p);
    return http_respond(r, 409, "application/problem+json", b, strlen(b), MHD_HTTP_HEADER_LOCATION,
                        loc, NULL, NULL);
}

/* POST /v1/jobs?wait=: the job is stored (its submit answer is json);
 * answer when it ends or the wait does, with the job as it is then. With
 * no parked slot free the job is answered as submitted: it exists, and a
 * 429 would invite a second submit. */
static enum MHD_Result wait_submitted(struct jd_req *r, const char *json, int status)
{
    r->job_id = r->cb_job_id;
    r->since = 0;
    r->terminal_only = true;
    r->submit_status = status;
    r->replayed = r->cb_existing;
    /* The answer of park_on_job uses ans_json: keep the submit's here. */
    char *submitted = r->ans_json;
    r->ans_json = NULL;
    bool parked;
    enum MHD_Result ret = park_on_job(r, r->submit_wait_ms, &parked);
    if (!parked) {
        char loc[48];
        job_location(loc, r->job_id);
        size_t n;
        char *b = http_answer_body(r, json ? json : "{}", &n);
        ret = http_respond(r, status, "application/json", b, n, MHD_HTTP_HEADER_LOCATION, loc, NULL,
                           NULL);
    }
    free(submitted);
    return ret;
}

static enum MHD_Result answer_submitted(struct jd_req *r, const char *json)
{
    char loc[48];
    job_location(loc, r->cb_job_id);
    memcpy(r->job_label, loc + 9, strlen(loc + 9) + 1);
    if (r->submit_wait_ms > 0 && r->cb_unique != JD_SUBMIT_UNIQUE_REJECTED)
        return wait_submitted(r, json, r->cb_unique ? 200 : 201);
    if (r->cb_unique)
        return answer_unique(r, json, loc);
    size_t n;
    char *b = http_answer_body(r, json ? json : "{}", &n);
    r->replayed = r->cb_existing;
    return http_respond(r, 201, "application/json", b, n, MHD_HTTP_HEADER_LOCATION, loc, NULL,
                        NULL);
}

static enum MHD_Result answer_batch(struct jd_req *r, const char *json)
{
    return http_respond_json(r, 201, json ? json : "{}", NULL, NULL);
}

/* The traceparent header, or NULL when absent or invalid (the W3C spec
 * asks that an invalid one be ignored). */
static const char *trace_header(struct jd_req *r)
{
    const char *tp = http_header(r, "traceparent");
    return tp != NULL && jd_traceparent_valid(tp) ? tp : NULL;
}

static int start_submit(struct jd_req *r, struct jd_error *err)
{
    return jd_jobs_submit_traced(http_jobs_of(r->h), r->body ? r->body : "", r->len, r->idem_key,
                                 r->traceparent, http_on_submit_done, r, err);
}

enum MHD_Result route_job_submit(struct jd_req *r)
{
    const char *key = http_header(r, "Idempotency-Key");
    if (key != NULL && (key[0] == '\0' || strlen(key) > IDEM_KEY_MAX))
        return http_respond_problem(r, 400, "Idempotency-Key must be 1 to 255 characters", NULL);
    /* Those name a schedule's fire: a client's key could take a fire's place. */
    if (key != NULL && strncmp(key, "schedule:", 9) == 0)
        return http_respond_problem(r, 400,
                                    "Idempotency-Keys starting with \"schedule:\" are "
                                    "reserved for schedules",
                                    NULL);
    const char *w = http_query(r, "wait");
    if (w != NULL && !wait_param(r, w, &r->submit_wait_ms))
        return http_respond_problem(r, 400, "wait must be a duration such as 30s or 500ms", NULL);
    r->idem_key = key;
    r->traceparent = trace_header(r);
    return http_async_run(r, start_submit, answer_submitted);
}

static int start_batch(struct jd_req *r, struct jd_error *err)
{
    return jd_jobs_submit_batch_traced(http_jobs_of(r->h), r->body ? r->body : "", r->len,
                                       r->traceparent, http_on_submit_done, r, err);
}

enum MHD_Result route_job_batch(struct jd_req *r)
{
    r->traceparent = trace_header(r);
    return http_async_run(r, start_batch, answer_batch);
}

enum MHD_Result route_job_cancel(struct jd_req *r)
{
    struct jd_error err = {0};
    int64_t id = 0;
    if (!job_id_from_param(r, &id))
        return http_respond_bad_job_id(r);
    http_arm(r);
    http_req_ref(r);
    int rc = jd_jobs_cancel(http_jobs_of(r->h), id, http_on_action_done, r);
    if (rc == JD_ECONFLICT)
        jd_error_set(&err, rc, NULL, "job %" PRId64 " is already finished", id);
    return http_async_started(r, rc, &err, NULL);
}

static int start_message(struct jd_req *r, struct jd_error *err)
{
    int rc = jd_jobs_message(http_jobs_of(r->h), r->job_id, r->body ? r->body : "", r->len,
                             http_on_action_done, r, err);
    if (rc == JD_ECONFLICT && err->message[0] == '\0')
        jd_error_set(err, rc, NULL, "job %" PRId64 " is already finished", r->job_id);
    return rc;
}

enum MHD_Result route_job_message(struct jd_req *r)
{
    if (!job_id_from_param(r, &r->job_id))
        return http_respond_bad_job_id(r);
    return http_async_run(r, start_message, NULL);
}

enum MHD_Result route_job_retry(struct jd_req *r)
{
    struct jd_error err = {0};
    int64_t id = 0;
    if (!job_id_from_param(r, &id))
        return http_respond_bad_job_id(r);
    http_arm(r);
    http_req_ref(r);
    int rc = jd_jobs_retry(http_jobs_of(r->h), id, http_on_action_done, r);
    if (rc == JD_ECONFLICT)
        jd_error_set(&err, rc, NULL, "only failed or cancelled jobs can be retried");
    return http_async_started(r, rc, &err, NULL);
}
