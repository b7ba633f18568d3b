/*
 * Durable replay (jd_jobs_create resuming jobs): histories are written
 * straight into a store as a crashed run would have left them, then the job
 * layer is started on it. Checks: a step whose completion is recorded is
 * delivered from the record and never dispatched again; a dispatched but
 * uncompleted step is dispatched again with attempt = recorded + 1 and the
 * key "<job_id>:<tag>"; a yield that differs from the record fails the job
 * with "nondeterminism"; sleeps keep their recorded deadlines; recorded
 * messages are re-delivered in order; a manual retry's earlier run is
 * ignored; queued jobs keep their run_at.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "jobs_test_util.h"

struct put_wait {
    sem_t sem;
    int rc;
};

static void put_done(void *arg, struct jd_write *w, int rc)
{
    (void)w;
    struct put_wait *p = arg;
    p->rc = rc;
    sem_post(&p->sem);
}

static void put(struct jd_store *s, struct jd_write *w)
{
    struct put_wait p = {0};
    sem_init(&p.sem, 0, 0);
    w->done = put_done;
    w->arg = &p;
    assert_int_equal(jd_store_submit(s, w), 0);
    sem_wait_ms(&p.sem, 5000);
    sem_destroy(&p.sem);
    assert_int_equal(p.rc, 0);
}

static int64_t put_job(struct jd_store *s, const char *def, enum jd_job_state state,
                       uint32_t attempts, int64_t run_at_ms)
{
    int64_t id = jd_store_next_id(s);
    int64_t now = jd_wall_ms();
    struct jd_job job = {.id = id,
                         .queue = "default",
                         .state = JD_JOB_QUEUED,
                         .definition = (char *)def,
                         .run_at_ms = run_at_ms ? run_at_ms : now,
                         .created_ms = now};
    struct jd_write w = {.op = JD_W_JOB_INSERT, .job_id = id, .job = &job};
    put(s, &w);
    if (state != JD_JOB_QUEUED || attempts) {
        struct jd_write c = {.op = JD_W_JOB_CHANGE,
                             .job_id = id,
                             .set = JD_SET_STATE | JD_SET_ATTEMPTS | JD_SET_STARTED,
                             .state = state,
                             .attempts = attempts,
                             .started_ms = now,
                             .kind = JD_EVK_STATE,
                             .data = "{\"state\":\"running\"}"};
        put(s, &c);
    }
    return id;
}

static void put_event(struct jd_store *s, int64_t id, enum jd_event_kind kind, uint32_t tag,
                      const char *data)
{
    struct jd_write w = {
        .op = JD_W_JOB_CHANGE, .job_id = id, .kind = kind, .tag = tag, .data = data};
    put(s, &w);
}

/* A store with history written, then the job layer started on it. */
static void env_store_only(struct env *e)
{
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "/tmp/jd_replay_test_XXXXXX");
    assert_non_null(mkdtemp(e->dir));
    snprintf(e->db, sizeof e->db, "%s/jd.db", e->dir);
    env_open_store(e);
}

static const char *str(const cJSON *o, const char *path)
{
    const cJSON *v = jget(o, path);
    if (!cJSON_IsString(v))
        fail_msg("%s is not a string", path);
    return v->valuestring;
}

static void test_recorded_steps_are_not_run_again(void **state)
{
    (void)state;
    struct env e;
    env_store_only(&e);
    int64_t id = put_job(e.store,
                         "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{\"v\":1}},"
                         "{\"id\":\"b\",\"call\":\"t.note\"},{\"id\":\"c\",\"call\":\"t.note\"}]}",
                         JD_JOB_RUNNING, 1, 0);
    put_event(e.store, id, JD_EVK_DISPATCH, 1,
              "{\"command\":\"t.echo\",\"attempt\":1,\"args\":{\"v\":1},\"run\":1}");
    put_event(e.store, id, JD_EVK_COMPLETE, 1, "{\"result\":{\"v\":\"recorded\"},\"run\":1}");
    put_event(e.store, id, JD_EVK_DISPATCH, 2,
              "{\"command\":\"t.note\",\"attempt\":1,\"args\":{},\"run\":1}");
    put_event(e.store, id, JD_EVK_DISPATCH, 2,
              "{\"command\":\"t.note\",\"attempt\":2,\"args\":{},\"run\":1}");
    int echo_before = tp_echo_calls, note_before = tp_note_calls;
    env_start_jobs(&e, NULL);
    cJSON *job = wait_terminal(e.jobs, id, 5000);
    assert_string_equal(jstate(job), "succeeded");
    /* a: the recorded result, t.echo never called */
    assert_string_equal(str(job, "output.a.v"), "recorded");
    assert_int_equal(tp_echo_calls, echo_before);
    /* b: dispatched again as attempt 3 with the stable key; c: fresh */
    assert_int_equal((int)jget(job, "output.b.attempt")->valuedouble, 3);
    char key[48];
    snprintf(key, sizeof key, "%lld:2", (long long)id);
    assert_string_equal(str(job, "output.b.key"), key);
    assert_int_equal((int)jget(job, "output.c.attempt")->valuedouble, 1);
    assert_int_equal(tp_note_calls, note_before + 2);
    cJSON_Delete(job);
    env_down(&e);
}

