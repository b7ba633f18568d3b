/*
 * The writer thread: the only user of the write connection.
 *
 * Producers push struct jd_write records onto a lock-free stack (one CAS;
 * jd_store_submit_many pushes its records as one chain, so a group is always
 * contiguous). The writer takes the whole stack with one exchange, reverses
 * it into submission order and commits up to max_batch records (whole groups)
 * in one BEGIN IMMEDIATE ... COMMIT. The batch is first applied without
 * savepoints; if a record fails on its own (a duplicate idempotency key, a
 * change to a missing job) the transaction is rolled back and the batch
 * redone with each record, or each group, inside its own SAVEPOINT, so the
 * record fails alone and a group stays all-or-nothing. An error that is not the record's fault
 * (disk full, I/O) rolls the whole transaction back and fails every record in it with JD_EIO. Only
 * after COMMIT returns are the done() callbacks called, in order: nothing is reported durable that
 * is not.
 *
 * Between commits, when due, the writer deletes one small batch of expired
 * terminal jobs (retention), so writers wait at most one small transaction.
 *
 * Wake-up protocol (no lost wake-ups): a producer whose push found the stack
 * empty reads writer_sleeping after its push; the writer sets
 * writer_sleeping before re-checking the stack. Both sides use seq_cst, so at
 * least one of them sees the other's write (Dekker); the signal is sent under
 * mu, which the writer holds while it re-checks and waits.
 *
 * Completion thread (opt-in, jd_store_done_thread): after COMMIT the writer
 * appends the batch, in order, to a mutex-guarded FIFO and goes on with the
 * next transaction; one completion thread calls the done()s. Ordering and
 * "only after the commit" are unchanged; done() work (rendering responses,
 * waking connections, freeing jobs) leaves the serial writer.
 *
 * Threading: jd_store_submit, jd_store_submit_many and jd_store_sync from any
 * thread (sync never from a done()); everything else here runs on the writer
 * thread, except jd_writer_start/stop and jd_store_done_thread (the
 * opening/closing thread) and done_main (the completion thread).
 */
#include "storage/store_impl.h"
#include "storage/pg.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define JD_RETENTION_BATCH 128 /* jobs per retention transaction: a few ms of writer time */
#define JD_RETENTION_MAX_INTERVAL_MS 1000 /* expired jobs go within a second of expiring */

static const char *const writer_sql[JD_WS_N] = {
    [JD_WS_BEGIN] = "BEGIN IMMEDIATE",
    [JD_WS_COMMIT] = "COMMIT",
    [JD_WS_ROLLBACK] = "ROLLBACK",
    [JD_WS_SAVEPOINT] = "SAVEPOINT r",
    [JD_WS_RELEASE] = "RELEASE r",
    [JD_WS_ROLLBACK_TO] = "ROLLBACK TO r",
    [JD_WS_IDEM_INSERT] = "INSERT INTO idempotency(key, job_id, fingerprint, created_ms)"
                          " VALUES (?1, ?2, ?3, ?4) ON CONFLICT(key) DO NOTHING",
    [JD_WS_IDEM_GET] = "SELECT job_id FROM idempotency WHERE key = ?1",
    [JD_WS_JOB_INSERT] = "INSERT INTO jobs(id, queue, priority, state, run_at_ms,"
                         " attempts, version, created_ms, updated_ms, started_ms, finished_ms,"
                         " idempotency_key, schedule_id, handler)"
                         " VALUES (?1, ?2, ?3, ?4, ?6, 0, 1, ?7, ?7, 0, ?8, ?9, ?10, ?11)",
    [JD_WS_DEF_INSERT] = "INSERT INTO job_definitions(job_id, definition) VALUES (?1, ?2)",
    /* A change that sets no field (a history append); changes that set
     * fields use update_stmt(), one statement per JD_SET_* combination, so
     * an append never rewrites the state indexes or fires the count trigger. */
    [JD_WS_JOB_UPDATE] = "UPDATE jobs SET version = ?3, updated_ms = ?2 WHERE id = ?1",
    [JD_WS_VERSION_GET] = "SELECT version, state, queue FROM jobs WHERE id = ?1",
    [JD_WS_EVENT_INSERT] = "INSERT INTO events(job_id, seq, time_ms, kind, tag, data, id, more)"
                           " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    [JD_WS_QUEUE_UPSERT] = "INSERT INTO queues(name, paused) VALUES (?1, ?2)"
                           " ON CONFLICT(name) DO UPDATE SET paused = excluded.paused",
    [JD_WS_RET_DEL_EVENTS] = "DELETE FROM events WHERE job_id = ?1",
    [JD_WS_RET_DEL_JOB] = "DELETE FROM jobs WHERE id = ?1",
    [JD_WS_RET_DEL_DEF] = "DELETE FROM job_definitions WHERE job_id = ?1",
    [JD_WS_RET_DEL_IDEM] = "DELETE FROM idempotency WHERE key = ?1 AND job_id = ?2",
    [JD_WS_RET_MAX_ID] = "INSERT INTO meta(key, value) VALUES ('max_deleted_id', ?1)"
                         " ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)",
    /* with every deletion of events: the newest event id so far, so a restart
     * after the newest events were deleted still hands out higher ones */
    [JD_WS_RET_MAX_EVENT] = "INSERT INTO meta(key, value) VALUES ('max_deleted_event_id', ?1)"
                            " ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)",
    [JD_WS_SCHED_UPSERT] =
        "INSERT INTO schedules(id, definition, paused, retired, next_fire_ms, anchor_ms,"
        " created_ms, updated_ms) VALUES (?1, ?2, ?3, ?7, ?4, ?6, ?5, ?5) ON CONFLICT(id) DO"
        " UPDATE SET definition = excluded.definition, paused = excluded.paused,"
        " retired = excluded.retired,"
        " next_fire_ms = excluded.next_fire_ms, anchor_ms = excluded.anchor_ms,"
        " updated_ms = excluded.updated_ms",
    /* One statement for every combination of JD_SSET_* (?3 is the mask):
     * schedule changes are one per fire, so a statement per mask would buy
     * nothing. */
    [JD_WS_SCHED_UPDATE] = "UPDATE schedules SET"
                           " paused = iif(?3 & 1, ?4, paused),"
                           " retired = iif(?3 & 2, ?5, retired),"
                           " next_fire_ms = iif(?3 & 4, ?6, next_fire_ms),"
                           " last_fire_ms = iif(?3 & 8, ?7, last_fire_ms),"
                           " last_job_id = iif(?3 & 8, ?8, last_job_id),"
                           " last_outcome = iif(?3 & 8, ?9, last_outcome),"
                           " fires = fires + ?10, skips = skips + ?11,"
                           " event_seq = event_seq + ?12, updated_ms = ?2"
                           " WHERE id = ?1 AND (?13 = 0 OR next_fire_ms = ?13)"
                           " RETURNING event_seq",
    [JD_WS_SCHED_EVENT] = "INSERT INTO schedule_events(schedule_id, seq, time_ms, kind, fire_ms,"
                          " job_id, data) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    [JD_WS_SCHED_TRIM] = "DELETE FROM schedule_events WHERE schedule_id = ?1 AND seq <= ?2",
    [JD_WS_SCHED_DELETE] = "DELETE FROM schedules WHERE id = ?1",
    [JD_WS_SCHED_DEL_EVENTS] = "DELETE FROM schedule_events WHERE schedule_id = ?1",
    [JD_WS_JOB_CRASHES] = "UPDATE jobs SET crashes = ?2 WHERE id = ?1",
    [JD_WS_QUEUE_CONFIG] =
        "INSERT INTO queues(name, paused, config, retain_succeeded_ms, retain_failed_ms,"
        " retain_cancelled_ms) VALUES (?1, 0, ?2, ?3, ?4, ?5) ON CONFLICT(name) DO UPDATE SET"
        " config = excluded.config, retain_succeeded_ms = excluded.retain_succeeded_ms,"
        " retain_failed_ms = excluded.retain_failed_ms,"
        " retain_cancelled_ms = excluded.retain_cancelled_ms",
    /* Every (queue, terminal state) that has jobs, with the queue's own
     * retention for that state (0: the global one). */
    [JD_WS_RET_QUEUES] =
        "SELECT queue_counts.queue, queue_counts.state, coalesce(CASE queue_counts.state"
        " WHEN 3 THEN retain_succeeded_ms WHEN 4 THEN retain_failed_ms"
        " ELSE retain_cancelled_ms END, 0)"
        " FROM queue_counts LEFT JOIN queues ON queues.name = queue_counts.queue"
        " WHERE queue_counts.state >= 3 AND queue_counts.n > 0",
    /* "state >= 3" lets SQLite use the partial index jobs_queue_finished. */
    /* Take the key unless a live hold has it: a row whose job is gone or
     * terminal (never left by this writer: a backstop) or whose hold
     * expired is taken over. No change: held. */
    [JD_WS_UNIQUE_TAKE] =
        "INSERT INTO unique_keys(key, job_id, expires_ms) VALUES (?1, ?2, ?3)"
        " ON CONFLICT(key) DO UPDATE SET job_id = excluded.job_id,"
        " expires_ms = excluded.expires_ms"
        " WHERE (unique_keys.expires_ms > 0 AND unique_keys.expires_ms <= ?4)"
        " OR NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = unique_keys.job_id AND"
        " jobs.state < 3)",
    [JD_WS_UNIQUE_HOLDER] = "SELECT job_id FROM unique_keys WHERE key = ?1",
    [JD_WS_UNIQUE_RELEASE] = "DELETE FROM unique_keys WHERE job_id = ?1",
    [JD_WS_RET_DEL_UNIQUE] = "DELETE FROM unique_keys WHERE job_id = ?1",
    [JD_WS_RET_SELECT_QS] = "SELECT id, idempotency_key FROM jobs WHERE queue = ?1 AND state = ?2"
                            " AND state >= 3 AND finished_ms < ?3 LIMIT ?4",
    /* Only a terminal job: a retry racing the delete wins or loses whole. */
    [JD_WS_JOB_DELETE] = "DELETE FROM jobs WHERE id = ?1 AND state >= 3 RETURNING idempotency_key",
    [JD_WS_JOB_STATE] = "SELECT state FROM jobs WHERE id = ?1",
    /* queue_counts: the writer adds what a transaction changed, once per
     * (queue, state) (see struct qcounts) */
    [JD_WS_COUNT_ADD] = "INSERT INTO queue_counts(queue, state, n) VALUES (?1, ?2, ?3)"
                        " ON CONFLICT(queue, state) DO UPDATE SET n = n + excluded.n",
    [JD_WS_RCMD_UPSERT] = "INSERT INTO remote_commands(name, timeout_ms, description, created_ms,"
                          " updated_ms, max_in_flight) VALUES (?1, ?2, ?3, ?4, ?4, ?5)"
                          " ON CONFLICT(name) DO UPDATE SET timeout_ms = excluded.timeout_ms,"
                          " description = excluded.description, updated_ms = excluded.updated_ms,"
                          " max_in_flight = excluded.max_in_flight",
    [JD_WS_RCMD_DELETE] = "DELETE FROM remote_commands WHERE name = ?1",
    [JD_WS_TASK_UPSERT] = "INSERT INTO tasks(id, job_id, tag, attempt, command, state, worker,"
                          " lease_expires_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8,"
                          " ?9) ON CONFLICT(id) DO UPDATE SET state = excluded.state,"
                          " worker = excluded.worker,"
                          " lease_expires_ms = excluded.lease_expires_ms,"
                          " updated_ms = excluded.updated_ms",
    [JD_WS_RET_DEL_TASKS] = "DELETE FROM tasks WHERE job_id = ?1",
};

