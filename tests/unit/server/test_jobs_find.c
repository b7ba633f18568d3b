/*
 * The job layer's side of issue 19 (server/jobs_find.c, jobs_events.c,
 * jobs_watch.c): a bulk cancel across several chunks while another thread
 * submits matching jobs (the snapshot leaves those alone), the operation
 * table, delete of live and finished jobs, and watch_any's no-lost-wakeup
 * rule. Run under TSan by `make tsan-build` (the bulk thread, the store's
 * completion thread and a submitting thread meet here).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "jobs_test_util.h"

#include <pthread.h>

static cJSON *operation(struct jd_jobs *j, const char *id)
{
    char *json = NULL;
    assert_int_equal(jd_jobs_operation_json(j, id, &json), 0);
    cJSON *o = cJSON_Parse(json);
    free(json);
    return o;
}

static double num(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItem(o, k)->valuedouble;
}

static void submit_batch_wait(struct jd_jobs *j, int n, const char *labels)
{
    char *body = malloc((size_t)n * 128 + 32);
    size_t len = (size_t)sprintf(body, "{\"jobs\":[");
    for (int i = 0; i < n; i++)
        len += (size_t)sprintf(body + len,
                               "%s{\"handler\":\"t.echo\",\"args\":{},\"queue\":\"q\","
                               "\"labels\":%s}",
                               i ? "," : "", labels);
    len += (size_t)sprintf(body + len, "]}");
    struct submit_wait w = {0};
    sem_init(&w.sem, 0, 0);
    struct jd_error err;
    jd_error_clear(&err);
    assert_int_equal(jd_jobs_submit_batch(j, body, len, submit_cb, &w, &err), 0);
    sem_wait_ms(&w.sem, 20000);
    sem_destroy(&w.sem);
    assert_int_equal(w.rc, 0);
    free(w.json);
    free(body);
}

struct submitter {
    struct jd_jobs *j;
    int n;
};

static void *submit_more(void *arg)
{
    struct submitter *s = arg;
    for (int i = 0; i < s->n; i++)
        submit(s->j, "{\"handler\":\"t.echo\",\"args\":{},\"queue\":\"q\","
                     "\"labels\":{\"run\":\"a\"}}");
    return NULL;
}

static size_t count_listed(struct jd_jobs *j, const char *state)
{
    struct jd_jobs_list_query q = {.state = state, .queue = "q", .limit = 1000};
    char *json = NULL;
    struct jd_error err;
    assert_int_equal(jd_jobs_list_json(j, &q, &json, &err), 0);
    cJSON *o = cJSON_Parse(json);
    free(json);
    size_t n = (size_t)cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs"));
    cJSON_Delete(o);
    return n;
}

static void test_bulk_cancel_spans_chunks_and_spares_new_jobs(void **state)
{
    struct env e;
    env_up(&e, NULL);
    struct action_wait aw;
    action_wait_init(&aw);
    assert_int_equal(jd_jobs_queue_pause(e.jobs, "q", true, action_cb, &aw), 0);
    action_wait_done(&aw);
    int n = JD_BULK_CHUNK + 150;
    submit_batch_wait(e.jobs, n, "{\"run\":\"a\"}");

    const char *body = "{\"queue\":\"q\",\"label\":[\"run:a\"]}";
    char *json = NULL;
    bool started = false;
    struct jd_error err;
    assert_int_equal(
        jd_jobs_bulk_start(e.jobs, JD_BULK_CANCEL, body, strlen(body), &json, &started, &err), 0);
    assert_true(started);
    cJSON *op = cJSON_Parse(json);
    free(json);
    char id[32];
    snprintf(id, sizeof id, "%s", cJSON_GetObjectItem(op, "id")->valuestring);
    cJSON_Delete(op);

    struct submitter s = {.j = e.jobs, .n = 40};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, submit_more, &s), 0);
    cJSON *o = NULL;
    for (int i = 0; i < 2000; i++) {
        cJSON_Delete(o);
        o = operation(e.jobs, id);
        if (strcmp(cJSON_GetObjectItem(o, "state")->valuestring, "running") != 0)
            break;
        usleep(5000);
    }
    pthread_join(t, NULL);
    assert_string_equal(cJSON_GetObjectItem(o, "state")->valuestring, "succeeded");
    assert_int_equal((int)num(o, "matched"), n);
    assert_int_equal((int)num(o, "applied"), n);
    assert_int_equal((int)num(o, "skipped"), 0);
    assert_int_equal((int)num(o, "failed"), 0);
    assert_false(cJSON_IsNull(cJSON_GetObjectItem(o, "finished_at")));
    cJSON_Delete(o);
    assert_int_equal(count_listed(e.jobs, "queued"), (size_t)s.n); /* new ones untouched */
    assert_int_equal(count_listed(e.jobs, "cancelled"), (size_t)n);

    /* the same filter again: the cancelled ones are skipped */
    assert_int_equal(
        jd_jobs_bulk_start(e.jobs, JD_BULK_RETRY, body, strlen(body), &json, &started, &err), 0);
    assert_true(started);
    free(json);
    /* nothing matching: done at once, not kept */
    const char *none = "{\"label\":\"run:zzz\"}";
    assert_int_equal(
        jd_jobs_bulk_start(e.jobs, JD_BULK_CANCEL, none, strlen(none), &json, &started, &err), 0);
    assert_false(started);
    assert_non_null(strstr(json, "\"matched\":0"));
    free(json);
    /* bad bodies */
    const char *empty = "{}";
    assert_int_equal(
        jd_jobs_bulk_start(e.jobs, JD_BULK_CANCEL, empty, strlen(empty), &json, &started, &err),
        JD_EINVAL);
    assert_string_equal(err.pointer, "");
    const char *unk = "{\"queue\":\"q\",\"x\":1}";
    assert_int_equal(
        jd_jobs_bulk_start(e.jobs, JD_BULK_CANCEL, unk, strlen(unk), &json, &started, &err),
        JD_EINVAL);
    assert_string_equal(err.pointer, "/x");
    assert_int_equal(jd_jobs_operation_json(e.jobs, "1", &json), JD_ENOENT);
    env_down(&e); /* the retry operation may still run: destroy stops and joins it */
}

