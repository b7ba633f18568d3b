/*
 * The PostgreSQL writer's internals, shared by its files (not a contract:
 * the backend's is storage/pg.h). Everything here runs on the writer
 * thread, except jd_pg_write_free (jd_pg_close, after the writer stopped).
 *
 *   pg_write.c        a batch: the optimistic pass, the savepoint redo, the
 *                     session (reconnect, prepare), COMMIT with its notice
 *   pg_write_sql.c    the prepared statements and running them, the batch's
 *                     scratch and its queue count changes
 *   pg_write_apply.c  one record: its statements (run at once, or queued in
 *                     a pipeline) and what their results say
 *   pg_write_pipe.c   the pipelined fast path: the batch's inserts and
 *                     history appends grouped into one statement each
 *   pg_horizon.c      the event horizon (storage/pg.h)
 *   pg_retention.c    the retention step
 */
#ifndef JD_STORAGE_PG_WRITE_IMPL_H
#define JD_STORAGE_PG_WRITE_IMPL_H

#include "storage/pg.h"
#include "storage/store_impl.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- statements ---- */

/* This node ($n) if its lease is valid, else NULL: a job inserted by a
 * node that lost its lease is nobody's, so another node claims it. */
#define NODE_ALIVE(n) "(SELECT id FROM jd_nodes WHERE id = " n " AND expires_at > now())"
/* The fence's second half: this node's lease is valid (database clock). */
#define LEASE_VALID(n)                                                                             \
    " AND EXISTS (SELECT 1 FROM jd_nodes WHERE id = " n " AND expires_at > now())"

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
    PS_JOB_CHANGES,
    PS_JOB_VERSION,
    PS_HZ_NEXT,
    PS_NOTIFY,
    PS_WATCH_SHARED,
    PS_N
};

/* A statement's parameters in text format; NULL is SQL NULL. p_int and
 * p_text add one. */
#define JD_PG_MAX_PARAMS 20 /* the most any statement here takes (18: a schedule change) */
struct jd_pgw_prm {
    int n;
    const char *v[JD_PG_MAX_PARAMS];
    char b[JD_PG_MAX_PARAMS][24];
};

static inline void p_int(struct jd_pgw_prm *p, int64_t x)
{
    if (p->n >= JD_PG_MAX_PARAMS)
        abort(); /* a statement here with more parameters than JD_PG_MAX_PARAMS: a bug */
    snprintf(p->b[p->n], sizeof p->b[p->n], "%lld", (long long)x);
    p->v[p->n] = p->b[p->n];
    p->n++;
}

static inline void p_text(struct jd_pgw_prm *p, const char *s)
{
    if (p->n >= JD_PG_MAX_PARAMS)
        abort(); /* as in p_int */
    p->v[p->n++] = s;
}

/* ---- the batch's scratch: queue count changes and saved job ids ---- */

/* What a statement's result must show for its record to have applied. */
enum {
    RK_ANY,     /* nothing to check */
    RK_ROW,     /* at least one row (RETURNING, a found row) */
    RK_INSERT,  /* a job insert: version 1, counted in */
    RK_CHANGE,  /* a job change's row: version, queue, old and new state */
    RK_DELETE,  /* a job delete's row: queue and state, counted out */
    RK_INSERTS, /* the batch's hoisted job inserts (w: the first; see pg_write_pipe.c) */
    RK_REQUEST, /* an inbox request: (job state, request id), NULLs say why not */
    RK_CHANGES, /* the batch's grouped job changes (w: the first; see pg_write_pipe.c) */
};
#define NOROW 1 /* a statement that had to touch a row touched none */

/* An array literal being built ("{1,2}", "{\"a\",NULL}"). */
struct jd_pgw_abuf {
    char *p;
    size_t len, cap;
};

struct jd_pgw_pend {
    struct jd_write *w; /* NULL: the BEGIN */
    int kind;
};

struct jd_pgw_qdelta {
    char *queue;
    int64_t d[JD_JOB_NSTATES];
};

