/*
 * Running a job: spawning its process on the scheduler, the scheduler hooks
 * (a yield dispatched, a step status change, the process finished), yields
 * served by timers ($sleep, $timer) or registry calls, and cancelling what
 * a finished job still has in flight.
 *
 * Invariants: a yield whose tag is recorded as completed is answered from
 * the record, never run again; one recorded as dispatched is dispatched
 * again with attempt + 1 and idempotency key "<job_id>:<tag>"; a differing
 * command for a recorded tag fails the job with kind "nondeterminism". A
 * struct call has two references (dispatch path, done path).
 *
 * Threading: hooks run on scheduler workers, timer_yield_fire on the timer
 * thread, call_done / call_on_attempt on whichever thread the registry
 * completes a call. Registry calls and jd_sched_kill are made without
 * jd_jobs.mu (they may call back into this layer on the same thread);
 * everything else takes mu around the job's state.
 */
#include "server/jobs_impl.h"
#include "server/workflow.h"

#include "common/alloc.h"
#include "common/clock.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void call_pump(struct call *c);

static void call_unref_locked(struct call *c, struct jd_call_handle **release)
{
    *release = NULL;
    if (--c->refs > 0)
        return;
    *release = c->handle;
    jobs_job_unref(c->job);
    free(c->command);
    free(c->args);
    free(c);
}

/* Under mu: take a waiting call out of its command's FIFO. */
static void limit_unlink_locked(struct call *c)
{
    struct cmd_limit *l = c->lim;
    struct call *prev = NULL;
    for (struct call *w = l->head; w; prev = w, w = w->wnext) {
        if (w != c)
            continue;
        if (prev)
            prev->wnext = c->wnext;
        else
            l->head = c->wnext;
        if (l->tail == c)
            l->tail = prev;
        break;
    }
    c->wnext = NULL;
    c->waiting = false;
    l->waiting--;
}

/* Under mu: the first half of jobs_cancel_inflight (drop the calls that
 * wait, cancel the timers); the calls already given to the registry are
 * returned in *v (*n of them, referenced) for cancel_calls, without mu. */
static void cancel_inflight_locked(struct jd_jobs *j, struct job *jb, struct call ***vp, size_t *np)
{
    size_t n = 0, cap = 0;
    struct call **v = NULL;
    for (struct call **pp = &jb->calls; *pp;) {
        struct call *c = *pp;
        if (!c->waiting) {
            pp = &c->next;
            continue;
        }
        /* Never given to the registry: drop it and both its references. */
        *pp = c->next;
        limit_unlink_locked(c);
        struct jd_call_handle *h;
        c->refs--; /* the dispatch path's: it ended when the call started waiting */
        call_unref_locked(c, &h);
    }
    for (struct call *c = jb->calls; c; c = c->next) {
        if (!c->handle)
            continue; /* still inside jd_registry_call: that path cancels it */
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            v = jd_xrealloc(v, cap * sizeof *v);
        }
        c->refs++;
        v[n++] = c;
    }
    for (struct jtimer **pp = &jb->timers; *pp;) {
        struct jtimer *t = *pp;
        if (t->id && jd_sched_timer_cancel(j->sched, t->id) == 0) {
            *pp = t->next;
            jobs_job_unref(t->job);
            jobs_jtimer_free(t);
        } else {
            pp = &t->next;
        }
    }
    if (jb->timeout_timer && jd_sched_timer_cancel(j->sched, jb->timeout_timer) == 0)
        jobs_job_unref(jb); /* the timer's reference */
    jb->timeout_timer = 0;
    if (jb->grace_timer && jd_sched_timer_cancel(j->sched, jb->grace_timer) == 0)
        jobs_job_unref(jb);
    jb->grace_timer = 0;
    *vp = v;
    *np = n;
}

/* Without mu: cancel the calls cancel_inflight_locked returned. */
static void cancel_calls(struct jd_jobs *j, struct call **v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        jd_registry_call_cancel(j->reg, v[i]->handle);
        struct jd_call_handle *h;
        pthread_mutex_lock(&j->mu);
        call_unref_locked(v[i], &h);
        pthread_mutex_unlock(&j->mu);
        if (h)
            jd_registry_call_release(h);
    }
    free(v);
}

/* Without mu: cancel the job's calls (their done fires; nothing is recorded
 * because the job is finished) and its timers. */
