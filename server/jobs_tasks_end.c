/*
 * Remote tasks, part 3 of 5 (see jobs_tasks.c): the end of a claimed task
 * and its lease. A worker's complete or fail takes the task out under tmu
 * and ends its call through the registry's host table (without tmu), then
 * records its row; a batch does that for many and answers once all rows
 * committed. A heartbeat moves the lease deadline and may record progress.
 * A lease timer that finds its deadline passed fails the call with kind
 * lease_expired (retryable); one that finds it moved re-arms.
 *
 * Threads: the complete, fail, batch and heartbeat routes on HTTP threads;
 * lease_fire on the scheduler's timer thread; tasks_batch_committed on the
 * store's completion thread. The heartbeat takes jd_jobs.mu before tmu (it
 * records a progress event on the job).
 */
#include "server/jobs_impl.h"
#include "server/jobs_tasks_impl.h"
#include "server/tasks.h"

#include "common/alloc.h"
#include "common/clock.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void lease_fire(void *arg);

/* Under tmu: arm k's lease timer for its deadline. */
void tasks_lease_arm(struct jd_jobs *j, struct task *k)
{
    int64_t delay = k->lease_expires_ms - jd_wall_ms();
    if (delay < 0)
        delay = 0;
    struct ltimer *lt = jd_xmalloc(sizeof *lt);
    lt->j = j;
    memcpy(lt->id, k->id, sizeof lt->id);
    if (jd_sched_timer_after(j->sched, (uint64_t)delay * 1000000u + 1000000u, lease_fire, lt,
                             &k->timer_id) != 0) {
        free(lt); /* shutting down: the restart offers the task again */
        k->timer_armed = false;
        return;
    }
    k->timer_arg = lt;
    k->timer_armed = true;
}

static void lease_fire(void *arg)
{
    struct ltimer *lt = arg;
    struct jd_jobs *j = lt->j;
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    struct task *k = tasks_find(t, lt->id);
    if (!k || k->timer_arg != lt) {
        pthread_mutex_unlock(&t->mu);
        free(lt);
        return;
    }
    k->timer_armed = false;
    k->timer_arg = NULL;
    free(lt);
    if (jd_wall_ms() < k->lease_expires_ms) {
        tasks_lease_arm(j, k); /* a heartbeat moved the deadline */
        pthread_mutex_unlock(&t->mu);
        return;
    }
    tasks_take_out(j, k, "lease_lost");
    k->cmd->lease_expiries++;
    struct trec *row = tasks_row(j, k, JD_TASK_EXPIRED);
    struct jd_call *call = k->call;
    char m[300];
    snprintf(m, sizeof m, "the lease of worker \"%.200s\" ran out", k->worker ? k->worker : "");
    tasks_unref(k);
    pthread_mutex_unlock(&t->mu);
    tasks_trec_submit(row);
    jd_registry_host(j->reg)->fail(call, "lease_expired", m, 1, NULL);
}

/* ---- ending a claimed task ---- */

/* Why a task that is not (or no longer) claimed refuses: JD_ENOENT for an
 * id never handed out, else JD_ECONFLICT with *reason. */
static int gone_reason(struct jd_jobs *j, const char *id, const char **reason, struct jd_error *err)
{
    int st = 0;
    int64_t job_id = 0;
    struct jd_tasks *t = j->tasks;
    const char *why = NULL;
    pthread_mutex_lock(&t->mu);
    for (unsigned i = 0; i < TOMBSTONES && !why; i++)
        if (t->tombs[i].reason && strcmp(t->tombs[i].id, id) == 0)
            why = t->tombs[i].reason;
    pthread_mutex_unlock(&t->mu);
    if (why) {
        *reason = why;
        return jd_error_set(err, JD_ECONFLICT, NULL,
                            strcmp(why, "completed") == 0 ? "the task was already completed"
                            : strcmp(why, "cancelled") == 0
                                ? "the task's job was cancelled"
                                : "the task's lease was lost; its call is offered again as a "
                                  "new task");
    }
    int64_t node;
    if (!jd_task_id_parse(id, &node) || jd_task_stored_state(j->store, id, &st, &job_id) != 0)
        return jd_error_set(err, JD_ENOENT, NULL, "no such task");
    switch (st) {
    case JD_TASK_COMPLETED:
        *reason = "completed";
        return jd_error_set(err, JD_ECONFLICT, NULL, "the task was already completed");
    case JD_TASK_CANCELLED:
        *reason = "cancelled";
        return jd_error_set(err, JD_ECONFLICT, NULL, "the task's job was cancelled");
    default:
        *reason = "lease_lost";
        return jd_error_set(err, JD_ECONFLICT, NULL,
                            "the task's lease was lost; its call is offered again as a new task");
    }
}

