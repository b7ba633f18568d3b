/*
 * Recording: every transition, dispatch, completion, message and cancel is
 * a struct wrec submitted to the storage writer; wrec_done, the commit
 * callback, acts on it once it is durable (or has failed). A completion or
 * a job's end that fails to commit (a full disk) is recorded again after a
 * backoff (retry_record_locked) and acted on only once it commits.
 *
 * Invariants: a process sees a completion or message only after its record
 * committed, in commit order (the job's delivery queue, struct dlv); a job
 * leaves the table only once its final state is durable. Each wrec holds a
 * reference on its job until wrec_done is done with it. A task's completion
 * that decides its end is submitted with the end as one all-or-nothing
 * group (record_completion_try): one transaction, not two, and the end is
 * still acted on only in its own wrec_done.
 *
 * Threading: the record builders run under jd_jobs.mu (store submission
 * only enqueues). wrec_done runs on the store's completion thread, one
 * commit at a time in commit order; it takes mu, and calls user callbacks
 * and watch fns without it. record_retry_fire runs on the timer thread.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void wrec_done(void *arg, struct jd_write *w, int rc);
static void retry_record_locked(struct jd_jobs *j, struct job *jb, struct wrec *r, int rc);

/* A job's records are made on the HTTP and scheduler threads and freed on
 * the completion thread, five or more a job: from an object cache. */
static struct jd_objcache *wrec_cache(void)
{
    return jd_objcache(JD_OC_JOB_WREC, sizeof(struct wrec));
}

struct wrec *jobs_wrec_new(struct jd_jobs *j, struct job *jb, enum jd_write_op op)
{
    struct wrec *r = jd_objcache_calloc(wrec_cache());
    r->j = j;
    r->job = jb;
    if (jb)
        jb->refs++;
    r->w.op = op;
    r->w.job_id = jb ? jb->id : 0;
    r->w.done = wrec_done;
    r->w.arg = r;
    return r;
}

void jobs_wrec_free(struct wrec *r)
{
    free(r->data);
    free(r->output);
    free(r->error);
    free(r->def_text);
    free(r->idem_key);
    free(r->fingerprint);
    free(r->queue_name);
    free(r->sched_id);
    free(r->row.queue);
    free(r->res);
    free(r->res_err);
    jd_objcache_free(wrec_cache(), r);
}

/* Under mu (store submission only enqueues). A record that cannot be
 * enqueued (the store is closing) is dropped: nothing is reported durable. */
void jobs_record(struct wrec *r)
{
    int rc = jd_store_submit(r->j->store, &r->w);
    if (rc) {
        jd_logf(JD_LOG_WARN, "job %" PRId64 ": record dropped: %s", r->w.job_id, jd_strerror(rc));
        if (r->job)
            jobs_job_unref(r->job);
        jobs_wrec_free(r);
    }
}

/* Event data with "run" added. Takes ownership of o. */
char *jobs_with_run(cJSON *o, uint32_t run)
{
    cJSON_AddNumberToObject(o, "run", run);
    char *t = jd_json_print(o);
    cJSON_Delete(o);
    return t;
}

/* Close event data being written in b with "run" (the same text as
 * jobs_with_run would give); returns b's text (caller frees). */
static char *end_with_run(struct jd_sbuf *b, uint32_t run)
{
    jd_sb_puts(b, ",\"run\":");
    jd_sb_number(b, run);
    jd_sb_puts(b, "}");
    return b->p;
}

/* A state-change record for jb (not yet submitted: the caller may add
 * fields, then calls jobs_record). */
struct wrec *jobs_state_rec(struct jd_jobs *j, struct job *jb, enum jd_job_state s,
                            enum after after)
{
    struct wrec *r = jobs_wrec_new(j, jb, JD_W_JOB_CHANGE);
    struct jd_sbuf b = {0};
    jd_sb_puts(&b, "{\"state\":");
    jd_sb_string(&b, jd_job_state_name(s));
    r->data = end_with_run(&b, jb->run);
    r->w.set = JD_SET_STATE;
    r->w.state = s;
    r->w.kind = JD_EVK_STATE;
    r->w.data = r->data;
    r->after = after;
    /* A unique key is released in the commit that ends its hold. */
    if (jb->ukey && (jd_job_state_terminal(s) || (s == JD_JOB_RUNNING && jb->ukey_queued)))
        r->w.release_unique = true;
    jb->state = s;
    return r;
}

