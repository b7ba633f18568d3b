/*
 * The job layer (jobs.h): lifecycle, admission, recording, durable replay and
 * change notification.
 *
 * Every non-terminal job has a struct job in a hash table (jobs.mu). A job
 * moves: inserted (in the table, not yet durable) -> queued (insert committed;
 * in its queue's ready list, or waiting for its run_at timer) -> started (a
 * process spawned on the scheduler) -> finished (the process completed; the
 * final state is being committed) -> removed from the table once that commit
 * is durable, which is also when watchers learn about it.
 *
 * Recording: every transition, dispatch, completion, message and cancel is a
 * jd_write on the storage writer. Results reach a process only after their
 * completion record is committed (struct rec's after-commit action), so a
 * completion a process has seen is always in the history, and a replay can
 * deliver it again instead of running the step twice. Events carry "run" (the
 * job's attempt counter) so that replay only considers the current attempt
 * after a manual retry.
 *
 * Replay: jd_jobs_create reads every non-terminal job with its events; the
 * process is rebuilt and, as it yields, a tag whose completion is recorded is
 * completed from the record, one dispatched but not completed is dispatched
 * again (attempt + 1, idempotency key "<job_id>:<tag>") and timers re-arm at
 * their recorded deadlines. Tags come from the definition (jobdef.h), so a
 * differing command for a recorded tag means the definition or process type
 * changed: the job fails with kind "nondeterminism". Recorded completions
 * and messages reach the replayed process in their history order, and live
 * ones only after them (struct dlv): what the process decided from that
 * order before a crash, e.g. a wait step timed out because its timer's
 * completion was recorded before a message, it decides again. A timer's
 * firing is a recorded completion like any other, delivered only once
 * committed; a firing that was not committed is free to lose to a message.
 * (A process that does not yield a recorded tag again leaves the events
 * behind it waiting; cancel and timeout_ms still end it.)
 *
 * Watches: a watch stays findable from jd_jobs_watch until its fn has
 * returned or it was withdrawn (struct watch), which is what lets unwatch
 * keep its promise in the window between a commit detaching it and its fn.
 *
 * Threading: one mutex (mu) guards the table, queues, watches and every
 * struct job. Registry calls and jd_sched_kill are made without mu (they may
 * call back into this layer on the same thread); the other scheduler and
 * store functions only enqueue and may be called under mu. Hooks run on
 * workers, timer callbacks on the timer thread, commit callbacks on the
 * store's completion thread (jd_store_done_thread, started in
 * jd_jobs_create; the writer itself if that thread could not start), one
 * at a time in commit order.
 */
#include "server/jobs_impl.h"
#include "server/workflow.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NBUCKETS 4096     /* job and watch hash buckets; chains stay short for 10^5 live jobs */
#define WATCH_ID_SHIFT 12 /* a watch id is (serial << 12) | its bucket */
_Static_assert(NBUCKETS == 1u << WATCH_ID_SHIFT, "watch ids carry the bucket");

struct job;

/* A dispatch/completion found in the history, for replay (current run only). */
struct rec {
    uint32_t tag;
    char *command;       /* recorded dispatch command, or NULL if only completed */
    uint32_t attempt;    /* highest recorded attempt */
    int64_t deadline_ms; /* $sleep/$timer: recorded wall deadline */
    bool completed;      /* its result waits in the job's delivery queue */
    struct rec *next;
};

/* One registry call in flight; two references (dispatch path, done path). */
struct call {
    struct jd_jobs *j;
    struct job *job;
    uint32_t tag;
    struct jd_token token;
    struct jd_call_handle *handle;
    char *command, *args;
    int refs;
    struct call *next;
};

/* A $sleep / $timer yield in flight. */
struct jtimer {
    struct jd_jobs *j;
    struct job *job;
    uint32_t tag;
    struct jd_token token;
    uint64_t id;
    struct jtimer *next;
    /* A record that failed to commit (a full disk), tried again when the
     * timer fires: a completion (res/res_err, delivered only once it
     * commits) or the final state (res/res_err = output/error). */
    unsigned tries;
    char *res, *res_err;
    bool final;
    enum jd_job_state state;
    int64_t finished_ms;
};

static void jtimer_free(struct jtimer *t)
{
    free(t->res);
    free(t->res_err);
    free(t);
}

/*
 * An event for the process, in the job's delivery queue (struct job.dlv).
 * Events reach a process in the order their records committed, which is the
 * order of the history: a live completion or message is handed over by the
 * commit callback (one thread, commit order), and on replay the recorded
 * completions and messages are queued in history order at recovery, so that
 * whatever the process decided from them before a crash (a wait step's timer
 * against a message) it decides again. The head waits while it cannot be
 * delivered yet: the process is not spawned, or the head is a recorded
 * completion whose yield the replayed process has not dispatched again
 * (ready false: no token). Everything behind it waits too, live events
 * included, which keeps the order. Empty (and bypassed) in the common case.
 */
struct dlv {
    bool message;          /* a message; else a yield completion */
    bool ready;            /* completion: its token is known */
    uint32_t tag;          /* completion: its tag */
    struct jd_token token; /* completion, when ready */
    char *data;            /* message {"topic":..,"data":..}, or the result */
    char *error;           /* completion: its error, or NULL */
    struct dlv *next;
};

struct queue {
    char *name;
    bool paused;
    struct job *head, *tail; /* ready list: priority desc, then id asc */
    struct queue *next;
};

/* The argument of a job-level timer; lives inside struct job. */
struct job_timer_arg {
    struct jd_jobs *j;
    struct job *job;
    int kind; /* 0 run_at, 1 whole-job timeout, 2 cancel grace */
};

struct job {
    int64_t id;
    struct job_timer_arg targ[3];
    int refs;
    struct jd_jobdef *def;
    char *queue;
    int64_t priority, run_at_ms, created_ms, started_ms;
    enum jd_job_state state;           /* latest recorded (maybe not yet committed) */
    enum jd_job_state committed_state; /* as of the last commit */
    int64_t version;                   /* committed */
    bool inserted;                     /* insert committed */
    uint32_t run;                      /* attempts: 1 for the first run */
    bool admitted, spawned, finished, cancel_requested, cancel_sent, timed_out;
    bool slot_free; /* admitted, but waiting for a message: not counted in running */
    jd_pid pid;
    uint64_t run_at_timer, timeout_timer, grace_timer;
    struct rec *recs;
    struct dlv *dlv, *dlv_tail; /* delivery queue, commit order */
    struct call *calls;
    struct jtimer *timers;
    struct job *hnext;
    struct job *qprev, *qnext;
    bool in_ready;
};

/* A watch stays in its bucket (jd_jobs.watches) from jd_jobs_watch until its
 * fn has returned or it was withdrawn, so that unwatch always finds it:
 * `fired` once a commit (or drain) detached it for firing, `running` while
 * fn runs (on `thread`), `cancelled` if unwatch withdrew it before fn began
 * (the firing thread then skips fn and frees it). */
struct watch {
    uint64_t id;
    int64_t job_id, since;
    bool terminal_only;
    bool fired, running, cancelled;
    pthread_t thread;
    void (*fn)(void *arg, int rc, int64_t version);
    void *arg;
    struct watch *next;
};

struct jd_jobs {
    struct jd_store *store;
    struct jd_sched *sched;
    struct jd_registry *reg;
    struct jd_job_limits limits;
    int64_t cancel_grace_ms;
    unsigned max_running;
    char *exec_allow, *http_allow, output_cap[24];

    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *table[NBUCKETS];
    struct watch *watches[NBUCKETS];
    uint64_t next_watch;
    struct queue *queues;
    unsigned running;
    unsigned inflight_calls;
    bool draining, stopping, drained, sched_down;
    struct idem *idems; /* idempotency keys being committed */
    struct jd_jobs_stats st;
};

struct idem {
    char *key;
    struct idem *next;
};

/* ---------------------------------------------------------------- helpers */

static unsigned bucket(int64_t id)
{
    return (unsigned)((uint64_t)id * 0x9E3779B97F4A7C15ull >> 52) % NBUCKETS;
}

static struct job *job_find(struct jd_jobs *j, int64_t id)
{
    for (struct job *p = j->table[bucket(id)]; p; p = p->hnext)
        if (p->id == id)
            return p;
    return NULL;
}

static void job_insert(struct jd_jobs *j, struct job *jb)
{
    unsigned b = bucket(jb->id);
    jb->hnext = j->table[b];
    j->table[b] = jb;
    jb->refs++;
}

static void recs_free(struct rec *r)
{
    while (r) {
        struct rec *n = r->next;
        free(r->command);
        free(r);
        r = n;
    }
}

