/*
 * Internals of the HTTP server shared by its files. Not a public contract
 * (that is http.h): only api/ files of the server include it.
 *
 *   http.c           MHD daemon, connection lifecycle, body, auth, dispatch
 *   park.c           waiting requests: suspend/resume, parked list and its
 *                    timer, job-layer callbacks, long-poll end, SSE stream
 *   routes_jobs.c    /v1/jobs handlers
 *   routes_queues.c  /v1/queues handlers
 *   routes_schedules.c /v1/schedules handlers
 *   routes_misc.c    /livez, /readyz, /metrics, /v1/openapi.yaml, /v1/handlers
 *   routes_ui.c      the dashboard (files under /ui/, / redirects) and /v1/stats
 *
 * Threading: a struct jd_req is used by one MHD pool thread at a time (the
 * one handling its connection); fields under "waiting" are guarded by
 * req->mu because job-layer callbacks set them from other threads, and the
 * parked-list fields by h->park_mu. Lock order: req->mu before h->park_mu.
 * A struct jd_http is written by its owner thread (start/attach/drain/stop)
 * and otherwise read; its counters are atomics.
 */
#ifndef JD_API_HTTP_IMPL_H
#define JD_API_HTTP_IMPL_H

#include "api/http.h"
#include "api/metrics.h"
#include "api/router.h"
#include "common/error.h"
#include "server/jobs.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define REQ_ID_MAX 64    /* longer client ids are replaced by ours */
#define IDEM_KEY_MAX 255 /* as the common SaaS limits */

struct jd_req;
/* Answers a request whose job-layer callback succeeded; json is the
 * callback's (borrowed; may be NULL). */
typedef enum MHD_Result jd_async_answer_fn(struct jd_req *r, const char *json);
/* Hands r to the job layer with a done callback (http_on_*_done, r):
 * returns 0 when the callback will fire, or a JD_E* code with err filled
 * when it was refused at once. May run on the slow lane's thread
 * (offload.c): it reads r's fields and calls the job layer, nothing else. */
typedef int jd_async_start_fn(struct jd_req *r, struct jd_error *err);

struct jd_http {
    struct MHD_Daemon *daemon;
    MHD_socket quiesced_fd;
    uint16_t port;
    char *token;
    char *worker_token; /* or NULL */
    size_t max_body;
    unsigned max_parked;
    int64_t max_wait_ms, heartbeat_ms;
    struct jd_store *store;
    bool ui_off; /* --ui off */

    _Atomic(struct jd_jobs *) jobs;           /* release on attach: handlers see a built layer */
    _Atomic(struct jd_schedules *) schedules; /* likewise (attached before jobs) */
    atomic_bool draining;     /* seq_cst everywhere: checked before parking, set before
                                 waking, so a waiter either sees it or gets woken */
    atomic_uint inflight;     /* requests between first call and completion */
    atomic_uint parked_count; /* long-polls parked + SSE streams alive */
    atomic_uint_fast64_t rid_counter;
    atomic_uint_fast64_t serial_counter; /* request serials: 1, 2, ... */
    uint64_t rid_seed;

    pthread_mutex_t park_mu;
    struct jd_req *parked_head; /* doubly linked, holds a reference on each */
    bool timer_stop;
    uint64_t timer_wait_until; /* park_mu: the timer sleeps until this, or 0 if awake */
    /* The timer thread sleeps in epoll_wait on park_ep: the sockets of
     * parked (suspended) connections, keyed by request serial, report a
     * client hang-up; park_evfd (key 0) wakes it for an earlier deadline. */
    int park_ep, park_evfd;
    struct jd_linger *linger;   /* lingering closes (linger.c) */
    struct jd_offload *offload; /* the slow lane for large bodies (offload.c) */
    struct jd_forward *fwd;     /* a cluster node's task forwarding (forward.c), or NULL */
    pthread_t timer;
    bool timer_started;

    struct jd_http_metrics metrics;
};

enum phase { PH_NEW, PH_BODY, PH_ASYNC, PH_PARKED, PH_DONE };
/* WAKE_GONE: the client hung up while the request was parked. */
enum wake { WAKE_NONE, WAKE_CHANGED, WAKE_TIMEOUT, WAKE_SHUTDOWN, WAKE_GONE };

