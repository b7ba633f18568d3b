/*
 * Changing schedules: a struct op is one decision on its way to the store
 * (its records, and what to do once they commit); PUT, pause/resume,
 * delete and trigger build one, and change_done applies a committed
 * change (of these, or of a skip or catch-up from schedules_fire.c) to the
 * schedule and answers the caller.
 *
 * Threading: the API functions on any thread (HTTP threads), under S->mu
 * while they decide and submit; change_done and trigger_done on the
 * store's completion thread, one commit at a time in commit order.
 */
#include "server/schedules_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "server/jobdef.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct op *schedules_op_new(struct jd_schedules *S, struct sched *sc, enum op_kind kind)
{
    struct op *o = jd_xcalloc(1, sizeof *o);
    o->kind = kind;
    o->S = S;
    o->sc = sc;
    schedules_ref(sc);
    atomic_fetch_add_explicit(&S->ops_live, 1, memory_order_relaxed); /* stop polls it */
    return o;
}

void schedules_op_free(struct op *o)
{
    schedules_spec_clear(&o->sp);
    free(o->data);
    free(o->data2);
    schedules_unref(o->sc);
    /* release: stop() reads 0 only after our last use of S */
    atomic_fetch_sub_explicit(&o->S->ops_live, 1, memory_order_release);
    free(o);
}

/* A schedule-row change with one event. */
struct jd_write *schedules_op_change(struct op *o, const char *event, int64_t fire_ms,
                                     int64_t job_id, const char *data)
{
    struct jd_write *w = &o->w[o->nw++];
    w->op = JD_W_SCHEDULE_CHANGE;
    w->sched.id = o->sc->id;
    w->sched.event = event;
    w->sched.event_fire_ms = fire_ms;
    w->sched.event_job_id = job_id;
    w->sched.event_data = data;
    return w;
}

/* Fill the first record with what a fire or a skip sets: the next fire,
 * and retirement when there is none; a second record says "retired". */
void schedules_op_advance(struct op *o, int64_t next_ms)
{
    o->next_ms = next_ms;
    o->w[0].sched.set |= JD_SSET_NEXT_FIRE;
    o->w[0].sched.next_fire_ms = next_ms;
    /* A cluster: the decision holds only if no node has moved the schedule
     * on since (it commits once however many nodes make it). */
    if (o->S->cl)
        o->w[0].sched.expect_next_fire_ms = o->sc->next_fire_ms;
    if (next_ms == 0) {
        o->retire = true;
        o->w[0].sched.set |= JD_SSET_RETIRED;
        o->w[0].sched.retired = true;
        schedules_op_change(o, "retired", 0, 0, NULL);
    }
}

static void change_done(void *arg, struct jd_write *w, int rc);

/* Under mu: submit o's change records as one group; the last one's done
 * drives. On a refusal (shutting down) the op is dropped. */
int schedules_submit_changes(struct jd_schedules *S, struct op *o)
{
    struct jd_write *ws[2];
    for (size_t i = 0; i < o->nw; i++) {
        ws[i] = &o->w[i];
        o->w[i].done = i + 1 == o->nw ? change_done : NULL;
        o->w[i].arg = o;
    }
    return jd_store_submit_many(S->store, ws, o->nw);
}

/* ------------------------------------------------------ commit results */

static void finish_user(struct op *o, int rc)
{
    if (!o->done)
        return;
    char *json = NULL;
    if (rc == 0 && o->kind != OP_DELETE) {
        struct jd_schedule_row row;
        if (jd_store_schedule_get(o->S->store, o->sc->id, &row) == 0) {
            json = schedules_render(o->S, &row);
            jd_schedule_row_clear(&row);
        }
    }
    o->done(o->arg, rc, o->created, json);
    free(json);
}

/* The change records of a skip, catch-up, PUT, pause or DELETE committed
 * (or not). */
