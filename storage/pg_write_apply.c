/*
 * One record of a PostgreSQL batch (storage/pg_write_impl.h): its
 * statements, run at once (the savepoint path: when one touches no row,
 * follow-up reads say why) or queued in the batch's pipeline (the fast
 * path: the results are checked by jd_pgw_take when they come back), and
 * what their results say (versions, queue count changes).
 *
 * A job change bumps the version, sets its fields and appends its event
 * (seq = the new version) in one statement.
 *
 * The fence: a job change or crash count is applied only
 * WHERE id = $1 AND owner_node = <this node incarnation> and this node's
 * lease is valid. Zero rows for a job that exists means another
 * incarnation owns it (or this one's lease lapsed): the record fails with
 * JD_ESTALE (final, never retried), is logged and counted
 * (jd_pg.st_fenced).
 *
 * Threading: the writer thread only.
 */
#include "storage/pg_write_impl.h"

#include "common/alloc.h"
#include "common/error.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int jd_pgw_take(struct jd_pgw_ctx *c, struct jd_write *w, int kind, const PGresult *r)
{
    int rc = jd_pgw_rc(r);
    if (rc)
        return rc;
    if (kind == RK_ANY)
        return 0;
    if (kind == RK_INSERT) {
        w->version = 1;
        jd_pgw_count(c->ws, w->job->queue, (int)w->job->state, 1);
        return 0;
    }
    if (kind == RK_INSERTS) {
        for (size_t i = 0; i < c->nb; i++)
            if (c->b[i]->op == JD_W_JOB_INSERT) {
                c->b[i]->version = 1;
                jd_pgw_count(c->ws, c->b[i]->job->queue, (int)c->b[i]->job->state, 1);
            }
        return 0;
    }
    if (kind == RK_CHANGES)
        return jd_pgw_take_changes(c, r);
    if (PQntuples(r) == 0)
        return NOROW;
    if (kind == RK_REQUEST) {
        if (PQgetisnull(r, 0, 0))
            return JD_ENOENT;
        if (PQgetisnull(r, 0, 1))
            return JD_ECONFLICT;
        w->request_id = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
        return 0;
    }
    if (kind == RK_CHANGE) {
        w->version = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        int old_state = atoi(PQgetvalue(r, 0, 2)), new_state = atoi(PQgetvalue(r, 0, 3));
        if (old_state != new_state) {
            jd_pgw_count(c->ws, PQgetvalue(r, 0, 1), old_state, -1);
            jd_pgw_count(c->ws, PQgetvalue(r, 0, 1), new_state, 1);
        }
    } else if (kind == RK_DELETE) {
        jd_pgw_count(c->ws, PQgetvalue(r, 0, 0), atoi(PQgetvalue(r, 0, 1)), -1);
    }
    return 0;
}

int jd_pgw_emit(struct jd_pgw_ctx *c, struct jd_write *w, const char *name,
                const struct jd_pgw_prm *p, int kind)
{
    PGconn *conn = c->s->pg->wconn;
    if (c->pipe) {
        if (!PQsendQueryPrepared(conn, name, p->n, p->v, NULL, NULL, 0))
            return JD_EIO;
        struct jd_pg_wscratch *ws = c->ws;
        if (ws->npq == ws->cappq) {
            ws->cappq = ws->cappq ? 2 * ws->cappq : 256;
            ws->pq = jd_xrealloc(ws->pq, ws->cappq * sizeof *ws->pq);
        }
        ws->pq[ws->npq++] = (struct jd_pgw_pend){.w = w, .kind = kind};
        return 0;
    }
    PGresult *r = PQexecPrepared(conn, name, p->n, p->v, NULL, NULL, 0);
    int rc = jd_pgw_take(c, w, kind, r);
    PQclear(r);
    return rc;
}

/* A record that touched zero rows of job id: JD_ENOENT if the job is gone,
 * JD_ESTALE if it exists (another node incarnation owns it: fenced). */