void jobs_record_state(struct jd_jobs *j, struct job *jb, enum jd_job_state s)
{
    jobs_record(jobs_state_rec(j, jb, s, AFTER_NONE));
}

/* Under mu: append an event to jb's delivery queue (takes ownership of d). */
void jobs_dlv_append(struct job *jb, struct dlv *d)
{
    d->next = NULL;
    if (jb->dlv_tail)
        jb->dlv_tail->next = d;
    else
        jb->dlv = d;
    jb->dlv_tail = d;
}

/* Under mu: hand the deliverable head of jb's queue to the process, in
 * order, stopping at the first event that must wait (see struct dlv). */
void jobs_dlv_pump_locked(struct jd_jobs *j, struct job *jb)
{
    if (!jb->spawned || j->stopping)
        return;
    struct dlv *d;
    while ((d = jb->dlv) && (d->message || d->ready)) {
        jb->dlv = d->next;
        if (!jb->dlv)
            jb->dlv_tail = NULL;
        if (jb->finished) {
            free(d->data);
            free(d->error);
        } else if (d->message) {
            jd_sched_send(j->sched, jb->pid, 0, d->data);
        } else {
            jd_sched_complete(j->sched, d->token, d->data, d->error);
        }
        free(d);
    }
}

/* Under mu: a committed message (takes ownership of data). */
static void deliver_message_locked(struct jd_jobs *j, struct job *jb, char *data)
{
    if (jb->finished) {
        free(data);
    } else if (jb->spawned && !jb->dlv) {
        jd_sched_send(j->sched, jb->pid, 0, data); /* nothing ahead of it */
    } else {
        struct dlv *d = jd_xcalloc(1, sizeof *d);
        d->message = true;
        d->data = data;
        jobs_dlv_append(jb, d);
        jobs_dlv_pump_locked(j, jb);
    }
}

static void render_and_call(struct jd_jobs *j, int64_t id, int rc, jd_action_done_fn fn, void *arg)
{
    char *json = NULL;
    if (rc == 0) {
        struct jd_job row = {0};
        if (jd_store_job_get(j->store, id, &row) == 0) {
            json = jd_render_job_json(&row);
            jd_job_clear(&row);
        }
    }
    fn(arg, rc, json);
    free(json);
}

static void batch_finish(struct jd_jobs *j, struct batch *b)
{
    struct jd_submit_result res = {.rc = b->rc};
    char *json = NULL;
    if (b->rc == 0) {
        /* Every insert committed: render the rows as stored, from memory
         * (each record still references its job, hence its definition). */
        struct jd_sbuf sb = {0};
        jd_sb_puts(&sb, "{\"jobs\":[");
        for (size_t i = 0; i < b->n; i++) {
            struct wrec *r = b->recs[i];
            r->row.version = r->w.version;
            r->row.updated_ms = r->row.created_ms;
            char *one = jd_render_job_json(&r->row);
            if (i > 0)
                jd_sb_puts(&sb, ",");
            jd_sb_puts(&sb, one);
            free(one);
        }
        jd_sb_puts(&sb, "]}");
        json = sb.p;
    } else {
        jd_error_set(&res.err, b->rc, NULL, "storing the batch failed: %s", jd_strerror(b->rc));
    }
    res.json = json;
    b->done(b->arg, &res);
    free(json);
}

void jobs_idem_forget(struct jd_jobs *j, const char *key)
{
    for (struct idem **pp = &j->idems; *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->key, key) == 0) {
            struct idem *d = *pp;
            *pp = d->next;
            free(d->key);
            free(d);
            return;
        }
}

