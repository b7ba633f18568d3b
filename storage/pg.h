/*
 * The PostgreSQL backend (issue 16): the same store (storage/store.h)
 * on a PostgreSQL database, chosen by jd_store_open when the configured
 * path is a URL ("postgres://..." or "postgresql://..."). Internal to the
 * storage layer, like store_impl.h.
 *
 * Shape: everything that is not about SQL is shared with the SQLite
 * backend. Producers enqueue struct jd_write records on the same lock-free
 * queue, the same writer thread cuts the same batches and fires done() the
 * same way (on itself or the completion thread); only "apply this batch in
 * one transaction" (jd_pg_commit_batch) and the retention pass differ. The
 * public read functions in store.c and find.c start with
 *     if (s->pg) return jd_pg_<name>(...);
 * and the jd_pg_* reads below have exactly the signatures of their
 * jd_store_* counterparts.
 *
 * Connections (libpq: one PGconn per thread at a time): the writer's own,
 * a pool of read connections (pg_read.c) used like the SQLite read pool,
 * and, for the cluster, one for the node heartbeat and one for LISTEN.
 *
 * The schema mirrors the SQLite one table by table and column by column
 * (BIGINT for INTEGER, TEXT for TEXT), so the SQL reads alike in both
 * backends; it adds what a cluster needs: jd_nodes (one row per running
 * node incarnation, with a lease) and jobs.owner_node (the incarnation
 * that owns a job; NULL: unowned). Node ids come from a sequence and are
 * never reused, so "owner_node = me" in a write is the fence: a node whose
 * lease lapsed re-registers under a new id and cannot write for the jobs it
 * lost. Migrations live in storage/pg_schema.c and follow the same
 * numbered, append-only rule as storage/schema.c.
 */
#ifndef JD_STORAGE_PG_H
#define JD_STORAGE_PG_H

#include "storage/store.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct jd_error;
struct jd_pg_rconn;    /* a pooled read connection (pg_read.c) */
struct jd_pg_wscratch; /* the writer's per-batch scratch (pg_write.c) */

/* Backend state, hung off struct jd_store (s->pg; NULL for SQLite). */
struct jd_pg {
    char *url;     /* the conninfo URL, as configured */
    char *display; /* the URL without its password, for logs and errors */

    /* ---- writer thread ---- */
    PGconn *wconn;
    bool wprepared;                 /* the writer's named statements exist on wconn */
    bool upd_prepared[128];         /* the job-change statement per JD_SET_* mask, lazily */
    struct jd_pg_wscratch *scratch; /* the writer's per-batch scratch (pg_write.c) */
    PGconn *hzconn;                 /* the event horizon's own (autocommit) connection */
    bool hz_pending;                /* jd_nodes.pending_event_id may be set (not cleared) */

    /* ---- job ids (jd_store_next_id, any thread) ---- */
    pthread_mutex_t id_mu;
    PGconn *idconn;          /* under id_mu: its own connection, for the refills */
    int64_t id_next, id_end; /* under id_mu: the reserved block [id_next, id_end) */

    /* ---- this node (cluster: pg_cluster.c) ---- */
    int64_t node_id;  /* this incarnation's jd_nodes.id; set at open, then read-only */
    int64_t lease_ms; /* --lease */
    bool sync_full;
    atomic_bool lease_lost;           /* the heartbeat found the row gone or expired: final */
    atomic_bool healthy;              /* the database answered the last heartbeat */
    atomic_bool leader;               /* the lowest live node id, as of the last heartbeat */
    atomic_int_least64_t deadline_ms; /* the last confirmed lease deadline, real monotonic ms */
    atomic_bool hb_paused;            /* tests (jd_pg_test_pause_heartbeat): skip heartbeats */
    atomic_bool test_drop_commit;     /* tests (jd_pg_test_drop_at_commit): cut the next COMMIT */
    atomic_bool test_hold_commit;     /* tests (jd_pg_test_hold_commit): wait before COMMIT */
    atomic_bool test_held;            /* the writer waits there now */
    struct jd_store_cluster_hooks hooks;
    pthread_mutex_t cl_mu; /* guards cl_stop and the threads' sleeps */
    pthread_cond_t cl_cv;
    bool cl_stop;                /* under cl_mu */
    bool hb_started, cl_started; /* the heartbeat / listener runs (opening, closing thread) */
    atomic_bool hooks_ready;     /* hooks are set (jd_pg_cluster_start) */
    pthread_t hb_thr, ln_thr;
    int wake[2];              /* a pipe: close wakes the listener's poll */
    pthread_mutex_t node_mu;  /* guards nconn (pg_nodes.c) */
    PGconn *nconn;            /* node URLs and task announcements (pg_nodes.c) */
    pthread_mutex_t claim_mu; /* guards cconn */
    PGconn *cconn;            /* claims and adoptions (readers are read-only) */
    unsigned passes;          /* takeover passes (heartbeat thread) */
    atomic_uint_least64_t st_claims, st_takeovers, st_fenced, st_requests, st_notices,
        st_lease_lost, st_hb, st_hb_us_sum, st_hb_us_max;