static void job_free(struct job *jb)
{
    recs_free(jb->recs);
    for (struct dlv *d = jb->dlv, *n; d; d = n) {
        n = d->next;
        free(d->data);
        free(d->error);
        free(d);
    }
    jd_jobdef_free(jb->def);
    free(jb->queue);
    free(jb);
}

/* Under mu. */
static void job_unref(struct job *jb)
{
    if (--jb->refs == 0)
        job_free(jb);
}

static void job_remove(struct jd_jobs *j, struct job *jb)
{
    struct job **pp = &j->table[bucket(jb->id)];
    while (*pp && *pp != jb)
        pp = &(*pp)->hnext;
    if (*pp) {
        *pp = jb->hnext;
        job_unref(jb);
    }
}

static struct queue *queue_get(struct jd_jobs *j, const char *name)
{
    for (struct queue *q = j->queues; q; q = q->next)
        if (strcmp(q->name, name) == 0)
            return q;
    struct queue *q = jd_xcalloc(1, sizeof *q);
    q->name = jd_xstrdup(name);
    q->next = j->queues;
    j->queues = q;
    return q;
}

static void ready_push(struct jd_jobs *j, struct job *jb)
{
    struct queue *q = queue_get(j, jb->queue);
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
}

static void ready_remove(struct jd_jobs *j, struct job *jb)
{
    if (!jb->in_ready)
        return;
    struct queue *q = queue_get(j, jb->queue);
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
    job_unref(jb);
}

static char *err_json(const char *kind, const char *msg)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "kind", kind);
    cJSON_AddStringToObject(e, "message", msg);
    char *t = cJSON_PrintUnformatted(e);
    cJSON_Delete(e);
    return t;
}

/* ------------------------------------------------------------- recording */

enum after {
    AFTER_NONE = 0,
    AFTER_COMPLETE,   /* deliver the completion to the process */
    AFTER_MESSAGE,    /* deliver the message (or keep it until spawn) */
    AFTER_CANCEL,     /* deliver the cancel event, arm the grace timer */
    AFTER_FINAL,      /* the final state is durable: drop the job */
    AFTER_QUEUED,     /* insert or retry committed: admit */
    AFTER_QUEUE_FLAG, /* queue pause/resume committed */
};

struct wrec {
    struct jd_write w;
    struct jd_jobs *j;
    struct job *job; /* referenced, or NULL */
    enum after after;
    char *data, *output, *error, *def_text, *idem_key, *fingerprint, *queue_name;
    struct jd_job row;
    struct jd_token token;
    char *res, *res_err; /* AFTER_COMPLETE / AFTER_MESSAGE payloads */
    unsigned tries;      /* AFTER_COMPLETE / AFTER_FINAL: earlier failed attempts */
    /* user callbacks */
    jd_action_done_fn action_done;
    jd_submit_done_fn submit_done;
    void *user_arg;
    struct batch *batch;
};

struct batch {
    int remaining;
    int rc;
    size_t n;
    struct wrec **recs;
    jd_submit_done_fn done;
    void *arg;
};

static void wrec_done(void *arg, struct jd_write *w, int rc);
static void retry_record_locked(struct jd_jobs *j, struct job *jb, struct wrec *r, int rc);

static struct wrec *wrec_new(struct jd_jobs *j, struct job *jb, enum jd_write_op op)
{
    struct wrec *r = jd_xcalloc(1, sizeof *r);
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

static void wrec_free(struct wrec *r)
{
    free(r->data);
    free(r->output);
    free(r->error);
    free(r->def_text);
    free(r->idem_key);
    free(r->fingerprint);
    free(r->queue_name);
    free(r->row.queue);
    free(r->res);
    free(r->res_err);
    free(r);
}

/* Under mu (store submission only enqueues). A record that cannot be
 * enqueued (the store is closing) is dropped: nothing is reported durable. */
static void record(struct wrec *r)
{
    int rc = jd_store_submit(r->j->store, &r->w);
    if (rc) {
        jd_logf(JD_LOG_WARN, "job %" PRId64 ": record dropped: %s", r->w.job_id, jd_strerror(rc));
        if (r->job)
            job_unref(r->job);
        wrec_free(r);
    }
}

/* Event data with "run" added. Takes ownership of o. */
static char *with_run(cJSON *o, uint32_t run)
{
    cJSON_AddNumberToObject(o, "run", run);
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return t;
}

/* Close event data being written in b with "run" (the same text as
 * with_run would give); returns b's text (caller frees). */
static char *end_with_run(struct jd_sbuf *b, uint32_t run)
{
    jd_sb_puts(b, ",\"run\":");
    jd_sb_number(b, run);
    jd_sb_puts(b, "}");
    return b->p;
}

/* A state-change record for jb (not yet submitted: the caller may add
 * fields, then calls record). */
static struct wrec *state_rec(struct jd_jobs *j, struct job *jb, enum jd_job_state s,
                              enum after after)
{
    struct wrec *r = wrec_new(j, jb, JD_W_JOB_CHANGE);
    struct jd_sbuf b = {0};
    jd_sb_puts(&b, "{\"state\":");
    jd_sb_string(&b, jd_job_state_name(s));
    r->data = end_with_run(&b, jb->run);
    r->w.set = JD_SET_STATE;
    r->w.state = s;
    r->w.kind = JD_EVK_STATE;
    r->w.data = r->data;
    r->after = after;
    jb->state = s;
    return r;
}

static void record_state(struct jd_jobs *j, struct job *jb, enum jd_job_state s)
{
    record(state_rec(j, jb, s, AFTER_NONE));
}

/* ---------------------------------------------------------------- watches */

struct fire {
    struct watch *w;
    int rc;
    int64_t version;
    struct fire *next;
};

/* Depth of watch fns running on this thread: unwatch called from inside one
 * never waits for another thread's fn (two fns withdrawing each other's
 * watches would wait for each other forever). */
static _Thread_local unsigned tls_in_watch_fn;

/* Under mu: mark the watches on job_id that this commit satisfies as fired
 * and list them for watches_fire (they stay in their bucket; see struct
 * watch). */
static void watches_collect(struct jd_jobs *j, int64_t job_id, int64_t version, bool terminal,
                            struct fire **list)
{
    for (struct watch *w = j->watches[bucket(job_id)]; w; w = w->next) {
        if (!w->fired && w->job_id == job_id && version > w->since &&
            (!w->terminal_only || terminal)) {
            w->fired = true;
            struct fire *f = jd_xcalloc(1, sizeof *f);
            f->w = w;
            f->version = version;
            f->next = *list;
            *list = f;
        }
    }
}

/* Under mu: take w out of its bucket. */
static void watch_unlink(struct jd_jobs *j, struct watch *w)
{
    for (struct watch **pp = &j->watches[w->id & (NBUCKETS - 1)]; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            return;
        }
}

/* Without mu: run the fired watches (unless withdrawn meanwhile), then drop
 * them; unwatch from another thread waits while one runs. */
static void watches_fire(struct jd_jobs *j, struct fire *list, int rc)
{
    while (list) {
        struct fire *f = list;
        struct watch *w = f->w;
        list = f->next;
        pthread_mutex_lock(&j->mu);
        bool run = !w->cancelled;
        if (run) {
            w->running = true;
            w->thread = pthread_self();
        }
        pthread_mutex_unlock(&j->mu);
        if (run) {
            tls_in_watch_fn++;
            w->fn(w->arg, rc ? rc : f->rc, f->version);
            tls_in_watch_fn--;
        }
        pthread_mutex_lock(&j->mu);
        watch_unlink(j, w);
        if (run)
            pthread_cond_broadcast(&j->cv); /* an unwatch may wait for this fn */
        pthread_mutex_unlock(&j->mu);
        free(w);
        free(f);
    }
}

/* ------------------------------------------------------------ admission */

static void start_job(struct jd_jobs *j, struct job *jb, bool resume);

/* Under mu: pick ready jobs while slots are free; they are started by the
 * caller after unlocking (start list holds a reference each). */
static void admit_locked(struct jd_jobs *j, struct job **start)
{
    while (!j->draining && j->running < j->max_running) {
        struct job *best = NULL;
        for (struct queue *q = j->queues; q; q = q->next) {
            if (q->paused || !q->head)
                continue;
            struct job *h = q->head;
            if (!best || h->priority > best->priority ||
                (h->priority == best->priority && h->id < best->id))
                best = h;
        }
        if (!best)
            break;
        best->refs++; /* for the start list */
        ready_remove(j, best);
        best->admitted = true;
        j->running++;
        best->qnext = *start;
        *start = best;
    }
}

static void start_list(struct jd_jobs *j, struct job *start)
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
        start_job(j, rev, false);
        pthread_mutex_lock(&j->mu);
        job_unref(rev);
        pthread_mutex_unlock(&j->mu);
        rev = n;
    }
}

