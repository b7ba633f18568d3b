/*
 * The cluster's storage promises (storage/store.h, "the cluster"), on a
 * real PostgreSQL with two nodes in one process (two jd_store_open on one
 * database are two node incarnations): a node whose lease lapsed cannot
 * write even before its jobs are taken over; the takeover unowns them and
 * a claim hands them out once, with their history and a crash count;
 * a stale write racing a takeover is refused; two concurrent claimers
 * never share a job; an inbox request is recorded once; a commit's notice
 * reaches the other node's hooks; a conditional fire commits once; the
 * event stream never shows an event before one an open writer of another
 * node may still commit with a smaller id; a node's advertised URL is
 * found only while it is alive, and a task announcement reaches the other
 * node. These
 * need JD_TEST_PG_URL (tests/integration/test_store_pg.sh sets it) and
 * skip without it; SQLite's answers (a cluster of one) are checked always.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "storage/pg.h"
#include "storage/store.h"
#include "store_test_util.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#define LEASE_MS 1000 /* small, so a lapse takes a second; heartbeats every 200 ms */
#define WAIT_MS 15000 /* how long a test waits for something that must happen */

struct fx {
    char *url;
    struct jd_store *a, *b;
};

static struct jd_store *node_open(const char *url)
{
    struct jd_store_config cfg = {.path = url, .lease_ms = LEASE_MS};
    struct jd_store *s = NULL;
    struct jd_error err;
    if (jd_store_open(&cfg, &s, &err) != 0)
        fail_msg("open: %s", err.message);
    return s;
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
    f->a = node_open(f->url);
    f->b = node_open(f->url);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    if (!f)
        return 0;
    jd_pg_test_hold_commit(f->a, false); /* a failed test may have left it held */
    jd_store_close(f->a);
    jd_store_close(f->b);
    free(f->url);
    free(f);
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One integer from sql on the test database. */
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

static int64_t insert_on(struct jd_store *s)
{
    struct tres r;
    struct jd_job j = make_job(jd_store_next_id(s), "default", NULL);
    assert_int_equal(insert_wait(s, &j, NULL, &r), 0);
    return j.id;
}

static int64_t owner_of(struct fx *f, int64_t id)
{
    char q[128];
    snprintf(q, sizeof q, "SELECT coalesce(owner_node, 0) FROM jobs WHERE id = %lld",
             (long long)id);
    return sql_int(f->url, q);
}

struct claimed {
    pthread_mutex_t mu;
    int64_t ids[1024];
    size_t n;
    uint32_t crashes[1024];
    size_t events[1024];
};

static int claim_fn(void *arg, const struct jd_job *job, const struct jd_job_event *ev, size_t n)
{
    struct claimed *c = arg;
    pthread_mutex_lock(&c->mu);
    if (c->n < 1024) {
        c->crashes[c->n] = job->crashes;
        c->events[c->n] = n;
        c->ids[c->n++] = job->id;
    }
    pthread_mutex_unlock(&c->mu);
    (void)ev;
    return 0;
}

/* Claim on s until c holds want jobs (WAIT_MS at most). */
static void claim_until(struct jd_store *s, struct claimed *c, size_t want)
{
    for (int waited = 0; c->n < want && waited < WAIT_MS; waited += 50) {
        size_t n = 0;
        assert_int_equal(jd_store_claim(s, 64, claim_fn, c, &n), 0);
        if (c->n < want)
            sleep_ms(50);
    }
}

static void test_two_nodes_share_a_database(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    assert_true(jd_store_clustered(f->a));
    assert_true(jd_store_node_id(f->b) > jd_store_node_id(f->a));
    int64_t ja = insert_on(f->a), jb = insert_on(f->b);
    assert_int_equal(owner_of(f, ja), jd_store_node_id(f->a));
    assert_int_equal(owner_of(f, jb), jd_store_node_id(f->b));
    /* each writes its own, neither the other's */
    struct tres r;
    assert_int_equal(change_state_wait(f->a, ja, JD_JOB_RUNNING, &r), 0);
    assert_int_equal(change_state_wait(f->a, jb, JD_JOB_RUNNING, &r), JD_ESTALE);
    assert_int_equal(change_state_wait(f->b, ja, JD_JOB_RUNNING, &r), JD_ESTALE);
    struct jd_cluster_stats st;
    jd_store_cluster_stats(f->b, &st);
    assert_int_equal(st.fenced, 1);
    /* nothing to claim: both own theirs */
    struct claimed c = {.mu = PTHREAD_MUTEX_INITIALIZER};
    size_t n = 9;
    assert_int_equal(jd_store_claim(f->b, 10, claim_fn, &c, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(jd_store_claim(f->b, 0, claim_fn, &c, &n), JD_EINVAL);
    /* each node counts into its own queue_counts row; reads sum them */
    char q[160];
    snprintf(q, sizeof q, "SELECT count(*) FROM queue_counts WHERE slot = %lld",
             (long long)jd_store_node_id(f->a));
    assert_true(sql_int(f->url, q) > 0);
    /* a clean close gives a node's jobs back at once (another claims
     * them) and folds its count rows into the shared one */
    jd_store_close(f->a);
    f->a = NULL;
    assert_int_equal(owner_of(f, ja), 0);
    assert_int_equal(sql_int(f->url, q), 0);
    assert_int_equal(sql_int(f->url,
                             "SELECT count(*) FROM (SELECT queue, state, count(*) AS n"
                             " FROM jobs GROUP BY 1, 2) a FULL JOIN (SELECT queue, state,"
                             " sum(n) AS n FROM queue_counts GROUP BY 1, 2) c"
                             " USING (queue, state) WHERE coalesce(a.n, 0) <> coalesce(c.n, 0)"),
                     0);
    claim_until(f->b, &c, 1);
    assert_int_equal(c.n, 1);
    assert_int_equal(c.ids[0], ja);
    assert_int_equal(c.crashes[0], 0); /* given back, not crashed */
    assert_int_equal(change_state_wait(f->b, ja, JD_JOB_SUCCEEDED, &r), 0);
    /* a finished job is nobody's future: a retry on a takes it for a */
    f->a = node_open(f->url);
    assert_int_equal(change_state_wait(f->a, ja, JD_JOB_RUNNING, &r), JD_ESTALE);
    assert_int_equal(change_state_wait(f->a, ja, JD_JOB_QUEUED, &r), 0);
    assert_int_equal(owner_of(f, ja), jd_store_node_id(f->a));
    assert_int_equal(change_state_wait(f->b, ja, JD_JOB_RUNNING, &r), JD_ESTALE);
}

static void test_a_lapsed_node_is_fenced_then_taken_over(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    int64_t queued = insert_on(f->a), started = insert_on(f->a);
    struct tres r;
    assert_int_equal(change_state_wait(f->a, started, JD_JOB_RUNNING, &r), 0);
    assert_int_equal(event_wait(f->a, started, JD_EVK_PROGRESS, 0, "{\"p\":1}", &r), 0);
    assert_true(jd_store_lease_ok(f->a));
    /* a stalls (no heartbeat, no takeover pass): its lease lapses; its
     * writes are refused from then on, whether or not b's takeover pass
     * has unowned its jobs yet */
    jd_pg_test_pause_heartbeat(f->a, true);
    for (int w = 0; w < WAIT_MS && jd_store_lease_ok(f->a); w += 20)
        sleep_ms(20);
    assert_false(jd_store_lease_ok(f->a));
    sleep_ms(LEASE_MS + 200); /* past the deadline in the database's clock too */
    assert_int_equal(change_state_wait(f->a, started, JD_JOB_SUCCEEDED, &r), JD_ESTALE);
    struct jd_write cw = {.op = JD_W_JOB_CRASHES, .job_id = queued, .crashes = 5};
    assert_int_equal(submit_wait(f->a, &cw, &r), JD_ESTALE);
    /* history appends of two jobs in one batch (the grouped statement) too */
    struct tres ra, rb;
    struct jd_write pa = {.op = JD_W_JOB_CHANGE,
                          .job_id = started,
                          .kind = JD_EVK_PROGRESS,
                          .data = "{}",
                          .done = tres_done,
                          .arg = &ra};
    struct jd_write pb = pa;
    pb.job_id = queued;
    pb.arg = &rb;
    struct jd_write *both[2] = {&pa, &pb};
    assert_int_equal(jd_store_submit_many(f->a, both, 2), 0);
    assert_int_equal(jd_store_sync(f->a), 0);
    assert_int_equal(ra.rc, JD_ESTALE);
    assert_int_equal(rb.rc, JD_ESTALE);

    /* b's takeover unowns them; b claims them with history and a crash */
    struct claimed c = {.mu = PTHREAD_MUTEX_INITIALIZER};
    claim_until(f->b, &c, 2);
    assert_int_equal(c.n, 2);
    for (size_t i = 0; i < 2; i++) {
        assert_true(c.ids[i] == queued || c.ids[i] == started);
        if (c.ids[i] == started) {
            assert_int_equal(c.crashes[i], 1);
            assert_int_equal(c.events[i], 1); /* its progress (the history past states) */
        } else {
            assert_int_equal(c.crashes[i], 0);
        }
    }
    struct jd_cluster_stats st;
    jd_store_cluster_stats(f->b, &st);
    assert_int_equal(st.takeovers, 2);
    assert_int_equal(st.claims, 2);
    /* a's row is gone: its heartbeat finds out, for good */
    jd_pg_test_pause_heartbeat(f->a, false);
    for (int w = 0; w < WAIT_MS; w += 20) {
        jd_store_cluster_stats(f->a, &st);
        if (st.lease_lost)
            break;
        sleep_ms(20);
    }
    assert_int_equal(st.lease_lost, 1);
    assert_false(jd_store_lease_ok(f->a));
    assert_false(jd_store_is_leader(f->a));
    assert_int_equal(change_state_wait(f->a, started, JD_JOB_SUCCEEDED, &r), JD_ESTALE);
    assert_int_equal(change_state_wait(f->b, started, JD_JOB_SUCCEEDED, &r), 0);
    /* a job a lease-less node inserts is nobody's: another claims it */
    int64_t late = insert_on(f->a);
    assert_int_equal(owner_of(f, late), 0);
}

struct racer {
    struct jd_store *s;
    int64_t id;
    struct tres r;
};

static void *stale_write(void *arg)
{
    struct racer *x = arg;
    change_state_wait(x->s, x->id, JD_JOB_SUCCEEDED, &x->r);
    return NULL;
}

static void test_a_stale_write_racing_a_takeover_is_refused(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    int64_t id = insert_on(f->a);
    /* a takeover in flight: the job's row is locked by its unowning */
    PGconn *t = PQconnectdb(f->url);
    char q[160];
    snprintf(q, sizeof q, "BEGIN; UPDATE jobs SET owner_node = NULL WHERE id = %lld",
             (long long)id);
    PGresult *r = PQexec(t, q);
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    /* a's write (its lease still valid) waits on the row lock ... */
    struct racer x = {.s = f->a, .id = id};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, stale_write, &x), 0);
    sleep_ms(300);
    assert_int_equal(x.r.calls, 0);
    /* ... and, once the takeover commits, finds the job not its own */
    r = PQexec(t, "COMMIT");
    PQclear(r);
    PQfinish(t);
    pthread_join(th, NULL);
    assert_int_equal(x.r.rc, JD_ESTALE);
    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->b, id, &got), 0);
    assert_int_equal(got.state, JD_JOB_QUEUED);
    assert_int_equal(got.version, 1);
    jd_job_clear(&got);
}