static int missing_or_fenced(struct jd_store *s, int64_t id)
{
    struct jd_pgw_prm p = {0};
    p_int(&p, id);
    int64_t owner = 0;
    bool found = false;
    int rc = jd_pgw_xint(s, PS_JOB_OWNER, &p, &owner, &found);
    if (rc)
        return rc;
    if (!found)
        return JD_ENOENT;
    char idb[24], ob[24], me[24];
    snprintf(idb, sizeof idb, "%lld", (long long)id);
    snprintf(ob, sizeof ob, "%lld", (long long)owner);
    snprintf(me, sizeof me, "%lld", (long long)s->pg->node_id);
    jd_log(JD_LOG_WARN,
           owner == s->pg->node_id ? "storage: job write refused, this node's lease lapsed"
                                   : "storage: job write refused, the job is not this node's",
           "job_id", idb, "owner_node", ob, "node", me, NULL);
    return JD_ESTALE;
}

/* ---- the records ---- */

#define JD_PG_SCHED_TRIM_EVERY 64 /* trim a schedule's history once per this many events */

static int apply_insert(struct jd_pgw_ctx *c, struct jd_write *w)
{
    struct jd_store *s = c->s;
    const struct jd_job *j = w->job;
    int64_t created = 0;
    int rc = jd_write_insert_check(w, c->now, &created);
    if (rc)
        return rc;
    int64_t id = w->job_id;
    bool found = false;

    if (j->idempotency_key) {
        struct jd_pgw_prm p = {0};
        p_text(&p, j->idempotency_key);
        p_int(&p, id);
        p_text(&p, w->idem_fingerprint);
        p_int(&p, created);
        rc = jd_pgw_emit(c, w, jd_pgw_stmt(PS_IDEM_INSERT), &p, RK_ROW);
        if (rc == NOROW) {
            struct jd_pgw_prm g = {0};
            p_text(&g, j->idempotency_key);
            if ((rc = jd_pgw_xint(s, PS_IDEM_GET, &g, &w->job_id, &found)) != 0)
                return rc;
            return found ? JD_EEXIST : JD_EIO;
        }
        if (rc)
            return rc;
    }
    if (w->unique_key) {
        struct jd_pgw_prm p = {0};
        p_text(&p, w->unique_key);
        p_int(&p, id);
        p_int(&p, w->unique_expires_ms);
        p_int(&p, c->now);
        rc = jd_pgw_emit(c, w, jd_pgw_stmt(PS_UNIQUE_TAKE), &p, RK_ROW);
        if (rc == NOROW) {
            struct jd_pgw_prm g = {0};
            p_text(&g, w->unique_key);
            if ((rc = jd_pgw_xint(s, PS_UNIQUE_HOLDER, &g, &w->job_id, &found)) != 0)
                return rc;
            return found ? JD_ECONFLICT : JD_EIO;
        }
        if (rc)
            return rc;
    }
    if (c->hoisted)
        return 0;
    char data[48];
    snprintf(data, sizeof data, "{\"state\":\"%s\"}", jd_job_state_name(j->state));
    struct jd_pgw_prm p = {0};
    p_int(&p, id);
    p_text(&p, j->queue);
    p_int(&p, j->priority);
    p_int(&p, j->state);
    p_int(&p, j->run_at_ms);
    p_int(&p, created);
    p_int(&p, jd_job_state_terminal(j->state) ? created : 0);
    p_text(&p, j->idempotency_key);
    p_text(&p, j->schedule_id);
    p_text(&p, j->handler);
    p_int(&p, w->unowned ? 0 : s->pg->node_id); /* node 0 is none: unowned */
    p_text(&p, j->definition);
    p_int(&p, c->now);
    p_text(&p, data);
    /* the cheap test SQLite's label trigger makes too */
    bool labels = strstr(j->definition, "\"labels\":") != NULL;
    return jd_pgw_emit(c, w, jd_pgw_stmt(labels ? PS_JOB_INSERT_LABELS : PS_JOB_INSERT), &p,
                       RK_INSERT);
}