static void final_stats_locked(struct jd_jobs *j, struct job *jb, enum jd_job_state s)
{
    if (s == JD_JOB_SUCCEEDED)
        j->st.succeeded++;
    else if (s == JD_JOB_FAILED)
        j->st.failed++;
    else if (s == JD_JOB_CANCELLED)
        j->st.cancelled++;
    int64_t now = jd_wall_ms();
    jd_stats_job_end(j->series, jb->queue, s, now);
    int64_t from = jb->started_ms ? jb->started_ms : jb->created_ms;
    int64_t d = now - from;
    if (d < 0)
        d = 0;
    static const int64_t bounds[11] = {1, 5, 10, 50, 100, 500, 1000, 5000, 10000, 60000, 300000};
    int b = 0;
    while (b < 11 && d > bounds[b])
        b++;
    j->st.duration_hist[b]++;
    j->st.duration_ms_sum += (uint64_t)d;
}

/* Under mu: the job as its final record (jobs_record_final) left the row,
 * rendered as jd_jobs_get_json would, for the long-polls that commit fires:
 * the record set state, output, error and finish time, the writer stamped
 * updated_ms, and the rest was set in this process (row_known, a run
 * started here). NULL when any of that is not so (the reader then reads). */
static char *final_json_locked(const struct job *jb, const struct jd_write *w)
{
    const unsigned all = JD_SET_STATE | JD_SET_OUTPUT | JD_SET_ERROR | JD_SET_FINISHED;
    if (!jb->row_known || !jb->started_ms || !jb->def || !jb->def->text || w->set != all ||
        !jd_job_state_terminal(w->state))
        return NULL;
    struct jd_job row = {.id = jb->id,
                         .queue = jb->queue,
                         .priority = jb->priority,
                         .state = w->state,
                         .definition = jb->def->text,
                         .run_at_ms = jb->run_at_ms,
                         .attempts = jb->run,
                         .version = w->version,
                         .output = (char *)w->output,
                         .error = (char *)w->error,
                         .created_ms = jb->created_ms,
                         .updated_ms = w->time_ms,
                         .started_ms = jb->started_ms,
                         .finished_ms = w->finished_ms};
    return jd_render_job_json(&row);
}

