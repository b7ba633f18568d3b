/*
 * The PostgreSQL backend's reads (storage/pg.h): the read pool and every
 * jd_pg_* read, each with exactly the semantics of its jd_store_*
 * counterpart in store.c and find.c (same order, cursors, limits,
 * JD_ENOENT cases, and strings freed by the same free functions).
 *
 * Pool: idle connections to s->pg->url on a list under pool_mu, opened
 * lazily and reused, as the SQLite read pool, but bounded: at most
 * pool_max (--db-readers, 16) exist, idle or in use, since each is a
 * server process on a database every node shares. A reader that finds
 * them all in use waits on pool_cv for one (readers hold one only for a
 * statement or a snapshot, never while a long-poll or stream waits) and
 * fails with JD_EBUSY (503) after pool_wait_ms. The idle list is most
 * recently returned first; every get and put closes the ones at its tail
 * idle longer than pool_idle_ms (--db-reader-idle, 60 s), keeping
 * JD_PG_READ_MIN_IDLE, so a burst's connections do not stay for good (the
 * server reads every few seconds, so this runs on an idle node too).
 * Connecting and closing happen outside pool_mu, the slot counted in
 * pool_open first. A connection is used by one
 * thread at a time (libpq: one PGconn per thread). One found broken
 * (PQstatus not CONNECTION_OK) is dropped and reopened; a statement that
 * fails because its connection broke (a server restart, a dropped socket)
 * is retried once on a fresh connection, outside a transaction only. Read
 * connections are read-only sessions (default_transaction_read_only), so a
 * read cannot take a lock a write waits for: reads never block the writer.
 *
 * Statements: the fixed reads are prepared per connection on first use
 * (PQprepare, then PQexecPrepared), as the SQLite pool keeps its prepared
 * statements; the find and event-stream shapes, built per call by
 * storage/find.c, go through PQexecParams. All parameters and results are
 * text: integers are parsed with strtoll, NULL columns read as NULL strings
 * or 0.
 *
 * Snapshots: a read that needs several statements to agree (recovery, a
 * queued page, a find page and its rows, the queue counts) runs them in
 * one REPEATABLE READ READ ONLY transaction, which holds one snapshot from
 * its first statement to COMMIT. Recovery reads jobs a page at a time by
 * id within that snapshot, and each page's events with one query.
 *
 * Text order: ORDER BY and ranges on names use COLLATE "C" (byte order, as
 * SQLite's and strcmp's), whatever the database's default collation.
 *
 * Threading: any thread, as store.h says for reads.
 */
#include "storage/pg.h"
#include "storage/store_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Jobs read in one round trip while recovering (each page then reads its
 * events in one more): small enough that a page of long histories stays
 * a few MB, large enough that a million jobs take ~8k round trips. */
#define PG_JOB_PAGE 128

#define JD_PG_STR_(x) #x
#define JD_PG_STR(x) JD_PG_STR_(x) /* a macro's value as a string literal */

/* ---- the fixed reads, prepared per connection ---- */

/* A job's definition is read per row by primary key, after the jobs index
 * gave the rows (SQLite's CROSS JOIN): as a join, the planner may merge
 * it with a walk of job_definitions from its first row, which costs every
 * older job on each page (measured: 5,257 rows read for a page of 128). */
#define JOB_COLS                                                                                   \
    "j.id, j.queue, j.priority, j.state,"                                                          \
    " (SELECT d.definition FROM job_definitions d WHERE d.job_id = j.id), j.run_at_ms,"            \
    " j.attempts, j.version, j.output, j.error, j.created_ms, j.updated_ms, j.started_ms,"         \
    " j.finished_ms, j.idempotency_key, j.schedule_id, j.crashes"
#define JOB_FROM " FROM jobs j"
#define EVENT_COLS "job_id, seq, time_ms, kind, tag, data, more"
#define SCHED_COLS                                                                                 \
    "id, definition, paused, retired, next_fire_ms, last_fire_ms, last_job_id, last_outcome,"      \
    " fires, skips, event_seq, created_ms, updated_ms, anchor_ms"

enum {
    PR_JOB_GET,
    PR_JOBS_BY_IDS,
    PR_LIST_ALL,
    PR_LIST_STATE,
    PR_LIST_QUEUE,
    PR_LIST_QUEUE_STATE,
    PR_LIST_SCHEDULE,
    PR_LIST_SCHEDULE_STATE,
    PR_EVENTS,
    PR_EVENTS_OF_JOBS,
    PR_COUNTS,
    PR_QUEUES,
    PR_IDEM,
    PR_ACTIVE,
    PR_STARTED,
    PR_QUEUED_SAME,
    PR_QUEUED_LOWER,
    PR_QUEUED_LATER,
    PR_OLDEST_QUEUED,
    PR_UNIQUE_KEYS,
    PR_PAUSED,
    PR_QCONFIG,
    PR_SCHED_GET,
    PR_SCHED_LIST,
    PR_SCHED_EVENTS,
    PR_RCMD_LIST,
    PR_TASK_STATE,
    PR_TASK_CLAIMED,
    PR_EVENT_LAST_ID,
    PR_TRACEPARENTS,
    PR_N
};
_Static_assert(PR_N <= 64, "jd_pg_rconn.prepared is a 64-bit mask");

