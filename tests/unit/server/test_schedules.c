/*
 * Unit tests for the schedule engine (server/schedules.c) on a real store
 * and job layer, with a fake wall clock (jd_clock) and fake timers (the
 * engine's timer seam), so hours of schedule pass in milliseconds: fires
 * make one job each with the schedule's labels and key, overlap policies,
 * every catch-up policy after downtime (a destroyed and re-created engine
 * over the same database), the catch-up cap, start/end, pause/resume,
 * trigger, a fire time that already has a job, and validation with
 * pointers.
 *
 * Includes schedules.c to count records in flight (docs/architecture.md, "Testing").
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "server/schedules.c"

#include "jobs_test_util.h"

/* ---- fake clock and timers ---- */

static _Atomic int64_t fake_ms;
static int64_t fake_wall(void)
{
    return atomic_load(&fake_ms);
}

struct ftimer {
    int64_t due;
    void (*fn)(void *);
    void *arg;
    uint64_t id;
    bool live;
};
static pthread_mutex_t ft_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ftimer ft[4096];
static size_t ft_n;
static uint64_t ft_next_id = 1;

static int ft_after(void *ctx, int64_t delay_ms, void (*fn)(void *), void *arg, uint64_t *id)
{
    (void)ctx;
    pthread_mutex_lock(&ft_mu);
    size_t i = 0;
    while (i < ft_n && ft[i].live)
        i++;
    if (i == ft_n)
        ft_n++;
    assert_true(ft_n < 4096);
    ft[i] = (struct ftimer){fake_wall() + delay_ms, fn, arg, ft_next_id++, true};
    *id = ft[i].id;
    pthread_mutex_unlock(&ft_mu);
    return 0;
}

static int ft_cancel(void *ctx, uint64_t id)
{
    (void)ctx;
    int rc = JD_ENOENT;
    pthread_mutex_lock(&ft_mu);
    for (size_t i = 0; i < ft_n; i++)
        if (ft[i].live && ft[i].id == id) {
            ft[i].live = false;
            rc = 0;
        }
    pthread_mutex_unlock(&ft_mu);
    return rc;
}

static const struct jd_schedules_timers fake_timers = {ft_after, ft_cancel, NULL};

/* Run one due timer (the earliest); false if none is due. */
static bool ft_run_one(void)
{
    pthread_mutex_lock(&ft_mu);
    ptrdiff_t best = -1;
    for (size_t i = 0; i < ft_n; i++)
        if (ft[i].live && ft[i].due <= fake_wall() && (best < 0 || ft[i].due < ft[best].due))
            best = (ptrdiff_t)i;
    struct ftimer t = {0};
    if (best >= 0) {
        t = ft[best];
        ft[best].live = false;
    }
    pthread_mutex_unlock(&ft_mu);
    if (best < 0)
        return false;
    t.fn(t.arg);
    return true;
}

static size_t ft_pending(void)
{
    size_t n = 0;
    pthread_mutex_lock(&ft_mu);
    for (size_t i = 0; i < ft_n; i++)
        n += ft[i].live;
    pthread_mutex_unlock(&ft_mu);
    return n;
}

/* ---- fixture ---- */

struct fx {
    struct env e;
    struct jd_schedules *s;
};

#define T0 1798761600000LL /* 2027-01-01T00:00:00Z */

static void engine_up(struct fx *f, unsigned max)
{
    struct jd_schedules_config c = {
        .store = f->e.store, .jobs = f->e.jobs, .max_schedules = max, .timers = &fake_timers};
    struct jd_error err;
    if (jd_schedules_create(&c, &f->s, &err) != 0)
        fail_msg("schedules: %s", err.message);
}

static void engine_down(struct fx *f)
{
    jd_schedules_destroy(f->s);
    f->s = NULL;
    pthread_mutex_lock(&ft_mu);
    ft_n = 0; /* the engine withdrew every timer it had */
    pthread_mutex_unlock(&ft_mu);
}

