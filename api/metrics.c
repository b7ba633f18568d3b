/*
 * /metrics rendering (Prometheus text format 0.0.4) and the HTTP counters.
 * Label values are fixed strings from the route table and status codes,
 * except queue names, which come from users and go through put_label()
 * (backslash, quote and newline escaped, as the text format requires).
 */
#include "api/metrics.h"

#include "common/alloc.h"
#include "scheduler/sched.h"
#include "server/jobs.h"
#include "server/schedules.h"
#include "storage/store.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int codes[JD_METRICS_CODES - 1] = {200, 201, 202, 204, 400, 401, 403, 404, 405, 409,
                                                413, 415, 422, 429, 431, 500, 503, 504, 304};

static const double lat_le[JD_METRICS_LAT_BUCKETS - 1] = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

static int code_index(int status)
{
    for (int i = 0; i < JD_METRICS_CODES - 1; i++)
        if (codes[i] == status)
            return i;
    return JD_METRICS_CODES - 1;
}

void jd_http_metrics_observe(struct jd_http_metrics *m, enum jd_route route, int status,
                             uint64_t duration_us)
{
    if ((unsigned)route >= JD_ROUTE_COUNT)
        route = JD_ROUTE_NONE;
    /* relaxed: independent counters, read only for display */
    atomic_fetch_add_explicit(&m->requests[route][code_index(status)], 1, memory_order_relaxed);
    int b = JD_METRICS_LAT_BUCKETS - 1;
    for (int i = 0; i < JD_METRICS_LAT_BUCKETS - 1; i++) {
        if ((double)duration_us <= lat_le[i] * 1e6) {
            b = i;
            break;
        }
    }
    atomic_fetch_add_explicit(&m->latency[route][b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->latency_us_sum[route], duration_us, memory_order_relaxed);
}

struct buf {
    char *p;
    size_t len, cap;
};

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct buf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0)
            abort();
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = b->cap * 2 + (size_t)n;
        b->p = jd_xrealloc(b->p, b->cap);
    }
}

