/*
 * Internals of the job layer, shared by its files. Not a public contract
 * (that is jobs.h): only files of the job layer include it.
 *
 *   jobs.c         create (scheduler, registry, replay), drain, destroy
 *   jobs_table.c   the table of live jobs, reference counts, small helpers
 *   jobs_admit.c   queues, ready lists, admission, job timers
 *   jobs_run.c     spawning processes, scheduler hooks, yields and calls
 *   jobs_record.c  write records, the commit callback, retry on a full disk
 *   jobs_replay.c  rebuilding and resuming jobs from their history at start
 *   jobs_submit.c  submit, batch, validate
 *   jobs_act.c     cancel, message, retry, queue pause/resume
 *   jobs_queues.c  queue controls (max_running, rate, retention), GET /v1/queues
 *   jobs_unique.c  unique keys: who holds one, taking and dropping, recovery
 *   jobs_window.c  the queued-job window: which queued jobs are in memory,
 *                  paging the rest in from the store (--queue-window)
 *   jobs_watch.c   watches (change notification)
 *   jobs_cluster.c the cluster (PostgreSQL, jd_store_clustered): claiming
 *                  jobs, the inbox, other nodes' changes for watches
 *   jobs_read.c    JSON reads and counters
 *   jobs_tasks*.c  remote commands and their tasks (tasks.h; own lock, after mu;
 *                  split in five, see jobs_tasks_impl.h)
 *   render.c       JSON output
 *
 * Locking: one mutex, jd_jobs.mu, guards the table, the queues and ready
 * lists, the watches, the idempotency keys being committed, the counters
 * (jd_jobs.st) and every field of every struct job, call, jtimer, dlv and
 * watch. A function named *_locked, or whose comment says "Under mu",
 * expects mu held; "Without mu" means it must not be held. Calls into the
 * registry (which may complete a call on the calling thread) and
 * jd_sched_kill (which may finish a process on the calling thread) are made
 * without holding mu; other scheduler and store calls only enqueue and are
 * made with or without it. User callbacks (submit/action done, watch fns)
 * run without mu.
 *
 * Threads: HTTP threads call the public entry points; scheduler workers run
 * the hooks (jobs_run.c); the scheduler's timer thread runs timer callbacks;
 * the store's completion thread runs the commit callback (jobs_record.c),
 * one commit at a time in commit order.
 */
#ifndef JD_SERVER_JOBS_IMPL_H
#define JD_SERVER_JOBS_IMPL_H

#include "common/bucket.h"
#include "common/clock.h"
#include "plugins/registry.h"
#include "scheduler/sched.h"
#include "server/jobdef.h"
#include "server/jobs.h"
#include "server/stats.h"
#include "storage/store.h"

#include <cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define NBUCKETS 4096 /* job and watch hash buckets; chains stay short for 10^5 live jobs */

#define WATCH_ID_SHIFT 12 /* a watch id is (serial << 12) | its bucket */

_Static_assert(NBUCKETS == 1u << WATCH_ID_SHIFT, "watch ids carry the bucket");

struct job;

/* A dispatch/completion found in the history, for replay (current run only). */
struct rec {
    uint32_t tag;
    char *command;       /* recorded dispatch command, or NULL if only completed */
    uint32_t attempt;    /* highest recorded attempt */
    int64_t deadline_ms; /* $sleep/$timer: recorded wall deadline */
    bool completed;      /* its result waits in the job's delivery queue */
    bool claimed;        /* its highest attempt's dispatch names a task: a worker claimed it
                            (a remote call's dispatch is recorded by its claim) */
    struct rec *next;
};

/* One registry call in flight; two references (dispatch path, done path).
 * A call of a command with a --command-limit that is at its cap waits
 * (waiting, in its cmd_limit's FIFO through wnext) with what the dispatch
 * needs kept here, and goes to the registry when a place frees. */
struct call {
    struct jd_jobs *j;
    struct job *job;
    uint32_t tag;
    struct jd_token token;
    struct jd_call_handle *handle;
    char *command, *args;
    int refs;
    struct call *next;
    struct cmd_limit *lim; /* its command's limit, or NULL */
    bool waiting;          /* in lim's FIFO, not yet given to the registry */
    bool counted;          /* holds one of lim's places */
    struct call *wnext;
    uint32_t first; /* the attempt number of its first dispatch */
    bool remote;    /* a remote command's: its claims record its dispatches (jobs_tasks_claim.c) */
    int64_t timeout_ms;
    struct jd_retry_policy pol;
};