/* Step a statement to completion and reset it; the SQLite result. */
static int run(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? SQLITE_DONE : rc;
}

/* A statement error that is the record's own fault (its savepoint is rolled
 * back, the rest of the batch commits) -> its JD_E* code; anything else ->
 * JD_EIO, which aborts the transaction. */
static int record_error(int rc)
{
    switch (rc) {
    case SQLITE_CONSTRAINT_PRIMARYKEY:
    case SQLITE_CONSTRAINT_UNIQUE:
        return JD_EEXIST;
    default:
        break;
    }
    switch (rc & 0xff) {
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
    case SQLITE_TOOBIG:
        return JD_EINVAL;
    default:
        return JD_EIO;
    }
}

static void bind_text(sqlite3_stmt *st, int i, const char *s)
{
    /* SQLITE_STATIC: the record's strings outlive the statement's use,
     * which ends before done() is called. */
    if (s)
        sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

/* Versions of the jobs written in the current optimistic transaction, so a
 * job's second and later records in a batch need no version read, and a
 * history append (a change that sets no field) need not rewrite the jobs
 * row at once: its version and updated_ms are written once per job when
 * the batch ends (vc_flush), or by the job's next field-setting UPDATE,
 * which sets both anyway. Open addressing on job_id, cleared per batch;
 * not used on the savepoint path (a rollback to a savepoint would make it
 * stale). */
struct vslot {
    int64_t job_id; /* 0: empty */
    int64_t version;
    const char *queue; /* the job's queue, owned by the batch's qcounts */
    int state;         /* the job's state as this transaction left it */
    bool dirty;        /* the jobs row still has an older version/updated_ms */
};

/* An event row waiting in the batch's buffer (struct vcache.ev): the
 * first event of a run of the job's consecutive events, the rest packed
 * in more (store_impl.h; more.n counts the run, the first included). Its
 * ids are handed out as it is inserted. */
struct evrow {
    int64_t job_id, seq, time_ms;
    int64_t tag;
    int kind;
    const char *data;      /* static, or the record's: both outlive the batch */
    struct jd_evpack more; /* its buffer is kept across batches (freed with the vcache) */
};

/* What the last committed transactions left in a jobs row, for the jobs
 * they wrote: a job's change in a later batch needs no version read when
 * its job is here (a direct-mapped cache: a colliding job replaces the
 * entry). Filled from a batch's vslots after its COMMIT; emptied whenever
 * it could be wrong: a batch that failed or took the savepoint path, a
 * job deleted (JD_W_JOB_DELETE, retention), the queue names dropped. */
#define JD_KNOWN_SLOTS 8192
struct known {
    int64_t job_id; /* 0: empty */
    int64_t version;
    const char *queue; /* owned by the writer's qcounts (kept across batches) */
    int state;
};

struct vcache {
    struct vslot *t;
    size_t cap;          /* a power of two, at least twice the batch */
    struct qcounts *qc;  /* the writer's queue counts (both paths) */
    struct known *known; /* JD_KNOWN_SLOTS entries */
    bool known_stale;    /* this batch deleted a job: empty known after it */
    /* Event rows of the optimistic transaction not yet inserted: kept
     * until the batch ends, or until a record that is not a job insert or
     * change comes (so a statement that reads or deletes events never
     * misses one), then written JD_EV_ROWS at a time by multi-row INSERTs
     * (a statement's fixed cost, cursors opened and closed, is ~30 % of a
     * one-row insert; ev_flush). Kept that long so that a job's next event
     * joins its row while the run has room: every row saved is a B-tree
     * insert into events and one into events_job_seq. evm maps a job to
     * its newest row (valid while row < nev and that row is the job's). */
    struct evrow *ev;
    size_t nev, evcap;
    struct evmap {
        int64_t job_id; /* 0: empty */
        size_t row;
    } * evm;
    size_t evmcap;
};

static void vc_reset(struct vcache *c, size_t n)
{
    c->t = jd_idtab_reset(c->t, &c->cap, sizeof *c->t, n);
    c->evm = jd_idtab_reset(c->evm, &c->evmcap, sizeof *c->evm, n);
    c->nev = 0;
}

/* The writer is idle after a large drain (jd_store_release_memory): the
 * batch buffers go (the event rows' packed runs, one block each, are spread
 * over the heap and keep its pages resident); the next batch grows them
 * again. */
static void vc_release(struct vcache *c)
{
    for (size_t i = 0; i < c->evcap; i++)
        free(c->ev[i].more.p);
    free(c->ev);
    c->ev = NULL;
    c->evcap = c->nev = 0;
    free(c->t);
    c->t = NULL;
    c->cap = 0;
    free(c->evm);
    c->evm = NULL;
    c->evmcap = 0;
}

static struct known *known_slot(struct vcache *c, int64_t job_id)
{
    return &c->known[((uint64_t)job_id * 0x9E3779B97F4A7C15ull >> 32) & (JD_KNOWN_SLOTS - 1)];
}

static void known_clear(struct vcache *c)
{
    memset(c->known, 0, JD_KNOWN_SLOTS * sizeof *c->known);
    c->known_stale = false;
}

/* After a batch committed on the optimistic path: remember what it wrote. */
static void known_absorb(struct vcache *c)
{
    if (c->known_stale) {
        known_clear(c);
        return;
    }
    for (size_t i = 0; i < c->cap; i++)
        if (c->t[i].job_id != 0)
            *known_slot(c, c->t[i].job_id) = (struct known){.job_id = c->t[i].job_id,
                                                            .version = c->t[i].version,
                                                            .queue = c->t[i].queue,
                                                            .state = c->t[i].state};
}

static struct vslot *vc_slot(struct vcache *c, int64_t job_id)
{
    size_t i = jd_idtab_home(job_id, c->cap);
    while (c->t[i].job_id != 0 && c->t[i].job_id != job_id)
        i = (i + 1) & (c->cap - 1);
    return &c->t[i];
}

/* "INSERT INTO events ... VALUES (...) x n", prepared on first use. */
static sqlite3_stmt *events_stmt(struct jd_store *s, size_t n)
{
    if (n == 1)
        return s->wst[JD_WS_EVENT_INSERT];
    if (s->ev_rows[n])
        return s->ev_rows[n];
    char sql[80 + JD_EV_ROWS * 28] =
        "INSERT INTO events(job_id, seq, time_ms, kind, tag, data, id, more)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)";
    for (size_t i = 1; i < n; i++)
        strcat(sql, ", (?, ?, ?, ?, ?, ?, ?, ?)");
    if (sqlite3_prepare_v3(s->wdb, sql, -1, SQLITE_PREPARE_PERSISTENT, &s->ev_rows[n], NULL) !=
        SQLITE_OK) {
        jd_log(JD_LOG_ERROR, "storage: preparing an event insert failed", "db", s->path, "error",
               sqlite3_errmsg(s->wdb), NULL);
        return NULL;
    }
    return s->ev_rows[n];
}

/* Insert rows[0..n) with one statement, each with the next ids (a run of
 * k events takes k: see jd_store.event_max); 0 or the record error. An id
 * consumed by a rolled-back transaction leaves a gap, which readers do not
 * mind. */
static int insert_events(struct jd_store *s, const struct evrow *rows, size_t n)
{
    sqlite3_stmt *st = events_stmt(s, n);
    if (!st)
        return JD_EIO;
    for (size_t i = 0; i < n; i++) {
        const struct evrow *e = &rows[i];
        int b = (int)i * 8;
        sqlite3_bind_int64(st, b + 1, e->job_id);
        sqlite3_bind_int64(st, b + 2, e->seq);
        sqlite3_bind_int64(st, b + 3, e->time_ms);
        sqlite3_bind_int(st, b + 4, e->kind);
        sqlite3_bind_int64(st, b + 5, e->tag);
        bind_text(st, b + 6, e->data);
        sqlite3_bind_int64(st, b + 7, s->event_max + 1);
        s->event_max += e->more.n;
        if (e->more.n > 1)
            sqlite3_bind_text(st, b + 8, e->more.p, (int)e->more.len, SQLITE_STATIC);
        else
            sqlite3_bind_null(st, b + 8);
    }
    int rc = run(st);
    return rc == SQLITE_DONE ? 0 : record_error(sqlite3_extended_errcode(s->wdb));
}

/* Insert the buffered events; 0 or the record error. */
static int ev_flush(struct jd_store *s, struct vcache *vc)
{
    size_t n = vc->nev;
    vc->nev = 0;
    for (size_t i = 0; i < n; i += JD_EV_ROWS) {
        int rc = insert_events(s, vc->ev + i, n - i < JD_EV_ROWS ? n - i : JD_EV_ROWS);
        if (rc)
            return rc;
    }
    return 0;
}

/* Append one history event: into vc's buffer on the optimistic path
 * (vc != NULL), at once on the savepoint path. 0 or the record error; on
 * the batch path a failing multi-row INSERT fails the record that filled
 * the buffer, and the redo with savepoints finds the real one. */
static int append_event(struct jd_store *s, struct vcache *vc, int64_t job_id, int64_t seq,
                        int64_t now, enum jd_event_kind kind, uint32_t tag, const char *data)
{
    if (!vc) {
        struct evrow e = {.job_id = job_id,
                          .seq = seq,
                          .time_ms = now,
                          .tag = tag,
                          .kind = (int)kind,
                          .data = data,
                          .more = {.n = 1}};
        return insert_events(s, &e, 1);
    }
    /* the job's buffered run, if this event continues it */
    size_t h = jd_idtab_home(job_id, vc->evmcap);
    while (vc->evm[h].job_id != 0 && vc->evm[h].job_id != job_id)
        h = (h + 1) & (vc->evmcap - 1);
    struct evmap *m = &vc->evm[h];
    if (m->job_id == job_id && m->row < vc->nev) {
        struct evrow *r = &vc->ev[m->row];
        if (r->job_id == job_id && r->seq + r->more.n == seq && r->more.n < JD_EV_RUN_MAX) {
            jd_evpack_put(&r->more, (int)kind, tag, now - r->time_ms, data);
            return 0;
        }
    }
    if (vc->nev == vc->evcap) {
        size_t cap = vc->evcap ? 2 * vc->evcap : 64;
        vc->ev = jd_xrealloc(vc->ev, cap * sizeof *vc->ev);
        memset(vc->ev + vc->evcap, 0, (cap - vc->evcap) * sizeof *vc->ev);
        vc->evcap = cap;
    }
    *m = (struct evmap){.job_id = job_id, .row = vc->nev};
    struct evrow *e = &vc->ev[vc->nev++];
    struct jd_evpack keep = e->more;
    *e = (struct evrow){.job_id = job_id,
                        .seq = seq,
                        .time_ms = now,
                        .tag = tag,
                        .kind = (int)kind,
                        .data = data,
                        .more = {.p = keep.p, .cap = keep.cap, .n = 1}};
    return 0;
}

/* Jobs per queue and state (queue_counts), kept here rather than by row
 * triggers: a trigger ran two statements per state change and one per
 * insert, about 12 us a job; this adds each (queue, state) pair's net change
 * once per transaction. Open addressing on the queue name; the names are
 * copies owned here, so a vslot may point at one for the whole batch. On
 * the savepoint path the changes are written (qc_flush) before each
 * RELEASE, or dropped (qc_clear) with a ROLLBACK TO. Deletes (retention)
 * are still counted by the jobs_count_delete trigger. Any other statement
 * that inserts jobs or changes jobs.state must count through here too. */
struct qcount {
    char *queue; /* NULL: empty */
    uint64_t hash;
    int64_t d[JD_JOB_NSTATES];
};

struct qcounts {
    struct qcount *t;
    size_t cap, n; /* cap: a power of two, n < cap / 2 */
};

static uint64_t qc_hash(const char *q)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *q; q++)
        h = (h ^ (unsigned char)*q) * 1099511628211ull;
    return h;
}