static void change_done(void *arg, struct jd_write *w, int rc)
{
    (void)w;
    struct op *o = arg;
    struct jd_schedules *S = o->S;
    struct sched *sc = o->sc;
    int64_t watch = 0;
    pthread_mutex_lock(&S->mu);
    switch (o->kind) {
    case OP_FIRE:
    case OP_CHANGE:
        schedules_busy_end(S, sc);
        if (rc == 0) {
            sc->next_fire_ms = o->next_ms;
            sc->retired = o->retire;
            if (o->retire)
                atomic_fetch_add_explicit(&S->st_retired, 1, memory_order_relaxed);
            if (o->set_last && o->job_id) {
                sc->last_job_id = o->job_id;
                watch = o->job_id;
            }
            schedules_arm(S, sc, -1);
        } else if (rc != JD_ENOENT && rc != JD_ESHUTDOWN) {
            if (rc == JD_ECONFLICT && S->cl) /* another node moved it on: re-read */
                schedules_cluster_reread(S, sc->id);
            schedules_arm(S, sc, RETRY_MS);
        }
        break;
    case OP_PUT:
        sc->ops--;
        if (rc == 0) {
            schedules_spec_clear(&sc->sp);
            sc->sp = o->sp;
            memset(&o->sp, 0, sizeof o->sp);
            free(sc->sp.def_text);
            sc->sp.def_text = NULL;
            sc->anchor_ms = o->anchor_ms;
            sc->paused = o->paused;
            sc->retired = !o->paused && o->next_ms == 0;
            sc->next_fire_ms = o->next_ms;
            sc->catchup_until = 0;
            sc->loaded = true;
            sc->deleting = false;
            watch = sc->last_job_id; /* the policy may look at it now */
        } else if (!sc->loaded && !sc->ops && !sc->gone) {
            schedules_unlink(S, sc); /* a create that did not happen */
            schedules_unref(sc);     /* the hash's reference; o still holds one */
        }
        schedules_arm(S, sc, -1);
        break;
    case OP_PAUSE:
        sc->ops--;
        if (rc == 0) {
            sc->paused = o->paused;
            sc->next_fire_ms = o->next_ms;
            sc->retired = !o->paused && o->next_ms == 0;
        }
        schedules_arm(S, sc, -1);
        break;
    case OP_DELETE:
        sc->ops--;
        if ((rc == 0 || rc == JD_ENOENT) && sc->deleting && !sc->ops && !sc->gone) {
            schedules_disarm(S, sc);
            schedules_unlink(S, sc);
            schedules_unref(sc); /* the hash's reference */
        }
        break;
    case OP_TRIGGER:
        break;
    }
    uint64_t wid = 0;
    struct wctx *wctx = NULL;
    if (o->kind == OP_DELETE && sc->gone) {
        wid = sc->watch_id;
        wctx = sc->watch_ctx;
        sc->watch_id = 0;
        sc->watch_ctx = NULL;
    }
    pthread_mutex_unlock(&S->mu);
    schedules_unwatch(S, wid, wctx);
    if (watch)
        schedules_watch_job(S, sc, watch);
    finish_user(o, rc == JD_ESHUTDOWN ? JD_ESHUTDOWN : rc);
    schedules_op_free(o);
}

/* -------------------------------------------------------------- API */