static void admit(struct jd_jobs *j)
{
    struct job *start = NULL;
    pthread_mutex_lock(&j->mu);
    admit_locked(j, &start);
    pthread_mutex_unlock(&j->mu);
    start_list(j, start);
}

static void job_timer_fire(void *arg);

static uint64_t arm_job_timer(struct jd_jobs *j, struct job *jb, int64_t delay_ms, int kind)
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
static void enqueue_locked(struct jd_jobs *j, struct job *jb)
{
    int64_t now = jd_wall_ms();
    if (jb->run_at_ms > now + 1)
        jb->run_at_timer = arm_job_timer(j, jb, jb->run_at_ms - now, 0);
    else
        ready_push(j, jb);
}

/* -------------------------------------------------------------- finishing */

static void call_unref_locked(struct call *c, struct jd_call_handle **release)
{
    *release = NULL;
    if (--c->refs > 0)
        return;
    *release = c->handle;
    job_unref(c->job);
    free(c->command);
    free(c->args);
    free(c);
}

/* Without mu: cancel the job's calls (their done fires; nothing is recorded
 * because the job is finished) and its timers. */
static void cancel_inflight(struct jd_jobs *j, struct job *jb)
{
    size_t n = 0, cap = 0;
    struct call **v = NULL;
    pthread_mutex_lock(&j->mu);
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
            job_unref(t->job);
            jtimer_free(t);
        } else {
            pp = &t->next;
        }
    }
    if (jb->timeout_timer && jd_sched_timer_cancel(j->sched, jb->timeout_timer) == 0)
        job_unref(jb); /* the timer's reference */
    jb->timeout_timer = 0;
    if (jb->grace_timer && jd_sched_timer_cancel(j->sched, jb->grace_timer) == 0)
        job_unref(jb);
    jb->grace_timer = 0;
    pthread_mutex_unlock(&j->mu);
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

/* --------------------------------------------------------- commit callback */

/* Under mu: append an event to jb's delivery queue (takes ownership of d). */
static void dlv_append(struct job *jb, struct dlv *d)
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
static void dlv_pump_locked(struct jd_jobs *j, struct job *jb)
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
        dlv_append(jb, d);
        dlv_pump_locked(j, jb);
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

static void idem_forget(struct jd_jobs *j, const char *key)
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
    int64_t from = jb->started_ms ? jb->started_ms : jb->created_ms;
    int64_t d = jd_wall_ms() - from;
    if (d < 0)
        d = 0;
    static const int64_t bounds[11] = {1, 5, 10, 50, 100, 500, 1000, 5000, 10000, 60000, 300000};
    int b = 0;
    while (b < 11 && d > bounds[b])
        b++;
    j->st.duration_hist[b]++;
    j->st.duration_ms_sum += (uint64_t)d;
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

    if (r->submit_done && rc == 0 && w->op == JD_W_JOB_INSERT && r->row.id == w->job_id) {
        /* The row as the insert stored it: no read back, no re-parse, and
         * no lock (the row and jb->def, which r's reference keeps, are
         * not changed by anyone). */
        r->row.version = w->version;
        r->row.updated_ms = r->row.created_ms;
        insert_json = jd_render_job_json(&r->row);
    }

    pthread_mutex_lock(&j->mu);
    if (rc == 0 && jb) {
        if (w->version > jb->version)
            jb->version = w->version;
        if (w->op == JD_W_JOB_INSERT) {
            jb->inserted = true;
            jb->committed_state = JD_JOB_QUEUED;
        } else if (w->set & JD_SET_STATE) {
            jb->committed_state = w->state;
        }
        watches_collect(j, jb->id, jb->version, jd_job_state_terminal(jb->committed_state), &fires);
    }
    if (r->idem_key)
        idem_forget(j, r->idem_key);
    switch (r->after) {
    case AFTER_COMPLETE:
        if (rc != 0) {
            /* Not durable: the process must not act on it. Record it again
             * later (a full disk frees up); it is delivered once it commits. */
            if (!j->stopping)
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
            dlv_append(jb, d);
            dlv_pump_locked(j, jb);
        }
        break;
    case AFTER_MESSAGE:
        if (rc == 0) {
            deliver_message_locked(j, jb, r->res);
            r->res = NULL;
        }
        break;
    case AFTER_CANCEL:
        if (jb->spawned && !jb->finished && !jb->cancel_sent) {
            jb->cancel_sent = true;
            jd_sched_cancel(j->sched, jb->pid);
            jb->grace_timer = arm_job_timer(j, jb, j->cancel_grace_ms, 2);
        }
        break;
    case AFTER_FINAL:
        if (rc != 0 && !j->stopping) {
            /* The job stays in memory until its end is durable. */
            retry_record_locked(j, jb, r, rc);
            break;
        }
        final_stats_locked(j, jb, w->state);
        job_remove(j, jb);
        admit_locked(j, &start);
        break;
    case AFTER_QUEUED:
        if (rc == 0 && !jb->finished && !j->draining) {
            enqueue_locked(j, jb);
            admit_locked(j, &start);
        } else if (rc != 0) {
            jb->finished = true;
            job_remove(j, jb);
        }
        break;
    case AFTER_QUEUE_FLAG:
        if (rc == 0) {
            queue_get(j, r->queue_name)->paused = w->paused;
            admit_locked(j, &start);
        }
        break;
    case AFTER_NONE:
        break;
    }
    if (!batch && jb) {
        job_unref(jb); /* nothing below uses jb */
        r->job = NULL;
    }
    pthread_mutex_unlock(&j->mu);

    watches_fire(j, fires, 0);

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
        } else if (res.rc == 0) {
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
        if (w->op == JD_W_QUEUE) {
            char buf[160];
            snprintf(buf, sizeof buf, "{\"queue\":\"%s\",\"paused\":%s}", r->queue_name,
                     w->paused ? "true" : "false");
            r->action_done(r->user_arg, rc, rc ? NULL : buf);
        } else {
            render_and_call(j, w->job_id, rc, r->action_done, r->user_arg);
        }
    }
    start_list(j, start);
    if (!batch) {
        wrec_free(r);
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
                    job_unref(b->recs[i]->job);
                pthread_mutex_unlock(&j->mu);
                wrec_free(b->recs[i]);
            }
            free(b->recs);
            free(b);
        }
    }
}

/* ------------------------------------------------------------------ start */

static int64_t job_timeout_ms(const struct job *jb)
{
    return jb->def ? jb->def->timeout_ms : 0;
}

/* Without mu. Spawn the job's process; record "running" unless resuming. */
static void start_job(struct jd_jobs *j, struct job *jb, bool resume)
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
            j->running--;
            jb->admitted = false;
        }
        pthread_mutex_unlock(&j->mu);
        return;
    }
    if (!resume) {
        jb->started_ms = jd_wall_ms();
        struct wrec *r = state_rec(j, jb, JD_JOB_RUNNING, AFTER_NONE);
        r->w.set |= JD_SET_ATTEMPTS | JD_SET_STARTED;
        r->w.attempts = jb->run;
        r->w.started_ms = jb->started_ms;
        record(r);
    }
    pthread_mutex_unlock(&j->mu);

    if (!d) {
        fail = err_json("invalid_definition", "the stored definition no longer parses");
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
            fail = err_json("unknown_process", m);
        } else {
            ops = &jd_plugin_process_ops;
            self = jd_plugin_process_new(pt);
            method = d->method;
            input = d->input ? cJSON_PrintUnformatted(d->input) : NULL;
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
            fail = err_json("spawn_failed", jd_strerror(rc));
        }
    }
    free(input);

    pthread_mutex_lock(&j->mu);
    if (fail) {
        if (rc == JD_ESHUTDOWN) {
            /* Draining: the job stays running in storage and resumes later. */
            j->running--;
            free(fail);
            pthread_mutex_unlock(&j->mu);
            return;
        }
        jb->finished = true;
        j->running--;
        struct wrec *r = state_rec(j, jb, JD_JOB_FAILED, AFTER_FINAL);
        r->error = fail;
        r->w.set |= JD_SET_ERROR | JD_SET_FINISHED;
        r->w.error = r->error;
        r->w.finished_ms = jd_wall_ms();
        record(r);
        pthread_mutex_unlock(&j->mu);
        return;
    }
    jb->pid = pid;
    jb->spawned = true;
    /* Events recorded before the process existed (messages, and on replay
     * the recorded history), in order, as far as they can go now. */
    dlv_pump_locked(j, jb);
    int64_t tmo = job_timeout_ms(jb);
    if (tmo > 0 && !jb->finished)
        jb->timeout_timer = arm_job_timer(j, jb, jb->started_ms + tmo - jd_wall_ms(), 1);
    if (jb->cancel_requested && !jb->cancel_sent && !jb->finished) {
        jb->cancel_sent = true;
        jd_sched_cancel(j->sched, pid);
        jb->grace_timer = arm_job_timer(j, jb, j->cancel_grace_ms, 2);
    }
    pthread_mutex_unlock(&j->mu);
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
        if (!jb->finished && !jb->in_ready && !jb->admitted && !j->stopping) {
            ready_push(j, jb);
            admit_locked(j, &start);
        }
    } else if (!jb->finished && jb->spawned && !j->stopping) {
        if (kind == 1) {
            jb->timeout_timer = 0;
            jb->timed_out = true;
            char m[96];
            snprintf(m, sizeof m, "the job ran longer than its timeout_ms (%" PRId64 ")",
                     job_timeout_ms(jb));
            kill_err = err_json("timeout", m);
        } else {
            jb->grace_timer = 0;
            kill_err =
                err_json("cancelled", "the job was cancelled (forced after the grace period)");
        }
        kill_pid = jb->pid;
    }
    job_unref(jb);
    pthread_mutex_unlock(&j->mu);
    if (kill_pid)
        jd_sched_kill(j->sched, kill_pid, kill_err);
    free(kill_err);
    start_list(j, start);
}