struct jd_pg_wscratch {
    struct jd_pgw_qdelta *q; /* distinct queues changed in this transaction */
    size_t nq, capq;
    int64_t *saved; /* per (queue, state): the deltas at the savepoint */
    size_t nsaved, capsaved;
    int64_t *ids; /* each record's job_id before the optimistic pass */
    size_t capids;
    struct jd_pgw_pend *pq; /* statements sent in the pipeline, results not yet read */
    size_t npq, cappq;
    struct jd_pgw_abuf arr[17]; /* the grouped statements' array parameters, reused */
    /* the grouped changes' event rows, a job's events packed into runs
     * (store_impl.h); their more buffers are kept across batches */
    struct jd_pgw_evrow *evr;
    size_t nevr, capevr;
    /* the grouped changes: per job of the batch (open addressing on id),
     * and per record whether it went in the grouped statement and its
     * rank among its job's records there */
    struct jd_pgw_jslot *jt;
    size_t jcap;
    unsigned char *grp;
    int64_t *rank;
    size_t capgrp;
};

/* One events row of the grouped changes: a run of a job's events, the
 * first as its columns, the rest packed; off is the first's rank among the
 * job's grouped records (its seq is the job's old version + off). */
struct jd_pgw_evrow {
    int64_t job_id, off, tag;
    int kind;
    const char *data; /* the record's, or static */
    struct jd_evpack more;
};

struct jd_pgw_jslot {
    int64_t id;   /* 0: empty */
    size_t evrow; /* 1 + its newest row in jd_pg_wscratch.evr, 0: none yet */
    bool busy;    /* the batch has a record for it that cannot be grouped */
    bool found;   /* the grouped statement returned its row */
    int64_t records, base;
    /* its grouped records folded: the fields set (JD_SET_*), each field's
     * last value, and finished_ms's fate (fmode: 0 kept, 1 stamped, 2 set) */
    unsigned set;
    int fmode;
    int64_t state, run_at_ms, attempts, started_ms, finished_ms;
    const char *output, *error; /* the records' (they outlive the batch) */
};

/* One batch being applied: sequentially (each statement runs at once; when
 * one touched no row, follow-up reads say why), or pipelined (statements
 * are queued and their results checked when they come back: any record
 * that did not apply sends the batch to the sequential savepoint path). */
struct jd_pgw_ctx {
    struct jd_store *s;
    struct jd_pg_wscratch *ws;
    int64_t now;
    bool pipe;
    struct jd_write **b; /* the batch (pipelined) */
    size_t nb;
    bool hoisted; /* pipelined: the batch's job rows went in one statement first
                     (PS_JOB_INSERTS); apply_insert only takes keys */
};

/* ---- pg_write_sql.c: statements ---- */

/* A statement's result as a JD_E* code, telling a record's own fault
 * (bad data: JD_EINVAL; a duplicate: JD_EEXIST) from the transaction's. */
int jd_pgw_rc(const PGresult *r);
/* The parameter types of types (one letter per parameter: i bigint,
 * t text, I bigint[], T text[], B bool[]) as oids[0..*n). */
void jd_pgw_oids(const char *types, Oid *oids, int *n);
/* Log a writer failure once per distinct message, not once per batch. */
void jd_pgw_log_failure(struct jd_store *s, const char *what);
/* Run sql (no parameters) on the writer's connection: 0 or JD_E*. */
int jd_pgw_exec(struct jd_store *s, const char *sql);
/* The prepared name of statement PS_*. */
const char *jd_pgw_stmt(int i);
/* Prepare every statement on the (new) session. 0 or JD_EIO. */
int jd_pgw_prepare(struct jd_store *s);
/* Run prepared statement name at once (sequential follow-ups only); *res
 * (caller clears) or NULL. The JD_E* code. */
int jd_pgw_xq(struct jd_store *s, const char *name, const struct jd_pgw_prm *p, PGresult **res);
/* Statement i's first column of its first row as an integer (*found
 * false: no row). */
int jd_pgw_xint(struct jd_store *s, int i, const struct jd_pgw_prm *p, int64_t *out, bool *found);

/* The writer's scratch (made on first use, freed by jd_pg_write_free). */
struct jd_pg_wscratch *jd_pgw_scratch(struct jd_pg *pg);
/* The transaction's queue count changes: add d to (queue, state); forget
 * them; remember them (a savepoint) and go back there (its rollback). */
