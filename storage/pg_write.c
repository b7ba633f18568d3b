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
 * Statements are prepared once per session (again after a reconnect) and
 * written to do a record in one round trip where they can: a job insert
 * writes the row, its definition, its first event and its labels in one
 * statement (data-modifying CTEs); a job change bumps the version, sets
 * its fields and appends its event (seq = the new version) in one.
 * Statements that can fail for a record's own reason are written not to
 * raise (ON CONFLICT DO NOTHING, conditional updates): zero rows says it.
 *
 * The fence: a job change or crash count is applied only
 * WHERE id = $1 AND owner_node = <this node incarnation>. Zero rows for a
 * job that exists means another incarnation owns it: the record fails with
 * JD_ESTALE (final, never retried), is logged and counted (jd_pg.st_fenced).
 *
 * queue_counts is kept as the SQLite writer keeps it, by the writer: each
 * (queue, state)'s net change is added once per transaction, into this
 * node's own row (slot = its node id; reads sum the slots); here deletes
 * (DELETE /v1/jobs/{id}, retention) are counted too, since this schema has
 * no triggers.
 *
 * Threading: everything here runs on the writer thread, except
 * jd_pg_write_free (jd_pg_close, after the writer stopped).
 */
#include "storage/pg.h"
#include "storage/store_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define JD_PG_RETENTION_BATCH 128 /* jobs per retention transaction, as for SQLite */
#define JD_PG_SCHED_TRIM_EVERY 64 /* trim a schedule's history once per this many events */

#define OID_INT8 20
#define OID_TEXT 25
#define OID_INT8_ARRAY 1016
#define OID_TEXT_ARRAY 1009
#define OID_BOOL_ARRAY 1000

/* ---- statements ---- */

enum {
    PS_IDEM_INSERT,
    PS_IDEM_GET,
    PS_UNIQUE_TAKE,
    PS_UNIQUE_HOLDER,
    PS_UNIQUE_RELEASE,
    PS_JOB_INSERT,
    PS_JOB_INSERT_LABELS,
    PS_JOB_OWNER,
    PS_CRASHES,
    PS_QUEUE_UPSERT,
    PS_QUEUE_CONFIG,
    PS_SCHED_UPSERT,
    PS_SCHED_CHANGE,
    PS_SCHED_DELETE,
    PS_JOB_DELETE,
    PS_JOB_STATE,
    PS_RCMD_UPSERT,
    PS_RCMD_DELETE,
    PS_TASK_UPSERT,
    PS_COUNT_ADD,
    PS_RET_QUEUES,
    PS_RET_DELETE,
    PS_JOB_INSERTS,
    PS_REQUEST,
    PS_REQUEST_TAKE,
    PS_SCHED_EXISTS,
    PS_JOB_APPENDS,
    PS_N
};

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

/* This node ($n) if its lease is valid, else NULL: a job inserted by a
 * node that lost its lease is nobody's, so another node claims it. */
#define NODE_ALIVE(n) "(SELECT id FROM jd_nodes WHERE id = " n " AND expires_at > now())"
/* The fence's second half: this node's lease is valid (database clock). */
#define LEASE_VALID(n)                                                                             \
    " AND EXISTS (SELECT 1 FROM jd_nodes WHERE id = " n " AND expires_at > now())"

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
    /* into this node's own row ($4: the slot), so nodes never wait on one
     * another's count rows; reads sum the slots */
    [PS_COUNT_ADD] =
        {"INSERT INTO queue_counts(queue, state, slot, n) VALUES ($1, $2, $4, $3)"
         " ON CONFLICT(queue, state, slot) DO UPDATE SET n = queue_counts.n + excluded.n",
         "tiii"},
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
    /* History appends (changes that set no field) of a pipelined batch in
     * one statement: per job, the version goes up by its number of appends
     * (fenced on $6, this node), and each event's seq is the old version
     * plus its rank among the job's appends, in batch order ($5: now).
     * Returns each job's old version; a job missing from the answer was
     * missing or fenced. */
    [PS_JOB_APPENDS] =
        {"WITH v AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[],"
         " $4::text[]) WITH ORDINALITY AS v(job_id, kind, tag, data, ord)),"
         " c AS (SELECT job_id, count(*) AS k FROM v GROUP BY job_id),"
         " u AS (UPDATE jobs j SET version = j.version + c.k, updated_ms = $5"
         " FROM c WHERE j.id = c.job_id AND j.owner_node = $6" LEASE_VALID(
             "$6") " RETURNING j.id, j.version - c.k AS base),"
                   " e AS (INSERT INTO events(job_id, seq, time_ms, kind, tag, data)"
                   " SELECT v.job_id, u.base + row_number() OVER (PARTITION BY v.job_id"
                   " ORDER BY v.ord), $5, v.kind, v.tag, v.data FROM v JOIN u"
                   " ON u.id = v.job_id ORDER BY v.ord)"
                   " SELECT id, base FROM u",
         "IIITii"},
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
};

/* A statement's result as a JD_E* code, telling a record's own fault
 * (bad data: JD_EINVAL; a duplicate: JD_EEXIST) from the transaction's. */
static int wrc(const PGresult *r)
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

/* Parameters in text format; NULL is SQL NULL. */
#define JD_PG_MAX_PARAMS 20 /* the most any statement here takes (18: a schedule change) */
struct prm {
    int n;
    const char *v[JD_PG_MAX_PARAMS];
    char b[JD_PG_MAX_PARAMS][24];
};

static void p_int(struct prm *p, int64_t x)
{
    if (p->n >= JD_PG_MAX_PARAMS)
        abort(); /* a statement here with more parameters than JD_PG_MAX_PARAMS: a bug */
    snprintf(p->b[p->n], sizeof p->b[p->n], "%lld", (long long)x);
    p->v[p->n] = p->b[p->n];
    p->n++;
}

static void p_text(struct prm *p, const char *s)
{
    if (p->n >= JD_PG_MAX_PARAMS)
        abort(); /* as in p_int */
    p->v[p->n++] = s;
}

static void set_oids(const char *types, Oid *oids, int *n)
{
    *n = (int)strlen(types);
    for (int i = 0; i < *n; i++)
        oids[i] = types[i] == 't'   ? OID_TEXT
                  : types[i] == 'I' ? OID_INT8_ARRAY
                  : types[i] == 'T' ? OID_TEXT_ARRAY
                  : types[i] == 'B' ? OID_BOOL_ARRAY
                                    : OID_INT8;
}

/* ---- the batch's scratch: queue count changes and saved job ids ---- */

/* What a statement's result must show for its record to have applied. */
enum {
    RK_ANY,     /* nothing to check */
    RK_ROW,     /* at least one row (RETURNING, a found row) */
    RK_INSERT,  /* a job insert: version 1, counted in */
    RK_CHANGE,  /* a job change's row: version, queue, old and new state */
    RK_DELETE,  /* a job delete's row: queue and state, counted out */
    RK_INSERTS, /* the batch's hoisted job inserts (w: the first; see apply_pipelined) */
    RK_REQUEST, /* an inbox request: (job state, request id), NULLs say why not */
    RK_APPENDS, /* the batch's grouped history appends (w: the first; see emit_appends) */
};
#define NOROW 1 /* a statement that had to touch a row touched none */