/* A stalled transaction holding a lapsed node's job row (as a node
 * stopped inside a batch does) makes takeover passes give up and retry;
 * it never holds up the other node's heartbeat. */
static void test_a_held_row_never_stalls_the_heartbeat(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    int64_t id = insert_on(f->a);
    PGconn *t = PQconnectdb(f->url);
    char q[160];
    snprintf(q, sizeof q, "BEGIN; UPDATE jobs SET updated_ms = updated_ms WHERE id = %lld",
             (long long)id);
    PGresult *r = PQexec(t, q);
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    jd_pg_test_pause_heartbeat(f->a, true);
    /* several leases: b's passes keep failing on the row, b stays alive */
    for (int w = 0; w < 3 * LEASE_MS; w += 50) {
        assert_true(jd_store_lease_ok(f->b));
        sleep_ms(50);
    }
    assert_int_equal(owner_of(f, id), jd_store_node_id(f->a));
    r = PQexec(t, "COMMIT");
    PQclear(r);
    PQfinish(t);
    struct claimed c = {.mu = PTHREAD_MUTEX_INITIALIZER};
    claim_until(f->b, &c, 1);
    assert_int_equal(c.n, 1);
    assert_int_equal(c.ids[0], id);
    assert_true(jd_store_lease_ok(f->b));
}

