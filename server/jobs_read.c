/*
 * Reading: a job, a page of jobs, a job's events, handlers and queue counts
 * as JSON, and the layer's counters. Reads go to the store (the truth for
 * committed state), not to the in-memory table.
 *
 * Threading: called from HTTP threads and the metrics route; only
 * jd_jobs_stats takes jd_jobs.mu (to walk the table).
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int jd_jobs_get_json(struct jd_jobs *j, int64_t id, char **json, int64_t *version, bool *terminal)
{
    struct jd_job row = {0};
    int rc = jd_store_job_get(j->store, id, &row);
    if (rc)
        return rc;
    if (json) {
        *json = jd_render_job_json(&row);
        /* A remote step's latest progress (a worker's heartbeat), while
         * the job runs: kept in memory, spliced in as "progress". */
        char *p = jd_job_state_terminal(row.state) ? NULL : jobs_tasks_progress(j, id);
        size_t n = *json ? strlen(*json) : 0;
        if (p && n > 1 && (*json)[n - 1] == '}') {
            (*json)[n - 1] = '\0';
            char *both = jd_xasprintf("%s,\"progress\":%s}", *json, p);
            free(*json);
            *json = both;
        }
        free(p);
    }
    if (version)
        *version = row.version;
    if (terminal)
        *terminal = jd_job_state_terminal(row.state);
    jd_job_clear(&row);
    return 0;
}

int jd_jobs_parse_id(const char *s, int64_t *id)
{
    if (!s || !*s || strlen(s) > 19)
        return JD_ENOENT;
    int64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return JD_ENOENT;
        if (v > (INT64_MAX - (*p - '0')) / 10)
            return JD_ENOENT;
        v = v * 10 + (*p - '0');
    }
    if (v <= 0)
        return JD_ENOENT;
    *id = v;
    return 0;
}

/* jd_jobs_list_json: in jobs_find.c, with the filters it shares with the bulk actions. */

/* A job's events after after_seq, at most limit (0: 1000; max 10000);
 * JD_ENOENT if there is no such job. Caller frees with jd_job_events_free. */
static int events_page(struct jd_jobs *j, int64_t id, int64_t after_seq, unsigned limit,
                       struct jd_job_event **ev, size_t *n)
{
    struct jd_job row = {0};
    int rc = jd_store_job_get(j->store, id, &row); /* JD_ENOENT, or a read that failed */
    if (rc)
        return rc;
    jd_job_clear(&row);
    if (limit == 0 || limit > 10000)
        limit = limit ? 10000 : 1000;
    return jd_store_events(j->store, id, after_seq, limit, ev, n);
}

int jd_jobs_events_json(struct jd_jobs *j, int64_t id, int64_t after_seq, unsigned limit,
                        char **json)
{
    struct jd_job_event *ev = NULL;
    size_t n = 0;
    int rc = events_page(j, id, after_seq, limit, &ev, &n);
    if (rc)
        return rc;
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "events");
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, jd_render_event(&ev[i]));
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    jd_job_events_free(ev, n);
    return 0;
}

int jd_jobs_events_each(struct jd_jobs *j, int64_t id, int64_t after_seq, unsigned limit,
                        bool (*fn)(void *arg, int64_t seq, const char *kind,
                                   const char *event_json),
                        void *arg)
{
    struct jd_job_event *ev = NULL;
    size_t n = 0;
    int rc = events_page(j, id, after_seq, limit, &ev, &n);
    if (rc)
        return rc;
    int count = 0;
    bool more = true;
    for (size_t i = 0; i < n && more; i++) {
        cJSON *o = jd_render_event(&ev[i]);
        char *t = cJSON_PrintUnformatted(o);
        more = fn(arg, ev[i].seq, jd_event_kind_name(ev[i].kind), t);
        free(t);
        cJSON_Delete(o);
        count++;
    }
    jd_job_events_free(ev, n);
    return count;
}

int jd_jobs_handlers_json(struct jd_jobs *j, char **json)
{
    cJSON *o = jd_render_handlers(j->reg);
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return 0;
}

void jd_jobs_stats(struct jd_jobs *j, struct jd_jobs_stats *out)
{
    pthread_mutex_lock(&j->mu);
    *out = j->st;
    out->def_bytes = atomic_load_explicit(&j->def_mem, memory_order_relaxed);
    out->heap_trims += atomic_load(&j->releases); /* the ones at the end of a drain */
    out->running = out->waiting = 0;
    for (unsigned b = 0; b < NBUCKETS; b++)
        for (struct job *jb = j->table[b]; jb; jb = jb->hnext) {
            if (jb->finished || !jb->spawned)
                continue;
            if (jb->state == JD_JOB_WAITING)
                out->waiting++;
            else if (jb->state == JD_JOB_RUNNING)
                out->running++;
        }
    pthread_mutex_unlock(&j->mu);
    out->bulk_running = jobs_bulk_running(j); /* its own lock, not under mu */
}

struct jd_sched *jd_jobs_sched(struct jd_jobs *j)
{
    return j->sched;
}

void jd_jobs_call_stats(struct jd_jobs *j, struct jd_jobs_call_stats *out)
{
    struct jd_registry_stats rs;
    jd_registry_stats(j->reg, &rs);
    *out = (struct jd_jobs_call_stats){.calls = rs.calls,
                                       .ok = rs.ok,
                                       .failed = rs.failed,
                                       .timeouts = rs.timeouts,
                                       .cancelled = rs.cancelled,
                                       .unknown_command = rs.unknown_command,
                                       .retries = rs.retries,
                                       .late_dropped = rs.late_dropped};
}

struct jd_stats *jd_jobs_series(struct jd_jobs *j)
{
    return j->series;
}
