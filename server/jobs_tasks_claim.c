/*
 * Remote tasks, part 2 of 5 (see jobs_tasks.c): claims. A claim takes the
 * oldest waiting tasks of its commands and, in the same hold of tmu,
 * submits each as its call's `dispatch` event (claim_rec; one commit as a
 * rule), then answers once those commits are done, each task under the id
 * that names its event's seq (tasks_rename_locked), leaving out any whose
 * job was cancelled or ended meanwhile (`over`); with wait_ms and nothing
 * waiting it parks (struct claimer) until a task arrives
 * (tasks_serve_claimers_locked, from remote_handle), its deadline timer
 * fires (claim_deadline), or the layer drains (jobs_tasks_drain).
 *
 * Threads: jd_jobs_task_claim on an HTTP thread; claim_deadline on the
 * scheduler's timer thread; tasks_claim_committed on the store's completion
 * thread; tasks_serve_claimers_locked on the thread that dispatches a call,
 * under tmu; jobs_tasks_drain on the thread that drains the layer. A
 * claim's done callback is called without tmu, except in the one case its
 * comment names (the store closing).
 */
#include "server/jobs_impl.h"
#include "server/jobs_tasks_impl.h"
#include "server/tasks.h"

#include "common/alloc.h"
#include "common/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One claim: the tasks taken for it, a record each (in one commit as a
 * rule); rcs[i] is task i's record's outcome, seqs[i] its dispatch event's
 * seq. It is answered once every record is done and done is set (armed),
 * whichever comes last. */
struct claim_op {
    struct task **tasks;
    int *rcs;
    int64_t *seqs;
    size_t n;
    jd_action_done_fn done;
    void *arg;
    int remaining;
    bool armed;
};

/* Under tmu: task k's claim record. One job change, the call's `dispatch`
 * event (what jobs_record_dispatch writes, plus the task, its worker and
 * its lease): the claim's only record. The task has no row of its own
 * until something else happens to it (a heartbeat, a failure, an expiry,
 * a cancel); its id names its job, whose history is where the store finds
 * it (jd_task_stored_state), and a replay reads a dispatch that names a
 * task as an attempt that ran. */
static struct trec *claim_rec(struct jd_jobs *j, struct claim_op *op, size_t ix)
{
    const struct task *k = op->tasks[ix];
    struct trec *r = jd_xcalloc(1, sizeof *r);
    struct jd_sbuf b = {0};
    jd_sb_puts(&b, "{\"command\":");
    jd_sb_string(&b, k->cmd->name);
    jd_sb_puts(&b, ",\"attempt\":");
    jd_sb_number(&b, k->attempt);
    jd_sb_puts(&b, ",\"args\":");
    jd_sb_json(&b, k->args, "{}");
    jd_sb_puts(&b, ",\"task\":");
    jd_sb_string(&b, k->id);
    jd_sb_puts(&b, ",\"worker\":");
    jd_sb_string(&b, k->worker ? k->worker : "");
    jd_sb_puts(&b, ",\"lease_expires_ms\":");
    jd_sb_number(&b, k->lease_expires_ms);
    jd_sb_puts(&b, ",\"run\":");
    jd_sb_number(&b, k->run);
    jd_sb_puts(&b, "}");
    r->j = j;
    r->s1 = b.p; /* the event's text, freed with r */
    r->w.op = JD_W_JOB_CHANGE;
    r->w.job_id = k->job_id;
    r->w.kind = JD_EVK_DISPATCH;
    r->w.tag = k->tag;
    r->w.data = r->s1;
    r->claim = op;
    r->claim_ix = ix;
    r->w.done = tasks_trec_done;
    r->w.arg = r;
    return r;
}

/* Under tmu: submit op's records one by one, so that one that fails (its
 * job fenced on a cluster) fails alone; the writer still commits them
 * together as a rule. One the store refused (it is closing) is done at
 * once as not recorded (its task waits again). */
static void claim_enqueue_locked(struct jd_jobs *j, struct claim_op *op)
{
    op->remaining = (int)op->n;
    bool closing = false;
    for (size_t i = 0; i < op->n; i++) {
        struct trec *r = claim_rec(j, op, i);
        if (closing || jd_store_submit(j->store, &r->w) != 0) {
            closing = true;
            op->rcs[i] = JD_ESHUTDOWN;
            op->remaining--;
            tasks_trec_free(r);
        }
    }
}

/* Under tmu: take up to max waiting tasks of cmds (oldest first across
 * commands) for a claim; NULL if none. The records are submitted by the
 * caller (claim_submit) after tmu. */