void jobs_cancel_inflight(struct jd_jobs *j, struct job *jb)
{
    struct call **v = NULL;
    size_t n = 0;
    pthread_mutex_lock(&j->mu);
    cancel_inflight_locked(j, jb, &v, &n);
    pthread_mutex_unlock(&j->mu);
    cancel_calls(j, v, n);
}

/* Without mu. Spawn the job's process; record "running" unless resuming. */
void jobs_start_job(struct jd_jobs *j, struct job *jb, bool resume)
{
    const struct jd_process_ops *ops = NULL;
    void *self = NULL;
    const char *method = "run";
    char *input = NULL;
    char *fail = NULL;
    const struct jd_jobdef *d = jb->def;

    pthread_mutex_lock(&j->mu);
    if (jb->finished || j->draining) {
        if (!jb->finished && j->draining) {
            jobs_slot_give_locked(j, jb);
            jb->admitted = false;
        }
        pthread_mutex_unlock(&j->mu);
        return;
    }
    if (!resume) {
        jobs_crashes_reset(j, jb);
        jb->started_ms = jd_wall_ms();
        struct wrec *r = jobs_state_rec(j, jb, JD_JOB_RUNNING, AFTER_NONE);
        r->w.set |= JD_SET_ATTEMPTS | JD_SET_STARTED;
        r->w.attempts = jb->run;
        r->w.started_ms = jb->started_ms;
        jobs_record(r);
    }
    pthread_mutex_unlock(&j->mu);

    if (!d) {
        fail = jobs_err_json("invalid_definition", "the stored definition no longer parses");
    } else if (d->shape == JD_JOBDEF_TASK) {
        ops = &jd_task_ops;
        self = jd_workflow_new_def(jb->id, d); /* d lives as long as jb's `user` ref */
    } else if (d->shape == JD_JOBDEF_WORKFLOW) {
        ops = &jd_workflow_ops;
        self = jd_workflow_new_def(jb->id, d);
    } else {
        const struct jd_process_type *pt = jd_registry_process_type(j->reg, d->process);
        if (!pt) {
            char m[200];
            snprintf(m, sizeof m, "process type \"%s\" is not loaded", d->process);
            fail = jobs_err_json("unknown_process", m);
        } else {
            ops = &jd_plugin_process_ops;
            self = jd_plugin_process_new(pt);
            method = d->method;
            input = d->input_text ? jd_xstrdup(d->input_text)
                    : d->input    ? jd_json_print(d->input)
                                  : NULL;
        }
    }

    jd_pid pid = 0;
    int rc = 0;
    if (!fail) {
        pthread_mutex_lock(&j->mu);
        jb->refs++; /* the process's `user` reference, dropped in finished */
        pthread_mutex_unlock(&j->mu);
        rc = jd_sched_spawn(j->sched, ops, self, jb, method, input, &pid);
        if (rc) {
            pthread_mutex_lock(&j->mu);
            jb->refs--;
            pthread_mutex_unlock(&j->mu);
            fail = jobs_err_json("spawn_failed", jd_strerror(rc));
        }
    }
    free(input);

    pthread_mutex_lock(&j->mu);
    if (fail) {
        if (rc == JD_ESHUTDOWN) {
            /* Draining: the job stays running in storage and resumes later. */
            jobs_slot_give_locked(j, jb);
            free(fail);
            pthread_mutex_unlock(&j->mu);
            return;
        }
        jb->finished = true;
        jobs_slot_give_locked(j, jb);
        struct wrec *r = jobs_state_rec(j, jb, JD_JOB_FAILED, AFTER_FINAL);
        r->error = fail;
        r->w.set |= JD_SET_ERROR | JD_SET_FINISHED;
        r->w.error = r->error;
        r->w.finished_ms = jd_wall_ms();
        jobs_record(r);
        pthread_mutex_unlock(&j->mu);
        return;
    }
    jb->pid = pid;
    jb->spawned = true;
    /* Events recorded before the process existed (messages, and on replay
     * the recorded history), in order, as far as they can go now. */
    jobs_dlv_pump_locked(j, jb);
    int64_t tmo = jobs_job_timeout_ms(jb);
    if (tmo > 0 && !jb->finished)
        jb->timeout_timer = jobs_arm_job_timer(j, jb, jb->started_ms + tmo - jd_wall_ms(), 1);
    if (jb->cancel_requested && !jb->cancel_sent && !jb->finished) {
        jb->cancel_sent = true;
        jd_sched_cancel(j->sched, pid);
        jb->grace_timer = jobs_arm_job_timer(j, jb, j->cancel_grace_ms, 2);
    }
    pthread_mutex_unlock(&j->mu);
}

