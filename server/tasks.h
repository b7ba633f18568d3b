/*
 * Remote commands (issue 13): commands served by workers over HTTP. A
 * remote command is registered by name (durable); a yield that names it
 * becomes a *task* that waits until a worker claims it with a lease. The
 * worker's complete/fail, or the lease running out (kind "lease_expired",
 * retryable), ends that attempt of the call exactly as a plugin's
 * completion would: through the plugin registry, so the job's retry
 * policy, per-attempt timeouts, cancellation and the recorded history all
 * apply unchanged.
 *
 * Bodies are JSON text (len bytes, not necessarily NUL-terminated); bad
 * bodies return JD_EPARSE (malformed JSON) or JD_EINVAL with a JSON pointer
 * in err, and the done callback is not called then. Functions that return
 * 0 call done exactly once, after what they changed is committed.
 *
 * A task id answered by claim is opaque (128 random bits, hex). After a
 * task ended, complete/fail/heartbeat on its id answer JD_ECONFLICT and set
 * *reason: "lease_lost" (its lease ran out, or the server restarted while
 * it was claimed: the call is offered again as a new task), "cancelled"
 * (its job was cancelled or the attempt timed out) or "completed" (already
 * completed or failed). An id never handed out is JD_ENOENT.
 *
 * Threading: every function is safe from any thread and never blocks on
 * the database writer.
 */
#ifndef JD_SERVER_TASKS_H
#define JD_SERVER_TASKS_H

#include "common/error.h"
#include "server/jobs.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JD_TASK_MAX_CLAIM 100          /* tasks one claim may take */
#define JD_TASK_MAX_WAIT_MS 60000      /* a claim's long-poll, as ?wait= */
#define JD_TASK_MIN_LEASE_MS 1000      /* shorter leases expire on a slow network */
#define JD_TASK_MAX_LEASE_MS 3600000   /* an hour; a heartbeat extends it */
#define JD_TASK_DEFAULT_LEASE_MS 60000 /* without lease_ms */
#define JD_TASK_MAX_COMMANDS 1000      /* remote commands registered at once */
#define JD_TASK_MAX_CLAIM_COMMANDS 32  /* commands named in one claim */
#define JD_TASK_MAX_BATCH 1000         /* ends in one batch request */
#define JD_TASK_ID_MAX 92 /* "<node>.<job>-<seq>-<32 hex>": 19 + 1 + 19 + 1 + 19 + 1 + 32 */

/* Whether id has the shape of a task id this server makes:
 * "<job>-<seq>-<32 hex>" (lowercase hex; SQLite, one node), or
 * "<node>.<job>-<seq>-<32 hex>" (a cluster node: node is the id of the
 * incarnation that made it and answers for it); node, job and seq are 1
 * to 2^63-1 with no leading zero. seq is that of the job's `dispatch`
 * event that recorded the claim. Ids handed out before ("<job>-<32 hex>",
 * "<32 hex>", and each after "<node>.") still parse. *node is 0 without
 * one. */
bool jd_task_id_parse(const char *id, int64_t *node);
/* The job id a task id names, or 0 (an older id without one, or not an id). */
int64_t jd_task_id_job(const char *id);
/* For an id that names its job: base gets the id its claim's dispatch
 * event names ("[<node>.]<job>-<32 hex>") and the return is that event's
 * seq, or 0 for an id that carries none ("[<node>.]<job>-<32 hex>"). -1
 * for an id without a job, or not an id. */
int64_t jd_task_id_claim(const char *id, char base[JD_TASK_ID_MAX + 1]);
/* The most recent events of a job searched for the claim of an id that
 * carries no seq ("[<node>.]<job>-<32 hex>", handed out by the build
 * before ids carried it): its claim is older than that only if the job
 * went on for this many events after, and it then answers JD_ENOENT. */
