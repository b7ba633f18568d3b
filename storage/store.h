/*
 * Durable storage behind one interface: SQLite (a file path) or PostgreSQL
 * (a postgres:// URL; storage/pg.h).
 *
 * Writes: one writer thread owns the write connection. Producers on any
 * thread enqueue struct jd_write records (lock-free MPSC); the writer drains
 * whatever is queued into one BEGIN IMMEDIATE ... COMMIT (group commit), then
 * fires each record's done() in enqueue order. done() is called only after
 * the commit is durable (as --sync says) or with an error: nothing is
 * reported durable that is not.
 *
 * Reads: on read-only connections from a small pool (as many as threads
 * read at once, opened lazily, each with its prepared statements), safe from
 * any thread, never blocked by the writer (WAL).
 *
 * Layout and performance notes are in storage/schema.c and storage/writer.c;
 * WAL checkpoints run on a background thread (storage/checkpoint.c).
 *
 * Ids: job ids are positive 64-bit integers handed out by jd_store_next_id
 * (monotonic, seeded from the database at open), so callers know a job's id
 * before its insert commits. Shown to users as decimal strings.
 *
 * Versions: every record that touches a job increments jobs.version and
 * appends one history event whose seq equals the new version; an insert
 * creates version 1 with a "state" event. So a job's history is seq 1..version.
 */
#ifndef JD_STORAGE_STORE_H
#define JD_STORAGE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct jd_error;
struct jd_store;

enum jd_job_state {
    JD_JOB_QUEUED = 0, /* accepted, waiting to run (incl. scheduled for later) */
    JD_JOB_RUNNING = 1,
    JD_JOB_WAITING = 2, /* idle, waiting for a message */
    JD_JOB_SUCCEEDED = 3,
    JD_JOB_FAILED = 4,
    JD_JOB_CANCELLED = 5,
};
#define JD_JOB_NSTATES 6

const char *jd_job_state_name(enum jd_job_state s); /* "queued", ... */
int jd_job_state_parse(const char *name);           /* state, or -1 */
static inline bool jd_job_state_terminal(enum jd_job_state s)
{
    return s >= JD_JOB_SUCCEEDED;
}

enum jd_event_kind {
    JD_EVK_STATE = 0,    /* data: {"state":"running",...} */
    JD_EVK_DISPATCH = 1, /* tag, data: {"command":..,"attempt":n,"args":..} */
    JD_EVK_COMPLETE = 2, /* tag, data: {"result":..} or {"error":{..}} */
    JD_EVK_MESSAGE = 3,  /* data: {"topic":..,"data":..} */
    JD_EVK_CANCEL = 4,   /* data: {"reason":..} */
    JD_EVK_PROGRESS =
        5, /* tag, data: {"progress":..,"task":..,"worker":..} (a worker's heartbeat) */
};
const char *jd_event_kind_name(enum jd_event_kind k); /* "state", "dispatch", ... */

/* One row of the jobs table. Strings are malloc'd when returned by a read
 * (free with jd_job_clear); borrowed when passed to a write. */
struct jd_job {
    int64_t id;
    char *queue;
    int64_t priority;
    enum jd_job_state state;
    char *definition;  /* the job definition, JSON text */
    int64_t run_at_ms; /* wall ms; when it may start */
    uint32_t attempts; /* job-level attempts started (0 before the first run) */
    int64_t version;
    char *output;                                            /* JSON text or NULL */
    char *error;                                             /* JSON text or NULL */
    int64_t created_ms, updated_ms, started_ms, finished_ms; /* 0: unset */
    char *idempotency_key;                                   /* or NULL */
    char *schedule_id; /* the schedule that created it, or NULL */
    uint32_t crashes;  /* times in a row the process died while it was being run */
    char *handler;     /* insert only: the top-level handler of a one-command job, or NULL
                          (indexed for GET /v1/jobs?handler=; reads leave it NULL) */
};
void jd_job_clear(struct jd_job *j); /* frees the strings, zeroes the struct */

struct jd_job_event {
    int64_t job_id;
    int64_t seq;
    int64_t time_ms;
    enum jd_event_kind kind;
    uint32_t tag;
    char *data; /* JSON text or NULL; malloc'd by reads */
};
void jd_job_events_free(struct jd_job_event *ev, size_t n);

/* ---- opening ---- */

struct jd_store_config {
    const char *path;     /* database file; its directory must exist */
    bool sync_full;       /* true: synchronous=FULL (fsync per commit); false: NORMAL */
    int64_t retention_ms; /* delete terminal jobs finished longer ago; 0: keep forever
                             (a queue's own retention, JD_W_QUEUE_CONFIG, overrides it) */
    unsigned max_batch;   /* records per transaction at most; 0: 1024 */
    uint64_t max_bytes;   /* refuse to grow the database past this many bytes (commits
                             then fail with JD_EIO, as on a full disk); 0: no limit */
    int64_t lease_ms;     /* cluster (PostgreSQL): a node's lease, --lease; 0: 10 s */
    /* PostgreSQL's read pool (storage/pg.h): connections at most (0: 16), how long
     * a reader waits for one before failing with JD_EBUSY (0: 5 s), and how long
     * one may sit idle before it is closed (0: 60 s). */
    unsigned read_max;
    int64_t read_wait_ms;
    int64_t read_idle_ms;
};

