/*
 * The job layer: turns JSON job definitions into processes on the scheduler,
 * records every change through storage, replays non-terminal jobs on
 * start-up, and tells waiters when a job changes. It knows no HTTP: the API
 * layer calls these functions and renders their results.
 *
 * JSON in and out is text (the layer uses cJSON inside). Rendered jobs look
 * like:
 *   {"id":"42","state":"succeeded","queue":"default","priority":0,
 *    "version":7,"attempts":1,"output":{...},"error":null,
 *    "labels":{...},"created_at":"...","updated_at":"...","started_at":"...",
 *    "finished_at":"...","run_at":"...","definition":{...}}
 *
 * Threading: every function is safe from any thread and never blocks on the
 * database writer; operations that must be durable before the caller answers
 * take a done callback that fires after the commit (on the store's
 * completion thread, in commit order, or on the writer thread if that thread
 * could not be started; it must not block).
 */
#ifndef JD_SERVER_JOBS_H
#define JD_SERVER_JOBS_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct jd_jobs;
struct jd_store;
struct jd_sched;
struct jd_registry;

#define JD_JOBS_MAX_REPLAYS_DEFAULT 3 /* deaths in a row: one is bad luck, three is the job */

/* Limits on job definitions (each violation has its own clear error). */
struct jd_job_limits {
    size_t max_definition_bytes; /* default 1 MiB */
    unsigned max_depth;          /* JSON nesting; default 32 */
    unsigned max_steps;          /* default 256 (parallel branches count) */
    size_t max_string;           /* any string value; default 64 KiB */
    unsigned max_batch;          /* jobs per batch request; default 1000 */
    /* Messages one run of a job keeps (a message to a topic no step waits
     * on stays until the job ends): more answer JD_ECONFLICT. */
    unsigned max_messages;    /* default 1000 */
    size_t max_message_bytes; /* their JSON text together; default 16 MiB */
};

struct jd_jobs_config {
    struct jd_store *store; /* borrowed, open; outlives the job layer */
    /* The layer creates and owns the scheduler and the plugin registry. */
    unsigned workers;           /* scheduler workers; 0: one per core */
    bool pin_workers;           /* pin each worker to one CPU (jd_sched_config) */
    unsigned blocking_threads;  /* blocking pool bound; 0: scheduler default */
    const char *plugin_dir;     /* load every .so in it; NULL: none */
    const char *exec_allow;     /* plugin config "exec_allow" (NULL: exec unusable) */
    const char *http_allow;     /* plugin config "http_allow" (NULL: any host) */
    const char *webhook_secret; /* HMAC key of job webhooks ("notify"); NULL: unsigned */
    size_t output_cap;          /* plugin config "output_cap"; 0: 64 KiB */
    /* More plugin config: exec's env names and the default deadlines. */
    const char *exec_env_allow; /* "exec_env_allow" (NULL: exec's deny-list) */
    int64_t exec_timeout_ms;    /* "exec_timeout_ms"; 0: exec's own default (10 min) */
    int64_t http_timeout_ms;    /* "http_timeout_ms"; 0: http's own default (60 s) */
    /* Called after plugin_dir is loaded and before the registry is frozen,
     * e.g. for tests to add in-process plugins with jd_registry_add. May be NULL. */
    int (*register_plugins)(void *arg, struct jd_registry *r);
    void *register_arg;
    struct jd_job_limits limits; /* zeros: defaults */
    int64_t cancel_grace_ms;     /* cancel event -> forced termination; 0: 5000 */
    unsigned max_running;        /* jobs running at once; 0: 10000. A job waiting for a
                                    message does not count until it runs again. */
    /* A job that was being run when the process died this many times in a
     * row is failed with kind "quarantined" at the next start instead of
     * being replayed (a poison job must not crash the server forever).
     * 0: 3; negative: never. */
    int max_replays;
    /* --command-limit "http=64,exec=8": calls of a command in flight at
     * once; more wait, in order, without a worker. NULL: none. */
    const char *command_limits;
    /* What live jobs may hold in memory together (their definitions' text
     * and what jd_jobdef_slim keeps, as jd_jobdef.mem counts it, plus their
     * workflows' step outputs): a
     * submit that would pass it answers JD_EBUSY (503, try later), so what
     * clients send cannot grow the server without bound. Jobs read back at
     * start and jobs a schedule fires are counted but never refused.
     * 0: 256 MiB. */
    size_t max_job_memory;
    /* --queue-window: each queue keeps at most about this many of its next
     * queued jobs (priority desc, then id) in memory, and reads more from
     * the store as they drain; delayed jobs come in as they fall due.
     * 0: no window, every queued job in memory. */
    unsigned queue_window;
};