/* A --command-limit: at most `limit` calls of the command in the registry
 * at once; the rest wait in order (head..tail) without a worker. */
#define JD_COMMAND_LIMIT_MAX 1000000 /* calls of one command in flight; more is no limit */

struct cmd_limit {
    char *name;
    unsigned limit, active, waiting; /* limit UINT_MAX: none (a remote command's, lifted) */
    bool from_flag;                  /* --command-limit: a registration does not change it */
    struct call *head, *tail;
    struct cmd_limit *next;
};

/* A $sleep / $timer yield in flight. */
struct jtimer {
    struct jd_jobs *j;
    struct job *job;
    uint32_t tag;
    struct jd_token token;
    uint64_t id;
    struct jtimer *next;
    /* A record that failed to commit (a full disk), tried again when the
     * timer fires: a completion (res/res_err, delivered only once it
     * commits) or the final state (res/res_err = output/error). */
    unsigned tries;
    char *res, *res_err;
    bool final;
    enum jd_job_state state;
    int64_t finished_ms;
};

/*
 * An event for the process, in the job's delivery queue (struct job.dlv).
 * Events reach a process in the order their records committed, which is the
 * order of the history: a live completion or message is handed over by the
 * commit callback (one thread, commit order), and on replay the recorded
 * completions and messages are queued in history order at recovery, so that
 * whatever the process decided from them before a crash (a wait step's timer
 * against a message) it decides again. The head waits while it cannot be
 * delivered yet: the process is not spawned, or the head is a recorded
 * completion whose yield the replayed process has not dispatched again
 * (ready false: no token). Everything behind it waits too, live events
 * included, which keeps the order. Empty (and bypassed) in the common case.
 */
struct dlv {
    bool message;          /* a message; else a yield completion */
    bool ready;            /* completion: its token is known */
    uint32_t tag;          /* completion: its tag */
    struct jd_token token; /* completion, when ready */
    char *data;            /* message {"topic":..,"data":..}, or the result */
    char *error;           /* completion: its error, or NULL */
    struct dlv *next;
};

/* A queue's controls (jobs_queues.c); zeros: none. */
struct qctl {
    unsigned max_running;
    uint32_t rate_limit;
    int64_t rate_per_ms;
    char rate_per[24];    /* as given, e.g. "1s" */
    int64_t retain_ms[3]; /* succeeded, failed, cancelled */
    char retain[3][24];
};

struct queue {
    char *name;
    bool paused;
    struct job *head, *tail; /* ready list: priority desc, then id asc */
    struct queue *next;
    struct jd_jobs *j;      /* for the rate timer */
    struct qctl ctl;        /* as last committed */
    unsigned running;       /* its admitted jobs holding a slot (what max_running caps) */
    struct jd_bucket rate;  /* limit 0: no rate limit */
    bool rate_timer;        /* a re-admission timer is armed, for rate_timer_at */
    uint64_t rate_timer_id; /* (monotonic ms) */
    int64_t rate_timer_at;
    uint64_t rate_waits; /* times admission found its bucket empty with a job ready */
    /* The queued-job window (jobs_window.c). partial: some due queued jobs
     * of this queue, all ranked after floor, are only in the store; every
     * queued job ranked up to floor is in memory. Not partial: all are. */
    unsigned nready; /* jobs in the ready list */
    bool partial;
    struct jd_queued_pos floor;
    bool refilling;   /* a page read is on its way */
    bool page_wanted; /* for the pager thread */
    uint64_t epoch;   /* bumped when floor moves back (a page read before is stale) */
    /* A due job left memory while a page was read: the best ranked such */
    bool drop_seen;
    struct jd_queued_pos drop_min;
    /* Its jobs whose insert is being committed (counted against the
     * window in a cluster: jobs_window_submit_locked). */
    unsigned inserting;
    /* Cluster (a queue with max_running or a rate: jobs_queue_pooled):
     * ready jobs holding a grant from the database (jd_store_queue_grant),
     * the only ones admission starts. */
    unsigned ngranted;
    bool freed; /* one of its jobs ended here: other nodes may use the slot */
    /* Asks (monotonic ms): the last one, and since when other nodes' jobs
     * have been next while this node's waited (0: they are not). */
    int64_t grant_asked_ms, grant_blocked_ms;
};

/* The argument of a job-level timer; lives inside struct job. */
struct job_timer_arg {
    struct jd_jobs *j;
    struct job *job;
    int kind; /* 0 run_at, 1 whole-job timeout, 2 cancel grace */
};