/* Open (create, migrate) the database and start the writer. Clear errors
 * (JD_EIO / JD_ECORRUPT / JD_EBUSY with detail naming the file) for a
 * missing or read-only directory, a corrupt or foreign file, a newer schema,
 * or a database another running Jackdaw holds. */
int jd_store_open(const struct jd_store_config *cfg, struct jd_store **out, struct jd_error *err);
/* Drain the queue (every done() fires), stop the writer, close. Call it
 * after every producer and reader has stopped, never from a done(). */
void jd_store_close(struct jd_store *s);

/* Whether the last process that opened this database ended without closing
 * it (it crashed or was killed): then the jobs it was running were being run
 * when it died. False for a new database. */
bool jd_store_unclean(const struct jd_store *s);

/* The database as logs may show it (caller frees): a PostgreSQL URL
 * without its password, a file path as it is. */
char *jd_store_display_path(const char *path);

/* The schema version this binary migrates to. */
int jd_store_schema_version(void);

/* A fresh job id (thread-safe). */
int64_t jd_store_next_id(struct jd_store *s);

/* ---- writes ---- */

enum jd_write_op {
    JD_W_JOB_INSERT = 0,   /* insert `job` (+ idempotency key/fingerprint); event: state queued */
    JD_W_JOB_CHANGE = 1,   /* update the fields in `set` and/or append one event */
    JD_W_QUEUE = 2,        /* upsert queue `queue` with `paused` */
    JD_W_SCHEDULE_PUT = 3, /* create or replace schedule `sched` (+ its event) */
    JD_W_SCHEDULE_CHANGE = 4, /* update schedule `sched` (JD_SSET_*) and/or append its event */
    JD_W_SCHEDULE_DELETE = 5, /* delete schedule `sched.id` and its history */
    JD_W_JOB_CRASHES = 6,     /* set job `job_id`'s crash count to `crashes`; no event is
                                 appended and the version does not change */
    JD_W_QUEUE_CONFIG = 7,    /* queue controls: upsert queue `queue`'s `queue_config` and
                                 `retain_ms` (its paused flag is kept) */
    JD_W_JOB_DELETE = 8,      /* (issue 19) delete terminal job `job_id` and its history;
                                 JD_ECONFLICT if it is not terminal, JD_ENOENT if missing */
    JD_W_COMMAND_PUT = 9,     /* create or replace remote command `rcmd` */
    JD_W_COMMAND_DELETE = 10, /* delete remote command `rcmd.name` (JD_ENOENT if none) */
    JD_W_TASK_PUT = 11,       /* create or replace task row `task` */
    JD_W_JOB_REQUEST = 12,    /* (cluster) put a request for job `job_id` in its inbox:
                                 kind JD_EVK_MESSAGE or JD_EVK_CANCEL with `data`; not
                                 fenced (any node may write it); JD_ENOENT if the job is
                                 missing, JD_ECONFLICT if it is terminal; sets request_id */
};

/* The remote-command part of a write record (borrowed strings). */
struct jd_rcmd_write {
    const char *name;
    const char *description; /* or NULL */
    int64_t timeout_ms;      /* 0: none */
    int64_t max_in_flight;   /* calls in flight at once; 0: no cap of its own */
};

/* States of a stored task row. */
enum jd_task_state {
    JD_TASK_CLAIMED = 1,   /* a worker holds it (lease_expires_ms) */
    JD_TASK_COMPLETED = 2, /* the worker completed or failed it */
    JD_TASK_EXPIRED = 3,   /* its lease ran out */
    JD_TASK_CANCELLED = 4, /* its job was cancelled (or its call timed out) */
};

/* The task part of a write record (borrowed strings). */
struct jd_task_write {
    const char *id;
    int64_t job_id;
    uint32_t tag, attempt;
    const char *command;
    enum jd_task_state state;
    const char *worker; /* or NULL */
    int64_t lease_expires_ms;
};

/* Fields of a schedule row a JD_W_SCHEDULE_CHANGE sets. */
enum {
    JD_SSET_PAUSED = 1u << 0,
    JD_SSET_RETIRED = 1u << 1,
    JD_SSET_NEXT_FIRE = 1u << 2,
    JD_SSET_LAST = 1u << 3, /* last_fire_ms, last_job_id, last_outcome */
};

