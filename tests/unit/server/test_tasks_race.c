/*
 * A job's cancel racing its remote task's claim (server/tasks.h,
 * jobs_tasks_claim.c, jobs_tasks_job_over). Two interleavings are forced
 * with link-time seams (this test links with -Wl,--wrap, see Makefile):
 *
 *  - jd_store_submit: the claim's dispatch record is held at its
 *    submission while the job is cancelled from another thread. The
 *    cancel must not overtake it: its job's history never shows a claim
 *    after the job's end, and the task of a cancelled job is not handed
 *    out.
 *  - jd_sched_cancel: the cancel is committed and acknowledged but not yet
 *    delivered to the job's process (so the task's call is still out).
 *    From then on no claim gets the task, and a worker that holds one
 *    hears 409 "cancelled" from its heartbeat, complete and fail.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "jobs_test_util.h"
#include "scheduler/sched.h"
#include "server/tasks.h"

#include <pthread.h>
#include <stdatomic.h>

/* ---- seams ---- */

int __real_jd_store_submit(struct jd_store *s, struct jd_write *w);
int __real_jd_sched_cancel(struct jd_sched *s, jd_pid pid);

static struct jd_store *g_store;
static atomic_int g_hold_claim;   /* hold the next claim's dispatch record */
static atomic_bool g_overtaken;   /* the job ended while the claim's record was held */
static sem_t g_cancel_go;         /* the cancel thread's start */
static int64_t g_job;             /* the job being cancelled */
static atomic_int g_defer_cancel; /* keep cancels from the job's process */
static jd_pid g_deferred[8];
static atomic_int g_ndeferred;
static struct jd_sched *g_sched;
static struct jd_jobs *jd_test_jobs;

static bool job_terminal_in_store(int64_t id)
{
    struct jd_job row = {0};
    bool t = jd_store_job_get(g_store, id, &row) == 0 && jd_job_state_terminal(row.state);
    jd_job_clear(&row);
    return t;
}

int __wrap_jd_store_submit(struct jd_store *s, struct jd_write *w)
{
    if (w->op == JD_W_JOB_CHANGE && w->kind == JD_EVK_DISPATCH && w->data &&
        strstr(w->data, "\"task\"") && atomic_exchange(&g_hold_claim, 0)) {
        /* The claim took its task and is about to record it: cancel the
         * job now, and give the cancel half a second to get all the way
         * through (it cannot, if the claim still holds the task). */
        sem_post(&g_cancel_go);
        for (int i = 0; i < 50 && !job_terminal_in_store(g_job); i++)
            usleep(10000);
        atomic_store(&g_overtaken, job_terminal_in_store(g_job));
    }
    return __real_jd_store_submit(s, w);
}

int __wrap_jd_sched_cancel(struct jd_sched *s, jd_pid pid)
{
    if (atomic_load(&g_defer_cancel)) {
        g_sched = s;
        int n = atomic_fetch_add(&g_ndeferred, 1);
        if (n < 8)
            g_deferred[n] = pid;
        return 0;
    }
    return __real_jd_sched_cancel(s, pid);
}

static void release_cancels(void)
{
    atomic_store(&g_defer_cancel, 0);
    int n = atomic_exchange(&g_ndeferred, 0);
    for (int i = 0; i < n && i < 8; i++)
        __real_jd_sched_cancel(g_sched, g_deferred[i]);
}

/* ---- helpers ---- */

struct done_wait {
    sem_t sem;
    int rc;
    char *json;
};

static void done_cb(void *arg, int rc, const char *json)
{
    struct done_wait *w = arg;
    w->rc = rc;
    w->json = json ? strdup(json) : NULL;
    sem_post(&w->sem);
}

static void dw_init(struct done_wait *w)
{
    memset(w, 0, sizeof *w);
    sem_init(&w->sem, 0, 0);
}

static void dw_wait(struct done_wait *w)
{
    sem_wait_ms(&w->sem, 10000);
    sem_destroy(&w->sem);
}