static void wrec_done(void *arg, struct jd_write *w, int rc)
{
    struct wrec *r = arg;
    struct jd_jobs *j = r->j;
    struct job *jb = r->job;
    struct fire *fires = NULL;
    struct job *start = NULL;
    struct batch *batch = r->batch; /* its last record frees every record */
    char *insert_json = NULL;
    char *fire_json = NULL;
    bool trim = false;
    char *notify_url = NULL;
    int64_t notify_id = 0;
    enum jd_job_state notify_state = JD_JOB_SUCCEEDED;
    jd_pid fenced_kill = 0;

    if (r->submit_done && !r->no_json && rc == 0 && w->op == JD_W_JOB_INSERT &&
        r->row.id == w->job_id) {
        /* The row as the insert stored it: no read back, no re-parse, and
         * no lock (the row and jb->def, which r's reference keeps, are
         * not changed by anyone). */
        r->row.version = w->version;
        r->row.updated_ms = r->row.created_ms;
        insert_json = jd_render_job_json(&r->row);
    }

    pthread_mutex_lock(&j->mu);
    /* Cluster: another node owns the job now; it resumes there from the
     * history, so nothing more is recorded or retried here. */
    bool fenced = rc == JD_ESTALE && jb && j->cl;
    if (fenced)
        jobs_cluster_fenced_locked(j, jb, &fenced_kill);
    if (rc == 0 && jb && w->op != JD_W_JOB_CRASHES) {
        if (w->version > jb->version)
            jb->version = w->version;
        if (w->op == JD_W_JOB_INSERT) {
            jb->inserted = true;
            jb->committed_state = JD_JOB_QUEUED;
        } else if (w->set & JD_SET_STATE) {
            jb->committed_state = w->state;
        }
        jobs_watches_collect(j, jb->id, jb->version, jd_job_state_terminal(jb->committed_state),
                             &fires);
        if (fires && r->after == AFTER_FINAL && w->version == jb->version)
            fire_json = final_json_locked(jb, w);
        for (struct fire *f = fires; f; f = f->next)
            f->json = fire_json;
    }
    if (r->idem_key)
        jobs_idem_forget(j, r->idem_key);
    switch (r->after) {
    case AFTER_COMPLETE:
        if (rc != 0) {
            /* Not durable: the process must not act on it. Record it again
             * later (a full disk frees up); it is delivered once it commits.
             * An end folded with it failed too: the retry goes alone, and
             * the process reports the end as usual. */
            jb->end_folded = false;
            if (!j->stopping && !fenced)
                retry_record_locked(j, jb, r, rc);
        } else if (!j->stopping && !jb->dlv) {
            jd_sched_complete(j->sched, r->token, r->res, r->res_err); /* nothing ahead */
            r->res = r->res_err = NULL;
        } else if (!j->stopping) {
            /* Recorded events are still waiting to be replayed: behind them. */
            struct dlv *d = jd_xcalloc(1, sizeof *d);
            d->ready = true;
            d->tag = r->token.tag;
            d->token = r->token;
            d->data = r->res;
            d->error = r->res_err;
            r->res = r->res_err = NULL;
            jobs_dlv_append(jb, d);
            jobs_dlv_pump_locked(j, jb);
        }
        break;
    case AFTER_MESSAGE:
        if (rc == 0) {
            deliver_message_locked(j, jb, r->res);
            r->res = NULL;
        }
        jobs_window_settle_locked(j, jb); /* read in for this message: back to its place */
        break;
    case AFTER_CANCEL:
        if (jb->spawned && !jb->finished && !jb->cancel_sent) {
            jb->cancel_sent = true;
            jd_sched_cancel(j->sched, jb->pid);
            jb->grace_timer = jobs_arm_job_timer(j, jb, j->cancel_grace_ms, 2);
        }
        break;
    case AFTER_FINAL:
        if (fenced) { /* its end is the new owner's to record */
            jobs_job_remove(j, jb);
            break;
        }
        if (rc != 0 && r->folded && !jb->finished) {
            /* Its completion failed with it and is recorded again: the
             * process, still running, reports the end once it gets it. */
            jb->state = r->prev_state;
            break;
        }
        if (rc != 0 && !j->stopping) {
            /* The job stays in memory until its end is durable. */
            retry_record_locked(j, jb, r, rc);
            break;
        }
        final_stats_locked(j, jb, w->state);
        if (j->cl && jobs_queue_pooled(j, jobs_job_queue(j, jb))) {
            jobs_job_queue(j, jb)->freed = true; /* its slot is free in the database now */
            jobs_cluster_grants_wanted_locked(j);
        }
        if (jb->def && jb->def->notify_url && (jb->def->notify_on & (1u << w->state)) &&
            !j->stopping) {
            notify_id = jb->id;
            notify_state = w->state;
            notify_url = jd_xstrdup(jb->def->notify_url);
        }
        if (r->folded && jb->spawned && !jb->finished && !jb->eprevp) {
            /* Its process still finishes (jobs_hook_finished unlinks it). */
            jb->enext = j->ending;
            if (j->ending)
                j->ending->eprevp = &jb->enext;
            j->ending = jb;
            jb->eprevp = &j->ending;
        }
        jobs_job_remove(j, jb);
        trim = jobs_trim_due_locked(j);
        jobs_admit_locked(j, &start);
        break;
    case AFTER_QUEUED:
        if (w->op == JD_W_JOB_INSERT)
            jobs_window_inserted_locked(j, jb);
        if (rc == 0 && !jb->finished && !j->draining) {
            jobs_window_place_locked(j, jb);
            jobs_admit_locked(j, &start);
        } else if (rc != 0) {
            jb->finished = true;
            jobs_job_remove(j, jb);
        }
        break;
    case AFTER_QUEUE_FLAG:
        if (rc == 0) {
            jobs_queue_get(j, r->queue_name)->paused = w->paused;
            jobs_admit_locked(j, &start);
        }
        break;
    case AFTER_QUEUE_CONFIG:
        if (rc == 0) {
            jobs_queue_controls_committed_locked(j, r->queue_name, r->data);
            jobs_admit_locked(j, &start);
        }
        break;
    case AFTER_NONE:
        break;
    }
    if (!batch && jb) {
        jobs_job_unref(jb); /* nothing below uses jb */
        r->job = NULL;
    }
    pthread_mutex_unlock(&j->mu);

    jobs_watches_fire(j, fires, 0);
    if (fenced_kill)
        jd_sched_kill(j->sched, fenced_kill, NULL);
    if (notify_url) { /* the end is durable: tell the job's webhook (a registry call: without mu) */
        jobs_notify_start(j, notify_id, notify_state, notify_url);
        free(notify_url);
    }
    free(fire_json);

    if (r->submit_done) {
        struct jd_submit_result res = {.rc = rc, .job_id = w->job_id};
        char *json = NULL;
        if (rc == JD_EEXIST) {
            res.rc = 0;
            res.existing = true;
        } else if (rc) {
            jd_error_set(&res.err, rc, NULL, "storing the job failed: %s", jd_strerror(rc));
        }
        if (insert_json) {
            json = insert_json;
            insert_json = NULL;
        } else if (res.rc == 0 && !r->no_json) {
            struct jd_job row = {0};
            if (jd_store_job_get(j->store, w->job_id, &row) == 0) {
                json = jd_render_job_json(&row);
                jd_job_clear(&row);
            }
        }
        res.json = json;
        r->submit_done(r->user_arg, &res);
        free(json);
    }
    if (r->action_done) {
        if (w->op == JD_W_QUEUE_CONFIG) {
            char *json = NULL;
            if (rc == 0 && jd_jobs_queue_json(j, r->queue_name, &json) != 0)
                json = NULL;
            r->action_done(r->user_arg, rc, json);
            free(json);
        } else if (w->op == JD_W_QUEUE) {
            char buf[160];
            snprintf(buf, sizeof buf, "{\"queue\":\"%s\",\"paused\":%s}", r->queue_name,
                     w->paused ? "true" : "false");
            r->action_done(r->user_arg, rc, rc ? NULL : buf);
        } else {
            render_and_call(j, w->job_id, rc, r->action_done, r->user_arg);
        }
    }
    jobs_start_list(j, start);
    if (trim)
        jobs_trim(); /* after the admissions: new jobs do not wait for it */
    if (!batch) {
        jobs_wrec_free(r);
        return;
    }
    {
        struct batch *b = batch;
        pthread_mutex_lock(&j->mu);
        if (rc && !b->rc)
            b->rc = rc;
        bool last = --b->remaining == 0;
        pthread_mutex_unlock(&j->mu);
        if (last) {
            batch_finish(j, b);
            for (size_t i = 0; i < b->n; i++) {
                pthread_mutex_lock(&j->mu);
                if (b->recs[i]->job)
                    jobs_job_unref(b->recs[i]->job);
                pthread_mutex_unlock(&j->mu);
                jobs_wrec_free(b->recs[i]);
            }
            free(b->recs);
            free(b);
        }
    }
}