static int setup(void **state)
{
    atomic_store(&fake_ms, T0);
    jd_clock.wall_ms = fake_wall;
    struct fx *f = calloc(1, sizeof *f);
    env_up(&f->e, NULL);
    engine_up(f, 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    if (f->s)
        engine_down(f);
    env_down(&f->e);
    jd_clock.wall_ms = jd_clock_real_wall_ms;
    free(f);
    return 0;
}

/* Let everything due by now happen: timers, commits, timers they arm. */
static void settle(struct fx *f)
{
    for (int round = 0; round < 100000; round++) {
        bool ran = ft_run_one();
        jd_store_sync(f->e.store);
        if (!ran && atomic_load(&f->s->ops_live) == 0) {
            jd_store_sync(f->e.store);
            if (!ft_run_one() && atomic_load(&f->s->ops_live) == 0)
                return;
        }
    }
    fail_msg("never settled");
}

/* Advance the fake clock in steps (each step lets what is due happen). */
static void advance(struct fx *f, int64_t ms, int64_t step)
{
    int64_t end = fake_wall() + ms;
    while (fake_wall() < end) {
        int64_t next = fake_wall() + step;
        atomic_store(&fake_ms, next < end ? next : end);
        settle(f);
    }
}

struct done_wait {
    sem_t sem;
    int rc;
    bool created;
    char *json;
};

static void done_cb(void *arg, int rc, bool created, const char *json)
{
    struct done_wait *w = arg;
    w->rc = rc;
    w->created = created;
    w->json = json ? strdup(json) : NULL;
    sem_post(&w->sem);
}

/* PUT and wait; returns rc (validation or commit) and fills err. */
static int put(struct fx *f, const char *id, const char *body, bool *created, struct jd_error *err)
{
    struct done_wait w = {0};
    sem_init(&w.sem, 0, 0);
    struct jd_error e2;
    if (!err)
        err = &e2;
    int rc = jd_schedules_put(f->s, id, body, strlen(body), done_cb, &w, err);
    if (rc == 0) {
        sem_wait_ms(&w.sem, 10000);
        rc = w.rc;
        if (created)
            *created = w.created;
        free(w.json);
    }
    sem_destroy(&w.sem);
    settle(f);
    return rc;
}

static void put_ok(struct fx *f, const char *id, const char *body)
{
    struct jd_error err;
    int rc = put(f, id, body, NULL, &err);
    if (rc)
        fail_msg("put %s: %d %s %s", body, rc, err.pointer, err.message);
}

static int action(struct fx *f, int which, const char *id, char **json)
{
    struct done_wait w = {0};
    sem_init(&w.sem, 0, 0);
    struct jd_error err;
    int rc = which == 0   ? jd_schedules_pause(f->s, id, true, done_cb, &w)
             : which == 1 ? jd_schedules_pause(f->s, id, false, done_cb, &w)
             : which == 2 ? jd_schedules_trigger(f->s, id, done_cb, &w, &err)
                          : jd_schedules_delete(f->s, id, done_cb, &w);
    if (rc == 0) {
        sem_wait_ms(&w.sem, 10000);
        rc = w.rc;
        if (json)
            *json = w.json;
        else
            free(w.json);
    }
    sem_destroy(&w.sem);
    settle(f);
    return rc;
}

/* The jobs schedule id made, oldest first: their idempotency keys' fire
 * times into fires[] (trigger jobs give -1). Returns how many. */
static size_t jobs_of(struct fx *f, const char *id, int64_t *fires, size_t max)
{
    struct jd_job_filter q = {.state = -1, .schedule = id, .limit = 1000};
    struct jd_job *rows;
    size_t n;
    int64_t next;
    assert_int_equal(jd_store_job_list(f->e.store, &q, &rows, &n, &next), 0);
    for (size_t i = 0; i < n && i < max; i++) {
        const char *k = rows[n - 1 - i].idempotency_key;
        char want[160];
        snprintf(want, sizeof want, "schedule:%s:", id);
        assert_non_null(k);
        assert_true(strncmp(k, want, strlen(want)) == 0);
        fires[i] = strstr(k, ":trigger:") ? -1 : strtoll(k + strlen(want), NULL, 10);
    }
    jd_jobs_free(rows, n);
    return n;
}

/* The schedule's events as parsed JSON (caller deletes). */
static cJSON *events_of(struct fx *f, const char *id)
{
    char *json;
    assert_int_equal(jd_schedules_events_json(f->s, id, 0, 0, &json), 0);
    cJSON *o = cJSON_Parse(json);
    free(json);
    return cJSON_GetObjectItem(o, "events") ? o : (cJSON_Delete(o), (cJSON *)NULL);
}

static cJSON *last_event(cJSON *events)
{
    cJSON *arr = cJSON_GetObjectItem(events, "events");
    return cJSON_GetArrayItem(arr, cJSON_GetArraySize(arr) - 1);
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* Schedules here allow overlap unless a test is about it: whether an echo
 * job has finished by the next fake tick depends on real time. */
#define ECHO "{\"handler\":\"t.echo\",\"args\":{\"v\":1},\"labels\":{\"team\":\"a\"}}"

/* ---- tests ---- */

static void test_every_fires_one_job_per_tick_with_labels_and_key(void **state)
{
    struct fx *f = *state;
    bool created = false;
    assert_int_equal(
        put(f, "tick",
            "{\"every\":\"10s\",\"labels\":{\"env\":\"prod\"},\"overlap\":\"allow\",\"job\":" ECHO
            "}",
            &created, NULL),
        0);
    assert_true(created);
    advance(f, 35000, 1000);
    int64_t fires[16];
    assert_int_equal(jobs_of(f, "tick", fires, 16), 3);
    for (int i = 0; i < 3; i++)
        assert_true(fires[i] == T0 + 10000 * (i + 1));
    /* the job carries the labels: its own, the schedule's, and the id */
    struct jd_job_filter q = {.state = -1, .schedule = "tick", .limit = 1};
    struct jd_job *rows;
    size_t n;
    int64_t next;
    assert_int_equal(jd_store_job_list(f->e.store, &q, &rows, &n, &next), 0);
    cJSON *def = cJSON_Parse(rows[0].definition);
    cJSON *labels = cJSON_GetObjectItem(def, "labels");
    assert_string_equal(str(labels, "schedule"), "tick");
    assert_string_equal(str(labels, "env"), "prod");
    assert_string_equal(str(labels, "team"), "a");
    cJSON_Delete(def);
    jd_jobs_free(rows, n);

    char *json;
    assert_int_equal(jd_schedules_get_json(f->s, "tick", &json), 0);
    cJSON *o = cJSON_Parse(json);
    free(json);
    assert_string_equal(str(o, "state"), "active");
    assert_int_equal(num(cJSON_GetObjectItem(o, "counts"), "fires"), 3);
    cJSON *times = cJSON_GetObjectItem(o, "next_fire_times");
    assert_int_equal(cJSON_GetArraySize(times), 5);
    char want[40];
    jd_time_format(T0 + 40000, want, sizeof want);
    assert_string_equal(cJSON_GetArrayItem(times, 0)->valuestring, want);
    cJSON *lf = cJSON_GetObjectItem(o, "last_fire");
    jd_time_format(T0 + 30000, want, sizeof want);
    assert_string_equal(str(lf, "time"), want);
    assert_string_equal(str(lf, "outcome"), "fired");
    cJSON_Delete(o);
    /* one timer per schedule, no more */
    assert_int_equal(ft_pending(), 1);
}

static void test_cron_in_a_zone_fires_at_local_times(void **state)
{
    struct fx *f = *state;
    /* 09:00 in Berlin is 08:00Z in winter */
    put_ok(
        f, "morning",
        "{\"cron\":\"0 9 * * *\",\"timezone\":\"Europe/Berlin\",\"overlap\":\"allow\",\"job\":" ECHO
        "}");
    advance(f, 2 * 86400000LL, 3600000);
    int64_t fires[4];
    assert_int_equal(jobs_of(f, "morning", fires, 4), 2);
    assert_true(fires[0] == T0 + 8 * 3600000LL);
    assert_true(fires[1] == T0 + 32 * 3600000LL);
}

static void test_overlap_skip_allow_and_cancel_previous(void **state)
{
    struct fx *f = *state;
    const char *hang = "{\"handler\":\"t.hang\"}";
    char body[256];
    snprintf(body, sizeof body, "{\"every\":\"1m\",\"job\":%s}", hang);
    put_ok(f, "skip", body);
    snprintf(body, sizeof body, "{\"every\":\"1m\",\"overlap\":\"allow\",\"job\":%s}", hang);
    put_ok(f, "allow", body);
    snprintf(body, sizeof body, "{\"every\":\"1m\",\"overlap\":\"cancel_previous\",\"job\":%s}",
             hang);
    put_ok(f, "cancel", body);
    advance(f, 180000, 60000);
    int64_t fires[8];
    assert_int_equal(jobs_of(f, "skip", fires, 8), 1); /* the 2nd and 3rd were skipped */
    assert_int_equal(jobs_of(f, "allow", fires, 8), 3);
    assert_int_equal(jobs_of(f, "cancel", fires, 8), 3);
    cJSON *ev = events_of(f, "skip");
    cJSON *last = last_event(ev);
    assert_string_equal(str(last, "kind"), "skipped");
    assert_string_equal(str(cJSON_GetObjectItem(last, "data"), "reason"),
                        "the previous job is still running");
    cJSON_Delete(ev);
    char *json;
    assert_int_equal(jd_schedules_get_json(f->s, "skip", &json), 0);
    cJSON *o = cJSON_Parse(json);
    free(json);
    assert_int_equal(num(cJSON_GetObjectItem(o, "counts"), "skips"), 2);
    assert_string_equal(str(cJSON_GetObjectItem(o, "last_fire"), "outcome"), "skipped");
    cJSON_Delete(o);
    /* cancel_previous: every job but the newest was cancelled */
    struct jd_job_filter q = {.state = JD_JOB_CANCELLED, .schedule = "cancel", .limit = 10};
    struct jd_job *rows;
    size_t n;
    int64_t next;
    for (int i = 0; i < 200; i++) {
        assert_int_equal(jd_store_job_list(f->e.store, &q, &rows, &n, &next), 0);
        jd_jobs_free(rows, n);
        if (n == 2)
            break;
        usleep(10000);
    }
    assert_int_equal(n, 2);
    /* once the running job ends, "skip" fires again */
    q = (struct jd_job_filter){.state = -1, .schedule = "skip", .limit = 1};
    assert_int_equal(jd_store_job_list(f->e.store, &q, &rows, &n, &next), 0);
    int64_t running = rows[0].id;
    jd_jobs_free(rows, n);
    assert_int_equal(jd_jobs_cancel(f->e.jobs, running, NULL, NULL), 0);
    cJSON_Delete(wait_terminal(f->e.jobs, running, 5000));
    usleep(20000); /* the watch's callback */
    advance(f, 60000, 60000);
    assert_int_equal(jobs_of(f, "skip", fires, 8), 2);
    /* "allow" does not watch its jobs; replaced by "skip", it starts to:
     * its last job finished, so the next fire runs */
    put_ok(f, "flip", "{\"every\":\"1m\",\"overlap\":\"allow\",\"job\":" ECHO "}");
    advance(f, 60000, 60000);
    q = (struct jd_job_filter){.state = -1, .schedule = "flip", .limit = 1};
    assert_int_equal(jd_store_job_list(f->e.store, &q, &rows, &n, &next), 0);
    int64_t first = rows[0].id;
    jd_jobs_free(rows, n);
    cJSON_Delete(wait_terminal(f->e.jobs, first, 5000));
    put_ok(f, "flip", "{\"every\":\"1m\",\"overlap\":\"skip\",\"job\":" ECHO "}");
    usleep(20000); /* the watch's callback */
    advance(f, 60000, 60000);
    assert_int_equal(jobs_of(f, "flip", fires, 8), 2);
}

/* Downtime: the engine is gone for `down_ms`, then comes back. */
static void downtime(struct fx *f, int64_t down_ms)
{
    engine_down(f);
    atomic_store(&fake_ms, fake_wall() + down_ms);
    engine_up(f, 0);
    settle(f);
}

static void test_catchup_policies_after_downtime(void **state)
{
    struct fx *f = *state;
    put_ok(f, "none",
           "{\"every\":\"1m\",\"catchup\":\"none\",\"overlap\":\"allow\",\"job\":" ECHO "}");
    put_ok(f, "latest",
           "{\"every\":\"1m\",\"overlap\":\"allow\",\"job\":" ECHO "}"); /* the default */
    put_ok(f, "all",
           "{\"every\":\"1m\",\"catchup\":\"all\",\"overlap\":\"allow\",\"job\":" ECHO "}");
    advance(f, 60000, 60000);        /* one ordinary fire each */
    downtime(f, 10 * 60000 + 30000); /* ticks 2..11 missed */
    int64_t fires[32];
    assert_int_equal(jobs_of(f, "none", fires, 32), 1);
    assert_int_equal(jobs_of(f, "latest", fires, 32), 2);
    assert_true(fires[1] == T0 + 11 * 60000); /* the newest missed tick */
    assert_int_equal(jobs_of(f, "all", fires, 32), 11);
    for (int i = 0; i < 11; i++)
        assert_true(fires[i] == T0 + (i + 1) * 60000);
    cJSON *ev = events_of(f, "none");
    cJSON *last = last_event(ev);
    assert_string_equal(str(last, "kind"), "caught_up");
    assert_int_equal(num(cJSON_GetObjectItem(last, "data"), "missed"), 10);
    assert_int_equal(num(cJSON_GetObjectItem(last, "data"), "ran"), 0);
    cJSON_Delete(ev);
    ev = events_of(f, "latest");
    last = last_event(ev);
    assert_string_equal(str(last, "kind"), "caught_up");
    assert_int_equal(num(cJSON_GetObjectItem(last, "data"), "missed"), 10);
    cJSON_Delete(ev);
    /* afterwards each goes on with the next tick, once */
    advance(f, 60000, 1000); /* small steps: each tick on time */
    assert_int_equal(jobs_of(f, "none", fires, 32), 2);
    assert_true(fires[1] == T0 + 12 * 60000);
    assert_int_equal(jobs_of(f, "latest", fires, 32), 3);
    assert_int_equal(jobs_of(f, "all", fires, 32), 12);
}

static void test_catchup_all_is_capped_and_says_so(void **state)
{
    struct fx *f = *state;
    put_ok(f, "many",
           "{\"every\":\"1s\",\"catchup\":\"all\",\"overlap\":\"allow\",\"job\":" ECHO "}");
    downtime(f, 250000 + 10000); /* 260 ticks, 255 of them more than 5 s late */
    int64_t fires[400];
    size_t n = jobs_of(f, "many", fires, 400);
    assert_int_equal(n, 105); /* the newest 100 of the 255 missed, then 5 merely late */
    assert_true(fires[0] == T0 + 156000);
    assert_true(fires[99] == T0 + 255000);
    assert_true(fires[104] == T0 + 260000);
    cJSON *ev = events_of(f, "many");
    cJSON *arr = cJSON_GetObjectItem(ev, "events");
    bool said = false;
    for (cJSON *e = arr->child; e; e = e->next) {
        cJSON *d = cJSON_GetObjectItem(e, "data");
        if (strcmp(str(e, "kind"), "caught_up") == 0 && num(d, "dropped") == 155) {
            assert_int_equal(num(d, "cap"), 100);
            assert_int_equal(num(d, "missed"), 255);
            said = true;
        }
    }
    assert_true(said);
    cJSON_Delete(ev);
    advance(f, 1000, 1000); /* the ticks within the grace period, then on time */
    n = jobs_of(f, "many", fires, 400);
    assert_true(fires[n - 1] == T0 + 261000);
    assert_int_equal(n, 106);
}

static void test_start_end_and_retire(void **state)
{
    struct fx *f = *state;
    char body[256];
    char s[40], e[40];
    jd_time_format(T0 + 120000, s, sizeof s);
    jd_time_format(T0 + 270000, e, sizeof e);
    snprintf(body, sizeof body,
             "{\"every\":\"1m\",\"start_at\":\"%s\",\"end_at\":\"%s\",\"overlap\":\"allow\","
             "\"job\":" ECHO "}",
             s, e);
    put_ok(f, "window", body);
    advance(f, 600000, 30000);
    int64_t fires[8];
    assert_int_equal(jobs_of(f, "window", fires, 8), 3);
    assert_true(fires[0] == T0 + 120000 && fires[2] == T0 + 240000);
    char *json;
    assert_int_equal(jd_schedules_get_json(f->s, "window", &json), 0);
    cJSON *o = cJSON_Parse(json);
    free(json);
    assert_string_equal(str(o, "state"), "retired");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "next_fire_times")), 0);
    cJSON_Delete(o);
    cJSON *ev = events_of(f, "window");
    assert_string_equal(str(last_event(ev), "kind"), "retired");
    cJSON_Delete(ev);
    assert_int_equal(ft_pending(), 0);
    /* made with its end already past: retired at once, never fires */
    put_ok(f, "late", body);
    assert_int_equal(jd_schedules_get_json(f->s, "late", &json), 0);
    o = cJSON_Parse(json);
    free(json);
    assert_string_equal(str(o, "state"), "retired");
    cJSON_Delete(o);
    /* created paused: paused, not retired; resumed, it fires */
    put_ok(f, "sleepy", "{\"every\":\"1m\",\"paused\":true,\"job\":" ECHO "}");
    assert_int_equal(jd_schedules_get_json(f->s, "sleepy", &json), 0);
    o = cJSON_Parse(json);
    free(json);
    assert_string_equal(str(o, "state"), "paused");
    cJSON_Delete(o);
    assert_int_equal(action(f, 1, "sleepy", NULL), 0);
    advance(f, 60000, 1000);
    assert_int_equal(jobs_of(f, "sleepy", fires, 8), 1);
}