static const char *const pg_sql[PR_N] = {
    [PR_JOB_GET] = "SELECT " JOB_COLS JOB_FROM " WHERE j.id = $1",
    [PR_JOBS_BY_IDS] = "SELECT " JOB_COLS JOB_FROM " WHERE j.id = ANY($1::bigint[])",
    [PR_LIST_ALL] = "SELECT " JOB_COLS JOB_FROM " WHERE j.id < $1 ORDER BY j.id DESC LIMIT $2",
    /* The filtered lists name their index's whole key in ORDER BY, with
     * each leading column pinned by a range (x >= $n AND x <= $n: the same
     * rows as x = $n, but the planner cannot fold the column away as a
     * constant). Then only that index yields the order without a sort, so
     * no plan, generic or custom, walks the primary key filtering rows
     * instead (which scans the table for a rare state). */
    [PR_LIST_STATE] = "SELECT " JOB_COLS JOB_FROM " WHERE j.state >= $3 AND j.state <= $3"
                      " AND j.id < $1 ORDER BY j.state DESC, j.id DESC LIMIT $2",
    [PR_LIST_QUEUE] = "SELECT " JOB_COLS JOB_FROM " WHERE j.queue >= $3 AND j.queue <= $3"
                      " AND j.id < $1 ORDER BY j.queue DESC, j.id DESC LIMIT $2",
    [PR_LIST_QUEUE_STATE] = "SELECT " JOB_COLS JOB_FROM " WHERE j.queue >= $4 AND j.queue <= $4"
                            " AND j.state >= $3 AND j.state <= $3 AND j.id < $1"
                            " ORDER BY j.queue DESC, j.state DESC, j.id DESC LIMIT $2",
    [PR_LIST_SCHEDULE] = "SELECT " JOB_COLS JOB_FROM " WHERE j.schedule_id >= $3"
                         " AND j.schedule_id <= $3 AND j.id < $1"
                         " ORDER BY j.schedule_id DESC, j.id DESC LIMIT $2",
    [PR_LIST_SCHEDULE_STATE] = "SELECT " JOB_COLS JOB_FROM " WHERE j.schedule_id >= $4"
                               " AND j.schedule_id <= $4 AND j.state = $3 AND j.id < $1"
                               " ORDER BY j.schedule_id DESC, j.id DESC LIMIT $2",
    /* as store.c's RS_EVENTS: a row holds up to JD_EV_RUN_MAX events */
    [PR_EVENTS] = "SELECT " EVENT_COLS " FROM events WHERE job_id = $1 AND seq > $2 - 7"
                  " ORDER BY seq LIMIT $3 + 7",
    /* Recovery: the events of a page of jobs, grouped by job (the rows
     * that may hold an event of kind > 0). */
    [PR_EVENTS_OF_JOBS] = "SELECT " EVENT_COLS " FROM events WHERE job_id = ANY($1::bigint[])"
                          " AND (kind > 0 OR more IS NOT NULL) ORDER BY job_id, seq",
    /* Summed so that per-node count rows (if the writer keeps them) read
     * as one count. */
    [PR_COUNTS] = "SELECT queue, state, sum(n) FROM queue_counts GROUP BY queue, state"
                  " HAVING sum(n) > 0 ORDER BY queue COLLATE \"C\", state",
    [PR_QUEUES] = "SELECT name, paused FROM queues ORDER BY name COLLATE \"C\"",
    [PR_IDEM] = "SELECT job_id, fingerprint FROM idempotency WHERE key = $1",
    /* Keyset pages of the recovery reads: ids above $1, $2 of them. */
    [PR_ACTIVE] = "SELECT " JOB_COLS JOB_FROM " WHERE j.state < 3 AND j.id > $1"
                  " AND j.owner_node = $3 ORDER BY j.id LIMIT $2",
    /* Running and waiting jobs: each state's range of (state, id) is in id
     * order; the merge is over at most twice $2 rows. */
    [PR_STARTED] = "SELECT * FROM ((SELECT " JOB_COLS JOB_FROM " WHERE j.state >= 1"
                   " AND j.state <= 1 AND j.id > $1 AND j.owner_node = $3"
                   " ORDER BY j.state, j.id LIMIT $2)"
                   " UNION ALL (SELECT " JOB_COLS JOB_FROM " WHERE j.state >= 2 AND j.state <= 2"
                   " AND j.id > $1 AND j.owner_node = $3 ORDER BY j.state, j.id LIMIT $2))"
                   " s ORDER BY id LIMIT $2",
    /* A page of a queue's queued jobs in run order after ($2 priority, $3
     * id): the rest of $2's priority, then the lower ones (as store.c);
     * only this node's (the last parameter): the window pages what it owns. */
    [PR_QUEUED_SAME] = "SELECT " JOB_COLS JOB_FROM " WHERE j.queue = $1 AND j.state = 0"
                       " AND j.priority >= $2 AND j.priority <= $2 AND j.id > $3"
                       " AND j.run_at_ms <= $4 AND j.owner_node = $6"
                       " ORDER BY j.priority DESC, j.id LIMIT $5",
    [PR_QUEUED_LOWER] = "SELECT " JOB_COLS JOB_FROM " WHERE j.queue = $1 AND j.state = 0"
                        " AND j.priority < $2 AND j.run_at_ms <= $3 AND j.owner_node = $5"
                        " ORDER BY j.priority DESC, j.id LIMIT $4",
    [PR_QUEUED_LATER] = "SELECT " JOB_COLS JOB_FROM " WHERE j.state = 0"
                        " AND j.run_at_ms > j.created_ms AND (j.run_at_ms, j.id) > ($1, $2)"
                        " AND j.run_at_ms <= $3 AND j.owner_node = $5"
                        " ORDER BY j.run_at_ms, j.id LIMIT $4",
    [PR_OLDEST_QUEUED] = "SELECT id, created_ms FROM jobs WHERE queue >= $1 AND queue <= $1"
                         " AND state >= 0 AND state <= 0 ORDER BY queue, state, id LIMIT 1",
    [PR_UNIQUE_KEYS] = "SELECT key, job_id, expires_ms FROM unique_keys",
    [PR_PAUSED] = "SELECT name FROM queues WHERE paused = 1 ORDER BY name COLLATE \"C\"",
    [PR_QCONFIG] = "SELECT name, config FROM queues WHERE config IS NOT NULL"
                   " ORDER BY name COLLATE \"C\"",
    [PR_SCHED_GET] = "SELECT " SCHED_COLS " FROM schedules WHERE id = $1",
    [PR_SCHED_LIST] = "SELECT " SCHED_COLS " FROM schedules WHERE id COLLATE \"C\" > $1"
                      " ORDER BY id COLLATE \"C\" LIMIT $2",
    [PR_SCHED_EVENTS] = "SELECT seq, time_ms, fire_ms, job_id, kind, data FROM schedule_events"
                        " WHERE schedule_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    [PR_RCMD_LIST] = "SELECT name, timeout_ms, description, created_ms, updated_ms,"
                     " max_in_flight FROM remote_commands ORDER BY name COLLATE \"C\"",
    /* As store.c: a claimed row whose attempt's completion is in the job's
     * history (a complete event for its tag, no later attempt dispatched)
     * reads as completed. */
    [PR_TASK_STATE] = "SELECT CASE WHEN t.state = 1 AND EXISTS (SELECT 1 FROM events e"
                      " WHERE e.job_id = t.job_id AND ((e.tag = t.tag AND e.kind = 2)"
                      " OR (e.more IS NOT NULL AND jd_ev_any(e.more, 2, t.tag, NULL))))"
                      " AND NOT EXISTS (SELECT 1 FROM events d WHERE d.job_id = t.job_id"
                      " AND ((d.tag = t.tag AND d.kind = 1"
                      " AND CASE WHEN jsonb_typeof(d.data::jsonb -> 'attempt') = 'number'"
                      " THEN (d.data::jsonb ->> 'attempt')::numeric END > t.attempt)"
                      " OR (d.more IS NOT NULL AND jd_ev_any(d.more, 1, t.tag, t.attempt))))"
                      " THEN 2 ELSE t.state END, t.job_id FROM tasks t WHERE t.id = $1",
    [PR_TASK_CLAIMED] = "SELECT 1 FROM tasks WHERE job_id = $1 AND tag = $2 AND attempt = $3"
                        " LIMIT 1",
    /* the newest row below the horizon: its last event is id + n - 1 */
    [PR_EVENT_LAST_ID] =
        "SELECT id, more FROM events WHERE id < " JD_PG_HORIZON_SQL " ORDER BY id DESC LIMIT 1",
    /* The traceparent of each job in $1 that has one (find.c's instr test:
     * jobs without one cost no JSON parse). */
    [PR_TRACEPARENTS] = "SELECT job_id, definition::jsonb ->> 'traceparent' FROM job_definitions"
                        " WHERE job_id = ANY($1::bigint[])"
                        " AND strpos(definition, '\"traceparent\":') > 0",
};

/* ---- the pool ---- */

/* Built statements (find and event-stream shapes) kept prepared per
 * session: a shape is planned once, not on every call (~0.2 ms of parse
 * and planning each). There are ~1,200 shapes; the ones in use stay,
 * the least recently used one is deallocated when a new one needs room. */
#define PG_DYN_SLOTS 32

struct jd_pg_rconn {
    PGconn *conn;
    uint64_t prepared; /* bit i: pg_sql[i] is prepared on conn as "jdr<i>" */
    bool in_tx;        /* inside a read transaction: no silent retry */
    struct {
        char *sql; /* prepared as "jdd<slot>", or NULL */
        uint64_t used;
    } dyn[PG_DYN_SLOTS];
    uint64_t clock;        /* the last dyn[].used handed out */
    int64_t idle_since_ms; /* put back at (real monotonic ms) */
    struct jd_pg_rconn *next;
};

static void dyn_forget(struct jd_pg_rconn *c)
{
    for (int i = 0; i < PG_DYN_SLOTS; i++) {
        free(c->dyn[i].sql);
        c->dyn[i].sql = NULL;
    }
}

/* A new read session on c->conn (any old one closed): 0 or JD_EIO. */
static int rconn_connect(struct jd_store *s, struct jd_pg_rconn *c)
{
    if (c->conn)
        PQfinish(c->conn);
    c->prepared = 0;
    dyn_forget(c);
    c->in_tx = false;
    struct jd_error err;
    c->conn = jd_pg_connect(s->pg->url, s->pg->display, s->sync_full, &err);
    if (!c->conn) {
        jd_log(JD_LOG_WARN, "storage: cannot open a PostgreSQL read connection", "error",
               err.message, NULL);
        return JD_EIO;
    }
    /* named for pg_stat_activity (and tests that kill read sessions) */
    PGresult *r = PQexec(c->conn, "SET default_transaction_read_only = on;"
                                  " SET client_encoding = 'UTF8';"
                                  " SET application_name = 'jackdawd-read'");
    int rc = jd_pg_rc(r);
    PQclear(r);
    return rc;
}