/* Under mu: the job's end record (not yet submitted). Takes ownership of
 * output and error. */
static struct wrec *final_rec(struct jd_jobs *j, struct job *jb, enum jd_job_state s, char *output,
                              char *error, int64_t finished_ms, unsigned tries)
{
    jobs_crashes_reset(j, jb); /* a manual retry starts a new run of crashes */
    struct wrec *r = jobs_state_rec(j, jb, s, AFTER_FINAL);
    r->w.set |= JD_SET_OUTPUT | JD_SET_ERROR | JD_SET_FINISHED;
    r->output = output;
    r->error = error;
    r->w.output = r->output;
    r->w.error = r->error;
    r->w.finished_ms = finished_ms;
    r->tries = tries;
    return r;
}

/* Under mu: record the job's end. Takes ownership of output and error. */
void jobs_record_final(struct jd_jobs *j, struct job *jb, enum jd_job_state s, char *output,
                       char *error, int64_t finished_ms, unsigned tries)
{
    jobs_record(final_rec(j, jb, s, output, error, finished_ms, tries));
}

/* Under mu: the end a task's process will report once it gets this
 * completion of its one call (workflow.c: on_complete, wf_step; jobs_run.c:
 * jobs_hook_finished), when nothing else can come first: the job is not
 * being cancelled and nothing recorded waits to be delivered ahead of it.
 * Sets *state and the output or error text (caller frees); false when the
 * outcome is not decided by the completion alone. */
