/*
 * Replay at start: every non-terminal job is read back with its events
 * (current run only, by "run"), rebuilt in memory and resumed in id order.
 * Recorded dispatches become struct rec (command, attempt, deadline;
 * a remote call's dispatch is its claim, so it names the task);
 * recorded completions and messages are queued in the job's delivery
 * queue in history order, so the replayed process sees them in the order
 * it saw them before (see struct dlv and jobs_run.c's hook_dispatch).
 *
 * Poison jobs (see jobs.c): before any started job is replayed, its crash
 * count is brought up to date (one more after an unclean end, 0 after a
 * clean one) and committed; a job at max_replays is failed with kind
 * "quarantined" instead of being replayed.
 *
 * Threading: runs inside jd_jobs_create before any other thread calls in;
 * it still takes jd_jobs.mu where the live paths expect it.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct recover_ctx {
    struct jd_jobs *j;
    struct job *list; /* via qnext, reverse order */
};

static struct rec *rec_get(struct job *jb, uint32_t tag)
{
    for (struct rec *r = jb->recs; r; r = r->next)
        if (r->tag == tag)
            return r;
    struct rec *r = jd_xcalloc(1, sizeof *r);
    r->tag = tag;
    r->next = jb->recs;
    jb->recs = r;
    return r;
}

struct job *jobs_job_from_row(struct jd_jobs *j, const struct jd_job *row,
                              const struct jd_job_event *ev, size_t n)
{
    struct job *jb = jobs_job_new(j, jobs_parse_stored(row->definition), row->id, row->created_ms);
    free(jb->queue);
    jb->queue = jd_xstrdup(row->queue ? row->queue : "default");
    jb->priority = row->priority;
    jb->run_at_ms = row->run_at_ms;
    jb->state = jb->committed_state = row->state;
    jb->version = row->version;
    jb->inserted = true;
    jb->run = row->attempts ? row->attempts : 1;
    jb->started_ms = row->started_ms;
    jb->crashes = row->crashes;
    for (size_t i = 0; i < n; i++) {
        cJSON *d = ev[i].data ? cJSON_Parse(ev[i].data) : NULL;
        const cJSON *run = cJSON_GetObjectItemCaseSensitive(d, "run");
        if (!cJSON_IsNumber(run) || (uint32_t)run->valuedouble != jb->run) {
            cJSON_Delete(d);
            continue; /* an earlier attempt's history */
        }
        switch (ev[i].kind) {
        case JD_EVK_DISPATCH: {
            struct rec *r = rec_get(jb, ev[i].tag);
            const cJSON *cmd = cJSON_GetObjectItemCaseSensitive(d, "command");
            const cJSON *att = cJSON_GetObjectItemCaseSensitive(d, "attempt");
            const cJSON *dl = cJSON_GetObjectItemCaseSensitive(d, "deadline_ms");
            if (cJSON_IsString(cmd) && !r->command)
                r->command = jd_xstrdup(cmd->valuestring);
            bool claimed = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(d, "task"));
            if (cJSON_IsNumber(att) && (uint32_t)att->valuedouble > r->attempt) {
                r->attempt = (uint32_t)att->valuedouble;
                r->claimed = claimed;
            } else if (cJSON_IsNumber(att) && (uint32_t)att->valuedouble == r->attempt) {
                r->claimed |= claimed;
            }
            if (cJSON_IsNumber(dl))
                r->deadline_ms = (int64_t)dl->valuedouble;
            break;
        }
        case JD_EVK_COMPLETE: {
            /* Queued at its place among the messages; delivered once the
             * replayed process yields the tag again (jobs_hook_dispatch). A
             * token completes once, so a second record for a tag cannot
             * have reached the process: the first one counts. */
            struct rec *r = rec_get(jb, ev[i].tag);
            if (r->completed)
                break;
            const cJSON *res = cJSON_GetObjectItemCaseSensitive(d, "result");
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(d, "error");
            r->completed = true;
            struct dlv *c = jd_xcalloc(1, sizeof *c);
            c->tag = ev[i].tag;
            if (e)
                c->error = cJSON_PrintUnformatted(e);
            else
                c->data = res ? cJSON_PrintUnformatted(res) : jd_xstrdup("null");
            jobs_dlv_append(jb, c);
            break;
        }
        case JD_EVK_MESSAGE: {
            jb->messages++;
            jb->message_bytes += ev[i].data ? strlen(ev[i].data) : 0;
            cJSON_DeleteItemFromObjectCaseSensitive(d, "run");
            struct dlv *m = jd_xcalloc(1, sizeof *m);
            m->message = true;
            m->data = cJSON_PrintUnformatted(d);
            jobs_dlv_append(jb, m);
            break;
        }
        case JD_EVK_CANCEL:
            jb->cancel_requested = true;
            break;
        case JD_EVK_STATE:
        case JD_EVK_PROGRESS: /* a worker's report: nothing to replay */
            break;
        }
        cJSON_Delete(d);
    }
    return jb;
}

static int recover_one(void *arg, const struct jd_job *row, const struct jd_job_event *ev, size_t n)
{
    struct recover_ctx *rc = arg;
    struct job *jb = jobs_job_from_row(rc->j, row, ev, n);
    jb->qnext = rc->list;
    rc->list = jb;
    return 0;
}