static void test_pause_resume_trigger_delete(void **state)
{
    struct fx *f = *state;
    put_ok(f, "p", "{\"every\":\"1m\",\"overlap\":\"allow\",\"job\":" ECHO "}");
    assert_int_equal(action(f, 0, "p", NULL), 0);
    advance(f, 300000, 60000);
    int64_t fires[8];
    assert_int_equal(jobs_of(f, "p", fires, 8), 0);
    assert_int_equal(ft_pending(), 0);
    char *json = NULL;
    assert_int_equal(action(f, 2, "p", &json), 0); /* a paused schedule can be triggered */
    cJSON *job = cJSON_Parse(json);
    free(json);
    assert_string_equal(str(cJSON_GetObjectItem(job, "labels"), "schedule"), "p");
    cJSON_Delete(job);
    assert_int_equal(jobs_of(f, "p", fires, 8), 1);
    assert_true(fires[0] == -1);
    assert_int_equal(action(f, 1, "p", NULL), 0);
    advance(f, 60000, 60000);
    assert_int_equal(jobs_of(f, "p", fires, 8), 2); /* missed while paused: not caught up */
    assert_true(fires[1] == T0 + 360000);
    cJSON *ev = events_of(f, "p");
    cJSON *arr = cJSON_GetObjectItem(ev, "events");
    const char *kinds[] = {"created", "paused", "triggered", "resumed", "fired"};
    assert_int_equal(cJSON_GetArraySize(arr), 5);
    for (int i = 0; i < 5; i++)
        assert_string_equal(str(cJSON_GetArrayItem(arr, i), "kind"), kinds[i]);
    cJSON_Delete(ev);
    assert_int_equal(action(f, 3, "p", NULL), 0);
    assert_int_equal(jd_schedules_get_json(f->s, "p", &json), JD_ENOENT);
    assert_int_equal(action(f, 3, "p", NULL), JD_ENOENT);
    assert_int_equal(action(f, 0, "p", NULL), JD_ENOENT);
    assert_int_equal(ft_pending(), 0);
    advance(f, 120000, 60000);
    assert_int_equal(jobs_of(f, "p", fires, 8), 2);
}

