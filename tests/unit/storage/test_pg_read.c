/*
 * The PostgreSQL reads (storage/pg_read.c) on a real server: every read's
 * plan uses an index (no table scan of jobs, events, labels, definitions
 * or tasks; no sort where an index gives the order), generic and custom
 * plans alike, for the fixed reads and every find and event-stream shape;
 * recovery pages across several id pages in one snapshot; the task-state
 * rule; names in byte order; a read survives its connection being killed.
 * Rows are written with SQL directly, so the reads are tested apart from
 * the writer. The read pool: capped (a reader past the cap waits, then
 * gets JD_EBUSY; a failed connect frees its slot), idle connections closed
 * down to the minimum, many threads sharing a few connections (TSan).
 * Skipped without JD_TEST_PG_URL (tests/integration/
 * test_store_pg.sh sets it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "storage/pg_read.c"

#include "find_shapes.h"
#include "store_test_util.h"

#include <pthread.h>
#include <unistd.h>

struct fx {
    char *url;
    struct jd_store *s;
    PGconn *db; /* the test's own connection: rows and plans */
};

static void sql(PGconn *db, const char *q)
{
    PGresult *r = PQexec(db, q);
    if (jd_pg_rc(r))
        fail_msg("%s: %s", q, PQerrorMessage(db));
    PQclear(r);
}

static int setup_with(void **state, struct jd_store_config cfg)
{
    if (!test_pg_url())
        return 0;
    struct fx *f = jd_xcalloc(1, sizeof *f);
    test_pg_reset(test_pg_url());
    f->url = jd_xstrdup(test_pg_url());
    cfg.path = f->url;
    struct jd_error err;
    assert_int_equal(jd_store_open(&cfg, &f->s, &err), 0);
    f->db = PQconnectdb(f->url);
    assert_int_equal(PQstatus(f->db), CONNECTION_OK);
    sql(f->db, "SET client_min_messages = warning");
    *state = f;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, (struct jd_store_config){0});
}

/* A small pool: 3 connections, 1 s of waiting, idle after 200 ms. */
#define POOL_MAX 3
static int setup_pool(void **state)
{
    return setup_with(state, (struct jd_store_config){
                                 .read_max = POOL_MAX, .read_wait_ms = 1000, .read_idle_ms = 200});
}

static int teardown(void **state)
{
    struct fx *f = *state;
    if (!f)
        return 0;
    PQfinish(f->db);
    jd_store_close(f->s);
    free(f->url);
    free(f);
    return 0;
}

/* n jobs with ids from `first`: queue q<id%5>, priority id%3, state
 * states[id%nstates], run_at_ms 1000+id (+500 for every 7th: delayed),
 * created_ms 1000+id, every 50th from schedule s<id%3>, every 4th with
 * a handler, each with a labelled definition and three events (state,
 * dispatch, complete). */
static void fill(PGconn *db, int64_t first, int64_t n, const char *states)
{
    char *q = jd_xasprintf(
        "INSERT INTO jobs(id, queue, priority, state, run_at_ms, created_ms, updated_ms,"
        " schedule_id, handler, owner_node)"
        " SELECT i, 'q' || (i %% 5), i %% 3, ('{%s}'::bigint[])[1 + i %% %d],"
        " 1000 + i + CASE WHEN i %% 7 = 0 THEN 500 ELSE 0 END, 1000 + i, 1000 + i,"
        " CASE WHEN i %% 50 = 0 THEN 's' || (i %% 3) END,"
        " CASE WHEN i %% 4 = 0 THEN 'h' || (i %% 5) END, 1"
        " FROM generate_series(%" PRId64 ", %" PRId64 ") i;"
        "INSERT INTO job_definitions SELECT i, '{\"handler\":\"x\",\"labels\":{\"team\":\"t'"
        " || (i %% 20) || '\"},\"traceparent\":\"00-' || i || '\"}'"
        " FROM generate_series(%" PRId64 ", %" PRId64 ") i;"
        "INSERT INTO job_labels SELECT 'team', 't' || (i %% 20), i"
        " FROM generate_series(%" PRId64 ", %" PRId64 ") i;"
        "INSERT INTO events(job_id, seq, time_ms, kind, tag, data)"
        " SELECT i, k, 1000, k - 1, CASE WHEN k > 1 THEN 1 ELSE 0 END,"
        " CASE k WHEN 1 THEN '{\"state\":\"queued\"}' WHEN 2 THEN '{\"attempt\":1}'"
        " ELSE '{\"result\":1}' END"
        " FROM generate_series(%" PRId64 ", %" PRId64 ") i, generate_series(1, 3) k;"
        "UPDATE jobs SET version = 3 WHERE id BETWEEN %" PRId64 " AND %" PRId64 ";",
        states, (int)strlen(states) / 2 + 1, first, first + n - 1, first, first + n - 1, first,
        first + n - 1, first, first + n - 1, first, first + n - 1);
    sql(db, q);
    free(q);
}