/* Take claimed task id out for its worker to end, or refuse. Returns the
 * task (caller ends its call and unrefs under tmu) with *row its
 * "completed" record, or NULL with the error. */
static struct task *take_claimed(struct jd_jobs *j, const char *id, const char **reason,
                                 struct jd_error *err, int *rc)
{
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    struct task *k = tasks_find(t, id);
    if (k && k->st == TS_CLAIMED && k->over) {
        /* Its job was cancelled (or ended): the cancel ends the call. */
        pthread_mutex_unlock(&t->mu);
        *reason = "cancelled";
        *rc = jd_error_set(err, JD_ECONFLICT, NULL, "the task's job was cancelled");
        return NULL;
    }
    if (k && k->st == TS_CLAIMED) {
        tasks_take_out(j, k, "completed");
        int64_t d = jd_wall_ms() - k->claimed_ms;
        static const int64_t bounds[LAT_BUCKETS - 1] = {10,    50,    100,   500,    1000,   5000,
                                                        10000, 30000, 60000, 300000, 3600000};
        int b = 0;
        while (b < LAT_BUCKETS - 1 && d > bounds[b])
            b++;
        k->cmd->lat_hist[b]++;
        k->cmd->lat_ms_sum += (uint64_t)(d > 0 ? d : 0);
        tasks_worker_seen(t, k->worker ? k->worker : "", NULL, 0);
        pthread_mutex_unlock(&t->mu);
        *rc = 0;
        return k;
    }
    bool unseen = k != NULL; /* waiting or being claimed: never handed out yet */
    pthread_mutex_unlock(&t->mu);
    *rc = unseen ? jd_error_set(err, JD_ENOENT, NULL, "no such task")
                 : gone_reason(j, id, reason, err);
    return NULL;
}

/* What a worker reported for one task: a result or an error. */
struct outcome_in {
    bool ok;
    char *result;               /* ok: compact JSON (owned) */
    const char *kind, *message; /* !ok: borrowed from the parsed body */
    bool retryable;
    char *details; /* !ok: compact JSON or NULL (owned) */
};

static void outcome_clear(struct outcome_in *oi)
{
    free(oi->result);
    free(oi->details);
}

/* Read o (an object) as {"result": any} or, with want_error, as {"error":
 * {"message","kind","retryable","details"}}; base prefixes the pointers
 * ("" for a single task, "/tasks/3" in a batch). */