/* The job change for one combination of JD_SET_* flags, prepared on first
 * use (never inside a pipeline: the pipelined path prepares its batch's
 * first). Parameters keep fixed numbers (types declared, so unused ones
 * are fine): $1 id, $2 now, $3 this node, $4 state, $5 output, $6 error,
 * $7 run_at, $8 attempts, $9 started, $10 finished, $11 kind, $12 tag,
 * $13 data, $14 the version expected (0: any). Returns version, queue,
 * old state, new state; no row: missing, fenced or at another version (a
 * change that moves a terminal job back to queued, a retry, passes the
 * fence and takes the job for this node, so it names the version it read:
 * a stale node's retry cannot reopen a job finished again elsewhere). A move to a terminal
 * state without an explicit finish time
 * stamps it now, so retention never sees a terminal job with finished_ms 0.
 * The old state (o) is a plain read of the statement's snapshot: all parts
 * of one statement see the row as it was before the UPDATE (FOR UPDATE
 * there would skip the row the UPDATE changed). */
const char *jd_pgw_change_stmt(struct jd_store *s, unsigned set)
{
    static char names[JD_UPDATE_MASKS][8];
    snprintf(names[set], sizeof names[set], "u%u", set);
    if (s->pg->upd_prepared[set])
        return names[set];
    char sql[1792];
    bool st = set & JD_SET_STATE;
    int len = snprintf(sql, sizeof sql,
                       "WITH %su AS (UPDATE jobs SET version = version + 1,"
                       " updated_ms = $2",
                       st ? "o AS (SELECT state FROM jobs WHERE id = $1), " : "");
    static const char *const cols[7] = {
        ", state = $4",    ", output = $5",     ", error = $6",        ", run_at_ms = $7",
        ", attempts = $8", ", started_ms = $9", ", finished_ms = $10",
    };
    for (int i = 0; i < 7; i++)
        if (set & (1u << i))
            len += snprintf(sql + len, sizeof sql - (size_t)len, "%s", cols[i]);
    if (st && !(set & JD_SET_FINISHED))
        len += snprintf(sql + len, sizeof sql - (size_t)len,
                        ", finished_ms = CASE WHEN $4 >= 3 AND finished_ms = 0 THEN $2"
                        " ELSE finished_ms END");
    /* A finished job is nobody's future: a retry (back to queued) by any
     * node makes the job that node's. */
    if (st)
        len += snprintf(sql + len, sizeof sql - (size_t)len, ", owner_node = $3");
    snprintf(sql + len, sizeof sql - (size_t)len,
             " WHERE id = $1 AND %s AND ($14 = 0 OR version = $14)" LEASE_VALID(
                 "$3") " RETURNING version, queue, state),"
                       " e AS (INSERT INTO events(job_id, seq, time_ms, kind, tag, data)"
                       " SELECT $1, version, $2, $11, $12, $13 FROM u)"
                       " SELECT u.version, u.queue, %s, u.state FROM u%s",
             st ? "(owner_node = $3 OR (state >= 3 AND $4 = 0))" : "owner_node = $3",
             st ? "o.state" : "u.state", st ? ", o" : "");
    Oid oids[14];
    int n;
    jd_pgw_oids("iiiittiiiiiiti", oids, &n);
    PGresult *r = PQprepare(s->pg->wconn, names[set], sql, n, oids);
    int rc = jd_pg_rc(r);
    PQclear(r);
    if (rc) {
        jd_pgw_log_failure(s, "preparing a job change");
        return NULL;
    }
    s->pg->upd_prepared[set] = true;
    return names[set];
}

bool jd_pgw_change_valid(const struct jd_write *w)
{
    return w->job_id > 0 && (unsigned)w->kind <= JD_EVK_PROGRESS && w->set < JD_UPDATE_MASKS &&
           (!(w->set & JD_SET_STATE) || (unsigned)w->state < JD_JOB_NSTATES);
}