/* ---- plans ---- */

/* Sample arguments of each fixed read (SQL literals). */
static const char *const plan_args[PR_N] = {
    [PR_JOB_GET] = "5",
    [PR_JOBS_BY_IDS] = "'{1,2,3}'",
    [PR_LIST_ALL] = "900000, 11",
    [PR_LIST_STATE] = "900000, 11, 2",
    [PR_LIST_QUEUE] = "900000, 11, 'q1'",
    [PR_LIST_QUEUE_STATE] = "900000, 11, 1, 'q1'",
    [PR_LIST_SCHEDULE] = "900000, 11, 's1'",
    [PR_LIST_SCHEDULE_STATE] = "900000, 11, 1, 's1'",
    [PR_EVENTS] = "5, 0, 100",
    [PR_EVENTS_OF_JOBS] = "'{1,2,3}'",
    [PR_IDEM] = "'k'",
    [PR_ACTIVE] = "0, 128, 1",
    [PR_STARTED] = "0, 128, 1",
    [PR_QUEUED_SAME] = "'q1', 1, 0, 900000, 100, 1",
    [PR_QUEUED_LOWER] = "'q1', 1, 900000, 100, 1",
    [PR_QUEUED_LATER] = "0, 0, 900000, 100, 1",
    [PR_OLDEST_QUEUED] = "'q1'",
    [PR_SCHED_GET] = "'s1'",
    [PR_SCHED_LIST] = "'', 11",
    [PR_SCHED_EVENTS] = "'s1', 0, 100",
    [PR_TASK_STATE] = "'t10'",
    [PR_TASK_CLAIMED] = "10, 1, 1",
    [PR_TRACEPARENTS] = "'{1,2,3}'",
};

/* Reads whose order must come from an index (their sort would be over
 * every matching row); the others sort a bounded handful (a page of
 * events, two pages of ids) or a small table (queues, commands). A
 * schedule's jobs of one state may be sorted: the schedule's index range
 * is read either way when the state is rare (as in SQLite). */
static bool needs_index_order(int which)
{
    switch (which) {
    case PR_LIST_ALL:
    case PR_LIST_STATE:
    case PR_LIST_QUEUE:
    case PR_LIST_QUEUE_STATE:
    case PR_LIST_SCHEDULE:
    case PR_EVENTS:
    case PR_ACTIVE:
    case PR_QUEUED_SAME:
    case PR_QUEUED_LOWER:
    case PR_QUEUED_LATER:
    case PR_OLDEST_QUEUED:
    case PR_SCHED_EVENTS:
        return true;
    default:
        return false;
    }
}

/* Fail if the plan of "EXPLAIN <what>" scans a big table, walks the jobs
 * primary key when pkey is false (filtering rows by a column another index
 * leads with), or sorts when sorted is false. Table scans are off
 * (enable_seqscan), so a scan in the plan means no index serves the read. */
