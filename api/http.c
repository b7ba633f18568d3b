/*
 * The HTTP server over libmicrohttpd (MHD).
 *
 * Threads: MHD's pool threads call the access handler, the SSE content
 * reader and the completion notifier; the job layer's done and watch
 * callbacks arrive on its threads (the storage writer, workers); one timer
 * thread of this module expires long-polls and paces SSE heartbeats; the
 * owner thread calls start/attach/drain/stop.
 *
 * A request is a struct req, reference counted: MHD holds one reference from
 * the first handler call to the completion notifier, a pending job-layer
 * callback (done or watch) holds one, the parked list holds one, and an SSE
 * response holds one. The last unref frees it, so no callback can outlive
 * its request whichever order things happen in.
 *
 * Suspending: a handler that must wait sets `armed` and calls
 * MHD_suspend_connection while holding req->mu; a waker takes req->mu, marks
 * the request `fired` and resumes only if it was suspended. A callback that
 * fires before the handler suspends (even on the same thread) is therefore
 * seen by the handler, which then answers at once instead of suspending.
 * Lock order: req->mu before h->park_mu; the timer thread never takes a
 * req->mu while holding park_mu.
 */
#include "api/http.h"

#include "api/metrics.h"
#include "api/problem.h"
#include "api/router.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "plugins/registry.h"
#include "scheduler/sched.h"
#include "server/jobs.h"
#include "storage/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define REQ_ID_MAX 64    /* longer client ids are replaced by ours */
#define IDEM_KEY_MAX 255 /* as the common SaaS limits */
#define DISCARD_LIMIT                                                                              \
    ((size_t)64 << 20) /* bytes of a rejected chunked body read before closing                     \
                        */

struct jd_http {
    struct MHD_Daemon *daemon;
    MHD_socket quiesced_fd;
    uint16_t port;
    char *token;
    size_t max_body;
    unsigned max_parked;
    int64_t max_wait_ms, heartbeat_ms;
    struct jd_store *store;

    _Atomic(struct jd_jobs *) jobs; /* release on attach: handlers see a built layer */
    atomic_bool draining;           /* seq_cst everywhere: checked before parking, set before
                                       waking, so a waiter either sees it or gets woken */
    atomic_uint inflight;           /* requests between first call and completion */
    atomic_uint parked_count;       /* long-polls parked + SSE streams alive */
    atomic_uint_fast64_t rid_counter;
    uint64_t rid_seed;

    pthread_mutex_t park_mu;
    pthread_cond_t park_cv;
    struct req *parked_head; /* doubly linked, holds a reference on each */
    bool timer_stop;
    uint64_t timer_wait_until; /* park_mu: the timer sleeps until this, or 0 if awake */
    pthread_t timer;
    bool timer_started;

    struct jd_http_metrics metrics;
};

enum phase { PH_NEW, PH_BODY, PH_ASYNC, PH_PARKED, PH_DONE };
enum wake { WAKE_NONE, WAKE_CHANGED, WAKE_TIMEOUT, WAKE_SHUTDOWN };

struct req {
    struct jd_http *h;
    struct MHD_Connection *conn;
    atomic_int refs; /* acq_rel on drop: the freeing thread sees every write */
    pthread_mutex_t mu;

    struct jd_route_match m;
    int match_rc;
    char method[8];
    char *path;
    char rid[REQ_ID_MAX + 1];
    char job_label[24]; /* job id for the log line, or "" */
    uint64_t start_ns;
    int status;
    enum phase phase;

    char *body;
    size_t len, cap;
    size_t discarded;
    bool too_big;

    /* waiting (under mu) */
    bool armed;     /* a callback or deadline may fire */
    bool suspended; /* MHD_suspend_connection called, resume not yet */
    bool fired;
    enum wake wake;
    int cb_rc;
    char *cb_json;
    int64_t cb_job_id;
    bool cb_existing;
    struct jd_error cb_err;

    /* parked list (under h->park_mu) */
    struct req *pprev, *pnext;
    bool on_list;
    uint64_t deadline_ns;
    /* watch (owner: the thread currently handling the request) */
    uint64_t watch_id;
    bool watching;

    /* long-poll / SSE */
    int64_t job_id;
    int64_t since;
    bool terminal_only;
    bool is_sse;
    int64_t sse_seq;
    char *sse_buf;
    size_t sse_len, sse_off, sse_cap;
    bool sse_end;
    bool sse_heartbeat;
};

/* ---- references ---- */

static void req_ref(struct req *r)
{
    /* relaxed: taking a reference needs no ordering, only the drop does */
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
}

static void req_unref(struct req *r)
{
    /* acq_rel: the last dropper must see every other holder's writes */
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_destroy(&r->mu);
    free(r->path);
    free(r->body);
    free(r->cb_json);
    free(r->sse_buf);
    free(r);
}

static struct jd_jobs *jobs_of(struct jd_http *h)
{
    /* acquire: pairs with the release in jd_http_attach */
    return atomic_load_explicit(&h->jobs, memory_order_acquire);
}

/* ---- responses ---- */

static enum MHD_Result respond(struct req *r, int status, const char *ctype, char *body, size_t len,
                               const char *h1, const char *v1, const char *h2, const char *v2)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    if (ctype != NULL)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(resp, "X-Request-Id", r->rid);
    if (h1 != NULL && v1 != NULL)
        MHD_add_response_header(resp, h1, v1);
    if (h2 != NULL && v2 != NULL)
        MHD_add_response_header(resp, h2, v2);
    r->status = status;
    r->phase = PH_DONE;
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* A JSON body from the job layer (not newline-terminated): copy with "\n". */
static enum MHD_Result respond_json(struct req *r, int status, const char *json, const char *h1,
                                    const char *v1)
{
    size_t n = strlen(json);
    char *b = jd_xmalloc(n + 2);
    memcpy(b, json, n);
    size_t len = n;
    if (n == 0 || json[n - 1] != '\n')
        b[len++] = '\n';
    b[len] = '\0';
    return respond(r, status, "application/json", b, len, h1, v1, NULL, NULL);
}