struct claim_op *tasks_claim_take_locked(struct jd_jobs *j, struct rcmd *const *cmds, size_t ncmds,
                                         const char *worker, unsigned max, int64_t lease_ms)
{
    struct claim_op *op = NULL;
    int64_t now = jd_wall_ms();
    while (!op || op->n < max) {
        struct task *best = NULL;
        for (size_t i = 0; i < ncmds; i++) {
            struct task *k = cmds[i]->whead;
            if (k && (!best || k->created_ms < best->created_ms))
                best = k;
        }
        if (!best)
            break;
        if (!op) {
            op = jd_xcalloc(1, sizeof *op);
            op->tasks = jd_xcalloc(max, sizeof *op->tasks);
            op->rcs = jd_xcalloc(max, sizeof *op->rcs);
            op->seqs = jd_xcalloc(max, sizeof *op->seqs);
        }
        tasks_waiting_unlink(best);
        best->cmd->in_flight++;
        best->cmd->claimed_total++;
        best->st = TS_CLAIMING;
        free(best->worker);
        best->worker = jd_xstrdup(worker);
        best->claimed_ms = now;
        best->lease_expires_ms = now + lease_ms;
        best->lease_ms = lease_ms;
        best->refs++; /* the claim's */
        op->tasks[op->n++] = best;
    }
    if (op)
        claim_enqueue_locked(j, op); /* before tmu goes: see jobs_tasks_impl.h */
    return op;
}

size_t tasks_claim_count(const struct claim_op *op)
{
    return op ? op->n : 0;
}

static char *claim_answer_locked(struct jd_jobs *j, struct claim_op *op, int *rc);
static void claim_op_free(struct claim_op *op);

/* Without tmu: op's answer goes to done(arg), now if its records are all
 * done, else from tasks_claim_committed. */
void tasks_claim_submit(struct jd_jobs *j, struct claim_op *op, jd_action_done_fn done, void *arg)
{
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    op->done = done;
    op->arg = arg;
    op->armed = true;
    if (op->remaining > 0) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    int rc;
    char *answer = claim_answer_locked(j, op, &rc);
    pthread_mutex_unlock(&t->mu);
    op->done(op->arg, rc, answer);
    free(answer);
    claim_op_free(op);
}

static void render_task(struct jd_sbuf *b, const struct task *k)
{
    char t[32];
    jd_render_time(k->lease_expires_ms, t);
    jd_sb_puts(b, "{\"id\":\"");
    jd_sb_puts(b, k->id);
    jd_sb_puts(b, "\",\"command\":");
    jd_sb_string(b, k->cmd->name);
    jd_sb_puts(b, ",\"args\":");
    jd_sb_json(b, k->args, "{}");
    jd_sb_puts(b, ",\"job_id\":\"");
    jd_sb_number(b, k->job_id);
    jd_sb_puts(b, "\",\"tag\":");
    jd_sb_number(b, k->tag);
    jd_sb_puts(b, ",\"attempt\":");
    jd_sb_number(b, k->attempt);
    jd_sb_puts(b, ",\"idempotency_key\":");
    jd_sb_string(b, k->key);
    if (k->traceparent) { /* the job's, unchanged: child spans are the worker's */
        jd_sb_puts(b, ",\"traceparent\":");
        jd_sb_string(b, k->traceparent);
    }
    jd_sb_puts(b, ",\"lease_expires_at\":\"");
    jd_sb_puts(b, t);
    jd_sb_puts(b, "\"}");
}

static void claim_op_free(struct claim_op *op)
{
    free(op->tasks);
    free(op->rcs);
    free(op->seqs);
    free(op);
}

/* Under tmu, every record of op done: settle its tasks and return the
 * answer ({"tasks":[...]}, caller frees) with *rc for done. */