struct claimer {
    struct jd_store *s;
    struct claimed c;
};

static void *claim_all(void *arg)
{
    struct claimer *k = arg;
    for (;;) {
        size_t n = 0;
        if (jd_store_claim(k->s, 7, claim_fn, &k->c, &n) != 0 || n == 0)
            break;
    }
    return NULL;
}

static void test_concurrent_claimers_never_share_a_job(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    enum { N = 300 };
    for (int i = 0; i < N; i++)
        insert_on(f->a);
    jd_store_close(f->a); /* gives all N back */
    f->a = node_open(f->url);
    struct claimer k[2] = {{.s = f->a, .c = {.mu = PTHREAD_MUTEX_INITIALIZER}},
                           {.s = f->b, .c = {.mu = PTHREAD_MUTEX_INITIALIZER}}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, claim_all, &k[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(k[0].c.n + k[1].c.n, N);
    for (size_t i = 0; i < k[0].c.n; i++)
        for (size_t j = 0; j < k[1].c.n; j++)
            assert_true(k[0].c.ids[i] != k[1].c.ids[j]);
    assert_int_equal(sql_int(f->url, "SELECT count(*) FROM jobs WHERE owner_node IS NULL"), 0);
}

static void test_an_inbox_request_is_recorded_once(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    int64_t id = insert_on(f->a);
    struct tres r;
    /* b asks a's job to cancel; missing and terminal jobs are refused */
    struct jd_write w = {
        .op = JD_W_JOB_REQUEST, .job_id = id, .kind = JD_EVK_CANCEL, .data = "{\"reason\":\"x\"}"};
    assert_int_equal(submit_wait(f->b, &w, &r), 0);
    assert_true(w.request_id > 0);
    struct jd_write miss = w;
    miss.job_id = 999999999;
    assert_int_equal(submit_wait(f->b, &miss, &r), JD_ENOENT);
    struct jd_job_request *rows;
    size_t n;
    assert_int_equal(jd_store_requests(f->b, 0, 10, &rows, &n), 0); /* b owns nothing */
    assert_int_equal(n, 0);
    jd_job_requests_free(rows, n);
    assert_int_equal(jd_store_requests(f->a, 0, 10, &rows, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].id, w.request_id);
    assert_int_equal(rows[0].job_id, id);
    assert_int_equal(rows[0].kind, JD_EVK_CANCEL);
    assert_string_equal(rows[0].data, "{\"reason\":\"x\"}");
    jd_job_requests_free(rows, n);
    /* the owner records it, deleting the request in the same commit; a
     * second recording of the same request fails and writes nothing */
    struct jd_write ch = {.op = JD_W_JOB_CHANGE,
                          .job_id = id,
                          .set = JD_SET_STATE,
                          .state = JD_JOB_CANCELLED,
                          .kind = JD_EVK_CANCEL,
                          .data = "{\"reason\":\"x\"}",
                          .request_id = w.request_id};
    assert_int_equal(submit_wait(f->a, &ch, &r), 0);
    ch.set = 0;
    assert_int_equal(submit_wait(f->a, &ch, &r), JD_ECONFLICT);
    assert_int_equal(jd_store_requests(f->a, 0, 10, &rows, &n), 0);
    assert_int_equal(n, 0);
    jd_job_requests_free(rows, n);
    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->a, id, &got), 0);
    assert_int_equal(got.version, 2);
    jd_job_clear(&got);
    assert_int_equal(submit_wait(f->b, &w, &r), JD_ECONFLICT); /* terminal now */
    /* a request left behind goes with its job */
    int64_t other = insert_on(f->a);
    struct jd_write left = w;
    left.job_id = other;
    assert_int_equal(submit_wait(f->b, &left, &r), 0);
    assert_int_equal(change_state_wait(f->a, other, JD_JOB_SUCCEEDED, &r), 0);
    struct jd_write del = {.op = JD_W_JOB_DELETE, .job_id = other};
    assert_int_equal(submit_wait(f->b, &del, &r), 0);
    assert_int_equal(sql_int(f->url, "SELECT count(*) FROM job_requests"), 0);
    struct jd_cluster_stats st;
    jd_store_cluster_stats(f->b, &st);
    assert_int_equal(st.requests, 2);
}