struct jd_req {
    struct jd_http *h;
    struct MHD_Connection *conn;
    atomic_int refs; /* acq_rel on drop: the freeing thread sees every write */
    pthread_mutex_t mu;
    uint64_t serial; /* unique per server run; never 0 (the key of a hang-up watch) */

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
    bool armed;       /* a callback or deadline may fire */
    bool suspended;   /* MHD_suspend_connection called, resume not yet */
    bool hup_watched; /* the socket is in h->park_ep (only while parked and suspended) */
    bool fired;
    enum wake wake;
    int cb_rc;
    char *cb_json;
    bool cb_json_room;  /* cb_json was made by http_answer_dup: room for the newline */
    int64_t cb_version; /* a long-poll's cb_json: the job's version (its ETag) */
    int64_t cb_job_id;
    bool cb_existing;
    int cb_unique; /* jd_submit_result.unique */
    struct jd_error cb_err;
    jd_async_answer_fn *answer;       /* the success answer once the callback fired; NULL: 202 */
    jd_async_start_fn *offload_start; /* queued on the slow lane: what it runs */
    struct jd_req *onext;             /* the slow lane's queue (its mutex) */
    const char *idem_key;             /* Idempotency-Key (MHD's, valid until completion) */
    const char *traceparent;          /* traceparent header if valid (MHD's, as idem_key) */
    int relay_status;         /* forward.c: the owner node's status (cb_json its body), or 0: */
    int relay_rc;             /* ... a refusal made here, with relay_reason and cb_err */
    const char *relay_reason; /* static: "lease_lost", "completed", "cancelled" or NULL */

    /* The body being answered (the callback's cb_json, owned by the thread
     * answering) and whether it has room for a newline: http_answer_body
     * takes it instead of copying it; freed after the answer otherwise. */
    char *ans_json;
    bool ans_room;

    /* parked list (under h->park_mu) */
    struct jd_req *pprev, *pnext;
    bool on_list;
    uint64_t deadline_ns;
    /* watch and slot (owner: the thread currently handling the request) */
    uint64_t watch_id;
    bool watching;
    bool holds_slot; /* counts in parked_count and the parked gauge */

    /* long-poll / SSE */
    int64_t job_id;
    int64_t since;
    bool terminal_only;
    /* POST /v1/jobs?wait=: the submit's answer waits for the job to end
     * (submit_wait_ms, capped); submit_status is 201 or 200 (a unique
     * key's holder), and the answer carries Location and ETag. */
    int64_t submit_wait_ms;
    int submit_status;
    bool replayed; /* the answer says Idempotent-Replayed: true */
    bool is_sse;
    int64_t sse_seq;
    char *sse_buf; /* one page of events: about SSE_PAGE_BYTES (park.c) */
    size_t sse_len, sse_off, sse_cap;
    bool sse_end;
    bool sse_heartbeat;
    /* GET /v1/events as SSE: the stream's filter (owned; NULL for a job's
     * stream), and the commit count read before the last refill */
    struct jd_events_sub *evsub;
    uint64_t ev_commits;
};

/* http.c: references, responses and request helpers (the request's MHD thread) */
void http_req_ref(struct jd_req *r);
void http_req_unref(struct jd_req *r);
struct jd_jobs *http_jobs_of(struct jd_http *h);
struct jd_schedules *http_schedules_of(struct jd_http *h); /* NULL until attached */
enum MHD_Result http_respond(struct jd_req *r, int status, const char *ctype, char *body,
                             size_t len, const char *h1, const char *v1, const char *h2,
                             const char *v2);
enum MHD_Result http_respond_json(struct jd_req *r, int status, const char *json, const char *h1,
                                  const char *v1);
/* A copy of json with a byte to spare, for a callback's cb_json (set
 * cb_json_room with it): its answer can then add the newline in place. */
char *http_answer_dup(const char *json);
/* json and a newline as a body for http_respond (*len bytes): r's
 * ans_json itself when json is it and has room (taken: no copy), else a
 * new copy. */