static struct qcount *qc_find(struct qcounts *c, const char *queue, uint64_t h)
{
    size_t i = (size_t)h & (c->cap - 1);
    while (c->t[i].queue && (c->t[i].hash != h || strcmp(c->t[i].queue, queue) != 0))
        i = (i + 1) & (c->cap - 1);
    return &c->t[i];
}

/* The entry for queue, made if new. */
static struct qcount *qc_entry(struct qcounts *c, const char *queue)
{
    if (2 * (c->n + 1) > c->cap) {
        struct qcounts g = {.cap = c->cap ? c->cap * 2 : 16};
        g.t = jd_xcalloc(g.cap, sizeof *g.t);
        for (size_t i = 0; i < c->cap; i++)
            if (c->t[i].queue)
                *qc_find(&g, c->t[i].queue, c->t[i].hash) = c->t[i];
        g.n = c->n;
        free(c->t);
        *c = g;
    }
    uint64_t h = qc_hash(queue);
    struct qcount *e = qc_find(c, queue, h);
    if (!e->queue) {
        e->queue = jd_xstrdup(queue);
        e->hash = h;
        c->n++;
    }
    return e;
}

/* Forget every change (the transaction, or a savepoint, rolled back); the
 * queue names stay (struct known points at them) until qc_drop. */
static void qc_clear(struct qcounts *c)
{
    if (c->n == 0)
        return;
    for (size_t i = 0; i < c->cap; i++)
        memset(c->t[i].d, 0, sizeof c->t[i].d);
}

#define JD_QC_NAMES_KEPT 256 /* distinct queue names kept between batches */

/* Free the queue names once more than keep are held (keep 0: all);
 * true when it did (whatever pointed at them must go too). */
static bool qc_drop(struct qcounts *c, size_t keep)
{
    if (c->n == 0 || c->n <= keep)
        return false;
    for (size_t i = 0; i < c->cap; i++) {
        free(c->t[i].queue);
        c->t[i] = (struct qcount){0};
    }
    c->n = 0;
    return true;
}

/* Write the net changes into queue_counts and clear; SQLite rc. */
static int qc_flush(struct jd_store *s, struct qcounts *c)
{
    sqlite3_stmt *st = s->wst[JD_WS_COUNT_ADD];
    int rc = SQLITE_DONE;
    for (size_t i = 0; i < c->cap && rc == SQLITE_DONE; i++) {
        if (!c->t[i].queue)
            continue;
        for (int k = 0; k < JD_JOB_NSTATES && rc == SQLITE_DONE; k++) {
            if (c->t[i].d[k] == 0)
                continue;
            sqlite3_bind_text(st, 1, c->t[i].queue, -1, SQLITE_STATIC);
            sqlite3_bind_int(st, 2, k);
            sqlite3_bind_int64(st, 3, c->t[i].d[k]);
            rc = run(st);
        }
    }
    qc_clear(c);
    return rc;
}

/* Write the deferred version/updated_ms of every dirty job; SQLite rc. */
static int vc_flush(struct jd_store *s, struct vcache *c, int64_t now)
{
    sqlite3_stmt *st = s->wst[JD_WS_JOB_UPDATE];
    for (size_t i = 0; i < c->cap; i++) {
        if (!c->t[i].dirty)
            continue;
        sqlite3_bind_int64(st, 1, c->t[i].job_id);
        sqlite3_bind_int64(st, 2, now);
        sqlite3_bind_int64(st, 3, c->t[i].version);
        int rc = run(st);
        if (rc != SQLITE_DONE)
            return rc;
        c->t[i].dirty = false;
    }
    return SQLITE_DONE;
}

/* Take w's unique key for job id; JD_ECONFLICT (w->job_id: the holder)
 * when a live hold has it. */