/* ------------------------------------------------------------------ hooks */

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

static void hook_stepped(void *ctx, jd_pid pid, void *user, enum jd_step_status status)
{
    struct jd_jobs *j = ctx;
    struct job *jb = user;
    (void)pid;
    struct job *start = NULL;
    pthread_mutex_lock(&j->mu);
    if (!jb->finished && !j->stopping) {
        if (status == JD_STEP_IDLE && jb->state == JD_JOB_RUNNING)
            record_state(j, jb, JD_JOB_WAITING);
        else if (status != JD_STEP_IDLE && jb->state == JD_JOB_WAITING)
            record_state(j, jb, JD_JOB_RUNNING);
        /* A job waiting for a message does not hold one of max_running's
         * slots: thousands of jobs waiting for approval must not stop the
         * queue. It takes a slot again when it runs. */
        if (status == JD_STEP_IDLE && jb->admitted && !jb->slot_free) {
            jb->slot_free = true;
            j->running--;
            admit_locked(j, &start);
        } else if (status != JD_STEP_IDLE && jb->slot_free) {
            jb->slot_free = false;
            j->running++;
        }
    }
    pthread_mutex_unlock(&j->mu);
    start_list(j, start);
}

/* Under mu: record the job's end. Takes ownership of output and error. */
static void record_final(struct jd_jobs *j, struct job *jb, enum jd_job_state s, char *output,
                         char *error, int64_t finished_ms, unsigned tries)
{
    struct wrec *r = state_rec(j, jb, s, AFTER_FINAL);
    r->w.set |= JD_SET_OUTPUT | JD_SET_ERROR | JD_SET_FINISHED;
    r->output = output;
    r->error = error;
    r->w.output = r->output;
    r->w.error = r->error;
    r->w.finished_ms = finished_ms;
    r->tries = tries;
    record(r);
}

static void hook_finished(void *ctx, jd_pid pid, void *user, enum jd_step_status status,
                          const char *result, const char *error)
{
    struct jd_jobs *j = ctx;
    struct job *jb = user;
    (void)pid;
    pthread_mutex_lock(&j->mu);
    bool record_it = !jb->finished && !j->stopping;
    jb->finished = true;
    if (jb->admitted) {
        if (!jb->slot_free)
            j->running--;
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
            err = err_json("cancelled", "the job was cancelled");
        else
            err = jd_xstrdup(error ? error : "{\"kind\":\"failed\",\"message\":\"failed\"}");
        record_final(j, jb, s, output, err, jd_wall_ms(), 0);
    }
    pthread_mutex_unlock(&j->mu);
    cancel_inflight(j, jb);
    struct job *start = NULL;
    pthread_mutex_lock(&j->mu);
    admit_locked(j, &start);
    job_unref(jb); /* the process's reference */
    pthread_mutex_unlock(&j->mu);
    start_list(j, start);
}

/* Under mu: record a completion; the process gets it once it is durable.
 * tries: earlier attempts whose commit failed. */
static void record_completion_try(struct jd_jobs *j, struct job *jb, uint32_t tag,
                                  struct jd_token token, const char *result, const char *error,
                                  unsigned tries)
{
    struct wrec *r = wrec_new(j, jb, JD_W_JOB_CHANGE);
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
    record(r);
}

static void record_completion(struct jd_jobs *j, struct job *jb, uint32_t tag,
                              struct jd_token token, const char *result, const char *error)
{
    record_completion_try(j, jb, tag, token, result, error, 0);
}

#define RETRY_FIRST_MS 100 /* a record that failed to commit is tried again after this, */
#define RETRY_MAX_MS 5000  /* doubling up to this */

/* Under mu: take a fired timer off its job's list. */
static void jtimer_unlink(struct job *jb, struct jtimer *t)
{
    for (struct jtimer **pp = &jb->timers; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            return;
        }
}

static void record_retry_fire(void *arg)
{
    struct jtimer *t = arg;
    struct jd_jobs *j = t->j;
    struct job *jb = t->job;
    pthread_mutex_lock(&j->mu);
    jtimer_unlink(jb, t);
    if (!j->stopping) {
        if (t->final) {
            record_final(j, jb, t->state, t->res, t->res_err, t->finished_ms, t->tries);
            t->res = t->res_err = NULL;
        } else if (!jb->finished) {
            record_completion_try(j, jb, t->tag, t->token, t->res, t->res_err, t->tries);
        }
    }
    job_unref(jb);
    pthread_mutex_unlock(&j->mu);
    jtimer_free(t);
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
        job_unref(jb);
        jtimer_free(t);
    }
}

/* Under mu: record a dispatch of `command` for tag. */
static void record_dispatch(struct jd_jobs *j, struct job *jb, uint32_t tag, const char *command,
                            const char *args, uint32_t attempt, int64_t deadline_ms)
{
    struct wrec *r = wrec_new(j, jb, JD_W_JOB_CHANGE);
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
    record(r);
}

static void timer_yield_fire(void *arg)
{
    struct jtimer *t = arg;
    struct jd_jobs *j = t->j;
    struct job *jb = t->job;
    pthread_mutex_lock(&j->mu);
    jtimer_unlink(jb, t);
    if (!jb->finished && !j->stopping)
        record_completion(j, jb, t->tag, t->token, "null", NULL);
    job_unref(jb);
    pthread_mutex_unlock(&j->mu);
    free(t);
}

static void call_on_attempt(void *arg, uint32_t attempt)
{
    struct call *c = arg;
    struct jd_jobs *j = c->j;
    pthread_mutex_lock(&j->mu);
    if (!c->job->finished && !j->stopping)
        record_dispatch(j, c->job, c->tag, c->command, c->args, attempt, 0);
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
    if (!jb->finished && !j->stopping)
        record_completion(j, jb, c->tag, c->token, res->ok ? res->result_json : NULL,
                          res->ok ? NULL
                                  : (res->error_json ? res->error_json : "{\"kind\":\"failed\"}"));
    struct jd_call_handle *h;
    call_unref_locked(c, &h);
    pthread_mutex_unlock(&j->mu);
    if (h)
        jd_registry_call_release(h);
}

static bool is_timer_cmd(const char *cmd)
{
    return strcmp(cmd, JD_CMD_SLEEP) == 0 || strcmp(cmd, JD_CMD_TIMER) == 0;
}