struct heard {
    pthread_mutex_t mu;
    int64_t id, version;
    int requests, claimable, schedules, all;
    char sched[64];
};

static void on_changed(void *arg, const struct jd_job_change *c, size_t n)
{
    struct heard *h = arg;
    pthread_mutex_lock(&h->mu);
    if (n == 0)
        h->all++;
    for (size_t i = 0; i < n; i++)
        if (c[i].version >= h->version && h->id == c[i].id)
            h->version = c[i].version + 1000; /* seen */
    pthread_mutex_unlock(&h->mu);
}

static void on_schedule(void *arg, const char *id)
{
    struct heard *h = arg;
    pthread_mutex_lock(&h->mu);
    h->schedules++;
    snprintf(h->sched, sizeof h->sched, "%s", id ? id : "(all)");
    pthread_mutex_unlock(&h->mu);
}

static void on_requests(void *arg)
{
    struct heard *h = arg;
    pthread_mutex_lock(&h->mu);
    h->requests++;
    pthread_mutex_unlock(&h->mu);
}

static void on_claimable(void *arg)
{
    struct heard *h = arg;
    pthread_mutex_lock(&h->mu);
    h->claimable++;
    pthread_mutex_unlock(&h->mu);
}

static bool heard_version(struct heard *h, int64_t want)
{
    pthread_mutex_lock(&h->mu);
    bool ok = h->version == want + 1000;
    pthread_mutex_unlock(&h->mu);
    return ok;
}

/* a records a progress event on job id, which makes its version v; h
 * listens for v. */
static void progress_on_a(struct fx *f, struct heard *h, int64_t id, int64_t v)
{
    pthread_mutex_lock(&h->mu);
    h->version = v;
    pthread_mutex_unlock(&h->mu);
    struct tres r;
    assert_int_equal(event_wait(f->a, id, JD_EVK_PROGRESS, 0, "{}", &r), 0);
    assert_int_equal(r.version, v);
}

/* Whether h hears version v within WAIT_MS. */
static bool hears_version(struct heard *h, int64_t v)
{
    for (int w = 0; w < WAIT_MS && !heard_version(h, v); w += 20)
        sleep_ms(20);
    return heard_version(h, v);
}