/* The schedule part of a write record (borrowed strings). */
struct jd_schedule_write {
    const char *id;
    const char *definition; /* PUT: the schedule as JSON text */
    unsigned set;           /* CHANGE: JD_SSET_* */
    bool paused, retired;   /* PUT: both; CHANGE: as set says */
    int64_t next_fire_ms;   /* 0: none (paused, retired) */
    int64_t anchor_ms;      /* PUT: where intervals count from */
    int64_t last_fire_ms, last_job_id;
    const char *last_outcome;
    int64_t add_fires, add_skips; /* CHANGE: added to the counts */
    int64_t expect_next_fire_ms;  /* CHANGE: non-zero: apply only if the row's next_fire_ms is
                                     this (else JD_ECONFLICT), so a fire commits once however
                                     many nodes attempt it */
    /* the history event appended (PUT and CHANGE; event NULL: none) */
    const char *event; /* "fired", "skipped", "caught_up", "paused", ... */
    int64_t event_fire_ms, event_job_id;
    const char *event_data; /* JSON text or NULL */
};

enum {
    JD_SET_STATE = 1u << 0,
    JD_SET_OUTPUT = 1u << 1,
    JD_SET_ERROR = 1u << 2,
    JD_SET_RUN_AT = 1u << 3,
    JD_SET_ATTEMPTS = 1u << 4,
    JD_SET_STARTED = 1u << 5,
    JD_SET_FINISHED = 1u << 6,
};

/*
 * One record. The caller owns it and everything it points to, which must
 * stay valid until done() is called (done may free it). Fields not used by
 * the op are ignored.
 */
struct jd_write {
    enum jd_write_op op;
    int64_t job_id;

    /* JD_W_JOB_INSERT */
    const struct jd_job *job;     /* id, queue, priority, state, definition, run_at_ms,
                                     created_ms, idempotency_key */
    const char *idem_fingerprint; /* stored with the idempotency key, or NULL */
    /* The job's unique key (or NULL), stored in the same commit; fails the
     * record with JD_ECONFLICT (w->job_id then names the holder) while
     * another job holds it: one not yet terminal whose hold has not
     * expired (unique_expires_ms, wall ms; 0: never). */
    const char *unique_key;
    int64_t unique_expires_ms;
    /* Cluster (PostgreSQL) only: insert the job with no owner node, so it
     * waits in the database until some node claims it (jd_store_claim):
     * the queued-job window of a node that holds enough queued jobs
     * already. SQLite ignores it. */
    bool unowned;

    /* JD_W_JOB_CHANGE: fields to update (JD_SET_*), then one event appended */
    unsigned set;
    enum jd_job_state state;
    const char *output, *error; /* JSON text or NULL */
    int64_t run_at_ms, started_ms, finished_ms;
    uint32_t attempts;
    uint32_t crashes;       /* JD_W_JOB_CRASHES */
    bool release_unique;    /* JD_W_JOB_CHANGE: delete the job's unique key in the same commit */
    int64_t request_id;     /* JD_W_JOB_CHANGE: delete this inbox request in the same commit (the
                               owner recording a cancel or message another node took; 0: none);
                               JD_W_JOB_REQUEST: set to the new request's id */
    int64_t expect_version; /* JD_W_JOB_CHANGE: non-zero: apply only while the job's version is
                               still this (a retry of a finished job, at the version the node
                               read), else JD_ECONFLICT. Checked on PostgreSQL, where a stale
                               node's retry could reopen a job finished again elsewhere; on
                               SQLite one node writes and jd_jobs.mu orders its records. */
    /* the event (JD_W_JOB_CHANGE; for an insert the store writes
     * {"state":"queued"} itself) */
    enum jd_event_kind kind;
    uint32_t tag;
    const char *data; /* JSON text or NULL */

    /* JD_W_QUEUE */
    const char *queue;
    bool paused;
    /* JD_W_QUEUE_CONFIG (with queue): the controls as JSON text (NULL: none)
     * and how long its succeeded, failed and cancelled jobs are kept
     * (indexed by state - JD_JOB_SUCCEEDED; 0: as --retention says) */
    const char *queue_config;
    int64_t retain_ms[3];

    /* JD_W_SCHEDULE_* */
    struct jd_schedule_write sched;

    /* JD_W_COMMAND_*, JD_W_TASK_PUT */
    struct jd_rcmd_write rcmd;
    struct jd_task_write task;

    /* Called on the writer thread (or, after jd_store_done_thread, on the
     * completion thread) after the commit (rc 0) or failure (rc <
     * 0): JD_ECONFLICT for a unique key another job holds (w->job_id is then
     * the holder), JD_EEXIST for a duplicate idempotency key (w->job_id is then set to
     * the existing job), JD_ENOENT for a change to a missing job (or a
     * schedule change or delete of a missing schedule), JD_EIO when
     * the transaction failed. Must not block; may enqueue more writes. */
    void (*done)(void *arg, struct jd_write *w, int rc);
    void *arg;

    /* Set by the writer before done(): the job's version after this record
     * (== the seq of the event it appended), and the wall ms it stamped the
     * record with (a job change's updated_ms). */
    int64_t version;
    int64_t time_ms;

    struct jd_write *next_; /* writer-owned link */
    size_t group_;          /* writer-owned: size of the all-or-nothing group it starts */
    int rc_;                /* writer-owned: the rc handed to done() */
};

