/*
 * Acting on a job: cancel, message, manual retry, and pausing or resuming a
 * queue. Each records its intent; the effect follows the commit (the
 * commit callback in jobs_record.c delivers, arms the grace timer or admits).
 *
 * Invariants: only a live (inserted, unfinished) job takes a cancel or a
 * message; only a failed or cancelled job not in the table can be retried.
 * A run of a job keeps every message until it ends (a workflow buffers
 * those no wait step took, and replay re-delivers them all), so one run
 * takes at most limits.max_messages / max_message_bytes (struct job counts
 * them; replay rebuilds the counts).
 *
 * Threading: called from HTTP threads; each takes jd_jobs.mu for the check
 * and the record, and validates input without it.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"

#include <stdlib.h>
#include <string.h>

/* Under mu: the live job, or the error for one that is not live. In a
 * cluster (remote not NULL), *remote is set for a job that is not
 * finished but not held here (another node's, or none yet): its inbox. */
static int live_job(struct jd_jobs *j, int64_t id, struct job **out, bool *remote)
{
    struct job *jb = jobs_job_find(j, id);
    if (jb) {
        if (!jb->inserted)
            return JD_ENOENT;
        if (jb->finished || jb->end_folded || jb->lost)
            return JD_ECONFLICT;
        *out = jb;
        return 0;
    }
    if (j->window) { /* queued, but only in the store: read it in */
        int rc = jobs_window_load_locked(j, id, out);
        if (rc == 0 || !j->cl)
            return rc;
        /* Cluster: not this node's queued job (the load reads only ours).
         * One waiting unowned (past some node's window) has no owner to
         * take an inbox request: it becomes this node's, then is read in. */
        if (jd_store_claim_id(j->store, id) == 0)
            return jobs_window_load_locked(j, id, out);
    }
    struct jd_job row = {0};
    int rc = jd_store_job_get(j->store, id, &row);
    bool live = rc == 0 && !jd_job_state_terminal(row.state);
    jd_job_clear(&row);
    if (live && remote && j->cl) {
        *remote = true;
        return 0;
    }
    /* a read that failed (a busy PostgreSQL read pool: 503) is not a 404 */
    return rc == 0 ? JD_ECONFLICT : rc == JD_EBUSY || rc == JD_EIO ? rc : JD_ENOENT;
}

/* Under mu: put a cancel or message (data) for job id, which another node
 * holds, in its inbox; done fires once that commits (JD_ENOENT, JD_ECONFLICT
 * as the store finds the job then). */
static void request_remote_locked(struct jd_jobs *j, int64_t id, enum jd_event_kind kind,
                                  char *data, jd_action_done_fn done, void *arg)
{
    struct wrec *r = jobs_wrec_new(j, NULL, JD_W_JOB_REQUEST);
    r->w.job_id = id;
    r->w.kind = kind;
    r->data = data;
    r->w.data = r->data;
    r->action_done = done;
    r->user_arg = arg;
    jobs_record(r);
}

/* request_id: 0 for a cancel asked of this node (one for a job held
 * elsewhere goes to its inbox); else the inbox request being applied (only
 * a job held here). */
static int cancel_do(struct jd_jobs *j, int64_t id, int64_t request_id, jd_action_done_fn done,
                     void *arg)
{
    struct job *jb = NULL;
    bool remote = false;
    pthread_mutex_lock(&j->mu);
    int rc = j->draining ? JD_ESHUTDOWN : live_job(j, id, &jb, request_id ? NULL : &remote);
    if (rc == 0 && remote) {
        request_remote_locked(j, id, JD_EVK_CANCEL, jd_xstrdup("{}"), done, arg);
        pthread_mutex_unlock(&j->mu);
        return 0;
    }
    if (rc) {
        pthread_mutex_unlock(&j->mu);
        return rc;
    }
    struct wrec *ce = jobs_wrec_new(j, jb, JD_W_JOB_CHANGE);
    ce->w.request_id = request_id;
    ce->data = jobs_with_run(cJSON_CreateObject(), jb->run);
    ce->w.kind = JD_EVK_CANCEL;
    ce->w.data = ce->data;
    jb->cancel_requested = true;
    if (!jb->spawned && !jb->admitted) {
        /* Not running: cancelled at once. */
        jobs_ready_remove(j, jb);
        jobs_run_at_cancel_locked(j, jb);
        jb->finished = true;
        jobs_record(ce);
        struct wrec *r = jobs_state_rec(j, jb, JD_JOB_CANCELLED, AFTER_FINAL);
        r->error = jobs_err_json("cancelled", "the job was cancelled before it ran");
        r->w.set |= JD_SET_ERROR | JD_SET_FINISHED;
        r->w.error = r->error;
        r->w.finished_ms = jd_wall_ms();
        r->action_done = done;
        r->user_arg = arg;
        jobs_record(r);
    } else {
        /* Its calls waiting as remote tasks are handed out no more, and a
         * worker holding one hears "cancelled" from now on. */
        if (jb->calls)
            jobs_tasks_job_over(j, jb->id);
        ce->after = AFTER_CANCEL;
        ce->action_done = done;
        ce->user_arg = arg;
        jobs_record(ce);
    }
    pthread_mutex_unlock(&j->mu);
    return 0;
}