#define JD_TASK_NOSEQ_WINDOW 256
/* What the store says of task id, for a task this process does not hold:
 * its row's state (a heartbeat, an end other than a completion, a
 * cancel or expiry wrote one), else what its job's history says (its
 * claim's `dispatch` event names it: JD_TASK_COMPLETED once a completion
 * of its step follows with no later attempt dispatched between, else
 * JD_TASK_CLAIMED). JD_ENOENT if neither knows it. A refusal is bounded:
 * the row, then the one event at the id's seq (or, for an id without a
 * seq, the job's row and its last JD_TASK_NOSEQ_WINDOW events). */
int jd_task_stored_state(struct jd_store *s, const char *id, int *state, int64_t *job_id);

/* PUT /v1/commands/{name}: body {"timeout_ms": N, "description": "..."}
 * (both optional; {} or an empty body is fine). JD_EINVAL for a bad name
 * (pointer "") or body, JD_ECONFLICT if a plugin provides the name,
 * JD_EFULL past JD_TASK_MAX_COMMANDS. *created says whether it is new.
 * done's json is the command as GET shows it. */
int jd_jobs_command_put(struct jd_jobs *j, const char *name, const char *body, size_t len,
                        bool *created, jd_action_done_fn done, void *arg, struct jd_error *err);
/* DELETE: JD_ENOENT, JD_ECONFLICT while tasks or live jobs use it. */
int jd_jobs_command_delete(struct jd_jobs *j, const char *name, jd_action_done_fn done, void *arg,
                           struct jd_error *err);
/* One remote command: {"name","kind":"remote","timeout_ms","description",
 * "waiting","in_flight","oldest_waiting_ms","created_at","updated_at"};
 * JD_ENOENT. Caller frees *json with free(). */
int jd_jobs_command_get_json(struct jd_jobs *j, const char *name, char **json);
/* {"commands":[...]}: every plugin command ({"name","kind":"plugin",
 * "plugin"}) and every remote command (as get), by name. */
int jd_jobs_commands_json(struct jd_jobs *j, char **json);

/* POST /v1/tasks/claim: body {"commands":[..],"worker":"..","max":n,
 * "wait_ms":n,"lease_ms":n}. done fires once with {"tasks":[...]}: at
 * once (after the claims commit) when a task is waiting, else when one
 * arrives or wait_ms ends (then empty), or when the layer drains. */
int jd_jobs_task_claim(struct jd_jobs *j, const char *body, size_t len, jd_action_done_fn done,
                       void *arg, struct jd_error *err);
/* As jd_jobs_task_claim, but only this node's tasks: the claim another
 * node forwarded (one hop; wait_ms is then 0). */
int jd_jobs_task_claim_here(struct jd_jobs *j, const char *body, size_t len, jd_action_done_fn done,
                            void *arg, struct jd_error *err);
/* How the layer asks whether a parked claim's client is still there
 * (alive(arg), arg as given to jd_jobs_task_claim; must not block): a
 * claim whose client left is never handed tasks, which would otherwise
 * sit claimed by nobody until their lease ran out. Set once, before
 * claims arrive; NULL (the default): every claim is taken as alive. */
void jd_jobs_set_claim_alive(struct jd_jobs *j, bool (*alive)(void *arg));
/* Claims across cluster nodes (README "Running a cluster"). A node with
 * tasks waiting that no local parked claim takes announces their commands
 * (at once when one arrives, at most every JD_TASK_ANNOUNCE_MIN_MS per
 * command, and about once a second while they wait); other nodes keep
 * who announced what for JD_TASK_ANNOUNCE_TTL_MS. A claim that took fewer
 * local tasks than it wants forwards a non-waiting claim (the rest of its
 * max, its worker and lease) to each announcing node in turn and answers
 * with everything it got; a parked claim does the same when an announcement
 * for one of its commands arrives. The owner records the claim before it
 * answers, so a task claimed by a forward whose answer is lost (the worker
 * left, a timeout) is simply held until its lease runs out, as when a
 * claim's own answer is lost. */
