/*
 * Durable replay (jd_jobs_create resuming jobs): histories are written
 * straight into a store as a crashed run would have left them, then the job
 * layer is started on it. Checks: a step whose completion is recorded is
 * delivered from the record and never dispatched again; a dispatched but
 * uncompleted step is dispatched again with attempt = recorded + 1 and the
 * key "<job_id>:<tag>"; a yield that differs from the record fails the job
 * with "nondeterminism"; sleeps keep their recorded deadlines; recorded
 * messages are re-delivered in order; a manual retry's earlier run is
 * ignored; queued jobs keep their run_at; a wait step ends on replay by
 * whichever of its timer's completion and its message the history recorded
 * first (and an unrecorded timer firing may lose to a recorded message).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "jobs_test_util.h"

#include <sqlite3.h>

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

/* Write the history of a one-wait workflow ("ok": wait for "approval" with a
 * timeout, then "n": a call) in which the timer was dispatched with deadline
 * `deadline_ms`, then the events `order` names: 't' the timer's completion,
 * 'm' a message "approval". */
static int64_t put_wait_history(struct jd_store *s, int64_t deadline_ms, const char *order)
{
    int64_t id = put_job(s,
                         "{\"steps\":[{\"id\":\"ok\",\"wait\":\"approval\",\"timeout_ms\":60000},"
                         "{\"id\":\"n\",\"call\":\"t.echo\",\"args\":{\"by\":\"${steps.ok."
                         "output}\"}}]}",
                         JD_JOB_WAITING, 1, 0);
    char data[200];
    snprintf(data, sizeof data,
             "{\"command\":\"$timer\",\"attempt\":1,\"args\":{\"ms\":60000},\"deadline_ms\":%lld,"
             "\"run\":1}",
             (long long)deadline_ms);
    put_event(s, id, JD_EVK_DISPATCH, 1, data);
    for (const char *o = order; *o; o++) {
        if (*o == 't')
            put_event(s, id, JD_EVK_COMPLETE, 1, "{\"result\":null,\"run\":1}");
        else
            put_event(s, id, JD_EVK_MESSAGE, 0,
                      "{\"topic\":\"approval\",\"data\":\"ann\",\"run\":1}");
    }
    return id;
}

/* A wait step ends by its message or by its timer, whichever the history
 * records first, whatever the timing of the replay: the timeout fired and was
 * recorded before a message that came meanwhile (then kill -9) must time out
 * again on replay, not take the message; a message recorded before the
 * timer's completion must be taken. Several jobs of each kind resume at once,
 * so the replay's own timing varies between them. */
static void test_a_wait_replays_the_recorded_winner(void **state)
{
    (void)state;
    enum { N = 8 };
    struct env e;
    env_store_only(&e);
    int64_t now = jd_wall_ms();
    int64_t late_msg[N], early_msg[N], fired_only[N];
    for (int i = 0; i < N; i++) {
        /* deadline past or far ahead: the recorded completion decides */
        int64_t dl = i % 2 ? now - 1000 : now + 60000;
        late_msg[i] = put_wait_history(e.store, dl, "tm");
        early_msg[i] = put_wait_history(e.store, dl, "mt");
        fired_only[i] = put_wait_history(e.store, dl, "t");
    }
    int echo_before = tp_echo_calls;
    env_start_jobs(&e, NULL);
    for (int i = 0; i < N; i++) {
        cJSON *job = wait_terminal(e.jobs, late_msg[i], 5000);
        if (strcmp(jstate(job), "failed") != 0)
            fail_msg("job %d (timeout recorded before the message) ended %s, output %s", i,
                     jstate(job), cJSON_PrintUnformatted(jget(job, "output")));
        assert_string_equal(str(job, "error.kind"), "timeout");
        assert_string_equal(str(job, "error.step"), "ok");
        cJSON_Delete(job);

        job = wait_terminal(e.jobs, fired_only[i], 5000);
        assert_string_equal(jstate(job), "failed");
        assert_string_equal(str(job, "error.kind"), "timeout");
        cJSON_Delete(job);

        job = wait_terminal(e.jobs, early_msg[i], 5000);
        assert_string_equal(jstate(job), "succeeded");
        assert_string_equal(str(job, "output.ok"), "ann");
        assert_string_equal(str(job, "output.n.by"), "ann");
        cJSON_Delete(job);
    }
    /* Only the jobs whose message won ran step n. */
    assert_int_equal(tp_echo_calls, echo_before + N);
    env_down(&e);
}

