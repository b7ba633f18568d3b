/*
 * Prometheus text exposition for /metrics: the HTTP layer's own counters
 * (requests by route and status, latency histogram by route, parked
 * connections) plus snapshots the other layers hand over as plain structs.
 *
 * Threading: jd_http_metrics_observe is lock-free (relaxed atomic adds: the
 * counters are independent and only read for display) and safe from any
 * thread; rendering reads a snapshot that may be a few requests stale.
 */
#ifndef JD_API_METRICS_H
#define JD_API_METRICS_H

#include "api/router.h"

#include "server/tasks.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct jd_jobs_stats;
struct jd_sched_stats;
struct jd_store_stats;
struct jd_jobs_call_stats;
struct jd_queue_counts;
struct jd_schedules_stats;
struct jd_jobs_queue_limit;
struct jd_jobs_command_limit;

/* Statuses counted per route; anything else lands in the last column. */
#define JD_METRICS_CODES 20
/* Latency buckets (seconds): .001 .005 .01 .025 .05 .1 .25 .5 1 2.5 5 10 30 60 +Inf */
#define JD_METRICS_LAT_BUCKETS 15

struct jd_http_metrics {
    _Atomic uint64_t requests[JD_ROUTE_COUNT][JD_METRICS_CODES];
    _Atomic uint64_t latency[JD_ROUTE_COUNT][JD_METRICS_LAT_BUCKETS];
    _Atomic uint64_t latency_us_sum[JD_ROUTE_COUNT];
    _Atomic uint64_t parked;          /* gauge: long-polls + SSE streams parked now */
    _Atomic uint64_t parked_rejected; /* 429s because --max-parked was reached */
    _Atomic uint64_t body_rejected;   /* 413s */
};

/* Count one finished request. */
void jd_http_metrics_observe(struct jd_http_metrics *m, enum jd_route route, int status,
                             uint64_t duration_us);

/* A cluster node's counters (jd_store_cluster_stats, the job layer's
 * inbox), labelled node="<id>". */
struct jd_metrics_cluster {
    int64_t node;
    uint64_t claims, takeovers, fenced, requests_applied, lease_lost;
    uint64_t heartbeats, heartbeat_us_sum, heartbeat_us_max;
    uint64_t notices; /* change notices this node's listener received */
    bool watching;    /* this node wants job-change notices (jd_jobs_cluster_watching) */
    /* The PostgreSQL read pool (struct jd_cluster_stats). */
    uint64_t read_waits, read_wait_us, read_timeouts;
    unsigned read_open, read_idle, read_max;
    /* Remote tasks across nodes (api/forward.h). */
    uint64_t fwd_relays, fwd_relay_failures, fwd_relays_gone, fwd_claims, fwd_claim_failures,
        fwd_claimed, fwd_announces, fwd_refused;
};

/* The snapshots to render; any pointer may be NULL (that family is left out). */
struct jd_metrics_sources {
    const struct jd_http_metrics *http;
    const struct jd_jobs_stats *jobs;
    const struct jd_sched_stats *sched;
    const struct jd_store_stats *store;
    const struct jd_jobs_call_stats *calls;
    const struct jd_schedules_stats *schedules;
    const struct jd_queue_counts *queues; /* durable counts per queue and state */
    size_t nqueues;
    const struct jd_jobs_queue_limit *queue_limits; /* queue controls, live */
    size_t nqueue_limits;
    const struct jd_jobs_command_limit *command_limits; /* --command-limit, live */
    size_t ncommand_limits;
    const struct jd_task_stats *tasks; /* per remote command (server/tasks.h) */
    size_t ntasks;
    /* A cluster node (PostgreSQL): its id and counters, or NULL. */
    const struct jd_metrics_cluster *cluster;
    int ready; /* 1 ready, 0 starting or draining */
};

/* The exposition text. Caller frees with free(). */
char *jd_metrics_render(const struct jd_metrics_sources *src);

#endif