    /* ---- readers (pg_read.c) ---- */
    pthread_mutex_t pool_mu;
    pthread_cond_t pool_cv;   /* a connection came back or a slot freed */
    struct jd_pg_rconn *pool; /* under pool_mu: idle read connections, most recent first */
    unsigned pool_open;       /* under pool_mu: read connections open (idle + in use) */
    unsigned pool_max;        /* read connections at most (set at open) */
    int64_t pool_idle_ms;     /* close an idle one past this (keeping JD_PG_READ_MIN_IDLE) */
    int64_t pool_wait_ms;     /* a reader waits this long for one, then fails (JD_EBUSY) */
    /* /metrics: reads that waited for a connection, the time they waited
     * (microseconds, summed) and those that gave up (503). */
    atomic_uint_least64_t st_read_waits, st_read_wait_us, st_read_timeouts;
    bool readers_opened; /* jd_pg_readers_open succeeded (pg.c) */
};

/* "postgres://" or "postgresql://" (case-insensitive scheme). */
bool jd_store_path_is_pg(const char *path);

/* pg.c: connect, migrate (pg_schema.c), register the node, seed ids, start
 * the writer. Called by jd_store_open with s set up as for SQLite except
 * the SQLite fields. 0 or JD_EIO (cannot connect: err names the URL
 * without its password) / JD_ECORRUPT (not a Jackdaw database, newer
 * schema). */
int jd_pg_open(struct jd_store *s, const struct jd_store_config *cfg, struct jd_error *err);
/* pg.c: after the writer stopped: mark the node gone, close connections. */
void jd_pg_close(struct jd_store *s);
/* pg.c: jd_store_next_id on PostgreSQL: ids come in blocks of
 * JD_PG_ID_BLOCK reserved from the sequence jd_job_ids (its INCREMENT), so
 * ids are unique across nodes and restarts; 0 when no block could be
 * reserved (the database is gone: the insert then fails with JD_EINVAL). */
#define JD_PG_ID_BLOCK 1000
/* The session advisory lock the writer's connection holds (phase 1: one
 * node per database; pg.c takes it at open, pg_write.c again after a
 * reconnect). "JDWKNODE". */
#define JD_PG_NODE_LOCK 0x4a44574b4e4f4445LL
int64_t jd_pg_next_id(struct jd_store *s);
/* pg.c: the URL without its password (caller frees). */
char *jd_pg_display_url(const char *url);
/* pg.c: connect to url as a Jackdaw connection (application_name,
 * synchronous_commit as sync_full says, idle_in_transaction_session_timeout).
 * NULL and err set (naming display) when it cannot. */
PGconn *jd_pg_connect(const char *url, const char *display, bool sync_full, struct jd_error *err);

/* pg_schema.c: bring the database to the current schema (each migration in
 * its own transaction, serialized across nodes with an advisory lock). */
int jd_pg_schema_migrate(PGconn *c, const char *display, struct jd_error *err);

/* pg_write.c, on the writer thread: apply b[0..n) in one transaction (each
 * record inside its own savepoint, or a whole group all-or-nothing, as the
 * SQLite writer does), set rcs[i], b[i]->version and b[i]->time_ms. 0, or
 * JD_EIO when the transaction failed (every rcs[i] is then JD_EIO). The
 * caller fires done() as for SQLite. */
