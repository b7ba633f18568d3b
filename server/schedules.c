/*
 * The schedule engine (server/schedules.h): the table of schedules (a hash
 * by id under S->mu, reference counted entries), create (loading every
 * stored schedule, watching the jobs of their last fires, arming their
 * timers, which catch up what was missed), stop and destroy. The other
 * parts are in schedules_spec.c, schedules_fire.c, schedules_ops.c and
 * schedules_read.c; schedules_impl.h holds what they share, the state
 * machine and the threading rules.
 *
 * Threading: create, stop and destroy on the owner thread (main); the
 * table helpers under S->mu from any thread.
 */
#include "server/schedules_impl.h"

#include "common/alloc.h"
#include "common/log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

void schedules_unref(struct sched *sc)
{
    /* acq_rel: the last owner sees every write of the others before freeing */
    if (atomic_fetch_sub_explicit(&sc->refs, 1, memory_order_acq_rel) != 1)
        return;
    schedules_spec_clear(&sc->sp);
    free(sc->id);
    free(sc);
}

void schedules_ref(struct sched *sc)
{
    atomic_fetch_add_explicit(&sc->refs, 1, memory_order_relaxed); /* a holder already has one */
}

size_t schedules_bucket_of(const char *id)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return (size_t)(h % NBUCKETS);
}

/* Under mu. */
struct sched *schedules_find(struct jd_schedules *S, const char *id)
{
    for (struct sched *sc = S->tab[schedules_bucket_of(id)]; sc; sc = sc->next)
        if (strcmp(sc->id, id) == 0)
            return sc;
    return NULL;
}

/* Under mu: take sc out of the hash (the hash's reference is the caller's
 * to drop). */
void schedules_unlink(struct jd_schedules *S, struct sched *sc)
{
    for (struct sched **pp = &S->tab[schedules_bucket_of(sc->id)]; *pp; pp = &(*pp)->next)
        if (*pp == sc) {
            *pp = sc->next;
            S->count--;
            sc->gone = true;
            return;
        }
}

/* --------------------------------------------------------- lifecycle */

/* Load one stored schedule (under mu, before any timer runs). */
static void load_row(struct jd_schedules *S, const struct jd_schedule_row *row)
{
    schedules_load_row(S, row);
}

struct sched *schedules_load_row(struct jd_schedules *S, const struct jd_schedule_row *row)
{
    cJSON *def = cJSON_Parse(row->definition);
    struct spec sp;
    struct jd_error err;
    int rc = def ? schedules_spec_parse(S, row->id, def, false, &sp, &err) : JD_EPARSE;
    cJSON_Delete(def);
    if (rc) {
        jd_logf(JD_LOG_ERROR,
                "schedule %s: stored definition no longer loads (%s); it will "
                "not fire until replaced",
                row->id, def ? err.message : "malformed JSON");
        schedules_spec_clear(&sp);
        memset(&sp, 0, sizeof sp);
    }
    struct sched *sc = jd_xcalloc(1, sizeof *sc);
    sc->id = jd_xstrdup(row->id);
    free(sp.def_text); /* the row has it */
    sp.def_text = NULL;
    sc->sp = sp;
    sc->anchor_ms = row->anchor_ms;
    sc->paused = row->paused;
    sc->retired = row->retired || rc != 0;
    sc->next_fire_ms = rc ? 0 : row->next_fire_ms;
    sc->last_job_id = row->last_job_id;
    sc->loaded = true;
    atomic_init(&sc->refs, 1);
    size_t b = schedules_bucket_of(sc->id);
    sc->next = S->tab[b];
    S->tab[b] = sc;
    S->count++;
    return sc;
}