static void command_put(struct jd_jobs *j, const char *name)
{
    struct done_wait w;
    dw_init(&w);
    bool created;
    struct jd_error err;
    jd_error_clear(&err);
    assert_int_equal(jd_jobs_command_put(j, name, "{}", 2, &created, done_cb, &w, &err), 0);
    dw_wait(&w);
    assert_int_equal(w.rc, 0);
    free(w.json);
}

/* Wait until n tasks of command name wait for a worker. */
static void wait_waiting(struct jd_jobs *j, const char *name, int n)
{
    for (int i = 0; i < 1000; i++) {
        char *json = NULL;
        assert_int_equal(jd_jobs_command_get_json(j, name, &json), 0);
        cJSON *o = cJSON_Parse(json);
        free(json);
        int got = (int)cJSON_GetObjectItem(o, "waiting")->valuedouble;
        cJSON_Delete(o);
        if (got == n)
            return;
        usleep(5000);
    }
    fail_msg("%d tasks of %s never waited", n, name);
}

/* A claim of up to 10 tasks of name, without waiting: its tasks (caller
 * deletes). */
static cJSON *claim(struct jd_jobs *j, const char *name)
{
    char body[200];
    snprintf(body, sizeof body, "{\"commands\":[\"%s\"],\"worker\":\"w1\",\"max\":10}", name);
    struct done_wait w;
    dw_init(&w);
    struct jd_error err;
    jd_error_clear(&err);
    assert_int_equal(jd_jobs_task_claim(j, body, strlen(body), done_cb, &w, &err), 0);
    dw_wait(&w);
    assert_int_equal(w.rc, 0);
    cJSON *o = cJSON_Parse(w.json);
    free(w.json);
    cJSON *ts = cJSON_DetachItemFromObject(o, "tasks");
    cJSON_Delete(o);
    return ts;
}

enum end_kind { HEARTBEAT, COMPLETE, FAIL };

/* One heartbeat, complete or fail of task id: its rc (and *reason). */
static int task_end(struct jd_jobs *j, const char *id, enum end_kind k, const char **reason)
{
    struct done_wait w;
    dw_init(&w);
    struct jd_error err;
    jd_error_clear(&err);
    *reason = NULL;
    int rc = k == HEARTBEAT ? jd_jobs_task_heartbeat(j, id, "{}", 2, done_cb, &w, reason, &err)
             : k == COMPLETE
                 ? jd_jobs_task_complete(j, id, "{\"result\":1}", 12, done_cb, &w, reason, &err)
                 : jd_jobs_task_fail(j, id, "{\"error\":{\"message\":\"x\"}}", 25, done_cb, &w,
                                     reason, &err);
    if (rc == 0) {
        dw_wait(&w);
        rc = w.rc;
        free(w.json);
    } else {
        sem_destroy(&w.sem);
    }
    return rc;
}

/* The job's history is in order: nothing after its terminal state event,
 * and no worker's result among its completions. Returns the seq of the
 * dispatch that names a task (0: none). */
static int64_t check_history(struct jd_store *s, int64_t id)
{
    struct jd_job_event *ev = NULL;
    size_t n = 0;
    assert_int_equal(jd_store_events(s, id, 0, 1000, &ev, &n), 0);
    int64_t end = 0, claim = 0;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].kind == JD_EVK_STATE && ev[i].data && strstr(ev[i].data, "\"cancelled\""))
            end = ev[i].seq;
        else if (end)
            fail_msg("event %lld (kind %d, %s) follows the job's end at %lld", (long long)ev[i].seq,
                     ev[i].kind, ev[i].data ? ev[i].data : "", (long long)end);
        if (ev[i].kind == JD_EVK_DISPATCH && ev[i].data && strstr(ev[i].data, "\"task\""))
            claim = ev[i].seq;
        if (ev[i].kind == JD_EVK_COMPLETE && ev[i].data && strstr(ev[i].data, "\"result\""))
            fail_msg("a cancelled job's task was completed: %s", ev[i].data);
    }
    jd_job_events_free(ev, n);
    assert_true(end > 0);
    return claim;
}

static void *cancel_thread(void *arg)
{
    struct done_wait *w = arg;
    sem_wait(&g_cancel_go);
    int rc = jd_jobs_cancel(jd_test_jobs, g_job, done_cb, w);
    if (rc) { /* refused: no callback; tell the test */
        w->rc = rc;
        sem_post(&w->sem);
    }
    return NULL;
}

