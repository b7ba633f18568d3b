/*
 * The queued-job window (--queue-window N, issue 17 item 4): a backlog
 * lives in the store, and memory holds per queue only about N of its next
 * queued jobs in run order (priority desc, then id asc: the ready lists'
 * order), read in from the store's jobs_queued index as they drain.
 *
 * Invariants (under jd_jobs.mu):
 *  - Due jobs: a queue that is not `partial` has every due queued job in
 *    memory (as without a window). A partial one has in memory every queued
 *    job ranked up to its `floor`, and its ready list holds only such jobs,
 *    so admission never runs a job while a better one waits in the store.
 *    When its ready list runs low (below N/2) the next page after the floor
 *    is read; a page shorter than asked means the queue is complete again.
 *    A ready list past 2N is cut back to N (the tail leaves memory) and the
 *    floor moves back to its new last job (epoch bumped: a page read from
 *    the old floor is thrown away).
 *  - Delayed jobs (run_at later): every one with (run_at_ms, id) up to
 *    later_pos is in memory on its run_at timer (later_mem of them, at most
 *    about N); a timer tick every LATER_TICK_MS reads those due within
 *    LATER_HORIZON_MS. A job that falls due is placed like a new one.
 *  - A job holding a unique key never leaves memory (the key index
 *    answers conflicts from memory): past the floor it is `parked`, out of
 *    the ready list, until a page reaches it.
 *  - A queued job only in the store has no struct job and no record in
 *    flight; a cancel or message reads it in first (`transient`), and it is
 *    placed once its record commits.
 *
 * Why pages cannot miss or double a job: a page is read without mu, from
 * a snapshot. A job committed before it is in the snapshot (read in unless
 * already in the table: dedupe by id). A job whose insert has not had its
 * commit callback yet is in the table (struct job made at submit), so the
 * page skips it and its callback decides later, with the new floor. What is
 * left is a job whose callback ran during the read, left it out of memory
 * (with the old floor) and is not in the snapshot: every job a callback
 * leaves out while a page is read is noted (drop_seen, the best ranked),
 * and the new floor stops just before it, so a later page reads it. The
 * delayed set does the same with later_pos. A job read in on demand is in
 * the table too.
 *
 * Threading: the *_locked functions under mu. Pages are read without mu on
 * the pager thread (pager_cv, under mu), or, if it could not start, in a
 * write barrier's done callback on the completion thread; at create, on the
 * creating thread. The later tick runs on the timer thread.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#define LATER_HORIZON_MS 10000 /* delayed jobs due within this are read in ahead */
#define LATER_TICK_MS 2000     /* how often the later set is topped up */

struct wpage {
    struct jd_write w;
    struct jd_jobs *j;
    struct queue *q; /* NULL: the later set */
};

struct page {
    struct jd_jobs *j;
    struct job *list, **tail;
    struct jd_queued_pos last; /* rank of the last row */
    int64_t last_run_at;
};

static void request_page_locked(struct jd_jobs *j, struct queue *q);
static size_t window_start(struct jd_jobs *j);

/* Is jb ranked up to f (priority desc, then id asc)? */
static bool up_to(const struct job *jb, struct jd_queued_pos f)
{
    return jb->priority > f.priority || (jb->priority == f.priority && jb->id <= f.id);
}

/* Is rank a before rank b? */
static bool rank_before(struct jd_queued_pos a, struct jd_queued_pos b)
{
    return a.priority > b.priority || (a.priority == b.priority && a.id < b.id);
}

static bool later_covers(const struct jd_jobs *j, const struct job *jb)
{
    return jb->run_at_ms < j->later_run_at ||
           (jb->run_at_ms == j->later_run_at && jb->id <= j->later_id);
}

static int page_one(void *arg, const struct jd_job *row, const struct jd_job_event *ev, size_t n)
{
    struct page *pg = arg;
    struct job *jb = jobs_job_from_row(pg->j, row, ev, n);
    if (jb->def)
        jd_jobdef_slim(jb->def); /* as a submit does: no parsed tree while it waits */
    if (!pg->tail)
        pg->tail = &pg->list;
    *pg->tail = jb;
    pg->tail = &jb->qnext;
    pg->last = (struct jd_queued_pos){row->priority, row->id};
    pg->last_run_at = row->run_at_ms;
    return 0;
}

static void page_free(struct job *list)
{
    while (list) {
        struct job *n = list->qnext;
        jobs_job_free(list);
        list = n;
    }
}