static void check_plan(PGconn *db, const char *what, const char *label, bool sorted, bool pkey)
{
    char *q = jd_xasprintf("EXPLAIN (COSTS OFF) %s", what);
    PGresult *r = PQexec(db, q);
    if (jd_pg_rc(r))
        fail_msg("%s: %s", q, PQerrorMessage(db));
    static const char *const big[] = {"jobs",       "job_definitions", "events",
                                      "job_labels", "tasks",           "schedule_events"};
    for (int i = 0; i < PQntuples(r); i++) {
        const char *line = PQgetvalue(r, i, 0);
        const char *scan = strstr(line, "Seq Scan on ");
        for (size_t b = 0; scan && b < sizeof big / sizeof big[0]; b++) {
            size_t len = strlen(big[b]);
            if (strncmp(scan + 12, big[b], len) == 0 &&
                (scan[12 + len] == ' ' || scan[12 + len] == '\0'))
                fail_msg("%s scans a table:\n  %s\n  %s", label, line, what);
        }
        const char *after = i + 1 < PQntuples(r) ? PQgetvalue(r, i + 1, 0) : "";
        const char *bad = NULL;
        if (!pkey && strstr(line, "using jobs_pkey on jobs") && !strstr(after, "(id = "))
            bad = "walks the primary key";
        /* definitions are looked up per job, never walked (a merge join
         * would read every older one) */
        if (strstr(line, "using job_definitions_pkey") && !strstr(after, "(job_id = "))
            bad = "walks job_definitions";
        if (!sorted && strstr(line, "Sort"))
            bad = "sorts";
        if (bad) {
            for (int k = 0; k < PQntuples(r); k++)
                fprintf(stderr, "  %s\n", PQgetvalue(r, k, 0));
            fail_msg("%s %s:\n  %s\n  %s", label, bad, line, what);
        }
    }
    PQclear(r);
    free(q);
}

/* Check a built find or event-stream statement's plans, with its values
 * and generic (as check_plan, with sorted for the custom plan only). */
static void check_built(PGconn *db, struct jd_find_sql *q, const char *label, bool pkey)
{
    /* The last parameter is the scan budget (JD_FIND_SCAN), larger than
     * this table, where a plan reading it all would be right; a table
     * larger than the budget is what the plan is for. */
    assert_true(q->n > 0 && !q->b[q->n - 1].text && q->b[q->n - 1].i == JD_FIND_SCAN);
    q->b[q->n - 1].i = 50;
    PGresult *r = PQprepare(db, "b", q->sql, 0, NULL);
    if (jd_pg_rc(r))
        fail_msg("%s: %s", q->sql, PQerrorMessage(db));
    PQclear(r);
    char args[4096] = "";
    size_t len = 0;
    for (int i = 0; i < q->n; i++) {
        char *lit = q->b[i].text ? PQescapeLiteral(db, q->b[i].text, strlen(q->b[i].text)) : NULL;
        len += (size_t)snprintf(args + len, sizeof args - len, "%s", i ? ", " : "");
        if (lit)
            len += (size_t)snprintf(args + len, sizeof args - len, "%s", lit);
        else
            len += (size_t)snprintf(args + len, sizeof args - len, "%" PRId64, q->b[i].i);
        PQfreemem(lit);
    }
    char *ex = jd_xasprintf("EXECUTE b(%s)", args);
    sql(db, "SET plan_cache_mode = force_custom_plan");
    check_plan(db, ex, label, true, pkey);
    sql(db, "SET plan_cache_mode = force_generic_plan");
    check_plan(db, ex, label, false, pkey);
    sql(db, "DEALLOCATE b");
    free(ex);
    free(q->sql);
}

/* Every find and event-stream shape (find_shapes.h). */
static void check_find_shapes(PGconn *db)
{
    for (unsigned m = 0; m < FIND_SHAPES; m++) {
        struct jd_job_find f = find_shape(m);
        struct jd_find_sql q;
        assert_int_equal(jd_find_sql_build_pg(&f, &q), 0);
        char label[32];
        snprintf(label, sizeof label, "find shape %u", m);
        /* only the unfiltered shapes may walk the primary key */
        check_built(db, &q, label, (m & (1 | 2 | 4 | 8 | 16 | 32 | 64 | 128)) == 0);
    }
    for (unsigned m = 0; m < EVENT_SHAPES; m++) {
        struct jd_event_find f = event_shape(m);
        struct jd_find_sql q;
        assert_int_equal(jd_event_sql_build_pg(&f, &q), 0);
        char label[32];
        snprintf(label, sizeof label, "event shape %u", m);
        check_built(db, &q, label, false);
    }
}

/* The PostgreSQL dialect of every find and event-stream shape (no server
 * needed): parameters numbered $1..$n in bind order, one per bind, and
 * nothing SQLite-only left. */