int jd_jobs_cancel(struct jd_jobs *j, int64_t id, jd_action_done_fn done, void *arg)
{
    return cancel_do(j, id, 0, done, arg);
}

int jobs_cancel_request(struct jd_jobs *j, int64_t id, int64_t request_id, jd_action_done_fn done,
                        void *arg)
{
    return cancel_do(j, id, request_id, done, arg);
}

static int message_do(struct jd_jobs *j, int64_t id, const char *body, size_t len,
                      int64_t request_id, jd_action_done_fn done, void *arg, struct jd_error *err)
{
    static const char *const allowed[] = {"topic", "data", NULL};
    jd_error_clear(err);
    if (len > j->limits.max_definition_bytes)
        return jd_error_set(err, JD_ETOOBIG, "", "message is %zu bytes, the limit is %zu", len,
                            j->limits.max_definition_bytes);
    int rc = jd_jobdef_check_text(body, len, &j->limits, err);
    if (rc)
        return rc;
    cJSON *m = cJSON_ParseWithLength(body, len);
    if (!m)
        return jd_error_set(err, JD_EPARSE, "", "malformed JSON");
    const cJSON *topic = cJSON_GetObjectItemCaseSensitive(m, "topic");
    if (!cJSON_IsObject(m)) {
        rc = jd_error_set(err, JD_EINVAL, "", "a message is {\"topic\": \"...\", \"data\": ...}");
    } else if (!topic) {
        rc = jd_error_set(err, JD_EINVAL, "/topic", "missing topic");
    } else if (!cJSON_IsString(topic) || !topic->valuestring[0] ||
               strlen(topic->valuestring) > 64) {
        rc = jd_error_set(err, JD_EINVAL, "/topic", "topic must be a string of 1 to 64 characters");
    } else {
        for (const cJSON *c = m->child; c && !rc; c = c->next) {
            bool ok = false;
            for (const char *const *a = allowed; *a; a++)
                ok = ok || strcmp(*a, c->string) == 0;
            if (!ok) {
                char p[JD_ERROR_PTR_MAX] = "";
                jd_ptr_append(p, sizeof p, c->string);
                rc = jd_error_set(err, JD_EINVAL, p, "unknown member \"%s\" in a message",
                                  c->string);
            }
        }
    }
    if (rc) {
        cJSON_Delete(m);
        return rc;
    }
    cJSON *payload = cJSON_CreateObject();
    cJSON_AddStringToObject(payload, "topic", topic->valuestring);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(m, "data");
    cJSON_AddItemToObject(payload, "data", data ? cJSON_Duplicate(data, 1) : cJSON_CreateNull());
    cJSON_Delete(m);
    struct job *jb = NULL;
    bool remote = false;
    pthread_mutex_lock(&j->mu);
    rc = j->draining ? JD_ESHUTDOWN : live_job(j, id, &jb, request_id ? NULL : &remote);
    if (rc == 0 && remote) { /* its owner checks its message limits */
        request_remote_locked(j, id, JD_EVK_MESSAGE, cJSON_PrintUnformatted(payload), done, arg);
        pthread_mutex_unlock(&j->mu);
        cJSON_Delete(payload);
        return 0;
    }
    if (rc) {
        pthread_mutex_unlock(&j->mu);
        cJSON_Delete(payload);
        return jd_error_set(err, rc, NULL,
                            rc == JD_ECONFLICT ? "the job has finished" : "no such job");
    }
    char *res = cJSON_PrintUnformatted(payload);
    char *text = jobs_with_run(payload, jb->run);
    size_t n = strlen(text);
    if (jb->messages >= j->limits.max_messages || jb->message_bytes > j->limits.max_message_bytes ||
        n > j->limits.max_message_bytes - jb->message_bytes) {
        jobs_window_settle_locked(j, jb);
        pthread_mutex_unlock(&j->mu);
        free(res);
        free(text);
        return jd_error_set(err, JD_ECONFLICT, NULL,
                            "the job holds %u messages (%zu bytes) already; one run of a job "
                            "keeps at most %u (%zu bytes), and a message to a topic no step "
                            "waits on stays until the job ends",
                            jb->messages, jb->message_bytes, j->limits.max_messages,
                            j->limits.max_message_bytes);
    }
    jb->messages++;
    jb->message_bytes += n;
    struct wrec *r = jobs_wrec_new(j, jb, JD_W_JOB_CHANGE);
    r->data = text;
    r->res = res;
    r->w.kind = JD_EVK_MESSAGE;
    r->w.data = r->data;
    r->w.request_id = request_id;
    r->after = AFTER_MESSAGE;
    r->action_done = done;
    r->user_arg = arg;
    jobs_record(r);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

int jd_jobs_message(struct jd_jobs *j, int64_t id, const char *body, size_t len,
                    jd_action_done_fn done, void *arg, struct jd_error *err)
{
    return message_do(j, id, body, len, 0, done, arg, err);
}

int jobs_message_request(struct jd_jobs *j, int64_t id, const char *body, int64_t request_id,
                         jd_action_done_fn done, void *arg)
{
    struct jd_error err = {0};
    return message_do(j, id, body, strlen(body), request_id, done, arg, &err);
}

int jd_jobs_retry(struct jd_jobs *j, int64_t id, jd_action_done_fn done, void *arg)
{
    pthread_mutex_lock(&j->mu);
    if (j->draining) {
        pthread_mutex_unlock(&j->mu);
        return JD_ESHUTDOWN;
    }
    if (jobs_job_find(j, id)) {
        pthread_mutex_unlock(&j->mu);
        return JD_ECONFLICT;
    }
    if (jobs_deleting_locked(j, id)) { /* DELETE /v1/jobs/{id} is committing */
        pthread_mutex_unlock(&j->mu);
        return JD_ENOENT;
    }
    struct jd_job row = {0};
    int rc = jd_store_job_get(j->store, id, &row);
    if (rc) {
        pthread_mutex_unlock(&j->mu);
        return rc == JD_EBUSY || rc == JD_EIO ? rc : JD_ENOENT;
    }
    if (row.state != JD_JOB_FAILED && row.state != JD_JOB_CANCELLED) {
        pthread_mutex_unlock(&j->mu);
        jd_job_clear(&row);
        return JD_ECONFLICT;
    }
    int64_t now = jd_wall_ms();
    struct job *jb = jobs_job_new(j, jobs_parse_stored(row.definition), id, now);
    free(jb->queue);
    jb->queue = jd_xstrdup(row.queue);
    jb->priority = row.priority;
    jb->run_at_ms = now;
    jb->created_ms = row.created_ms;
    jb->version = row.version;
    jb->committed_state = row.state;
    jb->inserted = true;
    jb->run = (row.attempts ? row.attempts : 1) + 1;
    jd_job_clear(&row);
    jobs_job_insert(j, jb);
    struct wrec *r = jobs_state_rec(j, jb, JD_JOB_QUEUED, AFTER_QUEUED);
    r->w.set |= JD_SET_ATTEMPTS | JD_SET_OUTPUT | JD_SET_ERROR | JD_SET_RUN_AT | JD_SET_FINISHED;
    r->w.attempts = jb->run;
    r->w.run_at_ms = now;
    r->w.finished_ms = 0;
    r->w.expect_version = jb->version; /* a cluster: not finished again elsewhere since */
    r->action_done = done;
    r->user_arg = arg;
    jobs_record(r);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

int jd_jobs_queue_pause(struct jd_jobs *j, const char *queue, bool paused, jd_action_done_fn done,
                        void *arg)
{
    if (!jobs_queue_name_ok(queue))
        return JD_EINVAL;
    pthread_mutex_lock(&j->mu);
    if (j->draining) {
        pthread_mutex_unlock(&j->mu);
        return JD_ESHUTDOWN;
    }
    struct wrec *r = jobs_wrec_new(j, NULL, JD_W_QUEUE);
    r->queue_name = jd_xstrdup(queue);
    r->w.queue = r->queue_name;
    r->w.paused = paused;
    r->after = AFTER_QUEUE_FLAG;
    r->action_done = done;
    r->user_arg = arg;
    jobs_record(r);
    pthread_mutex_unlock(&j->mu);
    return 0;
}