int jd_pg_commit_batch(struct jd_store *s, struct jd_write **b, int *rcs, size_t n);
/* pg_horizon.c, on the writer thread, when it found no records: the
 * nanoseconds it may wait for more while its event horizon stays
 * published (0: none is), and the clear it then owes. A writer that has
 * more records within JD_PG_HZ_LINGER_US of its last COMMIT finds its
 * bound published already (that COMMIT set it) and saves the round trip
 * and the transaction of a publish; the price is other nodes' event
 * readers waiting as long for events numbered after that bound. */
#define JD_PG_HZ_LINGER_US 3000
uint64_t jd_pg_hz_linger_ns(struct jd_store *s);
void jd_pg_hz_idle(struct jd_store *s);
/* A job write (JD_W_JOB_CHANGE, JD_W_JOB_CRASHES) for a job this node does
 * not own (jobs.owner_node is another incarnation's or nobody's: it was
 * taken over), or made after this node's lease lapsed (its jd_nodes row is
 * expired or gone, checked in the same statement), fails with JD_ESTALE:
 * final, never retried, logged and counted in st_fenced. Nothing of the
 * record is written. Each commit that changed jobs, schedules or inboxes
 * sends one NOTIFY on JD_PG_NOTIFY_CHANNEL in its transaction. */
/* The event horizon (GET /v1/events in a cluster): events.id comes from a
 * sequence at INSERT time, so ids are not in commit order across nodes.
 * Before each batch the writer publishes, on hzconn (autocommit, so at
 * once visible), jd_nodes.pending_event_id = nextval of the events
 * sequence (CACHE 1): every id its transaction then takes is greater. The
 * same transaction sets the next batch's bound in the pipeline of its
 * COMMIT, so the new bound and the events become visible together: a
 * writer with more records within JD_PG_HZ_LINGER_US pays no round trip
 * for it, one without clears it on hzconn then (an idle writer holds no
 * bound for longer); a failed batch clears it on hzconn (not after a
 * COMMIT lost in flight: the takeover deletes the row; once the lease is
 * lost nothing clears or moves the bound).
 * Readers of the stream return only ids below JD_PG_HORIZON_SQL, read in
 * the same statement (one snapshot). A node whose row is gone (its lease
 * lost) publishes nothing. */
#define JD_PG_HORIZON_SQL                                                                          \
    "(SELECT coalesce(min(pending_event_id), 9223372036854775807) FROM jd_nodes)"
/* Tests: hold (true) the writer after its batch is applied, before its
 * COMMIT, until released (false); jd_pg_test_commit_held says it waits. */
void jd_pg_test_hold_commit(struct jd_store *s, bool hold);
bool jd_pg_test_commit_held(struct jd_store *s);
/* pg_write.c: free what the writer kept in pg (jd_pg_close). */
void jd_pg_write_free(struct jd_pg *pg);
/* pg_write.c, on the writer thread when idle: one bounded retention step;
 * true if there may be more to delete. */
bool jd_pg_retention_step(struct jd_store *s);

/* pg_read.c: the read pool. At most cfg->read_max connections (0:
 * JD_PG_READ_MAX) are open; a reader that finds them all in use waits up to
 * cfg->read_wait_ms (0: JD_PG_READ_WAIT_MS) for one and then fails with
 * JD_EBUSY (503). One idle longer than cfg->read_idle_ms (0:
 * JD_PG_READ_IDLE_MS) is closed by the next get or put, keeping the
 * JD_PG_READ_MIN_IDLE most recently used. */
#define JD_PG_READ_MAX 16
#define JD_PG_READ_WAIT_MS 5000
#define JD_PG_READ_IDLE_MS 60000
#define JD_PG_READ_MIN_IDLE 2
int jd_pg_readers_open(struct jd_store *s, const struct jd_store_config *cfg, struct jd_error *err);
void jd_pg_readers_close(struct jd_store *s);
int jd_pg_rconn_get(struct jd_store *s, struct jd_pg_rconn **out);
void jd_pg_rconn_put(struct jd_store *s, struct jd_pg_rconn *c);
PGconn *jd_pg_rconn_conn(struct jd_pg_rconn *c);
/* Tests and metrics: read connections open now, of them idle. */
void jd_pg_read_pool_count(struct jd_store *s, unsigned *open, unsigned *idle);