/* An array literal being built ("{1,2}", "{\"a\",NULL}"). */
struct abuf {
    char *p;
    size_t len, cap;
};

struct pend {
    struct jd_write *w; /* NULL: the BEGIN */
    int kind;
};

struct qdelta {
    char *queue;
    int64_t d[JD_JOB_NSTATES];
};

struct jd_pg_wscratch {
    struct qdelta *q; /* distinct queues changed in this transaction */
    size_t nq, capq;
    int64_t *saved; /* per (queue, state): the deltas at the savepoint */
    size_t nsaved, capsaved;
    int64_t *ids; /* each record's job_id before the optimistic pass */
    size_t capids;
    struct pend *pq; /* statements sent in the pipeline, results not yet read */
    size_t npq, cappq;
    struct abuf arr[15]; /* PS_JOB_INSERTS's array parameters, reused */
    /* emit_appends: per job of the batch (open addressing on id), and per
     * record whether it went in the grouped statement and its rank there */
    struct jslot *jt;
    size_t jcap;
    unsigned char *grp;
    int64_t *rank;
    size_t capgrp;
};

struct jslot {
    int64_t id; /* 0: empty */
    bool busy;  /* the batch has a record for it other than an append or its insert */
    bool found; /* the grouped statement returned its row */
    int64_t appends, base;
};

static struct jd_pg_wscratch *scratch(struct jd_pg *pg)
{
    if (!pg->scratch)
        pg->scratch = jd_xcalloc(1, sizeof *pg->scratch);
    return pg->scratch;
}

static void counts_clear(struct jd_pg_wscratch *w)
{
    for (size_t i = 0; i < w->nq; i++)
        free(w->q[i].queue);
    w->nq = 0;
}

static void count(struct jd_pg_wscratch *w, const char *queue, int state, int64_t d)
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
        w->q[i] = (struct qdelta){.queue = jd_xstrdup(queue)};
        w->nq++;
    }
    w->q[i].d[state] += d;
}

/* Remember the counts as they are (a savepoint). */
static void counts_mark(struct jd_pg_wscratch *w)
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
static void counts_restore(struct jd_pg_wscratch *w)
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
    counts_clear(w);
    free(w->q);
    free(w->saved);
    free(w->ids);
    free(w->pq);
    for (size_t i = 0; i < sizeof w->arr / sizeof w->arr[0]; i++)
        free(w->arr[i].p);
    free(w->jt);
    free(w->grp);
    free(w->rank);
    free(w);
    pg->scratch = NULL;
}

/* ---- running statements ---- */

/* Log a failure once per distinct message, not once per batch. */
static void log_failure(struct jd_store *s, const char *what)
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

static int simple(struct jd_store *s, const char *sql)
{
    PGresult *r = PQexec(s->pg->wconn, sql);
    int rc = jd_pg_rc(r);
    PQclear(r);
    return rc;
}

static char stmt_name_buf[PS_N][8];

static const char *stmt_name(int i)
{
    return stmt_name_buf[i];
}

/* Prepare every statement on the (new) session. 0 or JD_EIO. */
static int prepare_all(struct jd_store *s)
{
    struct jd_pg *pg = s->pg;
    if (simple(s, "DEALLOCATE ALL") != 0) { /* a half-prepared session from a failed try */
        log_failure(s, "preparing statements");
        return JD_EIO;
    }
    /* A node stalled inside a batch (SIGSTOP, a VM pause) holds row locks
     * every other node's writes and takeovers wait on (jobs, queue_counts):
     * PostgreSQL ends its transaction after about a lease (its writes are
     * fenced by then anyway; the batch is redone on a new connection). */
    char set[96];
    snprintf(set, sizeof set, "SET idle_in_transaction_session_timeout = %lld",
             (long long)jd_pg_idle_tx_ms(pg));
    if (simple(s, set) != 0) {
        log_failure(s, "session settings");
        return JD_EIO;
    }
    for (int i = 0; i < PS_N; i++) {
        snprintf(stmt_name_buf[i], sizeof stmt_name_buf[i], "w%d", i);
        Oid oids[JD_PG_MAX_PARAMS];
        int n;
        set_oids(pstmt[i].types, oids, &n);
        PGresult *r = PQprepare(pg->wconn, stmt_name(i), pstmt[i].sql, n, oids);
        int rc = jd_pg_rc(r);
        PQclear(r);
        if (rc) {
            log_failure(s, "preparing a statement");
            return JD_EIO;
        }
    }
    memset(pg->upd_prepared, 0, sizeof pg->upd_prepared);
    pg->wprepared = true;
    return 0;
}

/* Run prepared statement name at once (sequential follow-ups only); *res
 * (caller clears) or NULL. The JD_E* code. */
static int xq(struct jd_store *s, const char *name, const struct prm *p, PGresult **res)
{
    PGresult *r = PQexecPrepared(s->pg->wconn, name, p->n, p->v, NULL, NULL, 0);
    int rc = wrc(r);
    if (rc || !res)
        PQclear(r);
    else
        *res = r;
    return rc;
}

/* The first column of the first row as an integer (*found false: no row). */
static int xint(struct jd_store *s, int i, const struct prm *p, int64_t *out, bool *found)
{
    PGresult *r = NULL;
    int rc = xq(s, stmt_name(i), p, &r);
    if (rc == 0) {
        *found = PQntuples(r) > 0;
        if (*found && !PQgetisnull(r, 0, 0))
            *out = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
    }
    return rc;
}

/* One batch being applied: sequentially (each statement runs at once; when
 * one touched no row, follow-up reads say why), or pipelined (statements
 * are queued and their results checked when they come back: any record
 * that did not apply sends the batch to the sequential savepoint path). */
struct ctx {
    struct jd_store *s;
    struct jd_pg_wscratch *ws;
    int64_t now;
    bool pipe;
    struct jd_write **b; /* the batch (pipelined) */
    size_t nb;
    bool hoisted; /* pipelined: the batch's job rows went in one statement first
                     (PS_JOB_INSERTS); apply_insert only takes keys */
};

static int take_appends(struct ctx *c, const PGresult *r);

/* Check r against kind for w and apply what it tells (version, counts).
 * 0, NOROW, or the statement's error code. */
static int take(struct ctx *c, struct jd_write *w, int kind, const PGresult *r)
{
    int rc = wrc(r);
    if (rc)
        return rc;
    if (kind == RK_ANY)
        return 0;
    if (kind == RK_INSERT) {
        w->version = 1;
        count(c->ws, w->job->queue, (int)w->job->state, 1);
        return 0;
    }
    if (kind == RK_INSERTS) {
        for (size_t i = 0; i < c->nb; i++)
            if (c->b[i]->op == JD_W_JOB_INSERT) {
                c->b[i]->version = 1;
                count(c->ws, c->b[i]->job->queue, (int)c->b[i]->job->state, 1);
            }
        return 0;
    }
    if (kind == RK_APPENDS)
        return take_appends(c, r);
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
            count(c->ws, PQgetvalue(r, 0, 1), old_state, -1);
            count(c->ws, PQgetvalue(r, 0, 1), new_state, 1);
        }
    } else if (kind == RK_DELETE) {
        count(c->ws, PQgetvalue(r, 0, 0), atoi(PQgetvalue(r, 0, 1)), -1);
    }
    return 0;
}