static void rconn_free(struct jd_pg_rconn *c)
{
    if (c->conn)
        PQfinish(c->conn);
    dyn_forget(c);
    free(c);
}

static int64_t mono_ms(void)
{
    return (int64_t)(jd_clock_real_mono_ns() / 1000000u);
}

int jd_pg_readers_open(struct jd_store *s, const struct jd_store_config *cfg, struct jd_error *err)
{
    (void)err; /* connections open lazily; a failing one fails its read */
    struct jd_pg *pg = s->pg;
    pthread_mutex_init(&pg->pool_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&pg->pool_cv, &ca);
    pthread_condattr_destroy(&ca);
    pg->pool = NULL;
    pg->pool_open = 0;
    pg->pool_max = cfg && cfg->read_max ? cfg->read_max : JD_PG_READ_MAX;
    pg->pool_wait_ms = cfg && cfg->read_wait_ms > 0 ? cfg->read_wait_ms : JD_PG_READ_WAIT_MS;
    pg->pool_idle_ms = cfg && cfg->read_idle_ms > 0 ? cfg->read_idle_ms : JD_PG_READ_IDLE_MS;
    return 0;
}

void jd_pg_readers_close(struct jd_store *s)
{
    while (s->pg->pool) {
        struct jd_pg_rconn *c = s->pg->pool;
        s->pg->pool = c->next;
        rconn_free(c);
    }
    pthread_cond_destroy(&s->pg->pool_cv);
    pthread_mutex_destroy(&s->pg->pool_mu);
}

/* Under pool_mu: unlink the idle connections past the JD_PG_READ_MIN_IDLE
 * most recent that have been idle longer than pool_idle_ms (the list is
 * most recently returned first, so they are its tail); the caller closes
 * them outside the lock. */
static struct jd_pg_rconn *pool_trim_locked(struct jd_pg *pg, int64_t now)
{
    struct jd_pg_rconn **link = &pg->pool;
    for (unsigned kept = 0; *link && kept < JD_PG_READ_MIN_IDLE; kept++)
        link = &(*link)->next;
    while (*link && now - (*link)->idle_since_ms <= pg->pool_idle_ms)
        link = &(*link)->next;
    struct jd_pg_rconn *stale = *link;
    *link = NULL;
    for (struct jd_pg_rconn *c = stale; c; c = c->next)
        pg->pool_open--;
    if (stale)
        pthread_cond_broadcast(&pg->pool_cv); /* slots freed */
    return stale;
}

/* A connection that was counted is gone (closed, or never opened): its
 * slot is free for a waiting reader. */
static void pool_release(struct jd_pg *pg)
{
    pthread_mutex_lock(&pg->pool_mu);
    pg->pool_open--;
    pthread_cond_signal(&pg->pool_cv);
    pthread_mutex_unlock(&pg->pool_mu);
}

static void free_list(struct jd_pg_rconn *c)
{
    while (c) {
        struct jd_pg_rconn *next = c->next;
        rconn_free(c);
        c = next;
    }
}

/* A connection is taken from the idle list, or a new one is opened while
 * fewer than pool_max exist; otherwise the reader waits for one to come
 * back or be closed, up to pool_wait_ms. Connecting happens outside the
 * lock, its slot already counted. */
int jd_pg_rconn_get(struct jd_store *s, struct jd_pg_rconn **out)
{
    struct jd_pg *pg = s->pg;
    struct jd_pg_rconn *c = NULL, *stale;
    bool timed_out = false, waited = false;
    pthread_mutex_lock(&pg->pool_mu);
    int64_t now = mono_ms(), deadline = now + pg->pool_wait_ms;
    stale = pool_trim_locked(pg, now);
    for (;;) {
        if ((c = pg->pool) != NULL) {
            pg->pool = c->next;
            break;
        }
        if (pg->pool_open < pg->pool_max) {
            pg->pool_open++;
            break;
        }
        if (now >= deadline) {
            timed_out = true;
            break;
        }
        waited = true;
        struct timespec ts = {.tv_sec = (time_t)(deadline / 1000),
                              .tv_nsec = (long)(deadline % 1000) * 1000000L};
        pthread_cond_timedwait(&pg->pool_cv, &pg->pool_mu, &ts);
        now = mono_ms();
    }
    pthread_mutex_unlock(&pg->pool_mu);
    free_list(stale);
    if (waited) { /* relaxed: counters read for /metrics */
        atomic_fetch_add_explicit(&pg->st_read_waits, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&pg->st_read_wait_us,
                                  (uint64_t)(now - (deadline - pg->pool_wait_ms)) * 1000u,
                                  memory_order_relaxed);
    }
    if (timed_out) {
        atomic_fetch_add_explicit(&pg->st_read_timeouts, 1, memory_order_relaxed);
        char max[16];
        snprintf(max, sizeof max, "%u", pg->pool_max);
        jd_log(JD_LOG_WARN,
               "storage: every PostgreSQL read connection stayed busy; the read fails (503)", "db",
               pg->display, "read_max", max, NULL);
        return JD_EBUSY;
    }
    if (!c)
        c = jd_xcalloc(1, sizeof *c);
    c->next = NULL;
    if (!c->conn || PQstatus(c->conn) != CONNECTION_OK) {
        int rc = rconn_connect(s, c);
        if (rc) {
            rconn_free(c);
            pool_release(pg);
            return rc;
        }
    }
    *out = c;
    return 0;
}

void jd_pg_rconn_put(struct jd_store *s, struct jd_pg_rconn *c)
{
    if (!c)
        return;
    struct jd_pg *pg = s->pg;
    /* Back to the pool only idle and healthy; a session left inside a
     * transaction (a caller's error path) is rolled back first. */
    PGTransactionStatusType ts = PQtransactionStatus(c->conn);
    if (ts == PQTRANS_INTRANS || ts == PQTRANS_INERROR) {
        PQclear(PQexec(c->conn, "ROLLBACK"));
        ts = PQtransactionStatus(c->conn);
    }
    c->in_tx = false;
    if (PQstatus(c->conn) != CONNECTION_OK || ts != PQTRANS_IDLE) {
        rconn_free(c);
        pool_release(pg);
        return;
    }
    pthread_mutex_lock(&pg->pool_mu);
    int64_t now = mono_ms();
    c->idle_since_ms = now;
    c->next = pg->pool;
    pg->pool = c;
    struct jd_pg_rconn *stale = pool_trim_locked(pg, now);
    pthread_cond_signal(&pg->pool_cv);
    pthread_mutex_unlock(&pg->pool_mu);
    free_list(stale);
}

void jd_pg_read_pool_count(struct jd_store *s, unsigned *open, unsigned *idle)
{
    pthread_mutex_lock(&s->pg->pool_mu);
    unsigned k = 0;
    for (struct jd_pg_rconn *c = s->pg->pool; c; c = c->next)
        k++;
    *open = s->pg->pool_open;
    *idle = k;
    pthread_mutex_unlock(&s->pg->pool_mu);
}

PGconn *jd_pg_rconn_conn(struct jd_pg_rconn *c)
{
    return c->conn;
}

/* ---- running statements ---- */

/* Text parameters of one statement. */
struct params {
    int n;
    const char *v[JD_FIND_MAX_BINDS];
    char num[JD_FIND_MAX_BINDS][24];
};

static void p_int(struct params *p, int64_t i)
{
    snprintf(p->num[p->n], sizeof p->num[p->n], "%" PRId64, i);
    p->v[p->n] = p->num[p->n];
    p->n++;
}

static void p_text(struct params *p, const char *t)
{
    p->v[p->n++] = t;
}

/* The parameters of a built find or event-stream statement. */
static void params_from(struct params *p, const struct jd_find_sql *q)
{
    p->n = 0;
    for (int i = 0; i < q->n; i++) {
        if (q->b[i].text)
            p_text(p, q->b[i].text);
        else
            p_int(p, q->b[i].i);
    }
}

/* An int8[] literal of ids ("{1,2,3}"); caller frees. */
static char *id_array(const int64_t *ids, size_t n)
{
    size_t cap = 2 + n * 21 + 1, k = 0;
    char *t = jd_xmalloc(cap);
    t[k++] = '{';
    for (size_t i = 0; i < n; i++)
        k += (size_t)snprintf(t + k, cap - k, i ? ",%" PRId64 : "%" PRId64, ids[i]);
    t[k++] = '}';
    t[k] = '\0';
    return t;
}