/* A timer that was dispatched but whose firing was never recorded is free
 * to lose to a recorded message (nothing was decided before the crash):
 * the message is taken even though the deadline has passed. */
static void test_an_unrecorded_timeout_loses_to_a_recorded_message(void **state)
{
    (void)state;
    struct env e;
    env_store_only(&e);
    int64_t id = put_wait_history(e.store, jd_wall_ms() - 1000, "m");
    env_start_jobs(&e, NULL);
    cJSON *job = wait_terminal(e.jobs, id, 5000);
    assert_string_equal(jstate(job), "succeeded");
    assert_string_equal(str(job, "output.ok"), "ann");
    cJSON_Delete(job);
    /* ... and the timer's late completion is recorded after the message. */
    cJSON *evs = job_events(e.jobs, id);
    int msg_seq = 0, timer_seq = 0;
    cJSON *ev;
    cJSON_ArrayForEach(ev, cJSON_GetObjectItem(evs, "events"))
    {
        const char *kind = cJSON_GetObjectItem(ev, "kind")->valuestring;
        int seq = (int)cJSON_GetObjectItem(ev, "seq")->valuedouble;
        if (strcmp(kind, "message") == 0)
            msg_seq = seq;
        else if (strcmp(kind, "complete") == 0 && cJSON_GetObjectItem(ev, "tag")->valuedouble == 1)
            timer_seq = seq;
    }
    cJSON_Delete(evs);
    assert_true(msg_seq > 0);
    assert_true(timer_seq == 0 || timer_seq > msg_seq);
    env_down(&e);
}

/* ---- poison jobs: crash counts and quarantine ---- */

static void put_crashes(struct jd_store *s, int64_t id, uint32_t n)
{
    struct jd_write w = {.op = JD_W_JOB_CRASHES, .job_id = id, .crashes = n};
    put(s, &w);
}

/* Close the store and mark the file as a process that died would have left
 * it (meta 'open' still 1), then open it again. */
static void reopen_unclean(struct env *e)
{
    jd_store_close(e->store);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(e->db, &db), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(db, "UPDATE meta SET value = 1 WHERE key = 'open'", NULL, NULL, NULL),
        SQLITE_OK);
    assert_int_equal(sqlite3_changes(db), 1);
    sqlite3_close(db);
    env_open_store(e);
    assert_true(jd_store_unclean(e->store));
}

static uint32_t stored_crashes(struct jd_store *s, int64_t id)
{
    struct jd_job row = {0};
    assert_int_equal(jd_store_job_get(s, id, &row), 0);
    uint32_t n = row.crashes;
    jd_job_clear(&row);
    return n;
}

static int64_t put_hanging_job(struct jd_store *s)
{
    int64_t id =
        put_job(s, "{\"steps\":[{\"id\":\"h\",\"call\":\"t.hang\"}]}", JD_JOB_RUNNING, 1, 0);
    put_event(s, id, JD_EVK_DISPATCH, 1, "{\"command\":\"t.hang\",\"attempt\":1,\"run\":1}");
    return id;
}

/* The store tells a crash from a clean close. */
static void test_the_store_knows_an_unclean_end(void **state)
{
    (void)state;
    struct env e;
    env_store_only(&e);
    assert_false(jd_store_unclean(e.store)); /* a new database */
    jd_store_close(e.store);
    env_open_store(&e);
    assert_false(jd_store_unclean(e.store)); /* closed cleanly */
    reopen_unclean(&e);
    jd_store_close(e.store);
    env_open_store(&e);
    assert_false(jd_store_unclean(e.store)); /* the unclean flag does not stick */
    env_start_jobs(&e, NULL);
    env_down(&e);
}

/* Died running it twice before, and once more now: three in a row. The job
 * fails as quarantined without running, and is counted. */
static void test_a_job_that_keeps_crashing_is_quarantined(void **state)
{
    (void)state;
    struct env e;
    env_store_only(&e);
    int64_t id = put_hanging_job(e.store);
    put_crashes(e.store, id, 2);
    reopen_unclean(&e);
    int started = tp_hang_started;
    env_start_jobs(&e, NULL);
    cJSON *job = wait_terminal(e.jobs, id, 5000);
    assert_string_equal(jstate(job), "failed");
    assert_string_equal(str(job, "error.kind"), "quarantined");
    assert_non_null(strstr(str(job, "error.message"), "3 times in a row"));
    cJSON_Delete(job);
    assert_int_equal(tp_hang_started, started); /* not run again */
    struct jd_jobs_stats st;
    jd_jobs_stats(e.jobs, &st);
    assert_int_equal(st.quarantined, 1);
    assert_int_equal(st.failed, 1);
    jd_store_sync(e.store);
    assert_int_equal(stored_crashes(e.store, id), 0); /* a manual retry starts afresh */
    env_down(&e);
}

