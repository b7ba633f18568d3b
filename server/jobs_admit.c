/*
 * Admission: per-queue ready lists (priority desc, then id asc), picking
 * ready jobs while fewer than max_running hold a slot, and the job-level
 * timers (run_at, whole-job timeout, cancel grace).
 *
 * Invariants: a job is in at most one ready list (in_ready), which holds a
 * reference; an admitted job holds one of max_running's slots (running,
 * and its queue's running) unless it waits for a message (slot_free).
 * Paused queues are skipped, and so are queues at their own max_running
 * or with an empty rate bucket; for the latter a timer (one per queue)
 * re-runs admission when the next token is due, so nothing polls.
 * Resumed jobs (replay) take slots but no tokens: the rate is on starts.
 * On a cluster node a queue with max_running or a rate admits only jobs
 * the database granted (jobs_cluster.c, jd_store_queue_grant), so both
 * hold for the cluster; its local cap and bucket are not used then.
 *
 * Threading: the *_locked functions and the ready-list helpers run under
 * jd_jobs.mu. jobs_start_list and jobs_admit take mu themselves and start
 * processes without it. job_timer_fire runs on the scheduler's timer thread.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void job_timer_fire(void *arg);

struct queue *jobs_queue_get(struct jd_jobs *j, const char *name)
{
    struct queue *q = jobs_queue_find(j, name);
    if (q)
        return q;
    q = jd_xcalloc(1, sizeof *q);
    q->name = jd_xstrdup(name);
    q->j = j;
    q->next = j->queues;
    j->queues = q;
    return q;
}

struct queue *jobs_job_queue(struct jd_jobs *j, struct job *jb)
{
    if (!jb->qp)
        jb->qp = jobs_queue_get(j, jb->queue);
    return jb->qp;
}

void jobs_slot_take_locked(struct jd_jobs *j, struct job *jb)
{
    j->running++;
    jobs_job_queue(j, jb)->running++;
}

void jobs_slot_give_locked(struct jd_jobs *j, struct job *jb)
{
    j->running--;
    struct queue *q = jobs_job_queue(j, jb);
    if (q->running > 0)
        q->running--;
}

static void rate_timer_fire(void *arg)
{
    struct queue *q = arg;
    struct jd_jobs *j = q->j;
    struct job *start = NULL;
    pthread_mutex_lock(&j->mu);
    q->rate_timer = false;
    if (!j->stopping)
        jobs_admit_locked(j, &start);
    pthread_mutex_unlock(&j->mu);
    jobs_start_list(j, start);
}

/* Under mu: q has a job ready and no token; re-admit when one is due (an
 * armed timer that is due later, after a PUT raised the rate, is moved). */
static void rate_timer_arm_locked(struct jd_jobs *j, struct queue *q, int64_t now)
{
    int64_t at = now + jd_bucket_wait_ms(&q->rate, now);
    if (q->rate_timer) {
        if (q->rate_timer_at <= at || jd_sched_timer_cancel(j->sched, q->rate_timer_id) != 0)
            return; /* due in time, or firing now (it re-admits) */
        q->rate_timer = false;
    }
    if (jd_sched_timer_after(j->sched, (uint64_t)(at - now) * 1000000u, rate_timer_fire, q,
                             &q->rate_timer_id) == 0) {
        q->rate_timer = true;
        q->rate_timer_at = at;
    }
}

/* Under mu: may q start a job now (its own cap and rate)? A limited
 * queue on a cluster node starts only jobs the database granted: the
 * grant already counted its slot and token cluster-wide. */
static bool queue_may_start(struct jd_jobs *j, struct queue *q, int64_t *now)
{
    if (jobs_queue_pooled(j, q))
        return q->ngranted > 0;
    if (q->ctl.max_running && q->running >= q->ctl.max_running)
        return false;
    if (!q->ctl.rate_limit)
        return true;
    if (*now < 0)
        *now = jobs_mono_ms();
    if (jd_bucket_ready(&q->rate, *now))
        return true;
    q->rate_waits++;
    rate_timer_arm_locked(j, q, *now);
    return false;
}

void jobs_ready_push(struct jd_jobs *j, struct job *jb)
{
    struct queue *q = jobs_queue_get(j, jb->queue);
    struct job *after = q->tail;
    while (after && (after->priority < jb->priority ||
                     (after->priority == jb->priority && after->id > jb->id)))
        after = after->qprev;
    jb->qprev = after;
    jb->qnext = after ? after->qnext : q->head;
    if (jb->qnext)
        jb->qnext->qprev = jb;
    else
        q->tail = jb;
    if (after)
        after->qnext = jb;
    else
        q->head = jb;
    jb->in_ready = true;
    jb->refs++;
    j->st.queued_mem++;
    q->nready++;
    if (jb->granted)
        q->ngranted++;
    else if (jobs_queue_pooled(j, q))
        jobs_cluster_grants_wanted_locked(j);
}

void jobs_ready_remove(struct jd_jobs *j, struct job *jb)
{
    if (!jb->in_ready)
        return;
    struct queue *q = jobs_queue_get(j, jb->queue);
    if (jb->qprev)
        jb->qprev->qnext = jb->qnext;
    else
        q->head = jb->qnext;
    if (jb->qnext)
        jb->qnext->qprev = jb->qprev;
    else
        q->tail = jb->qprev;
    jb->qprev = jb->qnext = NULL;
    jb->in_ready = false;
    j->st.queued_mem--;
    q->nready--;
    if (jb->granted && q->ngranted)
        q->ngranted--;
    jobs_job_unref(jb);
    jobs_window_low_locked(j, q);
}

