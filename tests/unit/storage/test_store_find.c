/*
 * Finding jobs (storage/find.c): labels, handler and creation time with
 * the older filters, keyset paging in both orders, the per-page scan
 * budget, every query shape's plan (no table scan, no sort), and deleting
 * a finished job (JD_W_JOB_DELETE) with its labels.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/alloc.h"
#include "storage/store_impl.h"

#include "find_shapes.h"
#include "store_test_util.h"

#include <inttypes.h>

struct fx {
    char *dir, *path;
    struct jd_store *s;
};

static int setup(void **state)
{
    struct fx *f = jd_xcalloc(1, sizeof *f);
    f->dir = scratch_dir();
    f->path = test_db_path(f->dir);
    struct jd_store_config cfg = {.path = f->path};
    struct jd_error err;
    assert_int_equal(jd_store_open(&cfg, &f->s, &err), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    if (f->s)
        jd_store_close(f->s);
    rm_tree(f->dir);
    free(f->dir);
    free(f->path);
    free(f);
    return 0;
}

/* Insert a job with this definition and creation time; its id. The handler
 * column is what the job layer passes: the definition's leading "handler". */
static int64_t add(struct jd_store *s, const char *queue, const char *def, int64_t created)
{
    struct jd_job j = make_job(jd_store_next_id(s), queue, NULL);
    j.definition = (char *)def;
    j.created_ms = created;
    char handler[64] = "";
    if (sscanf(def, "{\"handler\":\"%63[^\"]\"", handler) == 1)
        j.handler = handler;
    struct tres r;
    assert_int_equal(insert_wait(s, &j, NULL, &r), 0);
    return j.id;
}

/* Every id the filter finds, page by page (page size `limit`), into ids. */
static size_t find_all(struct jd_store *s, struct jd_job_find f, int64_t *ids, size_t cap)
{
    size_t total = 0;
    for (int pages = 0; pages < 100000; pages++) {
        struct jd_job *rows;
        size_t n;
        struct jd_job_find_cursor next;
        assert_int_equal(jd_store_job_find(s, &f, false, &rows, &n, &next), 0);
        for (size_t i = 0; i < n; i++) {
            assert_true(total < cap);
            assert_non_null(rows[i].definition); /* whole rows */
            ids[total++] = rows[i].id;
        }
        jd_jobs_free(rows, n);
        if (next.id == 0)
            return total;
        f.after_id = next.id;
        f.after_created_ms = next.created_ms;
    }
    fail_msg("paging did not end");
    return 0;
}

static void test_labels_handler_and_state(void **state)
{
    struct fx *f = *state;
    int64_t gold =
        add(f->s, "q", "{\"handler\":\"exec\",\"labels\":{\"team\":\"billing\",\"tier\":\"gold\"}}",
            1000);
    int64_t silver =
        add(f->s, "q",
            "{\"handler\":\"exec\",\"labels\":{\"team\":\"billing\",\"tier\":\"silver\"}}", 1001);
    int64_t echo = add(f->s, "r", "{\"handler\":\"echo\",\"labels\":{\"team\":\"billing\"}}", 1002);
    int64_t wf =
        add(f->s, "q",
            "{\"steps\":[{\"id\":\"a\",\"call\":\"exec\",\"args\":{\"handler\":\"x\"}}]}", 1003);
    int64_t ids[16];
    struct jd_job_find q = {.state = -1, .limit = 10, .n_labels = 1};
    q.label_key[0] = "team";
    q.label_value[0] = "billing";
    assert_int_equal(find_all(f->s, q, ids, 16), 3);
    assert_int_equal(ids[0], echo); /* newest first */
    assert_int_equal(ids[2], gold);

    q.n_labels = 2;
    q.label_key[1] = "tier";
    q.label_value[1] = "gold";
    assert_int_equal(find_all(f->s, q, ids, 16), 1);
    assert_int_equal(ids[0], gold);

    /* handler: the top-level one only (a workflow step or an args member
     * named "handler" is not the job's handler) */
    q = (struct jd_job_find){.state = -1, .limit = 10, .handler = "exec"};
    assert_int_equal(find_all(f->s, q, ids, 16), 2);
    assert_int_equal(ids[0], silver);
    q.handler = "x";
    assert_int_equal(find_all(f->s, q, ids, 16), 0);
    (void)wf;

    /* label + handler + queue + state together */
    struct tres r;
    assert_int_equal(change_state_wait(f->s, silver, JD_JOB_FAILED, &r), 0);
    q = (struct jd_job_find){
        .state = JD_JOB_FAILED, .queue = "q", .handler = "exec", .limit = 10, .n_labels = 1};
    q.label_key[0] = "team";
    q.label_value[0] = "billing";
    assert_int_equal(find_all(f->s, q, ids, 16), 1);
    assert_int_equal(ids[0], silver);
    q.state = JD_JOB_QUEUED;
    assert_int_equal(find_all(f->s, q, ids, 16), 1);
    assert_int_equal(ids[0], gold);

    /* max_id: a bulk action's snapshot leaves later jobs alone */
    q = (struct jd_job_find){.state = -1, .limit = 10, .n_labels = 1, .max_id = silver};
    q.label_key[0] = "team";
    q.label_value[0] = "billing";
    assert_int_equal(find_all(f->s, q, ids, 16), 2);
}