static char *claim_answer_locked(struct jd_jobs *j, struct claim_op *op, int *rc)
{
    struct jd_tasks *t = j->tasks;
    struct jd_sbuf b = {0};
    jd_sb_puts(&b, "{\"tasks\":[");
    size_t shown = 0;
    /* The claim fails only if none of its records committed; a task whose
     * record failed waits again and the claim answers with the others. */
    int rc_all = 0;
    bool any = false;
    for (size_t i = 0; i < op->n; i++) {
        any |= op->rcs[i] == 0;
        if (op->rcs[i] && !rc_all)
            rc_all = op->rcs[i];
    }
    if (any)
        rc_all = 0;
    for (size_t i = 0; i < op->n; i++) {
        struct task *k = op->tasks[i];
        if (k->live && k->st == TS_CLAIMING) {
            if (op->rcs[i]) {
                /* Not recorded: nobody holds it; it waits again, first
                 * (held back if its job is over meanwhile). */
                k->st = TS_WAITING;
                k->cmd->in_flight--;
                k->cmd->claimed_total--;
                if (k->over) {
                    k->held = true;
                    t->held++;
                } else {
                    tasks_waiting_push(k, true);
                }
            } else {
                k->st = TS_CLAIMED;
                if (op->seqs[i] > 0) /* else the id without it, found as before */
                    tasks_rename_locked(t, k, op->seqs[i]);
                /* Its lease runs even when it is not handed out: the
                 * fallback should the job's cancel never reach the call. */
                tasks_lease_arm(j, k);
                if (k->over)
                    continue; /* its job was cancelled or ended: nobody gets it */
                k->shown = true;
                struct wkr *w = tasks_worker_seen(t, k->worker ? k->worker : "", NULL, 0);
                if (w)
                    w->in_flight++;
                if (shown++)
                    jd_sb_puts(&b, ",");
                render_task(&b, k);
            }
        }
    }
    for (size_t i = 0; i < op->n; i++)
        tasks_unref(op->tasks[i]);
    jd_sb_puts(&b, "]}");
    *rc = rc_all == JD_ESHUTDOWN ? 0 : rc_all;
    if (rc_all == JD_ESHUTDOWN) {
        free(b.p);
        return jd_xstrdup("{\"tasks\":[]}");
    }
    if (rc_all) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* The store's completion thread: one record of op committed at seq (or not). */
void tasks_claim_committed(struct jd_jobs *j, struct claim_op *op, size_t ix, int rc, int64_t seq)
{
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    op->rcs[ix] = rc;
    op->seqs[ix] = seq;
    if (--op->remaining > 0 || !op->armed) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    int arc;
    char *answer = claim_answer_locked(j, op, &arc);
    pthread_mutex_unlock(&t->mu);
    op->done(op->arg, arc, answer);
    free(answer);
    claim_op_free(op);
}

void tasks_claimer_free(struct claimer *cl)
{
    free(cl->cmds);
    free(cl->worker);
    free(cl);
}

/* Under tmu: a task of c arrived: hand it to the oldest parked claim that
 * wants c (one claim per arrival: the rest stay parked). */
void tasks_serve_claimers_locked(struct jd_jobs *j, struct rcmd *c)
{
    struct jd_tasks *t = j->tasks;
    /* The list is newest first; serve the oldest live one: the last match
     * whose client is still there. One that left is marked and skipped from
     * then on; its deadline timer answers it (to nobody). */
    struct claimer **match = NULL;
    for (;;) {
        match = NULL;
        for (struct claimer **pp = &t->claimers; *pp; pp = &(*pp)->next)
            for (size_t i = 0; i < (*pp)->ncmds && !(*pp)->gone && !(*pp)->fetching; i++)
                if ((*pp)->cmds[i] == c)
                    match = pp;
        if (!match)
            return;
        if (!t->claim_alive || t->claim_alive((*match)->arg))
            break;
        (*match)->gone = true;
    }
    struct claimer *cl = *match;
    *match = cl->next;
    if (cl->timer_armed && jd_sched_timer_cancel(j->sched, cl->timer_id) == 0)
        free(cl->timer_arg);
    struct claim_op *op =
        tasks_claim_take_locked(j, cl->cmds, cl->ncmds, cl->worker, cl->max, cl->lease_ms);
    op->done = cl->done;
    op->arg = cl->arg;
    op->armed = true;
    tasks_claimer_free(cl);
    if (op->remaining == 0) {
        /* Closing, nothing recorded: the tasks wait again, and only while
         * the store closes, after every request was answered or dropped,
         * is the claim answered (empty) under tmu: the one user callback
         * made under it. */
        int rc;
        char *answer = claim_answer_locked(j, op, &rc);
        op->done(op->arg, 0, "{\"tasks\":[]}");
        free(answer);
        claim_op_free(op);
    }
}

static void claim_deadline(void *arg)
{
    struct ctimer *ct = arg;
    struct jd_jobs *j = ct->j;
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    struct claimer *cl = NULL;
    for (struct claimer **pp = &t->claimers; *pp; pp = &(*pp)->next)
        if ((*pp)->id == ct->id) {
            cl = *pp;
            if (cl->fetching) {
                /* Another node is being asked for it: that answer ends it. */
                cl->timer_armed = false;
                cl->expired = true;
                cl = NULL;
                break;
            }
            *pp = cl->next;
            break;
        }
    pthread_mutex_unlock(&t->mu);
    free(ct);
    if (cl) {
        cl->done(cl->arg, 0, "{\"tasks\":[]}");
        tasks_claimer_free(cl);
    }
}

void jd_jobs_set_claim_alive(struct jd_jobs *j, bool (*alive)(void *arg))
{
    pthread_mutex_lock(&j->tasks->mu);
    j->tasks->claim_alive = alive;
    pthread_mutex_unlock(&j->tasks->mu);
}

static int task_claim(struct jd_jobs *j, const char *body, size_t len, bool here,
                      jd_action_done_fn done, void *arg, struct jd_error *err)
{
    struct jd_tasks *t = j->tasks;
    cJSON *o = tasks_parse_object(body ? body : "", len, false, err);
    if (!o)
        return err->code;
    int rc = 0;
    int64_t max = 1, wait_ms = 0, lease_ms = JD_TASK_DEFAULT_LEASE_MS;
    const char *worker = "";
    struct rcmd **cmds = NULL;
    size_t ncmds = 0;
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(o, "commands");
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "worker");
    if (!cJSON_IsArray(cs) || cJSON_GetArraySize(cs) < 1)
        rc = jd_error_set(err, JD_EINVAL, "/commands",
                          "commands must be a non-empty array of command names");
    else if (cJSON_GetArraySize(cs) > JD_TASK_MAX_CLAIM_COMMANDS)
        rc = jd_error_set(err, JD_EINVAL, "/commands", "at most %d commands per claim",
                          JD_TASK_MAX_CLAIM_COMMANDS);
    if (rc == 0 && w && !cJSON_IsNull(w) &&
        (!cJSON_IsString(w) || strlen(w->valuestring) > WORKER_MAX))
        rc = jd_error_set(err, JD_EINVAL, "/worker", "worker must be a string of at most %d bytes",
                          WORKER_MAX);
    if (rc == 0 && cJSON_IsString(w))
        worker = w->valuestring;
    if (rc == 0)
        rc = tasks_int_field(o, "max", 1, JD_TASK_MAX_CLAIM, 1, &max, err);
    if (rc == 0)
        rc = tasks_int_field(o, "wait_ms", 0, JD_TASK_MAX_WAIT_MS, 0, &wait_ms, err);
    if (rc == 0)
        rc = tasks_int_field(o, "lease_ms", JD_TASK_MIN_LEASE_MS, JD_TASK_MAX_LEASE_MS,
                             JD_TASK_DEFAULT_LEASE_MS, &lease_ms, err);
    if (rc) {
        cJSON_Delete(o);
        return rc;
    }
    cmds = jd_xcalloc((size_t)cJSON_GetArraySize(cs), sizeof *cmds);
    pthread_mutex_lock(&t->mu);
    const cJSON *c;
    int i = 0;
    cJSON_ArrayForEach(c, cs)
    {
        char ptr[32];
        snprintf(ptr, sizeof ptr, "/commands/%d", i++);
        struct rcmd *rc_ = cJSON_IsString(c) ? tasks_cmd_find(t, c->valuestring) : NULL;
        if (!cJSON_IsString(c)) {
            rc = jd_error_set(err, JD_EINVAL, ptr, "a command name must be a string");
            break;
        }
        if (!rc_ || !rc_->registered) {
            rc = jd_error_set(err, JD_EINVAL, ptr,
                              "no remote command \"%.100s\" (PUT "
                              "/v1/commands/{name} registers one)",
                              c->valuestring);
            break;
        }
        bool dup = false;
        for (size_t k = 0; k < ncmds; k++)
            dup |= cmds[k] == rc_;
        if (!dup)
            cmds[ncmds++] = rc_;
    }
    if (rc == 0 && t->draining)
        rc = jd_error_set(err, JD_ESHUTDOWN, NULL, "shutting down");
    if (rc) {
        pthread_mutex_unlock(&t->mu);
        cJSON_Delete(o);
        free(cmds);
        return rc;
    }
    tasks_worker_seen(t, worker, cmds, ncmds);
    struct claim_op *op = tasks_claim_take_locked(j, cmds, ncmds, worker, (unsigned)max, lease_ms);
    int64_t nodes[GATHER_NODES];
    size_t nnodes = !here && t->remote.claim && tasks_claim_count(op) < (size_t)max
                        ? tasks_announced_locked(t, cmds, ncmds, nodes)
                        : 0;
    if (nnodes > 0) {
        /* Other nodes have tasks of these commands waiting: ask them for
         * the rest (without tmu), then answer or park. */
        pthread_mutex_unlock(&t->mu);
        tasks_gather(j, op, cmds, ncmds, worker, (unsigned)max, lease_ms, wait_ms, nodes, nnodes,
                     done, arg);
        cJSON_Delete(o);
        free(cmds);
        return 0;
    }
    if (op || wait_ms == 0) {
        pthread_mutex_unlock(&t->mu);
        cJSON_Delete(o);
        free(cmds);
        if (!op) {
            done(arg, 0, "{\"tasks\":[]}");
            return 0;
        }
        tasks_claim_submit(j, op, done, arg);
        return 0;
    }
    rc = tasks_park_locked(j, cmds, ncmds, worker, (unsigned)max, lease_ms, wait_ms, done, arg);
    pthread_mutex_unlock(&t->mu);
    cJSON_Delete(o);
    free(cmds);
    if (rc)
        return jd_error_set(err, JD_ESHUTDOWN, NULL, "shutting down");
    return 0;
}

