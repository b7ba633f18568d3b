/*
 * Unit tests for storage/: every write and every query of storage/store.h,
 * against a real SQLite file in a scratch directory. Group commit, savepoint
 * isolation and all-or-nothing batches are checked by forcing records into
 * one transaction (a done() callback holds the writer while the test queues
 * the rest).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/clock.h"
#include "common/error.h"
#include "storage/store.h"
#include "store_test_util.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <unistd.h>

struct fx {
    char *dir;
    char *path;
    struct jd_store *s;
};

static int fx_open(struct fx *f, bool sync_full, int64_t retention_ms)
{
    struct jd_store_config cfg = {
        .path = f->path, .sync_full = sync_full, .retention_ms = retention_ms};
    struct jd_error err;
    int rc = jd_store_open(&cfg, &f->s, &err);
    if (rc)
        fprintf(stderr, "open: %s\n", err.message);
    return rc;
}

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    f->dir = scratch_dir();
    f->path = test_db_path(f->dir);
    if (fx_open(f, true, 0) != 0)
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

/* ---- writes ---- */

static void test_insert_then_get_returns_every_field(void **state)
{
    struct fx *f = *state;
    struct tres r;
    struct jd_job j = make_job(jd_store_next_id(f->s), "mail", "key-1");
    j.priority = 7;
    j.run_at_ms = 1700000000123;
    j.created_ms = 1700000000000;
    assert_int_equal(insert_wait(f->s, &j, "fp-1", &r), 0);
    assert_int_equal(r.version, 1);
    assert_int_equal(r.job_id, j.id);

    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->s, j.id, &got), 0);
    assert_int_equal(got.id, j.id);
    assert_string_equal(got.queue, "mail");
    assert_int_equal(got.priority, 7);
    assert_int_equal(got.state, JD_JOB_QUEUED);
    assert_string_equal(got.definition, j.definition);
    assert_int_equal(got.run_at_ms, 1700000000123);
    assert_int_equal(got.attempts, 0);
    assert_int_equal(got.version, 1);
    assert_null(got.output);
    assert_null(got.error);
    assert_int_equal(got.created_ms, 1700000000000);
    assert_int_equal(got.updated_ms, 1700000000000);
    assert_int_equal(got.started_ms, 0);
    assert_int_equal(got.finished_ms, 0);
    assert_string_equal(got.idempotency_key, "key-1");
    jd_job_clear(&got);
    assert_null(got.queue);

    struct jd_job_event *ev;
    size_t n;
    assert_int_equal(jd_store_events(f->s, j.id, 0, 100, &ev, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ev[0].seq, 1);
    assert_int_equal(ev[0].kind, JD_EVK_STATE);
    assert_string_equal(ev[0].data, "{\"state\":\"queued\"}");
    assert_true(ev[0].time_ms > 0);
    jd_job_events_free(ev, n);

    assert_int_equal(jd_store_job_get(f->s, j.id + 1000, &got), JD_ENOENT);
}

static void test_every_change_bumps_version_and_appends_one_event(void **state)
{
    struct fx *f = *state;
    struct tres r;
    struct jd_job j = make_job(jd_store_next_id(f->s), "default", NULL);
    assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);

    struct jd_write w = {.op = JD_W_JOB_CHANGE,
                         .job_id = j.id,
                         .set = JD_SET_STATE | JD_SET_ATTEMPTS | JD_SET_STARTED,
                         .state = JD_JOB_RUNNING,
                         .attempts = 1,
                         .started_ms = 1111,
                         .kind = JD_EVK_STATE};
    assert_int_equal(submit_wait(f->s, &w, &r), 0);
    assert_int_equal(r.version, 2);
    assert_int_equal(
        event_wait(f->s, j.id, JD_EVK_DISPATCH, 1, "{\"command\":\"echo\",\"attempt\":1}", &r), 0);
    assert_int_equal(r.version, 3);
    assert_int_equal(event_wait(f->s, j.id, JD_EVK_COMPLETE, 1, "{\"result\":42}", &r), 0);
    assert_int_equal(r.version, 4);
    struct jd_write fin = {.op = JD_W_JOB_CHANGE,
                           .job_id = j.id,
                           .set = JD_SET_STATE | JD_SET_OUTPUT,
                           .state = JD_JOB_SUCCEEDED,
                           .output = "{\"v\":42}",
                           .kind = JD_EVK_STATE};
    assert_int_equal(submit_wait(f->s, &fin, &r), 0);
    assert_int_equal(r.version, 5);

    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->s, j.id, &got), 0);
    assert_int_equal(got.version, 5);
    assert_int_equal(got.state, JD_JOB_SUCCEEDED);
    assert_int_equal(got.attempts, 1);
    assert_int_equal(got.started_ms, 1111);
    assert_string_equal(got.output, "{\"v\":42}");
    /* a terminal state without an explicit finish time is stamped now */
    assert_true(got.finished_ms > 0);
    assert_true(got.updated_ms >= got.created_ms);
    jd_job_clear(&got);

    struct jd_job_event *ev;
    size_t n;
    assert_int_equal(jd_store_events(f->s, j.id, 0, 100, &ev, &n), 0);
    assert_int_equal(n, 5);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ev[i].seq, (int64_t)i + 1);
    assert_int_equal(ev[1].kind, JD_EVK_STATE);
    assert_string_equal(ev[1].data, "{\"state\":\"running\"}");
    assert_int_equal(ev[2].kind, JD_EVK_DISPATCH);
    assert_int_equal(ev[2].tag, 1);
    assert_int_equal(ev[3].kind, JD_EVK_COMPLETE);
    assert_string_equal(ev[3].data, "{\"result\":42}");
    assert_string_equal(ev[4].data, "{\"state\":\"succeeded\"}");
    jd_job_events_free(ev, n);

    /* after_seq and limit */
    assert_int_equal(jd_store_events(f->s, j.id, 3, 1, &ev, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ev[0].seq, 4);
    jd_job_events_free(ev, n);
    assert_int_equal(jd_store_events(f->s, j.id, 5, 10, &ev, &n), 0);
    assert_int_equal(n, 0);
    jd_job_events_free(ev, n);
    assert_int_equal(jd_store_events(f->s, j.id, 0, 0, &ev, &n), JD_EINVAL);

    /* clearing a field: SET_ERROR with NULL, and re-queue with SET_FINISHED 0 */
    struct jd_write retry = {.op = JD_W_JOB_CHANGE,
                             .job_id = j.id,
                             .set = JD_SET_STATE | JD_SET_OUTPUT | JD_SET_FINISHED | JD_SET_RUN_AT,
                             .state = JD_JOB_QUEUED,
                             .output = NULL,
                             .finished_ms = 0,
                             .run_at_ms = 5,
                             .kind = JD_EVK_STATE};
    assert_int_equal(submit_wait(f->s, &retry, &r), 0);
    assert_int_equal(jd_store_job_get(f->s, j.id, &got), 0);
    assert_null(got.output);
    assert_int_equal(got.finished_ms, 0);
    assert_int_equal(got.run_at_ms, 5);
    assert_int_equal(got.version, 6);
    jd_job_clear(&got);
}

static void test_change_to_missing_job_is_enoent(void **state)
{
    struct fx *f = *state;
    struct tres r;
    assert_int_equal(change_state_wait(f->s, 424242, JD_JOB_RUNNING, &r), JD_ENOENT);
    assert_int_equal(r.version, 0);
    struct jd_write bad = {.op = JD_W_JOB_CHANGE, .job_id = 1, .kind = (enum jd_event_kind)9};
    assert_int_equal(submit_wait(f->s, &bad, &r), JD_EINVAL);
}

static void test_duplicate_idempotency_key_returns_existing_job(void **state)
{
    struct fx *f = *state;
    struct tres r;
    struct jd_job a = make_job(jd_store_next_id(f->s), "default", "order-77");
    assert_int_equal(insert_wait(f->s, &a, "sha256:aaa", &r), 0);
    struct jd_job b = make_job(jd_store_next_id(f->s), "default", "order-77");
    assert_int_equal(insert_wait(f->s, &b, "sha256:bbb", &r), JD_EEXIST);
    assert_int_equal(r.job_id, a.id);
    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->s, b.id, &got), JD_ENOENT);

    int64_t id = 0;
    char *fp = NULL;
    assert_int_equal(jd_store_idem_lookup(f->s, "order-77", &id, &fp), 0);
    assert_int_equal(id, a.id);
    assert_string_equal(fp, "sha256:aaa");
    free(fp);
    assert_int_equal(jd_store_idem_lookup(f->s, "nope", &id, &fp), JD_ENOENT);
    assert_null(fp);
    /* a duplicate job id is refused as well */
    struct jd_job c = make_job(a.id, "default", NULL);
    assert_int_equal(insert_wait(f->s, &c, NULL, &r), JD_EEXIST);
}

/* Holds the writer inside done() until the test has queued the rest, so the
 * rest land in one transaction. */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool entered, open;
};

static void gate_done(void *arg, struct jd_write *w, int rc)
{
    struct gate *g = arg;
    pthread_mutex_lock(&g->mu);
    g->entered = true;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_hold(struct jd_store *s, struct gate *g, struct jd_write *w)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->entered = g->open = false;
    *w = (struct jd_write){.op = JD_W_QUEUE, .queue = "gate", .done = gate_done, .arg = g};
    assert_int_equal(jd_store_submit(s, w), 0);
    pthread_mutex_lock(&g->mu);
    while (!g->entered)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_release(struct gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void test_one_bad_record_fails_alone_in_a_group_commit(void **state)
{
    struct fx *f = *state;
    struct tres r;
    struct jd_job dup = make_job(jd_store_next_id(f->s), "default", "k-dup");
    assert_int_equal(insert_wait(f->s, &dup, NULL, &r), 0);

    struct jd_store_stats before, after;
    struct gate g;
    struct jd_write gw;
    gate_hold(f->s, &g, &gw);
    jd_store_stats(f->s, &before);

    struct jd_job j1 = make_job(jd_store_next_id(f->s), "default", NULL);
    struct jd_job j2 = make_job(jd_store_next_id(f->s), "default", "k-dup");
    struct jd_job j3 = make_job(jd_store_next_id(f->s), "default", NULL);
    struct tres res[5];
    memset(res, 0, sizeof res);
    struct jd_write ws[5] = {
        {.op = JD_W_JOB_INSERT, .job = &j1},
        {.op = JD_W_JOB_INSERT, .job = &j2},
        {.op = JD_W_JOB_CHANGE, .job_id = 987654321, .kind = JD_EVK_MESSAGE, .data = "{}"},
        {.op = JD_W_JOB_INSERT, .job = &j3},
        {.op = JD_W_JOB_CHANGE, .job_id = j1.id, .kind = JD_EVK_MESSAGE, .data = "{\"m\":1}"},
    };
    for (int i = 0; i < 5; i++) {
        ws[i].done = tres_done;
        ws[i].arg = &res[i];
        assert_int_equal(jd_store_submit(f->s, &ws[i]), 0);
    }
    gate_release(&g);
    assert_int_equal(jd_store_sync(f->s), 0);
    jd_store_stats(f->s, &after);

    assert_int_equal(res[0].rc, 0);
    assert_int_equal(res[1].rc, JD_EEXIST);
    assert_int_equal(res[1].job_id, dup.id);
    assert_int_equal(res[2].rc, JD_ENOENT);
    assert_int_equal(res[3].rc, 0);
    assert_int_equal(res[4].rc, 0);
    assert_int_equal(res[4].version, 2); /* saw j1's insert from the same transaction */
    /* the five went into one transaction (plus the sync barrier's own) */
    assert_true(after.commits - before.commits <= 2);
    assert_true(after.batch_hist[2] > before.batch_hist[2]); /* a batch of 5..16 */
    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->s, j3.id, &got), 0);
    jd_job_clear(&got);
    assert_int_equal(jd_store_job_get(f->s, j2.id, &got), JD_ENOENT);
}