/* Run (sequential) or queue (pipelined: always 0 unless it cannot be
 * sent) one statement of w. */
static int emit(struct ctx *c, struct jd_write *w, const char *name, const struct prm *p, int kind)
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
        ws->pq[ws->npq++] = (struct pend){.w = w, .kind = kind};
        return 0;
    }
    PGresult *r = PQexecPrepared(conn, name, p->n, p->v, NULL, NULL, 0);
    int rc = take(c, w, kind, r);
    PQclear(r);
    return rc;
}

/* A record that touched zero rows of job id: JD_ENOENT if the job is gone,
 * JD_ESTALE if it exists (another node incarnation owns it: fenced). */
static int missing_or_fenced(struct jd_store *s, int64_t id)
{
    struct prm p = {0};
    p_int(&p, id);
    int64_t owner = 0;
    bool found = false;
    int rc = xint(s, PS_JOB_OWNER, &p, &owner, &found);
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

static int apply_insert(struct ctx *c, struct jd_write *w)
{
    struct jd_store *s = c->s;
    const struct jd_job *j = w->job;
    if (!j || !j->queue || !j->definition || (unsigned)j->state >= JD_JOB_NSTATES)
        return JD_EINVAL;
    int64_t id = j->id ? j->id : w->job_id;
    if (id <= 0)
        return JD_EINVAL;
    w->job_id = id;
    int64_t created = j->created_ms ? j->created_ms : c->now;
    int rc;
    bool found = false;

    if (j->idempotency_key) {
        struct prm p = {0};
        p_text(&p, j->idempotency_key);
        p_int(&p, id);
        p_text(&p, w->idem_fingerprint);
        p_int(&p, created);
        rc = emit(c, w, stmt_name(PS_IDEM_INSERT), &p, RK_ROW);
        if (rc == NOROW) {
            struct prm g = {0};
            p_text(&g, j->idempotency_key);
            if ((rc = xint(s, PS_IDEM_GET, &g, &w->job_id, &found)) != 0)
                return rc;
            return found ? JD_EEXIST : JD_EIO;
        }
        if (rc)
            return rc;
    }
    if (w->unique_key) {
        struct prm p = {0};
        p_text(&p, w->unique_key);
        p_int(&p, id);
        p_int(&p, w->unique_expires_ms);
        p_int(&p, c->now);
        rc = emit(c, w, stmt_name(PS_UNIQUE_TAKE), &p, RK_ROW);
        if (rc == NOROW) {
            struct prm g = {0};
            p_text(&g, w->unique_key);
            if ((rc = xint(s, PS_UNIQUE_HOLDER, &g, &w->job_id, &found)) != 0)
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
    struct prm p = {0};
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
    return emit(c, w, stmt_name(labels ? PS_JOB_INSERT_LABELS : PS_JOB_INSERT), &p, RK_INSERT);
}

/* The job change for one combination of JD_SET_* flags, prepared on first
 * use (never inside a pipeline: the pipelined path prepares its batch's
 * first). Parameters keep fixed numbers (types declared, so unused ones
 * are fine): $1 id, $2 now, $3 this node, $4 state, $5 output, $6 error,
 * $7 run_at, $8 attempts, $9 started, $10 finished, $11 kind, $12 tag,
 * $13 data. Returns version, queue, old state, new state; no row: missing
 * or fenced (a change that moves a terminal job back to queued, a retry,
 * passes the fence and takes the job for this node). A move to a terminal
 * state without an explicit finish time
 * stamps it now, so retention never sees a terminal job with finished_ms 0.
 * The old state (o) is a plain read of the statement's snapshot: all parts
 * of one statement see the row as it was before the UPDATE (FOR UPDATE
 * there would skip the row the UPDATE changed). */
static const char *change_stmt(struct jd_store *s, unsigned set)
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
             " WHERE id = $1 AND %s" LEASE_VALID(
                 "$3") " RETURNING version, queue, state),"
                       " e AS (INSERT INTO events(job_id, seq, time_ms, kind, tag, data)"
                       " SELECT $1, version, $2, $11, $12, $13 FROM u)"
                       " SELECT u.version, u.queue, %s, u.state FROM u%s",
             st ? "(owner_node = $3 OR (state >= 3 AND $4 = 0))" : "owner_node = $3",
             st ? "o.state" : "u.state", st ? ", o" : "");
    Oid oids[13];
    int n;
    set_oids("iiiittiiiiiit", oids, &n);
    PGresult *r = PQprepare(s->pg->wconn, names[set], sql, n, oids);
    int rc = jd_pg_rc(r);
    PQclear(r);
    if (rc) {
        log_failure(s, "preparing a job change");
        return NULL;
    }
    s->pg->upd_prepared[set] = true;
    return names[set];
}

static bool change_valid(const struct jd_write *w)
{
    return w->job_id > 0 && (unsigned)w->kind <= JD_EVK_PROGRESS && w->set < JD_UPDATE_MASKS &&
           (!(w->set & JD_SET_STATE) || (unsigned)w->state < JD_JOB_NSTATES);
}

static int apply_change(struct ctx *c, struct jd_write *w)
{
    if (!change_valid(w))
        return JD_EINVAL;
    if (atomic_load(&c->s->pg->lease_lost))
        return JD_ESTALE;
    const char *name = change_stmt(c->s, w->set);
    if (!name)
        return JD_EIO;
    int rc;
    if (w->request_id > 0) {
        /* gone: another record took it already (the request is recorded once) */
        struct prm t = {0};
        p_int(&t, w->request_id);
        p_int(&t, w->job_id);
        rc = emit(c, w, stmt_name(PS_REQUEST_TAKE), &t, RK_ROW);
        if (rc)
            return rc == NOROW ? JD_ECONFLICT : rc;
    }
    if (w->release_unique) {
        struct prm u = {0};
        p_int(&u, w->job_id);
        if ((rc = emit(c, w, stmt_name(PS_UNIQUE_RELEASE), &u, RK_ANY)) != 0)
            return rc;
    }
    const char *data = w->data;
    char buf[48];
    if (!data && w->kind == JD_EVK_STATE && (w->set & JD_SET_STATE)) {
        snprintf(buf, sizeof buf, "{\"state\":\"%s\"}", jd_job_state_name(w->state));
        data = buf;
    }
    struct prm p = {0};
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
    rc = emit(c, w, name, &p, RK_CHANGE);
    return rc == NOROW ? missing_or_fenced(c->s, w->job_id) : rc;
}

static int apply_queue(struct ctx *c, struct jd_write *w)
{
    if (!w->queue)
        return JD_EINVAL;
    struct prm p = {0};
    p_text(&p, w->queue);
    if (w->op == JD_W_QUEUE) {
        p_int(&p, w->paused ? 1 : 0);
        return emit(c, w, stmt_name(PS_QUEUE_UPSERT), &p, RK_ANY);
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
    return emit(c, w, stmt_name(PS_QUEUE_CONFIG), &p, RK_ANY);
}

/* Update the schedule row as sw says and append its event (if any), in
 * one statement. JD_ENOENT when the schedule does not exist. */
static int apply_schedule_change(struct ctx *c, struct jd_write *w,
                                 const struct jd_schedule_write *sw)
{
    if (!sw->id || sw->set > 15)
        return JD_EINVAL;
    struct prm p = {0};
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
    int rc = emit(c, w, stmt_name(PS_SCHED_CHANGE), &p, RK_ROW);
    if (rc != NOROW)
        return rc;
    if (!sw->expect_next_fire_ms)
        return JD_ENOENT;
    /* a conditional fire that lost the race, or a schedule that is gone */
    struct prm e = {0};
    p_text(&e, sw->id);
    int64_t one = 0;
    bool found = false;
    if ((rc = xint(c->s, PS_SCHED_EXISTS, &e, &one, &found)) != 0)
        return rc;
    return found ? JD_ECONFLICT : JD_ENOENT;
}

static int apply_schedule(struct ctx *c, struct jd_write *w)
{
    const struct jd_schedule_write *sw = &w->sched;
    if (!sw->id)
        return JD_EINVAL;
    if (w->op == JD_W_SCHEDULE_CHANGE)
        return apply_schedule_change(c, w, sw);
    struct prm p = {0};
    p_text(&p, sw->id);
    if (w->op == JD_W_SCHEDULE_DELETE) {
        int rc = emit(c, w, stmt_name(PS_SCHED_DELETE), &p, RK_ROW);
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
    int rc = emit(c, w, stmt_name(PS_SCHED_UPSERT), &p, RK_ANY);
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
static int apply_crashes(struct ctx *c, struct jd_write *w)
{
    if (w->job_id <= 0)
        return JD_EINVAL;
    if (atomic_load(&c->s->pg->lease_lost))
        return JD_ESTALE;
    struct prm p = {0};
    p_int(&p, w->job_id);
    p_int(&p, w->crashes);
    p_int(&p, c->s->pg->node_id);
    int rc = emit(c, w, stmt_name(PS_CRASHES), &p, RK_ROW);
    return rc == NOROW ? missing_or_fenced(c->s, w->job_id) : rc;
}

/* Delete a terminal job and everything of its (any node may: it is
 * finished, nobody owns its future). */
static int apply_job_delete(struct ctx *c, struct jd_write *w)
{
    if (w->job_id <= 0)
        return JD_EINVAL;
    struct prm p = {0};
    p_int(&p, w->job_id);
    int rc = emit(c, w, stmt_name(PS_JOB_DELETE), &p, RK_DELETE);
    if (rc != NOROW)
        return rc;
    int64_t state = 0;
    bool found = false;
    if ((rc = xint(c->s, PS_JOB_STATE, &p, &state, &found)) != 0)
        return rc;
    return found ? JD_ECONFLICT : JD_ENOENT;
}

/* An inbox request (JD_W_JOB_REQUEST): any node may write it. */
static int apply_request(struct ctx *c, struct jd_write *w)
{
    if (w->job_id <= 0 || (w->kind != JD_EVK_MESSAGE && w->kind != JD_EVK_CANCEL))
        return JD_EINVAL;
    struct prm p = {0};
    p_int(&p, w->job_id);
    p_int(&p, w->kind);
    p_text(&p, w->data);
    p_int(&p, c->now);
    return emit(c, w, stmt_name(PS_REQUEST), &p, RK_REQUEST);
}

static int apply_remote(struct ctx *c, struct jd_write *w)
{
    struct prm p = {0};
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
        return emit(c, w, stmt_name(PS_TASK_UPSERT), &p, RK_ANY);
    }
    if (!w->rcmd.name)
        return JD_EINVAL;
    p_text(&p, w->rcmd.name);
    if (w->op == JD_W_COMMAND_DELETE) {
        int rc = emit(c, w, stmt_name(PS_RCMD_DELETE), &p, RK_ROW);
        return rc == NOROW ? JD_ENOENT : rc;
    }
    p_int(&p, w->rcmd.timeout_ms);
    p_text(&p, w->rcmd.description);
    p_int(&p, c->now);
    p_int(&p, w->rcmd.max_in_flight);
    return emit(c, w, stmt_name(PS_RCMD_UPSERT), &p, RK_ANY);
}

static int apply(struct ctx *c, struct jd_write *w)
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

/* A record's own failure (its savepoint is rolled back, the rest commits)
 * rather than the transaction's. */
static bool record_fault(int rc)
{
    return rc == JD_EEXIST || rc == JD_ENOENT || rc == JD_EINVAL || rc == JD_ECONFLICT ||
           rc == JD_ESTALE;
}

/* Add the transaction's queue count changes; 0 or the JD_E* code. */
static int counts_flush(struct ctx *c)
{
    struct jd_pg_wscratch *ws = c->ws;
    for (size_t i = 0; i < ws->nq; i++)
        for (int k = 0; k < JD_JOB_NSTATES; k++) {
            if (ws->q[i].d[k] == 0)
                continue;
            struct prm p = {0};
            p_text(&p, ws->q[i].queue);
            p_int(&p, k);
            p_int(&p, ws->q[i].d[k]);
            p_int(&p, c->s->pg->node_id);
            int rc = xq(c->s, stmt_name(PS_COUNT_ADD), &p, NULL);
            if (rc)
                return rc;
        }
    counts_clear(ws);
    return 0;
}

/* ---- the pipelined fast path ---- */

static void ab_put(struct abuf *a, const char *v, size_t n)
{
    if (a->len + n + 1 > a->cap) {
        a->cap = 2 * (a->len + n + 1) + 256;
        a->p = jd_xrealloc(a->p, a->cap);
    }
    memcpy(a->p + a->len, v, n);
    a->len += n;
    a->p[a->len] = '\0';
}

static void ab_sep(struct abuf *a)
{
    if (a->len > 1) /* past the "{" */
        ab_put(a, ",", 1);
}

static void ab_int(struct abuf *a, int64_t v)
{
    char b[24];
    int n = snprintf(b, sizeof b, "%lld", (long long)v);
    ab_sep(a);
    ab_put(a, b, (size_t)n);
}

/* A text element of n bytes: NULL, or double-quoted with '"' and '\'
 * escaped. */
static void ab_textn(struct abuf *a, const char *v, size_t n)
{
    ab_sep(a);
    if (!v) {
        ab_put(a, "NULL", 4);
        return;
    }
    ab_put(a, "\"", 1);
    const char *end = v + n;
    for (const char *run = v; run < end;) {
        const char *q = run;
        while (q < end && *q != '"' && *q != '\\')
            q++;
        ab_put(a, run, (size_t)(q - run));
        if (q == end)
            break;
        ab_put(a, "\\", 1);
        ab_put(a, q, 1);
        run = q + 1;
    }
    ab_put(a, "\"", 1);
}

static void ab_text(struct abuf *a, const char *v)
{
    ab_textn(a, v, v ? strlen(v) : 0);
}

/* ---- the "labels" member of a definition, found without parsing it ---- */

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

/* p at a '"': past the closing one, or NULL. */
static const char *skip_string(const char *p)
{
    for (p++; *p; p++) {
        if (*p == '\\') {
            if (!*++p)
                return NULL;
        } else if (*p == '"') {
            return p + 1;
        }
    }
    return NULL;
}

/* Past one JSON value at p (whether it is valid inside is PostgreSQL's to
 * say), or NULL. */
static const char *skip_value(const char *p)
{
    if (*p == '"')
        return skip_string(p);
    if (*p != '{' && *p != '[') {
        const char *q = p;
        while (*q && !strchr(",}] \t\r\n", *q))
            q++;
        return q > p ? q : NULL;
    }
    int depth = 0;
    do {
        if (*p == '"') {
            if (!(p = skip_string(p)))
                return NULL;
            continue;
        }
        if (*p == '{' || *p == '[')
            depth++;
        else if (*p == '}' || *p == ']')
            depth--;
        else if (!*p)
            return NULL;
        p++;
    } while (depth > 0);
    return p;
}

/* The text of the top-level "labels" member of the JSON object def (the
 * last one, as jsonb keeps): 1 with [*at, *at + *len), 0 when there is
 * none, -1 when def does not scan (PostgreSQL then parses it whole). */
static int labels_member(const char *def, const char **at, size_t *len)
{
    const char *p = skip_ws(def);
    int found = 0;
    if (*p++ != '{')
        return -1;
    for (p = skip_ws(p); *p != '}';) {
        if (*p != '"')
            return -1;
        const char *k = p + 1, *ke = skip_string(p);
        if (!ke || memchr(k, '\\', (size_t)(ke - k)))
            return -1; /* an escaped key could spell "labels" */
        bool is_labels = ke - k == 7 && memcmp(k, "labels\"", 7) == 0;
        p = skip_ws(ke);
        if (*p++ != ':')
            return -1;
        const char *vs = skip_ws(p);
        if (!(p = skip_value(vs)))
            return -1;
        if (is_labels) {
            *at = vs;
            *len = (size_t)(p - vs);
            found = 1;
        }
        p = skip_ws(p);
        if (*p == ',')
            p = skip_ws(p + 1);
        else if (*p != '}')
            return -1;
    }
    return found;
}

/* Queue the batch's job rows as one statement (PS_JOB_INSERTS), before
 * every other record's statements: a record about a job comes after the
 * job's insert in the batch, so it still finds the row. apply_insert then
 * only takes the inserts' keys; a key taken after a release earlier in the
 * batch fails here and sends the batch the slow way, in order. 0, or
 * JD_EINVAL for a record apply_insert would
 * refuse (the slow path says which). */
static int emit_inserts(struct ctx *c)
{
    struct jd_pg_wscratch *ws = c->ws;
    size_t nins = 0;
    for (size_t i = 0; i < c->nb; i++)
        nins += c->b[i]->op == JD_W_JOB_INSERT;
    if (nins == 0)
        return 0;
    const size_t na = sizeof ws->arr / sizeof ws->arr[0];
    for (size_t k = 0; k < na; k++) {
        ws->arr[k].len = 0;
        ab_put(&ws->arr[k], "{", 1);
    }
    struct jd_write *first = NULL;
    for (size_t i = 0; i < c->nb; i++) {
        struct jd_write *w = c->b[i];
        if (w->op != JD_W_JOB_INSERT)
            continue;
        const struct jd_job *j = w->job;
        if (!j || !j->queue || !j->definition || (unsigned)j->state >= JD_JOB_NSTATES)
            return JD_EINVAL;
        int64_t id = j->id ? j->id : w->job_id;
        if (id <= 0)
            return JD_EINVAL;
        w->job_id = id;
        int64_t created = j->created_ms ? j->created_ms : c->now;
        char data[48];
        snprintf(data, sizeof data, "{\"state\":\"%s\"}", jd_job_state_name(j->state));
        ab_int(&ws->arr[0], id);
        ab_text(&ws->arr[1], j->queue);
        ab_int(&ws->arr[2], j->priority);
        ab_int(&ws->arr[3], j->state);
        ab_int(&ws->arr[4], j->run_at_ms);
        ab_int(&ws->arr[5], created);
        ab_int(&ws->arr[6], jd_job_state_terminal(j->state) ? created : 0);
        ab_text(&ws->arr[7], j->idempotency_key);
        ab_text(&ws->arr[8], j->schedule_id);
        ab_text(&ws->arr[9], j->handler);
        ab_text(&ws->arr[10], j->definition);
        ab_text(&ws->arr[11], data);
        const char *lat = NULL;
        size_t llen = 0;
        int lm =
            strstr(j->definition, "\"labels\":") ? labels_member(j->definition, &lat, &llen) : 0;
        if (lm < 0)
            ab_text(&ws->arr[12], j->definition);
        else
            ab_textn(&ws->arr[12], lm ? lat : NULL, llen);
        ab_sep(&ws->arr[13]);
        ab_put(&ws->arr[13], lm < 0 ? "t" : "f", 1);
        ab_sep(&ws->arr[14]);
        ab_put(&ws->arr[14], w->unowned ? "t" : "f", 1); /* the queued-job window */
        if (!first)
            first = w;
    }
    struct prm p = {0};
    for (size_t k = 0; k < 12; k++) {
        ab_put(&ws->arr[k], "}", 1);
        p_text(&p, ws->arr[k].p);
    }
    p_int(&p, c->s->pg->node_id);
    p_int(&p, c->now);
    for (size_t k = 12; k < na; k++) {
        ab_put(&ws->arr[k], "}", 1);
        p_text(&p, ws->arr[k].p);
    }
    c->hoisted = true;
    return emit(c, first, stmt_name(PS_JOB_INSERTS), &p, RK_INSERTS);
}

#define JD_PG_PIPE_CHUNK                                                                           \
    256 /* statements in flight before reading their results: the                                  \
           results must fit the sockets' buffers, or both ends block */

enum { PIPE_OK = 0, PIPE_FAULT = 1, PIPE_FATAL = 2 };

/* Sync the pipeline and read every queued statement's result, checking
 * each against its record. Returns the worst outcome seen. */
static int pipe_drain(struct ctx *c)
{
    PGconn *conn = c->s->pg->wconn;
    struct jd_pg_wscratch *ws = c->ws;
    int out = PIPE_OK;
    if (!PQpipelineSync(conn))
        return PIPE_FATAL;
    for (size_t k = 0; k < ws->npq; k++) {
        PGresult *r = PQgetResult(conn);
        if (!r)
            return PIPE_FATAL; /* the connection is gone */
        if (PQresultStatus(r) == PGRES_PIPELINE_ABORTED) {
            /* an earlier statement failed: already counted */
        } else if (!ws->pq[k].w) {
            if (wrc(r) != 0)
                out = PIPE_FATAL; /* the BEGIN */
        } else {
            int rc = take(c, ws->pq[k].w, ws->pq[k].kind, r);
            if (rc == NOROW || record_fault(rc))
                out = out > PIPE_FAULT ? out : PIPE_FAULT;
            else if (rc)
                out = PIPE_FATAL;
        }
        PQclear(r);
        r = PQgetResult(conn); /* NULL: the end of this statement's results */
        if (r) {
            PQclear(r);
            return PIPE_FATAL;
        }
    }
    ws->npq = 0;
    PGresult *r = PQgetResult(conn);
    bool synced = r && PQresultStatus(r) == PGRES_PIPELINE_SYNC;
    PQclear(r);
    return synced ? out : PIPE_FATAL;
}

static struct jslot *jslot(struct jd_pg_wscratch *ws, int64_t id)
{
    size_t i = (size_t)((uint64_t)id * 0x9E3779B97F4A7C15ull >> 20) & (ws->jcap - 1);
    while (ws->jt[i].id != 0 && ws->jt[i].id != id)
        i = (i + 1) & (ws->jcap - 1);
    return &ws->jt[i];
}

static bool is_append(const struct jd_write *w)
{
    return w->op == JD_W_JOB_CHANGE && w->set == 0 && !w->release_unique && w->request_id == 0 &&
           change_valid(w);
}

/* Queue the history appends of jobs that have nothing but appends (and
 * their insert) in the batch as one statement (PS_JOB_APPENDS), after the
 * inserts: nothing else in the batch touches those jobs, so their order
 * against other records does not matter, and among themselves the rank
 * keeps it. ws->grp[i] marks the records it took. Only for two or more. */
static int emit_appends(struct ctx *c)
{
    struct jd_pg_wscratch *ws = c->ws;
    size_t n = c->nb;
    if (n > ws->capgrp) {
        ws->capgrp = 2 * n;
        ws->grp = jd_xrealloc(ws->grp, ws->capgrp);
        ws->rank = jd_xrealloc(ws->rank, ws->capgrp * sizeof *ws->rank);
    }
    memset(ws->grp, 0, n);
    size_t want = 64;
    while (want < 2 * n)
        want *= 2;
    if (want > ws->jcap) {
        free(ws->jt);
        ws->jt = jd_xmalloc(want * sizeof *ws->jt);
        ws->jcap = want;
    }
    memset(ws->jt, 0, ws->jcap * sizeof *ws->jt);
    for (size_t i = 0; i < n; i++) {
        struct jd_write *w = c->b[i];
        bool job_record =
            w->op == JD_W_JOB_CHANGE || w->op == JD_W_JOB_CRASHES || w->op == JD_W_JOB_DELETE;
        if (!job_record || w->job_id <= 0)
            continue;
        struct jslot *js = jslot(ws, w->job_id);
        js->id = w->job_id;
        if (!is_append(w))
            js->busy = true;
    }
    size_t ng = 0;
    for (size_t i = 0; i < n; i++) {
        struct jd_write *w = c->b[i];
        if (!is_append(w) || jslot(ws, w->job_id)->busy)
            continue;
        ws->grp[i] = 1;
        ws->rank[i] = ++jslot(ws, w->job_id)->appends;
        ng++;
    }
    if (ng < 2) {
        memset(ws->grp, 0, n);
        return 0;
    }
    for (size_t k = 0; k < 4; k++) {
        ws->arr[k].len = 0;
        ab_put(&ws->arr[k], "{", 1);
    }
    struct jd_write *first = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!ws->grp[i])
            continue;
        struct jd_write *w = c->b[i];
        w->version = 0;
        w->time_ms = c->now;
        ab_int(&ws->arr[0], w->job_id);
        ab_int(&ws->arr[1], w->kind);
        ab_int(&ws->arr[2], w->tag);
        ab_text(&ws->arr[3], w->data);
        if (!first)
            first = w;
    }
    struct prm p = {0};
    for (size_t k = 0; k < 4; k++) {
        ab_put(&ws->arr[k], "}", 1);
        p_text(&p, ws->arr[k].p);
    }
    p_int(&p, c->now);
    p_int(&p, c->s->pg->node_id);
    return emit(c, first, stmt_name(PS_JOB_APPENDS), &p, RK_APPENDS);
}

/* The grouped appends' answer: each job's old version, so each record's
 * version is that plus its rank. NOROW if a job did not answer (missing or
 * fenced: the slow path says which). */
static int take_appends(struct ctx *c, const PGresult *r)
{
    struct jd_pg_wscratch *ws = c->ws;
    for (int k = 0; k < PQntuples(r); k++) {
        struct jslot *js = jslot(ws, strtoll(PQgetvalue(r, k, 0), NULL, 10));
        if (js->id == 0)
            return JD_EIO; /* a row for a job we did not send: cannot be */
        js->found = true;
        js->base = strtoll(PQgetvalue(r, k, 1), NULL, 10);
    }
    for (size_t i = 0; i < c->nb; i++) {
        if (!ws->grp[i])
            continue;
        struct jslot *js = jslot(ws, c->b[i]->job_id);
        if (!js->found)
            return NOROW;
        c->b[i]->version = js->base + ws->rank[i];
    }
    return 0;
}

/* The fast path: every record's statements pipelined in one transaction,
 * a few round trips for the whole batch. 0: all applied (transaction
 * open, counts written); 1: a record did not apply (rolled back, ids
 * restored: redo with savepoints); -1: the transaction failed. */
static int apply_pipelined(struct ctx *c, struct jd_write **b, int *rcs, size_t n)
{
    struct jd_pg_wscratch *ws = c->ws;
    PGconn *conn = c->s->pg->wconn;
    if (n > ws->capids) {
        ws->capids = 2 * n;
        ws->ids = jd_xrealloc(ws->ids, ws->capids * sizeof *ws->ids);
    }
    counts_clear(ws);
    ws->npq = 0;
    if (ws->grp)
        memset(ws->grp, 0, n < ws->capgrp ? n : ws->capgrp);
    for (size_t i = 0; i < n; i++) {
        ws->ids[i] = b[i]->job_id;
        rcs[i] = 0;
        /* statements cannot be prepared inside the pipeline */
        if (b[i]->op == JD_W_JOB_CHANGE && change_valid(b[i]) && !change_stmt(c->s, b[i]->set))
            return -1;
    }
    if (!PQenterPipelineMode(conn))
        return -1;
    c->pipe = true;
    int out = PIPE_OK;
    if (!PQsendQueryParams(conn, "BEGIN", 0, NULL, NULL, NULL, NULL, 0)) {
        out = PIPE_FATAL;
    } else {
        if (ws->cappq == 0) {
            ws->cappq = 2 * JD_PG_PIPE_CHUNK;
            ws->pq = jd_xrealloc(ws->pq, ws->cappq * sizeof *ws->pq);
        }
        ws->pq[ws->npq++] = (struct pend){0}; /* w NULL: the BEGIN */
        c->b = b;
        c->nb = n;
        int rc = emit_inserts(c);
        if (rc == 0)
            rc = emit_appends(c);
        if (rc)
            out = record_fault(rc) ? PIPE_FAULT : PIPE_FATAL;
    }
    for (size_t i = 0; i < n && out == PIPE_OK; i++) {
        if (b[i]->op == JD_W_SYNC_ || (ws->grp && i < ws->capgrp && ws->grp[i]))
            continue;
        int rc = apply(c, b[i]);
        if (rc)
            out = record_fault(rc) ? PIPE_FAULT : PIPE_FATAL;
        else if (ws->npq >= JD_PG_PIPE_CHUNK)
            out = pipe_drain(c);
    }
    if (ws->npq > 0 && out != PIPE_FATAL) {
        int d = pipe_drain(c);
        out = d > out ? d : out;
    }
    c->pipe = c->hoisted = false;
    if (out == PIPE_FATAL || !PQexitPipelineMode(conn))
        return -1;
    if (out == PIPE_FAULT) {
        counts_clear(ws);
        if (simple(c->s, "ROLLBACK") != 0)
            return -1;
        for (size_t k = 0; k < n; k++) {
            b[k]->job_id = ws->ids[k];
            b[k]->version = 0;
        }
        return 1;
    }
    return counts_flush(c) == 0 ? 0 : -1;
}

/* The slow path: every record, or group, in its own SAVEPOINT, one
 * statement at a time. 0, or -1 when the transaction failed. */
static int apply_savepoints(struct ctx *c, struct jd_write **b, int *rcs, size_t n)
{
    struct jd_store *s = c->s;
    counts_clear(c->ws);
    for (size_t i = 0; i < n;) {
        size_t g = b[i]->group_ ? b[i]->group_ : 1;
        if (g == 1 && b[i]->op == JD_W_SYNC_) {
            rcs[i++] = 0;
            continue;
        }
        if (simple(s, "SAVEPOINT r") != 0) {
            log_failure(s, "savepoint");
            return -1;
        }
        counts_mark(c->ws);
        int rc = 0;
        for (size_t k = 0; k < g && rc == 0; k++)
            rc = apply(c, b[i + k]);
        if (rc != 0 && !record_fault(rc)) {
            log_failure(s, "write");
            return -1;
        }
        if (rc != 0) {
            counts_restore(c->ws);
            if (simple(s, "ROLLBACK TO SAVEPOINT r") != 0) {
                log_failure(s, "rollback to savepoint");
                return -1;
            }
        }
        if (simple(s, "RELEASE SAVEPOINT r") != 0) {
            log_failure(s, "release savepoint");
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
    if (counts_flush(c) != 0) {
        log_failure(s, "queue counts");
        return -1;
    }
    return 0;
}

/* A usable session: out of any pipeline and transaction a failure left it
 * in, reconnected (and statements prepared again) if the connection was
 * lost. 0 or JD_EIO. */
static int ensure_session(struct jd_store *s)
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
            log_failure(s, "reconnect");
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
        simple(s, "ROLLBACK");
    return pg->wprepared ? 0 : prepare_all(s);
}

#define JD_PG_NOTIFY_MAX 7900 /* a NOTIFY payload is at most 8000 bytes */

/* Append entry e to the notice being built; past the cap it becomes "*". */
static void note_add(char *buf, size_t *len, bool *all, const char *e)
{
    size_t k = strlen(e);
    if (*all)
        return;
    if (*len + k + 2 > JD_PG_NOTIFY_MAX) {
        *all = true;
        return;
    }
    if (*len)
        buf[(*len)++] = ',';
    memcpy(buf + *len, e, k + 1);
    *len += k;
}

/* The payload of the batch's one change notice (NULL: nothing to say),
 * sent inside its transaction by commit() (delivered at commit, dropped
 * with a rollback): "id:version" per job record applied, "s:<id>" per
 * schedule, "r" for inbox requests, or "*" when it would not fit. Hints
 * only: listeners re-read. *nreq: inbox requests in it. */
static const char *notice_of(struct jd_write **b, const int *rcs, size_t n, uint64_t *nreq_out)
{
    static _Thread_local char buf[JD_PG_NOTIFY_MAX + 1];
    size_t len = 0;
    bool all = false, req = false;
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
            note_add(buf, &len, &all, e);
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
            note_add(buf, &len, &all, e);
            break;
        default:
            break;
        }
    }
    if (req)
        note_add(buf, &len, &all, "r");
    if (all) {
        /* "*" says any job may have changed; keep the inbox hint beside it */
        snprintf(buf, sizeof buf, req ? "*,r,s" : "*,s");
        len = strlen(buf);
    }
    *nreq_out = nreq;
    return len ? buf : NULL;
}