static void test_created_range_pages_exactly(void **state)
{
    struct fx *f = *state;
    /* creation times that disagree with id order in places */
    static const int64_t times[] = {5000, 4000, 6000, 6000, 7000, 3000, 6500, 6000};
    int64_t id[8];
    for (int i = 0; i < 8; i++)
        id[i] = add(f->s, "q", "{\"handler\":\"echo\"}", times[i]);
    int64_t got[16];
    struct jd_job_find q = {
        .state = -1, .limit = 1, .created_after_ms = 4000, .created_before_ms = 7000};
    assert_true(jd_store_find_by_created(&q));
    size_t n = find_all(f->s, q, got, 16);
    /* 6500, then the three 6000s by id descending, 5000, 4000 */
    int64_t want[] = {id[6], id[7], id[3], id[2], id[0], id[1]};
    assert_int_equal(n, 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(got[i], want[i]);
    /* with another driver the creation bounds are checked per row */
    q.queue = "q";
    q.limit = 2;
    assert_false(jd_store_find_by_created(&q));
    assert_int_equal(find_all(f->s, q, got, 16), 6);
}

static void test_scan_budget_bounds_a_page(void **state)
{
    struct fx *f = *state;
    /* JD_FIND_SCAN + 5 jobs of which only the oldest matches */
    size_t total = JD_FIND_SCAN + 5;
    struct jd_job *jobs = jd_xcalloc(total, sizeof *jobs);
    struct jd_write *ws = jd_xcalloc(total, sizeof *ws);
    struct jd_write **wp = jd_xcalloc(total, sizeof *wp);
    for (size_t i = 0; i < total; i++) {
        jobs[i] = make_job(jd_store_next_id(f->s), "big", NULL);
        jobs[i].definition = (char *)(i == 0 ? "{\"handler\":\"rare\"}" : "{\"handler\":\"echo\"}");
        jobs[i].handler = (char *)(i == 0 ? "rare" : "echo");
        ws[i] = (struct jd_write){.op = JD_W_JOB_INSERT, .job = &jobs[i]};
        wp[i] = &ws[i];
    }
    assert_int_equal(jd_store_submit_many(f->s, wp, total), 0);
    assert_int_equal(jd_store_sync(f->s), 0);
    struct jd_job_find q = {.state = -1, .queue = "big", .handler = "rare", .limit = 50};
    struct jd_job *rows;
    size_t n;
    struct jd_job_find_cursor next;
    assert_int_equal(jd_store_job_find(f->s, &q, false, &rows, &n, &next), 0);
    assert_int_equal(n, 0);           /* the budget ran out before the match */
    assert_int_not_equal(next.id, 0); /* ... and says where to go on */
    jd_jobs_free(rows, n);
    q.after_id = next.id;
    assert_int_equal(jd_store_job_find(f->s, &q, true, &rows, &n, &next), 0);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].id, jobs[0].id);
    assert_int_equal(next.id, 0);
    jd_jobs_free(rows, n);
    free(jobs);
    free(ws);
    free(wp);
}

static void test_bad_filters_are_refused(void **state)
{
    struct fx *f = *state;
    struct jd_job *rows;
    size_t n;
    struct jd_job_find_cursor next;
    struct jd_job_find q = {.state = -1, .limit = 0};
    assert_int_equal(jd_store_job_find(f->s, &q, false, &rows, &n, &next), JD_EINVAL);
    q = (struct jd_job_find){.state = -1, .limit = 1, .n_labels = JD_FIND_MAX_LABELS + 1};
    assert_int_equal(jd_store_job_find(f->s, &q, false, &rows, &n, &next), JD_EINVAL);
    q = (struct jd_job_find){.state = 9, .limit = 1};
    assert_int_equal(jd_store_job_find(f->s, &q, false, &rows, &n, &next), JD_EINVAL);
}

/* ---- plans: every combination of filters ---- */

