/*
 * The PostgreSQL writer's statements (storage/pg_write_impl.h): the
 * prepared statements, written to do a record in one round trip where
 * they can (a job insert writes the row, its definition, its first event
 * and its labels in one statement with data-modifying CTEs), running them,
 * and the batch's scratch with its queue count changes.
 *
 * Statements that can fail for a record's own reason are written not to
 * raise (ON CONFLICT DO NOTHING, conditional updates): zero rows says it.
 *
 * queue_counts is kept as the SQLite writer keeps it, by the writer: each
 * (queue, state)'s net change is added once per transaction, into this
 * node's own row (slot = its node id; reads sum the slots); here deletes
 * (DELETE /v1/jobs/{id}, retention) are counted too, since this schema has
 * no triggers.
 *
 * Threading: the writer thread, except jd_pg_write_free (jd_pg_close,
 * after the writer stopped).
 */
#include "storage/pg_write_impl.h"

#include "common/alloc.h"
#include "common/error.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OID_INT8 20
#define OID_TEXT 25
#define OID_INT8_ARRAY 1016
#define OID_TEXT_ARRAY 1009
#define OID_BOOL_ARRAY 1000

/* Deleting jobs j (id, idempotency_key, queue, state) with everything of
 * theirs: the tail of a data-modifying WITH. */
#define DELETE_TAIL                                                                                \
    ", e AS (DELETE FROM events WHERE job_id IN (SELECT id FROM j))"                               \
    ", d AS (DELETE FROM job_definitions WHERE job_id IN (SELECT id FROM j))"                      \
    ", t AS (DELETE FROM tasks WHERE job_id IN (SELECT id FROM j))"                                \
    ", l AS (DELETE FROM job_labels WHERE job_id IN (SELECT id FROM j))"                           \
    ", u AS (DELETE FROM unique_keys WHERE job_id IN (SELECT id FROM j))"                          \
    ", i AS (DELETE FROM idempotency WHERE (key, job_id) IN"                                       \
    " (SELECT idempotency_key, id FROM j WHERE idempotency_key IS NOT NULL))"                      \
    ", r AS (DELETE FROM job_requests WHERE job_id IN (SELECT id FROM j))"

/* A job's insert: the row (owned by this node, $11), its definition, its
 * first event ("state", seq 1, at $13 with data $14). */
#define JOB_INSERT_HEAD                                                                            \
    "WITH j AS (INSERT INTO jobs(id, queue, priority, state, run_at_ms, attempts, version,"        \
    " created_ms, updated_ms, started_ms, finished_ms, idempotency_key, schedule_id, handler,"     \
    " owner_node) VALUES ($1, $2, $3, $4, $5, 0, 1, $6, $6, 0, $7, $8, $9, $10, " NODE_ALIVE(      \
        "$11") "))"                                                                                \
               ", d AS (INSERT INTO job_definitions(job_id, definition) VALUES ($1, $12))"         \
               ", e AS (INSERT INTO events(job_id, seq, time_ms, kind, tag, data)"                 \
               " VALUES ($1, 1, $13, 0, 0, $14))"

