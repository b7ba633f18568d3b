/*
 * The PostgreSQL backend's own promises (storage/pg.h), beyond what the
 * shared store tests check on both backends: the owner fence (a job write
 * for a job another node incarnation owns fails with JD_ESTALE and writes
 * nothing), refusals (a foreign database, a newer schema, a second node),
 * an unclean restart adopting the dead incarnation's jobs, ids unique
 * across restarts, and a bad record failing alone. Every test but the URL
 * one needs JD_TEST_PG_URL (tests/integration/test_store_pg.sh sets it)
 * and skips without it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <cmocka.h>

#include "common/error.h"
#include "storage/pg.h"
#include "storage/store.h"
#include "store_test_util.h"

struct fx {
    char *url;
    struct jd_store *s;
};

static int fx_open(struct fx *f, struct jd_error *err)
{
    struct jd_store_config cfg = {.path = f->url, .sync_full = true};
    return jd_store_open(&cfg, &f->s, err);
}

static int setup(void **state)
{
    if (!test_pg_url()) {
        *state = NULL;
        return 0;
    }
    struct fx *f = calloc(1, sizeof *f);
    f->url = strdup(test_pg_url());
    test_pg_reset(f->url);
    struct jd_error err;
    if (fx_open(f, &err) != 0) {
        fprintf(stderr, "open: %s\n", err.message);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    if (!f)
        return 0;
    jd_store_close(f->s);
    free(f->url);
    free(f);
    return 0;
}

/* Run sql on the test database from a connection of the test's own. */
static void sql(const char *url, const char *q)
{
    PGconn *c = PQconnectdb(url);
    PGresult *r = PQexec(c, q);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", q, PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
}

static int64_t insert_job(struct fx *f)
{
    struct tres r;
    struct jd_job j = make_job(jd_store_next_id(f->s), "default", NULL);
    assert_int_equal(insert_wait(f->s, &j, NULL, &r), 0);
    return j.id;
}

static void test_display_url_hides_the_password(void **state)
{
    (void)state;
    char *d = jd_pg_display_url("postgres://ann:s3cret@db.example:5432/jd?sslmode=require");
    assert_string_equal(d, "postgres://ann:***@db.example:5432/jd?sslmode=require");
    free(d);
    d = jd_pg_display_url("postgresql://ann@db/jd?password=s3cret&application_name=x");
    assert_string_equal(d, "postgresql://ann@db/jd?password=***&application_name=x");
    free(d);
    d = jd_pg_display_url("postgres://db/jd");
    assert_string_equal(d, "postgres://db/jd");
    free(d);
    assert_true(jd_store_path_is_pg("POSTGRES://x") && jd_store_path_is_pg("postgresql://x"));
    assert_false(jd_store_path_is_pg("./data/postgres://x.db"));
}

static void test_a_job_owned_by_another_node_is_fenced(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    int64_t mine = insert_job(f), theirs = insert_job(f);
    /* another incarnation took `theirs` over */
    char q[128];
    snprintf(q, sizeof q, "UPDATE jobs SET owner_node = owner_node + 1000 WHERE id = %lld",
             (long long)theirs);
    sql(f->url, q);

    struct tres r;
    assert_int_equal(change_state_wait(f->s, theirs, JD_JOB_RUNNING, &r), JD_ESTALE);
    assert_int_equal(r.version, 0);
    assert_int_equal(event_wait(f->s, theirs, JD_EVK_MESSAGE, 0, "{}", &r), JD_ESTALE);
    struct jd_write cw = {.op = JD_W_JOB_CRASHES, .job_id = theirs, .crashes = 2};
    assert_int_equal(submit_wait(f->s, &cw, &r), JD_ESTALE);
    /* nothing of it was written */
    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->s, theirs, &got), 0);
    assert_int_equal(got.version, 1);
    assert_int_equal(got.state, JD_JOB_QUEUED);
    assert_int_equal(got.crashes, 0);
    jd_job_clear(&got);
    /* the node's own job still takes writes; a missing one is JD_ENOENT */
    assert_int_equal(change_state_wait(f->s, mine, JD_JOB_RUNNING, &r), 0);
    assert_int_equal(r.version, 2);
    assert_int_equal(change_state_wait(f->s, 999999999, JD_JOB_RUNNING, &r), JD_ENOENT);

    /* a group with a fenced record fails whole */
    struct tres r1, r2;
    struct jd_write a = {.op = JD_W_JOB_CHANGE,
                         .job_id = mine,
                         .kind = JD_EVK_MESSAGE,
                         .data = "{}",
                         .done = tres_done,
                         .arg = &r1};
    struct jd_write b = {.op = JD_W_JOB_CHANGE,
                         .job_id = theirs,
                         .kind = JD_EVK_MESSAGE,
                         .data = "{}",
                         .done = tres_done,
                         .arg = &r2};
    struct jd_write *g[2] = {&a, &b};
    assert_int_equal(jd_store_submit_many(f->s, g, 2), 0);
    assert_int_equal(jd_store_sync(f->s), 0);
    assert_int_equal(r1.rc, JD_ESTALE);
    assert_int_equal(r2.rc, JD_ESTALE);
    assert_int_equal(jd_store_job_get(f->s, mine, &got), 0);
    assert_int_equal(got.version, 2);
    jd_job_clear(&got);
}

