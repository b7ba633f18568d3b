/*
 * Unit tests for the schedule part of storage/: the schedule row and its
 * history, and the promise the schedule engine builds on: a fire's
 * decision (row update + history event) and its job insert commit together
 * or not at all, and the job's idempotency key makes a second job for the
 * same fire time impossible.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "storage/store.h"
#include "store_test_util.h"

struct fx {
    char *dir, *path;
    struct jd_store *s;
};

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    f->dir = scratch_dir();
    f->path = test_db_path(f->dir);
    struct jd_store_config cfg = {.path = f->path};
    struct jd_error err;
    if (jd_store_open(&cfg, &f->s, &err) != 0)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    jd_store_close(f->s);
    rm_tree(f->dir);
    free(f->dir);
    free(f->path);
    free(f);
    return 0;
}

static int put_wait(struct jd_store *s, const char *id, const char *def, int64_t next,
                    const char *event)
{
    struct jd_write w = {.op = JD_W_SCHEDULE_PUT};
    w.sched = (struct jd_schedule_write){
        .id = id, .definition = def, .next_fire_ms = next, .anchor_ms = 7, .event = event};
    struct tres r;
    return submit_wait(s, &w, &r);
}

/* The records of one fire, as the engine builds them. */
struct fire {
    struct jd_job job;
    char key[96];
    struct jd_write change, insert;
    struct tres r[2];
};

static int fire_wait(struct jd_store *s, struct fire *f, const char *id, int64_t fire_ms,
                     int64_t next_ms)
{
    memset(f, 0, sizeof *f);
    snprintf(f->key, sizeof f->key, "schedule:%s:%lld", id, (long long)fire_ms);
    f->job = make_job(jd_store_next_id(s), "default", f->key);
    f->job.schedule_id = (char *)id;
    f->change.op = JD_W_SCHEDULE_CHANGE;
    f->change.sched = (struct jd_schedule_write){.id = id,
                                                 .set = JD_SSET_NEXT_FIRE | JD_SSET_LAST,
                                                 .next_fire_ms = next_ms,
                                                 .last_fire_ms = fire_ms,
                                                 .last_job_id = f->job.id,
                                                 .last_outcome = "fired",
                                                 .add_fires = 1,
                                                 .event = "fired",
                                                 .event_fire_ms = fire_ms,
                                                 .event_job_id = f->job.id};
    f->insert.op = JD_W_JOB_INSERT;
    f->insert.job = &f->job;
    struct jd_write *ws[2] = {&f->change, &f->insert};
    for (int i = 0; i < 2; i++) {
        f->r[i].rc = 12345;
        ws[i]->done = tres_done;
        ws[i]->arg = &f->r[i];
    }
    int rc = jd_store_submit_many(s, ws, 2);
    if (rc == 0)
        rc = jd_store_sync(s);
    if (rc == 0 && f->r[0].rc != f->r[1].rc)
        return 99999; /* a group is all or nothing */
    return rc ? rc : f->r[0].rc;
}