static const struct {
    const char *sql;
    const char *types; /* one letter per parameter: i bigint, t text, I bigint[], T text[] */
} pstmt[PS_N] = {
    [PS_IDEM_INSERT] = {"INSERT INTO idempotency(key, job_id, fingerprint, created_ms)"
                        " VALUES ($1, $2, $3, $4) ON CONFLICT(key) DO NOTHING RETURNING 1",
                        "titi"},
    [PS_IDEM_GET] = {"SELECT job_id FROM idempotency WHERE key = $1", "t"},
    /* Take the key unless a live hold has it (as in writer.c). */
    [PS_UNIQUE_TAKE] = {"INSERT INTO unique_keys(key, job_id, expires_ms) VALUES ($1, $2, $3)"
                        " ON CONFLICT(key) DO UPDATE SET job_id = excluded.job_id,"
                        " expires_ms = excluded.expires_ms"
                        " WHERE (unique_keys.expires_ms > 0 AND unique_keys.expires_ms <= $4)"
                        " OR NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = unique_keys.job_id"
                        " AND jobs.state < 3) RETURNING 1",
                        "tiii"},
    [PS_UNIQUE_HOLDER] = {"SELECT job_id FROM unique_keys WHERE key = $1", "t"},
    [PS_UNIQUE_RELEASE] = {"DELETE FROM unique_keys WHERE job_id = $1", "i"},
    [PS_JOB_INSERT] = {JOB_INSERT_HEAD " SELECT 1", "itiiiiitttitit"},
    /* ... and one job_labels row per string member of its "labels" */
    [PS_JOB_INSERT_LABELS] = {JOB_INSERT_HEAD
                              ", l AS (INSERT INTO job_labels(key, value, job_id)"
                              " SELECT x.k, x.v #>> '{}', $1"
                              " FROM (SELECT $12::jsonb -> 'labels' AS ls) AS d,"
                              " jsonb_each(CASE WHEN jsonb_typeof(d.ls) = 'object' THEN d.ls"
                              " ELSE '{}'::jsonb END) AS x(k, v)"
                              " WHERE jsonb_typeof(x.v) = 'string' ON CONFLICT DO NOTHING)"
                              " SELECT 1",
                              "itiiiiitttitit"},
    [PS_JOB_OWNER] = {"SELECT owner_node FROM jobs WHERE id = $1", "i"},
    [PS_CRASHES] = {"UPDATE jobs SET crashes = $2 WHERE id = $1 AND owner_node = $3" LEASE_VALID(
                        "$3") " RETURNING 1",
                    "iii"},
    [PS_QUEUE_UPSERT] = {"INSERT INTO queues(name, paused) VALUES ($1, $2)"
                         " ON CONFLICT(name) DO UPDATE SET paused = excluded.paused",
                         "ti"},
    [PS_QUEUE_CONFIG] = {"INSERT INTO queues(name, paused, config, retain_succeeded_ms,"
                         " retain_failed_ms, retain_cancelled_ms) VALUES ($1, 0, $2, $3, $4, $5)"
                         " ON CONFLICT(name) DO UPDATE SET config = excluded.config,"
                         " retain_succeeded_ms = excluded.retain_succeeded_ms,"
                         " retain_failed_ms = excluded.retain_failed_ms,"
                         " retain_cancelled_ms = excluded.retain_cancelled_ms",
                         "ttiii"},
    [PS_SCHED_UPSERT] = {"INSERT INTO schedules(id, definition, paused, retired, next_fire_ms,"
                         " anchor_ms, created_ms, updated_ms) VALUES ($1, $2, $3, $7, $4, $6, $5,"
                         " $5) ON CONFLICT(id) DO UPDATE SET definition = excluded.definition,"
                         " paused = excluded.paused, retired = excluded.retired,"
                         " next_fire_ms = excluded.next_fire_ms, anchor_ms = excluded.anchor_ms,"
                         " updated_ms = excluded.updated_ms",
                         "ttiiiii"},
    /* A schedule change in one statement: every combination of JD_SSET_*
     * ($3 is the mask), its event if any ($13: the kind, NULL for none;
     * seq = the new event_seq) and, every $18th event, trimming its history
     * to the newest $17. */
    [PS_SCHED_CHANGE] = {"WITH u AS (UPDATE schedules SET"
                         " paused = CASE WHEN ($3 & 1) <> 0 THEN $4 ELSE paused END,"
                         " retired = CASE WHEN ($3 & 2) <> 0 THEN $5 ELSE retired END,"
                         " next_fire_ms = CASE WHEN ($3 & 4) <> 0 THEN $6 ELSE next_fire_ms END,"
                         " last_fire_ms = CASE WHEN ($3 & 8) <> 0 THEN $7 ELSE last_fire_ms END,"
                         " last_job_id = CASE WHEN ($3 & 8) <> 0 THEN $8 ELSE last_job_id END,"
                         " last_outcome = CASE WHEN ($3 & 8) <> 0 THEN $9 ELSE last_outcome END,"
                         " fires = fires + $10, skips = skips + $11,"
                         " event_seq = event_seq + $12, updated_ms = $2"
                         " WHERE id = $1 AND ($19 = 0 OR next_fire_ms = $19) RETURNING event_seq),"
                         " e AS (INSERT INTO schedule_events(schedule_id, seq, time_ms, kind,"
                         " fire_ms, job_id, data) SELECT $1, event_seq, $2, $13, $14, $15, $16"
                         " FROM u WHERE $13 IS NOT NULL),"
                         " t AS (DELETE FROM schedule_events WHERE schedule_id = $1"
                         " AND $13 IS NOT NULL AND seq <= (SELECT event_seq FROM u) - $17"
                         " AND (SELECT event_seq FROM u) % $18 = 0)"
                         " SELECT event_seq FROM u",
                         "tiiiiiiitiiitiitiii"},
    [PS_SCHED_DELETE] = {"WITH s AS (DELETE FROM schedules WHERE id = $1 RETURNING id),"
                         " e AS (DELETE FROM schedule_events WHERE schedule_id IN"
                         " (SELECT id FROM s)) SELECT 1 FROM s",
                         "t"},
    /* only a terminal job: a retry racing the delete wins or loses whole */
    [PS_JOB_DELETE] = {"WITH j AS (DELETE FROM jobs WHERE id = $1 AND state >= 3"
                       " RETURNING id, idempotency_key, queue, state)" DELETE_TAIL
                       " SELECT queue, state FROM j",
                       "i"},
    [PS_JOB_STATE] = {"SELECT state FROM jobs WHERE id = $1", "i"},
    [PS_RCMD_UPSERT] = {"INSERT INTO remote_commands(name, timeout_ms, description, created_ms,"
                        " updated_ms, max_in_flight) VALUES ($1, $2, $3, $4, $4, $5)"
                        " ON CONFLICT(name) DO UPDATE SET timeout_ms = excluded.timeout_ms,"
                        " description = excluded.description, updated_ms = excluded.updated_ms,"
                        " max_in_flight = excluded.max_in_flight",
                        "titii"},
    [PS_RCMD_DELETE] = {"DELETE FROM remote_commands WHERE name = $1 RETURNING 1", "t"},
    [PS_TASK_UPSERT] = {"INSERT INTO tasks(id, job_id, tag, attempt, command, state, worker,"
                        " lease_expires_ms, updated_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8,"
                        " $9) ON CONFLICT(id) DO UPDATE SET state = excluded.state,"
                        " worker = excluded.worker,"
                        " lease_expires_ms = excluded.lease_expires_ms,"
                        " updated_ms = excluded.updated_ms",
                        "tiiititii"},
    /* The transaction's queue count changes, one element per (queue,
     * state), into this node's own rows ($4: the slot), so nodes never
     * wait on one another's count rows; reads sum the slots. Sent in the
     * COMMIT's pipeline, so the rows are locked only while it flushes. */
    [PS_COUNT_ADD] =
        {"INSERT INTO queue_counts(queue, state, slot, n) SELECT x.q, x.st, $4, x.d"
         " FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS x(q, st, d)"
         " ON CONFLICT(queue, state, slot) DO UPDATE SET n = queue_counts.n + excluded.n",
         "TIIi"},
    /* every (queue, terminal state) that has jobs, with the queue's own
     * retention for that state (0: the global one) */
    [PS_RET_QUEUES] = {"SELECT c.queue, c.state, coalesce(CASE c.state"
                       " WHEN 3 THEN q.retain_succeeded_ms WHEN 4 THEN q.retain_failed_ms"
                       " ELSE q.retain_cancelled_ms END, 0)"
                       " FROM (SELECT queue, state FROM queue_counts WHERE state >= 3"
                       " GROUP BY queue, state HAVING sum(n) > 0) c"
                       " LEFT JOIN queues q ON q.name = c.queue",
                       ""},
    /* up to $4 jobs of (queue $1, state $2) finished before $3, counted
     * out of queue_counts in the same statement */
    [PS_RET_DELETE] =
        {"WITH j AS (DELETE FROM jobs WHERE id IN (SELECT id FROM jobs"
         " WHERE queue = $1 AND state = $2 AND state >= 3 AND finished_ms < $3"
         " LIMIT $4) RETURNING id, idempotency_key, queue, state)" DELETE_TAIL
         ", c AS (INSERT INTO queue_counts(queue, state, slot, n)"
         " SELECT $1, $2, $5, -count(*) FROM j"
         " ON CONFLICT(queue, state, slot) DO UPDATE SET n = queue_counts.n + excluded.n)"
         " SELECT count(*) FROM j",
         "tiiii"},
    /* The job inserts of a pipelined batch in one statement (arrays, one
     * element per job; $13 this node, $14 now): rows, definitions, first
     * events and labels, as PS_JOB_INSERT_LABELS does one by one. $15 is
     * each job's "labels" member as the writer found it in the definition
     * (NULL: none), so PostgreSQL parses only that; or, where $16 is true,
     * the whole definition (it did not scan). Where $17 is true the job is
     * inserted with no owner (jd_write.unowned: the queued-job window). */
    [PS_JOB_INSERTS] =
        {"WITH v AS (SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[],"
         " $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::text[],"
         " $9::text[], $10::text[], $11::text[], $12::text[], $15::text[],"
         " $16::bool[], $17::bool[]) AS v(id, queue, priority, state, run_at_ms,"
         " created_ms, finished_ms, idem, schedule_id, handler, definition, data,"
         " lbl, lwhole, unowned)),"
         " j AS (INSERT INTO jobs(id, queue, priority, state, run_at_ms, attempts,"
         " version, created_ms, updated_ms, started_ms, finished_ms,"
         " idempotency_key, schedule_id, handler, owner_node)"
         " SELECT id, queue, priority, state, run_at_ms, 0, 1, created_ms,"
         " created_ms, 0, finished_ms, idem, schedule_id, handler,"
         " CASE WHEN v.unowned THEN NULL ELSE " NODE_ALIVE(
             "$13") " END FROM v),"
                    " d AS (INSERT INTO job_definitions(job_id, definition)"
                    " SELECT id, definition FROM v),"
                    " e AS (INSERT INTO events(job_id, seq, time_ms, kind, tag, data)"
                    " SELECT id, 1, $14, 0, 0, data FROM v),"
                    " l AS (INSERT INTO job_labels(key, value, job_id)"
                    " SELECT x.k, x.v #>> '{}', v.id FROM v,"
                    " LATERAL (SELECT CASE WHEN v.lwhole THEN v.lbl::jsonb -> 'labels'"
                    " ELSE v.lbl::jsonb END AS ls) AS d,"
                    " jsonb_each(CASE WHEN jsonb_typeof(d.ls) = 'object' THEN d.ls"
                    " ELSE '{}'::jsonb END) AS x(k, v)"
                    " WHERE jsonb_typeof(x.v) = 'string' ON CONFLICT DO NOTHING)"
                    " SELECT count(*) FROM v",
         "ITIIIIITTTTTiiTBB"},
    /* The job changes of a pipelined batch in one statement (see
     * pg_write_pipe.c): per events row ($1-$4 and $18-$19, in batch
     * order) a run of a job's events (store_impl.h: the first's kind, tag
     * and data, the rest packed in $18, $19 the first's rank); per
     * job ($7-$17) its records folded into one update: $8 records, $9 the
     * JD_SET_* fields any of them set, each with the last value set, and
     * $17 what happens to finished_ms (0 kept, 1 stamped now if still 0, 2
     * set). The version goes up by the job's number of records (fenced on
     * $6, this node) and each event's seq is the old version plus its rank
     * among the job's records ($5: now). Returns each job's old version,
     * queue, old and new state; a job missing from the answer was missing
     * or fenced. The old state is a plain read of the statement's
     * snapshot (it does not see the UPDATE), as in a single change.
     * The rows are found from c, one primary-key probe per job: no
     * `j.id = ANY($7)` beside the join, which on a new database (the
     * generic plan costed on a nearly empty jobs) made the plan scan the
     * jobs by that list and rescan c for each, n * n rows. */
    [PS_JOB_CHANGES] =
        {"WITH v AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[],"
         " $4::text[], $18::text[], $19::bigint[]) WITH ORDINALITY"
         " AS v(job_id, kind, tag, data, more, off, ord)),"
         " c AS (SELECT * FROM unnest($7::bigint[], $8::bigint[], $9::bigint[],"
         " $10::bigint[], $11::text[], $12::text[], $13::bigint[], $14::bigint[],"
         " $15::bigint[], $16::bigint[], $17::bigint[]) AS c(id, k, m, state, output,"
         " error, run_at_ms, attempts, started_ms, finished_ms, fm)),"
         " u AS (UPDATE jobs j SET version = j.version + c.k, updated_ms = $5,"
         " state = CASE WHEN (c.m & 1) <> 0 THEN c.state ELSE j.state END,"
         " output = CASE WHEN (c.m & 2) <> 0 THEN c.output ELSE j.output END,"
         " error = CASE WHEN (c.m & 4) <> 0 THEN c.error ELSE j.error END,"
         " run_at_ms = CASE WHEN (c.m & 8) <> 0 THEN c.run_at_ms ELSE j.run_at_ms END,"
         " attempts = CASE WHEN (c.m & 16) <> 0 THEN c.attempts ELSE j.attempts END,"
         " started_ms = CASE WHEN (c.m & 32) <> 0 THEN c.started_ms ELSE j.started_ms END,"
         " finished_ms = CASE c.fm WHEN 2 THEN c.finished_ms WHEN 1 THEN"
         " CASE WHEN j.finished_ms = 0 THEN $5 ELSE j.finished_ms END"
         " ELSE j.finished_ms END"
         " FROM c WHERE j.id = c.id AND j.owner_node = $6" LEASE_VALID(
             "$6") " RETURNING j.id, j.version - c.k AS base, j.queue, j.state),"
                   " e AS (INSERT INTO events(job_id, seq, time_ms, kind, tag, data, more)"
                   " SELECT v.job_id, u.base + v.off, $5, v.kind, v.tag, v.data, v.more"
                   " FROM v JOIN u ON u.id = v.job_id ORDER BY v.ord)"
                   " SELECT u.id, u.base, u.queue, (SELECT state FROM jobs WHERE id = u.id), "
                   "u.state"
                   " FROM u",
         "IIITiiIIIITTIIIIITI"},
    /* An inbox request (unfenced): one row always; state NULL: no such
     * job; id NULL: the job is terminal. */
    [PS_REQUEST] = {"WITH j AS (SELECT state FROM jobs WHERE id = $1),"
                    " i AS (INSERT INTO job_requests(job_id, kind, data, created_ms)"
                    " SELECT $1, $2, $3, $4 FROM j WHERE state < 3 RETURNING id)"
                    " SELECT (SELECT state FROM j), (SELECT id FROM i)",
                    "iiti"},
    /* the owner recording request $1 for job $2: once only */
    [PS_REQUEST_TAKE] = {"DELETE FROM job_requests WHERE id = $1 AND job_id = $2 RETURNING 1",
                         "ii"},
    [PS_SCHED_EXISTS] = {"SELECT 1 FROM schedules WHERE id = $1", "t"},
    [PS_JOB_VERSION] = {"SELECT version FROM jobs WHERE id = $1", "i"},
    /* The COMMIT pipeline's horizon and notice (jd_pgw_commit), prepared
     * like the rest: sent unnamed, each was parsed, analysed and planned
     * again in every batch. */
    [PS_HZ_NEXT] = {HZ_NEXT_SQL, "i"},
    /* $1 the whole notice, $2 the part that goes whether or not a node
     * watches ("r", "s"; may be empty); pg.h, JD_PG_WATCH_LOCK_SQL */
    [PS_NOTIFY] = {"SELECT pg_notify('" JD_PG_NOTIFY_CHANNEL "', p) FROM (SELECT CASE WHEN"
                   " EXISTS (SELECT 1 FROM jd_watchers) THEN $1 ELSE $2 END AS p) n"
                   " WHERE p <> ''",
                   "tt"},
    [PS_WATCH_SHARED] = {"SELECT pg_advisory_xact_lock_shared(" JD_PG_WATCH_LOCK_SQL ")", ""},
};