static int take_unique(struct jd_store *s, struct jd_write *w, int64_t id, int64_t now)
{
    sqlite3_stmt *st = s->wst[JD_WS_UNIQUE_TAKE];
    sqlite3_bind_text(st, 1, w->unique_key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, id);
    sqlite3_bind_int64(st, 3, w->unique_expires_ms);
    sqlite3_bind_int64(st, 4, now);
    if (run(st) != SQLITE_DONE)
        return record_error(sqlite3_extended_errcode(s->wdb));
    if (sqlite3_changes(s->wdb) > 0)
        return 0;
    st = s->wst[JD_WS_UNIQUE_HOLDER];
    sqlite3_bind_text(st, 1, w->unique_key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        w->job_id = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? JD_ECONFLICT : JD_EIO;
}

static int apply_insert(struct jd_store *s, struct jd_write *w, int64_t now, struct vcache *vc,
                        struct qcounts *qc)
{
    int64_t created;
    int rc0 = jd_write_insert_check(w, now, &created);
    if (rc0 != 0)
        return rc0;
    const struct jd_job *j = w->job;
    int64_t id = w->job_id;

    if (j->idempotency_key) {
        sqlite3_stmt *st = s->wst[JD_WS_IDEM_INSERT];
        sqlite3_bind_text(st, 1, j->idempotency_key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, id);
        bind_text(st, 3, w->idem_fingerprint);
        sqlite3_bind_int64(st, 4, created);
        if (run(st) != SQLITE_DONE)
            return record_error(sqlite3_extended_errcode(s->wdb));
        if (sqlite3_changes(s->wdb) == 0) {
            st = s->wst[JD_WS_IDEM_GET];
            sqlite3_bind_text(st, 1, j->idempotency_key, -1, SQLITE_STATIC);
            int rc = sqlite3_step(st);
            if (rc == SQLITE_ROW)
                w->job_id = sqlite3_column_int64(st, 0);
            sqlite3_reset(st);
            if (rc != SQLITE_ROW)
                return JD_EIO;
            return JD_EEXIST;
        }
    }

    if (w->unique_key) {
        int rc = take_unique(s, w, id, now);
        if (rc)
            return rc;
    }
    sqlite3_stmt *st = s->wst[JD_WS_JOB_INSERT];
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_text(st, 2, j->queue, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, j->priority);
    sqlite3_bind_int(st, 4, (int)j->state);
    sqlite3_bind_int64(st, 6, j->run_at_ms);
    sqlite3_bind_int64(st, 7, created);
    sqlite3_bind_int64(st, 8, jd_job_state_terminal(j->state) ? created : 0);
    bind_text(st, 9, j->idempotency_key);
    bind_text(st, 10, j->schedule_id);
    bind_text(st, 11, j->handler);
    if (run(st) != SQLITE_DONE)
        return record_error(sqlite3_extended_errcode(s->wdb));
    st = s->wst[JD_WS_DEF_INSERT];
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_text(st, 2, j->definition, -1, SQLITE_STATIC);
    if (run(st) != SQLITE_DONE)
        return record_error(sqlite3_extended_errcode(s->wdb));

    int rc = append_event(s, vc, id, 1, now, JD_EVK_STATE, 0, jd_state_event_data[j->state]);
    if (rc == 0) {
        w->version = 1;
        struct qcount *q = qc_entry(qc, j->queue);
        q->d[j->state]++;
        if (vc)
            *vc_slot(vc, id) = (struct vslot){
                .job_id = id, .version = 1, .queue = q->queue, .state = (int)j->state};
    }
    return rc;
}

/* The UPDATE for one combination of JD_SET_* flags, prepared on first use.
 * Parameters keep fixed numbers (?1 id, ?2 now, ?4 state, ?6 output, ...);
 * binding a number a statement does not use is harmless. A move to a
 * terminal state without an explicit finish time stamps it now, so retention
 * never sees a terminal job with finished_ms 0. */
static sqlite3_stmt *update_stmt(struct jd_store *s, unsigned set)
{
    if (set == 0)
        return s->wst[JD_WS_JOB_UPDATE];
    if (s->upd[set])
        return s->upd[set];
    char sql[512] = "UPDATE jobs SET version = ?3, updated_ms = ?2";
    static const char *const cols[7] = {
        ", state = ?4",     ", output = ?6",      ", error = ?8",        ", run_at_ms = ?10",
        ", attempts = ?12", ", started_ms = ?14", ", finished_ms = ?16",
    };
    for (int i = 0; i < 7; i++)
        if (set & (1u << i))
            strcat(sql, cols[i]);
    if ((set & JD_SET_STATE) && !(set & JD_SET_FINISHED))
        strcat(sql, ", finished_ms = iif(?4 >= 3 AND finished_ms = 0, ?2, finished_ms)");
    strcat(sql, " WHERE id = ?1");
    if (sqlite3_prepare_v3(s->wdb, sql, -1, SQLITE_PREPARE_PERSISTENT, &s->upd[set], NULL) !=
        SQLITE_OK) {
        jd_log(JD_LOG_ERROR, "storage: preparing an update failed", "db", s->path, "error",
               sqlite3_errmsg(s->wdb), NULL);
        return NULL;
    }
    return s->upd[set];
}

static int apply_change(struct jd_store *s, struct jd_write *w, int64_t now, struct vcache *vc,
                        struct qcounts *qc)
{
    unsigned set = w->set;
    if (w->job_id <= 0 || (unsigned)w->kind > JD_EVK_PROGRESS || set >= JD_UPDATE_MASKS ||
        ((set & JD_SET_STATE) && (unsigned)w->state >= JD_JOB_NSTATES))
        return JD_EINVAL;
    sqlite3_stmt *st = update_stmt(s, set);
    if (!st)
        return JD_EIO;
    /* Read the version (unless this batch already knows it), then write
     * version + 1: cheaper in SQLite than UPDATE ... RETURNING, and a
     * missing job is found before any write. */
    struct vslot *slot = vc ? vc_slot(vc, w->job_id) : NULL;
    int64_t version;
    const char *queue = NULL;
    int old_state = 0;
    int rc;
    struct known *k = slot ? known_slot(vc, w->job_id) : NULL;
    if (slot && slot->job_id == w->job_id) {
        version = slot->version + 1;
        queue = slot->queue;
        old_state = slot->state;
    } else if (k && k->job_id == w->job_id) {
        version = k->version + 1;
        queue = k->queue;
        old_state = k->state;
    } else {
        sqlite3_stmt *vs = s->wst[JD_WS_VERSION_GET];
        sqlite3_bind_int64(vs, 1, w->job_id);
        rc = sqlite3_step(vs);
        version = 0;
        if (rc == SQLITE_ROW) {
            version = sqlite3_column_int64(vs, 0) + 1;
            old_state = sqlite3_column_int(vs, 1);
            const unsigned char *q = sqlite3_column_text(vs, 2);
            queue = qc_entry(qc, q ? (const char *)q : "")->queue;
        }
        sqlite3_reset(vs);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE)
            return record_error(sqlite3_extended_errcode(s->wdb));
        if (version == 0)
            return JD_ENOENT;
        if (old_state < 0 || old_state >= JD_JOB_NSTATES)
            return JD_EIO; /* the CHECK constraint makes this a corrupt row */
    }
    if (w->release_unique) {
        sqlite3_stmt *us = s->wst[JD_WS_UNIQUE_RELEASE];
        sqlite3_bind_int64(us, 1, w->job_id);
        if (run(us) != SQLITE_DONE)
            return record_error(sqlite3_extended_errcode(s->wdb));
    }
    const char *data = w->data;
    if (!data && w->kind == JD_EVK_STATE && (set & JD_SET_STATE))
        data = jd_state_event_data[w->state];
    if (slot && set == 0) {
        /* A history append: the jobs row is brought up to date by vc_flush
         * or by the job's next UPDATE in this batch. */
        rc = append_event(s, vc, w->job_id, version, now, w->kind, w->tag, data);
        if (rc == 0) {
            w->version = version;
            *slot = (struct vslot){.job_id = w->job_id,
                                   .version = version,
                                   .queue = queue,
                                   .state = old_state,
                                   .dirty = true};
        }
        return rc;
    }
    sqlite3_bind_int64(st, 1, w->job_id);
    sqlite3_bind_int64(st, 2, now);
    sqlite3_bind_int64(st, 3, version);
    if (set & JD_SET_STATE)
        sqlite3_bind_int(st, 4, (int)w->state);
    if (set & JD_SET_OUTPUT)
        bind_text(st, 6, w->output);
    if (set & JD_SET_ERROR)
        bind_text(st, 8, w->error);
    if (set & JD_SET_RUN_AT)
        sqlite3_bind_int64(st, 10, w->run_at_ms);
    if (set & JD_SET_ATTEMPTS)
        sqlite3_bind_int64(st, 12, w->attempts);
    if (set & JD_SET_STARTED)
        sqlite3_bind_int64(st, 14, w->started_ms);
    if (set & JD_SET_FINISHED)
        sqlite3_bind_int64(st, 16, w->finished_ms);
    if (run(st) != SQLITE_DONE)
        return record_error(sqlite3_extended_errcode(s->wdb));
    rc = append_event(s, vc, w->job_id, version, now, w->kind, w->tag, data);
    if (rc == 0) {
        w->version = version;
        int new_state = (set & JD_SET_STATE) ? (int)w->state : old_state;
        if (new_state != old_state) {
            struct qcount *q = qc_entry(qc, queue);
            q->d[old_state]--;
            q->d[new_state]++;
        }
        if (slot)
            *slot = (struct vslot){
                .job_id = w->job_id, .version = version, .queue = queue, .state = new_state};
    }
    return rc;
}

static int apply_queue_config(struct jd_store *s, struct jd_write *w)
{
    sqlite3_stmt *st = s->wst[JD_WS_QUEUE_CONFIG];
    sqlite3_bind_text(st, 1, w->queue, -1, SQLITE_STATIC);
    bind_text(st, 2, w->queue_config);
    for (int i = 0; i < 3; i++) {
        if (w->retain_ms[i] < 0)
            return JD_EINVAL;
        sqlite3_bind_int64(st, 3 + i, w->retain_ms[i]);
    }
    if (run(st) != SQLITE_DONE)
        return record_error(sqlite3_extended_errcode(s->wdb));
    /* Never switched off until the next start: a pass per (queue, state)
     * is as right without overrides, only a little slower. */
    if (w->retain_ms[0] > 0 || w->retain_ms[1] > 0 || w->retain_ms[2] > 0)
        s->queue_retention = true;
    return 0;
}

static int apply_queue(struct jd_store *s, struct jd_write *w)
{
    if (w->op == JD_W_QUEUE_CONFIG && w->queue)
        return apply_queue_config(s, w);
    if (!w->queue)
        return JD_EINVAL;
    sqlite3_stmt *st = s->wst[JD_WS_QUEUE_UPSERT];
    sqlite3_bind_text(st, 1, w->queue, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, w->paused ? 1 : 0);
    return run(st) == SQLITE_DONE ? 0 : record_error(sqlite3_extended_errcode(s->wdb));
}

#define JD_SCHED_TRIM_EVERY 64 /* trim a schedule's history once per this many events */

/* Update the schedule row as w->sched says and append its event (if any).
 * JD_ENOENT when the schedule does not exist. */
/* Does schedule id exist (a conditional fire that touched no row: lost
 * the race, JD_ECONFLICT, or the schedule is gone, JD_ENOENT)? Rare. */
static bool schedule_exists(struct jd_store *s, const char *id)
{
    sqlite3_stmt *st = NULL;
    bool found = false;
    if (sqlite3_prepare_v2(s->wdb, "SELECT 1 FROM schedules WHERE id = ?1", -1, &st, NULL) ==
        SQLITE_OK) {
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        found = sqlite3_step(st) == SQLITE_ROW;
    }
    sqlite3_finalize(st);
    return found;
}