/* Parse a --command-limit value (empty: none); 0 or JD_EINVAL with err
 * saying what is wrong. */
int jd_jobs_command_limits_check(const char *spec, struct jd_error *err);

/* Create the scheduler and registry, load plugins, and resume every
 * non-terminal job found in storage (replaying recorded completions). *out
 * freed with jd_jobs_destroy. Plugin load failures are logged and fail
 * creation with err naming the file. */
int jd_jobs_create(const struct jd_jobs_config *cfg, struct jd_jobs **out, struct jd_error *err);
/* Stop admitting (JD_ESHUTDOWN), wait up to grace_ms for running steps and
 * pending writes; jobs still running stay non-terminal in storage and resume
 * on the next start. Pending watches fire with JD_ESHUTDOWN. */
int jd_jobs_drain(struct jd_jobs *j, int64_t grace_ms);
/* Drain (grace 0) if not yet, then free the scheduler, registry and layer.
 * The store is left open for the caller to close. */
void jd_jobs_destroy(struct jd_jobs *j);

/* For metrics and GET /v1/handlers: borrowed, valid until destroy. */
struct jd_sched *jd_jobs_sched(struct jd_jobs *j);
/* For GET /v1/stats: the throughput series (server/stats.h), fed as jobs
 * end; borrowed, valid until destroy. */
struct jd_stats *jd_jobs_series(struct jd_jobs *j);

/* Done callback of actions (cancel, retry, queue writes): fires after the
 * commit with rc 0 or a JD_E* code and the result rendered (or NULL). */
typedef void (*jd_action_done_fn)(void *arg, int rc, const char *json);

/* ---- submitting ---- */

/* What a submit produced; borrowed for the callback. */
struct jd_submit_result {
    int rc;              /* 0, or a JD_E* code (storage failure) */
    struct jd_error err; /* detail when rc != 0 */
    int64_t job_id;      /* single submit */
    const char *json;    /* single: the job rendered; batch: {"jobs":[...]} */
    bool existing;       /* idempotency key matched an earlier job (same body) */
    /* A unique key was held (job_id, json: the holder): JD_SUBMIT_UNIQUE_EXISTING
     * for "return_existing", JD_SUBMIT_UNIQUE_REJECTED for "reject" (and for
     * "replace" when the holder already runs); 0 otherwise. */
    int unique;
};
#define JD_SUBMIT_UNIQUE_EXISTING 1
#define JD_SUBMIT_UNIQUE_REJECTED 2
typedef void (*jd_submit_done_fn)(void *arg, const struct jd_submit_result *res);

/*
 * Validate and submit one job definition (JSON text, len bytes, not
 * necessarily NUL-terminated). Validation failures return at once with
 * err filled (JD_EPARSE for malformed JSON, JD_EINVAL with a pointer for an
 * invalid job, JD_ETOOBIG for limits) and done is NOT called. Otherwise
 * returns 0 and done fires once the job is durable (or storage failed).
 * idempotency_key (may be NULL): the same key with the same body answers with
 * the original job (existing = true); with a different body: JD_EINVAL
 * (message says so); while the first is still being committed: JD_ECONFLICT.
 * A definition's "unique" key held by a live job answers with that job
 * (res.unique says how) or, for "replace" with the holder still queued,
 * cancels the holder and inserts the new job in one commit; while the
 * holder's own insert is still being committed: JD_ECONFLICT.
 */
int jd_jobs_submit(struct jd_jobs *j, const char *body, size_t len, const char *idempotency_key,
                   jd_submit_done_fn done, void *arg, struct jd_error *err);

/* A W3C traceparent ("00-<32 hex trace id>-<16 hex parent id>-<2 hex
 * flags>"; lowercase; ids not all zero; version ff invalid; a later version
 * may append "-..." fields, which are kept). */
bool jd_traceparent_valid(const char *s);

/* As jd_jobs_submit, with the W3C traceparent of the request (NULL: none;
 * an invalid one is ignored, as the W3C spec asks). It is stored in the
 * definition as "traceparent" unless the body has its own, and is not part
 * of the Idempotency-Key fingerprint (a retried request with a new trace
 * is the same request). */
