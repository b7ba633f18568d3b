/*
 * Waiting requests: arming a request for a job-layer callback, suspending
 * and resuming its connection, the parked list and its timer thread
 * (long-poll deadlines, SSE heartbeats), the job-layer done and watch
 * callbacks, answering after a commit (http_finish_async) and streaming a
 * job's events as SSE.
 *
 * Invariants: a request waits for at most one callback per arming (`armed`,
 * `fired`); the parked list and every pending callback hold a reference on
 * the request; parked_count (long-polls + SSE streams) is a soft cap.
 *
 * Threading: handlers run on MHD's pool threads; the callbacks run on the
 * job layer's threads (the store's completion thread, workers); the timer
 * thread wakes expired waiters. Lock order: req->mu before h->park_mu; the
 * timer thread never takes a req->mu while holding park_mu.
 */
#include "api/http_impl.h"

#include "common/alloc.h"
#include "common/clock.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* Prepare for a callback; call before handing r to the job layer. */
void http_arm(struct jd_req *r)
{
    pthread_mutex_lock(&r->mu);
    r->armed = true;
    r->fired = false;
    r->wake = WAKE_NONE;
    pthread_mutex_unlock(&r->mu);
}

/* Stop watching r's socket (r->mu held). The socket stays in the set: its
 * watch is one-shot and keyed by r's serial, which no later request has, so
 * a hang-up it reports after r woke wakes nobody (take_gone_locked) and
 * disarms it; closing the socket takes it out of the set, so a new
 * connection that reuses the number is added afresh. Leaving it there
 * saves an epoll_ctl a long-poll. */
static void hup_unwatch_locked(struct jd_req *r)
{
    r->hup_watched = false;
}

/* Fire once per arming; resumes the connection if the handler suspended. */
void http_wake(struct jd_req *r, enum wake why)
{
    pthread_mutex_lock(&r->mu);
    bool resume = false;
    if (r->armed && !r->fired) {
        r->fired = true;
        r->wake = why;
        resume = r->suspended;
        r->suspended = false;
        hup_unwatch_locked(r);
    }
    pthread_mutex_unlock(&r->mu);
    if (resume)
        MHD_resume_connection(r->conn);
}

void http_park_suspend_locked(struct jd_req *r)
{
    r->suspended = true;
    MHD_suspend_connection(r->conn);
    /* A suspended connection is not polled by MHD, so a client that hangs
     * up would go unnoticed until the wait ends; the timer thread watches
     * the socket instead. EPOLLRDHUP: the peer closed (or half-closed) its
     * side; pipelined bytes alone do not wake it. One-shot, re-armed with
     * this request's serial (MOD) on a keep-alive connection parked before,
     * added the first time; a socket that hung up already reports at once
     * (level-triggered). */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL)
        return;
    struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLONESHOT, .data.u64 = r->serial};
    if (epoll_ctl(r->h->park_ep, EPOLL_CTL_MOD, ci->connect_fd, &ev) == 0 ||
        (errno == ENOENT && epoll_ctl(r->h->park_ep, EPOLL_CTL_ADD, ci->connect_fd, &ev) == 0))
        r->hup_watched = true;
}

/* After handing r over: true if the callback already fired (answer now);
 * false after suspending the connection (answer when resumed). */
static bool fired_or_suspend(struct jd_req *r)
{
    pthread_mutex_lock(&r->mu);
    bool f = r->fired;
    if (!f) {
        r->suspended = true;
        MHD_suspend_connection(r->conn);
    }
    pthread_mutex_unlock(&r->mu);
    return f;
}

static void timer_kick(struct jd_http *h)
{
    uint64_t one = 1;
    ssize_t n = write(h->park_evfd, &one, sizeof one);
    (void)n; /* EAGAIN: the counter is already non-zero, the timer wakes anyway */
}

void http_park_list_add(struct jd_req *r, uint64_t deadline_ns)
{
    struct jd_http *h = r->h;
    http_req_ref(r);
    pthread_mutex_lock(&h->park_mu);
    r->deadline_ns = deadline_ns;
    r->pprev = NULL;
    r->pnext = h->parked_head;
    if (h->parked_head)
        h->parked_head->pprev = r;
    h->parked_head = r;
    r->on_list = true;
    /* Wake the timer only if it would sleep past this deadline; an awake
     * timer rescans the whole list before it sleeps again. */
    bool kick = h->timer_wait_until != 0 && deadline_ns < h->timer_wait_until;
    pthread_mutex_unlock(&h->park_mu);
    if (kick)
        timer_kick(h);
}