static int parse_outcome(struct jd_jobs *j, const cJSON *o, bool want_error, const char *base,
                         struct outcome_in *oi, struct jd_error *err)
{
    char ptr[64];
    memset(oi, 0, sizeof *oi);
    if (!want_error) {
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(o, "result");
        oi->ok = true;
        oi->result = res ? cJSON_PrintUnformatted(res) : jd_xstrdup("null");
        snprintf(ptr, sizeof ptr, "%s/result", base);
        if (!oi->result)
            return jd_error_set(err, JD_EINVAL, ptr, "the result cannot be printed");
        if (strlen(oi->result) > j->limits.max_definition_bytes)
            return jd_error_set(err, JD_ETOOBIG, ptr, "the result is larger than %zu bytes",
                                j->limits.max_definition_bytes);
        return 0;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(e, "kind");
    const cJSON *retry = cJSON_GetObjectItemCaseSensitive(e, "retryable");
    const cJSON *det = cJSON_GetObjectItemCaseSensitive(e, "details");
    const char *bad = NULL, *why = NULL;
    if (!cJSON_IsObject(e))
        bad = "/error",
        why = "error must be an object {\"message\",\"kind\",\"retryable\",\"details\"}";
    else if (msg && !cJSON_IsNull(msg) &&
             (!cJSON_IsString(msg) || strlen(msg->valuestring) > j->limits.max_string))
        bad = "/error/message", why = "message must be a string (at most max_string bytes)";
    else if (kind && !cJSON_IsNull(kind) &&
             (!cJSON_IsString(kind) || !tasks_name_ok(kind->valuestring)))
        bad = "/error/kind",
        why = "kind must be a short word: a-z, 0-9, _ . - starting with a letter";
    else if (retry && !cJSON_IsNull(retry) && !cJSON_IsBool(retry))
        bad = "/error/retryable", why = "retryable must be true or false";
    if (bad) {
        snprintf(ptr, sizeof ptr, "%s%s", base, bad);
        return jd_error_set(err, JD_EINVAL, ptr, "%s", why);
    }
    oi->kind = cJSON_IsString(kind) ? kind->valuestring : "error";
    oi->message = cJSON_IsString(msg) ? msg->valuestring : "the worker reported a failure";
    oi->retryable = cJSON_IsTrue(retry);
    oi->details = det ? cJSON_PrintUnformatted(det) : NULL;
    if (oi->details && strlen(oi->details) > j->limits.max_definition_bytes) {
        snprintf(ptr, sizeof ptr, "%s/error/details", base);
        return jd_error_set(err, JD_ETOOBIG, ptr, "details are larger than %zu bytes",
                            j->limits.max_definition_bytes);
    }
    return 0;
}

/* End claimed task id as oi says: through the host (the registry records
 * the completion, or retries), then its row. Returns 0 with *row (the
 * caller submits it, with its callback) or the refusal (JD_ENOENT, or
 * JD_ECONFLICT with *reason; a call that had already ended, by a cancel
 * or a timeout racing the worker, is "cancelled"). */
static int end_task(struct jd_jobs *j, const char *id, const struct outcome_in *oi,
                    struct trec **row, const char **reason, struct jd_error *err)
{
    struct jd_tasks *t = j->tasks;
    int rc;
    *row = NULL;
    struct task *k = take_claimed(j, id, reason, err, &rc);
    if (!k)
        return rc;
    const struct jd_host *host = jd_registry_host(j->reg);
    int hrc = oi->ok ? host->complete(k->call, oi->result)
                     : host->fail(k->call, oi->kind, oi->message, oi->retryable, oi->details);
    pthread_mutex_lock(&t->mu);
    if (hrc == 0) {
        if (oi->ok)
            k->cmd->completed++;
        else
            k->cmd->failed++;
    }
    /* A completion writes no task row: the job's complete event (recorded
     * by host->complete, just before) is the record, and the barrier
     * answers once it is committed. The claim's dispatch event (or a row a
     * heartbeat left "claimed") is read as completed by that event
     * (jd_task_stored_state). A failure, rarer, writes a row: a retried
     * one leaves no event that says it ended. */
    struct trec *r = hrc == 0 && oi->ok
                         ? tasks_barrier(j)
                         : tasks_row(j, k, hrc == 0 ? JD_TASK_COMPLETED : JD_TASK_CANCELLED);
    tasks_unref(k);
    pthread_mutex_unlock(&t->mu);
    if (hrc != 0) {
        tasks_trec_submit(r); /* no callback */
        *reason = "cancelled";
        return jd_error_set(err, JD_ECONFLICT, NULL,
                            "the task's job was cancelled or its attempt timed out");
    }
    *row = r;
    return 0;
}

static int task_end_one(struct jd_jobs *j, const char *id, const char *body, size_t len,
                        bool want_error, jd_action_done_fn done, void *arg, const char **reason,
                        struct jd_error *err)
{
    cJSON *o = tasks_parse_object(body ? body : "", len, !want_error, err);
    if (!o)
        return err->code;
    struct outcome_in oi;
    int rc = parse_outcome(j, o, want_error, "", &oi, err);
    struct trec *row = NULL;
    if (rc == 0)
        rc = end_task(j, id, &oi, &row, reason, err);
    outcome_clear(&oi);
    cJSON_Delete(o);
    if (rc)
        return rc;
    row->done = done;
    row->arg = arg;
    row->answer = jd_xstrdup("{\"ok\":true}");
    tasks_trec_submit(row);
    return 0;
}

int jd_jobs_task_complete(struct jd_jobs *j, const char *id, const char *body, size_t len,
                          jd_action_done_fn done, void *arg, const char **reason,
                          struct jd_error *err)
{
    return task_end_one(j, id, body, len, false, done, arg, reason, err);
}

int jd_jobs_task_fail(struct jd_jobs *j, const char *id, const char *body, size_t len,
                      jd_action_done_fn done, void *arg, const char **reason, struct jd_error *err)
{
    return task_end_one(j, id, body, len, true, done, arg, reason, err);
}

/* A batch of ends: answered once every row has committed. */
struct batch_op {
    int remaining, rc;
    char *answer;
    jd_action_done_fn done;
    void *arg;
};

void tasks_batch_committed(struct jd_jobs *j, struct batch_op *b, int rc)
{
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    if (rc && !b->rc)
        b->rc = rc;
    bool last = --b->remaining == 0;
    pthread_mutex_unlock(&t->mu);
    if (!last)
        return;
    b->done(b->arg, b->rc, b->rc ? NULL : b->answer);
    free(b->answer);
    free(b);
}

/* Check batch item i (it) and parse its outcome into *oi (cleared by the
 * caller); *id borrowed from it. */
static int batch_item(struct jd_jobs *j, const cJSON *it, int i, const char **id,
                      struct outcome_in *oi, struct jd_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(it, "id");
    char base[32];
    snprintf(base, sizeof base, "/tasks/%d", i);
    memset(oi, 0, sizeof *oi);
    if (!cJSON_IsObject(it) || !cJSON_IsString(v)) {
        char p[48];
        snprintf(p, sizeof p, "%s%s", base, cJSON_IsObject(it) ? "/id" : "");
        return jd_error_set(err, JD_EINVAL, p,
                            "each task is {\"id\": \"...\", \"result\": ...} "
                            "or {\"id\": \"...\", \"error\": {...}}");
    }
    *id = v->valuestring;
    return parse_outcome(j, it, cJSON_GetObjectItemCaseSensitive(it, "error") != NULL, base, oi,
                         err);
}

/* The batch's "tasks" array, 1 to JD_TASK_MAX_BATCH items: its size, or
 * -1 with err set. */
static int batch_tasks(const cJSON *o, const cJSON **ts, struct jd_error *err)
{
    *ts = cJSON_GetObjectItemCaseSensitive(o, "tasks");
    int n = cJSON_IsArray(*ts) ? cJSON_GetArraySize(*ts) : -1;
    if (n < 1 || n > JD_TASK_MAX_BATCH) {
        jd_error_set(err, JD_EINVAL, "/tasks",
                     "tasks must be an array of 1 to %d {\"id\", \"result\" or \"error\"}",
                     JD_TASK_MAX_BATCH);
        return -1;
    }
    return n;
}

int jd_jobs_task_batch_check(struct jd_jobs *j, const char *body, size_t len, struct jd_error *err)
{
    cJSON *o = tasks_parse_object(body ? body : "", len, false, err);
    if (!o)
        return err->code;
    const cJSON *ts;
    int n = batch_tasks(o, &ts, err);
    int rc = n < 0 ? err->code : 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        struct outcome_in oi;
        const char *id;
        rc = batch_item(j, cJSON_GetArrayItem(ts, i), i, &id, &oi, err);
        outcome_clear(&oi);
    }
    cJSON_Delete(o);
    return rc;
}