/* A fire time that already has a job (the schedule was deleted and made
 * again, the clock went back): no second job, the fire names the first. */
static void test_a_fire_time_gets_one_job_ever(void **state)
{
    struct fx *f = *state;
    char body[256];
    char s[40];
    jd_time_format(T0, s, sizeof s);
    snprintf(body, sizeof body,
             "{\"every\":\"1m\",\"start_at\":\"%s\",\"overlap\":\"allow\",\"job\":" ECHO "}", s);
    put_ok(f, "again", body);
    advance(f, 60000, 60000);
    int64_t fires[8];
    assert_int_equal(jobs_of(f, "again", fires, 8), 1);
    assert_int_equal(action(f, 3, "again", NULL), 0);
    atomic_store(&fake_ms, T0 + 1000);
    put_ok(f, "again", body);
    advance(f, 60000, 60000);
    assert_int_equal(jobs_of(f, "again", fires, 8), 1);
    cJSON *ev = events_of(f, "again");
    cJSON *last = last_event(ev);
    assert_string_equal(str(last, "kind"), "fired");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(last, "data"), "existing")));
    cJSON_Delete(ev);
    advance(f, 60000, 60000); /* and it goes on */
    assert_int_equal(jobs_of(f, "again", fires, 8), 2);
}

static void expect_invalid(struct fx *f, const char *body, int code, const char *ptr,
                           const char *needle)
{
    struct jd_error err;
    jd_error_clear(&err);
    int rc = put(f, "bad", body, NULL, &err);
    if (rc != code || strcmp(err.pointer, ptr) != 0 || !strstr(err.message, needle))
        fail_msg("%s: rc %d pointer \"%s\" message \"%s\"", body, rc, err.pointer, err.message);
}