int jd_jobs_submit_traced(struct jd_jobs *j, const char *body, size_t len,
                          const char *idempotency_key, const char *traceparent,
                          jd_submit_done_fn done, void *arg, struct jd_error *err);

/* {"jobs":[def, def, ...]}: all valid or none accepted (the error pointer
 * says which, e.g. "/jobs/3/handler"); one commit. */
int jd_jobs_submit_batch(struct jd_jobs *j, const char *body, size_t len, jd_submit_done_fn done,
                         void *arg, struct jd_error *err);
/* As jd_jobs_submit_batch, with the request's W3C traceparent (NULL:
 * none; an invalid one is ignored): stored on each job of the batch that
 * has no "traceparent" of its own. */
int jd_jobs_submit_batch_traced(struct jd_jobs *j, const char *body, size_t len,
                                const char *traceparent, jd_submit_done_fn done, void *arg,
                                struct jd_error *err);

/* A job whose insert commits together with the caller's own write records
 * (e.g. a schedule's fire: its row update and history event), all or
 * nothing, the caller's records first. Borrowed; each record's done() (may
 * be NULL) fires after the commit as usual, before the job's done. */
struct jd_jobs_submit_with {
    int64_t job_id;              /* from jd_store_next_id, so the records can name it */
    const char *idempotency_key; /* or NULL; a duplicate fails the whole group (the job's
                                    done sees existing = true and the earlier job's id) */
    const char *schedule_id;     /* stored with the job for listing, or NULL */
    struct jd_write **extra;
    size_t n_extra; /* at most JD_JOBS_MAX_EXTRA */
    bool no_json;   /* the done callback needs no res->json (saves rendering the job) */
};
#define JD_JOBS_MAX_EXTRA 8

/* As jd_jobs_submit, with the records of `with` in the same commit. A
 * validation failure returns at once (err filled; no record is submitted
 * and no done() is called). */
int jd_jobs_submit_with(struct jd_jobs *j, const char *body, size_t len,
                        const struct jd_jobs_submit_with *with, jd_submit_done_fn done, void *arg,
                        struct jd_error *err);

/* Validation alone (tests, fuzzing): 0 or the error submit would give. */
int jd_jobs_validate(struct jd_jobs *j, const char *body, size_t len, struct jd_error *err);

/* ---- reading (rendered JSON; caller frees with free()) ---- */

int jd_jobs_get_json(struct jd_jobs *j, int64_t id, char **json, int64_t *version, bool *terminal);

#define JD_JOBS_LABEL_FILTERS 8 /* as JD_FIND_MAX_LABELS: each is an index probe per row */

struct jd_jobs_list_query {
    const char *state;    /* or NULL; unknown state: JD_EINVAL */
    const char *queue;    /* or NULL */
    const char *schedule; /* only jobs this schedule made; or NULL */
    unsigned limit;       /* 0: 50; max 1000 */
    const char *cursor;   /* opaque, from a previous page's next_cursor; or NULL */
    /* Finding (issue 19); every one optional and combined with the above. */
    const char *handler;                       /* the job's top-level "handler" */
    const char *labels[JD_JOBS_LABEL_FILTERS]; /* "key:value" each; all must match */
    size_t n_labels;
    const char *created_after, *created_before; /* RFC 3339: created >= after, < before */
};
/* {"jobs":[...],"next_cursor":"..."|null} */
int jd_jobs_list_json(struct jd_jobs *j, const struct jd_jobs_list_query *q, char **json,
                      struct jd_error *err);

/* {"events":[{"seq":1,"time":"...","kind":"state","tag":0,"data":{...}}, ...]}
 * for seq > after_seq. JD_ENOENT if no such job. Event data as recorded:
 * state {"state":..}, dispatch {"command":..,"attempt":n,"args":{..}
 * [,"deadline_ms":..]}, complete {"result":..} or {"error":{..}}, message
 * {"topic":..,"data":..}, cancel {}; each also has "run", the job attempt
 * it belongs to. limit 0: 1000. */
int jd_jobs_events_json(struct jd_jobs *j, int64_t id, int64_t after_seq, unsigned limit,
                        char **json);
/* One page of events for SSE: fn(arg, seq, kind, event_json) for seq >
 * after_seq, ascending, at most limit (1..10000) of them, stopping early
 * after an event for which fn returns false. Returns the number delivered
 * or a JD_E* code; fewer than limit without a stop means caught up. */