static void check_dialect(const struct jd_find_sql *q)
{
    static const char *const sqlite_only[] = {"INDEXED BY", "CROSS JOIN", "json_extract", "?",
                                              "instr("};
    for (size_t i = 0; i < sizeof sqlite_only / sizeof sqlite_only[0]; i++)
        if (strstr(q->sql, sqlite_only[i]))
            fail_msg("%s in %s", sqlite_only[i], q->sql);
    int next = 1;
    for (const char *p = strchr(q->sql, '$'); p; p = strchr(p + 1, '$')) {
        char *end;
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1)
            continue; /* not a parameter */
        if (v != next)
            fail_msg("$%ld where $%d was due in %s", v, next, q->sql);
        next++;
    }
    assert_int_equal(next - 1, q->n);
}

static void test_pg_dialect_of_every_shape(void **state)
{
    (void)state;
    for (unsigned m = 0; m < FIND_SHAPES; m++) {
        struct jd_job_find f = find_shape(m);
        struct jd_find_sql q;
        assert_int_equal(jd_find_sql_build_pg(&f, &q), 0);
        check_dialect(&q);
        free(q.sql);
    }
    for (unsigned m = 0; m < EVENT_SHAPES; m++) {
        struct jd_event_find f = event_shape(m);
        struct jd_find_sql q;
        assert_int_equal(jd_event_sql_build_pg(&f, &q), 0);
        check_dialect(&q);
        free(q.sql);
    }
}

static void test_every_read_uses_an_index(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    fill(f->db, 1, 3000, "0,1,2,3,4,5");
    sql(f->db, "INSERT INTO tasks SELECT 't' || i, i, 1, 1, 'c', 1, NULL, 0, 0"
               " FROM generate_series(10, 3000, 10) i;"
               "ANALYZE; SET enable_seqscan = off;");
    for (int mode = 0; mode < 2; mode++) {
        /* the plans PostgreSQL picks for a prepared read: with its
         * values, and the generic one it may switch to */
        sql(f->db, mode ? "SET plan_cache_mode = force_generic_plan"
                        : "SET plan_cache_mode = force_custom_plan");
        for (int i = 0; i < PR_N; i++) {
            char *prep = jd_xasprintf("PREPARE p%d AS %s", i, pg_sql[i]);
            sql(f->db, prep);
            char *ex = plan_args[i] ? jd_xasprintf("EXECUTE p%d(%s)", i, plan_args[i])
                                    : jd_xasprintf("EXECUTE p%d", i);
            char label[32];
            snprintf(label, sizeof label, "pg_sql[%d]", i);
            /* With its values, the planner may sort the few rows it knows
             * an index range holds (this table is small); the generic plan,
             * planned for any values, must take the order from the index. */
            check_plan(f->db, ex, label, mode == 0 || !needs_index_order(i),
                       i == PR_JOB_GET || i == PR_JOBS_BY_IDS || i == PR_LIST_ALL);
            free(ex);
            free(prep);
        }
        sql(f->db, "DEALLOCATE ALL");
    }
    check_find_shapes(f->db);
}

/* More shapes than a session keeps prepared (PG_DYN_SLOTS), twice over:
 * each answers the same after its statement was evicted and prepared
 * again, and a session's prepared statements stay bounded. */
static void test_find_shapes_cycle_through_the_session_cache(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    fill(f->db, 1, 400, "0,1,2,3,4,5");
    sql(f->db, "UPDATE jobs SET queue = 'q', handler = CASE WHEN handler IS NULL THEN NULL"
               " ELSE 'exec' END, schedule_id = CASE WHEN schedule_id IS NULL THEN NULL"
               " ELSE 's' END");
    enum { SHAPES = 3 * PG_DYN_SLOTS };
    size_t first[SHAPES];
    for (int round = 0; round < 2; round++)
        for (unsigned m = 0; m < SHAPES; m++) {
            struct jd_job_find q = find_shape(m * 7 % FIND_SHAPES);
            q.limit = 1000;
            struct jd_job *rows;
            size_t n;
            struct jd_job_find_cursor next;
            assert_int_equal(jd_store_job_find(f->s, &q, true, &rows, &n, &next), 0);
            if (round == 0)
                first[m] = n;
            else
                assert_int_equal(n, first[m]);
            jd_jobs_free(rows, n);
        }
    /* the pool's one session holds at most the slots (and the fixed reads) */
    struct jd_pg_rconn *c;
    assert_int_equal(jd_pg_rconn_get(f->s, &c), 0);
    PGresult *r = PQexec(jd_pg_rconn_conn(c), "SELECT count(*) FROM pg_prepared_statements"
                                              " WHERE name LIKE 'jdd%'");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_true(atoi(PQgetvalue(r, 0, 0)) <= PG_DYN_SLOTS);
    assert_true(atoi(PQgetvalue(r, 0, 0)) > 0);
    PQclear(r);
    jd_pg_rconn_put(f->s, c);
    bool some = false;
    for (unsigned m = 0; m < SHAPES; m++)
        some |= first[m] > 0;
    assert_true(some);
}

