/*
 * The schema: numbered migrations compiled into the binary. PRAGMA
 * user_version holds how many have been applied; each runs in its own
 * transaction together with the user_version bump, so a crash mid-migration
 * leaves the previous version intact. PRAGMA application_id marks the file as
 * Jackdaw's, so a foreign SQLite database is refused instead of written to.
 *
 * Migrations are append-only: never edit one that has shipped; add the next.
 *
 * Threading: called once by jd_store_open on the opening thread, before the
 * writer starts.
 */
#include "storage/store_impl.h"

#include "common/error.h"

#include <stdio.h>

static const char *const migrations[] = {
    /* 1: jobs, their history, queues, idempotency keys.
     *
     * Layout is chosen for write amplification: WAL commits whole pages, so
     * the rows that change often are kept small and the rows that only grow
     * are appended. A job's definition (hundreds of bytes, never updated)
     * lives in job_definitions, so the jobs rows a running job updates pack
     * ~40 to a page; events are appended in rowid order (the history of
     * all jobs shares the last pages) and found through (job_id, seq). */
    "CREATE TABLE jobs ("
    "  id INTEGER PRIMARY KEY,"
    "  queue TEXT NOT NULL,"
    "  priority INTEGER NOT NULL DEFAULT 0,"
    "  state INTEGER NOT NULL CHECK (state BETWEEN 0 AND 5),"
    "  run_at_ms INTEGER NOT NULL DEFAULT 0,"
    "  attempts INTEGER NOT NULL DEFAULT 0,"
    "  version INTEGER NOT NULL DEFAULT 1,"
    "  output TEXT,"
    "  error TEXT,"
    "  created_ms INTEGER NOT NULL,"
    "  updated_ms INTEGER NOT NULL,"
    "  started_ms INTEGER NOT NULL DEFAULT 0,"
    "  finished_ms INTEGER NOT NULL DEFAULT 0,"
    "  idempotency_key TEXT"
    ") STRICT;"
    "CREATE TABLE job_definitions ("
    "  job_id INTEGER PRIMARY KEY,"
    "  definition TEXT NOT NULL"
    ") STRICT;"
    /* list by state, newest first (rowid order within one state) */
    "CREATE INDEX jobs_state ON jobs(state);"
    /* list by queue and state, newest first */
    "CREATE INDEX jobs_queue_state ON jobs(queue, state);"
    /* retention: terminal jobs by finish time */
    "CREATE INDEX jobs_finished ON jobs(finished_ms) WHERE state >= 3;"
    "CREATE UNIQUE INDEX jobs_idem ON jobs(idempotency_key) WHERE idempotency_key IS NOT NULL;"
    "CREATE TABLE events ("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER NOT NULL,"
    "  seq INTEGER NOT NULL,"
    "  time_ms INTEGER NOT NULL,"
    "  kind INTEGER NOT NULL CHECK (kind BETWEEN 0 AND 4),"
    "  tag INTEGER NOT NULL DEFAULT 0,"
    "  data TEXT"
    ") STRICT;"
    /* a job's history in order, "after seq", and deletion by job */
    "CREATE UNIQUE INDEX events_job_seq ON events(job_id, seq);"
    "CREATE TABLE queues ("
    "  name TEXT PRIMARY KEY,"
    "  paused INTEGER NOT NULL DEFAULT 0"
    ") STRICT, WITHOUT ROWID;"
    "CREATE TABLE idempotency ("
    "  key TEXT PRIMARY KEY,"
    "  job_id INTEGER NOT NULL,"
    "  fingerprint TEXT,"
    "  created_ms INTEGER NOT NULL"
    ") STRICT, WITHOUT ROWID;",

    /* 2: counts per queue and state kept by triggers (so /v1/queues and
     * /metrics never scan jobs), list by queue alone, the recovery index,
     * and a high-water mark of deleted ids (so retention never lets an id
     * be handed out twice). */
    "CREATE INDEX jobs_queue ON jobs(queue);"
    "CREATE INDEX jobs_active ON jobs(id) WHERE state < 3;"
    "CREATE TABLE queue_counts ("
    "  queue TEXT NOT NULL,"
    "  state INTEGER NOT NULL,"
    "  n INTEGER NOT NULL,"
    "  PRIMARY KEY (queue, state)"
    ") STRICT, WITHOUT ROWID;"
    "INSERT INTO queue_counts(queue, state, n)"
    "  SELECT queue, state, count(*) FROM jobs GROUP BY queue, state;"
    "CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs BEGIN"
    "  INSERT INTO queue_counts(queue, state, n) VALUES (new.queue, new.state, 1)"
    "    ON CONFLICT(queue, state) DO UPDATE SET n = n + 1;"
    "END;"
    "CREATE TRIGGER jobs_count_update AFTER UPDATE OF state ON jobs"
    "  WHEN old.state <> new.state BEGIN"
    "  UPDATE queue_counts SET n = n - 1 WHERE queue = old.queue AND state = old.state;"
    "  INSERT INTO queue_counts(queue, state, n) VALUES (new.queue, new.state, 1)"
    "    ON CONFLICT(queue, state) DO UPDATE SET n = n + 1;"
    "END;"
    "CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs BEGIN"
    "  UPDATE queue_counts SET n = n - 1 WHERE queue = old.queue AND state = old.state;"
    "END;"
    "CREATE TABLE meta ("
    "  key TEXT PRIMARY KEY,"
    "  value INTEGER NOT NULL"
    ") STRICT, WITHOUT ROWID;",

    /* 3: schedules and their history, and which schedule made a job.
     *
     * A schedule row changes on every fire (next/last fire, counts), so
     * its definition rides along: schedules are few next to jobs and one
     * fire writes one row either way. The history is appended like job
     * events and trimmed to the newest JD_SCHEDULE_EVENTS_KEEP per
     * schedule by the writer. jobs.schedule_id is NULL for every job a
     * schedule did not make, so the partial index costs those nothing. */
    "ALTER TABLE jobs ADD COLUMN schedule_id TEXT;"
    "CREATE INDEX jobs_schedule ON jobs(schedule_id, id) WHERE schedule_id IS NOT NULL;"
    "CREATE TABLE schedules ("
    "  id TEXT PRIMARY KEY,"
    "  definition TEXT NOT NULL,"
    "  paused INTEGER NOT NULL DEFAULT 0,"
    "  retired INTEGER NOT NULL DEFAULT 0,"
    "  next_fire_ms INTEGER NOT NULL DEFAULT 0,"
    "  anchor_ms INTEGER NOT NULL DEFAULT 0,"
    "  last_fire_ms INTEGER NOT NULL DEFAULT 0,"
    "  last_job_id INTEGER NOT NULL DEFAULT 0,"
    "  last_outcome TEXT,"
    "  fires INTEGER NOT NULL DEFAULT 0,"
    "  skips INTEGER NOT NULL DEFAULT 0,"
    "  event_seq INTEGER NOT NULL DEFAULT 0,"
    "  created_ms INTEGER NOT NULL,"
    "  updated_ms INTEGER NOT NULL"
    ") STRICT;"
    "CREATE TABLE schedule_events ("
    "  id INTEGER PRIMARY KEY,"
    "  schedule_id TEXT NOT NULL,"
    "  seq INTEGER NOT NULL,"
    "  time_ms INTEGER NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  fire_ms INTEGER NOT NULL DEFAULT 0,"
    "  job_id INTEGER NOT NULL DEFAULT 0,"
    "  data TEXT"
    ") STRICT;"
    "CREATE UNIQUE INDEX schedule_events_seq ON schedule_events(schedule_id, seq);",

    /* 4: how many times in a row the process died while a job was being
     * run (poison jobs: the job layer quarantines one at --max-replays).
     * Not part of the job's history: setting it appends no event. */
    "ALTER TABLE jobs ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0;",
    /* 5 (queue controls): a queue's max_running, rate and retention (the
     * config JSON, read back at start), its retention per terminal state
     * in columns the writer's retention pass reads (0: --retention), and
     * an index for that pass, which then walks each (queue, state) by
     * finish time instead of one global finish-time order. */
    "ALTER TABLE queues ADD COLUMN config TEXT;"
    "ALTER TABLE queues ADD COLUMN retain_succeeded_ms INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE queues ADD COLUMN retain_failed_ms INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE queues ADD COLUMN retain_cancelled_ms INTEGER NOT NULL DEFAULT 0;"
    "CREATE INDEX jobs_queue_finished ON jobs(queue, state, finished_ms) WHERE state >= 3;",

    /* 6 (unique jobs): the unique key a job holds, written in the commit
     * of its insert and deleted in the commit that ends its window (its
     * final state, or its start for "while": "queued"), so a crash can
     * never leave two jobs with one key or a key held by a finished job.
     * expires_ms (0: none) bounds the hold ("for_ms"); job_id finds the
     * key to release. */
    "CREATE TABLE unique_keys ("
    "  key TEXT PRIMARY KEY,"
    "  job_id INTEGER NOT NULL,"
    "  expires_ms INTEGER NOT NULL DEFAULT 0"
    ") STRICT, WITHOUT ROWID;"
    "CREATE INDEX unique_keys_job ON unique_keys(job_id);",
    /* 7 (finding jobs, issue 19): labels, handler and creation time indexed.
     *
     * job_labels holds one row per label of a job, keyed (key, value, job_id)
     * so "jobs with this label, newest first" is one index range. Rows are
     * written and deleted by triggers on job_definitions, from the labels of
     * the definition itself (JSON functions), so the label rows and the job
     * are one commit by construction and retention or delete removes both;
     * the WHEN clauses keep jobs without labels from paying for a JSON
     * parse. jobs.handler is the top-level "handler" of a single-call job
     * (NULL for workflows and process jobs, so the partial index costs them
     * nothing; the writer stores it with the row, as the job layer names
     * it, so no JSON is parsed for it). Existing jobs are backfilled here. */
    "CREATE TABLE job_labels ("
    "  key TEXT NOT NULL,"
    "  value TEXT NOT NULL,"
    "  job_id INTEGER NOT NULL,"
    "  PRIMARY KEY (key, value, job_id)"
    ") STRICT, WITHOUT ROWID;"
    "ALTER TABLE jobs ADD COLUMN handler TEXT;"
    "CREATE INDEX jobs_handler ON jobs(handler) WHERE handler IS NOT NULL;"
    "CREATE INDEX jobs_created ON jobs(created_ms);"
    "CREATE TRIGGER job_labels_insert AFTER INSERT ON job_definitions"
    "  WHEN instr(new.definition, '\"labels\":') > 0 BEGIN"
    "  INSERT OR IGNORE INTO job_labels(key, value, job_id)"
    "    SELECT key, value, new.job_id FROM json_each(new.definition, '$.labels')"
    "    WHERE type = 'text';"
    "END;"
    "CREATE TRIGGER job_labels_delete BEFORE DELETE ON job_definitions"
    "  WHEN instr(old.definition, '\"labels\":') > 0 BEGIN"
    "  DELETE FROM job_labels WHERE (key, value, job_id) IN"
    "    (SELECT key, value, old.job_id FROM json_each(old.definition, '$.labels')"
    "     WHERE type = 'text');"
    "END;"
    "INSERT OR IGNORE INTO job_labels(key, value, job_id)"
    "  SELECT l.key, l.value, d.job_id FROM job_definitions d, json_each(d.definition, '$.labels') "
    "l"
    "  WHERE instr(d.definition, '\"labels\":') > 0 AND l.type = 'text';"
    "UPDATE jobs SET handler = (SELECT json_extract(d.definition, '$.handler')"
    "  FROM job_definitions d WHERE d.job_id = jobs.id AND json_type(d.definition, '$.handler')"
    "  = 'text');",

    /* 8 (performance round 2, issue 17): the writer keeps queue_counts for
     * inserts and state changes itself, adding each (queue, state) pair's
     * net change once per transaction (storage/writer.c, struct qcounts);
     * the per-row triggers cost ~12 us a job. Retention's deletes are
     * still counted by jobs_count_delete. */
    "DROP TRIGGER jobs_count_insert;"
    "DROP TRIGGER jobs_count_update;",

    /* 9: remote commands (served by workers over HTTP) and their claimed
     * tasks. A task row is written when a worker claims it and updated
     * when it ends, so that after a restart its id still answers (409:
     * completed, or lease lost) rather than 404; a task that was only
     * waiting has no row (the job's dispatch event is its record).
     * Rows go with their job (retention). */
    "CREATE TABLE remote_commands ("
    "  name TEXT PRIMARY KEY,"
    "  timeout_ms INTEGER NOT NULL DEFAULT 0,"
    "  description TEXT,"
    "  created_ms INTEGER NOT NULL,"
    "  updated_ms INTEGER NOT NULL"
    ") STRICT;"
    "CREATE TABLE tasks ("
    "  id TEXT PRIMARY KEY,"
    "  job_id INTEGER NOT NULL,"
    "  tag INTEGER NOT NULL,"
    "  attempt INTEGER NOT NULL,"
    "  command TEXT NOT NULL,"
    "  state INTEGER NOT NULL,"
    "  worker TEXT,"
    "  lease_expires_ms INTEGER NOT NULL DEFAULT 0,"
    "  updated_ms INTEGER NOT NULL"
    ") STRICT;"
    "CREATE INDEX tasks_job ON tasks(job_id);"
    /* A worker's progress (a heartbeat's) is a history event of its own
     * kind (5): the events table is rebuilt with the wider CHECK, once. */
    "CREATE TABLE events_v4 ("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER NOT NULL,"
    "  seq INTEGER NOT NULL,"
    "  time_ms INTEGER NOT NULL,"
    "  kind INTEGER NOT NULL CHECK (kind BETWEEN 0 AND 5),"
    "  tag INTEGER NOT NULL DEFAULT 0,"
    "  data TEXT"
    ") STRICT;"
    "INSERT INTO events_v4 SELECT id, job_id, seq, time_ms, kind, tag, data FROM events;"
    "DROP TABLE events;"
    "ALTER TABLE events_v4 RENAME TO events;"
    "CREATE UNIQUE INDEX events_job_seq ON events(job_id, seq);",

    /* 10 (the queued-job window, issue 17 item 4): the store pages queued
     * jobs into memory in each queue's run order (priority descending,
     * then id), and those scheduled for later by the time they are due.
     * run_at_ms rides in jobs_queued so a page skips the jobs not yet due
     * without reading their rows. A job submitted without a delay has
     * run_at_ms == created_ms, so jobs_queued_later holds only the delayed
     * (and retried) ones. Both are partial: a job leaves them as it starts. */
    "CREATE INDEX jobs_queued ON jobs(queue, priority DESC, id, run_at_ms) WHERE state = 0;"
    "CREATE INDEX jobs_queued_later ON jobs(run_at_ms, id)"
    "  WHERE state = 0 AND run_at_ms > created_ms;",

    /* 11 (performance round 2, issue 17): retention walks every (queue,
     * terminal state) on jobs_queue_finished, with or without queue
     * retention, so the global finish-time index is not needed; it cost
     * every job's end one more index insert (~5 us in SQLite alone). */
    "DROP INDEX jobs_finished;",

    /* 12 (queue controls, issue 19): a remote command's own cap on its
     * calls in flight, given at registration (0: none; --command-limit for
     * the same name takes precedence). */
    "ALTER TABLE remote_commands ADD COLUMN max_in_flight INTEGER NOT NULL DEFAULT 0;",

    /* 13 (performance round 2, issue 17): recovery without the window
     * reads the queued, running and waiting ranges of jobs_state and
     * merges them by id, so the index of non-terminal jobs is not needed;
     * it cost every job an index insert at submit and a delete at its end. */
    "DROP INDEX jobs_active;",

    /* 14 (fewer history rows per job, issues 16 and 17): an events row
     * holds a run of one job's consecutive events written in one commit,
     * the first in its own columns and the rest packed in `more`
     * (store_impl.h, "packed runs"). Every older row is a run of one
     * (more NULL), so nothing is rewritten. */
    "ALTER TABLE events ADD COLUMN more TEXT;",
};