int jd_jobs_events_each(struct jd_jobs *j, int64_t id, int64_t after_seq, unsigned limit,
                        bool (*fn)(void *arg, int64_t seq, const char *kind,
                                   const char *event_json),
                        void *arg);

/* {"plugins":[{"name":..,"version":..,"commands":[{"name":..,"blocking":..}],
 *   "process_types":[{"name":..,"methods":[..]}]}]} */
int jd_jobs_handlers_json(struct jd_jobs *j, char **json);
/* {"queues":[{"name":..,"paused":..,"counts":{"queued":n,...},
 *   "max_running":n|null,"rate":{"limit":n,"per":".."}|null,
 *   "retention":{"succeeded":"..",..}|null,"active":n[,"rate_available":n]}]} */
int jd_jobs_queues_json(struct jd_jobs *j, char **json);
/* One queue's object as in the list (a queue with no jobs and no controls
 * has zero counts); JD_ENOENT for a name that cannot be a queue's. */
int jd_jobs_queue_json(struct jd_jobs *j, const char *queue, char **json);
/* PUT /v1/queues/{q}: replace the queue's controls with body's
 * {"max_running":N,"rate":{"limit":N,"per":"1s"},"retention":{"succeeded":
 * "1d","failed":"30d","cancelled":"7d"}} (each optional or null: unset).
 * Invalid: returns at once with err (JD_EPARSE, JD_EINVAL and a pointer,
 * JD_ENOENT for a bad queue name) and done is not called; else 0 and done
 * fires after the commit with the queue rendered. */
int jd_jobs_queue_configure(struct jd_jobs *j, const char *queue, const char *body, size_t len,
                            jd_action_done_fn done, void *arg, struct jd_error *err);

/* Limits and their live numbers, for /metrics. Caller frees both arrays
 * with free(). */
struct jd_jobs_queue_limit {
    char name[65];
    unsigned max_running; /* 0: none */
    unsigned active;      /* jobs holding a running slot */
    uint32_t rate_limit;  /* 0: none */
    int64_t rate_per_ms;
    uint64_t rate_waits; /* admissions the rate deferred */
};
struct jd_jobs_command_limit {
    char name[65];
    unsigned limit, active, waiting;
};
int jd_jobs_limits(struct jd_jobs *j, struct jd_jobs_queue_limit **queues, size_t *nq,
                   struct jd_jobs_command_limit **commands, size_t *nc);

/* ---- acting on a job (done fires after the commit; rc 0 or JD_E*) ---- */

/* Cancel: JD_ENOENT, JD_ECONFLICT (already terminal) at once; else 0 and
 * done fires when the cancel request is recorded (json: the job). */
int jd_jobs_cancel(struct jd_jobs *j, int64_t id, jd_action_done_fn done, void *arg);
/* Message {"topic":"...","data":...}: JD_ENOENT, JD_ECONFLICT (terminal),
 * JD_EINVAL (bad body, err says where). done after it is recorded. */
int jd_jobs_message(struct jd_jobs *j, int64_t id, const char *body, size_t len,
                    jd_action_done_fn done, void *arg, struct jd_error *err);
/* Re-queue a failed or cancelled job as a new attempt (history kept):
 * JD_ENOENT, JD_ECONFLICT (not failed/cancelled). */
int jd_jobs_retry(struct jd_jobs *j, int64_t id, jd_action_done_fn done, void *arg);
/* Delete a finished job and its history (DELETE /v1/jobs/{id}): JD_ENOENT;
 * JD_ECONFLICT while it is not finished (checked at once and again in the
 * commit, so a retry racing the delete wins or loses whole). done after the
 * commit (json NULL). */
int jd_jobs_delete(struct jd_jobs *j, int64_t id, jd_action_done_fn done, void *arg);

/* ---- bulk actions (POST /v1/jobs/cancel, /v1/jobs/retry) ---- */

enum jd_bulk_kind { JD_BULK_CANCEL = 0, JD_BULK_RETRY = 1 };
#define JD_BULK_OPS_KEEP 64 /* operations remembered; the oldest finished one goes first */
#define JD_BULK_CHUNK 500   /* jobs acted on between waits for their commits */

