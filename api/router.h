/*
 * The route table of DESIGN.md section 5: (method, path) -> route and its
 * path parameter. Pure functions over their arguments, no allocation; safe
 * from any thread. A literal segment wins over a parameter, so
 * "GET /v1/jobs/batch" is a 405 (batch is POST-only), not job "batch".
 */
#ifndef JD_API_ROUTER_H
#define JD_API_ROUTER_H

#include <stddef.h>

enum jd_route {
    JD_ROUTE_NONE = 0,
    JD_ROUTE_JOB_SUBMIT,   /* POST /v1/jobs */
    JD_ROUTE_JOB_LIST,     /* GET  /v1/jobs */
    JD_ROUTE_JOB_BATCH,    /* POST /v1/jobs/batch */
    JD_ROUTE_JOB_GET,      /* GET  /v1/jobs/{id} */
    JD_ROUTE_JOB_EVENTS,   /* GET  /v1/jobs/{id}/events */
    JD_ROUTE_JOB_CANCEL,   /* POST /v1/jobs/{id}/cancel */
    JD_ROUTE_JOB_MESSAGE,  /* POST /v1/jobs/{id}/messages */
    JD_ROUTE_JOB_RETRY,    /* POST /v1/jobs/{id}/retry */
    JD_ROUTE_HANDLERS,     /* GET  /v1/handlers */
    JD_ROUTE_QUEUES,       /* GET  /v1/queues */
    JD_ROUTE_QUEUE_PAUSE,  /* POST /v1/queues/{q}/pause */
    JD_ROUTE_QUEUE_RESUME, /* POST /v1/queues/{q}/resume */
    JD_ROUTE_OPENAPI,      /* GET  /v1/openapi.yaml */
    JD_ROUTE_LIVEZ,        /* GET  /livez */
    JD_ROUTE_READYZ,       /* GET  /readyz */
    JD_ROUTE_METRICS,      /* GET  /metrics */
    JD_ROUTE_COUNT
};

/* Methods as bits, for the Allow header of a 405. */
enum { JD_M_GET = 1, JD_M_HEAD = 2, JD_M_POST = 4 };

#define JD_ROUTE_PARAM_MAX 128 /* ids are <= 19 digits; queue names are short */

struct jd_route_match {
    enum jd_route route;
    char param[JD_ROUTE_PARAM_MAX]; /* {id} or {q}, "" if none */
    unsigned allow;                 /* JD_M_* bits the path accepts (filled on 405 too) */
};

/*
 * Match method (e.g. "GET") and path (no query string; may be NULL).
 * Returns 0 with m->route set; JD_ENOENT for an unknown path (404, also for a
 * parameter that is empty or too long); JD_ECONFLICT when the path exists but
 * not for this method (405; m->allow says which do). HEAD matches GET routes.
 */
int jd_router_match(const char *method, const char *path, struct jd_route_match *m);

/* "GET, HEAD" for the Allow header (static text). */
const char *jd_router_allow_text(unsigned allow);

/* A stable low-cardinality label for metrics and logs ("/v1/jobs/{id}"). */
const char *jd_route_name(enum jd_route r);

/* Does the route live under /v1 (auth applies)? */
int jd_route_is_v1(enum jd_route r);

#endif