const char *jd_pg_test_changes_sql(const char **types)
{
    static char names[JD_PG_MAX_PARAMS * 10];
    size_t len = 0;
    for (const char *t = pstmt[PS_JOB_CHANGES].types; *t; t++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", len ? "," : "",
                                *t == 'i'   ? "bigint"
                                : *t == 't' ? "text"
                                : *t == 'I' ? "bigint[]"
                                : *t == 'T' ? "text[]"
                                            : "boolean[]");
    *types = names;
    return pstmt[PS_JOB_CHANGES].sql;
}

int jd_pgw_rc(const PGresult *r)
{
    const char *st = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    if (jd_pg_rc(r) == 0 || !st)
        return jd_pg_rc(r);
    if (strcmp(st, "23505") == 0)
        return JD_EEXIST; /* unique_violation */
    if (strncmp(st, "23", 2) == 0 || strncmp(st, "22", 2) == 0 || strncmp(st, "54", 2) == 0)
        return JD_EINVAL; /* other constraints, bad data (encoding, JSON), too big */
    return jd_pg_rc(r);
}

void jd_pgw_oids(const char *types, Oid *oids, int *n)
{
    *n = (int)strlen(types);
    for (int i = 0; i < *n; i++)
        oids[i] = types[i] == 't'   ? OID_TEXT
                  : types[i] == 'I' ? OID_INT8_ARRAY
                  : types[i] == 'T' ? OID_TEXT_ARRAY
                  : types[i] == 'B' ? OID_BOOL_ARRAY
                                    : OID_INT8;
}