static bool task_end_decided(const struct job *jb, uint32_t tag, const char *result,
                             const char *error, enum jd_job_state *state, char **output, char **err)
{
    const struct jd_jobdef *d = jb->def;
    if (!d || d->shape != JD_JOBDEF_TASK || tag != 1 || !jb->spawned || jb->finished ||
        jb->end_folded || jb->cancel_requested || jb->dlv || jb->state != JD_JOB_RUNNING)
        return false;
    cJSON *v = cJSON_Parse(error ? error : result ? result : "null");
    if (!v && error)
        return false; /* the process words an unparsable error itself */
    char *text = v ? jd_json_print(v) : jd_xstrdup("null");
    cJSON_Delete(v);
    if (!text)
        return false;
    *state = error ? JD_JOB_FAILED : JD_JOB_SUCCEEDED;
    *output = error ? NULL : text;
    *err = error ? text : NULL;
    return true;
}

/* Under mu: record a completion; the process gets it once it is durable.
 * tries: earlier attempts whose commit failed. */
static void record_completion_try(struct jd_jobs *j, struct job *jb, uint32_t tag,
                                  struct jd_token token, const char *result, const char *error,
                                  unsigned tries)
{
    struct wrec *r = jobs_wrec_new(j, jb, JD_W_JOB_CHANGE);
    struct jd_sbuf b = {0};
    jd_sb_puts(&b, error ? "{\"error\":" : "{\"result\":");
    jd_sb_json(&b, error ? error : result ? result : "null", "null");
    r->data = end_with_run(&b, jb->run);
    r->w.kind = JD_EVK_COMPLETE;
    r->w.tag = tag;
    r->w.data = r->data;
    r->after = AFTER_COMPLETE;
    r->token = token;
    r->res = error ? NULL : jd_xstrdup(result ? result : "null");
    r->res_err = error ? jd_xstrdup(error) : NULL;
    r->tries = tries;
    enum jd_job_state end;
    char *output = NULL, *err = NULL;
    if (tries > 0 || !task_end_decided(jb, tag, result, error, &end, &output, &err)) {
        jobs_record(r);
        return;
    }
    /* The completion decides the end: record the end with it, one group
     * (the same transaction, or neither), instead of one more batch after
     * the completion's commit. Nothing acts on the end before it commits:
     * wrec_done does, as for any end; the process still gets the
     * completion and finishes, and records nothing then. */
    enum jd_job_state prev = jb->state;
    struct wrec *f = final_rec(j, jb, end, output, err, jd_wall_ms(), 0);
    f->folded = true;
    f->prev_state = prev;
    jb->end_folded = true;
    struct jd_write *ws[2] = {&r->w, &f->w};
    int rc = jd_store_submit_many(j->store, ws, 2);
    if (rc) {
        jd_logf(JD_LOG_WARN, "job %" PRId64 ": record dropped: %s", jb->id, jd_strerror(rc));
        jb->end_folded = false;
        jb->state = prev;
        jobs_job_unref(jb);
        jobs_job_unref(jb);
        jobs_wrec_free(r);
        jobs_wrec_free(f);
    }
}

void jobs_record_completion(struct jd_jobs *j, struct job *jb, uint32_t tag, struct jd_token token,
                            const char *result, const char *error)
{
    record_completion_try(j, jb, tag, token, result, error, 0);
    jobs_crashes_reset(j, jb);
}

/* Under mu. Not history: no event, no new version, nothing to act on after
 * the commit (a failure leaves the old count, which errs toward
 * quarantining a job that did not crash, never toward looping). */
void jobs_record_crashes(struct jd_jobs *j, struct job *jb, uint32_t n)
{
    struct wrec *r = jobs_wrec_new(j, jb, JD_W_JOB_CRASHES);
    r->w.crashes = n;
    jb->crashes = n;
    jobs_record(r);
}

/* Under mu. */
void jobs_crashes_reset(struct jd_jobs *j, struct job *jb)
{
    if (jb->crashes > 0)
        jobs_record_crashes(j, jb, 0);
}

#define RETRY_FIRST_MS 100 /* a record that failed to commit is tried again after this, */

#define RETRY_MAX_MS 5000 /* doubling up to this */