static void test_a_bad_definition_fails_alone(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    /* "labels": makes PostgreSQL parse it as JSON, which it is not */
    struct jd_job bad = make_job(jd_store_next_id(f->s), "default", NULL);
    bad.definition = (char *)"{\"labels\":{\"a\":\"b\"} oops";
    struct jd_job good = make_job(jd_store_next_id(f->s), "default", NULL);
    struct tres rb, rg;
    struct jd_write wb = {.op = JD_W_JOB_INSERT, .job = &bad, .done = tres_done, .arg = &rb};
    struct jd_write wg = {.op = JD_W_JOB_INSERT, .job = &good, .done = tres_done, .arg = &rg};
    assert_int_equal(jd_store_submit(f->s, &wb), 0);
    assert_int_equal(jd_store_submit(f->s, &wg), 0);
    assert_int_equal(jd_store_sync(f->s), 0);
    assert_int_equal(rb.rc, JD_EINVAL);
    assert_int_equal(rg.rc, 0);
    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->s, bad.id, &got), JD_ENOENT);
    assert_int_equal(jd_store_job_get(f->s, good.id, &got), 0);
    jd_job_clear(&got);
    struct jd_queue_counts *rows;
    size_t n;
    assert_int_equal(jd_store_queue_counts(f->s, &rows, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].counts[JD_JOB_QUEUED], 1);
    jd_queue_counts_free(rows, n);
}

/* Inserts of one batch go in one statement of arrays (pg_write.c): every
 * character that array literals quote comes back as it went in. */