/* ---- the event horizon (storage/pg.h) ---- */

#define HZ_CLEAR_SQL "UPDATE jd_nodes SET pending_event_id = NULL WHERE id = $1"
#define HZ_NEXT_SQL "UPDATE jd_nodes SET pending_event_id = nextval('events_id_seq') WHERE id = $1"

/* sql with this node's id as $1 on hzconn, (re)connected once if the
 * connection is gone. The result, or NULL. */
static PGresult *hz_exec(struct jd_store *s, const char *sql)
{
    struct jd_pg *pg = s->pg;
    char me[24];
    snprintf(me, sizeof me, "%lld", (long long)pg->node_id);
    const char *v[] = {me};
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!pg->hzconn || PQstatus(pg->hzconn) != CONNECTION_OK) {
            PQfinish(pg->hzconn);
            /* synchronous_commit=off: visible at once, the batch's own
             * COMMIT (later in the WAL) makes it durable */
            pg->hzconn = jd_pg_connect(pg->url, pg->display, false, NULL);
            if (!pg->hzconn)
                return NULL;
        }
        PGresult *r = PQexecParams(pg->hzconn, sql, 1, NULL, v, NULL, NULL, 0);
        if (jd_pg_rc(r) == 0)
            return r;
        PQclear(r);
        if (PQstatus(pg->hzconn) == CONNECTION_OK)
            return NULL; /* the statement failed, not the connection */
    }
    return NULL;
}