/* ---- tests ---- */

static void test_a_cancel_does_not_overtake_a_claims_record(void **state)
{
    (void)state;
    struct env e;
    env_up(&e, NULL);
    g_store = e.store;
    jd_test_jobs = e.jobs;
    command_put(e.jobs, "rc1");
    g_job = submit(e.jobs, "{\"handler\":\"rc1\",\"args\":{}}");
    wait_waiting(e.jobs, "rc1", 1);

    sem_init(&g_cancel_go, 0, 0);
    struct done_wait cw;
    dw_init(&cw);
    pthread_t th;
    pthread_create(&th, NULL, cancel_thread, &cw);
    atomic_store(&g_hold_claim, 1);
    cJSON *ts = claim(e.jobs, "rc1"); /* the cancel runs while its record is held */
    dw_wait(&cw);
    pthread_join(th, NULL);
    assert_int_equal(cw.rc, 0);
    free(cw.json);
    cJSON_Delete(wait_terminal(e.jobs, g_job, 10000));

    /* The cancel could not get through while the claim held its task. */
    assert_false(atomic_load(&g_overtaken));
    /* The claim recorded the task, before the job's cancel and end. */
    int64_t seq = check_history(e.store, g_job);
    assert_true(seq > 0);
    /* It was taken before the cancel came, so it may be handed out; then
     * the worker hears "cancelled" at once. */
    char id[JD_TASK_ID_MAX + 1] = "";
    if (cJSON_GetArraySize(ts) == 1)
        snprintf(id, sizeof id, "%s",
                 cJSON_GetObjectItem(cJSON_GetArrayItem(ts, 0), "id")->valuestring);
    cJSON_Delete(ts);
    if (id[0]) {
        const char *reason;
        assert_int_equal(task_end(e.jobs, id, HEARTBEAT, &reason), JD_ECONFLICT);
        assert_string_equal(reason, "cancelled");
        assert_int_equal(task_end(e.jobs, id, COMPLETE, &reason), JD_ECONFLICT);
        assert_string_equal(reason, "cancelled");
    }
    env_down(&e);
}

static void test_no_task_of_a_cancelled_job_is_handed_out(void **state)
{
    (void)state;
    struct env e;
    env_up(&e, NULL);
    g_store = e.store;
    command_put(e.jobs, "rc2");
    int64_t a = submit(e.jobs, "{\"handler\":\"rc2\",\"args\":{\"n\":1}}");
    wait_waiting(e.jobs, "rc2", 1);
    cJSON *ts = claim(e.jobs, "rc2");
    assert_int_equal(cJSON_GetArraySize(ts), 1);
    char ida[JD_TASK_ID_MAX + 1];
    snprintf(ida, sizeof ida, "%s",
             cJSON_GetObjectItem(cJSON_GetArrayItem(ts, 0), "id")->valuestring);
    cJSON_Delete(ts);
    int64_t b = submit(e.jobs, "{\"handler\":\"rc2\",\"args\":{\"n\":2}}");
    wait_waiting(e.jobs, "rc2", 1);

    /* Both cancels are committed and answered; their processes have not
     * heard of them yet, so both calls are still out. */
    atomic_store(&g_defer_cancel, 1);
    int64_t ids[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        struct done_wait w;
        dw_init(&w);
        assert_int_equal(jd_jobs_cancel(e.jobs, ids[i], done_cb, &w), 0);
        dw_wait(&w);
        assert_int_equal(w.rc, 0);
        free(w.json);
    }
    assert_int_equal(atomic_load(&g_ndeferred), 2);

    /* b's task is not handed out any more ... */
    ts = claim(e.jobs, "rc2");
    assert_int_equal(cJSON_GetArraySize(ts), 0);
    cJSON_Delete(ts);
    /* ... and a's worker hears "cancelled" whatever it sends. */
    const char *reason;
    assert_int_equal(task_end(e.jobs, ida, COMPLETE, &reason), JD_ECONFLICT);
    assert_string_equal(reason, "cancelled");
    assert_int_equal(task_end(e.jobs, ida, FAIL, &reason), JD_ECONFLICT);
    assert_string_equal(reason, "cancelled");
    assert_int_equal(task_end(e.jobs, ida, HEARTBEAT, &reason), JD_ECONFLICT);
    assert_string_equal(reason, "cancelled");

    release_cancels();
    for (int i = 0; i < 2; i++) {
        cJSON *job = wait_terminal(e.jobs, ids[i], 10000);
        assert_string_equal(jstate(job), "cancelled");
        cJSON_Delete(job);
    }
    assert_true(check_history(e.store, a) > 0);
    assert_int_equal(check_history(e.store, b), 0); /* never claimed */
    assert_int_equal(task_end(e.jobs, ida, COMPLETE, &reason), JD_ECONFLICT);
    assert_string_equal(reason, "cancelled");

    /* After a restart the store answers for a's task: its row says so. */
    jd_jobs_destroy(e.jobs);
    env_start_jobs(&e, NULL);
    assert_int_equal(task_end(e.jobs, ida, COMPLETE, &reason), JD_ECONFLICT);
    assert_string_equal(reason, "cancelled");
    env_down(&e);
}

