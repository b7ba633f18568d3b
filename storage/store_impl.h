/*
 * Storage internals shared by the storage modules (store.c: open, close,
 * reads; writer.c: the writer thread; schema.c: migrations). Not a contract
 * for other layers: they see storage/store.h only.
 *
 * Threading: the fields under "writer thread" belong to the writer thread
 * once it runs (the opening thread sets them up before pthread_create, which
 * orders those writes before the writer's first access). Atomics are shared
 * between producers, readers and the writer; each use states its ordering.
 */
#ifndef JD_STORAGE_STORE_IMPL_H
#define JD_STORAGE_STORE_IMPL_H

#include "storage/store.h"

#include "common/alloc.h"
#include "common/error.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct jd_error;

/* Writer statements, prepared once on the write connection. */
enum {
    JD_WS_BEGIN,
    JD_WS_COMMIT,
    JD_WS_ROLLBACK,
    JD_WS_SAVEPOINT,
    JD_WS_RELEASE,
    JD_WS_ROLLBACK_TO,
    JD_WS_IDEM_INSERT,
    JD_WS_IDEM_GET,
    JD_WS_JOB_INSERT,
    JD_WS_DEF_INSERT,
    JD_WS_JOB_UPDATE,
    JD_WS_VERSION_GET,
    JD_WS_EVENT_INSERT,
    JD_WS_QUEUE_UPSERT,
    JD_WS_RET_DEL_EVENTS,
    JD_WS_RET_DEL_JOB,
    JD_WS_RET_DEL_DEF,
    JD_WS_RET_DEL_IDEM,
    JD_WS_RET_MAX_ID,
    JD_WS_RET_MAX_EVENT, /* issue 19: event ids never reused */
    JD_WS_SCHED_UPSERT,
    JD_WS_SCHED_UPDATE,
    JD_WS_SCHED_EVENT,
    JD_WS_SCHED_TRIM,
    JD_WS_SCHED_DELETE,
    JD_WS_SCHED_DEL_EVENTS,
    JD_WS_JOB_CRASHES,
    JD_WS_QUEUE_CONFIG,
    JD_WS_RET_QUEUES,
    JD_WS_RET_SELECT_QS,
    JD_WS_UNIQUE_TAKE,
    JD_WS_UNIQUE_HOLDER,
    JD_WS_UNIQUE_RELEASE,
    JD_WS_RET_DEL_UNIQUE,
    JD_WS_JOB_DELETE, /* issue 19: DELETE /v1/jobs/{id} */
    JD_WS_JOB_STATE,
    JD_WS_COUNT_ADD,
    JD_WS_RCMD_UPSERT,
    JD_WS_RCMD_DELETE,
    JD_WS_TASK_UPSERT,
    JD_WS_RET_DEL_TASKS,
    JD_WS_N
};

#define JD_UPDATE_MASKS 128 /* every combination of the 7 JD_SET_* flags */

struct jd_rconn; /* a pooled read-only connection (store.c) */
struct jd_pg;    /* the PostgreSQL backend (storage/pg.h); NULL for SQLite */

#define JD_EV_ROWS 16 /* most events one INSERT writes (writer.c, the batch path) */

/* ---- packed runs of events (issue 17/16: fewer history rows per job) ----
 *
 * An events row holds a run of one job's consecutive events: the first in
 * its columns (seq, time_ms, kind, tag, data) and the rest, in seq order,
 * in its `more` column (NULL for a run of one: every row written before
 * the migration). The row's run covers seq .. seq + n - 1 and ids id ..
 * id + n - 1: the writers hand out n ids per row (SQLite: event_max; the
 * PostgreSQL sequence steps by JD_EV_RUN_MAX), so every event keeps an id
 * of its own for GET /v1/events. Each packed event is
 * "<kind>,<tag>,<time_ms - first's>,<bytes of data or -1 for NULL>:<data>",
 * concatenated; no separator is needed since the length is explicit. */
