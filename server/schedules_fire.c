/*
 * Firing: each live schedule's one timer, the decision when it goes off
 * (fire, skip because the previous job still runs, catch up what was
 * missed, retire), the commit of that decision together with the fire's
 * job (jd_jobs_submit_with, key "schedule:<id>:<fire ms>") and what
 * follows it (the next timer), and the watch on the last fire's job that
 * the overlap rule reads.
 *
 * Threading: timer_fn runs on the scheduler's timer thread, fire_done on
 * the store's completion thread, watch_fn wherever the job layer calls it;
 * each takes S->mu for the schedule's state. jd_jobs_watch is never called
 * under S->mu.
 */
#include "server/schedules_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "scheduler/sched.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int64_t lag_bounds_ms[JD_SCHED_LAG_BUCKETS - 1] = JD_SCHED_LAG_BOUNDS_MS;

static void note_lag(struct jd_schedules *S, int64_t lag_ms)
{
    if (lag_ms < 0)
        lag_ms = 0;
    int b = 0;
    while (b < JD_SCHED_LAG_BUCKETS - 1 && lag_ms > lag_bounds_ms[b])
        b++;
    atomic_fetch_add_explicit(&S->st_lag[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&S->st_lag_sum, (uint64_t)lag_ms, memory_order_relaxed);
}

/* ------------------------------------------------------------- timers */

struct tarm {
    struct jd_schedules *S;
    struct sched *sc; /* referenced */
    uint64_t seq;
};

static void timer_fn(void *arg);

/* Under mu: a timer argument is finished with. */
static void tarm_end(struct jd_schedules *S, struct tarm *t)
{
    if (--S->tarms == 0)
        pthread_cond_broadcast(&S->cv);
    schedules_unref(t->sc);
    free(t);
}

int schedules_timer_after(void *ctx, int64_t delay_ms, void (*fn)(void *), void *arg, uint64_t *id)
{
    return jd_sched_timer_after(ctx, (uint64_t)delay_ms * 1000000u, fn, arg, id);
}

int schedules_timer_cancel(void *ctx, uint64_t id)
{
    return jd_sched_timer_cancel(ctx, id);
}

/* Under mu: withdraw the pending timer (if it is already running, its
 * stale sequence number stops it). */
void schedules_disarm(struct jd_schedules *S, struct sched *sc)
{
    sc->timer_seq++;
    if (!sc->timer_armed)
        return;
    sc->timer_armed = false;
    /* A cancelled timer never runs: its argument is ours to free. One that
     * is running already frees its own (it finds its sequence stale). */
    if (S->timers.cancel(S->timers.ctx, sc->timer_id) == 0)
        tarm_end(S, sc->tarm);
    sc->tarm = NULL;
}

/* Under mu: schedules_arm the timer for the committed next fire, if the schedule is
 * live and nothing is in flight. delay_ms < 0: at its fire time. */
void schedules_arm(struct jd_schedules *S, struct sched *sc, int64_t delay_ms)
{
    schedules_disarm(S, sc);
    if (S->stopped || sc->gone || sc->deleting || !sc->loaded || sc->paused || sc->retired ||
        sc->busy || sc->ops || !sc->next_fire_ms)
        return;
    if (delay_ms < 0) {
        delay_ms = sc->next_fire_ms + schedules_jitter_for(sc, sc->next_fire_ms) - jd_wall_ms();
        if (delay_ms < 0)
            delay_ms = 0;
    }
    struct tarm *t = jd_xmalloc(sizeof *t);
    t->S = S;
    t->sc = sc;
    t->seq = sc->timer_seq;
    schedules_ref(sc);
    S->tarms++;
    if (S->timers.after(S->timers.ctx, delay_ms, timer_fn, t, &sc->timer_id) != 0) {
        tarm_end(S, t);
        return;
    }
    sc->tarm = t;
    sc->timer_armed = true;
}

/* ------------------------------------------------------------- fires */

static void fire_done(void *arg, const struct jd_submit_result *res);

/* Under mu: record fire time fire_ms as skipped (data: why; taken), the
 * schedule's last job still job_ref, and move on to next_ms. */
static void record_skip(struct jd_schedules *S, struct sched *sc, int64_t fire_ms, int64_t next_ms,
                        int64_t job_ref, cJSON *data)
{
    struct op *o = schedules_op_new(S, sc, OP_CHANGE);
    o->fire_ms = fire_ms;
    o->data = cJSON_PrintUnformatted(data);
    cJSON_Delete(data);
    struct jd_write *w = schedules_op_change(o, "skipped", fire_ms, job_ref, o->data);
    w->sched.set = JD_SSET_LAST;
    w->sched.last_fire_ms = fire_ms;
    w->sched.last_job_id = job_ref;
    w->sched.last_outcome = "skipped";
    w->sched.add_skips = 1;
    schedules_op_advance(o, next_ms);
    atomic_fetch_add_explicit(&S->st_skips, 1, memory_order_relaxed);
    if (schedules_submit_changes(S, o) != 0) {
        schedules_op_free(o);
        return;
    }
    sc->busy = true;
    S->busy_total++;
}

/* Under mu, sc->busy not set: run the job for fire time fire_ms (event
 * kind `event`, extra data or NULL), then move the next fire to next_ms. */
static void fire(struct jd_schedules *S, struct sched *sc, int64_t fire_ms, int64_t next_ms,
                 const char *event, cJSON *data)
{
    int64_t running = sc->last_job_id;
    bool unfinished =
        running && atomic_load_explicit(&sc->done_job, memory_order_acquire) < running;
    struct op *o = schedules_op_new(S, sc, OP_FIRE);
    o->fire_ms = fire_ms;
    if (unfinished && sc->sp.overlap == OV_SKIP) {
        schedules_op_free(o);
        if (!data)
            data = cJSON_CreateObject();
        cJSON_AddStringToObject(data, "reason", "the previous job is still running");
        char idbuf[24];
        snprintf(idbuf, sizeof idbuf, "%" PRId64, running);
        cJSON_AddStringToObject(data, "running_job_id", idbuf);
        record_skip(S, sc, fire_ms, next_ms, running, data);
        return;
    }
    if (unfinished && sc->sp.overlap == OV_CANCEL) {
        if (!data)
            data = cJSON_CreateObject();
        char idbuf[24];
        snprintf(idbuf, sizeof idbuf, "%" PRId64, running);
        cJSON_AddStringToObject(data, "cancelled_job_id", idbuf);
        /* Recorded by the job layer on its own; a job that ended meanwhile
         * answers JD_ECONFLICT, which is what we wanted anyway. */
        jd_jobs_cancel(S->jobs, running, NULL, NULL);
    }
    o->data = data ? cJSON_PrintUnformatted(data) : NULL;
    cJSON_Delete(data);
    o->job_id = jd_store_next_id(S->store);
    snprintf(o->key, sizeof o->key, "schedule:%s:%" PRId64, sc->id, fire_ms);
    struct jd_write *w = schedules_op_change(o, event, fire_ms, o->job_id, o->data);
    w->sched.set = JD_SSET_LAST;
    w->sched.last_fire_ms = fire_ms;
    w->sched.last_job_id = o->job_id;
    w->sched.last_outcome = event;
    w->sched.add_fires = 1;
    schedules_op_advance(o, next_ms);
    struct jd_write *extra[2] = {&o->w[0], &o->w[1]};
    struct jd_jobs_submit_with with = {.job_id = o->job_id,
                                       .idempotency_key = o->key,
                                       .schedule_id = sc->id,
                                       .extra = extra,
                                       .n_extra = o->nw,
                                       .no_json = true};
    struct jd_error err;
    int rc = jd_jobs_submit_with(S->jobs, sc->sp.job_text, strlen(sc->sp.job_text), &with,
                                 fire_done, o, &err);
    if (rc == JD_ESHUTDOWN) {
        schedules_op_free(o);
        return;
    }
    if (rc != 0) {
        /* The job no longer validates (a plugin went away since the PUT):
         * the fire is recorded as skipped, with the reason. */
        schedules_op_free(o);
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "reason", "the job definition is invalid");
        cJSON_AddStringToObject(d, "error", err.message);
        cJSON_AddStringToObject(d, "pointer", err.pointer);
        record_skip(S, sc, fire_ms, next_ms, sc->last_job_id, d);
        return;
    }
    atomic_fetch_add_explicit(&S->st_fires, 1, memory_order_relaxed);
    sc->busy = true;
    S->busy_total++;
}