int tasks_park_locked(struct jd_jobs *j, struct rcmd *const *cmds, size_t ncmds, const char *worker,
                      unsigned max, int64_t lease_ms, int64_t wait_ms, jd_action_done_fn done,
                      void *arg)
{
    struct jd_tasks *t = j->tasks;
    if (t->draining)
        return JD_ESHUTDOWN;
    struct claimer *cl = jd_xcalloc(1, sizeof *cl);
    cl->id = ++t->next_claimer;
    cl->cmds = jd_xcalloc(ncmds ? ncmds : 1, sizeof *cl->cmds);
    memcpy(cl->cmds, cmds, ncmds * sizeof *cmds);
    cl->ncmds = ncmds;
    cl->worker = jd_xstrdup(worker);
    cl->max = max;
    cl->lease_ms = lease_ms;
    cl->done = done;
    cl->arg = arg;
    struct ctimer *ct = jd_xmalloc(sizeof *ct);
    ct->j = j;
    ct->id = cl->id;
    if (jd_sched_timer_after(j->sched, (uint64_t)wait_ms * 1000000u, claim_deadline, ct,
                             &cl->timer_id) != 0) {
        free(ct);
        tasks_claimer_free(cl);
        return JD_ESHUTDOWN;
    }
    cl->timer_armed = true;
    cl->timer_arg = ct;
    cl->next = t->claimers;
    t->claimers = cl;
    return 0;
}