/*
 * Start a bulk action on the jobs that exist now and match the filter in
 * body (the GET /v1/jobs filters as JSON members: state, queue, schedule,
 * handler, label (a "key:value" string or an array of them),
 * created_after, created_before; at least one). Validation failures return
 * at once (JD_EPARSE, JD_EINVAL with a pointer). When nothing matches:
 * 0, *started false and *json the finished result. Otherwise 0, *started
 * true and *json the new operation ({"id":..,"state":"running",...}),
 * which a background thread carries out in chunks of JD_BULK_CHUNK jobs
 * (each job's action its own commit, as one-by-one requests would be; the
 * layer's lock is taken per job, never across a chunk). JD_EFULL when
 * JD_BULK_OPS_KEEP operations are still running. Jobs created after the
 * start are never touched. *json freed with free().
 */
int jd_jobs_bulk_start(struct jd_jobs *j, enum jd_bulk_kind kind, const char *body, size_t len,
                       char **json, bool *started, struct jd_error *err);
/* {"id":..,"kind":"cancel","state":"running"|"succeeded"|"interrupted",
 *  "matched":n,"applied":n,"skipped":n,"failed":n,"created_at":..,
 *  "finished_at":..|null}. JD_ENOENT for an unknown (or forgotten) id. */
int jd_jobs_operation_json(struct jd_jobs *j, const char *id, char **json);

/* Pause/resume a queue (running jobs go on; queued ones wait). */
int jd_jobs_queue_pause(struct jd_jobs *j, const char *queue, bool paused, jd_action_done_fn done,
                        void *arg);

/* ---- change notification ---- */

/* fn fires once (any thread, must not block) when job id's committed
 * version exceeds since_version (terminal_only: when it is terminal), or at
 * once (on this thread, before watch returns) if it already does; with rc
 * JD_ESHUTDOWN when the layer drains. JD_ENOENT if no such job (fn not
 * called). *watch_id (may be NULL) names the watch for unwatch.
 * "Already" counts commits whose callbacks have run: a commit that readers
 * (jd_jobs_get_json) already see but whose callback has not run yet fires
 * fn a moment later, from that callback, so no change is ever missed but
 * "at once" may come just after watch returns. */
int jd_jobs_watch(struct jd_jobs *j, int64_t id, int64_t since_version, bool terminal_only,
                  void (*fn)(void *arg, int rc, int64_t version), void *arg, uint64_t *watch_id);
/* Withdraw a watch (e.g. on long-poll timeout). Returns true if fn never ran
 * and never will: the watch was pending, or the change it waited for had
 * committed but fn had not started yet (fn is then skipped). Returns false
 * if fn has run: by then it has returned, waiting for it if it runs on
 * another thread; except when unwatch is called from inside a watch fn
 * (its own or any other), which never waits, so fn may still be running
 * there (e.g. it is the caller). Unknown, already fired or already
 * withdrawn ids are fine (false). */
bool jd_jobs_unwatch(struct jd_jobs *j, uint64_t watch_id);
/* jd_jobs_watch for an answer (the long-poll): fn also gets the job's JSON
 * as jd_jobs_get_json renders it at that version (borrowed for the call),
 * when the commit that fired it was the job's end and the job layer had the
 * whole row in memory; NULL otherwise (read it with jd_jobs_get_json). */
int jd_jobs_watch_json(struct jd_jobs *j, int64_t id, int64_t since_version, bool terminal_only,
                       void (*fn)(void *arg, int rc, int64_t version, const char *json), void *arg,
                       uint64_t *watch_id);

/* ---- the global event stream (GET /v1/events) ---- */

/* Filters: any may be NULL / 0. */
struct jd_events_query {
    const char *queue;
    const char *state; /* one state or a comma-separated list ("succeeded,failed") */
    const char *labels[JD_JOBS_LABEL_FILTERS]; /* "key:value" each; all must match */
    size_t n_labels;
};
struct jd_events_sub; /* a parsed filter owning its strings */
/* JD_EINVAL with err (a pointer such as "/state", "/label/1") for a bad filter.
 * Free with jd_jobs_events_sub_free. */
int jd_jobs_events_sub(const struct jd_events_query *q, struct jd_events_sub **out,
                       struct jd_error *err);
void jd_jobs_events_sub_free(struct jd_events_sub *s);
/* fn(arg, id, event_json) for every matching transition with id > after,
 * ascending, at most limit (1..1000). *next is where to go on (it moves
 * past non-matching events too). Event JSON: {"id":"..","job_id":"..",
 * "seq":n,"time":"..","queue":"..","state":"..","data":{..}}. Returns the
 * number delivered or a JD_E* code. */