static void test_submit_many_is_all_or_nothing(void **state)
{
    struct fx *f = *state;
    struct tres r;
    struct jd_job taken = make_job(jd_store_next_id(f->s), "default", "batch-k");
    assert_int_equal(insert_wait(f->s, &taken, NULL, &r), 0);

    struct gate g;
    struct jd_write gw;
    gate_hold(f->s, &g, &gw);
    struct jd_job a[3], b[3];
    struct jd_write wa[3], wb[3];
    struct jd_write *pa[3], *pb[3];
    struct tres ra[3], rb[3];
    memset(ra, 0, sizeof ra);
    memset(rb, 0, sizeof rb);
    for (int i = 0; i < 3; i++) {
        a[i] = make_job(jd_store_next_id(f->s), "batch", i == 2 ? "batch-k" : NULL);
        b[i] = make_job(jd_store_next_id(f->s), "batch", NULL);
        wa[i] = (struct jd_write){
            .op = JD_W_JOB_INSERT, .job = &a[i], .done = tres_done, .arg = &ra[i]};
        wb[i] = (struct jd_write){
            .op = JD_W_JOB_INSERT, .job = &b[i], .done = tres_done, .arg = &rb[i]};
        pa[i] = &wa[i];
        pb[i] = &wb[i];
    }
    /* both groups and a lone record share one transaction */
    struct jd_job lone = make_job(jd_store_next_id(f->s), "batch", NULL);
    struct tres rl = {0};
    struct jd_write wl = {.op = JD_W_JOB_INSERT, .job = &lone, .done = tres_done, .arg = &rl};
    assert_int_equal(jd_store_submit_many(f->s, pa, 3), 0);
    assert_int_equal(jd_store_submit(f->s, &wl), 0);
    assert_int_equal(jd_store_submit_many(f->s, pb, 3), 0);
    gate_release(&g);
    assert_int_equal(jd_store_sync(f->s), 0);

    struct jd_job got;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ra[i].rc, JD_EEXIST);
        assert_int_equal(ra[i].calls, 1);
        assert_int_equal(jd_store_job_get(f->s, a[i].id, &got), JD_ENOENT);
        assert_int_equal(rb[i].rc, 0);
        assert_int_equal(rb[i].version, 1);
        assert_int_equal(jd_store_job_get(f->s, b[i].id, &got), 0);
        jd_job_clear(&got);
    }
    assert_int_equal(rl.rc, 0);
    assert_int_equal(jd_store_submit_many(f->s, NULL, 0), 0);
}

/* Several records of one job in one transaction (insert, appends, state
 * changes): each gets the next version, the history has every seq once, and
 * the jobs row ends at the last version -- including when the batch is
 * redone with savepoints because another record in it failed. */
static void check_job_history(struct jd_store *s, int64_t id, int64_t last, enum jd_job_state st)
{
    struct jd_job got;
    assert_int_equal(jd_store_job_get(s, id, &got), 0);
    assert_int_equal(got.version, last);
    assert_int_equal(got.state, st);
    assert_true(got.updated_ms >= got.created_ms);
    jd_job_clear(&got);
    struct jd_job_event *ev = NULL;
    size_t n = 0;
    assert_int_equal(jd_store_events(s, id, 0, 100, &ev, &n), 0);
    assert_int_equal(n, (size_t)last);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ev[i].seq, (int64_t)i + 1);
    jd_job_events_free(ev, n);
}

static void run_mixed_batch(struct fx *f, bool with_failure)
{
    struct tres r;
    struct jd_job old = make_job(jd_store_next_id(f->s), "default", NULL);
    assert_int_equal(insert_wait(f->s, &old, NULL, &r), 0);

    struct gate g;
    struct jd_write gw;
    gate_hold(f->s, &g, &gw);
    struct jd_job fresh = make_job(jd_store_next_id(f->s), "default", NULL);
    enum { N = 8 };
    struct jd_write w[N];
    struct tres res[N];
    memset(res, 0, sizeof res);
    w[0] = (struct jd_write){.op = JD_W_JOB_INSERT, .job = &fresh};
    w[1] = (struct jd_write){.op = JD_W_JOB_CHANGE,
                             .job_id = fresh.id,
                             .kind = JD_EVK_DISPATCH,
                             .tag = 1,
                             .data = "{\"command\":\"echo\"}"};
    w[2] = (struct jd_write){
        .op = JD_W_JOB_CHANGE, .job_id = old.id, .kind = JD_EVK_DISPATCH, .tag = 1};
    w[3] = (struct jd_write){.op = JD_W_JOB_CHANGE,
                             .job_id = fresh.id,
                             .kind = JD_EVK_COMPLETE,
                             .tag = 1,
                             .data = "{\"result\":1}"};
    w[4] = (struct jd_write){.op = JD_W_JOB_CHANGE,
                             .job_id = with_failure ? 987654321 : old.id,
                             .kind = JD_EVK_COMPLETE,
                             .tag = 1};
    w[5] = (struct jd_write){.op = JD_W_JOB_CHANGE,
                             .job_id = fresh.id,
                             .set = JD_SET_STATE,
                             .state = JD_JOB_RUNNING,
                             .kind = JD_EVK_STATE};
    w[6] = (struct jd_write){
        .op = JD_W_JOB_CHANGE, .job_id = fresh.id, .kind = JD_EVK_DISPATCH, .tag = 2};
    w[7] = (struct jd_write){.op = JD_W_JOB_CHANGE,
                             .job_id = old.id,
                             .set = JD_SET_STATE,
                             .state = JD_JOB_SUCCEEDED,
                             .kind = JD_EVK_STATE};
    for (int i = 0; i < N; i++) {
        w[i].done = tres_done;
        w[i].arg = &res[i];
        assert_int_equal(jd_store_submit(f->s, &w[i]), 0);
    }
    gate_release(&g);
    assert_int_equal(jd_store_sync(f->s), 0);

    const int64_t want_fresh[N] = {1, 2, 0, 3, 0, 4, 5, 0};
    for (int i = 0; i < N; i++) {
        assert_int_equal(res[i].calls, 1);
        if (want_fresh[i]) {
            assert_int_equal(res[i].rc, 0);
            assert_int_equal(res[i].version, want_fresh[i]);
        }
    }
    assert_int_equal(res[2].version, 2);
    if (with_failure) {
        assert_int_equal(res[4].rc, JD_ENOENT);
        assert_int_equal(res[7].version, 3);
        check_job_history(f->s, old.id, 3, JD_JOB_SUCCEEDED);
    } else {
        assert_int_equal(res[4].version, 3);
        assert_int_equal(res[7].version, 4);
        check_job_history(f->s, old.id, 4, JD_JOB_SUCCEEDED);
    }
    check_job_history(f->s, fresh.id, 5, JD_JOB_RUNNING);
}

static void test_records_of_one_job_in_one_batch_get_consecutive_versions(void **state)
{
    run_mixed_batch(*state, false);
    run_mixed_batch(*state, true);
}

/* The batch path writes history rows 16 to an INSERT when the batch ends
 * (storage/writer.c), a job's consecutive events packed into one row: an
 * event that cannot be inserted (here: its seq already taken, planted
 * behind the writer's back) still fails only its own record, whether its
 * row went in with the first INSERT or the last, and the other records'
 * events all land, in order. */
static void test_a_failing_event_fails_only_its_record(void **state)
{
    test_skip_on_pg(); /* plants the row with SQLite */
    struct fx *f = *state;
    for (int round = 0; round < 2; round++) {
        struct tres r;
        struct jd_job a = make_job(jd_store_next_id(f->s), "default", NULL);
        struct jd_job b = make_job(jd_store_next_id(f->s), "default", NULL);
        assert_int_equal(insert_wait(f->s, &a, NULL, &r), 0);
        assert_int_equal(insert_wait(f->s, &b, NULL, &r), 0);
        sqlite3 *db;
        assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
        sqlite3_busy_timeout(db, 5000);
        char sql[160];
        snprintf(sql, sizeof sql,
                 "INSERT INTO events(job_id, seq, time_ms, kind, tag, data, id)"
                 " VALUES (%lld, 2, 0, 3, 0, NULL, %lld)",
                 (long long)a.id, 900000000LL + round);
        assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(db);

        enum { N = 21 };
        int bad = round == 0 ? 3 : N - 1; /* in the first full buffer, or in the tail */
        struct gate g;
        struct jd_write gw;
        gate_hold(f->s, &g, &gw);
        struct jd_write w[N];
        struct tres res[N];
        memset(res, 0, sizeof res);
        for (int i = 0; i < N; i++) {
            w[i] = (struct jd_write){.op = JD_W_JOB_CHANGE,
                                     .job_id = i == bad ? a.id : b.id,
                                     .kind = JD_EVK_MESSAGE,
                                     .data = "{\"m\":1}",
                                     .done = tres_done,
                                     .arg = &res[i]};
            assert_int_equal(jd_store_submit(f->s, &w[i]), 0);
        }
        gate_release(&g);
        assert_int_equal(jd_store_sync(f->s), 0);
        int64_t v = 1;
        for (int i = 0; i < N; i++) {
            assert_int_equal(res[i].calls, 1);
            if (i == bad) {
                assert_int_equal(res[i].rc, JD_EEXIST);
                continue;
            }
            assert_int_equal(res[i].rc, 0);
            assert_int_equal(res[i].version, ++v);
        }
        check_job_history(f->s, b.id, N, JD_JOB_QUEUED);
        struct jd_job got;
        assert_int_equal(jd_store_job_get(f->s, a.id, &got), 0);
        assert_int_equal(got.version, 1);
        jd_job_clear(&got);
    }
}

/* Submits w[0..n) so that they commit in one batch (the gate holds the
 * writer meanwhile) and waits; res[i] gets each done(). */
static void one_batch(struct jd_store *s, struct jd_write *w, struct tres *res, int n)
{
    struct gate g;
    struct jd_write gw;
    gate_hold(s, &g, &gw);
    memset(res, 0, (size_t)n * sizeof *res);
    for (int i = 0; i < n; i++) {
        w[i].done = tres_done;
        w[i].arg = &res[i];
        assert_int_equal(jd_store_submit(s, &w[i]), 0);
    }
    gate_release(&g);
    assert_int_equal(jd_store_sync(s), 0);
}