/* ---- recovery ---- */

struct seen {
    int64_t ids[4096];
    size_t n, events;
    int64_t stop_at;            /* return -77 at this id */
    struct jd_store *write_to;  /* at the first job, commit a change of job `change` */
    int64_t change, changed_to; /* ... and the state recovery then saw it in */
};

static int seen_fn(void *arg, const struct jd_job *job, const struct jd_job_event *ev, size_t n)
{
    struct seen *s = arg;
    assert_true(s->n < 4096);
    s->ids[s->n++] = job->id;
    assert_non_null(job->definition);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ev[i].job_id, job->id);
        assert_true(ev[i].kind > 0); /* the state events are not recovery's */
        assert_true(i == 0 || ev[i].seq > ev[i - 1].seq);
    }
    s->events += n;
    if (s->write_to && s->n == 1) {
        /* the writer commits while this snapshot is open: reads never
         * block it (this would hang otherwise) */
        struct tres r;
        assert_int_equal(change_state_wait(s->write_to, s->change, JD_JOB_SUCCEEDED, &r), 0);
    }
    if (job->id == s->change)
        s->changed_to = job->state;
    return job->id == s->stop_at ? -77 : 0;
}

static void test_recovery_pages_in_one_snapshot(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    /* more active jobs than three id pages; every third succeeded */
    fill(f->db, 1, 3 * PG_JOB_PAGE + 20, "0,1,2,3,0,2");
    struct seen *s = jd_xcalloc(1, sizeof *s);
    assert_int_equal(jd_store_recover(f->s, seen_fn, s), 0);
    size_t active = 0;
    for (int64_t id = 1; id <= 3 * PG_JOB_PAGE + 20; id++)
        active += id % 6 != 3;
    assert_int_equal(s->n, active);
    assert_int_equal(s->events, 2 * active); /* dispatch and complete */
    for (size_t i = 1; i < s->n; i++)
        assert_true(s->ids[i] > s->ids[i - 1]);
    /* started only: running (id%6 == 1) and waiting (2, 5), merged by id */
    memset(s, 0, sizeof *s);
    assert_int_equal(jd_store_recover_started(f->s, seen_fn, s), 0);
    for (size_t i = 0; i < s->n; i++) {
        int64_t m = s->ids[i] % 6;
        assert_true(m == 1 || m == 2 || m == 5);
        assert_true(i == 0 || s->ids[i] > s->ids[i - 1]);
    }
    assert_true(s->n > PG_JOB_PAGE); /* more than one page */
    /* one snapshot: a job a later page holds, finished by the writer while
     * the walk is on, is still handed over as it was */
    memset(s, 0, sizeof *s);
    sql(f->db, "UPDATE jobs SET owner_node = (SELECT max(id) FROM jd_nodes)");
    s->write_to = f->s;
    s->change = 3 * PG_JOB_PAGE + 1; /* % 6 == 1: running, on the fourth page */
    s->changed_to = -1;
    assert_int_equal(jd_store_recover(f->s, seen_fn, s), 0);
    assert_int_equal(s->n, active);
    assert_int_equal(s->changed_to, JD_JOB_RUNNING);
    struct jd_job j;
    assert_int_equal(jd_store_job_get(f->s, s->change, &j), 0);
    assert_int_equal(j.state, JD_JOB_SUCCEEDED); /* committed all the same */
    jd_job_clear(&j);
    /* fn's negative return stops the walk and is returned */
    memset(s, 0, sizeof *s);
    s->stop_at = PG_JOB_PAGE + 2; /* 130 % 6 == 4: queued, on the second page */
    assert_int_equal(jd_store_recover(f->s, seen_fn, s), -77);
    assert_int_equal(s->ids[s->n - 1], PG_JOB_PAGE + 2);
    free(s);
}