static void unlink_locked(struct jd_http *h, struct jd_req *r)
{
    if (r->pprev)
        r->pprev->pnext = r->pnext;
    else
        h->parked_head = r->pnext;
    if (r->pnext)
        r->pnext->pprev = r->pprev;
    r->pprev = r->pnext = NULL;
    r->on_list = false;
}

static void park_list_remove(struct jd_req *r)
{
    struct jd_http *h = r->h;
    pthread_mutex_lock(&h->park_mu);
    bool was = r->on_list;
    if (was)
        unlink_locked(h, r);
    pthread_mutex_unlock(&h->park_mu);
    if (was)
        http_req_unref(r);
}

/* Withdraw the watch if it has not fired (its reference is then ours). */
static void watch_cancel(struct jd_req *r)
{
    if (!r->watching)
        return;
    r->watching = false;
    struct jd_jobs *j = http_jobs_of(r->h);
    if (j != NULL && jd_jobs_unwatch(j, r->watch_id))
        http_req_unref(r);
}

int http_timer_init(struct jd_http *h)
{
    h->park_ep = epoll_create1(EPOLL_CLOEXEC);
    h->park_evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    if (h->park_ep < 0 || h->park_evfd < 0 ||
        epoll_ctl(h->park_ep, EPOLL_CTL_ADD, h->park_evfd, &ev) != 0)
        return JD_EIO;
    return 0;
}

void http_timer_stop(struct jd_http *h)
{
    if (h->timer_started) {
        pthread_mutex_lock(&h->park_mu);
        h->timer_stop = true;
        pthread_mutex_unlock(&h->park_mu);
        timer_kick(h);
        pthread_join(h->timer, NULL);
        h->timer_started = false;
    }
    if (h->park_evfd >= 0)
        close(h->park_evfd);
    if (h->park_ep >= 0)
        close(h->park_ep);
    h->park_evfd = h->park_ep = -1;
}

/* Unlink the parked requests whose serial is among the n hang-up events
 * (park_mu held); the list's references move to the returned chain. */
static struct jd_req *take_gone_locked(struct jd_http *h, const struct epoll_event *ev, int n)
{
    struct jd_req *gone = NULL;
    for (struct jd_req *r = h->parked_head, *nx; r != NULL; r = nx) {
        nx = r->pnext;
        for (int i = 0; i < n; i++) {
            if (ev[i].data.u64 == r->serial) {
                unlink_locked(h, r);
                r->pnext = gone;
                gone = r;
                break;
            }
        }
    }
    return gone;
}

/* Wake a chain taken off the list with why, dropping the list's references. */
static void wake_chain(struct jd_req *list, enum wake why)
{
    while (list != NULL) {
        struct jd_req *r = list;
        list = r->pnext;
        r->pnext = NULL;
        http_wake(r, why);
        http_req_unref(r);
    }
}

void *http_timer_main(void *arg)
{
    struct jd_http *h = arg;
    struct epoll_event ev[64];
    pthread_mutex_lock(&h->park_mu);
    while (!h->timer_stop) {
        uint64_t now = jd_now_ns();
        uint64_t next = now + 1000000000ull; /* re-check at least every second */
        struct jd_req *expired = NULL;
        for (struct jd_req *r = h->parked_head, *nx; r != NULL; r = nx) {
            nx = r->pnext;
            if (r->deadline_ns <= now) {
                unlink_locked(h, r); /* the list's reference moves to `expired` */
                r->pnext = expired;
                expired = r;
            } else if (r->deadline_ns < next) {
                next = r->deadline_ns;
            }
        }
        if (expired != NULL) {
            pthread_mutex_unlock(&h->park_mu);
            wake_chain(expired, WAKE_TIMEOUT);
            pthread_mutex_lock(&h->park_mu);
            continue;
        }
        h->timer_wait_until = next;
        pthread_mutex_unlock(&h->park_mu);
        int ms = (int)((next - now + 999999ull) / 1000000ull); /* round up: no early spin */
        int n = epoll_wait(h->park_ep, ev, (int)(sizeof ev / sizeof ev[0]), ms);
        pthread_mutex_lock(&h->park_mu);
        h->timer_wait_until = 0;
        int hups = 0;
        for (int i = 0; i < n; i++) {
            if (ev[i].data.u64 == 0) {
                uint64_t v;
                ssize_t got = read(h->park_evfd, &v, sizeof v);
                (void)got; /* only the wake-up mattered */
            } else {
                ev[hups++] = ev[i];
            }
        }
        if (hups > 0) {
            struct jd_req *gone = take_gone_locked(h, ev, hups);
            pthread_mutex_unlock(&h->park_mu);
            wake_chain(gone, WAKE_GONE);
            pthread_mutex_lock(&h->park_mu);
        }
    }
    pthread_mutex_unlock(&h->park_mu);
    return NULL;
}