char *http_answer_body(struct jd_req *r, const char *json, size_t *len);
enum MHD_Result http_respond_problem(struct jd_req *r, int status, const char *detail,
                                     const char *pointer);
enum MHD_Result http_respond_error(struct jd_req *r, int rc, const struct jd_error *err);
enum MHD_Result http_respond_json_rc(struct jd_req *r, int rc, char *json);
enum MHD_Result http_respond_put(struct jd_req *r, const char *json, const char *collection);
enum MHD_Result http_respond_bad_job_id(struct jd_req *r);
const char *http_query(struct jd_req *r, const char *key);
/* ?limit=: *out is dflt when absent, else an integer from 1 to max. On a
 * bad one returns false after answering 400 (*ret holds the answer). */
bool http_query_limit(struct jd_req *r, unsigned dflt, unsigned max, unsigned *out,
                      enum MHD_Result *ret);
const char *http_header(struct jd_req *r, const char *key);
int http_parse_i64(const char *s, int64_t *out);

/* park.c: waiting (see its file comment for threads). A handler that hands
 * r to the job layer calls http_arm, takes a reference for the callback
 * (http_req_ref) and passes http_on_submit_done / http_on_action_done /
 * http_on_watch with r as arg (each drops that reference), then returns
 * http_async_started (a done callback) or parks (a watch). */
void http_arm(struct jd_req *r);
void http_wake(struct jd_req *r, enum wake why);
void http_park_list_add(struct jd_req *r, uint64_t deadline_ns);
/* Suspend a parked request (r->mu held) and watch its socket for a hang-up. */
void http_park_suspend_locked(struct jd_req *r);
int http_timer_init(struct jd_http *h);  /* the epoll set and eventfd; 0 or JD_EIO */
void http_timer_stop(struct jd_http *h); /* stop and join the timer, close its fds */
void *http_timer_main(void *arg);
void http_on_submit_done(void *arg, const struct jd_submit_result *res);
void http_on_action_done(void *arg, int rc, const char *json);
void http_on_watch(void *arg, int rc, int64_t version);
/* http_on_watch for a long-poll: keeps the job's JSON, when the commit
 * brought it, as the answer (cb_json, cb_version). */
void http_on_watch_json(void *arg, int rc, int64_t version, const char *json);
/* Take a parked slot for r (false: --max-parked reached, counted). */
bool http_parked_slot_take(struct jd_req *r);
/* The request ends, however it ends (on_completed): leave the parked list,
 * withdraw the watch, give back the slot, and let no callback resume it. */
void http_park_release(struct jd_req *r);
enum MHD_Result http_finish_parked(struct jd_req *r);
ssize_t http_sse_reader(void *cls, uint64_t pos, char *buf, size_t max);
void http_sse_free(void *cls);
enum MHD_Result http_finish_async(struct jd_req *r);
/* The job layer accepted r for a callback (rc 0) or refused it at once
 * (rc, err: the problem). Once the callback fired with success, `answer`
 * (NULL: 202 with the callback's JSON) answers; an error becomes its
 * problem. */
enum MHD_Result http_async_started(struct jd_req *r, int rc, const struct jd_error *err,
                                   jd_async_answer_fn *answer);
void http_wake_all_parked(struct jd_http *h);

/* offload.c: start r's asynchronous work (start, then answer once its
 * callback fired, as http_async_started) on this thread for a small body,
 * or on the slow lane for a large one. */
enum MHD_Result http_async_run(struct jd_req *r, jd_async_start_fn *start,
                               jd_async_answer_fn *answer);
struct jd_offload;
int http_offload_start(struct jd_offload **out); /* 0 or JD_EIO */
void http_offload_stop(struct jd_offload *o);    /* runs what is queued first */

/* forward.c: send r (a heartbeat, complete or fail: which 2, 0, 1) for a
 * task of another node to that node, and answer with what it answers; or
 * (which -1, node unused) a batch of ends, already checked, whose items
 * name other nodes: each node ends its own; or (which -2, node: ?within=
 * in ms) GET /v1/workers across every live node (api/forward.h). */
enum MHD_Result http_forward_relay(struct jd_req *r, int64_t node, int which);