/* Under mu: a decision with no job (catch-up "none", ticks dropped past
 * the cap): move the next fire to next_ms with one event. */
static void decide_without_job(struct jd_schedules *S, struct sched *sc, int64_t next_ms,
                               int64_t skipped, cJSON *data)
{
    struct op *o = schedules_op_new(S, sc, OP_CHANGE);
    o->data = cJSON_PrintUnformatted(data);
    cJSON_Delete(data);
    struct jd_write *w = schedules_op_change(o, "caught_up", 0, 0, o->data);
    w->sched.add_skips = skipped;
    schedules_op_advance(o, next_ms);
    atomic_fetch_add_explicit(&S->st_caught_up, 1, memory_order_relaxed);
    if (schedules_submit_changes(S, o) != 0) {
        schedules_op_free(o);
        return;
    }
    sc->busy = true;
    S->busy_total++;
}

void schedules_busy_end(struct jd_schedules *S, struct sched *sc)
{
    if (!sc->busy)
        return;
    sc->busy = false;
    if (--S->busy_total == 0)
        pthread_cond_broadcast(&S->cv);
}

/* The fire's job committed (with the schedule's records) or not. */
static void fire_done(void *arg, const struct jd_submit_result *res)
{
    struct op *o = arg;
    struct jd_schedules *S = o->S;
    struct sched *sc = o->sc;
    int64_t watch = 0;
    pthread_mutex_lock(&S->mu);
    if (res->rc == 0 && res->existing) {
        /* A job for this fire time exists already (the schedule was deleted
         * and made again under its id): the group was refused whole.
         * Record the fire as that job's, alone, and go on from there. */
        struct op *c = schedules_op_new(S, sc, OP_CHANGE);
        c->data = jd_xstrdup("{\"existing\":true}");
        struct jd_write *w = schedules_op_change(c, "fired", o->fire_ms, res->job_id, c->data);
        w->sched.set = JD_SSET_LAST;
        w->sched.last_fire_ms = o->fire_ms;
        w->sched.last_job_id = res->job_id;
        w->sched.last_outcome = "fired";
        schedules_op_advance(c, o->next_ms);
        c->job_id = res->job_id;
        c->set_last = true;
        if (schedules_submit_changes(S, c) != 0) {
            schedules_op_free(c);
            schedules_busy_end(S, sc);
        }
    } else if (res->rc == 0) {
        sc->next_fire_ms = o->next_ms;
        sc->retired = o->retire;
        sc->last_job_id = o->job_id;
        watch = o->job_id;
        if (o->retire)
            atomic_fetch_add_explicit(&S->st_retired, 1, memory_order_relaxed);
        schedules_busy_end(S, sc);
        schedules_arm(S, sc, -1);
    } else {
        schedules_busy_end(S, sc);
        if (res->rc == JD_ECONFLICT && S->cl) {
            /* Another node committed this fire first (or moved the schedule
             * on): re-read it; a timer covers a failed read. */
            schedules_cluster_reread(S, sc->id);
            schedules_arm(S, sc, RETRY_MS);
        } else if (res->rc != JD_ENOENT && res->rc != JD_ESHUTDOWN) {
            jd_logf(JD_LOG_WARN,
                    "schedule %s: the fire at %" PRId64 " was not stored (%s); "
                    "trying again",
                    sc->id, o->fire_ms, jd_strerror(res->rc));
            schedules_arm(S, sc, RETRY_MS);
        }
    }
    pthread_mutex_unlock(&S->mu);
    if (watch)
        schedules_watch_job(S, sc, watch);
    schedules_op_free(o);
}