#define JD_TASK_ANNOUNCE_MIN_MS 100
#define JD_TASK_ANNOUNCE_TTL_MS 3000
struct jd_task_remote {
    /* Send a non-waiting claim (body as POST /v1/tasks/claim takes it) to
     * node; done(cbarg, json) later, exactly once, on another thread: json
     * is that node's 200 answer ({"tasks":[...]}) or NULL (none from
     * there). Must not block. Nonzero: refused (done is not called). */
    int (*claim)(void *arg, int64_t node, const char *body,
                 void (*done)(void *cbarg, const char *json), void *cbarg);
    /* Best effort, must not block: tell the other nodes payload
     * ("<this node> <command>:<tasks waiting> ...", at most
     * JD_STORE_ANNOUNCE_MAX bytes). */
    void (*announce)(void *arg, const char *payload);
    void *arg;
};
/* Set once on a cluster node, before claims arrive (copied); NULL clears
 * (claims then stay local). */
void jd_jobs_set_task_remote(struct jd_jobs *j, const struct jd_task_remote *r);
/* The store's tasks_waiting hook (storage/store.h): another node announced
 * waiting tasks. Must not block; payloads from this node are ignored. */
void jd_jobs_tasks_announced(struct jd_jobs *j, const char *payload);

/* POST /v1/tasks/{id}/complete {"result": any}; done's json {"ok":true}. */
int jd_jobs_task_complete(struct jd_jobs *j, const char *id, const char *body, size_t len,
                          jd_action_done_fn done, void *arg, const char **reason,
                          struct jd_error *err);
/* POST /v1/tasks/{id}/fail {"error":{"message","kind","retryable","details"}}. */
int jd_jobs_task_fail(struct jd_jobs *j, const char *id, const char *body, size_t len,
                      jd_action_done_fn done, void *arg, const char **reason, struct jd_error *err);

/* POST /v1/tasks/complete {"tasks":[{"id","result"} | {"id","error":{..}}]}:
 * many ends in one request and one commit. Every item is checked first
 * (JD_EINVAL with a pointer such as "/tasks/3/error/kind": none is
 * ended); then each is ended as complete/fail would, and done's json is
 * {"results":[{"id","status":200|404|409[,"reason"]}]}, in order, after
 * the commit. */
int jd_jobs_task_end_batch(struct jd_jobs *j, const char *body, size_t len, jd_action_done_fn done,
                           void *arg, struct jd_error *err);
/* Only the checks of jd_jobs_task_end_batch (nothing is ended): 0 or its
 * JD_EPARSE / JD_EINVAL / JD_ETOOBIG with the pointer. For a batch whose
 * items a cluster node splits among their nodes (api/forward.c). */
int jd_jobs_task_batch_check(struct jd_jobs *j, const char *body, size_t len, struct jd_error *err);

/* POST /v1/tasks/{id}/heartbeat {"lease_ms": n, "progress": any}: the
 * lease runs lease_ms (default: the claim's) from now, recorded before
 * done ({"lease_expires_at": ..}); progress shows on the job (GET) and,
 * at most once a second per task, as a "progress" event in its history.
 * A cancelled job's task answers JD_ECONFLICT with reason "cancelled". */
int jd_jobs_task_heartbeat(struct jd_jobs *j, const char *id, const char *body, size_t len,
                           jd_action_done_fn done, void *arg, const char **reason,
                           struct jd_error *err);

/* GET /v1/workers: {"workers":[{"name","commands":[..],"in_flight",
 * "last_seen_at"}]} for workers seen (claim, heartbeat, complete, fail)
 * within the last within_ms. At most 1024 are tracked. */
int jd_jobs_workers_json(struct jd_jobs *j, int64_t within_ms, char **json);

/* Per remote command, for /metrics. latency_hist: claim to complete/fail,
 * per bucket (not cumulative): 10, 50, 100, 500 ms, 1, 5, 10, 30, 60,
 * 300, 3600 s, +Inf. */
#define JD_TASK_LAT_BUCKETS 12
struct jd_task_stats {
    char *command;
    uint64_t waiting, in_flight, claimed, lease_expiries, completed, failed;
    uint64_t latency_hist[JD_TASK_LAT_BUCKETS];
    uint64_t latency_ms_sum;
};
/* Caller frees with jd_task_stats_free. */
int jd_jobs_task_stats(struct jd_jobs *j, struct jd_task_stats **out, size_t *n);
void jd_task_stats_free(struct jd_task_stats *v, size_t n);

#endif