struct job {
    int64_t id;
    struct job_timer_arg targ[3];
    int refs;
    struct jd_jobdef *def;
    char *queue;
    int64_t priority, run_at_ms, created_ms, started_ms;
    enum jd_job_state state;           /* latest recorded (maybe not yet committed) */
    enum jd_job_state committed_state; /* as of the last commit */
    int64_t version;                   /* committed */
    bool inserted;                     /* insert committed */
    /* Inserted by this process without a schedule: what its row holds
     * besides what its final record sets is in this struct, so its end can
     * be rendered without reading the row back (jobs_record.c). */
    bool row_known;
    uint32_t run;         /* attempts: 1 for the first run */
    uint32_t crashes;     /* durable (jobs.crashes): deaths of the process in a row while it ran */
    uint32_t messages;    /* messages recorded in this run (they stay until it ends) */
    size_t message_bytes; /* and their event text together */
    bool admitted, spawned, finished, cancel_requested, cancel_sent, timed_out;
    /* The end was recorded with the step's completion (jobs_record.c,
     * fold_end_locked): the process's finish records nothing. */
    bool end_folded;
    bool slot_free; /* admitted, but waiting for a message: not counted in running */
    /* The queued-job window (jobs_window.c): parked, queued past its
     * queue's floor but kept (it holds a unique key); transient, read from
     * the store for a cancel or message, placed once that commits; dropped,
     * left memory for the store; later, waits for run_at (counted in
     * jd_jobs.later_mem). */
    bool parked, transient, dropped, later;
    /* Cluster: inserted with no owner (past the node's window); it leaves
     * memory once its insert commits, unless this node claimed it first. */
    bool unowned;
    /* Cluster: a write for it was fenced (JD_ESTALE: another node owns it
     * now); it is dropped here without recording anything more. */
    bool lost;
    /* Cluster, a limited queue: the database granted it a start (a slot
     * and a token) that admission has not used yet. */
    bool granted;
    jd_pid pid;
    uint64_t run_at_timer, timeout_timer, grace_timer;
    struct rec *recs;
    struct dlv *dlv, *dlv_tail; /* delivery queue, commit order */
    struct call *calls;
    struct jtimer *timers;
    struct job *hnext;
    /* Out of the table with its end durable while its process (a folded
     * end) still finishes: on jd_jobs.ending, for jd_jobs_destroy. */
    struct job *enext, **eprevp;
    struct job *qprev, *qnext;
    bool in_ready;
    struct queue *qp; /* its queue, once looked up (queues live until destroy) */
    /* Its unique key (jobs_unique.c), chained in jd_jobs.ukeys through unext. */
    char *ukey;
    bool ukey_queued;   /* "while": "queued": held only until it starts */
    int64_t ukey_until; /* wall ms the hold ends ("for_ms"); 0: with the job */
    struct job *unext;
    struct jd_jobs *owner; /* for jobs_job_free's count (jd_jobs.jobs_alloc) */
};

/* A watch stays in its bucket (jd_jobs.watches) from jd_jobs_watch until its
 * fn has returned or it was withdrawn, so that unwatch always finds it:
 * `fired` once a commit (or drain) detached it for firing, `running` while
 * fn runs (on `thread`), `cancelled` if unwatch withdrew it before fn began
 * (the firing thread then skips fn and frees it). */
struct watch {
    uint64_t id;
    int64_t job_id, since;
    bool terminal_only;
    bool fired, running, cancelled;
    pthread_t thread;
    void (*fn)(void *arg, int rc, int64_t version);
    void (*fn_json)(void *arg, int rc, int64_t version, const char *json); /* or this */
    void *arg;
    struct watch *next;
};