static struct rec *rec_take(struct job *jb, uint32_t tag)
{
    for (struct rec **pp = &jb->recs; *pp; pp = &(*pp)->next)
        if ((*pp)->tag == tag) {
            struct rec *r = *pp;
            *pp = r->next;
            r->next = NULL;
            return r;
        }
    return NULL;
}

void jobs_hook_stepped(void *ctx, jd_pid pid, void *user, enum jd_step_status status)
{
    struct jd_jobs *j = ctx;
    struct job *jb = user;
    (void)pid;
    struct job *start = NULL;
    pthread_mutex_lock(&j->mu);
    if (!jb->finished && !j->stopping) {
        if (status == JD_STEP_IDLE && jb->state == JD_JOB_RUNNING)
            jobs_record_state(j, jb, JD_JOB_WAITING);
        /* Idle: the replay got through the whole history without taking
         * the process down; only a job being run counts as a suspect. */
        if (status == JD_STEP_IDLE)
            jobs_crashes_reset(j, jb);
        else if (status != JD_STEP_IDLE && jb->state == JD_JOB_WAITING)
            jobs_record_state(j, jb, JD_JOB_RUNNING);
        /* A job waiting for a message does not hold one of max_running's
         * slots: thousands of jobs waiting for approval must not stop the
         * queue. It takes a slot again when it runs. */
        if (status == JD_STEP_IDLE && jb->admitted && !jb->slot_free) {
            jb->slot_free = true;
            jobs_slot_give_locked(j, jb);
            jobs_admit_locked(j, &start);
        } else if (status != JD_STEP_IDLE && jb->slot_free) {
            jb->slot_free = false;
            jobs_slot_take_locked(j, jb);
        }
    }
    pthread_mutex_unlock(&j->mu);
    jobs_start_list(j, start);
}

void jobs_hook_finished(void *ctx, jd_pid pid, void *user, enum jd_step_status status,
                        const char *result, const char *error)
{
    struct jd_jobs *j = ctx;
    struct job *jb = user;
    (void)pid;
    pthread_mutex_lock(&j->mu);
    bool record_it = !jb->finished && !j->stopping && !jb->end_folded;
    jb->finished = true;
    /* Calls still out (cancelled below, after the end is recorded): no
     * claim takes their tasks, whose dispatch would follow the end. */
    if (jb->calls)
        jobs_tasks_job_over(j, jb->id);
    if (jb->eprevp) { /* off jd_jobs.ending: its end committed before this */
        *jb->eprevp = jb->enext;
        if (jb->enext)
            jb->enext->eprevp = jb->eprevp;
        jb->enext = NULL;
        jb->eprevp = NULL;
    }
    if (jb->admitted) {
        if (!jb->slot_free)
            jobs_slot_give_locked(j, jb);
        jb->admitted = false;
        jb->slot_free = false;
    }
    if (record_it) {
        enum jd_job_state s = jb->cancel_requested     ? JD_JOB_CANCELLED
                              : status == JD_STEP_DONE ? JD_JOB_SUCCEEDED
                                                       : JD_JOB_FAILED;
        char *output = NULL, *err = NULL;
        if (s == JD_JOB_SUCCEEDED)
            output = jd_xstrdup(result ? result : "null");
        else if (s == JD_JOB_CANCELLED && !(error && strstr(error, "\"cancelled\"")))
            err = jobs_err_json("cancelled", "the job was cancelled");
        else
            err = jd_xstrdup(error ? error : "{\"kind\":\"failed\",\"message\":\"failed\"}");
        jobs_record_final(j, jb, s, output, err, jd_wall_ms(), 0);
    }
    struct call **v = NULL;
    size_t n = 0;
    cancel_inflight_locked(j, jb, &v, &n);
    if (n > 0) { /* calls to cancel in the registry: without mu, before admitting */
        pthread_mutex_unlock(&j->mu);
        cancel_calls(j, v, n);
        pthread_mutex_lock(&j->mu);
    } else {
        free(v);
    }
    struct job *start = NULL;
    jobs_admit_locked(j, &start);
    jobs_job_unref(jb); /* the process's reference */
    pthread_mutex_unlock(&j->mu);
    jobs_start_list(j, start);
}