/* ---- the task-state rule, byte order, a killed connection ---- */

static void test_task_state_reads_completion_from_history(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    fill(f->db, 1, 3, "1");
    sql(f->db, "INSERT INTO tasks VALUES ('a', 1, 1, 1, 'c', 1, 'w', 0, 0),"
               " ('b', 2, 2, 1, 'c', 1, 'w', 0, 0), ('c', 3, 1, 1, 'c', 1, 'w', 0, 0);"
               /* job 3: a later attempt of tag 1 was dispatched after the completion */
               "INSERT INTO events(job_id, seq, time_ms, kind, tag, data)"
               " VALUES (3, 4, 1, 1, 1, '{\"attempt\":2}')");
    int st;
    int64_t job;
    assert_int_equal(jd_store_task_state(f->s, "a", &st, &job), 0);
    assert_int_equal(st, JD_TASK_COMPLETED); /* tag 1 completed in job 1's history */
    assert_int_equal(job, 1);
    assert_int_equal(jd_store_task_state(f->s, "b", &st, &job), 0);
    assert_int_equal(st, JD_TASK_CLAIMED); /* no completion for tag 2 */
    assert_int_equal(jd_store_task_state(f->s, "c", &st, &job), 0);
    assert_int_equal(st, JD_TASK_CLAIMED); /* attempt 2 came after it */
    assert_int_equal(jd_store_task_state(f->s, "nope", &st, &job), JD_ENOENT);
    bool claimed;
    assert_int_equal(jd_store_task_claimed(f->s, 2, 2, 1, &claimed), 0);
    assert_true(claimed);
    assert_int_equal(jd_store_task_claimed(f->s, 2, 2, 2, &claimed), 0);
    assert_false(claimed);
}