static void test_validation_points_at_the_field(void **state)
{
    struct fx *f = *state;
    expect_invalid(f, "{\"cron\":\"0 24 * * *\",\"job\":" ECHO "}", JD_EINVAL, "/cron",
                   "hour: 24 is out of range 0-23");
    expect_invalid(f, "{\"cron\":\"0 0 * * fri-mon\",\"job\":" ECHO "}", JD_EINVAL, "/cron",
                   "day-of-week: range 5-1 runs backwards");
    expect_invalid(f, "{\"every\":\"500ms\",\"job\":" ECHO "}", JD_EINVAL, "/every",
                   "shorter than 1s");
    expect_invalid(f, "{\"job\":" ECHO "}", JD_EINVAL, "", "\"cron\"");
    expect_invalid(f, "{\"cron\":\"@daily\",\"every\":\"1m\",\"job\":" ECHO "}", JD_EINVAL,
                   "/every", "not both");
    expect_invalid(f, "{\"cron\":\"@daily\",\"timezone\":\"Mars/Olympus\",\"job\":" ECHO "}",
                   JD_EINVAL, "/timezone", "unknown time zone");
    expect_invalid(f, "{\"cron\":\"@daily\",\"timezone\":\"../../etc/passwd\",\"job\":" ECHO "}",
                   JD_EINVAL, "/timezone", "IANA name");
    expect_invalid(f, "{\"cron\":\"@daily\"}", JD_EINVAL, "/job", "needs a job");
    expect_invalid(f, "{\"cron\":\"@daily\",\"job\":{\"handler\":\"nope\"}}", JD_EINVAL,
                   "/job/handler", "nope");
    expect_invalid(f, "{\"cron\":\"@daily\",\"job\":{\"handler\":\"t.echo\",\"args\":{\"bad\":1}}}",
                   JD_EINVAL, "/job/args/bad", "bad is not allowed");
    expect_invalid(f,
                   "{\"cron\":\"@daily\",\"job\":{\"handler\":\"t.echo\",\"run_at\":"
                   "\"2027-01-01T00:00:00Z\"}}",
                   JD_EINVAL, "/job/run_at", "fire time");
    expect_invalid(f, "{\"cron\":\"@daily\",\"overlap\":\"never\",\"job\":" ECHO "}", JD_EINVAL,
                   "/overlap", "one of");
    expect_invalid(f, "{\"cron\":\"@daily\",\"catchup\":5,\"job\":" ECHO "}", JD_EINVAL, "/catchup",
                   "one of");
    expect_invalid(f, "{\"every\":\"1m\",\"jitter_ms\":60000,\"job\":" ECHO "}", JD_EINVAL,
                   "/jitter_ms", "shorter than the interval");
    expect_invalid(f, "{\"every\":\"1m\",\"labels\":{\"schedule\":\"x\"},\"job\":" ECHO "}",
                   JD_EINVAL, "/labels/schedule", "set by Jackdaw");
    expect_invalid(f,
                   "{\"every\":\"1m\",\"start_at\":\"2027-01-02T00:00:00Z\",\"end_at\":"
                   "\"2027-01-01T00:00:00Z\",\"job\":" ECHO "}",
                   JD_EINVAL, "/end_at", "after start_at");
    expect_invalid(f, "{\"every\":\"1m\",\"cronn\":1,\"job\":" ECHO "}", JD_EINVAL, "/cronn",
                   "unknown field");
    expect_invalid(f, "[1,2]", JD_EINVAL, "", "JSON object");
    expect_invalid(f, "{\"every\":", JD_EPARSE, "", "malformed");
    char deep[2100];
    size_t k = 0;
    for (int i = 0; i < 1000; i++)
        deep[k++] = '[';
    for (int i = 0; i < 1000; i++)
        deep[k++] = ']';
    deep[k] = '\0';
    expect_invalid(f, deep, JD_ETOOBIG, "", "nested deeper");
    char *huge = malloc(70000);
    memset(huge, ' ', 69999);
    huge[0] = '{';
    huge[69998] = '}';
    huge[69999] = '\0';
    expect_invalid(f, huge, JD_ETOOBIG, "", "limit");
    free(huge);
    struct jd_error err;
    assert_int_equal(jd_schedules_put(f->s, "a/b", "{}", 2, done_cb, NULL, &err), JD_EINVAL);
    int64_t fires[2];
    assert_int_equal(jobs_of(f, "bad", fires, 2), 0);
    assert_int_equal(f->s->count, 0);
}