struct jd_jobs {
    struct job *ending; /* see struct job's enext (under mu) */
    struct jd_store *store;
    struct jd_sched *sched;
    struct jd_registry *reg;
    struct jd_job_limits limits;
    int64_t cancel_grace_ms;
    unsigned max_running;
    unsigned max_replays; /* 0: never quarantine */
    char *exec_allow, *http_allow, output_cap[24];
    char *exec_env_allow, exec_timeout[24], http_timeout[24]; /* "": the plugin's default */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *table[NBUCKETS];
    struct watch *watches[NBUCKETS];
    uint64_t next_watch;
    struct queue *queues;
    unsigned running;
    unsigned inflight_calls;
    bool draining, stopping, drained, sched_down;
    struct idem *idems; /* idempotency keys being committed */
    struct jd_jobs_stats st;
    struct jd_stats *series;      /* throughput per second (own lock, taken under mu) */
    struct cmd_limit *cmd_limits; /* --command-limit, fixed after create */
    struct job *ukeys[NBUCKETS];  /* jobs holding a unique key, by key hash */
    struct jobs_bulk *bulk;       /* bulk actions (jobs_find.c; own lock, never under mu) */
    struct jd_tasks *tasks;       /* remote commands (jobs_tasks.c; own lock, taken after mu) */
    /* Jobs in the table, and the most since memory was last given back to
     * the system (jobs_trim_due_locked). */
    size_t live, live_peak;
    bool trim_tail; /* a trim happened; one more when the table empties */
    /* struct jobs allocated (jobs_job_new to jobs_job_free): a job leaves
     * the table when its end is durable, but a process that still finishes
     * or a write record can hold it a little longer. */
    _Atomic size_t jobs_alloc;
    /* The table emptied after a large drain: once jobs_alloc is 0 too, the
     * server gives memory back (jobs_release_check). */
    _Atomic bool release_wait;
    _Atomic uint64_t releases; /* fired (counted in jd_jobs_stats' heap_trims) */
    uint64_t commits;          /* job records committed (their callbacks run): GET /v1/events */
    char *webhook_secret;      /* or NULL (jobs_notify.c) */
    /* Bytes the definitions of live jobs hold (jd_jobdef_charge in
     * jobs_job_new, given back as each is freed) and their bound. */
    _Atomic size_t def_mem;
    size_t max_job_memory;
    /* The queued-job window (jobs_window.c); window 0: off, every queued
     * job in memory. Delayed jobs: every queued job waiting for run_at
     * with (run_at_ms, id) up to later_pos is in memory (later_mem of
     * them); later_epoch is bumped when later_pos moves back. */
    unsigned window;
    int64_t later_run_at, later_id; /* later_pos */
    unsigned later_mem;
    uint64_t later_epoch;
    bool later_paging, later_full, later_timer, later_wanted;
    uint64_t later_timer_id;
    bool later_drop_seen; /* a delayed job left memory while a later page was read */
    int64_t later_drop_run_at, later_drop_id;
    /* The pager thread reads pages (pager_cv under mu); without it, pages
     * are read in a write barrier's done callback. */
    pthread_t pager;
    pthread_cond_t pager_cv;
    bool pager_on, pager_stop;
    size_t paged_in; /* jobs read in by pages since the last trim_tail */
    /* The cluster (jobs_cluster.c): NULL for SQLite. */
    struct jobs_cluster *cl;
};

struct idem {
    char *key;
    struct idem *next;
};

enum after {
    AFTER_NONE = 0,
    AFTER_COMPLETE,     /* deliver the completion to the process */
    AFTER_MESSAGE,      /* deliver the message (or keep it until spawn) */
    AFTER_CANCEL,       /* deliver the cancel event, arm the grace timer */
    AFTER_FINAL,        /* the final state is durable: drop the job */
    AFTER_QUEUED,       /* insert or retry committed: admit */
    AFTER_QUEUE_FLAG,   /* queue pause/resume committed */
    AFTER_QUEUE_CONFIG, /* queue controls committed: apply them, admit */
};

struct wrec {
    struct jd_write w;
    struct jd_jobs *j;
    struct job *job; /* referenced, or NULL */
    enum after after;
    char *data, *output, *error, *def_text, *idem_key, *fingerprint, *queue_name, *sched_id;
    bool no_json; /* submit_done does not need the job rendered */
    struct jd_job row;
    struct jd_token token;
    char *res, *res_err;          /* AFTER_COMPLETE / AFTER_MESSAGE payloads */
    unsigned tries;               /* AFTER_COMPLETE / AFTER_FINAL: earlier failed attempts */
    bool folded;                  /* AFTER_FINAL: submitted with its completion, one group */
    enum jd_job_state prev_state; /* folded: the state before it, if the group fails */
    /* user callbacks */
    jd_action_done_fn action_done;
    jd_submit_done_fn submit_done;
    void *user_arg;
    struct batch *batch;
};

struct batch {
    int remaining;
    int rc;
    size_t n;
    struct wrec **recs;
    jd_submit_done_fn done;
    void *arg;
};

struct fire {
    struct watch *w;
    int rc;
    int64_t version;
    const char *json; /* the job at version, for fn_json (the firing commit's; or NULL) */
    struct fire *next;
};