/* Enqueue one record; it is applied inside its own savepoint (its failure
 * does not fail others in the same commit). 0, or JD_ESHUTDOWN after close
 * began (done is not called then). */
int jd_store_submit(struct jd_store *s, struct jd_write *w);
/* Enqueue n records that commit together or not at all (all done() get the
 * same failure rc if one fails), e.g. a batch of job inserts. */
int jd_store_submit_many(struct jd_store *s, struct jd_write **ws, size_t n);
/* Block until everything enqueued so far is committed (tests, shutdown). */
int jd_store_sync(struct jd_store *s);
/*
 * Opt-in: from the next commit on, done() callbacks run on one dedicated
 * completion thread instead of the writer, so the writer starts the next
 * transaction while they run. Still one thread, still in enqueue order, still
 * only after the commit; done() must still not block, and jd_store_close
 * still drains them all. Call once, from the thread that opened the store,
 * before jd_store_close. 0 or JD_EIO (thread creation failed: unchanged).
 */
int jd_store_done_thread(struct jd_store *s);

/* ---- reads (any thread) ---- */

/* JD_ENOENT if no such job. out is filled; free with jd_job_clear. */
int jd_store_job_get(struct jd_store *s, int64_t id, struct jd_job *out);

struct jd_job_filter {
    int state;            /* enum jd_job_state, or -1 for any */
    const char *queue;    /* or NULL for any */
    const char *schedule; /* jobs this schedule created, or NULL for any (then queue is
                             ignored) */
    int64_t before_id;    /* keyset cursor: only ids < before_id; 0: from the newest */
    unsigned limit;       /* 1..1000 */
};
/* Newest first. *rows freed with jd_jobs_free. *next_cursor is the id to
 * pass as before_id for the next page, or 0 when there is none. */
int jd_store_job_list(struct jd_store *s, const struct jd_job_filter *f, struct jd_job **rows,
                      size_t *n, int64_t *next_cursor);
void jd_jobs_free(struct jd_job *rows, size_t n);

/*
 * Finding jobs by any combination of filters (GET /v1/jobs with labels,
 * handler, creation time; the bulk actions). One filter drives the read
 * through its index (the first label, else schedule, queue (+state),
 * handler, creation time, state, the primary key) and the others are
 * checked on each row it yields, each through an index or the row itself,
 * so no query scans a table (tests run EXPLAIN QUERY PLAN on every shape).
 * A page examines at most JD_FIND_SCAN index entries: a filter that
 * matches rarely answers with fewer rows and a cursor to go on from, so
 * no request costs more than that however selective it is.
 */
#define JD_FIND_MAX_LABELS 8   /* label filters per query: each is a lookup per row */
#define JD_FIND_SCAN 10000     /* index entries one page examines at most (~10 ms) */
#define JD_LABEL_VALUE_MAX 256 /* label values longer than this are refused at submit */

struct jd_job_find {
    int state;                    /* enum jd_job_state, or -1 for any */
    const char *queue, *schedule; /* or NULL for any */
    const char *handler;          /* the top-level "handler" of the job, or NULL */
    size_t n_labels;              /* 0..JD_FIND_MAX_LABELS; all must match */
    const char *label_key[JD_FIND_MAX_LABELS], *label_value[JD_FIND_MAX_LABELS];
    int64_t created_after_ms;  /* created_ms >= this; 0: unbounded */
    int64_t created_before_ms; /* created_ms < this; 0: unbounded */
    int64_t max_id;            /* only ids <= this (a bulk action's snapshot); 0: any */
    /* Keyset cursor from the previous page (jd_job_find_cursor), zeros: first page. */
    int64_t after_id, after_created_ms;
    unsigned limit; /* 1..1000 */
};
/* Where a page ended; pass back as after_id/after_created_ms. id 0: no more. */
struct jd_job_find_cursor {
    int64_t id, created_ms;
};
/* Newest first (by id; by creation time, then id, when a creation bound
 * drives the read). ids_only: rows have only id, state and queue set
 * (bulk actions). *rows freed with jd_jobs_free. JD_EINVAL for a bad filter. */
int jd_store_job_find(struct jd_store *s, const struct jd_job_find *f, bool ids_only,
                      struct jd_job **rows, size_t *n, struct jd_job_find_cursor *next);
/* Whether the find is ordered by creation time (its cursor then needs both fields). */
bool jd_store_find_by_created(const struct jd_job_find *f);

/*
 * The global stream of job transitions (GET /v1/events): every state
 * event of every job in commit order. events.id is assigned by the one
 * writer in commit order, so a reader that has seen id N has seen every
 * committed event up to N. Filters are checked per event through the jobs
 * primary key and the job_labels key; a call examines at most JD_FIND_SCAN
 * events. Events of deleted jobs (retention, DELETE) are gone with them.
 */
