/*
 * The PostgreSQL backend's writes (storage/pg.h): one batch of records in
 * one transaction on the writer's connection, with the same rules as the
 * SQLite writer (storage/writer.c): the batch is first applied without
 * savepoints; if a record fails on its own (a duplicate idempotency key, a
 * held unique key, a missing or fenced job, bad data) the transaction is
 * rolled back and the batch redone with each record, or each
 * all-or-nothing group, inside its own SAVEPOINT, so the record fails
 * alone. Anything else (the connection, the server) fails the whole batch
 * with JD_EIO. The caller fires done() only after COMMIT returned, which
 * with synchronous_commit=on (--sync full) means the commit is flushed.
 *
 * The batch's parts live beside this file (storage/pg_write_impl.h names
 * them): the statements (pg_write_sql.c), one record (pg_write_apply.c,
 * with the owner fence), the pipelined fast path (pg_write_pipe.c), the
 * event horizon (pg_horizon.c) and retention (pg_retention.c).
 *
 * Threading: the writer thread only.
 */
#include "storage/pg_write_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* The slow path: every record, or group, in its own SAVEPOINT, one
 * statement at a time. 0, or -1 when the transaction failed. */
static int apply_savepoints(struct jd_pgw_ctx *c, struct jd_write **b, int *rcs, size_t n)
{
    struct jd_store *s = c->s;
    jd_pgw_counts_clear(c->ws);
    for (size_t i = 0; i < n;) {
        size_t g = b[i]->group_ ? b[i]->group_ : 1;
        if (g == 1 && b[i]->op == JD_W_SYNC_) {
            rcs[i++] = 0;
            continue;
        }
        if (jd_pgw_exec(s, "SAVEPOINT r") != 0) {
            jd_pgw_log_failure(s, "savepoint");
            return -1;
        }
        jd_pgw_counts_mark(c->ws);
        int rc = 0;
        for (size_t k = 0; k < g && rc == 0; k++)
            rc = jd_pgw_apply(c, b[i + k]);
        if (rc != 0 && !jd_pgw_record_fault(rc)) {
            jd_pgw_log_failure(s, "write");
            return -1;
        }
        if (rc != 0) {
            jd_pgw_counts_restore(c->ws);
            if (jd_pgw_exec(s, "ROLLBACK TO SAVEPOINT r") != 0) {
                jd_pgw_log_failure(s, "rollback to savepoint");
                return -1;
            }
        }
        if (jd_pgw_exec(s, "RELEASE SAVEPOINT r") != 0) {
            jd_pgw_log_failure(s, "release savepoint");
            return -1;
        }
        for (size_t k = 0; k < g; k++) {
            rcs[i + k] = rc;
            if (rc != 0)
                b[i + k]->version = 0;
            if (rc == JD_ESTALE)
                atomic_fetch_add_explicit(&s->pg->st_fenced, 1, memory_order_relaxed);
        }
        i += g;
    }
    return 0;
}

int jd_pgw_session(struct jd_store *s)
{
    struct jd_pg *pg = s->pg;
    if (PQpipelineStatus(pg->wconn) != PQ_PIPELINE_OFF) {
        /* a failed batch left results unread: read them, or start over */
        for (int i = 0; i < 4 * JD_PG_PIPE_CHUNK && !PQexitPipelineMode(pg->wconn); i++) {
            PGresult *r = PQstatus(pg->wconn) == CONNECTION_OK ? PQgetResult(pg->wconn) : NULL;
            if (!r && !PQisBusy(pg->wconn) && !PQexitPipelineMode(pg->wconn)) {
                PQfinish(pg->wconn);
                pg->wconn = jd_pg_connect(pg->url, pg->display, s->sync_full, NULL);
                pg->wprepared = false;
                break; /* NULL: connected again below */
            }
            PQclear(r);
        }
    }
    if (PQstatus(pg->wconn) != CONNECTION_OK) {
        if (pg->wconn)
            PQreset(pg->wconn);
        else
            pg->wconn = jd_pg_connect(pg->url, pg->display, s->sync_full, NULL);
        pg->wprepared = false;
        if (PQstatus(pg->wconn) != CONNECTION_OK) {
            jd_pgw_log_failure(s, "reconnect");
            return JD_EIO;
        }
        jd_log(JD_LOG_WARN, "storage: reconnected to the database", "db", pg->display, NULL);
        /* the node lock went with the old session: take it again (if
         * another node has it meanwhile, it adopted our jobs, and the
         * fence refuses our writes for them) */
        char sql[64];
        snprintf(sql, sizeof sql, "SELECT pg_try_advisory_lock(%lld)", (long long)JD_PG_NODE_LOCK);
        PGresult *r = PQexec(pg->wconn, sql);
        if (jd_pg_rc(r) != 0 || PQntuples(r) != 1 || PQgetvalue(r, 0, 0)[0] != 't')
            jd_log(JD_LOG_ERROR, "storage: another node holds the database since the reconnect",
                   "db", pg->display, NULL);
        PQclear(r);
    }
    if (PQtransactionStatus(pg->wconn) != PQTRANS_IDLE)
        jd_pgw_exec(s, "ROLLBACK");
    return pg->wprepared ? 0 : jd_pgw_prepare(s);
}