#define JD_EV_RUN_MAX                                                                              \
    8 /* most events one row holds: a reader of "after seq S" or "after id A"                      \
         starts JD_EV_RUN_MAX - 1 back to find the row that contains S + 1 */

/* The data of a state event the writers make, per state:
 * {"state":"<jd_job_state_name>"}. */
extern const char *const jd_state_event_data[JD_JOB_NSTATES];

/* A growing `more` text (caller frees p). */
struct jd_evpack {
    char *p;
    size_t len, cap;
    unsigned n; /* events in the run, the first included */
};
/* Append one event (the run's second or later) to b. */
void jd_evpack_put(struct jd_evpack *b, int kind, int64_t tag, int64_t dt, const char *data);
/* The events of one row: first (whose data the array takes) and those packed
 * in more[0..len) (NULL: none), appended to *ev (grown as needed, *cap its
 * capacity) with seq, time_ms and job_id filled in. Events with
 * seq <= after_seq are skipped (their data freed). 0, or JD_EIO for a
 * malformed `more` (nothing of it appended). */
int jd_evpack_expand(struct jd_job_event *first, const char *more, size_t len, int64_t after_seq,
                     struct jd_job_event **ev, size_t *n, size_t *cap);
/* How many events a row with this `more` holds (1 + those packed). */
unsigned jd_evpack_count(const char *more, size_t len);
/* The next event packed in [*p, end): f = {kind, tag, time_ms - the
 * first's}, its data (not NUL-terminated) and length in bytes (-1: NULL).
 * false at the end, or when malformed (then *p < end). */
bool jd_evpack_next(const char **p, const char *end, int64_t f[3], const char **data, int64_t *dl);
/* Drop the state events (kind 0) of ev[0..n) in place (freeing their data):
 * recovery reads only the others. The count left. */
size_t jd_evpack_drop_state(struct jd_job_event *ev, size_t n);
/* One row of the event stream's scan (find.c's event SQL); strings
 * borrowed. */
struct jd_stream_row {
    int64_t id, job_id, seq, time_ms;
    int kind;
    const char *data, *queue, *more;
    size_t more_len;
    enum jd_job_state job_state;
    bool match; /* the row's job passes the filters but the state */
};
/* Adds the row's events that pass f (state events whose data names a
 * state in f->state_mask, ids above f->after_id) to out[*k..f->limit);
 * *last becomes the id of the last event examined (none once the page is
 * full). */
void jd_stream_row_add(const struct jd_event_find *f, const struct jd_stream_row *r,
                       struct jd_stream_event *out, size_t *k, int64_t *last);
/* The raw text of the top-level member key of the JSON object in
 * json[0..len) (a string keeps its quotes); false when there is none. */
bool jd_json_member(const char *json, size_t len, const char *key, const char **val, size_t *vlen);

struct jd_store {
    struct jd_pg *pg; /* set: the store is on PostgreSQL (storage/pg.h), none of the SQLite
                         fields below are used but the queue, the writer and the stats */
    char *path;       /* the database file (or the PostgreSQL URL) */
    char *lock_path;  /* "<path>.lock", held with flock(LOCK_EX) while open */
    int lock_fd;
    bool sync_full;
    int64_t retention_ms;
    unsigned max_batch;
    bool unclean;     /* the last process to open the file did not close it */
    bool marked_open; /* meta 'open' is 1 for this process: cleared at close */

    /* ---- writer thread ---- */
    sqlite3 *wdb;
    sqlite3_stmt *wst[JD_WS_N];
    sqlite3_stmt *upd[JD_UPDATE_MASKS];    /* UPDATE per JD_SET_* combination, lazily */
    sqlite3_stmt *ev_rows[JD_EV_ROWS + 1]; /* INSERT of n events (writer.c), lazily */
    pthread_t writer;
    bool writer_started;
    int64_t retention_due_ms; /* wall ms of the next retention pass */
    bool queue_retention;     /* some queue has its own retention: pass per (queue, state) */
    /* The last events.id handed out. The writer gives every event an
     * explicit id above it, so ids rise in commit order even after the
     * newest events were deleted (retention, DELETE), which SQLite's own
     * max(rowid) + 1 would hand out again: GET /v1/events resumes by id. */
    int64_t event_max;