/* Records that never insert into events need no horizon. */
static bool needs_horizon(struct jd_write **b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        switch ((int)b[i]->op) {
        case JD_W_SYNC_:
        case JD_W_QUEUE:
        case JD_W_QUEUE_CONFIG:
        case JD_W_JOB_CRASHES:
        case JD_W_JOB_DELETE:
        case JD_W_COMMAND_PUT:
        case JD_W_COMMAND_DELETE:
        case JD_W_TASK_PUT:
        case JD_W_JOB_REQUEST:
            break;
        default:
            return true;
        }
    return false;
}

/* Before the batch's BEGIN: every event id the transaction takes is
 * greater than what this publishes. 0 or JD_EIO (nothing is applied). */
static int hz_publish(struct jd_store *s)
{
    PGresult *r = hz_exec(s, HZ_NEXT_SQL);
    if (!r)
        return JD_EIO;
    /* no row: this incarnation's lease is lost (it starts over) */
    s->pg->hz_pending = strcmp(PQcmdTuples(r), "1") == 0;
    PQclear(r);
    return 0;
}

/* After a batch that did not commit: an idle writer holds no horizon. */
static void hz_clear(struct jd_store *s)
{
    if (!s->pg->hz_pending)
        return;
    PGresult *r = hz_exec(s, HZ_CLEAR_SQL);
    if (r)
        s->pg->hz_pending = false;
    PQclear(r);
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

/* COMMIT, true only if the server committed (an aborted transaction
 * answers COMMIT with ROLLBACK); with note, pg_notify(note) first, and
 * with clear, the horizon's clear, in the same round trip (a pipeline). */
void jd_pg_test_drop_at_commit(struct jd_store *s)
{
    atomic_store(&s->pg->test_drop_commit, true);
}

enum { HZ_KEEP, HZ_CLEAR, HZ_NEXT }; /* what a COMMIT does to the horizon */

static bool commit(struct jd_store *s, const char *note, int hz)
{
    PGconn *c = s->pg->wconn;
    if (PQtransactionStatus(c) != PQTRANS_INTRANS)
        return false;
    if (atomic_exchange(&s->pg->test_drop_commit, false)) {
        /* the test hook: COMMIT goes out, the answer never comes back
         * (the server waits first, so the answer cannot beat the
         * shutdown into the socket's buffer) */
        if (PQsendQuery(c, "SELECT pg_sleep(0.3); COMMIT"))
            PQflush(c);
        shutdown(PQsocket(c), SHUT_RDWR);
        PGresult *r;
        while ((r = PQgetResult(c)) != NULL)
            PQclear(r);
        return false;
    }
    if (!note && hz == HZ_KEEP) {
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
    const char *nv[] = {note}, *cv[] = {me};
    int k = 0, nst = (note != NULL) + (hz != HZ_KEEP) + 1;
    bool ok = (hz == HZ_KEEP || PQsendQueryParams(c, hz == HZ_NEXT ? HZ_NEXT_SQL : HZ_CLEAR_SQL, 1,
                                                  NULL, cv, NULL, NULL, 0)) &&
              (!note || PQsendQueryParams(c, "SELECT pg_notify('" JD_PG_NOTIFY_CHANNEL "', $1)", 1,
                                          NULL, nv, NULL, NULL, 0)) &&
              PQsendQueryParams(c, "COMMIT", 0, NULL, NULL, NULL, NULL, 0) && PQpipelineSync(c);
    /* each statement's result, then NULL; then the sync */
    for (; k < nst && ok; k++) {
        PGresult *r = PQgetResult(c);
        if (!r)
            return false; /* the connection is gone (ensure_session cleans up) */
        ok = jd_pg_rc(r) == 0 && (k < nst - 1 || strcmp(PQcmdStatus(r), "COMMIT") == 0) &&
             PQresultStatus(r) != PGRES_PIPELINE_ABORTED;
        if (ok && k == 0 && hz == HZ_NEXT)
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
    struct ctx c = {.s = s, .ws = scratch(s->pg), .now = jd_wall_ms()};
    bool applied = false, commit_sent = false, retried = false;
again:
    if (ensure_session(s) != 0)
        goto fail;
    if (!s->pg->hz_pending && needs_horizon(b, n) && hz_publish(s) != 0) {
        jd_log(JD_LOG_ERROR, "storage commit failed", "db", s->pg->display, "error",
               "cannot publish the event horizon", NULL);
        goto fail;
    }
    applied = true; /* apply_pipelined saves the records' job ids first */
    int fast = apply_pipelined(&c, b, rcs, n);
    if (fast < 0) {
        log_failure(s, "write");
        goto fail;
    }
    if (fast > 0) {
        if (simple(s, "BEGIN") != 0) {
            log_failure(s, "begin");
            goto fail;
        }
        if (apply_savepoints(&c, b, rcs, n) != 0)
            goto fail;
    }
    uint64_t nreq = 0;
    const char *note = notice_of(b, rcs, n, &nreq);
    test_hold(s->pg);
    commit_sent = true;
    /* More records wait: this COMMIT publishes the next batch's bound
     * (visible with it, before that batch takes an id), saving its round
     * trip; else it clears the bound (an idle writer holds none). */
    bool more = atomic_load_explicit(&s->head, memory_order_relaxed) != NULL;
    int hz = more ? HZ_NEXT : s->pg->hz_pending ? HZ_CLEAR : HZ_KEEP;
    if (!commit(s, note, hz)) {
        log_failure(s, "commit");
        goto fail;
    }
    atomic_fetch_add_explicit(&s->pg->st_requests, nreq, memory_order_relaxed); /* a statistic */
    return 0;

fail:
    counts_clear(c.ws);
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
        simple(s, "ROLLBACK");
    /* not committed, so the horizon goes; but a COMMIT lost in flight
     * may still commit: its horizon stays until the takeover deletes the
     * row (the incarnation was given up above) */
    if (!commit_sent || PQstatus(s->pg->wconn) == CONNECTION_OK)
        hz_clear(s);
    for (size_t i = 0; i < n; i++) {
        rcs[i] = JD_EIO;
        b[i]->version = 0;
    }
    return JD_EIO;
}

bool jd_pg_retention_step(struct jd_store *s)
{
    int64_t now = jd_wall_ms();
    int64_t deleted = 0;
    PGresult *qs = NULL;
    if (ensure_session(s) != 0 || simple(s, "BEGIN") != 0)
        goto fail;
    /* one node at a time: another node's pass now, ours next time */
    PGresult *lk =
        PQexec(s->pg->wconn, "SELECT pg_try_advisory_xact_lock(" JD_PG_CHORE_LOCK_SQL ")");
    bool mine = jd_pg_rc(lk) == 0 && PQntuples(lk) == 1 && PQgetvalue(lk, 0, 0)[0] == 't';
    PQclear(lk);
    if (!mine) {
        simple(s, "ROLLBACK");
        return false;
    }
    struct prm none = {0};
    if (xq(s, stmt_name(PS_RET_QUEUES), &none, &qs) != 0)
        goto fail;
    for (int i = 0; i < PQntuples(qs) && deleted < JD_PG_RETENTION_BATCH; i++) {
        int64_t keep = strtoll(PQgetvalue(qs, i, 2), NULL, 10);
        if (keep <= 0)
            keep = s->retention_ms;
        if (keep <= 0)
            continue; /* kept forever */
        struct prm p = {0};
        p_text(&p, PQgetvalue(qs, i, 0));
        p_int(&p, strtoll(PQgetvalue(qs, i, 1), NULL, 10));
        p_int(&p, now - keep);
        p_int(&p, JD_PG_RETENTION_BATCH - deleted);
        p_int(&p, s->pg->node_id);
        int64_t k = 0;
        bool found = false;
        if (xint(s, PS_RET_DELETE, &p, &k, &found) != 0)
            goto fail;
        deleted += k;
    }
    PQclear(qs);
    qs = NULL;
    if (!commit(s, NULL, HZ_KEEP))
        goto fail;
    atomic_fetch_add_explicit(&s->st_retention_deleted, (uint64_t)deleted,
                              memory_order_relaxed); /* a statistic */
    return deleted >= JD_PG_RETENTION_BATCH;

fail:
    log_failure(s, "retention");
    PQclear(qs);
    if (PQstatus(s->pg->wconn) == CONNECTION_OK &&
        PQtransactionStatus(s->pg->wconn) != PQTRANS_IDLE)
        simple(s, "ROLLBACK");
    return false;
}
