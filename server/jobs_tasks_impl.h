/*
 * Remote tasks: the types, states and locking rules shared by
 * server/jobs_tasks.c (registry fallback, commands, arrival, lifecycle),
 * jobs_tasks_claim.c (claims), jobs_tasks_end.c (ends, heartbeats,
 * leases), jobs_tasks_read.c (reads) and jobs_tasks_cluster.c (claims
 * across cluster nodes, announcements, commands that follow the store).
 * Internal to those five files.
 *
 * A task is in the id hash (and the call hash) from handle() until one
 * path takes it out, under tmu: that path alone ends the call (host
 * complete/fail, once). States: waiting (in its command's FIFO) ->
 * claiming (its claim is being committed) -> claimed (lease timer
 * armed) -> taken out. A claim is one job change per task: the call's
 * `dispatch` event (a waiting task has none), submitted in the same hold
 * of tmu that took the task, so that after a restart its id still answers
 * 409 and the replayed job dispatches the call again as attempt + 1, a new
 * task, and so that nothing that ends the task is recorded before it. A
 * task whose job was cancelled or ended is `over` (jobs_tasks_job_over):
 * held out of its FIFO while waiting, never handed out, and refused with
 * "cancelled" to its worker.
 *
 * Timers (the scheduler's timer heap, no polling): a lease timer per
 * claimed task, re-armed lazily when a heartbeat moved the deadline; a
 * deadline timer per parked claim. Their arguments name the task or the
 * claim by id and are looked up under tmu, so a timer that fires late
 * finds nothing and does nothing.
 *
 * Locking: tmu (struct jd_tasks.mu) guards everything here. Lock order:
 * jd_jobs.mu before tmu; host complete/fail (which enter the registry and
 * the job layer) and user callbacks are called without tmu. Store and
 * timer calls only enqueue and may be made under it. Functions named
 * _locked, and those whose comment says "under tmu", expect it held.
 */
#ifndef JD_SERVER_JOBS_TASKS_IMPL_H
#define JD_SERVER_JOBS_TASKS_IMPL_H

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "server/jobs_impl.h"
#include "server/tasks.h"

#define TASK_BUCKETS 1024 /* tasks in flight are bounded by running jobs (10^4 by default) */

#define TASK_ID_LEN 32             /* 128 random bits in hex: not guessable, not enumerable */
#define TASK_ID_MAX JD_TASK_ID_MAX /* "<node>.<job>-<seq>-<32 hex>" once claimed */

#define NAME_MAX_LEN 64 /* as plugin command names */

#define DESCRIPTION_MAX 1024

#define WORKER_MAX 200 /* a worker's self-chosen name, e.g. "host-1/4711" */

#define TOMBSTONES                                                                                 \
    4096 /* recently ended task ids kept with why, for the 409 before the row commits */

#define MAX_WORKERS                                                                                \
    1024 /* workers tracked for GET /v1/workers; the least recently seen idle one goes */

#define PROGRESS_MAX 16384 /* a heartbeat's progress, as compact JSON */

#define PROGRESS_EVERY_MS 1000 /* at most one progress event per task per second in the history */

#define ANN_NODES 8 /* other nodes remembered per command as having its tasks waiting */

#define FETCH_MAX 64 /* parked claims asking other nodes at once */

#define GATHER_NODES 8 /* other nodes one claim asks, one after the other */

#define LAT_BUCKETS                                                                                \
    JD_TASK_LAT_BUCKETS /* claim-to-complete: 10,50,100,500ms,1,5,10,30,60,300,3600s,+inf */

enum tstate { TS_WAITING, TS_CLAIMING, TS_CLAIMED };

struct rcmd {
    char *name;
    char *description;
    int64_t timeout_ms;
    int64_t max_in_flight; /* its own cap on calls in flight (0: none; jobs_command_limit_set) */
    int64_t created_ms, updated_ms;
    bool registered;            /* false once deleted (kept for its counters) */
    struct task *whead, *wtail; /* waiting, oldest first */
    uint64_t waiting, in_flight, claimed_total, lease_expiries, completed, failed;
    uint64_t lat_hist[LAT_BUCKETS];
    uint64_t lat_ms_sum;
    /* Across nodes (jobs_tasks_cluster.c): when this node last announced
     * its waiting tasks of c, whether an announcement is due (held back by
     * the rate limit), and the other nodes that announced theirs lately. */
    int64_t announced_ms;
    bool announce_due;
    int64_t ann_node[ANN_NODES], ann_until_ms[ANN_NODES];
    struct rcmd *next;
};