/* Under mu: jb (committed, queued, in the table, on no list or timer)
 * leaves memory; the store keeps it. */
static void window_out_locked(struct jd_jobs *j, struct job *jb)
{
    jb->transient = false;
    if (jb->ukey) {
        jb->parked = true;
        return;
    }
    jb->dropped = true;
    j->st.window_out++;
    jobs_job_remove(j, jb);
}

void jobs_window_gone_locked(struct jd_jobs *j, struct job *jb)
{
    struct queue *q = jb->qp ? jb->qp : jobs_queue_find(j, jb->queue);
    if (q && q->refilling && q->partial && !up_to(jb, q->floor)) {
        struct jd_queued_pos r = {jb->priority, jb->id};
        if (!q->drop_seen || rank_before(r, q->drop_min))
            q->drop_min = r;
        q->drop_seen = true;
    }
    if (j->later_paging && !later_covers(j, jb) &&
        (!j->later_drop_seen || jb->run_at_ms < j->later_drop_run_at ||
         (jb->run_at_ms == j->later_drop_run_at && jb->id < j->later_drop_id))) {
        j->later_drop_seen = true;
        j->later_drop_run_at = jb->run_at_ms;
        j->later_drop_id = jb->id;
    }
}

/* Under mu: a ready list past twice the window is cut back to it. */
static void shrink_locked(struct jd_jobs *j, struct queue *q)
{
    if (q->nready <= 2 * j->window)
        return;
    while (q->nready > j->window) {
        struct job *t = q->tail;
        t->refs++;
        jobs_ready_remove(j, t);
        window_out_locked(j, t);
        jobs_job_unref(t);
    }
    q->floor = (struct jd_queued_pos){q->tail->priority, q->tail->id};
    q->partial = true;
    q->epoch++;
}

void jobs_window_due_locked(struct jd_jobs *j, struct job *jb)
{
    struct queue *q = jobs_job_queue(j, jb);
    jb->transient = false;
    if (q->partial && !up_to(jb, q->floor)) {
        window_out_locked(j, jb); /* a page after the floor will read it */
        return;
    }
    jobs_ready_push(j, jb);
    shrink_locked(j, q);
}

void jobs_window_place_locked(struct jd_jobs *j, struct job *jb)
{
    jb->transient = false;
    if (jb->unowned) { /* any node claims it from the database */
        jb->unowned = false;
        jb->dropped = true;
        j->st.window_unowned++;
        jobs_job_remove(j, jb);
        return;
    }
    if (!j->window) {
        jobs_enqueue_locked(j, jb);
        return;
    }
    if (jb->run_at_ms > jd_wall_ms() + 1) {
        bool covered = later_covers(j, jb);
        if (jb->ukey || (covered && j->later_mem < j->window)) {
            jobs_enqueue_locked(j, jb);
            return;
        }
        if (covered) { /* no room: the later set now ends before it */
            j->later_run_at = jb->run_at_ms;
            j->later_id = jb->id - 1;
            j->later_epoch++;
            j->later_full = true;
        }
        window_out_locked(j, jb);
        return;
    }
    jobs_window_due_locked(j, jb);
}

void jobs_window_low_locked(struct jd_jobs *j, struct queue *q)
{
    if (!j->window || !q->partial || q->refilling || j->draining || j->stopping)
        return;
    unsigned low = j->window / 2 ? j->window / 2 : 1;
    if (q->nready < low)
        request_page_locked(j, q);
}

void jobs_window_later_done_locked(struct jd_jobs *j, struct job *jb)
{
    if (!jb->later)
        return;
    jb->later = false;
    j->later_mem--;
    if (j->later_full && !j->later_paging && j->later_mem <= j->window / 2 && !j->draining &&
        !j->stopping)
        request_page_locked(j, NULL);
}

/* Under mu: put a page's jobs in memory (q: a queue's page, all due; only
 * those ranked up to its new floor; NULL: the later set's, only those up
 * to later_pos). Returns the rest, not applied. */
static struct job *apply_locked(struct jd_jobs *j, struct job *list, struct queue *q)
{
    struct job *rest = NULL;
    while (list) {
        struct job *jb = list;
        list = jb->qnext;
        jb->qnext = NULL;
        if (q ? q->partial && !up_to(jb, q->floor) : !later_covers(j, jb)) {
            jb->qnext = rest;
            rest = jb;
            continue;
        }
        struct job *have = jobs_job_find(j, jb->id);
        if (have) { /* in memory already, or its own commit will place it */
            if (have->parked && q) {
                have->parked = false;
                jobs_ready_push(j, have);
            }
            jobs_job_free(jb);
            continue;
        }
        jobs_job_insert(j, jb);
        j->st.window_in++;
        if (jb->cancel_requested)
            jobs_cancel_recovered_locked(j, jb);
        else if (q)
            jobs_ready_push(j, jb);
        else
            jobs_window_place_locked(j, jb);
    }
    return rest;
}