static void test_a_commit_notice_reaches_the_other_node(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    struct heard h = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct jd_store_cluster_hooks hooks = {.changed = on_changed,
                                           .schedule_changed = on_schedule,
                                           .requests = on_requests,
                                           .claimable = on_claimable,
                                           .arg = &h};
    assert_int_equal(jd_store_cluster_start(f->b, &hooks), 0);
    assert_int_equal(jd_store_cluster_start(f->b, &hooks), JD_EINVAL);
    sleep_ms(200); /* the listener is listening */
    int64_t id = insert_on(f->a);
    struct tres r;
    pthread_mutex_lock(&h.mu);
    h.id = id;
    h.version = 2;
    pthread_mutex_unlock(&h.mu);
    /* no node wants job-change notices: the change goes without one, while
     * an inbox request and a schedule change are heard all the same */
    assert_int_equal(sql_int(f->url, "SELECT count(*) FROM jd_watchers"), 0);
    assert_int_equal(change_state_wait(f->a, id, JD_JOB_RUNNING, &r), 0);
    assert_int_equal(r.version, 2);
    struct jd_write q = {.op = JD_W_JOB_REQUEST,
                         .job_id = id,
                         .kind = JD_EVK_MESSAGE,
                         .data = "{\"topic\":\"t\",\"data\":1}"};
    assert_int_equal(submit_wait(f->a, &q, &r), 0);
    struct jd_write sp = {.op = JD_W_SCHEDULE_PUT,
                          .sched = {.id = "nightly", .definition = "{}", .next_fire_ms = 5}};
    assert_int_equal(submit_wait(f->a, &sp, &r), 0);
    for (int w = 0; w < WAIT_MS; w += 20) {
        pthread_mutex_lock(&h.mu);
        bool done = h.requests > 0 && strcmp(h.sched, "nightly") == 0;
        pthread_mutex_unlock(&h.mu);
        if (done)
            break;
        sleep_ms(20);
    }
    pthread_mutex_lock(&h.mu);
    assert_true(h.requests > 0);
    assert_string_equal(h.sched, "nightly");
    pthread_mutex_unlock(&h.mu);
    /* (notices arrive in commit order: the change's would have come first) */
    assert_false(heard_version(&h, 2));
    /* B wants them: from the return on, A's changes are heard */
    assert_int_equal(jd_store_watch_notices(f->b, true), 0);
    assert_int_equal(jd_store_watch_notices(f->b, true), 0); /* twice is once */
    assert_int_equal(sql_int(f->url, "SELECT count(*) FROM jd_watchers"), 1);
    progress_on_a(f, &h, id, 3);
    assert_true(hears_version(&h, 3));
    struct jd_cluster_stats st;
    jd_store_cluster_stats(f->b, &st);
    assert_true(st.notices >= 3);
    assert_true(st.heartbeats > 0);
    assert_true(jd_store_healthy(f->b));
    /* the lowest live id leads */
    for (int w = 0; w < WAIT_MS && !jd_store_is_leader(f->a); w += 20)
        sleep_ms(20);
    assert_true(jd_store_is_leader(f->a));
    assert_false(jd_store_is_leader(f->b));
    /* the listener's connection dies: it reconnects, then says anything
     * may have changed (notices were missed) */
    pthread_mutex_lock(&h.mu);
    h.all = 0;
    h.schedules = 0;
    pthread_mutex_unlock(&h.mu);
    assert_true(sql_int(f->url, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                " WHERE query LIKE 'LISTEN %'") >= 1);
    for (int w = 0; w < WAIT_MS; w += 20) {
        pthread_mutex_lock(&h.mu);
        bool done = h.all > 0 && strcmp(h.sched, "(all)") == 0;
        pthread_mutex_unlock(&h.mu);
        if (done)
            break;
        sleep_ms(20);
    }
    pthread_mutex_lock(&h.mu);
    assert_true(h.all > 0);
    assert_string_equal(h.sched, "(all)");
    pthread_mutex_unlock(&h.mu);
    /* and hears notices again */
    progress_on_a(f, &h, id, 4);
    assert_true(hears_version(&h, 4));
    /* withdrawn: A's changes go without a notice again */
    assert_int_equal(jd_store_watch_notices(f->b, false), 0);
    assert_int_equal(sql_int(f->url, "SELECT count(*) FROM jd_watchers"), 0);
    pthread_mutex_lock(&h.mu);
    h.requests = 0;
    pthread_mutex_unlock(&h.mu);
    progress_on_a(f, &h, id, 5);
    assert_int_equal(submit_wait(f->a, &q, &r), 0);
    for (int w = 0; w < WAIT_MS; w += 20) {
        pthread_mutex_lock(&h.mu);
        bool done = h.requests > 0;
        pthread_mutex_unlock(&h.mu);
        if (done)
            break;
        sleep_ms(20);
    }
    assert_false(heard_version(&h, 5));
    assert_int_equal(jd_store_watch_notices(f->b, true), 0);
    /* close stops the hooks: nothing is called after it returns */
    jd_store_close(f->b);
    f->b = NULL;
    pthread_mutex_lock(&h.mu);
    int before = h.requests + h.claimable + h.schedules + h.all;
    pthread_mutex_unlock(&h.mu);
    assert_int_equal(change_state_wait(f->a, id, JD_JOB_SUCCEEDED, &r), 0);
    sleep_ms(300);
    pthread_mutex_lock(&h.mu);
    assert_int_equal(h.requests + h.claimable + h.schedules + h.all, before);
    pthread_mutex_unlock(&h.mu);
    f->b = node_open(f->url);
}

static void test_a_conditional_fire_commits_once(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    struct tres r;
    struct jd_write put = {.op = JD_W_SCHEDULE_PUT,
                           .sched = {.id = "tick", .definition = "{}", .next_fire_ms = 1000}};
    assert_int_equal(submit_wait(f->a, &put, &r), 0);
    /* both nodes fire the 1000 ms occurrence; one commit wins */
    struct jd_write fire[2];
    struct tres fr[2] = {{0}};
    for (int i = 0; i < 2; i++) {
        fire[i] = (struct jd_write){.op = JD_W_SCHEDULE_CHANGE,
                                    .sched = {.id = "tick",
                                              .set = JD_SSET_NEXT_FIRE,
                                              .next_fire_ms = 2000,
                                              .add_fires = 1,
                                              .expect_next_fire_ms = 1000,
                                              .event = "fired"},
                                    .done = tres_done,
                                    .arg = &fr[i]};
        assert_int_equal(jd_store_submit(i ? f->b : f->a, &fire[i]), 0);
    }
    assert_int_equal(jd_store_sync(f->a), 0);
    assert_int_equal(jd_store_sync(f->b), 0);
    assert_true((fr[0].rc == 0) != (fr[1].rc == 0));
    assert_true(fr[0].rc == JD_ECONFLICT || fr[1].rc == JD_ECONFLICT);
    struct jd_schedule_row row;
    assert_int_equal(jd_store_schedule_get(f->b, "tick", &row), 0);
    assert_int_equal(row.fires, 1);
    assert_int_equal(row.next_fire_ms, 2000);
    jd_schedule_row_clear(&row);
    /* a missing schedule is still JD_ENOENT */
    struct jd_write gone = fire[0];
    gone.sched.id = "nope";
    gone.done = NULL;
    assert_int_equal(submit_wait(f->a, &gone, &r), JD_ENOENT);
}

/* A retry names the version its node read: a node whose read is stale
 * (the job was retried and finished again elsewhere since) cannot reopen
 * it; a retry at the current version takes the job for its node. */
static int retry_wait(struct jd_store *s, int64_t id, int64_t version, struct tres *r)
{
    struct jd_write w = {.op = JD_W_JOB_CHANGE,
                         .job_id = id,
                         .set = JD_SET_STATE | JD_SET_FINISHED,
                         .state = JD_JOB_QUEUED,
                         .kind = JD_EVK_STATE,
                         .expect_version = version};
    return submit_wait(s, &w, r);
}

