/*
 * The dashboard: its files under /ui/ (compiled in, see api/ui_assets.h),
 * "/" and "/ui" redirecting to "/ui/", and GET /v1/stats, the throughput
 * series it charts. The files are public (they hold no data; every call
 * they make goes to /v1 with the token); --ui off answers 404 instead.
 *
 * Every file goes out with its ETag (If-None-Match answers 304),
 * Cache-Control no-cache (so an upgraded server is seen at once) and a
 * Content-Security-Policy that allows scripts, styles and connections to
 * this origin only: no inline script, no other origin, no framing.
 *
 * Threading: handlers run on MHD pool threads (see routes_jobs.c).
 */
#include "api/http_impl.h"

#include "api/ui_assets.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "server/stats.h"
#include "storage/store.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UI_CSP                                                                                     \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "                    \
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

static enum MHD_Result ui_off(struct jd_req *r)
{
    return http_respond_problem(r, 404, "the dashboard is off (--ui off)", NULL);
}

static enum MHD_Result redirect_to_ui(struct jd_req *r)
{
    char *b = jd_xstrdup("");
    return http_respond(r, 302, NULL, b, 0, MHD_HTTP_HEADER_LOCATION, "/ui/", NULL, NULL);
}

enum MHD_Result route_ui_root(struct jd_req *r)
{
    return r->h->ui_off ? ui_off(r) : redirect_to_ui(r);
}

static const struct jd_ui_asset *asset_find(const char *name)
{
    for (size_t i = 0; i < jd_ui_nassets; i++)
        if (strcmp(jd_ui_assets[i].name, name) == 0)
            return &jd_ui_assets[i];
    return NULL;
}

/* Does an If-None-Match list (e.g. "a", W/"b" or *) name etag? */
static bool etag_matches(const char *inm, const char *etag)
{
    if (inm == NULL)
        return false;
    size_t n = strlen(etag);
    for (const char *p = inm; *p;) {
        while (*p == ' ' || *p == ',' || *p == '\t')
            p++;
        if (*p == '*')
            return true;
        if (strncmp(p, "W/", 2) == 0)
            p += 2;
        if (strncmp(p, etag, n) == 0 && (p[n] == '\0' || p[n] == ',' || p[n] == ' '))
            return true;
        while (*p && *p != ',')
            p++;
    }
    return false;
}

static enum MHD_Result respond_asset(struct jd_req *r, const struct jd_ui_asset *a)
{
    bool fresh = etag_matches(http_header(r, MHD_HTTP_HEADER_IF_NONE_MATCH), a->etag);
    int status = fresh ? 304 : 200;
    /* PERSISTENT: the bytes are in the binary, never copied or freed */
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        fresh ? 0 : a->len, (void *)(uintptr_t)a->data, MHD_RESPMEM_PERSISTENT);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, a->ctype);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, a->etag);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "Content-Security-Policy", UI_CSP);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(resp, "X-Request-Id", r->rid);
    r->status = status;
    r->phase = PH_DONE;
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* GET /ui/<file>; "/ui/" is index.html, "/ui" redirects to "/ui/" (so the
 * page's relative links resolve). */
enum MHD_Result route_ui_file(struct jd_req *r)
{
    if (r->h->ui_off)
        return ui_off(r);
    if (r->m.param[0] == '\0' && strcmp(r->path, "/ui/") != 0)
        return redirect_to_ui(r);
    const struct jd_ui_asset *a = asset_find(r->m.param[0] ? r->m.param : "index.html");
    if (a == NULL)
        return http_respond_problem(r, 404, "no such dashboard file", NULL);
    return respond_asset(r, a);
}

/* ,{"queue":..,"id":..,"created_at":..} for each queue with jobs queued. */
static char *oldest_json(struct jd_store *st)
{
    struct jd_queue_counts *qc = NULL;
    size_t nq = 0;
    char *out = jd_xstrdup("");
    if (st == NULL || jd_store_queue_counts(st, &qc, &nq) != 0)
        return out;
    for (size_t i = 0; i < nq; i++) {
        int64_t id, created;
        if (qc[i].counts[JD_JOB_QUEUED] == 0 ||
            jd_store_oldest_queued(st, qc[i].queue, &id, &created) != 0)
            continue;
        char when[40];
        jd_time_format(created, when, sizeof when);
        /* queue names are [A-Za-z0-9._-] (checked at submit): no escaping */
        char *next =
            jd_xasprintf("%s%s{\"queue\":\"%s\",\"id\":\"%" PRId64 "\",\"created_at\":\"%s\"}", out,
                         out[0] ? "," : "", qc[i].queue, id, when);
        free(out);
        out = next;
    }
    jd_queue_counts_free(qc, nq);
    return out;
}

/* GET /v1/stats?seconds=N: the series of server/stats.h plus, per queue
 * with jobs queued, the one waiting longest. */
enum MHD_Result route_stats(struct jd_req *r)
{
    int64_t secs = JD_STATS_WINDOW;
    const char *q = http_query(r, "seconds");
    if (q != NULL && (http_parse_i64(q, &secs) != 0 || secs < 1 || secs > JD_STATS_WINDOW)) {
        char d[96];
        snprintf(d, sizeof d, "seconds must be a whole number from 1 to %d", JD_STATS_WINDOW);
        return http_respond_problem(r, 400, d, NULL);
    }
    char *series = jd_stats_json(jd_jobs_series(http_jobs_of(r->h)), (int)secs, jd_wall_ms());
    char *oldest = oldest_json(r->h->store);
    /* series is one object: reopen it to add the oldest queued jobs */
    size_t n = strlen(series);
    char *body = jd_xasprintf("%.*s,\"oldest_queued\":[%s]}\n", (int)(n - 1), series, oldest);
    free(series);
    free(oldest);
    return http_respond(r, 200, "application/json", body, strlen(body), "Cache-Control", "no-store",
                        NULL, NULL);
}