int jd_schedules_put(struct jd_schedules *S, const char *id, const char *body, size_t len,
                     jd_schedule_done_fn done, void *arg, struct jd_error *err)
{
    jd_error_clear(err);
    int rc = jd_schedules_check_id(id, err);
    if (rc)
        return rc;
    struct jd_job_limits lim = jd_jobdef_limits(NULL);
    lim.max_definition_bytes = S->max_body;
    lim.max_depth += 1; /* {"job": ...} */
    if ((rc = jd_jobdef_check_text(body, len, &lim, err)) != 0)
        return rc;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root)
        return jd_error_set(err, JD_EPARSE, "", "malformed JSON");
    struct spec sp;
    rc = schedules_spec_parse(S, id, root, true, &sp, err);
    cJSON_Delete(root);
    if (rc) {
        schedules_spec_clear(&sp);
        return rc;
    }
    int64_t now = jd_wall_ms();
    pthread_mutex_lock(&S->mu);
    if (S->stopped) {
        pthread_mutex_unlock(&S->mu);
        schedules_spec_clear(&sp);
        return jd_error_set(err, JD_ESHUTDOWN, NULL, "the server is shutting down");
    }
    struct sched *sc = schedules_find(S, id);
    bool created = !sc || sc->deleting;
    if (!sc) {
        if (S->count >= S->max_schedules) {
            pthread_mutex_unlock(&S->mu);
            schedules_spec_clear(&sp);
            return jd_error_set(err, JD_EFULL, NULL,
                                "there are %u schedules, the most this server keeps "
                                "(--max-schedules)",
                                S->max_schedules);
        }
        sc = jd_xcalloc(1, sizeof *sc);
        sc->id = jd_xstrdup(id);
        atomic_init(&sc->refs, 1); /* the hash's */
        size_t b = schedules_bucket_of(id);
        sc->next = S->tab[b];
        S->tab[b] = sc;
        S->count++;
    }
    struct op *o = schedules_op_new(S, sc, OP_PUT);
    o->sp = sp;
    o->created = created;
    o->paused = sp.paused;
    o->anchor_ms = now;
    o->next_ms = sp.paused ? 0 : schedules_spec_next(&sp, now, now);
    o->done = done;
    o->arg = arg;
    o->nw = 1;
    struct jd_write *w = &o->w[0];
    w->op = JD_W_SCHEDULE_PUT;
    w->sched.id = sc->id;
    w->sched.definition = sp.def_text;
    w->sched.paused = sp.paused;
    w->sched.retired = !sp.paused && o->next_ms == 0; /* end_at already passed */
    w->sched.next_fire_ms = o->next_ms;
    w->sched.anchor_ms = now;
    w->sched.event = created ? "created" : "replaced";
    w->done = change_done;
    w->arg = o;
    schedules_disarm(S, sc);
    rc = jd_store_submit(S->store, w);
    if (rc) {
        if (!sc->loaded && !sc->ops) {
            schedules_unlink(S, sc);
            schedules_unref(sc);
        }
        pthread_mutex_unlock(&S->mu);
        schedules_op_free(o);
        return jd_error_set(err, rc, NULL, "cannot store the schedule: %s", jd_strerror(rc));
    }
    sc->ops++;
    pthread_mutex_unlock(&S->mu);
    return 0;
}

/* Under mu: the live schedule, or JD_ENOENT. */
static int live(struct jd_schedules *S, const char *id, struct sched **out)
{
    if (S->stopped)
        return JD_ESHUTDOWN;
    struct sched *sc = id ? schedules_find(S, id) : NULL;
    if (!sc || !sc->loaded || sc->deleting)
        return JD_ENOENT;
    *out = sc;
    return 0;
}

int jd_schedules_delete(struct jd_schedules *S, const char *id, jd_schedule_done_fn done, void *arg)
{
    pthread_mutex_lock(&S->mu);
    struct sched *sc = NULL;
    int rc = live(S, id, &sc);
    if (rc == 0) {
        struct op *o = schedules_op_new(S, sc, OP_DELETE);
        o->done = done;
        o->arg = arg;
        o->nw = 1;
        o->w[0].op = JD_W_SCHEDULE_DELETE;
        o->w[0].sched.id = sc->id;
        o->w[0].done = change_done;
        o->w[0].arg = o;
        rc = jd_store_submit(S->store, &o->w[0]);
        if (rc) {
            schedules_op_free(o);
        } else {
            sc->deleting = true;
            sc->ops++;
            schedules_disarm(S, sc);
        }
    }
    pthread_mutex_unlock(&S->mu);
    return rc;
}