/* ---------------------------------------------------------- deciding */

/* Under mu: count the fires from `from` up to `until` (both inclusive):
 * *n of them, the last at *last, and the first kept when only the newest
 * `keep` are wanted at *first_kept. Intervals are arithmetic; cron counts
 * one by one, and past COUNT_LIMIT starts again RESEED_S before `until`
 * (the count is then a lower bound, *more set). */
static void count_due(const struct sched *sc, int64_t from, int64_t until, int64_t keep, int64_t *n,
                      int64_t *last, int64_t *first_kept, bool *more)
{
    const struct spec *sp = &sc->sp;
    *more = false;
    if (!sp->is_cron) {
        int64_t end = sp->end_at && sp->end_at < until ? sp->end_at : until;
        *n = end < from ? 0 : (end - from) / sp->every_ms + 1;
        *last = from + (*n - 1) * sp->every_ms;
        *first_kept = *n > keep ? *last - (keep - 1) * sp->every_ms : from;
        return;
    }
    int64_t ring[JD_SCHEDULE_CATCHUP_CAP];
    int64_t count = 0, t = from;
    while (t && t <= until) {
        ring[count % keep] = t;
        count++;
        *last = t;
        if (count % COUNT_LIMIT == 0 && until - (int64_t)RESEED_S * 1000 > t) {
            *more = true;
            t = schedules_spec_next(sp, sc->anchor_ms, until - (int64_t)RESEED_S * 1000);
            continue;
        }
        t = schedules_spec_next(sp, sc->anchor_ms, t);
    }
    *n = count;
    *first_kept = count > keep ? ring[count % keep] : from;
}