static void test_a_stale_retry_cannot_reopen_a_job(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    int64_t id = insert_on(f->a);
    struct tres r;
    assert_int_equal(change_state_wait(f->a, id, JD_JOB_RUNNING, &r), 0);
    assert_int_equal(change_state_wait(f->a, id, JD_JOB_FAILED, &r), 0);
    int64_t seen_by_b = r.version; /* b reads the failed job here */
    assert_int_equal(seen_by_b, 3);
    /* a retries it and it fails again */
    assert_int_equal(retry_wait(f->a, id, seen_by_b, &r), 0);
    assert_int_equal(change_state_wait(f->a, id, JD_JOB_RUNNING, &r), 0);
    assert_int_equal(change_state_wait(f->a, id, JD_JOB_FAILED, &r), 0);
    int64_t now_at = r.version;
    assert_int_equal(now_at, 6);
    /* b's retry of what it read is refused and changes nothing */
    assert_int_equal(retry_wait(f->b, id, seen_by_b, &r), JD_ECONFLICT);
    struct jd_job got;
    assert_int_equal(jd_store_job_get(f->b, id, &got), 0);
    assert_int_equal(got.version, now_at);
    assert_int_equal(got.state, JD_JOB_FAILED);
    jd_job_clear(&got);
    assert_int_equal(owner_of(f, id), jd_store_node_id(f->a));
    /* at the current version it passes the fence and the job is b's */
    assert_int_equal(retry_wait(f->b, id, now_at, &r), 0);
    assert_int_equal(r.version, now_at + 1);
    assert_int_equal(owner_of(f, id), jd_store_node_id(f->b));
    /* a version on a job this node does not own is still the fence's */
    assert_int_equal(retry_wait(f->a, id, now_at + 1, &r), JD_ESTALE);
}

/* SQLite is a cluster of one: the cluster calls answer as much. */
/* The writer's connection goes while its COMMIT is in flight: whether the
 * batch is in the database is unknown, so recording it again could record
 * a completion twice. The node gives its incarnation up instead: the batch
 * fails, every later job write is refused, and the other node takes the
 * job over with exactly the history the database holds. */
static void test_a_commit_lost_in_flight_gives_the_node_up(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    int64_t id = insert_on(f->a);
    struct tres r;
    assert_int_equal(change_state_wait(f->a, id, JD_JOB_RUNNING, &r), 0);
    jd_pg_test_drop_at_commit(f->a);
    int rc = event_wait(f->a, id, JD_EVK_PROGRESS, 0, "{\"p\":1}", &r);
    assert_int_equal(rc, JD_EIO);
    assert_false(jd_store_lease_ok(f->a));
    /* that COMMIT may still land: a's event horizon stays until a
     * takeover deletes its row (below, or already: b's own takeover pass
     * runs every 200 ms and a's lease of 1 s may have lapsed by now on a
     * loaded machine) */
    char hz[128];
    snprintf(hz, sizeof hz,
             "SELECT count(*) FROM jd_nodes WHERE id = %lld AND pending_event_id IS NULL",
             (long long)jd_store_node_id(f->a));
    sleep_ms(50); /* past the idle writer's linger (JD_PG_HZ_LINGER_US), which must not clear it */
    assert_int_equal(sql_int(f->url, hz), 0);
    struct jd_cluster_stats st;
    jd_store_cluster_stats(f->a, &st);
    assert_int_equal(st.lease_lost, 1);
    /* what the job layer would do next (record it again) is refused */
    assert_int_equal(event_wait(f->a, id, JD_EVK_PROGRESS, 0, "{\"p\":1}", &r), JD_ESTALE);
    assert_int_equal(change_state_wait(f->a, id, JD_JOB_SUCCEEDED, &r), JD_ESTALE);
    /* b takes it over once a's lease lapses; its history is seq 1..version
     * with the progress event at most once */
    struct claimed c = {.mu = PTHREAD_MUTEX_INITIALIZER};
    claim_until(f->b, &c, 1);
    assert_int_equal(c.n, 1);
    assert_int_equal(c.ids[0], id);
    assert_int_equal(
        sql_int(f->url, "SELECT count(*) FROM jd_nodes WHERE pending_event_id IS NOT NULL"), 0);
    char q[160];
    snprintf(q, sizeof q, "SELECT count(*) FROM events_all WHERE job_id = %lld AND kind = %d",
             (long long)id, (int)JD_EVK_PROGRESS);
    assert_in_range(sql_int(f->url, q), 0, 1);
    snprintf(q, sizeof q,
             "SELECT (SELECT version FROM jobs WHERE id = %lld) - count(*) FROM events_all "
             "WHERE job_id = %lld",
             (long long)id, (long long)id);
    assert_int_equal(sql_int(f->url, q), 0);
}

/* Stream events after `after` (one page of at most limit) from s. */
/* Submit a job insert on node a whose batch then waits before its COMMIT
 * (jd_pg_test_hold_commit), its event id taken; back once it waits. The
 * job, result and write live in the caller's frame until the release. */