static void record_retry_fire(void *arg)
{
    struct jtimer *t = arg;
    struct jd_jobs *j = t->j;
    struct job *jb = t->job;
    pthread_mutex_lock(&j->mu);
    jobs_jtimer_unlink(jb, t);
    if (!j->stopping) {
        if (t->final) {
            jobs_record_final(j, jb, t->state, t->res, t->res_err, t->finished_ms, t->tries);
            t->res = t->res_err = NULL;
        } else if (!jb->finished) {
            record_completion_try(j, jb, t->tag, t->token, t->res, t->res_err, t->tries);
        }
    }
    jobs_job_unref(jb);
    pthread_mutex_unlock(&j->mu);
    jobs_jtimer_free(t);
}

/* Under mu: r (a completion or the final state) did not commit (rc); take
 * its payload and record it again after a backoff. Meanwhile the process
 * waits as for a slow handler, or the ended job stays in memory; if
 * Jackdaw stops first, nothing of it was recorded and a restart resumes
 * the job from its history. */
static void retry_record_locked(struct jd_jobs *j, struct job *jb, struct wrec *r, int rc)
{
    bool final = r->after == AFTER_FINAL;
    if (!final && jb->finished)
        return; /* the job ended meanwhile: nobody waits for this completion */
    unsigned tries = r->tries + 1;
    uint64_t ms = RETRY_FIRST_MS;
    for (unsigned i = 1; i < tries && ms < RETRY_MAX_MS; i++)
        ms *= 2;
    if (ms > RETRY_MAX_MS)
        ms = RETRY_MAX_MS;
    if ((tries & (tries - 1)) == 0) /* 1, 2, 4, 8, ...: not a line per attempt */
        jd_logf(JD_LOG_WARN,
                "job %" PRId64 ": recording its %s failed (%s, attempt %u); retrying in %" PRIu64
                " ms",
                jb->id, final ? "end" : "step completion", jd_strerror(rc), tries, ms);
    struct jtimer *t = jd_xcalloc(1, sizeof *t);
    t->j = j;
    t->job = jb;
    jb->refs++;
    t->tries = tries;
    t->final = final;
    if (final) {
        t->state = r->w.state;
        t->finished_ms = r->w.finished_ms;
        t->res = r->output;
        t->res_err = r->error;
        r->output = r->error = NULL;
        r->w.output = r->w.error = NULL;
    } else {
        t->tag = r->w.tag;
        t->token = r->token;
        t->res = r->res;
        t->res_err = r->res_err;
        r->res = r->res_err = NULL;
    }
    t->next = jb->timers;
    jb->timers = t;
    if (jd_sched_timer_after(j->sched, ms * 1000000u, record_retry_fire, t, &t->id) != 0) {
        jb->timers = t->next;
        jobs_job_unref(jb);
        jobs_jtimer_free(t);
    }
}

/* Under mu: record a dispatch of `command` for tag. */
void jobs_record_dispatch(struct jd_jobs *j, struct job *jb, uint32_t tag, const char *command,
                          const char *args, uint32_t attempt, int64_t deadline_ms)
{
    struct wrec *r = jobs_wrec_new(j, jb, JD_W_JOB_CHANGE);
    struct jd_sbuf b = {0};
    jd_sb_puts(&b, "{");
    if (command) {
        jd_sb_puts(&b, "\"command\":");
        jd_sb_string(&b, command);
        jd_sb_puts(&b, ",");
    }
    jd_sb_puts(&b, "\"attempt\":");
    jd_sb_number(&b, attempt);
    jd_sb_puts(&b, ",\"args\":");
    jd_sb_json(&b, args, "{}");
    if (deadline_ms) {
        jd_sb_puts(&b, ",\"deadline_ms\":");
        jd_sb_number(&b, deadline_ms);
    }
    r->data = end_with_run(&b, jb->run);
    r->w.kind = JD_EVK_DISPATCH;
    r->w.tag = tag;
    r->w.data = r->data;
    jobs_record(r);
}

void jobs_change_committed(struct jd_jobs *j, int64_t job_id, int64_t version)
{
    struct fire *fires = NULL;
    pthread_mutex_lock(&j->mu);
    struct job *jb = jobs_job_find(j, job_id);
    if (jb && version > jb->version) {
        jb->version = version;
        jobs_watches_collect(j, job_id, version, jd_job_state_terminal(jb->committed_state),
                             &fires);
    }
    pthread_mutex_unlock(&j->mu);
    jobs_watches_fire(j, fires, 0);
}