int jd_schedules_create(const struct jd_schedules_config *cfg, struct jd_schedules **out,
                        struct jd_error *err)
{
    struct jd_schedules *S = jd_xcalloc(1, sizeof *S);
    S->store = cfg->store;
    S->jobs = cfg->jobs;
    S->max_schedules = cfg->max_schedules ? cfg->max_schedules : DEFAULT_MAX_SCHEDULES;
    S->max_body = cfg->max_body_bytes ? cfg->max_body_bytes : DEFAULT_MAX_BODY;
    S->grace_ms = cfg->grace_ms > 0 ? cfg->grace_ms : DEFAULT_GRACE_MS;
    if (cfg->timers)
        S->timers = *cfg->timers;
    else
        S->timers = (struct jd_schedules_timers){schedules_timer_after, schedules_timer_cancel,
                                                 jd_jobs_sched(cfg->jobs)};
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->cv, NULL);

    char *cursor = NULL;
    int rc = 0;
    pthread_mutex_lock(&S->mu);
    for (;;) {
        struct jd_schedule_row *rows;
        size_t n;
        char *next;
        rc = jd_store_schedule_list(S->store, cursor, 1000, &rows, &n, &next);
        free(cursor);
        cursor = next;
        if (rc)
            break;
        for (size_t i = 0; i < n; i++)
            load_row(S, &rows[i]);
        jd_schedule_rows_free(rows, n);
        if (!cursor)
            break;
    }
    free(cursor);
    if (rc) {
        pthread_mutex_unlock(&S->mu);
        jd_schedules_destroy(S);
        return jd_error_set(err, rc, NULL, "loading schedules failed: %s", jd_strerror(rc));
    }
    /* Watches first (outside mu), so overlap knows about jobs still running
     * from before the restart; then the timers, which decide what was
     * missed by each schedule's catch-up policy. */
    size_t nload = S->count;
    struct sched **all = jd_xcalloc(nload ? nload : 1, sizeof *all);
    size_t k = 0;
    for (size_t b = 0; b < NBUCKETS; b++)
        for (struct sched *sc = S->tab[b]; sc; sc = sc->next) {
            schedules_ref(sc);
            all[k++] = sc;
        }
    pthread_mutex_unlock(&S->mu);
    for (size_t i = 0; i < k; i++)
        if (all[i]->last_job_id)
            schedules_watch_job(S, all[i], all[i]->last_job_id);
    pthread_mutex_lock(&S->mu);
    for (size_t i = 0; i < k; i++)
        schedules_arm(S, all[i], -1);
    pthread_mutex_unlock(&S->mu);
    for (size_t i = 0; i < k; i++)
        schedules_unref(all[i]);
    free(all);
    if (jd_store_clustered(S->store))
        schedules_cluster_start(S);
    *out = S;
    return 0;
}

void jd_schedules_stop(struct jd_schedules *S)
{
    schedules_cluster_stop(S); /* no more re-reads */
    pthread_mutex_lock(&S->mu);
    S->stopped = true;
    for (size_t b = 0; b < NBUCKETS; b++)
        for (struct sched *sc = S->tab[b]; sc; sc = sc->next)
            schedules_disarm(S, sc);
    while (S->tarms > 0) /* timers already running when they were cancelled */
        pthread_cond_wait(&S->cv, &S->mu);
    pthread_mutex_unlock(&S->mu);
    /* Records in flight call back into S when they commit: wait for every
     * one (commits finish on their own; nothing new starts once stopped).
     * acquire: pairs with the release in schedules_op_free. */
    while (atomic_load_explicit(&S->ops_live, memory_order_acquire) > 0) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

void jd_schedules_destroy(struct jd_schedules *S)
{
    if (!S)
        return;
    jd_schedules_stop(S);
    for (size_t b = 0; b < NBUCKETS; b++) {
        struct sched *sc = S->tab[b];
        while (sc) {
            struct sched *nx = sc->next;
            schedules_unwatch(S, sc->watch_id, sc->watch_ctx);
            schedules_unref(sc); /* the hash's */
            sc = nx;
        }
        S->tab[b] = NULL;
    }
    schedules_cluster_free(S);
    pthread_cond_destroy(&S->cv);
    pthread_mutex_destroy(&S->mu);
    free(S);
}