/* Under mu: pick ready jobs while slots are free; they are started by the
 * caller after unlocking (start list holds a reference each). */
void jobs_admit_locked(struct jd_jobs *j, struct job **start)
{
    int64_t now = -1;
    while (!j->draining && j->running < j->max_running) {
        struct job *best = NULL;
        for (struct queue *q = j->queues; q; q = q->next) {
            if (q->paused || !q->head || !queue_may_start(j, q, &now))
                continue;
            struct job *h = q->head;
            if (q->ngranted) /* pooled: its best granted job */
                while (h && !h->granted)
                    h = h->qnext;
            if (!h)
                continue;
            if (!best || h->priority > best->priority ||
                (h->priority == best->priority && h->id < best->id))
                best = h;
        }
        if (!best)
            break;
        best->refs++; /* for the start list */
        jobs_ready_remove(j, best);
        best->admitted = true;
        if (best->granted) /* used: the job's state now counts it */
            best->granted = false;
        else
            jd_bucket_take(&jobs_job_queue(j, best)->rate);
        jobs_slot_take_locked(j, best);
        best->qnext = *start;
        *start = best;
    }
}

void jobs_start_list(struct jd_jobs *j, struct job *start)
{
    /* The list is in reverse admission order; start in admission order. */
    struct job *rev = NULL;
    while (start) {
        struct job *n = start->qnext;
        start->qnext = rev;
        rev = start;
        start = n;
    }
    while (rev) {
        struct job *n = rev->qnext;
        rev->qnext = NULL;
        jobs_start_job(j, rev, false);
        pthread_mutex_lock(&j->mu);
        jobs_job_unref(rev);
        pthread_mutex_unlock(&j->mu);
        rev = n;
    }
}

void jobs_admit(struct jd_jobs *j)
{
    struct job *start = NULL;
    pthread_mutex_lock(&j->mu);
    jobs_admit_locked(j, &start);
    pthread_mutex_unlock(&j->mu);
    jobs_start_list(j, start);
}

uint64_t jobs_arm_job_timer(struct jd_jobs *j, struct job *jb, int64_t delay_ms, int kind)
{
    struct job_timer_arg *a = &jb->targ[kind];
    a->j = j;
    a->job = jb;
    a->kind = kind;
    jb->refs++;
    uint64_t id = 0;
    if (delay_ms < 0)
        delay_ms = 0;
    if (jd_sched_timer_after(j->sched, (uint64_t)delay_ms * 1000000u, job_timer_fire, a, &id)) {
        jb->refs--;
        return 0;
    }
    return id;
}

/* Under mu: a committed queued job waits for run_at or enters its queue. */
void jobs_enqueue_locked(struct jd_jobs *j, struct job *jb)
{
    int64_t now = jd_wall_ms();
    if (jb->run_at_ms > now + 1) {
        jb->run_at_timer = jobs_arm_job_timer(j, jb, jb->run_at_ms - now, 0);
        if (jb->run_at_timer && j->window && !jb->later) {
            jb->later = true;
            j->later_mem++;
        }
    } else {
        jobs_ready_push(j, jb);
    }
}

void jobs_run_at_cancel_locked(struct jd_jobs *j, struct job *jb)
{
    if (jb->run_at_timer && jd_sched_timer_cancel(j->sched, jb->run_at_timer) == 0)
        jobs_job_unref(jb);
    jb->run_at_timer = 0;
    jobs_window_later_done_locked(j, jb);
}

static void job_timer_fire(void *arg)
{
    struct job_timer_arg *a = arg;
    struct jd_jobs *j = a->j;
    struct job *jb = a->job;
    int kind = a->kind;
    struct job *start = NULL;
    jd_pid kill_pid = 0;
    char *kill_err = NULL;

    pthread_mutex_lock(&j->mu);
    if (kind == 0) {
        jb->run_at_timer = 0;
        jobs_window_later_done_locked(j, jb);
        if (!jb->finished && !jb->in_ready && !jb->admitted && !j->stopping) {
            if (j->window)
                jobs_window_due_locked(j, jb);
            else
                jobs_ready_push(j, jb);
            jobs_admit_locked(j, &start);
        }
    } else if (!jb->finished && jb->spawned && !j->stopping) {
        if (kind == 1) {
            jb->timeout_timer = 0;
            jb->timed_out = true;
            char m[96];
            snprintf(m, sizeof m, "the job ran longer than its timeout_ms (%" PRId64 ")",
                     jobs_job_timeout_ms(jb));
            kill_err = jobs_err_json("timeout", m);
        } else {
            jb->grace_timer = 0;
            kill_err =
                jobs_err_json("cancelled", "the job was cancelled (forced after the grace period)");
        }
        kill_pid = jb->pid;
    }
    jobs_job_unref(jb);
    pthread_mutex_unlock(&j->mu);
    if (kill_pid)
        jd_sched_kill(j->sched, kill_pid, kill_err);
    free(kill_err);
    jobs_start_list(j, start);
}
