/*
 * The job layer under concurrent use (meant for ThreadSanitizer as much as
 * for its assertions): threads submit workflows that sleep, call, and wait
 * for messages, while others send those messages, cancel a share of the jobs
 * at random moments, watch and unwatch, and read. Every job must end in the
 * state its treatment implies (cancelled only if a cancel was accepted;
 * otherwise succeeded), and each job's history must be seq 1..version with
 * one final state event. JD_STRESS=long runs ten times more jobs. Run
 * twice: all queued jobs in memory, and with a queued-job window of 4.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "jobs_test_util.h"

#include <pthread.h>

#define THREADS 4

static struct env E;
static int per_thread;
static int64_t *ids;           /* [THREADS * per_thread] */
static _Atomic int *cancel_ok; /* 1 if a cancel was accepted for that job */

static void noop_action(void *arg, int rc, const char *json)
{
    (void)arg;
    (void)rc;
    (void)json;
}

static void noop_watch(void *arg, int rc, int64_t version)
{
    (void)arg;
    (void)rc;
    (void)version;
}

static void *submitter(void *arg)
{
    int t = (int)(intptr_t)arg;
    unsigned seed = (unsigned)t * 7919u + 1;
    for (int i = 0; i < per_thread; i++) {
        const char *def =
            (i % 3 == 0)
                ? "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{\"i\":1}},{\"id\":\"w\","
                  "\"wait\":\"go\",\"timeout_ms\":20000},{\"id\":\"b\",\"call\":\"t.echo\"}]}"
            : (i % 3 == 1)
                ? "{\"steps\":[{\"id\":\"g\",\"parallel\":[{\"id\":\"s\",\"sleep_ms\":5},{\"id\":"
                  "\"x\",\"call\":\"t.slow\",\"args\":{\"ms\":3}}]}],\"priority\":3}"
                : "{\"handler\":\"t.echo\",\"args\":{\"v\":\"${job.id}\"},\"queue\":\"q2\"}";
        int64_t id = submit(E.jobs, def);
        ids[t * per_thread + i] = id;
        if (i % 3 == 0) {
            /* send the message now or later: both must work */
            const char *m = "{\"topic\":\"go\",\"data\":1}";
            struct jd_error err;
            jd_jobs_message(E.jobs, id, m, strlen(m), noop_action, NULL, &err);
        }
        if (rand_r(&seed) % 5 == 0) {
            if (jd_jobs_cancel(E.jobs, id, noop_action, NULL) == 0)
                cancel_ok[t * per_thread + i] = 1;
        }
        uint64_t wid = 0;
        if (jd_jobs_watch(E.jobs, id, 1, false, noop_watch, NULL, &wid) == 0 && (i & 1))
            jd_jobs_unwatch(E.jobs, wid);
        if (i % 10 == 0) {
            char *json = NULL;
            struct jd_jobs_list_query q = {.limit = 5};
            struct jd_error err;
            if (jd_jobs_list_json(E.jobs, &q, &json, &err) == 0)
                free(json);
            struct jd_jobs_stats st;
            jd_jobs_stats(E.jobs, &st);
        }
    }
    return NULL;
}

static void queue_pause(const char *q, bool paused)
{
    struct action_wait w;
    action_wait_init(&w);
    assert_int_equal(jd_jobs_queue_pause(E.jobs, q, paused, action_cb, &w), 0);
    action_wait_done(&w);
    assert_int_equal(w.rc, 0);
}

/* window: --queue-window (0: every queued job in memory). */
static void run_concurrent(unsigned window, unsigned max_running)
{
    per_thread = getenv("JD_STRESS") && strcmp(getenv("JD_STRESS"), "long") == 0 ? 600 : 60;
    int n = THREADS * per_thread;
    ids = calloc((size_t)n, sizeof *ids);
    cancel_ok = calloc((size_t)n, sizeof *cancel_ok);
    struct jd_jobs_config cfg = {
        .max_running = max_running, .cancel_grace_ms = 200, .queue_window = window};
    env_up(&E, &cfg);
    /* With a window, the queues stay paused while the threads submit, so
     * the backlog is past the window for sure and most messages and
     * cancels find their job only in the store. */
    static const char *const queues[] = {"default", "q2"};
    for (int k = 0; window && k < 2; k++)
        queue_pause(queues[k], true);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, submitter, (void *)(intptr_t)t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    for (int k = 0; window && k < 2; k++)
        queue_pause(queues[k], false);
    int succeeded = 0, cancelled = 0;
    for (int i = 0; i < n; i++) {
        cJSON *job = wait_terminal(E.jobs, ids[i], 20000);
        const char *s = jstate(job);
        if (strcmp(s, "cancelled") == 0) {
            cancelled++;
            if (!cancel_ok[i])
                fail_msg("job %lld cancelled without a cancel", (long long)ids[i]);
        } else if (strcmp(s, "succeeded") == 0) {
            succeeded++;
        } else {
            char *t = cJSON_PrintUnformatted(job);
            fail_msg("job %lld ended %s: %s", (long long)ids[i], s, t);
        }
        int64_t version = (int64_t)cJSON_GetObjectItem(job, "version")->valuedouble;
        cJSON_Delete(job);
        cJSON *ev = job_events(E.jobs, ids[i]);
        cJSON *arr = cJSON_GetObjectItem(ev, "events");
        assert_int_equal(cJSON_GetArraySize(arr), version);
        int finals = 0, k = 0;
        cJSON *x;
        cJSON_ArrayForEach(x, arr)
        {
            assert_int_equal((int64_t)cJSON_GetObjectItem(x, "seq")->valuedouble, ++k);
            const cJSON *st = jget(x, "data.state");
            if (st && cJSON_IsString(st) &&
                (strcmp(st->valuestring, "succeeded") == 0 ||
                 strcmp(st->valuestring, "cancelled") == 0 ||
                 strcmp(st->valuestring, "failed") == 0))
                finals++;
        }
        assert_int_equal(finals, 1);
        cJSON_Delete(ev);
    }
    printf("# %d jobs: %d succeeded, %d cancelled\n", n, succeeded, cancelled);
    struct jd_jobs_stats st;
    jd_jobs_stats(E.jobs, &st);
    assert_int_equal(st.succeeded, (uint64_t)succeeded);
    assert_int_equal(st.cancelled, (uint64_t)cancelled);
    assert_int_equal(st.running, 0);
    if (window) { /* the backlog did cross the window both ways */
        printf("# window %u: %llu pages, %llu jobs read in, %llu left to the store\n", window,
               (unsigned long long)st.window_pages, (unsigned long long)st.window_in,
               (unsigned long long)st.window_out);
        assert_true(st.window_out > 0 && st.window_in > 0);
    }
    env_down(&E);
    free(ids);
    free((void *)cancel_ok);
}

static void test_concurrent_submit_message_cancel(void **state)
{
    (void)state;
    run_concurrent(0, 16);
}

/* The same with a queued-job window of 4 and few running at once: the
 * backlog crosses the window all the time, messages and cancels reach jobs
 * that are only in the store, and pages race the submits. */
static void test_concurrent_window(void **state)
{
    (void)state;
    run_concurrent(4, 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_submit_message_cancel),
        cmocka_unit_test(test_concurrent_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