#define JD_PG_NOTIFY_MAX 7900 /* a NOTIFY payload is at most 8000 bytes */

/* A notice being built: past the cap it says "everything" instead. */
struct notice {
    char buf[JD_PG_NOTIFY_MAX + 1];
    size_t len;
    bool all;
};

static void note_add(struct notice *nb, const char *e)
{
    size_t k = strlen(e);
    if (nb->all)
        return;
    if (nb->len + k + 2 > JD_PG_NOTIFY_MAX) {
        nb->all = true;
        return;
    }
    if (nb->len)
        nb->buf[nb->len++] = ',';
    memcpy(nb->buf + nb->len, e, k + 1);
    nb->len += k;
}

/* The batch's change notice, sent inside its transaction by
 * jd_pgw_commit() (delivered at commit, dropped with a rollback): "id:version"
 * per job record applied, "s:<id>" per schedule, "r" for inbox requests, or
 * "*" when it would not fit. Hints only: listeners re-read. The whole
 * notice goes only while some node watches (pg.h, JD_PG_WATCH_LOCK_SQL);
 * *must is the part that always goes ("r", "s"; "" if none). NULL: nothing
 * to say. *nreq: inbox requests in it. */
static const char *notice_of(struct jd_write **b, const int *rcs, size_t n, const char **must,
                             uint64_t *nreq_out)
{
    static _Thread_local struct notice whole, always;
    whole.len = always.len = 0;
    whole.all = always.all = false;
    bool req = false;
    uint64_t nreq = 0;
    for (size_t i = 0; i < n; i++) {
        struct jd_write *w = b[i];
        char e[160];
        if (rcs[i] != 0)
            continue;
        switch (w->op) {
        case JD_W_JOB_INSERT:
        case JD_W_JOB_CHANGE:
        case JD_W_JOB_DELETE:
            snprintf(e, sizeof e, "%lld:%lld", (long long)w->job_id, (long long)w->version);
            note_add(&whole, e);
            break;
        case JD_W_JOB_REQUEST:
            req = true;
            nreq++;
            break;
        case JD_W_SCHEDULE_PUT:
        case JD_W_SCHEDULE_CHANGE:
        case JD_W_SCHEDULE_DELETE:
            if (w->sched.id && strlen(w->sched.id) < 120 && !strchr(w->sched.id, ','))
                snprintf(e, sizeof e, "s:%s", w->sched.id);
            else
                snprintf(e, sizeof e, "s");
            note_add(&whole, e);
            note_add(&always, e);
            break;
        default:
            break;
        }
    }
    if (req) {
        note_add(&whole, "r");
        note_add(&always, "r");
    }
    /* "*" says any job may have changed, "s" any schedule; keep the inbox
     * hint beside them */
    if (whole.all)
        whole.len = (size_t)snprintf(whole.buf, sizeof whole.buf, req ? "*,r,s" : "*,s");
    if (always.all)
        always.len = (size_t)snprintf(always.buf, sizeof always.buf, req ? "r,s" : "s");
    *nreq_out = nreq;
    *must = always.buf;
    return whole.len ? whole.buf : NULL;
}

void jd_pg_test_hold_commit(struct jd_store *s, bool hold)
{
    atomic_store(&s->pg->test_hold_commit, hold);
}