struct task {
    char id[TASK_ID_MAX + 1];
    struct rcmd *cmd;
    struct jd_call *call;
    int64_t job_id;
    uint32_t tag, attempt;
    uint32_t run; /* the job's run when the call came (its claim's dispatch event carries it) */
    char *args, *key, *worker;
    char *traceparent; /* the job's W3C trace context, or NULL (issue 19) */
    enum tstate st;
    bool live; /* in the hashes */
    /* Its job was cancelled or finished (jobs_tasks_job_over): never handed
     * out from then on, and a worker that holds it hears "cancelled". */
    bool over;
    bool held;  /* waiting but out of its command's FIFO, because over */
    bool shown; /* handed to a worker (counted in its in_flight) */
    int refs;   /* the hashes; a claim being committed */
    int64_t created_ms, claimed_ms, lease_expires_ms, lease_ms;
    int64_t progress_ms; /* the last progress event recorded */
    bool timer_armed;
    uint64_t timer_id;
    struct ltimer *timer_arg;
    struct task *wprev, *wnext; /* command's waiting list */
    struct task *hnext, *cnext; /* id hash, call hash */
};

/* A parked claim. */
struct claimer {
    uint64_t id;
    struct rcmd **cmds;
    size_t ncmds;
    char *worker;
    unsigned max;
    int64_t lease_ms;
    jd_action_done_fn done;
    void *arg;
    bool gone;     /* its client left (claim_alive): skipped, answered at its deadline */
    bool fetching; /* asking another node (jobs_tasks_cluster.c): not served here meanwhile */
    bool expired;  /* its deadline passed while fetching: the fetch's end answers it */
    bool timer_armed;
    uint64_t timer_id;
    struct ctimer *timer_arg;
    struct claimer *next;
};

struct ltimer {
    struct jd_jobs *j;
    char id[TASK_ID_MAX + 1];
};

struct ctimer {
    struct jd_jobs *j;
    uint64_t id;
};

struct tomb {
    char id[TASK_ID_MAX + 1];
    const char *reason;
};

struct wkr {
    char *name;
    int64_t last_seen_ms;
    unsigned in_flight;
    struct rcmd **cmds; /* the commands of its last claim */
    size_t ncmds;
    struct wkr *next;
};

/* The latest progress of a job's remote step (one per job: the latest
 * heartbeat that carried one), shown on the job until that task ends. */
struct prog {
    int64_t job_id;
    char task[TASK_ID_MAX + 1];
    char *json;
    struct prog *next;
};

struct jd_tasks {
    pthread_mutex_t mu;             /* tmu */
    bool (*claim_alive)(void *arg); /* jd_jobs_set_claim_alive; NULL: all alive */
    struct tomb tombs[TOMBSTONES];
    unsigned tomb_next;
    struct wkr *workers;
    size_t nworkers;
    struct prog *progs[TASK_BUCKETS];
    struct rcmd *cmds;
    size_t ncmds;      /* registered */
    uint64_t held;     /* tasks held back (over while waiting) */
    uint64_t over_gen; /* calls of jobs_tasks_job_over (under jd_jobs.mu and tmu) */
    struct task *byid[TASK_BUCKETS];
    struct task *bycall[TASK_BUCKETS];
    struct claimer *claimers;
    uint64_t next_claimer;
    bool draining;
    /* Across nodes (jobs_tasks_cluster.c). */
    struct jd_task_remote remote; /* remote.claim NULL: claims stay on this node */
    unsigned fetches;             /* parked claims fetching now (at most FETCH_MAX) */
    bool ann_armed;               /* the announcement timer is armed */
    uint64_t ann_timer;
};

struct claim_op; /* jobs_tasks_claim.c */
struct batch_op; /* jobs_tasks_end.c */

/* A task row or command record on its way to the writer. */
struct trec {
    struct jd_write w;
    struct jd_jobs *j;
    char *s1, *s2, *s3; /* owned strings the record points at */
    jd_action_done_fn done;
    void *arg;
    char *answer; /* done's json on success */
    struct claim_op *claim;
    size_t claim_ix; /* the task's place in claim */
    struct batch_op *batch;
};

/* ---- jobs_tasks.c ---- */

/* Under tmu: lookups (NULL when absent). */
struct rcmd *tasks_cmd_find(struct jd_tasks *t, const char *name);
struct task *tasks_find(struct jd_tasks *t, const char *id);
/* Under tmu: note that worker name was seen (cmds: its claim's, or NULL to
 * keep what it had); NULL when it is not tracked (every slot busy). */
struct wkr *tasks_worker_seen(struct jd_tasks *t, const char *name, struct rcmd *const *cmds,
                              size_t ncmds);
/* Under tmu: the job's progress is now json (copied), set by k. */
void tasks_progress_set(struct jd_tasks *t, const struct task *k, const char *json);
/* Under tmu: drop one reference; the last frees k. */
void tasks_unref(struct task *k);
/* Under tmu: a waiting task leaves or joins its command's FIFO. */
void tasks_waiting_unlink(struct task *k);
void tasks_waiting_push(struct task *k, bool front);
/* Under tmu: take k out of the hashes; the caller now ends its call. */
void tasks_take_out(struct jd_jobs *j, struct task *k, const char *reason);
/* Under tmu: claimed task k's dispatch event committed at seq: its id
 * becomes "[<node>.]<job>-<seq>-<32 hex>", the id handed out, so the store
 * finds its claim with one read (jd_task_stored_state). */