struct jd_pg_wscratch *jd_pgw_scratch(struct jd_pg *pg)
{
    if (!pg->scratch)
        pg->scratch = jd_xcalloc(1, sizeof *pg->scratch);
    return pg->scratch;
}

void jd_pgw_counts_clear(struct jd_pg_wscratch *w)
{
    for (size_t i = 0; i < w->nq; i++)
        free(w->q[i].queue);
    w->nq = 0;
}

void jd_pgw_count(struct jd_pg_wscratch *w, const char *queue, int state, int64_t d)
{
    if (!queue || state < 0 || state >= JD_JOB_NSTATES)
        return;
    size_t i = 0;
    while (i < w->nq && strcmp(w->q[i].queue, queue) != 0)
        i++;
    if (i == w->nq) {
        if (w->nq == w->capq) {
            w->capq = w->capq ? 2 * w->capq : 8;
            w->q = jd_xrealloc(w->q, w->capq * sizeof *w->q);
        }
        w->q[i] = (struct jd_pgw_qdelta){.queue = jd_xstrdup(queue)};
        w->nq++;
    }
    w->q[i].d[state] += d;
}

/* Remember the counts as they are (a savepoint). */
void jd_pgw_counts_mark(struct jd_pg_wscratch *w)
{
    size_t need = w->nq * JD_JOB_NSTATES;
    if (need > w->capsaved) {
        w->capsaved = need * 2;
        w->saved = jd_xrealloc(w->saved, w->capsaved * sizeof *w->saved);
    }
    for (size_t i = 0; i < w->nq; i++)
        memcpy(&w->saved[i * JD_JOB_NSTATES], w->q[i].d, sizeof w->q[i].d);
    w->nsaved = w->nq;
}