static void test_batched_inserts_keep_every_byte(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    static const char *const defs[3] = {
        "{\"handler\":\"echo\",\"args\":{\"q\":\"a \\\"quoted\\\" {x,y} \\\\ back\"},"
        "\"labels\":{\"team\":\"a,b \\\"c\\\"\",\"n\":1}}",
        "{\"handler\":\"echo\",\"args\":\"NULL\"}",
        "{\"handler\":\"echo\",\"args\":\"\u00e9\u00e8 \u2603 \\\\\"}",
    };
    static const char *const queues[3] = {"NULL", "a,b", "q \"x\" \\"};
    struct jd_job jobs[3];
    struct jd_write ws[3];
    struct tres rs[3];
    struct jd_write *g[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = make_job(jd_store_next_id(f->s), queues[i], i == 1 ? "key \"1\"" : NULL);
        jobs[i].definition = (char *)defs[i];
        jobs[i].handler = i == 2 ? (char *)"h,\"x\"" : NULL;
        ws[i] = (struct jd_write){
            .op = JD_W_JOB_INSERT, .job = &jobs[i], .done = tres_done, .arg = &rs[i]};
        g[i] = &ws[i];
    }
    assert_int_equal(jd_store_submit_many(f->s, g, 3), 0);
    assert_int_equal(jd_store_sync(f->s), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rs[i].rc, 0);
        assert_int_equal(rs[i].version, 1);
        struct jd_job got;
        assert_int_equal(jd_store_job_get(f->s, jobs[i].id, &got), 0);
        assert_string_equal(got.definition, defs[i]);
        assert_string_equal(got.queue, queues[i]);
        if (i == 1)
            assert_string_equal(got.idempotency_key, "key \"1\"");
        else
            assert_null(got.idempotency_key);
        jd_job_clear(&got);
    }
    /* the string label is indexed, the number is not */
    struct jd_job_find lf = {.state = -1, .limit = 10, .n_labels = 1};
    lf.label_key[0] = "team";
    lf.label_value[0] = "a,b \"c\"";
    struct jd_job *rows;
    size_t n;
    struct jd_job_find_cursor next;
    assert_int_equal(jd_store_job_find(f->s, &lf, true, &rows, &n, &next), 0);
    assert_int_equal(n, 1);
    assert_true(rows[0].id == jobs[0].id);
    jd_jobs_free(rows, n);
    /* a duplicate id in a batch fails alone (the slow path) */
    struct jd_job dup = make_job(jobs[0].id, "default", NULL), fresh = make_job(0, "default", NULL);
    fresh.id = jd_store_next_id(f->s);
    struct tres rd, rf;
    struct jd_write wd = {.op = JD_W_JOB_INSERT, .job = &dup, .done = tres_done, .arg = &rd};
    struct jd_write wf = {.op = JD_W_JOB_INSERT, .job = &fresh, .done = tres_done, .arg = &rf};
    assert_int_equal(jd_store_submit(f->s, &wd), 0);
    assert_int_equal(jd_store_submit(f->s, &wf), 0);
    assert_int_equal(jd_store_sync(f->s), 0);
    assert_int_equal(rd.rc, JD_EEXIST);
    assert_int_equal(rf.rc, 0);
}

/* The changes of one job in one batch are folded into one update of its
 * row (pg_write_pipe.c): each record still gets its own version and event,
 * in order, and the row ends as the records one after the other leave it
 * (a terminal state stamps a finish time unless one was set). */
static void test_a_batch_folds_a_jobs_changes(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    int64_t a = insert_job(f), b = insert_job(f);
    struct tres r[6];
    struct jd_write w[6] = {
        {.op = JD_W_JOB_CHANGE,
         .job_id = a,
         .set = JD_SET_STATE | JD_SET_STARTED | JD_SET_ATTEMPTS,
         .state = JD_JOB_RUNNING,
         .started_ms = 5,
         .attempts = 1,
         .kind = JD_EVK_STATE},
        {.op = JD_W_JOB_CHANGE,
         .job_id = b,
         .set = JD_SET_FINISHED,
         .finished_ms = 777,
         .kind = JD_EVK_PROGRESS,
         .data = "{\"b\":1}"},
        {.op = JD_W_JOB_CHANGE, .job_id = a, .kind = JD_EVK_PROGRESS, .data = "{\"p\":1}"},
        {.op = JD_W_JOB_CHANGE,
         .job_id = a,
         .set = JD_SET_STATE | JD_SET_OUTPUT,
         .state = JD_JOB_SUCCEEDED,
         .output = "{\"x\":1}",
         .kind = JD_EVK_STATE},
        {.op = JD_W_JOB_CHANGE,
         .job_id = b,
         .set = JD_SET_STATE,
         .state = JD_JOB_CANCELLED,
         .kind = JD_EVK_STATE},
        {.op = JD_W_JOB_CHANGE, .job_id = a, .kind = JD_EVK_MESSAGE, .data = "{\"m\":2}"},
    };
    struct jd_write *g[6];
    for (int i = 0; i < 6; i++) {
        w[i].done = tres_done;
        w[i].arg = &r[i];
        g[i] = &w[i];
    }
    assert_int_equal(jd_store_submit_many(f->s, g, 6), 0);
    assert_int_equal(jd_store_sync(f->s), 0);
    static const int64_t versions[6] = {2, 2, 3, 4, 3, 5};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(r[i].rc, 0);
        assert_int_equal(r[i].version, versions[i]);
    }
    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->s, a, &got), 0);
    assert_int_equal(got.version, 5);
    assert_int_equal(got.state, JD_JOB_SUCCEEDED);
    assert_string_equal(got.output, "{\"x\":1}");
    assert_int_equal(got.started_ms, 5);
    assert_int_equal(got.attempts, 1);
    assert_true(got.finished_ms > 0);
    jd_job_clear(&got);
    assert_int_equal(jd_store_job_get(f->s, b, &got), 0);
    assert_int_equal(got.version, 3);
    assert_int_equal(got.state, JD_JOB_CANCELLED);
    assert_int_equal(got.finished_ms, 777);
    jd_job_clear(&got);
    struct jd_job_event *ev;
    size_t n;
    assert_int_equal(jd_store_events(f->s, a, 0, 100, &ev, &n), 0);
    assert_int_equal(n, 5);
    static const int kinds[5] = {JD_EVK_STATE, JD_EVK_STATE, JD_EVK_PROGRESS, JD_EVK_STATE,
                                 JD_EVK_MESSAGE};
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ev[i].seq, (int64_t)i + 1);
        assert_int_equal(ev[i].kind, kinds[i]);
    }
    assert_string_equal(ev[1].data, "{\"state\":\"running\"}");
    assert_string_equal(ev[2].data, "{\"p\":1}");
    assert_string_equal(ev[3].data, "{\"state\":\"succeeded\"}");
    jd_job_events_free(ev, n);
    struct jd_queue_counts *rows;
    assert_int_equal(jd_store_queue_counts(f->s, &rows, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].counts[JD_JOB_QUEUED], 0);
    assert_int_equal(rows[0].counts[JD_JOB_RUNNING], 0);
    assert_int_equal(rows[0].counts[JD_JOB_SUCCEEDED], 1);
    assert_int_equal(rows[0].counts[JD_JOB_CANCELLED], 1);
    jd_queue_counts_free(rows, n);
}