static enum MHD_Result respond_problem(struct req *r, int status, const char *detail,
                                       const char *pointer)
{
    char *b = jd_problem_json(status, detail, pointer, r->path, r->rid);
    const char *hk = NULL, *hv = NULL;
    if (status == 429 || status == 503) {
        hk = MHD_HTTP_HEADER_RETRY_AFTER;
        hv = "1";
    } else if (status == 405) {
        hk = MHD_HTTP_HEADER_ALLOW;
        hv = jd_router_allow_text(r->m.allow);
    } else if (status == 401) {
        hk = MHD_HTTP_HEADER_WWW_AUTHENTICATE;
        hv = "Bearer realm=\"jackdaw\"";
    }
    if (status == 413)
        atomic_fetch_add_explicit(&r->h->metrics.body_rejected, 1,
                                  memory_order_relaxed); /* relaxed: a counter */
    return respond(r, status, "application/problem+json", b, strlen(b), hk, hv, NULL, NULL);
}

static enum MHD_Result respond_error(struct req *r, int rc, const struct jd_error *err)
{
    int status = jd_error_http_status(rc);
    const char *detail = (err && err->message[0]) ? err->message : jd_strerror(rc);
    char d[64];
    if (rc == JD_ENOENT && !(err && err->message[0]) && r->job_label[0]) {
        snprintf(d, sizeof d, "no job with id %s", r->job_label);
        detail = d;
    }
    return respond_problem(r, status, detail, err ? err->pointer : NULL);
}

/* 404 for a job id that is not even a number. */
static enum MHD_Result respond_bad_job_id(struct req *r)
{
    char d[160];
    snprintf(d, sizeof d, "no job with id \"%.100s\" (job ids are decimal numbers)", r->m.param);
    return respond_problem(r, 404, d, NULL);
}

/* ---- request ids and logging ---- */

static void make_request_id(struct jd_http *h, struct req *r)
{
    const char *given = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Request-Id");
    if (given != NULL) {
        size_t n = strlen(given);
        bool ok = n > 0 && n <= REQ_ID_MAX;
        for (size_t i = 0; ok && i < n; i++) {
            char c = given[i];
            ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 c == '-' || c == '_' || c == '.' || c == ':';
        }
        if (ok) {
            memcpy(r->rid, given, n + 1);
            return;
        }
    }
    /* relaxed: only uniqueness matters */
    uint64_t n = atomic_fetch_add_explicit(&h->rid_counter, 1, memory_order_relaxed);
    snprintf(r->rid, sizeof r->rid, "%016" PRIx64 "%08" PRIx64, h->rid_seed, n & 0xffffffffu);
}

static void log_request(struct req *r, bool terminated)
{
    enum jd_log_level lvl = r->status >= 500 ? JD_LOG_WARN : JD_LOG_INFO;
    if (lvl < jd_log_get_level())
        return; /* filtered out: skip the formatting */
    char status[16], dur[32];
    snprintf(status, sizeof status, "%d", r->status);
    double ms = (double)(jd_now_ns() - r->start_ns) / 1e6;
    snprintf(dur, sizeof dur, "%.3f", ms);
    const char *msg = terminated ? "request aborted" : "request";
    if (r->job_label[0] != '\0')
        jd_log(lvl, msg, "request_id", r->rid, "method", r->method, "path", r->path ? r->path : "",
               "status", status, "duration_ms", dur, "job_id", r->job_label, NULL);
    else
        jd_log(lvl, msg, "request_id", r->rid, "method", r->method, "path", r->path ? r->path : "",
               "status", status, "duration_ms", dur, NULL);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct jd_http *h = cls;
    struct req *r = *con_cls;
    if (r == NULL)
        return;
    *con_cls = NULL;
    bool aborted = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK;
    log_request(r, aborted);
    uint64_t us = (jd_now_ns() - r->start_ns) / 1000;
    jd_http_metrics_observe(&h->metrics, r->m.route, r->status, us);
    if (r->is_sse)                                                            /* relaxed: a gauge */
        atomic_fetch_sub_explicit(&h->parked_count, 1, memory_order_relaxed); /* a soft cap */
    /* release: jd_http_stop's acquire load then sees this request's frees */
    atomic_fetch_sub_explicit(&h->inflight, 1, memory_order_release);
    req_unref(r);
}

/* ---- waiting: arm, suspend, wake ---- */

/* Prepare for a callback; call before handing r to the job layer. */
static void arm(struct req *r)
{
    pthread_mutex_lock(&r->mu);
    r->armed = true;
    r->fired = false;
    r->wake = WAKE_NONE;
    pthread_mutex_unlock(&r->mu);
}

/* Fire once per arming; resumes the connection if the handler suspended. */
static void wake(struct req *r, enum wake why)
{
    pthread_mutex_lock(&r->mu);
    bool resume = false;
    if (r->armed && !r->fired) {
        r->fired = true;
        r->wake = why;
        resume = r->suspended;
        r->suspended = false;
    }
    pthread_mutex_unlock(&r->mu);
    if (resume)
        MHD_resume_connection(r->conn);
}

/* After handing r over: true if the callback already fired (answer now);
 * false after suspending the connection (answer when resumed). */
static bool fired_or_suspend(struct req *r)
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

static void park_list_add(struct req *r, uint64_t deadline_ns)
{
    struct jd_http *h = r->h;
    req_ref(r);
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
    if (h->timer_wait_until != 0 && deadline_ns < h->timer_wait_until)
        pthread_cond_signal(&h->park_cv);
    pthread_mutex_unlock(&h->park_mu);
}