int jd_jobs_task_end_batch(struct jd_jobs *j, const char *body, size_t len, jd_action_done_fn done,
                           void *arg, struct jd_error *err)
{
    cJSON *o = tasks_parse_object(body ? body : "", len, false, err);
    if (!o)
        return err->code;
    const cJSON *ts;
    int n = batch_tasks(o, &ts, err);
    int rc = n < 0 ? err->code : 0;
    struct outcome_in *ois = rc ? NULL : jd_xcalloc((size_t)n, sizeof *ois);
    const char **ids = rc ? NULL : jd_xcalloc((size_t)n, sizeof *ids);
    /* Every item is checked before any task ends: all or nothing for bad
     * input; ends that are refused (gone tasks) are reported per item. */
    for (int i = 0; rc == 0 && i < n; i++)
        rc = batch_item(j, cJSON_GetArrayItem(ts, i), i, &ids[i], &ois[i], err);
    if (rc) {
        for (int i = 0; ois && i < n; i++)
            outcome_clear(&ois[i]);
        free(ois);
        free(ids);
        cJSON_Delete(o);
        return rc;
    }
    struct batch_op *b = jd_xcalloc(1, sizeof *b);
    b->done = done;
    b->arg = arg;
    struct trec **rows = jd_xcalloc((size_t)n, sizeof *rows);
    struct jd_write **ws = jd_xcalloc((size_t)n, sizeof *ws);
    size_t nrows = 0;
    struct jd_sbuf out = {0};
    jd_sb_puts(&out, "{\"results\":[");
    for (int i = 0; i < n; i++) {
        const char *reason = NULL;
        struct jd_error e;
        jd_error_clear(&e);
        struct trec *row = NULL;
        int erc = end_task(j, ids[i], &ois[i], &row, &reason, &e);
        jd_sb_puts(&out, i ? ",{\"id\":" : "{\"id\":");
        jd_sb_string(&out, ids[i]);
        jd_sb_puts(&out, ",\"status\":");
        jd_sb_number(&out, erc == 0 ? 200 : jd_error_http_status(erc));
        if (reason) {
            jd_sb_puts(&out, ",\"reason\":");
            jd_sb_string(&out, reason);
        }
        jd_sb_puts(&out, "}");
        if (row) {
            row->batch = b;
            row->w.done = tasks_trec_done;
            row->w.arg = row;
            rows[nrows] = row;
            ws[nrows++] = &row->w;
        }
        outcome_clear(&ois[i]);
    }
    jd_sb_puts(&out, "]}");
    b->answer = out.p;
    b->remaining = (int)nrows + 1; /* + this function's own, so it cannot finish early */
    if (nrows && jd_store_submit_many(j->store, ws, nrows) != 0)
        for (size_t i = 0; i < nrows; i++)
            tasks_trec_done(rows[i], ws[i], JD_ESHUTDOWN);
    free(ws);
    free(rows);
    free(ois);
    free(ids);
    cJSON_Delete(o);
    tasks_batch_committed(j, b, 0);
    return 0;
}