/* pg_read.c: the reads, as their jd_store_* counterparts in store.h. */
int jd_pg_job_get(struct jd_store *s, int64_t id, struct jd_job *out);
int jd_pg_job_list(struct jd_store *s, const struct jd_job_filter *f, struct jd_job **rows,
                   size_t *n, int64_t *next_cursor);
int jd_pg_job_find(struct jd_store *s, const struct jd_job_find *f, bool ids_only,
                   struct jd_job **rows, size_t *n, struct jd_job_find_cursor *next);
int jd_pg_event_stream(struct jd_store *s, const struct jd_event_find *f,
                       struct jd_stream_event **rows, size_t *n, int64_t *next_after);
int jd_pg_event_last_id(struct jd_store *s, int64_t *id);
int jd_pg_events(struct jd_store *s, int64_t job_id, int64_t after_seq, unsigned limit,
                 struct jd_job_event **events, size_t *n);
int jd_pg_queue_counts(struct jd_store *s, struct jd_queue_counts **rows, size_t *n);
int jd_pg_oldest_queued(struct jd_store *s, const char *queue, int64_t *job_id,
                        int64_t *created_ms);
int jd_pg_idem_lookup(struct jd_store *s, const char *key, int64_t *job_id, char **fingerprint);
int jd_pg_recover(struct jd_store *s, jd_store_job_fn fn, void *arg);
int jd_pg_recover_started(struct jd_store *s, jd_store_job_fn fn, void *arg);
int jd_pg_queued_page(struct jd_store *s, const char *queue, struct jd_queued_pos after,
                      int64_t due_ms, unsigned limit, jd_store_job_fn fn, void *arg, size_t *n);
int jd_pg_queued_later(struct jd_store *s, int64_t after_run_at_ms, int64_t after_id,
                       int64_t until_ms, unsigned limit, jd_store_job_fn fn, void *arg, size_t *n);
int jd_pg_unique_keys(struct jd_store *s,
                      void (*fn)(void *arg, const char *key, int64_t job_id, int64_t expires_ms),
                      void *arg);
int jd_pg_paused_queues(struct jd_store *s, char ***names, size_t *n);
int jd_pg_queue_configs(struct jd_store *s, char ***pairs, size_t *n);
int jd_pg_schedule_get(struct jd_store *s, const char *id, struct jd_schedule_row *out);
int jd_pg_schedule_list(struct jd_store *s, const char *after, unsigned limit,
                        struct jd_schedule_row **rows, size_t *n, char **next_cursor);
int jd_pg_schedule_events(struct jd_store *s, const char *id, int64_t after_seq, unsigned limit,
                          struct jd_schedule_event **events, size_t *n);
int jd_pg_commands(struct jd_store *s, struct jd_rcmd_row **rows, size_t *n);
int jd_pg_task_state(struct jd_store *s, const char *id, int *state, int64_t *job_id);
int jd_pg_task_claimed(struct jd_store *s, int64_t job_id, uint32_t tag, uint32_t attempt,
                       bool *claimed);

/* pg_cluster.c: the node's lease, takeover, claims, the inbox, notices
 * (storage/store.h, "the cluster"). */
#define JD_PG_LEASE_MS 10000 /* a node's lease when the config says 0 */
#define JD_PG_NOTIFY_CHANNEL "jd_changes"
#define JD_PG_TASKS_CHANNEL "jd_tasks" /* remote tasks waiting on a node (pg_nodes.c) */
/* The transaction-scoped advisory lock of the singleton chores (retention,
 * the orphan sweep): "JDWKCHOR". */