void tasks_rename_locked(struct jd_tasks *t, struct task *k, int64_t seq);
/* A command or task name: 1-64 of a-z 0-9 _ . - starting with a letter. */
bool tasks_name_ok(const char *s);
/* A JSON integer in [lo, hi] at o[name], or dflt when absent. */
int tasks_int_field(const cJSON *o, const char *name, int64_t lo, int64_t hi, int64_t dflt,
                    int64_t *out, struct jd_error *err);
/* body as a JSON object (empty counts as {} when empty_ok); caller
 * deletes; NULL with err set. */
cJSON *tasks_parse_object(const char *body, size_t len, bool empty_ok, struct jd_error *err);
/* Under tmu (or not): a task row as k is now, for tasks_trec_submit or a
 * batch submit (then w.done = tasks_trec_done, w.arg = the record). */
struct trec *tasks_row(struct jd_jobs *j, const struct task *k, enum jd_task_state st);
/* A record that writes nothing, answered once everything submitted before
 * it has committed (submitted like a row). */
struct trec *tasks_barrier(struct jd_jobs *j);
void tasks_trec_submit(struct trec *r);
void tasks_trec_done(void *arg, struct jd_write *w, int rc);
void tasks_trec_free(struct trec *r);

/* ---- jobs_tasks_claim.c ---- */

/* Under tmu: a task of c arrived; hand it to the oldest parked claim. */
void tasks_serve_claimers_locked(struct jd_jobs *j, struct rcmd *c);
/* The store's completion thread: the record of op's task ix committed at
 * seq (the job's version: the dispatch event's seq) or not (rc: that task
 * waits again). */
void tasks_claim_committed(struct jd_jobs *j, struct claim_op *op, size_t ix, int rc, int64_t seq);

/* Under tmu: take up to max waiting tasks of cmds for a claim (NULL if
 * none) and submit their records, in the same hold of tmu: whatever takes
 * a task out after (a cancel's row and completion, a job's end) is
 * submitted after its claim's dispatch, so the history never shows a
 * claim after its task's end. Then, with or without tmu,
 * tasks_claim_submit names who hears done(arg, rc, {"tasks":[...]}) once
 * the records committed. */
struct claim_op *tasks_claim_take_locked(struct jd_jobs *j, struct rcmd *const *cmds, size_t ncmds,
                                         const char *worker, unsigned max, int64_t lease_ms);
void tasks_claim_submit(struct jd_jobs *j, struct claim_op *op, jd_action_done_fn done, void *arg);
size_t tasks_claim_count(const struct claim_op *op); /* its tasks; 0 for NULL */
/* Under tmu: park a claim until wait_ms from now (cmds copied). 0, or
 * JD_ESHUTDOWN (done not called). */
int tasks_park_locked(struct jd_jobs *j, struct rcmd *const *cmds, size_t ncmds, const char *worker,
                      unsigned max, int64_t lease_ms, int64_t wait_ms, jd_action_done_fn done,
                      void *arg);
/* Under tmu: the parked claim with this id, unlinked (its timer cancelled),
 * or NULL. */
struct claimer *tasks_claimer_unlink_locked(struct jd_jobs *j, uint64_t id);
void tasks_claimer_free(struct claimer *cl);

/* ---- jobs_tasks_cluster.c ---- */

/* Under tmu: other nodes with waiting tasks of cmds (at most GATHER_NODES
 * into nodes); their count. */
size_t tasks_announced_locked(struct jd_tasks *t, struct rcmd *const *cmds, size_t ncmds,
                              int64_t *nodes);
/* Without tmu: answer a claim that took `local` (may be NULL) here and
 * wants up to max in all: asks nodes[0..nnodes) in turn for the rest, then
 * answers done(arg) with everything, or parks for the rest of wait_ms when
 * nothing came. */
void tasks_gather(struct jd_jobs *j, struct claim_op *local, struct rcmd *const *cmds, size_t ncmds,
                  const char *worker, unsigned max, int64_t lease_ms, int64_t wait_ms,
                  const int64_t *nodes, size_t nnodes, jd_action_done_fn done, void *arg);
/* Under tmu: task k of c was left waiting (no local claim took it):
 * announce c now or soon. Returns the payload to send without tmu
 * (caller frees) or NULL. */
char *tasks_left_waiting_locked(struct jd_jobs *j, struct rcmd *c);
void tasks_announce_send(struct jd_jobs *j, char *payload);

/* ---- jobs_tasks_end.c ---- */

/* Under tmu: arm k's lease timer for its deadline. */
void tasks_lease_arm(struct jd_jobs *j, struct task *k);
/* The store's completion thread: one row of a batch of ends committed. */
void tasks_batch_committed(struct jd_jobs *j, struct batch_op *b, int rc);

/* ---- jobs_tasks_read.c ---- */

/* Under tmu: render one command's JSON into b. */
void tasks_render_cmd(struct jd_sbuf *b, const struct rcmd *c, int64_t now);

#endif