static void timer_yield_fire(void *arg)
{
    struct jtimer *t = arg;
    struct jd_jobs *j = t->j;
    struct job *jb = t->job;
    pthread_mutex_lock(&j->mu);
    jobs_jtimer_unlink(jb, t);
    if (!jb->finished && !j->stopping)
        jobs_record_completion(j, jb, t->tag, t->token, "null", NULL);
    jobs_job_unref(jb);
    pthread_mutex_unlock(&j->mu);
    free(t);
}

static void call_on_attempt(void *arg, uint32_t attempt)
{
    struct call *c = arg;
    struct jd_jobs *j = c->j;
    pthread_mutex_lock(&j->mu);
    /* A remote call's attempt waits as a task: its claim records the
     * dispatch (with the task's row, one record), and an attempt no worker
     * claimed has no dispatch, so after a restart it waits again as the
     * same attempt. */
    if (!c->job->finished && !j->stopping && !c->remote)
        jobs_record_dispatch(j, c->job, c->tag, c->command, c->args, attempt, 0);
    pthread_mutex_unlock(&j->mu);
}

static void call_done(void *arg, const struct jd_call_result *res)
{
    struct call *c = arg;
    struct jd_jobs *j = c->j;
    struct job *jb = c->job;
    pthread_mutex_lock(&j->mu);
    for (struct call **pp = &jb->calls; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    j->inflight_calls--;
    pthread_cond_broadcast(&j->cv);
    struct call *next = NULL;
    if (c->counted) {
        /* Its place goes to the call that waited longest. */
        struct cmd_limit *l = c->lim;
        c->counted = false;
        l->active--;
        if (l->head && !j->draining) {
            next = l->head;
            l->head = next->wnext;
            if (!l->head)
                l->tail = NULL;
            next->wnext = NULL;
            next->waiting = false;
            l->waiting--;
            next->counted = true;
            l->active++;
            j->inflight_calls++;
        }
    }
    if (!jb->finished && !j->stopping)
        jobs_record_completion(
            j, jb, c->tag, c->token, res->ok ? res->result_json : NULL,
            res->ok ? NULL : (res->error_json ? res->error_json : "{\"kind\":\"failed\"}"));
    struct jd_call_handle *h;
    call_unref_locked(c, &h);
    pthread_mutex_unlock(&j->mu);
    if (h)
        jd_registry_call_release(h);
    if (next)
        call_pump(next);
}

static bool is_timer_cmd(const char *cmd)
{
    return strcmp(cmd, JD_CMD_SLEEP) == 0 || strcmp(cmd, JD_CMD_TIMER) == 0;
}

static struct cmd_limit *limit_find(struct jd_jobs *j, const char *cmd)
{
    for (struct cmd_limit *l = j->cmd_limits; l; l = l->next)
        if (strcmp(l->name, cmd) == 0)
            return l;
    return NULL;
}

/* Without mu: give a call (both references held, its place taken) to the
 * registry. */
static void call_send(struct call *c)
{
    struct jd_jobs *j = c->j;
    struct job *jb = c->job;
    char key[48];
    snprintf(key, sizeof key, "%" PRId64 ":%u", jb->id, c->tag);
    int64_t timeout_ms = c->timeout_ms;
    /* Set before the registry can call call_on_attempt. The lookup is
     * lock-free for plugins; only a remote name asks the tasks layer. */
    c->remote = jobs_tasks_is_remote_cmd(jd_registry_command(j->reg, c->command));
    /* A remote command's own default (plugins carry theirs). */
    if (timeout_ms == 0 && c->remote)
        timeout_ms = jobs_tasks_timeout_ms(j, c->command);
    struct jd_call_request req = {
        .command = c->command,
        .args_json = c->args,
        .idempotency_key = key,
        .first_attempt = c->first,
        .timeout_ms = timeout_ms,
        .retry = c->pol,
        .on_attempt = call_on_attempt,
        .done = call_done,
        .arg = c,
    };
    struct jd_call_handle *h = NULL;
    jobs_cluster_lease_wait(j); /* no handler call starts on a lease about to end */
    int r = jd_registry_call(j->reg, &req, &h);
    pthread_mutex_lock(&j->mu);
    if (r != 0) {
        /* done will not fire: fail the yield through the normal path. */
        char m[120];
        snprintf(m, sizeof m, "dispatch failed: %s", jd_strerror(r));
        char *e = jobs_err_json("dispatch_failed", m);
        struct jd_call_result res = {.ok = false, .error_json = e};
        pthread_mutex_unlock(&j->mu);
        call_done(c, &res);
        free(e);
        pthread_mutex_lock(&j->mu);
        struct jd_call_handle *dummy;
        call_unref_locked(c, &dummy);
        pthread_mutex_unlock(&j->mu);
        return;
    }
    c->handle = h;
    bool cancel_now = jb->finished && c->refs > 1;
    struct jd_call_handle *rel = NULL;
    if (!cancel_now)
        call_unref_locked(c, &rel);
    pthread_mutex_unlock(&j->mu);
    if (cancel_now) {
        jd_registry_call_cancel(j->reg, h);
        pthread_mutex_lock(&j->mu);
        call_unref_locked(c, &rel);
        pthread_mutex_unlock(&j->mu);
    }
    if (rel)
        jd_registry_call_release(rel);
}

/* Calls handed a place by call_done, sent in order by the outermost pump
 * on this thread: a command that completes inline would otherwise recurse
 * once per waiting call. */
static _Thread_local struct call *tl_pump_head, *tl_pump_tail;
static _Thread_local bool tl_pumping;

static void call_pump(struct call *c)
{
    c->wnext = NULL;
    if (tl_pump_tail)
        tl_pump_tail->wnext = c;
    else
        tl_pump_head = c;
    tl_pump_tail = c;
    if (tl_pumping)
        return;
    tl_pumping = true;
    while ((c = tl_pump_head) != NULL) {
        tl_pump_head = c->wnext;
        if (!tl_pump_head)
            tl_pump_tail = NULL;
        c->wnext = NULL;
        call_send(c);
    }
    tl_pumping = false;
}

void jobs_command_limit_set(struct jd_jobs *j, const char *name, unsigned limit)
{
    struct call **go = NULL;
    size_t ngo = 0;
    pthread_mutex_lock(&j->mu);
    struct cmd_limit *l = limit_find(j, name);
    if ((l && l->from_flag) || (!l && limit == 0)) {
        pthread_mutex_unlock(&j->mu);
        return;
    }
    if (!l) { /* kept until destroy: waiting calls point at it */
        l = jd_xcalloc(1, sizeof *l);
        l->name = jd_xstrdup(name);
        l->next = j->cmd_limits;
        j->cmd_limits = l;
    }
    l->limit = limit ? limit : UINT_MAX;
    if (l->waiting && l->active < l->limit && !j->draining)
        go = jd_xcalloc(l->waiting, sizeof *go);
    while (go && l->head && l->active < l->limit) {
        struct call *c = l->head; /* as call_done hands a place over */
        l->head = c->wnext;
        if (!l->head)
            l->tail = NULL;
        c->wnext = NULL;
        c->waiting = false;
        l->waiting--;
        c->counted = true;
        l->active++;
        j->inflight_calls++;
        go[ngo++] = c;
    }
    pthread_mutex_unlock(&j->mu);
    for (size_t i = 0; i < ngo; i++)
        call_pump(go[i]);
    free(go);
}

void jobs_hook_dispatch(void *ctx, jd_pid pid, void *user, const struct jd_yield *y,
                        struct jd_token token)
{
    struct jd_jobs *j = ctx;
    struct job *jb = user;
    const char *cmd = y->command ? y->command : "";
    pthread_mutex_lock(&j->mu);
    if (jb->finished || j->stopping) {
        pthread_mutex_unlock(&j->mu);
        return;
    }
    struct rec *rc = rec_take(jb, y->tag);
    if (rc && rc->command && strcmp(rc->command, cmd) != 0) {
        char m[300];
        snprintf(m, sizeof m,
                 "replay yielded \"%.100s\" for tag %u but the history records \"%.100s\"", cmd,
                 y->tag, rc->command);
        pthread_mutex_unlock(&j->mu);
        jobs_recs_free(rc);
        char *e = jobs_err_json("nondeterminism", m);
        jd_sched_kill(j->sched, pid, e);
        free(e);
        return;
    }
    if (rc && rc->completed) {
        /* Recorded: deliver the recorded result, never run it again. It
         * waits in the delivery queue at its place in the history; now that
         * the yield has a token it can go once everything before it went. */
        struct dlv *d = jb->dlv;
        while (d && (d->message || d->ready || d->tag != y->tag))
            d = d->next;
        if (d) {
            d->token = token;
            d->ready = true;
            jobs_dlv_pump_locked(j, jb);
        } else {
            /* Not reached: recovery queues one entry per completed rec, and
             * rec_take hands that rec out once. Fail the step, never guess. */
            jd_sched_complete(j->sched, token, NULL,
                              jobs_err_json("internal", "the recorded completion went missing"));
        }
        pthread_mutex_unlock(&j->mu);
        jobs_recs_free(rc);
        return;
    }
    if (is_timer_cmd(cmd)) {
        int64_t deadline = rc ? rc->deadline_ms : 0;
        int64_t now = jd_wall_ms();
        if (!deadline) {
            cJSON *a = y->args ? cJSON_Parse(y->args) : NULL;
            const cJSON *ms = cJSON_GetObjectItemCaseSensitive(a, "ms");
            deadline =
                now + (cJSON_IsNumber(ms) && ms->valuedouble > 0 ? (int64_t)ms->valuedouble : 0);
            cJSON_Delete(a);
            jobs_record_dispatch(j, jb, y->tag, cmd, y->args, 1, deadline ? deadline : now);
        }
        struct jtimer *t = jd_xcalloc(1, sizeof *t);
        t->j = j;
        t->job = jb;
        jb->refs++;
        t->tag = y->tag;
        t->token = token;
        t->next = jb->timers;
        jb->timers = t;
        int64_t delay = deadline - now;
        if (delay < 0)
            delay = 0;
        if (jd_sched_timer_after(j->sched, (uint64_t)delay * 1000000u, timer_yield_fire, t,
                                 &t->id) != 0) {
            jb->timers = t->next;
            jobs_job_unref(jb);
            free(t);
        }
        pthread_mutex_unlock(&j->mu);
        jobs_recs_free(rc);
        return;
    }
    struct call *c = jd_xcalloc(1, sizeof *c);
    c->j = j;
    c->job = jb;
    jb->refs++;
    c->tag = y->tag;
    c->token = token;
    c->refs = 2;
    c->command = jd_xstrdup(cmd);
    c->args = jobs_trace_args(cmd, y->args ? y->args : "{}", jb->def ? jb->def->traceparent : NULL,
                              j->exec_env_allow);
    c->next = jb->calls;
    jb->calls = c;
    uint32_t first = rc ? rc->attempt + 1 : 1;
    /* A remote call's dispatch is recorded by its claim, so a recorded
     * attempt ran and the next one is attempt + 1, and one that waited
     * unclaimed has no record and waits again as the same attempt. A
     * history written before claims carried the dispatch has a dispatch
     * per waiting attempt too: its task row tells whether it was claimed. */
    bool remote_wait = false;
    if (rc && rc->attempt > 0 && !rc->claimed &&
        jobs_tasks_is_remote_cmd(jd_registry_command(j->reg, cmd)) &&
        jd_store_task_claimed(j->store, jb->id, y->tag, rc->attempt, &remote_wait) == 0 &&
        !remote_wait)
        first = rc->attempt;
    struct jd_retry_policy pol;
    if (jb->def && jb->def->shape != JD_JOBDEF_PROCESS)
        pol = jd_jobdef_retry_for_tag(jb->def, y->tag);
    else if (jb->def && jb->def->has_retry)
        pol = jb->def->retry;
    else
        pol = (struct jd_retry_policy){.max_attempts = 1, .factor = 1.0};
    c->first = first;
    c->pol = pol;
    c->timeout_ms = y->timeout_ms;
    c->lim = limit_find(j, cmd);
    if (c->lim && c->lim->active >= c->lim->limit) {
        /* At its command's cap: wait in order; a finishing call of the
         * command hands its place over (call_done). No worker waits. */
        c->waiting = true;
        if (c->lim->tail)
            c->lim->tail->wnext = c;
        else
            c->lim->head = c;
        c->lim->tail = c;
        c->lim->waiting++;
        pthread_mutex_unlock(&j->mu);
        jobs_recs_free(rc);
        return;
    }
    if (c->lim) {
        c->lim->active++;
        c->counted = true;
    }
    j->inflight_calls++;
    pthread_mutex_unlock(&j->mu);
    jobs_recs_free(rc);
    call_send(c);
}
