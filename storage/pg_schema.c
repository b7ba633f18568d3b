/*
 * The PostgreSQL schema: numbered migrations, as storage/schema.c for
 * SQLite, append-only (never edit one that shipped; add the next).
 *
 * The tables and columns mirror SQLite's after its migrations 1-12 (BIGINT
 * for INTEGER, TEXT for TEXT), so the SQL of both backends reads alike.
 * Differences, each for a reason:
 * - every index that SQLite orders by rowid implicitly ends in id here
 *   (jobs_state(state, id), ...), so "newest first" stays an index range;
 * - names listed in name order (schedules, queues, queue counts, remote
 *   commands) are COLLATE "C": byte order, as SQLite (and strcmp) sort,
 *   whatever the database's collation, so their keys serve those pages;
 * - events.id and schedule_events.id come from sequences (events: not
 *   in commit order across nodes; the stream reads below the horizon of
 *   jd_nodes.pending_event_id, migration 4 and pg.h);
 * - job ids come from the sequence jd_job_ids, INCREMENT JD_PG_ID_BLOCK:
 *   each nextval reserves a block (pg.c), unique across nodes and restarts,
 *   so meta 'max_deleted_id' is not needed;
 * - no triggers: the writer keeps queue_counts for inserts, state changes
 *   and deletes alike, and writes job_labels rows with the job's insert
 *   (pg_write.c) and deletes them with the job;
 * - for the cluster: jd_nodes (one row per node incarnation, with a
 *   lease) and jobs.owner_node (the incarnation that owns a job; every job
 *   write is fenced on it).
 *
 * meta 'app_id' (JD_SCHEMA_APP_ID) marks a database as Jackdaw's: a schema
 * with tables but no such row is refused rather than written to. meta
 * 'schema_version' counts the migrations applied; each runs in its own
 * transaction with its bump. A session advisory lock serializes
 * migrations of nodes starting at once.
 *
 * Threading: called by jd_pg_open on the opening thread, before the writer
 * starts, on the writer's connection.
 */
#include "storage/pg.h"
#include "storage/store_impl.h"

#include "common/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JD_PG_MIGRATE_LOCK 0x4a44574b4d494752LL /* "JDWKMIGR" */