static void family(struct buf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void scalar(struct buf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    family(b, name, type, help);
    put(b, "%s %llu\n", name, (unsigned long long)v);
}

/* A histogram from per-bucket (not cumulative) counts. */
static void histogram(struct buf *b, const char *name, const char *labels, const double *le,
                      const uint64_t *counts, size_t nb, double sum)
{
    uint64_t cum = 0;
    const char *sep = labels[0] ? "," : "";
    for (size_t i = 0; i < nb; i++) {
        cum += counts[i];
        if (i + 1 < nb)
            put(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, le[i],
                (unsigned long long)cum);
        else
            put(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
    }
    /* %.6f, not %g: %g keeps six significant digits, so once the sum passes
     * a few days of request time it moves in steps of seconds or more and
     * rate(_sum) / rate(_count) turns to noise. Sums are in seconds with
     * microsecond sources: six decimals lose nothing. */
    put(b, "%s_sum%s%s%s %.6f\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "", sum);
    put(b, "%s_count%s%s%s %llu\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "",
        (unsigned long long)cum);
}

static void render_http(struct buf *b, const struct jd_http_metrics *m)
{
    family(b, "jackdaw_http_requests_total", "counter", "HTTP requests by route and status.");
    for (int r = 0; r < JD_ROUTE_COUNT; r++) {
        for (int c = 0; c < JD_METRICS_CODES; c++) {
            uint64_t v = atomic_load_explicit(&m->requests[r][c], memory_order_relaxed);
            if (v == 0)
                continue;
            char code[8];
            if (c < JD_METRICS_CODES - 1)
                snprintf(code, sizeof code, "%d", codes[c]);
            else
                strcpy(code, "other");
            put(b, "jackdaw_http_requests_total{route=\"%s\",code=\"%s\"} %llu\n",
                jd_route_name((enum jd_route)r), code, (unsigned long long)v);
        }
    }
    family(b, "jackdaw_http_request_duration_seconds", "histogram",
           "HTTP request latency by route (long-polls include their wait).");
    for (int r = 0; r < JD_ROUTE_COUNT; r++) {
        uint64_t counts[JD_METRICS_LAT_BUCKETS];
        uint64_t total = 0;
        for (int i = 0; i < JD_METRICS_LAT_BUCKETS; i++) {
            counts[i] = atomic_load_explicit(&m->latency[r][i], memory_order_relaxed);
            total += counts[i];
        }
        if (total == 0)
            continue;
        char labels[96];
        snprintf(labels, sizeof labels, "route=\"%s\"", jd_route_name((enum jd_route)r));
        double sum =
            (double)atomic_load_explicit(&m->latency_us_sum[r], memory_order_relaxed) / 1e6;
        histogram(b, "jackdaw_http_request_duration_seconds", labels, lat_le, counts,
                  JD_METRICS_LAT_BUCKETS, sum);
    }
    scalar(b, "jackdaw_http_parked_connections", "gauge",
           "Long-poll and SSE connections parked now.",
           atomic_load_explicit(&m->parked, memory_order_relaxed));
    scalar(b, "jackdaw_http_parked_rejected_total", "counter",
           "Requests refused with 429 because --max-parked was reached.",
           atomic_load_explicit(&m->parked_rejected, memory_order_relaxed));
    scalar(b, "jackdaw_http_body_rejected_total", "counter",
           "Requests refused with 413 because the body exceeded --max-body.",
           atomic_load_explicit(&m->body_rejected, memory_order_relaxed));
}

static void render_jobs(struct buf *b, const struct jd_jobs_stats *j)
{
    scalar(b, "jackdaw_jobs_submitted_total", "counter", "Jobs accepted since start.",
           j->submitted);
    family(b, "jackdaw_jobs_finished_total", "counter", "Jobs that reached a terminal state.");
    put(b, "jackdaw_jobs_finished_total{state=\"succeeded\"} %llu\n",
        (unsigned long long)j->succeeded);
    put(b, "jackdaw_jobs_finished_total{state=\"failed\"} %llu\n", (unsigned long long)j->failed);
    put(b, "jackdaw_jobs_finished_total{state=\"cancelled\"} %llu\n",
        (unsigned long long)j->cancelled);
    scalar(b, "jackdaw_jobs_quarantined_total", "counter",
           "Jobs failed as quarantined at start: the server died --max-replays times in a row "
           "while running each.",
           j->quarantined);
    scalar(b, "jackdaw_window_pages_total", "counter",
           "Pages of queued jobs read from the store into the queued-job window (--queue-window).",
           j->window_pages);
    scalar(b, "jackdaw_window_jobs_in_total", "counter",
           "Queued jobs read from the store into memory (by a page, or for a cancel or message).",
           j->window_in);
    scalar(b, "jackdaw_window_jobs_out_total", "counter",
           "Queued jobs left to the store only, ranked past their queue's window.", j->window_out);
    scalar(b, "jackdaw_window_jobs_unowned_total", "counter",
           "Cluster: submits past this node's queued-job window, left in the database with no "
           "owner for any node to claim.",
           j->window_unowned);
    scalar(b, "jackdaw_heap_trims_total", "counter",
           "Times freed heap was given back to the system while a large backlog drained.",
           j->heap_trims);
    scalar(b, "jackdaw_job_memory_bytes", "gauge",
           "Memory live jobs hold in definitions and workflow step outputs (--max-job-memory).",
           j->def_bytes);
    scalar(b, "jackdaw_jobs_memory_refused_total", "counter",
           "Submits refused with 503 because --max-job-memory was reached.", j->def_refused);
    family(b, "jackdaw_jobs", "gauge", "Jobs in memory by state.");
    put(b, "jackdaw_jobs{state=\"queued\"} %llu\n", (unsigned long long)j->queued_mem);
    put(b, "jackdaw_jobs{state=\"running\"} %llu\n", (unsigned long long)j->running);
    put(b, "jackdaw_jobs{state=\"waiting\"} %llu\n", (unsigned long long)j->waiting);
    static const double le[11] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300};
    family(b, "jackdaw_job_duration_seconds", "histogram",
           "Time from start to terminal state of finished jobs.");
    histogram(b, "jackdaw_job_duration_seconds", "", le, j->duration_hist, 12,
              (double)j->duration_ms_sum / 1e3);
    scalar(b, "jackdaw_bulk_operations_running", "gauge",
           "Bulk cancel/retry operations running or waiting to run.", j->bulk_running);
    scalar(b, "jackdaw_webhook_attempts_total", "counter",
           "Job webhook (notify) POST attempts, retries included.", j->webhook_attempts);
    family(b, "jackdaw_webhooks_total", "counter",
           "Job webhooks that ended: delivered (2xx/3xx) or failed (4xx, or retries used up).");
    put(b, "jackdaw_webhooks_total{outcome=\"delivered\"} %llu\n",
        (unsigned long long)j->webhooks_delivered);
    put(b, "jackdaw_webhooks_total{outcome=\"failed\"} %llu\n",
        (unsigned long long)j->webhooks_failed);
}

static void render_schedules(struct buf *b, const struct jd_schedules_stats *s)
{
    scalar(b, "jackdaw_schedules", "gauge", "Schedules kept (active, paused and retired).",
           s->schedules);
    scalar(b, "jackdaw_schedule_fires_total", "counter",
           "Jobs created by schedules (fires, catch-ups and triggers).", s->fires);
    scalar(b, "jackdaw_schedule_skips_total", "counter",
           "Fire times skipped (the previous job still running, or an invalid job).", s->skips);
    scalar(b, "jackdaw_schedule_catchups_total", "counter",
           "Catch-up decisions after fire times were missed (downtime).", s->caught_up);
    scalar(b, "jackdaw_schedule_retired_total", "counter", "Schedules retired by end_at.",
           s->retired);
    static const int64_t bounds[JD_SCHED_LAG_BUCKETS - 1] = JD_SCHED_LAG_BOUNDS_MS;
    double le[JD_SCHED_LAG_BUCKETS - 1];
    for (int i = 0; i < JD_SCHED_LAG_BUCKETS - 1; i++)
        le[i] = (double)bounds[i] / 1e3;
    family(b, "jackdaw_schedule_fire_lag_seconds", "histogram",
           "How late a fire's decision ran after its fire time (on-time fires only).");
    histogram(b, "jackdaw_schedule_fire_lag_seconds", "", le, s->lag_hist, JD_SCHED_LAG_BUCKETS,
              (double)s->lag_ms_sum / 1e3);
}

static void render_sched(struct buf *b, const struct jd_sched_stats *s)
{
    family(b, "jackdaw_sched_processes", "gauge", "Processes by scheduler state.");
    put(b, "jackdaw_sched_processes{state=\"ready\"} %llu\n", (unsigned long long)s->ready);
    put(b, "jackdaw_sched_processes{state=\"running\"} %llu\n", (unsigned long long)s->running);
    put(b, "jackdaw_sched_processes{state=\"blocked\"} %llu\n", (unsigned long long)s->blocked);
    put(b, "jackdaw_sched_processes{state=\"idle\"} %llu\n", (unsigned long long)s->idle);
    scalar(b, "jackdaw_sched_workers", "gauge", "Scheduler worker threads.", s->workers);
    scalar(b, "jackdaw_sched_spawns_total", "counter", "Processes spawned.", s->spawns);
    scalar(b, "jackdaw_sched_steps_total", "counter", "Process steps run.", s->steps);
    scalar(b, "jackdaw_sched_steal_attempts_total", "counter", "Steal attempts.",
           s->steal_attempts);
    scalar(b, "jackdaw_sched_steals_total", "counter", "Successful steals.", s->steals);
    scalar(b, "jackdaw_sched_stolen_items_total", "counter", "Processes moved by steals.",
           s->stolen_items);
    scalar(b, "jackdaw_sched_parks_total", "counter", "Worker parks.", s->parks);
    scalar(b, "jackdaw_sched_unparks_total", "counter", "Worker unparks.", s->unparks);
    scalar(b, "jackdaw_sched_stuck_total", "counter",
           "Steps seen running longer than the stuck threshold.", s->stuck_events);
    scalar(b, "jackdaw_sched_stale_dropped_total", "counter",
           "Completions or messages dropped for a stale generation.", s->stale_dropped);
    scalar(b, "jackdaw_sched_lifo_hits_total", "counter", "Runs from the LIFO slot.", s->lifo_hits);
    scalar(b, "jackdaw_sched_unstacks_total", "counter",
           "Times a worker left a CPU another worker was stalled on.", s->unstacks);
    family(b, "jackdaw_sched_queue_depth", "gauge", "Scheduler queue depths.");
    put(b, "jackdaw_sched_queue_depth{queue=\"global\"} %llu\n",
        (unsigned long long)s->global_depth);
    put(b, "jackdaw_sched_queue_depth{queue=\"inject\"} %llu\n",
        (unsigned long long)s->inject_depth);
    put(b, "jackdaw_sched_queue_depth{queue=\"blocking\"} %llu\n",
        (unsigned long long)s->blocking_queued);
    scalar(b, "jackdaw_sched_timers_pending", "gauge", "Timers not yet fired.", s->timers_pending);
    scalar(b, "jackdaw_sched_blocking_active", "gauge", "Blocking-pool jobs running.",
           s->blocking_active);
}

static void render_store(struct buf *b, const struct jd_store_stats *s)
{
    scalar(b, "jackdaw_store_commits_total", "counter", "Storage transactions committed.",
           s->commits);
    scalar(b, "jackdaw_store_records_total", "counter", "Records written.", s->records);
    scalar(b, "jackdaw_store_failed_commits_total", "counter", "Transactions that failed.",
           s->failed_commits);
    scalar(b, "jackdaw_store_retention_deleted_total", "counter",
           "Terminal jobs deleted by retention.", s->retention_deleted);
    scalar(b, "jackdaw_store_queue_depth", "gauge", "Records waiting for the writer.",
           s->queue_depth);
    static const double batch_le[7] = {1, 4, 16, 64, 256, 1024, 4096};
    family(b, "jackdaw_store_batch_size", "histogram", "Records per group commit.");
    histogram(b, "jackdaw_store_batch_size", "", batch_le, s->batch_hist, 8, (double)s->records);
    static const double us_le[9] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                    0.005,  0.01,    0.025,  0.1};
    family(b, "jackdaw_store_commit_seconds", "histogram", "Commit latency.");
    histogram(b, "jackdaw_store_commit_seconds", "", us_le, s->commit_us_hist, 10,
              (double)s->commit_us_sum / 1e6);
}

static void render_cluster(struct buf *b, const struct jd_metrics_cluster *c)
{
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } rows[] = {
        {"jackdaw_cluster_claims_total", "counter", "Jobs this node claimed from the cluster.",
         offsetof(struct jd_metrics_cluster, claims)},
        {"jackdaw_cluster_takeovers_total", "counter",
         "Nodes whose lease lapsed, taken over by this node.",
         offsetof(struct jd_metrics_cluster, takeovers)},
        {"jackdaw_cluster_fenced_writes_total", "counter",
         "Writes refused because another node owns the job now.",
         offsetof(struct jd_metrics_cluster, fenced)},
        {"jackdaw_cluster_requests_applied_total", "counter",
         "Cancels and messages from other nodes applied here.",
         offsetof(struct jd_metrics_cluster, requests_applied)},
        {"jackdaw_cluster_lease_lost_total", "counter", "Times this node lost its lease.",
         offsetof(struct jd_metrics_cluster, lease_lost)},
        {"jackdaw_cluster_heartbeats_total", "counter", "Lease heartbeats answered.",
         offsetof(struct jd_metrics_cluster, heartbeats)},
        {"jackdaw_cluster_notices_total", "counter",
         "Change notices this node received (job changes are sent only while some node "
         "watches another node's jobs; inbox requests, schedules and claims always).",
         offsetof(struct jd_metrics_cluster, notices)},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        family(b, rows[i].name, rows[i].type, rows[i].help);
        put(b, "%s{node=\"%lld\"} %llu\n", rows[i].name, (long long)c->node,
            (unsigned long long)*(const uint64_t *)((const char *)c + rows[i].off));
    }
    family(b, "jackdaw_cluster_task_forwards_total", "counter",
           "Requests for remote tasks this node sent to other nodes: a worker's heartbeat, "
           "complete or fail for another node's task (relay), a claim for another node's "
           "waiting tasks (claim).");
    put(b, "jackdaw_cluster_task_forwards_total{node=\"%lld\",kind=\"relay\"} %llu\n",
        (long long)c->node, (unsigned long long)c->fwd_relays);
    put(b, "jackdaw_cluster_task_forwards_total{node=\"%lld\",kind=\"claim\"} %llu\n",
        (long long)c->node, (unsigned long long)c->fwd_claims);
    family(b, "jackdaw_cluster_task_forward_failures_total", "counter",
           "Of those, the ones the other node did not answer.");
    put(b, "jackdaw_cluster_task_forward_failures_total{node=\"%lld\",kind=\"relay\"} %llu\n",
        (long long)c->node, (unsigned long long)c->fwd_relay_failures);
    put(b, "jackdaw_cluster_task_forward_failures_total{node=\"%lld\",kind=\"claim\"} %llu\n",
        (long long)c->node, (unsigned long long)c->fwd_claim_failures);
    static const struct {
        const char *name, *help;
        size_t off;
    } more[] = {
        {"jackdaw_cluster_task_relays_gone_total",
         "Task requests answered here from the store: the task's node has no live row (409 "
         "lease_lost and the like), or did not answer and the task's end is stored.",
         offsetof(struct jd_metrics_cluster, fwd_relays_gone)},
        {"jackdaw_cluster_tasks_forward_claimed_total",
         "Tasks of other nodes handed to workers through this node's claims.",
         offsetof(struct jd_metrics_cluster, fwd_claimed)},
        {"jackdaw_cluster_task_announces_total",
         "Announcements this node sent of its waiting remote tasks.",
         offsetof(struct jd_metrics_cluster, fwd_announces)},
        {"jackdaw_cluster_task_forwards_refused_total",
         "Forwards and announcements refused at once (queue full or stopping).",
         offsetof(struct jd_metrics_cluster, fwd_refused)},
    };
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        family(b, more[i].name, "counter", more[i].help);
        put(b, "%s{node=\"%lld\"} %llu\n", more[i].name, (long long)c->node,
            (unsigned long long)*(const uint64_t *)((const char *)c + more[i].off));
    }
    family(b, "jackdaw_cluster_heartbeat_seconds_sum", "counter",
           "Time the lease heartbeats took, summed.");
    put(b, "jackdaw_cluster_heartbeat_seconds_sum{node=\"%lld\"} %.6f\n", (long long)c->node,
        (double)c->heartbeat_us_sum / 1e6);
    family(b, "jackdaw_cluster_heartbeat_seconds_max", "gauge", "The slowest lease heartbeat.");
    put(b, "jackdaw_cluster_heartbeat_seconds_max{node=\"%lld\"} %.6f\n", (long long)c->node,
        (double)c->heartbeat_us_max / 1e6);
    family(b, "jackdaw_cluster_watching", "gauge",
           "1 while this node wants job-change notices: it has (or had in the last 30 s) a "
           "wait or stream on a job another node holds, or an event stream open.");
    put(b, "jackdaw_cluster_watching{node=\"%lld\"} %d\n", (long long)c->node, c->watching ? 1 : 0);
    /* The read pool: waits say --db-readers is too small for the load
     * before the timeouts (503s) do. */
    family(b, "jackdaw_db_read_waits_total", "counter",
           "Reads that waited for a free PostgreSQL read connection (--db-readers).");
    put(b, "jackdaw_db_read_waits_total{node=\"%lld\"} %llu\n", (long long)c->node,
        (unsigned long long)c->read_waits);
    family(b, "jackdaw_db_read_wait_seconds_total", "counter",
           "Time reads spent waiting for a read connection, summed.");
    put(b, "jackdaw_db_read_wait_seconds_total{node=\"%lld\"} %.3f\n", (long long)c->node,
        (double)c->read_wait_us / 1e6);
    family(b, "jackdaw_db_read_timeouts_total", "counter",
           "Reads that found every read connection busy past the wait (5 s) and failed (503).");
    put(b, "jackdaw_db_read_timeouts_total{node=\"%lld\"} %llu\n", (long long)c->node,
        (unsigned long long)c->read_timeouts);
    family(b, "jackdaw_db_read_connections", "gauge",
           "PostgreSQL read connections open (idle and in use) and idle.");
    put(b, "jackdaw_db_read_connections{node=\"%lld\",state=\"open\"} %u\n", (long long)c->node,
        c->read_open);
    put(b, "jackdaw_db_read_connections{node=\"%lld\",state=\"idle\"} %u\n", (long long)c->node,
        c->read_idle);
    family(b, "jackdaw_db_read_connections_max", "gauge",
           "Read connections allowed at most (--db-readers).");
    put(b, "jackdaw_db_read_connections_max{node=\"%lld\"} %u\n", (long long)c->node, c->read_max);
}