/* The name sql is prepared under on c (preparing it, in the least
 * recently used slot, if it is not): NULL and *r the failed result. */
static const char *dyn_prepared(struct jd_pg_rconn *c, const char *sql, char *name, size_t cap,
                                PGresult **r)
{
    int slot = -1; /* an empty slot, else the least recently used */
    for (int i = 0; i < PG_DYN_SLOTS; i++) {
        if (c->dyn[i].sql && strcmp(c->dyn[i].sql, sql) == 0) {
            c->dyn[i].used = ++c->clock;
            snprintf(name, cap, "jdd%d", i);
            return name;
        }
        if (slot < 0 ||
            (c->dyn[slot].sql && (!c->dyn[i].sql || c->dyn[i].used < c->dyn[slot].used)))
            slot = i;
    }
    snprintf(name, cap, "jdd%d", slot);
    if (c->dyn[slot].sql) {
        char dealloc[32];
        snprintf(dealloc, sizeof dealloc, "DEALLOCATE %s", name);
        *r = PQexec(c->conn, dealloc);
        if (jd_pg_rc(*r))
            return NULL;
        PQclear(*r);
        free(c->dyn[slot].sql);
        c->dyn[slot].sql = NULL;
    }
    *r = PQprepare(c->conn, name, sql, 0, NULL);
    if (jd_pg_rc(*r))
        return NULL;
    PQclear(*r);
    c->dyn[slot].sql = jd_xstrdup(sql);
    c->dyn[slot].used = ++c->clock;
    return name;
}

static PGresult *exec_once(struct jd_pg_rconn *c, int which, const char *sql,
                           const struct params *p)
{
    char name[16];
    if (which < 0 && p) {
        PGresult *r = NULL;
        if (!dyn_prepared(c, sql, name, sizeof name, &r))
            return r;
        return PQexecPrepared(c->conn, name, p->n, p->v, NULL, NULL, 0);
    }
    if (which < 0)
        return PQexec(c->conn, sql);
    snprintf(name, sizeof name, "jdr%d", which);
    if (!(c->prepared & (1ull << which))) {
        PGresult *r = PQprepare(c->conn, name, pg_sql[which], 0, NULL);
        if (jd_pg_rc(r))
            return r;
        PQclear(r);
        c->prepared |= 1ull << which;
    }
    return PQexecPrepared(c->conn, name, p ? p->n : 0, p ? p->v : NULL, NULL, NULL, 0);
}

/* Run statement `which` (or, for -1, sql) on c: the result (caller
 * PQclears) with *rc 0, or NULL with *rc a JD_E* code. A connection that
 * broke is reopened and the statement retried once, unless c is inside a
 * transaction (its snapshot is gone with it). */
static PGresult *run(struct jd_store *s, struct jd_pg_rconn *c, int which, const char *sql,
                     const struct params *p, int *rc)
{
    for (int attempt = 0;; attempt++) {
        PGresult *r = exec_once(c, which, sql, p);
        *rc = jd_pg_rc(r);
        if (*rc == 0)
            return r;
        bool broken = PQstatus(c->conn) != CONNECTION_OK;
        jd_log(JD_LOG_WARN, "storage: a PostgreSQL read failed", "db", s->pg->display, "error",
               r ? PQresultErrorMessage(r) : PQerrorMessage(c->conn), NULL);
        PQclear(r);
        if (!broken || c->in_tx || attempt > 0 || rconn_connect(s, c) != 0)
            return NULL;
    }
}

/* BEGIN a read-only snapshot on c (retried on a fresh connection once, as
 * run), or end it. 0 or a JD_E* code. */
static int tx_begin(struct jd_store *s, struct jd_pg_rconn *c)
{
    int rc;
    PGresult *r = run(s, c, -1, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", NULL, &rc);
    PQclear(r);
    if (rc == 0)
        c->in_tx = true;
    return rc;
}

static void tx_end(struct jd_pg_rconn *c)
{
    if (c->in_tx)
        PQclear(PQexec(c->conn, "COMMIT"));
    c->in_tx = false;
}

static char *g_text(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? NULL : jd_xstrdup(PQgetvalue(r, row, col));
}

static int64_t g_int(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* A boolean column ("t"/"f") or an integer one used as a flag. */
static bool g_bool(const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col))
        return false;
    const char *v = PQgetvalue(r, row, col);
    return v[0] == 't' || (v[0] != 'f' && strtoll(v, NULL, 10) != 0);
}

static void row_to_job(const PGresult *r, int i, struct jd_job *j)
{
    j->id = g_int(r, i, 0);
    j->queue = g_text(r, i, 1);
    j->priority = g_int(r, i, 2);
    j->state = (enum jd_job_state)g_int(r, i, 3);
    j->definition = g_text(r, i, 4);
    j->run_at_ms = g_int(r, i, 5);
    j->attempts = (uint32_t)g_int(r, i, 6);
    j->version = g_int(r, i, 7);
    j->output = g_text(r, i, 8);
    j->error = g_text(r, i, 9);
    j->created_ms = g_int(r, i, 10);
    j->updated_ms = g_int(r, i, 11);
    j->started_ms = g_int(r, i, 12);
    j->finished_ms = g_int(r, i, 13);
    j->idempotency_key = g_text(r, i, 14);
    j->schedule_id = g_text(r, i, 15);
    j->crashes = (uint32_t)g_int(r, i, 16);
    j->handler = NULL; /* written with the row, not read back (see struct jd_job) */
}

static void row_to_event(const PGresult *r, int i, struct jd_job_event *e)
{
    e->job_id = g_int(r, i, 0);
    e->seq = g_int(r, i, 1);
    e->time_ms = g_int(r, i, 2);
    e->kind = (enum jd_event_kind)g_int(r, i, 3);
    e->tag = (uint32_t)g_int(r, i, 4);
    e->data = g_text(r, i, 5);
}

/* row i's events (first, read by row_to_event, and those packed in its
 * column 6) after after_seq, appended to *ev. */
static int expand_row(const PGresult *r, int i, struct jd_job_event *first, int64_t after_seq,
                      struct jd_job_event **ev, size_t *n, size_t *cap)
{
    const char *more = PQgetisnull(r, i, 6) ? NULL : PQgetvalue(r, i, 6);
    return jd_evpack_expand(first, more, more ? (size_t)PQgetlength(r, i, 6) : 0, after_seq, ev, n,
                            cap);
}

/* One statement on a pooled connection: its result (caller PQclears) or
 * NULL with *rc set. */
static PGresult *query(struct jd_store *s, int which, const struct params *p, int *rc)
{
    struct jd_pg_rconn *c;
    if ((*rc = jd_pg_rconn_get(s, &c)) != 0)
        return NULL;
    PGresult *r = run(s, c, which, NULL, p, rc);
    jd_pg_rconn_put(s, c);
    return r;
}

/* A statement of at most one row: its result with the row (caller
 * PQclears), or NULL with *rc JD_ENOENT (no row) or a JD_E* code. */
static PGresult *query_row(struct jd_store *s, int which, const struct params *p, int *rc)
{
    PGresult *r = query(s, which, p, rc);
    if (r && PQntuples(r) == 0) {
        PQclear(r);
        r = NULL;
        *rc = JD_ENOENT;
    }
    return r;
}

/* ---- jobs ---- */

int jd_pg_job_get(struct jd_store *s, int64_t id, struct jd_job *out)
{
    memset(out, 0, sizeof *out);
    struct params p = {0};
    p_int(&p, id);
    int rc;
    PGresult *r = query_row(s, PR_JOB_GET, &p, &rc);
    if (!r)
        return rc;
    row_to_job(r, 0, out);
    PQclear(r);
    return 0;
}

struct id_row {
    int64_t id;
    int row;
};