static void unlink_locked(struct jd_http *h, struct req *r)
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

static void park_list_remove(struct req *r)
{
    struct jd_http *h = r->h;
    pthread_mutex_lock(&h->park_mu);
    bool was = r->on_list;
    if (was)
        unlink_locked(h, r);
    pthread_mutex_unlock(&h->park_mu);
    if (was)
        req_unref(r);
}

/* Withdraw the watch if it has not fired (its reference is then ours). */
static void watch_cancel(struct req *r)
{
    if (!r->watching)
        return;
    r->watching = false;
    struct jd_jobs *j = jobs_of(r->h);
    if (j != NULL && jd_jobs_unwatch(j, r->watch_id))
        req_unref(r);
}

static void *timer_main(void *arg)
{
    struct jd_http *h = arg;
    pthread_mutex_lock(&h->park_mu);
    while (!h->timer_stop) {
        uint64_t now = jd_now_ns();
        uint64_t next = now + 1000000000ull; /* re-check at least every second */
        struct req *expired = NULL;
        for (struct req *r = h->parked_head, *nx; r != NULL; r = nx) {
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
            while (expired != NULL) {
                struct req *r = expired;
                expired = r->pnext;
                r->pnext = NULL;
                wake(r, WAKE_TIMEOUT);
                req_unref(r);
            }
            pthread_mutex_lock(&h->park_mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t wait = next - now;
        ts.tv_sec += (time_t)(wait / 1000000000ull);
        ts.tv_nsec += (long)(wait % 1000000000ull);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        h->timer_wait_until = next;
        pthread_cond_timedwait(&h->park_cv, &h->park_mu, &ts);
        h->timer_wait_until = 0;
    }
    pthread_mutex_unlock(&h->park_mu);
    return NULL;
}

/* ---- job-layer callbacks ---- */

static void on_submit_done(void *arg, const struct jd_submit_result *res)
{
    struct req *r = arg;
    pthread_mutex_lock(&r->mu);
    r->cb_rc = res->rc;
    r->cb_err = res->err;
    r->cb_job_id = res->job_id;
    r->cb_existing = res->existing;
    r->cb_json = res->json ? jd_xstrdup(res->json) : NULL;
    pthread_mutex_unlock(&r->mu);
    wake(r, WAKE_CHANGED);
    req_unref(r);
}

static void on_action_done(void *arg, int rc, const char *json)
{
    struct req *r = arg;
    pthread_mutex_lock(&r->mu);
    r->cb_rc = rc;
    r->cb_json = json ? jd_xstrdup(json) : NULL;
    pthread_mutex_unlock(&r->mu);
    wake(r, WAKE_CHANGED);
    req_unref(r);
}

static void on_watch(void *arg, int rc, int64_t version)
{
    struct req *r = arg;
    wake(r, rc == JD_ESHUTDOWN ? WAKE_SHUTDOWN : WAKE_CHANGED);
    req_unref(r);
}

/* ---- helpers for handlers ---- */

static const char *query(struct req *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

static const char *header(struct req *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, key);
}

static int parse_i64(const char *s, int64_t *out)
{
    if (s == NULL || *s == '\0' || strlen(s) > 18)
        return JD_EINVAL;
    int64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return JD_EINVAL;
        v = v * 10 + (*p - '0');
    }
    *out = v;
    return 0;
}

static bool job_id_from_param(struct req *r, int64_t *id)
{
    if (jd_jobs_parse_id(r->m.param, id) != 0)
        return false;
    snprintf(r->job_label, sizeof r->job_label, "%" PRId64, *id);
    return true;
}

/* Answer with the job as it is now (long-poll end, or no wait at all). */
static enum MHD_Result answer_job(struct req *r)
{
    char *json = NULL;
    int64_t version = 0;
    bool terminal = false;
    int rc = jd_jobs_get_json(jobs_of(r->h), r->job_id, &json, &version, &terminal);
    if (rc != 0)
        return respond_error(r, rc, NULL);
    char etag[32];
    snprintf(etag, sizeof etag, "\"%" PRId64 "\"", version);
    enum MHD_Result ret = respond_json(r, 200, json, MHD_HTTP_HEADER_ETAG, etag);
    free(json);
    return ret;
}

static bool parked_slot_take(struct jd_http *h)
{
    /* relaxed: a soft cap; a few over under a race is harmless */
    unsigned n = atomic_fetch_add_explicit(&h->parked_count, 1, memory_order_relaxed);
    if (n >= h->max_parked) {
        atomic_fetch_sub_explicit(&h->parked_count, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&h->metrics.parked_rejected, 1, memory_order_relaxed);
        return false;
    }
    return true;
}

/* ---- routes ---- */

static enum MHD_Result finish_parked(struct req *r);

static enum MHD_Result route_job_get(struct req *r)
{
    struct jd_http *h = r->h;
    if (!job_id_from_param(r, &r->job_id))
        return respond_bad_job_id(r);
    const char *w = query(r, "wait");
    const char *s = query(r, "since");
    if (w == NULL && s == NULL)
        return answer_job(r);
    int64_t wait_ms = h->max_wait_ms;
    if (w != NULL && (jd_duration_parse(w, &wait_ms) != 0 || wait_ms < 0))
        return respond_problem(r, 400, "wait must be a duration such as 30s or 500ms", NULL);
    if (wait_ms > h->max_wait_ms)
        wait_ms = h->max_wait_ms;
    r->since = 0;
    r->terminal_only = s == NULL;
    if (s != NULL && parse_i64(s, &r->since) != 0)
        return respond_problem(r, 400, "since must be a job version (a non-negative integer)",
                               NULL);
    /* seq_cst: pairs with jd_http_drain, which sets draining and then wakes
     * the parked list; one of the two sees the other. */
    if (wait_ms == 0 || atomic_load(&h->draining))
        return answer_job(r);
    if (!parked_slot_take(h))
        return respond_problem(r, 429, "too many waiting connections", NULL);

    arm(r);
    req_ref(r); /* for the watch callback */
    uint64_t wid = 0;
    int rc = jd_jobs_watch(jobs_of(h), r->job_id, r->since, r->terminal_only, on_watch, r, &wid);
    if (rc != 0) {
        req_unref(r);
        atomic_fetch_sub_explicit(&h->parked_count, 1, memory_order_relaxed);
        if (rc == JD_ESHUTDOWN)
            return answer_job(r);
        return respond_error(r, rc, NULL);
    }
    r->watch_id = wid;
    r->watching = true;
    r->phase = PH_PARKED;
    atomic_fetch_add_explicit(&h->metrics.parked, 1, memory_order_relaxed); /* a gauge */
    pthread_mutex_lock(&r->mu);
    bool fired = r->fired;
    if (!fired) {
        park_list_add(r, jd_now_ns() + (uint64_t)wait_ms * 1000000ull);
        r->suspended = true;
        MHD_suspend_connection(r->conn);
    }
    pthread_mutex_unlock(&r->mu);
    if (fired) /* the job changed before we could suspend: answer now */
        return finish_parked(r);
    if (atomic_load(&h->draining))
        wake(r, WAKE_SHUTDOWN); /* drain ran between our check and the list add */
    return MHD_YES;
}

static enum MHD_Result finish_parked(struct req *r)
{
    park_list_remove(r);
    watch_cancel(r);
    /* relaxed: a soft cap and a gauge */
    atomic_fetch_sub_explicit(&r->h->parked_count, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&r->h->metrics.parked, 1, memory_order_relaxed);
    return answer_job(r);
}

static enum MHD_Result route_job_list(struct req *r)
{
    struct jd_jobs_list_query q = {0};
    q.state = query(r, "state");
    q.queue = query(r, "queue");
    q.cursor = query(r, "cursor");
    const char *lim = query(r, "limit");
    if (lim != NULL) {
        int64_t v;
        if (parse_i64(lim, &v) != 0 || v < 1 || v > 1000)
            return respond_problem(r, 400, "limit must be an integer from 1 to 1000", NULL);
        q.limit = (unsigned)v;
    }
    if (q.state != NULL && jd_job_state_parse(q.state) < 0)
        return respond_problem(r, 400,
                               "state must be one of queued, running, waiting, succeeded, "
                               "failed, cancelled",
                               NULL);
    char *json = NULL;
    struct jd_error err = {0};
    int rc = jd_jobs_list_json(jobs_of(r->h), &q, &json, &err);
    if (rc == JD_EINVAL || rc == JD_EPARSE)
        return respond_problem(r, 400, err.message[0] ? err.message : "invalid query", NULL);
    if (rc != 0)
        return respond_error(r, rc, &err);
    enum MHD_Result ret = respond_json(r, 200, json, NULL, NULL);
    free(json);
    return ret;
}

/* ---- SSE ---- */

static void sse_put(struct req *r, const char *s, size_t n)
{
    if (r->sse_len + n + 1 > r->sse_cap) {
        r->sse_cap = (r->sse_len + n + 1) * 2;
        r->sse_buf = jd_xrealloc(r->sse_buf, r->sse_cap);
    }
    memcpy(r->sse_buf + r->sse_len, s, n);
    r->sse_len += n;
}

static void sse_event(void *arg, int64_t seq, const char *kind, const char *event_json)
{
    struct req *r = arg;
    char head[96];
    int n = snprintf(head, sizeof head, "id: %" PRId64 "\nevent: %s\ndata: ", seq, kind);
    sse_put(r, head, (size_t)n);
    /* event_json is one line (compact JSON); guard anyway so a newline can
     * never end the data field early */
    for (const char *p = event_json; *p; p++) {
        if (*p == '\n' || *p == '\r')
            sse_put(r, " ", 1);
        else
            sse_put(r, p, 1);
    }
    sse_put(r, "\n\n", 2);
    if (seq > r->sse_seq)
        r->sse_seq = seq;
}

/* Fill the buffer with what is new; sets sse_end when the job is terminal
 * and everything up to its final version has been written. */
static void sse_refill(struct req *r)
{
    struct jd_jobs *j = jobs_of(r->h);
    r->sse_len = r->sse_off = 0;
    if (r->sse_heartbeat) {
        sse_put(r, ": heartbeat\n\n", 13);
        r->sse_heartbeat = false;
    }
    int rc = jd_jobs_events_each(j, r->job_id, r->sse_seq, sse_event, r);
    if (rc < 0) {
        r->sse_end = true;
        return;
    }
    char *json = NULL;
    int64_t version = 0;
    bool terminal = false;
    if (jd_jobs_get_json(j, r->job_id, &json, &version, &terminal) != 0) {
        r->sse_end = true;
        return;
    }
    free(json);
    if (terminal && r->sse_seq >= version) {
        sse_put(r, "event: end\ndata: {}\n\n", 21);
        r->sse_end = true;
    }
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct req *r = cls;
    struct jd_http *h = r->h;
    if (r->phase == PH_PARKED) { /* resumed: by a change, a heartbeat or drain */
        pthread_mutex_lock(&r->mu);
        enum wake why = r->wake;
        r->armed = false;
        pthread_mutex_unlock(&r->mu);
        park_list_remove(r);
        watch_cancel(r);
        r->phase = PH_DONE;
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
        sse_refill(r);
        if (r->sse_len > 0 || r->sse_end)
            continue;
        if (atomic_load(&h->draining)) { /* seq_cst: see route_job_get */
            r->sse_end = true;
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        /* Nothing new: park until the job changes or the heartbeat is due. */
        arm(r);
        req_ref(r);
        uint64_t wid = 0;
        int rc = jd_jobs_watch(jobs_of(h), r->job_id, r->sse_seq, false, on_watch, r, &wid);
        if (rc != 0) {
            req_unref(r);
            r->sse_end = true;
            continue;
        }
        r->watch_id = wid;
        r->watching = true;
        r->phase = PH_PARKED;
        pthread_mutex_lock(&r->mu);
        bool fired = r->fired;
        if (!fired) {
            park_list_add(r, jd_now_ns() + (uint64_t)h->heartbeat_ms * 1000000ull);
            r->suspended = true;
            MHD_suspend_connection(r->conn);
        }
        pthread_mutex_unlock(&r->mu);
        if (!fired) {
            if (atomic_load(&h->draining))
                wake(r, WAKE_SHUTDOWN);
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

static void sse_free(void *cls)
{
    req_unref(cls);
}

static enum MHD_Result route_job_events(struct req *r)
{
    struct jd_http *h = r->h;
    if (!job_id_from_param(r, &r->job_id))
        return respond_bad_job_id(r);
    int64_t after = 0;
    const char *a = query(r, "after");
    const char *leid = header(r, "Last-Event-ID");
    if (a != NULL && parse_i64(a, &after) != 0)
        return respond_problem(r, 400, "after must be an event sequence number", NULL);
    const char *accept = header(r, MHD_HTTP_HEADER_ACCEPT);
    bool sse = accept != NULL && strstr(accept, "text/event-stream") != NULL;
    if (!sse) {
        unsigned limit = 1000;
        const char *lim = query(r, "limit");
        if (lim != NULL) {
            int64_t v;
            if (parse_i64(lim, &v) != 0 || v < 1 || v > 10000)
                return respond_problem(r, 400, "limit must be an integer from 1 to 10000", NULL);
            limit = (unsigned)v;
        }
        char *json = NULL;
        int rc = jd_jobs_events_json(jobs_of(h), r->job_id, after, limit, &json);
        if (rc != 0)
            return respond_error(r, rc, NULL);
        enum MHD_Result ret = respond_json(r, 200, json, NULL, NULL);
        free(json);
        return ret;
    }
    if (leid != NULL && parse_i64(leid, &after) != 0)
        return respond_problem(r, 400, "Last-Event-ID must be an event sequence number", NULL);
    char *json = NULL;
    int64_t version;
    bool terminal;
    int rc = jd_jobs_get_json(jobs_of(h), r->job_id, &json, &version, &terminal);
    if (rc != 0)
        return respond_error(r, rc, NULL);
    free(json);
    if (!parked_slot_take(h))
        return respond_problem(r, 429, "too many streaming connections", NULL);
    r->is_sse = true;
    r->sse_seq = after;
    r->phase = PH_DONE;
    req_ref(r); /* the response's reference, dropped by sse_free */
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_reader, r, sse_free);
    if (resp == NULL) {
        req_unref(r);
        r->is_sse = false;
        atomic_fetch_sub_explicit(&h->parked_count, 1, memory_order_relaxed);
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

/* ---- asynchronous actions (answered after the commit) ---- */

static enum MHD_Result finish_async(struct req *r)
{
    int rc;
    char *json;
    pthread_mutex_lock(&r->mu);
    rc = r->cb_rc;
    json = r->cb_json;
    r->cb_json = NULL;
    r->armed = false;
    pthread_mutex_unlock(&r->mu);
    enum MHD_Result ret;
    if (rc != 0) {
        ret = respond_error(r, rc, r->cb_err.code ? &r->cb_err : NULL);
    } else if (r->m.route == JD_ROUTE_JOB_SUBMIT) {
        char loc[48];
        snprintf(loc, sizeof loc, "/v1/jobs/%" PRId64, r->cb_job_id);
        snprintf(r->job_label, sizeof r->job_label, "%" PRId64, r->cb_job_id);
        char *b = jd_xasprintf("%s\n", json ? json : "{}");
        ret = respond(r, 201, "application/json", b, strlen(b), MHD_HTTP_HEADER_LOCATION, loc,
                      r->cb_existing ? "Idempotent-Replayed" : NULL, "true");
    } else if (r->m.route == JD_ROUTE_JOB_BATCH) {
        ret = respond_json(r, 201, json ? json : "{}", NULL, NULL);
    } else if (r->m.route == JD_ROUTE_QUEUE_PAUSE || r->m.route == JD_ROUTE_QUEUE_RESUME) {
        if (json != NULL) {
            ret = respond_json(r, 200, json, NULL, NULL);
        } else {
            char *b = jd_xasprintf("{\"name\":\"%s\",\"paused\":%s}\n", r->m.param,
                                   r->m.route == JD_ROUTE_QUEUE_PAUSE ? "true" : "false");
            ret = respond(r, 200, "application/json", b, strlen(b), NULL, NULL, NULL, NULL);
        }
    } else {
        ret = respond_json(r, 202, json ? json : "{}", NULL, NULL);
    }
    free(json);
    return ret;
}

/* The job layer accepted r for a callback (rc 0) or refused it at once. */
static enum MHD_Result async_started(struct req *r, int rc, const struct jd_error *err)
{
    if (rc != 0) {
        req_unref(r); /* the callback's reference: it will never run */
        pthread_mutex_lock(&r->mu);
        r->armed = false;
        pthread_mutex_unlock(&r->mu);
        return respond_error(r, rc, err);
    }
    r->phase = PH_ASYNC;
    if (fired_or_suspend(r))
        return finish_async(r);
    return MHD_YES;
}

static bool queue_name_ok(const char *q)
{
    size_t n = strlen(q);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = q[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              c == '-' || c == '_' || c == '.'))
            return false;
    }
    return true;
}

static bool route_takes_json_body(enum jd_route rt)
{
    return rt == JD_ROUTE_JOB_SUBMIT || rt == JD_ROUTE_JOB_BATCH || rt == JD_ROUTE_JOB_MESSAGE;
}

static enum MHD_Result route_post(struct req *r)
{
    struct jd_http *h = r->h;
    struct jd_jobs *j = jobs_of(h);
    struct jd_error err = {0};
    int64_t id = 0;
    int rc;
    /* seq_cst: a request arriving after drain began must not start work */
    if (atomic_load(&h->draining))
        return respond_problem(r, 503, "the server is shutting down", NULL);
    if (route_takes_json_body(r->m.route)) {
        if (r->len == 0)
            return respond_problem(r, 400, "the request needs a JSON body", NULL);
        if (!jd_utf8_valid(r->body, r->len))
            return respond_problem(r, 400, "the body is not valid UTF-8", NULL);
    }
    switch (r->m.route) {
    case JD_ROUTE_JOB_SUBMIT: {
        const char *key = header(r, "Idempotency-Key");
        if (key != NULL && (key[0] == '\0' || strlen(key) > IDEM_KEY_MAX))
            return respond_problem(r, 400, "Idempotency-Key must be 1 to 255 characters", NULL);
        arm(r);
        req_ref(r);
        rc = jd_jobs_submit(j, r->body ? r->body : "", r->len, key, on_submit_done, r, &err);
        return async_started(r, rc, &err);
    }
    case JD_ROUTE_JOB_BATCH:
        arm(r);
        req_ref(r);
        rc = jd_jobs_submit_batch(j, r->body ? r->body : "", r->len, on_submit_done, r, &err);
        return async_started(r, rc, &err);
    case JD_ROUTE_JOB_CANCEL:
        if (!job_id_from_param(r, &id))
            return respond_bad_job_id(r);
        arm(r);
        req_ref(r);
        rc = jd_jobs_cancel(j, id, on_action_done, r);
        if (rc == JD_ECONFLICT)
            jd_error_set(&err, rc, NULL, "job %" PRId64 " is already finished", id);
        return async_started(r, rc, &err);
    case JD_ROUTE_JOB_MESSAGE:
        if (!job_id_from_param(r, &id))
            return respond_bad_job_id(r);
        arm(r);
        req_ref(r);
        rc = jd_jobs_message(j, id, r->body ? r->body : "", r->len, on_action_done, r, &err);
        if (rc == JD_ECONFLICT && err.message[0] == '\0')
            jd_error_set(&err, rc, NULL, "job %" PRId64 " is already finished", id);
        return async_started(r, rc, &err);
    case JD_ROUTE_JOB_RETRY:
        if (!job_id_from_param(r, &id))
            return respond_bad_job_id(r);
        arm(r);
        req_ref(r);
        rc = jd_jobs_retry(j, id, on_action_done, r);
        if (rc == JD_ECONFLICT)
            jd_error_set(&err, rc, NULL, "only failed or cancelled jobs can be retried");
        return async_started(r, rc, &err);
    case JD_ROUTE_QUEUE_PAUSE:
    case JD_ROUTE_QUEUE_RESUME:
        if (!queue_name_ok(r->m.param))
            return respond_problem(r, 404, "no such queue (names are [A-Za-z0-9._-]{1,64})", NULL);
        arm(r);
        req_ref(r);
        rc = jd_jobs_queue_pause(j, r->m.param, r->m.route == JD_ROUTE_QUEUE_PAUSE, on_action_done,
                                 r);
        return async_started(r, rc, &err);
    default:
        return respond_problem(r, 500, "unrouted POST", NULL);
    }
}

static enum MHD_Result dispatch(struct req *r)
{
    struct jd_http *h = r->h;
    struct jd_jobs *j = jobs_of(h);
    char *text = NULL;
    int rc;
    switch (r->m.route) {
    case JD_ROUTE_LIVEZ:
        text = jd_xstrdup("{\"status\":\"ok\"}\n");
        return respond(r, 200, "application/json", text, strlen(text), NULL, NULL, NULL, NULL);
    case JD_ROUTE_READYZ:
        if (j == NULL)
            return respond_problem(r, 503, "starting: recovering jobs", NULL);
        if (atomic_load(&h->draining))
            return respond_problem(r, 503, "draining: shutting down", NULL);
        text = jd_xstrdup("{\"status\":\"ready\"}\n");
        return respond(r, 200, "application/json", text, strlen(text), NULL, NULL, NULL, NULL);
    case JD_ROUTE_METRICS: {
        struct jd_metrics_sources src = {.http = &h->metrics};
        struct jd_jobs_stats js;
        struct jd_sched_stats ss;
        struct jd_store_stats st;
        struct jd_registry_stats rs;
        if (j != NULL) {
            jd_jobs_stats(j, &js);
            jd_sched_stats(jd_jobs_sched(j), &ss);
            jd_registry_stats(jd_jobs_registry(j), &rs);
            src.jobs = &js;
            src.sched = &ss;
            src.registry = &rs;
        }
        struct jd_queue_counts *qc = NULL;
        size_t nq = 0;
        if (h->store != NULL) {
            jd_store_stats(h->store, &st);
            src.store = &st;
            if (jd_store_queue_counts(h->store, &qc, &nq) == 0) {
                src.queues = qc;
                src.nqueues = nq;
            }
        }
        src.ready = j != NULL && !atomic_load(&h->draining);
        text = jd_metrics_render(&src);
        if (qc != NULL)
            jd_queue_counts_free(qc, nq);
        return respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text), NULL,
                       NULL, NULL, NULL);
    }
    case JD_ROUTE_OPENAPI:
        text = jd_xstrdup(jd_openapi_yaml);
        return respond(r, 200, "application/yaml", text, strlen(text), NULL, NULL, NULL, NULL);
    default:
        break;
    }
    /* Everything below needs the job layer. */
    if (j == NULL)
        return respond_problem(r, 503, "starting: recovering jobs", NULL);
    switch (r->m.route) {
    case JD_ROUTE_JOB_GET:
        return route_job_get(r);
    case JD_ROUTE_JOB_LIST:
        return route_job_list(r);
    case JD_ROUTE_JOB_EVENTS:
        return route_job_events(r);
    case JD_ROUTE_HANDLERS:
        rc = jd_jobs_handlers_json(j, &text);
        break;
    case JD_ROUTE_QUEUES:
        rc = jd_jobs_queues_json(j, &text);
        break;
    default:
        return route_post(r);
    }
    if (rc != 0)
        return respond_error(r, rc, NULL);
    enum MHD_Result ret = respond_json(r, 200, text, NULL, NULL);
    free(text);
    return ret;
}

/* First call for a request: route, authenticate, check the headers. Returns
 * MHD_YES with r->phase PH_DONE when it already answered. */
static enum MHD_Result first_call(struct req *r)
{
    struct jd_http *h = r->h;
    if (r->match_rc == JD_ENOENT) {
        char d[200];
        snprintf(d, sizeof d, "no route for %.16s %.120s (the routes are in /v1/openapi.yaml)",
                 r->method, r->path ? r->path : "");
        return respond_problem(r, 404, d, NULL);
    }
    if (r->match_rc == JD_ECONFLICT)
        return respond_problem(r, 405, "method not allowed on this route", NULL);
    if (h->token != NULL && jd_route_is_v1(r->m.route) &&
        !jd_auth_bearer_ok(header(r, MHD_HTTP_HEADER_AUTHORIZATION), h->token))
        return respond_problem(r, 401, "missing or wrong bearer token", NULL);
    const char *cl = header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl != NULL) {
        int64_t n;
        if (parse_i64(cl, &n) != 0 || (uint64_t)n > h->max_body) {
            char d[96];
            snprintf(d, sizeof d, "request body over the limit of %zu bytes", h->max_body);
            return respond_problem(r, 413, d, NULL);
        }
    }
    if (route_takes_json_body(r->m.route) &&
        !jd_content_type_is_json(header(r, MHD_HTTP_HEADER_CONTENT_TYPE))) {
        char d[200];
        const char *ct = header(r, MHD_HTTP_HEADER_CONTENT_TYPE);
        snprintf(d, sizeof d,
                 "the body must be JSON: send it with -H 'Content-Type: application/json' "
                 "(got %.80s)",
                 ct ? ct : "no Content-Type");
        return respond_problem(r, 415, d, NULL);
    }
    r->phase = PH_BODY;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct jd_http *h = cls;
    struct req *r = *con_cls;
    if (r == NULL) {
        r = jd_xcalloc(1, sizeof *r);
        r->h = h;
        r->conn = conn;
        atomic_init(&r->refs, 1); /* MHD's, dropped in on_completed */
        pthread_mutex_init(&r->mu, NULL);
        r->start_ns = jd_now_ns();
        snprintf(r->method, sizeof r->method, "%s", method);
        r->path = jd_xstrdup(url);
        make_request_id(h, r);
        r->match_rc = jd_router_match(method, url, &r->m);
        *con_cls = r;
        /* relaxed: only the decrement publishes anything (see on_completed) */
        atomic_fetch_add_explicit(&h->inflight, 1, memory_order_relaxed);
        return first_call(r);
    }
    switch (r->phase) {
    case PH_BODY:
        if (*upload_data_size > 0) {
            size_t n = *upload_data_size;
            *upload_data_size = 0;
            if (r->too_big || r->len + n > h->max_body) {
                /* libmicrohttpd 0.9.75 cannot queue a response mid-upload,
                 * so an oversized chunked body is read and dropped, and the
                 * 413 goes out at its end; a body that keeps coming past
                 * the discard limit gets its connection closed instead. */
                r->too_big = true;
                r->discarded += n;
                if (r->discarded > DISCARD_LIMIT) {
                    r->status = 413;
                    return MHD_NO;
                }
                return MHD_YES;
            }
            if (r->len + n + 1 > r->cap) {
                r->cap = (r->len + n + 1) * 2;
                if (r->cap > h->max_body + 1)
                    r->cap = h->max_body + 1;
                r->body = jd_xrealloc(r->body, r->cap);
            }
            memcpy(r->body + r->len, upload_data, n);
            r->len += n;
            r->body[r->len] = '\0';
            return MHD_YES;
        }
        if (r->too_big) {
            char d[96];
            snprintf(d, sizeof d, "request body over the limit of %zu bytes", h->max_body);
            return respond_problem(r, 413, d, NULL);
        }
        return dispatch(r);
    case PH_ASYNC:
        return finish_async(r);
    case PH_PARKED:
        return finish_parked(r);
    case PH_NEW:
    case PH_DONE:
        /* Late body bytes after an early answer: swallow them. */
        *upload_data_size = 0;
        return MHD_YES;
    }
    return MHD_NO;
}

/* ---- lifecycle ---- */

static int resolve_addr(const char *host, uint16_t port, struct sockaddr_storage *ss,
                        socklen_t *len)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0 || res == NULL)
        return JD_EINVAL;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static void mhd_panic(void *cls, const char *file, unsigned int line, const char *reason)
{
    char where[256];
    snprintf(where, sizeof where, "%s:%u", file ? file : "?", line);
    jd_log(JD_LOG_ERROR, "libmicrohttpd panic", "where", where, "reason", reason ? reason : "",
           NULL);
    abort();
}