static int apply_schedule_change(struct jd_store *s, const struct jd_schedule_write *sw,
                                 int64_t now)
{
    if (!sw->id || sw->set > 15)
        return JD_EINVAL;
    sqlite3_stmt *st = s->wst[JD_WS_SCHED_UPDATE];
    sqlite3_bind_text(st, 1, sw->id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    sqlite3_bind_int(st, 3, (int)sw->set);
    sqlite3_bind_int(st, 4, sw->paused);
    sqlite3_bind_int(st, 5, sw->retired);
    sqlite3_bind_int64(st, 6, sw->next_fire_ms);
    sqlite3_bind_int64(st, 7, sw->last_fire_ms);
    sqlite3_bind_int64(st, 8, sw->last_job_id);
    bind_text(st, 9, sw->last_outcome);
    sqlite3_bind_int64(st, 10, sw->add_fires);
    sqlite3_bind_int64(st, 11, sw->add_skips);
    sqlite3_bind_int(st, 12, sw->event != NULL);
    sqlite3_bind_int64(st, 13, sw->expect_next_fire_ms);
    int rc = sqlite3_step(st);
    int64_t seq = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    if (rc == SQLITE_DONE && sw->expect_next_fire_ms)
        return schedule_exists(s, sw->id) ? JD_ECONFLICT : JD_ENOENT;
    if (rc == SQLITE_DONE)
        return JD_ENOENT;
    if (rc != SQLITE_ROW)
        return record_error(sqlite3_extended_errcode(s->wdb));
    if (!sw->event)
        return 0;
    st = s->wst[JD_WS_SCHED_EVENT];
    sqlite3_bind_text(st, 1, sw->id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, seq);
    sqlite3_bind_int64(st, 3, now);
    sqlite3_bind_text(st, 4, sw->event, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, sw->event_fire_ms);
    sqlite3_bind_int64(st, 6, sw->event_job_id);
    bind_text(st, 7, sw->event_data);
    if (run(st) != SQLITE_DONE)
        return record_error(sqlite3_extended_errcode(s->wdb));
    if (seq % JD_SCHED_TRIM_EVERY == 0 && seq > JD_SCHEDULE_EVENTS_KEEP) {
        st = s->wst[JD_WS_SCHED_TRIM];
        sqlite3_bind_text(st, 1, sw->id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, seq - JD_SCHEDULE_EVENTS_KEEP);
        if (run(st) != SQLITE_DONE)
            return record_error(sqlite3_extended_errcode(s->wdb));
    }
    return 0;
}

static int apply_schedule(struct jd_store *s, struct jd_write *w, int64_t now)
{
    const struct jd_schedule_write *sw = &w->sched;
    if (!sw->id)
        return JD_EINVAL;
    if (w->op == JD_W_SCHEDULE_CHANGE)
        return apply_schedule_change(s, sw, now);
    if (w->op == JD_W_SCHEDULE_DELETE) {
        sqlite3_stmt *st = s->wst[JD_WS_SCHED_DELETE];
        sqlite3_bind_text(st, 1, sw->id, -1, SQLITE_STATIC);
        if (run(st) != SQLITE_DONE)
            return record_error(sqlite3_extended_errcode(s->wdb));
        if (sqlite3_changes(s->wdb) == 0)
            return JD_ENOENT;
        st = s->wst[JD_WS_SCHED_DEL_EVENTS];
        sqlite3_bind_text(st, 1, sw->id, -1, SQLITE_STATIC);
        return run(st) == SQLITE_DONE ? 0 : record_error(sqlite3_extended_errcode(s->wdb));
    }
    if (!sw->definition)
        return JD_EINVAL;
    sqlite3_stmt *st = s->wst[JD_WS_SCHED_UPSERT];
    sqlite3_bind_text(st, 1, sw->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, sw->definition, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, sw->paused);
    sqlite3_bind_int64(st, 4, sw->next_fire_ms);
    sqlite3_bind_int64(st, 5, now);
    sqlite3_bind_int64(st, 6, sw->anchor_ms);
    sqlite3_bind_int(st, 7, sw->retired);
    if (run(st) != SQLITE_DONE)
        return record_error(sqlite3_extended_errcode(s->wdb));
    if (!sw->event)
        return 0;
    struct jd_schedule_write ev = {.id = sw->id,
                                   .event = sw->event,
                                   .event_fire_ms = sw->event_fire_ms,
                                   .event_job_id = sw->event_job_id,
                                   .event_data = sw->event_data};
    return apply_schedule_change(s, &ev, now);
}

/* A job's crash count: bookkeeping of the job layer's, not history (no
 * event, no new version). JD_ENOENT for a missing job. */
static int apply_crashes(struct jd_store *s, struct jd_write *w)
{
    if (w->job_id <= 0)
        return JD_EINVAL;
    sqlite3_stmt *st = s->wst[JD_WS_JOB_CRASHES];
    sqlite3_bind_int64(st, 1, w->job_id);
    sqlite3_bind_int64(st, 2, w->crashes);
    if (run(st) != SQLITE_DONE)
        return record_error(sqlite3_extended_errcode(s->wdb));
    return sqlite3_changes(s->wdb) > 0 ? 0 : JD_ENOENT;
}

/* Delete a terminal job as retention does (its labels go with its
 * definition, by trigger); the id stays used (max_deleted_id). */
static int apply_job_delete(struct jd_store *s, struct jd_write *w, struct vcache *vc,
                            struct qcounts *qc)
{
    if (w->job_id <= 0)
        return JD_EINVAL;
    /* The delete trigger counts the delete: what this transaction counted
     * so far (the job's own insert, say) must be in queue_counts first. */
    if (qc_flush(s, qc) != SQLITE_DONE)
        return record_error(sqlite3_extended_errcode(s->wdb));
    sqlite3_stmt *st = s->wst[JD_WS_JOB_DELETE];
    sqlite3_bind_int64(st, 1, w->job_id);
    int rc = sqlite3_step(st);
    char *key = NULL;
    if (rc == SQLITE_ROW && sqlite3_column_text(st, 0))
        key = jd_xstrdup((const char *)sqlite3_column_text(st, 0));
    bool deleted = rc == SQLITE_ROW;
    if (rc == SQLITE_ROW)
        rc = sqlite3_step(st); /* finish the statement, so the delete is done */
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        free(key);
        return record_error(sqlite3_extended_errcode(s->wdb));
    }
    if (!deleted) {
        st = s->wst[JD_WS_JOB_STATE];
        sqlite3_bind_int64(st, 1, w->job_id);
        rc = sqlite3_step(st);
        sqlite3_reset(st);
        return rc == SQLITE_ROW ? JD_ECONFLICT : rc == SQLITE_DONE ? JD_ENOENT : JD_EIO;
    }
    if (vc) { /* a change earlier in this batch must not write the row back */
        vc_slot(vc, w->job_id)->dirty = false;
        vc->known_stale = true;
    }
    static const int dels[] = {JD_WS_RET_DEL_EVENTS, JD_WS_RET_DEL_DEF, JD_WS_RET_DEL_TASKS,
                               JD_WS_RET_MAX_ID, JD_WS_RET_MAX_EVENT};
    for (size_t i = 0; i < sizeof dels / sizeof dels[0]; i++) {
        st = s->wst[dels[i]];
        sqlite3_bind_int64(st, 1, dels[i] == JD_WS_RET_MAX_EVENT ? s->event_max : w->job_id);
        if (run(st) != SQLITE_DONE) {
            free(key);
            return record_error(sqlite3_extended_errcode(s->wdb));
        }
    }
    if (key) {
        st = s->wst[JD_WS_RET_DEL_IDEM];
        sqlite3_bind_text(st, 1, key, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 2, w->job_id);
        rc = run(st);
        free(key);
        if (rc != SQLITE_DONE)
            return record_error(sqlite3_extended_errcode(s->wdb));
    }
    return 0;
}

static int apply_remote(struct jd_store *s, struct jd_write *w, int64_t now)
{
    sqlite3_stmt *st;
    if (w->op == JD_W_TASK_PUT) {
        const struct jd_task_write *t = &w->task;
        if (!t->id || !t->command)
            return JD_EINVAL;
        st = s->wst[JD_WS_TASK_UPSERT];
        sqlite3_bind_text(st, 1, t->id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, t->job_id);
        sqlite3_bind_int64(st, 3, t->tag);
        sqlite3_bind_int64(st, 4, t->attempt);
        sqlite3_bind_text(st, 5, t->command, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 6, (int)t->state);
        bind_text(st, 7, t->worker);
        sqlite3_bind_int64(st, 8, t->lease_expires_ms);
        sqlite3_bind_int64(st, 9, now);
        return run(st) == SQLITE_DONE ? 0 : record_error(sqlite3_extended_errcode(s->wdb));
    }
    if (!w->rcmd.name)
        return JD_EINVAL;
    if (w->op == JD_W_COMMAND_DELETE) {
        st = s->wst[JD_WS_RCMD_DELETE];
        sqlite3_bind_text(st, 1, w->rcmd.name, -1, SQLITE_STATIC);
        if (run(st) != SQLITE_DONE)
            return record_error(sqlite3_extended_errcode(s->wdb));
        return sqlite3_changes(s->wdb) == 0 ? JD_ENOENT : 0;
    }
    st = s->wst[JD_WS_RCMD_UPSERT];
    sqlite3_bind_text(st, 1, w->rcmd.name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, w->rcmd.timeout_ms);
    bind_text(st, 3, w->rcmd.description);
    sqlite3_bind_int64(st, 4, now);
    sqlite3_bind_int64(st, 5, w->rcmd.max_in_flight);
    return run(st) == SQLITE_DONE ? 0 : record_error(sqlite3_extended_errcode(s->wdb));
}

/* vc: the batch's version cache, or NULL on the savepoint path; qc: the
 * queue counts this transaction (or savepoint) changed. */
static int apply(struct jd_store *s, struct jd_write *w, int64_t now, struct vcache *vc,
                 struct qcounts *qc)
{
    w->version = 0;
    w->time_ms = now;
    switch (w->op) {
    case JD_W_JOB_INSERT:
        return apply_insert(s, w, now, vc, qc);
    case JD_W_JOB_CHANGE:
        return apply_change(s, w, now, vc, qc);
    case JD_W_QUEUE:
    case JD_W_QUEUE_CONFIG:
        return apply_queue(s, w);
    case JD_W_JOB_CRASHES:
        return apply_crashes(s, w);
    case JD_W_JOB_DELETE:
        return apply_job_delete(s, w, vc, qc);
    case JD_W_SCHEDULE_PUT:
    case JD_W_SCHEDULE_CHANGE:
    case JD_W_SCHEDULE_DELETE:
        return apply_schedule(s, w, now);
    case JD_W_COMMAND_PUT:
    case JD_W_COMMAND_DELETE:
    case JD_W_TASK_PUT:
        return apply_remote(s, w, now);
    default:
        return w->op == JD_W_SYNC_ ? 0 : JD_EINVAL;
    }
}

static unsigned bucket(uint64_t v, const uint64_t *bounds, unsigned n)
{
    unsigned i = 0;
    while (i < n && v > bounds[i])
        i++;
    return i;
}

/* Statistics are independent counters (relaxed throughout): a scrape may
 * see one updated before another, never a torn value. */
static void note_commit(struct jd_store *s, size_t records, uint64_t us, bool ok)
{
    static const uint64_t batch_bounds[7] = {1, 4, 16, 64, 256, 1024, 4096};
    static const uint64_t us_bounds[9] = {100, 250, 500, 1000, 2500, 5000, 10000, 25000, 100000};
    if (!ok) {
        atomic_fetch_add_explicit(&s->st_failed_commits, 1, memory_order_relaxed);
        return;
    }
    atomic_fetch_add_explicit(&s->st_commits, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->st_records, records, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->st_batch_hist[bucket(records, batch_bounds, 7)], 1,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->st_commit_us_hist[bucket(us, us_bounds, 9)], 1,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->st_commit_us_sum, us, memory_order_relaxed);
}