/* jobs_table.c: the table and shared helpers (under mu unless noted). */
void jobs_jtimer_free(struct jtimer *t);
unsigned jobs_bucket(int64_t id);
struct job *jobs_job_find(struct jd_jobs *j, int64_t id);
void jobs_job_insert(struct jd_jobs *j, struct job *jb);
void jobs_recs_free(struct rec *r);
void jobs_job_free(struct job *jb);
void jobs_job_unref(struct job *jb);
void jobs_job_remove(struct jd_jobs *j, struct job *jb);
char *jobs_err_json(const char *kind, const char *msg);
int64_t jobs_job_timeout_ms(const struct job *jb);
void jobs_jtimer_unlink(struct job *jb, struct jtimer *t);
struct job *jobs_job_new(struct jd_jobs *j, struct jd_jobdef *d, int64_t id, int64_t now);
struct jd_jobdef *jobs_parse_stored(const char *text);
/* After a job left the table: whether enough jobs have gone since the last
 * trim that the caller should give freed heap back (jobs_trim, without mu).
 * When the table is empty after a large drain it returns false and arms
 * release_wait instead (the memory goes back once the last job is freed). */
bool jobs_trim_due_locked(struct jd_jobs *j);
void jobs_trim(void);
/* With release_wait armed and no job allocated: give memory back (the
 * object caches' pools now; the store's caches and the heap on the writer
 * once it is idle). Any thread, with or without mu. */
void jobs_release_check(struct jd_jobs *j);

/* jobs_admit.c: queues and admission (the *_locked ones under mu; jobs_start_list and jobs_admit
 * take it). */
struct queue *jobs_queue_get(struct jd_jobs *j, const char *name);
void jobs_ready_remove(struct jd_jobs *j, struct job *jb);
void jobs_admit_locked(struct jd_jobs *j, struct job **start);
void jobs_start_list(struct jd_jobs *j, struct job *start);
void jobs_admit(struct jd_jobs *j);
uint64_t jobs_arm_job_timer(struct jd_jobs *j, struct job *jb, int64_t delay_ms, int kind);
void jobs_enqueue_locked(struct jd_jobs *j, struct job *jb);
void jobs_ready_push(struct jd_jobs *j, struct job *jb);
/* Cancel jb's run_at timer, if armed (a cancel before it ran). */
void jobs_run_at_cancel_locked(struct jd_jobs *j, struct job *jb);
struct queue *jobs_job_queue(struct jd_jobs *j, struct job *jb);
/* A job takes or gives back one of max_running's slots (and its queue's). */
void jobs_slot_take_locked(struct jd_jobs *j, struct job *jb);
void jobs_slot_give_locked(struct jd_jobs *j, struct job *jb);

/* jobs_window.c: the queued-job window (under mu unless noted). */
/* A committed queued job (an insert, a retry, a settled transient one):
 * into its ready list, onto its run_at timer, or out of memory. */
void jobs_window_place_locked(struct jd_jobs *j, struct job *jb);
/* A job in memory whose run_at came (its timer fired): ready, or out. */
void jobs_window_due_locked(struct jd_jobs *j, struct job *jb);
/* The ready list of q lost a job: page more in when it runs low. */
void jobs_window_low_locked(struct jd_jobs *j, struct queue *q);
/* Out of the later set (its run_at timer fired or was cancelled). */
void jobs_window_later_done_locked(struct jd_jobs *j, struct job *jb);
/* Job id, queued but only in the store: read it into the table as
 * transient. 0 with *out; JD_ENOENT (no such job) or JD_ECONFLICT (not
 * queued). Reads the store under mu (rare: an action on such a job). */
int jobs_window_load_locked(struct jd_jobs *j, int64_t id, struct job **out);
/* A transient job whose action is done (or refused): placed as above. */
void jobs_window_settle_locked(struct jd_jobs *j, struct job *jb);
/* At create (window on), after the started jobs: the first page of each
 * queue and the delayed jobs due soon; arms the later timer. */
int jobs_window_recover(struct jd_jobs *j, struct jd_error *err);
/* jb leaves the table (its end, or out of memory): a page being read
 * must not take its snapshot's copy of it for granted. */
void jobs_window_gone_locked(struct jd_jobs *j, struct job *jb);
/* Stop and join the pager thread (destroy, after drain; without mu). */
void jobs_window_fini(struct jd_jobs *j);
/* Cluster (window on): at create, the pager and the delayed jobs' timer (a
 * new incarnation owns no job, so no page is read). */