/* Read and apply the next page of q (done of a barrier, or at create;
 * admit: start what it let in). */
static void queue_page(struct jd_jobs *j, struct queue *q, int rc, bool admit)
{
    pthread_mutex_lock(&j->mu);
    bool go = rc == 0 && !j->stopping && !j->draining && q->partial;
    struct jd_queued_pos after = q->floor;
    uint64_t epoch = q->epoch;
    /* The window, plus what admission can start at once: a drain is not
     * held to the window's pace (started jobs are bounded by max_running). */
    unsigned limit = q->nready < j->window ? j->window - q->nready : 1;
    unsigned slots = j->running < j->max_running ? j->max_running - j->running : 0;
    if (q->ctl.max_running && slots > q->ctl.max_running - q->running)
        slots = q->running < q->ctl.max_running ? q->ctl.max_running - q->running : 0;
    if (!q->paused && admit)
        limit += slots;
    q->drop_seen = false;
    if (!go)
        q->refilling = false;
    pthread_mutex_unlock(&j->mu);
    if (!go)
        return;
    if (limit > JD_QUEUED_PAGE_MAX)
        limit = JD_QUEUED_PAGE_MAX;
    struct page pg = {.j = j};
    size_t n = 0;
    rc = jd_store_queued_page(j->store, q->name, after, jd_wall_ms(), limit, page_one, &pg, &n);
    struct job *start = NULL;
    pthread_mutex_lock(&j->mu);
    q->refilling = false;
    j->st.window_pages++;
    if (rc == 0 && q->epoch == epoch && !j->stopping) {
        if (q->drop_seen) { /* stop before it: the next page reads it */
            struct jd_queued_pos b = {q->drop_min.priority, q->drop_min.id - 1};
            q->floor = n == limit && rank_before(pg.last, b) ? pg.last : b;
        } else if (n < limit) {
            q->partial = false;
        } else {
            q->floor = pg.last;
        }
        pg.list = apply_locked(j, pg.list, q);
        j->paged_in += n;
        if (j->paged_in >= 4096) { /* a large drain: give the heap back once it is over */
            j->trim_tail = true;
            j->paged_in = 0;
        }
        if (admit)
            jobs_admit_locked(j, &start);
        jobs_window_low_locked(j, q); /* the page was all known jobs: the next one */
    } else if (rc) {
        jd_logf(JD_LOG_WARN, "reading queue %s's next jobs failed: %s", q->name, jd_strerror(rc));
    }
    pthread_mutex_unlock(&j->mu);
    page_free(pg.list);
    jobs_start_list(j, start);
}

/* Read and apply the delayed jobs due within the horizon, after later_pos. */
static void later_page(struct jd_jobs *j, int rc, bool admit)
{
    pthread_mutex_lock(&j->mu);
    bool go = rc == 0 && !j->stopping && !j->draining;
    int64_t ar = j->later_run_at, ai = j->later_id;
    uint64_t epoch = j->later_epoch;
    unsigned limit = j->later_mem < j->window ? j->window - j->later_mem : 0;
    j->later_drop_seen = false;
    if (!go || limit == 0) {
        j->later_paging = false;
        j->later_full = j->later_full || limit == 0;
        pthread_mutex_unlock(&j->mu);
        return;
    }
    pthread_mutex_unlock(&j->mu);
    if (limit > JD_QUEUED_PAGE_MAX)
        limit = JD_QUEUED_PAGE_MAX;
    int64_t until = jd_wall_ms() + LATER_HORIZON_MS;
    struct page pg = {.j = j};
    size_t n = 0;
    rc = jd_store_queued_later(j->store, ar, ai, until, limit, page_one, &pg, &n);
    struct job *start = NULL;
    pthread_mutex_lock(&j->mu);
    j->later_paging = false;
    j->st.window_pages++;
    if (rc == 0 && epoch == j->later_epoch && !j->stopping) {
        /* First the new end, so that placing the page's jobs keeps them. */
        j->later_full = n == limit;
        j->later_run_at = n == limit ? pg.last_run_at : until;
        j->later_id = n == limit ? pg.last.id : INT64_MAX;
        if (j->later_drop_seen &&
            (j->later_drop_run_at < j->later_run_at ||
             (j->later_drop_run_at == j->later_run_at && j->later_drop_id <= j->later_id))) {
            j->later_run_at = j->later_drop_run_at; /* stop before it */
            j->later_id = j->later_drop_id - 1;
            j->later_full = true;
        }
        pg.list = apply_locked(j, pg.list, NULL);
        if (admit)
            jobs_admit_locked(j, &start);
    } else if (rc) {
        jd_logf(JD_LOG_WARN, "reading delayed jobs failed: %s", jd_strerror(rc));
    }
    pthread_mutex_unlock(&j->mu);
    page_free(pg.list);
    jobs_start_list(j, start);
}