static void hook_dispatch(void *ctx, jd_pid pid, void *user, const struct jd_yield *y,
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
        recs_free(rc);
        char *e = err_json("nondeterminism", m);
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
            dlv_pump_locked(j, jb);
        } else {
            /* Not reached: recovery queues one entry per completed rec, and
             * rec_take hands that rec out once. Fail the step, never guess. */
            jd_sched_complete(j->sched, token, NULL,
                              err_json("internal", "the recorded completion went missing"));
        }
        pthread_mutex_unlock(&j->mu);
        recs_free(rc);
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
            record_dispatch(j, jb, y->tag, cmd, y->args, 1, deadline ? deadline : now);
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
            job_unref(jb);
            free(t);
        }
        pthread_mutex_unlock(&j->mu);
        recs_free(rc);
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
    c->args = jd_xstrdup(y->args ? y->args : "{}");
    c->next = jb->calls;
    jb->calls = c;
    j->inflight_calls++;
    uint32_t first = rc ? rc->attempt + 1 : 1;
    struct jd_retry_policy pol;
    if (jb->def && jb->def->shape != JD_JOBDEF_PROCESS)
        pol = jd_jobdef_retry_for_tag(jb->def, y->tag);
    else if (jb->def && jb->def->has_retry)
        pol = jb->def->retry;
    else
        pol = (struct jd_retry_policy){.max_attempts = 1, .factor = 1.0};
    pthread_mutex_unlock(&j->mu);
    recs_free(rc);

    char key[48];
    snprintf(key, sizeof key, "%" PRId64 ":%u", jb->id, y->tag);
    struct jd_call_request req = {
        .command = c->command,
        .args_json = c->args,
        .idempotency_key = key,
        .first_attempt = first,
        .timeout_ms = y->timeout_ms,
        .retry = pol,
        .on_attempt = call_on_attempt,
        .done = call_done,
        .arg = c,
    };
    struct jd_call_handle *h = NULL;
    int r = jd_registry_call(j->reg, &req, &h);
    pthread_mutex_lock(&j->mu);
    if (r != 0) {
        /* done will not fire: fail the yield through the normal path. */
        char m[120];
        snprintf(m, sizeof m, "dispatch failed: %s", jd_strerror(r));
        char *e = err_json("dispatch_failed", m);
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

/* ------------------------------------------------------------- submitting */

static void fingerprint(const char *text, char out[17])
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 */
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    snprintf(out, 17, "%016" PRIx64, h);
}

static struct job *job_new(struct jd_jobs *j, struct jd_jobdef *d, int64_t id, int64_t now)
{
    (void)j;
    struct job *jb = jd_xcalloc(1, sizeof *jb);
    jb->id = id;
    jb->def = d;
    jb->queue = jd_xstrdup(d ? d->queue : "default");
    jb->priority = d ? d->priority : 0;
    jb->run_at_ms = d && d->run_at_ms ? d->run_at_ms : now + (d ? d->delay_ms : 0);
    jb->created_ms = now;
    jb->state = jb->committed_state = JD_JOB_QUEUED;
    jb->run = 1;
    return jb;
}

/* Under mu: a job and its insert record. */
static struct wrec *insert_rec(struct jd_jobs *j, struct jd_jobdef *d, const char *key,
                               const char *fp)
{
    int64_t now = jd_wall_ms();
    struct job *jb = job_new(j, d, jd_store_next_id(j->store), now);
    job_insert(j, jb);
    struct wrec *r = wrec_new(j, jb, JD_W_JOB_INSERT);
    r->row.id = jb->id;
    r->row.queue = jd_xstrdup(jb->queue);
    r->row.priority = jb->priority;
    r->row.state = JD_JOB_QUEUED;
    r->row.definition = d->text;
    r->row.run_at_ms = jb->run_at_ms;
    r->row.created_ms = now;
    if (key) {
        r->idem_key = jd_xstrdup(key);
        r->fingerprint = jd_xstrdup(fp);
        r->row.idempotency_key = r->idem_key;
        r->w.idem_fingerprint = r->fingerprint;
    }
    r->w.job = &r->row;
    r->after = AFTER_QUEUED;
    j->st.submitted++;
    return r;
}

int jd_jobs_submit(struct jd_jobs *j, const char *body, size_t len, const char *idempotency_key,
                   jd_submit_done_fn done, void *arg, struct jd_error *err)
{
    jd_error_clear(err);
    struct jd_jobdef *d = NULL;
    int rc = jd_jobdef_parse(body, len, &j->limits, j->reg, &d, err);
    if (rc)
        return rc;
    char fp[17];
    fingerprint(d->text, fp);
    if (idempotency_key) {
        int64_t existing = 0;
        char *efp = NULL;
        if (jd_store_idem_lookup(j->store, idempotency_key, &existing, &efp) == 0) {
            bool same = efp && strcmp(efp, fp) == 0;
            free(efp);
            jd_jobdef_free(d);
            if (!same)
                return jd_error_set(err, JD_EINVAL, "",
                                    "this Idempotency-Key was used with a different body");
            struct jd_job row = {0};
            struct jd_submit_result res = {.job_id = existing, .existing = true};
            char *json = NULL;
            if ((res.rc = jd_store_job_get(j->store, existing, &row)) == 0) {
                json = jd_render_job_json(&row);
                jd_job_clear(&row);
            }
            res.json = json;
            done(arg, &res);
            free(json);
            return 0;
        }
    }
    pthread_mutex_lock(&j->mu);
    if (j->draining) {
        pthread_mutex_unlock(&j->mu);
        jd_jobdef_free(d);
        return jd_error_set(err, JD_ESHUTDOWN, NULL, "the server is shutting down");
    }
    if (idempotency_key) {
        for (struct idem *i = j->idems; i; i = i->next)
            if (strcmp(i->key, idempotency_key) == 0) {
                pthread_mutex_unlock(&j->mu);
                jd_jobdef_free(d);
                return jd_error_set(err, JD_ECONFLICT, NULL,
                                    "a job with this Idempotency-Key is still being stored");
            }
        struct idem *i = jd_xcalloc(1, sizeof *i);
        i->key = jd_xstrdup(idempotency_key);
        i->next = j->idems;
        j->idems = i;
    }
    struct wrec *r = insert_rec(j, d, idempotency_key, fp);
    r->submit_done = done;
    r->user_arg = arg;
    struct job *jb = r->job;
    rc = jd_store_submit(j->store, &r->w);
    if (rc) {
        if (idempotency_key)
            idem_forget(j, idempotency_key);
        jb->finished = true;
        job_remove(j, jb);
        job_unref(jb);
        wrec_free(r);
        j->st.submitted--;
    }
    pthread_mutex_unlock(&j->mu);
    if (rc)
        return jd_error_set(err, rc, NULL, "cannot store the job: %s", jd_strerror(rc));
    return 0;
}

int jd_jobs_validate(struct jd_jobs *j, const char *body, size_t len, struct jd_error *err)
{
    struct jd_jobdef *d = NULL;
    jd_error_clear(err);
    int rc = jd_jobdef_parse(body, len, &j->limits, j->reg, &d, err);
    jd_jobdef_free(d);
    return rc;
}

int jd_jobs_submit_batch(struct jd_jobs *j, const char *body, size_t len, jd_submit_done_fn done,
                         void *arg, struct jd_error *err)
{
    jd_error_clear(err);
    size_t cap = j->limits.max_definition_bytes * (size_t)(j->limits.max_batch > 16 ? 16 : 1);
    if (len > cap)
        return jd_error_set(err, JD_ETOOBIG, "", "batch is %zu bytes, the limit is %zu", len, cap);
    struct jd_job_limits tl = j->limits;
    tl.max_definition_bytes = cap;
    tl.max_depth = j->limits.max_depth + 2; /* {"jobs":[ ... ]} */
    int rc = jd_jobdef_check_text(body, len, &tl, err);
    if (rc)
        return rc;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root)
        return jd_error_set(err, JD_EPARSE, "", "malformed JSON");
    const cJSON *jobs = cJSON_GetObjectItemCaseSensitive(root, "jobs");
    if (!cJSON_IsObject(root) || !cJSON_IsArray(jobs) || cJSON_GetArraySize(jobs) == 0) {
        cJSON_Delete(root);
        return jd_error_set(err, JD_EINVAL, "/jobs", "a batch is {\"jobs\": [definition, ...]}");
    }
    size_t n = (size_t)cJSON_GetArraySize(jobs);
    if (n > j->limits.max_batch) {
        cJSON_Delete(root);
        return jd_error_set(err, JD_ETOOBIG, "/jobs", "%zu jobs in one batch, the limit is %u", n,
                            j->limits.max_batch);
    }
    struct jd_jobdef **defs = jd_xcalloc(n, sizeof *defs);
    size_t i = 0;
    for (const cJSON *c = jobs->child; c; c = c->next, i++) {
        char base[32];
        snprintf(base, sizeof base, "/jobs/%zu", i);
        rc = jd_jobdef_from_json(cJSON_Duplicate(c, 1), base, &j->limits, j->reg, &defs[i], err);
        if (rc)
            break;
    }
    cJSON_Delete(root);
    if (rc) {
        for (size_t k = 0; k < n; k++)
            jd_jobdef_free(defs[k]);
        free(defs);
        return rc;
    }
    struct batch *b = jd_xcalloc(1, sizeof *b);
    b->n = n;
    b->remaining = (int)n;
    b->recs = jd_xcalloc(n, sizeof *b->recs);
    b->done = done;
    b->arg = arg;
    struct jd_write **ws = jd_xcalloc(n, sizeof *ws);
    pthread_mutex_lock(&j->mu);
    if (j->draining) {
        rc = JD_ESHUTDOWN;
    } else {
        for (size_t k = 0; k < n; k++) {
            b->recs[k] = insert_rec(j, defs[k], NULL, NULL);
            b->recs[k]->batch = b;
            ws[k] = &b->recs[k]->w;
        }
        rc = jd_store_submit_many(j->store, ws, n);
        if (rc) {
            for (size_t k = 0; k < n; k++) {
                struct job *jb = b->recs[k]->job;
                jb->finished = true;
                job_remove(j, jb);
                job_unref(jb);
                wrec_free(b->recs[k]);
                j->st.submitted--;
            }
        }
    }
    pthread_mutex_unlock(&j->mu);
    free(ws);
    if (rc) {
        if (!b->recs[0])
            for (size_t k = 0; k < n; k++)
                jd_jobdef_free(defs[k]);
        free(b->recs);
        free(b);
        free(defs);
        return jd_error_set(err, rc, NULL, "cannot store the batch: %s", jd_strerror(rc));
    }
    free(defs);
    return 0;
}