void jobs_window_cluster_start(struct jd_jobs *j);
/* Under mu, at submit (insert record r->w of jb): count the insert against
 * its queue's window; in a cluster, a job past the window is inserted with
 * no owner (w->unowned). */
void jobs_window_submit_locked(struct jd_jobs *j, struct job *jb, struct jd_write *w);
/* Under mu, in an insert's commit callback (any rc): no longer counted. */
void jobs_window_inserted_locked(struct jd_jobs *j, struct job *jb);
/* Under mu (cluster): how many unowned jobs a claim may take now, as far
 * as the window goes. */
unsigned jobs_window_claim_room_locked(struct jd_jobs *j);
/* Build a job from a stored row and its events (recovery and paging;
 * touches no shared state). */
struct job *jobs_job_from_row(struct jd_jobs *j, const struct jd_job *row,
                              const struct jd_job_event *ev, size_t n);
/* Under mu: a queued job read back with its cancel recorded but not its
 * end (a crash between the two): record the end now. */
void jobs_cancel_recovered_locked(struct jd_jobs *j, struct job *jb);

/* jobs_queues.c: queue controls (under mu unless noted). */
static inline int64_t jobs_mono_ms(void)
{
    return (int64_t)(jd_now_ns() / 1000000u);
}
bool jobs_queue_name_ok(const char *q); /* [A-Za-z0-9._-]{1,64}; any thread */
struct queue *jobs_queue_find(struct jd_jobs *j, const char *name); /* or NULL */
void jobs_queue_controls_load(struct jd_jobs *j);                   /* at create, before recovery */
/* A cluster node, once a second (takes mu): controls another node set. */
void jobs_queue_controls_sync(struct jd_jobs *j);
void jobs_queue_controls_committed_locked(struct jd_jobs *j, const char *queue, const char *text);
/* Whether q's limits hold cluster-wide through grants: a cluster node and
 * a queue with max_running or a rate. */
bool jobs_queue_pooled(const struct jd_jobs *j, const struct queue *q);
/* The stored text of q's controls (caller frees; NULL: none set). */
char *jobs_queue_controls_text_locked(const struct queue *q);

/* jobs_unique.c: unique keys (under mu). */
/* The live job holding key at wall time now, or NULL. */
struct job *jobs_unique_holder_locked(struct jd_jobs *j, const char *key, int64_t now);
void jobs_unique_hold_locked(struct jd_jobs *j, struct job *jb, const char *key, bool queued,
                             int64_t until);
void jobs_unique_drop_locked(struct jd_jobs *j, struct job *jb); /* no key: nothing */
void jobs_unique_recover(struct jd_jobs *j); /* at create, after recovery; takes mu */

/* jobs_run.c: processes (without mu; hooks are set in jd_jobs_create). */
void jobs_cancel_inflight(struct jd_jobs *j, struct job *jb);
void jobs_start_job(struct jd_jobs *j, struct job *jb, bool resume);
void jobs_hook_stepped(void *ctx, jd_pid pid, void *user, enum jd_step_status status);
void jobs_hook_finished(void *ctx, jd_pid pid, void *user, enum jd_step_status status,
                        const char *result, const char *error);
/* A registered remote command's own cap on its calls in flight (0: none);
 * --command-limit for the same name takes precedence. Takes mu; sends the
 * waiting calls a raised cap now lets go, oldest first. */
void jobs_command_limit_set(struct jd_jobs *j, const char *name, unsigned limit);
void jobs_hook_dispatch(void *ctx, jd_pid pid, void *user, const struct jd_yield *y,
                        struct jd_token token);

/* jobs_record.c: records (under mu; the store only enqueues). */
struct wrec *jobs_wrec_new(struct jd_jobs *j, struct job *jb, enum jd_write_op op);
void jobs_wrec_free(struct wrec *r);
void jobs_record(struct wrec *r);
char *jobs_with_run(cJSON *o, uint32_t run);
struct wrec *jobs_state_rec(struct jd_jobs *j, struct job *jb, enum jd_job_state s,
                            enum after after);
void jobs_record_state(struct jd_jobs *j, struct job *jb, enum jd_job_state s);
void jobs_dlv_append(struct job *jb, struct dlv *d);
void jobs_dlv_pump_locked(struct jd_jobs *j, struct job *jb);
void jobs_idem_forget(struct jd_jobs *j, const char *key);
void jobs_record_final(struct jd_jobs *j, struct job *jb, enum jd_job_state s, char *output,
                       char *error, int64_t finished_ms, unsigned tries);