static void abort_tx(struct jd_store *s)
{
    if (!sqlite3_get_autocommit(s->wdb))
        run(s->wst[JD_WS_ROLLBACK]);
}

/* Log a failed transaction once per distinct message, not once per batch. */
static void log_failure(struct jd_store *s, const char *what)
{
    static _Thread_local char last[256];
    char msg[256];
    snprintf(msg, sizeof msg, "%s: %s", what, sqlite3_errmsg(s->wdb));
    if (strcmp(msg, last) == 0)
        return;
    snprintf(last, sizeof last, "%s", msg);
    jd_log(JD_LOG_ERROR, "storage commit failed", "db", s->path, "error", msg, NULL);
}

/* A record of the optimistic transaction failed with rc: forget what the
 * transaction buffered and counted; 1 when rc is the record's own fault
 * (rolled back, b[0..upto) restored for the redo with savepoints), -1 when
 * it is not (the caller aborts). */
static int optimistic_failed(struct jd_store *s, struct jd_write **b, const int64_t *ids,
                             size_t upto, struct vcache *vc, int rc)
{
    vc->nev = 0;
    qc_clear(vc->qc);
    if (rc != JD_EEXIST && rc != JD_ENOENT && rc != JD_EINVAL && rc != JD_ECONFLICT)
        return -1;
    if (run(s->wst[JD_WS_ROLLBACK]) != SQLITE_DONE)
        return -1;
    for (size_t k = 0; k < upto; k++) {
        b[k]->job_id = ids[k];
        b[k]->version = 0;
    }
    return 1;
}

/* The fast path: apply every record of b[0..n) in one transaction without
 * savepoints. 0: all applied (transaction still open); 1: a record failed
 * on its own (the transaction is rolled back, the caller redoes the batch
 * with savepoints); -1: a failure that is not a record's fault (transaction
 * left for the caller to abort). Records are almost never at fault, and a
 * SAVEPOINT + RELEASE per record costs about as much as the record's own
 * UPDATE, so optimism pays. ids[] saves the job_id each record had before,
 * since apply_insert rewrites it on a duplicate idempotency key. */
static int apply_optimistic(struct jd_store *s, struct jd_write **b, int *rcs, int64_t *ids,
                            size_t n, int64_t now, struct vcache *vc)
{
    vc_reset(vc, n);
    qc_clear(vc->qc);
    for (size_t i = 0; i < n; i++)
        ids[i] = b[i]->job_id;
    for (size_t i = 0; i < n; i++) {
        rcs[i] = 0;
        if (b[i]->op == JD_W_SYNC_)
            continue;
        int rc = 0;
        /* buffered events go in before any other kind of record runs */
        if (b[i]->op != JD_W_JOB_INSERT && b[i]->op != JD_W_JOB_CHANGE)
            rc = ev_flush(s, vc);
        if (rc == 0)
            rc = apply(s, b[i], now, vc, vc->qc);
        if (rc != 0)
            return optimistic_failed(s, b, ids, i + 1, vc, rc);
    }
    int rc = ev_flush(s, vc);
    if (rc != 0)
        return optimistic_failed(s, b, ids, n, vc, rc);
    if (vc_flush(s, vc, now) != SQLITE_DONE)
        return -1;
    return qc_flush(s, vc->qc) == SQLITE_DONE ? 0 : -1;
}

/* The slow path, after a record failed: every record, or group, in its own
 * SAVEPOINT so that it fails alone. 0, or -1 on a failure that is not a
 * record's fault. */
static int apply_savepoints(struct jd_store *s, struct jd_write **b, int *rcs, size_t n,
                            int64_t now, struct qcounts *qc)
{
    for (size_t i = 0; i < n;) {
        size_t g = b[i]->group_ ? b[i]->group_ : 1;
        if (g == 1 && b[i]->op == JD_W_SYNC_) {
            rcs[i++] = 0;
            continue;
        }
        if (run(s->wst[JD_WS_SAVEPOINT]) != SQLITE_DONE) {
            log_failure(s, "savepoint");
            return -1;
        }
        int rc = 0;
        qc_clear(qc);
        for (size_t k = 0; k < g && rc == 0; k++)
            rc = apply(s, b[i + k], now, NULL, qc);
        if (rc == 0 && qc_flush(s, qc) != SQLITE_DONE)
            rc = JD_EIO;
        qc_clear(qc);
        if (rc != 0 && rc != JD_EEXIST && rc != JD_ENOENT && rc != JD_EINVAL &&
            rc != JD_ECONFLICT) {
            log_failure(s, "write");
            return -1;
        }
        if (rc != 0 && run(s->wst[JD_WS_ROLLBACK_TO]) != SQLITE_DONE) {
            log_failure(s, "rollback to savepoint");
            return -1;
        }
        if (run(s->wst[JD_WS_RELEASE]) != SQLITE_DONE) {
            log_failure(s, "release savepoint");
            return -1;
        }
        for (size_t k = 0; k < g; k++) {
            rcs[i + k] = rc;
            if (rc != 0)
                b[i + k]->version = 0;
        }
        i += g;
    }
    return 0;
}

/* Records in b[0..n) for the statistics: a barrier alone is none. */
static size_t count_records(struct jd_write **b, size_t n)
{
    size_t records = 0;
    for (size_t i = 0; i < n; i++)
        records += b[i]->op != JD_W_SYNC_ || b[i]->group_ > 1;
    return records;
}

/* Apply and commit b[0..n), then fire every done() in order. */
static void commit_batch(struct jd_store *s, struct jd_write **b, int *rcs, int64_t *ids, size_t n,
                         struct vcache *vc)
{
    uint64_t t0 = jd_now_ns();
    int64_t now = jd_wall_ms();
    size_t records = 0;
    bool ok = false;
    int fast = -1;

    if (run(s->wst[JD_WS_BEGIN]) != SQLITE_DONE) {
        log_failure(s, "begin");
        goto done;
    }
    fast = apply_optimistic(s, b, rcs, ids, n, now, vc);
    if (fast < 0) {
        log_failure(s, "write");
        goto done;
    }
    if (fast > 0) {
        if (run(s->wst[JD_WS_BEGIN]) != SQLITE_DONE) {
            log_failure(s, "begin");
            goto done;
        }
        if (apply_savepoints(s, b, rcs, n, now, vc->qc) != 0)
            goto done;
    }
    records = count_records(b, n);
    if (run(s->wst[JD_WS_COMMIT]) != SQLITE_DONE) {
        log_failure(s, "commit");
        goto done;
    }
    ok = true;

done:
    if (ok && fast == 0)
        known_absorb(vc);
    else
        known_clear(vc);
    if (!ok) {
        abort_tx(s);
        for (size_t i = 0; i < n; i++) {
            rcs[i] = JD_EIO;
            b[i]->version = 0;
        }
    }
    jd_writer_finish_batch(s, b, rcs, n, records, (jd_now_ns() - t0) / 1000, ok);
}

/* The PostgreSQL backend's commit (storage/pg_write.c), then the same tail. */
static void commit_batch_pg(struct jd_store *s, struct jd_write **b, int *rcs, size_t n)
{
    uint64_t t0 = jd_now_ns();
    int rc = jd_pg_commit_batch(s, b, rcs, n);
    if (rc != 0)
        for (size_t i = 0; i < n; i++) {
            rcs[i] = JD_EIO;
            b[i]->version = 0;
        }
    jd_writer_finish_batch(s, b, rcs, n, count_records(b, n), (jd_now_ns() - t0) / 1000, rc == 0);
}

void jd_writer_finish_batch(struct jd_store *s, struct jd_write **b, int *rcs, size_t n,
                            size_t records, uint64_t us, bool ok)
{
    note_commit(s, records, us, ok);
    atomic_fetch_add_explicit(&s->st_finished, n, memory_order_relaxed); /* a statistic */
    /* acquire: pairs with the release in jd_store_done_thread (dq_mu/dq_cv
     * initialised before it reads true). */
    if (atomic_load_explicit(&s->done_async, memory_order_acquire)) {
        /* Hand the batch over in order; the writer no longer touches b[i]
         * (its next_ is free once the batch was cut). */
        for (size_t i = 0; i < n; i++) {
            b[i]->rc_ = rcs[i];
            b[i]->next_ = i + 1 < n ? b[i + 1] : NULL;
        }
        pthread_mutex_lock(&s->dq_mu);
        if (s->dq_tail)
            s->dq_tail->next_ = b[0];
        else
            s->dq_head = b[0];
        s->dq_tail = b[n - 1];
        if (s->dq_waiting)
            pthread_cond_signal(&s->dq_cv);
        pthread_mutex_unlock(&s->dq_mu);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct jd_write *w = b[i]; /* done() may free it */
        if (w->done)
            w->done(w->arg, w, rcs[i]);
    }
}

/* The completion thread: calls done() for each handed-over record, in order,
 * until stopped with the queue empty. */
static void *done_main(void *arg)
{
    struct jd_store *s = arg;
    pthread_mutex_lock(&s->dq_mu);
    for (;;) {
        struct jd_write *w = s->dq_head;
        if (!w) {
            if (s->dq_stop)
                break;
            s->dq_waiting = true;
            pthread_cond_wait(&s->dq_cv, &s->dq_mu);
            s->dq_waiting = false;
            continue;
        }
        s->dq_head = s->dq_tail = NULL;
        pthread_mutex_unlock(&s->dq_mu);
        while (w) {
            struct jd_write *nx = w->next_; /* done() may free w */
            if (w->done)
                w->done(w->arg, w, w->rc_);
            w = nx;
        }
        pthread_mutex_lock(&s->dq_mu);
    }
    pthread_mutex_unlock(&s->dq_mu);
    return NULL;
}

