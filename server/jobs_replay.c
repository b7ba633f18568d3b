/*
 * Replay at start: every non-terminal job is read back with its events
 * (current run only, by "run"), rebuilt in memory and resumed in id order.
 * Recorded dispatches become struct rec (command, attempt, deadline);
 * recorded completions and messages are queued in the job's delivery
 * queue in history order, so the replayed process sees them in the order
 * it saw them before (see struct dlv and jobs_run.c's hook_dispatch).
 *
 * Threading: runs inside jd_jobs_create before any other thread calls in;
 * it still takes jd_jobs.mu where the live paths expect it.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

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

static int recover_one(void *arg, const struct jd_job *row, const struct jd_job_event *ev, size_t n)
{
    struct recover_ctx *rc = arg;
    struct job *jb =
        jobs_job_new(rc->j, jobs_parse_stored(row->definition), row->id, row->created_ms);
    free(jb->queue);
    jb->queue = jd_xstrdup(row->queue ? row->queue : "default");
    jb->priority = row->priority;
    jb->run_at_ms = row->run_at_ms;
    jb->state = jb->committed_state = row->state;
    jb->version = row->version;
    jb->inserted = true;
    jb->run = row->attempts ? row->attempts : 1;
    jb->started_ms = row->started_ms;
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
            if (cJSON_IsNumber(att) && (uint32_t)att->valuedouble > r->attempt)
                r->attempt = (uint32_t)att->valuedouble;
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
    jb->qnext = rc->list;
    rc->list = jb;
    return 0;
}

/* Read every non-terminal job back with its history and resume it: a queued
 * one enters its queue (or ends, if its cancel was recorded), a started one
 * is spawned again and replays. Jobs are resumed in id order. */
int jobs_recover(struct jd_jobs *j, struct jd_error *err)
{
    int rc;
    struct recover_ctx rctx = {.j = j};
    if ((rc = jd_store_recover(j->store, recover_one, &rctx))) {
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
    unsigned resumed = 0;
    while (rev) {
        struct job *jb = rev;
        rev = jb->qnext;
        jb->qnext = NULL;
        pthread_mutex_lock(&j->mu);
        jobs_job_insert(j, jb);
        bool start = false;
        if (jb->state == JD_JOB_QUEUED) {
            if (jb->cancel_requested) {
                jb->finished = true;
                struct wrec *r = jobs_state_rec(j, jb, JD_JOB_CANCELLED, AFTER_FINAL);
                r->error = jobs_err_json("cancelled", "the job was cancelled before it ran");
                r->w.set |= JD_SET_ERROR | JD_SET_FINISHED;
                r->w.error = r->error;
                r->w.finished_ms = jd_wall_ms();
                jobs_record(r);
            } else {
                jobs_enqueue_locked(j, jb);
            }
        } else {
            jb->admitted = true;
            j->running++;
            start = true;
        }
        pthread_mutex_unlock(&j->mu);
        if (start) {
            jobs_start_job(j, jb, true);
            resumed++;
        }
    }
    if (resumed)
        jd_logf(JD_LOG_INFO, "resumed %u running jobs", resumed);
    return 0;
}