/* Under mu: the timer for sc->next_fire_ms went off at `now`. */
static void decide(struct jd_schedules *S, struct sched *sc, int64_t now)
{
    int64_t f = sc->next_fire_ms;
    if (!f)
        return;
    if (f > now) { /* early (the wall clock moved back): wait again */
        schedules_arm(S, sc, -1);
        return;
    }
    if (sc->catchup_until >= f) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "policy", "all");
        fire(S, sc, f, schedules_spec_next(&sc->sp, sc->anchor_ms, f), "caught_up", d);
        return;
    }
    if (now - f <= S->grace_ms) {
        note_lag(S, now - (f + schedules_jitter_for(sc, f)));
        fire(S, sc, f, schedules_spec_next(&sc->sp, sc->anchor_ms, f), "fired", NULL);
        return;
    }
    /* Missed: every fire time more than the grace period ago. */
    int64_t n, last, first_kept;
    bool more;
    count_due(sc, f, now - S->grace_ms, JD_SCHEDULE_CATCHUP_CAP, &n, &last, &first_kept, &more);
    int64_t after = schedules_spec_next(&sc->sp, sc->anchor_ms, last);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "policy", schedules_catchup_names[sc->sp.catchup]);
    cJSON_AddNumberToObject(d, "missed", (double)n);
    if (more)
        cJSON_AddBoolToObject(d, "missed_is_a_lower_bound", true);
    char buf[40];
    jd_time_format(f, buf, sizeof buf);
    cJSON_AddStringToObject(d, "since", buf);
    switch (sc->sp.catchup) {
    case CU_NONE:
        cJSON_AddNumberToObject(d, "ran", 0);
        decide_without_job(S, sc, after, n, d);
        return;
    case CU_LATEST:
        cJSON_AddNumberToObject(d, "ran", 1);
        atomic_fetch_add_explicit(&S->st_caught_up, 1, memory_order_relaxed);
        fire(S, sc, last, after, "caught_up", d);
        return;
    case CU_ALL:
        if (n > JD_SCHEDULE_CATCHUP_CAP) {
            cJSON_AddNumberToObject(d, "ran", JD_SCHEDULE_CATCHUP_CAP);
            cJSON_AddNumberToObject(d, "cap", JD_SCHEDULE_CATCHUP_CAP);
            cJSON_AddNumberToObject(d, "dropped", (double)(n - JD_SCHEDULE_CATCHUP_CAP));
            sc->catchup_until = last;
            decide_without_job(S, sc, first_kept, n - JD_SCHEDULE_CATCHUP_CAP, d);
            return;
        }
        sc->catchup_until = last;
        cJSON_AddNumberToObject(d, "ran", (double)n);
        atomic_fetch_add_explicit(&S->st_caught_up, 1, memory_order_relaxed);
        fire(S, sc, f, schedules_spec_next(&sc->sp, sc->anchor_ms, f), "caught_up", d);
        return;
    }
}

