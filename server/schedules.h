/*
 * Schedules: recorded objects that create ordinary jobs on a cron
 * expression or a fixed interval (docs/architecture.md, "Schedules"). Part of the job
 * layer; knows no HTTP.
 *
 * Each live schedule has exactly one timer on the scheduler's timer heap
 * (no thread, no poll loop). When it fires, the decision (fire, skip, catch
 * up, retire) is one store group: the schedule's row update and history
 * event commit together with the job insert, whose idempotency key
 * "schedule:<id>:<fire ms>" makes a second job for one fire time
 * impossible. So a crash before the commit loses nothing (the row still
 * names the fire as next, and it runs on restart by the catch-up policy)
 * and a crash after it doubles nothing.
 *
 * A schedule's definition (JSON, what PUT takes):
 *   {"cron": "*&#47;5 * * * *" | "every": "30s"      exactly one
 *    "timezone": "Europe/Berlin",                    cron only; default "UTC"
 *    "job": {...},                                   any job definition
 *    "overlap": "skip" | "allow" | "cancel_previous", default "skip"
 *    "catchup": "none" | "latest" | "all",           default "latest"
 *    "start_at": RFC 3339, "end_at": RFC 3339,       optional
 *    "paused": bool, "jitter_ms": n, "labels": {..}}
 * ("*&#47;5" is "*" then "/5": a C comment cannot spell it.)
 *
 * Threading: every function is safe from any thread. Operations that
 * change a schedule answer through a done callback after the commit (on
 * the store's completion thread; it must not block).
 */
#ifndef JD_SERVER_SCHEDULES_H
#define JD_SERVER_SCHEDULES_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct jd_schedules;
struct jd_store;
struct jd_jobs;

#define JD_SCHEDULE_ID_MAX 100      /* ids are [A-Za-z0-9._-], 1..100 characters */
#define JD_SCHEDULE_CATCHUP_CAP 100 /* catchup "all" runs at most this many missed fires */

/* Timers, replaceable for tests (docs/architecture.md, "Testing"): after(ctx, delay_ms, fn,
 * arg, &id) runs fn(arg) once after delay_ms (0 or a JD_E* code); cancel
 * returns 0 if the timer was pending and will not run. */
struct jd_schedules_timers {
    int (*after)(void *ctx, int64_t delay_ms, void (*fn)(void *arg), void *arg, uint64_t *id);
    int (*cancel)(void *ctx, uint64_t id);
    void *ctx;
};

struct jd_schedules_config {
    struct jd_store *store; /* borrowed; outlives the schedules */
    struct jd_jobs *jobs;   /* borrowed; outlives the schedules */
    unsigned max_schedules; /* 0: 10000; a PUT past it answers JD_EFULL */
    size_t max_body_bytes;  /* a schedule definition; 0: 64 KiB */
    int64_t grace_ms;       /* a fire later than this counts as missed (the catch-up
                               policy decides it); 0: 5000 */
    const struct jd_schedules_timers *timers; /* NULL: the scheduler's timer heap */
};

/* Load every schedule from the store and arm its timer; fires missed while
 * the server was down are decided by each schedule's catch-up policy. *out
 * freed with jd_schedules_destroy. */
int jd_schedules_create(const struct jd_schedules_config *cfg, struct jd_schedules **out,
                        struct jd_error *err);
/* No more fires: cancel every timer and wait for fires in flight to commit.
 * Call before draining the job layer. Idempotent. */
void jd_schedules_stop(struct jd_schedules *s);
/* Stop if not yet, then free. */
void jd_schedules_destroy(struct jd_schedules *s);

/* rc 0 or a JD_E* code; json: the schedule (or, for trigger, the job)
 * rendered, NULL on error; created: a PUT made a new schedule. Borrowed. */
typedef void (*jd_schedule_done_fn)(void *arg, int rc, bool created, const char *json);

/* Create or replace. Validation failures return at once with err filled
 * (JD_EINVAL with a pointer such as "/cron" or "/job/steps/0/call",
 * JD_EPARSE, JD_ETOOBIG) and done is not called; JD_EFULL past
 * max_schedules. Otherwise 0, and done fires once it is durable. */
int jd_schedules_put(struct jd_schedules *s, const char *id, const char *body, size_t len,
                     jd_schedule_done_fn done, void *arg, struct jd_error *err);
/* JD_ENOENT at once if there is no such schedule. */
int jd_schedules_delete(struct jd_schedules *s, const char *id, jd_schedule_done_fn done,
                        void *arg);
/* Pause (no fires until resumed) or resume (fires from now on; what was
 * missed while paused is not caught up). Idempotent. */
int jd_schedules_pause(struct jd_schedules *s, const char *id, bool paused,
                       jd_schedule_done_fn done, void *arg);
/* Run the job once now (a paused or retired schedule too); json: the job. */
int jd_schedules_trigger(struct jd_schedules *s, const char *id, jd_schedule_done_fn done,
                         void *arg, struct jd_error *err);

/* Reads (caller frees json with free()). The schedule as stored plus
 * "state", "next_fire_times" (up to 5), "last_fire" and "counts". */
int jd_schedules_get_json(struct jd_schedules *s, const char *id, char **json);
/* {"schedules":[...],"next_cursor":"..."|null}; limit 0: 50, at most 1000. */
int jd_schedules_list_json(struct jd_schedules *s, const char *cursor, unsigned limit, char **json,
                           struct jd_error *err);
/* {"events":[{"seq":..,"time":..,"kind":..,"fire_time":..,"job_id":..,"data":..}]} */
int jd_schedules_events_json(struct jd_schedules *s, const char *id, int64_t after_seq,
                             unsigned limit, char **json);

/* A clustered store's hook (never blocks): schedule id (NULL: any) was
 * changed by some node; it is re-read from the store, so that a new leader
 * fires from where the old one stopped. */
void jd_schedules_cluster_changed(struct jd_schedules *s, const char *id);

/* A schedule id as the API takes it: 0 or JD_EINVAL (err says why). */
int jd_schedules_check_id(const char *id, struct jd_error *err);

#define JD_SCHED_LAG_BUCKETS 12 /* fire lag: 1,5,10,25,50,100,250,500ms,1,5,60s,+inf */
struct jd_schedules_stats {
    uint64_t schedules, fires, skips, caught_up, retired;
    uint64_t lag_hist[JD_SCHED_LAG_BUCKETS];
    uint64_t lag_ms_sum;
};
void jd_schedules_stats(struct jd_schedules *s, struct jd_schedules_stats *out);
/* The upper bounds of the lag buckets, in ms (the last bucket is +inf); an
 * initializer, so /metrics needs no symbol of the engine's. */
#define JD_SCHED_LAG_BOUNDS_MS                                                                     \
    {                                                                                              \
        1, 5, 10, 25, 50, 100, 250, 500, 1000, 5000, 60000                                         \
    }

#endif
