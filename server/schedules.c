/*
 * The schedule engine (server/schedules.h).
 *
 * State: every schedule has a struct sched in a hash under S->mu. Its
 * durable truth is the schedules row; the struct mirrors what has
 * committed, plus what is in flight:
 *   - busy: a fire (or a skip, a catch-up decision) is being committed. At
 *     most one per schedule; its commit callback arms the next timer.
 *   - ops: PUT, pause/resume and DELETE records being committed. While any
 *     is in flight no fire is decided; the last one to commit arms.
 * Every record about one schedule is submitted under S->mu, so the store
 * commits them in the order they were decided, and their callbacks (one
 * completion thread, commit order) apply them to the struct in that order.
 *
 * Timers: one pending timer per live schedule, armed for its next fire
 * time (plus a jitter fixed by id and fire time). A timer carries the
 * sequence number it was armed with; a later arm, pause or delete bumps
 * the number, so a timer that was already running when it was cancelled
 * finds itself stale and does nothing.
 *
 * Overlap: the job of the last fire is watched (jd_jobs_watch, terminal
 * only); the watch stores the id of the newest job known finished in an
 * atomic, so the fire decision reads it without locks.
 *
 * Threading: API calls on any thread; timer callbacks on the scheduler's
 * timer thread; commit callbacks on the store's completion thread; watch
 * callbacks wherever the job layer runs them. Lock order: S->mu, then the
 * job layer's and the store's own locks (jd_jobs_watch, which may call back
 * at once, is never called under S->mu).
 */
#include "server/schedules.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/cron.h"
#include "common/log.h"
#include "common/tz.h"
#include "scheduler/sched.h"
#include "server/jobdef.h"
#include "server/jobs.h"
#include "server/jobs_impl.h"
#include "storage/store.h"

#include <cJSON.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_MAX_SCHEDULES 10000
#define DEFAULT_MAX_BODY (64 * 1024) /* a definition, not a data set */
#define DEFAULT_GRACE_MS 5000        /* late by less than this: a fire, not a missed one */
#define RETRY_MS 1000                /* after a failed commit (full disk), try again */
#define MAX_JITTER_MS 3600000        /* an hour */
#define MAX_LABELS 32
#define COUNT_LIMIT 100000   /* missed fires counted one by one at most (cron) */
#define RESEED_S (7 * 86400) /* then counting restarts this long before now */
#define NBUCKETS 4096

static const int64_t lag_bounds_ms[JD_SCHED_LAG_BUCKETS - 1] = JD_SCHED_LAG_BOUNDS_MS;

enum overlap { OV_SKIP, OV_ALLOW, OV_CANCEL };
enum catchup { CU_NONE, CU_LATEST, CU_ALL };
static const char *const overlap_names[] = {"skip", "allow", "cancel_previous", NULL};
static const char *const catchup_names[] = {"none", "latest", "all", NULL};

/* A parsed definition. */
struct spec {
    bool is_cron;
    struct jd_cron cron;
    const struct jd_tz *tz;
    int64_t every_ms;
    enum overlap overlap;
    enum catchup catchup;
    int64_t start_at, end_at, jitter_ms; /* 0: none */
    bool paused;                         /* as the body said (PUT only) */
    char *def_text; /* what is stored: the body, normalised (freed once stored: reads
                       render the row, so memory holds only what fires need) */
    char *job_text; /* the job to submit, labels merged */
};

struct sched {
    char *id;
    struct spec sp;
    int64_t anchor_ms;
    bool paused, retired, loaded; /* loaded: its definition has committed */
    bool deleting, gone;
    int64_t next_fire_ms;  /* committed next fire; 0: none */
    int64_t last_job_id;   /* the newest job a fire made */
    int64_t catchup_until; /* catchup "all": fires up to here are caught up one by one */
    bool busy;
    unsigned ops;
    uint64_t timer_id, timer_seq;
    bool timer_armed;
    struct tarm *tarm;        /* the armed timer's argument */
    uint64_t watch_id;        /* the newest watch on one of our jobs, or 0 */
    struct wctx *watch_ctx;   /* its argument (freed by whoever ends the watch) */
    _Atomic int64_t done_job; /* newest job of ours known finished */
    atomic_int refs;
    struct sched *next; /* hash chain */
};

struct jd_schedules {
    struct jd_store *store;
    struct jd_jobs *jobs;
    unsigned max_schedules;
    size_t max_body;
    int64_t grace_ms;
    struct jd_schedules_timers timers;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when busy_total drops */
    struct sched *tab[NBUCKETS];
    size_t count; /* live schedules, including ones being created */
    unsigned busy_total;
    unsigned tarms; /* timers armed or running */
    bool stopped;
    atomic_uint ops_live; /* struct op allocated (stop waits for them to finish) */

    /* statistics (relaxed: independent counters) */
    atomic_uint_least64_t st_fires, st_skips, st_caught_up, st_retired, st_lag_sum;
    atomic_uint_least64_t st_lag[JD_SCHED_LAG_BUCKETS];
};

/* ------------------------------------------------------------ helpers */

static void spec_clear(struct spec *sp)
{
    free(sp->def_text);
    free(sp->job_text);
    memset(sp, 0, sizeof *sp);
}

static void sched_unref(struct sched *sc)
{
    /* acq_rel: the last owner sees every write of the others before freeing */
    if (atomic_fetch_sub_explicit(&sc->refs, 1, memory_order_acq_rel) != 1)
        return;
    spec_clear(&sc->sp);
    free(sc->id);
    free(sc);
}

