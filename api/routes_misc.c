/*
 * Route handlers outside the job resources: /livez, /readyz, /metrics,
 * /v1/openapi.yaml and /v1/handlers. /livez, /readyz, /metrics and the
 * OpenAPI document answer before the job layer is attached.
 *
 * Threading: handlers run on MHD pool threads (see routes_jobs.c).
 */
#include "api/forward.h"
#include "api/http_impl.h"

#include "api/metrics.h"
#include "common/alloc.h"
#include "scheduler/sched.h"
#include "server/schedules.h"
#include "storage/store.h"

#include <stdlib.h>
#include <string.h>

enum MHD_Result route_livez(struct jd_req *r)
{
    char *text = jd_xstrdup("{\"status\":\"ok\"}\n");
    return http_respond(r, 200, "application/json", text, strlen(text), NULL, NULL, NULL, NULL);
}

enum MHD_Result route_readyz(struct jd_req *r)
{
    struct jd_http *h = r->h;
    if (http_jobs_of(h) == NULL)
        return http_respond_problem(r, 503, "starting: recovering jobs", NULL);
    if (atomic_load(&h->draining))
        return http_respond_problem(r, 503, "draining: shutting down", NULL);
    if (h->store != NULL && !jd_store_healthy(h->store))
        return http_respond_problem(r, 503, "the database did not answer the last heartbeat", NULL);
    char *text = jd_xstrdup("{\"status\":\"ready\"}\n");
    return http_respond(r, 200, "application/json", text, strlen(text), NULL, NULL, NULL, NULL);
}

enum MHD_Result route_metrics(struct jd_req *r)
{
    struct jd_http *h = r->h;
    struct jd_jobs *j = http_jobs_of(h);
    struct jd_metrics_sources src = {.http = &h->metrics};
    struct jd_jobs_stats js;
    struct jd_sched_stats ss;
    struct jd_store_stats st;
    struct jd_jobs_call_stats cs;
    struct jd_schedules_stats sch;
    struct jd_jobs_queue_limit *ql = NULL;
    struct jd_jobs_command_limit *cl = NULL;
    struct jd_schedules *sc = http_schedules_of(h);
    if (sc != NULL) {
        jd_schedules_stats(sc, &sch);
        src.schedules = &sch;
    }
    if (j != NULL) {
        jd_jobs_stats(j, &js);
        jd_sched_stats(jd_jobs_sched(j), &ss);
        jd_jobs_call_stats(j, &cs);
        src.jobs = &js;
        src.sched = &ss;
        src.calls = &cs;
        jd_jobs_limits(j, &ql, &src.nqueue_limits, &cl, &src.ncommand_limits);
        src.queue_limits = ql;
        src.command_limits = cl;
    }
    struct jd_queue_counts *qc = NULL;
    size_t nq = 0;
    struct jd_task_stats *ts = NULL;
    size_t nts = 0;
    if (j != NULL && jd_jobs_task_stats(j, &ts, &nts) == 0) {
        src.tasks = ts;
        src.ntasks = nts;
    }
    struct jd_metrics_cluster mc;
    if (h->store != NULL && jd_store_clustered(h->store)) {
        struct jd_cluster_stats cs2;
        jd_store_cluster_stats(h->store, &cs2);
        mc = (struct jd_metrics_cluster){.node = jd_store_node_id(h->store),
                                         .claims = cs2.claims,
                                         .takeovers = cs2.takeovers,
                                         .fenced = cs2.fenced,
                                         .requests_applied =
                                             j ? jd_jobs_cluster_requests_applied(j) : 0,
                                         .lease_lost = cs2.lease_lost,
                                         .notices = cs2.notices,
                                         .watching = j && jd_jobs_cluster_watching(j),
                                         .heartbeats = cs2.heartbeats,
                                         .heartbeat_us_sum = cs2.heartbeat_us_sum,
                                         .heartbeat_us_max = cs2.heartbeat_us_max,
                                         .read_waits = cs2.read_waits,
                                         .read_wait_us = cs2.read_wait_us,
                                         .read_timeouts = cs2.read_timeouts,
                                         .read_open = cs2.read_open,
                                         .read_idle = cs2.read_idle,
                                         .read_max = cs2.read_max};
        struct jd_forward_stats fs;
        jd_forward_stats(h->fwd, &fs);
        mc.fwd_relays = fs.relays;
        mc.fwd_relay_failures = fs.relay_failures;
        mc.fwd_relays_gone = fs.relays_gone;
        mc.fwd_claims = fs.claims;
        mc.fwd_claim_failures = fs.claim_failures;
        mc.fwd_claimed = fs.claimed;
        mc.fwd_announces = fs.announces;
        mc.fwd_refused = fs.refused;
        src.cluster = &mc;
    }
    if (h->store != NULL) {
        jd_store_stats(h->store, &st);
        src.store = &st;
        if (jd_store_queue_counts(h->store, &qc, &nq) == 0) {
            src.queues = qc;
            src.nqueues = nq;
        }
    }
    src.ready = j != NULL && !atomic_load(&h->draining);
    char *text = jd_metrics_render(&src);
    if (qc != NULL)
        jd_queue_counts_free(qc, nq);
    free(ql);
    free(cl);
    jd_task_stats_free(ts, nts);
    return http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text),
                        NULL, NULL, NULL, NULL);
}

enum MHD_Result route_openapi(struct jd_req *r)
{
    char *text = jd_xstrdup(jd_openapi_yaml);
    return http_respond(r, 200, "application/yaml", text, strlen(text), NULL, NULL, NULL, NULL);
}

enum MHD_Result route_handlers(struct jd_req *r)
{
    char *text = NULL;
    int rc = jd_jobs_handlers_json(http_jobs_of(r->h), &text);
    return http_respond_json_rc(r, rc, text);
}