static void test_names_in_byte_order(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    /* byte order: "B" < "_" < "a"; a linguistic collation puts "_" first,
     * then "a" before "B": give the names one (ICU's root, which Debian's
     * server has), as a database created with a locale would */
    PGresult *r = PQexec(f->db, "SELECT 1 FROM pg_collation WHERE collname = 'und-x-icu'");
    if (PQntuples(r) == 1)
        sql(f->db, "ALTER TABLE schedules ALTER COLUMN id TYPE text COLLATE \"und-x-icu\";"
                   "ALTER TABLE queues ALTER COLUMN name TYPE text COLLATE \"und-x-icu\";"
                   "ALTER TABLE queue_counts ALTER COLUMN queue TYPE text COLLATE \"und-x-icu\"");
    PQclear(r);
    sql(f->db, "INSERT INTO schedules(id, definition, created_ms, updated_ms) VALUES"
               " ('a', '{}', 1, 1), ('B', '{}', 1, 1), ('_', '{}', 1, 1);"
               "INSERT INTO queues(name, paused) VALUES ('a', 1), ('B', 1);"
               "INSERT INTO queue_counts VALUES ('_', 0, 2), ('a', 3, 1), ('a', 4, 0)");
    struct jd_schedule_row *rows;
    size_t n;
    char *next;
    assert_int_equal(jd_store_schedule_list(f->s, NULL, 2, &rows, &n, &next), 0);
    assert_int_equal(n, 2);
    assert_string_equal(rows[0].id, "B");
    assert_string_equal(rows[1].id, "_");
    assert_string_equal(next, "_");
    jd_schedule_rows_free(rows, n);
    char *after = next;
    assert_int_equal(jd_store_schedule_list(f->s, after, 2, &rows, &n, &next), 0);
    free(after);
    assert_int_equal(n, 1);
    assert_string_equal(rows[0].id, "a");
    assert_null(next);
    jd_schedule_rows_free(rows, n);
    struct jd_queue_counts *qc;
    assert_int_equal(jd_store_queue_counts(f->s, &qc, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(qc[0].queue, "B");
    assert_true(qc[0].paused);
    assert_string_equal(qc[1].queue, "_");
    assert_false(qc[1].paused);
    assert_int_equal(qc[1].counts[JD_JOB_QUEUED], 2);
    assert_string_equal(qc[2].queue, "a");
    assert_true(qc[2].paused);
    assert_int_equal(qc[2].counts[JD_JOB_SUCCEEDED], 1);
    assert_int_equal(qc[2].counts[JD_JOB_FAILED], 0);
    jd_queue_counts_free(qc, n);
    char **names;
    assert_int_equal(jd_store_paused_queues(f->s, &names, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "B");
    jd_strings_free(names, n);
}

static void test_a_read_survives_a_killed_connection(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    fill(f->db, 1, 2, "0");
    struct jd_job j;
    assert_int_equal(jd_store_job_get(f->s, 1, &j), 0); /* a pooled connection now */
    jd_job_clear(&j);
    sql(f->db, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
               " WHERE application_name = 'jackdawd-read'");
    /* whichever connections died, reads go on (reopened, retried once) */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(jd_store_job_get(f->s, 2, &j), 0);
        assert_int_equal(j.id, 2);
        jd_job_clear(&j);
    }
    int64_t last;
    assert_int_equal(jd_store_event_last_id(f->s, &last), 0);
    assert_true(last > 0);
}

/* ---- the pool ---- */

/* Read sessions the server has for this database (pg_stat_activity). */
static int read_sessions(PGconn *db)
{
    PGresult *r = PQexec(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name ="
                             " 'jackdawd-read' AND datname = current_database()");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    int n = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return n;
}

struct getter {
    struct jd_store *s;
    struct jd_pg_rconn *c;
    int rc;
};

static void *get_main(void *arg)
{
    struct getter *g = arg;
    g->rc = jd_pg_rconn_get(g->s, &g->c);
    return NULL;
}

static void test_the_read_pool_is_capped(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    struct jd_pg_rconn *c[POOL_MAX], *extra = NULL;
    for (int i = 0; i < POOL_MAX; i++)
        assert_int_equal(jd_pg_rconn_get(f->s, &c[i]), 0);
    assert_int_equal(read_sessions(f->db), POOL_MAX);
    /* all busy: the next reader waits its second, then fails with EBUSY */
    uint64_t t0 = jd_clock_real_mono_ns();
    assert_int_equal(jd_pg_rconn_get(f->s, &extra), JD_EBUSY);
    assert_true(jd_clock_real_mono_ns() - t0 >= 900000000u);
    assert_int_equal(read_sessions(f->db), POOL_MAX);
    /* a waiting reader gets the connection another puts back */
    struct getter g = {.s = f->s};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, get_main, &g), 0);
    usleep(50 * 1000);
    jd_pg_rconn_put(f->s, c[0]);
    pthread_join(t, NULL);
    assert_int_equal(g.rc, 0);
    assert_ptr_equal(g.c, c[0]);
    c[0] = g.c;
    assert_int_equal(read_sessions(f->db), POOL_MAX);
    /* a connection that broke is closed on put: its slot opens a new one */
    PQfinish(c[1]->conn);
    c[1]->conn = PQconnectdb("postgresql://127.0.0.1:1/nothing?connect_timeout=1");
    assert_int_not_equal(PQstatus(c[1]->conn), CONNECTION_OK);
    jd_pg_rconn_put(f->s, c[1]);
    assert_int_equal(jd_pg_rconn_get(f->s, &c[1]), 0);
    /* a connect that fails frees its slot: the pool does not shrink for good */
    jd_pg_rconn_put(f->s, c[2]);
    jd_pg_rconn_put(f->s, c[1]);
    jd_pg_rconn_put(f->s, c[0]);
    unsigned open, idle;
    jd_pg_read_pool_count(f->s, &open, &idle);
    assert_int_equal(open, POOL_MAX);
    assert_int_equal(idle, POOL_MAX);
    char *url = f->s->pg->url, bad[] = "postgresql://127.0.0.1:1/nothing?connect_timeout=1";
    f->s->pg->url = bad;
    for (int i = 0; i < POOL_MAX; i++)
        assert_int_equal(jd_pg_rconn_get(f->s, &c[i]), 0); /* the idle ones */
    PQfinish(c[0]->conn);                                  /* broken: the put closes it */
    c[0]->conn = PQconnectdb(bad);
    jd_pg_rconn_put(f->s, c[0]);
    for (int i = 0; i < 2 * POOL_MAX; i++) {
        assert_int_equal(jd_pg_rconn_get(f->s, &c[0]), JD_EIO); /* a free slot, a failed connect */
        jd_pg_read_pool_count(f->s, &open, &idle);
        assert_int_equal(open, POOL_MAX - 1);
    }
    f->s->pg->url = url;
    assert_int_equal(jd_pg_rconn_get(f->s, &c[0]), 0);
    for (int i = 0; i < POOL_MAX; i++)
        jd_pg_rconn_put(f->s, c[i]);
}