int jd_schedules_pause(struct jd_schedules *S, const char *id, bool paused,
                       jd_schedule_done_fn done, void *arg)
{
    pthread_mutex_lock(&S->mu);
    struct sched *sc = NULL;
    int rc = live(S, id, &sc);
    if (rc == 0) {
        struct op *o = schedules_op_new(S, sc, OP_PAUSE);
        o->done = done;
        o->arg = arg;
        o->paused = paused;
        /* Resuming fires from now on: what was missed while paused was
         * meant not to run. */
        o->next_ms = paused ? 0 : schedules_spec_next(&sc->sp, sc->anchor_ms, jd_wall_ms());
        struct jd_write *w = schedules_op_change(o, paused ? "paused" : "resumed", 0, 0, NULL);
        w->sched.set = JD_SSET_PAUSED | JD_SSET_NEXT_FIRE | (paused ? 0 : JD_SSET_RETIRED);
        w->sched.paused = paused;
        w->sched.next_fire_ms = o->next_ms;
        w->sched.retired = !paused && o->next_ms == 0;
        rc = schedules_submit_changes(S, o);
        if (rc) {
            schedules_op_free(o);
        } else {
            sc->ops++;
            schedules_disarm(S, sc);
        }
    }
    pthread_mutex_unlock(&S->mu);
    return rc;
}

static void trigger_done(void *arg, const struct jd_submit_result *res)
{
    struct op *o = arg;
    int64_t watch = 0;
    if (res->rc == 0 && !res->existing) {
        pthread_mutex_lock(&o->S->mu);
        if (o->job_id > o->sc->last_job_id)
            o->sc->last_job_id = o->job_id;
        pthread_mutex_unlock(&o->S->mu);
        watch = o->job_id;
    }
    if (watch)
        schedules_watch_job(o->S, o->sc, watch);
    if (o->done)
        o->done(o->arg, res->rc, true, res->rc == 0 ? res->json : NULL);
    schedules_op_free(o);
}

int jd_schedules_trigger(struct jd_schedules *S, const char *id, jd_schedule_done_fn done,
                         void *arg, struct jd_error *err)
{
    jd_error_clear(err);
    pthread_mutex_lock(&S->mu);
    struct sched *sc = NULL;
    int rc = live(S, id, &sc);
    if (rc) {
        pthread_mutex_unlock(&S->mu);
        return jd_error_set(err, rc, NULL, rc == JD_ENOENT ? "no such schedule" : "%s",
                            jd_strerror(rc));
    }
    struct op *o = schedules_op_new(S, sc, OP_TRIGGER);
    o->done = done;
    o->arg = arg;
    int64_t now = jd_wall_ms();
    o->fire_ms = now;
    o->job_id = jd_store_next_id(S->store);
    snprintf(o->key, sizeof o->key, "schedule:%s:trigger:%" PRId64 ":%" PRId64, sc->id, now,
             o->job_id);
    struct jd_write *w = schedules_op_change(o, "triggered", now, o->job_id, NULL);
    w->sched.set = JD_SSET_LAST;
    w->sched.last_fire_ms = now;
    w->sched.last_job_id = o->job_id;
    w->sched.last_outcome = "triggered";
    w->sched.add_fires = 1;
    struct jd_write *extra[1] = {w};
    struct jd_jobs_submit_with with = {.job_id = o->job_id,
                                       .idempotency_key = o->key,
                                       .schedule_id = sc->id,
                                       .extra = extra,
                                       .n_extra = 1};
    rc = jd_jobs_submit_with(S->jobs, sc->sp.job_text, strlen(sc->sp.job_text), &with, trigger_done,
                             o, err);
    pthread_mutex_unlock(&S->mu);
    if (rc) {
        if (err->pointer[0])
            schedules_pointer_under(err, "/job");
        schedules_op_free(o);
        return rc;
    }
    atomic_fetch_add_explicit(&S->st_fires, 1, memory_order_relaxed);
    return 0;
}