static void timer_fn(void *arg)
{
    struct tarm *t = arg;
    struct jd_schedules *S = t->S;
    struct sched *sc = t->sc;
    pthread_mutex_lock(&S->mu);
    if (sc->timer_seq == t->seq && sc->timer_armed) {
        sc->timer_armed = false;
        sc->tarm = NULL;
        if (!S->stopped && !sc->gone && !sc->deleting && !sc->paused && !sc->retired && !sc->busy &&
            !sc->ops && schedules_cluster_may_fire_locked(S, sc))
            decide(S, sc, jd_wall_ms());
    }
    tarm_end(S, t);
    pthread_mutex_unlock(&S->mu);
}

/* ------------------------------------------------------------ watches */

static void mark_done(struct sched *sc, int64_t job_id)
{
    int64_t cur = atomic_load_explicit(&sc->done_job, memory_order_relaxed);
    /* release: pairs with the acquire in fire() */
    while (cur < job_id &&
           !atomic_compare_exchange_weak_explicit(&sc->done_job, &cur, job_id, memory_order_release,
                                                  memory_order_relaxed))
        ;
}

static void watch_fn(void *arg, int rc, int64_t version)
{
    (void)version;
    struct wctx *w = arg;
    if (rc == 0)
        mark_done(w->sc, w->job_id);
    schedules_unref(w->sc);
    free(w);
}

/* Not under mu. End a watch we no longer need: if it is still pending,
 * its argument and reference are ours to drop (if it fired meanwhile,
 * schedules_unwatch says so and its callback has dropped them). */
void schedules_unwatch(struct jd_schedules *S, uint64_t wid, struct wctx *ctx)
{
    if (wid && jd_jobs_unwatch(S->jobs, wid)) {
        schedules_unref(ctx->sc);
        free(ctx);
    }
}

/* Not under mu (the watch may call back at once). Only schedules whose
 * overlap policy looks at the previous job watch it ("allow" never asks;
 * a PUT that changes that watches the last job then). */
void schedules_watch_job(struct jd_schedules *S, struct sched *sc, int64_t job_id)
{
    pthread_mutex_lock(&S->mu);
    bool wanted = sc->sp.overlap != OV_ALLOW;
    pthread_mutex_unlock(&S->mu);
    if (!wanted)
        return;
    struct wctx *w = jd_xmalloc(sizeof *w);
    w->sc = sc;
    w->job_id = job_id;
    schedules_ref(sc);
    uint64_t wid = 0;
    int rc = jd_jobs_watch(S->jobs, job_id, 0, true, watch_fn, w, &wid);
    if (rc != 0) {
        if (rc == JD_ENOENT) /* gone (retention): not running */
            mark_done(sc, job_id);
        schedules_unref(sc);
        free(w);
        return;
    }
    pthread_mutex_lock(&S->mu);
    uint64_t old = sc->watch_id;
    struct wctx *old_ctx = sc->watch_ctx;
    if (sc->gone) { /* deleted meanwhile: this watch is not wanted either */
        old = wid;
        old_ctx = w;
        sc->watch_id = 0;
        sc->watch_ctx = NULL;
    } else {
        sc->watch_id = wid;
        sc->watch_ctx = w;
    }
    pthread_mutex_unlock(&S->mu);
    schedules_unwatch(S, old, old_ctx);
}