static const char *const migrations[] = {
    /* 1: everything of SQLite migrations 1-12, plus jd_nodes and
     * jobs.owner_node (see the file comment). */
    "CREATE TABLE meta ("
    "  key TEXT PRIMARY KEY,"
    "  value BIGINT NOT NULL"
    ");"
    "CREATE TABLE jobs ("
    "  id BIGINT PRIMARY KEY,"
    "  queue TEXT NOT NULL,"
    "  priority BIGINT NOT NULL DEFAULT 0,"
    "  state BIGINT NOT NULL CHECK (state BETWEEN 0 AND 5),"
    "  run_at_ms BIGINT NOT NULL DEFAULT 0,"
    "  attempts BIGINT NOT NULL DEFAULT 0,"
    "  version BIGINT NOT NULL DEFAULT 1,"
    "  output TEXT,"
    "  error TEXT,"
    "  created_ms BIGINT NOT NULL,"
    "  updated_ms BIGINT NOT NULL,"
    "  started_ms BIGINT NOT NULL DEFAULT 0,"
    "  finished_ms BIGINT NOT NULL DEFAULT 0,"
    "  idempotency_key TEXT,"
    "  schedule_id TEXT,"
    "  crashes BIGINT NOT NULL DEFAULT 0,"
    "  handler TEXT,"
    "  owner_node BIGINT"
    ");"
    /* the jobs rows are updated several times each: leave room on their
     * pages for HOT updates, and vacuum them sooner than the default */
    "ALTER TABLE jobs SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02);"
    "CREATE SEQUENCE jd_job_ids INCREMENT 1000 START 1;"
    "CREATE TABLE job_definitions ("
    "  job_id BIGINT PRIMARY KEY,"
    "  definition TEXT NOT NULL"
    ");"
    "CREATE INDEX jobs_state ON jobs(state, id);"
    "CREATE INDEX jobs_queue_state ON jobs(queue, state, id);"
    "CREATE INDEX jobs_queue ON jobs(queue, id);"
    "CREATE UNIQUE INDEX jobs_idem ON jobs(idempotency_key) WHERE idempotency_key IS NOT NULL;"
    "CREATE INDEX jobs_active ON jobs(id) WHERE state < 3;"
    "CREATE INDEX jobs_schedule ON jobs(schedule_id, id) WHERE schedule_id IS NOT NULL;"
    "CREATE INDEX jobs_queue_finished ON jobs(queue, state, finished_ms) WHERE state >= 3;"
    "CREATE INDEX jobs_handler ON jobs(handler, id) WHERE handler IS NOT NULL;"
    "CREATE INDEX jobs_created ON jobs(created_ms, id);"
    "CREATE INDEX jobs_queued ON jobs(queue, priority DESC, id, run_at_ms) WHERE state = 0;"
    "CREATE INDEX jobs_queued_later ON jobs(run_at_ms, id)"
    "  WHERE state = 0 AND run_at_ms > created_ms;"
    /* (no index on owner_node yet: every index costs each insert and
     * state change; the cluster's takeover adds the one it needs) */
    "CREATE TABLE events ("
    "  id BIGSERIAL PRIMARY KEY,"
    "  job_id BIGINT NOT NULL,"
    "  seq BIGINT NOT NULL,"
    "  time_ms BIGINT NOT NULL,"
    "  kind BIGINT NOT NULL CHECK (kind BETWEEN 0 AND 5),"
    "  tag BIGINT NOT NULL DEFAULT 0,"
    "  data TEXT"
    ");"
    "CREATE UNIQUE INDEX events_job_seq ON events(job_id, seq);"
    "CREATE TABLE queues ("
    "  name TEXT COLLATE \"C\" PRIMARY KEY,"
    "  paused BIGINT NOT NULL DEFAULT 0,"
    "  config TEXT,"
    "  retain_succeeded_ms BIGINT NOT NULL DEFAULT 0,"
    "  retain_failed_ms BIGINT NOT NULL DEFAULT 0,"
    "  retain_cancelled_ms BIGINT NOT NULL DEFAULT 0"
    ");"
    "CREATE TABLE idempotency ("
    "  key TEXT PRIMARY KEY,"
    "  job_id BIGINT NOT NULL,"
    "  fingerprint TEXT,"
    "  created_ms BIGINT NOT NULL"
    ");"
    "CREATE TABLE queue_counts ("
    "  queue TEXT COLLATE \"C\" NOT NULL,"
    "  state BIGINT NOT NULL,"
    "  n BIGINT NOT NULL,"
    "  PRIMARY KEY (queue, state)"
    ");"
    "CREATE TABLE schedules ("
    "  id TEXT COLLATE \"C\" PRIMARY KEY,"
    "  definition TEXT NOT NULL,"
    "  paused BIGINT NOT NULL DEFAULT 0,"
    "  retired BIGINT NOT NULL DEFAULT 0,"
    "  next_fire_ms BIGINT NOT NULL DEFAULT 0,"
    "  anchor_ms BIGINT NOT NULL DEFAULT 0,"
    "  last_fire_ms BIGINT NOT NULL DEFAULT 0,"
    "  last_job_id BIGINT NOT NULL DEFAULT 0,"
    "  last_outcome TEXT,"
    "  fires BIGINT NOT NULL DEFAULT 0,"
    "  skips BIGINT NOT NULL DEFAULT 0,"
    "  event_seq BIGINT NOT NULL DEFAULT 0,"
    "  created_ms BIGINT NOT NULL,"
    "  updated_ms BIGINT NOT NULL"
    ");"
    "CREATE TABLE schedule_events ("
    "  id BIGSERIAL PRIMARY KEY,"
    "  schedule_id TEXT NOT NULL,"
    "  seq BIGINT NOT NULL,"
    "  time_ms BIGINT NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  fire_ms BIGINT NOT NULL DEFAULT 0,"
    "  job_id BIGINT NOT NULL DEFAULT 0,"
    "  data TEXT"
    ");"
    "CREATE UNIQUE INDEX schedule_events_seq ON schedule_events(schedule_id, seq);"
    "CREATE TABLE unique_keys ("
    "  key TEXT PRIMARY KEY,"
    "  job_id BIGINT NOT NULL,"
    "  expires_ms BIGINT NOT NULL DEFAULT 0"
    ");"
    "CREATE INDEX unique_keys_job ON unique_keys(job_id);"
    "CREATE TABLE job_labels ("
    "  key TEXT NOT NULL,"
    "  value TEXT NOT NULL,"
    "  job_id BIGINT NOT NULL,"
    "  PRIMARY KEY (key, value, job_id)"
    ");"
    /* deleting a job's labels (SQLite re-reads them from the definition) */
    "CREATE INDEX job_labels_job ON job_labels(job_id);"
    "CREATE TABLE remote_commands ("
    "  name TEXT COLLATE \"C\" PRIMARY KEY,"
    "  timeout_ms BIGINT NOT NULL DEFAULT 0,"
    "  description TEXT,"
    "  created_ms BIGINT NOT NULL,"
    "  updated_ms BIGINT NOT NULL,"
    "  max_in_flight BIGINT NOT NULL DEFAULT 0"
    ");"
    "CREATE TABLE tasks ("
    "  id TEXT PRIMARY KEY,"
    "  job_id BIGINT NOT NULL,"
    "  tag BIGINT NOT NULL,"
    "  attempt BIGINT NOT NULL,"
    "  command TEXT NOT NULL,"
    "  state BIGINT NOT NULL,"
    "  worker TEXT,"
    "  lease_expires_ms BIGINT NOT NULL DEFAULT 0,"
    "  updated_ms BIGINT NOT NULL"
    ");"
    "CREATE INDEX tasks_job ON tasks(job_id);"
    /* one row per running node incarnation; ids never reused (the fence) */
    "CREATE TABLE jd_nodes ("
    "  id BIGSERIAL PRIMARY KEY,"
    "  name TEXT NOT NULL,"
    "  started_at TIMESTAMPTZ NOT NULL DEFAULT now(),"
    "  expires_at TIMESTAMPTZ NOT NULL"
    ");",
    /* 2: the cluster (issue 16 phase 2): each job's inbox of cancels and
     * messages written by nodes that do not own it (the owner records
     * them and deletes the row in that commit), and the claim's partial
     * index over unowned unfinished jobs, in claim order. */
    "CREATE TABLE job_requests ("
    "  id BIGSERIAL PRIMARY KEY,"
    "  job_id BIGINT NOT NULL,"
    "  kind BIGINT NOT NULL,"
    "  data TEXT,"
    "  created_ms BIGINT NOT NULL"
    ");"
    "CREATE INDEX job_requests_job ON job_requests(job_id);"
    "CREATE INDEX jobs_unowned ON jobs(priority DESC, id) WHERE owner_node IS NULL AND state < 3;"
    /* a node's own unfinished jobs in id order: recovery reads them, a
     * takeover and a clean close unown them */
    "CREATE INDEX jobs_owned ON jobs(owner_node, id) WHERE state < 3;"
    "CREATE INDEX jd_nodes_expires ON jd_nodes(expires_at);",
    /* 3: queue counts per node (issue 16 phase 2): each node adds its
     * changes to its own row (slot = its node id), so one node stalled
     * inside a transaction never holds the others' commits; reads sum the
     * slots; a node's rows fold into slot 0 when it closes or is taken
     * over (pg_cluster.c). */
    "ALTER TABLE queue_counts ADD COLUMN slot BIGINT NOT NULL DEFAULT 0;"
    "ALTER TABLE queue_counts DROP CONSTRAINT queue_counts_pkey;"
    "ALTER TABLE queue_counts ADD PRIMARY KEY (queue, state, slot);",
    /* 4: the event horizon (issue 16, GET /v1/events in a cluster; pg.h):
     * a lower bound of the event ids a node's open transaction may take;
     * the stream returns only ids below the smallest. */
    "ALTER TABLE jd_nodes ADD COLUMN pending_event_id BIGINT;",
    /* 5: remote tasks across nodes (issue 16; storage/pg_nodes.c): the
     * base URL other nodes forward a task's requests to its owner at. */
    "ALTER TABLE jd_nodes ADD COLUMN url TEXT;",
    /* 6: fewer index entries per job version (issue 16, pgidx): a state
     * change is never HOT, so each new row version of a job adds an entry
     * to every jobs index whose predicate it meets. jobs_active (id, where
     * state < 3) served nothing jobs_owned (owner_node, id, where state <
     * 3) does not: recovery reads one node's unfinished jobs and takeovers
     * pick them by owner, both on jobs_owned (test_pg_read checks the
     * plans), so a queued or running version paid for it in vain. */
    "DROP INDEX IF EXISTS jobs_active;",
    /* 7: packed runs of events (as SQLite's 14; store_impl.h): a row
     * holds a run of up to JD_EV_RUN_MAX (8) events of one job, each with
     * an id of its own (id .. id + n - 1), so the sequence steps by 8 and
     * the event horizon (pg.h) stays a bound for every event a row holds.
     * Existing rows are runs of one. jd_ev_unpack reads a row's `more`
     * in SQL: jd_ev_any serves the task state query (pg_read.c, as the C
     * function of that name does for SQLite), and the view events_all
     * lists every event as a row of its own, for psql and the tests. */
    "ALTER TABLE events ADD COLUMN more TEXT;"
    "ALTER SEQUENCE events_id_seq INCREMENT BY 8;"
    "CREATE FUNCTION jd_ev_unpack(more text)"
    "  RETURNS TABLE(i bigint, kind bigint, tag bigint, dt bigint, data text)"
    "  LANGUAGE plpgsql IMMUTABLE AS $f$"
    " DECLARE p int := 1; c int; h text[]; n int;"
    " BEGIN"
    "  i := 0;"
    "  WHILE more IS NOT NULL AND p <= length(more) LOOP"
    "   c := strpos(substr(more, p), ':');"
    "   EXIT WHEN c = 0;"
    "   h := string_to_array(substr(more, p, c - 1), ',');"
    "   n := h[4]::int;"
    "   p := p + c;"
    "   i := i + 1; kind := h[1]::bigint; tag := h[2]::bigint; dt := h[3]::bigint;"
    "   data := CASE WHEN n >= 0 THEN substr(more, p, n) END;"
    "   p := p + greatest(n, 0);"
    "   RETURN NEXT;"
    "  END LOOP;"
    " END $f$;"
    "CREATE FUNCTION jd_ev_any(text, bigint, bigint, bigint) RETURNS boolean"
    "  LANGUAGE sql IMMUTABLE AS $f$"
    " SELECT EXISTS (SELECT 1 FROM jd_ev_unpack($1) x WHERE x.kind = $2 AND x.tag = $3"
    "  AND ($4 IS NULL OR CASE WHEN jsonb_typeof(x.data::jsonb -> 'attempt') = 'number'"
    "  THEN (x.data::jsonb ->> 'attempt')::numeric END > $4)) $f$;"
    "CREATE VIEW events_all AS"
    " SELECT id, job_id, seq, time_ms, kind, tag, data FROM events"
    " UNION ALL SELECT e.id + x.i, e.job_id, e.seq + x.i, e.time_ms + x.dt, x.kind, x.tag,"
    " x.data FROM events e CROSS JOIN LATERAL jd_ev_unpack(e.more) x"
    " WHERE e.more IS NOT NULL;",
    /* 8: cluster-wide queue limits (storage/pg_nodes.c, jd_store_queue_grant):
     * a node starts a queued job of a limited queue only under a grant; a
     * grant counts against max_running while its job is queued and owned
     * by the grantee (a started job counts by its state). A queue's rate
     * is one token bucket for the cluster. Free starts go round the nodes
     * with ready jobs of the queue (queue_demand: each one's best job). */
    "CREATE TABLE queue_grants ("
    "  job_id BIGINT PRIMARY KEY,"
    "  queue TEXT NOT NULL,"
    "  node BIGINT NOT NULL"
    ");"
    "CREATE INDEX queue_grants_queue ON queue_grants(queue);"
    "CREATE TABLE queue_tokens ("
    "  queue TEXT PRIMARY KEY,"
    "  tokens DOUBLE PRECISION NOT NULL,"
    "  at TIMESTAMPTZ NOT NULL"
    ");"
    "CREATE TABLE queue_demand ("
    "  queue TEXT NOT NULL,"
    "  node BIGINT NOT NULL,"
    "  priority BIGINT NOT NULL,"
    "  created_ms BIGINT NOT NULL,"
    "  job_id BIGINT NOT NULL,"
    "  at TIMESTAMPTZ NOT NULL,"
    "  PRIMARY KEY (queue, node)"
    ");",
    /* 9: the nodes that want job-change notices (storage/pg.h,
     * JD_PG_WATCH_LOCK): a row while a node has a watch on a job it does
     * not hold or an event stream open. A batch sends its job changes only
     * while some row exists; the row goes with its node's. */
    "CREATE TABLE jd_watchers ("
    "  node BIGINT PRIMARY KEY REFERENCES jd_nodes(id) ON DELETE CASCADE"
    ");",
};