static void test_delete_live_and_finished(void **state)
{
    struct env e;
    env_up(&e, NULL);
    int64_t id = submit(e.jobs, "{\"handler\":\"t.echo\",\"args\":{}}");
    cJSON_Delete(wait_terminal(e.jobs, id, 10000));
    struct action_wait aw;
    action_wait_init(&aw);
    assert_int_equal(jd_jobs_delete(e.jobs, id, action_cb, &aw), 0);
    action_wait_done(&aw);
    assert_int_equal(aw.rc, 0);
    char *json = NULL;
    assert_int_equal(jd_jobs_get_json(e.jobs, id, &json, NULL, NULL), JD_ENOENT);
    assert_int_equal(jd_jobs_retry(e.jobs, id, action_cb, &aw), JD_ENOENT);
    /* a job still queued (paused queue) is live: 409 */
    action_wait_init(&aw);
    assert_int_equal(jd_jobs_queue_pause(e.jobs, "held", true, action_cb, &aw), 0);
    action_wait_done(&aw);
    int64_t held = submit(e.jobs, "{\"handler\":\"t.echo\",\"args\":{},\"queue\":\"held\"}");
    assert_int_equal(jd_jobs_delete(e.jobs, held, action_cb, &aw), JD_ECONFLICT);
    env_down(&e);
}

static void test_watch_any_never_misses_a_commit(void **state)
{
    struct env e;
    env_up(&e, NULL);
    uint64_t before = jd_jobs_commits(e.jobs);
    int64_t id = submit(e.jobs, "{\"handler\":\"t.echo\",\"args\":{}}");
    (void)id;
    /* a commit came after `before`: fires at once */
    struct watch_wait w = {0};
    sem_init(&w.sem, 0, 0);
    uint64_t wid = 0;
    assert_int_equal(jd_jobs_watch_any(e.jobs, before, watch_cb, &w, &wid), 0);
    sem_wait_ms(&w.sem, 1000);
    assert_int_equal(w.rc, 0);
    /* up to date: waits for the next commit */
    cJSON_Delete(wait_terminal(e.jobs, id, 10000));
    uint64_t now = jd_jobs_commits(e.jobs);
    assert_int_equal(jd_jobs_watch_any(e.jobs, now, watch_cb, &w, &wid), 0);
    assert_int_not_equal(wid, 0);
    assert_int_equal(sem_trywait(&w.sem), -1);
    submit(e.jobs, "{\"handler\":\"t.echo\",\"args\":{}}");
    sem_wait_ms(&w.sem, 10000);
    sem_destroy(&w.sem);
    /* withdrawn before any commit: never fires */
    struct watch_wait w2 = {0};
    sem_init(&w2.sem, 0, 0);
    assert_int_equal(jd_jobs_watch_any(e.jobs, jd_jobs_commits(e.jobs) + 1000, watch_cb, &w2, &wid),
                     0);
    assert_true(jd_jobs_unwatch(e.jobs, wid));
    sem_destroy(&w2.sem);
    env_down(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bulk_cancel_spans_chunks_and_spares_new_jobs),
        cmocka_unit_test(test_delete_live_and_finished),
        cmocka_unit_test(test_watch_any_never_misses_a_commit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