int jd_jobs_task_heartbeat(struct jd_jobs *j, const char *id, const char *body, size_t len,
                           jd_action_done_fn done, void *arg, const char **reason,
                           struct jd_error *err)
{
    struct jd_tasks *t = j->tasks;
    cJSON *o = tasks_parse_object(body ? body : "", len, true, err);
    if (!o)
        return err->code;
    int64_t lease_ms = 0;
    int rc = tasks_int_field(o, "lease_ms", JD_TASK_MIN_LEASE_MS, JD_TASK_MAX_LEASE_MS, 0,
                             &lease_ms, err);
    const cJSON *pg = cJSON_GetObjectItemCaseSensitive(o, "progress");
    char *progress = rc == 0 && pg && !cJSON_IsNull(pg) ? cJSON_PrintUnformatted(pg) : NULL;
    if (rc == 0 && progress && strlen(progress) > PROGRESS_MAX)
        rc = jd_error_set(err, JD_ETOOBIG, "/progress", "progress is larger than %d bytes",
                          PROGRESS_MAX);
    if (rc) {
        free(progress);
        cJSON_Delete(o);
        return rc;
    }
    /* The job first (mu before tmu): a cancelled job's worker hears so
     * here, before its task is withdrawn, and can stop early. */
    pthread_mutex_lock(&t->mu);
    struct task *k = tasks_find(t, id);
    int64_t job_id = k ? k->job_id : 0;
    bool claimed = k && k->st == TS_CLAIMED;
    bool over = k && k->over;
    pthread_mutex_unlock(&t->mu);
    if (!claimed) {
        free(progress);
        cJSON_Delete(o);
        return k ? jd_error_set(err, JD_ENOENT, NULL, "no such task")
                 : gone_reason(j, id, reason, err);
    }
    pthread_mutex_lock(&j->mu);
    struct job *jb = jobs_job_find(j, job_id);
    if (over || !jb || jb->cancel_requested || jb->finished || j->stopping) {
        pthread_mutex_unlock(&j->mu);
        free(progress);
        cJSON_Delete(o);
        *reason = "cancelled";
        return jd_error_set(err, JD_ECONFLICT, NULL, "the task's job was cancelled");
    }
    pthread_mutex_lock(&t->mu);
    k = tasks_find(t, id);
    if (!k || k->st != TS_CLAIMED) {
        pthread_mutex_unlock(&t->mu);
        pthread_mutex_unlock(&j->mu);
        free(progress);
        cJSON_Delete(o);
        return gone_reason(j, id, reason, err);
    }
    int64_t now = jd_wall_ms();
    if (lease_ms)
        k->lease_ms = lease_ms;
    k->lease_expires_ms = now + k->lease_ms;
    tasks_worker_seen(t, k->worker ? k->worker : "", NULL, 0);
    if (progress) {
        tasks_progress_set(t, k, progress);
        if (now - k->progress_ms >= PROGRESS_EVERY_MS) {
            /* In the history too, at most once a second per task. */
            k->progress_ms = now;
            cJSON *d = cJSON_CreateObject();
            cJSON_AddItemToObject(d, "progress", cJSON_Duplicate(pg, true));
            cJSON_AddStringToObject(d, "task", k->id);
            cJSON_AddStringToObject(d, "worker", k->worker ? k->worker : "");
            struct wrec *r = jobs_wrec_new(j, jb, JD_W_JOB_CHANGE);
            r->data = jobs_with_run(d, jb->run);
            r->w.kind = JD_EVK_PROGRESS;
            r->w.tag = k->tag;
            r->w.data = r->data;
            jobs_record(r);
        }
    }
    struct trec *row = tasks_row(j, k, JD_TASK_CLAIMED);
    char when[32];
    jd_render_time(k->lease_expires_ms, when);
    row->answer = jd_xasprintf("{\"lease_expires_at\":\"%s\"}", when);
    row->done = done;
    row->arg = arg;
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_unlock(&j->mu);
    free(progress);
    cJSON_Delete(o);
    tasks_trec_submit(row);
    return 0;
}