#define JD_PG_CHORE_LOCK 0x4a44574b43484f52LL
#define JD_PG_CHORE_LOCK_SQL "5351498237985967954" /* the same, for SQL text */
/* Job-change notices only while someone wants them. A notice costs every
 * writer PostgreSQL's database-wide notify lock, held through its COMMIT's
 * WAL flush (the nodes' commits take turns at the flush instead of sharing
 * one), and wakes every listener; an unwatched cluster needs none. So a
 * batch sends its "id:version" entries only while jd_watchers has a row
 * (some node has a watch on a job it does not hold, or an event stream
 * open); "r", "s" and "c" always go.
 *
 * No change may fall between a watch that starts and a batch that saw no
 * watcher. Every batch takes this lock shared (JD_PG_WATCH_LOCK_SQL) as its
 * first statement after BEGIN and reads jd_watchers in its COMMIT pipeline,
 * a later statement, so a later snapshot; a node adds its row under the
 * lock exclusive and only then reads the watched row (jd_store_watch_notices).
 * A batch that read no row had its shared lock before the row committed,
 * so it committed before the exclusive lock was granted: the watcher's read
 * sees its change. A batch whose lock came after sees the row and sends.
 * "JDWKWTCH". */
#define JD_PG_WATCH_LOCK_SQL "5351498238322295624"
/* At open, on wconn: register this incarnation (a jd_nodes row), then one
 * takeover pass (s->unclean: it unowned jobs of a node that did not close). */
int jd_pg_node_register(struct jd_store *s, struct jd_error *err);
/* At close, after the writer stopped: unown this node's unfinished jobs and
 * delete its row, in one transaction (a clean restart resumes at once). */
void jd_pg_node_unregister(struct jd_store *s);
int64_t jd_pg_node_id(const struct jd_store *s);
/* At open, after registering: the heartbeat thread (heartbeats and
 * takeover passes) runs from open to close. */
int jd_pg_heartbeat_start(struct jd_store *s);
/* Set the hooks and start the listener thread. */
int jd_pg_cluster_start(struct jd_store *s, const struct jd_store_cluster_hooks *h);
/* Stop the heartbeat and listener threads (idempotent; first in close). */
void jd_pg_cluster_stop(struct jd_store *s);
bool jd_pg_lease_ok(struct jd_store *s);
bool jd_pg_is_leader(struct jd_store *s);
bool jd_pg_healthy(struct jd_store *s);
int jd_pg_claim(struct jd_store *s, unsigned limit, jd_store_job_fn fn, void *arg, size_t *n);
int jd_pg_claim_id(struct jd_store *s, int64_t id);
int jd_pg_requests(struct jd_store *s, int64_t after_id, unsigned limit,
                   struct jd_job_request **rows, size_t *n);
void jd_pg_cluster_stats(struct jd_store *s, struct jd_cluster_stats *out);
/* Take every unowned unfinished job for this node (while its lease is
 * valid), before a recovery read: 0 or a JD_E* code. */
int jd_pg_adopt_unowned(struct jd_store *s);
/* How long a session may sit idle inside a transaction before PostgreSQL
 * ends it (writer and heartbeat sessions): the lease, at least 2 s. */
static inline int64_t jd_pg_idle_tx_ms(const struct jd_pg *pg)
{
    return pg->lease_ms > 2000 ? pg->lease_ms : 2000;
}
/* Tests: stop (true) or resume heartbeating, so the lease lapses. */
void jd_pg_test_pause_heartbeat(struct jd_store *s, bool pause);
/* pg_read.c: hand jobs ids[0..n) (those that exist) with their histories
 * to fn, in id order, in one snapshot, as jd_pg_recover does. */
int jd_pg_jobs_hand(struct jd_store *s, const int64_t *ids, size_t nids, jd_store_job_fn fn,
                    void *arg, size_t *n);

/* pg_cluster.c, any thread: give this incarnation up as if its lease had
 * lapsed (every later job write is refused with JD_ESTALE, hooks.lease_lost
 * fires once, the server starts over): the answer when the writer cannot
 * know whether a COMMIT it sent was applied. */
/* Tests: the writer's next COMMIT is sent and its connection then shut
 * down before the answer is read (a connection lost during COMMIT). */
void jd_pg_test_drop_at_commit(struct jd_store *s);
/* Tests: the SQL of the writer's grouped job changes and its parameter
 * types as PostgreSQL names them, comma-separated (for EXPLAIN). */
const char *jd_pg_test_changes_sql(const char **types);
void jd_pg_give_up_lease(struct jd_pg *pg, const char *why);

/* Map a libpq result to a JD_E* code (0 for PGRES_COMMAND_OK/TUPLES_OK). */
int jd_pg_rc(const PGresult *r);

#endif