static void page_done(void *arg, struct jd_write *w, int rc)
{
    (void)w;
    struct wpage *p = arg;
    if (p->q)
        queue_page(p->j, p->q, rc, true);
    else
        later_page(p->j, rc, true);
    free(p);
}

/* Under mu: have a page read (by the pager thread, or after a barrier). */
static void request_page_locked(struct jd_jobs *j, struct queue *q)
{
    if (j->pager_on) {
        if (q) {
            q->page_wanted = q->refilling = true;
        } else {
            j->later_wanted = j->later_paging = true;
        }
        pthread_cond_signal(&j->pager_cv);
        return;
    }
    struct wpage *p = jd_xcalloc(1, sizeof *p);
    jd_store_write_barrier(&p->w);
    p->w.done = page_done;
    p->w.arg = p;
    p->j = j;
    p->q = q;
    if (jd_store_submit(j->store, &p->w) != 0) {
        free(p);
        return;
    }
    if (q)
        q->refilling = true;
    else
        j->later_paging = true;
}

static void *pager_main(void *arg)
{
    struct jd_jobs *j = arg;
    pthread_mutex_lock(&j->mu);
    while (!j->pager_stop) {
        struct queue *q = NULL;
        for (struct queue *x = j->queues; x && !q; x = x->next)
            if (x->page_wanted)
                q = x;
        if (!q && !j->later_wanted) {
            pthread_cond_wait(&j->pager_cv, &j->mu);
            continue;
        }
        if (q)
            q->page_wanted = false;
        else
            j->later_wanted = false;
        pthread_mutex_unlock(&j->mu);
        if (q)
            queue_page(j, q, 0, true);
        else
            later_page(j, 0, true);
        pthread_mutex_lock(&j->mu);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

void jobs_window_fini(struct jd_jobs *j)
{
    pthread_mutex_lock(&j->mu);
    bool on = j->pager_on;
    j->pager_stop = true;
    if (on)
        pthread_cond_signal(&j->pager_cv);
    pthread_mutex_unlock(&j->mu);
    if (!on)
        return;
    pthread_join(j->pager, NULL);
    pthread_mutex_lock(&j->mu);
    j->pager_on = false;
    pthread_mutex_unlock(&j->mu);
    pthread_cond_destroy(&j->pager_cv);
}

static void later_tick(void *arg);

/* Under mu. */
static void later_arm_locked(struct jd_jobs *j)
{
    if (jd_sched_timer_after(j->sched, (uint64_t)LATER_TICK_MS * 1000000u, later_tick, j,
                             &j->later_timer_id) == 0)
        j->later_timer = true;
}

/* Timer thread: top up the later set; also a page a failed read left
 * wanting. */
static void later_tick(void *arg)
{
    struct jd_jobs *j = arg;
    pthread_mutex_lock(&j->mu);
    j->later_timer = false;
    if (!j->stopping && !j->draining) {
        if (!j->later_paging)
            request_page_locked(j, NULL);
        for (struct queue *q = j->queues; q; q = q->next)
            jobs_window_low_locked(j, q);
        later_arm_locked(j);
    }
    pthread_mutex_unlock(&j->mu);
}

int jobs_window_load_locked(struct jd_jobs *j, int64_t id, struct job **out)
{
    struct jd_job row = {0};
    if (jd_store_job_get(j->store, id, &row) != 0)
        return JD_ENOENT;
    if (row.state != JD_JOB_QUEUED) {
        jd_job_clear(&row);
        return JD_ECONFLICT;
    }
    /* The job with its events: the first of its rank's page after id - 1. */
    struct page pg = {.j = j};
    size_t n = 0;
    int rc = jd_store_queued_page(j->store, row.queue, (struct jd_queued_pos){row.priority, id - 1},
                                  INT64_MAX, 1, page_one, &pg, &n);
    jd_job_clear(&row);
    struct job *jb = pg.list;
    if (rc || !jb || jb->id != id) {
        page_free(pg.list);
        return rc ? rc : JD_ECONFLICT;
    }
    jobs_job_insert(j, jb);
    jb->transient = true;
    j->st.window_in++;
    *out = jb;
    return 0;
}

void jobs_window_settle_locked(struct jd_jobs *j, struct job *jb)
{
    if (!jb->transient || jb->dropped || jb->finished || jb->in_ready || jb->run_at_timer ||
        jb->admitted || jb->parked)
        return;
    jobs_window_place_locked(j, jb);
}

int jobs_window_recover(struct jd_jobs *j, struct jd_error *err)
{
    struct jd_queue_counts *rows = NULL;
    size_t n = 0;
    int rc = jd_store_queue_counts(j->store, &rows, &n);
    if (rc)
        return jd_error_set(err, rc, NULL, "reading queue counts failed: %s", jd_strerror(rc));
    size_t queued = 0;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].counts[JD_JOB_QUEUED] <= 0)
            continue;
        queued += (size_t)rows[i].counts[JD_JOB_QUEUED];
        pthread_mutex_lock(&j->mu);
        struct queue *q = jobs_queue_get(j, rows[i].queue);
        q->partial = true;
        q->floor = JD_QUEUED_START;
        q->refilling = true;
        pthread_mutex_unlock(&j->mu);
        queue_page(j, q, 0, false);
    }
    jd_queue_counts_free(rows, n);
    size_t in_mem = window_start(j);
    if (queued)
        jd_logf(JD_LOG_INFO, "%zu queued jobs, %zu of them read into memory (--queue-window %u)",
                queued, in_mem, j->window);
    return 0;
}

