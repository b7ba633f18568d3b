/*
 * Routing: (method, path) -> route, its flags and its path parameter, over
 * the route table of api/routes.h (or a table of the caller's, for tests).
 * Pure functions over their arguments, no allocation; safe from any
 * thread. A literal segment wins over a parameter, so "GET /v1/jobs/batch"
 * is a 405 (batch is POST-only), not job "batch"; a parameter wins over a
 * rest-of-path "*".
 */
#ifndef JD_API_ROUTER_H
#define JD_API_ROUTER_H

#include "api/routes.h"

#include <stddef.h>

/* Route ids, one per row of JD_ROUTES, in table order. */
enum jd_route {
    JD_ROUTE_NONE = 0,
#define JD_ROUTE_ENUM(id, method, pattern, handler, flags) id,
    JD_ROUTES(JD_ROUTE_ENUM)
#undef JD_ROUTE_ENUM
        JD_ROUTE_COUNT
};

/* Methods as bits, for the Allow header of a 405. */
enum { JD_M_GET = 1, JD_M_HEAD = 2, JD_M_POST = 4, JD_M_PUT = 8, JD_M_DELETE = 16 };

/* What the HTTP layer checks before a route's handler runs (see routes.h). */
enum {
    JD_RF_V1 = 1,      /* under /v1: needs the bearer token when one is set */
    JD_RF_JOBS = 2,    /* needs the job layer: 503 while starting */
    JD_RF_WRITE = 4,   /* starts work: 503 once draining began */
    JD_RF_JSON = 8,    /* takes a JSON body: Content-Type, non-empty, UTF-8 */
    JD_RF_WORKER = 16, /* --worker-token opens it too (the task routes, PUT a command) */
};

/* One row of a route table. */
struct jd_route_def {
    enum jd_route route;
    unsigned method;     /* one JD_M_* bit */
    const char *pattern; /* see routes.h; also the route's name */
    unsigned flags;      /* JD_RF_* */
};

#define JD_ROUTE_PARAM_MAX 128 /* ids are <= 19 digits; queue names are short */

struct jd_route_match {
    enum jd_route route;
    char param[JD_ROUTE_PARAM_MAX]; /* {id}, {queue} or the rest of the path; "" if none */
    unsigned allow;                 /* JD_M_* bits the path accepts (filled on 405 too) */
    unsigned flags;                 /* the matched row's JD_RF_* (0 unless matched) */
};

/*
 * Match method (e.g. "GET") and path (no query string; may be NULL) against
 * the server's table. Returns 0 with m->route set; JD_ENOENT for an unknown
 * path (404, also for a parameter that is empty or too long, and for a rest
 * of the path with an empty, "." or ".." segment); JD_ECONFLICT when the path
 * exists but not for this method (405; m->allow says which do). HEAD
 * matches GET routes.
 */
int jd_router_match(const char *method, const char *path, struct jd_route_match *m);

/* The same over rows[0..n) (borrowed). */
int jd_router_match_in(const struct jd_route_def *rows, size_t n, const char *method,
                       const char *path, struct jd_route_match *m);

/* "GET, HEAD, POST" for the Allow header (static text; "" for none). */
const char *jd_router_allow_text(unsigned allow);

/* A stable low-cardinality label for metrics and logs ("/v1/jobs/{id}"). */
const char *jd_route_name(enum jd_route r);

/* Does the route live under /v1 (auth applies)? */
int jd_route_is_v1(enum jd_route r);

#endif