/* Fail on a table scan or a sort in q's plan; frees q.sql. */
static void check_sql_plan(sqlite3 *db, struct jd_find_sql q)
{
    char *sql = jd_xasprintf("EXPLAIN QUERY PLAN %s", q.sql);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        fail_msg("prepare %s: %s", q.sql, sqlite3_errmsg(db));
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *d = (const char *)sqlite3_column_text(st, 3);
        if (strncmp(d, "SCAN", 4) == 0 || strstr(d, "TEMP B-TREE"))
            fail_msg("%s\n  plan: %s", q.sql, d);
    }
    sqlite3_finalize(st);
    free(sql);
    free(q.sql);
}

static void check_plan(sqlite3 *db, const struct jd_job_find *f)
{
    struct jd_find_sql q;
    assert_int_equal(jd_find_sql_build(f, &q), 0);
    check_sql_plan(db, q);
}

static void check_every_shape(sqlite3 *db)
{
    for (unsigned m = 0; m < FIND_SHAPES; m++) {
        struct jd_job_find f = find_shape(m);
        check_plan(db, &f);
    }
}

static void check_event_plans(sqlite3 *db)
{
    for (unsigned m = 0; m < EVENT_SHAPES; m++) {
        struct jd_event_find f = event_shape(m);
        struct jd_find_sql q;
        assert_int_equal(jd_event_sql_build(&f, &q), 0);
        check_sql_plan(db, q);
    }
}

static void test_every_filter_uses_an_index(void **state)
{
    test_skip_on_pg(); /* SQLite's plans; PostgreSQL's: test_pg_read.c */
    struct fx *f = *state;
    for (int i = 0; i < 60; i++)
        add(f->s, i % 2 ? "q" : "r",
            i % 3 ? "{\"handler\":\"exec\",\"labels\":{\"team\":\"billing\",\"tier\":\"gold\"}}"
                  : "{\"steps\":[{\"id\":\"a\",\"sleep_ms\":1}]}",
            1000 + i);
    jd_store_close(f->s);
    f->s = NULL;
    sqlite3 *db;
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    check_every_shape(db);
    check_event_plans(db);
    assert_int_equal(sqlite3_exec(db, "ANALYZE", NULL, NULL, NULL), SQLITE_OK);
    check_every_shape(db);
    check_event_plans(db);
    sqlite3_close(db);
}

/* ---- delete ---- */

static int delete_wait(struct jd_store *s, int64_t id)
{
    struct jd_write w = {.op = JD_W_JOB_DELETE, .job_id = id};
    struct tres r;
    return submit_wait(s, &w, &r);
}

static void test_delete_only_finished_jobs(void **state)
{
    struct fx *f = *state;
    const char *def = "{\"handler\":\"echo\",\"labels\":{\"team\":\"billing\"}}";
    struct jd_job j = make_job(jd_store_next_id(f->s), "q", "key-1");
    j.definition = (char *)def;
    struct tres r;
    assert_int_equal(insert_wait(f->s, &j, "fp", &r), 0);
    int64_t id = j.id;
    assert_int_equal(delete_wait(f->s, id), JD_ECONFLICT); /* queued */
    assert_int_equal(change_state_wait(f->s, id, JD_JOB_RUNNING, &r), 0);
    assert_int_equal(delete_wait(f->s, id), JD_ECONFLICT);
    assert_int_equal(change_state_wait(f->s, id, JD_JOB_SUCCEEDED, &r), 0);
    assert_int_equal(delete_wait(f->s, id), 0);
    assert_int_equal(delete_wait(f->s, id), JD_ENOENT);
    struct jd_job row;
    assert_int_equal(jd_store_job_get(f->s, id, &row), JD_ENOENT);
    int64_t got;
    assert_int_equal(jd_store_idem_lookup(f->s, "key-1", &got, NULL), JD_ENOENT);
    struct jd_job_find q = {.state = -1, .limit = 10, .n_labels = 1};
    q.label_key[0] = "team";
    q.label_value[0] = "billing";
    int64_t ids[4];
    assert_int_equal(find_all(f->s, q, ids, 4), 0);
    /* the id is never handed out again */
    jd_store_close(f->s);
    struct jd_store_config cfg = {.path = f->path};
    struct jd_error err;
    assert_int_equal(jd_store_open(&cfg, &f->s, &err), 0);
    assert_true(jd_store_next_id(f->s) > id);
    /* the label rows are gone from the table, not only from the answer */
    if (test_pg_url()) {
        PGconn *pc = PQconnectdb(f->path);
        PGresult *res = PQexec(pc, "SELECT count(*) FROM job_labels");
        assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
        assert_string_equal(PQgetvalue(res, 0, 0), "0");
        PQclear(res);
        PQfinish(pc);
        return;
    }
    sqlite3 *db;
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT count(*) FROM job_labels", -1, &st, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(st, 0), 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
}