void http_on_submit_done(void *arg, const struct jd_submit_result *res)
{
    struct jd_req *r = arg;
    pthread_mutex_lock(&r->mu);
    r->cb_rc = res->rc;
    r->cb_err = res->err;
    r->cb_job_id = res->job_id;
    r->cb_existing = res->existing;
    r->cb_unique = res->unique;
    r->cb_json = res->json ? http_answer_dup(res->json) : NULL;
    r->cb_json_room = true;
    pthread_mutex_unlock(&r->mu);
    http_wake(r, WAKE_CHANGED);
    http_req_unref(r);
}

void http_on_action_done(void *arg, int rc, const char *json)
{
    struct jd_req *r = arg;
    pthread_mutex_lock(&r->mu);
    r->cb_rc = rc;
    r->cb_json = json ? http_answer_dup(json) : NULL;
    r->cb_json_room = true;
    pthread_mutex_unlock(&r->mu);
    http_wake(r, WAKE_CHANGED);
    http_req_unref(r);
}

void http_on_watch(void *arg, int rc, int64_t version)
{
    struct jd_req *r = arg;
    http_wake(r, rc == JD_ESHUTDOWN ? WAKE_SHUTDOWN : WAKE_CHANGED);
    http_req_unref(r);
}

void http_on_watch_json(void *arg, int rc, int64_t version, const char *json)
{
    struct jd_req *r = arg;
    if (json && rc == 0) {
        char *copy = http_answer_dup(json);
        pthread_mutex_lock(&r->mu);
        free(r->cb_json);
        r->cb_json = copy;
        r->cb_json_room = true;
        r->cb_version = version;
        pthread_mutex_unlock(&r->mu);
    }
    http_on_watch(arg, rc, version);
}

bool http_parked_slot_take(struct jd_req *r)
{
    struct jd_http *h = r->h;
    /* relaxed: a soft cap; a few over under a race is harmless */
    unsigned n = atomic_fetch_add_explicit(&h->parked_count, 1, memory_order_relaxed);
    if (n >= h->max_parked) {
        atomic_fetch_sub_explicit(&h->parked_count, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&h->metrics.parked_rejected, 1, memory_order_relaxed);
        return false;
    }
    atomic_fetch_add_explicit(&h->metrics.parked, 1, memory_order_relaxed); /* a gauge */
    r->holds_slot = true;
    return true;
}

static void parked_slot_give(struct jd_req *r)
{
    if (!r->holds_slot)
        return;
    r->holds_slot = false;
    /* relaxed: a soft cap and a gauge */
    atomic_fetch_sub_explicit(&r->h->parked_count, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&r->h->metrics.parked, 1, memory_order_relaxed);
}

void http_park_release(struct jd_req *r)
{
    pthread_mutex_lock(&r->mu);
    r->armed = false; /* a late watch or timer wake must not resume a closed connection */
    hup_unwatch_locked(r);
    pthread_mutex_unlock(&r->mu);
    park_list_remove(r);
    watch_cancel(r);
    parked_slot_give(r);
}

enum MHD_Result http_finish_parked(struct jd_req *r)
{
    pthread_mutex_lock(&r->mu);
    bool gone = r->wake == WAKE_GONE;
    char *json = r->cb_json; /* the job as the commit that woke us left it, or NULL */
    bool room = r->cb_json_room;
    r->cb_json = NULL;
    pthread_mutex_unlock(&r->mu);
    http_park_release(r);
    r->phase = PH_DONE;
    if (gone) { /* nobody to answer: close now (on_completed logs it as aborted) */
        free(json);
        r->status = 499;
        return MHD_NO;
    }
    if (!json)
        return http_answer_job(r);
    r->ans_json = json; /* the answer takes it (http_answer_body) */
    r->ans_room = room;
    enum MHD_Result ret = http_respond_job(r, json, r->cb_version);
    free(r->ans_json);
    r->ans_json = NULL;
    return ret;
}

/* SSE reads history one page at a time, as the client drains the previous
 * one: a stream's memory is a page (plus one event past the byte mark),
 * whatever the job's history, and a slow reader costs no more than a fast
 * one. A page is rendered on the MHD thread, between other connections'
 * turns, so it is kept small: 64 events of a typical ~150 bytes, about one
 * write buffer, a millisecond or less of rendering. */
#define SSE_PAGE_EVENTS 64
#define SSE_PAGE_BYTES ((size_t)16 << 10)