struct claimer *tasks_claimer_unlink_locked(struct jd_jobs *j, uint64_t id)
{
    struct jd_tasks *t = j->tasks;
    for (struct claimer **pp = &t->claimers; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            struct claimer *cl = *pp;
            *pp = cl->next;
            if (cl->timer_armed && jd_sched_timer_cancel(j->sched, cl->timer_id) == 0)
                free(cl->timer_arg);
            cl->timer_armed = false;
            return cl;
        }
    return NULL;
}

int jd_jobs_task_claim(struct jd_jobs *j, const char *body, size_t len, jd_action_done_fn done,
                       void *arg, struct jd_error *err)
{
    return task_claim(j, body, len, false, done, arg, err);
}

int jd_jobs_task_claim_here(struct jd_jobs *j, const char *body, size_t len, jd_action_done_fn done,
                            void *arg, struct jd_error *err)
{
    return task_claim(j, body, len, true, done, arg, err);
}

void jobs_tasks_drain(struct jd_jobs *j)
{
    struct jd_tasks *t = j->tasks;
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->draining = true;
    if (t->ann_armed && jd_sched_timer_cancel(j->sched, t->ann_timer) == 0)
        t->ann_armed = false; /* announcements stop (a firing tick sees draining) */
    struct claimer *list = t->claimers;
    t->claimers = NULL;
    for (struct claimer *cl = list; cl; cl = cl->next)
        if (cl->timer_armed && jd_sched_timer_cancel(j->sched, cl->timer_id) == 0)
            free(cl->timer_arg);
    pthread_mutex_unlock(&t->mu);
    while (list) {
        struct claimer *cl = list;
        list = cl->next;
        cl->done(cl->arg, 0, "{\"tasks\":[]}");
        tasks_claimer_free(cl);
    }
}