/* A forged id that names a real job and one of its events is refused by
 * reading that event alone; the id a claim handed out is found. */
static void test_a_forged_id_is_refused(void **state)
{
    (void)state;
    struct env e;
    env_up(&e, NULL);
    command_put(e.jobs, "rc3");
    int64_t a = submit(e.jobs, "{\"handler\":\"rc3\",\"args\":{}}");
    wait_waiting(e.jobs, "rc3", 1);
    cJSON *ts = claim(e.jobs, "rc3");
    assert_int_equal(cJSON_GetArraySize(ts), 1);
    char id[JD_TASK_ID_MAX + 1], base[JD_TASK_ID_MAX + 1];
    snprintf(id, sizeof id, "%s",
             cJSON_GetObjectItem(cJSON_GetArrayItem(ts, 0), "id")->valuestring);
    cJSON_Delete(ts);
    int64_t seq = jd_task_id_claim(id, base);
    assert_true(seq > 0);
    assert_int_equal(jd_task_id_job(id), a);
    const char *reason;
    assert_int_equal(task_end(e.jobs, id, COMPLETE, &reason), 0);
    cJSON_Delete(wait_terminal(e.jobs, a, 10000));

    int st = 0;
    int64_t job = 0;
    assert_int_equal(jd_task_stored_state(e.store, id, &st, &job), 0);
    assert_int_equal(st, JD_TASK_COMPLETED);
    assert_int_equal(job, a);
    /* The same event with other hex, another event, the id without its
     * seq: none was handed out. */
    char forged[JD_TASK_ID_MAX + 1];
    snprintf(forged, sizeof forged, "%lld-%lld-%032d", (long long)a, (long long)seq, 7);
    assert_int_equal(jd_task_stored_state(e.store, forged, &st, &job), JD_ENOENT);
    snprintf(forged, sizeof forged, "%lld-%lld-%s", (long long)a, (long long)seq + 1,
             id + strlen(id) - 32);
    assert_int_equal(jd_task_stored_state(e.store, forged, &st, &job), JD_ENOENT);
    snprintf(forged, sizeof forged, "%lld-1000000-%s", (long long)a, id + strlen(id) - 32);
    assert_int_equal(jd_task_stored_state(e.store, forged, &st, &job), JD_ENOENT);
    /* An id handed out before ids carried the seq names the event's own
     * task: still found, in the job's last events. */
    assert_int_equal(jd_task_stored_state(e.store, base, &st, &job), 0);
    assert_int_equal(st, JD_TASK_COMPLETED);
    snprintf(forged, sizeof forged, "%lld-%032d", (long long)a, 7);
    assert_int_equal(jd_task_stored_state(e.store, forged, &st, &job), JD_ENOENT);
    assert_int_equal(task_end(e.jobs, forged, COMPLETE, &reason), JD_ENOENT);
    env_down(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_cancel_does_not_overtake_a_claims_record),
        cmocka_unit_test(test_no_task_of_a_cancelled_job_is_handed_out),
        cmocka_unit_test(test_a_forged_id_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
