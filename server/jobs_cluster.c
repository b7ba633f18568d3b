/*
 * The job layer in a cluster (a clustered store: storage/store.h, "the
 * cluster"; jobs.h's jd_jobs_cluster_*). A node starts with no jobs: one
 * thread, the cluster thread, does five chores, each on its hint from the
 * store and once a second as a fallback:
 *
 *   claim     jd_store_claim as many unowned jobs as the node has room for
 *             (max_running less the jobs it holds, at most 256 a batch) and
 *             resume each from its history (jobs_resume_claimed_locked);
 *   requests  take the inbox requests of jobs this node owns, in id order,
 *             and apply each through the local cancel/message path with
 *             w.request_id, so that its commit also deletes it;
 *   queues    pause flags and controls follow the store (another node may
 *             set them);
 *   watches   jobs this node does not hold do not commit here, so watches on
 *             them (?wait=, SSE) fire from change notices, after a re-read
 *             of the row; every second all such watched jobs are re-read.
 *             Watches on any job (/v1/events) wake on every notice.
 *             Writers send job-change notices only while some node wants
 *             them (storage/pg.h, JD_PG_WATCH_LOCK_SQL): such a watch turns
 *             them on before its first read (jobs_cluster_want_notices);
 *             once a second, when none is left and none started for
 *             NOTICES_HOLD_MS, this node's want is withdrawn;
 *
 *   grants    a queue with max_running or a rate holds it cluster-wide: its
 *             ready jobs start only once the database granted them
 *             (jd_store_queue_grant), asked for when such a job becomes
 *             ready, when one ends, on a claim notice (another node left a
 *             slot to this node's jobs), once a second, and when a rate's
 *             next token is due;
 *
 * Requests are read after a cursor (the highest id handed on), so one being
 * committed is not taken twice; the cursor goes back to 0 when none is in
 * flight, so one left over (its job was not here yet) is tried again.
 *
 * A write fenced by the store (JD_ESTALE: another node owns the job now)
 * drops the job here: jobs_cluster_fenced_locked marks it lost and ends its
 * process; nothing more of it is recorded, its end neither (jobs_record.c).
 *
 * Threading: the hooks run on the store's threads and only queue work under
 * cl->mu (never with jd_jobs.mu). The cluster thread takes jd_jobs.mu like
 * the live paths do and never holds cl->mu with it.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CLAIM_MAX 256         /* jobs one claim takes at most (the store's bound) */
#define REQUESTS_MAX 256      /* inbox requests read at once */
#define RECHECK_MAX 4096      /* watched jobs re-read in one fallback pass */
#define CHANGES_MAX 65536     /* noticed ids kept before "re-read them all" */
#define NOTICES_HOLD_MS 30000 /* notices stay wanted this long after the last watch started */
/* After a failure to turn them on, not again before this: the try waits
 * on the watch lock (JD_STORE_WATCH_LOCK_MS), and every node's batches
 * queue behind it meanwhile, so a node stalled inside a batch (it holds
 * the lock shared until PostgreSQL ends its transaction, about a lease)
 * must not have this try every second. The once-a-second re-read covers
 * the watches meanwhile. */
#define NOTICES_RETRY_MS 5000

struct jobs_cluster {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool on, stop;
    bool want_claim, want_requests, want_all;
    bool want_grants;  /* a limited queue has ready jobs without grants */
    uint64_t grant_at; /* jd_now_ns: ask again then (a rate's next token); 0: no */
    int64_t *ids;      /* noticed changes of jobs (ids), for watches */
    size_t nids, cap;
    /* Requests: the cursor and how many are being committed. */
    int64_t req_after;
    unsigned req_inflight;
    _Atomic uint64_t applied;
    _Atomic bool stopping;
    /* Job-change notices wanted (jd_store_watch_notices). notices_on and
     * watch_ms pair up like Dekker's flags (seq_cst): a watch stores
     * watch_ms then loads notices_on; the sweep stores notices_on false
     * then loads watch_ms, so one of them sees the other. */
    pthread_mutex_t notice_mu; /* turning them on or off, one at a time */
    _Atomic bool notices_on;
    _Atomic int64_t watch_ms;  /* jobs_mono_ms of the last watch that wanted them */
    int64_t notices_failed_ms; /* under notice_mu: the last failure to turn them on */
};