void jobs_window_cluster_start(struct jd_jobs *j)
{
    window_start(j);
}

/* The delayed jobs' first page, the pager thread and the later timer;
 * returns the queued jobs then in memory. */
static size_t window_start(struct jd_jobs *j)
{
    pthread_mutex_lock(&j->mu);
    j->later_run_at = INT64_MIN;
    j->later_id = 0;
    j->later_paging = true;
    pthread_mutex_unlock(&j->mu);
    later_page(j, 0, false);
    pthread_cond_init(&j->pager_cv, NULL);
    if (pthread_create(&j->pager, NULL, pager_main, j) == 0) {
        pthread_mutex_lock(&j->mu);
        j->pager_on = true;
    } else {
        pthread_cond_destroy(&j->pager_cv);
        jd_log(JD_LOG_WARN, "no pager thread; queued jobs are paged in on the completion thread",
               NULL);
        pthread_mutex_lock(&j->mu);
    }
    later_arm_locked(j);
    size_t in_mem = j->st.queued_mem + j->later_mem;
    pthread_mutex_unlock(&j->mu);
    return in_mem;
}

void jobs_window_submit_locked(struct jd_jobs *j, struct job *jb, struct jd_write *w)
{
    if (!j->window)
        return;
    struct queue *q = jobs_job_queue(j, jb);
    /* A unique key's holder stays in memory (its index answers conflicts),
     * so it is never handed to another node this way. */
    if (j->cl && !jb->ukey) {
        bool later = jb->run_at_ms > jd_wall_ms() + 1;
        if (q->partial || q->nready + q->inserting >= j->window ||
            (later && j->later_mem >= j->window)) {
            jb->unowned = true;
            w->unowned = true;
        }
    }
    q->inserting++;
}

void jobs_window_inserted_locked(struct jd_jobs *j, struct job *jb)
{
    struct queue *q = j->window ? jobs_job_queue(j, jb) : NULL;
    if (q && q->inserting)
        q->inserting--;
}

unsigned jobs_window_claim_room_locked(struct jd_jobs *j)
{
    if (!j->window)
        return UINT_MAX;
    /* Not while a queue's own backlog waits in the store: what it claimed
     * would rank past the floor and stay there, this node's, so claims
     * would pull the whole unowned backlog into this node's. */
    size_t held = j->st.queued_mem + j->later_mem;
    for (struct queue *q = j->queues; q; q = q->next) {
        if (q->partial)
            return 0;
        held += q->inserting;
    }
    return held < j->window ? j->window - (unsigned)held : 0;
}