static void test_event_stream_in_commit_order(void **state)
{
    struct fx *f = *state;
    int64_t a = add(f->s, "q", "{\"handler\":\"echo\",\"labels\":{\"team\":\"billing\"}}", 1);
    int64_t b = add(f->s, "r", "{\"handler\":\"echo\"}", 2);
    struct tres r;
    assert_int_equal(event_wait(f->s, a, JD_EVK_DISPATCH, 1, "{}", &r), 0);
    struct jd_write w = {.op = JD_W_JOB_CHANGE,
                         .job_id = a,
                         .set = JD_SET_STATE,
                         .state = JD_JOB_SUCCEEDED,
                         .kind = JD_EVK_STATE,
                         .data = "{\"state\":\"succeeded\"}"};
    assert_int_equal(submit_wait(f->s, &w, &r), 0);
    struct jd_event_find q = {.limit = 100};
    struct jd_stream_event *ev;
    size_t n;
    int64_t next;
    assert_int_equal(jd_store_event_stream(f->s, &q, &ev, &n, &next), 0);
    assert_int_equal(n, 3); /* the dispatch is not a transition */
    assert_int_equal(ev[0].job_id, a);
    assert_int_equal(ev[1].job_id, b);
    assert_int_equal(ev[2].job_id, a);
    assert_int_equal(ev[2].state, JD_JOB_SUCCEEDED);
    assert_true(ev[0].id < ev[1].id && ev[1].id < ev[2].id);
    int64_t last;
    assert_int_equal(jd_store_event_last_id(f->s, &last), 0);
    assert_int_equal(next, last);
    jd_stream_events_free(ev, n);
    /* filters */
    q = (struct jd_event_find){.limit = 100, .state_mask = 1u << JD_JOB_SUCCEEDED, .n_labels = 1};
    q.label_key[0] = "team";
    q.label_value[0] = "billing";
    assert_int_equal(jd_store_event_stream(f->s, &q, &ev, &n, &next), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ev[0].job_id, a);
    jd_stream_events_free(ev, n);
    q = (struct jd_event_find){.limit = 100, .queue = "r"};
    assert_int_equal(jd_store_event_stream(f->s, &q, &ev, &n, &next), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ev[0].job_id, b);
    assert_int_equal(next, last); /* past the newer events it skipped */
    /* nothing newer: next stays */
    q.after_id = last;
    jd_stream_events_free(ev, n);
    assert_int_equal(jd_store_event_stream(f->s, &q, &ev, &n, &next), 0);
    assert_int_equal(n, 0);
    assert_int_equal(next, last);
    jd_stream_events_free(ev, n);
}

/* Event ids only rise, also after the newest events were deleted (DELETE,
 * retention) and across a restart: a stream resuming after id N never
 * misses a later event that got a reused id <= N. */
static void test_event_ids_are_never_reused(void **state)
{
    struct fx *f = *state;
    int64_t a = add(f->s, "q", "{\"handler\":\"echo\"}", 1);
    struct tres r;
    assert_int_equal(change_state_wait(f->s, a, JD_JOB_SUCCEEDED, &r), 0);
    int64_t high;
    assert_int_equal(jd_store_event_last_id(f->s, &high), 0);
    struct jd_write w = {.op = JD_W_JOB_DELETE, .job_id = a};
    assert_int_equal(submit_wait(f->s, &w, &r), 0); /* the newest events go */
    int64_t b = add(f->s, "q", "{\"handler\":\"echo\"}", 2);
    struct jd_event_find q = {.after_id = high, .limit = 10};
    struct jd_stream_event *ev;
    size_t n;
    int64_t next;
    assert_int_equal(jd_store_event_stream(f->s, &q, &ev, &n, &next), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ev[0].job_id, b);
    assert_true(ev[0].id > high);
    jd_stream_events_free(ev, n);
    /* again, and then a restart */
    assert_int_equal(change_state_wait(f->s, b, JD_JOB_FAILED, &r), 0);
    assert_int_equal(jd_store_event_last_id(f->s, &high), 0);
    w = (struct jd_write){.op = JD_W_JOB_DELETE, .job_id = b};
    assert_int_equal(submit_wait(f->s, &w, &r), 0);
    jd_store_close(f->s);
    struct jd_store_config cfg = {.path = f->path};
    struct jd_error err;
    assert_int_equal(jd_store_open(&cfg, &f->s, &err), 0);
    int64_t c = add(f->s, "q", "{\"handler\":\"echo\"}", 3);
    q.after_id = high;
    assert_int_equal(jd_store_event_stream(f->s, &q, &ev, &n, &next), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ev[0].job_id, c);
    jd_stream_events_free(ev, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_labels_handler_and_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_created_range_pages_exactly, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scan_budget_bounds_a_page, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_filters_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_filter_uses_an_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete_only_finished_jobs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_stream_in_commit_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_ids_are_never_reused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