_Static_assert(JD_EV_RUN_MAX == 8, "migration 7 steps the events sequence by JD_EV_RUN_MAX");

#define N_MIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))

static int fail(PGconn *c, const char *display, const char *what, struct jd_error *err)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s", PQerrorMessage(c));
    msg[strcspn(msg, "\n")] = '\0';
    return jd_error_set(err, JD_EIO, NULL, "PostgreSQL database %s: %s failed: %s", display, what,
                        msg);
}

/* One row, one column of sql, as an integer (-1 when there is no row). */
static int query_int(PGconn *c, const char *sql, int64_t *out)
{
    PGresult *r = PQexec(c, sql);
    int rc = jd_pg_rc(r);
    if (rc == 0)
        *out =
            PQntuples(r) > 0 && !PQgetisnull(r, 0, 0) ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : -1;
    PQclear(r);
    return rc;
}

static int migrate_locked(PGconn *c, const char *display, struct jd_error *err)
{
    int64_t has_meta = 0, tables = 0, app_id = -1, version = 0;
    if (query_int(c, "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()",
                  &tables) != 0 ||
        query_int(c,
                  "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
                  " AND tablename = 'meta'",
                  &has_meta) != 0)
        return fail(c, display, "reading the schema", err);
    if (has_meta) {
        if (query_int(c, "SELECT value FROM meta WHERE key = 'app_id'", &app_id) != 0 ||
            query_int(c, "SELECT value FROM meta WHERE key = 'schema_version'", &version) != 0)
            return fail(c, display, "reading the schema", err);
    }
    if (tables > 0 && app_id != JD_SCHEMA_APP_ID)
        return jd_error_set(err, JD_ECORRUPT, NULL,
                            "PostgreSQL database %s is not a Jackdaw database (%lld tables in its "
                            "schema, no Jackdaw marker); refusing to use it",
                            display, (long long)tables);
    if (version < 0)
        version = 0;
    if (version > N_MIGRATIONS)
        return jd_error_set(err, JD_ECORRUPT, NULL,
                            "PostgreSQL database %s has schema version %lld, newer than this "
                            "Jackdaw understands (%d); upgrade Jackdaw or use another database",
                            display, (long long)version, N_MIGRATIONS);
    for (int v = (int)version; v < N_MIGRATIONS; v++) {
        char bump[256];
        snprintf(bump, sizeof bump,
                 "INSERT INTO meta(key, value) VALUES ('schema_version', %d), ('app_id', %d)"
                 " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                 v + 1, JD_SCHEMA_APP_ID);
        const char *steps[] = {"BEGIN", migrations[v], bump, "COMMIT"};
        for (size_t i = 0; i < 4; i++) {
            PGresult *r = PQexec(c, steps[i]);
            int rc = jd_pg_rc(r);
            PQclear(r);
            if (rc) {
                char what[64];
                snprintf(what, sizeof what, "migration to schema version %d", v + 1);
                rc = fail(c, display, what, err);
                PQclear(PQexec(c, "ROLLBACK"));
                return rc;
            }
        }
    }
    return 0;
}

int jd_pg_schema_migrate(PGconn *c, const char *display, struct jd_error *err)
{
    char sql[64];
    snprintf(sql, sizeof sql, "SELECT pg_advisory_lock(%lld)", (long long)JD_PG_MIGRATE_LOCK);
    PGresult *r = PQexec(c, sql);
    int rc = jd_pg_rc(r);
    PQclear(r);
    if (rc)
        return fail(c, display, "taking the migration lock", err);
    rc = migrate_locked(c, display, err);
    snprintf(sql, sizeof sql, "SELECT pg_advisory_unlock(%lld)", (long long)JD_PG_MIGRATE_LOCK);
    PQclear(PQexec(c, sql));
    return rc;
}