static int apply_change(struct jd_pgw_ctx *c, struct jd_write *w)
{
    if (!jd_pgw_change_valid(w))
        return JD_EINVAL;
    if (atomic_load(&c->s->pg->lease_lost))
        return JD_ESTALE;
    const char *name = jd_pgw_change_stmt(c->s, w->set);
    if (!name)
        return JD_EIO;
    int rc;
    if (w->request_id > 0) {
        /* gone: another record took it already (the request is recorded once) */
        struct jd_pgw_prm t = {0};
        p_int(&t, w->request_id);
        p_int(&t, w->job_id);
        rc = jd_pgw_emit(c, w, jd_pgw_stmt(PS_REQUEST_TAKE), &t, RK_ROW);
        if (rc)
            return rc == NOROW ? JD_ECONFLICT : rc;
    }
    if (w->release_unique) {
        struct jd_pgw_prm u = {0};
        p_int(&u, w->job_id);
        if ((rc = jd_pgw_emit(c, w, jd_pgw_stmt(PS_UNIQUE_RELEASE), &u, RK_ANY)) != 0)
            return rc;
    }
    const char *data = w->data;
    char buf[48];
    if (!data && w->kind == JD_EVK_STATE && (w->set & JD_SET_STATE)) {
        snprintf(buf, sizeof buf, "{\"state\":\"%s\"}", jd_job_state_name(w->state));
        data = buf;
    }
    struct jd_pgw_prm p = {0};
    p_int(&p, w->job_id);
    p_int(&p, c->now);
    p_int(&p, c->s->pg->node_id);
    p_int(&p, w->state);
    p_text(&p, w->output);
    p_text(&p, w->error);
    p_int(&p, w->run_at_ms);
    p_int(&p, w->attempts);
    p_int(&p, w->started_ms);
    p_int(&p, w->finished_ms);
    p_int(&p, w->kind);
    p_int(&p, w->tag);
    p_text(&p, data);
    p_int(&p, w->expect_version);
    rc = jd_pgw_emit(c, w, name, &p, RK_CHANGE);
    if (rc == NOROW && w->expect_version) {
        /* at another version than expected: changed since it was read */
        struct jd_pgw_prm v = {0};
        p_int(&v, w->job_id);
        int64_t version = 0;
        bool found = false;
        if ((rc = jd_pgw_xint(c->s, PS_JOB_VERSION, &v, &version, &found)) != 0)
            return rc;
        if (found && version != w->expect_version)
            return JD_ECONFLICT;
        rc = NOROW;
    }
    return rc == NOROW ? missing_or_fenced(c->s, w->job_id) : rc;
}

static int apply_queue(struct jd_pgw_ctx *c, struct jd_write *w)
{
    if (!w->queue)
        return JD_EINVAL;
    struct jd_pgw_prm p = {0};
    p_text(&p, w->queue);
    if (w->op == JD_W_QUEUE) {
        p_int(&p, w->paused ? 1 : 0);
        return jd_pgw_emit(c, w, jd_pgw_stmt(PS_QUEUE_UPSERT), &p, RK_ANY);
    }
    p_text(&p, w->queue_config);
    for (int i = 0; i < 3; i++) {
        if (w->retain_ms[i] < 0)
            return JD_EINVAL;
        p_int(&p, w->retain_ms[i]);
    }
    /* Never switched off until the next start (as in writer.c): a pass per
     * (queue, state) is as right without overrides, only a little slower;
     * so it is set even if this record is later rolled back. */
    if (w->retain_ms[0] > 0 || w->retain_ms[1] > 0 || w->retain_ms[2] > 0)
        c->s->queue_retention = true;
    return jd_pgw_emit(c, w, jd_pgw_stmt(PS_QUEUE_CONFIG), &p, RK_ANY);
}

/* Update the schedule row as sw says and append its event (if any), in
 * one statement. JD_ENOENT when the schedule does not exist. */