/* Stop the long-poll timer thread (if it was started) and free the server. */
static void free_server(struct jd_http *h)
{
    if (h->timer_started) {
        pthread_mutex_lock(&h->park_mu);
        h->timer_stop = true;
        pthread_cond_signal(&h->park_cv);
        pthread_mutex_unlock(&h->park_mu);
        pthread_join(h->timer, NULL);
    }
    pthread_cond_destroy(&h->park_cv);
    pthread_mutex_destroy(&h->park_mu);
    free(h->token);
    free(h);
}

int jd_http_start(const struct jd_http_config *cfg, struct jd_http **out, struct jd_error *err)
{
    struct jd_http *h = jd_xcalloc(1, sizeof *h);
    struct sockaddr_storage ss;
    socklen_t slen = 0;
    int rc;
    h->quiesced_fd = MHD_INVALID_SOCKET;
    h->token = (cfg->token && cfg->token[0]) ? jd_xstrdup(cfg->token) : NULL;
    h->max_body = cfg->max_body ? cfg->max_body : (size_t)4 << 20;
    h->max_parked = cfg->max_parked ? cfg->max_parked : 512;
    h->max_wait_ms = cfg->max_wait_ms ? cfg->max_wait_ms : 60000;
    h->heartbeat_ms = cfg->heartbeat_ms ? cfg->heartbeat_ms : 15000;
    h->store = cfg->store;
    atomic_init(&h->jobs, NULL);
    atomic_init(&h->draining, false);
    atomic_init(&h->inflight, 0);
    atomic_init(&h->parked_count, 0);
    atomic_init(&h->rid_counter, 1);
    if (getrandom(&h->rid_seed, sizeof h->rid_seed, 0) != sizeof h->rid_seed)
        h->rid_seed = (uint64_t)jd_wall_ms() ^ ((uint64_t)getpid() << 32);
    pthread_mutex_init(&h->park_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->park_cv, &ca);
    pthread_condattr_destroy(&ca);

    if (resolve_addr(cfg->host ? cfg->host : "127.0.0.1", cfg->port, &ss, &slen) != 0) {
        rc = jd_error_set(err, JD_EINVAL, NULL, "cannot resolve listen host \"%s\"",
                          cfg->host ? cfg->host : "");
        goto fail;
    }
    if (pthread_create(&h->timer, NULL, timer_main, h) != 0) {
        rc = jd_error_set(err, JD_EIO, NULL, "cannot start the HTTP timer thread");
        goto fail;
    }
    h->timer_started = true;
    MHD_set_panic_func(mhd_panic, NULL);
    /* poll, not epoll: libmicrohttpd 0.9.75's epoll loop takes events in
     * batches of 128 and, when a batch comes back full, waits for the next
     * one with the idle timeout (the connection timeout, 30 s) instead of
     * not at all, sleeping on the 128 requests it was just told about. An
     * event-loop thread with >= 128 connections all ready at once (the e2e
     * bench at 256 connections, about one run in ten with the completion
     * thread) then answers nothing until the timeout closes them. poll()
     * has no such batch; test_http's burst test covers it. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->daemon = MHD_start_daemon(
        flags, cfg->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(cfg->threads ? cfg->threads : 2),
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->max_connections ? cfg->max_connections : 1000),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(cfg->conn_timeout_s ? cfg->conn_timeout_s : 30),
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_END);
    if (h->daemon == NULL) {
        rc = jd_error_set(err, JD_EIO, NULL, "cannot listen on %s:%u (%s)",
                          cfg->host ? cfg->host : "127.0.0.1", cfg->port,
                          errno ? strerror(errno) : "libmicrohttpd failed to start");
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : cfg->port;
    *out = h;
    return 0;
fail:
    free_server(h);
    return rc;
}

uint16_t jd_http_port(const struct jd_http *h)
{
    return h->port;
}

void jd_http_attach(struct jd_http *h, struct jd_jobs *jobs)
{
    /* release: handlers that see the pointer see the finished job layer */
    atomic_store_explicit(&h->jobs, jobs, memory_order_release);
}