int jd_store_done_thread(struct jd_store *s)
{
    if (atomic_load_explicit(&s->done_async, memory_order_relaxed)) /* only this thread sets it */
        return 0;
    pthread_mutex_init(&s->dq_mu, NULL);
    pthread_cond_init(&s->dq_cv, NULL);
    s->dq_head = s->dq_tail = NULL;
    s->dq_stop = s->dq_waiting = false;
    if (pthread_create(&s->done_thr, NULL, done_main, s) != 0) {
        pthread_cond_destroy(&s->dq_cv);
        pthread_mutex_destroy(&s->dq_mu);
        return JD_EIO;
    }
    pthread_setname_np(s->done_thr, "jd-done");
    /* release: the writer sees the initialised queue once it sees true. */
    atomic_store_explicit(&s->done_async, true, memory_order_release);
    return 0;
}

/* Collect the rows (id, idempotency key) sel yields into ids/keys, up to
 * JD_RETENTION_BATCH in all; SQLite rc (SQLITE_DONE when fine). */
static int collect_expired(sqlite3_stmt *sel, int64_t *ids, char **keys, int *n)
{
    int rc;
    while (*n < JD_RETENTION_BATCH && (rc = sqlite3_step(sel)) == SQLITE_ROW) {
        ids[*n] = sqlite3_column_int64(sel, 0);
        keys[*n] = jd_xstrdup((const char *)sqlite3_column_text(sel, 1));
        (*n)++;
    }
    if (*n >= JD_RETENTION_BATCH)
        rc = SQLITE_DONE;
    sqlite3_reset(sel);
    return rc == SQLITE_ROW ? SQLITE_DONE : rc;
}

/* Every (queue, terminal state) by its own cutoff (a queue's retention,
 * else --retention), each an index range on jobs_queue_finished. SQLite rc. */
static int collect_per_queue(struct jd_store *s, int64_t now, int64_t *ids, char **keys, int *n)
{
    sqlite3_stmt *qs = s->wst[JD_WS_RET_QUEUES];
    sqlite3_stmt *sel = s->wst[JD_WS_RET_SELECT_QS];
    int rc;
    while (*n < JD_RETENTION_BATCH && (rc = sqlite3_step(qs)) == SQLITE_ROW) {
        int64_t keep = sqlite3_column_int64(qs, 2);
        if (keep <= 0)
            keep = s->retention_ms;
        if (keep <= 0)
            continue; /* kept forever */
        sqlite3_bind_text(sel, 1, (const char *)sqlite3_column_text(qs, 0), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(sel, 2, sqlite3_column_int(qs, 1));
        sqlite3_bind_int64(sel, 3, now - keep);
        sqlite3_bind_int(sel, 4, JD_RETENTION_BATCH - *n);
        int src = collect_expired(sel, ids, keys, n);
        if (src != SQLITE_DONE) {
            sqlite3_reset(qs);
            return src;
        }
    }
    if (*n >= JD_RETENTION_BATCH)
        rc = SQLITE_DONE;
    sqlite3_reset(qs);
    return rc == SQLITE_ROW ? SQLITE_DONE : rc;
}

/* Delete one batch of expired terminal jobs; true if the batch was full (so
 * more may be waiting). */
static bool retention_step(struct jd_store *s)
{
    int64_t now = jd_wall_ms();
    int64_t ids[JD_RETENTION_BATCH];
    char *keys[JD_RETENTION_BATCH];
    int n = 0;
    bool ok = false;

    if (run(s->wst[JD_WS_BEGIN]) != SQLITE_DONE)
        goto fail;
    /* Always per (queue, terminal state), on jobs_queue_finished: one
     * global finish-time index as well cost every job's end an index
     * insert (~5 us in SQLite alone; migration 11 dropped it). */
    int rc = collect_per_queue(s, now, ids, keys, &n);
    if (rc != SQLITE_DONE)
        goto fail;
    int64_t max_id = 0;
    for (int i = 0; i < n; i++) {
        sqlite3_stmt *st = s->wst[JD_WS_RET_DEL_EVENTS];
        sqlite3_bind_int64(st, 1, ids[i]);
        if (run(st) != SQLITE_DONE)
            goto fail;
        if (keys[i]) {
            st = s->wst[JD_WS_RET_DEL_IDEM];
            sqlite3_bind_text(st, 1, keys[i], -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 2, ids[i]);
            if (run(st) != SQLITE_DONE)
                goto fail;
        }
        st = s->wst[JD_WS_RET_DEL_UNIQUE];
        sqlite3_bind_int64(st, 1, ids[i]);
        if (run(st) != SQLITE_DONE)
            goto fail;
        st = s->wst[JD_WS_RET_DEL_DEF];
        sqlite3_bind_int64(st, 1, ids[i]);
        if (run(st) != SQLITE_DONE)
            goto fail;
        st = s->wst[JD_WS_RET_DEL_TASKS];
        sqlite3_bind_int64(st, 1, ids[i]);
        if (run(st) != SQLITE_DONE)
            goto fail;
        st = s->wst[JD_WS_RET_DEL_JOB];
        sqlite3_bind_int64(st, 1, ids[i]);
        if (run(st) != SQLITE_DONE)
            goto fail;
        if (ids[i] > max_id)
            max_id = ids[i];
    }
    if (n > 0) {
        sqlite3_stmt *st = s->wst[JD_WS_RET_MAX_ID];
        sqlite3_bind_int64(st, 1, max_id);
        if (run(st) != SQLITE_DONE)
            goto fail;
        st = s->wst[JD_WS_RET_MAX_EVENT];
        sqlite3_bind_int64(st, 1, s->event_max);
        if (run(st) != SQLITE_DONE)
            goto fail;
    }
    if (run(s->wst[JD_WS_COMMIT]) != SQLITE_DONE)
        goto fail;
    ok = true;
    atomic_fetch_add_explicit(&s->st_retention_deleted, (uint64_t)n,
                              memory_order_relaxed); /* a statistic */

fail:
    if (!ok) {
        log_failure(s, "retention");
        abort_tx(s);
    }
    for (int i = 0; i < n; i++)
        free(keys[i]);
    return ok && n == JD_RETENTION_BATCH;
}

/* Whether retention passes run at all: a global --retention or a queue's own. */
static bool retention_on(const struct jd_store *s)
{
    return s->retention_ms > 0 || s->queue_retention;
}

/* Run a retention pass when due; true when one ran (it may have deleted
 * jobs). */
static bool maybe_retention(struct jd_store *s)
{
    if (!retention_on(s))
        return false;
    int64_t now = jd_wall_ms();
    if (now < s->retention_due_ms)
        return false;
    /* A queue's retention may be as short as a second: its passes run at
     * the longest interval (a second). */
    int64_t interval = s->queue_retention ? JD_RETENTION_MAX_INTERVAL_MS : s->retention_ms / 8;
    if (interval < 10)
        interval = 10;
    if (interval > JD_RETENTION_MAX_INTERVAL_MS)
        interval = JD_RETENTION_MAX_INTERVAL_MS;
    /* A full batch means more expired jobs: go again after the next commit. */
    bool more = s->pg ? jd_pg_retention_step(s) : retention_step(s);
    s->retention_due_ms = more ? now : now + interval;
    return true;
}

/* Wait until a record is pushed, stop is requested, the retention pass is
 * due, or max_ns passed (0: no bound; PostgreSQL's horizon linger).
 * Returns true if stop was requested and nothing is queued. */
static bool writer_wait(struct jd_store *s, uint64_t max_ns)
{
    bool stop = false;
    uint64_t until_ns = max_ns ? jd_now_ns() + max_ns : 0;
    /* seq_cst: pairs with the producer's push + load (see the file comment). */
    atomic_store_explicit(&s->writer_sleeping, 1, memory_order_seq_cst);
    pthread_mutex_lock(&s->mu);
    while (atomic_load_explicit(&s->head, memory_order_seq_cst) == NULL) {
        if (s->stop) {
            stop = true;
            break;
        }
        uint64_t wait_ns = 0; /* 0: until signalled */
        if (retention_on(s)) {
            int64_t wait_ms = s->retention_due_ms - jd_wall_ms();
            if (wait_ms <= 0)
                break;
            wait_ns = (uint64_t)wait_ms * 1000000u;
        }
        if (until_ns) {
            uint64_t now = jd_now_ns();
            if (now >= until_ns)
                break;
            if (!wait_ns || until_ns - now < wait_ns)
                wait_ns = until_ns - now;
        }
        if (wait_ns) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += (time_t)(wait_ns / 1000000000u);
            ts.tv_nsec += (long)(wait_ns % 1000000000u);
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        } else {
            pthread_cond_wait(&s->cv, &s->mu);
        }
    }
    pthread_mutex_unlock(&s->mu);
    /* relaxed: a producer that still sees 1 only sends one needless signal */
    atomic_store_explicit(&s->writer_sleeping, 0, memory_order_relaxed);
    return stop;
}

/* Group commit on PostgreSQL: a COMMIT there costs a round trip and a WAL
 * flush (~3 ms on a busy VM) whatever it carries, and with several nodes
 * each writer sees a share of the load, so its batches come out small and
 * the flushes (and PostgreSQL's CPU per transaction) multiply. When the
 * records waiting are fewer than JD_PG_GROUP_MIN and the last commit took
 * longer than JD_PG_GROUP_SLOW_US, the writer waits up to a quarter of that
 * commit (at most JD_PG_GROUP_MAX_US) for more before it cuts the batch.
 * Never when enough records wait or commits are fast; SQLite never waits. */
#define JD_PG_GROUP_MIN 64
#define JD_PG_GROUP_SLOW_US 1000
#define JD_PG_GROUP_MAX_US 2000
#define JD_PG_GROUP_POLL_US 200

/* Move whatever producers pushed onto the end of *pend (FIFO). */
static void take_pushed(struct jd_store *s, struct jd_write **pend, struct jd_write **pend_tail)
{
    /* acquire: see the records' contents written before their push. */
    struct jd_write *taken = atomic_exchange_explicit(&s->head, NULL, memory_order_acquire);
    if (!taken)
        return;
    struct jd_write *rev = NULL, *last = taken;
    while (taken) {
        struct jd_write *nx = taken->next_;
        taken->next_ = rev;
        rev = taken;
        taken = nx;
    }
    if (*pend_tail)
        (*pend_tail)->next_ = rev;
    else
        *pend = rev;
    *pend_tail = last;
}

/* Records in pend, counting up to cap. */
static size_t pend_count(const struct jd_write *pend, size_t cap)
{
    size_t n = 0;
    for (; pend && n < cap; pend = pend->next_)
        n++;
    return n;
}