static void sse_put(struct jd_req *r, const char *s, size_t n)
{
    if (r->sse_len + n + 1 > r->sse_cap) {
        r->sse_cap = (r->sse_len + n + 1) * 2;
        r->sse_buf = jd_xrealloc(r->sse_buf, r->sse_cap);
    }
    memcpy(r->sse_buf + r->sse_len, s, n);
    r->sse_len += n;
}

/* Append one event; false once the page is full (stop reading). */
static bool sse_event(void *arg, int64_t seq, const char *kind, const char *event_json)
{
    struct jd_req *r = arg;
    char head[96];
    int n = snprintf(head, sizeof head, "id: %" PRId64 "\nevent: %s\ndata: ", seq, kind);
    sse_put(r, head, (size_t)n);
    /* event_json is one line (compact JSON); guard anyway so a newline can
     * never end the data field early */
    const char *p = event_json;
    while (*p) {
        size_t run = strcspn(p, "\r\n");
        sse_put(r, p, run);
        p += run;
        if (*p) {
            sse_put(r, " ", 1);
            p++;
        }
    }
    sse_put(r, "\n\n", 2);
    if (seq > r->sse_seq)
        r->sse_seq = seq;
    return r->sse_len < SSE_PAGE_BYTES;
}

#define SSE_EVENTS_PER_REFILL 256 /* bounds a global stream's buffer (~256 small events) */

static void sse_global_event(void *arg, int64_t id, const char *event_json)
{
    sse_event(arg, id, "state", event_json);
}

/* GET /v1/events: the next transitions after sse_seq. Progress (sse_seq
 * moving past events the filter skips) counts as news: the caller reads
 * again rather than parks. */
static bool sse_refill_global(struct jd_req *r)
{
    struct jd_jobs *j = http_jobs_of(r->h);
    r->ev_commits = jd_jobs_commits(j); /* before the read: see jd_jobs_watch_any */
    int64_t next = r->sse_seq;
    int rc = jd_jobs_events_read(j, r->evsub, r->sse_seq, SSE_EVENTS_PER_REFILL, sse_global_event,
                                 r, &next);
    if (rc < 0) {
        r->sse_end = true;
        return false;
    }
    bool moved = next > r->sse_seq;
    if (next > r->sse_seq)
        r->sse_seq = next;
    return moved;
}

/* Fill the buffer with what is new; sets sse_end when the job is terminal
 * and everything up to its final version has been written. True when a
 * global stream moved on without finding anything to send. */
static bool sse_refill(struct jd_req *r)
{
    struct jd_jobs *j = http_jobs_of(r->h);
    r->sse_len = r->sse_off = 0;
    if (r->sse_cap > 2 * SSE_PAGE_BYTES) { /* one huge event grew it: give it back */
        free(r->sse_buf);
        r->sse_buf = NULL;
        r->sse_cap = 0;
    }
    if (r->sse_heartbeat) {
        sse_put(r, ": heartbeat\n\n", 13);
        r->sse_heartbeat = false;
    }
    if (r->evsub)
        return sse_refill_global(r);
    int rc = jd_jobs_events_each(j, r->job_id, r->sse_seq, SSE_PAGE_EVENTS, sse_event, r);
    if (rc < 0) {
        r->sse_end = true;
        return false;
    }
    if (rc == SSE_PAGE_EVENTS || r->sse_len >= SSE_PAGE_BYTES)
        return false; /* a full page: more may follow, look at the job once caught up */
    char *json = NULL;
    int64_t version = 0;
    bool terminal = false;
    if (jd_jobs_get_json(j, r->job_id, &json, &version, &terminal) != 0) {
        r->sse_end = true;
        return false;
    }
    free(json);
    if (terminal && r->sse_seq >= version) {
        sse_put(r, "event: end\ndata: {}\n\n", 21);
        r->sse_end = true;
    }
    return false;
}