static void hint(struct jobs_cluster *c, bool claim, bool requests)
{
    pthread_mutex_lock(&c->mu);
    c->want_claim |= claim;
    c->want_requests |= requests;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void jd_jobs_cluster_claimable(struct jd_jobs *j)
{
    if (j->cl)
        hint(j->cl, true, false);
}

void jd_jobs_cluster_requests(struct jd_jobs *j)
{
    if (j->cl)
        hint(j->cl, false, true);
}

void jd_jobs_cluster_changed(struct jd_jobs *j, const struct jd_job_change *ch, size_t n)
{
    struct jobs_cluster *c = j->cl;
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    if (n == 0 || c->nids + n > CHANGES_MAX) {
        c->want_all = true;
        c->nids = 0;
    } else if (!c->want_all) {
        if (c->nids + n > c->cap) {
            c->cap = (c->nids + n) * 2;
            c->ids = jd_xrealloc(c->ids, c->cap * sizeof *c->ids);
        }
        for (size_t i = 0; i < n; i++)
            c->ids[c->nids++] = ch[i].id;
    }
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

uint64_t jd_jobs_cluster_requests_applied(struct jd_jobs *j)
{
    return j->cl ? atomic_load(&j->cl->applied) : 0;
}

bool jd_jobs_cluster_watching(struct jd_jobs *j)
{
    return j->cl && atomic_load(&j->cl->notices_on);
}

void jobs_cluster_lease_wait(struct jd_jobs *j)
{
    struct jobs_cluster *c = j->cl;
    if (!c || jd_store_lease_ok(j->store))
        return;
    static _Atomic int64_t logged_ms;
    int64_t now = jobs_mono_ms(), last = atomic_load(&logged_ms);
    if (now - last >= 1000 && atomic_compare_exchange_strong(&logged_ms, &last, now))
        jd_log(JD_LOG_WARN, "the lease is near its end: handler calls wait for a heartbeat", NULL);
    /* Until a heartbeat renews it, or the node starts over (lease lost). */
    while (!atomic_load(&c->stopping) && !jd_store_lease_ok(j->store))
        usleep(20000);
}

void jobs_cluster_fenced_locked(struct jd_jobs *j, struct job *jb, jd_pid *kill)
{
    *kill = 0;
    if (jb->lost)
        return;
    jb->lost = true;
    jd_logf(JD_LOG_WARN, "job %" PRId64 ": another node owns it now; dropped here", jb->id);
    if (jb->spawned && !jb->finished)
        *kill = jb->pid;
    else if (!jb->spawned && !jb->finished) {
        jb->finished = true;
        jobs_ready_remove(j, jb);
        jobs_run_at_cancel_locked(j, jb);
        jobs_job_remove(j, jb);
    }
}

/* ---- watches on jobs held elsewhere ---- */

bool jobs_cluster_held(const struct job *jb)
{
    return jb && !jb->unowned; /* an unowned one leaves at its commit, for any node */
}

void jobs_cluster_want_notices(struct jd_jobs *j)
{
    struct jobs_cluster *c = j->cl;
    if (!c)
        return;
    int64_t now = jobs_mono_ms();
    atomic_store(&c->watch_ms, now);
    if (atomic_load(&c->notices_on))
        return;
    pthread_mutex_lock(&c->notice_mu);
    if (!atomic_load(&c->notices_on) &&
        (!c->notices_failed_ms || now - c->notices_failed_ms >= NOTICES_RETRY_MS)) {
        if (jd_store_watch_notices(j->store, true) == 0) {
            atomic_store(&c->notices_on, true);
            c->notices_failed_ms = 0;
        } else {
            c->notices_failed_ms = now; /* the once-a-second re-read covers it */
        }
    }
    pthread_mutex_unlock(&c->notice_mu);
}

/* Under mu: whether a pending watch wants notices (jobs_cluster_held). */
static bool notices_wanted_locked(struct jd_jobs *j)
{
    for (unsigned b = 0; b < NBUCKETS; b++)
        for (struct watch *w = j->watches[b]; w; w = w->next)
            if (!w->fired && (w->job_id == 0 || !jobs_cluster_held(jobs_job_find(j, w->job_id))))
                return true;
    return false;
}

/* Once a second: withdraw this node's want of notices when no watch needs
 * them and none started for NOTICES_HOLD_MS (an event stream re-arms its
 * watch after each wake, a long-poll client comes back). */
static void notices_sweep(struct jd_jobs *j)
{
    struct jobs_cluster *c = j->cl;
    if (!atomic_load(&c->notices_on))
        return;
    pthread_mutex_lock(&c->notice_mu);
    atomic_store(&c->notices_on, false); /* a watch starting now takes notice_mu */
    bool keep = jobs_mono_ms() - atomic_load(&c->watch_ms) < NOTICES_HOLD_MS;
    if (!keep) {
        pthread_mutex_lock(&j->mu);
        keep = notices_wanted_locked(j);
        pthread_mutex_unlock(&j->mu);
    }
    if (keep || jd_store_watch_notices(j->store, false) != 0)
        atomic_store(&c->notices_on, true);
    pthread_mutex_unlock(&c->notice_mu);
}

/* Under mu: whether some pending watch waits on job id. */
static bool watched_locked(struct jd_jobs *j, int64_t id)
{
    for (struct watch *w = j->watches[jobs_bucket(id)]; w; w = w->next)
        if (!w->fired && w->job_id == id)
            return true;
    return false;
}

/* Under mu: fire the watches on id (not held here) that its stored row
 * (version, terminal) satisfies, onto *list. */
static void collect_remote_locked(struct jd_jobs *j, int64_t id, int64_t version, bool terminal,
                                  struct fire **list)
{
    for (struct watch *w = j->watches[jobs_bucket(id)]; w; w = w->next) {
        if (!w->fired && w->job_id == id && version > w->since && (!w->terminal_only || terminal)) {
            w->fired = true;
            struct fire *f = jd_xcalloc(1, sizeof *f);
            f->w = w;
            f->version = version;
            f->next = *list;
            *list = f;
        }
    }
}

/* Under mu: the watches on any job (the event stream) wake: a commit. */
static void collect_any_locked(struct jd_jobs *j, struct fire **list)
{
    j->commits++;
    for (struct watch *w = j->watches[jobs_bucket(0)]; w; w = w->next) {
        if (!w->fired && w->job_id == 0 && (int64_t)j->commits > w->since) {
            w->fired = true;
            struct fire *f = jd_xcalloc(1, sizeof *f);
            f->w = w;
            f->version = (int64_t)j->commits;
            f->next = *list;
            *list = f;
        }
    }
}

static int cmp_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Re-read ids (sorted here, duplicates skipped) that are watched and not
 * held here, and fire what they satisfy; all: also every other such watched
 * job (at most RECHECK_MAX). */
static void recheck(struct jd_jobs *j, int64_t *ids, size_t n, bool all)
{
    struct fire *fires = NULL;
    int64_t *want = NULL;
    size_t nw = 0;
    pthread_mutex_lock(&j->mu);
    bool any_remote = all;
    if (all) {
        want = jd_xcalloc(RECHECK_MAX, sizeof *want);
        for (unsigned b = 0; b < NBUCKETS && nw < RECHECK_MAX; b++)
            for (struct watch *w = j->watches[b]; w && nw < RECHECK_MAX; w = w->next)
                if (!w->fired && w->job_id != 0 && !jobs_job_find(j, w->job_id))
                    want[nw++] = w->job_id;
    } else {
        qsort(ids, n, sizeof *ids, cmp_id);
        want = jd_xcalloc(n ? n : 1, sizeof *want);
        for (size_t i = 0; i < n; i++) {
            if (i && ids[i] == ids[i - 1])
                continue;
            if (jobs_job_find(j, ids[i]))
                continue; /* its commits fire its watches here */
            any_remote = true;
            if (watched_locked(j, ids[i]))
                want[nw++] = ids[i];
        }
    }
    if (any_remote)
        collect_any_locked(j, &fires);
    pthread_mutex_unlock(&j->mu);
    jobs_watches_fire(j, fires, 0);
    fires = NULL;
    for (size_t i = 0; i < nw; i++) {
        struct jd_job row = {0};
        if (jd_store_job_get(j->store, want[i], &row) != 0)
            continue; /* deleted: a watch on it times out */
        pthread_mutex_lock(&j->mu);
        if (!jobs_job_find(j, want[i]))
            collect_remote_locked(j, want[i], row.version, jd_job_state_terminal(row.state),
                                  &fires);
        pthread_mutex_unlock(&j->mu);
        jd_job_clear(&row);
    }
    jobs_watches_fire(j, fires, 0);
    free(want);
}

/* ---- claims ---- */

struct claim_ctx {
    struct jd_jobs *j;
    struct job **starts;
    size_t n, cap;
};

static int claim_one(void *arg, const struct jd_job *row, const struct jd_job_event *ev, size_t n)
{
    struct claim_ctx *cx = arg;
    struct jd_jobs *j = cx->j;
    struct job *jb = jobs_job_from_row(j, row, ev, n);
    pthread_mutex_lock(&j->mu);
    struct job *have = jobs_job_find(j, row->id);
    if (have && have->unowned) { /* our own submit past the window, not yet placed */
        have->unowned = false;   /* its commit callback places it as ours */
        pthread_mutex_unlock(&j->mu);
        jobs_job_free(jb);
        return 0;
    }
    if (have) { /* cannot be: it was nobody's */
        pthread_mutex_unlock(&j->mu);
        jd_logf(JD_LOG_WARN, "job %" PRId64 ": claimed but already held here", row->id);
        jobs_job_free(jb);
        return 0;
    }
    if (jobs_resume_claimed_locked(j, jb)) {
        if (cx->n == cx->cap) {
            cx->cap = cx->cap ? cx->cap * 2 : 16;
            cx->starts = jd_xrealloc(cx->starts, cx->cap * sizeof *cx->starts);
        }
        cx->starts[cx->n++] = jb;
    }
    pthread_mutex_unlock(&j->mu);
    return 0;
}

/* Claim a batch; true if it was full (there may be more). */
static bool claim_some(struct jd_jobs *j)
{
    if (!jd_store_lease_ok(j->store))
        return false;
    pthread_mutex_lock(&j->mu);
    unsigned room =
        j->draining || j->live >= j->max_running ? 0 : j->max_running - (unsigned)j->live;
    unsigned wroom = jobs_window_claim_room_locked(j); /* queued jobs held: the window */
    room = wroom < room ? wroom : room;
    pthread_mutex_unlock(&j->mu);
    unsigned limit = room < CLAIM_MAX ? room : CLAIM_MAX;
    if (limit == 0)
        return false;
    struct claim_ctx cx = {.j = j};
    size_t n = 0;
    int rc = jd_store_claim(j->store, limit, claim_one, &cx, &n);
    if (rc)
        jd_logf(JD_LOG_WARN, "claiming jobs failed: %s", jd_strerror(rc));
    for (size_t i = 0; i < cx.n; i++)
        jobs_start_job(j, cx.starts[i], true);
    free(cx.starts);
    if (n) {
        jd_logf(JD_LOG_INFO, "claimed %zu jobs (%zu resumed running)", n, cx.n);
        jobs_admit(j);
    }
    return rc == 0 && n == limit;
}

/* ---- grants: cluster-wide queue limits ---- */

#define GRANT_ASK_MAX 64  /* ready jobs of one queue offered in one ask */
#define GRANT_TURN_MS 500 /* how long a node leaves free slots to the nodes whose jobs are next */
#define GRANT_GAP_MS 20   /* a node waiting its turn asks at most this often (notices echo) */

void jobs_cluster_grants_wanted_locked(struct jd_jobs *j)
{
    struct jobs_cluster *c = j->cl;
    if (!c) /* lock order: jd_jobs.mu before cl->mu, never the reverse */
        return;
    pthread_mutex_lock(&c->mu);
    if (!c->want_grants) {
        c->want_grants = true;
        pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

struct grant_ask {
    struct queue *q;
    char *config;
    struct jd_queue_grant_ask a;
    int64_t ids[GRANT_ASK_MAX];
};

/* Ask the database for grants for every limited queue with ready jobs not
 * granted yet, within the node's free slots; start what they let in.
 * Returns when to ask again for a rate (jd_now_ns; 0: on a hint). */
static uint64_t grant_some(struct jd_jobs *j)
{
    if (!jd_store_lease_ok(j->store))
        return 0;
    struct grant_ask *asks = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&j->mu);
    unsigned granted = 0;
    for (struct queue *q = j->queues; q; q = q->next)
        granted += q->ngranted;
    unsigned room = j->draining || j->running + granted >= j->max_running
                        ? 0
                        : j->max_running - j->running - granted;
    int64_t now = jd_wall_ms(), mono = jobs_mono_ms();
    uint64_t again = 0;
    for (struct queue *q = j->queues; q; q = q->next) {
        bool freed = q->freed;
        q->freed = false;
        if (!jobs_queue_pooled(j, q) || ((q->paused || q->nready <= q->ngranted) && !freed))
            continue;
        if (q->grant_blocked_ms && mono - q->grant_asked_ms < GRANT_GAP_MS && !freed) {
            /* its last ask left turns to others, and told them: not again
             * at once (that notice wakes this node as well) */
            uint64_t at = jd_now_ns() + (uint64_t)GRANT_GAP_MS * 1000000u;
            if (!again || at < again)
                again = at;
            continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 4;
            asks = jd_xrealloc(asks, cap * sizeof *asks);
        }
        struct grant_ask *g = &asks[n];
        memset(g, 0, sizeof *g);
        size_t k = 0;
        struct job *first = NULL;
        for (struct job *jb = q->paused ? NULL : q->head; jb && k < GRANT_ASK_MAX && k < room;
             jb = jb->qnext)
            if (!jb->granted) {
                first = first ? first : jb;
                g->ids[k++] = jb->id;
            }
        if (k == 0 && !freed)
            continue; /* (a freed slot with none of its own ready still asks: that tells
                       * the nodes whose jobs are next) */
        room -= (unsigned)k;
        g->q = q;
        g->config = jobs_queue_controls_text_locked(q);
        g->a = (struct jd_queue_grant_ask){.queue = q->name, /* queues live until destroy */
                                           .config = g->config,
                                           .max_running = q->ctl.max_running,
                                           .rate_limit = q->ctl.rate_limit,
                                           .rate_per_ms = q->ctl.rate_per_ms,
                                           .ids = g->ids,
                                           .nids = k,
                                           .head_priority = first ? first->priority : 0,
                                           .head_created_ms = first ? first->created_ms : 0,
                                           .now_ms = now,
                                           .take_any = q->grant_blocked_ms &&
                                                       mono - q->grant_blocked_ms >= GRANT_TURN_MS};
        q->grant_asked_ms = mono;
        n++;
    }
    pthread_mutex_unlock(&j->mu);
    bool stale = false, any = false;
    for (size_t i = 0; i < n; i++) {
        struct grant_ask *g = &asks[i];
        int64_t got[GRANT_ASK_MAX], retry_ms = 0;
        size_t ng = 0;
        bool others = false;
        int rc = jd_store_queue_grant(j->store, &g->a, got, &ng, &retry_ms, &others);
        free(g->config);
        if (rc == JD_ESTALE) {
            stale = true; /* the controls changed elsewhere, or the lease lapsed */
            continue;
        }
        if (rc) {
            again = jd_now_ns() + 1000000000u; /* logged by the store */
            continue;
        }
        pthread_mutex_lock(&j->mu);
        /* Other nodes' jobs were next and they were told: their turn. If
         * they do not take it (a stalled node, one with no room), this node
         * takes the free slots for its own GRANT_TURN_MS later. */
        if (others && ng < g->a.nids) {
            if (!g->q->grant_blocked_ms)
                g->q->grant_blocked_ms = jobs_mono_ms();
            uint64_t at = jd_now_ns() + (uint64_t)GRANT_TURN_MS * 1000000u;
            if (!again || at < again)
                again = at;
        } else if (g->a.nids) {
            g->q->grant_blocked_ms = 0;
        }
        if (retry_ms > 0) {
            g->q->rate_waits++;
            uint64_t at = jd_now_ns() + (uint64_t)retry_ms * 1000000u;
            if (!again || at < again)
                again = at;
        }
        for (size_t k = 0; k < ng; k++) {
            struct job *jb = jobs_job_find(j, got[k]);
            if (!jb || jb->granted || jb->admitted || jb->finished)
                continue; /* gone meanwhile: the grant lapses with its state */
            jb->granted = true;
            if (jb->in_ready)
                g->q->ngranted++;
            any = true;
        }
        pthread_mutex_unlock(&j->mu);
    }
    free(asks);
    if (stale)
        jobs_queue_controls_sync(j);
    if (any)
        jobs_admit(j);
    return again;
}

/* ---- the inbox ---- */

static void request_done(void *arg, int rc, const char *json)
{
    (void)json;
    struct jd_jobs *j = arg;
    struct jobs_cluster *c = j->cl;
    if (rc == 0)
        atomic_fetch_add(&c->applied, 1);
    pthread_mutex_lock(&c->mu);
    c->req_inflight--;
    pthread_mutex_unlock(&c->mu);
}

/* Apply a page of requests; true if it was full. */
static bool apply_requests(struct jd_jobs *j)
{
    struct jobs_cluster *c = j->cl;
    pthread_mutex_lock(&c->mu);
    int64_t after = c->req_after;
    pthread_mutex_unlock(&c->mu);
    struct jd_job_request *rows = NULL;
    size_t n = 0;
    int rc = jd_store_requests(j->store, after, REQUESTS_MAX, &rows, &n);
    if (rc) {
        jd_logf(JD_LOG_WARN, "reading the inbox failed: %s", jd_strerror(rc));
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        struct jd_job_request *q = &rows[i];
        pthread_mutex_lock(&c->mu);
        if (q->id > c->req_after)
            c->req_after = q->id;
        c->req_inflight++;
        pthread_mutex_unlock(&c->mu);
        if (q->kind == JD_EVK_CANCEL)
            rc = jobs_cancel_request(j, q->job_id, q->id, request_done, j);
        else
            rc = jobs_message_request(j, q->job_id, q->data ? q->data : "{}", q->id, request_done,
                                      j);
        if (rc) { /* not here (yet), ended, or over its limits: tried again later */
            jd_logf(JD_LOG_DEBUG, "job %" PRId64 ": inbox request %" PRId64 " not applied: %s",
                    q->job_id, q->id, jd_strerror(rc));
            pthread_mutex_lock(&c->mu);
            c->req_inflight--;
            pthread_mutex_unlock(&c->mu);
        }
    }
    jd_job_requests_free(rows, n);
    return n == REQUESTS_MAX;
}

/* ---- queue pauses ---- */

/* Another node may pause or resume a queue: the flags follow the store
 * (once a second; a local change applies at its commit as before). */
static void sync_paused(struct jd_jobs *j)
{
    char **names = NULL;
    size_t n = 0;
    if (jd_store_paused_queues(j->store, &names, &n) != 0)
        return;
    struct job *start = NULL;
    bool resumed = false;
    pthread_mutex_lock(&j->mu);
    for (struct queue *q = j->queues; q; q = q->next) {
        bool p = false;
        for (size_t i = 0; i < n && !p; i++)
            p = strcmp(names[i], q->name) == 0;
        resumed |= q->paused && !p;
        q->paused = p;
    }
    for (size_t i = 0; i < n; i++)
        jobs_queue_get(j, names[i])->paused = true;
    if (resumed && !j->draining)
        jobs_admit_locked(j, &start);
    pthread_mutex_unlock(&j->mu);
    jd_strings_free(names, n);
    jobs_start_list(j, start);
}

/* ---- the thread ---- */

static void *cluster_main(void *arg)
{
    struct jd_jobs *j = arg;
    struct jobs_cluster *c = j->cl;
    uint64_t next_tick = 0; /* the first pass does everything */
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        uint64_t now = jd_now_ns();
        bool tick = now >= next_tick;
        bool grant_due = c->grant_at && now >= c->grant_at;
        if (!tick && !grant_due && !c->want_claim && !c->want_requests && !c->want_all &&
            !c->want_grants && !c->nids) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t until = c->grant_at && c->grant_at < next_tick ? c->grant_at : next_tick;
            uint64_t wait = until - now;
            ts.tv_sec += (time_t)(wait / 1000000000u);
            ts.tv_nsec += (long)(wait % 1000000000u);
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
            continue;
        }
        if (tick) {
            next_tick = now + 1000000000u;
            c->want_claim = c->want_requests = c->want_all = true;
            if (c->req_inflight == 0)
                c->req_after = 0; /* left-over requests are tried again */
        }
        /* A claim notice also says a limited queue's slot may be free. */
        bool grants = tick || grant_due || c->want_grants || c->want_claim;
        bool claim = c->want_claim, requests = c->want_requests, all = c->want_all;
        c->want_claim = c->want_requests = c->want_all = c->want_grants = false;
        if (grants)
            c->grant_at = 0;
        int64_t *ids = c->ids;
        size_t n = c->nids;
        c->ids = NULL;
        c->nids = c->cap = 0;
        pthread_mutex_unlock(&c->mu);

        if (tick) {
            notices_sweep(j);
            sync_paused(j);
            jobs_queue_controls_sync(j);
            jobs_tasks_sync_commands(j); /* remote commands set on other nodes */
        }
        if (all || n)
            recheck(j, ids, n, all);
        free(ids);
        bool more_requests = requests && apply_requests(j);
        bool more_claims = claim && claim_some(j);
        uint64_t grant_again = grants ? grant_some(j) : 0;

        pthread_mutex_lock(&c->mu);
        if (grant_again && (!c->grant_at || grant_again < c->grant_at))
            c->grant_at = grant_again;
        c->want_requests |= more_requests;
        c->want_claim |= more_claims;
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int jd_jobs_cluster_start(struct jd_jobs *j)
{
    if (!j->cl)
        return JD_EINVAL;
    struct jobs_cluster *c = j->cl;
    if (pthread_create(&c->thread, NULL, cluster_main, j) != 0)
        return JD_ENOMEM;
    c->on = true;
    return 0;
}

/* At create, for a clustered store (jobs.c). */
void jobs_cluster_init(struct jd_jobs *j)
{
    struct jobs_cluster *c = jd_xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_init(&c->notice_mu, NULL);
    j->cl = c;
}

void jobs_cluster_fini(struct jd_jobs *j)
{
    struct jobs_cluster *c = j->cl;
    if (!c)
        return;
    atomic_store(&c->stopping, true);
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->on)
        pthread_join(c->thread, NULL);
    c->on = false;
}

/* At destroy, after fini and once no commit callback can run. */
void jobs_cluster_free(struct jd_jobs *j)
{
    struct jobs_cluster *c = j->cl;
    if (!c)
        return;
    free(c->ids);
    pthread_mutex_destroy(&c->notice_mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
    j->cl = NULL;
}