    /* ---- producers -> writer ---- */
    /* Treiber stack of submitted records, newest first; the writer takes it
     * whole with one exchange and reverses it, so it is a lock-free MPSC
     * queue without ABA (nobody pops single nodes). */
    _Atomic(struct jd_write *) head;
    atomic_int writer_sleeping; /* the writer is (about to be) waiting on cv */
    atomic_int release_wanted;  /* jd_store_release_memory: drop the page cache when idle */
    atomic_int closing;         /* jd_store_close began: submits refused */
    atomic_int submitters;      /* submits in progress (close waits for 0) */
    pthread_mutex_t mu;         /* guards stop and the cv wait */
    pthread_cond_t cv;
    bool stop; /* under mu: drain and exit */

    /* ---- writer -> completion thread (jd_store_done_thread; opt-in) ---- */
    atomic_bool done_async; /* set once, never cleared: batches go to dq */
    pthread_t done_thr;
    pthread_mutex_t dq_mu; /* guards dq_*; initialised with done_async */
    pthread_cond_t dq_cv;
    struct jd_write *dq_head, *dq_tail; /* committed, done() not yet called, FIFO */
    bool dq_stop, dq_waiting;           /* under dq_mu */

    atomic_int_least64_t next_id;

    /* ---- statistics (relaxed: independent counters read for /metrics) ---- */
    atomic_uint_least64_t st_commits, st_records, st_failed_commits, st_retention_deleted;
    atomic_uint_least64_t st_enqueued, st_finished;
    atomic_uint_least64_t st_batch_hist[8];
    atomic_uint_least64_t st_commit_us_hist[10];
    atomic_uint_least64_t st_commit_us_sum;

    /* ---- checkpointer thread (checkpoint.c) ---- */
    sqlite3 *cdb; /* its own connection */
    pthread_t ckpt;
    bool ckpt_started;
    pthread_mutex_t ckpt_mu;
    pthread_cond_t ckpt_cv;
    bool ckpt_wanted, ckpt_stop; /* under ckpt_mu */
    atomic_uint_least64_t st_checkpoints;

    /* ---- readers ---- */
    pthread_mutex_t pool_mu;
    struct jd_rconn *pool; /* idle read connections */
};

/* An internal record kind (not part of enum jd_write_op): a barrier whose
 * done() fires once everything enqueued before it is committed. */
#define JD_W_SYNC_ ((enum jd_write_op)1000)

/* schema.c: bring the open write connection to the current schema, inside
 * transactions. 0, or JD_ECORRUPT / JD_EIO with err naming path. */
int jd_schema_migrate(sqlite3 *db, const char *path, struct jd_error *err);
/* schema.c: the application_id stamped into every Jackdaw database. */
#define JD_SCHEMA_APP_ID 0x4a44574b /* "JDWK" */

/* writer.c: prepare the writer statements and start the thread. */
int jd_writer_start(struct jd_store *s, struct jd_error *err);
/* writer.c: drain the queue (every done() fires), stop the thread. */
void jd_writer_stop(struct jd_store *s);

/* checkpoint.c: open the checkpointer's connection, hook the writer's
 * commits, start the thread. */
int jd_checkpointer_start(struct jd_store *s, struct jd_error *err);
/* checkpoint.c: stop the thread and close its connection (idempotent). */
void jd_checkpointer_stop(struct jd_store *s);

/* store.c, for find.c: a pooled read connection (get, then put back). */
int jd_rconn_get(struct jd_store *s, struct jd_rconn **out);
void jd_rconn_put(struct jd_store *s, struct jd_rconn *c);
sqlite3 *jd_rconn_db(struct jd_rconn *c);
/* One job by id on c: 0, JD_ENOENT, or an error. out freed with jd_job_clear. */
int jd_rconn_job_get(struct jd_rconn *c, int64_t id, struct jd_job *out);
/* BEGIN (true) or COMMIT (false) a read transaction on c: one snapshot. */
int jd_rconn_tx(struct jd_rconn *c, bool begin);