/* ------------------------------------------------------------- acting */

/* Under mu: the live job, or the error for one that is not live. */
static int live_job(struct jd_jobs *j, int64_t id, struct job **out)
{
    struct job *jb = job_find(j, id);
    if (jb) {
        if (!jb->inserted)
            return JD_ENOENT;
        if (jb->finished)
            return JD_ECONFLICT;
        *out = jb;
        return 0;
    }
    struct jd_job row = {0};
    int rc = jd_store_job_get(j->store, id, &row);
    jd_job_clear(&row);
    return rc == 0 ? JD_ECONFLICT : JD_ENOENT;
}

int jd_jobs_cancel(struct jd_jobs *j, int64_t id, jd_action_done_fn done, void *arg)
{
    struct job *jb = NULL;
    pthread_mutex_lock(&j->mu);
    int rc = j->draining ? JD_ESHUTDOWN : live_job(j, id, &jb);
    if (rc) {
        pthread_mutex_unlock(&j->mu);
        return rc;
    }
    struct wrec *ce = wrec_new(j, jb, JD_W_JOB_CHANGE);
    ce->data = with_run(cJSON_CreateObject(), jb->run);
    ce->w.kind = JD_EVK_CANCEL;
    ce->w.data = ce->data;
    jb->cancel_requested = true;
    if (!jb->spawned && !jb->admitted) {
        /* Not running: cancelled at once. */
        ready_remove(j, jb);
        if (jb->run_at_timer && jd_sched_timer_cancel(j->sched, jb->run_at_timer) == 0)
            job_unref(jb);
        jb->run_at_timer = 0;
        jb->finished = true;
        record(ce);
        struct wrec *r = state_rec(j, jb, JD_JOB_CANCELLED, AFTER_FINAL);
        r->error = err_json("cancelled", "the job was cancelled before it ran");
        r->w.set |= JD_SET_ERROR | JD_SET_FINISHED;
        r->w.error = r->error;
        r->w.finished_ms = jd_wall_ms();
        r->action_done = done;
        r->user_arg = arg;
        record(r);
    } else {
        ce->after = AFTER_CANCEL;
        ce->action_done = done;
        ce->user_arg = arg;
        record(ce);
    }
    pthread_mutex_unlock(&j->mu);
    return 0;
}

int jd_jobs_message(struct jd_jobs *j, int64_t id, const char *body, size_t len,
                    jd_action_done_fn done, void *arg, struct jd_error *err)
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
    pthread_mutex_lock(&j->mu);
    rc = j->draining ? JD_ESHUTDOWN : live_job(j, id, &jb);
    if (rc) {
        pthread_mutex_unlock(&j->mu);
        cJSON_Delete(payload);
        return jd_error_set(err, rc, NULL,
                            rc == JD_ECONFLICT ? "the job has finished" : "no such job");
    }
    struct wrec *r = wrec_new(j, jb, JD_W_JOB_CHANGE);
    r->res = cJSON_PrintUnformatted(payload);
    r->data = with_run(payload, jb->run);
    r->w.kind = JD_EVK_MESSAGE;
    r->w.data = r->data;
    r->after = AFTER_MESSAGE;
    r->action_done = done;
    r->user_arg = arg;
    record(r);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

static struct jd_jobdef *parse_stored(const char *text)
{
    struct jd_job_limits big = {.max_definition_bytes = SIZE_MAX / 2,
                                .max_depth = 1u << 20,
                                .max_steps = 1u << 20,
                                .max_string = SIZE_MAX / 2};
    struct jd_jobdef *d = NULL;
    if (text)
        jd_jobdef_parse(text, strlen(text), &big, NULL, &d, NULL);
    return d;
}