static void render_calls(struct buf *b, const struct jd_jobs_call_stats *r)
{
    family(b, "jackdaw_plugin_calls_total", "counter", "Handler plugin calls by result.");
    put(b, "jackdaw_plugin_calls_total{result=\"ok\"} %llu\n", (unsigned long long)r->ok);
    put(b, "jackdaw_plugin_calls_total{result=\"failed\"} %llu\n", (unsigned long long)r->failed);
    put(b, "jackdaw_plugin_calls_total{result=\"timeout\"} %llu\n",
        (unsigned long long)r->timeouts);
    put(b, "jackdaw_plugin_calls_total{result=\"cancelled\"} %llu\n",
        (unsigned long long)r->cancelled);
    put(b, "jackdaw_plugin_calls_total{result=\"unknown_command\"} %llu\n",
        (unsigned long long)r->unknown_command);
    scalar(b, "jackdaw_plugin_calls_started_total", "counter", "Handler calls dispatched.",
           r->calls);
    scalar(b, "jackdaw_plugin_retries_total", "counter", "Handler call retries.", r->retries);
    scalar(b, "jackdaw_plugin_late_dropped_total", "counter",
           "Completions dropped as late or duplicate.", r->late_dropped);
}

/* A label value with \\, " and newlines escaped (queue names come from users). */
static void put_label(struct buf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            put(b, "\\%c", *v);
        else if (*v == '\n')
            put(b, "\\n");
        else
            put(b, "%c", *v);
    }
}