struct jd_event_find {
    int64_t after_id;    /* only events with id > after_id */
    const char *queue;   /* or NULL */
    unsigned state_mask; /* 1 << enum jd_job_state for the states wanted; 0: any */
    size_t n_labels;
    const char *label_key[JD_FIND_MAX_LABELS], *label_value[JD_FIND_MAX_LABELS];
    unsigned limit; /* 1..1000 */
};
struct jd_stream_event {
    int64_t id, job_id, seq, time_ms;
    enum jd_job_state state;
    char *queue, *data; /* malloc'd */
    char *traceparent;  /* the job's W3C traceparent (malloc'd), or NULL */
};
/* Matching events, ascending id; *next_after is where the next call goes on
 * (past the non-matching events examined too, so a rare filter still moves
 * forward); equal to after_id when there was nothing newer. Free with
 * jd_stream_events_free. */
int jd_store_event_stream(struct jd_store *s, const struct jd_event_find *f,
                          struct jd_stream_event **rows, size_t *n, int64_t *next_after);
void jd_stream_events_free(struct jd_stream_event *rows, size_t n);
/* The newest event id (0 when there is none): where a live stream starts. */
int jd_store_event_last_id(struct jd_store *s, int64_t *id);

/* Events with seq > after_seq, ascending, at most limit (1..10000). */
int jd_store_events(struct jd_store *s, int64_t job_id, int64_t after_seq, unsigned limit,
                    struct jd_job_event **events, size_t *n);

struct jd_queue_counts {
    char *queue;
    bool paused;
    int64_t counts[JD_JOB_NSTATES]; /* indexed by enum jd_job_state */
};
/* Every queue that has jobs or a row in the queues table. Free with
 * jd_queue_counts_free. */
int jd_store_queue_counts(struct jd_store *s, struct jd_queue_counts **rows, size_t *n);
void jd_queue_counts_free(struct jd_queue_counts *rows, size_t n);

/* The queued job of queue (borrowed) with the lowest id, i.e. the one
 * waiting longest: 0 with its id and creation time; JD_ENOENT if the queue
 * has none queued. One index probe. */
int jd_store_oldest_queued(struct jd_store *s, const char *queue, int64_t *job_id,
                           int64_t *created_ms);

/* 0 and *job_id (+ *fingerprint, caller frees, may be NULL) if key is
 * known; JD_ENOENT otherwise. */
int jd_store_idem_lookup(struct jd_store *s, const char *key, int64_t *job_id, char **fingerprint);

/* Recovery: for every non-terminal job (ascending id), call fn with the job
 * and its events of kind dispatch, complete, message and cancel, ascending
 * seq. Borrowed for the call. Stops early if fn returns non-zero
 * (returning that value if it is negative, else 0). */
typedef int (*jd_store_job_fn)(void *arg, const struct jd_job *job,
                               const struct jd_job_event *events, size_t n);
int jd_store_recover(struct jd_store *s, jd_store_job_fn fn, void *arg);

/* The started (running and waiting) jobs only, as jd_store_recover reads
 * them (ascending id, same fn and return): recovery with the queued-job
 * window, which pages queued jobs in per queue instead. */
int jd_store_recover_started(struct jd_store *s, jd_store_job_fn fn, void *arg);

/* The queued-job window (issue 17, item 4). A queued job's place in its
 * queue's run order: priority descending, then id ascending (the order of
 * the ready lists in server/jobs_admit.c). JD_QUEUED_START ranks before
 * every job. */
struct jd_queued_pos {
    int64_t priority, id;
};
#define JD_QUEUED_START ((struct jd_queued_pos){INT64_MAX, 0})
#define JD_QUEUED_PAGE_MAX 10000

/* At most limit (1..JD_QUEUED_PAGE_MAX) queued jobs of queue ranked after
 * `after`, in run order, leaving out those with run_at_ms > due_ms (pass
 * INT64_MAX for all; the left-out ones come through jd_store_queued_later).
 * fn as for jd_store_recover (each job with its events of kind > 0, one
 * snapshot for the page); *n counts the jobs handed to fn. The job's
 * priority and id are the next page's `after`. Jobs not yet due are
 * skipped inside the index (run_at_ms is one of its columns), without
 * reading their rows. 0, fn's negative return, or a JD_E* code. */
int jd_store_queued_page(struct jd_store *s, const char *queue, struct jd_queued_pos after,
                         int64_t due_ms, unsigned limit, jd_store_job_fn fn, void *arg, size_t *n);

/* At most limit (1..JD_QUEUED_PAGE_MAX) queued jobs of every queue that
 * were scheduled for later (run_at_ms > created_ms: a delay, a run_at or a
 * retry), ordered by (run_at_ms, id) after (after_run_at_ms, after_id)
 * and due by until_ms. fn, *n and the return as jd_store_queued_page. With
 * limit 1 and until_ms INT64_MAX it finds the next one due. */
int jd_store_queued_later(struct jd_store *s, int64_t after_run_at_ms, int64_t after_id,
                          int64_t until_ms, unsigned limit, jd_store_job_fn fn, void *arg,
                          size_t *n);

/* Unique keys held (recovery): fn(arg, key, job_id, expires_ms) for each,
 * borrowed for the call. 0 or a JD_E* code. */