static void test_put_get_and_replace_keep_history_and_counts(void **state)
{
    struct fx *f = *state;
    assert_int_equal(put_wait(f->s, "nightly", "{\"cron\":\"0 3 * * *\"}", 1000, "created"), 0);
    struct jd_schedule_row row;
    assert_int_equal(jd_store_schedule_get(f->s, "nightly", &row), 0);
    assert_string_equal(row.definition, "{\"cron\":\"0 3 * * *\"}");
    assert_true(row.next_fire_ms == 1000);
    assert_true(row.anchor_ms == 7);
    assert_int_equal(row.event_seq, 1);
    assert_false(row.paused);
    jd_schedule_row_clear(&row);

    struct fire fi;
    assert_int_equal(fire_wait(f->s, &fi, "nightly", 1000, 2000), 0);
    assert_int_equal(put_wait(f->s, "nightly", "{\"every\":\"1m\"}", 60000, "replaced"), 0);
    assert_int_equal(jd_store_schedule_get(f->s, "nightly", &row), 0);
    assert_string_equal(row.definition, "{\"every\":\"1m\"}");
    assert_true(row.next_fire_ms == 60000);
    assert_int_equal(row.fires, 1); /* a replace keeps what happened */
    assert_true(row.last_fire_ms == 1000);
    assert_true(row.last_job_id == fi.job.id);
    assert_string_equal(row.last_outcome, "fired");
    assert_int_equal(row.event_seq, 3);
    jd_schedule_row_clear(&row);

    struct jd_schedule_event *ev;
    size_t n;
    assert_int_equal(jd_store_schedule_events(f->s, "nightly", 0, 100, &ev, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(ev[0].kind, "created");
    assert_string_equal(ev[1].kind, "fired");
    assert_true(ev[1].fire_ms == 1000 && ev[1].job_id == fi.job.id);
    assert_string_equal(ev[2].kind, "replaced");
    assert_int_equal(ev[2].seq, 3);
    jd_schedule_events_free(ev, n);
    assert_int_equal(jd_store_schedule_get(f->s, "nope", &row), JD_ENOENT);
}

static void test_fire_commits_row_event_and_job_together(void **state)
{
    struct fx *f = *state;
    assert_int_equal(put_wait(f->s, "s1", "{}", 1000, NULL), 0);
    struct fire fi;
    assert_int_equal(fire_wait(f->s, &fi, "s1", 1000, 2000), 0);
    struct jd_job job;
    assert_int_equal(jd_store_job_get(f->s, fi.job.id, &job), 0);
    assert_string_equal(job.idempotency_key, "schedule:s1:1000");
    assert_string_equal(job.schedule_id, "s1");
    jd_job_clear(&job);

    /* The same fire time again (a crash between commit and timer, replayed):
     * the key refuses the job, and the group takes the row update and the
     * event down with it. */
    struct fire again;
    assert_int_equal(fire_wait(f->s, &again, "s1", 1000, 9999), JD_EEXIST);
    assert_true(again.insert.job_id == fi.job.id); /* told which job has the key */
    struct jd_schedule_row row;
    assert_int_equal(jd_store_schedule_get(f->s, "s1", &row), 0);
    assert_true(row.next_fire_ms == 2000);
    assert_int_equal(row.fires, 1);
    assert_int_equal(row.event_seq, 1);
    jd_schedule_row_clear(&row);
    assert_int_equal(jd_store_job_get(f->s, again.job.id, &job), JD_ENOENT);

    /* a fire for a schedule deleted meanwhile inserts no job */
    struct fire orphan;
    assert_int_equal(fire_wait(f->s, &orphan, "gone", 1000, 2000), JD_ENOENT);
    assert_int_equal(jd_store_job_get(f->s, orphan.job.id, &job), JD_ENOENT);
}

static void test_jobs_listed_by_schedule_newest_first(void **state)
{
    struct fx *f = *state;
    assert_int_equal(put_wait(f->s, "a", "{}", 0, NULL), 0);
    assert_int_equal(put_wait(f->s, "b", "{}", 0, NULL), 0);
    struct tres r;
    struct jd_job plain = make_job(jd_store_next_id(f->s), "default", NULL);
    assert_int_equal(insert_wait(f->s, &plain, NULL, &r), 0);
    int64_t ids[5];
    for (int i = 0; i < 5; i++) {
        struct fire fi;
        assert_int_equal(fire_wait(f->s, &fi, i % 2 ? "b" : "a", 1000 * (i + 1), 0), 0);
        ids[i] = fi.job.id;
    }
    assert_int_equal(change_state_wait(f->s, ids[2], JD_JOB_SUCCEEDED, &r), 0);
    struct jd_job_filter q = {.state = -1, .schedule = "a", .limit = 2};
    struct jd_job *rows;
    size_t n;
    int64_t next;
    assert_int_equal(jd_store_job_list(f->s, &q, &rows, &n, &next), 0);
    assert_int_equal(n, 2);
    assert_true(rows[0].id == ids[4] && rows[1].id == ids[2]);
    assert_true(next == ids[2]);
    jd_jobs_free(rows, n);
    q.before_id = next;
    assert_int_equal(jd_store_job_list(f->s, &q, &rows, &n, &next), 0);
    assert_int_equal(n, 1);
    assert_true(rows[0].id == ids[0] && next == 0);
    jd_jobs_free(rows, n);
    q = (struct jd_job_filter){.state = JD_JOB_SUCCEEDED, .schedule = "a", .limit = 10};
    assert_int_equal(jd_store_job_list(f->s, &q, &rows, &n, &next), 0);
    assert_int_equal(n, 1);
    assert_true(rows[0].id == ids[2]);
    jd_jobs_free(rows, n);
    q = (struct jd_job_filter){.state = -1, .schedule = "zzz", .limit = 10};
    assert_int_equal(jd_store_job_list(f->s, &q, &rows, &n, &next), 0);
    assert_int_equal(n, 0);
    jd_jobs_free(rows, n);
}

static void test_pause_delete_and_list_pages(void **state)
{
    struct fx *f = *state;
    const char *names[] = {"c", "a", "e", "b", "d"};
    for (int i = 0; i < 5; i++)
        assert_int_equal(put_wait(f->s, names[i], "{}", 1000, "created"), 0);
    struct jd_write w = {.op = JD_W_SCHEDULE_CHANGE};
    w.sched = (struct jd_schedule_write){
        .id = "b", .set = JD_SSET_PAUSED | JD_SSET_NEXT_FIRE, .paused = true, .event = "paused"};
    struct tres r;
    assert_int_equal(submit_wait(f->s, &w, &r), 0);
    w.sched.id = "nope";
    assert_int_equal(submit_wait(f->s, &w, &r), JD_ENOENT);

    struct jd_schedule_row *rows;
    size_t n;
    char *next;
    assert_int_equal(jd_store_schedule_list(f->s, NULL, 2, &rows, &n, &next), 0);
    assert_int_equal(n, 2);
    assert_string_equal(rows[0].id, "a");
    assert_string_equal(rows[1].id, "b");
    assert_true(rows[1].paused && rows[1].next_fire_ms == 0);
    assert_string_equal(next, "b");
    jd_schedule_rows_free(rows, n);
    char *after = next;
    assert_int_equal(jd_store_schedule_list(f->s, after, 10, &rows, &n, &next), 0);
    free(after);
    assert_int_equal(n, 3);
    assert_string_equal(rows[2].id, "e");
    assert_null(next);
    jd_schedule_rows_free(rows, n);

    struct jd_write d = {.op = JD_W_SCHEDULE_DELETE};
    d.sched.id = "c";
    assert_int_equal(submit_wait(f->s, &d, &r), 0);
    assert_int_equal(submit_wait(f->s, &d, &r), JD_ENOENT);
    struct jd_schedule_row row;
    assert_int_equal(jd_store_schedule_get(f->s, "c", &row), JD_ENOENT);
    struct jd_schedule_event *ev;
    assert_int_equal(jd_store_schedule_events(f->s, "c", 0, 10, &ev, &n), 0);
    assert_int_equal(n, 0); /* the history went with it */
    jd_schedule_events_free(ev, n);
    /* re-created under the same id: a fresh history */
    assert_int_equal(put_wait(f->s, "c", "{}", 1000, "created"), 0);
    assert_int_equal(jd_store_schedule_get(f->s, "c", &row), 0);
    assert_int_equal(row.event_seq, 1);
    jd_schedule_row_clear(&row);
}

static void test_history_is_trimmed_to_the_newest(void **state)
{
    struct fx *f = *state;
    assert_int_equal(put_wait(f->s, "busy", "{}", 0, NULL), 0);
    int total = JD_SCHEDULE_EVENTS_KEEP + 300;
    struct jd_write *ws = calloc((size_t)total, sizeof *ws);
    struct tres *rs = calloc((size_t)total, sizeof *rs);
    for (int i = 0; i < total; i++) {
        ws[i].op = JD_W_SCHEDULE_CHANGE;
        ws[i].sched = (struct jd_schedule_write){
            .id = "busy", .add_skips = 1, .event = "skipped", .event_fire_ms = i + 1};
        ws[i].done = tres_done;
        ws[i].arg = &rs[i];
        assert_int_equal(jd_store_submit(f->s, &ws[i]), 0);
    }
    assert_int_equal(jd_store_sync(f->s), 0);
    for (int i = 0; i < total; i++)
        assert_int_equal(rs[i].rc, 0);
    struct jd_schedule_event *ev;
    size_t n;
    assert_int_equal(jd_store_schedule_events(f->s, "busy", 0, 10000, &ev, &n), 0);
    assert_true(n >= JD_SCHEDULE_EVENTS_KEEP && n < JD_SCHEDULE_EVENTS_KEEP + 64);
    assert_int_equal(ev[n - 1].seq, total);
    assert_true(ev[n - 1].fire_ms == total);
    jd_schedule_events_free(ev, n);
    struct jd_schedule_row row;
    assert_int_equal(jd_store_schedule_get(f->s, "busy", &row), 0);
    assert_int_equal(row.skips, total);
    jd_schedule_row_clear(&row);
    free(ws);
    free(rs);
}

/* A fire made conditional on the row's next_fire_ms commits once: a
 * second attempt at the same occurrence (another node's, in a cluster) is
 * JD_ECONFLICT and changes nothing; a missing schedule stays JD_ENOENT. */
static void test_a_conditional_fire_commits_once(void **state)
{
    struct fx *f = *state;
    assert_int_equal(put_wait(f->s, "tick", "{}", 1000, NULL), 0);
    struct jd_write w = {.op = JD_W_SCHEDULE_CHANGE};
    w.sched = (struct jd_schedule_write){.id = "tick",
                                         .set = JD_SSET_NEXT_FIRE,
                                         .next_fire_ms = 2000,
                                         .add_fires = 1,
                                         .expect_next_fire_ms = 1000,
                                         .event = "fired"};
    struct tres r;
    assert_int_equal(submit_wait(f->s, &w, &r), 0);
    assert_int_equal(submit_wait(f->s, &w, &r), JD_ECONFLICT);
    struct jd_schedule_row row;
    assert_int_equal(jd_store_schedule_get(f->s, "tick", &row), 0);
    assert_int_equal(row.fires, 1);
    assert_int_equal(row.next_fire_ms, 2000);
    jd_schedule_row_clear(&row);
    struct jd_schedule_event *ev;
    size_t n;
    assert_int_equal(jd_store_schedule_events(f->s, "tick", 0, 10, &ev, &n), 0);
    assert_int_equal(n, 1);
    jd_schedule_events_free(ev, n);
    w.sched.id = "nope";
    assert_int_equal(submit_wait(f->s, &w, &r), JD_ENOENT);
    /* an unconditional change still applies whatever next_fire_ms is */
    w.sched.id = "tick";
    w.sched.expect_next_fire_ms = 0;
    assert_int_equal(submit_wait(f->s, &w, &r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_get_and_replace_keep_history_and_counts, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_fire_commits_row_event_and_job_together, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_jobs_listed_by_schedule_newest_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pause_delete_and_list_pages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_history_is_trimmed_to_the_newest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_conditional_fire_commits_once, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