/* On the batch path part of a job's row may wait in the writer's slot (an
 * append's version does; a change's fields did in a tried-and-dropped
 * variant): whatever reads jobs rows later in the same batch must still
 * see every earlier record. A job changed twice with a dispatch
 * between keeps the fields of both changes. A failed job that still holds
 * its unique key is retried (queued again) and, in the same batch, a new
 * job asks for its key: a conflict, the retried job holds it again. A
 * failed job is retried and deleted in one batch: the delete loses. Each
 * wrong answer here would be a success, which no redo would correct. */
static void test_deferred_rows_are_seen_by_later_records_of_the_batch(void **state)
{
    struct fx *f = *state;
    struct tres r, res[3];
    struct jd_job a = make_job(jd_store_next_id(f->s), "default", NULL);
    struct jd_job d = make_job(jd_store_next_id(f->s), "default", NULL);
    struct jd_job e = make_job(jd_store_next_id(f->s), "default", NULL);
    assert_int_equal(insert_wait(f->s, &a, NULL, &r), 0);
    struct jd_write wd = {.op = JD_W_JOB_INSERT, .job = &d, .unique_key = "u-deferred"};
    assert_int_equal(submit_wait(f->s, &wd, &r), 0);
    assert_int_equal(insert_wait(f->s, &e, NULL, &r), 0);
    /* failed, d still holding its key (the layer above releases it; the
     * store's take treats a finished holder's key as free) */
    assert_int_equal(change_state_wait(f->s, d.id, JD_JOB_FAILED, &r), 0);
    assert_int_equal(change_state_wait(f->s, e.id, JD_JOB_FAILED, &r), 0);

    struct jd_write w1[3] = {
        {.op = JD_W_JOB_CHANGE,
         .job_id = a.id,
         .set = JD_SET_STATE | JD_SET_STARTED,
         .state = JD_JOB_RUNNING,
         .started_ms = 111,
         .kind = JD_EVK_STATE},
        {.op = JD_W_JOB_CHANGE, .job_id = a.id, .kind = JD_EVK_DISPATCH, .tag = 1},
        {.op = JD_W_JOB_CHANGE,
         .job_id = a.id,
         .set = JD_SET_STATE | JD_SET_OUTPUT | JD_SET_FINISHED,
         .state = JD_JOB_SUCCEEDED,
         .output = "{\"r\":1}",
         .finished_ms = 222,
         .kind = JD_EVK_STATE},
    };
    one_batch(f->s, w1, res, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(res[i].rc, 0);
    check_job_history(f->s, a.id, 4, JD_JOB_SUCCEEDED);
    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->s, a.id, &got), 0);
    assert_int_equal(got.started_ms, 111);
    assert_int_equal(got.finished_ms, 222);
    assert_string_equal(got.output, "{\"r\":1}");
    jd_job_clear(&got);

    struct jd_job b = make_job(jd_store_next_id(f->s), "default", NULL);
    struct jd_write w2[2] = {
        {.op = JD_W_JOB_CHANGE,
         .job_id = d.id,
         .set = JD_SET_STATE,
         .state = JD_JOB_QUEUED,
         .kind = JD_EVK_STATE},
        {.op = JD_W_JOB_INSERT, .job = &b, .unique_key = "u-deferred"},
    };
    one_batch(f->s, w2, res, 2);
    assert_int_equal(res[0].rc, 0);
    assert_int_equal(res[1].rc, JD_ECONFLICT);
    assert_int_equal(res[1].job_id, d.id);
    assert_int_equal(jd_store_job_get(f->s, b.id, &got), JD_ENOENT);

    struct jd_write w3[2] = {
        {.op = JD_W_JOB_CHANGE,
         .job_id = e.id,
         .set = JD_SET_STATE,
         .state = JD_JOB_QUEUED,
         .kind = JD_EVK_STATE},
        {.op = JD_W_JOB_DELETE, .job_id = e.id},
    };
    one_batch(f->s, w3, res, 2);
    assert_int_equal(res[0].rc, 0);
    assert_int_equal(res[1].rc, JD_ECONFLICT);
    check_job_history(f->s, e.id, 3, JD_JOB_QUEUED);
}

/* The writer remembers the version and state its commits left in the jobs
 * they wrote (struct known in writer.c), so a later batch's change skips
 * the read: versions stay consecutive across batches, and a job deleted in
 * between is missing to the next batch, not updated from the memory. */
static void test_a_job_deleted_between_batches_is_missing_to_the_next(void **state)
{
    struct fx *f = *state;
    struct tres r;
    struct jd_job j = make_job(jd_store_next_id(f->s), "default", NULL);
    assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
    assert_int_equal(change_state_wait(f->s, j.id, JD_JOB_RUNNING, &r), 0);
    assert_int_equal(r.version, 2);
    assert_int_equal(event_wait(f->s, j.id, JD_EVK_DISPATCH, 1, "{}", &r), 0);
    assert_int_equal(r.version, 3);
    assert_int_equal(change_state_wait(f->s, j.id, JD_JOB_SUCCEEDED, &r), 0);
    assert_int_equal(r.version, 4);
    check_job_history(f->s, j.id, 4, JD_JOB_SUCCEEDED);
    struct jd_write del = {.op = JD_W_JOB_DELETE, .job_id = j.id};
    assert_int_equal(submit_wait(f->s, &del, &r), 0);
    assert_int_equal(event_wait(f->s, j.id, JD_EVK_COMPLETE, 1, "{}", &r), JD_ENOENT);
    assert_int_equal(change_state_wait(f->s, j.id, JD_JOB_QUEUED, &r), JD_ENOENT);
    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->s, j.id, &got), JD_ENOENT);
}

static void test_max_batch_splits_transactions_but_never_a_group(void **state)
{
    struct fx *f = *state;
    jd_store_close(f->s);
    f->s = NULL;
    struct jd_store_config cfg = {.path = f->path, .sync_full = false, .max_batch = 3};
    struct jd_error err;
    assert_int_equal(jd_store_open(&cfg, &f->s, &err), 0);

    struct gate g;
    struct jd_write gw;
    gate_hold(f->s, &g, &gw);
    struct jd_store_stats before, after;
    jd_store_stats(f->s, &before);
    /* 4 lone records, then a group of 5 (over max_batch), then 2 lone */
    struct jd_job jobs[11];
    struct jd_write ws[11];
    struct tres res[11];
    memset(res, 0, sizeof res);
    for (int i = 0; i < 11; i++) {
        jobs[i] = make_job(jd_store_next_id(f->s), "split", NULL);
        ws[i] = (struct jd_write){
            .op = JD_W_JOB_INSERT, .job = &jobs[i], .done = tres_done, .arg = &res[i]};
    }
    struct jd_write *group[5] = {&ws[4], &ws[5], &ws[6], &ws[7], &ws[8]};
    for (int i = 0; i < 4; i++)
        assert_int_equal(jd_store_submit(f->s, &ws[i]), 0);
    assert_int_equal(jd_store_submit_many(f->s, group, 5), 0);
    for (int i = 9; i < 11; i++)
        assert_int_equal(jd_store_submit(f->s, &ws[i]), 0);
    gate_release(&g);
    assert_int_equal(jd_store_sync(f->s), 0);
    jd_store_stats(f->s, &after);
    for (int i = 0; i < 11; i++) {
        assert_int_equal(res[i].rc, 0);
        assert_int_equal(res[i].calls, 1);
    }
    /* batches: [0 1 2] [3] [group of 5] [9 10] (+ the sync barrier's) */
    uint64_t commits = after.commits - before.commits;
    assert_true(commits >= 4 && commits <= 5);
    assert_int_equal(after.batch_hist[2] - before.batch_hist[2], 1); /* the group: 5..16 */
    assert_int_equal(after.batch_hist[1] - before.batch_hist[1], 2); /* 3 and 2: 2..4 */
    assert_int_equal(after.records - before.records, 11);
}

struct order_log {
    int64_t seen[64];
    int n;
};

static void order_done(void *arg, struct jd_write *w, int rc)
{
    struct order_log *l = arg;
    l->seen[l->n++] = rc == 0 ? w->version : -1;
}

static void test_done_callbacks_fire_in_submission_order(void **state)
{
    struct fx *f = *state;
    struct tres r;
    struct jd_job j = make_job(jd_store_next_id(f->s), "default", NULL);
    assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
    struct order_log log = {0};
    struct jd_write ws[40];
    for (int i = 0; i < 40; i++) {
        ws[i] = (struct jd_write){.op = JD_W_JOB_CHANGE,
                                  .job_id = j.id,
                                  .kind = JD_EVK_MESSAGE,
                                  .data = "{}",
                                  .done = order_done,
                                  .arg = &log};
        assert_int_equal(jd_store_submit(f->s, &ws[i]), 0);
    }
    assert_int_equal(jd_store_sync(f->s), 0);
    assert_int_equal(log.n, 40);
    for (int i = 0; i < 40; i++)
        assert_int_equal(log.seen[i], i + 2);
}

/* With the completion thread, a slow done() no longer holds the writer: later
 * records commit (their rows are readable) while it runs, yet their done()s
 * still wait their turn, and close still fires every one. */
static void test_completion_thread_keeps_order_and_frees_the_writer(void **state)
{
    struct fx *f = *state;
    assert_int_equal(jd_store_done_thread(f->s), 0);
    assert_int_equal(jd_store_done_thread(f->s), 0); /* once is enough */
    struct gate g;
    struct jd_write gw;
    gate_hold(f->s, &g, &gw); /* the completion thread is now inside done() */

    struct order_log log = {0};
    struct jd_job j = make_job(jd_store_next_id(f->s), "default", NULL);
    struct jd_write w = {.op = JD_W_JOB_INSERT, .job = &j, .done = order_done, .arg = &log};
    assert_int_equal(jd_store_submit(f->s, &w), 0);
    struct jd_job got;
    int rc = JD_ENOENT;
    for (int i = 0; i < 500 && rc == JD_ENOENT; i++) {
        rc = jd_store_job_get(f->s, j.id, &got);
        if (rc == JD_ENOENT)
            usleep(10000);
    }
    assert_int_equal(rc, 0); /* committed while the earlier done() still runs */
    jd_job_clear(&got);
    assert_int_equal(log.n, 0); /* but its own done() waits its turn */

    struct jd_write ws[8];
    for (int i = 0; i < 8; i++) {
        ws[i] = (struct jd_write){.op = JD_W_JOB_CHANGE,
                                  .job_id = j.id,
                                  .kind = JD_EVK_MESSAGE,
                                  .data = "{}",
                                  .done = order_done,
                                  .arg = &log};
        assert_int_equal(jd_store_submit(f->s, &ws[i]), 0);
    }
    gate_release(&g);
    assert_int_equal(jd_store_sync(f->s), 0);
    assert_int_equal(log.n, 9);
    for (int i = 0; i < 9; i++)
        assert_int_equal(log.seen[i], i + 1);

    struct jd_write last = {
        .op = JD_W_JOB_CHANGE, .job_id = j.id, .data = "{}", .done = order_done, .arg = &log};
    assert_int_equal(jd_store_submit(f->s, &last), 0);
    jd_store_close(f->s); /* drains the completion thread too */
    f->s = NULL;
    assert_int_equal(log.n, 10);
    assert_int_equal(log.seen[9], 10);
    assert_int_equal(fx_open(f, true, 0), 0);
}