int jd_jobs_retry(struct jd_jobs *j, int64_t id, jd_action_done_fn done, void *arg)
{
    pthread_mutex_lock(&j->mu);
    if (j->draining) {
        pthread_mutex_unlock(&j->mu);
        return JD_ESHUTDOWN;
    }
    if (job_find(j, id)) {
        pthread_mutex_unlock(&j->mu);
        return JD_ECONFLICT;
    }
    struct jd_job row = {0};
    int rc = jd_store_job_get(j->store, id, &row);
    if (rc) {
        pthread_mutex_unlock(&j->mu);
        return JD_ENOENT;
    }
    if (row.state != JD_JOB_FAILED && row.state != JD_JOB_CANCELLED) {
        pthread_mutex_unlock(&j->mu);
        jd_job_clear(&row);
        return JD_ECONFLICT;
    }
    int64_t now = jd_wall_ms();
    struct job *jb = job_new(j, parse_stored(row.definition), id, now);
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
    job_insert(j, jb);
    struct wrec *r = state_rec(j, jb, JD_JOB_QUEUED, AFTER_QUEUED);
    r->w.set |= JD_SET_ATTEMPTS | JD_SET_OUTPUT | JD_SET_ERROR | JD_SET_RUN_AT | JD_SET_FINISHED;
    r->w.attempts = jb->run;
    r->w.run_at_ms = now;
    r->w.finished_ms = 0;
    r->action_done = done;
    r->user_arg = arg;
    record(r);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

int jd_jobs_queue_pause(struct jd_jobs *j, const char *queue, bool paused, jd_action_done_fn done,
                        void *arg)
{
    if (!queue || !queue[0] || strlen(queue) > 64)
        return JD_EINVAL;
    for (const char *p = queue; *p; p++)
        if (!(*p == '_' || *p == '-' || *p == '.' || (*p >= '0' && *p <= '9') ||
              (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
            return JD_EINVAL;
    pthread_mutex_lock(&j->mu);
    if (j->draining) {
        pthread_mutex_unlock(&j->mu);
        return JD_ESHUTDOWN;
    }
    struct wrec *r = wrec_new(j, NULL, JD_W_QUEUE);
    r->queue_name = jd_xstrdup(queue);
    r->w.queue = r->queue_name;
    r->w.paused = paused;
    r->after = AFTER_QUEUE_FLAG;
    r->action_done = done;
    r->user_arg = arg;
    record(r);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

/* ------------------------------------------------------------- watches */

int jd_jobs_watch(struct jd_jobs *j, int64_t id, int64_t since_version, bool terminal_only,
                  void (*fn)(void *arg, int rc, int64_t version), void *arg, uint64_t *watch_id)
{
    if (watch_id)
        *watch_id = 0;
    pthread_mutex_lock(&j->mu);
    int64_t version = 0;
    bool terminal = false;
    /* A live job's version is the one its last commit callback saw: a
     * commit whose callback has not run yet will run wrec_done, which takes
     * mu and fires this watch, so none is missed. A job not in the table is
     * terminal (or unknown) and changes no more unless retried, which takes
     * mu too: the store is its truth. */
    struct job *jb = job_find(j, id);
    if (jb) {
        version = jb->version;
        terminal = jd_job_state_terminal(jb->committed_state);
    } else {
        struct jd_job row = {0};
        if (jd_store_job_get(j->store, id, &row) != 0) {
            pthread_mutex_unlock(&j->mu);
            return JD_ENOENT;
        }
        version = row.version;
        terminal = jd_job_state_terminal(row.state);
        jd_job_clear(&row);
    }
    if (version > since_version && (!terminal_only || terminal)) {
        pthread_mutex_unlock(&j->mu);
        fn(arg, 0, version);
        return 0;
    }
    if (j->drained) {
        pthread_mutex_unlock(&j->mu);
        fn(arg, JD_ESHUTDOWN, version);
        return 0;
    }
    struct watch *w = jd_xcalloc(1, sizeof *w);
    unsigned b = bucket(id);
    w->id = (++j->next_watch << WATCH_ID_SHIFT) | b; /* unwatch finds the bucket */
    w->job_id = id;
    w->since = since_version;
    w->terminal_only = terminal_only;
    w->fn = fn;
    w->arg = arg;
    w->next = j->watches[b];
    j->watches[b] = w;
    if (watch_id)
        *watch_id = w->id;
    pthread_mutex_unlock(&j->mu);
    return 0;
}

/* Under mu: the watch named id, or NULL once it is gone. */
static struct watch *watch_find(struct jd_jobs *j, uint64_t id)
{
    for (struct watch *w = j->watches[id & (NBUCKETS - 1)]; w; w = w->next)
        if (w->id == id)
            return w;
    return NULL;
}

bool jd_jobs_unwatch(struct jd_jobs *j, uint64_t watch_id)
{
    if (!watch_id)
        return false;
    pthread_mutex_lock(&j->mu);
    struct watch *w = watch_find(j, watch_id);
    bool withdrawn = false;
    if (w && !w->fired) {
        /* Not due yet: gone for good. */
        watch_unlink(j, w);
        free(w);
        withdrawn = true;
    } else if (w && !w->running && !w->cancelled) {
        /* Due, but fn has not started (its firing thread has it in a list,
         * maybe behind other watches): it will skip fn and free w. */
        w->cancelled = true;
        withdrawn = true;
    } else if (w && w->running && !tls_in_watch_fn) {
        /* fn runs on another thread (this thread runs no watch fn): wait
         * until it has returned and its watch is gone. */
        while ((w = watch_find(j, watch_id)) && w->running)
            pthread_cond_wait(&j->cv, &j->mu);
    }
    pthread_mutex_unlock(&j->mu);
    return withdrawn;
}

/* ------------------------------------------------------------- reading */

int jd_jobs_get_json(struct jd_jobs *j, int64_t id, char **json, int64_t *version, bool *terminal)
{
    struct jd_job row = {0};
    int rc = jd_store_job_get(j->store, id, &row);
    if (rc)
        return rc;
    if (json)
        *json = jd_render_job_json(&row);
    if (version)
        *version = row.version;
    if (terminal)
        *terminal = jd_job_state_terminal(row.state);
    jd_job_clear(&row);
    return 0;
}

int jd_jobs_parse_id(const char *s, int64_t *id)
{
    if (!s || !*s || strlen(s) > 19)
        return JD_ENOENT;
    int64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return JD_ENOENT;
        if (v > (INT64_MAX - (*p - '0')) / 10)
            return JD_ENOENT;
        v = v * 10 + (*p - '0');
    }
    if (v <= 0)
        return JD_ENOENT;
    *id = v;
    return 0;
}

int jd_jobs_list_json(struct jd_jobs *j, const struct jd_jobs_list_query *q, char **json,
                      struct jd_error *err)
{
    jd_error_clear(err);
    struct jd_job_filter f = {.state = -1, .queue = q->queue, .limit = q->limit ? q->limit : 50};
    if (f.limit > 1000)
        f.limit = 1000;
    if (q->state && (f.state = jd_job_state_parse(q->state)) < 0)
        return jd_error_set(err, JD_EINVAL, NULL,
                            "unknown state \"%s\" (queued, running, waiting, succeeded, failed, "
                            "cancelled)",
                            q->state);
    if (q->cursor && q->cursor[0] && jd_jobs_parse_id(q->cursor, &f.before_id) != 0)
        return jd_error_set(err, JD_EINVAL, NULL, "bad cursor");
    struct jd_job *rows = NULL;
    size_t n = 0;
    int64_t next = 0;
    int rc = jd_store_job_list(j->store, &f, &rows, &n, &next);
    if (rc)
        return jd_error_set(err, rc, NULL, "listing jobs failed: %s", jd_strerror(rc));
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "jobs");
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, jd_render_job(&rows[i]));
    if (next > 0) {
        char c[24];
        snprintf(c, sizeof c, "%" PRId64, next);
        cJSON_AddStringToObject(o, "next_cursor", c);
    } else {
        cJSON_AddNullToObject(o, "next_cursor");
    }
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    jd_jobs_free(rows, n);
    return 0;
}

int jd_jobs_events_json(struct jd_jobs *j, int64_t id, int64_t after_seq, unsigned limit,
                        char **json)
{
    struct jd_job row = {0};
    if (jd_store_job_get(j->store, id, &row) != 0)
        return JD_ENOENT;
    jd_job_clear(&row);
    if (limit == 0 || limit > 10000)
        limit = limit ? 10000 : 1000;
    struct jd_job_event *ev = NULL;
    size_t n = 0;
    int rc = jd_store_events(j->store, id, after_seq, limit, &ev, &n);
    if (rc)
        return rc;
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "events");
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, jd_render_event(&ev[i]));
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    jd_job_events_free(ev, n);
    return 0;
}

int jd_jobs_events_each(struct jd_jobs *j, int64_t id, int64_t after_seq,
                        void (*fn)(void *arg, int64_t seq, const char *kind,
                                   const char *event_json),
                        void *arg)
{
    struct jd_job row = {0};
    if (jd_store_job_get(j->store, id, &row) != 0)
        return JD_ENOENT;
    jd_job_clear(&row);
    int count = 0;
    for (;;) {
        struct jd_job_event *ev = NULL;
        size_t n = 0;
        int rc = jd_store_events(j->store, id, after_seq, 1000, &ev, &n);
        if (rc)
            return rc;
        for (size_t i = 0; i < n; i++) {
            cJSON *o = jd_render_event(&ev[i]);
            char *t = cJSON_PrintUnformatted(o);
            fn(arg, ev[i].seq, jd_event_kind_name(ev[i].kind), t);
            free(t);
            cJSON_Delete(o);
            after_seq = ev[i].seq;
            count++;
        }
        jd_job_events_free(ev, n);
        if (n < 1000)
            break;
    }
    return count;
}

int jd_jobs_handlers_json(struct jd_jobs *j, char **json)
{
    cJSON *o = jd_render_handlers(j->reg);
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return 0;
}

int jd_jobs_queues_json(struct jd_jobs *j, char **json)
{
    struct jd_queue_counts *rows = NULL;
    size_t n = 0;
    int rc = jd_store_queue_counts(j->store, &rows, &n);
    if (rc)
        return rc;
    cJSON *o = jd_render_queues(rows, n);
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    jd_queue_counts_free(rows, n);
    return 0;
}

void jd_jobs_stats(struct jd_jobs *j, struct jd_jobs_stats *out)
{
    pthread_mutex_lock(&j->mu);
    *out = j->st;
    out->running = out->waiting = 0;
    for (unsigned b = 0; b < NBUCKETS; b++)
        for (struct job *jb = j->table[b]; jb; jb = jb->hnext) {
            if (jb->finished || !jb->spawned)
                continue;
            if (jb->state == JD_JOB_WAITING)
                out->waiting++;
            else if (jb->state == JD_JOB_RUNNING)
                out->running++;
        }
    pthread_mutex_unlock(&j->mu);
}

struct jd_sched *jd_jobs_sched(struct jd_jobs *j)
{
    return j->sched;
}

struct jd_registry *jd_jobs_registry(struct jd_jobs *j)
{
    return j->reg;
}

/* ------------------------------------------------------- plugin environment */

static uint64_t env_timer_after(void *ctx, uint64_t delay_ms, void (*fn)(void *arg), void *arg)
{
    struct jd_jobs *j = ctx;
    uint64_t id = 0;
    if (jd_sched_timer_after(j->sched, delay_ms * 1000000u, fn, arg, &id) != 0)
        return 0;
    return id + 1; /* the registry wants ids > 0 */
}

static int env_timer_cancel(void *ctx, uint64_t id)
{
    struct jd_jobs *j = ctx;
    return id && jd_sched_timer_cancel(j->sched, id - 1) == 0 ? 0 : 1;
}

static int env_run_blocking(void *ctx, void (*fn)(void *arg), void *arg)
{
    struct jd_jobs *j = ctx;
    return jd_sched_run_blocking(j->sched, fn, arg);
}

static const char *env_config(void *ctx, const char *key)
{
    struct jd_jobs *j = ctx;
    if (strcmp(key, "exec_allow") == 0)
        return j->exec_allow;
    if (strcmp(key, "http_allow") == 0)
        return j->http_allow;
    if (strcmp(key, "output_cap") == 0)
        return j->output_cap;
    return NULL;
}

