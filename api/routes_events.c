/*
 * GET /v1/events: every job's transitions in commit order, as JSON pages
 * (?after=<id>&limit=) or, with Accept: text/event-stream, a live SSE
 * stream (id: = the event id, for Last-Event-ID resume), filtered by
 * queue, state and label. The stream shares the job SSE machinery in
 * park.c (parked-slot cap, heartbeats, drain) and wakes on any commit
 * (jd_jobs_watch_any).
 *
 * Threading: MHD pool threads.
 */
#include "api/http_impl.h"

#include "api/problem.h"
#include "common/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The JSON page being built. */
struct collect {
    struct {
        char *p;
        size_t n, cap;
    } b;
    size_t count;
};

static void put(struct collect *c, const char *s)
{
    size_t n = strlen(s);
    if (c->b.n + n + 1 > c->b.cap) {
        c->b.cap = (c->b.n + n + 1) * 2;
        c->b.p = jd_xrealloc(c->b.p, c->b.cap);
    }
    memcpy(c->b.p + c->b.n, s, n + 1);
    c->b.n += n;
}

static void collect_event(void *arg, int64_t id, const char *json)
{
    (void)id;
    struct collect *c = arg;
    if (c->count++)
        put(c, ",");
    put(c, json);
}

enum MHD_Result route_events(struct jd_req *r)
{
    struct jd_http *h = r->h;
    struct jd_events_query q = {0};
    q.queue = http_query(r, "queue");
    q.state = http_query(r, "state");
    q.n_labels = http_query_labels(r, q.labels, JD_JOBS_LABEL_FILTERS);
    if (q.n_labels > JD_JOBS_LABEL_FILTERS)
        return http_respond_problem(r, 400, "at most 8 label filters", NULL);
    const char *a = http_query(r, "after");
    const char *leid = http_header(r, "Last-Event-ID");
    int64_t after = -1;
    if (a != NULL && (http_parse_i64(a, &after) != 0 || after < 0))
        return http_respond_problem(r, 400, "after must be an event id", NULL);
    const char *accept = http_header(r, MHD_HTTP_HEADER_ACCEPT);
    bool sse = accept != NULL && strstr(accept, "text/event-stream") != NULL;
    if (sse && leid != NULL && (http_parse_i64(leid, &after) != 0 || after < 0))
        return http_respond_problem(r, 400, "Last-Event-ID must be an event id", NULL);
    unsigned limit;
    enum MHD_Result lret;
    if (!http_query_limit(r, 100, 1000, &limit, &lret))
        return lret;
    struct jd_error err = {0};
    struct jd_events_sub *sub = NULL;
    if (jd_jobs_events_sub(&q, &sub, &err) != 0)
        return http_respond_problem(r, 400, err.message, NULL);
    struct jd_jobs *j = http_jobs_of(h);
    if (!sse) {
        struct collect c = {0};
        put(&c, "{\"events\":[");
        int64_t next = after < 0 ? 0 : after;
        int rc = jd_jobs_events_read(j, sub, next, limit, collect_event, &c, &next);
        jd_jobs_events_sub_free(sub);
        if (rc < 0) {
            free(c.b.p);
            return http_respond_error(r, rc, NULL);
        }
        char tail[64];
        snprintf(tail, sizeof tail, "],\"next_after\":\"%lld\"}", (long long)next);
        put(&c, tail);
        enum MHD_Result ret = http_respond_json(r, 200, c.b.p, NULL, NULL);
        free(c.b.p);
        return ret;
    }
    /* A stream without a resume point starts at the newest event. */
    if (after < 0 && jd_jobs_events_tail(j, &after) != 0) {
        jd_jobs_events_sub_free(sub);
        return http_respond_error(r, JD_EIO, NULL);
    }
    if (!http_parked_slot_take(r)) {
        jd_jobs_events_sub_free(sub);
        return http_respond_problem(r, 429, "too many streaming connections", NULL);
    }
    r->evsub = sub; /* freed with the request */
    r->sse_seq = after;
    return http_sse_start(r);
}