static void render_queues(struct buf *b, const struct jd_queue_counts *q, size_t n)
{
    family(b, "jackdaw_queue_jobs", "gauge", "Jobs in the database by queue and state.");
    for (size_t i = 0; i < n; i++) {
        for (int st = 0; st < JD_JOB_NSTATES; st++) {
            put(b, "jackdaw_queue_jobs{queue=\"");
            put_label(b, q[i].queue ? q[i].queue : "");
            put(b, "\",state=\"%s\"} %lld\n", jd_job_state_name((enum jd_job_state)st),
                (long long)q[i].counts[st]);
        }
    }
    family(b, "jackdaw_queue_paused", "gauge", "1 when the queue is paused.");
    for (size_t i = 0; i < n; i++) {
        put(b, "jackdaw_queue_paused{queue=\"");
        put_label(b, q[i].queue ? q[i].queue : "");
        put(b, "\"} %d\n", q[i].paused ? 1 : 0);
    }
}

/* Queue controls and command limits with their live numbers. */
static void render_limits(struct buf *b, const struct jd_metrics_sources *src)
{
    const struct jd_jobs_queue_limit *q = src->queue_limits;
    family(b, "jackdaw_queue_active", "gauge",
           "Jobs of the queue holding a running slot (what max_running caps).");
    for (size_t i = 0; i < src->nqueue_limits; i++) {
        put(b, "jackdaw_queue_active{queue=\"");
        put_label(b, q[i].name);
        put(b, "\"} %u\n", q[i].active);
    }
    family(b, "jackdaw_queue_max_running", "gauge", "A queue's max_running (queues with one).");
    for (size_t i = 0; i < src->nqueue_limits; i++) {
        if (!q[i].max_running)
            continue;
        put(b, "jackdaw_queue_max_running{queue=\"");
        put_label(b, q[i].name);
        put(b, "\"} %u\n", q[i].max_running);
    }
    family(b, "jackdaw_queue_rate_limit_per_second", "gauge",
           "A queue's rate limit on starts, per second (queues with one).");
    family(b, "jackdaw_queue_rate_waits_total", "counter",
           "Admissions a queue's rate limit deferred.");
    for (size_t i = 0; i < src->nqueue_limits; i++) {
        if (!q[i].rate_limit)
            continue;
        put(b, "jackdaw_queue_rate_limit_per_second{queue=\"");
        put_label(b, q[i].name);
        put(b, "\"} %g\n", q[i].rate_limit * 1000.0 / (double)q[i].rate_per_ms);
        put(b, "jackdaw_queue_rate_waits_total{queue=\"");
        put_label(b, q[i].name);
        put(b, "\"} %llu\n", (unsigned long long)q[i].rate_waits);
    }
    const struct jd_jobs_command_limit *c = src->command_limits;
    family(b, "jackdaw_command_limit", "gauge", "A command's --command-limit.");
    for (size_t i = 0; i < src->ncommand_limits; i++)
        put(b, "jackdaw_command_limit{command=\"%s\"} %u\n", c[i].name, c[i].limit);
    family(b, "jackdaw_command_active", "gauge", "Calls of a limited command in flight.");
    for (size_t i = 0; i < src->ncommand_limits; i++)
        put(b, "jackdaw_command_active{command=\"%s\"} %u\n", c[i].name, c[i].active);
    family(b, "jackdaw_command_waiting", "gauge",
           "Calls of a limited command waiting for a place.");
    for (size_t i = 0; i < src->ncommand_limits; i++)
        put(b, "jackdaw_command_waiting{command=\"%s\"} %u\n", c[i].name, c[i].waiting);
}