static void test_a_differing_yield_is_nondeterminism(void **state)
{
    (void)state;
    struct env e;
    env_store_only(&e);
    int64_t id =
        put_job(e.store, "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\"}]}", JD_JOB_RUNNING, 1, 0);
    put_event(e.store, id, JD_EVK_DISPATCH, 1,
              "{\"command\":\"t.other\",\"attempt\":1,\"args\":{},\"run\":1}");
    put_event(e.store, id, JD_EVK_COMPLETE, 1, "{\"result\":1,\"run\":1}");
    env_start_jobs(&e, NULL);
    cJSON *job = wait_terminal(e.jobs, id, 5000);
    assert_string_equal(jstate(job), "failed");
    assert_string_equal(str(job, "error.kind"), "nondeterminism");
    assert_non_null(strstr(str(job, "error.message"), "t.other"));
    cJSON_Delete(job);
    env_down(&e);
}

static void test_sleeps_keep_their_recorded_deadline(void **state)
{
    (void)state;
    struct env e;
    env_store_only(&e);
    int64_t now = jd_wall_ms();
    const char *def = "{\"steps\":[{\"id\":\"s\",\"sleep_ms\":60000},{\"id\":\"n\",\"call\":"
                      "\"t.echo\",\"args\":{\"done\":true}}]}";
    int64_t soon = put_job(e.store, def, JD_JOB_RUNNING, 1, 0);
    char data[160];
    snprintf(data, sizeof data,
             "{\"command\":\"$sleep\",\"attempt\":1,\"args\":{\"ms\":60000},\"deadline_ms\":%lld,"
             "\"run\":1}",
             (long long)(now + 400));
    put_event(e.store, soon, JD_EVK_DISPATCH, 1, data);
    int64_t past = put_job(e.store, def, JD_JOB_RUNNING, 1, 0);
    snprintf(data, sizeof data,
             "{\"command\":\"$sleep\",\"attempt\":1,\"args\":{\"ms\":60000},\"deadline_ms\":%lld,"
             "\"run\":1}",
             (long long)(now - 60000));
    put_event(e.store, past, JD_EVK_DISPATCH, 1, data);
    env_start_jobs(&e, NULL);
    cJSON *job = wait_terminal(e.jobs, past, 5000);
    assert_string_equal(jstate(job), "succeeded");
    cJSON_Delete(job);
    job = wait_terminal(e.jobs, soon, 5000);
    assert_string_equal(jstate(job), "succeeded");
    int64_t fin = 0;
    jd_time_parse(str(job, "finished_at"), &fin);
    assert_true(fin >= now + 395);
    assert_true(fin < now + 5000);
    cJSON_Delete(job);
    env_down(&e);
}

static void test_messages_are_redelivered_in_order(void **state)
{
    (void)state;
    struct env e;
    env_store_only(&e);
    int64_t id = put_job(
        e.store, "{\"steps\":[{\"id\":\"w1\",\"wait\":\"x\"},{\"id\":\"w2\",\"wait\":\"x\"}]}",
        JD_JOB_WAITING, 1, 0);
    put_event(e.store, id, JD_EVK_MESSAGE, 0, "{\"topic\":\"x\",\"data\":\"first\",\"run\":1}");
    put_event(e.store, id, JD_EVK_MESSAGE, 0, "{\"topic\":\"x\",\"data\":\"second\",\"run\":1}");
    /* a queued job scheduled for later keeps its run_at */
    int64_t later =
        put_job(e.store, "{\"handler\":\"t.echo\"}", JD_JOB_QUEUED, 0, jd_wall_ms() + 300);
    env_start_jobs(&e, NULL);
    cJSON *job = wait_terminal(e.jobs, id, 5000);
    assert_string_equal(jstate(job), "succeeded");
    assert_string_equal(str(job, "output.w1"), "first");
    assert_string_equal(str(job, "output.w2"), "second");
    cJSON_Delete(job);
    job = job_get(e.jobs, later);
    assert_string_equal(jstate(job), "queued");
    cJSON_Delete(job);
    job = wait_terminal(e.jobs, later, 5000);
    assert_string_equal(jstate(job), "succeeded");
    cJSON_Delete(job);
    env_down(&e);
}

static void test_an_earlier_runs_history_is_ignored(void **state)
{
    (void)state;
    struct env e;
    env_store_only(&e);
    /* Run 1 completed tag 1; the job was retried by hand (attempts 2). */
    int64_t id =
        put_job(e.store, "{\"steps\":[{\"id\":\"a\",\"call\":\"t.note\"}]}", JD_JOB_RUNNING, 2, 0);
    put_event(e.store, id, JD_EVK_DISPATCH, 1,
              "{\"command\":\"t.note\",\"attempt\":1,\"args\":{},\"run\":1}");
    put_event(e.store, id, JD_EVK_COMPLETE, 1, "{\"result\":\"old\",\"run\":1}");
    int before = tp_note_calls;
    env_start_jobs(&e, NULL);
    cJSON *job = wait_terminal(e.jobs, id, 5000);
    assert_string_equal(jstate(job), "succeeded");
    assert_int_equal((int)jget(job, "output.a.attempt")->valuedouble, 1);
    assert_int_equal(tp_note_calls, before + 1);
    cJSON_Delete(job);
    env_down(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recorded_steps_are_not_run_again),
        cmocka_unit_test(test_a_differing_yield_is_nondeterminism),
        cmocka_unit_test(test_sleeps_keep_their_recorded_deadline),
        cmocka_unit_test(test_messages_are_redelivered_in_order),
        cmocka_unit_test(test_an_earlier_runs_history_is_ignored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