int jd_store_unique_keys(struct jd_store *s,
                         void (*fn)(void *arg, const char *key, int64_t job_id, int64_t expires_ms),
                         void *arg);

/* Paused queues (names). Free with jd_strings_free. */
int jd_store_paused_queues(struct jd_store *s, char ***names, size_t *n);
/* Queues with controls: *pairs holds name, config JSON text, name, ...
 * (*n strings, twice the queues). Free with jd_strings_free. */
int jd_store_queue_configs(struct jd_store *s, char ***pairs, size_t *n);
void jd_strings_free(char **v, size_t n);

/* ---- schedules ---- */

/* One row of the schedules table; strings malloc'd by reads (free with
 * jd_schedule_row_clear). */
struct jd_schedule_row {
    char *id;
    char *definition; /* JSON text */
    bool paused, retired;
    int64_t next_fire_ms; /* 0: none */
    int64_t anchor_ms;    /* where intervals count from */
    int64_t last_fire_ms, last_job_id;
    char *last_outcome; /* or NULL */
    int64_t fires, skips;
    int64_t event_seq; /* seq of its newest history event */
    int64_t created_ms, updated_ms;
};
void jd_schedule_row_clear(struct jd_schedule_row *r);
void jd_schedule_rows_free(struct jd_schedule_row *rows, size_t n);

struct jd_schedule_event {
    int64_t seq, time_ms, fire_ms, job_id; /* fire_ms, job_id: 0 when not about one */
    char *kind;
    char *data; /* JSON text or NULL */
};
void jd_schedule_events_free(struct jd_schedule_event *ev, size_t n);

/* History kept per schedule: older events are deleted as new ones come. */
#define JD_SCHEDULE_EVENTS_KEEP 1000

/* JD_ENOENT if no such schedule. */
int jd_store_schedule_get(struct jd_store *s, const char *id, struct jd_schedule_row *out);
/* Schedules with id > after (NULL: from the first), ascending, at most limit
 * (1..1000). *next_cursor (caller frees) is the id to pass as after for
 * the next page, or NULL when there is none. */
int jd_store_schedule_list(struct jd_store *s, const char *after, unsigned limit,
                           struct jd_schedule_row **rows, size_t *n, char **next_cursor);
/* A schedule's events with seq > after_seq, ascending, at most limit
 * (1..10000). An unknown schedule has none. */
int jd_store_schedule_events(struct jd_store *s, const char *id, int64_t after_seq, unsigned limit,
                             struct jd_schedule_event **events, size_t *n);

/* ---- remote commands and tasks ---- */

struct jd_rcmd_row {
    char *name;
    char *description; /* or NULL */
    int64_t timeout_ms;
    int64_t created_ms, updated_ms;
    int64_t max_in_flight; /* 0: no cap of its own */
};
/* Every remote command, by name. Free with jd_rcmd_rows_free. */
int jd_store_commands(struct jd_store *s, struct jd_rcmd_row **rows, size_t *n);
void jd_rcmd_rows_free(struct jd_rcmd_row *rows, size_t n);
/* The stored state of task `id` (enum jd_task_state) and its job:
 * JD_ENOENT if no row. A claimed row whose attempt's completion is in the
 * job's history reads as JD_TASK_COMPLETED. */
int jd_store_task_state(struct jd_store *s, const char *id, int *state, int64_t *job_id);

/* Make w a barrier (sets w->op): submitted like any record, alone or with
 * others, it writes nothing, and its done fires once every record submitted
 * before it has been committed. */
void jd_store_write_barrier(struct jd_write *w);

/* A hint after a large drain (issue 17): the server is idle, give memory
 * back. Once the writer is next idle, on its thread: SQLite's page caches
 * (the idle read connections' and the writer's), the writer's batch
 * buffers, then freed heap to the system (malloc_trim, every arena). Any
 * thread, any lock held (it only sets a flag and queues a barrier). */
void jd_store_release_memory(struct jd_store *s);

/* Was attempt `attempt` of (job_id, tag) ever claimed (has a task row)?
 * 0 with *claimed set, or a JD_E* code. */
int jd_store_task_claimed(struct jd_store *s, int64_t job_id, uint32_t tag, uint32_t attempt,
                          bool *claimed);

struct jd_store_stats {
    uint64_t commits, records, failed_commits, retention_deleted;
    uint64_t queue_depth;        /* records waiting for the writer */
    uint64_t batch_hist[8];      /* batch sizes: <=1,<=4,<=16,<=64,<=256,<=1024,<=4096,more */
    uint64_t commit_us_hist[10]; /* commit latency: <=100us,250,500,1ms,2.5,5,10,25,100ms,more */
    uint64_t commit_us_sum;
    uint64_t checkpoints; /* WAL checkpoints that copied frames (background or writer) */
};
void jd_store_stats(struct jd_store *s, struct jd_store_stats *out);