static void insert_held(struct fx *f, struct jd_job *ja, struct tres *ra, struct jd_write *wa)
{
    jd_pg_test_hold_commit(f->a, true);
    *ja = make_job(jd_store_next_id(f->a), "default", NULL);
    *ra = (struct tres){.rc = 12345};
    *wa = (struct jd_write){.op = JD_W_JOB_INSERT, .job = ja, .done = tres_done, .arg = ra};
    assert_int_equal(jd_store_submit(f->a, wa), 0);
    for (int w = 0; w < WAIT_MS && !jd_pg_test_commit_held(f->a); w += 5)
        sleep_ms(5);
    assert_true(jd_pg_test_commit_held(f->a));
}

static size_t stream_page(struct jd_store *s, int64_t after, unsigned limit,
                          struct jd_stream_event **rows, int64_t *next)
{
    struct jd_event_find q = {.after_id = after, .limit = limit};
    size_t n = 0;
    assert_int_equal(jd_store_event_stream(s, &q, rows, &n, next), 0);
    return n;
}

static void test_the_event_stream_waits_for_an_open_writer(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    int64_t first = insert_on(f->b);
    struct jd_stream_event *ev = NULL;
    int64_t page1 = 0, last = 0;
    /* a's batch has taken its event id and waits before its COMMIT */
    struct jd_job ja;
    struct tres ra;
    struct jd_write wa;
    insert_held(f, &ja, &ra, &wa);
    /* a second record queued behind it: a's COMMIT publishes its bound */
    struct jd_job ja2 = make_job(jd_store_next_id(f->a), "default", NULL);
    struct tres ra2 = {.rc = 12345};
    struct jd_write wa2 = {.op = JD_W_JOB_INSERT, .job = &ja2, .done = tres_done, .arg = &ra2};
    assert_int_equal(jd_store_submit(f->a, &wa2), 0);
    /* b commits a later event: not visible while a's id may come before it */
    int64_t later = insert_on(f->b);
    char q[160];
    snprintf(q, sizeof q, "SELECT id FROM events WHERE job_id = %lld", (long long)later);
    int64_t later_ev = sql_int(f->url, q);
    for (int node = 0; node < 2; node++) {
        struct jd_store *s = node ? f->b : f->a;
        size_t n = stream_page(s, 0, 100, &ev, &page1);
        assert_int_equal(n, 1);
        assert_int_equal(ev[0].job_id, first);
        jd_stream_events_free(ev, n);
        assert_int_equal(jd_store_event_last_id(s, &last), 0);
        assert_true(last < later_ev);
    }
    /* a commits: both appear, in id order, to a reader resuming after
     * the first page; and no node holds a horizon once idle */
    jd_pg_test_hold_commit(f->a, false);
    assert_int_equal(jd_store_sync(f->a), 0);
    assert_int_equal(ra.rc, 0);
    assert_int_equal(ra2.rc, 0);
    int64_t next = 0;
    size_t n = stream_page(f->b, page1, 100, &ev, &next);
    assert_int_equal(n, 3);
    assert_int_equal(ev[0].job_id, ja.id);
    assert_int_equal(ev[1].job_id, later);
    assert_int_equal(ev[2].job_id, ja2.id);
    assert_true(page1 < ev[0].id && ev[0].id < ev[1].id && ev[1].id < ev[2].id);
    assert_int_equal(ev[1].id, later_ev);
    int64_t newest = ev[2].id;
    jd_stream_events_free(ev, n);
    assert_int_equal(jd_store_event_last_id(f->a, &last), 0);
    assert_int_equal(last, newest);
    /* a's last COMMIT published the bound of a batch that may come; with
     * none in JD_PG_HZ_LINGER_US the writer clears it */
    int held = 1;
    for (int w = 0; w < WAIT_MS && held; w += 5) {
        held = (int)sql_int(f->url,
                            "SELECT count(*) FROM jd_nodes WHERE pending_event_id IS NOT NULL");
        if (held)
            sleep_ms(5);
    }
    assert_int_equal(held, 0);
}

static int64_t mono_ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A node that starts wanting job-change notices waits for the batches in
 * flight (they may have read no watcher), and gives up after
 * JD_STORE_WATCH_LOCK_MS on one that stalls, adding no row. */
static void test_wanting_notices_waits_for_open_batches(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    struct jd_job ja;
    struct tres ra;
    struct jd_write wa;
    insert_held(f, &ja, &ra, &wa);
    int64_t t0 = mono_ms_now();
    assert_int_equal(jd_store_watch_notices(f->b, true), JD_EIO);
    int64_t took = mono_ms_now() - t0;
    assert_true(took >= JD_STORE_WATCH_LOCK_MS - 5);
    assert_true(took < 5000);
    assert_int_equal(sql_int(f->url, "SELECT count(*) FROM jd_watchers"), 0);
    /* a commits: now b's row goes in */
    jd_pg_test_hold_commit(f->a, false);
    assert_int_equal(jd_store_sync(f->a), 0);
    assert_int_equal(ra.rc, 0);
    assert_int_equal(jd_store_watch_notices(f->b, true), 0);
    assert_int_equal(sql_int(f->url, "SELECT count(*) FROM jd_watchers"), 1);
}

struct announced {
    pthread_mutex_t mu;
    char payload[128];
};

static void on_tasks_waiting(void *arg, const char *payload)
{
    struct announced *a = arg;
    pthread_mutex_lock(&a->mu);
    snprintf(a->payload, sizeof a->payload, "%s", payload);
    pthread_mutex_unlock(&a->mu);
}

/* Remote tasks across nodes (storage/pg_nodes.c): a node's advertised URL
 * is found by its id only while its row is alive; an announcement reaches
 * the other node's tasks_waiting hook as sent. */