int jd_jobs_events_read(struct jd_jobs *j, const struct jd_events_sub *s, int64_t after,
                        unsigned limit, void (*fn)(void *arg, int64_t id, const char *event_json),
                        void *arg, int64_t *next);
/* The newest event id: where a live stream without a resume point starts. */
int jd_jobs_events_tail(struct jd_jobs *j, int64_t *id);
/* How many job records have committed (and had their callbacks run). Read
 * it before reading events; jd_jobs_watch_any then fires once any commit
 * came after that read, so no event is missed between read and watch. */
uint64_t jd_jobs_commits(struct jd_jobs *j);
/* As jd_jobs_watch, for a commit of any job after since_commits (version:
 * the new count). Withdraw with jd_jobs_unwatch. */
int jd_jobs_watch_any(struct jd_jobs *j, uint64_t since_commits,
                      void (*fn)(void *arg, int rc, int64_t version), void *arg,
                      uint64_t *watch_id);

struct jd_jobs_stats {
    uint64_t submitted, succeeded, failed, cancelled, running, waiting, queued_mem;
    uint64_t duration_hist[12]; /* job duration buckets: 1,5,10,50,100,500ms,1,5,10,60,300s,+inf */
    uint64_t duration_ms_sum;
    uint64_t quarantined; /* jobs failed at start after crashing the process (max_replays) */
    uint64_t heap_trims;  /* freed heap given back during and after a large drain (jobs_table.c) */
    /* issue 19: bulk operations running or waiting to run; webhook POST
     * attempts and deliveries that ended delivered or failed */
    uint64_t bulk_running, webhook_attempts, webhooks_delivered, webhooks_failed;
    uint64_t def_bytes;   /* what live jobs' definitions and outputs hold (max_job_memory) */
    uint64_t def_refused; /* submits refused because of max_job_memory */
    /* The queued-job window (--queue-window): pages read from the store,
     * queued jobs read in by them (or for an action), and left to the store;
     * in a cluster, submits past the window inserted with no owner */
    uint64_t window_pages, window_in, window_out, window_unowned;
};
void jd_jobs_stats(struct jd_jobs *j, struct jd_jobs_stats *out);

/* Handler (plugin command) calls since start, as the registry this layer
 * owns counts them: what /metrics shows, so the API layer never reaches
 * into the plugins. */
struct jd_jobs_call_stats {
    uint64_t calls; /* started */
    uint64_t ok, failed, timeouts, cancelled, unknown_command;
    uint64_t retries, late_dropped;
};
void jd_jobs_call_stats(struct jd_jobs *j, struct jd_jobs_call_stats *out);

/* Parse a job id as shown to users ("42"): 0 and *id, or JD_ENOENT. */
int jd_jobs_parse_id(const char *s, int64_t *id);

/* ---- the cluster (a clustered store: storage/store.h, "the cluster") ----
 *
 * A node starts with none of the cluster's unfinished jobs (jd_jobs_create
 * does not read them back): one thread claims unowned jobs in batches (on
 * the claimable hint, every second, and at start) and resumes each from
 * its history; it applies the cancels and messages other nodes put in the
 * inboxes of jobs this node owns; and it fires watches on jobs other nodes
 * run (?wait=, SSE, /v1/events) from change notices, re-reading watched
 * jobs every second as a fallback. A cancel or message for a job this node
 * does not hold goes to the job's inbox (its owner applies it). */
struct jd_job_change;
/* Start that thread (after create, before jd_store_cluster_start). 0, or
 * JD_EINVAL for a store that is not clustered. */
int jd_jobs_cluster_start(struct jd_jobs *j);
/* The store's hooks (any thread; they never block). */
void jd_jobs_cluster_changed(struct jd_jobs *j, const struct jd_job_change *c, size_t n);
void jd_jobs_cluster_requests(struct jd_jobs *j);
void jd_jobs_cluster_claimable(struct jd_jobs *j);
/* Inbox requests this node applied since start (/metrics). */
uint64_t jd_jobs_cluster_requests_applied(struct jd_jobs *j);
/* Whether this node wants job-change notices now (it has, or had within
 * 30 s, a watch on a job another node holds, or an event stream open). */
bool jd_jobs_cluster_watching(struct jd_jobs *j);

#endif