#define N_MIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))

int jd_store_schema_version(void)
{
    return N_MIGRATIONS;
}

/* One integer from a one-row query; SQLite rc. */
static int query_int(sqlite3 *db, const char *sql, int64_t *out)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *out = sqlite3_column_int64(st, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc;
}

static int fail_sqlite(sqlite3 *db, int rc, const char *path, const char *what,
                       struct jd_error *err)
{
    int code = jd_store_sqlite_rc(rc);
    if (rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT)
        return jd_error_set(err, code, NULL, "database %s is corrupt or not a database (%s: %s)",
                            path, what, sqlite3_errmsg(db));
    return jd_error_set(err, code, NULL, "database %s: %s failed: %s", path, what,
                        sqlite3_errmsg(db));
}

int jd_schema_migrate(sqlite3 *db, const char *path, struct jd_error *err)
{
    int64_t version = 0, app_id = 0, objects = 0;
    int rc = query_int(db, "PRAGMA user_version", &version);
    if (rc == SQLITE_OK)
        rc = query_int(db, "PRAGMA application_id", &app_id);
    if (rc == SQLITE_OK)
        rc = query_int(db, "SELECT count(*) FROM sqlite_schema", &objects);
    if (rc != SQLITE_OK)
        return fail_sqlite(db, rc, path, "reading the schema", err);

    if (app_id != JD_SCHEMA_APP_ID && (objects > 0 || version != 0 || app_id != 0))
        return jd_error_set(err, JD_ECORRUPT, NULL,
                            "database %s is not a Jackdaw database (application_id %lld, "
                            "%lld schema objects); refusing to use it",
                            path, (long long)app_id, (long long)objects);
    if (version > N_MIGRATIONS)
        return jd_error_set(err, JD_ECORRUPT, NULL,
                            "database %s has schema version %lld, newer than this Jackdaw "
                            "understands (%d); upgrade Jackdaw or use another file",
                            path, (long long)version, N_MIGRATIONS);

    for (int v = (int)version; v < N_MIGRATIONS; v++) {
        char bump[96];
        snprintf(bump, sizeof bump, "PRAGMA user_version = %d; PRAGMA application_id = %d;", v + 1,
                 JD_SCHEMA_APP_ID);
        rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        if (rc == SQLITE_OK)
            rc = sqlite3_exec(db, migrations[v], NULL, NULL, NULL);
        if (rc == SQLITE_OK)
            rc = sqlite3_exec(db, bump, NULL, NULL, NULL);
        if (rc == SQLITE_OK)
            rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
        if (rc != SQLITE_OK) {
            char what[64];
            snprintf(what, sizeof what, "migration to schema version %d", v + 1);
            int code = fail_sqlite(db, rc, path, what, err);
            if (!sqlite3_get_autocommit(db))
                sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
            return code;
        }
    }
    return 0;
}