void jobs_cancel_recovered_locked(struct jd_jobs *j, struct job *jb)
{
    jb->finished = true;
    struct wrec *r = jobs_state_rec(j, jb, JD_JOB_CANCELLED, AFTER_FINAL);
    r->error = jobs_err_json("cancelled", "the job was cancelled before it ran");
    r->w.set |= JD_SET_ERROR | JD_SET_FINISHED;
    r->w.error = r->error;
    r->w.finished_ms = jd_wall_ms();
    jobs_record(r);
}

/* Under mu: fail a started job that the process died running `crashes` times
 * in a row, instead of replaying it once more. */
static void quarantine_locked(struct jd_jobs *j, struct job *jb, uint32_t crashes)
{
    char m[240];
    snprintf(m, sizeof m,
             "the server stopped %u times in a row while this job was running; it is not run "
             "again (--max-replays %u)",
             crashes, j->max_replays);
    jd_logf(JD_LOG_WARN, "job %" PRId64 " quarantined: %s", jb->id, m);
    j->st.quarantined++;
    jb->finished = true;
    jobs_record_crashes(j, jb, 0); /* a manual retry starts a new run of crashes */
    struct wrec *r = jobs_state_rec(j, jb, JD_JOB_FAILED, AFTER_FINAL);
    r->error = jobs_err_json("quarantined", m);
    r->w.set |= JD_SET_ERROR | JD_SET_FINISHED;
    r->w.error = r->error;
    r->w.finished_ms = jd_wall_ms();
    jobs_record(r);
}

/* Under mu: whether a started job is replayed (true) or quarantined. Its
 * crash count is recorded; the caller commits it before any replay runs. */
static bool count_crash_locked(struct jd_jobs *j, struct job *jb, bool unclean, bool *wrote)
{
    uint32_t n = unclean ? jb->crashes + 1 : 0;
    if (j->max_replays && n >= j->max_replays) {
        quarantine_locked(j, jb, n);
        return false;
    }
    if (n != jb->crashes) {
        jobs_record_crashes(j, jb, n);
        *wrote = true;
    }
    return true;
}

/* Read every non-terminal job back with its history and resume it: a queued
 * one enters its queue (or ends, if its cancel was recorded), a started one
 * is spawned again and replays (or is quarantined). Jobs are resumed in id
 * order. With the queued-job window, only the started ones are read here;
 * the queued ones come in by pages (jobs_window_recover). */
int jobs_recover(struct jd_jobs *j, struct jd_error *err)
{
    int rc;
    struct recover_ctx rctx = {.j = j};
    /* With the window, the queued jobs come in by pages afterwards. */
    rc = j->window ? jd_store_recover_started(j->store, recover_one, &rctx)
                   : jd_store_recover(j->store, recover_one, &rctx);
    if (rc) {
        jd_error_set(err, rc, NULL, "reading jobs to resume failed: %s", jd_strerror(rc));
        while (rctx.list) {
            struct job *n = rctx.list->qnext;
            jobs_job_free(rctx.list);
            rctx.list = n;
        }
        return rc;
    }
    /* Resume in id order (the list is reversed). */
    struct job *rev = NULL;
    while (rctx.list) {
        struct job *n = rctx.list->qnext;
        rctx.list->qnext = rev;
        rev = rctx.list;
        rctx.list = n;
    }
    bool unclean = jd_store_unclean(j->store), wrote = false;
    size_t nstart = 0, cap = 0;
    struct job **starts = NULL;
    while (rev) {
        struct job *jb = rev;
        rev = jb->qnext;
        jb->qnext = NULL;
        pthread_mutex_lock(&j->mu);
        jobs_job_insert(j, jb);
        if (jb->state == JD_JOB_QUEUED) {
            if (jb->cancel_requested) {
                jobs_cancel_recovered_locked(j, jb);
            } else {
                jobs_enqueue_locked(j, jb);
            }
        } else if (count_crash_locked(j, jb, unclean, &wrote)) {
            jb->admitted = true;
            jobs_slot_take_locked(j, jb);
            if (nstart == cap) {
                cap = cap ? cap * 2 : 64;
                starts = jd_xrealloc(starts, cap * sizeof *starts);
            }
            starts[nstart++] = jb;
        }
        pthread_mutex_unlock(&j->mu);
    }
    /* The counts are durable before a replay can take the process down. */
    if (wrote && (rc = jd_store_sync(j->store)) != 0)
        jd_logf(JD_LOG_WARN, "recording crash counts failed: %s", jd_strerror(rc));
    for (size_t i = 0; i < nstart; i++)
        jobs_start_job(j, starts[i], true);
    free(starts);
    if (nstart)
        jd_logf(JD_LOG_INFO, "resumed %zu running jobs", nstart);
    return j->window ? jobs_window_recover(j, err) : 0;
}

bool jobs_resume_claimed_locked(struct jd_jobs *j, struct job *jb)
{
    jobs_job_insert(j, jb);
    if (jb->state == JD_JOB_QUEUED) {
        if (jb->cancel_requested)
            jobs_cancel_recovered_locked(j, jb);
        else
            jobs_window_place_locked(j, jb);
        return false;
    }
    /* The claim raised its crash count already (its owner died running it). */
    if (j->max_replays && jb->crashes >= j->max_replays) {
        uint32_t n = jb->crashes;
        quarantine_locked(j, jb, n);
        return false;
    }
    jb->admitted = true;
    jobs_slot_take_locked(j, jb);
    return true;
}