/* ---------------------------------------------------------------- replay */

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
    struct job *jb = job_new(rc->j, parse_stored(row->definition), row->id, row->created_ms);
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
             * replayed process yields the tag again (hook_dispatch). A
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
            dlv_append(jb, c);
            break;
        }
        case JD_EVK_MESSAGE: {
            cJSON_DeleteItemFromObjectCaseSensitive(d, "run");
            struct dlv *m = jd_xcalloc(1, sizeof *m);
            m->message = true;
            m->data = cJSON_PrintUnformatted(d);
            dlv_append(jb, m);
            break;
        }
        case JD_EVK_CANCEL:
            jb->cancel_requested = true;
            break;
        case JD_EVK_STATE:
            break;
        }
        cJSON_Delete(d);
    }
    jb->qnext = rc->list;
    rc->list = jb;
    return 0;
}

/* ---------------------------------------------------------------- create */

int jd_jobs_create(const struct jd_jobs_config *cfg, struct jd_jobs **out, struct jd_error *err)
{
    jd_error_clear(err);
    *out = NULL;
    struct jd_jobs *j = jd_xcalloc(1, sizeof *j);
    int rc;
    j->store = cfg->store;
    j->limits = jd_jobdef_limits(&cfg->limits);
    j->cancel_grace_ms = cfg->cancel_grace_ms > 0 ? cfg->cancel_grace_ms : 5000;
    j->max_running = cfg->max_running ? cfg->max_running : 10000;
    j->exec_allow = jd_xstrdup(cfg->exec_allow);
    j->http_allow = jd_xstrdup(cfg->http_allow);
    snprintf(j->output_cap, sizeof j->output_cap, "%zu",
             cfg->output_cap ? cfg->output_cap : (size_t)64 << 10);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    /* Commit callbacks (rendering answers, waking connections, starting and
     * freeing jobs) on the store's completion thread, off the serial writer.
     * On failure they stay on the writer, which is correct, only slower. */
    if (jd_store_done_thread(j->store) != 0)
        jd_log(JD_LOG_WARN, "no completion thread; commit callbacks run on the writer", NULL);

    struct jd_sched_config sc = {
        .workers = cfg->workers,
        .blocking_threads = cfg->blocking_threads,
        .pin_workers = cfg->pin_workers,
        .hooks = {.ctx = j,
                  .dispatch = hook_dispatch,
                  .stepped = hook_stepped,
                  .finished = hook_finished},
    };
    if ((rc = jd_sched_create(&sc, &j->sched))) {
        jd_error_set(err, rc, NULL, "cannot start the scheduler: %s", jd_strerror(rc));
        goto fail;
    }
    struct jd_plugin_env env = {.ctx = j,
                                .timer_after = env_timer_after,
                                .timer_cancel = env_timer_cancel,
                                .run_blocking = env_run_blocking,
                                .config = env_config};
    if ((rc = jd_registry_create(&env, &j->reg))) {
        jd_error_set(err, rc, NULL, "cannot create the plugin registry: %s", jd_strerror(rc));
        goto fail;
    }
    if (cfg->plugin_dir && (rc = jd_registry_load_dir(j->reg, cfg->plugin_dir, NULL, err)))
        goto fail;
    if (cfg->register_plugins && (rc = cfg->register_plugins(cfg->register_arg, j->reg))) {
        if (err && !err->message[0])
            jd_error_set(err, rc, NULL, "registering in-process plugins failed: %s",
                         jd_strerror(rc));
        goto fail;
    }
    jd_registry_freeze(j->reg);

    char **paused = NULL;
    size_t npaused = 0;
    if (jd_store_paused_queues(j->store, &paused, &npaused) == 0) {
        for (size_t i = 0; i < npaused; i++)
            queue_get(j, paused[i])->paused = true;
        jd_strings_free(paused, npaused);
    }

    struct recover_ctx rctx = {.j = j};
    if ((rc = jd_store_recover(j->store, recover_one, &rctx))) {
        jd_error_set(err, rc, NULL, "reading jobs to resume failed: %s", jd_strerror(rc));
        while (rctx.list) {
            struct job *n = rctx.list->qnext;
            job_free(rctx.list);
            rctx.list = n;
        }
        goto fail;
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
        job_insert(j, jb);
        bool start = false;
        if (jb->state == JD_JOB_QUEUED) {
            if (jb->cancel_requested) {
                jb->finished = true;
                struct wrec *r = state_rec(j, jb, JD_JOB_CANCELLED, AFTER_FINAL);
                r->error = err_json("cancelled", "the job was cancelled before it ran");
                r->w.set |= JD_SET_ERROR | JD_SET_FINISHED;
                r->w.error = r->error;
                r->w.finished_ms = jd_wall_ms();
                record(r);
            } else {
                enqueue_locked(j, jb);
            }
        } else {
            jb->admitted = true;
            j->running++;
            start = true;
        }
        pthread_mutex_unlock(&j->mu);
        if (start) {
            start_job(j, jb, true);
            resumed++;
        }
    }
    if (resumed)
        jd_logf(JD_LOG_INFO, "resumed %u running jobs", resumed);
    admit(j);
    *out = j;
    return 0;
fail:
    if (j->reg)
        jd_registry_destroy(j->reg);
    if (j->sched)
        jd_sched_destroy(j->sched);
    free(j->exec_allow);
    free(j->http_allow);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
    return rc;
}

int jd_jobs_drain(struct jd_jobs *j, int64_t grace_ms)
{
    pthread_mutex_lock(&j->mu);
    if (j->drained) {
        pthread_mutex_unlock(&j->mu);
        return 0;
    }
    j->draining = true;
    /* Let calls in flight finish (and be recorded) within the grace period. */
    uint64_t deadline = jd_now_ns() + (uint64_t)(grace_ms > 0 ? grace_ms : 0) * 1000000u;
    while (j->inflight_calls > 0 && jd_now_ns() < deadline) {
        pthread_mutex_unlock(&j->mu);
        usleep(2000);
        pthread_mutex_lock(&j->mu);
    }
    j->stopping = true;
    size_t n = 0, cap = 0;
    struct job **v = NULL;
    for (unsigned b = 0; b < NBUCKETS; b++)
        for (struct job *jb = j->table[b]; jb; jb = jb->hnext) {
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                v = jd_xrealloc(v, cap * sizeof *v);
            }
            jb->refs++;
            v[n++] = jb;
        }
    pthread_mutex_unlock(&j->mu);
    for (size_t i = 0; i < n; i++)
        cancel_inflight(j, v[i]);
    int rc = jd_sched_shutdown(j->sched, 0, NULL);
    jd_store_sync(j->store);
    pthread_mutex_lock(&j->mu);
    for (size_t i = 0; i < n; i++)
        job_unref(v[i]);
    free(v);
    struct fire *fires = NULL;
    for (unsigned b = 0; b < NBUCKETS; b++) {
        for (struct watch *w = j->watches[b]; w; w = w->next) {
            if (w->fired)
                continue; /* another thread fires it */
            w->fired = true;
            struct fire *f = jd_xcalloc(1, sizeof *f);
            f->w = w;
            f->rc = JD_ESHUTDOWN;
            f->next = fires;
            fires = f;
        }
    }
    j->drained = true;
    pthread_mutex_unlock(&j->mu);
    watches_fire(j, fires, JD_ESHUTDOWN);
    return rc == JD_ETIMEOUT ? 0 : rc;
}

void jd_jobs_destroy(struct jd_jobs *j)
{
    if (!j)
        return;
    jd_jobs_drain(j, 0);
    jd_registry_destroy(j->reg);
    jd_sched_destroy(j->sched);
    jd_store_sync(j->store);
    /* No thread calls in any more: free what is left, whatever its refs. */
    for (unsigned b = 0; b < NBUCKETS; b++) {
        struct job *jb = j->table[b];
        while (jb) {
            struct job *n = jb->hnext;
            for (struct jtimer *t = jb->timers, *tn; t; t = tn) {
                tn = t->next;
                jtimer_free(t);
            }
            for (struct call *c = jb->calls, *cn; c; c = cn) {
                cn = c->next;
                free(c->command);
                free(c->args);
                free(c);
            }
            job_free(jb);
            jb = n;
        }
    }
    for (unsigned b = 0; b < NBUCKETS; b++) /* drain fired them all; none left running */
        while (j->watches[b]) {
            struct watch *w = j->watches[b];
            j->watches[b] = w->next;
            free(w);
        }
    while (j->queues) {
        struct queue *q = j->queues;
        j->queues = q->next;
        free(q->name);
        free(q);
    }
    while (j->idems) {
        struct idem *i = j->idems;
        j->idems = i->next;
        free(i->key);
        free(i);
    }
    free(j->exec_allow);
    free(j->http_allow);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}