/* One counter or gauge per remote command. */
static void per_command(struct buf *b, const char *name, const char *type, const char *help,
                        const struct jd_task_stats *t, size_t n, size_t off)
{
    family(b, name, type, help);
    for (size_t i = 0; i < n; i++) {
        put(b, "%s{command=\"", name);
        put_label(b, t[i].command);
        put(b, "\"} %llu\n", (unsigned long long)*(const uint64_t *)((const char *)&t[i] + off));
    }
}

static void render_tasks(struct buf *b, const struct jd_task_stats *t, size_t n)
{
    per_command(b, "jackdaw_tasks_waiting", "gauge", "Remote tasks no worker has claimed.", t, n,
                offsetof(struct jd_task_stats, waiting));
    per_command(b, "jackdaw_tasks_in_flight", "gauge", "Remote tasks claimed and not ended.", t, n,
                offsetof(struct jd_task_stats, in_flight));
    per_command(b, "jackdaw_tasks_claimed_total", "counter", "Remote tasks claimed by workers.", t,
                n, offsetof(struct jd_task_stats, claimed));
    per_command(b, "jackdaw_tasks_lease_expired_total", "counter",
                "Claimed remote tasks whose lease ran out.", t, n,
                offsetof(struct jd_task_stats, lease_expiries));
    per_command(b, "jackdaw_tasks_completed_total", "counter", "Remote tasks workers completed.", t,
                n, offsetof(struct jd_task_stats, completed));
    per_command(b, "jackdaw_tasks_failed_total", "counter", "Remote tasks workers failed.", t, n,
                offsetof(struct jd_task_stats, failed));
    static const double le[JD_TASK_LAT_BUCKETS - 1] = {0.01, 0.05, 0.1, 0.5, 1,   5,
                                                       10,   30,   60,  300, 3600};
    family(b, "jackdaw_task_claim_to_end_seconds", "histogram",
           "From a worker's claim to its complete or fail.");
    for (size_t i = 0; i < n; i++) {
        struct buf l = {jd_xmalloc(256), 0, 256};
        l.p[0] = '\0';
        put(&l, "command=\"");
        put_label(&l, t[i].command);
        put(&l, "\"");
        histogram(b, "jackdaw_task_claim_to_end_seconds", l.p, le, t[i].latency_hist,
                  JD_TASK_LAT_BUCKETS, (double)t[i].latency_ms_sum / 1000.0);
        free(l.p);
    }
}

char *jd_metrics_render(const struct jd_metrics_sources *src)
{
    struct buf b = {jd_xmalloc(16384), 0, 16384};
    b.p[0] = '\0';
    scalar(&b, "jackdaw_up", "gauge", "1 when ready, 0 when starting or draining.",
           src->ready ? 1 : 0);
    if (src->http)
        render_http(&b, src->http);
    if (src->jobs)
        render_jobs(&b, src->jobs);
    if (src->sched)
        render_sched(&b, src->sched);
    if (src->store)
        render_store(&b, src->store);
    if (src->calls)
        render_calls(&b, src->calls);
    if (src->schedules)
        render_schedules(&b, src->schedules);
    if (src->queues)
        render_queues(&b, src->queues, src->nqueues);
    if (src->queue_limits || src->command_limits)
        render_limits(&b, src);
    if (src->tasks)
        render_tasks(&b, src->tasks, src->ntasks);
    if (src->cluster)
        render_cluster(&b, src->cluster);
    return b.p;
}