/* ---- the cluster (PostgreSQL only: storage/pg.h) ----
 *
 * Several nodes share one PostgreSQL database. Each node incarnation holds
 * a lease (its jd_nodes row), heartbeated every lease/5 with the database's
 * clock. Every node runs a takeover pass every lease/2: node rows whose
 * lease lapsed are deleted and, in the same statement, their unfinished
 * jobs lose their owner; any node then claims unowned jobs
 * (jd_store_claim) and replays them from their history. Every write for a
 * job is fenced on its owner (JD_ESTALE: another incarnation owns it now).
 * Cancels and messages for a job another node owns go to the job's inbox
 * (JD_W_JOB_REQUEST); the owner takes them (jd_store_requests) and records
 * them in its own history order, deleting the request in that same commit
 * (jd_write.request_id). A commit that changed jobs sends one NOTIFY
 * carrying the (id, version) pairs (or an overflow mark) while some node
 * wants them (jd_store_watch_notices); requests and schedule changes are
 * always sent. Each node's listener hands them to the hooks below. For
 * SQLite, jd_store_clustered is false and none of the rest is called.
 */
bool jd_store_clustered(const struct jd_store *s);
int64_t jd_store_node_id(const struct jd_store *s); /* this incarnation; 0 for SQLite */

struct jd_job_change {
    int64_t id, version;
};
struct jd_store_cluster_hooks {
    /* On the listener thread; must not block. Jobs some node's commit
     * changed, or n == 0: anything may have changed (an overflowing notice,
     * a listener reconnect): re-read whatever is watched. */
    void (*changed)(void *arg, const struct jd_job_change *c, size_t n);
    /* On the listener thread; must not block. Schedule id was put, changed
     * (a fire, a pause) or deleted by some node (NULL: any may have been). */
    void (*schedule_changed)(void *arg, const char *id);
    /* Hints (a notice, and a timer every lease/2 as a fallback); must not
     * block: requests may be waiting in the inboxes of jobs this node owns;
     * unowned jobs may be waiting to be claimed. */
    void (*requests)(void *arg);
    void (*claimable)(void *arg);
    /* Once, on the heartbeat thread: this node lost its lease (it stalled
     * past it, or its row was taken over). Its job writes are refused from
     * now on; the server's answer is to start over as a new incarnation. */
    void (*lease_lost)(void *arg);
    /* On the listener thread; must not block; may be NULL. Another node
     * announced waiting remote tasks (jd_store_tasks_announce): payload is
     * its text as sent, "<node id> <command>:<waiting> ..." (borrowed). */
    void (*tasks_waiting)(void *arg, const char *payload);
    void *arg;
};
/* Start the heartbeat, takeover and listener threads (after recovery).
 * 0, JD_EIO, or JD_EINVAL for a SQLite store. */
int jd_store_cluster_start(struct jd_store *s, const struct jd_store_cluster_hooks *h);
/* The lease is valid and not within its safety margin of its deadline:
 * false means start no new handler call. Always true for SQLite. */
bool jd_store_lease_ok(struct jd_store *s);
/* This node runs the cluster's singleton chores (firing schedules): the
 * live node with the lowest id, as of the last heartbeat. Always true for
 * SQLite. Two nodes may both believe it for a moment during a handover, so
 * each chore's write is also conditional (a fire: sched.expect_next_fire_ms). */
bool jd_store_is_leader(struct jd_store *s);
/* The database answered the last heartbeat (or, for SQLite, true): /readyz. */
bool jd_store_healthy(struct jd_store *s);

/* Cluster-wide queue limits (PostgreSQL; server/jobs_queues.c). A node
 * starts a queued job of a queue with max_running or a rate only once the
 * database granted it: one transaction per queue, serialized by a
 * transaction advisory lock on the queue's name, counts the queue's jobs
 * running anywhere (state running) plus the grants not used yet (a grant
 * lives while its job is still queued and owned by the node it was
 * granted to), refills the queue's token bucket (stored, in the
 * database's clock), and shares what is free out in turns among the live
 * nodes with ready jobs of the queue (each node's demand row: the rank of
 * its best ready job, fresh for 2 s after its last ask), best job first.
 * This node gets its turns' worth of the jobs it offered; when other
 * nodes have turns, a claim notice wakes them to ask. */
struct jd_queue_grant_ask {
    const char *queue;  /* borrowed */
    const char *config; /* borrowed: the controls text this node applies (NULL: none) */
    unsigned max_running;
    uint32_t rate_limit; /* 0: no rate */
    int64_t rate_per_ms;
    const int64_t *ids; /* borrowed: this node's next queued jobs of queue, in run order */
    size_t nids;
    int64_t head_priority, head_created_ms; /* of ids[0]: this node's turn among nodes */
    int64_t now_ms;                         /* wall clock: jobs with a later run_at are not due */
    /* Grant this node's offered jobs within the free slots whoever's jobs
     * are next (after it waited its turn once, so that a node that cannot
     * take its turn does not hold the others up). */
    bool take_any;
};
/* granted (nids long, caller's) gets the granted ids, *ngranted their
 * number; *retry_ms: when the rate left jobs waiting, ms until the next
 * token (0 otherwise); *others: other nodes' jobs were next (they were
 * told). 0; JD_ESTALE when the stored controls differ from
 * ask->config (re-read them); JD_ESTALE after this node lost its lease;
 * JD_EIO; JD_EINVAL for SQLite. */