static void test_idle_read_connections_are_closed(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    struct jd_pg_rconn *c[POOL_MAX];
    for (int i = 0; i < POOL_MAX; i++)
        assert_int_equal(jd_pg_rconn_get(f->s, &c[i]), 0);
    for (int i = 0; i < POOL_MAX; i++)
        jd_pg_rconn_put(f->s, c[i]);
    assert_int_equal(read_sessions(f->db), POOL_MAX);
    usleep(400 * 1000); /* past the idle time */
    struct jd_job j;
    assert_int_equal(jd_store_job_get(f->s, 1, &j), JD_ENOENT); /* a get and a put */
    unsigned open, idle;
    jd_pg_read_pool_count(f->s, &open, &idle);
    assert_int_equal(open, JD_PG_READ_MIN_IDLE);
    assert_int_equal(idle, JD_PG_READ_MIN_IDLE);
    /* the server side ends with the sessions (its backends exit at once) */
    int n = -1;
    for (int i = 0; i < 100 && (n = read_sessions(f->db)) != JD_PG_READ_MIN_IDLE; i++)
        usleep(50 * 1000);
    assert_int_equal(n, JD_PG_READ_MIN_IDLE);
    /* the minimum stays however long it idles */
    usleep(400 * 1000);
    assert_int_equal(jd_store_job_get(f->s, 1, &j), JD_ENOENT);
    jd_pg_read_pool_count(f->s, &open, &idle);
    assert_int_equal(open, JD_PG_READ_MIN_IDLE);
}

#define READERS 8
#define READS 150

struct reader {
    struct jd_store *s;
    int failed;
};

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    for (int i = 0; i < READS; i++) {
        struct jd_job j;
        if (jd_store_job_get(r->s, 1 + i % 20, &j) != 0)
            r->failed++;
        else
            jd_job_clear(&j);
    }
    return NULL;
}

static void test_many_readers_share_the_capped_pool(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    fill(f->db, 1, 20, "0,3");
    struct reader r[READERS];
    pthread_t t[READERS];
    for (int i = 0; i < READERS; i++) {
        r[i] = (struct reader){.s = f->s};
        assert_int_equal(pthread_create(&t[i], NULL, reader_main, &r[i]), 0);
    }
    int most = 0;
    for (int k = 0; k < 20; k++) {
        int n = read_sessions(f->db);
        most = n > most ? n : most;
        usleep(10 * 1000);
    }
    for (int i = 0; i < READERS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(r[i].failed, 0); /* each waited its turn, none timed out */
    }
    assert_true(most <= POOL_MAX);
    unsigned open, idle;
    jd_pg_read_pool_count(f->s, &open, &idle);
    assert_true(open <= POOL_MAX);
    assert_int_equal(idle, open);
}

int main(void)
{
    if (!test_pg_url())
        fprintf(stderr, "test_pg_read: JD_TEST_PG_URL is not set: skipped\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pg_dialect_of_every_shape),
        cmocka_unit_test_setup_teardown(test_every_read_uses_an_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_find_shapes_cycle_through_the_session_cache, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_recovery_pages_in_one_snapshot, setup, teardown),
        cmocka_unit_test_setup_teardown(test_task_state_reads_completion_from_history, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_names_in_byte_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_read_survives_a_killed_connection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_read_pool_is_capped, setup_pool, teardown),
        cmocka_unit_test_setup_teardown(test_idle_read_connections_are_closed, setup_pool,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_many_readers_share_the_capped_pool, setup_pool,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