static void sched_ref(struct sched *sc)
{
    atomic_fetch_add_explicit(&sc->refs, 1, memory_order_relaxed); /* a holder already has one */
}

static size_t bucket_of(const char *id)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return (size_t)(h % NBUCKETS);
}

/* Under mu. */
static struct sched *find(struct jd_schedules *S, const char *id)
{
    for (struct sched *sc = S->tab[bucket_of(id)]; sc; sc = sc->next)
        if (strcmp(sc->id, id) == 0)
            return sc;
    return NULL;
}

/* Under mu: take sc out of the hash (the hash's reference is the caller's
 * to drop). */
static void unlink_sched(struct jd_schedules *S, struct sched *sc)
{
    for (struct sched **pp = &S->tab[bucket_of(sc->id)]; *pp; pp = &(*pp)->next)
        if (*pp == sc) {
            *pp = sc->next;
            S->count--;
            sc->gone = true;
            return;
        }
}

int jd_schedules_check_id(const char *id, struct jd_error *err)
{
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n > JD_SCHEDULE_ID_MAX)
        return jd_error_set(err, JD_EINVAL, NULL, "a schedule id is 1 to %d characters",
                            JD_SCHEDULE_ID_MAX);
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return jd_error_set(err, JD_EINVAL, NULL,
                                "a schedule id may use letters, digits, '-', '_' and '.'");
    }
    if (strcmp(id, ".") == 0 || strcmp(id, "..") == 0)
        return jd_error_set(err, JD_EINVAL, NULL, "\"%s\" is not a schedule id", id);
    return 0;
}

/* The first fire strictly after `after` (0: none, e.g. past end_at). */
static int64_t spec_next(const struct spec *sp, int64_t anchor_ms, int64_t after)
{
    if (sp->start_at && after < sp->start_at - 1)
        after = sp->start_at - 1;
    int64_t t;
    if (sp->is_cron)
        t = jd_cron_next(&sp->cron, sp->tz, after);
    else
        t = jd_every_next(sp->start_at ? sp->start_at : anchor_ms, sp->every_ms, after);
    if (t <= 0 || (sp->end_at && t > sp->end_at))
        return 0;
    return t;
}

/* A delay in [0, jitter_ms] fixed by the schedule and the fire time, so a
 * re-armed timer (restart, resume) keeps the same moment. */