void jobs_record_completion(struct jd_jobs *j, struct job *jb, uint32_t tag, struct jd_token token,
                            const char *result, const char *error);
void jobs_record_dispatch(struct jd_jobs *j, struct job *jb, uint32_t tag, const char *command,
                          const char *args, uint32_t attempt, int64_t deadline_ms);
/* Without mu: a job change recorded outside a wrec (a task's claim, which
 * carries the dispatch event) committed at version: the job's version and
 * its watches as wrec_done would have them. */
void jobs_change_committed(struct jd_jobs *j, int64_t job_id, int64_t version);
/* Record jb's crash count n (no event; see jobs_replay.c). */
void jobs_record_crashes(struct jd_jobs *j, struct job *jb, uint32_t n);
/* The job got past whatever it was doing when the process died (a new
 * completion, idle, a fresh run, its end): its run of crashes is over. */
void jobs_crashes_reset(struct jd_jobs *j, struct job *jb);

/* jobs_watch.c: firing watches (collect under mu, fire without). */
void jobs_watches_collect(struct jd_jobs *j, int64_t job_id, int64_t version, bool terminal,
                          struct fire **list);
void jobs_watches_fire(struct jd_jobs *j, struct fire *list, int rc);

/* jobs_find.c: filters (GET /v1/jobs, bulk actions) and the bulk thread. */
#define JOBS_LABEL_BUF (64 + 1 + JD_LABEL_VALUE_MAX + 1)
/* q -> f (strings borrowed from q and lab, which holds the split labels).
 * JD_EINVAL with err (and a pointer as in a bulk body) for a bad filter. */
int jobs_filter_parse(const struct jd_jobs_list_query *q, struct jd_job_find *f,
                      char lab[][JOBS_LABEL_BUF], struct jd_error *err);
void jobs_bulk_init(struct jd_jobs *j);
void jobs_bulk_fini(struct jd_jobs *j);        /* after drain: joins the thread */
uint64_t jobs_bulk_running(struct jd_jobs *j); /* operations not finished (without mu) */
/* Under mu: a delete of job id is being committed (a retry must wait). */
bool jobs_deleting_locked(struct jd_jobs *j, int64_t id);

/* jobs_notify.c: send job id's webhook for its end state (without mu). */
void jobs_notify_start(struct jd_jobs *j, int64_t id, enum jd_job_state state, const char *url);

/* jobs_trace.c: args with the job's traceparent added for http (header)
 * and exec (TRACEPARENT, if --exec-env-allow lets it through); a copy of
 * args otherwise. Caller frees. */
char *jobs_trace_args(const char *command, const char *args, const char *traceparent,
                      const char *exec_env_allow);

/* jobs_replay.c: read every non-terminal job back and resume it (from
 * jd_jobs_create; 0 or a JD_E* code with err set). */
int jobs_recover(struct jd_jobs *j, struct jd_error *err);
/* Under mu: a job another node left, just claimed (jd_store_claim, which
 * already raised a started job's crash count) and built by
 * jobs_job_from_row, enters the table and resumes as at recovery: queued,
 * into its queue (or its recorded cancel ends it); started, true: the
 * caller starts it (jobs_start_job(.., true), without mu); or quarantined. */
bool jobs_resume_claimed_locked(struct jd_jobs *j, struct job *jb);

/* jobs_cluster.c: the cluster (see jobs.h's jd_jobs_cluster_*). */
void jobs_cluster_init(struct jd_jobs *j); /* create, for a clustered store */
void jobs_cluster_free(struct jd_jobs *j); /* destroy, last */
/* Stop and join the cluster thread (drain; without mu). */
void jobs_cluster_fini(struct jd_jobs *j);
/* Without mu: wait while the lease is within its safety margin (no new
 * handler call starts then); returns at once for SQLite. */
void jobs_cluster_lease_wait(struct jd_jobs *j);
/* Under mu: a write for jb was fenced (JD_ESTALE). *kill: its process,
 * for the caller to end (jd_sched_kill, without mu), or 0. */
void jobs_cluster_fenced_locked(struct jd_jobs *j, struct job *jb, jd_pid *kill);
/* Under mu: a job of a limited queue (jobs_queue_pooled) became ready, or
 * ended (its slot is free once that commits): ask the database for grants
 * soon (the cluster thread does). */
void jobs_cluster_grants_wanted_locked(struct jd_jobs *j);
/* Without mu, before a watch on a job this node does not hold (or on any
 * job) reads the job: job-change notices are on cluster-wide once it
 * returns (jd_store_watch_notices), so none falls between that read and
 * the watch. Returns at once for SQLite, and when they are on already. */