/* The group-commit wait (see JD_PG_GROUP_MIN): returns when enough records
 * are pending or the wait's bound (at most JD_PG_GROUP_MAX_US) passed. */
static void group_wait(struct jd_store *s, struct jd_write **pend, struct jd_write **pend_tail,
                       uint64_t last_us)
{
    if (last_us <= JD_PG_GROUP_SLOW_US || pend_count(*pend, JD_PG_GROUP_MIN) >= JD_PG_GROUP_MIN)
        return;
    uint64_t wait_us = last_us / 4 < JD_PG_GROUP_MAX_US ? last_us / 4 : JD_PG_GROUP_MAX_US;
    uint64_t end = jd_now_ns() + wait_us * 1000;
    while (jd_now_ns() < end) {
        struct timespec ts = {0, JD_PG_GROUP_POLL_US * 1000L};
        nanosleep(&ts, NULL);
        take_pushed(s, pend, pend_tail);
        if (pend_count(*pend, JD_PG_GROUP_MIN) >= JD_PG_GROUP_MIN)
            return;
    }
}

static void *writer_main(void *arg)
{
    struct jd_store *s = arg;
    struct jd_write *pend = NULL, *pend_tail = NULL; /* taken, not yet committed, FIFO */
    uint64_t pg_last_us = 0; /* PostgreSQL: how long the last batch's commit took */
    bool lingered = false;   /* PostgreSQL: waited out the horizon's linger since that commit */
    size_t cap = 0;
    struct jd_write **b = NULL;
    int *rcs = NULL;
    int64_t *ids = NULL;
    struct qcounts qc = {0};
    struct vcache vc = {.qc = &qc, .known = jd_xcalloc(JD_KNOWN_SLOTS, sizeof *vc.known)};

    for (;;) {
        take_pushed(s, &pend, &pend_tail);
        if (!pend && s->pg) {
            /* once per idle spell: a clear that failed waits for the next
             * batch (its COMMIT sets the bound anew) */
            uint64_t linger = lingered ? 0 : jd_pg_hz_linger_ns(s);
            if (linger) {
                lingered = true;
                bool stop = writer_wait(s, linger);
                if (stop || !atomic_load_explicit(&s->head, memory_order_relaxed))
                    jd_pg_hz_idle(s);
                continue;
            }
        }
        if (!pend) {
            if (maybe_retention(s))
                known_clear(&vc);
            if (atomic_exchange(&s->release_wanted, 0)) { /* jd_store_release_memory */
                vc_release(&vc);
                if (!s->pg) {
                    jd_store_release_readers(s);
                    sqlite3_db_release_memory(s->wdb);
                    jd_sqlite_mem_trim();
                }
#ifdef __GLIBC__
                malloc_trim(0);
#endif
            }
            if (writer_wait(s, 0))
                break;
            continue;
        }

        if (s->pg)
            group_wait(s, &pend, &pend_tail, pg_last_us);

        /* Cut one batch: whole groups, up to max_batch records (a group
         * larger than max_batch goes alone). */
        size_t n = 0;
        while (pend && (n == 0 || n + (pend->group_ ? pend->group_ : 1) <= s->max_batch)) {
            size_t g = pend->group_ ? pend->group_ : 1;
            if (n + g > cap) {
                cap = (n + g) * 2;
                b = jd_xrealloc(b, cap * sizeof *b);
                rcs = jd_xrealloc(rcs, cap * sizeof *rcs);
                ids = jd_xrealloc(ids, cap * sizeof *ids);
            }
            for (size_t k = 0; k < g; k++) {
                b[n++] = pend;
                pend = pend->next_;
            }
        }
        if (!pend)
            pend_tail = NULL;
        if (s->pg) {
            uint64_t t0 = jd_now_ns();
            commit_batch_pg(s, b, rcs, n);
            pg_last_us = (jd_now_ns() - t0) / 1000;
            lingered = false;
        } else
            commit_batch(s, b, rcs, ids, n, &vc);
        bool stale = maybe_retention(s);
        if (qc_drop(&qc, JD_QC_NAMES_KEPT))
            stale = true;
        if (stale)
            known_clear(&vc);
    }
    free(b);
    free(rcs);
    free(ids);
    free(vc.t);
    free(vc.known);
    for (size_t i = 0; i < vc.evcap; i++)
        free(vc.ev[i].more.p);
    free(vc.ev);
    free(vc.evm);
    qc_drop(&qc, 0);
    free(qc.t);
    return NULL;
}

int jd_writer_start(struct jd_store *s, struct jd_error *err)
{
    /* PostgreSQL: pg.c set up its connection and queue_retention. */
    for (int i = 0; !s->pg && i < JD_WS_N; i++) {
        int rc = sqlite3_prepare_v3(s->wdb, writer_sql[i], -1, SQLITE_PREPARE_PERSISTENT,
                                    &s->wst[i], NULL);
        if (rc != SQLITE_OK)
            return jd_error_set(err, jd_store_sqlite_rc(rc), NULL,
                                "database %s: preparing a statement failed: %s", s->path,
                                sqlite3_errmsg(s->wdb));
    }
    s->retention_due_ms = 0;
    sqlite3_stmt *qr = NULL;
    if (!s->pg && sqlite3_prepare_v2(s->wdb,
                                     "SELECT 1 FROM queues WHERE retain_succeeded_ms > 0 OR"
                                     " retain_failed_ms > 0 OR retain_cancelled_ms > 0 LIMIT 1",
                                     -1, &qr, NULL) == SQLITE_OK)
        s->queue_retention = sqlite3_step(qr) == SQLITE_ROW;
    sqlite3_finalize(qr);
    int rc = pthread_create(&s->writer, NULL, writer_main, s);
    if (rc != 0)
        return jd_error_set(err, JD_EIO, NULL, "database %s: cannot start the writer: %s", s->path,
                            strerror(rc));
    pthread_setname_np(s->writer, "jd-writer");
    s->writer_started = true;
    return 0;
}

void jd_writer_stop(struct jd_store *s)
{
    /* seq_cst: a submitter either sees closing, or we see it in submitters
     * and wait until its push is done (so the writer drains it). */
    atomic_store_explicit(&s->closing, 1, memory_order_seq_cst);
    while (atomic_load_explicit(&s->submitters, memory_order_seq_cst) != 0)
        sched_yield();
    if (s->writer_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->writer, NULL);
        s->writer_started = false;
    }
    if (atomic_load_explicit(&s->done_async, memory_order_relaxed)) {
        /* The writer has handed over its last batch: drain, then stop. */
        pthread_mutex_lock(&s->dq_mu);
        s->dq_stop = true;
        pthread_cond_signal(&s->dq_cv);
        pthread_mutex_unlock(&s->dq_mu);
        pthread_join(s->done_thr, NULL);
        pthread_cond_destroy(&s->dq_cv);
        pthread_mutex_destroy(&s->dq_mu);
        atomic_store_explicit(&s->done_async, false, memory_order_relaxed);
    }
    for (int i = 0; i < JD_WS_N; i++) {
        sqlite3_finalize(s->wst[i]);
        s->wst[i] = NULL;
    }
    for (int i = 0; i < JD_UPDATE_MASKS; i++) {
        sqlite3_finalize(s->upd[i]);
        s->upd[i] = NULL;
    }
    for (int i = 0; i <= JD_EV_ROWS; i++) {
        sqlite3_finalize(s->ev_rows[i]);
        s->ev_rows[i] = NULL;
    }
}

/* Push ws[0..n) as one contiguous chain. */
static int push(struct jd_store *s, struct jd_write **ws, size_t n)
{
    /* seq_cst: pairs with jd_writer_stop (see there). */
    atomic_fetch_add_explicit(&s->submitters, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&s->closing, memory_order_seq_cst)) {
        atomic_fetch_sub_explicit(&s->submitters, 1, memory_order_release);
        return JD_ESHUTDOWN;
    }
    for (size_t i = 0; i < n; i++) {
        ws[i]->group_ = i == 0 ? n : 0;
        ws[i]->version = 0;
        if (i > 0)
            ws[i]->next_ = ws[i - 1];
    }
    atomic_fetch_add_explicit(&s->st_enqueued, n, memory_order_relaxed); /* a statistic */
    /* relaxed: only a first guess, the CAS below checks it */
    struct jd_write *old = atomic_load_explicit(&s->head, memory_order_relaxed);
    do {
        ws[0]->next_ = old;
        /* seq_cst on success: publishes the records (release) and orders the
         * push before our load of writer_sleeping (Dekker with the writer). */
    } while (!atomic_compare_exchange_weak_explicit(&s->head, &old, ws[n - 1], memory_order_seq_cst,
                                                    memory_order_relaxed));
    if (old == NULL && atomic_load_explicit(&s->writer_sleeping, memory_order_seq_cst)) {
        pthread_mutex_lock(&s->mu);
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    /* release: our push happens before close sees submitters drop to 0. */
    atomic_fetch_sub_explicit(&s->submitters, 1, memory_order_release);
    return 0;
}

int jd_store_submit(struct jd_store *s, struct jd_write *w)
{
    if (!s || !w)
        return JD_EINVAL;
    return push(s, &w, 1);
}

int jd_store_submit_many(struct jd_store *s, struct jd_write **ws, size_t n)
{
    if (!s || (!ws && n > 0))
        return JD_EINVAL;
    if (n == 0)
        return 0;
    return push(s, ws, n);
}

struct sync_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
};

static void sync_done(void *arg, struct jd_write *w, int rc)
{
    struct sync_wait *sw = arg;
    pthread_mutex_lock(&sw->mu);
    sw->done = true;
    pthread_cond_signal(&sw->cv);
    pthread_mutex_unlock(&sw->mu);
}

int jd_store_sync(struct jd_store *s)
{
    struct sync_wait sw = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct jd_write w = {.op = JD_W_SYNC_, .done = sync_done, .arg = &sw};
    int rc = jd_store_submit(s, &w);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&sw.mu);
    while (!sw.done)
        pthread_cond_wait(&sw.cv, &sw.mu);
    pthread_mutex_unlock(&sw.mu);
    pthread_mutex_destroy(&sw.mu);
    pthread_cond_destroy(&sw.cv);
    return 0;
}