bool jd_pg_test_commit_held(struct jd_store *s)
{
    return atomic_load(&s->pg->test_held);
}

static void test_hold(struct jd_pg *pg)
{
    if (!atomic_load(&pg->test_hold_commit))
        return;
    atomic_store(&pg->test_held, true);
    while (atomic_load(&pg->test_hold_commit)) {
        struct timespec ts = {0, 2000000L};
        nanosleep(&ts, NULL);
    }
    atomic_store(&pg->test_held, false);
}

void jd_pg_test_drop_at_commit(struct jd_store *s)
{
    atomic_store(&s->pg->test_drop_commit, true);
}

bool jd_pgw_commit(struct jd_store *s, const struct jd_pgw_prm *counts, const char *note,
                   const char *must, int hz)
{
    PGconn *c = s->pg->wconn;
    if (PQtransactionStatus(c) != PQTRANS_INTRANS)
        return false;
    if (atomic_exchange(&s->pg->test_drop_commit, false)) {
        /* the test hook: COMMIT goes out, the answer never comes back
         * (the server waits first, so the answer cannot beat the
         * shutdown into the socket's buffer) */
        if (counts && jd_pgw_xq(s, jd_pgw_stmt(PS_COUNT_ADD), counts, NULL) != 0)
            return false;
        if (PQsendQuery(c, "SELECT pg_sleep(0.3); COMMIT"))
            PQflush(c);
        shutdown(PQsocket(c), SHUT_RDWR);
        PGresult *r;
        while ((r = PQgetResult(c)) != NULL)
            PQclear(r);
        return false;
    }
    if (!counts && !note && hz == HZ_KEEP) {
        PGresult *r = PQexec(c, "COMMIT");
        bool ok = jd_pg_rc(r) == 0 && strcmp(PQcmdStatus(r), "COMMIT") == 0;
        PQclear(r);
        return ok;
    }
    if (!PQenterPipelineMode(c))
        return false;
    char me[24];
    snprintf(me, sizeof me, "%lld", (long long)s->pg->node_id);
    bool next_set = false;
    const char *nv[] = {note, must ? must : ""}, *cv[] = {me};
    /* the statements in order: counts, horizon, notice, COMMIT */
    int nst = (counts != NULL) + (hz != HZ_KEEP) + (note != NULL) + 1;
    int hz_at = hz == HZ_KEEP ? -1 : counts != NULL;
    bool ok =
        (!counts ||
         PQsendQueryPrepared(c, jd_pgw_stmt(PS_COUNT_ADD), counts->n, counts->v, NULL, NULL, 0)) &&
        (hz == HZ_KEEP || PQsendQueryPrepared(c, jd_pgw_stmt(PS_HZ_NEXT), 1, cv, NULL, NULL, 0)) &&
        (!note || PQsendQueryPrepared(c, jd_pgw_stmt(PS_NOTIFY), 2, nv, NULL, NULL, 0)) &&
        PQsendQueryParams(c, "COMMIT", 0, NULL, NULL, NULL, NULL, 0) && PQpipelineSync(c);
    /* each statement's result, then NULL; then the sync */
    for (int k = 0; k < nst && ok; k++) {
        PGresult *r = PQgetResult(c);
        if (!r)
            return false; /* the connection is gone (ensure_session cleans up) */
        ok = jd_pg_rc(r) == 0 && (k < nst - 1 || strcmp(PQcmdStatus(r), "COMMIT") == 0) &&
             PQresultStatus(r) != PGRES_PIPELINE_ABORTED;
        if (ok && k == hz_at && hz == HZ_NEXT)
            next_set = strcmp(PQcmdTuples(r), "1") == 0;
        PQclear(r);
        if ((r = PQgetResult(c)) != NULL) {
            PQclear(r);
            return false;
        }
    }
    if (!ok)
        return false; /* the pipeline is left for ensure_session to drain */
    PGresult *r = PQgetResult(c);
    ok = r && PQresultStatus(r) == PGRES_PIPELINE_SYNC;
    PQclear(r);
    ok = PQexitPipelineMode(c) && ok;
    if (ok && hz != HZ_KEEP)
        s->pg->hz_pending = next_set;
    return ok;
}