static void wake_all_parked(struct jd_http *h)
{
    pthread_mutex_lock(&h->park_mu);
    struct req *list = h->parked_head;
    h->parked_head = NULL;
    for (struct req *r = list; r != NULL; r = r->pnext)
        r->on_list = false;
    pthread_mutex_unlock(&h->park_mu);
    while (list != NULL) { /* the list's references are ours now */
        struct req *r = list;
        list = r->pnext;
        r->pnext = r->pprev = NULL;
        wake(r, WAKE_SHUTDOWN);
        req_unref(r);
    }
}

void jd_http_drain(struct jd_http *h)
{
    if (atomic_exchange(&h->draining, true)) /* seq_cst: see route_job_get */
        return;
    if (h->daemon != NULL && h->quiesced_fd == MHD_INVALID_SOCKET) {
        h->quiesced_fd = MHD_quiesce_daemon(h->daemon);
        /* The socket must stay open until MHD_stop_daemon, but clients
         * connecting now should be refused at once, not left in the
         * backlog: shutdown() stops the listening without freeing the fd. */
        if (h->quiesced_fd != MHD_INVALID_SOCKET)
            shutdown(h->quiesced_fd, SHUT_RDWR);
    }
    wake_all_parked(h);
}

void jd_http_stop(struct jd_http *h, int64_t timeout_ms)
{
    if (h == NULL)
        return;
    jd_http_drain(h);
    uint64_t deadline = jd_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
    /* acquire: pairs with the release decrement in on_completed */
    while (atomic_load_explicit(&h->inflight, memory_order_acquire) > 0 && jd_now_ns() < deadline) {
        wake_all_parked(h); /* an SSE stream may have parked again */
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    wake_all_parked(h);
    unsigned left = atomic_load_explicit(&h->inflight, memory_order_acquire);
    if (left > 0) {
        char n[16];
        snprintf(n, sizeof n, "%u", left);
        jd_log(JD_LOG_WARN, "stopping HTTP with requests still in flight", "requests", n, NULL);
    }
    if (h->daemon != NULL)
        MHD_stop_daemon(h->daemon);
    if (h->quiesced_fd != MHD_INVALID_SOCKET)
        close(h->quiesced_fd);
    free_server(h);
}