static int cmp_id_row(const void *a, const void *b)
{
    const struct id_row *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The whole rows of jobs ids[0..n) on c (inside the caller's snapshot),
 * into rows[0..*got) in the order of ids; ids with no row are left out.
 * 0 or a JD_E* code. */
static int jobs_by_ids(struct jd_store *s, struct jd_pg_rconn *c, const int64_t *ids, size_t n,
                       struct jd_job *rows, size_t *got)
{
    *got = 0;
    if (n == 0)
        return 0;
    char *arr = id_array(ids, n);
    struct params p = {0};
    p_text(&p, arr);
    int rc;
    PGresult *r = run(s, c, PR_JOBS_BY_IDS, NULL, &p, &rc);
    free(arr);
    if (!r)
        return rc;
    /* The rows come in no particular order: index them by id. */
    size_t nr = (size_t)PQntuples(r);
    struct id_row *ix = jd_xcalloc(nr ? nr : 1, sizeof *ix);
    for (size_t k = 0; k < nr; k++)
        ix[k] = (struct id_row){g_int(r, (int)k, 0), (int)k};
    qsort(ix, nr, sizeof *ix, cmp_id_row);
    for (size_t i = 0; i < n; i++) {
        struct id_row key = {ids[i], 0};
        const struct id_row *hit = bsearch(&key, ix, nr, sizeof *ix, cmp_id_row);
        if (hit)
            row_to_job(r, hit->row, &rows[(*got)++]);
    }
    free(ix);
    PQclear(r);
    return 0;
}

int jd_pg_job_list(struct jd_store *s, const struct jd_job_filter *f, struct jd_job **rows,
                   size_t *n, int64_t *next_cursor)
{
    *rows = NULL;
    *n = 0;
    *next_cursor = 0;
    if (!f || f->limit < 1 || f->limit > 1000 || f->state < -1 || f->state >= JD_JOB_NSTATES ||
        f->before_id < 0)
        return JD_EINVAL;
    int which = f->schedule ? (f->state >= 0 ? PR_LIST_SCHEDULE_STATE : PR_LIST_SCHEDULE)
                : f->queue  ? (f->state >= 0 ? PR_LIST_QUEUE_STATE : PR_LIST_QUEUE)
                            : (f->state >= 0 ? PR_LIST_STATE : PR_LIST_ALL);
    struct params p = {0};
    p_int(&p, f->before_id > 0 ? f->before_id : INT64_MAX);
    p_int(&p, (int64_t)f->limit + 1); /* one extra: is there a next page? */
    if (f->state >= 0)
        p_int(&p, f->state);
    if (f->schedule)
        p_text(&p, f->schedule);
    else if (f->queue)
        p_text(&p, f->queue);
    int rc;
    PGresult *r = query(s, which, &p, &rc);
    if (!r)
        return rc;
    size_t k = (size_t)PQntuples(r);
    struct jd_job *out = jd_xcalloc(f->limit + 1, sizeof *out);
    for (size_t i = 0; i < k && i <= f->limit; i++)
        row_to_job(r, (int)i, &out[i]);
    PQclear(r);
    if (k > f->limit) {
        k = f->limit + 1;
        jd_job_clear(&out[--k]);
        *next_cursor = out[k - 1].id;
    }
    *rows = out;
    *n = k;
    return 0;
}

/* A built find or event-stream statement wrapped so that the server sends
 * only what the caller keeps: the rows its scan matches (column m) and
 * the scanned row the caller goes on from (`tail`: the row at the scan
 * budget, or the last one scanned), `limit` rows at most. SQLite's caller
 * steps the scan and stops; a PostgreSQL result would otherwise carry
 * every scanned row (up to JD_FIND_SCAN) to the client. The window
 * functions stream, in their input's order (no ORDER BY, so no sort): the
 * scan stops where the LIMIT is met. The added columns (rn, nxt) come
 * after the statement's own. Appends the limit to p. */
static char *wrap_scan(const struct jd_find_sql *q, const char *tail, struct params *p,
                       int64_t limit)
{
    p_int(p, limit);
    return jd_xasprintf("SELECT * FROM (SELECT s.*, row_number() OVER () AS rn,"
                        " lead(s.id) OVER () AS nxt FROM (%s) s) t WHERE t.m OR %s LIMIT $%d",
                        q->sql, tail, q->n + 1);
}

int jd_pg_job_find(struct jd_store *s, const struct jd_job_find *f, bool ids_only,
                   struct jd_job **rows, size_t *n, struct jd_job_find_cursor *next)
{
    *rows = NULL;
    *n = 0;
    *next = (struct jd_job_find_cursor){0};
    struct jd_find_sql q;
    int rc = jd_find_sql_build_pg(f, &q);
    if (rc)
        return rc;
    struct params p;
    params_from(&p, &q);
    /* limit + 1 matches say whether there is a next page; the row at the
     * scan budget is where the next page goes on from */
    char *wrapped = wrap_scan(&q, "t.rn = " JD_PG_STR(JD_FIND_SCAN), &p, (int64_t)f->limit + 2);
    free(q.sql);
    q.sql = wrapped;
    struct jd_pg_rconn *c = NULL;
    PGresult *r = NULL;
    struct jd_job *out = jd_xcalloc(f->limit + 1, sizeof *out);
    size_t k = 0;
    if ((rc = jd_pg_rconn_get(s, &c)) != 0)
        goto done;
    if ((rc = tx_begin(s, c)) != 0)
        goto done;
    if (!(r = run(s, c, -1, q.sql, &p, &rc)))
        goto done;
    /* Keep up to limit + 1 matches: the extra one says a next page exists. */
    struct jd_job_find_cursor last = {0};
    int64_t scanned = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        scanned = g_int(r, i, 5);
        last.id = g_int(r, i, 0);
        last.created_ms = g_int(r, i, 1);
        if (!g_bool(r, i, 4))
            continue;
        out[k].id = last.id;
        out[k].created_ms = last.created_ms;
        out[k].state = (enum jd_job_state)g_int(r, i, 2);
        out[k].queue = jd_xstrdup(PQgetvalue(r, i, 3));
        if (++k > f->limit)
            break;
    }
    if (k > f->limit) {
        jd_job_clear(&out[--k]);
        *next = (struct jd_job_find_cursor){out[k - 1].id, out[k - 1].created_ms};
    } else if (scanned >= JD_FIND_SCAN) {
        *next = last; /* the budget ran out: go on from where it stopped */
    }
    if (!ids_only && k > 0) {
        /* The whole rows in the same snapshot, in one statement; a row the
         * snapshot lacks cannot happen, but is left out if it does. */
        int64_t *ids = jd_xcalloc(k, sizeof *ids);
        for (size_t i = 0; i < k; i++) {
            ids[i] = out[i].id;
            jd_job_clear(&out[i]);
        }
        size_t got = 0;
        rc = jobs_by_ids(s, c, ids, k, out, &got);
        free(ids);
        k = got;
    }
done:
    PQclear(r);
    if (c) {
        tx_end(c);
        jd_pg_rconn_put(s, c);
    }
    free(q.sql);
    if (rc) {
        jd_jobs_free(out, k);
        *next = (struct jd_job_find_cursor){0};
        return rc;
    }
    *rows = out;
    *n = k;
    return 0;
}

/* ---- events ---- */

int jd_pg_events(struct jd_store *s, int64_t job_id, int64_t after_seq, unsigned limit,
                 struct jd_job_event **events, size_t *n)
{
    *events = NULL;
    *n = 0;
    if (limit < 1 || limit > 10000)
        return JD_EINVAL;
    struct params p = {0};
    p_int(&p, job_id);
    p_int(&p, after_seq);
    p_int(&p, limit);
    int rc;
    PGresult *r = query(s, PR_EVENTS, &p, &rc);
    if (!r)
        return rc;
    size_t nr = (size_t)PQntuples(r), k = 0, cap = nr ? nr : 1;
    struct jd_job_event *out = jd_xcalloc(cap, sizeof *out);
    for (size_t i = 0; i < nr && k < limit && rc == 0; i++) {
        struct jd_job_event first;
        row_to_event(r, (int)i, &first);
        rc = expand_row(r, (int)i, &first, after_seq, &out, &k, &cap);
    }
    PQclear(r);
    if (rc) {
        jd_job_events_free(out, k);
        return rc;
    }
    for (size_t i = limit; i < k; i++)
        free(out[i].data);
    *events = out;
    *n = k < limit ? k : limit;
    return 0;
}

/* The traceparent of each event's job (one statement for the page). */
static int add_traceparents(struct jd_store *s, struct jd_pg_rconn *c, struct jd_stream_event *ev,
                            size_t n)
{
    if (n == 0)
        return 0;
    int64_t *ids = jd_xcalloc(n, sizeof *ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = ev[i].job_id;
    char *arr = id_array(ids, n);
    free(ids);
    struct params p = {0};
    p_text(&p, arr);
    int rc;
    PGresult *r = run(s, c, PR_TRACEPARENTS, NULL, &p, &rc);
    free(arr);
    if (!r)
        return rc;
    int nr = PQntuples(r);
    for (int k = 0; k < nr; k++) {
        if (PQgetisnull(r, k, 1))
            continue;
        int64_t id = g_int(r, k, 0);
        for (size_t i = 0; i < n; i++)
            if (ev[i].job_id == id && !ev[i].traceparent)
                ev[i].traceparent = jd_xstrdup(PQgetvalue(r, k, 1));
    }
    PQclear(r);
    return 0;
}

int jd_pg_event_stream(struct jd_store *s, const struct jd_event_find *f,
                       struct jd_stream_event **rows, size_t *n, int64_t *next_after)
{
    *rows = NULL;
    *n = 0;
    *next_after = f->after_id;
    struct jd_find_sql q;
    int rc = jd_event_sql_build_pg(f, &q);
    if (rc)
        return rc;
    struct params p;
    params_from(&p, &q);
    /* the matches, and the last event scanned (a rare filter moves on);
     * up to JD_EV_RUN_MAX - 1 matching rows may hold only events at or
     * before after_id (the scan starts that far back) */
    char *wrapped = wrap_scan(&q, "t.nxt IS NULL", &p, (int64_t)f->limit + JD_EV_RUN_MAX);
    free(q.sql);
    q.sql = wrapped;
    struct jd_pg_rconn *c = NULL;
    PGresult *r = NULL;
    struct jd_stream_event *out = jd_xcalloc(f->limit, sizeof *out);
    size_t k = 0;
    int64_t last = f->after_id;
    if ((rc = jd_pg_rconn_get(s, &c)) != 0)
        goto done;
    if (!(r = run(s, c, -1, q.sql, &p, &rc)))
        goto done;
    int nr = PQntuples(r);
    for (int i = 0; i < nr && k < f->limit; i++) {
        struct jd_stream_row row = {
            .id = g_int(r, i, 0),
            .job_id = g_int(r, i, 1),
            .seq = g_int(r, i, 2),
            .time_ms = g_int(r, i, 3),
            .data = PQgetisnull(r, i, 4) ? NULL : PQgetvalue(r, i, 4),
            .queue = PQgetvalue(r, i, 5), /* "" for NULL */
            .job_state = (enum jd_job_state)g_int(r, i, 6),
            .match = g_bool(r, i, 7),
            .more = PQgetisnull(r, i, 8) ? NULL : PQgetvalue(r, i, 8),
            .more_len = (size_t)PQgetlength(r, i, 8),
            .kind = (int)g_int(r, i, 9),
        };
        jd_stream_row_add(f, &row, out, &k, &last);
    }
    *next_after = last;
    rc = add_traceparents(s, c, out, k);
done:
    PQclear(r);
    if (c)
        jd_pg_rconn_put(s, c);
    free(q.sql);
    if (rc) {
        jd_stream_events_free(out, k);
        *next_after = f->after_id;
        return rc;
    }
    *rows = out;
    *n = k;
    return 0;
}

int jd_pg_event_last_id(struct jd_store *s, int64_t *id)
{
    *id = 0;
    int rc;
    PGresult *r = query(s, PR_EVENT_LAST_ID, NULL, &rc);
    if (!r)
        return rc;
    if (PQntuples(r) > 0) {
        const char *more = PQgetisnull(r, 0, 1) ? NULL : PQgetvalue(r, 0, 1);
        *id = g_int(r, 0, 0) + jd_evpack_count(more, more ? (size_t)PQgetlength(r, 0, 1) : 0) - 1;
    }
    PQclear(r);
    return 0;
}

/* ---- queues ---- */

int jd_pg_queue_counts(struct jd_store *s, struct jd_queue_counts **rows, size_t *n)
{
    *rows = NULL;
    *n = 0;
    struct jd_pg_rconn *c;
    int rc = jd_pg_rconn_get(s, &c);
    if (rc)
        return rc;
    /* Both queries in one snapshot; both come sorted by name: merge them. */
    PGresult *qr = NULL, *cr = NULL;
    if ((rc = tx_begin(s, c)) == 0 && (qr = run(s, c, PR_QUEUES, NULL, NULL, &rc)) != NULL)
        cr = run(s, c, PR_COUNTS, NULL, NULL, &rc);
    tx_end(c);
    jd_pg_rconn_put(s, c);
    if (rc) {
        PQclear(qr);
        PQclear(cr);
        return rc;
    }
    int nq = PQntuples(qr), nc = PQntuples(cr), qi = 0, ci = 0;
    size_t cap = 8, k = 0;
    struct jd_queue_counts *out = jd_xcalloc(cap, sizeof *out);
    while (qi < nq || ci < nc) {
        const char *qn = qi < nq ? PQgetvalue(qr, qi, 0) : NULL;
        const char *cn = ci < nc ? PQgetvalue(cr, ci, 0) : NULL;
        const char *name = !qn ? cn : !cn ? qn : strcmp(qn, cn) <= 0 ? qn : cn;
        if (k == cap) {
            cap *= 2;
            out = jd_xrealloc(out, cap * sizeof *out);
        }
        struct jd_queue_counts *q = &out[k++];
        memset(q, 0, sizeof *q);
        q->queue = jd_xstrdup(name);
        if (qn && strcmp(qn, q->queue) == 0)
            q->paused = g_bool(qr, qi++, 1);
        while (ci < nc && strcmp(PQgetvalue(cr, ci, 0), q->queue) == 0) {
            int64_t state = g_int(cr, ci, 1);
            if (state >= 0 && state < JD_JOB_NSTATES)
                q->counts[state] = g_int(cr, ci, 2);
            ci++;
        }
    }
    PQclear(qr);
    PQclear(cr);
    *rows = out;
    *n = k;
    return 0;
}

/* At most one row of two integers, keyed by one text: 0 with both set,
 * JD_ENOENT for no row, or a JD_E* code. */
static int read_two_ints(struct jd_store *s, int which, const char *key, int64_t *a, int64_t *b)
{
    struct params p = {0};
    p_text(&p, key);
    int rc;
    PGresult *r = query_row(s, which, &p, &rc);
    if (!r)
        return rc;
    *a = g_int(r, 0, 0);
    *b = g_int(r, 0, 1);
    PQclear(r);
    return 0;
}

int jd_pg_oldest_queued(struct jd_store *s, const char *queue, int64_t *job_id, int64_t *created_ms)
{
    if (!queue)
        return JD_EINVAL;
    return read_two_ints(s, PR_OLDEST_QUEUED, queue, job_id, created_ms);
}

int jd_pg_idem_lookup(struct jd_store *s, const char *key, int64_t *job_id, char **fingerprint)
{
    if (fingerprint)
        *fingerprint = NULL;
    if (!key)
        return JD_EINVAL;
    struct params p = {0};
    p_text(&p, key);
    int rc;
    PGresult *r = query_row(s, PR_IDEM, &p, &rc);
    if (!r)
        return rc;
    *job_id = g_int(r, 0, 0);
    if (fingerprint)
        *fingerprint = g_text(r, 0, 1);
    PQclear(r);
    return 0;
}

/* ---- recovery and the queued-job window ---- */

static int cmp_event_job(const void *a, const void *b)
{
    const struct jd_job_event *x = a, *y = b;
    return x->job_id < y->job_id ? -1 : x->job_id > y->job_id;
}

/* Hand jobs[0..nj) to fn in their order, each with its events of kind > 0
 * in seq order, read on c (inside the caller's snapshot) with one
 * statement per PG_JOB_PAGE jobs. Takes the jobs (clears them). *count
 * counts the jobs handed to fn; *stop_rc is fn's non-zero return, which
 * stops the walk. 0 or the JD_E* code of a failed read. */
static int hand_jobs(struct jd_store *s, struct jd_pg_rconn *c, struct jd_job *jobs, size_t nj,
                     jd_store_job_fn fn, void *arg, size_t *count, int *stop_rc)
{
    int rc = 0;
    size_t at = 0;
    while (at < nj && rc == 0 && !*stop_rc) {
        size_t m = nj - at < PG_JOB_PAGE ? nj - at : PG_JOB_PAGE;
        int64_t ids[PG_JOB_PAGE];
        size_t nid = 0;
        for (size_t i = 0; i < m; i++)
            if (jobs[at + i].version > 1) /* version 1: the insert's event only */
                ids[nid++] = jobs[at + i].id;
        size_t ne = 0;
        struct jd_job_event *ev = NULL;
        if (nid) {
            char *arr = id_array(ids, nid);
            struct params p = {0};
            p_text(&p, arr);
            PGresult *r = run(s, c, PR_EVENTS_OF_JOBS, NULL, &p, &rc);
            free(arr);
            if (!r)
                break;
            size_t nr = (size_t)PQntuples(r), cap = nr ? nr : 1;
            ev = jd_xcalloc(cap, sizeof *ev);
            for (size_t i = 0; i < nr && rc == 0; i++) {
                struct jd_job_event first;
                row_to_event(r, (int)i, &first);
                size_t from = ne;
                rc = expand_row(r, (int)i, &first, 0, &ev, &ne, &cap);
                ne = from + jd_evpack_drop_state(ev + from, ne - from);
            }
            PQclear(r);
            if (rc) {
                jd_job_events_free(ev, ne);
                break;
            }
        }
        /* ev is in (job_id, seq) order; each job's run is found by search. */
        for (size_t i = 0; i < m && !*stop_rc; i++) {
            struct jd_job_event key = {.job_id = jobs[at + i].id};
            struct jd_job_event *hit = ne ? bsearch(&key, ev, ne, sizeof *ev, cmp_event_job) : NULL;
            size_t lo = 0, hi = 0;
            if (hit) {
                lo = hi = (size_t)(hit - ev);
                while (lo > 0 && ev[lo - 1].job_id == key.job_id)
                    lo--;
                while (hi < ne && ev[hi].job_id == key.job_id)
                    hi++;
            }
            (*count)++;
            *stop_rc = fn(arg, &jobs[at + i], ne ? ev + lo : NULL, hi - lo);
        }
        jd_job_events_free(ev, ne);
        at += m;
    }
    for (size_t i = 0; i < nj; i++)
        jd_job_clear(&jobs[i]);
    return rc;
}

/* The rows of a job read (JOB_COLS) as jobs; caller frees with jd_jobs_free. */
static struct jd_job *result_jobs(const PGresult *r, size_t *n)
{
    *n = (size_t)PQntuples(r);
    struct jd_job *jobs = jd_xcalloc(*n ? *n : 1, sizeof *jobs);
    for (size_t i = 0; i < *n; i++)
        row_to_job(r, (int)i, &jobs[i]);
    return jobs;
}

/* The return of a walk: the read's error, else fn's negative return. */
static int walk_rc(int rc, int stop_rc)
{
    return rc ? rc : stop_rc < 0 ? stop_rc : 0;
}

static int cmp_job_id(const void *a, const void *b)
{
    int64_t x = ((const struct jd_job *)a)->id, y = ((const struct jd_job *)b)->id;
    return (x > y) - (x < y);
}

/* Recovery: every job statement `which` yields, by keyset pages of ids in
 * one snapshot, each with its events. */
static int recover_read(struct jd_store *s, int which, jd_store_job_fn fn, void *arg)
{
    struct jd_pg_rconn *c;
    int rc = jd_pg_rconn_get(s, &c);
    if (rc)
        return rc;
    int stop_rc = 0;
    size_t count = 0;
    int64_t after = 0;
    if ((rc = tx_begin(s, c)) != 0)
        goto done;
    while (rc == 0 && !stop_rc) {
        struct params p = {0};
        p_int(&p, after);
        p_int(&p, PG_JOB_PAGE);
        p_int(&p, s->pg->node_id);
        PGresult *r = run(s, c, which, NULL, &p, &rc);
        if (!r)
            break;
        size_t nj;
        struct jd_job *jobs = result_jobs(r, &nj);
        PQclear(r);
        if (nj > 0)
            after = jobs[nj - 1].id;
        rc = hand_jobs(s, c, jobs, nj, fn, arg, &count, &stop_rc);
        free(jobs);
        if (nj < PG_JOB_PAGE)
            break;
    }
done:
    tx_end(c);
    jd_pg_rconn_put(s, c);
    return walk_rc(rc, stop_rc);
}

/* Recovery reads the jobs this node owns, after taking every unowned one
 * (pg_cluster.c): what a clean close gave back, or a takeover unowned. */
int jd_pg_recover(struct jd_store *s, jd_store_job_fn fn, void *arg)
{
    int rc = jd_pg_adopt_unowned(s);
    return rc ? rc : recover_read(s, PR_ACTIVE, fn, arg);
}

int jd_pg_recover_started(struct jd_store *s, jd_store_job_fn fn, void *arg)
{
    int rc = jd_pg_adopt_unowned(s);
    return rc ? rc : recover_read(s, PR_STARTED, fn, arg);
}

int jd_pg_jobs_hand(struct jd_store *s, const int64_t *ids, size_t nids, jd_store_job_fn fn,
                    void *arg, size_t *n)
{
    *n = 0;
    if (nids == 0)
        return 0;
    struct jd_pg_rconn *c;
    int rc = jd_pg_rconn_get(s, &c);
    if (rc)
        return rc;
    int stop_rc = 0;
    if ((rc = tx_begin(s, c)) == 0) {
        struct jd_job *jobs = jd_xcalloc(nids, sizeof *jobs);
        size_t got = 0;
        rc = jobs_by_ids(s, c, ids, nids, jobs, &got);
        if (rc == 0) {
            qsort(jobs, got, sizeof *jobs, cmp_job_id);
            rc = hand_jobs(s, c, jobs, got, fn, arg, n, &stop_rc);
        } else {
            for (size_t i = 0; i < got; i++)
                jd_job_clear(&jobs[i]);
        }
        free(jobs);
    }
    tx_end(c);
    jd_pg_rconn_put(s, c);
    return walk_rc(rc, stop_rc);
}

int jd_pg_queued_page(struct jd_store *s, const char *queue, struct jd_queued_pos after,
                      int64_t due_ms, unsigned limit, jd_store_job_fn fn, void *arg, size_t *n)
{
    *n = 0;
    if (!queue || limit < 1 || limit > JD_QUEUED_PAGE_MAX)
        return JD_EINVAL;
    struct jd_pg_rconn *c;
    int rc = jd_pg_rconn_get(s, &c);
    if (rc)
        return rc;
    int stop_rc = 0;
    if ((rc = tx_begin(s, c)) != 0)
        goto done;
    for (int half = 0; half < 2 && rc == 0 && !stop_rc && *n < limit; half++) {
        struct params p = {0};
        p_text(&p, queue);
        p_int(&p, after.priority);
        if (half == 0)
            p_int(&p, after.id);
        p_int(&p, due_ms);
        p_int(&p, (int64_t)(limit - *n));
        p_int(&p, s->pg->node_id); /* this node's jobs only (the cluster) */
        PGresult *r = run(s, c, half == 0 ? PR_QUEUED_SAME : PR_QUEUED_LOWER, NULL, &p, &rc);
        if (!r)
            break;
        size_t nj;
        struct jd_job *jobs = result_jobs(r, &nj);
        PQclear(r);
        rc = hand_jobs(s, c, jobs, nj, fn, arg, n, &stop_rc);
        free(jobs);
    }
done:
    tx_end(c);
    jd_pg_rconn_put(s, c);
    return walk_rc(rc, stop_rc);
}

int jd_pg_queued_later(struct jd_store *s, int64_t after_run_at_ms, int64_t after_id,
                       int64_t until_ms, unsigned limit, jd_store_job_fn fn, void *arg, size_t *n)
{
    *n = 0;
    if (limit < 1 || limit > JD_QUEUED_PAGE_MAX)
        return JD_EINVAL;
    struct jd_pg_rconn *c;
    int rc = jd_pg_rconn_get(s, &c);
    if (rc)
        return rc;
    int stop_rc = 0;
    if ((rc = tx_begin(s, c)) == 0) {
        struct params p = {0};
        p_int(&p, after_run_at_ms);
        p_int(&p, after_id);
        p_int(&p, until_ms);
        p_int(&p, limit);
        p_int(&p, s->pg->node_id);
        PGresult *r = run(s, c, PR_QUEUED_LATER, NULL, &p, &rc);
        if (r) {
            size_t nj;
            struct jd_job *jobs = result_jobs(r, &nj);
            PQclear(r);
            rc = hand_jobs(s, c, jobs, nj, fn, arg, n, &stop_rc);
            free(jobs);
        }
    }
    tx_end(c);
    jd_pg_rconn_put(s, c);
    return walk_rc(rc, stop_rc);
}

int jd_pg_unique_keys(struct jd_store *s,
                      void (*fn)(void *arg, const char *key, int64_t job_id, int64_t expires_ms),
                      void *arg)
{
    int rc;
    PGresult *r = query(s, PR_UNIQUE_KEYS, NULL, &rc);
    if (!r)
        return rc;
    for (int i = 0; i < PQntuples(r); i++)
        fn(arg, PQgetvalue(r, i, 0), g_int(r, i, 1), g_int(r, i, 2));
    PQclear(r);
    return 0;
}

/* The text columns (cols: 1 or 2) of every row of `which`, into one array
 * (names and values interleaved for two). */
static int read_strings(struct jd_store *s, int which, int cols, char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    int rc;
    PGresult *r = query(s, which, NULL, &rc);
    if (!r)
        return rc;
    size_t k = 0, total = (size_t)PQntuples(r) * (size_t)cols;
    char **out = jd_xcalloc(total ? total : 1, sizeof *out);
    for (int i = 0; i < PQntuples(r); i++)
        for (int col = 0; col < cols; col++)
            out[k++] = g_text(r, i, col);
    PQclear(r);
    *names = out;
    *n = k;
    return 0;
}

int jd_pg_paused_queues(struct jd_store *s, char ***names, size_t *n)
{
    return read_strings(s, PR_PAUSED, 1, names, n);
}

int jd_pg_queue_configs(struct jd_store *s, char ***pairs, size_t *n)
{
    return read_strings(s, PR_QCONFIG, 2, pairs, n);
}

/* ---- schedules ---- */

static void row_to_schedule(const PGresult *r, int i, struct jd_schedule_row *o)
{
    o->id = g_text(r, i, 0);
    o->definition = g_text(r, i, 1);
    o->paused = g_bool(r, i, 2);
    o->retired = g_bool(r, i, 3);
    o->next_fire_ms = g_int(r, i, 4);
    o->last_fire_ms = g_int(r, i, 5);
    o->last_job_id = g_int(r, i, 6);
    o->last_outcome = g_text(r, i, 7);
    o->fires = g_int(r, i, 8);
    o->skips = g_int(r, i, 9);
    o->event_seq = g_int(r, i, 10);
    o->created_ms = g_int(r, i, 11);
    o->updated_ms = g_int(r, i, 12);
    o->anchor_ms = g_int(r, i, 13);
}

int jd_pg_schedule_get(struct jd_store *s, const char *id, struct jd_schedule_row *out)
{
    memset(out, 0, sizeof *out);
    if (!id)
        return JD_EINVAL;
    struct params p = {0};
    p_text(&p, id);
    int rc;
    PGresult *r = query_row(s, PR_SCHED_GET, &p, &rc);
    if (!r)
        return rc;
    row_to_schedule(r, 0, out);
    PQclear(r);
    return 0;
}

int jd_pg_schedule_list(struct jd_store *s, const char *after, unsigned limit,
                        struct jd_schedule_row **rows, size_t *n, char **next_cursor)
{
    *rows = NULL;
    *n = 0;
    *next_cursor = NULL;
    if (limit < 1 || limit > 1000)
        return JD_EINVAL;
    struct params p = {0};
    p_text(&p, after ? after : "");
    p_int(&p, (int64_t)limit + 1); /* one extra: is there a next page? */
    int rc;
    PGresult *r = query(s, PR_SCHED_LIST, &p, &rc);
    if (!r)
        return rc;
    size_t k = (size_t)PQntuples(r);
    if (k > limit + 1)
        k = limit + 1;
    struct jd_schedule_row *out = jd_xcalloc(limit + 1, sizeof *out);
    for (size_t i = 0; i < k; i++)
        row_to_schedule(r, (int)i, &out[i]);
    PQclear(r);
    if (k > limit) {
        jd_schedule_row_clear(&out[--k]);
        *next_cursor = jd_xstrdup(out[k - 1].id);
    }
    *rows = out;
    *n = k;
    return 0;
}

int jd_pg_schedule_events(struct jd_store *s, const char *id, int64_t after_seq, unsigned limit,
                          struct jd_schedule_event **events, size_t *n)
{
    *events = NULL;
    *n = 0;
    if (!id || limit < 1 || limit > 10000)
        return JD_EINVAL;
    struct params p = {0};
    p_text(&p, id);
    p_int(&p, after_seq);
    p_int(&p, limit);
    int rc;
    PGresult *r = query(s, PR_SCHED_EVENTS, &p, &rc);
    if (!r)
        return rc;
    size_t k = (size_t)PQntuples(r);
    struct jd_schedule_event *out = jd_xcalloc(k ? k : 1, sizeof *out);
    for (size_t i = 0; i < k; i++) {
        struct jd_schedule_event *e = &out[i];
        e->seq = g_int(r, (int)i, 0);
        e->time_ms = g_int(r, (int)i, 1);
        e->fire_ms = g_int(r, (int)i, 2);
        e->job_id = g_int(r, (int)i, 3);
        e->kind = g_text(r, (int)i, 4);
        e->data = g_text(r, (int)i, 5);
    }
    PQclear(r);
    *events = out;
    *n = k;
    return 0;
}

/* ---- remote commands and tasks ---- */

int jd_pg_commands(struct jd_store *s, struct jd_rcmd_row **rows, size_t *n)
{
    *rows = NULL;
    *n = 0;
    int rc;
    PGresult *r = query(s, PR_RCMD_LIST, NULL, &rc);
    if (!r)
        return rc;
    size_t k = (size_t)PQntuples(r);
    struct jd_rcmd_row *out = k ? jd_xcalloc(k, sizeof *out) : NULL;
    for (size_t i = 0; i < k; i++) {
        out[i].name = g_text(r, (int)i, 0);
        out[i].timeout_ms = g_int(r, (int)i, 1);
        out[i].description = g_text(r, (int)i, 2);
        out[i].created_ms = g_int(r, (int)i, 3);
        out[i].updated_ms = g_int(r, (int)i, 4);
        out[i].max_in_flight = g_int(r, (int)i, 5);
    }
    PQclear(r);
    *rows = out;
    *n = k;
    return 0;
}

int jd_pg_task_state(struct jd_store *s, const char *id, int *state, int64_t *job_id)
{
    if (!id)
        return JD_EINVAL;
    int64_t st = 0;
    int rc = read_two_ints(s, PR_TASK_STATE, id, &st, job_id);
    *state = (int)st;
    return rc;
}

int jd_pg_task_claimed(struct jd_store *s, int64_t job_id, uint32_t tag, uint32_t attempt,
                       bool *claimed)
{
    *claimed = false;
    struct params p = {0};
    p_int(&p, job_id);
    p_int(&p, tag);
    p_int(&p, attempt);
    int rc;
    PGresult *r = query(s, PR_TASK_CLAIMED, &p, &rc);
    if (!r)
        return rc;
    *claimed = PQntuples(r) > 0;
    PQclear(r);
    return 0;
}