/* Back to the mark (a rollback to the savepoint). */
void jd_pgw_counts_restore(struct jd_pg_wscratch *w)
{
    while (w->nq > w->nsaved)
        free(w->q[--w->nq].queue);
    for (size_t i = 0; i < w->nq; i++)
        memcpy(w->q[i].d, &w->saved[i * JD_JOB_NSTATES], sizeof w->q[i].d);
}

void jd_pg_write_free(struct jd_pg *pg)
{
    PQfinish(pg->hzconn);
    pg->hzconn = NULL;
    struct jd_pg_wscratch *w = pg->scratch;
    if (!w)
        return;
    jd_pgw_counts_clear(w);
    free(w->q);
    free(w->saved);
    free(w->ids);
    free(w->pq);
    for (size_t i = 0; i < sizeof w->arr / sizeof w->arr[0]; i++)
        free(w->arr[i].p);
    for (size_t i = 0; i < w->capevr; i++)
        free(w->evr[i].more.p);
    free(w->evr);
    free(w->jt);
    free(w->grp);
    free(w->rank);
    free(w);
    pg->scratch = NULL;
}

/* ---- running statements ---- */

void jd_pgw_log_failure(struct jd_store *s, const char *what)
{
    static _Thread_local char last[256];
    char msg[256];
    snprintf(msg, sizeof msg, "%s: %s", what, PQerrorMessage(s->pg->wconn));
    msg[strcspn(msg, "\n")] = '\0';
    if (strcmp(msg, last) == 0)
        return;
    snprintf(last, sizeof last, "%s", msg);
    jd_log(JD_LOG_ERROR, "storage commit failed", "db", s->pg->display, "error", msg, NULL);
}