static int apply_schedule_change(struct jd_pgw_ctx *c, struct jd_write *w,
                                 const struct jd_schedule_write *sw)
{
    if (!sw->id || sw->set > 15)
        return JD_EINVAL;
    struct jd_pgw_prm p = {0};
    p_text(&p, sw->id);
    p_int(&p, c->now);
    p_int(&p, sw->set);
    p_int(&p, sw->paused);
    p_int(&p, sw->retired);
    p_int(&p, sw->next_fire_ms);
    p_int(&p, sw->last_fire_ms);
    p_int(&p, sw->last_job_id);
    p_text(&p, sw->last_outcome);
    p_int(&p, sw->add_fires);
    p_int(&p, sw->add_skips);
    p_int(&p, sw->event != NULL);
    p_text(&p, sw->event);
    p_int(&p, sw->event_fire_ms);
    p_int(&p, sw->event_job_id);
    p_text(&p, sw->event_data);
    p_int(&p, JD_SCHEDULE_EVENTS_KEEP);
    p_int(&p, JD_PG_SCHED_TRIM_EVERY);
    p_int(&p, sw->expect_next_fire_ms);
    int rc = jd_pgw_emit(c, w, jd_pgw_stmt(PS_SCHED_CHANGE), &p, RK_ROW);
    if (rc != NOROW)
        return rc;
    if (!sw->expect_next_fire_ms)
        return JD_ENOENT;
    /* a conditional fire that lost the race, or a schedule that is gone */
    struct jd_pgw_prm e = {0};
    p_text(&e, sw->id);
    int64_t one = 0;
    bool found = false;
    if ((rc = jd_pgw_xint(c->s, PS_SCHED_EXISTS, &e, &one, &found)) != 0)
        return rc;
    return found ? JD_ECONFLICT : JD_ENOENT;
}

static int apply_schedule(struct jd_pgw_ctx *c, struct jd_write *w)
{
    const struct jd_schedule_write *sw = &w->sched;
    if (!sw->id)
        return JD_EINVAL;
    if (w->op == JD_W_SCHEDULE_CHANGE)
        return apply_schedule_change(c, w, sw);
    struct jd_pgw_prm p = {0};
    p_text(&p, sw->id);
    if (w->op == JD_W_SCHEDULE_DELETE) {
        int rc = jd_pgw_emit(c, w, jd_pgw_stmt(PS_SCHED_DELETE), &p, RK_ROW);
        return rc == NOROW ? JD_ENOENT : rc;
    }
    if (!sw->definition)
        return JD_EINVAL;
    p_text(&p, sw->definition);
    p_int(&p, sw->paused);
    p_int(&p, sw->next_fire_ms);
    p_int(&p, c->now);
    p_int(&p, sw->anchor_ms);
    p_int(&p, sw->retired);
    int rc = jd_pgw_emit(c, w, jd_pgw_stmt(PS_SCHED_UPSERT), &p, RK_ANY);
    if (rc || !sw->event)
        return rc;
    struct jd_schedule_write ev = {.id = sw->id,
                                   .event = sw->event,
                                   .event_fire_ms = sw->event_fire_ms,
                                   .event_job_id = sw->event_job_id,
                                   .event_data = sw->event_data};
    return apply_schedule_change(c, w, &ev);
}

/* A job's crash count (no event, no new version); fenced like a change. */
static int apply_crashes(struct jd_pgw_ctx *c, struct jd_write *w)
{
    if (w->job_id <= 0)
        return JD_EINVAL;
    if (atomic_load(&c->s->pg->lease_lost))
        return JD_ESTALE;
    struct jd_pgw_prm p = {0};
    p_int(&p, w->job_id);
    p_int(&p, w->crashes);
    p_int(&p, c->s->pg->node_id);
    int rc = jd_pgw_emit(c, w, jd_pgw_stmt(PS_CRASHES), &p, RK_ROW);
    return rc == NOROW ? missing_or_fenced(c->s, w->job_id) : rc;
}

/* Delete a terminal job and everything of its (any node may: it is
 * finished, nobody owns its future). */
