/*
 * Schedules in a cluster (a clustered store): every node keeps every
 * schedule and its timer, but only the leader (jd_store_is_leader) decides
 * a fire; a timer going off elsewhere looks again a second later, so a new
 * leader picks up at once. Every decision's schedule change carries
 * expect_next_fire_ms (schedules_op_advance), so if two nodes believe they
 * lead for a moment the store commits the fire once and refuses the other
 * (JD_ECONFLICT, the fire's job with it); the loser re-reads the schedule.
 * Notices of other nodes' schedule changes (a fire, a PUT, a pause, a
 * delete) are re-read from the store by one thread, which brings the
 * struct sched up to date (unless a decision or an op of this node is in
 * flight: its commit settles it, and a conflict re-reads again).
 *
 * Threading: the hook only queues ids under cl->mu; the thread reads the
 * store without any lock and applies under S->mu. cl->mu is never held
 * with S->mu.
 */
#include "server/schedules_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PENDING_MAX 4096 /* queued ids before "re-read them all" */

struct sched_cluster {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool on, stop, all;
    char **ids;
    size_t n, cap;
};

static void queue_id(struct jd_schedules *S, const char *id)
{
    struct sched_cluster *c = S->cl;
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    if (!id || c->n >= PENDING_MAX) {
        c->all = true;
    } else {
        bool dup = false;
        for (size_t i = 0; i < c->n && !dup; i++)
            dup = strcmp(c->ids[i], id) == 0;
        if (!dup) {
            if (c->n == c->cap) {
                c->cap = c->cap ? c->cap * 2 : 16;
                c->ids = jd_xrealloc(c->ids, c->cap * sizeof *c->ids);
            }
            c->ids[c->n++] = jd_xstrdup(id);
        }
    }
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void jd_schedules_cluster_changed(struct jd_schedules *S, const char *id)
{
    if (S)
        queue_id(S, id);
}

void schedules_cluster_reread(struct jd_schedules *S, const char *id)
{
    queue_id(S, id);
}

bool schedules_cluster_may_fire_locked(struct jd_schedules *S, struct sched *sc)
{
    if (!S->cl || jd_store_is_leader(S->store))
        return true;
    schedules_arm(S, sc, 1000); /* the leader fires it; look again if it goes */
    return false;
}

/* Under mu: bring sc (or a missing schedule) up to the stored row. */
static void apply_locked(struct jd_schedules *S, const char *id, const struct jd_schedule_row *row)
{
    struct sched *sc = schedules_find(S, id);
    if (!row) { /* deleted by some node */
        if (sc && sc->loaded && !sc->ops && !sc->busy && !sc->deleting && !sc->gone) {
            schedules_disarm(S, sc);
            schedules_unlink(S, sc);
            schedules_unref(sc); /* the hash's reference */
        }
        return;
    }
    if (!sc) {
        sc = schedules_load_row(S, row);
        schedules_arm(S, sc, -1);
        return;
    }
    if (!sc->loaded || sc->ops || sc->busy || sc->deleting)
        return; /* this node's own record settles it */
    cJSON *def = cJSON_Parse(row->definition);
    struct spec sp;
    struct jd_error err;
    int rc = def ? schedules_spec_parse(S, row->id, def, false, &sp, &err) : JD_EPARSE;
    cJSON_Delete(def);
    if (rc == 0) {
        free(sp.def_text);
        sp.def_text = NULL;
        schedules_spec_clear(&sc->sp);
        sc->sp = sp;
    } else {
        schedules_spec_clear(&sp);
    }
    sc->anchor_ms = row->anchor_ms;
    sc->paused = row->paused;
    sc->retired = row->retired || rc != 0;
    sc->next_fire_ms = rc ? 0 : row->next_fire_ms;
    if (row->last_job_id > sc->last_job_id)
        sc->last_job_id = row->last_job_id;
    schedules_arm(S, sc, -1);
}

static void reread(struct jd_schedules *S, const char *id)
{
    struct jd_schedule_row row = {0};
    int rc = jd_store_schedule_get(S->store, id, &row);
    if (rc && rc != JD_ENOENT) {
        jd_logf(JD_LOG_WARN, "schedule %s: re-reading it failed: %s", id, jd_strerror(rc));
        return;
    }
    pthread_mutex_lock(&S->mu);
    if (!S->stopped)
        apply_locked(S, id, rc ? NULL : &row);
    pthread_mutex_unlock(&S->mu);
    if (rc == 0)
        jd_schedule_row_clear(&row);
}

/* Every schedule: the ones known here and the ones stored. */
static void reread_all(struct jd_schedules *S)
{
    char **ids = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&S->mu);
    for (size_t b = 0; b < NBUCKETS; b++)
        for (struct sched *sc = S->tab[b]; sc; sc = sc->next) {
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                ids = jd_xrealloc(ids, cap * sizeof *ids);
            }
            ids[n++] = jd_xstrdup(sc->id);
        }
    pthread_mutex_unlock(&S->mu);
    for (size_t i = 0; i < n; i++) {
        reread(S, ids[i]);
        free(ids[i]);
    }
    free(ids);
    char *cursor = NULL;
    for (;;) { /* new ones */
        struct jd_schedule_row *rows;
        size_t nr;
        char *next = NULL;
        int rc = jd_store_schedule_list(S->store, cursor, 1000, &rows, &nr, &next);
        free(cursor);
        cursor = next;
        if (rc)
            break;
        pthread_mutex_lock(&S->mu);
        for (size_t i = 0; i < nr && !S->stopped; i++)
            if (!schedules_find(S, rows[i].id))
                apply_locked(S, rows[i].id, &rows[i]);
        pthread_mutex_unlock(&S->mu);
        jd_schedule_rows_free(rows, nr);
        if (!cursor)
            break;
    }
    free(cursor);
}

static void *cluster_main(void *arg)
{
    struct jd_schedules *S = arg;
    struct sched_cluster *c = S->cl;
    uint64_t next_all = jd_now_ns() + 30000000000u;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        if (!c->all && !c->n) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
            if (jd_now_ns() >= next_all) { /* a lost notice is caught up */
                c->all = true;
                next_all = jd_now_ns() + 30000000000u;
            }
            continue;
        }
        bool all = c->all;
        char **ids = c->ids;
        size_t n = c->n;
        c->all = false;
        c->ids = NULL;
        c->n = c->cap = 0;
        pthread_mutex_unlock(&c->mu);
        if (all)
            reread_all(S);
        for (size_t i = 0; i < n; i++) {
            if (!all)
                reread(S, ids[i]);
            free(ids[i]);
        }
        free(ids);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

void schedules_cluster_start(struct jd_schedules *S)
{
    struct sched_cluster *c = jd_xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    S->cl = c;
    if (pthread_create(&c->thread, NULL, cluster_main, S) == 0)
        c->on = true;
    else
        jd_log(JD_LOG_WARN, "no schedule re-read thread: other nodes' changes arrive late", NULL);
}

void schedules_cluster_stop(struct jd_schedules *S)
{
    struct sched_cluster *c = S->cl;
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->on)
        pthread_join(c->thread, NULL);
    c->on = false;
}

void schedules_cluster_free(struct jd_schedules *S)
{
    struct sched_cluster *c = S->cl;
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->ids[i]);
    free(c->ids);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
    S->cl = NULL;
}