void jd_pgw_count(struct jd_pg_wscratch *w, const char *queue, int state, int64_t d);
void jd_pgw_counts_clear(struct jd_pg_wscratch *w);
void jd_pgw_counts_mark(struct jd_pg_wscratch *w);
void jd_pgw_counts_restore(struct jd_pg_wscratch *w);

/* ---- pg_write_apply.c: one record ---- */

/* Apply w: 0, NOROW (pipelined: never), or a JD_E* code
 * (jd_pgw_record_fault tells the record's own). */
int jd_pgw_apply(struct jd_pgw_ctx *c, struct jd_write *w);
/* Run (sequential) or queue (pipelined: always 0 unless it cannot be
 * sent) one statement of w, whose result must show kind (RK_*). */
int jd_pgw_emit(struct jd_pgw_ctx *c, struct jd_write *w, const char *name,
                const struct jd_pgw_prm *p, int kind);
/* Check r against kind for w and apply what it tells (version, counts).
 * 0, NOROW, or the statement's error code. */
int jd_pgw_take(struct jd_pgw_ctx *c, struct jd_write *w, int kind, const PGresult *r);
/* The job change statement for the JD_SET_* mask set, prepared on first
 * use (never inside a pipeline); NULL when it cannot be prepared. */
const char *jd_pgw_change_stmt(struct jd_store *s, unsigned set);
bool jd_pgw_change_valid(const struct jd_write *w);
/* A record's own failure (its savepoint is rolled back, the rest commits)
 * rather than the transaction's. */
bool jd_pgw_record_fault(int rc);

/* ---- pg_write_pipe.c: the pipelined fast path ---- */

#define JD_PG_PIPE_CHUNK                                                                           \
    256 /* statements in flight before reading their results: the                                  \
           results must fit the sockets' buffers, or both ends block */
/* Every record's statements pipelined in one transaction, a few round
 * trips for the whole batch. 0: all applied (transaction open, counts
 * written); 1: a record did not apply (rolled back, ids restored: redo
 * with savepoints); -1: the transaction failed. */
int jd_pgw_apply_pipelined(struct jd_pgw_ctx *c, struct jd_write **b, int *rcs, size_t n);
/* PS_COUNT_ADD's parameters for the transaction's queue count changes in
 * *p; false when there are none. The arrays live in the scratch until
 * the next batch. */
bool jd_pgw_counts_prm(struct jd_pgw_ctx *c, struct jd_pgw_prm *p);
/* The grouped changes' answer (RK_CHANGES). */
int jd_pgw_take_changes(struct jd_pgw_ctx *c, const PGresult *r);

/* ---- pg_write.c: the session and COMMIT ---- */

/* A usable session: out of any pipeline and transaction a failure left it
 * in, reconnected (and statements prepared again) if the connection was
 * lost. 0 or JD_EIO. */
int jd_pgw_session(struct jd_store *s);
enum { HZ_KEEP, HZ_NEXT }; /* what a COMMIT does to the horizon */
/* COMMIT, true only if the server committed (an aborted transaction
 * answers COMMIT with ROLLBACK); with counts, PS_COUNT_ADD first, with
 * note, pg_notify(note) if some node watches, else pg_notify(must) if must
 * is not empty (PS_NOTIFY), and with HZ_NEXT, the horizon's next bound
 * (PS_HZ_NEXT), all in the same round trip (a pipeline). */
bool jd_pgw_commit(struct jd_store *s, const struct jd_pgw_prm *counts, const char *note,
                   const char *must, int hz);

/* ---- pg_horizon.c: the event horizon (storage/pg.h) ---- */

#define HZ_CLEAR_SQL "UPDATE jd_nodes SET pending_event_id = NULL WHERE id = $1"
#define HZ_NEXT_SQL "UPDATE jd_nodes SET pending_event_id = nextval('events_id_seq') WHERE id = $1"
/* Whether any of b[0..n) may insert into events. */
bool jd_pgw_needs_horizon(struct jd_write **b, size_t n);
/* Before the batch's BEGIN: every event id the transaction takes is
 * greater than what this publishes. 0 or JD_EIO (nothing is applied). */
int jd_pgw_hz_publish(struct jd_store *s);
/* After a batch that did not commit: an idle writer holds no horizon. */
void jd_pgw_hz_clear(struct jd_store *s);

#endif