/* One integer from q, on a connection of the test's own. */
static int64_t sql_int(const char *url, const char *q)
{
    PGconn *c = PQconnectdb(url);
    PGresult *r = PQexec(c, q);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        fail_msg("%s: %s", q, PQerrorMessage(c));
    int64_t v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    PQfinish(c);
    return v;
}

/* The jobs table's sequential scans so far, once the node's sessions have
 * ended (a session's counters are in when it ends). */
static int64_t jobs_seq_scans(const char *url)
{
    for (int tries = 0; tries < 100; tries++) {
        if (sql_int(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                         " AND pid <> pg_backend_pid()") == 0)
            break;
        struct timespec ts = {0, 20000000L};
        nanosleep(&ts, NULL);
    }
    return sql_int(url, "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'jobs'"
                        " AND schemaname = 'public'");
}

/* The writer's statements are planned once for good (a generic plan from
 * the sixth run on) while a new database's jobs table is nearly empty: the
 * grouped changes must still find their jobs by id, not by reading the
 * whole table in every batch from then on. */
static void test_grouped_changes_never_scan_the_jobs_table(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    /* the migrations' index builds scanned the table: count from here */
    jd_store_close(f->s);
    f->s = NULL;
    int64_t before = jobs_seq_scans(f->url);
    struct jd_error err;
    assert_int_equal(fx_open(f, &err), 0);
    int64_t a = insert_job(f), b = insert_job(f);
    enum { BATCHES = 24 };
    for (int k = 0; k < BATCHES; k++) {
        struct tres r[2];
        struct jd_write w[2] = {
            {.op = JD_W_JOB_CHANGE, .job_id = a, .kind = JD_EVK_PROGRESS, .data = "{\"p\":1}"},
            {.op = JD_W_JOB_CHANGE, .job_id = b, .kind = JD_EVK_PROGRESS, .data = "{\"p\":2}"},
        };
        struct jd_write *g[2] = {&w[0], &w[1]};
        for (int i = 0; i < 2; i++) {
            w[i].done = tres_done;
            w[i].arg = &r[i];
        }
        assert_int_equal(jd_store_submit_many(f->s, g, 2), 0); /* one batch: one statement */
        assert_int_equal(jd_store_sync(f->s), 0);
        assert_int_equal(r[0].rc, 0);
        assert_int_equal(r[1].version, k + 2);
    }
    jd_store_close(f->s);
    f->s = NULL;
    /* the restart's takeover pass may scan the small table once or twice;
     * a batch that scanned would add one per batch */
    assert_in_range(jobs_seq_scans(f->url) - before, 0, 3);
}