/* ---- reads ---- */

static void test_list_is_newest_first_with_keyset_pages_and_filters(void **state)
{
    struct fx *f = *state;
    struct tres r;
    int64_t ids[25];
    for (int i = 0; i < 25; i++) {
        struct jd_job j = make_job(jd_store_next_id(f->s), i % 2 ? "odd" : "even", NULL);
        ids[i] = j.id;
        assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
        if (i % 5 == 0)
            assert_int_equal(change_state_wait(f->s, j.id, JD_JOB_RUNNING, &r), 0);
    }
    /* all, pages of 10: 25 newest first */
    struct jd_job_filter flt = {.state = -1, .limit = 10};
    int64_t expect = 24, cursor;
    int pages = 0;
    do {
        struct jd_job *rows;
        size_t n;
        assert_int_equal(jd_store_job_list(f->s, &flt, &rows, &n, &cursor), 0);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(rows[i].id, ids[expect--]);
        jd_jobs_free(rows, n);
        flt.before_id = cursor;
        pages++;
    } while (cursor != 0);
    assert_int_equal(pages, 3);
    assert_int_equal(expect, -1);

    /* state filter */
    struct jd_job *rows;
    size_t n;
    flt = (struct jd_job_filter){.state = JD_JOB_RUNNING, .limit = 100};
    assert_int_equal(jd_store_job_list(f->s, &flt, &rows, &n, &cursor), 0);
    assert_int_equal(n, 5);
    assert_int_equal(cursor, 0);
    assert_int_equal(rows[0].id, ids[20]);
    assert_int_equal(rows[4].id, ids[0]);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(rows[i].state, JD_JOB_RUNNING);
    jd_jobs_free(rows, n);

    /* queue filter, paged */
    flt = (struct jd_job_filter){.state = -1, .queue = "odd", .limit = 5};
    assert_int_equal(jd_store_job_list(f->s, &flt, &rows, &n, &cursor), 0);
    assert_int_equal(n, 5);
    assert_int_equal(rows[0].id, ids[23]);
    assert_int_equal(rows[4].id, ids[15]);
    assert_int_equal(cursor, ids[15]);
    jd_jobs_free(rows, n);
    flt.before_id = cursor;
    flt.limit = 100;
    assert_int_equal(jd_store_job_list(f->s, &flt, &rows, &n, &cursor), 0);
    assert_int_equal(n, 7);
    assert_int_equal(cursor, 0);
    jd_jobs_free(rows, n);

    /* queue + state */
    flt = (struct jd_job_filter){.state = JD_JOB_RUNNING, .queue = "odd", .limit = 100};
    assert_int_equal(jd_store_job_list(f->s, &flt, &rows, &n, &cursor), 0);
    assert_int_equal(n, 2); /* i = 5, 15 */
    assert_int_equal(rows[0].id, ids[15]);
    assert_int_equal(rows[1].id, ids[5]);
    jd_jobs_free(rows, n);

    /* an exact last page has no next cursor */
    flt = (struct jd_job_filter){.state = JD_JOB_RUNNING, .limit = 5};
    assert_int_equal(jd_store_job_list(f->s, &flt, &rows, &n, &cursor), 0);
    assert_int_equal(n, 5);
    assert_int_equal(cursor, 0);
    jd_jobs_free(rows, n);

    flt.limit = 0;
    assert_int_equal(jd_store_job_list(f->s, &flt, &rows, &n, &cursor), JD_EINVAL);
    flt.limit = 1001;
    assert_int_equal(jd_store_job_list(f->s, &flt, &rows, &n, &cursor), JD_EINVAL);
}

/* queue_counts is kept by the writer, per transaction: a job inserted and
 * moved twice in one batch (and some then deleted in it), jobs in several queues, history appends,
 * and a batch redone with savepoints (one record fails alone) all leave the counts equal to the
 * jobs' states. */
static void counts_expect(struct jd_store *s, const int64_t want[3][JD_JOB_NSTATES])
{
    struct jd_queue_counts *rows;
    size_t n;
    assert_int_equal(jd_store_queue_counts(s, &rows, &n), 0);
    for (int q = 0; q < 3; q++) {
        char name[8];
        snprintf(name, sizeof name, "cq%d", q);
        const struct jd_queue_counts *row = NULL;
        for (size_t i = 0; i < n; i++)
            if (strcmp(rows[i].queue, name) == 0)
                row = &rows[i];
        assert_non_null(row);
        for (int k = 0; k < JD_JOB_NSTATES; k++)
            assert_int_equal(row->counts[k], want[q][k]);
    }
    jd_queue_counts_free(rows, n);
}

static void test_queue_counts_follow_every_path_of_a_batch(void **state)
{
    struct fx *f = *state;
    enum { N = 30 };
    static struct jd_job jobs[N];
    static struct jd_write ins[N], run[N], app[N], fin[N], del[N];
    static const char *const queues[3] = {"cq0", "cq1", "cq2"};
    int64_t want[3][JD_JOB_NSTATES] = {{0}};
    struct tres r;

    for (int round = 0; round < 2; round++) {
        struct gate g;
        struct jd_write gw;
        gate_hold(f->s, &g, &gw);
        for (int i = 0; i < N; i++) {
            int q = i % 3;
            jobs[i] = make_job(jd_store_next_id(f->s), queues[q], NULL);
            ins[i] = (struct jd_write){.op = JD_W_JOB_INSERT, .job = &jobs[i]};
            assert_int_equal(jd_store_submit(f->s, &ins[i]), 0);
            enum jd_job_state end = JD_JOB_QUEUED;
            if (i % 2 == 0) { /* inserted, started and ended in one batch */
                run[i] = (struct jd_write){.op = JD_W_JOB_CHANGE,
                                           .job_id = jobs[i].id,
                                           .set = JD_SET_STATE,
                                           .state = JD_JOB_RUNNING,
                                           .kind = JD_EVK_STATE};
                app[i] = (struct jd_write){
                    .op = JD_W_JOB_CHANGE, .job_id = jobs[i].id, .kind = JD_EVK_DISPATCH};
                fin[i] = (struct jd_write){.op = JD_W_JOB_CHANGE,
                                           .job_id = jobs[i].id,
                                           .set = JD_SET_STATE,
                                           .state = i % 4 ? JD_JOB_FAILED : JD_JOB_SUCCEEDED,
                                           .kind = JD_EVK_STATE};
                assert_int_equal(jd_store_submit(f->s, &run[i]), 0);
                assert_int_equal(jd_store_submit(f->s, &app[i]), 0);
                assert_int_equal(jd_store_submit(f->s, &fin[i]), 0);
                end = fin[i].state;
                if (i % 6 == 0) { /* and deleted in the same batch (DELETE /v1/jobs/{id}) */
                    del[i] = (struct jd_write){.op = JD_W_JOB_DELETE, .job_id = jobs[i].id};
                    assert_int_equal(jd_store_submit(f->s, &del[i]), 0);
                    continue;
                }
            }
            want[q][end]++;
        }
        struct jd_write missing = {.op = JD_W_JOB_CHANGE,
                                   .job_id = 987654321,
                                   .set = JD_SET_STATE,
                                   .state = JD_JOB_RUNNING,
                                   .kind = JD_EVK_STATE};
        if (round == 1) /* fails alone: the batch is redone with savepoints */
            assert_int_equal(jd_store_submit(f->s, &missing), 0);
        gate_release(&g);
        assert_int_equal(jd_store_sync(f->s), 0);
        counts_expect(f->s, (const int64_t(*)[JD_JOB_NSTATES])want);
    }
    /* a job changed in a later transaction: the writer reads its state */
    assert_int_equal(change_state_wait(f->s, jobs[1].id, JD_JOB_RUNNING, &r), 0);
    want[1][JD_JOB_QUEUED]--;
    want[1][JD_JOB_RUNNING]++;
    counts_expect(f->s, (const int64_t(*)[JD_JOB_NSTATES])want);
}