static int64_t jitter_for(const struct sched *sc, int64_t fire_ms)
{
    if (sc->sp.jitter_ms <= 0)
        return 0;
    uint64_t h = 1469598103934665603ull ^ (uint64_t)fire_ms;
    for (const unsigned char *p = (const unsigned char *)sc->id; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    h ^= h >> 29;
    return (int64_t)(h % (uint64_t)(sc->sp.jitter_ms + 1));
}

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

/* ----------------------------------------------------------- parsing */

static int enum_of(const cJSON *v, const char *const *names, const char *ptr, int *out,
                   struct jd_error *err)
{
    if (cJSON_IsString(v))
        for (int i = 0; names[i]; i++)
            if (strcmp(v->valuestring, names[i]) == 0) {
                *out = i;
                return 0;
            }
    char list[96] = "";
    for (int i = 0; names[i]; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", i ? ", " : "",
                 names[i]);
    return jd_error_set(err, JD_EINVAL, ptr, "must be one of %s", list);
}

static int time_of(const cJSON *v, const char *ptr, int64_t *out, struct jd_error *err)
{
    if (!cJSON_IsString(v) || jd_time_parse(v->valuestring, out) != 0)
        return jd_error_set(err, JD_EINVAL, ptr,
                            "must be an RFC 3339 time such as \"2026-01-01T00:00:00Z\"");
    return 0;
}

/* Move err's pointer under prefix ("/handler" -> "/job/handler"). */
static void pointer_under(struct jd_error *err, const char *prefix)
{
    size_t p = strlen(prefix), n = strnlen(err->pointer, sizeof err->pointer);
    if (p + n >= sizeof err->pointer)
        n = sizeof err->pointer - p - 1;
    memmove(err->pointer + p, err->pointer, n);
    memcpy(err->pointer, prefix, p);
    err->pointer[p + n] = '\0';
}

/* The job with the schedule's labels merged in: its own labels, then the
 * schedule's, then {"schedule": id}. Takes nothing; returns a new tree. */
static cJSON *merged_job(const cJSON *job, const cJSON *labels, const char *id)
{
    cJSON *out = cJSON_Duplicate(job, 1);
    cJSON *l = cJSON_GetObjectItemCaseSensitive(out, "labels");
    if (!l) {
        l = cJSON_CreateObject();
        cJSON_AddItemToObject(out, "labels", l);
    }
    if (cJSON_IsObject(l)) {
        for (const cJSON *c = labels ? labels->child : NULL; c; c = c->next) {
            cJSON_DeleteItemFromObjectCaseSensitive(l, c->string);
            cJSON_AddItemToObject(l, c->string, cJSON_Duplicate(c, 1));
        }
        cJSON_DeleteItemFromObjectCaseSensitive(l, "schedule");
        cJSON_AddStringToObject(l, "schedule", id);
    }
    return out;
}

/*
 * Parse a definition (borrowed root). validate_job: check the job with the
 * job layer now (PUT); off when loading what was stored (a fire checks it
 * again and records what is wrong). root is normalised in place (defaults
 * filled, "paused" removed) before def_text is printed.
 */
static int spec_parse(struct jd_schedules *S, const char *id, cJSON *root, bool validate_job,
                      struct spec *sp, struct jd_error *err)
{
    static const char *const known[] = {"cron",    "every",     "timezone", "job",
                                        "overlap", "catchup",   "start_at", "end_at",
                                        "paused",  "jitter_ms", "labels",   NULL};
    memset(sp, 0, sizeof *sp);
    if (!cJSON_IsObject(root))
        return jd_error_set(err, JD_EINVAL, "", "a schedule is a JSON object");
    char ptr[JD_ERROR_PTR_MAX];
    for (const cJSON *c = root->child; c; c = c->next) {
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++)
            ok = strcmp(c->string, known[i]) == 0;
        if (!ok) {
            ptr[0] = '\0';
            jd_ptr_append(ptr, sizeof ptr, c->string);
            return jd_error_set(err, JD_EINVAL, ptr, "unknown field \"%.64s\"", c->string);
        }
    }
    const cJSON *cron = cJSON_GetObjectItemCaseSensitive(root, "cron");
    const cJSON *every = cJSON_GetObjectItemCaseSensitive(root, "every");
    const cJSON *v;
    int rc;
    if (!cron && !every)
        return jd_error_set(err, JD_EINVAL, "",
                            "a schedule needs \"cron\" (e.g. \"0 3 * * *\") or \"every\" "
                            "(e.g. \"30s\")");
    if (cron && every)
        return jd_error_set(err, JD_EINVAL, "/every", "give \"cron\" or \"every\", not both");
    if (cron) {
        if (!cJSON_IsString(cron))
            return jd_error_set(err, JD_EINVAL, "/cron", "must be a string");
        sp->is_cron = true;
        if ((rc = jd_cron_parse(cron->valuestring, &sp->cron, err)) != 0) {
            snprintf(err->pointer, sizeof err->pointer, "/cron");
            return rc;
        }
        v = cJSON_GetObjectItemCaseSensitive(root, "timezone");
        if (v && !cJSON_IsString(v))
            return jd_error_set(err, JD_EINVAL, "/timezone", "must be a string");
        if ((rc = jd_tz_get(v ? v->valuestring : "UTC", &sp->tz, err)) != 0) {
            snprintf(err->pointer, sizeof err->pointer, "/timezone");
            return rc;
        }
        if (!v)
            cJSON_AddStringToObject(root, "timezone", "UTC");
    } else {
        if (!cJSON_IsString(every))
            return jd_error_set(err, JD_EINVAL, "/every", "must be a string such as \"30s\"");
        if ((rc = jd_every_parse(every->valuestring, &sp->every_ms, err)) != 0) {
            snprintf(err->pointer, sizeof err->pointer, "/every");
            return rc;
        }
        if (cJSON_GetObjectItemCaseSensitive(root, "timezone"))
            return jd_error_set(err, JD_EINVAL, "/timezone",
                                "a time zone applies to \"cron\" schedules only");
    }
    int e = 0;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "overlap")) &&
        (rc = enum_of(v, overlap_names, "/overlap", &e, err)) != 0)
        return rc;
    sp->overlap = (enum overlap)e;
    e = CU_LATEST;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "catchup")) &&
        (rc = enum_of(v, catchup_names, "/catchup", &e, err)) != 0)
        return rc;
    sp->catchup = (enum catchup)e;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "start_at")) &&
        (rc = time_of(v, "/start_at", &sp->start_at, err)) != 0)
        return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "end_at")) &&
        (rc = time_of(v, "/end_at", &sp->end_at, err)) != 0)
        return rc;
    if (sp->start_at && sp->end_at && sp->end_at <= sp->start_at)
        return jd_error_set(err, JD_EINVAL, "/end_at", "must be after start_at");
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "paused"))) {
        if (!cJSON_IsBool(v))
            return jd_error_set(err, JD_EINVAL, "/paused", "must be true or false");
        sp->paused = cJSON_IsTrue(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "jitter_ms"))) {
        double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (d < 0 || d > MAX_JITTER_MS || d != (double)(int64_t)d)
            return jd_error_set(err, JD_EINVAL, "/jitter_ms",
                                "must be a whole number of milliseconds from 0 to %d",
                                MAX_JITTER_MS);
        sp->jitter_ms = (int64_t)d;
        if (!sp->is_cron && sp->jitter_ms >= sp->every_ms)
            return jd_error_set(err, JD_EINVAL, "/jitter_ms",
                                "must be shorter than the interval (%" PRId64 " ms)", sp->every_ms);
    }
    const cJSON *labels = cJSON_GetObjectItemCaseSensitive(root, "labels");
    if (labels) {
        if (!cJSON_IsObject(labels))
            return jd_error_set(err, JD_EINVAL, "/labels", "must be an object of strings");
        int n = 0;
        for (const cJSON *c = labels->child; c; c = c->next, n++) {
            snprintf(ptr, sizeof ptr, "/labels");
            jd_ptr_append(ptr, sizeof ptr, c->string);
            if (!cJSON_IsString(c))
                return jd_error_set(err, JD_EINVAL, ptr, "a label value must be a string");
            if (strcmp(c->string, "schedule") == 0)
                return jd_error_set(err, JD_EINVAL, ptr,
                                    "the \"schedule\" label is set by Jackdaw to the schedule id");
            if (n >= MAX_LABELS)
                return jd_error_set(err, JD_EINVAL, ptr, "more than %d labels", MAX_LABELS);
        }
    }
    const cJSON *job = cJSON_GetObjectItemCaseSensitive(root, "job");
    if (!job)
        return jd_error_set(err, JD_EINVAL, "/job", "a schedule needs a job definition");
    if (!cJSON_IsObject(job))
        return jd_error_set(err, JD_EINVAL, "/job", "must be a job definition (an object)");
    if (cJSON_GetObjectItemCaseSensitive(job, "run_at"))
        return jd_error_set(err, JD_EINVAL, "/job/run_at",
                            "a scheduled job runs at its fire time (use delay_ms to run later)");
    if (cJSON_GetObjectItemCaseSensitive(job, "unique"))
        return jd_error_set(err, JD_EINVAL, "/job/unique",
                            "a scheduled job cannot be unique (use \"overlap\" instead)");
    cJSON *mj = merged_job(job, labels, id);
    sp->job_text = cJSON_PrintUnformatted(mj);
    cJSON_Delete(mj);
    if (validate_job &&
        (rc = jd_jobs_validate(S->jobs, sp->job_text, strlen(sp->job_text), err)) != 0) {
        pointer_under(err, "/job");
        if (rc == JD_EPARSE || rc == JD_ETOOBIG)
            rc = err->code = JD_EINVAL;
        spec_clear(sp);
        return rc;
    }
    if (!cJSON_GetObjectItemCaseSensitive(root, "overlap"))
        cJSON_AddStringToObject(root, "overlap", overlap_names[sp->overlap]);
    if (!cJSON_GetObjectItemCaseSensitive(root, "catchup"))
        cJSON_AddStringToObject(root, "catchup", catchup_names[sp->catchup]);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "paused"); /* state, kept in the row */
    sp->def_text = cJSON_PrintUnformatted(root);
    return 0;
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
    sched_unref(t->sc);
    free(t);
}