static void test_count_is_bounded(void **state)
{
    struct fx *f = *state;
    engine_down(f);
    engine_up(f, 2);
    put_ok(f, "one", "{\"every\":\"1h\",\"overlap\":\"allow\",\"job\":" ECHO "}");
    put_ok(f, "two", "{\"every\":\"1h\",\"overlap\":\"allow\",\"job\":" ECHO "}");
    struct jd_error err;
    assert_int_equal(
        put(f, "three", "{\"every\":\"1h\",\"overlap\":\"allow\",\"job\":" ECHO "}", NULL, &err),
        JD_EFULL);
    assert_non_null(strstr(err.message, "--max-schedules"));
    bool created = true;
    assert_int_equal(
        put(f, "two", "{\"every\":\"2h\",\"overlap\":\"allow\",\"job\":" ECHO "}", &created, NULL),
        0);
    assert_false(created); /* a replace is not a new one */
    assert_int_equal(action(f, 3, "one", NULL), 0);
    put_ok(f, "three", "{\"every\":\"1h\",\"overlap\":\"allow\",\"job\":" ECHO "}");
    char *json;
    struct jd_error e2;
    assert_int_equal(jd_schedules_list_json(f->s, NULL, 1, &json, &e2), 0);
    cJSON *o = cJSON_Parse(json);
    free(json);
    assert_string_equal(str(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "schedules"), 0), "id"),
                        "three");
    assert_string_equal(str(o, "next_cursor"), "three");
    cJSON_Delete(o);
    assert_int_equal(jd_schedules_list_json(f->s, "three", 10, &json, &e2), 0);
    o = cJSON_Parse(json);
    free(json);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "schedules")), 1);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "next_cursor")));
    cJSON_Delete(o);
}