static void test_queue_counts_include_paused_and_empty_queues(void **state)
{
    struct fx *f = *state;
    struct tres r;
    int64_t first = 0;
    for (int i = 0; i < 6; i++) {
        struct jd_job j = make_job(jd_store_next_id(f->s), i < 4 ? "alpha" : "beta", NULL);
        if (i == 0)
            first = j.id;
        assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
    }
    assert_int_equal(change_state_wait(f->s, first, JD_JOB_RUNNING, &r), 0);
    assert_int_equal(change_state_wait(f->s, first, JD_JOB_FAILED, &r), 0);
    assert_int_equal(change_state_wait(f->s, first + 1, JD_JOB_SUCCEEDED, &r), 0);
    struct jd_write pause = {.op = JD_W_QUEUE, .queue = "zeta", .paused = true};
    assert_int_equal(submit_wait(f->s, &pause, &r), 0);
    struct jd_write pause_b = {.op = JD_W_QUEUE, .queue = "beta", .paused = true};
    assert_int_equal(submit_wait(f->s, &pause_b, &r), 0);

    struct jd_queue_counts *rows;
    size_t n;
    assert_int_equal(jd_store_queue_counts(f->s, &rows, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(rows[0].queue, "alpha");
    assert_false(rows[0].paused);
    assert_int_equal(rows[0].counts[JD_JOB_QUEUED], 2);
    assert_int_equal(rows[0].counts[JD_JOB_RUNNING], 0);
    assert_int_equal(rows[0].counts[JD_JOB_FAILED], 1);
    assert_int_equal(rows[0].counts[JD_JOB_SUCCEEDED], 1);
    assert_string_equal(rows[1].queue, "beta");
    assert_true(rows[1].paused);
    assert_int_equal(rows[1].counts[JD_JOB_QUEUED], 2);
    assert_string_equal(rows[2].queue, "zeta");
    assert_true(rows[2].paused);
    for (int s = 0; s < JD_JOB_NSTATES; s++)
        assert_int_equal(rows[2].counts[s], 0);
    jd_queue_counts_free(rows, n);

    char **names;
    assert_int_equal(jd_store_paused_queues(f->s, &names, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "beta");
    assert_string_equal(names[1], "zeta");
    jd_strings_free(names, n);

    struct jd_write resume = {.op = JD_W_QUEUE, .queue = "beta", .paused = false};
    assert_int_equal(submit_wait(f->s, &resume, &r), 0);
    assert_int_equal(jd_store_paused_queues(f->s, &names, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(names[0], "zeta");
    jd_strings_free(names, n);
}

struct rec_log {
    int64_t ids[16];
    size_t nev[16];
    int kinds[16][8];
    int64_t seqs[16][8];
    int n;
    int stop_after;
};

static int rec_fn(void *arg, const struct jd_job *job, const struct jd_job_event *ev, size_t n)
{
    struct rec_log *l = arg;
    l->ids[l->n] = job->id;
    l->nev[l->n] = n;
    for (size_t i = 0; i < n && i < 8; i++) {
        l->kinds[l->n][i] = ev[i].kind;
        l->seqs[l->n][i] = ev[i].seq;
    }
    l->n++;
    return l->stop_after && l->n >= l->stop_after ? -77 : 0;
}

static void test_recover_returns_non_terminal_jobs_with_their_history(void **state)
{
    struct fx *f = *state;
    struct tres r;
    int64_t id[4];
    for (int i = 0; i < 4; i++) {
        struct jd_job j = make_job(jd_store_next_id(f->s), "default", NULL);
        id[i] = j.id;
        assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
    }
    /* 0: running with a dispatch+completion and a second dispatch */
    assert_int_equal(change_state_wait(f->s, id[0], JD_JOB_RUNNING, &r), 0);
    assert_int_equal(event_wait(f->s, id[0], JD_EVK_DISPATCH, 1, "{}", &r), 0);
    assert_int_equal(event_wait(f->s, id[0], JD_EVK_COMPLETE, 1, "{\"result\":1}", &r), 0);
    assert_int_equal(event_wait(f->s, id[0], JD_EVK_DISPATCH, 2, "{}", &r), 0);
    /* 1: succeeded -> not recovered */
    assert_int_equal(change_state_wait(f->s, id[1], JD_JOB_SUCCEEDED, &r), 0);
    /* 2: waiting with a message and a cancel */
    assert_int_equal(change_state_wait(f->s, id[2], JD_JOB_WAITING, &r), 0);
    assert_int_equal(event_wait(f->s, id[2], JD_EVK_MESSAGE, 0, "{\"topic\":\"t\"}", &r), 0);
    assert_int_equal(event_wait(f->s, id[2], JD_EVK_CANCEL, 0, "{\"reason\":\"x\"}", &r), 0);
    /* 3: queued, no history beyond its insert */

    struct rec_log log;
    memset(&log, 0, sizeof log);
    assert_int_equal(jd_store_recover(f->s, rec_fn, &log), 0);
    assert_int_equal(log.n, 3);
    assert_int_equal(log.ids[0], id[0]);
    assert_int_equal(log.nev[0], 3);
    assert_int_equal(log.kinds[0][0], JD_EVK_DISPATCH);
    assert_int_equal(log.kinds[0][1], JD_EVK_COMPLETE);
    assert_int_equal(log.kinds[0][2], JD_EVK_DISPATCH);
    assert_int_equal(log.seqs[0][0], 3);
    assert_int_equal(log.seqs[0][2], 5);
    assert_int_equal(log.ids[1], id[2]);
    assert_int_equal(log.nev[1], 2);
    assert_int_equal(log.kinds[1][0], JD_EVK_MESSAGE);
    assert_int_equal(log.kinds[1][1], JD_EVK_CANCEL);
    assert_int_equal(log.ids[2], id[3]);
    assert_int_equal(log.nev[2], 0);

    memset(&log, 0, sizeof log);
    log.stop_after = 1;
    assert_int_equal(jd_store_recover(f->s, rec_fn, &log), -77);
    assert_int_equal(log.n, 1);
}

/* ---- packed runs of events (store_impl.h) ---- */

/* How many events rows job id has, read behind the store's back. */
static int64_t event_rows(struct fx *f, int64_t id)
{
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM events WHERE job_id = %lld", (long long)id);
    int64_t n = -1;
    if (test_pg_url()) {
        PGconn *c = PQconnectdb(test_pg_url());
        PGresult *r = PQexec(c, sql);
        if (PQresultStatus(r) == PGRES_TUPLES_OK)
            n = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
        PQfinish(c);
        return n;
    }
    sqlite3 *db;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    if (sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* What a packed job wrote, in order: seq 1 is its insert. */
static const struct {
    int kind;
    uint32_t tag;
    const char *data;
} packed[] = {
    {JD_EVK_STATE, 0, "{\"state\":\"queued\"}"},
    {JD_EVK_STATE, 0, "{\"state\":\"running\"}"},
    {JD_EVK_DISPATCH, 3, "{\"command\":\"x\",\"attempt\":1}"},
    {JD_EVK_MESSAGE, 0, NULL},
    {JD_EVK_MESSAGE, 0, "{\"topic\":\"t\",\"data\":\"h\xc3\xa9llo \xe2\x9c\x93, 1:2,3\"}"},
    {JD_EVK_PROGRESS, 0, ""},
    {JD_EVK_COMPLETE, 3, "{\"result\":{\"n\":\"a\\\"b\"}}"},
    {JD_EVK_STATE, 0, "{\"state\":\"succeeded\"}"},
    {JD_EVK_MESSAGE, 0, "{\"topic\":\"after\"}"},
    {JD_EVK_MESSAGE, 0, "{\"topic\":\"ninth\"}"},
    {JD_EVK_MESSAGE, 0, "{\"topic\":\"tenth\"}"},
};
#define N_PACKED (sizeof packed / sizeof packed[0])

static void check_packed(const struct jd_job_event *ev, size_t n, int64_t first_seq)
{
    for (size_t i = 0; i < n; i++) {
        size_t k = (size_t)(first_seq - 1) + i;
        assert_int_equal(ev[i].seq, (int64_t)k + 1);
        assert_int_equal(ev[i].kind, packed[k].kind);
        assert_int_equal(ev[i].tag, packed[k].tag);
        if (packed[k].data)
            assert_string_equal(ev[i].data, packed[k].data);
        else
            assert_null(ev[i].data);
    }
}

/* A job inserted, then ten changes in one batch (interleaved with another
 * job's): the writer packs a run of a job's consecutive events into one
 * row, and every reader sees each event as before, with its own seq, id,
 * kind, tag and data (NULL, empty, multi-byte and separator characters
 * included). */
static void test_a_batch_packs_a_jobs_run_of_events_and_readers_see_each(void **state)
{
    struct fx *f = *state;
    struct tres r;
    struct jd_job j = make_job(jd_store_next_id(f->s), "pack", NULL);
    struct jd_job o = make_job(jd_store_next_id(f->s), "other", NULL);
    assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
    assert_int_equal(insert_wait(f->s, &o, NULL, &r), 0);
    int64_t last0;
    assert_int_equal(jd_store_event_last_id(f->s, &last0), 0);

    struct jd_write w[N_PACKED - 1 + 2];
    struct tres res[N_PACKED - 1 + 2];
    int nw = 0;
    for (size_t k = 1; k < N_PACKED; k++) {
        w[nw] = (struct jd_write){.op = JD_W_JOB_CHANGE,
                                  .job_id = j.id,
                                  .kind = (enum jd_event_kind)packed[k].kind,
                                  .tag = packed[k].tag,
                                  .data = packed[k].data};
        if (packed[k].kind == JD_EVK_STATE) {
            w[nw].set = JD_SET_STATE;
            w[nw].state = k == 1 ? JD_JOB_RUNNING : JD_JOB_SUCCEEDED;
            w[nw].data = NULL; /* the writer's own {"state":...} */
        }
        nw++;
        if (k == 2 || k == 5) /* the other job's records in between */
            w[nw++] = (struct jd_write){.op = JD_W_JOB_CHANGE,
                                        .job_id = o.id,
                                        .set = JD_SET_STATE,
                                        .state = k == 2 ? JD_JOB_RUNNING : JD_JOB_FAILED,
                                        .kind = JD_EVK_STATE};
    }
    one_batch(f->s, w, res, nw);
    for (int i = 0; i < nw; i++)
        assert_int_equal(res[i].rc, 0);
    /* the insert's row, and the ten changes in runs of at most 8 */
    assert_int_equal(event_rows(f, j.id), 3);
    assert_int_equal(event_rows(f, o.id), 2);

    struct jd_job_event *ev;
    size_t n;
    assert_int_equal(jd_store_events(f->s, j.id, 0, 100, &ev, &n), 0);
    assert_int_equal(n, N_PACKED);
    check_packed(ev, n, 1);
    jd_job_events_free(ev, n);
    /* after a seq in the middle of a packed row, and pages that end in one */
    for (int64_t after = 0; after <= (int64_t)N_PACKED; after++)
        for (unsigned limit = 1; limit <= 4; limit++) {
            assert_int_equal(jd_store_events(f->s, j.id, after, limit, &ev, &n), 0);
            size_t want = N_PACKED - (size_t)after < limit ? N_PACKED - (size_t)after : limit;
            assert_int_equal(n, want);
            check_packed(ev, n, after + 1);
            jd_job_events_free(ev, n);
        }

    /* the global stream: each state event once, with an id of its own, in
     * order, and resuming after any id (one in the middle of a run too) */
    struct jd_event_find q = {.after_id = last0, .limit = 100};
    struct jd_stream_event *se;
    size_t ns;
    int64_t next;
    assert_int_equal(jd_store_event_stream(f->s, &q, &se, &ns, &next), 0);
    assert_int_equal(ns, 4); /* j running, succeeded; o running, failed */
    int64_t ids[4];
    int64_t jrun = 0;
    for (size_t i = 0; i < ns; i++) {
        ids[i] = se[i].id;
        assert_true(i == 0 || se[i].id > se[i - 1].id);
        if (se[i].job_id == j.id) {
            assert_int_equal(se[i].seq, se[i].state == JD_JOB_RUNNING ? 2 : 8);
            assert_string_equal(se[i].data, se[i].state == JD_JOB_RUNNING
                                                ? "{\"state\":\"running\"}"
                                                : "{\"state\":\"succeeded\"}");
            assert_string_equal(se[i].queue, "pack");
            if (se[i].state == JD_JOB_RUNNING)
                jrun = se[i].id;
        }
    }
    assert_true(jrun > 0);
    int64_t last;
    assert_int_equal(jd_store_event_last_id(f->s, &last), 0);
    assert_true(last >= ids[3]);
    assert_int_equal(last - last0 >= (int64_t)N_PACKED - 1 + 2, true);
    jd_stream_events_free(se, ns);
    for (int64_t after = last0; after <= last; after++) {
        q.after_id = after;
        q.limit = 1;
        assert_int_equal(jd_store_event_stream(f->s, &q, &se, &ns, &next), 0);
        size_t k = 0;
        while (k < 4 && ids[k] <= after)
            k++;
        if (k == 4) {
            assert_int_equal(ns, 0);
        } else {
            assert_int_equal(ns, 1);
            assert_int_equal(se[0].id, ids[k]);
            assert_int_equal(next, ids[k]);
        }
        jd_stream_events_free(se, ns);
    }
    /* a state filter applies to each event of a row */
    q = (struct jd_event_find){
        .after_id = last0, .limit = 100, .state_mask = 1u << JD_JOB_SUCCEEDED, .queue = "pack"};
    assert_int_equal(jd_store_event_stream(f->s, &q, &se, &ns, &next), 0);
    assert_int_equal(ns, 1);
    assert_int_equal(se[0].job_id, j.id);
    assert_int_equal(se[0].seq, 8);
    assert_true(se[0].id > jrun);
    assert_true(next >= se[0].id);
    jd_stream_events_free(se, ns);

    /* deleting the job takes every packed event with it */
    struct jd_write del = {.op = JD_W_JOB_DELETE, .job_id = j.id};
    assert_int_equal(submit_wait(f->s, &del, &r), 0);
    assert_int_equal(jd_store_events(f->s, j.id, 0, 100, &ev, &n), 0);
    assert_int_equal(n, 0);
    free(ev);
    assert_int_equal(event_rows(f, j.id), 0);

    /* ids are never handed out again after a reopen */
    jd_store_close(f->s);
    f->s = NULL;
    assert_int_equal(fx_open(f, true, 0), 0);
    struct jd_job k2 = make_job(jd_store_next_id(f->s), "pack", NULL);
    assert_int_equal(insert_wait(f->s, &k2, NULL, &r), 0);
    q = (struct jd_event_find){.after_id = last, .limit = 10};
    assert_int_equal(jd_store_event_stream(f->s, &q, &se, &ns, &next), 0);
    assert_int_equal(ns, 1);
    assert_int_equal(se[0].job_id, k2.id);
    assert_true(se[0].id > last);
    jd_stream_events_free(se, ns);
}

/* Recovery reads a job's events of kind > 0 out of packed rows too (in
 * seq order, state events left out), and the run of a job that is
 * changed again in a later batch goes on in a row of its own. */
static void test_recover_reads_packed_rows(void **state)
{
    struct fx *f = *state;
    struct tres r;
    struct jd_job j = make_job(jd_store_next_id(f->s), "default", NULL);
    assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
    struct jd_write w[4] = {
        {.op = JD_W_JOB_CHANGE,
         .job_id = j.id,
         .set = JD_SET_STATE,
         .state = JD_JOB_RUNNING,
         .kind = JD_EVK_STATE},
        {.op = JD_W_JOB_CHANGE, .job_id = j.id, .kind = JD_EVK_DISPATCH, .tag = 1, .data = "{}"},
        {.op = JD_W_JOB_CHANGE,
         .job_id = j.id,
         .kind = JD_EVK_COMPLETE,
         .tag = 1,
         .data = "{\"result\":1}"},
        {.op = JD_W_JOB_CHANGE, .job_id = j.id, .kind = JD_EVK_DISPATCH, .tag = 2, .data = "{}"},
    };
    struct tres res[4];
    one_batch(f->s, w, res, 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(res[i].rc, 0);
    assert_int_equal(event_wait(f->s, j.id, JD_EVK_MESSAGE, 0, "{\"topic\":\"t\"}", &r), 0);
    assert_int_equal(event_rows(f, j.id), 3);

    struct rec_log log;
    memset(&log, 0, sizeof log);
    assert_int_equal(jd_store_recover(f->s, rec_fn, &log), 0);
    assert_int_equal(log.n, 1);
    assert_int_equal(log.nev[0], 4);
    int kinds[4] = {JD_EVK_DISPATCH, JD_EVK_COMPLETE, JD_EVK_DISPATCH, JD_EVK_MESSAGE};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(log.kinds[0][i], kinds[i]);
        assert_int_equal(log.seqs[0][i], i + 3);
    }
    memset(&log, 0, sizeof log);
    assert_int_equal(jd_store_recover_started(f->s, rec_fn, &log), 0);
    assert_int_equal(log.n, 1);
    assert_int_equal(log.nev[0], 4);
}

/* Run sql (SQLite) or pg_sql (PostgreSQL) on the test's database behind
 * the store's back. */
static void exec_raw(struct fx *f, const char *sql, const char *pg_sql)
{
    if (test_pg_url()) {
        PGconn *c = PQconnectdb(test_pg_url());
        PGresult *r = PQexec(c, pg_sql);
        if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
            fail_msg("%s: %s", pg_sql, PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
        return;
    }
    sqlite3 *db;
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("%s: %s", sql, msg);
    sqlite3_close(db);
}

/* A database from before packed runs (every row one event, no `more`
 * column; PostgreSQL: its sequence stepping by 1) is migrated in place:
 * its rows read as before, new packed rows follow them, and the stream's
 * ids keep rising across both. */
static void test_old_unpacked_history_migrates_and_reads_alongside_packed_rows(void **state)
{
    struct fx *f = *state;
    struct tres r;
    struct jd_job j = make_job(jd_store_next_id(f->s), "old", NULL);
    assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
    assert_int_equal(change_state_wait(f->s, j.id, JD_JOB_RUNNING, &r), 0);
    assert_int_equal(event_wait(f->s, j.id, JD_EVK_DISPATCH, 1, "{\"attempt\":1}", &r), 0);
    assert_int_equal(event_rows(f, j.id), 3);
    jd_store_close(f->s);
    f->s = NULL;
    /* back to the schema before migration 14 (SQLite) / 7 (PostgreSQL) */
    char old_sqlite[128];
    snprintf(old_sqlite, sizeof old_sqlite,
             "ALTER TABLE events DROP COLUMN more; PRAGMA user_version = %d;",
             jd_store_schema_version() - 1);
    exec_raw(f, old_sqlite,
             "DROP VIEW events_all; DROP FUNCTION jd_ev_any(text, bigint, bigint, bigint);"
             " DROP FUNCTION jd_ev_unpack(text); ALTER TABLE events DROP COLUMN more;"
             " ALTER SEQUENCE events_id_seq INCREMENT BY 1;"
             /* and migrations 8 (queue grants) and 9 (watchers), re-run after 7 */
             " DROP TABLE queue_grants, queue_tokens, queue_demand, jd_watchers;"
             " UPDATE meta SET value = 6 WHERE key = 'schema_version';");
    assert_int_equal(fx_open(f, true, 0), 0);
    if (test_pg_url()) { /* a clean close left the job unowned: this node takes it */
        char own[96];
        snprintf(own, sizeof own, "UPDATE jobs SET owner_node = %lld",
                 (long long)jd_store_node_id(f->s));
        exec_raw(f, NULL, own);
    }

    struct jd_job_event *ev;
    size_t n;
    assert_int_equal(jd_store_events(f->s, j.id, 0, 100, &ev, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ev[2].kind, JD_EVK_DISPATCH);
    assert_string_equal(ev[2].data, "{\"attempt\":1}");
    jd_job_events_free(ev, n);
    int64_t last_old;
    assert_int_equal(jd_store_event_last_id(f->s, &last_old), 0);

    struct jd_write w[3] = {
        {.op = JD_W_JOB_CHANGE, .job_id = j.id, .kind = JD_EVK_COMPLETE, .tag = 1, .data = "{}"},
        {.op = JD_W_JOB_CHANGE, .job_id = j.id, .kind = JD_EVK_MESSAGE, .data = "{\"m\":2}"},
        {.op = JD_W_JOB_CHANGE,
         .job_id = j.id,
         .set = JD_SET_STATE,
         .state = JD_JOB_SUCCEEDED,
         .kind = JD_EVK_STATE},
    };
    struct tres res[3];
    one_batch(f->s, w, res, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(res[i].rc, 0);
    assert_int_equal(event_rows(f, j.id), 4);
    assert_int_equal(jd_store_events(f->s, j.id, 2, 100, &ev, &n), 0);
    assert_int_equal(n, 4);
    int kinds[4] = {JD_EVK_DISPATCH, JD_EVK_COMPLETE, JD_EVK_MESSAGE, JD_EVK_STATE};
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ev[i].seq, (int64_t)i + 3);
        assert_int_equal(ev[i].kind, kinds[i]);
    }
    assert_string_equal(ev[3].data, "{\"state\":\"succeeded\"}");
    jd_job_events_free(ev, n);

    /* the stream: queued and running from old rows, succeeded from the new */
    struct jd_event_find q = {.after_id = 0, .limit = 100};
    struct jd_stream_event *se;
    size_t ns;
    int64_t next;
    assert_int_equal(jd_store_event_stream(f->s, &q, &se, &ns, &next), 0);
    assert_int_equal(ns, 3);
    assert_int_equal(se[0].seq, 1);
    assert_int_equal(se[1].seq, 2);
    assert_int_equal(se[2].seq, 6);
    assert_true(se[1].id <= last_old);
    assert_true(se[2].id > last_old);
    jd_stream_events_free(se, ns);
}

/* The task-state rule (a claimed task whose completion is in the job's
 * history reads as completed, unless a later attempt was dispatched)
 * reads events packed in a row, written here by hand in the packed form
 * (store_impl.h) so the test pins the form down too. */
static void test_task_state_reads_completions_packed_in_a_row(void **state)
{
    struct fx *f = *state;
    struct tres r;
    int64_t id[3];
    for (int i = 0; i < 3; i++) {
        struct jd_job j = make_job(jd_store_next_id(f->s), "default", NULL);
        id[i] = j.id;
        assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
    }
    char sql[1024];
    /* 0: dispatch and complete of tag 1 packed behind its running event;
     * 1: tag 1 completed, then its attempt 2 dispatched, in one row;
     * 2: a completion of tag 1 only (the task asks about tag 2) */
    const char *more[3] = {"1,1,0,13:{\"attempt\":1}2,1,0,2:{}",
                           "2,1,0,2:{}1,1,0,13:{\"attempt\":2}",
                           "1,1,0,-1:2,1,0,11:{\"r\":\"\xc3\xa9t\xc3\xa9\"}"};
    for (int pg = 0; pg < 2; pg++) {
        int len = 0;
        for (int i = 0; i < 3; i++)
            len += snprintf(sql + len, sizeof sql - (size_t)len,
                            "INSERT INTO events(job_id, seq, time_ms, kind, tag, data, more%s)"
                            " VALUES (%lld, 2, 0, 0, 0, '{\"state\":\"running\"}', '%s'%s);"
                            "INSERT INTO tasks VALUES ('t%d', %lld, %d, 1, 'c', 1, 'w', 0, 0);",
                            pg ? "" : ", id", (long long)id[i], more[i],
                            pg ? ""
                               : (i == 0   ? ", 900000000"
                                  : i == 1 ? ", 900000010"
                                           : ", 900000020"),
                            i, (long long)id[i], i == 2 ? 2 : 1);
        if (pg == (test_pg_url() != NULL))
            break;
    }
    exec_raw(f, sql, sql);
    int st;
    int64_t job;
    assert_int_equal(jd_store_task_state(f->s, "t0", &st, &job), 0);
    assert_int_equal(st, JD_TASK_COMPLETED);
    assert_int_equal(job, id[0]);
    assert_int_equal(jd_store_task_state(f->s, "t1", &st, &job), 0);
    assert_int_equal(st, JD_TASK_CLAIMED); /* attempt 2 came after it */
    assert_int_equal(jd_store_task_state(f->s, "t2", &st, &job), 0);
    assert_int_equal(st, JD_TASK_CLAIMED); /* no completion for tag 2 */
    /* and the hand-packed rows read back event by event */
    struct jd_job_event *ev;
    size_t n;
    assert_int_equal(jd_store_events(f->s, id[2], 0, 10, &ev, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(ev[2].kind, JD_EVK_DISPATCH);
    assert_null(ev[2].data);
    assert_int_equal(ev[3].seq, 4);
    assert_string_equal(ev[3].data, "{\"r\":\"\xc3\xa9t\xc3\xa9\"}");
    jd_job_events_free(ev, n);
}

static void test_recover_started_merges_running_and_waiting_by_id(void **state)
{
    struct fx *f = *state;
    struct tres r;
    /* states by id: waiting, queued, running, succeeded, waiting, running */
    static const enum jd_job_state st[] = {JD_JOB_WAITING,   JD_JOB_QUEUED,  JD_JOB_RUNNING,
                                           JD_JOB_SUCCEEDED, JD_JOB_WAITING, JD_JOB_RUNNING};
    int64_t id[6];
    for (int i = 0; i < 6; i++) {
        struct jd_job j = make_job(jd_store_next_id(f->s), "default", NULL);
        id[i] = j.id;
        assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
        if (st[i] != JD_JOB_QUEUED)
            assert_int_equal(change_state_wait(f->s, j.id, st[i], &r), 0);
    }
    assert_int_equal(event_wait(f->s, id[4], JD_EVK_MESSAGE, 0, "{\"topic\":\"t\"}", &r), 0);
    struct rec_log log;
    memset(&log, 0, sizeof log);
    assert_int_equal(jd_store_recover_started(f->s, rec_fn, &log), 0);
    assert_int_equal(log.n, 4);
    const int want[] = {0, 2, 4, 5};
    for (int i = 0; i < 4; i++)
        assert_int_equal(log.ids[i], id[want[i]]);
    assert_int_equal(log.nev[2], 1);
    assert_int_equal(log.kinds[2][0], JD_EVK_MESSAGE);
    memset(&log, 0, sizeof log);
    log.stop_after = 3;
    assert_int_equal(jd_store_recover_started(f->s, rec_fn, &log), -77);
    assert_int_equal(log.n, 3);
}

/* ---- the queued-job window (issue 17 item 4) ---- */

struct page_log {
    int64_t ids[64], prio[64], run_at[64];
    size_t nev[64];
    int n;
    int stop_at;
};

static int page_fn(void *arg, const struct jd_job *job, const struct jd_job_event *ev, size_t n)
{
    struct page_log *l = arg;
    (void)ev;
    assert_true(l->n < 64);
    assert_int_equal(job->state, JD_JOB_QUEUED);
    assert_non_null(job->definition);
    l->ids[l->n] = job->id;
    l->prio[l->n] = job->priority;
    l->run_at[l->n] = job->run_at_ms;
    l->nev[l->n] = n;
    l->n++;
    return l->stop_at && l->n >= l->stop_at ? -5 : 0;
}

static int64_t insert_queued(struct jd_store *s, const char *queue, int64_t prio, int64_t created,
                             int64_t run_at)
{
    struct tres r;
    struct jd_job j = make_job(jd_store_next_id(s), queue, NULL);
    j.priority = prio;
    j.created_ms = created;
    j.run_at_ms = run_at;
    assert_int_equal(insert_wait(s, &j, NULL, &r), 0);
    return j.id;
}

/* Reads the whole queue a page of `limit` at a time into l. */
static void read_queue_in_pages(struct jd_store *s, const char *queue, int64_t due, unsigned limit,
                                struct page_log *l)
{
    memset(l, 0, sizeof *l);
    struct jd_queued_pos after = JD_QUEUED_START;
    for (;;) {
        int before = l->n;
        size_t n;
        assert_int_equal(jd_store_queued_page(s, queue, after, due, limit, page_fn, l, &n), 0);
        assert_int_equal((int)n, l->n - before);
        assert_true(n <= limit);
        if (n == 0)
            break;
        after.priority = l->prio[l->n - 1];
        after.id = l->ids[l->n - 1];
    }
}

static void test_queued_page_reads_a_queue_in_run_order_across_pages(void **state)
{
    struct fx *f = *state;
    struct tres r;
    /* q: priorities 0, 5, -3, 5, 0, 9, 0, -3 in id order; one started,
     * one finished, one delayed; another queue interleaved */
    static const int64_t prios[] = {0, 5, -3, 5, 0, 9, 0, -3};
    int64_t id[8];
    for (int i = 0; i < 8; i++) {
        id[i] = insert_queued(f->s, "q", prios[i], 1000, 1000);
        insert_queued(f->s, "other", 100, 1000, 1000);
    }
    int64_t started = insert_queued(f->s, "q", 50, 1000, 1000);
    assert_int_equal(change_state_wait(f->s, started, JD_JOB_RUNNING, &r), 0);
    int64_t done = insert_queued(f->s, "q", 50, 1000, 1000);
    assert_int_equal(change_state_wait(f->s, done, JD_JOB_SUCCEEDED, &r), 0);
    int64_t later = insert_queued(f->s, "q", 5, 1000, 9000);
    /* a message to a queued job comes with it */
    assert_int_equal(event_wait(f->s, id[2], JD_EVK_MESSAGE, 0, "{\"topic\":\"t\"}", &r), 0);

    /* run order: 9, then 5 by id (the delayed one last), 0 by id, -3 by id */
    const int64_t want[] = {id[5], id[1], id[3], later, id[0], id[4], id[6], id[2], id[7]};
    const size_t nwant = sizeof want / sizeof want[0];
    struct page_log l;
    for (unsigned limit = 1; limit <= 10; limit++) {
        read_queue_in_pages(f->s, "q", INT64_MAX, limit, &l);
        assert_int_equal(l.n, (int)nwant);
        for (size_t i = 0; i < nwant; i++)
            assert_int_equal(l.ids[i], want[i]);
    }
    assert_int_equal(l.nev[7], 1); /* id[2]'s message */
    assert_int_equal(l.nev[0], 0);

    /* not yet due: left out, the order of the rest unchanged */
    read_queue_in_pages(f->s, "q", 8999, 2, &l);
    assert_int_equal(l.n, (int)nwant - 1);
    for (int i = 0, k = 0; i < (int)nwant; i++)
        if (want[i] != later)
            assert_int_equal(l.ids[k++], want[i]);

    /* a page starts strictly after its cursor */
    size_t n;
    memset(&l, 0, sizeof l);
    struct jd_queued_pos at = {5, id[3]};
    assert_int_equal(jd_store_queued_page(f->s, "q", at, INT64_MAX, 2, page_fn, &l, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(l.ids[0], later);
    assert_int_equal(l.ids[1], id[0]);

    /* the callback stops a page; its error is returned */
    memset(&l, 0, sizeof l);
    l.stop_at = 2;
    assert_int_equal(
        jd_store_queued_page(f->s, "q", JD_QUEUED_START, INT64_MAX, 5, page_fn, &l, &n), -5);
    assert_int_equal(l.n, 2);

    /* a job that starts leaves the order; an unknown queue has none */
    assert_int_equal(change_state_wait(f->s, id[5], JD_JOB_RUNNING, &r), 0);
    read_queue_in_pages(f->s, "q", INT64_MAX, 4, &l);
    assert_int_equal(l.n, (int)nwant - 1);
    assert_int_equal(l.ids[0], id[1]);
    read_queue_in_pages(f->s, "nope", INT64_MAX, 4, &l);
    assert_int_equal(l.n, 0);

    /* bad arguments */
    assert_int_equal(
        jd_store_queued_page(f->s, "q", JD_QUEUED_START, INT64_MAX, 0, page_fn, &l, &n), JD_EINVAL);
    assert_int_equal(jd_store_queued_page(f->s, "q", JD_QUEUED_START, INT64_MAX,
                                          JD_QUEUED_PAGE_MAX + 1, page_fn, &l, &n),
                     JD_EINVAL);
    assert_int_equal(
        jd_store_queued_page(f->s, NULL, JD_QUEUED_START, INT64_MAX, 5, page_fn, &l, &n),
        JD_EINVAL);
}

static void test_queued_later_reads_delayed_jobs_by_due_time(void **state)
{
    struct fx *f = *state;
    struct tres r;
    insert_queued(f->s, "a", 0, 1000, 1000); /* not delayed */
    int64_t a3 = insert_queued(f->s, "a", 0, 1000, 3000);
    int64_t b2 = insert_queued(f->s, "b", 7, 1000, 2000);
    int64_t a2 = insert_queued(f->s, "a", -1, 1000, 2000);
    int64_t b9 = insert_queued(f->s, "b", 0, 1000, 9000);
    int64_t gone = insert_queued(f->s, "b", 0, 1000, 1500);
    assert_int_equal(change_state_wait(f->s, gone, JD_JOB_CANCELLED, &r), 0);

    struct page_log l;
    memset(&l, 0, sizeof l);
    size_t n;
    /* all, one page */
    assert_int_equal(jd_store_queued_later(f->s, 0, 0, INT64_MAX, 10, page_fn, &l, &n), 0);
    assert_int_equal(n, 4);
    const int64_t want[] = {b2, a2, a3, b9};
    for (int i = 0; i < 4; i++)
        assert_int_equal(l.ids[i], want[i]);
    /* pages of one, from a cursor, bounded by the due time */
    memset(&l, 0, sizeof l);
    int64_t at = 0, aid = 0;
    for (;;) {
        assert_int_equal(jd_store_queued_later(f->s, at, aid, 3000, 1, page_fn, &l, &n), 0);
        if (n == 0)
            break;
        at = l.run_at[l.n - 1];
        aid = l.ids[l.n - 1];
    }
    assert_int_equal(l.n, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(l.ids[i], want[i]);
    /* the next one due after the horizon */
    memset(&l, 0, sizeof l);
    assert_int_equal(jd_store_queued_later(f->s, 3000, a3, INT64_MAX, 1, page_fn, &l, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(l.ids[0], b9);
    assert_int_equal(l.run_at[0], 9000);
    assert_int_equal(jd_store_queued_later(f->s, 0, 0, INT64_MAX, 0, page_fn, &l, &n), JD_EINVAL);
}

static void test_ids_survive_reopen_and_are_never_reused(void **state)
{
    struct fx *f = *state;
    struct tres r;
    int64_t last = 0;
    for (int i = 0; i < 3; i++) {
        struct jd_job j = make_job(jd_store_next_id(f->s), "default", NULL);
        last = j.id;
        assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
    }
    jd_store_close(f->s);
    f->s = NULL;
    assert_int_equal(fx_open(f, false, 0), 0);
    assert_true(jd_store_next_id(f->s) > last);
    assert_int_equal(jd_store_schema_version(), 14);
}

static void test_stats_count_commits_records_and_latency(void **state)
{
    struct fx *f = *state;
    struct tres r;
    struct jd_store_stats st;
    jd_store_stats(f->s, &st);
    uint64_t c0 = st.commits, r0 = st.records;
    for (int i = 0; i < 4; i++) {
        struct jd_job j = make_job(jd_store_next_id(f->s), "default", NULL);
        assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
    }
    jd_store_stats(f->s, &st);
    assert_true(st.commits >= c0 + 4);
    assert_int_equal(st.records, r0 + 4);
    assert_int_equal(st.queue_depth, 0);
    uint64_t hist = 0;
    for (int i = 0; i < 10; i++)
        hist += st.commit_us_hist[i];
    assert_int_equal(hist, st.commits);
    assert_true(st.commit_us_sum > 0);
    assert_int_equal(st.failed_commits, 0);
}

static void test_close_drains_queue_and_fires_every_callback(void **state)
{
    struct fx *f = *state;
    struct tres r;
    struct jd_job j = make_job(jd_store_next_id(f->s), "default", NULL);
    struct jd_write w = {.op = JD_W_JOB_INSERT, .job = &j, .done = tres_done, .arg = &r};
    memset(&r, 0, sizeof r);
    assert_int_equal(jd_store_submit(f->s, &w), 0);
    jd_store_close(f->s); /* drains: the callback has fired */
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.rc, 0);
    f->s = NULL;
    assert_int_equal(fx_open(f, true, 0), 0);
    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->s, j.id, &got), 0);
    jd_job_clear(&got);
}

static void test_wal_is_checkpointed_in_the_background(void **state)
{
    test_skip_on_pg(); /* SQLite's WAL file */
    struct fx *f = *state;
    jd_store_close(f->s);
    f->s = NULL;
    assert_int_equal(fx_open(f, false, 0), 0);
    char *def = malloc(8001);
    memset(def, ' ', 8000);
    def[0] = '[';
    def[7999] = ']';
    def[8000] = '\0';
    /* ~3 pages per insert: past the 2000-frame mark that wakes the checkpointer */
    enum { N = 1200 };
    static struct jd_job jobs[N];
    static struct jd_write ws[N];
    for (int i = 0; i < N; i++) {
        jobs[i] = make_job(jd_store_next_id(f->s), "default", NULL);
        jobs[i].definition = def;
        ws[i] = (struct jd_write){.op = JD_W_JOB_INSERT, .job = &jobs[i]};
        assert_int_equal(jd_store_submit(f->s, &ws[i]), 0);
        if (i % 50 == 49)
            assert_int_equal(jd_store_sync(f->s), 0); /* many commits, not one */
    }
    assert_int_equal(jd_store_sync(f->s), 0);
    struct jd_store_stats st;
    for (int t = 0; t < 300; t++) {
        jd_store_stats(f->s, &st);
        if (st.checkpoints > 0)
            break;
        usleep(10000);
    }
    assert_true(st.checkpoints > 0);
    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->s, jobs[N - 1].id, &got), 0);
    assert_int_equal(strlen(got.definition), 8000);
    jd_job_clear(&got);
    free(def);
}

/* ---- retention ---- */

static void test_retention_deletes_old_terminal_jobs_and_their_history(void **state)
{
    struct fx *f = *state;
    jd_store_close(f->s);
    f->s = NULL;
    assert_int_equal(fx_open(f, false, 60000), 0); /* keep one minute */
    struct tres r;
    int64_t now = jd_wall_ms();
    int64_t old_ids[300], keep[3];
    for (int i = 0; i < 300; i++) { /* more than one retention batch */
        char key[32];
        snprintf(key, sizeof key, "old-%d", i);
        struct jd_job j = make_job(jd_store_next_id(f->s), "ret", i == 0 ? key : NULL);
        j.definition = (char *)"{\"handler\":\"echo\",\"labels\":{\"team\":\"old\"}}";
        old_ids[i] = j.id;
        assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
        struct jd_write w = {.op = JD_W_JOB_CHANGE,
                             .job_id = j.id,
                             .set = JD_SET_STATE | JD_SET_FINISHED,
                             .state = JD_JOB_SUCCEEDED,
                             .finished_ms = now - 3600 * 1000,
                             .kind = JD_EVK_STATE};
        assert_int_equal(submit_wait(f->s, &w, &r), 0);
    }
    for (int i = 0; i < 3; i++) {
        struct jd_job j = make_job(jd_store_next_id(f->s), "ret", NULL);
        keep[i] = j.id;
        assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
    }
    assert_int_equal(change_state_wait(f->s, keep[0], JD_JOB_FAILED, &r), 0); /* recent */
    assert_int_equal(change_state_wait(f->s, keep[1], JD_JOB_RUNNING, &r), 0);

    /* expired jobs go within a couple of retention intervals */
    struct jd_job got;
    int rc = 0;
    for (int t = 0; t < 400; t++) {
        rc = jd_store_job_get(f->s, old_ids[299], &got);
        if (rc == JD_ENOENT)
            break;
        jd_job_clear(&got);
        usleep(10000);
    }
    assert_int_equal(rc, JD_ENOENT);
    for (int i = 0; i < 300; i++)
        assert_int_equal(jd_store_job_get(f->s, old_ids[i], &got), JD_ENOENT);
    struct jd_job_event *ev;
    size_t n;
    assert_int_equal(jd_store_events(f->s, old_ids[0], 0, 100, &ev, &n), 0);
    assert_int_equal(n, 0);
    jd_job_events_free(ev, n);
    int64_t id;
    assert_int_equal(jd_store_idem_lookup(f->s, "old-0", &id, NULL), JD_ENOENT);
    /* their label rows went with them (no index entries left behind) */
    struct jd_job_find lf = {.state = -1, .limit = 10, .n_labels = 1};
    lf.label_key[0] = "team";
    lf.label_value[0] = "old";
    struct jd_job *lrows;
    struct jd_job_find_cursor lnext;
    assert_int_equal(jd_store_job_find(f->s, &lf, true, &lrows, &n, &lnext), 0);
    assert_int_equal(n, 0);
    assert_int_equal(lnext.id, 0); /* nothing left to examine either */
    jd_jobs_free(lrows, n);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(jd_store_job_get(f->s, keep[i], &got), 0);
        jd_job_clear(&got);
    }
    struct jd_queue_counts *rows;
    assert_int_equal(jd_store_queue_counts(f->s, &rows, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].counts[JD_JOB_SUCCEEDED], 0);
    assert_int_equal(rows[0].counts[JD_JOB_FAILED], 1);
    assert_int_equal(rows[0].counts[JD_JOB_RUNNING], 1);
    assert_int_equal(rows[0].counts[JD_JOB_QUEUED], 1);
    jd_queue_counts_free(rows, n);
    struct jd_store_stats st;
    jd_store_stats(f->s, &st);
    assert_int_equal(st.retention_deleted, 300);

    /* the newest job can be deleted too without its id coming back */
    struct jd_write w = {.op = JD_W_JOB_CHANGE,
                         .job_id = keep[2],
                         .set = JD_SET_STATE | JD_SET_FINISHED,
                         .state = JD_JOB_CANCELLED,
                         .finished_ms = now - 3600 * 1000,
                         .kind = JD_EVK_STATE};
    assert_int_equal(submit_wait(f->s, &w, &r), 0);
    rc = jd_store_job_get(f->s, keep[2], &got);
    for (int t = 0; t < 400 && rc == 0; t++) {
        jd_job_clear(&got);
        usleep(10000);
        rc = jd_store_job_get(f->s, keep[2], &got);
    }
    assert_int_equal(rc, JD_ENOENT);
    /* the writer wrote these jobs' rows, then retention deleted them */
    assert_int_equal(change_state_wait(f->s, keep[2], JD_JOB_QUEUED, &r), JD_ENOENT);
    assert_int_equal(event_wait(f->s, old_ids[299], JD_EVK_COMPLETE, 1, "{}", &r), JD_ENOENT);
    jd_store_close(f->s);
    f->s = NULL;
    assert_int_equal(fx_open(f, false, 0), 0);
    assert_true(jd_store_next_id(f->s) > keep[2]);
}

/* SQLite's allocations (storage/sqlite_mem.c once the store is open): every
 * size SQLite may ask for gives a block at least that large that keeps its
 * bytes through reallocs up and down, and blocks freed on another thread
 * are reused safely. */
static void *free_blocks(void *arg)
{
    void **b = arg;
    for (int i = 0; i < 64; i++)
        sqlite3_free(b[i]);
    return NULL;
}

static void test_sqlite_allocations_keep_their_size_and_bytes(void **state)
{
    (void)state;
    for (int n = 1; n <= 5000; n += (n < 1100 ? 1 : 97)) {
        unsigned char *p = sqlite3_malloc(n);
        assert_non_null(p);
        assert_true(sqlite3_msize(p) >= (sqlite3_uint64)n);
        memset(p, n & 0xff, (size_t)n);
        int up = n * 2 + 5;
        p = sqlite3_realloc(p, up);
        assert_non_null(p);
        assert_true(sqlite3_msize(p) >= (sqlite3_uint64)up);
        for (int i = 0; i < n; i++)
            assert_int_equal(p[i], n & 0xff);
        memset(p, 0x5a, (size_t)up);
        int down = n / 3 + 1;
        p = sqlite3_realloc(p, down);
        assert_non_null(p);
        assert_true(sqlite3_msize(p) >= (sqlite3_uint64)down);
        for (int i = 0; i < down; i++)
            assert_int_equal(p[i], 0x5a);
        sqlite3_free(p);
    }
    /* freed on another thread, then allocated again here: distinct blocks */
    void *b[64];
    for (int i = 0; i < 64; i++) {
        b[i] = sqlite3_malloc(440);
        memset(b[i], i, 440);
    }
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, free_blocks, b), 0);
    pthread_join(t, NULL);
    void *c[64];
    for (int i = 0; i < 64; i++) {
        c[i] = sqlite3_malloc(440);
        memset(c[i], i, 440);
    }
    for (int i = 0; i < 64; i++)
        for (int k = i + 1; k < 64; k++)
            assert_ptr_not_equal(c[i], c[k]);
    for (int i = 0; i < 64; i++)
        sqlite3_free(c[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_insert_then_get_returns_every_field, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sqlite_allocations_keep_their_size_and_bytes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_every_change_bumps_version_and_appends_one_event,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_change_to_missing_job_is_enoent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_idempotency_key_returns_existing_job, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_failing_event_fails_only_its_record, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_deferred_rows_are_seen_by_later_records_of_the_batch,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_bad_record_fails_alone_in_a_group_commit, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_submit_many_is_all_or_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_records_of_one_job_in_one_batch_get_consecutive_versions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_done_callbacks_fire_in_submission_order, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_completion_thread_keeps_order_and_frees_the_writer,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_job_deleted_between_batches_is_missing_to_the_next,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_batch_splits_transactions_but_never_a_group, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_list_is_newest_first_with_keyset_pages_and_filters,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_counts_follow_every_path_of_a_batch, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_queue_counts_include_paused_and_empty_queues, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_recover_returns_non_terminal_jobs_with_their_history,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_batch_packs_a_jobs_run_of_events_and_readers_see_each, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recover_reads_packed_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_task_state_reads_completions_packed_in_a_row, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_old_unpacked_history_migrates_and_reads_alongside_packed_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recover_started_merges_running_and_waiting_by_id,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_queued_page_reads_a_queue_in_run_order_across_pages,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_queued_later_reads_delayed_jobs_by_due_time, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ids_survive_reopen_and_are_never_reused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stats_count_commits_records_and_latency, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_close_drains_queue_and_fires_every_callback, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_wal_is_checkpointed_in_the_background, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_retention_deletes_old_terminal_jobs_and_their_history,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