/* linger.c: lingering close (see its file comment). http_linger_add takes
 * ownership of fd (a socket whose answer has been written) and closes it
 * after the client stops sending, or after a bounded time and size. */
struct jd_linger;
int http_linger_start(struct jd_linger **out); /* 0 or JD_EIO */
void http_linger_add(struct jd_linger *l, int fd);
void http_linger_stop(struct jd_linger *l); /* closes what still lingers */

/* A route's handler (the handler column of api/routes.h). */
typedef enum MHD_Result jd_route_fn(struct jd_req *r);

/* Route handlers: each answers or suspends its request. http.c's dispatch
 * calls them on the request's MHD thread once the body is complete.
 * routes_jobs.c (http_answer_job: the job as it is now, for long-polls): */
enum MHD_Result http_answer_job(struct jd_req *r);
/* Answer 200 with this rendering of the job at version (its ETag). */
enum MHD_Result http_respond_job(struct jd_req *r, const char *json, int64_t version);
enum MHD_Result route_job_get(struct jd_req *r);
enum MHD_Result route_job_list(struct jd_req *r);
enum MHD_Result route_job_events(struct jd_req *r);
enum MHD_Result route_job_submit(struct jd_req *r);
enum MHD_Result route_job_batch(struct jd_req *r);
enum MHD_Result route_job_cancel(struct jd_req *r);
enum MHD_Result route_job_message(struct jd_req *r);
enum MHD_Result route_job_retry(struct jd_req *r);
/* routes_find.c (issue 19) */
enum MHD_Result route_job_delete(struct jd_req *r);
enum MHD_Result route_jobs_bulk(struct jd_req *r);
enum MHD_Result route_operation_get(struct jd_req *r);
enum MHD_Result route_events(struct jd_req *r);
/* park.c: stream r (its sse_* fields set, a parked slot taken) as SSE. */
enum MHD_Result http_sse_start(struct jd_req *r);
/* The repeated ?label= arguments of the request, at most max (borrowed);
 * their count, or max + 1 when there are more. */
size_t http_query_labels(struct jd_req *r, const char **out, size_t max);

/* routes_queues.c: */
enum MHD_Result route_queues(struct jd_req *r);
enum MHD_Result route_queue_pause(struct jd_req *r);
enum MHD_Result route_queue_get(struct jd_req *r);
enum MHD_Result route_queue_put(struct jd_req *r);

/* routes_tasks.c: */
enum MHD_Result route_command_list(struct jd_req *r);
enum MHD_Result route_command_put(struct jd_req *r);
enum MHD_Result route_command_get(struct jd_req *r);
enum MHD_Result route_command_delete(struct jd_req *r);
enum MHD_Result route_task_claim(struct jd_req *r);
enum MHD_Result route_task_complete(struct jd_req *r);
enum MHD_Result route_task_fail(struct jd_req *r);
enum MHD_Result route_task_heartbeat(struct jd_req *r);
enum MHD_Result route_task_batch(struct jd_req *r);
enum MHD_Result route_workers(struct jd_req *r);

/* routes_schedules.c: */
enum MHD_Result route_schedule_list(struct jd_req *r);
enum MHD_Result route_schedule_put(struct jd_req *r);
enum MHD_Result route_schedule_get(struct jd_req *r);
enum MHD_Result route_schedule_delete(struct jd_req *r);
enum MHD_Result route_schedule_pause(struct jd_req *r);
enum MHD_Result route_schedule_trigger(struct jd_req *r);
enum MHD_Result route_schedule_events(struct jd_req *r);

/* routes_misc.c: */
enum MHD_Result route_livez(struct jd_req *r);
enum MHD_Result route_readyz(struct jd_req *r);
enum MHD_Result route_metrics(struct jd_req *r);
enum MHD_Result route_openapi(struct jd_req *r);
enum MHD_Result route_handlers(struct jd_req *r);

/* routes_ui.c: */
enum MHD_Result route_ui_root(struct jd_req *r);
enum MHD_Result route_ui_file(struct jd_req *r);
enum MHD_Result route_stats(struct jd_req *r);

#endif