static int sched_timer_after(void *ctx, int64_t delay_ms, void (*fn)(void *), void *arg,
                             uint64_t *id)
{
    return jd_sched_timer_after(ctx, (uint64_t)delay_ms * 1000000u, fn, arg, id);
}

static int sched_timer_cancel(void *ctx, uint64_t id)
{
    return jd_sched_timer_cancel(ctx, id);
}

/* Under mu: withdraw the pending timer (if it is already running, its
 * stale sequence number stops it). */
static void disarm(struct jd_schedules *S, struct sched *sc)
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

/* Under mu: arm the timer for the committed next fire, if the schedule is
 * live and nothing is in flight. delay_ms < 0: at its fire time. */
static void arm(struct jd_schedules *S, struct sched *sc, int64_t delay_ms)
{
    disarm(S, sc);
    if (S->stopped || sc->gone || sc->deleting || !sc->loaded || sc->paused || sc->retired ||
        sc->busy || sc->ops || !sc->next_fire_ms)
        return;
    if (delay_ms < 0) {
        delay_ms = sc->next_fire_ms + jitter_for(sc, sc->next_fire_ms) - jd_wall_ms();
        if (delay_ms < 0)
            delay_ms = 0;
    }
    struct tarm *t = jd_xmalloc(sizeof *t);
    t->S = S;
    t->sc = sc;
    t->seq = sc->timer_seq;
    sched_ref(sc);
    S->tarms++;
    if (S->timers.after(S->timers.ctx, delay_ms, timer_fn, t, &sc->timer_id) != 0) {
        tarm_end(S, t);
        return;
    }
    sc->tarm = t;
    sc->timer_armed = true;
}

/* ------------------------------------------------------------- writes */

enum op_kind { OP_FIRE, OP_CHANGE, OP_PUT, OP_DELETE, OP_PAUSE, OP_TRIGGER };

/* One decision on its way to the store. */
struct op {
    enum op_kind kind;
    struct jd_schedules *S;
    struct sched *sc; /* referenced */
    struct jd_write w[2];
    size_t nw;
    int64_t fire_ms, next_ms, job_id;
    bool retire, set_last, created;
    char key[JD_SCHEDULE_ID_MAX + 64];
    char *data, *data2;
    struct spec sp; /* OP_PUT: the new definition */
    int64_t anchor_ms;
    bool paused; /* OP_PUT, OP_PAUSE */
    jd_schedule_done_fn done;
    void *arg;
};

static struct op *op_new(struct jd_schedules *S, struct sched *sc, enum op_kind kind)
{
    struct op *o = jd_xcalloc(1, sizeof *o);
    o->kind = kind;
    o->S = S;
    o->sc = sc;
    sched_ref(sc);
    atomic_fetch_add_explicit(&S->ops_live, 1, memory_order_relaxed); /* stop polls it */
    return o;
}

static void op_free(struct op *o)
{
    spec_clear(&o->sp);
    free(o->data);
    free(o->data2);
    sched_unref(o->sc);
    /* release: stop() reads 0 only after our last use of S */
    atomic_fetch_sub_explicit(&o->S->ops_live, 1, memory_order_release);
    free(o);
}

/* A schedule-row change with one event. */
static struct jd_write *op_change(struct op *o, const char *event, int64_t fire_ms, int64_t job_id,
                                  const char *data)
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
static void op_advance(struct op *o, int64_t next_ms)
{
    o->next_ms = next_ms;
    o->w[0].sched.set |= JD_SSET_NEXT_FIRE;
    o->w[0].sched.next_fire_ms = next_ms;
    if (next_ms == 0) {
        o->retire = true;
        o->w[0].sched.set |= JD_SSET_RETIRED;
        o->w[0].sched.retired = true;
        op_change(o, "retired", 0, 0, NULL);
    }
}

static void watch_job(struct jd_schedules *S, struct sched *sc, int64_t job_id);

static void change_done(void *arg, struct jd_write *w, int rc);
static void fire_done(void *arg, const struct jd_submit_result *res);