/* The grouped changes' generic plan, made as the writer's is, on a new
 * database (a nearly empty jobs table): each job row is found by a
 * primary-key probe from the changes' list, never by scanning jobs for
 * the whole list and rescanning the list for every row found (n * n rows
 * a batch; the plan PostgreSQL made from `j.id = ANY($7)` beside the
 * join). */
static void test_grouped_changes_probe_each_job_by_key(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    (void)insert_job(f); /* a row or two, as a new database has */
    const char *types;
    const char *sql = jd_pg_test_changes_sql(&types);
    PGconn *c = PQconnectdb(f->url);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    size_t cap = strlen(sql) + strlen(types) + 64;
    char *prep = malloc(cap);
    assert_non_null(prep);
    snprintf(prep, cap, "PREPARE p(%s) AS %s", types, sql);
    const char *steps[] = {"SET enable_seqscan = off", "SET plan_cache_mode = force_generic_plan",
                           prep};
    for (size_t i = 0; i < 3; i++) {
        PGresult *r = PQexec(c, steps[i]);
        assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
        PQclear(r);
    }
    free(prep);
    PGresult *r =
        PQexec(c, "EXPLAIN EXECUTE p('{1}','{0}','{0}','{x}',1,1,'{1}','{1}','{1}',"
                  "'{3}','{NULL}','{NULL}','{0}','{0}','{0}','{0}','{0}','{NULL}','{1}')");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    bool probe = false, filter = false;
    for (int i = 0; i < PQntuples(r); i++) {
        const char *line = PQgetvalue(r, i, 0);
        probe = probe || strstr(line, "Index Cond: (id = c.id)") != NULL;
        filter = filter || strstr(line, "Join Filter: (j.id = c.id)") != NULL;
    }
    PQclear(r);
    PQfinish(c);
    assert_true(probe);
    assert_false(filter);
}

static int count_job(void *arg, const struct jd_job *job, const struct jd_job_event *ev, size_t n)
{
    (void)job;
    (void)ev;
    (void)n;
    (*(size_t *)arg)++;
    return 0;
}

/* The writer finds a definition's top-level "labels" itself (pg_write.c)
 * and PostgreSQL parses only that: the same labels as parsing it whole. */
static size_t count_label(struct fx *f, const char *k, const char *v)
{
    struct jd_job_find lf = {.state = -1, .limit = 10, .n_labels = 1};
    lf.label_key[0] = k;
    lf.label_value[0] = v;
    struct jd_job *rows;
    size_t n;
    struct jd_job_find_cursor next;
    assert_int_equal(jd_store_job_find(f->s, &lf, true, &rows, &n, &next), 0);
    jd_jobs_free(rows, n);
    return n;
}