static int apply_job_delete(struct jd_pgw_ctx *c, struct jd_write *w)
{
    if (w->job_id <= 0)
        return JD_EINVAL;
    struct jd_pgw_prm p = {0};
    p_int(&p, w->job_id);
    int rc = jd_pgw_emit(c, w, jd_pgw_stmt(PS_JOB_DELETE), &p, RK_DELETE);
    if (rc != NOROW)
        return rc;
    int64_t state = 0;
    bool found = false;
    if ((rc = jd_pgw_xint(c->s, PS_JOB_STATE, &p, &state, &found)) != 0)
        return rc;
    return found ? JD_ECONFLICT : JD_ENOENT;
}

/* An inbox request (JD_W_JOB_REQUEST): any node may write it. */
static int apply_request(struct jd_pgw_ctx *c, struct jd_write *w)
{
    if (w->job_id <= 0 || (w->kind != JD_EVK_MESSAGE && w->kind != JD_EVK_CANCEL))
        return JD_EINVAL;
    struct jd_pgw_prm p = {0};
    p_int(&p, w->job_id);
    p_int(&p, w->kind);
    p_text(&p, w->data);
    p_int(&p, c->now);
    return jd_pgw_emit(c, w, jd_pgw_stmt(PS_REQUEST), &p, RK_REQUEST);
}

static int apply_remote(struct jd_pgw_ctx *c, struct jd_write *w)
{
    struct jd_pgw_prm p = {0};
    if (w->op == JD_W_TASK_PUT) {
        const struct jd_task_write *t = &w->task;
        if (!t->id || !t->command)
            return JD_EINVAL;
        p_text(&p, t->id);
        p_int(&p, t->job_id);
        p_int(&p, t->tag);
        p_int(&p, t->attempt);
        p_text(&p, t->command);
        p_int(&p, t->state);
        p_text(&p, t->worker);
        p_int(&p, t->lease_expires_ms);
        p_int(&p, c->now);
        return jd_pgw_emit(c, w, jd_pgw_stmt(PS_TASK_UPSERT), &p, RK_ANY);
    }
    if (!w->rcmd.name)
        return JD_EINVAL;
    p_text(&p, w->rcmd.name);
    if (w->op == JD_W_COMMAND_DELETE) {
        int rc = jd_pgw_emit(c, w, jd_pgw_stmt(PS_RCMD_DELETE), &p, RK_ROW);
        return rc == NOROW ? JD_ENOENT : rc;
    }
    p_int(&p, w->rcmd.timeout_ms);
    p_text(&p, w->rcmd.description);
    p_int(&p, c->now);
    p_int(&p, w->rcmd.max_in_flight);
    return jd_pgw_emit(c, w, jd_pgw_stmt(PS_RCMD_UPSERT), &p, RK_ANY);
}

int jd_pgw_apply(struct jd_pgw_ctx *c, struct jd_write *w)
{
    w->version = 0;
    w->time_ms = c->now;
    switch (w->op) {
    case JD_W_JOB_INSERT:
        return apply_insert(c, w);
    case JD_W_JOB_CHANGE:
        return apply_change(c, w);
    case JD_W_QUEUE:
    case JD_W_QUEUE_CONFIG:
        return apply_queue(c, w);
    case JD_W_JOB_CRASHES:
        return apply_crashes(c, w);
    case JD_W_JOB_DELETE:
        return apply_job_delete(c, w);
    case JD_W_SCHEDULE_PUT:
    case JD_W_SCHEDULE_CHANGE:
    case JD_W_SCHEDULE_DELETE:
        return apply_schedule(c, w);
    case JD_W_COMMAND_PUT:
    case JD_W_COMMAND_DELETE:
    case JD_W_TASK_PUT:
        return apply_remote(c, w);
    case JD_W_JOB_REQUEST:
        return apply_request(c, w);
    default:
        return w->op == JD_W_SYNC_ ? 0 : JD_EINVAL;
    }
}

bool jd_pgw_record_fault(int rc)
{
    return rc == JD_EEXIST || rc == JD_ENOENT || rc == JD_EINVAL || rc == JD_ECONFLICT ||
           rc == JD_ESTALE;
}