int jd_store_queue_grant(struct jd_store *s, const struct jd_queue_grant_ask *ask, int64_t *granted,
                         size_t *ngranted, int64_t *retry_ms, bool *others);

/* A limited queue's stored bucket (jd_store_queue_grant): the whole
 * tokens it holds now, refilled at rate_limit per rate_per_ms (a queue
 * with no bucket yet: rate_limit, a new one starts full). 0, JD_EIO;
 * JD_EINVAL for SQLite. */
int jd_store_queue_tokens(struct jd_store *s, const char *queue, uint32_t rate_limit,
                          int64_t rate_per_ms, long long *tokens);

/* Claim up to limit (1..256) unowned unfinished jobs for this node, by
 * priority then id (FOR UPDATE SKIP LOCKED, only while this node's lease is
 * valid); then each is handed to fn with its history as jd_store_recover
 * does. A job that was started (running, waiting) when its node's lease
 * lapsed had its crash count raised by the takeover that unowned it (not
 * when a node closed cleanly and gave it back). *n: jobs claimed. */
int jd_store_claim(struct jd_store *s, unsigned limit, jd_store_job_fn fn, void *arg, size_t *n);
/* Make job id this node's if it is unowned and queued (while this node's
 * lease is valid): 0, JD_ENOENT when it is not (someone's, started,
 * finished or missing), JD_ESTALE after the lease was lost, JD_EIO; JD_EINVAL for
 * SQLite. Only the row's owner changes: read the job in afterwards. */
int jd_store_claim_id(struct jd_store *s, int64_t id);

/* Inbox requests for jobs this node owns, ascending id after after_id, at
 * most limit (1..1000). Free with jd_job_requests_free. */
struct jd_job_request {
    int64_t id, job_id;
    enum jd_event_kind kind; /* JD_EVK_MESSAGE or JD_EVK_CANCEL */
    char *data;              /* JSON text */
};
int jd_store_requests(struct jd_store *s, int64_t after_id, unsigned limit,
                      struct jd_job_request **rows, size_t *n);
void jd_job_requests_free(struct jd_job_request *rows, size_t n);

/* Remote tasks across nodes (storage/pg_nodes.c; server/tasks.h). Each node
 * advertises the base URL other nodes reach it at in its node row; the
 * node that owns a task answers for it. For SQLite all three return
 * JD_EINVAL. Any thread; each may block on the database (a dedicated
 * connection under its own mutex), so never an HTTP event thread's.
 *
 * Set this incarnation's URL (after its row exists): 0 or JD_EIO. */
int jd_store_node_advertise(struct jd_store *s, const char *url);
/* The URL of live node `node` (caller frees *url): 0; JD_ENOENT when it
 * has no live row (it closed, died and was taken over, its lease lapsed,
 * or never was) or advertised none; JD_EIO. */
int jd_store_node_url(struct jd_store *s, int64_t node, char **url);
/* The live nodes that advertised a URL, by id (ids[i], urls[i]; caller
 * frees with jd_store_nodes_free): 0 or JD_EIO. At most limit. */
int jd_store_nodes_live(struct jd_store *s, unsigned limit, int64_t **ids, char ***urls, size_t *n);
void jd_store_nodes_free(int64_t *ids, char **urls, size_t n);
/* One NOTIFY to every node's tasks_waiting hook (payload: at most
 * JD_STORE_ANNOUNCE_MAX bytes, as that hook receives it): 0 or JD_EIO. */
#define JD_STORE_ANNOUNCE_MAX 7900 /* NOTIFY payloads end at 8000 bytes */
int jd_store_tasks_announce(struct jd_store *s, const char *payload);

/* Whether this node wants job-change notices (the changed hook): on while
 * it has a watch on a job it does not hold or an event stream open. Turned
 * on, it returns only once every commit after the return sends them and
 * every commit that did not is visible to reads that start after it: read
 * the watched row after this, not before, and no change falls between.
 * Blocks on the database (nconn, like the functions above; the lock waits
 * for batches in flight, at most JD_STORE_WATCH_LOCK_MS): 0, JD_EIO (the
 * caller falls back to its periodic re-reads), JD_EINVAL for SQLite. */
#define JD_STORE_WATCH_LOCK_MS 100
int jd_store_watch_notices(struct jd_store *s, bool on);

struct jd_cluster_stats {
    uint64_t claims, takeovers, fenced, requests, notices, lease_lost;
    uint64_t heartbeats, heartbeat_us_sum, heartbeat_us_max;
    /* The read pool (--db-readers): reads that waited for a connection,
     * their waits summed (microseconds), reads that gave up waiting (503),
     * and the connections open, idle and allowed now. */
    uint64_t read_waits, read_wait_us, read_timeouts;
    unsigned read_open, read_idle, read_max;
};
void jd_store_cluster_stats(struct jd_store *s, struct jd_cluster_stats *out);

#endif