/* One crash before, one now: two in a row, so it is replayed, and the new
 * count is durable before the replay runs. Its end puts it back to 0. */
static void test_the_count_is_durable_before_the_replay_runs(void **state)
{
    (void)state;
    struct env e;
    env_store_only(&e);
    int64_t id = put_hanging_job(e.store);
    put_crashes(e.store, id, 1);
    reopen_unclean(&e);
    int started = tp_hang_started;
    env_start_jobs(&e, NULL);
    /* jd_jobs_create returned: the count was committed before t.hang ran. */
    assert_int_equal(stored_crashes(e.store, id), 2);
    for (int i = 0; i < 500 && tp_hang_started == started; i++)
        usleep(10000);
    assert_int_equal(tp_hang_started, started + 1);
    struct action_wait w;
    action_wait_init(&w);
    assert_int_equal(jd_jobs_cancel(e.jobs, id, action_cb, &w), 0);
    action_wait_done(&w);
    cJSON_Delete(wait_terminal(e.jobs, id, 5000));
    jd_store_sync(e.store);
    assert_int_equal(stored_crashes(e.store, id), 0);
    env_down(&e);
}

/* After a clean close nothing died: the count goes back to 0 and the job
 * is replayed whatever it was. */
static void test_a_clean_restart_is_not_a_crash(void **state)
{
    (void)state;
    struct env e;
    env_store_only(&e);
    int64_t id = put_hanging_job(e.store);
    put_crashes(e.store, id, 2);
    jd_store_close(e.store);
    env_open_store(&e);
    env_start_jobs(&e, NULL);
    assert_int_equal(stored_crashes(e.store, id), 0);
    cJSON *job = job_get(e.jobs, id);
    assert_string_equal(jstate(job), "running");
    cJSON_Delete(job);
    env_down(&e);
}

/* A job that was only waiting for a message is not a suspect once its
 * replay went idle: the count goes back to 0 while it still waits. */
static void test_going_idle_ends_the_run_of_crashes(void **state)
{
    (void)state;
    struct env e;
    env_store_only(&e);
    int64_t id =
        put_job(e.store, "{\"steps\":[{\"id\":\"w\",\"wait\":\"x\"}]}", JD_JOB_WAITING, 1, 0);
    put_crashes(e.store, id, 1);
    reopen_unclean(&e);
    env_start_jobs(&e, NULL);
    uint32_t n = 99;
    for (int i = 0; i < 500 && (n = stored_crashes(e.store, id)) != 0; i++)
        usleep(10000);
    assert_int_equal(n, 0);
    cJSON *job = job_get(e.jobs, id);
    assert_string_equal(jstate(job), "waiting");
    cJSON_Delete(job);
    env_down(&e);
}

/* max_replays < 0: never quarantine, however many crashes. */
static void test_quarantine_can_be_turned_off(void **state)
{
    (void)state;
    struct env e;
    env_store_only(&e);
    int64_t id = put_hanging_job(e.store);
    put_crashes(e.store, id, 50);
    reopen_unclean(&e);
    struct jd_jobs_config cfg = {.max_replays = -1};
    env_start_jobs(&e, &cfg);
    assert_int_equal(stored_crashes(e.store, id), 51);
    cJSON *job = job_get(e.jobs, id);
    assert_string_equal(jstate(job), "running");
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
        cmocka_unit_test(test_a_wait_replays_the_recorded_winner),
        cmocka_unit_test(test_an_unrecorded_timeout_loses_to_a_recorded_message),
        cmocka_unit_test(test_the_store_knows_an_unclean_end),
        cmocka_unit_test(test_a_job_that_keeps_crashing_is_quarantined),
        cmocka_unit_test(test_the_count_is_durable_before_the_replay_runs),
        cmocka_unit_test(test_a_clean_restart_is_not_a_crash),
        cmocka_unit_test(test_going_idle_ends_the_run_of_crashes),
        cmocka_unit_test(test_quarantine_can_be_turned_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
