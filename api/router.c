/*
 * Route matching: the path is split on '/' into at most five segments and
 * compared with a small table of patterns. No allocation, no global state;
 * every input (including garbage from the fuzzer) ends in a 0, 404 or 405.
 */
#include "api/router.h"

#include "common/error.h"

#include <string.h>

struct pattern {
    const char *segs[5]; /* NULL-terminated; "*" is the parameter */
    unsigned method;
    enum jd_route route;
    const char *name;
};

static const struct pattern table[] = {
    {{"v1", "jobs", NULL}, JD_M_POST, JD_ROUTE_JOB_SUBMIT, "/v1/jobs"},
    {{"v1", "jobs", NULL}, JD_M_GET, JD_ROUTE_JOB_LIST, "/v1/jobs"},
    {{"v1", "jobs", "batch", NULL}, JD_M_POST, JD_ROUTE_JOB_BATCH, "/v1/jobs/batch"},
    {{"v1", "jobs", "*", NULL}, JD_M_GET, JD_ROUTE_JOB_GET, "/v1/jobs/{id}"},
    {{"v1", "jobs", "*", "events", NULL}, JD_M_GET, JD_ROUTE_JOB_EVENTS, "/v1/jobs/{id}/events"},
    {{"v1", "jobs", "*", "cancel", NULL}, JD_M_POST, JD_ROUTE_JOB_CANCEL, "/v1/jobs/{id}/cancel"},
    {{"v1", "jobs", "*", "messages", NULL},
     JD_M_POST,
     JD_ROUTE_JOB_MESSAGE,
     "/v1/jobs/{id}/messages"},
    {{"v1", "jobs", "*", "retry", NULL}, JD_M_POST, JD_ROUTE_JOB_RETRY, "/v1/jobs/{id}/retry"},
    {{"v1", "handlers", NULL}, JD_M_GET, JD_ROUTE_HANDLERS, "/v1/handlers"},
    {{"v1", "queues", NULL}, JD_M_GET, JD_ROUTE_QUEUES, "/v1/queues"},
    {{"v1", "queues", "*", "pause", NULL},
     JD_M_POST,
     JD_ROUTE_QUEUE_PAUSE,
     "/v1/queues/{queue}/pause"},
    {{"v1", "queues", "*", "resume", NULL},
     JD_M_POST,
     JD_ROUTE_QUEUE_RESUME,
     "/v1/queues/{queue}/resume"},
    {{"v1", "openapi.yaml", NULL}, JD_M_GET, JD_ROUTE_OPENAPI, "/v1/openapi.yaml"},
    {{"livez", NULL}, JD_M_GET, JD_ROUTE_LIVEZ, "/livez"},
    {{"readyz", NULL}, JD_M_GET, JD_ROUTE_READYZ, "/readyz"},
    {{"metrics", NULL}, JD_M_GET, JD_ROUTE_METRICS, "/metrics"},
};

#define NPAT (sizeof table / sizeof table[0])
#define MAXSEG 5

struct seg {
    const char *p;
    size_t n;
};

/* Split "/a/b/c" into segments; a trailing slash is ignored ("/v1/jobs/"
 * is "/v1/jobs"). Returns the count, or -1 when there are too many or the
 * path does not start with '/' or has an empty segment. */
static int split(const char *path, struct seg *segs)
{
    if (path == NULL || path[0] != '/')
        return -1;
    const char *p = path + 1;
    int n = 0;
    while (*p != '\0') {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 0)
            return -1;
        if (n == MAXSEG)
            return -1;
        segs[n].p = p;
        segs[n].n = len;
        n++;
        if (slash == NULL)
            break;
        p = slash + 1;
    }
    return n;
}

static unsigned method_bit(const char *method)
{
    if (method == NULL)
        return 0;
    if (strcmp(method, "GET") == 0)
        return JD_M_GET;
    if (strcmp(method, "HEAD") == 0)
        return JD_M_HEAD;
    if (strcmp(method, "POST") == 0)
        return JD_M_POST;
    return 0;
}

/* 2: literal match, 1: match through the parameter, 0: no match. */
static int pattern_match(const struct pattern *pt, const struct seg *segs, int n, int *param)
{
    int k;
    int via_param = 0;
    *param = -1;
    for (k = 0; k < n; k++) {
        const char *want = pt->segs[k];
        if (want == NULL)
            return 0;
        if (strcmp(want, "*") == 0) {
            *param = k;
            via_param = 1;
            continue;
        }
        if (strlen(want) != segs[k].n || memcmp(want, segs[k].p, segs[k].n) != 0)
            return 0;
    }
    if (pt->segs[k] != NULL)
        return 0;
    return via_param ? 1 : 2;
}

int jd_router_match(const char *method, const char *path, struct jd_route_match *m)
{
    struct seg segs[MAXSEG];
    memset(m, 0, sizeof *m);
    int n = split(path, segs);
    if (n <= 0)
        return JD_ENOENT;
    unsigned mb = method_bit(method);
    unsigned lookup = mb == JD_M_HEAD ? JD_M_GET : mb;

    /* The best (most literal) kind of match decides which patterns count. */
    int best = 0;
    for (size_t i = 0; i < NPAT; i++) {
        int param;
        int how = pattern_match(&table[i], segs, n, &param);
        if (how > best)
            best = how;
    }
    if (best == 0)
        return JD_ENOENT;
    for (size_t i = 0; i < NPAT; i++) {
        int param;
        if (pattern_match(&table[i], segs, n, &param) != best)
            continue;
        m->allow |= table[i].method;
        if (table[i].method == JD_M_GET)
            m->allow |= JD_M_HEAD;
        if (lookup != 0 && table[i].method == lookup && m->route == JD_ROUTE_NONE) {
            if (param >= 0) {
                if (segs[param].n >= JD_ROUTE_PARAM_MAX)
                    return JD_ENOENT;
                memcpy(m->param, segs[param].p, segs[param].n);
                m->param[segs[param].n] = '\0';
            }
            m->route = table[i].route;
        }
    }
    return m->route == JD_ROUTE_NONE ? JD_ECONFLICT : 0;
}

const char *jd_router_allow_text(unsigned allow)
{
    switch (allow & (JD_M_GET | JD_M_HEAD | JD_M_POST)) {
    case JD_M_GET | JD_M_HEAD:
        return "GET, HEAD";
    case JD_M_POST:
        return "POST";
    case JD_M_GET | JD_M_HEAD | JD_M_POST:
        return "GET, HEAD, POST";
    default:
        return "";
    }
}

const char *jd_route_name(enum jd_route r)
{
    for (size_t i = 0; i < NPAT; i++)
        if (table[i].route == r)
            return table[i].name;
    return "other";
}

int jd_route_is_v1(enum jd_route r)
{
    return r >= JD_ROUTE_JOB_SUBMIT && r <= JD_ROUTE_OPENAPI;
}