void jobs_cluster_want_notices(struct jd_jobs *j);
/* Under mu: whether jb (NULL: not in the table) commits here, so that its
 * watches fire from its commits and need no notice. */
bool jobs_cluster_held(const struct job *jb);
/* jobs_act.c: a cancel or message from this node's inbox, applied through
 * the local path with the request deleted in the same commit. 0, or
 * JD_ENOENT (not here) / JD_ECONFLICT (ended, or over its message limits). */
int jobs_cancel_request(struct jd_jobs *j, int64_t id, int64_t request_id, jd_action_done_fn done,
                        void *arg);
int jobs_message_request(struct jd_jobs *j, int64_t id, const char *body, int64_t request_id,
                         jd_action_done_fn done, void *arg);

/* jobs_tasks.c: remote commands. create loads them and installs the
 * registry's fallback (before replay); drain answers parked claims. */
int jobs_tasks_create(struct jd_jobs *j, struct jd_error *err);
void jobs_tasks_drain(struct jd_jobs *j);
/* Remote tasks, waiting or claimed (any thread; takes the tasks lock). */
unsigned jobs_tasks_count(struct jd_jobs *j);
/* Under mu: job_id was cancelled or finished while calls of it may wait
 * as tasks: no claim takes them from now on (their calls end as the job's
 * cancel reaches them), and a worker that already holds one hears
 * "cancelled" from its heartbeat, complete or fail. A task that arrives
 * later for such a job is held back too (remote_handle reads the job
 * under mu). Takes the tasks lock (mu before tmu). */
void jobs_tasks_job_over(struct jd_jobs *j, int64_t job_id);
void jobs_tasks_destroy(struct jd_jobs *j);
/* A cluster node's remote commands follow the store (registered, changed
 * or deleted on another node): the cluster thread, once a second; reads
 * the store, so never under a lock (jobs_tasks_cluster.c). */
void jobs_tasks_sync_commands(struct jd_jobs *j);
/* The registered per-attempt timeout of a remote command; 0 for none (or
 * not remote). */
int64_t jobs_tasks_timeout_ms(struct jd_jobs *j, const char *name);
/* The job's latest worker progress (JSON text, caller frees), or NULL. */
char *jobs_tasks_progress(struct jd_jobs *j, int64_t job_id);
/* Is c (a registry lookup's answer, may be NULL) a remote command? */
bool jobs_tasks_is_remote_cmd(const struct jd_command *c);

/* render.c: JSON output. */
/* Render one stored job as a cJSON object (caller deletes). */
cJSON *jd_render_job(const struct jd_job *row);
/* The text of cJSON_PrintUnformatted(jd_render_job(row)), built directly
 * (caller frees with free). */
char *jd_render_job_json(const struct jd_job *row);
/* A growing text buffer for rendering JSON without a cJSON tree; p is
 * NUL-terminated once anything was put (caller frees p). Each function
 * writes what cJSON_PrintUnformatted would for the same value. */
struct jd_sbuf {
    char *p;
    size_t n, cap;
};
void jd_sb_put(struct jd_sbuf *b, const char *s, size_t n); /* raw bytes */
void jd_sb_puts(struct jd_sbuf *b, const char *s);          /* raw text */
void jd_sb_string(struct jd_sbuf *b, const char *s);        /* a JSON string */
void jd_sb_number(struct jd_sbuf *b, int64_t v);            /* v as a cJSON number */
/* JSON text embedded as cJSON would reprint it; NULL or unparsable text
 * puts `otherwise` (raw) instead. */
void jd_sb_json(struct jd_sbuf *b, const char *text, const char *otherwise);

/* Add o[name] = the time as RFC 3339 text, or null for ms <= 0 (unset). */
void jd_render_add_time(cJSON *o, const char *name, int64_t ms);

/* jd_time_format(wall_ms, buf, 32) without gmtime_r and snprintf. */
void jd_render_time(int64_t wall_ms, char buf[32]);

/* Render one history event (caller deletes). */
cJSON *jd_render_event(const struct jd_job_event *ev);
/* Render the plugins of a frozen registry: {"plugins":[...]} (caller deletes). */
cJSON *jd_render_handlers(const struct jd_registry *r);
/* Render queue counts: {"queues":[...]} (caller deletes). */
cJSON *jd_render_queues(const struct jd_queue_counts *rows, size_t n);

#endif