static void test_node_urls_and_task_announcements(void **state)
{
    struct fx *f = *state;
    if (!f)
        skip();
    int64_t a = jd_store_node_id(f->a), b = jd_store_node_id(f->b);
    char *url = NULL;
    assert_int_equal(jd_store_node_url(f->b, a, &url), JD_ENOENT); /* none advertised yet */
    assert_int_equal(jd_store_node_advertise(f->a, "http://node-a:8080"), 0);
    assert_int_equal(jd_store_node_url(f->b, a, &url), 0);
    assert_string_equal(url, "http://node-a:8080");
    free(url);
    assert_int_equal(jd_store_node_url(f->b, b + 1000000, &url), JD_ENOENT);
    assert_null(url);
    assert_int_equal(jd_store_node_url(f->b, 0, &url), JD_ENOENT);
    assert_int_equal(jd_store_node_url(f->b, -5, &url), JD_ENOENT);

    struct announced an = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct jd_store_cluster_hooks hooks = {.tasks_waiting = on_tasks_waiting, .arg = &an};
    assert_int_equal(jd_store_cluster_start(f->b, &hooks), 0);
    sleep_ms(200); /* the listener is listening */
    char payload[64];
    snprintf(payload, sizeof payload, "%lld resize:3", (long long)a);
    assert_int_equal(jd_store_tasks_announce(f->a, payload), 0);
    bool heard = false;
    for (int w = 0; w < WAIT_MS && !heard; w += 20) {
        pthread_mutex_lock(&an.mu);
        heard = strcmp(an.payload, payload) == 0;
        pthread_mutex_unlock(&an.mu);
        if (!heard)
            sleep_ms(20);
    }
    assert_true(heard);
    char *big = malloc(JD_STORE_ANNOUNCE_MAX + 2);
    memset(big, 'x', JD_STORE_ANNOUNCE_MAX + 1);
    big[JD_STORE_ANNOUNCE_MAX + 1] = '\0';
    assert_int_equal(jd_store_tasks_announce(f->a, big), JD_EINVAL);
    free(big);

    /* a's lease lapses: its URL is no longer given out (the owner is gone) */
    jd_pg_test_pause_heartbeat(f->a, true);
    int rc = 0;
    for (int w = 0; w < WAIT_MS; w += 50) {
        rc = jd_store_node_url(f->b, a, &url);
        free(url);
        url = NULL;
        if (rc == JD_ENOENT)
            break;
        sleep_ms(50);
    }
    assert_int_equal(rc, JD_ENOENT);
}

static void test_sqlite_answers_as_one_node(void **state)
{
    (void)state;
    struct jd_store *s1 = NULL;
    char *dir = scratch_dir(), *path = db_path(dir);
    struct jd_store_config cfg = {.path = path};
    struct jd_error err;
    assert_int_equal(jd_store_open(&cfg, &s1, &err), 0);
    assert_false(jd_store_clustered(s1));
    assert_int_equal(jd_store_node_id(s1), 0);
    assert_true(jd_store_lease_ok(s1));
    assert_true(jd_store_healthy(s1));
    assert_true(jd_store_is_leader(s1));
    struct jd_store_cluster_hooks h = {0};
    assert_int_equal(jd_store_cluster_start(s1, &h), JD_EINVAL);
    size_t n = 7;
    assert_int_equal(jd_store_claim(s1, 10, NULL, NULL, &n), 0);
    assert_int_equal(n, 0);
    struct jd_job_request *rows = NULL;
    assert_int_equal(jd_store_requests(s1, 0, 10, &rows, &n), 0);
    assert_int_equal(n, 0);
    jd_job_requests_free(rows, n);
    struct tres r;
    struct jd_job j = make_job(1, "default", NULL);
    assert_int_equal(insert_wait(s1, &j, NULL, &r), 0);
    struct jd_write w = {.op = JD_W_JOB_REQUEST, .job_id = 1, .kind = JD_EVK_CANCEL};
    assert_int_equal(submit_wait(s1, &w, &r), JD_EINVAL);
    struct jd_job got;
    assert_int_equal(jd_store_job_get(s1, 1, &got), 0);
    assert_int_equal(got.version, 1);
    jd_job_clear(&got);
    struct jd_cluster_stats st;
    jd_store_cluster_stats(s1, &st);
    assert_int_equal(st.claims + st.heartbeats, 0);
    char *url = NULL;
    assert_int_equal(jd_store_node_advertise(s1, "http://x"), JD_EINVAL);
    assert_int_equal(jd_store_watch_notices(s1, true), JD_EINVAL);
    assert_int_equal(jd_store_node_url(s1, 1, &url), JD_EINVAL);
    assert_null(url);
    assert_int_equal(jd_store_tasks_announce(s1, "1 x:1"), JD_EINVAL);
    jd_store_close(s1);
    rm_tree(dir);
    free(dir);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sqlite_answers_as_one_node),
        cmocka_unit_test_setup_teardown(test_two_nodes_share_a_database, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_lapsed_node_is_fenced_then_taken_over, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_stale_write_racing_a_takeover_is_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_held_row_never_stalls_the_heartbeat, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_claimers_never_share_a_job, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_an_inbox_request_is_recorded_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_commit_notice_reaches_the_other_node, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_conditional_fire_commits_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_stale_retry_cannot_reopen_a_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_event_stream_waits_for_an_open_writer, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_wanting_notices_waits_for_open_batches, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_node_urls_and_task_announcements, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_commit_lost_in_flight_gives_the_node_up, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