int jd_pg_commit_batch(struct jd_store *s, struct jd_write **b, int *rcs, size_t n)
{
    struct jd_pgw_ctx c = {.s = s, .ws = jd_pgw_scratch(s->pg), .now = jd_wall_ms()};
    bool applied = false, commit_sent = false, retried = false;
again:
    if (jd_pgw_session(s) != 0)
        goto fail;
    if (!s->pg->hz_pending && jd_pgw_needs_horizon(b, n) && jd_pgw_hz_publish(s) != 0) {
        jd_log(JD_LOG_ERROR, "storage commit failed", "db", s->pg->display, "error",
               "cannot publish the event horizon", NULL);
        goto fail;
    }
    applied = true; /* apply_pipelined saves the records' job ids first */
    int fast = jd_pgw_apply_pipelined(&c, b, rcs, n);
    if (fast < 0) {
        jd_pgw_log_failure(s, "write");
        goto fail;
    }
    if (fast > 0) {
        if (jd_pgw_exec(s, "BEGIN; SELECT pg_advisory_xact_lock_shared(" JD_PG_WATCH_LOCK_SQL
                           ")") != 0) {
            jd_pgw_log_failure(s, "begin");
            goto fail;
        }
        if (apply_savepoints(&c, b, rcs, n) != 0)
            goto fail;
    }
    uint64_t nreq = 0;
    const char *must = NULL;
    const char *note = notice_of(b, rcs, n, &must, &nreq);
    test_hold(s->pg);
    commit_sent = true;
    /* With a bound published, this COMMIT publishes the next batch's
     * (visible with it, before that batch takes an id), saving its round
     * trip if records come within JD_PG_HZ_LINGER_US; the writer clears it
     * if none do (an idle writer holds none for longer). */
    bool more = atomic_load_explicit(&s->head, memory_order_relaxed) != NULL;
    int hz = (s->pg->hz_pending || more) && !atomic_load(&s->pg->lease_lost) ? HZ_NEXT : HZ_KEEP;
    struct jd_pgw_prm counts;
    bool have_counts = jd_pgw_counts_prm(&c, &counts);
    if (!jd_pgw_commit(s, have_counts ? &counts : NULL, note, must, hz)) {
        jd_pgw_log_failure(s, "commit");
        goto fail;
    }
    jd_pgw_counts_clear(c.ws);
    atomic_fetch_add_explicit(&s->pg->st_requests, nreq, memory_order_relaxed); /* a statistic */
    return 0;

fail:
    jd_pgw_counts_clear(c.ws);
    c.ws->npq = 0;
    /* The connection went (a server restart, a failover) before COMMIT was
     * sent: nothing of the batch is in the database, so it is redone once
     * on a new connection. Lost during COMMIT, see below. */
    if (applied && !commit_sent && !retried && PQstatus(s->pg->wconn) != CONNECTION_OK) {
        retried = true;
        for (size_t i = 0; i < n; i++) {
            b[i]->job_id = c.ws->ids[i];
            b[i]->version = 0;
        }
        goto again;
    }
    /* Lost during COMMIT: the batch may be in the database or not. Failing
     * it would have the job layer record it again (a completion twice), and
     * reporting it done might report what is not durable. The node gives up
     * its incarnation instead: the records fail, every later job write is
     * refused, and the next owner replays what the database holds. */
    if (commit_sent && PQstatus(s->pg->wconn) != CONNECTION_OK)
        jd_pg_give_up_lease(s->pg, "the connection was lost during COMMIT: the outcome is unknown");
    if (PQstatus(s->pg->wconn) == CONNECTION_OK &&
        PQpipelineStatus(s->pg->wconn) == PQ_PIPELINE_OFF &&
        PQtransactionStatus(s->pg->wconn) != PQTRANS_IDLE)
        jd_pgw_exec(s, "ROLLBACK");
    /* not committed, so the horizon goes; but a COMMIT lost in flight
     * may still commit: its horizon stays until the takeover deletes the
     * row (the incarnation was given up above) */
    if (!commit_sent || PQstatus(s->pg->wconn) == CONNECTION_OK)
        jd_pgw_hz_clear(s);
    for (size_t i = 0; i < n; i++) {
        rcs[i] = JD_EIO;
        b[i]->version = 0;
    }
    return JD_EIO;
}