/* Jitter delays the timer by a fixed amount within jitter_ms; the fire time
 * (and so the job's key) stays the nominal one. */
static void test_jitter_delays_the_timer_not_the_fire_time(void **state)
{
    struct fx *f = *state;
    put_ok(f, "j", "{\"every\":\"1m\",\"jitter_ms\":30000,\"overlap\":\"allow\",\"job\":" ECHO "}");
    pthread_mutex_lock(&ft_mu);
    int64_t due = 0;
    for (size_t i = 0; i < ft_n; i++)
        if (ft[i].live)
            due = ft[i].due;
    pthread_mutex_unlock(&ft_mu);
    assert_true(due >= T0 + 60000 && due <= T0 + 90000);
    int64_t fires[4];
    advance(f, due - 1 - fake_wall(), 1000); /* just before the jittered moment */
    assert_int_equal(jobs_of(f, "j", fires, 4), 0);
    advance(f, 1, 1);
    assert_int_equal(jobs_of(f, "j", fires, 4), 1);
    assert_true(fires[0] == T0 + 60000);
}

/* Restart with nothing missed: the same timers come back, nothing doubles. */
static void test_restart_rearms_without_doubling(void **state)
{
    struct fx *f = *state;
    put_ok(f, "r", "{\"cron\":\"*/5 * * * *\",\"overlap\":\"allow\",\"job\":" ECHO "}");
    advance(f, 300000, 60000);
    int64_t fires[8];
    assert_int_equal(jobs_of(f, "r", fires, 8), 1);
    downtime(f, 1000);
    assert_int_equal(jobs_of(f, "r", fires, 8), 1);
    assert_int_equal(ft_pending(), 1);
    advance(f, 300000, 60000);
    assert_int_equal(jobs_of(f, "r", fires, 8), 2);
    assert_true(fires[1] == T0 + 600000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_fires_one_job_per_tick_with_labels_and_key,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_cron_in_a_zone_fires_at_local_times, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlap_skip_allow_and_cancel_previous, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_catchup_policies_after_downtime, setup, teardown),
        cmocka_unit_test_setup_teardown(test_catchup_all_is_capped_and_says_so, setup, teardown),
        cmocka_unit_test_setup_teardown(test_start_end_and_retire, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pause_resume_trigger_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_fire_time_gets_one_job_ever, setup, teardown),
        cmocka_unit_test_setup_teardown(test_validation_points_at_the_field, setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_is_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_jitter_delays_the_timer_not_the_fire_time, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_restart_rearms_without_doubling, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