static void test_labels_found_where_parsing_finds_them(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    static const char *const defs[] = {
        /* nested "labels" and one inside a string are not the job's */
        "{\"args\":{\"labels\":{\"t\":\"nested\"}},\"note\":\"\\\"labels\\\":{}\","
        " \"labels\" : {\"t\":\"top\", \"x\":[1,{\"y\":\"}\"}]} }",
        /* a repeated key: the last one counts */
        "{\"labels\":{\"t\":\"first\"},\"labels\":{\"t\":\"last\"}}",
        /* an escaped key spelling labels: not looked at, as by SQLite's
         * trigger (both test for the text "labels": first) */
        "{\"lab\\u0065ls\":{\"t\":\"escaped\"}}",
        /* a key with an escape (it holds the text "labels":): parsed whole */
        "{\"a\\\"labels\\\":\":1,\"labels\":{\"t\":\"whole\"}}",
        /* labels that are not an object: none */
        "{\"labels\":[\"t\",\"array\"]}",
    };
    enum { N = sizeof defs / sizeof defs[0] };
    struct jd_job jobs[N];
    struct jd_write ws[N];
    struct tres rs[N];
    struct jd_write *g[N];
    for (int i = 0; i < N; i++) {
        jobs[i] = make_job(jd_store_next_id(f->s), "default", NULL);
        jobs[i].definition = (char *)defs[i];
        ws[i] = (struct jd_write){
            .op = JD_W_JOB_INSERT, .job = &jobs[i], .done = tres_done, .arg = &rs[i]};
        g[i] = &ws[i];
    }
    assert_int_equal(jd_store_submit_many(f->s, g, N), 0);
    assert_int_equal(jd_store_sync(f->s), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(rs[i].rc, 0);
    assert_int_equal(count_label(f, "t", "top"), 1);
    assert_int_equal(count_label(f, "t", "nested"), 0);
    assert_int_equal(count_label(f, "x", "[1,{\"y\":\"}\"}]"), 0); /* not a string */
    assert_int_equal(count_label(f, "t", "last"), 1);
    assert_int_equal(count_label(f, "t", "first"), 0);
    assert_int_equal(count_label(f, "t", "escaped"), 0);
    assert_int_equal(count_label(f, "t", "array"), 0);
    assert_int_equal(count_label(f, "t", "whole"), 1);
}

static void test_unclean_restart_adopts_jobs_and_ids_go_on(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    assert_false(jd_store_unclean(f->s));
    int64_t id = insert_job(f);
    jd_store_close(f->s);
    f->s = NULL;
    struct jd_error err;
    assert_int_equal(fx_open(f, &err), 0);
    assert_false(jd_store_unclean(f->s)); /* closed cleanly */
    jd_store_close(f->s);
    f->s = NULL;
    /* a node that died: its row stayed, it owned the job */
    sql(f->url, "INSERT INTO jd_nodes(id, name, expires_at) VALUES (424242, 'dead', now())");
    char q[128];
    snprintf(q, sizeof q, "UPDATE jobs SET owner_node = 424242 WHERE id = %lld", (long long)id);
    sql(f->url, q);
    assert_int_equal(fx_open(f, &err), 0);
    assert_true(jd_store_unclean(f->s));
    /* taken over (unowned) at open, adopted by the recovery read */
    struct tres r;
    assert_int_equal(change_state_wait(f->s, id, JD_JOB_RUNNING, &r), JD_ESTALE);
    size_t seen = 0;
    assert_int_equal(jd_store_recover(f->s, count_job, &seen), 0);
    assert_int_equal(seen, 1);
    assert_int_equal(change_state_wait(f->s, id, JD_JOB_RUNNING, &r), 0);
    assert_true(jd_store_next_id(f->s) > id);
}

static void test_refusals(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    /* a second node on the same database joins it (the cluster) */
    struct jd_store *second = NULL;
    struct jd_store_config cfg = {.path = f->url};
    struct jd_error err;
    assert_int_equal(jd_store_open(&cfg, &second, &err), 0);
    assert_true(jd_store_node_id(second) > jd_store_node_id(f->s));
    jd_store_close(second);
    second = NULL;
    jd_store_close(f->s);
    f->s = NULL;
    /* a newer schema */
    sql(f->url, "UPDATE meta SET value = 9999 WHERE key = 'schema_version'");
    assert_int_equal(jd_store_open(&cfg, &second, &err), JD_ECORRUPT);
    assert_non_null(strstr(err.message, "newer"));
    /* a foreign database: tables, no marker */
    test_pg_reset(f->url);
    sql(f->url, "CREATE TABLE accounts(id int)");
    assert_int_equal(jd_store_open(&cfg, &second, &err), JD_ECORRUPT);
    assert_non_null(strstr(err.message, "not a Jackdaw database"));
    /* nobody listening: JD_EIO naming the URL without its password */
    cfg.path = "postgres://ann:s3cret@127.0.0.1:1/jd";
    assert_int_equal(jd_store_open(&cfg, &second, &err), JD_EIO);
    assert_non_null(strstr(err.message, "postgres://ann:***@127.0.0.1:1/jd"));
    assert_null(strstr(err.message, "s3cret"));
    test_pg_reset(f->url);
    assert_int_equal(fx_open(f, &err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_display_url_hides_the_password),
        cmocka_unit_test_setup_teardown(test_a_job_owned_by_another_node_is_fenced, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_bad_definition_fails_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batched_inserts_keep_every_byte, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_batch_folds_a_jobs_changes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_grouped_changes_never_scan_the_jobs_table, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_grouped_changes_probe_each_job_by_key, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_labels_found_where_parsing_finds_them, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_unclean_restart_adopts_jobs_and_ids_go_on, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