/* Under mu: submit o's change records as one group; the last one's done
 * drives. On a refusal (shutting down) the op is dropped. */
static int submit_changes(struct jd_schedules *S, struct op *o)
{
    struct jd_write *ws[2];
    for (size_t i = 0; i < o->nw; i++) {
        ws[i] = &o->w[i];
        o->w[i].done = i + 1 == o->nw ? change_done : NULL;
        o->w[i].arg = o;
    }
    return jd_store_submit_many(S->store, ws, o->nw);
}

/* Under mu: record fire time fire_ms as skipped (data: why; taken), the
 * schedule's last job still job_ref, and move on to next_ms. */
static void record_skip(struct jd_schedules *S, struct sched *sc, int64_t fire_ms, int64_t next_ms,
                        int64_t job_ref, cJSON *data)
{
    struct op *o = op_new(S, sc, OP_CHANGE);
    o->fire_ms = fire_ms;
    o->data = cJSON_PrintUnformatted(data);
    cJSON_Delete(data);
    struct jd_write *w = op_change(o, "skipped", fire_ms, job_ref, o->data);
    w->sched.set = JD_SSET_LAST;
    w->sched.last_fire_ms = fire_ms;
    w->sched.last_job_id = job_ref;
    w->sched.last_outcome = "skipped";
    w->sched.add_skips = 1;
    op_advance(o, next_ms);
    atomic_fetch_add_explicit(&S->st_skips, 1, memory_order_relaxed);
    if (submit_changes(S, o) != 0) {
        op_free(o);
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
    struct op *o = op_new(S, sc, OP_FIRE);
    o->fire_ms = fire_ms;
    if (unfinished && sc->sp.overlap == OV_SKIP) {
        op_free(o);
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
    struct jd_write *w = op_change(o, event, fire_ms, o->job_id, o->data);
    w->sched.set = JD_SSET_LAST;
    w->sched.last_fire_ms = fire_ms;
    w->sched.last_job_id = o->job_id;
    w->sched.last_outcome = event;
    w->sched.add_fires = 1;
    op_advance(o, next_ms);
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
        op_free(o);
        return;
    }
    if (rc != 0) {
        /* The job no longer validates (a plugin went away since the PUT):
         * the fire is recorded as skipped, with the reason. */
        op_free(o);
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
    struct op *o = op_new(S, sc, OP_CHANGE);
    o->data = cJSON_PrintUnformatted(data);
    cJSON_Delete(data);
    struct jd_write *w = op_change(o, "caught_up", 0, 0, o->data);
    w->sched.add_skips = skipped;
    op_advance(o, next_ms);
    atomic_fetch_add_explicit(&S->st_caught_up, 1, memory_order_relaxed);
    if (submit_changes(S, o) != 0) {
        op_free(o);
        return;
    }
    sc->busy = true;
    S->busy_total++;
}

static void busy_end(struct jd_schedules *S, struct sched *sc)
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
        struct op *c = op_new(S, sc, OP_CHANGE);
        c->data = jd_xstrdup("{\"existing\":true}");
        struct jd_write *w = op_change(c, "fired", o->fire_ms, res->job_id, c->data);
        w->sched.set = JD_SSET_LAST;
        w->sched.last_fire_ms = o->fire_ms;
        w->sched.last_job_id = res->job_id;
        w->sched.last_outcome = "fired";
        op_advance(c, o->next_ms);
        c->job_id = res->job_id;
        c->set_last = true;
        if (submit_changes(S, c) != 0) {
            op_free(c);
            busy_end(S, sc);
        }
    } else if (res->rc == 0) {
        sc->next_fire_ms = o->next_ms;
        sc->retired = o->retire;
        sc->last_job_id = o->job_id;
        watch = o->job_id;
        if (o->retire)
            atomic_fetch_add_explicit(&S->st_retired, 1, memory_order_relaxed);
        busy_end(S, sc);
        arm(S, sc, -1);
    } else {
        busy_end(S, sc);
        if (res->rc != JD_ENOENT && res->rc != JD_ESHUTDOWN) {
            jd_logf(JD_LOG_WARN,
                    "schedule %s: the fire at %" PRId64 " was not stored (%s); "
                    "trying again",
                    sc->id, o->fire_ms, jd_strerror(res->rc));
            arm(S, sc, RETRY_MS);
        }
    }
    pthread_mutex_unlock(&S->mu);
    if (watch)
        watch_job(S, sc, watch);
    op_free(o);
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
            t = spec_next(sp, sc->anchor_ms, until - (int64_t)RESEED_S * 1000);
            continue;
        }
        t = spec_next(sp, sc->anchor_ms, t);
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
        arm(S, sc, -1);
        return;
    }
    if (sc->catchup_until >= f) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "policy", "all");
        fire(S, sc, f, spec_next(&sc->sp, sc->anchor_ms, f), "caught_up", d);
        return;
    }
    if (now - f <= S->grace_ms) {
        note_lag(S, now - (f + jitter_for(sc, f)));
        fire(S, sc, f, spec_next(&sc->sp, sc->anchor_ms, f), "fired", NULL);
        return;
    }
    /* Missed: every fire time more than the grace period ago. */
    int64_t n, last, first_kept;
    bool more;
    count_due(sc, f, now - S->grace_ms, JD_SCHEDULE_CATCHUP_CAP, &n, &last, &first_kept, &more);
    int64_t after = spec_next(&sc->sp, sc->anchor_ms, last);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "policy", catchup_names[sc->sp.catchup]);
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
        fire(S, sc, f, spec_next(&sc->sp, sc->anchor_ms, f), "caught_up", d);
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
            !sc->ops)
            decide(S, sc, jd_wall_ms());
    }
    tarm_end(S, t);
    pthread_mutex_unlock(&S->mu);
}