ssize_t http_sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct jd_req *r = cls;
    struct jd_http *h = r->h;
    if (r->phase == PH_PARKED) { /* resumed: by a change, a heartbeat, drain or hang-up */
        pthread_mutex_lock(&r->mu);
        enum wake why = r->wake;
        r->armed = false;
        pthread_mutex_unlock(&r->mu);
        park_list_remove(r);
        watch_cancel(r);
        r->phase = PH_DONE;
        if (why == WAKE_GONE) /* on_completed gives back the slot */
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (why == WAKE_TIMEOUT)
            r->sse_heartbeat = true;
    }
    for (int round = 0; round < 4; round++) {
        if (r->sse_off < r->sse_len) {
            size_t n = r->sse_len - r->sse_off;
            if (n > max)
                n = max;
            memcpy(buf, r->sse_buf + r->sse_off, n);
            r->sse_off += n;
            return (ssize_t)n;
        }
        if (r->sse_end)
            return MHD_CONTENT_READER_END_OF_STREAM;
        bool moved = sse_refill(r);
        if (r->sse_len > 0 || r->sse_end || moved)
            continue;
        if (atomic_load(&h->draining)) { /* seq_cst: see route_job_get */
            r->sse_end = true;
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        /* Nothing new: park until the job changes or the heartbeat is due. */
        http_arm(r);
        http_req_ref(r);
        uint64_t wid = 0;
        int rc = r->evsub
                     ? jd_jobs_watch_any(http_jobs_of(h), r->ev_commits, http_on_watch, r, &wid)
                     : jd_jobs_watch(http_jobs_of(h), r->job_id, r->sse_seq, false, http_on_watch,
                                     r, &wid);
        if (rc != 0) {
            http_req_unref(r);
            r->sse_end = true;
            continue;
        }
        r->watch_id = wid;
        r->watching = true;
        r->phase = PH_PARKED;
        pthread_mutex_lock(&r->mu);
        bool fired = r->fired;
        if (!fired) {
            http_park_list_add(r, jd_now_ns() + (uint64_t)h->heartbeat_ms * 1000000ull);
            http_park_suspend_locked(r);
        }
        pthread_mutex_unlock(&r->mu);
        if (!fired) {
            if (atomic_load(&h->draining))
                http_wake(r, WAKE_SHUTDOWN);
            return 0; /* suspended: MHD calls again after the resume */
        }
        /* fired already: clean up and go round again */
        pthread_mutex_lock(&r->mu);
        r->armed = false;
        pthread_mutex_unlock(&r->mu);
        watch_cancel(r);
        r->phase = PH_DONE;
    }
    /* Still nothing after a few rounds of immediate changes: send a heartbeat
     * rather than spin; the next call looks again. */
    static const char hb[] = ": heartbeat\n\n";
    size_t n = sizeof hb - 1 < max ? sizeof hb - 1 : max;
    memcpy(buf, hb, n);
    return (ssize_t)n;
}

void http_sse_free(void *cls)
{
    http_req_unref(cls);
}

enum MHD_Result http_finish_async(struct jd_req *r)
{
    int rc;
    char *json;
    pthread_mutex_lock(&r->mu);
    rc = r->cb_rc;
    json = r->cb_json;
    r->cb_json = NULL;
    r->ans_json = json; /* an answer may take it (http_answer_body) */
    r->ans_room = r->cb_json_room;
    r->armed = false;
    pthread_mutex_unlock(&r->mu);
    enum MHD_Result ret;
    if (rc != 0) {
        ret = http_respond_error(r, rc, r->cb_err.code ? &r->cb_err : NULL);
    } else if (r->answer != NULL) {
        ret = r->answer(r, json);
    } else {
        ret = http_respond_json(r, 202, json ? json : "{}", NULL, NULL);
    }
    free(r->ans_json);
    r->ans_json = NULL;
    return ret;
}

/* The job layer accepted r for a callback (rc 0) or refused it at once. */
enum MHD_Result http_async_started(struct jd_req *r, int rc, const struct jd_error *err,
                                   jd_async_answer_fn *answer)
{
    r->answer = answer;
    if (rc != 0) {
        http_req_unref(r); /* the callback's reference: it will never run */
        pthread_mutex_lock(&r->mu);
        r->armed = false;
        pthread_mutex_unlock(&r->mu);
        return http_respond_error(r, rc, err);
    }
    r->phase = PH_ASYNC;
    if (fired_or_suspend(r))
        return http_finish_async(r);
    return MHD_YES;
}

void http_wake_all_parked(struct jd_http *h)
{
    pthread_mutex_lock(&h->park_mu);
    struct jd_req *list = h->parked_head;
    h->parked_head = NULL;
    for (struct jd_req *r = list; r != NULL; r = r->pnext) {
        r->on_list = false;
        r->pprev = NULL;
    }
    pthread_mutex_unlock(&h->park_mu);
    wake_chain(list, WAKE_SHUTDOWN); /* the list's references are ours now */
}

enum MHD_Result http_sse_start(struct jd_req *r)
{
    r->is_sse = true;
    r->phase = PH_DONE;
    http_req_ref(r); /* the response's reference, dropped by http_sse_free */
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 4096, http_sse_reader, r, http_sse_free);
    if (resp == NULL) {
        http_req_unref(r);
        r->is_sse = false;
        http_park_release(r);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    MHD_add_response_header(resp, "X-Request-Id", r->rid);
    r->status = 200;
    enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}