/* find.c: the SQL of one jd_store_job_find page and its parameters, in
 * order (tests run EXPLAIN QUERY PLAN on every shape). */
#define JD_FIND_MAX_BINDS (2 * JD_FIND_MAX_LABELS + 16)
struct jd_find_sql {
    char *sql; /* caller frees */
    int n;
    struct {
        const char *text; /* borrowed; NULL: an integer */
        int64_t i;
    } b[JD_FIND_MAX_BINDS];
};
int jd_find_sql_build(const struct jd_job_find *f, struct jd_find_sql *out);
int jd_event_sql_build(const struct jd_event_find *f, struct jd_find_sql *out);
/* The same reads in PostgreSQL's dialect ($n parameters; pg_find.c). */
int jd_find_sql_build_pg(const struct jd_job_find *f, struct jd_find_sql *out);
/* Events whose id is below it may be read (storage/pg.h, the event horizon). */
#define JD_PG_HORIZON_SQL                                                                          \
    "(SELECT coalesce(min(pending_event_id), 9223372036854775807) FROM jd_nodes)"
int jd_event_sql_build_pg(const struct jd_event_find *f, struct jd_find_sql *out);

/* The per-batch job-id tables of both writers (writer.c's vcache,
 * pg_write_pipe.c's job slots): open addressing with linear probing on a
 * job id (0 marks an empty slot), a power-of-two capacity at least twice
 * the batch so probe runs stay short. */
static inline size_t jd_idtab_cap(size_t n)
{
    size_t cap = 64;
    while (cap < 2 * n)
        cap *= 2;
    return cap;
}

/* Table t (*cap slots of slot_size bytes, or NULL) grown for a batch of
 * n and emptied; the table (the caller keeps it, frees it with free). */
static inline void *jd_idtab_reset(void *t, size_t *cap, size_t slot_size, size_t n)
{
    size_t want = jd_idtab_cap(n);
    if (want > *cap) {
        free(t);
        t = jd_xmalloc(want * slot_size);
        *cap = want;
    }
    memset(t, 0, *cap * slot_size);
    return t;
}

/* Where id's probe run starts in a table of cap slots (Fibonacci hashing:
 * ids are sequential, the high bits of the product spread them). */
static inline size_t jd_idtab_home(int64_t id, size_t cap)
{
    return (size_t)((uint64_t)id * 0x9E3779B97F4A7C15ull >> 20) & (cap - 1);
}

/* A job insert's checks, shared by both backends: its id (set into
 * w->job_id) and *created (the job's own time, else now), or JD_EINVAL for
 * a record that cannot be inserted. */
static inline int jd_write_insert_check(struct jd_write *w, int64_t now, int64_t *created)
{
    const struct jd_job *j = w->job;
    if (!j || !j->queue || !j->definition || (unsigned)j->state >= JD_JOB_NSTATES)
        return JD_EINVAL;
    int64_t id = j->id ? j->id : w->job_id;
    if (id <= 0)
        return JD_EINVAL;
    w->job_id = id;
    *created = j->created_ms ? j->created_ms : now;
    return 0;
}

/* writer.c, shared by both backends: account for a finished batch (stats)
 * and fire its done()s in order (on the writer or the completion thread). */
void jd_writer_finish_batch(struct jd_store *s, struct jd_write **b, int *rcs, size_t n,
                            size_t records, uint64_t us, bool ok);

/* Map a SQLite result code to a JD_E* code. */
int jd_store_sqlite_rc(int rc);

/* sqlite_mem.c: SQLite's allocator, glibc malloc behind a per-thread cache
 * of small blocks; install before SQLite initialises (once per process;
 * JD_SQLITE_MALLOC=system in the environment keeps SQLite's own). Trim
 * gives the calling thread's cached blocks back to glibc. */
void jd_sqlite_mem_install(void);
void jd_sqlite_mem_trim(void);
void jd_store_release_readers(struct jd_store *s); /* store.c, for the writer */

#endif