/* ------------------------------------------------------------ watches */

struct wctx {
    struct sched *sc; /* referenced */
    int64_t job_id;
};

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
    sched_unref(w->sc);
    free(w);
}

/* Not under mu. End a watch we no longer need: if it is still pending,
 * its argument and reference are ours to drop (if it fired meanwhile,
 * unwatch says so and its callback has dropped them). */
static void unwatch(struct jd_schedules *S, uint64_t wid, struct wctx *ctx)
{
    if (wid && jd_jobs_unwatch(S->jobs, wid)) {
        sched_unref(ctx->sc);
        free(ctx);
    }
}

/* Not under mu (the watch may call back at once). Only schedules whose
 * overlap policy looks at the previous job watch it ("allow" never asks;
 * a PUT that changes that watches the last job then). */
static void watch_job(struct jd_schedules *S, struct sched *sc, int64_t job_id)
{
    pthread_mutex_lock(&S->mu);
    bool wanted = sc->sp.overlap != OV_ALLOW;
    pthread_mutex_unlock(&S->mu);
    if (!wanted)
        return;
    struct wctx *w = jd_xmalloc(sizeof *w);
    w->sc = sc;
    w->job_id = job_id;
    sched_ref(sc);
    uint64_t wid = 0;
    int rc = jd_jobs_watch(S->jobs, job_id, 0, true, watch_fn, w, &wid);
    if (rc != 0) {
        if (rc == JD_ENOENT) /* gone (retention): not running */
            mark_done(sc, job_id);
        sched_unref(sc);
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
    unwatch(S, old, old_ctx);
}

/* ------------------------------------------------------ commit results */

static char *render_schedule(struct jd_schedules *S, const struct jd_schedule_row *row);

static void finish_user(struct op *o, int rc)
{
    if (!o->done)
        return;
    char *json = NULL;
    if (rc == 0 && o->kind != OP_DELETE) {
        struct jd_schedule_row row;
        if (jd_store_schedule_get(o->S->store, o->sc->id, &row) == 0) {
            json = render_schedule(o->S, &row);
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
        busy_end(S, sc);
        if (rc == 0) {
            sc->next_fire_ms = o->next_ms;
            sc->retired = o->retire;
            if (o->retire)
                atomic_fetch_add_explicit(&S->st_retired, 1, memory_order_relaxed);
            if (o->set_last && o->job_id) {
                sc->last_job_id = o->job_id;
                watch = o->job_id;
            }
            arm(S, sc, -1);
        } else if (rc != JD_ENOENT && rc != JD_ESHUTDOWN) {
            arm(S, sc, RETRY_MS);
        }
        break;
    case OP_PUT:
        sc->ops--;
        if (rc == 0) {
            spec_clear(&sc->sp);
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
            unlink_sched(S, sc); /* a create that did not happen */
            sched_unref(sc);     /* the hash's reference; o still holds one */
        }
        arm(S, sc, -1);
        break;
    case OP_PAUSE:
        sc->ops--;
        if (rc == 0) {
            sc->paused = o->paused;
            sc->next_fire_ms = o->next_ms;
            sc->retired = !o->paused && o->next_ms == 0;
        }
        arm(S, sc, -1);
        break;
    case OP_DELETE:
        sc->ops--;
        if ((rc == 0 || rc == JD_ENOENT) && sc->deleting && !sc->ops && !sc->gone) {
            disarm(S, sc);
            unlink_sched(S, sc);
            sched_unref(sc); /* the hash's reference */
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
    unwatch(S, wid, wctx);
    if (watch)
        watch_job(S, sc, watch);
    finish_user(o, rc == JD_ESHUTDOWN ? JD_ESHUTDOWN : rc);
    op_free(o);
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
    rc = spec_parse(S, id, root, true, &sp, err);
    cJSON_Delete(root);
    if (rc) {
        spec_clear(&sp);
        return rc;
    }
    int64_t now = jd_wall_ms();
    pthread_mutex_lock(&S->mu);
    if (S->stopped) {
        pthread_mutex_unlock(&S->mu);
        spec_clear(&sp);
        return jd_error_set(err, JD_ESHUTDOWN, NULL, "the server is shutting down");
    }
    struct sched *sc = find(S, id);
    bool created = !sc || sc->deleting;
    if (!sc) {
        if (S->count >= S->max_schedules) {
            pthread_mutex_unlock(&S->mu);
            spec_clear(&sp);
            return jd_error_set(err, JD_EFULL, NULL,
                                "there are %u schedules, the most this server keeps "
                                "(--max-schedules)",
                                S->max_schedules);
        }
        sc = jd_xcalloc(1, sizeof *sc);
        sc->id = jd_xstrdup(id);
        atomic_init(&sc->refs, 1); /* the hash's */
        size_t b = bucket_of(id);
        sc->next = S->tab[b];
        S->tab[b] = sc;
        S->count++;
    }
    struct op *o = op_new(S, sc, OP_PUT);
    o->sp = sp;
    o->created = created;
    o->paused = sp.paused;
    o->anchor_ms = now;
    o->next_ms = sp.paused ? 0 : spec_next(&sp, now, now);
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
    disarm(S, sc);
    rc = jd_store_submit(S->store, w);
    if (rc) {
        if (!sc->loaded && !sc->ops) {
            unlink_sched(S, sc);
            sched_unref(sc);
        }
        pthread_mutex_unlock(&S->mu);
        op_free(o);
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
    struct sched *sc = id ? find(S, id) : NULL;
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
        struct op *o = op_new(S, sc, OP_DELETE);
        o->done = done;
        o->arg = arg;
        o->nw = 1;
        o->w[0].op = JD_W_SCHEDULE_DELETE;
        o->w[0].sched.id = sc->id;
        o->w[0].done = change_done;
        o->w[0].arg = o;
        rc = jd_store_submit(S->store, &o->w[0]);
        if (rc) {
            op_free(o);
        } else {
            sc->deleting = true;
            sc->ops++;
            disarm(S, sc);
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
        struct op *o = op_new(S, sc, OP_PAUSE);
        o->done = done;
        o->arg = arg;
        o->paused = paused;
        /* Resuming fires from now on: what was missed while paused was
         * meant not to run. */
        o->next_ms = paused ? 0 : spec_next(&sc->sp, sc->anchor_ms, jd_wall_ms());
        struct jd_write *w = op_change(o, paused ? "paused" : "resumed", 0, 0, NULL);
        w->sched.set = JD_SSET_PAUSED | JD_SSET_NEXT_FIRE | (paused ? 0 : JD_SSET_RETIRED);
        w->sched.paused = paused;
        w->sched.next_fire_ms = o->next_ms;
        w->sched.retired = !paused && o->next_ms == 0;
        rc = submit_changes(S, o);
        if (rc) {
            op_free(o);
        } else {
            sc->ops++;
            disarm(S, sc);
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
        watch_job(o->S, o->sc, watch);
    if (o->done)
        o->done(o->arg, res->rc, true, res->rc == 0 ? res->json : NULL);
    op_free(o);
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
    struct op *o = op_new(S, sc, OP_TRIGGER);
    o->done = done;
    o->arg = arg;
    int64_t now = jd_wall_ms();
    o->fire_ms = now;
    o->job_id = jd_store_next_id(S->store);
    snprintf(o->key, sizeof o->key, "schedule:%s:trigger:%" PRId64 ":%" PRId64, sc->id, now,
             o->job_id);
    struct jd_write *w = op_change(o, "triggered", now, o->job_id, NULL);
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
            pointer_under(err, "/job");
        op_free(o);
        return rc;
    }
    atomic_fetch_add_explicit(&S->st_fires, 1, memory_order_relaxed);
    return 0;
}

/* ------------------------------------------------------------ reading */

static void add_id(cJSON *o, const char *name, int64_t id)
{
    if (id <= 0) {
        cJSON_AddNullToObject(o, name);
        return;
    }
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRId64, id);
    cJSON_AddStringToObject(o, name, buf);
}

static char *render_schedule(struct jd_schedules *S, const struct jd_schedule_row *row)
{
    cJSON *def = cJSON_Parse(row->definition);
    if (!def)
        def = cJSON_CreateObject();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", row->id);
    for (cJSON *c = def->child; c; c = c->next)
        cJSON_AddItemToObject(o, c->string, cJSON_Duplicate(c, 1));
    const char *state = row->retired ? "retired" : row->paused ? "paused" : "active";
    cJSON_AddBoolToObject(o, "paused", row->paused);
    cJSON_AddStringToObject(o, "state", state);
    cJSON *times = cJSON_AddArrayToObject(o, "next_fire_times");
    struct spec sp;
    struct jd_error err;
    if (!row->paused && !row->retired && row->next_fire_ms &&
        spec_parse(S, row->id, def, false, &sp, &err) == 0) {
        int64_t t = row->next_fire_ms;
        for (int i = 0; i < 5 && t; i++) {
            char buf[40];
            jd_time_format(t, buf, sizeof buf);
            cJSON_AddItemToArray(times, cJSON_CreateString(buf));
            t = spec_next(&sp, row->anchor_ms, t);
        }
        spec_clear(&sp);
    }
    if (row->last_fire_ms) {
        cJSON *lf = cJSON_AddObjectToObject(o, "last_fire");
        jd_render_add_time(lf, "time", row->last_fire_ms);
        add_id(lf, "job_id", row->last_job_id);
        cJSON_AddStringToObject(lf, "outcome", row->last_outcome ? row->last_outcome : "fired");
    } else {
        cJSON_AddNullToObject(o, "last_fire");
    }
    cJSON *counts = cJSON_AddObjectToObject(o, "counts");
    cJSON_AddNumberToObject(counts, "fires", (double)row->fires);
    cJSON_AddNumberToObject(counts, "skips", (double)row->skips);
    jd_render_add_time(o, "created_at", row->created_ms);
    jd_render_add_time(o, "updated_at", row->updated_ms);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cJSON_Delete(def);
    return text;
}

int jd_schedules_get_json(struct jd_schedules *S, const char *id, char **json)
{
    *json = NULL;
    if (jd_schedules_check_id(id, NULL) != 0)
        return JD_ENOENT;
    struct jd_schedule_row row;
    int rc = jd_store_schedule_get(S->store, id, &row);
    if (rc)
        return rc;
    *json = render_schedule(S, &row);
    jd_schedule_row_clear(&row);
    return 0;
}

int jd_schedules_list_json(struct jd_schedules *S, const char *cursor, unsigned limit, char **json,
                           struct jd_error *err)
{
    *json = NULL;
    if (limit == 0)
        limit = 50;
    if (limit > 1000)
        return jd_error_set(err, JD_EINVAL, NULL, "limit is 1 to 1000");
    if (cursor && jd_schedules_check_id(cursor, NULL) != 0)
        return jd_error_set(err, JD_EINVAL, NULL, "cursor is not one this server gave out");
    struct jd_schedule_row *rows;
    size_t n;
    char *next;
    int rc = jd_store_schedule_list(S->store, cursor, limit, &rows, &n, &next);
    if (rc)
        return jd_error_set(err, rc, NULL, "reading schedules failed: %s", jd_strerror(rc));
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "schedules");
    for (size_t i = 0; i < n; i++) {
        char *one = render_schedule(S, &rows[i]);
        cJSON_AddItemToArray(arr, cJSON_Parse(one));
        free(one);
    }
    if (next)
        cJSON_AddStringToObject(o, "next_cursor", next);
    else
        cJSON_AddNullToObject(o, "next_cursor");
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    free(next);
    jd_schedule_rows_free(rows, n);
    return 0;
}

int jd_schedules_events_json(struct jd_schedules *S, const char *id, int64_t after_seq,
                             unsigned limit, char **json)
{
    *json = NULL;
    if (jd_schedules_check_id(id, NULL) != 0)
        return JD_ENOENT;
    struct jd_schedule_row row;
    int rc = jd_store_schedule_get(S->store, id, &row);
    if (rc)
        return rc;
    jd_schedule_row_clear(&row);
    struct jd_schedule_event *ev;
    size_t n;
    rc = jd_store_schedule_events(S->store, id, after_seq < 0 ? 0 : after_seq, limit ? limit : 1000,
                                  &ev, &n);
    if (rc)
        return rc;
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "events");
    for (size_t i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "seq", (double)ev[i].seq);
        jd_render_add_time(e, "time", ev[i].time_ms);
        cJSON_AddStringToObject(e, "kind", ev[i].kind ? ev[i].kind : "");
        jd_render_add_time(e, "fire_time", ev[i].fire_ms);
        add_id(e, "job_id", ev[i].job_id);
        cJSON *d = ev[i].data ? cJSON_Parse(ev[i].data) : NULL;
        cJSON_AddItemToObject(e, "data", d ? d : cJSON_CreateNull());
        cJSON_AddItemToArray(arr, e);
    }
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    jd_schedule_events_free(ev, n);
    return 0;
}

void jd_schedules_stats(struct jd_schedules *S, struct jd_schedules_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&S->mu);
    out->schedules = S->count;
    pthread_mutex_unlock(&S->mu);
    out->fires = atomic_load_explicit(&S->st_fires, memory_order_relaxed);
    out->skips = atomic_load_explicit(&S->st_skips, memory_order_relaxed);
    out->caught_up = atomic_load_explicit(&S->st_caught_up, memory_order_relaxed);
    out->retired = atomic_load_explicit(&S->st_retired, memory_order_relaxed);
    out->lag_ms_sum = atomic_load_explicit(&S->st_lag_sum, memory_order_relaxed);
    for (int i = 0; i < JD_SCHED_LAG_BUCKETS; i++)
        out->lag_hist[i] = atomic_load_explicit(&S->st_lag[i], memory_order_relaxed);
}

/* --------------------------------------------------------- lifecycle */

/* Load one stored schedule (under mu, before any timer runs). */
static void load_row(struct jd_schedules *S, const struct jd_schedule_row *row)
{
    cJSON *def = cJSON_Parse(row->definition);
    struct spec sp;
    struct jd_error err;
    int rc = def ? spec_parse(S, row->id, def, false, &sp, &err) : JD_EPARSE;
    cJSON_Delete(def);
    if (rc) {
        jd_logf(JD_LOG_ERROR,
                "schedule %s: stored definition no longer loads (%s); it will "
                "not fire until replaced",
                row->id, def ? err.message : "malformed JSON");
        spec_clear(&sp);
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
    size_t b = bucket_of(sc->id);
    sc->next = S->tab[b];
    S->tab[b] = sc;
    S->count++;
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
        S->timers = (struct jd_schedules_timers){sched_timer_after, sched_timer_cancel,
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
            sched_ref(sc);
            all[k++] = sc;
        }
    pthread_mutex_unlock(&S->mu);
    for (size_t i = 0; i < k; i++)
        if (all[i]->last_job_id)
            watch_job(S, all[i], all[i]->last_job_id);
    pthread_mutex_lock(&S->mu);
    for (size_t i = 0; i < k; i++)
        arm(S, all[i], -1);
    pthread_mutex_unlock(&S->mu);
    for (size_t i = 0; i < k; i++)
        sched_unref(all[i]);
    free(all);
    *out = S;
    return 0;
}

void jd_schedules_stop(struct jd_schedules *S)
{
    pthread_mutex_lock(&S->mu);
    S->stopped = true;
    for (size_t b = 0; b < NBUCKETS; b++)
        for (struct sched *sc = S->tab[b]; sc; sc = sc->next)
            disarm(S, sc);
    while (S->tarms > 0) /* timers already running when they were cancelled */
        pthread_cond_wait(&S->cv, &S->mu);
    pthread_mutex_unlock(&S->mu);
    /* Records in flight call back into S when they commit: wait for every
     * one (commits finish on their own; nothing new starts once stopped).
     * acquire: pairs with the release in op_free. */
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
            unwatch(S, sc->watch_id, sc->watch_ctx);
            sched_unref(sc); /* the hash's */
            sc = nx;
        }
        S->tab[b] = NULL;
    }
    pthread_cond_destroy(&S->cv);
    pthread_mutex_destroy(&S->mu);
    free(S);
}