int jd_pgw_exec(struct jd_store *s, const char *sql)
{
    PGresult *r = PQexec(s->pg->wconn, sql);
    int rc = jd_pg_rc(r);
    PQclear(r);
    return rc;
}

static char stmt_name_buf[PS_N][8];

const char *jd_pgw_stmt(int i)
{
    return stmt_name_buf[i];
}

int jd_pgw_prepare(struct jd_store *s)
{
    struct jd_pg *pg = s->pg;
    if (jd_pgw_exec(s, "DEALLOCATE ALL") != 0) { /* a half-prepared session from a failed try */
        jd_pgw_log_failure(s, "preparing statements");
        return JD_EIO;
    }
    /* A node stalled inside a batch (SIGSTOP, a VM pause) holds row locks
     * every other node's writes and takeovers wait on (jobs, queue_counts):
     * PostgreSQL ends its transaction after about a lease (its writes are
     * fenced by then anyway; the batch is redone on a new connection). */
    char set[96];
    snprintf(set, sizeof set, "SET idle_in_transaction_session_timeout = %lld",
             (long long)jd_pg_idle_tx_ms(pg));
    if (jd_pgw_exec(s, set) != 0) {
        jd_pgw_log_failure(s, "session settings");
        return JD_EIO;
    }
    /* Every writer statement finds its rows by key (a job id, a queue's
     * count row, a node), yet its plan is the generic one PostgreSQL caches
     * from the sixth run on, costed with the statistics of that moment: on
     * a new database the jobs table is nearly empty then, so the grouped
     * changes (PS_JOB_CHANGES) scanned the whole table in every batch, a
     * cost growing with the table, until autovacuum's next ANALYZE of jobs
     * (a minute or more) had the plan made again. No writer statement
     * wants a sequential scan where an index serves. */
    if (jd_pgw_exec(s, "SET enable_seqscan = off") != 0) {
        jd_pgw_log_failure(s, "session settings");
        return JD_EIO;
    }
    for (int i = 0; i < PS_N; i++) {
        snprintf(stmt_name_buf[i], sizeof stmt_name_buf[i], "w%d", i);
        Oid oids[JD_PG_MAX_PARAMS];
        int n;
        jd_pgw_oids(pstmt[i].types, oids, &n);
        PGresult *r = PQprepare(pg->wconn, jd_pgw_stmt(i), pstmt[i].sql, n, oids);
        int rc = jd_pg_rc(r);
        PQclear(r);
        if (rc) {
            jd_pgw_log_failure(s, "preparing a statement");
            return JD_EIO;
        }
    }
    memset(pg->upd_prepared, 0, sizeof pg->upd_prepared);
    pg->wprepared = true;
    return 0;
}

/* Run prepared statement name at once (sequential follow-ups only); *res
 * (caller clears) or NULL. The JD_E* code. */
int jd_pgw_xq(struct jd_store *s, const char *name, const struct jd_pgw_prm *p, PGresult **res)
{
    PGresult *r = PQexecPrepared(s->pg->wconn, name, p->n, p->v, NULL, NULL, 0);
    int rc = jd_pgw_rc(r);
    if (rc || !res)
        PQclear(r);
    else
        *res = r;
    return rc;
}

/* The first column of the first row as an integer (*found false: no row). */
int jd_pgw_xint(struct jd_store *s, int i, const struct jd_pgw_prm *p, int64_t *out, bool *found)
{
    PGresult *r = NULL;
    int rc = jd_pgw_xq(s, jd_pgw_stmt(i), p, &r);
    if (rc == 0) {
        *found = PQntuples(r) > 0;
        if (*found && !PQgetisnull(r, 0, 0))
            *out = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
    }
    return rc;
}
